#!/usr/bin/env bash
# poll.sh OUT: finds the bench mount (newest /var/tmp/tierfs-bench*/mnt0) and records op counts every 5 ms
OUT=$1
while :; do M=$(ls -d /var/tmp/pccb/*/mnt0 2>/dev/null | head -1); [ -n "$M" ] && [ -e "$M/.tierfs-stats" ] && break; sleep 0.05; done
echo "mount $M" > $OUT
while [ -e "$M/.tierfs-stats" ]; do
  t=$(date +%s.%N)
  grep -E 'tierfs_fuse_ops_total\{op="(create|getattr|release|flush|unlink|open|lookup)"\}' "$M/.tierfs-stats" 2>/dev/null | awk -v t=$t '{gsub(/.*op="/,"",$1); gsub(/".*/,"",$1); printf "%s=%s ", $1, $2} END {print t}' >> $OUT || break
  sleep 0.01
done
