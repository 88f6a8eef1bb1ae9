#!/usr/bin/env bash
# Build libfuse's example `passthrough_hp` (a FUSE peer for `dircache bench apps --systems
# ...,passthrough_hp`; Debian packages no binary of it) from Debian's source package of the
# installed libfuse3, against the installed libfuse3.so.3, into DIR (default
# /tmp/passthrough_hp). Then: PATH=DIR:$PATH dircache bench apps --systems ...,passthrough_hp
#
# The source comes through apt with a deb-src entry in a private apt configuration under
# DIR (the system's sources and lists are not touched). The headers are the tarball's:
# libfuse3-dev may not be installable next to the system's libraries.
#
# passthrough_hp keeps one descriptor per inode the kernel holds: with this machine's hard
# limit of 20,000 open files (which the process cannot raise), it fails with EMFILE on trees
# past ~20k entries (docs/benchmarks.md, "Cold walks: where the time goes per walk").
set -euo pipefail
dir=${1:-/tmp/passthrough_hp}
mkdir -p "$dir/apt/parts" "$dir/apt/lists/partial" "$dir/apt/cache" "$dir/src"
dir=$(cd "$dir" && pwd)

ver=$(dpkg-query -W -f='${source:Version}' libfuse3-3 2>/dev/null || true)
[ -n "$ver" ] || { echo "libfuse3-3 is not installed (apt-get install fuse3)" >&2; exit 1; }
# The system's own Debian entries, as deb-src.
for f in /etc/apt/sources.list.d/*.sources; do
    [ -e "$f" ] || continue
    awk -v RS= -v ORS='\n\n' '/debian-archive-keyring/ { sub(/Types: deb/, "Types: deb-src"); print }' "$f"
done >"$dir/apt/parts/src.sources"
if [ -f /etc/apt/sources.list ]; then
    sed -n 's/^deb \(.*debian.*\)/deb-src \1/p' /etc/apt/sources.list >"$dir/apt/parts/src.list"
fi
apt=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$dir/apt/parts"
    -o "Dir::State::Lists=$dir/apt/lists" -o "Dir::Cache=$dir/apt/cache")
apt-get "${apt[@]}" -qq update
(cd "$dir/src" && apt-get "${apt[@]}" -qq source --download-only "fuse3=$ver" 2>/dev/null)
up=${ver%-*}
tar -C "$dir/src" -xf "$dir/src/fuse3_$up.orig.tar.xz"
top="$dir/src/fuse-$up"

# What meson would write: the build's private and public configuration headers.
printf '#define HAVE_SETXATTR 1\n#define HAVE_UTIMENSAT 1\n#define HAVE_COPY_FILE_RANGE 1\n#define HAVE_FALLOCATE 1\n#define HAVE_POSIX_FALLOCATE 1\n' >"$dir/src/fuse_config.h"
# Debian's libfuse3.so.3 is built with versioned symbols (fuse_parse_cmdline@@FUSE_3.12).
printf '#define LIBFUSE_BUILT_WITH_VERSIONED_SYMBOLS 1\n' >"$dir/src/libfuse_config.h"
lib=$(ldconfig -p | awk '/libfuse3\.so\.3 .*x86-64|libfuse3\.so\.3 / {print $NF; exit}')
g++ -O2 -std=c++17 -I"$dir/src" -I"$top/include" -I"$top/example" -include fuse_config.h \
    -o "$dir/passthrough_hp" "$top/example/passthrough_hp.cc" "$lib" -lpthread
"$dir/passthrough_hp" --help >/dev/null
echo "$dir/passthrough_hp"
