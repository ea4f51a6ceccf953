#!/usr/bin/env bash
# A private S3-compatible store for tests: Garage (a real S3 server, built from crates.io with
# `cargo install` when missing), one node, in a temporary directory, on loopback by default.
#
#   scripts/s3-test-server.sh start      # prints TIERFS_S3_ENDPOINT=, TIERFS_S3_REGION=,
#                                         # TIERFS_S3_BUCKETS=, TIERFS_S3_CREDENTIALS=, TIERFS_S3_DIR=
#   scripts/s3-test-server.sh stop DIR   # stops the store started in DIR and removes it
#   scripts/s3-test-server.sh down DIR   # kills it abruptly, keeping its data (outage tests)
#   scripts/s3-test-server.sh up DIR     # starts it again on the same port
#   scripts/s3-test-server.sh install    # only builds and installs Garage
#
# `eval "$(scripts/s3-test-server.sh start)"` sets the variables in a shell. Two buckets,
# tierfs-a and tierfs-b, exist; one key may read and write both, and its credentials are in
# the file TIERFS_S3_CREDENTIALS (mode 0600, the format `tierfs --s3-credentials` reads).
# S3_TEST_LISTEN=ADDR listens there instead of 127.0.0.1 (the cluster test's server host).
# Exit status 3 means Garage is not installed and could not be built.
set -euo pipefail

GARAGE_VERSION=2.5.0
LISTEN=${S3_TEST_LISTEN:-127.0.0.1}

log() { echo "s3-test-server: $*" >&2; }

find_garage() {
    local g
    for g in "$(command -v garage 2>/dev/null || true)" "$HOME/.cargo/bin/garage"; do
        if [[ -n "$g" && -x "$g" ]] && "$g" --version 2>/dev/null | grep -q "$GARAGE_VERSION"; then
            echo "$g"
            return 0
        fi
    done
    return 1
}

install_garage() {
    command -v cargo >/dev/null 2>&1 || { log "cargo is needed to build Garage"; return 1; }
    log "building Garage $GARAGE_VERSION from crates.io (once; about 10 minutes on 2 cores)"
    # lmdb is Garage's recommended metadata engine; the metrics and K2V APIs are not needed.
    cargo install garage --version "$GARAGE_VERSION" --locked --quiet \
        --no-default-features --features bundled-libs,lmdb >&2
}

port_free() {
    ! (exec 3<>"/dev/tcp/$LISTEN/$1") 2>/dev/null
}

# garage CLI against the node of DIR
g() {
    local dir=$1
    shift
    "$(cat "$dir/garage-bin")" -c "$dir/garage.toml" "$@"
}

launch() {
    local dir=$1
    LISTEN=$(cat "$dir/listen")
    # New session, so the caller's job control or a test harness's process group does not
    # take it down; its pid is kept for stop/down.
    setsid "$(cat "$dir/garage-bin")" -c "$dir/garage.toml" server \
        >>"$dir/server.log" 2>&1 </dev/null &
    echo $! >"$dir/pid"
    local i
    for i in $(seq 1 300); do
        if g "$dir" status >/dev/null 2>&1 && ! port_free "$(cat "$dir/port")"; then
            return 0
        fi
        if ! kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
            grep -m 3 -i "panicked\|error" "$dir/server.log" >&2 || true
            tail -n 20 "$dir/server.log" >&2
            log "Garage exited while starting"
            return 1
        fi
        sleep 0.1
    done
    log "Garage did not answer within 30 s"
    return 1
}

start() {
    local bin
    if ! bin=$(find_garage); then
        install_garage || exit 3
        bin=$(find_garage) || { log "Garage installed but not found"; exit 3; }
    fi
    local dir
    dir=$(mktemp -d /tmp/tierfs-s3.XXXXXX)
    echo "$bin" >"$dir/garage-bin"
    # Ports below Linux's ephemeral range (32768-60999): a port picked there can be taken as
    # the source port of another connection between the check and Garage's bind (Garage then
    # panics while starting). A start that fails all the same is tried again on new ports.
    local port rpc admin tries attempt
    for attempt in 1 2 3; do
        tries=0
        while :; do
            port=$((20000 + RANDOM % 12000))
            rpc=$((port + 1))
            admin=$((port + 2))
            tries=$((tries + 1))
            if port_free "$port" && port_free "$rpc" && port_free "$admin"; then
                break
            fi
            [[ $tries -lt 20 ]] || { log "no free ports"; rm -rf "$dir"; exit 1; }
        done
        echo "$port" >"$dir/port"
        echo "$LISTEN" >"$dir/listen"
        umask 077
        cat >"$dir/garage.toml" <<EOF
metadata_dir = "$dir/meta"
data_dir = "$dir/data"
db_engine = "lmdb"
replication_factor = 1
metadata_fsync = false
data_fsync = false
rpc_bind_addr = "127.0.0.1:$rpc"
rpc_public_addr = "127.0.0.1:$rpc"
rpc_secret = "$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')"

[s3_api]
s3_region = "garage"
api_bind_addr = "$LISTEN:$port"
root_domain = ".s3.garage.localhost"

[admin]
api_bind_addr = "127.0.0.1:$admin"
EOF
        umask 022
        if launch "$dir"; then
            break
        fi
        kill "$(cat "$dir/pid" 2>/dev/null)" 2>/dev/null || true
        if [[ $attempt -eq 3 ]]; then
            rm -rf "$dir"
            exit 1
        fi
        log "start attempt $attempt failed; trying again on other ports"
        rm -rf "$dir/meta" "$dir/data"
        : >"$dir/server.log"
    done
    {
        local node
        node=$(g "$dir" node id -q 2>/dev/null | cut -d@ -f1)
        g "$dir" layout assign -z dc1 -c 10G "$node"
        g "$dir" layout apply --version 1
        local b
        for b in tierfs-a tierfs-b; do
            g "$dir" bucket create "$b"
        done
    } >"$dir/setup.log" 2>&1 || {
        cat "$dir/setup.log" >&2
        stop "$dir"
        exit 1
    }
    local out id secret
    out=$(g "$dir" key create tierfs-test 2>&1) || { echo "$out" >&2; stop "$dir"; exit 1; }
    id=$(echo "$out" | awk -F': *' '/Key ID/ {print $2; exit}' | tr -d ' ')
    secret=$(echo "$out" | awk -F': *' '/Secret key/ {print $2; exit}' | tr -d ' ')
    if [[ -z "$id" || -z "$secret" ]]; then
        log "could not read the new key from: $(echo "$out" | grep -v -i secret)"
        stop "$dir"
        exit 1
    fi
    for b in tierfs-a tierfs-b; do
        g "$dir" bucket allow --read --write --owner "$b" --key tierfs-test >>"$dir/setup.log" 2>&1 || {
            cat "$dir/setup.log" >&2
            stop "$dir"
            exit 1
        }
    done
    umask 077
    printf 'access_key_id = "%s"\nsecret_access_key = "%s"\n' "$id" "$secret" >"$dir/credentials.toml"
    umask 022
    echo "TIERFS_S3_ENDPOINT=http://$LISTEN:$port"
    echo "TIERFS_S3_REGION=garage"
    echo "TIERFS_S3_BUCKETS=tierfs-a,tierfs-b"
    echo "TIERFS_S3_CREDENTIALS=$dir/credentials.toml"
    echo "TIERFS_S3_DIR=$dir"
}

stop() {
    local dir=${1:?usage: $0 stop DIR}
    [[ -f "$dir/garage.toml" ]] || { log "$dir holds no store"; exit 1; }
    local pid
    pid=$(cat "$dir/pid" 2>/dev/null || true)
    if [[ -n "$pid" ]] && kill "$pid" 2>/dev/null; then
        for _ in $(seq 1 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -9 "$pid" 2>/dev/null || true
    fi
    case "$dir" in
        /tmp/tierfs-s3.*) rm -rf "$dir" ;;
        *) log "not removing $dir (not a directory this script made)" ;;
    esac
}

down() {
    local dir=${1:?usage: $0 down DIR}
    local pid
    pid=$(cat "$dir/pid")
    kill -9 "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
}

up() {
    local dir=${1:?usage: $0 up DIR}
    launch "$dir"
}

case "${1:-}" in
    start) start ;;
    stop) stop "${2:-}" ;;
    down) down "${2:-}" ;;
    up) up "${2:-}" ;;
    install) find_garage >/dev/null || install_garage || exit 3 ;;
    *)
        echo "usage: $0 start | stop DIR | down DIR | up DIR | install" >&2
        exit 2
        ;;
esac
