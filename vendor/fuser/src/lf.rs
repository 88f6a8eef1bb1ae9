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
}

#[derive(Default)]
struct State {
    /// A thread is the leader (reading, or about to).
    led: bool,
    /// The connection ended: every thread returns.
    done: bool,
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

    /// Wait until no thread leads, then lead; false when the session ended.
    fn lead(&self) -> bool {
        let mut s = self.state.lock();
        while s.led && !s.done {
            self.cv.wait(&mut s);
        }
        if s.done {
            return false;
        }
        s.led = true;
        true
    }

    fn hand_off(&self) {
        let mut s = self.state.lock();
        s.led = false;
        drop(s);
        self.cv.notify_one();
    }

    fn end(&self) {
        let mut s = self.state.lock();
        s.done = true;
        s.led = false;
        drop(s);
        self.cv.notify_all();
    }
}

thread_local! {
    /// The session of which this thread is the leader right now.
    static LEADING: RefCell<Option<Arc<Shared>>> = const { RefCell::new(None) };
}

/// dircache: the calling request handler is about to do something that may block (a backend
/// call on a cache miss, a network round trip): if this thread is the one reading
/// `/dev/fuse`, a follower takes over reading before it blocks; if it serves a FUSE-over-io_uring
/// queue whose other servers are all busy, one more is started (src/uring.rs). Cheap (a
/// thread-local check, then two atomic loads on a ring server) and a no-op on any other thread.
pub fn may_block() {
    if let Some(shared) = LEADING.with(|l| l.borrow_mut().take()) {
        shared.hand_off();
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
        may_block();
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
        loop {
            if !shared.lead() {
                return Ok(());
            }
            LEADING.with(|l| *l.borrow_mut() = Some(shared.clone()));
            // Lead until a request may block (then a follower leads) or the session ends.
            loop {
                let got = if spin {
                    self.read_spinning(buf, replied.map(|t| t + cfg.spin))
                } else {
                    self.ch.receive_retrying(buf)
                };
                let size = match got {
                    Ok(size) => size,
                    Err(Errno::ENODEV) => {
                        shared.end();
                        return Ok(());
                    }
                    Err(e) => {
                        shared.end();
                        return Err(e.into());
                    }
                };
                if spin {
                    // Back to back if it came within `spin` of the last reply.
                    let now = Instant::now();
                    replied = replied.filter(|t| now.duration_since(*t) <= cfg.spin);
                }
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
                    return Ok(());
                }
                if may_block_opcode(req.request.header().opcode) {
                    may_block();
                }
                req.dispatch(self);
                if spin {
                    replied = Some(Instant::now());
                }
                if LEADING.with(|l| l.borrow().is_none()) {
                    // Handed off: back among the followers.
                    break;
                }
            }
        }
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
