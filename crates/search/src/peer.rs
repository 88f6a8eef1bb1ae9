//! The real, effective and saved ids of a control-socket peer, for the owner check of a mount
//! without `allow_other` (docs/security.md P9).
//!
//! The kernel lets a process into such a mount only if its uid, euid and suid all equal the
//! mount's `user_id=` and its gid, egid and sgid all equal `group_id=` (fs/fuse/dir.c,
//! `fuse_permissible_uid`): a set-user-ID program of the owner run by another user is kept
//! out. `SO_PEERCRED` records only the effective ids, so the rest is read from
//! `/proc/PID/status` of the peer, found through the pidfd the kernel recorded at connect
//! (`SO_PEERPIDFD`, Linux 6.5): the pid is read from the pidfd's fdinfo, the status file is
//! read, and then the pidfd is polled: a process that has not exited after the read still owns
//! that pid (a pid is reused only after its process is reaped), so the status read was its
//! own. Anything missing or inconsistent (no pidfd, a process gone, a pid outside our pid
//! namespace, effective ids differing from `SO_PEERCRED`'s) gives `None`, and the caller is
//! then not the owner (the safe direction).

use std::os::fd::{AsFd, AsRawFd, OwnedFd};

/// The six ids the kernel compares with a FUSE mount's owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerIds {
    /// Real, effective and saved uid.
    pub uids: [u32; 3],
    /// Real, effective and saved gid.
    pub gids: [u32; 3],
}

impl PeerIds {
    /// Whether the kernel's `fuse_permissible_uid` lets this process into a mount owned by
    /// `uid` (and group `gid`, when known).
    pub fn is_owner(&self, uid: u32, gid: Option<u32>) -> bool {
        self.uids.iter().all(|&u| u == uid) && gid.is_none_or(|g| self.gids.iter().all(|&x| x == g))
    }
}

/// The peer's ids (see the module doc); `None` if they cannot be known for certain or do not
/// agree with `SO_PEERCRED`'s effective uid and gid (`euid`, `egid`).
pub fn peer_ids(s: &impl AsFd, euid: u32, egid: u32) -> Option<PeerIds> {
    let pidfd = dircache_local::creds::peer_pidfd(s.as_fd()).ok()?;
    let fdinfo =
        std::fs::read_to_string(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd())).ok()?;
    let pid = *field(&fdinfo, "Pid:")?.first()?;
    if pid <= 0 {
        return None; // exited (-1) or in a pid namespace we cannot see (0)
    }
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    if exited(&pidfd) {
        return None; // the pid may belong to another process by now
    }
    let ids = PeerIds {
        uids: three(&status, "Uid:")?,
        gids: three(&status, "Gid:")?,
    };
    (ids.uids[1] == euid && ids.gids[1] == egid).then_some(ids)
}

/// The numbers after `key` on its line of a `/proc` file.
fn field(text: &str, key: &str) -> Option<Vec<i64>> {
    let line = text.lines().find_map(|l| l.strip_prefix(key))?;
    line.split_whitespace()
        .map(|x| x.parse().ok())
        .collect::<Option<Vec<i64>>>()
        .filter(|v| !v.is_empty())
}

/// The first three ids of a `Uid:`/`Gid:` line (real, effective, saved).
fn three(text: &str, key: &str) -> Option<[u32; 3]> {
    let v = field(text, key)?;
    let id = |i: usize| v.get(i).and_then(|&x| u32::try_from(x).ok());
    Some([id(0)?, id(1)?, id(2)?])
}

/// Whether the process of `pidfd` has exited (a pidfd polls readable then).
fn exited(pidfd: &OwnedFd) -> bool {
    use rustix::event::{poll, PollFd, PollFlags};
    let mut p = [PollFd::new(pidfd, PollFlags::IN)];
    let zero = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    !matches!(poll(&mut p, Some(&zero)), Ok(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_ids_over_a_socketpair() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().expect("pair");
        let (u, g) = (
            rustix::process::geteuid().as_raw(),
            rustix::process::getegid().as_raw(),
        );
        let ids = peer_ids(&a, u, g).expect("ids of this process");
        assert_eq!(ids.uids[1], u);
        assert_eq!(ids.gids[1], g);
        assert!(peer_ids(&a, u.wrapping_add(1), g).is_none());
    }

    #[test]
    fn owner_needs_all_three() {
        let ids = PeerIds {
            uids: [1001, 0, 0],
            gids: [0, 0, 0],
        };
        assert!(!ids.is_owner(0, Some(0)));
        let ids = PeerIds {
            uids: [5, 5, 5],
            gids: [5, 6, 5],
        };
        assert!(ids.is_owner(5, None));
        assert!(!ids.is_owner(5, Some(5)));
    }
}
