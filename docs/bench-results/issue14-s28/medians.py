#!/usr/bin/env python3
"""medians.py FILE: per (mode, binary) medians of abmd.sh's output, files/s create/stat/read/remove."""
import re, statistics, sys

cur, d = None, {}
for line in open(sys.argv[1]):
    m = re.match(r"== (\S+) round", line)
    if m:
        cur = m[1]
        continue
    m = re.match(r"mdtest-32kib-shared (\S+) rep 1: create ops (\S+) ops/s, stat ops (\S+) "
                 r"ops/s, read ops (\S+) ops/s, remove ops (\S+)", line)
    if m:
        d.setdefault((m[1], cur), []).append([float(x) for x in m.groups()[1:]])
for k in sorted(d):
    v = d[k]
    print(k, [int(statistics.median(x[i] for x in v)) for i in range(4)], len(v), "runs")
