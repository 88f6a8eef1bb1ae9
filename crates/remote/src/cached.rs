//! The server's cache: `dircache serve` answers through a [`dircache_core::Cache`] over the
//! local backend, so a client's whole-path request (a `Walk`, `Getattr`, `Lookup`) is one
//! fast-path probe (the direct-lookup table, SOSP'15 §3.1) once the path is cached, instead of
//! one `openat2` + `statx` per component.
//!
//! [`CachedBackend`] is itself a [`Backend`] (the server code is the same over either):
//!
//! * **Metadata** (`walk`, `lookup`, `getattr`, `readdir`, `readlink`, and the server's
//!   `Subtree` listings, which are readdirs) is answered by the cache, as the server's own
//!   credentials ([`Cache::kernel_checked`]: the client's kernel checks permissions with
//!   `default_permissions`, as for the FUSE front end; the local backend reads metadata as the
//!   server process, as before).
//! * **Mutations** (`mknod`, `mkdir`, `symlink`, `link`, `unlink`, `rmdir`, `rename`,
//!   `setattr`, `open` with `O_CREAT`) go through the cache's node API with the credentials the
//!   server acts with for that call (the caller's when the server runs as root, its own
//!   otherwise: docs/security.md P10), so the cache sees its own changes at once, as the FUSE
//!   front end's do. What an open file changes (writes, truncation, allocation, a chmod through
//!   the handle) makes the cache forget that file's attributes when the call returns.
//! * **Changes made on the server machine** (by programs there, or by another client's server)
//!   come from the local backend's change feed ([`Backend::watch`]), started when the
//!   `CachedBackend` is made: a thread applies each change to the cache
//!   ([`Cache::apply_change`]) and *then* forwards it to whoever called [`watch`](Backend::watch)
//!   (the server, which pushes it to its client as a callback). So when a client hears of a
//!   change, the server's next answer already reflects it.
//!
//! **Invariant (server cache).** Every answer is what the local backend would answer at some
//! instant between the call and the reply, except for a change made behind the cache's back
//! that the change feed has not reported yet (its latency, as for a local dircache mount; the
//! feed's limits are dircache_local::watch's). A change is applied to the cache before the
//! client is told of it. Without a change feed (`Backend::watch` gives none) the cache runs in
//! bypass mode: every query is one backend call, nothing is answered from memory.
//! Tests: `crates/remote/tests/server_cache.rs`.
//!
//! **Paths.** Backend paths never go through a symlink (module docs of
//! `dircache_core::backend`); the cache's path API follows symlinks in directory components.
//! A path is therefore answered from the cache only when the dentry it resolved to has exactly
//! that backend path (no symlink was followed); otherwise it is walked one component at a
//! time with [`Cache::lookup_child`] (which never follows), and a path that is not a clean
//! backend path, or that has a symlink before its last component, is passed to the local
//! backend unchanged (which refuses it as before).
//!
//! **Memory.** The cache holds at most `Config::max_entries` dentries (`dircache serve
//! --max-entries`, CLOCK eviction of leaves, core invariant I10); the server holds none
//! pinned.

use std::sync::{Arc, Weak};

use crossbeam_channel::{bounded, Sender, TrySendError};
use dircache_core::{
    At, Attr, Backend, BackendFile, Cache, Change, ChangeFeed, Config, Cred, Creds, DirEntry,
    Error, LookupFlags, NodeKind, NodeRef, RenameMode, Result, SetAttr, StatFs, StatsSnapshot,
    Walked, Whence, XattrTarget,
};
use parking_lot::Mutex;

/// Longest path given to the cache's path API (PATH_MAX bounds one path argument there);
/// longer backend paths are walked one component at a time.
const PATH_API_MAX: usize = 4000;

/// Changes waiting for the server's callback thread (beyond: `Overflow`, see `Subscriber`).
const FORWARD_QUEUE: usize = 4096;

/// A [`Backend`] answering through a core [`Cache`] over another backend (module docs).
pub struct CachedBackend {
    cache: Arc<Cache>,
    inner: Arc<dyn Backend>,
    /// The credentials metadata queries are made with (the server's own), interned once.
    meta: Creds,
    /// Where applied changes are forwarded (the server's callback threads).
    subscribers: Arc<Mutex<Vec<Subscriber>>>,
    /// Whether the cache follows a change feed (else it runs in bypass mode).
    coherent: bool,
}

/// How a backend path resolved.
enum Resolved {
    Node(NodeRef),
    Err(Error),
    /// Not a clean backend path, or through a symlink: ask the inner backend.
    Inner,
}

impl CachedBackend {
    /// A cache over `inner` with `config` (its `max_entries` bounds the server's memory),
    /// following `inner`'s change feed. `own` is the server's own credentials.
    pub fn new(inner: Arc<dyn Backend>, config: Config, own: Cred) -> Result<Arc<CachedBackend>> {
        let feed = match inner.watch() {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!("no change feed ({e}): the server's cache runs in bypass mode");
                None
            }
        };
        let config = if feed.is_some() {
            config
        } else {
            let max = config.max_entries;
            Config {
                max_entries: max,
                ..Config::bypass_mode()
            }
        };
        let cache = Cache::new(inner.clone(), config)?;
        let subscribers: Arc<Mutex<Vec<Subscriber>>> = Arc::default();
        let coherent = feed.is_some();
        if let Some(feed) = feed {
            let weak = Arc::downgrade(&cache);
            let subs = subscribers.clone();
            std::thread::Builder::new()
                .name("dircache-serve-feed".into())
                .spawn(move || apply_loop(feed, weak, subs))
                .map_err(|e| Error::Os(e.raw_os_error().unwrap_or(libc::EAGAIN)))?;
        }
        let meta = cache.kernel_checked(own);
        Ok(Arc::new(CachedBackend {
            cache,
            inner,
            meta,
            subscribers,
            coherent,
        }))
    }

    /// The cache (for its statistics and tests).
    pub fn cache(&self) -> &Arc<Cache> {
        &self.cache
    }

    /// The cache's counters.
    pub fn stats(&self) -> StatsSnapshot {
        self.cache.stats()
    }

    /// Whether the cache follows a change feed (false: bypass mode).
    pub fn is_coherent(&self) -> bool {
        self.coherent
    }

    fn meta(&self) -> Creds {
        self.meta.clone()
    }

    fn creds(&self, cred: &Cred) -> Creds {
        self.cache.kernel_checked(cred.clone())
    }

    /// The dentry of backend path `path` (module docs, "Paths").
    fn resolve(&self, c: &Creds, path: &[u8]) -> Resolved {
        if path.is_empty() {
            return Resolved::Node(self.cache.root());
        }
        if !clean(path) {
            return Resolved::Inner;
        }
        if path.len() < PATH_API_MAX {
            if let Ok(n) = self.cache.lookup(c, At::Root, path, LookupFlags::NOFOLLOW) {
                if self.cache.node_path(&n).is_ok_and(|p| p == path) {
                    return Resolved::Node(n);
                }
            }
        }
        let mut node = self.cache.root();
        let mut names = path.split(|&b| b == b'/').peekable();
        while let Some(name) = names.next() {
            if names.peek().is_some() && node.file_type() == Some(dircache_core::FileType::Symlink)
            {
                return Resolved::Inner;
            }
            node = match self.cache.lookup_child(c, &node, name) {
                Ok(n) => n,
                Err(e) => {
                    return match node.file_type() {
                        Some(dircache_core::FileType::Directory) => Resolved::Err(e),
                        _ => Resolved::Inner,
                    }
                }
            };
        }
        Resolved::Node(node)
    }

    /// `path`'s parent dentry and last name, for a mutation; `None`: ask the inner backend.
    fn parent_of<'p>(&self, c: &Creds, path: &'p [u8]) -> Option<Result<(NodeRef, &'p [u8])>> {
        if path.is_empty() || !clean(path) {
            return None;
        }
        let (dir, name) = match path.iter().rposition(|&b| b == b'/') {
            Some(i) => (&path[..i], &path[i + 1..]),
            None => (&b""[..], path),
        };
        match self.resolve(c, dir) {
            Resolved::Node(n) if n.file_type() == Some(dircache_core::FileType::Directory) => {
                Some(Ok((n, name)))
            }
            Resolved::Node(_) | Resolved::Inner => None,
            Resolved::Err(e) => Some(Err(e)),
        }
    }

    /// Resolve `path` for a query: `Ok(node)`, or the answer already known.
    fn node_for<T>(
        &self,
        c: &Creds,
        path: &[u8],
        inner: impl FnOnce(&dyn Backend) -> Result<T>,
    ) -> std::result::Result<NodeRef, Result<T>> {
        match self.resolve(c, path) {
            Resolved::Node(n) => Ok(n),
            Resolved::Err(e) => Err(Err(e)),
            Resolved::Inner => Err(inner(&*self.inner)),
        }
    }

    fn attr(&self, n: &NodeRef) -> Result<Attr> {
        self.cache.getattr(n)
    }

    /// After a change the cache did not make itself at `path` (an open that created or
    /// truncated, an xattr that may change the mode): forget what it knew there.
    fn changed_at(&self, path: &[u8], entry: bool) {
        let path = path.to_vec();
        self.cache.apply_change(&if entry {
            Change::Entry { path }
        } else {
            Change::Attr { path }
        });
    }
}

/// Apply each change of `feed` to the cache, then forward it to the subscribers; a change
/// at a path that names a hard-linked file is followed by the change of its inode
/// ([`linked_inode`]). Ends when the feed ends or the cache is gone.
fn apply_loop(feed: ChangeFeed, cache: Weak<Cache>, subs: Arc<Mutex<Vec<Subscriber>>>) {
    for change in feed {
        let Some(cache) = cache.upgrade() else {
            return;
        };
        cache.apply_change(&change);
        let inode = linked_inode(&**cache.backend(), &change);
        if let Some(i) = &inode {
            cache.apply_change(i);
        }
        drop(cache);
        let mut subs = subs.lock();
        for c in std::iter::once(&change).chain(&inode) {
            subs.retain_mut(|s| s.forward(c));
        }
    }
}

/// A change at a path (a chmod or a write through one name, a name made by `link`) that
/// names a non-directory with other links moves the attributes every other name of it shows,
/// which the feed reports by inode only when the event named no directory: the change by
/// inode, for the cache here and the client's (every cached name, and the client kernel's
/// inode). Asked of the local backend directly (one `statx`), not through the cache.
pub(crate) fn linked_inode(local: &dyn Backend, change: &Change) -> Option<Change> {
    let (Change::Attr { path } | Change::Entry { path }) = change else {
        return None;
    };
    let (dir, name) = match path.iter().rposition(|&b| b == b'/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (&[][..], &path[..]),
    };
    if name.is_empty() {
        return None;
    }
    let a = local.lookup(dir, name).ok()?;
    (a.nlink > 1 && !a.is_dir()).then_some(Change::Inode {
        dev: a.dev,
        ino: a.ino,
    })
}

/// One receiver of applied changes. The apply thread never waits for it (the cache must
/// stay coherent while a slow client's callbacks back up): a change that does not fit is
/// dropped and an `Overflow` (forget everything) goes first once there is room.
struct Subscriber {
    tx: Sender<Change>,
    lost: bool,
}

impl Subscriber {
    /// Forward `change`; false once the receiver is gone.
    fn forward(&mut self, change: &Change) -> bool {
        if self.lost {
            match self.tx.try_send(Change::Overflow) {
                Ok(()) => self.lost = false,
                Err(TrySendError::Full(_)) => return true,
                Err(TrySendError::Disconnected(_)) => return false,
            }
        }
        match self.tx.try_send(change.clone()) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) => {
                tracing::warn!("callbacks back up: the client will be told to forget everything");
                self.lost = true;
                true
            }
            Err(TrySendError::Disconnected(_)) => false,
        }
    }
}

/// One clean component.
fn is_name(name: &[u8]) -> bool {
    !name.contains(&b'/') && clean(name)
}

/// A backend path the cache can resolve as given: components neither empty, `.` nor `..`.
fn clean(path: &[u8]) -> bool {
    path.split(|&b| b == b'/')
        .all(|c| !c.is_empty() && c != b"." && c != b".." && !c.contains(&0))
}

impl Backend for CachedBackend {
    fn lookup(&self, dir: &[u8], name: &[u8]) -> Result<Attr> {
        if !is_name(name) {
            return self.inner.lookup(dir, name);
        }
        let path = crate::prefetch::join(dir, name);
        match self.node_for(&self.meta(), &path, |b| b.lookup(dir, name)) {
            Ok(n) => self.attr(&n),
            Err(r) => r,
        }
    }

    fn walk(&self, dir: &[u8], names: &[&[u8]]) -> Walked {
        let c = self.meta();
        if !names.iter().all(|n| is_name(n)) || !(dir.is_empty() || clean(dir)) {
            return self.inner.walk(dir, names);
        }
        // The whole path first: one probe when it is cached.
        let mut full = dir.to_vec();
        for n in names {
            full = crate::prefetch::join(&full, n);
        }
        if let Resolved::Node(n) = self.resolve(&c, &full) {
            let mut chain = Vec::with_capacity(names.len());
            let mut cur = Some(n);
            for _ in 0..names.len() {
                let Some(n) = cur else { break };
                cur = n.parent();
                chain.push(n);
            }
            if chain.len() == names.len() {
                let attrs: Result<Vec<Attr>> = chain.iter().rev().map(|n| self.attr(n)).collect();
                if let Ok(attrs) = attrs {
                    return Walked { attrs, error: None };
                }
            }
        }
        // It stops short: one component at a time, as the local backend walks.
        let mut node = match self.resolve(&c, dir) {
            Resolved::Node(n) if n.file_type() == Some(dircache_core::FileType::Directory) => n,
            Resolved::Err(e) => {
                return Walked {
                    attrs: Vec::new(),
                    error: Some(e),
                }
            }
            _ => return self.inner.walk(dir, names),
        };
        let mut out = Walked::default();
        for (i, name) in names.iter().enumerate() {
            let attr = self
                .cache
                .lookup_child(&c, &node, name)
                .and_then(|n| self.attr(&n).map(|a| (n, a)));
            match attr {
                Ok((n, a)) => {
                    out.attrs.push(a);
                    if i + 1 < names.len() && !a.is_dir() {
                        out.error = Some(Error::NotDir);
                        break;
                    }
                    node = n;
                }
                Err(e) => {
                    out.error = Some(e);
                    break;
                }
            }
        }
        out
    }

    fn getattr(&self, path: &[u8]) -> Result<Attr> {
        match self.node_for(&self.meta(), path, |b| b.getattr(path)) {
            Ok(n) => self.attr(&n),
            Err(r) => r,
        }
    }

    fn readdir(&self, path: &[u8], plus: bool) -> Result<Vec<DirEntry>> {
        let c = self.meta();
        match self.node_for(&c, path, |b| b.readdir(path, plus)) {
            Ok(n) => self.cache.readdir_node(&c, &n, plus),
            Err(r) => r,
        }
    }

    fn readlink(&self, path: &[u8]) -> Result<Vec<u8>> {
        match self.node_for(&self.meta(), path, |b| b.readlink(path)) {
            Ok(n) => self.cache.readlink_node(&n),
            Err(r) => r,
        }
    }

    fn mknod(&self, cred: &Cred, path: &[u8], mode: u32, rdev: u64) -> Result<Attr> {
        let c = self.creds(cred);
        match self.parent_of(&c, path) {
            Some(p) => p.and_then(|(d, name)| {
                let n = self.cache.mknod_at(&c, &d, name, mode, rdev)?;
                self.attr(&n)
            }),
            None => self.inner.mknod(cred, path, mode, rdev),
        }
    }

    fn mkdir(&self, cred: &Cred, path: &[u8], mode: u32) -> Result<Attr> {
        let c = self.creds(cred);
        match self.parent_of(&c, path) {
            Some(p) => p.and_then(|(d, name)| {
                let n = self.cache.mkdir_at(&c, &d, name, mode)?;
                self.attr(&n)
            }),
            None => self.inner.mkdir(cred, path, mode),
        }
    }

    fn symlink(&self, cred: &Cred, target: &[u8], path: &[u8]) -> Result<Attr> {
        let c = self.creds(cred);
        match self.parent_of(&c, path) {
            Some(p) => p.and_then(|(d, name)| {
                let n = self.cache.symlink_at(&c, &d, name, target)?;
                self.attr(&n)
            }),
            None => self.inner.symlink(cred, target, path),
        }
    }

    fn link(&self, cred: &Cred, old: &[u8], new: &[u8]) -> Result<Attr> {
        let c = self.creds(cred);
        let src = match self.resolve(&c, old) {
            Resolved::Node(n) => n,
            Resolved::Err(e) => return Err(e),
            Resolved::Inner => return self.inner.link(cred, old, new),
        };
        match self.parent_of(&c, new) {
            Some(p) => p.and_then(|(d, name)| {
                let n = self.cache.link_at(&c, &src, &d, name)?;
                self.attr(&n)
            }),
            None => self.inner.link(cred, old, new),
        }
    }

    fn unlink(&self, cred: &Cred, path: &[u8]) -> Result<()> {
        let c = self.creds(cred);
        match self.parent_of(&c, path) {
            Some(p) => p.and_then(|(d, name)| self.cache.unlink_at(&c, &d, name)),
            None => self.inner.unlink(cred, path),
        }
    }

    fn rmdir(&self, cred: &Cred, path: &[u8]) -> Result<()> {
        let c = self.creds(cred);
        match self.parent_of(&c, path) {
            Some(p) => p.and_then(|(d, name)| self.cache.rmdir_at(&c, &d, name)),
            None => self.inner.rmdir(cred, path),
        }
    }

    fn rename(&self, cred: &Cred, old: &[u8], new: &[u8], mode: RenameMode) -> Result<()> {
        let c = self.creds(cred);
        match (self.parent_of(&c, old), self.parent_of(&c, new)) {
            (Some(Err(e)), _) | (_, Some(Err(e))) => Err(e),
            (Some(Ok((op, on))), Some(Ok((np, nn)))) => {
                self.cache.rename_at(&c, &op, on, &np, nn, mode)
            }
            _ => self.inner.rename(cred, old, new, mode),
        }
    }

    fn setattr(&self, cred: &Cred, path: &[u8], set: &SetAttr) -> Result<Attr> {
        let c = self.creds(cred);
        match self.node_for(&c, path, |b| b.setattr(cred, path, set)) {
            Ok(n) => self.cache.setattr_node(&c, &n, set),
            Err(r) => r,
        }
    }

    fn statfs(&self, path: &[u8]) -> Result<StatFs> {
        self.inner.statfs(path)
    }

    fn open(
        &self,
        cred: &Cred,
        path: &[u8],
        flags: i32,
        mode: u32,
    ) -> Result<Box<dyn BackendFile>> {
        let f = self.inner.open(cred, path, flags, mode)?;
        // A creation or truncation is a change the cache did not make: it forgets the name
        // (and its parent's listing) or the attributes. Both are rare next to plain opens.
        if flags & libc::O_CREAT != 0 {
            self.changed_at(path, true);
        } else if flags & libc::O_TRUNC != 0 {
            self.changed_at(path, false);
        }
        Ok(self.wrap(f, path))
    }

    fn open_verified(
        &self,
        cred: &Cred,
        target: XattrTarget<'_>,
        flags: i32,
    ) -> Result<Box<dyn BackendFile>> {
        let f = self.inner.open_verified(cred, target, flags)?;
        Ok(self.wrap(f, target.path))
    }

    fn fsyncdir(&self, cred: &Cred, target: XattrTarget<'_>, datasync: bool) -> Result<()> {
        self.inner.fsyncdir(cred, target, datasync)
    }

    fn getxattr(&self, cred: &Cred, target: XattrTarget<'_>, name: &[u8]) -> Result<Vec<u8>> {
        self.inner.getxattr(cred, target, name)
    }

    fn listxattr(&self, cred: &Cred, target: XattrTarget<'_>) -> Result<Vec<u8>> {
        self.inner.listxattr(cred, target)
    }

    fn setxattr(
        &self,
        cred: &Cred,
        target: XattrTarget<'_>,
        name: &[u8],
        value: &[u8],
        flags: i32,
    ) -> Result<()> {
        let r = self.inner.setxattr(cred, target, name, value, flags);
        // An ACL changes the mode (and a directory's mode who may search it).
        self.changed_at(target.path, false);
        r
    }

    fn removexattr(&self, cred: &Cred, target: XattrTarget<'_>, name: &[u8]) -> Result<()> {
        let r = self.inner.removexattr(cred, target, name);
        self.changed_at(target.path, false);
        r
    }

    /// The changes the cache applied, in order, each forwarded after it was applied.
    fn watch(&self) -> Result<Option<ChangeFeed>> {
        if !self.coherent {
            return Ok(None);
        }
        let (tx, rx) = bounded(FORWARD_QUEUE);
        self.subscribers.lock().push(Subscriber { tx, lost: false });
        Ok(Some(rx))
    }
}

impl CachedBackend {
    /// An open file whose attribute-changing calls make the cache forget the file's
    /// attributes (by its dentry when the path resolves now, so a later rename through the
    /// cache is followed).
    fn wrap(&self, f: Box<dyn BackendFile>, path: &[u8]) -> Box<dyn BackendFile> {
        let node = match self.resolve(&self.meta(), path) {
            Resolved::Node(n) => Some(n),
            _ => None,
        };
        Box::new(CachedFile {
            f,
            node,
            cache: self.cache.clone(),
        })
    }
}

struct CachedFile {
    f: Box<dyn BackendFile>,
    node: Option<NodeRef>,
    cache: Arc<Cache>,
}

impl CachedFile {
    fn after<T>(&self, r: Result<T>) -> Result<T> {
        if let Some(n) = &self.node {
            if matches!(n.kind(), NodeKind::Positive(_)) {
                self.cache.forget_attr(n);
            }
        }
        r
    }
}

impl BackendFile for CachedFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        self.f.read_at(buf, offset)
    }
    fn write_at(&self, cred: &Cred, data: &[u8], offset: u64, append: bool) -> Result<usize> {
        self.after(self.f.write_at(cred, data, offset, append))
    }
    fn sync(&self, datasync: bool) -> Result<()> {
        self.f.sync(datasync)
    }
    fn allocate(&self, cred: &Cred, mode: i32, offset: u64, len: u64) -> Result<()> {
        self.after(self.f.allocate(cred, mode, offset, len))
    }
    fn seek(&self, offset: i64, whence: Whence) -> Result<u64> {
        self.f.seek(offset, whence)
    }
    fn set_size(&self, cred: &Cred, size: u64) -> Result<()> {
        self.after(self.f.set_size(cred, size))
    }
    fn setattr(&self, cred: &Cred, set: &SetAttr) -> Result<Attr> {
        let r = self.f.setattr(cred, set);
        // A mode or owner change of a directory changes who may search below it: the
        // cache's own rule for outside changes (revalidate, bump the subtree).
        if let Some(n) = &self.node {
            if n.file_type() == Some(dircache_core::FileType::Directory) && !n.is_dead() {
                if let Ok(p) = self.cache.node_path(n) {
                    self.cache.apply_change(&Change::Attr { path: p });
                    return r;
                }
            }
        }
        self.after(r)
    }
    fn attr(&self) -> Result<Attr> {
        self.f.attr()
    }
    fn writable(&self) -> bool {
        self.f.writable()
    }
    fn fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.f.fd()
    }
    fn as_caller(
        &self,
        cred: &Cred,
        shared: bool,
        f: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        self.f.as_caller(cred, shared, f)
    }
    fn copy_to(
        &self,
        cred: &Cred,
        offset_in: u64,
        dst: &dyn BackendFile,
        offset_out: u64,
        len: u64,
    ) -> Result<usize> {
        self.f.copy_to(cred, offset_in, dst, offset_out, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(p: &str) -> Change {
        Change::Entry {
            path: p.as_bytes().to_vec(),
        }
    }

    #[test]
    fn a_backed_up_subscriber_gets_an_overflow_not_a_hole() {
        let (tx, rx) = bounded(2);
        let mut s = Subscriber { tx, lost: false };
        for p in ["a", "b", "c"] {
            assert!(s.forward(&entry(p)));
        }
        assert!(s.lost, "c did not fit");
        assert_eq!(rx.try_recv(), Ok(entry("a")));
        assert_eq!(rx.try_recv(), Ok(entry("b")));
        assert!(s.forward(&entry("d")));
        assert_eq!(
            rx.try_recv(),
            Ok(Change::Overflow),
            "c was lost: forget everything"
        );
        assert_eq!(rx.try_recv(), Ok(entry("d")));
        drop(rx);
        assert!(!s.forward(&entry("e")), "a gone receiver is dropped");
    }
}
