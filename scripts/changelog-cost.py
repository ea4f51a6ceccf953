#!/usr/bin/env python3
# Creates per second through a tierfs mount with no changelog reader vs one reader registered,
# alternating rounds in one run (docs/benchmarks.md, "Changelog cost").
# usage: changelog-cost.py TIERFS_BIN META_URL MOUNTDIR FILES_PER_ROUND ROUNDS
import os, sys, time, subprocess, statistics

tierfs, meta, mnt, per, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
def run(*a):
    return subprocess.run([tierfs, *a], check=True, capture_output=True, text=True).stdout.strip()
def burst(d):
    os.makedirs(d)
    t = time.perf_counter()
    for i in range(per):
        fd = os.open(f"{d}/f{i}", os.O_CREAT | os.O_WRONLY, 0o644)
        os.write(fd, b"hello\n")
        os.close(fd)
    return per / (time.perf_counter() - t)
none, one = [], []
for r in range(rounds):
    order = [False, True] if r % 2 == 0 else [True, False]
    for w in order:
        if w:
            rid = run("changelog", "register", "--meta", meta)
            rate = burst(f"{mnt}/r{r}-one")
            held = run("changelog", "readers", "--meta", meta).splitlines()[0]
            run("changelog", "deregister", rid, "--meta", meta)
            print(f"round {r}: one reader {rate:9.0f} creates/s   ({held})")
            one.append(rate)
        else:
            rate = burst(f"{mnt}/r{r}-none")
            print(f"round {r}: no reader  {rate:9.0f} creates/s")
            none.append(rate)
a, b = statistics.median(none), statistics.median(one)
print(f"median: no reader {a:.0f} creates/s, one reader {b:.0f} creates/s: {(b/a-1)*100:+.1f}%")
