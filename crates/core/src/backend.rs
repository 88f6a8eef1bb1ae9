//! The interface between the cache and whatever holds the files.
//!
//! A backend is addressed by **backend paths**: byte strings relative to the backend's root,
//! components separated by single `/`, never `.` or `..`, no leading or trailing slash, and the
//! empty string for the root itself. The cache resolves symbolic links and `..` itself, so a
//! backend never needs to follow a symlink in any component it is given (and the local backend
//! refuses to, which also keeps it from escaping its root).
//!
//! A backend path has no length limit: PATH_MAX bounds one syscall's path argument (the
//! cache's path API answers ENAMETOOLONG for those), not how deep a node lies, and a front end
//! that names nodes one component at a time (FUSE) reaches any depth. Components are still at
//! most NAME_MAX bytes.
//!
//! Mutations carry the caller's [`Cred`]: a backend creates files owned by that caller and may
//! enforce permissions as that caller (the local backend switches its thread's fsuid/fsgid).
//!
//! A front end reaches file data and everything else about a file only through this trait and
//! the open files it returns ([`BackendFile`], from [`Backend::open`]; what a front end does to
//! a node it holds but did not open, a directory's fsync or inode flags, a ctime touch, goes
//! through [`Backend::open_verified`]): it never builds a path into the backend's storage, so
//! a backend without local files (a remote one) serves the same front end.

use std::os::fd::BorrowedFd;

use crate::file::BackendFile;
use crate::{Attr, Cred, DirEntry, Error, RenameMode, Result, SetAttr, StatFs};

/// What a multi-component [`Backend::walk`] found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Walked {
    /// Attributes of the components resolved, in order (`attrs[i]` is `names[i]`).
    pub attrs: Vec<Attr>,
    /// Why the walk stopped early: the error for `names[attrs.len()]`.
    pub error: Option<Error>,
}

/// A change made to the backend's files by someone other than this cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The attributes of `path` changed (chmod, chown, write, truncate, utimes, link count).
    Attr { path: Vec<u8> },
    /// An entry appeared, disappeared or was replaced at `path`; its parent's listing changed.
    Entry { path: Vec<u8> },
    /// The attributes of the file with inode `ino` on device `dev` changed, and the change
    /// named no path (fanotify reports a link count change, through whichever name, this way):
    /// every cached name of that inode must forget its attributes.
    Inode { dev: u64, ino: u64 },
    /// Events were lost: anything may have changed.
    Overflow,
}

/// The file an extended-attribute call (or [`Backend::open_verified`], [`Backend::fsyncdir`])
/// is about: its backend path and, when the caller holds a particular file (a FUSE node
/// stands for one inode), that file's `(dev, ino)`. A backend
/// that can tell must fail with [`Error::Stale`] rather than act on another file the path
/// names by now (renamed over from outside since the caller's lookup). `open`, when given, is
/// an open descriptor of the file (one whose names are all gone: unlinked while open), used
/// instead of `path`.
#[derive(Debug, Clone, Copy)]
pub struct XattrTarget<'a> {
    pub path: &'a [u8],
    pub expect: Option<(u64, u64)>,
    /// The held file's [`Attr::birth`] (0: unknown), checked with `expect`: ext4 gives a
    /// removed file's inode number to the next new file at once, so `(dev, ino)` alone takes
    /// a file made since at that name for the one the caller holds.
    pub birth: u32,
    pub open: Option<BorrowedFd<'a>>,
}

impl XattrTarget<'_> {
    /// Whether attributes `a` (of the file the target resolved to) are of the file the
    /// caller holds: its `(dev, ino)` and, when both are known, its birth time
    /// ([`Attr::same_birth`]). True without an expectation.
    pub fn is(&self, a: &Attr) -> bool {
        match self.expect {
            Some(k) => (a.dev, a.ino) == k && Attr::same_birth(self.birth, a.birth),
            None => true,
        }
    }
}

/// What backends without extended attributes answer (EOPNOTSUPP, as a file system without
/// xattr support; not ENOSYS, which would make the FUSE kernel stop asking for good).
pub const XATTR_UNSUPPORTED: Error = Error::Os(libc::EOPNOTSUPP);

/// Called before each backend call the cache times and before a remote round trip: a front
/// end's hint that the calling thread may block (issue 9: the FUSE front end hands reading
/// `/dev/fuse` to another thread, `fuser::may_block`). Set once per process.
static BEFORE_BACKEND_CALL: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

/// Set the hook run before backend calls that may block ([`before_backend_call`]); the first
/// one set stays.
pub fn set_before_backend_call(hook: fn()) {
    let _ = BEFORE_BACKEND_CALL.set(hook);
}

/// Run the hook set by [`set_before_backend_call`], if any: the calling thread is about to
/// wait for the backend.
#[inline]
pub fn before_backend_call() {
    if let Some(hook) = BEFORE_BACKEND_CALL.get() {
        hook()
    }
}

/// Receiving end of a backend's change feed.
pub type ChangeFeed = crossbeam_channel::Receiver<Change>;

/// A file store the cache sits in front of. All methods take backend paths (module docs).
pub trait Backend: Send + Sync + 'static {
    /// Attributes of `dir/name` without following a final symlink (lstat).
    fn lookup(&self, dir: &[u8], name: &[u8]) -> Result<Attr>;

    /// Resolve `names` one after another starting at `dir`, without following symlinks,
    /// stopping at the first component that fails (or that is not a directory while more
    /// components follow). Remote backends answer this in one round trip.
    fn walk(&self, dir: &[u8], names: &[&[u8]]) -> Walked {
        let mut out = Walked::default();
        let mut path = dir.to_vec();
        for (i, name) in names.iter().enumerate() {
            match self.lookup(&path, name) {
                Ok(a) => {
                    let last = i + 1 == names.len();
                    out.attrs.push(a);
                    if !last && !a.is_dir() {
                        out.error = Some(Error::NotDir);
                        break;
                    }
                    if !path.is_empty() {
                        path.push(b'/');
                    }
                    path.extend_from_slice(name);
                }
                Err(e) => {
                    out.error = Some(e);
                    break;
                }
            }
        }
        out
    }

    /// Attributes of `path` itself (lstat).
    fn getattr(&self, path: &[u8]) -> Result<Attr>;

    /// The entries of directory `path`, without `.` and `..`; with attributes if `plus`.
    fn readdir(&self, path: &[u8], plus: bool) -> Result<Vec<DirEntry>>;

    /// The target of symbolic link `path`.
    fn readlink(&self, path: &[u8]) -> Result<Vec<u8>>;

    /// Create a non-directory `path` (regular file, fifo, socket, device) with `mode`
    /// (type and permission bits), failing with EEXIST if it exists.
    fn mknod(&self, cred: &Cred, path: &[u8], mode: u32, rdev: u64) -> Result<Attr>;

    fn mkdir(&self, cred: &Cred, path: &[u8], mode: u32) -> Result<Attr>;

    /// Create symbolic link `path` pointing to `target`.
    fn symlink(&self, cred: &Cred, target: &[u8], path: &[u8]) -> Result<Attr>;

    /// Create hard link `new` to `old`; returns the attributes of the (shared) inode.
    fn link(&self, cred: &Cred, old: &[u8], new: &[u8]) -> Result<Attr>;

    fn unlink(&self, cred: &Cred, path: &[u8]) -> Result<()>;

    fn rmdir(&self, cred: &Cred, path: &[u8]) -> Result<()>;

    fn rename(&self, cred: &Cred, old: &[u8], new: &[u8], mode: RenameMode) -> Result<()>;

    /// chmod, chown, truncate and utimens of `path` (never following a final symlink);
    /// returns the new attributes.
    fn setattr(&self, cred: &Cred, path: &[u8], set: &SetAttr) -> Result<Attr>;

    fn statfs(&self, _path: &[u8]) -> Result<StatFs> {
        Err(Error::NotSupported)
    }

    /// Open `path` for data access with open(2) `flags` (O_CREAT allowed, with `mode`), as
    /// `cred`: the backend decides access as the kernel would for that caller, and creates
    /// the file owned by the caller. What is done with the open file later goes through
    /// [`BackendFile`], whose mutations take the requester's credentials again.
    fn open(
        &self,
        _cred: &Cred,
        _path: &[u8],
        _flags: i32,
        _mode: u32,
    ) -> Result<Box<dyn BackendFile>> {
        Err(Error::NotSupported)
    }

    /// Open the very file `target` names (its `expect`ed `(dev, ino)`, else [`Error::Stale`];
    /// `target.open`, when given, instead of the path) with open(2) `flags`, which may be
    /// `O_PATH`: for what a front end does to a node it holds rather than to a file it opened
    /// (a directory's inode-flag ioctls and fsync, a ctime touch). Resolving the node needs no
    /// permission of the caller (the kernel already resolved it for them: it names the node);
    /// the file is reopened with `flags` as the daemon, since the kernel already checked the
    /// caller's own open of it, or needs none (`O_PATH`); `cred` is the requester, for a
    /// backend that decides (or logs) per caller. Everything done with the result
    /// runs as the caller (the [`BackendFile`] methods taking a `Cred`, and
    /// [`BackendFile::as_caller`] for an ioctl). Default: not supported.
    fn open_verified(
        &self,
        _cred: &Cred,
        _target: XattrTarget<'_>,
        _flags: i32,
    ) -> Result<Box<dyn BackendFile>> {
        Err(Error::NotSupported)
    }

    /// fsync (fdatasync if `datasync`) the directory `target` names, verified as for
    /// [`open_verified`](Self::open_verified). A sync changes nothing a caller could be
    /// refused (the kernel checked the caller's open of the directory): `cred` is the
    /// requester, passed on as to `open_verified`.
    /// Default: through `open_verified`; a backend that cannot open it has nothing to sync.
    fn fsyncdir(&self, cred: &Cred, target: XattrTarget<'_>, datasync: bool) -> Result<()> {
        match self.open_verified(cred, target, libc::O_RDONLY | libc::O_DIRECTORY) {
            Ok(f) => f.sync(datasync),
            Err(Error::NotSupported) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The whole value of extended attribute `name` of `target` (not following a final
    /// symlink), read with the caller's rights (`cred`): the backend decides access as the
    /// kernel would for that caller.
    fn getxattr(&self, _cred: &Cred, _target: XattrTarget<'_>, _name: &[u8]) -> Result<Vec<u8>> {
        Err(XATTR_UNSUPPORTED)
    }

    /// The names of `target`'s extended attributes the caller may see, each followed by a
    /// NUL byte (the listxattr(2) format).
    fn listxattr(&self, _cred: &Cred, _target: XattrTarget<'_>) -> Result<Vec<u8>> {
        Err(XATTR_UNSUPPORTED)
    }

    /// Set extended attribute `name` of `target` as the caller; `flags` as setxattr(2)
    /// (XATTR_CREATE, XATTR_REPLACE). Setting `system.posix_acl_access` updates the mode as
    /// the kernel does for that caller (clearing set-group-ID when the caller is not in the
    /// file's group and lacks CAP_FSETID).
    fn setxattr(
        &self,
        _cred: &Cred,
        _target: XattrTarget<'_>,
        _name: &[u8],
        _value: &[u8],
        _flags: i32,
    ) -> Result<()> {
        Err(XATTR_UNSUPPORTED)
    }

    /// Remove extended attribute `name` of `target` as the caller.
    fn removexattr(&self, _cred: &Cred, _target: XattrTarget<'_>, _name: &[u8]) -> Result<()> {
        Err(XATTR_UNSUPPORTED)
    }

    /// Run a search next to the files, for `cred` ([`crate::delegated`]): `None` when this
    /// backend cannot (the caller then searches through the cache, directory by directory).
    /// A backend that runs it confines it to its root and applies `cred` as its other
    /// operations do.
    fn search(
        &self,
        _cred: &Cred,
        _call: &crate::SearchCall,
    ) -> Option<Result<Box<dyn crate::SearchHits>>> {
        None
    }

    /// Whether its open files must hear of every close(2) ([`BackendFile::flush`]): a front
    /// end may otherwise tell the kernel not to send FLUSH at all. Default: no.
    fn flush_on_close(&self) -> bool {
        false
    }

    /// Whether backend path `path` is known, without a call, to have no extended attributes
    /// at all (so no POSIX ACL): the remote backend's listings say so per entry. A search
    /// answered from the cache ([`crate::Cache`] holding the whole subtree) needs it for every
    /// directory it reads that the caller does not own. Default: never known.
    fn known_bare(&self, _path: &[u8]) -> bool {
        false
    }

    /// Whether it answers a listed entry's missing POSIX ACLs by itself, without a call
    /// (the remote backend: its listings say which entries have no extended attributes), so
    /// that a front end gains nothing by fetching ACLs ahead of the kernel. Default: no.
    fn acls_listed(&self) -> bool {
        false
    }

    /// Start reporting changes made behind the cache's back. `None` if the backend cannot.
    fn watch(&self) -> Result<Option<ChangeFeed>> {
        Ok(None)
    }

    /// Whether `(dev, ino)` is a provisional identity this backend made up for an object it
    /// has not been told the real one of (the remote backend's objects made while
    /// disconnected, until their reintegration gives them the server's). A front end
    /// holding such an inode takes the object of the same type found at its name later as
    /// that same object, whatever its number (Coda's temporary fids, replaced at
    /// reintegration). Default: no identity is provisional.
    fn provisional(&self, _dev: u64, _ino: u64) -> bool {
        false
    }

    /// Told by [`Cache::apply_change`](crate::Cache::apply_change) (and `invalidate`) before
    /// the cache applies a change made behind its back: a backend with caches of its own
    /// (e.g. directory descriptors keyed by path) must drop what the change may have made
    /// stale, or the cache's promise that the change is reflected once `apply_change`
    /// returns cannot hold. Default: nothing to forget.
    fn changed(&self, _change: &Change) {}

    /// A front end lets thread `tid` write `file` without seeing the writes (FUSE
    /// passthrough: the kernel writes the backing file in the writer's context), from now
    /// until [`Backend::own_writes_end`] with the same `token`. A backend whose change feed
    /// can tell those writes apart (fanotify reports the writing thread and the file) marks
    /// their reports so that [`Backend::own_write_change`] recognises them. Default: nothing.
    fn own_writes_begin(&self, _token: u64, _tid: i32, _file: &dyn crate::BackendFile) {}

    /// End the registration `token` of [`Backend::own_writes_begin`].
    fn own_writes_end(&self, _token: u64) {}

    /// Whether the feed reported `change` for nothing but a write of a registered thread to
    /// its registered file (consumes the mark). Default: no.
    fn own_write_change(&self, _change: &Change) -> bool {
        false
    }

    /// Counters of the backend's own (a remote backend's round trips and container files),
    /// shown by `dircache stats` under `backend`. Default: none.
    fn counters(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
}
