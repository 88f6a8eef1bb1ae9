//! The server answers through the core cache (crates/remote/src/cached.rs): a repeated walk
//! costs no backend call, and a change made natively on the server's tree after the server
//! cached it reaches the client fresh, with a callback, the change applied to the server's
//! cache before the client hears of it.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dircache_core::{Backend, Change, Cred, Error, StatsSnapshot};
use dircache_local::LocalBackend;
use dircache_remote::{serve, CachedBackend, RemoteBackend, ServerConfig};

fn me() -> Cred {
    Cred::new(
        rustix::process::geteuid().as_raw(),
        rustix::process::getegid().as_raw(),
        [],
    )
}

/// A server over the cached backend on `root`, a client on a socket pair, and the cache.
fn start(root: &std::path::Path) -> (Arc<CachedBackend>, RemoteBackend) {
    let local: Arc<dyn Backend> = Arc::new(LocalBackend::new(root).expect("backend"));
    let cached = CachedBackend::new(local, Default::default(), me()).expect("cached");
    assert!(cached.is_coherent(), "the local backend has a change feed");
    let (a, b) = UnixStream::pair().expect("socketpair");
    let r = b.try_clone().expect("clone");
    let backend: Arc<dyn Backend> = cached.clone();
    // The server thread ends when the client (the RemoteBackend) is dropped.
    std::thread::spawn(move || serve(backend, r, b, ServerConfig::default()));
    // No bulk subtree prefetching by the client: these tests are about the server's cache,
    // and a client's bulk fetch (after two misses in a directory) lists directories on the
    // server, which counts backend readdirs there and moves directory atimes.
    let cfg = dircache_remote::ClientConfig {
        prefetch: 0,
        ..Default::default()
    };
    let client = RemoteBackend::connect_with(Box::new(a), &cfg).expect("connect");
    (cached, client)
}

fn backend_calls(s: &StatsSnapshot) -> u64 {
    s.backend_lookup
        + s.backend_walk
        + s.backend_getattr
        + s.backend_readdir
        + s.backend_readlink
        + s.backend_mutation
}

const DEEP: [&[u8]; 8] = [b"a", b"b", b"c", b"d", b"e", b"f", b"g", b"file"];

#[test]
fn a_second_identical_walk_is_answered_from_the_servers_cache() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("a/b/c/d/e/f/g")).unwrap();
    std::fs::write(root.join("a/b/c/d/e/f/g/file"), b"12345").unwrap();
    let (cached, r) = start(root);

    let first = r.walk(b"", &DEEP);
    assert_eq!((first.attrs.len(), first.error), (8, None));
    assert_eq!(first.attrs[7].size, 5);
    let missing = r.walk(b"a/b", &[b"c", b"d", b"nope", b"x"]);
    assert_eq!(
        (missing.attrs.len(), missing.error),
        (2, Some(Error::NotFound))
    );
    let cold = cached.stats();
    assert!(
        backend_calls(&cold) > 0,
        "the first walks asked the backend"
    );

    let second = r.walk(b"", &DEEP);
    assert_eq!(second, first, "the same answer");
    let again = r.walk(b"a/b", &[b"c", b"d", b"nope", b"x"]);
    assert_eq!(again, missing);
    assert_eq!(r.getattr(b"a/b/c/d/e/f/g/file").unwrap(), first.attrs[7]);
    assert_eq!(r.lookup(b"a/b/c", b"d").unwrap(), first.attrs[3]);
    let warm = cached.stats();
    assert_eq!(
        backend_calls(&warm),
        backend_calls(&cold),
        "repeated walks, getattr and lookup make no backend call: {cold:?} -> {warm:?}"
    );
    assert!(
        warm.fastpath_hits > cold.fastpath_hits,
        "the whole path is one fast-path probe: {cold:?} -> {warm:?}"
    );
}

#[test]
fn mutations_through_the_server_are_seen_by_its_cache() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("d")).unwrap();
    let (cached, r) = start(root);
    let me = me();
    assert!(r.readdir(b"d", true).unwrap().is_empty());
    assert_eq!(r.lookup(b"d", b"n"), Err(Error::NotFound));
    r.mkdir(&me, b"d/n", 0o755).unwrap();
    // At once, not after the change feed: the cache made the change itself.
    assert!(r.lookup(b"d", b"n").unwrap().is_dir());
    assert_eq!(cached.getattr(b"d/n").unwrap().mode & 0o7777, 0o755);
    r.rename(&me, b"d/n", b"d/m", dircache_core::RenameMode::Replace)
        .unwrap();
    assert_eq!(cached.lookup(b"d", b"n"), Err(Error::NotFound));
    assert!(cached.lookup(b"d", b"m").unwrap().is_dir());
    // Data written through a handle: the size the cache gives is the new one.
    let f = r
        .open(&me, b"d/f", libc::O_CREAT | libc::O_RDWR, 0o644)
        .unwrap();
    assert_eq!(cached.getattr(b"d/f").unwrap().size, 0);
    f.write_at(&me, b"abc", 0, false).unwrap();
    assert_eq!(cached.getattr(b"d/f").unwrap().size, 3);
    f.set_size(&me, 10).unwrap();
    assert_eq!(cached.getattr(b"d/f").unwrap().size, 10);
    let names: Vec<Vec<u8>> = cached
        .readdir(b"d", false)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
}

/// Wait (at most 20 s) until the client's feed brings a change naming `path` (an entry
/// change when `entry`; earlier changes of the directory's own attributes, from creations
/// in it, may still be queued).
fn wait_for_kind(feed: &dircache_core::ChangeFeed, path: &[u8], entry: bool) -> Change {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let left = end.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "no callback for {:?}",
            String::from_utf8_lossy(path)
        );
        if let Ok(c) = feed.recv_timeout(left) {
            match &c {
                Change::Entry { path: p } if p == path => return c,
                Change::Attr { path: p } if p == path && !entry => return c,
                Change::Overflow => return c,
                _ => {}
            }
        }
    }
}

fn wait_for(feed: &dircache_core::ChangeFeed, path: &[u8]) -> Change {
    wait_for_kind(feed, path, false)
}

#[test]
fn native_changes_on_the_server_reach_the_client_fresh_with_a_callback() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("a/b")).unwrap();
    std::fs::write(root.join("a/b/f"), b"x").unwrap();
    std::fs::write(root.join("a/b/gone"), b"x").unwrap();
    let (cached, r) = start(root);
    let feed = r.watch().unwrap().expect("callbacks");

    // The server caches all of it: the walk, the file's attributes, the listing, a negative.
    let w = r.walk(b"", &[b"a", b"b", b"f"]);
    assert_eq!(w.attrs.len(), 3);
    assert_eq!(w.attrs[2].mode & 0o7777, 0o644);
    assert_eq!(cached.readdir(b"a/b", false).unwrap().len(), 2);
    assert_eq!(r.lookup(b"a/b", b"new"), Err(Error::NotFound));
    let before = cached.stats();
    assert_eq!(r.walk(b"", &[b"a", b"b", b"f"]), w);
    assert_eq!(
        backend_calls(&cached.stats()),
        backend_calls(&before),
        "cached"
    );

    // Native changes on the server's tree, behind the cache's back.
    std::fs::set_permissions(root.join("a/b/f"), std::fs::Permissions::from_mode(0o600)).unwrap();
    wait_for(&feed, b"a/b/f");
    // The callback came after the server's cache applied the change: the very next answer
    // is fresh.
    let w = r.walk(b"", &[b"a", b"b", b"f"]);
    assert_eq!(w.attrs[2].mode & 0o7777, 0o600, "fresh attributes");
    assert_eq!(r.getattr(b"a/b/f").unwrap().mode & 0o7777, 0o600);

    // Written whole outside the served tree and renamed in: the callback for the name is then
    // about the file with its data. (Written in place, the create's callback could come before
    // the write's, and a lookup between them rightly answered the size the server had seen: 0.)
    let outside = tempfile::tempdir_in(dir.path().parent().unwrap()).unwrap();
    std::fs::write(outside.path().join("new"), b"hello").unwrap();
    std::fs::rename(outside.path().join("new"), root.join("a/b/new")).unwrap();
    wait_for(&feed, b"a/b/new");
    assert_eq!(
        r.lookup(b"a/b", b"new").unwrap().size,
        5,
        "the negative is gone"
    );

    std::fs::remove_file(root.join("a/b/gone")).unwrap();
    wait_for(&feed, b"a/b/gone");
    assert_eq!(r.lookup(b"a/b", b"gone"), Err(Error::NotFound));
    let mut names: Vec<Vec<u8>> = cached
        .readdir(b"a/b", false)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    names.sort();
    assert_eq!(names, vec![b"f".to_vec(), b"new".to_vec()]);

    // A directory replaced natively: the walk below it is fresh too.
    // The rename's own callback names `a/b` too (the directory moved away): wait for it and
    // for the feed to go quiet before the new directory is made, so that the callback waited
    // for next is the creation's (CI dry run: the walk answered before the creation applied).
    std::fs::rename(root.join("a/b"), root.join("a/old")).unwrap();
    wait_for_kind(&feed, b"a/b", true);
    while feed.recv_timeout(Duration::from_millis(300)).is_ok() {}
    std::fs::create_dir(root.join("a/b")).unwrap();
    wait_for_kind(&feed, b"a/b", true);
    let w = r.walk(b"", &[b"a", b"b", b"f"]);
    assert_eq!(
        (w.attrs.len(), w.error),
        (2, Some(Error::NotFound)),
        "{w:?}"
    );
}

#[test]
fn the_servers_cache_stays_within_max_entries_and_answers_right() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for d in 0..30 {
        let p = root.join(format!("d{d:02}"));
        std::fs::create_dir(&p).unwrap();
        for f in 0..100 {
            std::fs::write(p.join(format!("f{f:03}")), vec![b'x'; f]).unwrap();
        }
    }
    let local: Arc<dyn Backend> = Arc::new(LocalBackend::new(root).expect("backend"));
    let config = dircache_core::Config {
        max_entries: 1024,
        ..Default::default()
    };
    let cached = CachedBackend::new(local, config, me()).expect("cached");
    for round in 0..2 {
        for d in 0..30 {
            let dname = format!("d{d:02}");
            assert_eq!(cached.readdir(dname.as_bytes(), true).unwrap().len(), 100);
            for f in (0..100).step_by(7) {
                let fname = format!("f{f:03}");
                let w = cached.walk(b"", &[dname.as_bytes(), fname.as_bytes()]);
                assert_eq!((w.attrs.len(), w.error), (2, None), "round {round}");
                assert_eq!(w.attrs[1].size, f as u64);
            }
        }
        let s = cached.stats();
        assert!(s.entries <= 1024 + 128, "bounded: {s:?}");
        assert!(s.evictions > 0, "{s:?}");
    }
}
