//! Acting as the caller: the one place where a thread of the daemon takes on a requester's
//! credentials, and gives them back.
//!
//! [`ActAs::switch`] sets the calling thread's supplementary groups, fs gid and fs uid to the
//! caller's [`Cred`] with the raw per-thread syscalls `SYS_setgroups`, `SYS_setfsgid` and
//! `SYS_setfsuid`, then trims the thread's *effective* capability set as the [`Caps`] policy
//! says (capset on the calling thread). Dropping the guard restores the capabilities, ids and
//! groups it found, also on error or panic; if that fails the process aborts (serving on with
//! another user's identity, or without its own, would be a security bug). The glibc wrappers
//! are deliberately not used: glibc's `setgroups` (and `setfsuid` in some versions)
//! broadcasts the change to every thread of the process (the "setxid" signal dance), while the
//! kernel's credentials are per thread. Other threads keep the daemon's credentials.
//!
//! Changing the fs uid from 0 to another value makes the kernel drop the file-system
//! capabilities (CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER, CAP_FSETID,
//! CAP_MKNOD, CAP_LINUX_IMMUTABLE, CAP_MAC_OVERRIDE) from the thread's effective set, and
//! switching back to 0 raises them again from the permitted set, so the kernel checks
//! permissions as for the user: new files get the user as owner and the right group (fs gid,
//! or the directory's group under a set-group-ID directory). The other capabilities
//! (CAP_SYS_ADMIN, CAP_SYS_RESOURCE, CAP_SETFCAP, ...) survive an fs uid switch; the policies
//! differ in what they do about those:
//!
//! - [`Caps::FsOnly`]: nothing beyond the fs uid switch. Used by the local backend
//!   (`LocalBackend`) for what only reads: read-only opens, the `O_PATH` resolution of an
//!   exec-only open, `getxattr` and `listxattr`. What the remaining capabilities would allow
//!   there is refused by the backend itself (`trusted.*` attributes for callers other than
//!   uid 0, in `xattr.rs`).
//! - [`Caps::AdminOnly`]: mutations. For a caller other than uid 0 every effective capability
//!   is dropped but CAP_SYS_ADMIN (which registering a passthrough backing file needs), so
//!   CAP_SYS_RESOURCE no longer lifts quota limits or opens the blocks reserved for root,
//!   CAP_SETFCAP no longer sets file capabilities, and CAP_FSETID is gone, so the backing file
//!   system clears set-user-ID and set-group-ID bits as for that user (`file_remove_privs`).
//!   A root caller keeps every capability; a root/root caller is not switched at all. Used with
//!   `shared: false` by the local backend's mutations (creations, removals, renames,
//!   attribute and xattr changes, opens that may write) and by its open files
//!   ([`data_path_caller`]: the FUSE data path, write, fallocate, truncate, copy_file_range,
//!   setattr through a descriptor, and the front end's inode-flag ioctls and ctime touches).
//!   With `shared: true` (passthrough registration: the kernel keeps the registering thread's credentials for every
//!   later read and write of that inode by any opener) a root caller is switched too and loses
//!   CAP_FSETID and CAP_SYS_RESOURCE, since other users' writes share those credentials.
//! - [`Caps::Empty`]: delegated searches (dircache-search): the effective set is emptied, so
//!   uid 0 without capabilities is an ordinary user for the kernel, exactly as a uid-0 process
//!   without CAP_DAC_* is, and no capability can widen an access decision. A client holding
//!   CAP_DAC_OVERRIDE or CAP_DAC_READ_SEARCH searches by itself instead
//!   ([`caller_has_dac_caps`]).
//!
//! A switch needs CAP_SETUID and CAP_SETGID (a root daemon). [`ActAs::switch`] fails without
//! them; [`ActAs::when`] skips the switch when told the process cannot switch (an unprivileged
//! daemon acts as itself, which no caller can exceed through it). Switching again from inside
//! a guard whose policy trimmed the capabilities fails (CAP_SETGID is gone) and changes
//! nothing, unless it has nothing to change. A switch changes only the ids and groups that
//! differ from the thread's (queried at every switch, never remembered: one `getgroups` and two
//! fs id queries) and its guard puts back only those: a root caller of a root daemon whose
//! groups are the daemon's costs three syscalls instead of fourteen. [`Caps::FsOnly`] does not look at the capabilities: restoring an fs uid of 0 raises
//! the permitted fs capabilities, which is exact when the thread held them effective before
//! (the daemon does).

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use dircache_core::{Cred, Error, Result};
use rustix::thread::{CapabilitySet, CapabilitySets};

/// What a switch does to the thread's effective capabilities (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caps {
    /// Only what the kernel drops with a non-zero fs uid (the file-system capabilities).
    FsOnly,
    /// A caller other than uid 0 keeps only CAP_SYS_ADMIN; a root caller keeps everything,
    /// and a root/root caller is not switched, unless `shared`: then root is switched and
    /// loses CAP_FSETID and CAP_SYS_RESOURCE.
    AdminOnly {
        /// The credentials serve later I/O of other users too (passthrough registration).
        shared: bool,
    },
    /// No effective capabilities at all, whoever the caller.
    Empty,
}

fn os_err() -> Error {
    Error::from(std::io::Error::last_os_error())
}

fn rustix_err(e: rustix::io::Errno) -> Error {
    Error::from_errno(e.raw_os_error())
}

fn raw_getgroups() -> Result<Vec<u32>> {
    // One call into a buffer that holds the usual number of groups; asking for the number
    // first only when it is too small (EINVAL).
    let mut v = vec![0u32; 32];
    loop {
        let size = libc::c_long::try_from(v.len()).unwrap_or(libc::c_long::MAX);
        // SAFETY: `v` has room for `size` gid_t values, which is the size passed.
        let m = unsafe { libc::syscall(libc::SYS_getgroups, size, v.as_mut_ptr()) };
        if m >= 0 {
            v.truncate(usize::try_from(m).unwrap_or(0));
            return Ok(v);
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINVAL) {
            return Err(Error::from(e));
        }
        // SAFETY: size 0 with a null pointer only asks for the number of groups.
        let n =
            unsafe { libc::syscall(libc::SYS_getgroups, 0, std::ptr::null_mut::<libc::gid_t>()) };
        if n < 0 {
            return Err(os_err());
        }
        v = vec![0u32; usize::try_from(n).unwrap_or(0).max(v.len() * 2)];
    }
}

/// Whether group lists `a` and `b` hold the same groups (in any order, with repeats).
fn same_groups(a: &[u32], b: &[u32]) -> bool {
    if a == b {
        return true;
    }
    let set = |g: &[u32]| {
        let mut g = g.to_vec();
        g.sort_unstable();
        g.dedup();
        g
    };
    set(a) == set(b)
}

fn raw_setgroups(groups: &[u32]) -> Result<()> {
    // SAFETY: the pointer and length describe a live slice of gid_t (u32) values; the raw
    // syscall only changes the calling thread's credentials.
    let r = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
    if r < 0 {
        return Err(os_err());
    }
    Ok(())
}

/// The thread's current fs uid or fs gid (`sys` is `SYS_setfsuid` or `SYS_setfsgid`).
fn raw_getfs(sys: libc::c_long) -> u32 {
    // SAFETY: -1 is an invalid id, so this only queries the current value.
    unsafe { libc::syscall(sys, -1i32) as u32 }
}

/// setfsuid/setfsgid never report errors directly; they return the previous value. Setting
/// and then querying with -1 tells whether the change took.
fn raw_setfs(sys: libc::c_long, id: u32) -> Result<()> {
    // SAFETY: setfsuid/setfsgid take one integer and only change this thread's credentials.
    unsafe { libc::syscall(sys, id) };
    if raw_getfs(sys) != id {
        return Err(Error::Perm);
    }
    Ok(())
}

/// What a guard puts back: only what the switch changed (`None`: left as it was).
struct Saved {
    fsuid: Option<u32>,
    fsgid: Option<u32>,
    groups: Option<Vec<u32>>,
    /// The capability sets, when the policy changes them.
    caps: Option<CapabilitySets>,
}

/// The calling thread acting as a caller (module docs); dropping it restores the thread's
/// previous groups, fs ids and capabilities, or aborts the process.
#[must_use = "the credentials are restored when the guard drops"]
pub struct ActAs {
    /// `None` when no switch happened.
    saved: Option<Saved>,
}

/// How the local backend's open files ([`dircache_core::FdFile`]) act as the caller: the
/// data path (write, fallocate, truncate, copy_file_range, setattr through a descriptor, and
/// the front end's ioctls and passthrough registration through
/// [`dircache_core::BackendFile::as_caller`]) runs under [`Caps::AdminOnly`] (`shared` for a
/// passthrough registration). Nothing changes when the daemon is not root (it could not
/// switch).
pub fn data_path_caller(
    cred: &Cred,
    shared: bool,
    f: &mut dyn FnMut() -> Result<()>,
) -> Result<()> {
    let _g = ActAs::when(process_is_root(), cred, Caps::AdminOnly { shared })?;
    f()
}

/// Whether the process runs as root (effective uid 0), i.e. may switch per thread.
pub fn process_is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The effective set a policy leaves, from the thread's `effective` set, for `cred`; `None`
/// when the policy leaves the capabilities alone.
fn trimmed(caps: Caps, cred: &Cred, effective: CapabilitySet) -> Option<CapabilitySet> {
    match caps {
        Caps::FsOnly => None,
        Caps::AdminOnly { .. } if cred.uid != 0 => Some(effective & CapabilitySet::SYS_ADMIN),
        Caps::AdminOnly { shared: true } => {
            Some(effective - (CapabilitySet::FSETID | CapabilitySet::SYS_RESOURCE))
        }
        Caps::AdminOnly { shared: false } => None,
        Caps::Empty => Some(CapabilitySet::empty()),
    }
}

impl ActAs {
    /// A guard that changed nothing.
    pub fn none() -> ActAs {
        ActAs { saved: None }
    }

    /// Switch to `cred` with policy `caps` when `enabled` (the process may switch, e.g.
    /// [`process_is_root`]); otherwise change nothing.
    pub fn when(enabled: bool, cred: &Cred, caps: Caps) -> Result<ActAs> {
        if enabled {
            Self::switch(cred, caps)
        } else {
            Ok(Self::none())
        }
    }

    /// Switch the calling thread to `cred` with capability policy `caps` (module docs).
    /// Needs CAP_SETUID and CAP_SETGID; on error nothing is left changed.
    pub fn switch(cred: &Cred, caps: Caps) -> Result<ActAs> {
        if caps == (Caps::AdminOnly { shared: false }) && cred.uid == 0 && cred.gid == 0 {
            return Ok(Self::none());
        }
        let saved_caps = match caps {
            Caps::FsOnly => None,
            Caps::AdminOnly { shared: false } if cred.uid == 0 => None,
            _ => Some(rustix::thread::capabilities(None).map_err(rustix_err)?),
        };
        // Only what differs is changed (and then put back): a caller with the thread's own
        // ids and groups (a root caller of a root daemon) costs three queries.
        let groups = raw_getgroups()?;
        let fsuid = raw_getfs(libc::SYS_setfsuid);
        let fsgid = raw_getfs(libc::SYS_setfsgid);
        let groups = if same_groups(&groups, cred.groups()) {
            None
        } else {
            raw_setgroups(cred.groups())?;
            Some(groups)
        };
        // From here on, the guard restores everything, also on error.
        let mut guard = ActAs {
            saved: Some(Saved {
                fsuid: None,
                fsgid: None,
                groups,
                caps: saved_caps,
            }),
        };
        if fsgid != cred.gid {
            if let Some(s) = guard.saved.as_mut() {
                s.fsgid = Some(fsgid);
            }
            raw_setfs(libc::SYS_setfsgid, cred.gid)?;
        }
        if fsuid != cred.uid {
            if let Some(s) = guard.saved.as_mut() {
                s.fsuid = Some(fsuid);
            }
            raw_setfs(libc::SYS_setfsuid, cred.uid)?;
        }
        // After the id switch (setfsuid needs CAP_SETUID); the guard restores them first.
        // (What the fs uid switch dropped are fs capabilities, which no policy keeps.)
        if let Some(saved) = saved_caps {
            if let Some(effective) = trimmed(caps, cred, saved.effective) {
                rustix::thread::set_capabilities(None, CapabilitySets { effective, ..saved })
                    .map_err(rustix_err)?;
            }
        }
        Ok(guard)
    }
}

impl Drop for ActAs {
    fn drop(&mut self) {
        let Some(s) = self.saved.take() else {
            return;
        };
        // Capabilities first (raising them from the permitted set needs none), so that
        // setfsuid (CAP_SETUID) and setgroups (CAP_SETGID) work again.
        let a = match s.caps {
            Some(c) => rustix::thread::set_capabilities(None, c).is_ok(),
            None => true,
        };
        // fsuid first: going back to 0 raises the permitted fs capabilities.
        let b = s
            .fsuid
            .is_none_or(|u| raw_setfs(libc::SYS_setfsuid, u).is_ok());
        let c = s
            .fsgid
            .is_none_or(|g| raw_setfs(libc::SYS_setfsgid, g).is_ok());
        let d = s.groups.as_ref().is_none_or(|g| raw_setgroups(g).is_ok());
        // That raise may have added fs capabilities the saved effective set lacked.
        let e = match s.caps {
            Some(c) if c.effective != c.permitted => {
                rustix::thread::set_capabilities(None, c).is_ok()
            }
            _ => true,
        };
        if !(a && b && c && d && e) {
            tracing::error!("dircache: could not restore thread credentials; aborting");
            eprintln!("dircache: could not restore thread credentials; aborting");
            std::process::abort();
        }
    }
}

/// The calling thread's effective capabilities.
fn effective_caps() -> Option<CapabilitySet> {
    rustix::thread::capabilities(None).ok().map(|c| c.effective)
}

/// Whether the calling thread holds a capability that widens file access decisions
/// (CAP_DAC_OVERRIDE or CAP_DAC_READ_SEARCH in its effective set; yes when unknown). A
/// delegated search never applies capabilities, so such a caller searches by itself (the
/// kernel then applies them).
pub fn caller_has_dac_caps() -> bool {
    match effective_caps() {
        Some(e) => e.intersects(CapabilitySet::DAC_OVERRIDE | CapabilitySet::DAC_READ_SEARCH),
        None => true,
    }
}

/// Whether this process may take on other users' credentials per thread.
pub fn can_switch() -> bool {
    effective_caps().is_some_and(|e| e.contains(CapabilitySet::SETUID | CapabilitySet::SETGID))
}

/// The supplementary groups of the process at the other end of unix socket `s`, as the kernel
/// recorded them when it connected (`SO_PEERGROUPS`; rustix has no wrapper for it).
pub fn peer_groups(s: BorrowedFd<'_>) -> std::io::Result<Vec<u32>> {
    let fd = s.as_raw_fd();
    let mut n: usize = 64;
    loop {
        let mut buf = vec![0u32; n];
        let mut len = libc::socklen_t::try_from(n * 4).unwrap_or(libc::socklen_t::MAX);
        // SAFETY: buf is valid for `len` bytes; the kernel writes at most `len` bytes and
        // updates len.
        let r = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_PEERGROUPS,
                buf.as_mut_ptr().cast(),
                &mut len,
            )
        };
        if r == 0 {
            buf.truncate(len as usize / 4);
            return Ok(buf);
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ERANGE) && n < 65536 {
            n = (len as usize / 4).max(n * 2).min(65536);
            continue;
        }
        return Err(e);
    }
}

/// `SO_PEERPIDFD` (include/uapi/asm-generic/socket.h, Linux 6.5; not in the libc crate).
const SO_PEERPIDFD: libc::c_int = 77;

/// A pidfd of the process at the other end of unix socket `s`, the one the kernel recorded
/// when it connected (`SO_PEERPIDFD`).
pub fn peer_pidfd(s: BorrowedFd<'_>) -> std::io::Result<OwnedFd> {
    let mut fd: libc::c_int = -1;
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::c_int>())
        .unwrap_or(libc::socklen_t::MAX);
    // SAFETY: `fd` is valid for `len` bytes (one c_int); the kernel writes at most that.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&raw mut fd).cast(),
            &raw mut len,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if fd < 0 {
        return Err(std::io::Error::other("SO_PEERPIDFD gave no descriptor"));
    }
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fsuid() -> u32 {
        raw_getfs(libc::SYS_setfsuid)
    }

    fn has_cap(c: CapabilitySet) -> bool {
        rustix::thread::capabilities(None)
            .map(|s| s.effective.contains(c))
            .unwrap_or(false)
    }

    // (was crates/local/src/creds.rs: CredGuard)
    #[test]
    fn fs_only_switch_and_restore() {
        if !process_is_root() {
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
            let _g = ActAs::when(true, &Cred::new(12345, 23456, [7, 8]), Caps::FsOnly).unwrap();
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

    // (was crates/fuse/src/ascaller.rs: AsCaller)
    #[test]
    fn admin_only_drops_and_restores() {
        if !process_is_root() {
            return;
        }
        // (CAP_SYS_RESOURCE may be missing from the bounding set of a container.)
        let now = || {
            (
                fsuid(),
                raw_getgroups().unwrap(),
                has_cap(CapabilitySet::FSETID),
                has_cap(CapabilitySet::SYS_RESOURCE),
            )
        };
        let before = now();
        {
            let _g = ActAs::switch(
                &Cred::new(1000, 1000, [5]),
                Caps::AdminOnly { shared: false },
            )
            .unwrap();
            assert_eq!(fsuid(), 1000);
            assert_eq!(raw_getgroups().unwrap(), vec![5]);
            assert!(!has_cap(CapabilitySet::FSETID));
            assert!(!has_cap(CapabilitySet::SYS_RESOURCE));
            assert!(has_cap(CapabilitySet::SYS_ADMIN));
        }
        assert_eq!(now(), before);
        {
            let _g = ActAs::switch(&Cred::root(), Caps::AdminOnly { shared: true }).unwrap();
            assert_eq!(fsuid(), 0);
            assert!(!has_cap(CapabilitySet::FSETID));
            assert!(!has_cap(CapabilitySet::SYS_RESOURCE));
        }
        assert_eq!(now(), before);
    }

    // (was crates/search/src/creds.rs: ThreadCred)
    #[test]
    fn empty_drops_capabilities_and_restores_them() {
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
            let _g =
                ActAs::switch(&Cred::new(0, 0, []), Caps::Empty).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(fsuid(), 0);
            assert!(!caller_has_dac_caps(), "uid 0 kept CAP_DAC_*");
            // Closed now, as the kernel closes it to uid 0 without capabilities.
            assert!(std::fs::read_dir(&p).is_err());
        }
        assert!(std::fs::read_dir(&p).is_ok());
        assert_eq!(rustix::thread::capabilities(None).ok(), Some(before));
        assert_eq!(raw_getgroups().ok(), Some(groups));
        {
            let _g = ActAs::switch(&Cred::new(4321, 4321, [77]), Caps::Empty)
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(fsuid(), 4321);
            assert_eq!(raw_getgroups().ok(), Some(vec![77]));
        }
        assert_eq!(fsuid(), 0);
        assert_eq!(rustix::thread::capabilities(None).ok(), Some(before));
    }

    #[test]
    fn same_groups_ignores_order_and_repeats() {
        assert!(same_groups(&[1, 2, 2], &[2, 1]));
        assert!(same_groups(&[], &[]));
        assert!(!same_groups(&[1], &[1, 2]));
    }

    /// A switch changes only what differs from the thread's ids and groups, and its guard puts
    /// back exactly what the thread had, also when the thread's fs gid and groups were not
    /// the process's (a switch queries them, never remembers them).
    #[test]
    fn switch_changes_only_what_differs_and_restores_exactly() {
        if !can_switch() {
            return;
        }
        let fsgid = || raw_getfs(libc::SYS_setfsgid);
        let groups = || {
            let mut g = raw_getgroups().unwrap();
            g.sort_unstable();
            g
        };
        // On a thread of its own (this one's ids are changed behind ActAs's back first).
        std::thread::spawn(move || {
            raw_setgroups(&[31, 32]).unwrap();
            raw_setfs(libc::SYS_setfsgid, 30).unwrap();
            let same = Cred::new(0, 30, [31, 32]);
            {
                let _g = ActAs::switch(&same, Caps::FsOnly).unwrap();
                assert_eq!((fsuid(), fsgid(), groups()), (0, 30, vec![31, 32]));
            }
            {
                let _g = ActAs::switch(&Cred::new(0, 40, [31, 32]), Caps::FsOnly).unwrap();
                assert_eq!((fsuid(), fsgid(), groups()), (0, 40, vec![31, 32]));
            }
            assert_eq!((fsuid(), fsgid(), groups()), (0, 30, vec![31, 32]));
            {
                let c = Cred::new(1000, 30, [41]);
                let _g = ActAs::switch(&c, Caps::AdminOnly { shared: false }).unwrap();
                assert_eq!((fsuid(), fsgid(), groups()), (1000, 30, vec![41]));
                assert!(!has_cap(CapabilitySet::FSETID));
                // Nothing to change: allowed inside a guard that trimmed the capabilities.
                let _h = ActAs::switch(&c, Caps::FsOnly).unwrap();
                assert_eq!((fsuid(), fsgid(), groups()), (1000, 30, vec![41]));
                // Something to change: refused, and nothing changed.
                assert!(ActAs::switch(&Cred::new(1001, 30, [41]), Caps::FsOnly).is_err());
                assert_eq!((fsuid(), fsgid(), groups()), (1000, 30, vec![41]));
            }
            assert_eq!((fsuid(), fsgid(), groups()), (0, 30, vec![31, 32]));
            assert!(has_cap(CapabilitySet::FSETID));
        })
        .join()
        .unwrap();
    }
}
