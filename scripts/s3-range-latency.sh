#!/usr/bin/env bash
# Times ranged GETs from a private Garage (scripts/s3-test-server.sh, loopback), N of them on
# one keep-alive connection (curl --next), LEN bytes each: one line per GET with its total
# time, the time to its first byte and whether it opened a connection. Shows the stall that
# docs/bench.md ("Shaping") describes: Garage writes a response's head and body in two pieces
# without TCP_NODELAY, so a body shorter than a segment waits for the head's delayed ACK.
#
#   scripts/s3-range-latency.sh [N] [LEN]      # defaults 15 and 4096
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
N=${1:-15}
LEN=${2:-4096}
eval "$("$ROOT/scripts/s3-test-server.sh" start)"
OBJ=$(mktemp)
trap '"$ROOT/scripts/s3-test-server.sh" stop "$TIERFS_S3_DIR" >/dev/null 2>&1; rm -f "$OBJ"' EXIT
id=$(sed -n 's/^access_key_id = "\(.*\)"/\1/p' "$TIERFS_S3_CREDENTIALS")
secret=$(sed -n 's/^secret_access_key = "\(.*\)"/\1/p' "$TIERFS_S3_CREDENTIALS")
head -c $((1 << 20)) /dev/urandom >"$OBJ"
sha=$(sha256sum "$OBJ" | cut -d' ' -f1)
sign=(--aws-sigv4 "aws:amz:garage:s3" --user "$id:$secret")
curl -sf -X PUT -H "x-amz-content-sha256: $sha" "${sign[@]}" --data-binary @"$OBJ" \
    "$TIERFS_S3_ENDPOINT/tierfs-a/range-latency"
empty=e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855
args=()
for i in $(seq 1 "$N"); do
    s=$(((i * 37 % 250) * 4096))
    [[ $i -gt 1 ]] && args+=(--next)
    args+=(-sf -o /dev/null -w 'total %{time_total} s, first byte %{time_starttransfer} s, new connections %{num_connects}\n'
        -r "$s-$((s + LEN - 1))" -H "x-amz-content-sha256: $empty" "${sign[@]}"
        "$TIERFS_S3_ENDPOINT/tierfs-a/range-latency")
done
curl "${args[@]}"
curl -sf -X DELETE -H "x-amz-content-sha256: $empty" "${sign[@]}" "$TIERFS_S3_ENDPOINT/tierfs-a/range-latency"
