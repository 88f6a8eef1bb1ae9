//! Listing a directory on LOOKUPs (`-o lookahead`, the default; issue 9).
//!
//! # Why
//! A cold `git status` sends one LOOKUP per tracked file (its preload threads lstat every
//! index entry before listing any directory): 20,457 on the 36k-entry benchmark tree, each a
//! backend lookup (resolve the directory, one statx) on a request thread. The directories
//! were then listed by git's untracked-file walk, a second pass over the same names
//! (getdents, and the attributes of entries the cache did not hold).
//!
//! # What
//! On the second LOOKUP of a name that a directory's cache entry does not hold (the
//! directory not complete, the name neither positive nor negative in it), the request thread
//! lists the directory into the core cache before answering ([`Cache::readdir_node`], as a
//! READDIRPLUS would, then [`Cache::lookup_child`] answers from it). The names looked up next
//! in it are answered from memory, a name that is not there is a miss of a complete directory
//! (no backend call), and its READDIRPLUS later is served from the cache. The listing carries
//! attributes (one statx per entry, in getdents order) when a name looked up before turned out
//! to exist (`git status`, `make`: the caller stats the files), and only names (getdents) when
//! every earlier miss was a negative (a search path probed for a file: the statx of the whole
//! directory would be wasted).
//!
//! Then the directory is read through the mount (`Prefetcher::read_through_kernel`: the
//! kernel instantiates every entry, the next lstat calls send no LOOKUP; by up to
//! `-o kreaders=N` threads at once, 8 by default, none with 0), and, since a
//! program that looks names up one by one in path order (`git status`) goes on into its
//! subdirectories and then the directories after it, those are listed with attributes and
//! read through the mount ahead of it (`Prefetcher::ahead_of_lookups`, `-o ahead=N` levels;
//! off by default: see `CachePolicy::lookahead_levels`). Lookups of names a complete
//! directory holds with attributes (listed ahead of a walker, into the core only) count the
//! same way: the [`MISSES`]th reads it through the mount (and queues what comes after it).
//! Lookups that go on in a directory queued for such a read and not read yet ask for it
//! again, which makes it the next one read (`prefetch.rs` `ReadQueue`): a program still
//! looking names up in it gains from the read; one that moved on may not.
//!
//! Only directories of at most [`MAX_DIR_BYTES`] (`st_size`; about a thousand entries on ext4)
//! are listed: a single `stat` in a huge directory stays one statx. A LOOKUP that arrives while
//! another request (or a prefetch thread) lists the same directory waits for that listing
//! ([`crate::prefetch::Prefetcher::list_now`]) instead of asking the backend itself.
//!
//! Only on mounts with a change feed (`lib.rs` turns it off without one: a listing made on
//! lookups would then hide names created in SRC later from lookups that used to ask the
//! backend) and, for now, not on remote mounts (`cli/src/mount.rs`).
//!
//! # Correctness
//! The listing is the one a READDIRPLUS of the directory would make, with the credentials of
//! the LOOKUP, and only if their mode bits let them list and search the directory (as
//! `prefetch.rs` checks): nothing is fetched that the caller could not list itself. The core
//! merges it under its usual rules (docs/core.md I6: a listing that raced with a change is
//! not marked complete; the change feed invalidates it as any other listing), so what the
//! LOOKUP then returns is what a lookup after an `ls` of the directory would return.
//!
//! # Cost
//! A map of directories with one miss ([`MAX_DIRS`] at most, cleared when full). A program
//! that looks up two names in a small directory and nothing else pays one getdents (and
//! with a positive first name, a statx per entry) instead of one statx.

use std::collections::HashMap;

use dircache_core::{AccessPolicy, Cache, Creds, NodeKind, NodeRef, PosixPolicy};
use parking_lot::Mutex;

use crate::prefetch::Prefetcher;

/// Directories up to this size (`st_size`) are listed on their [`MISSES`]th miss.
pub const MAX_DIR_BYTES: u64 = 64 * 1024;
/// LOOKUPs of names a directory does not hold that make it listed (the last one waits).
pub const MISSES: u32 = 2;
/// Larger directories, up to this size, are listed after one miss per
/// [`BIG_DIR_BYTES_PER_MISS`] bytes of their size (a 160 KiB directory of 2,874 files after
/// 156 misses); larger ones never.
pub const MAX_BIG_DIR_BYTES: u64 = 1 << 20;
pub const BIG_DIR_BYTES_PER_MISS: u64 = 1024;
/// Directories with misses remembered at most; the map is cleared when it grows past this.
const MAX_DIRS: usize = 1 << 14;

const R_OK: u32 = 4;
const X_OK: u32 = 1;

/// The lookahead state of one mount.
pub(crate) struct Lookahead {
    on: bool,
    /// Levels of subdirectories read ahead below a directory listed here
    /// ([`Prefetcher::ahead_of_lookups`]).
    levels: u8,
    /// Misses per directory (dentry id) not listed yet.
    misses: Mutex<HashMap<u64, u32>>,
    /// LOOKUPs of names a complete directory holds with attributes, per directory (dentry
    /// id) not read through the mount since.
    hits: Mutex<HashMap<u64, u32>>,
}

impl Lookahead {
    pub(crate) fn new(on: bool, levels: u8) -> Lookahead {
        Lookahead {
            on,
            levels,
            misses: Mutex::new(HashMap::new()),
            hits: Mutex::new(HashMap::new()),
        }
    }

    /// Count one LOOKUP in `dir`'s `map`; true when it makes `needed`, and the count starts
    /// again.
    fn count(map: &Mutex<HashMap<u64, u32>>, dir: &NodeRef, needed: u32) -> bool {
        let mut m = map.lock();
        let n = m.entry(dir.id()).or_insert(0);
        *n += 1;
        if *n < needed {
            if m.len() > MAX_DIRS {
                m.clear();
            }
            return false;
        }
        m.remove(&dir.id());
        true
    }

    /// LOOKUPs of names `dir` holds with attributes, `dir` complete: the kernel does not hold
    /// them (a listing made ahead of a walker, or by `list_now` in the core only): on the
    /// [`MISSES`]th, `dir` is read through the mount (the names that follow are in the
    /// kernel's dcache) and its subdirectories ahead of the lookups.
    fn hit(&self, prefetch: &Prefetcher, c: &Creds, dir: &NodeRef, needed: u32) {
        if !Self::count(&self.hits, dir, needed) {
            return;
        }
        prefetch.read_through_kernel(dir);
        prefetch.ahead_of_lookups(c, dir, self.levels);
    }

    /// A LOOKUP of `name` in `dir` by `c` is about to be answered: list `dir` first if this
    /// is its [`MISSES`]th miss (module doc), or wait for a listing of it in progress.
    pub(crate) fn before_lookup(
        &self,
        cache: &Cache,
        prefetch: &Prefetcher,
        c: &Creds,
        dir: &NodeRef,
        name: &[u8],
    ) {
        if !self.on
            || !cache.config().completeness
            || cache.config().bypass
            || dir.is_dead()
            || name == b"."
            || name == b".."
        {
            return;
        }
        // A miss: the name is not cached (and `dir` not complete), or cached without
        // attributes (listed by name only, e.g. by a lean prefetch): either asks the backend.
        if tracing::enabled!(tracing::Level::TRACE) {
            tracing::trace!(
                dir = %String::from_utf8_lossy(&cache.node_path(dir).unwrap_or_default()),
                name = %String::from_utf8_lossy(name),
                complete = dir.is_complete(),
                cached = dir.cached_child(name).is_some(),
                "lookahead: lookup"
            );
        }
        let hit = match dir.cached_child(name) {
            None if dir.is_complete() => return,
            None => false,
            Some(n) if matches!(n.kind(), NodeKind::Positive(_)) => {
                if n.cached_attr().is_some() && !dir.is_complete() {
                    return;
                }
                n.cached_attr().is_some()
            }
            Some(_) => return,
        };
        let Some(attr) = dir.cached_attr() else {
            return;
        };
        if !attr.is_dir() || attr.size > MAX_BIG_DIR_BYTES {
            return;
        }
        let needed = if attr.size <= MAX_DIR_BYTES {
            MISSES
        } else {
            (attr.size / BIG_DIR_BYTES_PER_MISS) as u32
        };
        // Only what the caller may list (the kernel checked search permission for the
        // LOOKUP; read permission is checked here, as a READDIR would need it).
        if PosixPolicy
            .permission(c.cred(), &attr, R_OK | X_OK)
            .is_err()
        {
            return;
        }
        if hit {
            // The names are in the core already: reading them into the kernel costs round
            // trips only, however large the directory.
            return self.hit(prefetch, c, dir, MISSES);
        }
        if prefetch.wait_for(dir) {
            // Listed meanwhile by someone else: the lookup is answered from it.
            return;
        }
        if !Self::count(&self.misses, dir, needed) {
            return;
        }
        let want_attrs = dir
            .cached_children()
            .iter()
            .any(|n| matches!(n.kind(), NodeKind::Positive(_)));
        if prefetch.list_now(c, dir, want_attrs) && want_attrs && dir.is_complete() {
            prefetch.read_through_kernel(dir);
            prefetch.ahead_of_lookups(c, dir, self.levels);
        }
    }
}
