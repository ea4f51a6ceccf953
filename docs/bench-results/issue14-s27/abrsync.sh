#!/bin/bash
# abrsync.sh ROUNDS BIN...: uncached tierfs (SQLite, one local target) with FUSE over io_uring,
# per binary and round, a fresh filesystem: untar of /usr/include, then (cold) cp -a and
# rsync -a of the tree, then rm -rf; binaries alternating; seconds.
set -e
R=$1; shift
echo Y > /sys/module/fuse/parameters/enable_uring
trap 'echo N > /sys/module/fuse/parameters/enable_uring' EXIT
T=$(mktemp -d /var/tmp/abr.XXXX); tar cf $T/src.tar -C /usr include
t() { local s e; s=$(date +%s.%N); "$@"; e=$(date +%s.%N); printf '%.3f' "$(echo "$e - $s" | bc)"; }
cold() { sync; echo 3 > /proc/sys/vm/drop_caches; }
for round in $(seq $R); do
  for B in "$@"; do
    W=$T/w; mkdir -p $W/mnt
    "$B" format --meta sqlite://$W/meta.db --target file://$W/ost0 >/dev/null
    "$B" mount --meta sqlite://$W/meta.db $W/mnt --client-name ab --log-file $W/log
    u=$(t sh -c "tar xf $T/src.tar -C $W/mnt && sync")
    cold; c=$(t cp -a $W/mnt/include $W/mnt/copy)
    cold; s=$(t rsync -a $W/mnt/include/ $W/mnt/synced/)
    cold; r=$(t rm -rf $W/mnt/include $W/mnt/copy $W/mnt/synced)
    echo "$B round $round: untar $u  cp-a $c  rsync $s  rm-rf $r"
    "$B" umount $W/mnt; rm -rf $W
  done
done
rm -rf $T
