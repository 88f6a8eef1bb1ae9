//! Names first (feature `NAMES`, docs/protocol.md): a bulk subtree call sends each
//! directory's names before the server has statted its entries, so a walk that needs names
//! only (`find -name`: listings without attributes) is answered while the statx are still
//! to come. The server here is the real one (the core cache over the local backend, as
//! `dircache serve` runs) over a unix socket pair, with its file system's per-entry statx
//! held back by a gate until the test opens it: every listing with attributes waits.

use std::collections::BTreeMap;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dircache_core::{
    Attr, Backend, BackendFile, Change, ChangeFeed, Cred, DirEntry, Error, FileType, RenameMode,
    Result, SetAttr, StatFs, Walked, XattrTarget,
};
use dircache_local::LocalBackend;
use dircache_remote::proto::features;
use dircache_remote::{serve, ClientConfig, RemoteBackend, ServerConfig};
use parking_lot::{Condvar, Mutex};

mod common;
use common::{listings, me, wait_for_bulk};

/// A gate: closed, listings with attributes wait; open, they go on.
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    cv: Condvar,
}

impl Gate {
    fn open(&self) {
        *self.open.lock() = true;
        self.cv.notify_all();
    }

    fn wait(&self) {
        let mut o = self.open.lock();
        // Bounded: a test that fails must not hang the server.
        let end = Instant::now() + Duration::from_secs(60);
        while !*o && Instant::now() < end {
            self.cv.wait_for(&mut o, Duration::from_millis(100));
        }
    }
}

/// Opens the gate when the test ends, also on failure (the server's walkers then finish).
struct Opener(Arc<Gate>);

impl Drop for Opener {
    fn drop(&mut self) {
        self.0.open();
    }
}

/// The local backend with its listings with attributes (getdents and a statx per entry)
/// held back by a gate: a server whose statx are slow.
struct Gated {
    inner: LocalBackend,
    gate: Arc<Gate>,
}

impl Backend for Gated {
    fn lookup(&self, dir: &[u8], name: &[u8]) -> Result<Attr> {
        self.inner.lookup(dir, name)
    }
    fn walk(&self, dir: &[u8], names: &[&[u8]]) -> Walked {
        self.inner.walk(dir, names)
    }
    fn getattr(&self, path: &[u8]) -> Result<Attr> {
        self.inner.getattr(path)
    }
    fn readdir(&self, path: &[u8], plus: bool) -> Result<Vec<DirEntry>> {
        if plus {
            self.gate.wait();
        }
        self.inner.readdir(path, plus)
    }
    fn readlink(&self, path: &[u8]) -> Result<Vec<u8>> {
        self.inner.readlink(path)
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
        self.inner.rename(cred, old, new, mode)
    }
    fn setattr(&self, cred: &Cred, path: &[u8], set: &SetAttr) -> Result<Attr> {
        self.inner.setattr(cred, path, set)
    }
    fn statfs(&self, path: &[u8]) -> Result<StatFs> {
        self.inner.statfs(path)
    }
    fn open(
        &self,
        cred: &Cred,
        path: &[u8],
        flags: i32,
        mode: u32,
    ) -> Result<Box<dyn BackendFile>> {
        self.inner.open(cred, path, flags, mode)
    }
    fn open_verified(
        &self,
        cred: &Cred,
        target: XattrTarget<'_>,
        flags: i32,
    ) -> Result<Box<dyn BackendFile>> {
        self.inner.open_verified(cred, target, flags)
    }
    fn getxattr(&self, cred: &Cred, target: XattrTarget<'_>, name: &[u8]) -> Result<Vec<u8>> {
        self.inner.getxattr(cred, target, name)
    }
    fn listxattr(&self, cred: &Cred, target: XattrTarget<'_>) -> Result<Vec<u8>> {
        self.inner.listxattr(cred, target)
    }
    fn watch(&self) -> Result<Option<ChangeFeed>> {
        self.inner.watch()
    }
    fn changed(&self, change: &Change) {
        self.inner.changed(change)
    }
}

struct Server(Option<std::thread::JoinHandle<()>>);

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            let _ = t.join();
        }
    }
}

/// A server over `root` whose statx wait for `gate`, offering `features`, and a client of
/// it (the client must be dropped before the server).
fn client(root: &std::path::Path, gate: &Arc<Gate>, features: u64) -> (Server, RemoteBackend) {
    let local: Arc<dyn Backend> = Arc::new(Gated {
        inner: LocalBackend::new(root).expect("backend"),
        gate: gate.clone(),
    });
    let backend =
        dircache_remote::CachedBackend::new(local, Default::default(), me()).expect("cache");
    let (a, b) = UnixStream::pair().expect("socketpair");
    let r = b.try_clone().expect("clone");
    let cfg = ServerConfig {
        features,
        ..ServerConfig::default()
    };
    let t = std::thread::spawn(move || {
        let _ = serve(backend, r, b, cfg);
    });
    let c = RemoteBackend::connect_with(Box::new(a), &ClientConfig::default()).expect("connect");
    (Server(Some(t)), c)
}

/// 30 directories of 3 subdirectories of 10 files, an empty directory, a symlink.
fn tree(root: &std::path::Path) {
    for a in 0..30 {
        for b in 0..3 {
            let d = root.join(format!("m{a:02}/p{b}"));
            std::fs::create_dir_all(&d).unwrap();
            for f in 0..10 {
                std::fs::write(d.join(format!("f{f:02}.c")), vec![b'x'; f]).unwrap();
            }
        }
    }
    std::fs::create_dir(root.join("empty")).unwrap();
    std::os::unix::fs::symlink("m00/p0/f01.c", root.join("link")).unwrap();
}

/// Path -> sorted (name, kind, a number).
type Listings = BTreeMap<Vec<u8>, Vec<(Vec<u8>, FileType, u64)>>;

/// Every listing without attributes (as `find` lists), depth first: path -> sorted (name,
/// kind, inode number).
fn names_walk(b: &dyn Backend) -> Listings {
    let mut out = BTreeMap::new();
    let mut stack = vec![Vec::new()];
    while let Some(d) = stack.pop() {
        let mut l: Vec<_> = b
            .readdir(&d, false)
            .unwrap()
            .into_iter()
            .map(|e| {
                if e.kind == FileType::Directory {
                    stack.push(dircache_remote::prefetch::join(&d, &e.name));
                }
                (e.name, e.kind, e.ino)
            })
            .collect();
        l.sort_by(|a, b| a.0.cmp(&b.0));
        out.insert(d, l);
    }
    out
}

/// Full listings: path -> sorted (name, kind, size of non-directories).
fn full_walk(b: &dyn Backend) -> Listings {
    listings(b, b"", |e| {
        let size = match e.kind {
            FileType::Directory => 0,
            _ => e.attr.map_or(u64::MAX, |a| a.size),
        };
        (e.name, e.kind, size)
    })
    .into_iter()
    .map(|(k, mut v)| {
        v.sort_by(|a, b| a.0.cmp(&b.0));
        (k, v)
    })
    .collect()
}

/// Run `f` on a thread; its result within `secs`, or `None`.
fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = crossbeam_channel::bounded(1);
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs)).ok()
}

/// The names of the whole tree are answered while no statx of the server has run (the
/// gate is closed): every listing without attributes equals the native one (names, types,
/// inode numbers), subdirectories and missing names are looked up, all from the one bulk
/// call. Once the gate opens, lookups of files and listings with attributes are answered by
/// the same call, equal to native. Before names first, the first listing waited for the
/// gated statx (then, after 15 s, asked the server itself).
#[test]
fn names_are_answered_before_the_server_stats_any_entry() {
    let dir = tempfile::tempdir().unwrap();
    tree(dir.path());
    let native = LocalBackend::new(dir.path()).unwrap();
    let (want_names, want_full) = (names_walk(&native), full_walk(&native));
    let gate = Arc::new(Gate::default());
    let (s, r) = client(dir.path(), &gate, features::ALL);
    // Dropped before `s` (whose drop joins the server): a failing test opens the gate first.
    let _opener = Opener(gate.clone());
    assert_ne!(r.features() & features::NAMES, 0);
    let r = Arc::new(r);
    let before = r.round_trips();
    assert!(r.prefetch_root());
    let r2 = r.clone();
    let got = within(10, move || {
        let names = names_walk(&*r2);
        let sub = r2.lookup(b"m07", b"p2").map(|a| a.is_dir());
        let missing = r2.lookup(b"m07/p2", b"nothing-here");
        (names, sub, missing)
    })
    .expect("names not answered within 10 s while the server's statx were held back");
    assert_eq!(got.0, want_names);
    assert_eq!(got.1, Ok(true));
    assert_eq!(got.2, Err(Error::NotFound));
    // The bulk call alone. A directory of subdirectories only (`m07`) may have its full
    // listing sent before the walk lists it (the server answers it from the statx its
    // names made, past the gate); that listing, handed to the walk, must stay for the
    // lookup of `m07/p2` as names handed over do (before: taken away, then one `Lookup`
    // call, in about 1 run in 4).
    assert_eq!(r.round_trips() - before, 1, "the bulk call alone");
    gate.open();
    assert_eq!(r.lookup(b"m12/p1", b"f07.c").unwrap().size, 7);
    // Every listing with attributes from the same call (before: one `Readdir` call for
    // each directory of subdirectories whose full listing came before its names were
    // listed, 11 of 30 in most runs).
    assert_eq!(full_walk(&*r), want_full);
    assert_eq!(
        r.round_trips() - before,
        1,
        "the bulk call alone, also for the walk with attributes"
    );
    wait_for_bulk(&r);
    drop(r);
    drop(s);
}

/// Callbacks during a names-first stream: changes made on the server while the statx are
/// held back (a new file, a removal, a new directory), before or after the names of their
/// directories were handed over, are all shown: by the listings without attributes and by
/// the full listings once the gate opens, each equal to native at the end.
#[test]
fn changes_during_a_names_first_stream_are_shown() {
    let dir = tempfile::tempdir().unwrap();
    tree(dir.path());
    let root = dir.path().to_path_buf();
    let gate = Arc::new(Gate::default());
    let (s, r) = client(&root, &gate, features::ALL);
    // Dropped before `s` (whose drop joins the server): a failing test opens the gate first.
    let _opener = Opener(gate.clone());
    let feed = r.watch().unwrap().expect("callbacks");
    let r = Arc::new(r);
    assert!(r.prefetch_root());
    // Names handed over before the change.
    let r2 = r.clone();
    let early = within(10, move || r2.readdir(b"m03/p0", false).map(|l| l.len()))
        .expect("names not answered within 10 s while the server's statx were held back");
    assert_eq!(early, Ok(10));
    std::fs::write(root.join("m03/p0/new"), b"made on the server").unwrap();
    std::fs::write(root.join("m05/p1/new"), b"made on the server").unwrap();
    std::fs::remove_file(root.join("m06/p2/f03.c")).unwrap();
    std::fs::create_dir(root.join("m08/fresh")).unwrap();
    let mut seen = [false; 4];
    let end = Instant::now() + Duration::from_secs(30);
    while !seen.iter().all(|s| *s) {
        let left = end.saturating_duration_since(Instant::now());
        match feed.recv_timeout(left) {
            Ok(Change::Attr { path }) | Ok(Change::Entry { path }) => {
                seen[0] |= path == b"m03/p0/new";
                seen[1] |= path == b"m05/p1/new";
                seen[2] |= path == b"m06/p2/f03.c";
                seen[3] |= path == b"m08/fresh";
            }
            Ok(_) => {}
            Err(e) => panic!("callbacks missing ({seen:?}): {e}"),
        }
    }
    let native = LocalBackend::new(&root).unwrap();
    let want_names = names_walk(&native);
    // Every listing without attributes is current (`m03/p0`, handed over before its
    // change, is asked again).
    let r2 = r.clone();
    let got = within(10, move || names_walk(&*r2))
        .expect("names not answered within 10 s while the server's statx were held back");
    assert_eq!(got, want_names);
    gate.open();
    assert_eq!(full_walk(&*r), full_walk(&native));
    assert_eq!(r.lookup(b"m03/p0", b"new").unwrap().size, 18);
    assert_eq!(r.lookup(b"m06/p2", b"f03.c"), Err(Error::NotFound));
    wait_for_bulk(&r);
    drop(r);
    drop(s);
}

/// A server without names first (an older peer, or one that does not offer it) still serves
/// a cold walk in one bulk call, equal to native; and so does a names-first server to a
/// walk that wants attributes only.
#[test]
fn walks_without_names_first_are_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    tree(dir.path());
    let native = LocalBackend::new(dir.path()).unwrap();
    let want = full_walk(&native);
    for offer in [features::ALL & !features::NAMES, features::ALL] {
        let gate = Arc::new(Gate::default());
        gate.open();
        let (s, r) = client(dir.path(), &gate, offer);
        assert_eq!(r.features() & features::NAMES, offer & features::NAMES);
        let before = r.round_trips();
        assert!(r.prefetch_root());
        assert_eq!(full_walk(&r), want);
        assert_eq!(r.round_trips() - before, 1, "one bulk call ({offer:#x})");
        wait_for_bulk(&r);
        drop(r);
        drop(s);
    }
}
