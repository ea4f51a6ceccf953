#!/bin/bash
# abpagesize.sh ROUNDS PAGESIZE...: same binary, a fresh filesystem formatted with each SQLite page size
# (needs a scratch build whose connect() takes page_size from TIERFS_PAGE_SIZE: not in the tree,
# the experiment was dropped; BIN= that build)
set -e
R=$1; shift
B=${BIN:-/work/rel-scratch/release/tierfs}
T=$(mktemp -d /var/tmp/abp.XXXX); tar cf $T/src.tar -C /usr include
t() { local s e; s=$(date +%s.%N); "$@"; e=$(date +%s.%N); printf '%.3f' "$(echo "$e - $s" | bc)"; }
cold() { sync; echo 3 > /proc/sys/vm/drop_caches; }
for round in $(seq $R); do
  for PS in "$@"; do
    W=$T/w; mkdir -p $W/mnt
    TIERFS_PAGE_SIZE=$PS "$B" format --meta sqlite://$W/meta.db --target file://$W/ost0 >/dev/null
    "$B" mount --meta sqlite://$W/meta.db $W/mnt --client-name ab --log-file $W/log
    u=$(t sh -c "tar xf $T/src.tar -C $W/mnt && sync")
    cold; c=$(t cp -a $W/mnt/include $W/mnt/copy)
    cold; s=$(t rsync -a $W/mnt/include/ $W/mnt/synced/)
    cold; l=$(t ls -lR $W/mnt/include > /dev/null)
    cold; r=$(t rm -rf $W/mnt/include $W/mnt/copy $W/mnt/synced)
    echo "ps $PS round $round: untar $u  cp-a $c  rsync $s  ls-lR $l  rm-rf $r  db $(du -sm $W/meta.db | cut -f1)M"
    "$B" umount $W/mnt; rm -rf $W
  done
done
rm -rf $T
