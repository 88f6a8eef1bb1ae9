#!/usr/bin/env python3
# The cost of an open (docs/opens.md, "What an open+read costs, and where"): open+read+close
# loops of a small and a 1,000,000-byte file (req_loops.c `read`), open+close (`open`), and
# CPython's open()+read() (which adds an isatty ioctl per open), natively on SRC and on one
# local dircache mount per variant, in interleaved rounds (rotating order). Medians per op of:
# wall µs, the loop's CPU µs, the daemon's CPU µs (/proc/PID/task/*/schedstat of every daemon
# thread: what it spends, not how long it waited for a CPU), FUSE requests (`dircache stats`).
#
# usage: REQ_LOOPS=path/to/req_loops MNT_BASE=/tmp/x SRC_BASE=/tmp/y \
#   open_read_loops.py ROUNDS N NAME=BINARY[:OPTS] ...        (native is always run)
# SRC_BASE gets small/f (100 bytes) and big/f (1,000,000 bytes, below the 1 MiB page-cache
# limit of `cached_reads_max`) and huge/f (4 MiB: passthrough). Every mount is unmounted at the
# end, also on error.
import glob, json, os, statistics, subprocess, sys

rounds = int(sys.argv[1]); n = int(sys.argv[2])
variants = [a.split('=', 1) for a in sys.argv[3:]]
rl = os.environ.get('REQ_LOOPS', './req_loops')
mbase = os.environ.get('MNT_BASE', '/tmp/orl-mnt')
src = os.environ.get('SRC_BASE', '/tmp/orl-src')
modes = os.environ.get('MODES', 'open:small,read:small,read:big,read:huge,py:small').split(',')
mnts, pids, bins = {}, {}, {}

for d, size in [('small', 100), ('big', 1_000_000), ('huge', 4 << 20)]:
    os.makedirs(f'{src}/{d}', exist_ok=True)
    p = f'{src}/{d}/f'
    if not os.path.exists(p) or os.path.getsize(p) != size:
        with open(p, 'wb') as f:
            f.write(bytes((i * 31) % 251 for i in range(size)))

PY = r'''
import sys, time, resource
p = sys.argv[1] + '/f'; n = int(sys.argv[2])
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF); return r.ru_utime + r.ru_stime
t = time.monotonic(); c = cpu()
for _ in range(n):
    with open(p, 'rb') as f: f.read()
print(f'{(time.monotonic() - t) / n * 1e6:.2f} us/op cpu {(cpu() - c) / n * 1e6:.2f} us/op')
'''

def mount(name, spec):
    binary, opts = spec.split(':', 1) if ':' in spec else (spec, '')
    m = f'{mbase}_{name}'; os.makedirs(m, exist_ok=True)
    subprocess.run([binary, 'mount', src, m] + (['-o', opts.replace('+', ',')] if opts else []),
                   check=True)
    mnts[name] = m; bins[name] = binary
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

def requests(name):
    if name not in mnts: return {}
    o = subprocess.run([bins[name], 'stats', '--json', mnts[name]], capture_output=True,
                       text=True, check=True).stdout
    return json.loads(o)['kernel_requests']['by_kind']

def run(name, mode):
    kind, d = mode.split(':')
    where = f"{mnts.get(name, src)}/{d}"
    q0 = requests(name); c0 = daemon_cpu(name)
    if kind == 'py':
        cmd = [sys.executable, '-c', PY, where, str(n)]
    else:
        cmd = [rl, kind, where, str(n)]
    o = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.split()
    dc = (daemon_cpu(name) - c0) / 1e3 / n
    q1 = requests(name)
    reqs = {k: (v - q0.get(k, 0)) / n for k, v in q1.items() if v - q0.get(k, 0) > 0}
    return float(o[0]), float(o[3]), dc, reqs

names = ['native'] + [v[0] for v in variants]
res = {}
try:
    for name, spec in variants: mount(name, spec)
    for mode in modes:
        for name in names: run(name, mode)
    for r in range(rounds):
        for mode in modes:
            for name in names[r % len(names):] + names[:r % len(names)]:
                res.setdefault((mode, name), []).append(run(name, mode))
finally:
    for m in mnts.values(): subprocess.run(['umount', m])
for mode in modes:
    nat = statistics.median(x[0] for x in res[(mode, 'native')])
    row = f'{mode} x{n}:'
    for name in names:
        v = res[(mode, name)]
        w = statistics.median(x[0] for x in v); c = statistics.median(x[1] for x in v)
        dc = statistics.median(x[2] for x in v)
        kinds = {}
        for x in v:
            for k, q in x[3].items(): kinds.setdefault(k, []).append(q)
        req = ' '.join(f'{k} {statistics.median(q):.2f}' for k, q in sorted(kinds.items())
                       if statistics.median(q) >= 0.01)
        row += f' | {name} {w:.1f}us {w / nat:.2f}x cpu {c:.1f}'
        if name != 'native': row += f'+{dc:.1f}us req/op [{req}]'
        else: row += 'us'
    print(row)
print('load', open('/proc/loadavg').read().strip())
