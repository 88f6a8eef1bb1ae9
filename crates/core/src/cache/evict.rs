//! Bounded memory (docs/core.md, I10): counting dentries, CLOCK eviction of unreferenced
//! leaves over a queue of weak references (a hit only sets `REFERENCED`, it never moves a
//! list entry), and the lazy sweep of DLHT entries that can no longer validate.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use super::dentry::{COMPLETE, DEAD, EVICTED, MOUNTED, REFERENCED};
use super::{Cache, NodeKind, NodeRef};

impl Cache {
    /// Count a dentry just inserted in the tree; evict if over the bound.
    pub(crate) fn account_new(&self, node: &NodeRef) {
        // New dentries start referenced: the caller is about to use them.
        node.touch();
        let n = self.entries.fetch_add(1, Ordering::Relaxed) + 1;
        {
            let mut q = self.lru.lock();
            if q.len() == q.capacity() {
                // Grow by a quarter, not double: one weak pointer per dentry, ~12% unused on
                // average instead of ~33% (still amortized O(1) per insert).
                let more = q.len() / 4 + 64;
                q.reserve_exact(more);
            }
            q.push_back(Arc::downgrade(node));
            if q.len() > 2 * self.config.max_entries + 1024 {
                q.retain(|w| w.upgrade().is_some_and(|d| !d.has(DEAD)));
            }
        }
        if n as usize > self.config.max_entries {
            self.evict((self.config.max_entries / 64).max(16));
        }
    }

    /// Evict up to `want` unreferenced leaves (CLOCK: a referenced dentry gets a second chance;
    /// hits only set a bit, they never move list entries).
    pub(crate) fn evict(&self, want: usize) {
        let Some(mut q) = self.lru.try_lock() else {
            return;
        };
        let mut evicted = 0;
        // One pass at most: a dentry just inserted (marked referenced) survives this call.
        let mut budget = q.len();
        while evicted < want && budget > 0 {
            budget -= 1;
            let Some(w) = q.pop_front() else { break };
            let Some(n) = w.upgrade() else { continue };
            let f = n.flags.load(Ordering::Acquire);
            if f & (DEAD | EVICTED) != 0 {
                continue;
            }
            if f & REFERENCED != 0 {
                n.flags.fetch_and(!REFERENCED, Ordering::AcqRel);
                q.push_back(w);
                continue;
            }
            let leaf = !n.inner.has_children();
            if !leaf || f & MOUNTED != 0 || n.pins.load(Ordering::Acquire) > 0 {
                q.push_back(w);
                continue;
            }
            let Some(parent) = n.parent_ref() else {
                continue;
            };
            {
                let mut pi = parent.inner.write();
                let name = n.link().name.clone();
                if !pi
                    .children
                    .as_mut()
                    .is_some_and(|ch| ch.remove_node(&name, &n))
                {
                    continue;
                }
                if matches!(n.kind(), NodeKind::Positive(_)) {
                    // The listing is no longer all here (SOSP'15 §5.1).
                    parent.clear(COMPLETE);
                }
            }
            if n.flags.fetch_or(EVICTED, Ordering::AcqRel) & (DEAD | EVICTED) == 0 {
                self.entries.fetch_sub(1, Ordering::Relaxed);
            }
            n.version
                .store(self.seq.fetch_add(1, Ordering::SeqCst), Ordering::Release);
            evicted += 1;
            self.stats.evictions.inc();
        }
        drop(q);
        if evicted > 0 {
            self.sweep_dlht();
        }
    }

    /// Drop DLHT entries that can no longer be valid (their dentries were invalidated).
    pub(crate) fn sweep_dlht(&self) {
        for ns in self.namespaces.lock().iter().filter_map(Weak::upgrade) {
            ns.dlht.sweep();
        }
    }
}
