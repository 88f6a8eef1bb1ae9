//! Dentries: the nodes of the cached tree.
//!
//! Locking (see docs/core.md):
//! - `link` (parent + name) changes only under the cache's rename lock and the parents'
//!   `inner` write locks; readers load it lock-free (arc-swap).
//! - `inner` (children map, symlink target) is a per-dentry reader-writer lock, taken only on
//!   the slow path and by writers, never by the fast path.
//! - `version` is bumped (never decreased) by invalidations; the fast path compares it with
//!   the version recorded in a direct-lookup entry.
//! - `attr` is replaced wholesale (arc-swap); readers copy it out.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use arc_swap::{ArcSwap, ArcSwapOption};
use hashbrown::HashMap;
use parking_lot::RwLock;

use super::{NodeKind, NodeRef, Super};
use crate::{Attr, FileType};

pub(crate) const DEAD: u32 = 1;
pub(crate) const COMPLETE: u32 = 2;
pub(crate) const REFERENCED: u32 = 4;
pub(crate) const MOUNTED: u32 = 8;
pub(crate) const HAS_CHILDREN: u32 = 16;

pub(crate) struct Link {
    /// Weak, so the tree has no reference cycles; a dentry in the tree always has a live
    /// parent because eviction only removes leaves.
    pub(crate) parent: Option<Weak<Dentry>>,
    pub(crate) name: Box<[u8]>,
}

#[derive(Default)]
pub(crate) struct Inner {
    /// Children by name: positive entries, negative entries and deep negatives.
    pub(crate) children: Option<Box<HashMap<Box<[u8]>, NodeRef>>>,
    /// Target of a symbolic link, once read.
    pub(crate) target: Option<Box<[u8]>>,
    /// Bumped whenever `children` changes; lets a backend call made without the lock detect
    /// that the directory changed meanwhile.
    pub(crate) gen: u64,
}

impl Inner {
    pub(crate) fn child(&self, name: &[u8]) -> Option<&NodeRef> {
        self.children.as_ref().and_then(|c| c.get(name))
    }
    pub(crate) fn children_mut(&mut self) -> &mut HashMap<Box<[u8]>, NodeRef> {
        self.children.get_or_insert_with(Default::default)
    }
}

pub struct Dentry {
    pub(crate) id: u64,
    pub(crate) sb: Arc<Super>,
    pub(crate) kind: NodeKind,
    pub(crate) link: ArcSwap<Link>,
    pub(crate) version: AtomicU64,
    /// Inode number, known even when `attr` is not (entries learned from readdir).
    pub(crate) ino: AtomicU64,
    pub(crate) flags: AtomicU32,
    /// Front-end pins (e.g. inodes the kernel holds): pinned dentries are never evicted.
    pub(crate) pins: AtomicU32,
    pub(crate) attr: ArcSwapOption<Attr>,
    pub(crate) inner: RwLock<Inner>,
}

impl Dentry {
    pub(crate) fn new(
        id: u64,
        sb: Arc<Super>,
        kind: NodeKind,
        parent: Option<NodeRef>,
        name: &[u8],
        version: u64,
        attr: Option<Attr>,
    ) -> Dentry {
        Dentry {
            id,
            sb,
            kind,
            link: ArcSwap::from_pointee(Link {
                parent: parent.as_ref().map(Arc::downgrade),
                name: name.into(),
            }),
            version: AtomicU64::new(version),
            ino: AtomicU64::new(attr.map_or(0, |a| a.ino)),
            flags: AtomicU32::new(0),
            pins: AtomicU32::new(0),
            attr: ArcSwapOption::new(attr.map(Arc::new)),
            inner: RwLock::new(Inner::default()),
        }
    }

    #[inline]
    pub(crate) fn has(&self, flag: u32) -> bool {
        self.flags.load(Ordering::Acquire) & flag != 0
    }
    #[inline]
    pub(crate) fn set(&self, flag: u32) {
        self.flags.fetch_or(flag, Ordering::AcqRel);
    }
    #[inline]
    pub(crate) fn clear(&self, flag: u32) {
        self.flags.fetch_and(!flag, Ordering::AcqRel);
    }
    /// Lazy LRU: mark used without writing when already marked.
    #[inline]
    pub(crate) fn touch(&self) {
        if self.flags.load(Ordering::Relaxed) & REFERENCED == 0 {
            self.flags.fetch_or(REFERENCED, Ordering::Relaxed);
        }
    }
    pub(crate) fn is_dir(&self) -> bool {
        self.kind == NodeKind::Positive(FileType::Directory)
    }
    pub(crate) fn attr_copy(&self) -> Option<Attr> {
        self.attr.load().as_deref().copied()
    }
    pub(crate) fn set_attr(&self, a: Option<Attr>) {
        if let Some(a) = a {
            self.ino.store(a.ino, Ordering::Relaxed);
        }
        self.attr.store(a.map(Arc::new));
    }
    pub(crate) fn parent_ref(&self) -> Option<NodeRef> {
        self.link.load().parent.as_ref().and_then(Weak::upgrade)
    }
}

impl Drop for Dentry {
    fn drop(&mut self) {
        // Tear down long child chains iteratively so dropping a deep tree cannot overflow the
        // stack.
        let mut stack: Vec<NodeRef> = Vec::new();
        if let Some(c) = self.inner.get_mut().children.take() {
            stack.extend(c.into_values());
        }
        while let Some(n) = stack.pop() {
            if let Ok(mut n) = Arc::try_unwrap(n) {
                if let Some(c) = n.inner.get_mut().children.take() {
                    stack.extend(c.into_values());
                }
            }
        }
    }
}
