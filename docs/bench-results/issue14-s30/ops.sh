set -e
D=$(cd "$(dirname "$0")" && pwd)
# ops.sh: untar, cp -a, rsync -a on one mount (MODE=rw: RW-PCC at create; else uncached with a cache dir), daemon time per opcode for each
BIN=${BIN:-/work/rel29/release/tierfs}
MODE=${MODE:-rw}
W=$(mktemp -d ${WROOT:-/var/tmp}/ops.XXXX)
trap 'cd /; $BIN umount $W/mnt 2>/dev/null; rm -rf $W' EXIT
mkdir $W/mnt $W/cache
$BIN format --meta sqlite://$W/meta.db --target file://$W/ost0 $FEXTRA >/dev/null
[ $MODE = rw ] && $BIN pcc rule add --meta sqlite://$W/meta.db --mode rw 'projid={4701}' >/dev/null
$BIN mount --meta sqlite://$W/meta.db $W/mnt --client-name rwd --log-file $W/log --cache-dir $W/cache --cache-size 16G --metrics 127.0.0.1:9596 $EXTRA
$BIN project -s -p 4701 $W/mnt >/dev/null
sleep ${PRESLEEP:-2.5}
cd $W/mnt
PID=$(pgrep -f "mount --foreground --meta sqlite://$W" | head -1)
step() { name=$1; shift
  curl -s 127.0.0.1:9596/metrics > $W/m0
  [ "$PERF" = "$name" ] && { perf record -e cpu-clock -F 4000 -g -p $PID -o ${PERF_OUT:-/tmp/perf.data} 2>/dev/null & PP=$!; sleep 0.5; }
  s=$(date +%s.%N); "$@"; e=$(date +%s.%N); echo "$name $(echo "$e - $s" | bc)"
  [ "$PERF" = "$name" ] && { kill -INT $PP; wait $PP || true; }
  curl -s 127.0.0.1:9596/metrics > $W/m1; python3 $D/../issue14-s29/opd.py $W/m0 $W/m1 | sort -k3 -n -r | head -${TOP:-8}
}
step untar tar xf /var/tmp/inc.tar
step cp-a cp -a include copy
step rsync rsync -a include/ copy2/
if [ -n "$DIFF" ]; then
  sync; echo 3 > /proc/sys/vm/drop_caches
  step diff diff -r include copy
  echo "db $(du -sm $W/meta.db* | awk '{s+=$1} END {print s}') MB; objects $(find $W/ost0 -type f | wc -l)"
fi
