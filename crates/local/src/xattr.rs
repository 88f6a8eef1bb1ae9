//! Extended attributes, with the caller's rights on the file the caller named.
//!
//! The target is resolved as the daemon to an `O_PATH` descriptor (confined like every other
//! resolution, never following a symlink), and, when the caller holds a particular inode, that
//! descriptor must be that inode: a name renamed over from outside since the caller's lookup
//! gives [`Error::Stale`], never an action on the other file. The call itself is made through
//! `/proc/self/fd/N` (`O_PATH` descriptors take no `f*xattr` calls) with the thread's fs uid,
//! fs gid and groups switched to the caller's, so the kernel decides as for that user: read or
//! write permission for `user.*`, ownership for ACLs, and the ACL's mode update (set-group-ID
//! cleared for a caller outside the file's group). The magic link resolves for the caller
//! because the kernel lets a process reach its own descriptors whatever its fs uid.
//!
//! One thing the switch cannot take away is CAP_SYS_ADMIN (it is not a file-system
//! capability): `trusted.*` attributes are therefore hidden from, and refused to, callers
//! other than uid 0 here, as the kernel does for callers without that capability.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use dircache_core::{Cred, Error, Result, XattrTarget};
use rustix::fs::{Mode, OFlags};

use crate::creds::CredGuard;
use crate::{check_path, errno, split, statx_fd, LocalBackend, RESOLVE};

/// Largest value (XATTR_SIZE_MAX) and name list (XATTR_LIST_MAX) the kernel hands out.
const XATTR_MAX: usize = 65536;

const TRUSTED: &[u8] = b"trusted.";

/// The target's descriptor and the `/proc/self/fd` path that names it.
struct Target {
    _fd: OwnedFd,
    proc: CString,
}

fn privileged(cred: &Cred) -> bool {
    cred.uid == 0
}

fn cname(name: &[u8]) -> Result<CString> {
    CString::new(name).map_err(|_| Error::Invalid)
}

/// The result of a libc call returning a length or -1.
fn len_result(r: isize) -> Result<usize> {
    if r < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(r as usize)
}

impl LocalBackend {
    /// Resolve `t` as the daemon and check it is the inode the caller holds.
    fn xattr_target(&self, t: XattrTarget<'_>) -> Result<Target> {
        check_path(t.path)?;
        let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = if t.path.is_empty() {
            rustix::fs::openat2(&self.root, c".", flags, Mode::empty(), RESOLVE).map_err(errno)?
        } else {
            let (dir, name) = split(t.path)?;
            let d = self.dir(dir)?;
            rustix::fs::openat2(d.as_fd(), name, flags, Mode::empty(), RESOLVE).map_err(errno)?
        };
        if let Some(key) = t.expect {
            let a = statx_fd(fd.as_fd())?;
            if (a.dev, a.ino) != key {
                tracing::debug!(
                    "xattr: {:?} is no longer the caller's inode",
                    String::from_utf8_lossy(t.path)
                );
                return Err(Error::Stale);
            }
        }
        // A decimal number never contains NUL.
        let proc = CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .map_err(|_| Error::Invalid)?;
        Ok(Target { _fd: fd, proc })
    }

    pub(crate) fn getxattr_impl(
        &self,
        cred: &Cred,
        t: XattrTarget<'_>,
        name: &[u8],
    ) -> Result<Vec<u8>> {
        if name.starts_with(TRUSTED) && !privileged(cred) {
            return Err(Error::Os(libc::ENODATA));
        }
        let n = cname(name)?;
        let t = self.xattr_target(t)?;
        let _g = CredGuard::switch(cred, self.switch_creds)?;
        let mut buf = vec![0u8; XATTR_MAX];
        // SAFETY: both strings are NUL-terminated; buf is valid for buf.len() bytes.
        let r = unsafe {
            libc::getxattr(
                t.proc.as_ptr(),
                n.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        buf.truncate(len_result(r)?);
        Ok(buf)
    }

    pub(crate) fn listxattr_impl(&self, cred: &Cred, t: XattrTarget<'_>) -> Result<Vec<u8>> {
        let t = self.xattr_target(t)?;
        let _g = CredGuard::switch(cred, self.switch_creds)?;
        let mut buf = vec![0u8; XATTR_MAX];
        // SAFETY: the path is NUL-terminated; buf is valid for buf.len() bytes.
        let r = unsafe { libc::listxattr(t.proc.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        buf.truncate(len_result(r)?);
        if privileged(cred) {
            return Ok(buf);
        }
        Ok(buf
            .split(|b| *b == 0)
            .filter(|n| !n.is_empty() && !n.starts_with(TRUSTED))
            .flat_map(|n| n.iter().copied().chain(std::iter::once(0)))
            .collect())
    }

    pub(crate) fn setxattr_impl(
        &self,
        cred: &Cred,
        t: XattrTarget<'_>,
        name: &[u8],
        value: &[u8],
        flags: i32,
    ) -> Result<()> {
        if name.starts_with(TRUSTED) && !privileged(cred) {
            return Err(Error::Perm);
        }
        let n = cname(name)?;
        let t = self.xattr_target(t)?;
        self.as_cred(cred, || {
            // SAFETY: both strings are NUL-terminated; value is valid for value.len() bytes.
            let r = unsafe {
                libc::setxattr(
                    t.proc.as_ptr(),
                    n.as_ptr(),
                    value.as_ptr().cast(),
                    value.len(),
                    flags,
                )
            };
            len_result(r as isize).map(drop)
        })
    }

    pub(crate) fn removexattr_impl(
        &self,
        cred: &Cred,
        t: XattrTarget<'_>,
        name: &[u8],
    ) -> Result<()> {
        if name.starts_with(TRUSTED) && !privileged(cred) {
            return Err(Error::Perm);
        }
        let n = cname(name)?;
        let t = self.xattr_target(t)?;
        self.as_cred(cred, || {
            // SAFETY: both strings are NUL-terminated.
            let r = unsafe { libc::removexattr(t.proc.as_ptr(), n.as_ptr()) };
            len_result(r as isize).map(drop)
        })
    }
}
