#!/usr/bin/env bash
# Creates/s on two fresh filesystems, one whose 2 clients mount with follow_changes = false,
# one with true; bursts alternate between them (order flips each round), so drift falls on both.
#
#   scripts/follow-cost.sh BIN [FILES_PER_BURST=2000] [ROUNDS=6] [FILE_SIZE=0]
# (docs/benchmarks.md, "Following other clients", "On by default")
set -euo pipefail
[ $# -ge 1 ] && [ -x "$1" ] || { echo "usage: scripts/follow-cost.sh TIERFS_BIN [FILES_PER_BURST] [ROUNDS] [FILE_SIZE]" >&2; exit 2; }
BIN=$1; PER=${2:-2000}; ROUNDS=${3:-6}; SIZE=${4:-0}
W=$(mktemp -d /var/tmp/tierfs-fcost.XXXXXX)
cleanup() { for m in "$W"/*/m0 "$W"/*/m1; do [ -d "$m" ] && { "$BIN" umount "$m" 2>/dev/null || true; }; done; rm -rf "$W"; }
trap cleanup EXIT
for mode in off on; do
  d=$W/$mode; mkdir -p $d/m0 $d/m1
  [ $mode = on ] && v=true || v=false
  printf 'follow_changes = %s\n' $v > $d/c.toml
  "$BIN" format --meta "sqlite://$d/meta.db" --target "file://$d/ost0" >/dev/null
  "$BIN" mount --meta "sqlite://$d/meta.db" $d/m0 --client-name a --config $d/c.toml --log-file $d/a.log
  "$BIN" mount --meta "sqlite://$d/meta.db" $d/m1 --client-name b --config $d/c.toml --log-file $d/b.log
done
python3 - "$W" "$PER" "$ROUNDS" "$SIZE" <<'PY'
import os, sys, time, statistics
w, per, rounds, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
data = os.urandom(size)
def burst(d):
    os.makedirs(d); t = time.perf_counter()
    for i in range(per):
        fd = os.open(f"{d}/f{i}", os.O_CREAT | os.O_WRONLY, 0o644)
        if data: os.write(fd, data)
        os.close(fd)
    c = per / (time.perf_counter() - t)
    t = time.perf_counter()
    for i in range(per): os.unlink(f"{d}/f{i}")
    return c, per / (time.perf_counter() - t)
res = {"off": [], "on": []}
for r in range(rounds):
    for m in (["off", "on"] if r % 2 == 0 else ["on", "off"]):
        res[m].append(burst(f"{w}/{m}/m0/r{r}"))
for m in ("off", "on"):
    print(m, "creates/s", [round(c) for c, _ in res[m]], "unlinks/s", [round(u) for _, u in res[m]])
co = statistics.median(c for c, _ in res["off"]); cn = statistics.median(c for c, _ in res["on"])
uo = statistics.median(u for _, u in res["off"]); un = statistics.median(u for _, u in res["on"])
print(f"median create: off {co:.0f}/s, on {cn:.0f}/s ({(cn/co-1)*100:+.1f}%); unlink: off {uo:.0f}/s, on {un:.0f}/s ({(un/uo-1)*100:+.1f}%); {size}-byte files, {per} per burst, {rounds} rounds")
PY
