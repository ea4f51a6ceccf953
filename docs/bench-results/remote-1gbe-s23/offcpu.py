#!/usr/bin/env python3
"""Where a benchmark's threads wait, from `perf record -e sched:sched_switch -g -p PID`:
`perf script -i perf.data -F tid,time,ip,sym > offcpu.txt; python3 offcpu.py offcpu.txt`.
Each switch-out's time runs until the thread's next switch-out (so it includes the short run
after the wake-up); it is charged to the VFS directory lock when the stack waits in
down_read/down_write, else to the FUSE request the stack waits in. Only threads that sent FUSE
requests (the benchmark's) are counted."""
import collections, re, sys

SKIP = {'__schedule', 'schedule', 'schedule_preempt_disabled', 'rwsem_down_write_slowpath',
        'rwsem_down_read_slowpath', 'schedule_timeout', 'io_schedule'}

def events(path):
    cur = None
    for line in open(path):
        if not line.strip():
            if cur:
                yield cur
            cur = None
            continue
        m = re.match(r'\s*(\d+)\s+([\d.]+):\s*$', line)
        if m:
            if cur:
                yield cur
            cur = (int(m.group(1)), float(m.group(2)), [])
            continue
        if cur is not None:
            parts = line.split()
            if len(parts) >= 2:
                cur[2].append(parts[1].split('+')[0])
    if cur:
        yield cur

def category(stack):
    s = [x for x in stack if x not in SKIP]
    if s and s[0] in ('down_write', 'down_read'):
        return 'VFS dir lock: %s in %s' % (s[0], s[1] if len(s) > 1 else '?')
    for x in s:
        if x.startswith('fuse_') and x not in ('fuse_simple_request', '__fuse_simple_request'):
            return 'FUSE request: ' + x
    return 'other: ' + ' '.join(s[:3])

by = collections.defaultdict(list)
for tid, ts, stack in events(sys.argv[1]):
    by[tid].append((ts, stack))
total, span = collections.Counter(), 0.0
for tid, evs in by.items():
    if not any('fuse_' in ' '.join(st) for _, st in evs):
        continue
    evs.sort()
    span += evs[-1][0] - evs[0][0]
    for (t0, st), (t1, _) in zip(evs, evs[1:]):
        total[category(st)] += t1 - t0
print("benchmark threads' time covered: %.2f s" % span)
for k, v in total.most_common(16):
    print("%6.2f s  %4.1f%%  %s" % (v, 100 * v / span, k))
