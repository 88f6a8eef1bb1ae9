//! Opening, writing and truncating through the mount, as other users would, against the
//! native file system (ext4 under the test's tempdir) as the oracle: appends from both sides
//! (issue 7 finding 1), set-user-ID bits after another user's write (15), O_TRUNC on a running
//! program (16), ftruncate through the descriptor (18), execute-only programs (19), and one
//! user's descriptors not starving the others (9).

mod common;
use common::*;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

fn mode_of(p: &Path) -> u32 {
    std::fs::metadata(p).expect("stat").mode() & 0o7777
}

/// Run `script` with python as `uid`, `dir` as the working directory, feeding nothing;
/// returns stdout (the script must succeed).
fn py_as(dir: &Path, script: &str, uid: u32) -> String {
    py(dir, script, Some(uid))
}

fn no_passthrough() -> dircache_fuse::CachePolicy {
    dircache_fuse::CachePolicy {
        passthrough: false,
        ..Default::default()
    }
}

/// `-o open=noopen`: the kernel opens files itself (no OPEN/RELEASE), no passthrough.
fn noopen() -> dircache_fuse::CachePolicy {
    dircache_fuse::CachePolicy {
        no_open: true,
        ..Default::default()
    }
}

/// Finding 1: with `-o nopassthrough` the daemon wrote at the offset the kernel computed from
/// its cached size, so appends made natively meanwhile were overwritten. Lines are ~100 bytes
/// so that many cross a page boundary (where the kernel's page cache would split a write).
#[test]
fn appends_from_both_sides_are_all_kept_without_passthrough() {
    if !can_mount() {
        return;
    }
    appends_from_both_sides(no_passthrough(), true);
}

/// The same with `-o open=noopen`: every byte is kept, but an append through the kernel's
/// page cache that crosses a page boundary reaches SRC in two pieces, and a native append
/// may land between them (no handle to ask for direct I/O: docs/opens.md).
#[test]
fn appends_from_both_sides_are_all_kept_noopen() {
    if !can_mount() {
        return;
    }
    appends_from_both_sides(noopen(), false);
}

fn appends_from_both_sides(policy: dircache_fuse::CachePolicy, whole_lines: bool) {
    let t = TestMount::with_policy(policy);
    std::fs::write(t.s("log"), b"").unwrap();
    // Let the mount know the file (and cache its size) before the race starts.
    assert_eq!(std::fs::metadata(t.m("log")).unwrap().len(), 0);
    const N: usize = 3000;
    // The mount's writer appends N lines, then creates `done`; the native writer appends
    // until then (so the two really overlap) and says how many lines it wrote.
    let done = t.dir.path().join("done");
    let mount_script = format!(
        "import os\npad = b'.' * 85\nfor i in range({N}):\n    fd = os.open({:?}, os.O_WRONLY | os.O_APPEND)\n    os.write(fd, b'mount %06d ' % i + pad + b'\\n')\n    os.close(fd)\nopen({:?}, 'w').close()\n",
        t.m("log").display(),
        done.display()
    );
    let native_script = format!(
        "import os\npad = b'.' * 85\ni = 0\nwhile not os.path.exists({:?}):\n    fd = os.open({:?}, os.O_WRONLY | os.O_APPEND)\n    os.write(fd, b'native %06d ' % (i % 1000000) + pad + b'\\n')\n    os.close(fd)\n    i += 1\nprint(i)\n",
        done.display(),
        t.s("log").display()
    );
    let spawn = |s: String| {
        Command::new(PY)
            .arg("-c")
            .arg(s)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python")
    };
    let mut a = ChildGuard(Some(spawn(native_script)), None);
    let mut b = ChildGuard(Some(spawn(mount_script)), None);
    let st = b.0.as_mut().unwrap().wait().expect("wait");
    assert!(st.success());
    let out = a.0.take().unwrap().wait_with_output().expect("wait");
    assert!(out.status.success());
    let n_native: usize = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let data = std::fs::read_to_string(t.s("log")).unwrap();
    let lines: Vec<&str> = data.lines().collect();
    let whole = |l: &&&str, tag: &str| {
        l.starts_with(tag) && l.len() == tag.len() + 7 + 85 && l.ends_with('.')
    };
    if !whole_lines {
        // Native lines are 100 bytes, the mount's 99; a piece never splits a newline.
        assert_eq!(
            (data.matches('\n').count(), data.len()),
            (n_native + N, n_native * 100 + N * 99),
            "appends in SRC/log (lines, bytes)"
        );
    }
    let native = lines.iter().filter(|l| whole(l, "native ")).count();
    let mount = lines.iter().filter(|l| whole(l, "mount ")).count();
    let odd: Vec<&&str> = lines
        .iter()
        .filter(|l| !whole(l, "native ") && !whole(l, "mount "))
        .take(3)
        .collect();
    if whole_lines {
        assert_eq!(
            (native, mount, lines.len()),
            (n_native, N, n_native + N),
            "whole lines in SRC/log (native, mount, total); others: {odd:?}"
        );
    }
    // And the mount does not keep a wrong size or wrong data afterwards.
    let same = wait_for(Duration::from_secs(5), || {
        std::fs::read(t.m("log")).ok().as_deref() == Some(data.as_bytes())
            && std::fs::metadata(t.m("log")).map(|m| m.len()).ok() == Some(data.len() as u64)
    });
    assert!(same.is_some(), "MNT/log differs from SRC/log");
}

/// What uid 1000 does to root-owned 6777 files, and the mode each ends with.
const SUID_OPS: &str = r#"
import os, ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
def m(p): return oct(os.stat(p).st_mode & 0o7777)
def out(*a): print(*a, flush=True)
def falloc(p, mode, off, ln):
    fd = os.open(p, os.O_RDWR)
    r = libc.fallocate(fd, mode, off, ln)
    err = ctypes.get_errno()
    os.close(fd)
    return 'ok' if r == 0 else errno.errorcode[err]
fd = os.open('w', os.O_WRONLY); os.write(fd, b'x'); os.close(fd); out('write', m('w'))
fd = os.open('a', os.O_WRONLY | os.O_APPEND); os.write(fd, b'x'); os.close(fd); out('append', m('a'))
out('fallocate', falloc('fa', 0, 0, 65536), m('fa'))
out('punch-hole', falloc('ph', 3, 0, 4096), m('ph'))
out('zero-range', falloc('zr', 0x10, 0, 4096), m('zr'))
fd = os.open('ft', os.O_WRONLY); os.ftruncate(fd, 1); os.close(fd); out('ftruncate', m('ft'))
os.truncate('tr', 1); out('truncate', m('tr'))
fd = os.open('ot', os.O_WRONLY | os.O_TRUNC); os.close(fd); out('open-trunc', m('ot'))
s = os.open('src', os.O_RDONLY); d = os.open('cf', os.O_WRONLY)
out('copy_file_range', os.copy_file_range(s, d, 2, 0, 0), m('cf'))
"#;

const SUID_FILES: [&str; 9] = ["w", "a", "fa", "ph", "zr", "ft", "tr", "ot", "cf"];

fn setup_suid(dir: &Path) {
    for f in SUID_FILES {
        let p = dir.join(f);
        std::fs::write(&p, vec![b'd'; 8192]).unwrap();
        chmod(&p, 0o6777);
    }
    std::fs::write(dir.join("src"), b"copied").unwrap();
}

fn suid_cleared(policy: dircache_fuse::CachePolicy) {
    let t = TestMount::with_policy(policy);
    let native = t.dir.path().join("native");
    std::fs::create_dir(&native).unwrap();
    std::fs::create_dir(t.s("w")).unwrap();
    setup_suid(&native);
    setup_suid(&t.s("w"));
    let want = py_as(&native, SUID_OPS, 1000);
    assert!(want.contains("write 0o777"), "native oracle: {want}");
    // Root has `w` open first: with passthrough the kernel then uses the backing file root's
    // open registered for uid 1000's writes too.
    let held = std::fs::File::open(t.m("w/w")).unwrap();
    let got = py_as(&t.m("w"), SUID_OPS, 1000);
    drop(held);
    assert_eq!(got, want, "modes seen on the mount after uid 1000's writes");
    // The real files too.
    for f in SUID_FILES {
        assert_eq!(
            mode_of(&t.s("w").join(f)),
            mode_of(&native.join(f)),
            "mode of SRC/w/{f}"
        );
    }
}

/// Finding 15, data written by the daemon (no passthrough).
#[test]
fn suid_bits_cleared_by_another_users_write_direct() {
    if !can_mount() {
        return;
    }
    suid_cleared(no_passthrough());
}

/// Finding 15, data written by the kernel through the passthrough backing file.
#[test]
fn suid_bits_cleared_by_another_users_write_passthrough() {
    if !can_mount() {
        return;
    }
    suid_cleared(dircache_fuse::CachePolicy::default());
}

/// Finding 15 with `-o open=noopen`: written by the daemon on a descriptor it opened for the
/// request, as the caller.
#[test]
fn suid_bits_cleared_by_another_users_write_noopen() {
    if !can_mount() {
        return;
    }
    suid_cleared(noopen());
}

const TRUNC_RUNNING: &str = r#"
import os, errno, sys
try:
    os.close(os.open(sys.argv[1], os.O_RDONLY | os.O_TRUNC)); print('ok')
except OSError as x:
    print(errno.errorcode[x.errno])
"#;

fn trunc_running(dir: &Path, exe_src: &Path) -> (String, u64, bool) {
    let exe = dir.join("exe");
    let child = Command::new(&exe)
        .arg("30")
        .stdin(Stdio::null())
        .spawn()
        .expect("run exe");
    let mut g = ChildGuard(Some(child), None);
    let pid = g.0.as_ref().unwrap().id();
    // Running once /proc/PID/exe names the copy.
    let up = wait_for(Duration::from_secs(5), || {
        std::fs::read_link(format!("/proc/{pid}/exe"))
            .map(|p| p.file_name() == Some(std::ffi::OsStr::new("exe")))
            .unwrap_or(false)
    });
    assert!(up.is_some(), "exe did not start");
    let o = Command::new(PY)
        .arg("-c")
        .arg(TRUNC_RUNNING)
        .arg(&exe)
        .output()
        .expect("python");
    let r = String::from_utf8_lossy(&o.stdout).trim().to_string();
    std::thread::sleep(Duration::from_millis(50));
    let alive =
        g.0.as_mut()
            .unwrap()
            .try_wait()
            .expect("try_wait")
            .is_none();
    (r, std::fs::metadata(exe_src).unwrap().len(), alive)
}

/// Finding 16: open(exe, O_RDONLY|O_TRUNC) while exe runs is ETXTBSY and leaves it intact;
/// O_RDONLY|O_TRUNC of a file that does not run still truncates, as natively.
#[test]
fn trunc_of_running_program_is_etxtbsy_and_harmless() {
    if !can_mount() {
        return;
    }
    trunc_of_running_program(dircache_fuse::CachePolicy::default());
    trunc_of_running_program(noopen());
}

fn trunc_of_running_program(policy: dircache_fuse::CachePolicy) {
    let t = TestMount::with_policy(policy);
    let native = t.dir.path().join("native");
    std::fs::create_dir(&native).unwrap();
    let size = std::fs::metadata("/bin/sleep").unwrap().len();
    for d in [&native, &t.src] {
        std::fs::copy("/bin/sleep", d.join("exe")).unwrap();
        chmod(&d.join("exe"), 0o755);
        std::fs::write(d.join("plain"), b"some data").unwrap();
    }
    let n = trunc_running(&native, &native.join("exe"));
    assert_eq!(n, ("ETXTBSY".to_string(), size, true), "native oracle");
    let m = trunc_running(&t.mnt, &t.s("exe"));
    assert_eq!(
        m, n,
        "(result, size of SRC/exe, still running) on the mount"
    );
    let plain = "import os\nos.close(os.open('plain', os.O_RDONLY | os.O_TRUNC))\nprint(os.stat('plain').st_size)";
    assert_eq!(py(&t.mnt, plain, None), py(&native, plain, None));
    assert_eq!(std::fs::metadata(t.s("plain")).unwrap().len(), 0);
}

const FTRUNCATE_OWN: &str = r#"
import os, errno
def e(f, *a):
    try:
        f(*a); return 'ok'
    except OSError as x:
        return errno.errorcode.get(x.errno, str(x.errno))
def out(*a): print(*a, flush=True)
fd = os.open('f0', os.O_CREAT | os.O_RDWR, 0)
out('ftruncate', e(os.ftruncate, fd, 100), os.fstat(fd).st_size)
out('write', e(os.write, fd, b'abc'), os.fstat(fd).st_size)
out('ftruncate-down', e(os.ftruncate, fd, 2), os.fstat(fd).st_size, os.pread(fd, 10, 0))
out('reopen', e(os.open, 'f0', os.O_RDWR))
os.close(fd)
out('size', os.stat('f0').st_size, oct(os.stat('f0').st_mode & 0o7777))
"#;

/// Finding 18: ftruncate on a descriptor uses that descriptor, not a reopen by path.
#[test]
fn ftruncate_uses_the_descriptor() {
    if !can_mount() {
        return;
    }
    for policy in [dircache_fuse::CachePolicy::default(), no_passthrough()] {
        let t = TestMount::with_policy(policy);
        let native = t.dir.path().join("native");
        std::fs::create_dir(&native).unwrap();
        std::fs::create_dir(t.s("w")).unwrap();
        chmod(&native, 0o1777);
        chmod(&t.s("w"), 0o1777);
        let want = py_as(&native, FTRUNCATE_OWN, 1000);
        assert!(
            want.starts_with("ftruncate ok 100"),
            "native oracle: {want}"
        );
        assert_eq!(py_as(&t.m("w"), FTRUNCATE_OWN, 1000), want);
    }
}

const UNLINKED_OPEN: &str = r#"
import os, errno
def e(f, *a):
    try:
        f(*a); return 'ok'
    except OSError as x:
        return errno.errorcode.get(x.errno, str(x.errno))
fd = os.open('u', os.O_CREAT | os.O_RDWR, 0o644); os.unlink('u')
print('fchmod', e(os.fchmod, fd, 0o600), oct(os.fstat(fd).st_mode & 0o777))
print('futimens', e(os.utime, fd, (5, 5)), os.fstat(fd).st_mtime)
print('fchown', e(os.fchown, fd, 123, 456), os.fstat(fd).st_uid, os.fstat(fd).st_gid)
print('ftruncate', e(os.ftruncate, fd, 7), os.fstat(fd).st_size)
print('pwrite', os.pwrite(fd, b'written after unlink', 0), os.fstat(fd).st_size)
print('pread', os.pread(fd, 100, 0))
"#;

/// Finding 18 (the other descriptor calls): fchmod, futimens and fchown of an open file whose
/// name is gone act on that file (the kernel sends no handle for them).
#[test]
fn descriptor_calls_on_an_unlinked_open_file() {
    if !can_mount() {
        return;
    }
    for policy in [dircache_fuse::CachePolicy::default(), noopen()] {
        let t = TestMount::with_policy(policy);
        let native = t.dir.path().join("native");
        std::fs::create_dir(&native).unwrap();
        let want = py(&native, UNLINKED_OPEN, None);
        assert!(want.starts_with("fchmod ok 0o600"), "native oracle: {want}");
        assert_eq!(py(&t.mnt, UNLINKED_OPEN, None), want);
    }
}

const EXEC_ONLY: &str = r#"
import os, errno, subprocess
try:
    print('run', subprocess.run(['./xo']).returncode)
except OSError as x:
    print('run', errno.errorcode[x.errno])
try:
    open('xo', 'rb').read(); print('read ok')
except OSError as x:
    print('read', errno.errorcode[x.errno])
"#;

/// Finding 19: a 0711 program can be run, but not read, by another user.
#[test]
fn execute_only_programs_run_but_are_not_readable() {
    if !can_mount() {
        return;
    }
    for policy in [
        dircache_fuse::CachePolicy::default(),
        no_passthrough(),
        noopen(),
    ] {
        let t = TestMount::with_policy(policy);
        let native = t.dir.path().join("native");
        std::fs::create_dir(&native).unwrap();
        for d in [&native, &t.src] {
            std::fs::copy("/bin/true", d.join("xo")).unwrap();
            chmod(&d.join("xo"), 0o711);
        }
        let want = py_as(&native, EXEC_ONLY, 1000);
        assert_eq!(want, "run 0\nread EACCES\n", "native oracle");
        assert_eq!(py_as(&t.mnt, EXEC_ONLY, 1000), want);
    }
}

/// A python process as `uid` that runs `script` (which prints `ready` when set up) and exits
/// when its stdin closes. Returns the guard and the first line it printed.
fn hold_as(
    dir: &Path,
    script: &str,
    uid: u32,
) -> (ChildGuard, BufReader<std::process::ChildStdout>, String) {
    let mut c = Command::new("setpriv")
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={uid}"))
        .arg("--clear-groups")
        .arg(PY)
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python");
    let out = c.stdout.take().unwrap();
    let mut r = BufReader::new(out);
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    (ChildGuard(Some(c), None), r, line.trim().to_string())
}

fn release(mut g: ChildGuard) {
    if let Some(c) = g.0.as_mut() {
        drop(c.stdin.take());
        let _ = c.wait();
    }
}

/// Finding 9: one user opening a file as often as its own limit allows (the process limit here
/// is 20,000 and the daemon has the same) must not make other users' opens fail.
#[test]
fn one_users_open_files_do_not_starve_others() {
    if !can_mount() {
        return;
    }
    let t = TestMount::new();
    std::fs::write(t.s("f"), b"data").unwrap();
    std::fs::write(t.s("g"), b"other").unwrap();
    chmod(&t.src, 0o1777);
    // Opens until its own process limit stops it (EMFILE from its own descriptor table).
    let hog = "import os, sys, errno\nfds = []\nerr = 'none'\nwhile True:\n    try: fds.append(os.open('f', os.O_RDONLY))\n    except OSError as x:\n        err = errno.errorcode[x.errno]; break\nprint(len(fds), err, flush=True)\nsys.stdin.read()\n";
    let (g, _r, line) = hold_as(&t.mnt, hog, 1000);
    // The daemon runs in this test process: when it is out of descriptors, so is the spawn.
    let other = Command::new("setpriv")
        .args(["--reuid=1001", "--regid=1001", "--clear-groups"])
        .args(["sh", "-c", "cat g && touch h && echo done"])
        .current_dir(&t.mnt)
        .stdin(Stdio::null())
        .output()
        .map(|o| {
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            )
        })
        .unwrap_or_else(|e| format!("spawn: {e}"));
    release(g);
    let (n, err) = line.split_once(' ').unwrap_or(("0", ""));
    let n: usize = n.parse().unwrap_or(0);
    // The hog inherits this process's limit (20,000 on the reference machine).
    let lim = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(20_000) as usize;
    assert!(
        n + 100 >= lim && err == "EMFILE",
        "the hog itself (limit {lim}): {line}"
    );
    assert_eq!(
        other, "otherdone\n",
        "uid 1001 while uid 1000 holds {n} opens"
    );
}

/// Finding 9, distinct files: past its share a user gets EMFILE, others still open files, and
/// the user can open again once it closed some.
#[test]
fn per_user_descriptor_cap() {
    if !can_mount() {
        return;
    }
    let policy = dircache_fuse::CachePolicy {
        max_open_per_user: 40,
        ..Default::default()
    };
    let t = TestMount::with_policy(policy);
    for i in 0..60 {
        std::fs::write(t.s(&format!("f{i}")), b"x").unwrap();
    }
    let hog = "import os, sys, errno\nfds = []\nerr = 'none'\nfor i in range(60):\n    try: fds.append(os.open('f%d' % i, os.O_RDONLY))\n    except OSError as x: err = errno.errorcode[x.errno]\nprint('opened', len(fds), err, flush=True)\nsys.stdin.readline()\nfor f in fds[:10]: os.close(f)\ntry: os.close(os.open('f59', os.O_RDONLY)); print('again ok', flush=True)\nexcept OSError as x: print('again', errno.errorcode[x.errno], flush=True)\nsys.stdin.read()\n";
    let (mut g, mut r, line) = hold_as(&t.mnt, hog, 1000);
    let other = sh(
        &t.mnt,
        "setpriv --reuid=1001 --regid=1001 --clear-groups sh -c 'cat f1 f2 f3 && echo done'",
    );
    let c = g.0.as_mut().unwrap();
    c.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let mut again = String::new();
    r.read_line(&mut again).unwrap();
    release(g);
    assert_eq!(line, "opened 40 EMFILE", "uid 1000 past its share");
    assert_eq!(
        String::from_utf8_lossy(&other.stdout),
        "xxxdone\n",
        "uid 1001 meanwhile: {}",
        String::from_utf8_lossy(&other.stderr)
    );
    assert_eq!(again.trim(), "again ok", "uid 1000 after closing 10");
}

// The same checks on mounts of the in-memory backend (set up through the mount: it has no
// SRC), against the same native oracle.

/// Findings 15, 18, 19 and 16 on a memory mount, with and without passthrough.
#[test]
fn open_write_checks_on_memory_backend_match_native() {
    if !can_mount() {
        return;
    }
    for policy in [dircache_fuse::CachePolicy::default(), no_passthrough()] {
        let t = TestMount::memory_with_policy(policy);
        let native = t.dir.path().join("native");
        std::fs::create_dir(&native).unwrap();
        chmod(&native, 0o1777);
        std::fs::create_dir(t.m("w")).unwrap();
        chmod(&t.m("w"), 0o1777);
        // 15: set-id bits after another user's write. Against tmpfs: file data lives in
        // memfds, which (as tmpfs) have no FALLOC_FL_ZERO_RANGE (EOPNOTSUPP; ext4 has it).
        let tmpfs = Tmpfs::new();
        let ns = tmpfs.path().join("s");
        std::fs::create_dir(&ns).unwrap();
        std::fs::create_dir(t.m("w/s")).unwrap();
        setup_suid(&ns);
        setup_suid(&t.m("w/s"));
        let want = py_as(&ns, SUID_OPS, 1000);
        assert!(want.contains("zero-range ENOTSUP"), "tmpfs oracle: {want}");
        assert!(want.contains("write 0o777"), "native oracle: {want}");
        let held = std::fs::File::open(t.m("w/s/w")).unwrap();
        let got = py_as(&t.m("w/s"), SUID_OPS, 1000);
        drop(held);
        // One legitimate difference: the FUSE kernel drops set-id bits (file_modified, an
        // empty SETATTR) before it sends a FALLOCATE, which the memfd then refuses; tmpfs
        // refuses before. (A local SRC on tmpfs shows the same through the mount.)
        let zr = |s: &str| s.replace("zero-range ENOTSUP 0o6777", "zero-range ENOTSUP 0o777");
        assert_eq!(
            zr(&got),
            zr(&want),
            "modes on the memory mount after uid 1000's writes"
        );
        // 18: ftruncate through the descriptor; descriptor calls on an unlinked open file.
        let want = py_as(&native, FTRUNCATE_OWN, 1000);
        assert!(want.starts_with("ftruncate ok 100"), "{want}");
        assert_eq!(py_as(&t.m("w"), FTRUNCATE_OWN, 1000), want);
        let want = py(&native, UNLINKED_OPEN, None);
        assert!(want.starts_with("fchmod ok 0o600"), "{want}");
        assert_eq!(py(&t.m("w"), UNLINKED_OPEN, None), want);
        // 19: execute-only programs.
        for d in [&native, &t.m("w")] {
            std::fs::copy("/bin/true", d.join("xo")).unwrap();
            chmod(&d.join("xo"), 0o711);
        }
        let want = py_as(&native, EXEC_ONLY, 1000);
        assert_eq!(want, "run 0\nread EACCES\n", "native oracle");
        assert_eq!(py_as(&t.m("w"), EXEC_ONLY, 1000), want);
        // 16: O_TRUNC of a running program.
        let size = std::fs::metadata("/bin/sleep").unwrap().len();
        for d in [&native, &t.m("w")] {
            std::fs::copy("/bin/sleep", d.join("exe")).unwrap();
            chmod(&d.join("exe"), 0o755);
        }
        let n = trunc_running(&native, &native.join("exe"));
        assert_eq!(n, ("ETXTBSY".to_string(), size, true), "native oracle");
        assert_eq!(trunc_running(&t.m("w"), &t.m("w/exe")), n);
    }
}
