//! Dentries: the nodes of the cached tree.
//!
//! Locking (see docs/core.md):
//! - `link` (parent + name) changes only under the cache's rename lock and the parents'
//!   `inner` write locks; readers load it lock-free (arc-swap).
//! - `inner` (children map, symlink target) is a per-dentry reader-writer lock, taken only on
//!   the slow path and by writers, never by the fast path.
//! - `version` is bumped (never decreased) by invalidations; the fast path compares it with
//!   the version recorded in a direct-lookup entry.
//! - `attr` is stored inline under a sequence lock ([`AttrCell`]): readers copy the words out
//!   and retry if a writer was active; writers spin on the sequence (never across a call).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use arc_swap::ArcSwap;
use std::hash::BuildHasher;
use std::sync::LazyLock;

use hashbrown::{DefaultHashBuilder, HashTable};
use parking_lot::RwLock;

use super::{NodeKind, NodeRef, Super};
use crate::{Attr, FileType};

pub(crate) const DEAD: u32 = 1;
/// Taken out of the tree to reclaim memory. Unlike `DEAD`, the name still refers to it (its
/// backend path is still right for whoever holds it), but it is no longer kept coherent, so no
/// fast-path entry may use it.
pub(crate) const EVICTED: u32 = 32;
pub(crate) const COMPLETE: u32 = 2;
pub(crate) const REFERENCED: u32 = 4;
pub(crate) const MOUNTED: u32 = 8;
pub(crate) const HAS_CHILDREN: u32 = 16;
/// A warm-restart snapshot's validated contents wait for this directory in `Cache::pending`
/// (persist.rs): installed at its first miss or plain listing.
pub(crate) const PENDING: u32 = 64;

pub(crate) struct Link {
    /// Weak, so the tree has no reference cycles; a dentry in the tree always has a live
    /// parent because eviction only removes leaves.
    pub(crate) parent: Option<Weak<Dentry>>,
    pub(crate) name: Box<[u8]>,
}

static NAME_HASH: LazyLock<DefaultHashBuilder> = LazyLock::new(DefaultHashBuilder::default);

#[inline]
fn name_hash(name: &[u8]) -> u64 {
    NAME_HASH.hash_one(name)
}

/// A directory's children, keyed by each child's own current name (not stored twice).
/// A child's `link` is only changed while its parent's `inner` is write-locked and the child is
/// out of the table, so a child in the table always hashes by the name in its link.
#[derive(Default)]
pub(crate) struct ChildMap {
    t: HashTable<NodeRef>,
    /// The children that can have children of their own (directories, and entries below which
    /// deep negatives hang): what an invalidation must visit. Leaves are never listed, so
    /// invalidating a directory of 10,000 files touches none of them. A child taken out of the
    /// map (removed, moved away, evicted) is taken off this list too, so an invalidation
    /// visits only children filed here (without loading their links) and a directory that
    /// dirs pass through (`mkdir tmp/x; mv tmp/x dst`) does not collect them. It may still
    /// hold dead or displaced children (dropped when the list is compacted); visiting those
    /// only over-invalidates.
    pub(crate) interior: Vec<Weak<Dentry>>,
    /// Target of a symbolic link (symlinks have no children; they share this box).
    pub(crate) target: Option<Box<[u8]>>,
    /// See [`Inner::gen`]. Kept here rather than in every dentry: only directories whose
    /// children changed need it (the box, once made, is never dropped, so it never goes back).
    gen: u64,
}

impl ChildMap {
    pub(crate) fn get(&self, name: &[u8]) -> Option<&NodeRef> {
        self.t
            .find(name_hash(name), |n| *n.link.load().name == *name)
    }

    /// Insert `node` under its current name; returns the child it displaced.
    pub(crate) fn insert(&mut self, node: NodeRef) -> Option<NodeRef> {
        if node.is_dir() || node.has(HAS_CHILDREN) {
            self.add_interior(&node);
        }
        let name = node.link.load().name.clone();
        let h = name_hash(&name);
        match self.t.find_entry(h, |n| *n.link.load().name == *name) {
            Ok(mut e) => {
                let old = std::mem::replace(e.get_mut(), node);
                if !Arc::ptr_eq(&old, e.get()) {
                    self.unlist_interior(&old);
                }
                Some(old)
            }
            Err(_) => {
                self.t
                    .insert_unique(h, node, |n| name_hash(&n.link.load().name));
                None
            }
        }
    }

    pub(crate) fn remove(&mut self, name: &[u8]) -> Option<NodeRef> {
        match self
            .t
            .find_entry(name_hash(name), |n| *n.link.load().name == *name)
        {
            Ok(e) => {
                let n = e.remove().0;
                self.unlist_interior(&n);
                Some(n)
            }
            Err(_) => None,
        }
    }

    /// Remove `node` (by identity) that is filed under `name`.
    pub(crate) fn remove_node(&mut self, name: &[u8], node: &NodeRef) -> bool {
        match self.t.find_entry(name_hash(name), |n| Arc::ptr_eq(n, node)) {
            Ok(e) => {
                e.remove();
                self.unlist_interior(node);
                true
            }
            Err(_) => false,
        }
    }

    /// Take a child that left the map off the interior list (order does not matter).
    fn unlist_interior(&mut self, node: &Dentry) {
        if !(node.is_dir() || node.has(HAS_CHILDREN)) {
            return;
        }
        if let Some(i) = self
            .interior
            .iter()
            .position(|w| std::ptr::eq(w.as_ptr(), node))
        {
            self.interior.swap_remove(i);
        }
    }

    pub(crate) fn add_interior(&mut self, node: &NodeRef) {
        if self.interior.len() >= 16 && self.interior.len() > 2 * self.t.len() {
            self.interior
                .retain(|w| w.upgrade().is_some_and(|d| !d.has(DEAD)));
        }
        self.interior.push(Arc::downgrade(node));
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &NodeRef> {
        self.t.iter()
    }

    pub(crate) fn drain(&mut self) -> Vec<NodeRef> {
        self.interior.clear();
        self.t.drain().collect()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.t.is_empty()
    }

    pub(crate) fn len(&self) -> usize {
        self.t.len()
    }
}

#[derive(Default)]
pub(crate) struct Inner {
    /// Children (positive entries, negative entries, deep negatives), a symlink's target and
    /// the generation ([`Inner::gen`]). Once made, never set back to `None`.
    pub(crate) children: Option<Box<ChildMap>>,
}

impl Inner {
    /// Bumped whenever the children change; lets a backend call made without the lock detect
    /// that the directory changed meanwhile. 0 until the first bump; never decreases.
    #[inline]
    pub(crate) fn gen(&self) -> u64 {
        self.children.as_ref().map_or(0, |c| c.gen)
    }
    /// Record a change of the children (see [`Inner::gen`]); returns the new generation.
    pub(crate) fn bump_gen(&mut self) -> u64 {
        let c = self.children_mut();
        c.gen += 1;
        c.gen
    }
    pub(crate) fn child(&self, name: &[u8]) -> Option<&NodeRef> {
        self.children.as_ref().and_then(|c| c.get(name))
    }
    pub(crate) fn children_mut(&mut self) -> &mut ChildMap {
        self.children.get_or_insert_with(Default::default)
    }
    pub(crate) fn target(&self) -> Option<&[u8]> {
        self.children.as_ref().and_then(|c| c.target.as_deref())
    }
    pub(crate) fn set_target(&mut self, t: &[u8]) {
        self.children_mut().target = Some(t.into());
    }
    /// Detach every child (they are being killed or dropped).
    pub(crate) fn take_children(&mut self) -> Vec<NodeRef> {
        self.children
            .as_mut()
            .map(|c| c.drain())
            .unwrap_or_default()
    }
}

pub struct Dentry {
    pub(crate) id: u64,
    pub(crate) sb: Arc<Super>,
    pub(crate) kind: NodeKind,
    pub(crate) link: ArcSwap<Link>,
    pub(crate) version: AtomicU64,
    pub(crate) flags: AtomicU32,
    /// Attributes, and the front-end pins (`attr.pins`, in the cell's padding).
    pub(crate) attr: AttrCell,
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
            flags: AtomicU32::new(0),
            attr: AttrCell::new(attr, attr.map_or(0, |a| a.ino)),
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
    #[inline]
    pub(crate) fn attr_copy(&self) -> Option<Attr> {
        self.attr.load()
    }
    pub(crate) fn set_attr(&self, a: Option<Attr>) {
        self.attr.store(a);
    }
    pub(crate) fn parent_ref(&self) -> Option<NodeRef> {
        self.link.load().parent.as_ref().and_then(Weak::upgrade)
    }
}

impl Drop for Dentry {
    fn drop(&mut self) {
        // Tear down long child chains iteratively so dropping a deep tree cannot overflow the
        // stack.
        let mut stack: Vec<NodeRef> = self.inner.get_mut().take_children();
        while let Some(n) = stack.pop() {
            if let Ok(mut n) = Arc::try_unwrap(n) {
                stack.extend(n.inner.get_mut().take_children());
            }
        }
    }
}

/// Attributes stored inline under a sequence lock: readers copy them out with plain atomic
/// loads and retry if a writer was active, so `stat` on the fast path never takes a lock or
/// touches a reference count. A mode of 0 means "no attributes cached" (every real file has
/// type bits); the inode number (word 0) is kept even then, for listings from the cache.
/// Forgetting attributes sets [`FORGOTTEN`] in the mode word and keeps the rest: a directory
/// removed behind the cache's back is still permission-checked with its last attributes, as
/// Linux checks an open descriptor's (dead) inode. The sequence is 32 bits, as Linux's
/// `seqcount_t`: a reader (or a [`AttrCell::store_if_unchanged`] stamp) would need 2^31
/// writes of this one dentry during one read to be fooled. 104 bytes (it was 112).
pub(crate) struct AttrCell {
    seq: AtomicU32,
    /// Not an attribute: the dentry's front-end pins (e.g. inodes the kernel holds; pinned
    /// dentries are never evicted), kept here because the cell has 4 bytes of padding after
    /// `seq` (8 bytes less per dentry than a field of its own). The seqlock does not cover it.
    pub(crate) pins: AtomicU32,
    w: [AtomicU64; 12],
}

/// Bit of the mode word (word 2) meaning "forgotten": file modes use 16 bits.
const FORGOTTEN: u64 = 1 << 31;

impl AttrCell {
    pub(crate) fn new(a: Option<Attr>, ino: u64) -> AttrCell {
        let c = AttrCell {
            seq: AtomicU32::new(0),
            pins: AtomicU32::new(0),
            w: std::array::from_fn(|_| AtomicU64::new(0)),
        };
        c.w[0].store(ino, Ordering::Relaxed);
        if let Some(a) = a {
            c.store_words(&a);
        }
        c
    }

    fn store_words(&self, a: &Attr) {
        let w = [
            a.ino,
            a.dev,
            u64::from(a.mode) & !FORGOTTEN | (u64::from(a.nlink) << 32),
            u64::from(a.uid) | (u64::from(a.gid) << 32),
            a.rdev,
            a.size,
            a.blocks,
            u64::from(a.blksize) | (u64::from(a.atime.nsec) << 32),
            a.atime.sec as u64,
            a.mtime.sec as u64,
            u64::from(a.mtime.nsec) | (u64::from(a.ctime.nsec) << 32),
            a.ctime.sec as u64,
        ];
        for (slot, v) in self.w.iter().zip(w) {
            slot.store(v, Ordering::Relaxed);
        }
    }

    #[inline]
    pub(crate) fn load(&self) -> Option<Attr> {
        self.load_words(false)
    }

    /// The attributes, or the last ones stored if they were forgotten since.
    pub(crate) fn load_last(&self) -> Option<Attr> {
        self.load_words(true)
    }

    #[inline]
    fn load_words(&self, last: bool) -> Option<Attr> {
        loop {
            let s1 = self.seq.load(Ordering::Acquire);
            if s1 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let w: [u64; 12] = std::array::from_fn(|i| self.w[i].load(Ordering::Relaxed));
            std::sync::atomic::fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) != s1 {
                continue;
            }
            if w[2] as u32 == 0 || (w[2] & FORGOTTEN != 0 && !last) {
                return None;
            }
            let mode = (w[2] & !FORGOTTEN) as u32;
            use crate::Timespec;
            return Some(Attr {
                ino: w[0],
                dev: w[1],
                mode,
                nlink: (w[2] >> 32) as u32,
                uid: w[3] as u32,
                gid: (w[3] >> 32) as u32,
                rdev: w[4],
                size: w[5],
                blocks: w[6],
                blksize: w[7] as u32,
                atime: Timespec {
                    sec: w[8] as i64,
                    nsec: (w[7] >> 32) as u32,
                },
                mtime: Timespec {
                    sec: w[9] as i64,
                    nsec: w[10] as u32,
                },
                ctime: Timespec {
                    sec: w[11] as i64,
                    nsec: (w[10] >> 32) as u32,
                },
            });
        }
    }

    fn write(&self, f: impl FnOnce()) {
        loop {
            let s = self.seq.load(Ordering::Relaxed);
            if s & 1 == 0
                && self
                    .seq
                    .compare_exchange_weak(
                        s,
                        s.wrapping_add(1),
                        Ordering::Acquire,
                        Ordering::Relaxed,
                    )
                    .is_ok()
            {
                std::sync::atomic::fence(Ordering::Release);
                f();
                self.seq.store(s.wrapping_add(2), Ordering::Release);
                return;
            }
            std::hint::spin_loop();
        }
    }

    pub(crate) fn store(&self, a: Option<Attr>) {
        self.write(|| match a {
            Some(a) => self.store_words(&a),
            None => {
                let w2 = self.w[2].load(Ordering::Relaxed);
                if w2 as u32 != 0 {
                    self.w[2].store(w2 | FORGOTTEN, Ordering::Relaxed);
                }
            }
        });
    }

    /// The writers' sequence now: pass it to [`AttrCell::store_if_unchanged`] to store
    /// attributes fetched after this call only if nobody stored or forgot any meanwhile.
    pub(crate) fn stamp(&self) -> u64 {
        u64::from(self.seq.load(Ordering::Acquire))
    }

    /// Store `a` if no writer ran since [`AttrCell::stamp`] returned `s0` (so `a`, asked for
    /// after that, is not older than what a writer stored since). Returns whether it stored.
    pub(crate) fn store_if_unchanged(&self, s0: u64, a: &Attr) -> bool {
        let Ok(s0) = u32::try_from(s0) else {
            return false;
        };
        if s0 & 1 == 1
            || self
                .seq
                .compare_exchange(s0, s0.wrapping_add(1), Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            return false;
        }
        std::sync::atomic::fence(Ordering::Release);
        self.store_words(a);
        self.seq.store(s0.wrapping_add(2), Ordering::Release);
        true
    }

    pub(crate) fn set_ino(&self, ino: u64) {
        self.write(|| self.w[0].store(ino, Ordering::Relaxed));
    }

    pub(crate) fn ino(&self) -> u64 {
        self.w[0].load(Ordering::Relaxed)
    }

    /// The device number, if attributes were ever stored (0 otherwise).
    pub(crate) fn dev(&self) -> u64 {
        self.w[1].load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Timespec;

    fn attr(mode: u32) -> Attr {
        Attr {
            ino: 7,
            dev: 0x803,
            mode,
            nlink: 3,
            uid: 1000,
            gid: 100,
            rdev: 0,
            size: 4096,
            blocks: 8,
            blksize: 4096,
            atime: Timespec { sec: -5, nsec: 1 },
            mtime: Timespec {
                sec: 1_700_000_000,
                nsec: 999_999_999,
            },
            ctime: Timespec { sec: 3, nsec: 4 },
        }
    }

    #[test]
    fn forgotten_attributes_are_kept_for_load_last_only() {
        let a = attr(libc::S_IFDIR | 0o750);
        let c = AttrCell::new(Some(a), a.ino);
        assert_eq!(c.load(), Some(a));
        c.store(None);
        assert_eq!(c.load(), None);
        assert_eq!(c.load_last(), Some(a));
        assert_eq!(c.ino(), 7);
        // Forgetting twice keeps them; storing new ones replaces them.
        c.store(None);
        assert_eq!(c.load_last(), Some(a));
        let b = attr(libc::S_IFDIR | 0o700);
        c.store(Some(b));
        assert_eq!(c.load(), Some(b));
        // Never stored: nothing to give, even as the last.
        let e = AttrCell::new(None, 9);
        e.store(None);
        assert_eq!((e.load(), e.load_last(), e.ino()), (None, None, 9));
    }

    #[test]
    fn store_if_unchanged_refuses_after_a_write_also_across_wrap() {
        let a = attr(libc::S_IFREG | 0o644);
        let c = AttrCell::new(None, 0);
        c.seq.store(u32::MAX - 1, Ordering::Relaxed);
        let s0 = c.stamp();
        c.store(Some(attr(libc::S_IFREG | 0o600)));
        assert_eq!(c.seq.load(Ordering::Relaxed), 0, "the sequence wraps");
        assert!(
            !c.store_if_unchanged(s0, &a),
            "an older answer overwrote a newer one"
        );
        let s1 = c.stamp();
        assert!(c.store_if_unchanged(s1, &a));
        assert_eq!(c.load(), Some(a));
    }

    /// Where a dentry's bytes go (docs/benchmarks.md): the allocation is this plus the
    /// `Arc` header (16). Fails if a field grows it back.
    #[test]
    fn dentry_size() {
        // 104: the 4-byte sequence, the pins in its padding, 12 words.
        assert_eq!(std::mem::size_of::<AttrCell>(), 104);
        // 168 (was 176): `gen` moved into the children box (only directories whose children
        // changed need one), the pins into the attribute cell's padding. (`NodeKind` is 8
        // bytes, 4-aligned, because of `Error::Os(i32)`: with `flags` 12 bytes, so 4 are left
        // over.)
        assert!(
            std::mem::size_of::<Dentry>() <= 168,
            "Dentry is {} bytes",
            std::mem::size_of::<Dentry>()
        );
    }
}
