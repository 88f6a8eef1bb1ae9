//! Held nodes: what a front end (the FUSE kernel, a server's client) holds a reference to.
//!
//! gVisor's VFS (`pkg/sentry/vfs/README.md`, "Reference Counting") states the contract this
//! module implements: a dentry somebody holds a reference to must remain coherent. A front end
//! calls [`Cache::hold`] when it hands a node out (a FUSE LOOKUP reply) and drops the [`Held`]
//! when the last reference goes (FORGET). While held:
//!
//! - **Pinned.** Every name of a held inode holds one pin ([`Dentry::pin`]): eviction never
//!   takes it out of the tree, so the change feed keeps it up to date (evicting a held name
//!   left the kernel with a node nothing updated: outside changes were lost).
//! - **Revived.** When the core dropped the name (an outside change killed it: a rename, a
//!   replace), [`Cache::held_node`] finds the inode again by the name the holder last saw,
//!   from its held parent, and keeps the new dentry if it is still the same `(dev, ino)`;
//!   [`Cache::on_held`] retries an operation on another name of a hard-linked file whose
//!   preferred name is gone in the backend. This is the only revival for held nodes; the
//!   tree's own revival of moved directories (`revive`, `revive_below`) works below it.
//! - **Fresh attributes** ([`Cache::attr_for_reply`]): from the backend when they may have
//!   changed behind the core's copy: after a change through another name of the inode
//!   ([`Cache::held_changed`]), while the file is open (reads move the atime, writes and
//!   shared mappings mtime and ctime: [`Cache::note_open`]), and for hard-linked files
//!   (another name may have changed nlink/ctime unseen).
//! - **Writers.** [`Held::has_writers`]: the holder must not let its own copy of the
//!   attributes live while a writer has the file open.
//!
//! The xattr-absence memo ([`Cache::xattr_known_absent`]) lives here too: which inodes are
//! known to have no value for an attribute the kernel asks for again and again (POSIX ACLs,
//! asked by `ls -l` for every file). The core clears it itself on every attribute change it
//! learns of (through [`Cache::forget_attr`], which every mutation through a front end calls,
//! and [`Cache::apply_change`], which every outside change goes through), so it is never
//! stale longer than the core's own attributes.
//!
//! Locks: one mutex per held inode (its names), never a global one; the memo is a lock-free
//! map. A held inode's lock is taken after any dentry lock is released (it is a leaf).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use arc_swap::ArcSwap;
use parking_lot::Mutex;

use super::{Cache, Dentry, NodeKind, NodeRef};
use crate::{Attr, Cred, Error, Result};

/// How deep [`Cache::held_node`] follows held parents (a cycle of stale locations must end).
const MAX_DEPTH: u32 = 4096;

/// How many times [`Cache::held_node`] finds a held inode again when the dentry it found
/// died before it could be handed back (a change applied meanwhile).
const RACE_RETRIES: u32 = 8;

/// A held inode: its names (hard links) and what the core must know to keep it coherent.
/// Cheap to clone; the names are unpinned when the last clone is dropped.
#[derive(Clone)]
pub struct Held(Arc<HeldInner>);

struct HeldInner {
    /// `(dev, ino)` of the inode (`(u64::MAX, u64::MAX)`: unknown, only for a root without
    /// attributes).
    key: (u64, u64),
    /// The root of the cache: found again as [`Cache::root`].
    root: bool,
    /// The preferred name (`st.names[0]`), read without the lock on every request.
    preferred: ArcSwap<Dentry>,
    st: Mutex<HeldState>,
    /// Attributes may have changed through another name: ask the backend before the next
    /// reply.
    stale: AtomicBool,
    /// Open handles that may write.
    writers: AtomicU32,
    /// Open handles of any mode.
    opens: AtomicU32,
}

struct HeldState {
    /// Names known to stand for the inode, the preferred first; never empty; each pinned.
    names: Vec<NodeRef>,
    /// Where the holder last saw it: the held parent and the name there.
    parent: Option<Weak<HeldInner>>,
    name: Vec<u8>,
    /// A directory's last attributes: what fstat shows (with nlink 0) after it was removed
    /// while held.
    dir_attr: Option<Attr>,
    /// [`Cache::release`] unpinned the names already (they stay for late readers).
    released: bool,
}

impl Drop for HeldInner {
    fn drop(&mut self) {
        let st = self.st.get_mut();
        if !st.released {
            for n in &st.names {
                n.unpin();
            }
        }
    }
}

impl Held {
    /// Publish `st.names[0]` as the preferred name (called with the lock held, after every
    /// change of the first name).
    fn sync(&self, st: &HeldState) {
        if let Some(n) = st.names.first() {
            if !Arc::ptr_eq(&self.0.preferred.load(), n) {
                self.0.preferred.store(n.clone());
            }
        }
    }

    /// The inode's `(dev, ino)`.
    pub fn key(&self) -> (u64, u64) {
        self.0.key
    }

    /// The preferred name: one still in the tree when there is one (it may be dead: use
    /// [`Cache::held_node`] to revive it).
    pub fn node(&self) -> NodeRef {
        let p = self.0.preferred.load_full();
        if !p.is_dead() && !p.is_evicted() {
            return p;
        }
        let mut st = self.0.st.lock();
        let pos = st
            .names
            .iter()
            .position(|n| !n.is_dead() && !n.is_evicted())
            .or_else(|| st.names.iter().position(|n| !n.is_dead()));
        if let Some(i) = pos {
            if i != 0 {
                st.names.swap(0, i);
                self.sync(&st);
            }
        }
        st.names.first().cloned().unwrap_or(p)
    }

    /// Every name, the preferred first.
    pub fn names(&self) -> Vec<NodeRef> {
        self.node();
        self.0.st.lock().names.clone()
    }

    /// Whether `node` is one of the names.
    pub fn has_name(&self, node: &NodeRef) -> bool {
        self.0.st.lock().names.iter().any(|n| Arc::ptr_eq(n, node))
    }

    /// Add `node` as a name (pinned), first if `front` (it is where the holder saw it last).
    pub fn add_name(&self, node: &NodeRef, front: bool) {
        let mut st = self.0.st.lock();
        if let Some(pos) = st.names.iter().position(|n| Arc::ptr_eq(n, node)) {
            if front {
                st.names.swap(0, pos);
                self.sync(&st);
            }
            return;
        }
        if !st.released {
            node.pin();
        }
        if front {
            st.names.insert(0, node.clone());
            self.sync(&st);
        } else {
            st.names.push(node.clone());
        }
    }

    /// Keep only the names for which `keep` says so (each asked once, without the lock: it
    /// may call the backend), returning the names dropped (unpinned). Returns `None` and
    /// changes nothing when no name would be left.
    pub fn retain_names(&self, mut keep: impl FnMut(&NodeRef) -> bool) -> Option<Vec<NodeRef>> {
        let names = self.0.st.lock().names.clone();
        let verdict: Vec<bool> = names.iter().map(&mut keep).collect();
        if !verdict.iter().any(|k| *k) {
            return None;
        }
        let mut st = self.0.st.lock();
        let mut dropped = Vec::new();
        let released = st.released;
        st.names.retain(|n| {
            // Names added meanwhile were not asked: kept.
            let k = match names.iter().position(|m| Arc::ptr_eq(m, n)) {
                Some(i) => verdict[i],
                None => true,
            };
            if !k {
                dropped.push(n.clone());
            }
            k
        });
        self.sync(&st);
        drop(st);
        if !released {
            for n in &dropped {
                n.unpin();
            }
        }
        Some(dropped)
    }

    /// The inode number was reused for a new file (`node`, attributes `attr`) while held:
    /// every old name goes (unpinned, returned), `node` is the only one; staleness is reset.
    pub fn replace_names(&self, node: &NodeRef, attr: &Attr) -> Vec<NodeRef> {
        let mut st = self.0.st.lock();
        let old = std::mem::replace(&mut st.names, vec![node.clone()]);
        self.sync(&st);
        st.dir_attr = attr.is_dir().then_some(*attr);
        if !st.released {
            node.pin();
            for n in &old {
                n.unpin();
            }
        }
        drop(st);
        self.0.stale.store(false, Ordering::Release);
        old
    }

    /// Prefer `node` (a name that was just found to work) to the others.
    pub fn prefer(&self, node: &NodeRef) {
        let mut st = self.0.st.lock();
        if let Some(pos) = st.names.iter().position(|n| Arc::ptr_eq(n, node)) {
            st.names.swap(0, pos);
            self.sync(&st);
        }
    }

    /// Where the holder saw the inode last: under held directory `parent` as `name`.
    pub fn set_location(&self, parent: Option<&Held>, name: &[u8]) {
        if self.0.root {
            return;
        }
        let mut st = self.0.st.lock();
        // Usually unchanged: then nothing is written (no reference count on the parent is
        // touched, a shared cache line on the hit path).
        let same_parent = match (&st.parent, parent) {
            (Some(w), Some(p)) => std::ptr::eq(w.as_ptr(), Arc::as_ptr(&p.0)),
            (None, None) => true,
            _ => false,
        };
        if !same_parent {
            st.parent = parent.map(|p| Arc::downgrade(&p.0));
        }
        if st.name != name {
            st.name = name.to_vec();
        }
    }

    /// Open handles that may write.
    pub fn writers(&self) -> u32 {
        self.0.writers.load(Ordering::Acquire)
    }

    /// Whether a writer has the file open: the holder must not keep attributes (a shared
    /// mapping changes mtime/ctime without telling anyone).
    pub fn has_writers(&self) -> bool {
        self.writers() > 0
    }

    /// Open handles of any mode.
    pub fn opens(&self) -> u32 {
        self.0.opens.load(Ordering::Acquire)
    }

    /// Whether the attributes may have changed through another name since the last reply.
    pub fn is_stale(&self) -> bool {
        self.0.stale.load(Ordering::Acquire)
    }

    /// A directory's last attributes (see [`Cache::attr_for_reply`]).
    pub fn dir_attr(&self) -> Option<Attr> {
        self.0.st.lock().dir_attr
    }

    /// Whether `a` and `b` are the same held inode.
    pub fn same(a: &Held, b: &Held) -> bool {
        Arc::ptr_eq(&a.0, &b.0)
    }
}

/// The xattr-absence memo: `(dev, ino)` -> (memo generation when learned, bits).
pub(crate) struct XattrMemo {
    gen: AtomicU64,
    /// Per `(dev, ino)`: the generation, the bits known absent, and the [`Attr::birth`] of
    /// the file they were learnt of (a file that reused the number is another).
    map: papaya::HashMap<(u64, u64), (u64, u8, u32)>,
}

impl Default for XattrMemo {
    fn default() -> Self {
        XattrMemo {
            gen: AtomicU64::new(1),
            map: papaya::HashMap::new(),
        }
    }
}

impl XattrMemo {
    /// Forget everything (O(1): entries of older generations do not count).
    pub(crate) fn clear(&self) {
        self.gen.fetch_add(1, Ordering::AcqRel);
    }
}

/// Most inodes the memo remembers before it starts over.
const MEMO_MAX: usize = 1 << 20;

impl Cache {
    /// Hand out `node` (attributes `attr`) to a holder: pinned and kept coherent until the
    /// returned [`Held`] (and every clone) is dropped. Its location is `parent`/`node`'s name
    /// (see [`Held::set_location`]).
    pub fn hold(&self, node: &NodeRef, attr: &Attr, parent: Option<&Held>) -> Held {
        node.pin();
        Held(Arc::new(HeldInner {
            key: (attr.dev, attr.ino),
            root: false,
            preferred: ArcSwap::new(node.clone()),
            st: Mutex::new(HeldState {
                names: vec![node.clone()],
                parent: parent.map(|p| Arc::downgrade(&p.0)),
                name: node.name(),
                dir_attr: attr.is_dir().then_some(*attr),
                released: false,
            }),
            stale: AtomicBool::new(false),
            writers: AtomicU32::new(0),
            opens: AtomicU32::new(0),
        }))
    }

    /// Hold the root (never found again by name: it is always [`Cache::root`]).
    pub fn hold_root(&self) -> Held {
        let root = self.root();
        let key = root
            .cached_attr()
            .or_else(|| self.getattr(&root).ok())
            .map(|a| (a.dev, a.ino))
            .unwrap_or((u64::MAX, u64::MAX));
        root.pin();
        Held(Arc::new(HeldInner {
            key,
            root: true,
            preferred: ArcSwap::new(root.clone()),
            st: Mutex::new(HeldState {
                names: vec![root],
                parent: None,
                name: Vec::new(),
                dir_attr: None,
                released: false,
            }),
            stale: AtomicBool::new(false),
            writers: AtomicU32::new(0),
            opens: AtomicU32::new(0),
        }))
    }

    /// Give a held node back (the holder's last reference went): its names are unpinned
    /// now, even if a clone is still in use somewhere (a request in flight); dropping the
    /// last clone without calling this releases it too.
    pub fn release(&self, held: &Held) {
        let mut st = held.0.st.lock();
        if !st.released {
            st.released = true;
            for n in &st.names {
                n.unpin();
            }
        }
    }

    /// Whether `key` (a held inode's `(dev, ino)`) is a provisional identity of the root
    /// file system's backend ([`Backend::provisional`](crate::Backend::provisional)).
    pub fn provisional(&self, key: (u64, u64)) -> bool {
        self.root_sb.backend.provisional(key.0, key.1)
    }

    /// The live dentry of a held inode. When the core dropped the one the holder knows (an
    /// outside change invalidated it, or it was evicted before the holder pinned it), find the
    /// name again where the holder last saw it (from the held parent, itself found again the
    /// same way) and keep the dentry found if it is still the same inode. ESTALE when the
    /// held parent is gone; the dead dentry when the name is gone or names another inode.
    /// A provisional identity ([`Cache::provisional`]) is the object found at its name
    /// whatever its number, once the backend has replaced it.
    ///
    /// A dentry found again that dies before it is handed back (a change applied while its
    /// attributes were asked: the `Overflow` of a reconnection kills every dentry, and the
    /// backend may hold the question until the new connection is installed) is no answer
    /// about the name: it is found again, from the live tree. Handing it back made the
    /// holder's next call on it fail with ENOENT although the file was there (a `stat`
    /// straddling a reintegration).
    pub fn held_node(&self, held: &Held) -> Result<NodeRef> {
        let mut tries = 0;
        loop {
            let raced = Cell::new(false);
            let n = self.held_node_depth(held, 0, &raced)?;
            if !raced.get() || !n.is_dead() || tries >= RACE_RETRIES {
                return Ok(n);
            }
            tries += 1;
        }
    }

    /// The live dentry of `held` and its attributes for a reply ([`Cache::held_node`] then
    /// [`Cache::attr_for_reply`]), as one answer. A dentry that was live when it was found
    /// and dies before its attributes are read (a change applied in between: the `Overflow`
    /// of a reconnection kills every dentry) is no answer about the name: the inode is found
    /// again and asked again (at most [`RACE_RETRIES`] times). Two separate calls answered
    /// ENOENT for a file that exists in that window (a held directory: "removed", nlink 0).
    /// On error the dentry is returned too (the holder may answer from it).
    pub fn held_attr(&self, held: &Held) -> (NodeRef, Result<Attr>) {
        let mut tries = 0;
        loop {
            let node = match self.held_node(held) {
                Ok(n) => n,
                // The backend's own failure (EIO, ETIMEDOUT...), not the dead dentry's ENOENT.
                Err(e @ Error::Os(_)) => return (held.node(), Err(e)),
                Err(_) => held.node(),
            };
            let live = !node.is_dead();
            #[cfg(test)]
            between_hook::run();
            let r = self.attr_for_reply(held, &node);
            if r.is_err() && live && node.is_dead() && tries < RACE_RETRIES {
                tries += 1;
                continue;
            }
            // Another file at the name (replaced in the backend, the change not applied to
            // this dentry yet): not this inode's attributes.
            let other = matches!(&r, Ok(a) if !held.0.root
                && (a.dev, a.ino) != held.key()
                && !self.provisional(held.key()));
            if other || matches!(r, Err(Error::NotFound | Error::Stale)) {
                // The name found is gone or names another file by now (removed or replaced
                // in the backend): a hard-linked inode is still reachable through its other
                // names, as in `on_held` (torture seed 7: a file linked through the mount,
                // its preferred name replaced in SRC, answered ENOENT through the other).
                if let Some(found) = self.other_name_attr(held, &node) {
                    return found;
                }
            }
            return (node, r);
        }
    }

    /// The first other live name of `held` (not `tried`) that still names its inode, with
    /// its attributes for a reply; it is preferred from then on.
    fn other_name_attr(&self, held: &Held, tried: &NodeRef) -> Option<(NodeRef, Result<Attr>)> {
        if held.0.root {
            return None;
        }
        for a in held.names() {
            if Arc::ptr_eq(&a, tried) || a.is_dead() {
                continue;
            }
            match self.attr_for_reply(held, &a) {
                Ok(at) if (at.dev, at.ino) == held.key() => {
                    held.prefer(&a);
                    return Some((a, Ok(at)));
                }
                _ => continue,
            }
        }
        None
    }

    /// One resolution of [`Cache::held_node`]; `raced` is set when a dentry it looked in or
    /// found died meanwhile (the dead `n` is returned: the caller resolves again).
    fn held_node_depth(&self, held: &Held, depth: u32, raced: &Cell<bool>) -> Result<NodeRef> {
        let n = held.node();
        // A dentry still carrying a provisional number its backend has since replaced (an
        // object made while disconnected, reintegrated: `Backend::provisional`) is found
        // again by its name, as a dropped one is.
        let superseded = || n.attr.ino() == held.key().1 && self.provisional(held.key());
        if !n.is_dead() && !n.is_evicted() && !superseded() {
            return Ok(n);
        }
        if held.0.root {
            let r = self.root();
            held.add_name(&r, true);
            return Ok(r);
        }
        let (parent, name) = {
            let st = held.0.st.lock();
            (st.parent.clone(), st.name.clone())
        };
        let Some(parent) = parent else {
            return Ok(n);
        };
        if depth > MAX_DEPTH {
            return Ok(n);
        }
        let parent = Held(parent.upgrade().ok_or(Error::Stale)?);
        let p = self.held_node_depth(&parent, depth + 1, raced)?;
        let c = self.kernel_checked(Cred::root());
        match self.lookup_child(&c, &p, &name) {
            Ok(fresh) if matches!(fresh.kind(), NodeKind::Positive(_)) => {
                let same = match self.getattr(&fresh) {
                    // The same number with another type is a new file that reused it.
                    Ok(a) if (a.dev, a.ino) == held.key() => fresh.kind() == n.kind(),
                    // A provisional identity (made up by the backend, e.g. while
                    // disconnected) is the object now at its name, with its real number.
                    Ok(_) => self.provisional(held.key()) && fresh.kind() == n.kind(),
                    Err(_) => false,
                };
                if fresh.is_dead() {
                    // Killed while its attributes were asked: no answer (see `held_node`).
                    raced.set(true);
                    return Ok(n);
                }
                if same {
                    held.add_name(&fresh, true);
                    return Ok(fresh);
                }
                Ok(n)
            }
            // The directory died before the name was looked up in it.
            Err(Error::NotFound | Error::Stale) if p.is_dead() => {
                raced.set(true);
                Ok(n)
            }
            // The backend could not answer (a remote server unreachable: EIO): that is the
            // answer, not the dead dentry (ENOENT) after retries that each wait for the
            // backend again (issue 11: a cached file's read took 33 s and failed ENOENT).
            // Only failures (`Os`: EIO, ETIMEDOUT, ENOMEM...): a semantic answer about the name
            // (ENOTDIR: its directory replaced by a file) still leaves the dead dentry's answer.
            Err(e @ Error::Os(_)) => Err(e),
            _ => Ok(n),
        }
    }

    /// Run `f` on the live dentry of `held`. If it fails because the dentry died meanwhile
    /// (an outside change applied concurrently), find it again and retry once; if it fails
    /// with ENOENT or ESTALE, try the other names (a hard link removed or replaced in the
    /// backend stays in the core until the change feed reports it, and the file must stay
    /// reachable through its remaining names). A name that worked is preferred from then on.
    pub fn on_held<T>(&self, held: &Held, f: impl Fn(&NodeRef) -> Result<T>) -> Result<T> {
        let n = self.held_node(held)?;
        let (n, r) = match f(&n) {
            Err(Error::NotFound | Error::Stale) if n.is_dead() => {
                let n = self.held_node(held)?;
                let r = f(&n);
                (n, r)
            }
            r => (n, r),
        };
        match r {
            Err(e @ (Error::NotFound | Error::Stale)) => {
                for a in held.names() {
                    if Arc::ptr_eq(&a, &n) || a.is_dead() {
                        continue;
                    }
                    if let Ok(v) = f(&a) {
                        held.prefer(&a);
                        return Ok(v);
                    }
                }
                Err(e)
            }
            r => r,
        }
    }

    /// Whether dentry `node` still names inode `key` in the backend (the core may not have
    /// heard yet that the name was removed or replaced there). Only an identity check of the
    /// name (a lookup): nothing is served from it. A holder asks this before it takes a new
    /// name of a key it holds for a hard link of the held inode: the number may have been
    /// reused by a new file after the old one was removed.
    pub fn names_inode(&self, node: &NodeRef, key: (u64, u64)) -> bool {
        self.names_file(node, key, 0)
    }

    /// [`Cache::names_inode`], and the file there has birth `birth` ([`Attr::same_birth`]:
    /// a new file that reused the number since is another file).
    pub fn names_file(&self, node: &NodeRef, key: (u64, u64), birth: u32) -> bool {
        if node.is_dead() {
            return false;
        }
        let Some(parent) = node.parent() else {
            return false;
        };
        let Ok(dir) = self.path_of(&parent) else {
            return false;
        };
        let name = node.name();
        match self
            .stats
            .backend
            .lookup
            .time(|| node.sb.backend.lookup(&dir, &name))
        {
            Ok(a) => (a.dev, a.ino) == key && Attr::same_birth(a.birth, birth),
            Err(_) => false,
        }
    }

    /// Attributes of a name about to be handed out (an entry reply): hard-linked files are
    /// asked fresh from the backend (another name may have changed nlink/ctime unseen).
    pub fn attr_of_name(&self, node: &NodeRef) -> Result<Attr> {
        self.attr_fresh(node, false)
    }

    fn attr_fresh(&self, node: &NodeRef, force_fresh: bool) -> Result<Attr> {
        if force_fresh {
            self.forget_attr_only(node);
        }
        let a = self.getattr(node)?;
        if !force_fresh && a.nlink > 1 && !a.is_dir() {
            self.forget_attr_only(node);
            return self.getattr(node);
        }
        Ok(a)
    }

    /// Drop `node`'s cached attributes and its hard links', without counting it as a change
    /// (the xattr memo stays).
    fn forget_attr_only(&self, node: &NodeRef) {
        node.set_attr(None);
        self.forget_link_attrs(node);
    }

    /// Attributes of held `node` (a name of `held`) for a reply: fresh from the backend when
    /// the core's copy may be behind (changed through another name, open handles, hard
    /// links); a directory's are remembered for [`Held::dir_attr`].
    pub fn attr_for_reply(&self, held: &Held, node: &NodeRef) -> Result<Attr> {
        // Read before writing: the flag is on a line every request for this inode reads.
        let stale =
            held.0.stale.load(Ordering::Acquire) && held.0.stale.swap(false, Ordering::AcqRel);
        let fresh = stale || held.opens() > 0 || held.writers() > 0;
        let r = self.attr_fresh(node, fresh);
        if let Ok(a) = &r {
            if a.is_dir() && (a.dev, a.ino) == held.key() {
                held.0.st.lock().dir_attr = Some(*a);
            }
        }
        r
    }

    /// The attributes of `held` (an inode of the holder) may have changed through `node` or
    /// another of its names (a mutation through the front end): forget them on every name,
    /// and ask the backend before the next reply.
    pub fn held_changed(&self, held: &Held) {
        held.0.stale.store(true, Ordering::Release);
        for n in held.names() {
            self.forget_attr(&n);
        }
    }

    /// An open handle of `held` (`writable`: it may write).
    pub fn note_open(&self, held: &Held, writable: bool) {
        held.0.opens.fetch_add(1, Ordering::AcqRel);
        if writable {
            held.0.writers.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Undo [`Cache::note_open`] at release of the handle. The attributes cached for every
    /// name of `held` are forgotten first (the handle's reads moved the atime, its writes the
    /// size and times, none of them through the core), and only then do the counts drop: a
    /// reply made while they were up asked the backend, and one made after finds nothing
    /// cached from before the close. (The front end forgot them after the counts dropped: a
    /// GETATTR answered in between, racing the RELEASE, got the attributes cached when the
    /// file was created, and `stat` right after write+close showed size 0 — `tools.rs`'s
    /// mkstemp loop under load, `held.rs::a_close_leaves_no_attributes_from_before_it`.)
    pub fn note_close(&self, held: &Held, writable: bool) {
        for n in held.names() {
            self.forget_attr(&n);
        }
        let dec = |a: &AtomicU32| {
            let _ = a.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| v.checked_sub(1));
        };
        dec(&held.0.opens);
        if writable {
            dec(&held.0.writers);
        }
    }

    /// The xattr memo's generation: read it before asking the backend, pass it to
    /// [`Cache::note_xattr_absent`].
    pub fn xattr_memo_gen(&self) -> u64 {
        self.xattr_memo.gen.load(Ordering::Acquire)
    }

    /// Whether inode `key`, the file of birth `birth` ([`Attr::birth`]), is known to have no
    /// value for the attribute(s) `bit` (the caller numbers the names it memoizes: one bit
    /// each). A file that reused a removed one's inode number is not answered for by what
    /// was learnt of that one (its ACL may deny what the old file's absence allowed). A birth
    /// of 0 is unknown and matches any ([`Attr::same_birth`]: a backend or a nodeid without
    /// birth times, where the inode number is all there is). Never in bypass mode (nothing
    /// is remembered there).
    pub fn xattr_known_absent(&self, key: (u64, u64), birth: u32, bit: u8) -> bool {
        if !self.trusts_cache() {
            return false;
        }
        let g = self.xattr_memo_gen();
        let m = self.xattr_memo.map.pin();
        m.get(&key)
            .is_some_and(|(eg, b, eb)| *eg == g && Attr::same_birth(*eb, birth) && b & bit != 0)
    }

    /// Remember that inode `key`, the file of birth `birth`, has no value for `bit`, learned
    /// from a backend call made after generation `gen` was read; ignored if anything changed
    /// since (the answer may be outdated).
    pub fn note_xattr_absent(&self, key: (u64, u64), birth: u32, bit: u8, gen: u64) {
        if self.xattr_memo_gen() != gen {
            return;
        }
        let m = self.xattr_memo.map.pin();
        if m.len() >= MEMO_MAX {
            m.clear();
        }
        let bits = match m.get(&key) {
            Some((eg, b, eb)) if *eg == gen && Attr::same_birth(*eb, birth) => b | bit,
            _ => bit,
        };
        m.insert(key, (gen, bits, birth));
        // A change between the check and the insert bumped the generation: the entry is
        // already invalid (it carries `gen`).
    }

    /// Forget every remembered xattr absence (something changed that the core could not
    /// see as an attribute change).
    pub fn forget_xattr_memo(&self) {
        self.xattr_memo.clear();
    }
}

/// Test-only: a function [`Cache::held_attr`] runs between finding the dentry and reading its
/// attributes, on the calling thread (race_tests.rs puts a change there).
#[cfg(test)]
pub(crate) mod between_hook {
    use std::cell::RefCell;

    type Hook = Box<dyn FnOnce()>;

    thread_local! {
        static HOOK: RefCell<Option<Hook>> = const { RefCell::new(None) };
    }

    /// Run `f` once, at the next [`super::Cache::held_attr`] of this thread.
    pub(crate) fn set(f: impl FnOnce() + 'static) {
        HOOK.with(|h| *h.borrow_mut() = Some(Box::new(f)));
    }

    pub(super) fn run() {
        if let Some(f) = HOOK.with(|h| h.borrow_mut().take()) {
            f();
        }
    }
}
