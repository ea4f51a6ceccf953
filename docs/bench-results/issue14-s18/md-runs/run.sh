#!/usr/bin/env bash
# before/after mdtest, alternating, 3 rounds, JuiceFS in the middle round; one run
set -uo pipefail
B0=${B0:?before binary}; B1=${B1:?after binary}; O=${O:?output dir}; mkdir -p $O
echo 11 > /sys/module/page_reporting/parameters/page_reporting_order
st(){ echo "$(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg) enable_uring=$(cat /sys/module/fuse/parameters/enable_uring) $1"; }
md(){ (cd /var/tmp && $1 bench mdtest -w 32768 --tasks 2 -n 2000 --reps 1 --no-progress $2 > $3 2>&1); }
J=/work/jfs/bin/juicefs
for r in 1 2 3; do
  st "round $r before"; md $B0 "--modes native,tierfs" $O/before-$r.txt
  st "round $r after"; md $B1 "--modes native,tierfs" $O/after-$r.txt
  if [ $r = 2 ]; then
    rm -rf /var/tmp/jfs-md; mkdir -p /var/tmp/jfs-md/mnt
    $J format --storage file --bucket /var/tmp/jfs-md/bucket/ sqlite3:///var/tmp/jfs-md/meta.db jfsbench > /dev/null 2>&1
    $J mount -d sqlite3:///var/tmp/jfs-md/meta.db /var/tmp/jfs-md/mnt --log /var/tmp/jfs-md/mount.log > /dev/null 2>&1
    st "round $r juicefs"; md $B1 "--modes native --workdir /var/tmp/jfs-md/mnt" $O/juicefs.txt
    $J umount /var/tmp/jfs-md/mnt; rm -rf /var/tmp/jfs-md
  fi
done
st end
