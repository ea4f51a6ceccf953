#!/usr/bin/env bash
# Session 19, the deferred purge: before (B0) and after (B1), one run, on an otherwise idle
# machine: mdtest 32 KiB files, 2 tasks x 2,000, 3 alternating rounds with JuiceFS in round 2
# (../issue14-s18/md-runs/run.sh, J=/work/jfs/bin/juicefs), then scripts/bench-small.sh for
# each binary (its rm -rf row). Free page reporting off during the run, back to 9 after.
#   B0=/path/tierfs-before B1=/path/tierfs-after O=OUTDIR docs/bench-results/issue14-s19/run.sh
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
B0=${B0:?before binary}; B1=${B1:?after binary}; O=${O:?output dir}; mkdir -p "$O"
B0=$B0 B1=$B1 O=$O/md "$here/../issue14-s18/md-runs/run.sh" | tee "$O/md-log.txt"
for b in B0 B1; do
  echo "$(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg) bench-small $b"
  "$here/../../../scripts/bench-small.sh" --bin "${!b}" > "$O/small-$b.txt" 2>&1
done | tee "$O/small-log.txt"
echo 9 > /sys/module/page_reporting/parameters/page_reporting_order
