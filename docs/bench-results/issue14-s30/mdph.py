import os,sys,threading,time,subprocess
d=sys.argv[1]; n=int(sys.argv[2]); w=32768; buf=os.urandom(w)
os.makedirs(d,exist_ok=True)
def metrics(p): subprocess.run(f"curl -s 127.0.0.1:9596/metrics > {p}",shell=True)
def task(ph,t):
    for k in range(n):
        p=f"{d}/f.{t}.{k}"
        if ph=="create":
            fd=os.open(p,os.O_WRONLY|os.O_CREAT|os.O_EXCL,0o644); os.write(fd,buf); os.close(fd)
        elif ph=="stat": os.stat(p)
        elif ph=="read":
            fd=os.open(p,os.O_RDONLY); os.pread(fd,w,0); os.pread(fd,1,w); os.close(fd)
        else: os.unlink(p)
for ph in ["create","stat","read","remove"]:
    metrics("/tmp/m0")
    pp=None
    if os.environ.get("PERFPH")==ph:
        pid=subprocess.run("pgrep -f 'mount --foreground --meta sqlite://' | head -1",shell=True,capture_output=True,text=True).stdout.strip()
        pp=subprocess.Popen(["perf","record","-e","cpu-clock","-F","4000","-g","-a","-o","/tmp/md.data"],stderr=subprocess.DEVNULL); time.sleep(0.5)
    s=time.time()
    th=[threading.Thread(target=task,args=(ph,t)) for t in range(2)]
    [x.start() for x in th]; [x.join() for x in th]
    e=time.time(); metrics("/tmp/m1")
    if pp: pp.send_signal(2); pp.wait()
    print(f"{ph} {2*n/(e-s):.0f}/s"); sys.stdout.flush()
    subprocess.run(f"python3 {os.path.dirname(os.path.abspath(__file__))}/../issue14-s29/opd.py /tmp/m0 /tmp/m1 | sort -k3 -n -r | head -6",shell=True)
