#!/bin/sh
# FUSE requests by kind (the daemon's counters, FORGET left out) of tar xf, cp -r, rm -r and
# mkstemp through a mount made by dircache binary BIN (docs/opens.md, "The cost of each request").
# usage: req_counts.sh BIN TARBALL REQ_LOOPS   (REQ_LOOPS: req_loops.c, built)
B=$1; TAR=$2; RT=$3; W=${TMPDIR:-/tmp}/req-counts-$$; rm -rf $W; mkdir -p $W/src $W/mnt
$B mount $W/src $W/mnt || exit 1
trap '$B umount $W/mnt; rm -rf $W' EXIT
k() { $B stats --json $W/mnt | python3 -c "import json,sys; d=json.load(sys.stdin)['kernel_requests']['by_kind']; d.pop('forget',None); print(json.dumps(d,sort_keys=True))"; }
d() { python3 -c "import json,sys; a=json.loads(sys.argv[1]); b=json.loads(sys.argv[2]); print(sum(b.values())-sum(a.values()), {x: b[x]-a.get(x,0) for x in b if b[x]-a.get(x,0)})" "$1" "$2"; }
for r in 1 2 3; do
a=$(k); mkdir $W/mnt/x && tar xf $TAR -C $W/mnt/x; b=$(k); echo "tar xf $(d "$a" "$b")"
a=$(k); cp -r $W/mnt/x $W/mnt/y; b=$(k); echo "cp -r  $(d "$a" "$b")"
a=$(k); rm -r $W/mnt/x $W/mnt/y; b=$(k); echo "rm -r  $(d "$a" "$b")"
a=$(k); $RT mkstemp $W/mnt 200 >/dev/null; b=$(k); echo "mkstemp x200 $(d "$a" "$b")"
done
