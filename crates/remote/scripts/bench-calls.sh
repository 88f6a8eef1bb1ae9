#!/bin/bash
# Cold and warm times and server calls (round trips) of find, du -s and ls -lR on a remote
# mount, prefetch off and on, next to native. Root; drops caches.
# usage: bench-calls.sh BIN [WORKDIR]   (WORKDIR/tree: made by mktree.py if missing)
BIN=$(realpath $1)
HERE=$(cd $(dirname $0) && pwd)
W=${2:-/tmp/remote-bench}; mkdir -p $W; cd $W
T=$W/tree
[ -d $T ] || { mkdir -p $T && python3 $HERE/mktree.py $T; }
[ -x $W/fakessh ] || { printf '#!/bin/sh\nfor last; do :; done\nexec sh -c "exec $last"\n' > $W/fakessh; chmod +x $W/fakessh; }
mountit() { # pf logfile
  mkdir -p mnt
  DIRCACHE_LOG=info $BIN mount -f localhost:$T mnt -o ssh_command=$W/fakessh,serve_command=$BIN,subtree=$1 2> $2 &
  PID=$!
  for i in $(seq 1 500); do mountpoint -q mnt && break; sleep 0.02; done
}
unmountit() { # logfile -> echo calls
  umount mnt; wait $PID
  for i in $(seq 1 250); do grep -q "after [0-9]* calls" $1 && break; sleep 0.02; done
  grep -o "after [0-9]* calls" $1 | cut -d' ' -f2
}
timeit() { local t0=$(date +%s.%N); eval "$1" > /dev/null 2>&1; local t1=$(date +%s.%N); echo "$t1 - $t0" | bc; }
run() {
  local w=$1 cmd=$2
  sync; echo 3 > /proc/sys/vm/drop_caches
  echo "$w native cold=$(timeit "${cmd//DIR/$T}") warm=$(timeit "${cmd//DIR/$T}")"
  for pf in 0 131072; do
    mountit $pf log.a; sync; echo 3 > /proc/sys/vm/drop_caches
    local cold=$(timeit "${cmd//DIR/$W/mnt}")
    local ccold=$(unmountit log.a)
    mountit $pf log.b; sync; echo 3 > /proc/sys/vm/drop_caches
    timeit "${cmd//DIR/$W/mnt}" > /dev/null
    local warm=$(timeit "${cmd//DIR/$W/mnt}")
    local call=$(unmountit log.b)
    echo "$w remote-prefetch=$pf cold=$cold calls_cold=$ccold warm=$warm calls_warm=$((call - ccold))"
  done
}
run find "find DIR"
run du "du -s DIR"
run lsR "ls -lR DIR"
