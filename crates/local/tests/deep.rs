//! Paths deeper than PATH_MAX: PATH_MAX limits one syscall's path argument, not how deep a
//! file may lie. Backend paths are not syscall arguments, so every operation must work on a
//! backend path of any length (the kernel is the oracle, reached through a chain of
//! descriptors), while confinement (no symlink, no `..`, never outside the root) holds at
//! every depth.

mod common;

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use common::*;
use dircache_core::{Attr, Backend, Cred, Error, FileType, RenameMode, SetAttr};
use dircache_local::{LocalBackend, WatchMode};
use rustix::fs::{AtFlags, Mode, OFlags, StatxFlags};

/// A 200-byte name: 21 of them make a path longer than PATH_MAX.
fn name(i: usize) -> String {
    format!("{i:03}{}", "d".repeat(197))
}

/// Create `levels` nested directories below `r` natively (mkdirat/openat one level at a time,
/// as a program would with chdir) and return the backend path of the bottom one with an
/// O_PATH descriptor of it.
fn chain(r: &Path, levels: usize) -> (Vec<u8>, OwnedFd) {
    let mut fd = rustix::fs::open(r, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap();
    let mut path = Vec::new();
    for i in 0..levels {
        let n = name(i);
        rustix::fs::mkdirat(&fd, n.as_str(), Mode::from_raw_mode(0o755)).unwrap();
        fd = rustix::fs::openat(
            &fd,
            n.as_str(),
            OFlags::PATH | OFlags::DIRECTORY,
            Mode::empty(),
        )
        .unwrap();
        if !path.is_empty() {
            path.push(b'/');
        }
        path.extend_from_slice(n.as_bytes());
    }
    (path, fd)
}

/// lstat of `dir/name` by the kernel.
fn kstat(dir: &OwnedFd, name: &str) -> Result<Attr, i32> {
    rustix::fs::statx(
        dir,
        name,
        AtFlags::SYMLINK_NOFOLLOW,
        StatxFlags::BASIC_STATS | StatxFlags::BTIME,
    )
    .map(|s| {
        let t = |t: rustix::fs::StatxTimestamp| dircache_core::Timespec {
            sec: t.tv_sec,
            nsec: t.tv_nsec,
        };
        Attr {
            ino: s.stx_ino,
            dev: libc::makedev(s.stx_dev_major, s.stx_dev_minor),
            mode: u32::from(s.stx_mode),
            nlink: s.stx_nlink,
            uid: s.stx_uid,
            gid: s.stx_gid,
            rdev: libc::makedev(s.stx_rdev_major, s.stx_rdev_minor),
            size: s.stx_size,
            blocks: s.stx_blocks,
            blksize: s.stx_blksize,
            atime: t(s.stx_atime),
            mtime: t(s.stx_mtime),
            ctime: t(s.stx_ctime),
            birth: if s.stx_mask & StatxFlags::BTIME.bits() != 0 {
                dircache_core::birth_digest(s.stx_btime.tv_sec, s.stx_btime.tv_nsec)
            } else {
                0
            },
        }
    })
    .map_err(|e| e.raw_os_error())
}

fn join(dir: &[u8], name: &str) -> Vec<u8> {
    let mut p = dir.to_vec();
    p.push(b'/');
    p.extend_from_slice(name.as_bytes());
    p
}

fn root() -> Cred {
    Cred::root()
}

fn sorted_names(b: &LocalBackend, dir: &[u8]) -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = b
        .readdir(dir, true)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    v.sort();
    v
}

fn knames(dir: &OwnedFd) -> Vec<Vec<u8>> {
    let rd =
        rustix::fs::openat(dir, ".", OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
    let mut v: Vec<Vec<u8>> = rustix::fs::Dir::read_from(&rd)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_bytes().to_vec())
        .filter(|n| n != b"." && n != b"..")
        .collect();
    v.sort();
    v
}

/// Every backend operation at the bottom of a chain `levels` deep, compared with the kernel.
fn exercise(b: &LocalBackend, r: &Path, levels: usize) {
    let (deep, kfd) = chain(r, levels);
    assert!(levels < 20 || deep.len() > 4096, "{}", deep.len());
    // lookup / getattr / walk of the bottom directory and what is in it
    let (parent, last) = deep.split_at(deep.iter().rposition(|&c| c == b'/').unwrap());
    assert_eq!(
        b.lookup(parent, &last[1..]).unwrap().ino,
        kstat(&kfd, ".").unwrap().ino,
        "lookup of the bottom directory"
    );
    assert_eq!(b.getattr(&deep).unwrap(), kstat(&kfd, ".").unwrap());
    let names: Vec<String> = (0..levels).map(name).collect();
    let refs: Vec<&[u8]> = names.iter().map(|n| n.as_bytes()).collect();
    let w = b.walk(b"", &refs);
    assert_eq!((w.attrs.len(), w.error), (levels, None), "walk");
    // mkdir, mknod, symlink, link below it
    let sub = join(&deep, "sub");
    assert_eq!(
        b.mkdir(&root(), &sub, 0o750).unwrap(),
        kstat(&kfd, "sub").unwrap()
    );
    let f = join(&deep, "f");
    let a = b.mknod(&root(), &f, libc::S_IFREG | 0o640, 0).unwrap();
    assert_eq!(a, kstat(&kfd, "f").unwrap());
    assert_eq!(b.lookup(&deep, b"f").unwrap(), kstat(&kfd, "f").unwrap());
    let l = join(&deep, "lnk");
    b.symlink(&root(), b"f", &l).unwrap();
    assert_eq!(b.readlink(&l).unwrap(), b"f");
    let h = join(&deep, "hard");
    assert_eq!(b.link(&root(), &f, &h).unwrap().nlink, 2);
    // open for writing, read back natively and through the backend
    {
        let fd = b
            .open(&root(), &f, libc::O_WRONLY | libc::O_TRUNC, 0)
            .unwrap();
        rustix::io::write(fd.fd().unwrap(), b"deep data").unwrap();
    }
    let kf = rustix::fs::openat(&kfd, "f", OFlags::RDONLY, Mode::empty()).unwrap();
    let mut buf = [0u8; 64];
    let n = rustix::io::read(&kf, &mut buf).unwrap();
    assert_eq!(&buf[..n], b"deep data");
    let fd = b.open(&root(), &f, libc::O_RDONLY, 0).unwrap();
    let n = rustix::io::read(fd.fd().unwrap(), &mut buf).unwrap();
    assert_eq!(&buf[..n], b"deep data");
    let c = join(&deep, "created");
    drop(
        b.open(
            &root(),
            &c,
            libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
            0o600,
        )
        .unwrap(),
    );
    assert_eq!(kstat(&kfd, "created").unwrap().mode & 0o7777, 0o600);
    // setattr, statfs, readdir
    let s = SetAttr {
        mode: Some(0o604),
        ..SetAttr::default()
    };
    assert_eq!(
        b.setattr(&root(), &f, &s).unwrap(),
        kstat(&kfd, "f").unwrap()
    );
    assert_eq!(kstat(&kfd, "f").unwrap().mode & 0o7777, 0o604);
    assert!(b.statfs(&f).is_ok());
    assert_eq!(sorted_names(b, &deep), knames(&kfd));
    // rename within the deep directory, and between it and the root
    let g = join(&deep, "g");
    b.rename(&root(), &f, &g, RenameMode::Replace).unwrap();
    assert_eq!(kstat(&kfd, "f"), Err(libc::ENOENT));
    assert_eq!(kstat(&kfd, "g").unwrap().size, 9);
    b.rename(&root(), &g, b"top", RenameMode::NoReplace)
        .unwrap();
    assert!(r.join("top").exists());
    b.rename(&root(), b"top", &g, RenameMode::NoReplace)
        .unwrap();
    assert_eq!(kstat(&kfd, "g").unwrap().size, 9);
    // removal
    b.unlink(&root(), &h).unwrap();
    b.unlink(&root(), &l).unwrap();
    b.rmdir(&root(), &sub).unwrap();
    assert_eq!(kstat(&kfd, "sub"), Err(libc::ENOENT));
    assert_eq!(sorted_names(b, &deep), knames(&kfd));
    // errors the kernel gives below a deep directory are the same
    assert_eq!(errno_of(b.lookup(&deep, b"missing")), libc::ENOENT);
    assert_eq!(errno_of(b.getattr(&join(&deep, "missing"))), libc::ENOENT);
    assert_eq!(errno_of(b.getattr(&join(&g, "x"))), libc::ENOTDIR);
    let long = "x".repeat(256);
    assert_eq!(
        errno_of(b.lookup(&deep, long.as_bytes())),
        kstat(&kfd, &long).unwrap_err()
    );
    assert_eq!(
        errno_of(b.mkdir(&root(), &join(&deep, &long), 0o755)),
        libc::ENAMETOOLONG
    );
    // confinement: a symlink anywhere on a long path is refused (never followed), and a
    // malformed path is never interpreted, however deep
    let mid = names[..levels / 2].join("/");
    let up = format!("{mid}/up");
    // A symlink to / in the middle of the chain, natively.
    let kmid = chain_fd(r, &names[..levels / 2]);
    rustix::fs::symlinkat("/", &kmid, "up").unwrap();
    let mut via_link = up.clone().into_bytes();
    via_link.extend_from_slice(&deep[mid.len()..]);
    for e in [
        b.getattr(&via_link).unwrap_err(),
        b.lookup(&via_link, b"f").unwrap_err(),
        b.readdir(&via_link, false).unwrap_err(),
        b.mkdir(&root(), &join(&via_link, "x"), 0o755).unwrap_err(),
        b.open(
            &root(),
            &join(&via_link, "x"),
            libc::O_CREAT | libc::O_WRONLY,
            0o644,
        )
        .unwrap_err(),
    ] {
        assert_eq!(e, Error::Loop);
    }
    let mut dotdot = deep.clone();
    dotdot.extend_from_slice(b"/../../../x");
    assert_eq!(b.getattr(&dotdot).unwrap_err(), Error::Invalid);
    let mut dbl = deep.clone();
    dbl.extend_from_slice(b"//x");
    assert_eq!(b.getattr(&dbl).unwrap_err(), Error::Invalid);
    assert_eq!(
        b.getattr(
            &join(&deep, "sub")
                .into_iter()
                .chain(*b"/.")
                .collect::<Vec<u8>>()
        )
        .unwrap_err(),
        Error::Invalid
    );
    // The bottom directory's type is what the kernel says.
    assert_eq!(b.getattr(&deep).unwrap().kind(), FileType::Directory);
}

fn chain_fd(r: &Path, names: &[String]) -> OwnedFd {
    let mut fd = rustix::fs::open(r, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap();
    for n in names {
        fd = rustix::fs::openat(
            fd.as_fd(),
            n.as_str(),
            OFlags::PATH | OFlags::DIRECTORY,
            Mode::empty(),
        )
        .unwrap();
    }
    fd
}

#[test]
fn operations_below_8k_and_40k_of_path() {
    for levels in [40, 200] {
        // Without a descriptor cache (every call resolves from the root) and with one.
        let t = tmp();
        let b = LocalBackend::new(t.path()).unwrap();
        exercise(&b, t.path(), levels);
        let t = tmp();
        let b = LocalBackend::with_options(t.path(), 256, WatchMode::Off).unwrap();
        exercise(&b, t.path(), levels);
    }
}

/// A directory swapped for a symlink deep down, after the backend cached descriptors for the
/// path: once told (forget_cached_fds), resolution refuses the symlink; before, a cached
/// descriptor may answer for the moved directory but never for anything outside the root.
#[test]
fn deep_swap_for_symlink_never_escapes() {
    let t = tmp();
    let r = t.path();
    let (deep, _) = chain(r, 30);
    let b = LocalBackend::with_options(r, 256, WatchMode::Off).unwrap();
    b.mknod(&root(), &join(&deep, "f"), libc::S_IFREG | 0o644, 0)
        .unwrap();
    let names: Vec<String> = (0..30).map(name).collect();
    // Move level 25 away and put a symlink to / in its place.
    let p24 = chain_fd(r, &names[..25]);
    rustix::fs::renameat(&p24, names[25].as_str(), &p24, "moved").unwrap();
    rustix::fs::symlinkat("/", &p24, names[25].as_str()).unwrap();
    let _ = b.lookup(&deep, b"f");
    b.forget_cached_fds();
    assert_eq!(b.lookup(&deep, b"f").unwrap_err(), Error::Loop);
    let mut etc = names[..26].join("/").into_bytes();
    etc.extend_from_slice(b"/etc");
    assert_eq!(b.getattr(&etc).unwrap_err(), Error::Loop);
    assert_eq!(b.lookup(&etc, b"passwd").unwrap_err(), Error::Loop);
}

/// `open_beneath` (the front end's way to a node's descriptor) reaches the bottom of a chain
/// 40 levels (~8 KiB) deep, the same inode as the kernel's, and follows no symlink there.
#[test]
fn open_beneath_any_depth_no_symlinks() {
    let t = tempfile::tempdir().unwrap();
    let (path, bottom) = chain(t.path(), 40);
    assert!(path.len() > 4096);
    let root = rustix::fs::open(t.path(), OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap();
    let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = dircache_local::open_beneath(root.as_fd(), &path, flags).expect("deep open");
    let ino = |f: &OwnedFd| rustix::fs::fstat(f).unwrap().st_ino;
    assert_eq!(ino(&fd), ino(&bottom));
    assert!(dircache_local::open_beneath(root.as_fd(), b".", flags).is_ok());
    // A symlink as the last piece of a deep path (to "/"): refused, not followed.
    rustix::fs::symlinkat("/", &bottom, "up").unwrap();
    let mut link = path.clone();
    link.extend_from_slice(b"/up/etc");
    assert_eq!(
        dircache_local::open_beneath(root.as_fd(), &link, flags).map(|_| ()),
        Err(rustix::io::Errno::LOOP)
    );
}
