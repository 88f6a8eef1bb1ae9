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
//! * **Depth.** Backend paths may be longer than PATH_MAX (which bounds one syscall's path
//!   argument, not depth). A directory path longer than one openat2 takes is resolved in
//!   pieces cut at `/`, each with the same flags from the previous piece's descriptor; since no
//!   component is `..` or a symlink, each piece stays beneath the directory it starts from,
//!   which was beneath the root when it was reached (as for a cached descriptor, a directory
//!   moved out of the root meanwhile can be followed; nothing else can be reached).
//! * **Descriptors.** A process may hold only 20,000 descriptors here, so the backend never keeps
//!   one per inode. It keeps a small bounded cache of directory `O_PATH` descriptors keyed by
//!   backend path (LRU, 256 entries by default). [`LocalBackend::new`] uses it only while a
//!   change feed runs: the feed thread empties it on every directory create/delete/move made
//!   outside (before it reports the change) and on overflow, and rename/rmdir through the
//!   backend empty it synchronously (a generation counter keeps a racing resolution from
//!   inserting an old descriptor). Without a feed every call resolves afresh, so an explicit
//!   invalidation in the cache above always sees the current tree.
//!   [`LocalBackend::with_options`] with `fd_cache > 0` uses the cache always; its owner calls
//!   [`LocalBackend::forget_cached_fds`] after changing directories outside. A stale
//!   descriptor can answer for a moved directory, never for anything outside the root. A
//!   mutation or open that fails with ENOENT through the descriptor of a directory removed
//!   meanwhile (no links left: removed or renamed over outside, not reported yet) empties
//!   the cache and is made again on the directory the path names now.
//! * **umask.** Creation modes are subject to the calling thread's umask, as with any syscall,
//!   and the file system applies it only when the parent has no default ACL: run with umask 0
//!   and pass masked modes, or (as the FUSE front end does) give the thread the caller's umask.
//! * **Queries** (lookup, getattr, readdir, readlink, statfs) run with the daemon's own
//!   credentials: the cache checks permissions itself through its access policy.
//! * **Mutations and `open`** run as the caller: the parent directory is resolved as the
//!   daemon (through the descriptor cache), then the final `*at` syscall relative to it is made
//!   with the calling thread's fs uid/gid and groups switched to the caller's (see `creds.rs`).
//!   The kernel thus checks exactly what it checks for that user holding the parent directory:
//!   search on the parent, write on it, sticky bit, ownership, CAP_* rules, and new files
//!   belong to the user. Search permission on the *ancestors* is the cache's job (its access
//!   policy, with directory references: a process inside a directory keeps access after an
//!   ancestor's mode changes), so the backend does not check it again.
//! * **Extended attributes** are read and written as the caller too, on the inode the caller
//!   holds (see `xattr.rs`).
//! * **Changes** made behind the cache's back are reported by [`Backend::watch`] from a
//!   background thread: fanotify (`FAN_REPORT_DFID_NAME`, filesystem mark) when running as
//!   root, recursive inotify otherwise.

pub mod creds;
mod fid;
mod links;
mod own;
mod served;
mod watch;
mod xattr;

use std::ffi::CString;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use dircache_core::{
    Attr, Backend, BackendFile, Change, ChangeFeed, Cred, DirEntry, Error, FdFile, FileType,
    RenameMode, Result, SetAttr, StatFs, TimeSet, Walked, XattrTarget, NAME_MAX, PATH_MAX,
};
use parking_lot::{Mutex, RwLock};
use rustix::fs::{AtFlags, Mode, OFlags, RenameFlags, ResolveFlags, StatxFlags};

use creds::{ActAs, Caps};
pub use watch::{fanotify_reads, WatchMode};

/// Default number of directory descriptors kept open.
pub const DEFAULT_FD_CACHE: usize = 256;

pub(crate) const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

fn errno(e: rustix::io::Errno) -> Error {
    Error::from_errno(e.raw_os_error())
}

fn last_err() -> Error {
    Error::from(std::io::Error::last_os_error())
}

/// A bounded cache of directory O_PATH descriptors, keyed by backend path.
///
/// Hits take a read lock and mark the entry with an atomic tick (no writer needed); inserts
/// take the write lock and evict the least recently marked entry.
pub(crate) struct FdCache {
    cap: usize,
    /// Used even without a change feed (the owner calls `forget_cached_fds` after changes made
    /// outside); otherwise only while at least one feed runs (`feeds`), since the feed is what
    /// keeps cached descriptors coherent with changes made outside.
    always: bool,
    pub(crate) feeds: std::sync::atomic::AtomicUsize,
    /// Bumped on every clear; a resolution that started before a clear does not insert.
    generation: AtomicU64,
    tick: AtomicU64,
    map: RwLock<std::collections::HashMap<Vec<u8>, FdEntry>>,
    /// Mount id of the root (0: unknown). Descriptors on other mounts (file systems mounted
    /// below the root) are not kept: a kept descriptor would make `umount` of that file
    /// system fail with EBUSY, which it does not natively.
    root_mnt: AtomicU64,
}

/// The mount id of the file `fd` refers to (0 if unknown).
fn mount_id(fd: BorrowedFd<'_>) -> u64 {
    rustix::fs::statx(
        fd,
        c"",
        rustix::fs::AtFlags::EMPTY_PATH,
        rustix::fs::StatxFlags::MNT_ID,
    )
    .map_or(0, |s| s.stx_mnt_id)
}

struct FdEntry {
    fd: Arc<OwnedFd>,
    used: AtomicU64,
}

impl FdCache {
    fn new(cap: usize, always: bool) -> FdCache {
        FdCache {
            cap,
            always,
            feeds: std::sync::atomic::AtomicUsize::new(0),
            generation: AtomicU64::new(0),
            tick: AtomicU64::new(0),
            map: RwLock::new(std::collections::HashMap::new()),
            root_mnt: AtomicU64::new(0),
        }
    }

    fn enabled(&self) -> bool {
        self.cap > 0 && (self.always || self.feeds.load(Ordering::Acquire) > 0)
    }

    fn get(&self, path: &[u8]) -> Option<Arc<OwnedFd>> {
        if !self.enabled() {
            return None;
        }
        let g = self.map.read();
        let e = g.get(path)?;
        e.used
            .store(self.tick.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
        Some(e.fd.clone())
    }

    fn insert(&self, path: &[u8], fd: Arc<OwnedFd>, generation: u64) {
        if !self.enabled() {
            return;
        }
        let root_mnt = self.root_mnt.load(Ordering::Relaxed);
        if root_mnt != 0 && mount_id(fd.as_fd()) != root_mnt {
            return;
        }
        let mut g = self.map.write();
        // Checked under the write lock: clear() bumps the generation under it too.
        if self.generation.load(Ordering::Acquire) != generation {
            return;
        }
        if g.len() >= self.cap && !g.contains_key(path) {
            // Evict the least recently used entry (a linear scan of <= cap entries is cheap
            // next to the syscall that just happened).
            let victim = g
                .iter()
                .min_by_key(|(_, e)| e.used.load(Ordering::Relaxed))
                .map(|(k, _)| k.clone());
            if let Some(k) = victim {
                g.remove(&k);
            }
        }
        let used = AtomicU64::new(self.tick.fetch_add(1, Ordering::Relaxed));
        g.insert(path.to_vec(), FdEntry { fd, used });
    }

    /// Forget every descriptor (they close once no caller holds them).
    pub(crate) fn clear(&self) {
        let mut g = self.map.write();
        self.generation.fetch_add(1, Ordering::AcqRel);
        g.clear();
    }

    fn len(&self) -> usize {
        self.map.read().len()
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
    /// The non-directories answered about: the change feed's inode filter (`served.rs`).
    served: Arc<served::Served>,
    /// The hard-linked files' watches of each running inotify feed (`links.rs`); dead ones
    /// (their feed ended) are pruned when a feed starts.
    links: Mutex<Vec<std::sync::Weak<links::Links>>>,
    /// Whether `links` may hold a live feed's (read before taking its lock).
    any_links: std::sync::atomic::AtomicBool,
    /// Whether the process is root, so mutations can switch fs credentials.
    switch_creds: bool,
    /// The root's device when its file system decides access by mode bits and POSIX ACLs
    /// only ([`GROUPLESS_FS`]): the owner class never consults supplementary groups there,
    /// and a root caller (who keeps CAP_DAC_OVERRIDE) is never refused by them. Files on this
    /// device can be opened for reading without the caller's groups when the caller owns them
    /// (`Backend::open_read_groupless`).
    groupless_dev: Option<u64>,
    watch_mode: WatchMode,
    /// Whether the change feed reports changes made through this backend (default: no).
    pub(crate) report_own_changes: std::sync::atomic::AtomicBool,
    /// Threads that made changes through this backend: the change feed skips their events
    /// (the cache applied those changes already).
    pub(crate) mutators: Arc<Mutex<std::collections::HashSet<i32>>>,
    /// Passthrough writes a front end registered (`own.rs`): the fanotify feed marks their
    /// events.
    pub(crate) own: Arc<own::OwnWrites>,
    watchers: Mutex<Vec<watch::Watcher>>,
}

impl std::fmt::Debug for LocalBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalBackend")
            .field("root", &self.root_path)
            .finish()
    }
}

/// File systems whose access checks are the kernel's mode bits and POSIX ACLs
/// (`generic_permission`): ext2/3/4, XFS, Btrfs, tmpfs, F2FS. Not NFS (a `root_squash`
/// server decides a root caller by its groups, NFSv4 ACLs may refuse an owner by a group
/// entry), not FUSE (the server may decide anything), not overlayfs or others.
const GROUPLESS_FS: [i64; 5] = [0xEF53, 0x5846_5342, 0x9123_683E, 0x0102_1994, 0xF2F5_2010];

/// The device of the directory `root` when its file system is one of [`GROUPLESS_FS`].
fn groupless_dev(root: BorrowedFd<'_>) -> Option<u64> {
    let fs = rustix::fs::fstatfs(root).ok()?;
    #[allow(clippy::unnecessary_cast)]
    let kind = fs.f_type as i64;
    if !GROUPLESS_FS.contains(&kind) {
        return None;
    }
    rustix::fs::fstat(root).ok().map(|st| st.st_dev)
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

/// Check a backend path ("" is the root). Its length is not limited: PATH_MAX bounds one
/// syscall's path argument, not how deep a file lies, and [`LocalBackend::dir`] resolves
/// long paths in pieces shorter than PATH_MAX. Every component is checked (no `..`, no `.`,
/// no empty component, none over NAME_MAX), which is what keeps resolution beneath the root.
fn check_path(path: &[u8]) -> Result<()> {
    if path.is_empty() {
        return Ok(());
    }
    path.split(|&b| b == b'/').try_for_each(check_name)
}

/// Backend paths up to this many bytes are resolved with one openat2 from the root; longer
/// ones in pieces of at most this many bytes, each cut at a `/` (a piece always fits: names are
/// at most NAME_MAX bytes).
const CHUNK: usize = PATH_MAX - 1;

/// The end offsets of the pieces a path longer than [`CHUNK`] is resolved in: each piece is
/// the longest run of whole components starting after the previous cut that fits in CHUNK
/// bytes. Cuts depend only on the bytes before them, so a directory and everything below it
/// share their cuts, and descriptors cached at a cut serve deeper paths too. The last end is
/// `path.len()`.
fn chunk_ends(path: &[u8]) -> Vec<usize> {
    let mut ends = Vec::with_capacity(path.len() / CHUNK + 1);
    let mut start = 0;
    while path.len() - start > CHUNK {
        // A `/` at offset start + CHUNK still leaves a piece of CHUNK bytes before it.
        let window = &path[start..=start + CHUNK];
        match window.iter().rposition(|&b| b == b'/') {
            Some(i) if i > 0 => {
                ends.push(start + i);
                start += i + 1;
            }
            // Cannot happen for a checked path (components are <= NAME_MAX < CHUNK).
            _ => break,
        }
    }
    ends.push(path.len());
    ends
}

/// Open `path` (a backend path: no `.`, `..` or empty components; "." for `base` itself)
/// beneath the directory `base`, never following a symlink, with open(2) `flags`. A path
/// longer than one syscall takes is resolved in the pieces [`chunk_ends`] cuts, each
/// openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS) from the previous
/// piece's O_PATH descriptor. Used by `Backend::open_verified` (a front end's ioctls, fsyncdir
/// and ctime touches); the backend's other calls cache the pieces.
pub fn open_beneath(
    base: BorrowedFd<'_>,
    path: &[u8],
    flags: OFlags,
) -> std::result::Result<OwnedFd, rustix::io::Errno> {
    let ends = chunk_ends(path);
    let mut cur: Option<OwnedFd> = None;
    let mut begin = 0;
    for (i, &end) in ends.iter().enumerate() {
        let at = cur.as_ref().map_or(base, |f| f.as_fd());
        let last = i + 1 == ends.len();
        let fl = if last {
            flags
        } else {
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC
        };
        cur = Some(rustix::fs::openat2(
            at,
            &path[begin..end],
            fl,
            Mode::empty(),
            RESOLVE,
        )?);
        begin = end + 1;
    }
    cur.ok_or(rustix::io::Errno::INVAL)
}

/// utimensat(2) timestamps for a setattr's atime and mtime (UTIME_OMIT when not set).
pub fn timestamps(atime: Option<TimeSet>, mtime: Option<TimeSet>) -> rustix::fs::Timestamps {
    dircache_core::file::timestamps(atime, mtime)
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

pub(crate) fn attr_from_statx(s: &rustix::fs::Statx) -> Attr {
    Attr::from_statx(s)
}

fn statx_at(dir: BorrowedFd<'_>, name: &[u8]) -> Result<Attr> {
    let s = rustix::fs::statx(
        dir,
        name,
        AtFlags::SYMLINK_NOFOLLOW,
        StatxFlags::BASIC_STATS | StatxFlags::BTIME,
    )
    .map_err(errno)?;
    Ok(attr_from_statx(&s))
}

fn statx_fd(fd: BorrowedFd<'_>) -> Result<Attr> {
    let s = rustix::fs::statx(
        fd,
        c"",
        AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW,
        StatxFlags::BASIC_STATS | StatxFlags::BTIME,
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

impl LocalBackend {
    /// Whether watchers started from now on report changes made through this backend
    /// (default: no, since the cache above applied them already). Changes are attributed by
    /// thread: events of threads that ever mutated through this backend are skipped, other
    /// threads' (and other processes') are reported. fanotify only: inotify cannot tell who
    /// made a change.
    pub fn set_report_own_changes(&self, on: bool) {
        self.report_own_changes.store(on, Ordering::Relaxed);
    }

    /// A backend over directory `root`. Its descriptor cache (256 directories) is used only
    /// while a change feed ([`Backend::watch`]) runs, because the feed is what empties it when
    /// directories are renamed or removed outside; without a feed every call resolves afresh,
    /// so an explicit invalidation in the cache above always sees the current tree.
    pub fn new(root: &Path) -> Result<LocalBackend> {
        Self::build(root, DEFAULT_FD_CACHE, false, WatchMode::Auto)
    }

    /// A backend over `root` that always keeps up to `fd_cache` directory descriptors (0:
    /// none), feed or not: the caller must call [`LocalBackend::forget_cached_fds`] after
    /// changing directories outside the backend. Changes are reported with `watch_mode`.
    pub fn with_options(
        root: &Path,
        fd_cache: usize,
        watch_mode: WatchMode,
    ) -> Result<LocalBackend> {
        Self::build(root, fd_cache, true, watch_mode)
    }

    fn build(
        root: &Path,
        fd_cache: usize,
        always: bool,
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
        let groupless_dev = groupless_dev(fd.as_fd());
        let fds = FdCache::new(fd_cache, always);
        fds.root_mnt.store(mount_id(fd.as_fd()), Ordering::Relaxed);
        Ok(LocalBackend {
            root: fd,
            root_path,
            fds: Arc::new(fds),
            served: Arc::default(),
            links: Mutex::default(),
            any_links: std::sync::atomic::AtomicBool::new(false),
            switch_creds,
            groupless_dev,
            watch_mode,
            report_own_changes: std::sync::atomic::AtomicBool::new(false),
            mutators: Arc::default(),
            own: Arc::default(),
            watchers: Mutex::new(Vec::new()),
        })
    }

    /// `statx_at`, noted for the change feed (`served.rs`; a hard-linked file watched by
    /// an inotify feed, `links.rs`).
    fn noted_at(&self, dir: BorrowedFd<'_>, name: &[u8]) -> Result<Attr> {
        let a = statx_at(dir, name)?;
        self.served.note(&a);
        Ok(self.watch_link(a, || {
            rustix::fs::openat(
                dir,
                name,
                OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .ok()
        }))
    }

    /// `statx_fd`, noted for the change feed (`served.rs`, `links.rs`).
    fn noted_fd(&self, fd: BorrowedFd<'_>) -> Result<Attr> {
        let a = statx_fd(fd)?;
        self.served.note(&a);
        Ok(self.watch_link(a, || fd.try_clone_to_owned().ok()))
    }

    /// While an inotify feed runs, watch the hard-linked file `a` describes (`links.rs`);
    /// the attributes to answer with.
    fn watch_link(&self, a: Attr, open: impl Fn() -> Option<OwnedFd>) -> Attr {
        if !links::wanted(&a) || !self.any_links.load(Ordering::Acquire) {
            return a;
        }
        let live: Vec<Arc<links::Links>> = self
            .links
            .lock()
            .iter()
            .filter_map(|l| l.upgrade())
            .collect();
        live.iter().fold(a, |a, l| l.watch(a, &open))
    }

    /// An inotify feed starts: its hard-linked files' watches (`links.rs`).
    pub(crate) fn add_links(&self, l: &Arc<links::Links>) {
        let mut v = self.links.lock();
        v.retain(|w| w.strong_count() > 0);
        v.push(Arc::downgrade(l));
        self.any_links.store(true, Ordering::Release);
    }

    /// Whether this backend's fanotify change feed reports inode-only events about
    /// `(dev, ino)`: whether the backend ever answered about that non-directory
    /// (`served.rs`). For tests, which must pick inodes the filter does not know.
    #[doc(hidden)]
    pub fn feed_knows_inode(&self, dev: u64, ino: u64) -> bool {
        self.served.contains(dev, ino)
    }

    /// Whether a change feed of this backend runs that reports the changes made through
    /// the backend itself (inotify cannot tell them from others'; fanotify leaves them out
    /// by thread unless `set_report_own_changes`). False before any feed started.
    pub fn feed_reports_own_changes(&self) -> bool {
        self.watchers.lock().iter().any(|w| !w.skips_own)
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
    ///
    /// A path of up to [`CHUNK`] bytes takes one openat2 from the root. A longer one (a
    /// directory deeper than PATH_MAX allows one syscall to name) is resolved piece by piece
    /// ([`chunk_ends`]): each piece with openat2 from the previous piece's descriptor, with the
    /// same RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS, so no symlink is followed anywhere and no
    /// piece leaves the directory it starts from (pieces have no `..`). The descriptors at the
    /// cuts go to the descriptor cache too, so the next deep path below starts from the
    /// deepest cut cached.
    fn dir(&self, path: &[u8]) -> Result<DirFd<'_>> {
        check_path(path)?;
        if path.is_empty() {
            return Ok(DirFd::Root(self.root.as_fd()));
        }
        if let Some(fd) = self.fds.get(path) {
            return Ok(DirFd::Shared(fd));
        }
        let generation = self.fds.generation.load(Ordering::Acquire);
        let fd = if path.len() <= CHUNK {
            Arc::new(Self::open_path_dir(self.root.as_fd(), path)?)
        } else {
            self.open_deep_dir(path, generation)?
        };
        self.fds.insert(path, fd.clone(), generation);
        Ok(DirFd::Shared(fd))
    }

    /// Resolve a path longer than CHUNK in pieces (see [`LocalBackend::dir`]).
    fn open_deep_dir(&self, path: &[u8], generation: u64) -> Result<Arc<OwnedFd>> {
        let ends = chunk_ends(path);
        // Start after the deepest cut whose descriptor is cached (the last end is the whole
        // path, already looked up by the caller).
        let cuts = &ends[..ends.len() - 1];
        let mut start = None;
        for (i, &end) in cuts.iter().enumerate().rev() {
            if let Some(fd) = self.fds.get(&path[..end]) {
                start = Some((i + 1, fd));
                break;
            }
        }
        let (first, mut cur) = match start {
            Some((i, fd)) => (i, Some(fd)),
            None => (0, None),
        };
        for (i, &end) in ends.iter().enumerate().skip(first) {
            let begin = if i == 0 { 0 } else { ends[i - 1] + 1 };
            let base = match &cur {
                Some(fd) => fd.as_fd(),
                None => self.root.as_fd(),
            };
            let fd = Arc::new(Self::open_path_dir(base, &path[begin..end])?);
            if end < path.len() {
                self.fds.insert(&path[..end], fd.clone(), generation);
            }
            cur = Some(fd);
        }
        cur.ok_or(Error::Invalid)
    }

    /// Open the directory `rel` (at most CHUNK bytes, checked components) below `base` as
    /// O_PATH, beneath `base` and without following any symlink.
    fn open_path_dir(base: BorrowedFd<'_>, rel: &[u8]) -> Result<OwnedFd> {
        rustix::fs::openat2(
            base,
            rel,
            // No O_NOFOLLOW: with RESOLVE_NO_SYMLINKS a final symlink then fails with ELOOP
            // (with O_PATH|O_NOFOLLOW the kernel would hand out the link itself).
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            RESOLVE,
        )
        .map_err(errno)
    }

    /// Remember that this thread mutates through the backend: the change feed skips its
    /// events (the cache applied those changes already), unless `set_report_own_changes`.
    fn note_mutator(&self) {
        thread_local! {
            /// This thread's id: asked once (one `gettid` per mutation before).
            static TID: i32 = rustix::thread::gettid().as_raw_nonzero().get();
        }
        let tid = TID.with(|t| *t);
        let mut m = self.mutators.lock();
        if !m.contains(&tid) {
            m.insert(tid);
        }
    }

    /// Switch this thread to `cred` for a read (read-only opens, xattr reads): the fs uid
    /// switch alone ([`Caps::FsOnly`]); nothing when the daemon is not root.
    fn act_as(&self, cred: &Cred) -> Result<ActAs> {
        ActAs::when(self.switch_creds, cred, Caps::FsOnly)
    }

    /// Run mutation `f` as `cred` (also opens that may write and xattr writes). For a caller other than root no effective capability is kept
    /// but CAP_SYS_ADMIN ([`Caps::AdminOnly`]), as on the FUSE data path: a user's mutation
    /// gets no CAP_SYS_RESOURCE (quotas, blocks reserved for root), CAP_SETFCAP (file
    /// capabilities) or any other capability the daemon holds and the user does not.
    fn as_cred<T>(&self, cred: &Cred, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.note_mutator();
        let _g = ActAs::when(self.switch_creds, cred, Caps::AdminOnly { shared: false })?;
        f()
    }

    /// Run a mutation that may move or remove a directory (rename, rmdir) as `cred`, then
    /// empty the descriptor cache: a cached descriptor must never answer for a path that now
    /// names another directory or none. Mutations that only add names, or change attributes,
    /// cannot make a cached directory descriptor wrong and leave the cache alone.
    fn as_cred_structural<T>(&self, cred: &Cred, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let r = self.as_cred(cred, f);
        // Cleared after the syscall: a resolution racing with it either started after the
        // clear (and sees the new tree) or is refused by the generation check.
        self.fds.clear();
        r
    }

    /// Whether a call made relative to directory descriptor `d` must be made again on a
    /// fresh one: it failed with ENOENT, and `d`'s directory has been removed (no links). A
    /// cached descriptor answers for its path until the change feed empties the cache, which
    /// it does only when it reads the event: a directory removed or replaced outside (another
    /// renamed over it) kept its descriptor meanwhile, and a creation in it failed with
    /// ENOENT where natively it lands in the directory the path names now (torture seed 540:
    /// `write(MNT/d2/e0/f3)` right after `rename(SRC/d1/e1, SRC/d2/e0)`). The cache is emptied
    /// then (the directory's descendants went with it). Costs one fstat, on ENOENT only. Not
    /// caught: a directory moved elsewhere (still linked) still answers for its old path
    /// until the feed's report (see the crate documentation).
    fn removed_dir<T>(&self, d: &DirFd<'_>, r: &Result<T>) -> bool {
        let removed = matches!(r, Err(Error::NotFound))
            && matches!(d, DirFd::Shared(_))
            && rustix::fs::fstat(d.as_fd()).is_ok_and(|st| st.st_nlink == 0);
        if removed {
            self.fds.clear();
        }
        removed
    }

    fn attr_of(&self, path: &[u8]) -> Result<Attr> {
        let (dir, name) = split(path)?;
        let d = self.dir(dir)?;
        self.noted_at(d.as_fd(), name)
    }

    fn cpath(name: &[u8]) -> Result<CString> {
        CString::new(name).map_err(|_| Error::Invalid)
    }

    /// chown, chmod, truncate, utimens of `dfd/name`, never following a final symlink. Runs
    /// under the caller's credentials, so the kernel decides who may do what.
    fn setattr_at(dfd: BorrowedFd<'_>, name: &[u8], set: &SetAttr) -> Result<()> {
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
            let times = timestamps(set.atime, set.mtime);
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
                match self.noted_at(rd.as_fd(), name) {
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
        self.noted_at(d.as_fd(), name)
    }

    /// One statx per component, each directory opened relative to the previous one (or taken
    /// from the descriptor cache), instead of the default's re-resolution from the root for
    /// every component.
    fn walk(&self, dir: &[u8], names: &[&[u8]]) -> Walked {
        let mut out = Walked::default();
        if names.is_empty() {
            return out;
        }
        let mut cur = match self.dir(dir) {
            Ok(d) => d,
            Err(e) => {
                out.error = Some(e);
                return out;
            }
        };
        let mut path = dir.to_vec();
        for (i, name) in names.iter().enumerate() {
            let a = match check_name(name).and_then(|_| self.noted_at(cur.as_fd(), name)) {
                Ok(a) => a,
                Err(e) => {
                    out.error = Some(e);
                    break;
                }
            };
            out.attrs.push(a);
            if i + 1 == names.len() {
                break;
            }
            if !a.is_dir() {
                // As the trait's default: a symlink is not followed either.
                out.error = Some(Error::NotDir);
                break;
            }
            path = join(&path, name);
            let next = match self.fds.get(&path) {
                Some(fd) => Ok(DirFd::Shared(fd)),
                None => {
                    let generation = self.fds.generation.load(Ordering::Acquire);
                    rustix::fs::openat2(
                        cur.as_fd(),
                        *name,
                        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                        Mode::empty(),
                        RESOLVE,
                    )
                    .map_err(errno)
                    .map(|fd| {
                        let fd = Arc::new(fd);
                        self.fds.insert(&path, fd.clone(), generation);
                        DirFd::Shared(fd)
                    })
                }
            };
            match next {
                Ok(d) => cur = d,
                Err(e) => {
                    // Replaced since the statx: report the error for this component.
                    out.attrs.pop();
                    out.error = Some(e);
                    break;
                }
            }
        }
        out
    }

    fn getattr(&self, path: &[u8]) -> Result<Attr> {
        if path.is_empty() {
            return self.noted_fd(self.root.as_fd());
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
        // The kernel decides which types mknod may create (EPERM for S_IFDIR, EINVAL for
        // S_IFLNK or garbage), and that devices need CAP_MKNOD.
        let cname = Self::cpath(name)?;
        let make = |d: &DirFd<'_>| {
            self.as_cred(cred, || {
                // SAFETY: d is a live descriptor, cname is NUL-terminated, mode/rdev are
                // integers.
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
                Ok(())
            })
        };
        let mut d = self.dir(dir)?;
        let mut r = make(&d);
        if self.removed_dir(&d, &r) {
            d = self.dir(dir)?;
            r = make(&d);
        }
        r?;
        self.noted_at(d.as_fd(), name)
    }

    fn mkdir(&self, cred: &Cred, path: &[u8], mode: u32) -> Result<Attr> {
        let (dir, name) =
            split(path).map_err(|e| if e == Error::Busy { Error::Exists } else { e })?;
        let make = |d: &DirFd<'_>| {
            self.as_cred(cred, || {
                rustix::fs::mkdirat(d.as_fd(), name, Mode::from_raw_mode(mode & 0o7777))
                    .map_err(errno)
            })
        };
        let mut d = self.dir(dir)?;
        let mut r = make(&d);
        if self.removed_dir(&d, &r) {
            d = self.dir(dir)?;
            r = make(&d);
        }
        r?;
        self.noted_at(d.as_fd(), name)
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
        let make = |d: &DirFd<'_>| {
            self.as_cred(cred, || {
                rustix::fs::symlinkat(target, d.as_fd(), name).map_err(errno)
            })
        };
        let mut d = self.dir(dir)?;
        let mut r = make(&d);
        if self.removed_dir(&d, &r) {
            d = self.dir(dir)?;
            r = make(&d);
        }
        r?;
        self.noted_at(d.as_fd(), name)
    }

    fn link(&self, cred: &Cred, old: &[u8], new: &[u8]) -> Result<Attr> {
        let (odir, oname) =
            split(old).map_err(|e| if e == Error::Busy { Error::Perm } else { e })?;
        let (ndir, nname) =
            split(new).map_err(|e| if e == Error::Busy { Error::Exists } else { e })?;
        let od = self.dir(odir)?;
        let nd = match self.dir(ndir) {
            Ok(nd) => nd,
            Err(e) => {
                // link(2) looks the old name up completely before the new parent: its error
                // (search permission on the old parent, a missing old name) comes first.
                self.as_cred(cred, || self.noted_at(od.as_fd(), oname))?;
                return Err(e);
            }
        };
        let make = |od: &DirFd<'_>, nd: &DirFd<'_>| {
            self.as_cred(cred, || {
                rustix::fs::linkat(od.as_fd(), oname, nd.as_fd(), nname, AtFlags::empty())
                    .map_err(errno)
            })
        };
        let r = make(&od, &nd);
        if self.removed_dir(&od, &r) || self.removed_dir(&nd, &r) {
            let (od, nd) = (self.dir(odir)?, self.dir(ndir)?);
            make(&od, &nd)?;
            return self.noted_at(nd.as_fd(), nname);
        }
        r?;
        self.noted_at(nd.as_fd(), nname)
    }

    fn unlink(&self, cred: &Cred, path: &[u8]) -> Result<()> {
        let (dir, name) =
            split(path).map_err(|e| if e == Error::Busy { Error::IsDir } else { e })?;
        let remove = |d: &DirFd<'_>| {
            self.as_cred(cred, || {
                rustix::fs::unlinkat(d.as_fd(), name, AtFlags::empty()).map_err(errno)
            })
        };
        let d = self.dir(dir)?;
        let r = remove(&d);
        if self.removed_dir(&d, &r) {
            return remove(&self.dir(dir)?);
        }
        r
    }

    fn rmdir(&self, cred: &Cred, path: &[u8]) -> Result<()> {
        let (dir, name) = split(path)?;
        let remove = |d: &DirFd<'_>| {
            self.as_cred_structural(cred, || {
                rustix::fs::unlinkat(d.as_fd(), name, AtFlags::REMOVEDIR).map_err(errno)
            })
        };
        let d = self.dir(dir)?;
        let r = remove(&d);
        if self.removed_dir(&d, &r) {
            return remove(&self.dir(dir)?);
        }
        r
    }

    fn rename(&self, cred: &Cred, old: &[u8], new: &[u8], mode: RenameMode) -> Result<()> {
        let (odir, oname) = split(old)?;
        let (ndir, nname) = split(new)?;
        let flags = match mode {
            RenameMode::Replace => RenameFlags::empty(),
            RenameMode::NoReplace => RenameFlags::NOREPLACE,
            RenameMode::Exchange => RenameFlags::EXCHANGE,
            RenameMode::Whiteout => RenameFlags::WHITEOUT,
            RenameMode::WhiteoutNoReplace => RenameFlags::WHITEOUT | RenameFlags::NOREPLACE,
        };
        let od = self.dir(odir)?;
        let nd = match self.dir(ndir) {
            Ok(nd) => nd,
            Err(e) => {
                // rename(2) walks the old parent (search permission on it included) first.
                self.as_cred(cred, || self.noted_at(od.as_fd(), b"."))?;
                return Err(e);
            }
        };
        let mv = |od: &DirFd<'_>, nd: &DirFd<'_>| {
            self.as_cred_structural(cred, || {
                rustix::fs::renameat_with(od.as_fd(), oname, nd.as_fd(), nname, flags)
                    .map_err(errno)
            })
        };
        let r = mv(&od, &nd);
        if self.removed_dir(&od, &r) || self.removed_dir(&nd, &r) {
            return mv(&self.dir(odir)?, &self.dir(ndir)?);
        }
        r
    }

    fn setattr(&self, cred: &Cred, path: &[u8], set: &SetAttr) -> Result<Attr> {
        if path.is_empty() {
            // The root has no parent here (it may be "/"): use its descriptor itself with
            // AT_EMPTY_PATH.
            self.as_cred(cred, || self.setattr_root(set))?;
            return self.noted_fd(self.root.as_fd());
        }
        let (dir, name) = split(path)?;
        let set_at = |d: &DirFd<'_>| self.as_cred(cred, || Self::setattr_at(d.as_fd(), name, set));
        let mut d = self.dir(dir)?;
        let mut r = set_at(&d);
        if self.removed_dir(&d, &r) {
            d = self.dir(dir)?;
            r = set_at(&d);
        }
        r?;
        self.noted_at(d.as_fd(), name)
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

    fn open(
        &self,
        cred: &Cred,
        path: &[u8],
        flags: i32,
        mode: u32,
    ) -> Result<Box<dyn BackendFile>> {
        self.open_fd(cred, path, flags, mode)
            .map(|fd| self.file(fd))
    }

    fn open_read_groupless(
        &self,
        cred: &Cred,
        path: &[u8],
        flags: i32,
    ) -> Result<Option<Box<dyn BackendFile>>> {
        Ok(self
            .open_fd_groupless(cred, path, flags)
            .map(|fd| self.file(fd)))
    }

    fn opens_groupless(&self) -> bool {
        self.switch_creds && self.groupless_dev.is_some()
    }

    fn open_verified(
        &self,
        _cred: &Cred,
        target: XattrTarget<'_>,
        flags: i32,
    ) -> Result<Box<dyn BackendFile>> {
        // Resolved as the daemon (module docs of `Backend::open_verified`), never through a
        // symlink, beneath the root.
        let pfd = match target.open {
            Some(fd) => fd.try_clone_to_owned().map_err(Error::from)?,
            None => {
                check_path(target.path)?;
                let p: &[u8] = if target.path.is_empty() {
                    b"."
                } else {
                    target.path
                };
                open_beneath(
                    self.root.as_fd(),
                    p,
                    OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                )
                .map_err(errno)?
            }
        };
        // The same `(dev, ino)` and birth time: a file made at the name since, with the
        // removed one's inode number, is another file (the kernel checked the caller's open
        // against the old one's attributes).
        let o_path = flags & libc::O_PATH != 0;
        let a = if target.expect.is_some() || !o_path {
            Some(statx_fd(pfd.as_fd())?)
        } else {
            None
        };
        if a.as_ref().is_some_and(|a| !target.is(a)) {
            return Err(Error::Stale);
        }
        if o_path {
            return Ok(self.file(pfd));
        }
        // Only files and directories are opened: a FIFO would hold this thread until someone
        // opens it for writing (see `open_fd`).
        if !a.is_some_and(|a| matches!(a.kind(), FileType::Regular | FileType::Directory)) {
            return Err(Error::Stale);
        }
        if flags & libc::O_ACCMODE != libc::O_RDONLY {
            // Writes through it are this thread's: the change feed skips them, as after
            // `open` for writing.
            self.note_mutator();
        }
        // The very inode checked above, not the path again.
        let proc = CString::new(format!("/proc/self/fd/{}", pfd.as_raw_fd()))
            .map_err(|_| Error::Invalid)?;
        let fd = rustix::fs::open(
            proc.as_c_str(),
            OFlags::from_bits_retain(flags as u32) | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(errno)?;
        Ok(self.file(fd))
    }

    fn getxattr(&self, cred: &Cred, target: XattrTarget<'_>, name: &[u8]) -> Result<Vec<u8>> {
        self.getxattr_impl(cred, target, name)
    }

    fn listxattr(&self, cred: &Cred, target: XattrTarget<'_>) -> Result<Vec<u8>> {
        self.listxattr_impl(cred, target)
    }

    fn setxattr(
        &self,
        cred: &Cred,
        target: XattrTarget<'_>,
        name: &[u8],
        value: &[u8],
        flags: i32,
    ) -> Result<()> {
        self.setxattr_impl(cred, target, name, value, flags)
    }

    fn removexattr(&self, cred: &Cred, target: XattrTarget<'_>, name: &[u8]) -> Result<()> {
        self.removexattr_impl(cred, target, name)
    }

    fn watch(&self) -> Result<Option<ChangeFeed>> {
        if self.watch_mode == WatchMode::Off {
            return Ok(None);
        }
        let (w, rx) = watch::Watcher::start(self, self.watch_mode)?;
        self.watchers.lock().push(w);
        Ok(Some(rx))
    }

    fn own_writes_begin(&self, token: u64, tid: i32, file: &dyn BackendFile) {
        if let Some(fd) = file.fd() {
            self.own.begin(token, tid, fd);
        }
    }

    fn own_writes_end(&self, token: u64) {
        self.own.end(token);
    }

    fn own_write_change(&self, change: &Change) -> bool {
        match change {
            Change::Attr { path } => self.own.take(path),
            _ => false,
        }
    }
}

/// The kernel's `__FMODE_EXEC` open flag: set only by execve(2) (and uselib) after the
/// kernel checked MAY_EXEC; open(2) and openat2(2) cannot set it.
const FMODE_EXEC: i32 = 0o40;

impl LocalBackend {
    /// Open a program the kernel is about to run for `cred`. An execute-only file (0711) is
    /// runnable but not readable by its runner, so it cannot be opened for reading as the
    /// caller: the name is resolved as the caller (O_PATH, search permission on the parent
    /// as for any open), that inode is checked to be a regular file the caller may execute
    /// (faccessat2 as the caller), and that very inode (not the path again) is reopened for
    /// reading as the daemon through /proc/self/fd. The descriptor serves only the kernel's
    /// exec of it: the caller's own open(2) for reading is refused by the kernel first.
    /// An open file of this backend over `fd`: its mutations run as the requester
    /// ([`creds::data_path_caller`]) when the daemon switches credentials.
    fn file(&self, fd: OwnedFd) -> Box<dyn BackendFile> {
        let f = FdFile::new(fd);
        Box::new(if self.switch_creds {
            f.acting_as(creds::data_path_caller)
        } else {
            f
        })
    }

    /// [`Backend::open`]'s descriptor.
    /// The open of [`Backend::open_read_groupless`]: `dir/name` opened for reading as
    /// `cred`'s uid and gid with no supplementary groups, kept only when the file and the
    /// directory it is opened from (the two inodes the open checks as the caller: search on
    /// the directory, read on the file; the directory's descriptor was resolved as the
    /// daemon) are regular file and directory on [`LocalBackend::groupless_dev`] and owned by
    /// the caller, or the caller is root (whose open keeps CAP_DAC_OVERRIDE, `Caps::FsOnly`).
    /// Then the groups could not have changed the outcome: the owner class is decided by the
    /// owner's bits (the ACL's `user::` entry) before any group is looked at. Read on the
    /// opened files, not on what the cache believes. Anything else, a failed open included
    /// (its error may depend on the groups), is `None`: open with the groups.
    fn open_fd_groupless(&self, cred: &Cred, path: &[u8], flags: i32) -> Option<OwnedFd> {
        let dev = self.groupless_dev?;
        if !self.switch_creds
            || path.is_empty()
            || flags & libc::O_ACCMODE != libc::O_RDONLY
            || flags & (libc::O_TRUNC | libc::O_CREAT | libc::O_DIRECTORY | FMODE_EXEC) != 0
        {
            return None;
        }
        check_path(path).ok()?;
        let known = libc::O_ACCMODE
            | libc::O_NONBLOCK
            | libc::O_DSYNC
            | libc::O_SYNC
            | libc::O_DIRECT
            | libc::O_NOATIME
            | libc::O_LARGEFILE;
        let oflags =
            OFlags::from_bits_retain((flags & known) as u32) | OFlags::CLOEXEC | OFlags::NOFOLLOW;
        let (dir, name) = split(path).ok()?;
        let d = self.dir(dir).ok()?;
        let bare = Cred::new(cred.uid, cred.gid, []);
        // O_NONBLOCK as in `open_fd`: a FIFO renamed over the name must not hold the thread.
        let fd = {
            let _g = self.act_as(&bare).ok()?;
            rustix::fs::openat2(
                d.as_fd(),
                name,
                oflags | OFlags::NONBLOCK,
                Mode::empty(),
                RESOLVE,
            )
            .ok()?
        };
        let st = rustix::fs::fstat(&fd).ok()?;
        let ds = rustix::fs::fstat(d.as_fd()).ok()?;
        let owned = |uid: u32| cred.uid == 0 || uid == cred.uid;
        let decided = st.st_mode & libc::S_IFMT == libc::S_IFREG
            && ds.st_mode & libc::S_IFMT == libc::S_IFDIR
            && st.st_dev == dev
            && ds.st_dev == dev
            && owned(st.st_uid)
            && owned(ds.st_uid);
        if !decided {
            return None;
        }
        if !oflags.contains(OFlags::NONBLOCK) {
            let fl = rustix::fs::fcntl_getfl(&fd).ok()?;
            rustix::fs::fcntl_setfl(&fd, fl - OFlags::NONBLOCK).ok()?;
        }
        Some(fd)
    }

    fn open_fd(&self, cred: &Cred, path: &[u8], flags: i32, mode: u32) -> Result<OwnedFd> {
        check_path(path)?;
        if flags & FMODE_EXEC != 0
            && flags & libc::O_ACCMODE == libc::O_RDONLY
            && flags & (libc::O_TRUNC | libc::O_CREAT) == 0
        {
            return self.open_exec(cred, path);
        }
        // openat2 rejects unknown flag bits with EINVAL, and FUSE passes on kernel-internal
        // ones (e.g. __FMODE_EXEC for execve): keep only the open(2) flags that mean something
        // for a regular file here.
        let known = libc::O_ACCMODE
            | libc::O_APPEND
            | libc::O_TRUNC
            | libc::O_CREAT
            | libc::O_EXCL
            | libc::O_NONBLOCK
            | libc::O_DSYNC
            | libc::O_SYNC
            | libc::O_DIRECT
            | libc::O_NOATIME
            | libc::O_LARGEFILE
            | libc::O_DIRECTORY;
        let oflags =
            OFlags::from_bits_retain((flags & known) as u32) | OFlags::CLOEXEC | OFlags::NOFOLLOW;
        let m = Mode::from_raw_mode(mode & 0o7777);
        let writes = flags & libc::O_ACCMODE != libc::O_RDONLY || oflags.contains(OFlags::CREATE);
        // Only a descriptor that may write makes this thread a mutator (as_cred marks it).
        let run = |f: &dyn Fn() -> Result<OwnedFd>| -> Result<OwnedFd> {
            if writes {
                self.as_cred(cred, f)
            } else {
                let _g = self.act_as(cred)?;
                f()
            }
        };
        if path.is_empty() {
            return run(&|| {
                rustix::fs::openat2(&self.root, c".", oflags, m, RESOLVE).map_err(errno)
            });
        }
        let (dir, name) = split(path)?;
        let mut d = self.dir(dir)?;
        // Never blocked by what a user put at the name: the kernel sends OPEN and CREATE only
        // for regular files and directories, but a FIFO renamed over the name in SRC since its
        // lookup would hold this request thread in open(2) until someone opens it for writing
        // (one user could so stop every thread of the mount). Opened O_NONBLOCK (a FIFO
        // without a writer opens at once, or fails ENXIO), anything but a regular file or a
        // directory is refused as another inode than the kernel's (ESTALE: it looks the name
        // up again and opens a FIFO itself, in the caller's process), and O_NONBLOCK is then
        // taken off again unless the caller asked for it.
        let asked_nonblock = oflags.contains(OFlags::NONBLOCK);
        let open = |d: &DirFd<'_>| {
            run(&|| {
                rustix::fs::openat2(d.as_fd(), name, oflags | OFlags::NONBLOCK, m, RESOLVE)
                    .map_err(errno)
            })
        };
        let mut opened = open(&d);
        if self.removed_dir(&d, &opened) {
            d = self.dir(dir)?;
            opened = open(&d);
        }
        let fd = match opened {
            // A lease on the file (the only way O_NONBLOCK fails an open of a regular file):
            // wait for its break as a blocking open would, on the inode checked to be one.
            Err(Error::Os(libc::EAGAIN)) if !asked_nonblock => {
                if dircache_core::lease::lease_waits_deferred() {
                    // The caller waits elsewhere (`dircache_core::defer_lease_waits`: a FUSE
                    // front end's request threads serve every user; docs/security.md P12).
                    dircache_core::lease::note_lease_wait_deferred();
                    return Err(Error::Os(libc::EAGAIN));
                }
                return self.open_regular_blocking(cred, d.as_fd(), name, oflags, writes);
            }
            // What a FIFO without a reader (O_WRONLY | O_NONBLOCK) or a socket answers: not
            // the regular file or directory the kernel named either.
            Err(Error::Os(libc::ENXIO)) => return Err(Error::Stale),
            r => r?,
        };
        match rustix::fs::fstat(&fd).map_err(errno)?.st_mode & libc::S_IFMT {
            libc::S_IFREG | libc::S_IFDIR => {}
            _ => return Err(Error::Stale),
        }
        if !asked_nonblock {
            let fl = rustix::fs::fcntl_getfl(&fd).map_err(errno)?;
            rustix::fs::fcntl_setfl(&fd, fl - OFlags::NONBLOCK).map_err(errno)?;
        }
        Ok(fd)
    }

    /// The blocking open of `dfd/name` that a lease made fail with O_NONBLOCK: resolved
    /// `O_PATH` as the caller, checked to be a regular file, and reopened through
    /// `/proc/self/fd` as the caller (the kernel checks access on that inode and waits for
    /// the lease's break). The file exists, so O_CREAT and O_EXCL no longer apply.
    fn open_regular_blocking(
        &self,
        cred: &Cred,
        dfd: BorrowedFd<'_>,
        name: &[u8],
        oflags: OFlags,
        writes: bool,
    ) -> Result<OwnedFd> {
        let p = {
            let _g = self.act_as(cred)?;
            rustix::fs::openat2(
                dfd,
                name,
                OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
                RESOLVE,
            )
            .map_err(errno)?
        };
        if rustix::fs::fstat(&p).map_err(errno)?.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(Error::Stale);
        }
        let proc =
            CString::new(format!("/proc/self/fd/{}", p.as_raw_fd())).map_err(|_| Error::Invalid)?;
        let flags = oflags - (OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW);
        let reopen = || rustix::fs::open(proc.as_c_str(), flags, Mode::empty()).map_err(errno);
        if writes {
            self.as_cred(cred, reopen)
        } else {
            let _g = self.act_as(cred)?;
            reopen()
        }
    }

    fn open_exec(&self, cred: &Cred, path: &[u8]) -> Result<OwnedFd> {
        let (dir, name) = split(path).map_err(|_| Error::Access)?;
        let d = self.dir(dir)?;
        let p = {
            let _g = self.act_as(cred)?;
            let p = rustix::fs::openat2(
                d.as_fd(),
                name,
                OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
                RESOLVE,
            )
            .map_err(errno)?;
            // SAFETY: p is a live descriptor, the path is "" (with AT_EMPTY_PATH), the other
            // arguments are integers.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_faccessat2,
                    p.as_raw_fd(),
                    c"".as_ptr(),
                    libc::X_OK,
                    libc::AT_EMPTY_PATH | libc::AT_EACCESS,
                )
            };
            if r < 0 {
                return Err(last_err());
            }
            p
        };
        if self.noted_fd(p.as_fd())?.kind() != FileType::Regular {
            return Err(Error::Access);
        }
        let proc =
            CString::new(format!("/proc/self/fd/{}", p.as_raw_fd())).map_err(|_| Error::Invalid)?;
        rustix::fs::open(
            proc.as_c_str(),
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(errno)
    }

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
            let t = timestamps(set.atime, set.mtime);
            let times = [t.last_access, t.last_modification];
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
    fn long_paths_are_cut_into_pieces_at_slashes() {
        // 200-byte names: a path of 60 of them is ~12 KiB.
        let name = [b'n'; 200];
        let mut p = Vec::new();
        for _ in 0..60 {
            if !p.is_empty() {
                p.push(b'/');
            }
            p.extend_from_slice(&name);
        }
        assert!(check_path(&p).is_ok());
        let ends = chunk_ends(&p);
        assert_eq!(ends.last(), Some(&p.len()));
        let mut begin = 0;
        for &e in &ends {
            assert!(e - begin <= CHUNK && e > begin, "piece {begin}..{e}");
            assert!(e == p.len() || p[e] == b'/');
            assert!(check_path(&p[begin..e]).is_ok());
            begin = e + 1;
        }
        // A prefix shares the cuts before its end.
        let half = &p[..p.len() / 2 + 100];
        let cut = half.iter().rposition(|&b| b == b'/').unwrap();
        let pre = chunk_ends(&p[..cut]);
        assert_eq!(pre[..pre.len() - 1], ends[..pre.len() - 1]);
        // Short paths are one piece; names over NAME_MAX stay ENAMETOOLONG at any depth.
        assert_eq!(chunk_ends(b"a/b"), vec![3]);
        let mut bad = p.clone();
        bad.push(b'/');
        bad.extend_from_slice(&[b'x'; 256]);
        assert_eq!(check_path(&bad), Err(Error::NameTooLong));
    }

    #[test]
    fn fd_cache_is_bounded_and_generation_checked() {
        let c = FdCache::new(2, true);
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
