//! Hand-written semantic checks of the cache over a real directory (the randomized oracle
//! test is in oracle.rs).

use std::os::unix::fs::{symlink, PermissionsExt};
use std::sync::Arc;

use dircache_core::{At, Cache, Config, Cred, Error, LookupFlags, RenameMode, SetAttr};
use dircache_local::LocalBackend;

fn setup() -> (tempfile::TempDir, Arc<Cache>) {
    let d = tempfile::tempdir().unwrap();
    let r = d.path();
    std::fs::create_dir_all(r.join("a/b/c")).unwrap();
    std::fs::write(r.join("a/b/c/f"), b"hello").unwrap();
    std::fs::write(r.join("a/file"), b"x").unwrap();
    symlink("b/c", r.join("a/l")).unwrap();
    symlink("/a/b", r.join("a/abs")).unwrap();
    symlink("loop2", r.join("loop1")).unwrap();
    symlink("loop1", r.join("loop2")).unwrap();
    std::fs::set_permissions(r, std::fs::Permissions::from_mode(0o755)).unwrap();
    let b = LocalBackend::new(r).unwrap();
    let c = Cache::new(Arc::new(b), Config::default()).unwrap();
    (d, c)
}

const F: LookupFlags = LookupFlags::FOLLOW;
const NF: LookupFlags = LookupFlags::NOFOLLOW;

#[test]
fn lookups_fast_and_slow_agree() {
    let (d, c) = setup();
    let root = c.credentials(Cred::root());
    for _ in 0..3 {
        let a = c.stat(&root, At::Root, b"/a/b/c/f", F).unwrap();
        assert_eq!(a.size, 5);
        assert_eq!(
            a.ino,
            std::fs::metadata(d.path().join("a/b/c/f"))
                .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
                .unwrap()
        );
        assert_eq!(c.stat(&root, At::Root, b"a/l/f", F).unwrap().size, 5);
        assert_eq!(c.stat(&root, At::Root, b"a/abs/c/f", F).unwrap().size, 5);
        assert!(
            c.stat(&root, At::Root, b"a/l", NF).unwrap().kind() == dircache_core::FileType::Symlink
        );
        assert!(c.stat(&root, At::Root, b"a/l", F).unwrap().is_dir());
        assert_eq!(
            c.stat(&root, At::Root, b"a/missing/x/y", F),
            Err(Error::NotFound)
        );
        assert_eq!(
            c.stat(&root, At::Root, b"a/file/x/y", F),
            Err(Error::NotDir)
        );
        assert_eq!(c.stat(&root, At::Root, b"a/file/", F), Err(Error::NotDir));
        assert_eq!(c.stat(&root, At::Root, b"loop1", F), Err(Error::Loop));
        assert_eq!(
            c.stat(&root, At::Root, b"a/b/../b/./c//f", F).unwrap().size,
            5
        );
        assert_eq!(c.stat(&root, At::Root, b"a/l/../c/f", F).unwrap().size, 5);
        assert_eq!(
            c.stat(&root, At::Root, b"/../../a/file", F).unwrap().size,
            1
        );
        assert_eq!(c.stat(&root, At::Root, b"", F), Err(Error::NotFound));
        assert_eq!(c.stat(&root, At::Root, b"a\0b", F), Err(Error::Invalid));
        assert_eq!(
            c.stat(&root, At::Root, &[b'x'; 256], F),
            Err(Error::NameTooLong)
        );
    }
    let s = c.stats();
    assert!(s.fastpath_hits > 10, "{s:?}");
}

#[test]
fn chmod_revokes_cached_access() {
    let (_d, c) = setup();
    let root = c.credentials(Cred::root());
    let u = c.credentials(Cred::new(1001, 1001, []));
    assert!(c.stat(&u, At::Root, b"a/b/c/f", F).is_ok());
    assert!(c.stat(&u, At::Root, b"a/b/c/f", F).is_ok());
    let h = c.opendir(&u, At::Root, b"a/b").unwrap();
    c.setattr(
        &root,
        At::Root,
        b"a",
        &SetAttr {
            mode: Some(0o700),
            ..Default::default()
        },
        F,
    )
    .unwrap();
    assert_eq!(c.stat(&u, At::Root, b"a/b/c/f", F), Err(Error::Access));
    assert_eq!(c.stat(&u, At::Root, b"a/b/c/f", F), Err(Error::Access));
    // Directory references keep access.
    assert!(c.stat(&u, At::Dir(&h), b"c/f", F).is_ok());
    assert!(c.stat(&root, At::Root, b"a/b/c/f", F).is_ok());
    c.setattr(
        &root,
        At::Root,
        b"a",
        &SetAttr {
            mode: Some(0o755),
            ..Default::default()
        },
        F,
    )
    .unwrap();
    assert!(c.stat(&u, At::Root, b"a/b/c/f", F).is_ok());
}

#[test]
fn rename_moves_cached_subtree() {
    let (d, c) = setup();
    let root = c.credentials(Cred::root());
    let ino = c.stat(&root, At::Root, b"a/b/c/f", F).unwrap().ino;
    c.rename(&root, At::Root, b"a/b", b"a/z", RenameMode::Replace)
        .unwrap();
    assert_eq!(c.stat(&root, At::Root, b"a/b/c/f", F), Err(Error::NotFound));
    assert_eq!(c.stat(&root, At::Root, b"a/z/c/f", F).unwrap().ino, ino);
    std::fs::create_dir_all(d.path().join("a/b/c")).unwrap();
    c.invalidate(b"a/b");
    assert_eq!(c.stat(&root, At::Root, b"a/b/c/f", F), Err(Error::NotFound));
    assert!(c.stat(&root, At::Root, b"a/b/c", F).unwrap().is_dir());
}

#[test]
fn readdir_complete_and_mutations() {
    let (_d, c) = setup();
    let root = c.credentials(Cred::root());
    let mut names: Vec<_> = c
        .readdir(&root, At::Root, b"a")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    names.sort();
    assert_eq!(
        names,
        vec![
            b"abs".to_vec(),
            b"b".to_vec(),
            b"file".to_vec(),
            b"l".to_vec()
        ]
    );
    let before = c.stats().backend_lookup;
    assert_eq!(
        c.stat(&root, At::Root, b"a/nothere", F),
        Err(Error::NotFound)
    );
    assert_eq!(
        c.stats().backend_lookup,
        before,
        "complete dir answers misses"
    );
    c.mkdir(&root, At::Root, b"a/new", 0o755).unwrap();
    c.mknod(&root, At::Root, b"a/new/f", 0o644, 0).unwrap();
    assert_eq!(c.readdir(&root, At::Root, b"a/new").unwrap().len(), 1);
    assert_eq!(c.rmdir(&root, At::Root, b"a/new"), Err(Error::NotEmpty));
    c.unlink(&root, At::Root, b"a/new/f").unwrap();
    c.rmdir(&root, At::Root, b"a/new").unwrap();
    assert_eq!(c.stat(&root, At::Root, b"a/new", F), Err(Error::NotFound));
    let n = c.readdir(&root, At::Root, b"a").unwrap().len();
    assert_eq!(n, 4);
}
