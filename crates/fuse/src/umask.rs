//! The caller's umask for files created through the mount.
//!
//! The daemon asks for FUSE_DONT_MASK: the kernel then sends the mode the caller asked for
//! and the caller's umask separately, instead of applying the umask itself. Natively the umask
//! applies only when the parent directory has no default ACL (with one, the ACL decides), and
//! only the file system knows which. So each request thread gets a file-system context of its
//! own (`unshare(CLONE_FS)`, once per thread), sets its umask to the caller's around the
//! creation, and the backend's file system applies it or the default ACL, atomically, as it
//! would for the caller. If the thread cannot get its own context, the umask is applied to the
//! mode here (the behaviour without default ACLs).

use std::cell::Cell;

thread_local! {
    /// Whether this thread has a private fs context: None until tried.
    static OWN_FS: Cell<Option<bool>> = const { Cell::new(None) };
    /// This thread's umask outside [`with_caller_umask`], once learnt (its private fs
    /// context: only this thread changes it, and only here).
    static BETWEEN: Cell<Option<libc::mode_t>> = const { Cell::new(None) };
}

fn own_fs() -> bool {
    OWN_FS.with(|c| {
        if let Some(v) = c.get() {
            return v;
        }
        // SAFETY: unshare(CLONE_FS) only gives the calling thread a private copy of its
        // root, working directory and umask; no memory is involved.
        let ok = unsafe { libc::unshare(libc::CLONE_FS) } == 0;
        if !ok {
            tracing::warn!(
                "unshare(CLONE_FS): {}; umask applied without regard to default ACLs",
                std::io::Error::last_os_error()
            );
        }
        c.set(Some(ok));
        ok
    })
}

/// Restores the thread's umask when dropped.
struct Restore(libc::mode_t);

impl Drop for Restore {
    fn drop(&mut self) {
        // SAFETY: umask only changes this thread's (private) fs context.
        unsafe { libc::umask(self.0) };
    }
}

/// Run creation `f` with `mode` under the caller's `umask`: with this thread's umask set to
/// it when the thread has its own fs context (the file system then applies it unless a
/// default ACL applies), else with the umask applied to the mode given to `f`.
pub(crate) fn with_caller_umask<T>(mode: u32, umask: u32, f: impl FnOnce(u32) -> T) -> T {
    if own_fs() {
        let want = (umask & 0o777) as libc::mode_t;
        // When the caller's umask is the thread's already (0, the daemon's, which `tar`
        // sets as root), neither the set nor the restore is made (two syscalls per creation).
        if BETWEEN.with(|b| b.get()) == Some(want) {
            return f(mode);
        }
        // SAFETY: umask only changes this thread's private fs context (own_fs).
        let old = unsafe { libc::umask(want) };
        BETWEEN.with(|b| b.set(Some(old)));
        if old == want {
            return f(mode);
        }
        let _restore = Restore(old);
        f(mode)
    } else {
        f(mode & !(umask & 0o777))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This thread's umask, read without changing it.
    fn thread_umask() -> u32 {
        let s = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        let v = s.lines().find_map(|l| l.strip_prefix("Umask:")).unwrap();
        u32::from_str_radix(v.trim(), 8).unwrap()
    }

    #[test]
    fn umask_is_per_thread_and_restored() {
        // A thread started before (threads started later by a request thread would share its
        // private context).
        let (ask, asked) = std::sync::mpsc::channel::<()>();
        let (tell, told) = std::sync::mpsc::channel();
        let other = std::thread::spawn(move || {
            while asked.recv().is_ok() {
                tell.send(thread_umask()).unwrap();
            }
        });
        let before = thread_umask();
        let worker = std::thread::spawn(move || {
            let inside = with_caller_umask(0o666, 0o077, |m| {
                assert_eq!(m, 0o666);
                ask.send(()).unwrap();
                (thread_umask(), told.recv().unwrap())
            });
            (inside, thread_umask())
        });
        let ((inside, other_meanwhile), after) = worker.join().unwrap();
        other.join().unwrap();
        assert_eq!(inside, 0o077);
        assert_eq!(other_meanwhile, before);
        assert_eq!(after, before);
        assert_eq!(thread_umask(), before);
    }

    /// The thread's umask is remembered between creations (to skip the set and restore when
    /// the caller's is the same): every creation still runs under its caller's umask, and
    /// the thread's own comes back after each, whatever came before.
    #[test]
    fn remembered_umask_follows_every_caller() {
        std::thread::spawn(|| {
            let own = thread_umask();
            for want in [own, 0o077, 0o077, own, 0o002, own, 0o000, 0o000] {
                let inside = with_caller_umask(0o666, want, |_| thread_umask());
                assert_eq!(inside, want);
                assert_eq!(thread_umask(), own, "after a creation under {want:o}");
            }
        })
        .join()
        .unwrap();
    }
}
