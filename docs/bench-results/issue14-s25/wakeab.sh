#!/bin/bash
# wakeab.sh BIN ROUNDS: the floor (tierfs memfs) over /dev/fuse (enable_uring=N), the fuse
# module parameter wake_here N then Y per round: cold ls -l of 10,000 files and an untar of
# /usr/include; then uncached tierfs the same way. Puts wake_here back to N.
set -e
B=$1; R=$2
old=$(cat /sys/module/fuse/parameters/wake_here)
trap 'echo $old > /sys/module/fuse/parameters/wake_here' EXIT
echo N > /sys/module/fuse/parameters/enable_uring
T=$(mktemp -d /var/tmp/wab.XXXX); tar cf $T/src.tar -C /usr include
t() { local s e; s=$(date +%s.%N); "$@"; e=$(date +%s.%N); printf '%.3f' "$(echo "$e - $s" | bc)"; }
for round in $(seq $R); do
  for w in N Y; do
    echo $w > /sys/module/fuse/parameters/wake_here
    M=$T/m; mkdir -p $M
    "$B" memfs "$M" 2>/dev/null & P=$!
    for _ in $(seq 50); do mountpoint -q "$M" && break; sleep 0.1; done
    mkdir "$M/many"; (cd "$M/many" && seq -f "f-%06g" 1 10000 | xargs touch)
    sync; echo 3 > /proc/sys/vm/drop_caches
    l=$(t sh -c "ls -l $M/many > /dev/null"); u=$(t tar xf $T/src.tar -C $M)
    fusermount3 -u "$M"; wait $P || true
    W=$T/w; mkdir -p $W/mnt
    "$B" format --meta sqlite://$W/meta.db --target file://$W/ost0 >/dev/null
    "$B" mount --meta sqlite://$W/meta.db $W/mnt --client-name ab --log-file $W/log
    (cd "$W/mnt" && mkdir many && cd many && seq -f "f-%06g" 1 10000 | xargs touch)
    sync; echo 3 > /proc/sys/vm/drop_caches
    l2=$(t sh -c "ls -l $W/mnt/many > /dev/null"); u2=$(t tar xf $T/src.tar -C $W/mnt)
    "$B" umount $W/mnt; rm -rf $W
    echo "round $round wake_here=$w: floor ls -l $l untar $u | tierfs ls -l $l2 untar $u2"
  done
done
rm -rf $T
