//! The client side of a delegated search: [`RemoteBackend`]'s [`Backend::search`]
//! (dircache_core::Backend) sends one [`Request::Search`] with the caller's credentials and
//! yields the [`Reply::Found`] frames as they arrive; dropping the search before its end sends
//! [`Request::Cancel`].

use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError};
use dircache_core::{Cred, Error, Result, SearchCall, SearchEvent, SearchHit, SearchHits};

use super::{eio, Conn, Frame, RemoteBackend};
use crate::proto::{features, Bytes, Reply, Request, WireCred};

impl RemoteBackend {
    /// [`dircache_core::Backend::search`]: `None` when the server does not offer searches.
    pub(super) fn search_remote(
        &self,
        cred: &Cred,
        call: &SearchCall,
    ) -> Option<Result<Box<dyn SearchHits>>> {
        if self.conn.lock().features & features::SEARCH == 0 {
            return None;
        }
        let req = Request::Search {
            paths: call.paths.iter().map(|p| Bytes(p.clone())).collect(),
            pattern: call.pattern.clone(),
            flags: call.flags,
        };
        let started = self
            .conn()
            .and_then(|c| c.start_id(&WireCred::from(cred), req).map(|s| (c, s)));
        Some(started.map(|(conn, (id, rx))| {
            Box::new(Delegated {
                conn,
                id,
                rx,
                done: false,
            }) as Box<dyn SearchHits>
        }))
    }
}

/// A search running on the server.
struct Delegated {
    conn: Arc<Conn>,
    id: u64,
    rx: Receiver<Frame>,
    /// The last frame came (or the call failed): nothing to cancel.
    done: bool,
}

impl SearchHits for Delegated {
    fn next(&mut self, wait: Duration) -> SearchEvent {
        if self.done {
            return SearchEvent::End;
        }
        match self.rx.recv_timeout(wait) {
            Ok(Ok((last, Ok(Reply::Found(found))))) => {
                self.done = last;
                if found.is_empty() {
                    return if last {
                        SearchEvent::End
                    } else {
                        SearchEvent::Idle
                    };
                }
                SearchEvent::Hits(
                    found
                        .into_iter()
                        .map(|f| SearchHit {
                            root: f.root,
                            path: f.path,
                            attr: f.attr,
                            error: f.error,
                        })
                        .collect(),
                )
            }
            Ok(Ok((_, Ok(_)))) => {
                self.done = true;
                SearchEvent::Failed(Error::Os(libc::EPROTO))
            }
            Ok(Ok((_, Err(errno)))) => {
                self.done = true;
                SearchEvent::Failed(Error::from_errno(errno))
            }
            Err(RecvTimeoutError::Timeout) => SearchEvent::Idle,
            Ok(Err(())) | Err(RecvTimeoutError::Disconnected) => {
                self.done = true;
                SearchEvent::Failed(eio())
            }
        }
    }
}

impl Drop for Delegated {
    fn drop(&mut self) {
        if !self.done {
            // The server stops it and ends the call; its last frame finds no one waiting.
            let _ = self
                .conn
                .start(&self.conn.own.clone(), Request::Cancel { call: self.id });
        }
    }
}
