//! dircache: FUSE over io_uring (Linux `fs/fuse/dev_uring.c`, `Config::io_uring`).
//!
//! After an INIT reply carrying `FUSE_OVER_IO_URING`, one queue per possible CPU gets ring
//! entries registered with `IORING_OP_URING_CMD` SQE128 commands
//! (`FUSE_IO_URING_CMD_REGISTER`; `struct fuse_uring_cmd_req` in the command area; `addr`/`len`
//! an iovec of two buffers: the 288-byte `struct fuse_uring_req_header` and a payload buffer of
//! at least `max(8 KiB, max_write, max_pages pages)`). A completion means a request is in the
//! entry's buffers: the in header in `in_out`, the opcode's own header in `op_in`, the rest in
//! the payload. It is put back together as `/dev/fuse` would have delivered it and dispatched
//! like any other; the reply goes back in the same buffers, committed with
//! `FUSE_IO_URING_CMD_COMMIT_AND_FETCH` (which also waits for the next request). FORGET,
//! INTERRUPT and notifications stay on `/dev/fuse`, whose reader threads keep running.
//!
//! If the kernel refuses the registration (`enable_uring` turned off, an error), it turns
//! io_uring off for the connection itself and requests flow over `/dev/fuse`: the server
//! threads log it and end.
//!
//! **Servers and spares.** Each queue is served by server threads, each with a ring of its
//! own and one entry registered from it, pinned to the queue's CPU. The kernel hands a new
//! request to the queue's most recently made available entry (`ent_avail_queue` is LIFO:
//! `fuse_uring_ent_avail` does `list_move` to its head, `fuse_uring_queue_fuse_req` takes
//! `list_first_entry`), so the thread that just committed an answer gets the next request
//! too, and the other servers sleep in `io_uring_enter` with their entries at the tail. When
//! that thread is busy (blocked in the backend, or simply still working), its entry is not
//! available and the next request from that CPU goes to a spare's entry: the spare takes
//! over without any hand-off on the path of a request. The request's copy into the entry
//! runs as task work in the thread that submitted the entry's last command
//! (`io_uring_cmd_complete_in_task`), which is why each entry has its own thread and ring:
//! an entry last committed by a thread now blocked (uninterruptibly, on a disk) would
//! otherwise wait for that thread.
//!
//! **A spare once blocking was seen.** A spare's entry is available whenever the first
//! server is busy, also for a few microseconds: a RELEASE is sent without waiting for its
//! answer (close(2) returns at once), so the OPEN of an open+close loop arrives while the
//! first server still answers the RELEASE and goes to the spare, a wake-up of a second thread
//! per open (45.8 vs 25.7 µs on a quiet machine, docs/opens.md). With no other entry, the
//! OPEN waits in the queue and the first server's `COMMIT_AND_FETCH` of the RELEASE takes it
//! at once. A registered entry cannot be taken back safely (cancelling it by the thread's
//! exit loses a request the kernel has just given it), so a queue starts with one server
//! and its spare comes only once the session has seen a slow request: one that took at
//! least [`slow_request`] (250 µs unless set) from its completion to its reply, blocked
//! (announced or not) or preempted on a busy machine. A server that served one starts its
//! queue's first spare if the queue has none, and from then on, before a backend call that may
//! block (`crate::may_block`), a server whose queue has no idle spare left starts one more,
//! up to `n_threads` per queue. Until the first slow request of a session, a blocked request
//! holds up the later ones of its CPU (as with `n_threads` = 1, which never adds one).
//! Servers never exit before the connection ends: a thread's exit cancels its entry's
//! command, and one the kernel had just handed a request to would leave that request
//! unanswered (`fuse_uring_send_in_task` with `IO_URING_F_TASK_DEAD`).

use std::io;
use std::io::IoSlice;
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::os::fd::RawFd;
use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::Duration;
use std::time::Instant;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types;
use log::debug;
use log::warn;
use nix::unistd::Uid;
use parking_lot::Mutex;

use crate::Filesystem;
use crate::channel::Channel;
use crate::channel::ChannelSender;
use crate::ll::Operation;
use crate::read_buf::FuseReadBuf;
use crate::request::RequestWithSender;
use crate::session::FilesystemHolder;
use crate::session::SessionACL;
use crate::session::SessionEventLoop;

/// `enum fuse_uring_cmd`.
const FUSE_IO_URING_CMD_REGISTER: u32 = 1;
const FUSE_IO_URING_CMD_COMMIT_AND_FETCH: u32 = 2;
/// `struct fuse_uring_req_header` (protocol 7.42–7.45): `in_out[128]`, `op_in[128]`,
/// `struct fuse_uring_ent_in_out { flags, commit_id, payload_sz, padding, reserved }`.
const HEADER_SIZE: usize = 288;
const OP_IN: usize = 128;
const OP_IN_SIZE: usize = 128;
const ENT_COMMIT_ID: usize = 256 + 8;
const ENT_PAYLOAD_SZ: usize = 256 + 16;
const IN_HEADER: usize = 40;
const OUT_HEADER: usize = 16;
/// `io_uring_enter` flag: wait for completions.
const IORING_ENTER_GETEVENTS: u32 = 1;
/// Server threads a queue starts with: no spare until a slow request was seen.
const START_SERVERS: usize = 1;
/// A request served in at least this long (nanoseconds) makes the session add spares
/// ([`set_slow_request`]).
static SLOW_REQUEST_NS: AtomicU64 = AtomicU64::new(250_000);

/// Requests taken from ring entries by this process, all sessions together.
static SERVED: AtomicU64 = AtomicU64::new(0);
/// Server threads started after the mount (spares added before a backend call), all sessions.
static ADDED: AtomicU64 = AtomicU64::new(0);
/// Server threads whose entry was registered, all sessions.
static REGISTERED: AtomicU64 = AtomicU64::new(0);

/// dircache: how many requests this process has taken from FUSE-over-io_uring entries (all
/// sessions together): tests tell by it that requests came over the ring.
pub fn requests_served() -> u64 {
    SERVED.load(Ordering::Relaxed)
}

/// dircache: how many ring server threads this process started after a mount's first ones
/// (a spare added because every server of a queue was busy when one was about to block).
pub fn servers_added() -> u64 {
    ADDED.load(Ordering::Relaxed)
}

/// dircache: how many ring server threads of this process have registered their entry (all
/// sessions together, the first servers of each queue and the ones added).
pub fn servers_registered() -> u64 {
    REGISTERED.load(Ordering::Relaxed)
}

/// dircache: the time a request taken from a ring entry must take from its completion to its
/// reply for its session to start adding spare servers (250 µs unless set). Process-wide.
pub fn slow_request() -> Duration {
    Duration::from_nanos(SLOW_REQUEST_NS.load(Ordering::Relaxed))
}

/// dircache: sets [`slow_request`] for all sessions of this process.
pub fn set_slow_request(d: Duration) {
    let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    SLOW_REQUEST_NS.store(ns, Ordering::Relaxed);
}

/// One ring entry's buffers (heap memory whose addresses the kernel keeps).
struct RingEnt {
    header: *mut u8,
    payload: *mut u8,
    payload_len: usize,
    iov: Box<[libc::iovec; 2]>,
}

/// One server: a ring of its own and the one entry registered (and committed) from it.
pub(crate) struct Server {
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    sq: Mutex<()>,
    fd: RawFd,
    qid: u16,
    ent: RingEnt,
    /// A command of the entry is with the kernel (its completion is still to come).
    armed: AtomicBool,
}

// SAFETY: the entry's buffers are touched by one party at a time, as the protocol hands them
// over: the kernel until the entry's completion, then the server thread (reassembly) and the
// one reply (`RingSender::send`), then the kernel again from the commit on. The SQ is pushed
// to under `sq` only; the CQ is read by the server thread only.
unsafe impl Send for Server {}
// SAFETY: as above.
unsafe impl Sync for Server {}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Server(queue {})", self.qid)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let e = &self.ent;
        // SAFETY: allocated by `Box::into_raw` in `Server::new` with these lengths; the ring
        // (and with it the registration) is gone once the server is dropped: its thread drops
        // it after its last completion.
        unsafe {
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                e.header,
                HEADER_SIZE,
            )));
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                e.payload,
                e.payload_len,
            )));
        }
    }
}

impl Server {
    fn new(fd: RawFd, qid: u16, payload_len: usize) -> io::Result<Self> {
        // One entry: at most one command in flight.
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(2)?;
        let header = Box::into_raw(vec![0u8; HEADER_SIZE].into_boxed_slice()).cast::<u8>();
        // Zeroed memory from the allocator: pages are not touched until used.
        let payload = Box::into_raw(vec![0u8; payload_len].into_boxed_slice()).cast::<u8>();
        let iov = Box::new([
            libc::iovec {
                iov_base: header.cast(),
                iov_len: HEADER_SIZE,
            },
            libc::iovec {
                iov_base: payload.cast(),
                iov_len: payload_len,
            },
        ]);
        Ok(Self {
            ring,
            sq: Mutex::new(()),
            fd,
            qid,
            ent: RingEnt {
                header,
                payload,
                payload_len,
                iov,
            },
            armed: AtomicBool::new(false),
        })
    }

    /// Pushes one command for the entry and submits it.
    fn command(&self, op: u32, commit_id: u64) -> io::Result<()> {
        let mut cmd = [0u8; 80];
        cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
        cmd[16..18].copy_from_slice(&self.qid.to_ne_bytes());
        let sqe = opcode::UringCmd80::new(types::Fd(self.fd), op)
            .cmd(cmd)
            .addr(Some(self.ent.iov.as_ptr() as u64))
            .build();
        // SAFETY: `Entry128` is `#[repr(C)]` (`struct io_uring_sqe`, then 64 bytes of command):
        // 128 bytes of plain data. FUSE wants `len` (the u32 at offset 24 of `io_uring_sqe`) to
        // be the iovec count, 2; the crate's `UringCmd80` has no setter for it.
        let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
        raw[24..28].copy_from_slice(&2u32.to_ne_bytes());
        // SAFETY: as above, back to the same type.
        let sqe = unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) };
        let _g = self.sq.lock();
        // SAFETY: pushes are serialized by `sq`; the buffers the SQE names live as long as the
        // server, which outlives the ring's use of them (see `Drop`).
        unsafe {
            let mut sq = self.ring.submission_shared();
            if sq.push(&sqe).is_err() {
                return Err(io::Error::other("io_uring submission queue full"));
            }
        }
        self.ring.submitter().submit()?;
        self.armed.store(true, Ordering::Release);
        Ok(())
    }
}

/// Where the reply to a request taken from a ring entry goes.
#[derive(Clone)]
pub(crate) struct RingSender {
    server: Arc<Server>,
    /// `/dev/fuse`, for backing files (an ioctl on the device).
    pub(crate) ch: ChannelSender,
}

impl std::fmt::Debug for RingSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RingSender(queue {})", self.server.qid)
    }
}

impl RingSender {
    /// Writes the reply (out header, then its arguments) into the entry and commits it.
    pub(crate) fn send(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        let e = &self.server.ent;
        let total: usize = data.iter().map(|b| b.len()).sum();
        if total < OUT_HEADER || total - OUT_HEADER > e.payload_len {
            return Err(io::Error::other(
                "reply larger than the ring entry's payload",
            ));
        }
        // SAFETY: the entry belongs to this reply until the commit below (see `Server`).
        let (header, payload) = unsafe {
            (
                std::slice::from_raw_parts_mut(e.header, HEADER_SIZE),
                std::slice::from_raw_parts_mut(e.payload, e.payload_len),
            )
        };
        // The first OUT_HEADER bytes go to the header, the rest to the payload: whole slices.
        let mut at = 0;
        for b in data {
            let mut b: &[u8] = b;
            if at < OUT_HEADER {
                let n = b.len().min(OUT_HEADER - at);
                header[at..at + n].copy_from_slice(&b[..n]);
                at += n;
                b = &b[n..];
            }
            if !b.is_empty() {
                let p = at - OUT_HEADER;
                payload[p..p + b.len()].copy_from_slice(b);
                at += b.len();
            }
        }
        let payload_sz = (total - OUT_HEADER) as u32;
        header[ENT_PAYLOAD_SZ..ENT_PAYLOAD_SZ + 4].copy_from_slice(&payload_sz.to_ne_bytes());
        let commit_id = u64::from_ne_bytes(
            header[ENT_COMMIT_ID..ENT_COMMIT_ID + 8]
                .try_into()
                .expect("8 bytes"),
        );
        self.server
            .command(FUSE_IO_URING_CMD_COMMIT_AND_FETCH, commit_id)
    }
}

/// The queues the kernel makes: one per possible CPU.
fn possible_cpus() -> io::Result<u16> {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    let mut max = 0u16;
    for part in s.trim().split(',') {
        let last = part.rsplit('-').next().unwrap_or(part);
        let n: u16 = last
            .parse()
            .map_err(|_| io::Error::other(format!("bad CPU list {s:?}")))?;
        max = max.max(n);
    }
    Ok(max + 1)
}

/// The rings made at INIT, before its reply: the first servers of every queue.
#[derive(Debug)]
pub(crate) struct Prepared {
    fd: RawFd,
    payload_len: usize,
    max_per_queue: usize,
    /// Per queue (index = qid), its first servers.
    queues: Vec<Vec<Server>>,
}

/// One queue per possible CPU, each with its first servers' rings and entries (nothing
/// registered yet); at most `max_per_queue` servers per queue (at least one).
pub(crate) fn prepare(
    ch: &Channel,
    payload_len: usize,
    max_per_queue: usize,
) -> io::Result<Prepared> {
    let fd = ch.as_fd().as_raw_fd();
    let max_per_queue = max_per_queue.max(1);
    let queues = (0..possible_cpus()?)
        .map(|qid| {
            (0..START_SERVERS.min(max_per_queue))
                .map(|_| Server::new(fd, qid, payload_len))
                .collect::<io::Result<Vec<_>>>()
        })
        .collect::<io::Result<Vec<_>>>()?;
    Ok(Prepared {
        fd,
        payload_len,
        max_per_queue,
        queues,
    })
}

/// Starts a server thread of `queue` (type-erased over the file system).
type Spawn = dyn Fn(Arc<Queue>, Arc<Server>) -> io::Result<JoinHandle<()>> + Send + Sync;

/// What the server threads of one session share.
pub(crate) struct Pool {
    fd: RawFd,
    payload_len: usize,
    max_per_queue: usize,
    spawn: Box<Spawn>,
    /// Every server thread started, and whether the session stopped taking new ones.
    threads: Mutex<(Vec<JoinHandle<()>>, bool)>,
    /// The kernel refused the ring (logged once).
    refused: AtomicBool,
    /// A request took at least `slow_request()`: queues add spares from now on.
    slow_seen: AtomicBool,
}

impl Pool {
    fn start(&self, queue: Arc<Queue>, server: Server) -> io::Result<()> {
        let mut t = self.threads.lock();
        if t.1 {
            return Err(io::Error::other("the session is ending"));
        }
        let h = (self.spawn)(queue, Arc::new(server))?;
        t.0.push(h);
        Ok(())
    }
}

/// One queue's servers.
pub(crate) struct Queue {
    qid: u16,
    pool: Arc<Pool>,
    /// Server threads started (or starting).
    servers: AtomicUsize,
    /// Of them, the ones serving a request right now.
    busy: AtomicUsize,
}

impl Queue {
    /// A server of this queue took `took` for its request: from the session's first slow
    /// one on, spares are added; a queue of one server gets its first spare now. (More only
    /// before backend calls, as before: a request slowed by a busy machine adds no third.)
    fn served_in(self: &Arc<Self>, took: Duration) {
        if took < slow_request() {
            return;
        }
        if !self.pool.slow_seen.swap(true, Ordering::AcqRel) {
            debug!(
                "FUSE over io_uring: queue {}: a request took {took:?}: spare servers from now on",
                self.qid
            );
        }
        if self.servers.load(Ordering::Acquire) == 1 {
            self.spare_before_blocking();
        }
    }

    /// Called by a server of this queue before it may block: once the session has seen a
    /// slow request, if no other server is idle (its entry available for the next request),
    /// start one more, within the bound.
    fn spare_before_blocking(self: &Arc<Self>) {
        if !self.pool.slow_seen.load(Ordering::Acquire) {
            return;
        }
        let servers = self.servers.load(Ordering::Acquire);
        if servers >= self.pool.max_per_queue || self.busy.load(Ordering::Acquire) < servers {
            return;
        }
        if self
            .servers
            .compare_exchange(servers, servers + 1, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            // Another server of this queue is adding one right now.
            return;
        }
        let added = Server::new(self.pool.fd, self.qid, self.pool.payload_len)
            .and_then(|s| self.pool.start(self.clone(), s));
        match added {
            Ok(()) => {
                ADDED.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                self.servers.fetch_sub(1, Ordering::AcqRel);
                debug!(
                    "FUSE over io_uring: queue {}: no spare server added: {e}",
                    self.qid
                );
            }
        }
    }
}

thread_local! {
    /// The queue this thread serves, if it is a ring server.
    static SERVING: RefCell<Option<Arc<Queue>>> = const { RefCell::new(None) };
}

/// The calling request handler may block (`crate::may_block`): on a ring server whose queue
/// has no idle spare, start one. Nothing else to do: the kernel hands the queue's next request
/// to an idle server's entry by itself.
pub(crate) fn may_block() {
    SERVING.with(|s| {
        if let Some(q) = s.borrow().as_ref() {
            q.spare_before_blocking();
        }
    });
}

/// The server threads of one session.
pub(crate) struct RingThreads(Option<Arc<Pool>>);

impl RingThreads {
    /// Waits for every server thread, also the ones started meanwhile; false if one panicked.
    pub(crate) fn join(self) -> bool {
        let Some(pool) = self.0 else {
            return true;
        };
        let mut ok = true;
        loop {
            let next = {
                let mut t = pool.threads.lock();
                let next = t.0.pop();
                if next.is_none() {
                    // A server still running could not be joined here: none is.
                    t.1 = true;
                }
                next
            };
            match next {
                Some(h) => ok &= h.join().is_ok(),
                None => return ok,
            }
        }
    }
}

/// Starts the first server threads of every queue, each registering its entry and serving
/// its requests until the connection ends or the kernel refuses the ring.
pub(crate) fn start<FS: Filesystem>(
    prepared: Option<Prepared>,
    ch: &Channel,
    filesystem: &Arc<FilesystemHolder<FS>>,
    allowed: SessionACL,
    session_owner: Uid,
    thread_start: Option<crate::ThreadStart>,
) -> io::Result<RingThreads> {
    let Some(prepared) = prepared else {
        return Ok(RingThreads(None));
    };
    let (ch, filesystem) = (ch.clone(), filesystem.clone());
    let spawn = move |queue: Arc<Queue>, server: Arc<Server>| {
        let name = format!("fuser-uring-{}", queue.qid);
        let se = SessionEventLoop {
            thread_name: name.clone(),
            filesystem: filesystem.clone(),
            ch: ch.clone(),
            allowed,
            session_owner,
        };
        let start = thread_start.clone();
        std::thread::Builder::new().name(name).spawn(move || {
            if let Some(f) = start {
                (f.0)();
            }
            serve(server, queue, se)
        })
    };
    let pool = Arc::new(Pool {
        fd: prepared.fd,
        payload_len: prepared.payload_len,
        max_per_queue: prepared.max_per_queue,
        spawn: Box::new(spawn),
        threads: Mutex::new((Vec::new(), false)),
        refused: AtomicBool::new(false),
        slow_seen: AtomicBool::new(false),
    });
    for (qid, servers) in prepared.queues.into_iter().enumerate() {
        let queue = Arc::new(Queue {
            qid: qid as u16,
            pool: pool.clone(),
            servers: AtomicUsize::new(servers.len()),
            busy: AtomicUsize::new(0),
        });
        for server in servers {
            pool.start(queue.clone(), server)?;
        }
    }
    Ok(RingThreads(Some(pool)))
}

/// Keeps the calling thread on CPU `qid`: the kernel puts a request on the queue of the CPU its
/// caller runs on, so the queue's thread answers it there, with no wake-up of another CPU. On an
/// idle virtual machine a cross-CPU wake-up costs ~25 µs, several times the round trip itself
/// (docs/opens.md, "Pinned queue threads"). A CPU the thread may not use is left to the scheduler.
fn pin_to_cpu(qid: u16) {
    let mut set = nix::sched::CpuSet::new();
    let pinned = set
        .set(usize::from(qid))
        .and_then(|()| nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set));
    if let Err(e) = pinned {
        debug!("FUSE over io_uring: queue {qid}: not pinned to its CPU: {e}");
    }
}

/// While a server thread runs: it counts among its queue's servers and is known as one
/// (`SERVING`); neither once it ends, also by a panic in a handler.
struct Serving(Arc<Queue>);

impl Serving {
    fn new(queue: Arc<Queue>) -> Serving {
        SERVING.with(|s| *s.borrow_mut() = Some(queue.clone()));
        Serving(queue)
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        SERVING.with(|s| *s.borrow_mut() = None);
        self.0.servers.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Counts a server as busy while a request is served.
struct Busy<'a>(&'a Queue);

impl<'a> Busy<'a> {
    fn new(queue: &'a Queue) -> Busy<'a> {
        queue.busy.fetch_add(1, Ordering::AcqRel);
        Busy(queue)
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

fn serve<FS: Filesystem>(server: Arc<Server>, queue: Arc<Queue>, se: SessionEventLoop<FS>) {
    let qid = server.qid;
    pin_to_cpu(qid);
    let _serving = Serving::new(queue.clone());
    if let Err(e) = server.command(FUSE_IO_URING_CMD_REGISTER, 0) {
        warn!(
            "FUSE over io_uring: queue {qid}: registering failed ({e}): requests stay on /dev/fuse"
        );
        return;
    }
    REGISTERED.fetch_add(1, Ordering::Relaxed);
    let mut buf = FuseReadBuf::new();
    let buf = buf.as_mut();
    let mut served = false;
    loop {
        // Wait only: submissions are made (under the lock) by whoever pushes.
        // SAFETY: io_uring_enter with no SQEs to submit and no signal mask.
        let r = unsafe {
            server
                .ring
                .submitter()
                .enter::<libc::sigset_t>(0, 1, IORING_ENTER_GETEVENTS, None)
        };
        if let Err(e) = r {
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            warn!("FUSE over io_uring: queue {qid}: {e}");
            return;
        }
        // SAFETY: only this thread reads the completion queue.
        let Some(res) = unsafe { server.ring.completion_shared() }
            .next()
            .map(|c| c.result())
        else {
            continue;
        };
        server.armed.store(false, Ordering::Release);
        if res < 0 {
            let e = io::Error::from_raw_os_error(-res);
            if served {
                debug!("FUSE over io_uring: queue {qid}: entry ended: {e}");
            } else if !queue.pool.refused.swap(true, Ordering::Relaxed) {
                warn!(
                    "FUSE over io_uring: queue {qid}: the kernel refused the ring ({e}): requests stay on /dev/fuse"
                );
            }
            return;
        }
        served = true;
        SERVED.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let _busy = Busy::new(&queue);
        let Some(len) = reassemble(&server, buf) else {
            warn!("FUSE over io_uring: queue {qid}: malformed request");
            return;
        };
        let sender = RingSender {
            server: server.clone(),
            ch: se.ch.sender(),
        };
        match RequestWithSender::new_ring(sender, &buf[..len]) {
            Some(req) => {
                if let Ok(Operation::Destroy(_)) = req.request.operation() {
                    req.reply::<crate::ReplyEmpty>().ok();
                    return;
                }
                req.dispatch(&se);
            }
            None => return,
        }
        if !server.armed.load(Ordering::Acquire) {
            // The reply's commit never reached the kernel: no completion will come.
            warn!("FUSE over io_uring: queue {qid}: a reply was not committed: server ends");
            return;
        }
        // Still counted busy: a first slow request adds a spare to a queue of one.
        queue.served_in(started.elapsed());
    }
}

/// Puts the request in the server's entry back together as `/dev/fuse` delivers it: in header,
/// the opcode's header, the payload. Returns its length.
fn reassemble(server: &Server, buf: &mut [u8]) -> Option<usize> {
    let e = &server.ent;
    // SAFETY: the kernel handed this entry to us with its completion (see `Server`).
    let (header, payload) = unsafe {
        (
            std::slice::from_raw_parts(e.header, HEADER_SIZE),
            std::slice::from_raw_parts(e.payload, e.payload_len),
        )
    };
    let len = u32::from_ne_bytes(header[0..4].try_into().ok()?) as usize;
    let payload_sz =
        u32::from_ne_bytes(header[ENT_PAYLOAD_SZ..ENT_PAYLOAD_SZ + 4].try_into().ok()?) as usize;
    // The kernel's `in.h.len` counts every argument: the opcode's header is what is left.
    let op_size = len.checked_sub(IN_HEADER + payload_sz)?;
    if op_size > OP_IN_SIZE || payload_sz > e.payload_len || len > buf.len() {
        return None;
    }
    buf[..IN_HEADER].copy_from_slice(&header[..IN_HEADER]);
    buf[IN_HEADER..IN_HEADER + op_size].copy_from_slice(&header[OP_IN..OP_IN + op_size]);
    buf[IN_HEADER + op_size..len].copy_from_slice(&payload[..payload_sz]);
    Some(len)
}
