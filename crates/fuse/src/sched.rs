//! Scheduling of the FUSE request threads (`-o sched=`, [`RequestSched`]).
//!
//! An open of a file on the mount waits for the daemon's OPEN reply: on a loaded machine the
//! woken request thread first waits for a CPU behind the runnable tasks of every other user
//! (docs/remote.md, "Where a cached 1 MB open+read's time goes"). A request thread with a
//! real-time policy (`fifo:N`) is put on a CPU as soon as it is woken; a negative nice value
//! (`nice:N`) gives it a larger share and an earlier deadline among the fair tasks. Both are
//! set on the request threads only (each `/dev/fuse` reader and io_uring queue server,
//! through vendored fuser's `Config::thread_start`), not on the notifier, prefetch or
//! control threads, and with `SCHED_RESET_ON_FORK`, so nothing the daemon starts inherits
//! them. Trade-offs: docs/opens.md, "Request threads' priority".

use std::io;

/// How the request threads are scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RequestSched {
    /// As the daemon was started (`-o sched=other`, the default).
    #[default]
    Inherit,
    /// `SCHED_OTHER` with this nice value (-20..=19; below the daemon's own needs
    /// `CAP_SYS_NICE`).
    Nice(i8),
    /// `SCHED_FIFO` with this priority (1..=99; needs `CAP_SYS_NICE`). A request thread runs
    /// until it blocks, ahead of every fair task on its CPU.
    Fifo(u8),
}

impl RequestSched {
    /// Set this scheduling on the calling thread (`Inherit`: nothing).
    pub fn apply_to_current_thread(self) -> io::Result<()> {
        match self {
            RequestSched::Inherit => Ok(()),
            RequestSched::Nice(n) => {
                // SAFETY: gettid has no preconditions.
                let tid = unsafe { libc::gettid() };
                // SAFETY: setpriority with PRIO_PROCESS and a thread id changes that thread's
                // nice value only (Linux: per thread); no memory is passed.
                let r = unsafe {
                    libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, libc::c_int::from(n))
                };
                if r == 0 {
                    Ok(())
                } else {
                    Err(io::Error::last_os_error())
                }
            }
            RequestSched::Fifo(p) => {
                let param = libc::sched_param {
                    sched_priority: libc::c_int::from(p),
                };
                // SAFETY: `param` is a valid sched_param for the call's duration; pid 0 is
                // the calling thread.
                let r = unsafe {
                    libc::sched_setscheduler(
                        0,
                        libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK,
                        &param,
                    )
                };
                if r == 0 {
                    Ok(())
                } else {
                    Err(io::Error::last_os_error())
                }
            }
        }
    }

    /// Whether this changes anything.
    pub fn is_set(self) -> bool {
        self != RequestSched::Inherit
    }

    /// Check, on a thread of its own, that this scheduling can be set (before the mount, so
    /// that a daemon without `CAP_SYS_NICE` fails to mount instead of serving unchanged).
    pub fn probe(self) -> io::Result<()> {
        if !self.is_set() {
            return Ok(());
        }
        std::thread::Builder::new()
            .name("sched-probe".into())
            .spawn(move || self.apply_to_current_thread())?
            .join()
            .map_err(|_| io::Error::other("scheduling probe thread panicked"))?
    }

    /// The function vendored fuser runs first on each request thread.
    pub(crate) fn thread_start(self) -> Option<fuser::ThreadStart> {
        if !self.is_set() {
            return None;
        }
        Some(fuser::ThreadStart(std::sync::Arc::new(move || {
            if let Err(e) = self.apply_to_current_thread() {
                tracing::warn!("request thread scheduling {self:?}: {e}");
            }
        })))
    }
}

impl std::str::FromStr for RequestSched {
    type Err = String;

    /// `other`, `nice:N` (-20..=19) or `fifo:N` (1..=99).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad =
            || format!("-o sched takes other, nice:N (-20 to 19) or fifo:N (1 to 99), not {s:?}");
        match s.split_once(':') {
            None if s == "other" => Ok(RequestSched::Inherit),
            Some(("nice", n)) => n
                .parse::<i8>()
                .ok()
                .filter(|n| (-20..=19).contains(n))
                .map(RequestSched::Nice)
                .ok_or_else(bad),
            Some(("fifo", n)) => n
                .parse::<u8>()
                .ok()
                .filter(|n| (1..=99).contains(n))
                .map(RequestSched::Fifo)
                .ok_or_else(bad),
            _ => Err(bad()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::RequestSched;

    #[test]
    fn parses() {
        assert_eq!("other".parse(), Ok(RequestSched::Inherit));
        assert_eq!("nice:-10".parse(), Ok(RequestSched::Nice(-10)));
        assert_eq!("fifo:1".parse(), Ok(RequestSched::Fifo(1)));
        for bad in [
            "", "fifo", "fifo:0", "fifo:100", "nice:-21", "nice:20", "rr:1", "nice:x",
        ] {
            assert!(bad.parse::<RequestSched>().is_err(), "{bad:?} accepted");
        }
    }
}
