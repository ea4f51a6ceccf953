#!/usr/bin/env bash
# `tar xf` of /usr/include (+ sync) and `cp -a` of it inside a one-client mount,
# follow_changes = false vs true (two fresh
# filesystems), alternating rounds (the order flips each round) so drift falls on both sides.
#
#   scripts/follow-cost-cp.sh TIERFS_BIN [ROUNDS=4]   (docs/benchmarks.md, "On by default")
[ $# -ge 1 ] && [ -x "$1" ] || { echo "usage: scripts/follow-cost-cp.sh TIERFS_BIN [ROUNDS]" >&2; exit 2; }
set -euo pipefail
BIN=$1; ROUNDS=${2:-3}
W=$(mktemp -d /var/tmp/tierfs-fcpa.XXXXXX)
cleanup() { for m in "$W"/*/m0; do [ -d "$m" ] && { "$BIN" umount "$m" 2>/dev/null || true; }; done; rm -rf "$W"; }
trap cleanup EXIT
tar cf $W/inc.tar -C /usr include 2>/dev/null
for mode in off on; do
  d=$W/$mode; mkdir -p $d/m0
  [ $mode = on ] && v=true || v=false
  printf 'follow_changes = %s\n' $v > $d/c.toml
  "$BIN" format --meta "sqlite://$d/meta.db" --target "file://$d/ost0" >/dev/null
  "$BIN" mount --meta "sqlite://$d/meta.db" $d/m0 --client-name a --config $d/c.toml --log-file $d/a.log
  tar xf $W/inc.tar -C $d/m0
done
for r in $(seq 1 $ROUNDS); do
  if [ $((r % 2)) = 1 ]; then order="off on"; else order="on off"; fi
  for mode in $order; do
    sync; mkdir $W/$mode/m0/u$r
    s=$(date +%s.%N); tar xf $W/inc.tar -C $W/$mode/m0/u$r; sync; e=$(date +%s.%N)
    echo "round $r $mode tar xf + sync $(echo "$e - $s" | bc) s"
    s=$(date +%s.%N); cp -a $W/$mode/m0/include $W/$mode/m0/copy$r; e=$(date +%s.%N)
    echo "round $r $mode cp -a $(echo "$e - $s" | bc) s"
  done
done
