set -e
# rwdiff.sh: diff -r of RW-cached trees right after their writes and once written back (see rwdiff.txt)
BIN=/work/rel28/release/tierfs
W=$(mktemp -d /var/tmp/rwd.XXXX)
trap '$BIN umount $W/mnt 2>/dev/null; rm -rf $W' EXIT
mkdir $W/mnt $W/cache
$BIN format --meta sqlite://$W/meta.db --target file://$W/ost0 >/dev/null
$BIN pcc rule add --meta sqlite://$W/meta.db --mode rw 'projid={4701}' >/dev/null
$BIN mount --meta sqlite://$W/meta.db $W/mnt --client-name rwd --log-file $W/log --cache-dir $W/cache --cache-size 16G --metrics 127.0.0.1:9596
$BIN project -s -p 4701 $W/mnt >/dev/null
sleep 2.5
cd $W/mnt
s=$(date +%s.%N); tar xf /var/tmp/inc.tar; e=$(date +%s.%N); echo "untar $(echo "$e - $s" | bc)"
s=$(date +%s.%N); cp -a include copy; e=$(date +%s.%N); echo "cp-a $(echo "$e - $s" | bc)"
for w in 0 ${WAIT:-70}; do
  sleep $w
  curl -s 127.0.0.1:9596/metrics > $W/m0; sync; echo 3 > /proc/sys/vm/drop_caches
  s=$(date +%s.%N); diff -r include copy; e=$(date +%s.%N); echo "diff-r after ${w}s wait: $(echo "$e - $s" | bc)"
  curl -s 127.0.0.1:9596/metrics > $W/m1; python3 /work/prof/opd.py $W/m0 $W/m1 | sort -k3 -n -r | head -4
  grep -E 'pcc_events_total\{event="writebacks"' $W/m1 || true
done
cd /
