#!/usr/bin/env bash
# Session 18's FUSE-floor measurements (docs/benchmarks.md, "The FUSE floor on this machine"):
# for fuse.enable_uring N then Y (put back to N at the end): scripts/bench-small.sh --floor,
# mdtest 32 KiB x 2 tasks x 2000 on native and tierfs then on the floor, and the per-opcode
# untar latency of tierfs and of the floor; with PASSTHROUGH_LL (libfuse's example, built
# outside this repository: docs/benchmarks.md says how), bench-small.sh again with it as the
# floor. Needs root. Output: one log per transport here.
#   run.sh TIERFS_BIN FLOOR_BIN [PASSTHROUGH_LL]
set -uo pipefail
cd "$(dirname "$0")/../../.."
TB=$1; FB=$2; LL=${3:-}
OUT=docs/bench-results/issue14-s18
P=/sys/module/fuse/parameters/enable_uring
trap 'echo N > $P' EXIT
echo 11 > /sys/module/page_reporting/parameters/page_reporting_order
for u in N Y; do
  echo $u > $P
  L=$OUT/uring-$u.txt
  {
    echo "== $(date -u +%FT%TZ) enable_uring=$u load $(cut -d' ' -f1-3 /proc/loadavg)"
    scripts/bench-small.sh --bin "$TB" --floor --floor-bin "$FB"
    echo "== mdtest native,tierfs (load $(cut -d' ' -f1-3 /proc/loadavg))"
    "$TB" bench mdtest -w 32768 --tasks 2 -n 2000 --reps 1 --modes native,tierfs --no-progress
    F=$(mktemp -d /var/tmp/floor-md.XXXX); mkdir "$F/m"
    "$FB" memfs "$F/m" 2> "$F/log" & FP=$!
    for _ in $(seq 100); do mountpoint -q "$F/m" && break; sleep 0.1; done
    echo "== mdtest floor (native mode in the memfs mount; load $(cut -d' ' -f1-3 /proc/loadavg))"
    "$TB" bench mdtest -w 32768 --tasks 2 -n 2000 --reps 1 --modes native --workdir "$F/m" --no-progress
    fusermount3 -u "$F/m"; wait $FP; rm -rf "$F"
    echo "== untar per-opcode latency"
    $OUT/lat-floor.sh floor "$FB"
    $OUT/lat-floor.sh tierfs "$TB"
  } > "$L" 2>&1
  if [ -n "$LL" ]; then
    S=$(mktemp -d /var/tmp/floor-ll.XXXX); mkdir "$S/src"
    echo "== $(date -u +%FT%TZ) enable_uring=$u, floor: libfuse passthrough_ll over $S/src" > "$OUT/passthrough_ll-uring-$u.txt"
    scripts/bench-small.sh --bin "$TB" --floor --floor-cmd \
      "$LL -f -o source=$S/src,timeout=30,cache=always,clone_fd,max_threads=8,allow_other,default_permissions,io_uring" \
      >> "$OUT/passthrough_ll-uring-$u.txt" 2>&1
    rm -rf "$S"
  fi
done
