//! Lean READDIRPLUS for cold walks (`-o lean`, the default; issue 9).
//!
//! A READDIRPLUS entry normally carries the entry's attributes, so a first listing cost one
//! statx per entry in the daemon: a cold `find -name` statted every file of the tree, which
//! native `find` (it reads directories only, d_type tells it what to descend into) never
//! does. A lean listing reads the directory only (getdents, [`Cache::readdir_node`] without
//! attributes) and sends each non-directory entry whose attributes the cache does not hold
//! with nodeid 0 (`ReplyDirectoryPlus::add_unlinked`, vendor/fuser/PATCHED.md): the kernel
//! shows the name with that `d_ino` and `d_type` and instantiates nothing (fs/fuse/readdir.c
//! `fuse_direntplus_link` returns early for nodeid 0); whoever stats it sends a LOOKUP.
//! Directories go out full (a walker descends into them and would look them up anyway), and
//! so does every entry the cache has attributes for (e.g. files `git status` looked up before
//! listing their directory: each is statted once, by its LOOKUP).
//!
//! `d_ino` of a lean entry is getdents' inode number mapped as plain READDIR maps it
//! ([`crate::inodes::Inodes::ino_of`] on the directory's device): the number `stat` shows,
//! and for a mount point the covered inode's, as natively.
//!
//! Programs that stat what they list (`ls -l`, `du`) would pay one LOOKUP per file instead
//! of none, so the mount adapts: after [`HITS`] LOOKUPs of names in directories whose last
//! listing sent entries lean, the next [`FULL_LISTINGS`] listings are full, and the count
//! starts again; a walk that stats everything pays the lookups of about one directory per
//! [`FULL_LISTINGS`] listings.
//!
//! Nothing is cached here but a set of directory nodeids and two counters: which entries go
//! out lean changes what the kernel instantiates, never what it is told (a lean entry's
//! name, type and number come from the same listing a full entry's would).

use std::sync::atomic::{AtomicU32, Ordering};

use dircache_core::{Cache, Creds, DirEntry, FileType, NodeRef};

/// LOOKUPs of names listed lean that switch the mount to full listings.
pub(crate) const HITS: u32 = 4;
/// Listings served full after the switch.
pub(crate) const FULL_LISTINGS: u32 = 256;
/// Directories remembered as listed lean; the set is cleared when it grows past this.
const MAX_DIRS: usize = 1 << 16;

/// The lean-listing state of one mount.
pub(crate) struct Lean {
    on: bool,
    /// Listings still to be served full.
    full_left: AtomicU32,
    /// LOOKUPs of names listed lean since the last switch.
    hits: AtomicU32,
    /// Directories (nodeids) whose last listing sent entries lean.
    dirs: papaya::HashSet<u64>,
}

impl Lean {
    pub(crate) fn new(on: bool) -> Lean {
        Lean {
            on,
            full_left: AtomicU32::new(0),
            hits: AtomicU32::new(0),
            dirs: papaya::HashSet::new(),
        }
    }

    /// Whether listings are lean now (for listings made ahead of a walker).
    pub(crate) fn is_lean(&self) -> bool {
        self.on && self.full_left.load(Ordering::Relaxed) == 0
    }

    /// Whether a new listing stream (a READDIRPLUS from offset 0) is lean; a full one counts
    /// against [`FULL_LISTINGS`].
    pub(crate) fn take_listing(&self) -> bool {
        if !self.on {
            return false;
        }
        let left = self.full_left.load(Ordering::Relaxed);
        if left == 0 {
            return true;
        }
        let _ =
            self.full_left
                .compare_exchange(left, left - 1, Ordering::Relaxed, Ordering::Relaxed);
        false
    }

    /// Entries of directory `dir` went out lean.
    pub(crate) fn sent_lean(&self, dir: u64) {
        let d = self.dirs.pin();
        if d.len() >= MAX_DIRS {
            d.clear();
        }
        d.insert(dir);
    }

    /// A LOOKUP in directory `parent` arrived.
    pub(crate) fn looked_up(&self, parent: u64) {
        if !self.on || !self.dirs.pin().contains(&parent) {
            return;
        }
        if self.hits.fetch_add(1, Ordering::Relaxed) + 1 >= HITS {
            self.hits.store(0, Ordering::Relaxed);
            self.full_left.store(FULL_LISTINGS, Ordering::Relaxed);
            self.dirs.pin().clear();
        }
    }
}

/// Give the subdirectories of a lean listing of `dir` their attributes (one statx each):
/// they go out as full entries, and the prefetcher only lists directories it has attributes
/// for (permission check).
pub(crate) fn stat_subdirs(cache: &Cache, c: &Creds, dir: &NodeRef, entries: &[DirEntry]) {
    for e in entries {
        if e.kind != FileType::Directory || e.attr.is_some() {
            continue;
        }
        if let Ok(n) = cache.lookup_child(c, dir, &e.name) {
            if n.cached_attr().is_none() {
                let _ = cache.attr_of_name(&n);
            }
        }
    }
}
