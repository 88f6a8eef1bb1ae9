//! Reconnecting, and the files open across a reconnection.
//!
//! [`Link`] is what a [`RemoteBackend`](super::RemoteBackend) and its open files share: the
//! live connection, and how to make a new one when it is lost (with backoff, within
//! [`ClientConfig::reconnect_timeout`]). A [`RemoteFile`](super::RemoteFile) names a handle
//! on one connection; after a reconnection the file is opened again on the new server
//! ([`OpenState::revive`]):
//!
//! - with the credentials and flags it was opened with, minus `O_CREAT`, `O_EXCL` and
//!   `O_TRUNC` (nothing is created or truncated again), plus `O_NOFOLLOW | O_NONBLOCK` (a
//!   symlink or FIFO put at its path is refused or not waited for), at the path it was opened
//!   at (followed through renames made by this client);
//! - only if what opens is the very file that was opened: its `(dev, ino)`, as the old
//!   server reported it for the handle, else the new handle is closed and the file fails
//!   with EIO from then on (removed, replaced, renamed on the server: never another file's
//!   data). A file whose identity was never asked (no `FileAttr` before the connection
//!   ended: the FUSE front end asks right after every open) fails the same way.
//!
//! Every file is reopened by the reconnection's attempt loop before the calls waiting for it
//! go on (so that the file
//! is pinned before anything else can replace it on the server); a file busy at that moment
//! (its own thread is reopening it) is left to that thread. A call in flight when the
//! connection ended still gets EIO (it may or may not have run: calls are never repeated).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use dircache_core::{Change, Error, RenameMode, Result};
use parking_lot::{Condvar, Mutex};

use super::disconnected::Disconnected;
use super::{eio, new_conn, ClientConfig, Conn, Connector};
use crate::prefetch::Prefetch;
use crate::proto::{ProtoError, Reply, Request, WireCred};

/// The connection a backend and its files share, and how to get a new one.
pub(super) struct Link {
    pub(super) conn: Arc<Mutex<Arc<Conn>>>,
    connector: Option<Connector>,
    cfg: ClientConfig,
    /// Held while installing a new connection.
    reconnecting: Mutex<()>,
    /// The reconnection under way, shared by the calls waiting for it.
    retry: Mutex<Retry>,
    /// Signalled when an attempt loop ends (connected or given up).
    retried: Condvar,
    /// The backend was dropped.
    stopped: AtomicBool,
    callbacks: Arc<Mutex<Option<Sender<Change>>>>,
    lost: Arc<AtomicBool>,
    prefetch: Arc<Mutex<Prefetch>>,
    round_trips: Arc<super::CallCounts>,
    /// The files open through this backend, to reopen after a reconnection.
    files: Mutex<HashMap<u64, Weak<OpenState>>>,
    next_file: AtomicU64,
}

/// The reconnection under way (at most one attempt loop at a time).
#[derive(Default)]
struct Retry {
    /// An attempt loop runs, on a thread of its own.
    running: bool,
    /// It keeps trying until then: the latest deadline of the calls that waited for it.
    until: Option<Instant>,
}

impl Link {
    pub(super) fn new(
        conn: Arc<Mutex<Arc<Conn>>>,
        connector: Option<Connector>,
        cfg: ClientConfig,
        callbacks: Arc<Mutex<Option<Sender<Change>>>>,
        lost: Arc<AtomicBool>,
        prefetch: Arc<Mutex<Prefetch>>,
        round_trips: Arc<super::CallCounts>,
    ) -> Link {
        Link {
            conn,
            connector,
            cfg,
            reconnecting: Mutex::new(()),
            retry: Mutex::new(Retry::default()),
            retried: Condvar::new(),
            stopped: AtomicBool::new(false),
            callbacks,
            lost,
            prefetch,
            round_trips,
            files: Mutex::new(HashMap::new()),
            next_file: AtomicU64::new(1),
        }
    }

    /// The live connection: the current one, or (after it was lost) a new one, waiting up to
    /// the reconnect timeout with backoff; EIO when there is none. A new connection gets the
    /// open files reopened on it before this returns.
    pub(super) fn conn(self: &Arc<Self>) -> Result<Arc<Conn>> {
        let c = self.conn.lock().clone();
        if !c.closed.load(Ordering::SeqCst) {
            return Ok(c);
        }
        if let Some(d) = self.disconnected() {
            return self.wait_for_reconnector(d);
        }
        if self.connector.is_none() || self.cfg.reconnect_timeout.is_zero() {
            return Err(eio());
        }
        self.wait_for_reconnection(Instant::now() + self.cfg.reconnect_timeout)
    }

    /// Wait until `deadline` for a new connection, made by the one attempt loop that serves
    /// every waiting call ([`Link::reconnect_loop`], started if none runs): EIO when there is
    /// none by then. However many calls wait, none waits past its own deadline (before, each
    /// call queued behind a failing loop ran a whole loop of its own after it: the last of N
    /// calls waited N times `reconnect_timeout`).
    fn wait_for_reconnection(self: &Arc<Self>, deadline: Instant) -> Result<Arc<Conn>> {
        let mut r = self.retry.lock();
        loop {
            // Checked under `retry`: the loop publishes a connection before it takes `retry`
            // to wake the waiters, so no wake-up is missed.
            let c = self.conn.lock().clone();
            if !c.closed.load(Ordering::SeqCst) {
                return Ok(c);
            }
            if Instant::now() >= deadline || self.stopped.load(Ordering::SeqCst) {
                return Err(eio());
            }
            r.until = Some(r.until.map_or(deadline, |u| u.max(deadline)));
            if !r.running {
                let me = self.clone();
                let spawned = std::thread::Builder::new()
                    .name("dircache-reconnect".into())
                    .spawn(move || me.reconnect_loop());
                if let Err(e) = spawned {
                    tracing::error!("cannot start reconnecting: {e}");
                    return Err(eio());
                }
                r.running = true;
            }
            self.retried.wait_until(&mut r, deadline);
        }
    }

    /// The backend is gone: no new connection is made or kept from now on.
    pub(super) fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
    }

    /// Disconnected operation, when it is on (client/disconnected.rs): a client with a
    /// connector that reconnects.
    pub(super) fn disconnected(&self) -> Option<&Arc<Disconnected>> {
        self.cfg
            .disconnected
            .as_ref()
            .filter(|_| self.connector.is_some() && !self.cfg.reconnect_timeout.is_zero())
    }

    /// Disconnected: wait for the reconnector at most `d.grace`, then ETIMEDOUT; at once
    /// when the server is known unreachable (an attempt since the loss failed). While the
    /// log is replayed on a new connection, wait for it as long as the replay makes progress
    /// (a record reintegrated at least every `reconnect_timeout`).
    fn wait_for_reconnector(&self, d: &Arc<Disconnected>) -> Result<Arc<Conn>> {
        let mut end = Instant::now() + d.grace.min(self.cfg.reconnect_timeout);
        let mut counted = false;
        let mut progress = None;
        loop {
            let c = self.conn.lock().clone();
            if !c.closed.load(Ordering::SeqCst) {
                return Ok(c);
            }
            let now = Instant::now();
            if d.is_installing() && !d.stopped() {
                // Reintegrated: the connection is published once the front end has applied
                // the reconnection's Overflow (`install`, bounded).
                d.wait(Duration::from_millis(20));
                continue;
            }
            if let Some(done) = d.is_replaying().filter(|_| !d.stopped()) {
                // The server is reachable: its answer comes once the log is replayed.
                if progress != Some(done) {
                    progress = Some(done);
                    end = now + self.cfg.reconnect_timeout;
                }
            }
            if now >= end || d.unreachable() {
                return Err(Error::Os(libc::ETIMEDOUT));
            }
            if !counted {
                counted = true;
                d.offline_waits.fetch_add(1, Ordering::Relaxed);
            }
            // Polled too: the loss may not be registered yet.
            d.wait((end - now).min(Duration::from_millis(50)));
        }
    }

    /// One attempt at a new connection (the reconnector's).
    pub(super) fn connect_once(&self) -> std::result::Result<Arc<Conn>, ProtoError> {
        let Some(connect) = &self.connector else {
            return Err(ProtoError::Closed);
        };
        connect()
            .map_err(|e| ProtoError::Frame(e.into()))
            .and_then(|t| {
                new_conn(
                    t,
                    &self.cfg,
                    self.callbacks.clone(),
                    self.lost.clone(),
                    self.prefetch.clone(),
                    self.round_trips.clone(),
                    // Until `install` sends the Overflow that subsumes them.
                    true,
                )
            })
    }

    /// Make `new` the live connection after a disconnection: the promises are broken first
    /// (containers invalid, the cache and the kernel told `Overflow` and seen to apply it),
    /// then calls may use it, then the open files are reopened on it.
    pub(super) fn install(&self, new: Arc<Conn>) {
        if let Some(d) = self.disconnected() {
            d.replaying();
        }
        let _one = self.reconnecting.lock();
        // The modification log first, in order; held until the connection is published, so
        // that nothing is logged meanwhile (client/cml.rs).
        let mut log = self.cfg.disconnected.as_ref().map(|d| d.cml.lock());
        if let (Some(d), Some(g)) = (&self.cfg.disconnected, log.as_mut()) {
            if !d.reintegrate_all(g, &new) {
                d.replay_abandoned();
                return;
            }
            // From now on nothing is answered from what was known while disconnected (it
            // would come back into the cache after the Overflow below, made-up inode
            // numbers and all): calls wait for the connection, published below.
            d.installing();
        }
        if let Some(cc) = &self.cfg.containers {
            cc.invalidate_all();
        }
        let barrier = self.cfg.disconnected.as_ref().and_then(|d| {
            let guard = self.callbacks.lock();
            // Callbacks from now on come after the Overflow (those before are subsumed).
            new.muted.store(false, Ordering::SeqCst);
            let tx = guard.as_ref()?;
            if tx.try_send(Change::Overflow).is_err() {
                self.lost.store(true, Ordering::Relaxed);
                return None;
            }
            self.lost.store(false, Ordering::Relaxed);
            let n = d.next_barrier();
            tx.try_send(Change::Inode {
                dev: super::disconnected::BARRIER_DEV,
                ino: n,
            })
            .ok()?;
            Some((d.clone(), n))
        });
        if let Some((d, n)) = barrier {
            if !d.wait_barrier(n, Duration::from_secs(10)) {
                tracing::warn!("the front end did not apply the reconnection's Overflow in 10 s");
            }
        }
        *self.conn.lock() = new.clone();
        if let Some(d) = &self.cfg.disconnected {
            d.online();
        }
        drop(log);
        drop(_one);
        self.reopen_all(&new);
    }

    /// Try to connect again, with backoff, for as long as a call waits ([`Retry::until`]);
    /// then wake every waiting call. A new connection is published and the open files are
    /// reopened on it (those not busy: a file's own thread waiting for this reopens itself)
    /// before the waiting calls go on.
    fn reconnect_loop(self: Arc<Self>) {
        let mut delay = Duration::from_millis(50);
        while let Some(connect) = self.connector.as_ref().filter(|_| !self.stopped()) {
            let attempt = connect()
                .map_err(|e| ProtoError::Frame(e.into()))
                .and_then(|t| {
                    new_conn(
                        t,
                        &self.cfg,
                        self.callbacks.clone(),
                        self.lost.clone(),
                        self.prefetch.clone(),
                        self.round_trips.clone(),
                        false,
                    )
                });
            match attempt {
                Ok(new) => {
                    {
                        let _one = self.reconnecting.lock();
                        *self.conn.lock() = new.clone();
                    }
                    if self.stopped() {
                        // The backend was dropped meanwhile (it shut down what it saw).
                        new.shutdown();
                        break;
                    }
                    tracing::warn!("reconnected to the server");
                    // An Overflow the full feed could not take when the connection ended
                    // goes now, not with the next callback.
                    if self.lost.load(Ordering::Relaxed) {
                        if let Some(tx) = self.callbacks.lock().as_ref() {
                            if tx.try_send(Change::Overflow).is_ok() {
                                self.lost.store(false, Ordering::Relaxed);
                            }
                        }
                    }
                    self.reopen_all(&new);
                    break;
                }
                Err(e) => {
                    tracing::warn!("reconnecting: {e}");
                    let until = self.retry.lock().until;
                    if until.is_none_or(|u| Instant::now() + delay > u) {
                        break;
                    }
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
            }
        }
        let mut r = self.retry.lock();
        r.running = false;
        r.until = None;
        self.retried.notify_all();
    }

    fn stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// Reopen every open file not busy on `live`.
    fn reopen_all(&self, live: &Arc<Conn>) {
        let files: Vec<Arc<OpenState>> = self
            .files
            .lock()
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        for f in files {
            if let Some(mut at) = f.at.try_lock() {
                // A failure is logged and remembered by the file (EIO from then on).
                let _ = f.revive(&mut at, live);
            }
        }
    }

    /// Keep `f` for reopening; the returned id forgets it ([`Link::forget`]).
    pub(super) fn register(&self, f: &Arc<OpenState>) -> u64 {
        let id = self.next_file.fetch_add(1, Ordering::Relaxed);
        let mut files = self.files.lock();
        files.retain(|_, w| w.strong_count() > 0);
        files.insert(id, Arc::downgrade(f));
        id
    }

    pub(super) fn forget(&self, id: u64) {
        self.files.lock().remove(&id);
    }

    /// This client renamed `old` to `new` (`mode`): open files below either follow.
    pub(super) fn renamed(&self, old: &[u8], new: &[u8], mode: RenameMode) {
        let files: Vec<Arc<OpenState>> = self
            .files
            .lock()
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        for f in files {
            let mut at = f.at.lock();
            if let Some(p) = moved(&at.path, old, new) {
                at.path = p;
            } else if mode == RenameMode::Exchange {
                if let Some(p) = moved(&at.path, new, old) {
                    at.path = p;
                }
            }
        }
    }
}

/// `path` with the prefix `from` (a whole component path) replaced by `to`, if it has it.
fn moved(path: &[u8], from: &[u8], to: &[u8]) -> Option<Vec<u8>> {
    let rest = path.strip_prefix(from)?;
    if !rest.is_empty() && rest[0] != b'/' {
        return None;
    }
    let mut p = to.to_vec();
    p.extend_from_slice(rest);
    Some(p)
}

/// An open file's state: its handle on a connection, and what reopening it needs.
pub(super) struct OpenState {
    /// The opener's credentials and open(2) flags.
    cred: WireCred,
    flags: i32,
    pub(super) at: Mutex<At>,
}

/// Where an open file is open now.
pub(super) struct At {
    pub(super) conn: Arc<Conn>,
    pub(super) handle: u64,
    /// Its path on the server (followed through this client's renames).
    path: Vec<u8>,
    /// `(dev, ino)` of the file that was opened, once the server said.
    pub(super) ident: Option<(u64, u64)>,
    /// It could not be reopened: EIO for good.
    broken: bool,
}

impl OpenState {
    pub(super) fn new(
        conn: Arc<Conn>,
        handle: u64,
        path: &[u8],
        cred: WireCred,
        flags: i32,
        ident: Option<(u64, u64)>,
    ) -> OpenState {
        OpenState {
            cred,
            flags,
            at: Mutex::new(At {
                conn,
                handle,
                path: path.to_vec(),
                ident,
                broken: false,
            }),
        }
    }

    /// Its path on the server now (followed through this client's renames).
    pub(super) fn path(&self) -> Vec<u8> {
        self.at.lock().path.clone()
    }

    /// The live connection and handle, reopening the file on a new connection (through
    /// `link`) after the old one was lost.
    pub(super) fn live(&self, link: &Arc<Link>) -> Result<(Arc<Conn>, u64)> {
        let mut at = self.at.lock();
        if at.broken {
            return Err(eio());
        }
        if !at.conn.closed.load(Ordering::SeqCst) {
            return Ok((at.conn.clone(), at.handle));
        }
        let live = link.conn()?;
        self.revive(&mut at, &live)?;
        Ok((at.conn.clone(), at.handle))
    }

    /// Reopen on `live` if `at` is on a lost connection (module docs).
    fn revive(&self, at: &mut At, live: &Arc<Conn>) -> Result<()> {
        if at.broken {
            return Err(eio());
        }
        if !at.conn.closed.load(Ordering::SeqCst) {
            return Ok(());
        }
        let path = String::from_utf8_lossy(&at.path).into_owned();
        let Some(ident) = at.ident else {
            return fail(at, &path, "its identity was never known");
        };
        let flags = (self.flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC))
            | libc::O_NOFOLLOW
            | libc::O_NONBLOCK;
        let opened = live.call_as(
            &self.cred,
            Request::Open {
                path: at.path.clone(),
                flags,
                mode: 0,
                umask: 0,
            },
        );
        let handle = match opened {
            Ok(Reply::Opened { handle, .. }) => handle,
            Ok(_) => return fail(at, &path, "a reply that is not a handle"),
            // The new connection ended too: the next one may do.
            Err(_) if live.closed.load(Ordering::SeqCst) => return Err(eio()),
            Err(e) => return fail(at, &path, &format!("{e}")),
        };
        let same = match live.call(Request::FileAttr { handle }) {
            Ok(Reply::Attr(a)) => (a.dev, a.ino) == ident,
            _ => false,
        };
        if !same {
            let _ = live.call(Request::Close { handle });
            if live.closed.load(Ordering::SeqCst) {
                return Err(eio());
            }
            return fail(at, &path, "another file is at its path now");
        }
        tracing::info!("reopened {path:?} on the new connection");
        at.conn = live.clone();
        at.handle = handle;
        Ok(())
    }
}

fn fail(at: &mut At, path: &str, why: &str) -> Result<()> {
    tracing::warn!("an open file ({path:?}) cannot be reopened after reconnecting: {why}");
    at.broken = true;
    Err(eio())
}

#[cfg(test)]
mod tests {
    use super::moved;

    #[test]
    fn paths_follow_renames_by_whole_components() {
        assert_eq!(moved(b"a/b", b"a", b"x"), Some(b"x/b".to_vec()));
        assert_eq!(moved(b"a", b"a", b"x/y"), Some(b"x/y".to_vec()));
        assert_eq!(moved(b"ab/c", b"a", b"x"), None);
        assert_eq!(moved(b"b", b"a", b"x"), None);
    }
}
