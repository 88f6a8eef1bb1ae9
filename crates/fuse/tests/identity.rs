//! Identity and metadata through the mount compared with SRC (the kernel as the oracle):
//! inode numbers that survive the kernel forgetting inodes and a remount, file handles,
//! times, whiteouts, inode flags.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A second (or later) mount of an existing SRC at an existing MNT; unmounted on drop.
struct Serve {
    mnt: PathBuf,
    thread: Option<JoinHandle<()>>,
}

impl Serve {
    fn new(src: &Path, mnt: &Path) -> Serve {
        Self::with(src, mnt, Default::default(), 0)
    }

    fn with(
        src: &Path,
        mnt: &Path,
        policy: dircache_fuse::CachePolicy,
        // Extra mount(2) flags (MS_*), besides the defaults.
        extra_flags: libc::c_ulong,
    ) -> Serve {
        let backend = dircache_local::LocalBackend::new(src).expect("local backend");
        let cache = dircache_core::Cache::new(Arc::new(backend), dircache_core::Config::default())
            .expect("cache");
        let mut cfg = dircache_fuse::MountConfig::new(src, mnt);
        cfg.policy = policy;
        cfg.kernel.flags |= extra_flags;
        let mounted = dircache_fuse::mount(cache, &cfg).expect("mount");
        let thread = std::thread::spawn(move || {
            if let Err(e) = mounted.run() {
                eprintln!("session: {e}");
            }
        });
        Serve {
            mnt: mnt.to_path_buf(),
            thread: Some(thread),
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if dircache_fuse::unmount(&self.mnt).is_err() {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.mnt)
                .status();
        }
        if let Some(t) = self.thread.take() {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !t.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if t.is_finished() {
                let _ = t.join();
            }
        }
    }
}

/// Unmount the test mount's first session (its Drop then finds nothing to do).
fn unmount_first(t: &TestMount) {
    dircache_fuse::unmount(&t.mnt).expect("unmount");
    wait_for(Duration::from_secs(10), || {
        !dircache_fuse::is_mount_point(&t.mnt)
    })
    .expect("unmounted");
}

/// Make the kernel forget every inode it had looked up from FUSE daemons.
fn drop_caches() {
    std::fs::write("/proc/sys/vm/drop_caches", "3").expect("drop_caches");
}

/// `path inode` for every name under `dir` (stat and readdir's d_ino), sorted.
fn inode_listing(dir: &Path) -> String {
    py(
        dir,
        "import os\n\
         out = []\n\
         for root, dirs, files in os.walk('.'):\n\
         \x20   for e in os.scandir(root):\n\
         \x20       out.append('%s stat=%d' % (e.path, os.lstat(e.path).st_ino))\n\
         \x20       if not e.is_dir(follow_symlinks=False) or not os.path.ismount(e.path):\n\
         \x20           out.append('%s d_ino=%d' % (e.path, e.inode()))\n\
         out.append('. stat=%d' % os.stat('.').st_ino)\n\
         print('\\n'.join(sorted(out)))",
        None,
    )
}

/// st_ino through the mount is SRC's, for files, directories, symlinks and hard links, in
/// stat and in readdir; unchanged after the kernel forgot the inodes and after a remount.
#[test]
fn inode_numbers_are_srcs_and_stable() {
    if !can_mount() {
        return;
    }
    let t = TestMount::new();
    make_tree(&t.src);
    let native = inode_listing(&t.src);
    assert_eq!(native, inode_listing(&t.mnt), "cold");
    assert_eq!(native, inode_listing(&t.mnt), "warm");
    drop_caches();
    assert_eq!(native, inode_listing(&t.mnt), "after drop_caches");
    // find -inum finds both names of a hard link; du counts it once.
    let ino = sh_ok(&t.src, "stat -c %i a/f2.txt");
    let q = format!("find . -inum {} | sort", ino.trim());
    assert_eq!(sh_ok(&t.mnt, &q), "./a/f2.txt\n./d/hard2\n");
    assert_eq!(
        sh_ok(&t.mnt, "du -s --apparent-size -B1 . a d"),
        sh_ok(&t.src, "du -s --apparent-size -B1 . a d")
    );
    unmount_first(&t);
    {
        let _s = Serve::new(&t.src, &t.mnt);
        assert_eq!(native, inode_listing(&t.mnt), "after remount");
    }
    // Plain READDIR (no readdirplus): d_ino from the listing.
    let _s = Serve::with(
        &t.src,
        &t.mnt,
        dircache_fuse::CachePolicy {
            readdirplus: false,
            ..Default::default()
        },
        0,
    );
    assert_eq!(native, inode_listing(&t.mnt), "without readdirplus");
}

/// A git repository used through the mount: after the kernel forgot its inodes, and after a
/// remount, `git status` finds the index up to date (same inode numbers) and does not rewrite it.
#[test]
fn git_index_survives_forget_and_remount() {
    if !can_mount() {
        return;
    }
    let t = TestMount::new();
    // Old mtimes: no entry is "racily clean", so git rewrites the index only when stat data
    // (such as the inode number) changed.
    sh_ok(
        &t.mnt,
        "set -e; git init -q -b main repo; cd repo; mkdir -p a/b\n\
         for i in $(seq 1 50); do echo $i > a/f$i; echo $i > a/b/g$i; done\n\
         touch -d 2020-01-01 a/f* a/b/g*\n\
         git add -A; git commit -q -m one; git status --porcelain; sleep 1.1; git status --porcelain",
    );
    let repo = t.mnt.join("repo");
    let index = |m: &Path| std::fs::read(m.join("repo/.git/index")).expect("index");
    let before = index(&t.mnt);
    drop_caches();
    assert_eq!(sh_ok(&repo, "git status --porcelain"), "");
    assert!(
        before == index(&t.mnt),
        "git rewrote the index after drop_caches"
    );
    unmount_first(&t);
    let _s = Serve::new(&t.src, &t.mnt);
    assert_eq!(sh_ok(&repo, "git status --porcelain"), "");
    assert!(
        before == index(&t.mnt),
        "git rewrote the index after a remount"
    );
}

/// name_to_handle_at/open_by_handle_at through the mount: either handles are not offered
/// (EOPNOTSUPP, as on a file system without export support), or they keep working after the
/// kernel forgot the inode and after a remount. Never a handle that goes stale for a file that
/// still exists.
#[test]
fn file_handles_never_go_stale() {
    if !can_mount() {
        return;
    }
    let t = TestMount::new();
    std::fs::write(t.s("f"), b"hello").unwrap();
    // Encode once, then decode after drop_caches and after a remount (the handle is kept in
    // a file between the python runs).
    let hfile = t.dir.path().join("handle");
    let enc = format!(
        "import ctypes, os, errno\n\
         libc = ctypes.CDLL(None, use_errno=True)\n\
         class FH(ctypes.Structure):\n\
         \x20   _fields_ = [('bytes', ctypes.c_uint), ('type', ctypes.c_int), ('h', ctypes.c_ubyte * 128)]\n\
         fh = FH(); fh.bytes = 128; mid = ctypes.c_int()\n\
         r = libc.name_to_handle_at(-100, {f:?}.encode(), ctypes.byref(fh), ctypes.byref(mid), 0)\n\
         if r < 0:\n\
         \x20   print('encode', errno.errorcode[ctypes.get_errno()])\n\
         else:\n\
         \x20   open({h:?}, 'wb').write(bytes(fh))\n\
         \x20   print('encode ok')\n",
        f = t.m("f").display().to_string(),
        h = hfile.display().to_string(),
    );
    let dec = format!(
        "import ctypes, os, errno\n\
         libc = ctypes.CDLL(None, use_errno=True)\n\
         class FH(ctypes.Structure):\n\
         \x20   _fields_ = [('bytes', ctypes.c_uint), ('type', ctypes.c_int), ('h', ctypes.c_ubyte * 128)]\n\
         fh = FH.from_buffer_copy(open({h:?}, 'rb').read())\n\
         m = os.open({m:?}, os.O_RDONLY | os.O_DIRECTORY)\n\
         fd = libc.open_by_handle_at(m, ctypes.byref(fh), os.O_RDONLY)\n\
         if fd < 0:\n\
         \x20   print('decode', errno.errorcode[ctypes.get_errno()])\n\
         else:\n\
         \x20   print('decode', os.read(fd, 100).decode())\n",
        h = hfile.display().to_string(),
        m = t.mnt.display().to_string(),
    );
    let e = py(t.dir.path(), &enc, None);
    if e.trim() == "encode EOPNOTSUPP" || e.trim() == "encode ENOTSUP" {
        // Not offered: nothing can go stale. (The kernel answers EOPNOTSUPP itself when the
        // daemon asks for FUSE_NO_EXPORT_SUPPORT.)
        return;
    }
    assert_eq!(e.trim(), "encode ok");
    assert_eq!(py(t.dir.path(), &dec, None).trim(), "decode hello", "warm");
    drop_caches();
    assert_eq!(
        py(t.dir.path(), &dec, None).trim(),
        "decode hello",
        "after drop_caches"
    );
    unmount_first(&t);
    let _s = Serve::new(&t.src, &t.mnt);
    assert_eq!(
        py(t.dir.path(), &dec, None).trim(),
        "decode hello",
        "after remount"
    );
}

/// A file system mounted inside SRC (tmpfs: its inode numbers repeat SRC's small ones) gets
/// stable numbers of its own that never collide with SRC's: hard links there share one, `du`
/// counts them once, and they survive the kernel forgetting the inodes.
#[test]
fn inner_mount_inodes_distinct_and_stable() {
    if !can_mount() {
        return;
    }
    let t = TestMount::new();
    make_tree(&t.src);
    std::fs::create_dir(t.s("inner")).unwrap();
    sh_ok(&t.src, "mount -t tmpfs -o size=1m dctest inner");
    struct Umount(PathBuf);
    impl Drop for Umount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.0)
                .status();
        }
    }
    let _u = Umount(t.s("inner"));
    sh_ok(
        &t.src,
        "set -e; cd inner; mkdir -p x/y; for i in 1 2 3 4 5 6 7 8; do head -c 5000 /dev/zero > f$i; done\n\
         ln f1 x/y/h1; ln f2 x/h2",
    );
    let q = "find . -exec stat -c '%i %n' {} + | sort -k2";
    let listing = |dir: &Path| {
        let mut by_ino = std::collections::BTreeMap::<String, Vec<String>>::new();
        for l in sh_ok(dir, q).lines() {
            let (i, n) = l.split_once(' ').unwrap();
            by_ino.entry(i.to_string()).or_default().push(n.to_string());
        }
        // The groups of names sharing an inode (the partition), which must be the same.
        let mut groups: Vec<Vec<String>> = by_ino.into_values().collect();
        groups.sort();
        groups
    };
    let native = listing(&t.src);
    let fused = listing(&t.mnt);
    assert_eq!(native, fused, "names sharing an inode");
    let before = sh_ok(&t.mnt, q);
    drop_caches();
    assert_eq!(before, sh_ok(&t.mnt, q), "after drop_caches");
    // SRC's own files keep SRC's numbers.
    assert_eq!(
        sh_ok(&t.mnt, "stat -c %i a/f1.txt"),
        sh_ok(&t.src, "stat -c %i a/f1.txt")
    );
    // du counts each (st_dev, st_ino) once: natively two devices, one through the mount.
    assert_eq!(
        sh_ok(&t.mnt, "du -s --apparent-size -B1 inner ."),
        sh_ok(&t.src, "du -s --apparent-size -B1 inner .")
    );
}

/// Run the same script in a native directory and in the mount; both outputs.
fn native_and_mount(t: &TestMount, script: &str) -> (String, String) {
    let native = t.dir.path().join("native");
    let _ = std::fs::create_dir(&native);
    (sh_ok(&native, script), sh_ok(&t.mnt, script))
}

/// renameat2(RENAME_WHITEOUT) leaves a 0/0 character device at the old name (as ext4 does;
/// overlayfs needs it), alone and with RENAME_NOREPLACE.
#[test]
fn rename_whiteout_matches_native() {
    if !can_mount() {
        return;
    }
    let t = TestMount::new();
    let script = r#"python3 -c '
import ctypes, os, errno
libc = ctypes.CDLL(None, use_errno=True)
WHITEOUT, NOREPLACE = 4, 1
def ren(a, b, fl):
    r = libc.renameat2(-100, a.encode(), -100, b.encode(), fl)
    return "ok" if r == 0 else errno.errorcode[ctypes.get_errno()]
open("a", "w").write("A"); open("b", "w").write("B"); open("c", "w").write("C")
print(ren("a", "b", WHITEOUT))
st = os.lstat("a"); print(oct(st.st_mode), os.major(st.st_rdev), os.minor(st.st_rdev))
print(open("b").read(), sorted(os.listdir(".")))
print(ren("c", "b", WHITEOUT | NOREPLACE), ren("c", "d", WHITEOUT | NOREPLACE))
st = os.lstat("c"); print(oct(st.st_mode), open("d").read(), sorted(os.listdir(".")))
'"#;
    let (n, m) = native_and_mount(&t, script);
    assert!(n.starts_with("ok\n0o20000 0 0\n"), "native: {n}");
    assert_eq!(n, m);
    // SRC has the whiteout too.
    assert_eq!(
        sh_ok(&t.src, "stat -c '%F %t %T' a"),
        "character special file 0 0\n"
    );
}
/// lsattr/chattr (FS_IOC_GETFLAGS/SETFLAGS) and FS_IOC_FSGETXATTR/FSSETXATTR on files and
/// directories give what they give natively, and reach SRC.
#[test]
fn inode_flag_ioctls_match_native() {
    if !can_mount() {
        return;
    }
    let t = TestMount::new();
    let script = r#"set -e
mkdir -p d; touch f d/g
chattr +A f; chattr +d d; chattr +A d/g
lsattr -d f d d/g
chattr -A f; lsattr -d f
python3 -c '
import fcntl, os, struct
GET, SET = 0x801c581f, 0x401c5820
for p in ("f", "d"):
    fd = os.open(p, os.O_RDONLY)
    x = bytearray(28); fcntl.ioctl(fd, GET, x)
    xflags = struct.unpack("I", x[:4])[0]
    x[0:4] = struct.pack("I", xflags | 0x80)  # FS_XFLAG_NODUMP
    fcntl.ioctl(fd, SET, bytes(x))
    y = bytearray(28); fcntl.ioctl(fd, GET, y)
    print(p, hex(xflags), hex(struct.unpack("I", y[:4])[0]))
    os.close(fd)
'
lsattr -d f d
"#;
    let (n, m) = native_and_mount(&t, script);
    assert_eq!(n, m);
    assert_eq!(
        sh_ok(&t.src, "lsattr -d f d"),
        sh_ok(&t.mnt, "lsattr -d f d")
    );
    // An ordinary user may not change another user's flags (EPERM, as natively).
    let o = sh(
        &t.mnt,
        "setpriv --reuid=1000 --regid=1000 --clear-groups chattr +A f",
    );
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("Operation not permitted"));
}

/// chown(f, -1, -1) changes nothing but the ctime, as on ext4.
#[test]
fn chown_minus_one_updates_ctime() {
    if !can_mount() {
        return;
    }
    let t = TestMount::new();
    let script = r#"python3 -c '
import os, time
open("f", "w").close(); os.mkdir("d")
for p in ("f", "d"):
    before = os.lstat(p).st_ctime_ns
    time.sleep(0.02)
    os.chown(p, -1, -1)
    print(p, os.lstat(p).st_ctime_ns > before)
'"#;
    let (n, m) = native_and_mount(&t, script);
    assert_eq!(n, "f True\nd True\n");
    assert_eq!(n, m);
}

/// `setup` run natively in a native directory and in SRC, then `script` in the native
/// directory and in the mount (which saw nothing of the setup but the change feed).
fn setup_native_and_mount(t: &TestMount, setup: &str, script: &str) -> (String, String) {
    let native = t.dir.path().join("native");
    let _ = std::fs::create_dir(&native);
    sh_ok(&native, setup);
    sh_ok(&t.src, setup);
    (sh_ok(&native, script), sh_ok(&t.mnt, script))
}

/// A read moves the atime as the backend's relatime rule says, and `stat` on the mount shows
/// it (the kernel keeps attributes for a day unless told).
#[test]
fn atime_after_read_matches_native() {
    if !can_mount() {
        return;
    }
    for passthrough in [true, false] {
        let t = TestMount::with_policy(dircache_fuse::CachePolicy {
            passthrough,
            ..Default::default()
        });
        let setup = "echo data > f; cp f g; touch -a -d 2000-01-01 f g";
        let script = r#"set -e
stat -c %X f
cat f > /dev/null
python3 -c 'import os, time; print(abs(os.stat("f").st_atime - time.time()) < 5)'
python3 -c 'import os; print(os.stat("g").st_atime); os.open("g", os.O_RDONLY); print(os.stat("g").st_atime)'
python3 -c 'import os, time; fd = os.open("g", os.O_RDONLY); os.read(fd, 1); print(abs(os.stat("g").st_atime - time.time()) < 5)'
# Wait (at most 5 s) until the listing shows the new atimes, rather than sleeping.
i=0; until [ -z "$(ls -lu --time-style=+%s | awk 'NF > 5 && $6 <= 946684800')" ] || [ $i -ge 500 ]; do sleep 0.01; i=$((i+1)); done
ls -lu --time-style=+%s | awk 'NF > 5 { print $7, ($6 > 946684800) }'
"#;
        let (n, m) = setup_native_and_mount(&t, setup, script);
        assert_eq!(
            n,
            "946684800\nTrue\n946684800.0\n946684800.0\nTrue\nf 1\ng 1\n"
        );
        assert_eq!(n, m, "passthrough {passthrough}");
    }
}

/// Writes through a shared mapping move mtime and ctime (at msync, at the latest at close),
/// and `stat` on the mount shows it.
#[test]
fn mtime_after_mmap_write_matches_native() {
    if !can_mount() {
        return;
    }
    for passthrough in [true, false] {
        let t = TestMount::with_policy(dircache_fuse::CachePolicy {
            passthrough,
            ..Default::default()
        });
        let setup = "head -c 8192 /dev/zero > f; touch -d 2000-01-01 f; cp -p f g";
        // As xfstests' generic/080: separate processes, no stat while the file is open.
        let script = r#"stat -c %Y f g
python3 -c '
import mmap, os
fd = os.open("f", os.O_RDWR)
m = mmap.mmap(fd, 8192)
m[0:5] = b"hello"
m.close(); os.close(fd)
'
# Wait (at most 5 s) for the write-back to move the mtime, rather than sleeping.
i=0; until [ "$(stat -c %Y f)" -gt 946684800 ] || [ $i -ge 500 ]; do sleep 0.01; i=$((i+1)); done
stat -c %Y f | awk '{ print ($1 > 946684800) }'
python3 -c '
import mmap, os
fd = os.open("g", os.O_RDWR)
m = mmap.mmap(fd, 8192)
m[0:5] = b"hello"
m.flush()
os.system("stat -c %Y g | awk \"{ print (\\$1 > 946684800) }\"")
m[4096:4101] = b"world"
m.close(); os.close(fd)
'
python3 -c 'print(open("f", "rb").read(5), open("g", "rb").read()[4096:4101])'
"#;
        let (n, m) = setup_native_and_mount(&t, setup, script);
        assert_eq!(n, "946684800\n946684800\n1\n1\nb'hello' b'world'\n");
        assert_eq!(n, m, "passthrough {passthrough}");
    }
}
/// fstat of an open directory that was renamed over (its last name gone): nlink 0, not
/// ENOENT.
#[test]
fn fstat_of_replaced_directory_matches_native() {
    if !can_mount() {
        return;
    }
    let t = TestMount::new();
    let script = r#"python3 -c '
import os
os.mkdir("a"); os.mkdir("b")
fd = os.open("b", os.O_RDONLY | os.O_DIRECTORY)
os.rename("a", "b")
st = os.fstat(fd)
print(st.st_nlink, oct(st.st_mode))
fd2 = os.open("f", os.O_CREAT | os.O_WRONLY, 0o644)
os.unlink("f")
print(os.fstat(fd2).st_nlink)
'"#;
    let (n, m) = native_and_mount(&t, script);
    assert_eq!(n, "0 0o40755\n0\n");
    assert_eq!(n, m);
}

/// On a `noatime` mount, reads leave the atime alone, also in SRC: as a native noatime
/// mount, for the file's owner and for another user, with and without passthrough.
#[test]
fn noatime_mount_leaves_atime_alone() {
    if !can_mount() {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("dcnoatime")
        .tempdir()
        .unwrap();
    chmod(dir.path(), 0o755);
    let native = dir.path().join("native");
    std::fs::create_dir(&native).unwrap();
    // The oracle: a noatime bind mount of a native directory.
    sh_ok(
        dir.path(),
        "mount --bind native native && mount -o remount,bind,noatime native",
    );
    struct Umount(PathBuf);
    impl Drop for Umount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.0)
                .status();
        }
    }
    let _u = Umount(native.clone());
    let setup = "echo data > f; chmod 644 f; touch -a -d 2000-01-01 f";
    let script =
        "cat f > /dev/null; setpriv --reuid=1000 --regid=1000 --clear-groups cat f > /dev/null; \
                  stat -c %X f";
    sh_ok(&native, setup);
    let n = sh_ok(&native, script);
    assert_eq!(n, "946684800\n");
    for passthrough in [true, false] {
        let src = dir.path().join(format!("src{passthrough}"));
        let mnt = dir.path().join(format!("mnt{passthrough}"));
        std::fs::create_dir(&src).unwrap();
        std::fs::create_dir(&mnt).unwrap();
        sh_ok(&src, setup);
        let _s = Serve::with(
            &src,
            &mnt,
            dircache_fuse::CachePolicy {
                passthrough,
                ..Default::default()
            },
            libc::MS_NOATIME,
        );
        assert_eq!(sh_ok(&mnt, script), n, "passthrough {passthrough}");
        assert_eq!(
            sh_ok(&src, "stat -c %X f"),
            n,
            "SRC, passthrough {passthrough}"
        );
    }
}

/// A file deleted in SRC whose inode number ext4 gives to a new file while the kernel still
/// holds the old inode: the new file shows its own content and attributes (a new generation
/// makes the kernel drop the old inode), with SRC's inode number.
#[test]
fn reused_inode_number_is_a_new_file() {
    if !can_mount() {
        return;
    }
    let t = TestMount::new();
    sh_ok(&t.src, "for i in $(seq 1 20); do echo old$i > f$i; done");
    let mut checked = 0;
    for i in 1..=20 {
        let old = t.m(&format!("f{i}"));
        // The kernel holds the inode (an O_PATH descriptor pins it without any open file in
        // the daemon, so ext4 may free the number) and caches its pages.
        assert_eq!(std::fs::read_to_string(&old).unwrap(), format!("old{i}\n"));
        let _pin = rustix::fs::open(&old, rustix::fs::OFlags::PATH, rustix::fs::Mode::empty())
            .expect("O_PATH");
        let ino = sh_ok(&t.src, &format!("stat -c %i f{i}"));
        std::fs::remove_file(t.s(&format!("f{i}"))).unwrap();
        wait_for(Duration::from_secs(5), || !old.exists()).expect("deletion seen");
        std::fs::write(t.s(&format!("n{i}")), format!("brand new {i}, longer\n")).unwrap();
        if sh_ok(&t.src, &format!("stat -c %i n{i}")) != ino {
            continue;
        }
        checked += 1;
        let new = t.m(&format!("n{i}"));
        wait_for(Duration::from_secs(5), || new.exists()).expect("creation seen");
        // Its content at once (a small file is read through the page cache only when the
        // kernel's attributes are the file's now: fs/handles.rs), never the old file's.
        let want = format!("brand new {i}, longer\n");
        let got = std::fs::read_to_string(&new).unwrap();
        assert_eq!(got, want, "n{i}");
        assert_eq!(sh_ok(&t.mnt, &format!("stat -c %i n{i}")), ino);
    }
    assert!(checked > 0, "ext4 never reused an inode number here");
}

/// A mount whose backend reports no changes (as if the change feed lagged forever): what the
/// core knows of SRC is only what it asked itself. Unmounted on drop.
fn serve_without_feed(src: &Path, mnt: &Path) -> Serve {
    let backend =
        dircache_local::LocalBackend::with_options(src, 0, dircache_local::WatchMode::Off)
            .expect("local backend");
    let cache = dircache_core::Cache::new(Arc::new(backend), dircache_core::Config::default())
        .expect("cache");
    let cfg = dircache_fuse::MountConfig::new(src, mnt);
    let mounted = dircache_fuse::mount(cache, &cfg).expect("mount");
    let thread = std::thread::spawn(move || {
        if let Err(e) = mounted.run() {
            eprintln!("session: {e}");
        }
    });
    Serve {
        mnt: mnt.to_path_buf(),
        thread: Some(thread),
    }
}

/// The race behind `reused_inode_number_is_a_new_file`'s rare ENOENT, made certain: SRC's
/// file is deleted and its inode number reused by a new file before the change feed told the
/// core (here it never does). The new name must not be taken for a hard link of the old,
/// still cached name (which made the kernel reuse the old inode and the open go to the old
/// name: ENOENT for an existing file): the new file opens, with its own content.
#[test]
fn reused_inode_number_before_the_feed_is_a_new_file() {
    if !can_mount() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&src).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    sh_ok(&src, "for i in $(seq 1 100); do echo old$i > f$i; done");
    let _s = serve_without_feed(&src, &mnt);
    // The kernel holds every removed file's inode (O_PATH descriptors pin it without any
    // open file in the daemon, so ext4 may free the number): a new file that gets any of
    // their numbers is the case. ext4 usually gives a freed number to the next new file; a
    // number freed late (the daemon's descriptor closed after the removal) goes to a later
    // one.
    let mut pins = Vec::new();
    let mut removed = std::collections::HashMap::new();
    let mut checked = 0;
    for i in 1..=100 {
        if checked == 5 {
            break;
        }
        let old = mnt.join(format!("f{i}"));
        assert_eq!(std::fs::read_to_string(&old).unwrap(), format!("old{i}\n"));
        pins.push(
            rustix::fs::open(&old, rustix::fs::OFlags::PATH, rustix::fs::Mode::empty())
                .expect("O_PATH"),
        );
        removed.insert(sh_ok(&src, &format!("stat -c %i f{i}")), i);
        std::fs::remove_file(src.join(format!("f{i}"))).unwrap();
        std::fs::write(
            src.join(format!("n{i}")),
            format!("brand new {i}, longer\n"),
        )
        .unwrap();
        let ino = sh_ok(&src, &format!("stat -c %i n{i}"));
        let Some(was) = removed.get(&ino) else {
            continue;
        };
        checked += 1;
        let new = mnt.join(format!("n{i}"));
        assert_eq!(
            std::fs::read_to_string(&new).map_err(|e| e.kind()),
            Ok(format!("brand new {i}, longer\n")),
            "n{i}, with the inode number of f{was}"
        );
        assert_eq!(sh_ok(&mnt, &format!("stat -c %i n{i}")), ino);
    }
    assert!(checked > 0, "ext4 never reused an inode number here");
}

/// A hard link's other name was removed in SRC and the core has not heard of it yet (no
/// change feed here): an open through the remaining name must reach the file, not fail with
/// ENOENT because the daemon opened the removed name.
#[test]
fn open_through_a_remaining_hard_link_before_the_feed() {
    if !can_mount() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&src).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    sh_ok(&src, "echo linked > a && ln a b");
    let _s = serve_without_feed(&src, &mnt);
    // The kernel knows one inode with both names (a first).
    let ia = sh_ok(&mnt, "stat -c %i a");
    assert_eq!(sh_ok(&mnt, "stat -c %i b"), ia);
    std::fs::remove_file(src.join("a")).unwrap();
    assert_eq!(
        std::fs::read_to_string(mnt.join("b")).map_err(|e| e.kind()),
        Ok("linked\n".to_string())
    );
    // Also for writing (another descriptor of the daemon).
    std::fs::write(mnt.join("b"), "rewritten\n").unwrap();
    assert_eq!(
        std::fs::read_to_string(src.join("b")).unwrap(),
        "rewritten\n"
    );
}

/// What user `uid` (its own group, no others) gets opening `name` in `dir` and reading it
/// (no stat: the kernel asks nothing of the daemon before the READ): `open ERROR`,
/// `read ERROR`, or `read BYTES`.
fn read_as(uid: u32, dir: &Path, name: &str) -> String {
    const READ: &str = r#"
import os, sys
try:
    fd = os.open(sys.argv[1], os.O_RDONLY)
except OSError as e:
    print("open", e.strerror)
    sys.exit(0)
try:
    print("read", os.read(fd, 4096))
except OSError as e:
    print("read", e.strerror)
"#;
    let o = std::process::Command::new("setpriv")
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={uid}"))
        .arg("--clear-groups")
        .args([PY, "-c", READ, name])
        .current_dir(dir)
        .env("LC_ALL", "C")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("setpriv");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).trim_end().to_string()
}

/// Whether user `uid` (its own group, no others) may read `name` in `dir` (access(2)):
/// `True` or `False`.
fn access_as(uid: u32, dir: &Path, name: &str) -> String {
    let o = std::process::Command::new("setpriv")
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={uid}"))
        .arg("--clear-groups")
        .args([
            PY,
            "-c",
            "import os, sys; print(os.access(sys.argv[1], os.R_OK))",
            name,
        ])
        .current_dir(dir)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("setpriv");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).trim_end().to_string()
}

/// Whether this process (the daemon serves the test mounts in it) has a descriptor of `p`.
fn holds_descriptor_of(p: &Path) -> bool {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.flatten()
                .any(|e| std::fs::read_link(e.path()).is_ok_and(|l| l == p))
        })
        .unwrap_or(false)
}

/// How many pages of `f`'s file the kernel's page cache holds (cachestat(2), Linux 6.5;
/// `None` where the call is missing).
fn cached_pages(f: &std::fs::File) -> Option<u64> {
    use std::os::fd::AsRawFd;
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    // The number of cachestat in the kernel's common system call table (not in `libc`).
    const SYS_CACHESTAT: libc::c_long = 451;
    // len 0: to the end of the file.
    let range = Range { off: 0, len: 0 };
    let mut st = Stat::default();
    // SAFETY: cachestat on a descriptor this test owns, with pointers to live structs laid
    // out as the kernel's `cachestat_range` and `cachestat`.
    let rc = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            f.as_raw_fd(),
            &range as *const Range,
            &mut st as *mut Stat,
            0u32,
        )
    };
    (rc == 0).then_some(st.nr_cache)
}

/// Drop the kernel's pages of the file the mount has at `m` (`open=noopen`: the kernel opens
/// by itself, so only a page-cache miss makes a read reach the daemon).
/// POSIX_FADV_DONTNEED skips a page that someone else holds locked or referenced at that
/// moment (reclaim, another engineer's drop_caches): a user's read would then be served the
/// old file's page without a request (no secret, and nothing tested). Until none is left.
fn drop_kernel_pages(m: &Path, label: &str) {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(m).unwrap();
    let dropped = wait_for(Duration::from_secs(20), || {
        // SAFETY: fadvise on a descriptor this test owns.
        let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(rc, 0);
        cached_pages(&f).is_none_or(|n| n == 0)
    });
    assert!(
        dropped.is_some(),
        "{label}: the kernel keeps the old file's pages"
    );
}

/// A world-readable file read by a user through the mount, then replaced in SRC by root's
/// 0600 secret that ext4 gives the same inode number (a new birth time), before any change
/// feed reports it (the mount has none: the window made endless, so the kernel keeps the old
/// file's dentry, attributes and ACL). When the kernel comes back to the daemon for the old
/// inode (`open=rpc`: the OPEN; `open=noopen`: a READ after the page cache was dropped,
/// which the daemon answers with a descriptor it opens as root) the daemon must not take the
/// new file for the old one: the user never reads the secret, and from then on the mount
/// shows the new file as SRC does (the user refused as natively, root reading it, its
/// attributes).
#[test]
fn file_replaced_with_its_inode_number_is_served_as_the_new_file() {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    if !can_mount() {
        return;
    }
    const OLD: &str = "an old file, readable by everyone\n";
    const SECRET: &str = "root's secret\n";
    let user = 1001;
    // `open=rpc` once with root's open first: no earlier request of the user's (their ACL
    // read) has made the daemon forget the name, the OPEN's own check must find the new file.
    for (label, no_open, root_first) in [
        ("rpc", false, false),
        ("noopen", true, false),
        ("rpc, root first", false, true),
    ] {
        let t = TestMount::with_policy_without_feed(dircache_fuse::CachePolicy {
            no_open,
            ..Default::default()
        });
        // A fresh name per try, until the new file gets the old one's number (another file
        // created on this file system meanwhile may take it).
        let mut tries = 0;
        let name = loop {
            tries += 1;
            assert!(tries <= 50, "{label}: ext4 never gave a number back");
            let name = format!("f{tries}");
            let (s, m) = (t.s(&name), t.m(&name));
            std::fs::write(&s, OLD).unwrap();
            chmod(&s, 0o644);
            assert_eq!(
                read_as(user, &t.mnt, &name),
                "read b'an old file, readable by everyone\\n'",
                "{label}"
            );
            let old = std::fs::metadata(&s).unwrap();
            // The daemon closed its descriptor (RELEASE comes after close): ext4 frees the
            // number only with the inode.
            assert!(
                wait_for(Duration::from_secs(20), || !holds_descriptor_of(&s)).is_some(),
                "{label}: the daemon keeps {name} open"
            );
            // A tick of ext4's coarse clock (4 ms) or more: another birth time.
            std::thread::sleep(Duration::from_millis(20));
            std::fs::remove_file(&s).unwrap();
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&s)
                .and_then(|mut w| std::io::Write::write_all(&mut w, SECRET.as_bytes()))
                .unwrap();
            if std::fs::metadata(&s).unwrap().ino() != old.ino() {
                continue;
            }
            if no_open {
                // The kernel opens by itself (no request): the user's next read must reach
                // the daemon.
                drop_kernel_pages(&m, label);
            }
            break name;
        };
        // Root reads the new file, whole, and sees its attributes as SRC shows them.
        let root_reads = || {
            assert_eq!(
                std::fs::read_to_string(t.m(&name)).map_err(|e| e.to_string()),
                Ok(SECRET.to_string()),
                "{label}: root's read"
            );
            let fmt = format!("stat -c '%i %a %u %g %s %h' {name}");
            assert_eq!(sh_ok(&t.mnt, &fmt), sh_ok(&t.src, &fmt), "{label}: stat");
        };
        if root_first {
            root_reads();
        }
        // Natively the user is refused.
        let refused = read_as(user, &t.src, &name);
        assert_eq!(refused, "open Permission denied", "native");
        // Through the mount: never the secret. The first try may fail with ESTALE (the
        // kernel opened the old file by itself: `open=noopen`), the next is refused as
        // natively (the kernel looked the name up again and found the new file).
        let first = read_as(user, &t.mnt, &name);
        assert!(
            !first.contains("secret"),
            "{label}: user {user} read the new 0600 file of root through the old one's inode: {first}"
        );
        assert!(
            first.starts_with("open ") || first == "read Stale file handle",
            "{label}: user {user}'s first try through the old file's inode (old data: served \
             from the kernel's pages without a request): {first}"
        );
        assert_eq!(
            read_as(user, &t.mnt, &name),
            refused,
            "{label}: the second try"
        );
        root_reads();
    }
}

/// A file whose ACL the kernel fetched through the mount for a user (none: world-readable
/// by its mode), removed in SRC, and a new file at another name that ext4 gives the same
/// inode number, world-readable by its mode but denying the user by a POSIX ACL
/// (`user:1001:---`), on a mount without a change feed. The kernel looks the new name up
/// (a new inode for it) and fetches its ACL: the daemon's memo of ACL absences (for
/// `ls -l`) must not answer for the new file what it learnt of the old one by its
/// `(dev, ino)` (`open=noopen`: the kernel then opens by the mode alone and the daemon
/// serves the READ as root). The user must be refused as natively.
#[test]
fn acl_of_a_new_file_with_a_removed_ones_inode_number_is_its_own() {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    if !can_mount() {
        return;
    }
    const SECRET: &str = "root's secret\n";
    let user = 1001;
    for (label, no_open) in [("noopen", true), ("rpc", false)] {
        let t = TestMount::with_policy_without_feed(dircache_fuse::CachePolicy {
            no_open,
            ..Default::default()
        });
        let mut tries = 0;
        let name = loop {
            tries += 1;
            assert!(tries <= 50, "{label}: ext4 never gave a number back");
            let (old_name, name) = (format!("a{tries}"), format!("b{tries}"));
            let a = t.s(&old_name);
            std::fs::write(&a, "old\n").unwrap();
            chmod(&a, 0o644);
            // The user's access check (as `ls -l` makes the kernel fetch ACLs).
            assert_eq!(access_as(user, &t.mnt, &old_name), "True", "{label}");
            let old = std::fs::metadata(&a).unwrap();
            std::thread::sleep(Duration::from_millis(20));
            std::fs::remove_file(&a).unwrap();
            let b = t.s(&name);
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .open(&b)
                .and_then(|mut w| std::io::Write::write_all(&mut w, SECRET.as_bytes()))
                .unwrap();
            if std::fs::metadata(&b).unwrap().ino() != old.ino() {
                continue;
            }
            sh_ok(&t.src, &format!("setfacl -m u:{user}:--- {name}"));
            break name;
        };
        let refused = read_as(user, &t.src, &name);
        assert_eq!(refused, "open Permission denied", "native");
        assert_eq!(read_as(user, &t.mnt, &name), refused, "{label}");
    }
}
