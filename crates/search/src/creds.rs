//! Per-thread credentials for searches run on behalf of another user (a daemon answering a
//! delegated search): the kernel itself decides every access, as it would for that user.
//!
//! [`ThreadCred::switch`] sets the calling thread's supplementary groups, fs gid and fs uid to
//! the caller's (raw per-thread syscalls, never glibc's process-wide wrappers) and empties the
//! thread's *effective* capability set, so that uid 0 without capabilities is an ordinary user
//! for the kernel, exactly as a uid-0 process without CAP_DAC_* is. (A non-zero fs uid drops
//! the fs capabilities anyway; the rest are dropped so no other capability can widen an
//! access decision.) Dropping the guard restores the previous groups, ids and effective set.
//!
//! A delegated search never grants what capabilities would: a client holding CAP_DAC_OVERRIDE
//! or CAP_DAC_READ_SEARCH searches by itself instead ([`caller_has_dac_caps`]).

use dircache_core::{Cred, Error};
use rustix::thread::{CapabilitySet, CapabilitySets};

fn last_err() -> Error {
    Error::from_errno(
        std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO),
    )
}

fn raw_getgroups() -> Result<Vec<u32>, Error> {
    // SAFETY: size 0 with a null pointer only asks for the number of groups.
    let n = unsafe { libc::syscall(libc::SYS_getgroups, 0, std::ptr::null_mut::<libc::gid_t>()) };
    if n < 0 {
        return Err(last_err());
    }
    let mut v = vec![0u32; usize::try_from(n).unwrap_or(0)];
    // SAFETY: `v` has room for `n` gid_t values, which is the size passed.
    let m = unsafe { libc::syscall(libc::SYS_getgroups, n, v.as_mut_ptr()) };
    if m < 0 {
        return Err(last_err());
    }
    v.truncate(usize::try_from(m).unwrap_or(0));
    Ok(v)
}

fn raw_setgroups(groups: &[u32]) -> Result<(), Error> {
    // SAFETY: pointer and length describe a live slice of gid_t (u32); the raw syscall only
    // changes the calling thread's credentials.
    let r = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
    if r < 0 {
        return Err(last_err());
    }
    Ok(())
}

/// setfsuid/setfsgid report no errors; set, then query with -1 to see whether it took.
fn raw_setfs(sys: libc::c_long, id: u32) -> Result<u32, Error> {
    // SAFETY: setfsuid/setfsgid take one integer and only change this thread's credentials.
    let prev = unsafe { libc::syscall(sys, id) } as u32;
    // SAFETY: as above; -1 is an invalid id, so this only queries.
    let now = unsafe { libc::syscall(sys, -1i32) } as u32;
    if now != id {
        return Err(Error::Perm);
    }
    Ok(prev)
}

/// The calling thread's credentials switched to a caller's; restored on drop.
pub struct ThreadCred {
    fsuid: u32,
    fsgid: u32,
    groups: Vec<u32>,
    caps: CapabilitySets,
}

impl ThreadCred {
    /// Switch the calling thread to `cred` with no effective capabilities (module docs).
    /// Needs CAP_SETUID/CAP_SETGID (a root daemon).
    pub fn switch(cred: &Cred) -> Result<ThreadCred, Error> {
        let caps =
            rustix::thread::capabilities(None).map_err(|e| Error::from_errno(e.raw_os_error()))?;
        let groups = raw_getgroups()?;
        // SAFETY: querying with -1 (an invalid id) changes nothing.
        let fsuid = unsafe { libc::syscall(libc::SYS_setfsuid, -1i32) } as u32;
        // SAFETY: as above.
        let fsgid = unsafe { libc::syscall(libc::SYS_setfsgid, -1i32) } as u32;
        raw_setgroups(cred.groups())?;
        // From here on the guard restores everything, also on error.
        let guard = ThreadCred {
            fsuid,
            fsgid,
            groups,
            caps,
        };
        raw_setfs(libc::SYS_setfsgid, cred.gid)?;
        raw_setfs(libc::SYS_setfsuid, cred.uid)?;
        let now =
            rustix::thread::capabilities(None).map_err(|e| Error::from_errno(e.raw_os_error()))?;
        rustix::thread::set_capabilities(
            None,
            CapabilitySets {
                effective: CapabilitySet::empty(),
                ..now
            },
        )
        .map_err(|e| Error::from_errno(e.raw_os_error()))?;
        Ok(guard)
    }
}

impl Drop for ThreadCred {
    fn drop(&mut self) {
        // Effective capabilities first (raising them from the permitted set needs none), so
        // that setgroups (CAP_SETGID) works; then the ids and groups.
        let a = rustix::thread::set_capabilities(None, self.caps).is_ok();
        let b = raw_setfs(libc::SYS_setfsuid, self.fsuid).is_ok();
        let c = raw_setfs(libc::SYS_setfsgid, self.fsgid).is_ok();
        let d = raw_setgroups(&self.groups).is_ok();
        // setfsuid back to 0 may have raised the fs capabilities again: put the saved set.
        let e = rustix::thread::set_capabilities(None, self.caps).is_ok();
        if !(a && b && c && d && e) {
            // Going on with another user's identity (or without ours) would be a security bug.
            eprintln!("dircache-search: could not restore thread credentials; aborting");
            std::process::abort();
        }
    }
}

/// Whether the calling thread holds a capability that widens file access decisions
/// (CAP_DAC_OVERRIDE or CAP_DAC_READ_SEARCH in its effective set). A delegated search never
/// applies capabilities, so such a caller searches by itself (the kernel then applies them).
pub fn caller_has_dac_caps() -> bool {
    match rustix::thread::capabilities(None) {
        Ok(c) => c
            .effective
            .intersects(CapabilitySet::DAC_OVERRIDE | CapabilitySet::DAC_READ_SEARCH),
        Err(_) => true,
    }
}

/// Whether this process may take on other users' credentials per thread.
pub fn can_switch() -> bool {
    match rustix::thread::capabilities(None) {
        Ok(c) => c
            .effective
            .contains(CapabilitySet::SETUID | CapabilitySet::SETGID),
        Err(_) => false,
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
    fn switch_drops_capabilities_and_restores_them() {
        if !can_switch() {
            return;
        }
        let before = rustix::thread::capabilities(None).unwrap_or_else(|e| panic!("{e}"));
        let groups = raw_getgroups().unwrap_or_else(|e| panic!("{e}"));
        // A 0700 directory owned by someone else.
        let d = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let p = d.path().join("x");
        std::fs::create_dir(&p).unwrap_or_else(|e| panic!("{e}"));
        std::os::unix::fs::chown(&p, Some(4321), Some(4321)).unwrap_or_else(|e| panic!("{e}"));
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(std::fs::read_dir(&p).is_ok());
        {
            let _g = ThreadCred::switch(&Cred::new(0, 0, [])).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(fsuid(), 0);
            assert!(!caller_has_dac_caps(), "uid 0 kept CAP_DAC_*");
            // Closed now, as the kernel closes it to uid 0 without capabilities.
            assert!(std::fs::read_dir(&p).is_err());
        }
        assert!(std::fs::read_dir(&p).is_ok());
        assert_eq!(rustix::thread::capabilities(None).ok(), Some(before));
        assert_eq!(raw_getgroups().ok(), Some(groups));
        {
            let _g =
                ThreadCred::switch(&Cred::new(4321, 4321, [77])).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(fsuid(), 4321);
            assert_eq!(raw_getgroups().ok(), Some(vec![77]));
        }
        assert_eq!(fsuid(), 0);
        assert_eq!(rustix::thread::capabilities(None).ok(), Some(before));
    }
}
