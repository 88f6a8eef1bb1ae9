#!/usr/bin/env python3
# usage: req_cpu.py ROUNDS BASE NEW TARBALL REQ_LOOPS  (dircache binaries; REQ_LOOPS: req_loops.c, built)
# CPU time of the request threads (fuser-*) per request, from /proc/PID/task/TID/schedstat (ns
# on CPU): load on the machine delays requests but does not add to their CPU time.
import os, statistics, subprocess, sys, shutil, json
R = int(sys.argv[1]); bins = {'base': sys.argv[2], 'new': sys.argv[3]}; TAR, RT = sys.argv[4], sys.argv[5]
W = os.path.join(os.environ.get("TMPDIR", "/tmp"), "req-cpu-%d" % os.getpid())
mnts = {}
def pid_of(mnt):
    o = subprocess.run([bins[s_of[mnt]], 'stats', '--json', mnt], capture_output=True, text=True).stdout
    return json.loads(o)['pid']
s_of = {}
try:
    for s, b in bins.items():
        os.makedirs(f'{W}/src-{s}'); os.makedirs(f'{W}/mnt-{s}')
        subprocess.run([b, 'mount', f'{W}/src-{s}', f'{W}/mnt-{s}'], check=True)
        mnts[s] = f'{W}/mnt-{s}'; s_of[mnts[s]] = s
        open(f'{mnts[s]}/f', 'w').write('hello\n')
    pids = {s: pid_of(m) for s, m in mnts.items()}
    def cpu(s):
        p = pids[s]; t = 0
        for tid in os.listdir(f'/proc/{p}/task'):
            if open(f'/proc/{p}/task/{tid}/comm').read().startswith('fuser'):
                t += int(open(f'/proc/{p}/task/{tid}/schedstat').read().split()[0])
        return t
    def reqs(s):
        o = subprocess.run([bins[s], 'stats', '--json', mnts[s]], capture_output=True, text=True).stdout
        k = json.loads(o)['kernel_requests']['by_kind']
        return sum(v for kk, v in k.items() if kk != 'forget')
    work = [('open+close x5000', lambda d: [RT, 'open', d, '5000']),
            ('statx FORCE_SYNC x5000', lambda d: [RT, 'getattr', d, '5000']),
            ('mkstemp x500', lambda d: [RT, 'mkstemp', d, '500']),
            ('tar xf (229 files)', lambda d: ['sh', '-c', f'rm -rf {d}/x; mkdir {d}/x && tar xf {TAR} -C {d}/x']),
            ('rm -r (229 files)', lambda d: ['rm', '-r', f'{d}/x'])]
    res = {}
    order = list(mnts)
    for r in range(R):
        order = order[::-1]
        for name, cmd in work:
            for s in order:
                c0, q0 = cpu(s), reqs(s)
                subprocess.run(cmd(mnts[s]), check=True, stdout=subprocess.DEVNULL)
                c1, q1 = cpu(s), reqs(s)
                res.setdefault((name, s), []).append(((c1 - c0) / 1e3, q1 - q0))
    print(f'{R} interleaved rounds, medians; load {open("/proc/loadavg").read().split()[:3]}')
    for name, _ in work:
        line = f'{name:24s}'
        for s in mnts:
            v = res[(name, s)]
            per = statistics.median(c / q for c, q in v)
            line += f' | {s} {per:6.2f} us CPU per request ({statistics.median(q for _, q in v)} req)'
        print(line)
finally:
    for s, m in mnts.items():
        subprocess.run([bins[s], 'umount', m])
    shutil.rmtree(W, ignore_errors=True)
