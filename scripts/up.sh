#!/usr/bin/env bash
# The embedded default, end to end: install what is needed, build tierfs, format and mount a
# demo filesystem (SQLite metadata, two local storage targets) in ./tierfs-demo, and use it.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install-deps.sh
cargo build --release --quiet
export PATH="$PWD/target/release:$PATH"
tierfs up --dir tierfs-demo
M=tierfs-demo/mnt
echo "hello from tierfs" > $M/hello.txt
cat $M/hello.txt
dd if=/dev/urandom of=$M/big bs=1M count=64 status=none
tierfs df -h $M
tierfs getstripe $M/big
echo "tierfs is mounted at $M; stop it with: target/release/tierfs umount $M"
