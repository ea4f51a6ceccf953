#!/usr/bin/env bash
# Issue 14: small files and metadata, uncached tierfs against a plain directory on the same
# disk, measured right after each other (native first, then tierfs, per workload), one run.
#
#   scripts/bench-small.sh [--bin PATH] [--config CLIENT.toml] [--rw-pcc] [--files N] [--src DIR] [--keep-trace]
#                          [--floor [--floor-bin PATH | --floor-cmd 'COMMAND ARGS']]
#
# Workloads: `tar xf` of a tarball of /usr/include + sync; `ls -l` of a directory of N
# (10,000) empty files, cold; `find | wc -l`, `du -s` of the untarred tree, cold; `cp -a` and
# `rsync -a` of the tree; `diff -r` of the tree and its copy, cold; `git clone` of this
# repository (file://, no hardlinks); `rm -rf` of all of it.
# --rw-pcc: the mount has a client cache and every new file is attached to RW-PCC at create
# (a rule on a project id set on the mount's root, as `tierfs bench`'s tierfs+rw-pcc mode). "Cold": page, dentry and inode caches dropped
# (echo 3 > /proc/sys/vm/drop_caches, which also makes the kernel FORGET the mount's inodes).
# --floor: also the FUSE floor, `tierfs memfs` (an in-memory filesystem mounted with tierfs's
# FUSE code, mount options, kernel flags and TTLs; docs/benchmarks.md, "The FUSE floor on this
# machine"), run between native and tierfs for each workload; --floor-bin: the binary that has
# `memfs` (default: this tree's release build), when --bin is an older tierfs; --floor-cmd: another
# floor instead of memfs, a command that serves a FUSE mount in the foreground at the mount point
# appended to it (e.g. libfuse's example/passthrough_ll -f -o source=DIR,...), unmounted with
# fusermount3 -u.
#
# Printed per workload: native seconds, tierfs seconds, tierfs/native, and the FUSE requests
# the kernel sent to the mount during it, by opcode (with --floor, a second line: the floor's
# seconds, tierfs/floor, floor/native and its requests) (kernel tracepoint fuse:fuse_request_send,
# filtered on the mount's connection; FORGETs travel on their own queue and are not seen).
# Needs root (drop_caches, tracefs). The mount: SQLite metadata, one local-directory target,
# default TTLs, no PCC.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${CARGO_TARGET_DIR:-target}/release/tierfs
FILES=10000
SRC=/usr/include
KEEP=0
RWPCC=0
REPO=$PWD
CONFIG=()
FLOOR=0
FLOOR_BIN=${CARGO_TARGET_DIR:-target}/release/tierfs
FLOOR_CMD=
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) BIN=$2; shift 2;;
    --config) CONFIG=(--config "$(realpath "$2")"); shift 2;;
    --files) FILES=$2; shift 2;;
    --src) SRC=$2; shift 2;;
    --keep-trace) KEEP=1; shift;;
    --rw-pcc) RWPCC=1; shift;;
    --floor) FLOOR=1; shift;;
    --floor-bin) FLOOR_BIN=$2; shift 2;;
    --floor-cmd) FLOOR_CMD=$2; shift 2;;
    *) echo "unknown option $1" >&2; exit 2;;
  esac
done
[ -x "$BIN" ] || { echo "no tierfs binary at $BIN (cargo build --release -p tierfs-cli)" >&2; exit 1; }
if [ "$FLOOR" = 1 ] && [ -z "$FLOOR_CMD" ]; then
  "$FLOOR_BIN" memfs --help >/dev/null 2>&1 || { echo "no 'memfs' in $FLOOR_BIN (--floor-bin)" >&2; exit 1; }
fi
[ "$(id -u)" = 0 ] || { echo "needs root (drop_caches, tracefs)" >&2; exit 1; }
for c in tar rsync git diff; do
  command -v $c >/dev/null 2>&1 || { echo "needs $c (scripts/install-deps.sh installs it)" >&2; exit 1; }
done
TR=/sys/kernel/tracing
# A fresh machine may not have tracefs mounted yet.
[ -d "$TR/events" ] || mount -t tracefs tracefs "$TR" 2>/dev/null || true
[ -d "$TR/events/fuse/fuse_request_send" ] || { echo "kernel has no fuse tracepoints" >&2; exit 1; }

W=$(mktemp -d /var/tmp/tierfs-small.XXXXXX)
INST=$TR/instances/$(basename "$W")
NATIVE=$W/native; MNT=$W/mnt; FMNT=$W/floor
mkdir -p "$NATIVE" "$MNT" "$FMNT"
FPID=
cleanup() {
  [ -d "$INST" ] && { echo 0 > "$INST/events/fuse/fuse_request_send/enable"; rmdir "$INST"; }
  "$BIN" umount "$MNT" 2>/dev/null || true
  if [ -n "$FPID" ]; then
    fusermount3 -u "$FMNT" 2>/dev/null || umount -l "$FMNT" 2>/dev/null || true
    wait "$FPID" 2>/dev/null || true
  fi
  rm -rf "$W"
}
trap cleanup EXIT

"$BIN" format --meta "sqlite://$W/meta.db" --target "file://$W/ost0" >/dev/null
PCC=()
if [ "$RWPCC" = 1 ]; then
  mkdir "$W/cache"
  PCC=(--cache-dir "$W/cache" --cache-size 16G)
  "$BIN" pcc rule add --meta "sqlite://$W/meta.db" --mode rw 'projid={4701}' >/dev/null
fi
mount_it() { "$BIN" mount --meta "sqlite://$W/meta.db" "$MNT" --client-name small --log-file "$W/mount.log" "${PCC[@]}" "${CONFIG[@]}"; }
mount_it
[ "$RWPCC" = 1 ] && "$BIN" project -s -p 4701 "$MNT" >/dev/null
if [ "$FLOOR" = 1 ]; then
  if [ -n "$FLOOR_CMD" ]; then
    # shellcheck disable=SC2086 # a command line, split into words on purpose
    $FLOOR_CMD "$FMNT" > "$W/floor.log" 2>&1 &
  else
    "$FLOOR_BIN" memfs "$FMNT" 2> "$W/floor.log" &
  fi
  FPID=$!
  for _ in $(seq 100); do mountpoint -q "$FMNT" && break; sleep 0.1; done
  mountpoint -q "$FMNT" || { echo "memfs did not mount: $(cat "$W/floor.log")" >&2; exit 1; }
fi

# The tracepoint's `connection` is the mount's kernel dev_t (MAJOR << 20 | MINOR).
connection() { # [MOUNT]
  local d; d=$(mountpoint -d "${1:-$MNT}")
  echo $(( (${d%%:*} << 20) | ${d##*:} ))
}
mkdir "$INST"
EV=$INST/events/fuse/fuse_request_send
echo 16384 > "$INST/buffer_size_kb"
trace_on() { echo "connection == $(connection "$@")" > "$EV/filter"; : > "$INST/trace"; echo 1 > "$EV/enable"; }
trace_off() { # prints "N total: OP n, OP n, ..." of the requests since trace_on
  echo 0 > "$EV/enable"
  [ "$KEEP" = 1 ] && cp "$INST/trace" "$W/../tierfs-small-trace.$1.txt"
  if grep -q "LOST" "$INST/trace"; then echo "(trace lost events)"; fi
  grep -o 'opcode [0-9]* ([A-Z_0-9]*)' "$INST/trace" | awk '{gsub(/[()]/, "", $3); sub(/^FUSE_/, "", $3); n[$3]++; t++}
    END { printf "%d total:", t; PROCINFO["sorted_in"] = "@val_num_desc"; for (k in n) printf " %s %d", k, n[k]; print "" }'
}
cold() { sync; echo 3 > /proc/sys/vm/drop_caches; }
secs() { local s e; s=$(date +%s.%N); "$@"; e=$(date +%s.%N); echo "$e - $s" | bc; }

tar cf "$W/src.tar" -C "$(dirname "$SRC")" "$(basename "$SRC")"
ENTRIES=$(tar tf "$W/src.tar" | wc -l)
make_files() { # DIR: N empty files
  mkdir "$1/many"
  (cd "$1/many" && seq -f "file-%06g" 1 "$FILES" | xargs touch)
}
DIRS=("$NATIVE" "$MNT")
[ "$FLOOR" = 1 ] && DIRS+=("$FMNT")
for d in "${DIRS[@]}"; do make_files "$d"; done
sync

declare -A T
run() { # NAME UNITS COMMAND... (in the native directory, then in the mount; UNITS: entries handled)
  local name=$1 units=$2; shift 2
  local modes=(native tierfs)
  [ "$FLOOR" = 1 ] && modes=(native floor tierfs)
  for mode in "${modes[@]}"; do
    local dir=$NATIVE
    case $mode in tierfs) dir=$MNT;; floor) dir=$FMNT;; esac
    cold
    [ "$mode" != native ] && trace_on "$dir"
    T[$name.$mode]=$(cd "$dir" && secs "$@")
    [ "$mode" = tierfs ] && T[$name.fuse]=$(trace_off "$name")
    [ "$mode" = floor ] && T[$name.ffuse]=$(trace_off "$name.floor")
  done
  printf '%-6s native %7.3f s  tierfs %7.3f s  %5.1fx  FUSE requests per entry %5.2f (%s)\n' "$name" \
    "${T[$name.native]}" "${T[$name.tierfs]}" \
    "$(echo "${T[$name.tierfs]} / ${T[$name.native]}" | bc -l)" \
    "$(echo "${T[$name.fuse]%% *} / $units" | bc -l)" "${T[$name.fuse]}"
  if [ "$FLOOR" = 1 ]; then
    printf '%-6s floor  %7.3f s  tierfs/floor %5.1fx  floor/native %5.1fx  FUSE requests per entry %5.2f (%s)\n' "" \
      "${T[$name.floor]}" "$(echo "${T[$name.tierfs]} / ${T[$name.floor]}" | bc -l)" \
      "$(echo "${T[$name.floor]} / ${T[$name.native]}" | bc -l)" \
      "$(echo "${T[$name.ffuse]%% *} / $units" | bc -l)" "${T[$name.ffuse]}"
  fi
}
TREE=$(basename "$SRC")
untar() { tar xf "$W/src.tar" && sync; }
ls_l() { ls -l many > /dev/null; }
find_n() { find "$TREE" | wc -l > /dev/null; }
du_s() { du -s "$TREE" > /dev/null; }
cp_a() { cp -a "$TREE" copy; }
rsync_a() { rsync -a "$TREE/" synced/; }
diff_r() { diff -r "$TREE" copy > /dev/null; }
git_clone() { git clone -q --no-local "file://$REPO" clone; }
rm_rf() { rm -rf "$TREE" copy synced clone; }

echo "$ENTRIES entries in the tarball of $SRC; ls -l of $FILES files; bench dir $W (both on the same disk)"
if [ "$FLOOR" = 1 ]; then
  if [ -n "$FLOOR_CMD" ]; then echo "floor: $FLOOR_CMD at $FMNT"
  else echo "floor: $FLOOR_BIN memfs at $FMNT ($(stat -c %y "$FLOOR_BIN" | cut -c1-19))"; fi
  echo "fuse.enable_uring=$(cat /sys/module/fuse/parameters/enable_uring 2>/dev/null || echo ?)"
fi
echo "mode: $([ "$RWPCC" = 1 ] && echo "RW-PCC at create" || echo uncached); client config: ${CONFIG[1]:-none}${CONFIG[1]:+ ($(tr '\n' ' ' < "${CONFIG[1]}"))}"
echo "$(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg); binary $BIN ($(stat -c %y "$BIN" | cut -c1-19))"
run untar "$ENTRIES" untar
run ls-l "$FILES" ls_l
run find "$ENTRIES" find_n
run du "$ENTRIES" du_s
run cp-a "$ENTRIES" cp_a
run rsync "$ENTRIES" rsync_a
run diff-r "$((2 * ENTRIES))" diff_r
CLONE_FILES=$(git -C "$REPO" ls-files | wc -l)
run clone "$CLONE_FILES" git_clone
run rm-rf "$((3 * ENTRIES + CLONE_FILES))" rm_rf
