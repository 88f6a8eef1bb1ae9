//! The client's own changes, not called back to it (Coda: a client's own stores do not
//! break its own callbacks).
//!
//! A server forwards its change feed to its one client. With fanotify (a root server) the
//! local backend already leaves out the events of the threads that mutate through it
//! (dircache_local, by thread id: exact). With inotify (any other server) every change is
//! reported, this client's own too: each of its creates, writes and unlinks came back as a
//! callback, and the client dropped the fresh entries it had just made (a container stored
//! back was fetched again).
//!
//! So each mutating call registers the paths it changes ([`Echoes::begin`]) and, when it is
//! done, what the client learns of them from the reply ([`Echoes::end`]: the attributes an
//! `Attr` or `OpenedPlus` reply carries, or that the name is gone). A callback for such a
//! path is held ([`Echoes::decide`]) while a call on it runs, and for [`LINGER`] after one
//! whose reply told nothing (a store-back's writes, before its `FileSetattr`); then it is
//! dropped only if the path's attributes now (read after the server's cache applied the
//! change) are exactly what the client was told, and forwarded otherwise. A change by
//! someone else after the reply moves the ctime (a new, fine-grained one on Linux 6.13+ file
//! systems with multigrain timestamps once the reply's ctime was read), the size or the
//! inode: forwarded.
//!
//! **The window.** inotify does not say who made a change: a change by someone else to the
//! same path made while this client's call on it runs (between the call's start on the
//! server and the reading of the attributes its reply carries) is indistinguishable from
//! the call's own, and is dropped when the attributes read after it are the ones the client
//! is told (the client then holds those attributes, which are the server's, but may hold
//! data from before that change). And a change after the reply that leaves every attribute
//! as it was (same size, mtime and ctime: a same-size rewrite within one timestamp tick on a
//! file system without fine-grained timestamps) is dropped too. Nothing else is.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use dircache_core::{Attr, Change, Error};
use parking_lot::Mutex;

/// How long after a call on a path whose reply told nothing its callbacks wait for the next
/// call (a store-back's `FileSetattr` follows its writes one round trip later).
pub const LINGER: Duration = Duration::from_millis(100);
/// How long a callback is held at most while calls on its path run.
pub const MAX_HOLD: Duration = Duration::from_secs(2);
/// Records older than this (with no call running) are forgotten.
const KEEP: Duration = Duration::from_secs(5);
/// Most paths recorded; beyond, the oldest settled ones go.
const MAX_PATHS: usize = 65536;

/// What the client was told of a path by its last own call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Post {
    /// Nothing (a write's count): its callbacks are forwarded.
    Unknown,
    /// The name is gone (unlink, rmdir, the old name of a rename).
    Absent,
    /// These attributes.
    Attr(Attr),
}

#[derive(Debug)]
struct Own {
    /// Calls on the path running.
    running: u32,
    post: Post,
    /// When the last one ended.
    done: Instant,
}

/// A callback held, and since when.
pub struct Held {
    pub change: Change,
    since: Instant,
}

/// What to do with a callback.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    Forward,
    Drop,
    /// Ask again later (a call on its path runs, or may follow).
    Wait,
}

#[derive(Default)]
pub struct Echoes {
    paths: Mutex<HashMap<Vec<u8>, Own>>,
    /// Callbacks dropped as this client's own (for the log).
    pub dropped: std::sync::atomic::AtomicU64,
}

/// The attributes that tell the client's version from another: all but the access time and
/// the blocks (allocation may settle later without an event).
fn same(a: &Attr, b: &Attr) -> bool {
    (
        a.dev, a.ino, a.mode, a.nlink, a.uid, a.gid, a.rdev, a.size, a.mtime, a.ctime,
    ) == (
        b.dev, b.ino, b.mode, b.nlink, b.uid, b.gid, b.rdev, b.size, b.mtime, b.ctime,
    )
}

impl Echoes {
    /// A call changing `paths` starts.
    pub fn begin(&self, paths: &[Vec<u8>]) {
        let mut m = self.paths.lock();
        if m.len() >= MAX_PATHS {
            let now = Instant::now();
            m.retain(|_, o| o.running > 0 || now.duration_since(o.done) < KEEP);
            if m.len() >= MAX_PATHS {
                m.retain(|_, o| o.running > 0);
            }
        }
        for p in paths {
            let o = m.entry(p.clone()).or_insert(Own {
                running: 0,
                post: Post::Unknown,
                done: Instant::now(),
            });
            o.running += 1;
        }
    }

    /// The call that changed `paths` ended, telling the client `posts` (one per path).
    pub fn end(&self, paths: &[Vec<u8>], posts: &[Post]) {
        let mut m = self.paths.lock();
        let now = Instant::now();
        for (i, p) in paths.iter().enumerate() {
            if let Some(o) = m.get_mut(p) {
                o.running = o.running.saturating_sub(1);
                o.post = posts.get(i).copied().unwrap_or(Post::Unknown);
                o.done = now;
            }
        }
    }

    /// Whether callbacks about `path` must be decided by [`Echoes::decide`].
    pub fn concerns(&self, change: &Change) -> bool {
        match change {
            Change::Attr { path } | Change::Entry { path } => {
                self.paths.lock().contains_key(path.as_slice())
            }
            _ => false,
        }
    }

    /// Hold `change` (it [`concerns`](Echoes::concerns) a path of an own call).
    pub fn hold(change: Change) -> Held {
        Held {
            change,
            since: Instant::now(),
        }
    }

    /// What to do with `h` now; `now_attr` reads the path's attributes as they are now.
    pub fn decide(
        &self,
        h: &Held,
        now_attr: impl FnOnce(&[u8]) -> Result<Attr, Error>,
    ) -> Decision {
        let (Change::Attr { path } | Change::Entry { path }) = &h.change else {
            return Decision::Forward;
        };
        let now = Instant::now();
        let post = {
            let m = self.paths.lock();
            let Some(o) = m.get(path.as_slice()) else {
                return Decision::Forward;
            };
            if now.duration_since(h.since) >= MAX_HOLD {
                return Decision::Forward;
            }
            if o.running > 0 {
                return Decision::Wait;
            }
            if o.post == Post::Unknown {
                return if now.duration_since(o.done) < LINGER {
                    Decision::Wait
                } else {
                    Decision::Forward
                };
            }
            o.post
        };
        let d = match (post, now_attr(path)) {
            (Post::Absent, Err(Error::NotFound)) => Decision::Drop,
            (Post::Attr(a), Ok(b)) if same(&a, &b) => Decision::Drop,
            _ => Decision::Forward,
        };
        if d == Decision::Drop {
            self.dropped
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        d
    }

    /// Forget records of calls long over.
    pub fn prune(&self) {
        let now = Instant::now();
        self.paths
            .lock()
            .retain(|_, o| o.running > 0 || now.duration_since(o.done) < KEEP);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(size: u64) -> Attr {
        Attr {
            ino: 7,
            size,
            mode: libc::S_IFREG | 0o644,
            nlink: 1,
            ..Attr::default()
        }
    }

    /// A foreign change to a path this client keeps changing (its own calls on it running,
    /// or ending with nothing told, one after the other: a stream of writes) is held while
    /// they go on, but called back at the latest [`MAX_HOLD`] after it came, calls or not.
    #[test]
    fn a_foreign_change_is_called_back_by_the_cap_while_own_calls_go_on() {
        let e = Echoes::default();
        let p = b"dir/f".to_vec();
        // The client touched the path: one of its calls ended, with attributes told.
        e.begin(std::slice::from_ref(&p));
        e.end(std::slice::from_ref(&p), &[Post::Attr(attr(5))]);
        // Someone else changes it (size 9) while the client keeps writing to it.
        let h = Echoes::hold(Change::Attr { path: p.clone() });
        let t0 = Instant::now();
        let limit = MAX_HOLD * 2;
        let mut i = 0u32;
        let forwarded = loop {
            // Every 20 ms a write (nothing told), half of the time still running when the
            // callback is looked at.
            e.begin(std::slice::from_ref(&p));
            let running = i % 2 == 1;
            if !running {
                e.end(std::slice::from_ref(&p), &[Post::Unknown]);
            }
            let d = e.decide(&h, |_| Ok(attr(9)));
            if running {
                e.end(std::slice::from_ref(&p), &[Post::Unknown]);
            }
            i += 1;
            match d {
                Decision::Wait if t0.elapsed() < limit => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                d => break (d, t0.elapsed()),
            }
        };
        assert_eq!(
            forwarded.0,
            Decision::Forward,
            "held {:?} behind the client's own calls (cap {MAX_HOLD:?})",
            forwarded.1
        );
        assert!(
            forwarded.1 >= MAX_HOLD && forwarded.1 < MAX_HOLD + Duration::from_millis(500),
            "called back after {:?}, the cap is {MAX_HOLD:?}",
            forwarded.1
        );
    }

    /// Once the client's calls are over, a foreign change that left other attributes than
    /// the client was told is called back at once, and one that left them as told (the
    /// client's own echo) is dropped.
    #[test]
    fn after_the_calls_a_foreign_change_goes_and_an_echo_is_dropped() {
        let e = Echoes::default();
        let p = b"f".to_vec();
        e.begin(std::slice::from_ref(&p));
        e.end(std::slice::from_ref(&p), &[Post::Attr(attr(5))]);
        let h = Echoes::hold(Change::Attr { path: p.clone() });
        assert_eq!(e.decide(&h, |_| Ok(attr(9))), Decision::Forward);
        assert_eq!(e.decide(&h, |_| Ok(attr(5))), Decision::Drop);
    }
}
