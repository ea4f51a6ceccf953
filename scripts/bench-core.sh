#!/usr/bin/env bash
# Core benchmarks of issue 2, tierfs (uncached) against the local filesystem beneath it, in one
# run, interleaved so machine noise hits both alike. Prints a markdown table of medians and
# ratios (tierfs / native) and writes raw results as JSON lines.
#
#   scripts/bench-core.sh [--reps N] [--size 1G] [--runtime 8] [--files 10000] [--out results/core]
#
# Needs root (FUSE, drop_caches) and fio.
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=3 SIZE=1G RUNTIME=8 FILES=10000 OUT=results/core
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) REPS=$2; shift 2;;
    --size) SIZE=$2; shift 2;;
    --runtime) RUNTIME=$2; shift 2;;
    --files) FILES=$2; shift 2;;
    --out) OUT=$2; shift 2;;
    *) echo "unknown option $1"; exit 2;;
  esac
done
command -v fio >/dev/null || { echo "fio is not installed (apt-get install fio)"; exit 1; }
cargo build --release --quiet
T=$PWD/target/release/tierfs
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
W=$(mktemp -d /var/tmp/tierfs-bench.XXXXXX)
NATIVE=$W/native; MNT=$W/mnt
mkdir -p "$NATIVE" "$MNT"
cleanup() { "$T" umount "$MNT" 2>/dev/null || true; rm -rf "$W"; }
trap cleanup EXIT
"$T" format --meta "sqlite://$W/meta.db" --target "file://$W/ost0" --target "file://$W/ost1" >/dev/null
"$T" mount --meta "sqlite://$W/meta.db" "$MNT" --client-name bench --log-file "$W/mount.log"
RAW=$OUT/raw.jsonl; : > "$RAW"

dropcaches() { sync; echo 3 > /proc/sys/vm/drop_caches; }
# Wait until tierfs has deleted the objects of removed files (its garbage collector runs in the
# background and would otherwise compete with the next measurement, of either mode).
quiesce() {
  sync
  for _ in $(seq 1 240); do
    [ "$(sqlite3 "$W/meta.db" 'SELECT COUNT(*) FROM trash' 2>/dev/null)" = 0 ] && break
    sleep 0.5
  done
  sync
}

# fio JOB DIR -> "bw_bytes iops" of the job's main direction
fio_run() {
  local name=$1 dir=$2; shift 2
  fio --name="$name" --directory="$dir" --filename="$name.dat" --size="$SIZE" \
      --output-format=json "$@" > "$W/fio.json"
  python3 - "$W/fio.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
r, w = j["read"], j["write"]
d = r if r["io_bytes"] > 0 else w
print(d["bw_bytes"], d["iops"])
PY
}

record() { # workload mode metric value
  echo "{\"workload\":\"$1\",\"mode\":\"$2\",\"metric\":\"$3\",\"value\":$4}" >> "$RAW"
}

# name | fio args (the data file is laid out by a write job first)
JOBS=(
  "seq-write-1m|--rw=write --bs=1M --ioengine=psync --end_fsync=1"
  "seq-read-1m|--rw=read --bs=1M --ioengine=psync"
  "rand-read-4k|--rw=randread --bs=4k --ioengine=psync --time_based --runtime=$RUNTIME"
  "rand-read-4k-direct-qd1|--rw=randread --bs=4k --direct=1 --ioengine=libaio --iodepth=1 --time_based --runtime=$RUNTIME"
  "rand-read-4k-direct-qd32|--rw=randread --bs=4k --direct=1 --ioengine=libaio --iodepth=32 --time_based --runtime=$RUNTIME"
  "rand-write-4k|--rw=randwrite --bs=4k --ioengine=psync --time_based --runtime=$RUNTIME --end_fsync=1"
  "rand-write-4k-direct-qd1|--rw=randwrite --bs=4k --direct=1 --ioengine=libaio --iodepth=1 --time_based --runtime=$RUNTIME --end_fsync=1"
  "rand-write-4k-direct-qd32|--rw=randwrite --bs=4k --direct=1 --ioengine=libaio --iodepth=32 --time_based --runtime=$RUNTIME --end_fsync=1"
)
for rep in $(seq 1 "$REPS"); do
  for mode in native tierfs; do
    dir=$NATIVE; [ "$mode" = tierfs ] && dir=$MNT
    # lay out the data file once per mode and repetition
    rm -f "$dir/data.dat"
    for job in "${JOBS[@]}"; do
      name=${job%%|*}; args=${job#*|}
      case $name in seq-write-1m) rm -f "$dir/data.dat";; esac
      dropcaches
      # shellcheck disable=SC2086
      read -r bw iops < <(fio_run data "$dir" $args)
      echo "rep $rep $mode $name: $((bw / 1000000)) MB/s, ${iops%.*} IOPS"
      record "$name" "$mode" bw_bytes "$bw"
      record "$name" "$mode" iops "$iops"
    done
    rm -f "$dir/data.dat"
    quiesce
    dropcaches
    md=$(python3 scripts/mdrate.py "$dir/md" "$FILES")
    echo "rep $rep $mode metadata: $md"
    for k in create stat unlink; do
      v=$(python3 -c "import json,sys; print(json.loads(sys.argv[1])['$k'])" "$md")
      record "md-$k-$FILES" "$mode" ops "$v"
    done
    quiesce
  done
done

python3 - "$RAW" "$OUT/table.md" "$REPS" "$SIZE" <<'PY'
import json, statistics, sys, collections
rows = [json.loads(l) for l in open(sys.argv[1])]
vals = collections.defaultdict(list)
for r in rows:
    vals[(r["workload"], r["mode"], r["metric"])].append(r["value"])
order = []
for r in rows:
    if r["workload"] not in order:
        order.append(r["workload"])
out = ["| workload | metric | native | tierfs | tierfs / native |", "|---|---|---:|---:|---:|"]
for w in order:
    metric = "ops" if w.startswith("md-") else ("bw_bytes" if "1m" in w else "iops")
    n = statistics.median(vals[(w, "native", metric)])
    t = statistics.median(vals[(w, "tierfs", metric)])
    fmt = (lambda v: f"{v/1e6:.0f} MB/s") if metric == "bw_bytes" else (lambda v: f"{v:,.0f}/s")
    out.append(f"| {w} | {'bandwidth' if metric=='bw_bytes' else metric} | {fmt(n)} | {fmt(t)} | {t/n:.2f}x |")
open(sys.argv[2], "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY
echo "raw results: $RAW"
