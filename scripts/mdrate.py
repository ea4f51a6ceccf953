#!/usr/bin/env python3
"""Metadata rates in one directory: create, stat and unlink N empty files (mdtest -F -n N style).

Usage: mdrate.py DIR N  ->  prints JSON {"create": ops/s, "stat": ops/s, "unlink": ops/s}
"""
import json
import os
import sys
import time

d = sys.argv[1]
n = int(sys.argv[2])
os.makedirs(d, exist_ok=True)
names = [f"{d}/f{i}" for i in range(n)]
t = time.perf_counter()
for p in names:
    os.close(os.open(p, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644))
create = n / (time.perf_counter() - t)
t = time.perf_counter()
for p in names:
    os.stat(p)
stat = n / (time.perf_counter() - t)
t = time.perf_counter()
for p in names:
    os.unlink(p)
unlink = n / (time.perf_counter() - t)
os.rmdir(d)
print(json.dumps({"create": create, "stat": stat, "unlink": unlink}))
