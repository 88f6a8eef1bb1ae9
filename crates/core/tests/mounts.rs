//! Mounts, bind mounts (mount aliases) and mount namespaces (SOSP'15 §4.3) on the in-memory
//! backend. Mounting needs root in the kernel, so the expected results are written from
//! Linux's semantics (mount(2), mount_namespaces(7), path_resolution(7)); each test says which
//! rule it checks. Every lookup is made at least twice so that the fast path (direct-lookup
//! table + prefix-check cache) answers too, after the slow path published its result.

mod common;

use std::sync::Arc;

use common::{cache_with, resolve, root, user, Outcome};
use dircache_core::memory::MemoryBackend;
use dircache_core::{
    At, Backend, Cache, Config, Creds, Error, LookupFlags, MountOptions, MountSource, Namespace,
    SetAttr, R_OK, W_OK, X_OK,
};

const F: LookupFlags = LookupFlags::FOLLOW;

/// Resolve twice (slow path, then possibly fast path) in namespace `ns`; both must agree.
fn look(c: &Cache, cr: &Creds, ns: &Arc<Namespace>, path: &str) -> Outcome {
    let h = c.root_handle(ns);
    let first = resolve(c, cr, At::Dir(&h), path, F);
    let second = resolve(c, cr, At::Dir(&h), path, F);
    assert_eq!(
        first, second,
        "{path}: second lookup differs from the first"
    );
    first
}

/// The inode number `path` resolves to in `ns` (mounted file systems have their own).
fn ino(c: &Cache, cr: &Creds, ns: &Arc<Namespace>, path: &str) -> Result<u64, Error> {
    let h = c.root_handle(ns);
    let a1 = c.stat(cr, At::Dir(&h), path.as_bytes(), F)?;
    let a2 = c.stat(cr, At::Dir(&h), path.as_bytes(), F)?;
    assert_eq!(a1.ino, a2.ino, "{path}");
    Ok(a1.ino)
}

fn other_fs(spec: &[&str]) -> Arc<MemoryBackend> {
    let m = Arc::new(MemoryBackend::new());
    m.populate(spec);
    m
}

/// mount(2): after mounting, the mount point shows the mounted file system's root, and what
/// the covered directory held is hidden — also if the cache had it before the mount (the
/// mount must invalidate fast-path entries below the mount point). `..` of the mounted root
/// is the mount point's parent. umount(2) uncovers the old contents.
#[test]
fn mount_covers_and_umount_uncovers() {
    let (_m, c) = cache_with(&["mnt/old", "mnt/sub/deep", "top"], Config::default());
    let r = root(&c);
    let ns = c.namespace().clone();
    // Cached before the mount: positives and a negative.
    assert_eq!(look(&c, &r, &ns, "/mnt/old"), Ok("mnt/old".into()));
    assert_eq!(
        look(&c, &r, &ns, "/mnt/sub/deep"),
        Ok("mnt/sub/deep".into())
    );
    assert_eq!(look(&c, &r, &ns, "/mnt/new"), Err(libc::ENOENT));
    let old_mnt_ino = ino(&c, &r, &ns, "/mnt").unwrap();

    let b = other_fs(&["new", "dir/x"]);
    let b_root_ino = b.getattr(b"").unwrap().ino;
    c.mount(
        &ns,
        b"/mnt",
        MountSource::Backend(b.clone()),
        MountOptions::default(),
    )
    .unwrap();
    assert_eq!(look(&c, &r, &ns, "/mnt/old"), Err(libc::ENOENT));
    assert_eq!(look(&c, &r, &ns, "/mnt/sub/deep"), Err(libc::ENOENT));
    assert_eq!(look(&c, &r, &ns, "/mnt/new"), Ok("new".into()));
    assert_eq!(look(&c, &r, &ns, "/mnt/dir/x"), Ok("dir/x".into()));
    assert_eq!(ino(&c, &r, &ns, "/mnt").unwrap(), b_root_ino);
    // `..` climbs out of the mount to the mount point's parent (the root here).
    assert_eq!(look(&c, &r, &ns, "/mnt/dir/../../top"), Ok("top".into()));
    assert_eq!(look(&c, &r, &ns, "/mnt/.."), Ok("".into()));
    // The listing is the mounted root's.
    let h = c.root_handle(&ns);
    let mut names: Vec<Vec<u8>> = c
        .readdir(&r, At::Dir(&h), b"/mnt")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    names.sort();
    assert_eq!(names, vec![b"dir".to_vec(), b"new".to_vec()]);
    // Creating through the mount lands in the mounted file system, not in the covered one.
    c.mknod(&r, At::Dir(&h), b"/mnt/made", libc::S_IFREG | 0o644, 0)
        .unwrap();
    assert!(b.getattr(b"made").is_ok());
    assert_eq!(c.backend().getattr(b"mnt/made"), Err(Error::NotFound));

    c.umount(&ns, b"/mnt").unwrap();
    assert_eq!(look(&c, &r, &ns, "/mnt/old"), Ok("mnt/old".into()));
    assert_eq!(
        look(&c, &r, &ns, "/mnt/sub/deep"),
        Ok("mnt/sub/deep".into())
    );
    assert_eq!(look(&c, &r, &ns, "/mnt/new"), Err(libc::ENOENT));
    assert_eq!(look(&c, &r, &ns, "/mnt/made"), Err(libc::ENOENT));
    assert_eq!(ino(&c, &r, &ns, "/mnt").unwrap(), old_mnt_ino);
}

/// mount(2)/umount(2) errors: mounting on a file is ENOTDIR, on a missing path ENOENT;
/// unmounting what is not a mount point is EINVAL; unmounting a mount that has a mount below
/// it is EBUSY (Linux: umount without MNT_DETACH of a mount with submounts).
#[test]
fn mount_and_umount_errors() {
    let (_m, c) = cache_with(&["d/", "f"], Config::default());
    let ns = c.namespace().clone();
    let b = || MountSource::Backend(other_fs(&["inner/"]));
    let o = MountOptions::default();
    assert_eq!(c.mount(&ns, b"/f", b(), o), Err(Error::NotDir));
    assert_eq!(c.mount(&ns, b"/nope", b(), o), Err(Error::NotFound));
    assert_eq!(c.umount(&ns, b"/d"), Err(Error::Invalid));
    assert_eq!(c.umount(&ns, b"/"), Err(Error::Invalid));
    c.mount(&ns, b"/d", b(), o).unwrap();
    c.mount(&ns, b"/d/inner", b(), o).unwrap();
    assert_eq!(c.umount(&ns, b"/d"), Err(Error::Busy));
    c.umount(&ns, b"/d/inner").unwrap();
    c.umount(&ns, b"/d").unwrap();
    assert_eq!(c.umount(&ns, b"/d"), Err(Error::Invalid));
}

/// Mounting on a mount point stacks (Linux: the newest mount covers the older one, and
/// unmounting it uncovers the older one).
#[test]
fn mounts_stack_on_a_mount_point() {
    let (_m, c) = cache_with(&["d/under"], Config::default());
    let r = root(&c);
    let ns = c.namespace().clone();
    let o = MountOptions::default();
    c.mount(&ns, b"/d", MountSource::Backend(other_fs(&["first"])), o)
        .unwrap();
    assert_eq!(look(&c, &r, &ns, "/d/first"), Ok("first".into()));
    c.mount(&ns, b"/d", MountSource::Backend(other_fs(&["second"])), o)
        .unwrap();
    assert_eq!(look(&c, &r, &ns, "/d/first"), Err(libc::ENOENT));
    assert_eq!(look(&c, &r, &ns, "/d/second"), Ok("second".into()));
    c.umount(&ns, b"/d").unwrap();
    assert_eq!(look(&c, &r, &ns, "/d/second"), Err(libc::ENOENT));
    assert_eq!(look(&c, &r, &ns, "/d/first"), Ok("first".into()));
    c.umount(&ns, b"/d").unwrap();
    assert_eq!(look(&c, &r, &ns, "/d/under"), Ok("d/under".into()));
}

/// Bind mounts (mount --bind): the same directory reachable by two paths (a mount alias,
/// SOSP'15 §4.3). A change made through either path is seen through both, whichever path
/// the fast path learned last; `..` at the bind mount's root goes to the parent of the mount
/// point, not of the source directory.
#[test]
fn bind_mount_is_an_alias() {
    let (_m, c) = cache_with(
        &["src/dir/f", "src/dir/g", "elsewhere/mp/", "elsewhere/sib"],
        Config::default(),
    );
    let r = root(&c);
    let ns = c.namespace().clone();
    c.mount(
        &ns,
        b"/elsewhere/mp",
        MountSource::Bind(b"/src/dir".to_vec()),
        MountOptions::default(),
    )
    .unwrap();
    assert_eq!(look(&c, &r, &ns, "/elsewhere/mp/f"), Ok("src/dir/f".into()));
    assert_eq!(look(&c, &r, &ns, "/src/dir/f"), Ok("src/dir/f".into()));
    assert_eq!(
        ino(&c, &r, &ns, "/elsewhere/mp/f").unwrap(),
        ino(&c, &r, &ns, "/src/dir/f").unwrap()
    );
    // `..` from the bind mount's root: the mount point's parent.
    assert_eq!(
        look(&c, &r, &ns, "/elsewhere/mp/.."),
        Ok("elsewhere".into())
    );
    assert_eq!(
        look(&c, &r, &ns, "/elsewhere/mp/../sib"),
        Ok("elsewhere/sib".into())
    );
    assert_eq!(look(&c, &r, &ns, "/src/dir/.."), Ok("src".into()));
    let h = c.root_handle(&ns);
    // Remove through one path: gone through the other (both were cached).
    c.unlink(&r, At::Dir(&h), b"/elsewhere/mp/f").unwrap();
    assert_eq!(look(&c, &r, &ns, "/src/dir/f"), Err(libc::ENOENT));
    assert_eq!(look(&c, &r, &ns, "/elsewhere/mp/f"), Err(libc::ENOENT));
    // Create through the other: seen through both.
    c.mkdir(&r, At::Dir(&h), b"/src/dir/new", 0o755).unwrap();
    assert_eq!(
        look(&c, &r, &ns, "/elsewhere/mp/new"),
        Ok("src/dir/new".into())
    );
    // Rename inside the source: the alias follows.
    c.rename(
        &r,
        At::Dir(&h),
        b"/src/dir/g",
        b"/src/dir/g2",
        Default::default(),
    )
    .unwrap();
    assert_eq!(look(&c, &r, &ns, "/elsewhere/mp/g"), Err(libc::ENOENT));
    assert_eq!(
        look(&c, &r, &ns, "/elsewhere/mp/g2"),
        Ok("src/dir/g2".into())
    );
    // Bind-mounting a file is not supported here: ENOTDIR.
    assert_eq!(
        c.mount(
            &ns,
            b"/elsewhere/sib",
            MountSource::Bind(b"/src/dir/g2".to_vec()),
            MountOptions::default()
        ),
        Err(Error::NotDir)
    );
}

/// A permission change on a directory reached through two paths must be seen through both
/// (SOSP'15 §4.3: "the version count increment is needed in case the aliased paths have
/// different prefix check results").
#[test]
fn chmod_through_one_alias_revokes_access_through_the_other() {
    let (_m, c) = cache_with(&["src/dir/sub/f", "mp/"], Config::default());
    let r = root(&c);
    let u = user(&c, 1000);
    let ns = c.namespace().clone();
    c.mount(
        &ns,
        b"/mp",
        MountSource::Bind(b"/src/dir".to_vec()),
        MountOptions::default(),
    )
    .unwrap();
    assert_eq!(look(&c, &u, &ns, "/mp/sub/f"), Ok("src/dir/sub/f".into()));
    assert_eq!(
        look(&c, &u, &ns, "/src/dir/sub/f"),
        Ok("src/dir/sub/f".into())
    );
    let h = c.root_handle(&ns);
    let chmod = |m: u32| SetAttr {
        mode: Some(m),
        ..Default::default()
    };
    c.setattr(&r, At::Dir(&h), b"/mp/sub", &chmod(0o700), F)
        .unwrap();
    assert_eq!(look(&c, &u, &ns, "/src/dir/sub/f"), Err(libc::EACCES));
    assert_eq!(look(&c, &u, &ns, "/mp/sub/f"), Err(libc::EACCES));
    c.setattr(&r, At::Dir(&h), b"/src/dir/sub", &chmod(0o755), F)
        .unwrap();
    assert_eq!(look(&c, &u, &ns, "/mp/sub/f"), Ok("src/dir/sub/f".into()));
    assert_eq!(
        look(&c, &u, &ns, "/src/dir/sub/f"),
        Ok("src/dir/sub/f".into())
    );
}

/// Per-mount options (mount(8) ro, noexec): a read-only bind mount refuses writes (EROFS)
/// while the source stays writable; noexec refuses execute access to files (EACCES) but not
/// search of directories. The options belong to the mount, not to the files.
#[test]
fn mount_options_apply_per_mount() {
    let (_m, c) = cache_with(&["data/f", "data/d/", "ro/", "nx/"], Config::default());
    let r = root(&c);
    let ns = c.namespace().clone();
    let h = c.root_handle(&ns);
    let ro = MountOptions {
        read_only: true,
        ..Default::default()
    };
    let nx = MountOptions {
        noexec: true,
        nosuid: true,
        ..Default::default()
    };
    c.mount(&ns, b"/ro", MountSource::Bind(b"/data".to_vec()), ro)
        .unwrap();
    c.mount(&ns, b"/nx", MountSource::Bind(b"/data".to_vec()), nx)
        .unwrap();
    assert_eq!(c.mount_options(&ns, b"/ro/f").unwrap(), ro);
    assert_eq!(c.mount_options(&ns, b"/nx/d").unwrap(), nx);
    assert_eq!(
        c.mount_options(&ns, b"/data/f").unwrap(),
        MountOptions::default()
    );
    // Make f executable so that only the mount option can refuse X_OK.
    let exec = SetAttr {
        mode: Some(0o755),
        ..Default::default()
    };
    c.setattr(&r, At::Dir(&h), b"/data/f", &exec, F).unwrap();
    for _ in 0..2 {
        assert_eq!(
            c.mkdir(&r, At::Dir(&h), b"/ro/x", 0o755),
            Err(Error::ReadOnly)
        );
        assert_eq!(
            c.access(&r, At::Dir(&h), b"/ro/f", W_OK),
            Err(Error::ReadOnly)
        );
        assert_eq!(c.access(&r, At::Dir(&h), b"/ro/f", R_OK), Ok(()));
        assert_eq!(
            c.setattr(&r, At::Dir(&h), b"/ro/f", &exec, F),
            Err(Error::ReadOnly)
        );
        assert_eq!(
            c.access(&r, At::Dir(&h), b"/nx/f", X_OK),
            Err(Error::Access)
        );
        assert_eq!(c.access(&r, At::Dir(&h), b"/nx/d", X_OK), Ok(()));
        assert_eq!(c.access(&r, At::Dir(&h), b"/data/f", X_OK), Ok(()));
        assert_eq!(c.access(&r, At::Dir(&h), b"/data/f", W_OK), Ok(()));
    }
    c.mkdir(&r, At::Dir(&h), b"/data/x", 0o755).unwrap();
    assert_eq!(look(&c, &r, &ns, "/ro/x"), Ok("data/x".into()));
    // A path that climbs out of the read-only mount is writable again.
    c.mkdir(&r, At::Dir(&h), b"/ro/../data/y", 0o755).unwrap();
}

/// Mount namespaces (mount_namespaces(7), with private propagation as `unshare -m` sets up):
/// a copy starts with the same mounts; mounts made afterwards in one are invisible in the
/// other; the same path names different files in each, and each namespace's direct-lookup
/// table answers only for it (SOSP'15 §4.3).
#[test]
fn namespaces_have_private_mount_tables() {
    let (_m, c) = cache_with(&["m/under", "shared/"], Config::default());
    let r = root(&c);
    let ns1 = c.namespace().clone();
    c.mount(
        &ns1,
        b"/shared",
        MountSource::Backend(other_fs(&["before_clone"])),
        MountOptions::default(),
    )
    .unwrap();
    // Cached in ns1 before the clone.
    assert_eq!(look(&c, &r, &ns1, "/m/under"), Ok("m/under".into()));
    let ns2 = c.clone_namespace(&ns1);
    assert_eq!(
        look(&c, &r, &ns2, "/shared/before_clone"),
        Ok("before_clone".into())
    );
    assert_eq!(look(&c, &r, &ns2, "/m/under"), Ok("m/under".into()));

    c.mount(
        &ns2,
        b"/m",
        MountSource::Backend(other_fs(&["only2"])),
        MountOptions::default(),
    )
    .unwrap();
    assert_eq!(look(&c, &r, &ns2, "/m/under"), Err(libc::ENOENT));
    assert_eq!(look(&c, &r, &ns2, "/m/only2"), Ok("only2".into()));
    assert_eq!(look(&c, &r, &ns1, "/m/under"), Ok("m/under".into()));
    assert_eq!(look(&c, &r, &ns1, "/m/only2"), Err(libc::ENOENT));
    // Alternate between the namespaces: the fast path of one must never answer for the other.
    for _ in 0..3 {
        assert_eq!(look(&c, &r, &ns1, "/m/under"), Ok("m/under".into()));
        assert_eq!(look(&c, &r, &ns2, "/m/under"), Err(libc::ENOENT));
    }
    // A mount made in ns1 after the clone does not appear in ns2, nor an umount.
    c.mount(
        &ns1,
        b"/m",
        MountSource::Backend(other_fs(&["only1"])),
        MountOptions::default(),
    )
    .unwrap();
    assert_eq!(look(&c, &r, &ns1, "/m/only1"), Ok("only1".into()));
    assert_eq!(look(&c, &r, &ns2, "/m/only1"), Err(libc::ENOENT));
    assert_eq!(look(&c, &r, &ns2, "/m/only2"), Ok("only2".into()));
    c.umount(&ns1, b"/shared").unwrap();
    assert_eq!(
        look(&c, &r, &ns1, "/shared/before_clone"),
        Err(libc::ENOENT)
    );
    assert_eq!(
        look(&c, &r, &ns2, "/shared/before_clone"),
        Ok("before_clone".into())
    );
    // The root file system is shared: a file created through one namespace is in the other.
    let h1 = c.root_handle(&ns1);
    c.mkdir(&r, At::Dir(&h1), b"/shared/new", 0o755).unwrap();
    assert_eq!(look(&c, &r, &ns2, "/shared/new"), Err(libc::ENOENT)); // ns2 sees the mount
    c.umount(&ns2, b"/shared").unwrap();
    assert_eq!(look(&c, &r, &ns2, "/shared/new"), Ok("shared/new".into()));
}

/// A directory handle opened inside a mount keeps its namespace: relative lookups climb out
/// of the mount with `..` (to the mount point's parent), and absolute paths from it start at
/// its namespace's root (as a process's cwd and root in its own mount namespace).
#[test]
fn handles_inside_mounts_and_namespaces() {
    let (_m, c) = cache_with(&["p/mp/", "p/sib", "other"], Config::default());
    let r = root(&c);
    let ns1 = c.namespace().clone();
    let ns2 = c.clone_namespace(&ns1);
    c.mount(
        &ns2,
        b"/p/mp",
        MountSource::Backend(other_fs(&["in/deep"])),
        MountOptions::default(),
    )
    .unwrap();
    let h2 = c.root_handle(&ns2);
    let h = c.opendir(&r, At::Dir(&h2), b"/p/mp/in").unwrap();
    for _ in 0..2 {
        assert_eq!(
            resolve(&c, &r, At::Dir(&h), "deep", F),
            Ok("in/deep".into())
        );
        assert_eq!(
            resolve(&c, &r, At::Dir(&h), "../../sib", F),
            Ok("p/sib".into())
        );
        assert_eq!(
            resolve(&c, &r, At::Dir(&h), "../../mp/in/deep", F),
            Ok("in/deep".into())
        );
        assert_eq!(resolve(&c, &r, At::Dir(&h), "/p/mp/in", F), Ok("in".into()));
        assert_eq!(
            resolve(&c, &r, At::Dir(&h), "/other", F),
            Ok("other".into())
        );
        // The same path from the initial namespace: the covered directory.
        assert_eq!(resolve(&c, &r, At::Root, "/p/mp/in", F), Err(libc::ENOENT));
    }
    // The handle's namespace is ns2.
    assert!(Arc::ptr_eq(h.namespace(), &ns2));
}

/// Nested mounts: `..` climbs through every mount root in turn, and a lexical `..`
/// (`DotDot::Lexical`) gives the same answers on these paths because no symlinks are
/// involved.
#[test]
fn dotdot_climbs_through_nested_mounts() {
    for dotdot in [dircache_core::DotDot::Posix, dircache_core::DotDot::Lexical] {
        let (_m, c) = cache_with(
            &["a/m1/", "a/x"],
            Config {
                dotdot,
                ..Config::default()
            },
        );
        let r = root(&c);
        let ns = c.namespace().clone();
        c.mount(
            &ns,
            b"/a/m1",
            MountSource::Backend(other_fs(&["b/m2/", "b/y"])),
            MountOptions::default(),
        )
        .unwrap();
        c.mount(
            &ns,
            b"/a/m1/b/m2",
            MountSource::Backend(other_fs(&["z"])),
            MountOptions::default(),
        )
        .unwrap();
        assert_eq!(
            look(&c, &r, &ns, "/a/m1/b/m2/z"),
            Ok("z".into()),
            "{dotdot:?}"
        );
        assert_eq!(
            look(&c, &r, &ns, "/a/m1/b/m2/../y"),
            Ok("b/y".into()),
            "{dotdot:?}"
        );
        assert_eq!(
            look(&c, &r, &ns, "/a/m1/b/m2/../../../x"),
            Ok("a/x".into()),
            "{dotdot:?}"
        );
        assert_eq!(
            look(&c, &r, &ns, "/a/m1/b/m2/../../../../.."),
            Ok("".into()),
            "{dotdot:?}"
        );
        let h = c
            .opendir(&r, At::Dir(&c.root_handle(&ns)), b"/a/m1/b/m2")
            .unwrap();
        assert_eq!(
            resolve(&c, &r, At::Dir(&h), "../../../x", F),
            Ok("a/x".into()),
            "{dotdot:?}"
        );
        assert_eq!(
            resolve(&c, &r, At::Dir(&h), "../y", F),
            Ok("b/y".into()),
            "{dotdot:?}"
        );
    }
}

/// A non-recursive bind mount of a directory that contains a mount point shows the covered
/// directory, not the mount (mount(2): MS_BIND without MS_REC "only the single mount is
/// bound", submounts are not replicated). Likewise a bind of `/` onto a directory below it
/// does not recurse into itself.
#[test]
fn bind_mount_does_not_replicate_submounts() {
    let (_m, c) = cache_with(&["a/m/covered", "a/b/", "view/"], Config::default());
    let r = root(&c);
    let ns = c.namespace().clone();
    c.mount(
        &ns,
        b"/a/m",
        MountSource::Backend(other_fs(&["mounted"])),
        MountOptions::default(),
    )
    .unwrap();
    c.mount(
        &ns,
        b"/view",
        MountSource::Bind(b"/a".to_vec()),
        MountOptions::default(),
    )
    .unwrap();
    assert_eq!(look(&c, &r, &ns, "/a/m/mounted"), Ok("mounted".into()));
    assert_eq!(
        look(&c, &r, &ns, "/view/m/covered"),
        Ok("a/m/covered".into())
    );
    assert_eq!(look(&c, &r, &ns, "/view/m/mounted"), Err(libc::ENOENT));
    // Bind the root onto /a/b: /a/b/a/b is the plain (empty) directory b.
    c.mount(
        &ns,
        b"/a/b",
        MountSource::Bind(b"/".to_vec()),
        MountOptions::default(),
    )
    .unwrap();
    assert_eq!(
        look(&c, &r, &ns, "/a/b/a/m/covered"),
        Ok("a/m/covered".into())
    );
    assert_eq!(look(&c, &r, &ns, "/a/b/a/b/a"), Err(libc::ENOENT));
}

/// A mount that the backend below the covered directory knows nothing about: changes
/// reported by the root file system's change feed for paths below a mount point must not
/// reach into the mounted file system (they concern the covered directory).
#[test]
fn outside_changes_below_a_mount_point_leave_the_mount_alone() {
    use dircache_core::{Change, Cred};
    let (m, c) = cache_with(&["mp/hidden"], Config::default());
    let r = root(&c);
    let ns = c.namespace().clone();
    let b = other_fs(&["seen"]);
    c.mount(
        &ns,
        b"/mp",
        MountSource::Backend(b.clone()),
        MountOptions::default(),
    )
    .unwrap();
    assert_eq!(look(&c, &r, &ns, "/mp/seen"), Ok("seen".into()));
    m.unlink(&Cred::root(), b"mp/hidden").unwrap();
    c.apply_change(&Change::Entry {
        path: b"mp/hidden".to_vec(),
    });
    m.mknod(&Cred::root(), b"mp/seen", libc::S_IFREG | 0o644, 0)
        .unwrap();
    c.apply_change(&Change::Entry {
        path: b"mp/seen".to_vec(),
    });
    assert_eq!(look(&c, &r, &ns, "/mp/seen"), Ok("seen".into()));
    assert_eq!(look(&c, &r, &ns, "/mp/hidden"), Err(libc::ENOENT));
    c.umount(&ns, b"/mp").unwrap();
    assert_eq!(look(&c, &r, &ns, "/mp/hidden"), Err(libc::ENOENT));
    assert_eq!(look(&c, &r, &ns, "/mp/seen"), Ok("mp/seen".into()));
}
