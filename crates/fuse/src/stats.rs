//! Live statistics of a mount: FUSE requests by kind, and the control socket.
//!
//! ## Control socket protocol
//! A unix stream socket. Each message is a frame: a 4-byte big-endian length, then that many
//! bytes of JSON (a request at most [`limits::MAX_REQUEST`] bytes, read incrementally). The
//! client sends one request object, the daemon answers with one response object, and the
//! client may send further requests on the same connection.
//!
//! Requests are objects tagged by `"op"`: `{"op":"stats"}`, `{"op":"ping"}`,
//! `{"op":"search",...}` (dircache_search::proto: streamed results), `{"op":"cached",...}`
//! (crate::cacheview: what the cache holds under a path, as far as the caller may list). Responses are
//! `{"ok":true, ...}` or `{"ok":false,"error":"..."}`; unknown ops get an error response, so
//! old daemons and new clients interoperate. None of them changes the daemon's state. Every
//! request but `ping` is answered only to a caller who can reach MNT through the kernel
//! (`dircache_search::proto::caller_reaches_mount`); others get [`NOT_REACHABLE`].
//!
//! ## Who can reach it, and what it costs
//! The socket lives in a directory only the daemon's user can write ([`secure_socket_dir`]:
//! `/run/dircache` 0755 for root), so nobody else can replace it; the socket itself is 0666.
//! The peer's uid, gid and groups are taken once, when it connects (SO_PEERCRED,
//! SO_PEERGROUPS), and its real and saved ids once, when it is accepted
//! (`dircache_search::peer`: through its pidfd, for the kernel's owner check). Connections,
//! searches, request size and time are capped ([`limits`]); a client that goes away cancels
//! its search.
//!
//! The daemon publishes the socket path as the extended attribute [`SOCKET_XATTR`] of the
//! mount root; clients ([`query_mount`], `dircache search`) believe it only on a dircache
//! mount, from a daemon running as root or the mount's owner.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dircache_core::stats::{Histogram, HistogramSnapshot};
use dircache_core::Cache;
use serde_json::{json, Value};

use crate::Error;

/// Extended attribute of the mount root holding the control socket path.
pub const SOCKET_XATTR: &str = "user.dircache.socket";
/// Largest frame a client accepts (responses); requests are smaller
/// ([`limits::MAX_REQUEST`]).
pub const MAX_FRAME: usize = dircache_search::proto::MAX_RESPONSE;

macro_rules! ops {
    ($($name:ident),* $(,)?) => {
        /// Kinds of FUSE requests, for counting.
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[repr(usize)]
        pub enum Op { $($name),* }
        impl Op {
            pub const ALL: &'static [Op] = &[$(Op::$name),*];
            pub fn name(self) -> &'static str {
                match self { $(Op::$name => stringify!($name)),* }
            }
        }
    };
}

ops!(
    lookup,
    forget,
    getattr,
    setattr,
    readlink,
    mknod,
    mkdir,
    unlink,
    rmdir,
    symlink,
    rename,
    link,
    open,
    read,
    write,
    flush,
    release,
    fsync,
    opendir,
    readdir,
    readdirplus,
    releasedir,
    fsyncdir,
    statfs,
    setxattr,
    getxattr,
    listxattr,
    removexattr,
    access,
    create,
    fallocate,
    lseek,
    copy_file_range,
    other,
);

/// Per-kind request counters plus a few outcome counters.
pub struct RequestCounters {
    counts: Vec<AtomicU64>,
    /// How long each kind of request took to serve (from the adapter's call to its return,
    /// which follows the reply), sharded per thread like the core's counters.
    latency: Vec<Histogram>,
    /// Negative LOOKUP replies (ENOENT answered, cached by the kernel when the TTL allows).
    pub negative_lookups: AtomicU64,
    /// Notifications sent to the kernel.
    pub notify_inval_entry: AtomicU64,
    pub notify_inval_inode: AtomicU64,
    /// Epoch increments (every kernel dentry dropped at once, after lost changes).
    pub notify_inc_epoch: AtomicU64,
    pub notify_errors: AtomicU64,
    /// Changes received from the backend's change feed.
    pub changes: AtomicU64,
    /// Of those, the ones handled in full: applied to the core and the kernel told (the
    /// notifier counts a change in `changes` before handling it, here after). Equal counts
    /// say the notifier has nothing in hand: a test's barrier on the feed.
    pub changes_done: AtomicU64,
    /// Of those, reports of passthrough writes made through the mount (`fs/own_writes.rs`):
    /// applied to the core only, no kernel invalidation.
    pub own_writes: AtomicU64,
    /// Opens answered with FUSE passthrough.
    pub passthrough_opens: AtomicU64,
    /// Read-only opens made without reading the caller's supplementary groups
    /// (`CacheFs::open_groupless`).
    pub groupless_opens: AtomicU64,
    /// POSIX ACL fetches answered from the daemon's memo of known absences (no syscall).
    pub acl_memo_hits: AtomicU64,
    /// Listings fetched ahead of a walker by the prefetch threads (`prefetch.rs`),
    /// prefetch jobs dropped because the queue was full, and jobs queued or running.
    pub prefetch_listings: AtomicU64,
    pub prefetch_dropped: AtomicU64,
    pub prefetch_pending: AtomicU64,
    /// Directories listed on a LOOKUP (`lookahead.rs`).
    pub lookahead_listings: AtomicU64,
    /// Of those, directories then read through the mount (`Prefetcher::read_through_kernel`).
    pub lookahead_kernel_reads: AtomicU64,
    /// Subdirectories listed ahead of lookups (`Prefetcher::ahead_of_lookups`).
    pub lookahead_ahead_listings: AtomicU64,
    /// Directories read through the mount ahead of lookups.
    pub lookahead_ahead_reads: AtomicU64,
}

impl Default for RequestCounters {
    fn default() -> Self {
        RequestCounters {
            counts: Op::ALL.iter().map(|_| AtomicU64::new(0)).collect(),
            latency: Op::ALL.iter().map(|_| Histogram::default()).collect(),
            negative_lookups: AtomicU64::new(0),
            notify_inval_entry: AtomicU64::new(0),
            notify_inval_inode: AtomicU64::new(0),
            notify_inc_epoch: AtomicU64::new(0),
            notify_errors: AtomicU64::new(0),
            changes: AtomicU64::new(0),
            changes_done: AtomicU64::new(0),
            own_writes: AtomicU64::new(0),
            passthrough_opens: AtomicU64::new(0),
            groupless_opens: AtomicU64::new(0),
            acl_memo_hits: AtomicU64::new(0),
            prefetch_listings: AtomicU64::new(0),
            prefetch_dropped: AtomicU64::new(0),
            prefetch_pending: AtomicU64::new(0),
            lookahead_listings: AtomicU64::new(0),
            lookahead_kernel_reads: AtomicU64::new(0),
            lookahead_ahead_listings: AtomicU64::new(0),
            lookahead_ahead_reads: AtomicU64::new(0),
        }
    }
}

/// A request being served: its latency is recorded when this is dropped.
pub struct Timed<'a> {
    hist: Option<&'a Histogram>,
    start: std::time::Instant,
}

impl Drop for Timed<'_> {
    #[inline]
    fn drop(&mut self) {
        if let Some(h) = self.hist {
            h.since(self.start);
        }
    }
}

impl RequestCounters {
    /// Count a request of kind `op` and time it until the guard returned is dropped.
    #[inline]
    pub fn start(&self, op: Op) -> Timed<'_> {
        self.inc(op);
        Timed {
            hist: self.latency.get(op as usize),
            start: std::time::Instant::now(),
        }
    }

    /// The latency histogram of requests of kind `op`.
    pub fn latency(&self, op: Op) -> HistogramSnapshot {
        self.latency
            .get(op as usize)
            .map(Histogram::snapshot)
            .unwrap_or_default()
    }

    #[inline]
    pub fn inc(&self, op: Op) {
        if let Some(c) = self.counts.get(op as usize) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn get(&self, op: Op) -> u64 {
        self.counts
            .get(op as usize)
            .map(|c| c.load(Ordering::Relaxed))
            .unwrap_or(0)
    }

    pub fn total(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// JSON object `{kind: count}` of the kinds seen at least once.
    pub fn to_json(&self) -> Value {
        let mut m = serde_json::Map::new();
        for op in Op::ALL {
            let n = self.get(*op);
            if n > 0 {
                m.insert(op.name().to_string(), json!(n));
            }
        }
        Value::Object(m)
    }
}

/// Everything `dircache stats` shows, gathered from a running daemon.
pub struct StatsSource {
    pub cache: Arc<Cache>,
    pub requests: Arc<RequestCounters>,
    /// The local directory the backend serves, if it is one (searches are delegated below it).
    pub src: Option<PathBuf>,
    pub mnt: PathBuf,
    pub kernel_inodes: Arc<dyn Fn() -> usize + Send + Sync>,
    pub started: std::time::Instant,
    /// Where the metrics endpoint listens (`-o metrics=`), if it does.
    pub metrics: Option<std::net::SocketAddr>,
}

impl StatsSource {
    pub fn report(&self) -> Value {
        let core = serde_json::to_value(self.cache.stats()).unwrap_or(Value::Null);
        let r = &self.requests;
        json!({
            "src": self.src.as_ref().map(|s| s.display().to_string()),
            "mnt": self.mnt.display().to_string(),
            "pid": std::process::id(),
            "uptime_s": self.started.elapsed().as_secs_f64(),
            "core": core,
            "kernel_requests": {
                "total": r.total(),
                "by_kind": r.to_json(),
                "negative_lookups": r.negative_lookups.load(Ordering::Relaxed),
                "passthrough_opens": r.passthrough_opens.load(Ordering::Relaxed),
                "groupless_opens": r.groupless_opens.load(Ordering::Relaxed),
                "acl_memo_hits": r.acl_memo_hits.load(Ordering::Relaxed),
            },
            "prefetch": {
                "listings": r.prefetch_listings.load(Ordering::Relaxed),
                "dropped": r.prefetch_dropped.load(Ordering::Relaxed),
                "pending": r.prefetch_pending.load(Ordering::Acquire),
                "lookahead": r.lookahead_listings.load(Ordering::Relaxed),
                "lookahead_kernel_reads": r.lookahead_kernel_reads.load(Ordering::Relaxed),
                "lookahead_ahead": r.lookahead_ahead_listings.load(Ordering::Relaxed),
                "lookahead_ahead_reads": r.lookahead_ahead_reads.load(Ordering::Relaxed),
            },
            "kernel_inodes": (self.kernel_inodes)(),
            "notifier": {
                "changes": r.changes.load(Ordering::Acquire),
                "changes_done": r.changes_done.load(Ordering::Acquire),
                "own_writes": r.own_writes.load(Ordering::Relaxed),
                "inval_entry": r.notify_inval_entry.load(Ordering::Relaxed),
                "inval_inode": r.notify_inval_inode.load(Ordering::Relaxed),
                "inc_epoch": r.notify_inc_epoch.load(Ordering::Relaxed),
                "errors": r.notify_errors.load(Ordering::Relaxed),
            },
            "memory": { "rss_bytes": rss_bytes() },
            "metrics": self.metrics.map(|a| a.to_string()),
            "backend": self
                .cache
                .backend()
                .counters()
                .into_iter()
                .map(|(k, v)| (k.to_string(), json!(v)))
                .collect::<serde_json::Map<String, Value>>(),
        })
    }
}

/// Resident set size of this process, from /proc/self/statm.
pub fn rss_bytes() -> u64 {
    let pages: u64 = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|p| p.parse().ok()))
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * u64::try_from(page).unwrap_or(4096)
}

/// The control protocol's errors as this crate's.
fn proto_err(e: dircache_search::proto::ProtoError) -> Error {
    use dircache_search::proto::ProtoError;
    match e {
        ProtoError::Io(e) => Error::Io(e),
        ProtoError::TimedOut => Error::Io(std::io::Error::from(std::io::ErrorKind::TimedOut)),
        e => Error::Protocol(e.to_string()),
    }
}

/// Write one frame (the framing of `dircache_search::proto`: one implementation for both).
pub fn write_frame(w: &mut impl Write, v: &Value) -> Result<(), Error> {
    dircache_search::proto::write_frame(w, v).map_err(proto_err)?;
    w.flush()?;
    Ok(())
}

/// Read one frame of at most `max` bytes, incrementally; `None` at a clean end of stream.
pub fn read_frame_max(r: &mut impl Read, max: usize) -> Result<Option<Value>, Error> {
    dircache_search::proto::read_frame_limited(r, max).map_err(proto_err)
}

/// Read one frame (at most [`MAX_FRAME`] bytes); `None` at a clean end of stream.
pub fn read_frame(r: &mut impl Read) -> Result<Option<Value>, Error> {
    read_frame_max(r, MAX_FRAME)
}

/// The error a caller who cannot reach the mount through the kernel gets for every request
/// but `ping` (docs/security.md P9).
pub const NOT_REACHABLE: &str =
    "refused: this user cannot reach the mount through the kernel (see docs/security.md P9)";

/// Answer one request.
pub fn handle_request(src: &StatsSource, req: &Value) -> Value {
    match req.get("op").and_then(Value::as_str) {
        Some("stats") => json!({"ok": true, "stats": src.report()}),
        Some("ping") => json!({"ok": true}),
        Some(op) => json!({"ok": false, "error": format!("unknown op {op:?}")}),
        None => json!({"ok": false, "error": "request without \"op\""}),
    }
}

/// Limits of the control socket (finding 7 of issue 7: memory, threads and CPU per client
/// are bounded).
pub mod limits {
    use std::time::Duration;
    /// Largest request frame (a search request with its pattern fits easily).
    pub const MAX_REQUEST: usize = dircache_search::proto::MAX_REQUEST;
    /// Open connections at once, all users together; more are closed at once.
    pub const MAX_CONNECTIONS: usize = 64;
    /// Open connections at once per uid.
    pub const MAX_CONNECTIONS_PER_UID: usize = 8;
    /// Searches running at once (each uses up to 4 threads), all users together.
    pub const MAX_SEARCHES: usize = 4;
    /// Searches running at once per uid.
    pub const MAX_SEARCHES_PER_UID: usize = 2;
    /// A connection with no complete request for this long is closed (idle or too slow).
    pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
    /// A client that does not take an answer for this long is dropped (its search cancelled).
    pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
}

/// Counts of connections and searches, in total and per uid.
#[derive(Default)]
struct Slots {
    inner: parking_lot::Mutex<SlotCounts>,
}

#[derive(Default)]
struct SlotCounts {
    conns: usize,
    searches: usize,
    per_uid: std::collections::HashMap<u32, (usize, usize)>,
}

/// A held slot, released on drop.
struct Slot {
    slots: Arc<Slots>,
    uid: u32,
    search: bool,
}

impl Slots {
    fn take(self: &Arc<Self>, uid: u32, search: bool) -> Option<Slot> {
        let mut c = self.inner.lock();
        let (total, each, max_total, max_each) = if search {
            (
                c.searches,
                c.per_uid.get(&uid).map_or(0, |x| x.1),
                limits::MAX_SEARCHES,
                limits::MAX_SEARCHES_PER_UID,
            )
        } else {
            (
                c.conns,
                c.per_uid.get(&uid).map_or(0, |x| x.0),
                limits::MAX_CONNECTIONS,
                limits::MAX_CONNECTIONS_PER_UID,
            )
        };
        if total >= max_total || each >= max_each {
            return None;
        }
        let e = c.per_uid.entry(uid).or_default();
        if search {
            e.1 += 1;
            c.searches += 1;
        } else {
            e.0 += 1;
            c.conns += 1;
        }
        Some(Slot {
            slots: self.clone(),
            uid,
            search,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = self.slots.inner.lock();
        if let Some(e) = c.per_uid.get_mut(&self.uid) {
            if self.search {
                e.1 = e.1.saturating_sub(1);
            } else {
                e.0 = e.0.saturating_sub(1);
            }
            if *e == (0, 0) {
                c.per_uid.remove(&self.uid);
            }
        }
        if self.search {
            c.searches = c.searches.saturating_sub(1);
        } else {
            c.conns = c.conns.saturating_sub(1);
        }
    }
}

/// Read one request from a control connection: at most [`limits::MAX_REQUEST`] bytes, all of
/// it within [`limits::REQUEST_TIMEOUT`] of the first wait (a slow trickle does not keep the
/// connection).
fn read_request(s: &UnixStream) -> Result<Option<Value>, Error> {
    struct Deadline<'a>(&'a UnixStream, std::time::Instant);
    impl Read for Deadline<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let left = self.1.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(std::io::ErrorKind::TimedOut.into());
            }
            self.0.set_read_timeout(Some(left))?;
            let mut r = self.0;
            r.read(buf)
        }
    }
    let mut d = Deadline(s, std::time::Instant::now() + limits::REQUEST_TIMEOUT);
    read_frame_max(&mut d, limits::MAX_REQUEST)
}

/// What the control server serves: statistics, and searches beneath the daemon's SRC.
struct Served {
    stats: StatsSource,
    /// SRC, opened once (O_PATH): delegated searches are resolved beneath it as the caller.
    base: Option<Arc<std::os::fd::OwnedFd>>,
    slots: Arc<Slots>,
}

/// Answer the requests of one control connection, for the peer whose credentials the kernel
/// recorded at connect (`cred`). `{"op":"search",...}` streams its results
/// (dircache_search::proto), searched beneath SRC with the kernel deciding every access for
/// `cred`.
fn serve_conn(
    srv: &Served,
    s: UnixStream,
    cred: dircache_core::Cred,
    ids: Option<dircache_search::peer::PeerIds>,
) {
    let _ = s.set_write_timeout(Some(limits::WRITE_TIMEOUT));
    let mut w = &s;
    loop {
        let req = match read_request(&s) {
            Ok(Some(r)) => r,
            Ok(None) | Err(Error::Io(_)) => return,
            Err(e) => {
                // A bad frame: say why, then close (the stream cannot be resynchronized).
                let _ = write_frame(&mut w, &json!({"ok": false, "error": e.to_string()}));
                return;
            }
        };
        let op = req.get("op").and_then(Value::as_str);
        if op != Some("ping")
            && !dircache_search::proto::caller_reaches_mount(&srv.stats.mnt, &cred, ids.as_ref())
        {
            // Not reachable through the kernel for this caller (P9): nothing of the mount is
            // shown (not its paths, counters, searches or cache); only `ping` is answered. A
            // search client then walks the path it has, as the caller.
            let resp = json!({"ok": false, "error": NOT_REACHABLE});
            if write_frame(&mut w, &resp).is_err() {
                return;
            }
            continue;
        }
        if op == Some("search") {
            // JSON results frames unless the client asked for binary ones (proto docs).
            let enc = dircache_search::proto::Encoding::of_request(&req);
            let resp = match serde_json::from_value::<dircache_search::SearchRequest>(req) {
                Err(e) => json!({"ok": false, "error": e.to_string()}),
                Ok(sr) => match (&srv.base, srv.slots.take(cred.uid, true)) {
                    (_, None) => json!({"ok": false, "error": "busy: too many searches"}),
                    // No SRC: a backend that searches itself (remote) answers in one call.
                    (None, Some(_slot)) => {
                        let _ = s.set_read_timeout(None);
                        // A subtree the cache holds whole (kept fresh by the backend's
                        // callbacks) is searched here, without a call (search/src/held.rs).
                        match dircache_search::held::answer_held(
                            &s,
                            &sr,
                            &srv.stats.cache,
                            &cred,
                            enc,
                        ) {
                            Some(Ok(())) => continue,
                            Some(Err(_)) => return,
                            None => {}
                        }
                        match dircache_search::delegated::answer_backend(
                            &s,
                            &sr,
                            &**srv.stats.cache.backend(),
                            &cred,
                            dircache_search::proto::mount_access(&srv.stats.mnt),
                            enc,
                        ) {
                            None => {
                                json!({"ok": false, "error": "searches are not served here"})
                            }
                            Some(Ok(())) => continue,
                            Some(Err(_)) => return,
                        }
                    }
                    (Some(base), Some(_slot)) => {
                        match dircache_search::proto::source_for(base.clone(), &cred) {
                            Err(e) => json!({"ok": false, "error": e.to_string()}),
                            Ok(source) => {
                                // ro/noexec of the mount, as access(2) through it applies them.
                                let source = source
                                    .on_mount(dircache_search::proto::mount_access(&srv.stats.mnt));
                                let _ = s.set_read_timeout(None);
                                let r = dircache_search::proto::answer_encoded(
                                    &s,
                                    &sr,
                                    Arc::new(source),
                                    &dircache_search::proto::daemon_search_options(),
                                    enc,
                                );
                                if r.is_err() {
                                    return;
                                }
                                continue;
                            }
                        }
                    }
                },
            };
            if write_frame(&mut w, &resp).is_err() {
                return;
            }
            continue;
        }
        let resp = if req.get("op").and_then(Value::as_str) == Some("cached") {
            // What the cache holds, shown only where the caller could list (cacheview.rs).
            crate::cacheview::answer(&srv.stats.cache, srv.base.as_ref(), &cred, &req)
        } else {
            handle_request(&srv.stats, &req)
        };
        if write_frame(&mut w, &resp).is_err() {
            return;
        }
    }
}

/// Where a daemon run by this user puts its control socket by default: `/run/dircache/PID.sock`
/// for root, `$XDG_RUNTIME_DIR/dircache/PID.sock` (or `/run/user/UID/dircache/`) otherwise.
pub fn default_socket_path() -> PathBuf {
    let pid = std::process::id();
    let uid = rustix::process::geteuid().as_raw();
    if uid == 0 {
        return PathBuf::from(format!("/run/dircache/{pid}.sock"));
    }
    let base = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .unwrap_or_else(|| PathBuf::from(format!("/run/user/{uid}")));
    base.join("dircache").join(format!("{pid}.sock"))
}

/// Make `dir` (the socket's directory) safe to hold the socket: created if missing (0755 for
/// root, 0700 otherwise). It must belong to this user and be writable by nobody else, or be a
/// sticky directory of root or this user (like /tmp: others cannot remove or rename what is
/// ours there); the default directory ([`default_socket_path`]) is tightened if an older
/// version left it world-writable. Every ancestor must belong to root or this user and be
/// writable by nobody else unless sticky.
pub fn secure_socket_dir(dir: &Path) -> Result<(), Error> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let me = rustix::process::geteuid().as_raw();
    let refuse = |why: String| {
        Err(Error::Io(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("socket directory {}: {why}", dir.display()),
        )))
    };
    if !dir.is_absolute() {
        return refuse("not an absolute path".into());
    }
    for anc in dir.ancestors().skip(1) {
        let Ok(m) = std::fs::symlink_metadata(anc) else {
            continue; // created below
        };
        let sticky = m.mode() & 0o1000 != 0;
        if (m.uid() != 0 && m.uid() != me) || (m.mode() & 0o022 != 0 && !sticky) {
            return refuse(format!(
                "{} may be changed by other users (owner {}, mode {:o})",
                anc.display(),
                m.uid(),
                m.mode() & 0o7777
            ));
        }
    }
    let mode = if me == 0 { 0o755 } else { 0o700 };
    if std::fs::symlink_metadata(dir).is_err() {
        if let Some(parent) = dir.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(parent)?;
        }
        match std::fs::DirBuilder::new().mode(mode).create(dir) {
            Ok(()) => std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))?,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e.into()),
        }
    }
    let m = std::fs::symlink_metadata(dir)?;
    if !m.is_dir() {
        return refuse("not a directory".into());
    }
    let sticky = m.mode() & 0o1000 != 0;
    if sticky && (m.uid() == 0 || m.uid() == me) {
        return Ok(());
    }
    if m.uid() != me {
        return refuse(format!(
            "owned by uid {}, not by this daemon (uid {me})",
            m.uid()
        ));
    }
    if m.mode() & 0o022 != 0 {
        if default_socket_path().parent() != Some(dir) {
            return refuse(format!(
                "writable by other users (mode {:o})",
                m.mode() & 0o7777
            ));
        }
        tracing::warn!(
            "socket directory {} was writable by others (mode {:o}); tightening it",
            dir.display(),
            m.mode() & 0o7777
        );
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(m.mode() & 0o7755))?;
    }
    Ok(())
}

/// The control socket server: a thread answering requests until the process exits.
pub struct ControlServer {
    pub path: PathBuf,
}

impl ControlServer {
    /// Bind `path` (replacing a stale socket) in a safe directory ([`secure_socket_dir`]) and
    /// serve in a background thread. Everyone may connect (each request is answered for the
    /// caller's own credentials); nobody else can replace the socket.
    pub fn start(path: &Path, src: StatsSource) -> Result<ControlServer, Error> {
        use std::os::unix::fs::{FileTypeExt, PermissionsExt};
        let dir = path.parent().ok_or_else(|| {
            Error::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "socket path without a directory",
            ))
        })?;
        secure_socket_dir(dir)?;
        if let Ok(m) = std::fs::symlink_metadata(path) {
            if m.file_type().is_socket() || m.file_type().is_symlink() {
                std::fs::remove_file(path)?;
            } else {
                return Err(Error::Io(std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    format!("{} exists and is not a socket", path.display()),
                )));
            }
        }
        let listener = UnixListener::bind(path)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
        let base = src.src.as_ref().and_then(|dir| {
            rustix::fs::open(
                dir,
                rustix::fs::OFlags::PATH
                    | rustix::fs::OFlags::DIRECTORY
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .map(Arc::new)
            .map_err(|e| tracing::warn!("{}: {e}; delegated searches disabled", dir.display()))
            .ok()
        });
        let srv = Arc::new(Served {
            stats: src,
            base,
            slots: Arc::new(Slots::default()),
        });
        std::thread::Builder::new()
            .name("dircache-ctl".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    match conn {
                        Ok(s) => accept(&srv, s),
                        Err(e) => {
                            tracing::warn!("control socket: {e}");
                            std::thread::sleep(Duration::from_millis(50));
                        }
                    }
                }
            })?;
        Ok(ControlServer {
            path: path.to_path_buf(),
        })
    }
}

/// Take a new connection: the peer's credentials now (the kernel's record of the connect),
/// then a connection slot (or close it), then a thread of its own. Threads are bounded by the
/// slots: at most [`limits::MAX_CONNECTIONS`].
fn accept(srv: &Arc<Served>, s: UnixStream) {
    let cred = match dircache_search::proto::peer_cred(&s) {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!("control connection without credentials: {e}");
            return;
        }
    };
    // Real and saved ids too, for the owner check of a mount without allow_other (peer.rs).
    let ids = dircache_search::peer::peer_ids(&s, cred.uid, cred.gid);
    let Some(slot) = srv.slots.take(cred.uid, false) else {
        tracing::debug!("control connection of uid {} refused: too many", cred.uid);
        return;
    };
    let srv2 = srv.clone();
    let r = std::thread::Builder::new()
        .name("dircache-ctl-conn".into())
        .spawn(move || {
            let _slot = slot;
            serve_conn(&srv2, s, cred, ids);
        });
    if let Err(e) = r {
        tracing::warn!("control connection thread: {e}");
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Client side: connect to the daemon of the dircache mount whose root is `mnt`, checked as
/// `dircache search` checks it (a dircache mount in /proc/self/mountinfo, a socket owned by
/// root or the mount's owner), send `req` and return the response, waiting at most
/// `DIRCACHE_CONTROL_TIMEOUT` seconds (default 30).
pub fn query_mount(mnt: &Path, req: &Value) -> Result<Value, Error> {
    use dircache_search::proto::{
        connect_verified, daemon_of_mount_root, ClientConfig, ProtoError,
    };
    let cfg = ClientConfig::default();
    let d = daemon_of_mount_root(mnt, &cfg).ok_or_else(|| {
        Error::NotDircache(
            mnt.to_path_buf(),
            std::io::Error::other("no dircache mount with a control socket there"),
        )
    })?;
    let silent = || {
        Error::Protocol(format!(
            "the daemon at {} did not answer within {:?}",
            d.socket.display(),
            cfg.timeout
        ))
    };
    let mut s = match connect_verified(&d, &cfg) {
        Ok(s) => s,
        Err(ProtoError::TimedOut) => return Err(silent()),
        Err(e) => return Err(Error::Protocol(format!("{}: {e}", d.socket.display()))),
    };
    let timed_out = |e: &Error| matches!(e, Error::Io(io) if matches!(io.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut));
    if let Err(e) = write_frame(&mut s, req) {
        return Err(if timed_out(&e) { silent() } else { e });
    }
    match read_frame_max(&mut s, dircache_search::proto::MAX_RESPONSE) {
        Ok(Some(v)) => Ok(v),
        Ok(None) => Err(Error::Protocol("daemon closed the connection".into())),
        Err(e) if timed_out(&e) => Err(silent()),
        Err(e) => Err(e),
    }
}

/// Client side, no checks: send `req` to the socket at `socket` (for tests and tools that
/// made the socket themselves).
pub fn query(socket: &Path, req: &Value) -> Result<Value, Error> {
    let mut s = UnixStream::connect(socket)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.set_write_timeout(Some(Duration::from_secs(10)))?;
    write_frame(&mut s, req)?;
    read_frame(&mut s)?.ok_or_else(|| Error::Protocol("daemon closed the connection".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let mut buf = Vec::new();
        write_frame(&mut buf, &json!({"op": "stats"})).unwrap();
        write_frame(&mut buf, &json!({"op": "ping", "x": [1, 2]})).unwrap();
        assert_eq!(&buf[..4], &(14u32).to_be_bytes());
        let mut r = &buf[..];
        assert_eq!(read_frame(&mut r).unwrap(), Some(json!({"op": "stats"})));
        assert_eq!(
            read_frame(&mut r).unwrap(),
            Some(json!({"op": "ping", "x": [1, 2]}))
        );
        assert_eq!(read_frame(&mut r).unwrap(), None);
    }

    #[test]
    fn rejects_huge_frames() {
        let buf = (MAX_FRAME as u32 + 1).to_be_bytes();
        assert!(read_frame(&mut &buf[..]).is_err());
    }

    #[test]
    fn counters_by_kind() {
        let c = RequestCounters::default();
        c.inc(Op::lookup);
        c.inc(Op::lookup);
        c.inc(Op::copy_file_range);
        assert_eq!(c.get(Op::lookup), 2);
        assert_eq!(c.total(), 3);
        assert_eq!(c.to_json(), json!({"lookup": 2, "copy_file_range": 1}));
    }

    #[test]
    fn rss_is_positive() {
        assert!(rss_bytes() > 0);
    }
}
