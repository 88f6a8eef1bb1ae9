#!/usr/bin/env python3
# open+read+close loops (req_loops.c `read`) natively and on dircache mounts of one SRC, one
# mount per variant, interleaved rounds (rotating order); medians of wall µs per op, the
# loop's CPU µs per op, the daemon's CPU µs per op (schedstat) and ratio to native
# (docs/opens.md, "Request threads' priority").
# usage: SRC=DIR (holding a file f) REQ_LOOPS=path/to/req_loops MNT_BASE=/tmp/x \
#   sched_loops.py ROUNDS N NAME=BINARY[:OPTS] ...      (native is always run, on SRC)
# Every mount is unmounted at the end, also on error.
import subprocess, sys, time, os, statistics, glob
rounds = int(sys.argv[1]); n = int(sys.argv[2])
variants = [a.split('=', 1) for a in sys.argv[3:]]
src = os.environ.get('SRC', '/tmp/sched-src'); rl = os.environ.get('REQ_LOOPS', './req_loops')
mbase = os.environ.get('MNT_BASE', '/tmp/sched-mnt')
mnts = {}; pids = {}

def mount(name, spec):
    binary, opts = spec.split(':', 1) if ':' in spec else (spec, '')
    m = f'{mbase}_{name}'; os.makedirs(m, exist_ok=True)
    subprocess.run([binary, 'mount', src, m] + (['-o', opts] if opts else []), check=True)
    mnts[name] = m
    for c in glob.glob('/proc/[0-9]*/cmdline'):
        try: argv = open(c).read().split('\0')
        except OSError: continue
        if 'mount' in argv and m in argv:
            pids[name] = int(c.split('/')[2])

def daemon_cpu(name):
    t = 0
    for f in glob.glob(f'/proc/{pids.get(name, 0)}/task/*/schedstat'):
        try: t += int(open(f).read().split()[0])
        except OSError: pass
    return t

def run(name):
    d = mnts.get(name, src); c0 = daemon_cpu(name)
    o = subprocess.run([rl, 'read', d, str(n)], capture_output=True, text=True, check=True).stdout.split()
    return float(o[0]), float(o[3]), (daemon_cpu(name) - c0) / 1e3 / n

res = {}
names = ['native'] + [v[0] for v in variants]
try:
    for name, spec in variants: mount(name, spec)
    for name in names: run(name)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            res.setdefault(name, []).append(run(name))
finally:
    for m in mnts.values(): subprocess.run(['umount', m])
nat = statistics.median(x[0] for x in res['native'])
row = ''
for name in names:
    v = res[name]
    w = statistics.median(x[0] for x in v); c = statistics.median(x[1] for x in v)
    dc = statistics.median(x[2] for x in v)
    row += f' | {name} {w:.1f}us {w / nat:.2f}x cpu {c:.1f}+{dc:.1f}us'
print(f'open+read x{n}:{row}')
print('load', open('/proc/loadavg').read().strip())
