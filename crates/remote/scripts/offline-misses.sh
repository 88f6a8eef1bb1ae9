#!/bin/bash
# Offline miss latency (docs/remote.md, "Disconnected operation"): a remote mount of a small
# tree through a stand-in ssh, the connection cut (new connections refused, the server killed
# by PID), then each command timed once. Usage: offline-misses.sh path/to/dircache
set -u
BIN=$(realpath "${1:?usage: $0 path/to/dircache}")
W=$(mktemp -d /tmp/dcmisses.XXXXXX)
cd "$W" || exit 1
mkdir src cache mnt && chmod 700 cache
mkdir -p src/d src/cold && printf one > src/d/a && printf x > src/cold/x && printf never > src/d/unread
cat > fake-ssh <<EOS
#!/bin/sh
if [ -e $W/down ]; then echo 'fake ssh: host unreachable' >&2; exit 255; fi
for last; do :; done
echo \$\$ > $W/server-pid
exec sh -c "exec \$last"
EOS
chmod 755 fake-ssh
"$BIN" mount -f "localhost:$W/src" "$W/mnt" -o "ssh_command=$W/fake-ssh,serve_command=$BIN,cache_dir=$W/cache,reconnect_timeout=10" > client.log 2>&1 &
DPID=$!
cleanup() { fusermount3 -u "$W/mnt" 2>/dev/null; wait "$DPID" 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
for _ in $(seq 100); do mountpoint -q mnt && break; sleep 0.1; done
ls mnt/d > /dev/null; cat mnt/d/a > /dev/null; stat mnt/d/missing > /dev/null 2>&1
sleep 1
touch down; kill -9 "$(cat server-pid)"; sleep 1
t() {
    local s e rc
    s=$(date +%s.%N); "$@" > /dev/null 2>&1; rc=$?; e=$(date +%s.%N)
    printf "%-28s rc=%d %6.3f s\n" "$*" "$rc" "$(echo "$e - $s" | bc)"
}
t stat mnt/d/other
t mkdir mnt/d/new
t touch mnt/d/new/f
t mv mnt/d/new/f mnt/d/new/g
t stat mnt/cold/x
t cat mnt/d/unread
t stat mnt/d/new/nothing
