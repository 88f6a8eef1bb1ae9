#!/usr/bin/env python3
# Side by side: a native directory, a mount by dircache binary BASE and one by NEW, on the same
# file system; interleaved rounds (order rotated), medians, FUSE requests per operation from
# each daemon's counters (FORGET left out). docs/opens.md, "The cost of each request".
# usage: req_side.py ROUNDS BASE NEW TARBALL REQ_LOOPS   (REQ_LOOPS: req_loops.c, built)
import json, os, shutil, statistics, subprocess, sys, time
R = int(sys.argv[1]); bins = {'base': sys.argv[2], 'new': sys.argv[3]}
TAR, RT = sys.argv[4], sys.argv[5]
W = os.path.join(os.environ.get('TMPDIR', '/tmp'), 'req-side-%d' % os.getpid())
shutil.rmtree(W, ignore_errors=True); os.makedirs(W)
dirs = {'native': f'{W}/native'}
os.makedirs(dirs['native'])
mounts = []
try:
    for name, b in bins.items():
        src, mnt = f'{W}/src-{name}', f'{W}/mnt-{name}'
        os.makedirs(src); os.makedirs(mnt)
        subprocess.run([b, 'mount', src, mnt], check=True)
        mounts.append((b, mnt)); dirs[name] = mnt
    for d in dirs.values():
        with open(f'{d}/f', 'w') as f: f.write('hello\n')
    def reqs(name):
        if name == 'native': return 0
        o = subprocess.run([bins[name], 'stats', '--json', dirs[name]], capture_output=True, text=True).stdout
        k = json.loads(o)['kernel_requests']['by_kind']
        return sum(v for kk, v in k.items() if kk not in ('forget', 'batch_forget'))
    def rt(mode, n):
        def f(d):
            o = subprocess.run([RT, mode, d, str(n)], capture_output=True, text=True, check=True).stdout
            return float(o.split()[0]) * n / 1e6
        return f
    def sh(cmd):
        def f(d):
            t = time.perf_counter(); subprocess.run(['sh', '-c', cmd.format(d=d)], check=True); return time.perf_counter() - t
        return f
    work = [
        ('open+close x2000', rt('open', 2000), 2000),
        ('ioctl TCGETS x2000', rt('ioctl', 2000), 2000),
        ('statx FORCE_SYNC x2000', rt('getattr', 2000), 2000),
        ('lookup missing x2000', rt('lookupneg', 2000), 2000),
        ('create+close x500 (+untimed unlink)', rt('create', 500), 500),
        ('mkstemp x500', rt('mkstemp', 500), 500),
        ('tar xf', sh(f'mkdir {{d}}/x && tar xf {TAR} -C {{d}}/x'), None),
        ('cp -r', sh('cp -r {d}/x {d}/y'), None),
        ('rm -r', sh('rm -r {d}/x {d}/y'), None),
    ]
    nfiles = int(subprocess.run(['sh', '-c', f'tar tf {TAR} | grep -v /$ | wc -l'], capture_output=True, text=True).stdout)
    res = {(w[0], s): [] for w in work for s in dirs}
    rq = {(w[0], s): [] for w in work for s in dirs}
    order = list(dirs)
    for r in range(R):
        order = order[1:] + order[:1]
        for name, fn, per in work:
            for s in order:
                subprocess.run(['sync'])
                q0 = reqs(s); t = fn(dirs[s]); q1 = reqs(s)
                res[(name, s)].append(t); rq[(name, s)].append(q1 - q0)
    print(f'{R} interleaved rounds, medians; load {open("/proc/loadavg").read().split()[:3]}; tar: {nfiles} files')
    for name, fn, per in work:
        n = per or nfiles
        nat = statistics.median(res[(name, 'native')])
        line = f'{name:26s} native {nat/n*1e6:9.2f} us/op'
        for s in ('base', 'new'):
            m = statistics.median(res[(name, s)])
            line += f' | {s} {m/n*1e6:9.2f} us/op {m/nat:5.2f}x req/op {statistics.median(rq[(name, s)])/n:5.2f}'
        print(line, flush=True)
finally:
    for b, mnt in mounts:
        subprocess.run([b, 'umount', mnt])
    shutil.rmtree(W, ignore_errors=True)
