#!/bin/bash
# usage: warm-bench.sh BIN TREE [ROUNDS]   (as root; mounts TREE on a temporary directory)
# Interleaved rounds of: a fresh mount + `dircache warm` then `find` and `du -s`; a fresh mount
# without warm then `find` and `du -s`. Prints each run's time and the FUSE requests it cost,
# by kind, counted on the daemon's control socket (asked directly: no getxattr of the mount
# root, so counting costs no request); a run during which anyone dropped the kernel's caches
# is marked DISTURBED. docs/core.md, "A view of the cache".
B=$1; SRC=$2; R=${3:-3}
M=$(mktemp -d /tmp/warm-bench.XXXX); mkdir "$M/mnt"
trap 'mountpoint -q "$M/mnt" && $B umount "$M/mnt"; rm -rf "$M"' EXIT
req() {
  python3 - "$SOCK" <<'PY'
import json, socket, struct, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
b = json.dumps({"op": "stats"}).encode(); s.sendall(struct.pack(">I", len(b)) + b)
def rd(n):
    d = b""
    while len(d) < n:
        d += s.recv(n - len(d))
    return d
n = struct.unpack(">I", rd(4))[0]
print(json.dumps(json.loads(rd(n))["stats"]["kernel_requests"]["by_kind"]))
PY
}
delta() { python3 -c "import json,sys; a=json.loads(sys.argv[1]); b=json.loads(sys.argv[2]); d={k:b[k]-a.get(k,0) for k in b if b[k]-a.get(k,0)}; print(sum(d.values()), d)" "$1" "$2"; }
# Caches dropped by anyone since the last mount (drop_caches): such a run is disturbed.
drops() { awk '/^drop_slab /{print $2}' /proc/vmstat; }
timed() { local a t0 t1 b; a=$(req); t0=$(date +%s%N); "$@" >/dev/null; t1=$(date +%s%N); b=$(req)
  echo "$(( (t1-t0)/1000000 )) ms, requests $(delta "$a" "$b")$([ "$(drops)" != "$D0" ] && echo ' DISTURBED (caches dropped)')"; }
for r in $(seq 1 "$R"); do
  for mode in warm cold; do
    D0=$(drops)
    $B mount "$SRC" "$M/mnt" -o "log=$M/log" || exit 1
    SOCK=$(getfattr --only-values -n user.dircache.socket "$M/mnt" 2>/dev/null)
    if [ $mode = warm ]; then
      echo "round $r warm:  $($B warm "$M/mnt" --json | python3 -c 'import json,sys; s=json.load(sys.stdin); print(s["dirs"], "dirs", s["files"], "files,", "%.0f ms," % (1000 * s["seconds"]), s["fuse_requests"], "requests")')"
    fi
    echo "round $r $mode find: $(timed find "$M/mnt")"
    echo "round $r $mode du:   $(timed du -s "$M/mnt")"
    $B umount "$M/mnt"
  done
done
