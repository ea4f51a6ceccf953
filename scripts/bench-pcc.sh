#!/usr/bin/env bash
# Persistent client cache benchmarks of issue 3, in one run, interleaved:
#  1. fio O_DIRECT on a PCC-cached file (RW-PCC, served by kernel passthrough) vs the same fio on
#     the very same disk blocks opened directly: the cache file itself, bypassing tierfs (two
#     files of one filesystem on this machine's virtual disk differ by up to 2x in random-write
#     IOPS by where they lie, so a different file would measure placement, not tierfs). A plain
#     file of the same filesystem is measured too, for reference;
#  2. the seed 000 case: 4 KiB random writes, O_DIRECT, libaio, iodepth 1 and 4, RW-PCC vs
#     uncached tierfs (and native); and the same with O_DSYNC, where each write must be on
#     stable storage when it returns (uncached: committed to the capacity tier and the engine);
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
record() { echo "{\"rep\":${rep:-0},\"workload\":\"$1\",\"mode\":\"$2\",\"metric\":\"$3\",\"value\":$4}" >> "$RAW"; }
fio_run() { # file args... -> "bw_bytes iops"
  local file=$1; shift
  fio --name=j --filename="$file" --size="$SIZE" --output-format=json "$@" > "$W/fio.json"
  python3 -c '
import json,sys
j=json.load(open(sys.argv[1]))["jobs"][0]
d=j["read"] if j["read"]["io_bytes"]>0 else j["write"]
print(d["bw_bytes"], d["iops"])' "$W/fio.json"
}
lay_out() { # path -> writes SIZE bytes of zeros in place, as the PCC file is laid out
  dd if=/dev/zero of="$1" bs=1M count=$(( $(numfmt --from=iec "$SIZE") >> 20 )) conv=notrunc status=none
}
prepare_pcc() { # -> the cache file behind $A/pcc (RW-PCC, laid out through the mount)
  rm -f "$A/pcc"; touch "$A/pcc"; "$T" pcc attach -w "$A/pcc"; lay_out "$A/pcc"
  local st; st=$("$T" pcc state "$A/pcc")
  grep -q "type: readwrite" <<<"$st" || { echo "error: $A/pcc is not RW-cached: $st" >&2; exit 1; }
  sed -n 's/.*cache_file: \([^,]*\),.*/\1/p' <<<"$st"
}
JOBS=(
  "seq-write-1m-direct|--rw=write --bs=1M --direct=1 --ioengine=libaio --iodepth=1 --time_based --runtime=$RUNTIME"
  "seq-read-1m-direct|--rw=read --bs=1M --direct=1 --ioengine=libaio --iodepth=1 --time_based --runtime=$RUNTIME"
  "rand-read-4k-direct-qd1|--rw=randread --bs=4k --direct=1 --ioengine=libaio --iodepth=1 --time_based --runtime=$RUNTIME"
  "rand-read-4k-direct-qd32|--rw=randread --bs=4k --direct=1 --ioengine=libaio --iodepth=32 --time_based --runtime=$RUNTIME"
  "rand-write-4k-direct-qd1|--rw=randwrite --bs=4k --direct=1 --ioengine=libaio --iodepth=1 --time_based --runtime=$RUNTIME"
  "rand-write-4k-direct-qd4|--rw=randwrite --bs=4k --direct=1 --ioengine=libaio --iodepth=4 --time_based --runtime=$RUNTIME"
  "rand-write-4k-direct-qd32|--rw=randwrite --bs=4k --direct=1 --ioengine=libaio --iodepth=32 --time_based --runtime=$RUNTIME"
  "rand-write-4k-direct-dsync-qd1|--rw=randwrite --bs=4k --direct=1 --sync=dsync --ioengine=libaio --iodepth=1 --time_based --runtime=$RUNTIME"
  "rand-write-4k-direct-dsync-qd4|--rw=randwrite --bs=4k --direct=1 --sync=dsync --ioengine=libaio --iodepth=4 --time_based --runtime=$RUNTIME"
)
for rep in $(seq 1 "$REPS"); do
  cf=$(prepare_pcc)
  [ -f "$cf" ] || { echo "error: no cache file behind $A/pcc ($cf)" >&2; exit 1; }
  rm -f "$NATIVE/data"; touch "$NATIVE/data"; lay_out "$NATIVE/data"
  rm -f "$A/plain"; fio --name=lay --filename="$A/plain" --size="$SIZE" --rw=write --bs=1M --output-format=terse >/dev/null
  for job in "${JOBS[@]}"; do
    name=${job%%|*}; args=${job#*|}
    # the same blocks directly and through tierfs in A B B A order, so that a drift of the
    # (virtual, shared) disk during the four runs weighs on both alike
    if [ $((rep % 2)) = 1 ]; then modes="native rw-pcc rw-pcc native"; else modes="rw-pcc native native rw-pcc"; fi
    modes="$modes native-file"
    case $name in rand-write-4k-direct-qd1|rand-write-4k-direct-qd4|*dsync*) modes="$modes tierfs";; esac
    for mode in $modes; do
      case $mode in native) f=$cf;; rw-pcc) f=$A/pcc;; native-file) f=$NATIVE/data;; tierfs) f=$A/plain;; esac
      dropcaches
      read -r bw iops < <(fio_run "$f" $args)
      echo "rep $rep $mode $name: $((bw / 1000000)) MB/s, ${iops%.*} IOPS"
      record "$name" "$mode" bw_bytes "$bw"; record "$name" "$mode" iops "$iops"
    done
  done
  "$T" pcc state "$A/pcc" | grep -q "type: readwrite" || { echo "error: $A/pcc lost its RW-PCC state during the run" >&2; exit 1; }
  rm -f "$A/pcc" "$A/plain" "$NATIVE/data"
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
for r in rows: v[(r["workload"],r["mode"],r["metric"])].append(r)
order=[]
for r in rows:
    if r["workload"] not in order: order.append(r["workload"])
med=lambda rs: statistics.median(x["value"] for x in rs)
out=["| workload | metric | native (same blocks) | RW-PCC | native (another file) | uncached tierfs | RW-PCC / native: median of pairs (range) | RW-PCC / uncached |",
     "|---|---|---:|---:|---:|---:|---:|---:|"]
for w in order:
    if w.startswith("remote-open"):
        out.append(f"| {w} | latency | | {med(v[(w,'rw-pcc','ms')]):.0f} ms | | | | |"); continue
    m="bw_bytes" if "1m" in w else "iops"
    f=(lambda x: f"{x/1e6:.0f} MB/s") if m=="bw_bytes" else (lambda x: f"{x:,.0f}/s")
    nat, pcc = v[(w,"native",m)], v[(w,"rw-pcc",m)]
    # each rep ran A B B A: pair the i-th native run of a rep with its i-th RW-PCC run
    pairs=[]
    for rep in sorted({x["rep"] for x in nat}):
        a=[x["value"] for x in nat if x["rep"]==rep]; b=[x["value"] for x in pcc if x["rep"]==rep]
        pairs += [q/p for p,q in zip(a,b)]
    t=v.get((w,"tierfs",m))
    n, p, o = med(nat), med(pcc), med(v[(w,"native-file",m)])
    tm = med(t) if t else None
    out.append(f"| {w} | {'bandwidth' if m=='bw_bytes' else 'IOPS'} | {f(n)} | {f(p)} | {f(o)} | {f(tm) if tm else ''} | "
               f"{statistics.median(pairs):.2f}x ({min(pairs):.2f}-{max(pairs):.2f}) | {f'{p/tm:.1f}x' if tm else ''} |")
open(sys.argv[2],"w").write("\n".join(out)+"\n"); print("\n".join(out))
PY
echo "raw results: $RAW"
