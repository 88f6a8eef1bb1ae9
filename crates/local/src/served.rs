//! The non-directories a backend has answered about: its change feed's filter for events that
//! can only be reported by inode (`watch.rs`).
//!
//! A change through one hard-link name of a file is a change of every name. When the name the
//! event gives lies outside the root, or the event gives none (a link count change after `ln`
//! or `rm` of some name), the feed can only report the inode (`Change::Inode`). Such an event
//! can make something stale only if a cache or a client holds the file under a name below the
//! root, which it learnt from this backend: every `statx` the backend answers with is noted
//! here ([`Served::note`]). Inode events about any other inode (other jobs' files elsewhere on
//! the file system) are dropped without asking the kernel.
//!
//! One set per backend, sharded to keep request threads apart. It only grows, up to [`CAP`]
//! inodes; past that every inode counts as served (correct, only no longer filtered).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};

use dircache_core::Attr;
use parking_lot::Mutex;

/// Inodes remembered before every inode counts as served.
pub(crate) const CAP: usize = 1 << 21;
const SHARDS: usize = 16;

/// One shard of the set: (dev, ino).
type Shard = Mutex<HashSet<(u64, u64)>>;

pub(crate) struct Served {
    shards: [Shard; SHARDS],
    saturated: AtomicBool,
}

impl Default for Served {
    fn default() -> Served {
        Served {
            shards: std::array::from_fn(|_| Mutex::default()),
            saturated: AtomicBool::new(false),
        }
    }
}

impl Served {
    fn shard(&self, dev: u64, ino: u64) -> &Shard {
        // `SHARDS` is a power of two; the low bits of inode numbers vary most.
        &self.shards[((ino ^ dev) as usize) & (SHARDS - 1)]
    }

    /// Remember `a`'s inode if it is not a directory (directories are reported by path).
    pub(crate) fn note(&self, a: &Attr) {
        if a.is_dir() || self.saturated.load(Ordering::Relaxed) {
            return;
        }
        let mut s = self.shard(a.dev, a.ino).lock();
        if s.len() >= CAP / SHARDS {
            self.saturated.store(true, Ordering::Relaxed);
            return;
        }
        s.insert((a.dev, a.ino));
    }

    /// Whether the backend ever answered about `(dev, ino)` (or stopped keeping count).
    pub(crate) fn contains(&self, dev: u64, ino: u64) -> bool {
        self.saturated.load(Ordering::Relaxed) || self.shard(dev, ino).lock().contains(&(dev, ino))
    }
}
