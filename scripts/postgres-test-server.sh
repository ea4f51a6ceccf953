#!/usr/bin/env bash
# A private PostgreSQL cluster for tests: loopback only, trust authentication, in a temporary
# directory, on a free port. Installs PostgreSQL from Debian packages when it is missing.
#
#   scripts/postgres-test-server.sh start      # prints TIERFS_PG_URL=... and TIERFS_PG_DIR=...
#   scripts/postgres-test-server.sh stop DIR   # stops the cluster started in DIR and removes it
#   scripts/postgres-test-server.sh down DIR   # stops it abruptly, keeping it (outage tests)
#   scripts/postgres-test-server.sh up DIR     # starts it again on the same port
#
# `eval "$(scripts/postgres-test-server.sh start)"` sets both variables in a shell.
# PG_TEST_LISTEN=ADDR listens there instead of 127.0.0.1 (the cluster test's server host);
# PG_TEST_REMOTE=CIDR with PG_TEST_PASSWORD=PW lets role tierfs in from CIDR with that password
# (scram-sha-256), while loopback stays trusted. The cluster
# runs with fsync off (it is thrown away; commits still write the WAL, so `down`, a crash of
# the server but not of the machine, loses nothing); PG_TEST_DURABLE=1 keeps PostgreSQL's
# defaults (for measurements). Exit status 3 means PostgreSQL is not installed and could not be.
set -euo pipefail

log() { echo "postgres-test-server: $*" >&2; }

find_bindir() {
    local d
    d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
    if [[ -n "$d" && -x "$d/initdb" && -x "$d/pg_ctl" ]]; then
        echo "$d"
        return 0
    fi
    if command -v pg_config >/dev/null 2>&1; then
        d=$(pg_config --bindir)
        if [[ -x "$d/initdb" && -x "$d/pg_ctl" ]]; then
            echo "$d"
            return 0
        fi
    fi
    return 1
}

install_postgres() {
    if ! command -v apt-get >/dev/null 2>&1 || [[ $(id -u) -ne 0 ]]; then
        log "PostgreSQL is not installed, and apt-get as root is not available to install it"
        return 1
    fi
    log "installing PostgreSQL from Debian packages"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -q postgresql >&2; then
        apt-get update -q >&2 || true
        apt-get install -y -q postgresql >&2 || return 1
    fi
}

# Runs a command as the cluster's owner: initdb and postgres refuse to run as root.
as_owner() {
    if [[ $(id -u) -eq 0 ]]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

LISTEN=${PG_TEST_LISTEN:-127.0.0.1}

port_free() {
    ! (exec 3<>"/dev/tcp/$LISTEN/$1") 2>/dev/null
}

start() {
    local bindir
    if ! bindir=$(find_bindir); then
        install_postgres || exit 3
        bindir=$(find_bindir) || { log "PostgreSQL installed but initdb not found"; exit 3; }
    fi
    if [[ $(id -u) -eq 0 ]] && ! id postgres >/dev/null 2>&1; then
        log "running as root needs the 'postgres' user (created by the Debian package)"
        exit 3
    fi
    local dir
    dir=$(mktemp -d /tmp/tierfs-pg.XXXXXX)
    chmod 755 "$dir"
    if [[ $(id -u) -eq 0 ]]; then
        chown postgres: "$dir"
    fi
    as_owner "$bindir/initdb" -D "$dir/data" -U tierfs -A trust -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 || {
        cat "$dir/initdb.log" >&2
        exit 1
    }
    if [[ -n "${PG_TEST_REMOTE:-}" ]]; then
        [[ -n "${PG_TEST_PASSWORD:-}" ]] || { log "PG_TEST_REMOTE needs PG_TEST_PASSWORD"; exit 2; }
        echo "host all all $PG_TEST_REMOTE scram-sha-256" >>"$dir/data/pg_hba.conf"
    fi
    local opts="-c listen_addresses=$LISTEN -k $dir -c max_connections=300 -c shared_buffers=64MB"
    if [[ "${PG_TEST_DURABLE:-0}" != 1 ]]; then
        opts="$opts -c fsync=off -c full_page_writes=off"
    fi
    local port tries=0
    while :; do
        port=$((20000 + RANDOM % 30000))
        tries=$((tries + 1))
        if port_free "$port" &&
            as_owner "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
                -o "$opts -p $port" start >"$dir/pg_ctl.log" 2>&1; then
            break
        fi
        if [[ $tries -ge 5 ]]; then
            cat "$dir/pg_ctl.log" "$dir/server.log" >&2 2>/dev/null || true
            as_owner "$bindir/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true
            rm -rf "$dir"
            log "could not start PostgreSQL"
            exit 1
        fi
    done
    echo "$bindir" >"$dir/bindir"
    echo "$opts -p $port" >"$dir/opts"
    if [[ -n "${PG_TEST_PASSWORD:-}" ]]; then
        as_owner "$bindir/psql" -h "$dir" -p "$port" -U tierfs -d postgres -q -v ON_ERROR_STOP=1 \
            -c "SET password_encryption = 'scram-sha-256'; ALTER ROLE tierfs PASSWORD '$PG_TEST_PASSWORD'" >/dev/null
    fi
    echo "TIERFS_PG_URL=postgres://tierfs@$LISTEN:$port/postgres"
    echo "TIERFS_PG_DIR=$dir"
}

stop() {
    local dir=${1:?usage: $0 stop DIR}
    [[ -d "$dir/data" ]] || { log "$dir holds no cluster"; exit 1; }
    local bindir
    bindir=$(cat "$dir/bindir" 2>/dev/null || find_bindir)
    as_owner "$bindir/pg_ctl" -D "$dir/data" -m fast -t 30 -w stop >/dev/null 2>&1 ||
        as_owner "$bindir/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true
    case "$dir" in
        /tmp/tierfs-pg.*) rm -rf "$dir" ;;
        *) log "not removing $dir (not a directory this script made)" ;;
    esac
}

down() {
    local dir=${1:?usage: $0 down DIR}
    as_owner "$(cat "$dir/bindir")/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null
}

up() {
    local dir=${1:?usage: $0 up DIR}
    as_owner "$(cat "$dir/bindir")/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
        -o "$(cat "$dir/opts")" start >/dev/null
}

case "${1:-}" in
    start) start ;;
    stop) stop "${2:-}" ;;
    down) down "${2:-}" ;;
    up) up "${2:-}" ;;
    *)
        echo "usage: $0 start | stop DIR | down DIR | up DIR" >&2
        exit 2
        ;;
esac
