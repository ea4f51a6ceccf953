#!/usr/bin/env bash
# Negative LOOKUPs: stat(2) of N names that do not exist in one directory (each one LOOKUP the
# daemon answers with a negative entry), on a fresh SQLite filesystem per binary and round;
# the binaries alternate. Prints the wall rate and the daemon's own mean time per LOOKUP
# (tierfs_fuse_op_seconds_{sum,count}{op="lookup"} from the mount's .tierfs-stats).
#   neglookup.sh N ROUNDS BIN...
set -euo pipefail
N=$1; ROUNDS=$2; shift 2
W=$(mktemp -d /var/tmp/neglookup.XXXXXX)
trap 'for m in "$W"/m*; do fusermount3 -u "$m" 2>/dev/null || true; done; rm -rf "$W"' EXIT
for r in $(seq "$ROUNDS"); do
  k=0
  for b in "$@"; do
    k=$((k+1)); d=$W/r$r-$k; mkdir -p "$d/m"
    "$b" format --meta "sqlite://$d/meta.db" --target "file://$d/ost" >/dev/null
    "$b" mount --meta "sqlite://$d/meta.db" "$d/m" --client-name "n$r$k" --log-file "$d/log" >/dev/null
    mkdir "$d/m/dir"
    rate=$(python3 - "$d/m/dir" "$N" <<'PY'
import os, sys, time
d, n = sys.argv[1], int(sys.argv[2])
t = time.perf_counter()
for i in range(n):
    try:
        os.stat(f"{d}/x{i}")
    except FileNotFoundError:
        pass
print(f"{n / (time.perf_counter() - t):.0f}")
PY
)
    mean=$(awk '/tierfs_fuse_op_seconds_sum\{op="lookup"\}/ {s=$2} /tierfs_fuse_op_seconds_count\{op="lookup"\}/ {c=$2} END {printf "%.1f", s / c * 1e6}' "$d/m/.tierfs-stats")
    echo "round $r $(basename "$b"): $rate lookups/s, daemon $mean us per LOOKUP"
    "$b" umount "$d/m"
  done
done
