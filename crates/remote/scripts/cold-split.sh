#!/bin/bash
# Where a cold remote walk's wall time goes (issue 10): for each workload, on a remote mount
# through a stand-in ssh (no added RTT, one machine), as root (drops caches):
#   cold       fresh mount, `echo 3 > drop_caches`, the workload at once (the mount's bulk
#              subtree call overlaps it, as in `dircache bench remote`);
#   bulk       how long that bulk call took on the client (first frame sent to last stored);
#   client     the same workload again once the bulk call is over, after `echo 2 >
#              drop_caches` (the kernel forgets dentries and inodes; the daemon's core cache
#              keeps what came in bulk, so no round trip): the client's FUSE walk alone;
#   native     the workload on the tree itself after `echo 3 > drop_caches`;
# plus CPU seconds (user+sys) of the client daemon and the server during the cold run.
# usage: cold-split.sh BIN TREE [ROUNDS]    (TREE: e.g. made by mktree.py)
set -u
BIN=$(realpath "$1"); T=$(realpath "$2"); ROUNDS=${3:-3}
W=$(mktemp -d /tmp/cold-split.XXXXXX); M=$W/mnt; mkdir -p $M
printf '#!/bin/sh\nfor last; do :; done\nexec sh -c "exec $last"\n' > $W/fakessh; chmod +x $W/fakessh
PID=
cleanup() { mountpoint -q $M && umount $M; [ -n "$PID" ] && wait $PID 2>/dev/null; rm -rf $W; }
trap cleanup EXIT
cpu() { awk '{printf "%.2f", ($14+$15)/100}' /proc/$1/stat 2>/dev/null; }
secs() { local t0=$(date +%s.%N); eval "$1" > /dev/null 2>&1; echo "$(date +%s.%N) - $t0" | bc; }
mountit() {
  DIRCACHE_LOG=info,dircache_remote::client::bulk=debug $BIN mount -f localhost:$T $M \
    -o ssh_command=$W/fakessh,serve_command=$BIN 2> $W/log &
  PID=$!
  for i in $(seq 1 1000); do mountpoint -q $M && return; sleep 0.01; done
  echo "mount failed: $(cat $W/log)"; exit 1
}
unmountit() { umount $M; wait $PID; PID=; }
bulk_secs() { grep -o 'bulk call for "": .* in [0-9.]* s' $W/log | grep -o '[0-9.]* s$' | cut -d' ' -f1; }
for w in "find DIR" "du -s DIR" "ls -lR DIR"; do
  for r in $(seq 1 $ROUNDS); do
    sync; echo 3 > /proc/sys/vm/drop_caches
    nat=$(secs "${w//DIR/$T}")
    sync; echo 3 > /proc/sys/vm/drop_caches
    mountit
    SPID=$(pgrep -P $PID | head -1)
    cold=$(secs "${w//DIR/$M}")
    ccpu=$(cpu $PID); scpu=$(cpu $SPID)
    for i in $(seq 1 3000); do [ -n "$(bulk_secs)" ] && break; sleep 0.01; done
    echo 2 > /proc/sys/vm/drop_caches
    client=$(secs "${w//DIR/$M}")
    echo "${w% DIR} round $r: native $nat s, cold $cold s, bulk $(bulk_secs) s, client walk $client s, cpu client $ccpu s server $scpu s"
    unmountit
  done
done
