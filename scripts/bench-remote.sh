#!/usr/bin/env bash
# Issue 15: the seeds' experiments in the seeds' conditions. The capacity tier (PostgreSQL for
# metadata, Garage S3 for data) runs on a server host across a shaped link; the clients mount
# from client hosts; the cache directory (PCC modes) stays on this machine's local disk.
# Hosts are network namespaces (scripts/netns-hosts.sh, shared with scripts/cluster-test.sh);
# `tierfs bench --remote PROFILE` shapes the links, checks the shaping (a raw round trip and a
# raw transfer) before any figure, and records profile, check and machine in its report.
#
#   scripts/bench-remote.sh [--profile 1gbe|ib|wan] [--out DIR] [--reps N] [--modes LIST]
#                           [--set seeds|quick|fio-grid|multi] [--no-build] [--pg-statements]
#                           [-- WORKLOAD ARGS...]
#
# Without a workload after `--`, runs the set: filebench fileserver (128 KiB files), webserver
# (64 KiB), varmail (32 KiB), and fio 4 KiB O_DIRECT random write at QD1, each in the modes
# native, tierfs, tierfs+rw-pcc, tierfs+ro-pcc (--set quick: fewer files, shorter runs;
# --set fio-grid: fio 1 MiB sequential and 4 KiB random, O_DIRECT, QD 1 and 32, 128 MiB, 5 s;
# --set multi: seed 000's multi-client runs, IOR -F -e --direct on 2 and 3 clients with and
# without -C (1 task per client, -t 1m -b 128m), and mdtest 32 KiB files on 4 clients, -u,
# 300 files per client). Each client mounts on a host of its own (tfc1..tfc4, 4 links shaped).
# Defaults: --profile 1gbe, --out docs/bench-results/remote-PROFILE, --reps 1.
# --pg-statements: PostgreSQL logs every statement (log_statement = all), and each run's
# statements are counted by text into OUT/NAME.statements.txt, its errors into
# OUT/NAME.errors.txt (what the engine asks per operation; logging costs the server time, so
# take figures from runs without it).
#
# Checks first, one line each and exit 2: not root, no ip/nsenter/tc, no rights to make network
# namespaces, an unknown profile, servers that do not come up. At the end it checks that
# nothing is left: each run's S3 objects are removed (and counted), its database dropped; then
# no mounts under the work dir, no namespaces and no server data dirs may remain.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PROFILE=1gbe
OUT=
REPS=1
MODES=native,tierfs,tierfs+rw-pcc,tierfs+ro-pcc
SET=seeds
BUILD=1
PG_STATEMENTS=0
WORKLOAD=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --profile) PROFILE=$2; shift 2 ;;
        --out) OUT=$(realpath -m "$2"); shift 2 ;;
        --reps) REPS=$2; shift 2 ;;
        --modes) MODES=$2; shift 2 ;;
        --set) SET=$2; shift 2 ;;
        --no-build) BUILD=0; shift ;;
        --pg-statements) PG_STATEMENTS=1; shift ;;
        --) shift; WORKLOAD=("$@"); break ;;
        -h | --help) sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "bench-remote: unknown option $1 (see --help)"; exit 2 ;;
    esac
done
OUT=${OUT:-$ROOT/docs/bench-results/remote-$PROFILE}
log() { echo "bench-remote [$(date +%T)] $*" >&2; }

# four client hosts: the multi-client runs put each client on a link of its own
CLIENT_HOSTS=4
# shellcheck source=scripts/netns-hosts.sh
source "$ROOT/scripts/netns-hosts.sh"
hosts_preflight bench-remote
command -v tc >/dev/null 2>&1 || { echo "bench-remote: tc (iproute2) is not installed: it shapes the links"; exit 2; }
case $SET in seeds | quick | fio-grid | multi) ;; *) echo "bench-remote: --set $SET: expected seeds, quick, fio-grid or multi"; exit 2 ;; esac

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
TIERFS=$CARGO_TARGET_DIR/release/tierfs
if [[ $BUILD == 1 ]]; then
    log "cargo build --release -p tierfs-cli"
    cargo build -q --release -p tierfs-cli
fi
[[ -x $TIERFS ]] || { echo "bench-remote: $TIERFS is missing (build it, or drop --no-build)"; exit 2; }
# The profile's name is checked by tierfs itself (one list of profiles).
DESC=$("$TIERFS" bench profile "$PROFILE" 2>&1) || { echo "bench-remote: ${DESC#tierfs: }"; exit 2; }

WORKDIR=$(mktemp -d /var/tmp/tierfs-remote.XXXXXX)
RUNS=()
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    set +e
    for m in $(awk -v w="$WORKDIR/" 'index($2, w) == 1 {print $2}' /proc/mounts); do
        "$TIERFS" umount "$m" >/dev/null 2>&1 || umount -l "$m"
    done
    hosts_down
    rm -rf "$WORKDIR"
    left=$(hosts_leftovers; awk -v w="$WORKDIR/" 'index($2, w) == 1 {print "mount " $2}' /proc/mounts)
    if [[ -n $left ]]; then
        log "LEFT BEHIND: $left"
        [[ -n $OUT && -d $OUT ]] && echo "left behind: $left" >>"$OUT/leftovers.txt"
        rc=1
    else
        log "nothing left behind: no namespaces, no mounts under the work dir, server data dirs removed"
        [[ -d $OUT ]] && echo "after teardown: no namespaces, no mounts under the work dir, PostgreSQL and Garage data dirs removed" >>"$OUT/leftovers.txt"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "hosts: $SRV (servers), ${CLIENTS[*]} (clients); profile $DESC"
hosts_up
if ! servers_up >"$WORKDIR/servers.log" 2>&1; then
    echo "bench-remote: the servers did not come up on $SRV: $(tail -n 1 "$WORKDIR/servers.log")"
    exit 2
fi
PG_BASE=${PG_URL%/*}
if [[ $PG_STATEMENTS == 1 ]]; then
    psql -q "$PG_BASE/postgres" -c "ALTER SYSTEM SET log_statement = 'all'" \
        -c "ALTER SYSTEM SET log_line_prefix = 'db=%d '" -c "SELECT pg_reload_conf()" >/dev/null
fi
mkdir -p "$OUT"
: >"$OUT/leftovers.txt"
{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "git: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates 2>/dev/null || echo ' (crates/ has uncommitted changes)')"
    echo "profile: $DESC"
    echo "servers: PostgreSQL $(psql "$PG_BASE/postgres" -Atc 'SHOW server_version'), Garage S3 at $S3_ENDPOINT, both on $SRV"
    echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo), kernel $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "work dir (native runs, cache dirs): $(df --output=source,fstype "$WORKDIR" | tail -n 1 | tr -s ' ')"
} >"$OUT/environment.txt"

# S3 requests without a body, signed with the store's key (curl's SigV4; Garage wants the
# payload's hash, here the empty one's, and the query's slashes encoded), from this host.
s3() { # s3 METHOD PATH-AND-QUERY
    local id secret empty=e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855
    id=$(sed -n 's/^access_key_id = "\(.*\)"/\1/p' "$TIERFS_S3_CREDENTIALS")
    secret=$(sed -n 's/^secret_access_key = "\(.*\)"/\1/p' "$TIERFS_S3_CREDENTIALS")
    curl -sf -X "$1" -H "x-amz-content-sha256: $empty" --aws-sigv4 "aws:amz:garage:s3" \
        --user "$id:$secret" "$S3_ENDPOINT/$2"
}
s3_keys() { # s3_keys BUCKET PREFIX: up to 1000 keys under PREFIX/; fails if the listing does
    local xml
    xml=$(s3 GET "$1?list-type=2&max-keys=1000&prefix=${2//\//%2F}%2F") || return 1
    grep -o '<Key>[^<]*</Key>' <<<"$xml" | sed 's|<Key>\(.*\)</Key>|\1|' || true
}
# s3_remove PREFIX: removes every object under PREFIX/ in both buckets; prints how many.
s3_remove() {
    local b k n=0 before keys
    for b in tierfs-a tierfs-b; do
        while keys=$(s3_keys "$b" "$1") && [[ -n $keys ]]; do
            before=$n
            while IFS= read -r k; do
                s3 DELETE "$b/$k" >/dev/null && n=$((n + 1))
            done <<<"$keys"
            [[ $n -gt $before ]] || break # nothing could be removed: counted as left below
        done
    done
    echo "$n"
}

# run NAME WORKLOAD...: one `tierfs bench --remote` run with its own database and S3 prefix.
n=0
run() {
    local name=$1
    shift
    n=$((n + 1))
    local db="bench_$n"
    psql -q "$PG_BASE/postgres" -c "CREATE DATABASE $db"
    RUNS+=("$db")
    local q="endpoint=$S3_ENDPOINT&region=garage"
    local cmd=("$TIERFS" bench --remote "$PROFILE" --modes "$MODES" --reps "$REPS" --no-progress
        --server-netns "$SRV" --client-netns "$(IFS=,; echo "${CLIENTS[*]}")"
        --workdir "$WORKDIR" --out "$OUT/$name" --meta "$PG_BASE/$db"
        --target-url "s3://tierfs-a/$name?$q" --target-url "s3://tierfs-b/$name?$q" "$@")
    echo "+ ${cmd[*]/#$TIERFS/tierfs}" | tee -a "$OUT/commands.txt" >&2
    local rc=0
    "${cmd[@]}" >"$OUT/$name.log" 2>&1 || rc=$?
    log "$name: exit $rc"
    grep -E '^tierfs bench: (network|shaping)' "$OUT/$name.log" >&2 || true
    [[ $rc -eq 0 ]] || tail -n 3 "$OUT/$name.log" >&2
    # What the run left on the servers, removed here: its database and the objects under its
    # S3 prefixes; and how many transactions its database committed (all its modes together).
    local rows objs left xacts dropped=dropped
    rows=$(psql "$PG_BASE/$db" -Atc "SELECT count(*) FROM inodes" 2>/dev/null || echo "?")
    xacts=$(psql "$PG_BASE/postgres" -Atc "SELECT xact_commit FROM pg_stat_database WHERE datname = '$db'" 2>/dev/null || echo "?")
    objs=$(s3_remove "$name")
    left=$( (s3_keys tierfs-a "$name" && s3_keys tierfs-b "$name") | wc -l) ||
        left="? (the listing failed)"
    # (the pipeline's status is wc's; a failed listing shows as set -o pipefail's failure)
    # WITH (FORCE): a client's connection may still be closing after its unmount.
    psql -q "$PG_BASE/postgres" -c "DROP DATABASE $db WITH (FORCE)" || dropped="NOT dropped"
    if [[ $PG_STATEMENTS == 1 ]]; then
        # every statement the run's database ran, counted by text (parameters are $n)
        grep -a "^db=$db LOG:  \(statement\|execute [^:]*\): " "$PG_DIR/server.log" |
            sed 's/^db=[^ ]* LOG:  \(statement\|execute [^:]*\): //' | sort | uniq -c | sort -rn \
            >"$OUT/$name.statements.txt" || true
        # and the errors it met (a transaction that fails is rolled back: conflicts retry)
        # (each error, then the statement it failed in)
        grep -a "^db=$db \(ERROR\|STATEMENT\):  " "$PG_DIR/server.log" |
            sed 's/^db=[^ ]* \(ERROR\|STATEMENT\):  /\1: /' | sort | uniq -c | sort -rn \
            >"$OUT/$name.errors.txt" || true
    fi
    echo "$name: after the run, $rows inode rows in its database ($dropped; $xacts transactions committed in it); $objs S3 objects under its prefixes, removed ($left left)" >>"$OUT/leftovers.txt"
    return $rc
}

: >"$OUT/commands.txt"
if [[ ${#WORKLOAD[@]} -gt 0 ]]; then
    run custom "${WORKLOAD[@]}"
else
    if [[ $SET == quick ]]; then F=(--files 200 --duration 10s); FIO=(--size 64m --runtime 5s)
    else F=(--files 1000 --duration 30s); FIO=(--size 256m --runtime 15s); fi
    fails=0
    if [[ $SET == fio-grid ]]; then
        # seed 000's grid, O_DIRECT libaio: 1 MiB sequential and 4 KiB random, QD 1 and 32
        for j in "seq-write 1m 1" "seq-read 1m 1" "seq-read 1m 32" "rand-read 4k 1" \
            "rand-read 4k 32" "rand-write 4k 32"; do
            set -- $j
            run "fio-$1-$2-qd$3" fio --job "$1" --bs "$2" --iodepth "$3" --direct \
                --size 128m --runtime 5s || fails=$((fails + 1))
        done
        [[ $fails -eq 0 ]] || { log "$fails run(s) failed"; exit 1; }
        log "results in $OUT"
        exit 0
    fi
    if [[ $SET == multi ]]; then
        # seed 000's multi-client IOR (-F -C -e --posix.odirect on 2-3 clients; -C makes each
        # task read what a task on the next client wrote, the case that failed with Lustre
        # PCC), the same without -C, and mdtest 32 KiB files on 4 clients
        for c in 2 3; do
            for r in -C ""; do
                run "ior-${c}c-F${r:+-C}-e-direct" ior --clients "$c" --tasks 1 -t 1m -b 128m \
                    -F $r -e --direct || fails=$((fails + 1))
            done
        done
        run mdtest-32k-4c mdtest --clients 4 --tasks 1 -n 300 -w 32k -u || fails=$((fails + 1))
        [[ $fails -eq 0 ]] || { log "$fails run(s) failed"; exit 1; }
        log "results in $OUT"
        exit 0
    fi
    for p in fileserver webserver varmail; do
        run "filebench-$p" filebench "$p" "${F[@]}" || fails=$((fails + 1))
    done
    run fio-4k-randwrite-qd1 fio --job rand-write --bs 4k --iodepth 1 --direct "${FIO[@]}" || fails=$((fails + 1))
    [[ $fails -eq 0 ]] || { log "$fails run(s) failed"; exit 1; }
fi
log "results in $OUT"
