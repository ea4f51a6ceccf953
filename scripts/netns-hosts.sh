# Sourced, not run: hosts made of network namespaces on this machine, and the servers on the
# server host. Used by scripts/cluster-test.sh and scripts/bench-remote.sh.
#
#   tfsrv  198.18.0.1   PostgreSQL (metadata) and Garage (S3 data), each a real server
#   tfc1   198.18.0.11  a client host: tierfs daemons mount from here
#   tfc2   198.18.0.12  another client host
#   tfcN   198.18.0.(10+N)  more client hosts when the caller sets CLIENT_HOSTS=N (1 to 8;
#                       default 2) before sourcing: scripts/bench-remote.sh makes 4, one per
#                       client of its multi-client runs, so no two clients share a link
#   (this host, 198.18.0.254, runs the test programs and sees every mount)
#
# The hosts are joined by a bridge inside tfsrv; client host C's link is a veth pair, `eth0` in
# C and `br-C` in tfsrv (the names `tierfs bench --remote` shapes). The addresses are in
# 198.18.0.0/15, the range set aside for network tests, and no packet leaves the machine.
#
# The caller sets ROOT (the repository) and defines log(); then:
#   hosts_preflight   one line and exit 2 unless root, ip, nsenter and namespace rights are here
#   hosts_up          makes the namespaces and links
#   servers_up        starts PostgreSQL and Garage on tfsrv; sets PG_URL, PG_DIR, PGPASSWORD,
#                     S3_ENDPOINT, S3_DIR, TIERFS_S3_CREDENTIALS (exported)
#   hosts_down        stops the servers (their data dirs are removed) and deletes the namespaces
#   hosts_leftovers   prints what is left of them (nothing, when all is well)

NET=198.18.0
SRV=tfsrv
CLIENTS=()
for ((i = 1; i <= ${CLIENT_HOSTS:-2}; i++)); do CLIENTS+=("tfc$i"); done
BR=tfbr0
PG_DIR="" S3_DIR=""

in_ns() { local ns=$1; shift; nsenter --net="/run/netns/$ns" -- "$@"; }

hosts_preflight() { # hosts_preflight NAME
    [[ ${#CLIENTS[@]} -ge 1 && ${#CLIENTS[@]} -le 8 ]] || { echo "$1: CLIENT_HOSTS=${CLIENT_HOSTS:-}: expected 1 to 8 client hosts"; exit 2; }
    [[ $(id -u) -eq 0 ]] || { echo "$1: must run as root (network namespaces, FUSE)"; exit 2; }
    command -v ip >/dev/null 2>&1 || { echo "$1: ip (iproute2) is not installed"; exit 2; }
    command -v nsenter >/dev/null 2>&1 || { echo "$1: nsenter (util-linux) is missing"; exit 2; }
    # One user of the hosts at a time: hosts_up deletes namespaces of these names, so a second
    # run (bench-remote.sh or cluster-test.sh) would tear down the first one's. The owner is the
    # shell whose pid is in the file while it lives (a pid file, not a lock on a descriptor,
    # which the servers and daemons it starts would inherit and keep).
    local owner_file=/run/tierfs-netns-hosts.pid owner
    owner=$(cat "$owner_file" 2>/dev/null || true)
    if [[ -n $owner && $owner != "$$" ]] && kill -0 "$owner" 2>/dev/null; then
        echo "$1: another run (pid $owner, $(tr '\0' ' ' < "/proc/$owner/cmdline" 2>/dev/null | cut -c1-80)) uses the test hosts"
        exit 2
    fi
    echo $$ > "$owner_file"
    local probe="tfprobe$$"
    if ! ip netns add "$probe" 2>/dev/null; then
        echo "$1: no rights to make network namespaces (ip netns add failed)"
        exit 2
    fi
    ip netns del "$probe"
}

hosts_up() {
    for ns in "$SRV" "${CLIENTS[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
    ip link del veth-host 2>/dev/null || true
    ip netns add "$SRV"
    ip -n "$SRV" link set lo up
    ip -n "$SRV" link add "$BR" type bridge
    ip -n "$SRV" addr add "$NET.1/24" dev "$BR"
    ip -n "$SRV" link set "$BR" up
    local i=11 c
    for c in "${CLIENTS[@]}"; do
        ip netns add "$c"
        ip -n "$c" link set lo up
        # the client's link: br-C on the bridge in the server host, eth0 in the client host
        ip link add "br-$c" netns "$SRV" type veth peer name eth0 netns "$c"
        ip -n "$SRV" link set "br-$c" master "$BR" up
        ip -n "$c" addr add "$NET.$i/24" dev eth0
        ip -n "$c" link set eth0 up
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
    bash -c "exec 3<>/dev/tcp/$NET.1/9" 2>/dev/null || true
}

servers_up() {
    local out
    PGPASSWORD=$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')
    export PGPASSWORD
    out=$(in_ns "$SRV" env PG_TEST_LISTEN="$NET.1" PG_TEST_REMOTE="$NET.0/24" \
        PG_TEST_PASSWORD="$PGPASSWORD" ${PG_TEST_DURABLE:+PG_TEST_DURABLE=$PG_TEST_DURABLE} \
        "$ROOT/scripts/postgres-test-server.sh" start)
    PG_URL=$(echo "$out" | sed -n 's/^TIERFS_PG_URL=//p')
    PG_DIR=$(echo "$out" | sed -n 's/^TIERFS_PG_DIR=//p')
    log "PostgreSQL at $PG_URL"
    out=$(in_ns "$SRV" env S3_TEST_LISTEN="$NET.1" "$ROOT/scripts/s3-test-server.sh" start)
    S3_ENDPOINT=$(echo "$out" | sed -n 's/^TIERFS_S3_ENDPOINT=//p')
    S3_DIR=$(echo "$out" | sed -n 's/^TIERFS_S3_DIR=//p')
    TIERFS_S3_CREDENTIALS=$(echo "$out" | sed -n 's/^TIERFS_S3_CREDENTIALS=//p')
    export TIERFS_S3_CREDENTIALS
    log "S3 (Garage) at $S3_ENDPOINT"
}

hosts_down() {
    [[ -n "$PG_DIR" ]] && "$ROOT/scripts/postgres-test-server.sh" stop "$PG_DIR" >/dev/null 2>&1
    [[ -n "$S3_DIR" ]] && "$ROOT/scripts/s3-test-server.sh" stop "$S3_DIR" >/dev/null 2>&1
    for ns in "$SRV" "${CLIENTS[@]}"; do ip netns del "$ns" 2>/dev/null; done
    ip link del "veth-host" 2>/dev/null
    return 0
}

hosts_leftovers() {
    local ns
    for ns in "$SRV" "${CLIENTS[@]}"; do
        [[ -e /run/netns/$ns ]] && echo "network namespace $ns"
    done
    ip link show veth-host >/dev/null 2>&1 && echo "link veth-host"
    [[ -n "$PG_DIR" && -e "$PG_DIR" ]] && echo "PostgreSQL data dir $PG_DIR"
    [[ -n "$S3_DIR" && -e "$S3_DIR" ]] && echo "Garage data dir $S3_DIR"
    return 0
}
