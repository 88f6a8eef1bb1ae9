//! Backend calls that race mutations through the cache (`Cache::by_path` in `invalidate.rs`).
//!
//! A backend call by path is made without locks: the path is computed from the dentry links,
//! then the backend answers. A rename through the cache that runs in between makes the path
//! name another object, so the answer is about the wrong file. These tests put that rename
//! exactly there, deterministically: a wrapping backend runs a mutation on another thread
//! *inside* the backend call of the thread under test (before or after the inner backend
//! answers) and waits for it to finish.
//!
//! * `*_once`: one rename races the call: the answer and what is cached must be those of the
//!   object the dentry names (a retry).
//! * `*_always`: every optimistic try races a rename: the answer must still be right (the
//!   fallback takes `tree_lock`, which renames take exclusively, so the racing rename waits;
//!   the wrapper sees the lock held and does not fire, as a real rename would block there).
//!   With a bounded retry loop that then returns its last answer unchecked, this fails.
//! * `unrelated_window_does_not_retry`: a chmod of an unrelated directory (an invalidation
//!   window, no rename) during the call must not make the cache ask again.
//! * `rename_seq_is_odd_around_the_backend_rename`: the write side of the rename sequence
//!   count covers the backend's rename (where backend paths start to differ from the links).
//! * `outside_attr_change_during_lookup_caches_nothing_stale`: a chmod behind the cache's back,
//!   reported with `apply_change(Change::Attr)` while a lookup of that (uncached) name is
//!   between the backend's answer and inserting it: the older answer must not be cached.
//! * `walk_races_rename_*` (cache/batch.rs, docs/core.md I12): `a` and `b` swapped through the
//!   cache (by a thread that looks them up before and after) during (before or after the inner backend
//!   answers) the one backend walk of a cold lookup of `a/s/t/f`: no dentry may hold another file's inode, and the lookup's answer
//!   is the file its path names.
//! * `outside_attr_change_during_walk_caches_nothing_stale`: as the lookup one above, for a
//!   batched walk whose older answer covers several components.
//! * `setattr_during_getattr_caches_nothing_stale`: a chmod of the same file through the cache
//!   lands between the backend's getattr answer and the cache storing it: the older answer
//!   must not overwrite the newer attributes.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::ThreadId;

use parking_lot::Mutex;

use super::invalidate::OPTIMISTIC_TRIES;
use crate::memory::MemoryBackend;
use crate::{
    At, Attr, Backend, Cache, Change, Config, Cred, DirEntry, LookupFlags, RenameMode, Result,
    SetAttr, Walked,
};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Op {
    Lookup,
    Getattr,
    Readlink,
    Readdir,
    Rename,
    Walk,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum When {
    /// The mutation runs before the inner backend answers (the answer sees it).
    Before,
    /// The mutation runs after the inner backend answered (the answer predates it).
    After,
}

type Race = Box<dyn Fn(&Arc<Cache>) + Send + Sync>;

struct Armed {
    thread: ThreadId,
    op: Op,
    when: When,
    left: u32,
    race: Arc<Race>,
}

/// A memory backend that runs a mutation through the cache, on another thread, inside the
/// armed call of the armed thread.
struct Racing {
    inner: MemoryBackend,
    armed: Mutex<Option<Armed>>,
    /// How often the mutation ran.
    fired: AtomicU32,
    /// How often the armed call was made by the armed thread (raced or not).
    calls: AtomicU32,
    cache: OnceLock<Weak<Cache>>,
    /// An inode number the backend calls provisional (0: none; `Backend::provisional`).
    provisional: AtomicU64,
}

impl Racing {
    fn maybe(&self, op: Op, when: When) {
        let Some(cache) = self.cache.get().and_then(Weak::upgrade) else {
            return;
        };
        let race = {
            let mut a = self.armed.lock();
            match &mut *a {
                Some(a) if a.thread == std::thread::current().id() && a.op == op => {
                    if when == When::Before {
                        self.calls.fetch_add(1, Ordering::SeqCst);
                    }
                    // Holding `tree_lock` excludes renames: a rename started now would wait.
                    let excluded = op != Op::Rename && cache.tree_lock.is_locked();
                    if a.when != when || a.left == 0 || excluded {
                        return;
                    }
                    a.left -= 1;
                    a.race.clone()
                }
                _ => return,
            }
        };
        self.fired.fetch_add(1, Ordering::SeqCst);
        let c = cache.clone();
        std::thread::scope(|s| {
            s.spawn(move || race(&c))
                .join()
                .expect("racing mutation panicked");
        });
    }
}

impl Backend for Racing {
    fn lookup(&self, dir: &[u8], name: &[u8]) -> Result<Attr> {
        self.maybe(Op::Lookup, When::Before);
        let r = self.inner.lookup(dir, name);
        self.maybe(Op::Lookup, When::After);
        r
    }
    fn walk(&self, dir: &[u8], names: &[&[u8]]) -> Walked {
        self.maybe(Op::Walk, When::Before);
        let r = self.inner.walk(dir, names);
        self.maybe(Op::Walk, When::After);
        r
    }
    fn getattr(&self, path: &[u8]) -> Result<Attr> {
        self.maybe(Op::Getattr, When::Before);
        let r = self.inner.getattr(path);
        self.maybe(Op::Getattr, When::After);
        r
    }
    fn readdir(&self, path: &[u8], plus: bool) -> Result<Vec<DirEntry>> {
        self.maybe(Op::Readdir, When::Before);
        let r = self.inner.readdir(path, plus);
        self.maybe(Op::Readdir, When::After);
        r
    }
    fn readlink(&self, path: &[u8]) -> Result<Vec<u8>> {
        self.maybe(Op::Readlink, When::Before);
        let r = self.inner.readlink(path);
        self.maybe(Op::Readlink, When::After);
        r
    }
    fn mknod(&self, cred: &Cred, path: &[u8], mode: u32, rdev: u64) -> Result<Attr> {
        self.inner.mknod(cred, path, mode, rdev)
    }
    fn mkdir(&self, cred: &Cred, path: &[u8], mode: u32) -> Result<Attr> {
        self.inner.mkdir(cred, path, mode)
    }
    fn symlink(&self, cred: &Cred, target: &[u8], path: &[u8]) -> Result<Attr> {
        self.inner.symlink(cred, target, path)
    }
    fn link(&self, cred: &Cred, old: &[u8], new: &[u8]) -> Result<Attr> {
        self.inner.link(cred, old, new)
    }
    fn unlink(&self, cred: &Cred, path: &[u8]) -> Result<()> {
        self.inner.unlink(cred, path)
    }
    fn rmdir(&self, cred: &Cred, path: &[u8]) -> Result<()> {
        self.inner.rmdir(cred, path)
    }
    fn rename(&self, cred: &Cred, old: &[u8], new: &[u8], mode: RenameMode) -> Result<()> {
        self.maybe(Op::Rename, When::Before);
        let r = self.inner.rename(cred, old, new, mode);
        self.maybe(Op::Rename, When::After);
        r
    }
    fn setattr(&self, cred: &Cred, path: &[u8], set: &SetAttr) -> Result<Attr> {
        self.inner.setattr(cred, path, set)
    }
    fn provisional(&self, _dev: u64, ino: u64) -> bool {
        ino != 0 && ino == self.provisional.load(Ordering::SeqCst)
    }
}

/// `a` and `b` with distinguishable contents, and an unrelated directory `u`.
fn setup() -> (Arc<Racing>, Arc<Cache>) {
    setup_with(&[
        "a/f",
        "a/l -> ta",
        "a/onlya",
        "b/f",
        "b/l -> tb",
        "b/onlyb",
        "u/",
    ])
}

fn setup_with(spec: &[&str]) -> (Arc<Racing>, Arc<Cache>) {
    let inner = MemoryBackend::new();
    inner.populate(spec);
    let be = Arc::new(Racing {
        inner,
        armed: Mutex::new(None),
        fired: AtomicU32::new(0),
        calls: AtomicU32::new(0),
        cache: OnceLock::new(),
        provisional: AtomicU64::new(0),
    });
    let cache = Cache::new(be.clone(), Config::default()).expect("cache");
    assert!(be.cache.set(Arc::downgrade(&cache)).is_ok());
    (be, cache)
}

fn arm(be: &Racing, op: Op, when: When, left: u32, race: Race) {
    be.fired.store(0, Ordering::SeqCst);
    be.calls.store(0, Ordering::SeqCst);
    *be.armed.lock() = Some(Armed {
        thread: std::thread::current().id(),
        op,
        when,
        left,
        race: Arc::new(race),
    });
}

fn disarm(be: &Racing) {
    *be.armed.lock() = None;
}

/// Swap `a` and `b` (RENAME_EXCHANGE through the cache).
fn swap() -> Race {
    Box::new(|c: &Arc<Cache>| {
        let root = c.credentials(Cred::root());
        c.rename(&root, At::Root, b"a", b"b", RenameMode::Exchange)
            .expect("exchange a and b");
    })
}

/// What the backend holds at `path` now.
fn truth(be: &Racing, path: &[u8]) -> Attr {
    be.inner.getattr(path).expect("backend getattr")
}

/// The racing rename ran: once, or on every optimistic try and then never again (the last
/// try holds `tree_lock`).
fn check_fired(be: &Racing, times: u32) {
    let fired = be.fired.load(Ordering::SeqCst);
    if times == ONCE {
        assert_eq!(fired, 1, "the rename never raced");
    } else {
        assert_eq!(
            fired, OPTIMISTIC_TRIES,
            "not the optimistic tries, then the lock"
        );
    }
}

/// Every optimistic try races (more than any bounded retry loop makes), or just the first.
const ALWAYS: u32 = 1000;
const ONCE: u32 = 1;

fn lookup_races_rename(times: u32) {
    let (be, cache) = setup();
    let root = cache.credentials(Cred::root());
    let a = cache
        .lookup(&root, At::Root, b"a", LookupFlags::FOLLOW)
        .expect("a");
    let want = truth(&be, b"a/f").ino;
    arm(&be, Op::Lookup, When::Before, times, swap());
    let f = cache.lookup_child(&root, &a, b"f");
    disarm(&be);
    check_fired(&be, times);
    let f = f.expect("a's f");
    let got = f.cached_attr().map(|x| x.ino);
    assert_eq!(
        got,
        Some(want),
        "the dentry of the moved a/f got another file's inode"
    );
    // What is cached now is what the backend holds where `a`'s dentry now is.
    let again = cache.lookup_child(&root, &a, b"f").expect("f again");
    let now = cache.node_path(&again).expect("path");
    assert_eq!(
        cache.getattr(&again).expect("attr").ino,
        truth(&be, &now).ino
    );
}

#[test]
fn lookup_races_rename_once() {
    lookup_races_rename(ONCE);
}

#[test]
fn lookup_races_rename_always() {
    lookup_races_rename(ALWAYS);
}

fn getattr_races_rename(times: u32) {
    let (be, cache) = setup();
    let root = cache.credentials(Cred::root());
    let a = cache
        .lookup(&root, At::Root, b"a", LookupFlags::FOLLOW)
        .expect("a");
    // A plain listing caches the children without attributes.
    cache.readdir_node(&root, &a, false).expect("list a");
    let f = cache.lookup_child(&root, &a, b"f").expect("f");
    assert!(
        f.cached_attr().is_none(),
        "setup: f must have no attributes"
    );
    let want = truth(&be, b"a/f").ino;
    arm(&be, Op::Getattr, When::Before, times, swap());
    let got = cache.getattr(&f);
    disarm(&be);
    check_fired(&be, times);
    assert_eq!(
        got.expect("getattr").ino,
        want,
        "getattr answered for another file"
    );
    if let Some(c) = f.cached_attr() {
        assert_eq!(c.ino, want, "another file's attributes were cached");
    }
}

#[test]
fn getattr_races_rename_once() {
    getattr_races_rename(ONCE);
}

#[test]
fn getattr_races_rename_always() {
    getattr_races_rename(ALWAYS);
}

fn readlink_races_rename(times: u32) {
    let (be, cache) = setup();
    let root = cache.credentials(Cred::root());
    let a = cache
        .lookup(&root, At::Root, b"a", LookupFlags::FOLLOW)
        .expect("a");
    cache.readdir_node(&root, &a, false).expect("list a");
    let l = cache.lookup_child(&root, &a, b"l").expect("l");
    arm(&be, Op::Readlink, When::Before, times, swap());
    let got = cache.readlink_node(&l);
    disarm(&be);
    check_fired(&be, times);
    assert_eq!(got.expect("readlink"), b"ta", "readlink answered for b/l");
    assert_eq!(
        cache.readlink_node(&l).expect("cached"),
        b"ta",
        "b/l's target was cached on a/l"
    );
}

#[test]
fn readlink_races_rename_once() {
    readlink_races_rename(ONCE);
}

#[test]
fn readlink_races_rename_always() {
    readlink_races_rename(ALWAYS);
}

fn readdir_races_rename(times: u32) {
    let (be, cache) = setup();
    let root = cache.credentials(Cred::root());
    let a = cache
        .lookup(&root, At::Root, b"a", LookupFlags::FOLLOW)
        .expect("a");
    arm(&be, Op::Readdir, When::Before, times, swap());
    let got = cache.readdir_node(&root, &a, false);
    disarm(&be);
    check_fired(&be, times);
    let names = |v: Vec<DirEntry>| {
        let mut n: Vec<Vec<u8>> = v.into_iter().map(|e| e.name).collect();
        n.sort();
        n
    };
    let want = vec![b"f".to_vec(), b"l".to_vec(), b"onlya".to_vec()];
    assert_eq!(names(got.expect("readdir")), want, "listed b instead of a");
    let cached = cache.readdir_node(&root, &a, false).expect("again");
    assert_eq!(names(cached), want, "b's listing was cached for a");
}

#[test]
fn readdir_races_rename_once() {
    readdir_races_rename(ONCE);
}

#[test]
fn readdir_races_rename_always() {
    readdir_races_rename(ALWAYS);
}

/// Only a rename makes a path-based answer wrong: an invalidation window for anything else
/// (here a chmod of an unrelated directory) must not make the cache ask the backend again.
#[test]
fn unrelated_window_does_not_retry() {
    let (be, cache) = setup();
    let root = cache.credentials(Cred::root());
    let a = cache
        .lookup(&root, At::Root, b"a", LookupFlags::FOLLOW)
        .expect("a");
    let u = cache
        .lookup(&root, At::Root, b"u", LookupFlags::FOLLOW)
        .expect("u");
    let chmod_u: Race = Box::new(move |c: &Arc<Cache>| {
        let root = c.credentials(Cred::root());
        let set = SetAttr {
            mode: Some(0o700),
            ..SetAttr::default()
        };
        c.setattr_node(&root, &u, &set).expect("chmod u");
    });
    arm(&be, Op::Lookup, When::Before, ALWAYS, chmod_u);
    let f = cache.lookup_child(&root, &a, b"f");
    disarm(&be);
    assert!(f.is_ok());
    assert_eq!(
        be.calls.load(Ordering::SeqCst),
        1,
        "the backend was asked again although no rename raced the lookup"
    );
}

/// A chmod through the cache between the backend's getattr answer and the cache storing it:
/// the older answer may be returned (it was true during the call) but must not be cached over
/// the chmod's newer attributes.
#[test]
fn setattr_during_getattr_caches_nothing_stale() {
    let (be, cache) = setup();
    let root = cache.credentials(Cred::root());
    let a = cache
        .lookup(&root, At::Root, b"a", LookupFlags::FOLLOW)
        .expect("a");
    cache.readdir_node(&root, &a, false).expect("list a");
    let f = cache.lookup_child(&root, &a, b"f").expect("f");
    assert!(
        f.cached_attr().is_none(),
        "setup: f must have no attributes"
    );
    let f2 = f.clone();
    let chmod_f: Race = Box::new(move |c: &Arc<Cache>| {
        let root = c.credentials(Cred::root());
        let set = SetAttr {
            mode: Some(0o600),
            ..SetAttr::default()
        };
        c.setattr_node(&root, &f2, &set).expect("chmod f");
    });
    arm(&be, Op::Getattr, When::After, ONCE, chmod_f);
    let got = cache.getattr(&f).expect("getattr");
    disarm(&be);
    assert_eq!(be.fired.load(Ordering::SeqCst), 1, "the chmod never raced");
    assert_eq!(
        got.mode & 0o7777,
        0o644,
        "setup: the answer predates the chmod"
    );
    assert_eq!(truth(&be, b"a/f").mode & 0o7777, 0o600);
    assert_eq!(
        cache.getattr(&f).expect("getattr").mode & 0o7777,
        0o600,
        "the pre-chmod attributes were cached over the chmod's"
    );
}

/// From before the backend renames until after it did, `rename_seq` is odd: a backend call by
/// path overlapping any part of it is asked again. (Moving `rename_begin` after the backend
/// call, or dropping it before the links are updated, leaves a gap in which a lookup computes
/// a path from the old links and gets the answer for the new occupant of that path.)
#[test]
fn rename_seq_is_odd_around_the_backend_rename() {
    for when in [When::Before, When::After] {
        let (be, cache) = setup();
        let seen = Arc::new(AtomicU32::new(u32::MAX));
        let s2 = seen.clone();
        let probe: Race = Box::new(move |c: &Arc<Cache>| {
            s2.store(
                (c.rename_seq.load(Ordering::SeqCst) & 1) as u32,
                Ordering::SeqCst,
            );
        });
        let before = cache.rename_seq.load(Ordering::SeqCst);
        arm(&be, Op::Rename, when, ONCE, probe);
        swap()(&cache);
        disarm(&be);
        assert_eq!(be.fired.load(Ordering::SeqCst), 1, "the probe never ran");
        assert_eq!(
            seen.load(Ordering::SeqCst),
            1,
            "rename_seq even {when:?} the backend rename"
        );
        let after = cache.rename_seq.load(Ordering::SeqCst);
        assert_eq!(
            after,
            before + 2,
            "rename_seq not even again after the rename"
        );
    }
}

/// A chmod made behind the cache's back and reported (`Change::Attr`) while a lookup of the
/// same, not yet cached, name holds the backend's older answer: once `apply_change` returned,
/// the cache must not serve the older mode (docs/core.md, "What the cache promises").
#[test]
fn outside_attr_change_during_lookup_caches_nothing_stale() {
    let (be, cache) = setup();
    let root = cache.credentials(Cred::root());
    let a = cache
        .lookup(&root, At::Root, b"a", LookupFlags::FOLLOW)
        .expect("a");
    let weak = Arc::downgrade(&be);
    let chmod_outside: Race = Box::new(move |c: &Arc<Cache>| {
        let be = weak.upgrade().expect("backend");
        let set = SetAttr {
            mode: Some(0o600),
            ..SetAttr::default()
        };
        be.inner
            .setattr(&Cred::root(), b"a/f", &set)
            .expect("chmod behind the cache");
        c.apply_change(&Change::Attr {
            path: b"a/f".to_vec(),
        });
    });
    arm(&be, Op::Lookup, When::After, ONCE, chmod_outside);
    let first = cache.lookup_child(&root, &a, b"f").expect("f");
    disarm(&be);
    assert_eq!(be.fired.load(Ordering::SeqCst), 1, "the chmod never raced");
    // The older answer was refused (the report changed `a` meanwhile) and the lookup asked
    // again: it answers with the mode after the chmod already.
    assert_eq!(
        first.cached_attr().map(|x| x.mode & 0o7777),
        Some(0o600),
        "the lookup's own answer predates the reported chmod"
    );
    let again = cache.lookup_child(&root, &a, b"f").expect("f again");
    assert_eq!(
        cache.getattr(&again).expect("getattr").mode & 0o7777,
        0o600,
        "the mode from before the reported chmod is still cached"
    );
}

/// Every cached name under `a` and `b` names what the backend holds there.
fn check_tree(be: &Racing, cache: &Cache) {
    let root = cache.credentials(Cred::root());
    for top in ["a", "b"] {
        for rest in ["", "/s", "/s/t", "/s/t/f", "/s/t/only"] {
            let p = format!("{top}{rest}");
            let Ok(n) = cache.lookup(&root, At::Root, p.as_bytes(), LookupFlags::NOFOLLOW) else {
                assert!(be.inner.getattr(p.as_bytes()).is_err(), "{p} went missing");
                continue;
            };
            let got = cache.getattr(&n).expect("getattr").ino;
            assert_eq!(
                got,
                truth(be, p.as_bytes()).ino,
                "{p}: another file's inode"
            );
        }
    }
}

fn walk_races_rename(when: When, times: u32, cold_top: bool) {
    let (be, cache) = setup_with(&["a/s/t/f", "a/s/t/onlya", "b/s/t/f", "b/s/t/onlyb"]);
    let root = cache.credentials(Cred::root());
    if !cold_top {
        // The walk then starts below `a`, whose dentry the rename moves.
        cache
            .lookup(&root, At::Root, b"a", LookupFlags::FOLLOW)
            .expect("a");
    }
    // Another thread looks `a` and `b` up (caching their dentries), swaps them and looks them
    // up again: the walk's answer for `a/...` must not be cached below the dentry now named
    // `a` (which the walk finds cached when it inserts what it learned).
    let race: Race = Box::new(|c: &Arc<Cache>| {
        let root = c.credentials(Cred::root());
        for p in [&b"a"[..], b"b"] {
            c.lookup(&root, At::Root, p, LookupFlags::FOLLOW)
                .expect("look a and b up");
        }
        swap()(c);
        for p in [&b"a"[..], b"b"] {
            c.lookup(&root, At::Root, p, LookupFlags::FOLLOW)
                .expect("look a and b up again");
        }
    });
    arm(&be, Op::Walk, when, times, race);
    let got = cache.lookup(&root, At::Root, b"a/s/t/f", LookupFlags::NOFOLLOW);
    disarm(&be);
    if times == ONCE || when == When::Before {
        check_fired(&be, times);
    } else {
        // After the answer: the walk is not asked again, so it races once.
        assert_eq!(be.fired.load(Ordering::SeqCst), 1, "the rename never raced");
    }
    match got {
        Ok(n) => {
            let path = cache.node_path(&n).expect("path");
            assert_eq!(
                cache.getattr(&n).expect("getattr").ino,
                truth(&be, &path).ino,
                "the lookup answered another file"
            );
        }
        // Racing a rename of an ancestor, a lookup may find the name gone (as before
        // batching: a dentry the rename moved is not cached from an older answer).
        Err(e) => assert_eq!(e, crate::Error::NotFound),
    }
    check_tree(&be, &cache);
    let s = cache
        .lookup(&root, At::Root, b"a/s/t/onlyb", LookupFlags::NOFOLLOW)
        .expect("a holds b's old contents");
    assert_eq!(
        cache.getattr(&s).expect("attr").ino,
        truth(&be, b"a/s/t/onlyb").ino
    );
}

#[test]
fn walk_races_rename_after_answer() {
    walk_races_rename(When::After, ONCE, true);
}

#[test]
fn walk_races_rename_after_answer_below_cached_dir() {
    walk_races_rename(When::After, ONCE, false);
}

#[test]
fn walk_races_rename_before_answer_once() {
    walk_races_rename(When::Before, ONCE, true);
    walk_races_rename(When::Before, ONCE, false);
}

#[test]
fn walk_races_rename_before_answer_always() {
    walk_races_rename(When::Before, ALWAYS, false);
}

/// A chmod behind the cache's back, reported (`Change::Attr`) while the walk of a cold lookup
/// of `a/s/t/f` holds the backend's older answer: reporting it caches `a`, `s` and `t` (the
/// report resolves the directory through the cache) and finds `f` absent; the walk's older
/// answer for `f` must not be cached below the `t` it finds there (cache/batch.rs, I12).
#[test]
fn outside_attr_change_during_walk_caches_nothing_stale() {
    let (be, cache) = setup_with(&["a/s/t/f"]);
    let root = cache.credentials(Cred::root());
    let weak = Arc::downgrade(&be);
    let chmod_outside: Race = Box::new(move |c: &Arc<Cache>| {
        let be = weak.upgrade().expect("backend");
        let set = SetAttr {
            mode: Some(0o600),
            ..SetAttr::default()
        };
        be.inner
            .setattr(&Cred::root(), b"a/s/t/f", &set)
            .expect("chmod behind the cache");
        c.apply_change(&Change::Attr {
            path: b"a/s/t/f".to_vec(),
        });
    });
    arm(&be, Op::Walk, When::After, ONCE, chmod_outside);
    let first = cache.lookup(&root, At::Root, b"a/s/t/f", LookupFlags::NOFOLLOW);
    disarm(&be);
    assert_eq!(be.fired.load(Ordering::SeqCst), 1, "the chmod never raced");
    first.expect("a/s/t/f");
    let again = cache
        .lookup(&root, At::Root, b"a/s/t/f", LookupFlags::NOFOLLOW)
        .expect("a/s/t/f again");
    assert_eq!(
        cache.getattr(&again).expect("getattr").mode & 0o7777,
        0o600,
        "the mode from before the reported chmod is still cached"
    );
}

/// A file created behind the cache's back is looked up while the change feed's report of a
/// create in the same directory (of that very name, or of a sibling) arrives between the
/// backend's answer and inserting it. The answer is not cached (the directory changed
/// meanwhile), but the name exists and was never removed: the dentry the lookup returns must
/// be live and give its attributes. A dead one makes the FUSE front end answer the kernel's
/// LOOKUP with ENOENT (`attr_of_name` of a dead dentry), the flaky ENOENT of
/// `coherence::src_removed_while_mounted_gives_errors_not_hangs` and the xattr tests.
#[test]
fn outside_create_reported_during_lookup_gives_a_live_positive() {
    for reported in ["g", "sibling"] {
        let (be, cache) = setup_with(&["a/f"]);
        let root = cache.credentials(Cred::root());
        let a = cache
            .lookup(&root, At::Root, b"a", LookupFlags::FOLLOW)
            .expect("a");
        // Created outside before the lookup is made.
        be.inner
            .mknod(&Cred::root(), b"a/g", libc::S_IFREG | 0o644, 0)
            .expect("create a/g behind the cache");
        let weak = Arc::downgrade(&be);
        let path = format!("a/{reported}").into_bytes();
        let report: Race = Box::new(move |c: &Arc<Cache>| {
            let be = weak.upgrade().expect("backend");
            if path != b"a/g" {
                be.inner
                    .mknod(&Cred::root(), &path, libc::S_IFREG | 0o644, 0)
                    .expect("create the sibling behind the cache");
            }
            c.apply_change(&Change::Entry { path: path.clone() });
        });
        arm(&be, Op::Lookup, When::After, ONCE, report);
        let g = cache.lookup_child(&root, &a, b"g");
        disarm(&be);
        assert_eq!(be.fired.load(Ordering::SeqCst), 1, "the report never raced");
        let g = g.expect("a/g exists");
        assert_eq!(
            cache.attr_of_name(&g).map(|x| x.ino),
            Ok(truth(&be, b"a/g").ino),
            "{reported}: attributes of the name just looked up"
        );
        assert!(
            !g.is_dead(),
            "{reported}: the lookup returned a dead dentry"
        );
    }
}

/// A held inode found again by its name (`Cache::held_node`: here a provisional identity,
/// as after a reintegration) whose dentry dies while its attributes are asked: the
/// reconnection's `Overflow` kills every dentry, and the remote backend holds the question
/// until the new connection is installed. The held inode must come back live, not as the
/// dentry that died (its next call then answered ENOENT for a file that exists:
/// `remote_offline::inodes_made_while_cut_off_stay_usable_after_the_reintegration`).
#[test]
fn held_node_found_again_while_an_overflow_kills_it_is_live() {
    let (be, cache) = setup_with(&["d/f"]);
    let root = cache.credentials(Cred::root());
    let d = cache
        .lookup(&root, At::Root, b"d", LookupFlags::FOLLOW)
        .expect("d");
    let f = cache.lookup_child(&root, &d, b"f").expect("d/f");
    let (ad, af) = (cache.getattr(&d).expect("d"), cache.getattr(&f).expect("f"));
    let held_root = cache.hold_root();
    let held_d = cache.hold(&d, &ad, Some(&held_root));
    let held_f = cache.hold(&f, &af, Some(&held_d));
    // f's number is provisional: found again by its name, whose attributes the core
    // forgot (the backend is asked).
    be.provisional.store(af.ino, Ordering::SeqCst);
    cache.forget_attr(&f);
    let overflow: Race = Box::new(|c: &Arc<Cache>| {
        c.apply_change(&Change::Overflow);
    });
    arm(&be, Op::Getattr, When::After, ONCE, overflow);
    let n = cache.held_node(&held_f);
    disarm(&be);
    assert_eq!(
        be.fired.load(Ordering::SeqCst),
        1,
        "the overflow never raced"
    );
    let n = n.expect("held_node");
    assert!(!n.is_dead(), "held_node handed back a dentry that died");
    assert_eq!(
        cache.getattr(&n).map(|a| a.ino),
        Ok(truth(&be, b"d/f").ino),
        "attributes of the held file"
    );
}

/// A held file whose dentry is found live (`Cache::held_node`) and killed before its
/// attributes are read (the `Overflow` of a reconnection, or of a change feed, applied in
/// between): the GETATTR still answers with the file's attributes, not ENOENT. The front end
/// made the two steps as two calls; `Cache::held_attr` finds the inode again.
#[test]
fn held_attr_answers_for_a_dentry_killed_between_finding_and_reading() {
    let (be, cache) = setup_with(&["d/f"]);
    let root = cache.credentials(Cred::root());
    let d = cache
        .lookup(&root, At::Root, b"d", LookupFlags::FOLLOW)
        .expect("d");
    let f = cache.lookup_child(&root, &d, b"f").expect("d/f");
    let (ad, af) = (cache.getattr(&d).expect("d"), cache.getattr(&f).expect("f"));
    let held_root = cache.hold_root();
    let held_d = cache.hold(&d, &ad, Some(&held_root));
    let held_f = cache.hold(&f, &af, Some(&held_d));
    for (what, held, want) in [
        ("file", &held_f, b"d/f" as &[u8]),
        ("directory", &held_d, b"d"),
    ] {
        let c = cache.clone();
        super::held::between_hook::set(move || {
            c.apply_change(&Change::Overflow);
        });
        let (n, r) = cache.held_attr(held);
        let a = r.unwrap_or_else(|e| panic!("{what}: GETATTR across an Overflow: {e:?}"));
        assert_eq!(
            (a.ino, a.nlink),
            (truth(&be, want).ino, truth(&be, want).nlink),
            "{what}"
        );
        assert!(!n.is_dead(), "{what}: a dead dentry handed back");
    }
}
