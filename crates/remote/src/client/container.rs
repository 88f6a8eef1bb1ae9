//! Container files (Coda's redirection, "Coda on a remote mount", step 1): a remote regular
//! file opened through a [`RemoteBackend`](super::RemoteBackend) is fetched whole into a local
//! file (its *container*) in the client's cache directory; the open file the front end gets is
//! a [`ContainerFile`], whose descriptor the FUSE front end registers as the passthrough
//! backing file, so the kernel does the reads and writes on the container as for a local file.
//!
//! **Validity (callbacks).** A container records the server's attributes it was fetched (or
//! stored back) with. It is *valid* while its callback holds: any callback naming its path or
//! an ancestor (`Attr`, `Entry`), its inode (`Inode`), an `Overflow` or a lost connection makes
//! it invalid. A callback counter read before the server is asked makes a container fetched
//! while a callback arrived invalid at once. An invalid container is used again only after
//! an open compared the server's attributes (size, mtime, ctime, dev, ino) with the recorded
//! ones; otherwise it is fetched again. Invariant: **no open started after a callback for a
//! container's file was received is answered from data fetched before it without the server
//! confirming its attributes.**
//!
//! **Access.** The server decides every access: a read-only open reuses a valid container
//! without a round trip only when the same credentials (uid, gid and groups) had an open
//! granted by the server for that container while its callback has held (the memo is
//! forgotten with the callback). Every other open asks the server (Open, then FileAttr).
//!
//! **Write-back.** A container opened for writing keeps the server handle its open got (as
//! the caller). When the container changed since it was fetched or stored (its ctime moved),
//! [`ContainerFile::flush`] (close(2): FUSE FLUSH), [`ContainerFile::sync`] (fsync) and the
//! release of the last descriptor store it back: the data in pipelined writes, the size, and
//! its mtime (as the caller; a caller who may not set times leaves the server's store time),
//! all as the writer. Errors are returned to close() and fsync(). Session semantics: other
//! clients see the new contents when the writer closes (or syncs); a container with a local
//! writer is not fetched again while that writer has it open (its data would be lost), so
//! opens on this client see the local session's data; the last close stores its version.
//!
//! **Restart** (`index` submodule). With [`ContainerConfig::remote`] the containers live in a
//! directory of that remote, kept after the mount with an index, and are used again by the
//! next mount of the same remote: a container whose server attributes (dev, ino, size,
//! mtime, ctime) the mount's bulk subtree reply (or an open's FileAttr) shows unchanged is
//! valid again; one that changed is dropped; a read-only open needs no round trip for
//! credentials the server granted a read before only when the file and every ancestor
//! directory below the root are unchanged too.

mod index;
mod kernel;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use dircache_core::{Attr, BackendFile, Cred, Error, Result, SetAttr, TimeSet, Timespec, Whence};
use parking_lot::Mutex;

use super::{eio, want_attr, want_count, want_unit, Conn, Disconnected, RemoteFile};
use crate::proto::{features, Request, WireCred, MAX_IO};

/// A file's first bytes, read with its open ([`crate::proto::Request::OpenPlus`]): `asked` is
/// how many were asked for (fewer came only at the file's end).
pub(crate) struct First {
    pub data: Vec<u8>,
    pub asked: u32,
}

/// Where containers live and how big they may get.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerConfig {
    /// The cache directory (a per-mount directory is made inside it); `None`: the daemon
    /// user's default ([`default_cache_base`]).
    pub dir: Option<PathBuf>,
    /// Bytes of containers kept; containers not open are evicted (least recently used first)
    /// beyond it.
    pub max_bytes: u64,
    /// Files larger than this are read in ranges from the server, not fetched whole.
    pub whole_file_max: u64,
    /// The remote's identity (`[user@]host:port:path`): its containers are kept in a
    /// directory of their own across mounts (module docs); `None`: a per-mount directory,
    /// removed when the mount ends.
    pub remote: Option<String>,
}

impl Default for ContainerConfig {
    fn default() -> ContainerConfig {
        ContainerConfig {
            dir: None,
            max_bytes: 1 << 30,
            whole_file_max: 64 << 20,
            remote: None,
        }
    }
}

/// The default base of cache directories: `/var/cache/dircache` for root, else
/// `$XDG_CACHE_HOME/dircache` or `~/.cache/dircache`.
pub fn default_cache_base() -> PathBuf {
    if rustix::process::geteuid().is_root() {
        return PathBuf::from("/var/cache/dircache");
    }
    match std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        Some(x) => Path::new(&x).join("dircache"),
        None => match std::env::var_os("HOME") {
            Some(h) => Path::new(&h).join(".cache/dircache"),
            None => PathBuf::from("/tmp/dircache-cache"),
        },
    }
}

/// Counters of the container cache.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ContainerStats {
    /// Whole-file fetches, and their bytes.
    pub fetches: u64,
    pub fetched_bytes: u64,
    /// Opens answered from a valid container without any round trip.
    pub reuses: u64,
    /// Opens that asked the server and found the container unchanged.
    pub revalidated: u64,
    /// Store-backs, and their bytes.
    pub stores: u64,
    pub stored_bytes: u64,
    pub evictions: u64,
    /// Bytes of containers held now.
    pub bytes: u64,
    /// Containers taken over from the previous mount's index.
    pub restored: u64,
    /// Of those, found unchanged on the server by the mount's bulk reply, and found changed
    /// (dropped).
    pub revalidated_at_mount: u64,
    pub stale_at_mount: u64,
    /// `open=noopen`: page-cache misses (READs) answered from a valid container without a
    /// round trip (container/kernel.rs).
    pub kernel_read_hits: u64,
    /// Writes through to the server (`open=noopen`), and truncations by path, after which
    /// the file's container was made invalid.
    pub kernel_writes: u64,
}

type Key = (u64, u64);

/// Who had an open granted, and for what (O_RDONLY / O_WRONLY / O_RDWR).
type Access = (u32, u32, Vec<u32>, i32);

/// What the container's own file looked like after a fetch or store (a change since means
/// local writes to store back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Local {
    pub(super) size: u64,
    pub(super) mtime: Timespec,
    pub(super) ctime: Timespec,
}

struct Entry {
    name: String,
    file: Arc<File>,
    path: Vec<u8>,
    /// The server's attributes the data corresponds to (`None`: never fetched).
    attr: Option<Attr>,
    local: Option<Local>,
    /// The callback holds.
    valid: bool,
    access: HashSet<Access>,
    opens: u32,
    writers: u32,
    used: u64,
    /// Bytes counted for it in `State::bytes`.
    counted: u64,
    /// Serializes fetches and stores of this container.
    io: Arc<Mutex<()>>,
    /// Its name is listed in the index written last: renamed before it is modified.
    in_index: bool,
    /// Being fetched (never listed in the index meanwhile).
    fetching: bool,
    /// Taken over from the index and not yet confirmed: the read grants recorded, with
    /// the ancestors' attributes they were granted under.
    restored: Option<Restored>,
}

struct Restored {
    readers: Vec<(u32, u32, Vec<u32>)>,
    ancestors: Vec<Attr>,
}

#[derive(Default)]
struct State {
    by_key: HashMap<Key, Entry>,
    by_path: BTreeMap<Vec<u8>, Key>,
    /// Callbacks seen (every one, coarse): a fetch that saw it move is not valid.
    gen: u64,
    clock: u64,
    bytes: u64,
    next_name: u64,
    stats: ContainerStats,
    /// Something the index lists (or should) changed since it was written.
    index_dirty: bool,
    /// Directories' attributes from this mount's bulk replies, forgotten with their callback
    /// (the ancestors a read grant is recorded with).
    dirs: HashMap<Vec<u8>, Attr>,
    /// Restored containers found unchanged whose read grants wait for their ancestors'
    /// attributes.
    waiting: Vec<Key>,
}

/// The container cache of one client (module docs).
pub struct Containers {
    dir: OwnedFd,
    dir_path: PathBuf,
    max_bytes: u64,
    pub(super) whole_file_max: u64,
    st: Mutex<State>,
    /// Open writable containers (a quick test before attribute overlays).
    writers: AtomicU64,
    /// The remote's identity when the directory is kept across mounts (with its lock held).
    persistent: Option<(String, OwnedFd)>,
    /// Serializes index writes.
    index_io: Mutex<()>,
    closed: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Containers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Containers")
            .field("dir", &self.dir_path)
            .field("max_bytes", &self.max_bytes)
            .field("whole_file_max", &self.whole_file_max)
            .finish()
    }
}

fn os(e: rustix::io::Errno) -> Error {
    Error::Os(e.raw_os_error())
}

fn local_of(f: &File) -> Result<Local> {
    local_of_fd(f.as_fd())
}

fn local_of_fd(f: BorrowedFd<'_>) -> Result<Local> {
    let s = rustix::fs::fstat(f).map_err(os)?;
    Ok(Local {
        size: s.st_size as u64,
        mtime: Timespec {
            sec: s.st_mtime,
            nsec: s.st_mtime_nsec as u32,
        },
        ctime: Timespec {
            sec: s.st_ctime,
            nsec: s.st_ctime_nsec as u32,
        },
    })
}

/// How many times [`settled_local`] waits for writes under way before it gives up on
/// matching the state the data is read in.
const SETTLE_TRIES: usize = 4;

/// The container's state to record with data read from it right after: a state no write
/// under way can still change behind it. The kernel's writes (passthrough: another
/// process writing while a sibling closes a copy of the descriptor; a child's exec closes
/// one) set the file's times first, then copy the data, all under the inode's lock; a store
/// that read the state between the two, and the data before the copy, recorded the new
/// times with the old data: the writer's own close then found the container clean and the
/// write never reached the server (an in-place write), or a first store sent a torn,
/// empty file (an extending one; the CI flake of `a_small_file_is_stored_back_in_one_call`).
/// A write of no bytes takes that lock and changes nothing (ext4, tmpfs, btrfs; XFS reads
/// take it themselves), so every write whose time change a state shows has copied its data
/// once the barrier after that state returns. The state is read again after the barrier
/// until it stays the same (the data read then is all of that state's), at most
/// [`SETTLE_TRIES`] times; still moving, the last state read before a barrier is returned:
/// older than the data, so the next check finds the container changed and stores it again.
pub(super) fn settled_local(f: impl AsFd) -> Result<Local> {
    let f = f.as_fd();
    let mut seen = local_of_fd(f)?;
    for _ in 0..SETTLE_TRIES {
        rustix::io::pwrite(f, &[], 0).map_err(os)?;
        let now = local_of_fd(f)?;
        if now == seen {
            return Ok(seen);
        }
        seen = now;
    }
    rustix::io::pwrite(f, &[], 0).map_err(os)?;
    Ok(seen)
}

/// Whether `a` and `b` are the same version of the same file.
fn same_version(a: &Attr, b: &Attr) -> bool {
    (a.dev, a.ino, a.size, a.mtime, a.ctime) == (b.dev, b.ino, b.size, b.mtime, b.ctime)
}

fn access_of(cred: &Cred, accmode: i32) -> Access {
    (cred.uid, cred.gid, cred.groups().to_vec(), accmode)
}

/// A directory the daemon's user owns and nobody else may write; created (0700) if missing.
fn checked_dir(path: &Path) -> std::io::Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    if !path.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(path)?;
    }
    let fd = rustix::fs::open(
        path,
        OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let s = rustix::fs::fstat(&fd)?;
    let me = rustix::process::geteuid().as_raw();
    if s.st_uid != me || s.st_mode & 0o022 != 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{}: a cache directory must belong to uid {me} and be writable by no one else \
                 (owner {}, mode {:o})",
                path.display(),
                s.st_uid,
                s.st_mode & 0o7777
            ),
        ));
    }
    Ok(fd)
}

use std::os::unix::fs::DirBuilderExt;

/// Every directory on the way to `path` (an existing directory) must be one that no other
/// user can change: owned by root or the daemon's user and writable by no one else unless
/// sticky (like /tmp, where others cannot rename or remove what is not theirs). Otherwise
/// another user could later rename a directory on the way and put its own in its place:
/// containers, the modification log and its data files, which are read back and replayed
/// as the users who wrote them, are found by these paths. Both the directories the given
/// path passes through (a symlink on the way included) and those of its resolved path are
/// checked.
pub fn check_ancestors(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let me = rustix::process::geteuid().as_raw();
    let safe = |d: &Path| -> std::io::Result<()> {
        let m = std::fs::metadata(d)?;
        let sticky = m.mode() & libc::S_ISVTX != 0;
        if (m.uid() == 0 || m.uid() == me) && (m.mode() & 0o022 == 0 || sticky) {
            return Ok(());
        }
        Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{}: a cache directory must not be below a directory another user can change: \
                 {} (owner {}, mode {:o})",
                path.display(),
                d.display(),
                m.uid(),
                m.mode() & 0o7777
            ),
        ))
    };
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()?.join(path)
    };
    let real = std::fs::canonicalize(&abs)?;
    for p in [&abs, &real] {
        let mut d = p.parent();
        while let Some(x) = d {
            safe(x)?;
            d = x.parent();
        }
    }
    Ok(())
}

impl Containers {
    /// The containers of `cfg.remote` in its directory of `cfg.dir` (or the default base),
    /// taken over from the last mount's index; a new per-mount directory when `cfg.remote`
    /// is `None` or another mount of the same remote holds its directory. Directories 0700.
    pub fn new(cfg: &ContainerConfig) -> std::io::Result<Containers> {
        let base = cfg.dir.clone().unwrap_or_else(default_cache_base);
        checked_dir(&base)?;
        check_ancestors(&base)?;
        if let Some(remote) = &cfg.remote {
            let dir_path = base.join(index::dir_name(remote));
            let dir = checked_dir(&dir_path)?;
            match index::lock(&dir)? {
                Some(lock) => return Ok(Self::restore(cfg, dir, dir_path, remote, lock)),
                None => tracing::warn!(
                    "{} is used by another mount of {remote}: this mount's containers go to a \
                     directory of its own, removed when it ends",
                    dir_path.display()
                ),
            }
        }
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir_path = base.join(format!(
            "m{}-{nanos:x}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::DirBuilder::new().mode(0o700).create(&dir_path)?;
        let dir = checked_dir(&dir_path)?;
        tracing::info!(
            "containers in {} (at most {} bytes, whole files up to {} bytes)",
            dir_path.display(),
            cfg.max_bytes,
            cfg.whole_file_max
        );
        Ok(Containers {
            dir,
            dir_path,
            max_bytes: cfg.max_bytes,
            whole_file_max: cfg.whole_file_max.min(cfg.max_bytes),
            st: Mutex::new(State::default()),
            writers: AtomicU64::new(0),
            persistent: None,
            index_io: Mutex::new(()),
            closed: Default::default(),
        })
    }

    /// The remote's kept directory (its lock held): the index's containers whose files are
    /// as recorded, not valid until revalidated; every other file removed.
    fn restore(
        cfg: &ContainerConfig,
        dir: OwnedFd,
        dir_path: PathBuf,
        remote: &str,
        lock: OwnedFd,
    ) -> Containers {
        let mut st = State::default();
        let mut keep = HashSet::new();
        let mut listed = 0usize;
        if let Some(idx) = index::load(&dir, remote) {
            listed = idx.entries.len();
            for e in idx.entries {
                let key = (e.attr.dev, e.attr.ino);
                if st.by_key.contains_key(&key) || st.by_path.contains_key(&e.path) {
                    continue;
                }
                let Some(file) = index::open_unchanged(&dir, &e) else {
                    continue;
                };
                let n: u64 = e.name[1..].parse().unwrap_or(0);
                st.next_name = st.next_name.max(n + 1);
                st.clock = st.clock.max(e.used);
                st.bytes += e.local.0;
                keep.insert(e.name.clone());
                st.by_path.insert(e.path.clone(), key);
                st.by_key.insert(
                    key,
                    Entry {
                        name: e.name,
                        file: Arc::new(file),
                        path: e.path,
                        attr: Some(e.attr),
                        local: Some(Local {
                            size: e.local.0,
                            mtime: e.local.1,
                            ctime: e.local.2,
                        }),
                        valid: false,
                        access: HashSet::new(),
                        opens: 0,
                        writers: 0,
                        used: e.used,
                        counted: e.local.0,
                        io: Arc::new(Mutex::new(())),
                        in_index: true,
                        fetching: false,
                        restored: Some(Restored {
                            readers: e.readers,
                            ancestors: e.ancestors,
                        }),
                    },
                );
            }
        }
        let removed = index::remove_others(&dir, &keep);
        st.stats.restored = st.by_key.len() as u64;
        tracing::info!(
            "containers of {remote} in {} (at most {} bytes, whole files up to {} bytes): {} \
             taken over from the index ({listed} listed), {removed} other files removed",
            dir_path.display(),
            cfg.max_bytes,
            cfg.whole_file_max,
            st.by_key.len(),
        );
        let cc = Containers {
            dir,
            dir_path,
            max_bytes: cfg.max_bytes,
            whole_file_max: cfg.whole_file_max.min(cfg.max_bytes),
            st: Mutex::new(st),
            writers: AtomicU64::new(0),
            persistent: Some((remote.to_string(), lock)),
            index_io: Mutex::new(()),
            closed: Default::default(),
        };
        // A smaller bound than the last mount's.
        cc.evict(&mut cc.st.lock());
        cc
    }

    /// Whether the containers are kept after the mount (the remote's own directory).
    pub fn persistent(&self) -> bool {
        self.persistent.is_some()
    }

    /// The per-mount directory holding the containers.
    pub fn dir(&self) -> &Path {
        &self.dir_path
    }

    pub fn stats(&self) -> ContainerStats {
        let st = self.st.lock();
        ContainerStats {
            bytes: st.bytes,
            ..st.stats
        }
    }

    /// [`Self::stats`] and the bounds, as `dircache stats` shows them (`containers_*`).
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        let s = self.stats();
        vec![
            ("containers_fetches", s.fetches),
            ("containers_fetched_bytes", s.fetched_bytes),
            ("containers_hits", s.reuses),
            ("containers_revalidated_at_open", s.revalidated),
            ("containers_stores", s.stores),
            ("containers_stored_bytes", s.stored_bytes),
            ("containers_evictions", s.evictions),
            ("containers_bytes", s.bytes),
            ("containers_restored", s.restored),
            ("containers_revalidated_at_mount", s.revalidated_at_mount),
            ("containers_stale_at_mount", s.stale_at_mount),
            ("containers_noopen_read_hits", s.kernel_read_hits),
            ("containers_invalidated_by_writes", s.kernel_writes),
            ("containers_max_bytes", self.max_bytes),
            ("containers_whole_file_max", self.whole_file_max),
            ("containers_kept", u64::from(self.persistent())),
        ]
    }

    /// The callback counter now (read before asking the server anything an entry's validity
    /// will rest on).
    pub(super) fn gen(&self) -> u64 {
        self.st.lock().gen
    }

    fn invalidate(e: &mut Entry) {
        e.valid = false;
        e.access.clear();
    }

    /// A callback about `path`: containers of it or below it are no longer valid.
    pub(super) fn touched(&self, path: &[u8]) {
        let mut st = self.st.lock();
        st.gen += 1;
        let mut below = path.to_vec();
        below.push(b'/');
        let mut keys: Vec<(Vec<u8>, Key)> = Vec::new();
        if let Some(k) = st.by_path.get(path) {
            keys.push((path.to_vec(), *k));
        }
        if path.is_empty() {
            st.dirs.clear();
            keys.extend(st.by_path.iter().map(|(p, k)| (p.clone(), *k)));
        } else {
            st.dirs.retain(|d, _| d != path && !d.starts_with(&below));
            keys.extend(
                st.by_path
                    .range(below.clone()..)
                    .take_while(|(p, _)| p.starts_with(&below))
                    .map(|(p, k)| (p.clone(), *k)),
            );
        }
        if !keys.is_empty() {
            tracing::debug!(
                "callback {:?}: {} containers invalid",
                String::from_utf8_lossy(path),
                keys.len()
            );
        }
        for (p, k) in keys {
            st.by_path.remove(&p);
            if let Some(e) = st.by_key.get_mut(&k) {
                Self::invalidate(e);
            }
        }
    }

    /// A rename made while disconnected (client/disconnected.rs): the containers at or
    /// below `old` are at `new` now, still valid; whatever was at `new` is not.
    pub(super) fn moved(&self, old: &[u8], new: &[u8]) {
        let under = |p: &[u8], d: &[u8]| {
            p.strip_prefix(d)
                .filter(|r| r.is_empty() || r[0] == b'/')
                .map(<[u8]>::to_vec)
        };
        let mut st = self.st.lock();
        st.gen += 1;
        let gone: Vec<Vec<u8>> = st
            .by_path
            .keys()
            .filter(|p| under(p, new).is_some())
            .cloned()
            .collect();
        for p in gone {
            if let Some(k) = st.by_path.remove(&p) {
                if let Some(e) = st.by_key.get_mut(&k) {
                    Self::invalidate(e);
                }
            }
        }
        let moving: Vec<(Vec<u8>, Vec<u8>)> = st
            .by_path
            .keys()
            .filter_map(|p| under(p, old).map(|rest| (p.clone(), [new, &rest].concat())))
            .collect();
        for (from, to) in moving {
            if let Some(k) = st.by_path.remove(&from) {
                if let Some(e) = st.by_key.get_mut(&k) {
                    e.path = to.clone();
                }
                st.by_path.insert(to, k);
            }
        }
    }

    /// A callback naming an inode.
    pub(super) fn touched_inode(&self, key: Key) {
        let mut st = self.st.lock();
        st.gen += 1;
        // It may be a directory's: no ancestor attributes are trusted any more.
        st.dirs.clear();
        if let Some(e) = st.by_key.get_mut(&key) {
            Self::invalidate(e);
        }
    }

    /// This client removed or replaced a name of some non-directory: a hard-linked file's
    /// other names lost a link and got a new ctime, which the containers holding them must
    /// not answer from (the server's inode callback comes later, if at all for our own
    /// change). Every container of a file with more than one link is no longer valid.
    pub(super) fn touched_linked(&self) {
        let mut st = self.st.lock();
        st.gen += 1;
        for e in st.by_key.values_mut() {
            if e.attr.is_some_and(|a| a.nlink > 1) {
                Self::invalidate(e);
            }
        }
    }

    /// Every promise broken (Overflow, a lost connection).
    pub(super) fn invalidate_all(&self) {
        let mut st = self.st.lock();
        st.gen += 1;
        st.by_path.clear();
        st.dirs.clear();
        for e in st.by_key.values_mut() {
            Self::invalidate(e);
        }
    }

    /// A read-only open of `path` as `cred` that needs no round trip: a valid container the
    /// server granted these credentials read access to.
    pub(super) fn reuse(
        self: &Arc<Self>,
        conn: &Arc<Conn>,
        path: &[u8],
        cred: &Cred,
    ) -> Option<ContainerFile> {
        self.reuse_as(conn, path, cred, libc::O_RDONLY)
    }

    /// [`Containers::reuse`] for access mode `accmode` (a writable open while disconnected:
    /// client/disconnected.rs), with no server handle.
    pub(super) fn reuse_as(
        self: &Arc<Self>,
        conn: &Arc<Conn>,
        path: &[u8],
        cred: &Cred,
        accmode: i32,
    ) -> Option<ContainerFile> {
        let mut st = self.st.lock();
        let key = *st.by_path.get(path)?;
        st.clock += 1;
        let now = st.clock;
        let e = st.by_key.get_mut(&key)?;
        // Write access was granted with a read-write open too.
        let granted = e.access.contains(&access_of(cred, accmode))
            || (accmode == libc::O_WRONLY && e.access.contains(&access_of(cred, libc::O_RDWR)));
        if !e.valid || e.attr.is_none() || !granted {
            return None;
        }
        e.opens += 1;
        e.used = now;
        let writable = accmode != libc::O_RDONLY;
        if writable {
            e.writers += 1;
            self.writers.fetch_add(1, Ordering::Relaxed);
        }
        let f = ContainerFile {
            cc: self.clone(),
            key,
            file: e.file.clone(),
            remote: None,
            conn: conn.clone(),
            cred: cred.clone(),
            path: path.to_vec(),
            writable,
        };
        st.stats.reuses += 1;
        Some(f)
    }

    /// A file created while disconnected (client/disconnected.rs): a new, empty container
    /// with the attributes `attr` made up for it, open for writing by `cred` (who may open
    /// it again in any mode until the reconnection).
    pub(super) fn create_local(
        self: &Arc<Self>,
        conn: &Arc<Conn>,
        path: &[u8],
        cred: &Cred,
        attr: Attr,
    ) -> Result<ContainerFile> {
        let key = (attr.dev, attr.ino);
        let mut st = self.st.lock();
        self.entry(&mut st, key, path)?;
        st.clock += 1;
        let now = st.clock;
        let e = st.by_key.get_mut(&key).ok_or(Error::Os(libc::EIO))?;
        e.file.set_len(0)?;
        e.attr = Some(attr);
        e.local = Some(local_of(&e.file)?);
        e.valid = true;
        for m in [libc::O_RDONLY, libc::O_WRONLY, libc::O_RDWR] {
            e.access.insert(access_of(cred, m));
        }
        e.opens += 1;
        e.writers += 1;
        e.used = now;
        self.writers.fetch_add(1, Ordering::Relaxed);
        Ok(ContainerFile {
            cc: self.clone(),
            key,
            file: e.file.clone(),
            remote: None,
            conn: conn.clone(),
            cred: cred.clone(),
            path: path.to_vec(),
            writable: true,
        })
    }

    /// The server's attributes of the version a valid container of `path` holds.
    pub(super) fn recorded_attr(&self, path: &[u8]) -> Option<Attr> {
        let st = self.st.lock();
        let e = st.by_key.get(st.by_path.get(path)?)?;
        e.attr.filter(|_| e.valid)
    }

    /// The entry of `key` (made, with an empty container file, if new), named `path`;
    /// whether it was made now.
    fn entry(&self, st: &mut State, key: Key, path: &[u8]) -> Result<bool> {
        let made = !st.by_key.contains_key(&key);
        if made {
            use rustix::fs::{Mode, OFlags};
            let name = format!("c{}", st.next_name);
            st.next_name += 1;
            let fd = rustix::fs::openat(
                &self.dir,
                name.as_str(),
                OFlags::CREATE | OFlags::EXCL | OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOFOLLOW,
                Mode::from_raw_mode(0o600),
            )
            .map_err(os)?;
            st.by_key.insert(
                key,
                Entry {
                    name,
                    file: Arc::new(File::from(fd)),
                    path: path.to_vec(),
                    attr: None,
                    local: None,
                    valid: false,
                    access: HashSet::new(),
                    opens: 0,
                    writers: 0,
                    used: 0,
                    counted: 0,
                    io: Arc::new(Mutex::new(())),
                    in_index: false,
                    fetching: false,
                    restored: None,
                },
            );
        }
        if let Some(e) = st.by_key.get_mut(&key) {
            if e.path != path {
                let old = std::mem::replace(&mut e.path, path.to_vec());
                if st.by_path.get(&old) == Some(&key) {
                    st.by_path.remove(&old);
                }
            }
        }
        st.by_path.insert(path.to_vec(), key);
        Ok(made)
    }

    #[allow(clippy::too_many_arguments)]
    /// An open the server granted (`rf`, with the file's attributes `attr` asked after the
    /// open; `gen` read before the open was sent): the container, fetched if it is not of this
    /// version. `grant`: the server decided `cred`'s access (remembered for later opens);
    /// not for a READ under `open=noopen`, whose access the kernel decided (container/kernel.rs).
    pub(super) fn open(
        self: &Arc<Self>,
        conn: &Arc<Conn>,
        path: &[u8],
        cred: &Cred,
        flags: i32,
        rf: RemoteFile,
        reader: Option<RemoteFile>,
        attr: Attr,
        gen: u64,
        grant: bool,
        first: Option<First>,
    ) -> Result<ContainerFile> {
        let key = (attr.dev, attr.ino);
        let writable = rf.writable;
        let (io, made) = {
            let mut st = self.st.lock();
            let made = self.entry(&mut st, key, path)?;
            if writable {
                self.detach(&mut st, key)?;
            }
            let e = st.by_key.get_mut(&key).ok_or(Error::Os(libc::EIO))?;
            // Counted as open at once: not evicted while fetching.
            e.opens += 1;
            if writable {
                e.writers += 1;
                self.writers.fetch_add(1, Ordering::Relaxed);
            }
            (e.io.clone(), made)
        };
        let cf = ContainerFile {
            cc: self.clone(),
            key,
            file: self.st.lock().by_key[&key].file.clone(),
            remote: None,
            conn: conn.clone(),
            cred: cred.clone(),
            path: path.to_vec(),
            writable,
        };
        let _io = io.lock();
        let (fetch, file) = {
            let st = self.st.lock();
            let e = &st.by_key[&key];
            let local_writer = e.writers > u32::from(writable);
            let same = e.attr.is_some_and(|a| same_version(&a, &attr));
            (!same && !local_writer, e.file.clone())
        };
        if fetch {
            {
                let mut st = self.st.lock();
                self.detach(&mut st, key)?;
                if let Some(e) = st.by_key.get_mut(&key) {
                    e.fetching = true;
                }
            }
            let r = self
                .fetch(&file, reader.as_ref().unwrap_or(&rf), &attr, first)
                .and_then(|n| Ok((n, local_of(&file)?)));
            let mut st = self.st.lock();
            st.index_dirty = true;
            let Some(e) = st.by_key.get_mut(&key) else {
                return Err(Error::Os(libc::EIO));
            };
            e.access.clear();
            e.fetching = false;
            e.restored = None;
            match r {
                Ok((n, local)) => {
                    e.attr = Some(attr);
                    e.local = Some(local);
                    st.stats.fetches += 1;
                    st.stats.fetched_bytes += n;
                    if !made {
                        // The container held other data, which the kernel may have read into
                        // its page cache (through a descriptor opened before the callback,
                        // after the callback's invalidation) and sized its inode by: drop
                        // them now that the data changed under them. Without this, a later
                        // open with FOPEN_KEEP_CACHE reads those pages for good.
                        drop(st);
                        conn.callback(dircache_core::Change::Inode {
                            dev: key.0,
                            ino: key.1,
                        });
                    }
                }
                Err(err) => {
                    // Half fetched: no version (fetched again next time), nothing to store
                    // (`cf` has no server handle); dropping `cf` undoes the open count.
                    e.attr = None;
                    e.local = None;
                    e.valid = false;
                    return Err(err);
                }
            }
        } else {
            self.st.lock().stats.revalidated += 1;
        }
        {
            let mut st = self.st.lock();
            let held = st.gen == gen;
            st.clock += 1;
            let now = st.clock;
            let mut grew = false;
            if let Some(e) = st.by_key.get_mut(&key) {
                e.used = now;
                e.valid = held;
                if held {
                    // The server answered for this version now: what the index recorded is
                    // superseded.
                    e.restored = None;
                }
                if held && grant {
                    let mode = flags & libc::O_ACCMODE;
                    grew |= e.access.insert(access_of(cred, mode));
                    if mode == libc::O_RDWR {
                        grew |= e.access.insert(access_of(cred, libc::O_RDONLY));
                    }
                }
            }
            st.index_dirty |= grew;
            self.account(&mut st, key);
        }
        if let Some(r) = reader {
            r.close_async();
        }
        let mut cf = cf;
        if writable {
            cf.remote = Some(rf);
        } else {
            rf.close_async();
        }
        Ok(cf)
    }

    /// Whether an open of the file with attributes `attr` must fetch it (not the version held,
    /// and no local writer has it open).
    /// How many first bytes an open of `path` asks for with it: none when a container of
    /// `path` is held with data (its version is most likely current: the bytes would come
    /// for nothing), else as many as one read brings (at most the whole-file bound).
    pub(super) fn first_read(&self, path: &[u8]) -> u32 {
        let st = self.st.lock();
        let held = st
            .by_path
            .get(path)
            .and_then(|k| st.by_key.get(k))
            .is_some_and(|e| e.attr.is_some());
        if held {
            0
        } else {
            (MAX_IO as u64).min(self.whole_file_max) as u32
        }
    }

    pub(super) fn needs_fetch(&self, attr: &Attr) -> bool {
        let st = self.st.lock();
        match st.by_key.get(&(attr.dev, attr.ino)) {
            None => true,
            Some(e) => e.writers == 0 && !e.attr.is_some_and(|a| same_version(&a, attr)),
        }
    }

    /// The server's data into `file` (truncated first), in pipelined windows; the bytes read.
    /// `first`: the bytes that came with the open, written first; a short piece (fewer than
    /// asked, no more than the size) is the whole file.
    fn fetch(
        &self,
        file: &File,
        rf: &RemoteFile,
        attr: &Attr,
        first: Option<First>,
    ) -> Result<u64> {
        file.set_len(0)?;
        let mut off = 0u64;
        if let Some(f) = first {
            file.write_all_at(&f.data, 0)?;
            off = f.data.len() as u64;
            if f.data.len() < f.asked as usize && off <= attr.size {
                return Ok(off);
            }
        } else if attr.size == 0 {
            // Nothing to read (a write-only handle could not).
            return Ok(0);
        }
        const WINDOW: usize = 8 << 20;
        let mut buf = vec![0u8; ((attr.size - attr.size.min(off)) as usize).clamp(MAX_IO, WINDOW)];
        loop {
            let n = rf.read_at(&mut buf, off)?;
            file.write_all_at(&buf[..n], off)?;
            off += n as u64;
            if n < buf.len() || off > self.whole_file_max.saturating_mul(2) {
                return Ok(off);
            }
        }
    }

    /// Bring the bytes held back under the bound: evict containers not open, least recently
    /// used first (never one with unstored changes).
    fn account(&self, st: &mut State, key: Key) {
        if let Some(e) = st.by_key.get_mut(&key) {
            let sz = e.file.metadata().map(|m| m.len()).unwrap_or(e.counted);
            let old = std::mem::replace(&mut e.counted, sz);
            st.bytes = st.bytes - old + sz;
        }
        self.evict(st);
    }

    /// Evict containers not open, least recently used first (never one with unstored
    /// changes), until the bytes held are within the bound.
    fn evict(&self, st: &mut State) {
        if st.bytes <= self.max_bytes {
            return;
        }
        let mut idle: Vec<(u64, Key)> = st
            .by_key
            .iter()
            .filter(|(_, e)| e.opens == 0 && !Self::is_dirty(e))
            .map(|(k, e)| (e.used, *k))
            .collect();
        idle.sort_unstable();
        for (_, k) in idle {
            if st.bytes <= self.max_bytes {
                break;
            }
            if let Some(e) = st.by_key.remove(&k) {
                if st.by_path.get(&e.path) == Some(&k) {
                    st.by_path.remove(&e.path);
                }
                st.by_path.retain(|_, v| *v != k);
                let _ =
                    rustix::fs::unlinkat(&self.dir, e.name.as_str(), rustix::fs::AtFlags::empty());
                st.bytes -= e.counted;
                st.stats.evictions += 1;
                st.index_dirty |= e.in_index;
            }
        }
        if st.bytes > self.max_bytes {
            tracing::debug!(
                "containers: {} bytes held, over the bound of {} (open or unstored)",
                st.bytes,
                self.max_bytes
            );
        }
    }

    fn is_dirty(e: &Entry) -> bool {
        match (e.local, local_of(&e.file)) {
            (Some(l), Ok(now)) => l != now,
            (None, _) => false,
            (Some(_), Err(_)) => true,
        }
    }

    /// A setattr by path (`set`, answered with `a`) of a file a local writer has open: the
    /// container follows (a truncation, times), so what it stores back keeps them.
    pub(super) fn path_setattr(&self, a: &Attr, set: &SetAttr) {
        let st = self.st.lock();
        let Some(e) = st.by_key.get(&(a.dev, a.ino)).filter(|e| e.writers > 0) else {
            return;
        };
        if let Some(size) = set.size {
            let _ = e.file.set_len(size);
        }
        if set.atime.is_some() || set.mtime.is_some() {
            let _ = set_times(&e.file, set, a);
        }
    }

    /// The attributes of `path` as this client sees them, if a valid container holds it
    /// (answered while disconnected: client/disconnected.rs).
    pub(super) fn cached_attr(&self, path: &[u8]) -> Option<Attr> {
        let st = self.st.lock();
        let e = st.by_key.get(st.by_path.get(path)?)?;
        let mut a = e.attr.filter(|_| e.valid)?;
        overlay_local(&mut a, e);
        Some(a)
    }

    /// `a` (the server's attributes of some file) as this client sees them: a container
    /// open for writing with changes not stored yet shows its size and times.
    pub(super) fn overlay(&self, a: &mut Attr) {
        if self.writers.load(Ordering::Relaxed) == 0 || a.mode & libc::S_IFMT != libc::S_IFREG {
            return;
        }
        let st = self.st.lock();
        if let Some(e) = st.by_key.get(&(a.dev, a.ino)) {
            if e.writers > 0 {
                overlay_local(a, e);
            }
        }
    }
}

/// `a` with the container's size, blocks and times when it changed since fetched or stored.
fn overlay_local(a: &mut Attr, e: &Entry) {
    let Ok(s) = rustix::fs::fstat(&*e.file) else {
        return;
    };
    let now = Local {
        size: s.st_size as u64,
        mtime: Timespec {
            sec: s.st_mtime,
            nsec: s.st_mtime_nsec as u32,
        },
        ctime: Timespec {
            sec: s.st_ctime,
            nsec: s.st_ctime_nsec as u32,
        },
    };
    if e.local == Some(now) {
        return;
    }
    a.size = now.size;
    a.blocks = s.st_blocks as u64;
    a.mtime = now.mtime;
    a.ctime = now.ctime;
}

/// What a part of a bulk subtree reply tells the containers (see [`Containers::scan`]).
#[derive(Default)]
pub(super) struct Learned {
    dirs: Vec<(Vec<u8>, Attr)>,
    files: Vec<(Vec<u8>, Attr)>,
}

/// The ancestor directories of `path` below the root, outermost first.
fn ancestors(path: &[u8]) -> impl Iterator<Item = &[u8]> {
    path.iter()
        .enumerate()
        .filter(|(_, c)| **c == b'/')
        .map(move |(i, _)| &path[..i])
}

impl Containers {
    /// Before a container the index lists is modified: rename it to a fresh name (the
    /// index's name for it no longer exists; `index` module's invariant).
    fn detach(&self, st: &mut State, key: Key) -> Result<()> {
        if !st.by_key.get(&key).is_some_and(|e| e.in_index) {
            return Ok(());
        }
        let name = format!("c{}", st.next_name);
        st.next_name += 1;
        st.index_dirty = true;
        let Some(e) = st.by_key.get_mut(&key) else {
            return Ok(());
        };
        let clean = !Self::is_dirty(e);
        rustix::fs::renameat(&self.dir, e.name.as_str(), &self.dir, name.as_str()).map_err(os)?;
        e.name = name;
        e.in_index = false;
        if clean {
            // The rename moved its ctime: still clean.
            e.local = Some(local_of(&e.file)?);
        }
        Ok(())
    }

    /// Write the index if anything changed since the last write (`force`: anyway): every
    /// whole, clean container not open for writing, with its read grants while its callback
    /// holds and every ancestor's attributes are known. No-op for a per-mount directory.
    pub fn checkpoint(&self, force: bool) {
        let Some((remote, _)) = &self.persistent else {
            return;
        };
        let _io = self.index_io.lock();
        let idx = {
            let mut st = self.st.lock();
            if !st.index_dirty && !force {
                return;
            }
            st.index_dirty = false;
            let st = &mut *st;
            let mut entries = Vec::new();
            for (key, e) in st.by_key.iter_mut() {
                let (Some(attr), Some(local)) = (e.attr, e.local) else {
                    continue;
                };
                if e.fetching
                    || e.writers > 0
                    || Self::is_dirty(e)
                    || st.by_path.get(&e.path).is_some_and(|k| k != key)
                {
                    continue;
                }
                let (mut readers, mut ancs) = (Vec::new(), Vec::new());
                if e.valid {
                    readers = e
                        .access
                        .iter()
                        .filter(|a| a.3 == libc::O_RDONLY)
                        .map(|a| (a.0, a.1, a.2.clone()))
                        .collect();
                    readers.sort();
                    for a in ancestors(&e.path) {
                        match st.dirs.get(a) {
                            Some(d) => ancs.push(*d),
                            None => {
                                readers.clear();
                                break;
                            }
                        }
                    }
                } else if let Some(r) = &e.restored {
                    // Not confirmed yet: what the last index said, as it said it.
                    readers = r.readers.clone();
                    ancs = r.ancestors.clone();
                }
                if readers.is_empty() {
                    ancs.clear();
                }
                e.in_index = true;
                entries.push(index::IndexEntry {
                    name: e.name.clone(),
                    path: e.path.clone(),
                    attr,
                    local: (local.size, local.mtime, local.ctime),
                    readers,
                    ancestors: ancs,
                    used: e.used,
                });
            }
            index::IndexFile {
                remote: remote.clone(),
                entries,
            }
        };
        let n = idx.entries.len();
        match index::write(&self.dir, &idx) {
            Ok(()) => tracing::debug!("container index written: {n} containers"),
            Err(e) => {
                tracing::warn!("writing the container index: {e}");
                self.st.lock().index_dirty = true;
            }
        }
    }

    /// Write the index about once a second while anything changes, on a thread of its own
    /// (until the containers are closed or dropped), so that a killed client loses at most
    /// the last second's fetches.
    pub fn start_checkpoints(self: &Arc<Self>) {
        if self.persistent.is_none() {
            return;
        }
        let weak = Arc::downgrade(self);
        let _ = std::thread::Builder::new()
            .name("dircache-containers".into())
            .spawn(move || loop {
                std::thread::sleep(std::time::Duration::from_secs(1));
                let Some(cc) = weak.upgrade() else { return };
                if cc.closed.load(Ordering::SeqCst) {
                    return;
                }
                cc.checkpoint(false);
            });
    }

    /// From a bulk subtree part (`parts`, relative to `root`): the directories' attributes
    /// and the attributes of restored containers' files (applied by [`Self::learn`] once
    /// the part is known to be current).
    pub(super) fn scan(&self, root: &[u8], parts: &[crate::proto::SubtreeDir]) -> Learned {
        let st = self.st.lock();
        let mut l = Learned::default();
        for d in parts {
            let dir = crate::prefetch::join(root, &d.dir);
            for e in &d.entries {
                let Some(a) = e.attr else { continue };
                let kind = a.mode & libc::S_IFMT;
                if kind == libc::S_IFDIR {
                    l.dirs.push((crate::prefetch::join(&dir, &e.name), a));
                } else if kind == libc::S_IFREG && st.stats.restored > 0 {
                    let p = crate::prefetch::join(&dir, &e.name);
                    let pending = st
                        .by_path
                        .get(&p)
                        .and_then(|k| st.by_key.get(k))
                        .is_some_and(|e| e.restored.is_some() && !e.valid);
                    if pending {
                        l.files.push((p, a));
                    }
                }
            }
        }
        l
    }

    /// Apply what a bulk part showed (`gen`: the callback counter read before the bulk call
    /// was sent; after any callback since, nothing is learnt): restored containers whose
    /// file is unchanged are valid again (their read grants restored once every ancestor is
    /// known unchanged too), changed ones are dropped.
    pub(super) fn learn(&self, l: Learned, gen: u64) {
        let mut st = self.st.lock();
        if st.gen != gen {
            return;
        }
        let st = &mut *st;
        st.dirs.extend(l.dirs);
        for (p, a) in l.files {
            let Some(&key) = st.by_path.get(&p) else {
                continue;
            };
            let Some(e) = st.by_key.get_mut(&key) else {
                continue;
            };
            if e.restored.is_none() || e.valid || e.opens > 0 {
                continue;
            }
            if e.attr.is_some_and(|r| same_version(&r, &a)) {
                e.valid = true;
                st.stats.revalidated_at_mount += 1;
                st.waiting.push(key);
            } else if let Some(e) = st.by_key.remove(&key) {
                st.by_path.remove(&p);
                let _ =
                    rustix::fs::unlinkat(&self.dir, e.name.as_str(), rustix::fs::AtFlags::empty());
                st.bytes -= e.counted;
                st.stats.stale_at_mount += 1;
                st.index_dirty = true;
                tracing::debug!(
                    "container of {:?}: changed on the server since the last mount, dropped",
                    String::from_utf8_lossy(&p)
                );
            }
        }
        // Read grants: the file and every ancestor below the root as when they were given.
        let dirs = &st.dirs;
        let by_key = &mut st.by_key;
        st.waiting.retain(|key| {
            let Some(e) = by_key.get_mut(key) else {
                return false;
            };
            let Some(r) = &e.restored else { return false };
            if !e.valid {
                return false;
            }
            let now: Option<Vec<Attr>> = ancestors(&e.path).map(|a| dirs.get(a).copied()).collect();
            let Some(now) = now else { return true };
            let same = now.len() == r.ancestors.len()
                && now
                    .iter()
                    .zip(&r.ancestors)
                    .all(|(a, b)| same_version(a, b));
            if same {
                for (uid, gid, groups) in &r.readers {
                    e.access
                        .insert((*uid, *gid, groups.clone(), libc::O_RDONLY));
                }
                tracing::debug!(
                    "container of {:?}: unchanged, {} read grants restored",
                    String::from_utf8_lossy(&e.path),
                    r.readers.len()
                );
            } else {
                tracing::debug!(
                    "container of {:?}: unchanged, its read grants dropped (a directory above \
                     it changed)",
                    String::from_utf8_lossy(&e.path)
                );
            }
            e.restored = None;
            false
        });
    }

    /// The mount ends: a kept directory gets its index written (its containers stay); a
    /// per-mount one is removed. Idempotent.
    pub fn close(&self) {
        if self.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        if self.persistent.is_some() {
            self.checkpoint(true);
            let st = self.st.lock();
            for e in st.by_key.values().filter(|e| Self::is_dirty(e)) {
                tracing::error!(
                    "{:?}: changes never stored back are dropped with its container",
                    String::from_utf8_lossy(&e.path)
                );
            }
        } else {
            self.remove_all();
        }
    }
}

impl Containers {
    /// Remove every container and the directory (a per-mount directory when the mount
    /// ends: [`Self::close`]). Idempotent.
    pub fn remove_all(&self) {
        let mut st = self.st.lock();
        for (_, e) in st.by_key.drain() {
            if Self::is_dirty(&e) {
                tracing::error!(
                    "{:?}: changes never stored back are dropped with its container",
                    String::from_utf8_lossy(&e.path)
                );
            }
            let _ = rustix::fs::unlinkat(&self.dir, e.name.as_str(), rustix::fs::AtFlags::empty());
        }
        st.by_path.clear();
        st.bytes = 0;
        match std::fs::remove_dir(&self.dir_path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!("removing {}: {e}", self.dir_path.display()),
        }
    }
}

impl Drop for Containers {
    fn drop(&mut self) {
        self.close();
    }
}

/// An open remote file served from its container (module docs).
pub struct ContainerFile {
    cc: Arc<Containers>,
    key: Key,
    file: Arc<File>,
    /// The server handle of a writable open (as the opener), for store-back.
    remote: Option<RemoteFile>,
    conn: Arc<Conn>,
    cred: Cred,
    path: Vec<u8>,
    writable: bool,
}

impl ContainerFile {
    /// Store the container back if it changed since fetched or stored (see
    /// [`ContainerFile::store_remote`]); whether it was logged instead. Disconnected (or
    /// the connection lost during the store), with disconnected operation on, the contents
    /// go to the client modification log (client/disconnected.rs), reintegrated at the
    /// reconnection: Coda's store of a session that ends while disconnected.
    fn store(&self) -> Result<bool> {
        let Some(rf) = &self.remote else {
            return Ok(false);
        };
        let d = self
            .conn
            .disconnected
            .clone()
            .filter(|_| rf.link.disconnected().is_some());
        if let Some(d) = d.as_ref().filter(|d| d.offline()) {
            return self.store_logged(d, rf).map(|()| true);
        }
        match self.store_remote(rf) {
            Ok(()) => Ok(false),
            Err(e) => match &d {
                Some(d) if d.offline() || rf.link.conn.lock().closed.load(Ordering::SeqCst) => {
                    tracing::warn!(
                        "storing {:?} back: {e}; the connection is lost: logged instead",
                        String::from_utf8_lossy(&self.path)
                    );
                    self.store_logged(d, rf).map(|()| true)
                }
                _ => Err(e),
            },
        }
    }

    /// The container's contents into the modification log, if it changed since fetched,
    /// stored or logged; the server's version it was changed from is the conflict base.
    fn store_logged(&self, d: &Arc<Disconnected>, rf: &RemoteFile) -> Result<()> {
        let io = match self.cc.st.lock().by_key.get(&self.key) {
            Some(e) => e.io.clone(),
            None => return Ok(()),
        };
        let _io = io.lock();
        let base = {
            let st = self.cc.st.lock();
            match st.by_key.get(&self.key) {
                Some(e) if Containers::is_dirty(e) => e.attr,
                _ => return Ok(()),
            }
        };
        d.log_session(&rf.link, self, (&self.cred).into(), &rf.state.path(), base)
    }

    /// Store the container back if it changed since fetched or stored: the data, the size,
    /// then the mtime, as the opener; the server's attributes after it become the recorded
    /// ones.
    fn store_remote(&self, rf: &RemoteFile) -> Result<()> {
        let io = match self.cc.st.lock().by_key.get(&self.key) {
            Some(e) => e.io.clone(),
            None => return Ok(()),
        };
        let _io = io.lock();
        let dirty = {
            let st = self.cc.st.lock();
            st.by_key.get(&self.key).is_some_and(Containers::is_dirty)
        };
        if !dirty {
            return Ok(());
        }
        // Not torn by a write under way (another descriptor's close can come in the middle
        // of one): see `settled_local`, which may wait for that write (not under `st`).
        let before = settled_local(&*self.file)?;
        let gen = self.cc.gen();
        let wc: WireCred = (&self.cred).into();
        let set = SetAttr {
            mtime: Some(TimeSet::At(before.mtime)),
            ..Default::default()
        };
        let (conn, handle) = rf.at()?;
        let attr = if conn.features & features::STORE != 0 && before.size <= MAX_IO as u64 {
            // A file that fits one call (every object a build writes): its data, size and
            // mtime in one `Store`, which the server applies in that order (one round trip;
            // a `Write` with `SetSize`, then a `FileSetattr` took two).
            let mut data = vec![0u8; before.size as usize];
            let n = read_full(&self.file, &mut data, 0)?;
            data.truncate(n);
            let r = conn.call_touching(
                &wc,
                Request::Store {
                    handle,
                    offset: 0,
                    data,
                    size: before.size,
                    set,
                },
                Some(rf.stale()),
            )?;
            want_attr(r)?
        } else {
            drop(conn);
            self.store_windows(rf, &wc, &before, set)?
        };
        let mut st = self.cc.st.lock();
        let held = st.gen == gen;
        st.stats.stores += 1;
        st.stats.stored_bytes += before.size;
        if let Some(e) = st.by_key.get_mut(&self.key) {
            e.attr = Some(attr);
            e.local = Some(before);
            if !held {
                Containers::invalidate(e);
            }
        }
        tracing::debug!(
            "stored {} bytes of {:?} back",
            before.size,
            String::from_utf8_lossy(&self.path)
        );
        Ok(())
    }

    /// [`ContainerFile::store_remote`] of a file larger than one call (or to a server without
    /// `Store`): the data in windows of `Write`s, the size with the last one, then `set` (the
    /// mtime); the server's attributes after it.
    fn store_windows(
        &self,
        rf: &RemoteFile,
        wc: &WireCred,
        before: &Local,
        set: SetAttr,
    ) -> Result<Attr> {
        // The data, in windows of pipelined 1 MiB writes (the server may run them in any
        // order: they do not overlap), the size sent with the last window: every write lies
        // below it, so the server reaches the same file whichever it runs first (a truncation
        // drops nothing written below the size; an extension zero-fills only past the end
        // the writes have made). One round trip fewer per store (a `make` stores every
        // object it writes).
        const WINDOW: usize = 16 << 20;
        let mut buf = vec![0u8; (before.size as usize).clamp(MAX_IO, WINDOW)];
        let mut off = 0u64;
        loop {
            let want = ((before.size - off) as usize).min(buf.len());
            let n = if want > 0 {
                read_full(&self.file, &mut buf[..want], off)?
            } else {
                0
            };
            let mut calls = Vec::new();
            for (i, c) in buf[..n].chunks(MAX_IO).enumerate() {
                let (conn, handle) = rf.at()?;
                let (_, rx) = conn.start_touching(
                    wc,
                    Request::Write {
                        handle,
                        offset: off + (i * MAX_IO) as u64,
                        data: c.to_vec(),
                        append: false,
                    },
                    Some(rf.stale()),
                )?;
                calls.push((Some(c.len()), rx));
            }
            // The last window: a short read (the container shrank under us) stores what
            // was read, as before, with the size recorded at the start.
            let last = n < want || off + n as u64 >= before.size;
            if last {
                let (conn, handle) = rf.at()?;
                let (_, rx) = conn.start_touching(
                    wc,
                    Request::SetSize {
                        handle,
                        size: before.size,
                    },
                    Some(rf.stale()),
                )?;
                calls.push((None, rx));
            }
            let mut first_err = None;
            for (len, rx) in calls {
                let r = match rx.recv() {
                    Ok(Ok((_, Ok(r)))) => match len {
                        Some(len) => want_count(r).and_then(|w| {
                            if w as usize == len {
                                Ok(())
                            } else {
                                Err(Error::Os(libc::EIO))
                            }
                        }),
                        None => want_unit(r),
                    },
                    Ok(Ok((_, Err(e)))) => Err(Error::from_errno(e)),
                    _ => Err(eio()),
                };
                if let Err(e) = r {
                    first_err.get_or_insert(e);
                }
            }
            if let Some(e) = first_err {
                return Err(e);
            }
            if last {
                break;
            }
            off += n as u64;
        }
        let (conn, handle) = rf.at()?;
        match conn.call_touching(wc, Request::FileSetattr { handle, set }, Some(rf.stale())) {
            Ok(r) => want_attr(r),
            // Not the owner: the server's store time stays.
            Err(Error::Os(libc::EPERM)) | Err(Error::Os(libc::EACCES)) => rf.attr(),
            Err(e) => Err(e),
        }
    }

    /// Its changes are safe elsewhere (the modification log, client/cml.rs): the container
    /// counts as clean (evictable) from now on.
    pub(super) fn logged(&self) {
        if let Ok(l) = local_of(&self.file) {
            self.with_entry(|e| {
                if let Some(mut a) = e.attr {
                    overlay_local(&mut a, e);
                    e.attr = Some(a);
                }
                e.local = Some(l);
            });
        }
    }

    /// [`ContainerFile::logged`] for the state `(size, mtime, ctime)` that was logged: a
    /// write that came after it was read leaves the container dirty (logged again at the
    /// next close), not counted as logged.
    pub(super) fn logged_as(&self, (size, mtime, ctime): (u64, Timespec, Timespec)) {
        self.with_entry(|e| {
            if let Some(mut a) = e.attr {
                (a.size, a.mtime, a.ctime) = (size, mtime, ctime);
                e.attr = Some(a);
            }
            e.local = Some(Local { size, mtime, ctime });
        });
    }

    fn with_entry<T>(&self, f: impl FnOnce(&mut Entry) -> T) -> Option<T> {
        self.cc.st.lock().by_key.get_mut(&self.key).map(f)
    }
}

/// The times `set` set (to the values the server answered with, `a`) on the container.
fn set_times(f: &File, set: &SetAttr, a: &Attr) -> Result<()> {
    let ts = |t: Option<TimeSet>, cur: Timespec| match t {
        None => rustix::fs::Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_OMIT,
        },
        Some(_) => rustix::fs::Timespec {
            tv_sec: cur.sec,
            tv_nsec: cur.nsec as _,
        },
    };
    let times = rustix::fs::Timestamps {
        last_access: ts(set.atime, a.atime),
        last_modification: ts(set.mtime, a.mtime),
    };
    rustix::fs::futimens(f, &times).map_err(os)
}

fn read_full(f: &File, buf: &mut [u8], off: u64) -> Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match f.read_at(&mut buf[done..], off + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(done)
}

impl Drop for ContainerFile {
    fn drop(&mut self) {
        if self.writable {
            // The last chance: the release of the handle (mmap writes after close, say).
            if let Err(e) = self.store() {
                tracing::error!(
                    "storing {:?} back at release failed: {e}; the changes stay in the \
                     container only",
                    String::from_utf8_lossy(&self.path)
                );
            }
        }
        let writable = self.writable;
        let mut st = self.cc.st.lock();
        if let Some(e) = st.by_key.get_mut(&self.key) {
            e.opens = e.opens.saturating_sub(1);
            if writable {
                e.writers = e.writers.saturating_sub(1);
            }
        }
        if writable {
            self.cc.writers.fetch_sub(1, Ordering::Relaxed);
        }
        self.cc.account(&mut st, self.key);
    }
}

impl BackendFile for ContainerFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        read_full(&self.file, buf, offset)
    }

    fn write_at(&self, _cred: &Cred, data: &[u8], offset: u64, append: bool) -> Result<usize> {
        if !self.writable {
            return Err(Error::Os(libc::EBADF));
        }
        let at = if append {
            self.file.metadata()?.len()
        } else {
            offset
        };
        self.file.write_all_at(data, at)?;
        Ok(data.len())
    }

    fn sync(&self, datasync: bool) -> Result<()> {
        if self.store()? {
            // In the modification log, which is synced.
            return Ok(());
        }
        match &self.remote {
            Some(rf) => rf.sync(datasync),
            None => Ok(()),
        }
    }

    fn flush(&self) -> Result<()> {
        self.store().map(drop)
    }

    fn allocate(&self, _cred: &Cred, mode: i32, offset: u64, len: u64) -> Result<()> {
        if !self.writable {
            return Err(Error::Os(libc::EBADF));
        }
        rustix::fs::fallocate(
            &*self.file,
            rustix::fs::FallocateFlags::from_bits_retain(mode as u32),
            offset,
            len,
        )
        .map_err(os)
    }

    fn seek(&self, offset: i64, whence: Whence) -> Result<u64> {
        use rustix::fs::SeekFrom;
        let to = match whence {
            Whence::Set => SeekFrom::Start(offset as u64),
            Whence::Cur => SeekFrom::Current(offset),
            Whence::End => SeekFrom::End(offset),
            Whence::Data => SeekFrom::Data(offset as u64),
            Whence::Hole => SeekFrom::Hole(offset as u64),
        };
        rustix::fs::seek(&*self.file, to).map_err(os)
    }

    fn set_size(&self, cred: &Cred, size: u64) -> Result<()> {
        if self.writable {
            self.file.set_len(size)?;
            return Ok(());
        }
        // Read-only (open(O_RDONLY|O_TRUNC)): the server decides, then the container follows
        // without becoming dirty.
        let a = want_attr(self.conn.call_as(
            &cred.into(),
            Request::Setattr {
                path: self.path.clone(),
                set: SetAttr {
                    size: Some(size),
                    ..Default::default()
                },
            },
        )?)?;
        {
            let mut st = self.cc.st.lock();
            self.cc.detach(&mut st, self.key)?;
        }
        self.file.set_len(size)?;
        let local = local_of(&self.file)?;
        self.with_entry(|e| {
            if e.writers == 0 {
                e.attr = Some(a);
                e.local = Some(local);
            } else {
                Containers::invalidate(e);
            }
        });
        Ok(())
    }

    fn setattr(&self, cred: &Cred, set: &SetAttr) -> Result<Attr> {
        let set = SetAttr { size: None, ..*set };
        let r = match &self.remote {
            Some(rf) => rf.setattr(cred, &set)?,
            None => want_attr(self.conn.call_as(
                &cred.into(),
                Request::Setattr {
                    path: self.path.clone(),
                    set,
                },
            )?)?,
        };
        // Times set on the open file are the container's too (stored back with it).
        if set.atime.is_some() || set.mtime.is_some() {
            {
                let mut st = self.cc.st.lock();
                self.cc.detach(&mut st, self.key)?;
            }
            let clean = self
                .with_entry(|e| !Containers::is_dirty(e))
                .unwrap_or(false);
            set_times(&self.file, &set, &r)?;
            if clean {
                let local = local_of(&self.file)?;
                self.with_entry(|e| {
                    e.local = Some(local);
                    e.attr = Some(r);
                });
            }
        } else {
            let clean = self
                .with_entry(|e| !Containers::is_dirty(e))
                .unwrap_or(false);
            if clean {
                self.with_entry(|e| e.attr = Some(r));
            }
        }
        Ok(self.attr().unwrap_or(r))
    }

    fn attr(&self) -> Result<Attr> {
        let valid = self.with_entry(|e| e.valid).unwrap_or(false);
        // After a callback (an unlink, a chmod), a writer asks the server through its handle
        // (link count, mode, owner); the data's size and times are the container's.
        let fresh = match &self.remote {
            Some(rf) if !valid => Some(rf.attr()?),
            _ => None,
        };
        let st = self.cc.st.lock();
        let e = st.by_key.get(&self.key).ok_or(Error::Os(libc::EIO))?;
        let mut a = e.attr.ok_or(Error::Os(libc::EIO))?;
        overlay_local(&mut a, e);
        if let Some(f) = fresh {
            (a.nlink, a.mode, a.uid, a.gid) = (f.nlink, f.mode, f.uid, f.gid);
        }
        Ok(a)
    }

    fn writable(&self) -> bool {
        self.writable
    }

    fn fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.file.as_fd())
    }

    /// The container belongs to the daemon: registering it as a passthrough backing file
    /// (the kernel keeps these credentials for the I/O on it) runs as the daemon (the server
    /// decided the access at open); nothing else runs on it for a caller.
    fn as_caller(
        &self,
        _cred: &Cred,
        shared: bool,
        f: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        if !shared {
            // An ioctl (inode flags): the container's flags are nobody's business.
            return Err(Error::NotSupported);
        }
        f()
    }
}
