//! `Config::symlink_aliases` (SOSP'15 §4.2): on, a path through a symlink is published in the
//! direct-lookup table and its second lookup is a fast-path hit; off, it always takes the slow
//! path (with the same answer), while the link itself (lstat) is still published.

use std::sync::Arc;

use dircache_core::memory::MemoryBackend;
use dircache_core::{At, Cache, Config, Cred, LookupFlags};

fn cache(aliases: bool) -> Arc<Cache> {
    let be = MemoryBackend::new();
    be.populate(&["x/y/z", "x/l -> y"]);
    let config = Config {
        symlink_aliases: aliases,
        ..Config::default()
    };
    Cache::new(Arc::new(be), config).expect("cache")
}

/// Look `path` up twice; returns whether the second lookup was a fast-path hit, and checks
/// that both gave the dentry of `x/y/z` or the same dentry.
fn second_is_fast(c: &Cache, path: &[u8], flags: LookupFlags) -> bool {
    let cred = c.credentials(Cred::new(1000, 1000, vec![]));
    let first = c
        .lookup(&cred, At::Root, path, flags)
        .expect("first lookup");
    let before = c.stats().fastpath_hits;
    let second = c
        .lookup(&cred, At::Root, path, flags)
        .expect("second lookup");
    assert!(Arc::ptr_eq(&first, &second), "the two lookups disagree");
    c.stats().fastpath_hits > before
}

#[test]
fn aliases_on_take_the_fast_path() {
    let c = cache(true);
    assert!(second_is_fast(&c, b"/x/l/z", LookupFlags::FOLLOW));
    assert!(second_is_fast(&c, b"/x/l", LookupFlags::FOLLOW));
}

#[test]
fn aliases_off_take_the_slow_path() {
    let c = cache(false);
    let root = c.credentials(Cred::root());
    let target = c
        .lookup(&root, At::Root, b"/x/y/z", LookupFlags::FOLLOW)
        .expect("x/y/z");
    let cred = c.credentials(Cred::new(1000, 1000, vec![]));
    let via = c
        .lookup(&cred, At::Root, b"/x/l/z", LookupFlags::FOLLOW)
        .expect("x/l/z");
    assert!(Arc::ptr_eq(&target, &via), "x/l/z is not x/y/z");
    assert!(!second_is_fast(&c, b"/x/l/z", LookupFlags::FOLLOW));
    assert!(!second_is_fast(&c, b"/x/l", LookupFlags::FOLLOW));
    // The link itself is not an alias.
    assert!(second_is_fast(&c, b"/x/l", LookupFlags::NOFOLLOW));
}
