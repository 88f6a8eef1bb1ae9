# Interleaved micro-benchmark of opens and creating workloads (docs/opens.md): a native
# directory against dircache mounts, rounds in rotating order, median us/op, ratio to
# native and FUSE requests per op (from `dircache stats --json`; $DIRCACHE names the binary).
# usage: opens_micro.py ROUNDS native=DIR NAME=MNT [NAME=MNT ...]
import os, sys, time, json, subprocess, statistics
rounds = int(sys.argv[1])
systems = [a.split('=', 1) for a in sys.argv[2:]]
BIN = os.environ.get('DIRCACHE', 'dircache')

def reqs(name, d):
    if name == 'native':
        return None
    o = subprocess.run([BIN, 'stats', '--json', d], capture_output=True, text=True)
    try:
        return json.loads(o.stdout)['kernel_requests']['total']
    except Exception:
        j = json.loads(o.stdout)
        return j.get('stats', j)['kernel_requests']['total']

def prep(d):
    w = os.path.join(d, 'mb')
    os.makedirs(w, exist_ok=True)
    with open(os.path.join(w, 'small'), 'wb') as f:
        f.write(b'x' * 100)
    with open(os.path.join(w, 'log'), 'wb') as f:
        pass
    os.makedirs(os.path.join(w, 'tmp'), exist_ok=True)
    return w

def openread(w, n):
    p = os.path.join(w, 'small')
    for _ in range(n):
        fd = os.open(p, os.O_RDONLY); os.read(fd, 4096); os.close(fd)

def openclose(w, n):
    p = os.path.join(w, 'small')
    for _ in range(n):
        os.close(os.open(p, os.O_RDONLY))

def append_open(w, n):
    p = os.path.join(w, 'log')
    for _ in range(n):
        fd = os.open(p, os.O_WRONLY | os.O_APPEND); os.write(fd, b'abc\n'); os.close(fd)

def append_fd(w, n):
    fd = os.open(os.path.join(w, 'log'), os.O_WRONLY | os.O_APPEND)
    for _ in range(n):
        os.write(fd, b'abc\n')
    os.close(fd)

def create(w, n):
    t = os.path.join(w, 'tmp')
    names = []
    for i in range(n):
        p = os.path.join(t, 'f%d_%d' % (os.getpid(), i))
        fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644); os.write(fd, b'0123456789'); os.close(fd)
        names.append(p)
    return names

WL = [('open+close', openclose, 20000), ('open+read+close 100B', openread, 20000),
      ('append open+write+close 4B', append_open, 2000), ('append write 4B same fd', append_fd, 20000),
      ('create+write+close', create, 2000)]
ws = {name: prep(d) for name, d in systems}
for name, f, n in WL:
    for s, d in systems:  # warm-up
        r = f(ws[s], min(n, 200))
        if isinstance(r, list):
            for p in r: os.unlink(p)
    t = {s: [] for s, _ in systems}; q = {s: [] for s, _ in systems}
    for r in range(rounds):
        order = systems[r % len(systems):] + systems[:r % len(systems)]
        for s, d in order:
            a = reqs(s, d); t0 = time.perf_counter(); res = f(ws[s], n); dt = time.perf_counter() - t0
            b = reqs(s, d)
            t[s].append(dt / n * 1e6)
            if a is not None: q[s].append((b - a) / n)
            if isinstance(res, list):
                for p in res: os.unlink(p)
    nat = statistics.median(t['native'])
    row = '%-28s' % name
    for s, _ in systems:
        m = statistics.median(t[s])
        row += ' | %s %.2f us' % (s, m)
        if s != 'native':
            row += ' %.2fx req/op %.2f' % (m / nat, statistics.median(q[s]))
    print(row, flush=True)
