//! Live statistics of a mount: FUSE requests by kind, and the control socket.
//!
//! ## Control socket protocol
//! A unix stream socket. Each message is a frame: a 4-byte big-endian length, then that many
//! bytes of JSON. The client sends one request object, the daemon answers with one response
//! object, and the client may send further requests on the same connection.
//!
//! Requests are objects tagged by `"op"`: `{"op":"stats"}`, `{"op":"ping"}`. Responses are
//! `{"ok":true, ...}` or `{"ok":false,"error":"..."}`. New operations (for example a
//! `{"op":"search",...}` request) are added as new `op` values; unknown ones get an error
//! response, so old daemons and new clients interoperate.
//!
//! The daemon publishes the socket path as the extended attribute [`SOCKET_XATTR`] of the
//! mount root, so `dircache stats MNT` needs nothing but the mount point.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dircache_core::Cache;
use serde_json::{json, Value};

use crate::Error;

/// Extended attribute of the mount root holding the control socket path.
pub const SOCKET_XATTR: &str = "user.dircache.socket";
/// Largest frame accepted (16 MiB).
pub const MAX_FRAME: usize = 16 << 20;

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
    /// Negative LOOKUP replies (ENOENT answered, cached by the kernel when the TTL allows).
    pub negative_lookups: AtomicU64,
    /// Notifications sent to the kernel.
    pub notify_inval_entry: AtomicU64,
    pub notify_inval_inode: AtomicU64,
    pub notify_errors: AtomicU64,
    /// Changes received from the backend's change feed.
    pub changes: AtomicU64,
    /// Opens answered with FUSE passthrough.
    pub passthrough_opens: AtomicU64,
    /// POSIX ACL fetches answered from the daemon's memo of known absences (no syscall).
    pub acl_memo_hits: AtomicU64,
}

impl Default for RequestCounters {
    fn default() -> Self {
        RequestCounters {
            counts: Op::ALL.iter().map(|_| AtomicU64::new(0)).collect(),
            negative_lookups: AtomicU64::new(0),
            notify_inval_entry: AtomicU64::new(0),
            notify_inval_inode: AtomicU64::new(0),
            notify_errors: AtomicU64::new(0),
            changes: AtomicU64::new(0),
            passthrough_opens: AtomicU64::new(0),
            acl_memo_hits: AtomicU64::new(0),
        }
    }
}

impl RequestCounters {
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
    pub src: PathBuf,
    pub mnt: PathBuf,
    pub kernel_inodes: Arc<dyn Fn() -> usize + Send + Sync>,
    pub started: std::time::Instant,
}

impl StatsSource {
    pub fn report(&self) -> Value {
        let core = serde_json::to_value(self.cache.stats()).unwrap_or(Value::Null);
        let r = &self.requests;
        json!({
            "src": self.src.display().to_string(),
            "mnt": self.mnt.display().to_string(),
            "pid": std::process::id(),
            "uptime_s": self.started.elapsed().as_secs_f64(),
            "core": core,
            "kernel_requests": {
                "total": r.total(),
                "by_kind": r.to_json(),
                "negative_lookups": r.negative_lookups.load(Ordering::Relaxed),
                "passthrough_opens": r.passthrough_opens.load(Ordering::Relaxed),
                "acl_memo_hits": r.acl_memo_hits.load(Ordering::Relaxed),
            },
            "kernel_inodes": (self.kernel_inodes)(),
            "notifier": {
                "changes": r.changes.load(Ordering::Relaxed),
                "inval_entry": r.notify_inval_entry.load(Ordering::Relaxed),
                "inval_inode": r.notify_inval_inode.load(Ordering::Relaxed),
                "errors": r.notify_errors.load(Ordering::Relaxed),
            },
            "memory": { "rss_bytes": rss_bytes() },
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

/// Write one frame.
pub fn write_frame(w: &mut impl Write, v: &Value) -> Result<(), Error> {
    let body = serde_json::to_vec(v).map_err(|e| Error::Protocol(e.to_string()))?;
    let len = u32::try_from(body.len()).map_err(|_| Error::Protocol("frame too large".into()))?;
    w.write_all(&len.to_be_bytes())?;
    w.write_all(&body)?;
    w.flush()?;
    Ok(())
}

/// Read one frame; `None` at a clean end of stream.
pub fn read_frame(r: &mut impl Read) -> Result<Option<Value>, Error> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(Error::Protocol(format!("frame of {len} bytes")));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    serde_json::from_slice(&body)
        .map(Some)
        .map_err(|e| Error::Protocol(e.to_string()))
}

/// Answer one request.
pub fn handle_request(src: &StatsSource, req: &Value) -> Value {
    match req.get("op").and_then(Value::as_str) {
        Some("stats") => json!({"ok": true, "stats": src.report()}),
        Some("ping") => json!({"ok": true}),
        Some(op) => json!({"ok": false, "error": format!("unknown op {op:?}")}),
        None => json!({"ok": false, "error": "request without \"op\""}),
    }
}

/// Answer the requests of one control connection. `{"op":"search",...}` streams its results
/// (dircache_search::proto), searched in the cache with the peer's credentials.
fn serve_conn(src: &StatsSource, mut s: UnixStream) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    while let Ok(Some(req)) = read_frame(&mut s) {
        if req.get("op").and_then(Value::as_str) == Some("search") {
            let sent = match serde_json::from_value::<dircache_search::SearchRequest>(req) {
                Ok(sr) => match dircache_search::proto::peer_cred(&s) {
                    Ok(cred) => {
                        let source = Arc::new(dircache_search::CacheSource::new(
                            src.cache.clone(),
                            src.cache.credentials(cred),
                        ));
                        dircache_search::proto::answer(&mut s, &sr, source).is_ok()
                    }
                    Err(e) => {
                        write_frame(&mut s, &json!({"ok": false, "error": e.to_string()})).is_ok()
                    }
                },
                Err(e) => {
                    write_frame(&mut s, &json!({"ok": false, "error": e.to_string()})).is_ok()
                }
            };
            if !sent {
                break;
            }
            continue;
        }
        let resp = handle_request(src, &req);
        if write_frame(&mut s, &resp).is_err() {
            break;
        }
    }
}

/// The control socket server: a thread answering requests until the process exits.
pub struct ControlServer {
    pub path: PathBuf,
}

impl ControlServer {
    /// Bind `path` (replacing a stale socket) and serve in a background thread.
    pub fn start(path: &Path, src: StatsSource) -> Result<ControlServer, Error> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)?;
        let src = Arc::new(src);
        std::thread::Builder::new()
            .name("dircache-ctl".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    match conn {
                        Ok(s) => {
                            // One thread per connection: a long search must not hold up stats.
                            let src = src.clone();
                            let _ = std::thread::Builder::new()
                                .name("dircache-ctl-conn".into())
                                .spawn(move || serve_conn(&src, s));
                        }
                        Err(e) => tracing::warn!("control socket: {e}"),
                    }
                }
            })?;
        Ok(ControlServer {
            path: path.to_path_buf(),
        })
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Client side: send `req` to the daemon behind `socket` and return its response.
pub fn query(socket: &Path, req: &Value) -> Result<Value, Error> {
    let mut s = UnixStream::connect(socket)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write_frame(&mut s, req)?;
    read_frame(&mut s)?.ok_or_else(|| Error::Protocol("daemon closed the connection".into()))
}

/// The control socket of the dircache mount at `mnt` (from the root's extended attribute).
pub fn socket_of_mount(mnt: &Path) -> Result<PathBuf, Error> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(mnt.as_os_str().as_bytes())
        .map_err(|_| Error::Protocol("mount path contains NUL".into()))?;
    let name = std::ffi::CString::new(SOCKET_XATTR).map_err(|_| Error::Protocol("xattr".into()))?;
    let mut buf = vec![0u8; 4096];
    // SAFETY: both strings are NUL-terminated; buf is valid for buf.len() bytes.
    let n = unsafe {
        libc::lgetxattr(
            c.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(Error::NotDircache(
            mnt.to_path_buf(),
            std::io::Error::last_os_error(),
        ));
    }
    buf.truncate(n as usize);
    Ok(PathBuf::from(std::ffi::OsStr::from_bytes(&buf)))
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
