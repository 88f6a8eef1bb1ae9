//! The server side: `dircache serve --stdio ROOT` speaks the protocol over any pair of byte
//! streams, answering from a [`Backend`] (the local backend over ROOT, which confines every
//! path to ROOT: no symlink, `..` or rename-race escape; see dircache_local).
//!
//! **Concurrency and memory.** One reader thread decodes frames (each at most
//! [`MAX_CLIENT_FRAME`](crate::proto::MAX_CLIENT_FRAME) bytes) and queues calls on a bounded
//! queue ([`ServerConfig::queue`]) served by a small pool of workers
//! ([`ServerConfig::workers`]); when the queue is full the reader stops reading, so a client
//! that floods the server is slowed down, never buffered without bound. Replies go through a
//! bounded queue to one writer thread. Open files are limited to
//! [`ServerConfig::max_handles`] per connection (EMFILE beyond).
//!
//! **Errors.** A malformed frame (undecodable, oversized, a second hello, trailing bytes)
//! closes the connection with an error logged; the server never panics on input.
//!
//! **Credentials.** A server running as root (the client logged in as root) acts with the
//! credentials each call carries, as the local FUSE daemon does for its callers; any other
//! server acts as its own user whatever the call says, as sftp-server does (docs/security.md).
//!
//! **Callbacks.** With the `CALLBACKS` feature the server forwards its backend's change feed
//! ([`Backend::watch`]: fanotify as root, inotify otherwise) as [`ServerMsg::Callback`]s.

use std::collections::HashMap;
use std::io::{BufWriter, Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_channel::{bounded, select, Receiver, Sender};
use dircache_core::{Backend, BackendFile, Cred, DirEntry, Error, SetAttr, Whence, XattrTarget};
use parking_lot::Mutex;

mod echoes;
mod search;
mod subtree;

use echoes::{Decision, Echoes, Post};

use crate::frame::{encode_frame, read_frame};
use crate::proto::{
    decode, encode, features, Bytes, Callback, ClientMsg, Hello, OpenHow, ProtoError, Reply,
    Request, ServerMsg, Target, WireCred, ENTRIES_PER_FRAME, MAX_CLIENT_FRAME, MAX_IO,
    MAX_SERVER_FRAME,
};

/// How a server runs.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Worker threads answering calls.
    pub workers: usize,
    /// Calls decoded but not yet taken by a worker.
    pub queue: usize,
    /// Open files per connection.
    pub max_handles: usize,
    /// Act with the credentials calls carry (root servers); else as `own`.
    pub act_as_client: bool,
    /// The server's own credentials.
    pub own: Cred,
    /// Features this server offers.
    pub features: u64,
    /// Largest subtree budget a client may ask for.
    pub max_subtree: u64,
    /// The served root (an `O_PATH` descriptor) delegated searches run beneath; `None`: no
    /// searches (EOPNOTSUPP).
    pub search_root: Option<Arc<std::os::fd::OwnedFd>>,
    /// Follow each callback by path that names a non-directory with other links by the
    /// callback of its inode (`cached::linked_inode`), so every name of a hard-linked file
    /// drops its attributes. Off for a backend whose feed does it itself ([`crate::CachedBackend`]).
    pub link_callbacks: bool,
    /// The backend's change feed reports this server's own changes too (inotify): hold
    /// and drop those it made for its client (server/echoes.rs). Off when the feed leaves
    /// them out itself (fanotify as root): every change it reports is someone else's.
    pub own_echoes: bool,
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        let uid = rustix::process::geteuid().as_raw();
        let gid = rustix::process::getegid().as_raw();
        ServerConfig {
            workers: 4,
            queue: 64,
            max_handles: 4096,
            act_as_client: uid == 0,
            own: Cred::new(uid, gid, []),
            features: features::ALL,
            max_subtree: 1 << 20,
            search_root: None,
            link_callbacks: true,
            own_echoes: true,
        }
    }
}

struct Shared {
    backend: Arc<dyn Backend>,
    cfg: ServerConfig,
    out: Sender<Vec<u8>>,
    handles: Mutex<HashMap<u64, Arc<dyn BackendFile>>>,
    next_handle: AtomicU64,
    searches: Arc<search::Running>,
    /// `Subtree` calls in flight, for [`ClientMsg::Hurry`].
    walks: subtree::Walks,
    /// The features the handshake granted.
    granted: u64,
    /// The paths of open handles (what their writes change), for `echoes`.
    handle_paths: Mutex<HashMap<u64, Vec<u8>>>,
    /// This client's own changes, not called back to it (server/echoes.rs).
    echoes: Arc<Echoes>,
}

struct Job {
    id: u64,
    cred: WireCred,
    req: Request,
}

fn send(out: &Sender<Vec<u8>>, msg: &ServerMsg) -> bool {
    match encode(msg).and_then(|p| Ok(encode_frame(&p, MAX_SERVER_FRAME)?)) {
        Ok(f) => out.send(f).is_ok(),
        Err(e) => {
            tracing::error!("cannot encode a reply: {e}");
            // A reply that cannot be sent still ends its call (EIO), or the client would wait
            // for it forever.
            if let ServerMsg::Reply { id, .. } = msg {
                return send(
                    out,
                    &ServerMsg::Reply {
                        id: *id,
                        last: true,
                        body: Err(libc::EIO),
                    },
                );
            }
            false
        }
    }
}

/// Serve one connection until the client closes it (`Ok`) or breaks the protocol (`Err`,
/// also logged). Returns when every worker has finished.
pub fn serve<R, W>(
    backend: Arc<dyn Backend>,
    mut input: R,
    output: W,
    cfg: ServerConfig,
) -> Result<(), ProtoError>
where
    R: Read,
    W: Write + Send + 'static,
{
    let (out_tx, out_rx) = bounded::<Vec<u8>>(256);
    let writer = std::thread::Builder::new()
        .name("dircache-serve-writer".into())
        .spawn(move || write_loop(output, out_rx))
        .map_err(|e| ProtoError::Frame(e.into()))?;
    let result = (|| {
        let granted = handshake(&mut input, &out_tx, cfg.features)?;
        let shared = Arc::new(Shared {
            backend,
            cfg,
            out: out_tx.clone(),
            handles: Mutex::new(HashMap::new()),
            next_handle: AtomicU64::new(1),
            searches: Arc::default(),
            walks: subtree::Walks::default(),
            granted,
            handle_paths: Mutex::new(HashMap::new()),
            echoes: Arc::default(),
        });
        let (stop_tx, stop_rx) = bounded::<()>(0);
        let mut threads = Vec::new();
        if granted & features::CALLBACKS != 0 {
            match shared.backend.watch() {
                Ok(Some(feed)) => {
                    let out = out_tx.clone();
                    let stop = stop_rx.clone();
                    let links = shared.cfg.link_callbacks.then(|| shared.backend.clone());
                    let own = shared
                        .cfg
                        .own_echoes
                        .then(|| (shared.echoes.clone(), shared.backend.clone()));
                    threads.push(
                        std::thread::Builder::new()
                            .name("dircache-serve-callbacks".into())
                            .spawn(move || callback_loop(feed, links, stop, out, own))
                            .map_err(|e| ProtoError::Frame(e.into()))?,
                    );
                }
                Ok(None) => tracing::info!("backend reports no changes: no callbacks"),
                Err(e) => tracing::warn!("no change feed, no callbacks: {e}"),
            }
        }
        let (job_tx, job_rx) = bounded::<Job>(shared.cfg.queue.max(1));
        for i in 0..shared.cfg.workers.max(1) {
            let s = shared.clone();
            let rx = job_rx.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("dircache-serve-{i}"))
                    .spawn(move || {
                        while let Ok(job) = rx.recv() {
                            answer(&s, job);
                        }
                    })
                    .map_err(|e| ProtoError::Frame(e.into()))?,
            );
        }
        let mut calls = 0u64;
        let read = read_loop(&mut input, &job_tx, &shared.walks, &mut calls);
        tracing::info!("connection ends after {calls} calls");
        if let Err(e) = &read {
            tracing::error!("closing the connection: {e}");
        }
        drop(job_tx);
        drop(stop_tx);
        shared.searches.cancel_all();
        for t in threads {
            let _ = t.join();
        }
        shared.handles.lock().clear();
        read
    })();
    if let Err(ProtoError::Version { .. } | ProtoError::NotDircache) = &result {
        if let Err(e) = &result {
            send(&out_tx, &ServerMsg::Refused(e.to_string()));
        }
    }
    drop(out_tx);
    let _ = writer.join();
    result
}

fn handshake<R: Read>(input: &mut R, out: &Sender<Vec<u8>>, ours: u64) -> Result<u64, ProtoError> {
    let Some(frame) = read_frame(input, MAX_CLIENT_FRAME)? else {
        return Err(ProtoError::Closed);
    };
    let hello = match decode::<ClientMsg>(&frame) {
        Ok(ClientMsg::Hello(h)) => h,
        Ok(_) => return Err(ProtoError::Unexpected("a call before the hello".into())),
        Err(_) => return Err(ProtoError::NotDircache),
    };
    hello.check()?;
    let granted = hello.features & ours;
    if !send(out, &ServerMsg::Hello(Hello::new(granted))) {
        return Err(ProtoError::Closed);
    }
    Ok(granted)
}

fn read_loop<R: Read>(
    input: &mut R,
    jobs: &Sender<Job>,
    walks: &subtree::Walks,
    calls: &mut u64,
) -> Result<(), ProtoError> {
    loop {
        let Some(frame) = read_frame(input, MAX_CLIENT_FRAME)? else {
            return Ok(());
        };
        match decode::<ClientMsg>(&frame)? {
            ClientMsg::Hello(_) => return Err(ProtoError::Unexpected("a second hello".into())),
            ClientMsg::Call { id, cred, req } => {
                *calls += 1;
                if jobs.send(Job { id, cred, req }).is_err() {
                    return Err(ProtoError::Closed);
                }
            }
            // Here, not queued: it must overtake the call's walk, and a full queue.
            ClientMsg::Hurry { call, dir } => walks.hurry(call, &dir),
        }
    }
}

fn write_loop<W: Write>(output: W, rx: Receiver<Vec<u8>>) {
    let mut w = BufWriter::with_capacity(256 * 1024, output);
    while let Ok(frame) = rx.recv() {
        if w.write_all(&frame).is_err() {
            return;
        }
        // Flush when nothing else is waiting: replies queued together leave together.
        while let Ok(more) = rx.try_recv() {
            if w.write_all(&more).is_err() {
                return;
            }
        }
        if w.flush().is_err() {
            return;
        }
    }
}

/// Forward the feed's changes as callbacks, each change by path followed by its inode's when
/// `links` (the backend, asked directly) says it names a hard-linked file. A change of a path
/// this client's own calls changed is held and decided by `own` (server/echoes.rs): dropped
/// when it is the client's own.
fn callback_loop(
    feed: dircache_core::ChangeFeed,
    links: Option<Arc<dyn Backend>>,
    stop: Receiver<()>,
    out: Sender<Vec<u8>>,
    own: Option<(Arc<Echoes>, Arc<dyn Backend>)>,
) {
    let forward = |c: &dircache_core::Change| {
        tracing::debug!("callback {c:?}");
        send(&out, &ServerMsg::Callback(Callback::from(c)))
    };
    let mut held: Vec<echoes::Held> = Vec::new();
    let mut pruned = std::time::Instant::now();
    loop {
        let tick = if held.is_empty() {
            crossbeam_channel::never()
        } else {
            crossbeam_channel::after(std::time::Duration::from_millis(5))
        };
        select! {
            recv(feed) -> c => match c {
                Ok(c) => {
                    let inode = links.as_ref().and_then(|b| crate::cached::linked_inode(&**b, &c));
                    if own.as_ref().is_some_and(|(e, _)| e.concerns(&c)) {
                        held.push(Echoes::hold(c));
                    } else if !forward(&c) {
                        return;
                    }
                    if let Some(i) = &inode {
                        if !forward(i) {
                            return;
                        }
                    }
                }
                Err(_) => return,
            },
            recv(stop) -> _ => return,
            recv(tick) -> _ => {}
        }
        let Some((echoes, backend)) = &own else {
            continue;
        };
        let mut gone = false;
        held.retain(|h| match echoes.decide(h, |p| backend.getattr(p)) {
            Decision::Wait => true,
            Decision::Drop => {
                tracing::debug!("callback {:?}: this client's own change", h.change);
                false
            }
            Decision::Forward => {
                gone |= !forward(&h.change);
                false
            }
        });
        if gone {
            return;
        }
        if pruned.elapsed() > std::time::Duration::from_secs(1) {
            echoes.prune();
            pruned = std::time::Instant::now();
        }
    }
}

/// How a call's reply tells the client what became of a path it changes.
#[derive(Clone, Copy)]
enum Told {
    /// Its attributes (an `Attr` or `OpenedPlus` reply).
    Attr,
    /// That it is gone.
    Absent,
    Nothing,
}

/// The paths `req` changes, and what its reply tells of each (server/echoes.rs).
fn own_paths(s: &Shared, req: &Request) -> Vec<(Vec<u8>, Told)> {
    let on_handle = |h: &u64, t: Told| match s.handle_paths.lock().get(h) {
        Some(p) => vec![(p.clone(), t)],
        None => Vec::new(),
    };
    let creates = |flags: &i32| flags & (libc::O_CREAT | libc::O_TRUNC) != 0;
    match req {
        Request::Mknod { path, .. }
        | Request::Mkdir { path, .. }
        | Request::Symlink { path, .. } => {
            vec![(path.clone(), Told::Attr)]
        }
        Request::Link { new, .. } => vec![(new.clone(), Told::Attr)],
        Request::Unlink { path } | Request::Rmdir { path } => vec![(path.clone(), Told::Absent)],
        Request::Rename { old, new, mode } => {
            let o = if *mode == dircache_core::RenameMode::Exchange {
                Told::Nothing
            } else {
                Told::Absent
            };
            vec![(old.clone(), o), (new.clone(), Told::Nothing)]
        }
        Request::Setattr { path, .. } => vec![(path.clone(), Told::Attr)],
        Request::Setxattr { target, .. } | Request::Removexattr { target, .. } => {
            vec![(target.path.clone(), Told::Nothing)]
        }
        Request::Open { path, flags, .. } if creates(flags) => vec![(path.clone(), Told::Nothing)],
        Request::OpenVerified { target, flags } if creates(flags) => {
            vec![(target.path.clone(), Told::Nothing)]
        }
        Request::OpenPlus { how, .. } => match how {
            OpenHow::Path { path, flags, .. } if creates(flags) => vec![(path.clone(), Told::Attr)],
            OpenHow::Verified { target, flags } if creates(flags) => {
                vec![(target.path.clone(), Told::Attr)]
            }
            _ => Vec::new(),
        },
        Request::Write { handle, .. }
        | Request::SetSize { handle, .. }
        | Request::Allocate { handle, .. } => on_handle(handle, Told::Nothing),
        Request::FileSetattr { handle, .. } | Request::Store { handle, .. } => {
            on_handle(handle, Told::Attr)
        }
        _ => Vec::new(),
    }
}

/// What `r` told the client of a path, as `told` says.
fn post_of(told: Told, r: &dircache_core::Result<Reply>) -> Post {
    match (told, r) {
        (Told::Attr, Ok(Reply::Attr(a))) | (Told::Attr, Ok(Reply::OpenedPlus { attr: a, .. })) => {
            Post::Attr(*a)
        }
        (Told::Absent, Ok(_)) => Post::Absent,
        _ => Post::Unknown,
    }
}

fn target(t: &Target) -> XattrTarget<'_> {
    XattrTarget {
        path: &t.path,
        expect: t.expect,
        birth: t.birth,
        open: None,
    }
}

fn errno(e: Error) -> i32 {
    e.errno()
}

fn answer(s: &Shared, job: Job) {
    let Job { id, cred, req } = job;
    let wire = cred;
    let cred = if s.cfg.act_as_client {
        Cred::from(&wire)
    } else {
        s.cfg.own.clone()
    };
    let reply = |body: Result<Reply, i32>| {
        send(
            &s.out,
            &ServerMsg::Reply {
                id,
                last: true,
                body,
            },
        );
    };
    let b = &*s.backend;
    // The directories whose names the call changes (features::PARENTS), each once.
    let mut dirs: Vec<Vec<u8>> = Vec::new();
    if s.granted & features::PARENTS != 0 {
        for p in req.names_changed() {
            let d = crate::prefetch::parent(p).to_vec();
            if !dirs.contains(&d) {
                dirs.push(d);
            }
        }
    }
    let own = own_paths(s, &req);
    let own_list: Vec<Vec<u8>> = own.iter().map(|(p, _)| p.clone()).collect();
    if !own.is_empty() {
        s.echoes.begin(&own_list);
    }
    // The path an open's handle writes to.
    let opens = match &req {
        Request::Open { path, .. } => Some(path.clone()),
        Request::OpenVerified { target, .. } => Some(target.path.clone()),
        Request::OpenPlus { how, .. } => Some(match how {
            OpenHow::Path { path, .. } => path.clone(),
            OpenHow::Verified { target, .. } => target.path.clone(),
        }),
        _ => None,
    };
    if let Request::Close { handle } = &req {
        s.handle_paths.lock().remove(handle);
    }
    let r: dircache_core::Result<Reply> = match req {
        Request::Readdir { path, plus } => {
            match b.readdir(&path, plus) {
                Ok(entries) => stream_entries(s, id, entries),
                Err(e) => reply(Err(errno(e))),
            }
            return;
        }
        Request::Subtree { path, budget } => {
            let names = s.granted & features::NAMES != 0;
            subtree::run(s, id, &path, budget.min(s.cfg.max_subtree), names);
            return;
        }
        Request::Search {
            paths,
            pattern,
            flags,
        } => {
            search::start(s, id, &wire, paths, pattern, flags);
            return;
        }
        Request::Cancel { call } => {
            s.searches.cancel(call);
            Ok(Reply::Unit)
        }
        Request::Walk { dir, names } => {
            let names: Vec<&[u8]> = names.iter().map(|n| n.0.as_slice()).collect();
            let w = b.walk(&dir, &names);
            Ok(Reply::Walked {
                attrs: w.attrs,
                error: w.error.map(errno),
            })
        }
        Request::Lookup { dir, name } => b.lookup(&dir, &name).map(Reply::Attr),
        Request::Getattr { path } => b.getattr(&path).map(Reply::Attr),
        Request::Readlink { path } => b.readlink(&path).map(Reply::Data),
        Request::Mknod {
            path,
            mode,
            rdev,
            umask,
        } => with_umask(mode, umask, |m| b.mknod(&cred, &path, m, rdev)).map(Reply::Attr),
        Request::Mkdir { path, mode, umask } => {
            with_umask(mode, umask, |m| b.mkdir(&cred, &path, m)).map(Reply::Attr)
        }
        Request::Symlink { target, path } => b.symlink(&cred, &target, &path).map(Reply::Attr),
        Request::Link { old, new } => b.link(&cred, &old, &new).map(Reply::Attr),
        Request::Unlink { path } => b.unlink(&cred, &path).map(|()| Reply::Unit),
        Request::Rmdir { path } => b.rmdir(&cred, &path).map(|()| Reply::Unit),
        Request::Rename { old, new, mode } => {
            b.rename(&cred, &old, &new, mode).map(|()| Reply::Unit)
        }
        Request::Setattr { path, set } => b.setattr(&cred, &path, &set).map(Reply::Attr),
        Request::Statfs { path } => b.statfs(&path).map(Reply::StatFs),
        Request::Getxattr { target: t, name } => {
            b.getxattr(&cred, target(&t), &name).map(Reply::Data)
        }
        Request::Listxattr { target: t } => b.listxattr(&cred, target(&t)).map(Reply::Data),
        Request::Setxattr {
            target: t,
            name,
            value,
            flags,
        } => b
            .setxattr(&cred, target(&t), &name, &value, flags)
            .map(|()| Reply::Unit),
        Request::Removexattr { target: t, name } => b
            .removexattr(&cred, target(&t), &name)
            .map(|()| Reply::Unit),
        Request::Fsyncdir {
            target: t,
            datasync,
        } => b
            .fsyncdir(&cred, target(&t), datasync)
            .map(|()| Reply::Unit),
        Request::Open {
            path,
            flags,
            mode,
            umask,
        } => with_umask(mode, umask, |m| b.open(&cred, &path, flags, m)).and_then(|f| opened(s, f)),
        Request::OpenVerified { target: t, flags } => b
            .open_verified(&cred, target(&t), flags)
            .and_then(|f| opened(s, f)),
        Request::OpenPlus { how, read, upto } => {
            let f = match how {
                OpenHow::Path {
                    path,
                    flags,
                    mode,
                    umask,
                } => with_umask(mode, umask, |m| b.open(&cred, &path, flags, m)),
                OpenHow::Verified { target: t, flags } => b.open_verified(&cred, target(&t), flags),
            };
            f.and_then(|f| opened_plus(s, f, read, upto))
        }
        Request::Close { handle } => match s.handles.lock().remove(&handle) {
            Some(_) => Ok(Reply::Unit),
            None => Err(Error::Os(libc::EBADF)),
        },
        Request::Read {
            handle,
            offset,
            len,
        } => file(s, handle).and_then(|f| {
            let mut buf = vec![0u8; (len as usize).min(MAX_IO)];
            let n = f.read_at(&mut buf, offset)?;
            buf.truncate(n);
            Ok(Reply::Data(buf))
        }),
        Request::Write {
            handle,
            offset,
            data,
            append,
        } => file(s, handle)
            .and_then(|f| f.write_at(&cred, &data, offset, append))
            .map(|n| Reply::Count(n as u64)),
        Request::Sync { handle, datasync } => file(s, handle)
            .and_then(|f| f.sync(datasync))
            .map(|()| Reply::Unit),
        Request::Allocate {
            handle,
            mode,
            offset,
            len,
        } => file(s, handle)
            .and_then(|f| f.allocate(&cred, mode, offset, len))
            .map(|()| Reply::Unit),
        Request::Seek {
            handle,
            offset,
            whence,
        } => Whence::from_raw(whence)
            .and_then(|w| file(s, handle).and_then(|f| f.seek(offset, w)))
            .map(Reply::Count),
        Request::SetSize { handle, size } => file(s, handle)
            .and_then(|f| f.set_size(&cred, size))
            .map(|()| Reply::Unit),
        Request::FileSetattr { handle, set } => file(s, handle)
            .and_then(|f| f.setattr(&cred, &set))
            .map(Reply::Attr),
        Request::FileAttr { handle } => file(s, handle).and_then(|f| f.attr()).map(Reply::Attr),
        Request::Store {
            handle,
            offset,
            data,
            size,
            set,
        } => file(s, handle).and_then(|f| store(&*f, &cred, offset, &data, size, &set)),
    };
    if !own.is_empty() {
        let posts: Vec<Post> = own.iter().map(|(_, t)| post_of(*t, &r)).collect();
        s.echoes.end(&own_list, &posts);
    }
    if let (Some(p), Ok(Reply::Opened { handle, .. } | Reply::OpenedPlus { handle, .. })) =
        (opens, &r)
    {
        s.handle_paths.lock().insert(*handle, p);
    }
    let r = match r {
        // Read after the call was done (the cache forgot them with its own change).
        Ok(r) if !dirs.is_empty() => Ok(Reply::Parents {
            parents: dirs
                .into_iter()
                .filter_map(|d| b.getattr(&d).ok().map(|a| (Bytes(d), a)))
                .collect(),
            reply: Box::new(r),
        }),
        r => r,
    };
    reply(r.map_err(errno));
}

/// [`Request::Store`] on `f`: the data, the size, then `set`, in that order.
fn store(
    f: &dyn BackendFile,
    cred: &Cred,
    offset: u64,
    data: &[u8],
    size: u64,
    set: &SetAttr,
) -> dircache_core::Result<Reply> {
    if data.len() > MAX_IO {
        return Err(Error::Os(libc::EINVAL));
    }
    let mut done = 0;
    while done < data.len() {
        let n = f.write_at(cred, &data[done..], offset + done as u64, false)?;
        if n == 0 {
            return Err(Error::Os(libc::EIO));
        }
        done += n;
    }
    f.set_size(cred, size)?;
    let nothing = SetAttr::default();
    if *set == nothing {
        return f.attr().map(Reply::Attr);
    }
    match f.setattr(cred, set) {
        Ok(a) => Ok(Reply::Attr(a)),
        // Not the owner: the times stay as the writes left them.
        Err(Error::Os(libc::EPERM)) | Err(Error::Os(libc::EACCES)) => f.attr().map(Reply::Attr),
        Err(e) => Err(e),
    }
}

fn file(s: &Shared, handle: u64) -> dircache_core::Result<Arc<dyn BackendFile>> {
    s.handles
        .lock()
        .get(&handle)
        .cloned()
        .ok_or(Error::Os(libc::EBADF))
}

fn opened(s: &Shared, f: Box<dyn BackendFile>) -> dircache_core::Result<Reply> {
    let writable = f.writable();
    let mut h = s.handles.lock();
    if h.len() >= s.cfg.max_handles {
        return Err(Error::Os(libc::EMFILE));
    }
    let handle = s.next_handle.fetch_add(1, Ordering::Relaxed);
    h.insert(handle, Arc::from(f));
    Ok(Reply::Opened { handle, writable })
}

/// [`Request::OpenPlus`]: `f` registered as [`opened`] does, with its attributes and its
/// first `read` bytes (at most [`MAX_IO`]) when it is a regular file of at most `upto` bytes
/// it can read.
fn opened_plus(
    s: &Shared,
    f: Box<dyn BackendFile>,
    read: u32,
    upto: u64,
) -> dircache_core::Result<Reply> {
    let attr = f.attr()?;
    let data = if read > 0 && attr.mode & libc::S_IFMT == libc::S_IFREG && attr.size <= upto {
        let mut buf = vec![
            0u8;
            (read as usize)
                .min(MAX_IO)
                .min((attr.size as usize).saturating_add(1))
        ];
        // Fewer bytes than asked only at the end of the file: read on after a short read.
        let mut n = 0;
        loop {
            match f.read_at(&mut buf[n..], n as u64) {
                Ok(0) => break Some(n),
                Ok(k) => {
                    n += k;
                    if n == buf.len() {
                        break Some(n);
                    }
                }
                Err(Error::Os(libc::EINTR)) => {}
                // A write-only handle, say: no bytes (the client reads as it would have).
                Err(_) => break None,
            }
        }
        .map(|n| {
            buf.truncate(n);
            Bytes(buf)
        })
    } else {
        None
    };
    let Reply::Opened { handle, writable } = opened(s, f)? else {
        return Err(Error::Os(libc::EIO));
    };
    Ok(Reply::OpenedPlus {
        handle,
        writable,
        attr,
        data,
    })
}

fn stream_entries(s: &Shared, id: u64, entries: Vec<DirEntry>) {
    let mut chunks = entries.chunks(ENTRIES_PER_FRAME).peekable();
    if chunks.peek().is_none() {
        send(
            &s.out,
            &ServerMsg::Reply {
                id,
                last: true,
                body: Ok(Reply::Entries(Vec::new())),
            },
        );
        return;
    }
    while let Some(c) = chunks.next() {
        let last = chunks.peek().is_none();
        if !send(
            &s.out,
            &ServerMsg::Reply {
                id,
                last,
                body: Ok(Reply::Entries(c.to_vec())),
            },
        ) {
            return;
        }
    }
}

thread_local! {
    /// Whether this worker has a file-system context (umask) of its own: None until tried.
    static OWN_FS: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Run creation `f` under the caller's `umask`: with this thread's umask set to it (each
/// worker unshares its fs context once), so the file system applies it unless the parent has
/// a default ACL, as for a local caller; without a private context, the umask is applied to
/// the mode here.
fn with_umask<T>(mode: u32, umask: u32, f: impl FnOnce(u32) -> T) -> T {
    let own = OWN_FS.with(|c| {
        if let Some(v) = c.get() {
            return v;
        }
        // SAFETY: unshare(CLONE_FS) gives this thread a private root, cwd and umask only.
        let ok = unsafe { libc::unshare(libc::CLONE_FS) } == 0;
        c.set(Some(ok));
        ok
    });
    if !own {
        return f(mode & !(umask & 0o777));
    }
    // SAFETY: umask changes only this thread's private fs context.
    let old = unsafe { libc::umask((umask & 0o777) as libc::mode_t) };
    let r = f(mode);
    // SAFETY: as above; restores what was there.
    unsafe { libc::umask(old) };
    r
}
