//! Statistics counters that many threads bump without sharing a cache line.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;
use serde::Serialize;

const SHARDS: usize = 16;

/// A counter split into cache-padded shards, one per thread (modulo [`SHARDS`]), so that
/// counting on the lookup fast path never bounces a cache line between cores.
pub struct Counter {
    shards: Box<[CachePadded<AtomicU64>; SHARDS]>,
}

impl Default for Counter {
    fn default() -> Self {
        Counter {
            shards: Box::new(std::array::from_fn(|_| CachePadded::new(AtomicU64::new(0)))),
        }
    }
}

#[inline]
fn shard() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SHARD: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) };
    }
    SHARD.with(|s| {
        let v = s.get();
        if v != usize::MAX {
            return v;
        }
        let v = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
        s.set(v);
        v
    })
}

impl Counter {
    #[inline]
    pub fn inc(&self) {
        self.add(1)
    }
    #[inline]
    pub fn add(&self, n: u64) {
        self.shards[shard()].fetch_add(n, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.shards.iter().map(|s| s.load(Ordering::Relaxed)).sum()
    }
}

/// Backend calls, by kind.
#[derive(Default)]
pub struct BackendCounters {
    pub lookup: Counter,
    pub walk: Counter,
    pub getattr: Counter,
    pub readdir: Counter,
    pub readlink: Counter,
    pub mutation: Counter,
}

/// The live counters of one cache.
#[derive(Default)]
pub struct Stats {
    /// Slow-path lookups answered without calling the backend (fast-path hits are counted in
    /// `fastpath_hits` only, and added to `hits` in snapshots: one counter on the hot path).
    pub hits: Counter,
    /// Lookups that called the backend at least once.
    pub misses: Counter,
    /// Lookups answered ENOENT/ENOTDIR from a cached negative entry.
    pub negative_hits: Counter,
    /// Lookups answered by the direct-lookup table and prefix-check cache alone.
    pub fastpath_hits: Counter,
    /// Direct-lookup hits that the prefix-check cache could not confirm.
    pub pcc_misses: Counter,
    /// Component-at-a-time walks.
    pub slowpath_walks: Counter,
    /// Readdirs served from a complete directory.
    pub readdir_hits: Counter,
    pub backend: BackendCounters,
    /// Subtree invalidations (chmod, rename, ... and `invalidate`).
    pub invalidations: Counter,
    /// Dentries whose version was bumped by invalidations.
    pub invalidated_entries: Counter,
    pub evictions: Counter,
}

/// A point-in-time copy of [`Stats`] plus sizes, for reports.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StatsSnapshot {
    pub hits: u64,
    pub misses: u64,
    pub negative_hits: u64,
    pub fastpath_hits: u64,
    pub pcc_misses: u64,
    pub slowpath_walks: u64,
    pub readdir_hits: u64,
    pub backend_lookup: u64,
    pub backend_walk: u64,
    pub backend_getattr: u64,
    pub backend_readdir: u64,
    pub backend_readlink: u64,
    pub backend_mutation: u64,
    pub invalidations: u64,
    pub invalidated_entries: u64,
    pub evictions: u64,
    /// Dentries alive (positive, negative and aliases' targets).
    pub entries: u64,
    /// Direct-lookup table entries (including ones not yet swept after invalidation).
    pub fast_entries: u64,
    /// Estimated bytes held by dentries and tables.
    pub bytes: u64,
}

impl Stats {
    pub(crate) fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            hits: self.hits.get() + self.fastpath_hits.get(),
            misses: self.misses.get(),
            negative_hits: self.negative_hits.get(),
            fastpath_hits: self.fastpath_hits.get(),
            pcc_misses: self.pcc_misses.get(),
            slowpath_walks: self.slowpath_walks.get(),
            readdir_hits: self.readdir_hits.get(),
            backend_lookup: self.backend.lookup.get(),
            backend_walk: self.backend.walk.get(),
            backend_getattr: self.backend.getattr.get(),
            backend_readdir: self.backend.readdir.get(),
            backend_readlink: self.backend.readlink.get(),
            backend_mutation: self.backend.mutation.get(),
            invalidations: self.invalidations.get(),
            invalidated_entries: self.invalidated_entries.get(),
            evictions: self.evictions.get(),
            ..Default::default()
        }
    }
}
