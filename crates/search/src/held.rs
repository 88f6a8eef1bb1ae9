//! Searches answered from a cache that holds the searched subtree whole ([`answer_held`]):
//! for a backend whose cached answers are kept fresh by the backend itself (a remote
//! mount's server callbacks, Coda's callback promises), a search over directories whose
//! listings are all complete in the cache needs no call at all: the engine runs over the
//! cached dentries, as a warm walk of the mount is answered from them. A directory whose
//! listing is not complete, an entry without attributes where the search needs them, a
//! directory with (possibly) a POSIX ACL that the caller does not own: the search is not
//! answered here (`None`), and the daemon delegates it to the backend as before
//! ([`crate::delegated`]).
//!
//! **Who may see what**: outside a FUSE request nobody has checked anything, so each
//! directory is checked here as the client's kernel checks it on a remote mount
//! (`default_permissions`: the mode bits of the attributes the server reported, for the
//! caller's uid, gid and groups, [`PosixPolicy`]), with the steps of [`crate::DirectSource`]:
//! search permission on every directory from the served root down to a directory opened,
//! read permission on the directory listed, search permission on it for attributes. The
//! client's kernel also applies the server's POSIX ACLs, which the mode bits cannot show:
//! a directory the caller does not own must be known to have none (the backend's listing
//! said it has no extended attributes at all, [`Backend::known_bare`], or the core's xattr
//! memo holds the ACL's absence, or one `getxattr` says so: at most [`ACL_CALLS`] calls per
//! search, then delegated). uid 0 is never answered here (the control socket cannot see a
//! caller's capabilities, and the server searches as uid 0 without them), nor a request with
//! access flags (R_OK/W_OK/X_OK follow symbolic links, as access(2) does).
//!
//! **Freshness**: what the cache holds is what a walk of the mount at the same moment would
//! see; a change on the server shows when its callback arrived, for the search as for the
//! walk (docs/remote.md, "Delegated search").
//!
//! The whole answer is computed before anything is sent (so that a search that meets a gap
//! can still be delegated): at most [`MAX_RESULTS`] results, else it is delegated.

use std::collections::HashMap;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dircache_core::{
    AccessPolicy, Attr, Backend, Cache, Cred, Error, FileType, NodeKind, NodeRef, PosixPolicy,
    XattrTarget, R_OK, X_OK,
};

use std::io::Write;

use crate::proto::{
    answer_batches, write_binary, write_frame, Encoding, ProtoError, Response, RESULTS_PER_FRAME,
};
use crate::source::{RawEntry, Source};
use crate::{Batch, Flags, Pattern, SearchOptions, SearchRequest, SearchResult};

/// Most results an answer from the cache holds in memory (beyond: delegated).
pub const MAX_RESULTS: usize = 1 << 20;
/// Most `getxattr` calls for ACLs one search makes before it is delegated instead.
pub const ACL_CALLS: usize = 4;
/// The core xattr memo's bit for `system.posix_acl_access` (as crates/fuse `lean::acl_bit`).
const ACL_ACCESS_BIT: u8 = 1;
const ACL_ACCESS: &[u8] = b"system.posix_acl_access";

/// Why a search is not answered from the cache (statistics, tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gap {
    /// The request or the caller is not one answered here (uid 0, access flags, a path that
    /// is not plain, a cache in bypass mode or without completeness).
    NotEligible,
    /// A directory's listing, or attributes needed, are not in the cache.
    NotCached,
    /// A directory may have a POSIX ACL (or too many needed a call to tell).
    Acl,
    /// More than [`MAX_RESULTS`] results.
    TooMany,
}

/// A [`Source`] over the dentries a [`Cache`] holds that never asks the backend for a
/// listing or attributes: where the cache has a gap it records it ([`HeldSource::gap`]) and
/// reports an error, and the caller throws the answer away.
pub struct HeldSource {
    cache: Arc<Cache>,
    cred: Cred,
    gap: std::sync::Mutex<Option<Gap>>,
    missed: AtomicBool,
    acl_calls: AtomicUsize,
    /// The search's pattern, when known: a listing leaves out the files it cannot match
    /// (by name alone, [`Pattern::may_match_name`]), which the engine would skip anyway.
    pattern: Option<Pattern>,
    /// Access already granted in this search, by dentry id (access(2) mask bits): the
    /// engine opens every directory from its root down, so each ancestor is checked once,
    /// not once per directory below it.
    granted: parking_lot::Mutex<HashMap<u64, u32>>,
    /// Set at the first gap: stops a walk on the calling thread ([`crate::search_collect`]).
    stop: Arc<AtomicBool>,
}

/// An opened directory: its dentry, its backend path (empty for the served root) and its
/// depth below the searched root.
pub struct HeldDir {
    node: NodeRef,
    path: Vec<u8>,
    depth: usize,
}

fn join(a: &[u8], b: &[u8]) -> Vec<u8> {
    if a.is_empty() {
        return b.to_vec();
    }
    let mut p = Vec::with_capacity(a.len() + 1 + b.len());
    p.extend_from_slice(a);
    p.push(b'/');
    p.extend_from_slice(b);
    p
}

impl HeldSource {
    pub fn new(cache: Arc<Cache>, cred: Cred) -> HeldSource {
        HeldSource {
            cache,
            cred,
            gap: std::sync::Mutex::new(None),
            missed: AtomicBool::new(false),
            acl_calls: AtomicUsize::new(0),
            pattern: None,
            granted: parking_lot::Mutex::new(HashMap::new()),
            stop: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Leave out of listings the files `pattern` cannot match (the search's own pattern).
    pub fn for_pattern(mut self, pattern: Pattern) -> HeldSource {
        self.pattern = Some(pattern);
        self
    }

    /// The first gap met, if any: the answer is then not the cache's to give.
    pub fn gap(&self) -> Option<Gap> {
        if !self.missed.load(Ordering::Acquire) {
            return None;
        }
        self.gap.lock().map_or(Some(Gap::NotCached), |g| *g)
    }

    fn miss(&self, g: Gap) -> Error {
        if let Ok(mut s) = self.gap.lock() {
            s.get_or_insert(g);
        }
        self.missed.store(true, Ordering::Release);
        self.stop.store(true, Ordering::Release);
        // Any error: the engine reports it as a result, which is thrown away.
        Error::Os(libc::EAGAIN)
    }

    /// A live positive dentry's attributes, or a gap.
    fn attr(&self, node: &NodeRef) -> Result<Attr, Error> {
        if node.is_dead() {
            return Err(self.miss(Gap::NotCached));
        }
        node.cached_attr().ok_or_else(|| self.miss(Gap::NotCached))
    }

    /// Whether `path` (attributes `a`) is known to have no access ACL.
    fn acl_absent(&self, path: &[u8], a: &Attr) -> Result<(), Error> {
        let backend: &Arc<dyn Backend> = self.cache.backend();
        let key = (a.dev, a.ino);
        if backend.known_bare(path) || self.cache.xattr_known_absent(key, a.birth, ACL_ACCESS_BIT) {
            return Ok(());
        }
        if self.acl_calls.fetch_add(1, Ordering::AcqRel) >= ACL_CALLS {
            return Err(self.miss(Gap::Acl));
        }
        let gen = self.cache.xattr_memo_gen();
        let target = XattrTarget {
            path,
            expect: Some(key),
            birth: a.birth,
            open: None,
        };
        match backend.getxattr(&self.cred, target, ACL_ACCESS) {
            Err(e) if e.errno() == libc::ENODATA => {
                self.cache
                    .note_xattr_absent(key, a.birth, ACL_ACCESS_BIT, gen);
                Ok(())
            }
            Err(e) if e.errno() == libc::EOPNOTSUPP => Ok(()),
            _ => Err(self.miss(Gap::Acl)),
        }
    }

    /// May the caller access directory `node` (at `path`) for `mask`, as the client's kernel
    /// decides (module docs)? `Err(Error::Access)` when not; a gap when it cannot be told.
    fn may(&self, node: &NodeRef, path: &[u8], mask: u32) -> Result<(), Error> {
        let id = node.id();
        if self
            .granted
            .lock()
            .get(&id)
            .is_some_and(|g| g & mask == mask)
        {
            return Ok(());
        }
        let a = self.attr(node)?;
        if a.uid != self.cred.uid {
            self.acl_absent(path, &a)?;
        }
        PosixPolicy.permission(&self.cred, &a, mask)?;
        *self.granted.lock().entry(id).or_default() |= mask;
        Ok(())
    }

    /// The live child `name` of `dir` as cached: `Ok(None)` when the complete listing does
    /// not hold it (it does not exist).
    fn child(&self, dir: &HeldDir, name: &[u8]) -> Result<Option<NodeRef>, Error> {
        if !dir.node.is_complete() || dir.node.is_pending() || dir.node.is_dead() {
            return Err(self.miss(Gap::NotCached));
        }
        Ok(dir
            .node
            .cached_child(name)
            .filter(|c| !c.is_dead() && matches!(c.kind(), NodeKind::Positive(_))))
    }
}

impl Source for HeldSource {
    type Root = HeldDir;
    type Dir = HeldDir;

    /// `path` is absolute within the served tree (`/` its root), plain (checked by the
    /// caller). Opened as `O_PATH` is: search permission on every directory above it.
    fn open_root(&self, path: &[u8]) -> Result<HeldDir, Error> {
        let rel = path.strip_prefix(b"/").unwrap_or(path);
        let rel = rel.strip_suffix(b"/").unwrap_or(rel);
        let mut cur = HeldDir {
            node: self.cache.root(),
            path: Vec::new(),
            depth: 0,
        };
        if !rel.is_empty() {
            for c in rel.split(|b| *b == b'/') {
                self.may(&cur.node, &cur.path, X_OK)?;
                let Some(n) = self.child(&cur, c)? else {
                    return Err(Error::NotFound);
                };
                cur = HeldDir {
                    path: join(&cur.path, c),
                    node: n,
                    depth: 0,
                };
            }
        }
        match cur.node.kind() {
            NodeKind::Positive(FileType::Directory) => Ok(cur),
            NodeKind::Positive(_) => Err(Error::NotDir),
            NodeKind::Negative(e) => Err(e),
        }
    }

    /// Search permission from the root down, read permission on the directory itself (as
    /// `openat2(O_RDONLY | O_DIRECTORY)` beneath the root).
    fn open_dir(&self, root: &HeldDir, rel: &[u8]) -> Result<HeldDir, Error> {
        let mut cur = HeldDir {
            node: root.node.clone(),
            path: root.path.clone(),
            depth: 0,
        };
        if !rel.is_empty() {
            for c in rel.split(|b| *b == b'/') {
                self.may(&cur.node, &cur.path, X_OK)?;
                let Some(n) = self.child(&cur, c)? else {
                    return Err(Error::NotFound);
                };
                match n.kind() {
                    NodeKind::Positive(FileType::Directory) => {}
                    // A symbolic link is not followed (RESOLVE_NO_SYMLINKS: ELOOP).
                    NodeKind::Positive(FileType::Symlink) => return Err(Error::Loop),
                    _ => return Err(Error::NotDir),
                }
                cur = HeldDir {
                    path: join(&cur.path, c),
                    node: n,
                    depth: cur.depth + 1,
                };
            }
        }
        self.may(&cur.node, &cur.path, R_OK)?;
        if !cur.node.is_complete() || cur.node.is_pending() {
            return Err(self.miss(Gap::NotCached));
        }
        Ok(cur)
    }

    fn dev(&self, dir: &HeldDir) -> Result<u64, Error> {
        Ok(self.attr(&dir.node)?.dev)
    }

    fn read_dir(
        &self,
        dir: &mut HeldDir,
        plus: bool,
        out: &mut Vec<RawEntry>,
    ) -> Result<(), Error> {
        if !dir.node.is_complete() || dir.node.is_pending() || dir.node.is_dead() {
            return Err(self.miss(Gap::NotCached));
        }
        // Attributes need search permission on the directory (statx of each name); without
        // it the direct source reports the entries without them.
        let with_attrs = plus && self.may(&dir.node, &dir.path, X_OK).is_ok();
        if self.missed.load(Ordering::Acquire) {
            return Err(self.miss(Gap::NotCached));
        }
        // Entries straight from the dentries under the directory's read lock (nothing here
        // calls into the cache); a file whose name the pattern cannot match is not copied out.
        let depth = dir.depth + 1;
        let mut gap = false;
        dir.node.for_each_cached_child(|k| {
            if gap || k.is_dead() {
                return;
            }
            let NodeKind::Positive(kind) = k.kind() else {
                return;
            };
            if kind != FileType::Directory {
                if let Some(p) = &self.pattern {
                    if !k.with_name(|n| p.may_match_name(depth, n)) {
                        return;
                    }
                }
            }
            let attr = if with_attrs {
                match k.cached_attr() {
                    Some(a) => Some(a),
                    None => {
                        gap = true;
                        return;
                    }
                }
            } else {
                None
            };
            out.push(RawEntry {
                name: k.name(),
                kind: Some(kind),
                attr,
            });
        });
        if gap {
            return Err(self.miss(Gap::NotCached));
        }
        // In no particular order (the cache's children are in none; a native search's are in
        // getdents order, on several threads): sorting each listing took 15% of a search.
        Ok(())
    }

    fn lstat(&self, dir: &HeldDir, name: &[u8]) -> Result<Attr, Error> {
        self.may(&dir.node, &dir.path, X_OK)?;
        match self.child(dir, name)? {
            Some(n) => self.attr(&n),
            None => Err(Error::NotFound),
        }
    }

    fn access(&self, _dir: &HeldDir, _name: &[u8], _mask: u32) -> bool {
        // Requests with access flags are not answered here (module docs).
        let _ = self.miss(Gap::NotEligible);
        false
    }
}

/// Whether `request` from `cred` may be answered from `cache` at all (module docs).
fn eligible(cache: &Cache, request: &SearchRequest, cred: &Cred) -> bool {
    let cfg = cache.config();
    cred.uid != 0
        && request.flags.access_mask() == 0
        && !cfg.bypass
        && cfg.completeness
        && crate::delegated::call_for(request).is_some()
}

/// Run `request` over what `cache` holds, for `cred`: every result, or the gap that keeps
/// the cache from answering.
pub fn search_held(
    cache: &Arc<Cache>,
    request: &SearchRequest,
    cred: &Cred,
) -> Result<Vec<SearchResult>, Gap> {
    if !eligible(cache, request, cred) {
        return Err(Gap::NotEligible);
    }
    // The paths as the daemon takes them: absolute within the served tree, results relative
    // to their root (the client puts the roots back).
    let mut req = request.clone();
    req.flags = Flags(req.flags.0 & !Flags::INCLUDEROOT.0);
    let pattern = request.validate().map_err(|_| Gap::NotEligible)?;
    let source = Arc::new(HeldSource::new(cache.clone(), cred.clone()).for_pattern(pattern));
    // 0 (the default): the walk runs on the calling thread; N: on N threads (measurements:
    // docs/remote.md, "Delegated search").
    let threads = std::env::var("DIRCACHE_HELD_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(0);
    if threads == 0 {
        let stop = source.stop.clone();
        let all = crate::search_collect(&req, source.clone(), &SearchOptions::default(), stop)
            .map_err(|_| Gap::NotEligible)?;
        return match source.gap() {
            Some(g) => Err(g),
            None if all.len() > MAX_RESULTS => Err(Gap::TooMany),
            None => Ok(all),
        };
    }
    let opts = SearchOptions {
        // The workers never wait for this thread to take their batches (one batch per
        // directory: a hand-over each, which costs a wake-up each on a loaded machine).
        threads,
        channel_batches: 4096,
        ..Default::default()
    };
    let mut stream =
        crate::search_with(&req, source.clone(), &opts).map_err(|_| Gap::NotEligible)?;
    let canceller = stream.canceller();
    let mut all = Vec::new();
    loop {
        match stream.next_batch(Duration::from_secs(1)) {
            Batch::Results(r) => {
                all.extend(r);
                if all.len() > MAX_RESULTS {
                    canceller.cancel();
                    return Err(Gap::TooMany);
                }
            }
            Batch::Idle => {}
            Batch::End => break,
        }
        if source.gap().is_some() {
            canceller.cancel();
            break;
        }
    }
    match source.gap() {
        Some(g) => Err(g),
        None => Ok(all),
    }
}

/// Answer `request` on `sock` from `cache` when it holds the searched subtree whole
/// ([`search_held`]), its results frames in `enc`; `None` (nothing written) when it does not,
/// and the caller delegates.
pub fn answer_held(
    sock: &UnixStream,
    request: &SearchRequest,
    cache: &Arc<Cache>,
    cred: &Cred,
    enc: Encoding,
) -> Option<Result<(), ProtoError>> {
    let results = match search_held(cache, request, cred) {
        Ok(r) => r,
        Err(_) => return None,
    };
    if enc == Encoding::Binary {
        // Every result is known: a few large frames, one write each (no per-directory
        // hand-over, no JSON).
        return Some(answer_all_binary(sock, &results));
    }
    // A frame's worth at a time (answer_batches splits a big batch by moving the rest).
    let mut results = results.into_iter();
    Some(answer_batches(sock, enc, move |_| {
        let frame: Vec<SearchResult> = results.by_ref().take(RESULTS_PER_FRAME).collect();
        Ok(if frame.is_empty() {
            Batch::End
        } else {
            Batch::Results(frame)
        })
    }))
}

/// The whole answer at once in binary results frames: the first (empty) frame, the results,
/// End.
fn answer_all_binary(sock: &UnixStream, results: &[SearchResult]) -> Result<(), ProtoError> {
    let mut w = std::io::BufWriter::with_capacity(256 * 1024, sock);
    let mut body = Vec::with_capacity(crate::proto::BIN_FRAME_BYTES + 4096);
    write_binary(&mut w, &mut body, &[])?;
    write_binary(&mut w, &mut body, results)?;
    write_frame(&mut w, &Response::End)?;
    w.flush().map_err(ProtoError::Io)
}
