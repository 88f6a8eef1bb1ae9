//! Subtree invalidation (docs/core.md, I1): what `bump_subtree` visits.
//!
//! * `moved_out_directories_leave_the_interior_list`: a directory that directories pass
//!   through (`mkdir tmp/xN; mv tmp/xN dst/xN`) must not keep them on its interior list (the
//!   list used to grow by one per move, forever, and every chmod of `tmp` walked it).
//! * `invalidation_visits_only_children_filed_here`: after `mv a/b d/b`, a chmod of `a`
//!   bumps `a` alone, and a chmod of `d` reaches `d/b/c` (the moved subtree is invalidated
//!   through its new parent: a user who lost search permission on `d` is refused).
//! * `removed_and_evicted_children_leave_the_interior_list`: rmdir and unlink through the
//!   cache take the child off the list.
//! * `renamed_and_chmoded_subtrees_are_never_served_stale`: `bump_subtree` reads a dentry's
//!   interior list only if it has `HAS_INTERIOR`; every way a subtree gets cached (a walk, a
//!   listing, mkdir, a move into a directory of files, deep negatives below a file and below
//!   a negative) must set it, or a fast-path hit (DLHT + prefix-check cache) serves a path
//!   under a renamed directory at its old name, or below a chmod'ed one to a user refused now.

use std::sync::Arc;

use crate::memory::MemoryBackend;
use crate::{At, Cache, Config, Cred, Error, LookupFlags, NodeRef, RenameMode, SetAttr};

fn cache() -> (Arc<Cache>, crate::Creds) {
    let c = Cache::new(Arc::new(MemoryBackend::new()), Config::default()).expect("cache");
    let root = c.credentials(Cred::root());
    (c, root)
}

fn node(c: &Cache, cr: &crate::Creds, p: &str) -> NodeRef {
    c.lookup(cr, At::Root, p.as_bytes(), LookupFlags::NOFOLLOW)
        .expect(p)
}

fn interior_len(n: &NodeRef) -> usize {
    n.inner
        .read()
        .children
        .as_ref()
        .map_or(0, |ch| ch.interior.len())
}

fn chmod(c: &Cache, cr: &crate::Creds, p: &str, mode: u32) {
    let set = SetAttr {
        mode: Some(mode),
        ..SetAttr::default()
    };
    c.setattr(cr, At::Root, p.as_bytes(), &set, LookupFlags::NOFOLLOW)
        .expect(p);
}

#[test]
fn moved_out_directories_leave_the_interior_list() {
    let (c, r) = cache();
    c.mkdir(&r, At::Root, b"tmp", 0o755).unwrap();
    c.mkdir(&r, At::Root, b"dst", 0o755).unwrap();
    for i in 0..40 {
        let (from, to) = (format!("tmp/x{i}"), format!("dst/x{i}"));
        c.mkdir(&r, At::Root, from.as_bytes(), 0o755).unwrap();
        c.rename(
            &r,
            At::Root,
            from.as_bytes(),
            to.as_bytes(),
            RenameMode::Replace,
        )
        .unwrap();
    }
    let tmp = node(&c, &r, "tmp");
    assert_eq!(
        interior_len(&tmp),
        0,
        "tmp keeps the directories moved out of it"
    );
    assert_eq!(interior_len(&node(&c, &r, "dst")), 40);
    let before = c.stats().invalidated_entries;
    chmod(&c, &r, "tmp", 0o700);
    assert_eq!(
        c.stats().invalidated_entries - before,
        1,
        "chmod tmp visits more than tmp"
    );
}

#[test]
fn invalidation_visits_only_children_filed_here() {
    let (c, r) = cache();
    for d in ["a", "a/b", "a/b/c", "d"] {
        c.mkdir(&r, At::Root, d.as_bytes(), 0o755).unwrap();
    }
    c.mknod(&r, At::Root, b"a/b/c/f", 0o100644, 0).unwrap();
    let user = c.credentials(Cred::new(1000, 1000, []));
    c.stat(&user, At::Root, b"a/b/c/f", LookupFlags::NOFOLLOW)
        .unwrap();
    c.rename(&r, At::Root, b"a/b", b"d/b", RenameMode::Replace)
        .unwrap();
    // Warm the fast path for the moved file.
    for _ in 0..2 {
        c.stat(&user, At::Root, b"d/b/c/f", LookupFlags::NOFOLLOW)
            .unwrap();
    }
    let before = c.stats().invalidated_entries;
    chmod(&c, &r, "a", 0o700);
    assert_eq!(c.stats().invalidated_entries - before, 1);
    c.stat(&user, At::Root, b"d/b/c/f", LookupFlags::NOFOLLOW)
        .unwrap();
    let before = c.stats().invalidated_entries;
    chmod(&c, &r, "d", 0o700);
    assert_eq!(
        c.stats().invalidated_entries - before,
        3,
        "d, d/b and d/b/c must be bumped"
    );
    assert_eq!(
        c.stat(&user, At::Root, b"d/b/c/f", LookupFlags::NOFOLLOW),
        Err(Error::Access),
        "a cached lookup below d survived the chmod of d"
    );
}

#[test]
fn removed_and_evicted_children_leave_the_interior_list() {
    let (c, r) = cache();
    c.mkdir(&r, At::Root, b"p", 0o755).unwrap();
    for i in 0..10 {
        c.mkdir(&r, At::Root, format!("p/d{i}").as_bytes(), 0o755)
            .unwrap();
    }
    let p = node(&c, &r, "p");
    assert_eq!(interior_len(&p), 10);
    for i in 0..10 {
        c.rmdir(&r, At::Root, format!("p/d{i}").as_bytes()).unwrap();
    }
    assert_eq!(interior_len(&p), 0);
}

#[test]
fn renamed_and_chmoded_subtrees_are_never_served_stale() {
    let b = MemoryBackend::new();
    b.populate(&[
        "top/a/b/c/f",
        "top/l/s0/f",
        "top/l/s1/g",
        "top/file",
        "other/x/y/z",
        "files/f1",
        "files/f2",
    ]);
    let c = Cache::new(Arc::new(b), Config::default()).expect("cache");
    let r = c.credentials(Cred::root());
    let user = c.credentials(Cred::new(1000, 1000, []));
    // Cached in every way a subtree can be: walks, a listing (top/l), mkdir (top/m/n), deep
    // negatives below a file (top/file/x/y: ENOTDIR) and below a negative (top/none/x/y), a
    // directory moved into a directory of files (`files` had no interior child before).
    c.readdir(&user, At::Root, b"top/l").unwrap();
    c.mkdir(&r, At::Root, b"top/m", 0o755).unwrap();
    c.mkdir(&r, At::Root, b"top/m/n", 0o755).unwrap();
    c.mknod(&r, At::Root, b"top/m/n/f", 0o100644, 0).unwrap();
    for p in ["files/f1", "other/x/y/z"] {
        c.stat(&user, At::Root, p.as_bytes(), LookupFlags::NOFOLLOW)
            .unwrap();
    }
    c.rename(&r, At::Root, b"other/x", b"files/x", RenameMode::Replace)
        .unwrap();
    let cases: [(&str, Result<(), Error>); 7] = [
        ("a/b/c/f", Ok(())),
        ("l/s0/f", Ok(())),
        ("l/s1/g", Ok(())),
        ("m/n/f", Ok(())),
        ("x/y/z", Ok(())),
        ("file/x/y", Err(Error::NotDir)),
        ("none/x/y", Err(Error::NotFound)),
    ];
    let top = |p: &str| {
        if p.starts_with("x/") {
            format!("files/{p}")
        } else {
            format!("top/{p}")
        }
    };
    let stat = |p: &str| {
        c.stat(&user, At::Root, p.as_bytes(), LookupFlags::NOFOLLOW)
            .map(|_| ())
    };
    // Warm: each path answered twice, the second time by the fast path.
    for (p, want) in &cases {
        assert_eq!(stat(&top(p)), *want, "{p} before");
        let hits = c.stats().fastpath_hits;
        assert_eq!(stat(&top(p)), *want, "{p} before (warm)");
        assert_eq!(
            c.stats().fastpath_hits,
            hits + 1,
            "{p} is not a fast-path hit"
        );
    }
    c.rename(&r, At::Root, b"top", b"top2", RenameMode::Replace)
        .unwrap();
    c.rename(&r, At::Root, b"files", b"files2", RenameMode::Replace)
        .unwrap();
    let moved = |p: &str| {
        top(p)
            .replacen("top/", "top2/", 1)
            .replacen("files/", "files2/", 1)
    };
    for (p, want) in &cases {
        assert_eq!(
            stat(&top(p)),
            Err(Error::NotFound),
            "{} served at its old name after the rename",
            top(p)
        );
        assert_eq!(stat(&moved(p)), *want, "{} after the rename", moved(p));
        assert_eq!(
            stat(&moved(p)),
            *want,
            "{} after the rename (warm)",
            moved(p)
        );
    }
    // The moved subtrees are warm again at their new names; a chmod of their tops must
    // reach every cached interior dentry below them.
    chmod(&c, &r, "top2", 0o700);
    chmod(&c, &r, "files2", 0o700);
    for (p, _) in &cases {
        assert_eq!(
            stat(&moved(p)),
            Err(Error::Access),
            "{} served after its ancestor's chmod 700",
            moved(p)
        );
    }
}
