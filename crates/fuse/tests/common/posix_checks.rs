//! The POSIX checks of `posix.rs`, shared with the suites that run them on other mounts
//! (`bypass.rs`): the same Python script runs in a native directory and on the mount; outputs
//! must match.

use super::*;

/// Prints one line per check: errno names, modes, link counts, whether ctime moved.
pub const CHECKS: &str = r#"
import os, errno, ctypes, stat, time
libc = ctypes.CDLL(None, use_errno=True)
def e(f, *a):
    try:
        r = f(*a)
        return 'ok' if r is None or isinstance(r, int) else 'ok'
    except OSError as x:
        return errno.errorcode.get(x.errno, str(x.errno))
def out(*a): print(*a, flush=True)
def renameat2(a, b, flags):
    r = libc.renameat2(-100, a.encode(), -100, b.encode(), flags)
    return 'ok' if r == 0 else errno.errorcode[ctypes.get_errno()]
NOREPLACE, EXCHANGE = 1, 2

# open/create modes, O_EXCL
fd = os.open('f', os.O_CREAT | os.O_WRONLY, 0o640); os.write(fd, b'hello'); os.close(fd)
out('mode', oct(os.stat('f').st_mode & 0o7777))
out('excl', e(os.open, 'f', os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
out('excl-new', e(lambda: os.close(os.open('g', os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))))
out('trunc', e(lambda: os.close(os.open('g', os.O_WRONLY | os.O_TRUNC))), os.stat('g').st_size)
out('dir-as-file', e(os.open, '.', os.O_WRONLY))
out('enoent', e(os.stat, 'nope'), e(os.stat, 'nope/deeper'), e(os.stat, 'f/under-file'))
fd = os.open('f', os.O_WRONLY | os.O_APPEND); os.write(fd, b' world'); os.close(fd)
out('append', open('f', 'rb').read())

# link counts and ctime after link / unlink / rename
def ct(p): return os.stat(p).st_ctime_ns
c0 = ct('f'); time.sleep(0.02)
os.link('f', 'f2')
out('link', os.stat('f').st_nlink, os.stat('f2').st_nlink, ct('f') > c0)
c1 = ct('f'); time.sleep(0.02)
os.unlink('f2')
out('unlink', os.stat('f').st_nlink, ct('f') > c1)
os.link('f', 'f3'); c2 = ct('f3'); time.sleep(0.02)
os.rename('f3', 'f4')
out('rename', os.stat('f').st_nlink, ct('f4') > c2, e(os.stat, 'f3'))
os.mkdir('d'); n0 = os.stat('.').st_nlink
os.mkdir('d/sub')
out('dir-nlink', os.stat('d').st_nlink, os.stat('.').st_nlink - n0)
os.rmdir('d/sub'); out('dir-nlink-after', os.stat('d').st_nlink)

# rename cases
open('r1', 'w').write('1'); open('r2', 'w').write('2'); os.mkdir('rd'); os.mkdir('rd2')
open('rd2/x', 'w').close()
out('rename-over-file', e(os.rename, 'r1', 'r2'), open('r2').read(), e(os.stat, 'r1'))
open('r1', 'w').write('1')
out('noreplace', renameat2('r1', 'r2', NOREPLACE), open('r2').read())
out('noreplace-new', renameat2('r1', 'r3', NOREPLACE), open('r3').read())
out('exchange', renameat2('r2', 'r3', EXCHANGE), open('r2').read(), open('r3').read())
out('exchange-missing', renameat2('r2', 'zz', EXCHANGE))
out('file-over-dir', e(os.rename, 'r2', 'rd'))
out('dir-over-file', e(os.rename, 'rd', 'r2'))
out('dir-over-nonempty', e(os.rename, 'rd', 'rd2'))
out('dir-over-empty', e(os.rename, 'rd2/x', 'rdx'), e(os.rename, 'rd', 'rd2'), sorted(os.listdir('.')))
out('dir-into-self', e(os.rename, 'rd2', 'rd2/in'))
out('same', e(os.rename, 'r2', 'r2'))

# utimens: UTIME_OMIT, UTIME_NOW, explicit
class TS(ctypes.Structure): _fields_ = [('s', ctypes.c_long), ('ns', ctypes.c_long)]
UTIME_NOW, UTIME_OMIT = (1 << 30) - 1, (1 << 30) - 2
def utimens(p, a, m):
    t = (TS * 2)(TS(*a), TS(*m))
    return libc.utimensat(-100, p.encode(), t, 0)
utimens('r2', (1000, 5), (2000, 7))
st = os.stat('r2'); out('utime', st.st_atime_ns, st.st_mtime_ns)
utimens('r2', (0, UTIME_OMIT), (3000, 0))
st = os.stat('r2'); out('utime-omit-a', st.st_atime_ns, st.st_mtime_ns)
utimens('r2', (4000, 0), (0, UTIME_OMIT))
st = os.stat('r2'); out('utime-omit-m', st.st_atime_ns, st.st_mtime_ns)
utimens('r2', (0, UTIME_NOW), (0, UTIME_OMIT))
st = os.stat('r2'); out('utime-now', st.st_atime_ns > 10**18, st.st_mtime_ns)

# chmod / chown as root, truncate
os.chmod('r2', 0o4755); out('chmod', oct(os.stat('r2').st_mode & 0o7777))
os.chown('r2', 1234, 5678); st = os.stat('r2'); out('chown', st.st_uid, st.st_gid)
os.truncate('r2', 3); out('truncate', os.stat('r2').st_size, open('r2', 'rb').read())
os.truncate('r2', 0)

# names: NAME_MAX and beyond, long paths, symlink loops
n = 'n' * 255
open(n, 'w').close(); out('name-max', e(os.stat, n))
out('name-too-long', e(os.stat, 'n' * 256), e(open, 'm' * 256, 'w'))
os.unlink(n)
p = '.'
for i in range(40):
    p = p + '/' + 'd' * 90
    os.mkdir(p)
out('deep', len(p), e(os.stat, p))
q = p + '/' + 'e' * 200
out('near-path-max', len(os.path.abspath(q)) > 3000, e(lambda: open(q, 'w').close()))
os.symlink('loop2', 'loop1'); os.symlink('loop1', 'loop2')
out('loop', e(os.stat, 'loop1'), e(os.lstat, 'loop1'), e(open, 'loop1'))
os.symlink('self', 'self'); out('self-loop', e(os.stat, 'self'), os.readlink('self'))
os.symlink('r3', 'toR3'); out('follow', open('toR3').read(), os.stat('toR3').st_size)

# sticky directory, umask
os.mkdir('sticky', 0o777); os.chmod('sticky', 0o1777)
out('sticky', oct(os.stat('sticky').st_mode & 0o7777))
old = os.umask(0o077); open('um', 'w').close(); os.mkdir('umd'); os.umask(old)
out('umask', oct(os.stat('um').st_mode & 0o777), oct(os.stat('umd').st_mode & 0o777))

# data: write, read back, sparse files, fallocate, SEEK_DATA/SEEK_HOLE, copy_file_range
fd = os.open('sparse', os.O_CREAT | os.O_RDWR, 0o644)
os.pwrite(fd, b'end', 1 << 20)
out('sparse', os.fstat(fd).st_size, os.pread(fd, 4, 0))
out('seek-data', e(os.lseek, fd, 0, os.SEEK_DATA), os.lseek(fd, 0, os.SEEK_HOLE) <= 1 << 20)
os.posix_fallocate(fd, 0, 4096); out('fallocate', os.fstat(fd).st_size)
fd2 = os.open('copy', os.O_CREAT | os.O_RDWR, 0o644)
n = os.copy_file_range(fd, fd2, 3, 1 << 20, 0)
out('copy_file_range', n, os.pread(fd2, 3, 0), os.fstat(fd2).st_size)
os.close(fd); os.close(fd2)
# appends, syncs of a file and of a directory (FSYNCDIR), statvfs
fd = os.open('copy', os.O_WRONLY | os.O_APPEND); os.write(fd, b'++')
out('append', os.fstat(fd).st_size, e(os.fsync, fd), e(os.fdatasync, fd)); os.close(fd)
dfd = os.open('.', os.O_RDONLY | os.O_DIRECTORY)
out('fsyncdir', e(os.fsync, dfd), e(os.fdatasync, dfd)); os.close(dfd)
out('statvfs', os.statvfs('.').f_namemax)
# open, unlink, keep using
fd = os.open('gone', os.O_CREAT | os.O_RDWR, 0o644); os.unlink('gone')
os.write(fd, b'still here'); out('unlinked-open', os.pread(fd, 10, 0), os.fstat(fd).st_nlink, os.fstat(fd).st_size)
os.close(fd)
out('listing', sorted(x for x in os.listdir('.') if not x.startswith('d' * 10)))
"#;

/// The same checks as a non-root user (uid 1000) in a world-writable directory, plus
/// permission checks against files of another user (uid 1001).
pub const USER_CHECKS: &str = r#"
import os, errno
def e(f, *a):
    try:
        f(*a); return 'ok'
    except OSError as x:
        return errno.errorcode.get(x.errno, str(x.errno))
def out(*a): print(*a, flush=True)
open('mine', 'w').close()
st = os.stat('mine'); out('owner', st.st_uid, st.st_gid)
os.mkdir('mydir'); st = os.stat('mydir'); out('dir-owner', st.st_uid, st.st_gid)
out('chmod-own', e(os.chmod, 'mine', 0o600), oct(os.stat('mine').st_mode & 0o777))
out('chown-other', e(os.chown, 'mine', 0, 0))
out('chmod-other', e(os.chmod, 'theirs', 0o777))
out('write-other', e(open, 'theirs', 'w'), e(open, 'theirs', 'r'))
out('private', e(open, 'private/x', 'r'), e(os.listdir, 'private'), e(os.stat, 'private/x'))
out('sticky-unlink', e(os.unlink, 'sticky/theirs'), e(os.rename, 'sticky/theirs', 'sticky/moved'))
open('sticky/mine', 'w').close(); out('sticky-own', e(os.unlink, 'sticky/mine'))
out('utime-other', e(os.utime, 'theirs', None), e(os.utime, 'theirs', (1, 1)))
out('setgid-dir', os.stat('sgid').st_gid, e(lambda: open('sgid/new', 'w').close()))
"#;

pub fn setup_user_dir(dir: &std::path::Path) {
    sh_ok(
        dir,
        "chmod 1777 . && echo t > theirs && chown 1001:1001 theirs && chmod 644 theirs && \
         mkdir private && echo s > private/x && chmod 700 private && chown 1001 private && \
         mkdir sticky && chmod 1777 sticky && touch sticky/theirs && chown 1001 sticky/theirs && \
         mkdir sgid && chown 1001:4242 sgid && chmod 2777 sgid",
    );
}

/// Run CHECKS in a native directory and in `w` on mount `t`; the outputs must be equal.
pub fn checks_match_native(t: &TestMount) {
    let native = t.dir.path().join("native");
    std::fs::create_dir(&native).unwrap();
    std::fs::create_dir(t.m("w")).unwrap();
    let a = py(&native, CHECKS, None);
    let b = py(&t.m("w"), CHECKS, None);
    for (x, y) in a.lines().zip(b.lines()) {
        assert_eq!(x, y, "native vs mount");
    }
    assert_eq!(
        a.lines().count(),
        b.lines().count(),
        "native:\n{a}\nmount:\n{b}"
    );
}

/// Run USER_CHECKS as uid 1000 in a native directory and in `w` on mount `t`, and a probe as
/// uid 1001; the outputs must be equal.
pub fn user_checks_match_native(t: &TestMount) {
    let native = t.dir.path().join("native");
    std::fs::create_dir(&native).unwrap();
    std::fs::create_dir(t.m("w")).unwrap();
    setup_user_dir(&native);
    setup_user_dir(&t.m("w"));
    let a = py(&native, USER_CHECKS, Some(1000));
    let b = py(&t.m("w"), USER_CHECKS, Some(1000));
    assert_eq!(a, b);
    // A second user sees the first user's private file as denied, exactly as natively.
    let probe =
        "import os\ntry:\n    open('mine','a'); print('ok')\nexcept OSError as x: print(x.errno)";
    assert_eq!(
        py(&native, probe, Some(1001)),
        py(&t.m("w"), probe, Some(1001))
    );
}
