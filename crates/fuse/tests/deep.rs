//! Files deeper than PATH_MAX below the mount root: PATH_MAX limits one syscall's path
//! argument, not depth. A program that walks down with relative steps (chdir, *at calls)
//! reaches, creates, reads, renames and removes files there natively; the same must work on
//! the mount, with the same results (native is the oracle), including `find`, `ls -l`, and a
//! delegated search.

mod common;
use common::*;

use std::path::Path;

/// `build LEVELS` creates `deep/<200-byte name>/...` LEVELS levels deep with chdir steps and a
/// file at the bottom; `ops LEVELS` walks down the same way and prints one line per check.
const SCRIPT: &str = r#"
import os, sys, errno, subprocess, hashlib
mode, levels = sys.argv[1], int(sys.argv[2])
def name(i): return '%03d' % i + 'd' * 197
names = [name(i) for i in range(levels)]
def out(*a): print(*a, flush=True)
def e(f, *a):
    try:
        f(*a); return 'ok'
    except OSError as x:
        return errno.errorcode.get(x.errno, str(x.errno))
top = sys.argv[3]  # not getcwd(): see run()
if mode == 'build':
    os.mkdir('deep'); os.chdir('deep')
    for n in names:
        os.mkdir(n, 0o755); os.chdir(n)
    with open('native', 'wb') as f: f.write(b'made at build\n')
    sys.exit(0)

os.chdir('deep')
for n in names:
    os.chdir(n)
up = '../' * (levels + 1)
out('read-built', open('native', 'rb').read())
st = os.stat('native'); out('stat-built', st.st_size, oct(st.st_mode), st.st_nlink)
fd = os.open('f', os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o640); os.write(fd, b'hello deep'); os.close(fd)
out('read', open('f', 'rb').read())
st = os.stat('f'); out('stat', st.st_size, oct(st.st_mode & 0o7777), st.st_nlink)
with open('f', 'ab') as fh: fh.write(b' more')
out('append', open('f', 'rb').read())
os.mkdir('sub', 0o750); out('mkdir', oct(os.stat('sub').st_mode))
with open('sub/inner', 'w') as fh: fh.write('x')
out('list', sorted(os.listdir('.')), sorted(os.listdir('sub')))
os.rename('f', 'g'); out('rename', e(os.stat, 'f'), os.stat('g').st_size)
os.link('g', 'h'); out('link', os.stat('g').st_nlink, os.stat('h').st_nlink)
os.symlink('g', 'l'); out('symlink', os.readlink('l'), open('l').read())
os.chmod('g', 0o600); out('chmod', oct(os.stat('g').st_mode & 0o7777))
os.truncate('g', 3); out('truncate', open('g', 'rb').read())
os.utime('g', (1000000, 2000000)); out('utime', os.stat('g').st_mtime)
out('xattr', e(os.setxattr, 'g', 'user.k', b'v'), e(os.getxattr, 'g', 'user.k'), e(os.listxattr, 'g'))
os.unlink('h'); os.unlink('l'); out('unlink', os.stat('g').st_nlink, sorted(os.listdir('.')))
os.rename('sub', 'sub2'); out('rename-dir', sorted(os.listdir('sub2')))
os.rename('g', up + 'moved'); out('rename-up', e(os.stat, 'g'), os.stat(up + 'moved').st_size)
os.rename(up + 'moved', 'g'); out('rename-down', os.stat('g').st_size, e(os.stat, up + 'moved'))
dfd = os.open('.', os.O_RDONLY | os.O_DIRECTORY)
out('dirfd', os.stat('g', dir_fd=dfd).st_size, sorted(os.listdir(dfd)))
os.close(dfd)
# what must still fail: one path argument over PATH_MAX, one name over NAME_MAX
full = '/'.join([top, 'deep'] + names + ['g'])
out('path-max', len(full) > 4096, e(os.stat, full), e(os.open, full, os.O_RDONLY))
out('name-max', e(os.mkdir, 'x' * 256), e(os.open, 'x' * 256, os.O_CREAT | os.O_WRONLY), e(os.stat, 'x' * 256))
out('name-255', e(os.mkdir, 'y' * 255), e(os.rmdir, 'y' * 255))
ls = subprocess.run(['ls', '-la', '--time-style=+', '.'], capture_output=True)
out('ls', ls.returncode, sorted(ls.stdout.decode().splitlines()[1:]), ls.stderr)
os.unlink('native')
os.chdir(top)
def digest(*args):
    r = subprocess.run(['find', 'deep'] + list(args), capture_output=True)
    rows = sorted(r.stdout.decode().splitlines())
    return r.returncode, r.stderr, len(rows), hashlib.sha256('\n'.join(rows).encode()).hexdigest()
out('find-dirs', *digest('-type', 'd', '-printf', '%d %m %f\n'))
out('find-rest', *digest('!', '-type', 'd', '-printf', '%d %y %m %s %f %p\n'))
fn = subprocess.run(['find', 'deep', '-name', 'g'], capture_output=True)
out('find-name', fn.returncode, fn.stderr, [len(l) for l in fn.stdout.decode().splitlines()])
rm = subprocess.run(['rm', '-rf', 'deep'], capture_output=True)
out('rm', rm.returncode, rm.stderr, os.listdir('.'))
"#;

fn run(dir: &Path, mode: &str, levels: usize) -> String {
    let o = std::process::Command::new(PY)
        .arg("-c")
        .arg(SCRIPT)
        .arg(mode)
        .arg(levels.to_string())
        // The top directory is passed in: getcwd() in a mount directory made outside can
        // fail with ENOENT while the change feed's late invalidation of that entry unhashes
        // the kernel's dentry (a coherence matter, not this test's).
        .arg(dir)
        .current_dir(dir)
        .env("LC_ALL", "C")
        .output()
        .expect("python3");
    assert!(
        o.status.success(),
        "{mode} {levels} in {}: {}\n{}\n{}",
        dir.display(),
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn diff(native: &str, mounted: &str) -> Vec<String> {
    let n: Vec<&str> = native.lines().collect();
    let m: Vec<&str> = mounted.lines().collect();
    let mut d = Vec::new();
    for i in 0..n.len().max(m.len()) {
        let (a, b) = (n.get(i), m.get(i));
        if a != b {
            let cut = |s: Option<&&str>| s.map(|s| s.chars().take(300).collect::<String>());
            d.push(format!("native {:?}\nmount  {:?}", cut(a), cut(b)));
        }
    }
    d
}

/// Trees ~8 KiB and ~40 KiB deep, built natively in SRC (so every lookup reaches the daemon)
/// and built through the mount: every check gives what it gives natively.
#[test]
fn deep_trees_match_native() {
    if !can_mount() {
        return;
    }
    let m = TestMount::new();
    let native = tempfile::tempdir().expect("tempdir");
    let mut bad = Vec::new();
    for levels in [40usize, 200] {
        let nat = native.path().join(format!("n{levels}"));
        std::fs::create_dir(&nat).expect("mkdir");
        run(&nat, "build", levels);
        let want = run(&nat, "ops", levels);
        assert!(
            want.contains("path-max True ENAMETOOLONG ENAMETOOLONG"),
            "{want}"
        );
        // Built outside the mount, used through it.
        let rel = format!("out{levels}");
        std::fs::create_dir(m.s(&rel)).expect("mkdir");
        run(&m.s(&rel), "build", levels);
        let got = run(&m.m(&rel), "ops", levels);
        bad.extend(diff(&want, &got).into_iter().map(|d| format!("{rel}: {d}")));
        // Built through the mount.
        let rel = format!("in{levels}");
        std::fs::create_dir(m.m(&rel)).expect("mkdir");
        run(&m.m(&rel), "build", levels);
        let got = run(&m.m(&rel), "ops", levels);
        bad.extend(diff(&want, &got).into_iter().map(|d| format!("{rel}: {d}")));
    }
    assert!(bad.is_empty(), "deep trees differ:\n{}", bad.join("\n"));
}

/// A delegated search (the daemon walks SRC) finds a file ~40 KiB below the mount root, as a
/// local search of SRC does.
#[test]
fn delegated_search_finds_deep_files() {
    if !can_mount() {
        return;
    }
    use dircache_search::{proto, search, DirectSource, Flags, SearchRequest};
    let m = TestMount::new();
    std::fs::create_dir(m.s("t")).expect("mkdir");
    run(&m.s("t"), "build", 200);
    // (path length, final component): readable in a failure message.
    let collect = |s: dircache_search::SearchStream| {
        let mut v: Vec<(usize, String)> = s
            .map(|r| {
                let last = r.path.rsplit(|&b| b == b'/').next().unwrap_or(b"");
                (
                    r.path.len(),
                    String::from_utf8_lossy(&last[..last.len().min(8)]).into_owned(),
                )
            })
            .collect();
        v.sort();
        v
    };
    let root = m.m("t");
    // (The access filters -r/-w/-x are not covered here yet: the cache source decides them
    // with a path from the search root, which cannot name a result deeper than PATH_MAX.)
    for flags in [Flags::NONE, Flags::METADATA] {
        let req = SearchRequest::new(root.to_string_lossy(), "native|*dd", flags);
        // Delegated only for a caller without CAP_DAC_* (the daemon never applies them).
        let caps = drop_dac_caps();
        let stream = proto::delegate(&req)
            .expect("delegate")
            .expect("the search was not delegated");
        let got = collect(stream);
        drop(caps);
        let local = SearchRequest::new(m.s("t").to_string_lossy(), "native|*dd", flags);
        let want =
            collect(search(&local, std::sync::Arc::new(DirectSource::new())).expect("search"));
        assert_eq!(want.len(), 201, "the local search, {flags:?}");
        assert_eq!(got, want, "{flags:?}");
        assert!(got.iter().any(|(n, _)| *n > 40_000), "{flags:?}");
        // Not delegated: the client walks the mount itself.
        let direct =
            collect(search(&req, std::sync::Arc::new(DirectSource::new())).expect("search"));
        assert_eq!(direct, want, "not delegated, {flags:?}");
    }
}

/// The same on a mount of the in-memory backend (built through the mount: it has no SRC).
/// The memory backend has no extended attributes: the `xattr` line is EOPNOTSUPP there.
#[test]
fn deep_trees_on_memory_backend_match_native() {
    if !can_mount() {
        return;
    }
    let m = TestMount::memory();
    let native = tempfile::tempdir().expect("tempdir");
    let mut bad = Vec::new();
    for levels in [40usize, 200] {
        let nat = native.path().join(format!("n{levels}"));
        std::fs::create_dir(&nat).expect("mkdir");
        run(&nat, "build", levels);
        let want = run(&nat, "ops", levels);
        let rel = format!("in{levels}");
        std::fs::create_dir(m.m(&rel)).expect("mkdir");
        run(&m.m(&rel), "build", levels);
        let got = run(&m.m(&rel), "ops", levels);
        let xattr = "xattr ENOTSUP ENOTSUP ENOTSUP";
        assert!(got.lines().any(|l| l == xattr), "{got}");
        let got: String = got
            .lines()
            .map(|l| if l == xattr { "xattr ok ok ok" } else { l })
            .map(|l| format!("{l}\n"))
            .collect();
        assert!(want.contains("xattr ok ok ok\n"), "{want}");
        bad.extend(diff(&want, &got).into_iter().map(|d| format!("{rel}: {d}")));
    }
    assert!(bad.is_empty(), "deep trees differ:\n{}", bad.join("\n"));
}
