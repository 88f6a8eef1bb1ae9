//! Invalidation (SOSP'15 §3.2): invalidation windows, version bumps of a subtree, kills, and
//! the checks that tell a backend call made without locks whether a rename raced it.
//!
//! Every change that can alter what a path resolves to, or who may resolve it, runs inside an
//! invalidation window and bumps the versions of the dentries it affects (docs/core.md, I1 and
//! I4); DLHT entries and PCC slots that recorded the old versions stop validating.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use super::dentry::{DEAD, EVICTED, HAS_CHILDREN, MOUNTED};
use super::{Cache, NodeRef};

/// How often a backend question is asked again when a rename overlapped it.
pub(crate) const RETRIES: u32 = 100;

/// An open invalidation window: slow-path walks that overlap it do not publish.
pub(crate) struct InvalWindow<'a>(&'a Cache);

impl Drop for InvalWindow<'_> {
    fn drop(&mut self) {
        self.0.inval_end.fetch_add(1, Ordering::SeqCst);
    }
}

impl Cache {
    /// Open an invalidation window. Everything that can change what a path resolves to, or
    /// who may resolve it, happens inside one: the change itself (attributes, tree links),
    /// then the version bumps of the affected subtrees.
    pub(crate) fn inval_window(&self) -> InvalWindow<'_> {
        self.inval_start.fetch_add(1, Ordering::SeqCst);
        self.stats.invalidations.inc();
        InvalWindow(self)
    }

    /// Give `root` and every cached descendant (following mounts in every namespace) a new
    /// version, which invalidates their DLHT entries and every PCC slot confirming them.
    /// Must be called inside an invalidation window.
    pub(crate) fn bump_subtree(&self, root: &NodeRef) {
        let v = self.seq.fetch_add(1, Ordering::AcqRel);
        let mut n = 0u64;
        let mut stack: Vec<NodeRef> = vec![root.clone()];
        while let Some(d) = stack.pop() {
            // `v` is fresh, so a dentry already holding it was visited in this walk: stale
            // interior references (children moved elsewhere) and bind mounts of a directory
            // inside itself cannot make the walk go round in circles.
            if d.version.swap(v, Ordering::AcqRel) == v {
                continue;
            }
            n += 1;
            let f = d.flags.load(Ordering::Acquire);
            if f & MOUNTED != 0 {
                for ns in self.namespaces.lock().iter().filter_map(Weak::upgrade) {
                    if let Some(m) = ns.mounts.read().get(&d.id) {
                        stack.push(m.root.clone());
                    }
                }
            }
            if f & HAS_CHILDREN == 0 {
                continue;
            }
            // Leaves are not visited: their entries check this (their parent's) version.
            let inner = d.inner.read();
            if let Some(ch) = &inner.children {
                for c in ch.interior.iter().filter_map(Weak::upgrade) {
                    // Only children still filed here; moved ones are reached from their new
                    // parent (or were bumped by the move itself).
                    let here = c
                        .link
                        .load()
                        .parent
                        .as_ref()
                        .is_some_and(|p| std::ptr::eq(p.as_ptr(), Arc::as_ptr(&d)));
                    if here {
                        stack.push(c);
                    }
                }
            }
        }
        self.stats.invalidated_entries.add(n);
    }

    /// Take a dentry out of service: mark it dead and bump its subtree. The caller has
    /// already removed it from its parent's map.
    pub(crate) fn kill(&self, node: &NodeRef) {
        let prev = node.flags.fetch_or(DEAD, Ordering::AcqRel);
        if prev & (DEAD | EVICTED) == 0 {
            self.entries.fetch_sub(1, Ordering::Relaxed);
        }
        self.bump_subtree(node);
        // Its cached children can no longer be reached; free them now.
        let children = node.inner.write().take_children();
        for c in &children {
            self.kill(c);
        }
    }

    /// The invalidation counter if no window is open, read before computing a backend path.
    pub(crate) fn quiet(&self) -> Option<u64> {
        let e0 = self.inval_end.load(Ordering::SeqCst);
        let s0 = self.inval_start.load(Ordering::SeqCst);
        (s0 == e0).then_some(s0)
    }

    /// Whether no window opened since [`Cache::quiet`]: a backend path computed then was right.
    pub(crate) fn still_quiet(&self, q: Option<u64>) -> bool {
        q.is_some_and(|s0| self.inval_start.load(Ordering::SeqCst) == s0)
    }
}
