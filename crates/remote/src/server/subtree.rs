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
//! **Names first** (feature `NAMES`, docs/protocol.md): a walker reads a directory with
//! getdents only (and statx of its subdirectories, which the walk opens next anyway) and
//! sends those names at once (`Reply::Names`); the full listing (a statx per entry, and the
//! extended attribute query) is a second job for later. Walkers take jobs in this order:
//! hurried listings, hurried full listings (a client waits for attributes), the breadth-first
//! queue of listings, the full listings in the order their names were sent. So the names of
//! the whole tree (what a `find -name` needs) reach the client before most entries are
//! statted, and a walk that stats (`du`, `ls -l`) hurries the full listings it waits for.
//! The root's own full listing is read first of the full listings and, like its names,
//! leaves at once in a frame of its own (never packed behind listings still coming, so never
//! in the call's last frame: tests/bulk_mutations.rs waited 60 s for a frame after it once).
//! Each directory is listed once by getdents for its names; its full listing reads it again
//! from the page cache.
//!
//! Bounds, as before: at most `budget` entries below the root, whole directories only (the
//! first directory that does not fit ends the walk: `complete: false`); a directory that
//! cannot be read is skipped; a directory's listing may span frames, its pieces adjacent;
//! frames hold at most [`ENTRIES_PER_FRAME`] entries and about 1 MiB. Memory: the listings
//! read but not yet packed are at most [`READ_AHEAD`] directories.

use std::collections::{HashMap, VecDeque};
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use crossbeam_channel::{bounded, TryRecvError};
use dircache_core::{DirEntry, FileType};
use parking_lot::{Condvar, Mutex};

use super::{send, Shared};
use crate::prefetch::{is_below, join};
use crate::proto::{Reply, ServerMsg, SubtreeDir, ENTRIES_PER_FRAME};

/// Threads reading directories for one `Subtree` call.
pub const WALKERS: usize = 4;

/// Listings read and not yet packed into frames, at most.
pub const READ_AHEAD: usize = 64;

/// Frames stay below this many bytes of names, paths and attributes (estimated).
const FRAME_BYTES: usize = 1 << 20;

/// Most hurried directories a walk remembers before their ancestors are read.
pub const MAX_WANTED: usize = 64;

/// One `Subtree` call's walk: the queue its walkers take directories from.
#[derive(Default)]
pub(super) struct Walk {
    queue: VecDeque<Vec<u8>>,
    /// Directories a client hurried (`true`: and everything found below them; `false`: on
    /// the way down to a hurried one): taken before `queue`, last in first out, so a hurried
    /// subtree is read depth first, in its listings' order (the order a `find` or `du` on the
    /// client walks it).
    urgent: Vec<(Vec<u8>, bool)>,
    /// Hurried directories not queued yet (an ancestor is queued or being read): the path
    /// down to each jumps the queue as it is found.
    wanted: Vec<Vec<u8>>,
    /// Directories being read now.
    reading: Vec<Vec<u8>>,
    /// Entries still allowed below the root.
    left: u64,
    /// A directory did not fit: the walk stops, incomplete.
    cut: bool,
    /// The client is gone: stop.
    stop: bool,
    /// Directories read out of order because of a hurry (for the log).
    hurried: u64,
    /// Names first (module docs): directories whose names were sent and whose full listings
    /// are still to read, in that order.
    named: VecDeque<Vec<u8>>,
    /// Full listings a client waits for (hurried), before `named`.
    stat_urgent: VecDeque<Vec<u8>>,
    /// Directories whose attributes a client waited for: the full listings of directories
    /// named below them later go to `stat_urgent` (at most [`MAX_WANTED`]).
    stat_hot: Vec<Vec<u8>>,
    /// Names first: walkers reading a full listing now.
    full_busy: usize,
}

/// A walker's next job.
#[derive(Debug, PartialEq, Eq)]
enum Job {
    /// Read a directory (with `hot`: what is below it is hurried too). With names first,
    /// its names only.
    List(Vec<u8>, bool),
    /// Names first: read a named directory's full listing.
    Full(Vec<u8>),
}

impl Walk {
    fn new(budget: u64) -> Walk {
        Walk {
            left: budget,
            ..Walk::default()
        }
    }

    /// The next job (module docs for the order); no listing once the walk is cut.
    fn next_job(&mut self) -> Option<Job> {
        if !self.cut {
            if let Some((r, hot)) = self.urgent.pop() {
                self.hurried += 1;
                return Some(Job::List(r, hot));
            }
        }
        // A full listing (a statx per entry) can take long on a cold disk: while names are
        // still to be read, one walker is kept for them. Before, a walker that found the
        // queue empty for a moment (its directories being read by others) took a full
        // listing, and in the end every walker could be waiting on statx while names
        // waited in the queue (tests/names_first.rs, the statx held back: ~10 s in a third
        // of the runs on a loaded machine).
        let names_left = !self.reading.is_empty()
            || (!self.cut && (!self.queue.is_empty() || !self.urgent.is_empty()));
        let may_full = !names_left || self.full_busy + 1 < WALKERS;
        if may_full {
            if let Some(d) = self.stat_urgent.pop_front() {
                self.full_busy += 1;
                return Some(Job::Full(d));
            }
        }
        if !self.cut {
            if let Some(d) = self.queue.pop_front() {
                return Some(Job::List(d, false));
            }
        }
        if !may_full {
            return None;
        }
        let d = self.named.pop_front()?;
        self.full_busy += 1;
        Some(Job::Full(d))
    }

    /// Names first: `rel`'s names were sent; its full listing is a job now.
    fn named(&mut self, rel: Vec<u8>) {
        if self.stat_hot.iter().any(|h| is_below(&rel, h)) {
            self.stat_urgent.push_back(rel);
        } else {
            self.named.push_back(rel);
        }
    }

    /// Names first: a client waits for the attributes of `dir`, whose names were sent: its
    /// full listing next, then those of the directories named below it (in the order they
    /// were named), and of those named below it later. False when `dir`'s full listing is
    /// not waiting (not named yet, or read already).
    fn hurry_full(&mut self, dir: &[u8]) -> bool {
        let at = |q: &VecDeque<Vec<u8>>| q.iter().position(|d| d == dir);
        if let Some(i) = at(&self.stat_urgent) {
            if let Some(d) = self.stat_urgent.remove(i) {
                self.stat_urgent.push_front(d);
            }
            return true;
        }
        let Some(i) = at(&self.named) else {
            return false;
        };
        let (below, rest): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut self.named)
            .into_iter()
            .enumerate()
            .partition(|(j, d)| *j != i && is_below(d, dir));
        let mut rest: VecDeque<Vec<u8>> = rest.into_iter().map(|(_, d)| d).collect();
        if let Some(k) = rest.iter().position(|d| d == dir) {
            if let Some(d) = rest.remove(k) {
                self.stat_urgent.push_front(d);
            }
        }
        self.named = rest;
        self.stat_urgent.extend(below.into_iter().map(|(_, d)| d));
        if self.stat_hot.len() >= MAX_WANTED {
            self.stat_hot.remove(0);
        }
        self.stat_hot.push(dir.to_vec());
        true
    }

    /// The next directory to read: hurried ones first; with whether what is below it is
    /// hurried too.
    #[cfg(test)]
    fn next(&mut self) -> Option<(Vec<u8>, bool)> {
        if let Some(r) = self.urgent.pop() {
            self.hurried += 1;
            return Some(r);
        }
        self.queue.pop_front().map(|r| (r, false))
    }

    /// Queue the subdirectories `subs` of `rel`, just read (`hot`: taken as hurried): below a
    /// hurried directory, or on the way to a wanted one, they jump the queue.
    fn found(&mut self, rel: &[u8], hot: bool, subs: Vec<Vec<u8>>) {
        let hot = hot || self.wanted.iter().any(|w| w == rel);
        self.wanted.retain(|w| w != rel);
        // Subdirectories at or above a wanted directory: (path, whether it is wanted itself).
        let (way, rest): (Vec<_>, Vec<_>) = subs
            .into_iter()
            .partition(|d| self.wanted.iter().any(|x| is_below(x, d)));
        if hot {
            // Depth first in listing order: the first subdirectory on top.
            self.urgent
                .extend(rest.into_iter().rev().map(|d| (d, true)));
        } else {
            self.queue.extend(rest);
        }
        // The way to a wanted directory above all.
        for d in way.into_iter().rev() {
            let wanted = self.wanted.contains(&d);
            if wanted {
                self.wanted.retain(|x| *x != d);
            }
            self.urgent.push((d, hot || wanted));
        }
    }

    /// A client waits for `dir`: it (or its nearest ancestor still queued) jumps the queue;
    /// when an ancestor is being read, `dir` is remembered for when its path is found.
    pub(super) fn hurry(&mut self, dir: &[u8]) {
        if self.stop || self.hurry_full(dir) {
            return;
        }
        if self.cut || self.urgent.last().is_some_and(|u| u.0 == dir && u.1) {
            return;
        }
        let queued = |d: &Vec<u8>| is_below(dir, d);
        // The deepest queued (or urgent) directory at or above `dir`.
        let in_queue = self
            .queue
            .iter()
            .enumerate()
            .filter(|(_, d)| queued(d))
            .max_by_key(|(_, d)| d.len())
            .map(|(i, _)| i);
        let in_urgent = self
            .urgent
            .iter()
            .enumerate()
            .filter(|(_, d)| queued(&d.0))
            .max_by_key(|(_, d)| d.0.len())
            .map(|(i, _)| i);
        let found = match (in_queue, in_urgent) {
            (Some(q), Some(u)) if self.urgent[u].0.len() >= self.queue[q].len() => {
                Some(self.urgent.remove(u))
            }
            (Some(q), _) => self.queue.remove(q).map(|d| (d, false)),
            (None, Some(u)) => Some(self.urgent.remove(u)),
            (None, None) => None,
        };
        match found {
            Some((d, hot)) => {
                // `dir` itself is read depth first below; an ancestor only leads the way.
                let is_dir = d == dir;
                if !is_dir {
                    self.want(dir);
                }
                self.urgent.push((d, hot || is_dir));
            }
            // Being read: wanted once its subdirectories are known. Else it was read (or is
            // not there): nothing to do.
            None => {
                if self.reading.iter().any(|r| r != dir && is_below(dir, r)) {
                    self.want(dir);
                }
            }
        }
    }

    fn want(&mut self, dir: &[u8]) {
        if self.wanted.iter().any(|w| w == dir) {
            return;
        }
        if self.wanted.len() >= MAX_WANTED {
            self.wanted.remove(0);
        }
        self.wanted.push(dir.to_vec());
    }
}

/// A walk and its walkers' condition variable; hurried through [`Walks`] by the reader.
#[derive(Default)]
pub(super) struct Ctl {
    walk: Mutex<Walk>,
    changed: Condvar,
}

/// The `Subtree` calls of one connection in flight, by call id (for [`Walks::hurry`]).
#[derive(Default)]
pub(super) struct Walks(Mutex<HashMap<u64, Arc<Ctl>>>);

impl Walks {
    /// [`ClientMsg::Hurry`](crate::proto::ClientMsg::Hurry): nothing if call `call` is over.
    pub(super) fn hurry(&self, call: u64, dir: &[u8]) {
        let ctl = self.0.lock().get(&call).cloned();
        if let Some(c) = ctl {
            c.walk.lock().hurry(dir);
            c.changed.notify_all();
        }
    }
}

/// Unregisters a walk when its call ends.
struct Registered<'a>(&'a Walks, u64);

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.0 .0.lock().remove(&self.1);
    }
}

/// A listing read by a walker.
enum Listing {
    /// Names first: names and types, subdirectories with attributes.
    Names(Vec<u8>, Vec<DirEntry>),
    /// Every entry with attributes, and which entries are bare.
    Full(Vec<u8>, Vec<DirEntry>, Vec<bool>),
}

/// Names first: `dir`'s names and types (getdents, through the server's cache), its
/// subdirectories with their attributes (a statx each: the walk opens them next anyway).
fn names_of(s: &Shared, dir: &[u8]) -> dircache_core::Result<Vec<DirEntry>> {
    let mut entries = s.backend.readdir(dir, false)?;
    for e in entries
        .iter_mut()
        .filter(|e| e.kind == FileType::Directory && e.attr.is_none())
    {
        // A name replaced by another type meanwhile keeps no attributes (the full listing
        // brings them).
        if let Some(a) = s.backend.lookup(dir, &e.name).ok().filter(|a| a.is_dir()) {
            e.ino = a.ino;
            e.attr = Some(a);
        }
    }
    Ok(entries)
}

/// Answer call `id`: the subtree of `root`, at most `budget` entries below it (module docs);
/// with `names`, names first.
pub(super) fn run(s: &Shared, id: u64, root: &[u8], budget: u64, names: bool) {
    // Registered first: a hurry may come while the root's listing is read (it is "being
    // read", so hurried directories are wanted once it is).
    let mut first = Walk::new(budget);
    first.reading.push(Vec::new());
    let ctl = Arc::new(Ctl {
        walk: Mutex::new(first),
        changed: Condvar::new(),
    });
    s.walks.0.lock().insert(id, ctl.clone());
    let _registered = Registered(&s.walks, id);
    let read = if names {
        names_of(s, root)
    } else {
        s.backend.readdir(root, true)
    };
    let entries = match read {
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
        names: false,
        entries: 0,
        bytes: 0,
    };
    let subs: Vec<Vec<u8>> = subdirs(b"", &entries).collect();
    let any = !subs.is_empty();
    {
        let mut w = ctl.walk.lock();
        w.reading.clear();
        w.found(b"", false, subs);
        if names {
            // The root's full listing before the others' (everyone stats at the top).
            w.stat_urgent.push_back(Vec::new());
        }
    }
    let pushed = if names {
        out.push(Vec::new(), entries, Vec::new(), true)
    } else {
        let bare = bare_entries(s, root, &entries);
        out.push(Vec::new(), entries, bare, false)
    };
    if !pushed {
        return;
    }
    if !any && !names {
        out.flush(true, true);
        return;
    }
    // The root's listing leaves now: the client is waiting for it.
    if !out.flush(false, false) {
        return;
    }
    let (walk, changed) = (&ctl.walk, &ctl.changed);
    let (tx, rx) = bounded::<Listing>(READ_AHEAD);
    let sent = std::thread::scope(|scope| {
        for _ in 0..WALKERS {
            let tx = tx.clone();
            scope.spawn(move || walker(s, root, walk, changed, tx, names));
        }
        drop(tx);
        let sent = loop {
            let listing = match rx.try_recv() {
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
            let pushed = match listing {
                Listing::Names(rel, entries) => out.push(rel, entries, Vec::new(), true),
                // Names first: the root's full listing is urgent (the client waits for its
                // attributes): it leaves at once, never packed behind listings still coming
                // (and so never in the call's last frame).
                Listing::Full(rel, entries, bare) if rel.is_empty() => {
                    out.push(rel, entries, bare, false) && out.flush(false, false)
                }
                Listing::Full(rel, entries, bare) => out.push(rel, entries, bare, false),
            };
            if !pushed {
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
    let (complete, hurried) = {
        let w = walk.lock();
        (!w.cut, w.hurried)
    };
    if hurried > 0 {
        tracing::debug!("subtree call {id}: {hurried} directories read early for a client waiting");
    }
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
    tx: crossbeam_channel::Sender<Listing>,
    names: bool,
) {
    loop {
        let (rel, hot) = {
            let mut w = walk.lock();
            loop {
                if w.stop {
                    return;
                }
                match w.next_job() {
                    Some(Job::List(r, hot)) => {
                        w.reading.push(r.clone());
                        break (r, hot);
                    }
                    Some(Job::Full(r)) => {
                        drop(w);
                        full_listing(s, root, r, &tx);
                        w = walk.lock();
                        w.full_busy -= 1;
                        // A walker kept for names may take full listings now.
                        changed.notify_all();
                        continue;
                    }
                    None => {}
                }
                // No job, and none can come: no directory is being listed (full listings
                // wait only while one is).
                if w.reading.is_empty() {
                    return;
                }
                changed.wait(&mut w);
            }
        };
        let path = join(root, &rel);
        let read = if names {
            names_of(s, &path)
        } else {
            s.backend.readdir(&path, true)
        };
        let entries = {
            let mut w = walk.lock();
            if let Some(i) = w.reading.iter().position(|r| *r == rel) {
                w.reading.swap_remove(i);
            }
            changed.notify_all();
            match read {
                Ok(e) if !w.cut && !w.stop && (e.len() as u64) <= w.left => {
                    w.left -= e.len() as u64;
                    let subs = subdirs(&rel, &e).collect();
                    w.found(&rel, hot, subs);
                    if names {
                        w.named(rel.clone());
                    }
                    e
                }
                Ok(_) => {
                    // No more listings; with names first, the full listings of what was
                    // named still go out.
                    w.cut = true;
                    continue;
                }
                // Unreadable: skipped (the client lists it itself if it needs it).
                Err(_) => continue,
            }
        };
        let listing = if names {
            Listing::Names(rel, entries)
        } else {
            let bare = bare_entries(s, &path, &entries);
            Listing::Full(rel, entries, bare)
        };
        if tx.send(listing).is_err() {
            return;
        }
    }
}

/// Names first: read and send `rel`'s full listing (skipped when it cannot be read).
fn full_listing(s: &Shared, root: &[u8], rel: Vec<u8>, tx: &crossbeam_channel::Sender<Listing>) {
    let path = join(root, &rel);
    let r = s.backend.readdir(&path, true);
    if let Ok(entries) = r {
        let bare = bare_entries(s, &path, &entries);
        // A closed channel: the client is gone, and the walk stops.
        let _ = tx.send(Listing::Full(rel, entries, bare));
    }
}

/// Listings packed into frames.
struct Packer<'a> {
    s: &'a Shared,
    id: u64,
    batch: Vec<SubtreeDir>,
    /// `batch` holds names-only listings (a `Reply::Names` frame).
    names: bool,
    entries: usize,
    bytes: usize,
}

impl Packer<'_> {
    /// Add one directory's listing (`names`: names only), sending full frames (and the
    /// batch when it is of the other kind); false when the client is gone.
    fn push(&mut self, rel: Vec<u8>, entries: Vec<DirEntry>, bare: Vec<bool>, names: bool) -> bool {
        if names != self.names {
            if !self.batch.is_empty() && !self.flush(false, false) {
                return false;
            }
            self.names = names;
        }
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

    /// Send what is packed as one frame (names only: never the last; a last frame follows
    /// with no listing); false when the client is gone.
    fn flush(&mut self, last: bool, complete: bool) -> bool {
        self.entries = 0;
        self.bytes = 0;
        if self.names {
            if !self.batch.is_empty()
                && !send(
                    &self.s.out,
                    &ServerMsg::Reply {
                        id: self.id,
                        last: false,
                        body: Ok(Reply::Names(std::mem::take(&mut self.batch))),
                    },
                )
            {
                return false;
            }
            if !last {
                return true;
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Vec<u8> {
        s.as_bytes().to_vec()
    }

    /// Reads directories as walkers would (one at a time), with the listing given by
    /// `children`; the order read.
    fn drain(w: &mut Walk, children: impl Fn(&[u8]) -> Vec<Vec<u8>>) -> Vec<String> {
        let mut order = Vec::new();
        while let Some((d, hot)) = w.next() {
            order.push(String::from_utf8(d.clone()).unwrap());
            let subs = children(&d);
            w.found(&d, hot, subs);
        }
        order
    }

    /// a, b, c at the top; each with x, y; each of those with z.
    fn tree(d: &[u8]) -> Vec<Vec<u8>> {
        match d.iter().filter(|c| **c == b'/').count() {
            0 if d.is_empty() => vec![v("a"), v("b"), v("c")],
            0 => vec![join(d, b"x"), join(d, b"y")],
            1 => vec![join(d, b"z")],
            _ => vec![],
        }
    }

    #[test]
    fn without_a_hurry_the_walk_is_breadth_first() {
        let mut w = Walk::new(1000);
        w.found(b"", false, tree(b""));
        let order = drain(&mut w, tree);
        assert_eq!(order[..3], ["a", "b", "c"]);
        assert_eq!(order[3..9], ["a/x", "a/y", "b/x", "b/y", "c/x", "c/y"]);
        assert_eq!(order.len(), 15);
    }

    #[test]
    fn a_hurried_directory_jumps_the_queue_and_its_subtree_follows_depth_first() {
        let mut w = Walk::new(1000);
        w.found(b"", false, tree(b""));
        // `c` is queued: read next, then its subtree depth first, then the rest.
        w.hurry(b"c");
        let order = drain(&mut w, tree);
        assert_eq!(order[..5], ["c", "c/x", "c/x/z", "c/y", "c/y/z"]);
        assert_eq!(order[5..7], ["a", "b"]);
        assert_eq!(order.len(), 15, "every directory once: {order:?}");
    }

    #[test]
    fn a_hurried_directory_not_found_yet_pulls_the_way_down_to_it() {
        let mut w = Walk::new(1000);
        w.found(b"", false, tree(b""));
        // b/y/z is three levels down: b first (its siblings not), then b/y, then b/y/z.
        w.hurry(b"b/y/z");
        let order = drain(&mut w, tree);
        assert_eq!(order[..3], ["b", "b/y", "b/y/z"], "{order:?}");
        // b's other subdirectory joined the ordinary queue behind a and c.
        assert_eq!(order[3..5], ["a", "c"]);
        assert_eq!(order.len(), 15, "every directory once: {order:?}");
        // While its ancestor is being read (taken, not found yet).
        let mut w = Walk::new(1000);
        w.found(b"", false, tree(b""));
        let (a, hot) = w.next().unwrap();
        w.reading.push(a.clone());
        w.hurry(b"a/y");
        w.reading.clear();
        w.found(&a, hot, tree(&a));
        let (next, hot) = w.next().unwrap();
        assert_eq!((next.as_slice(), hot), (&b"a/y"[..], true));
        // A directory read already, or unknown: nothing changes.
        let mut w = Walk::new(1000);
        w.found(b"", false, tree(b""));
        w.hurry(b"q/r");
        assert!(w.urgent.is_empty() && w.wanted.is_empty());
    }
}
