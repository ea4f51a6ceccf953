#!/bin/bash
# abuntar.sh ROUNDS BIN...: untar of /usr/include + sync on a fresh uncached mount (ring on), binaries alternating; the daemon's top per-opcode times (needs /work/prof/opd.py: the mount counters diff)
R=$1; shift
echo Y > /sys/module/fuse/parameters/enable_uring
trap 'echo N > /sys/module/fuse/parameters/enable_uring' EXIT
T=$(mktemp -d /var/tmp/abu.XXXX); tar cf $T/src.tar -C /usr include
t() { local s e; s=$(date +%s.%N); "$@"; e=$(date +%s.%N); printf '%.3f' "$(echo "$e - $s" | bc)"; }
for round in $(seq $R); do
  for B in "$@"; do
    W=$T/w; mkdir -p $W/mnt
    "$B" format --meta sqlite://$W/meta.db --target file://$W/ost0 >/dev/null
    "$B" mount --meta sqlite://$W/meta.db $W/mnt --client-name ab --log-file $W/log --metrics 127.0.0.1:9611
    sleep 0.5
    u=$(t sh -c "tar xf $T/src.tar -C $W/mnt && sync")
    curl -s 127.0.0.1:9611/metrics > $W/m1
    echo "$B round $round: untar $u"; : > $W/m0; python3 /work/prof/opd.py $W/m0 $W/m1 | sort -k3 -n -r | head -4
    "$B" umount $W/mnt; rm -rf $W
  done
done
rm -rf $T
