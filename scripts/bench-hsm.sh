#!/usr/bin/env bash
# Issue 13 (HSM): archive and restore throughput of `tierfs agent` against `cp` of the same data
# between the same directories, in the same run, with cold caches; and 10,000 small files
# archived with `tierfs hsm archive --filelist`.
#
#   scripts/bench-hsm.sh [--size-mb N] [--files N] [--file-kb N] [--reps N] [--workdir DIR]
#                        [--no-build] [--keep-page-reporting]
#
# Defaults: --size-mb 1024, --files 10000, --file-kb 4, --reps 1, --workdir /var/tmp.
# Release build. Needs root (a FUSE mount; `echo 3 > /proc/sys/vm/drop_caches`).
#
# One filesystem (SQLite metadata, one local target directory T) mounted once (to write the
# data and name the files), archive 1 a local directory A on the same disk, one `tierfs agent`
# (--poll 0.1, --parallel 4). For each repetition, every timed step starts with
# `sync; echo 3 > /proc/sys/vm/drop_caches` and ends with `sync` (so each counts the bytes it
# made durable, not only those it left in the page cache):
#   cp-out:  cp -r of the file's objects, T/objects -> A/cp   (the reference for archive)
#   archive: `tierfs hsm archive F`, until `tierfs hsm state F` shows it archived
#   cp-in:   cp of the archive copy, A/<key> -> T/cp-in       (the reference for restore)
#   restore: `tierfs hsm release F` (not timed), then `tierfs hsm restore F`, until it is no
#            longer released
# (between repetitions the copy is removed and the file written again, so that each archive
# makes a new copy). Then --files files of --file-kb KiB each are written through the mount
# (not timed) and archived: `tierfs hsm archive --filelist L` (the queueing, timed alone), then
# until the queue is empty (files/s over both).
#
# Virtual machines: a guest with free page reporting (virtio-balloon) hands memory it frees
# back to the host about 2 s later, and the next write into such a page costs a host fault:
# on this project's 2-core VM a 1 GiB write into the page cache took 2.6 s on returned pages
# and 0.23 s on kept ones. Whichever step runs longer than 2 s after the drop_caches pays it,
# so the slower of two steps is penalised again. The script therefore turns page reporting off
# for its run (page_reporting_order above the largest order) and puts the old value back on
# exit; --keep-page-reporting leaves it alone.
#
# Prints one line per step (MiB/s, and the tierfs/cp ratio) and a summary; deletes everything
# it made on exit.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SIZE_MB=1024
FILES=10000
FILE_KB=4
REPS=1
WORKDIR=/var/tmp
BUILD=1
KEEP_REPORTING=0

usage() { sed -n '2,36p' "$0" | sed 's/^# \{0,1\}//'; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        --size-mb) SIZE_MB=$2; shift 2 ;;
        --files) FILES=$2; shift 2 ;;
        --file-kb) FILE_KB=$2; shift 2 ;;
        --reps) REPS=$2; shift 2 ;;
        --workdir) WORKDIR=$2; shift 2 ;;
        --no-build) BUILD=0; shift ;;
        --keep-page-reporting) KEEP_REPORTING=1; shift ;;
        -h | --help) usage; exit 0 ;;
        *) echo "bench-hsm: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done

if [[ $(id -u) != 0 ]]; then
    echo "bench-hsm: needs root (FUSE mount, drop_caches)" >&2
    exit 2
fi

TGT=${CARGO_TARGET_DIR:-$ROOT/target}
if [[ $BUILD == 1 ]]; then
    (cd "$ROOT" && cargo build --release --quiet -p tierfs-cli)
fi
T=$TGT/release/tierfs
[[ -x $T ]] || { echo "bench-hsm: no release build at $T" >&2; exit 2; }

W=$(mktemp -d "$WORKDIR/tierfs-bench-hsm.XXXXXX")
META="sqlite://$W/meta.db"
MNT=$W/mnt
AGENT_PID=
REPORTING=/sys/module/page_reporting/parameters/page_reporting_order
OLD_ORDER=
if [[ $KEEP_REPORTING == 0 && -w $REPORTING ]]; then
    OLD_ORDER=$(cat "$REPORTING")
    echo 11 >"$REPORTING"
    echo "bench-hsm: free page reporting off for the run (page_reporting_order $OLD_ORDER -> 11)"
fi
cleanup() {
    [[ -n $OLD_ORDER ]] && echo "$OLD_ORDER" >"$REPORTING"
    [[ -n $AGENT_PID ]] && kill "$AGENT_PID" 2>/dev/null && wait "$AGENT_PID" 2>/dev/null
    "$T" umount "$MNT" 2>/dev/null || true
    rm -rf "$W"
}
trap cleanup EXIT

mkdir -p "$W/t0" "$W/archive" "$MNT"
"$T" format --meta "$META" --target "file://$W/t0" >/dev/null
"$T" mount --meta "$META" "$MNT" --client-name bench --log-file "$W/mount.log"
"$T" hsm archive-add 1 "file://$W/archive" --mount "$MNT"
"$T" agent --meta "$META" --archive 1 --poll 0.1 --parallel 4 2>"$W/agent.log" &
AGENT_PID=$!

cold() { sync; echo 3 >/proc/sys/vm/drop_caches; }
now() { date +%s.%N; }
# seconds since $1
since() { echo "$(now) - $1" | bc -l; }
rate() { echo "scale=0; $SIZE_MB / $1" | bc -l; }
ratio() { echo "scale=2; $2 / $1" | bc -l; } # cp time / tierfs time = tierfs rate / cp rate
# waits (bounded: 30 min) until `tierfs hsm state $1` matches (grep -E) $2, or not with $3=not
wait_state() {
    local deadline=$(($(date +%s) + 1800)) st
    while :; do
        st=$("$T" hsm state "$1")
        if [[ ${3:-} == not ]]; then
            grep -qE "$2" <<<"$st" || return 0
        else
            grep -qE "$2" <<<"$st" && return 0
        fi
        grep -q . <<<"$("$T" hsm action "$1" | grep -E 'FAILED|CANCELED')" && {
            echo "bench-hsm: $("$T" hsm action "$1")" >&2
            exit 1
        }
        (($(date +%s) < deadline)) || { echo "bench-hsm: timed out: $st" >&2; exit 1; }
        sleep 0.05
    done
}

F=$MNT/big
echo "bench-hsm: $SIZE_MB MiB, $REPS repetition(s), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
declare -a SUM
for rep in $(seq 1 "$REPS"); do
    rm -f "$F"
    rm -rf "$W/archive/cp" "$W/t0/cp-in"
    head -c "${SIZE_MB}M" /dev/urandom >"$F"
    sync "$F"
    sum=$(md5sum <"$F" | cut -d' ' -f1)

    cold
    t0=$(now)
    cp -r "$W/t0/objects" "$W/archive/cp"
    sync
    cp_out=$(since "$t0")
    # (the target may still hold objects of an earlier repetition's file, waiting for the
    # trash: cp's time is scaled to the bytes of this file)
    cp_bytes=$(du -sb "$W/archive/cp" | cut -f1)
    cp_out=$(echo "$cp_out * $SIZE_MB * 1048576 / $cp_bytes" | bc -l)

    cold
    t0=$(now)
    "$T" hsm archive "$F"
    wait_state "$F" ' archived'
    sync
    archive=$(since "$t0")
    # the copy's key: <inode as 16 hex digits>/v<version>.r<request> (the only copy)
    key=$(cd "$W/archive" && ls -t ./0*/* | head -1)

    cold
    t0=$(now)
    mkdir -p "$W/t0/cp-in"
    cp "$W/archive/$key" "$W/t0/cp-in/"
    sync
    cp_in=$(since "$t0")

    # (refused while the file is open anywhere: closes reach the engine in batches)
    for _ in $(seq 100); do "$T" hsm release "$F" 2>/dev/null && break; sleep 0.1; done
    "$T" hsm state "$F" | grep -q released || { echo "bench-hsm: release refused" >&2; exit 1; }
    cold
    t0=$(now)
    "$T" hsm restore "$F"
    wait_state "$F" 'released' not
    sync
    restore=$(since "$t0")
    [[ $(md5sum <"$F" | cut -d' ' -f1) == "$sum" ]] || { echo "bench-hsm: restored data differs" >&2; exit 1; }

    printf 'rep %d: archive %s MiB/s vs cp-out %s MiB/s (%sx); restore %s MiB/s vs cp-in %s MiB/s (%sx)\n' \
        "$rep" "$(rate "$archive")" "$(rate "$cp_out")" "$(ratio "$archive" "$cp_out")" \
        "$(rate "$restore")" "$(rate "$cp_in")" "$(ratio "$restore" "$cp_in")"
    SUM+=("$archive $cp_out $restore $cp_in")
    # the next repetition archives a new copy
    "$T" hsm remove "$F" >/dev/null
    wait_state "$F" ' archived' not
done

# Small files.
if [[ $FILES -gt 0 ]]; then
    mkdir -p "$MNT/small"
    python3 - "$MNT/small" "$FILES" "$FILE_KB" <<'EOF'
import os, sys
d, n, kb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(n):
    sub = os.path.join(d, "%03d" % (i // 1000))
    os.makedirs(sub, exist_ok=True)
    with open(os.path.join(sub, "f%05d" % i), "wb") as f:
        f.write(os.urandom(kb * 1024))
EOF
    find "$MNT/small" -type f >"$W/list"
    # closes reach the engine in batches: wait until none of the files is open (release is
    # refused while open; archive is not, but its data version must be final)
    sleep 3
    cold
    t0=$(now)
    "$T" hsm archive --filelist "$W/list"
    queued=$(since "$t0")
    deadline=$(($(date +%s) + 1800))
    while [[ -n $("$T" hsm list --mount "$MNT" --limit 1 | tail -n +2) ]]; do
        (($(date +%s) < deadline)) || { echo "bench-hsm: small files not archived in 30 min" >&2; exit 1; }
        sleep 0.2
    done
    sync
    total=$(since "$t0")
    n_arch=$(sed -n '1,200p' "$W/list" | xargs "$T" hsm state | grep -c ' archived' || true)
    [[ $n_arch == $(sed -n '1,200p' "$W/list" | wc -l) ]] || { echo "bench-hsm: some small files are not archived" >&2; exit 1; }
    printf 'small files: %d x %d KiB: queued in %.1f s (%.0f files/s); all archived in %.1f s (%.0f files/s)\n' \
        "$FILES" "$FILE_KB" "$queued" "$(echo "$FILES / $queued" | bc -l)" "$total" "$(echo "$FILES / $total" | bc -l)"
fi
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
