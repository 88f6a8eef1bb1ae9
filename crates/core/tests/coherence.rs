//! What the cache answers without asking the backend, and when it must ask again, on the
//! in-memory backend (`MemoryBackend::calls` counts backend calls): deep negative entries,
//! directory completeness (SOSP'15 §5.1-5.2), and prefix-check invalidation when an
//! ancestor's permissions change (§3.2, "Directory References" for open handles). Expected
//! errno values are Linux's (path_resolution(7)).

mod common;

use common::{cache_with, resolve, root, user, Outcome};
use dircache_core::{At, Backend, Change, Config, Cred, LookupFlags, SetAttr};

const F: LookupFlags = LookupFlags::FOLLOW;

fn chmod(m: u32) -> SetAttr {
    SetAttr {
        mode: Some(m),
        ..Default::default()
    }
}

/// Deep negatives: after `missing/x/y` failed with ENOENT and `file/x/y` with ENOTDIR (as
/// Linux), asking again costs no backend call; creating the missing directory (through the
/// cache, or outside and reported) makes the names below it resolvable.
#[test]
fn deep_negatives_answer_without_the_backend_and_are_dropped_on_create() {
    let (m, c) = cache_with(&["d/file"], Config::default());
    let r = root(&c);
    let cases = [
        ("d/missing/x/y", libc::ENOENT),
        ("d/missing/x/y/z/w", libc::ENOENT),
        ("d/file/x/y", libc::ENOTDIR),
        ("d/file/", libc::ENOTDIR),
        ("d/missing", libc::ENOENT),
    ];
    for (p, e) in cases {
        assert_eq!(resolve(&c, &r, At::Root, p, F), Err(e), "{p}");
    }
    m.reset_calls();
    for _ in 0..3 {
        for (p, e) in cases {
            assert_eq!(resolve(&c, &r, At::Root, p, F), Err(e), "{p}");
        }
    }
    assert_eq!(m.calls(), 0, "negative answers went to the backend");

    // Through the cache: mkdir -p d/missing/x.
    c.mkdir(&r, At::Root, b"d/missing", 0o755).unwrap();
    assert_eq!(
        resolve(&c, &r, At::Root, "d/missing/x/y", F),
        Err(libc::ENOENT)
    );
    c.mkdir(&r, At::Root, b"d/missing/x", 0o755).unwrap();
    c.mknod(&r, At::Root, b"d/missing/x/y", libc::S_IFREG | 0o644, 0)
        .unwrap();
    assert_eq!(
        resolve(&c, &r, At::Root, "d/missing/x/y", F),
        Ok("d/missing/x/y".into())
    );
    assert_eq!(
        resolve(&c, &r, At::Root, "d/missing/x/y/z/w", F),
        Err(libc::ENOTDIR)
    );

    // Outside, reported by the change feed: the file becomes a directory.
    m.unlink(&Cred::root(), b"d/file").unwrap();
    m.mkdir(&Cred::root(), b"d/file", 0o755).unwrap();
    m.mkdir(&Cred::root(), b"d/file/x", 0o755).unwrap();
    c.apply_change(&Change::Entry {
        path: b"d/file".to_vec(),
    });
    assert_eq!(
        resolve(&c, &r, At::Root, "d/file/x", F),
        Ok("d/file/x".into())
    );
    assert_eq!(
        resolve(&c, &r, At::Root, "d/file/x/y", F),
        Err(libc::ENOENT)
    );
}

/// The same, fed by the backend's own change feed (`MemoryBackend::with_watch`), as a front
/// end would apply it.
#[test]
fn change_feed_reports_outside_creates_under_deep_negatives() {
    let m = std::sync::Arc::new(dircache_core::memory::MemoryBackend::with_watch());
    m.populate(&["d/"]);
    let c = dircache_core::Cache::new(m.clone(), Config::default()).unwrap();
    let feed = m.watch().unwrap().expect("with_watch gives a feed");
    let r = root(&c);
    for _ in 0..2 {
        assert_eq!(resolve(&c, &r, At::Root, "d/a/b/c", F), Err(libc::ENOENT));
    }
    m.mkdir(&Cred::root(), b"d/a", 0o755).unwrap();
    m.mkdir(&Cred::root(), b"d/a/b", 0o755).unwrap();
    m.mknod(&Cred::root(), b"d/a/b/c", libc::S_IFREG | 0o600, 0)
        .unwrap();
    let mut n = 0;
    while let Ok(ch) = feed.try_recv() {
        c.apply_change(&ch);
        n += 1;
    }
    assert!(n >= 3, "the feed reported {n} changes for three creates");
    assert_eq!(
        resolve(&c, &r, At::Root, "d/a/b/c", F),
        Ok("d/a/b/c".into())
    );
}

/// Directory completeness: once a directory was listed, a missing name in it is answered
/// ENOENT without a backend call, and listing it again costs none either. Without the
/// optimization, the same miss goes to the backend. A name created through the cache keeps
/// the directory complete; one created outside and reported is found.
#[test]
fn complete_directory_answers_misses_without_the_backend() {
    for completeness in [true, false] {
        let (m, c) = cache_with(
            &["d/a", "d/b", "d/sub/"],
            Config {
                completeness,
                ..Config::default()
            },
        );
        let r = root(&c);
        let listed = c.readdir(&r, At::Root, b"d").unwrap();
        assert_eq!(listed.len(), 3);
        m.reset_calls();
        assert_eq!(resolve(&c, &r, At::Root, "d/nope", F), Err(libc::ENOENT));
        assert_eq!(resolve(&c, &r, At::Root, "d/nope2/x", F), Err(libc::ENOENT));
        let again = c.readdir(&r, At::Root, b"d").unwrap();
        assert_eq!(again.len(), 3);
        if completeness {
            assert_eq!(m.calls(), 0, "complete directory asked the backend");
            assert!(c.lookup(&r, At::Root, b"d", F).unwrap().is_complete());
        } else {
            assert!(
                m.calls() >= 2,
                "without completeness a miss must ask the backend"
            );
            continue;
        }
        c.mknod(&r, At::Root, b"d/c", libc::S_IFREG | 0o644, 0)
            .unwrap();
        // The create changed d's mtime: the cache forgets d's attributes and fetches them
        // once (one getattr); after that, misses in d still cost nothing.
        assert!(c.lookup(&r, At::Root, b"d", F).unwrap().is_complete());
        c.stat(&r, At::Root, b"d", F).unwrap();
        m.reset_calls();
        assert_eq!(resolve(&c, &r, At::Root, "d/nope3", F), Err(libc::ENOENT));
        assert_eq!(c.readdir(&r, At::Root, b"d").unwrap().len(), 4);
        assert_eq!(m.calls(), 0, "a create through the cache lost completeness");
        // Outside: the cache cannot know until told.
        m.mknod(&Cred::root(), b"d/outside", libc::S_IFREG | 0o644, 0)
            .unwrap();
        c.apply_change(&Change::Entry {
            path: b"d/outside".to_vec(),
        });
        assert_eq!(
            resolve(&c, &r, At::Root, "d/outside", F),
            Ok("d/outside".into())
        );
        assert_eq!(c.readdir(&r, At::Root, b"d").unwrap().len(), 5);
    }
}

/// Invariant: a directory marked complete holds every one of its entries. Eviction must not
/// take a child out of a complete directory and leave it complete (the child would then be
/// answered ENOENT). A handle pins `d` (so `d` itself stays) while a tiny cache evicts its
/// children; every listed name must still resolve.
#[test]
fn eviction_never_makes_a_complete_directory_lie() {
    let mut spec: Vec<String> = (0..40).map(|i| format!("d/f{i}")).collect();
    spec.extend((0..200).map(|i| format!("other/g{i}")));
    let spec: Vec<&str> = spec.iter().map(String::as_str).collect();
    let (_m, c) = cache_with(
        &spec,
        Config {
            max_entries: 64,
            ..Config::default()
        },
    );
    let r = root(&c);
    let h = c.opendir(&r, At::Root, b"d").unwrap();
    let mut was_complete = 0;
    for round in 0..3 {
        assert_eq!(c.readdir(&r, At::Root, b"d").unwrap().len(), 40);
        was_complete += h.node().is_complete() as u32;
        for i in 0..200 {
            assert!(c
                .stat(&r, At::Root, format!("other/g{i}").as_bytes(), F)
                .is_ok());
        }
        for i in 0..40 {
            let p = format!("d/f{i}");
            assert_eq!(
                resolve(&c, &r, At::Root, &p, F),
                Ok(p.clone()),
                "round {round}"
            );
            assert_eq!(
                resolve(&c, &r, At::Dir(&h), &format!("f{i}"), F),
                Ok(p),
                "round {round}"
            );
        }
    }
    // The test is only meaningful if the directory was complete and then lost children.
    assert_eq!(was_complete, 3, "the listing did not make d complete");
    assert!(
        c.stats().evictions >= 40,
        "too few evictions: {}",
        c.stats().evictions
    );
    assert!(!h.node().is_dead());
}

/// Prefix-check cache: a user's cached permission to reach `a/b/c` is revoked when an
/// ancestor loses search permission (chmod through the cache, or outside and reported), and
/// given back when it regains it. Root keeps access. Another user's cached checks are his own.
#[test]
fn chmod_of_an_ancestor_revokes_cached_prefix_checks() {
    let (m, c) = cache_with(&["a/b/c/f"], Config::default());
    let r = root(&c);
    let u = user(&c, 1000);
    let v = user(&c, 1001);
    let paths = ["a/b/c/f", "a/b/c", "a/b/c/../c/f", "a/b/c/nope"];
    let want = |p: &str| {
        if p.ends_with("nope") {
            Err(libc::ENOENT)
        } else {
            Ok(common::plan9_clean(p))
        }
    };
    for _ in 0..2 {
        for p in paths {
            assert_eq!(resolve(&c, &u, At::Root, p, F), want(p), "{p}");
            assert_eq!(resolve(&c, &v, At::Root, p, F), want(p), "{p}");
        }
    }
    // chmod 700 a (owned by root): search denied to others.
    c.setattr(&r, At::Root, b"a", &chmod(0o700), F).unwrap();
    for _ in 0..2 {
        for p in paths {
            assert_eq!(
                resolve(&c, &u, At::Root, p, F),
                Err(libc::EACCES),
                "{p} after chmod"
            );
            assert_eq!(resolve(&c, &r, At::Root, p, F), want(p), "root {p}");
        }
    }
    // Give a to uid 1000: he may search again, 1001 still may not.
    c.setattr(
        &r,
        At::Root,
        b"a",
        &SetAttr {
            uid: Some(1000),
            ..Default::default()
        },
        F,
    )
    .unwrap();
    for p in paths {
        assert_eq!(resolve(&c, &u, At::Root, p, F), want(p), "{p} after chown");
        assert_eq!(
            resolve(&c, &v, At::Root, p, F),
            Err(libc::EACCES),
            "{p} other user"
        );
    }
    // Outside the cache: chmod 0 a/b, reported as an attribute change.
    m.setattr(&Cred::root(), b"a/b", &chmod(0)).unwrap();
    c.apply_change(&Change::Attr {
        path: b"a/b".to_vec(),
    });
    for _ in 0..2 {
        assert_eq!(resolve(&c, &u, At::Root, "a/b/c/f", F), Err(libc::EACCES));
    }
    m.setattr(&Cred::root(), b"a/b", &chmod(0o755)).unwrap();
    c.apply_change(&Change::Attr {
        path: b"a/b".to_vec(),
    });
    assert_eq!(
        resolve(&c, &u, At::Root, "a/b/c/f", F),
        Ok("a/b/c/f".into())
    );
}

/// Directory references (SOSP'15 §3.2): a process whose working directory is a/b keeps
/// opening names below it after an ancestor loses search permission (Linux checks only the
/// components walked), but `..` out of it needs search permission on a/b again and a path
/// through a fails.
#[test]
fn open_handle_keeps_access_after_ancestor_chmod() {
    let (_m, c) = cache_with(&["a/b/c/f", "a/b/g"], Config::default());
    let r = root(&c);
    let u = user(&c, 1000);
    let h = c.opendir(&u, At::Root, b"a/b").unwrap();
    for _ in 0..2 {
        assert_eq!(resolve(&c, &u, At::Dir(&h), "c/f", F), Ok("a/b/c/f".into()));
    }
    c.setattr(&r, At::Root, b"a", &chmod(0o700), F).unwrap();
    for _ in 0..2 {
        assert_eq!(resolve(&c, &u, At::Dir(&h), "c/f", F), Ok("a/b/c/f".into()));
        assert_eq!(resolve(&c, &u, At::Dir(&h), "g", F), Ok("a/b/g".into()));
        assert_eq!(
            resolve(&c, &u, At::Dir(&h), "c/../g", F),
            Ok("a/b/g".into())
        );
        // `..` of a/b is a: reaching it needs search on a/b only (allowed), but a/b again
        // from there needs search on a (denied).
        assert_eq!(resolve(&c, &u, At::Dir(&h), "..", F), Ok("a".into()));
        assert_eq!(resolve(&c, &u, At::Dir(&h), "../b/g", F), Err(libc::EACCES));
        assert_eq!(resolve(&c, &u, At::Root, "a/b/g", F), Err(libc::EACCES));
        assert_eq!(
            c.opendir(&u, At::Root, b"a/b").err(),
            Some(dircache_core::Error::Access)
        );
    }
    // Removing search permission on the handle's own directory does end relative access.
    c.setattr(&r, At::Root, b"a/b", &chmod(0o700), F).unwrap();
    assert_eq!(resolve(&c, &u, At::Dir(&h), "g", F), Err(libc::EACCES));
}

/// Renaming an ancestor moves everything cached below it: old paths fail, new ones resolve
/// (both were in the fast path's table before).
#[test]
fn rename_of_an_ancestor_moves_cached_paths() {
    let (_m, c) = cache_with(&["a/b/c/f", "z/"], Config::default());
    let r = root(&c);
    let u = user(&c, 1000);
    for _ in 0..2 {
        assert_eq!(
            resolve(&c, &u, At::Root, "a/b/c/f", F),
            Ok("a/b/c/f".into())
        );
        assert_eq!(resolve(&c, &u, At::Root, "z/b/c/f", F), Err(libc::ENOENT));
    }
    c.rename(&r, At::Root, b"a/b", b"z/b", Default::default())
        .unwrap();
    for _ in 0..2 {
        assert_eq!(resolve(&c, &u, At::Root, "a/b/c/f", F), Err(libc::ENOENT));
        assert_eq!(
            resolve(&c, &u, At::Root, "z/b/c/f", F),
            Ok("z/b/c/f".into())
        );
        assert_eq!(
            resolve(&c, &u, At::Root, "z/b/c/../../../a", F),
            Ok("a".into())
        );
    }
}

/// Fast-path entries validate by a bound (a `seq` value reserved before the publishing walk's
/// last window check; docs/core.md I2): lookups that begin after a chmod or rename returned
/// must never hit an entry published before it, also while other threads keep publishing
/// (racing the changes) and evicting. The main thread changes the tree and checks each answer
/// right after the change returns; two threads hammer the same paths (and evict, with a small
/// `max_entries`). A leaf below a chmod'ed directory checks the parent half of the bound
/// (leaves are not bumped, I1).
#[test]
fn fast_path_hits_racing_chmod_rename_and_eviction_are_never_stale() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let mut spec = vec!["a/b/f", "a/b/g", "a/c/h", "z/"];
    let fill: Vec<String> = (0..200).map(|i| format!("e/{i}")).collect();
    spec.extend(fill.iter().map(String::as_str));
    let config = Config {
        max_entries: 64,
        ..Config::default()
    };
    let (_m, c) = cache_with(&spec, config);
    let r = root(&c);
    let stop = AtomicBool::new(false);
    // Stops the hammers also when a check panics (the scope joins them before unwinding).
    struct Stop<'a>(&'a AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let paths = [
        "a/b/f",
        "a/b/g",
        "a/c/h",
        "z/b/f",
        "a/b",
        "a/b/../c/h",
        "a/b/f/",
    ];
    std::thread::scope(|s| {
        for t in 0..2 {
            let (c, stop, fill) = (&c, &stop, &fill);
            s.spawn(move || {
                let u = user(c, 1000);
                let mut i = t;
                while !stop.load(Ordering::Relaxed) {
                    for p in paths {
                        let _ = resolve(c, &u, At::Root, p, F);
                    }
                    let _ = resolve(c, &u, At::Root, &fill[i % fill.len()], F);
                    i += 7;
                }
            });
        }
        let _stop = Stop(&stop);
        let u = user(&c, 1000);
        let check = |p: &str, want: Outcome, when: &str| {
            for _ in 0..3 {
                assert_eq!(resolve(&c, &u, At::Root, p, F), want, "{p} after {when}");
            }
        };
        let mv = |from: &[u8], to: &[u8]| {
            c.rename(&r, At::Root, from, to, Default::default())
                .expect("rename");
        };
        for _ in 0..300 {
            c.setattr(&r, At::Root, b"a", &chmod(0o700), F).unwrap();
            check("a/b/f", Err(libc::EACCES), "chmod 700 a");
            check("a/b/../c/h", Err(libc::EACCES), "chmod 700 a");
            c.setattr(&r, At::Root, b"a", &chmod(0o755), F).unwrap();
            check("a/b/f", Ok("a/b/f".into()), "chmod 755 a");
            check("a/b/../c/h", Ok("a/c/h".into()), "chmod 755 a");
            mv(b"a/b", b"z/b");
            check("a/b/f", Err(libc::ENOENT), "mv a/b z/b");
            check("z/b/f", Ok("z/b/f".into()), "mv a/b z/b");
            mv(b"z/b", b"a/b");
            check("z/b/f", Err(libc::ENOENT), "mv z/b a/b");
            check("a/b/g", Ok("a/b/g".into()), "mv z/b a/b");
            c.setattr(&r, At::Root, b"a/b", &chmod(0o700), F).unwrap();
            check("a/b/f", Err(libc::EACCES), "chmod 700 a/b");
            check("a/b", Ok("a/b".into()), "chmod 700 a/b");
            c.setattr(&r, At::Root, b"a/b", &chmod(0o755), F).unwrap();
            check("a/b/f", Ok("a/b/f".into()), "chmod 755 a/b");
        }
    });
}

/// Names changed in the backend behind the cache's back (no change feed): a creation over a
/// cached positive that the backend no longer has creates (mknod, mkdir, O_CREAT with and
/// without O_EXCL); over a cached negative that the backend now has, mknod says EEXIST and
/// the name is found afterwards, and an open(O_CREAT) without O_EXCL opens the existing file
/// (never EEXIST or ENOENT, as natively), with O_EXCL EEXIST.
#[test]
fn creations_over_names_changed_behind_the_cache() {
    let gone = ["d/a", "d/b", "d/c", "d/e"];
    let (m, c) = cache_with(&gone, Config::default());
    let r = root(&c);
    let made = ["d/x", "d/y", "d/z"];
    for p in gone {
        assert_eq!(resolve(&c, &r, At::Root, p, F), Ok(p.into()));
    }
    for p in made {
        assert_eq!(resolve(&c, &r, At::Root, p, F), Err(libc::ENOENT));
    }
    let dir = c.lookup(&r, At::Root, b"d", F).unwrap();
    for p in gone {
        m.unlink(&Cred::root(), p.as_bytes()).unwrap();
    }
    for p in made {
        m.mknod(&Cred::root(), p.as_bytes(), libc::S_IFREG | 0o644, 0)
            .unwrap();
    }
    let reg = libc::S_IFREG | 0o644;
    let wr = libc::O_CREAT | libc::O_WRONLY;
    let errno = |e: dircache_core::Error| e.errno();
    assert_eq!(c.mknod(&r, At::Root, b"d/a", reg, 0).map(|_| ()), Ok(()));
    assert_eq!(c.mkdir(&r, At::Root, b"d/b", 0o755).map(|_| ()), Ok(()));
    let created = c.create_at(&r, &dir, b"c", 0o644, wr);
    assert_eq!(created.map(|_| ()).map_err(errno), Ok(()));
    let created = c.create_at(&r, &dir, b"e", 0o644, wr | libc::O_EXCL);
    assert_eq!(created.map(|_| ()).map_err(errno), Ok(()));
    for p in gone {
        assert!(m.getattr(p.as_bytes()).is_ok(), "{p} not created");
    }
    assert_eq!(
        c.mknod(&r, At::Root, b"d/x", reg, 0).map_err(errno),
        Err(libc::EEXIST)
    );
    assert_eq!(resolve(&c, &r, At::Root, "d/x", F), Ok("d/x".into()));
    let (node, _fd) = c.create_at(&r, &dir, b"y", 0o644, wr).unwrap();
    let ino = m.getattr(b"d/y").unwrap().ino;
    assert_eq!(c.getattr(&node).unwrap().ino, ino, "not the existing file");
    let excl = c.create_at(&r, &dir, b"z", 0o644, wr | libc::O_EXCL);
    assert_eq!(excl.map(|_| ()).map_err(errno), Err(libc::EEXIST));
    assert_eq!(resolve(&c, &r, At::Root, "d/z", F), Ok("d/z".into()));
}

/// A reported change caches nothing about a name nobody looked up: the report may be applied
/// while the change is still going on (a file reported as created before its writer wrote
/// it), and attributes cached then would be served, stale, until the write's own report came
/// (under load, a mount listed a file of 19 bytes just made in SRC as empty:
/// `crates/fuse/tests/prefetch.rs`, `prefetch_off_lists_nothing_ahead` without its settle).
/// The first lookup after the report asks the backend. A link reported this way is still
/// followed (`symlink_changed_outside_redirects_after_apply_change`).
#[test]
fn a_reported_creation_caches_nothing_about_the_name() {
    let (m, c) = cache_with(&["d/g"], Config::default());
    let r = root(&c);
    assert_eq!(resolve(&c, &r, At::Root, "d/g", F), Ok("d/g".into()));
    // Created outside, reported while still empty, then written (not yet reported).
    m.mknod(&Cred::root(), b"d/f", libc::S_IFREG | 0o644, 0)
        .unwrap();
    c.apply_change(&Change::Entry {
        path: b"d/f".to_vec(),
    });
    m.setattr(
        &Cred::root(),
        b"d/f",
        &SetAttr {
            size: Some(19),
            ..Default::default()
        },
    )
    .unwrap();
    let n = c
        .lookup(&r, At::Root, b"d/f", LookupFlags::NOFOLLOW)
        .expect("d/f");
    assert_eq!(
        c.getattr(&n).expect("attributes of d/f").size,
        19,
        "the size d/f had when its creation was reported, cached by the report"
    );
}

/// Torture seed 540 in the core: directory `a/e` (listed, empty) replaced behind the cache's
/// back by `a/b` renamed over it; a file created through the cache in the old dentry (the
/// creation forgets its attributes) and its attributes asked again by path before the report
/// (what the kernel's GETATTR of its old inode did): the answer is the new directory's. The
/// old dentry must not keep them: the report's revalidation compares inode numbers, and with
/// them kept it took the old dentry for the new directory and kept it, complete, listing the
/// new file alone.
#[test]
fn a_directory_replaced_outside_is_dropped_by_the_report_after_a_getattr_by_path() {
    let (m, c) = cache_with(&["a/b/f1", "a/b/f2", "a/e/"], Config::default());
    let r = root(&c);
    assert_eq!(c.readdir(&r, At::Root, b"a/b").unwrap().len(), 2);
    assert!(c.readdir(&r, At::Root, b"a/e").unwrap().is_empty());
    let old = c.lookup(&r, At::Root, b"a/e", F).unwrap();
    let old_ino = c.getattr(&old).unwrap().ino;
    m.rename(
        &Cred::root(),
        b"a/b",
        b"a/e",
        dircache_core::RenameMode::Replace,
    )
    .unwrap();
    c.mknod(&r, At::Root, b"a/e/f3", libc::S_IFREG | 0o644, 0)
        .unwrap();
    let now = c.getattr(&old).unwrap();
    assert_ne!(now.ino, old_ino, "the path names the new directory");
    for p in ["a/b", "a/e"] {
        c.apply_change(&Change::Entry {
            path: p.as_bytes().to_vec(),
        });
    }
    assert!(
        old.is_dead(),
        "the replaced directory's dentry survived the report of its replacement"
    );
    let mut names: Vec<String> = c
        .readdir(&r, At::Root, b"a/e")
        .unwrap()
        .into_iter()
        .map(|e| String::from_utf8_lossy(&e.name).into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["f1", "f2", "f3"]);
}
