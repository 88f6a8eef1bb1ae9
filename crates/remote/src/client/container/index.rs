//! The persistent index of a per-remote container directory ("Coda on a remote mount", step 5:
//! containers survive the mount).
//!
//! A remote (`[user@]host:path`, the port and the daemon's uid) has one directory
//! `r-<hash>` in the cache base, 0700, holding the container files `c<N>` (0600), a `lock`
//! file and the `index`. A mount holds `lock` (flock, exclusive) while it runs; a second
//! mount of the same remote finds it held and uses a per-mount directory instead (removed when
//! it ends). The lock dies with its process, so a killed client leaves nothing held.
//!
//! **The index** records, for each container that was whole, clean and not open for writing
//! when it was written: its file name, the remote path, the server's attributes of the version
//! it holds (dev, ino, size, mtime, ctime...), the container file's own size, mtime and ctime
//! after the fetch or store, the credentials the server granted a read-only open (with the
//! attributes of every ancestor directory they were granted under), and its LRU age. It is
//! small (postcard), versioned (a magic and a version number: any other is ignored), and
//! written atomically (a temporary file, fsync, rename, fsync of the directory), mode 0600.
//!
//! **Invariant (nothing stale, nothing half-fetched).** A name the index lists is never
//! written to again: before a listed container is modified (fetched again, opened for
//! writing, truncated or its times set) it is renamed to a fresh name (names are never
//! reused), so the index's name for it no longer exists. A container being fetched or
//! written is never listed. At load, an entry whose file is missing, is not a regular file
//! owned by the daemon's user with mode 0600, or whose size, mtime or ctime differ from the
//! recorded ones is dropped, and every file the index does not list (a half-fetched
//! container of a killed client, a temporary index) is removed.

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};

use dircache_core::{Attr, Timespec};
use rustix::fs::{AtFlags, Mode, OFlags};
use serde::{Deserialize, Serialize};

/// First bytes of an index file, then the version (u32, little endian), then the body.
const MAGIC: &[u8; 8] = b"DCCIDX\0\0";
const VERSION: u32 = 1;
/// An index larger than this is not read (a corrupt or foreign file).
const MAX_INDEX: u64 = 256 << 20;

pub(super) const INDEX: &str = "index";
const INDEX_TMP: &str = "index.tmp";
pub(super) const LOCK: &str = "lock";

/// One container in the index.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct IndexEntry {
    pub name: String,
    #[serde(with = "serde_bytes")]
    pub path: Vec<u8>,
    /// The server's attributes of the version held.
    pub attr: Attr,
    /// The container file's size, mtime and ctime after its fetch or store.
    pub local: (u64, Timespec, Timespec),
    /// Credentials (uid, gid, groups) the server granted a read-only open.
    pub readers: Vec<(u32, u32, Vec<u32>)>,
    /// The attributes of each ancestor directory (outermost first, the root excluded) when
    /// the reads were granted; empty with no readers.
    pub ancestors: Vec<Attr>,
    pub used: u64,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct IndexFile {
    /// The remote's identity: an index of another remote is ignored.
    pub remote: String,
    pub entries: Vec<IndexEntry>,
}

/// The directory name of a remote's containers: FNV-1a of its identity.
pub(super) fn dir_name(identity: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in identity.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("r-{h:016x}")
}

/// Take the directory's lock without waiting: `None` when another process holds it.
pub(super) fn lock(dir: &OwnedFd) -> std::io::Result<Option<OwnedFd>> {
    let fd = rustix::fs::openat(
        dir,
        LOCK,
        OFlags::CREATE | OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::from_raw_mode(0o600),
    )?;
    match rustix::fs::flock(&fd, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(Some(fd)),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// A file in `dir` that is ours: a regular file owned by the daemon's user, mode 0600, not
/// a link (opened with O_NOFOLLOW, checked on the descriptor).
pub(super) fn open_ours(dir: &OwnedFd, name: &str, flags: OFlags) -> Option<OwnedFd> {
    let fd = rustix::fs::openat(
        dir,
        name,
        flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let s = rustix::fs::fstat(&fd).ok()?;
    let me = rustix::process::geteuid().as_raw();
    (s.st_mode & libc::S_IFMT == libc::S_IFREG && s.st_uid == me && s.st_mode & 0o777 == 0o600)
        .then_some(fd)
}

/// The index of `dir`, if it is there, ours, of this version and of `remote`.
pub(super) fn load(dir: &OwnedFd, remote: &str) -> Option<IndexFile> {
    let fd = open_ours(dir, INDEX, OFlags::RDONLY)?;
    let mut f = std::fs::File::from(fd);
    let mut buf = Vec::new();
    if let Err(e) = (&mut f).take(MAX_INDEX).read_to_end(&mut buf) {
        tracing::warn!("container index: {e}");
        return None;
    }
    let Some(body) = buf.strip_prefix(MAGIC.as_slice()) else {
        tracing::warn!("container index: not an index; ignored");
        return None;
    };
    let (ver, body) = body.split_at_checked(4)?;
    if ver != VERSION.to_le_bytes() {
        tracing::warn!("container index: version {ver:?}, not {VERSION}; ignored");
        return None;
    }
    match postcard::from_bytes::<IndexFile>(body) {
        Ok(i) if i.remote == remote => Some(i),
        Ok(i) => {
            tracing::warn!("container index of {:?}, not {remote:?}; ignored", i.remote);
            None
        }
        Err(e) => {
            tracing::warn!("container index: {e}; ignored");
            None
        }
    }
}

/// Write `index` atomically: a temporary file (0600), fsync, rename over the index, fsync of
/// the directory.
pub(super) fn write(dir: &OwnedFd, index: &IndexFile) -> std::io::Result<()> {
    let body = postcard::to_stdvec(index).map_err(std::io::Error::other)?;
    let _ = rustix::fs::unlinkat(dir, INDEX_TMP, AtFlags::empty());
    let fd = rustix::fs::openat(
        dir,
        INDEX_TMP,
        OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::from_raw_mode(0o600),
    )?;
    let mut f = std::fs::File::from(fd);
    f.write_all(MAGIC)?;
    f.write_all(&VERSION.to_le_bytes())?;
    f.write_all(&body)?;
    f.sync_all()?;
    rustix::fs::renameat(dir, INDEX_TMP, dir, INDEX)?;
    rustix::fs::fsync(dir.as_fd())?;
    Ok(())
}

/// The container file `name` as the index recorded it (size, mtime, ctime), or `None`.
pub(super) fn open_unchanged(dir: &OwnedFd, e: &IndexEntry) -> Option<std::fs::File> {
    let valid_name = e.name.len() > 1
        && e.name.starts_with('c')
        && e.name[1..].bytes().all(|b| b.is_ascii_digit());
    if !valid_name {
        return None;
    }
    let fd = open_ours(dir, &e.name, OFlags::RDWR)?;
    let s = rustix::fs::fstat(&fd).ok()?;
    let now = (
        s.st_size as u64,
        Timespec {
            sec: s.st_mtime,
            nsec: s.st_mtime_nsec as u32,
        },
        Timespec {
            sec: s.st_ctime,
            nsec: s.st_ctime_nsec as u32,
        },
    );
    (now == e.local).then(|| std::fs::File::from(fd))
}

/// Remove every file of `dir` but the lock, the index and `keep` (orphans: containers of a
/// killed client, half-fetched ones, a temporary index).
pub(super) fn remove_others(dir: &OwnedFd, keep: &std::collections::HashSet<String>) -> usize {
    let Ok(d) = rustix::fs::Dir::read_from(dir) else {
        return 0;
    };
    let mut removed = 0;
    for ent in d.flatten() {
        let Ok(name) = ent.file_name().to_str() else {
            continue;
        };
        if name == "." || name == ".." || name == LOCK || name == INDEX || keep.contains(name) {
            continue;
        }
        if rustix::fs::unlinkat(dir, name, AtFlags::empty()).is_ok() {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> (tempfile::TempDir, OwnedFd) {
        let t = tempfile::tempdir().unwrap();
        let fd =
            rustix::fs::open(t.path(), OFlags::DIRECTORY | OFlags::RDONLY, Mode::empty()).unwrap();
        (t, fd)
    }

    #[test]
    fn an_index_round_trips_and_others_are_ignored() {
        let (t, d) = dir();
        let idx = IndexFile {
            remote: "u@h:/p".into(),
            entries: vec![IndexEntry {
                name: "c3".into(),
                path: b"a/b".to_vec(),
                attr: Attr {
                    ino: 7,
                    size: 5,
                    ..Default::default()
                },
                local: (5, Timespec::default(), Timespec::default()),
                readers: vec![(1, 2, vec![3])],
                ancestors: vec![Attr::default()],
                used: 9,
            }],
        };
        write(&d, &idx).unwrap();
        let back = load(&d, "u@h:/p").unwrap();
        assert_eq!(back.entries.len(), 1);
        assert_eq!(back.entries[0].path, b"a/b");
        assert_eq!(back.entries[0].readers, vec![(1, 2, vec![3])]);
        assert!(load(&d, "other:/p").is_none(), "another remote's index");
        let p = t.path().join(INDEX);
        let mut bytes = std::fs::read(&p).unwrap();
        bytes[8] = 99;
        std::fs::write(&p, &bytes).unwrap();
        assert!(load(&d, "u@h:/p").is_none(), "another version");
        std::fs::write(&p, b"garbage").unwrap();
        assert!(load(&d, "u@h:/p").is_none(), "garbage");
        // Not 0600: refused.
        write(&d, &idx).unwrap();
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
        assert!(load(&d, "u@h:/p").is_none(), "mode 0644");
    }

    #[test]
    fn the_lock_is_exclusive_between_descriptions() {
        let (_t, d) = dir();
        let a = lock(&d).unwrap();
        assert!(a.is_some());
        assert!(lock(&d).unwrap().is_none(), "held");
        drop(a);
        assert!(lock(&d).unwrap().is_some(), "released with the descriptor");
    }
}
