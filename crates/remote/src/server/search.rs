//! The server side of a delegated search ([`Request::Search`](crate::proto::Request::Search)):
//! the dircache_search engine runs over the served root, on a thread of its own per search
//! (at most [`MAX_SEARCHES`] per connection, EBUSY beyond), and streams
//! [`Reply::Found`] frames back. Confinement and credentials are the local backend's: the
//! engine's [`DirectSource`] resolves every directory beneath the root's descriptor
//! (`RESOLVE_BENEATH`, no symlinks followed), as the call's credentials when the server runs
//! as root, else as the server's own user, and then only for a caller with the server's own
//! uid (EACCES otherwise: the client searches through its mount instead, where its kernel
//! checks every step). A [`Request::Cancel`](crate::proto::Request::Cancel) or the end of the
//! connection stops the search.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dircache_core::Cred;
use dircache_search::{Batch, DirectSource, Flags, SearchError, SearchRequest, SearchResult};
use parking_lot::Mutex;

use super::{send, Shared};
use crate::proto::{Bytes, Found, Reply, ServerMsg, WireCred};

/// Searches one connection runs at once.
pub const MAX_SEARCHES: usize = 4;
/// Results per [`Reply::Found`] frame.
pub const FOUND_PER_FRAME: usize = 256;
/// Longest silence while a search runs (an empty frame is sent).
pub const HEARTBEAT: Duration = Duration::from_secs(1);

/// The searches of one connection, by call id: their cancel flags.
#[derive(Default)]
pub struct Running {
    flags: Mutex<HashMap<u64, Arc<AtomicBool>>>,
}

impl Running {
    fn add(&self, id: u64) -> Option<Arc<AtomicBool>> {
        let mut f = self.flags.lock();
        if f.len() >= MAX_SEARCHES {
            return None;
        }
        let flag = Arc::new(AtomicBool::new(false));
        f.insert(id, flag.clone());
        Some(flag)
    }

    fn done(&self, id: u64) {
        self.flags.lock().remove(&id);
    }

    /// Stop the search of call `id` (nothing if it is over).
    pub fn cancel(&self, id: u64) {
        tracing::info!("search call {id}: cancel requested");
        if let Some(f) = self.flags.lock().get(&id) {
            f.store(true, Ordering::SeqCst);
        }
    }

    /// Stop every search (the connection ends).
    pub fn cancel_all(&self) {
        for f in self.flags.lock().values() {
            f.store(true, Ordering::SeqCst);
        }
    }
}

fn search_errno(e: &SearchError) -> i32 {
    match e {
        SearchError::InvalidPattern(..) | SearchError::EmptyPaths => libc::EINVAL,
        SearchError::NotADirectory(_) => libc::ENOTDIR,
        SearchError::Root(_, e) => e.errno(),
        SearchError::Spawn(_) => libc::EAGAIN,
        SearchError::Daemon(_) => libc::EIO,
    }
}

fn found(r: SearchResult) -> Found {
    Found {
        root: r.root,
        path: r.path,
        attr: r.stat,
        error: r.error.map(|e| (e.source as u8, e.errno)),
    }
}

/// The engine's request for backend paths `paths`: `/`-rooted within the served tree, joined
/// by `:` (EINVAL for a path that is not UTF-8 or holds a `:`); result paths stay relative.
fn request(paths: &[Bytes], pattern: String, flags: u32) -> Result<SearchRequest, i32> {
    let mut roots = Vec::with_capacity(paths.len());
    for p in paths {
        let p = std::str::from_utf8(&p.0).map_err(|_| libc::EINVAL)?;
        if p.contains(':') || p.starts_with('/') {
            return Err(libc::EINVAL);
        }
        roots.push(format!("/{p}"));
    }
    Ok(SearchRequest::new(
        roots.join(":"),
        pattern,
        Flags(flags & !Flags::INCLUDEROOT.0),
    ))
}

/// Answer call `id`, a search: start it on its own thread, or reply with an error.
pub(super) fn start(
    s: &Shared,
    id: u64,
    cred: &WireCred,
    paths: Vec<Bytes>,
    pattern: String,
    flags: u32,
) {
    let fail = |errno: i32| {
        send(
            &s.out,
            &ServerMsg::Reply {
                id,
                last: true,
                body: Err(errno),
            },
        );
    };
    let Some(root) = s.cfg.search_root.clone() else {
        return fail(libc::EOPNOTSUPP);
    };
    let source = if s.cfg.act_as_client {
        DirectSource::beneath(root, Some(Cred::from(cred)))
    } else if cred.uid == s.cfg.own.uid {
        DirectSource::beneath(root, None)
    } else {
        return fail(libc::EACCES);
    };
    let req = match request(&paths, pattern, flags) {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    let Some(cancel) = s.searches.add(id) else {
        return fail(libc::EBUSY);
    };
    let stream = match dircache_search::search_with(
        &req,
        Arc::new(source),
        &dircache_search::proto::daemon_search_options(),
    ) {
        Ok(st) => st,
        Err(e) => {
            s.searches.done(id);
            return fail(search_errno(&e));
        }
    };
    tracing::info!("search call {id}: {:?} in {:?}", req.pattern, req.paths);
    let out = s.out.clone();
    let running = s.searches.clone();
    let spawned = std::thread::Builder::new()
        .name("dircache-serve-search".into())
        .spawn(move || {
            let how = pump(stream, &cancel, |last, found| {
                send(
                    &out,
                    &ServerMsg::Reply {
                        id,
                        last,
                        body: found,
                    },
                )
            });
            running.done(id);
            tracing::info!("search call {id}: {how}");
        });
    if spawned.is_err() {
        s.searches.done(id);
        fail(libc::EAGAIN);
    }
}

/// Send a search's results as frames until it ends (`"complete"`), is cancelled
/// (`"cancelled"`) or a send fails (`"connection gone"`).
fn pump(
    mut stream: dircache_search::SearchStream,
    cancel: &AtomicBool,
    mut send: impl FnMut(bool, Result<Reply, i32>) -> bool,
) -> &'static str {
    const GONE: &str = "connection gone";
    let poll = Duration::from_millis(100);
    let mut batch: Vec<Found> = Vec::new();
    // At once: the client knows the search was taken.
    if !send(false, Ok(Reply::Found(Vec::new()))) {
        return GONE;
    }
    let mut last = Instant::now();
    loop {
        if cancel.load(Ordering::SeqCst) {
            send(true, Err(libc::ECANCELED));
            return "cancelled"; // dropping the stream stops the engine
        }
        match stream.next_batch(poll) {
            Batch::Results(rs) => {
                batch.extend(rs.into_iter().map(found));
                while batch.len() >= FOUND_PER_FRAME {
                    let rest = batch.split_off(FOUND_PER_FRAME);
                    if !send(false, Ok(Reply::Found(std::mem::replace(&mut batch, rest)))) {
                        return GONE;
                    }
                    last = Instant::now();
                }
            }
            Batch::Idle => {
                if !batch.is_empty() || last.elapsed() >= HEARTBEAT {
                    if !send(false, Ok(Reply::Found(std::mem::take(&mut batch)))) {
                        return GONE;
                    }
                    last = Instant::now();
                }
            }
            Batch::End => {
                return if send(true, Ok(Reply::Found(batch))) {
                    "complete"
                } else {
                    GONE
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dircache_core::{Error, FileType};
    use dircache_search::{RawEntry, Source};

    /// A tree without end: every directory holds one directory, listed slowly.
    struct Endless;

    impl Source for Endless {
        type Root = ();
        type Dir = ();
        fn open_root(&self, _: &[u8]) -> Result<(), Error> {
            Ok(())
        }
        fn open_dir(&self, _: &(), _: &[u8]) -> Result<(), Error> {
            Ok(())
        }
        fn dev(&self, _: &()) -> Result<u64, Error> {
            Ok(1)
        }
        fn read_dir(&self, _: &mut (), _: bool, out: &mut Vec<RawEntry>) -> Result<(), Error> {
            std::thread::sleep(Duration::from_millis(2));
            out.push(RawEntry {
                name: b"d".to_vec(),
                kind: Some(FileType::Directory),
                attr: None,
            });
            Ok(())
        }
        fn lstat(&self, _: &(), _: &[u8]) -> Result<dircache_core::Attr, Error> {
            Err(Error::NotFound)
        }
        fn access(&self, _: &(), _: &[u8], _: u32) -> bool {
            true
        }
    }

    #[test]
    fn a_cancelled_search_stops_and_says_so() {
        let stream = dircache_search::search_with(
            &SearchRequest::new("/", "*", Flags::NONE),
            Arc::new(Endless),
            &Default::default(),
        )
        .unwrap();
        let running = Running::default();
        let cancel = running.add(7).unwrap();
        let (tx, rx) = crossbeam_channel::unbounded();
        let t = std::thread::spawn(move || {
            pump(stream, &cancel, |last, body| tx.send((last, body)).is_ok())
        });
        // Results flow (the first frame, empty, at once; then matches).
        let mut found = 0;
        while found < 3 {
            match rx.recv_timeout(Duration::from_secs(10)).unwrap() {
                (false, Ok(Reply::Found(f))) => found += f.len(),
                other => panic!("{other:?}"),
            }
        }
        running.cancel(7);
        running.cancel(8); // unknown: nothing
        assert_eq!(t.join().unwrap(), "cancelled");
        let last = rx.iter().last().unwrap();
        assert_eq!(last, (true, Err(libc::ECANCELED)));
    }

    #[test]
    fn searches_per_connection_are_bounded() {
        let r = Running::default();
        let flags: Vec<_> = (0..MAX_SEARCHES as u64)
            .map(|i| r.add(i).unwrap())
            .collect();
        assert!(r.add(99).is_none());
        r.done(0);
        assert!(r.add(99).is_some());
        r.cancel_all();
        assert!(flags[1..].iter().all(|f| f.load(Ordering::SeqCst)));
    }

    #[test]
    fn requests_are_rooted_and_relative() {
        let r = request(
            &[Bytes(b"".to_vec()), Bytes(b"a/b".to_vec())],
            "*.c".into(),
            Flags::INCLUDEROOT.0 | Flags::METADATA.0,
        )
        .unwrap();
        assert_eq!(r.paths, "/:/a/b");
        assert_eq!(r.flags, Flags::METADATA);
        assert_eq!(
            request(&[Bytes(b"a:b".to_vec())], "*".into(), 0).unwrap_err(),
            libc::EINVAL
        );
        assert_eq!(
            request(&[Bytes(b"/etc".to_vec())], "*".into(), 0).unwrap_err(),
            libc::EINVAL
        );
        assert_eq!(
            request(&[Bytes(vec![0xff])], "*".into(), 0).unwrap_err(),
            libc::EINVAL
        );
    }
}
