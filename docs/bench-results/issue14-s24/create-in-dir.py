import os,sys
d=sys.argv[1]
for i in range(400):
    fd=os.open(f'{d}/zz{i}',os.O_RDWR|os.O_CREAT|os.O_TRUNC|os.O_CLOEXEC,0o600); os.close(fd)
for i in range(400): os.unlink(f'{d}/zz{i}')
