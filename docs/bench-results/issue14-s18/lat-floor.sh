#!/usr/bin/env bash
# A copy of session 16's /work/lat/lat.sh (untar of /usr/include into a fresh mount, per-opcode
# request latency from the kernel's fuse_request_send to fuse_request_end, and totals), which
# can also mount the FUSE floor:
#   lat-floor.sh tierfs BIN [mount options]   a fresh tierfs (SQLite, one local target)
#   lat-floor.sh floor BIN [memfs options]    `BIN memfs` (docs/benchmarks.md, "The FUSE floor")
set -euo pipefail
WHAT=$1; BIN=$2; shift 2
W=$(mktemp -d /var/tmp/lat.XXXX); MNT=$W/mnt; mkdir $MNT
TR=/sys/kernel/tracing; INST=$TR/instances/$(basename $W); mkdir $INST
FPID=
cleanup(){
  echo 0 > $INST/events/fuse/enable || true; rmdir $INST
  if [ -n "$FPID" ]; then fusermount3 -u $MNT 2>/dev/null || umount -l $MNT || true; wait $FPID || true
  else $BIN umount $MNT 2>/dev/null || true; fi
  rm -rf $W
}
trap cleanup EXIT
if [ "$WHAT" = floor ]; then
  $BIN memfs $MNT "$@" 2> $W/log & FPID=$!
  for _ in $(seq 100); do mountpoint -q $MNT && break; sleep 0.1; done
  mountpoint -q $MNT
else
  $BIN format --meta sqlite://$W/meta.db --target file://$W/ost0 >/dev/null
  $BIN mount --meta sqlite://$W/meta.db $MNT --client-name lat --log-file $W/log "$@"
fi
tar cf $W/src.tar -C /usr include
d=$(mountpoint -d $MNT); c=$(( (${d%%:*} << 20) | ${d##*:} ))
echo 65536 > $INST/buffer_size_kb
for e in fuse_request_send fuse_request_end; do echo "connection == $c" > $INST/events/fuse/$e/filter; done
sync; echo 3 > /proc/sys/vm/drop_caches
echo 1 > $INST/events/fuse/enable
s=$(date +%s.%N); (cd $MNT && tar xf $W/src.tar && sync); e=$(date +%s.%N)
echo 0 > $INST/events/fuse/enable
echo "$WHAT untar $(echo "$e - $s" | bc) s (load $(cut -d' ' -f1-3 /proc/loadavg), enable_uring=$(cat /sys/module/fuse/parameters/enable_uring))"
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
