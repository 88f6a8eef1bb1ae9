//! The cache proper: public API here, machinery in the submodules, one idea per file.
//!
//! - [`dentry`]: the nodes, their children maps and attribute seqlock;
//! - [`path`]: path syntax (validation, splitting, lexical normalization);
//! - [`dlht`]: signatures and the direct-lookup hash table (SOSP'15 §3.1);
//! - [`pcc`]: the per-credential prefix-check cache and credential interning (§3.1);
//! - [`walk`]: the fast path (one DLHT + one PCC probe), the slow path (component at a time),
//!   publishing slow-path results, and the per-component backend fills;
//! - [`batch`]: on a slow-path miss, the rest of the path in one `Backend::walk`;
//! - [`invalidate`]: invalidation windows, subtree version bumps, kills (§3.2);
//! - [`evict`]: counting dentries, CLOCK eviction of leaves, lazy DLHT sweeps;
//! - [`listing`]: readdir and directory completeness (§5.1);
//! - [`negative`]: negative and deep negative entries (§5.2);
//! - [`outside`]: changes made behind the cache's back, and revival of moved directories;
//! - [`hardlinks`]: attributes shared by the cached names of one inode;
//! - [`mounts`]: mounts, bind mounts and namespaces (§4.3);
//! - [`mutate`]: mutations that keep the cache coherent;
//! - [`persist`]: the snapshot file of a warm restart (listings, completeness, negatives).
//!
//! The invariants are written down in `docs/core.md`, which maps each paper section to its file.
//!
//! # Lock order
//!
//! A lock may be taken while holding the locks above it in this list (indentation: nested
//! inside), never the other way round. Locks at the same level are never held together.
//!
//! ```text
//! Cache::tree_lock        RwLock<()>: mutations shared, rename exclusive (mutate.rs);
//!                           shared by `by_path`'s fallback (invalidate.rs), holding nothing
//!   Cache::lru            Mutex: account_new; evict (try_lock) (evict.rs)
//!     Dentry::inner       RwLock, per dentry (made at first use: `InnerCell`). Two at once
//!                           only in rename, lower dentry id first; otherwise one at a time
//!                           (a child's is released before its parent's is taken:
//!                           insert_child, bump_subtree, kill)
//!       Cache::hardlinks  Mutex: new_dentry -> note_links under a parent's inner (hardlinks.rs)
//!       Cache::detached   Mutex: revive under the parent's inner (outside.rs)
//!         AttrCell        per-dentry seqlock: writers spin for 12 stores, nothing inside
//!                           (set_attr under hardlinks, detached, inner)
//!   Cache::namespaces     Mutex: bump_subtree (following mounts), sweep_dlht, stats
//!     Namespace::mounts   RwLock: mount tables (mounts.rs)
//! Cache::creds_new        Mutex: creating an interned credential, evicting idle ones for a
//!                           PCC that grows (pcc.rs, from a walk's publish: no lock held);
//!                           nothing inside
//!                           (`Cache::creds` itself is a papaya map, read lock-free)
//! Cache::pending          Mutex: one map operation, nothing else held (persist.rs)
//! Held::names             Mutex per held inode (held.rs): a leaf, taken after none of the
//!                           above but `Dentry::inner` is never taken while holding it
//! ```
//!
//! Not locks, never waited on by readers: `Dentry::link` (arc-swap), the DLHT (papaya,
//! epoch guards), PCC slots, versions, flags, pins and the invalidation counters (atomics).
//! `Cache::rename_seq` is a seqcount: its write side is taken only under `tree_lock.write()`
//! and readers never wait on it (they retry, then take `tree_lock` shared).
//!
//! **Backend calls** are made holding only `tree_lock` (a mutation holds it shared for its
//! whole duration, a rename exclusively; `by_path`'s fallback holds it shared for one call)
//! and, in a rename, the write side of `rename_seq`. No other lock above is ever held across
//! a backend call, and no path-based backend call (`by_path`) is made while `rename_seq` is
//! odd in the same thread. Dropping a dentry takes no lock (`Drop for Dentry` uses
//! `get_mut`), so dropping the last reference under any of these locks is safe.

mod batch;
mod bypass;
mod dentry;
mod dlht;
mod evict;
mod hardlinks;
mod held;
mod inspect;
mod invalidate;
mod listing;
mod mounts;
mod mutate;
mod negative;
mod outside;
mod path;
mod pcc;
mod persist;
mod stale;
mod walk;

#[cfg(test)]
mod collision_tests;
#[cfg(test)]
mod inval_tests;
#[cfg(test)]
mod race_tests;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::{Mutex, RwLock};
use siphasher::sip128::SipHasher13;

pub use dentry::Dentry;
use hardlinks::HardLinks;
pub use held::Held;
pub(crate) use mounts::Mount;
pub use mounts::{MountOptions, MountSource, Namespace};
pub(crate) use pcc::CredState;
pub use pcc::Creds;
pub use persist::{LoadReport, Persist, PersistError, SaveReport};

use crate::stats::Stats;
use crate::{
    AccessPolicy, Attr, Backend, Change, Config, Cred, DirEntry, Error, FileType, LookupFlags,
    PosixPolicy, RenameMode, Result, SetAttr, StatsSnapshot, X_OK,
};

/// Shared reference to a dentry. Front ends may hold these as long as they like; a dentry that
/// was unlinked, replaced or evicted stays valid as an object but reports [`Dentry::is_dead`].
pub type NodeRef = Arc<Dentry>;

/// What a dentry stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    Positive(FileType),
    Negative(Error),
}

impl Dentry {
    /// Unique id of this dentry for the lifetime of the cache (never reused).
    pub fn id(&self) -> u64 {
        self.id
    }
    /// The file type, or `None` for a negative entry.
    pub fn file_type(&self) -> Option<FileType> {
        match self.kind() {
            NodeKind::Positive(t) => Some(t),
            NodeKind::Negative(_) => None,
        }
    }
    /// The attributes the cache holds, if any (entries learned from readdir have none).
    pub fn cached_attr(&self) -> Option<Attr> {
        self.attr_copy()
    }
    /// The current name (changes on rename).
    pub fn name(&self) -> Vec<u8> {
        self.link().name.to_vec()
    }
    /// The current parent; `None` for the root of a file system or a dead dentry.
    pub fn parent(&self) -> Option<NodeRef> {
        self.parent_ref()
    }
    /// Whether the dentry was unlinked, replaced, or evicted from the tree.
    pub fn is_dead(&self) -> bool {
        self.has(dentry::DEAD)
    }
    /// Whether the dentry was taken out of the tree to reclaim memory (its name may still
    /// exist: look it up again from its parent). Pinned dentries are never evicted.
    pub fn is_evicted(&self) -> bool {
        self.has(dentry::EVICTED)
    }
    /// Whether this directory's listing is complete in the cache.
    pub fn is_complete(&self) -> bool {
        self.has(dentry::COMPLETE)
    }
    /// Whether children were cached under this directory (by lookups or a listing).
    pub fn has_children(&self) -> bool {
        self.has(dentry::HAS_CHILDREN)
    }
    /// The version counter (changes whenever this entry or an ancestor is invalidated).
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }
    /// Keep this dentry from being evicted (e.g. while a kernel holds its inode).
    pub fn pin(&self) {
        self.pins.fetch_add(1, Ordering::AcqRel);
    }
    /// Undo one [`Dentry::pin`].
    pub fn unpin(&self) {
        let _ = self
            .pins
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| p.checked_sub(1));
    }
}

/// A file system instance: one backend.
pub(crate) struct Super {
    pub(crate) backend: Arc<dyn Backend>,
}

/// An open directory: the start of relative lookups, like a working directory or an `O_PATH`
/// descriptor. It keeps access to its directory after an ancestor's permissions change.
pub struct DirHandle {
    pub(crate) ns: Arc<Namespace>,
    pub(crate) mnt: Arc<Mount>,
    pub(crate) node: NodeRef,
    /// Version of `node` when the handle was opened; while unchanged, the handle's lexical
    /// path still names it and the opener's prefix checks still hold.
    pub(crate) ver: u64,
    /// Lexical path from the namespace root (no leading slash), if known exactly (the path
    /// that opened it went through no symlink).
    pub(crate) lex: Option<Box<[u8]>>,
    /// Signature state after hashing `lex` and a separating slash.
    pub(crate) hasher: SipHasher13,
}

/// A handle pins its directory: eviction must not take the dentry out of the tree under it
/// (an evicted dentry is dead, and relative lookups from it would fail with ENOENT).
impl Drop for DirHandle {
    fn drop(&mut self) {
        self.node.unpin();
    }
}

impl DirHandle {
    pub fn node(&self) -> &NodeRef {
        &self.node
    }
    pub fn namespace(&self) -> &Arc<Namespace> {
        &self.ns
    }
}

/// Where a relative path starts. Absolute paths always start at the namespace root.
#[derive(Clone, Copy)]
pub enum At<'a> {
    /// The root of the cache's initial namespace.
    Root,
    /// An open directory (and its namespace).
    Dir(&'a DirHandle),
}

/// One entry the cache dropped because of a change learned from outside, for front ends that
/// must tell their own caches (the FUSE layer turns these into kernel notifications).
#[derive(Clone)]
pub struct Invalidation {
    /// The directory whose entry `name` changed; `None` means "everything may have changed".
    pub parent: Option<NodeRef>,
    pub name: Vec<u8>,
    /// The dentry that was at `parent/name`, if one was cached.
    pub node: Option<NodeRef>,
    /// Only the attributes of `node` changed; the name still refers to it.
    pub attr_only: bool,
}

/// The directory cache.
pub struct Cache {
    pub(crate) config: Config,
    pub(crate) policy: Arc<dyn AccessPolicy>,
    pub(crate) root_sb: Arc<Super>,
    pub(crate) ns: Arc<Namespace>,
    pub(crate) namespaces: Mutex<Vec<Weak<Namespace>>>,
    /// Source of dentry versions and DLHT stamps: unique, increasing, never 0.
    pub(crate) seq: AtomicU64,
    pub(crate) next_id: AtomicU64,
    /// Invalidations started / finished (SOSP'15's global invalidation counter, split in two
    /// so that overlapping invalidations are detected).
    pub(crate) inval_start: AtomicU64,
    pub(crate) inval_end: AtomicU64,
    /// Renames take this exclusively, other mutations shared: a mutation's backend paths
    /// cannot be changed under it by a rename of an ancestor. Lookups take it (shared) only
    /// as `by_path`'s fallback, after renames raced their backend call a few times.
    pub(crate) tree_lock: RwLock<()>,
    /// Rename sequence count (Linux's `rename_lock` seqcount): odd while a rename through the
    /// cache is changing backend paths (from before the backend renames until the links are
    /// updated). Changed only under `tree_lock.write()`. See `Cache::by_path`.
    pub(crate) rename_seq: AtomicU64,
    /// Interned credentials: read lock-free on every request; `creds_new` serializes only
    /// the creation of a new entry. Kept (strongly, up to `CREDS_KEPT` unused ones) so that
    /// a front end interning per request neither rebuilds the state nor writes the map.
    pub(crate) creds: papaya::HashMap<(Cred, bool), Arc<CredState>>,
    pub(crate) creds_new: Mutex<()>,
    /// Moves at each new interned credential: `CredState::last_use` (eviction order).
    pub(crate) creds_tick: AtomicU64,
    /// Bytes of all credentials' prefix-check tables (`Config::pcc_budget`, pcc.rs).
    pub(crate) pcc_budget: Arc<pcc::PccBudget>,
    /// Which held inodes have no value for an xattr (see `held.rs`).
    pub(crate) xattr_memo: held::XattrMemo,
    pub(crate) stats: Stats,
    pub(crate) entries: AtomicU64,
    pub(crate) lru: Mutex<VecDeque<Weak<Dentry>>>,
    pub(crate) dlht_inserts: AtomicU64,
    /// Cached non-directories with more than one link, by (dev, ino): their attributes change
    /// together.
    pub(crate) hardlinks: Mutex<HardLinks>,
    /// Directories that vanished from their place behind the cache's back, by (dev, ino), so
    /// that if they turn up elsewhere (an outside rename) the same dentry comes back to life
    /// and whoever held it (a directory handle, a kernel inode) follows the move. Held strongly
    /// (at most 256, oldest dropped first): a handle's dentry keeps only a weak reference to
    /// its parent, and every directory between a moved one and a handle must come back too.
    pub(crate) detached: Mutex<VecDeque<(u64, u64, NodeRef)>>,
    /// Snapshot contents validated at mount, waiting for their directory's first use, by
    /// dentry id (persist.rs).
    pub(crate) pending: persist::PendingMap,
}

impl Cache {
    /// A cache over `backend` with the POSIX mode-bit policy.
    pub fn new(backend: Arc<dyn Backend>, config: Config) -> Result<Arc<Cache>> {
        Cache::with_policy(backend, config, Arc::new(PosixPolicy))
    }

    /// A cache with another access policy.
    pub fn with_policy(
        backend: Arc<dyn Backend>,
        config: Config,
        policy: Arc<dyn AccessPolicy>,
    ) -> Result<Arc<Cache>> {
        let attr = backend.getattr(b"")?;
        if !attr.is_dir() {
            return Err(Error::NotDir);
        }
        let sb = Arc::new(Super { backend });
        let root = Arc::new(Dentry::new(
            1,
            sb.clone(),
            NodeKind::Positive(FileType::Directory),
            None,
            b"",
            1,
            Some(attr),
        ));
        let mount = Arc::new(Mount {
            root,
            parent: None,
            opts: MountOptions::default(),
        });
        let ns = Arc::new(Namespace::new(mount, Default::default()));
        let pcc_budget = pcc::PccBudget::new(config.pcc_budget);
        Ok(Arc::new(Cache {
            config,
            policy,
            root_sb: sb,
            namespaces: Mutex::new(vec![Arc::downgrade(&ns)]),
            ns,
            seq: AtomicU64::new(2),
            next_id: AtomicU64::new(2),
            inval_start: AtomicU64::new(0),
            inval_end: AtomicU64::new(0),
            tree_lock: RwLock::new(()),
            rename_seq: AtomicU64::new(0),
            // Batches of one: an evicted credential's tables are freed (and their budget
            // given back) as soon as no reader can see them, not 32 evictions later.
            creds: papaya::HashMap::builder()
                .collector(seize::Collector::new().batch_size(1))
                .build(),
            creds_new: Mutex::new(()),
            creds_tick: AtomicU64::new(0),
            pcc_budget,
            xattr_memo: Default::default(),
            stats: Stats::default(),
            entries: AtomicU64::new(1),
            lru: Mutex::new(VecDeque::new()),
            dlht_inserts: AtomicU64::new(0),
            hardlinks: Mutex::new(Default::default()),
            detached: Mutex::new(VecDeque::new()),
            pending: Default::default(),
        }))
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The backend of the root file system.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.root_sb.backend
    }

    /// The root dentry of the root file system.
    pub fn root(&self) -> NodeRef {
        self.ns.root.root.clone()
    }

    /// The initial namespace.
    pub fn namespace(&self) -> &Arc<Namespace> {
        &self.ns
    }

    /// Interned credentials checked by the cache's access policy.
    pub fn credentials(&self, cred: Cred) -> Creds {
        self.intern(cred, true)
    }

    /// Credentials for callers whose permissions were already checked (the kernel, with FUSE
    /// `default_permissions`): the cache skips its own policy checks but still passes `cred`
    /// to the backend so files are created as the caller.
    pub fn kernel_checked(&self, cred: Cred) -> Creds {
        self.intern(cred, false)
    }

    // ------------------------------------------------------------------------------------
    // Path API: what a library user or a server calls.

    /// Resolve `path` to a dentry. Errors as path_resolution(7): ENOENT (also for an empty
    /// path), ENOTDIR, EACCES, ELOOP, ENAMETOOLONG, EINVAL (embedded NUL).
    pub fn lookup(
        &self,
        c: &Creds,
        at: At<'_>,
        path: &[u8],
        flags: LookupFlags,
    ) -> Result<NodeRef> {
        self.resolve(c, at, path, flags, |n, _| n.clone())
    }

    /// stat (`flags.follow`) or lstat.
    pub fn stat(&self, c: &Creds, at: At<'_>, path: &[u8], flags: LookupFlags) -> Result<Attr> {
        match self.resolve(
            c,
            at,
            path,
            flags,
            // Inlined: see `AttrCell::load_words`.
            #[inline(always)]
            |n, _| n.attr_copy(),
        ) {
            Ok(Some(a)) => Ok(a),
            Ok(None) => {
                let n = self.lookup(c, at, path, flags)?;
                self.attr_of(&n)
            }
            Err(e) => Err(e),
        }
    }

    /// access(2) (follows symlinks): `mask` of R_OK/W_OK/X_OK, 0 for existence.
    pub fn access(&self, c: &Creds, at: At<'_>, path: &[u8], mask: u32) -> Result<()> {
        let (node, opts) = self.resolve(c, at, path, LookupFlags::FOLLOW, |n, o| (n.clone(), o))?;
        if mask == 0 {
            return Ok(());
        }
        let attr = self.attr_of(&node)?;
        if mask & crate::W_OK != 0 && opts.read_only {
            return Err(Error::ReadOnly);
        }
        if mask & X_OK != 0 && opts.noexec && !attr.is_dir() {
            return Err(Error::Access);
        }
        if c.0.check {
            self.policy.permission(&c.0.cred, &attr, mask)?;
        }
        Ok(())
    }

    /// Open a directory handle (needs search permission on the path to it).
    pub fn opendir(&self, c: &Creds, at: At<'_>, path: &[u8]) -> Result<DirHandle> {
        self.open_dir_handle(c, at, path)
    }

    /// A handle on the root of a namespace.
    pub fn root_handle(&self, ns: &Arc<Namespace>) -> DirHandle {
        let node = ns.root.root.clone();
        node.pin();
        DirHandle {
            ns: ns.clone(),
            mnt: ns.root.clone(),
            ver: node.version(),
            node,
            lex: Some(Box::new([])),
            hasher: ns.base,
        }
    }

    /// List a directory (needs read permission on it). No `.` or `..`.
    pub fn readdir(&self, c: &Creds, at: At<'_>, path: &[u8]) -> Result<Vec<DirEntry>> {
        let node = self.lookup(c, at, path, LookupFlags::FOLLOW)?;
        self.readdir_node(c, &node, false)
    }

    pub fn readlink(&self, c: &Creds, at: At<'_>, path: &[u8]) -> Result<Vec<u8>> {
        let node = self.lookup(c, at, path, LookupFlags::NOFOLLOW)?;
        self.readlink_node(&node)
    }

    pub fn mkdir(&self, c: &Creds, at: At<'_>, path: &[u8], mode: u32) -> Result<Attr> {
        let (parent, name) = self.parent_for_create(c, at, path, Error::Exists)?;
        let n = self.mkdir_at(c, &parent, name, mode)?;
        self.attr_of(&n)
    }

    /// Create a non-directory (`mode` holds the type bits; plain permission bits mean a
    /// regular file).
    pub fn mknod(&self, c: &Creds, at: At<'_>, path: &[u8], mode: u32, rdev: u64) -> Result<Attr> {
        if path::wants_dir(path) {
            // mknod("x/") on a missing x: Linux says ENOENT... unless x exists (EEXIST).
            let (parent, name) = self.parent_for_create(c, at, path, Error::Exists)?;
            let child = self.lookup_child(c, &parent, name)?;
            return Err(match child.kind() {
                NodeKind::Positive(_) => Error::Exists,
                NodeKind::Negative(_) => Error::NotFound,
            });
        }
        let (parent, name) = self.parent_for_create(c, at, path, Error::Exists)?;
        let n = self.mknod_at(c, &parent, name, mode, rdev)?;
        self.attr_of(&n)
    }

    /// Create `path` as a symbolic link to `target`.
    pub fn symlink(&self, c: &Creds, target: &[u8], at: At<'_>, path: &[u8]) -> Result<Attr> {
        // The target string is checked first, as symlinkat's getname does.
        path::check_path(target)?;
        let (parent, name) = self.parent_for_create(c, at, path, Error::Exists)?;
        if path::wants_dir(path) {
            let child = self.lookup_child(c, &parent, name)?;
            return Err(match child.kind() {
                NodeKind::Positive(_) => Error::Exists,
                NodeKind::Negative(_) => Error::NotFound,
            });
        }
        let n = self.symlink_at(c, &parent, name, target)?;
        self.attr_of(&n)
    }

    /// Hard link `new` to `old` (neither followed if a symlink).
    pub fn link(&self, c: &Creds, at: At<'_>, old: &[u8], new: &[u8]) -> Result<Attr> {
        let src = self.lookup(
            c,
            at,
            old,
            LookupFlags {
                follow: false,
                directory: path::wants_dir(old),
            },
        )?;
        let (parent, name) = self.parent_for_create(c, at, new, Error::Exists)?;
        if path::wants_dir(new) {
            let child = self.lookup_child(c, &parent, name)?;
            return Err(match child.kind() {
                NodeKind::Positive(_) => Error::Exists,
                NodeKind::Negative(_) => Error::NotFound,
            });
        }
        let n = self.link_at(c, &src, &parent, name)?;
        self.attr_of(&n)
    }

    pub fn unlink(&self, c: &Creds, at: At<'_>, path: &[u8]) -> Result<()> {
        let (parent, name) = self.parent_for_remove(c, at, path)?;
        match name {
            b"." | b".." => return Err(Error::IsDir),
            _ => {}
        }
        if path::wants_dir(path) {
            let child = self.lookup_child(c, &parent, name)?;
            return Err(match child.kind() {
                NodeKind::Positive(FileType::Directory) => Error::IsDir,
                NodeKind::Positive(_) => Error::NotDir,
                NodeKind::Negative(e) => e,
            });
        }
        self.unlink_at(c, &parent, name)
    }

    pub fn rmdir(&self, c: &Creds, at: At<'_>, path: &[u8]) -> Result<()> {
        let (parent, name) = self.parent_for_remove(c, at, path)?;
        match name {
            b"." => return Err(Error::Invalid),
            b".." => return Err(Error::NotEmpty),
            _ => {}
        }
        self.rmdir_at(c, &parent, name)
    }

    pub fn rename(
        &self,
        c: &Creds,
        at: At<'_>,
        old: &[u8],
        new: &[u8],
        mode: RenameMode,
    ) -> Result<()> {
        let (op, on) = self.parent_for_remove(c, at, old)?;
        let (np, nn) = self.parent_for_remove(c, at, new)?;
        // As do_renameat2: `.`/`..` as the source is EBUSY; as the target, EEXIST under
        // RENAME_NOREPLACE, else EBUSY (both checked in `rename_slashes`).
        let slash = [path::wants_dir(old), path::wants_dir(new)];
        self.rename_slashes(c, &op, on, &np, nn, mode, slash)
    }

    /// chmod / chown / truncate / utimens of `path`.
    pub fn setattr(
        &self,
        c: &Creds,
        at: At<'_>,
        path: &[u8],
        set: &SetAttr,
        flags: LookupFlags,
    ) -> Result<Attr> {
        let (node, opts) = self.resolve(c, at, path, flags, |n, o| (n.clone(), o))?;
        if opts.read_only {
            return Err(Error::ReadOnly);
        }
        self.setattr_node(c, &node, set)
    }

    // ------------------------------------------------------------------------------------
    // Node API: for front ends that walk one component at a time themselves (FUSE).

    /// Look up one component `name` in directory `parent` (no symlink following; `.` and `..`
    /// allowed). Returns negative dentries as errors.
    pub fn lookup_child(&self, c: &Creds, parent: &NodeRef, name: &[u8]) -> Result<NodeRef> {
        let mut missed = false;
        let n = self.child_checked_counted(c, parent, name, &mut missed)?;
        match n.kind() {
            NodeKind::Negative(e) => {
                // A negative answer the backend just gave is a miss, not a hit.
                if self.trusts_cache() && !missed {
                    self.stats.negative_hits.inc();
                }
                Err(e)
            }
            NodeKind::Positive(_) => Ok(n),
        }
    }

    /// Attributes of a dentry, from the cache or the backend. A dentry whose name was removed
    /// or replaced has no attributes to give (ENOENT): its last ones are stale (nlink, ctime),
    /// and a front end holding the file open should ask the open descriptor instead.
    pub fn getattr(&self, node: &NodeRef) -> Result<Attr> {
        if node.is_dead() {
            return Err(Error::NotFound);
        }
        self.attr_of(node)
    }

    /// List directory `node`; `want_attrs` asks for attributes of every entry (readdirplus).
    pub fn readdir_node(
        &self,
        c: &Creds,
        node: &NodeRef,
        want_attrs: bool,
    ) -> Result<Vec<DirEntry>> {
        self.list(c, node, want_attrs)
    }

    pub fn readlink_node(&self, node: &NodeRef) -> Result<Vec<u8>> {
        match node.kind() {
            NodeKind::Positive(FileType::Symlink) => self.link_target(node).map(|t| t.to_vec()),
            NodeKind::Positive(_) => Err(Error::Invalid),
            NodeKind::Negative(e) => Err(e),
        }
    }

    /// The backend path of a dentry (relative to its file system's root).
    pub fn node_path(&self, node: &NodeRef) -> Result<Vec<u8>> {
        self.path_of(node)
    }

    /// The backend serving a dentry's file system.
    pub fn node_backend(&self, node: &NodeRef) -> Arc<dyn Backend> {
        node.sb.backend.clone()
    }

    /// Forget the cached attributes of `node` (after data was written through a descriptor).
    pub fn forget_attr(&self, node: &NodeRef) {
        node.set_attr(None);
        self.forget_link_attrs(node);
        self.xattr_memo.clear();
    }

    // ------------------------------------------------------------------------------------
    // Coherence with changes made behind the cache's back.

    /// Apply a change reported by a backend's change feed (or by anyone who knows the tree
    /// changed). Returns what was dropped, for front ends with caches of their own.
    pub fn apply_change(&self, change: &Change) -> Vec<Invalidation> {
        self.xattr_memo.clear();
        self.root_sb.backend.changed(change);
        self.external_change(change)
    }

    /// Forget everything cached at and below backend path `path` of the root file system,
    /// and the listing of its parent.
    pub fn invalidate(&self, path: &[u8]) -> Vec<Invalidation> {
        self.apply_change(&Change::Entry {
            path: path.to_vec(),
        })
    }

    // ------------------------------------------------------------------------------------
    // Mounts and namespaces.

    /// Mount `source` on directory `path` of namespace `ns`.
    pub fn mount(
        &self,
        ns: &Arc<Namespace>,
        path: &[u8],
        source: MountSource,
        options: MountOptions,
    ) -> Result<()> {
        self.do_mount(ns, path, source, options)
    }

    /// Unmount whatever is mounted on `path` in `ns`.
    pub fn umount(&self, ns: &Arc<Namespace>, path: &[u8]) -> Result<()> {
        self.do_umount(ns, path)
    }

    /// The options of the mount that `path` lies in.
    pub fn mount_options(&self, ns: &Arc<Namespace>, path: &[u8]) -> Result<MountOptions> {
        let h = self.root_handle(ns);
        let root = self.kernel_checked(Cred::root());
        self.resolve(&root, At::Dir(&h), path, LookupFlags::FOLLOW, |_, o| o)
    }

    /// A private copy of `ns`'s mount table with its own direct-lookup table.
    pub fn clone_namespace(&self, ns: &Arc<Namespace>) -> Arc<Namespace> {
        let mounts = ns.mounts.read().clone();
        let new = Arc::new(Namespace::new(ns.root.clone(), mounts));
        let mut all = self.namespaces.lock();
        all.retain(|w| w.strong_count() > 0);
        all.push(Arc::downgrade(&new));
        new
    }

    /// Latency histograms of the backend calls, by kind (lookup, walk, getattr, readdir,
    /// readlink, mutation); each one's count is the number of calls of its kind.
    pub fn backend_latency(&self) -> Vec<(&'static str, crate::stats::HistogramSnapshot)> {
        self.stats
            .backend
            .by_kind()
            .iter()
            .map(|(k, h)| (*k, h.snapshot()))
            .collect()
    }

    /// Counters and sizes.
    pub fn stats(&self) -> StatsSnapshot {
        let mut s = self.stats.snapshot();
        s.entries = self.entries.load(Ordering::Relaxed);
        let mut fast = 0u64;
        for ns in self.namespaces.lock().iter().filter_map(Weak::upgrade) {
            fast += ns.dlht.len() as u64;
        }
        s.fast_entries = fast;
        // Every table, also of credentials evicted from `creds` but still held.
        let pcc = self.pcc_budget.used();
        s.pcc_bytes = pcc as u64;
        // Dentry (with its link) + attr + a children-map slot, and a DLHT entry each.
        let per_dentry = std::mem::size_of::<Dentry>() as u64 + 16 + 128 + 32;
        let per_fast = std::mem::size_of::<dlht::FastEntry>() as u64 + 16 + 16;
        s.bytes = s.entries * per_dentry + fast * per_fast + pcc as u64;
        s
    }
}

#[cfg(test)]
mod size_tests {
    /// Memory per dentry is a target (docs/benchmarks.md): keep the hot structures from
    /// growing unnoticed.
    #[test]
    fn structures_stay_small() {
        // 128 (was 152 with the link inline, 144 with the children's lock made at first use;
        // dentry.rs `dentry_size` says where the last 16 went).
        assert!(std::mem::size_of::<super::Dentry>() <= 128);
        assert!(std::mem::size_of::<super::dentry::Link>() <= 24);
        assert!(std::mem::size_of::<super::dentry::Inner>() <= 8);
        // 24 (was 48, then 32): one stamp is the id and the validity bound, the uncommon
        // parts are filed by stamp (dlht.rs, `FastEntry`); papaya's box of key and entry is
        // 40 (a `u128` key would pad it to 48).
        assert!(std::mem::size_of::<super::dlht::FastEntry>() <= 24);
        assert!(std::mem::size_of::<(super::dlht::Key, super::dlht::FastEntry)>() <= 40);
        assert!(std::mem::size_of::<super::NodeKind>() <= 8);
    }
}
