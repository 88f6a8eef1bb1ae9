//! The prefix-check cache (PCC, SOSP'15 §3.1) and credential interning.
//!
//! Per credential, a set-associative array of DLHT entry stamps. A slot says "this credential
//! passed every permission check along this path when it resolved to the DLHT entry with this
//! stamp". Stamps are unique per DLHT entry (global counter), so a PCC slot can only confirm
//! the exact entry its walk produced. Keying the PCC by path signature rather than by dentry
//! (the paper keys by dentry) makes aliases through symlinks and bind mounts need no special
//! alias dentries: each path carries its own prefix-check result (docs/core.md, I3).
//!
//! Equal credentials share one [`CredState`] (and so one PCC): [`Cache::intern`] hands out
//! the live one from the `creds` table, keyed by (credential, whether the cache checks).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::dlht::Sig;
use super::Cache;
use crate::Cred;

/// Per-credential state: the credential and its prefix-check cache.
pub(crate) struct CredState {
    pub(crate) cred: Cred,
    /// Whether the cache applies its access policy (false: the caller checked already).
    pub(crate) check: bool,
    pub(crate) pcc: Pcc,
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

const EMPTY: u64 = 0;

/// A bounded, lock-free prefix-check cache: 2-way set-associative slots holding DLHT entry
/// stamps. A slot needs no signature: stamps are unique per DLHT entry and an entry lives under
/// exactly one signature, so "the slot for `sig` holds the stamp of the entry found under `sig`"
/// can only be true if this credential's walk produced (or re-used) exactly that entry. One
/// 64-bit atomic per slot: no torn reads, no locks; readers never write.
pub(crate) struct Pcc {
    slots: Box<[AtomicU64]>,
    mask: usize,
}

impl Pcc {
    pub(crate) fn new(slots: usize) -> Pcc {
        let n = slots.max(2).next_power_of_two();
        let slots = (0..n).map(|_| AtomicU64::new(EMPTY)).collect();
        Pcc { slots, mask: n - 1 }
    }

    /// First slot of `sig`'s 2-slot set. The DLHT indexes by the low half; use the high half.
    #[inline]
    fn set(&self, sig: Sig) -> usize {
        ((sig >> 64) as usize) & self.mask & !1
    }

    /// Whether this credential's walk of `sig` produced the DLHT entry `stamp`.
    #[inline]
    pub(crate) fn check(&self, sig: Sig, stamp: u64) -> bool {
        let i = self.set(sig);
        self.slots[i].load(Ordering::Acquire) == stamp
            || self.slots[i + 1].load(Ordering::Acquire) == stamp
    }

    pub(crate) fn insert(&self, sig: Sig, stamp: u64) {
        debug_assert!(stamp != EMPTY);
        let i = self.set(sig);
        let (a, b) = (&self.slots[i], &self.slots[i + 1]);
        let (va, vb) = (a.load(Ordering::Relaxed), b.load(Ordering::Relaxed));
        if va == stamp || vb == stamp {
            return;
        }
        // Prefer an empty slot; otherwise replace the older stamp (stamps grow with time).
        let victim = if va == EMPTY || (vb != EMPTY && va < vb) {
            a
        } else {
            b
        };
        victim.store(stamp, Ordering::Release);
    }

    /// Drop `stamp` from `sig`'s set if it is there.
    pub(crate) fn remove(&self, sig: Sig, stamp: u64) {
        let i = self.set(sig);
        for s in &self.slots[i..i + 2] {
            let _ = s.compare_exchange(stamp, EMPTY, Ordering::AcqRel, Ordering::Relaxed);
        }
    }

    pub(crate) fn bytes(&self) -> usize {
        self.slots.len() * std::mem::size_of::<AtomicU64>()
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
        if let Some(s) = m.get(&key) {
            return Creds(s.clone());
        }
        let _new = self.creds_new.lock();
        if let Some(s) = m.get(&key) {
            return Creds(s.clone());
        }
        if m.len() >= CREDS_KEPT {
            // Keep those in use elsewhere; the others start over when next seen.
            m.retain(|_, s| Arc::strong_count(s) > 1);
        }
        let pcc = Pcc::new(if check { self.config.pcc_slots } else { 2 });
        let s = Arc::new(CredState {
            cred: key.0.clone(),
            check,
            pcc,
        });
        m.insert(key, s.clone());
        Creds(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pcc_confirms_only_the_exact_entry() {
        let p = Pcc::new(8);
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
}
