import sys,re
def load(p):
    d={}
    for l in open(p):
        if l.startswith('#') or not l.strip(): continue
        k,v=l.rsplit(' ',1)
        try: d[k]=float(v)
        except: pass
    return d
a=load(sys.argv[1]); b=load(sys.argv[2])
pat=sys.argv[3] if len(sys.argv)>3 else ''
for k in sorted(b):
    dv=b[k]-a.get(k,0)
    if dv and re.search(pat,k) and 'bucket' not in k:
        print(f"{dv:14.3f}  {k}")
