//! Statistics counters that many threads bump without sharing a cache line.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use crossbeam_utils::CachePadded;
use once_cell::race::OnceBox;
use parking_lot::Mutex;
use serde::Serialize;

/// Shards owned by one thread each; threads beyond these share [`SHARED`].
const SHARDS: usize = 16;
/// The shard of threads that own none (counted with a locked add).
const SHARED: usize = SHARDS;

/// A counter split into cache-padded shards, so that counting on the lookup fast path never
/// bounces a cache line between cores. The first [`SHARDS`] live threads each own a shard and
/// count with a plain load and store (no locked instruction: a `lock xadd` was ~7 % of a
/// fast-path hit); a thread's shard is handed to a new thread when it exits. Other threads
/// share one shard and add atomically. Counts are exact either way. All shards are made up
/// front (17 x 128 bytes): only for the fast path's counter; the others are [`Counter`]s.
pub struct HotCounter {
    shards: Box<[CachePadded<AtomicU64>; SHARDS + 1]>,
}

impl Default for HotCounter {
    fn default() -> Self {
        HotCounter {
            shards: Box::new(std::array::from_fn(|_| CachePadded::new(AtomicU64::new(0)))),
        }
    }
}

/// Cache-padded per-thread shards, each allocated when a thread first uses it (by
/// compare-and-swap: racing makers agree on one box, which is never replaced). A cache with
/// one busy thread holds one shard per counter, not 17 (the padded shards made up front were
/// ~65 KB of `Cache::new`'s 138 KB). One more pointer to follow than [`HotCounter`]'s: kept
/// off the fast path.
struct Shards<T>(Box<[OnceBox<CachePadded<T>>; SHARDS + 1]>);

impl<T: Default> Default for Shards<T> {
    fn default() -> Self {
        Shards(Box::new(std::array::from_fn(|_| OnceBox::new())))
    }
}

impl<T: Default> Shards<T> {
    #[inline]
    fn get(&self, i: usize) -> &T {
        match self.0[i].get() {
            Some(s) => s,
            None => self.make(i),
        }
    }

    #[cold]
    #[inline(never)]
    fn make(&self, i: usize) -> &T {
        self.0[i].get_or_init(|| Box::new(CachePadded::new(T::default())))
    }

    /// The shards made so far.
    fn iter(&self) -> impl Iterator<Item = &T> {
        self.0.iter().filter_map(OnceBox::get).map(|s| &**s)
    }
}

/// A counter sharded as [`HotCounter`], with its shards made at first use ([`Shards`]).
#[derive(Default)]
pub struct Counter {
    shards: Shards<AtomicU64>,
}

/// Shards no live thread owns.
static FREE: Mutex<Vec<usize>> = Mutex::new(Vec::new());
static NEXT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's shard (`usize::MAX`: not chosen yet). A plain cell: read on every count.
    static SHARD: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) };
    /// Owns the shard and gives it back when the thread exits.
    static OWNER: Owned = Owned::take();
}

/// This thread's ownership of a shard.
struct Owned(usize);

impl Owned {
    fn take() -> Owned {
        if let Some(i) = FREE.lock().pop() {
            return Owned(i);
        }
        let i = NEXT.fetch_add(1, Ordering::Relaxed);
        if i < SHARDS {
            Owned(i)
        } else {
            NEXT.store(SHARDS, Ordering::Relaxed);
            Owned(SHARED)
        }
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        // Counts made later in this thread's teardown go to the shared shard.
        let _ = SHARD.try_with(|s| s.set(SHARED));
        if self.0 != SHARED {
            // The thread's last count happens-before the next owner's first (the mutex).
            FREE.lock().push(self.0);
        }
    }
}

#[inline]
fn shard() -> usize {
    let v = SHARD.with(|s| s.get());
    if v != usize::MAX {
        return v;
    }
    first_shard()
}

#[cold]
#[inline(never)]
fn first_shard() -> usize {
    // A thread already being torn down (its owner gone) counts in the shared shard.
    let i = OWNER.try_with(|o| o.0).unwrap_or(SHARED);
    SHARD.with(|s| s.set(i));
    i
}

impl HotCounter {
    #[inline]
    pub fn inc(&self) {
        self.add(1)
    }
    #[inline]
    pub fn add(&self, n: u64) {
        let i = shard();
        count(&self.shards[i], i, n);
    }
    pub fn get(&self) -> u64 {
        self.shards.iter().map(|s| s.load(Ordering::Relaxed)).sum()
    }
}

/// Add `n` to shard `i` (`s`).
#[inline(always)]
fn count(s: &AtomicU64, i: usize, n: u64) {
    if i == SHARED {
        s.fetch_add(n, Ordering::Relaxed);
    } else {
        // Only this thread writes this shard: no read-modify-write needed.
        s.store(s.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
    }
}

impl Counter {
    #[inline]
    pub fn inc(&self) {
        self.add(1)
    }
    /// Out of line: these counters are off the fast path, whose code stays as it was.
    #[inline(never)]
    pub fn add(&self, n: u64) {
        let i = shard();
        count(self.shards.get(i), i, n);
    }
    pub fn get(&self) -> u64 {
        self.shards.iter().map(|s| s.load(Ordering::Relaxed)).sum()
    }
}

/// Upper bounds of [`Histogram`] buckets: `2^k` microseconds, `k` in `0..BUCKETS` (1 µs to
/// ~8.4 s); one more bucket holds everything slower.
pub const BUCKETS: usize = 24;

/// One thread's part of a [`Histogram`]: counts per bucket (the last one unbounded) and the
/// sum of the observed nanoseconds.
#[derive(Default)]
struct HistShard {
    buckets: [AtomicU64; BUCKETS + 1],
    sum_ns: AtomicU64,
}

/// A latency histogram sharded like [`Counter`] (one shard per thread, plain stores): an
/// observation costs one `Instant::now()`, a leading-zero count and two stores. Its shards
/// are made at first use ([`Shards`]).
#[derive(Default)]
pub struct Histogram {
    shards: Shards<HistShard>,
}

/// A point-in-time copy of a [`Histogram`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct HistogramSnapshot {
    /// Observations per bucket (not cumulative); bucket `k < BUCKETS` holds those of at most
    /// `2^k` µs and more than `2^(k-1)` µs, the last one those above `2^(BUCKETS-1)` µs.
    pub buckets: Vec<u64>,
    pub sum_ns: u64,
}

impl HistogramSnapshot {
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }
    /// Upper bound of bucket `k` in seconds (`+inf` for the last).
    pub fn bound_secs(k: usize) -> f64 {
        if k < BUCKETS {
            (1u64 << k) as f64 * 1e-6
        } else {
            f64::INFINITY
        }
    }
}

/// The bucket of a duration of `ns` nanoseconds: the least `k` with `ns <= 2^k µs`.
#[inline]
fn bucket_of(ns: u64) -> usize {
    let us = ns.div_ceil(1000);
    let k = if us <= 1 {
        0
    } else {
        (64 - (us - 1).leading_zeros()) as usize
    };
    k.min(BUCKETS)
}

impl Histogram {
    /// Record one observation of `ns` nanoseconds.
    #[inline]
    pub fn observe_ns(&self, ns: u64) {
        let i = shard();
        let s = self.shards.get(i);
        let b = &s.buckets[bucket_of(ns)];
        if i == SHARED {
            b.fetch_add(1, Ordering::Relaxed);
            s.sum_ns.fetch_add(ns, Ordering::Relaxed);
        } else {
            // Only this thread writes this shard.
            b.store(b.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
            let sum = &s.sum_ns;
            sum.store(
                sum.load(Ordering::Relaxed).wrapping_add(ns),
                Ordering::Relaxed,
            );
        }
    }

    /// Record the time since `t`.
    #[inline]
    pub fn since(&self, t: Instant) {
        self.observe_ns(u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX));
    }

    /// Run `f`, recording how long it took. Every caller times a backend call: the hook of
    /// [`crate::set_before_backend_call`] runs first (the thread may block).
    #[inline]
    pub fn time<R>(&self, f: impl FnOnce() -> R) -> R {
        crate::backend::before_backend_call();
        let t = Instant::now();
        let r = f();
        self.since(t);
        r
    }

    /// Observations so far.
    pub fn get(&self) -> u64 {
        self.shards
            .iter()
            .flat_map(|s| s.buckets.iter())
            .map(|b| b.load(Ordering::Relaxed))
            .sum()
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut out = HistogramSnapshot {
            buckets: vec![0; BUCKETS + 1],
            sum_ns: 0,
        };
        for s in self.shards.iter() {
            for (o, b) in out.buckets.iter_mut().zip(s.buckets.iter()) {
                *o += b.load(Ordering::Relaxed);
            }
            out.sum_ns = out.sum_ns.wrapping_add(s.sum_ns.load(Ordering::Relaxed));
        }
        out
    }
}

/// Backend calls, by kind: each a latency histogram whose count is the number of calls.
#[derive(Default)]
pub struct BackendCounters {
    pub lookup: Histogram,
    pub walk: Histogram,
    pub getattr: Histogram,
    pub readdir: Histogram,
    pub readlink: Histogram,
    pub mutation: Histogram,
}

impl BackendCounters {
    /// `(kind, histogram)` for every kind, in a fixed order (for exporters).
    pub fn by_kind(&self) -> [(&'static str, &Histogram); 6] {
        [
            ("lookup", &self.lookup),
            ("walk", &self.walk),
            ("getattr", &self.getattr),
            ("readdir", &self.readdir),
            ("readlink", &self.readlink),
            ("mutation", &self.mutation),
        ]
    }
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
    pub fastpath_hits: HotCounter,
    /// Direct-lookup hits that the prefix-check cache could not confirm.
    pub pcc_misses: Counter,
    /// Component-at-a-time walks.
    pub slowpath_walks: Counter,
    /// Readdirs served from a complete directory.
    pub readdir_hits: Counter,
    /// Readdirs that listed the directory in the backend.
    pub readdir_misses: Counter,
    /// Names the backend answered ENOENT for (one-component lookups of names not cached).
    pub negative_misses: Counter,
    /// Attributes answered from the cache, and fetched from the backend.
    pub attr_hits: Counter,
    pub attr_misses: Counter,
    /// Symlink targets answered from the cache, and read from the backend.
    pub symlink_hits: Counter,
    pub symlink_misses: Counter,
    /// Component-at-a-time walks that called the backend for none of their components,
    /// and walks that called it for at least one.
    pub walk_hits: Counter,
    pub walk_misses: Counter,
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
    pub readdir_misses: u64,
    pub negative_misses: u64,
    pub attr_hits: u64,
    pub attr_misses: u64,
    pub symlink_hits: u64,
    pub symlink_misses: u64,
    pub walk_hits: u64,
    pub walk_misses: u64,
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
    /// Bytes of all prefix-check tables (exact; at most `Config::pcc_budget`).
    pub pcc_bytes: u64,
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
            readdir_misses: self.readdir_misses.get(),
            negative_misses: self.negative_misses.get(),
            attr_hits: self.attr_hits.get(),
            attr_misses: self.attr_misses.get(),
            symlink_hits: self.symlink_hits.get(),
            symlink_misses: self.symlink_misses.get(),
            walk_hits: self.walk_hits.get(),
            walk_misses: self.walk_misses.get(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_powers_of_two_microseconds() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(1000), 0);
        assert_eq!(bucket_of(1001), 1);
        assert_eq!(bucket_of(2000), 1);
        assert_eq!(bucket_of(2001), 2);
        assert_eq!(bucket_of(1_048_576_000), 20);
        assert_eq!(bucket_of(u64::MAX), BUCKETS);
        let h = Histogram::default();
        std::thread::scope(|s| {
            for _ in 0..3 * SHARDS {
                s.spawn(|| {
                    for _ in 0..1000 {
                        h.observe_ns(1500);
                    }
                });
            }
        });
        let snap = h.snapshot();
        assert_eq!(snap.count(), 3 * SHARDS as u64 * 1000);
        assert_eq!(snap.buckets[1], snap.count());
        assert_eq!(snap.sum_ns, 1500 * snap.count());
        assert_eq!(h.get(), snap.count());
    }

    /// Plain stores in owned shards must not lose counts: more threads than shards, threads
    /// exiting and handing their shard on, all counting at once.
    #[test]
    fn counts_are_exact_with_more_threads_than_shards_and_thread_churn() {
        let c = Counter::default();
        let h = HotCounter::default();
        std::thread::scope(|s| {
            for _ in 0..3 * SHARDS {
                s.spawn(|| {
                    for _ in 0..10_000 {
                        c.inc();
                        h.inc();
                    }
                    // A short-lived thread inside: its shard goes back to the pool.
                    std::thread::scope(|s2| {
                        s2.spawn(|| {
                            c.add(5);
                            h.add(5);
                        });
                    });
                });
            }
        });
        assert_eq!(c.get(), 3 * SHARDS as u64 * 10_005);
        assert_eq!(h.get(), 3 * SHARDS as u64 * 10_005);
    }
}
