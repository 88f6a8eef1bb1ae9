//! The notifier thread: the only place that tells the kernel to drop cached entries,
//! attributes, listings and data.
//!
//! Sending a notification from a request handler can deadlock (the kernel may hold the
//! directory's lock while it waits for that very request), so request handlers only queue
//! [`NotifyMsg`]s and this thread sends them. It also reads the backend's change feed (changes
//! made directly in SRC), applies each change to the core cache and turns what the core
//! dropped into `inval_entry` / `inval_inode`.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{never, select, Receiver};
use dircache_core::{At, Cache, Change, ChangeFeed, Cred, FileType, Invalidation, LookupFlags};
use fuser::{INodeNo, Notifier};

use crate::inodes::Inodes;
use crate::stats::RequestCounters;

/// Work for the notifier thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotifyMsg {
    /// Drop the kernel's attributes (and data / listing) of a nodeid.
    InvalInode(u64),
    /// Drop the kernel's entry `name` in directory nodeid.
    InvalEntry(u64, Vec<u8>),
    /// A change learned by someone else (as the backend's feed would report it).
    Change(Change),
    /// Exit the thread.
    Stop,
}

/// Where notifications go: the kernel in production, a recorder in tests.
pub trait Sink: Send + 'static {
    fn inval_entry(&self, parent: u64, name: &[u8]) -> std::io::Result<()>;
    fn inval_inode(&self, ino: u64) -> std::io::Result<()>;
    /// Make every dentry of the connection fail its next revalidation, negative ones
    /// included (`FUSE_NOTIFY_INC_EPOCH`).
    fn inc_epoch(&self) -> std::io::Result<()> {
        Err(std::io::ErrorKind::Unsupported.into())
    }
}

impl Sink for Notifier {
    fn inval_entry(&self, parent: u64, name: &[u8]) -> std::io::Result<()> {
        Notifier::inval_entry(self, INodeNo(parent), OsStr::from_bytes(name))
    }
    fn inval_inode(&self, ino: u64) -> std::io::Result<()> {
        Notifier::inval_inode(self, INodeNo(ino), 0, 0)
    }
    fn inc_epoch(&self) -> std::io::Result<()> {
        Notifier::inc_epoch(self)
    }
}

/// The first FUSE ABI minor version with `FUSE_NOTIFY_INC_EPOCH` (Linux 6.16).
pub const INC_EPOCH_MINOR: u32 = 44;

/// One batch of kernel notifications, deduplicated.
#[derive(Default, Debug, PartialEq, Eq)]
pub struct Batch {
    pub entries: Vec<(u64, Vec<u8>)>,
    pub inodes: Vec<u64>,
    /// Every kernel dentry must go, also the negative ones nobody can name (a broken
    /// callback promise: `Overflow`). Sent as one epoch increment where the kernel has it;
    /// `entries` then holds the names to drop one by one where it has not.
    pub all_entries: bool,
    seen_e: HashSet<(u64, Vec<u8>)>,
    seen_i: HashSet<u64>,
}

impl Batch {
    pub fn entry(&mut self, parent: u64, name: &[u8]) {
        if self.seen_e.insert((parent, name.to_vec())) {
            self.entries.push((parent, name.to_vec()));
        }
    }
    pub fn inode(&mut self, ino: u64) {
        if self.seen_i.insert(ino) {
            self.inodes.push(ino);
        }
    }
}

/// Split a backend path into (parent path, last name).
pub fn split_path(path: &[u8]) -> (&[u8], &[u8]) {
    match path.iter().rposition(|b| *b == b'/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (&path[..0], path),
    }
}

pub struct NotifierState {
    pub cache: Arc<Cache>,
    pub inodes: Arc<Inodes>,
    pub counters: Arc<RequestCounters>,
    /// The FUSE ABI minor version the kernel announced at INIT (0: unknown).
    pub kernel_minor: u32,
    /// The kernel refused an epoch increment, or its version lacks it (logged once).
    pub no_epoch: AtomicBool,
}

impl NotifierState {
    /// A notifier's state for a kernel of FUSE ABI minor version `kernel_minor`.
    pub fn new(
        cache: Arc<Cache>,
        inodes: Arc<Inodes>,
        counters: Arc<RequestCounters>,
        kernel_minor: u32,
    ) -> NotifierState {
        NotifierState {
            cache,
            inodes,
            counters,
            kernel_minor,
            no_epoch: AtomicBool::new(false),
        }
    }

    /// Increment the connection's epoch; `false` when the kernel cannot (older than ABI
    /// 7.44, or it refused): the caller drops the names it knows one by one instead, and
    /// negative entries stay until their TTL ends (logged once).
    fn inc_epoch(&self, sink: &dyn Sink) -> bool {
        if self.no_epoch.load(Ordering::Relaxed) {
            return false;
        }
        let why = if self.kernel_minor < INC_EPOCH_MINOR {
            format!(
                "the kernel's FUSE ABI 7.{} is older than 7.{INC_EPOCH_MINOR}",
                self.kernel_minor
            )
        } else {
            match sink.inc_epoch() {
                Ok(()) => {
                    self.counters
                        .notify_inc_epoch
                        .fetch_add(1, Ordering::Relaxed);
                    return true;
                }
                Err(e) => format!("the kernel refused FUSE_NOTIFY_INC_EPOCH: {e}"),
            }
        };
        if !self.no_epoch.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "{why}: after lost changes, kernel negative entries stay until their TTL ends \
                 (known names are dropped one by one)"
            );
        }
        false
    }

    fn dir_nodeid(&self, dir_path: &[u8]) -> Option<u64> {
        if dir_path.is_empty() {
            return Some(self.inodes.root());
        }
        let c = self.cache.kernel_checked(Cred::root());
        let mut p = Vec::with_capacity(dir_path.len() + 1);
        p.push(b'/');
        p.extend_from_slice(dir_path);
        let node = self
            .cache
            .lookup(&c, At::Root, &p, LookupFlags::NOFOLLOW)
            .ok()?;
        self.inodes.nodeid_of(&node)
    }

    /// The core's live positive dentry `name` in directory `parent` (a nodeid), if it has
    /// one, without looking the name up: the notifier must not fill the cache with names
    /// nobody looked up. Cached by a report, a name keeps the attributes of the moment the
    /// report was applied, and no later report corrects them when the next change is one
    /// the feed does not see (an atime-only utimensat, a read in SRC: FS_ACCESS). A name the
    /// kernel holds is cached (held names are pinned), so its nodeid is found this way.
    /// (Looked up here for an `Attr` report, a file written by `cp` in SRC was cached with
    /// the atime it had before a `touch -a` that followed: `identity.rs::
    /// atime_after_read_matches_native` failed every run once a creation's report no longer
    /// cached the name first, `f4b0e4f`; `feed_coverage.rs::
    /// a_reported_write_caches_nothing_an_unreported_atime_change_leaves_stale`.)
    fn cached_child(&self, parent: u64, name: &[u8]) -> Option<dircache_core::NodeRef> {
        self.inodes
            .get(parent)?
            .cached_child(name)
            .filter(|n| !n.is_dead() && n.file_type().is_some())
    }

    /// What to tell the kernel for `change`.
    pub fn plan_change(&self, change: &Change) -> Batch {
        let mut b = Batch::default();
        // An ACL may have appeared (setfacl, or a new file inheriting a default ACL): the
        // core's `apply_change` forgets its xattr-absence memo.
        // Resolve the parent before the core drops it (a removed directory's own entry).
        let (path, attr_only) = match change {
            Change::Attr { path } if self.cache.backend().own_write_change(change) => {
                self.own_write(path, &mut b);
                return b;
            }
            Change::Attr { path } => (Some(path.clone()), true),
            Change::Entry { path } => (Some(path.clone()), false),
            Change::Inode { dev, ino } => {
                let invals = self.cache.apply_change(change);
                self.plan_invalidations(&invals, &mut b);
                self.inode_changed(*dev, *ino, &mut b);
                return b;
            }
            Change::Overflow => (None, false),
        };
        let pre_parent = path.as_ref().and_then(|p| self.dir_nodeid(split_path(p).0));
        let invals = self.cache.apply_change(change);
        self.plan_invalidations(&invals, &mut b);
        if let (Some(p), Some(parent)) = (&path, pre_parent) {
            let name = split_path(p).1;
            if !name.is_empty() {
                if !attr_only {
                    b.entry(parent, name);
                    b.inode(parent);
                }
                if attr_only {
                    if let Some(id) = self
                        .cached_child(parent, name)
                        .and_then(|n| self.inodes.nodeid_of(&n))
                    {
                        b.inode(id);
                    }
                }
                // The kernel knows each inode once, by (dev, ino), whatever names it was
                // reached by: a change through another name (chmod, ln) must reach it too.
                // Asked of the backend directly: the notifier must not fill the cache with
                // names nobody looked up (their attributes could then go stale through
                // changes the feed does not report, such as an atime-only utimensat).
                let (dir, _) = split_path(p);
                if let Ok(a) = self.cache.backend().lookup(dir, name) {
                    if a.kind() != FileType::Directory {
                        self.inode_changed(a.dev, a.ino, &mut b);
                    }
                }
            } else if attr_only {
                b.inode(parent);
            }
        }
        if matches!(change, Change::Overflow) {
            // Changes were lost: any dentry may be stale, also a negative one answered from
            // what the cache knew before it forgot (a LOOKUP racing the overflow, or made
            // before changes the feed never reported). Only the epoch reaches those.
            b.all_entries = true;
            for (id, node) in self.inodes.all() {
                b.inode(id);
                if let Some(parent) = node.parent().and_then(|p| self.inodes.nodeid_of(&p)) {
                    b.entry(parent, &node.name());
                }
            }
        }
        b
    }

    /// `path` was written through the mount (a passthrough write, `fs/own_writes.rs`): the
    /// kernel invalidated its own copy of the size and times at the write, so only the core
    /// forgets its attributes (of every name of the inode).
    ///
    /// The backend marks reports, not events: a report of `path` made for another change
    /// may take the mark of an own write reported after it, in which case that later report
    /// is handled in full; a change is thus never left unreported to the kernel, only its
    /// invalidation sent with a later report of the same path.
    fn own_write(&self, path: &[u8], b: &mut Batch) {
        self.counters.own_writes.fetch_add(1, Ordering::Relaxed);
        let (dir, name) = split_path(path);
        let pre = self.dir_nodeid(dir);
        let invals = self.cache.apply_change(&Change::Attr {
            path: path.to_vec(),
        });
        // What the core dropped besides the file's attributes (nothing, for a file): told.
        self.plan_invalidations(
            &invals
                .into_iter()
                .filter(|i| !i.attr_only)
                .collect::<Vec<_>>(),
            b,
        );
        if let Some(h) = pre
            .and_then(|d| self.cached_child(d, name))
            .and_then(|n| self.inodes.held_of(&n))
        {
            self.cache.held_changed(&h);
        }
    }

    /// The inode `(dev, ino)` changed: if the kernel knows it, its attributes are fetched
    /// afresh (every name's, in the core too) and the kernel drops its copy.
    fn inode_changed(&self, dev: u64, ino: u64, b: &mut Batch) {
        let Some(id) = self.inodes.peek_key(dev, ino) else {
            return;
        };
        if let Some(h) = self.inodes.held(id) {
            self.cache.held_changed(&h);
        }
        b.inode(id);
    }

    pub fn plan_invalidations(&self, invals: &[Invalidation], b: &mut Batch) {
        for inv in invals {
            let parent = inv.parent.as_ref().and_then(|p| self.inodes.nodeid_of(p));
            let node = inv.node.as_ref().and_then(|n| self.inodes.nodeid_of(n));
            if inv.parent.is_none() && inv.node.is_none() {
                for (id, _) in self.inodes.all() {
                    b.inode(id);
                }
                continue;
            }
            if !inv.attr_only {
                if let Some(p) = parent {
                    b.entry(p, &inv.name);
                    b.inode(p);
                }
            }
            if let Some(n) = node {
                b.inode(n);
            }
        }
    }

    pub fn send(&self, sink: &dyn Sink, b: &Batch) {
        let by_epoch = b.all_entries && self.inc_epoch(sink);
        for (p, name) in b.entries.iter().filter(|_| !by_epoch) {
            match sink.inval_entry(*p, name) {
                Ok(()) => self
                    .counters
                    .notify_inval_entry
                    .fetch_add(1, Ordering::Relaxed),
                Err(e) => {
                    tracing::debug!("inval_entry({p}, {:?}): {e}", String::from_utf8_lossy(name));
                    self.counters.notify_errors.fetch_add(1, Ordering::Relaxed)
                }
            };
        }
        for i in &b.inodes {
            match sink.inval_inode(*i) {
                Ok(()) => self
                    .counters
                    .notify_inval_inode
                    .fetch_add(1, Ordering::Relaxed),
                Err(e) => {
                    tracing::debug!("inval_inode({i}): {e}");
                    self.counters.notify_errors.fetch_add(1, Ordering::Relaxed)
                }
            };
        }
    }
}

/// Start the notifier thread.
pub fn spawn(
    state: NotifierState,
    sink: impl Sink,
    rx: Receiver<NotifyMsg>,
    feed: Option<ChangeFeed>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("dircache-notify".into())
        .spawn(move || {
            let feed = feed.unwrap_or_else(never);
            let mut feed_open = true;
            loop {
                let msg = if feed_open {
                    select! {
                        recv(rx) -> m => m.unwrap_or(NotifyMsg::Stop),
                        recv(feed) -> c => match c {
                            Ok(c) => NotifyMsg::Change(c),
                            Err(_) => { feed_open = false; continue; }
                        },
                    }
                } else {
                    rx.recv().unwrap_or(NotifyMsg::Stop)
                };
                let change = matches!(msg, NotifyMsg::Change(_));
                let batch = match msg {
                    NotifyMsg::Stop => return,
                    NotifyMsg::InvalInode(i) => {
                        let mut b = Batch::default();
                        b.inode(i);
                        b
                    }
                    NotifyMsg::InvalEntry(p, n) => {
                        let mut b = Batch::default();
                        b.entry(p, &n);
                        b
                    }
                    NotifyMsg::Change(c) => {
                        state.counters.changes.fetch_add(1, Ordering::Release);
                        state.plan_change(&c)
                    }
                };
                state.send(&sink, &batch);
                if change {
                    state.counters.changes_done.fetch_add(1, Ordering::Release);
                }
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_paths() {
        assert_eq!(split_path(b"a/b/c"), (&b"a/b"[..], &b"c"[..]));
        assert_eq!(split_path(b"c"), (&b""[..], &b"c"[..]));
        assert_eq!(split_path(b""), (&b""[..], &b""[..]));
    }

    /// Records what was sent; `epoch` says whether the kernel has FUSE_NOTIFY_INC_EPOCH.
    struct Recorder {
        epoch: bool,
        sent: Arc<parking_lot::Mutex<Vec<String>>>,
    }

    impl Sink for Recorder {
        fn inval_entry(&self, parent: u64, name: &[u8]) -> std::io::Result<()> {
            let name = String::from_utf8_lossy(name);
            self.sent.lock().push(format!("entry {parent} {name}"));
            Ok(())
        }
        fn inval_inode(&self, ino: u64) -> std::io::Result<()> {
            self.sent.lock().push(format!("inode {ino}"));
            Ok(())
        }
        fn inc_epoch(&self) -> std::io::Result<()> {
            if !self.epoch {
                return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
            }
            self.sent.lock().push("epoch".into());
            Ok(())
        }
    }

    fn state(kernel_minor: u32) -> NotifierState {
        let backend = dircache_core::memory::MemoryBackend::new();
        let cache = Cache::new(Arc::new(backend), Default::default()).unwrap();
        let inodes = Arc::new(Inodes::new(&cache));
        NotifierState::new(cache, inodes, Default::default(), kernel_minor)
    }

    fn lost_changes() -> Batch {
        let mut b = Batch {
            all_entries: true,
            ..Batch::default()
        };
        b.entry(1, b"x");
        b.inode(1);
        b
    }

    #[test]
    fn lost_changes_bump_the_epoch_instead_of_naming_entries() {
        let s = state(45);
        let sent = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let sink = Recorder {
            epoch: true,
            sent: sent.clone(),
        };
        s.send(&sink, &lost_changes());
        assert_eq!(*sent.lock(), ["epoch", "inode 1"]);
        assert_eq!(s.counters.notify_inc_epoch.load(Ordering::Relaxed), 1);
        // An ordinary batch names its entries.
        sent.lock().clear();
        let mut b = lost_changes();
        b.all_entries = false;
        s.send(&sink, &b);
        assert_eq!(*sent.lock(), ["entry 1 x", "inode 1"]);
    }

    #[test]
    fn without_the_epoch_entries_are_named_one_by_one() {
        // A kernel whose ABI is older than 7.44: not even tried.
        let s = state(40);
        let sent = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let sink = Recorder {
            epoch: true,
            sent: sent.clone(),
        };
        s.send(&sink, &lost_changes());
        assert_eq!(*sent.lock(), ["entry 1 x", "inode 1"]);
        // A kernel that refuses it: tried once, then not again.
        let s = state(45);
        sent.lock().clear();
        let sink = Recorder {
            epoch: false,
            sent: sent.clone(),
        };
        s.send(&sink, &lost_changes());
        s.send(&sink, &lost_changes());
        assert_eq!(
            *sent.lock(),
            ["entry 1 x", "inode 1", "entry 1 x", "inode 1"]
        );
        assert!(s.no_epoch.load(Ordering::Relaxed));
        assert_eq!(s.counters.notify_inc_epoch.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn batch_dedups() {
        let mut b = Batch::default();
        b.entry(1, b"x");
        b.entry(1, b"x");
        b.inode(3);
        b.inode(3);
        b.entry(2, b"x");
        assert_eq!(b.entries, vec![(1, b"x".to_vec()), (2, b"x".to_vec())]);
        assert_eq!(b.inodes, vec![3]);
    }
}
