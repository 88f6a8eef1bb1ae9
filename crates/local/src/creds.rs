//! Per-thread file-system credentials.
//!
//! Mutations run **as the caller**: before the final `*at` syscall (relative to the parent
//! directory, which was resolved as the daemon) the calling thread switches its fs uid,
//! fs gid and supplementary groups to the caller's [`Cred`] with the raw per-thread syscalls
//! `SYS_setgroups`, `SYS_setfsgid` and `SYS_setfsuid`, and a drop guard switches them back
//! afterwards, also on error or panic. The glibc wrappers are deliberately not used:
//! glibc's `setgroups` (and `setfsuid` in some versions) broadcasts the change to every thread
//! of the process (the "setxid" signal dance), while the kernel's credentials are per thread.
//!
//! Changing the fs uid from 0 to another value drops the file-system capabilities
//! (CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER, CAP_FSETID, CAP_MKNOD, ...)
//! from the thread's effective set, and switching back to 0 restores them, so the kernel
//! checks permissions exactly as it would for the user: new files get the user as owner and
//! the right group (fs gid, or the directory's group under a setgid directory).
//!
//! When the process is not root the switch is skipped (it could not succeed).

use dircache_core::{Cred, Error, Result};

/// Restores the thread's previous fs credentials when dropped.
pub(crate) struct CredGuard {
    /// `None` when no switch happened.
    saved: Option<Saved>,
}

struct Saved {
    fsuid: u32,
    fsgid: u32,
    groups: Vec<u32>,
}

fn raw_getgroups() -> Result<Vec<u32>> {
    // SAFETY: size 0 with a null pointer only asks for the number of groups.
    let n = unsafe { libc::syscall(libc::SYS_getgroups, 0, std::ptr::null_mut::<libc::gid_t>()) };
    if n < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    let mut v = vec![0u32; n as usize];
    // SAFETY: `v` has room for `n` gid_t values, which is the size passed.
    let m = unsafe { libc::syscall(libc::SYS_getgroups, n, v.as_mut_ptr()) };
    if m < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    v.truncate(m as usize);
    Ok(v)
}

fn raw_setgroups(groups: &[u32]) -> Result<()> {
    // SAFETY: the pointer and length describe a live slice of gid_t (u32) values; the raw
    // syscall only changes the calling thread's credentials.
    let r = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
    if r < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(())
}

/// setfsuid/setfsgid never report errors directly; they return the previous value. Setting
/// and then querying with -1 tells whether the change took.
fn raw_setfs(sys: libc::c_long, id: u32) -> Result<u32> {
    // SAFETY: setfsuid/setfsgid take one integer and only change this thread's credentials.
    let prev = unsafe { libc::syscall(sys, id) } as u32;
    // SAFETY: as above; -1 is an invalid id, so this only queries the current value.
    let now = unsafe { libc::syscall(sys, -1i32) } as u32;
    if now != id {
        return Err(Error::Perm);
    }
    Ok(prev)
}

impl CredGuard {
    /// Switch this thread to `cred` (when `enabled`, i.e. the process is root).
    pub(crate) fn switch(cred: &Cred, enabled: bool) -> Result<CredGuard> {
        if !enabled {
            return Ok(CredGuard { saved: None });
        }
        let groups = raw_getgroups()?;
        // SAFETY: querying with -1 (an invalid id) changes nothing.
        let fsuid = unsafe { libc::syscall(libc::SYS_setfsuid, -1i32) } as u32;
        // SAFETY: as above.
        let fsgid = unsafe { libc::syscall(libc::SYS_setfsgid, -1i32) } as u32;
        raw_setgroups(cred.groups())?;
        // From here on, the guard restores groups and ids, also on error.
        let guard = CredGuard {
            saved: Some(Saved {
                fsuid,
                fsgid,
                groups,
            }),
        };
        raw_setfs(libc::SYS_setfsgid, cred.gid)?;
        raw_setfs(libc::SYS_setfsuid, cred.uid)?;
        Ok(guard)
    }
}

impl Drop for CredGuard {
    fn drop(&mut self) {
        if let Some(s) = self.saved.take() {
            // fsuid first: going back to 0 restores the fs capabilities.
            let a = raw_setfs(libc::SYS_setfsuid, s.fsuid);
            let b = raw_setfs(libc::SYS_setfsgid, s.fsgid);
            let c = raw_setgroups(&s.groups);
            if a.is_err() || b.is_err() || c.is_err() {
                // Continuing with the wrong identity would be a security bug.
                tracing::error!("dircache-local: could not restore thread credentials; aborting");
                std::process::abort();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fsuid() -> u32 {
        // SAFETY: querying with -1 changes nothing.
        unsafe { libc::syscall(libc::SYS_setfsuid, -1i32) as u32 }
    }

    #[test]
    fn switch_and_restore() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let before = raw_getgroups().unwrap();
        // A thread started before the switch (new threads inherit their creator's creds).
        let (ask, asked) = std::sync::mpsc::channel::<()>();
        let (tell, told) = std::sync::mpsc::channel();
        let other = std::thread::spawn(move || {
            while asked.recv().is_ok() {
                tell.send((fsuid(), raw_getgroups().unwrap())).unwrap();
            }
        });
        {
            let _g = CredGuard::switch(&Cred::new(12345, 23456, [7, 8]), true).unwrap();
            assert_eq!(fsuid(), 12345);
            assert_eq!(raw_getgroups().unwrap(), vec![7, 8]);
            // Other threads keep root's credentials.
            ask.send(()).unwrap();
            assert_eq!(told.recv().unwrap(), (0, before.clone()));
        }
        drop(ask);
        other.join().unwrap();
        assert_eq!(fsuid(), 0);
        assert_eq!(raw_getgroups().unwrap(), before);
    }
}
