#!/usr/bin/env bash
# Issue 5: tierfs in cluster mode, measured on this machine, on loopback only.
#
#   1. mdtest create/stat/read/remove with 1, 2 and 4 clients, metadata on PostgreSQL vs SQLite
#      (everything else the same: two local file:// targets in the work dir), in a shared
#      directory, in one directory per client (mdtest -u), and with 2 and 4 clients each
#      working on another client's files after the create (mdtest -u -N);
#      plus the 1- and 4-client unique-directory runs on a second PostgreSQL with fsync=off, to
#      show what the commit flush costs;
#   2. sequential throughput (IOR file per process, 1 MiB transfers, write with fsync then read
#      back, verified) on S3 targets (two Garage buckets) vs local-directory targets, metadata
#      on SQLite.
#
# Every `tierfs bench` run also runs the same workload on the plain local disk (mode native),
# interleaved per repetition, so each run has its own tierfs/native ratio.
#
#   scripts/bench-cluster.sh [--out DIR] [--reps N] [--items N] [--ior-block SIZE]
#                            [--ior-clients N] [--workdir DIR] [--no-build]
#
# Defaults: --out docs/bench-results/cluster, --reps 3, --items 1000 (files per client, one
# task per client), --ior-block 256m (per client), --ior-clients 2, --workdir /var/tmp. About
# 7 to 8 minutes on the 2-core development machine, plus the release build.
#
# Servers: a private PostgreSQL started with PG_TEST_DURABLE=1 (PostgreSQL's defaults: fsync on,
# synchronous_commit on, full_page_writes on, so every commit waits for its WAL flush, as in a
# real deployment) and a private Garage S3 server (scripts/s3-test-server.sh: one node, its
# data_fsync and metadata_fsync off), both on 127.0.0.1 and both stopped on exit. One
# PostgreSQL database per run (CREATE DATABASE). Needs root (FUSE mounts, dropping caches).
#
# Writes, under --out: one directory per run with tierfs bench's results.json, results.csv,
# report.md and charts, plus run.log; commands.txt (every command line run), environment.txt
# (versions, durability settings, fdatasync rate of the disk, load before and after) and
# summary.md (the tables, computed from the results.json files).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$ROOT/docs/bench-results/cluster
REPS=3
ITEMS=1000
IOR_BLOCK=256m
IOR_CLIENTS=2
WORKDIR=/var/tmp
BUILD=1

usage() { sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        --out) OUT=$(realpath -m "$2"); shift 2 ;;
        --reps) REPS=$2; shift 2 ;;
        --items) ITEMS=$2; shift 2 ;;
        --ior-block) IOR_BLOCK=$2; shift 2 ;;
        --ior-clients) IOR_CLIENTS=$2; shift 2 ;;
        --workdir) WORKDIR=$2; shift 2 ;;
        --no-build) BUILD=0; shift ;;
        -h | --help) usage; exit 0 ;;
        *) echo "bench-cluster: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done

log() { echo "bench-cluster: $*" >&2; }

[[ $(id -u) -eq 0 ]] || { log "needs root (FUSE mounts, dropping the page cache)"; exit 2; }
cd "$ROOT"

if [[ $BUILD == 1 ]]; then
    log "cargo build --release -p tierfs-cli"
    cargo build --release -p tierfs-cli >&2
fi
TIERFS=$ROOT/target/release/tierfs
[[ -x $TIERFS ]] || { log "$TIERFS is missing (build it, or drop --no-build)"; exit 2; }

PG_DIR=
PG2_DIR=
S3_DIR=
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    local d
    for d in "$PG_DIR" "$PG2_DIR"; do
        if [[ -n $d ]]; then
            scripts/postgres-test-server.sh stop "$d" || true
        fi
    done
    if [[ -n $S3_DIR ]]; then
        scripts/s3-test-server.sh stop "$S3_DIR" || true
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$OUT"
: >"$OUT/commands.txt"
ENVF=$OUT/environment.txt
STARTED=$(date +%s)
{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "git: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- crates 2>/dev/null || echo ' (crates/ has uncommitted changes)')"
    echo "tierfs: $("$TIERFS" --version)"
    echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo), kernel $(uname -r)"
    echo "work dir disk: $(df --output=source,fstype "$WORKDIR" | tail -n 1 | tr -s ' ')"
    echo "load before: $(uptime)"
} >"$ENVF"

# The output of a test server's `start` is KEY=VALUE lines; keep the ones we know.
read_vars() {
    local line
    while IFS= read -r line; do
        case "$line" in
            TIERFS_PG_URL=* | TIERFS_PG_DIR=* | TIERFS_S3_ENDPOINT=* | TIERFS_S3_REGION=* | \
                TIERFS_S3_CREDENTIALS=* | TIERFS_S3_DIR=*)
                export "${line?}"
                ;;
        esac
    done <<<"$1"
}

log "starting PostgreSQL (durable) and Garage on loopback"
read_vars "$(PG_TEST_DURABLE=1 scripts/postgres-test-server.sh start)"
PG_DIR=$TIERFS_PG_DIR
read_vars "$(scripts/s3-test-server.sh start)"
S3_DIR=$TIERFS_S3_DIR

{
    echo "postgresql: $(psql "$TIERFS_PG_URL" -Atc 'SELECT version()')"
    echo "postgresql settings: $(psql "$TIERFS_PG_URL" -Atc "SELECT string_agg(name || '=' || current_setting(name), ', ' ORDER BY name) FROM pg_settings WHERE name IN ('fsync','synchronous_commit','full_page_writes','wal_sync_method','shared_buffers','listen_addresses')")"
    echo "postgresql data: $PG_DIR (same disk as the work dir: $(df --output=source "$PG_DIR" | tail -n 1))"
    echo "garage: $("$(cat "$S3_DIR/garage-bin")" --version 2>/dev/null | head -n 1); $(grep -E '^(metadata_fsync|data_fsync|db_engine|replication_factor)' "$S3_DIR/garage.toml" | tr '\n' ' ')"
    echo "garage data: $S3_DIR, endpoint $TIERFS_S3_ENDPOINT (loopback)"
    echo "sqlite: WAL, synchronous=NORMAL (tierfs-meta), a sync of the WAL at fsync"
} >>"$ENVF"

# What one PostgreSQL round trip costs here: a prepared SELECT 1 from one connection, 3 s.
sel=$(mktemp)
echo 'SELECT 1;' >"$sel"
echo "postgresql round trip: $("$(cat "$PG_DIR/bindir")/pgbench" -n -M prepared -c 1 -T 3 -f "$sel" "$TIERFS_PG_URL" 2>&1 |
    sed -n 's/^latency average = \(.*\)/\1 per prepared SELECT 1 from one connection (pgbench -M prepared -c 1 -T 3)/p')" >>"$ENVF"
rm -f "$sel"

# What one commit costs the disk: 8 KiB write + fdatasync, 2 s, in the work dir's file system.
python3 - "$WORKDIR" >>"$ENVF" <<'EOF'
import os, sys, time
p = os.path.join(sys.argv[1], "bench-cluster-fsync-%d" % os.getpid())
fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
buf = b"\0" * 8192
n, t0 = 0, time.monotonic()
while time.monotonic() - t0 < 2.0:
    os.pwrite(fd, buf, 0)
    os.fdatasync(fd)
    n += 1
dt = time.monotonic() - t0
os.close(fd)
os.unlink(p)
print("disk: %.0f fdatasync/s of 8 KiB (%.2f ms each) in %s" % (n / dt, dt / n * 1000, sys.argv[1]))
EOF

FAILED=()
# run NAME ARGS...: one `tierfs bench` run, its results in $OUT/NAME.
run() {
    local name=$1
    shift
    local dir=$OUT/$name
    rm -rf "$dir"
    mkdir -p "$dir"
    local cmd=("$TIERFS" bench --modes native,tierfs --reps "$REPS" --no-progress \
        --workdir "$WORKDIR" --out "$dir" "$@")
    local shown="${cmd[*]}"
    shown=${shown/#"$TIERFS"/target/release/tierfs}
    shown=${shown//"$OUT"/\$OUT}
    echo "+ $shown" | tee -a "$OUT/commands.txt" >&2
    echo "load $(cut -d' ' -f1-3 /proc/loadavg) before $name" >>"$OUT/commands.txt"
    local t0=$SECONDS rc=0
    "${cmd[@]}" >"$dir/run.log" 2>&1 || rc=$?
    echo "  exit $rc after $((SECONDS - t0)) s" | tee -a "$OUT/commands.txt" >&2
    grep -E '^(mdtest|ior)-.* rep [0-9]+:' "$dir/run.log" | sed 's/^/  /' >&2 || true
    if [[ $rc -ne 0 ]]; then
        FAILED+=("$name")
    fi
}

# mdtest: both engines at each client count, their order alternating so that noise hits both.
# new_db URL NAME: creates database bench_NAME on the server of URL; prints its URL.
new_db() {
    local db="bench_$2"
    echo "+ psql \"${1%/*}/postgres\" -c \"CREATE DATABASE $db\"" >>"$OUT/commands.txt"
    psql -q "$1" -c "CREATE DATABASE $db" >&2
    echo "${1%/*}/$db"
}
# Layouts: shared (one directory), unique (mdtest -u: one per client) and remote (-u -N: each
# client stats, reads and removes the files another client created, so no client's kernel
# cache holds them; with 2 and 4 clients).
flip=0
for layout in shared unique remote; do
    counts=(1 2 4)
    if [[ $layout == remote ]]; then
        counts=(2 4)
    fi
    for c in "${counts[@]}"; do
        engines=(sqlite postgresql)
        if [[ $flip == 1 ]]; then
            engines=(postgresql sqlite)
        fi
        flip=$((1 - flip))
        for e in "${engines[@]}"; do
            name=mdtest-$layout-c$c-$e
            extra=()
            case $layout in
                unique) extra=(-u) ;;
                remote) extra=(-u -N) ;;
            esac
            if [[ $e == postgresql ]]; then
                run "$name" --meta "$(new_db "$TIERFS_PG_URL" "${layout}_c$c")" \
                    mdtest --clients "$c" --tasks 1 -n "$ITEMS" "${extra[@]}"
            else
                run "$name" mdtest --clients "$c" --tasks 1 -n "$ITEMS" "${extra[@]}"
            fi
        done
    done
done

# What durability costs PostgreSQL: the same runs on a second server with fsync=off (the test
# servers' default: commits still write the WAL but do not wait for the disk).
out2=$(scripts/postgres-test-server.sh start)
PG2_DIR=$(sed -n 's/^TIERFS_PG_DIR=//p' <<<"$out2")
PG2_URL=$(sed -n 's/^TIERFS_PG_URL=//p' <<<"$out2")
echo "postgresql, fsync-off server: $(psql "$PG2_URL" -Atc "SELECT string_agg(name || '=' || current_setting(name), ', ' ORDER BY name) FROM pg_settings WHERE name IN ('fsync','synchronous_commit','full_page_writes')")" >>"$ENVF"
for c in 1 4; do
    run "mdtest-unique-c$c-postgresql-nofsync" --meta "$(new_db "$PG2_URL" "nofsync_c$c")" \
        mdtest --clients "$c" --tasks 1 -n "$ITEMS" -u
done
scripts/postgres-test-server.sh stop "$PG2_DIR"
PG2_DIR=

# Sequential throughput: the same two targets' worth of data, local directories vs S3 buckets.
Q="endpoint=$TIERFS_S3_ENDPOINT&region=$TIERFS_S3_REGION"
IOR=(ior --clients "$IOR_CLIENTS" --tasks 1 -t 1m -b "$IOR_BLOCK" -F -e)
run ior-local --targets 2 "${IOR[@]}"
# CPU time Garage uses during the S3 run (utime + stime of its process, in clock ticks).
garage_cpu() { awk '{print $14 + $15}' "/proc/$(cat "$S3_DIR/pid")/stat" 2>/dev/null || echo 0; }
g0=$(garage_cpu)
t0=$SECONDS
run ior-s3 --target-url "s3://tierfs-a/bench?$Q" --target-url "s3://tierfs-b/bench?$Q" "${IOR[@]}"
echo "garage: $(((($(garage_cpu) - g0) + 50) / 100)) CPU-s (of $(nproc) cores) during ior-s3, which took $((SECONDS - t0)) s including its native runs" >>"$ENVF"

{
    echo "load after: $(uptime)"
    echo "wall time: $(($(date +%s) - STARTED)) s"
    echo "choices: --reps $REPS; mdtest -n $ITEMS per client (one task per client), empty files;" \
        "IOR $IOR_CLIENTS clients x 1 task, -t 1m -b $IOR_BLOCK -F -e"
} >>"$ENVF"

# The tables, from the results.json files.
python3 - "$OUT" >"$OUT/summary.md" <<'EOF'
import json, os, sys
out = sys.argv[1]

def load(name):
    p = os.path.join(out, name, "results.json")
    if not os.path.exists(p):
        return None
    with open(p) as f:
        return json.load(f)

def fig(r, mode, test, metric):
    if r is None:
        return None, "no results"
    for row in r["rows"]:
        if row["mode"] == mode and row["test"] == test and row["metric"] == metric:
            if row["status"] == "ok":
                return row["summary"]["median"], None
            return None, row["status"].upper() + ": " + (row.get("error") or "")
    return None, "missing"

def num(v):
    if v is None:
        return "FAILED"
    return "{:,.0f}".format(v) if v >= 100 else "{:.1f}".format(v)

def ratio(a, b):
    return "{:.2f}x".format(a / b) if a is not None and b else "-"

env = open(os.path.join(out, "environment.txt")).read()
print("# Cluster mode (issue 5): results\n")
print("```\n" + env.strip() + "\n```\n")
problems = []
def completed(r):
    """Figures of the tierfs runs that completed, per rep (for a mode that failed in some rep)."""
    out = []
    for w in r["workloads"]:
        for smp in w["samples"]:
            if smp["mode"] == "tierfs" and smp["status"] == "ok":
                out.append("rep %d: %s" % (smp["rep"] + 1, ", ".join(
                    "%s %s" % (m["test"], num(m["value"])) for m in smp["measurements"])))
    return "; ".join(out) or "none"

for layout, title, counts in [
        ("shared", "one shared directory", (1, 2, 4)),
        ("unique", "one directory per client (mdtest -u)", (1, 2, 4)),
        ("remote", "one directory per client, stat/read/remove of another client's files (mdtest -u -N)", (2, 4))]:
    print("## mdtest, empty files, %s\n" % title)
    print("| clients | phase | SQLite ops/s | PostgreSQL ops/s | PostgreSQL/SQLite | tierfs/native, SQLite | tierfs/native, PostgreSQL |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for c in counts:
        rs = {e: load("mdtest-%s-c%d-%s" % (layout, c, e)) for e in ("sqlite", "postgresql")}
        for e, r in rs.items():
            if r is not None:
                if r.get("fs", {}).get("engine") != e:
                    problems.append("mdtest-%s-c%d-%s: engine recorded as %r" % (layout, c, e, r.get("fs", {}).get("engine")))
        for phase in ("create", "stat", "read", "remove"):
            s, se = fig(rs["sqlite"], "tierfs", phase, "ops")
            p, pe = fig(rs["postgresql"], "tierfs", phase, "ops")
            sn, _ = fig(rs["sqlite"], "native", phase, "ops")
            pn, _ = fig(rs["postgresql"], "native", phase, "ops")
            for name, err in (("sqlite", se), ("postgresql", pe)):
                if err and phase == "create":
                    problems.append("mdtest-%s-c%d-%s: %s (tierfs runs that completed: %s)" % (
                        layout, c, name, err, completed(rs[name]) if rs[name] else "none"))
            print("| %d | %s | %s | %s | %s | %s | %s |" % (c, phase, num(s), num(p), ratio(p, s), ratio(s, sn), ratio(p, pn)))
    print()

print("## What durability costs: PostgreSQL with fsync on (above) and off, one directory per client\n")
print("| clients | phase | fsync on ops/s | fsync off ops/s | on/off |")
print("|---:|---|---:|---:|---:|")
for c in (1, 4):
    on, off = load("mdtest-unique-c%d-postgresql" % c), load("mdtest-unique-c%d-postgresql-nofsync" % c)
    for phase in ("create", "stat", "read", "remove"):
        a, _ = fig(on, "tierfs", phase, "ops")
        b, be = fig(off, "tierfs", phase, "ops")
        if be and phase == "create":
            problems.append("mdtest-unique-c%d-postgresql-nofsync: %s" % (c, be))
        print("| %d | %s | %s | %s | %s |" % (c, phase, num(a), num(b), ratio(a, b)))
print()

print("## Sequential, IOR file per process, 1 MiB transfers, write (with fsync) then read\n")
print("| phase | local targets MiB/s | S3 targets MiB/s | S3/local | tierfs/native, local | tierfs/native, S3 | native MiB/s (local run / S3 run) |")
print("|---|---:|---:|---:|---:|---:|---:|")
rl, rs3 = load("ior-local"), load("ior-s3")
for phase in ("write", "read"):
    l, le = fig(rl, "tierfs", phase, "bw")
    s, se = fig(rs3, "tierfs", phase, "bw")
    ln, _ = fig(rl, "native", phase, "bw")
    sn, _ = fig(rs3, "native", phase, "bw")
    for name, err in (("ior-local", le), ("ior-s3", se)):
        if err:
            problems.append("%s %s: %s" % (name, phase, err))
    print("| %s | %s | %s | %s | %s | %s | %s / %s |" % (phase, num(l), num(s), ratio(s, l), ratio(l, ln), ratio(s, sn), num(ln), num(sn)))
for name, r in (("ior-local", rl), ("ior-s3", rs3)):
    if r is not None:
        print("\n%s: %s" % (name, r.get("fs", {}).get("engine", "?") + " metadata, " + str(len(r.get("fs", {}).get("targets", []))) + " " + r.get("fs", {}).get("target_kind", "?") + " targets"))
print()
if problems:
    print("## Failed runs\n")
    for p in problems:
        print("- " + p)
EOF

echo "+ commands:" >&2
grep '^+' "$OUT/commands.txt" >&2
cat "$OUT/summary.md"
if [[ ${#FAILED[@]} -gt 0 ]]; then
    log "runs with a failure: ${FAILED[*]} (see their run.log and report.md)"
fi
log "results in $OUT"
