#!/usr/bin/env bash
# Under 1gbe, filebench webserver (built-in: 1000 files of 64 KiB, 4 threads, 30 s), modes
# uncached and RW-PCC, three configurations, 3 rounds in rotating order:
#   A  = the build before the merged open statement (TD_A), kept opens on (default)
#   B  = this session's build (TD_B), kept opens on (default, pcc_open_cache_secs = 10)
#   C  = this session's build (TD_B), kept opens off (TIERFS_CONFIG: pcc_open_cache_secs = 0)
#   remote3.sh REPO TD_A TD_B OUT
set -euo pipefail
REPO=$1; TDA=$2; TDB=$3; OUT=$4; mkdir -p "$OUT"
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$REPO"
orders=("A B C" "B C A" "C A B")
for r in 1 2 3; do
  for cfg in ${orders[$((r-1))]}; do
    echo "$(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg) round $r config $cfg" | tee -a "$OUT/log.txt"
    case $cfg in
      A) td=$TDA; unset TIERFS_CONFIG ;;
      B) td=$TDB; unset TIERFS_CONFIG ;;
      C) td=$TDB; export TIERFS_CONFIG=$HERE/nokept.toml ;;
    esac
    rc=0
    CARGO_TARGET_DIR=$td scripts/bench-remote.sh --profile 1gbe --no-build --modes tierfs,tierfs+rw-pcc \
      --out "$OUT/$cfg-$r" -- filebench webserver --files 1000 --duration 30s >"$OUT/$cfg-$r.log" 2>&1 || rc=$?
    echo "exit $rc" >> "$OUT/log.txt"
    grep -rhE '^\| webserver \| ops' "$OUT/$cfg-$r" | tee -a "$OUT/log.txt" || true
  done
done
unset TIERFS_CONFIG
