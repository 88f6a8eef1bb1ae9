//! # dircache-search
//!
//! `search(paths, pattern, flags)` after Kokoszka, Donnelly and Thain, *Search Should Be a
//! System Call* (TR-2013-03): one operation that finds files by pattern across directories,
//! carried out by the layer closest to the data.
//!
//! * [`Pattern`] - the pattern language (§3), including decomposition at mount points (§4);
//! * [`search`] / [`search_with`] - run a [`SearchRequest`] over a [`Source`] (the real file
//!   system via [`DirectSource`], or a dircache cache via [`CacheSource`]), returning a
//!   [`SearchStream`] of [`SearchResult`]s;
//! * [`proto`] - the wire format (length-prefixed JSON frames) a mount's daemon or a server
//!   accepts, the client side of delegation (which daemons it trusts: [`proto::ClientConfig`])
//!   and [`proto::answer`] for the daemon;
//! * [`dircache_local::creds`] - running a search with another user's credentials ([`Caps::Empty`](dircache_local::creds::Caps::Empty)), the kernel deciding.
//!
//! ## Semantics
//! * `paths` is a `:`-separated list of directories, searched in order (all results of the
//!   first directory before any of the second). A root that is a symlink is followed; below the
//!   roots no symbolic link is followed (like `find -P`): a symlink is matched by its own name
//!   and never descended. A root that exists but is not a directory is an error of the call
//!   ([`SearchError::NotADirectory`]); a root that is missing or unreadable is reported inside
//!   the results (so a PATH with a missing entry still works).
//! * Result paths are relative to their root (`""` for the root itself, only seen in error
//!   results) unless [`Flags::INCLUDEROOT`], which prefixes the root as given (`root/rel`).
//!   [`SearchResult::root`] always says which root it came from.
//! * [`Flags::METADATA`] attaches the attributes of the entry itself (lstat, like `ls -l` and
//!   `find -P`). [`Flags::R_OK`] / `W_OK` / `X_OK` keep only the entries the caller may
//!   read/write/execute, following symlinks as access(2) does (see [`DirectSource`] for who the
//!   caller is). [`Flags::STOPATFIRST`] ends the search at the first match; roots are searched
//!   in order, so it is a match in the first root that has one.
//! * An unreadable directory, a file that vanished, ... become results with
//!   [`SearchResult::error`] set, and the search goes on.
//! * Directories are searched in parallel (a LIFO work queue served by N threads, N =
//!   available parallelism); there is no recursion on the call stack and no depth limit. Each
//!   worker holds at most two descriptors at a time (plus one O_PATH descriptor per root), so a
//!   search never needs more than `2N + roots` descriptors whatever the tree. Results travel to
//!   the consumer through a bounded channel (backpressure): memory is bounded by the channel,
//!   one listing per worker, and the pending-directory frontier (depth-first order keeps it to
//!   the unvisited siblings along the current paths, not the whole tree).
//! * Cancellation: [`SearchStream::canceller`] or dropping the stream.
//! * Anchored patterns whose next component is literal (PATH and library searches, `/chmod`)
//!   are answered with an open of the directory (same permission semantics as listing it) and
//!   one lstat per name instead of a full listing.
#![forbid(unsafe_code)]

pub mod delegated;
pub mod held;
pub mod pattern;
pub mod peer;
pub mod proto;
pub mod source;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};
use dircache_core::{Attr, Error, FileType};
use parking_lot::{Condvar, Mutex};
use serde::{Deserialize, Serialize};

pub use dircache_core::Attr as SearchAttr;
pub use pattern::Pattern;
pub use source::{CacheSource, DirectSource, MountAccess, RawEntry, Source};

pub use proto::ClientConfig;

/// Errors of the call itself (bad input). Errors met during the search are results.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum SearchError {
    #[error("invalid pattern {0:?}: {1}")]
    InvalidPattern(String, String),
    #[error("empty path list")]
    EmptyPaths,
    #[error("{0}: not a directory")]
    NotADirectory(String),
    #[error("{0}: {1}")]
    Root(String, Error),
    #[error("cannot start search threads: {0}")]
    Spawn(String),
    /// A dircache daemon that took the search failed the client (no answer in time, a
    /// broken protocol): not bad input.
    #[error("{0}")]
    Daemon(String),
}

/// Most worker threads a search uses, whatever [`SearchOptions::threads`] asks.
pub const MAX_THREADS: usize = 256;

/// Search flags (a bit set).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Flags(pub u32);

impl Flags {
    pub const NONE: Flags = Flags(0);
    /// Halt at the first match.
    pub const STOPATFIRST: Flags = Flags(1);
    /// Attach the attributes (lstat) of every result.
    pub const METADATA: Flags = Flags(2);
    /// Prefix every result path with the root it was found in.
    pub const INCLUDEROOT: Flags = Flags(4);
    /// Only results the caller may read.
    pub const R_OK: Flags = Flags(8);
    /// Only results the caller may write.
    pub const W_OK: Flags = Flags(16);
    /// Only results the caller may execute (search, for directories).
    pub const X_OK: Flags = Flags(32);
    pub const ALL: Flags = Flags(63);

    pub fn contains(self, f: Flags) -> bool {
        self.0 & f.0 == f.0
    }
    /// The access(2) mask (R_OK=4, W_OK=2, X_OK=1) these flags ask for.
    pub fn access_mask(self) -> u32 {
        let mut m = 0;
        if self.contains(Flags::R_OK) {
            m |= 4;
        }
        if self.contains(Flags::W_OK) {
            m |= 2;
        }
        if self.contains(Flags::X_OK) {
            m |= 1;
        }
        m
    }
}

impl std::ops::BitOr for Flags {
    type Output = Flags;
    fn bitor(self, o: Flags) -> Flags {
        Flags(self.0 | o.0)
    }
}

impl std::ops::BitOrAssign for Flags {
    fn bitor_assign(&mut self, o: Flags) {
        self.0 |= o.0;
    }
}

/// A search request: what a library caller, the C API, a mount's daemon or a server accepts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SearchRequest {
    /// `:`-separated directories.
    pub paths: String,
    pub pattern: String,
    pub flags: Flags,
}

impl SearchRequest {
    pub fn new(
        paths: impl Into<String>,
        pattern: impl Into<String>,
        flags: Flags,
    ) -> SearchRequest {
        SearchRequest {
            paths: paths.into(),
            pattern: pattern.into(),
            flags,
        }
    }

    /// The roots, in order (an empty one is rejected by [`SearchRequest::validate`]).
    pub fn roots(&self) -> Vec<&str> {
        self.paths.split(':').collect()
    }

    /// Parse the pattern and check the path list (not the file system).
    pub fn validate(&self) -> Result<Pattern, SearchError> {
        if self.paths.is_empty() || self.paths.split(':').any(|p| p.is_empty()) {
            return Err(SearchError::EmptyPaths);
        }
        if self.paths.contains('\0') {
            return Err(SearchError::Root(self.paths.clone(), Error::Invalid));
        }
        Pattern::parse(&self.pattern)
    }
}

/// Which operation failed, for results that report an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ErrorSource {
    /// Opening a directory (or a root) failed.
    Open = 1,
    /// Reading a directory's entries failed.
    Readdir = 2,
    /// Stat of an entry (METADATA, unknown type, literal lookup) failed, e.g. it vanished.
    Stat = 3,
    /// A delegated search lost its daemon mid-way.
    Delegate = 4,
}

/// The error part of a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ResultError {
    pub source: ErrorSource,
    pub errno: i32,
}

/// One result: a match (with attributes if METADATA) or an error met on the way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SearchResult {
    /// Index of the root (in `paths`) this result belongs to.
    pub root: u32,
    /// The path (module docs: relative to the root, or prefixed with it for INCLUDEROOT).
    /// On the wire: a JSON string when it is UTF-8, else an array of bytes.
    #[serde(with = "path_bytes")]
    pub path: Vec<u8>,
    pub stat: Option<Attr>,
    pub error: Option<ResultError>,
}

impl SearchResult {
    pub fn is_error(&self) -> bool {
        self.error.is_some()
    }
}

/// Engine options.
#[derive(Debug, Clone)]
pub struct SearchOptions {
    /// Worker threads for recursive searches (0 = available parallelism).
    pub threads: usize,
    /// Run a child search with a decomposed pattern (paper §4) at every directory whose device
    /// differs from its parent's. The results are identical; it costs one statx per directory
    /// and is what lets a sub-search be handed to another file system's own search.
    pub split_at_mounts: bool,
    /// Capacity of the result channel, in batches (one batch per directory).
    pub channel_batches: usize,
    /// Hand the part of the search below a dircache mount met on the way (a mount point under
    /// a root whose root directory names a daemon socket, [`proto::SOCKET_XATTR`]) to that
    /// mount's daemon, with the decomposed pattern (paper §4). Found once per search from
    /// /proc/self/mountinfo; costs nothing per directory. Meant for [`DirectSource`].
    pub delegate_mounts: bool,
    /// Which daemons a delegating search trusts and how long it waits for them.
    pub client: proto::ClientConfig,
}

impl Default for SearchOptions {
    fn default() -> Self {
        SearchOptions {
            threads: 0,
            split_at_mounts: false,
            delegate_mounts: false,
            channel_batches: 64,
            client: proto::ClientConfig::default(),
        }
    }
}

/// Cancels a running search from anywhere.
#[derive(Clone, Debug)]
pub struct Canceller(Arc<AtomicBool>);

impl Canceller {
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// The results of a search, as they are found.
/// The source of a [`SearchStream`] read by its consumer's thread.
pub(crate) type Pull = Box<dyn FnMut() -> Option<Vec<SearchResult>> + Send>;

pub struct SearchStream {
    rx: Option<Receiver<Vec<SearchResult>>>,
    buf: std::vec::IntoIter<SearchResult>,
    cancel: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    /// Results read by the iterating thread itself, a batch per call (`None`: the end):
    /// a delegated search read inline ([`crate::proto::delegate_inline`]).
    pull: Option<Pull>,
    /// Run when the stream is dropped, before joining the threads (closes a delegated
    /// search's connection).
    pub(crate) on_drop: Option<Box<dyn FnOnce() + Send>>,
}

impl SearchStream {
    pub fn canceller(&self) -> Canceller {
        Canceller(self.cancel.clone())
    }

    /// Threads of its own producing this stream's results (0: the iterating thread reads
    /// them itself, [`crate::proto::delegate_inline`]).
    pub fn own_threads(&self) -> usize {
        self.threads.len()
    }

    /// A stream over results the iterating thread reads itself (`pull`), no thread of its own.
    pub(crate) fn pulled(pull: Pull, cancel: Arc<AtomicBool>) -> SearchStream {
        SearchStream {
            rx: None,
            buf: Vec::new().into_iter(),
            cancel,
            threads: Vec::new(),
            pull: Some(pull),
            on_drop: None,
        }
    }

    /// A stream over results produced elsewhere (delegation).
    pub(crate) fn from_parts(
        rx: Receiver<Vec<SearchResult>>,
        cancel: Arc<AtomicBool>,
        threads: Vec<JoinHandle<()>>,
    ) -> SearchStream {
        SearchStream {
            rx: Some(rx),
            buf: Vec::new().into_iter(),
            cancel,
            threads,
            pull: None,
            on_drop: None,
        }
    }
}

/// What [`SearchStream::next_batch`] found.
pub enum Batch {
    /// Some results.
    Results(Vec<SearchResult>),
    /// Nothing within the wait; the search goes on.
    Idle,
    /// The search is over.
    End,
}

impl SearchStream {
    /// The next results as they come, waiting at most `wait` (for a server that must also
    /// watch its client while the search runs).
    pub fn next_batch(&mut self, wait: std::time::Duration) -> Batch {
        if self.buf.len() > 0 {
            return Batch::Results(std::mem::take(&mut self.buf).collect());
        }
        if let Some(p) = self.pull.as_mut() {
            return match p() {
                Some(b) => Batch::Results(b),
                None => {
                    self.pull = None;
                    Batch::End
                }
            };
        }
        let Some(rx) = self.rx.as_ref() else {
            return Batch::End;
        };
        match rx.recv_timeout(wait) {
            Ok(b) => Batch::Results(b),
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => Batch::Idle,
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                self.rx = None;
                Batch::End
            }
        }
    }
}

impl Iterator for SearchStream {
    type Item = SearchResult;
    fn next(&mut self) -> Option<SearchResult> {
        loop {
            if let Some(r) = self.buf.next() {
                return Some(r);
            }
            if let Some(p) = self.pull.as_mut() {
                match p() {
                    Some(b) => self.buf = b.into_iter(),
                    None => {
                        self.pull = None;
                        return None;
                    }
                }
                continue;
            }
            let rx = self.rx.as_ref()?;
            match rx.recv() {
                Ok(b) => self.buf = b.into_iter(),
                Err(_) => {
                    self.rx = None;
                    return None;
                }
            }
        }
    }
}

impl Drop for SearchStream {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::SeqCst);
        self.rx = None; // unblocks workers waiting to send
        self.pull = None;
        if let Some(f) = self.on_drop.take() {
            f();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Search with default options.
pub fn search<S: Source>(req: &SearchRequest, source: Arc<S>) -> Result<SearchStream, SearchError> {
    search_with(req, source, &SearchOptions::default())
}

/// The sub-search a job belongs to: the whole search, or a child search started at a mount
/// point with a decomposed pattern.
struct Sub {
    pattern: Pattern,
    /// Length of the prefix of `rel` that is the child search's root, plus the `/` (0 = root).
    base_len: usize,
}

struct Job {
    root: usize,
    rel: Vec<u8>,
    sub: Arc<Sub>,
    parent_dev: Option<u64>,
}

struct Queue {
    jobs: Vec<Job>,
    active: usize,
    next_root: usize,
    done: bool,
}

/// A root as given, and its opened handle (or why it could not be opened).
type OpenedRoot<S> = (Vec<u8>, Result<<S as Source>::Root, Error>);

struct Shared<S: Source> {
    source: Arc<S>,
    /// (root index, path below the root) of dircache mounts to delegate to -> their socket.
    mounts: std::collections::HashMap<(usize, Vec<u8>), proto::Daemon>,
    roots: Vec<OpenedRoot<S>>,
    top: Arc<Sub>,
    flags: Flags,
    opts: SearchOptions,
    queue: Mutex<Queue>,
    cv: Condvar,
    cancel: Arc<AtomicBool>,
    found: AtomicBool,
    tx: Sender<Vec<SearchResult>>,
}

/// Each of `req`'s roots opened on `source` (a root that is not a directory is the request's
/// error; other failures are reported with that root's results).
fn open_roots<S: Source>(
    req: &SearchRequest,
    source: &S,
) -> Result<Vec<OpenedRoot<S>>, SearchError> {
    let mut roots = Vec::new();
    for r in req.paths.split(':') {
        let opened = source.open_root(r.as_bytes());
        if let Err(Error::NotDir) = opened {
            return Err(SearchError::NotADirectory(r.to_string()));
        }
        roots.push((r.as_bytes().to_vec(), opened));
    }
    Ok(roots)
}

impl<S: Source> Shared<S> {
    /// A search's state before any directory is read.
    #[allow(clippy::too_many_arguments)]
    fn new(
        source: Arc<S>,
        mounts: std::collections::HashMap<(usize, Vec<u8>), proto::Daemon>,
        roots: Vec<OpenedRoot<S>>,
        pattern: Pattern,
        req: &SearchRequest,
        opts: &SearchOptions,
        cancel: Arc<AtomicBool>,
        tx: Sender<Vec<SearchResult>>,
    ) -> Self {
        Shared {
            source,
            mounts,
            roots,
            top: Arc::new(Sub {
                pattern,
                base_len: 0,
            }),
            flags: req.flags,
            opts: opts.clone(),
            queue: Mutex::new(Queue {
                jobs: Vec::new(),
                active: 0,
                next_root: 0,
                done: false,
            }),
            cv: Condvar::new(),
            cancel,
            found: AtomicBool::new(false),
            tx,
        }
    }
}

/// Run `req` over `source` on the calling thread (one worker, no thread started, nothing
/// handed over) and return every result; `cancel` (set by anyone, the source included) stops
/// it. For sources that answer from memory ([`held`]): there a thread's start and the
/// wake-ups of handing results from one thread to another cost more than the walk, on a
/// loaded machine most of all.
pub fn search_collect<S: Source>(
    req: &SearchRequest,
    source: Arc<S>,
    opts: &SearchOptions,
    cancel: Arc<AtomicBool>,
) -> Result<Vec<SearchResult>, SearchError> {
    let pattern = req.validate()?;
    let roots = open_roots(req, &*source)?;
    // Unbounded: nobody takes batches while the one worker runs.
    let (tx, rx) = crossbeam_channel::unbounded();
    let shared = Arc::new(Shared::new(
        source,
        Default::default(),
        roots,
        pattern,
        req,
        opts,
        cancel,
        tx,
    ));
    worker(shared);
    Ok(rx.try_iter().flatten().collect())
}

/// Run `req` over `source`. Returns at once; the work happens on background threads.
pub fn search_with<S: Source>(
    req: &SearchRequest,
    source: Arc<S>,
    opts: &SearchOptions,
) -> Result<SearchStream, SearchError> {
    let pattern = req.validate()?;
    let roots = open_roots(req, &*source)?;
    let nthreads = if !pattern.is_recursive() && pattern.max_anchored_depth() <= 1 {
        1
    } else if opts.threads == 0 {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
    } else {
        opts.threads.min(MAX_THREADS)
    };
    let (tx, rx) = crossbeam_channel::bounded(opts.channel_batches.max(1));
    let cancel = Arc::new(AtomicBool::new(false));
    // A caller with CAP_DAC_* searches the mounts itself: a daemon never applies capabilities.
    let mounts = if opts.delegate_mounts && !dircache_local::creds::caller_has_dac_caps() {
        proto::dircache_mounts_below(&req.roots(), &opts.client)
    } else {
        Default::default()
    };
    let shared = Arc::new(Shared::new(
        source,
        mounts,
        roots,
        pattern,
        req,
        opts,
        cancel.clone(),
        tx,
    ));
    let mut threads = Vec::with_capacity(nthreads);
    for i in 0..nthreads {
        let sh = shared.clone();
        let t = std::thread::Builder::new()
            .name(format!("search-{i}"))
            .spawn(move || worker(sh))
            .map_err(|e| SearchError::Spawn(e.to_string()));
        match t {
            Ok(t) => threads.push(t),
            Err(e) => {
                cancel.store(true, Ordering::SeqCst);
                shared.cv.notify_all();
                drop(shared);
                for t in threads {
                    let _ = t.join();
                }
                return Err(e);
            }
        }
    }
    Ok(SearchStream::from_parts(rx, cancel, threads))
}

fn worker<S: Source>(sh: Arc<Shared<S>>) {
    if let Err(e) = sh.source.thread_init() {
        // Could not take on the caller's identity: searching as ourselves would be wrong.
        let _ = sh.tx.send(vec![SearchResult {
            root: 0,
            path: Vec::new(),
            stat: None,
            error: Some(ResultError {
                source: ErrorSource::Open,
                errno: e.errno(),
            }),
        }]);
        sh.cancel.store(true, Ordering::SeqCst);
    }
    let mut entries = Vec::new();
    loop {
        let job = {
            let mut q = sh.queue.lock();
            loop {
                if sh.cancel.load(Ordering::Relaxed) {
                    q.done = true;
                    q.jobs.clear();
                }
                if q.done {
                    sh.cv.notify_all();
                    return;
                }
                if let Some(j) = q.jobs.pop() {
                    q.active += 1;
                    break j;
                }
                if q.active == 0 {
                    // The current root is finished: start the next one, or end.
                    if q.next_root < sh.roots.len() {
                        let root = q.next_root;
                        q.next_root += 1;
                        q.jobs.push(Job {
                            root,
                            rel: Vec::new(),
                            sub: sh.top.clone(),
                            parent_dev: None,
                        });
                        continue;
                    }
                    q.done = true;
                    continue;
                }
                sh.cv.wait(&mut q);
            }
        };
        let mut out = Vec::new();
        let mut subs = Vec::new();
        process(&sh, &job, &mut entries, &mut out, &mut subs);
        if !out.is_empty() && sh.tx.send(out).is_err() {
            sh.cancel.store(true, Ordering::SeqCst);
        }
        let mut q = sh.queue.lock();
        let n = subs.len();
        q.jobs.extend(subs);
        q.active -= 1;
        if n > 1 || q.active == 0 || sh.cancel.load(Ordering::Relaxed) {
            sh.cv.notify_all();
        } else if n == 1 {
            sh.cv.notify_one();
        }
    }
}

pub(crate) fn join_path(a: &[u8], b: &[u8]) -> Vec<u8> {
    if a.is_empty() {
        return b.to_vec();
    }
    if b.is_empty() {
        return a.to_vec();
    }
    let mut p = Vec::with_capacity(a.len() + b.len() + 1);
    p.extend_from_slice(a);
    if !a.ends_with(b"/") {
        p.push(b'/');
    }
    p.extend_from_slice(b);
    p
}

/// The result path for `rel` below root `root` (see the module docs).
fn out_path(root: &[u8], rel: &[u8], flags: Flags) -> Vec<u8> {
    if flags.contains(Flags::INCLUDEROOT) {
        join_path(root, rel)
    } else {
        rel.to_vec()
    }
}

fn split_comps(rel: &[u8]) -> Vec<&[u8]> {
    if rel.is_empty() {
        Vec::new()
    } else {
        rel.split(|&b| b == b'/').collect()
    }
}

fn process<S: Source>(
    sh: &Shared<S>,
    job: &Job,
    entries: &mut Vec<RawEntry>,
    out: &mut Vec<SearchResult>,
    subs: &mut Vec<Job>,
) {
    let (root_path, root) = &sh.roots[job.root];
    let ridx = job.root as u32;
    let err = |path: &[u8], source: ErrorSource, e: Error| SearchResult {
        root: ridx,
        path: out_path(root_path, path, sh.flags),
        stat: None,
        error: Some(ResultError {
            source,
            errno: e.errno(),
        }),
    };
    let root = match root {
        Ok(r) => r,
        Err(e) => {
            out.push(err(b"", ErrorSource::Open, *e));
            return;
        }
    };
    if !sh.mounts.is_empty() {
        if let Some(d) = sh.mounts.get(&(job.root, job.rel.clone())) {
            if delegate_child(sh, job, d, out) {
                return;
            }
            // No daemon answered: search the mount locally.
        }
    }
    let mut dir = match sh.source.open_dir(root, &job.rel) {
        Ok(d) => d,
        Err(e) => {
            out.push(err(&job.rel, ErrorSource::Open, e));
            return;
        }
    };
    let mut sub = job.sub.clone();
    let mut dev = None;
    if sh.opts.split_at_mounts {
        if let Ok(d) = sh.source.dev(&dir) {
            dev = Some(d);
            if job.parent_dev.is_some_and(|p| p != d) {
                // A mount point: a child search rooted here with the decomposed pattern.
                let local = job.rel.get(sub.base_len..).unwrap_or(&[]);
                let p = sub.pattern.decompose(&split_comps(local));
                if p.is_empty() {
                    return;
                }
                sub = Arc::new(Sub {
                    pattern: p,
                    base_len: job.rel.len() + 1,
                });
            }
        }
    }
    let pat = &sub.pattern;
    let local = job.rel.get(sub.base_len..).unwrap_or(&[]);
    let mut comps = split_comps(local);
    let plus = sh.flags.contains(Flags::METADATA);
    entries.clear();
    let mut listed = false;
    if let Some(names) = pat.literal_children(&comps) {
        listed = true;
        for n in names {
            if sh.cancel.load(Ordering::Relaxed) {
                return;
            }
            match sh.source.lookup(&dir, n) {
                Ok(Some(e)) => entries.push(e),
                Ok(None) | Err(Error::NotDir) => {}
                Err(_) => {
                    // e.g. a directory we may list but not search: fall back to the listing
                    // so that the answer is the same as without the shortcut.
                    entries.clear();
                    listed = false;
                    break;
                }
            }
        }
    }
    if !listed {
        if let Err(e) = sh.source.read_dir(&mut dir, plus, entries) {
            // Keep what was read before the error.
            out.push(err(&job.rel, ErrorSource::Readdir, e));
        }
    }
    let mask = sh.flags.access_mask();
    let stop_first = sh.flags.contains(Flags::STOPATFIRST);
    for e in entries.iter() {
        if sh.cancel.load(Ordering::Relaxed) {
            return;
        }
        comps.push(&e.name);
        let is_match = pat.matches(&comps);
        let descend_possible = pat.may_descend(&comps);
        let mut kind = e.kind;
        let mut attr = e.attr;
        if kind.is_none() && (descend_possible || (is_match && plus)) {
            match sh.source.lstat(&dir, &e.name) {
                Ok(a) => {
                    kind = Some(a.kind());
                    attr = Some(a);
                }
                Err(er) => {
                    out.push(err(&join_path(&job.rel, &e.name), ErrorSource::Stat, er));
                    comps.pop();
                    continue;
                }
            }
        }
        if is_match && (mask == 0 || sh.source.access(&dir, &e.name, mask)) {
            let path = join_path(&job.rel, &e.name);
            let mut res = SearchResult {
                root: ridx,
                path: out_path(root_path, &path, sh.flags),
                stat: None,
                error: None,
            };
            if plus {
                match attr {
                    Some(a) => res.stat = Some(a),
                    None => match sh.source.lstat(&dir, &e.name) {
                        Ok(a) => res.stat = Some(a),
                        Err(er) => res = err(&path, ErrorSource::Stat, er),
                    },
                }
            }
            if stop_first && res.error.is_none() {
                if !sh.found.swap(true, Ordering::SeqCst) {
                    out.push(res);
                }
                sh.cancel.store(true, Ordering::SeqCst);
                return;
            }
            out.push(res);
        }
        if kind == Some(FileType::Directory) && descend_possible {
            subs.push(Job {
                root: job.root,
                rel: join_path(&job.rel, &e.name),
                sub: sub.clone(),
                parent_dev: dev,
            });
        }
        comps.pop();
    }
    // Depth-first: the queue pops from the end, so reverse to visit in listing order.
    subs.reverse();
}

/// Run the part of the search below mount point `job.rel` as a child search at the mount's
/// daemon with the decomposed pattern. `false` if no daemon took it.
fn delegate_child<S: Source>(
    sh: &Shared<S>,
    job: &Job,
    daemon: &proto::Daemon,
    out: &mut Vec<SearchResult>,
) -> bool {
    let local = job.rel.get(job.sub.base_len..).unwrap_or(&[]);
    let p = job.sub.pattern.decompose(&split_comps(local));
    if p.is_empty() {
        return true; // nothing below can match
    }
    let (root_path, _) = &sh.roots[job.root];
    let ridx = job.root as u32;
    let stop_first = sh.flags.contains(Flags::STOPATFIRST);
    proto::child_search(
        daemon,
        &sh.opts.client,
        &p.to_string(),
        sh.flags,
        |mut r| {
            if sh.cancel.load(Ordering::Relaxed) {
                return false;
            }
            let full = join_path(&job.rel, &r.path);
            r.path = out_path(root_path, &full, sh.flags);
            r.root = ridx;
            if stop_first && r.error.is_none() {
                if !sh.found.swap(true, Ordering::SeqCst) {
                    out.push(r);
                }
                sh.cancel.store(true, Ordering::SeqCst);
                return false;
            }
            out.push(r);
            if out.len() >= proto::RESULTS_PER_FRAME && sh.tx.send(std::mem::take(out)).is_err() {
                sh.cancel.store(true, Ordering::SeqCst);
                return false;
            }
            true
        },
    )
}

/// Serde for file names: a string when UTF-8 (compact JSON), an array of bytes otherwise.
mod path_bytes {
    use serde::de::{Deserializer, SeqAccess, Visitor};
    use serde::Serializer;

    pub fn serialize<S: Serializer>(p: &[u8], s: S) -> Result<S::Ok, S::Error> {
        match std::str::from_utf8(p) {
            Ok(t) => s.serialize_str(t),
            Err(_) => s.collect_seq(p.iter()),
        }
    }

    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Vec<u8>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a string or an array of bytes")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Vec<u8>, E> {
            Ok(v.as_bytes().to_vec())
        }
        fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
            Ok(v.to_vec())
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Vec<u8>, A::Error> {
            let mut out = Vec::new();
            while let Some(b) = a.next_element::<u8>()? {
                out.push(b);
            }
            Ok(out)
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        d.deserialize_any(V)
    }
}
