//! Disconnected operation ("Coda on a remote mount", step 3; docs/remote.md, "Disconnected
//! operation").
//!
//! With it on (the default of a reconnecting client, `-o disconnected=off` turns it off), a
//! lost connection does not break the callback promises at once: the client is *disconnected*
//! and serves what it cached, as Coda's Venus does during a disconnection:
//!
//! - the core cache keeps its listings (complete ones stay complete), attributes, negative
//!   entries and symlink targets, and the kernel keeps its entries: `stat`, `readdir` and
//!   lookups of what was cached are answered without the server, at local speed;
//! - a container that was *valid* when the connection was lost (its callback still held: no
//!   callback about it had arrived) stays valid while disconnected: a read-only open by
//!   credentials the server had granted a read-only open of it since its callback was last
//!   broken (the container's memo) is served from it. Nobody is granted more than the server
//!   granted the same credentials; other opens are not answered;
//! - anything else needs the server: the call waits for the reconnection at most
//!   [`Disconnected::grace`] and then fails with ETIMEDOUT (Coda's answer to a miss while
//!   disconnected), never the whole `reconnect_timeout`; once a new connection is made and
//!   the log is being replayed on it, it waits for the connection instead, while the replay
//!   makes progress (the server is reachable: its answer, not ETIMEDOUT);
//! - a reconnector thread starts ssh again with backoff (50 ms doubling to 2 s) for as long
//!   as the mount lives. On success, before any call is sent on the new connection, the
//!   promises are broken (Coda's revalidation on reconnect): every container becomes invalid
//!   (the next open compares the server's attributes with the recorded ones) and the cache
//!   and the kernel forget everything (`Overflow`, then a barrier through the change feed
//!   that returns once the front end has applied it, so that no answer after the
//!   reconnection comes from before it).
//!
//! With it off (or without reconnecting), a lost connection breaks every promise at once
//! and calls wait for a new connection up to `reconnect_timeout`, then fail with EIO.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use dircache_core::{
    Attr, BackendFile, Cred, DirEntry, Error, RenameMode, Result, SetAttr, TimeSet, Timespec,
    Whence,
};

use super::cml::{Log, Op, Record};
use super::reopen::Link;
use super::{ContainerFile, Containers, RemoteBackend};
use crate::proto::{Reply, Request, WireCred, MAX_IO};

/// The marker of a feed barrier: a [`dircache_core::Change::Inode`] with this device number
/// (no file system has it) and a sequence number as its inode.
pub(super) const BARRIER_DEV: u64 = u64::MAX;

/// Disconnected operation of one client (module docs).
#[derive(Debug)]
pub struct Disconnected {
    /// How long a call that needs the server waits for the reconnection while disconnected.
    pub grace: Duration,
    st: Mutex<St>,
    cv: Condvar,
    /// The last feed barrier sent and the last one the front end applied.
    barrier_sent: AtomicU64,
    barrier_seen: Mutex<u64>,
    barrier_cv: Condvar,
    /// Disconnections so far (for statistics and logs).
    pub disconnections: AtomicU64,
    /// The client modification log (client/cml.rs), opened when there is something to log
    /// (or left from before) and closed (its files removed) when all is reintegrated.
    pub(super) cml: Mutex<Option<Log>>,
    /// Its directory; `None`: mutations need the server.
    log_dir: Option<std::path::PathBuf>,
    /// What the client knows beyond the core cache, for while disconnected.
    known: Mutex<Known>,
    /// Conflicts found reintegrating, and records reintegrated.
    pub conflicts: AtomicU64,
    pub reintegrated: AtomicU64,
    /// Calls that waited for the reconnection while disconnected (client/reopen.rs,
    /// `Link::wait_for_reconnector`).
    pub offline_waits: AtomicU64,
}

/// What the backend remembers for disconnected operation (the core cache forgets attributes
/// after mutations and closes; these answer for them while disconnected).
#[derive(Debug, Default)]
struct Known {
    /// The last attributes of every directory the backend handed out, and of everything made
    /// or changed while disconnected.
    attrs: HashMap<Vec<u8>, Attr>,
    /// Symbolic links made while disconnected.
    links: HashMap<Vec<u8>, Vec<u8>>,
    /// Directories made while disconnected (their listings are what `attrs` holds below).
    new_dirs: HashSet<Vec<u8>>,
    /// Files changed while disconnected: the server's version they were changed from
    /// (`None`: made while disconnected), the base of conflict detection.
    bases: HashMap<Vec<u8>, Option<Attr>>,
    next_ino: u64,
}

#[derive(Debug, Default)]
struct St {
    /// The connection is lost and no new one is installed yet.
    offline: bool,
    /// A loss the reconnector has not taken up yet.
    lost: bool,
    /// The mount is ending: no more reconnecting.
    stopped: bool,
    /// A reconnection attempt failed since the loss: misses fail at once.
    unreachable: bool,
    /// A new connection is being installed after its reintegration (the promises broken,
    /// the front end applying the `Overflow`): nothing is answered from what was known while
    /// disconnected any more, and calls that need the server wait for the connection.
    installing: bool,
    /// A new connection is made and the log is being replayed on it (before `installing`):
    /// the server is reachable, so calls that need it wait for the connection while the
    /// replay makes progress (what is cached is still answered from the cache).
    replaying: bool,
    since: Option<Instant>,
}

impl Disconnected {
    /// Disconnected operation on, calls needing the server waiting at most `grace` while the
    /// server cannot be reached.
    pub fn new(grace: Duration) -> Arc<Disconnected> {
        Self::with_log(grace, None)
    }

    /// [`Disconnected::new`] with a client modification log in directory `dir`
    /// (client/cml.rs): mutations while disconnected are applied locally and logged. A log
    /// left there by an earlier mount is opened at once (reintegrated on the first
    /// connection).
    pub fn with_log(grace: Duration, dir: Option<std::path::PathBuf>) -> Arc<Disconnected> {
        let log = dir
            .as_ref()
            .filter(|d| d.join("log").exists())
            .and_then(|d| match Log::open(d) {
                Ok(l) if l.pending().is_empty() => {
                    // Nothing left to reintegrate: not held (another mount of the tree may
                    // need it).
                    l.remove_files();
                    None
                }
                Ok(l) => Some(l),
                Err(e) => {
                    tracing::error!("modification log {}: {e}", d.display());
                    None
                }
            });
        Arc::new(Disconnected {
            cml: Mutex::new(log),
            log_dir: dir,
            known: Mutex::default(),
            conflicts: AtomicU64::new(0),
            reintegrated: AtomicU64::new(0),
            offline_waits: AtomicU64::new(0),
            grace,
            st: Mutex::new(St::default()),
            cv: Condvar::new(),
            barrier_sent: AtomicU64::new(0),
            barrier_seen: Mutex::new(0),
            barrier_cv: Condvar::new(),
            disconnections: AtomicU64::new(0),
        })
    }

    /// The connection was lost (its reader ended).
    pub(super) fn lost(&self) {
        let mut st = self.st.lock();
        if st.stopped {
            return;
        }
        if !st.offline {
            st.offline = true;
            st.since = Some(Instant::now());
            self.disconnections.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                "disconnected from the server: serving what is cached (misses fail with \
                 ETIMEDOUT after {:?}) while reconnecting",
                self.grace
            );
        }
        st.lost = true;
        st.unreachable = false;
        st.installing = false;
        st.replaying = false;
        self.cv.notify_all();
    }

    /// A new connection is made: the log is replayed on it, then it is installed (see
    /// `St::replaying`): from now on misses wait for it instead of failing at once.
    pub(super) fn replaying(&self) {
        let mut st = self.st.lock();
        if st.offline {
            st.replaying = true;
            st.unreachable = false;
        }
        self.cv.notify_all();
    }

    /// The replay on a new connection ended before the connection was installed (it ended,
    /// or the log could not be written): misses no longer wait for it.
    pub(super) fn replay_abandoned(&self) {
        self.st.lock().replaying = false;
        self.cv.notify_all();
    }

    /// Whether the log is being replayed on a new connection (calls wait for it while the
    /// replay makes progress); the records reintegrated so far.
    pub(super) fn is_replaying(&self) -> Option<u64> {
        let st = self.st.lock();
        (st.offline && st.replaying).then(|| self.reintegrated.load(Ordering::Relaxed))
    }

    /// The log is reintegrated on a new connection that is being installed (see
    /// `St::installing`): from now on misses wait for it.
    pub(super) fn installing(&self) {
        let mut st = self.st.lock();
        if st.offline {
            st.installing = true;
        }
        self.cv.notify_all();
    }

    /// Whether a new connection is being installed (calls wait for it).
    pub(super) fn is_installing(&self) -> bool {
        let st = self.st.lock();
        st.offline && st.installing
    }

    /// A reconnection attempt failed: until the next connection, calls that need the
    /// server fail at once instead of waiting `grace` for it.
    fn attempt_failed(&self) {
        let mut st = self.st.lock();
        if st.offline {
            st.unreachable = true;
        }
    }

    /// Disconnected, and a reconnection attempt has failed since (the server cannot be
    /// reached now: a call that needs it fails at once).
    pub fn unreachable(&self) -> bool {
        let st = self.st.lock();
        st.offline && st.unreachable && !st.installing && !st.replaying
    }

    /// Whether the client is disconnected now and serving what it cached (not while a new
    /// connection is being installed after its reintegration).
    pub fn offline(&self) -> bool {
        let st = self.st.lock();
        st.offline && !st.installing
    }

    /// Whether the client is connected, with nothing of a disconnection left to install
    /// (what it answers from its caches is under the server's callback promises).
    pub(super) fn connected(&self) -> bool {
        !self.st.lock().offline
    }

    /// The mount ends: the reconnector stops.
    pub(super) fn stop(&self) {
        let mut st = self.st.lock();
        st.stopped = true;
        self.cv.notify_all();
    }

    pub(super) fn stopped(&self) -> bool {
        self.st.lock().stopped
    }

    /// Open the modification log in `dir` (client/cml.rs).
    pub fn open_log(dir: &Path) -> std::io::Result<Log> {
        Log::open(dir)
    }

    /// The log, opened if needed.
    pub(super) fn log<'a>(&self, g: &'a mut Option<Log>) -> Result<&'a mut Log> {
        if g.is_none() {
            let dir = self.log_dir.as_ref().ok_or_else(timedout)?;
            *g = Some(Log::open(dir).map_err(log_err)?);
        }
        g.as_mut().ok_or(Error::Os(libc::EIO))
    }

    /// Reintegrate what `g` holds on `conn`; an emptied log is closed and its files
    /// removed. `false` when the connection ended first.
    pub(super) fn reintegrate_all(&self, g: &mut Option<Log>, conn: &Arc<super::Conn>) -> bool {
        let Some(l) = g.as_mut() else { return true };
        if !self.reintegrate(l, conn) {
            return false;
        }
        if l.pending().is_empty() {
            // Before the log is seen gone: a new connection being installed is waited for
            // from now on (`Disconnected::installing`; no-op when connected).
            self.installing();
            l.remove_files();
            *g = None;
        }
        true
    }

    /// Whether `ino` is one this client made up for an object made while disconnected
    /// ([`FAKE_INO`]) and the client is connected again: the reintegration made the object
    /// on the server, with the server's number, which replaces the made-up one (Coda's
    /// temporary fids). While disconnected the made-up number is the object's.
    pub fn provisional(&self, ino: u64) -> bool {
        ino & FAKE_MASK == FAKE_INO
            && (1..=self.known.lock().next_ino).contains(&(ino & !FAKE_MASK))
            && !self.offline()
    }

    /// Counters for `dircache stats` (under `backend`): disconnections, conflicts found
    /// reintegrating (each kept local version), records reintegrated.
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![
            (
                "disconnections",
                self.disconnections.load(Ordering::Relaxed),
            ),
            ("conflicts", self.conflicts.load(Ordering::Relaxed)),
            ("reintegrated", self.reintegrated.load(Ordering::Relaxed)),
            ("offline_waits", self.offline_waits.load(Ordering::Relaxed)),
        ]
    }

    /// Records waiting in the modification log.
    pub fn pending(&self) -> usize {
        self.cml.lock().as_ref().map_or(0, |l| l.pending().len())
    }

    /// A new connection is installed.
    pub(super) fn online(&self) {
        self.known.lock().forget_offline();
        let mut st = self.st.lock();
        if let Some(t) = st.since.take() {
            tracing::warn!("reconnected after {:?} disconnected", t.elapsed());
        }
        st.offline = false;
        st.unreachable = false;
        st.installing = false;
        st.replaying = false;
        self.cv.notify_all();
    }

    /// Wait at most `d` for a change of state (a new connection, a loss, the end).
    pub(super) fn wait(&self, d: Duration) {
        let mut st = self.st.lock();
        if st.stopped {
            return;
        }
        self.cv.wait_for(&mut st, d);
    }

    /// Wait for a loss to take up; `false` when the mount ends.
    fn wait_lost(&self) -> bool {
        let mut st = self.st.lock();
        loop {
            if st.stopped {
                return false;
            }
            if st.lost {
                st.lost = false;
                return true;
            }
            self.cv.wait(&mut st);
        }
    }

    /// A new barrier number to send through the feed.
    pub(super) fn next_barrier(&self) -> u64 {
        self.barrier_sent.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// The front end applied everything up to barrier `n` (from `Backend::changed`).
    pub(super) fn barrier_passed(&self, n: u64) {
        let mut seen = self.barrier_seen.lock();
        if n > *seen {
            *seen = n;
        }
        self.barrier_cv.notify_all();
    }

    /// Wait until barrier `n` was applied, at most `d`; whether it was.
    pub(super) fn wait_barrier(&self, n: u64, d: Duration) -> bool {
        let end = Instant::now() + d;
        let mut seen = self.barrier_seen.lock();
        while *seen < n {
            if self.barrier_cv.wait_until(&mut seen, end).timed_out() {
                return *seen >= n;
            }
        }
        true
    }
}

/// The reconnector: after each loss, a new connection with backoff (50 ms doubling to 2 s)
/// until one is made or the mount ends; the link installs it.
pub(super) fn spawn_reconnector(d: Arc<Disconnected>, link: Weak<Link>) {
    let r = std::thread::Builder::new()
        .name("dircache-reconnect".into())
        .spawn(move || {
            while d.wait_lost() {
                let mut delay = Duration::from_millis(50);
                let mut attempts = 0u64;
                loop {
                    if d.stopped() {
                        return;
                    }
                    let Some(l) = link.upgrade() else { return };
                    attempts += 1;
                    match l.connect_once() {
                        Ok(new) => {
                            l.install(new);
                            break;
                        }
                        Err(e) => {
                            d.attempt_failed();
                            // Every attempt at first, then one in 30 (every minute).
                            if attempts <= 5 || attempts.is_multiple_of(30) {
                                tracing::warn!("reconnecting (attempt {attempts}): {e}");
                            }
                        }
                    }
                    drop(l);
                    d.wait(delay);
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
            }
        });
    if let Err(e) = r {
        tracing::error!("cannot start the reconnector thread: {e}");
    }
}

impl Known {
    /// After a reconnection: what was made while disconnected is the server's now (the cache
    /// learns it again); directories' attributes are kept (refreshed as they are handed out).
    fn forget_offline(&mut self) {
        self.links.clear();
        self.new_dirs.clear();
        self.bases.clear();
        let dirs: HashMap<Vec<u8>, Attr> = std::mem::take(&mut self.attrs)
            .into_iter()
            .filter(|(_, a)| a.is_dir() && a.ino & FAKE_INO != FAKE_INO)
            .collect();
        self.attrs = dirs;
    }

    /// Attributes for a new object at `path` (made while disconnected) of `mode` by `cred`.
    fn made(&mut self, path: &[u8], mode: u32, cred: &Cred, size: u64) -> Attr {
        self.next_ino += 1;
        let now = now();
        let dev = self.attrs.get(parent(path)).map_or(0, |a| a.dev);
        let dir = mode & libc::S_IFMT == libc::S_IFDIR;
        let a = Attr {
            ino: FAKE_INO | self.next_ino,
            dev,
            mode,
            nlink: if dir { 2 } else { 1 },
            uid: cred.uid,
            gid: cred.gid,
            rdev: 0,
            size: if dir { 4096 } else { size },
            blocks: 0,
            blksize: 4096,
            atime: now,
            mtime: now,
            ctime: now,
            birth: 0,
        };
        self.attrs.insert(path.to_vec(), a);
        self.touch(parent(path), if dir { 1 } else { 0 });
        a
    }

    /// A change in directory `dir` (its times; `links`: its link count change).
    fn touch(&mut self, dir: &[u8], links: i32) {
        if let Some(a) = self.attrs.get_mut(dir) {
            let now = now();
            a.mtime = now;
            a.ctime = now;
            a.nlink = a.nlink.saturating_add_signed(links);
        }
    }

    /// `path` and everything below it are gone.
    fn remove(&mut self, path: &[u8]) {
        let below =
            |p: &[u8]| p == path || (p.starts_with(path) && p.get(path.len()) == Some(&b'/'));
        self.attrs.retain(|p, _| !below(p));
        self.links.retain(|p, _| !below(p));
        self.new_dirs.retain(|p| !below(p));
        self.bases.retain(|p, _| !below(p));
    }

    /// `old` (and everything below) is at `new` now.
    fn moved(&mut self, old: &[u8], new: &[u8]) {
        fn mv<V>(m: &mut HashMap<Vec<u8>, V>, old: &[u8], new: &[u8]) {
            let keys: Vec<Vec<u8>> = m
                .keys()
                .filter(|p| moved_path(p, old, new).is_some())
                .cloned()
                .collect();
            for k in keys {
                if let (Some(v), Some(to)) = (m.remove(&k), moved_path(&k, old, new)) {
                    m.insert(to, v);
                }
            }
        }
        self.remove(new);
        mv(&mut self.attrs, old, new);
        mv(&mut self.links, old, new);
        mv(&mut self.bases, old, new);
        let dirs: Vec<Vec<u8>> = self
            .new_dirs
            .iter()
            .filter(|p| moved_path(p, old, new).is_some())
            .cloned()
            .collect();
        for d in dirs {
            self.new_dirs.remove(&d);
            if let Some(to) = moved_path(&d, old, new) {
                self.new_dirs.insert(to);
            }
        }
    }
}

/// Inode numbers made up for objects made while disconnected (the high bits).
const FAKE_INO: u64 = 0xD15C << 48;
/// The bits of [`FAKE_INO`].
const FAKE_MASK: u64 = 0xFFFF << 48;

fn now() -> Timespec {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Timespec {
        sec: d.as_secs() as i64,
        nsec: d.subsec_nanos(),
    }
}

fn parent(path: &[u8]) -> &[u8] {
    match path.iter().rposition(|&c| c == b'/') {
        Some(i) => &path[..i],
        None => b"",
    }
}

fn moved_path(p: &[u8], old: &[u8], new: &[u8]) -> Option<Vec<u8>> {
    let rest = p.strip_prefix(old)?;
    if !rest.is_empty() && rest[0] != b'/' {
        return None;
    }
    let mut to = new.to_vec();
    to.extend_from_slice(rest);
    Some(to)
}

fn timedout() -> Error {
    Error::Os(libc::ETIMEDOUT)
}

fn log_err(e: std::io::Error) -> Error {
    tracing::error!("the modification log: {e}");
    Error::Os(libc::EIO)
}

/// `set` with "now" replaced by the time now (a logged change sets the same times later).
fn resolved(set: &SetAttr) -> SetAttr {
    let t = |x: Option<TimeSet>| match x {
        Some(TimeSet::Now) => Some(TimeSet::At(now())),
        x => x,
    };
    SetAttr {
        atime: t(set.atime),
        mtime: t(set.mtime),
        ..*set
    }
}

/// `a` with `set` applied (as the server would), ctime now.
fn applied(mut a: Attr, set: &SetAttr) -> Attr {
    if let Some(m) = set.mode {
        a.mode = (a.mode & libc::S_IFMT) | (m & 0o7777);
    }
    if let Some(u) = set.uid {
        a.uid = u;
    }
    if let Some(g) = set.gid {
        a.gid = g;
    }
    if let Some(TimeSet::At(t)) = set.atime {
        a.atime = t;
    }
    if let Some(TimeSet::At(t)) = set.mtime {
        a.mtime = t;
    }
    a.ctime = now();
    a
}

impl RemoteBackend {
    /// Disconnected operation, when the client is disconnected now.
    fn offline_now(&self) -> Option<&Arc<Disconnected>> {
        self.cfg.disconnected.as_ref().filter(|d| d.offline())
    }

    /// A directory's attributes the backend hands out (remembered for while disconnected).
    pub(super) fn remember(&self, path: &[u8], a: &Attr) {
        if let Some(d) = &self.cfg.disconnected {
            if a.is_dir() && !d.offline() {
                d.known.lock().attrs.insert(path.to_vec(), *a);
            }
        }
    }

    /// The entries of a listing the backend hands out (their directories remembered).
    pub(super) fn remember_listing(&self, dir: &[u8], entries: &[DirEntry]) {
        if self.cfg.disconnected.is_none() {
            return;
        }
        for e in entries {
            if let Some(a) = &e.attr {
                self.remember(&super::join(dir, &e.name), a);
            }
        }
    }

    /// While disconnected: the attributes of `path` as known (a valid container, what was
    /// made or changed while disconnected, a directory's last attributes).
    pub(super) fn offline_attr(&self, path: &[u8]) -> Option<Attr> {
        let d = self.offline_now()?;
        let known = d.known.lock().attrs.get(path).copied();
        self.known_attr(path, known)
    }

    /// [`RemoteBackend::offline_attr`] once the caller has decided it is disconnected
    /// (`known`: what `Known` says about `path`): one decision per call. Checking
    /// `offline()` again here let a reintegration ending between two checks answer a
    /// lookup in a directory made while cut off with ENOENT, and a listing of one with
    /// names missing.
    fn known_attr(&self, path: &[u8], known: Option<Attr>) -> Option<Attr> {
        let held = self
            .cfg
            .containers
            .as_ref()
            .and_then(|cc| cc.cached_attr(path));
        match (held, known) {
            (Some(mut c), Some(k)) => {
                (c.mode, c.uid, c.gid) = (k.mode, k.uid, k.gid);
                Some(c)
            }
            (Some(c), None) => Some(c),
            (None, k) => k,
        }
    }

    /// While disconnected: a lookup in a directory made while disconnected (its listing is
    /// known whole).
    pub(super) fn offline_lookup(&self, dir: &[u8], name: &[u8]) -> Option<Result<Attr>> {
        let d = self.offline_now()?;
        let path = super::join(dir, name);
        let (known, new_dir) = {
            let k = d.known.lock();
            (k.attrs.get(&path).copied(), k.new_dirs.contains(dir))
        };
        if let Some(a) = self.known_attr(&path, known) {
            return Some(Ok(a));
        }
        new_dir.then_some(Err(Error::NotFound))
    }

    /// While disconnected: the listing of a directory made while disconnected.
    pub(super) fn offline_readdir(&self, path: &[u8]) -> Option<Result<Vec<DirEntry>>> {
        let d = self.offline_now()?;
        let names: Vec<(Vec<u8>, Attr)> = {
            let k = d.known.lock();
            if !k.new_dirs.contains(path) {
                return None;
            }
            k.attrs
                .iter()
                .filter(|(p, _)| p.as_slice() != path && parent(p) == path)
                .map(|(p, a)| (p.clone(), *a))
                .collect()
        };
        let mut out = Vec::new();
        for (p, known) in names {
            if let Some(a) = self.known_attr(&p, Some(known)) {
                out.push(DirEntry {
                    name: if path.is_empty() {
                        p.clone()
                    } else {
                        p[path.len() + 1..].to_vec()
                    },
                    kind: a.kind(),
                    ino: a.ino,
                    attr: Some(a),
                });
            }
        }
        Some(Ok(out))
    }

    /// While disconnected: a symbolic link's target made while disconnected.
    pub(super) fn offline_readlink(&self, path: &[u8]) -> Option<Vec<u8>> {
        self.offline_now()?.known.lock().links.get(path).cloned()
    }

    /// The log, when disconnected with one: the mutation is applied locally and logged by
    /// `f`; `None`: not disconnected (ask the server). Disconnected without a log: ETIMEDOUT.
    fn offline_mutation<T>(
        &self,
        f: impl FnOnce(&Arc<Disconnected>, &mut Log, &mut Known) -> Result<T>,
    ) -> Option<Result<T>> {
        let d = self.offline_now()?;
        let mut g = d.cml.lock();
        if !d.offline() {
            return None;
        }
        let log = match d.log(&mut g) {
            Ok(l) => l,
            Err(e) => return Some(Err(e)),
        };
        let mut k = d.known.lock();
        Some(f(d, log, &mut k))
    }

    pub(super) fn offline_mkdir(
        &self,
        cred: &Cred,
        path: &[u8],
        mode: u32,
    ) -> Option<Result<Attr>> {
        self.offline_mutation(|_, log, k| {
            let umask = super::thread_umask();
            log.append(
                cred.into(),
                Op::Mkdir {
                    path: path.to_vec(),
                    mode,
                    umask,
                },
            )
            .map_err(log_err)?;
            let a = k.made(path, libc::S_IFDIR | (mode & !umask & 0o7777), cred, 0);
            k.new_dirs.insert(path.to_vec());
            Ok(a)
        })
    }

    pub(super) fn offline_symlink(
        &self,
        cred: &Cred,
        target: &[u8],
        path: &[u8],
    ) -> Option<Result<Attr>> {
        self.offline_mutation(|_, log, k| {
            log.append(
                cred.into(),
                Op::Symlink {
                    target: target.to_vec(),
                    path: path.to_vec(),
                },
            )
            .map_err(log_err)?;
            k.links.insert(path.to_vec(), target.to_vec());
            Ok(k.made(path, libc::S_IFLNK | 0o777, cred, target.len() as u64))
        })
    }

    pub(super) fn offline_remove(&self, cred: &Cred, path: &[u8], dir: bool) -> Option<Result<()>> {
        self.offline_mutation(|_, log, k| {
            let op = if dir {
                Op::Rmdir {
                    path: path.to_vec(),
                }
            } else {
                Op::Unlink {
                    path: path.to_vec(),
                }
            };
            log.append(cred.into(), op).map_err(log_err)?;
            k.remove(path);
            k.touch(parent(path), if dir { -1 } else { 0 });
            if let Some(cc) = &self.cfg.containers {
                cc.touched(path);
            }
            Ok(())
        })
    }

    pub(super) fn offline_rename(
        &self,
        cred: &Cred,
        old: &[u8],
        new: &[u8],
        mode: RenameMode,
    ) -> Option<Result<()>> {
        self.offline_mutation(|_, log, k| {
            if mode == RenameMode::Exchange {
                return Err(timedout());
            }
            log.append(
                cred.into(),
                Op::Rename {
                    old: old.to_vec(),
                    new: new.to_vec(),
                    mode,
                },
            )
            .map_err(log_err)?;
            k.moved(old, new);
            k.touch(parent(old), 0);
            k.touch(parent(new), 0);
            if let Some(cc) = &self.cfg.containers {
                cc.moved(old, new);
            }
            Ok(())
        })
    }

    pub(super) fn offline_setattr(
        &self,
        cred: &Cred,
        path: &[u8],
        set: &SetAttr,
    ) -> Option<Result<Attr>> {
        let base = self.offline_attr(path);
        self.offline_mutation(|_, log, k| {
            // A truncation by path needs the file's data: not while disconnected.
            let (Some(base), None) = (base, set.size) else {
                return Err(timedout());
            };
            let set = resolved(set);
            log.append(
                cred.into(),
                Op::Setattr {
                    path: path.to_vec(),
                    set,
                },
            )
            .map_err(log_err)?;
            let a = applied(base, &set);
            k.attrs.insert(path.to_vec(), a);
            Ok(a)
        })
    }

    /// A writable or creating open while disconnected: a new container for a new file, or
    /// the container of a cached file the server granted these credentials this access to;
    /// its contents are logged when it is closed. `None`: not disconnected, or a read-only
    /// open (served from a valid container or not at all).
    pub(super) fn offline_open(
        &self,
        cc: &Arc<Containers>,
        cred: &Cred,
        path: &[u8],
        flags: i32,
        mode: u32,
    ) -> Option<Result<Box<dyn BackendFile>>> {
        let d = self.offline_now()?.clone();
        let acc = flags & libc::O_ACCMODE;
        if acc == libc::O_RDONLY && flags & (libc::O_CREAT | libc::O_TRUNC) == 0 {
            return None;
        }
        if d.log_dir.is_none() && d.cml.lock().is_none() {
            return Some(Err(timedout()));
        }
        let conn = self.conn.lock().clone();
        let known = d.known.lock().attrs.get(path).copied();
        let exists = self.known_attr(path, known);
        let umask = super::thread_umask();
        let r = (|| {
            let (cf, created, base) = match exists {
                None if flags & libc::O_CREAT != 0 => {
                    let a = d.known.lock().made(
                        path,
                        libc::S_IFREG | (mode & !umask & 0o7777),
                        cred,
                        0,
                    );
                    d.known.lock().bases.insert(path.to_vec(), None);
                    (cc.create_local(&conn, path, cred, a)?, true, None)
                }
                None => return Err(timedout()),
                Some(_) if flags & libc::O_CREAT != 0 && flags & libc::O_EXCL != 0 => {
                    return Err(Error::Exists)
                }
                Some(_) => {
                    let base = *d
                        .known
                        .lock()
                        .bases
                        .entry(path.to_vec())
                        .or_insert_with(|| cc.recorded_attr(path));
                    let cf = cc.reuse_as(&conn, path, cred, acc).ok_or_else(timedout)?;
                    if flags & libc::O_TRUNC != 0 {
                        cf.set_size(cred, 0)?;
                    }
                    (cf, false, base)
                }
            };
            let state = if created { None } else { state_of(&cf) };
            Ok(Box::new(OfflineFile {
                inner: cf,
                d: d.clone(),
                link: self.link.clone(),
                path: path.to_vec(),
                cred: cred.into(),
                mode: if created { mode } else { 0o666 },
                umask: if created { umask } else { 0 },
                base,
                logged: Mutex::new(state),
            }) as Box<dyn BackendFile>)
        })();
        Some(r)
    }
}

impl Disconnected {
    /// Log the contents of `cf`, a container opened for writing while connected whose
    /// store-back cannot reach the server (closed, synced or released while disconnected):
    /// a `Store` record of `path` as `cred`, changed from the server's version `base`, as
    /// for a file opened while disconnected; the container counts as clean from now on.
    /// Reintegrated at the reconnection (at once, when it came meanwhile).
    pub(super) fn log_session(
        &self,
        link: &Link,
        cf: &ContainerFile,
        cred: WireCred,
        path: &[u8],
        base: Option<Attr>,
    ) -> Result<()> {
        let now = state_of(cf).ok_or(Error::Os(libc::EIO))?;
        let mut g = self.cml.lock();
        let log = self.log(&mut g)?;
        let fd = cf.fd().ok_or(Error::Os(libc::EIO))?;
        let file = std::fs::File::from(fd.try_clone_to_owned()?);
        log.save_data(&file, now.0).map_err(log_err)?;
        log.append(
            cred,
            Op::Store {
                path: path.to_vec(),
                // Used only if the replay has to create it (a conflict copy): the
                // server's permission bits of the version it was changed from.
                mode: base.map_or(0o600, |a| a.mode & 0o7777),
                umask: 0,
                size: now.0,
                mtime: now.1,
                base,
            },
        )
        .map_err(log_err)?;
        cf.logged_as(now);
        // Later writable opens while disconnected change the same server version.
        self.known.lock().bases.entry(path.to_vec()).or_insert(base);
        tracing::warn!(
            "{:?} closed while disconnected: its contents are logged for reintegration",
            String::from_utf8_lossy(path)
        );
        if !self.offline() {
            // The reconnection came meanwhile: reintegrated at once, in order.
            let conn = link.conn.lock().clone();
            self.reintegrate_all(&mut g, &conn);
        }
        Ok(())
    }
}

/// A container's size, mtime and ctime now, once no write under way can change them
/// behind the data read next (container.rs `settled_local`: a log record's data must be
/// all of the state it is recorded with).
fn state_of(cf: &ContainerFile) -> Option<(u64, Timespec, Timespec)> {
    let l = super::container::settled_local(cf.fd()?).ok()?;
    Some((l.size, l.mtime, l.ctime))
}

/// A file open for writing while disconnected: its container, whose contents are logged
/// (a `Store` record) at close, fsync and release when they changed since last logged (a
/// file made while disconnected: at least once).
struct OfflineFile {
    inner: ContainerFile,
    d: Arc<Disconnected>,
    link: Arc<Link>,
    path: Vec<u8>,
    cred: WireCred,
    mode: u32,
    umask: u32,
    base: Option<Attr>,
    /// The container's state when last logged (`None`: never, for a new file).
    logged: Mutex<Option<(u64, Timespec, Timespec)>>,
}

impl OfflineFile {
    fn log_store(&self) -> Result<()> {
        let mut last = self.logged.lock();
        let now = state_of(&self.inner).ok_or(Error::Os(libc::EIO))?;
        if *last == Some(now) {
            return Ok(());
        }
        let mut g = self.d.cml.lock();
        let log = self.d.log(&mut g)?;
        let fd = self.inner.fd().ok_or(Error::Os(libc::EIO))?;
        let file = std::fs::File::from(fd.try_clone_to_owned()?);
        log.save_data(&file, now.0).map_err(log_err)?;
        log.append(
            self.cred.clone(),
            Op::Store {
                path: self.path.clone(),
                mode: self.mode,
                umask: self.umask,
                size: now.0,
                mtime: now.1,
                base: self.base,
            },
        )
        .map_err(log_err)?;
        self.inner.logged_as(now);
        *last = Some(now);
        // Closed after the reconnection: reintegrated at once, in order.
        if !self.d.offline() {
            let conn = self.link.conn.lock().clone();
            self.d.reintegrate_all(&mut g, &conn);
        }
        Ok(())
    }
}

impl Drop for OfflineFile {
    fn drop(&mut self) {
        if let Err(e) = self.log_store() {
            tracing::error!(
                "logging {:?} at release: {e}; the changes stay in its container only",
                String::from_utf8_lossy(&self.path)
            );
        }
    }
}

impl BackendFile for OfflineFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, cred: &Cred, data: &[u8], offset: u64, append: bool) -> Result<usize> {
        self.inner.write_at(cred, data, offset, append)
    }
    fn sync(&self, _datasync: bool) -> Result<()> {
        self.log_store()
    }
    fn flush(&self) -> Result<()> {
        self.log_store()
    }
    fn allocate(&self, cred: &Cred, mode: i32, offset: u64, len: u64) -> Result<()> {
        self.inner.allocate(cred, mode, offset, len)
    }
    fn seek(&self, offset: i64, whence: Whence) -> Result<u64> {
        self.inner.seek(offset, whence)
    }
    fn set_size(&self, cred: &Cred, size: u64) -> Result<()> {
        self.inner.set_size(cred, size)
    }
    /// fchmod, fchown, futimens: the contents are logged first (so the change applies to
    /// the file as stored), then the change; times go on the container too.
    fn setattr(&self, cred: &Cred, set: &SetAttr) -> Result<Attr> {
        if set.size.is_some() {
            return Err(timedout());
        }
        self.log_store()?;
        let set = resolved(set);
        if set.atime.is_some() || set.mtime.is_some() {
            let ts = |t: Option<TimeSet>| match t {
                Some(TimeSet::At(t)) => rustix::fs::Timespec {
                    tv_sec: t.sec,
                    tv_nsec: t.nsec as _,
                },
                _ => rustix::fs::Timespec {
                    tv_sec: 0,
                    tv_nsec: rustix::fs::UTIME_OMIT,
                },
            };
            let fd = self.inner.fd().ok_or(Error::Os(libc::EIO))?;
            rustix::fs::futimens(
                fd,
                &rustix::fs::Timestamps {
                    last_access: ts(set.atime),
                    last_modification: ts(set.mtime),
                },
            )
            .map_err(|e| Error::Os(e.raw_os_error()))?;
        }
        {
            let mut g = self.d.cml.lock();
            let log = self.d.log(&mut g)?;
            log.append(
                cred.into(),
                Op::Setattr {
                    path: self.path.clone(),
                    set,
                },
            )
            .map_err(log_err)?;
            self.inner.logged();
            *self.logged.lock() = state_of(&self.inner);
        }
        let a = applied(self.inner.attr()?, &set);
        self.d.known.lock().attrs.insert(self.path.clone(), a);
        Ok(a)
    }
    fn attr(&self) -> Result<Attr> {
        let mut a = self.inner.attr()?;
        if let Some(k) = self.d.known.lock().attrs.get(&self.path) {
            (a.mode, a.uid, a.gid) = (k.mode, k.uid, k.gid);
        }
        Ok(a)
    }
    fn writable(&self) -> bool {
        self.inner.writable()
    }
    fn fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.inner.fd()
    }
    fn as_caller(
        &self,
        cred: &Cred,
        shared: bool,
        f: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        self.inner.as_caller(cred, shared, f)
    }
}

/// The paths the log's reintegrated records stored at their own names (followed through
/// their renames): a later `Store` of one of them is no conflict (the server's copy changed
/// because this client wrote it), also when the replay was cut short and resumed.
fn stored_before(log: &Log) -> HashSet<Vec<u8>> {
    let mut stored = HashSet::new();
    for r in log.applied() {
        match &r.op {
            Op::Store { path, .. } if log.begun(r.seq) == Some(Some(path.as_slice())) => {
                stored.insert(path.clone());
            }
            Op::Rename { old, new, .. } => stored_moved(&mut stored, old, new),
            _ => {}
        }
    }
    stored
}

/// The conflict copy the latest earlier `Store` of `path` in the log went to, if it went to
/// one and was made by `uid` (a later `Store` of the same file by the same writer goes there
/// too, not to a copy of its own).
fn earlier_copy(log: &Log, path: &[u8], uid: u32) -> Option<Vec<u8>> {
    log.applied()
        .iter()
        .rev()
        .find_map(|r| match &r.op {
            Op::Store { path: p, .. } if p.as_slice() == path => Some(match log.begun(r.seq) {
                Some(Some(t)) if t != path && r.cred.uid == uid => Some(t.to_vec()),
                _ => None,
            }),
            _ => None,
        })
        .flatten()
}

/// `old` (a file, or a directory and what is below it) was renamed to `new`.
fn stored_moved(stored: &mut HashSet<Vec<u8>>, old: &[u8], new: &[u8]) {
    let moved: Vec<Vec<u8>> = stored
        .iter()
        .filter(|p| moved_path(p, old, new).is_some())
        .cloned()
        .collect();
    for p in moved {
        stored.remove(&p);
        if let Some(to) = moved_path(&p, old, new) {
            stored.insert(to);
        }
    }
}

/// Test-only: `DIRCACHE_TEST_REPLAY_DELAY_MS`, a pause after each record is applied and
/// before it is marked done, so that a test can kill the client in the middle of a
/// reintegration (crates/cli/tests/remote_disconnected.rs). Not for any other use.
fn replay_delay() -> Option<Duration> {
    std::env::var("DIRCACHE_TEST_REPLAY_DELAY_MS")
        .ok()?
        .parse::<u64>()
        .ok()
        .map(Duration::from_millis)
}

fn same_version(a: &Attr, b: &Attr) -> bool {
    (a.dev, a.ino, a.size, a.mtime, a.ctime) == (b.dev, b.ino, b.size, b.mtime, b.ctime)
}

impl Disconnected {
    /// Reintegrate the log's records on `conn`, in order, each as the caller who made it;
    /// `false` when the connection ended before all were (the rest waits for the next).
    ///
    /// Exactly once in effect: each record is marked begun in the log's replay journal
    /// before it is sent (a `Store` with the name its data goes to, decided then) and done
    /// after. A record begun but not done (the client was killed between the two, or the
    /// connection ended) may have been applied: it is replayed again as "maybe applied",
    /// where finding the server in the state it leaves counts as success: a `Store` goes to
    /// the target decided before (its data written whole again, never a conflict with
    /// itself), a `Rename` whose old name is gone and a `Symlink` whose name holds the same
    /// target are done (as a `Mkdir` finding a directory and `Unlink`/`Rmdir` finding
    /// nothing always are).
    pub(super) fn reintegrate(&self, log: &mut Log, conn: &Arc<super::Conn>) -> bool {
        let recs: Vec<Record> = log.pending().to_vec();
        if recs.is_empty() {
            return true;
        }
        tracing::warn!("reintegrating {} logged mutations", recs.len());
        let mut stored = stored_before(log);
        let delay = replay_delay();
        for r in recs {
            let res = self.apply(log, conn, &r, &mut stored);
            if conn.closed.load(Ordering::SeqCst) {
                tracing::warn!("the connection ended while reintegrating #{}", r.seq);
                return false;
            }
            match res {
                Ok(()) => {}
                Err(e) => tracing::error!(
                    "not reintegrated: #{} {:?} by uid {}: {e}",
                    r.seq,
                    r.op,
                    r.cred.uid
                ),
            }
            if let Some(d) = delay {
                std::thread::sleep(d);
            }
            self.reintegrated.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = log.done(r.seq) {
                tracing::error!("the modification log: {e}");
                return false;
            }
        }
        true
    }

    fn apply(
        &self,
        log: &mut Log,
        conn: &Arc<super::Conn>,
        r: &Record,
        stored: &mut HashSet<Vec<u8>>,
    ) -> Result<()> {
        let call = |req: Request| conn.call_as(&r.cred, req);
        let benign = |res: Result<Reply>, ok: i32| match res {
            Err(Error::Os(e)) if e == ok => Ok(()),
            Err(e) if e.errno() == ok => Ok(()),
            Err(e) => Err(e),
            Ok(_) => Ok(()),
        };
        // Begun by an earlier run (or before the connection ended): maybe applied already.
        let again = log.begun(r.seq).map(|t| t.map(<[u8]>::to_vec));
        if again.is_some() {
            tracing::warn!(
                "#{} was begun before and may be applied already: {:?}",
                r.seq,
                r.op
            );
        }
        let mark = |log: &mut Log, target: Option<&[u8]>| -> Result<()> {
            if again.is_none() {
                log.begin(r.seq, target).map_err(log_err)?;
            }
            Ok(())
        };
        if !matches!(r.op, Op::Store { .. }) {
            mark(log, None)?;
        }
        match &r.op {
            Op::Mkdir { path, mode, umask } => benign(
                call(Request::Mkdir {
                    path: path.clone(),
                    mode: *mode,
                    umask: *umask,
                }),
                libc::EEXIST,
            ),
            Op::Symlink { target, path } => {
                match call(Request::Symlink {
                    target: target.clone(),
                    path: path.clone(),
                }) {
                    Err(e) if again.is_some() && e.errno() == libc::EEXIST => {
                        match call(Request::Readlink { path: path.clone() }) {
                            Ok(Reply::Data(t)) if &t == target => Ok(()),
                            _ => Err(e),
                        }
                    }
                    res => res.map(drop),
                }
            }
            Op::Unlink { path } => {
                benign(call(Request::Unlink { path: path.clone() }), libc::ENOENT)
            }
            Op::Rmdir { path } => benign(call(Request::Rmdir { path: path.clone() }), libc::ENOENT),
            Op::Rename { old, new, mode } => {
                let res = call(Request::Rename {
                    old: old.clone(),
                    new: new.clone(),
                    mode: *mode,
                });
                let res = match res {
                    // Applied before: the old name is gone (and the new one is there).
                    Err(e) if again.is_some() && e.errno() == libc::ENOENT => {
                        match conn.call(Request::Getattr { path: new.clone() }) {
                            Ok(_) => Ok(()),
                            Err(_) => Err(e),
                        }
                    }
                    res => res.map(drop),
                };
                res.map(|()| stored_moved(stored, old, new))
            }
            Op::Setattr { path, set } => call(Request::Setattr {
                path: path.clone(),
                set: *set,
            })
            .map(drop),
            Op::Store {
                path,
                mode,
                umask,
                size,
                mtime,
                base,
            } => {
                let target = match again {
                    // Decided when it was begun: its data goes there again, whole.
                    Some(Some(t)) => {
                        if t != *path {
                            let why = "in conflict (found by a replay cut short)";
                            self.conflict_noted(log, path, &t, why);
                        }
                        t
                    }
                    // A later close of a file whose local version went to a conflict copy
                    // in this log: that copy again (its writer made it).
                    _ if earlier_copy(log, path, r.cred.uid).is_some() => {
                        let t = earlier_copy(log, path, r.cred.uid).unwrap_or_default();
                        mark(log, Some(&t))?;
                        t
                    }
                    _ => {
                        let (mut target, why) = self.store_target(conn, path, base, stored)?;
                        mark(log, Some(&target))?;
                        if let Some(why) = why {
                            // A new name, made by this store alone (O_EXCL): a file another
                            // user put there (they can guess the time) never receives the
                            // writer's data. Taken: the next name, journaled before it is
                            // tried.
                            let first = target.clone();
                            let mut n = 0;
                            loop {
                                let mode = *mode & 0o700;
                                match self
                                    .store(log, conn, r, &target, mode, *umask, *size, *mtime, true)
                                {
                                    Err(e) if e.errno() == libc::EEXIST && n < 64 => {
                                        n += 1;
                                        target =
                                            [first.as_slice(), format!("-{n}").as_bytes()].concat();
                                        log.begin(r.seq, Some(&target)).map_err(log_err)?;
                                    }
                                    res => {
                                        res?;
                                        break;
                                    }
                                }
                            }
                            self.conflict_noted(log, path, &target, why);
                            return Ok(());
                        }
                        target
                    }
                };
                // A conflict copy is a new file, private to its writer: the file it was
                // changed from may be private or have an ACL denying others what its mode
                // bits allow, and the copy gets neither that ACL nor its group (and a file
                // opened while disconnected is logged with 0666, umask 0).
                let mode = if target == *path {
                    *mode
                } else {
                    *mode & 0o700
                };
                self.store(log, conn, r, &target, mode, *umask, *size, *mtime, false)?;
                if target == *path {
                    stored.insert(path.clone());
                }
                Ok(())
            }
        }
    }

    /// Where a logged `Store` of `path` goes: `path`, or (a conflict: the server's copy is
    /// not the one it was changed from) `path.dircache-conflict-TIME`, with why.
    fn store_target(
        &self,
        conn: &Arc<super::Conn>,
        path: &[u8],
        base: &Option<Attr>,
        stored: &HashSet<Vec<u8>>,
    ) -> Result<(Vec<u8>, Option<&'static str>)> {
        if stored.contains(path) {
            return Ok((path.to_vec(), None));
        }
        let cur = conn.call(Request::Getattr {
            path: path.to_vec(),
        });
        let conflict = match (base, &cur) {
            (Some(b), Ok(Reply::Attr(a))) if !same_version(b, a) => Some("changed on the server"),
            (Some(_), Ok(_)) => None,
            (Some(_), Err(Error::NotFound)) => Some("removed on the server"),
            (None, Ok(_)) => Some("made on the server too"),
            (None, Err(Error::NotFound)) => None,
            (_, Err(e)) if e.errno() == libc::ENOENT => base.map(|_| "removed on the server"),
            (_, Err(e)) => return Err(*e),
        };
        Ok(match conflict {
            None => (path.to_vec(), None),
            Some(why) => {
                let mut t = path.to_vec();
                t.extend_from_slice(format!(".dircache-conflict-{}", now().sec).as_bytes());
                (t, Some(why))
            }
        })
    }

    /// A conflict of `path` whose local version goes to `kept`: counted, logged and listed
    /// in the log's `conflicts` (once: a record replayed again finds its line there).
    fn conflict_noted(&self, log: &mut Log, path: &[u8], kept: &[u8], why: &str) {
        let line = format!(
            "\t{}\t{}\t",
            String::from_utf8_lossy(path),
            String::from_utf8_lossy(kept)
        );
        if Log::conflicts_in(log.dir())
            .iter()
            .any(|l| l.contains(&line))
        {
            return;
        }
        tracing::warn!(
            "conflict: {:?} {why} while disconnected; the local version is kept as {:?}",
            String::from_utf8_lossy(path),
            String::from_utf8_lossy(kept)
        );
        self.conflicts.fetch_add(1, Ordering::Relaxed);
        log.note_conflict(path, kept, why);
    }

    /// A logged file's data (record `r`) into `target` on the server, as its writer (with
    /// `excl`, only into a file this call creates).
    #[allow(clippy::too_many_arguments)]
    fn store(
        &self,
        log: &Log,
        conn: &Arc<super::Conn>,
        r: &Record,
        target: &[u8],
        mode: u32,
        umask: u32,
        size: u64,
        mtime: Timespec,
        excl: bool,
    ) -> Result<()> {
        let data = std::fs::File::open(log.data_path(r.seq))?;
        let excl = if excl { libc::O_EXCL } else { 0 };
        let handle = match conn.call_as(
            &r.cred,
            Request::Open {
                path: target.to_vec(),
                flags: libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_NOFOLLOW | excl,
                mode,
                umask,
            },
        )? {
            Reply::Opened { handle, .. } => handle,
            _ => return Err(Error::Os(libc::EPROTO)),
        };
        let res = (|| {
            let mut buf = vec![0u8; MAX_IO];
            let mut off = 0u64;
            while off < size {
                let want = ((size - off) as usize).min(buf.len());
                let n = std::os::unix::fs::FileExt::read_at(&data, &mut buf[..want], off)?;
                if n == 0 {
                    break;
                }
                match conn.call_as(
                    &r.cred,
                    Request::Write {
                        handle,
                        offset: off,
                        data: buf[..n].to_vec(),
                        append: false,
                    },
                )? {
                    Reply::Count(w) if w as usize == n => {}
                    _ => return Err(Error::Os(libc::EIO)),
                }
                off += n as u64;
            }
            let set = SetAttr {
                mtime: Some(TimeSet::At(mtime)),
                ..Default::default()
            };
            match conn.call_as(&r.cred, Request::FileSetattr { handle, set }) {
                Ok(_) | Err(Error::Os(libc::EPERM)) | Err(Error::Os(libc::EACCES)) => Ok(()),
                Err(e) => Err(e),
            }
        })();
        let _ = conn.call(Request::Close { handle });
        res
    }
}
