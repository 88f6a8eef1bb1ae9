//! Searches answered by a backend that runs them itself ([`Backend::search`]: a remote
//! backend sends one request and its server walks the tree, paper §3–5), for a daemon's
//! control socket ([`answer_backend`]): the request's paths (absolute within the served file
//! system) become backend paths, the caller's credentials (SO_PEERCRED) go with the call, and
//! the results stream back as the local [`answer`](crate::proto::answer) streams them.
//!
//! A request the backend cannot answer exactly as the mount would is not delegated (`None`;
//! the daemon then answers as before): a path with a `.`/`..` component, a mount option the
//! server cannot know of that filters results (W_OK on a read-only mount, X_OK on a noexec
//! one). A backend that refuses the search (a server that cannot act as this caller) or fails
//! before its first result makes the daemon answer with an error, and the client then
//! searches through the mount, where the kernel checks every step.

use std::os::unix::net::UnixStream;
use std::time::Duration;

use dircache_core::{Backend, Cred, SearchCall, SearchEvent, SearchHit};

use crate::proto::{answer_batches, write_frame, Encoding, ProtoError, Response};
use crate::{Batch, ErrorSource, Flags, MountAccess, ResultError, SearchRequest, SearchResult};

/// Longest wait for the backend to take a search (its first frame).
pub const FIRST_WAIT: Duration = Duration::from_secs(10);

/// The backend call for `request` (paths absolute within the served file system), or `None`
/// when a path is not plain (relative, or with an empty-but-last, `.` or `..` component).
pub fn call_for(request: &SearchRequest) -> Option<SearchCall> {
    let mut paths = Vec::new();
    for r in request.roots() {
        let rel = r.strip_prefix('/')?;
        let rel = rel.trim_end_matches('/');
        if !rel.is_empty()
            && rel
                .split('/')
                .any(|c| c.is_empty() || c == "." || c == "..")
        {
            return None;
        }
        paths.push(rel.as_bytes().to_vec());
    }
    Some(SearchCall {
        paths,
        pattern: request.pattern.clone(),
        flags: request.flags.0 & !Flags::INCLUDEROOT.0,
    })
}

fn error_source(s: u8) -> ErrorSource {
    match s {
        1 => ErrorSource::Open,
        2 => ErrorSource::Readdir,
        3 => ErrorSource::Stat,
        _ => ErrorSource::Delegate,
    }
}

/// A backend's result as the engine's.
pub fn result_of(h: SearchHit) -> SearchResult {
    SearchResult {
        root: h.root,
        path: h.path,
        stat: h.attr,
        error: h.error.map(|(source, errno)| ResultError {
            source: error_source(source),
            errno,
        }),
    }
}

/// Answer `request` on `sock` through `backend`'s own search, for `cred`; `None` when this
/// backend does not search or the request is not one to delegate (module docs).
pub fn answer_backend(
    sock: &UnixStream,
    request: &SearchRequest,
    backend: &dyn Backend,
    cred: &Cred,
    mount: MountAccess,
    enc: Encoding,
) -> Option<Result<(), ProtoError>> {
    if (mount.read_only && request.flags.contains(Flags::W_OK))
        || (mount.noexec && request.flags.contains(Flags::X_OK))
    {
        return None;
    }
    let call = call_for(request)?;
    let refuse = |message: String| {
        let mut w = sock;
        write_frame(&mut w, &Response::Error { message })
    };
    let mut hits = match backend.search(cred, &call)? {
        Ok(h) => h,
        Err(e) => return Some(refuse(format!("backend search: {e}"))),
    };
    let mut first = match hits.next(FIRST_WAIT) {
        SearchEvent::Failed(e) => return Some(refuse(format!("backend search: {e}"))),
        ev => Some(ev),
    };
    Some(answer_batches(sock, enc, move |wait| {
        let ev = first.take().unwrap_or_else(|| hits.next(wait));
        match ev {
            SearchEvent::Hits(h) => Ok(Batch::Results(h.into_iter().map(result_of).collect())),
            SearchEvent::Idle => Ok(Batch::Idle),
            SearchEvent::End => Ok(Batch::End),
            SearchEvent::Failed(e) => Err(format!("backend search: {e}")),
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_take_plain_paths_only() {
        let r = SearchRequest::new("/:/a/b/:/c", "*.c", Flags(Flags::INCLUDEROOT.0 | 2));
        let c = call_for(&r).unwrap();
        assert_eq!(c.paths, vec![b"".to_vec(), b"a/b".to_vec(), b"c".to_vec()]);
        assert_eq!(c.flags, 2);
        for bad in ["a", "/a/../b", "/a//b", "/./a"] {
            assert!(
                call_for(&SearchRequest::new(bad, "*", Flags::NONE)).is_none(),
                "{bad}"
            );
        }
    }
}
