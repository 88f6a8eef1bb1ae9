//! Streamed bulk subtree calls (crates/remote/src/client/bulk.rs, server/subtree.rs): a cold
//! walk after `prefetch_root` costs one round trip in all; listings come whole (also a
//! directory split over several frames); what the server reads in parallel is exactly its
//! tree; a change on the server after a bulk fetch is seen. Real server (the core cache over
//! the local backend, as `dircache serve` runs) over a unix socket pair, round trips counted
//! by the client.

use std::collections::BTreeMap;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dircache_core::{Backend, Change, FileType};
use dircache_local::LocalBackend;
use dircache_remote::prefetch::join;
use dircache_remote::{serve, ClientConfig, RemoteBackend, ServerConfig};

mod common;
use common::{listings, me, wait_for_bulk};

struct Server(Option<std::thread::JoinHandle<()>>);

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            let _ = t.join();
        }
    }
}

/// A server over `root` and a client of it (the client must be dropped before the server).
fn client(root: &std::path::Path, cfg: &ClientConfig) -> (Server, RemoteBackend) {
    let local: Arc<dyn Backend> = Arc::new(LocalBackend::new(root).expect("backend"));
    let backend =
        dircache_remote::CachedBackend::new(local, Default::default(), me()).expect("cache");
    let (a, b) = UnixStream::pair().expect("socketpair");
    let r = b.try_clone().expect("clone");
    let t = std::thread::spawn(move || {
        let _ = serve(backend, r, b, ServerConfig::default());
    });
    let c = RemoteBackend::connect_with(Box::new(a), cfg).expect("connect");
    (Server(Some(t)), c)
}

/// 12 directories of 4 subdirectories of 20 files, one directory of 5,000 files (more than
/// one frame holds), empty directories, a symlink.
fn tree(root: &std::path::Path) -> usize {
    let mut n = 0;
    for a in 0..12 {
        for b in 0..4 {
            let d = root.join(format!("m{a:02}/p{b}"));
            std::fs::create_dir_all(&d).unwrap();
            for f in 0..20 {
                std::fs::write(d.join(format!("f{f:02}.c")), vec![b'x'; f]).unwrap();
            }
            n += 21;
        }
        n += 1;
    }
    std::fs::create_dir_all(root.join("big")).unwrap();
    for f in 0..5000 {
        std::fs::write(root.join(format!("big/e{f:05}")), b"").unwrap();
    }
    for e in ["empty", "m00/empty", "big2"] {
        std::fs::create_dir(root.join(e)).unwrap();
    }
    std::os::unix::fs::symlink("m00/p0/f01.c", root.join("link")).unwrap();
    n + 1 + 5000 + 3 + 1
}

/// Every listing of the tree, depth first as `find` lists: path -> sorted (name, kind, size).
type Listings = BTreeMap<Vec<u8>, Vec<(Vec<u8>, FileType, u64)>>;

fn walk(b: &dyn Backend) -> Listings {
    listings(b, b"", |e| {
        let size = match e.kind {
            FileType::Directory => 0,
            _ => e.attr.map_or(u64::MAX, |a| a.size),
        };
        (e.name, e.kind, size)
    })
}

#[test]
fn a_cold_walk_after_prefetch_root_costs_one_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let entries = tree(dir.path());
    let local = LocalBackend::new(dir.path()).unwrap();
    let want = walk(&local);
    assert_eq!(want.values().map(Vec::len).sum::<usize>(), entries);

    // Before: the first listing's bulk call starts with a small budget, doubled per call.
    let (s1, r) = client(dir.path(), &ClientConfig::default());
    let before = r.round_trips();
    assert_eq!(walk(&r), want);
    let without = r.round_trips() - before;
    drop(r);
    drop(s1);

    let (s2, r) = client(dir.path(), &ClientConfig::default());
    let before = r.round_trips();
    assert!(r.prefetch_root());
    // Lookups start at once, while the reply streams in (as `git status` stats what its index
    // names), then a walk lists every directory: all answered by that one call.
    assert_eq!(
        r.getattr(b"m03/p2/f07.c").unwrap().size,
        7,
        "getattr from the buffer"
    );
    for (d, l) in &want {
        for (name, _, size) in l {
            let a = r.lookup(d, name).unwrap();
            if !a.is_dir() {
                assert_eq!(a.size, *size);
            }
        }
    }
    assert_eq!(walk(&r), want);
    let with = r.round_trips() - before;
    assert_eq!(
        with, 1,
        "one streamed bulk call for the whole walk ({without} without prefetch_root)"
    );
    assert!(without > 1, "{without}");
    drop(r);
    drop(s2);
}

/// A directory's listing split over frames is held back until it is whole, and `bare`
/// (no extended attributes) holds for every piece: `ls -l` of a 5,000-entry directory asks
/// each entry for its ACL without a round trip. (The old collecting code dropped the later
/// pieces' `bare` flags: 4,999 round trips.)
#[test]
fn acl_questions_about_a_directory_bigger_than_a_frame_need_no_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    tree(dir.path());
    let (s, r) = client(dir.path(), &ClientConfig::default());
    let names: Vec<Vec<u8>> = r
        .readdir(b"big", true)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names.len(), 5000, "whole");
    let before = r.round_trips();
    for n in &names {
        let p = join(b"big", n);
        let t = dircache_core::XattrTarget {
            path: &p,
            expect: None,
            birth: 0,
            open: None,
        };
        assert_eq!(
            r.getxattr(&me(), t, b"system.posix_acl_access"),
            Err(dircache_core::Error::Os(libc::ENODATA))
        );
    }
    assert_eq!(r.round_trips() - before, 0);
    drop(r);
    drop(s);
}

/// The server's parallel walk returns exactly the tree: every directory once, each listing
/// whole and equal to the local backend's; a budget cuts whole directories only.
#[test]
fn the_servers_parallel_walk_is_the_tree() {
    let dir = tempfile::tempdir().unwrap();
    let entries = tree(dir.path());
    let local = LocalBackend::new(dir.path()).unwrap();
    let want = walk(&local);
    let (s, r) = client(dir.path(), &ClientConfig::default());
    let (dirs, complete) = r.subtree(b"", 1 << 20).unwrap();
    assert!(complete);
    let mut got: Listings = BTreeMap::new();
    for d in dirs {
        let mut l: Vec<_> = d
            .entries
            .into_iter()
            .map(|e| {
                let size = match e.kind {
                    FileType::Directory => 0,
                    _ => e.attr.map_or(u64::MAX, |a| a.size),
                };
                (e.name, e.kind, size)
            })
            .collect();
        l.sort_by(|a, b| a.0.cmp(&b.0));
        assert!(got.insert(d.dir, l).is_none(), "a directory came twice");
    }
    assert_eq!(got, want);
    // Cut short: whole listings only, at most the budget below the root.
    let (dirs, complete) = r.subtree(b"", 3000).unwrap();
    assert!(!complete);
    let below: usize = dirs
        .iter()
        .filter(|d| !d.dir.is_empty())
        .map(|d| d.entries.len())
        .sum();
    assert!(below <= 3000 && below < entries);
    for d in &dirs {
        assert_eq!(d.entries.len(), want[&d.dir].len(), "{:?} not whole", d.dir);
    }
    drop(r);
    drop(s);
}

/// Coherence: after the whole tree came in bulk, changes made on the server (a write, a new
/// file, a removal deep in the tree) are seen once their callbacks arrived.
#[test]
fn a_change_on_the_server_after_a_bulk_fetch_is_seen() {
    let dir = tempfile::tempdir().unwrap();
    tree(dir.path());
    let (s, r) = client(dir.path(), &ClientConfig::default());
    let feed = r.watch().unwrap().expect("callbacks");
    assert!(r.prefetch_root());
    wait_for_bulk(&r);
    assert!(r.prefetched_entries() > 5000);
    assert_eq!(r.lookup(b"m05/p1", b"f03.c").unwrap().size, 3);
    let root = dir.path();
    std::fs::write(root.join("m05/p1/f03.c"), b"changed on the server").unwrap();
    std::fs::write(root.join("m07/p3/new.c"), b"n").unwrap();
    std::fs::remove_file(root.join("m09/p0/f00.c")).unwrap();
    // Wait for the three callbacks. An `Inode` callback is an ordinary one (the feed reports
    // a file's inode-only events so, e.g. after the truncation: it drops the listings naming
    // that inode): waiting stops only when all three paths were named, or a while after an
    // `Overflow` (the server's feed lost events: their paths may never be named, but the
    // Overflow, read after them, made the server and the buffer forget everything).
    // Before, the first `Inode` callback ended the wait: the assertions below then ran before
    // the server had been told of the write or of new.c (stale size 0; new.c NotFound from
    // the buffer's listing of m07/p3, which the server's callback had not yet dropped).
    let mut seen = [false; 3];
    let mut broken = false;
    let mut end = Instant::now() + Duration::from_secs(30);
    while !seen.iter().all(|s| *s) {
        let left = end.saturating_duration_since(Instant::now());
        match feed.recv_timeout(left) {
            Ok(Change::Attr { path }) | Ok(Change::Entry { path }) => {
                for (i, p) in ["m05/p1/f03.c", "m07/p3/new.c", "m09/p0/f00.c"]
                    .iter()
                    .enumerate()
                {
                    seen[i] |= path == p.as_bytes();
                }
            }
            Ok(Change::Inode { .. }) => {}
            Ok(Change::Overflow) => {
                if !broken {
                    end = end.min(Instant::now() + Duration::from_secs(5));
                }
                broken = true;
            }
            Err(_) if broken => break,
            Err(e) => panic!("callbacks missing ({seen:?}): {e}"),
        }
    }
    // The three changes were made in this order, and the feed reports (and the server applies,
    // then forwards) in the order the kernel queued them: once the removal of f00.c was
    // reported, so was the write into f03.c (its own event, or the truncation's one still
    // queued, which it joined), and the server's cache forgot any size it held from between
    // the truncation and the write.
    assert_eq!(
        r.lookup(b"m05/p1", b"f03.c").unwrap().size,
        21,
        "stale size after a bulk fetch"
    );
    assert_eq!(r.getattr(b"m07/p3/new.c").unwrap().size, 1);
    assert!(
        r.lookup(b"m09/p0", b"f00.c").is_err(),
        "removed file still there"
    );
    let names: Vec<Vec<u8>> = r
        .readdir(b"m07/p3", true)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert!(names.contains(&b"new.c".to_vec()), "stale listing");
    // Untouched listings still come from the buffer, unless the server broke every promise
    // (its feed overflowed: as root it watches the whole file system, and other jobs'
    // writes count; CI once saw that) and the buffer had to go with them.
    let before = r.round_trips();
    assert_eq!(r.lookup(b"m11/p2", b"f19.c").unwrap().size, 19);
    while let Ok(c) = feed.try_recv() {
        broken |= matches!(c, Change::Overflow);
    }
    if broken {
        eprintln!("the server's feed overflowed: the buffer was dropped");
    } else {
        assert_eq!(
            r.round_trips() - before,
            0,
            "an untouched listing was fetched again"
        );
    }
    drop(r);
    drop(s);
}

/// A wide first level (`WIDE` directories of 10 files) and a chain `zz/d1/.../d5` below it,
/// each link with one file: breadth first, the chain's listings come after the whole first
/// level.
const WIDE: usize = 2000;
const CHAIN: [&str; 6] = [
    "zz",
    "zz/d1",
    "zz/d1/d2",
    "zz/d1/d2/d3",
    "zz/d1/d2/d3/d4",
    "zz/d1/d2/d3/d4/d5",
];

fn wide_tree(root: &std::path::Path) {
    for a in 0..WIDE {
        let d = root.join(format!("w{a:04}"));
        std::fs::create_dir(&d).unwrap();
        for f in 0..10 {
            std::fs::write(d.join(format!("f{f}")), b"").unwrap();
        }
    }
    for c in CHAIN {
        std::fs::create_dir(root.join(c)).unwrap();
        std::fs::write(root.join(c).join("file"), b"x").unwrap();
    }
}

/// Early answers: a depth-first walker waiting for a deep directory of the mount's bulk call
/// hurries it (`ClientMsg::Hurry`), and the server reads the way down to it before the rest of
/// its breadth-first pass, so the walker goes down the chain while most of the tree is still
/// to come (before: the chain came after the whole first level, at the end of the stream).
#[test]
fn a_waiting_walker_is_answered_before_the_pass_ends() {
    let dir = tempfile::tempdir().unwrap();
    wide_tree(dir.path());
    let (s, r) = client(dir.path(), &ClientConfig::default());
    assert!(r.prefetch_root());
    let before = r.round_trips();
    for c in CHAIN {
        let names: Vec<Vec<u8>> = r
            .readdir(c.as_bytes(), true)
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert!(names.contains(&b"file".to_vec()), "{c}: {names:?}");
    }
    let at_chain_end = r.bulk_waits();
    eprintln!("at chain end: {at_chain_end:?}");
    wait_for_bulk(&r);
    let total = r.bulk_waits();
    assert_eq!(r.round_trips() - before, 0, "all from the bulk call");
    assert_eq!(total.stored as usize, WIDE + CHAIN.len() + 1, "{total:?}");
    assert!(at_chain_end.hurries >= 1, "{at_chain_end:?}");
    assert!(at_chain_end.early >= 1, "{at_chain_end:?}");
    assert!(
        at_chain_end.stored < total.stored / 2,
        "the chain's last listing came only after {} of {} listings",
        at_chain_end.stored,
        total.stored
    );
    drop(r);
    drop(s);
}

/// Coherence of early answers: a file made on the server in a directory of the chain while
/// the bulk call is in flight (its callback received before the walker gets there) is in the
/// listing the walker gets; a change after a listing was answered early is seen too.
#[test]
fn a_change_during_a_bulk_fetch_is_not_served_stale_by_an_early_answer() {
    let dir = tempfile::tempdir().unwrap();
    wide_tree(dir.path());
    let root = dir.path();
    let (s, r) = client(root, &ClientConfig::default());
    let feed = r.watch().unwrap().expect("callbacks");
    assert!(r.prefetch_root());
    // The first links answered early (hurried), while the pass goes on.
    assert!(r.readdir(b"zz", true).is_ok());
    let d1 = r.readdir(b"zz/d1", true).unwrap();
    assert_eq!(
        d1.iter()
            .find(|e| e.name == b"file")
            .and_then(|e| e.attr)
            .map(|a| a.size),
        Some(1)
    );
    std::fs::write(root.join("zz/d1/d2/d3/new"), b"made on the server").unwrap();
    std::fs::write(root.join("zz/d1/file"), b"longer now").unwrap();
    let mut seen = [false; 2];
    let end = Instant::now() + Duration::from_secs(30);
    while !seen.iter().all(|s| *s) {
        let left = end.saturating_duration_since(Instant::now());
        match feed.recv_timeout(left) {
            Ok(Change::Attr { path }) | Ok(Change::Entry { path }) => {
                seen[0] |= path == b"zz/d1/d2/d3/new";
                seen[1] |= path == b"zz/d1/file";
            }
            Ok(_) => {}
            Err(e) => panic!("callbacks missing ({seen:?}): {e}"),
        }
    }
    for c in &CHAIN[1..] {
        let l = r.readdir(c.as_bytes(), true).unwrap();
        let size = |n: &[u8]| {
            l.iter()
                .find(|e| e.name == n)
                .and_then(|e| e.attr)
                .map(|a| a.size)
        };
        assert_eq!(
            size(b"file"),
            Some(if *c == "zz/d1" { 10 } else { 1 }),
            "{c}"
        );
        assert_eq!(
            size(b"new").is_some(),
            *c == "zz/d1/d2/d3",
            "{c}: stale listing"
        );
    }
    assert_eq!(r.lookup(b"zz/d1", b"file").unwrap().size, 10);
    wait_for_bulk(&r);
    drop(r);
    drop(s);
}

/// A listing handed over while a bulk call is in flight is not "coming" any more: a second
/// caller that wants it (a lookup in that directory racing the walker's readdir, as FUSE
/// requests do) does not wait for the rest of the call (before: it waited for the whole pass,
/// as cold `find`s on a mount did, 0.24-0.27 s each on a 36k-entry tree).
#[test]
fn a_listing_handed_over_is_not_waited_for_again() {
    let dir = tempfile::tempdir().unwrap();
    wide_tree(dir.path());
    let (s, r) = client(dir.path(), &ClientConfig::default());
    assert!(r.prefetch_root());
    assert!(r.readdir(b"zz", true).is_ok());
    let before = r.bulk_waits();
    assert!(r.bulk_in_flight(), "the pass is still running");
    // Not held (handed over), and the call will not bring it again: asked at once.
    assert_eq!(r.lookup(b"zz", b"file").unwrap().size, 1);
    let after = r.bulk_waits();
    assert_eq!(
        after.waits, before.waits,
        "waited for a listing handed over: {after:?}"
    );
    wait_for_bulk(&r);
    drop(r);
    drop(s);
}
