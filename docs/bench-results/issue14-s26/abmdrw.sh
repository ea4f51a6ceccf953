#!/bin/bash
# abmdrw.sh ROUNDS BIN...: mdtest 32 KiB 2 x 2,000, uncached and RW-PCC, per binary and round
# (binaries alternating, fuse.enable_uring=Y); files/s create/stat/read/remove
R=$1; shift
echo Y > /sys/module/fuse/parameters/enable_uring
trap 'echo N > /sys/module/fuse/parameters/enable_uring' EXIT
for round in $(seq $R); do
  for B in "$@"; do
    O=$(mktemp -d /var/tmp/abmd.XXXX)
    "$B" bench --modes tierfs,tierfs+rw-pcc --reps 1 --out $O mdtest -w 32k --tasks 2 -n 2000 >/dev/null 2>&1
    python3 - "$O/results.json" "$(basename $B) round $round" <<'PY'
import json,sys
d=json.load(open(sys.argv[1]))
for w in d['workloads']:
  for s in w['samples']:
    print(sys.argv[2], s['mode'], ' '.join(f"{m['test']}={m['value']:.0f}" for m in s['measurements']))
PY
    rm -rf $O
  done
done
