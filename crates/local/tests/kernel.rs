//! LocalBackend answers compared with the kernel's (std::fs / libc) on temp directories.

mod common;

use std::ffi::CString;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirEntryExt, MetadataExt, PermissionsExt};
use std::path::Path;

use common::*;
use dircache_core::{Backend, Cred, Error, FileType, RenameMode, SetAttr, TimeSet, Timespec};
use dircache_local::{LocalBackend, WatchMode};

fn root() -> Cred {
    Cred::root()
}

/// A small tree with every kind of file.
fn populate(r: &Path) {
    fs::create_dir_all(r.join("d/e/f")).unwrap();
    fs::write(r.join("d/file"), b"hello").unwrap();
    fs::write(r.join("top"), b"0123456789").unwrap();
    std::os::unix::fs::symlink("d/file", r.join("lnk")).unwrap();
    std::os::unix::fs::symlink("/etc", r.join("abs")).unwrap();
    fs::hard_link(r.join("top"), r.join("d/hard")).unwrap();
    let fifo = CString::new(r.join("fifo").as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o640) }, 0);
    let _sock = std::os::unix::net::UnixListener::bind(r.join("sock")).unwrap();
}

#[test]
fn new_rejects_missing_and_non_directories() {
    let t = tmp();
    assert_eq!(
        LocalBackend::new(&t.path().join("nope")).unwrap_err(),
        Error::NotFound
    );
    fs::write(t.path().join("f"), b"").unwrap();
    assert_eq!(
        LocalBackend::new(&t.path().join("f")).unwrap_err(),
        Error::NotDir
    );
}

#[test]
fn attrs_equal_lstat() {
    let t = tmp();
    let r = t.path();
    populate(r);
    let b = cached(r);
    for rel in [
        "", "d", "d/e", "d/e/f", "d/file", "top", "lnk", "abs", "d/hard", "fifo", "sock",
    ] {
        let want = kattr(&p(r, rel)).unwrap();
        assert_eq!(b.getattr(rel.as_bytes()).unwrap(), want, "getattr {rel}");
        if let Some(i) = rel.rfind('/') {
            let got = b
                .lookup(&rel.as_bytes()[..i], &rel.as_bytes()[i + 1..])
                .unwrap();
            assert_eq!(got, want, "lookup {rel}");
        } else if !rel.is_empty() {
            assert_eq!(b.lookup(b"", rel.as_bytes()).unwrap(), want, "lookup {rel}");
        }
    }
    assert_eq!(b.getattr(b"top").unwrap().nlink, 2);
    assert_eq!(b.getattr(b"lnk").unwrap().kind(), FileType::Symlink);
    assert_eq!(b.getattr(b"fifo").unwrap().kind(), FileType::Fifo);
    assert_eq!(b.getattr(b"sock").unwrap().kind(), FileType::Socket);
    // walk (default implementation over lookup)
    let w = b.walk(b"", &[b"d", b"e", b"f"]);
    assert_eq!(w.attrs.len(), 3);
    assert_eq!(w.error, None);
    let w = b.walk(b"", &[b"d", b"file", b"x"]);
    assert_eq!((w.attrs.len(), w.error), (2, Some(Error::NotDir)));
}

#[test]
fn lookup_errors_match_kernel() {
    let t = tmp();
    let r = t.path();
    populate(r);
    let b = cached(r);
    let k = |rel: &str| kerrno(fs::symlink_metadata(r.join(rel)));
    assert_eq!(errno_of(b.lookup(b"d", b"missing")), k("d/missing"));
    assert_eq!(errno_of(b.lookup(b"d", b"missing")), libc::ENOENT);
    assert_eq!(errno_of(b.lookup(b"missing", b"x")), k("missing/x"));
    assert_eq!(errno_of(b.lookup(b"top", b"x")), k("top/x"));
    assert_eq!(errno_of(b.lookup(b"top", b"x")), libc::ENOTDIR);
    assert_eq!(errno_of(b.getattr(b"d/file/x")), libc::ENOTDIR);
    let long = "x".repeat(256);
    assert_eq!(errno_of(b.lookup(b"", long.as_bytes())), k(&long));
    // malformed backend paths are refused, never interpreted
    assert_eq!(b.lookup(b"", b"..").unwrap_err(), Error::Invalid);
    assert_eq!(b.lookup(b"", b"a/b").unwrap_err(), Error::Invalid);
    assert_eq!(b.getattr(b"/etc").unwrap_err(), Error::Invalid);
    assert_eq!(b.getattr(b"d/../..").unwrap_err(), Error::Invalid);
    assert_eq!(b.getattr(b"d\0x").unwrap_err(), Error::Invalid);
}

#[test]
fn symlinks_are_never_followed_and_never_escape() {
    let t = tmp();
    let r = t.path();
    populate(r);
    std::os::unix::fs::symlink("../../../../../../", r.join("up")).unwrap();
    let b = cached(r);
    // A symlink in a non-final component: ELOOP (RESOLVE_NO_SYMLINKS), never the target.
    for dir in [&b"abs"[..], b"up", b"lnk"] {
        let e = b.lookup(dir, b"passwd").unwrap_err();
        assert!(matches!(e, Error::Loop | Error::CrossDevice), "{e:?}");
        let e = b.readdir(dir, false).unwrap_err();
        assert!(matches!(e, Error::Loop | Error::CrossDevice), "{e:?}");
    }
    assert_eq!(b.getattr(b"abs/passwd").unwrap_err(), Error::Loop);
    assert_eq!(
        b.open(&root(), b"abs/passwd", libc::O_RDONLY, 0)
            .unwrap_err(),
        Error::Loop
    );
    // A final symlink is not followed by open either.
    assert_eq!(
        b.open(&root(), b"lnk", libc::O_RDONLY, 0).unwrap_err(),
        Error::Loop
    );
    assert_eq!(b.mkdir(&root(), b"abs/x", 0o755).unwrap_err(), Error::Loop);
    assert_eq!(
        b.mknod(&root(), b"up/x", libc::S_IFREG | 0o644, 0)
            .unwrap_err(),
        Error::Loop
    );
    assert!(!Path::new("/etc/x").exists());
    // Swap a directory for a symlink behind the backend's back (after its fd was cached).
    b.lookup(b"d/e", b"f").unwrap();
    fs::rename(r.join("d/e"), r.join("e-moved")).unwrap();
    std::os::unix::fs::symlink("/", r.join("d/e")).unwrap();
    b.forget_cached_fds();
    assert_eq!(b.lookup(b"d/e", b"etc").unwrap_err(), Error::Loop);
    assert_eq!(b.readdir(b"d/e", true).unwrap_err(), Error::Loop);
    // Even without forget_cached_fds, a cached descriptor stays inside the root (it follows
    // the moved directory): never the symlink's target.
    let t2 = tmp();
    let r2 = t2.path();
    fs::create_dir_all(r2.join("a/b")).unwrap();
    let b2 = cached(r2);
    b2.readdir(b"a/b", false).unwrap();
    fs::rename(r2.join("a/b"), r2.join("moved")).unwrap();
    std::os::unix::fs::symlink("/", r2.join("a/b")).unwrap();
    assert!(b2.lookup(b"a/b", b"etc").is_err());
}

#[test]
fn readdir_equals_kernel_listing() {
    let t = tmp();
    let r = t.path();
    populate(r);
    fs::create_dir(r.join("big")).unwrap();
    for i in 0..1000 {
        fs::write(r.join(format!("big/f{i:04}")), b"x").unwrap();
    }
    fs::create_dir(r.join("empty")).unwrap();
    let b = cached(r);
    for dir in ["", "d", "big", "empty", "d/e/f"] {
        let mut want: Vec<(Vec<u8>, u64, bool, bool)> = fs::read_dir(p(r, dir))
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let ft = e.file_type().unwrap();
                (
                    e.file_name().as_bytes().to_vec(),
                    e.ino(),
                    ft.is_dir(),
                    ft.is_symlink(),
                )
            })
            .collect();
        want.sort();
        for plus in [false, true] {
            let mut got = b.readdir(dir.as_bytes(), plus).unwrap();
            got.sort_by(|a, b| a.name.cmp(&b.name));
            let g: Vec<_> = got
                .iter()
                .map(|e| {
                    (
                        e.name.clone(),
                        e.ino,
                        e.kind == FileType::Directory,
                        e.kind == FileType::Symlink,
                    )
                })
                .collect();
            assert_eq!(g, want, "readdir {dir} plus={plus}");
            for e in &got {
                let path = r.join(std::ffi::OsStr::from_bytes(&e.name));
                let path = if dir.is_empty() {
                    path
                } else {
                    r.join(dir).join(std::ffi::OsStr::from_bytes(&e.name))
                };
                if plus {
                    let a = e.attr.expect("plus gives attributes");
                    let k = kattr(&path).unwrap();
                    // atime of directories may move when they are read; compare the rest
                    assert_eq!(
                        (a.ino, a.mode, a.nlink, a.size, a.mtime, a.uid),
                        (k.ino, k.mode, k.nlink, k.size, k.mtime, k.uid)
                    );
                    assert_eq!(FileType::from_mode(k.mode), e.kind);
                } else {
                    assert!(e.attr.is_none());
                }
            }
        }
    }
    assert_eq!(b.readdir(b"top", false).unwrap_err(), Error::NotDir);
    assert_eq!(b.readdir(b"missing", false).unwrap_err(), Error::NotFound);
}

#[test]
fn readlink_and_statfs() {
    let t = tmp();
    let r = t.path();
    populate(r);
    let b = cached(r);
    for l in ["lnk", "abs"] {
        assert_eq!(
            b.readlink(l.as_bytes()).unwrap(),
            fs::read_link(r.join(l)).unwrap().as_os_str().as_bytes()
        );
    }
    assert_eq!(
        errno_of(b.readlink(b"top")),
        kerrno(fs::read_link(r.join("top")))
    );
    assert_eq!(errno_of(b.readlink(b"top")), libc::EINVAL);
    assert_eq!(errno_of(b.readlink(b"nope")), libc::ENOENT);
    let s = b.statfs(b"").unwrap();
    // SAFETY: statfs is plain data; all-zero is a valid value.
    let mut k: libc::statfs = unsafe { std::mem::zeroed() };
    let c = CString::new(r.as_os_str().as_bytes()).unwrap();
    // SAFETY: valid path and out-pointer.
    assert_eq!(unsafe { libc::statfs(c.as_ptr(), &mut k) }, 0);
    assert_eq!(
        (s.blocks, s.bsize as i64, s.files, s.namelen as i64),
        (k.f_blocks, k.f_bsize, k.f_files, k.f_namelen)
    );
    assert_eq!(b.statfs(b"d/file").unwrap().blocks, s.blocks);
}

#[test]
fn creation_mutations_match_kernel() {
    let t = tmp();
    let r = t.path();
    let b = cached(r);
    let c = root();
    // SAFETY: umask only changes the process mask; set 022 so kernel oracle agrees.
    let a = b.mknod(&c, b"reg", libc::S_IFREG | 0o640, 0).unwrap();
    assert_eq!(a, kattr(&r.join("reg")).unwrap());
    assert!(a.kind() == FileType::Regular && a.size == 0);
    let a = b.mknod(&c, b"fifo", libc::S_IFIFO | 0o600, 0).unwrap();
    assert_eq!(a, kattr(&r.join("fifo")).unwrap());
    assert_eq!(a.kind(), FileType::Fifo);
    let a = b.mknod(&c, b"sock", libc::S_IFSOCK | 0o600, 0).unwrap();
    assert_eq!(a.kind(), FileType::Socket);
    assert_eq!(a, kattr(&r.join("sock")).unwrap());
    if is_root() {
        let a = b
            .mknod(&c, b"null", libc::S_IFCHR | 0o666, libc::makedev(1, 3))
            .unwrap();
        assert_eq!(a, kattr(&r.join("null")).unwrap());
        assert_eq!(a.rdev, libc::makedev(1, 3));
    }
    let a = b.mkdir(&c, b"dir", 0o750).unwrap();
    assert_eq!(a, kattr(&r.join("dir")).unwrap());
    assert!(a.is_dir());
    let a = b.mkdir(&c, b"dir/sub", 0o700).unwrap();
    assert_eq!(a, kattr(&r.join("dir/sub")).unwrap());
    assert_eq!(kattr(&r.join("dir")).unwrap().nlink, 3);
    let a = b.symlink(&c, b"../x/y", b"dir/ln").unwrap();
    assert_eq!(a, kattr(&r.join("dir/ln")).unwrap());
    assert_eq!(
        fs::read_link(r.join("dir/ln")).unwrap(),
        Path::new("../x/y")
    );
    let a = b.link(&c, b"reg", b"dir/reg2").unwrap();
    assert_eq!(a.nlink, 2);
    assert_eq!(a, kattr(&r.join("reg")).unwrap());
    assert_eq!(a.ino, kattr(&r.join("dir/reg2")).unwrap().ino);
    // EEXIST everywhere, as the kernel
    assert_eq!(
        b.mknod(&c, b"reg", libc::S_IFREG | 0o600, 0).unwrap_err(),
        Error::Exists
    );
    assert_eq!(b.mkdir(&c, b"reg", 0o700).unwrap_err(), Error::Exists);
    assert_eq!(b.mkdir(&c, b"dir", 0o700).unwrap_err(), Error::Exists);
    assert_eq!(b.symlink(&c, b"t", b"dir").unwrap_err(), Error::Exists);
    assert_eq!(b.link(&c, b"reg", b"fifo").unwrap_err(), Error::Exists);
    assert_eq!(kerrno(fs::create_dir(r.join("dir"))), libc::EEXIST);
    // ENOENT / ENOTDIR parents
    assert_eq!(b.mkdir(&c, b"nope/x", 0o700).unwrap_err(), Error::NotFound);
    assert_eq!(b.mkdir(&c, b"reg/x", 0o700).unwrap_err(), Error::NotDir);
    assert_eq!(kerrno(fs::create_dir(r.join("reg/x"))), libc::ENOTDIR);
    // a hard link to a directory: EPERM as the kernel
    assert_eq!(
        errno_of(b.link(&c, b"dir", b"dirlink")),
        kerrno(fs::hard_link(r.join("dir"), r.join("dirlink")))
    );
    // The root cannot be created or removed.
    assert!(b.mkdir(&c, b"", 0o700).is_err());
    assert!(b.rmdir(&c, b"").is_err());
}

#[test]
fn removal_mutations_match_kernel() {
    let t = tmp();
    let r = t.path();
    populate(r);
    let b = cached(r);
    let c = root();
    // unlink a directory: EISDIR (Linux); rmdir a file: ENOTDIR; rmdir non-empty: ENOTEMPTY
    assert_eq!(errno_of(b.unlink(&c, b"d")), libc::EISDIR);
    assert_eq!(errno_of(b.rmdir(&c, b"top")), libc::ENOTDIR);
    assert_eq!(
        errno_of(b.rmdir(&c, b"d")),
        kerrno(fs::remove_dir(r.join("d")))
    );
    assert_eq!(errno_of(b.rmdir(&c, b"d")), libc::ENOTEMPTY);
    assert_eq!(errno_of(b.unlink(&c, b"missing")), libc::ENOENT);
    // unlink a symlink removes the link, not the target
    b.unlink(&c, b"lnk").unwrap();
    assert!(fs::symlink_metadata(r.join("lnk")).is_err());
    assert!(r.join("d/file").exists());
    b.unlink(&c, b"d/hard").unwrap();
    assert_eq!(kattr(&r.join("top")).unwrap().nlink, 1);
    assert_eq!(b.getattr(b"top").unwrap().nlink, 1);
    b.rmdir(&c, b"d/e/f").unwrap();
    assert!(!r.join("d/e/f").exists());
    assert_eq!(b.lookup(b"d/e", b"f").unwrap_err(), Error::NotFound);
    // the descriptor cache must not keep answering for a removed directory
    b.readdir(b"d/e", false).unwrap();
    b.rmdir(&c, b"d/e").unwrap();
    assert_eq!(b.readdir(b"d/e", false).unwrap_err(), Error::NotFound);
    assert_eq!(b.lookup(b"d/e", b"x").unwrap_err(), Error::NotFound);
}

#[test]
fn rename_modes_match_kernel() {
    let t = tmp();
    let r = t.path();
    let b = cached(r);
    let c = root();
    fs::write(r.join("a"), b"A").unwrap();
    fs::write(r.join("b"), b"B").unwrap();
    fs::create_dir_all(r.join("dir1/sub")).unwrap();
    fs::create_dir(r.join("dir2")).unwrap();
    fs::create_dir(r.join("empty")).unwrap();
    let ia = kattr(&r.join("a")).unwrap().ino;
    let ib = kattr(&r.join("b")).unwrap().ino;
    // NOREPLACE onto an existing name: EEXIST, nothing changes
    assert_eq!(
        b.rename(&c, b"a", b"b", RenameMode::NoReplace).unwrap_err(),
        Error::Exists
    );
    assert_eq!(fs::read(r.join("b")).unwrap(), b"B");
    // EXCHANGE swaps
    b.rename(&c, b"a", b"b", RenameMode::Exchange).unwrap();
    assert_eq!(kattr(&r.join("a")).unwrap().ino, ib);
    assert_eq!(kattr(&r.join("b")).unwrap().ino, ia);
    assert_eq!(b.getattr(b"a").unwrap().ino, ib);
    // EXCHANGE with a missing target: ENOENT
    assert_eq!(
        b.rename(&c, b"a", b"zz", RenameMode::Exchange).unwrap_err(),
        Error::NotFound
    );
    // EXCHANGE a file and a directory works
    b.rename(&c, b"a", b"dir2", RenameMode::Exchange).unwrap();
    assert!(r.join("a").is_dir() && r.join("dir2").is_file());
    b.rename(&c, b"a", b"dir2", RenameMode::Exchange).unwrap();
    // Replace
    b.rename(&c, b"a", b"b", RenameMode::Replace).unwrap();
    assert!(!r.join("a").exists());
    assert_eq!(kattr(&r.join("b")).unwrap().ino, ib);
    // NOREPLACE to a free name
    b.rename(&c, b"b", b"dir2/b", RenameMode::NoReplace)
        .unwrap();
    assert_eq!(kattr(&r.join("dir2/b")).unwrap().ino, ib);
    // directory onto non-empty directory: ENOTEMPTY (kernel agrees)
    fs::create_dir(r.join("full")).unwrap();
    fs::write(r.join("full/x"), b"").unwrap();
    assert_eq!(
        errno_of(b.rename(&c, b"dir1", b"full", RenameMode::Replace)),
        libc::ENOTEMPTY
    );
    assert_eq!(
        kerrno(fs::rename(r.join("dir1"), r.join("full"))),
        libc::ENOTEMPTY
    );
    // directory onto empty directory: replaces
    b.rename(&c, b"dir1", b"empty", RenameMode::Replace)
        .unwrap();
    assert!(r.join("empty/sub").is_dir());
    // file onto directory: EISDIR; directory onto file: ENOTDIR
    assert_eq!(
        errno_of(b.rename(&c, b"dir2/b", b"empty", RenameMode::Replace)),
        libc::EISDIR
    );
    assert_eq!(
        errno_of(b.rename(&c, b"empty", b"dir2/b", RenameMode::Replace)),
        libc::ENOTDIR
    );
    // directory into itself: EINVAL
    assert_eq!(
        errno_of(b.rename(&c, b"empty", b"empty/sub/x", RenameMode::Replace)),
        libc::EINVAL
    );
    assert_eq!(
        kerrno(fs::rename(r.join("empty"), r.join("empty/sub/x"))),
        libc::EINVAL
    );
    // missing source
    assert_eq!(
        errno_of(b.rename(&c, b"nope", b"x", RenameMode::Replace)),
        libc::ENOENT
    );
    // the fd cache follows renames done through the backend
    fs::write(r.join("empty/sub/inner"), b"").unwrap();
    b.lookup(b"empty/sub", b"inner").unwrap();
    b.rename(&c, b"empty", b"moved", RenameMode::Replace)
        .unwrap();
    fs::create_dir_all(r.join("empty/sub")).unwrap();
    assert_eq!(
        b.lookup(b"empty/sub", b"inner").unwrap_err(),
        Error::NotFound
    );
    b.lookup(b"moved/sub", b"inner").unwrap();
}

#[test]
fn setattr_matches_kernel() {
    let t = tmp();
    let r = t.path();
    populate(r);
    let b = cached(r);
    let c = root();
    // chmod
    let a = b
        .setattr(
            &c,
            b"top",
            &SetAttr {
                mode: Some(0o4711),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(a.perm(), 0o4711);
    assert_eq!(a, kattr(&r.join("top")).unwrap());
    let a = b
        .setattr(
            &c,
            b"d",
            &SetAttr {
                mode: Some(0o1777),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(a.mode, libc::S_IFDIR | 0o1777);
    // chmod of a symlink: EOPNOTSUPP like Linux's lchmod, target untouched
    let before = kattr(&r.join("d/file")).unwrap();
    assert_eq!(
        errno_of(b.setattr(
            &c,
            b"lnk",
            &SetAttr {
                mode: Some(0o600),
                ..Default::default()
            }
        )),
        libc::EOPNOTSUPP
    );
    assert_eq!(kattr(&r.join("d/file")).unwrap().mode, before.mode);
    if is_root() {
        // chown the link itself, not its target
        let a = b
            .setattr(
                &c,
                b"lnk",
                &SetAttr {
                    uid: Some(123),
                    gid: Some(456),
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!((a.uid, a.gid), (123, 456));
        assert_eq!(a, kattr(&r.join("lnk")).unwrap());
        assert_eq!(kattr(&r.join("d/file")).unwrap().uid, before.uid);
        // chown clears setuid, as the kernel does
        let a = b
            .setattr(
                &c,
                b"top",
                &SetAttr {
                    uid: Some(7),
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!((a.uid, a.perm() & 0o4000), (7, 0));
        let a = b
            .setattr(
                &c,
                b"top",
                &SetAttr {
                    gid: Some(8),
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!((a.uid, a.gid), (7, 8));
    }
    // truncate
    let a = b
        .setattr(
            &c,
            b"top",
            &SetAttr {
                size: Some(3),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(a.size, 3);
    assert_eq!(fs::read(r.join("top")).unwrap(), b"012");
    let a = b
        .setattr(
            &c,
            b"top",
            &SetAttr {
                size: Some(100_000),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(a, kattr(&r.join("top")).unwrap());
    assert_eq!(
        errno_of(b.setattr(
            &c,
            b"d",
            &SetAttr {
                size: Some(0),
                ..Default::default()
            }
        )),
        libc::EISDIR
    );
    assert_eq!(
        errno_of(b.setattr(
            &c,
            b"fifo",
            &SetAttr {
                size: Some(0),
                ..Default::default()
            }
        )),
        libc::EINVAL
    );
    // utimens: At / Omit / Now
    let t1 = Timespec {
        sec: 1_000_000_000,
        nsec: 123_456_789,
    };
    let a = b
        .setattr(
            &c,
            b"top",
            &SetAttr {
                atime: Some(TimeSet::At(t1)),
                mtime: None,
                ..Default::default()
            },
        )
        .unwrap();
    let k = kattr(&r.join("top")).unwrap();
    assert_eq!(a, k);
    assert_eq!(k.atime, t1);
    assert_ne!(k.mtime, t1);
    let t2 = Timespec {
        sec: 2_000_000_000,
        nsec: 1,
    };
    let a = b
        .setattr(
            &c,
            b"top",
            &SetAttr {
                mtime: Some(TimeSet::At(t2)),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!((a.atime, a.mtime), (t1, t2)); // atime omitted
    let a = b
        .setattr(
            &c,
            b"top",
            &SetAttr {
                mtime: Some(TimeSet::Now),
                ..Default::default()
            },
        )
        .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!((a.mtime.sec - now).abs() <= 2);
    assert_eq!(a.atime, t1);
    // utimens on a symlink changes the link's times only
    let a = b
        .setattr(
            &c,
            b"lnk",
            &SetAttr {
                mtime: Some(TimeSet::At(t2)),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(a.mtime, t2);
    assert_ne!(kattr(&r.join("d/file")).unwrap().mtime, t2);
    // the root itself
    let a = b
        .setattr(
            &c,
            b"",
            &SetAttr {
                mode: Some(0o751),
                mtime: Some(TimeSet::At(t2)),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!((a.perm(), a.mtime), (0o751, t2));
    assert_eq!(a, kattr(r).unwrap());
    assert_eq!(
        errno_of(b.setattr(
            &c,
            b"missing",
            &SetAttr {
                mode: Some(0o600),
                ..Default::default()
            }
        )),
        libc::ENOENT
    );
}

#[test]
fn open_reads_writes_and_creates() {
    let t = tmp();
    let r = t.path();
    populate(r);
    let b = cached(r);
    let c = root();
    let fd = b.open(&c, b"d/file", libc::O_RDONLY, 0).unwrap();
    let mut s = String::new();
    fs::File::from(fd.fd().unwrap().try_clone_to_owned().unwrap())
        .read_to_string(&mut s)
        .unwrap();
    assert_eq!(s, "hello");
    let fd = b
        .open(
            &c,
            b"new",
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
            0o600,
        )
        .unwrap();
    fs::File::from(fd.fd().unwrap().try_clone_to_owned().unwrap())
        .write_all(b"data")
        .unwrap();
    assert_eq!(fs::read(r.join("new")).unwrap(), b"data");
    assert_eq!(
        kattr(&r.join("new")).unwrap().perm(),
        0o600 & !current_umask()
    );
    assert_eq!(
        b.open(
            &c,
            b"new",
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
            0o600
        )
        .unwrap_err(),
        Error::Exists
    );
    assert_eq!(
        b.open(&c, b"missing", libc::O_RDONLY, 0).unwrap_err(),
        Error::NotFound
    );
    let dfd = b
        .open(&c, b"", libc::O_RDONLY | libc::O_DIRECTORY, 0)
        .unwrap();
    drop(dfd);
}

fn current_umask() -> u32 {
    // SAFETY: umask is process-wide; set and immediately restore.
    unsafe {
        let m = libc::umask(0o022);
        libc::umask(m);
        m
    }
}

#[test]
fn fd_cache_is_bounded() {
    let t = tmp();
    let r = t.path();
    for i in 0..600 {
        fs::create_dir(r.join(format!("d{i}"))).unwrap();
        fs::write(r.join(format!("d{i}/f")), b"").unwrap();
    }
    let b = LocalBackend::with_options(r, 64, WatchMode::Off).unwrap();
    for i in 0..600 {
        b.lookup(format!("d{i}").as_bytes(), b"f").unwrap();
    }
    assert!(b.cached_fds() <= 64, "{}", b.cached_fds());
    b.forget_cached_fds();
    assert_eq!(b.cached_fds(), 0);
    let b0 = LocalBackend::with_options(r, 0, WatchMode::Off).unwrap();
    b0.lookup(b"d1", b"f").unwrap();
    assert_eq!(b0.cached_fds(), 0);
    assert!(b0.watch().unwrap().is_none());
}

#[test]
fn permissions_of_root_dir_mode_bits() {
    // sanity that the chmod above used fs permissions, not umask
    let t = tmp();
    fs::set_permissions(t.path(), fs::Permissions::from_mode(0o700)).unwrap();
    let b = LocalBackend::new(t.path()).unwrap();
    assert_eq!(b.getattr(b"").unwrap().perm(), 0o700);
    assert_eq!(
        b.getattr(b"").unwrap().uid,
        fs::metadata(t.path()).unwrap().uid()
    );
}

/// walk() against lstat of every prefix, for many component lists.
#[test]
fn walk_matches_lstat_of_each_prefix() {
    let t = tmp();
    let r = t.path();
    populate(r);
    let b = LocalBackend::with_options(r, 4, WatchMode::Off).unwrap();
    let lists: &[(&str, &[&str])] = &[
        ("", &["d", "e", "f"]),
        ("", &["d", "file"]),
        ("", &["d", "file", "x"]),
        ("", &["lnk", "x"]),
        ("", &["abs", "passwd"]),
        ("", &["d", "missing", "x"]),
        ("d", &["e", "f"]),
        ("d/e", &["f"]),
        ("", &["top"]),
        ("", &[]),
        ("missing", &["x"]),
        ("top", &["x"]),
        ("", &["d", "..", "top"]),
    ];
    for round in 0..3 {
        if round == 2 {
            b.forget_cached_fds();
        }
        for (dir, names) in lists {
            let names_b: Vec<&[u8]> = names.iter().map(|n| n.as_bytes()).collect();
            let got = b.walk(dir.as_bytes(), &names_b);
            // expected, from the kernel
            let mut attrs = Vec::new();
            let mut error = None;
            let mut path = p(r, dir);
            if !names.is_empty() {
                match fs::symlink_metadata(&path) {
                    Ok(m) if !m.is_dir() => {
                        error = Some(if m.is_symlink() {
                            Error::Loop
                        } else {
                            Error::NotDir
                        })
                    }
                    Ok(_) => {}
                    Err(e) => error = Some(Error::from(e)),
                }
            }
            if error.is_none() {
                for (i, n) in names.iter().enumerate() {
                    if *n == ".." {
                        error = Some(Error::Invalid);
                        break;
                    }
                    path = path.join(n);
                    match kattr(&path) {
                        Ok(a) => {
                            attrs.push(a);
                            if i + 1 < names.len() && !a.is_dir() {
                                error = Some(Error::NotDir);
                                break;
                            }
                        }
                        Err(e) => {
                            error = Some(Error::from(e));
                            break;
                        }
                    }
                }
            }
            let g: Vec<u64> = got.attrs.iter().map(|a| a.ino).collect();
            let w: Vec<u64> = attrs.iter().map(|a| a.ino).collect();
            assert_eq!(
                (g, got.error),
                (w, error),
                "walk {dir} {names:?} round {round}"
            );
        }
    }
}

/// Threads looking up, walking and listing while others rename and recreate directories
/// through the backend: answers are always of the kernel's kinds, the descriptor cache stays
/// bounded, and no descriptor leaks.
#[test]
fn concurrent_lookups_and_renames() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let t = tmp();
    let r = t.path();
    for i in 0..8 {
        fs::create_dir_all(r.join(format!("d{i}/sub"))).unwrap();
        fs::write(r.join(format!("d{i}/sub/f")), b"").unwrap();
    }
    let fds_before = fs::read_dir("/proc/self/fd").unwrap().count();
    let b = Arc::new(LocalBackend::with_options(r, 8, WatchMode::Off).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut hs = Vec::new();
    for k in 0..3 {
        let (b, stop, done) = (b.clone(), stop.clone(), done.clone());
        hs.push(std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let i = (n as usize + k) % 8;
                let d = format!("d{i}/sub");
                for res in [
                    b.lookup(d.as_bytes(), b"f").map(drop),
                    b.readdir(d.as_bytes(), true).map(drop),
                    b.getattr(format!("{d}/f").as_bytes()).map(drop),
                ] {
                    if let Err(e) = res {
                        assert!(matches!(e, Error::NotFound | Error::NotDir), "{e:?}");
                    }
                }
                let w = b.walk(b"", &[format!("d{i}").as_bytes(), b"sub", b"f"]);
                if let Some(e) = w.error {
                    assert!(matches!(e, Error::NotFound | Error::NotDir), "{e:?}");
                }
                n += 1;
                done.fetch_add(1, Ordering::Relaxed);
            }
            n
        }));
    }
    let c = Cred::root();
    // At least 300 rounds, and on until the lookup threads have run a while too (on a loaded
    // machine they may not be scheduled at all during the first 300).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut round = 0;
    while round < 300 || (done.load(Ordering::Relaxed) < 30 && std::time::Instant::now() < deadline)
    {
        round += 1;
        let i = round % 8;
        let (a, z) = (format!("d{i}"), format!("moved{i}"));
        b.rename(&c, a.as_bytes(), z.as_bytes(), RenameMode::NoReplace)
            .unwrap();
        b.rename(&c, z.as_bytes(), a.as_bytes(), RenameMode::NoReplace)
            .unwrap();
        assert!(b.cached_fds() <= 8);
    }
    stop.store(true, Ordering::Relaxed);
    let lookups: u64 = hs.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(lookups > 0);
    drop(b);
    let fds_after = fs::read_dir("/proc/self/fd").unwrap().count();
    // Other tests of this binary run at the same time: allow some noise.
    assert!(fds_after <= fds_before + 16, "{fds_before} -> {fds_after}");
}

/// A backend whose descriptor cache is always on (the stricter case for these tests: every
/// answer after a mutation must still be right).
fn cached(r: &Path) -> LocalBackend {
    LocalBackend::with_options(r, 256, WatchMode::Off).unwrap()
}

/// A file system mounted inside the root: renames and links across it fail with EXDEV, as
/// the kernel says; resolution crosses the mount point (RESOLVE_BENEATH allows it).
#[test]
fn cross_device_is_exdev() {
    if !need_root("mounts a tmpfs for a second device") {
        return;
    }
    let t = tmp();
    let r = t.path();
    fs::create_dir(r.join("mnt")).unwrap();
    fs::write(r.join("f"), b"x").unwrap();
    let target = CString::new(r.join("mnt").as_os_str().as_bytes()).unwrap();
    // SAFETY: valid NUL-terminated strings; a private tmpfs on our own temp directory.
    let m = unsafe {
        libc::mount(
            c"tmpfs".as_ptr(),
            target.as_ptr(),
            c"tmpfs".as_ptr(),
            0,
            c"size=1m".as_ptr().cast(),
        )
    };
    if m != 0 {
        cannot_run(&format!(
            "cannot mount tmpfs: {}",
            std::io::Error::last_os_error()
        ));
        return;
    }
    struct Unmount(CString);
    impl Drop for Unmount {
        fn drop(&mut self) {
            // SAFETY: valid NUL-terminated path.
            unsafe { libc::umount2(self.0.as_ptr(), libc::MNT_DETACH) };
        }
    }
    let _u = Unmount(target);
    let b = cached(r);
    let c = Cred::root();
    b.mkdir(&c, b"mnt/d", 0o755).unwrap();
    assert_eq!(
        b.getattr(b"mnt/d").unwrap(),
        kattr(&r.join("mnt/d")).unwrap()
    );
    assert_ne!(
        b.getattr(b"mnt/d").unwrap().dev,
        b.getattr(b"f").unwrap().dev
    );
    let k = kerrno(fs::rename(r.join("f"), r.join("mnt/f")));
    assert_eq!(k, libc::EXDEV);
    assert_eq!(
        errno_of(b.rename(&c, b"f", b"mnt/f", RenameMode::Replace)),
        k
    );
    assert_eq!(errno_of(b.link(&c, b"f", b"mnt/f")), libc::EXDEV);
    assert_eq!(
        b.rename(&c, b"f", b"mnt/d", RenameMode::Exchange)
            .unwrap_err(),
        Error::CrossDevice
    );
}

/// Torture seed 540 in the backend: a directory whose descriptor is cached (`d2/e0`) is
/// replaced outside by another renamed over it, and a creation at `d2/e0/x` comes before
/// the change feed's report (here: no feed, the cache kept). Natively every creation lands
/// in the directory the path names now; through the removed directory's descriptor
/// `openat(O_CREAT)` failed with ENOENT. Each kind of creation, then a rename and an unlink
/// there, on a fresh replacement each time.
#[test]
fn creations_through_a_cached_descriptor_of_a_replaced_directory_land_in_the_new_one() {
    let t = tmp();
    let r = t.path();
    let b = cached(r);
    type Op<'a> = (
        &'a str,
        Box<dyn Fn(&LocalBackend) -> dircache_core::Result<()>>,
    );
    let ops: Vec<Op> = vec![
        (
            "open(O_CREAT)",
            Box::new(|b| {
                b.open(&root(), b"d2/e0/x", libc::O_CREAT | libc::O_WRONLY, 0o644)
                    .map(|_| ())
            }),
        ),
        (
            "mknod",
            Box::new(|b| {
                b.mknod(&root(), b"d2/e0/x", libc::S_IFREG | 0o644, 0)
                    .map(|_| ())
            }),
        ),
        (
            "mkdir",
            Box::new(|b| b.mkdir(&root(), b"d2/e0/x", 0o755).map(|_| ())),
        ),
        (
            "symlink",
            Box::new(|b| b.symlink(&root(), b"t", b"d2/e0/x").map(|_| ())),
        ),
        (
            "link",
            Box::new(|b| b.link(&root(), b"d2/e0/f1", b"d2/e0/x").map(|_| ())),
        ),
        (
            "rename",
            Box::new(|b| b.rename(&root(), b"d2/e0/f1", b"d2/e0/x", RenameMode::Replace)),
        ),
    ];
    for (i, (what, op)) in ops.iter().enumerate() {
        let _ = fs::remove_dir_all(r.join("d2"));
        fs::create_dir_all(r.join(format!("d1/e{i}"))).unwrap();
        fs::write(r.join(format!("d1/e{i}/f1")), b"one").unwrap();
        fs::create_dir_all(r.join("d2/e0")).unwrap();
        // Cache d2/e0's descriptor.
        assert_eq!(b.lookup(b"d2/e0", b"x").unwrap_err(), Error::NotFound);
        fs::rename(r.join(format!("d1/e{i}")), r.join("d2/e0")).unwrap();
        op(&b).unwrap_or_else(|e| panic!("{what} in a directory replaced outside: {e:?}"));
        assert!(
            fs::symlink_metadata(r.join("d2/e0/x")).is_ok(),
            "{what}: not in the new directory"
        );
        assert_eq!(b.lookup(b"d2/e0", b"x").map(|_| ()), Ok(()), "{what}");
    }
    // unlink of a name the new directory has.
    let _ = fs::remove_dir_all(r.join("d2"));
    fs::create_dir_all(r.join("d1/eu")).unwrap();
    fs::write(r.join("d1/eu/f1"), b"one").unwrap();
    fs::create_dir_all(r.join("d2/e0")).unwrap();
    assert_eq!(b.lookup(b"d2/e0", b"f1").unwrap_err(), Error::NotFound);
    fs::rename(r.join("d1/eu"), r.join("d2/e0")).unwrap();
    b.unlink(&root(), b"d2/e0/f1").unwrap();
    assert!(fs::symlink_metadata(r.join("d2/e0/f1")).is_err());
}
