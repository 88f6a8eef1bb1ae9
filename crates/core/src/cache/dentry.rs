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

use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use arc_swap::ArcSwapOption;
use std::hash::BuildHasher;
use std::sync::LazyLock;

use hashbrown::{DefaultHashBuilder, HashTable};
use once_cell::race::OnceBox;
use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::{NodeKind, NodeRef, Super};
use crate::{Attr, Error, FileType};

pub(crate) const DEAD: u16 = 1;
/// Taken out of the tree to reclaim memory. Unlike `DEAD`, the name still refers to it (its
/// backend path is still right for whoever holds it), but it is no longer kept coherent, so no
/// fast-path entry may use it.
pub(crate) const EVICTED: u16 = 32;
pub(crate) const COMPLETE: u16 = 2;
pub(crate) const REFERENCED: u16 = 4;
pub(crate) const MOUNTED: u16 = 8;
pub(crate) const HAS_CHILDREN: u16 = 16;
/// A warm-restart snapshot's validated contents wait for this directory in `Cache::pending`
/// (persist.rs): installed at its first miss or plain listing.
pub(crate) const PENDING: u16 = 64;
/// Something was put on this dentry's interior list ([`ChildMap::interior`]) at some time: set
/// in the same critical section (under its `inner` write lock) and never cleared, so an
/// invalidation skips the lock and the children map of a dentry without it (a directory of
/// files only), as it skips one without `HAS_CHILDREN`.
pub(crate) const HAS_INTERIOR: u16 = 128;

pub(crate) struct Link {
    /// Weak, so the tree has no reference cycles; a dentry in the tree always has a live
    /// parent because eviction only removes leaves.
    pub(crate) parent: Option<Weak<Dentry>>,
    pub(crate) name: Name,
}

/// Names up to this many bytes are stored inline (no allocation of their own).
const INLINE_NAME: usize = 14;

/// A file name: inline when short (most names: 16 bytes in all, no allocation), else boxed.
#[derive(Clone)]
pub(crate) enum Name {
    Inline {
        len: u8,
        buf: [u8; INLINE_NAME],
    },
    /// Thin pointer (a box of the boxed slice) so that the enum stays 16 bytes.
    Heap(Box<Box<[u8]>>),
}

impl From<&[u8]> for Name {
    fn from(n: &[u8]) -> Name {
        match u8::try_from(n.len()) {
            Ok(len) if n.len() <= INLINE_NAME => {
                let mut buf = [0u8; INLINE_NAME];
                buf[..n.len()].copy_from_slice(n);
                Name::Inline { len, buf }
            }
            _ => Name::Heap(Box::new(n.into())),
        }
    }
}

impl std::ops::Deref for Name {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        match self {
            Name::Inline { len, buf } => &buf[..usize::from(*len)],
            Name::Heap(b) => b,
        }
    }
}

/// A loaded link: the dentry's first link, or the one a rename (or a revival elsewhere)
/// stored in its [`Slow`] box, which from then on is the link (it is never unset). Readers
/// load it lock-free (arc-swap) and fall back to the first link, so each reader sees one whole
/// link, the old or the new, as with one arc-swap of a boxed link, without an allocation per
/// dentry. (The first link's weak parent keeps a renamed dentry's first parent's allocation,
/// not the parent, until the dentry goes.)
pub(crate) struct LinkRef<'a> {
    first: &'a Link,
    moved: Option<arc_swap::Guard<Option<Arc<Link>>>>,
}

impl std::ops::Deref for LinkRef<'_> {
    type Target = Link;
    #[inline]
    fn deref(&self) -> &Link {
        self.moved
            .as_ref()
            .and_then(|m| m.as_deref())
            .unwrap_or(self.first)
    }
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
    /// only over-invalidates. Strong references (as the map's own), so that an invalidation
    /// reads the children under this map's read lock without touching their reference
    /// counts; the owner has [`HAS_INTERIOR`] once anything was listed here.
    pub(crate) interior: Vec<NodeRef>,
    /// Target of a symbolic link (symlinks have no children; they share this box).
    pub(crate) target: Option<Box<[u8]>>,
    /// See [`Inner::gen`]. Kept here rather than in every dentry: only directories whose
    /// children changed need it (the box, once made, is never dropped, so it never goes back).
    gen: u64,
}

impl ChildMap {
    pub(crate) fn get(&self, name: &[u8]) -> Option<&NodeRef> {
        self.t.find(name_hash(name), |n| *n.link().name == *name)
    }

    /// Insert `node` under its current name in the map of `owner` (whose `inner` is
    /// write-locked by the caller); returns the child it displaced.
    pub(crate) fn insert(&mut self, owner: &Dentry, node: NodeRef) -> Option<NodeRef> {
        if node.is_dir() || node.has(HAS_CHILDREN) {
            self.add_interior(owner, &node);
        }
        let name = node.link().name.clone();
        let h = name_hash(&name);
        match self.t.find_entry(h, |n| *n.link().name == *name) {
            Ok(mut e) => {
                let old = std::mem::replace(e.get_mut(), node);
                if !Arc::ptr_eq(&old, e.get()) {
                    self.unlist_interior(&old);
                }
                Some(old)
            }
            Err(_) => {
                self.t.insert_unique(h, node, |n| name_hash(&n.link().name));
                None
            }
        }
    }

    pub(crate) fn remove(&mut self, name: &[u8]) -> Option<NodeRef> {
        match self
            .t
            .find_entry(name_hash(name), |n| *n.link().name == *name)
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
            .position(|w| std::ptr::eq(Arc::as_ptr(w), node))
        {
            self.interior.swap_remove(i);
        }
    }

    /// List `node` as an interior child of `owner` (whose map this is, write-locked by the
    /// caller).
    pub(crate) fn add_interior(&mut self, owner: &Dentry, node: &NodeRef) {
        if self.interior.len() >= 16 && self.interior.len() > 2 * self.t.len() {
            self.interior.retain(|d| !d.has(DEAD | EVICTED));
        }
        owner.set(HAS_INTERIOR);
        self.interior.push(node.clone());
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

/// The parts of a dentry that most dentries never need, in one box: the children's lock
/// ([`Inner`]) and a link stored by a rename (see [`LinkRef`]).
#[derive(Default)]
pub(crate) struct Slow {
    lock: RwLock<Inner>,
    /// The link a rename or revival stored; from then on the dentry's link (never unset).
    moved: ArcSwapOption<Link>,
}

/// A dentry's [`Slow`] box (its [`Inner`] under its lock, and a moved link), made with a
/// directory and for other dentries at the first `read` or `write` or rename (8 bytes in the
/// dentry: a leaf nobody asked about children or a target, and never renamed, has none; it was
/// a 16-byte `RwLock<Inner>` and an 8-byte `ArcSwapOption<Link>` in every dentry). The box is
/// installed once by compare-and-swap (`once_cell`'s `OnceBox`) and never replaced or dropped
/// before the dentry, so every caller locks the same lock and sees the same moved link:
/// locking and link loads work exactly as with both inline. Only [`InnerCell::has_children`],
/// link loads and the teardown look without making it, and a cell without a box has never
/// held anything.
#[derive(Default)]
pub(crate) struct InnerCell(OnceBox<Slow>);

impl InnerCell {
    #[inline]
    fn slow(&self) -> &Slow {
        self.0.get_or_init(Box::default)
    }
    #[inline]
    fn lock(&self) -> &RwLock<Inner> {
        &self.slow().lock
    }
    #[inline]
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, Inner> {
        self.lock().read()
    }
    #[inline]
    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, Inner> {
        self.lock().write()
    }
    /// Whether any child is cached, without making the box (a momentary look, as
    /// `read()` then dropping the guard).
    pub(crate) fn has_children(&self) -> bool {
        self.0.get().is_some_and(|s| {
            s.lock
                .read()
                .children
                .as_ref()
                .is_some_and(|c| !c.is_empty())
        })
    }
    /// The children, taken out (teardown, kill), if the box was ever made: a leaf that never
    /// had one does not get one.
    pub(crate) fn take_children(&self) -> Vec<NodeRef> {
        self.0
            .get()
            .map_or_else(Vec::new, |s| s.lock.write().take_children())
    }
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
    kind: Kind,
    pub(crate) flags: AtomicU16,
    /// The front-end pins (e.g. inodes the kernel holds; pinned dentries are never evicted).
    pub(crate) pins: AtomicU32,
    /// The link (parent + name) the dentry was created with; a rename stores a new one in
    /// the `inner` box (read both through [`Dentry::link`]).
    first: Link,
    pub(crate) version: AtomicU64,
    /// Attributes (packed, under their own sequence lock).
    pub(crate) attr: AttrCell,
    /// Children, symlink target and a moved link (made when first needed).
    pub(crate) inner: InnerCell,
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
            kind: Kind::pack(kind),
            flags: AtomicU16::new(0),
            pins: AtomicU32::new(0),
            first: Link {
                parent: parent.as_ref().map(Arc::downgrade),
                name: name.into(),
            },
            version: AtomicU64::new(version),
            attr: AttrCell::new(attr, attr.map_or(0, |a| a.ino)),
            // A directory's lock is made with it (it will hold children; the box then lies
            // next to the dentry in memory, for invalidation walks); others' at first use.
            inner: if kind == NodeKind::Positive(FileType::Directory) {
                InnerCell(OnceBox::with_value(Box::default()))
            } else {
                InnerCell::default()
            },
        }
    }

    /// The current link (parent + name): the first one, or the last a rename stored; lock-free
    /// (see [`LinkRef`]).
    #[inline]
    pub(crate) fn link(&self) -> LinkRef<'_> {
        LinkRef {
            first: &self.first,
            moved: self.inner.0.get().map(|s| s.moved.load()),
        }
    }
    /// Replace the link (renames and revivals, under the locks the module's notes name).
    pub(crate) fn set_link(&self, link: Arc<Link>) {
        self.inner.slow().moved.store(Some(link));
    }

    #[inline]
    pub(crate) fn has(&self, flag: u16) -> bool {
        self.flags.load(Ordering::Acquire) & flag != 0
    }
    #[inline]
    pub(crate) fn set(&self, flag: u16) {
        self.flags.fetch_or(flag, Ordering::AcqRel);
    }
    #[inline]
    pub(crate) fn clear(&self, flag: u16) {
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
        self.kind.0 == Kind::DIR
    }
    /// What this dentry stands for (unpacked from 4 bytes, see [`Kind`]).
    #[inline(always)]
    pub fn kind(&self) -> NodeKind {
        self.kind.unpack()
    }
    #[inline]
    pub(crate) fn attr_copy(&self) -> Option<Attr> {
        self.attr.load()
    }
    pub(crate) fn set_attr(&self, a: Option<Attr>) {
        self.attr.store(a);
    }
    pub(crate) fn parent_ref(&self) -> Option<NodeRef> {
        self.link().parent.as_ref().and_then(Weak::upgrade)
    }
}

/// A [`NodeKind`] in 2 bytes (`NodeKind` takes 8: `Error::Os` carries an `i32`): a positive
/// entry is [`Kind::POSITIVE`] with the type's `S_IFMT` bits shifted down by 12; a negative one
/// holds its error as the errno of a named [`Error`] variant, or [`Kind::OS`] with the number of
/// an `Error::Os` (kept exactly, also for a number a named variant has). `Error::Os` numbers
/// outside `0..2^14` (Linux's errno values are below 4096) are kept as `Error::Os(EIO)`.
#[derive(Clone, Copy)]
struct Kind(u16);

impl Kind {
    const POSITIVE: u16 = 1 << 15;
    const OS: u16 = 1 << 14;
    const DIR: u16 = Kind::POSITIVE | (libc::S_IFDIR >> 12) as u16;

    fn pack(k: NodeKind) -> Kind {
        Kind(match k {
            NodeKind::Positive(t) => Kind::POSITIVE | (t.mode_bits() >> 12) as u16,
            NodeKind::Negative(Error::Os(e)) => match u16::try_from(e) {
                Ok(e) if e < Kind::OS => Kind::OS | e,
                _ => Kind::OS | libc::EIO as u16,
            },
            // Named variants: their errno (all below 128), which `Error::from_errno` maps
            // back to them.
            NodeKind::Negative(e) => e.errno() as u16,
        })
    }

    /// Inlined for positive entries (the fast path's common case); negatives decode out of
    /// line.
    #[inline(always)]
    fn unpack(self) -> NodeKind {
        if self.0 & Kind::POSITIVE != 0 {
            NodeKind::Positive(FileType::from_mode(u32::from(self.0 & 0xf) << 12))
        } else {
            self.unpack_negative()
        }
    }

    #[cold]
    #[inline(never)]
    fn unpack_negative(self) -> NodeKind {
        if self.0 & Kind::OS != 0 {
            NodeKind::Negative(Error::Os(i32::from(self.0 & !Kind::OS)))
        } else {
            NodeKind::Negative(Error::from_errno(i32::from(self.0)))
        }
    }
}

impl Drop for Dentry {
    fn drop(&mut self) {
        // Tear down long child chains iteratively so dropping a deep tree cannot overflow the
        // stack.
        let mut stack: Vec<NodeRef> = self.inner.take_children();
        while let Some(n) = stack.pop() {
            if let Ok(n) = Arc::try_unwrap(n) {
                stack.extend(n.inner.take_children());
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
/// writes of this one dentry during one read to be fooled.
///
/// **Packed** into 8 words with the sequence (64 bytes; it was 104, then 72): what real files
/// have fits exactly — the link count below 2^22 and the device number as its index in a
/// process-wide table of the device numbers seen ([`dev_index`], at most [`DEV_SLOTS`]) in one
/// 32-bit word beside the sequence, `st_blksize` as a power of two (or 0), `st_blocks` below
/// 2^40, times as 34-bit signed seconds (years 1698–2242) and 30-bit nanoseconds, `st_rdev` in
/// the size word of a device file (whose size is 0). Attributes that do not fit ([`pack`]
/// says `None`) are not cached: the cell then holds none (the inode number stays), so every
/// use asks the backend, as for any attribute miss. Nothing is ever rounded.
pub(crate) struct AttrCell {
    seq: AtomicU32,
    /// The link count (bits 0..22) and the device's index in [`DEVS`] (bits 22..32).
    nd: AtomicU32,
    w: [AtomicU64; WORDS],
}

/// Words besides the sequence and `nd`: 0 inode number, 1 size (or rdev), 2 meta, 3 uid and
/// gid, 4..7 atime, mtime, ctime.
const WORDS: usize = 7;

/// Word 2 ("meta"): mode in bits 0..16, [`FORGOTTEN`] bit 16, the block-size code in bits
/// 17..23 (0: 0, k: 2^(k-1)), [`BIRTH`] bit 23, blocks in bits 24..64.
const MODE_MASK: u64 = 0xffff;
/// Bit of the meta word meaning "forgotten".
const FORGOTTEN: u64 = 1 << 16;
const BLKSIZE_SHIFT: u32 = 17;
/// Bit of the meta word meaning "word 0 holds the inode number in its low 32 bits and
/// [`Attr::birth`] in its high 32" (an inode number below 2^32, as ext4's, with a known
/// birth time: no word more per dentry). Without it word 0 is the inode number alone and the
/// birth unknown.
const BIRTH: u64 = 1 << 23;
const BLOCKS_SHIFT: u32 = 24;
const TIME_SEC_BITS: u32 = 34;
/// Bits of the link count in `nd` (4,194,303 links at most: ext4 and btrfs stop at 65,535).
const NLINK_BITS: u32 = 22;
const NLINK_MASK: u32 = (1 << NLINK_BITS) - 1;

/// Slots of [`DEVS`]: a process holding files of more file systems than this caches the
/// attributes of the first ones only (the others' are asked for at every use).
pub(crate) const DEV_SLOTS: usize = 1 << (32 - NLINK_BITS);

/// Device numbers by index, append-only: a slot, once set, never changes; slot 0 is device 0.
struct DevTable {
    slots: [AtomicU64; DEV_SLOTS],
    /// Slots in use (at least 1).
    len: AtomicUsize,
    /// Serializes additions.
    add: parking_lot::Mutex<()>,
}

impl DevTable {
    const fn new() -> DevTable {
        DevTable {
            slots: [const { AtomicU64::new(0) }; DEV_SLOTS],
            len: AtomicUsize::new(1),
            add: parking_lot::const_mutex(()),
        }
    }

    /// The index of device number `dev`, added if new; `None` if the table is full.
    fn index(&self, dev: u64) -> Option<u32> {
        if dev == 0 {
            return Some(0);
        }
        let find = |n: usize| (1..n).find(|&i| self.slots[i].load(Ordering::Relaxed) == dev);
        // Acquire: the slots below the length were set before it was published.
        if let Some(i) = find(self.len.load(Ordering::Acquire)) {
            return u32::try_from(i).ok();
        }
        let _g = self.add.lock();
        let n = self.len.load(Ordering::Acquire);
        if let Some(i) = find(n) {
            return u32::try_from(i).ok();
        }
        if n == DEV_SLOTS {
            return None;
        }
        self.slots[n].store(dev, Ordering::Relaxed);
        self.len.store(n + 1, Ordering::Release);
        u32::try_from(n).ok()
    }
}

/// The device numbers attributes were stored with (process-wide: 8 KiB of static memory, no
/// heap).
static DEVS: DevTable = DevTable::new();

/// The index of device number `dev` in [`DEVS`], added if new; `None` if the table is full.
#[inline]
fn dev_index(dev: u64) -> Option<u32> {
    DEVS.index(dev)
}

/// The device number at `nd`'s index. The slot was set before the index was stored (its
/// writer found it through the table's length, an acquire of the release that published it,
/// then stored the index under the sequence lock whose release the reader acquired), and it
/// never changes.
#[inline(always)]
fn dev_of(nd: u32) -> u64 {
    DEVS.slots[(nd >> NLINK_BITS) as usize].load(Ordering::Relaxed)
}

/// One timestamp in a word: seconds (34 bits, signed) above nanoseconds (30 bits).
fn pack_time(t: crate::Timespec) -> Option<u64> {
    let lim = 1i64 << (TIME_SEC_BITS - 1);
    if t.sec < -lim || t.sec >= lim || t.nsec >= 1 << 30 {
        return None;
    }
    Some(((t.sec as u64) << 30) | u64::from(t.nsec))
}

#[inline(always)]
fn unpack_time(w: u64) -> crate::Timespec {
    crate::Timespec {
        // Arithmetic shift: the sign of the 34-bit seconds comes back.
        sec: (w as i64) >> 30,
        nsec: (w & ((1 << 30) - 1)) as u32,
    }
}

fn is_device(mode: u32) -> bool {
    matches!(mode & libc::S_IFMT, libc::S_IFCHR | libc::S_IFBLK)
}

/// The packed `nd` word and words of `a`, or `None` if some field does not fit exactly.
fn pack(a: &Attr) -> Option<(u32, [u64; WORDS])> {
    if a.mode == 0
        || u64::from(a.mode) > MODE_MASK
        || a.blocks >= 1 << (64 - BLOCKS_SHIFT)
        || a.nlink > NLINK_MASK
    {
        return None;
    }
    let bs = match a.blksize {
        0 => 0,
        b if b.is_power_of_two() => u64::from(b.trailing_zeros()) + 1,
        _ => return None,
    };
    // A device file's size word holds its rdev (its size is 0); others have no rdev.
    let size = if is_device(a.mode) {
        if a.size != 0 {
            return None;
        }
        a.rdev
    } else {
        if a.rdev != 0 {
            return None;
        }
        a.size
    };
    let (w0, birth) = if a.birth != 0 && a.ino < 1 << 32 {
        (a.ino | (u64::from(a.birth) << 32), BIRTH)
    } else {
        (a.ino, 0)
    };
    let words = [
        w0,
        size,
        u64::from(a.mode) | (bs << BLKSIZE_SHIFT) | birth | (a.blocks << BLOCKS_SHIFT),
        u64::from(a.uid) | (u64::from(a.gid) << 32),
        pack_time(a.atime)?,
        pack_time(a.mtime)?,
        pack_time(a.ctime)?,
    ];
    // Last: a misfit takes no slot of the table here.
    let nd = a.nlink | (dev_index(a.dev)? << NLINK_BITS);
    Some((nd, words))
}

/// The inode number and [`Attr::birth`] held in words 0 and 2 ([`BIRTH`]).
fn split_ino(w0: u64, w2: u64) -> (u64, u32) {
    if w2 & BIRTH != 0 {
        (w0 & 0xffff_ffff, (w0 >> 32) as u32)
    } else {
        (w0, 0)
    }
}

impl AttrCell {
    pub(crate) fn new(a: Option<Attr>, ino: u64) -> AttrCell {
        let c = AttrCell {
            seq: AtomicU32::new(0),
            nd: AtomicU32::new(0),
            w: std::array::from_fn(|_| AtomicU64::new(0)),
        };
        c.w[0].store(ino, Ordering::Relaxed);
        if let Some(a) = a {
            c.store_words(&a);
        }
        c
    }

    /// Store `a` (or, if it does not pack, no attributes: its inode number, and its device
    /// if the table has room).
    fn store_words(&self, a: &Attr) {
        match pack(a) {
            Some((nd, w)) => {
                self.nd.store(nd, Ordering::Relaxed);
                for (slot, v) in self.w.iter().zip(w) {
                    slot.store(v, Ordering::Relaxed);
                }
            }
            None => {
                self.w[0].store(a.ino, Ordering::Relaxed);
                self.w[2].store(0, Ordering::Relaxed);
                let nd = dev_index(a.dev).map_or(0, |i| i << NLINK_BITS);
                self.nd.store(nd, Ordering::Relaxed);
            }
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

    // Always inlined (as is `Cache::stat`'s closure that calls it): built out of line, the
    // returned `Attr` was read back in 8-byte words over the 4-byte stores that wrote it (a
    // `Timespec`'s nanoseconds and padding), a store-forwarding stall, 13 % of `Cache::stat`
    // in `perf`; a warm 8-component `stat` went from 63.6 to 56 ns (`fastloop`) with both,
    // neither alone.
    #[inline(always)]
    fn load_words(&self, last: bool) -> Option<Attr> {
        loop {
            let s1 = self.seq.load(Ordering::Acquire);
            if s1 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let nd = self.nd.load(Ordering::Relaxed);
            let w: [u64; WORDS] = std::array::from_fn(|i| self.w[i].load(Ordering::Relaxed));
            std::sync::atomic::fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) != s1 {
                continue;
            }
            let mode = (w[2] & MODE_MASK) as u32;
            if mode == 0 || (w[2] & FORGOTTEN != 0 && !last) {
                return None;
            }
            let bs = (w[2] >> BLKSIZE_SHIFT) & 0x3f;
            let dev = is_device(mode);
            let (ino, birth) = split_ino(w[0], w[2]);
            return Some(Attr {
                ino,
                dev: dev_of(nd),
                mode,
                nlink: nd & NLINK_MASK,
                uid: w[3] as u32,
                gid: (w[3] >> 32) as u32,
                rdev: if dev { w[1] } else { 0 },
                size: if dev { 0 } else { w[1] },
                blocks: w[2] >> BLOCKS_SHIFT,
                blksize: if bs == 0 { 0 } else { 1 << (bs - 1) },
                atime: unpack_time(w[4]),
                mtime: unpack_time(w[5]),
                ctime: unpack_time(w[6]),
                birth,
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
                if w2 & MODE_MASK != 0 {
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
        self.write(|| {
            self.w[0].store(ino, Ordering::Relaxed);
            let w2 = self.w[2].load(Ordering::Relaxed);
            if w2 & BIRTH != 0 {
                self.w[2].store(w2 & !BIRTH, Ordering::Relaxed);
            }
        });
    }

    pub(crate) fn ino(&self) -> u64 {
        loop {
            let s1 = self.seq.load(Ordering::Acquire);
            if s1 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let (w0, w2) = (
                self.w[0].load(Ordering::Relaxed),
                self.w[2].load(Ordering::Relaxed),
            );
            std::sync::atomic::fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) == s1 {
                return split_ino(w0, w2).0;
            }
        }
    }

    /// The device number, if attributes were ever stored (0 otherwise, also when the table
    /// of device numbers was full: callers treat 0 as "unknown").
    pub(crate) fn dev(&self) -> u64 {
        dev_of(self.nd.load(Ordering::Relaxed))
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
            birth: 0,
        }
    }

    #[test]
    fn kinds_and_names_round_trip() {
        let mut kinds = vec![
            NodeKind::Negative(Error::Os(0)),
            NodeKind::Negative(Error::Os(libc::ENOENT)),
            NodeKind::Negative(Error::Os(4095)),
        ];
        for t in [
            FileType::Regular,
            FileType::Directory,
            FileType::Symlink,
            FileType::CharDevice,
            FileType::BlockDevice,
            FileType::Fifo,
            FileType::Socket,
        ] {
            kinds.push(NodeKind::Positive(t));
        }
        for e in 1..140 {
            kinds.push(NodeKind::Negative(Error::from_errno(e)));
        }
        kinds.push(NodeKind::Negative(Error::Os((1 << 14) - 1)));
        for k in &kinds {
            assert_eq!(Kind::pack(*k).unpack(), *k);
        }
        for e in [-1, 1 << 14, i32::MAX] {
            assert_eq!(
                Kind::pack(NodeKind::Negative(Error::Os(e))).unpack(),
                NodeKind::Negative(Error::Os(libc::EIO))
            );
        }
        assert!(Dentry::new(
            2,
            Arc::new(Super {
                backend: Arc::new(crate::memory::MemoryBackend::new())
            }),
            NodeKind::Positive(FileType::Directory),
            None,
            b"d",
            1,
            None
        )
        .is_dir());
        for len in [0, 1, 13, 14, 15, 255] {
            let n: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
            let name = Name::from(&n[..]);
            assert_eq!(&*name, &n[..]);
            assert_eq!(&*name.clone(), &n[..]);
            assert_eq!(matches!(name, Name::Inline { .. }), len <= INLINE_NAME);
        }
    }

    /// The birth time digest rides in word 0 beside an inode number below 2^32 and comes
    /// back as stored; with a larger number it is unknown (0), never a wrong inode number.
    #[test]
    fn birth_is_kept_beside_a_32_bit_inode_number() {
        let a = Attr {
            birth: 0xdead_beef,
            ..attr(libc::S_IFREG | 0o644)
        };
        let c = AttrCell::new(Some(a), a.ino);
        assert_eq!((c.load(), c.ino()), (Some(a), a.ino));
        c.store(None);
        assert_eq!(c.load_last(), Some(a));
        c.set_ino(8);
        assert_eq!(
            (c.ino(), c.load_last().map(|l| (l.ino, l.birth))),
            (8, Some((8, 0)))
        );
        let big = Attr {
            ino: 1 << 40 | 5,
            ..a
        };
        c.store(Some(big));
        assert_eq!(c.load(), Some(Attr { birth: 0, ..big }));
        assert_eq!(c.ino(), big.ino);
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

    #[test]
    fn packed_attributes_round_trip_exactly_or_are_not_cached() {
        let a = attr(libc::S_IFREG | 0o644);
        let lim = 1i64 << 33;
        let fits = [
            a,
            Attr {
                dev: u64::from(u32::MAX),
                blocks: (1 << 40) - 1,
                blksize: 1 << 31,
                ..a
            },
            Attr {
                dev: 1 << 32 | 7,
                ..a
            },
            Attr {
                dev: u64::MAX,
                nlink: 0,
                ..a
            },
            Attr {
                blksize: 0,
                nlink: NLINK_MASK,
                uid: u32::MAX,
                gid: u32::MAX,
                size: u64::MAX,
                ..a
            },
            Attr {
                atime: Timespec { sec: -lim, nsec: 0 },
                mtime: Timespec {
                    sec: lim - 1,
                    nsec: (1 << 30) - 1,
                },
                ctime: Timespec {
                    sec: -1,
                    nsec: 999_999_999,
                },
                ..a
            },
            Attr {
                mode: libc::S_IFCHR | 0o620,
                rdev: u64::MAX,
                size: 0,
                ..a
            },
            Attr {
                mode: libc::S_IFBLK | 0o660,
                rdev: 0x803,
                size: 0,
                ..a
            },
            Attr {
                mode: libc::S_IFLNK | 0o777,
                ino: u64::MAX,
                ..a
            },
        ];
        for (i, f) in fits.iter().enumerate() {
            let c = AttrCell::new(Some(*f), f.ino);
            assert_eq!(c.load(), Some(*f), "case {i}");
            assert_eq!((c.ino(), c.dev()), (f.ino, f.dev), "case {i}");
        }
        let misfits = [
            Attr {
                nlink: NLINK_MASK + 1,
                ..a
            },
            Attr {
                blocks: 1 << 40,
                ..a
            },
            Attr { blksize: 4095, ..a },
            Attr { rdev: 1, ..a },
            Attr {
                mode: libc::S_IFCHR | 0o600,
                rdev: 5,
                size: 1,
                ..a
            },
            Attr {
                mode: 1 << 16 | libc::S_IFREG,
                ..a
            },
            Attr {
                atime: Timespec { sec: lim, nsec: 0 },
                ..a
            },
            Attr {
                mtime: Timespec {
                    sec: -lim - 1,
                    nsec: 0,
                },
                ..a
            },
            Attr {
                ctime: Timespec {
                    sec: 0,
                    nsec: 1 << 30,
                },
                ..a
            },
        ];
        for (i, m) in misfits.iter().enumerate() {
            let m = Attr { ino: 99, ..*m };
            // Cached before: a misfit replaces them with none (never a rounded copy).
            let c = AttrCell::new(Some(a), a.ino);
            c.store(Some(m));
            assert_eq!(
                (c.load(), c.load_last(), c.ino()),
                (None, None, 99),
                "misfit {i}"
            );
            let fresh = AttrCell::new(Some(m), m.ino);
            assert_eq!(
                (fresh.load(), fresh.ino(), fresh.dev()),
                (None, 99, m.dev),
                "misfit {i}"
            );
        }
    }

    /// The device table gives each device one index for good, and refuses a new device once
    /// full (its attributes are then not cached) while still finding the ones it holds.
    #[test]
    fn device_table_is_stable_and_bounded() {
        let t = DevTable::new();
        assert_eq!(t.index(0), Some(0));
        let idx: Vec<_> = (1..DEV_SLOTS as u64)
            .map(|d| t.index(d << 40 | d))
            .collect();
        for (i, x) in idx.iter().enumerate() {
            assert_eq!(*x, u32::try_from(i + 1).ok());
        }
        assert_eq!(t.index(u64::MAX), None, "a full table took one more");
        assert_eq!(t.index(5 << 40 | 5), Some(5));
        // Racing adders of the same new devices agree on their indexes.
        let t = DevTable::new();
        let seen: Vec<Vec<Option<u32>>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| s.spawn(|| (1..200u64).map(|d| t.index(d * 3)).collect()))
                .collect();
            hs.into_iter().map(|h| h.join().expect("thread")).collect()
        });
        assert!(seen.iter().all(|v| *v == seen[0]));
        assert_eq!(t.len.load(Ordering::Relaxed), 200);
    }

    /// Where a dentry's bytes go (docs/benchmarks.md): the allocation is this plus the
    /// `Arc` header (16). Fails if a field grows it back.
    #[test]
    fn dentry_size() {
        // 64 (was 104, then 72 with the sequence and the pins): 7 packed words, the sequence
        // and the link count with the device's index in one word.
        assert_eq!(std::mem::size_of::<AttrCell>(), 64);
        // The first link inline: a name of up to 14 bytes in it, and the weak parent.
        assert_eq!(std::mem::size_of::<Name>(), 16);
        assert_eq!(std::mem::size_of::<Link>(), 24);
        // The children's lock and a moved link in one box made at first use (8 bytes where an
        // `RwLock<Inner>` took 16 and an `ArcSwapOption<Link>` 8).
        assert_eq!(std::mem::size_of::<InnerCell>(), 8);
        // `NodeKind` in 2 bytes, the flags in 2, the pins in 4: one word.
        assert_eq!(std::mem::size_of::<Kind>(), 2);
        // 128 (was 144): id 8, sb 8, kind + flags + pins 8, link 24, version 8, attributes
        // 64, inner 8.
        assert!(
            std::mem::size_of::<Dentry>() <= 128,
            "Dentry is {} bytes",
            std::mem::size_of::<Dentry>()
        );
    }

    /// `InnerCell` makes its lock at first use, once: threads racing to use a fresh cell all
    /// lock the same lock (no write lost to a box made twice), and a cell only looked at
    /// (`has_children`, teardown) makes none.
    #[test]
    fn inner_cell_is_made_once_under_racing_first_use() {
        for round in 0..200 {
            let cell = InnerCell::default();
            assert!(!cell.has_children());
            assert!(cell.0.get().is_none(), "looking made the box");
            let threads = 4;
            let per = 50;
            let go = std::sync::Barrier::new(threads);
            std::thread::scope(|s| {
                for t in 0..threads {
                    let (cell, go) = (&cell, &go);
                    s.spawn(move || {
                        go.wait();
                        for i in 0..per {
                            if (t + i) % 3 == 0 {
                                let _ = cell.read().gen();
                            }
                            cell.write().bump_gen();
                        }
                    });
                }
            });
            assert_eq!(
                cell.read().gen(),
                (threads * per) as u64,
                "round {round}: a bump was lost"
            );
        }
    }
}
