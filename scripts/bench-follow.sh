#!/usr/bin/env bash
# Issue 14, "long kernel TTLs made safe": the same tierfs binary mounted with
# `follow_changes = false` (the 1 s TTLs) and with `follow_changes = true` (the default since
# 2026-11-24; follow_ttl 30 s), one after the other, on a fresh
# SQLite filesystem each, one local-directory target, no PCC. Per mode:
#   - create N (10,000) empty files in one directory (mdtest's create phase, one process);
#   - stat each of them once (mdtest's stat phase, right after the create phase), and again 2 s
#     later (past the 1 s TTL);
#   - `ls -l` of the directory, then again 2 s later ("warm": page and dentry caches kept, the
#     first listing more than the 1 s TTL old).
# Printed: seconds per phase and the FUSE requests the daemon answered during it, by kind
# (its .tierfs-stats counters; the 5 most frequent). A second client is mounted in both modes (idle) so that the
# follower has another client's session beside it, as in a cluster.
#
#   scripts/bench-follow.sh [--bin PATH] [--files N]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${CARGO_TARGET_DIR:-target}/release/tierfs
FILES=10000
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) BIN=$2; shift 2;;
    --files) FILES=$2; shift 2;;
    *) echo "unknown option $1" >&2; exit 2;;
  esac
done
[ -x "$BIN" ] || { echo "no tierfs binary at $BIN (cargo build --release -p tierfs-cli)" >&2; exit 1; }
W=$(mktemp -d /var/tmp/tierfs-follow.XXXXXX)
cleanup() {
  for m in "$W"/*/m0 "$W"/*/m1; do [ -d "$m" ] && { "$BIN" umount "$m" 2>/dev/null || true; }; done
  rm -rf "$W"
}
trap cleanup EXIT

run() { # NAME CONFIG_TEXT
  local d=$W/$1
  mkdir -p "$d/m0" "$d/m1"
  printf '%s' "$2" > "$d/client.toml"
  "$BIN" format --meta "sqlite://$d/meta.db" --target "file://$d/ost0" >/dev/null
  "$BIN" mount --meta "sqlite://$d/meta.db" "$d/m0" --client-name a --config "$d/client.toml" --log-file "$d/a.log"
  "$BIN" mount --meta "sqlite://$d/meta.db" "$d/m1" --client-name b --config "$d/client.toml" --log-file "$d/b.log"
  python3 - "$d/m0" "$FILES" <<'EOF'
import os, sys, time, subprocess
mnt, n = sys.argv[1], int(sys.argv[2])
d = os.path.join(mnt, "many")
os.mkdir(d)
names = [os.path.join(d, "file.%06d" % i) for i in range(n)]
def ops():
    t = {}
    for line in open(os.path.join(mnt, ".tierfs-stats")):
        if line.startswith('tierfs_fuse_ops_total{op="'):
            op = line.split('"')[1]
            t[op] = int(float(line.split()[-1]))
    return t
def phase(name, f):
    o = ops(); t = time.perf_counter(); f(); e = time.perf_counter() - t
    n = ops()
    d = sorted(((n[k] - o.get(k, 0), k) for k in n if n[k] != o.get(k, 0)), reverse=True)
    print("  %-22s %7.3f s  %s" % (name, e, ", ".join("%s %d" % (k, v) for v, k in d[:5])))
stat = lambda: [os.stat(p) for p in names]
ls = lambda: subprocess.run(["ls", "-l", d], stdout=subprocess.DEVNULL, check=True)
phase("create", lambda: [os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o644)) for p in names])
phase("stat", stat)
time.sleep(2)
phase("stat (2 s later)", stat)
phase("ls -l", ls)
time.sleep(2)
phase("ls -l (2 s later)", ls)
EOF
  "$BIN" umount "$d/m1"
  "$BIN" umount "$d/m0"
}

echo "follow_changes = false: attr_ttl = entry_ttl = 1 s, $FILES files:"
run default $'follow_changes = false\n'
echo "follow_changes = true (the default; follow_ttl = 30 s), $FILES files:"
run follow $'follow_changes = true\n'
