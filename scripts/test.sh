#!/usr/bin/env bash
# The whole test suite: formatting and lints, unit tests, the metadata-engine conformance suite
# (SQLite and a private PostgreSQL), S3 targets against a private Garage server, FUSE
# integration tests that mount real filesystems with several clients, and the multi-host test
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
echo "== cluster test (network namespaces: PostgreSQL and Garage on one host, clients on two)"
timeout 30m ./scripts/cluster-test.sh 2>&1 | tee -a "$log"
# One closing line for the whole run: every cargo test binary's count, and the cluster fault
# scenario as one test.
passed=$(awk '/^test result: ok\./ {n += $4} END {print n + 0}' "$log")
rm -f "$log"
echo "== all tests passed"
echo "tests: $((passed + 1)) passed, 0 failed"
