import re,sys
def load(p):
    d={}
    for l in open(p):
        m=re.match(r'tierfs_fuse_op_seconds_(sum|count)\{op="(\w+)"\} (\S+)',l)
        if m: d[(m.group(2),m.group(1))]=float(m.group(3))
    return d
a=load(sys.argv[1]); b=load(sys.argv[2])
for (op,k),v in b.items():
    if k!='count': continue
    n=v-a.get((op,'count'),0); s=b[(op,'sum')]-a.get((op,'sum'),0)
    if n>0: print(f"{op:15s} {int(n):7d} {s:8.3f}s {s/n*1e6:8.1f}us")
