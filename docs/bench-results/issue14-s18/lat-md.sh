#!/usr/bin/env bash
# usage: [PROFILE=perf|strace|fcntl] [TAG=name] [N=2000] lat-md.sh BIN [mount options]
# -- a copy of the lead's /work/lat/lat.sh (per-opcode latency from the kernel's
# fuse_request_send/_end tracepoints on the mount's connection), for an mdtest-like run: 2
# processes x N files of 32 KiB in one shared directory, phases create (open O_CREAT|O_EXCL,
# write 32 KiB, close), stat, read (open, read 32 KiB, read at EOF, close), remove (unlink),
# each on a barrier, each phase marked in the trace. Prints per phase: files/s, requests per
# file by opcode, mean/p50 per opcode; .tierfs-stats before/after each phase in /tmp/md/.
# PROFILE=fcntl: strace -f -e fcntl,fsync,fdatasync,pwrite64,pread64 on the daemon; SQLite
# write transactions are counted as the WAL write lock (F_WRLCK at byte 120 of the -shm file).
# PROFILE=perf: perf record -k mono; each phase's CLOCK_MONOTONIC span is in
# /tmp/md/stats.TAG.phases (perf report --time START,END).
set -euo pipefail
mkdir -p /tmp/md; rm -f /tmp/md/stats.${TAG:-x}.phases
BIN=$1; shift
N=${N:-2000}
W=$(mktemp -d /var/tmp/latmd.XXXX); MNT=$W/mnt; mkdir $MNT
TR=/sys/kernel/tracing; INST=$TR/instances/$(basename $W); mkdir $INST
cleanup(){ echo 0 > $INST/events/fuse/enable || true; rmdir $INST; $BIN umount $MNT 2>/dev/null||true; rm -rf $W; }
trap cleanup EXIT
$BIN format --meta sqlite://$W/meta.db --target file://$W/ost0 >/dev/null
$BIN mount --meta sqlite://$W/meta.db $MNT --client-name lat --log-file $W/log "$@"
DPID=$(pgrep -n -f -- "--meta sqlite://$W/meta.db" || true); echo "daemon pid $DPID"
d=$(mountpoint -d $MNT); c=$(( (${d%%:*} << 20) | ${d##*:} ))
echo 131072 > $INST/buffer_size_kb
for e in fuse_request_send fuse_request_end; do echo "connection == $c" > $INST/events/fuse/$e/filter; done
mkdir $MNT/md
sync; echo 3 > /proc/sys/vm/drop_caches
echo 1 > $INST/events/fuse/enable
PROF=
case "${PROFILE:-}" in
  perf) perf record -k mono -F 4999 -g -o /tmp/md/perf.${TAG:-x}.data -p $DPID 2>/tmp/md/perf.err & PROF=$!;;
  strace) strace -f -c -o /tmp/md/strace.${TAG:-x}.txt -p $DPID & PROF=$!;;
  fcntl) strace -f -ttt -e trace=fcntl,fsync,fdatasync -o /tmp/md/fcntl.${TAG:-x}.txt -p $DPID & PROF=$!;;
esac
[ -n "$PROF" ] && sleep 1
(cd $MNT/md && python3 - $N $INST/trace_marker $MNT/.tierfs-stats /tmp/md/stats.${TAG:-x} <<'PY'
import os,sys,time
from multiprocessing import Process, Barrier
n=int(sys.argv[1]); marker=sys.argv[2]; stats=sys.argv[3]; out=sys.argv[4]
buf=os.urandom(32768)
def task(t,b):
    for ph in ("create","stat","read","remove"):
        b.wait()
        for k in range(n):
            p=f"f.{t}.{k}"
            if ph=="create":
                fd=os.open(p,os.O_CREAT|os.O_EXCL|os.O_WRONLY,0o644); os.write(fd,buf); os.close(fd)
            elif ph=="stat":
                os.stat(p)
            elif ph=="read":
                fd=os.open(p,os.O_RDONLY); assert os.pread(fd,32768,0)==buf; assert os.pread(fd,1,32768)==b""; os.close(fd)
            else:
                os.unlink(p)
        b.wait()
b=Barrier(3)
ps=[Process(target=task,args=(t,b)) for t in range(2)]
[p.start() for p in ps]
for ph in ("create","stat","read","remove"):
    try: open(f"{out}.{ph}.before","w").write(open(stats).read())
    except OSError: pass
    open(marker,"w").write(f"PHASE {ph}\n")
    b.wait(); s=time.time(); m0=time.clock_gettime(time.CLOCK_MONOTONIC); b.wait(); e=time.time(); m1=time.clock_gettime(time.CLOCK_MONOTONIC)
    open(f"{out}.phases","a").write(f"{ph} {m0:.6f},{m1:.6f} {s:.6f} {e:.6f}\n")
    open(marker,"w").write(f"PHASE end\n")
    try: open(f"{out}.{ph}.after","w").write(open(stats).read())
    except OSError: pass
    print(f"{ph}: {2*n/(e-s):.0f} files/s ({e-s:.3f} s)")
[p.join() for p in ps]
PY
)
if [ -n "$PROF" ]; then kill -INT $PROF; wait $PROF || true; fi
echo 0 > $INST/events/fuse/enable
python3 - $INST/trace $((2*N)) <<'PY'
import sys,re,collections
files=int(sys.argv[2])
send={}; lat=collections.defaultdict(lambda: collections.defaultdict(list)); ph="none"
for l in open(sys.argv[1]):
    m=re.search(r'PHASE (\w+)',l)
    if m: ph=m.group(1); continue
    m=re.search(r'\s([0-9.]+): fuse_request_send: .*req (\d+) opcode \d+ \((\w+)\)',l)
    if m: send[m.group(2)]=(float(m.group(1)),m.group(3),ph); continue
    m=re.search(r'\s([0-9.]+): fuse_request_end: .*req (\d+)',l)
    if m and m.group(2) in send:
        t,op,p=send.pop(m.group(2)); lat[p][op].append(float(m.group(1))-t)
for p in ("create","stat","read","remove","end","none"):
    if p not in lat: continue
    d=lat[p]; tot=sum(sum(v) for v in d.values()); n=sum(len(v) for v in d.values())
    print(f"== {p}: {n/files:.2f} requests per file, request time {tot:.3f}s ({1e6*tot/files:.1f} us per file)")
    for op,v in sorted(d.items(),key=lambda kv:-sum(kv[1])):
        v.sort(); print(f"  {op:14s} n={len(v):6d} per-file={len(v)/files:5.2f} sum={sum(v):7.3f}s mean={1e6*sum(v)/len(v):7.1f}us p50={1e6*v[len(v)//2]:7.1f}us")
PY
if [ "${PROFILE:-}" = fcntl ]; then
python3 - /tmp/md/fcntl.${TAG:-x}.txt /tmp/md/stats.${TAG:-x}.phases $((2*N)) <<'PY'
import sys,re
files=int(sys.argv[3]); ph=[]
for l in open(sys.argv[2]):
    n,_,s,e=l.split(); ph.append((n,float(s),float(e)))
cnt={n:[0,0,0] for n,_,_ in ph}
for l in open(sys.argv[1]):
    m=re.match(r'\d+\s+([0-9.]+) (\w+)\((.*)',l)
    if not m: continue
    t=float(m.group(1)); call=m.group(2); a=m.group(3)
    for n,s,e in ph:
        if s<=t<=e:
            if call=='fcntl' and 'F_WRLCK' in a and 'l_start=120,' in a: cnt[n][0]+=1
            elif call=='fcntl' and 'F_RDLCK' in a and re.search(r'l_start=12[3-7],',a): cnt[n][1]+=1
            elif call in ('fsync','fdatasync'): cnt[n][2]+=1
for n,_,_ in ph:
    w,r,f=cnt[n]; print(f"{n}: SQLite write transactions {w/files:.2f} per file, read snapshots {r/files:.2f}, fsyncs {f}")
PY
fi
