#!/bin/bash
# usage: persist-bench.sh BIN TREE ROUNDS [EXTRA_OPTS]   (as root; mounts on /tmp/persist-mnt,
# snapshot in /tmp/persist-snap: run it once first to write the snapshot)
# Interleaved rounds: cold (fresh mount, no snapshot), persist (fresh mount + snapshot),
# warm (second run on one mount), native. Prints: round workload mode ms requests
# backend_readdir backend_lookup backend_getattr daemon_cpu_ms
B=$1; T=$2; R=${3:-5}; X=${4:+,$4}; M=/tmp/persist-mnt; S=/tmp/persist-snap
ms() { echo $(( ($2-$1)/1000000 )); }
mnt() { DIRCACHE_LOG=info $B mount -f $T $M -o "nonempty$1$X" 2>>/tmp/persist-daemon.log &
  for i in $(seq 1 400); do mountpoint -q $M && break; sleep 0.05; done
  PID=$($B stats $M --json | python3 -c "import json,sys; print(json.load(sys.stdin)['pid'])"); }
umnt() { umount $M; while kill -0 $PID 2>/dev/null; do sleep 0.05; done; }
cpu() { awk '{print ($14+$15)*10}' /proc/$PID/stat; }
reqs() { $B stats $M --json | python3 -c "
import json,sys; d=json.load(sys.stdin); k=d['kernel_requests']; c=d['core']
tot=k.get('total', sum(v for v in k.values() if isinstance(v,int)))
print(tot, c.get('backend_readdir'), c.get('backend_lookup'), c.get('backend_getattr'))"; }
run() { case $1 in find) find $2 -name zzz >/dev/null;; du) du -s $2 >/dev/null;; esac; }
for r in $(seq 1 $R); do
 for w in find du; do
  for mode in cold persist warm native; do
   case $mode in
    native) s=$(date +%s%N); run $w $T; e=$(date +%s%N); echo "$r $w native $(ms $s $e)";;
    cold) mnt ""; c0=$(cpu); s=$(date +%s%N); run $w $M; e=$(date +%s%N); echo "$r $w cold $(ms $s $e) $(reqs) cpu=$(( $(cpu)-c0 ))"; umnt;;
    persist) mnt ",persist=$S"; c0=$(cpu); s=$(date +%s%N); run $w $M; e=$(date +%s%N); echo "$r $w persist $(ms $s $e) $(reqs) cpu=$(( $(cpu)-c0 ))"; umnt;;
    warm) mnt ""; run $w $M; x=$(reqs | cut -d' ' -f1); c0=$(cpu); s=$(date +%s%N); run $w $M; e=$(date +%s%N); y=$(reqs | cut -d' ' -f1); echo "$r $w warm $(ms $s $e) $((y-x)) (requests in the warm run) cpu=$(( $(cpu)-c0 ))"; umnt;;
   esac
  done
 done
done
