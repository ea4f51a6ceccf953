#!/bin/bash
# abmd.sh ROUNDS BIN...: mdtest (2 tasks, 2,000 files of 32 KiB each) through `tierfs bench`
# in the modes uncached, RO-PCC and RW-PCC (one filesystem with a cache per client, as the
# bench mounts when a PCC mode is asked for), per binary and round, binaries alternating;
# FUSE over io_uring on. Prints each run's per-phase rates.
set -e
R=$1; shift
echo Y > /sys/module/fuse/parameters/enable_uring
trap 'echo N > /sys/module/fuse/parameters/enable_uring' EXIT
for round in $(seq $R); do
  for B in "$@"; do
    echo "== $B round $round"
    "$B" bench --modes tierfs,tierfs+rw-pcc,tierfs+ro-pcc --reps 1 mdtest -w 32k --tasks 2 -n 2000 2>&1 \
      | grep "rep 1:"
  done
done
