#!/bin/bash
# open+read of a cached 1 MB file at 5 ms RTT (2.5 ms each way through dircache delay-proxy,
# real sshd on loopback): native vs remote mount with containers vs -o nocontainers.
set -eu
BIN=${1:-${BIN:-target/release/dircache}}; BIN=$(realpath "$BIN")
D=$(mktemp -d /tmp/bench-containers.XXXX); chmod 755 $D
cleanup() {
  for m in $D/mnt1 $D/mnt2; do umount $m 2>/dev/null || umount -l $m 2>/dev/null || true; done
  for p in $(cat $D/pids 2>/dev/null); do kill $p 2>/dev/null || true; done
  [ -f $D/sshd.pid ] && kill $(cat $D/sshd.pid) 2>/dev/null || true
  sleep 0.5; rm -rf $D
}
trap cleanup EXIT
mkdir -p $D/src $D/native $D/mnt1 $D/mnt2 $D/cache1 $D/cache2; chmod 700 $D/cache1 $D/cache2
head -c 1000000 /dev/urandom > $D/src/f; cp $D/src/f $D/native/f
ssh-keygen -q -t ed25519 -N '' -f $D/hostkey; ssh-keygen -q -t ed25519 -N '' -f $D/id
cp $D/id.pub $D/authorized_keys
PORT=$((20000 + RANDOM % 20000))
cat > $D/sshd_config <<C
Port $PORT
ListenAddress 127.0.0.1
HostKey $D/hostkey
AuthorizedKeysFile $D/authorized_keys
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
UseDNS no
PasswordAuthentication no
PidFile $D/sshd.pid
C
/usr/sbin/sshd -D -e -f $D/sshd_config 2>$D/sshd.log & echo $! > $D/sshd.pid
sleep 1
OPTS="port=$PORT,IdentityFile=$D/id,IdentitiesOnly=yes,StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,BatchMode=yes,serve_command=$BIN,ProxyCommand=$BIN delay-proxy --delay-ms 2.5 %h:%p"
DIRCACHE_LOG=dircache_remote::client=trace NO_COLOR=1 $BIN mount -f root@127.0.0.1:$D/src $D/mnt1 -o "$OPTS,cache_dir=$D/cache1" 2>$D/log1 & echo $! >> $D/pids
DIRCACHE_LOG=dircache_remote::client=trace NO_COLOR=1 $BIN mount -f root@127.0.0.1:$D/src $D/mnt2 -o "$OPTS,nocontainers" 2>$D/log2 & echo $! >> $D/pids
for m in $D/mnt1 $D/mnt2; do for i in $(seq 100); do mountpoint -q $m && break; sleep 0.1; done; done
python3 - $D <<'P'
import os, sys, time, statistics
D = sys.argv[1]
paths = {"native": f"{D}/native/f", "containers": f"{D}/mnt1/f", "nocontainers": f"{D}/mnt2/f"}
logs = {"containers": f"{D}/log1", "nocontainers": f"{D}/log2"}
def calls(k):
    return sum(1 for l in open(logs[k]) if "remote call" in l) if k in logs else 0
def once(p):
    t = time.perf_counter()
    fd = os.open(p, os.O_RDONLY)
    n = 0
    while True:
        b = os.read(fd, 1 << 20)
        if not b: break
        n += len(b)
    os.close(fd)
    assert n == 1000000
    return time.perf_counter() - t
for k, p in paths.items(): once(p); once(p)  # warm
res = {k: [] for k in paths}; rts = {k: [] for k in paths}
for r in range(15):
    for k, p in paths.items():
        c0 = calls(k); res[k].append(once(p)); rts[k].append(calls(k) - c0)
nat = statistics.median(res["native"])
for k in paths:
    m = statistics.median(res[k])
    print(f"open+read 1 MB cached  {k:13s} median {m*1e3:8.3f} ms  ({m/nat:6.2f}x native)  round trips/run median {statistics.median(rts[k])}")
P
