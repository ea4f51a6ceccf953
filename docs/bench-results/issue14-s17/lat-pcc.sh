#!/usr/bin/env bash
# usage: [RULE=rw|ro] [WORK=untar|md] [PROFILE=perf|strace] [TAG=name] lat-pcc.sh BIN [mount options]
# -- /work/lat/lat.sh with a PCC rule for every name (RULE: the mount gets --cache-dir), an
# mdtest-like create phase (WORK=md: 2 processes x 2,000 files of 32 KiB) or untar; per-opcode
# latency (send->end) and totals; .tierfs-stats saved to /tmp/pcc/stats.TAG.txt
set -euo pipefail
mkdir -p /tmp/pcc
BIN=$1; shift
W=$(mktemp -d /var/tmp/lat.XXXX); MNT=$W/mnt; mkdir $MNT
TR=/sys/kernel/tracing; INST=$TR/instances/$(basename $W); mkdir $INST
cleanup(){ echo 0 > $INST/events/fuse/enable || true; rmdir $INST; $BIN umount $MNT 2>/dev/null||true; rm -rf $W; }
trap cleanup EXIT
$BIN format --meta sqlite://$W/meta.db --target file://$W/ost0 >/dev/null
if [ -n "${RULE:-}" ]; then $BIN pcc rule add --mode $RULE --meta sqlite://$W/meta.db 'fname={*}' >/dev/null; set -- "$@" --cache-dir $W/cache --cache-size 10G; fi
$BIN mount --meta sqlite://$W/meta.db $MNT --client-name lat --log-file $W/log "$@"
DPID=$(pgrep -n -f -- "--meta sqlite://$W/meta.db" || true); echo "daemon pid $DPID"
tar cf $W/src.tar -C /usr include
d=$(mountpoint -d $MNT); c=$(( (${d%%:*} << 20) | ${d##*:} ))
echo 65536 > $INST/buffer_size_kb
for e in fuse_request_send fuse_request_end; do echo "connection == $c" > $INST/events/fuse/$e/filter; done
sync; echo 3 > /proc/sys/vm/drop_caches
echo 1 > $INST/events/fuse/enable
PROF=
case "${PROFILE:-}" in
  perf) perf record -F 4999 -g -o /tmp/pcc/perf.${TAG:-x}.data -p $DPID 2>/tmp/pcc/perf.err & PROF=$!;;
  strace) strace -f -c -o /tmp/pcc/strace.${TAG:-x}.txt -p $DPID & PROF=$!;;
esac
[ -n "$PROF" ] && sleep 1
if [ "${WORK:-untar}" = md ]; then
s=$(date +%s.%N); (cd $MNT && python3 -c "
import os,sys
from multiprocessing import Process
buf=bytes(32768)
def w(t):
    for k in range(2000):
        fd=os.open(f\"f.{t}.{k}\",os.O_CREAT|os.O_EXCL|os.O_WRONLY,0o644); os.write(fd,buf); os.close(fd)
ps=[Process(target=w,args=(t,)) for t in range(2)]
[p.start() for p in ps]; [p.join() for p in ps]
"); e=$(date +%s.%N)
else
s=$(date +%s.%N); (cd $MNT && tar xf $W/src.tar && sync); e=$(date +%s.%N)
fi
if [ -n "$PROF" ]; then kill -INT $PROF; wait $PROF || true; fi
cat $MNT/.tierfs-stats > /tmp/pcc/stats.${TAG:-x}.txt 2>/dev/null || true
echo 0 > $INST/events/fuse/enable
echo "untar $(echo "$e - $s" | bc) s"
python3 - $INST/trace <<'PY'
import sys,re,collections
send={}; lat=collections.defaultdict(list)
for l in open(sys.argv[1]):
    m=re.search(r'\s([0-9.]+): fuse_request_send: .*req (\d+) opcode \d+ \((\w+)\)',l)
    if m: send[m.group(2)]=(float(m.group(1)),m.group(3)); continue
    m=re.search(r'\s([0-9.]+): fuse_request_end: .*req (\d+)',l)
    if m and m.group(2) in send:
        t,op=send.pop(m.group(2)); lat[op].append(float(m.group(1))-t)
tot=sum(sum(v) for v in lat.values())
for op,v in sorted(lat.items(),key=lambda kv:-sum(kv[1])):
    v.sort(); print(f"{op:22s} n={len(v):6d} sum={sum(v):7.3f}s mean={1e6*sum(v)/len(v):7.1f}us p50={1e6*v[len(v)//2]:7.1f}us")
print(f"total request time {tot:.3f}s")
PY
