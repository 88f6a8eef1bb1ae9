//! `Backend::open_verified` and `Backend::fsyncdir` of the local backend: they act on the inode
//! the caller named (its `(dev, ino)`), never on whatever the path names by now, and never
//! through a symlink or outside the root.

use dircache_core::{Backend, Cred, Error, SetAttr, XattrTarget};
use dircache_local::LocalBackend;
use std::os::unix::fs::MetadataExt;

fn me() -> Cred {
    Cred::new(
        rustix::process::geteuid().as_raw(),
        rustix::process::getegid().as_raw(),
        [],
    )
}

fn target(path: &[u8], key: Option<(u64, u64)>) -> XattrTarget<'_> {
    XattrTarget {
        path,
        expect: key,
        open: None,
    }
}

#[test]
fn opens_only_the_expected_inode() {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path();
    std::fs::create_dir(r.join("d")).unwrap();
    std::fs::create_dir(r.join("e")).unwrap();
    std::fs::write(r.join("f"), b"data").unwrap();
    std::os::unix::fs::symlink("d", r.join("l")).unwrap();
    let b = LocalBackend::new(r).unwrap();
    let d = b.getattr(b"d").unwrap();
    let key = Some((d.dev, d.ino));
    let dflags = libc::O_RDONLY | libc::O_DIRECTORY;

    let f = b.open_verified(&me(), target(b"d", key), dflags).unwrap();
    let a = f.attr().unwrap();
    assert_eq!((a.dev, a.ino), (d.dev, d.ino));
    assert!(f.fd().is_some());
    b.fsyncdir(&me(), target(b"d", key), false).unwrap();
    b.fsyncdir(&me(), target(b"d", key), true).unwrap();
    // The root itself.
    let root = std::fs::metadata(r).unwrap();
    let rk = Some((root.dev(), root.ino()));
    b.fsyncdir(&me(), target(b"", rk), false).unwrap();

    // A symlink is not followed: it is another inode than the directory it names.
    assert_eq!(
        b.open_verified(&me(), target(b"l", key), libc::O_PATH)
            .map(drop),
        Err(Error::Stale)
    );
    // No way out of the root.
    assert!(b
        .open_verified(&me(), target(b"../x", None), libc::O_PATH)
        .is_err());

    // "d" now names another directory: nothing is done to it.
    std::fs::remove_dir(r.join("d")).unwrap();
    std::fs::rename(r.join("e"), r.join("d")).unwrap();
    assert_eq!(
        b.open_verified(&me(), target(b"d", key), dflags).map(drop),
        Err(Error::Stale)
    );
    assert_eq!(
        b.fsyncdir(&me(), target(b"d", key), false),
        Err(Error::Stale)
    );
    // Without an expectation the path's inode now.
    let e = b.open_verified(&me(), target(b"d", None), dflags).unwrap();
    assert_ne!(e.attr().unwrap().ino, d.ino);
}

#[test]
fn empty_setattr_of_an_o_path_file_moves_only_the_ctime() {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path();
    std::fs::write(r.join("f"), b"data").unwrap();
    let b = LocalBackend::new(r).unwrap();
    let a = b.getattr(b"f").unwrap();
    let f = b
        .open_verified(&me(), target(b"f", Some((a.dev, a.ino))), libc::O_PATH)
        .unwrap();
    assert!(!f.writable());
    // Wait for the clock to move past the file's ctime (coarse timestamps).
    let limit = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        let c = a.ctime;
        if (now.as_secs() as i64, now.subsec_nanos()) > (c.sec, c.nsec + 20_000_000) {
            break;
        }
        assert!(std::time::Instant::now() < limit, "the clock does not move");
        std::thread::yield_now();
    }
    let after = f.setattr(&me(), &SetAttr::default()).unwrap();
    assert!(
        (after.ctime.sec, after.ctime.nsec) > (a.ctime.sec, a.ctime.nsec),
        "ctime {:?} -> {:?}",
        a.ctime,
        after.ctime
    );
    assert_eq!(
        (after.mode, after.uid, after.gid, after.size, after.mtime),
        (a.mode, a.uid, a.gid, a.size, a.mtime)
    );
    // Native: the same.
    let m = std::fs::metadata(r.join("f")).unwrap();
    assert_eq!(
        (m.ctime(), m.ctime_nsec() as u32),
        (after.ctime.sec, after.ctime.nsec)
    );
}
