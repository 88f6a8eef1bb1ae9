#!/usr/bin/python3
"""ByVFS (`-o bypass`) benchmark: a default dircache mount, bypass mounts and native, on a tmpfs
and on an ext4 SRC (docs/benchmarks.md, "ByVFS").

    sudo python3 bench-bypass.py DIRCACHE_BINARY [ROUNDS] [MODES]

MODES: comma-separated, of native, dircache (default options), bypass (-o bypass), bp+ttl
(-o bypass with the kernel's TTLs at one day). Tree: 100 directories of 100 files (10,000
files), generated on a tmpfs mounted under $BENCH_DIR (default /tmp/dircache-bench-bypass)
and in a directory there (that file system: ext4 here). Workloads: find -name (no match),
du -s, ls -lR, a stat loop over the 10,000 files (one python process), a create+unlink loop of
2,000 files. Cold = the first run on a fresh mount (SRC's own caches stay warm: no global
drop_caches on a shared machine; for a memory-speed SRC that is what cold means anyway); warm
= the next run on the same mount. Rounds interleaved, the order of the modes rotating; medians;
FUSE requests per run and the core's backend lookup+getattr+readdir calls from `dircache
stats`. Everything it creates is removed at the end."""
import json, os, shutil, statistics, subprocess, sys, time

BIN = sys.argv[1]
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 5
BASE = os.environ.get('BENCH_DIR', '/tmp/dircache-bench-bypass')
STATLOOP = """
import os, sys
for p in open(sys.argv[1]).read().split('\\n'):
    if p: os.lstat(p)
"""
CREATE = """
import os
os.makedirs('cu', exist_ok=True)
for i in range(2000):
    p = 'cu/x%d' % i
    open(p, 'w').close(); os.unlink(p)
os.rmdir('cu')
"""
WORK = {
    'find': ['find', '.', '-name', 'nomatch.c'],
    'du': ['du', '-s', '.'],
    'ls -lR': ['ls', '-lR', '.'],
    'stat 10k': ['python3', '-c', STATLOOP, BASE + '/files.txt'],
    'create+unlink 2k': ['python3', '-c', CREATE],
}

def sh(*a, **k):
    return subprocess.run(a, check=True, stdout=subprocess.DEVNULL, **k)

def tree(src):
    os.makedirs(src, exist_ok=True)
    names = []
    for d in range(100):
        dd = os.path.join(src, 'mod%02d' % (d // 10), 'dir%03d' % d)
        os.makedirs(dd, exist_ok=True)
        for f in range(100):
            p = os.path.join(dd, 'file%03d.c' % f)
            with open(p, 'w') as fh:
                fh.write('x' * (f * 13 % 700))
            names.append(os.path.relpath(p, src))
    return names

def run(cwd, w):
    t = time.perf_counter()
    subprocess.run(WORK[w], cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t

def requests(mnt):
    out = subprocess.run([BIN, 'stats', mnt, '--json'], capture_output=True, check=True).stdout
    v = json.loads(out)
    v = v.get('stats', v)
    return v['kernel_requests']['total'], v['core']['backend_lookup'] + v['core']['backend_getattr'] + v['core']['backend_readdir']

MODES = {'native': None, 'dircache': '', 'bypass': 'bypass', 'bp+ttl': 'bypass,entry_timeout=86400,attr_timeout=86400,negative_timeout=86400'}

def mount(src, mnt, opts):
    args = [BIN, 'mount', src, mnt]
    if opts:
        args += ['-o', opts]
    sh(*args)

def umount(mnt):
    subprocess.run(['umount', mnt], check=False)
    for _ in range(200):
        if not os.path.ismount(mnt):
            return
        time.sleep(0.05)
    subprocess.run(['umount', '-l', mnt], check=False)

def main():
    os.makedirs(BASE, exist_ok=True)
    tm = BASE + '/tmpfs'
    os.makedirs(tm, exist_ok=True)
    if not os.path.ismount(tm):
        sh('mount', '-t', 'tmpfs', '-o', 'size=512m', 'tmpfs', tm)
    srcs = {'tmpfs': tm + '/src', 'ext4': BASE + '/ext4src'}
    names = None
    for s in srcs.values():
        names = tree(s)
    with open(BASE + '/files.txt', 'w') as f:
        f.write('\n'.join(names))
    mnt = BASE + '/mnt'
    os.makedirs(mnt, exist_ok=True)
    res = {}
    modes = sys.argv[3].split(',') if len(sys.argv) > 3 else ['native', 'dircache', 'bypass']
    try:
        for r in range(ROUNDS):
            for fs, src in srcs.items():
                order = modes[r % len(modes):] + modes[:r % len(modes)]
                for m in order:
                    for w in WORK:
                        if m == 'native':
                            cold = run(src, w)
                            warm = run(src, w)
                            rq = (0, 0, 0, 0)
                        else:
                            mount(src, mnt, MODES[m])
                            try:
                                q0 = requests(mnt)
                                cold = run(mnt, w)
                                q1 = requests(mnt)
                                warm = run(mnt, w)
                                q2 = requests(mnt)
                            finally:
                                umount(mnt)
                            rq = (q1[0] - q0[0], q2[0] - q1[0], q1[1] - q0[1], q2[1] - q1[1])
                        res.setdefault((fs, m, w), []).append((cold, warm) + rq)
            print('round', r + 1, 'done', file=sys.stderr, flush=True)
    finally:
        umount(mnt)
        umount(tm)
        shutil.rmtree(BASE, ignore_errors=True)
    med = lambda xs: statistics.median(xs)
    print('load average at end:', open('/proc/loadavg').read().split()[:3])
    print('medians of %d interleaved rounds (ms); req = FUSE requests per run, be = core backend lookup+getattr+readdir calls per run' % ROUNDS)
    for fs in srcs:
        print('\n%s SRC: cold ms / warm ms (FUSE requests cold / warm; backend calls cold)' % fs)
        print('%-18s' % 'workload' + ''.join('%36s' % m for m in modes))
        for w in WORK:
            g = lambda m, i: med([x[i] for x in res[(fs, m, w)]])
            cells = []
            for m in modes:
                if m == 'native':
                    cells.append('%36s' % ('%.1f / %.1f' % (g(m, 0) * 1000, g(m, 1) * 1000)))
                else:
                    cells.append('%36s' % ('%.0f / %.0f (%d / %d; %d)' % (g(m, 0) * 1000, g(m, 1) * 1000, g(m, 2), g(m, 3), g(m, 4))))
            print('%-18s' % w + ''.join(cells))

main()
