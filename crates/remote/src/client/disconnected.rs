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
//!   disconnected), never the whole `reconnect_timeout`;
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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use dircache_core::Attr;

use super::reopen::Link;

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
}

#[derive(Debug, Default)]
struct St {
    /// The connection is lost and no new one is installed yet.
    offline: bool,
    /// A loss the reconnector has not taken up yet.
    lost: bool,
    /// The mount is ending: no more reconnecting.
    stopped: bool,
    since: Option<Instant>,
}

impl Disconnected {
    /// Disconnected operation on, calls needing the server waiting at most `grace` while the
    /// server cannot be reached.
    pub fn new(grace: Duration) -> Arc<Disconnected> {
        Arc::new(Disconnected {
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
        self.cv.notify_all();
    }

    /// Whether the client is disconnected now.
    pub fn offline(&self) -> bool {
        self.st.lock().offline
    }

    /// The mount ends: the reconnector stops.
    pub(super) fn stop(&self) {
        let mut st = self.st.lock();
        st.stopped = true;
        self.cv.notify_all();
    }

    fn stopped(&self) -> bool {
        self.st.lock().stopped
    }

    /// A new connection is installed.
    pub(super) fn online(&self) {
        let mut st = self.st.lock();
        if let Some(t) = st.since.take() {
            tracing::warn!("reconnected after {:?} disconnected", t.elapsed());
        }
        st.offline = false;
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

impl super::RemoteBackend {
    /// While disconnected: the attributes of `path` from a valid container (the core cache
    /// forgets a file's attributes when it is closed; the container knows them).
    pub(super) fn offline_attr(&self, path: &[u8]) -> Option<Attr> {
        let d = self.cfg.disconnected.as_ref()?;
        if !d.offline() {
            return None;
        }
        self.cfg.containers.as_ref()?.cached_attr(path)
    }
}
