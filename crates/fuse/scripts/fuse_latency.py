#!/usr/bin/env python3
# FUSE requests of one command on one mount, by kind, with the kernel's round-trip time of
# each (from the kernel's fuse:fuse_request_send / fuse:fuse_request_end tracepoints, recorded
# by `perf record`: the time from queueing a request to the daemon's reply, so the daemon's
# time per request plus its queueing). Needs root and perf. Other mounts are filtered out by
# the connection (the mount's device number).
# usage: fuse_latency.py MNT [--per N] -- COMMAND [ARGS...]
#   --per N: also print requests per N (e.g. the number of files the command creates)
import os, re, statistics, subprocess, sys, tempfile

args = sys.argv[1:]
if '--' not in args or not args:
    sys.exit(__doc__ or 'usage: fuse_latency.py MNT [--per N] -- COMMAND [ARGS...]')
sep = args.index('--')
opts, cmd = args[:sep], args[sep + 1:]
mnt = opts[0]
per = int(opts[opts.index('--per') + 1]) if '--per' in opts else None
conn = os.minor(os.stat(mnt).st_dev) | (os.major(os.stat(mnt).st_dev) << 20)
with tempfile.TemporaryDirectory() as d:
    data = os.path.join(d, 'perf.data')
    flt = 'connection == %d' % conn
    rec = subprocess.Popen(['perf', 'record', '-q', '-a', '-o', data,
                            '-e', 'fuse:fuse_request_send', '--filter', flt,
                            '-e', 'fuse:fuse_request_end', '--filter', flt],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    # perf needs a moment to enable the events: wait for the file's header.
    import time
    t0 = time.time()
    while not os.path.exists(data) and time.time() - t0 < 10:
        time.sleep(0.05)
    time.sleep(0.5)
    t = time.perf_counter()
    rc = subprocess.run(cmd).returncode
    wall = time.perf_counter() - t
    time.sleep(0.2)
    rec.send_signal(2)
    rec.wait()
    out = subprocess.run(['perf', 'script', '-i', data, '-F', 'time,event,trace'],
                         capture_output=True, text=True).stdout
sent, lat = {}, {}
pat = re.compile(r'([\d.]+):\s+fuse:(fuse_request_\w+):\s+connection \d+ req (\d+)(?: opcode \d+ \((\w+)\))?')
for line in out.splitlines():
    m = pat.search(line)
    if not m:
        continue
    ts, ev, uniq, op = float(m.group(1)), m.group(2), m.group(3), m.group(4)
    if ev == 'fuse_request_send':
        sent[uniq] = (ts, op.replace('FUSE_', '').lower())
    elif uniq in sent:
        t0, op = sent.pop(uniq)
        lat.setdefault(op, []).append((ts - t0) * 1e6)
total = sum(len(v) for v in lat.values())
print('%s: exit %d, %.4f s, %d requests%s' % (' '.join(cmd), rc, wall, total,
      (' (%.2f per unit)' % (total / per)) if per else ''))
print('%-16s %8s %8s %10s %10s %10s' % ('request', 'count', 'per', 'median us', 'mean us', 'total ms'))
for op, v in sorted(lat.items(), key=lambda kv: -sum(kv[1])):
    print('%-16s %8d %8s %10.1f %10.1f %10.1f' % (op, len(v), '%.2f' % (len(v) / per) if per else '-',
          statistics.median(v), statistics.mean(v), sum(v) / 1e3))
