//! Listing prefetch for cold walks: while a program walks a tree (`find`, `du`, `ls -lR`),
//! background threads list the subdirectories of the directory it just listed, so that its
//! next READDIRPLUS is answered from the core cache instead of waiting for the disk.
//!
//! # Why
//! On a cold mount every READDIRPLUS costs a getdents and one statx per entry, and a walker
//! asks for one directory at a time: the disk (and the backend's statx calls) never see more
//! than one request in flight, while native programs only pay the getdents. Measured on a
//! 40k-entry tree (cold `find`): 73% of the wall time was READDIRPLUS requests in flight, one
//! at a time. Listing the next directories on other threads overlaps that I/O with the
//! walker's own work and with the FUSE round trips.
//!
//! # When
//! A walk is recognised when a directory is listed from the start (a new READDIRPLUS stream)
//! and its parent already has a complete listing in the core cache: the program went down
//! from a directory it listed. Then the subdirectories of the listed directory are queued,
//! in the order the kernel is served them (cookie order), most recent listing first (a
//! depth-first walker goes into the newest listing's entries next). Only one level ahead
//! of the walker: a prefetched listing queues nothing by itself; the walker's own READDIRPLUS
//! of it (answered from the cache) queues the next level. A single `ls -l dir` queues nothing
//! unless `dir`'s parent was listed before; then it lists `dir`'s subdirectories once.
//! The queue is bounded ([`MAX_QUEUED`]): when full, the oldest jobs (furthest from the
//! walker) are dropped.
//!
//! # Ahead of lookups
//! A second kind of job, queued by `lookahead.rs` when it lists a directory on lookups of its
//! names ([`Prefetcher::ahead_of_lookups`]): the directory's subdirectories and the siblings
//! after it, in path order, `-o ahead=N` levels deep, each listed with attributes and read
//! through the mount by the prefetch thread itself ([`kernel_read`]), so that a program
//! lstat-ing paths in that order (`git status`) finds them in the kernel's dcache.
//!
//! # Correctness
//! A prefetch is exactly what the walker's own READDIRPLUS would do a moment later:
//! [`Cache::readdir_node`] with the credentials of the request that triggered it, and only
//! for directories whose mode bits let that requester read and enter them (as the kernel's
//! `default_permissions` would), so nothing is fetched that the walker could not list.
//! The core merges the listing under its usual rules (a listing that raced with a change is
//! not marked complete; invalidation from the change feed applies as for any other fill;
//! docs/core.md), so the cache holds nothing a foreground fill would not hold. Nothing is
//! told to the kernel. Directories already complete in the core are skipped, and a request
//! for a directory a prefetch thread is listing at that moment waits for that listing (at
//! most [`MAX_WAIT`]) instead of making a second one; it then takes it from the cache.
//!
//! # Cost
//! The threads are few ([`crate::CachePolicy::prefetch_threads`], default 2) and idle unless a
//! walk is running; the work they do is work the walker would have asked for, except for the
//! listings of directories a walk skips (`find -prune`, an interrupted `ls -R`), at most one
//! level below what it listed.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::stats::RequestCounters;
use dircache_core::{AccessPolicy, Cache, Creds, FileType, NodeKind, NodeRef, PosixPolicy};

const R_OK: u32 = 4;
const X_OK: u32 = 1;

/// Jobs kept at most; older ones are dropped first.
pub const MAX_QUEUED: usize = 4096;

/// One subdirectory to list: `name` in `parent`, as `creds`.
struct Job {
    creds: Creds,
    parent: NodeRef,
    name: Vec<u8>,
    /// 0: ahead of a walker (listed into the core only). n > 0: ahead of a program looking
    /// names up one by one ([`Prefetcher::ahead_of_lookups`]): listed with attributes, read
    /// through the mount, and its own subdirectories queued with n - 1.
    ahead: u8,
}

#[derive(Default)]
struct Queue {
    /// Newest at the back (popped first).
    jobs: VecDeque<Job>,
    stop: bool,
}

struct Shared {
    cache: Arc<Cache>,
    queue: Mutex<Queue>,
    wake: Condvar,
    /// `prefetch_listings`, `prefetch_dropped` and `prefetch_pending` (jobs queued or
    /// running) are counted here.
    counters: Arc<RequestCounters>,
    /// Directories (dentry ids) a prefetch thread is listing right now, and the signal of
    /// one finishing: a walker that asks for one of them waits for that listing instead of
    /// making the same one.
    inflight: Mutex<HashSet<u64>>,
    listed: Condvar,
    /// The mount's lean-listing state (`lean.rs`): listings ahead of a lean walker are lean.
    lean: std::sync::OnceLock<Arc<crate::lean::Lean>>,
    /// The mount point (absolute), for [`Prefetcher::read_through_kernel`].
    mountpoint: std::sync::OnceLock<std::path::PathBuf>,
    /// Directories to read through the mount, and the threads reading them.
    kreads: parking_lot::Mutex<KernelReads>,
    /// Signals an idle kernel-read thread that a directory was queued.
    kread_wake: parking_lot::Condvar,
    /// Directories (dentry ids) queued ahead of lookups, with the levels below them queued.
    ahead_seen: parking_lot::Mutex<std::collections::HashMap<u64, u8>>,
    /// Threads reading through the mount at most (`-o kreaders`; 0: none).
    kernel_readers: std::sync::atomic::AtomicUsize,
}

#[derive(Default)]
struct KernelReads {
    /// Directories to read ([`ReadQueue`]).
    dirs: ReadQueue<NodeRef>,
    active: usize,
    /// Threads waiting for work ([`KERNEL_READ_LINGER`]).
    idle: usize,
    stop: bool,
}

/// Directories waiting to be read through the mount ([`Prefetcher::read_through_kernel`]),
/// by dentry id, and those being read.
///
/// The next one read is the one asked for last: a new directory, or one queued before whose
/// names are still being looked up (`lookahead.rs` asks again every [`crate::lookahead::MISSES`]
/// LOOKUPs of names it holds). A cold `git status` asks for a directory as each of its 20
/// lstat threads enters one, so with the newest first only, a large directory queued early
/// (480-826 files) waited behind every later one and was read after git had looked up all its
/// names: 3,211 of 5,778 LOOKUPs per run came from directories queued and not read yet.
struct ReadQueue<T> {
    /// Queued, not being read; the back is popped first.
    queued: VecDeque<(u64, T)>,
    /// Queued or being read: a directory is read once at a time.
    pending: HashSet<u64>,
}

impl<T> Default for ReadQueue<T> {
    fn default() -> Self {
        ReadQueue {
            queued: VecDeque::new(),
            pending: HashSet::new(),
        }
    }
}

impl<T> ReadQueue<T> {
    /// Ask for `id` to be read: queued at the back if new (true); moved to the back if
    /// queued and not read yet; nothing if it is being read (false either way). At most
    /// `max` stay queued: the oldest is dropped.
    fn push(&mut self, id: u64, item: T, max: usize) -> bool {
        if !self.pending.insert(id) {
            if let Some(i) = self.queued.iter().rposition(|(q, _)| *q == id) {
                if let Some(e) = self.queued.remove(i) {
                    self.queued.push_back(e);
                }
            }
            return false;
        }
        self.queued.push_back((id, item));
        if self.queued.len() > max {
            if let Some((old, _)) = self.queued.pop_front() {
                self.pending.remove(&old);
            }
        }
        true
    }

    /// The next directory to read; it stays pending until [`ReadQueue::done`].
    fn pop(&mut self) -> Option<(u64, T)> {
        self.queued.pop_back()
    }

    fn done(&mut self, id: u64) {
        self.pending.remove(&id);
    }

    fn is_empty(&self) -> bool {
        self.queued.is_empty()
    }

    fn clear(&mut self) {
        self.queued.clear();
        self.pending.clear();
    }
}

/// Threads reading directories through the mount at once ([`Prefetcher::read_through_kernel`]).
/// Each mostly waits for its READDIRPLUS replies behind git's LOOKUPs in the `/dev/fuse`
/// queue; 8 instead of 4 cut the LOOKUPs of a cold `git status` by a further ~1,000 (docs/benchmarks.md).
pub const KERNEL_READERS: usize = 8;

/// The getdents buffer of a read through the mount: the kernel sizes its READDIRPLUS to it
/// (up to the connection's `max_pages`), so a 2,874-file directory is 13 round trips instead
/// of about 50 at 32 KiB.
const KERNEL_READ_BUF: usize = 128 * 1024;

/// How long a kernel-read thread waits for more directories before it ends (and closes its
/// clone of the mount): a cold `git status` queues reads in bursts, and each new thread made
/// a new clone (one STATFS, one RCU grace period at its close): 187-311 per run before.
const KERNEL_READ_LINGER: Duration = Duration::from_millis(50);

/// Directories listed ahead of lookups ([`Prefetcher::ahead_of_lookups`]) are at most this
/// large (`st_size`), as those `lookahead.rs` lists on two misses: a larger one is listed
/// only when lookups in it show it is wanted (the benchmark tree's three largest, 68-156 KiB,
/// 1,842-2,874 files, are therefore looked up before they are listed).
const AHEAD_MAX_DIR_BYTES: u64 = crate::lookahead::MAX_DIR_BYTES;

/// Siblings after a directory listed on lookups queued ahead of them at most.
const AHEAD_SIBLINGS: usize = 64;

/// Directories remembered as queued ahead of lookups (cleared when more).
const MAX_AHEAD_SEEN: usize = 1 << 16;

/// How long a request waits for a prefetch of its directory before listing it itself.
const MAX_WAIT: Duration = Duration::from_secs(2);

/// The prefetch threads of one mount. Dropping it stops and joins them.
pub struct Prefetcher {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    enabled: AtomicBool,
}

impl Prefetcher {
    /// `threads` background threads over `cache`; 0 makes a prefetcher that does nothing.
    pub fn new(cache: Arc<Cache>, threads: usize, counters: Arc<RequestCounters>) -> Prefetcher {
        let shared = Arc::new(Shared {
            cache,
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            counters,
            inflight: Mutex::new(HashSet::new()),
            listed: Condvar::new(),
            lean: std::sync::OnceLock::new(),
            mountpoint: std::sync::OnceLock::new(),
            kreads: parking_lot::Mutex::new(KernelReads::default()),
            kread_wake: parking_lot::Condvar::new(),
            ahead_seen: parking_lot::Mutex::new(std::collections::HashMap::new()),
            kernel_readers: std::sync::atomic::AtomicUsize::new(KERNEL_READERS),
        });
        let mut handles = Vec::new();
        for i in 0..threads {
            let s = shared.clone();
            let h = std::thread::Builder::new()
                .name(format!("dircache-prefetch-{i}"))
                .spawn(move || run(&s));
            match h {
                Ok(h) => handles.push(h),
                Err(e) => tracing::warn!("dircache-fuse: no prefetch thread: {e}"),
            }
        }
        Prefetcher {
            enabled: AtomicBool::new(!handles.is_empty()),
            shared,
            threads: handles,
        }
    }

    /// Threads reading directories through the mount at most (`-o kreaders=N`); 0: none.
    pub(crate) fn set_kernel_readers(&self, n: usize) {
        self.shared.kernel_readers.store(n, Ordering::Relaxed);
    }

    /// The mount's (absolute) mount point, for [`Prefetcher::read_through_kernel`].
    pub(crate) fn set_mountpoint(&self, mnt: std::path::PathBuf) {
        if mnt.is_absolute() {
            let _ = self.shared.mountpoint.set(mnt);
        }
    }

    /// Queue a read of directory `dir` through the mount (getdents on its path below a
    /// detached clone of the mount, by a thread of its own: [`kernel_read`]): the kernel sends READDIRPLUS and instantiates every
    /// entry from the reply, so the lstat calls that follow find the names in its dcache and
    /// send no LOOKUP; its cached listing also serves the program's own readdir later.
    /// `lookahead.rs` asks for it once `dir` is complete with attributes in the core.
    pub(crate) fn read_through_kernel(&self, dir: &NodeRef) {
        queue_kernel_read(&self.shared, dir);
    }

    /// `dir` was listed on lookups of its names (`lookahead.rs`): a program is looking up
    /// names one by one (git's index refresh lstats every tracked path, in path order: a
    /// directory's files, then its subdirectories', then the next directory's). Its
    /// subdirectories, and then the subdirectories of its parent that come after it in that
    /// order (at most [`AHEAD_SIBLINGS`], if the parent is complete in the core), are listed
    /// (with attributes) and read through the mount ahead of it by the prefetch threads, in
    /// that order, `levels` levels deep, so that its lstat calls in them find every name in
    /// the kernel's dcache: no LOOKUP. `dir` must be complete in the core (just listed).
    pub(crate) fn ahead_of_lookups(&self, creds: &Creds, dir: &NodeRef, levels: u8) {
        if !self.enabled.load(Ordering::Relaxed) || levels == 0 {
            return;
        }
        // Popped last first: the siblings after the subdirectories.
        if let Some(p) = dir.parent() {
            let name = dir.name();
            queue_ahead(&self.shared, creds, &p, levels, Some(&name));
        }
        queue_ahead(&self.shared, creds, dir, levels, None);
    }

    /// Make listings lean while `lean` says so (set once, by the front end).
    pub(crate) fn set_lean(&self, lean: Arc<crate::lean::Lean>) {
        let _ = self.shared.lean.set(lean);
    }

    /// A directory `dir` was just listed from the start by a request with credentials
    /// `creds`; `subdirs` are the names of its subdirectories in the order the kernel gets
    /// them. Queues them if this looks like a walk (see the module doc).
    pub fn listed<'a>(
        &self,
        creds: &Creds,
        dir: &NodeRef,
        subdirs: impl DoubleEndedIterator<Item = &'a [u8]>,
    ) {
        if !self.enabled.load(Ordering::Relaxed) {
            return;
        }
        if !dir.parent().is_some_and(|p| p.is_complete()) {
            return;
        }
        let mut jobs: Vec<Job> = Vec::new();
        // Reversed: the first subdirectory ends up at the back, popped first.
        for name in subdirs.rev() {
            jobs.push(Job {
                creds: creds.clone(),
                parent: dir.clone(),
                name: name.to_vec(),
                ahead: 0,
            });
        }
        if jobs.is_empty() {
            return;
        }
        push_jobs(&self.shared, jobs);
    }
}

impl Prefetcher {
    /// If a prefetch thread (or [`Prefetcher::list_now`]) is listing `dir` right now, wait
    /// (at most [`MAX_WAIT`]) until it is done, so that the caller's listing is answered from
    /// the cache instead of being made twice. Returns whether it waited.
    pub fn wait_for(&self, dir: &NodeRef) -> bool {
        wait_listed(&self.shared, dir)
    }

    /// List `dir` into the core cache now, on the caller's thread, as `creds` (with
    /// attributes if `want_attrs`), unless someone is listing it already: then wait for that
    /// listing. Requests for `dir` meanwhile wait for this one ([`Prefetcher::wait_for`]).
    /// Used by LOOKUPs (`lookahead.rs`); works with prefetch threads off as well.
    /// Returns whether this call listed it.
    pub(crate) fn list_now(&self, creds: &Creds, dir: &NodeRef, want_attrs: bool) -> bool {
        let r = list_into_cache(&self.shared, creds, dir, want_attrs).is_some();
        if r {
            self.shared
                .counters
                .lookahead_listings
                .fetch_add(1, Ordering::Relaxed);
        }
        r
    }
}

/// [`Prefetcher::list_now`]: list `dir` into the core as `creds` unless someone is listing
/// it (then wait for that listing and return None); the listing, if this call made it.
fn list_into_cache(
    s: &Shared,
    creds: &Creds,
    dir: &NodeRef,
    want_attrs: bool,
) -> Option<Vec<dircache_core::DirEntry>> {
    let id = dir.id();
    {
        let Ok(mut g) = s.inflight.lock() else {
            return None;
        };
        if g.contains(&id) {
            drop(g);
            wait_listed(s, dir);
            return None;
        }
        g.insert(id);
    }
    // A directory complete already (listed by name only, e.g. lean): its names from the
    // cache, and a statx for each entry without attributes; no second getdents.
    let complete = dir.is_complete();
    let r = s.cache.readdir_node(creds, dir, want_attrs && !complete);
    if let (true, true, Ok(l)) = (want_attrs, complete, &r) {
        crate::lean::stat_entries(&s.cache, creds, dir, l, false);
    }
    if let Ok(mut g) = s.inflight.lock() {
        g.remove(&id);
    }
    s.listed.notify_all();
    r.ok()
}

/// [`Prefetcher::wait_for`] on the shared state.
fn wait_listed(s: &Shared, dir: &NodeRef) -> bool {
    let id = dir.id();
    let Ok(mut g) = s.inflight.lock() else {
        return false;
    };
    let deadline = Instant::now() + MAX_WAIT;
    let mut waited = false;
    while g.contains(&id) {
        waited = true;
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return true;
        }
        g = match s.listed.wait_timeout(g, left) {
            Ok((g, _)) => g,
            Err(_) => return true,
        };
    }
    waited
}

/// Queue the subdirectories of `dir` (complete in the core) for
/// [`Prefetcher::ahead_of_lookups`]: all of them, or with `after`, the [`AHEAD_SIBLINGS`]
/// that come after that name. A directory queued before with as many levels is skipped.
fn queue_ahead(s: &Shared, creds: &Creds, dir: &NodeRef, levels: u8, after: Option<&[u8]>) {
    if dir.is_dead() || !dir.is_complete() {
        return;
    }
    let mut subdirs: Vec<(Vec<u8>, u64)> = dir
        .cached_children()
        .iter()
        .filter(|n| n.kind() == NodeKind::Positive(FileType::Directory))
        .map(|n| (n.name(), n.id()))
        .collect();
    // In path order, as git's index sorts them (`a/b/x` after `a/b.c`: a directory sorts as
    // its name with a `/`); the first is popped first, so pushed last.
    let key = |n: &[u8]| n.iter().chain(b"/".iter()).copied().collect::<Vec<u8>>();
    subdirs.sort_by_cached_key(|(n, _)| key(n));
    if let Some(after) = after {
        let after = key(after);
        subdirs.retain(|(n, _)| key(n) > after);
        subdirs.truncate(AHEAD_SIBLINGS);
    }
    {
        let mut seen = s.ahead_seen.lock();
        if seen.len() > MAX_AHEAD_SEEN {
            seen.clear();
        }
        subdirs.retain(|(_, id)| {
            let l = seen.entry(*id).or_insert(0);
            let new = *l < levels;
            *l = (*l).max(levels);
            new
        });
    }
    if subdirs.is_empty() {
        return;
    }
    let jobs: Vec<Job> = subdirs
        .into_iter()
        .rev()
        .map(|(name, _)| Job {
            creds: creds.clone(),
            parent: dir.clone(),
            name,
            ahead: levels,
        })
        .collect();
    push_jobs(s, jobs);
}

/// Queue `jobs` (the last popped first), dropping the oldest past [`MAX_QUEUED`].
fn push_jobs(s: &Shared, jobs: Vec<Job>) {
    let Ok(mut q) = s.queue.lock() else {
        return;
    };
    if q.stop {
        return;
    }
    let c = &s.counters;
    c.prefetch_pending
        .fetch_add(jobs.len() as u64, Ordering::AcqRel);
    q.jobs.extend(jobs);
    let over = q.jobs.len().saturating_sub(MAX_QUEUED);
    if over > 0 {
        q.jobs.drain(..over);
        c.prefetch_dropped.fetch_add(over as u64, Ordering::Relaxed);
        c.prefetch_pending.fetch_sub(over as u64, Ordering::AcqRel);
    }
    drop(q);
    s.wake.notify_all();
}

/// Queue a read of `dir` through the mount ([`Prefetcher::read_through_kernel`]), unless it
/// is queued or being read already.
fn queue_kernel_read(shared: &Arc<Shared>, dir: &NodeRef) {
    let readers = shared.kernel_readers.load(Ordering::Relaxed);
    if shared.mountpoint.get().is_none() || readers == 0 {
        return;
    }
    // Threads of their own, started now: the siblings are being looked up meanwhile, and
    // the prefetch threads may be busy with long listings. At most KERNEL_READERS at a
    // time; each reads the directories queued until none is left, newest first, and waits
    // a little for more ([`KERNEL_READ_LINGER`]) before it ends.
    let spawn = {
        let mut k = shared.kreads.lock();
        if k.stop || !k.dirs.push(dir.id(), dir.clone(), MAX_QUEUED) {
            return;
        }
        if k.idle > 0 {
            shared.kread_wake.notify_one();
            false
        } else if k.active < readers {
            k.active += 1;
            true
        } else {
            false
        }
    };
    if !spawn {
        return;
    }
    let s = shared.clone();
    let spawned = std::thread::Builder::new()
        .name("dircache-kread".into())
        .spawn(move || {
            // One clone of the mount for the directories read in a row ([`kernel_read`]);
            // dropped when none is left (closing a clone ends an RCU grace period: one per
            // directory slowed the reads so much that git's lstats overtook them).
            let mut root = None;
            loop {
                let next = {
                    let mut k = s.kreads.lock();
                    loop {
                        if k.stop {
                            k.active -= 1;
                            return;
                        }
                        if let Some((_, d)) = k.dirs.pop() {
                            break d;
                        }
                        k.idle += 1;
                        let timed_out = s.kread_wake.wait_for(&mut k, KERNEL_READ_LINGER);
                        k.idle -= 1;
                        if timed_out.timed_out() && k.dirs.is_empty() {
                            k.active -= 1;
                            return;
                        }
                    }
                };
                if kernel_read(&s, &next, &mut root) {
                    s.counters
                        .lookahead_kernel_reads
                        .fetch_add(1, Ordering::Relaxed);
                }
                s.kreads.lock().dirs.done(next.id());
            }
        });
    if spawned.is_err() {
        shared.kreads.lock().active -= 1;
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        {
            let mut k = self.shared.kreads.lock();
            k.stop = true;
            k.dirs.clear();
        }
        self.shared.kread_wake.notify_all();
        if let Ok(mut q) = self.shared.queue.lock() {
            q.stop = true;
            let n = q.jobs.len() as u64;
            q.jobs.clear();
            self.shared
                .counters
                .prefetch_pending
                .fetch_sub(n, Ordering::AcqRel);
        }
        self.shared.wake.notify_all();
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
    }
}

fn run(s: &Arc<Shared>) {
    // The clone of the mount for reads ahead of lookups ([`kernel_read`]), kept while jobs
    // follow one another, closed before the thread waits (a clone keeps the file system up
    // after an umount).
    let mut root = None;
    loop {
        let job = {
            let Ok(mut q) = s.queue.lock() else { return };
            loop {
                if q.stop {
                    return;
                }
                if let Some(j) = q.jobs.pop_back() {
                    break Some(j);
                }
                if root.is_some() {
                    break None;
                }
                q = match s.wake.wait(q) {
                    Ok(q) => q,
                    Err(_) => return,
                };
            }
        };
        let Some(job) = job else {
            root = None;
            continue;
        };
        prefetch(s, &job, &mut root);
        // Pending until done: a job counts from its queueing to the end of its listing.
        s.counters.prefetch_pending.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Read directory `dir` through the mount to its end ([`Prefetcher::read_through_kernel`]),
/// opened beneath the mount's root without following symlinks or crossing mounts (a
/// directory replaced meanwhile is not read), and closed at once.
///
/// Through a detached clone of the mount (`open_tree(OPEN_TREE_CLONE)`, `root`: made for the
/// directories a thread reads in a row, gone with its descriptor): the same file system, so
/// the kernel's dentries and cached listing are filled all the same, but no reference to the
/// mount the user sees, whose plain `umount` would fail with EBUSY while a directory of it is
/// open (one in 2 right after the lookups, `tests/lookahead.rs`). After such an umount the
/// file system ends when the last clone is closed. Cloning needs CAP_SYS_ADMIN (`may_mount`,
/// checked before the path is looked up): a daemon without it (one whose mount was made for
/// it, or a seccomp filter refusing `open_tree`) reads nothing through the mount, as on a
/// kernel without `open_tree`: a directory opened on the mount itself made a plain umount
/// fail with EBUSY while it was open. The kernel then looks the names up one by one (each
/// answered from the core's listing).
///
/// The kernel marks the atime of a directory it read from the file system stale
/// (`fuse_readdir` → `fuse_invalidate_atime`), which made the program's next `stat` of it a
/// GETATTR; a statx for the atime on the open directory right after the read asks it now,
/// from this thread, instead.
fn kernel_read(s: &Shared, dir: &NodeRef, root: &mut Option<rustix::fd::OwnedFd>) -> bool {
    use rustix::fs::{openat2, Mode, OFlags, ResolveFlags, CWD};
    use rustix::mount::{open_tree, OpenTreeFlags};
    let Some(mnt) = s.mountpoint.get() else {
        return false;
    };
    // Only directories of the served tree itself (not of a file system mounted into the
    // core), whose backend path is then their path below the mount point.
    if dir.is_dead() || !Arc::ptr_eq(&s.cache.node_backend(dir), s.cache.backend()) {
        return false;
    }
    let Ok(rel) = s.cache.node_path(dir) else {
        return false;
    };
    if root.is_none() {
        let Ok(fd) = open_tree(
            CWD,
            mnt.as_path(),
            OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
        ) else {
            return false;
        };
        // Checked once per descriptor (each statfs is a request): unmounted meanwhile, MNT
        // is the directory below it now.
        if !rustix::fs::fstatfs(&fd).is_ok_and(|f| u64::try_from(f.f_type) == Ok(FUSE_SUPER_MAGIC))
        {
            return false;
        }
        *root = Some(fd);
    }
    let Some(root_fd) = root.as_ref() else {
        return false;
    };
    let rel = if rel.is_empty() {
        std::path::Path::new(".")
    } else {
        std::path::Path::new(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&rel))
    };
    let Ok(fd) = openat2(
        root_fd,
        rel,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_XDEV,
    ) else {
        return false;
    };
    tracing::trace!(dir = %rel.display(), "lookahead: kernel read");
    let mut buf = vec![std::mem::MaybeUninit::<u8>::uninit(); KERNEL_READ_BUF];
    let mut it = rustix::fs::RawDir::new(&fd, &mut buf);
    while let Some(Ok(_)) = it.next() {}
    let _ = rustix::fs::statx(
        &fd,
        "",
        rustix::fs::AtFlags::EMPTY_PATH,
        rustix::fs::StatxFlags::ATIME,
    );
    true
}

/// `f_type` of a FUSE file system (`FUSE_SUPER_MAGIC`).
const FUSE_SUPER_MAGIC: u64 = 0x6573_5546;

/// A job of [`Prefetcher::ahead_of_lookups`]: list `child` with attributes (or fetch those
/// its complete listing lacks), read it through the mount, queue its subdirectories.
fn ahead(
    s: &Arc<Shared>,
    job: &Job,
    child: &NodeRef,
    attr: &dircache_core::Attr,
    root: &mut Option<rustix::fd::OwnedFd>,
) {
    if attr.size > AHEAD_MAX_DIR_BYTES {
        return;
    }
    let fresh = !child.is_complete()
        || child
            .cached_children()
            .iter()
            .any(|c| matches!(c.kind(), NodeKind::Positive(_)) && c.cached_attr().is_none());
    if fresh && list_into_cache(s, &job.creds, child, true).is_some() {
        s.counters
            .lookahead_ahead_listings
            .fetch_add(1, Ordering::Relaxed);
    }
    if !child.is_complete() {
        return;
    }
    // On this thread, in the order the jobs come (path order), not queued behind the reads
    // lookups ask for.
    if kernel_read(s, child, root) {
        s.counters
            .lookahead_ahead_reads
            .fetch_add(1, Ordering::Relaxed);
    }
    if job.ahead > 1 {
        queue_ahead(s, &job.creds, child, job.ahead - 1, None);
    }
}

/// List `job.name` in `job.parent` into the core cache, unless it is gone, not a directory,
/// or complete already.
fn prefetch(s: &Arc<Shared>, job: &Job, root: &mut Option<rustix::fd::OwnedFd>) {
    if job.parent.is_dead() {
        return;
    }
    let Ok(child) = s.cache.lookup_child(&job.creds, &job.parent, &job.name) else {
        return;
    };
    if child.kind() != NodeKind::Positive(FileType::Directory)
        || (child.is_complete() && job.ahead == 0)
        || child.is_dead()
    {
        return;
    }
    // Only what the requester may list and enter (mode bits, as the kernel's
    // default_permissions): nothing is fetched for a walker that could not read it.
    // A subdirectory may sit in the core without attributes: a walker's listing that reused
    // the cached children of its directory (`reuse` in `fs/dirs.rs`) fetches the others in
    // its reply, after this job was queued, and a prefetch thread may pop the job first. It
    // used to be skipped then (the "prefetch skip": about 1 run in 20 of `prefetch.rs`
    // `prefetched_listings_follow_changes`, one of eight subdirectories never listed).
    let attr = match child.cached_attr() {
        Some(a) => a,
        None => match s.cache.getattr(&child) {
            Ok(a) => a,
            Err(_) => return,
        },
    };
    if PosixPolicy
        .permission(job.creds.cred(), &attr, R_OK | X_OK)
        .is_err()
    {
        return;
    }
    if job.ahead > 0 {
        return ahead(s, job, &child, &attr, root);
    }
    let id = child.id();
    match s.inflight.lock() {
        Ok(mut g) => {
            g.insert(id);
        }
        Err(_) => return,
    }
    let lean_state = s.lean.get();
    let lean = lean_state.is_some_and(|l| l.is_lean());
    let acl_gen = s.cache.xattr_memo_gen();
    // As a walker's own full listing with `-o lean` (`fs/dirs.rs`): a directory with cached
    // children (looked up one by one, e.g. by `git status`) is listed by name, and only the
    // entries the cache holds no attributes for are statted, instead of a backend listing
    // that statx'es every entry again (17k extra statx in a cold `git status` of the
    // benchmark tree: 256 listings went full after one ACL request).
    let reuse = !lean && lean_state.is_some_and(|l| l.on()) && child.has_children();
    let listing = s.cache.readdir_node(&job.creds, &child, !lean && !reuse);
    if lean || reuse {
        if let Ok(l) = &listing {
            crate::lean::stat_entries(&s.cache, &job.creds, &child, l, lean);
        }
    }
    let ok = listing.is_ok();
    if let Ok(mut g) = s.inflight.lock() {
        g.remove(&id);
    }
    s.listed.notify_all();
    // `ls -l` is walking: its ACL requests for these entries come next. Fetched after the
    // walker was let go: its listing does not wait for them.
    if let (Ok(l), Some(ls)) = (&listing, lean_state) {
        if !lean && ls.acls_ahead() {
            crate::lean::fill_acls(ls, &s.cache, &job.creds, &child, l, acl_gen);
        }
    }
    if ok {
        s.counters.prefetch_listings.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::ReadQueue;

    fn order(q: &mut ReadQueue<()>) -> Vec<u64> {
        std::iter::from_fn(|| q.pop().map(|(id, ())| id)).collect()
    }

    #[test]
    fn a_directory_asked_for_again_is_read_next() {
        let mut q = ReadQueue::default();
        for id in [1, 2, 3] {
            assert!(q.push(id, (), 16));
        }
        // Lookups go on in 1 (queued first, not read yet): it is read before 3 and 2.
        assert!(!q.push(1, (), 16));
        assert_eq!(order(&mut q), vec![1, 3, 2]);
    }

    #[test]
    fn a_directory_is_queued_once_and_not_while_it_is_read() {
        let mut q = ReadQueue::default();
        assert!(q.push(7, (), 16));
        assert!(!q.push(7, (), 16));
        assert_eq!(q.pop().map(|(id, ())| id), Some(7));
        // Being read: asked again, it is neither queued nor read twice at once.
        assert!(!q.push(7, (), 16));
        assert!(q.is_empty());
        q.done(7);
        assert!(q.push(7, (), 16));
        assert_eq!(order(&mut q), vec![7]);
    }

    #[test]
    fn the_oldest_is_dropped_past_the_bound() {
        let mut q = ReadQueue::default();
        for id in 1..=4 {
            q.push(id, (), 3);
        }
        assert_eq!(order(&mut q), vec![4, 3, 2]);
        // 1 was dropped, not left pending: it can be queued again.
        assert!(q.push(1, (), 3));
    }
}
