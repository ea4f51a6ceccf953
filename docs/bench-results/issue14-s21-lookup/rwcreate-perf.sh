#!/usr/bin/env bash
# perf profile of the daemon while one process creates N files of 32 KiB (open, write, close),
# uncached (suffix .u) then under an rw rule (suffix .rw), on one mount with a cache.
#   rwcreate-perf.sh BIN N OUTDIR
set -euo pipefail
T=$1; N=$2; O=$3; mkdir -p "$O"
W=$(mktemp -d /var/tmp/rwperf.XXXXXX)
trap '"$T" umount "$W/m" 2>/dev/null || true; rm -rf "$W"' EXIT
mkdir -p "$W/m"
"$T" format --meta "sqlite://$W/meta.db" --target "file://$W/ost" >/dev/null
"$T" mount --meta "sqlite://$W/meta.db" "$W/m" --client-name a --cache-dir "$W/cache" --cache-size 64G --log-file "$W/a.log"
"$T" pcc rule add --mode rw --mount "$W/m" "fname={*.rw}" >/dev/null
sleep 2.2
pid=$(pgrep -f "$W/meta.db" | head -1); echo "daemon pid $pid: $(tr "\0" " " < /proc/$pid/cmdline | cut -c1-80)"
head -c 32768 /dev/urandom > "$W/src"
for ext in .u .rw; do
  mkdir -p "$W/m/d$ext"
  perf record -q -F 2000 -g -p "$pid" -o "$O/perf$ext.data" -- sleep 600 2>/dev/null &
  pp=$!; sleep 0.5
  python3 - "$W/m/d$ext" "$ext" "$N" "$W/src" <<'PY'
import sys, time
d, ext, n, src = sys.argv[1], sys.argv[2], int(sys.argv[3]), open(sys.argv[4], "rb").read()
t = time.time()
for i in range(n):
    with open(f"{d}/f{i}{ext}", "wb") as f:
        f.write(src)
print(f"{ext}: {n / (time.time() - t):.0f} files/s")
PY
  kill -INT $pp; wait $pp 2>/dev/null || true
done
grep -E 'op="(create|flush|release|write|lookup|getattr|getxattr)"' "$W/m/.tierfs-stats" | grep -E '_sum|_count' > "$O/ops.txt" || true
