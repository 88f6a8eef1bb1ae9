//! File data of the in-memory backend: one memfd per regular file.
//!
//! A regular file's content lives in a memfd (an anonymous tmpfs file), created when the file
//! first needs data (an open, a truncation): a tree of empty files made for a metadata test
//! holds no descriptors. [`MemoryBackend::open`](super::MemoryBackend) reopens the memfd
//! through `/proc/self/fd/N` with the caller's access mode and O_APPEND, so each open (a
//! [`MemFile`](super::MemFile)) is a new open file description with flags of its own, as on
//! a real file system; hard links share the inode and so the memfd; an open file keeps the
//! data of a file unlinked meanwhile (its description holds the memfd).
//!
//! **Invariant (attributes).** A regular file with content has two halves: the backend's
//! [`Attr`] (inode number, type and mode, owner, link count, and the ctime of metadata
//! changes) and the memfd's (size, blocks, atime, mtime, and the ctime of data changes,
//! moved by the kernel on every write through any descriptor). Every attribute answer merges
//! them ([`Content::merge`]): size, blocks, atime and mtime from the memfd, ctime the later of
//! the two. The memfd's ctime counts only once the memfd changed after it was set up (its
//! set-up times are remembered), so that opening an old file for reading does not move its
//! ctime. Truncation and explicit times go to the memfd, so both halves agree.
//!
//! (Orphans, the attributes of unlinked open files: see `memory/file.rs`.)

use std::os::fd::{AsRawFd, OwnedFd};

use crate::{Attr, Error, Result, Timespec};

fn os(e: rustix::io::Errno) -> Error {
    Error::from_errno(e.raw_os_error())
}

fn name(ino: u64) -> String {
    format!("dircache-mem-{ino}")
}

fn ts(sec: i64, nsec: u64) -> Timespec {
    Timespec {
        sec,
        nsec: nsec as u32,
    }
}

fn rts(t: Option<Timespec>) -> rustix::fs::Timespec {
    match t {
        None => rustix::fs::Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_OMIT,
        },
        Some(t) => rustix::fs::Timespec {
            tv_sec: t.sec,
            tv_nsec: i64::from(t.nsec) as _,
        },
    }
}

/// The memfd's times, (mtime, ctime).
fn times(st: &rustix::fs::Stat) -> (Timespec, Timespec) {
    #[allow(clippy::unnecessary_cast)]
    (
        ts(st.st_mtime as i64, st.st_mtime_nsec as u64),
        ts(st.st_ctime as i64, st.st_ctime_nsec as u64),
    )
}

/// The content of one regular file.
pub(super) struct Content {
    fd: OwnedFd,
    /// The memfd's (mtime, ctime) when it was set up.
    setup: (Timespec, Timespec),
}

/// Attributes `a` with the data half taken from the memfd's `st`. `moved`: whether the
/// memfd's ctime counts (it changed since set-up).
pub(super) fn merge_stat(mut a: Attr, st: &rustix::fs::Stat, moved: bool) -> Attr {
    #[allow(clippy::unnecessary_cast)]
    {
        a.size = st.st_size as u64;
        a.blocks = st.st_blocks as u64;
        a.atime = ts(st.st_atime as i64, st.st_atime_nsec as u64);
    }
    let (m, c) = times(st);
    a.mtime = m;
    if moved && c > a.ctime {
        a.ctime = c;
    }
    a
}

impl Content {
    /// A new, empty memfd for inode `ino`, with `a`'s size and times.
    pub(super) fn new(ino: u64, a: &Attr) -> Result<Content> {
        let fd =
            rustix::fs::memfd_create(name(ino), rustix::fs::MemfdFlags::CLOEXEC).map_err(os)?;
        if a.size > 0 {
            rustix::fs::ftruncate(&fd, a.size).map_err(os)?;
        }
        let t = rustix::fs::Timestamps {
            last_access: rts(Some(a.atime)),
            last_modification: rts(Some(a.mtime)),
        };
        rustix::fs::futimens(&fd, &t).map_err(os)?;
        let st = rustix::fs::fstat(&fd).map_err(os)?;
        Ok(Content {
            fd,
            setup: times(&st),
        })
    }

    /// `a` merged with the memfd's attributes now (module docs).
    pub(super) fn merge(&self, a: Attr) -> Result<Attr> {
        let st = rustix::fs::fstat(&self.fd).map_err(os)?;
        Ok(self.merge_with(a, &st))
    }

    /// `a` merged with `st`, a stat of this memfd (through any descriptor).
    pub(super) fn merge_with(&self, a: Attr, st: &rustix::fs::Stat) -> Attr {
        merge_stat(a, st, times(st) != self.setup)
    }

    /// Truncate or extend to `size`, with mtime `t` (as truncate(2) at time `t`).
    pub(super) fn resize(&self, size: u64, t: Timespec) -> Result<()> {
        rustix::fs::ftruncate(&self.fd, size).map_err(os)?;
        self.set_times(None, Some(t))
    }

    /// Set the atime and/or mtime (`None`: leave alone).
    pub(super) fn set_times(&self, atime: Option<Timespec>, mtime: Option<Timespec>) -> Result<()> {
        if atime.is_none() && mtime.is_none() {
            return Ok(());
        }
        let t = rustix::fs::Timestamps {
            last_access: rts(atime),
            last_modification: rts(mtime),
        };
        rustix::fs::futimens(&self.fd, &t).map_err(os)
    }

    /// A new open file description of the memfd with open(2) `flags` (access mode, O_APPEND,
    /// O_NONBLOCK, O_SYNC, O_DSYNC, O_NOATIME; others ignored), close-on-exec.
    pub(super) fn reopen(&self, flags: i32) -> Result<OwnedFd> {
        let keep = libc::O_ACCMODE
            | libc::O_APPEND
            | libc::O_NONBLOCK
            | libc::O_DSYNC
            | libc::O_SYNC
            | libc::O_NOATIME;
        let fl = rustix::fs::OFlags::from_bits_retain((flags & keep) as u32)
            | rustix::fs::OFlags::CLOEXEC;
        let p = format!("/proc/self/fd/{}", self.fd.as_raw_fd());
        rustix::fs::open(p.as_str(), fl, rustix::fs::Mode::empty()).map_err(os)
    }
}

/// The calling thread's umask (`/proc/thread-self/status`), without changing it.
pub(super) fn thread_umask() -> Result<u32> {
    let s = std::fs::read_to_string("/proc/thread-self/status")?;
    s.lines()
        .find_map(|l| l.strip_prefix("Umask:"))
        .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        .ok_or(Error::Os(libc::EIO))
}
