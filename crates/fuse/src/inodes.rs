//! The kernel's nodeids and the core cache's dentries.
//!
//! Invariants:
//! - SRC's root is never forgotten. Its nodeid is 1 (FUSE_ROOT_ID), or [`SERVED_ROOT`] when
//!   SRC is served one directory below a synthetic FUSE root (`rootmount.rs`; nodeid 1 is
//!   then that synthetic directory, answered by `fs/served_root.rs`, not in this table).
//! - One nodeid per live inode, keyed by `(dev, ino)`, so that all hard links of a file share
//!   one kernel inode (the kernel's nlink/ctime stay consistent across names).
//! - The nodeid is the inode number `stat` shows (fuser sends one number as both the entry's
//!   nodeid and `attr.ino`), so it is derived from the backend's inode, not counted: on SRC's
//!   own device it is the backend's `st_ino` itself; on other devices (mounts inside SRC, whose
//!   inode numbers may repeat SRC's) it is a fixed hash of `(dev, ino)` with bit 63 set. Both
//!   are the same after the kernel forgot the inode and after a remount, so `find -inum`, `du`,
//!   `tar`, `rsync` and git's index keep working. Only when that number is taken by another
//!   live inode (a hash collision, an inode number >= 2^62, or the number 1 which is the
//!   root's) does a key get a counted number from [2^62, 2^63), unique but not stable.
//! - A nodeid is never given to a different file while the kernel holds it (the generation
//!   is always 0). When every dentry of a key is dead (unlinked, replaced), or the key shows
//!   up with another file type, and the same `(dev, ino)` shows up again while the kernel
//!   still holds the old inode, it is a new file that reused the inode number (ext4 does so
//!   at once, often with another type): it gets a nodeid of its own (a counted one) while
//!   `stat` keeps showing the backend's number (`st_ino`, sent apart from the nodeid). The
//!   kernel's old inode stays what it was, a removed file or directory (ENOENT, as
//!   natively), and every invalidation sent for a nodeid reaches the file it was given to.
//!   (Reusing the nodeid with the next generation, as before, made the kernel mark the old
//!   inode bad: EIO for a program listing the removed directory, ENOTDIR for
//!   `inval_entry`s meant for it, `fuse_iget`/`fuse_stale_inode`; the same nodeid and
//!   generation with another type did the same.) A dentry the core has not marked dead may
//!   still stand for a removed name (the change feed reports removals after the fact): a new
//!   name of a known key counts the old names as live only if the backend still shows them
//!   with that key ([`Inodes::register`] asks `Cache::names_inode`), so a reused number is
//!   never taken for a hard link of a gone file. A directory has one name: a directory found
//!   with the key of one the kernel holds under another path is another directory even when
//!   the backend shows the key at that path now (`node`'s attributes are then older than the
//!   replacement that gave the number there: a listing made just before the tree was
//!   replaced, answered later, e.g. by lookahead); given the old nodeid, the kernel fails the
//!   lookup with ELOOP when the holder is an ancestor (`d_splice_alias`), or moves the old
//!   dentry to the new place. A directory is also that inode only in the directory the kernel
//!   has it in (its parent's nodeid, `Inode::is_dir_at`): found under another one (its
//!   parent replaced in SRC, the core still showing the old children under the new parent
//!   until the feed reports the removal), the kernel would move its one dentry there and
//!   fail with ESTALE when it cannot take the locks at once (`d_splice_alias`). A file
//!   replaced by one of the same type that gets the same number (under the same name, or
//!   named by attributes listed before the replacement) is told apart by its birth time
//!   ([`Attr::birth`], statx's btime, on file systems that give one): another birth is
//!   another file, a nodeid of its own. Not detected: both born within one tick of the
//!   file system's coarse clock (4 ms here), or on a file system without birth times; the
//!   kernel then keeps its inode, refreshed when the feed reports the change.
//!   Several files of one key may be held at once (`by_key` has the newest, `older` the
//!   others): a name found to be an older one (its birth) joins that one's nodeid, as
//!   its hard link.
//! - `lookups` counts the kernel's references (each LOOKUP-like reply adds one, FORGET
//!   subtracts); the entry is dropped when it reaches zero.
//! - Each nodeid holds its inode in the core ([`Cache::hold`]): the core pins its names, keeps
//!   them up to date, finds them again after outside moves, and decides when attributes must
//!   be asked afresh (the held-node contract, `dircache_core` `held.rs`). This table keeps only
//!   what is FUSE's: nodeids, generations, lookup counts and passthrough backing ids.
//!
//! Locks: no global lock on a hit. The maps are lock-free (papaya); each entry has its own
//! mutex (lookup count, backing id). `structure` is taken only to add or remove an entry or
//! to change which names or generation an entry has (a LOOKUP of a name the kernel did not
//! know by this dentry, a FORGET of the last reference); lock order: `structure`, then an
//! entry's mutex, then the core's held-inode lock.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use dircache_core::{Attr, Cache, Held, NodeRef};
use fuser::BackingId;
use parking_lot::Mutex;

/// The FUSE root's nodeid (FUSE_ROOT_ID): SRC's root unless it is served below it.
pub const ROOT: u64 = 1;

/// SRC's root's nodeid when it is served below a synthetic FUSE root: the first counted
/// nodeid (counting then starts after it), so no derived nodeid is ever it.
pub const SERVED_ROOT: u64 = COUNTED;

struct Inode {
    /// The inode as the core holds it for the kernel (names, staleness, open counts).
    held: Held,
    /// What `stat` shows: the nodeid, or for a file that reused the number of one the kernel
    /// still holds, that number (see above).
    st_ino: u64,
    /// The file type (`st_mode & S_IFMT`) it was given out with.
    fmt: u32,
    /// Its [`Attr::birth`] when given out (0: unknown): with the key and the type, which
    /// file this is (see the module invariants).
    birth: u32,
    /// The nodeid of the directory the kernel last had it in (a directory's one place: see
    /// [`Inode::is_dir_at`]).
    parent: AtomicU64,
    /// A regular file's size and times as last sent to the kernel, and whether its mode had
    /// set-id bits ([`told_hash`]; 0: not known, or invalidated since): the kernel sizes
    /// page-cache reads by them.
    told: AtomicU64,
    /// Open handles whose writes may change the file's size or times without the kernel's
    /// inode seeing them: a writable page-cache handle, or a passthrough one that can be
    /// mapped (opened for reading too). Not a write-only passthrough handle: the kernel
    /// marks its own size and times stale after each write through it.
    unseen_writers: AtomicU32,
    m: Mutex<InodeMut>,
}

/// A nonzero digest of what the kernel's page cache depends on: size, mtime and ctime.
fn told_hash(a: &Attr) -> u64 {
    let mut h = mix(a.size, a.mtime.sec as u64 ^ (u64::from(a.mtime.nsec) << 32));
    h = mix(h, a.ctime.sec as u64 ^ (u64::from(a.ctime.nsec) << 32));
    let setid = if a.mode & (libc::S_ISUID | libc::S_ISGID) != 0 {
        TOLD_SETID
    } else {
        0
    };
    (h & !TOLD_SETID) | setid | 1
}

/// The bit of a `told` hash that says the attributes told had set-id bits.
const TOLD_SETID: u64 = 2;

/// The file type bits of `a`.
fn fmt(a: &Attr) -> u32 {
    a.mode & libc::S_IFMT
}

impl Inode {
    /// Whether attributes `a` (of inode `key`) can be this entry's file: same key, type and
    /// birth time (when both are known).
    fn is_file(&self, key: Key, a: &Attr) -> bool {
        self.held.key() == key && self.fmt == fmt(a) && Attr::same_birth(self.birth, a.birth)
    }

    /// Whether the kernel would find this entry at `parent` without moving it: anything but
    /// a directory, or a directory the kernel has in `parent`. A directory has one dentry
    /// in the kernel; handed its nodeid under another directory, the kernel moves that
    /// dentry (`d_splice_alias`), failing the lookup with ESTALE when it cannot take the
    /// locks at once, or with ELOOP when the old place is below the new one. A directory of
    /// the kernel's found in another directory is one whose parent was replaced in SRC (the
    /// core still shows the old children under the new directory until the change feed
    /// reports it): another directory for the kernel. (Moved in SRC, it is another dentry
    /// of the core's, which [`Inodes::register`] also takes for another directory.)
    fn is_dir_at(&self, parent: u64) -> bool {
        self.fmt != libc::S_IFDIR || self.parent.load(Ordering::Relaxed) == parent
    }

    /// The kernel has it in directory `parent` now (read first: the line is shared).
    fn seen_in(&self, parent: u64) {
        if self.parent.load(Ordering::Relaxed) != parent {
            self.parent.store(parent, Ordering::Relaxed);
        }
    }
}

struct InodeMut {
    lookups: u64,
    /// Taken out of the table (by the FORGET of its last reference): a LOOKUP that found it
    /// just before must register anew.
    removed: bool,
    /// Passthrough backing file shared by every open handle of the inode, with its users.
    backing: Option<(Arc<BackingId>, u32)>,
}

/// Counted nodeids start here; derived ones for SRC's device are below it.
const COUNTED: u64 = 1 << 62;
/// Bit set in the derived nodeids of other devices.
const OTHER_DEV: u64 = 1 << 63;

/// A fixed (not per-instance: it must survive a remount) mix of `(dev, ino)`.
fn mix(dev: u64, ino: u64) -> u64 {
    let mut z = dev
        .rotate_left(32)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(ino);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A real inode's identity: (dev, ino).
pub type Key = (u64, u64);

/// The tables' hasher: foldhash, randomly seeded (SipHash, the default, was a tenth of a cold
/// walk's request-thread time: every entry of a READDIRPLUS is registered here).
type Hasher = foldhash::quality::RandomState;

/// The nodeid table. See the module invariants and locks.
pub struct Inodes {
    inodes: papaya::HashMap<u64, Arc<Inode>, Hasher>,
    by_key: papaya::HashMap<Key, u64, Hasher>,
    /// The nodeids of older files of a key `by_key` gives to a newer one (the number reused
    /// while the kernel still holds the old file: see the module invariants), so that a
    /// name of an older one is still found to be it. Almost always empty; changed under
    /// `structure`.
    older: Mutex<std::collections::HashMap<Key, Vec<u64>>>,
    by_dentry: papaya::HashMap<u64, u64, Hasher>,
    /// Taken to change the structure (see the module doc); holds the next counted nodeid.
    structure: Mutex<u64>,
    /// SRC's root: its device (whose inode numbers are used as they are) and its key.
    root_key: Key,
    /// SRC's root's nodeid: [`ROOT`] or [`SERVED_ROOT`] (set before any request).
    root: AtomicU64,
}

impl Inodes {
    pub fn new(cache: &Cache) -> Inodes {
        let held = cache.hold_root();
        let key = held.key();
        let root = held.node();
        let t = Inodes {
            inodes: papaya::HashMap::with_hasher(Hasher::default()),
            by_key: papaya::HashMap::with_hasher(Hasher::default()),
            older: Mutex::new(std::collections::HashMap::new()),
            by_dentry: papaya::HashMap::with_hasher(Hasher::default()),
            structure: Mutex::new(COUNTED),
            root_key: key,
            root: AtomicU64::new(ROOT),
        };
        t.inodes.pin().insert(
            ROOT,
            Arc::new(Inode {
                held,
                st_ino: ROOT,
                fmt: libc::S_IFDIR,
                birth: 0,
                parent: AtomicU64::new(0),
                told: AtomicU64::new(0),
                unseen_writers: AtomicU32::new(0),
                m: Mutex::new(InodeMut {
                    lookups: 1,
                    removed: false,
                    backing: None,
                }),
            }),
        );
        t.by_dentry.pin().insert(root.id(), ROOT);
        t.by_key.pin().insert(key, ROOT);
        t
    }

    /// SRC's root's nodeid.
    pub fn root(&self) -> u64 {
        self.root.load(Ordering::Relaxed)
    }

    /// Give SRC's root the nodeid [`SERVED_ROOT`]: it is served below a synthetic FUSE root
    /// (`rootmount.rs`). Called before the kernel sends any request.
    pub fn serve_root_below(&self) {
        let mut next = self.structure.lock();
        let inodes = self.inodes.pin();
        let Some(i) = inodes.get(&ROOT).cloned() else {
            return;
        };
        inodes.remove(&ROOT);
        inodes.insert(SERVED_ROOT, i.clone());
        self.by_dentry.pin().insert(i.held.node().id(), SERVED_ROOT);
        self.by_key.pin().insert(self.root_key, SERVED_ROOT);
        *next = (*next).max(SERVED_ROOT + 1);
        self.root.store(SERVED_ROOT, Ordering::Relaxed);
    }

    fn entry(&self, nodeid: u64) -> Option<Arc<Inode>> {
        self.inodes.pin().get(&nodeid).cloned()
    }

    /// Run `f` on the entry of `nodeid` without taking a reference to it (no write to a
    /// shared cache line on the hit path).
    fn with_entry<R>(&self, nodeid: u64, f: impl FnOnce(&Inode) -> R) -> Option<R> {
        let m = self.inodes.pin();
        m.get(&nodeid).map(|i| f(i))
    }

    /// Run `f` on the held inode of `nodeid` (without cloning it).
    pub fn with_held<R>(&self, nodeid: u64, f: impl FnOnce(&Held) -> R) -> Option<R> {
        self.with_entry(nodeid, |i| f(&i.held))
    }

    /// Whether a writer has `nodeid` open (see [`Held::has_writers`]).
    pub fn has_writers(&self, nodeid: u64) -> bool {
        self.with_held(nodeid, Held::has_writers).unwrap_or(false)
    }

    /// The number `key` gets when it is free: see the module invariants.
    fn derived(&self, key: Key) -> u64 {
        if key == self.root_key {
            self.root()
        } else if key.0 == self.root_key.0 && key.1 > ROOT && key.1 < COUNTED {
            key.1
        } else {
            mix(key.0, key.1) | OTHER_DEV
        }
    }

    /// What `stat` shows for the root: SRC's root inode number as another inode of its
    /// device would show it (the raw number on most file systems).
    fn derived_root(&self) -> u64 {
        let k = self.root_key;
        if k.0 == u64::MAX {
            ROOT
        } else if k.1 != 0 && k.1 < COUNTED {
            k.1
        } else {
            mix(k.0, k.1) | OTHER_DEV
        }
    }

    /// The held inode of `nodeid`.
    pub fn held(&self, nodeid: u64) -> Option<Held> {
        self.with_held(nodeid, Held::clone)
    }

    /// The dentry for `nodeid` (a live name when there is one; the core revives dead ones:
    /// [`Cache::held_node`]).
    pub fn get(&self, nodeid: u64) -> Option<NodeRef> {
        self.with_held(nodeid, Held::node)
    }

    /// The (dev, ino) `nodeid` stands for.
    pub fn key(&self, nodeid: u64) -> Option<Key> {
        self.with_held(nodeid, Held::key)
    }

    /// The held inode a dentry is known to the kernel by.
    pub fn held_of(&self, node: &NodeRef) -> Option<Held> {
        let id = self.nodeid_of(node)?;
        self.held(id)
    }

    /// Record one more kernel reference to `node` (with attributes `attr`), seen in directory
    /// `parent`; returns its nodeid.
    ///
    /// When `node` is a new name for a key the kernel knows, the core is asked whether the
    /// other names still name that inode in the backend ([`Cache::names_inode`]): the core
    /// learns of removals in SRC from the change feed, after the fact, so a dentry that is
    /// not dead yet may stand for a name that is gone, whose inode number the backend already
    /// gave to `node`'s new file. Taken for a hard link, the new file would get the old
    /// inode's nodeid and generation (the kernel would reuse its old inode and page cache)
    /// and opens would go to the gone name (ENOENT for an existing file).
    pub fn register(&self, cache: &Cache, node: &NodeRef, attr: &Attr, parent: u64) -> u64 {
        let key = (attr.dev, attr.ino);
        // The hit: the kernel looks up a name it knows by this dentry (no global lock).
        let known = self.by_dentry.pin().get(&node.id()).copied();
        if let Some(id) = known {
            let hit = self.with_entry(id, |i| {
                let root = id == self.root();
                if !(root || (i.is_file(key, attr) && i.is_dir_at(parent))) {
                    return false;
                }
                let mut m = i.m.lock();
                if m.removed {
                    return false;
                }
                m.lookups += 1;
                drop(m);
                if !root {
                    let name = node.name();
                    let moved = self
                        .with_held(parent, |p| i.held.set_location(Some(p), &name))
                        .is_none();
                    if moved {
                        i.held.set_location(None, &name);
                    }
                    i.seen_in(parent);
                }
                true
            });
            if hit == Some(true) {
                return id;
            }
        }
        self.register_slow(cache, node, attr, parent)
    }

    fn register_slow(&self, cache: &Cache, node: &NodeRef, attr: &Attr, parent: u64) -> u64 {
        let key = (attr.dev, attr.ino);
        let name = node.name();
        let parent_held = self.held(parent);
        let mut next = self.structure.lock();
        let inodes = self.inodes.pin();
        let by_dentry = self.by_dentry.pin();
        let by_key = self.by_key.pin();
        // Entries in the maps are not removed while `structure` is held.
        let at = |id: u64| inodes.get(&id).cloned().filter(|i| !i.m.lock().removed);
        if let Some(&id) = by_dentry.get(&node.id()) {
            if let Some(i) = at(id) {
                if (i.is_file(key, attr) && i.is_dir_at(parent)) || id == self.root() {
                    i.m.lock().lookups += 1;
                    if id != self.root() {
                        i.held.set_location(parent_held.as_ref(), &name);
                        i.seen_in(parent);
                    }
                    return id;
                }
            }
        }
        // The number `stat` shows when this key is known under another nodeid.
        let mut reused = None;
        // The newest file of the key first, then older ones the kernel still holds (no
        // allocation unless there are any).
        let newest = by_key.get(&key).copied();
        let older = match newest {
            Some(_) => self.older.lock().get(&key).cloned().unwrap_or_default(),
            None => Vec::new(),
        };
        for id in newest.into_iter().chain(older) {
            if let Some(i) = at(id) {
                // Which names still stand for the inode: not dead in the core, and (unless
                // it is `node` itself) still naming the inode in the backend. None when the
                // key comes back with another file type: a new file.
                let kept = if id == self.root() {
                    Some(
                        i.held
                            .retain_names(|n| Arc::ptr_eq(n, node) || !n.is_dead())
                            .unwrap_or_default(),
                    )
                } else if !i.is_file(key, attr) || !i.is_dir_at(parent) {
                    None
                } else if i.fmt == libc::S_IFDIR {
                    // A directory has one name: another dentry of the same path (made anew by
                    // the core) may still stand for it, a name elsewhere may not. The backend
                    // showing the key there now means `attr` is older than that (a listing
                    // made before the tree was replaced, and the number given since to the
                    // directory there): another directory, maybe that one's descendant.
                    let here = cache.node_path(node).ok();
                    i.held.retain_names(|n| {
                        Arc::ptr_eq(n, node)
                            || (!n.is_dead()
                                && here.is_some()
                                && cache.node_path(n).ok() == here
                                && cache.names_file(n, key, attr.birth))
                    })
                } else {
                    i.held.retain_names(|n| {
                        Arc::ptr_eq(n, node)
                            || (!n.is_dead() && cache.names_file(n, key, attr.birth))
                    })
                };
                if let Some(dropped) = kept {
                    for n in dropped {
                        if by_dentry.get(&n.id()) == Some(&id) {
                            by_dentry.remove(&n.id());
                        }
                    }
                    i.held.add_name(node, false);
                    i.m.lock().lookups += 1;
                    if id != self.root() {
                        i.held.set_location(parent_held.as_ref(), &name);
                        i.seen_in(parent);
                    }
                    by_dentry.insert(node.id(), id);
                    return id;
                }
                // A new file with the inode number of one the kernel still holds: a nodeid
                // of its own, the number `stat` shows kept. The old entry keeps its names
                // (the kernel's old inode is the removed file) until its FORGET.
                reused.get_or_insert(i.st_ino);
            }
        }
        let derived = self.derived(key);
        let id = if derived != ROOT && derived != self.root() && !inodes.contains_key(&derived) {
            derived
        } else {
            while inodes.contains_key(&*next) {
                *next += 1;
            }
            let id = *next;
            *next += 1;
            id
        };
        // A counted nodeid for a key whose derived number the kernel holds for an older file
        // of the same key (or the old file's own number) shows that number.
        let st_ino = if id == derived {
            id
        } else {
            reused
                .or_else(|| {
                    inodes
                        .get(&derived)
                        .filter(|e| derived != self.root() && e.held.key() == key)
                        .map(|e| e.st_ino)
                })
                .unwrap_or(id)
        };
        let held = cache.hold(node, attr, parent_held.as_ref());
        inodes.insert(
            id,
            Arc::new(Inode {
                held,
                st_ino,
                fmt: fmt(attr),
                birth: attr.birth,
                parent: AtomicU64::new(parent),
                told: AtomicU64::new(0),
                unseen_writers: AtomicU32::new(0),
                m: Mutex::new(InodeMut {
                    lookups: 1,
                    removed: false,
                    backing: None,
                }),
            }),
        );
        // The file the key stood for until now, if the kernel still holds it, is an older one.
        if let Some(&prev) = by_key.insert(key, id) {
            if prev != id && at(prev).is_some() {
                self.older.lock().entry(key).or_default().push(prev);
            }
        }
        by_dentry.insert(node.id(), id);
        id
    }

    /// Attributes `a` of `nodeid` go to the kernel (an entry or attribute reply): remembered
    /// for a regular file (read before written: the line is shared by every request).
    pub fn told(&self, nodeid: u64, a: &Attr) {
        if fmt(a) != libc::S_IFREG {
            return;
        }
        let h = told_hash(a);
        self.with_entry(nodeid, |i| {
            if i.told.load(Ordering::Relaxed) != h {
                i.told.store(h, Ordering::Relaxed);
            }
        });
    }

    /// Whether the kernel was last told attributes `a` for `nodeid` (the backend's now):
    /// then its page cache, sized by them, shows the file as it is.
    pub fn told_is(&self, nodeid: u64, a: &Attr) -> bool {
        self.with_entry(nodeid, |i| i.told.load(Ordering::Relaxed) == told_hash(a))
            .unwrap_or(false)
    }

    /// A handle of `nodeid` whose writes the kernel may not see was opened (`+1`) or released
    /// (`-1`): see [`Inode::unseen_writers`].
    pub fn unseen_writer(&self, nodeid: u64, opened: bool) {
        self.with_entry(nodeid, |i| {
            if opened {
                i.unseen_writers.fetch_add(1, Ordering::AcqRel);
            } else {
                let _ = i
                    .unseen_writers
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
            }
        });
    }

    /// Whether attributes of `nodeid` with set-id bits or not (`setid`) may go stale in the
    /// kernel without its knowing while they are kept: a handle whose writes it does not see
    /// is open, or a writer is open and the attributes have set-id bits (a write kills them
    /// in the backing file system; the kernel would keep honouring them).
    pub fn attrs_may_go_stale(&self, nodeid: u64, setid: bool) -> bool {
        self.with_entry(nodeid, |i| {
            i.unseen_writers.load(Ordering::Acquire) > 0 || (setid && i.held.has_writers())
        })
        .unwrap_or(false)
    }

    /// Whether the kernel may hold set-id bits for `nodeid`: the attributes it was last told
    /// had some, or nothing is known of what it holds.
    pub fn told_setid(&self, nodeid: u64) -> bool {
        self.with_entry(nodeid, |i| {
            let t = i.told.load(Ordering::Relaxed);
            t == 0 || t & TOLD_SETID != 0
        })
        .unwrap_or(true)
    }

    /// The kernel's attributes of `nodeid` are being invalidated: nothing is proven until
    /// it is told again.
    pub fn untold(&self, nodeid: u64) {
        self.with_entry(nodeid, |i| i.told.store(0, Ordering::Relaxed));
    }

    /// The FUSE generation of `nodeid`: always 0, a nodeid is never given to another file
    /// while the kernel holds it (see the module invariants).
    pub fn generation(&self, _nodeid: u64) -> u64 {
        0
    }

    /// The inode number `stat` shows for nodeid `nodeid`: the nodeid itself, except for the
    /// root (nodeid 1 or [`SERVED_ROOT`]), which shows SRC's root inode number, and for a file that reused the
    /// number of one the kernel still holds, which shows that number.
    pub fn st_ino(&self, nodeid: u64) -> u64 {
        if nodeid == self.root() {
            self.derived_root()
        } else {
            self.with_entry(nodeid, |i| i.st_ino).unwrap_or(nodeid)
        }
    }

    /// The inode number `stat` shows (or would show) for the backend inode `(dev, ino)`:
    /// readdir's d_ino, without taking a reference.
    pub fn ino_of(&self, dev: u64, ino: u64) -> u64 {
        let key = (dev, ino);
        let id = self
            .by_key
            .pin()
            .get(&key)
            .copied()
            .unwrap_or_else(|| self.derived(key));
        self.st_ino(id)
    }

    /// Add `node` as a name of `nodeid` (after a rename moved the dentry the kernel knows),
    /// seen in directory `parent`.
    pub fn add_alias(&self, nodeid: u64, node: &NodeRef, parent: u64) {
        let parent_held = self.held(parent);
        let _s = self.structure.lock();
        if let Some(i) = self.entry(nodeid) {
            if i.m.lock().removed {
                return;
            }
            i.held.add_name(node, true);
            i.held.set_location(parent_held.as_ref(), &node.name());
            i.seen_in(parent);
            self.by_dentry.pin().insert(node.id(), nodeid);
        }
    }

    /// The nodeid the kernel knows inode `(dev, ino)` by, if it knows it (no reference taken).
    pub fn peek_key(&self, dev: u64, ino: u64) -> Option<u64> {
        self.by_key.pin().get(&(dev, ino)).copied()
    }

    /// Whether attributes with birth `birth` can be of the file `nodeid` was given out for
    /// (see [`Attr::same_birth`]).
    pub fn same_birth(&self, nodeid: u64, birth: u32) -> bool {
        self.with_entry(nodeid, |i| Attr::same_birth(i.birth, birth))
            .unwrap_or(true)
    }

    /// The [`Attr::birth`] `nodeid` was given out with (0: unknown or no such nodeid).
    pub fn birth(&self, nodeid: u64) -> u32 {
        self.with_entry(nodeid, |i| i.birth).unwrap_or(0)
    }

    /// The nodeid a dentry is known to the kernel by.
    pub fn nodeid_of(&self, node: &NodeRef) -> Option<u64> {
        self.by_dentry.pin().get(&node.id()).copied()
    }

    /// The nodeid of `node` if the kernel holds it by this very dentry as inode `key`: it
    /// looked the name up (or had it from a listing) and has not forgotten it since. Its
    /// attributes there are current: every change the core learns of reaches it as an
    /// `inval_inode`.
    pub fn held_by_kernel(&self, node: &NodeRef, attr: &Attr) -> Option<u64> {
        let id = self.nodeid_of(node)?;
        let key = (attr.dev, attr.ino);
        self.with_entry(id, |i| {
            let m = i.m.lock();
            !m.removed && m.lookups > 0 && (id == self.root() || i.is_file(key, attr))
        })
        .filter(|ok| *ok)
        .map(|_| id)
    }

    /// Drop `n` kernel references; the last one gives the inode back to the core.
    pub fn forget(&self, cache: &Cache, nodeid: u64, n: u64) {
        if nodeid == ROOT || nodeid == self.root() {
            return;
        }
        let Some(i) = self.entry(nodeid) else {
            return;
        };
        {
            let mut m = i.m.lock();
            m.lookups = m.lookups.saturating_sub(n);
            // The kernel holds an inode reference for every open file, so it never forgets
            // an inode with open handles.
            if m.lookups > 0 {
                return;
            }
        }
        let _s = self.structure.lock();
        {
            let mut m = i.m.lock();
            if m.lookups > 0 || m.removed {
                return;
            }
            m.removed = true;
        }
        let inodes = self.inodes.pin();
        if inodes.get(&nodeid).is_some_and(|e| Arc::ptr_eq(e, &i)) {
            inodes.remove(&nodeid);
        }
        let key = i.held.key();
        let by_key = self.by_key.pin();
        let mut older = self.older.lock();
        if by_key.get(&key) == Some(&nodeid) {
            // An older file of the key the kernel still holds takes its place.
            match older.get_mut(&key).and_then(Vec::pop) {
                Some(o) => by_key.insert(key, o),
                None => by_key.remove(&key),
            };
        } else if let Some(ids) = older.get_mut(&key) {
            ids.retain(|&o| o != nodeid);
        }
        if older.get(&key).is_some_and(Vec::is_empty) {
            older.remove(&key);
        }
        drop(older);
        let by_dentry = self.by_dentry.pin();
        for a in i.held.names() {
            if by_dentry.get(&a.id()) == Some(&nodeid) {
                by_dentry.remove(&a.id());
            }
        }
        cache.release(&i.held);
    }

    /// The passthrough backing id of `nodeid`, created with `make` on first use.
    pub fn acquire_backing(
        &self,
        nodeid: u64,
        make: impl FnOnce() -> std::io::Result<BackingId>,
    ) -> std::io::Result<Arc<BackingId>> {
        let i = self
            .entry(nodeid)
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::ESTALE))?;
        let mut m = i.m.lock();
        if let Some((b, users)) = &mut m.backing {
            *users += 1;
            return Ok(b.clone());
        }
        let b = Arc::new(make()?);
        m.backing = Some((b.clone(), 1));
        Ok(b)
    }

    pub fn release_backing(&self, nodeid: u64) {
        if let Some(i) = self.entry(nodeid) {
            let mut m = i.m.lock();
            if let Some((_, users)) = &mut m.backing {
                *users = users.saturating_sub(1);
                if *users == 0 {
                    m.backing = None;
                }
            }
        }
    }

    /// Every (nodeid, dentry) pair, for "everything may have changed".
    pub fn all(&self) -> Vec<(u64, NodeRef)> {
        let inodes = self.inodes.pin();
        inodes
            .iter()
            .flat_map(|(id, i)| i.held.names().into_iter().map(move |a| (*id, a)))
            .collect()
    }

    pub fn len(&self) -> usize {
        self.inodes.pin().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dircache_core::memory::MemoryBackend;
    use dircache_core::{Config, Cred};

    fn setup() -> (Arc<Cache>, Inodes, NodeRef, Attr) {
        let b = Arc::new(MemoryBackend::new());
        b.populate(&["d/f"]);
        let cache = Cache::new(b, Config::default()).unwrap();
        let inodes = Inodes::new(&cache);
        let c = cache.kernel_checked(Cred::root());
        let d = cache.lookup_child(&c, &cache.root(), b"d").unwrap();
        let f = cache.lookup_child(&c, &d, b"f").unwrap();
        let a = cache.getattr(&f).unwrap();
        (cache, inodes, f, a)
    }

    /// A directory listed a moment before its tree was replaced in SRC (lookahead's listings
    /// are answered later): its attributes carry an inode number that ext4 has since given
    /// to an ancestor the kernel holds (`T` removed and made again with the freed number of
    /// the old `T/d1/s1`). It is another directory: a nodeid of its own, not the ancestor's
    /// (the kernel's `d_splice_alias` fails a directory whose alias is an ancestor of the
    /// new place with ELOOP: `replaced_trees.rs`), and `stat` still shows the number.
    #[test]
    fn a_directory_with_an_ancestors_number_is_not_the_ancestor() {
        let b = Arc::new(MemoryBackend::new());
        b.populate(&["T/d1/s1/", "U/"]);
        let cache = Cache::new(b, Config::default()).unwrap();
        let inodes = Inodes::new(&cache);
        let c = cache.kernel_checked(Cred::root());
        let t = cache.lookup_child(&c, &cache.root(), b"T").unwrap();
        let ta = cache.getattr(&t).unwrap();
        let d1 = cache.lookup_child(&c, &t, b"d1").unwrap();
        let s1 = cache.lookup_child(&c, &d1, b"s1").unwrap();
        let tid = inodes.register(&cache, &t, &ta, ROOT);
        let d1id = inodes.register(&cache, &d1, &cache.getattr(&d1).unwrap(), tid);
        // s1 with the attributes it had when listed: T's number now (T still names it).
        let stale = Attr {
            ino: ta.ino,
            dev: ta.dev,
            ..cache.getattr(&s1).unwrap()
        };
        let sid = inodes.register(&cache, &s1, &stale, d1id);
        assert_ne!(sid, tid, "T/d1/s1 was given its ancestor T's nodeid");
        assert_eq!(
            inodes.st_ino(sid),
            inodes.st_ino(tid),
            "the number stat shows"
        );
        // The same for a directory elsewhere (not an ancestor): a directory has one name.
        let u = cache.lookup_child(&c, &cache.root(), b"U").unwrap();
        let uid = inodes.register(&cache, &u, &stale, ROOT);
        assert_ne!(uid, tid, "U was given T's nodeid");
        // T itself, looked up again through a new dentry of the same path, keeps its nodeid.
        assert_eq!(inodes.register(&cache, &t, &ta, ROOT), tid);
    }

    /// A file removed in SRC and made again, by ext4, with the same inode number (and type):
    /// another birth time. Looked up through the same dentry (the change feed has not
    /// reported the removal) it is a new file to the kernel, not the inode it holds with the
    /// old file's page cache; a new name of the new file is not a hard link of the old one
    /// even while the old name shows the number again in the backend; `stat` keeps showing
    /// the number.
    #[test]
    fn a_file_replaced_with_its_inode_number_is_a_new_file() {
        let b = Arc::new(MemoryBackend::new());
        b.populate(&["d/f", "d/g", "d/h"]);
        let cache = Cache::new(b, Config::default()).unwrap();
        let inodes = Inodes::new(&cache);
        let c = cache.kernel_checked(Cred::root());
        let d = cache.lookup_child(&c, &cache.root(), b"d").unwrap();
        let did = inodes.register(&cache, &d, &cache.getattr(&d).unwrap(), ROOT);
        let f = cache.lookup_child(&c, &d, b"f").unwrap();
        let a = cache.getattr(&f).unwrap();
        let old = Attr { birth: 11, ..a };
        let fid = inodes.register(&cache, &f, &old, did);
        let new = Attr { birth: 22, ..a };
        let nid = inodes.register(&cache, &f, &new, did);
        assert_ne!(
            nid, fid,
            "the new file at the old name was given the old file's nodeid"
        );
        assert_eq!(
            inodes.st_ino(nid),
            inodes.st_ino(fid),
            "the number stat shows"
        );
        assert_eq!(inodes.held_by_kernel(&f, &new), Some(nid));
        // `g` with the old file's attributes (listed before the replacement): not a hard
        // link of the new file, although `f` names the number in the backend.
        let g = cache.lookup_child(&c, &d, b"g").unwrap();
        let gid = inodes.register(&cache, &g, &old, did);
        assert_ne!(
            gid, nid,
            "a name of the old file was taken for a link of the new one"
        );
        // It is the old file the kernel still holds: its hard link, not a third inode.
        assert_eq!(gid, fid, "a name of the older file got a nodeid of its own");
        // The newest forgotten, the older one is the key's again (a third name of it).
        inodes.forget(&cache, nid, 1);
        assert_eq!(inodes.peek_key(a.dev, a.ino), Some(fid));
        let h = cache.lookup_child(&c, &d, b"h").unwrap();
        assert_eq!(inodes.register(&cache, &h, &old, did), fid);
    }

    /// LOOKUPs and FORGETs of one inode racing on several threads: every reference is
    /// counted once, the entry goes with the last FORGET (never earlier: the kernel's
    /// nodeid keeps working), and its nodeid is the same throughout.
    #[test]
    fn concurrent_lookups_and_forgets_keep_the_count() {
        let (cache, inodes, f, a) = setup();
        let held = inodes.register(&cache, &f, &a, ROOT);
        let start = std::sync::Barrier::new(4);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    start.wait();
                    for _ in 0..20000 {
                        let id = inodes.register(&cache, &f, &a, ROOT);
                        assert_eq!(id, held, "one nodeid per inode");
                        assert!(inodes.held(id).is_some(), "a referenced nodeid vanished");
                        inodes.forget(&cache, id, 1);
                    }
                });
            }
        });
        assert_eq!(inodes.nodeid_of(&f), Some(held));
        assert_eq!(inodes.len(), 2);
        inodes.forget(&cache, held, 1);
        assert_eq!(inodes.nodeid_of(&f), None);
        assert_eq!(inodes.peek_key(a.dev, a.ino), None);
        assert_eq!(inodes.len(), 1);
    }

    /// An entry whose last reference goes while LOOKUPs register it again: an entry stays
    /// while any reference remains, and afterwards the maps agree with the counts.
    #[test]
    fn last_forget_racing_a_lookup_leaves_consistent_maps() {
        let (cache, inodes, f, a) = setup();
        let start = std::sync::Barrier::new(4);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    start.wait();
                    for _ in 0..20000 {
                        let id = inodes.register(&cache, &f, &a, ROOT);
                        let h = inodes.held(id).expect("a referenced nodeid vanished");
                        std::thread::yield_now();
                        let now = inodes.held(id).expect("a referenced nodeid vanished");
                        assert!(
                            Held::same(&h, &now),
                            "a referenced entry was dropped and made anew"
                        );
                        inodes.forget(&cache, id, 1);
                    }
                });
            }
        });
        assert_eq!(inodes.nodeid_of(&f), None);
        assert_eq!(inodes.peek_key(a.dev, a.ino), None);
        assert_eq!(inodes.len(), 1);
    }
}
