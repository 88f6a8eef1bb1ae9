//! `-o open=noopen`: no OPEN or RELEASE round trips (FUSE_NO_OPEN_SUPPORT).
//!
//! The daemon answers the first OPEN with ENOSYS; the kernel then opens every file itself,
//! with FOPEN_KEEP_CACHE and file handle 0, and never sends OPEN, RELEASE (nor FLUSH, which
//! the daemon already declines) again. An open and close of a file whose pages and
//! attributes the kernel has costs no request at all. The first CREATE is answered ENOSYS
//! too: the kernel then makes new files with MKNOD and opens them itself (same number of
//! requests, and no handle whose RELEASE the kernel would still send before its first
//! OPEN, or never after it).
//!
//! What the daemon does instead (docs/opens.md has the trade-off and the numbers):
//! - **Access** is decided by the kernel at open (`default_permissions`, always on), from
//!   attributes and ACLs the change feed keeps coherent; the daemon has no second check by
//!   opening as the caller. A READ, WRITE, fallocate, copy_file_range or open(O_TRUNC)
//!   reaches the daemon only for a file the kernel opened with that access.
//! - **I/O**: each request opens the inode the kernel named for just that request
//!   (`Backend::open_verified`: the path resolved `O_PATH` beneath SRC, checked to be that
//!   `(dev, ino)` and birth time *before* it is opened, then reopened through `/proc/self/fd` as root,
//!   standing for the kernel's already-authorised open file: read-only for reads,
//!   write-only for writes; a backend without it: opened as root by path, then checked),
//!   and closes it when the request is done (no descriptor is held between requests, so nothing is kept busy: native
//!   exec, unmounts below SRC, close-to-open watchers). Writes, truncation and fallocate
//!   still run with the caller's fsuid, fsgid and groups and no capability (as in
//!   `-o open=rpc`): the backing file system kills set-id bits and charges blocks as for
//!   that user.
//! - **Unlinked open files**: before an UNLINK through the mount removes a regular file's
//!   last name, the daemon opens it (as root) and keeps that descriptor, as an orphan
//!   handle the kernel never sees, until the kernel forgets the inode (which it does only
//!   after the last close): reads, writes and fstat of the open file keep working.
//! - No passthrough: without OPEN there is no reply to carry a backing id (and a file
//!   CREATE opened with passthrough would make every other open of that inode fail with EIO
//!   while it stays open: fs/fuse/iomode.c), so file data goes through the kernel's page
//!   cache and the daemon.
//!
//! Not promised (docs/opens.md):
//! - a file removed or replaced in SRC (not through the mount) while it is open through the
//!   mount cannot be read or written through it any more once its pages leave the kernel's
//!   cache (ESTALE; with `open=rpc` the daemon's descriptor keeps it usable), and one
//!   removed in SRC within the change feed's delay before an open through the mount is
//!   opened by the kernel all the same, its I/O failing with ESTALE (`open=rpc`: the OPEN
//!   fails with ESTALE, the kernel looks the name up again and an O_CREAT creates);
//! - an O_APPEND write(2) crossing a page boundary goes through the page cache in two
//!   WRITEs (no handle to ask for direct I/O), each appended at the real end: an append
//!   made in SRC meanwhile can land between the two pieces (no byte is lost);
//! - the per-user cap on the daemon's descriptors has nothing to count (none are held
//!   between requests).

use super::*;
use handles::OpenFile;

impl CacheFs {
    /// Root's credentials: the daemon's per-request descriptor stands for the kernel's open
    /// file, whose access the kernel has checked.
    fn kernel_open_creds(&self) -> Creds {
        self.cache.kernel_checked(Cred::new(0, 0, []))
    }

    /// A descriptor of the very inode `ino` stands for, opened with `flags` as root: checked
    /// before it is opened where the backend can (`open_verified`), else opened by path and
    /// then checked (`open_shared`).
    fn open_kernels_inode(&self, ino: INodeNo, flags: i32) -> Result<Arc<SharedFd>, Errno> {
        let root = self.kernel_open_creds();
        match self.open_verified(ino, root.cred(), flags) {
            Ok(f) => Ok(self.fds.insert(None, 0, f)),
            Err(e) if e == Errno::ENOSYS => self.open_shared(&root, ino, flags),
            Err(e) => Err(e),
        }
    }

    /// The open file a data request with handle `fh` on `ino` uses: the handle's (`open=rpc`),
    /// else (`open=noopen`, handle 0) a descriptor of the inode opened for this request only
    /// (for writing when `write`), or the orphan handle of an unlinked file. The credentials
    /// kept with it are the requester's.
    pub(super) fn io_file(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        write: bool,
    ) -> Result<Arc<OpenFile>, Errno> {
        if !self.policy.no_open || fh.0 != 0 {
            return self.open_file(fh);
        }
        let flags = if write {
            libc::O_WRONLY | libc::O_NONBLOCK
        } else {
            libc::O_RDONLY | libc::O_NONBLOCK
        };
        let fd = match self.open_kernels_inode(ino, flags) {
            Ok(fd) => fd,
            // The name is gone (unlinked through the mount while open), or names another
            // file now: the descriptor kept at the unlink, if any.
            Err(e) => {
                if let Some(of) = self.any_open(ino.0) {
                    return Ok(of);
                }
                return Err(self.gone_outside(ino, e));
            }
        };
        if !write {
            self.apply_noatime(&**fd);
        }
        let node = self.node(ino)?;
        let cred = self.groups.cred(req.pid(), req.uid(), req.gid());
        Ok(Arc::new(OpenFile::new(fd, ino.0, node, write, false, cred)))
    }

    /// The error for I/O on `ino` whose backend file could not be opened (`e`): a name the
    /// core still has but the backend has not (removed outside, not yet reported by the
    /// feed) is forgotten here and in the kernel, as an OPEN would (`open=rpc`), so that the
    /// next open looks it up again; the I/O itself fails with ESTALE.
    fn gone_outside(&self, ino: INodeNo, e: Errno) -> Errno {
        let Ok(node) = self.node(ino) else {
            return e;
        };
        if e != Errno::ENOENT || node.is_dead() {
            return e;
        }
        match self.cache.node_path(&node) {
            Ok(path) if Arc::ptr_eq(&self.cache.node_backend(&node), self.cache.backend()) => {
                self.forget_name(ino, &node, &path);
                Errno::ESTALE
            }
            _ => e,
        }
    }

    /// After a read or write through a request's own descriptor (`open=noopen`): no close
    /// will tell the core, so its copy of the attributes (atime after a read; size, mtime,
    /// ctime after a write) is dropped now, and the kernel's next GETATTR asks the backend.
    pub(super) fn io_done(&self, of: &OpenFile) {
        if self.policy.no_open {
            self.cache.forget_attr(&of.node);
        }
    }

    /// `open=noopen`, before UNLINK of `name` in `dir`: when it is a regular file's last
    /// name and the kernel holds its inode (which may be open), keep a descriptor of it as
    /// an orphan handle until the kernel forgets the inode. Returns the nodeid kept.
    pub(super) fn keep_orphan(&self, c: &Creds, dir: &NodeRef, name: &OsStr) -> Option<u64> {
        if !self.policy.no_open {
            return None;
        }
        let victim = self.child(c, dir, name)?;
        let nodeid = self.inodes.nodeid_of(&victim)?;
        let a = self.cache.getattr(&victim).ok()?;
        if a.kind() != FileType::Regular || a.nlink != 1 {
            return None;
        }
        let root = self.kernel_open_creds();
        // Read-write if it may be written; a running program (ETXTBSY), an append-only or
        // immutable file, or a read-only file system: read-only.
        let fd = [libc::O_RDWR, libc::O_RDONLY].into_iter().find_map(|f| {
            self.open_kernels_inode(INodeNo(nodeid), f | libc::O_NONBLOCK)
                .ok()
        })?;
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let of = OpenFile::new(fd, nodeid, victim, true, false, root.cred().clone());
        self.files.insert(fh, Arc::new(of));
        if let Some(old) = self.orphans.lock().insert(nodeid, fh) {
            self.files.remove(old);
        }
        Some(nodeid)
    }

    /// Drop the orphan handle of `nodeid` (the kernel forgot the inode, or the unlink failed).
    pub(super) fn drop_orphan(&self, nodeid: u64) {
        if let Some(fh) = self.orphans.lock().remove(&nodeid) {
            self.files.remove(fh);
        }
    }
}
