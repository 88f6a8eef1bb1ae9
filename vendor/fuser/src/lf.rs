//! dircache: leader/follower reading of `/dev/fuse` (issue 9).
//!
//! With several threads in `read(2)` the kernel wakes the one that has waited longest
//! (exclusive FIFO wait on the connection's input queue), so a program's consecutive requests
//! hop between threads, and on a small VM each hop can be a wake-up of an idle vCPU. Here only
//! one thread (the leader) reads at a time; the others wait on a condition variable. The
//! leader keeps reading as long as the requests it reads are answered without blocking; before
//! one that may block it hands reading to a follower, so blocking requests are still served
//! concurrently with others:
//!
//! - by opcode: data, mutations, syncs and locks ([`may_block_opcode`]);
//! - by the file system: a handler calls [`may_block`] before anything that may wait (a backend
//!   call on a cache miss). It does nothing on a thread that is not the leader.
//!
//! Optionally the leader, after a reply, polls the (non-blocking) descriptor for a bounded time
//! before sleeping ([`LfConfig::spin`]), only while the requests come back to back (the last
//! one arrived within that time after the reply before it): one bounded spin per burst end.

use std::cell::RefCell;
use std::io;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;
use std::time::Instant;

use nix::errno::Errno;
use parking_lot::Condvar;
use parking_lot::Mutex;

use crate::Filesystem;
use crate::channel::Channel;
use crate::ll::Operation;
use crate::read_buf::FuseReadBuf;
use crate::reply::ReplyEmpty;
use crate::request::RequestWithSender;
use crate::session::SessionEventLoop;

/// How the request threads share `/dev/fuse`.
#[derive(Debug, Clone, Copy, Default, Eq, PartialEq)]
pub struct LfConfig {
    /// Poll for the next request this long after a reply before sleeping (zero: never).
    pub spin: Duration,
    /// Lazy hand-off: before a call that may block, the leader keeps leading through the
    /// call; only if a request is waiting in the kernel's queue right then (a zero-timeout
    /// poll(2) of its descriptor) does it let the followers read too (a burst: every thread
    /// reads, as with fuser's own loop, until the leader finds the queue empty after a
    /// request). A program that sends one request at a time (`ls -lR`, `find`) is so served
    /// by one thread throughout, with no follower woken per cache miss, and concurrent
    /// requests (`git status`'s parallel lstat calls) by all. A request that arrives during
    /// a call the leader went into with an empty queue waits for it, at most until the
    /// standby follower (the one that sleeps with a timeout, every 20 ms) finds the leader in
    /// one call for longer than 10 ms and starts a burst (so a backend call that itself waits
    /// for this mount, SRC holding a bind mount of it, still gets served).
    pub lazy: bool,
}

/// How often the standby follower looks at a leader that kept leading into a blocking call.
pub(crate) const STANDBY_TICK: Duration = Duration::from_millis(20);
/// How long a leader may be in one blocking call before the standby follower starts a burst.
pub(crate) const TAKEOVER_AFTER: Duration = Duration::from_millis(10);

#[derive(Default)]
struct State {
    /// A thread is the leader (reading, or about to).
    led: bool,
    /// The connection ended: every thread returns.
    done: bool,
    /// Lazy hand-off: followers read too (requests waited while the leader blocked).
    burst: bool,
    /// Lazy hand-off: when the leader went into a blocking call with an empty queue.
    blocked_since: Option<Instant>,
    /// A follower waits with a timeout (the standby; lazy hand-off only).
    standby: bool,
}

/// What `lead` made of the calling thread.
#[derive(Clone, Copy, Eq, PartialEq)]
enum Role {
    Leader,
    /// A follower reading one request during a burst (lazy hand-off).
    Extra,
}

/// What the request threads of one session share.
pub(crate) struct Shared {
    state: Mutex<State>,
    cv: Condvar,
}

impl Shared {
    pub(crate) fn new() -> Arc<Shared> {
        Arc::new(Shared {
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
        })
    }

    /// Wait until no thread leads (then lead) or, with `lazy`, a burst lets this thread read
    /// one request; None when the session ended.
    fn lead(&self, lazy: bool) -> Option<Role> {
        let mut s = self.state.lock();
        loop {
            if s.done {
                return None;
            }
            if !s.led {
                s.led = true;
                s.blocked_since = None;
                return Some(Role::Leader);
            }
            if !lazy {
                self.cv.wait(&mut s);
                continue;
            }
            if s.burst {
                return Some(Role::Extra);
            }
            if s.standby {
                self.cv.wait(&mut s);
                continue;
            }
            s.standby = true;
            self.cv.wait_for(&mut s, STANDBY_TICK);
            s.standby = false;
            if s.led
                && !s.burst
                && s.blocked_since.is_some_and(|t| t.elapsed() >= TAKEOVER_AFTER)
            {
                // The leader is stuck in a call: every follower reads until it is back.
                s.burst = true;
                drop(s);
                self.cv.notify_all();
                return Some(Role::Extra);
            }
        }
    }

    /// Stop leading and wake a follower to lead.
    fn hand_off(&self) {
        let mut s = self.state.lock();
        s.led = false;
        s.blocked_since = None;
        drop(s);
        self.cv.notify_one();
    }

    /// Lazy hand-off: the leader goes into a blocking call (keeping the lead); with requests
    /// `waiting`, the followers read meanwhile.
    fn blocking(&self, waiting: bool) {
        let mut s = self.state.lock();
        if waiting {
            s.blocked_since = None;
            if !s.burst {
                s.burst = true;
                drop(s);
                self.cv.notify_all();
            }
        } else if s.blocked_since.is_none() {
            s.blocked_since = Some(Instant::now());
        }
    }

    /// Lazy hand-off: the leader finished a request; a burst ends when no request waits.
    fn served(&self, fd: std::os::fd::RawFd) {
        let mut s = self.state.lock();
        s.blocked_since = None;
        if s.burst {
            drop(s);
            if !request_waiting(fd) {
                self.state.lock().burst = false;
            }
        }
    }

    fn end(&self) {
        let mut s = self.state.lock();
        s.done = true;
        s.led = false;
        drop(s);
        self.cv.notify_all();
    }
}

/// What a leading thread knows of its leadership.
struct Leading {
    shared: Arc<Shared>,
    /// Lazy hand-off: the descriptor polled for a waiting request.
    lazy_fd: Option<std::os::fd::RawFd>,
}

thread_local! {
    /// The session of which this thread is the leader right now.
    static LEADING: RefCell<Option<Leading>> = const { RefCell::new(None) };
}

/// A request is waiting in the kernel's queue of the connection `fd` reads (or polling
/// failed: then hand off, the safe side).
fn request_waiting(fd: std::os::fd::RawFd) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    // SAFETY: `fd` is the leader's own descriptor of the session, open for as long as the
    // thread's loop (which set LEADING and clears it before returning) runs.
    let bfd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let mut fds = [PollFd::new(bfd, PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(n) => n > 0,
        Err(_) => true,
    }
}

/// Stop leading, whatever is waiting.
fn stop_leading() {
    if let Some(l) = LEADING.with(|l| l.borrow_mut().take()) {
        l.shared.hand_off();
    }
}

/// dircache: the calling request handler is about to do something that may block (a backend
/// call on a cache miss, a network round trip): if this thread is the one reading
/// `/dev/fuse`, a follower takes over reading before it blocks; if it serves a FUSE-over-io_uring
/// queue whose other servers are all busy, one more is started (src/uring.rs). Cheap (a
/// thread-local check, then two atomic loads on a ring server) and a no-op on any other thread.
pub fn may_block() {
    let hand = LEADING.with(|l| {
        let mut l = l.borrow_mut();
        if let Some(Leading {
            shared,
            lazy_fd: Some(fd),
        }) = l.as_ref()
        {
            // Lazy: keep leading; the followers read too if requests wait now.
            shared.blocking(request_waiting(*fd));
            return None;
        }
        l.take()
    });
    if let Some(l) = hand {
        l.shared.hand_off();
    }
    crate::uring::may_block();
}

/// Requests that usually wait for storage: data, mutations, syncs, locks.
fn may_block_opcode(opcode: u32) -> bool {
    use crate::ll::fuse_abi::fuse_opcode as o;
    let Ok(op) = o::try_from(opcode) else {
        return false;
    };
    matches!(
        op,
        o::FUSE_SETATTR
            | o::FUSE_SYMLINK
            | o::FUSE_MKNOD
            | o::FUSE_MKDIR
            | o::FUSE_UNLINK
            | o::FUSE_RMDIR
            | o::FUSE_RENAME
            | o::FUSE_LINK
            | o::FUSE_READ
            | o::FUSE_WRITE
            | o::FUSE_FSYNC
            | o::FUSE_SETXATTR
            | o::FUSE_REMOVEXATTR
            | o::FUSE_FLUSH
            | o::FUSE_FSYNCDIR
            | o::FUSE_GETLK
            | o::FUSE_SETLK
            | o::FUSE_SETLKW
            | o::FUSE_CREATE
            | o::FUSE_IOCTL
            | o::FUSE_POLL
            | o::FUSE_FALLOCATE
            | o::FUSE_RENAME2
            | o::FUSE_COPY_FILE_RANGE
    )
}

/// When the loop leaves, also by a panic in a handler: a thread still leading hands reading
/// on (else the others would wait for good), and LEADING is cleared.
struct NotLeading;
impl Drop for NotLeading {
    fn drop(&mut self) {
        stop_leading();
    }
}

fn set_nonblocking(ch: &Channel) -> io::Result<()> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let fd = ch.as_fd();
    let fl = OFlag::from_bits_retain(fcntl(fd, FcntlArg::F_GETFL)?);
    fcntl(fd, FcntlArg::F_SETFL(fl | OFlag::O_NONBLOCK))?;
    Ok(())
}

impl<FS: Filesystem> SessionEventLoop<FS> {
    /// One request thread in leader/follower mode.
    pub(crate) fn lf_loop(&self, shared: Arc<Shared>, cfg: LfConfig) -> io::Result<()> {
        let spin = !cfg.spin.is_zero();
        if spin {
            set_nonblocking(&self.ch)?;
        }
        let mut buf = FuseReadBuf::new();
        let buf = buf.as_mut();
        let _clear = NotLeading;
        // When the last reply went out, and whether to poll after the next one.
        let mut replied: Option<Instant> = None;
        let lazy_fd = cfg.lazy.then(|| {
            use std::os::fd::AsRawFd;
            self.ch.as_fd().as_raw_fd()
        });
        loop {
            let Some(role) = shared.lead(cfg.lazy) else {
                return Ok(());
            };
            if role == Role::Extra {
                // A burst: serve one request as fuser's own loop would, then look again.
                let got = if spin {
                    self.read_spinning(buf, None)
                } else {
                    self.ch.receive_retrying(buf)
                };
                if !self.serve(&shared, got, buf)? {
                    return Ok(());
                }
                continue;
            }
            LEADING.with(|l| {
                *l.borrow_mut() = Some(Leading {
                    shared: shared.clone(),
                    lazy_fd,
                })
            });
            // Lead until a request may block (then a follower leads) or the session ends.
            loop {
                let got = if spin {
                    self.read_spinning(buf, replied.map(|t| t + cfg.spin))
                } else {
                    self.ch.receive_retrying(buf)
                };
                if spin {
                    // Back to back if it came within `spin` of the last reply.
                    let now = Instant::now();
                    replied = replied.filter(|t| now.duration_since(*t) <= cfg.spin);
                }
                if !self.serve(&shared, got, buf)? {
                    return Ok(());
                }
                if spin {
                    replied = Some(Instant::now());
                }
                if LEADING.with(|l| l.borrow().is_none()) {
                    // Handed off: back among the followers.
                    break;
                }
                if let Some(fd) = lazy_fd {
                    shared.served(fd);
                }
            }
        }
    }

    /// Serve the request `got` read into `buf`: false when the session ended.
    fn serve(
        &self,
        shared: &Shared,
        got: nix::Result<usize>,
        buf: &mut [u8],
    ) -> io::Result<bool> {
        let size = match got {
            Ok(size) => size,
            Err(Errno::ENODEV) => {
                shared.end();
                return Ok(false);
            }
            Err(e) => {
                shared.end();
                return Err(e.into());
            }
        };
        let Some(req) = RequestWithSender::new(self.ch.sender(), &buf[..size]) else {
            shared.end();
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "Invalid request",
            ));
        };
        if let Ok(Operation::Destroy(_)) = req.request.operation() {
            req.reply::<ReplyEmpty>().ok();
            shared.end();
            return Ok(false);
        }
        if may_block_opcode(req.request.header().opcode) {
            may_block();
        }
        req.dispatch(self);
        Ok(true)
    }

    /// Read one request from the non-blocking descriptor: polling until `until` (if given
    /// and not passed), then sleeping in poll(2).
    fn read_spinning(&self, buf: &mut [u8], until: Option<Instant>) -> nix::Result<usize> {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        let mut until = until;
        loop {
            match nix::unistd::read(&self.ch, buf) {
                Ok(n) => return Ok(n),
                Err(Errno::ENOENT | Errno::EINTR) => continue,
                Err(Errno::EAGAIN) => {}
                Err(e) => return Err(e),
            }
            if let Some(t) = until {
                if Instant::now() < t {
                    std::hint::spin_loop();
                    continue;
                }
                until = None;
            }
            let mut fds = [PollFd::new(self.ch.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(e) => return Err(e),
            }
        }
    }
}
