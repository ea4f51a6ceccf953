#!/usr/bin/env python3
"""The writer and the checker of scripts/crash-test.sh.

  crash-writer.py write DIR LOG SEED    # writes under DIR until an error (its daemon killed)
  crash-writer.py verify ROOT LOG [PREFIX]

`write` creates, appends to, overwrites in place and rewrites files under DIR (sizes: inline,
one chunk, several chunks), each operation ending with close (and, one time in two, an fsync
before it). Before an operation it appends `B path keep sha256` to LOG: the first `keep` bytes
of the file's last acknowledged version that the operation leaves alone (the whole file for an
append, the bytes before the offset for an overwrite, none for a rewrite). Only after close
(and fsync) returned does it append `A path length sha256` of the file's whole new content. On
stdout it announces `S` once started, `W path` before writing, `F path` just before fsync and `C path` just before close, so the test can
kill the daemon exactly then. The first error ends it (the daemon under it was killed).

`verify` checks, under ROOT (a mount of another client), every path of LOG (starting with
PREFIX): a file whose last operation was acknowledged has exactly its last acknowledged content
(the later of two acknowledged versions wins); a file whose last operation was under way at the
kill keeps at least the bytes that operation did not touch; a file never acknowledged may be
anything. Exit 1 on any difference.
"""

import hashlib
import os
import random
import sys

STRIPE = 1 << 20


def sha(b):
    return hashlib.sha256(b).hexdigest()


def size_class(rng):
    r = rng.random()
    if r < 0.3:
        return rng.randint(1, 60 << 10)  # inline (below the 64 KiB threshold)
    if r < 0.6:
        return rng.randint(100 << 10, STRIPE)  # one chunk
    return rng.randint(STRIPE + 1, 4 * STRIPE + 12345)  # several chunks


def write(d, log_path, seed):
    rng = random.Random(seed)
    try:
        os.makedirs(d, exist_ok=True)
    except OSError as e:
        print(f"E {d}: {e}", flush=True)
        return
    print("S", flush=True)
    # LOG names files relative to DIR's parent (the mount), so another mount can check them.
    base, sub = os.path.split(os.path.normpath(d))
    files = {}  # path -> acknowledged content
    log = open(log_path, "a")
    n = 0

    def note(line):
        log.write(line + "\n")
        log.flush()

    def finish(fd, name, sync):
        if sync:
            print(f"F {name}", flush=True)
            os.fsync(fd)
        print(f"C {name}", flush=True)
        os.close(fd)

    while n < 400:
        n += 1
        ops = ["new"] + (["append", "overwrite", "rewrite"] if files else [])
        op = rng.choice(ops)
        sync = rng.random() < 0.5
        if op == "new":
            rel = f"{sub}/f{n:04d}"
            old = b""
        else:
            rel = rng.choice(sorted(files))
            old = files[rel]
        name = os.path.join(base, rel)
        data = rng.randbytes(size_class(rng))
        if op == "new" or op == "rewrite":
            keep, new = 0, data
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
            at = 0
        elif op == "append":
            keep, new = len(old), old + data
            flags = os.O_WRONLY | os.O_APPEND
            at = None
        else:
            at = rng.randint(0, len(old))
            keep = at
            new = old[:at] + data + old[at + len(data):]
            flags = os.O_WRONLY
        note(f"B {rel} {keep} {sha(old[:keep])}")
        try:
            fd = os.open(name, flags, 0o644)
            print(f"W {rel}", flush=True)
            view = memoryview(data)
            pos = at
            while view:
                if pos is None:
                    w = os.write(fd, view)
                else:
                    w = os.pwrite(fd, view, pos)
                    pos += w
                view = view[w:]
            finish(fd, rel, sync)
        except OSError as e:
            print(f"E {rel} {op}: {e}", flush=True)
            return
        files[rel] = new
        note(f"A {rel} {len(new)} {sha(new)}")
        print(f"A {rel}", flush=True)


def verify(root, log_path, prefix):
    last = {}  # path -> ("A", len, sha) or ("B", keep, sha)
    with open(log_path) as f:
        for line in f:
            kind, path, num, digest = line.split()
            if path.startswith(prefix):
                last.setdefault(path, {})
                if kind == "A":
                    last[path] = {"A": (int(num), digest)}
                else:
                    last[path]["B"] = (int(num), digest)
    bad, checked, partial = [], 0, 0
    for path, st in sorted(last.items()):
        p = os.path.join(root, path)
        if "B" in st:
            keep, digest = st["B"]
            if "A" not in st and keep == 0:
                continue
            partial += 1
            try:
                with open(p, "rb") as f:
                    data = f.read()
            except OSError as e:
                bad.append(f"{path}: {e} (an acknowledged prefix of {keep} bytes)")
                continue
            if len(data) < keep or sha(data[:keep]) != digest:
                bad.append(f"{path}: the {keep} acknowledged bytes an interrupted operation left alone differ")
            continue
        length, digest = st["A"]
        checked += 1
        try:
            with open(p, "rb") as f:
                data = f.read()
        except OSError as e:
            bad.append(f"{path}: {e}")
            continue
        if len(data) != length or sha(data) != digest:
            bad.append(f"{path}: {len(data)} bytes, expected {length} with checksum {digest[:12]}")
    if bad:
        print(f"{len(bad)} acknowledged files lost or damaged:")
        for b in bad[:20]:
            print(f"  {b}")
        sys.exit(1)
    print(f"{checked} acknowledged files intact, {partial} interrupted ones keep their acknowledged bytes")


def main():
    a = sys.argv[1:]
    if len(a) == 4 and a[0] == "write":
        write(a[1], a[2], int(a[3]))
    elif len(a) in (3, 4) and a[0] == "verify":
        verify(a[1], a[2], a[3] if len(a) == 4 else "")
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
