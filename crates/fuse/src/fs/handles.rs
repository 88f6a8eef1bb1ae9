//! Open files of the FUSE front end: handles, the daemon's shared descriptors (`openfds`),
//! passthrough backing files, and the operations on them (open, create, read, write,
//! release, fsync, ioctl, fallocate, lseek, copy_file_range), each returning
//! `Result<T, Errno>` for the adapter (`fs.rs`) to reply.

// create and write take what the `fuser::Filesystem` methods they serve take.
#![allow(clippy::too_many_arguments)]

use std::os::fd::{AsRawFd, BorrowedFd};

use dircache_core::Whence;
use parking_lot::{Mutex, MutexGuard, RwLock};

use super::*;

pub(super) struct OpenFile {
    /// The daemon's descriptor, shared by the same caller's opens of the inode with the same
    /// flags (see `openfds`).
    pub(super) fd: Arc<SharedFd>,
    pub(super) nodeid: u64,
    pub(super) node: NodeRef,
    pub(super) writable: bool,
    pub(super) backing: bool,
    /// A passthrough handle opened write-only: no mapping can write through it (mmap needs
    /// read access), and after every write through it (write(2), splice, copy_file_range,
    /// fallocate) the kernel marks its own size and times stale (`fuse_write_update_attr`),
    /// so the kernel's attributes need no invalidation at its open or release
    /// ([`CacheFs::writes_seen_by_kernel`]).
    pub(super) write_only: bool,
    /// The opener, for data the kernel sends on nobody's behalf (page cache writeback).
    pub(super) cred: Cred,
}

impl OpenFile {
    /// A handle of `node` (the kernel's `nodeid`) on `fd` for `cred`; `backing`: the kernel
    /// does its I/O through a passthrough backing file, else through the page cache.
    pub(super) fn new(
        fd: Arc<SharedFd>,
        nodeid: u64,
        node: NodeRef,
        writable: bool,
        backing: bool,
        cred: Cred,
    ) -> OpenFile {
        OpenFile {
            fd,
            nodeid,
            node,
            writable,
            backing,
            write_only: false,
            cred,
        }
    }

    /// This handle as opened with open(2) `flags`: see [`OpenFile::write_only`].
    pub(super) fn opened_with(mut self, flags: i32) -> OpenFile {
        self.write_only = self.backing && flags & libc::O_ACCMODE == libc::O_WRONLY;
        self
    }
}

pub(super) fn is_writable(flags: i32) -> bool {
    matches!(flags & libc::O_ACCMODE, libc::O_WRONLY | libc::O_RDWR) || flags & libc::O_TRUNC != 0
}

/// The open handles by file handle, in shards: a read or write looks its handle up under one
/// shard's read lock (no lock all requests share, and no writer but the open and release of a
/// handle of the same shard). A removed handle is dropped at once (its descriptor closed when
/// no request in flight holds it), not at some later reclamation.
pub(super) struct OpenFiles {
    shards: Box<[Shard]>,
    /// The kernel's io mode of each inode with open handles, by nodeid, in shards.
    modes: Box<[Mutex<HashMap<u64, IoModes>>]>,
}

type Shard = RwLock<HashMap<u64, Arc<OpenFile>>>;

const SHARDS: usize = 64;

/// The handles of one inode that put the kernel's inode in each of its io modes
/// (fs/fuse/iomode.c): while a passthrough handle is open the kernel refuses a cached open
/// of the inode, and while a cached one is open it refuses a passthrough open (both fail the
/// open(2) with EIO). Counted from the reply that makes a handle to its RELEASE; the kernel
/// leaves a mode when the file is closed, before it sends RELEASE, so these counts are
/// never below the kernel's and an open answered by them is always accepted.
#[derive(Default)]
pub(super) struct IoModes {
    pub(super) cached: u32,
    pub(super) passthrough: u32,
}

impl OpenFiles {
    pub(super) fn new() -> OpenFiles {
        OpenFiles {
            shards: (0..SHARDS).map(|_| RwLock::default()).collect(),
            modes: (0..SHARDS).map(|_| Mutex::default()).collect(),
        }
    }

    /// The io modes of `nodeid`, locked: an open decides its mode and counts it under it.
    pub(super) fn modes(&self, nodeid: u64) -> MutexGuard<'_, HashMap<u64, IoModes>> {
        self.modes[(nodeid % SHARDS as u64) as usize].lock()
    }

    /// A handle of `nodeid` in mode `passthrough` (or cached) was released.
    fn mode_closed(&self, nodeid: u64, passthrough: bool) {
        let mut g = self.modes(nodeid);
        if let Some(m) = g.get_mut(&nodeid) {
            let n = if passthrough {
                &mut m.passthrough
            } else {
                &mut m.cached
            };
            *n = n.saturating_sub(1);
            if m.cached == 0 && m.passthrough == 0 {
                g.remove(&nodeid);
            }
        }
    }

    fn shard(&self, fh: u64) -> &Shard {
        &self.shards[(fh % SHARDS as u64) as usize]
    }

    pub(super) fn get(&self, fh: u64) -> Option<Arc<OpenFile>> {
        self.shard(fh).read().get(&fh).cloned()
    }

    pub(super) fn insert(&self, fh: u64, of: Arc<OpenFile>) {
        self.shard(fh).write().insert(fh, of);
    }

    pub(super) fn remove(&self, fh: u64) -> Option<Arc<OpenFile>> {
        self.shard(fh).write().remove(&fh)
    }

    /// Some handle of `nodeid` (a scan of every shard).
    pub(super) fn find(&self, nodeid: u64) -> Option<Arc<OpenFile>> {
        self.shards
            .iter()
            .find_map(|s| s.read().values().find(|f| f.nodeid == nodeid).cloned())
    }
}

/// The daemon's descriptor of an open and the file's attributes when a new one was opened
/// (`CacheFs::open_shared_attr`).
type SharedOpen = (Arc<SharedFd>, Option<Attr>);

/// The file an ioctl runs on: an open handle's, or a directory the backend opened for it.
pub(super) enum IoctlFile {
    Open(Arc<SharedFd>),
    Dir(Box<dyn BackendFile>),
}

impl IoctlFile {
    pub(super) fn get(&self) -> &dyn BackendFile {
        match self {
            IoctlFile::Open(f) => &***f,
            IoctlFile::Dir(f) => &**f,
        }
    }
}

/// The attributes' TTL in the reply to a CREATE open for writing: 1 ns, which the kernel
/// rounds up to one jiffy (fs/fuse `fuse_time_to_jiffies`). The open that follows at once
/// (`may_open` checks the new inode's permissions) uses them; a `stat` a jiffy later asks the
/// daemon, as for any file open for writing whose writes the kernel may not see
/// (`attr_ttl_for`). A TTL of 0 would make that open send a GETATTR for every created file.
const CREATED_WRITABLE_ATTR_TTL: Duration = Duration::from_nanos(1);

impl CacheFs {
    /// On a `noatime` mount, make reads through the backend's open file (the daemon's own,
    /// and the kernel's passthrough reads) leave the atime alone. The file was opened as the
    /// caller, who may not own it (O_NOATIME at open would then be EPERM); F_SETFL runs as
    /// the daemon (CAP_FOWNER) and grants no access, only drops the atime update the mount
    /// option promises. A file without a local descriptor is the backend's business.
    pub(super) fn apply_noatime(&self, file: &dyn BackendFile) {
        let Some(fd) = file.fd().filter(|_| self.noatime) else {
            return;
        };
        let r = rustix::fs::fcntl_getfl(fd)
            .and_then(|fl| rustix::fs::fcntl_setfl(fd, fl | rustix::fs::OFlags::NOATIME));
        if let Err(e) = r {
            tracing::debug!("O_NOATIME: {e}");
        }
    }

    pub(super) fn open_file(&self, fh: FileHandle) -> Result<Arc<OpenFile>, Errno> {
        self.files.get(fh.0).ok_or(Errno::EBADF)
    }

    /// Some open handle of `nodeid` (for a file whose names are gone: its attributes and
    /// xattrs through the open file). A scan of the open handles, off the hit path.
    pub(super) fn any_open(&self, nodeid: u64) -> Option<Arc<OpenFile>> {
        self.files.find(nodeid)
    }

    pub(super) fn add_open(&self, of: OpenFile) -> u64 {
        let known = of.writable;
        self.add_open_known(of, known)
    }

    /// [`CacheFs::add_open`] of a handle whose inode the kernel may hold attributes of
    /// (`known`), or not: a nodeid given out by this very CREATE reply, whose attributes
    /// expire at once when writable (`create`), has nothing in the kernel to drop.
    fn add_open_known(&self, of: OpenFile, known: bool) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        if let Some(h) = self.inodes.held(of.nodeid) {
            self.cache.note_open(&h, of.writable);
        }
        if of.writable && !of.write_only {
            self.inodes.unseen_writer(of.nodeid, true);
        }
        if of.writable && known && !of.write_only {
            // Writes through a shared mapping of a passthrough file never reach the FUSE
            // inode: drop the kernel's attributes now, and give them no lifetime while the
            // file is open for writing (`attr_ttl_for`), so `stat` asks the backend.
            self.queue_inval_inode(of.nodeid);
        }
        self.files.insert(fh, Arc::new(of));
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

    /// Check that `file` is the real inode the kernel's `nodeid` stands for (the path may name
    /// another file since the kernel's lookup). ESTALE makes the kernel look the name up again.
    /// The file's attributes when the check read them.
    fn check_same_inode(&self, nodeid: u64, file: &dyn BackendFile) -> Result<Option<Attr>, Errno> {
        let Some(key) = self.inodes.key(nodeid) else {
            return Ok(None);
        };
        if key == (u64::MAX, u64::MAX) {
            return Ok(None);
        }
        let a = file.attr().map_err(errno)?;
        // The birth time too: a file made at the name since with the removed one's inode
        // number (ext4 reuses it at once) is another file.
        if (a.dev, a.ino) != key || !self.inodes.same_birth(nodeid, a.birth) {
            tracing::debug!("open of nodeid {nodeid}: the path names another inode now");
            return Err(Errno::ESTALE);
        }
        Ok(Some(a))
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
        self.open_shared_attr(c, ino, oflags).map(|(fd, _)| fd)
    }

    /// [`Self::open_shared`], with the file's attributes when a new descriptor was opened
    /// (read by the check that it is the kernel's inode: one `fstat` for both).
    fn open_shared_attr(&self, c: &Creds, ino: INodeNo, oflags: i32) -> Result<SharedOpen, Errno> {
        let key = FdKey::new(ino.0, oflags, c.cred().clone());
        if let Some(s) = self.fds.get(&key) {
            return Ok((s, None));
        }
        self.fds.admit(key.cred.uid).map_err(Errno::from_i32)?;
        // Through a name that still stands for the kernel's inode (see `with_node`).
        let attr = std::cell::Cell::new(None);
        let fd = self.with_node(ino, |n| {
            let fd = self.cache.open_node(c, n, oflags)?;
            match self.check_same_inode(ino.0, &*fd) {
                Ok(a) => {
                    attr.set(a);
                    Ok(fd)
                }
                Err(e) if e == Errno::ESTALE => Err(CoreError::Stale),
                Err(e) => Err(CoreError::Os(e.code())),
            }
        })?;
        let uid = key.cred.uid;
        Ok((self.fds.insert(Some(key), uid, fd), attr.into_inner()))
    }

    /// A read-only open of `ino` by `req`'s caller made without reading the caller's
    /// supplementary groups (`/proc/TID/status`, a fifth of the daemon's time per OPEN): when
    /// the cache's attributes say the caller owns the file, or it is root, the backend opens it
    /// without groups and keeps the open only if, on the real file and directory, the groups
    /// could not have decided it ([`dircache_core::Backend::open_read_groupless`]). `None`:
    /// open with the groups (also on any error, whose answer may depend on them).
    fn open_groupless(
        &self,
        req: Caller,
        ino: INodeNo,
        node: &NodeRef,
        oflags: i32,
    ) -> Option<(Creds, SharedOpen)> {
        if oflags & libc::O_ACCMODE != libc::O_RDONLY
            || oflags & libc::O_TRUNC != 0
            || !self.cache.node_backend(node).opens_groupless()
        {
            return None;
        }
        let (uid, gid) = (req.uid, req.gid);
        if uid != 0 && self.cache.getattr(node).ok()?.uid != uid {
            return None;
        }
        let c = self.cache.kernel_checked(Cred::new(uid, gid, []));
        let key = FdKey::groupless(ino.0, oflags, uid, gid);
        if let Some(s) = self.fds.get(&key) {
            self.counters
                .groupless_opens
                .fetch_add(1, Ordering::Relaxed);
            return Some((c, (s, None)));
        }
        self.fds.admit(uid).ok()?;
        let attr = std::cell::Cell::new(None);
        let fd = self
            .with_node(ino, |n| {
                let Some(fd) = self.cache.open_node_read_groupless(&c, n, oflags)? else {
                    return Ok(None);
                };
                match self.check_same_inode(ino.0, &*fd) {
                    Ok(a) => {
                        attr.set(a);
                        Ok(Some(fd))
                    }
                    Err(e) if e == Errno::ESTALE => Err(CoreError::Stale),
                    Err(e) => Err(CoreError::Os(e.code())),
                }
            })
            .ok()??;
        self.counters
            .groupless_opens
            .fetch_add(1, Ordering::Relaxed);
        Some((c, (self.fds.insert(Some(key), uid, fd), attr.into_inner())))
    }

    /// Register `file` as the passthrough backing file of `nodeid` (or share the inode's). The
    /// kernel keeps the registering thread's credentials for every read and write through it,
    /// by any opener: register as the caller, never with CAP_FSETID (`shared`), so that a write
    /// through it clears set-user-ID/set-group-ID bits as the backing file system decides.
    /// A backend file without a local descriptor cannot be a backing file (EOPNOTSUPP).
    pub(super) fn backing_for(
        &self,
        nodeid: u64,
        file: &SharedFd,
        cred: &Cred,
        register: impl FnOnce(BorrowedFd<'_>) -> std::io::Result<fuser::BackingId>,
    ) -> std::io::Result<Arc<fuser::BackingId>> {
        let fd = file
            .fd()
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::EOPNOTSUPP))?;
        self.inodes.acquire_backing(nodeid, || {
            let mut register = Some(register);
            let mut out = None;
            file.as_caller(cred, true, &mut || {
                if let Some(r) = register.take() {
                    out = Some(r(fd).map_err(CoreError::from)?);
                }
                Ok(())
            })
            .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?;
            out.ok_or_else(|| std::io::Error::from_raw_os_error(libc::EIO))
        })
    }

    /// Whether the kernel may believe `node` has set-user-ID/set-group-ID bits that a write
    /// by a caller without CAP_FSETID clears in the backing file system.
    pub(super) fn has_privs(&self, of: &OpenFile) -> bool {
        // The core's attributes (what the kernel was told), else the real file's now.
        self.cache
            .getattr(&of.node)
            .ok()
            .or_else(|| of.fd.attr().ok())
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

    /// chown, chmod and utimens of an open file, as `cred`.
    pub(super) fn setattr_fd(fd: &SharedFd, cred: &Cred, set: &SetAttr) -> Result<Attr, Errno> {
        fd.setattr(cred, set).map_err(errno)
    }

    /// Truncate the open file `fd` to `size` as `cred` (a read-only one as for
    /// open(O_RDONLY|O_TRUNC): see [`BackendFile::set_size`]).
    pub(super) fn truncate_fd(fd: &SharedFd, cred: &Cred, size: u64) -> Result<(), Errno> {
        fd.set_size(cred, size).map_err(errno)
    }

    pub(super) fn fopen_flags(&self) -> FopenFlags {
        if self.policy.keep_cache {
            FopenFlags::FOPEN_KEEP_CACHE
        } else {
            FopenFlags::empty()
        }
    }

    /// The file to run an inode-flags ioctl on, as `cred`: the handle the kernel opened for
    /// it (files), else (directories, which get no handle under FUSE_NO_OPENDIR_SUPPORT) the
    /// verified directory opened read-only by the backend.
    pub(super) fn ioctl_fd(
        &self,
        ino: INodeNo,
        fh: FileHandle,
        cred: &Cred,
    ) -> Result<IoctlFile, Errno> {
        if let Ok(of) = self.open_file(fh) {
            if of.nodeid == ino.0 {
                return Ok(IoctlFile::Open(of.fd.clone()));
            }
        }
        let node = self.node(ino)?;
        let dir = node.kind() == NodeKind::Positive(FileType::Directory);
        if !dir && self.policy.no_open {
            // No handle (fs/noopen.rs): as lsattr and chattr open it natively, read-only
            // as the caller.
            let flags = libc::O_RDONLY | libc::O_NONBLOCK;
            return self.open_verified(ino, cred, flags).map(IoctlFile::Dir);
        }
        if !dir {
            return Err(Errno::from_i32(libc::ENOTTY));
        }
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NONBLOCK;
        self.open_verified(ino, cred, flags).map(IoctlFile::Dir)
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

    /// OPEN of `ino` with open(2) `flags`. With passthrough, `register` makes the daemon's
    /// descriptor the kernel's backing file (the reply's `open_backing`).
    pub(super) fn open(
        &self,
        req: Caller,
        ino: INodeNo,
        flags: OpenFlags,
        register: impl FnOnce(BorrowedFd<'_>) -> std::io::Result<BackingId>,
    ) -> Result<Opened, Errno> {
        if self.policy.no_open {
            // The kernel opens files itself from now on (fs/noopen.rs).
            return Err(Errno::from_i32(libc::ENOSYS));
        }
        let node = self.node(ino)?;
        let oflags = Self::open_flags(flags.0);
        // Without reading the caller's groups when they cannot decide this open.
        let (c, (fd, checked), groupless) = match self.open_groupless(req, ino, &node, oflags) {
            Some((c, opened)) => (c, opened, true),
            None => {
                let c = self.creds_of(req);
                let opened = match self.open_shared_attr(&c, ino, oflags) {
                    // The core still has the name, the backend has not (removed outside, not
                    // yet reported): as for an xattr call (`xattr_error`), forget it and
                    // answer ESTALE so the kernel looks again (an open(O_CREAT) then creates,
                    // as natively). The same when the name holds another inode now (ESTALE),
                    // e.g. a FIFO renamed over it, which the kernel then opens itself.
                    Err(e) if (e == Errno::ENOENT || e == Errno::ESTALE) && !node.is_dead() => {
                        match self.cache.node_path(&node) {
                            Ok(path)
                                if Arc::ptr_eq(
                                    &self.cache.node_backend(&node),
                                    self.cache.backend(),
                                ) =>
                            {
                                self.forget_name(ino, &node, &path);
                                return Err(Errno::ESTALE);
                            }
                            _ => return Err(e),
                        }
                    }
                    r => r?,
                };
                (c, opened, false)
            }
        };
        // Before a passthrough backing file is made from it (it copies the flags).
        self.apply_noatime(&**fd);
        let writable = is_writable(flags.0);
        if flags.0 & libc::O_TRUNC != 0 {
            self.attrs_changed(&node);
        }
        let noflush = self.noflush(writable, &**fd);
        let cred = c.cred().clone();
        // The kernel sizes page-cache reads by the attributes it holds: a read-only open
        // through the page cache is right only if they are the file's now. When SRC changed
        // the file and the change feed has not told the kernel yet (a file written right after
        // its name was seen), this open reads past the kernel's copy (passthrough, or direct
        // I/O when the inode is open through the page cache already) and the kernel's copy is
        // dropped; later opens use the page cache again once the kernel has asked afresh.
        // (Asked where the choice is made: with passthrough, of a read-only open; a remote
        // file's `attr` may be a round trip.)
        let fa = (self.passthrough && !writable)
            .then(|| checked.or_else(|| fd.attr().ok()))
            .flatten();
        let current = fa.is_none_or(|a| self.inodes.told_is(ino.0, &a));
        if !current && fa.is_some_and(|a| a.kind() == FileType::Regular) {
            self.attrs_changed(&node);
            self.inodes.untold(ino.0);
            self.queue_inval_inode(ino.0);
        }
        if self.passthrough {
            let small_read = !writable
                && flags.0 & libc::O_DIRECT == 0
                && fa.is_some_and(|a| self.read_cached(&a));
            let mut modes = self.files.modes(ino.0);
            let m = modes.entry(ino.0).or_default();
            if m.cached == 0 && (m.passthrough > 0 || !small_read || !current) {
                // The backing file does the I/O of every later opener of the inode (writers
                // too) with the credentials it is registered with: the caller's whole ones.
                let whole = if groupless {
                    self.groups.cred(req.pid, req.uid, req.gid)
                } else {
                    cred.clone()
                };
                match self.backing_for(ino.0, &fd, &whole, register) {
                    Ok(b) => {
                        m.passthrough += 1;
                        drop(modes);
                        let own = self.own_writes_file(writable, &node, &fd);
                        let fh = self.add_open(
                            OpenFile::new(fd, ino.0, node, writable, true, whole)
                                .opened_with(flags.0),
                        );
                        self.own_writes_begin(req.pid, fh, own);
                        self.counters
                            .passthrough_opens
                            .fetch_add(1, Ordering::Relaxed);
                        return Ok(Opened {
                            fh: FileHandle(fh),
                            flags: noflush,
                            backing: Some(b),
                        });
                    }
                    Err(e) => tracing::debug!("passthrough open failed: {e}"),
                }
            }
            // Through the page cache: a small file read, or the inode is open so already.
            m.cached += 1;
        }
        let fh = self.add_open(OpenFile::new(fd, ino.0, node, writable, false, cred));
        Ok(Opened {
            fh: FileHandle(fh),
            flags: noflush
                | if current {
                    self.fopen_flags_for(flags.0)
                } else {
                    FopenFlags::FOPEN_DIRECT_IO
                },
            backing: None,
        })
    }

    /// FOPEN_NOFLUSH for a read-only handle of a backend that stores files back on close
    /// (a remote mount's containers): it has nothing to store, so its close(2) need not wait
    /// for a FLUSH. (The kernel's `no_flush`, set by the ENOSYS a local mount answers, is
    /// per connection: a writer's close must still reach such a backend.)
    fn noflush(&self, writable: bool, file: &dyn BackendFile) -> FopenFlags {
        if !writable && self.cache.backend().flush_on_close() && !file.writable() {
            FopenFlags::FOPEN_NOFLUSH
        } else {
            FopenFlags::empty()
        }
    }

    /// Whether a read-only open of a file with attributes `a` goes through the page cache
    /// rather than passthrough (`CachePolicy::cached_reads_max`): a regular file small
    /// enough, with pages kept across opens.
    fn read_cached(&self, a: &Attr) -> bool {
        let max = self.policy.cached_reads_max;
        self.policy.keep_cache && max > 0 && a.kind() == FileType::Regular && a.size <= max
    }

    pub(super) fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
    ) -> Result<Vec<u8>, Errno> {
        let of = self.io_file(req, ino, fh, false)?;
        let mut buf = vec![0u8; size as usize];
        let n = of.fd.read_at(&mut buf, offset).map_err(errno)?;
        self.io_done(&of);
        buf.truncate(n);
        Ok(buf)
    }

    /// WRITE of `data` at `offset` on handle `fh` (`flags`: the file's open flags now):
    /// the number of bytes written.
    pub(super) fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
    ) -> Result<u32, Errno> {
        let of = self.io_file(req, ino, fh, true)?;
        // A caller whose file appends (O_APPEND at open or set by fcntl) appends at the real
        // end, not at the offset the kernel computed from its cached size (a native append
        // meanwhile would be overwritten). Page cache writeback writes where it says.
        let append =
            flags.0 & libc::O_APPEND != 0 && !write_flags.contains(WriteFlags::FUSE_WRITE_CACHE);
        let privs = self.has_privs(&of);
        let cred = self.io_cred(req, &of);
        // As the caller: the backing file system clears set-id bits as for that user.
        let done = of.fd.write_at(&cred, data, offset, append).map_err(errno)?;
        self.io_done(&of);
        if privs {
            self.privs_maybe_killed(&of);
        } else if append {
            // The kernel put the data in its page cache at `offset` and takes offset + done
            // as the size: when the data went elsewhere, both are wrong.
            let at = of
                .fd
                .attr()
                .map(|a| a.size.wrapping_sub(done as u64))
                .unwrap_or(u64::MAX);
            if at != offset {
                self.cache.forget_attr(&of.node);
                self.queue_inval_inode(of.nodeid);
            }
        }
        Ok(done as u32)
    }

    pub(super) fn release(&self, ino: INodeNo, fh: FileHandle) {
        let of = self.files.remove(fh.0);
        if let Some(of) = of {
            // Reads moved the atime, writes (also through a mapping) mtime and ctime: the
            // next GETATTR or LOOKUP asks the backend. Forgotten before the handle stops
            // counting (`note_close` forgets every name's first too): a GETATTR racing this
            // RELEASE must not find the attributes cached before the writes.
            self.cache.forget_attr(&of.node);
            if let Some(h) = self.inodes.held(of.nodeid) {
                self.cache.note_close(&h, of.writable);
            }
            if of.writable && !of.write_only {
                self.inodes.unseen_writer(of.nodeid, false);
            }
            if of.writable && !self.writes_seen_by_kernel(&of) && !self.kernel_told_current(&of) {
                self.queue_inval_inode(of.nodeid);
            }
            if of.backing {
                if of.writable {
                    self.own_writes_end(fh.0);
                }
                self.inodes.release_backing(ino.0);
            }
            if self.passthrough {
                self.files.mode_closed(ino.0, of.backing);
            }
        }
    }

    /// Whether the attributes the kernel was last sent for `of`'s inode (size, mtime, ctime)
    /// are the file's now: then writes through a shared mapping (which never reach the FUSE
    /// inode) changed nothing the kernel shows, and the kernel's copy needs no invalidation
    /// at release. A create, write(2)s, then chmod/utimens (tar, cp -p): the last SETATTR
    /// reply told the final attributes.
    fn kernel_told_current(&self, of: &OpenFile) -> bool {
        of.fd
            .attr()
            .is_ok_and(|a| self.inodes.told_is(of.nodeid, &a))
    }

    /// Whether the kernel's attributes of `of`'s inode are right after `of`'s writes
    /// without an invalidation: a write-only passthrough handle (the kernel marked its size
    /// and times stale itself, and nothing was mapped), unless set-id bits are involved —
    /// the kernel was last told some, or the file has some: a write as a user without
    /// CAP_FSETID kills them in the backing file system, and the kernel (which leaves that
    /// to the daemon: FUSE_HANDLE_KILLPRIV_V2) would keep showing and honouring them.
    fn writes_seen_by_kernel(&self, of: &OpenFile) -> bool {
        of.write_only
            && !self.inodes.told_setid(of.nodeid)
            && of
                .fd
                .attr()
                .is_ok_and(|a| a.mode & (libc::S_ISUID | libc::S_ISGID) == 0)
    }

    /// FLUSH (close(2)) of handle `fh`: the backend's file stores what it keeps locally.
    pub(super) fn flush(&self, fh: FileHandle) -> Result<(), Errno> {
        match self.open_file(fh) {
            Ok(of) => of.fd.flush().map_err(errno),
            // Released already (a FLUSH racing nothing here): nothing to store.
            Err(_) => Ok(()),
        }
    }

    pub(super) fn fsync(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
    ) -> Result<(), Errno> {
        let of = self.io_file(req, ino, fh, false)?;
        of.fd.sync(datasync).map_err(errno)
    }

    /// CREATE of `name` in `parent`, opened with open(2) `flags`; `register` as for
    /// [`CacheFs::open`].
    pub(super) fn create(
        &self,
        req: Caller,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        register: impl FnOnce(BorrowedFd<'_>) -> std::io::Result<BackingId>,
    ) -> Result<Created, Errno> {
        if self.policy.no_open {
            // The kernel makes the file with MKNOD and opens it itself (fs/noopen.rs).
            return Err(Errno::from_i32(libc::ENOSYS));
        }
        let dir = self.dir_node(parent)?;
        let c = self.creds_of(req);
        let oflags = (flags & !(libc::O_APPEND | libc::O_DIRECT | libc::O_NOCTTY)) | libc::O_CREAT;
        // Within the caller's share of descriptors, checked before anything is created.
        self.fds.admit(req.uid).map_err(Errno::from_i32)?;
        let (node, fd) = with_caller_umask(mode & 0o7777, umask, |mode| {
            self.cache
                .create_at(&c, &dir, name.as_bytes(), mode, oflags)
        })
        .map_err(|e| Self::in_dir(&dir, errno(e)))?;
        self.dir_changed(&dir);
        self.apply_noatime(&*fd);
        let a = fd
            .attr()
            .or_else(|_| self.cache.attr_of_name(&node))
            .map_err(errno)?;
        let before = self.inodes.peek_key(a.dev, a.ino);
        let id = self.inodes.register(&self.cache, &node, &a, parent.0);
        // A nodeid the kernel holds already (another name of an existing file): its
        // attributes there are dropped when opened for writing (`add_open`). A new one is
        // first sent in this reply, with attributes that expire at once if writable: an
        // invalidation queued now would race the reply and find nothing (ENOENT).
        let known = before == Some(id);
        let attr = self.attr_for(id, &a);
        let writable = is_writable(flags);
        let cred = c.cred().clone();
        let key = FdKey::new(id, oflags, cred.clone());
        let fd = self.fds.insert(Some(key), cred.uid, fd);
        let created = |opened| Created {
            nodeid: INodeNo(id),
            ttl: self.policy.entry_ttl,
            // Called once the handle is counted: a write-only passthrough handle keeps the
            // policy's TTL (`attr_ttl_for`).
            attr_ttl: match self.attr_ttl_for(id, &a) {
                Duration::ZERO => CREATED_WRITABLE_ATTR_TTL,
                ttl => ttl,
            },
            attr,
            generation: Generation(self.inodes.generation(id)),
            opened,
        };
        if self.passthrough {
            let mut modes = self.files.modes(id);
            let m = modes.entry(id).or_default();
            if m.cached == 0 {
                match self.backing_for(id, &fd, &cred, register) {
                    Ok(b) => {
                        m.passthrough += 1;
                        drop(modes);
                        let own = self.own_writes_file(writable, &node, &fd);
                        let fh = self.add_open_known(
                            OpenFile::new(fd, id, node, writable, true, cred).opened_with(flags),
                            known,
                        );
                        self.own_writes_begin(req.pid, fh, own);
                        self.counters
                            .passthrough_opens
                            .fetch_add(1, Ordering::Relaxed);
                        return Ok(created(Opened {
                            fh: FileHandle(fh),
                            flags: FopenFlags::empty(),
                            backing: Some(b),
                        }));
                    }
                    Err(e) => tracing::debug!("passthrough create failed: {e}"),
                }
            }
            m.cached += 1;
        }
        let fh = self.add_open_known(OpenFile::new(fd, id, node, writable, false, cred), known);
        Ok(created(Opened {
            fh: FileHandle(fh),
            flags: self.fopen_flags_for(flags),
            backing: None,
        }))
    }

    /// The inode-flags ioctls (lsattr/chattr, xfs_io): FS_IOC_GETFLAGS/SETFLAGS and
    /// FS_IOC_FSGETXATTR/FSSETXATTR, run as the caller on the verified inode, so the backend's
    /// kernel decides (owner or CAP_FOWNER, CAP_LINUX_IMMUTABLE for `a`/`i`). Every other
    /// ioctl: ENOTTY. The data of the reply (empty for a set).
    pub(super) fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        cmd: u32,
        in_data: &[u8],
    ) -> Result<Vec<u8>, Errno> {
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
            _ => return Err(Errno::from_i32(libc::ENOTTY)),
        };
        let mut buf = [0u8; 28];
        if set {
            if in_data.len() < len {
                return Err(Errno::EINVAL);
            }
            buf[..len].copy_from_slice(&in_data[..len]);
        }
        let cred = self.groups.cred(req.pid(), req.uid(), req.gid());
        let file = self.ioctl_fd(ino, fh, &cred)?;
        let file = file.get();
        // Only a local descriptor has inode flags to ask about.
        let Some(fd) = file.fd() else {
            return Err(Errno::from_i32(libc::ENOTTY));
        };
        file.as_caller(&cred, false, &mut || {
            // SAFETY: ioctl on a live descriptor; each of these commands reads or writes at
            // most 28 bytes (an int, or a struct fsxattr) at the pointer, and buf has 28.
            let r = unsafe { libc::ioctl(fd.as_raw_fd(), cmd as libc::Ioctl, buf.as_mut_ptr()) };
            if r < 0 {
                Err(CoreError::from(std::io::Error::last_os_error()))
            } else {
                Ok(())
            }
        })
        .map_err(errno)?;
        if set {
            if let Some(n) = self.inodes.get(ino.0) {
                self.attrs_changed(&n);
            }
            self.queue_inval_inode(ino.0);
            Ok(Vec::new())
        } else {
            Ok(buf[..len].to_vec())
        }
    }

    pub(super) fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> Result<(), Errno> {
        let of = self.io_file(req, ino, fh, true)?;
        let privs = self.has_privs(&of);
        // As the caller: the backing file system clears set-id bits as for that user.
        of.fd
            .allocate(&self.io_cred(req, &of), mode, offset, length)
            .map_err(errno)?;
        self.cache.forget_attr(&of.node);
        if privs {
            self.privs_maybe_killed(&of);
        }
        Ok(())
    }

    pub(super) fn lseek(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
    ) -> Result<i64, Errno> {
        let of = self.io_file(req, ino, fh, false)?;
        // The daemon's own offset is never used for I/O: SEEK_DATA/SEEK_HOLE are what matter.
        Whence::from_raw(whence)
            .and_then(|w| of.fd.seek(offset, w))
            .map(|r| r as i64)
            .map_err(errno)
    }

    /// COPY_FILE_RANGE between two open handles: the number of bytes copied.
    pub(super) fn copy_file_range(
        &self,
        req: &Request,
        (ino_in, fh_in): (INodeNo, FileHandle),
        offset_in: u64,
        (ino_out, fh_out): (INodeNo, FileHandle),
        offset_out: u64,
        len: u64,
    ) -> Result<u32, Errno> {
        let (fin, fout) = match (
            self.io_file(req, ino_in, fh_in, false),
            self.io_file(req, ino_out, fh_out, true),
        ) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => return Err(e),
        };
        let privs = self.has_privs(&fout);
        // Written as the caller: the backing file system clears set-id bits as for that user.
        let cred = self.io_cred(req, &fout);
        let r = fin
            .fd
            .copy_to(&cred, offset_in, &**fout.fd, offset_out, len)
            .map_err(errno)?;
        self.cache.forget_attr(&fout.node);
        if privs {
            self.privs_maybe_killed(&fout);
        }
        Ok(r as u32)
    }
}
