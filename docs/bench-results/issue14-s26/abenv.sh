#!/bin/bash
# abenv.sh ROUNDS BIN: as abtier.sh, one binary, alternating TIERFS_SQLITE_VFS=unix (SQLite's own
# VFS) and the default (tierfs-walbatch) for the mount's daemon
set -e
R=$1; B=$2
echo Y > /sys/module/fuse/parameters/enable_uring
trap 'echo N > /sys/module/fuse/parameters/enable_uring' EXIT
T=$(mktemp -d /var/tmp/abe.XXXX); tar cf $T/src.tar -C /usr include
t() { local s e; s=$(date +%s.%N); "$@"; e=$(date +%s.%N); printf '%.3f' "$(echo "$e - $s" | bc)"; }
for round in $(seq $R); do
  for V in unix walbatch; do
    W=$T/w; mkdir -p $W/mnt
    "$B" format --meta sqlite://$W/meta.db --target file://$W/ost0 >/dev/null
    if [ $V = unix ]; then TIERFS_SQLITE_VFS=unix "$B" mount --meta sqlite://$W/meta.db $W/mnt --client-name ab --log-file $W/log
    else "$B" mount --meta sqlite://$W/meta.db $W/mnt --client-name ab --log-file $W/log; fi
    u=$(t tar xf $T/src.tar -C $W/mnt); sync
    c=$(t cp -a $W/mnt/include $W/mnt/copy)
    s=$(t rsync -a $W/mnt/include/ $W/mnt/synced/)
    g=$(t git clone -q --no-local file:///work/main $W/mnt/clone)
    sync; echo 3 > /proc/sys/vm/drop_caches
    d=$(t diff -r $W/mnt/include $W/mnt/copy)
    r=$(t rm -rf $W/mnt/include $W/mnt/copy $W/mnt/synced $W/mnt/clone)
    echo "$V round $round: untar $u  cp-a $c  rsync $s  clone $g  diff-r $d  rm-rf $r"
    "$B" umount $W/mnt; rm -rf $W
  done
done
rm -rf $T
