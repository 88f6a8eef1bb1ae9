//! Warm restart (ByVFS (b), docs/core.md I13): the cache's directory listings, completeness
//! and negative entries kept across unmount/mount in a snapshot file, and validated against
//! the tree before any of it is used again.
//!
//! # What is saved
//!
//! For every cached directory of the root file system (in parent-before-child order): its
//! name under its parent, its **key** `(dev, ino, mtime, ctime, size)` and, when trusted (see
//! below), its complete listing (`name, type, ino` of each entry) if the cache had it complete,
//! and the names the cache held as negative (ENOENT) in it otherwise. File attributes are
//! **not** saved: `chmod` changes only the file's ctime, not its directory's, so a saved
//! attribute could only be used after a `statx` of the file, which is what fetching it costs.
//!
//! The saved contents come from the backend, not from the cache: at save, for each cached
//! directory, `getattr` (key 1), then `readdir` (if the cache has it complete) or a `lookup` of
//! each cached negative name (which must still fail with ENOENT), then `getattr` again (key 2).
//! A directory's contents are saved only if key 1 equals key 2 and both its mtime and ctime are
//! older than the save's start minus [`Persist::racy`] (2 s). So what is saved is a fact about
//! the tree ("the directory at path P with key K has these entries"), true whatever the cache
//! missed while it ran (a change feed that lagged or overflowed).
//!
//! # Validation (the invariant)
//!
//! **A saved listing or negative is installed only if the live `getattr` of its directory at
//! load returns the saved key.** Adding, removing or renaming an entry of a directory sets its
//! mtime and ctime to the current time; `utimes` can set the mtime back but always sets the
//! ctime to now. So a directory whose key is unchanged has the entries it had when saved —
//! unless the change fell in the same timestamp tick as the saved key (coarse clocks: a tick is
//! up to 10 ms, some file systems store seconds). That is git's "racy entry" problem and has
//! git's answer: a directory whose mtime or ctime lies within `racy` of the save's start is not
//! trusted (saved as a path step only), so any later change gets a later timestamp. (It relies
//! on the wall clock not being stepped back by more than `racy` between save and load, and, for
//! a remote backend, on the server's clock agreeing with ours within `racy`.)
//!
//! A directory whose key changed is still a path step: its saved children directories are
//! validated on their own (each by its own key, at its own path), but none of its listing or
//! negatives is used. A directory whose path no longer leads to a directory is skipped with its
//! whole saved subtree.
//!
//! Validation is eager, installation lazy: [`Cache::load_snapshot`] (on a fresh cache, before
//! it serves anyone) makes one `getattr` per saved directory on a few threads, creates the
//! dentries of the directories still there, and parks each validated directory's contents in
//! `Cache::pending` with the directory's `gen` and version at that moment. They are installed
//! at the directory's first miss or plain listing (`Cache::take_pending`) only if those are
//! unchanged, so any change made through the cache or reported since wins. A listing that
//! wants attributes is served from them only where every entry's attributes are cached.
//!
//! # The file
//!
//! `MAGIC`, a format version, the payload length and a SipHash-1-3 checksum of the payload,
//! then the payload ([`postcard`]). The payload names the source (an identity string from the
//! front end, e.g. SRC's canonical path) and the root's `(dev, ino)`: a snapshot of another tree
//! is ignored. Written to a temporary file (`O_EXCL`, mode 0600) in the same directory,
//! fsynced, then renamed over the old one. On load, a file that is not a regular file owned by
//! the daemon's user with no group/other permissions, larger than [`MAX_SNAPSHOT_BYTES`],
//! truncated, corrupt, of another version or of another tree is ignored: [`PersistError`], which
//! front ends log as a warning, never a panic. A snapshot holds names the caller of a mount may
//! not be allowed to see, hence the 0600 and the owner check (a planted snapshot would
//! otherwise be trusted as far as its keys match).

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use siphasher::sip::SipHasher13;

use super::dentry::{COMPLETE, DEAD, MOUNTED, PENDING};
use super::{Cache, NodeKind, NodeRef};
use crate::{Attr, Backend, DirEntry, Error, FileType, Timespec, NAME_MAX};

/// First bytes of a snapshot file.
pub const MAGIC: &[u8; 8] = b"DCSNAP\0\n";
/// Format version; a file of another version is ignored.
pub const VERSION: u32 = 1;
/// Largest snapshot file read (or written).
pub const MAX_SNAPSHOT_BYTES: u64 = 512 << 20;
const HEADER: usize = 8 + 4 + 8 + 8;
/// Fixed SipHash keys: the checksum detects corruption, not forgery (the owner check does).
const SUM_KEYS: (u64, u64) = (0x6469_7263_6163_6865, 0x736e_6170_7368_6f74);

/// Why a snapshot was not saved or not used.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    #[error("{0}: {1}")]
    Io(PathBuf, std::io::Error),
    #[error("{0}: not a regular file owned by uid {1} with mode 0600")]
    Unsafe(PathBuf, u32),
    #[error("{0}: larger than {MAX_SNAPSHOT_BYTES} bytes")]
    TooLarge(PathBuf),
    #[error("{0}: not a dircache snapshot, truncated or corrupt ({1})")]
    Corrupt(PathBuf, &'static str),
    #[error("{0}: snapshot format version {1}, this dircache reads version {VERSION}")]
    Version(PathBuf, u32),
    #[error("{0}: a snapshot of another tree ({1})")]
    Foreign(PathBuf, &'static str),
    #[error("snapshots are loaded only into a fresh cache, before it serves anyone")]
    NotFresh,
    #[error("{0}")]
    Backend(#[from] Error),
}

/// Where a snapshot lives and what it must belong to.
#[derive(Debug, Clone)]
pub struct Persist {
    pub path: PathBuf,
    /// Identity of the tree the cache serves (e.g. SRC's canonical path): a snapshot naming
    /// another source is ignored.
    pub source: Vec<u8>,
    /// Directories changed within this long before the save are not trusted (racy).
    pub racy: Duration,
}

impl Persist {
    pub fn new(path: impl Into<PathBuf>, source: impl Into<Vec<u8>>) -> Persist {
        Persist {
            path: path.into(),
            source: source.into(),
            racy: Duration::from_secs(2),
        }
    }
}

/// What a save wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SaveReport {
    /// Directories in the file (trusted or path steps).
    pub dirs: u64,
    /// Complete listings saved.
    pub listings: u64,
    /// Entries in those listings.
    pub entries: u64,
    /// Negative names saved.
    pub negatives: u64,
    /// Directories saved as path steps only: changed within `racy`, or during the save.
    pub racy: u64,
    /// Cached listings that differed from the backend's (the cache had missed a change; the
    /// backend's listing was saved).
    pub stale_in_cache: u64,
    pub bytes: u64,
}

/// What a load installed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadReport {
    pub dirs: u64,
    /// Directories whose key matched: their listing / negatives were installed.
    pub validated: u64,
    /// Directories whose key changed (not trusted).
    pub changed: u64,
    /// Directories whose path no longer leads to a directory (skipped with their subtree).
    pub missing: u64,
    pub listings: u64,
    pub entries: u64,
    pub negatives: u64,
}

/// A directory's identity and state: what must be unchanged for its contents to be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Key {
    dev: u64,
    ino: u64,
    mtime: Timespec,
    ctime: Timespec,
    size: u64,
}

impl Key {
    fn of(a: &Attr) -> Key {
        Key {
            dev: a.dev,
            ino: a.ino,
            mtime: a.mtime,
            ctime: a.ctime,
            size: a.size,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
enum Contents {
    /// A path step only.
    Untrusted,
    /// The complete listing: `(name, type, ino)`.
    Complete(Vec<(Vec<u8>, FileType, u64)>),
    /// Names known not to exist (ENOENT).
    Negatives(Vec<Vec<u8>>),
}

/// Validated snapshot contents waiting for their directory (`Cache::pending`).
pub(crate) struct Pending {
    gen: u64,
    ver: u64,
    contents: Contents,
}

#[derive(Default)]
pub(crate) struct PendingMap(parking_lot::Mutex<std::collections::HashMap<u64, Pending>>);

#[derive(Debug, Serialize, Deserialize)]
struct SavedDir {
    /// Index of the parent in `Snapshot::dirs` (always smaller); the root has none.
    parent: Option<u32>,
    name: Vec<u8>,
    key: Key,
    contents: Contents,
}

#[derive(Debug, Serialize, Deserialize)]
struct Snapshot {
    source: Vec<u8>,
    root_dev: u64,
    root_ino: u64,
    /// Start of the save (wall clock).
    taken: Timespec,
    dirs: Vec<SavedDir>,
}

fn checksum(b: &[u8]) -> u64 {
    use std::hash::Hasher;
    let mut h = SipHasher13::new_with_keys(SUM_KEYS.0, SUM_KEYS.1);
    h.write(b);
    h.finish()
}

fn now() -> Timespec {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    Timespec {
        sec: d.as_secs() as i64,
        nsec: d.subsec_nanos(),
    }
}

/// `t` lies at least `racy` before `start`.
fn settled(t: Timespec, start: Timespec, racy: Duration) -> bool {
    let ns = |t: Timespec| i128::from(t.sec) * 1_000_000_000 + i128::from(t.nsec);
    ns(t) + racy.as_nanos() as i128 <= ns(start)
}

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = dir.to_vec();
    if !p.is_empty() {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

fn valid_name(n: &[u8]) -> bool {
    !n.is_empty() && n.len() <= NAME_MAX && n != b"." && n != b".." && !n.contains(&b'/')
}

impl Cache {
    /// Write a snapshot of the cached listings and negatives to `p.path` (module docs).
    /// Makes backend calls (about three per cached directory); may run while serving.
    pub fn save_snapshot(&self, p: &Persist) -> Result<SaveReport, PersistError> {
        let start = now();
        let backend = self.root_sb.backend.clone();
        let root_attr = backend.getattr(b"")?;
        let mut report = SaveReport::default();
        let mut dirs: Vec<SavedDir> = Vec::new();
        // (dentry, index of the parent's SavedDir, backend path)
        let mut stack: Vec<(NodeRef, Option<u32>, Vec<u8>)> = vec![(self.root(), None, Vec::new())];
        let mut budget = self.config.max_entries as u64;
        while let Some((node, parent, path)) = stack.pop() {
            if node.has(DEAD) || !Arc::ptr_eq(&node.sb, &self.root_sb) {
                continue;
            }
            if parent.is_some() && node.has(MOUNTED) {
                continue;
            }
            // What the cache holds, read under the lock, used after it is released.
            let complete = self.config.completeness && node.has(COMPLETE);
            let mut cached: Vec<(Vec<u8>, FileType, u64)> = Vec::new();
            let mut negatives: Vec<Vec<u8>> = Vec::new();
            let mut subdirs: Vec<NodeRef> = Vec::new();
            if let Some(ch) = &node.inner.read().children {
                for d in ch.values() {
                    let name = d.link().name.to_vec();
                    match d.kind() {
                        NodeKind::Positive(t) => {
                            if t == FileType::Directory {
                                subdirs.push(d.clone());
                            }
                            let ino = d.attr_copy().map_or_else(|| d.attr.ino(), |a| a.ino);
                            cached.push((name, t, ino));
                        }
                        NodeKind::Negative(Error::NotFound) => negatives.push(name),
                        NodeKind::Negative(_) => {}
                    }
                }
            }
            let Ok(a1) = backend.getattr(&path) else {
                continue;
            };
            if !a1.is_dir() {
                continue;
            }
            let mut contents = Contents::Untrusted;
            if settled(a1.mtime, start, p.racy) && settled(a1.ctime, start, p.racy) {
                let fetched = if complete {
                    backend.readdir(&path, false).ok().map(|l| {
                        let mut l: Vec<_> =
                            l.into_iter().map(|e| (e.name, e.kind, e.ino)).collect();
                        l.sort_by(|a, b| a.0.cmp(&b.0));
                        cached.sort_by(|a, b| a.0.cmp(&b.0));
                        if l != cached {
                            report.stale_in_cache += 1;
                        }
                        Contents::Complete(l)
                    })
                } else if !negatives.is_empty() {
                    negatives.retain(|n| matches!(backend.lookup(&path, n), Err(Error::NotFound)));
                    Some(Contents::Negatives(negatives))
                } else {
                    None
                };
                if let Some(c) = fetched {
                    match backend.getattr(&path) {
                        Ok(a2) if Key::of(&a2) == Key::of(&a1) => contents = c,
                        _ => report.racy += 1,
                    }
                }
            } else {
                report.racy += 1;
            }
            let n = match &contents {
                Contents::Complete(l) => l.len() as u64,
                Contents::Negatives(l) => l.len() as u64,
                Contents::Untrusted => 0,
            };
            if budget < n + 1 {
                break;
            }
            budget -= n + 1;
            match &contents {
                Contents::Complete(l) => {
                    report.listings += 1;
                    report.entries += l.len() as u64;
                }
                Contents::Negatives(l) => report.negatives += l.len() as u64,
                Contents::Untrusted => {}
            }
            let idx = dirs.len() as u32;
            dirs.push(SavedDir {
                parent,
                name: node.link().name.to_vec(),
                key: Key::of(&a1),
                contents,
            });
            for d in subdirs {
                let child = join(&path, &d.link().name);
                stack.push((d, Some(idx), child));
            }
        }
        report.dirs = dirs.len() as u64;
        let snap = Snapshot {
            source: p.source.clone(),
            root_dev: root_attr.dev,
            root_ino: root_attr.ino,
            taken: start,
            dirs,
        };
        let payload = postcard::to_allocvec(&snap)
            .map_err(|_| PersistError::Corrupt(p.path.clone(), "cannot encode"))?;
        let mut buf = Vec::with_capacity(HEADER + payload.len());
        buf.extend_from_slice(MAGIC);
        buf.extend_from_slice(&VERSION.to_le_bytes());
        buf.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        buf.extend_from_slice(&checksum(&payload).to_le_bytes());
        buf.extend_from_slice(&payload);
        if buf.len() as u64 > MAX_SNAPSHOT_BYTES {
            return Err(PersistError::TooLarge(p.path.clone()));
        }
        write_atomic(&p.path, &buf)?;
        report.bytes = buf.len() as u64;
        Ok(report)
    }

    /// Read the snapshot at `p.path` and install what still holds (module docs). Call it on a
    /// fresh cache, before it serves anyone. Any error means nothing was installed.
    pub fn load_snapshot(&self, p: &Persist) -> Result<LoadReport, PersistError> {
        let root = self.root();
        if root
            .inner
            .read()
            .children
            .as_ref()
            .is_some_and(|c| !c.is_empty())
        {
            return Err(PersistError::NotFresh);
        }
        let t_read = std::time::Instant::now();
        let snap = read_snapshot(&p.path)?;
        tracing::debug!("persist: read and decoded in {:?}", t_read.elapsed());
        let bad = |why| PersistError::Corrupt(p.path.clone(), why);
        if snap.source != p.source {
            return Err(PersistError::Foreign(p.path.clone(), "another source"));
        }
        let root_attr = self.attr_of(&root)?;
        if (snap.root_dev, snap.root_ino) != (root_attr.dev, root_attr.ino) {
            return Err(PersistError::Foreign(p.path.clone(), "another root inode"));
        }
        // Check the structure and build each directory's path.
        let mut paths: Vec<Vec<u8>> = Vec::with_capacity(snap.dirs.len());
        for (i, d) in snap.dirs.iter().enumerate() {
            let path = match d.parent {
                None if i == 0 => Vec::new(),
                Some(pi) if (pi as usize) < i && valid_name(&d.name) => {
                    join(&paths[pi as usize], &d.name)
                }
                _ => return Err(bad("bad directory structure")),
            };
            let names_ok = match &d.contents {
                Contents::Complete(l) => l.iter().all(|(n, _, _)| valid_name(n)),
                Contents::Negatives(l) => l.iter().all(|n| valid_name(n)),
                Contents::Untrusted => true,
            };
            if !names_ok {
                return Err(bad("bad name"));
            }
            paths.push(path);
        }
        // One getattr per saved directory, on a few threads.
        let t0 = std::time::Instant::now();
        let live = stat_all(&*self.root_sb.backend, &paths);
        let t_stat = t0.elapsed();
        let mut report = LoadReport {
            dirs: snap.dirs.len() as u64,
            ..Default::default()
        };
        let mut nodes: Vec<Option<NodeRef>> = Vec::with_capacity(snap.dirs.len());
        let mut pending: Vec<(NodeRef, u64, u64, usize)> = Vec::new();
        for (i, d) in snap.dirs.iter().enumerate() {
            let node = match (&live[i], d.parent) {
                (Ok(a), _) if !a.is_dir() => None,
                (Err(_), _) => None,
                (Ok(a), None) => (a.ino == root_attr.ino).then(|| root.clone()),
                (Ok(a), Some(pi)) => match &nodes[pi as usize] {
                    Some(parent) => self.restore_dir(parent, &d.name, a),
                    None => None,
                },
            };
            let Some(node) = node else {
                report.missing += 1;
                nodes.push(None);
                continue;
            };
            let Ok(a) = &live[i] else {
                nodes.push(None);
                continue;
            };
            if Key::of(a) != d.key {
                report.changed += 1;
                nodes.push(Some(node));
                continue;
            }
            report.validated += 1;
            match &d.contents {
                Contents::Untrusted => {}
                Contents::Complete(l) => {
                    report.listings += 1;
                    report.entries += l.len() as u64;
                }
                Contents::Negatives(l) => {
                    if !self.config.negatives {
                        nodes.push(Some(node));
                        continue;
                    }
                    report.negatives += l.len() as u64;
                }
            }
            if !matches!(d.contents, Contents::Untrusted) {
                // Installed at the directory's first use, if it has not changed by then.
                let (gen, ver) = (node.inner.read().gen(), node.version());
                pending.push((node.clone(), gen, ver, i));
            }
            nodes.push(Some(node));
        }
        let mut dirs: Vec<Option<SavedDir>> = snap.dirs.into_iter().map(Some).collect();
        {
            let mut map = self.pending.0.lock();
            for (node, gen, ver, i) in pending {
                let Some(d) = dirs[i].take() else { continue };
                node.set(PENDING);
                map.insert(
                    node.id,
                    Pending {
                        gen,
                        ver,
                        contents: d.contents,
                    },
                );
            }
        }
        tracing::debug!(
            "persist: {} directories stat'ed in {t_stat:?}, checked in {:?}",
            paths.len(),
            t0.elapsed() - t_stat
        );
        Ok(report)
    }

    /// Install the snapshot contents waiting for `dir` (if `install`) or drop them. Installed
    /// only if `dir` did not change since it was validated (its `gen` and version are those
    /// recorded then: a mutation through the cache, an outside change, an invalidation since
    /// makes them stale). Returns whether something was installed.
    pub(crate) fn take_pending(&self, dir: &NodeRef, install: bool) -> bool {
        let p = self.pending.0.lock().remove(&dir.id);
        dir.clear(PENDING);
        let Some(p) = p else {
            return false;
        };
        if !install || dir.has(DEAD) {
            return false;
        }
        match p.contents {
            Contents::Untrusted => false,
            Contents::Complete(l) => {
                let entries: Vec<DirEntry> = l
                    .into_iter()
                    .map(|(name, kind, ino)| DirEntry {
                        name,
                        kind,
                        ino,
                        attr: None,
                    })
                    .collect();
                self.merge_listing(dir, &entries, p.gen, p.ver);
                dir.has(COMPLETE)
            }
            Contents::Negatives(l) => {
                let mut any = false;
                for n in l {
                    let nd = self.insert_child(
                        dir,
                        &n,
                        p.gen,
                        p.ver,
                        NodeKind::Negative(Error::NotFound),
                        None,
                    );
                    any |= !nd.has(DEAD);
                }
                any
            }
        }
    }

    /// The dentry of directory `name` in `parent`, whose live attributes are `a`: the one a
    /// restored listing made, or a new one. `None` if the cache says otherwise (the tree
    /// changed during the load).
    fn restore_dir(&self, parent: &NodeRef, name: &[u8], a: &Attr) -> Option<NodeRef> {
        let existing = parent.inner.read().child(name).cloned();
        let node = match existing {
            Some(n) => n,
            None if parent.has(COMPLETE) => return None,
            None => {
                let (gen0, ver0) = (parent.inner.read().gen(), parent.version());
                self.insert_child(
                    parent,
                    name,
                    gen0,
                    ver0,
                    NodeKind::Positive(FileType::Directory),
                    Some(*a),
                )
            }
        };
        if !node.is_dir() || node.has(DEAD) || node.attr.ino() != a.ino {
            return None;
        }
        if node.attr_copy().is_none() {
            let s0 = node.attr.stamp();
            node.attr.store_if_unchanged(s0, a);
        }
        Some(node)
    }
}

/// `getattr` of every path, split over a few threads (results in input order).
fn stat_all(backend: &dyn Backend, paths: &[Vec<u8>]) -> Vec<crate::Result<Attr>> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 4);
    if threads == 1 || paths.len() < 256 {
        return paths.iter().map(|p| backend.getattr(p)).collect();
    }
    let chunk = paths.len().div_ceil(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = paths
            .chunks(chunk)
            .map(|c| {
                let h = s.spawn(move || c.iter().map(|p| backend.getattr(p)).collect::<Vec<_>>());
                (c.len(), h)
            })
            .collect();
        // A panicked thread's paths count as failed (never shifted onto others' results).
        handles
            .into_iter()
            .flat_map(|(n, h)| {
                h.join()
                    .unwrap_or_else(|_| vec![Err(Error::Os(libc::EIO)); n])
            })
            .collect()
    })
}

fn read_snapshot(path: &Path) -> Result<Snapshot, PersistError> {
    let io = |e| PersistError::Io(path.to_path_buf(), e);
    let bad = |why| PersistError::Corrupt(path.to_path_buf(), why);
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(io)?;
    let m = f.metadata().map_err(io)?;
    let uid = rustix::process::geteuid().as_raw();
    if !m.file_type().is_file() || m.uid() != uid || m.mode() & 0o077 != 0 {
        return Err(PersistError::Unsafe(path.to_path_buf(), uid));
    }
    if m.len() > MAX_SNAPSHOT_BYTES {
        return Err(PersistError::TooLarge(path.to_path_buf()));
    }
    let mut buf = Vec::with_capacity(m.len() as usize);
    (&mut f)
        .take(MAX_SNAPSHOT_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(io)?;
    if buf.len() < HEADER || &buf[..8] != MAGIC {
        return Err(bad("no snapshot header"));
    }
    let mut w4 = [0u8; 4];
    let mut w8 = [0u8; 8];
    w4.copy_from_slice(&buf[8..12]);
    let version = u32::from_le_bytes(w4);
    if version != VERSION {
        return Err(PersistError::Version(path.to_path_buf(), version));
    }
    w8.copy_from_slice(&buf[12..20]);
    let len = u64::from_le_bytes(w8);
    w8.copy_from_slice(&buf[20..28]);
    let sum = u64::from_le_bytes(w8);
    let payload = &buf[HEADER..];
    if payload.len() as u64 != len {
        return Err(bad("length mismatch"));
    }
    if checksum(payload) != sum {
        return Err(bad("checksum mismatch"));
    }
    postcard::from_bytes(payload).map_err(|_| bad("cannot decode"))
}

/// Write `data` to `path` atomically: a new 0600 file beside it, fsynced, renamed over it.
fn write_atomic(path: &Path, data: &[u8]) -> Result<(), PersistError> {
    let io = |e| PersistError::Io(path.to_path_buf(), e);
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut name = path
        .file_name()
        .ok_or_else(|| io(std::io::Error::from_raw_os_error(libc::EISDIR)))?
        .to_os_string();
    name.push(format!(".tmp.{}", std::process::id()));
    let tmp = dir.join(name);
    let _ = std::fs::remove_file(&tmp);
    let r = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        if let Ok(d) = std::fs::File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r.map_err(io)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::memory::MemoryBackend;
    use crate::{At, Change, Config, Cred, LookupFlags, RenameMode, SetAttr};

    const TREE: &[&str] = &[
        "a/f1",
        "a/f2",
        "a/sub/g",
        "a/sub/deeper/h",
        "b/x",
        "b/y",
        "c/",
        "d/inner/z",
        "e/keep",
        "f/untouched/u",
        "top",
    ];

    fn setup() -> (Arc<MemoryBackend>, tempfile::TempDir, Persist) {
        let b = Arc::new(MemoryBackend::new());
        b.populate(TREE);
        let dir = tempfile::tempdir().expect("tempdir");
        let mut p = Persist::new(dir.path().join("snap"), b"memory:test".to_vec());
        p.racy = Duration::ZERO;
        (b, dir, p)
    }

    fn cache(b: &Arc<MemoryBackend>) -> Arc<Cache> {
        Cache::new(b.clone(), Config::default()).expect("cache")
    }

    fn names(b: &dyn Backend, dir: &[u8]) -> Vec<(Vec<u8>, FileType, u64)> {
        let mut v: Vec<_> = b
            .readdir(dir, false)
            .expect("backend readdir")
            .into_iter()
            .map(|e| (e.name, e.kind, e.ino))
            .collect();
        v.sort_by(|x, y| x.0.cmp(&y.0));
        v
    }

    /// Every directory listed and every entry stat'ed through the cache, as the backend has
    /// them: `path -> (type, ino, mode, size)`, and each directory's listing.
    type Seen = BTreeMap<Vec<u8>, (FileType, u64, u32, u64)>;
    type Lists = BTreeMap<Vec<u8>, Vec<(Vec<u8>, FileType, u64)>>;

    fn walk_cache(c: &Cache) -> (Seen, Lists) {
        let cr = c.credentials(Cred::root());
        let mut seen = Seen::new();
        let mut lists = BTreeMap::new();
        let mut stack = vec![Vec::new()];
        while let Some(dir) = stack.pop() {
            let node = c
                .lookup(
                    &cr,
                    At::Root,
                    if dir.is_empty() { b"/" } else { &dir },
                    LookupFlags::NOFOLLOW,
                )
                .expect("lookup dir");
            let mut l: Vec<_> = c
                .readdir_node(&cr, &node, false)
                .expect("readdir")
                .into_iter()
                .map(|e| (e.name, e.kind, e.ino))
                .collect();
            l.sort_by(|x, y| x.0.cmp(&y.0));
            for (name, kind, _) in &l {
                let p = join(&dir, name);
                let a = c
                    .stat(&cr, At::Root, &p, LookupFlags::NOFOLLOW)
                    .expect("stat");
                seen.insert(p.clone(), (*kind, a.ino, a.mode, a.size));
                if *kind == FileType::Directory {
                    stack.push(p);
                }
            }
            lists.insert(dir, l);
        }
        (seen, lists)
    }

    fn walk_backend(b: &dyn Backend) -> (Seen, Lists) {
        let mut seen = Seen::new();
        let mut lists = BTreeMap::new();
        let mut stack = vec![Vec::new()];
        while let Some(dir) = stack.pop() {
            let l = names(b, &dir);
            for (name, kind, _) in &l {
                let p = join(&dir, name);
                let a = b.getattr(&p).expect("getattr");
                seen.insert(p.clone(), (*kind, a.ino, a.mode, a.size));
                if *kind == FileType::Directory {
                    stack.push(p);
                }
            }
            lists.insert(dir, l);
        }
        (seen, lists)
    }

    fn missing(c: &Cache, path: &[u8]) -> bool {
        let cr = c.credentials(Cred::root());
        matches!(
            c.stat(&cr, At::Root, path, LookupFlags::NOFOLLOW),
            Err(Error::NotFound)
        )
    }

    #[test]
    fn unchanged_tree_is_served_from_the_snapshot() {
        let (b, _d, p) = setup();
        let c1 = cache(&b);
        let (seen1, lists1) = walk_cache(&c1);
        // A negative in a directory that was never listed: `e` is looked up into, not listed.
        let c1b = cache(&b);
        let cr = c1b.credentials(Cred::root());
        c1b.stat(&cr, At::Root, b"e/keep", LookupFlags::NOFOLLOW)
            .expect("e/keep");
        assert!(missing(&c1b, b"e/nope"));
        drop(c1b);
        let r = c1.save_snapshot(&p).expect("save");
        assert_eq!(r.listings as usize, lists1.len(), "{r:?}");
        assert_eq!(r.racy, 0);
        assert_eq!(r.stale_in_cache, 0);

        let c2 = cache(&b);
        let l = c2.load_snapshot(&p).expect("load");
        assert_eq!(l.validated as usize, lists1.len(), "{l:?}");
        assert_eq!((l.changed, l.missing), (0, 0));
        let before = c2.stats();
        let (seen2, lists2) = walk_cache(&c2);
        assert_eq!(lists2, lists1);
        assert_eq!(seen2, seen1);
        // Listings came from the snapshot: no backend readdir, and a miss in a restored
        // complete directory asks nobody.
        assert_eq!(c2.stats().backend_readdir, before.backend_readdir);
        let calls = b.calls();
        assert!(missing(&c2, b"a/absent"));
        assert!(missing(&c2, b"a/sub/deeper/none"));
        assert_eq!(b.calls(), calls, "misses in restored complete directories");
    }

    #[test]
    fn negatives_of_unlisted_directories_are_restored_and_revalidated() {
        let (b, _d, p) = setup();
        let root = Cred::root();
        let c1 = cache(&b);
        let cr = c1.credentials(root.clone());
        c1.stat(&cr, At::Root, b"e/keep", LookupFlags::NOFOLLOW)
            .expect("e/keep");
        c1.stat(&cr, At::Root, b"b/x", LookupFlags::NOFOLLOW)
            .expect("b/x");
        assert!(missing(&c1, b"e/nope"));
        assert!(missing(&c1, b"b/nope"));
        let r = c1.save_snapshot(&p).expect("save");
        assert_eq!(r.negatives, 2, "{r:?}");
        // While unmounted: b/nope comes into existence; e is untouched.
        b.mknod(&root, b"b/nope", libc::S_IFREG | 0o600, 0)
            .expect("mknod");
        let c2 = cache(&b);
        let l = c2.load_snapshot(&p).expect("load");
        assert_eq!(l.negatives, 1, "{l:?}");
        assert_eq!(l.changed, 1, "{l:?}");
        let calls = b.calls();
        assert!(missing(&c2, b"e/nope"));
        assert_eq!(
            b.calls(),
            calls,
            "e/nope answered from the restored negative"
        );
        let cr = c2.credentials(root.clone());
        let a = c2
            .stat(&cr, At::Root, b"b/nope", LookupFlags::NOFOLLOW)
            .expect("b/nope");
        assert_eq!(a.perm(), 0o600);
    }

    #[test]
    fn changes_between_mounts_are_never_served_stale() {
        let (b, _d, p) = setup();
        let root = Cred::root();
        let c1 = cache(&b);
        let _ = walk_cache(&c1);
        assert!(missing(&c1, b"a/later"));
        let r = c1.save_snapshot(&p).expect("save");
        assert!(r.listings >= 8, "{r:?}");
        // While unmounted:
        b.mknod(&root, b"a/later", libc::S_IFREG | 0o644, 0)
            .expect("add");
        b.unlink(&root, b"b/x").expect("remove");
        b.rename(&root, b"b/y", b"b/y2", RenameMode::Replace)
            .expect("rename in dir");
        b.rename(&root, b"e/keep", b"c/kept", RenameMode::Replace)
            .expect("rename across");
        let chmod = SetAttr {
            mode: Some(0o600),
            ..Default::default()
        };
        b.setattr(&root, b"a/f1", &chmod).expect("chmod file");
        b.setattr(&root, b"a/sub", &chmod).expect("chmod dir");
        b.rename(&root, b"a/sub/deeper", b"c/deeper", RenameMode::Replace)
            .expect("move dir");
        b.unlink(&root, b"d/inner/z").expect("empty d/inner");
        b.rmdir(&root, b"d/inner").expect("rmdir");
        b.mknod(&root, b"d/inner", libc::S_IFREG | 0o640, 0)
            .expect("dir replaced by a file");
        b.rename(&root, b"top", b"a/top", RenameMode::Replace)
            .expect("move up");

        let c2 = cache(&b);
        let l = c2.load_snapshot(&p).expect("load");
        let (seen2, lists2) = walk_cache(&c2);
        let (truth, lists) = walk_backend(&*b);
        assert_eq!(lists2, lists);
        assert_eq!(seen2, truth);
        assert!(l.changed >= 6 && l.missing >= 1, "{l:?}");
        assert!(
            l.validated >= 2,
            "untouched directories are still trusted: {l:?}"
        );
        let cr = c2.credentials(root.clone());
        for p in [&b"a/later"[..], b"b/y2", b"c/kept", b"c/deeper/h", b"a/top"] {
            c2.stat(&cr, At::Root, p, LookupFlags::NOFOLLOW)
                .unwrap_or_else(|e| panic!("{}: {e}", String::from_utf8_lossy(p)));
        }
        for p in [&b"b/x"[..], b"b/y", b"e/keep", b"a/sub/deeper", b"top"] {
            assert!(missing(&c2, p), "{}", String::from_utf8_lossy(p));
        }
        assert_eq!(
            c2.stat(&cr, At::Root, b"d/inner/z", LookupFlags::NOFOLLOW),
            Err(Error::NotDir)
        );
    }

    /// Random trees, random changes while "unmounted": the loaded cache always agrees with
    /// the backend, entry by entry and name by name (negatives included).
    #[test]
    fn random_changes_between_mounts_are_never_served_stale() {
        use rand::{Rng, SeedableRng};
        let root = Cred::root();
        let (mut trusted, mut changed) = (0, 0);
        for seed in 0..40u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let b = Arc::new(MemoryBackend::new());
            let dirs = ["p", "p/q", "p/q/r", "s", "s/t", "u", "u/v", "u/v/w"];
            let mut spec: Vec<String> = dirs.iter().map(|d| format!("{d}/")).collect();
            for d in &dirs {
                for i in 0..rng.gen_range(0..4) {
                    spec.push(format!("{d}/f{i}"));
                }
            }
            let spec: Vec<&str> = spec.iter().map(String::as_str).collect();
            b.populate(&spec);
            let d = tempfile::tempdir().expect("tempdir");
            let mut p = Persist::new(d.path().join("snap"), b"memory:random".to_vec());
            p.racy = Duration::ZERO;
            let c1 = cache(&b);
            // Some directories listed, some only looked into; some names probed missing.
            let cr = c1.credentials(root.clone());
            let names = ["f0", "f1", "f2", "f3", "n0", "n1", "q", "r", "t", "x"];
            for dir in dirs.iter().chain(std::iter::once(&"")) {
                if rng.gen_bool(0.6) {
                    let path = if dir.is_empty() { "/" } else { dir };
                    if let Ok(n) = c1.lookup(&cr, At::Root, path.as_bytes(), LookupFlags::NOFOLLOW)
                    {
                        let _ = c1.readdir_node(&cr, &n, false);
                    }
                }
                for n in names {
                    if rng.gen_bool(0.3) {
                        let _ = c1.stat(
                            &cr,
                            At::Root,
                            &join(dir.as_bytes(), n.as_bytes()),
                            LookupFlags::NOFOLLOW,
                        );
                    }
                }
            }
            c1.save_snapshot(&p).expect("save");
            // While unmounted: random changes, failures ignored.
            let all: Vec<&str> = dirs.iter().copied().chain(std::iter::once("")).collect();
            let pick = |rng: &mut rand::rngs::StdRng| {
                let dir = all[rng.gen_range(0..all.len())];
                join(
                    dir.as_bytes(),
                    names[rng.gen_range(0..names.len())].as_bytes(),
                )
            };
            for _ in 0..rng.gen_range(1..8) {
                let a = pick(&mut rng);
                let z = pick(&mut rng);
                let _ = match rng.gen_range(0..7) {
                    0 => b.mknod(&root, &a, libc::S_IFREG | 0o644, 0).map(drop),
                    1 => b.unlink(&root, &a),
                    2 => b.mkdir(&root, &a, 0o755).map(drop),
                    3 => b.rmdir(&root, &a),
                    4 | 5 => b.rename(&root, &a, &z, RenameMode::Replace),
                    _ => b
                        .setattr(
                            &root,
                            &a,
                            &SetAttr {
                                mode: Some(0o700),
                                ..Default::default()
                            },
                        )
                        .map(drop),
                };
            }
            let c2 = cache(&b);
            let l = c2.load_snapshot(&p).expect("load");
            trusted += l.listings + l.negatives;
            changed += l.changed;
            for dir in &all {
                for n in names {
                    let path = join(dir.as_bytes(), n.as_bytes());
                    let want = b.getattr(&path).map(|a| (a.ino, a.mode));
                    let cr2 = c2.credentials(root.clone());
                    let got = c2
                        .stat(&cr2, At::Root, &path, LookupFlags::NOFOLLOW)
                        .map(|a| (a.ino, a.mode));
                    match (want, got) {
                        (Ok(w), Ok(g)) => {
                            assert_eq!(w, g, "seed {seed}: {}", String::from_utf8_lossy(&path))
                        }
                        (Err(_), Err(_)) => {}
                        (w, g) => panic!(
                            "seed {seed}: {}: backend {w:?}, cache {g:?}",
                            String::from_utf8_lossy(&path)
                        ),
                    }
                }
            }
            assert_eq!(walk_cache(&c2), walk_backend(&*b), "seed {seed}");
        }
        // Not vacuous: snapshots were used, and changes were seen.
        assert!(trusted > 100 && changed > 40, "{trusted} {changed}");
    }

    /// Contents are installed at a directory's first use, not at load: a change made through
    /// the cache, or reported from outside, in between must win over them.
    #[test]
    fn pending_contents_never_override_later_changes() {
        let (b, _d, p) = setup();
        let root = Cred::root();
        let c1 = cache(&b);
        let _ = walk_cache(&c1);
        assert!(missing(&c1, b"e/nope"));
        c1.save_snapshot(&p).expect("save");
        let c2 = cache(&b);
        let l = c2.load_snapshot(&p).expect("load");
        assert!(l.listings >= 10, "{l:?}");
        let cr = c2.credentials(root.clone());
        // Through the cache, before anything was read from a.
        c2.mkdir(&cr, At::Root, b"a/made", 0o755).expect("mkdir");
        // Behind its back, reported: b/new appears, c/ too.
        b.mknod(&root, b"b/new", libc::S_IFREG | 0o644, 0)
            .expect("mknod");
        c2.apply_change(&Change::Entry {
            path: b"b/new".to_vec(),
        });
        b.mknod(&root, b"c/fresh", libc::S_IFREG | 0o644, 0)
            .expect("mknod");
        c2.invalidate(b"c/fresh");
        for p in [&b"a/made"[..], b"b/new", b"c/fresh"] {
            c2.stat(&cr, At::Root, p, LookupFlags::NOFOLLOW)
                .unwrap_or_else(|e| panic!("{}: {e}", String::from_utf8_lossy(p)));
        }
        assert_eq!(walk_cache(&c2), walk_backend(&*b));
        // Untouched directories were still served from the snapshot.
        assert!(missing(&c2, b"f/untouched/none"));
    }

    #[test]
    fn directories_changed_within_the_racy_window_are_not_trusted() {
        let (b, _d, mut p) = setup();
        let c1 = cache(&b);
        let _ = walk_cache(&c1);
        // Every directory was just created: all within 2 s of the save.
        p.racy = Duration::from_secs(2);
        let r = c1.save_snapshot(&p).expect("save");
        assert_eq!(r.listings, 0, "{r:?}");
        assert_eq!(r.racy, r.dirs, "{r:?}");
        let c2 = cache(&b);
        let l = c2.load_snapshot(&p).expect("load");
        assert_eq!((l.listings, l.negatives), (0, 0), "{l:?}");
        let before = c2.stats().backend_readdir;
        let _ = walk_cache(&c2);
        assert!(c2.stats().backend_readdir > before);
    }

    #[test]
    fn the_backend_listing_is_saved_when_the_cache_missed_a_change() {
        let (b, _d, p) = setup();
        let c1 = cache(&b);
        let _ = walk_cache(&c1);
        // Behind the cache's back, without a change feed: c1 still lists b/x.
        b.unlink(&Cred::root(), b"b/x").expect("unlink");
        let r = c1.save_snapshot(&p).expect("save");
        assert_eq!(r.stale_in_cache, 1, "{r:?}");
        let c2 = cache(&b);
        c2.load_snapshot(&p).expect("load");
        assert!(missing(&c2, b"b/x"));
        assert_eq!(walk_cache(&c2), walk_backend(&*b));
    }

    fn header_and_payload(bytes: &[u8]) -> (Vec<u8>, Vec<u8>) {
        (bytes[..HEADER].to_vec(), bytes[HEADER..].to_vec())
    }

    fn with_payload(payload: &[u8]) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        out.extend_from_slice(&checksum(payload).to_le_bytes());
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn bad_snapshots_are_ignored_without_harm() {
        let (b, d, p) = setup();
        let c1 = cache(&b);
        let _ = walk_cache(&c1);
        c1.save_snapshot(&p).expect("save");
        let good = std::fs::read(&p.path).expect("read");
        let mode = std::fs::metadata(&p.path)
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let bad = d.path().join("bad");
        let try_load = |bytes: &[u8]| -> PersistError {
            let _ = std::fs::remove_file(&bad);
            std::fs::write(&bad, bytes).expect("write");
            std::fs::set_permissions(&bad, std::fs::Permissions::from_mode(0o600)).expect("chmod");
            let c = cache(&b);
            let e = c
                .load_snapshot(&Persist {
                    path: bad.clone(),
                    ..p.clone()
                })
                .expect_err("a bad snapshot must be refused");
            // Nothing was installed, and the cache works.
            assert_eq!(c.stats().entries, 1);
            assert_eq!(walk_cache(&c), walk_backend(&*b));
            e
        };
        for cut in [
            0,
            5,
            HEADER - 1,
            HEADER,
            HEADER + 1,
            good.len() / 2,
            good.len() - 1,
        ] {
            assert!(
                matches!(try_load(&good[..cut]), PersistError::Corrupt(..)),
                "cut {cut}"
            );
        }
        for i in [0, 9, 13, 21, HEADER, HEADER + 7, good.len() - 1] {
            let mut f = good.clone();
            f[i] ^= 0x41;
            let e = try_load(&f);
            assert!(
                matches!(e, PersistError::Corrupt(..) | PersistError::Version(..)),
                "flip {i}: {e}"
            );
        }
        let mut v2 = good.clone();
        v2[8..12].copy_from_slice(&2u32.to_le_bytes());
        assert!(matches!(try_load(&v2), PersistError::Version(_, 2)));
        // Garbage that passes the checksum does not decode.
        let (_, payload) = header_and_payload(&good);
        let garbage: Vec<u8> = payload
            .iter()
            .map(|x| x.wrapping_mul(31).wrapping_add(7))
            .collect();
        // (The payload holds the memory backend's times, so the garbage differs from run to
        // run: now and then it decodes as far as a source name, which is then another tree's.)
        let e = try_load(&with_payload(&garbage));
        assert!(
            matches!(e, PersistError::Corrupt(..) | PersistError::Foreign(..)),
            "{e}"
        );
        // A well-formed snapshot with a malformed tree: a parent after its child, a `..` name.
        let mut snap: Snapshot = postcard::from_bytes(&payload).expect("decode");
        snap.dirs[1].parent = Some(5);
        let e = try_load(&with_payload(
            &postcard::to_allocvec(&snap).expect("encode"),
        ));
        assert!(matches!(e, PersistError::Corrupt(..)), "{e}");
        let mut snap: Snapshot = postcard::from_bytes(&payload).expect("decode");
        snap.dirs[1].name = b"..".to_vec();
        let e = try_load(&with_payload(
            &postcard::to_allocvec(&snap).expect("encode"),
        ));
        assert!(matches!(e, PersistError::Corrupt(..)), "{e}");
        // Another tree: another source name, another root inode.
        let mut snap: Snapshot = postcard::from_bytes(&payload).expect("decode");
        snap.source = b"memory:other".to_vec();
        let e = try_load(&with_payload(
            &postcard::to_allocvec(&snap).expect("encode"),
        ));
        assert!(matches!(e, PersistError::Foreign(..)), "{e}");
        let mut snap: Snapshot = postcard::from_bytes(&payload).expect("decode");
        snap.root_ino += 1;
        let e = try_load(&with_payload(
            &postcard::to_allocvec(&snap).expect("encode"),
        ));
        assert!(matches!(e, PersistError::Foreign(..)), "{e}");
        // Readable by others, a symlink, a directory: refused.
        std::fs::set_permissions(&p.path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        assert!(matches!(
            cache(&b).load_snapshot(&p),
            Err(PersistError::Unsafe(..))
        ));
        std::fs::set_permissions(&p.path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&p.path, &link).expect("symlink");
        let via = Persist {
            path: link,
            ..p.clone()
        };
        assert!(matches!(
            cache(&b).load_snapshot(&via),
            Err(PersistError::Io(..))
        ));
        let via = Persist {
            path: d.path().to_path_buf(),
            ..p.clone()
        };
        assert!(cache(&b).load_snapshot(&via).is_err());
        // Only into a fresh cache.
        assert!(matches!(c1.load_snapshot(&p), Err(PersistError::NotFresh)));
        // And the good one still loads.
        assert!(cache(&b).load_snapshot(&p).is_ok());
    }

    #[test]
    fn save_replaces_the_file_atomically() {
        let (b, d, p) = setup();
        let c1 = cache(&b);
        let _ = walk_cache(&c1);
        std::fs::write(&p.path, b"old").expect("write");
        c1.save_snapshot(&p).expect("save");
        assert!(cache(&b).load_snapshot(&p).is_ok());
        let left: Vec<_> = std::fs::read_dir(d.path())
            .expect("ls")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(
            left,
            vec![std::ffi::OsString::from("snap")],
            "no temporary left"
        );
    }
}
