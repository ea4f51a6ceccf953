#!/bin/bash
# abpg.sh ROUNDS BIN...: as abtier.sh, on PostgreSQL ($TIERFS_PG_URL, a fresh database per run)
set -e
R=$1; shift
echo Y > /sys/module/fuse/parameters/enable_uring
trap 'echo N > /sys/module/fuse/parameters/enable_uring' EXIT
T=$(mktemp -d /var/tmp/abp.XXXX); tar cf $T/src.tar -C /usr include
t() { local s e; s=$(date +%s.%N); "$@"; e=$(date +%s.%N); printf '%.3f' "$(echo "$e - $s" | bc)"; }
n=0
for round in $(seq $R); do
  for B in "$@"; do
    n=$((n+1)); W=$T/w; mkdir -p $W/mnt
    URL=$TIERFS_PG_URL
    "$B" format --force --meta "$URL" --target file://$W/ost0 >/dev/null
    "$B" mount --meta "$URL" $W/mnt --client-name ab --log-file $W/log
    u=$(t tar xf $T/src.tar -C $W/mnt); sync
    c=$(t cp -a $W/mnt/include $W/mnt/copy)
    r=$(t rm -rf $W/mnt/include $W/mnt/copy)
    echo "$(basename $B) round $round: untar $u  cp-a $c  rm-rf $r"
    "$B" umount $W/mnt; rm -rf $W
  done
done
rm -rf $T
