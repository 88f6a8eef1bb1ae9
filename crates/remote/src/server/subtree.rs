//! `Subtree` calls: a directory's whole subtree, every listing with every entry's attributes,
//! read by several threads at once and streamed as it is read.
//!
//! The requested directory's own listing is read first and leaves at once in a frame of its
//! own (the client's walker is waiting for it). Below it, [`WALKERS`] threads take directories
//! from one queue (roughly breadth first: a listing's subdirectories join the back of the
//! queue) and read each one (getdents and one statx per entry, through the server's cache,
//! and which entries have no extended attributes); the calling thread packs the listings into
//! frames as they come and sends a frame whenever no listing is waiting (so the client gets
//! what is read as soon as it is read) or the frame is full. Several directories being read at
//! once keep the disk busy on a cold tree, where one statx after another waits for one inode
//! block after another.
//!
//! Bounds, as before: at most `budget` entries below the root, whole directories only (the
//! first directory that does not fit ends the walk: `complete: false`); a directory that
//! cannot be read is skipped; a directory's listing may span frames, its pieces adjacent;
//! frames hold at most [`ENTRIES_PER_FRAME`] entries and about 1 MiB. Memory: the listings
//! read but not yet packed are at most [`READ_AHEAD`] directories.

use std::collections::VecDeque;
use std::os::unix::ffi::OsStrExt;

use crossbeam_channel::{bounded, TryRecvError};
use dircache_core::{DirEntry, FileType};
use parking_lot::{Condvar, Mutex};

use super::{send, Shared};
use crate::prefetch::join;
use crate::proto::{Reply, ServerMsg, SubtreeDir, ENTRIES_PER_FRAME};

/// Threads reading directories for one `Subtree` call.
pub const WALKERS: usize = 4;

/// Listings read and not yet packed into frames, at most.
pub const READ_AHEAD: usize = 64;

/// Frames stay below this many bytes of names, paths and attributes (estimated).
const FRAME_BYTES: usize = 1 << 20;

struct Walk {
    queue: VecDeque<Vec<u8>>,
    /// Walkers reading a directory now.
    busy: usize,
    /// Entries still allowed below the root.
    left: u64,
    /// A directory did not fit: the walk stops, incomplete.
    cut: bool,
    /// The client is gone: stop.
    stop: bool,
}

/// Answer call `id`: the subtree of `root`, at most `budget` entries below it (module docs).
pub(super) fn run(s: &Shared, id: u64, root: &[u8], budget: u64) {
    let entries = match s.backend.readdir(root, true) {
        Ok(e) => e,
        Err(e) => {
            send(
                &s.out,
                &ServerMsg::Reply {
                    id,
                    last: true,
                    body: Err(e.errno()),
                },
            );
            return;
        }
    };
    let mut out = Packer {
        s,
        id,
        batch: Vec::new(),
        entries: 0,
        bytes: 0,
    };
    let queue: VecDeque<Vec<u8>> = subdirs(b"", &entries).collect();
    let bare = bare_entries(s, root, &entries);
    if !out.push(Vec::new(), entries, bare) {
        return;
    }
    if queue.is_empty() {
        out.flush(true, true);
        return;
    }
    // The root's listing leaves now: the client is waiting for it.
    if !out.flush(false, false) {
        return;
    }
    let walk = Mutex::new(Walk {
        queue,
        busy: 0,
        left: budget,
        cut: false,
        stop: false,
    });
    let changed = Condvar::new();
    let (tx, rx) = bounded::<(Vec<u8>, Vec<DirEntry>, Vec<bool>)>(READ_AHEAD);
    let sent = std::thread::scope(|scope| {
        for _ in 0..WALKERS {
            let tx = tx.clone();
            let (walk, changed) = (&walk, &changed);
            scope.spawn(move || walker(s, root, walk, changed, tx));
        }
        drop(tx);
        let sent = loop {
            let (rel, entries, bare) = match rx.try_recv() {
                Ok(l) => l,
                Err(TryRecvError::Empty) => {
                    // Nothing read yet: what is packed leaves now.
                    if !out.batch.is_empty() && !out.flush(false, false) {
                        break false;
                    }
                    match rx.recv() {
                        Ok(l) => l,
                        Err(_) => break true,
                    }
                }
                Err(TryRecvError::Disconnected) => break true,
            };
            if !out.push(rel, entries, bare) {
                break false;
            }
        };
        if !sent {
            // The client is gone: the walkers stop, and those blocked sending a listing see
            // the channel closed (the scope waits for them: stopping them after it, as
            // before, left them blocked forever and the server with them).
            walk.lock().stop = true;
            changed.notify_all();
        }
        drop(rx);
        sent
    });
    if !sent {
        return;
    }
    let complete = !walk.lock().cut;
    out.flush(true, complete);
}

/// The backend paths (relative to the root) of the subdirectories in `rel`'s listing.
fn subdirs<'a>(rel: &'a [u8], entries: &'a [DirEntry]) -> impl Iterator<Item = Vec<u8>> + 'a {
    entries
        .iter()
        .filter(|e| e.kind == FileType::Directory)
        .map(move |e| join(rel, &e.name))
}

/// One walker: read directories from the queue until it is empty and no one is reading one
/// (whose subdirectories would join it), or the walk stops.
fn walker(
    s: &Shared,
    root: &[u8],
    walk: &Mutex<Walk>,
    changed: &Condvar,
    tx: crossbeam_channel::Sender<(Vec<u8>, Vec<DirEntry>, Vec<bool>)>,
) {
    loop {
        let rel = {
            let mut w = walk.lock();
            loop {
                if w.stop || w.cut {
                    return;
                }
                if let Some(r) = w.queue.pop_front() {
                    w.busy += 1;
                    break r;
                }
                if w.busy == 0 {
                    return;
                }
                changed.wait(&mut w);
            }
        };
        let path = join(root, &rel);
        let read = s.backend.readdir(&path, true);
        let entries = {
            let mut w = walk.lock();
            w.busy -= 1;
            changed.notify_all();
            match read {
                Ok(e) if !w.cut && !w.stop && (e.len() as u64) <= w.left => {
                    w.left -= e.len() as u64;
                    w.queue.extend(subdirs(&rel, &e));
                    e
                }
                Ok(_) => {
                    w.cut = true;
                    return;
                }
                // Unreadable: skipped (the client lists it itself if it needs it).
                Err(_) => continue,
            }
        };
        let bare = bare_entries(s, &path, &entries);
        if tx.send((rel, entries, bare)).is_err() {
            return;
        }
    }
}

/// Listings packed into frames.
struct Packer<'a> {
    s: &'a Shared,
    id: u64,
    batch: Vec<SubtreeDir>,
    entries: usize,
    bytes: usize,
}

impl Packer<'_> {
    /// Add one directory's listing (sending full frames); false when the client is gone.
    fn push(&mut self, rel: Vec<u8>, entries: Vec<DirEntry>, bare: Vec<bool>) -> bool {
        if entries.is_empty() {
            self.batch.push(SubtreeDir {
                dir: rel,
                entries,
                bare: Vec::new(),
            });
            return true;
        }
        let with_bare = bare.len() == entries.len();
        for (i, c) in entries.chunks(ENTRIES_PER_FRAME).enumerate() {
            let bytes = rel.len() + c.iter().map(|e| e.name.len() + 160).sum::<usize>();
            if (self.entries + c.len() > ENTRIES_PER_FRAME || self.bytes + bytes > FRAME_BYTES)
                && !self.batch.is_empty()
                && !self.flush(false, false)
            {
                return false;
            }
            self.entries += c.len();
            self.bytes += bytes;
            let start = i * ENTRIES_PER_FRAME;
            self.batch.push(SubtreeDir {
                dir: rel.clone(),
                entries: c.to_vec(),
                bare: if with_bare {
                    bare[start..start + c.len()].to_vec()
                } else {
                    Vec::new()
                },
            });
        }
        true
    }

    /// Send what is packed as one frame; false when the client is gone.
    fn flush(&mut self, last: bool, complete: bool) -> bool {
        self.entries = 0;
        self.bytes = 0;
        send(
            &self.s.out,
            &ServerMsg::Reply {
                id: self.id,
                last,
                body: Ok(Reply::Subtree {
                    dirs: std::mem::take(&mut self.batch),
                    complete,
                }),
            },
        )
    }
}

/// Which of `dir`'s entries have no extended attributes at all: `dir` opened once (through the
/// backend, so confined), then one query per entry relative to that descriptor, never
/// following the final component (`listxattrat(2)` where the kernel has it, else
/// `llistxattr(2)` through /proc/self/fd). Empty when it cannot tell.
pub(super) fn bare_entries(s: &Shared, dir: &[u8], entries: &[DirEntry]) -> Vec<bool> {
    use std::os::fd::AsRawFd;
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
    let Ok(f) = s.backend.open(&s.cfg.own, dir, flags, 0) else {
        return Vec::new();
    };
    let Some(fd) = f.fd() else {
        return Vec::new();
    };
    let fd = fd.as_raw_fd();
    let base = format!("/proc/self/fd/{fd}/").into_bytes();
    let mut at = true;
    entries
        .iter()
        .map(|e| {
            if at {
                match listxattr_at(fd, &e.name) {
                    Some(n) => return n == 0,
                    None => at = false,
                }
            }
            let mut p = base.clone();
            p.extend_from_slice(&e.name);
            let p = std::ffi::OsStr::from_bytes(&p);
            rustix::fs::llistxattr_query(p).is_ok_and(|n| n == 0)
        })
        .collect()
}

/// `listxattrat(dirfd, name, AT_SYMLINK_NOFOLLOW, NULL, 0)`: the size of `name`'s attribute
/// name list (0: none); `Some(usize::MAX)` on another error (not bare); `None` when the kernel
/// lacks the call (Linux < 6.13).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn listxattr_at(dirfd: i32, name: &[u8]) -> Option<usize> {
    /// The call's number (the same in every architecture's table since Linux 6.13).
    const SYS_LISTXATTRAT: libc::c_long = 465;
    let Ok(c) = std::ffi::CString::new(name) else {
        return Some(usize::MAX);
    };
    // SAFETY: listxattrat with a valid descriptor, a NUL-terminated name, a null buffer and
    // size 0 (a query: the kernel writes nothing).
    let r = unsafe {
        libc::syscall(
            SYS_LISTXATTRAT,
            dirfd,
            c.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW as libc::c_uint,
            std::ptr::null_mut::<libc::c_char>(),
            0usize,
        )
    };
    if r >= 0 {
        return Some(r as usize);
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::ENOSYS) => None,
        _ => Some(usize::MAX),
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn listxattr_at(_dirfd: i32, _name: &[u8]) -> Option<usize> {
    None
}
