#!/usr/bin/env bash
# Crash rounds (issue 10): a writing client's daemon is killed with kill -9 at random points,
# also exactly while the application is inside fsync or close, and every byte acknowledged by
# fsync or close must read back, by checksum, from another client.
#
# One filesystem (SQLite, two local targets, 1 MiB stripes, 64 KiB inline threshold). Client
# "writer" at $W/mnt0, client "checker" at $W/mnt1. Each round:
#   1. scripts/crash-writer.py writes under mnt0/rN: new files (inline, one chunk, several
#      chunks), appends, overwrites in place and rewrites of its files, each closed (fsync
#      first one time in two), and logs each operation it begins and each it saw acknowledged;
#   2. the writer daemon is killed with kill -9: after a random delay, or right after the
#      writer announced its k-th fsync, or its k-th close (random k);
#   3. `tierfs mount` mounts the writer again at the same (dead) mount point;
#   4. the checker client reads every file of the round: the last acknowledged version of each,
#      whole; for a file whose operation was cut short, the bytes that operation left alone.
# After the rounds (no client mounted): `tierfs fsck` must find no missing object, and
# `tierfs gc --grace 0` must reclaim what the killed uploads left behind; after
# `tierfs fsck --repair` (the killed sessions' open files), fsck must find nothing.
#
# CRASH_ROUNDS (default 50), CRASH_SEED (default: random, printed), TIERFS (the binary; default
# $CARGO_TARGET_DIR/debug/tierfs), CRASH_KEEP=1 keeps the work directory. Run as root (FUSE).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TIERFS=${TIERFS:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/tierfs}
ROUNDS=${CRASH_ROUNDS:-50}
SEED=${CRASH_SEED:-$(( (RANDOM << 15) | RANDOM ))}
LIMIT=${CRASH_TIME_LIMIT:-900}
[[ -x $TIERFS ]] || { echo "crash-test: no tierfs binary at $TIERFS (cargo build -p tierfs-cli)"; exit 2; }
echo "crash-test: seed $SEED, $ROUNDS rounds, binary $TIERFS"
RANDOM=$SEED

W=$(mktemp -d /tmp/tierfs-crash.XXXXXX)
META="sqlite://$W/meta.db"
LOG=$W/acked.log
WRITER_PID=
cleanup() {
  set +e
  [[ -n $WRITER_PID ]] && kill -9 "$WRITER_PID" 2>/dev/null
  for m in "$W/mnt0" "$W/mnt1"; do
    "$TIERFS" umount "$m" >/dev/null 2>&1 || fusermount3 -uz "$m" 2>/dev/null
  done
  if [[ ${CRASH_KEEP:-0} == 1 ]]; then echo "crash-test: kept $W"; else rm -rf "$W"; fi
}
trap cleanup EXIT
# The whole run is bounded: a hung mount must not hang CI.
bash -c 'sleep "$1"; kill -TERM "$2"' _ "$LIMIT" $$ >/dev/null 2>&1 &
WATCHDOG=$!
trap 'echo "crash-test: over ${LIMIT}s, giving up" >&2; exit 1' TERM
trap 'kill $WATCHDOG 2>/dev/null; cleanup' EXIT

mkdir -p "$W/mnt0" "$W/mnt1"
: >"$LOG"
"$TIERFS" format --meta "$META" --target "file://$W/ost0" --target "file://$W/ost1" \
  --stripe-size 1M --inline-threshold 64K crash >/dev/null
mount_writer() {
  "$TIERFS" mount --meta "$META" "$W/mnt0" --client-name writer --log-file "$W/writer.log"
}
mount_writer
"$TIERFS" mount --meta "$META" "$W/mnt1" --client-name checker --log-file "$W/checker.log"

daemon_pid() {
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["pid"])' "$W/mnt0/.tierfs-info"
}

t0=$SECONDS
passed=0 failed=0 at_fsync=0 at_close=0 at_delay=0
for ((r = 1; r <= ROUNDS; r++)); do
  pid=$(daemon_pid)
  mode=$((RANDOM % 10))
  k=$((1 + RANDOM % 6))
  coproc WR { exec python3 "$ROOT/scripts/crash-writer.py" write "$W/mnt0/r$r" "$LOG" "$((SEED + r))"; }
  WRITER_PID=$WR_PID
  exec {wout}<&"${WR[0]}"
  killed=
  # Wait until the writer runs (its directory made), so every kill hits its operations.
  IFS= read -r -t 20 -u "$wout" line || true
  if ((mode < 4)); then
    # A random delay: anywhere in a write, an fsync, a close, or between them.
    sleep "$((RANDOM % 2)).$((RANDOM % 10))$((RANDOM % 10))"
    how="after a random delay"
    at_delay=$((at_delay + 1))
  else
    want=$([[ $mode -lt 7 ]] && echo F || echo C)
    how=$([[ $want == F ]] && echo "inside fsync #$k" || echo "inside close #$k")
    seen=0
    while IFS= read -r -t 10 -u "$wout" line; do
      if [[ ${line:0:1} == "$want" ]]; then
        seen=$((seen + 1))
        if ((seen == k)); then
          kill -9 "$pid"
          killed=1
          break
        fi
      fi
    done
    [[ $want == F ]] && at_fsync=$((at_fsync + 1)) || at_close=$((at_close + 1))
  fi
  [[ -n $killed ]] || kill -9 "$pid" 2>/dev/null || true
  # The writer fails its next call on the dead mount and stops; drain what it says.
  cat <&"$wout" >"$W/writer-r$r.out" 2>/dev/null || true
  exec {wout}<&-
  wait "$WRITER_PID" 2>/dev/null || true
  WRITER_PID=
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
  mount_writer
  if out=$(python3 "$ROOT/scripts/crash-writer.py" verify "$W/mnt1" "$LOG" "r$r/" 2>&1); then
    passed=$((passed + 1))
    echo "round $r: killed $how: $out"
  else
    failed=$((failed + 1))
    echo "round $r: killed $how: FAILED: $out"
  fi
done

# Every round's files again, from the checker, after all the crashes.
if ! out=$(python3 "$ROOT/scripts/crash-writer.py" verify "$W/mnt1" "$LOG" "" 2>&1); then
  echo "final check: FAILED: $out"
  failed=$((failed + 1))
else
  echo "final check: $out"
fi
"$TIERFS" umount "$W/mnt0"
"$TIERFS" umount "$W/mnt1"

# With no client mounted: no object may be missing; the killed uploads are leaks gc reclaims.
set +e
fsck_out=$("$TIERFS" fsck --meta "$META" --grace 0 2>&1); fsck_rc=$?
set -e
echo "$fsck_out"
missing=$(awk '/^missing object/ {print $5}' <<<"$fsck_out")
past=$(awk '/^slice past/ {print $6}' <<<"$fsck_out")
if [[ $fsck_rc -eq 2 || $missing != 0 || $past != 0 ]]; then
  echo "crash-test: fsck found missing objects or slices past their object's end (rc $fsck_rc)"
  failed=$((failed + 1))
fi
gc_out=$("$TIERFS" gc --meta "$META" --grace 0)
echo "$gc_out"
leaked=$(awk '/^leaked:/ {print $2}' <<<"$gc_out")
removed=$(awk '/^removed:/ {print $2}' <<<"$gc_out")
if [[ $leaked != "$removed" ]]; then
  echo "crash-test: gc removed $removed of $leaked leaked objects"
  failed=$((failed + 1))
fi
# The killed sessions' rows (open files, locks) are repaired; then everything is clean.
"$TIERFS" fsck --meta "$META" --grace 0 --repair >/dev/null 2>&1 || true
set +e
after=$("$TIERFS" fsck --meta "$META" --grace 0 2>&1); after_rc=$?
set -e
orphans=$(awk '/^orphan object/ {print $3}' <<<"$after")
if [[ $after_rc -ne 0 || $orphans != 0 ]]; then
  echo "$after"
  echo "crash-test: fsck after gc is not clean (rc $after_rc, $orphans orphan objects)"
  failed=$((failed + 1))
fi
echo "kill points: $at_delay after a random delay, $at_fsync inside fsync, $at_close inside close; $((SECONDS - t0)) s; seed $SEED"
echo "crash rounds: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
