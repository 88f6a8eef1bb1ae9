//! Open files of the FUSE front end: handles, the daemon's shared descriptors (`openfds`),
//! passthrough backing files, and the data operations on them.

// The `*_impl` methods take what the `fuser::Filesystem` methods they serve take.
#![allow(clippy::too_many_arguments)]

use super::*;

/// Switch this thread to `cred` for the data path (write, fallocate, truncate,
/// copy_file_range, setattr on a descriptor; `shared` for a passthrough registration, whose
/// credentials serve every opener): [`Caps::AdminOnly`]. Nothing changes when the daemon is
/// not root (it could not switch).
pub(super) fn as_caller(cred: &Cred, shared: bool) -> Result<ActAs, CoreError> {
    ActAs::when(
        dircache_local::creds::process_is_root(),
        cred,
        Caps::AdminOnly { shared },
    )
}

pub(super) struct OpenFile {
    /// The daemon's descriptor, shared by the same caller's opens of the inode with the same
    /// flags (see `openfds`).
    pub(super) fd: Arc<SharedFd>,
    pub(super) nodeid: u64,
    pub(super) node: NodeRef,
    pub(super) writable: bool,
    pub(super) backing: bool,
    /// The opener, for data the kernel sends on nobody's behalf (page cache writeback).
    pub(super) cred: Cred,
}

pub(super) fn is_writable(flags: i32) -> bool {
    matches!(flags & libc::O_ACCMODE, libc::O_WRONLY | libc::O_RDWR) || flags & libc::O_TRUNC != 0
}

impl DircacheFs {
    /// On a `noatime` mount, make reads through the backend descriptor `fd` (the daemon's
    /// own, and the kernel's passthrough reads) leave the atime alone. The descriptor was
    /// opened as the caller, who may not own the file (O_NOATIME at open would then be
    /// EPERM); F_SETFL runs as the daemon (CAP_FOWNER) and grants no access, only drops the
    /// atime update the mount option promises.
    pub(super) fn apply_noatime(&self, fd: &impl AsFd) {
        if !self.noatime {
            return;
        }
        let r = rustix::fs::fcntl_getfl(fd)
            .and_then(|fl| rustix::fs::fcntl_setfl(fd, fl | rustix::fs::OFlags::NOATIME));
        if let Err(e) = r {
            tracing::debug!("O_NOATIME: {e}");
        }
    }

    pub(super) fn open_file(&self, fh: FileHandle) -> Result<Arc<OpenFile>, Errno> {
        self.files.lock().get(&fh.0).cloned().ok_or(Errno::EBADF)
    }

    pub(super) fn add_open(&self, of: OpenFile) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        if of.writable {
            self.inodes.add_writer(of.nodeid, 1);
            // Writes through a shared mapping of a passthrough file never reach the FUSE
            // inode: drop the kernel's attributes now, and give them no lifetime while the
            // file is open for writing (`attr_ttl_of`), so `stat` asks the backend.
            self.queue_inval_inode(of.nodeid);
        }
        self.inodes.add_open(of.nodeid, 1);
        self.files.lock().insert(fh, Arc::new(of));
        fh
    }

    pub(super) fn open_flags(flags: i32) -> i32 {
        // The kernel handles O_CREAT/O_EXCL itself; offsets come with every request, so the
        // daemon's descriptor must not append (a write of a caller whose file appends is
        // made with RWF_APPEND instead, see `write`); O_DIRECT is the kernel file's business.
        flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY | libc::O_APPEND | libc::O_DIRECT)
    }

    /// The requester of a data operation on `of`: the caller in the request header, or the
    /// opener when the kernel sends it on nobody's behalf (pid 0: page cache writeback).
    pub(super) fn io_cred(&self, req: &Request, of: &OpenFile) -> Cred {
        if req.pid() == 0 {
            of.cred.clone()
        } else {
            self.groups.cred(req.pid(), req.uid(), req.gid())
        }
    }

    /// Check that `fd` is the real inode the kernel's `nodeid` stands for (the path may name
    /// another file since the kernel's lookup). ESTALE makes the kernel look the name up again.
    pub(super) fn check_same_inode(&self, nodeid: u64, fd: &OwnedFd) -> Result<(), Errno> {
        let Some((_, _, _, key)) = self.inodes.locate(nodeid) else {
            return Ok(());
        };
        if key == (u64::MAX, u64::MAX) {
            return Ok(());
        }
        let st = rustix::fs::statx(
            fd,
            c"",
            rustix::fs::AtFlags::EMPTY_PATH,
            rustix::fs::StatxFlags::INO,
        )
        .map_err(|e| Errno::from_i32(e.raw_os_error()))?;
        let dev = libc::makedev(st.stx_dev_major, st.stx_dev_minor);
        if (dev, st.stx_ino) != key {
            tracing::debug!("open of nodeid {nodeid}: the path names another inode now");
            return Err(Errno::ESTALE);
        }
        Ok(())
    }

    /// The daemon's descriptor for an open of `ino` with `oflags` by `c`: the one this caller
    /// already holds for the inode with the same flags, else a new one opened as the caller
    /// (within the caller's share of descriptors) and checked to be the kernel's inode.
    pub(super) fn open_shared(
        &self,
        c: &Creds,
        ino: INodeNo,
        oflags: i32,
    ) -> Result<Arc<SharedFd>, Errno> {
        let key = FdKey::new(ino.0, oflags, c.cred().clone());
        if let Some(s) = self.fds.get(&key) {
            return Ok(s);
        }
        self.fds.admit(key.cred.uid).map_err(Errno::from_i32)?;
        // Through a name that still stands for the kernel's inode (see `with_node`).
        let fd = self.with_node(ino, |n| {
            let fd = self.cache.open_node(c, n, oflags)?;
            match self.check_same_inode(ino.0, &fd) {
                Ok(()) => Ok(fd),
                Err(e) if e == Errno::ESTALE => Err(CoreError::Stale),
                Err(e) => Err(CoreError::Os(e.code())),
            }
        })?;
        let uid = key.cred.uid;
        Ok(self.fds.insert(Some(key), uid, fd, oflags))
    }

    /// Register `fd` as the passthrough backing file of `nodeid` (or share the inode's). The
    /// kernel keeps the registering thread's credentials for every read and write through it,
    /// by any opener: register as the caller, never with CAP_FSETID, so that a write through
    /// it clears set-user-ID/set-group-ID bits as the backing file system decides.
    pub(super) fn backing_for(
        &self,
        nodeid: u64,
        cred: &Cred,
        register: impl FnOnce() -> std::io::Result<fuser::BackingId>,
    ) -> std::io::Result<Arc<fuser::BackingId>> {
        self.inodes.acquire_backing(nodeid, || {
            let _g = as_caller(cred, true).map_err(std::io::Error::from)?;
            register()
        })
    }

    /// Whether the kernel may believe `node` has set-user-ID/set-group-ID bits that a write
    /// by a caller without CAP_FSETID clears in the backing file system.
    pub(super) fn has_privs(&self, of: &OpenFile) -> bool {
        // The core's attributes (what the kernel was told), else the real file's now.
        self.cache
            .getattr(&of.node)
            .ok()
            .or_else(|| attr_of_fd(&*of.fd).ok())
            .map(|a| a.mode & (libc::S_ISUID | libc::S_ISGID) != 0)
            .unwrap_or(true)
    }

    /// After a write-like call on a file that had set-id bits: the backing file system may
    /// have cleared them; the kernel must not keep the old mode (it decides exec and access
    /// with it).
    pub(super) fn privs_maybe_killed(&self, of: &OpenFile) {
        self.cache.forget_attr(&of.node);
        self.queue_inval_inode(of.nodeid);
    }

    /// chown, chmod and utimens of an open file through its descriptor, as `cred`.
    pub(super) fn setattr_fd(fd: &SharedFd, cred: &Cred, set: &SetAttr) -> Result<Attr, Errno> {
        let e = |e: rustix::io::Errno| Errno::from_i32(e.raw_os_error());
        {
            let _g = as_caller(cred, false).map_err(errno)?;
            if set.uid.is_some() || set.gid.is_some() {
                rustix::fs::fchown(
                    fd,
                    set.uid.map(rustix::fs::Uid::from_raw),
                    set.gid.map(rustix::fs::Gid::from_raw),
                )
                .map_err(e)?;
            }
            if let Some(m) = set.mode {
                rustix::fs::fchmod(fd, rustix::fs::Mode::from_raw_mode(m & 0o7777)).map_err(e)?;
            }
            if set.atime.is_some() || set.mtime.is_some() {
                let times = dircache_local::timestamps(set.atime, set.mtime);
                rustix::fs::futimens(fd, &times).map_err(e)?;
            }
        }
        attr_of_fd(fd).map_err(io_errno)
    }

    /// Truncate the file open as `of` to `size` as `cred`, through its descriptor (reopened
    /// for writing through /proc as the caller when the handle's descriptor is read-only, as
    /// for open(O_RDONLY|O_TRUNC)).
    pub(super) fn truncate_fd(fd: &SharedFd, cred: &Cred, size: u64) -> Result<(), Errno> {
        let _g = as_caller(cred, false).map_err(errno)?;
        let r = if fd.writable() {
            rustix::fs::ftruncate(fd, size)
        } else {
            let p = std::ffi::CString::new(format!("/proc/self/fd/{}", fd.as_fd().as_raw_fd()))
                .unwrap_or_default();
            rustix::fs::open(
                p.as_c_str(),
                rustix::fs::OFlags::WRONLY
                    | rustix::fs::OFlags::NONBLOCK
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .and_then(|w| rustix::fs::ftruncate(&w, size))
        };
        r.map_err(|e| Errno::from_i32(e.raw_os_error()))
    }

    pub(super) fn fopen_flags(&self) -> FopenFlags {
        if self.policy.keep_cache {
            FopenFlags::FOPEN_KEEP_CACHE
        } else {
            FopenFlags::empty()
        }
    }

    /// A descriptor to run an inode-flags ioctl on: the handle the kernel opened for it
    /// (files), else (directories, which get no handle under FUSE_NO_OPENDIR_SUPPORT) the
    /// verified directory reopened read-only.
    pub(super) fn ioctl_fd(&self, ino: INodeNo, fh: FileHandle) -> Result<OwnedFd, Errno> {
        if let Ok(of) = self.open_file(fh) {
            if of.nodeid == ino.0 {
                return of.fd.as_fd().try_clone_to_owned().map_err(io_errno);
            }
        }
        let node = self.node(ino)?;
        if node.kind() != NodeKind::Positive(FileType::Directory) {
            return Err(Errno::from_i32(libc::ENOTTY));
        }
        let key = self
            .inodes
            .locate(ino.0)
            .map(|l| l.3)
            .ok_or(Errno::ESTALE)?;
        let pfd = self.verified_path_fd(ino, &node)?;
        let dfd = rustix::fs::open(
            Self::proc_path(&pfd).as_c_str(),
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::NONBLOCK
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| Errno::from_i32(e.raw_os_error()))?;
        let st = rustix::fs::fstat(&dfd).map_err(|e| Errno::from_i32(e.raw_os_error()))?;
        if (st.st_dev, st.st_ino) != key {
            return Err(Errno::ESTALE);
        }
        Ok(dfd)
    }

    /// Open flags for a handle the daemon serves (no passthrough) of a file opened with
    /// open(2) `flags`. A caller that appends gets direct I/O: through the page cache the
    /// kernel splits a write at a page boundary into two WRITEs, and two appends could then
    /// land with another writer's data between them (a native O_APPEND write is one piece).
    pub(super) fn fopen_flags_for(&self, flags: i32) -> FopenFlags {
        if flags & libc::O_APPEND != 0 {
            FopenFlags::FOPEN_DIRECT_IO
        } else {
            self.fopen_flags()
        }
    }

    pub(super) fn open_impl(
        &self,
        req: &Request,
        ino: INodeNo,
        flags: OpenFlags,
        reply: ReplyOpen,
    ) {
        self.count(Op::open);
        let node = match self.node(ino) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let c = self.creds(req);
        let oflags = Self::open_flags(flags.0);
        let fd = match self.open_shared(&c, ino, oflags) {
            Ok(fd) => fd,
            Err(e) => return reply.error(e),
        };
        // Before a passthrough backing file is made from it (it copies the flags).
        self.apply_noatime(&fd);
        let writable = is_writable(flags.0);
        if flags.0 & libc::O_TRUNC != 0 {
            self.attrs_changed(&node);
        }
        let cred = c.cred().clone();
        if self.passthrough {
            match self.backing_for(ino.0, &cred, || reply.open_backing(&*fd)) {
                Ok(b) => {
                    let fh = self.add_open(OpenFile {
                        fd,
                        nodeid: ino.0,
                        node,
                        writable,
                        backing: true,
                        cred,
                    });
                    self.counters
                        .passthrough_opens
                        .fetch_add(1, Ordering::Relaxed);
                    return reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), &b);
                }
                Err(e) => tracing::debug!("passthrough open failed: {e}"),
            }
        }
        let fh = self.add_open(OpenFile {
            fd,
            nodeid: ino.0,
            node,
            writable,
            backing: false,
            cred,
        });
        reply.opened(FileHandle(fh), self.fopen_flags_for(flags.0))
    }

    pub(super) fn read_impl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.count(Op::read);
        let of = match self.open_file(fh) {
            Ok(f) => f,
            Err(e) => return reply.error(e),
        };
        let mut buf = vec![0u8; size as usize];
        let mut done = 0usize;
        while done < buf.len() {
            match rustix::io::pread(&*of.fd, &mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return reply.error(Errno::from_i32(e.raw_os_error())),
            }
        }
        reply.data(&buf[..done])
    }

    pub(super) fn write_impl(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.count(Op::write);
        let of = match self.open_file(fh) {
            Ok(f) => f,
            Err(e) => return reply.error(e),
        };
        // A caller whose file appends (O_APPEND at open or set by fcntl) appends at the real
        // end, not at the offset the kernel computed from its cached size (a native append
        // meanwhile would be overwritten). Page cache writeback writes where it says.
        let append =
            flags.0 & libc::O_APPEND != 0 && !write_flags.contains(WriteFlags::FUSE_WRITE_CACHE);
        let privs = self.has_privs(&of);
        let cred = self.io_cred(req, &of);
        let mut done = 0usize;
        {
            // As the caller: the backing file system clears set-id bits as for that user.
            let _g = match as_caller(&cred, false) {
                Ok(g) => g,
                Err(e) => return reply.error(errno(e)),
            };
            while done < data.len() {
                let r = if append {
                    rustix::io::pwritev2(
                        &*of.fd,
                        &[std::io::IoSlice::new(&data[done..])],
                        0,
                        rustix::io::ReadWriteFlags::APPEND,
                    )
                } else {
                    rustix::io::pwrite(&*of.fd, &data[done..], offset + done as u64)
                };
                match r {
                    Ok(n) => done += n,
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(e) => {
                        if done > 0 {
                            break;
                        }
                        return reply.error(Errno::from_i32(e.raw_os_error()));
                    }
                }
            }
        }
        if privs {
            self.privs_maybe_killed(&of);
        } else if append {
            // The kernel put the data in its page cache at `offset` and takes offset + done
            // as the size: when the data went elsewhere, both are wrong.
            let at = rustix::fs::fstat(&*of.fd)
                .map(|st| (st.st_size as u64).wrapping_sub(done as u64))
                .unwrap_or(u64::MAX);
            if at != offset {
                self.cache.forget_attr(&of.node);
                self.queue_inval_inode(of.nodeid);
            }
        }
        reply.written(done as u32)
    }

    pub(super) fn release_impl(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.count(Op::release);
        let of = self.files.lock().remove(&fh.0);
        if let Some(of) = of {
            // Reads moved the atime, writes (also through a mapping) mtime and ctime: the
            // next GETATTR or LOOKUP asks the backend.
            self.inodes.add_open(of.nodeid, -1);
            self.cache.forget_attr(&of.node);
            if of.writable {
                self.inodes.add_writer(of.nodeid, -1);
                self.queue_inval_inode(of.nodeid);
            }
            if of.backing {
                self.inodes.release_backing(ino.0);
            }
        }
        reply.ok()
    }

    pub(super) fn fsync_impl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.count(Op::fsync);
        let of = match self.open_file(fh) {
            Ok(f) => f,
            Err(e) => return reply.error(e),
        };
        let r = if datasync {
            rustix::fs::fdatasync(&*of.fd)
        } else {
            rustix::fs::fsync(&*of.fd)
        };
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(Errno::from_i32(e.raw_os_error())),
        }
    }

    pub(super) fn create_impl(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        self.count(Op::create);
        let dir = match self.node(parent) {
            Ok(d) => d,
            Err(e) => return reply.error(e),
        };
        let c = self.creds(req);
        let oflags = (flags & !(libc::O_APPEND | libc::O_DIRECT | libc::O_NOCTTY)) | libc::O_CREAT;
        // Within the caller's share of descriptors, checked before anything is created.
        if let Err(e) = self.fds.admit(req.uid()) {
            return reply.error(Errno::from_i32(e));
        }
        let (node, fd) = match with_caller_umask(mode & 0o7777, umask, |mode| {
            self.cache
                .create_at(&c, &dir, name.as_bytes(), mode, oflags)
        }) {
            Ok(x) => x,
            Err(e) => return reply.error(errno(e)),
        };
        self.dir_changed(&dir);
        self.apply_noatime(&fd);
        let a = match attr_of_fd(&fd)
            .map_err(io_errno)
            .or_else(|_| self.attr_of(&node, false).map_err(errno))
        {
            Ok(a) => a,
            Err(e) => return reply.error(e),
        };
        let id = self
            .inodes
            .register(&node, &a, parent.0, |n, k| self.names_key(n, k));
        let fattr = fuse_attr(id, &a);
        let writable = is_writable(flags);
        let cred = c.cred().clone();
        let key = FdKey::new(id, oflags, cred.clone());
        let fd = self.fds.insert(Some(key), cred.uid, fd, oflags);
        if self.passthrough {
            match self.backing_for(id, &cred, || reply.open_backing(&*fd)) {
                Ok(b) => {
                    let fh = self.add_open(OpenFile {
                        fd,
                        nodeid: id,
                        node,
                        writable,
                        backing: true,
                        cred,
                    });
                    self.counters
                        .passthrough_opens
                        .fetch_add(1, Ordering::Relaxed);
                    return reply.created_passthrough(
                        &self.policy.entry_ttl,
                        &fattr,
                        Generation(self.inodes.generation(id)),
                        FileHandle(fh),
                        FopenFlags::empty(),
                        &b,
                    );
                }
                Err(e) => tracing::debug!("passthrough create failed: {e}"),
            }
        }
        let fh = self.add_open(OpenFile {
            fd,
            nodeid: id,
            node,
            writable,
            backing: false,
            cred,
        });
        reply.created(
            &self.policy.entry_ttl,
            &fattr,
            Generation(self.inodes.generation(id)),
            FileHandle(fh),
            self.fopen_flags_for(flags),
        )
    }

    pub(super) fn ioctl_impl(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        self.count(Op::other);
        // The kernel's fileattr requests (fuse_priv_ioctl) carry these numbers.
        const GETFLAGS: u32 = 0x8008_6601;
        const SETFLAGS: u32 = 0x4008_6602;
        const FSGETXATTR: u32 = 0x801c_581f;
        const FSSETXATTR: u32 = 0x401c_5820;
        let (len, set) = match cmd {
            GETFLAGS => (4, false),
            SETFLAGS => (4, true),
            FSGETXATTR => (28, false),
            FSSETXATTR => (28, true),
            _ => return reply.error(Errno::from_i32(libc::ENOTTY)),
        };
        let mut buf = [0u8; 28];
        if set {
            if in_data.len() < len {
                return reply.error(Errno::EINVAL);
            }
            buf[..len].copy_from_slice(&in_data[..len]);
        }
        let fd = match self.ioctl_fd(ino, fh) {
            Ok(fd) => fd,
            Err(e) => return reply.error(e),
        };
        let cred = self.groups.cred(req.pid(), req.uid(), req.gid());
        let r = self.cache.backend().as_caller(&cred, &mut || {
            // SAFETY: ioctl on a live descriptor; each of these commands reads or writes at
            // most 28 bytes (an int, or a struct fsxattr) at the pointer, and buf has 28.
            let r = unsafe { libc::ioctl(fd.as_raw_fd(), cmd as libc::Ioctl, buf.as_mut_ptr()) };
            if r < 0 {
                Err(CoreError::from(std::io::Error::last_os_error()))
            } else {
                Ok(())
            }
        });
        if let Err(e) = r {
            return reply.error(errno(e));
        }
        if set {
            if let Some(n) = self.inodes.get(ino.0) {
                self.attrs_changed(&n);
            }
            self.queue_inval_inode(ino.0);
            reply.ioctl(0, &[])
        } else {
            reply.ioctl(0, &buf[..len])
        }
    }

    pub(super) fn fallocate_impl(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.count(Op::fallocate);
        let of = match self.open_file(fh) {
            Ok(f) => f,
            Err(e) => return reply.error(e),
        };
        let privs = self.has_privs(&of);
        let r = {
            // As the caller: the backing file system clears set-id bits as for that user.
            let _g = match as_caller(&self.io_cred(req, &of), false) {
                Ok(g) => g,
                Err(e) => return reply.error(errno(e)),
            };
            // SAFETY: fallocate on a valid descriptor with plain integer arguments.
            let r = unsafe {
                libc::fallocate(
                    of.fd.as_fd().as_raw_fd(),
                    mode,
                    offset as i64,
                    length as i64,
                )
            };
            if r < 0 {
                Err(last_errno())
            } else {
                Ok(())
            }
        };
        if let Err(e) = r {
            return reply.error(e);
        }
        self.cache.forget_attr(&of.node);
        if privs {
            self.privs_maybe_killed(&of);
        }
        reply.ok()
    }

    pub(super) fn lseek_impl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        self.count(Op::lseek);
        let of = match self.open_file(fh) {
            Ok(f) => f,
            Err(e) => return reply.error(e),
        };
        // SAFETY: lseek on a valid descriptor; the daemon's own offset is never used for I/O.
        let r = unsafe { libc::lseek(of.fd.as_fd().as_raw_fd(), offset, whence) };
        if r < 0 {
            return reply.error(last_errno());
        }
        reply.offset(r)
    }

    pub(super) fn copy_file_range_impl(
        &self,
        req: &Request,
        _ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        _ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        self.count(Op::copy_file_range);
        let (fin, fout) = match (self.open_file(fh_in), self.open_file(fh_out)) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => return reply.error(e),
        };
        let mut oin = offset_in as i64;
        let mut oout = offset_out as i64;
        let privs = self.has_privs(&fout);
        let r = {
            // As the caller: the backing file system clears set-id bits as for that user.
            let _g = match as_caller(&self.io_cred(req, &fout), false) {
                Ok(g) => g,
                Err(e) => return reply.error(errno(e)),
            };
            // SAFETY: valid descriptors and pointers to local offsets.
            let r = unsafe {
                libc::copy_file_range(
                    fin.fd.as_fd().as_raw_fd(),
                    &mut oin,
                    fout.fd.as_fd().as_raw_fd(),
                    &mut oout,
                    len.min(u32::MAX as u64) as usize,
                    0,
                )
            };
            if r < 0 {
                Err(last_errno())
            } else {
                Ok(r)
            }
        };
        let r = match r {
            Ok(r) => r,
            Err(e) => return reply.error(e),
        };
        self.cache.forget_attr(&fout.node);
        if privs {
            self.privs_maybe_killed(&fout);
        }
        reply.written(r as u32)
    }
}
