#!/usr/bin/env bash
# Cost of attaching small files to RW-PCC at create: N files of 32 KiB written one after the
# other (open, write, close) into the local filesystem, into uncached tierfs, and into tierfs
# under an rw rule (each new file lives in the client's cache from its first byte), in one run;
# then one uncached and one RW-PCC file after the other, with the median time of each.
#
#   scripts/bench-pcc-create.sh [--bin PATH] [--files 2000] [--reps 3]
# --bin: a built tierfs binary (default: build the release binary of this tree)
set -euo pipefail
cd "$(dirname "$0")/.."
N=2000 REPS=3 T=
while [ $# -gt 0 ]; do
  case "$1" in
    --files) N=$2; shift 2;;
    --reps) REPS=$2; shift 2;;
    --bin) T=$2; shift 2;;
    *) echo "unknown option $1"; exit 2;;
  esac
done
if [ -z "$T" ]; then
  cargo build --release --quiet -p tierfs-cli
  T=${CARGO_TARGET_DIR:-$PWD/target}/release/tierfs
fi
W=$(mktemp -d /var/tmp/tierfs-pcc-create.XXXXXX)
cleanup() { "$T" umount "$W/m" 2>/dev/null || true; rm -rf "$W"; }
trap cleanup EXIT
mkdir -p "$W/m"
"$T" format --meta "sqlite://$W/meta.db" --target "file://$W/ost" >/dev/null
"$T" mount --meta "sqlite://$W/meta.db" "$W/m" --client-name a --cache-dir "$W/cache" --cache-size 64G --log-file "$W/a.log"
"$T" pcc rule add --mode rw --mount "$W/m" "fname={*.rw}" >/dev/null
sleep 2.2  # clients read the rules every 2 s
head -c 32768 /dev/urandom > "$W/src"
rate() { # dir suffix -> files/s
  python3 - "$1" "$2" "$N" "$W/src" <<'PY'
import sys, time
d, ext, n, src = sys.argv[1], sys.argv[2], int(sys.argv[3]), open(sys.argv[4], "rb").read()
t = time.time()
for i in range(n):
    with open(f"{d}/f{i}{ext}", "wb") as f:
        f.write(src)
print(f"{n / (time.time() - t):.0f}")
PY
}
for rep in $(seq 1 "$REPS"); do
  mkdir -p "$W/native$rep" "$W/m/plain$rep" "$W/m/rw$rep"
  sync
  n=$(rate "$W/native$rep" ""); p=$(rate "$W/m/plain$rep" ""); r=$(rate "$W/m/rw$rep" ".rw")
  echo "rep $rep: native $n files/s, tierfs uncached $p files/s, tierfs RW-PCC (rw rule) $r files/s"
done
# The same, one file of each kind after the other (a busy machine slows both alike): the
# median and mean time of one open+write+close.
mkdir -p "$W/m/mixed"
python3 - "$W/m/mixed" "$N" "$W/src" <<'PY'
import sys, time, statistics
d, n, src = sys.argv[1], int(sys.argv[2]), open(sys.argv[3], "rb").read()
t = {"": [], ".rw": []}
for i in range(n):
    for ext in ("", ".rw"):
        s = time.perf_counter()
        with open(f"{d}/f{i}{ext}", "wb") as f:
            f.write(src)
        t[ext].append(time.perf_counter() - s)
for f, name in ((statistics.median, "median"), (statistics.fmean, "mean")):
    p, r = f(t[""]) * 1e6, f(t[".rw"]) * 1e6
    print(f"interleaved, {name} per file: tierfs uncached {p:.0f} us, RW-PCC {r:.0f} us ({r / p:.2f}x)")
PY
"$T" pcc stats "$W/m" | grep -E "attaches_rw|cache_files"
