#!/usr/bin/env python3
"""Writes files and records the ones the filesystem acknowledged; later checks them.

  acked-writer.py write DIR ACKED STOPFILE   # until STOPFILE exists
  acked-writer.py verify DIR ACKED [--min N]

`write` creates DIR/fNNNNN files of 64 KiB to 3 MiB of random bytes, one after another. A file
counts as acknowledged once write, fsync and close all returned without error and the file is
on a tierfs mount (while a killed daemon's mount is being replaced, the same path briefly
names the directory underneath); only then is "name sha256 size" appended (and flushed) to
ACKED, on a local disk. Errors (a database or
store outage, a daemon killed under it) are counted and the writer goes on with the next
name after a short pause; an unacknowledged file may be missing or partial, that is allowed.

`verify` reads every acknowledged file and fails (exit 1) if one is missing or differs, or if
fewer than N were acknowledged (so a run that wrote nothing cannot pass).
"""

import hashlib
import os
import random
import sys
import time


def tierfs_devices():
    """st_dev of every tierfs FUSE mount, from /proc/self/mountinfo."""
    devs = set()
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            fstype, source = fields[sep + 1], fields[sep + 2]
            if fstype.startswith("fuse") and source.startswith("tierfs"):
                major, minor = fields[2].split(":")
                devs.add(os.makedev(int(major), int(minor)))
    return devs


def write(d, acked, stop):
    n = ok = errors = 0
    t0 = time.monotonic()
    with open(acked, "a") as log:
        while not os.path.exists(stop) and time.monotonic() - t0 < 600:
            name = f"f{n:05d}"
            n += 1
            data = os.urandom(random.randint(64 << 10, 3 << 20))
            try:
                os.makedirs(d, exist_ok=True)
                fd = os.open(os.path.join(d, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view):]
                    os.fsync(fd)
                    on_tierfs = os.fstat(fd).st_dev in tierfs_devices()
                finally:
                    os.close(fd)
                if not on_tierfs:
                    raise OSError(0, "written beside tierfs (the mount was being replaced)")
            except OSError as e:
                errors += 1
                print(f"{name}: not acknowledged: {e}", flush=True)
                time.sleep(0.2)
                continue
            ok += 1
            log.write(f"{name} {hashlib.sha256(data).hexdigest()} {len(data)}\n")
            log.flush()
            os.fsync(log.fileno())
    print(f"writer {d}: {ok} acknowledged, {errors} failed during faults", flush=True)


def verify(d, acked, minimum):
    bad = []
    count = 0
    with open(acked) as log:
        for line in log:
            name, digest, size = line.split()
            count += 1
            p = os.path.join(d, name)
            try:
                with open(p, "rb") as f:
                    data = f.read()
            except OSError as e:
                bad.append(f"{name}: {e}")
                continue
            if len(data) != int(size) or hashlib.sha256(data).hexdigest() != digest:
                bad.append(f"{name}: {len(data)} bytes, expected {size} with another checksum")
    if bad:
        print(f"{len(bad)} of {count} acknowledged files lost or damaged in {d}:")
        for b in bad[:20]:
            print(f"  {b}")
        sys.exit(1)
    if count < minimum:
        print(f"only {count} files were acknowledged in {d} (at least {minimum} expected)")
        sys.exit(1)
    print(f"{count} acknowledged files intact in {d}")


def main():
    a = sys.argv[1:]
    if len(a) == 4 and a[0] == "write":
        write(a[1], a[2], a[3])
    elif len(a) in (3, 5) and a[0] == "verify":
        minimum = int(a[4]) if len(a) == 5 and a[3] == "--min" else 0
        verify(a[1], a[2], minimum)
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
