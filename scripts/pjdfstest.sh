#!/usr/bin/env bash
# POSIX conformance: the Rust pjdfstest (crates.io `pjdfstest`), the full suite, three times with
# the same configuration (same features, same dummy users):
#
#   local   a fresh directory on the local filesystem beneath (the reference: ext4 here)
#   tierfs  an uncached tierfs mount (SQLite metadata, two local file:// targets)
#   rwpcc   a tierfs mount with a persistent client cache and an `rw` rule matching every file,
#           so every file the suite creates lives in RW-PCC (served by passthrough)
#
# Prints per run `pjdfstest <kind>: N passed, M failed, K skipped` and the failing test names
# (a test that fails on the local filesystem too is listed but is not a tierfs failure), then a
# closing `pjdfstest: N passed, M failed` (sums over the three runs). Exits non-zero when a tierfs
# run passes fewer tests than the local run, or fails a test the local run passes.
#
# One test cannot run on any FUSE filesystem, so a tierfs run skips it where the local run
# passes it; it is listed as such and not counted against tierfs:
#   link::link_count_max  glibc's pathconf(_PC_LINK_MAX) knows no limit for FUSE's f_type and
#                         answers 127, which the suite takes for "unknown" (tierfs's own limit,
#                         EMLINK past 65000 links, is the metadata engines').
#
# Run as root (the suite switches users, chowns, makes device nodes). Installs pjdfstest with
# `cargo install --locked` when missing. Each run is bounded (PJDFSTEST_TIMEOUT seconds, default
# 300); mounts and scratch files are removed on every exit. PJDFSTEST_KEEP=1 keeps the work
# directory (logs, full outputs); PJDFSTEST_ARGS adds test-name patterns (while debugging).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PJD_VERSION=0.2.2
TIMEOUT=${PJDFSTEST_TIMEOUT:-300}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
TIERFS=${TIERFS_BIN:-$TARGET/debug/tierfs}

[[ $(id -u) -eq 0 ]] || { echo "pjdfstest: must run as root (the suite switches users)"; exit 1; }
export PATH="$HOME/.cargo/bin:$PATH"
if ! pjdfstest --version 2>/dev/null | grep -q " $PJD_VERSION\$"; then
    echo "pjdfstest: installing pjdfstest $PJD_VERSION (cargo install --locked)"
    cargo install pjdfstest --version "$PJD_VERSION" --locked --quiet
fi
if [[ -z ${TIERFS_BIN:-} ]]; then
    cargo build -q -p tierfs-cli
fi
[[ -x $TIERFS ]] || { echo "pjdfstest: no tierfs binary at $TIERFS"; exit 1; }
# The suite's second user and group: `tests` (created here when missing, as its README says).
if ! getent passwd tests >/dev/null; then
    getent group tests >/dev/null || groupadd --system tests
    useradd --system --no-create-home --gid tests --shell /usr/sbin/nologin tests
fi
NOBODY_GROUP=$(id -gn nobody)

WORK=$(mktemp -d /tmp/tierfs-pjdfstest.XXXXXX)
chmod 755 "$WORK"
SECONDARY=""
teardown() {
    local rc=$?
    set +e
    [[ -n $SECONDARY ]] && rm -rf "$SECONDARY"
    for m in $(awk -v w="$WORK/" 'index($2, w) == 1 {print $2}' /proc/mounts); do
        timeout 30 "$TIERFS" umount "$m" >/dev/null 2>&1 || fusermount3 -uz "$m" 2>/dev/null
    done
    if [[ $rc -ne 0 ]]; then
        for f in "$WORK"/*.log; do
            [[ -f $f ]] && { echo "--- last lines of $f"; tail -n 15 "$f"; }
        done
    fi
    [[ ${PJDFSTEST_KEEP:-0} == 1 ]] && echo "pjdfstest: work directory kept: $WORK" || rm -rf "$WORK"
    exit $rc
}
trap teardown EXIT
trap 'exit 130' INT TERM

cat >"$WORK/pjdfstest.toml" <<EOF
# The same features for every run: what Linux and ext4 have.
[features]
posix_fallocate = {}
utime_now = {}
utimensat = {}
rename_ctime = {}

[settings]
naptime = 0.01

[dummy_auth]
entries = [["nobody", "$NOBODY_GROUP"], ["tests", "tests"]]
EOF
# A distinct filesystem for the EXDEV tests.
SECONDARY=$(mktemp -d /dev/shm/tierfs-pjdfstest.XXXXXX)

FUSE_SKIPS="link::link_count_max"
declare -A PASSED FAILED SKIPPED FAILS SKIPS EXCUSED
run_suite() { # run_suite KIND DIR
    local kind=$1 dir=$2 out="$WORK/$1.out" start=$SECONDS rc=0
    # Every test runs in a scratch directory under DIR; the suite wants DIR writable by all.
    chmod 1777 "$dir"
    # shellcheck disable=SC2086
    (cd "$dir" && timeout "$TIMEOUT" pjdfstest -c "$WORK/pjdfstest.toml" -p "$dir" \
        -s "$SECONDARY" ${PJDFSTEST_ARGS:-}) >"$out" 2>&1 || rc=$?
    if [[ $rc -eq 124 ]]; then
        echo "pjdfstest $kind: did not finish within ${TIMEOUT}s"
        tail -n 5 "$out"
        exit 1
    fi
    local summary
    summary=$(grep -E '^Summary: ' "$out" | tail -n 1) || {
        echo "pjdfstest $kind: no summary (exit $rc):"
        tail -n 20 "$out"
        exit 1
    }
    # Summary: 0 failed, 15 skipped, 383 passed, 0 expected failures, 398 total
    PASSED[$kind]=$(sed -E 's/.* ([0-9]+) passed.*/\1/' <<<"$summary")
    FAILED[$kind]=$(sed -E 's/^Summary: ([0-9]+) failed.*/\1/' <<<"$summary")
    SKIPPED[$kind]=$(sed -E 's/.* ([0-9]+) skipped.*/\1/' <<<"$summary")
    FAILS[$kind]=$(awk '$NF == "FAILED" {print $1}' "$out" | sort)
    SKIPS[$kind]=$(awk '$NF == "skipped" {print $1}' "$out" | sort)
    echo "pjdfstest $kind: ${PASSED[$kind]} passed, ${FAILED[$kind]} failed, ${SKIPPED[$kind]} skipped ($((SECONDS - start)) s)"
    local t
    EXCUSED[$kind]=0
    for t in ${SKIPS[$kind]}; do
        [[ $kind != local ]] || break
        grep -qxF "$t" <<<"${SKIPS[local]}" && continue
        local why
        why=$(grep -A1 -E "^$t +skipped\$" "$out" | tail -n 1 | sed -E 's/^[[:space:]]+//')
        if grep -qxF "$t" <<<"${FUSE_SKIPS// /$'\n'}"; then
            echo "  SKIPPED $t (cannot run on FUSE: $why)"
            EXCUSED[$kind]=$((EXCUSED[$kind] + 1))
        else
            echo "  SKIPPED $t ($why; runs on the local filesystem)"
        fi
    done
    for t in ${FAILS[$kind]}; do
        if [[ $kind != local ]] && grep -qxF "$t" <<<"${FAILS[local]}"; then
            echo "  FAILED $t (fails on the local filesystem too)"
        else
            echo "  FAILED $t"
        fi
    done
}

mount_tierfs() { # mount_tierfs NAME MNT [mount options...]
    local name=$1 mnt=$2
    shift 2
    mkdir -p "$mnt"
    "$TIERFS" mount --meta "sqlite://$WORK/$name/meta.db" "$mnt" --client-name "$name" \
        --log-file "$WORK/$name.log" "$@" >/dev/null
}

format_tierfs() { # format_tierfs NAME
    mkdir -p "$WORK/$1"
    "$TIERFS" format --meta "sqlite://$WORK/$1/meta.db" --target "file://$WORK/$1/ost0" \
        --target "file://$WORK/$1/ost1" >/dev/null
}

# 1. the local filesystem beneath
mkdir -p "$WORK/local"
run_suite local "$WORK/local"

# 2. uncached tierfs
format_tierfs plain
mount_tierfs plain "$WORK/mnt-plain"
run_suite tierfs "$WORK/mnt-plain"
"$TIERFS" umount "$WORK/mnt-plain" >/dev/null

# 3. tierfs with every file in RW-PCC
format_tierfs pcc
"$TIERFS" pcc rule add --mode rw --meta "sqlite://$WORK/pcc/meta.db" "fname={*}" >/dev/null
mount_tierfs pcc "$WORK/mnt-pcc" --cache-dir "$WORK/pcc/cache" --cache-size 2G
# The rule really applies: a new file is RW-cached.
echo probe >"$WORK/mnt-pcc/.probe"
"$TIERFS" pcc state "$WORK/mnt-pcc/.probe" | grep -q "type: readwrite" || {
    echo "pjdfstest rwpcc: a new file is not in RW-PCC:"
    "$TIERFS" pcc state "$WORK/mnt-pcc/.probe"
    exit 1
}
rm -f "$WORK/mnt-pcc/.probe"
run_suite rwpcc "$WORK/mnt-pcc"
"$TIERFS" umount "$WORK/mnt-pcc" >/dev/null

total_passed=0 total_failed=0 status=0
for kind in local tierfs rwpcc; do
    total_passed=$((total_passed + PASSED[$kind]))
    total_failed=$((total_failed + FAILED[$kind]))
done
for kind in tierfs rwpcc; do
    if ((PASSED[$kind] + EXCUSED[$kind] < PASSED[local])); then
        echo "pjdfstest $kind: ${PASSED[$kind]} passed (+${EXCUSED[$kind]} that cannot run on FUSE), fewer than the local filesystem's ${PASSED[local]}"
        status=1
    fi
    for t in ${FAILS[$kind]}; do
        grep -qxF "$t" <<<"${FAILS[local]}" || status=1
    done
done
echo "pjdfstest: $total_passed passed, $total_failed failed"
exit $status
