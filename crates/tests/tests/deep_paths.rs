//! The cache over a real directory tree deeper than PATH_MAX. PATH_MAX limits one path
//! argument (`stat(path)`), not how deep a node lies: relative calls from a directory handle
//! at depth, and the node API a front end uses one name at a time, work at any depth (the
//! kernel, reached natively through a chain of descriptors, is the oracle), while a single
//! path argument of PATH_MAX bytes or more is still ENAMETOOLONG and a name over NAME_MAX too.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use dircache_core::{At, Cache, Config, Cred, Error, LookupFlags, RenameMode, SetAttr};
use dircache_local::LocalBackend;

const F: LookupFlags = LookupFlags::FOLLOW;

fn name(i: usize) -> String {
    format!("{i:03}{}", "d".repeat(197))
}

fn c(s: &str) -> CString {
    CString::new(s).unwrap()
}

/// Native: mkdir `levels` nested directories below `root` one level at a time; returns the
/// bottom directory's descriptor.
fn native_chain(root: &std::path::Path, levels: usize) -> OwnedFd {
    let r = c(root.to_str().unwrap());
    // SAFETY: a valid NUL-terminated path.
    let mut fd = unsafe { libc::open(r.as_ptr(), libc::O_PATH | libc::O_DIRECTORY) };
    assert!(fd >= 0);
    for i in 0..levels {
        let n = c(&name(i));
        // SAFETY: fd is live and n NUL-terminated.
        unsafe {
            assert_eq!(libc::mkdirat(fd, n.as_ptr(), 0o755), 0);
            let next = libc::openat(fd, n.as_ptr(), libc::O_PATH | libc::O_DIRECTORY);
            assert!(next >= 0);
            libc::close(fd);
            fd = next;
        }
    }
    // SAFETY: fd is a fresh descriptor owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Native lstat of `dir/name`: (ino, size, mode) or the errno.
fn kstat(dir: &OwnedFd, n: &str) -> Result<(u64, u64, u32), i32> {
    let n = c(n);
    // SAFETY: zeroed stat is a valid out-buffer; dir is live; n is NUL-terminated.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstatat(
            dir.as_raw_fd(),
            n.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW | libc::AT_EMPTY_PATH,
        ) != 0
        {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
        }
        Ok((st.st_ino, st.st_size as u64, st.st_mode))
    }
}

fn short(a: &dircache_core::Attr) -> (u64, u64, u32) {
    (a.ino, a.size, a.mode)
}

#[test]
fn relative_calls_and_node_api_below_40k_of_path() {
    let levels = 200;
    let d = tempfile::tempdir().unwrap();
    let kfd = native_chain(d.path(), levels);
    let cache = Cache::new(
        Arc::new(LocalBackend::new(d.path()).unwrap()),
        Config::default(),
    )
    .unwrap();
    let root = cache.credentials(Cred::root());
    let user = cache.credentials(Cred::new(1001, 1001, []));
    let names: Vec<String> = (0..levels).map(name).collect();

    // Down one relative step at a time, as a process with chdir/openat does.
    let mut h = cache.opendir(&user, At::Root, names[0].as_bytes()).unwrap();
    for n in &names[1..] {
        h = cache.opendir(&user, At::Dir(&h), n.as_bytes()).unwrap();
    }
    let at = At::Dir(&h);
    assert_eq!(
        short(&cache.stat(&user, at, b".", F).unwrap()),
        kstat(&kfd, "").unwrap()
    );
    // Create, list, stat, rename, remove at the bottom; twice, so the fast path answers too.
    cache.mkdir(&root, at, b"sub", 0o750).unwrap();
    cache
        .mknod(&root, at, b"f", libc::S_IFREG | 0o644, 0)
        .unwrap();
    for _ in 0..2 {
        for n in ["sub", "f"] {
            assert_eq!(
                short(&cache.stat(&user, at, n.as_bytes(), F).unwrap()),
                kstat(&kfd, n).unwrap(),
                "{n}"
            );
        }
        assert_eq!(cache.stat(&user, at, b"missing", F), Err(Error::NotFound));
    }
    let mut listed: Vec<Vec<u8>> = cache
        .readdir(&user, at, b".")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    listed.sort();
    assert_eq!(listed, vec![b"f".to_vec(), b"sub".to_vec()]);
    cache.symlink(&root, b"f", at, b"l").unwrap();
    assert_eq!(cache.readlink(&user, at, b"l").unwrap(), b"f");
    assert_eq!(
        short(&cache.stat(&user, at, b"l", F).unwrap()),
        kstat(&kfd, "f").unwrap()
    );
    cache
        .setattr(
            &root,
            at,
            b"f",
            &SetAttr {
                mode: Some(0o600),
                ..Default::default()
            },
            F,
        )
        .unwrap();
    assert_eq!(kstat(&kfd, "f").unwrap().2 & 0o7777, 0o600);
    cache
        .rename(&root, at, b"f", b"g", RenameMode::Replace)
        .unwrap();
    assert_eq!(kstat(&kfd, "f"), Err(libc::ENOENT));
    assert_eq!(cache.stat(&user, at, b"f", F), Err(Error::NotFound));
    // `..` climbs back up: 3 levels, and all the way to the root and back down one level.
    let up3 = format!("../../../{}", names[levels - 3]);
    assert!(cache.stat(&user, at, up3.as_bytes(), F).unwrap().is_dir());
    let to_top = format!("{}{}", "../".repeat(levels), names[0]);
    assert!(cache
        .stat(&user, at, to_top.as_bytes(), F)
        .unwrap()
        .is_dir());
    // One path argument of PATH_MAX bytes or more: ENAMETOOLONG, relative or absolute; a name
    // over NAME_MAX at depth too.
    let full = format!("/{}/g", names.join("/"));
    for _ in 0..2 {
        assert_eq!(
            cache.stat(&root, At::Root, full.as_bytes(), F),
            Err(Error::NameTooLong)
        );
        let rel = format!("{}{}", "./".repeat(2048), "g");
        assert_eq!(
            cache.stat(&root, at, rel.as_bytes(), F),
            Err(Error::NameTooLong)
        );
    }
    assert_eq!(
        cache.mkdir(&root, at, &[b'x'; 256], 0o755),
        Err(Error::NameTooLong)
    );
    assert_eq!(
        cache.stat(&user, at, &[b'x'; 256], F),
        Err(Error::NameTooLong)
    );
    cache.unlink(&root, at, b"g").unwrap();
    cache.unlink(&root, at, b"l").unwrap();
    cache.rmdir(&root, at, b"sub").unwrap();
    assert_eq!(kstat(&kfd, "sub"), Err(libc::ENOENT));

    // The node API, one name at a time from the root (what the FUSE front end does).
    let mut node = cache.root();
    for n in &names {
        node = cache.lookup_child(&user, &node, n.as_bytes()).unwrap();
    }
    assert_eq!(
        short(&cache.getattr(&node).unwrap()),
        kstat(&kfd, "").unwrap()
    );
    let f = cache
        .create_at(&root, &node, b"data", 0o644, libc::O_CREAT | libc::O_WRONLY)
        .map(|(n, _fd)| n)
        .unwrap();
    assert_eq!(
        short(&cache.getattr(&f).unwrap()),
        kstat(&kfd, "data").unwrap()
    );
    let fd = cache.open_node(&root, &f, libc::O_WRONLY).unwrap();
    // SAFETY: fd is live; the buffer is valid for its length.
    assert_eq!(
        unsafe { libc::write(fd.fd().unwrap().as_raw_fd(), b"abc".as_ptr().cast(), 3) },
        3
    );
    assert_eq!(kstat(&kfd, "data").unwrap().1, 3);
    let sub = cache.mkdir_at(&root, &node, b"s", 0o755).unwrap();
    assert_eq!(cache.readdir_node(&user, &sub, true).unwrap().len(), 0);
    let names_now: Vec<Vec<u8>> = cache
        .readdir_node(&user, &node, true)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names_now.len(), 2);
    cache.unlink_at(&root, &node, b"data").unwrap();
    cache.rmdir_at(&root, &node, b"s").unwrap();
    assert_eq!(kstat(&kfd, "data"), Err(libc::ENOENT));
    // The backend path of a deep node is longer than PATH_MAX, and that is fine.
    assert!(cache.node_path(&node).unwrap().len() > 40_000);
}

/// Changes made behind the cache's back deeper than PATH_MAX are applied like any other:
/// `invalidate` / `apply_change` take backend paths, which have no length limit.
#[test]
fn outside_changes_below_8k_of_path_are_applied() {
    let levels = 40;
    let d = tempfile::tempdir().unwrap();
    let kfd = native_chain(d.path(), levels);
    let cache = Cache::new(
        Arc::new(LocalBackend::new(d.path()).unwrap()),
        Config::default(),
    )
    .unwrap();
    let user = cache.credentials(Cred::new(1001, 1001, []));
    let names: Vec<String> = (0..levels).map(name).collect();
    let mut node = cache.root();
    for n in &names {
        node = cache.lookup_child(&user, &node, n.as_bytes()).unwrap();
    }
    // Listed: the directory is complete, so a miss is answered without the backend.
    assert!(cache.readdir_node(&user, &node, false).unwrap().is_empty());
    assert!(node.is_complete());
    assert_eq!(
        cache.lookup_child(&user, &node, b"new").err(),
        Some(Error::NotFound)
    );
    // Created outside, then reported.
    let n = c("new");
    // SAFETY: kfd is live, n NUL-terminated.
    let fd = unsafe {
        libc::openat(
            kfd.as_raw_fd(),
            n.as_ptr(),
            libc::O_CREAT | libc::O_WRONLY,
            0o644,
        )
    };
    assert!(fd >= 0);
    // SAFETY: fd is ours.
    unsafe { libc::close(fd) };
    let path = format!("{}/new", names.join("/"));
    assert!(path.len() > 4096);
    cache.invalidate(path.as_bytes());
    let new = cache.lookup_child(&user, &node, b"new").unwrap();
    assert_eq!(
        short(&cache.getattr(&new).unwrap()),
        kstat(&kfd, "new").unwrap()
    );
    // Removed outside, then reported: gone.
    // SAFETY: as above.
    assert_eq!(unsafe { libc::unlinkat(kfd.as_raw_fd(), n.as_ptr(), 0) }, 0);
    cache.invalidate(path.as_bytes());
    assert_eq!(
        cache.lookup_child(&user, &node, b"new").err(),
        Some(Error::NotFound)
    );
}
