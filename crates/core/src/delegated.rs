//! Searches a backend runs itself, next to its files ([`crate::Backend::search`]): a remote
//! backend sends one request and its server walks the tree (the paper's delegated search),
//! instead of the client paying a round trip per directory. The types mirror
//! `dircache_search`'s request and results without depending on that crate.

use std::time::Duration;

use crate::{Attr, Error};

/// One search: `paths` are backend paths (relative to the backend's root; empty for the root
/// itself), `pattern` and `flags` as `dircache_search::SearchRequest` takes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchCall {
    pub paths: Vec<Vec<u8>>,
    pub pattern: String,
    pub flags: u32,
}

/// One result: `root` indexes [`SearchCall::paths`], `path` is relative to that root (empty
/// for the root itself); an error met on the way carries `error: Some((source, errno))`,
/// `source` as `dircache_search::ErrorSource`'s discriminant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchHit {
    pub root: u32,
    pub path: Vec<u8>,
    pub attr: Option<Attr>,
    pub error: Option<(u8, i32)>,
}

/// What [`SearchHits::next`] yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SearchEvent {
    /// Some results.
    Hits(Vec<SearchHit>),
    /// Nothing within the wait; the search goes on.
    Idle,
    /// The search is over.
    End,
    /// The search failed as a whole (a bad pattern, the connection lost).
    Failed(Error),
}

/// A running delegated search. Dropping it cancels the search.
pub trait SearchHits: Send {
    /// The next results, waiting at most `wait`.
    fn next(&mut self, wait: Duration) -> SearchEvent;
}
