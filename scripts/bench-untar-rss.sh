#!/usr/bin/env bash
# Untars N small files (100-2,000 bytes, 1,000 per directory; inline in the metadata under the
# default 64 KiB threshold) into a fresh tierfs mount (SQLite, two local targets) and samples the
# client daemon's memory every 5 s: the figure behind "buffered data and per-file state stay
# bounded" (docs/benchmarks.md). Prints entries/s, the daemon's peak RSS (VmHWM), the file
# states left, and the write-ahead log's largest size seen.
#
#   scripts/bench-untar-rss.sh [N] [WORKDIR]     # N defaults to 1000000; needs root (FUSE)
#   TIERFS_BIN=path/to/tierfs                    # default: a release build of this tree
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
N=${1:-1000000}
W=${2:-/tmp/tierfs-untar-rss}
if [[ -z ${TIERFS_BIN:-} ]]; then
    (cd "$ROOT" && cargo build --release -q -p tierfs-cli)
    TIERFS_BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/tierfs"
fi
TAR="$W.$N.tar"
if [[ ! -s $TAR ]]; then
    echo "writing $TAR ($N files)"
    python3 - "$N" "$TAR" <<'PY'
import io, random, sys, tarfile
n, out = int(sys.argv[1]), sys.argv[2]
rnd = random.Random(10)
blob = bytes(rnd.getrandbits(8) for _ in range(1 << 16))
with tarfile.open(out, "w", format=tarfile.GNU_FORMAT) as tf:
    for d in range((n + 999) // 1000):
        ti = tarfile.TarInfo(f"d{d:04d}"); ti.type = tarfile.DIRTYPE; ti.mode = 0o755; ti.mtime = 1700000000
        tf.addfile(ti)
        for i in range(min(1000, n - d * 1000)):
            size = rnd.randint(100, 2000); off = rnd.randint(0, len(blob) - size)
            ti = tarfile.TarInfo(f"d{d:04d}/f{i:04d}"); ti.size = size; ti.mode = 0o644; ti.mtime = 1700000000
            tf.addfile(ti, io.BytesIO(blob[off:off + size]))
PY
fi
D="$W/fs"
MNT="$D/mnt"
cleanup() {
    [[ -n ${SAMPLER:-} ]] && kill "$SAMPLER" 2>/dev/null || true
    mountpoint -q "$MNT" 2>/dev/null && "$TIERFS_BIN" umount "$MNT" || true
}
trap cleanup EXIT
rm -rf "$D"; mkdir -p "$MNT"
"$TIERFS_BIN" format --meta "sqlite://$D/meta.db" --target "file://$D/ost0" --target "file://$D/ost1" >/dev/null
"$TIERFS_BIN" mount --meta "sqlite://$D/meta.db" "$MNT" --client-name untar --log-file "$D/daemon.log"
PID=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['pid'])" "$MNT/.tierfs-info")
( while kill -0 "$PID" 2>/dev/null; do
    wal=$(stat -c %s "$D/meta.db-wal" 2>/dev/null || echo 0)
    echo "$(date +%s) $(awk '/VmRSS|VmHWM/{printf "%s %s ",$1,$2}' /proc/"$PID"/status) wal=$wal"
    sleep 5
  done ) > "$D/rss.log" 2>/dev/null &
SAMPLER=$!
T0=$(date +%s.%N)
tar -xf "$TAR" -C "$MNT"
T1=$(date +%s.%N)
entries=$(( N + (N + 999) / 1000 ))
python3 -c "import sys; t=float(sys.argv[2])-float(sys.argv[1]); print(f'untar of {sys.argv[3]} entries: {t:.1f} s, {int(sys.argv[3])/t:.0f} entries/s')" "$T0" "$T1" "$entries"
grep -E 'VmHWM' /proc/"$PID"/status
echo "file states left: $(awk '/^tierfs_file_states /{print $2}' "$MNT/.tierfs-stats")"
echo "largest write-ahead log seen: $(awk '{for(i=1;i<=NF;i++) if ($i ~ /^wal=/) {split($i,a,"="); if (a[2]>m) m=a[2]}} END {printf "%.0f MiB", m/1048576}' "$D/rss.log")"
echo "samples: $D/rss.log"
