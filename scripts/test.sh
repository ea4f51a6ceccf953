#!/usr/bin/env bash
# The whole test suite: formatting and lints, unit tests, the metadata-engine conformance suite
# (SQLite and a private PostgreSQL), S3 targets against a private Garage server, FUSE
# integration tests that mount real filesystems with several clients, the field's exercisers on
# real mounts (scripts/pjdfstest.sh, scripts/fsx-test.sh), kill -9 crash rounds
# (scripts/crash-test.sh), and the multi-host test
# (scripts/cluster-test.sh: network namespaces, PostgreSQL + S3, faults). Run as root (FUSE
# mounts, tests as other users, network namespaces). Installs what it needs first: Debian
# packages, PostgreSQL, and Garage (built from crates.io once, about 10 minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install-deps.sh
export CARGO_TERM_COLOR=never
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings
echo "== test servers"
./scripts/s3-test-server.sh install
mounts_before=$(awk '$1 ~ /^tierfs:/ {print $2}' /proc/mounts | sort)
echo "== cargo test"
# Every test bounds its own time; this bounds the whole run.
log=$(mktemp /tmp/tierfs-test-log.XXXXXX)
timeout 45m cargo test --workspace -- --test-threads="${TEST_THREADS:-4}" 2>&1 | tee "$log"
# No test may leave a mount behind.
left=$(comm -13 <(echo "$mounts_before") <(awk '$1 ~ /^tierfs:/ {print $2}' /proc/mounts | sort) | grep . || true)
if [ -n "$left" ]; then
  echo "error: tests left tierfs mounts behind: $left"
  exit 1
fi
# The exercisers and the crash rounds use the binary the tests just built.
export TIERFS_BIN="${CARGO_TARGET_DIR:-$PWD/target}/debug/tierfs" TIERFS="${CARGO_TARGET_DIR:-$PWD/target}/debug/tierfs"
echo "== pjdfstest (the full Rust suite: local filesystem, uncached mount, all-RW-PCC mount)"
timeout 15m ./scripts/pjdfstest.sh 2>&1 | tee -a "$log"
# fsx runs on a release build: a debug daemon manages about 75 operations a second under fsx.
# 1,000,000 operations per mount kind (issue 10's bar), each kind as consecutive fsx processes
# of 25,000 operations (scripts/fsx-test.sh says why: fsx-rs's time per process grows with the
# square of its operations).
echo "== fsx (${FSX_OPS:-1000000} operations each: uncached, RW-PCC, uncached with a second client reading)"
cargo build --release -q -p tierfs-cli
TIERFS_BIN="${CARGO_TARGET_DIR:-$PWD/target}/release/tierfs" FSX_OPS=${FSX_OPS:-1000000} FSX_TIMEOUT=${FSX_TIMEOUT:-2400} \
  timeout 45m ./scripts/fsx-test.sh 2>&1 | tee -a "$log"
echo "== crash rounds (kill -9 of a writing client, remount, every acknowledged byte checked)"
timeout 10m ./scripts/crash-test.sh 2>&1 | tee -a "$log"
echo "== cluster test (network namespaces: PostgreSQL and Garage on one host, clients on two)"
timeout 30m ./scripts/cluster-test.sh 2>&1 | tee -a "$log"
# One closing line for the whole run. It counts every cargo test, each tierfs mount's pjdfstest
# passes, each fsx run, each crash round, and the cluster fault scenario as one test; the
# exercisers' own lines come just before it.
cargo_passed=$(awk '/^test result: ok\./ {n += $4} END {print n + 0}' "$log")
pjd_passed=$(awk '/^pjdfstest (tierfs|rwpcc): / {n += $3} END {print n + 0}' "$log")
fsx_passed=$(awk '/^fsx: [0-9]+ passed/ {n += $2} END {print n + 0}' "$log")
crash_passed=$(awk '/^crash rounds: / {n += $3} END {print n + 0}' "$log")
echo "== all tests passed"
grep -E '^(pjdfstest (local|tierfs|rwpcc)|fsx (uncached|pcc|reader)|crash rounds): ' "$log" || true
echo "cargo test $cargo_passed, pjdfstest on tierfs mounts $pjd_passed, fsx runs $fsx_passed, crash rounds $crash_passed, cluster scenario 1"
rm -f "$log"
echo "tests: $((cargo_passed + pjd_passed + fsx_passed + crash_passed + 1)) passed, 0 failed"
