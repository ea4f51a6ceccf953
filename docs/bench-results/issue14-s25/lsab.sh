#!/bin/bash
# lsab.sh BIN...: the floor (tierfs memfs) with FUSE over io_uring, a directory of 10,000 empty
# files, cold `ls -l` 3 times per binary, binaries alternating; prints seconds.
set -e
echo Y > /sys/module/fuse/parameters/enable_uring
trap 'echo N > /sys/module/fuse/parameters/enable_uring' EXIT
for round in 1 2 3; do
  for B in "$@"; do
    M=$(mktemp -d /var/tmp/lsab.XXXX)
    "$B" memfs "$M" 2>/dev/null & P=$!
    for _ in $(seq 50); do mountpoint -q "$M" && break; sleep 0.1; done
    mkdir "$M/many"; (cd "$M/many" && seq -f "f-%06g" 1 10000 | xargs touch)
    sync; echo 3 > /proc/sys/vm/drop_caches
    s=$(date +%s.%N); ls -l "$M/many" > /dev/null; e=$(date +%s.%N)
    s2=$(date +%s.%N); tar cf - -C /usr include 2>/dev/null | tar xf - -C "$M"; e2=$(date +%s.%N)
    printf '%s round %d: ls -l %.3f s  untar %.3f s\n' "$(basename "$B")" $round "$(echo "$e - $s" | bc)" "$(echo "$e2 - $s2" | bc)"
    fusermount3 -u "$M"; wait $P || true; rmdir "$M"
  done
done
