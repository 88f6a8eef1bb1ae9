//! The search wire protocol and delegation to a mount's daemon.
//!
//! **Framing** (the FUSE daemon's control-socket protocol): every message is a frame: a 4-byte
//! big-endian length, then that many bytes of JSON (at most [`MAX_FRAME`]). The client sends
//! one request object tagged by `"op"`: `{"op":"search","paths":..,"pattern":..,"flags":N}`.
//! The server answers with any number of `{"ok":true,"results":[..]}` frames, then exactly one
//! `{"ok":true,"end":true}`, or `{"ok":false,"error":".."}` (a daemon that does not know the
//! `search` op answers that way, and the client then searches locally). The client may close
//! the connection at any time to cancel.
//!
//! **Paths** in a delegated request are absolute *within the served file system*: `/` is the
//! mount root (the daemon's SRC). The client sends the request without INCLUDEROOT and puts the
//! roots back itself, so result paths are always relative to their root on the wire.
//!
//! **Finding the daemon** ([`find_daemon`]): from the search root up to the root of the mount
//! it lies in (statx `STATX_ATTR_MOUNT_ROOT`), then the extended attribute
//! [`SOCKET_XATTR`] of that mount root names the daemon's unix socket.
//!
//! **Serving** ([`serve_connection`]): the daemon reads the request, learns the caller's ids
//! from `SO_PEERCRED` (+ supplementary groups from /proc), runs [`serve_search`] over its
//! source for those credentials and streams the results.

use std::io::{BufReader, BufWriter, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use dircache_core::Cred;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::{
    join_path, search, DirectSource, ErrorSource, Flags, ResultError, SearchError, SearchRequest,
    SearchResult, SearchStream, Source,
};

/// Extended attribute of a dircache mount root that names its daemon's socket.
pub const SOCKET_XATTR: &str = "user.dircache.socket";
/// Largest frame accepted.
pub const MAX_FRAME: usize = 16 << 20;
/// Results per frame when serving.
pub const RESULTS_PER_FRAME: usize = 256;

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
}

/// A request to a daemon or server (an envelope other operations can join).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Search(SearchRequest),
}

/// A response frame: `{"ok":true,"results":[..]}`, `{"ok":true,"end":true}` or
/// `{"ok":false,"error":".."}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "WireResponse", into = "WireResponse")]
pub enum Response {
    Results { results: Vec<SearchResult> },
    End,
    Error { message: String },
}

#[derive(Serialize, Deserialize)]
struct WireResponse {
    ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    results: Option<Vec<SearchResult>>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    end: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

impl From<Response> for WireResponse {
    fn from(r: Response) -> WireResponse {
        match r {
            Response::Results { results } => WireResponse {
                ok: true,
                results: Some(results),
                end: false,
                error: None,
            },
            Response::End => WireResponse {
                ok: true,
                results: None,
                end: true,
                error: None,
            },
            Response::Error { message } => WireResponse {
                ok: false,
                results: None,
                end: false,
                error: Some(message),
            },
        }
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

pub fn write_frame<W: Write, T: Serialize>(w: &mut W, msg: &T) -> Result<(), ProtoError> {
    let body = serde_json::to_vec(msg)?;
    if body.len() > MAX_FRAME {
        return Err(ProtoError::TooLarge(body.len()));
    }
    let len = u32::try_from(body.len()).map_err(|_| ProtoError::TooLarge(body.len()))?;
    w.write_all(&len.to_be_bytes())?;
    w.write_all(&body)?;
    Ok(())
}

/// Read one frame; `Ok(None)` on a clean end of stream before the frame.
pub fn read_frame<R: Read, T: DeserializeOwned>(r: &mut R) -> Result<Option<T>, ProtoError> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(ProtoError::Truncated),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let n = u32::from_be_bytes(len) as usize;
    if n > MAX_FRAME {
        return Err(ProtoError::TooLarge(n));
    }
    let mut body = vec![0u8; n];
    r.read_exact(&mut body).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => ProtoError::Truncated,
        _ => ProtoError::Io(e),
    })?;
    Ok(Some(serde_json::from_slice(&body)?))
}

pub fn write_request<W: Write>(w: &mut W, req: &SearchRequest) -> Result<(), ProtoError> {
    write_frame(w, &Request::Search(req.clone()))?;
    w.flush()?;
    Ok(())
}

pub fn read_request<R: Read>(r: &mut R) -> Result<Option<SearchRequest>, ProtoError> {
    Ok(read_frame::<_, Request>(r)?.map(|Request::Search(s)| s))
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
        match read_frame::<_, Response>(&mut r) {
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

/// What a daemon calls to answer a search request: the same engine as a local search, over
/// the daemon's own source (its cache, or the directory it serves).
pub fn serve_search<S: Source>(
    request: &SearchRequest,
    source: Arc<S>,
) -> Result<impl Iterator<Item = SearchResult>, SearchError> {
    search(request, source)
}

/// Write the answer to `request` on `w`: result frames, then End (or Error for bad input).
pub fn answer<S: Source, W: Write>(
    w: &mut W,
    request: &SearchRequest,
    source: Arc<S>,
) -> Result<(), ProtoError> {
    match serve_search(request, source) {
        Ok(stream) => {
            let mut batch = Vec::with_capacity(RESULTS_PER_FRAME);
            for r in stream {
                batch.push(r);
                if batch.len() == RESULTS_PER_FRAME {
                    write_frame(
                        w,
                        &Response::Results {
                            results: std::mem::take(&mut batch),
                        },
                    )?;
                    w.flush()?;
                }
            }
            if !batch.is_empty() {
                write_frame(w, &Response::Results { results: batch })?;
            }
            write_frame(w, &Response::End)?;
        }
        Err(e) => write_frame(
            w,
            &Response::Error {
                message: e.to_string(),
            },
        )?,
    }
    w.flush()?;
    Ok(())
}

/// The credentials of the process at the other end of a unix socket.
pub fn peer_cred(s: &UnixStream) -> Result<Cred, ProtoError> {
    let c = rustix::net::sockopt::socket_peercred(s).map_err(std::io::Error::from)?;
    let groups = std::fs::read_to_string(format!("/proc/{}/status", c.pid.as_raw_nonzero()))
        .ok()
        .and_then(|st| {
            st.lines().find_map(|l| l.strip_prefix("Groups:")).map(|g| {
                g.split_whitespace()
                    .filter_map(|x| x.parse::<u32>().ok())
                    .collect::<Vec<u32>>()
            })
        })
        .unwrap_or_default();
    Ok(Cred::new(c.uid.as_raw(), c.gid.as_raw(), groups))
}

/// Serve one connection: one search request, answered for the peer's credentials with the
/// source `make_source(peer)` builds (e.g. a `CacheSource` with `cache.credentials(peer)`).
pub fn serve_connection<S: Source>(
    stream: UnixStream,
    make_source: impl FnOnce(Cred) -> Arc<S>,
) -> Result<(), ProtoError> {
    let cred = peer_cred(&stream)?;
    let mut r = BufReader::new(stream.try_clone()?);
    let mut w = BufWriter::new(stream);
    let Some(req) = read_request(&mut r)? else {
        return Ok(());
    };
    answer(&mut w, &req, make_source(cred))
}

/// A [`DirectSource`]-backed server for directory `src` (used by tests and as a reference for
/// the daemon): request roots `/x` are taken as `src/x`.
pub fn serve_directory(stream: UnixStream, src: &Path) -> Result<(), ProtoError> {
    let cred = peer_cred(&stream)?;
    let mut r = BufReader::new(stream.try_clone()?);
    let mut w = BufWriter::new(stream);
    let Some(mut req) = read_request(&mut r)? else {
        return Ok(());
    };
    let base = src.to_string_lossy();
    req.paths = req
        .paths
        .split(':')
        .map(|p| {
            format!(
                "{}/{}",
                base.trim_end_matches('/'),
                p.trim_start_matches('/')
            )
        })
        .collect::<Vec<_>>()
        .join(":");
    let source = if cred.uid == rustix::process::geteuid().as_raw() {
        DirectSource::new()
    } else {
        DirectSource::as_cred(cred)
    };
    answer(&mut w, &req, Arc::new(source))
}

/// The daemon serving `path`, if `path` lies in a dircache mount: `(mount root, socket)`.
pub fn find_daemon(path: &Path) -> Option<(PathBuf, PathBuf)> {
    use rustix::fs::{statx, AtFlags, StatxAttributes, StatxFlags, CWD};
    let mut p = std::fs::canonicalize(path).ok()?;
    loop {
        let st = statx(CWD, &p, AtFlags::empty(), StatxFlags::TYPE).ok()?;
        let known = st.stx_attributes_mask.contains(StatxAttributes::MOUNT_ROOT);
        let is_root = st.stx_attributes.contains(StatxAttributes::MOUNT_ROOT);
        if !known || is_root || p.parent().is_none() {
            let mut buf = vec![0u8; 4096];
            let n = rustix::fs::getxattr(&p, SOCKET_XATTR, &mut buf[..]).ok()?;
            buf.truncate(n);
            while buf.last() == Some(&0) {
                buf.pop();
            }
            use std::os::unix::ffi::OsStringExt;
            return Some((p, PathBuf::from(std::ffi::OsString::from_vec(buf))));
        }
        p = p.parent()?.to_path_buf();
    }
}

/// Send the whole search to the daemon of the dircache mount the roots lie in.
///
/// `Ok(None)` when delegation does not apply (a root outside any dircache mount, roots in
/// different mounts, or no daemon answering): the caller then searches locally.
pub fn delegate(req: &SearchRequest) -> Result<Option<SearchStream>, SearchError> {
    req.validate()?;
    let roots = req.roots();
    // The daemon is looked up once (one getxattr, a FUSE round trip); the other roots only
    // have to lie in the same file system below the same mount root.
    use std::os::unix::fs::MetadataExt;
    let mut mount: Option<(PathBuf, PathBuf, u64)> = None;
    let mut translated = Vec::new();
    for r in &roots {
        let Ok(m) = std::fs::metadata(r) else {
            return Ok(None);
        };
        if !m.is_dir() {
            return Err(SearchError::NotADirectory((*r).to_string()));
        }
        let Ok(canon) = std::fs::canonicalize(r) else {
            return Ok(None);
        };
        match &mount {
            None => {
                let Some((root, sock)) = find_daemon(&canon) else {
                    return Ok(None);
                };
                mount = Some((root, sock, m.dev()));
            }
            Some((root, _, dev)) => {
                if !canon.starts_with(root) || m.dev() != *dev {
                    return Ok(None);
                }
            }
        }
        let Some((root, _, _)) = &mount else {
            return Ok(None);
        };
        let Ok(rel) = canon.strip_prefix(root) else {
            return Ok(None);
        };
        translated.push(format!("/{}", rel.to_string_lossy()));
    }
    let Some((_, sock, _)) = mount else {
        return Ok(None);
    };
    let Ok(stream) = UnixStream::connect(&sock) else {
        return Ok(None);
    };
    let wire = SearchRequest {
        paths: translated.join(":"),
        pattern: req.pattern.clone(),
        flags: Flags(req.flags.0 & !Flags::INCLUDEROOT.0),
    };
    let mut w = BufWriter::new(match stream.try_clone() {
        Ok(s) => s,
        Err(_) => return Ok(None),
    });
    if write_request(&mut w, &wire).is_err() {
        return Ok(None);
    }
    // The first answer decides: results (or the end) mean the daemon took the search; an error
    // (e.g. a daemon that does not know the `search` op) means: search locally.
    let mut r = BufReader::new(stream);
    let first = match read_frame::<_, Response>(&mut r) {
        Ok(Some(Response::Results { results })) => Some(results),
        Ok(Some(Response::End)) => None,
        _ => return Ok(None),
    };
    let include_root = req.flags.contains(Flags::INCLUDEROOT);
    let orig: Vec<Vec<u8>> = roots.iter().map(|r| r.as_bytes().to_vec()).collect();
    let fix = move |mut r: SearchResult| {
        if include_root {
            let root = orig.get(r.root as usize).map(Vec::as_slice).unwrap_or(b"");
            r.path = join_path(root, &r.path);
        }
        r
    };
    let (tx, rx) = crossbeam_channel::bounded::<Vec<SearchResult>>(64);
    let cancel = Arc::new(AtomicBool::new(false));
    let c2 = cancel.clone();
    let shutdown = r.get_ref().try_clone().ok();
    let reader = std::thread::Builder::new()
        .name("search-delegate".into())
        .spawn(move || {
            let Some(first) = first else { return };
            if tx.send(first.into_iter().map(&fix).collect()).is_err() {
                return;
            }
            let mut batch = Vec::new();
            for item in read_results(r) {
                if c2.load(Ordering::Relaxed) {
                    break;
                }
                match item {
                    Ok(x) => batch.push(fix(x)),
                    Err(e) => {
                        let errno = match e {
                            ProtoError::Io(ref io) => io.raw_os_error().unwrap_or(libc::EIO),
                            _ => libc::EIO,
                        };
                        batch.push(SearchResult {
                            root: 0,
                            path: Vec::new(),
                            stat: None,
                            error: Some(ResultError {
                                source: ErrorSource::Delegate,
                                errno,
                            }),
                        });
                    }
                }
                if batch.len() >= RESULTS_PER_FRAME && tx.send(std::mem::take(&mut batch)).is_err()
                {
                    return;
                }
            }
            if !batch.is_empty() {
                let _ = tx.send(batch);
            }
        })
        .map_err(|e| SearchError::Spawn(e.to_string()))?;
    let mut s = SearchStream::from_parts(rx, cancel, vec![reader]);
    if let Some(sock) = shutdown {
        // Dropping the stream closes the connection, which cancels the search at the daemon
        // and wakes the reader.
        s.on_drop = Some(Box::new(move || {
            let _ = sock.shutdown(std::net::Shutdown::Both);
        }));
    }
    Ok(Some(s))
}

/// Send a child search (paper §4) for the whole file system behind `sock` (paths `/`),
/// feeding every result to `each` until it returns `false`. `false` if the daemon did not
/// take the search (no daemon, or it does not know the op).
pub(crate) fn child_search(
    sock: &Path,
    pattern: &str,
    flags: Flags,
    mut each: impl FnMut(SearchResult) -> bool,
) -> bool {
    let Ok(stream) = UnixStream::connect(sock) else {
        return false;
    };
    let wire = SearchRequest {
        paths: "/".into(),
        pattern: pattern.into(),
        flags: Flags(flags.0 & !Flags::INCLUDEROOT.0),
    };
    let Ok(ws) = stream.try_clone() else {
        return false;
    };
    if write_request(&mut BufWriter::new(ws), &wire).is_err() {
        return false;
    }
    let mut r = BufReader::new(stream);
    let first = match read_frame::<_, Response>(&mut r) {
        Ok(Some(Response::Results { results })) => results,
        Ok(Some(Response::End)) => return true,
        _ => return false,
    };
    for x in first {
        if !each(x) {
            return true;
        }
    }
    for item in read_results(r) {
        let x = match item {
            Ok(x) => x,
            Err(e) => SearchResult {
                root: 0,
                path: Vec::new(),
                stat: None,
                error: Some(ResultError {
                    source: ErrorSource::Delegate,
                    errno: match e {
                        ProtoError::Io(ref io) => io.raw_os_error().unwrap_or(libc::EIO),
                        _ => libc::EIO,
                    },
                }),
            },
        };
        if !each(x) {
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

/// Mount points strictly below the given roots whose root directory names a dircache daemon
/// socket: `(root index, path below that root) -> socket`.
pub(crate) fn dircache_mounts_below(
    roots: &[&str],
) -> std::collections::HashMap<(usize, Vec<u8>), PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let mut map = std::collections::HashMap::new();
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return map;
    };
    let canon: Vec<Option<PathBuf>> = roots
        .iter()
        .map(|r| std::fs::canonicalize(r).ok())
        .collect();
    for line in info.lines() {
        let Some(mp) = line.split(' ').nth(4) else {
            continue;
        };
        let mp = PathBuf::from(std::ffi::OsStr::from_bytes(&unescape_mountinfo(mp)));
        for (i, c) in canon.iter().enumerate() {
            let Some(c) = c else { continue };
            let Ok(rel) = mp.strip_prefix(c) else {
                continue;
            };
            if rel.as_os_str().is_empty() {
                continue;
            }
            let mut buf = vec![0u8; 4096];
            let Ok(n) = rustix::fs::getxattr(&mp, SOCKET_XATTR, &mut buf[..]) else {
                continue;
            };
            buf.truncate(n);
            while buf.last() == Some(&0) {
                buf.pop();
            }
            let sock = PathBuf::from(std::ffi::OsStr::from_bytes(&buf));
            map.insert((i, rel.as_os_str().as_bytes().to_vec()), sock);
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
