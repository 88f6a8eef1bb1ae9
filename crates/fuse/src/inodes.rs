//! The kernel's nodeids and the core cache's dentries.
//!
//! Invariants:
//! - nodeid 1 is the root and is never forgotten.
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
//! - `(nodeid, generation)` is never reused for a different file. When every dentry of a key
//!   is dead (unlinked, replaced) and the same `(dev, ino)` shows up again while the kernel
//!   still holds the old inode, it is a new file that reused the inode number: it keeps the
//!   nodeid and gets the next generation, so the kernel marks its old inode bad instead of
//!   mixing the old page cache with the new file (`fuse_iget`). A dentry the core has not
//!   marked dead may still stand for a removed name (the change feed reports removals after
//!   the fact): a new name of a known key counts the old names as live only if the backend
//!   still shows them with that key ([`Inodes::register`]'s `names_key`), so a reused number
//!   is never taken for a hard link of a gone file. FORGETs carry no generation:
//!   `lookups` counts references to the nodeid across generations, which is what the kernel
//!   forgets.
//! - `lookups` counts the kernel's references (each LOOKUP-like reply adds one, FORGET
//!   subtracts); the entry is dropped when it reaches zero.
//! - Every dentry in an entry's `aliases` holds one pin in the core ([`NodeRef::pin`]) until
//!   it leaves the list: the core never evicts a dentry the kernel holds, so a name the kernel
//!   still knows keeps its place in the tree and is kept up to date by the change feed
//!   (evicting it left the kernel holding a dentry outside the tree, and lookups below it
//!   answered ENOENT for existing files).

use std::collections::HashMap;
use std::sync::Arc;

use dircache_core::{Attr, NodeRef};
use fuser::BackingId;
use parking_lot::Mutex;

/// The root's nodeid (FUSE_ROOT_ID).
pub const ROOT: u64 = 1;

struct Inode {
    /// Dentries (hard-link names) known to stand for this inode; never empty.
    aliases: Vec<NodeRef>,
    key: (u64, u64),
    /// The FUSE generation: bumped when the nodeid is reused for a new file (see above).
    generation: u64,
    /// Where the kernel last saw it: parent nodeid and name (to find it again when the core
    /// invalidated its dentry).
    parent: u64,
    name: Vec<u8>,
    lookups: u64,
    /// Attributes may have changed through another name (link/unlink/rename): refresh from
    /// the backend before answering.
    stale: bool,
    /// Open handles that may write.
    writers: u32,
    /// Open handles (any mode): while there are some, reads and writes through them move the
    /// backend's times behind the core's copy of the attributes.
    opens: u32,
    /// A directory's last attributes: what fstat of it shows (with nlink 0) once it was
    /// removed (rmdir, renamed over) while the kernel still holds it.
    dir_attr: Option<Box<Attr>>,
    /// Passthrough backing file shared by every open handle of the inode, with its users.
    backing: Option<(Arc<BackingId>, u32)>,
}

/// Add `node` to `aliases` with its pin (unless it is there already).
fn hold(aliases: &mut Vec<NodeRef>, node: &NodeRef, front: bool) {
    if aliases.iter().any(|n| Arc::ptr_eq(n, node)) {
        return;
    }
    node.pin();
    if front {
        aliases.insert(0, node.clone());
    } else {
        aliases.push(node.clone());
    }
}

impl Inode {
    fn live_alias(&mut self) -> NodeRef {
        // Prefer a name still in the tree: dead (removed, replaced) and evicted dentries are
        // found again by the front end (`DircacheFs::node`).
        let pos = self
            .aliases
            .iter()
            .position(|n| !n.is_dead() && !n.is_evicted())
            .or_else(|| self.aliases.iter().position(|n| !n.is_dead()));
        if let Some(i) = pos {
            if i != 0 {
                self.aliases.swap(0, i);
            }
        }
        self.aliases[0].clone()
    }
}

#[derive(Default)]
struct Table {
    inodes: HashMap<u64, Inode>,
    by_key: HashMap<(u64, u64), u64>,
    by_dentry: HashMap<u64, u64>,
    /// The next counted nodeid (for keys whose derived number is taken), from 2^62.
    next: u64,
    /// SRC's root: its device (whose inode numbers are used as they are) and its key.
    root_key: Key,
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

impl Table {
    /// The number `key` gets when it is free: see the module invariants.
    fn derived(&self, key: Key) -> u64 {
        if key == self.root_key {
            ROOT
        } else if key.0 == self.root_key.0 && key.1 > ROOT && key.1 < COUNTED {
            key.1
        } else {
            mix(key.0, key.1) | OTHER_DEV
        }
    }

    /// The number `stat` shows for `key` (the nodeid it has or would get).
    fn ino_of(&self, key: Key) -> u64 {
        self.by_key
            .get(&key)
            .copied()
            .unwrap_or_else(|| self.derived(key))
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

    fn counted(&mut self) -> u64 {
        while self.inodes.contains_key(&self.next) {
            self.next += 1;
        }
        let id = self.next;
        self.next += 1;
        id
    }
}

/// A real inode's identity: (dev, ino).
pub type Key = (u64, u64);

/// Where the kernel last saw a nodeid: its dentry, parent nodeid, name and key.
pub type Location = (NodeRef, u64, Vec<u8>, Key);

/// The nodeid table. One mutex: it is only touched by requests that reached the daemon
/// (misses), which cost 10+ us each anyway.
pub struct Inodes {
    t: Mutex<Table>,
    /// Real inodes ((dev, ino), bit 0 access / bit 1 default) whose `system.posix_acl_*`
    /// answered ENODATA. The kernel caches ACLs per inode but drops them when it forgets the
    /// inode (memory pressure, drop_caches) or refreshes it by READDIRPLUS, and `ls -l` then
    /// asks again for every file: answered from here without a syscall. Cleared whole on any
    /// mutation through the mount and on every change the feed reports (an ACL appears only
    /// through one of those), so it is never stale longer than the coherence window.
    no_acl: Mutex<(u64, HashMap<Key, u8>)>,
}

/// What the table knows about a nodeid.
pub struct InodeInfo {
    pub node: NodeRef,
    pub stale: bool,
    pub writers: u32,
    pub opens: u32,
}

impl Inodes {
    pub fn new(root: NodeRef, root_attr: Option<&Attr>) -> Inodes {
        let key = root_attr
            .map(|a| (a.dev, a.ino))
            .unwrap_or((u64::MAX, u64::MAX));
        root.pin();
        let mut t = Table {
            next: COUNTED,
            root_key: key,
            ..Default::default()
        };
        t.by_dentry.insert(root.id(), ROOT);
        t.by_key.insert(key, ROOT);
        t.inodes.insert(
            ROOT,
            Inode {
                aliases: vec![root],
                key,
                generation: 0,
                parent: 0,
                name: Vec::new(),
                lookups: 1,
                stale: false,
                writers: 0,
                opens: 0,
                dir_attr: None,
                backing: None,
            },
        );
        Inodes {
            t: Mutex::new(t),
            no_acl: Mutex::new((0, HashMap::new())),
        }
    }

    /// The dentry for `nodeid` (a live alias when there is one).
    pub fn get(&self, nodeid: u64) -> Option<NodeRef> {
        let mut t = self.t.lock();
        t.inodes.get_mut(&nodeid).map(|i| i.live_alias())
    }

    /// The dentry for `nodeid` with where the kernel last saw it and its (dev, ino) key.
    pub fn locate(&self, nodeid: u64) -> Option<Location> {
        let mut t = self.t.lock();
        t.inodes
            .get_mut(&nodeid)
            .map(|i| (i.live_alias(), i.parent, i.name.clone(), i.key))
    }

    pub fn info(&self, nodeid: u64) -> Option<InodeInfo> {
        let mut t = self.t.lock();
        t.inodes.get_mut(&nodeid).map(|i| InodeInfo {
            node: i.live_alias(),
            stale: i.stale,
            writers: i.writers,
            opens: i.opens,
        })
    }

    /// Record one more kernel reference to `node` (with attributes `attr`); returns its nodeid.
    ///
    /// `names_key(alias, key)` tells whether another dentry of the same key still names that
    /// inode in the backend. It is asked only when `node` is a new name for a key the kernel
    /// knows: the core learns of removals in SRC from the change feed, after the fact, so a
    /// dentry that is not dead yet may stand for a name that is gone, whose inode number the
    /// backend already gave to `node`'s new file. Taken for a hard link, the new file would
    /// get the old inode's nodeid and generation (the kernel would reuse its old inode and
    /// page cache) and opens would go to the gone name (ENOENT for an existing file).
    pub fn register(
        &self,
        node: &NodeRef,
        attr: &Attr,
        parent: u64,
        names_key: impl Fn(&NodeRef, Key) -> bool,
    ) -> u64 {
        let key = (attr.dev, attr.ino);
        let name = node.name();
        let mut t = self.t.lock();
        let t = &mut *t;
        if let Some(&id) = t.by_dentry.get(&node.id()) {
            if let Some(i) = t.inodes.get_mut(&id) {
                if i.key == key || id == ROOT {
                    i.lookups += 1;
                    if id != ROOT {
                        i.parent = parent;
                        i.name = name;
                    }
                    return id;
                }
            }
        }
        if let Some(&id) = t.by_key.get(&key) {
            if let Some(i) = t.inodes.get_mut(&id) {
                // Which names still stand for the inode: not dead in the core, and (unless
                // it is `node` itself) still naming the inode in the backend.
                let live: Vec<bool> = i
                    .aliases
                    .iter()
                    .map(|n| {
                        Arc::ptr_eq(n, node) || (!n.is_dead() && (id == ROOT || names_key(n, key)))
                    })
                    .collect();
                let alive = id == ROOT || live.iter().any(|l| *l);
                if alive {
                    let mut live = live.into_iter();
                    let by_dentry = &mut t.by_dentry;
                    i.aliases.retain(|n| {
                        let keep = live.next().unwrap_or(false);
                        if !keep {
                            n.unpin();
                            if by_dentry.get(&n.id()) == Some(&id) {
                                by_dentry.remove(&n.id());
                            }
                        }
                        keep
                    });
                    hold(&mut i.aliases, node, false);
                    i.lookups += 1;
                    if id != ROOT {
                        i.parent = parent;
                        i.name = name;
                    }
                    t.by_dentry.insert(node.id(), id);
                    return id;
                }
                // A new file with the inode number of one the kernel still holds. Open
                // handles pin the old inode (its number cannot be reused while they exist),
                // so there are none; were there, the new file takes a counted number.
                if i.writers == 0 && i.opens == 0 && i.backing.is_none() {
                    i.generation += 1;
                    i.dir_attr = attr.is_dir().then(|| Box::new(*attr));
                    node.pin();
                    for a in std::mem::replace(&mut i.aliases, vec![node.clone()]) {
                        // Every name in the list holds one pin (see `hold`).
                        a.unpin();
                        if t.by_dentry.get(&a.id()) == Some(&id) {
                            t.by_dentry.remove(&a.id());
                        }
                    }
                    i.lookups += 1;
                    i.parent = parent;
                    i.name = name;
                    i.stale = false;
                    t.by_dentry.insert(node.id(), id);
                    return id;
                }
            }
        }
        let derived = t.derived(key);
        let id = if derived != ROOT && !t.inodes.contains_key(&derived) {
            derived
        } else {
            t.counted()
        };
        node.pin();
        t.by_key.insert(key, id);
        t.by_dentry.insert(node.id(), id);
        t.inodes.insert(
            id,
            Inode {
                aliases: vec![node.clone()],
                key,
                generation: 0,
                parent,
                name,
                lookups: 1,
                stale: false,
                writers: 0,
                opens: 0,
                dir_attr: attr.is_dir().then(|| Box::new(*attr)),
                backing: None,
            },
        );
        id
    }

    /// Every name known to stand for `nodeid`, the preferred first.
    pub fn aliases(&self, nodeid: u64) -> Vec<NodeRef> {
        let mut t = self.t.lock();
        match t.inodes.get_mut(&nodeid) {
            Some(i) => {
                i.live_alias();
                i.aliases.clone()
            }
            None => Vec::new(),
        }
    }

    /// Prefer `node` (a name of `nodeid` that was just found to work) to the other names.
    pub fn prefer(&self, nodeid: u64, node: &NodeRef) {
        let mut t = self.t.lock();
        if let Some(i) = t.inodes.get_mut(&nodeid) {
            if let Some(pos) = i.aliases.iter().position(|n| Arc::ptr_eq(n, node)) {
                i.aliases.swap(0, pos);
            }
        }
    }

    /// The FUSE generation of `nodeid` (0 when unknown).
    pub fn generation(&self, nodeid: u64) -> u64 {
        self.t
            .lock()
            .inodes
            .get(&nodeid)
            .map(|i| i.generation)
            .unwrap_or(0)
    }

    /// The inode number `stat` shows for nodeid `nodeid`: the nodeid itself, except for the
    /// root (nodeid 1), which shows SRC's root inode number.
    pub fn st_ino(&self, nodeid: u64) -> u64 {
        if nodeid == ROOT {
            let t = self.t.lock();
            t.derived_root()
        } else {
            nodeid
        }
    }

    /// The inode number `stat` shows (or would show) for the backend inode `(dev, ino)`:
    /// readdir's d_ino, without taking a reference.
    pub fn ino_of(&self, dev: u64, ino: u64) -> u64 {
        let t = self.t.lock();
        match t.ino_of((dev, ino)) {
            ROOT => t.derived_root(),
            id => id,
        }
    }

    /// Add `node` as a name of `nodeid` (after a rename moved the dentry the kernel knows).
    pub fn add_alias(&self, nodeid: u64, node: &NodeRef, parent: u64) {
        let mut t = self.t.lock();
        let t = &mut *t;
        if let Some(i) = t.inodes.get_mut(&nodeid) {
            i.parent = parent;
            i.name = node.name();
            hold(&mut i.aliases, node, true);
            t.by_dentry.insert(node.id(), nodeid);
        }
    }

    /// The nodeid the kernel knows inode `(dev, ino)` by, if it knows it (no reference taken).
    pub fn peek_key(&self, dev: u64, ino: u64) -> Option<u64> {
        self.t.lock().by_key.get(&(dev, ino)).copied()
    }

    /// The nodeid a dentry is known to the kernel by.
    pub fn nodeid_of(&self, node: &NodeRef) -> Option<u64> {
        self.t.lock().by_dentry.get(&node.id()).copied()
    }

    /// Whether `key` is known to have no POSIX ACL of kind `bit` (1 access, 2 default).
    pub fn acl_absent(&self, key: (u64, u64), bit: u8) -> bool {
        self.no_acl.lock().1.get(&key).is_some_and(|b| b & bit != 0)
    }

    /// The ACL memo's generation: read it before asking the file system, pass it to
    /// [`Inodes::note_acl_absent`].
    pub fn acl_gen(&self) -> u64 {
        self.no_acl.lock().0
    }

    /// Remember that `key` has no POSIX ACL of kind `bit`, unless something changed since
    /// generation `gen` was read (the answer may already be outdated).
    pub fn note_acl_absent(&self, key: (u64, u64), bit: u8, gen: u64) {
        let mut m = self.no_acl.lock();
        if m.0 != gen {
            return;
        }
        if m.1.len() >= 1 << 20 {
            m.1.clear();
        }
        *m.1.entry(key).or_insert(0) |= bit;
    }

    /// Forget every remembered ACL absence (after any change).
    pub fn clear_acl_absent(&self) {
        let mut m = self.no_acl.lock();
        m.0 += 1;
        m.1.clear();
    }

    /// Drop `n` kernel references.
    pub fn forget(&self, nodeid: u64, n: u64) {
        if nodeid == ROOT {
            return;
        }
        let mut t = self.t.lock();
        let t = &mut *t;
        let gone = match t.inodes.get_mut(&nodeid) {
            Some(i) => {
                i.lookups = i.lookups.saturating_sub(n);
                // The kernel holds an inode reference for every open file, so it never forgets
                // an inode with open handles.
                i.lookups == 0
            }
            None => false,
        };
        if gone {
            if let Some(i) = t.inodes.remove(&nodeid) {
                if t.by_key.get(&i.key) == Some(&nodeid) {
                    t.by_key.remove(&i.key);
                }
                for a in &i.aliases {
                    a.unpin();
                    if t.by_dentry.get(&a.id()) == Some(&nodeid) {
                        t.by_dentry.remove(&a.id());
                    }
                }
            }
        }
    }

    /// Mark `nodeid`'s attributes as possibly changed through another name.
    pub fn set_stale(&self, nodeid: u64, stale: bool) {
        if let Some(i) = self.t.lock().inodes.get_mut(&nodeid) {
            i.stale = stale;
        }
    }

    /// Mark stale every inode that `node` (a dentry) stands for, returning its aliases.
    pub fn mark_stale_dentry(&self, node: &NodeRef) -> Vec<NodeRef> {
        let mut t = self.t.lock();
        let t = &mut *t;
        match t.by_dentry.get(&node.id()).copied() {
            Some(id) => match t.inodes.get_mut(&id) {
                Some(i) => {
                    i.stale = true;
                    i.aliases.clone()
                }
                None => vec![],
            },
            None => vec![],
        }
    }

    /// Count an open handle of `nodeid` (`delta` +1 at open, -1 at release).
    pub fn add_open(&self, nodeid: u64, delta: i32) {
        if let Some(i) = self.t.lock().inodes.get_mut(&nodeid) {
            i.opens = i.opens.saturating_add_signed(delta);
        }
    }

    /// Remember a directory's attributes (see `Inode::dir_attr`).
    pub fn note_dir_attr(&self, nodeid: u64, a: &Attr) {
        if let Some(i) = self.t.lock().inodes.get_mut(&nodeid) {
            i.dir_attr = Some(Box::new(*a));
        }
    }

    /// A directory's last known attributes.
    pub fn dir_attr(&self, nodeid: u64) -> Option<Attr> {
        self.t
            .lock()
            .inodes
            .get(&nodeid)
            .and_then(|i| i.dir_attr.as_deref().copied())
    }

    pub fn add_writer(&self, nodeid: u64, delta: i32) {
        if let Some(i) = self.t.lock().inodes.get_mut(&nodeid) {
            i.writers = i.writers.saturating_add_signed(delta);
        }
    }

    /// The passthrough backing id of `nodeid`, created with `make` on first use.
    pub fn acquire_backing(
        &self,
        nodeid: u64,
        make: impl FnOnce() -> std::io::Result<BackingId>,
    ) -> std::io::Result<Arc<BackingId>> {
        let mut t = self.t.lock();
        let i = t
            .inodes
            .get_mut(&nodeid)
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::ESTALE))?;
        if let Some((b, users)) = &mut i.backing {
            *users += 1;
            return Ok(b.clone());
        }
        let b = Arc::new(make()?);
        i.backing = Some((b.clone(), 1));
        Ok(b)
    }

    pub fn release_backing(&self, nodeid: u64) {
        let mut t = self.t.lock();
        if let Some(i) = t.inodes.get_mut(&nodeid) {
            if let Some((_, users)) = &mut i.backing {
                *users = users.saturating_sub(1);
                if *users == 0 {
                    i.backing = None;
                }
            }
        }
    }

    /// Every (nodeid, dentry) pair, for "everything may have changed".
    pub fn all(&self) -> Vec<(u64, NodeRef)> {
        let t = self.t.lock();
        t.inodes
            .iter()
            .flat_map(|(id, i)| i.aliases.iter().map(move |a| (*id, a.clone())))
            .collect()
    }

    pub fn len(&self) -> usize {
        self.t.lock().inodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
