#!/usr/bin/env bash
# The multi-host test: tierfs across hosts made of network namespaces on this machine.
#
# The hosts (tfsrv with PostgreSQL and Garage, client hosts tfc1 and tfc2, this host as
# 198.18.0.254) are made by scripts/netns-hosts.sh, which scripts/bench-remote.sh shares.
# Only the network is separate: a FUSE mount made by a daemon in tfc1 is visible here, so tests read and write it
# directly while the daemon talks to the servers over tfc1's network.
#
# 1. The multi-client integration tests (crates/tierfs-cli/tests/multiclient.rs) run in cluster
#    mode: each test gets a fresh PostgreSQL database and S3 prefixes, and client k mounts from
#    tfc1 or tfc2.
# 2. A fault scenario: two clients write files with fsync while the database is killed and
#    restarted, one client daemon is killed (kill -9) and mounted again, and the S3 store is
#    killed and restarted. Every file whose fsync and close succeeded (acknowledged) must then
#    read back with the same SHA-256 on both clients.
#
# Run as root. Installs what it needs (iproute2, PostgreSQL, Garage from crates.io). Tears
# everything down on exit, also on failure. CLUSTER_TEST_KEEP=1 keeps the work directory;
# CLUSTER_TEST_ARGS adds arguments for the test binary (e.g. a name filter while debugging).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TIERFS=${CARGO_TARGET_DIR:-$ROOT/target}/debug/tierfs

[[ $(id -u) -eq 0 ]] || { echo "cluster-test: must run as root (network namespaces, FUSE)"; exit 1; }
command -v ip >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 >/dev/null; }
# shellcheck source=scripts/netns-hosts.sh
source "$ROOT/scripts/netns-hosts.sh"
hosts_preflight cluster-test

WORK=$(mktemp -d /tmp/tierfs-cluster.XXXXXX)
chmod 755 "$WORK"
WRITERS=()
PHASE="setup"

log() { echo "cluster-test [$(date +%T)] $*"; }

teardown() {
    local rc=$?
    set +e
    [[ $rc -ne 0 ]] && log "FAILED during: $PHASE (exit $rc)"
    for p in "${WRITERS[@]}"; do kill "$p" 2>/dev/null; done
    for m in $(awk -v w="$WORK/" 'index($2, w) == 1 {print $2}' /proc/mounts); do
        "$TIERFS" umount "$m" >/dev/null 2>&1 || fusermount3 -uz "$m" 2>/dev/null
    done
    pkill -9 -f "tierfs mount --meta postgres://tierfs@$NET" 2>/dev/null
    hosts_down
    if [[ $rc -ne 0 ]]; then
        for f in "$WORK"/*.log; do
            [[ -f "$f" ]] && { echo "--- last lines of $f"; tail -n 15 "$f"; }
        done
    fi
    [[ "${CLUSTER_TEST_KEEP:-0}" == 1 ]] || rm -rf "$WORK"
    exit $rc
}
trap teardown EXIT
trap 'exit 130' INT TERM

# ------------------------------------------------------------------ hosts
PHASE="network namespaces"
hosts_up

# ------------------------------------------------------------------ servers
PHASE="PostgreSQL and Garage (S3) on $SRV"
servers_up

PHASE="build"
cargo build -q -p tierfs-cli

# ------------------------------------------------------------------ 1. integration tests
PHASE="multi-client integration tests across hosts"
log "running the multi-client integration tests with clients on ${CLIENTS[*]}"
# The harness connects to the admin URL itself (no PGPASSWORD there), so it carries the
# password; the per-test URLs it hands to tierfs do not.
admin=${PG_URL/tierfs@/tierfs:$PGPASSWORD@}
TIERFS_IT_PG_ADMIN=$admin TIERFS_IT_S3_ENDPOINT=$S3_ENDPOINT TIERFS_IT_S3_BUCKET=tierfs-a \
    TIERFS_IT_S3_REGION=garage TIERFS_IT_NETNS=$(IFS=,; echo "${CLIENTS[*]}") \
    timeout 20m cargo test -q -p tierfs-cli --test multiclient -- --test-threads=2 \
    ${CLUSTER_TEST_ARGS:-}

# ------------------------------------------------------------------ 2. faults
PHASE="fault scenario: format and mount"
DB=tierfs_cluster
psql "${PG_URL%/*}/postgres" -q -v ON_ERROR_STOP=1 -c "CREATE DATABASE $DB" >/dev/null
META="${PG_URL%/*}/$DB"
"$TIERFS" format --meta "$META" --target s3://tierfs-a/cluster/ost0 \
    --target s3://tierfs-b/cluster/ost1 --s3-endpoint "$S3_ENDPOINT" --s3-region garage \
    --stripe-count 2 cluster
# The first client takes the database password from PGPASSWORD, the second from a password
# file (~/.pgpass format, mode 0600), as deployments do.
pg_hostport=${PG_URL#*@}
pg_hostport=${pg_hostport%%/*}
(umask 077 && echo "${pg_hostport%:*}:${pg_hostport#*:}:$DB:tierfs:$PGPASSWORD" >"$WORK/pgpass")
# Short sessions, so that the database outage below outlasts them: no client may take another
# for dead because nobody could heartbeat while the database was away.
printf 'heartbeat_secs = 1\nsession_timeout_secs = 4\n' >"$WORK/client.toml"
mount_client() { # mount_client INDEX
    local c=${CLIENTS[$1]}
    local auth=(env)
    [[ $1 -eq 1 ]] && auth=(env -u PGPASSWORD PGPASSFILE="$WORK/pgpass")
    mkdir "$WORK/mnt-$c" 2>/dev/null || true # (a dead mount point after a kill cannot be stat-ed)
    in_ns "$c" "${auth[@]}" "$TIERFS" mount --meta "$META" "$WORK/mnt-$c" --client-name "$c" \
        --attr-ttl 0.5 --log-file "$WORK/$c-daemon.log" --config "$WORK/client.toml"
}
mount_client 0
mount_client 1
"$TIERFS" status --meta "$META" | tee "$WORK/status.txt" | sed 's/^/  /'
grep -q "2 mounted" "$WORK/status.txt"
if grep -q "$PGPASSWORD" "$WORK/status.txt" "$WORK"/*.log; then
    echo "the database password appears in status or a daemon log"
    exit 1
fi
secret=$(sed -n 's/^secret_access_key = "\(.*\)"/\1/p' "$TIERFS_S3_CREDENTIALS")
if grep -rq "$secret" "$WORK/status.txt" "$WORK"/*.log "$WORK"/mnt-*/.tierfs-info; then
    echo "the S3 secret key appears in status, a daemon log or a mount's info file"
    exit 1
fi

PHASE="fault scenario: writers"
for c in "${CLIENTS[@]}"; do
    python3 "$ROOT/scripts/acked-writer.py" write "$WORK/mnt-$c/w-$c" "$WORK/acked-$c.txt" \
        "$WORK/stop" >"$WORK/writer-$c.log" 2>&1 &
    WRITERS+=($!)
done
sleep 4
PHASE="fault scenario: database killed and restarted"
log "killing PostgreSQL for longer than a client session lasts"
"$ROOT/scripts/postgres-test-server.sh" down "$PG_DIR"
sleep 7
in_ns "$SRV" "$ROOT/scripts/postgres-test-server.sh" up "$PG_DIR"
log "PostgreSQL is back"
sleep 6
status=$("$TIERFS" status --meta "$META")
grep -q "2 mounted" <<<"$status" || {
    echo "after the outage both clients must still have their sessions:"
    echo "$status"
    exit 1
}
PHASE="fault scenario: client killed and mounted again"
pid=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["pid"])' "$WORK/mnt-${CLIENTS[0]}/.tierfs-info")
log "kill -9 of ${CLIENTS[0]}'s daemon (pid $pid)"
kill -9 "$pid"
sleep 1
mount_client 0
log "${CLIENTS[0]} mounted again"
sleep 4
PHASE="fault scenario: S3 store killed and restarted"
log "killing Garage"
"$ROOT/scripts/s3-test-server.sh" down "$S3_DIR"
sleep 2
in_ns "$SRV" "$ROOT/scripts/s3-test-server.sh" up "$S3_DIR"
log "Garage is back"
sleep 4
touch "$WORK/stop"
for p in "${WRITERS[@]}"; do wait "$p"; done
WRITERS=()

PHASE="fault scenario: verification"
for c in "${CLIENTS[@]}"; do
    sed 's/^/  /' "$WORK/writer-$c.log"
done
# Every acknowledged file, read through each client, after the kernel's caches are dropped.
sync
echo 3 >/proc/sys/vm/drop_caches
for via in "${CLIENTS[@]}"; do
    for c in "${CLIENTS[@]}"; do
        python3 "$ROOT/scripts/acked-writer.py" verify "$WORK/mnt-$via/w-$c" "$WORK/acked-$c.txt" \
            --min 5 | sed "s/^/  via $via: /"
    done
done
status=$("$TIERFS" status --meta "$META")
grep -q "2 mounted" <<<"$status" || { echo "expected 2 mounted clients:"; echo "$status"; exit 1; }
log "all acknowledged data survived: database restart, client kill -9, S3 restart"
PHASE="teardown"
echo "cluster test passed"
