//! The prefix-check cache (PCC, SOSP'15 §3.1) and credential interning.
//!
//! Per credential, set-associative arrays of DLHT entry stamps. A slot says "this credential
//! passed every permission check along this path when it resolved to the DLHT entry with this
//! stamp". Stamps are unique per DLHT entry (global counter), so a PCC slot can only confirm
//! the exact entry its walk produced. Keying the PCC by path signature rather than by dentry
//! (the paper keys by dentry) makes aliases through symlinks and bind mounts need no special
//! alias dentries: each path carries its own prefix-check result (docs/core.md, I3).
//!
//! Equal credentials share one [`CredState`] (and so one PCC): [`Cache::intern`] hands out
//! the live one from the `creds` table, keyed by (credential, whether the cache checks).
//!
//! **Memory bound.** A PCC starts without a table and grows with use, by levels: the first
//! insert makes a table of 64 slots (512 bytes), and each time a credential has inserted as
//! many stamps as its newest table has slots, a table twice as large is added, while the
//! levels together stay within `Config::pcc_slots`. Every table is paid for from one budget per
//! cache (`Config::pcc_budget` bytes, reserved before the table is allocated and given back
//! when its credential is dropped), so all credentials' tables together never exceed it,
//! however many credentials call. When a table does not fit, interned credentials that nobody
//! holds are evicted from `Cache::creds`, least recently interned first, until it does; if it
//! still does not fit the credential does without (no table: every lookup of it takes the slow
//! path, which is always correct: a PCC only ever lets a lookup skip checks it has passed).
//! Credentials are never shared or recycled across evictions: an evicted credential's next
//! use gets a new, empty state.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use super::dlht::Sig;
use super::Cache;
use crate::Cred;

/// Per-credential state: the credential and its prefix-check cache.
pub(crate) struct CredState {
    pub(crate) cred: Cred,
    /// Whether the cache applies its access policy (false: the caller checked already).
    pub(crate) check: bool,
    pub(crate) pcc: Pcc,
    /// `Cache::creds_tick` when last interned (eviction order).
    last_use: AtomicU64,
}

/// Interned credentials with their prefix-check cache. Cheap to clone; equal credentials
/// share one state.
#[derive(Clone)]
pub struct Creds(pub(crate) Arc<CredState>);

impl Creds {
    pub fn cred(&self) -> &Cred {
        &self.0.cred
    }
}

/// The bytes all prefix-check tables of one cache may hold together.
pub(crate) struct PccBudget {
    used: AtomicUsize,
    limit: usize,
}

impl PccBudget {
    pub(crate) fn new(limit: usize) -> Arc<PccBudget> {
        Arc::new(PccBudget {
            used: AtomicUsize::new(0),
            limit,
        })
    }

    fn reserve(&self, n: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(n).filter(|&t| t <= self.limit)
            })
            .is_ok()
    }

    fn release(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }

    /// Whether `n` more bytes fit now (a hint: another thread may take them first).
    fn has_room(&self, n: usize) -> bool {
        self.used().saturating_add(n) <= self.limit
    }

    /// Bytes held by tables now.
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

const EMPTY: u64 = 0;
/// Slots of a credential's first table.
const FIRST_SLOTS: usize = 64;
/// Most levels: 64 << 10 slots is more than `Config::pcc_slots` accepts in total (2^16 by
/// default: levels of 64 .. 32,768 slots, 65,472 together).
const LEVELS: usize = 11;

type Table = Box<[AtomicU64]>;

/// A bounded, lock-free prefix-check cache: levels of 2-way set-associative tables holding
/// DLHT entry stamps. A slot needs no signature: stamps are unique per DLHT entry and an entry
/// lives under exactly one signature, so "a slot for `sig` holds the stamp of the entry found
/// under `sig`" can only be true if this credential's walk produced (or re-used) exactly that
/// entry, whichever level holds it. One 64-bit atomic per slot: no torn reads, no locks.
/// Inserts go to the newest level; a hit in an older level copies the stamp to the newest (the
/// one write a reader may do, once per stamp), so hot paths are found with one probe.
pub(crate) struct Pcc {
    /// `levels[..top]` are made (each `OnceLock` is set once and never replaced or freed
    /// before the `Pcc`), level `l` has `first << l` slots.
    levels: [OnceLock<Table>; LEVELS],
    top: AtomicUsize,
    /// Stamps inserted since the newest level was made (or since growing last failed).
    fill: AtomicUsize,
    first: usize,
    /// Most slots of all levels together.
    max_slots: usize,
    budget: Arc<PccBudget>,
}

#[inline]
fn set_of(sig: Sig, t: &[AtomicU64]) -> usize {
    // The DLHT indexes by the low half; use the high half.
    ((sig >> 64) as usize) & (t.len() - 1) & !1
}

#[inline]
fn holds(t: &[AtomicU64], i: usize, stamp: u64) -> bool {
    t[i].load(Ordering::Acquire) == stamp || t[i + 1].load(Ordering::Acquire) == stamp
}

impl Pcc {
    /// An empty PCC of at most `max_slots` slots (at least 2), paid for from `budget`.
    pub(crate) fn new(max_slots: usize, budget: Arc<PccBudget>) -> Pcc {
        let max_slots = max_slots.max(2);
        Pcc {
            levels: Default::default(),
            top: AtomicUsize::new(0),
            fill: AtomicUsize::new(0),
            first: FIRST_SLOTS.min(max_slots.next_power_of_two()),
            max_slots,
            budget,
        }
    }

    /// Whether this credential's walk of `sig` produced the DLHT entry `stamp`.
    #[inline]
    pub(crate) fn check(&self, sig: Sig, stamp: u64) -> bool {
        let top = self.top.load(Ordering::Acquire);
        let Some(t) = top.checked_sub(1).and_then(|l| self.levels[l].get()) else {
            return false;
        };
        holds(t, set_of(sig, t), stamp) || (top > 1 && self.check_older(sig, stamp, top))
    }

    /// `check` in the levels below the newest; a hit is copied to the newest.
    #[cold]
    #[inline(never)]
    fn check_older(&self, sig: Sig, stamp: u64, top: usize) -> bool {
        let found = self.levels[..top - 1]
            .iter()
            .rev()
            .filter_map(OnceLock::get)
            .any(|t| holds(t, set_of(sig, t), stamp));
        if found {
            if let Some(t) = self.levels[top - 1].get() {
                put(t, sig, stamp);
            }
        }
        found
    }

    /// Record that this credential's walk of `sig` produced entry `stamp`. Returns whether
    /// the PCC would like a larger table ([`Cache::grow_pcc`]).
    pub(crate) fn insert(&self, sig: Sig, stamp: u64) -> bool {
        debug_assert!(stamp != EMPTY);
        let top = self.top.load(Ordering::Acquire);
        let Some(t) = top.checked_sub(1).and_then(|l| self.levels[l].get()) else {
            // No table yet: ask at the first insert, then (if the budget had no room) as
            // soon as it has room, or at every `first`-th insert to make room by evicting
            // idle credentials. Before, only every `first`-th: a credential refused a table
            // while the budget was full stayed without one (no fast path) for `first` slow
            // walks after room came back.
            return self
                .fill
                .fetch_add(1, Ordering::Relaxed)
                .is_multiple_of(self.first)
                || self.next_bytes().is_some_and(|b| self.budget.has_room(b));
        };
        if !put(t, sig, stamp) {
            return false;
        }
        self.fill.fetch_add(1, Ordering::Relaxed) + 1 >= t.len() && self.can_grow(top)
    }

    fn size(&self, level: usize) -> usize {
        self.first << level
    }

    fn can_grow(&self, top: usize) -> bool {
        top < LEVELS && (0..=top).map(|l| self.size(l)).sum::<usize>() <= self.max_slots
    }

    /// Bytes the next level would take, if the PCC may have one.
    fn next_bytes(&self) -> Option<usize> {
        let top = self.top.load(Ordering::Acquire);
        self.can_grow(top)
            .then(|| self.size(top) * std::mem::size_of::<AtomicU64>())
    }

    /// Add the next level if the budget has room for it. Returns false if it has not (the
    /// PCC then asks again only after as many more inserts as its newest table has slots).
    fn grow(&self) -> bool {
        let top = self.top.load(Ordering::Acquire);
        if !self.can_grow(top) {
            return true;
        }
        let n = self.size(top);
        let bytes = n * std::mem::size_of::<AtomicU64>();
        if !self.budget.reserve(bytes) {
            self.fill.store(1, Ordering::Relaxed);
            return false;
        }
        let t: Table = (0..n).map(|_| AtomicU64::new(EMPTY)).collect();
        if self.levels[top].set(t).is_ok() {
            self.fill.store(0, Ordering::Relaxed);
            self.top.store(top + 1, Ordering::Release);
        } else {
            // Another thread made this level first.
            self.budget.release(bytes);
        }
        true
    }

    /// Drop `stamp` from `sig`'s sets if it is there.
    pub(crate) fn remove(&self, sig: Sig, stamp: u64) {
        for t in self.levels.iter().filter_map(OnceLock::get) {
            let i = set_of(sig, t);
            for s in &t[i..i + 2] {
                let _ = s.compare_exchange(stamp, EMPTY, Ordering::AcqRel, Ordering::Relaxed);
            }
        }
    }

    /// Bytes of this PCC's tables.
    pub(crate) fn bytes(&self) -> usize {
        self.levels
            .iter()
            .filter_map(OnceLock::get)
            .map(|t| std::mem::size_of_val::<[AtomicU64]>(t))
            .sum()
    }
}

/// Store `stamp` in `sig`'s set of `t`; false if it was there already.
fn put(t: &[AtomicU64], sig: Sig, stamp: u64) -> bool {
    let i = set_of(sig, t);
    let (a, b) = (&t[i], &t[i + 1]);
    let (va, vb) = (a.load(Ordering::Relaxed), b.load(Ordering::Relaxed));
    if va == stamp || vb == stamp {
        return false;
    }
    // Prefer an empty slot; otherwise replace the older stamp (stamps grow with time).
    let victim = if va == EMPTY || (vb != EMPTY && va < vb) {
        a
    } else {
        b
    };
    victim.store(stamp, Ordering::Release);
    true
}

impl Drop for Pcc {
    fn drop(&mut self) {
        self.budget.release(self.bytes());
    }
}

/// How many interned credentials are kept while nobody uses them.
const CREDS_KEPT: usize = 1024;

impl Cache {
    /// The interned state of `cred` (one per credential and `check`), created on first use.
    /// Hits read the papaya map lock-free; only creating an entry takes `creds_new`.
    pub(crate) fn intern(&self, cred: Cred, check: bool) -> Creds {
        let key = (cred, check);
        let m = self.creds.pin();
        let tick = self.creds_tick.load(Ordering::Relaxed);
        let used = |s: &Arc<CredState>| {
            // Written only when it changes: a tick moves only when a credential is created.
            if s.last_use.load(Ordering::Relaxed) != tick {
                s.last_use.store(tick, Ordering::Relaxed);
            }
            Creds(s.clone())
        };
        if let Some(s) = m.get(&key) {
            return used(s);
        }
        let _new = self.creds_new.lock();
        if let Some(s) = m.get(&key) {
            return used(s);
        }
        if m.len() >= CREDS_KEPT {
            // Keep those in use elsewhere; the others start over when next seen.
            m.retain(|_, s| Arc::strong_count(s) > 1);
        }
        let tick = self.creds_tick.fetch_add(1, Ordering::Relaxed) + 1;
        let pcc = Pcc::new(
            if check { self.config.pcc_slots } else { 0 },
            self.pcc_budget.clone(),
        );
        let s = Arc::new(CredState {
            cred: key.0.clone(),
            check,
            pcc,
            last_use: AtomicU64::new(tick),
        });
        m.insert(key, s.clone());
        Creds(s)
    }

    /// Give `cs`'s PCC its next level, evicting credentials nobody holds (least recently
    /// interned first) if the budget has no room for it; then insert `stamp` for `sig`
    /// (again: its first insert found no table, or a full one).
    pub(crate) fn grow_pcc(&self, cs: &CredState, sig: Sig, stamp: u64) {
        if !cs.pcc.grow() {
            self.evict_creds(cs);
            cs.pcc.grow();
        }
        cs.pcc.insert(sig, stamp);
    }

    fn evict_creds(&self, cs: &CredState) {
        let Some(need) = cs.pcc.next_bytes() else {
            return;
        };
        {
            let _new = self.creds_new.lock();
            let m = self.creds.pin();
            let mut idle: Vec<(u64, usize, &(Cred, bool))> = m
                .iter()
                .filter(|(_, s)| Arc::strong_count(s) == 1 && s.pcc.bytes() > 0)
                .map(|(k, s)| (s.last_use.load(Ordering::Relaxed), s.pcc.bytes(), k))
                .collect();
            idle.sort_unstable_by_key(|&(t, _, _)| t);
            // Bytes that will come back as the evicted states are dropped (the map frees
            // them once no reader can still see them).
            let mut freed = 0;
            let room = self.pcc_budget.limit.saturating_sub(self.pcc_budget.used());
            for (_, bytes, k) in idle {
                if room + freed >= need {
                    break;
                }
                m.remove_if(k, |_, s| Arc::strong_count(s) == 1).ok();
                freed += bytes;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pcc(slots: usize) -> Pcc {
        let p = Pcc::new(slots, PccBudget::new(usize::MAX));
        assert!(p.grow());
        p
    }

    #[test]
    fn pcc_confirms_only_the_exact_entry() {
        let p = pcc(8);
        p.insert(42, 7);
        assert!(p.check(42, 7));
        assert!(!p.check(42, 8));
        p.insert(42, 9);
        assert!(p.check(42, 7) && p.check(42, 9), "two ways");
        p.insert(42, 11);
        assert!(!p.check(42, 7), "the older stamp is replaced");
        p.remove(42, 9);
        assert!(!p.check(42, 9));
    }

    #[test]
    fn a_pcc_without_a_table_confirms_nothing() {
        let p = Pcc::new(1 << 16, PccBudget::new(0));
        assert!(p.insert(42, 7), "wants a table");
        assert!(!p.grow(), "no budget");
        assert!(!p.check(42, 7));
        assert_eq!(p.bytes(), 0);
    }

    #[test]
    fn levels_grow_within_the_budget_and_keep_their_stamps() {
        let b = PccBudget::new(64 * 8 + 128 * 8);
        let p = Pcc::new(1 << 16, b.clone());
        assert!(p.grow());
        let sig = |i: u64| (u128::from(i) << 64) | u128::from(i);
        let mut want = false;
        for i in 1..=64 {
            want = p.insert(sig(i), 1000 + i);
        }
        assert!(want, "full: asks for the next level");
        assert!(p.grow());
        assert_eq!(p.bytes(), 64 * 8 + 128 * 8);
        assert_eq!(b.used(), p.bytes());
        for i in 1..=64 {
            assert!(p.check(sig(i), 1000 + i), "stamp {i} of the older level");
            assert!(!p.check(sig(i), 2000 + i));
        }
        for i in 1..=200 {
            p.insert(sig(i + 100), 5000 + i);
        }
        assert!(!p.grow(), "the budget is spent");
        assert_eq!(p.top.load(Ordering::Relaxed), 2);
        p.remove(sig(3), 1003);
        assert!(!p.check(sig(3), 1003), "removed from every level");
        drop(p);
        assert_eq!(b.used(), 0, "given back");
    }

    /// A PCC refused its first table while the budget was full asks again as soon as the
    /// budget has room, not only every `first`-th insert (`pcc_bound.rs`
    /// `concurrent_churn_stays_within_the_bound` failed on this: a private user's credential
    /// from the churn got no fast path in its next 12 lookups, with 70 KB of room).
    #[test]
    fn a_refused_pcc_asks_again_once_the_budget_has_room() {
        let b = PccBudget::new(64 * 8);
        let other = Pcc::new(1 << 16, b.clone());
        assert!(other.grow(), "the other takes the whole budget");
        let p = Pcc::new(1 << 16, b.clone());
        assert!(p.insert(1, 1), "the first insert asks");
        assert!(!p.grow(), "no room");
        for i in 2..10u64 {
            assert!(
                !p.insert(u128::from(i), i),
                "no room, not yet the 64th insert: insert {i} asked"
            );
        }
        drop(other);
        assert!(p.insert(10, 10), "room came back: the next insert asks");
        assert!(p.grow());
        p.insert(10, 10);
        assert!(p.check(10, 10));
    }

    #[test]
    fn levels_stay_within_pcc_slots() {
        let p = Pcc::new(1 << 10, PccBudget::new(usize::MAX));
        while p.grow() && p.next_bytes().is_some() {}
        assert_eq!(p.bytes() / 8, 64 + 128 + 256 + 512);
        let tiny = pcc(4);
        assert_eq!(tiny.bytes() / 8, 4);
        assert!(tiny.next_bytes().is_none());
    }
}
