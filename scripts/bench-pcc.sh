#!/usr/bin/env bash
# Persistent client cache benchmarks of issue 3, in one run, interleaved:
#  1. fio O_DIRECT on a PCC-cached file (RW-PCC, served by kernel passthrough) vs the same fio on
#     the local filesystem the cache lives on;
#  2. the seed 000 case: 4 KiB random writes, O_DIRECT, libaio, iodepth 1 and 4, RW-PCC vs
#     uncached tierfs (and native);
#  3. remote-open latency of a 1 GiB RW-PCC file, clean and dirty (another client's first read).
#
#   scripts/bench-pcc.sh [--reps N] [--size 1G] [--runtime 8] [--out results/pcc]
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=3 SIZE=1G RUNTIME=8 OUT=results/pcc
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) REPS=$2; shift 2;;
    --size) SIZE=$2; shift 2;;
    --runtime) RUNTIME=$2; shift 2;;
    --out) OUT=$2; shift 2;;
    *) echo "unknown option $1"; exit 2;;
  esac
done
command -v fio >/dev/null || { echo "fio is not installed (apt-get install fio)"; exit 1; }
cargo build --release --quiet -p tierfs-cli
T=$PWD/target/release/tierfs
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
W=$(mktemp -d /var/tmp/tierfs-pcc.XXXXXX)
NATIVE=$W/native; A=$W/a; B=$W/b
mkdir -p "$NATIVE" "$A" "$B"
cleanup() { "$T" umount "$A" 2>/dev/null || true; "$T" umount "$B" 2>/dev/null || true; rm -rf "$W"; }
trap cleanup EXIT
"$T" format --meta "sqlite://$W/meta.db" --target "file://$W/ost0" --target "file://$W/ost1" >/dev/null
# Write-back only on demand during the run (a long delay), so "dirty" stays dirty.
printf 'writeback_delay_secs = 3600\n' > "$W/client.toml"
"$T" mount --meta "sqlite://$W/meta.db" "$A" --client-name a --cache-dir "$W/cache-a" --cache-size 8G --config "$W/client.toml" --log-file "$W/a.log"
"$T" mount --meta "sqlite://$W/meta.db" "$B" --client-name b --cache-dir "$W/cache-b" --cache-size 8G --config "$W/client.toml" --log-file "$W/b.log"
RAW=$OUT/raw.jsonl; : > "$RAW"
dropcaches() { sync; echo 3 > /proc/sys/vm/drop_caches; }
record() { echo "{\"workload\":\"$1\",\"mode\":\"$2\",\"metric\":\"$3\",\"value\":$4}" >> "$RAW"; }
fio_run() { # file args... -> "bw_bytes iops"
  local file=$1; shift
  fio --name=j --filename="$file" --size="$SIZE" --output-format=json "$@" > "$W/fio.json"
  python3 -c '
import json,sys
j=json.load(open(sys.argv[1]))["jobs"][0]
d=j["read"] if j["read"]["io_bytes"]>0 else j["write"]
print(d["bw_bytes"], d["iops"])' "$W/fio.json"
}
prepare() { # mode -> path of a laid-out data file
  case $1 in
    native) rm -f "$NATIVE/data"; fio --name=lay --filename="$NATIVE/data" --size="$SIZE" --rw=write --bs=1M --output-format=terse >/dev/null; echo "$NATIVE/data";;
    # fio re-creates a file whose size is not the job's, which would lose the attach: lay the
    # cached file out with dd (same inode), so fio finds it complete.
    rw-pcc) rm -f "$A/pcc"; touch "$A/pcc"; "$T" pcc attach -w "$A/pcc"
            dd if=/dev/zero of="$A/pcc" bs=1M count=$(( $(numfmt --from=iec "$SIZE") >> 20 )) conv=notrunc status=none
            "$T" pcc state "$A/pcc" | grep -q "type: readwrite" || { echo "error: $A/pcc is not RW-cached" >&2; exit 1; }
            echo "$A/pcc";;
    tierfs) rm -f "$A/plain"; fio --name=lay --filename="$A/plain" --size="$SIZE" --rw=write --bs=1M --output-format=terse >/dev/null; echo "$A/plain";;
  esac
}
JOBS=(
  "seq-write-1m-direct|--rw=write --bs=1M --direct=1 --ioengine=libaio --iodepth=1"
  "seq-read-1m-direct|--rw=read --bs=1M --direct=1 --ioengine=libaio --iodepth=1"
  "rand-read-4k-direct-qd1|--rw=randread --bs=4k --direct=1 --ioengine=libaio --iodepth=1 --time_based --runtime=$RUNTIME"
  "rand-read-4k-direct-qd32|--rw=randread --bs=4k --direct=1 --ioengine=libaio --iodepth=32 --time_based --runtime=$RUNTIME"
  "rand-write-4k-direct-qd1|--rw=randwrite --bs=4k --direct=1 --ioengine=libaio --iodepth=1 --time_based --runtime=$RUNTIME"
  "rand-write-4k-direct-qd4|--rw=randwrite --bs=4k --direct=1 --ioengine=libaio --iodepth=4 --time_based --runtime=$RUNTIME"
  "rand-write-4k-direct-qd32|--rw=randwrite --bs=4k --direct=1 --ioengine=libaio --iodepth=32 --time_based --runtime=$RUNTIME"
)
for rep in $(seq 1 "$REPS"); do
  for mode in native rw-pcc tierfs; do
    f=$(prepare $mode)
    [ -n "$f" ] || exit 1
    for job in "${JOBS[@]}"; do
      name=${job%%|*}; args=${job#*|}
      # uncached tierfs is only compared in the seed-000 random-write case
      if [ $mode = tierfs ] && [[ $name != rand-write-4k-direct-qd1 && $name != rand-write-4k-direct-qd4 ]]; then continue; fi
      dropcaches
      # shellcheck disable=SC2086
      read -r bw iops < <(fio_run "$f" $args)
      echo "rep $rep $mode $name: $((bw / 1000000)) MB/s, ${iops%.*} IOPS"
      record "$name" "$mode" bw_bytes "$bw"; record "$name" "$mode" iops "$iops"
    done
    rm -f "$f"
  done
  # remote open of a 1 GiB RW-PCC file: clean (written back, lease held) and dirty
  for state in clean dirty; do
    rm -f "$A/remote"; touch "$A/remote"; "$T" pcc attach -w "$A/remote"
    dd if=/dev/urandom of="$A/remote" bs=1M count=1024 status=none
    if [ $state = clean ]; then "$T" pcc detach --keep "$A/remote"; "$T" pcc attach -w "$A/remote"; fi
    "$T" pcc state "$A/remote" | sed 's/^/  /'
    sleep 1.2  # attribute TTL on b
    t0=$(date +%s.%N); head -c 1 "$B/remote" >/dev/null; t1=$(date +%s.%N)
    ms=$(python3 -c "print(round(($t1-$t0)*1000,1))")
    echo "rep $rep remote-open-1g-$state: $ms ms"
    record "remote-open-1g-$state" rw-pcc ms "$ms"
    sum_a=$(md5sum < "$A/remote"); sum_b=$(md5sum < "$B/remote")
    [ "$sum_a" = "$sum_b" ] || { echo "error: b read different data than a wrote"; exit 1; }
    rm -f "$A/remote"
  done
done
python3 - "$RAW" "$OUT/table.md" <<'PY'
import json, statistics, sys, collections
rows=[json.loads(l) for l in open(sys.argv[1])]
v=collections.defaultdict(list)
for r in rows: v[(r["workload"],r["mode"],r["metric"])].append(r["value"])
order=[]
for r in rows:
    if r["workload"] not in order: order.append(r["workload"])
out=["| workload | metric | native | RW-PCC | uncached tierfs | RW-PCC / native | RW-PCC / uncached |","|---|---|---:|---:|---:|---:|---:|"]
for w in order:
    if w.startswith("remote-open"):
        out.append(f"| {w} | latency | | {statistics.median(v[(w,'rw-pcc','ms')]):.0f} ms | | | |"); continue
    m="bw_bytes" if "1m" in w else "iops"
    f=(lambda x: f"{x/1e6:.0f} MB/s") if m=="bw_bytes" else (lambda x: f"{x:,.0f}/s")
    n=statistics.median(v[(w,"native",m)]); p=statistics.median(v[(w,"rw-pcc",m)])
    t=v.get((w,"tierfs",m))
    tm=statistics.median(t) if t else None
    out.append(f"| {w} | {'bandwidth' if m=='bw_bytes' else 'IOPS'} | {f(n)} | {f(p)} | {f(tm) if tm else ''} | {p/n:.2f}x | {f'{p/tm:.1f}x' if tm else ''} |")
open(sys.argv[2],"w").write("\n".join(out)+"\n"); print("\n".join(out))
PY
echo "raw results: $RAW"
