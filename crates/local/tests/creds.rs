//! Mutations run as the caller: ownership and permission decisions must equal what the kernel
//! decides for a real process of that user (the oracle runs std::fs on a thread whose
//! real/effective ids were switched with setresuid/setresgid/setgroups).
//! These tests need root (as in CI); they pass trivially otherwise.

mod common;

use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use common::*;
use dircache_core::{Backend, Cred, RenameMode, SetAttr};
use dircache_local::LocalBackend;

const NOBODY: u32 = 65534;
const U: u32 = 12345;
const G: u32 = 23456;
const SHARED: u32 = 4242;

fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

fn chown(p: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::lchown(p, Some(uid), Some(gid)).unwrap();
}

/// A tree with directories of various owners and modes. The tempdir itself is 0755 root.
fn setup() -> (tempfile::TempDir, PathBuf) {
    let t = tmp();
    let r = t.path().to_path_buf();
    chmod(&r, 0o755);
    for d in [
        "open",
        "closed",
        "group",
        "sticky",
        "setgid",
        "priv",
        "priv/open",
        "mine",
    ] {
        fs::create_dir(r.join(d)).unwrap();
    }
    chmod(&r.join("open"), 0o777);
    chmod(&r.join("closed"), 0o755);
    chown(&r.join("group"), 0, SHARED);
    chmod(&r.join("group"), 0o770);
    chmod(&r.join("sticky"), 0o1777);
    chown(&r.join("setgid"), 0, SHARED);
    chmod(&r.join("setgid"), 0o2777);
    chmod(&r.join("priv"), 0o700);
    chmod(&r.join("priv/open"), 0o777);
    chown(&r.join("mine"), U, G);
    chmod(&r.join("mine"), 0o755);
    fs::write(r.join("sticky/nobodys"), b"").unwrap();
    chown(&r.join("sticky/nobodys"), NOBODY, NOBODY);
    fs::write(r.join("open/rootfile"), b"").unwrap();
    chmod(&r.join("open/rootfile"), 0o644);
    (t, r)
}

/// An O_PATH descriptor of `r/dir`, opened as root.
fn parent_fd(r: &Path, dir: &str) -> std::os::fd::OwnedFd {
    use std::os::unix::fs::OpenOptionsExt;
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
        .open(if dir.is_empty() {
            r.to_path_buf()
        } else {
            r.join(dir)
        })
        .unwrap();
    f.into()
}

fn cvt(r: libc::c_int) -> std::io::Result<()> {
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

struct Who {
    uid: u32,
    gid: u32,
    groups: Vec<u32>,
}

impl Who {
    fn cred(&self) -> Cred {
        Cred::new(self.uid, self.gid, self.groups.iter().copied())
    }
    /// The kernel's errno for `f` run as this user (0 on success).
    fn kernel(&self, f: impl FnOnce() -> std::io::Result<()> + Send + 'static) -> i32 {
        kerrno(as_user(self.uid, self.gid, &self.groups, f))
    }
}

fn users() -> Vec<Who> {
    vec![
        Who {
            uid: NOBODY,
            gid: NOBODY,
            groups: vec![],
        },
        Who {
            uid: U,
            gid: G,
            groups: vec![SHARED, 777],
        },
        Who {
            uid: U,
            gid: G,
            groups: vec![],
        },
    ]
}

#[test]
fn creation_as_user_matches_kernel() {
    if !need_root("switches to other users' credentials") {
        return;
    }
    for (i, w) in users().iter().enumerate() {
        let (_t, r) = setup();
        let b = LocalBackend::new(&r).unwrap();
        let c = w.cred();
        for dir in [
            "open",
            "closed",
            "group",
            "sticky",
            "setgid",
            "priv/open",
            "mine",
            "",
        ] {
            let name = |s: &str| {
                if dir.is_empty() {
                    format!("{s}{i}")
                } else {
                    format!("{dir}/{s}{i}")
                }
            };
            // The kernel oracle works relative to a descriptor of the parent opened by root,
            // as a process holding that directory would: search permission on the ancestors
            // is the cache's business, not the backend's.
            let pfd = parent_fd(&r, dir);
            let fd = pfd.as_raw_fd();
            let kn = |s: &str| std::ffi::CString::new(format!("{s}{i}")).unwrap();
            // mkdir: backend first, then the kernel oracle on a different name
            let bp = name("b");
            let kp = kn("k");
            let got = b.mkdir(&c, bp.as_bytes(), 0o775);
            // SAFETY: fd stays open (pfd) during the call; kp is NUL-terminated.
            let want = w.kernel(move || cvt(unsafe { libc::mkdirat(fd, kp.as_ptr(), 0o775) }));
            assert_eq!(errno_of(got), want, "mkdir {bp} as {}", w.uid);
            if want == 0 {
                let a = b.getattr(bp.as_bytes()).unwrap();
                let k = kattr(&r.join(name("k"))).unwrap();
                assert_eq!(
                    (a.uid, a.gid, a.mode),
                    (k.uid, k.gid, k.mode),
                    "owner of {bp}"
                );
                assert_eq!(a.uid, w.uid);
                if dir == "setgid" {
                    assert_eq!(a.gid, SHARED);
                    assert_ne!(a.mode & libc::S_ISGID, 0);
                } else {
                    assert_eq!(a.gid, w.gid);
                }
            }
            // regular file via mknod
            let bp = name("f");
            let kp = kn("kf");
            let got = b.mknod(&c, bp.as_bytes(), libc::S_IFREG | 0o664, 0);
            // SAFETY: as above.
            let want = w.kernel(move || {
                cvt(unsafe { libc::mknodat(fd, kp.as_ptr(), libc::S_IFREG | 0o664, 0) })
            });
            assert_eq!(errno_of(got), want, "mknod {bp} as {}", w.uid);
            if want == 0 {
                let a = b.getattr(bp.as_bytes()).unwrap();
                assert_eq!(a.uid, w.uid);
                assert_eq!(a.gid, kattr(&r.join(name("kf"))).unwrap().gid);
            }
            // symlink
            let bp = name("l");
            let kp = kn("kl");
            let got = b.symlink(&c, b"target", bp.as_bytes());
            // SAFETY: as above.
            let want = w.kernel(move || {
                cvt(unsafe { libc::symlinkat(c"target".as_ptr(), fd, kp.as_ptr()) })
            });
            assert_eq!(errno_of(got), want, "symlink {bp} as {}", w.uid);
            if want == 0 {
                assert_eq!(b.getattr(bp.as_bytes()).unwrap().uid, w.uid);
            }
            // open(O_CREAT)
            let bp = name("o");
            let kp = kn("ko");
            let got = b.open(
                &c,
                bp.as_bytes(),
                libc::O_CREAT | libc::O_WRONLY | libc::O_EXCL,
                0o600,
            );
            // SAFETY: as above; the descriptor returned is closed at once.
            let want = w.kernel(move || {
                let f = unsafe {
                    libc::openat(
                        fd,
                        kp.as_ptr(),
                        libc::O_CREAT | libc::O_WRONLY | libc::O_EXCL,
                        0o600,
                    )
                };
                cvt(f).map(|_| unsafe { libc::close(f) }).map(drop)
            });
            assert_eq!(errno_of(got), want, "open O_CREAT {bp} as {}", w.uid);
            if want == 0 {
                assert_eq!(b.getattr(bp.as_bytes()).unwrap().uid, w.uid);
            }
        }
        // The daemon thread is root again afterwards.
        let a = b.mkdir(&Cred::root(), b"after", 0o700).unwrap();
        assert_eq!((a.uid, a.gid), (0, 0));
        assert_eq!(fs::metadata(r.join("after")).unwrap().uid(), 0);
    }
}

#[test]
fn expected_denials() {
    if !need_root("switches to other users' credentials") {
        return;
    }
    let (_t, r) = setup();
    let b = LocalBackend::new(&r).unwrap();
    let nobody = Cred::new(NOBODY, NOBODY, []);
    let member = Cred::new(U, G, [SHARED]);
    let outsider = Cred::new(U, G, []);
    // No write permission on a root-owned 0755 directory.
    assert_eq!(errno_of(b.mkdir(&nobody, b"closed/x", 0o755)), libc::EACCES);
    // Supplementary group grants access; without it, EACCES.
    assert_eq!(errno_of(b.mkdir(&member, b"group/x", 0o755)), 0);
    assert_eq!(
        errno_of(b.mkdir(&outsider, b"group/y", 0o755)),
        libc::EACCES
    );
    // Search permission on ancestors is the cache's job (directory references): priv (0700
    // root) does not stop a create in priv/open (0777), as for a process holding priv/open.
    assert_eq!(errno_of(b.mkdir(&nobody, b"priv/open/x", 0o755)), 0);
    // Search permission on the parent itself is checked by the kernel.
    assert_eq!(errno_of(b.mkdir(&nobody, b"priv/y", 0o755)), libc::EACCES);
    // Sticky directory: may not remove someone else's file.
    assert_eq!(
        errno_of(b.unlink(&outsider, b"sticky/nobodys")),
        libc::EPERM
    );
    assert_eq!(
        errno_of(b.rename(
            &outsider,
            b"sticky/nobodys",
            b"sticky/x",
            RenameMode::Replace
        )),
        libc::EPERM
    );
    assert_eq!(errno_of(b.unlink(&nobody, b"sticky/nobodys")), 0);
    // chmod / chown of a file one does not own: EPERM; chown to another uid: EPERM even for
    // the owner.
    let set_mode = SetAttr {
        mode: Some(0o600),
        ..Default::default()
    };
    assert_eq!(
        errno_of(b.setattr(&nobody, b"open/rootfile", &set_mode)),
        libc::EPERM
    );
    assert_eq!(errno_of(b.setattr(&outsider, b"mine", &set_mode)), 0);
    let set_uid = SetAttr {
        uid: Some(NOBODY),
        ..Default::default()
    };
    assert_eq!(
        errno_of(b.setattr(&outsider, b"mine", &set_uid)),
        libc::EPERM
    );
    // The owner may give a file to a group he belongs to, not to another one.
    let set_gid = SetAttr {
        gid: Some(SHARED),
        ..Default::default()
    };
    let member_owner = Cred::new(U, G, [SHARED]);
    assert_eq!(
        errno_of(b.setattr(&outsider, b"mine", &set_gid)),
        libc::EPERM
    );
    assert_eq!(errno_of(b.setattr(&member_owner, b"mine", &set_gid)), 0);
    assert_eq!(fs::metadata(r.join("mine")).unwrap().gid(), SHARED);
    // truncate needs write permission on the file
    let trunc = SetAttr {
        size: Some(0),
        ..Default::default()
    };
    assert_eq!(
        errno_of(b.setattr(&nobody, b"open/rootfile", &trunc)),
        libc::EACCES
    );
    // utimes to an explicit time needs ownership; "now" needs write permission
    let t = SetAttr {
        mtime: Some(dircache_core::TimeSet::At(dircache_core::Timespec {
            sec: 5,
            nsec: 0,
        })),
        ..Default::default()
    };
    assert_eq!(
        errno_of(b.setattr(&nobody, b"open/rootfile", &t)),
        libc::EPERM
    );
    // open for writing a file one may only read
    assert_eq!(
        errno_of(b.open(&nobody, b"open/rootfile", libc::O_WRONLY, 0)),
        libc::EACCES
    );
    assert_eq!(
        errno_of(b.open(&nobody, b"open/rootfile", libc::O_RDONLY, 0)),
        0
    );
    // device nodes need CAP_MKNOD, which the fs-uid switch drops
    assert_eq!(
        errno_of(b.mknod(
            &nobody,
            b"open/null",
            libc::S_IFCHR | 0o666,
            libc::makedev(1, 3)
        )),
        libc::EPERM
    );
    // hard link to a file one does not own, with protected_hardlinks: EPERM, like the kernel
    let kernel = kerrno(as_user(NOBODY, NOBODY, &[], {
        let r = r.clone();
        move || fs::hard_link(r.join("open/rootfile"), r.join("open/klink"))
    }));
    assert_eq!(
        errno_of(b.link(&nobody, b"open/rootfile", b"open/blink")),
        kernel
    );
}

#[test]
fn mutations_on_other_threads_are_not_affected() {
    if !need_root("switches to other users' credentials") {
        return;
    }
    // Many threads mutating as different users at once: each file gets its own caller's owner.
    let (_t, r) = setup();
    let b = std::sync::Arc::new(LocalBackend::new(&r).unwrap());
    let hs: Vec<_> = (0..8u32)
        .map(|i| {
            let b = b.clone();
            std::thread::spawn(move || {
                let uid = if i % 2 == 0 { 0 } else { 20000 + i };
                let c = Cred::new(uid, uid, []);
                for j in 0..200 {
                    let p = format!("open/t{i}-{j}");
                    let a = b.mknod(&c, p.as_bytes(), libc::S_IFREG | 0o644, 0).unwrap();
                    assert_eq!(a.uid, uid);
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    for i in 0..8u32 {
        let uid = if i % 2 == 0 { 0 } else { 20000 + i };
        for j in 0..200 {
            assert_eq!(
                fs::symlink_metadata(r.join(format!("open/t{i}-{j}")))
                    .unwrap()
                    .uid(),
                uid
            );
        }
    }
}

/// An open for execve (the kernel's __FMODE_EXEC in the flags, after it checked MAY_EXEC):
/// an execute-only file opens for the runner, and only when the runner may execute it and
/// search its directory; a plain read of it stays refused.
#[test]
fn exec_open_of_execute_only_file() {
    if !need_root("switches to other users' credentials") {
        return;
    }
    const FMODE_EXEC: i32 = 0o40;
    let t = tmp();
    let r = t.path();
    chmod(r, 0o755);
    fs::write(r.join("xo"), b"\x7fELF program").unwrap();
    chmod(&r.join("xo"), 0o711);
    fs::write(r.join("noexec"), b"data").unwrap();
    chmod(&r.join("noexec"), 0o644);
    fs::create_dir(r.join("closed")).unwrap();
    fs::write(r.join("closed/xo"), b"x").unwrap();
    chmod(&r.join("closed/xo"), 0o711);
    chmod(&r.join("closed"), 0o700);
    let b = LocalBackend::new(r).unwrap();
    let u = Cred::new(U, G, []);
    let fd = b.open(&u, b"xo", libc::O_RDONLY | FMODE_EXEC, 0).unwrap();
    let mut head = [0u8; 4];
    use std::io::Read;
    fs::File::from(fd.fd().unwrap().try_clone_to_owned().unwrap())
        .read_exact(&mut head)
        .unwrap();
    assert_eq!(&head, b"\x7fELF");
    let plain = b.open(&u, b"xo", libc::O_RDONLY, 0).map(drop);
    assert_eq!(plain, Err(dircache_core::Error::Access));
    let noexec = b
        .open(&u, b"noexec", libc::O_RDONLY | FMODE_EXEC, 0)
        .map(drop);
    assert_eq!(noexec, Err(dircache_core::Error::Access));
    let closed = b
        .open(&u, b"closed/xo", libc::O_RDONLY | FMODE_EXEC, 0)
        .map(drop);
    assert_eq!(closed, Err(dircache_core::Error::Access));
    let dir = b
        .open(&u, b"closed", libc::O_RDONLY | FMODE_EXEC, 0)
        .map(drop);
    assert_eq!(dir, Err(dircache_core::Error::Access));
}

/// A loop-mounted ext4 file system, unmounted (and its loop device released) on drop.
struct Ext4 {
    _dir: tempfile::TempDir,
    mnt: PathBuf,
}

impl Ext4 {
    /// 8 MiB, 1 KiB blocks, 20 % of the blocks reserved for root (CAP_SYS_RESOURCE).
    fn new() -> Option<Ext4> {
        let dir = tmp();
        let img = dir.path().join("img");
        let mnt = dir.path().join("m");
        fs::create_dir(&mnt).unwrap();
        fs::File::create(&img).unwrap().set_len(8 << 20).unwrap();
        let ok = |c: &mut std::process::Command| c.status().map(|s| s.success()).unwrap_or(false);
        if !ok(std::process::Command::new("mkfs.ext4")
            .args(["-q", "-F", "-m", "20", "-b", "1024"])
            .arg(&img))
        {
            assert!(std::env::var("CI").is_err(), "mkfs.ext4 failed in CI");
            eprintln!("skipping: no mkfs.ext4");
            return None;
        }
        if !ok(std::process::Command::new("mount")
            .args(["-o", "loop"])
            .arg(&img)
            .arg(&mnt))
        {
            assert!(std::env::var("CI").is_err(), "loop mount failed in CI");
            eprintln!("skipping: cannot loop-mount");
            return None;
        }
        Some(Ext4 { _dir: dir, mnt })
    }
}

impl Drop for Ext4 {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.mnt).status();
    }
}

/// Run `sh -c script` in `dir` as uid/gid `id` without groups or capabilities (setpriv).
fn sh_as(id: u32, dir: &Path, script: &str) -> std::process::Output {
    std::process::Command::new("setpriv")
        .arg(format!("--reuid={id}"))
        .arg(format!("--regid={id}"))
        .args(["--clear-groups", "sh", "-c", script])
        .current_dir(dir)
        .env("LC_ALL", "C")
        .output()
        .expect("setpriv sh")
}

/// The blocks a file system reserves for root are not a user's: once only those are free, a
/// user's mkdir fails with ENOSPC natively, and so must the same mkdir made as that user by
/// the backend (which runs as root with CAP_SYS_RESOURCE unless it drops it for the caller).
/// Quota limits are lifted by the same capability.
#[test]
fn reserved_blocks_are_not_the_callers() {
    if !need_root("switches to other users' credentials") {
        return;
    }
    let Some(ext4) = Ext4::new() else {
        return;
    };
    let m = &ext4.mnt;
    chmod(m, 0o777);
    if !rustix::thread::capabilities(None)
        .map(|c| {
            c.effective
                .contains(rustix::thread::CapabilitySet::SYS_RESOURCE)
        })
        .unwrap_or(false)
    {
        // Then the backend cannot use the reserve either: the test shows nothing here.
        eprintln!("note: no CAP_SYS_RESOURCE here (container bounding set?)");
    }
    // The user fills the file system: what is left is root's reserve.
    let fill = sh_as(U, m, "dd if=/dev/zero of=fill bs=1k 2>&1; exit 0");
    let free = |p: &Path| {
        let s = rustix::fs::statvfs(p).unwrap();
        (s.f_bfree, s.f_bavail)
    };
    let (bfree, bavail) = free(m);
    assert!(
        bavail == 0 && bfree > 100,
        "not only the reserve left: {bfree} free, {bavail} available; {}",
        String::from_utf8_lossy(&fill.stdout)
    );
    // Natively: ENOSPC for the user.
    let native = sh_as(U, m, "mkdir native");
    assert!(!native.status.success());
    assert!(
        String::from_utf8_lossy(&native.stderr).contains("No space left"),
        "{}",
        String::from_utf8_lossy(&native.stderr)
    );
    // Through the backend, as that user: the same.
    let b = LocalBackend::new(m).unwrap();
    let r = b.mkdir(&Cred::new(U, U, []), b"through", 0o755);
    assert_eq!(
        r.map(|_| ()).map_err(|e| e.errno()),
        Err(libc::ENOSPC),
        "the backend used root's reserve for a user"
    );
    assert!(!m.join("through").exists());
    // Root may use its reserve, natively and through the backend.
    b.mkdir(&Cred::root(), b"roots", 0o755).unwrap();
}

/// Capabilities that are not file-system capabilities survive an fs uid switch. A user's own
/// process holds none of them, so a mutation the backend makes as a user must not use them
/// either: setting file capabilities (`security.capability`, CAP_SETFCAP) on one's own
/// program is EPERM natively, and must be EPERM through the backend (which a root daemon
/// would otherwise do with its own CAP_SETFCAP: a user's program running as root). The same
/// holds for CAP_SYS_RESOURCE (quotas, blocks reserved for root:
/// `reserved_blocks_are_not_the_callers`).
#[test]
fn mutations_as_a_user_hold_no_capabilities() {
    if !need_root("switches to other users' credentials") {
        return;
    }
    let t = tmp();
    let r = t.path();
    chmod(r, 0o755);
    let f = r.join("prog");
    fs::write(&f, "#!/bin/sh\n").unwrap();
    chown(&f, U, U);
    chmod(&f, 0o755);
    // VFS_CAP_REVISION_2 | VFS_CAP_FLAGS_EFFECTIVE, permitted = CAP_SETUID.
    let mut cap = Vec::new();
    for w in [0x0200_0001u32, 1 << 7, 0, 0, 0] {
        cap.extend_from_slice(&w.to_le_bytes());
    }
    let hex: String = cap.iter().map(|b| format!("{b:02x}")).collect();
    let native = sh_as(
        U,
        r,
        &format!("setfattr -n security.capability -v 0x{hex} prog 2>&1; echo rc=$?"),
    );
    let native = String::from_utf8_lossy(&native.stdout).into_owned();
    if native.contains("not found") {
        assert!(std::env::var("CI").is_err(), "setfattr missing in CI");
        eprintln!("skipping: no setfattr");
        return;
    }
    assert!(
        native.contains("Operation not permitted") && !native.contains("rc=0"),
        "natively: {native}"
    );
    let b = LocalBackend::new(r).unwrap();
    let target = dircache_core::XattrTarget {
        path: b"prog",
        expect: None,
        birth: 0,
        open: None,
    };
    let got = b.setxattr(
        &Cred::new(U, U, []),
        target,
        b"security.capability",
        &cap,
        0,
    );
    assert_eq!(
        got.map_err(|e| e.errno()),
        Err(libc::EPERM),
        "the backend set file capabilities for a user"
    );
    // Root may, natively and through the backend.
    b.setxattr(&Cred::root(), target, b"security.capability", &cap, 0)
        .unwrap();
}
