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

use crate::{check_path, errno, split, statx_fd, LocalBackend, RESOLVE};

/// Largest value (XATTR_SIZE_MAX) and name list (XATTR_LIST_MAX) the kernel hands out.
const XATTR_MAX: usize = 65536;

/// First buffer tried for a value.
const SMALL: usize = 512;

const TRUSTED: &[u8] = b"trusted.";

/// The target's descriptor and the `/proc/self/fd` path that names it.
struct Target {
    _fd: OwnedFd,
    proc: CString,
}

fn is_posix_acl(name: &[u8]) -> bool {
    name == b"system.posix_acl_access" || name == b"system.posix_acl_default"
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
        let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = if let Some(open) = t.open {
            // The caller's open file itself (its names are gone): no path to resolve.
            open.try_clone_to_owned().map_err(Error::from)?
        } else if t.path.is_empty() {
            check_path(t.path)?;
            rustix::fs::openat2(&self.root, c".", flags, Mode::empty(), RESOLVE).map_err(errno)?
        } else {
            check_path(t.path)?;
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
        // Anyone who reaches a file may read its POSIX ACLs (the kernel checks nothing for
        // system.* reads): the switch is skipped for these, the kernel's most frequent ask.
        let _g = if is_posix_acl(name) {
            None
        } else {
            Some(self.act_as(cred)?)
        };
        // Most values (ACLs) are small: a short buffer first, the largest possible on ERANGE.
        let mut buf = Vec::new();
        for cap in [SMALL, XATTR_MAX] {
            buf.resize(cap, 0);
            // SAFETY: both strings are NUL-terminated; buf is valid for buf.len() bytes.
            let r = unsafe {
                libc::getxattr(
                    t.proc.as_ptr(),
                    n.as_ptr(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                )
            };
            match len_result(r) {
                Ok(len) => {
                    buf.truncate(len);
                    return Ok(buf);
                }
                Err(Error::Os(libc::ERANGE)) if cap < XATTR_MAX => continue,
                Err(e) => return Err(e),
            }
        }
        Err(Error::Os(libc::ERANGE))
    }

    pub(crate) fn listxattr_impl(&self, cred: &Cred, t: XattrTarget<'_>) -> Result<Vec<u8>> {
        let t = self.xattr_target(t)?;
        let _g = self.act_as(cred)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use dircache_core::Backend;

    fn is_root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }

    #[test]
    fn acts_only_on_the_expected_inode() {
        let dir = tempfile::tempdir().unwrap();
        let b = LocalBackend::new(dir.path()).unwrap();
        std::fs::write(dir.path().join("a"), "a").unwrap();
        std::fs::write(dir.path().join("b"), "b").unwrap();
        let me = Cred::new(
            rustix::process::geteuid().as_raw(),
            rustix::process::getegid().as_raw(),
            [],
        );
        let a = b.getattr(b"a").unwrap();
        let t = XattrTarget {
            path: b"a",
            expect: Some((a.dev, a.ino)),
            open: None,
        };
        b.setxattr(&me, t, b"user.k", b"first", 0).unwrap();
        assert_eq!(b.getxattr(&me, t, b"user.k").unwrap(), b"first");
        assert_eq!(b.listxattr(&me, t).unwrap(), b"user.k\0");
        // A long value takes the second buffer.
        let long = vec![b'v'; 3000];
        b.setxattr(&me, t, b"user.long", &long, 0).unwrap();
        assert_eq!(b.getxattr(&me, t, b"user.long").unwrap(), long);
        b.removexattr(&me, t, b"user.long").unwrap();
        // "a" now names another file: nothing is done to it.
        std::fs::rename(dir.path().join("b"), dir.path().join("a")).unwrap();
        assert_eq!(b.getxattr(&me, t, b"user.k"), Err(Error::Stale));
        assert_eq!(b.listxattr(&me, t), Err(Error::Stale));
        assert_eq!(b.setxattr(&me, t, b"user.k", b"x", 0), Err(Error::Stale));
        assert_eq!(b.removexattr(&me, t, b"user.k"), Err(Error::Stale));
        let fresh = XattrTarget {
            path: b"a",
            expect: None,
            open: None,
        };
        assert_eq!(
            b.getxattr(&me, fresh, b"user.k"),
            Err(Error::Os(libc::ENODATA))
        );
    }

    #[test]
    fn trusted_names_only_for_root() {
        if !is_root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let b = LocalBackend::new(dir.path()).unwrap();
        std::fs::write(dir.path().join("f"), "f").unwrap();
        let t = XattrTarget {
            path: b"f",
            expect: None,
            open: None,
        };
        b.setxattr(&Cred::root(), t, b"trusted.t", b"1", 0).unwrap();
        b.setxattr(&Cred::root(), t, b"user.u", b"1", 0).unwrap();
        let user = Cred::new(1001, 1001, []);
        let names = b.listxattr(&Cred::root(), t).unwrap();
        assert!(names.windows(9).any(|w| w == b"trusted.t"));
        assert_eq!(b.listxattr(&user, t).unwrap(), b"user.u\0");
        assert_eq!(
            b.getxattr(&user, t, b"trusted.t"),
            Err(Error::Os(libc::ENODATA))
        );
        assert_eq!(
            b.setxattr(&user, t, b"trusted.t", b"2", 0),
            Err(Error::Perm)
        );
        // Not the owner: user.* needs write permission on the file (0644 root's).
        assert_eq!(b.setxattr(&user, t, b"user.u", b"2", 0), Err(Error::Access));
    }
}
