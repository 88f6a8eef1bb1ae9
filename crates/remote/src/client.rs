//! The client side: [`RemoteBackend`], a [`Backend`] whose files live behind a dircache server,
//! over any [`Transport`] (a child process's stdin/stdout, such as `ssh host dircache serve
//! --stdio DIR`; a TCP or unix stream).
//!
//! Calls from any number of threads are in flight at once: each gets a fresh id, registers a
//! reply slot, writes its frame (under a short lock) and waits; one reader thread takes every
//! frame the server sends and hands replies to their slots by id, and turns callbacks into the
//! [`ChangeFeed`] that [`Backend::watch`] returns (so the core cache and the FUSE front end
//! apply them as they apply a local backend's changes). When the connection ends, every call
//! waiting gets EIO at once, later calls get EIO, and the change feed reports
//! [`Change::Overflow`] (every callback promise is broken: the cache forgets what it knew).

use std::collections::HashMap;
use std::io::{BufWriter, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, unbounded, Receiver, Sender, TrySendError};
use dircache_core::{
    Attr, Backend, BackendFile, Change, ChangeFeed, Cred, DirEntry, Error, RenameMode, Result,
    SetAttr, StatFs, Walked, Whence, XattrTarget, XATTR_UNSUPPORTED,
};
use parking_lot::Mutex;

mod bulk;
pub mod cml;
pub mod container;
pub mod disconnected;
mod hostile;
mod noopen;
mod reopen;
mod search;
mod statfs;

pub use container::{ContainerConfig, ContainerFile, ContainerStats, Containers};
pub use disconnected::Disconnected;

use crate::frame::{read_frame, write_frame};
use crate::prefetch::{join, stale_of, Prefetch, Stale};
use crate::proto::{
    decode, encode, features, Bytes, ClientMsg, Hello, OpenHow, ProtoError, Reply, Request,
    ServerMsg, SubtreeDir, Target, WireCred, MAX_CLIENT_FRAME, MAX_IO, MAX_SERVER_FRAME,
    REQUEST_KINDS,
};

/// The two directions of a byte stream, and whatever must live as long as they do.
pub struct Halves {
    pub read: Box<dyn Read + Send>,
    pub write: Box<dyn Write + Send>,
    /// Dropped after both halves (a child process to reap, say).
    pub keep: Box<dyn Send>,
    /// Ends the stream both ways (shutdown(2) of a socket whose halves are two descriptors),
    /// so the reader sees end of file; `None` when dropping the write half is enough.
    pub close: Option<Box<dyn FnOnce() + Send>>,
}

/// Any bidirectional byte stream a client can talk to a server over.
pub trait Transport: Send {
    fn into_halves(self: Box<Self>) -> std::io::Result<Halves>;
}

impl Transport for std::net::TcpStream {
    fn into_halves(self: Box<Self>) -> std::io::Result<Halves> {
        let _ = self.set_nodelay(true);
        let s = self.try_clone()?;
        Ok(Halves {
            read: Box::new(self.try_clone()?),
            write: Box::new(*self),
            keep: Box::new(()),
            close: Some(Box::new(move || {
                let _ = s.shutdown(std::net::Shutdown::Both);
            })),
        })
    }
}

impl Transport for std::os::unix::net::UnixStream {
    fn into_halves(self: Box<Self>) -> std::io::Result<Halves> {
        let s = self.try_clone()?;
        Ok(Halves {
            read: Box::new(self.try_clone()?),
            write: Box::new(*self),
            keep: Box::new(()),
            close: Some(Box::new(move || {
                let _ = s.shutdown(std::net::Shutdown::Both);
            })),
        })
    }
}

/// A child process spoken to on its stdin and stdout (`ssh host dircache serve --stdio DIR`,
/// or `dircache serve --stdio DIR` itself). Its stderr is inherited. When the connection is
/// dropped the child's stdin closes (a server exits at end of input); a child still running
/// [`ChildTransport::GRACE`] later is killed and reaped.
pub struct ChildTransport {
    child: Child,
}

impl ChildTransport {
    /// How long a child may take to exit after its input closed.
    pub const GRACE: Duration = Duration::from_secs(3);

    /// Start `cmd` with piped stdin and stdout.
    pub fn spawn(mut cmd: Command) -> std::io::Result<ChildTransport> {
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
        Ok(ChildTransport {
            child: cmd.spawn()?,
        })
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let end = Instant::now() + ChildTransport::GRACE;
        loop {
            match self.0.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) if Instant::now() >= end => break,
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Transport for ChildTransport {
    fn into_halves(mut self: Box<Self>) -> std::io::Result<Halves> {
        let missing = || std::io::Error::other("child without piped stdio");
        let write = self.child.stdin.take().ok_or_else(missing)?;
        let read = self.child.stdout.take().ok_or_else(missing)?;
        Ok(Halves {
            read: Box::new(read),
            write: Box::new(write),
            keep: Box::new(Reap(self.child)),
            close: None,
        })
    }
}

/// One reply frame: whether it is the last, and its body; `Err(())` when the connection ended.
type Frame = std::result::Result<(bool, std::result::Result<Reply, i32>), ()>;
type Slot = Sender<Frame>;

struct Conn {
    writer: Mutex<BufWriter<Box<dyn Write + Send>>>,
    pending: Mutex<HashMap<u64, Slot>>,
    next: AtomicU64,
    closed: AtomicBool,
    /// The change feed (shared by every connection of one backend).
    callbacks: Arc<Mutex<Option<Sender<Change>>>>,
    /// A callback could not be queued (the feed was full): send Overflow before the next.
    lost: Arc<AtomicBool>,
    features: u64,
    /// Credentials sent with calls that carry none (queries).
    own: WireCred,
    keep: Mutex<Option<Box<dyn Send>>>,
    prefetch: Arc<Mutex<Prefetch>>,
    /// Mutations in flight: call id -> their id in the prefetch buffer, ended when their last
    /// reply frame arrives (crate::prefetch).
    mutating: Mutex<HashMap<u64, u64>>,
    /// Mutations in flight changing names (features::PARENTS): call id -> their sequence
    /// number in `Prefetch::parents` and the directories they change.
    parents_of: Mutex<HashMap<u64, ParentsOf>>,
    close: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    round_trips: Arc<CallCounts>,
    /// Container files, told about callbacks (client/container.rs).
    containers: Option<Arc<Containers>>,
    /// Disconnected operation (client/disconnected.rs): a loss keeps the promises until
    /// the reconnection.
    disconnected: Option<Arc<Disconnected>>,
    /// Callbacks dropped: a new connection after a disconnection, until the `Overflow` that
    /// subsumes them is sent (client/reopen.rs, `Link::install`).
    pub(super) muted: AtomicBool,
    /// [`ClientConfig::max_call_entries`].
    max_call_entries: u64,
}

/// Calls sent, in all and by kind (`dircache stats`: `backend.calls_<kind>`): what a
/// workload's round trips are.
pub(crate) struct CallCounts {
    total: AtomicU64,
    by_kind: [AtomicU64; REQUEST_KINDS.len()],
}

impl CallCounts {
    pub(crate) fn new() -> CallCounts {
        CallCounts {
            total: AtomicU64::new(0),
            by_kind: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    fn count(&self, req: &Request) {
        self.total.fetch_add(1, Ordering::Relaxed);
        if let Some(n) = self.by_kind.get(req.kind()) {
            n.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn of(&self, kind: &str) -> u64 {
        REQUEST_KINDS
            .iter()
            .position(|k| *k == kind)
            .and_then(|i| self.by_kind.get(i))
            .map_or(0, |n| n.load(Ordering::Relaxed))
    }

    /// The kinds called at least once, as `calls_<Kind>` counters.
    fn counters(&self) -> Vec<(&'static str, u64)> {
        CALL_COUNTER_NAMES
            .iter()
            .zip(&self.by_kind)
            .map(|(name, n)| (*name, n.load(Ordering::Relaxed)))
            .filter(|(_, n)| *n > 0)
            .collect()
    }
}

/// `calls_<Kind>` for each of [`REQUEST_KINDS`] (static names for `Backend::counters`).
const CALL_COUNTER_NAMES: [&str; REQUEST_KINDS.len()] = [
    "calls_Walk",
    "calls_Lookup",
    "calls_Getattr",
    "calls_Readdir",
    "calls_Subtree",
    "calls_Readlink",
    "calls_Mknod",
    "calls_Mkdir",
    "calls_Symlink",
    "calls_Link",
    "calls_Unlink",
    "calls_Rmdir",
    "calls_Rename",
    "calls_Setattr",
    "calls_Statfs",
    "calls_Getxattr",
    "calls_Listxattr",
    "calls_Setxattr",
    "calls_Removexattr",
    "calls_Fsyncdir",
    "calls_Open",
    "calls_OpenVerified",
    "calls_Read",
    "calls_Write",
    "calls_Sync",
    "calls_Allocate",
    "calls_Seek",
    "calls_SetSize",
    "calls_FileSetattr",
    "calls_FileAttr",
    "calls_Close",
    "calls_Search",
    "calls_Cancel",
    "calls_OpenPlus",
    "calls_Store",
];

/// A mutation's sequence number in `Prefetch::parents` and the directories it changes.
type ParentsOf = (u64, Vec<Vec<u8>>);

/// Callbacks queued for the cache at most; past that they collapse into one Overflow.
const FEED_CAPACITY: usize = 65536;

/// The request's name and path argument, for the trace log (what a workload's round trips
/// are).
fn kind_of(msg: &ClientMsg) -> String {
    let d = format!("{msg:?}");
    let d = d.split_once("req: ").map(|x| x.1).unwrap_or(&d);
    d.chars().take(60).collect()
}

fn eio() -> Error {
    Error::Os(libc::EIO)
}

/// What a mutation named by paths makes stale in the prefetch buffer (crate::prefetch): what
/// callbacks for its paths would, and every listing of another name of an inode whose
/// attributes it may move ([`Stale::Linked`]). `None` for a call on a handle (no path: the
/// caller knows it) or any other.
fn stale_of_request(req: &Request) -> Option<Vec<Stale>> {
    let linked = |mut v: Vec<Stale>| {
        v.push(Stale::Linked);
        v
    };
    let of_target = |t: &Target| {
        let mut v = linked(stale_of(&t.path));
        if let Some((_, ino)) = t.expect {
            v.push(Stale::Ino(ino));
        }
        v
    };
    Some(match req {
        Request::Mknod { path, .. } | Request::Mkdir { path, .. } | Request::Rmdir { path } => {
            stale_of(path)
        }
        Request::Symlink { path, .. } => stale_of(path),
        Request::Unlink { path } | Request::Setattr { path, .. } => linked(stale_of(path)),
        Request::Link { old, new } | Request::Rename { old, new, .. } => {
            let mut v = stale_of(old);
            v.extend(stale_of(new));
            linked(v)
        }
        // O_CREAT makes an entry; O_TRUNC moves an existing inode's attributes.
        Request::Open { path, .. } => linked(stale_of(path)),
        Request::OpenVerified { target, .. }
        | Request::Setxattr { target, .. }
        | Request::Removexattr { target, .. } => of_target(target),
        Request::OpenPlus { how, .. } => match how {
            OpenHow::Path { path, .. } => linked(stale_of(path)),
            OpenHow::Verified { target, .. } => of_target(target),
        },
        _ => return None,
    })
}

impl Conn {
    /// Send a call; the receiver gets its reply frames, or an error if the connection ends.
    fn start(&self, cred: &WireCred, req: Request) -> Result<Receiver<Frame>> {
        self.start_id(cred, req).map(|(_, rx)| rx)
    }

    /// [`Conn::start`], also returning the call's id.
    fn start_id(&self, cred: &WireCred, req: Request) -> Result<(u64, Receiver<Frame>)> {
        self.start_touching(cred, req, None)
    }

    /// [`Conn::start_id`]; a mutation (`Request::mutates`) makes stale, in the prefetch buffer,
    /// what its paths touch ([`stale_of_request`]), or `stale` when given (calls on a handle
    /// carry no path), or everything when neither is known.
    fn start_touching(
        &self,
        cred: &WireCred,
        req: Request,
        stale: Option<Vec<Stale>>,
    ) -> Result<(u64, Receiver<Frame>)> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        if req.mutates() {
            let stale = stale
                .or_else(|| stale_of_request(&req))
                .unwrap_or_else(|| vec![Stale::Tree(Vec::new())]);
            // Registered before the call is sent: its reply ends it (Conn::reader).
            let m = self.prefetch.lock().mutation_begin(stale);
            self.mutating.lock().insert(id, m);
            if self.features & features::PARENTS != 0 {
                let mut dirs: Vec<Vec<u8>> = Vec::new();
                for p in req.names_changed() {
                    let d = crate::prefetch::parent(p).to_vec();
                    if !dirs.contains(&d) {
                        dirs.push(d);
                    }
                }
                if !dirs.is_empty() {
                    let seq = self.prefetch.lock().parents.begin(&dirs);
                    self.parents_of.lock().insert(id, (seq, dirs));
                }
            }
        }
        let (tx, rx) = unbounded();
        self.pending.lock().insert(id, tx);
        if self.closed.load(Ordering::SeqCst) {
            self.pending.lock().remove(&id);
            self.mutation_over(id);
            return Err(eio());
        }
        let msg = ClientMsg::Call {
            id,
            cred: cred.clone(),
            req,
        };
        let sent = encode(&msg).map_err(|e| {
            tracing::error!("cannot encode a call: {e}");
            self.pending.lock().remove(&id);
            self.mutation_over(id);
            Error::Invalid
        })?;
        let mut w = self.writer.lock();
        let r = write_frame(&mut *w, &sent, MAX_CLIENT_FRAME)
            .map_err(|e| match e {
                crate::frame::FrameError::TooLarge { .. } => Error::Os(libc::E2BIG),
                _ => eio(),
            })
            .and_then(|()| w.flush().map_err(|_| eio()));
        drop(w);
        if let Err(e) = r {
            self.pending.lock().remove(&id);
            self.mutation_over(id);
            if e == eio() {
                // The stream is broken (the server is gone): ended from now on, before the
                // reader has seen end of file (a store-back failing here is logged while
                // disconnected: client/container.rs).
                self.closed.store(true, Ordering::SeqCst);
            }
            return Err(e);
        }
        if let ClientMsg::Call { req, .. } = &msg {
            self.round_trips.count(req);
        }
        tracing::trace!(call = %kind_of(&msg), "remote call");
        Ok((id, rx))
    }

    /// Tell the server a caller waits for `dir` (relative to the call's root) of `Subtree`
    /// call `call` ([`ClientMsg::Hurry`]; no reply). Whether it was sent.
    fn hurry(&self, call: u64, dir: &[u8]) -> bool {
        if self.features & features::HURRY == 0 || self.closed.load(Ordering::SeqCst) {
            return false;
        }
        let Ok(msg) = encode(&ClientMsg::Hurry {
            call,
            dir: dir.to_vec(),
        }) else {
            return false;
        };
        let mut w = self.writer.lock();
        write_frame(&mut *w, &msg, MAX_CLIENT_FRAME).is_ok() && w.flush().is_ok()
    }

    /// Mutation call `id` is over (answered, or never sent): bulk calls that start from now
    /// on are read after it.
    fn mutation_over(&self, id: u64) {
        self.parents_over(id, None);
        if let Some(m) = self.mutating.lock().remove(&id) {
            self.prefetch.lock().mutation_end(m);
        }
    }

    /// Call `id` (if it changes names) is over, with `got`, its directories' attributes
    /// after it (features::PARENTS): kept for `getattr` under the callback promise.
    fn parents_over(&self, id: u64, got: Option<Vec<(Vec<u8>, Attr)>>) {
        if let Some((seq, dirs)) = self.parents_of.lock().remove(&id) {
            let keep = self.features & features::CALLBACKS != 0
                && !self.muted.load(Ordering::SeqCst)
                && !self.closed.load(Ordering::SeqCst);
            self.prefetch.lock().parents.end(seq, &dirs, got, keep);
        }
    }

    fn call_as(&self, cred: &WireCred, req: Request) -> Result<Reply> {
        self.call_touching(cred, req, None)
    }

    /// `OpenVerified` of `t` with `flags` as `cred`: the server's `Opened` reply.
    fn open_verified(&self, cred: &Cred, t: &XattrTarget<'_>, flags: i32) -> Result<Reply> {
        self.call_as(
            &cred.into(),
            Request::OpenVerified {
                target: target(t),
                flags,
            },
        )
    }

    /// [`Conn::call_as`] with what a mutation makes stale ([`Conn::start_touching`]).
    fn call_touching(
        &self,
        cred: &WireCred,
        req: Request,
        stale: Option<Vec<Stale>>,
    ) -> Result<Reply> {
        let (_, rx) = self.start_touching(cred, req, stale)?;
        // A network round trip: a FUSE front end lets another thread read requests meanwhile.
        dircache_core::before_backend_call();
        let r = rx.recv();
        match r {
            Ok(Ok((_, Ok(r)))) => Ok(r),
            Ok(Ok((_, Err(errno)))) => Err(Error::from_errno(errno)),
            _ => Err(eio()),
        }
    }

    fn call(&self, req: Request) -> Result<Reply> {
        self.call_as(&self.own.clone(), req)
    }

    fn reader(self: Arc<Self>, mut read: Box<dyn Read + Send>) {
        // What a server may send (client/hostile.rs).
        let mut counts = hostile::CallEntries::default();
        let why = loop {
            let frame = match read_frame(&mut read, MAX_SERVER_FRAME) {
                Ok(Some(f)) => f,
                Ok(None) => break None,
                Err(e) => break Some(ProtoError::from(e)),
            };
            match decode::<ServerMsg>(&frame) {
                Ok(ServerMsg::Reply { id, last, body }) => {
                    if let Err(e) = hostile::check_reply(&body)
                        .and_then(|n| counts.add(id, n, last, self.max_call_entries))
                    {
                        break Some(ProtoError::Unexpected(e));
                    }
                    // The directories' attributes after a call that changed names: kept
                    // here, the caller gets the reply.
                    let (body, got) = match body {
                        Ok(Reply::Parents { parents, reply }) => (
                            Ok(*reply),
                            Some(parents.into_iter().map(|(d, a)| (d.0, a)).collect()),
                        ),
                        b => (b, None),
                    };
                    let slot = if last {
                        self.parents_over(id, got);
                        // A mutation answered was applied on the server: a bulk call sent
                        // from now on reads after it.
                        self.mutation_over(id);
                        self.pending.lock().remove(&id)
                    } else {
                        self.pending.lock().get(&id).cloned()
                    };
                    match slot {
                        Some(s) => {
                            let _ = s.send(Ok((last, body)));
                        }
                        None => break Some(ProtoError::Unexpected(format!("reply to {id}"))),
                    }
                }
                Ok(ServerMsg::Callback(c)) => {
                    if let Err(e) = hostile::check_callback(&c) {
                        break Some(ProtoError::Unexpected(e));
                    }
                    let c = Change::from(c);
                    tracing::trace!("callback {c:?}");
                    // The prefetch buffer and the containers forget first, before the cache
                    // hears of it. Not on a new connection after a disconnection until its
                    // Overflow (which invalidates every container) is sent: these are the
                    // reintegration's own changes, and while it runs the containers valid at
                    // the loss are still served (client/disconnected.rs).
                    let muted = self.muted.load(Ordering::SeqCst);
                    if let Some(cc) = self.containers.as_ref().filter(|_| !muted) {
                        match &c {
                            Change::Attr { path } | Change::Entry { path } => cc.touched(path),
                            Change::Inode { dev, ino } => cc.touched_inode((*dev, *ino)),
                            Change::Overflow => cc.invalidate_all(),
                        }
                    }
                    match &c {
                        Change::Attr { path } | Change::Entry { path } => {
                            self.prefetch.lock().touched(path)
                        }
                        Change::Inode { ino, .. } => self.prefetch.lock().touched_inode(*ino),
                        Change::Overflow => {
                            let mut p = self.prefetch.lock();
                            p.clear();
                            p.forget_listed();
                        }
                    }
                    self.callback(c)
                }
                Ok(other) => break Some(ProtoError::Unexpected(format!("{other:?}"))),
                Err(e) => break Some(e),
            }
        };
        match why {
            None => tracing::warn!("the server closed the connection"),
            Some(e) => tracing::error!("closing the connection to the server: {e}"),
        }
        self.closed.store(true, Ordering::SeqCst);
        // Disconnected operation keeps the promises until the reconnection
        // (client/disconnected.rs).
        if let (Some(cc), None) = (&self.containers, &self.disconnected) {
            cc.invalidate_all();
        }
        {
            let mut p = self.prefetch.lock();
            p.clear();
            p.forget_listed();
        }
        for (_, m) in self.mutating.lock().drain() {
            self.prefetch.lock().mutation_end(m);
        }
        for (_, s) in self.pending.lock().drain() {
            let _ = s.send(Err(()));
        }
        if let Some(d) = &self.disconnected {
            d.lost();
            return;
        }
        // Every callback promise is broken: the cache forgets what it knew, and learns it
        // again from the next connection (Coda's revalidation on reconnect).
        if let Some(tx) = self.callbacks.lock().as_ref() {
            if tx.try_send(Change::Overflow).is_err() {
                self.lost.store(true, Ordering::Relaxed);
            }
        }
    }

    fn callback(&self, c: Change) {
        let guard = self.callbacks.lock();
        let Some(tx) = guard.as_ref() else { return };
        if self.muted.load(Ordering::SeqCst) {
            return;
        }
        if self.lost.load(Ordering::Relaxed) {
            if tx.try_send(Change::Overflow).is_err() {
                return;
            }
            self.lost.store(false, Ordering::Relaxed);
        }
        match tx.try_send(c) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                // An Overflow follows: the cache will forget everything.
                self.prefetch.lock().forget_listed();
                self.lost.store(true, Ordering::Relaxed)
            }
            Err(TrySendError::Disconnected(_)) => {}
        }
    }
}

impl Conn {
    /// End the connection from our side: the server sees end of input and exits; our reader
    /// sees end of file, fails what is in flight and exits (dropping the connection, which
    /// reaps a child transport).
    fn shutdown(&self) {
        let w = std::mem::replace(
            &mut *self.writer.lock(),
            BufWriter::new(Box::new(std::io::sink())),
        );
        drop(w);
        if let Some(close) = self.close.lock().take() {
            close();
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.shutdown();
        drop(self.keep.lock().take());
    }
}

impl Drop for RemoteBackend {
    fn drop(&mut self) {
        let w = self.bulk_waits();
        tracing::info!(
            "remote: {} round trips, {} answers from prefetched listings; {} waits for bulk \
             calls ({} ms in all, {} ms the longest, {} hurried)",
            self.round_trips(),
            self.prefetch_hits(),
            w.waits,
            w.wait_us / 1000,
            w.max_wait_us / 1000,
            w.hurries
        );
        if let Some(d) = &self.cfg.disconnected {
            d.stop();
        }
        self.link.stop();
        self.conn.lock().shutdown();
    }
}

/// The handshake over `t`, then a connection with its reader thread.
fn new_conn(
    t: Box<dyn Transport>,
    cfg: &ClientConfig,
    callbacks: Arc<Mutex<Option<Sender<Change>>>>,
    lost: Arc<AtomicBool>,
    prefetch: Arc<Mutex<Prefetch>>,
    round_trips: Arc<CallCounts>,
    muted: bool,
) -> std::result::Result<Arc<Conn>, ProtoError> {
    let handshake_limit = Some(cfg.handshake_timeout).filter(|d| !d.is_zero());
    let Halves {
        read,
        write,
        keep,
        close,
    } = t.into_halves().map_err(|e| ProtoError::Frame(e.into()))?;
    let mut writer = BufWriter::with_capacity(256 * 1024, write);
    let hello = encode(&ClientMsg::Hello(Hello::new(features::ALL)))?;
    write_frame(&mut writer, &hello, MAX_CLIENT_FRAME)?;
    writer.flush().map_err(|e| ProtoError::Frame(e.into()))?;
    let (frame, read, keep, close) = match handshake_limit {
        None => {
            let mut read = read;
            let frame = read_frame(&mut read, MAX_SERVER_FRAME)?;
            (frame, read, keep, close)
        }
        Some(limit) => match read_hello_within(read, limit) {
            Ok((frame, read)) => (frame?, read, keep, close),
            Err(()) => {
                // Ended both ways, so that the thread still reading sees end of file: the
                // socket shut down, or the child's input closed (and the child killed after
                // its grace, `Reap`: dropped aside, not to hold up the next attempt).
                if let Some(close) = close {
                    close();
                }
                let _ = std::thread::Builder::new()
                    .name("dircache-handshake-end".into())
                    .spawn(move || drop((writer, keep)));
                return Err(ProtoError::HandshakeTimeout(limit));
            }
        },
    };
    let Some(frame) = frame else {
        return Err(ProtoError::Closed);
    };
    let granted = match decode::<ServerMsg>(&frame) {
        Ok(ServerMsg::Hello(h)) => {
            h.check()?;
            h.features
        }
        Ok(ServerMsg::Refused(why)) => return Err(ProtoError::Refused(why)),
        Ok(other) => return Err(ProtoError::Unexpected(format!("{other:?}"))),
        Err(_) => return Err(ProtoError::NotDircache),
    };
    {
        let both = features::CALLBACKS | features::SUBTREE;
        let mut p = prefetch.lock();
        p.clear();
        p.forget_listed();
        p.max = if granted & both == both {
            cfg.prefetch
        } else {
            0
        };
    }
    let conn = Arc::new(Conn {
        writer: Mutex::new(writer),
        pending: Mutex::new(HashMap::new()),
        next: AtomicU64::new(1),
        closed: AtomicBool::new(false),
        callbacks,
        lost,
        features: granted,
        own: WireCred {
            uid: rustix::process::geteuid().as_raw(),
            gid: rustix::process::getegid().as_raw(),
            groups: Vec::new(),
        },
        keep: Mutex::new(Some(keep)),
        prefetch,
        close: Mutex::new(close),
        round_trips,
        containers: cfg.containers.clone(),
        disconnected: cfg.disconnected.clone(),
        muted: AtomicBool::new(muted),
        max_call_entries: cfg.max_call_entries,
        mutating: Mutex::new(HashMap::new()),
        parents_of: Mutex::new(HashMap::new()),
    });
    let c = conn.clone();
    std::thread::Builder::new()
        .name("dircache-remote-reader".into())
        .spawn(move || c.reader(read))
        .map_err(|e| ProtoError::Frame(e.into()))?;
    Ok(conn)
}

type HelloRead = (
    std::result::Result<Option<Vec<u8>>, crate::frame::FrameError>,
    Box<dyn Read + Send>,
);

/// Read the server's answer to the handshake on a thread of its own, waiting at most
/// `limit`: the frame and the read half back, or `Err(())` when it did not come in time (the
/// thread then ends when the caller ends the stream).
fn read_hello_within(
    mut read: Box<dyn Read + Send>,
    limit: Duration,
) -> std::result::Result<HelloRead, ()> {
    let (tx, rx) = crossbeam_channel::bounded(1);
    let spawned = std::thread::Builder::new()
        .name("dircache-handshake".into())
        .spawn(move || {
            let frame = read_frame(&mut read, MAX_SERVER_FRAME);
            let _ = tx.send((frame, read));
        });
    if spawned.is_err() {
        return Err(());
    }
    rx.recv_timeout(limit).map_err(|_| ())
}

/// Starts a new transport to the server (for reconnecting).
pub type Connector = Box<dyn Fn() -> std::io::Result<Box<dyn Transport>> + Send + Sync>;

/// A [`Backend`] served by a dircache server (module docs).
pub struct RemoteBackend {
    conn: Arc<Mutex<Arc<Conn>>>,
    watched: AtomicBool,
    callbacks: Arc<Mutex<Option<Sender<Change>>>>,
    prefetch: Arc<Mutex<Prefetch>>,
    /// Signalled when a streamed bulk call stores a part or ends (client/bulk.rs).
    arrived: Arc<parking_lot::Condvar>,
    round_trips: Arc<CallCounts>,
    /// Reconnecting, shared with the open files (client/reopen.rs).
    link: Arc<reopen::Link>,
    cfg: ClientConfig,
    /// Recent statfs answers (client/statfs.rs).
    statfs: statfs::StatfsCache,
}

/// How a client runs.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Most directory entries the prefetch buffer holds (crate::prefetch); 0 = no bulk
    /// subtree prefetching.
    pub prefetch: usize,
    /// After the connection is lost, how long a call waits for a new one (reconnecting with
    /// backoff through the [`Connector`]) before it fails with EIO; zero = no reconnecting.
    pub reconnect_timeout: Duration,
    /// Whole-file container cache for regular files (client/container.rs); `None`: reads and
    /// writes go to the server in ranges.
    pub containers: Option<Arc<Containers>>,
    /// Disconnected operation (client/disconnected.rs); `None` (or no reconnecting): a lost
    /// connection breaks every promise at once and calls get EIO.
    pub disconnected: Option<Arc<Disconnected>>,
    /// How long a reconnection waits for the server's answer to its handshake before it
    /// gives that attempt up and tries again with backoff (a server that accepts a
    /// connection and never answers held the reconnecting thread forever); zero = no bound.
    /// The first connection is not bounded (ssh may be asking for a password).
    pub handshake_timeout: Duration,
    /// How long a statfs answer is reused (client/statfs.rs); zero = every call asks.
    pub statfs_ttl: Duration,
    /// Most directory entries one call may bring over all its frames: a server sending
    /// more is cut off (client/hostile.rs), so it cannot grow the client without bound.
    pub max_call_entries: u64,
}

/// [`ClientConfig::max_call_entries`] by default: a listing of 4 Mi entries, or a
/// `Subtree` call of up to the largest budget a server grants (1 Mi) and its root's listing.
pub const MAX_CALL_ENTRIES: u64 = 1 << 22;

/// The default [`ClientConfig::handshake_timeout`].
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

impl Default for ClientConfig {
    fn default() -> ClientConfig {
        ClientConfig {
            prefetch: 131072,
            reconnect_timeout: Duration::from_secs(10),
            containers: None,
            disconnected: None,
            handshake_timeout: HANDSHAKE_TIMEOUT,
            statfs_ttl: Duration::from_secs(5),
            max_call_entries: MAX_CALL_ENTRIES,
        }
    }
}

impl RemoteBackend {
    /// Talk to a server over `t` with the default configuration.
    pub fn connect(t: Box<dyn Transport>) -> std::result::Result<RemoteBackend, ProtoError> {
        Self::connect_with(t, &ClientConfig::default())
    }

    /// Talk to a server over `t`: the handshake, then a reader thread. No reconnecting.
    pub fn connect_with(
        t: Box<dyn Transport>,
        cfg: &ClientConfig,
    ) -> std::result::Result<RemoteBackend, ProtoError> {
        Self::start(t, None, cfg)
    }

    /// Talk to a server over a transport from `connector`, and to a new one from it whenever
    /// the connection is lost ([`ClientConfig::reconnect_timeout`]).
    pub fn connect_again(
        connector: Connector,
        cfg: &ClientConfig,
    ) -> std::result::Result<RemoteBackend, ProtoError> {
        let t = connector().map_err(|e| ProtoError::Frame(e.into()))?;
        Self::start(t, Some(connector), cfg)
    }

    fn start(
        t: Box<dyn Transport>,
        connector: Option<Connector>,
        cfg: &ClientConfig,
    ) -> std::result::Result<RemoteBackend, ProtoError> {
        let mut cfg = cfg.clone();
        if connector.is_none() || cfg.reconnect_timeout.is_zero() {
            // Nothing to reconnect to: a loss is for good.
            cfg.disconnected = None;
        }
        let cfg = &cfg;
        let callbacks = Arc::new(Mutex::new(None));
        let lost = Arc::new(AtomicBool::new(false));
        let prefetch = Arc::new(Mutex::new(Prefetch::new(0)));
        let round_trips = Arc::new(CallCounts::new());
        // The first connection's handshake is not bounded (ssh may be asking for a password).
        let first = ClientConfig {
            handshake_timeout: Duration::ZERO,
            ..cfg.clone()
        };
        let conn = new_conn(
            t,
            &first,
            callbacks.clone(),
            lost.clone(),
            prefetch.clone(),
            round_trips.clone(),
            false,
        )?;
        // What a previous mount logged and did not reintegrate (a crash, an unmount while
        // disconnected) goes first.
        if let Some(d) = &cfg.disconnected {
            d.reintegrate_all(&mut d.cml.lock(), &conn);
        }
        let conn = Arc::new(Mutex::new(conn));
        let link = Arc::new(reopen::Link::new(
            conn.clone(),
            connector,
            cfg.clone(),
            callbacks.clone(),
            lost,
            prefetch.clone(),
            round_trips.clone(),
        ));
        if let Some(d) = &cfg.disconnected {
            disconnected::spawn_reconnector(d.clone(), Arc::downgrade(&link));
        }
        Ok(RemoteBackend {
            conn,
            watched: AtomicBool::new(false),
            callbacks,
            prefetch,
            arrived: Arc::default(),
            round_trips,
            link,
            cfg: cfg.clone(),
            statfs: statfs::StatfsCache::new(cfg.statfs_ttl),
        })
    }

    /// The live connection: the current one, or (after it was lost) a new one, waiting up to
    /// the reconnect timeout with backoff (open files reopened on it); EIO when there is none.
    fn conn(&self) -> Result<Arc<Conn>> {
        self.link.conn()
    }

    /// Directory entries waiting in the prefetch buffer (for statistics and tests).
    pub fn prefetched_entries(&self) -> usize {
        self.prefetch.lock().entries()
    }

    /// The features the server granted.
    pub fn features(&self) -> u64 {
        self.conn.lock().features
    }

    /// Calls sent so far (each one round trip; streamed replies count once).
    pub fn round_trips(&self) -> u64 {
        self.round_trips.total.load(Ordering::Relaxed)
    }

    /// Calls of kind `kind` ([`crate::proto::REQUEST_KINDS`]: "Getattr", "Store"...) sent
    /// so far.
    pub fn calls_of(&self, kind: &str) -> u64 {
        self.round_trips.of(kind)
    }

    /// Directory listings and lookups answered from the prefetch buffer so far.
    pub fn prefetch_hits(&self) -> u64 {
        self.prefetch.lock().hits
    }

    /// Whether the connection has ended.
    pub fn is_closed(&self) -> bool {
        self.conn.lock().closed.load(Ordering::SeqCst)
    }

    /// Everything below `path` (at most `budget` entries) in one streamed reply, directory by
    /// directory (paths relative to `path`); `true` when the whole subtree fit.
    pub fn subtree(&self, path: &[u8], budget: u64) -> Result<(Vec<SubtreeDir>, bool)> {
        if self.conn.lock().features & features::SUBTREE == 0 {
            return Err(Error::NotSupported);
        }
        let c = self.conn()?;
        let rx = c.start(
            &c.own.clone(),
            Request::Subtree {
                path: path.to_vec(),
                budget,
            },
        )?;
        let mut dirs: Vec<SubtreeDir> = Vec::new();
        loop {
            match rx.recv() {
                // Names first: the full listings follow.
                Ok(Ok((false, Ok(Reply::Names(_))))) => {}
                Ok(Ok((last, Ok(Reply::Subtree { dirs: d, complete })))) => {
                    for sd in d {
                        match dirs.last_mut() {
                            Some(prev) if prev.dir == sd.dir => {
                                prev.entries.extend(sd.entries);
                                prev.bare.extend(sd.bare);
                            }
                            _ => dirs.push(sd),
                        }
                    }
                    if last {
                        return Ok((dirs, complete));
                    }
                }
                Ok(Ok((_, Err(e)))) => return Err(Error::from_errno(e)),
                _ => return Err(eio()),
            }
        }
    }

    fn xattrs(&self) -> Result<()> {
        if self.conn.lock().features & features::XATTRS == 0 {
            return Err(XATTR_UNSUPPORTED);
        }
        Ok(())
    }
}

impl RemoteBackend {
    /// [`Backend::readdir`] from the prefetch buffer or the server.
    fn readdir_online(&self, path: &[u8], plus: bool) -> Result<Vec<DirEntry>> {
        // Without attributes, the names of a bulk call (names first) answer.
        // Names first: a full listing handed to a listing without attributes stays, as
        // names handed over do (Prefetch::take_plain).
        let names = self.conn.lock().features & features::NAMES != 0;
        let take = |p: &mut Prefetch| {
            let l = if plus || !names {
                p.take(path)
                    .or_else(|| (!plus).then(|| p.take_names(path)).flatten())
            } else {
                p.take_plain(path)
            };
            if l.is_some() {
                p.mark_listed(path);
            }
            l
        };
        let first = {
            let mut p = self.prefetch.lock();
            if let Some(l) = take(&mut p) {
                return Ok(l);
            }
            p.enabled() && !p.was_listed(path)
        };
        // The first listing of a directory: its whole subtree (bounded) in one streamed bulk
        // call (or the one in flight that brings it); this listing answers the call, the rest
        // waits in the prefetch buffer (client/bulk.rs). Another listing of it: the call in
        // flight that still brings it (names handed over, the full listing wanted now).
        let got = if first {
            self.bulk(path, !plus)
        } else {
            self.wait_for_listing(path, !plus)
        };
        {
            let mut p = self.prefetch.lock();
            p.mark_listed(path);
            if got {
                if let Some(l) = take(&mut p) {
                    return Ok(l);
                }
            }
        }
        let c = self.conn()?;
        let rx = c.start(
            &c.own.clone(),
            Request::Readdir {
                path: path.to_vec(),
                plus,
            },
        )?;
        let mut out = Vec::new();
        loop {
            match rx.recv() {
                Ok(Ok((last, Ok(Reply::Entries(e))))) => {
                    out.extend(e);
                    if last {
                        return Ok(out);
                    }
                }
                Ok(Ok((_, Err(e)))) => return Err(Error::from_errno(e)),
                Ok(Ok(_)) => return Err(Error::Os(libc::EPROTO)),
                _ => return Err(eio()),
            }
        }
    }
}

/// The calling thread's umask, sent with creations: the FUSE front end sets a request thread's
/// umask to its caller's around a creation (in a private fs context), as it does for the local
/// backend, whose file system applies it there; here the server's must.
/// The umask an open with `flags` sends: the caller's when it may create, else none.
fn open_umask(flags: i32) -> u32 {
    if flags & libc::O_CREAT != 0 {
        thread_umask()
    } else {
        0
    }
}

fn thread_umask() -> u32 {
    // SAFETY: umask(2) has no memory effects. Reading it means setting it: a thread with a
    // private fs context (the FUSE request threads that set a caller's umask) races with no
    // one; threads sharing the daemon's context see its umask, 0, set back at once.
    let old = unsafe { libc::umask(0) };
    // SAFETY: as above; puts back what was there.
    unsafe { libc::umask(old) };
    old as u32
}

fn target(t: &XattrTarget<'_>) -> Target {
    Target {
        path: t.path.to_vec(),
        expect: t.expect,
        birth: t.birth,
    }
}

/// Walk `names` from `dir` as far as `known` answers (`None`: it does not know that name),
/// then the rest with `rest`, in one go.
fn walk_known(
    dir: &[u8],
    names: &[&[u8]],
    mut known: impl FnMut(&[u8], &[u8]) -> Option<Result<Attr>>,
    rest: impl FnOnce(&[u8], &[&[u8]]) -> Walked,
) -> Walked {
    let mut w = Walked::default();
    let mut at = dir.to_vec();
    for (i, name) in names.iter().enumerate() {
        match known(&at, name) {
            Some(Ok(a)) => {
                w.attrs.push(a);
                if i + 1 < names.len() && !a.is_dir() {
                    w.error = Some(Error::NotDir);
                    return w;
                }
                at = join(&at, name);
            }
            Some(Err(e)) => {
                w.error = Some(e);
                return w;
            }
            None => break,
        }
    }
    let done = w.attrs.len();
    if done == names.len() {
        return w;
    }
    let mut r = rest(&at, &names[done..]);
    w.attrs.append(&mut r.attrs);
    w.error = r.error;
    w
}

fn want_attr(r: Reply) -> Result<Attr> {
    match r {
        Reply::Attr(a) => Ok(a),
        _ => Err(Error::Os(libc::EPROTO)),
    }
}

fn want_unit(r: Reply) -> Result<()> {
    match r {
        Reply::Unit => Ok(()),
        _ => Err(Error::Os(libc::EPROTO)),
    }
}

fn want_data(r: Reply) -> Result<Vec<u8>> {
    match r {
        Reply::Data(d) => Ok(d),
        _ => Err(Error::Os(libc::EPROTO)),
    }
}

fn want_count(r: Reply) -> Result<u64> {
    match r {
        Reply::Count(n) => Ok(n),
        _ => Err(Error::Os(libc::EPROTO)),
    }
}

impl Backend for RemoteBackend {
    fn search(
        &self,
        cred: &Cred,
        call: &dircache_core::SearchCall,
    ) -> Option<Result<Box<dyn dircache_core::SearchHits>>> {
        self.search_remote(cred, call)
    }

    fn lookup(&self, dir: &[u8], name: &[u8]) -> Result<Attr> {
        if let Some(r) = self.prefetch.lock().lookup(dir, name) {
            return r.map(|a| self.handed_out(&join(dir, name), a));
        }
        // Names first: the names answer for a subdirectory or a missing name.
        if self.wait_for_listing(dir, true) {
            if let Some(r) = self.prefetch.lock().lookup(dir, name) {
                return r.map(|a| self.handed_out(&join(dir, name), a));
            }
        }
        if self.wait_for_listing(dir, false) || self.bulk_after_misses(dir) {
            if let Some(r) = self.prefetch.lock().lookup(dir, name) {
                return r.map(|a| self.handed_out(&join(dir, name), a));
            }
        }
        if let Some(r) = self.offline_lookup(dir, name) {
            return r;
        }
        want_attr(self.conn()?.call(Request::Lookup {
            dir: dir.to_vec(),
            name: name.to_vec(),
        })?)
        .map(|a| self.seen(a))
        .inspect(|a| self.remember(&join(dir, name), a))
    }

    fn walk(&self, dir: &[u8], names: &[&[u8]]) -> Walked {
        // As far as the prefetch buffer knows, then the rest in one round trip.
        walk_known(
            dir,
            names,
            |at, name| {
                if self.prefetch.lock().coming(at) {
                    // Names first: the names answer for a subdirectory or a missing name.
                    let named = self.wait_for_listing(at, true);
                    if !named || self.prefetch.lock().lookup(at, name).is_none() {
                        self.wait_for_listing(at, false);
                    }
                }
                let mut p = self.prefetch.lock();
                if !p.holds(at) && p.missed_again(at) {
                    drop(p);
                    self.bulk(at, false);
                    p = self.prefetch.lock();
                }
                let r = p.lookup(at, name);
                drop(p);
                if let Some(Ok(a)) = &r {
                    self.remember(&join(at, name), a);
                }
                r
            },
            |at, rest| self.walk_remote(at, rest),
        )
    }

    fn getattr(&self, path: &[u8]) -> Result<Attr> {
        // A valid container holds the server's attributes of the version it holds, under
        // the same callback promise as the cache's (any change to the file, its path or an
        // ancestor invalidates it): no round trip. The kernel asks again whenever a file is
        // open (the core's fresh attributes for an open file: a compiler's fstat of each
        // source and header). Not while a disconnection is being installed (calls wait for
        // the new connection then: client/disconnected.rs).
        if let Some(cc) = &self.cfg.containers {
            if self.cfg.disconnected.as_ref().is_none_or(|d| d.connected()) {
                if let Some(a) = cc.cached_attr(path) {
                    return Ok(a);
                }
            }
        }
        // A directory's attributes from the reply to this client's own create or unlink in
        // it (features::PARENTS).
        if let Some(a) = self.prefetch.lock().parents.get(path) {
            return Ok(self.handed_out(path, a));
        }
        if !path.is_empty() {
            let (dir, name) = match path.iter().rposition(|&b| b == b'/') {
                Some(i) => (&path[..i], &path[i + 1..]),
                None => (&b""[..], path),
            };
            if let Some(r) = self.prefetch.lock().lookup(dir, name) {
                return r.map(|a| self.handed_out(path, a));
            }
            if self.wait_for_listing(dir, true) {
                if let Some(r) = self.prefetch.lock().lookup(dir, name) {
                    return r.map(|a| self.handed_out(path, a));
                }
            }
            // No bulk call for a getattr (only a listing in flight is waited for): the core
            // asks for the attributes of a name it holds, typically a directory whose
            // attributes this client's own create or unlink in it made it forget (a build
            // writing objects: the kernel checks the directory's permission again after each
            // one). Counted as a miss, every second such getattr fetched the parent's whole
            // subtree (the root's: the whole tree, for `cproj`'s attributes), 32 whole-tree
            // calls in a `make -j2` of 26 objects; one `Getattr` answers it.
            if self.wait_for_listing(dir, false) {
                if let Some(r) = self.prefetch.lock().lookup(dir, name) {
                    return r.map(|a| self.handed_out(path, a));
                }
            }
        }
        if let Some(a) = self.offline_attr(path) {
            return Ok(a);
        }
        want_attr(self.conn()?.call(Request::Getattr {
            path: path.to_vec(),
        })?)
        .map(|a| self.seen(a))
        .inspect(|a| self.remember(path, a))
    }

    fn readdir(&self, path: &[u8], plus: bool) -> Result<Vec<DirEntry>> {
        if let Some(r) = self.offline_readdir(path) {
            return r;
        }
        let r = self.readdir_online(path, plus);
        if let Ok(l) = &r {
            self.remember_listing(path, l);
        }
        r
    }

    fn readlink(&self, path: &[u8]) -> Result<Vec<u8>> {
        if let Some(t) = self.offline_readlink(path) {
            return Ok(t);
        }
        want_data(self.conn()?.call(Request::Readlink {
            path: path.to_vec(),
        })?)
    }

    fn mknod(&self, cred: &Cred, path: &[u8], mode: u32, rdev: u64) -> Result<Attr> {
        want_attr(self.conn()?.call_as(
            &cred.into(),
            Request::Mknod {
                path: path.to_vec(),
                mode,
                rdev,
                umask: thread_umask(),
            },
        )?)
    }

    fn mkdir(&self, cred: &Cred, path: &[u8], mode: u32) -> Result<Attr> {
        if let Some(r) = self.offline_mkdir(cred, path, mode) {
            return r;
        }
        want_attr(self.conn()?.call_as(
            &cred.into(),
            Request::Mkdir {
                path: path.to_vec(),
                mode,
                umask: thread_umask(),
            },
        )?)
    }

    fn symlink(&self, cred: &Cred, target: &[u8], path: &[u8]) -> Result<Attr> {
        if let Some(r) = self.offline_symlink(cred, target, path) {
            return r;
        }
        want_attr(self.conn()?.call_as(
            &cred.into(),
            Request::Symlink {
                target: target.to_vec(),
                path: path.to_vec(),
            },
        )?)
    }

    fn link(&self, cred: &Cred, old: &[u8], new: &[u8]) -> Result<Attr> {
        let r = want_attr(self.conn()?.call_as(
            &cred.into(),
            Request::Link {
                old: old.to_vec(),
                new: new.to_vec(),
            },
        )?);
        // The file gained a link and a new ctime: a container of it (under `old` or another
        // name) must not answer its attributes.
        if let (Ok(a), Some(cc)) = (&r, &self.cfg.containers) {
            cc.touched_inode((a.dev, a.ino));
        }
        self.mutated(new);
        r
    }

    fn unlink(&self, cred: &Cred, path: &[u8]) -> Result<()> {
        if let Some(r) = self.offline_remove(cred, path, false) {
            return r;
        }
        let r = want_unit(self.conn()?.call_as(
            &cred.into(),
            Request::Unlink {
                path: path.to_vec(),
            },
        )?);
        self.unlinked(path);
        r
    }

    fn rmdir(&self, cred: &Cred, path: &[u8]) -> Result<()> {
        if let Some(r) = self.offline_remove(cred, path, true) {
            return r;
        }
        let r = want_unit(self.conn()?.call_as(
            &cred.into(),
            Request::Rmdir {
                path: path.to_vec(),
            },
        )?);
        self.mutated(path);
        r
    }

    fn rename(&self, cred: &Cred, old: &[u8], new: &[u8], mode: RenameMode) -> Result<()> {
        if let Some(r) = self.offline_rename(cred, old, new, mode) {
            return r;
        }
        let r = want_unit(self.conn()?.call_as(
            &cred.into(),
            Request::Rename {
                old: old.to_vec(),
                new: new.to_vec(),
                mode,
            },
        )?);
        self.mutated(old);
        self.unlinked(new);
        r?;
        // Open files below follow, for reopening after a reconnection.
        self.link.renamed(old, new, mode);
        Ok(())
    }

    fn setattr(&self, cred: &Cred, path: &[u8], set: &SetAttr) -> Result<Attr> {
        if let Some(r) = self.offline_setattr(cred, path, set) {
            return r;
        }
        let r = want_attr(self.conn()?.call_as(
            &cred.into(),
            Request::Setattr {
                path: path.to_vec(),
                set: *set,
            },
        )?);
        self.mutated(path);
        if let (Ok(a), Some(cc)) = (&r, &self.cfg.containers) {
            cc.path_setattr(a, set);
            // Another name of the same file (a hard link) may hold its container.
            if set.size.is_some() {
                cc.kernel_written((a.dev, a.ino));
            }
        }
        r.map(|a| self.seen(a))
    }

    fn statfs(&self, path: &[u8]) -> Result<StatFs> {
        self.statfs.get(path, || {
            match self.conn()?.call(Request::Statfs {
                path: path.to_vec(),
            })? {
                Reply::StatFs(s) => Ok(s),
                _ => Err(Error::Os(libc::EPROTO)),
            }
        })
    }

    fn open(
        &self,
        cred: &Cred,
        path: &[u8],
        flags: i32,
        mode: u32,
    ) -> Result<Box<dyn BackendFile>> {
        if let Some(cc) = &self.cfg.containers {
            return self.open_container(cc, cred, path, flags, mode);
        }
        let c = self.conn()?;
        Ok(Box::new(self.open_path(c, cred, path, flags, mode, None)?))
    }

    fn open_verified(
        &self,
        cred: &Cred,
        t: XattrTarget<'_>,
        flags: i32,
    ) -> Result<Box<dyn BackendFile>> {
        // A regular file's READ or WRITE under open=noopen: its container (client/noopen.rs).
        if let Some(cc) = &self.cfg.containers {
            if let Some(r) = self.kernel_open(cc, cred, t, flags) {
                return r;
            }
        }
        let c = self.conn()?;
        let r = c.open_verified(cred, &t, flags)?;
        self.file(c, r, t.path, cred, flags, t.expect)
    }

    fn fsyncdir(&self, cred: &Cred, t: XattrTarget<'_>, datasync: bool) -> Result<()> {
        want_unit(self.conn()?.call_as(
            &cred.into(),
            Request::Fsyncdir {
                target: target(&t),
                datasync,
            },
        )?)
    }

    fn getxattr(&self, cred: &Cred, t: XattrTarget<'_>, name: &[u8]) -> Result<Vec<u8>> {
        self.xattrs()?;
        // A file known to have no extended attributes has no ACL (no permission is needed to
        // ask for one): `ls -l` asks for every entry.
        if name == b"system.posix_acl_access" || name == b"system.posix_acl_default" {
            let bare = self.prefetch.lock().is_bare(t.path);
            // A bulk call in flight may still bring the parent's listing with its flags.
            let parent = match t.path.iter().rposition(|c| *c == b'/') {
                Some(i) => &t.path[..i],
                None => &b""[..],
            };
            if bare
                || (!t.path.is_empty()
                    && self.wait_for_listing(parent, false)
                    && self.prefetch.lock().is_bare(t.path))
            {
                return Err(Error::Os(libc::ENODATA));
            }
        }
        want_data(self.conn()?.call_as(
            &cred.into(),
            Request::Getxattr {
                target: target(&t),
                name: name.to_vec(),
            },
        )?)
    }

    fn listxattr(&self, cred: &Cred, t: XattrTarget<'_>) -> Result<Vec<u8>> {
        self.xattrs()?;
        want_data(
            self.conn()?
                .call_as(&cred.into(), Request::Listxattr { target: target(&t) })?,
        )
    }

    fn setxattr(
        &self,
        cred: &Cred,
        t: XattrTarget<'_>,
        name: &[u8],
        value: &[u8],
        flags: i32,
    ) -> Result<()> {
        self.xattrs()?;
        want_unit(self.conn()?.call_as(
            &cred.into(),
            Request::Setxattr {
                target: target(&t),
                name: name.to_vec(),
                value: value.to_vec(),
                flags,
            },
        )?)
    }

    fn removexattr(&self, cred: &Cred, t: XattrTarget<'_>, name: &[u8]) -> Result<()> {
        self.xattrs()?;
        want_unit(self.conn()?.call_as(
            &cred.into(),
            Request::Removexattr {
                target: target(&t),
                name: name.to_vec(),
            },
        )?)
    }

    fn changed(&self, change: &Change) {
        if let (Change::Inode { dev, ino }, Some(d)) = (change, &self.cfg.disconnected) {
            if *dev == disconnected::BARRIER_DEV {
                d.barrier_passed(*ino);
            }
        }
    }

    fn flush_on_close(&self) -> bool {
        self.cfg.containers.is_some()
    }

    fn provisional(&self, _dev: u64, ino: u64) -> bool {
        self.cfg
            .disconnected
            .as_ref()
            .is_some_and(|d| d.provisional(ino))
    }

    fn known_bare(&self, path: &[u8]) -> bool {
        self.prefetch.lock().knows_bare(path)
    }

    fn acls_listed(&self) -> bool {
        // `getxattr` answers an ACL of an entry a bulk listing flagged bare (no round trip);
        // a front end fetching ACLs ahead would re-check each entry's attributes after the
        // cache took the listing: two round trips per directory (`ls -lR` cold: 1,479
        // Getattr and 1,478 Subtree calls).
        self.prefetch.lock().enabled()
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let mut v = vec![
            ("round_trips", self.round_trips()),
            ("parent_attr_hits", self.prefetch.lock().parents.hits),
        ];
        v.extend(self.round_trips.counters());
        let w = self.bulk_waits();
        v.extend([
            ("bulk_waits", w.waits),
            ("bulk_wait_ms", w.wait_us / 1000),
            ("bulk_max_wait_ms", w.max_wait_us / 1000),
            ("bulk_hurries", w.hurries),
            ("bulk_listings", w.stored),
            ("bulk_early_answers", w.early),
            ("bulk_calls", w.calls),
            ("bulk_stale_listings", w.stale),
        ]);
        if let Some(d) = &self.cfg.disconnected {
            // 1 while disconnected (serving what is cached), else 0.
            v.push(("offline", u64::from(d.offline())));
        }
        if let Some(cc) = &self.cfg.containers {
            v.extend(cc.counters());
        }
        if let Some(d) = &self.cfg.disconnected {
            v.extend(d.counters());
        }
        v
    }

    fn watch(&self) -> Result<Option<ChangeFeed>> {
        if self.conn.lock().features & features::CALLBACKS == 0
            || self.watched.swap(true, Ordering::SeqCst)
        {
            return Ok(None);
        }
        let (tx, rx) = bounded(FEED_CAPACITY);
        if self.conn.lock().closed.load(Ordering::SeqCst) {
            let _ = tx.try_send(Change::Overflow);
            return Ok(Some(rx));
        }
        *self.callbacks.lock() = Some(tx);
        Ok(Some(rx))
    }
}

impl RemoteBackend {
    /// [`Backend::open`] with containers: a read-only open the container cache can answer
    /// alone costs no round trip; any other asks the server (Open, FileAttr) and gets the
    /// container of a regular file up to the whole-file bound, fetched if needed.
    fn open_container(
        &self,
        cc: &Arc<Containers>,
        cred: &Cred,
        path: &[u8],
        flags: i32,
        mode: u32,
    ) -> Result<Box<dyn BackendFile>> {
        let plain = libc::O_CREAT | libc::O_TRUNC | libc::O_DIRECTORY | libc::O_PATH;
        if flags & libc::O_ACCMODE == libc::O_RDONLY && flags & plain == 0 {
            // The connection as it is: while disconnected, a container valid at the loss is
            // served (client/disconnected.rs).
            let conn = self.conn.lock().clone();
            if let Some(f) = cc.reuse(&conn, path, cred) {
                return Ok(Box::new(f));
            }
        }
        if let Some(r) = self.offline_open(cc, cred, path, flags, mode) {
            return r;
        }
        let conn = self.conn()?;
        // Before the server is asked: a callback from now on makes what it says not valid.
        let gen = cc.gen();
        let how = OpenHow::Path {
            path: path.to_vec(),
            flags,
            mode,
            umask: open_umask(flags),
        };
        let read = if flags & libc::O_ACCMODE != libc::O_WRONLY && flags & libc::O_TRUNC == 0 {
            cc.first_read(path)
        } else {
            0
        };
        let (rf, attr, first) = self.open_plus(&conn, cred, how, read, cc.whole_file_max)?;
        if attr.mode & libc::S_IFMT != libc::S_IFREG || attr.size > cc.whole_file_max {
            return Ok(Box::new(rf));
        }
        // A write-only handle cannot read: the data comes through a read-only open as the
        // caller; a caller who may not read gets ranged writes instead.
        let mut reader = None;
        if flags & libc::O_ACCMODE == libc::O_WRONLY && attr.size > 0 && cc.needs_fetch(&attr) {
            let ident = Some((attr.dev, attr.ino));
            let r = self.open_path(conn.clone(), cred, path, libc::O_RDONLY, 0, ident);
            // The same file still (not replaced since the first open).
            match r.and_then(|r| Ok((r.attr()?, r))) {
                Ok((a, r)) if (a.dev, a.ino) == (attr.dev, attr.ino) => reader = Some(r),
                _ => return Ok(Box::new(rf)),
            }
        }
        let first = first.map(|data| container::First { data, asked: read });
        Ok(Box::new(cc.open(
            &conn, path, cred, flags, rf, reader, attr, gen, true, first,
        )?))
    }

    /// Open on `conn` as `how` says, with the opened file's attributes and, when `read` is not
    /// 0 and its size at most `upto`, its first bytes (`None` when not read): one `OpenPlus` call where the server grants
    /// it, else the open and a `FileAttr` call (no bytes).
    fn open_plus(
        &self,
        conn: &Arc<Conn>,
        cred: &Cred,
        how: OpenHow,
        read: u32,
        upto: u64,
    ) -> Result<(RemoteFile, Attr, Option<Vec<u8>>)> {
        let flags = how.flags();
        let (path, ident) = match &how {
            OpenHow::Path { path, .. } => (path.clone(), None),
            OpenHow::Verified { target, .. } => (target.path.clone(), target.expect),
        };
        if conn.features & features::OPEN_PLUS != 0 {
            let r = conn.call_as(&cred.into(), Request::OpenPlus { how, read, upto })?;
            let Reply::OpenedPlus {
                handle,
                writable,
                attr,
                data,
            } = r
            else {
                return Err(Error::Os(libc::EPROTO));
            };
            let rf = self.remote_file(conn.clone(), handle, writable, &path, cred, flags, ident);
            // What was opened: the identity a reopen must find (client/reopen.rs).
            rf.state.at.lock().ident.get_or_insert((attr.dev, attr.ino));
            return Ok((rf, attr, data.map(|b| b.0)));
        }
        let req = match how {
            OpenHow::Path {
                path,
                flags,
                mode,
                umask,
            } => Request::Open {
                path,
                flags,
                mode,
                umask,
            },
            OpenHow::Verified { target, flags } => Request::OpenVerified { target, flags },
        };
        let Reply::Opened { handle, writable } = conn.call_as(&cred.into(), req)? else {
            return Err(Error::Os(libc::EPROTO));
        };
        let rf = self.remote_file(conn.clone(), handle, writable, &path, cred, flags, ident);
        let attr = rf.attr()?;
        Ok((rf, attr, None))
    }

    /// The container cache, if any.
    pub fn containers(&self) -> Option<Arc<Containers>> {
        self.cfg.containers.clone()
    }

    /// Container cache counters (`None` without containers).
    pub fn container_stats(&self) -> Option<ContainerStats> {
        self.cfg.containers.as_ref().map(|c| c.stats())
    }

    /// `a` of `path`, from the prefetch buffer, as handed out: as this client sees it, and
    /// remembered (a directory's) for while disconnected.
    fn handed_out(&self, path: &[u8], a: Attr) -> Attr {
        self.remember(path, &a);
        self.seen(a)
    }

    /// `a` as this client sees it (a container open for writing shows its size and times).
    fn seen(&self, mut a: Attr) -> Attr {
        if let Some(cc) = &self.cfg.containers {
            cc.overlay(&mut a);
        }
        a
    }

    /// A mutation of `path` by this client: its containers are no longer valid (the callback
    /// may come later).
    fn mutated(&self, path: &[u8]) {
        if let Some(cc) = &self.cfg.containers {
            cc.touched(path);
        }
    }

    /// A name removed or replaced by this client (unlink, rename over a name): besides
    /// [`Self::mutated`], the containers of hard-linked files, whose other names lost a link.
    fn unlinked(&self, path: &[u8]) {
        self.mutated(path);
        if let Some(cc) = &self.cfg.containers {
            cc.touched_linked();
        }
    }

    /// A lookup in `dir` missed the prefetch buffer: on the second such miss (see
    /// [`Prefetch::missed_again`](crate::prefetch::Prefetch::missed_again)) fetch `dir`'s
    /// subtree in bulk. Whether `dir`'s listing is held now.
    fn bulk_after_misses(&self, dir: &[u8]) -> bool {
        if !self.prefetch.lock().missed_again(dir) {
            return false;
        }
        self.bulk(dir, false)
    }

    fn walk_remote(&self, dir: &[u8], names: &[&[u8]]) -> Walked {
        // Disconnected: as far as what is known locally goes (each name; a walk of several
        // names below a directory made while cut off must not need the server).
        walk_known(
            dir,
            names,
            |at, name| self.offline_lookup(at, name),
            |at, rest| self.walk_server(at, rest),
        )
    }

    /// [`Self::walk_remote`]'s call to the server.
    fn walk_server(&self, dir: &[u8], names: &[&[u8]]) -> Walked {
        let r = self.conn().and_then(|c| {
            c.call(Request::Walk {
                dir: dir.to_vec(),
                names: names.iter().map(|n| Bytes(n.to_vec())).collect(),
            })
        });
        if let Ok(Reply::Walked { attrs, .. }) = &r {
            let mut p = dir.to_vec();
            for (a, n) in attrs.iter().zip(names) {
                p = join(&p, n);
                self.remember(&p, a);
            }
        }
        match r {
            Ok(Reply::Walked { attrs, error }) if attrs.len() <= names.len() => Walked {
                error: match error {
                    Some(e) => Some(Error::from_errno(e)),
                    None if attrs.len() < names.len() => Some(Error::Os(libc::EPROTO)),
                    None => None,
                },
                attrs,
            },
            Ok(_) => Walked {
                attrs: Vec::new(),
                error: Some(Error::Os(libc::EPROTO)),
            },
            Err(e) => Walked {
                attrs: Vec::new(),
                error: Some(e),
            },
        }
    }

    /// The file `r` opened on `conn` (`path` with `flags` by `cred`; `ident`: the `(dev,
    /// ino)` it was verified to be), kept for reopening after a reconnection.
    fn file(
        &self,
        conn: Arc<Conn>,
        r: Reply,
        path: &[u8],
        cred: &Cred,
        flags: i32,
        ident: Option<(u64, u64)>,
    ) -> Result<Box<dyn BackendFile>> {
        match r {
            Reply::Opened { handle, writable } => Ok(Box::new(
                self.remote_file(conn, handle, writable, path, cred, flags, ident),
            )),
            _ => Err(Error::Os(libc::EPROTO)),
        }
    }

    /// `Open` of `path` on `conn` as `cred` (the caller's umask when `flags` may create):
    /// the open file, whose reopen must find `ident` if given.
    fn open_path(
        &self,
        conn: Arc<Conn>,
        cred: &Cred,
        path: &[u8],
        flags: i32,
        mode: u32,
        ident: Option<(u64, u64)>,
    ) -> Result<RemoteFile> {
        let req = Request::Open {
            path: path.to_vec(),
            flags,
            mode,
            umask: open_umask(flags),
        };
        let Reply::Opened { handle, writable } = conn.call_as(&cred.into(), req)? else {
            return Err(Error::Os(libc::EPROTO));
        };
        Ok(self.remote_file(conn, handle, writable, path, cred, flags, ident))
    }

    /// The open file `handle` on `conn` (see [`Self::file`]).
    #[allow(clippy::too_many_arguments)]
    fn remote_file(
        &self,
        conn: Arc<Conn>,
        handle: u64,
        writable: bool,
        path: &[u8],
        cred: &Cred,
        flags: i32,
        ident: Option<(u64, u64)>,
    ) -> RemoteFile {
        let state = Arc::new(reopen::OpenState::new(
            conn,
            handle,
            path,
            cred.into(),
            flags,
            ident,
        ));
        let id = self.link.register(&state);
        RemoteFile {
            link: self.link.clone(),
            state,
            id,
            writable,
            closed: false,
        }
    }
}

/// An open file on the server: a handle, reopened on a new connection after the old one was
/// lost (client/reopen.rs); closed when dropped.
pub struct RemoteFile {
    link: Arc<reopen::Link>,
    state: Arc<reopen::OpenState>,
    /// Its key in the link's table of open files.
    id: u64,
    writable: bool,
    /// Closed already ([`RemoteFile::close_async`]): nothing to do when dropped.
    closed: bool,
}

impl RemoteFile {
    /// The live connection and the file's handle on it.
    fn at(&self) -> Result<(Arc<Conn>, u64)> {
        self.state.live(&self.link)
    }

    /// What a change through this handle makes stale in the prefetch buffer: what a
    /// callback for its path would, every listing of another name of an inode, and every
    /// listing naming this inode when known (a rename on the server this client has not heard
    /// of yet may have moved it).
    pub(super) fn stale(&self) -> Vec<Stale> {
        let mut v = stale_of(&self.state.path());
        v.push(Stale::Linked);
        if let Some((_, ino)) = self.state.at.lock().ident {
            v.push(Stale::Ino(ino));
        }
        v
    }

    /// Close the handle without waiting for the answer.
    fn close_async(mut self) {
        self.closed = true;
        self.link.forget(self.id);
        let (conn, handle) = {
            let at = self.state.at.lock();
            (at.conn.clone(), at.handle)
        };
        if !conn.closed.load(Ordering::SeqCst) {
            let _ = conn.start(&conn.own.clone(), Request::Close { handle });
        }
    }
}

impl Drop for RemoteFile {
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        self.link.forget(self.id);
        let (conn, handle) = {
            let at = self.state.at.lock();
            (at.conn.clone(), at.handle)
        };
        if conn.closed.load(Ordering::SeqCst) {
            return;
        }
        if let Err(e) = conn.call(Request::Close { handle }) {
            tracing::debug!("close of remote handle {handle}: {e}");
        }
    }
}

impl BackendFile for RemoteFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        let (conn, handle) = self.at()?;
        // Every chunk asked for at once; the answers are taken in order.
        let mut calls = Vec::new();
        for (i, c) in buf.chunks(MAX_IO).enumerate() {
            calls.push((
                c.len(),
                conn.start(
                    &conn.own.clone(),
                    Request::Read {
                        handle,
                        offset: offset + (i * MAX_IO) as u64,
                        len: c.len() as u32,
                    },
                )?,
            ));
        }
        let mut done = 0usize;
        for (want, rx) in calls {
            let data = match rx.recv() {
                Ok(Ok((_, Ok(Reply::Data(d))))) => d,
                Ok(Ok((_, Err(e)))) if done == 0 => return Err(Error::from_errno(e)),
                Ok(Ok((_, Err(_)))) => break,
                _ if done == 0 => return Err(eio()),
                _ => break,
            };
            let n = data.len().min(want);
            buf[done..done + n].copy_from_slice(&data[..n]);
            done += n;
            if n < want {
                break;
            }
        }
        Ok(done)
    }

    fn write_at(&self, cred: &Cred, data: &[u8], offset: u64, append: bool) -> Result<usize> {
        let (conn, handle) = self.at()?;
        let mut done = 0usize;
        for c in data.chunks(MAX_IO) {
            let r = conn.call_touching(
                &cred.into(),
                Request::Write {
                    handle,
                    offset: offset + done as u64,
                    data: c.to_vec(),
                    append,
                },
                Some(self.stale()),
            );
            match r.and_then(want_count) {
                Ok(n) => {
                    done += n as usize;
                    if (n as usize) < c.len() {
                        break;
                    }
                }
                Err(e) if done == 0 => return Err(e),
                Err(_) => break,
            }
        }
        Ok(done)
    }

    fn sync(&self, datasync: bool) -> Result<()> {
        let (conn, handle) = self.at()?;
        want_unit(conn.call(Request::Sync { handle, datasync })?)
    }

    fn allocate(&self, cred: &Cred, mode: i32, offset: u64, len: u64) -> Result<()> {
        let (conn, handle) = self.at()?;
        want_unit(conn.call_touching(
            &cred.into(),
            Request::Allocate {
                handle,
                mode,
                offset,
                len,
            },
            Some(self.stale()),
        )?)
    }

    fn seek(&self, offset: i64, whence: Whence) -> Result<u64> {
        let whence = match whence {
            Whence::Set => libc::SEEK_SET,
            Whence::Cur => libc::SEEK_CUR,
            Whence::End => libc::SEEK_END,
            Whence::Data => libc::SEEK_DATA,
            Whence::Hole => libc::SEEK_HOLE,
        };
        let (conn, handle) = self.at()?;
        want_count(conn.call(Request::Seek {
            handle,
            offset,
            whence,
        })?)
    }

    fn set_size(&self, cred: &Cred, size: u64) -> Result<()> {
        let (conn, handle) = self.at()?;
        want_unit(conn.call_touching(
            &cred.into(),
            Request::SetSize { handle, size },
            Some(self.stale()),
        )?)
    }

    fn setattr(&self, cred: &Cred, set: &SetAttr) -> Result<Attr> {
        let (conn, handle) = self.at()?;
        want_attr(conn.call_touching(
            &cred.into(),
            Request::FileSetattr { handle, set: *set },
            Some(self.stale()),
        )?)
    }

    fn attr(&self) -> Result<Attr> {
        let (conn, handle) = self.at()?;
        let a = want_attr(conn.call(Request::FileAttr { handle })?)?;
        // What was opened: the identity a reopen must find (client/reopen.rs).
        self.state.at.lock().ident.get_or_insert((a.dev, a.ino));
        Ok(a)
    }

    fn writable(&self) -> bool {
        self.writable
    }
}
