//! Directory listing streams: stable per-name offsets (cookies) and per-stream snapshots.
//!
//! # Offsets are cookies
//! The offset the kernel gets for an entry (and hands back to resume after it, and what
//! telldir returns) is a cookie derived from the entry's name alone: a 62-bit SipHash of
//! the name under a key drawn at start-up (so nobody outside can make names collide), moved
//! above 2 (0 is "from the start", 1 and 2 are the offsets after `.` and `..`). A snapshot
//! of a directory is served in cookie order, and resuming after cookie X serves the entries
//! of the stream's snapshot whose cookie is greater than X. No offset is an index into a
//! list that may change, as with ext4's htree hash cookies and NFS readdir cookies.
//!
//! Invariant (POSIX readdir): a name that is neither added nor removed while a stream reads
//! a directory appears exactly once in that stream, whichever snapshot each chunk came from,
//! as long as every snapshot used by the stream was taken after the stream started: every
//! such snapshot holds the name under the same cookie, the chunk before it ended below that
//! cookie and the chunk after it starts above it. telldir/seekdir return to the same place
//! (the cookie), after any changes. Tested in `tests/listings.rs`.
//!
//! Collisions (two names, one cookie; odds about n²/2^63 for n names) are served in name
//! order next to each other, and a chunk never ends inside such a run once it has entries
//! before the run, so a resume (after the run's cookie) loses none of them. Like ext4, which
//! also keeps a run of equal hashes in one reply, a run too long for one whole reply
//! buffer (a dozen names, all with one 62-bit hash) would lose the part that did not fit.
//!
//! # Which snapshot a chunk comes from
//! - A stream opened with OPENDIR has its own handle number and snapshot: taken at offset 0
//!   (the start, rewinddir) and kept for every later chunk and seekdir until RELEASEDIR, so a
//!   huge directory is fetched once per pass.
//! - Without OPENDIR (`no_opendir`, FUSE_NO_OPENDIR_SUPPORT) every stream has handle 0. Their
//!   snapshot is shared per directory: every start (offset 0) takes a fresh one, and a newer
//!   fetch replaces an older one only (fetch tickets), so the shared snapshot was taken after
//!   any stream still reading began and serves it correctly by cookie. A resume uses the
//!   shared snapshot as it is (changes made meanwhile need not show, POSIX allows either), so
//!   resuming never re-fetches while a snapshot exists: a listing of n entries costs one
//!   fetch, not one per chunk. It is dropped when a stream reaches the end (a later resume
//!   of another stream then fetches once more; the newest ticket stays as a watermark, so a
//!   slow fetch that began before some stream started cannot come back as the shared
//!   snapshot) and when the kernel forgets the directory. What stays of it is its last
//!   cookie: the kernel's closing request of that stream (at that cookie, answered with no
//!   entries) is answered empty as the dropped snapshot would answer it, instead of fetching
//!   the whole listing again to find nothing after it (one fetch per listing, not two).
//!   Any stream resuming there started before that snapshot was taken (a later start
//!   fetches a newer one, which replaces the marker), so the invariant above holds.
//!
//! Both tables are lock-free maps (papaya) keyed by handle or node id: no global mutex.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use dircache_core::DirEntry;

/// The offset after `..`: cookies of entries are above it.
pub const AFTER_DOTDOT: u64 = 2;

/// Directory handles count up from here, so that none equals an open file's handle (those
/// count up from 1): the kernel passes a directory's handle with some requests on its inode
/// (SETATTR of fchmod/futimens, ioctl), which look handles up among open files.
const FIRST_DIR_FH: u64 = 1 << 63;

/// One snapshot of a directory, in cookie order.
pub struct Snapshot {
    entries: Vec<(u64, DirEntry)>,
}

impl Snapshot {
    /// The entries with their cookies, in cookie order (equal cookies in name order).
    pub fn entries(&self) -> &[(u64, DirEntry)] {
        &self.entries
    }

    /// Index of the first entry to serve when resuming at kernel offset `offset` (the
    /// cookie of the last entry served, or [`AFTER_DOTDOT`] or less for the first entry).
    pub fn resume_at(&self, offset: u64) -> usize {
        self.entries.partition_point(|(c, _)| *c <= offset)
    }

    /// Whether a chunk that already holds entries must end before entry `i`: `i` starts a
    /// run of entries sharing one cookie, which must not be split over two chunks.
    pub fn ends_chunk_before(&self, i: usize, chunk_has_entries: bool) -> bool {
        if !chunk_has_entries {
            return false;
        }
        let c = self.entries[i].0;
        let starts_run = i == 0 || self.entries[i - 1].0 != c;
        starts_run && self.entries.get(i + 1).is_some_and(|(n, _)| *n == c)
    }
}

/// The handle-0 snapshot of one directory: `ticket` is the newest ever stored (kept when
/// the snapshot is dropped at the end of a stream). `end`: the last cookie of the dropped
/// snapshot (AFTER_DOTDOT if it was empty), so the kernel's closing request at that offset
/// (the one that finds nothing more) is answered as that snapshot would answer it, empty,
/// without fetching the whole listing again.
#[derive(Clone)]
struct Shared {
    ticket: u64,
    snapshot: Option<Arc<Snapshot>>,
    end: Option<u64>,
}

/// The state of one stream opened with OPENDIR.
struct Stream {
    snapshot: Option<Arc<Snapshot>>,
}

/// Listing streams of one mount.
pub struct Listings {
    key: std::collections::hash_map::RandomState,
    tickets: AtomicU64,
    next_fh: AtomicU64,
    /// Streams opened with OPENDIR, by handle.
    streams: papaya::HashMap<u64, Arc<Stream>>,
    /// The shared snapshot of handle-0 streams (`no_opendir`), by directory node id.
    shared: papaya::HashMap<u64, Shared>,
}

impl Default for Listings {
    fn default() -> Self {
        Listings::new()
    }
}

impl Listings {
    pub fn new() -> Listings {
        Listings {
            key: std::collections::hash_map::RandomState::new(),
            tickets: AtomicU64::new(1),
            next_fh: AtomicU64::new(FIRST_DIR_FH),
            streams: papaya::HashMap::new(),
            shared: papaya::HashMap::new(),
        }
    }

    /// The cookie of `name`: stable for the life of the mount, above [`AFTER_DOTDOT`], at
    /// most 2^62 (a valid, positive `loff_t` and `telldir` value).
    pub fn cookie(&self, name: &[u8]) -> u64 {
        let h = self.key.hash_one(name) >> 2;
        if h <= AFTER_DOTDOT {
            h + AFTER_DOTDOT + 1
        } else {
            h
        }
    }

    /// OPENDIR: a new stream; returns its handle (never 0, never an open file's).
    pub fn open(&self) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.streams
            .pin()
            .insert(fh, Arc::new(Stream { snapshot: None }));
        fh
    }

    /// RELEASEDIR: the stream and its snapshot go.
    pub fn release(&self, fh: u64) {
        self.streams.pin().remove(&fh);
    }

    /// The kernel forgot directory `nodeid`: a handle-0 snapshot of it goes.
    pub fn forget_dir(&self, nodeid: u64) {
        self.shared.pin().remove(&nodeid);
    }

    /// The snapshot to serve a READDIR of `nodeid` at `offset` on handle `fh` from, if it
    /// needs no fetch: offset 0 (start, rewinddir) always fetches.
    pub fn resume(&self, nodeid: u64, fh: u64, offset: u64) -> Option<Arc<Snapshot>> {
        if offset == 0 {
            return None;
        }
        if fh != 0 {
            if let Some(s) = self.streams.pin().get(&fh) {
                return s.snapshot.clone();
            }
        }
        let shared = self.shared.pin();
        let s = shared.get(&nodeid)?;
        match (&s.snapshot, s.end) {
            (Some(snap), _) => Some(snap.clone()),
            // Past the end of the newest snapshot, which a stream already finished: that
            // snapshot has nothing more to serve.
            (None, Some(end)) if end == offset => Some(Arc::new(Snapshot {
                entries: Vec::new(),
            })),
            (None, _) => None,
        }
    }

    /// A ticket to take before fetching a listing (see [`Listings::store`]).
    pub fn ticket(&self) -> u64 {
        self.tickets.fetch_add(1, Ordering::Relaxed)
    }

    /// A listing fetched after taking `ticket`, put in cookie order and kept for the
    /// stream's next chunks.
    pub fn store(&self, nodeid: u64, fh: u64, ticket: u64, list: Vec<DirEntry>) -> Arc<Snapshot> {
        let mut entries: Vec<(u64, DirEntry)> = list
            .into_iter()
            .map(|e| (self.cookie(&e.name), e))
            .collect();
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.name.cmp(&b.1.name)));
        let snap = Arc::new(Snapshot { entries });
        if fh != 0 {
            let streams = self.streams.pin();
            if streams.contains_key(&fh) {
                streams.insert(
                    fh,
                    Arc::new(Stream {
                        snapshot: Some(snap.clone()),
                    }),
                );
                return snap;
            }
        }
        let new = Shared {
            ticket,
            snapshot: Some(snap.clone()),
            end: None,
        };
        self.shared.pin().update_or_insert(
            nodeid,
            |old| {
                if old.ticket < ticket {
                    new.clone()
                } else {
                    old.clone()
                }
            },
            new.clone(),
        );
        snap
    }

    /// A stream of handle `fh` served the last entry of `snap`. A handle-0 snapshot goes (if
    /// no newer one replaced it); an OPENDIR stream keeps its own for seekdir.
    pub fn finished(&self, nodeid: u64, fh: u64, snap: &Arc<Snapshot>) {
        if fh != 0 && self.streams.pin().contains_key(&fh) {
            return;
        }
        self.shared.pin().update(nodeid, |old| match &old.snapshot {
            Some(s) if Arc::ptr_eq(s, snap) => Shared {
                ticket: old.ticket,
                snapshot: None,
                end: Some(snap.entries.last().map_or(AFTER_DOTDOT, |(c, _)| *c)),
            },
            _ => old.clone(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dircache_core::FileType;

    fn entry(name: &str) -> DirEntry {
        DirEntry {
            name: name.as_bytes().to_vec(),
            kind: FileType::Regular,
            ino: 1,
            attr: None,
        }
    }

    #[test]
    fn cookies_are_stable_ordered_and_above_dotdot() {
        let l = Listings::new();
        assert_eq!(l.cookie(b"a"), l.cookie(b"a"));
        let names: Vec<String> = (0..1000).map(|i| format!("n{i}")).collect();
        let s = l.store(7, 0, l.ticket(), names.iter().map(|n| entry(n)).collect());
        let cookies: Vec<u64> = s.entries().iter().map(|(c, _)| *c).collect();
        assert!(cookies.windows(2).all(|w| w[0] <= w[1]));
        assert!(cookies.iter().all(|c| *c > AFTER_DOTDOT && *c < 1 << 62));
        // Resuming after entry k's cookie serves entry k+1, in another snapshot too.
        let t = l.store(
            7,
            0,
            l.ticket(),
            names.iter().skip(1).map(|n| entry(n)).collect(),
        );
        // An entry that is in both snapshots ("n0" is not in `t`).
        let k = if s.entries()[500].1.name == b"n0" {
            501
        } else {
            500
        };
        let (c, e) = &s.entries()[k];
        let j = t.resume_at(*c);
        assert!(t.entries()[j].0 > *c);
        assert_eq!(t.entries()[j - 1].1.name, e.name);
        assert_eq!(s.resume_at(0), 0);
        assert_eq!(s.resume_at(AFTER_DOTDOT), 0);
    }

    #[test]
    fn an_older_fetch_does_not_replace_a_newer_shared_snapshot() {
        let l = Listings::new();
        let old = l.ticket();
        let new = l.ticket();
        let a = l.store(3, 0, new, vec![entry("x"), entry("y")]);
        let _ = l.store(3, 0, old, vec![entry("x")]);
        let got = l.resume(3, 0, 5).expect("shared snapshot");
        assert!(Arc::ptr_eq(&got, &a));
        // The end of a stream drops the shared snapshot it used.
        l.finished(3, 0, &got);
        assert!(l.resume(3, 0, 5).is_none());
        // A fetch that began before the dropped one cannot come back.
        let _ = l.store(3, 0, old, vec![entry("x")]);
        assert!(l.resume(3, 0, 5).is_none());
        // Offset 0 always fetches.
        let _ = l.store(3, 0, l.ticket(), vec![entry("x")]);
        assert!(l.resume(3, 0, 0).is_none());
    }

    #[test]
    fn the_closing_request_after_a_finished_stream_needs_no_fetch() {
        let l = Listings::new();
        let s = l.store(4, 0, l.ticket(), vec![entry("a"), entry("b"), entry("c")]);
        let last = s.entries()[2].0;
        l.finished(4, 0, &s);
        // At the last cookie served: nothing more, without a fetch.
        let got = l.resume(4, 0, last).expect("answered without a fetch");
        assert!(got.entries().is_empty());
        // Anywhere else it fetches, as before.
        assert!(l.resume(4, 0, s.entries()[0].0).is_none());
        assert!(l.resume(4, 0, 0).is_none());
        // A newer listing (a stream started since) replaces the marker.
        let t = l.store(
            4,
            0,
            l.ticket(),
            vec![entry("a"), entry("b"), entry("c"), entry("d")],
        );
        let got = l.resume(4, 0, last).expect("the newer snapshot");
        assert!(Arc::ptr_eq(&got, &t));
        l.finished(4, 0, &t);
        let tlast = t.entries()[3].0;
        assert!(l.resume(4, 0, tlast).expect("end").entries().is_empty());
        if tlast != last {
            assert!(l.resume(4, 0, last).is_none());
        }
        // An empty directory ends right after "..".
        let e = l.store(5, 0, l.ticket(), vec![]);
        l.finished(5, 0, &e);
        assert!(l
            .resume(5, 0, AFTER_DOTDOT)
            .expect("end")
            .entries()
            .is_empty());
        // The kernel forgetting the directory forgets the marker.
        l.forget_dir(5);
        assert!(l.resume(5, 0, AFTER_DOTDOT).is_none());
    }

    #[test]
    fn opendir_streams_keep_their_own_snapshot_until_release() {
        let l = Listings::new();
        let fh = l.open();
        assert!(fh >= FIRST_DIR_FH);
        let a = l.store(3, fh, l.ticket(), vec![entry("x")]);
        let _other = l.store(3, 0, l.ticket(), vec![entry("y")]);
        let got = l.resume(3, fh, 9).expect("stream snapshot");
        assert!(Arc::ptr_eq(&got, &a));
        l.finished(3, fh, &got);
        assert!(Arc::ptr_eq(&l.resume(3, fh, 9).unwrap(), &a));
        l.release(fh);
        assert!(!Arc::ptr_eq(&l.resume(3, fh, 9).unwrap(), &a));
    }

    #[test]
    fn a_run_of_equal_cookies_is_not_split() {
        let snap = Snapshot {
            entries: vec![
                (5, entry("a")),
                (9, entry("b")),
                (9, entry("c")),
                (12, entry("d")),
            ],
        };
        assert!(!snap.ends_chunk_before(0, true));
        assert!(snap.ends_chunk_before(1, true));
        assert!(!snap.ends_chunk_before(1, false));
        assert!(!snap.ends_chunk_before(2, true));
        assert!(!snap.ends_chunk_before(3, true));
        assert_eq!(snap.resume_at(9), 3);
        assert_eq!(snap.resume_at(5), 1);
    }
}
