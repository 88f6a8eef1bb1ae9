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
        birth: 0,
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

/// ext4 gives a removed file's inode number to the next new file at once: a file made at the
/// name since (here root's 0600 secret, where a world-readable file was) has the `(dev, ino)`
/// of the one the caller holds, but another birth time. `open_verified` reopens as the
/// daemon for I/O the kernel checked against the old file's attributes: it must refuse the
/// new one (ESTALE), in every mode, and open the old one while it is there.
#[test]
fn a_file_that_reused_the_inode_number_is_not_opened() {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path();
    std::fs::write(r.join("f"), b"readable by all").unwrap();
    let b = LocalBackend::new(r).unwrap();
    let held = |p, a: &dircache_core::Attr| XattrTarget {
        path: p,
        expect: Some((a.dev, a.ino)),
        birth: a.birth,
        open: None,
    };
    // Removed and made again until a new file gets the number of the one before (another
    // file created on this file system meanwhile may take it: then that new file is the old
    // one of the next try), each born a tick of the file system's coarse clock (4 ms) or
    // more after the one before.
    let mut tries = 0;
    let (old, new) = loop {
        let old = b.getattr(b"f").unwrap();
        assert_ne!(old.birth, 0, "no birth times in {}", r.display());
        let f = b
            .open_verified(&me(), held(b"f", &old), libc::O_RDONLY)
            .unwrap();
        assert_eq!(f.attr().unwrap().ino, old.ino);
        drop(f);
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::remove_file(r.join("f")).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(r.join("f"))
            .and_then(|mut w| std::io::Write::write_all(&mut w, b"root's secret"))
            .unwrap();
        let new = b.getattr(b"f").unwrap();
        if new.ino == old.ino {
            break (old, new);
        }
        tries += 1;
        assert!(tries < 100, "ext4 never gave a number back in 100 tries");
    };
    assert_eq!((new.dev, new.ino), (old.dev, old.ino));
    assert_ne!(new.birth, old.birth);
    for flags in [libc::O_RDONLY, libc::O_WRONLY, libc::O_RDWR, libc::O_PATH] {
        assert_eq!(
            b.open_verified(&me(), held(b"f", &old), flags).map(drop),
            Err(Error::Stale),
            "flags {flags:#o}: the new file was opened for the old one"
        );
    }
    // Without a known birth (a file system without birth times) the number alone decides.
    let unknown = XattrTarget {
        birth: 0,
        ..held(b"f", &old)
    };
    assert!(b.open_verified(&me(), unknown, libc::O_RDONLY).is_ok());
    // The new file's own identity opens it.
    assert!(b
        .open_verified(&me(), held(b"f", &new), libc::O_RDONLY)
        .is_ok());
}
