//! The cache proper. Public API first; the machinery lives in the submodules.
#![allow(unused_variables, dead_code)]

use std::os::fd::OwnedFd;
use std::sync::Arc;

use crate::{
    AccessPolicy, Attr, Backend, Change, Config, Cred, DirEntry, Error, FileType, LookupFlags,
    RenameMode, Result, SetAttr, StatsSnapshot,
};

/// A cached name: a positive entry (a file of some type) or a negative one (a remembered
/// ENOENT, or ENOTDIR under a non-directory).
pub struct Dentry {
    _private: (),
}

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
        todo!()
    }
    pub fn kind(&self) -> NodeKind {
        todo!()
    }
    /// The file type, or `None` for a negative entry.
    pub fn file_type(&self) -> Option<FileType> {
        todo!()
    }
    /// The attributes the cache holds, if any (entries learned from readdir have none).
    pub fn cached_attr(&self) -> Option<Attr> {
        todo!()
    }
    /// The current name (changes on rename).
    pub fn name(&self) -> Vec<u8> {
        todo!()
    }
    /// The current parent; `None` for the root of a file system or a dead dentry.
    pub fn parent(&self) -> Option<NodeRef> {
        todo!()
    }
    /// Whether the dentry was unlinked, replaced, or evicted from the tree.
    pub fn is_dead(&self) -> bool {
        todo!()
    }
    /// Whether this directory's listing is complete in the cache.
    pub fn is_complete(&self) -> bool {
        todo!()
    }
    /// The version counter (changes whenever this entry or an ancestor is invalidated).
    pub fn version(&self) -> u64 {
        todo!()
    }
}

/// Interned credentials with their prefix-check cache. Cheap to clone; equal credentials
/// share one state.
#[derive(Clone)]
pub struct Creds {
    _private: Arc<()>,
}

impl Creds {
    pub fn cred(&self) -> &Cred {
        todo!()
    }
}

/// An open directory: the start of relative lookups, like a working directory or an `O_PATH`
/// descriptor. It keeps access to its directory after an ancestor's permissions change.
pub struct DirHandle {
    _private: (),
}

impl DirHandle {
    pub fn node(&self) -> &NodeRef {
        todo!()
    }
    pub fn namespace(&self) -> &Arc<Namespace> {
        todo!()
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

/// A mount namespace: a mount table and its own direct-lookup table.
pub struct Namespace {
    _private: (),
}

/// Per-mount options (§4.3).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MountOptions {
    /// Mutations fail with EROFS.
    pub read_only: bool,
    /// Set-user-id and set-group-id bits are ignored (reported by [`Cache::mount_options`]).
    pub nosuid: bool,
    /// Files may not be executed: access(X_OK) on non-directories fails with EACCES.
    pub noexec: bool,
}

/// What to mount.
pub enum MountSource {
    /// A new file system served by another backend.
    Backend(Arc<dyn Backend>),
    /// A bind mount: an existing directory of the same namespace, by absolute path.
    Bind(Vec<u8>),
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
    _private: (),
}

impl Cache {
    /// A cache over `backend` with the POSIX mode-bit policy.
    pub fn new(backend: Arc<dyn Backend>, config: Config) -> Result<Arc<Cache>> {
        todo!()
    }

    /// A cache with another access policy.
    pub fn with_policy(
        backend: Arc<dyn Backend>,
        config: Config,
        policy: Arc<dyn AccessPolicy>,
    ) -> Result<Arc<Cache>> {
        todo!()
    }

    pub fn config(&self) -> &Config {
        todo!()
    }

    /// The backend of the root file system.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        todo!()
    }

    /// The root dentry of the root file system.
    pub fn root(&self) -> NodeRef {
        todo!()
    }

    /// The initial namespace.
    pub fn namespace(&self) -> &Arc<Namespace> {
        todo!()
    }

    /// Interned credentials checked by the cache's access policy.
    pub fn credentials(&self, cred: Cred) -> Creds {
        todo!()
    }

    /// Credentials for callers whose permissions were already checked (the kernel, with FUSE
    /// `default_permissions`): the cache skips its own policy checks but still passes `cred`
    /// to the backend so files are created as the caller.
    pub fn kernel_checked(&self, cred: Cred) -> Creds {
        todo!()
    }

    // ------------------------------------------------------------------------------------
    // Path API: what a library user or a server calls.

    /// Resolve `path` to a dentry. Errors as path_resolution(7): ENOENT, ENOTDIR, EACCES,
    /// ELOOP, ENAMETOOLONG, EINVAL (empty path or embedded NUL).
    pub fn lookup(&self, c: &Creds, at: At<'_>, path: &[u8], flags: LookupFlags) -> Result<NodeRef> {
        todo!()
    }

    /// stat (`flags.follow`) or lstat.
    pub fn stat(&self, c: &Creds, at: At<'_>, path: &[u8], flags: LookupFlags) -> Result<Attr> {
        todo!()
    }

    /// access(2) (follows symlinks): `mask` of R_OK/W_OK/X_OK, 0 for existence.
    pub fn access(&self, c: &Creds, at: At<'_>, path: &[u8], mask: u32) -> Result<()> {
        todo!()
    }

    /// Open a directory handle (needs search permission on the path to it).
    pub fn opendir(&self, c: &Creds, at: At<'_>, path: &[u8]) -> Result<DirHandle> {
        todo!()
    }

    /// A handle on the root of a namespace.
    pub fn root_handle(&self, ns: &Arc<Namespace>) -> DirHandle {
        todo!()
    }

    /// List a directory (needs read permission on it). No `.` or `..`.
    pub fn readdir(&self, c: &Creds, at: At<'_>, path: &[u8]) -> Result<Vec<DirEntry>> {
        todo!()
    }

    pub fn readlink(&self, c: &Creds, at: At<'_>, path: &[u8]) -> Result<Vec<u8>> {
        todo!()
    }

    pub fn mkdir(&self, c: &Creds, at: At<'_>, path: &[u8], mode: u32) -> Result<Attr> {
        todo!()
    }

    /// Create a non-directory (`mode` holds the type bits; plain permission bits mean a
    /// regular file).
    pub fn mknod(&self, c: &Creds, at: At<'_>, path: &[u8], mode: u32, rdev: u64) -> Result<Attr> {
        todo!()
    }

    /// Create `path` as a symbolic link to `target`.
    pub fn symlink(&self, c: &Creds, target: &[u8], at: At<'_>, path: &[u8]) -> Result<Attr> {
        todo!()
    }

    /// Hard link `new` to `old` (neither followed if a symlink).
    pub fn link(&self, c: &Creds, at: At<'_>, old: &[u8], new: &[u8]) -> Result<Attr> {
        todo!()
    }

    pub fn unlink(&self, c: &Creds, at: At<'_>, path: &[u8]) -> Result<()> {
        todo!()
    }

    pub fn rmdir(&self, c: &Creds, at: At<'_>, path: &[u8]) -> Result<()> {
        todo!()
    }

    pub fn rename(&self, c: &Creds, at: At<'_>, old: &[u8], new: &[u8], mode: RenameMode) -> Result<()> {
        todo!()
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
        todo!()
    }

    // ------------------------------------------------------------------------------------
    // Node API: for front ends that walk one component at a time themselves (FUSE).

    /// Look up one component `name` in directory `parent` (no symlink following; `..` allowed).
    pub fn lookup_child(&self, c: &Creds, parent: &NodeRef, name: &[u8]) -> Result<NodeRef> {
        todo!()
    }

    /// Attributes of a dentry, from the cache or the backend.
    pub fn getattr(&self, node: &NodeRef) -> Result<Attr> {
        todo!()
    }

    /// List directory `node`; `want_attrs` asks for attributes of every entry (readdirplus).
    pub fn readdir_node(&self, c: &Creds, node: &NodeRef, want_attrs: bool) -> Result<Vec<DirEntry>> {
        todo!()
    }

    pub fn readlink_node(&self, node: &NodeRef) -> Result<Vec<u8>> {
        todo!()
    }

    /// The backend path of a dentry (relative to its file system's root).
    pub fn node_path(&self, node: &NodeRef) -> Result<Vec<u8>> {
        todo!()
    }

    pub fn mkdir_at(&self, c: &Creds, parent: &NodeRef, name: &[u8], mode: u32) -> Result<NodeRef> {
        todo!()
    }

    pub fn mknod_at(
        &self,
        c: &Creds,
        parent: &NodeRef,
        name: &[u8],
        mode: u32,
        rdev: u64,
    ) -> Result<NodeRef> {
        todo!()
    }

    pub fn symlink_at(&self, c: &Creds, parent: &NodeRef, name: &[u8], target: &[u8]) -> Result<NodeRef> {
        todo!()
    }

    /// Hard link `node` as `newparent/newname`.
    pub fn link_at(&self, c: &Creds, node: &NodeRef, newparent: &NodeRef, newname: &[u8]) -> Result<NodeRef> {
        todo!()
    }

    pub fn unlink_at(&self, c: &Creds, parent: &NodeRef, name: &[u8]) -> Result<()> {
        todo!()
    }

    pub fn rmdir_at(&self, c: &Creds, parent: &NodeRef, name: &[u8]) -> Result<()> {
        todo!()
    }

    pub fn rename_at(
        &self,
        c: &Creds,
        parent: &NodeRef,
        name: &[u8],
        newparent: &NodeRef,
        newname: &[u8],
        mode: RenameMode,
    ) -> Result<()> {
        todo!()
    }

    pub fn setattr_node(&self, c: &Creds, node: &NodeRef, set: &SetAttr) -> Result<Attr> {
        todo!()
    }

    /// Open a file for data with open(2) `flags` (permission checked unless kernel-checked).
    pub fn open_node(&self, c: &Creds, node: &NodeRef, flags: i32) -> Result<OwnedFd> {
        todo!()
    }

    /// Create and open regular file `parent/name` (O_CREAT; O_EXCL in `flags` honoured).
    pub fn create_at(
        &self,
        c: &Creds,
        parent: &NodeRef,
        name: &[u8],
        mode: u32,
        flags: i32,
    ) -> Result<(NodeRef, OwnedFd)> {
        todo!()
    }

    /// Forget the cached attributes of `node` (after data was written through a descriptor).
    pub fn forget_attr(&self, node: &NodeRef) {
        todo!()
    }

    // ------------------------------------------------------------------------------------
    // Coherence with changes made behind the cache's back.

    /// Apply a change reported by a backend's change feed (or by anyone who knows the tree
    /// changed). Returns what was dropped, for front ends with caches of their own.
    pub fn apply_change(&self, change: &Change) -> Vec<Invalidation> {
        todo!()
    }

    /// Forget everything cached at and below backend path `path` of the root file system,
    /// and the listing of its parent.
    pub fn invalidate(&self, path: &[u8]) -> Vec<Invalidation> {
        self.apply_change(&Change::Entry { path: path.to_vec() })
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
        todo!()
    }

    /// Unmount whatever is mounted on `path` in `ns`.
    pub fn umount(&self, ns: &Arc<Namespace>, path: &[u8]) -> Result<()> {
        todo!()
    }

    /// The options of the mount that `path` lies in.
    pub fn mount_options(&self, ns: &Arc<Namespace>, path: &[u8]) -> Result<MountOptions> {
        todo!()
    }

    /// A private copy of `ns`'s mount table with its own direct-lookup table.
    pub fn clone_namespace(&self, ns: &Arc<Namespace>) -> Arc<Namespace> {
        todo!()
    }

    /// Counters and sizes.
    pub fn stats(&self) -> StatsSnapshot {
        todo!()
    }
}
