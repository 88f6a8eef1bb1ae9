//! Batched walks (cache/batch.rs): a cold lookup asks the backend about all the components it
//! knows in advance in one `Backend::walk` (one round trip for a remote backend), on the
//! in-memory backend, whose `walk` counts as one call (`MemoryBackend::calls`). What is
//! cached from a walk must answer exactly as what the component-at-a-time walk caches:
//! negatives, deep negatives, completeness, permission checks per component, mounts.

mod common;

use std::sync::Arc;

use common::{cache_with, resolve, root, user};
use dircache_core::memory::MemoryBackend;
use dircache_core::{
    At, Attr, Backend, Cache, Config, Cred, DirEntry, LookupFlags, MountOptions, MountSource,
    RenameMode, Result, SetAttr,
};

const F: LookupFlags = LookupFlags::FOLLOW;
const DEEP: &str = "a/b/c/d/e/f/g/h";

fn unbatched() -> Config {
    Config {
        walk_batch: false,
        ..Config::default()
    }
}

/// Backend calls a cold lookup of `path` costs, then the calls of looking it up again.
fn cold_and_warm(m: &MemoryBackend, c: &Cache, cr: &dircache_core::Creds, path: &str) -> u64 {
    m.reset_calls();
    let first = resolve(c, cr, At::Root, path, F);
    let cold = m.calls();
    m.reset_calls();
    for _ in 0..2 {
        assert_eq!(resolve(c, cr, At::Root, path, F), first, "{path} again");
    }
    assert_eq!(m.calls(), 0, "{path}: a warm lookup asked the backend");
    cold
}

/// A cold lookup of an 8-component path: one backend call (a walk), against 8 lookups without
/// batching; as root and as an ordinary user (search permission on every directory comes
/// from the attributes the walk returned: no getattr).
#[test]
fn cold_deep_path_is_one_walk() {
    for cfg in [Config::default(), unbatched()] {
        let batched = cfg.walk_batch;
        let (m, c) = cache_with(&[DEEP], cfg);
        let r = root(&c);
        // The root's own attributes, for the permission check on it.
        c.stat(&r, At::Root, b"/", F).expect("stat /");
        assert_eq!(cold_and_warm(&m, &c, &r, DEEP), if batched { 1 } else { 8 });
        assert_eq!(
            c.stats().backend_walk,
            u64::from(batched),
            "one walk counted"
        );
        assert_eq!(resolve(&c, &r, At::Root, DEEP, F), Ok(DEEP.into()));
        // Every prefix was cached, with its attributes.
        m.reset_calls();
        for i in 1..=8 {
            let p = DEEP.split('/').take(i).collect::<Vec<_>>().join("/");
            let a = c.stat(&r, At::Root, p.as_bytes(), F).expect("stat prefix");
            assert_eq!(a.ino, m.getattr(p.as_bytes()).expect("backend").ino, "{p}");
        }
        m.reset_calls();
        let (m2, c2) = cache_with(
            &[DEEP],
            Config {
                ..c.config().clone()
            },
        );
        let u = user(&c2, 1000);
        c2.stat(&u, At::Root, b"/", F).expect("stat /");
        assert_eq!(
            cold_and_warm(&m2, &c2, &u, DEEP),
            if batched { 1 } else { 8 }
        );
    }
}

/// A symlink in the middle: the walk stops there (it does not follow symlinks), the link is
/// read, and the rest (the link's body, then the path's rest) is one more walk.
#[test]
fn symlink_in_the_middle() {
    let spec = ["a/b/l -> x/y", "a/b/x/y/e/f"];
    let (m, c) = cache_with(&spec, Config::default());
    let r = root(&c);
    c.stat(&r, At::Root, b"/", F).expect("stat /");
    assert_eq!(cold_and_warm(&m, &c, &r, "a/b/l/e/f"), 3);
    assert_eq!(
        resolve(&c, &r, At::Root, "a/b/l/e/f", F),
        Ok("a/b/x/y/e/f".into())
    );
    let (m, c) = cache_with(&spec, unbatched());
    let r = root(&c);
    c.stat(&r, At::Root, b"/", F).expect("stat /");
    // a, b, l, readlink, x, y, e, f.
    assert_eq!(cold_and_warm(&m, &c, &r, "a/b/l/e/f"), 8);
    // An absolute body and a final symlink that is not followed.
    let spec = ["a/b/l -> /p/q", "p/q/r/s", "t/u/last -> nowhere"];
    let (m, c) = cache_with(&spec, Config::default());
    let r = root(&c);
    c.stat(&r, At::Root, b"/", F).expect("stat /");
    assert_eq!(cold_and_warm(&m, &c, &r, "a/b/l/r/s"), 3);
    assert_eq!(
        resolve(&c, &r, At::Root, "a/b/l/r/s", F),
        Ok("p/q/r/s".into())
    );
    m.reset_calls();
    assert_eq!(
        resolve(&c, &r, At::Root, "t/u/last", LookupFlags::NOFOLLOW),
        Ok("t/u/last".into())
    );
    assert_eq!(m.calls(), 1, "lstat-like lookup: one walk, no readlink");
    // Followed (dangling): the link's body is read and its target asked about.
    assert_eq!(cold_and_warm(&m, &c, &r, "t/u/last"), 2);
}

/// ENOENT at the 5th component: one walk, and the prefix and the negative are cached (as are
/// deep negatives below it, made by the walk without the backend).
#[test]
fn missing_fifth_component_caches_prefix_and_negative() {
    let (m, c) = cache_with(&["a/b/c/d/other"], Config::default());
    let r = root(&c);
    c.stat(&r, At::Root, b"/", F).expect("stat /");
    m.reset_calls();
    assert_eq!(
        resolve(&c, &r, At::Root, "a/b/c/d/missing/f/g/h", F),
        Err(libc::ENOENT)
    );
    assert_eq!(m.calls(), 1);
    m.reset_calls();
    for p in ["a/b/c/d", "a/b/c/d/missing", "a/b/c/d/missing/f/g/h"] {
        let want = if p == "a/b/c/d" {
            Ok(p.to_string())
        } else {
            Err(libc::ENOENT)
        };
        assert_eq!(resolve(&c, &r, At::Root, p, F), want, "{p}");
        assert_eq!(resolve(&c, &r, At::Root, p, F), want, "{p}");
    }
    assert_eq!(m.calls(), 0, "the prefix or the negative was not cached");
    // The negative is a negative: creating the name makes it resolvable.
    c.mkdir(&r, At::Root, b"a/b/c/d/missing", 0o755).unwrap();
    assert_eq!(
        resolve(&c, &r, At::Root, "a/b/c/d/missing", F),
        Ok("a/b/c/d/missing".into())
    );
    // A file in the middle: ENOTDIR, the walk stops at it, the deep negative is the walk's.
    m.reset_calls();
    assert_eq!(
        resolve(&c, &r, At::Root, "a/b/c/d/other/x/y", F),
        Err(libc::ENOTDIR)
    );
    assert_eq!(m.calls(), 1);
    m.reset_calls();
    assert_eq!(
        resolve(&c, &r, At::Root, "a/b/c/d/other/x/y", F),
        Err(libc::ENOTDIR)
    );
    assert_eq!(m.calls(), 0);
}

/// A directory the caller may not search in the middle: EACCES for the user, before and after
/// anyone cached what lies below it, while root (who may) sees it all; the user's EACCES and
/// root's answers both come from the cache after the first walk.
#[test]
fn permission_denied_in_the_middle() {
    for cfg in [Config::default(), unbatched()] {
        let (m, c) = cache_with(&["a/b/secret/d/e/f"], cfg);
        m.setattr(
            &Cred::root(),
            b"a/b/secret",
            &SetAttr {
                mode: Some(0o700),
                ..SetAttr::default()
            },
        )
        .unwrap();
        let r = root(&c);
        let u = user(&c, 1000);
        c.stat(&u, At::Root, b"/", F).expect("stat /");
        for _ in 0..2 {
            for p in ["a/b/secret/d/e/f", "a/b/secret/d", "a/b/secret/nothing"] {
                assert_eq!(resolve(&c, &u, At::Root, p, F), Err(libc::EACCES), "{p}");
            }
            assert_eq!(
                resolve(&c, &u, At::Root, "a/b/secret", F),
                Ok("a/b/secret".into())
            );
            assert_eq!(
                resolve(&c, &r, At::Root, "a/b/secret/d/e/f", F),
                Ok("a/b/secret/d/e/f".into())
            );
        }
        // Published for root (fast path): still EACCES for the user.
        m.reset_calls();
        assert_eq!(
            resolve(&c, &u, At::Root, "a/b/secret/d/e/f", F),
            Err(libc::EACCES)
        );
        assert_eq!(
            resolve(&c, &r, At::Root, "a/b/secret/d/e/f", F),
            Ok("a/b/secret/d/e/f".into())
        );
        assert_eq!(m.calls(), 0);
    }
}

/// A complete directory (listed) answers a miss itself: no walk below it.
#[test]
fn complete_directory_answers_without_a_walk() {
    let (m, c) = cache_with(&["a/b/x"], Config::default());
    let r = root(&c);
    c.readdir(&r, At::Root, b"a/b").unwrap();
    m.reset_calls();
    assert_eq!(
        resolve(&c, &r, At::Root, "a/b/missing/y/z", F),
        Err(libc::ENOENT)
    );
    assert_eq!(m.calls(), 0, "asked the backend below a complete directory");
}

/// A mount point stops the walk: the components after it are asked of the mounted backend,
/// never of the covered directory's.
#[test]
fn mount_point_stops_the_walk() {
    let (m, c) = cache_with(&["mnt/p/q/covered", "top"], Config::default());
    let b = Arc::new(MemoryBackend::new());
    b.populate(&["p/q/r/s"]);
    let ns = c.namespace().clone();
    c.mount(
        &ns,
        b"/mnt/p",
        MountSource::Backend(b.clone()),
        MountOptions::default(),
    )
    .unwrap();
    let r = root(&c);
    m.reset_calls();
    b.reset_calls();
    assert_eq!(
        resolve(&c, &r, At::Root, "/mnt/p/p/q/r/s", F),
        Ok("p/q/r/s".into())
    );
    assert_eq!(m.calls(), 0, "the covered file system was asked");
    assert_eq!(b.calls(), 1);
    assert_eq!(
        resolve(&c, &r, At::Root, "/mnt/p/q/covered", F),
        Err(libc::ENOENT)
    );
}

/// A backend without its own walk: the trait's default (one lookup per component).
struct LookupsOnly(MemoryBackend);

impl Backend for LookupsOnly {
    fn lookup(&self, dir: &[u8], name: &[u8]) -> Result<Attr> {
        self.0.lookup(dir, name)
    }
    fn getattr(&self, path: &[u8]) -> Result<Attr> {
        self.0.getattr(path)
    }
    fn readdir(&self, path: &[u8], plus: bool) -> Result<Vec<DirEntry>> {
        self.0.readdir(path, plus)
    }
    fn readlink(&self, path: &[u8]) -> Result<Vec<u8>> {
        self.0.readlink(path)
    }
    fn mknod(&self, cred: &Cred, path: &[u8], mode: u32, rdev: u64) -> Result<Attr> {
        self.0.mknod(cred, path, mode, rdev)
    }
    fn mkdir(&self, cred: &Cred, path: &[u8], mode: u32) -> Result<Attr> {
        self.0.mkdir(cred, path, mode)
    }
    fn symlink(&self, cred: &Cred, target: &[u8], path: &[u8]) -> Result<Attr> {
        self.0.symlink(cred, target, path)
    }
    fn link(&self, cred: &Cred, old: &[u8], new: &[u8]) -> Result<Attr> {
        self.0.link(cred, old, new)
    }
    fn unlink(&self, cred: &Cred, path: &[u8]) -> Result<()> {
        self.0.unlink(cred, path)
    }
    fn rmdir(&self, cred: &Cred, path: &[u8]) -> Result<()> {
        self.0.rmdir(cred, path)
    }
    fn rename(&self, cred: &Cred, old: &[u8], new: &[u8], mode: RenameMode) -> Result<()> {
        self.0.rename(cred, old, new, mode)
    }
    fn setattr(&self, cred: &Cred, path: &[u8], set: &SetAttr) -> Result<Attr> {
        self.0.setattr(cred, path, set)
    }
}

/// With the default walk, batching makes exactly the calls the component-at-a-time walk
/// makes: a found path, a missing component, a file in the middle, a symlink in the middle.
#[test]
fn default_walk_makes_no_more_calls() {
    let spec = [DEEP, "a/b/c/file", "a/b/l -> c/d", "x/"];
    let paths = [
        DEEP,
        "a/b/c/d/missing/f/g",
        "a/b/c/file/x/y",
        "a/b/l/e/f/g/h",
        "x/y/z",
    ];
    let mut counts = Vec::new();
    for cfg in [Config::default(), unbatched()] {
        let m = MemoryBackend::new();
        m.populate(&spec);
        let be = Arc::new(LookupsOnly(m));
        let c = Cache::new(be.clone(), cfg).unwrap();
        let r = root(&c);
        c.stat(&r, At::Root, b"/", F).unwrap();
        let mut n = Vec::new();
        for p in paths {
            be.0.reset_calls();
            let _ = resolve(&c, &r, At::Root, p, F);
            n.push(be.0.calls());
        }
        counts.push(n);
    }
    assert_eq!(counts[0], counts[1], "batched vs component at a time");
}
