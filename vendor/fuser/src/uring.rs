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
//! io_uring off for the connection itself and requests flow over `/dev/fuse`: the queue threads
//! log it and end.

use std::io;
use std::io::IoSlice;
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::thread::JoinHandle;

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
/// Ring entries per queue.
const DEPTH: usize = 2;

/// Requests taken from ring entries by this process, all sessions together.
static SERVED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// dircache: how many requests this process has taken from FUSE-over-io_uring entries (all
/// sessions together): tests tell by it that requests came over the ring.
pub fn requests_served() -> u64 {
    SERVED.load(std::sync::atomic::Ordering::Relaxed)
}

/// One ring entry's buffers (heap memory whose addresses the kernel keeps).
struct RingEnt {
    header: *mut u8,
    payload: *mut u8,
    payload_len: usize,
    iov: Box<[libc::iovec; 2]>,
}

/// One queue: its ring, its entries, and the lock that serializes pushes to its SQ.
pub(crate) struct RingQueue {
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    sq: Mutex<()>,
    fd: RawFd,
    qid: u16,
    ents: Vec<RingEnt>,
}

// SAFETY: an entry's buffers are touched by one party at a time, as the protocol hands them
// over: the kernel until the entry's completion, then the queue thread (reassembly) and the
// one reply (`RingSender::send`), then the kernel again from the commit on. The SQ is pushed
// to under `sq` only; the CQ is read by the queue thread only.
unsafe impl Send for RingQueue {}
// SAFETY: as above.
unsafe impl Sync for RingQueue {}

impl std::fmt::Debug for RingQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RingQueue({})", self.qid)
    }
}

impl Drop for RingQueue {
    fn drop(&mut self) {
        for e in &self.ents {
            // SAFETY: allocated by `Box::into_raw` in `RingQueue::new` with these lengths; the
            // ring (and with it every registration) is gone once the queue is dropped: the
            // queue thread drops it after its last completion.
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
}

impl RingQueue {
    fn new(fd: RawFd, qid: u16, payload_len: usize) -> io::Result<Self> {
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .build((2 * DEPTH).next_power_of_two() as u32)?;
        let ents = (0..DEPTH)
            .map(|_| {
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
                RingEnt {
                    header,
                    payload,
                    payload_len,
                    iov,
                }
            })
            .collect();
        Ok(Self {
            ring,
            sq: Mutex::new(()),
            fd,
            qid,
            ents,
        })
    }

    /// Pushes one command for entry `k` and submits it.
    fn command(&self, op: u32, k: usize, commit_id: u64) -> io::Result<()> {
        let mut cmd = [0u8; 80];
        cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
        cmd[16..18].copy_from_slice(&self.qid.to_ne_bytes());
        let sqe = opcode::UringCmd80::new(types::Fd(self.fd), op)
            .cmd(cmd)
            .addr(Some(self.ents[k].iov.as_ptr() as u64))
            .build()
            .user_data(k as u64);
        // SAFETY: `Entry128` is `#[repr(C)]` (`struct io_uring_sqe`, then 64 bytes of command):
        // 128 bytes of plain data. FUSE wants `len` (the u32 at offset 24 of `io_uring_sqe`) to
        // be the iovec count, 2; the crate's `UringCmd80` has no setter for it.
        let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
        raw[24..28].copy_from_slice(&2u32.to_ne_bytes());
        // SAFETY: as above, back to the same type.
        let sqe = unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) };
        let _g = self.sq.lock();
        // SAFETY: pushes are serialized by `sq`; the buffers the SQE names live as long as the
        // queue, which outlives the ring's use of them (see `Drop`).
        unsafe {
            let mut sq = self.ring.submission_shared();
            if sq.push(&sqe).is_err() {
                return Err(io::Error::other("io_uring submission queue full"));
            }
        }
        self.ring.submitter().submit()?;
        Ok(())
    }
}

/// Where the reply to a request taken from a ring entry goes.
#[derive(Clone)]
pub(crate) struct RingSender {
    queue: Arc<RingQueue>,
    ent: usize,
    /// `/dev/fuse`, for backing files (an ioctl on the device).
    pub(crate) ch: ChannelSender,
}

impl std::fmt::Debug for RingSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RingSender(queue {}, entry {})",
            self.queue.qid, self.ent
        )
    }
}

impl RingSender {
    /// Writes the reply (out header, then its arguments) into the entry and commits it.
    pub(crate) fn send(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        let e = &self.queue.ents[self.ent];
        let total: usize = data.iter().map(|b| b.len()).sum();
        if total < OUT_HEADER || total - OUT_HEADER > e.payload_len {
            return Err(io::Error::other(
                "reply larger than the ring entry's payload",
            ));
        }
        // SAFETY: this entry belongs to this reply until the commit below (see `RingQueue`).
        let (header, payload) = unsafe {
            (
                std::slice::from_raw_parts_mut(e.header, HEADER_SIZE),
                std::slice::from_raw_parts_mut(e.payload, e.payload_len),
            )
        };
        let mut at = 0;
        for b in data {
            for &byte in b.iter() {
                if at < OUT_HEADER {
                    header[at] = byte;
                } else {
                    payload[at - OUT_HEADER] = byte;
                }
                at += 1;
            }
        }
        let payload_sz = (total - OUT_HEADER) as u32;
        header[ENT_PAYLOAD_SZ..ENT_PAYLOAD_SZ + 4].copy_from_slice(&payload_sz.to_ne_bytes());
        let commit_id = u64::from_ne_bytes(
            header[ENT_COMMIT_ID..ENT_COMMIT_ID + 8]
                .try_into()
                .expect("8 bytes"),
        );
        self.queue
            .command(FUSE_IO_URING_CMD_COMMIT_AND_FETCH, self.ent, commit_id)
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

/// One queue per possible CPU, each with its ring and entries (nothing registered yet).
pub(crate) fn queues(ch: &Channel, payload_len: usize) -> io::Result<Vec<Arc<RingQueue>>> {
    (0..possible_cpus()?)
        .map(|qid| {
            Ok(Arc::new(RingQueue::new(
                ch.as_fd().as_raw_fd(),
                qid,
                payload_len,
            )?))
        })
        .collect()
}

/// Starts one thread per queue, each registering its entries and serving their requests
/// until the connection ends or the kernel refuses the ring.
pub(crate) fn start<FS: Filesystem>(
    queues: Vec<Arc<RingQueue>>,
    ch: &Channel,
    filesystem: &Arc<FilesystemHolder<FS>>,
    allowed: SessionACL,
    session_owner: Uid,
) -> io::Result<Vec<JoinHandle<()>>> {
    let mut threads = Vec::new();
    for queue in queues {
        let qid = queue.qid;
        let name = format!("fuser-uring-{qid}");
        let event_loop = SessionEventLoop {
            thread_name: name.clone(),
            filesystem: filesystem.clone(),
            ch: ch.clone(),
            allowed,
            session_owner,
        };
        threads.push(
            std::thread::Builder::new()
                .name(name)
                .spawn(move || queue_loop(queue, event_loop))?,
        );
    }
    Ok(threads)
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

fn queue_loop<FS: Filesystem>(queue: Arc<RingQueue>, se: SessionEventLoop<FS>) {
    let qid = queue.qid;
    pin_to_cpu(qid);
    for k in 0..DEPTH {
        if let Err(e) = queue.command(FUSE_IO_URING_CMD_REGISTER, k, 0) {
            warn!(
                "FUSE over io_uring: queue {qid}: registering failed ({e}): requests stay on /dev/fuse"
            );
            return;
        }
    }
    let mut buf = FuseReadBuf::new();
    let buf = buf.as_mut();
    let mut live = DEPTH;
    let mut served = false;
    while live > 0 {
        // Wait only: submissions are made (under the lock) by whoever pushes.
        // SAFETY: io_uring_enter with no SQEs to submit and no signal mask.
        let r = unsafe {
            queue
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
        let done: Vec<(usize, i32)> = unsafe { queue.ring.completion_shared() }
            .map(|c| (c.user_data() as usize, c.result()))
            .collect();
        for (k, res) in done {
            if res < 0 {
                live -= 1;
                let e = io::Error::from_raw_os_error(-res);
                if served {
                    debug!("FUSE over io_uring: queue {qid} entry {k} ended: {e}");
                } else {
                    warn!(
                        "FUSE over io_uring: queue {qid}: the kernel refused the ring ({e}): requests stay on /dev/fuse"
                    );
                }
                continue;
            }
            served = true;
            SERVED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some(len) = reassemble(&queue, k, buf) else {
                warn!("FUSE over io_uring: queue {qid}: malformed request in entry {k}");
                return;
            };
            let sender = RingSender {
                queue: queue.clone(),
                ent: k,
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
        }
    }
}

/// Puts the request in entry `k` back together as `/dev/fuse` delivers it: in header, the
/// opcode's header, the payload. Returns its length.
fn reassemble(queue: &RingQueue, k: usize, buf: &mut [u8]) -> Option<usize> {
    let e = &queue.ents[k];
    // SAFETY: the kernel handed this entry to us with its completion (see `RingQueue`).
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
