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
//!
//! The set keeps a 32-bit fingerprint of each `(dev, ino)`, not the pair: 4 bytes per slot
//! instead of 16 (about 8 bytes per served inode with the table's spare slots and control
//! bytes, was about 27: it was the largest item of `dircache bench lookup`'s bytes per dentry
//! after the dentry and its direct-lookup entry). Another inode with the same fingerprint in
//! the same shard only counts as served too (its events are reported, as past [`CAP`]): a
//! false positive costs a `Change::Inode` nobody holds, never a missed one, and with the
//! shard's 4 bits the chance per unrelated inode is below `n / 2^36` for `n` served inodes.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};

use dircache_core::Attr;
use parking_lot::Mutex;

/// Inodes remembered before every inode counts as served.
pub(crate) const CAP: usize = 1 << 21;
const SHARDS: usize = 16;

/// One shard of the set: fingerprints of (dev, ino) ([`fingerprint`]).
type Shard = Mutex<HashSet<u32>>;

/// 32 bits of `(dev, ino)` that do not depend on the shard's bits (a 64-bit multiply-xorshift
/// mix, so inode numbers that differ in any bit spread over all of them).
fn fingerprint(dev: u64, ino: u64) -> u32 {
    let mut x = ino ^ dev.rotate_left(32) ^ 0x9e37_79b9_7f4a_7c15;
    x = (x ^ (x >> 32)).wrapping_mul(0xd6e8_feb8_6659_fd93);
    x = (x ^ (x >> 32)).wrapping_mul(0xd6e8_feb8_6659_fd93);
    (x ^ (x >> 32)) as u32
}

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
        s.insert(fingerprint(a.dev, a.ino));
    }

    /// Whether the backend ever answered about `(dev, ino)` (or stopped keeping count; or
    /// answered about another inode with the same fingerprint, see the module docs).
    pub(crate) fn contains(&self, dev: u64, ino: u64) -> bool {
        self.saturated.load(Ordering::Relaxed)
            || self.shard(dev, ino).lock().contains(&fingerprint(dev, ino))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(dev: u64, ino: u64) -> Attr {
        Attr {
            dev,
            ino,
            mode: libc::S_IFREG | 0o644,
            ..Attr::default()
        }
    }

    #[test]
    fn served_inodes_are_found_and_most_others_are_not() {
        let s = Served::default();
        for ino in 0..20_000u64 {
            s.note(&attr(2049, ino * 7 + 11));
        }
        // Every served inode is found: the filter never drops an event it must report.
        assert!((0..20_000u64).all(|ino| s.contains(2049, ino * 7 + 11)));
        // Unrelated inodes (another device, other numbers) are filtered out, up to the rare
        // fingerprint collision.
        let false_pos = (0..100_000u64)
            .filter(|&ino| s.contains(2050, ino) || s.contains(2049, ino * 7 + 12))
            .count();
        assert!(false_pos < 10, "{false_pos} false positives");
        // Directories are not noted.
        let mut d = attr(2049, 5);
        d.mode = libc::S_IFDIR | 0o755;
        s.note(&d);
        assert!(!s.contains(2049, 5));
    }
}
