//! The search wire protocol and delegation to a mount's daemon.
//!
//! **Framing** (the FUSE daemon's control-socket protocol): every message is a frame
//! ([`dircache_frame`], the one framing code, shared with the remote protocol): a 4-byte
//! big-endian length, then that many bytes of JSON. A request is at most [`MAX_REQUEST`]
//! bytes, a response frame at most [`MAX_RESPONSE`]; frames are read incrementally (memory
//! grows with the bytes actually received, never with the declared length). The client sends
//! one request object tagged by `"op"`: `{"op":"search","paths":..,"pattern":..,"flags":N}`.
//! The server answers with any number of `{"ok":true,"results":[..]}` frames (an empty one at
//! least every [`HEARTBEAT`] while the search runs), then exactly one `{"ok":true,"end":true}`,
//! or `{"ok":false,"error":".."}` (a daemon that does not know the `search` op, or is busy,
//! answers that way, and the client then searches locally). The client may close the
//! connection at any time to cancel: the server watches for the hangup while it searches.
//!
//! **Binary results** (`"results":"bin"` in the request): a client that asks for them gets
//! its results frames in a compact binary form instead of JSON (no escaping, no parsing: a
//! warm search of 27k results spent more time in JSON than in its walk). Such a payload
//! starts with the byte [`BIN_RESULTS`] (never `{`) and holds records one after another:
//! root (`u32` little-endian), a presence byte (1: attributes, 2: error), the path length
//! (`u32` LE) and its bytes, then the attributes ([`ATTR_BYTES`] bytes, fixed layout:
//! ino, dev, mode, nlink, uid, gid, rdev, size, blocks, blksize, atime, mtime, ctime as
//! seconds `i64` and nanoseconds `u32`, birth; all LE) if present, then the error (source
//! `u8`, errno `i32` LE) if present. End and Error frames stay JSON. A daemon that does not
//! know the field ignores it and answers JSON; a client tells the two apart by the first byte
//! of each frame ([`decode_response`]), so either side may be older.
//!
//! **Paths** in a delegated request are absolute *within the served file system*: `/` is the
//! mount root (the daemon's SRC). The client sends the request without INCLUDEROOT and puts the
//! roots back itself, so result paths are always relative to their root on the wire; a client
//! refuses any result path that is absolute or has an empty, `.` or `..` component.
//!
//! **Finding the daemon** ([`find_daemon`]): the mount the search root lies in, from
//! /proc/self/mountinfo, must be a dircache FUSE mount (type [`FSTYPE`]); its root's extended
//! attribute [`SOCKET_XATTR`] names the daemon's unix socket. A client trusts the socket only
//! if the process at the other end (SO_PEERCRED, at connect) is root or the mount's owner
//! (`user_id=` of the mount), and it gives up after [`ClientConfig::timeout`]
//! (`DIRCACHE_CONTROL_TIMEOUT` seconds, default 30) without an answer.
//!
//! **Serving** ([`answer`]): the daemon takes the caller's ids once, at connect, from
//! `SO_PEERCRED` and `SO_PEERGROUPS` ([`peer_cred`]; never from /proc, where pids are reused)
//! and runs the search with a [`DirectSource`] switched to those ids beneath its SRC, so the
//! kernel decides every access (see [`dircache_local::creds`]).

use std::io::{BufReader, BufWriter, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dircache_core::Cred;
use dircache_frame::{self as frame, FrameError};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::{
    join_path, Batch, DirectSource, ErrorSource, Flags, ResultError, SearchError, SearchOptions,
    SearchRequest, SearchResult, SearchStream, Source,
};

/// Extended attribute of a dircache mount root that names its daemon's socket.
pub const SOCKET_XATTR: &str = "user.dircache.socket";
/// Extended attribute of a dircache mount root: the served tree's path in the FUSE file
/// system (`/src` when SRC is served below the FUSE root, `dircache_fuse::rootmount`), which
/// mountinfo's root field starts with; absent: `/`.
pub const FSROOT_XATTR: &str = "user.dircache.fsroot";
/// File system type of a dircache mount in /proc/self/mountinfo.
pub const FSTYPE: &str = "fuse.dircache";
/// Largest request frame a daemon accepts.
pub const MAX_REQUEST: usize = 64 * 1024;
/// Largest response frame a client accepts.
pub const MAX_RESPONSE: usize = 4 << 20;
/// Largest frame of either kind.
pub const MAX_FRAME: usize = MAX_RESPONSE;
/// Results per frame when serving (JSON).
pub const RESULTS_PER_FRAME: usize = 256;
/// Results per binary frame when serving (a frame is sent once this many are waiting).
pub const RESULTS_PER_BIN_FRAME: usize = 4096;
/// Bytes a binary results payload grows to before another frame is started.
pub const BIN_FRAME_BYTES: usize = 256 * 1024;
/// Longest silence of a server while it searches (it sends an empty results frame).
pub const HEARTBEAT: Duration = Duration::from_secs(2);
/// How long a client waits for a daemon by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Errors of the protocol layer.
#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("bad frame: {0}")]
    Json(#[from] serde_json::Error),
    #[error("frame of {0} bytes is too large")]
    TooLarge(usize),
    #[error("connection closed mid-stream")]
    Truncated,
    #[error("server error: {0}")]
    Server(String),
    #[error("no answer in time")]
    TimedOut,
    #[error("untrusted daemon: {0}")]
    Untrusted(String),
    #[error("result path {0:?} is outside the search root")]
    BadPath(String),
    #[error("bad binary results frame: {0}")]
    Malformed(&'static str),
}

impl ProtoError {
    /// The errno a result reporting this error carries.
    pub fn errno(&self) -> i32 {
        match self {
            ProtoError::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
            ProtoError::TimedOut => libc::ETIMEDOUT,
            ProtoError::Untrusted(_)
            | ProtoError::BadPath(_)
            | ProtoError::Json(_)
            | ProtoError::Malformed(_) => libc::EPROTO,
            ProtoError::TooLarge(_) => libc::EMSGSIZE,
            _ => libc::EIO,
        }
    }
}

fn io_err(e: std::io::Error) -> ProtoError {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => ProtoError::TimedOut,
        std::io::ErrorKind::UnexpectedEof => ProtoError::Truncated,
        _ => ProtoError::Io(e),
    }
}

/// A request to a daemon or server (an envelope other operations can join).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Search(SearchRequest),
}

/// A response frame: `{"ok":true,"results":[..]}`, `{"ok":true,"end":true}` or
/// `{"ok":false,"error":".."}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(from = "WireResponse")]
pub enum Response {
    Results { results: Vec<SearchResult> },
    End,
    Error { message: String },
}

#[derive(Deserialize)]
struct WireResponse {
    ok: bool,
    #[serde(default)]
    results: Option<Vec<SearchResult>>,
    #[serde(default)]
    end: bool,
    #[serde(default)]
    error: Option<String>,
}

/// [`WireResponse`] borrowed: serializing a frame copies none of its results.
#[derive(Serialize)]
struct WireResponseRef<'a> {
    ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    results: Option<&'a [SearchResult]>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    end: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
}

impl Serialize for Response {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let w = match self {
            Response::Results { results } => WireResponseRef {
                ok: true,
                results: Some(results),
                end: false,
                error: None,
            },
            Response::End => WireResponseRef {
                ok: true,
                results: None,
                end: true,
                error: None,
            },
            Response::Error { message } => WireResponseRef {
                ok: false,
                results: None,
                end: false,
                error: Some(message),
            },
        };
        w.serialize(s)
    }
}

impl From<WireResponse> for Response {
    fn from(w: WireResponse) -> Response {
        match (w.ok, w.results, w.end, w.error) {
            (false, _, _, e) => Response::Error {
                message: e.unwrap_or_else(|| "unknown error".into()),
            },
            (true, Some(results), _, _) => Response::Results { results },
            (true, None, true, _) => Response::End,
            (true, None, false, _) => Response::Error {
                message: "response without results or end".into(),
            },
        }
    }
}

/// The first byte of a binary results payload (module docs); a JSON payload starts with `{`.
pub const BIN_RESULTS: u8 = 0xB1;
/// Bytes of one result's attributes in a binary results payload.
pub const ATTR_BYTES: usize = 100;
/// The request field asking for binary results, and its value.
pub const RESULTS_FIELD: &str = "results";
pub const RESULTS_BIN: &str = "bin";

/// How a daemon writes results frames: JSON (every client understands it) or binary (a
/// client that asked with `"results":"bin"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Encoding {
    #[default]
    Json,
    Binary,
}

impl Encoding {
    /// What the request object `req` (a parsed request frame) asks for.
    pub fn of_request(req: &serde_json::Value) -> Encoding {
        if req.get(RESULTS_FIELD).and_then(serde_json::Value::as_str) == Some(RESULTS_BIN) {
            Encoding::Binary
        } else {
            Encoding::Json
        }
    }
}

/// Append `r` to a binary results payload (module docs).
pub fn encode_result(out: &mut Vec<u8>, r: &SearchResult) {
    out.extend_from_slice(&r.root.to_le_bytes());
    let bits = u8::from(r.stat.is_some()) | (u8::from(r.error.is_some()) << 1);
    out.push(bits);
    // A path is at most a few KiB (a frame is at most MAX_RESPONSE): its length fits.
    out.extend_from_slice(&(r.path.len() as u32).to_le_bytes());
    out.extend_from_slice(&r.path);
    if let Some(a) = &r.stat {
        for v in [a.ino, a.dev] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for v in [a.mode, a.nlink, a.uid, a.gid] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for v in [a.rdev, a.size, a.blocks] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&a.blksize.to_le_bytes());
        for t in [a.atime, a.mtime, a.ctime] {
            out.extend_from_slice(&t.sec.to_le_bytes());
            out.extend_from_slice(&t.nsec.to_le_bytes());
        }
        out.extend_from_slice(&a.birth.to_le_bytes());
    }
    if let Some(e) = &r.error {
        out.push(e.source as u8);
        out.extend_from_slice(&e.errno.to_le_bytes());
    }
}

/// The bytes [`encode_result`] appends for `r`.
pub fn encoded_len(r: &SearchResult) -> usize {
    9 + r.path.len()
        + if r.stat.is_some() { ATTR_BYTES } else { 0 }
        + if r.error.is_some() { 5 } else { 0 }
}

/// A reader over a binary payload's bytes that fails (never panics) at its end.
struct Bytes<'a>(&'a [u8]);

impl<'a> Bytes<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ProtoError> {
        if self.0.len() < n {
            return Err(ProtoError::Malformed("a record runs past the frame"));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn arr<const N: usize>(&mut self) -> Result<[u8; N], ProtoError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, ProtoError> {
        Ok(self.arr::<1>()?[0])
    }
    fn u32(&mut self) -> Result<u32, ProtoError> {
        Ok(u32::from_le_bytes(self.arr()?))
    }
    fn u64(&mut self) -> Result<u64, ProtoError> {
        Ok(u64::from_le_bytes(self.arr()?))
    }
    fn time(&mut self) -> Result<dircache_core::Timespec, ProtoError> {
        let sec = i64::from_le_bytes(self.arr()?);
        let nsec = self.u32()?;
        Ok(dircache_core::Timespec { sec, nsec })
    }
}

/// The number of records of a binary results payload, checking that they fill it exactly
/// (so that decoding allocates for the results there are, no more).
fn count_records(body: &[u8]) -> Result<usize, ProtoError> {
    let mut b = Bytes(body);
    let mut n = 0;
    while !b.0.is_empty() {
        b.take(4)?;
        let bits = b.u8()?;
        let len = b.u32()? as usize;
        let more = usize::from(bits & 1 != 0) * ATTR_BYTES + usize::from(bits & 2 != 0) * 5;
        b.take(len)?;
        b.take(more)?;
        n += 1;
    }
    Ok(n)
}

/// Decode a binary results payload (after its first byte) into its results.
fn decode_binary(body: &[u8]) -> Result<Vec<SearchResult>, ProtoError> {
    let mut out = Vec::with_capacity(count_records(body)?);
    let mut b = Bytes(body);
    while !b.0.is_empty() {
        let root = b.u32()?;
        let bits = b.u8()?;
        if bits & !3 != 0 {
            return Err(ProtoError::Malformed("unknown presence bits"));
        }
        let n = b.u32()? as usize;
        let path = b.take(n)?.to_vec();
        let stat = if bits & 1 != 0 {
            let (ino, dev) = (b.u64()?, b.u64()?);
            let (mode, nlink, uid, gid) = (b.u32()?, b.u32()?, b.u32()?, b.u32()?);
            let (rdev, size, blocks) = (b.u64()?, b.u64()?, b.u64()?);
            let blksize = b.u32()?;
            let (atime, mtime, ctime) = (b.time()?, b.time()?, b.time()?);
            let birth = b.u32()?;
            Some(dircache_core::Attr {
                ino,
                dev,
                mode,
                nlink,
                uid,
                gid,
                rdev,
                size,
                blocks,
                blksize,
                atime,
                mtime,
                ctime,
                birth,
            })
        } else {
            None
        };
        let error = if bits & 2 != 0 {
            let source = match b.u8()? {
                1 => ErrorSource::Open,
                2 => ErrorSource::Readdir,
                3 => ErrorSource::Stat,
                4 => ErrorSource::Delegate,
                _ => return Err(ProtoError::Malformed("unknown error source")),
            };
            let errno = i32::from_le_bytes(b.arr()?);
            Some(ResultError { source, errno })
        } else {
            None
        };
        out.push(SearchResult {
            root,
            path,
            stat,
            error,
        });
    }
    Ok(out)
}

/// Decode one response frame's payload, JSON or binary (module docs).
pub fn decode_response(body: &[u8]) -> Result<Response, ProtoError> {
    match body.split_first() {
        Some((&BIN_RESULTS, rest)) => Ok(Response::Results {
            results: decode_binary(rest)?,
        }),
        _ => Ok(serde_json::from_slice(body)?),
    }
}

/// Read one response frame (at most `max` bytes), JSON or binary; `Ok(None)` on a clean end
/// of stream.
pub fn read_response<R: Read>(r: &mut R, max: usize) -> Result<Option<Response>, ProtoError> {
    match read_frame_bytes(r, max)? {
        Some(b) => decode_response(&b).map(Some),
        None => Ok(None),
    }
}

pub fn write_frame<W: Write, T: Serialize>(w: &mut W, msg: &T) -> Result<(), ProtoError> {
    let body = serde_json::to_vec(msg)?;
    frame::write_frame(w, &body, MAX_FRAME).map_err(frame_err)
}

/// Read one frame body of at most `max` bytes; `Ok(None)` on a clean end of stream before
/// the frame. The body grows with the bytes received (never allocated at the declared length):
/// the framing is [`dircache_frame`]'s, shared with the remote protocol.
pub fn read_frame_bytes<R: Read>(r: &mut R, max: usize) -> Result<Option<Vec<u8>>, ProtoError> {
    frame::read_frame(r, max).map_err(frame_err)
}

fn frame_err(e: FrameError) -> ProtoError {
    match e {
        FrameError::Io(e) => io_err(e),
        FrameError::TooLarge { len, .. } => ProtoError::TooLarge(len),
        FrameError::Truncated => ProtoError::Truncated,
    }
}

/// Read one frame of at most `max` bytes and decode it.
pub fn read_frame_limited<R: Read, T: DeserializeOwned>(
    r: &mut R,
    max: usize,
) -> Result<Option<T>, ProtoError> {
    match read_frame_bytes(r, max)? {
        Some(b) => Ok(Some(serde_json::from_slice(&b)?)),
        None => Ok(None),
    }
}

/// Read one frame (at most [`MAX_FRAME`] bytes); `Ok(None)` on a clean end of stream.
pub fn read_frame<R: Read, T: DeserializeOwned>(r: &mut R) -> Result<Option<T>, ProtoError> {
    read_frame_limited(r, MAX_FRAME)
}

pub fn write_request<W: Write>(w: &mut W, req: &SearchRequest) -> Result<(), ProtoError> {
    write_frame(w, &Request::Search(req.clone()))?;
    w.flush().map_err(io_err)?;
    Ok(())
}

/// [`write_request`] asking for binary results (module docs): what this crate's clients send.
pub fn write_request_binary<W: Write>(w: &mut W, req: &SearchRequest) -> Result<(), ProtoError> {
    let mut v = serde_json::to_value(Request::Search(req.clone()))?;
    if let Some(o) = v.as_object_mut() {
        o.insert(RESULTS_FIELD.into(), RESULTS_BIN.into());
    }
    write_frame(w, &v)?;
    w.flush().map_err(io_err)?;
    Ok(())
}

/// Read one request (at most [`MAX_REQUEST`] bytes).
pub fn read_request<R: Read>(r: &mut R) -> Result<Option<SearchRequest>, ProtoError> {
    Ok(read_request_encoding(r)?.map(|(s, _)| s))
}

/// [`read_request`] with the results encoding the request asks for.
pub fn read_request_encoding<R: Read>(
    r: &mut R,
) -> Result<Option<(SearchRequest, Encoding)>, ProtoError> {
    let Some(v) = read_frame_limited::<_, serde_json::Value>(r, MAX_REQUEST)? else {
        return Ok(None);
    };
    let enc = Encoding::of_request(&v);
    let Request::Search(s) = serde_json::from_value(v)?;
    Ok(Some((s, enc)))
}

/// Iterate over the results of a response stream until `End` (an `Error` frame or a broken
/// stream is yielded as an `Err` and ends the iteration).
pub fn read_results<R: Read>(r: R) -> impl Iterator<Item = Result<SearchResult, ProtoError>> {
    let mut r = r;
    let mut buf: std::vec::IntoIter<SearchResult> = Vec::new().into_iter();
    let mut done = false;
    std::iter::from_fn(move || loop {
        if let Some(x) = buf.next() {
            return Some(Ok(x));
        }
        if done {
            return None;
        }
        match read_response(&mut r, MAX_RESPONSE) {
            Ok(Some(Response::Results { results })) => buf = results.into_iter(),
            Ok(Some(Response::End)) => {
                done = true;
            }
            Ok(Some(Response::Error { message })) => {
                done = true;
                return Some(Err(ProtoError::Server(message)));
            }
            Ok(None) => {
                done = true;
                return Some(Err(ProtoError::Truncated));
            }
            Err(e) => {
                done = true;
                return Some(Err(e));
            }
        }
    })
}

/// Whether a result path from a daemon stays below its root: empty (the root itself), or
/// relative with no empty, `.` or `..` component and no NUL.
pub fn path_stays_below(p: &[u8]) -> bool {
    p.is_empty()
        || (!p.starts_with(b"/")
            && !p.contains(&0)
            && p.split(|&b| b == b'/')
                .all(|c| !c.is_empty() && c != b"." && c != b".."))
}

fn check_result(r: &SearchResult, nroots: usize) -> Result<(), ProtoError> {
    if (r.root as usize) >= nroots || !path_stays_below(&r.path) {
        return Err(ProtoError::BadPath(
            String::from_utf8_lossy(&r.path).into_owned(),
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Server side.

/// The credentials of the process at the other end of a unix socket, as the kernel recorded
/// them when it connected: uid and gid from `SO_PEERCRED`, supplementary groups from
/// `SO_PEERGROUPS`.
pub fn peer_cred(s: &impl AsFd) -> Result<Cred, ProtoError> {
    let c = rustix::net::sockopt::socket_peercred(s).map_err(std::io::Error::from)?;
    let groups = dircache_local::creds::peer_groups(s.as_fd()).map_err(ProtoError::Io)?;
    Ok(Cred::new(c.uid.as_raw(), c.gid.as_raw(), groups))
}

/// Whether the peer of `s` has closed or shut down its side.
pub fn hung_up(s: &impl AsFd) -> bool {
    use rustix::event::{poll, PollFd, PollFlags};
    let mut p = [PollFd::new(s, PollFlags::RDHUP)];
    let zero = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    matches!(poll(&mut p, Some(&zero)), Ok(n) if n > 0)
        && p[0]
            .revents()
            .intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR | PollFlags::NVAL)
}

/// Write the answer to `request` on the connection `sock`: result frames (an empty one at
/// least every [`HEARTBEAT`]), then End, or Error for bad input. The search is cancelled as
/// soon as the client hangs up or a write fails (the caller sets the socket's write timeout).
pub fn answer<S: Source>(
    sock: &UnixStream,
    request: &SearchRequest,
    source: Arc<S>,
    opts: &SearchOptions,
) -> Result<(), ProtoError> {
    answer_encoded(sock, request, source, opts, Encoding::Json)
}

/// [`answer`] with results frames in `enc`.
pub fn answer_encoded<S: Source>(
    sock: &UnixStream,
    request: &SearchRequest,
    source: Arc<S>,
    opts: &SearchOptions,
    enc: Encoding,
) -> Result<(), ProtoError> {
    let mut w = BufWriter::new(sock);
    let mut stream = match crate::search_with(request, source, opts) {
        Ok(s) => s,
        Err(e) => {
            write_frame(
                &mut w,
                &Response::Error {
                    message: e.to_string(),
                },
            )?;
            return w.flush().map_err(io_err);
        }
    };
    answer_batches(sock, enc, |wait| Ok(stream.next_batch(wait)))
}

/// Write `results` as binary results frames (one, or more when they take more than
/// [`BIN_FRAME_BYTES`]; one empty frame for none), using `body` as the payload buffer.
pub fn write_binary<W: Write>(
    w: &mut W,
    body: &mut Vec<u8>,
    results: &[SearchResult],
) -> Result<(), ProtoError> {
    body.clear();
    body.push(BIN_RESULTS);
    for r in results {
        if body.len() > 1 && body.len() + encoded_len(r) > BIN_FRAME_BYTES {
            frame::write_frame(w, body, MAX_FRAME).map_err(frame_err)?;
            body.truncate(1);
        }
        encode_result(body, r);
    }
    frame::write_frame(w, body, MAX_FRAME).map_err(frame_err)
}

/// The streaming half of [`answer`], for any source of batches (`next` waits at most the
/// given time; an `Err` ends the answer with an Error frame): result frames (an empty one at
/// once and at least every [`HEARTBEAT`]), then End. Returns as soon as the client hangs up
/// or a write fails (dropping what `next` reads from, which cancels it).
pub fn answer_batches(
    sock: &UnixStream,
    enc: Encoding,
    mut next: impl FnMut(Duration) -> Result<Batch, String>,
) -> Result<(), ProtoError> {
    let mut w = BufWriter::with_capacity(64 * 1024, sock);
    let poll = Duration::from_millis(100);
    let mut body = Vec::new();
    let per_frame = match enc {
        Encoding::Json => RESULTS_PER_FRAME,
        Encoding::Binary => RESULTS_PER_BIN_FRAME,
    };
    let mut send = |w: &mut BufWriter<&UnixStream>, results: Vec<SearchResult>| {
        match enc {
            Encoding::Json => write_frame(w, &Response::Results { results })?,
            Encoding::Binary => write_binary(w, &mut body, &results)?,
        }
        w.flush().map_err(io_err)
    };
    // The first frame at once: the client knows the search was taken.
    send(&mut w, Vec::new())?;
    let mut last = Instant::now();
    let mut batch: Vec<SearchResult> = Vec::new();
    loop {
        let b = match next(poll) {
            Ok(b) => b,
            Err(message) => {
                if !batch.is_empty() {
                    send(&mut w, batch)?;
                }
                write_frame(&mut w, &Response::Error { message })?;
                return w.flush().map_err(io_err);
            }
        };
        match b {
            Batch::Results(rs) => {
                batch.extend(rs);
                while batch.len() >= per_frame {
                    let rest = batch.split_off(per_frame);
                    send(&mut w, std::mem::replace(&mut batch, rest))?;
                    last = Instant::now();
                }
            }
            Batch::Idle => {
                if hung_up(sock) {
                    return Err(ProtoError::Truncated); // dropping the stream cancels it
                }
                if !batch.is_empty() || last.elapsed() >= HEARTBEAT {
                    send(&mut w, std::mem::take(&mut batch))?;
                    last = Instant::now();
                }
            }
            Batch::End => break,
        }
        if last.elapsed() >= poll && hung_up(sock) {
            return Err(ProtoError::Truncated);
        }
    }
    if !batch.is_empty() {
        send(&mut w, batch)?;
    }
    write_frame(&mut w, &Response::End)?;
    w.flush().map_err(io_err)
}

/// The source a daemon searches for `cred`: its directory `base`, with the kernel deciding
/// every access for `cred`. A daemon that cannot switch credentials (not root) serves only
/// a caller with exactly its own ids.
pub fn source_for(base: Arc<OwnedFd>, cred: &Cred) -> Result<DirectSource, ProtoError> {
    if dircache_local::creds::can_switch() {
        return Ok(DirectSource::beneath(base, Some(cred.clone())));
    }
    let me = Cred::new(
        rustix::process::geteuid().as_raw(),
        rustix::process::getegid().as_raw(),
        rustix::process::getgroups()
            .map_err(std::io::Error::from)?
            .into_iter()
            .map(|g| g.as_raw()),
    );
    if me.uid == cred.uid && me.gid == cred.gid && me.groups() == cred.groups() {
        return Ok(DirectSource::beneath(base, None));
    }
    Err(ProtoError::Server(
        "this daemon cannot search as another user; search locally".into(),
    ))
}

/// Options of a daemon's searches: a few threads each (many clients share the machine).
pub fn daemon_search_options() -> SearchOptions {
    SearchOptions {
        threads: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
            .min(4),
        ..Default::default()
    }
}

/// A [`DirectSource`]-backed server for directory `src` (used by tests and as a reference for
/// the daemon): request roots `/x` are `src/x`, searched as the peer.
pub fn serve_directory(stream: UnixStream, src: &Path) -> Result<(), ProtoError> {
    let cred = peer_cred(&stream)?;
    stream.set_read_timeout(Some(DEFAULT_TIMEOUT))?;
    stream.set_write_timeout(Some(DEFAULT_TIMEOUT))?;
    let base = Arc::new(
        rustix::fs::open(
            src,
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(std::io::Error::from)?,
    );
    let mut r = BufReader::new(&stream);
    let Some((req, enc)) = read_request_encoding(&mut r)? else {
        return Ok(());
    };
    match source_for(base, &cred) {
        Ok(source) => answer_encoded(
            &stream,
            &req,
            Arc::new(source),
            &daemon_search_options(),
            enc,
        ),
        Err(e) => {
            let mut w = &stream;
            write_frame(
                &mut w,
                &Response::Error {
                    message: e.to_string(),
                },
            )
        }
    }
}

// ---------------------------------------------------------------------------------------
// Client side.

/// What a client trusts and how long it waits.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// File system type a daemon's mount must have in /proc/self/mountinfo.
    pub fstype: String,
    /// Longest wait for a connection, a write or the next frame.
    pub timeout: Duration,
}

impl Default for ClientConfig {
    fn default() -> Self {
        let timeout = std::env::var("DIRCACHE_CONTROL_TIMEOUT")
            .ok()
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s > 0.0 && *s < 1e6)
            .map(Duration::from_secs_f64)
            .unwrap_or(DEFAULT_TIMEOUT);
        ClientConfig {
            fstype: FSTYPE.into(),
            timeout,
        }
    }
}

/// A dircache mount and its daemon's socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Daemon {
    /// The mount point.
    pub root: PathBuf,
    /// The daemon's socket (from the root's [`SOCKET_XATTR`]).
    pub socket: PathBuf,
    /// The mount's owner (`user_id=`): the daemon is root or this user.
    pub owner: u32,
    /// The directory of the served file system mounted there (`/` unless a bind mount of a
    /// subdirectory): paths sent to the daemon start with it.
    pub fs_root: PathBuf,
}

impl Daemon {
    /// The path the daemon knows for `rel` below the mount point (`/` is the served root).
    fn wire_path(&self, rel: &Path) -> String {
        let p = self.fs_root.join(rel);
        let s = p.to_string_lossy();
        if s.starts_with('/') {
            s.into_owned()
        } else {
            format!("/{s}")
        }
    }
}

/// One line of /proc/self/mountinfo.
struct MountEntry {
    point: PathBuf,
    fs_root: PathBuf,
    /// Per-mount options (`ro`, `noexec`, ...).
    opts: String,
    dev: u64,
    fstype: String,
    owner: Option<u32>,
    /// The FUSE super block's `group_id=`, and whether it has `allow_other`.
    group: Option<u32>,
    allow_other: bool,
}

fn mount_table() -> Vec<MountEntry> {
    use std::os::unix::ffi::OsStrExt;
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in info.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let Some(sep) = f.iter().position(|x| *x == "-") else {
            continue;
        };
        let (Some(devs), Some(fs_root), Some(point), Some(mnt_opts), Some(fstype), Some(opts)) = (
            f.get(2),
            f.get(3),
            f.get(4),
            f.get(5),
            f.get(sep + 1),
            f.get(sep + 3),
        ) else {
            continue;
        };
        let Some((ma, mi)) = devs.split_once(':') else {
            continue;
        };
        let (Ok(ma), Ok(mi)) = (ma.parse::<u32>(), mi.parse::<u32>()) else {
            continue;
        };
        let owner = opts
            .split(',')
            .find_map(|o| o.strip_prefix("user_id="))
            .and_then(|v| v.parse().ok());
        let group = opts
            .split(',')
            .find_map(|o| o.strip_prefix("group_id="))
            .and_then(|v| v.parse().ok());
        out.push(MountEntry {
            point: PathBuf::from(std::ffi::OsStr::from_bytes(&unescape_mountinfo(point))),
            fs_root: PathBuf::from(std::ffi::OsStr::from_bytes(&unescape_mountinfo(fs_root))),
            opts: mnt_opts.to_string(),
            dev: rustix::fs::makedev(ma, mi),
            fstype: fstype.to_string(),
            owner,
            group,
            allow_other: opts.split(',').any(|o| o == "allow_other"),
        });
    }
    out
}

/// Mountinfo's root field `fs_root` of the dircache mount at `point` as a path in the served
/// tree (what the daemon takes): without the prefix [`FSROOT_XATTR`] names.
fn served_fs_root(point: &Path, fs_root: &Path) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    let mut buf = vec![0u8; 4096];
    let Ok(n) = rustix::fs::lgetxattr(point, FSROOT_XATTR, &mut buf[..]) else {
        return fs_root.to_path_buf();
    };
    buf.truncate(n);
    let prefix = Path::new(std::ffi::OsStr::from_bytes(&buf));
    match fs_root.strip_prefix(prefix) {
        Ok(rest) if prefix.is_absolute() => Path::new("/").join(rest),
        _ => fs_root.to_path_buf(),
    }
}

fn socket_xattr(root: &Path) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let mut buf = vec![0u8; 4096];
    let n = rustix::fs::lgetxattr(root, SOCKET_XATTR, &mut buf[..]).ok()?;
    buf.truncate(n);
    while buf.last() == Some(&0) {
        buf.pop();
    }
    // Only an absolute path: a relative one would depend on the client's directory.
    if !buf.starts_with(b"/") {
        return None;
    }
    Some(PathBuf::from(std::ffi::OsStr::from_bytes(&buf)))
}

/// The dircache mount `path` lies in and its daemon, if it lies in one: the innermost mount
/// containing `path` (by /proc/self/mountinfo, and on the same device) must have type
/// `cfg.fstype` and name a socket.
pub fn find_daemon_with(path: &Path, cfg: &ClientConfig) -> Option<Daemon> {
    use std::os::unix::fs::MetadataExt;
    let p = std::fs::canonicalize(path).ok()?;
    let dev = std::fs::metadata(&p).ok()?.dev();
    let table = mount_table();
    // The innermost mount containing p; the last one listed wins (mounted on top).
    let m = table
        .iter()
        .filter(|m| p.starts_with(&m.point))
        .max_by_key(|m| m.point.as_os_str().len())?;
    let top = table.iter().rev().find(|x| x.point == m.point).unwrap_or(m);
    if top.dev != dev || top.fstype != cfg.fstype {
        return None;
    }
    let socket = socket_xattr(&top.point)?;
    Some(Daemon {
        root: top.point.clone(),
        socket,
        owner: top.owner.unwrap_or(0),
        fs_root: served_fs_root(&top.point, &top.fs_root),
    })
}

/// [`find_daemon_with`] with the default configuration: `(mount root, socket)`.
pub fn find_daemon(path: &Path) -> Option<(PathBuf, PathBuf)> {
    find_daemon_with(path, &ClientConfig::default()).map(|d| (d.root, d.socket))
}

/// The options of the mount at `mnt` (the topmost one there) that access(2) applies: what a
/// daemon answering for that mount must apply too ([`DirectSource::on_mount`]).
pub fn mount_access(mnt: &Path) -> crate::MountAccess {
    let table = mount_table();
    let Some(m) = table.iter().rev().find(|m| m.point == mnt) else {
        return crate::MountAccess::default();
    };
    let has = |o: &str| m.opts.split(',').any(|x| x == o);
    crate::MountAccess {
        read_only: has("ro"),
        noexec: has("noexec"),
    }
}

/// Whether `cred` can reach the mount at `mnt` through the kernel at all, as a walk to it
/// would (docs/security.md P9): a daemon answers nothing outside a FUSE request that the
/// caller could not reach through MNT. The mount must let the caller in (`allow_other`, or
/// the caller is its owner as the kernel's `fuse_permissible_uid` decides: real, effective
/// and saved uid all `user_id=`, real, effective and saved gid all `group_id=`, from `ids`
/// ([`crate::peer::peer_ids`]; `None`: not the owner)), and the caller needs search
/// permission on every directory from `/` down to MNT's parent:
/// `faccessat2(parent, X_OK, AT_EACCESS)` on a thread switched to the caller with no
/// capabilities (the path walk checks the ancestors, the call the parent
/// itself). The control socket lives in a directory everyone may search (`/run/dircache`),
/// so without this a user kept out of MNT by a closed directory above it, or by a mount
/// without `allow_other`, could search it through the socket. A daemon that cannot switch
/// credentials answers this only for its own uid and gid. A MNT the caller reaches only by
/// another path (a bind mount of it elsewhere) is refused: the client then searches through
/// the path it has, checked by the kernel.
pub fn caller_reaches_mount(mnt: &Path, cred: &Cred, ids: Option<&crate::peer::PeerIds>) -> bool {
    let Ok(mnt) = std::path::absolute(mnt) else {
        return false;
    };
    let mnt = mnt.as_path();
    if let Some(m) = mount_table().iter().rev().find(|m| m.point == mnt) {
        let owner = m.owner == Some(cred.uid)
            && m.group.is_none_or(|g| g == cred.gid)
            && m.owner
                .is_some_and(|o| ids.is_some_and(|i| i.is_owner(o, m.group)));
        if !m.allow_other && !owner {
            return false;
        }
    }
    let Some(parent) = mnt.parent() else {
        return true;
    };
    use dircache_local::creds::{can_switch, ActAs, Caps};
    let _as = if can_switch() {
        match ActAs::switch(cred, Caps::Empty) {
            Ok(g) => g,
            Err(_) => return false,
        }
    } else {
        let me = (
            rustix::process::geteuid().as_raw(),
            rustix::process::getegid().as_raw(),
        );
        if me != (cred.uid, cred.gid) {
            return false;
        }
        ActAs::none()
    };
    rustix::fs::accessat(
        rustix::fs::CWD,
        parent,
        rustix::fs::Access::EXEC_OK,
        rustix::fs::AtFlags::EACCESS,
    )
    .is_ok()
}

/// Whether `path` is itself the root of a mount of type `cfg.fstype`; its daemon if so.
pub fn daemon_of_mount_root(path: &Path, cfg: &ClientConfig) -> Option<Daemon> {
    let d = find_daemon_with(path, cfg)?;
    let p = std::fs::canonicalize(path).ok()?;
    (p == d.root).then_some(d)
}

/// Connect to `d`'s socket and check the daemon: the peer (SO_PEERCRED, taken by the kernel
/// when the daemon listened) must be root or the mount's owner. The connection gets
/// `cfg.timeout` for reads and writes; connecting waits at most that long too.
pub fn connect_verified(d: &Daemon, cfg: &ClientConfig) -> Result<UnixStream, ProtoError> {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let fd = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        None,
    )
    .map_err(std::io::Error::from)?;
    let addr = SocketAddrUnix::new(&d.socket).map_err(std::io::Error::from)?;
    let deadline = Instant::now() + cfg.timeout;
    loop {
        match rustix::net::connect(&fd, &addr) {
            Ok(()) => break,
            Err(rustix::io::Errno::INTR) => {}
            Err(rustix::io::Errno::AGAIN) => {
                // The daemon's backlog is full: it is not accepting.
                if Instant::now() >= deadline {
                    return Err(ProtoError::TimedOut);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(rustix::io::Errno::INPROGRESS) => {
                use rustix::event::{poll, PollFd, PollFlags};
                let mut p = [PollFd::new(&fd, PollFlags::OUT)];
                let t = rustix::time::Timespec {
                    tv_sec: i64::try_from(cfg.timeout.as_secs()).unwrap_or(i64::MAX),
                    tv_nsec: i64::from(cfg.timeout.subsec_nanos()),
                };
                if !matches!(poll(&mut p, Some(&t)), Ok(n) if n > 0) {
                    return Err(ProtoError::TimedOut);
                }
                break;
            }
            Err(e) => return Err(ProtoError::Io(e.into())),
        }
    }
    let stream = UnixStream::from(fd);
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(cfg.timeout))?;
    stream.set_write_timeout(Some(cfg.timeout))?;
    let peer = rustix::net::sockopt::socket_peercred(&stream).map_err(std::io::Error::from)?;
    let uid = peer.uid.as_raw();
    if uid != 0 && uid != d.owner {
        return Err(ProtoError::Untrusted(format!(
            "{} belongs to uid {uid}, not to root or to the owner (uid {}) of the mount {}",
            d.socket.display(),
            d.owner,
            d.root.display()
        )));
    }
    Ok(stream)
}

/// The outcome of [`delegate_with`].
pub enum Delegation {
    /// The daemon took the search.
    Taken(SearchStream),
    /// Search locally, for this reason (no dircache mount, an untrusted or unwilling daemon).
    Local(String),
}

fn result_error(root: u32, e: &ProtoError) -> SearchResult {
    SearchResult {
        root,
        path: Vec::new(),
        stat: None,
        error: Some(ResultError {
            source: ErrorSource::Delegate,
            errno: e.errno(),
        }),
    }
}

/// Send the whole search to the daemon of the dircache mount the roots lie in.
///
/// `Ok(None)` when delegation does not apply (a root outside any dircache mount, roots in
/// different mounts, an untrusted daemon, or no daemon answering): the caller then searches
/// locally.
pub fn delegate(req: &SearchRequest) -> Result<Option<SearchStream>, SearchError> {
    match delegate_with(req, &ClientConfig::default())? {
        Delegation::Taken(s) => Ok(Some(s)),
        Delegation::Local(_) => Ok(None),
    }
}

/// [`delegate`] with a configuration, saying why a search stays local.
pub fn delegate_with(req: &SearchRequest, cfg: &ClientConfig) -> Result<Delegation, SearchError> {
    delegate_impl(req, cfg, false)
}

/// [`delegate_with`] whose results are read from the daemon's socket on the thread that
/// iterates the stream, as it asks for them: no reader thread, no hand-over per frame
/// (each a wake-up, which on a loaded machine waits for a core). For a consumer that only
/// iterates (`dircache search`); [`SearchStream::next_batch`] then waits for the next frame
/// as long as the connection's timeout, not its `wait`.
pub fn delegate_inline(req: &SearchRequest, cfg: &ClientConfig) -> Result<Delegation, SearchError> {
    delegate_impl(req, cfg, true)
}

fn delegate_impl(
    req: &SearchRequest,
    cfg: &ClientConfig,
    inline: bool,
) -> Result<Delegation, SearchError> {
    req.validate()?;
    if dircache_local::creds::caller_has_dac_caps() {
        // The daemon never applies capabilities; the kernel does, through the mount.
        return Ok(Delegation::Local(
            "the caller has CAP_DAC_OVERRIDE/CAP_DAC_READ_SEARCH".into(),
        ));
    }
    let roots = req.roots();
    use std::os::unix::fs::MetadataExt;
    let mut mount: Option<(Daemon, u64)> = None;
    let mut translated = Vec::new();
    for r in &roots {
        let Ok(m) = std::fs::metadata(r) else {
            return Ok(Delegation::Local(format!("{r}: cannot stat")));
        };
        if !m.is_dir() {
            return Err(SearchError::NotADirectory((*r).to_string()));
        }
        let Ok(canon) = std::fs::canonicalize(r) else {
            return Ok(Delegation::Local(format!("{r}: cannot resolve")));
        };
        match &mount {
            None => {
                let Some(d) = find_daemon_with(&canon, cfg) else {
                    return Ok(Delegation::Local("not in a dircache mount".into()));
                };
                mount = Some((d, m.dev()));
            }
            Some((d, dev)) => {
                if !canon.starts_with(&d.root) || m.dev() != *dev {
                    return Ok(Delegation::Local("roots in different mounts".into()));
                }
            }
        }
        let Some((d, _)) = &mount else {
            return Ok(Delegation::Local("not in a dircache mount".into()));
        };
        let Ok(rel) = canon.strip_prefix(&d.root) else {
            return Ok(Delegation::Local("not in a dircache mount".into()));
        };
        translated.push(d.wire_path(rel));
    }
    let Some((daemon, _)) = mount else {
        return Ok(Delegation::Local("no roots".into()));
    };
    let stream = match connect_verified(&daemon, cfg) {
        Ok(s) => s,
        Err(ProtoError::TimedOut) => {
            return Err(SearchError::Daemon(format!(
                "the dircache daemon at {} did not answer within {:?}",
                daemon.socket.display(),
                cfg.timeout
            )))
        }
        Err(e) => return Ok(Delegation::Local(e.to_string())),
    };
    let wire = SearchRequest {
        paths: translated.join(":"),
        pattern: req.pattern.clone(),
        flags: Flags(req.flags.0 & !Flags::INCLUDEROOT.0),
    };
    let mut w = BufWriter::new(&stream);
    match write_request_binary(&mut w, &wire) {
        Ok(()) => {}
        Err(ProtoError::TimedOut) => {
            return Err(SearchError::Daemon(format!(
                "the dircache daemon at {} did not answer within {:?}",
                daemon.socket.display(),
                cfg.timeout
            )))
        }
        Err(e) => return Ok(Delegation::Local(e.to_string())),
    }
    drop(w);
    // The first answer decides: results (or the end) mean the daemon took the search; an error
    // (e.g. a daemon that does not know the `search` op, or is busy) means: search locally.
    let mut r = BufReader::new(stream);
    let nroots = roots.len();
    let first = match read_response(&mut r, MAX_RESPONSE) {
        Ok(Some(Response::Results { results })) => Some(results),
        Ok(Some(Response::End)) => None,
        Ok(Some(Response::Error { message })) => {
            return Ok(Delegation::Local(format!("daemon: {message}")))
        }
        Err(ProtoError::TimedOut) => {
            return Err(SearchError::Daemon(format!(
                "the dircache daemon at {} did not answer within {:?}",
                daemon.socket.display(),
                cfg.timeout
            )))
        }
        Ok(None) => return Ok(Delegation::Local("daemon closed the connection".into())),
        Err(e) => return Ok(Delegation::Local(e.to_string())),
    };
    if let Some(bad) = first
        .iter()
        .flatten()
        .find_map(|x| check_result(x, nroots).err())
    {
        return Err(SearchError::Daemon(format!(
            "the dircache daemon at {} sent a bad answer: {bad}",
            daemon.socket.display()
        )));
    }
    let include_root = req.flags.contains(Flags::INCLUDEROOT);
    let orig: Vec<Vec<u8>> = roots.iter().map(|r| r.as_bytes().to_vec()).collect();
    let fix = move |mut r: SearchResult| {
        if include_root {
            let root = orig.get(r.root as usize).map(Vec::as_slice).unwrap_or(b"");
            r.path = join_path(root, &r.path);
        }
        r
    };
    let shutdown = r.get_ref().try_clone().ok();
    // The next batch of results (one per frame: a binary frame holds thousands), `None` at
    // the end; an error ends the stream after a result saying so.
    // The daemon's first answer was the end: nothing to read.
    let mut over = first.is_none();
    let mut first = first;
    let mut next_frame = move || -> Option<Vec<SearchResult>> {
        if over {
            return None;
        }
        if let Some(f) = first.take() {
            return Some(f.into_iter().map(&fix).collect());
        }
        loop {
            let results = match read_response(&mut r, MAX_RESPONSE) {
                Ok(Some(Response::Results { results })) => results,
                Ok(Some(Response::End)) => {
                    over = true;
                    return None;
                }
                Ok(Some(Response::Error { message })) => {
                    over = true;
                    return Some(vec![result_error(0, &ProtoError::Server(message))]);
                }
                Ok(None) => {
                    over = true;
                    return Some(vec![result_error(0, &ProtoError::Truncated)]);
                }
                Err(e) => {
                    over = true;
                    return Some(vec![result_error(0, &e)]);
                }
            };
            if results.is_empty() {
                continue;
            }
            let mut batch = Vec::with_capacity(results.len());
            for x in results {
                match check_result(&x, nroots) {
                    Ok(()) => batch.push(fix(x)),
                    Err(e) => {
                        batch.push(result_error(0, &e));
                        over = true;
                        break;
                    }
                }
            }
            return Some(batch);
        }
    };
    let cancel = Arc::new(AtomicBool::new(false));
    let mut s = if inline {
        SearchStream::pulled(Box::new(next_frame), cancel)
    } else {
        let (tx, rx) = crossbeam_channel::bounded::<Vec<SearchResult>>(64);
        let c2 = cancel.clone();
        let reader = std::thread::Builder::new()
            .name("search-delegate".into())
            .spawn(move || {
                while !c2.load(Ordering::Relaxed) {
                    let Some(batch) = next_frame() else { return };
                    if tx.send(batch).is_err() {
                        return;
                    }
                }
            })
            .map_err(|e| SearchError::Spawn(e.to_string()))?;
        SearchStream::from_parts(rx, cancel, vec![reader])
    };
    if let Some(sock) = shutdown {
        // Dropping the stream closes the connection, which cancels the search at the daemon
        // and wakes the reader.
        s.on_drop = Some(Box::new(move || {
            let _ = sock.shutdown(std::net::Shutdown::Both);
        }));
    }
    Ok(Delegation::Taken(s))
}

/// Send a child search (paper §4) for the whole file system of `d` (paths `/`), feeding
/// every result to `each` until it returns `false`. `false` if the daemon did not take the
/// search (no daemon, an untrusted one, or one that does not know the op).
pub(crate) fn child_search(
    d: &Daemon,
    cfg: &ClientConfig,
    pattern: &str,
    flags: Flags,
    mut each: impl FnMut(SearchResult) -> bool,
) -> bool {
    let Ok(stream) = connect_verified(d, cfg) else {
        return false;
    };
    let wire = SearchRequest {
        paths: d.wire_path(Path::new("")),
        pattern: pattern.into(),
        flags: Flags(flags.0 & !Flags::INCLUDEROOT.0),
    };
    if write_request_binary(&mut BufWriter::new(&stream), &wire).is_err() {
        return false;
    }
    let mut r = BufReader::new(stream);
    let first = match read_response(&mut r, MAX_RESPONSE) {
        Ok(Some(Response::Results { results })) => results,
        Ok(Some(Response::End)) => return true,
        _ => return false,
    };
    for x in first {
        if let Err(e) = check_result(&x, 1) {
            each(result_error(0, &e));
            return true;
        }
        if !each(x) {
            return true;
        }
    }
    for item in read_results(r) {
        let item = item.and_then(|x| check_result(&x, 1).map(|()| x));
        let (x, last) = match item {
            Ok(x) => (x, false),
            Err(e) => (result_error(0, &e), true),
        };
        if !each(x) || last {
            break;
        }
    }
    true
}

/// Decode the octal escapes of /proc/self/mountinfo (`\040` for a space).
fn unescape_mountinfo(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        let val = oct.map(|d| d.iter().fold(0u32, |a, &c| a * 8 + u32::from(c - b'0')));
        if let (b'\\', Some(v)) = (b[i], val.and_then(|v| u8::try_from(v).ok())) {
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// dircache mounts (type `cfg.fstype`) strictly below the given roots:
/// `(root index, path below that root) -> daemon`.
pub(crate) fn dircache_mounts_below(
    roots: &[&str],
    cfg: &ClientConfig,
) -> std::collections::HashMap<(usize, Vec<u8>), Daemon> {
    use std::os::unix::ffi::OsStrExt;
    let mut map = std::collections::HashMap::new();
    let canon: Vec<Option<PathBuf>> = roots
        .iter()
        .map(|r| std::fs::canonicalize(r).ok())
        .collect();
    let table = mount_table();
    for (k, m) in table.iter().enumerate() {
        if m.fstype != cfg.fstype {
            continue;
        }
        // Something mounted on top of it later hides it.
        if table[k + 1..].iter().any(|x| x.point == m.point) {
            continue;
        }
        for (i, c) in canon.iter().enumerate() {
            let Some(c) = c else { continue };
            let Ok(rel) = m.point.strip_prefix(c) else {
                continue;
            };
            if rel.as_os_str().is_empty() {
                continue;
            }
            let Some(socket) = socket_xattr(&m.point) else {
                continue;
            };
            map.insert(
                (i, rel.as_os_str().as_bytes().to_vec()),
                Daemon {
                    root: m.point.clone(),
                    socket,
                    owner: m.owner.unwrap_or(0),
                    fs_root: served_fs_root(&m.point, &m.fs_root),
                },
            );
        }
    }
    map
}

/// What the CLI and the C API call: delegate to a mount's daemon when the roots lie in a
/// dircache mount (unless `DIRCACHE_NO_DELEGATE` is set), otherwise search the file system
/// directly.
pub fn search_auto(req: &SearchRequest) -> Result<SearchStream, SearchError> {
    if std::env::var_os("DIRCACHE_NO_DELEGATE").is_none() {
        if let Some(s) = delegate(req)? {
            return Ok(s);
        }
    }
    let opts = crate::SearchOptions {
        delegate_mounts: true,
        ..Default::default()
    };
    crate::search_with(req, Arc::new(DirectSource::new()), &opts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_results() -> Vec<SearchResult> {
        let t = |sec, nsec| dircache_core::Timespec { sec, nsec };
        let attr = dircache_core::Attr {
            ino: u64::MAX - 1,
            dev: 0x0803,
            mode: 0o104755,
            nlink: 3,
            uid: 1000,
            gid: 100,
            rdev: 7,
            size: 1 << 40,
            blocks: 9,
            blksize: 4096,
            atime: t(-5, 1),
            mtime: t(1_700_000_000, 999_999_999),
            ctime: t(3, 4),
            birth: 0xdead_beef,
        };
        vec![
            SearchResult {
                root: 0,
                path: b"a/b.c".to_vec(),
                stat: None,
                error: None,
            },
            SearchResult {
                root: 2,
                path: vec![b'x', 0xff, b'/', 0],
                stat: Some(attr),
                error: None,
            },
            SearchResult {
                root: 1,
                path: Vec::new(),
                stat: None,
                error: Some(ResultError {
                    source: ErrorSource::Readdir,
                    errno: libc::EACCES,
                }),
            },
        ]
    }

    /// Binary results frames carry every field (attributes, errors, any bytes in a path),
    /// mix with JSON frames in one stream, and a damaged one is an error, never a panic or a
    /// silent loss.
    #[test]
    fn binary_frames_round_trip() {
        let rs = sample_results();
        let mut buf = Vec::new();
        let mut body = Vec::new();
        write_binary(&mut buf, &mut body, &[]).unwrap_or_else(|e| panic!("{e}"));
        write_binary(&mut buf, &mut body, &rs).unwrap_or_else(|e| panic!("{e}"));
        write_frame(
            &mut buf,
            &Response::Results {
                results: rs.clone(),
            },
        )
        .unwrap_or_else(|e| panic!("{e}"));
        write_frame(&mut buf, &Response::End).unwrap_or_else(|e| panic!("{e}"));
        let back: Vec<SearchResult> = read_results(buf.as_slice())
            .map(|r| r.unwrap_or_else(|e| panic!("{e}")))
            .collect();
        let mut want = rs.clone();
        want.extend(rs.clone());
        assert_eq!(back, want);
        // Many results: split into frames of at most BIN_FRAME_BYTES, all of them back.
        let many: Vec<SearchResult> = (0..20_000u32)
            .map(|i| SearchResult {
                root: 0,
                path: format!("dir{}/file{i}.c", i % 97).into_bytes(),
                stat: None,
                error: None,
            })
            .collect();
        let mut buf = Vec::new();
        write_binary(&mut buf, &mut body, &many).unwrap_or_else(|e| panic!("{e}"));
        write_frame(&mut buf, &Response::End).unwrap_or_else(|e| panic!("{e}"));
        let mut r = buf.as_slice();
        let mut frames = 0;
        while let Some(b) = read_frame_bytes(&mut r, MAX_RESPONSE).unwrap_or_else(|e| panic!("{e}"))
        {
            assert!(b.len() <= BIN_FRAME_BYTES, "{}", b.len());
            frames += 1;
        }
        assert!(frames > 2, "{frames}");
        let back: Vec<SearchResult> = read_results(buf.as_slice())
            .map(|r| r.unwrap_or_else(|e| panic!("{e}")))
            .collect();
        assert_eq!(back, many);
        // Damaged: a record cut short, unknown bits, an unknown error source.
        let mut one = vec![BIN_RESULTS];
        encode_result(&mut one, &rs[1]);
        assert_eq!(one.len(), 1 + encoded_len(&rs[1]));
        for cut in 1..one.len() - 1 {
            assert!(
                matches!(decode_response(&one[..cut]), Ok(Response::Results { ref results }) if results.is_empty())
                    || decode_response(&one[..cut]).is_err(),
                "cut at {cut}"
            );
            if cut > 1 {
                assert!(decode_response(&one[..cut]).is_err(), "cut at {cut}");
            }
        }
        let mut bad = one.clone();
        bad[5] = 4;
        assert!(decode_response(&bad).is_err());
        let mut e = vec![BIN_RESULTS];
        encode_result(&mut e, &rs[2]);
        let last = e.len() - 5;
        e[last] = 9;
        assert!(decode_response(&e).is_err());
    }

    /// A request asks for binary results with its `results` field; one without it (an older
    /// client) gets JSON, and an older daemon that ignores the field still parses it.
    #[test]
    fn requests_say_which_encoding() {
        let req = SearchRequest::new("/a", "*.c", Flags::METADATA);
        let mut buf = Vec::new();
        write_request_binary(&mut buf, &req).unwrap_or_else(|e| panic!("{e}"));
        let got = read_request_encoding(&mut buf.as_slice()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got, Some((req.clone(), Encoding::Binary)));
        assert_eq!(
            read_request(&mut buf.as_slice()).ok().flatten(),
            Some(req.clone())
        );
        let mut buf = Vec::new();
        write_request(&mut buf, &req).unwrap_or_else(|e| panic!("{e}"));
        let got = read_request_encoding(&mut buf.as_slice()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got, Some((req, Encoding::Json)));
    }

    #[test]
    fn frames_round_trip() {
        let req = SearchRequest::new("/a:/b", "*.c|/x", Flags::METADATA | Flags::X_OK);
        let mut buf = Vec::new();
        write_request(&mut buf, &req).unwrap_or_else(|e| panic!("{e}"));
        let got = read_request(&mut buf.as_slice()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got, Some(req));
        let mut out = Vec::new();
        let r = SearchResult {
            root: 1,
            path: b"x/y".to_vec(),
            stat: None,
            error: None,
        };
        write_frame(
            &mut out,
            &Response::Results {
                results: vec![r.clone(), r.clone()],
            },
        )
        .unwrap_or_else(|e| panic!("{e}"));
        write_frame(&mut out, &Response::End).unwrap_or_else(|e| panic!("{e}"));
        let all: Vec<_> = read_results(out.as_slice()).collect();
        assert_eq!(all.len(), 2);
        // Non-UTF-8 names survive the trip.
        let odd = SearchResult {
            root: 0,
            path: vec![b'a', 0xff, b'b'],
            stat: None,
            error: None,
        };
        let mut buf = Vec::new();
        write_frame(
            &mut buf,
            &Response::Results {
                results: vec![odd.clone()],
            },
        )
        .unwrap_or_else(|e| panic!("{e}"));
        write_frame(&mut buf, &Response::End).unwrap_or_else(|e| panic!("{e}"));
        let back: Vec<SearchResult> = read_results(buf.as_slice())
            .filter_map(Result::ok)
            .collect();
        assert_eq!(back, vec![odd]);
        // A truncated stream is an error, not a silent end.
        let cut = &out[..out.len() - 3];
        assert!(read_results(cut).any(|x| x.is_err()));
    }
}
