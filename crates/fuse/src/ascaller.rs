//! Running a data operation (write, fallocate, truncate, copy_file_range, passthrough
//! registration) as the caller.
//!
//! The thread's fs uid, fs gid and supplementary groups are switched to the caller's with the
//! raw per-thread syscalls (glibc's wrappers would change every thread of the process), and a
//! guard switches them back. An fs uid other than 0 drops CAP_FSETID (with the other
//! file-system capabilities) from the effective set, so the backing file system clears the
//! set-user-ID/set-group-ID bits on a write, truncate or fallocate exactly as for that user
//! (`file_remove_privs`). For a passthrough backing file the kernel keeps the credentials of
//! the registering thread for every later read and write of that inode by any opener, so that
//! registration also drops CAP_FSETID for a root caller ([`AsCaller::switch_no_fsetid`]):
//! the bits are then cleared by root's passthrough writes too, never kept for a user's.
//!
//! An fs uid switch keeps the capabilities outside the file-system set, notably
//! CAP_SYS_RESOURCE (quota limits and the blocks reserved for root do not apply to its
//! holder): for a caller other than root every effective capability is dropped but
//! CAP_SYS_ADMIN (which registering a passthrough backing file needs), and a passthrough
//! registration for root drops CAP_SYS_RESOURCE too, since other users' writes share it.

use dircache_core::Cred;

const CAP_FSETID: u32 = 4;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_SYS_RESOURCE: u32 = 24;
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum AsCallerError {
    #[error("could not switch to the caller's credentials: {0}")]
    Switch(std::io::Error),
}

impl AsCallerError {
    pub fn errno(&self) -> i32 {
        match self {
            AsCallerError::Switch(e) => e.raw_os_error().unwrap_or(libc::EPERM),
        }
    }
}

fn getgroups() -> std::io::Result<Vec<u32>> {
    // SAFETY: size 0 with a null pointer only asks for the number of groups.
    let n = unsafe { libc::syscall(libc::SYS_getgroups, 0, std::ptr::null_mut::<libc::gid_t>()) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut v = vec![0u32; n as usize];
    // SAFETY: `v` has room for `n` gid_t values, the size passed.
    let m = unsafe { libc::syscall(libc::SYS_getgroups, n, v.as_mut_ptr()) };
    if m < 0 {
        return Err(std::io::Error::last_os_error());
    }
    v.truncate(m as usize);
    Ok(v)
}

fn setgroups(g: &[u32]) -> std::io::Result<()> {
    // SAFETY: pointer and length describe a live slice of gid_t; the raw syscall changes only
    // this thread's credentials.
    let r = unsafe { libc::syscall(libc::SYS_setgroups, g.len(), g.as_ptr()) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// setfsuid/setfsgid return the previous value; querying with -1 tells whether it took.
fn setfs(sys: libc::c_long, id: u32) -> std::io::Result<u32> {
    // SAFETY: one integer argument; changes only this thread's credentials.
    let prev = unsafe { libc::syscall(sys, id) } as u32;
    // SAFETY: -1 is an invalid id: this only queries.
    let now = unsafe { libc::syscall(sys, -1i32) } as u32;
    if now != id {
        return Err(std::io::Error::from_raw_os_error(libc::EPERM));
    }
    Ok(prev)
}

fn capget() -> std::io::Result<[CapData; 2]> {
    let mut h = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut d = [CapData::default(); 2];
    // SAFETY: header and a two-element data array as capget(2) expects for version 3.
    let r = unsafe { libc::syscall(libc::SYS_capget, &mut h, d.as_mut_ptr()) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(d)
}

fn capset(d: &[CapData; 2]) -> std::io::Result<()> {
    let mut h = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    // SAFETY: as capget; the raw syscall changes only this thread's capabilities.
    let r = unsafe { libc::syscall(libc::SYS_capset, &mut h, d.as_ptr()) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

struct Saved {
    fsuid: u32,
    fsgid: u32,
    groups: Vec<u32>,
    caps: Option<[CapData; 2]>,
}

/// Restores the thread's fs credentials (and capabilities) when dropped.
pub struct AsCaller {
    saved: Option<Saved>,
}

fn is_root_process() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

impl AsCaller {
    /// Act as `cred` until the guard drops. Nothing changes when the daemon is not root (it
    /// could not switch) or when `cred` is root/root (the thread already acts as root).
    pub fn switch(cred: &Cred) -> Result<AsCaller, AsCallerError> {
        Self::switch_inner(cred, false)
    }

    /// As [`AsCaller::switch`], and CAP_FSETID is not effective even for a root caller.
    pub fn switch_no_fsetid(cred: &Cred) -> Result<AsCaller, AsCallerError> {
        Self::switch_inner(cred, true)
    }

    fn switch_inner(cred: &Cred, no_fsetid: bool) -> Result<AsCaller, AsCallerError> {
        if !is_root_process() || (cred.uid == 0 && cred.gid == 0 && !no_fsetid) {
            return Ok(AsCaller { saved: None });
        }
        let groups = getgroups().map_err(AsCallerError::Switch)?;
        // SAFETY: querying with -1 changes nothing.
        let fsuid = unsafe { libc::syscall(libc::SYS_setfsuid, -1i32) } as u32;
        // SAFETY: as above.
        let fsgid = unsafe { libc::syscall(libc::SYS_setfsgid, -1i32) } as u32;
        let caps = if no_fsetid || cred.uid != 0 {
            Some(capget().map_err(AsCallerError::Switch)?)
        } else {
            None
        };
        setgroups(cred.groups()).map_err(AsCallerError::Switch)?;
        // From here on the guard restores everything, also on error.
        let g = AsCaller {
            saved: Some(Saved {
                fsuid,
                fsgid,
                groups,
                caps,
            }),
        };
        setfs(libc::SYS_setfsgid, cred.gid).map_err(AsCallerError::Switch)?;
        setfs(libc::SYS_setfsuid, cred.uid).map_err(AsCallerError::Switch)?;
        // After the id switch (setfsuid needs CAP_SETUID); the guard restores them first.
        if let Some(c) = caps {
            let mut d = c;
            if cred.uid != 0 {
                d[0].effective &= 1 << CAP_SYS_ADMIN;
                d[1].effective = 0;
            } else {
                d[0].effective &= !((1 << CAP_FSETID) | (1 << CAP_SYS_RESOURCE));
            }
            capset(&d).map_err(AsCallerError::Switch)?;
        }
        Ok(g)
    }
}

impl Drop for AsCaller {
    fn drop(&mut self) {
        if let Some(s) = self.saved.take() {
            let c = s.caps.map(|c| capset(&c)).unwrap_or(Ok(()));
            // fsuid first: going back to 0 restores the file-system capabilities.
            let a = setfs(libc::SYS_setfsuid, s.fsuid);
            let b = setfs(libc::SYS_setfsgid, s.fsgid);
            let g = setgroups(&s.groups);
            if a.is_err() || b.is_err() || g.is_err() || c.is_err() {
                // Serving on with another identity would be a security bug.
                tracing::error!("dircache-fuse: could not restore thread credentials; aborting");
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

    fn has_fsetid() -> bool {
        has_cap(CAP_FSETID)
    }

    fn has_cap(c: u32) -> bool {
        capget()
            .map(|d| d[0].effective & (1 << c) != 0)
            .unwrap_or(false)
    }

    #[test]
    fn switch_drops_and_restores() {
        if !is_root_process() {
            return;
        }
        // (CAP_SYS_RESOURCE may be missing from the bounding set of a container.)
        let before = (
            fsuid(),
            getgroups().unwrap(),
            has_fsetid(),
            has_cap(CAP_SYS_RESOURCE),
        );
        {
            let _g = AsCaller::switch(&Cred::new(1000, 1000, [5])).unwrap();
            assert_eq!(fsuid(), 1000);
            assert_eq!(getgroups().unwrap(), vec![5]);
            assert!(!has_fsetid());
            assert!(!has_cap(CAP_SYS_RESOURCE));
            assert!(has_cap(CAP_SYS_ADMIN));
        }
        let now = || {
            (
                fsuid(),
                getgroups().unwrap(),
                has_fsetid(),
                has_cap(CAP_SYS_RESOURCE),
            )
        };
        assert_eq!(now(), before);
        {
            let _g = AsCaller::switch_no_fsetid(&Cred::root()).unwrap();
            assert_eq!(fsuid(), 0);
            assert!(!has_fsetid());
            assert!(!has_cap(CAP_SYS_RESOURCE));
        }
        assert_eq!(now(), before);
    }
}
