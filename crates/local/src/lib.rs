//! # dircache-local
//!
//! [`LocalBackend`]: a [`Backend`] over a real directory of the local file system.
//!
//! * **Confinement.** Every path is resolved with `openat2(2)` relative to an `O_PATH` descriptor
//!   of the root with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`: no
//!   component may be a symbolic link (ELOOP) and resolution can never leave the root (EXDEV),
//!   even if someone swaps a directory for a symlink between two calls. Final components are
//!   handled relative to their parent's descriptor with `AT_SYMLINK_NOFOLLOW` semantics, and
//!   names are checked to be single components (no `/`, not `.`/`..`, no NUL).
//! * **Descriptors.** A process may hold only 20,000 descriptors here, so the backend never keeps
//!   one per inode. It keeps a small bounded cache of directory `O_PATH` descriptors keyed by
//!   backend path (default 256 entries, 0 disables it). Any mutation made through the backend
//!   empties it (a generation counter keeps a racing resolution from inserting a stale
//!   descriptor), the change feed empties it on every `Change::Entry`/`Overflow`, and
//!   [`LocalBackend::forget_cached_fds`] empties it for changes learned elsewhere.
//! * **Queries** (lookup, getattr, readdir, readlink, statfs) run with the daemon's own
//!   credentials: the cache checks permissions itself through its access policy.
//! * **Mutations and `open`** run as the caller: parents are resolved and the syscall is made
//!   with the calling thread's fs uid/gid and groups switched to the caller's (see
//!   `creds.rs`), so the kernel enforces permissions and ownership exactly as for that user.
//! * **Changes** made behind the cache's back are reported by [`Backend::watch`] from a
//!   background thread: fanotify (`FAN_REPORT_DFID_NAME`, filesystem mark) when running as
//!   root, recursive inotify otherwise.

mod creds;
mod watch;

use std::ffi::CString;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use dircache_core::{
    Attr, Backend, ChangeFeed, Cred, DirEntry, Error, FileType, RenameMode, Result, SetAttr,
    StatFs, TimeSet, Timespec, NAME_MAX, PATH_MAX,
};
use parking_lot::Mutex;
use rustix::fs::{AtFlags, Mode, OFlags, RenameFlags, ResolveFlags, StatxFlags};

use creds::CredGuard;
pub use watch::WatchMode;

/// Default number of directory descriptors kept open.
pub const DEFAULT_FD_CACHE: usize = 256;

const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

fn errno(e: rustix::io::Errno) -> Error {
    Error::from_errno(e.raw_os_error())
}

fn last_err() -> Error {
    Error::from(std::io::Error::last_os_error())
}

/// A bounded cache of directory O_PATH descriptors, keyed by backend path.
pub(crate) struct FdCache {
    cap: usize,
    /// Bumped after every mutation; a resolution that started before a bump does not insert.
    generation: AtomicU64,
    inner: Mutex<FdCacheInner>,
}

#[derive(Default)]
struct FdCacheInner {
    map: std::collections::HashMap<Vec<u8>, (Arc<OwnedFd>, u64)>,
    tick: u64,
}

impl FdCache {
    fn new(cap: usize) -> FdCache {
        FdCache {
            cap,
            generation: AtomicU64::new(0),
            inner: Mutex::new(FdCacheInner::default()),
        }
    }

    fn get(&self, path: &[u8]) -> Option<Arc<OwnedFd>> {
        if self.cap == 0 {
            return None;
        }
        let mut g = self.inner.lock();
        g.tick += 1;
        let t = g.tick;
        let e = g.map.get_mut(path)?;
        e.1 = t;
        Some(e.0.clone())
    }

    fn insert(&self, path: &[u8], fd: Arc<OwnedFd>, generation: u64) {
        if self.cap == 0 {
            return;
        }
        let mut g = self.inner.lock();
        if self.generation.load(Ordering::Acquire) != generation {
            return;
        }
        if g.map.len() >= self.cap && !g.map.contains_key(path) {
            // Evict the least recently used entry (a linear scan of <= cap entries is cheap
            // next to the syscall that just happened).
            if let Some(k) = g
                .map
                .iter()
                .min_by_key(|(_, v)| v.1)
                .map(|(k, _)| k.clone())
            {
                g.map.remove(&k);
            }
        }
        g.tick += 1;
        let t = g.tick;
        g.map.insert(path.to_vec(), (fd, t));
    }

    /// Forget every descriptor (they close once no caller holds them).
    pub(crate) fn clear(&self) {
        let mut g = self.inner.lock();
        self.generation.fetch_add(1, Ordering::AcqRel);
        g.map.clear();
    }

    fn len(&self) -> usize {
        self.inner.lock().map.len()
    }
}

/// A directory descriptor: the root's, or one from the cache / freshly opened.
enum DirFd<'a> {
    Root(BorrowedFd<'a>),
    Shared(Arc<OwnedFd>),
    Owned(OwnedFd),
}

impl AsFd for DirFd<'_> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            DirFd::Root(b) => *b,
            DirFd::Shared(a) => a.as_fd(),
            DirFd::Owned(o) => o.as_fd(),
        }
    }
}

/// A [`Backend`] over a real directory. See the crate documentation.
pub struct LocalBackend {
    root: OwnedFd,
    /// Canonical absolute path of the root (for the change feed).
    root_path: PathBuf,
    fds: Arc<FdCache>,
    /// Whether the process is root, so mutations can switch fs credentials.
    switch_creds: bool,
    watch_mode: WatchMode,
    /// Whether the change feed reports changes made by this process (default: no).
    pub(crate) report_own_changes: std::sync::atomic::AtomicBool,
    watchers: Mutex<Vec<watch::Watcher>>,
}

impl std::fmt::Debug for LocalBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalBackend")
            .field("root", &self.root_path)
            .finish()
    }
}

/// Check a single name component.
fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
        return Err(Error::Invalid);
    }
    if name.contains(&0) {
        return Err(Error::Invalid);
    }
    if name.len() > NAME_MAX {
        return Err(Error::NameTooLong);
    }
    Ok(())
}

/// Check a backend path ("" is the root).
fn check_path(path: &[u8]) -> Result<()> {
    if path.is_empty() {
        return Ok(());
    }
    if path.len() >= PATH_MAX {
        return Err(Error::NameTooLong);
    }
    path.split(|&b| b == b'/').try_for_each(check_name)
}

/// Split a non-root path into (parent, name).
fn split(path: &[u8]) -> Result<(&[u8], &[u8])> {
    check_path(path)?;
    if path.is_empty() {
        // The root has no parent entry: it cannot be created, removed or renamed.
        return Err(Error::Busy);
    }
    Ok(match path.iter().rposition(|&b| b == b'/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (&b""[..], path),
    })
}

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(dir.len() + 1 + name.len());
    p.extend_from_slice(dir);
    if !dir.is_empty() {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

fn ts(t: &rustix::fs::StatxTimestamp) -> Timespec {
    Timespec {
        sec: t.tv_sec,
        nsec: t.tv_nsec,
    }
}

pub(crate) fn attr_from_statx(s: &rustix::fs::Statx) -> Attr {
    Attr {
        ino: s.stx_ino,
        dev: libc::makedev(s.stx_dev_major, s.stx_dev_minor),
        mode: u32::from(s.stx_mode),
        nlink: s.stx_nlink,
        uid: s.stx_uid,
        gid: s.stx_gid,
        rdev: libc::makedev(s.stx_rdev_major, s.stx_rdev_minor),
        size: s.stx_size,
        blocks: s.stx_blocks,
        blksize: s.stx_blksize,
        atime: ts(&s.stx_atime),
        mtime: ts(&s.stx_mtime),
        ctime: ts(&s.stx_ctime),
    }
}

fn statx_at(dir: BorrowedFd<'_>, name: &[u8]) -> Result<Attr> {
    let s = rustix::fs::statx(
        dir,
        name,
        AtFlags::SYMLINK_NOFOLLOW,
        StatxFlags::BASIC_STATS,
    )
    .map_err(errno)?;
    Ok(attr_from_statx(&s))
}

fn statx_fd(fd: BorrowedFd<'_>) -> Result<Attr> {
    let s = rustix::fs::statx(
        fd,
        c"",
        AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW,
        StatxFlags::BASIC_STATS,
    )
    .map_err(errno)?;
    Ok(attr_from_statx(&s))
}

fn dtype_kind(t: rustix::fs::FileType) -> Option<FileType> {
    use rustix::fs::FileType as R;
    Some(match t {
        R::RegularFile => FileType::Regular,
        R::Directory => FileType::Directory,
        R::Symlink => FileType::Symlink,
        R::CharacterDevice => FileType::CharDevice,
        R::BlockDevice => FileType::BlockDevice,
        R::Fifo => FileType::Fifo,
        R::Socket => FileType::Socket,
        _ => return None,
    })
}

fn timespec(t: Option<TimeSet>) -> rustix::fs::Timespec {
    match t {
        None => rustix::fs::Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_OMIT,
        },
        Some(TimeSet::Now) => rustix::fs::Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_NOW,
        },
        Some(TimeSet::At(t)) => rustix::fs::Timespec {
            tv_sec: t.sec,
            tv_nsec: i64::from(t.nsec) as _,
        },
    }
}

impl LocalBackend {
    /// Whether watchers started from now on report changes made by this process itself
    /// (default: no, since a cache in this process applied them already; fanotify only —
    /// inotify cannot tell who made a change).
    pub fn set_report_own_changes(&self, on: bool) {
        self.report_own_changes.store(on, Ordering::Relaxed);
    }

    /// A backend over directory `root`, with the default descriptor cache.
    pub fn new(root: &Path) -> Result<LocalBackend> {
        Self::with_options(root, DEFAULT_FD_CACHE, WatchMode::Auto)
    }

    /// A backend over `root` keeping at most `fd_cache` directory descriptors (0: none),
    /// reporting changes with `watch_mode`.
    pub fn with_options(
        root: &Path,
        fd_cache: usize,
        watch_mode: WatchMode,
    ) -> Result<LocalBackend> {
        let root_path = std::fs::canonicalize(root).map_err(|e| {
            tracing::warn!("dircache-local: root {}: {e}", root.display());
            Error::from(e)
        })?;
        let fd = rustix::fs::open(
            &root_path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(errno)?;
        // SAFETY: geteuid has no preconditions.
        let switch_creds = unsafe { libc::geteuid() } == 0;
        Ok(LocalBackend {
            root: fd,
            root_path,
            fds: Arc::new(FdCache::new(fd_cache)),
            switch_creds,
            watch_mode,
            report_own_changes: std::sync::atomic::AtomicBool::new(false),
            watchers: Mutex::new(Vec::new()),
        })
    }

    /// The canonical absolute path of the root.
    pub fn root_path(&self) -> &Path {
        &self.root_path
    }

    /// Forget all cached directory descriptors. Call this after changing the tree behind the
    /// backend's back (the change feed does it itself for the changes it reports).
    pub fn forget_cached_fds(&self) {
        self.fds.clear();
    }

    /// How many directory descriptors are cached now.
    pub fn cached_fds(&self) -> usize {
        self.fds.len()
    }

    /// Open directory `path` as O_PATH, as the daemon, through the descriptor cache.
    fn dir(&self, path: &[u8]) -> Result<DirFd<'_>> {
        check_path(path)?;
        if path.is_empty() {
            return Ok(DirFd::Root(self.root.as_fd()));
        }
        if let Some(fd) = self.fds.get(path) {
            return Ok(DirFd::Shared(fd));
        }
        let generation = self.fds.generation.load(Ordering::Acquire);
        let fd = Arc::new(self.open_path_dir(path)?);
        self.fds.insert(path, fd.clone(), generation);
        Ok(DirFd::Shared(fd))
    }

    fn open_path_dir(&self, path: &[u8]) -> Result<OwnedFd> {
        rustix::fs::openat2(
            &self.root,
            path,
            // No O_NOFOLLOW: with RESOLVE_NO_SYMLINKS a final symlink then fails with ELOOP
            // (with O_PATH|O_NOFOLLOW the kernel would hand out the link itself).
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            RESOLVE,
        )
        .map_err(errno)
    }

    /// Open directory `path` as O_PATH without the cache, for a mutation made under the
    /// caller's credentials. The path opened is `path/.`, so the kernel checks search
    /// permission on every directory of the path *including `path` itself*, in the same order
    /// as the path walk of the real syscall (which needs search permission on the parent to
    /// look up the final name): errors come out as Linux's would.
    fn dir_uncached(&self, path: &[u8]) -> Result<DirFd<'_>> {
        check_path(path)?;
        let mut p = Vec::with_capacity(path.len() + 2);
        p.extend_from_slice(path);
        if !p.is_empty() {
            p.push(b'/');
        }
        p.push(b'.');
        Ok(DirFd::Owned(self.open_path_dir(&p)?))
    }

    /// Run mutation `f` as `cred`, then invalidate the descriptor cache.
    fn as_cred<T>(&self, cred: &Cred, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let r = {
            let _g = CredGuard::switch(cred, self.switch_creds)?;
            f()
        };
        self.fds.clear();
        r
    }

    fn attr_of(&self, path: &[u8]) -> Result<Attr> {
        let (dir, name) = split(path)?;
        let d = self.dir(dir)?;
        statx_at(d.as_fd(), name)
    }

    fn cpath(name: &[u8]) -> Result<CString> {
        CString::new(name).map_err(|_| Error::Invalid)
    }

    fn setattr_inner(&self, path: &[u8], set: &SetAttr) -> Result<()> {
        let (dir, name) = split(path)?;
        let d = self.dir_uncached(dir)?;
        let dfd = d.as_fd();
        let cname = Self::cpath(name)?;
        if set.uid.is_some() || set.gid.is_some() {
            let uid = set.uid.unwrap_or(u32::MAX);
            let gid = set.gid.unwrap_or(u32::MAX);
            // SAFETY: dfd is a live descriptor and cname a NUL-terminated string.
            let r = unsafe {
                libc::fchownat(
                    dfd.as_raw_fd(),
                    cname.as_ptr(),
                    uid,
                    gid,
                    libc::AT_SYMLINK_NOFOLLOW,
                )
            };
            if r < 0 {
                return Err(last_err());
            }
        }
        if let Some(mode) = set.mode {
            // fchmodat2 (Linux 6.6) honours AT_SYMLINK_NOFOLLOW and answers EOPNOTSUPP for a
            // symlink, as Linux does for lchmod.
            // SAFETY: dfd is live, cname is NUL-terminated, the other arguments are integers.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_fchmodat2,
                    dfd.as_raw_fd(),
                    cname.as_ptr(),
                    mode & 0o7777,
                    libc::AT_SYMLINK_NOFOLLOW,
                )
            };
            if r < 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::ENOSYS) {
                    return Err(e.into());
                }
                // Older kernels: refuse symlinks ourselves, chmod anything else.
                let a = statx_at(dfd, name)?;
                if a.kind() == FileType::Symlink {
                    return Err(Error::Os(libc::EOPNOTSUPP));
                }
                rustix::fs::chmodat(
                    dfd,
                    name,
                    Mode::from_raw_mode(mode & 0o7777),
                    AtFlags::empty(),
                )
                .map_err(errno)?;
            }
        }
        if let Some(size) = set.size {
            let a = statx_at(dfd, name)?;
            match a.kind() {
                FileType::Regular => {}
                FileType::Directory => return Err(Error::IsDir),
                _ => return Err(Error::Invalid),
            }
            let f = rustix::fs::openat2(
                dfd,
                name,
                OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
                Mode::empty(),
                RESOLVE,
            )
            .map_err(errno)?;
            rustix::fs::ftruncate(&f, size).map_err(errno)?;
        }
        if set.atime.is_some() || set.mtime.is_some() {
            let times = rustix::fs::Timestamps {
                last_access: timespec(set.atime),
                last_modification: timespec(set.mtime),
            };
            rustix::fs::utimensat(dfd, name, &times, AtFlags::SYMLINK_NOFOLLOW).map_err(errno)?;
        }
        Ok(())
    }

    fn readdir_inner(&self, path: &[u8], plus: bool) -> Result<Vec<DirEntry>> {
        let d = self.dir(path)?;
        // Re-open the O_PATH descriptor for reading ("." never leaves it).
        let rd = rustix::fs::openat2(
            d.as_fd(),
            c".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            RESOLVE,
        )
        .map_err(errno)?;
        drop(d);
        let mut buf = vec![MaybeUninit::<u8>::uninit(); 64 * 1024];
        let mut iter = rustix::fs::RawDir::new(&rd, &mut buf);
        let mut res = Vec::new();
        while let Some(ent) = iter.next() {
            let ent = ent.map_err(errno)?;
            let name = ent.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            let kind = dtype_kind(ent.file_type());
            // d_type is DT_UNKNOWN on some file systems: ask statx then.
            let attr = if plus || kind.is_none() {
                match statx_at(rd.as_fd(), name) {
                    Ok(a) => Some(a),
                    // Removed since the listing was read: leave it out.
                    Err(Error::NotFound) => continue,
                    Err(e) => return Err(e),
                }
            } else {
                None
            };
            let kind = match (kind, &attr) {
                (Some(k), _) => k,
                (None, Some(a)) => a.kind(),
                (None, None) => FileType::Regular,
            };
            let ino = attr.map_or(ent.ino(), |a| a.ino);
            res.push(DirEntry {
                name: name.to_vec(),
                kind,
                ino,
                attr: if plus { attr } else { None },
            });
        }
        Ok(res)
    }
}

impl Backend for LocalBackend {
    fn lookup(&self, dir: &[u8], name: &[u8]) -> Result<Attr> {
        check_name(name)?;
        let d = self.dir(dir)?;
        statx_at(d.as_fd(), name)
    }

    fn getattr(&self, path: &[u8]) -> Result<Attr> {
        if path.is_empty() {
            return statx_fd(self.root.as_fd());
        }
        self.attr_of(path)
    }

    fn readdir(&self, path: &[u8], plus: bool) -> Result<Vec<DirEntry>> {
        self.readdir_inner(path, plus)
    }

    fn readlink(&self, path: &[u8]) -> Result<Vec<u8>> {
        let (dir, name) =
            split(path).map_err(|e| if e == Error::Busy { Error::Invalid } else { e })?;
        let d = self.dir(dir)?;
        let t = rustix::fs::readlinkat(d.as_fd(), name, Vec::new()).map_err(errno)?;
        Ok(t.into_bytes())
    }

    fn mknod(&self, cred: &Cred, path: &[u8], mode: u32, rdev: u64) -> Result<Attr> {
        let (dir, name) =
            split(path).map_err(|e| if e == Error::Busy { Error::Exists } else { e })?;
        let kind = FileType::from_mode(mode);
        if kind == FileType::Directory || kind == FileType::Symlink {
            return Err(Error::Invalid);
        }
        let cname = Self::cpath(name)?;
        self.as_cred(cred, || {
            let d = self.dir_uncached(dir)?;
            // SAFETY: d is a live descriptor, cname is NUL-terminated, mode/rdev are integers.
            let r = unsafe {
                libc::mknodat(
                    d.as_fd().as_raw_fd(),
                    cname.as_ptr(),
                    mode,
                    rdev as libc::dev_t,
                )
            };
            if r < 0 {
                return Err(last_err());
            }
            statx_at(d.as_fd(), name)
        })
    }

    fn mkdir(&self, cred: &Cred, path: &[u8], mode: u32) -> Result<Attr> {
        let (dir, name) =
            split(path).map_err(|e| if e == Error::Busy { Error::Exists } else { e })?;
        self.as_cred(cred, || {
            let d = self.dir_uncached(dir)?;
            rustix::fs::mkdirat(d.as_fd(), name, Mode::from_raw_mode(mode & 0o7777))
                .map_err(errno)?;
            statx_at(d.as_fd(), name)
        })
    }

    fn symlink(&self, cred: &Cred, target: &[u8], path: &[u8]) -> Result<Attr> {
        let (dir, name) =
            split(path).map_err(|e| if e == Error::Busy { Error::Exists } else { e })?;
        if target.is_empty() {
            return Err(Error::NotFound);
        }
        if target.len() >= PATH_MAX {
            return Err(Error::NameTooLong);
        }
        self.as_cred(cred, || {
            let d = self.dir_uncached(dir)?;
            rustix::fs::symlinkat(target, d.as_fd(), name).map_err(errno)?;
            statx_at(d.as_fd(), name)
        })
    }

    fn link(&self, cred: &Cred, old: &[u8], new: &[u8]) -> Result<Attr> {
        let (odir, oname) =
            split(old).map_err(|e| if e == Error::Busy { Error::Perm } else { e })?;
        let (ndir, nname) =
            split(new).map_err(|e| if e == Error::Busy { Error::Exists } else { e })?;
        self.as_cred(cred, || {
            let od = self.dir_uncached(odir)?;
            // link(2) resolves the old path completely before the new one: report its error
            // first, as the kernel does (only checked when the new parent fails).
            let nd = match self.dir_uncached(ndir) {
                Ok(nd) => nd,
                Err(e) => {
                    statx_at(od.as_fd(), oname)?;
                    return Err(e);
                }
            };
            rustix::fs::linkat(od.as_fd(), oname, nd.as_fd(), nname, AtFlags::empty())
                .map_err(errno)?;
            statx_at(nd.as_fd(), nname)
        })
    }

    fn unlink(&self, cred: &Cred, path: &[u8]) -> Result<()> {
        let (dir, name) =
            split(path).map_err(|e| if e == Error::Busy { Error::IsDir } else { e })?;
        self.as_cred(cred, || {
            let d = self.dir_uncached(dir)?;
            rustix::fs::unlinkat(d.as_fd(), name, AtFlags::empty()).map_err(errno)
        })
    }

    fn rmdir(&self, cred: &Cred, path: &[u8]) -> Result<()> {
        let (dir, name) = split(path)?;
        self.as_cred(cred, || {
            let d = self.dir_uncached(dir)?;
            rustix::fs::unlinkat(d.as_fd(), name, AtFlags::REMOVEDIR).map_err(errno)
        })
    }

    fn rename(&self, cred: &Cred, old: &[u8], new: &[u8], mode: RenameMode) -> Result<()> {
        let (odir, oname) = split(old)?;
        let (ndir, nname) = split(new)?;
        let flags = match mode {
            RenameMode::Replace => RenameFlags::empty(),
            RenameMode::NoReplace => RenameFlags::NOREPLACE,
            RenameMode::Exchange => RenameFlags::EXCHANGE,
        };
        self.as_cred(cred, || {
            let od = self.dir_uncached(odir)?;
            let nd = self.dir_uncached(ndir)?;
            rustix::fs::renameat_with(od.as_fd(), oname, nd.as_fd(), nname, flags).map_err(errno)
        })
    }

    fn setattr(&self, cred: &Cred, path: &[u8], set: &SetAttr) -> Result<Attr> {
        if path.is_empty() {
            // The root: operate on it through its parent is impossible (it may be "/"), so
            // use the root descriptor itself via /proc-free *at calls with AT_EMPTY_PATH.
            self.as_cred(cred, || self.setattr_root(set))?;
            return statx_fd(self.root.as_fd());
        }
        self.as_cred(cred, || self.setattr_inner(path, set))?;
        self.attr_of(path)
    }

    fn statfs(&self, path: &[u8]) -> Result<StatFs> {
        let fd = if path.is_empty() {
            DirFd::Root(self.root.as_fd())
        } else {
            let (dir, name) = split(path)?;
            let d = self.dir(dir)?;
            DirFd::Owned(
                rustix::fs::openat2(
                    d.as_fd(),
                    name,
                    OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                    RESOLVE,
                )
                .map_err(errno)?,
            )
        };
        let s = rustix::fs::fstatfs(fd.as_fd()).map_err(errno)?;
        Ok(StatFs {
            blocks: s.f_blocks as u64,
            bfree: s.f_bfree as u64,
            bavail: s.f_bavail as u64,
            files: s.f_files as u64,
            ffree: s.f_ffree as u64,
            bsize: s.f_bsize as u32,
            namelen: s.f_namelen as u32,
            frsize: s.f_frsize as u32,
        })
    }

    fn open(&self, cred: &Cred, path: &[u8], flags: i32, mode: u32) -> Result<OwnedFd> {
        check_path(path)?;
        let p: &[u8] = if path.is_empty() { b"." } else { path };
        let oflags = OFlags::from_bits_retain(flags as u32) | OFlags::CLOEXEC | OFlags::NOFOLLOW;
        let creates = oflags.contains(OFlags::CREATE);
        let r = {
            let _g = CredGuard::switch(cred, self.switch_creds)?;
            rustix::fs::openat2(
                &self.root,
                p,
                oflags,
                Mode::from_raw_mode(mode & 0o7777),
                RESOLVE,
            )
            .map_err(errno)
        };
        if creates {
            self.fds.clear();
        }
        r
    }

    fn watch(&self) -> Result<Option<ChangeFeed>> {
        if self.watch_mode == WatchMode::Off {
            return Ok(None);
        }
        let (w, rx) = watch::Watcher::start(self, self.watch_mode)?;
        self.watchers.lock().push(w);
        Ok(Some(rx))
    }
}

impl LocalBackend {
    fn setattr_root(&self, set: &SetAttr) -> Result<()> {
        let fd = self.root.as_raw_fd();
        if set.uid.is_some() || set.gid.is_some() {
            // SAFETY: fd is live; "" with AT_EMPTY_PATH names the descriptor itself.
            let r = unsafe {
                libc::fchownat(
                    fd,
                    c"".as_ptr(),
                    set.uid.unwrap_or(u32::MAX),
                    set.gid.unwrap_or(u32::MAX),
                    libc::AT_EMPTY_PATH,
                )
            };
            if r < 0 {
                return Err(last_err());
            }
        }
        if let Some(mode) = set.mode {
            // SAFETY: as above; fchmodat2 accepts AT_EMPTY_PATH on an O_PATH descriptor.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_fchmodat2,
                    fd,
                    c"".as_ptr(),
                    mode & 0o7777,
                    libc::AT_EMPTY_PATH,
                )
            };
            if r < 0 {
                return Err(last_err());
            }
        }
        if set.size.is_some() {
            return Err(Error::IsDir);
        }
        if set.atime.is_some() || set.mtime.is_some() {
            let times = [timespec(set.atime), timespec(set.mtime)];
            // SAFETY: fd is live, the path is "", `times` is an array of two timespecs laid
            // out as the kernel's (rustix::fs::Timespec is libc's timespec on Linux).
            let r = unsafe {
                libc::syscall(
                    libc::SYS_utimensat,
                    fd,
                    c"".as_ptr(),
                    times.as_ptr(),
                    libc::AT_EMPTY_PATH,
                )
            };
            if r < 0 {
                return Err(last_err());
            }
        }
        Ok(())
    }
}

impl Drop for LocalBackend {
    fn drop(&mut self) {
        for w in self.watchers.get_mut().drain(..) {
            w.stop();
        }
    }
}

/// The canonical root path as bytes (used by the watcher).
pub(crate) fn path_bytes(p: &Path) -> &[u8] {
    p.as_os_str().as_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_checks() {
        assert!(check_path(b"").is_ok());
        assert!(check_path(b"a/b").is_ok());
        assert_eq!(check_path(b"/a"), Err(Error::Invalid));
        assert_eq!(check_path(b"a/"), Err(Error::Invalid));
        assert_eq!(check_path(b"a//b"), Err(Error::Invalid));
        assert_eq!(check_path(b"a/../b"), Err(Error::Invalid));
        assert_eq!(check_path(b"a/./b"), Err(Error::Invalid));
        assert_eq!(check_path(b"a\0b"), Err(Error::Invalid));
        assert_eq!(check_name(&[b'x'; 256]), Err(Error::NameTooLong));
        assert_eq!(split(b"a/b/c").unwrap(), (&b"a/b"[..], &b"c"[..]));
        assert_eq!(split(b"c").unwrap(), (&b""[..], &b"c"[..]));
    }

    #[test]
    fn fd_cache_is_bounded_and_generation_checked() {
        let c = FdCache::new(2);
        let fd = || Arc::new(rustix::fs::open("/", OFlags::PATH, Mode::empty()).unwrap());
        c.insert(b"a", fd(), 0);
        c.insert(b"b", fd(), 0);
        c.get(b"a");
        c.insert(b"c", fd(), 0);
        assert_eq!(c.len(), 2);
        assert!(c.get(b"a").is_some());
        assert!(c.get(b"b").is_none());
        c.clear();
        c.insert(b"d", fd(), 0); // stale generation: refused
        assert_eq!(c.len(), 0);
    }
}
