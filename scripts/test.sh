#!/usr/bin/env bash
# The whole test suite: formatting and lints, unit tests, the metadata-engine conformance suite,
# and FUSE integration tests that mount real filesystems with several clients. Run as root
# (FUSE mounts, tests as other users). Installs what it needs first.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install-deps.sh
export CARGO_TERM_COLOR=never
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings
mounts_before=$(awk '$1 ~ /^tierfs:/ {print $2}' /proc/mounts | sort)
echo "== cargo test"
# Every test bounds its own time; this bounds the whole run.
timeout 45m cargo test --workspace -- --test-threads="${TEST_THREADS:-4}"
# No test may leave a mount behind.
left=$(comm -13 <(echo "$mounts_before") <(awk '$1 ~ /^tierfs:/ {print $2}' /proc/mounts | sort) | grep . || true)
if [ -n "$left" ]; then
  echo "error: tests left tierfs mounts behind: $left"
  exit 1
fi
echo "== all tests passed"
