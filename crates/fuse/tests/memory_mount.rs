//! Real programs on a mount of the in-memory backend (no SRC: the front end reaches storage
//! only through the Backend trait), compared with the same programs in a native directory.

mod common;
use common::*;
use dircache_core::Backend;

/// A small tree made from crates/core/src, with a symlink, a hard link, an empty directory
/// and modes; returns the tarball's path.
fn tarball(t: &TestMount) -> std::path::PathBuf {
    let core_src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../core/src");
    let stage = t.dir.path().join("stage");
    std::fs::create_dir(&stage).unwrap();
    sh_ok(
        &stage,
        &format!(
            "set -e; cp -r {} src; ln -s lib.rs src/link.rs; ln src/memory.rs src/hard.rs; \
             mkdir src/empty; chmod 600 src/error.rs; chmod 750 src/cache; \
             head -c 300000 /dev/urandom > src/big.bin",
            core_src.display()
        ),
    );
    let tar = t.dir.path().join("core.tar");
    sh_ok(&stage, &format!("tar cf {} src", tar.display()));
    tar
}

#[test]
fn tar_diff_cp_rm_on_memory_mount() {
    if !can_mount() {
        return;
    }
    let t = TestMount::memory();
    let tar = tarball(&t);
    let native = t.dir.path().join("native");
    std::fs::create_dir(&native).unwrap();
    let extract = format!("tar xf {}", tar.display());
    sh_ok(&native, &extract);
    sh_ok(&t.mnt, &extract);
    // Same content, and the same names, types, modes, sizes, mtimes, link targets and link
    // counts (directories' sizes are the file system's business).
    assert_eq!(
        sh_ok(t.dir.path(), "diff -r native/src mnt/src && echo same"),
        "same\n"
    );
    let listing = "find src -type f -printf '%p %y %m %n %T@ %s\\n' \
                   -o -printf '%p %y %m %n %T@ %l\\n' | sort";
    let a = sh_ok(&native, listing);
    assert_eq!(a, sh_ok(&t.mnt, listing));
    assert!(a.contains("src/hard.rs f 644 2 "), "{a}");
    // Hard links share one inode through the mount too.
    assert_eq!(
        sh_ok(
            &t.mnt,
            "stat -c %i src/hard.rs src/memory.rs | uniq | wc -l"
        )
        .trim(),
        "1"
    );
    // cp -r and cp -a within the mount; diff against the native tree.
    sh_ok(&t.mnt, "cp -r src copy && cp -a src copy_a");
    assert_eq!(
        sh_ok(
            t.dir.path(),
            "diff -r native/src mnt/copy && diff -r native/src mnt/copy_a && echo same"
        ),
        "same\n"
    );
    let a_listing = listing.replace("src", "copy_a");
    sh_ok(&native, "cp -a src copy_a");
    assert_eq!(sh_ok(&native, &a_listing), sh_ok(&t.mnt, &a_listing));
    // The data is in the backend: a file read there equals the original.
    let m = t.memory.as_ref().unwrap();
    let size = std::fs::metadata(native.join("src/big.bin")).unwrap().len();
    assert_eq!(m.getattr(b"copy/big.bin").unwrap().size, size);
    // rm -r empties it again.
    sh_ok(&t.mnt, "rm -r src copy copy_a");
    assert_eq!(sh_ok(&t.mnt, "ls -A"), "");
    assert_eq!(m.readdir(b"", false).unwrap(), Vec::new());
    assert_eq!(m.inode_count(), 1);
}

#[test]
fn git_workflow_on_memory_mount_matches_native() {
    if !can_mount() {
        return;
    }
    git_workflow_matches_native(&TestMount::memory());
}

#[test]
fn build_and_run_a_program_on_memory_mount() {
    if !can_mount() {
        return;
    }
    let t = TestMount::memory();
    let script = r#"set -e
mkdir proj && cd proj
cat > main.c <<'C'
#include <stdio.h>
int main(void) { printf("%d\n", 40 + 2); return 0; }
C
printf 'prog: main.c\n\tcc -o prog main.c\n' > Makefile
make -s
./prog
make -s && echo up-to-date
"#;
    assert_eq!(sh_ok(&t.mnt, script), "42\nup-to-date\n");
    let o = py(
        &t.mnt,
        "import tempfile, os\n\
         names = set()\n\
         for i in range(300):\n\
         \x20   fd, p = tempfile.mkstemp(dir='.')\n\
         \x20   os.write(fd, b'x' * i); os.close(fd)\n\
         \x20   assert os.stat(p).st_size == i\n\
         \x20   names.add(p)\n\
         \x20   if i % 2: os.unlink(p)\n\
         print(len(names), len([n for n in os.listdir('.') if n.startswith('tmp')]))",
        None,
    );
    assert_eq!(o, "300 150\n");
}

/// Beyond CHECKS: chown(-1, -1) moves the ctime, a write by another user drops set-user-ID,
/// fchmod of an unlinked open file, fsync of a directory, statvfs, ftruncate, mmap. Extended
/// attributes are not supported by the memory backend (EOPNOTSUPP, where ext4 has them).
#[test]
fn more_calls_on_memory_mount_match_native() {
    if !can_mount() {
        return;
    }
    for policy in [
        dircache_fuse::CachePolicy::default(),
        dircache_fuse::CachePolicy::uncached(),
    ] {
        more_calls_case(TestMount::memory_with_policy(policy));
    }
}

fn more_calls_case(t: TestMount) {
    let native = t.dir.path().join("native");
    std::fs::create_dir(&native).unwrap();
    std::fs::create_dir(t.m("w")).unwrap();
    let script = r#"
import os, errno, subprocess, time, mmap
def e(f, *a):
    try:
        f(*a); return 'ok'
    except OSError as x:
        return errno.errorcode.get(x.errno, str(x.errno))
def out(*a): print(*a, flush=True)
os.chmod('.', 0o777)
open('f', 'w').write('x'); c0 = os.stat('f').st_ctime_ns
time.sleep(0.02)
out('chown-noop', e(os.chown, 'f', -1, -1), os.stat('f').st_ctime_ns > c0)
os.chmod('f', 0o4777)
r = subprocess.run(['setpriv', '--reuid=1000', '--regid=1000', '--clear-groups',
                    'sh', '-c', 'echo more >> f'])
out('suid-kill', r.returncode, oct(os.stat('f').st_mode & 0o7777), open('f').read())
fd = os.open('g', os.O_CREAT | os.O_RDWR, 0o644); os.unlink('g')
out('fchmod-unlinked', e(os.fchmod, fd, 0o600), oct(os.fstat(fd).st_mode & 0o7777),
    os.fstat(fd).st_nlink, os.fstat(fd).st_uid)
os.close(fd)
d = os.open('.', os.O_RDONLY)
out('fsync-dir', e(os.fsync, d)); os.close(d)
out('statvfs-namemax', os.statvfs('.').f_namemax)
fd = os.open('h', os.O_CREAT | os.O_RDWR, 0o644); os.write(fd, b'abc'); os.ftruncate(fd, 1)
out('ftruncate', os.fstat(fd).st_size, os.stat('h').st_size); os.close(fd)
fd = os.open('mm', os.O_CREAT | os.O_RDWR, 0o644); os.ftruncate(fd, 4096)
m = mmap.mmap(fd, 4096); m[0:5] = b'mmap!'; m.flush(); m.close(); os.close(fd)
out('mmap', open('mm', 'rb').read(5))
out('xattr', e(os.getxattr, 'f', 'user.x'), e(os.setxattr, 'f', 'user.x', b'1'))
"#;
    let a = py(&native, script, None);
    let b = py(&t.m("w"), script, None);
    let (a_x, a): (Vec<&str>, Vec<&str>) = a.lines().partition(|l| l.starts_with("xattr"));
    let (b_x, b): (Vec<&str>, Vec<&str>) = b.lines().partition(|l| l.starts_with("xattr"));
    assert_eq!(a, b, "native vs memory mount");
    assert!(a.contains(&"suid-kill 0 0o777 xmore"), "{a:?}");
    assert_eq!(a_x, ["xattr ENODATA ok"]);
    assert_eq!(b_x, ["xattr ENOTSUP ENOTSUP"]);
}

/// Processes appending to one file at once (O_APPEND, each line one write crossing page
/// boundaries) and others rewriting a second file lose nothing and tear nothing, with and
/// without passthrough.
#[test]
fn concurrent_appends_on_memory_mount_are_all_kept() {
    if !can_mount() {
        return;
    }
    let no_passthrough = dircache_fuse::CachePolicy {
        passthrough: false,
        ..Default::default()
    };
    for policy in [dircache_fuse::CachePolicy::default(), no_passthrough] {
        let t = TestMount::memory_with_policy(policy);
        let script = r#"
import os, sys
w = sys.argv[1]
fd = os.open('log', os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)
for i in range(300):
    line = ('%s %04d ' % (w, i)).ljust(99, w) + '\n'
    assert os.write(fd, line.encode()) == 100
os.close(fd)
for i in range(100):
    with open('own-' + w, 'w') as f:
        f.write(w * (i + 1))
"#;
        let kids: Vec<ChildGuard> = ["a", "b", "c", "d"]
            .iter()
            .map(|w| {
                let c = std::process::Command::new(PY)
                    .arg("-c")
                    .arg(script)
                    .arg(w)
                    .current_dir(&t.mnt)
                    .spawn()
                    .expect("python");
                ChildGuard(Some(c), None)
            })
            .collect();
        for mut k in kids {
            let st = k.0.as_mut().unwrap().wait().expect("wait");
            assert!(st.success());
        }
        let log = std::fs::read_to_string(t.m("log")).unwrap();
        let lines: Vec<&str> = log.lines().collect();
        assert_eq!(lines.len(), 1200);
        for w in ["a", "b", "c", "d"] {
            let mine: Vec<&str> = lines
                .iter()
                .copied()
                .filter(|l| l.starts_with(&format!("{w} ")))
                .collect();
            assert_eq!(mine.len(), 300, "lines of {w}");
            for (i, l) in mine.iter().enumerate() {
                assert_eq!(*l, format!("{w} {i:04} {}", w.repeat(92)));
            }
            let own = std::fs::read_to_string(t.m(&format!("own-{w}"))).unwrap();
            assert_eq!(own, w.repeat(100));
        }
    }
}
