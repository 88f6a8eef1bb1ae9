//! Invalidation (SOSP'15 §3.2): invalidation windows, version bumps of a subtree, kills, and
//! the one helper through which the cache asks the backend about a dentry by its path
//! ([`Cache::by_path`]).
//!
//! Every change that can alter what a path resolves to, or who may resolve it, runs inside an
//! invalidation window and bumps the versions of the dentries it affects (docs/core.md, I1 and
//! I4); DLHT entries and PCC slots that recorded the old versions stop validating.
//!
//! **Backend calls by path.** A lookup, getattr, readlink or readdir on a cache miss is asked
//! without locks: the backend path is computed from the dentry links, then the backend
//! answers. What can make the answer wrong?
//! - A **rename** through the cache of the dentry or an ancestor between computing the path
//!   and the backend answering: the path then names another object (or none), and the answer
//!   is about the wrong file. Nothing else the cache does changes a live dentry's backend
//!   path: unlink/rmdir/outside removals kill the dentry (whatever is cached for it then is
//!   never used), mounts do not change backend paths, and revival relinks only dead dentries
//!   (whose path cannot be computed). This is what [`Cache::by_path`] checks, with a rename
//!   sequence count in the style of Linux's `rename_lock` seqlock (path-lookup.rst): renames
//!   make it odd before the backend renames and even again after the links are updated; a
//!   call that saw it odd, or changed, is asked again. After [`OPTIMISTIC_TRIES`] it takes
//!   `tree_lock` (shared), which renames hold exclusively, so the last try cannot race one:
//!   the answer is never unchecked.
//! - Any other change (a chmod, a create, an unlink of another name, an outside change) does
//!   not make the answer *wrong*: it was the backend's answer at an instant during the call.
//!   It can only make it *older* than the change, which matters for what gets cached, and
//!   that is checked where it is cached, against the state of what it is cached on: the
//!   directory's `gen` and version for a child (`insert_child`) or a listing
//!   (`merge_listing`), the version and the attribute cell's sequence for attributes
//!   (`attr_of`). So an invalidation window elsewhere no longer makes a lookup ask again.

use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::sync::Weak;

use super::dentry::{Dentry, COMPLETE, DEAD, EVICTED, HAS_CHILDREN, HAS_INTERIOR, MOUNTED};
use super::{Cache, NodeRef};
use crate::Result;

/// How often a backend call by path is tried without a lock before [`Cache::by_path`] takes
/// `tree_lock` to exclude renames.
pub(crate) const OPTIMISTIC_TRIES: u32 = 3;

thread_local! {
    /// [`Cache::bump_subtree`]'s stack, reused by the next invalidation on this thread.
    static BUMP_STACK: Cell<Vec<NodeRef>> = const { Cell::new(Vec::new()) };
}

/// Largest stack (in entries) kept for reuse; a bigger one is freed after its walk.
const MAX_KEPT_STACK: usize = 1 << 16;

/// The write side of the rename sequence count: odd while held. Only taken under
/// `tree_lock.write()` (one rename at a time), so a plain increment pair is enough.
pub(crate) struct RenameSeq<'a>(&'a Cache);

impl Drop for RenameSeq<'_> {
    fn drop(&mut self) {
        self.0.rename_seq.fetch_add(1, Ordering::SeqCst);
    }
}

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
    ///
    /// The cost is memory latency: a bump runs right after a change, when the subtree's
    /// dentries are usually not in the CPU caches. So each dentry is bumped where it is first
    /// reached, under its parent's read lock, without touching its reference count (the
    /// interior list holds strong references), after one pass of plain loads over the
    /// siblings that lets their cache misses overlap (a locked `swap` on a missing line stalls
    /// everything after it); only a dentry that has interior children (`HAS_INTERIOR`) or
    /// mounts goes on the stack to have its own list read, so a directory of files costs one
    /// version store and no lock. (Each dentry used to be cloned onto the stack, bumped when
    /// popped, and read-locked: up to four cache misses and three locked instructions each,
    /// ~90 ns per directory, 9 of the 24 us of a rename of 100 directories of 99 files.)
    pub(crate) fn bump_subtree(&self, root: &NodeRef) {
        let v = self.seq.fetch_add(1, Ordering::SeqCst);
        let mut n = 0u64;
        // `v` is fresh, so a dentry already holding it was visited in this walk: stale
        // interior references (children moved elsewhere) and bind mounts of a directory
        // inside itself cannot make the walk go round in circles. The flags are read after
        // the store, as before: whoever lists an interior child under a dentry sets
        // `HAS_INTERIOR` and `HAS_CHILDREN` under its write lock, as for `HAS_CHILDREN` alone.
        let visit = |d: &Dentry, n: &mut u64| -> Option<u16> {
            if d.version.swap(v, Ordering::AcqRel) == v {
                return None;
            }
            *n += 1;
            Some(d.flags.load(Ordering::Acquire))
        };
        // Whether a bumped dentry's own interior list or mounts must be read.
        let expand = |f: u16| {
            f & MOUNTED != 0 || f & (HAS_CHILDREN | HAS_INTERIOR) == HAS_CHILDREN | HAS_INTERIOR
        };
        // The stack (dentries bumped, whose lists or mounts are still to be read) is kept per
        // thread and reused: no allocation while invalidating (a growing `Vec` made glibc
        // consolidate its free lists inside the timed window after a burst of frees).
        let mut stack = BUMP_STACK.take();
        if visit(root, &mut n).is_some_and(expand) {
            stack.push(root.clone());
        }
        while let Some(d) = stack.pop() {
            let f = d.flags.load(Ordering::Acquire);
            if f & MOUNTED != 0 {
                for ns in self.namespaces.lock().iter().filter_map(Weak::upgrade) {
                    if let Some(m) = ns.mounts.read().get(&d.id) {
                        if visit(&m.root, &mut n).is_some_and(expand) {
                            stack.push(m.root.clone());
                        }
                    }
                }
            }
            if f & (HAS_CHILDREN | HAS_INTERIOR) != HAS_CHILDREN | HAS_INTERIOR {
                continue;
            }
            // Leaves are not visited: their entries check this (their parent's) version.
            // Children moved away were taken off `interior` by the move (and bumped by it), so
            // their links need not be loaded here.
            let inner = d.inner.read();
            let Some(ch) = &inner.children else {
                continue;
            };
            // Touch every child first (independent loads: their misses overlap), then bump.
            // Both words: the version and the flags may lie on different cache lines.
            let mut warm = 0u64;
            for c in &ch.interior {
                warm ^=
                    c.version.load(Ordering::Relaxed) ^ u64::from(c.flags.load(Ordering::Relaxed));
            }
            std::hint::black_box(warm);
            for c in &ch.interior {
                if visit(c, &mut n).is_some_and(expand) {
                    stack.push(c.clone());
                }
            }
        }
        self.stats.invalidated_entries.add(n);
        if stack.capacity() <= MAX_KEPT_STACK {
            BUMP_STACK.set(stack);
        }
    }

    /// Take a dentry out of service: mark it dead and bump its subtree. The caller has
    /// already removed it from its parent's map. A dead directory is never complete: its
    /// children are freed below, and a creation racing the kill may still put one into its
    /// map (`install`: the new dentry stays live there, so the creation's reply can still
    /// read its attributes); a holder that lists it (a kernel inode the change feed's
    /// report has not reached yet) must not be served that map as the directory's listing
    /// (torture seed 540: a file created through the mount into a directory replaced in
    /// SRC, the old directory listed with only that file).
    pub(crate) fn kill(&self, node: &NodeRef) {
        let prev = node.flags.fetch_or(DEAD, Ordering::AcqRel);
        node.clear(COMPLETE);
        if prev & (DEAD | EVICTED) == 0 {
            self.entries.fetch_sub(1, Ordering::Relaxed);
        }
        self.bump_subtree(node);
        // Its cached children can no longer be reached; free them now (a leaf that never had
        // children gets no lock box for this).
        let children = node.inner.take_children();
        for c in &children {
            self.kill(c);
        }
    }

    /// Start changing backend paths (a rename): from now until the guard drops, backend paths
    /// computed from the old links may name other objects. Call with `tree_lock` held for
    /// writing, right before the backend renames, and keep the guard until every link is
    /// updated. No backend call by path may be made while it is held (it would wait for
    /// itself).
    pub(crate) fn rename_begin(&self) -> RenameSeq<'_> {
        self.rename_seq.fetch_add(1, Ordering::SeqCst);
        RenameSeq(self)
    }

    /// Ask the backend about `node` by its backend path: `call` gets the path and returns the
    /// backend's answer (and whatever the caller read before asking, to check later whether
    /// to cache it). The answer is one the backend gave for a path that named `node` during
    /// the whole call: if a rename through the cache overlapped the call, it is asked again,
    /// and after [`OPTIMISTIC_TRIES`] under `tree_lock`, which excludes renames. Fails only
    /// if `node` has no backend path (dead: ENOENT).
    ///
    /// A thread that holds `tree_lock` (a mutation, or a rename before it calls
    /// [`Cache::rename_begin`]) never retries: the count only changes under the write lock.
    /// Hold no dentry lock when calling this (lock order: `tree_lock` comes first).
    pub(crate) fn by_path<T>(&self, node: &Dentry, mut call: impl FnMut(&[u8]) -> T) -> Result<T> {
        for _ in 0..OPTIMISTIC_TRIES {
            let s0 = self.rename_seq.load(Ordering::SeqCst);
            if s0 & 1 == 0 {
                let p = self.path_of(node)?;
                let r = call(&p);
                if self.rename_seq.load(Ordering::SeqCst) == s0 {
                    return Ok(r);
                }
            }
            std::thread::yield_now();
        }
        // `read_recursive`: a caller may already hold it shared (then no rename can be
        // running, but a queued writer must not deadlock us).
        let _t = self.tree_lock.read_recursive();
        let p = self.path_of(node)?;
        Ok(call(&p))
    }
}
