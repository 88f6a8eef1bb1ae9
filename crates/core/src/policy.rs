//! The access policy: the cache's analogue of a Linux Security Module.
//!
//! Every permission decision the cache makes goes through an [`AccessPolicy`]. The prefix-check
//! cache memoizes whatever the policy decided for directory search permission, so a policy must
//! be a pure function of the credential and the attributes it is given (the cache invalidates
//! memoized decisions when attributes change).

use crate::{Attr, Cred, Error, FileType, Result, R_OK, W_OK, X_OK};

/// Decides whether a credential may access a file.
pub trait AccessPolicy: Send + Sync + 'static {
    /// May `cred` access a file with attributes `attr` for `mask` (a combination of
    /// [`R_OK`], [`W_OK`], [`X_OK`])? `Err(Error::Access)` when not.
    fn permission(&self, cred: &Cred, attr: &Attr, mask: u32) -> Result<()>;

    /// Whether `cred` owns the file or may act as its owner (chmod, utimes, sticky deletes):
    /// Linux's `inode_owner_or_capable`.
    fn owner_or_capable(&self, cred: &Cred, attr: &Attr) -> bool {
        cred.is_root() || cred.uid == attr.uid
    }
}

/// POSIX mode bits as Linux's `generic_permission` applies them, ACLs not included.
///
/// The owner class is used if the uid matches, else the group class if the file's group is the
/// primary or a supplementary group, else other; there is no fall-through between classes.
/// Root (CAP_DAC_OVERRIDE) may read and write anything and search any directory, and may
/// execute a non-directory only if at least one execute bit is set.
#[derive(Debug, Default, Clone, Copy)]
pub struct PosixPolicy;

impl AccessPolicy for PosixPolicy {
    fn permission(&self, cred: &Cred, attr: &Attr, mask: u32) -> Result<()> {
        let mask = mask & (R_OK | W_OK | X_OK);
        if cred.is_root() {
            let exec_ok = attr.kind() == FileType::Directory || attr.mode & 0o111 != 0;
            return if mask & X_OK == 0 || exec_ok {
                Ok(())
            } else {
                Err(Error::Access)
            };
        }
        let bits = if cred.uid == attr.uid {
            (attr.mode >> 6) & 7
        } else if cred.in_group(attr.gid) {
            (attr.mode >> 3) & 7
        } else {
            attr.mode & 7
        };
        if bits & mask == mask {
            Ok(())
        } else {
            Err(Error::Access)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(mode: u32, uid: u32, gid: u32) -> Attr {
        Attr {
            mode,
            uid,
            gid,
            ..Default::default()
        }
    }

    #[test]
    fn owner_class_does_not_fall_through() {
        let p = PosixPolicy;
        let a = attr(libc::S_IFREG | 0o077, 1000, 1000);
        assert_eq!(
            p.permission(&Cred::new(1000, 1000, []), &a, R_OK),
            Err(Error::Access)
        );
        assert_eq!(p.permission(&Cred::new(1001, 1000, []), &a, R_OK), Ok(()));
        assert_eq!(
            p.permission(&Cred::new(1001, 5, [1000]), &a, R_OK | W_OK | X_OK),
            Ok(())
        );
        assert_eq!(p.permission(&Cred::new(1001, 5, []), &a, R_OK), Ok(()));
    }

    #[test]
    fn root_overrides_except_exec_of_plain_files() {
        let p = PosixPolicy;
        let root = Cred::root();
        assert_eq!(
            p.permission(&root, &attr(libc::S_IFDIR, 1, 1), R_OK | W_OK | X_OK),
            Ok(())
        );
        assert_eq!(
            p.permission(&root, &attr(libc::S_IFREG, 1, 1), X_OK),
            Err(Error::Access)
        );
        assert_eq!(
            p.permission(&root, &attr(libc::S_IFREG | 0o001, 1, 1), X_OK),
            Ok(())
        );
    }
}
