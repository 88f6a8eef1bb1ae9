#!/bin/bash
# Daemon syscalls and CPU per request of creating workloads, two dircache binaries side by side.
#
#   crates/fuse/scripts/create_syscalls.sh ROUNDS BASE_BIN NEW_BIN TARBALL
#
# Mounts an empty directory with each binary (/tmp/create-syscalls-{base,new}-{src,mnt}) and runs,
# in interleaved rounds (order alternating), `tar xf TARBALL`, `rm -r` of that tree and 500
# mkstemp+close+unlink (Python) on each. Per run: wall time, FUSE requests (`dircache stats`),
# CPU of the request threads (fuser-*), of the change feed's reader (dircache-watch) and of the
# rest (schedstat), and the daemon's syscalls (`perf stat -e raw_syscalls:sys_enter -p PID`).
# Needs root, perf and tar. Unmounts both at the end.
set -u
R=$1; B=$2; N=$3; TAR=$4
for s in base new; do mkdir -p /tmp/create-syscalls-$s-src /tmp/create-syscalls-$s-mnt; done
"$B" mount /tmp/create-syscalls-base-src /tmp/create-syscalls-base-mnt || exit 1
"$N" mount /tmp/create-syscalls-new-src /tmp/create-syscalls-new-mnt || exit 1
trap 'fusermount3 -u /tmp/create-syscalls-base-mnt; fusermount3 -u /tmp/create-syscalls-new-mnt' EXIT
sleep 1
pid_of() { pgrep -f "dircache mount /tmp/create-syscalls-$1-src" | head -1; }
PB=$(pid_of base); PN=$(pid_of new)
MK=$(mktemp /tmp/create-syscalls-mk.XXXXXX.py)
cat > "$MK" <<'P'
import os, sys, tempfile
for i in range(int(sys.argv[2])):
    fd, p = tempfile.mkstemp(dir=sys.argv[1]); os.close(fd); os.unlink(p)
P
cpu() {
  local f=0 w=0 n=0 c
  for t in /proc/$1/task/*; do
    c=$(cut -d' ' -f1 "$t/schedstat" 2>/dev/null || echo 0)
    case $(cat "$t/comm" 2>/dev/null) in
      fuser-*) f=$((f + c)) ;; dircache-watch) w=$((w + c)) ;; *) n=$((n + c)) ;;
    esac
  done
  echo "$f $w $n"
}
req() { "$N" stats "$1" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["kernel_requests"]["total"])'; }
run() {
  local s=$1 w=$2 P M cmd
  [ "$s" = base ] && P=$PB || P=$PN
  M=/tmp/create-syscalls-$s-mnt
  case $w in
    tar) cmd="tar xf $TAR -C $M" ;;
    rm) tar xf "$TAR" -C "$M"; sleep 0.2; cmd="rm -r $(ls -d $M/* | tr '\n' ' ')" ;;
    mkstemp) cmd="python3 $MK $M 500" ;;
  esac
  local r0 r1 f0 w0 n0 f1 w1 n1 t0 t1 sc
  r0=$(req "$M"); read -r f0 w0 n0 < <(cpu "$P"); t0=$(date +%s%N)
  perf stat -e raw_syscalls:sys_enter -p "$P" -x, -o /tmp/create-syscalls-perf.txt -- $cmd >/dev/null 2>&1
  t1=$(date +%s%N); read -r f1 w1 n1 < <(cpu "$P"); r1=$(req "$M")
  sc=$(grep raw_syscalls /tmp/create-syscalls-perf.txt | cut -d, -f1)
  echo "$w $s wall_ms $(((t1 - t0) / 1000000)) req $((r1 - r0)) fuser_us $(((f1 - f0) / 1000))" \
    "watch_us $(((w1 - w0) / 1000)) other_us $(((n1 - n0) / 1000)) syscalls $sc"
  if [ "$w" = tar ]; then rm -rf "${M:?}"/*; fi
}
for i in $(seq "$R"); do
  for w in tar rm mkstemp; do
    if [ $((i % 2)) = 0 ]; then run base $w; run new $w; else run new $w; run base $w; fi
  done
done
rm -f "$MK"
