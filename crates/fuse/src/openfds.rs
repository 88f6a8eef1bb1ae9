//! The daemon's descriptors for open files: shared, and bounded per user.
//!
//! A process may hold only so many descriptors (20,000 here, not raisable), and every file a
//! user opens through the mount used to cost the daemon one. One user could thus make every
//! other user's open fail with EMFILE. Now:
//! - opens of the same kernel inode with the same access flags by the same caller (uid, gid,
//!   groups) share one descriptor (reads and writes are positional, so nothing else about a
//!   descriptor is per open);
//! - one uid may hold at most `per_user` descriptors (EMFILE past it), and all users together
//!   at most `total` (ENFILE past it): the rest of the process limit stays for the daemon
//!   itself (directory descriptors, change feed, control socket, search).

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::{Arc, Weak};

use dircache_core::{BackendFile, Cred};
use parking_lot::Mutex;

/// What makes two opens share a descriptor.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FdKey {
    pub nodeid: u64,
    /// The open(2) flags that matter for the daemon's I/O on the descriptor (see
    /// [`FdKey::new`]).
    pub flags: i32,
    pub cred: Cred,
}

/// The kernel's `__FMODE_EXEC` (an open for execve).
const FMODE_EXEC: i32 = 0o40;

impl FdKey {
    /// The key of an open of `nodeid` with open(2) `flags` by `cred`. Only the access mode,
    /// the synchronous-write flags, O_NOATIME and the exec mark tell descriptors apart: reads
    /// and writes are positional, appends are per write (RWF_APPEND), O_LARGEFILE, O_NONBLOCK
    /// and O_CLOEXEC change nothing for the daemon's I/O on a regular file.
    pub fn new(nodeid: u64, flags: i32, cred: Cred) -> FdKey {
        let keep = libc::O_ACCMODE | libc::O_SYNC | libc::O_DSYNC | libc::O_NOATIME | FMODE_EXEC;
        FdKey {
            nodeid,
            flags: flags & keep,
            cred,
        }
    }

    /// The key of a read-only open of `nodeid` by `uid`/`gid` made without the caller's
    /// supplementary groups because they could not decide it (`Backend::open_read_groupless`):
    /// shared by every caller with that uid and gid, whatever their groups, and never with
    /// an open made with groups (which was decided for those groups).
    pub fn groupless(nodeid: u64, flags: i32, uid: u32, gid: u32) -> FdKey {
        let mut k = FdKey::new(nodeid, flags, Cred::new(uid, gid, []));
        k.flags |= GROUPLESS;
        k
    }
}

/// [`FdKey::flags`] bit of a [`FdKey::groupless`] key (no open(2) flag).
const GROUPLESS: i32 = 1 << 30;

#[derive(Default)]
struct Inner {
    map: HashMap<FdKey, Weak<SharedFd>>,
    per_uid: HashMap<u32, usize>,
    total: usize,
}

/// A backend's open file held for one or more open handles; counted against its user until
/// dropped.
pub struct SharedFd {
    file: Box<dyn BackendFile>,
    uid: u32,
    key: Option<FdKey>,
    table: Weak<Mutex<Inner>>,
}

impl Deref for SharedFd {
    type Target = dyn BackendFile;
    fn deref(&self) -> &(dyn BackendFile + 'static) {
        &*self.file
    }
}

impl Drop for SharedFd {
    fn drop(&mut self) {
        let Some(t) = self.table.upgrade() else {
            return;
        };
        let mut t = t.lock();
        if let Some(k) = &self.key {
            // Only our own entry: a new descriptor may already stand for the same key.
            if t.map.get(k).is_some_and(|w| std::ptr::eq(w.as_ptr(), self)) {
                t.map.remove(k);
            }
        }
        if let Some(n) = t.per_uid.get_mut(&self.uid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                t.per_uid.remove(&self.uid);
            }
        }
        t.total = t.total.saturating_sub(1);
    }
}

/// The table of shared descriptors and the per-user counts.
pub struct OpenFds {
    inner: Arc<Mutex<Inner>>,
    per_user: usize,
    total: usize,
}

/// The process's descriptor limit (soft RLIMIT_NOFILE).
fn nofile_limit() -> usize {
    let l = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    l.current.map(|c| c as usize).unwrap_or(1 << 20)
}

impl OpenFds {
    /// Limits from the process's descriptor limit: a reserve of max(1024, limit/8) (at most
    /// half) for the daemon itself, the rest for open files, of which one uid gets
    /// `per_user` (0: half).
    pub fn new(per_user: usize) -> OpenFds {
        let lim = nofile_limit();
        let reserve = (lim / 8).max(1024).min(lim / 2);
        let total = lim - reserve;
        let per_user = if per_user == 0 {
            (total / 2).max(1)
        } else {
            per_user.min(total)
        };
        OpenFds {
            inner: Arc::default(),
            per_user,
            total,
        }
    }

    /// The live shared descriptor for `key`, if any.
    pub fn get(&self, key: &FdKey) -> Option<Arc<SharedFd>> {
        self.inner.lock().map.get(key).and_then(Weak::upgrade)
    }

    /// May `uid` make the daemon hold one more descriptor? Err(errno) if not: EMFILE past the
    /// user's share, ENFILE when all users' descriptors together reach the total. (Requests
    /// run on a few threads, so concurrent opens may pass the cap by at most that many.)
    pub fn admit(&self, uid: u32) -> Result<(), i32> {
        let t = self.inner.lock();
        if t.per_uid.get(&uid).copied().unwrap_or(0) >= self.per_user {
            return Err(libc::EMFILE);
        }
        if t.total >= self.total {
            return Err(libc::ENFILE);
        }
        Ok(())
    }

    /// Count `file` for `cred.uid`; with `key`, share it (when another thread stored one for
    /// the same key meanwhile, that one is returned and `file` is closed).
    pub fn insert(
        &self,
        key: Option<FdKey>,
        uid: u32,
        file: Box<dyn BackendFile>,
    ) -> Arc<SharedFd> {
        let mut t = self.inner.lock();
        if let Some(k) = &key {
            if let Some(s) = t.map.get(k).and_then(Weak::upgrade) {
                return s;
            }
        }
        *t.per_uid.entry(uid).or_default() += 1;
        t.total += 1;
        let s = Arc::new(SharedFd {
            file,
            uid,
            key: key.clone(),
            table: Arc::downgrade(&self.inner),
        });
        if let Some(k) = key {
            t.map.insert(k, Arc::downgrade(&s));
        }
        s
    }

    /// Descriptors held for `uid` now.
    #[cfg(test)]
    pub fn held_by(&self, uid: u32) -> usize {
        self.inner.lock().per_uid.get(&uid).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fd() -> Box<dyn BackendFile> {
        let fd = rustix::fs::open("/", rustix::fs::OFlags::PATH, rustix::fs::Mode::empty());
        Box::new(dircache_core::FdFile::new(fd.unwrap()))
    }

    #[test]
    fn shares_counts_and_caps() {
        let t = OpenFds {
            inner: Arc::default(),
            per_user: 2,
            total: 3,
        };
        let k = |n| FdKey::new(n, libc::O_RDONLY | libc::O_LARGEFILE, Cred::new(7, 7, []));
        let a = t.insert(Some(k(1)), 7, fd());
        assert!(Arc::ptr_eq(&t.get(&k(1)).unwrap(), &a));
        let a2 = t.insert(Some(k(1)), 7, fd());
        assert!(Arc::ptr_eq(&a, &a2));
        assert_eq!(t.held_by(7), 1);
        let b = t.insert(Some(k(2)), 7, fd());
        assert_eq!(t.admit(7), Err(libc::EMFILE));
        let c = t.insert(None, 8, fd());
        assert_eq!(t.admit(9), Err(libc::ENFILE));
        drop((a, a2, c));
        assert!(t.get(&k(1)).is_none());
        assert_eq!(t.held_by(7), 1);
        assert_eq!(t.admit(7), Ok(()));
        drop(b);
        assert_eq!(t.held_by(7), 0);
    }
}
