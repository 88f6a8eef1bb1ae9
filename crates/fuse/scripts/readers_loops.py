#!/usr/bin/env python3
# Serial and parallel request loops on dircache mounts of one SRC, one mount per variant,
# interleaved rounds (rotating order), medians of: wall µs per op, daemon CPU µs per op, daemon
# timeslices (schedstat: times put on a CPU, ~ wake-ups) per op.
# usage: SRC=DIR (holding a file f) REQ_LOOPS=path/to/req_loops (req_loops.c) MNT_BASE=/tmp/x \
#   readers_loops.py ROUNDS N NAME=BINARY[:OPTS] ...   (issue 9, docs/opens.md)
# Every mount is unmounted at the end, also on error.
import subprocess, sys, time, os, statistics, glob
rounds=int(sys.argv[1]); n=int(sys.argv[2]); variants=[a.split('=',1) for a in sys.argv[3:]]
src=os.environ.get('SRC','/tmp/readers-src'); rl=os.environ.get('REQ_LOOPS','./req_loops'); mbase=os.environ.get('MNT_BASE','/tmp/readers-mnt')
mnts={}; pids={}
def mount(name,spec):
    binary,opts=spec.split(':',1) if ':' in spec else (spec,'')
    m=f'{mbase}_{name}'; os.makedirs(m,exist_ok=True)
    cmd=[binary,'mount',src,m]+(['-o',opts] if opts else [])
    subprocess.run(cmd,check=True); mnts[name]=m
    out=subprocess.run(['pgrep','-f',f'mount {src} {m}( |$)'],capture_output=True,text=True).stdout.split()
    pids[name]=int(out[0])
def sched(pid):
    cpu=sl=0
    for f in glob.glob(f'/proc/{pid}/task/*/schedstat'):
        try: a=open(f).read().split()
        except OSError: continue
        cpu+=int(a[0]); sl+=int(a[2])
    return cpu,sl
def run(name,mode,k):
    m=mnts[name]; c0,s0=sched(pids[name]); t=time.monotonic()
    ps=[subprocess.Popen([rl,mode,m,str(n)],stdout=subprocess.PIPE) for _ in range(k)]
    for p in ps: p.wait()
    w=(time.monotonic()-t)*1e6/(n*k); c1,s1=sched(pids[name])
    return w,(c1-c0)/1e3/(n*k),(s1-s0)/(n*k)
res={}
tests=[('open',1),('open',2),('getattr',1),('getattr',2)]
try:
    for name,spec in variants: mount(name,spec)
    for name in mnts: run(name,'open',1)
    for r in range(rounds):
        order=variants[r%len(variants):]+variants[:r%len(variants)]
        for mode,k in tests:
            for name,_ in order:
                res.setdefault((mode,k,name),[]).append(run(name,mode,k))
finally:
    for m in mnts.values(): subprocess.run(['umount',m])
for mode,k in tests:
    row=f'{mode:8} x{k}:'
    for name,_ in variants:
        v=res[(mode,k,name)]
        w=statistics.median(x[0] for x in v); c=statistics.median(x[1] for x in v); s=statistics.median(x[2] for x in v)
        row+=f' | {name} {w:.1f}us cpu {c:.1f}us slices {s:.2f}'
    print(row)
print('load',open('/proc/loadavg').read().strip())
