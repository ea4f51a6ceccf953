set -e
D=$(cd "$(dirname "$0")" && pwd)
# rwprof.sh: RW-PCC tree, written back, then read every file once (cat), with per-op daemon times and optional perf
BIN=${BIN:-/work/rel28/release/tierfs}
MODE=${MODE:-rw}
W=$(mktemp -d /var/tmp/rwp.XXXX)
trap 'cd /; $BIN umount $W/mnt 2>/dev/null; rm -rf $W' EXIT
mkdir $W/mnt $W/cache
$BIN format --meta sqlite://$W/meta.db --target file://$W/ost0 >/dev/null
[ $MODE = rw ] && $BIN pcc rule add --meta sqlite://$W/meta.db --mode rw 'projid={4701}' >/dev/null
$BIN mount --meta sqlite://$W/meta.db $W/mnt --client-name rwd --log-file $W/log --cache-dir $W/cache --cache-size 16G --metrics 127.0.0.1:9596
$BIN project -s -p 4701 $W/mnt >/dev/null
sleep 2.5
cd $W/mnt
s=$(date +%s.%N); tar xf /var/tmp/inc.tar; e=$(date +%s.%N); echo "untar $(echo "$e - $s" | bc)"
sleep ${WAIT:-40}
curl -s 127.0.0.1:9596/metrics | grep -E 'pcc_events_total\{event="writebacks"' || true
for r in 1 2; do
curl -s 127.0.0.1:9596/metrics > $W/m0; sync; echo 3 > /proc/sys/vm/drop_caches
PID=$(pgrep -f "mount --foreground --meta sqlite://$W" | head -1)
[ -n "$PERF" ] && [ $r = 1 ] && { perf record -e cpu-clock -F 4000 -g -p $PID -o ${PERF_OUT:-/tmp/perf.data} 2>/dev/null & PP=$!; sleep 0.5; }
s=$(date +%s.%N); find include -type f -print0 | xargs -0 cat > /dev/null; e=$(date +%s.%N); echo "cat-all round $r: $(echo "$e - $s" | bc)"
[ -n "$PERF" ] && [ $r = 1 ] && { kill -INT $PP; wait $PP || true; }
curl -s 127.0.0.1:9596/metrics > $W/m1; python3 $D/opd.py $W/m0 $W/m1 | sort -k3 -n -r | head -6
sleep ${GAP:-0}
done
