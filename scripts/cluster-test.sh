#!/usr/bin/env bash
# The multi-host test: tierfs across hosts made of network namespaces on this machine.
#
#   tfsrv  198.18.0.1   PostgreSQL (metadata) and Garage (S3 data), each a real server
#   tfc1   198.18.0.11  a client host: tierfs daemons mount from here
#   tfc2   198.18.0.12  another client host
#   (this host, 198.18.0.254, runs the test programs and sees every mount)
#
# The hosts are joined by a bridge inside tfsrv; the addresses are in 198.18.0.0/15, the range
# set aside for network tests, and no packet leaves the machine. Only the network is
# separate: a FUSE mount made by a daemon in tfc1 is visible here, so tests read and write it
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
command -v nsenter >/dev/null 2>&1 || { echo "cluster-test: nsenter (util-linux) is missing"; exit 1; }

NET=198.18.0
SRV=tfsrv
CLIENTS=(tfc1 tfc2)
BR=tfbr0
WORK=$(mktemp -d /tmp/tierfs-cluster.XXXXXX)
chmod 755 "$WORK"
PG_DIR="" S3_DIR=""
WRITERS=()
PHASE="setup"

log() { echo "cluster-test [$(date +%T)] $*"; }
in_ns() { local ns=$1; shift; nsenter --net="/run/netns/$ns" -- "$@"; }

teardown() {
    local rc=$?
    set +e
    [[ $rc -ne 0 ]] && log "FAILED during: $PHASE (exit $rc)"
    for p in "${WRITERS[@]}"; do kill "$p" 2>/dev/null; done
    for m in $(awk -v w="$WORK/" 'index($2, w) == 1 {print $2}' /proc/mounts); do
        "$TIERFS" umount "$m" >/dev/null 2>&1 || fusermount3 -uz "$m" 2>/dev/null
    done
    pkill -9 -f "tierfs mount --meta postgres://tierfs@$NET" 2>/dev/null
    [[ -n "$PG_DIR" ]] && "$ROOT/scripts/postgres-test-server.sh" stop "$PG_DIR" >/dev/null 2>&1
    [[ -n "$S3_DIR" ]] && "$ROOT/scripts/s3-test-server.sh" stop "$S3_DIR" >/dev/null 2>&1
    for ns in "$SRV" "${CLIENTS[@]}"; do ip netns del "$ns" 2>/dev/null; done
    ip link del "veth-host" 2>/dev/null
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
for ns in "$SRV" "${CLIENTS[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
ip link del veth-host 2>/dev/null || true
ip netns add "$SRV"
ip -n "$SRV" link set lo up
ip -n "$SRV" link add "$BR" type bridge
ip -n "$SRV" addr add "$NET.1/24" dev "$BR"
ip -n "$SRV" link set "$BR" up
attach() { # attach NAME-IN-SRV PEER-NS PEER-NAME ADDR
    ip link add "$1" netns "$SRV" type veth peer name "$3" netns "$2"
    ip -n "$SRV" link set "$1" master "$BR" up
    ip -n "$2" addr add "$4/24" dev "$3"
    ip -n "$2" link set "$3" up
}
i=11
for c in "${CLIENTS[@]}"; do
    ip netns add "$c"
    ip -n "$c" link set lo up
    attach "br-$c" "$c" eth0 "$NET.$i"
    i=$((i + 1))
done
# this host joins as 198.18.0.254 (the test programs and the admin commands run here)
ip link add veth-host type veth peer name br-host netns "$SRV"
ip -n "$SRV" link set br-host master "$BR" up
ip addr add "$NET.254/24" dev veth-host
ip link set veth-host up
for c in "${CLIENTS[@]}"; do
    in_ns "$c" bash -c "exec 3<>/dev/tcp/$NET.1/9" 2>/dev/null || true # warm ARP
done
ping -c1 -W2 "$NET.1" >/dev/null 2>&1 || in_ns "${CLIENTS[0]}" true

# ------------------------------------------------------------------ servers
PHASE="PostgreSQL on $SRV"
PGPASSWORD=$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')
export PGPASSWORD
out=$(in_ns "$SRV" env PG_TEST_LISTEN="$NET.1" PG_TEST_REMOTE="$NET.0/24" \
    PG_TEST_PASSWORD="$PGPASSWORD" "$ROOT/scripts/postgres-test-server.sh" start)
PG_URL=$(echo "$out" | sed -n 's/^TIERFS_PG_URL=//p')
PG_DIR=$(echo "$out" | sed -n 's/^TIERFS_PG_DIR=//p')
log "PostgreSQL at $PG_URL"

PHASE="Garage (S3) on $SRV"
out=$(in_ns "$SRV" env S3_TEST_LISTEN="$NET.1" "$ROOT/scripts/s3-test-server.sh" start)
S3_ENDPOINT=$(echo "$out" | sed -n 's/^TIERFS_S3_ENDPOINT=//p')
S3_DIR=$(echo "$out" | sed -n 's/^TIERFS_S3_DIR=//p')
TIERFS_S3_CREDENTIALS=$(echo "$out" | sed -n 's/^TIERFS_S3_CREDENTIALS=//p')
export TIERFS_S3_CREDENTIALS
log "S3 (Garage) at $S3_ENDPOINT"

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
