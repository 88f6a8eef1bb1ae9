//! The `fuser::Filesystem` over the core cache's node API.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crossbeam_channel::Sender;
use dircache_core::{
    Attr, Backend, BackendFile, Cache, Cred, Creds, Error as CoreError, FileType, Held, NodeKind,
    NodeRef, RenameMode, SetAttr, TimeSet, Timespec, XattrTarget,
};
use fuser::{
    AccessFlags, CopyFileRangeFlags, Errno, FileAttr, FileHandle, FopenFlags, Generation, INodeNo,
    InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use crate::creds::RequestGroups;
use crate::inodes::{Inodes, ROOT};
use crate::listings::{Listings, Snapshot, AFTER_DOTDOT};
use crate::notifier::NotifyMsg;
use crate::openfds::{FdKey, OpenFds, SharedFd};
use crate::policy::CachePolicy;
use crate::stats::{Op, RequestCounters, SOCKET_XATTR};
use crate::umask::with_caller_umask;

mod handles;
mod xattrs;

use handles::OpenFiles;

fn errno(e: CoreError) -> Errno {
    Errno::from_i32(e.errno())
}

fn to_system_time(t: Timespec) -> SystemTime {
    if t.sec >= 0 {
        UNIX_EPOCH + Duration::new(t.sec as u64, t.nsec)
    } else {
        UNIX_EPOCH - Duration::from_secs(t.sec.unsigned_abs()) + Duration::from_nanos(t.nsec as u64)
    }
}

fn from_system_time(t: SystemTime) -> Timespec {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timespec {
            sec: d.as_secs() as i64,
            nsec: d.subsec_nanos(),
        },
        Err(e) => {
            let d = e.duration();
            let mut sec = -(d.as_secs() as i64);
            let mut nsec = d.subsec_nanos();
            if nsec > 0 {
                sec -= 1;
                nsec = 1_000_000_000 - nsec;
            }
            Timespec { sec, nsec }
        }
    }
}

fn fuse_kind(k: FileType) -> fuser::FileType {
    match k {
        FileType::Regular => fuser::FileType::RegularFile,
        FileType::Directory => fuser::FileType::Directory,
        FileType::Symlink => fuser::FileType::Symlink,
        FileType::CharDevice => fuser::FileType::CharDevice,
        FileType::BlockDevice => fuser::FileType::BlockDevice,
        FileType::Fifo => fuser::FileType::NamedPipe,
        FileType::Socket => fuser::FileType::Socket,
    }
}

/// The kernel's view of `attr` with inode number `ino`. In entry replies `ino` must be the
/// nodeid (fuser sends one field as both); nodeids are derived from the backend's inode
/// numbers (see `inodes.rs`), so `stat` shows SRC's numbers, stable across FORGET and remount,
/// and hard links share one. Attribute replies use [`Inodes::st_ino`] (the root's differs).
pub fn fuse_attr(ino: u64, a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: a.size,
        blocks: a.blocks,
        atime: to_system_time(a.atime),
        mtime: to_system_time(a.mtime),
        ctime: to_system_time(a.ctime),
        crtime: UNIX_EPOCH,
        kind: fuse_kind(a.kind()),
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev as u32,
        blksize: if a.blksize == 0 { 4096 } else { a.blksize },
        flags: 0,
    }
}

pub use dircache_core::file::attr_of_fd;

fn negative_attr() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: fuser::FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

/// The FUSE file system: a front end over an `Arc<Cache>`.
pub struct DircacheFs {
    cache: Arc<Cache>,
    policy: CachePolicy,
    inodes: Arc<Inodes>,
    groups: RequestGroups,
    /// Open handles by file handle: looked up on every read and write (no global lock).
    files: OpenFiles,
    fds: OpenFds,
    next_fh: AtomicU64,
    listings: Listings,
    counters: Arc<RequestCounters>,
    notify: Sender<NotifyMsg>,
    passthrough: bool,
    socket_path: Option<PathBuf>,
    /// The mount is `noatime`: reads through it must not move the backend's atime.
    noatime: bool,
}

/// What the front end needs besides the cache.
pub struct FsParts {
    pub inodes: Arc<Inodes>,
    pub counters: Arc<RequestCounters>,
}

impl DircacheFs {
    /// A file system serving `cache`. `notify` feeds the notifier thread.
    pub fn new(
        cache: Arc<Cache>,
        policy: CachePolicy,
        notify: Sender<NotifyMsg>,
        socket_path: Option<PathBuf>,
    ) -> (DircacheFs, FsParts) {
        let inodes = Arc::new(Inodes::new(&cache));
        let counters = Arc::new(RequestCounters::default());
        let fds = OpenFds::new(policy.max_open_per_user);
        let fs = DircacheFs {
            cache,
            policy,
            inodes: inodes.clone(),
            groups: RequestGroups,
            files: OpenFiles::new(),
            fds,
            next_fh: AtomicU64::new(1),
            listings: Listings::new(),
            counters: counters.clone(),
            notify,
            passthrough: false,
            socket_path,
            noatime: false,
        };
        (fs, FsParts { inodes, counters })
    }

    /// The mount is `noatime` (reads through it leave the backend's atime alone).
    pub fn set_noatime(&mut self, on: bool) {
        self.noatime = on;
    }

    fn count(&self, op: Op) {
        self.counters.inc(op);
    }

    /// Credentials for lookups and reads: the kernel already checked permissions.
    fn read_creds(&self, req: &Request) -> Creds {
        self.cache
            .kernel_checked(Cred::new(req.uid(), req.gid(), []))
    }

    /// Credentials for mutations: with supplementary groups, so the backend creates and
    /// checks as the caller.
    fn creds(&self, req: &Request) -> Creds {
        self.cache
            .kernel_checked(self.groups.cred(req.pid(), req.uid(), req.gid()))
    }

    /// The held inode of a nodeid (ESTALE when the kernel's nodeid is unknown).
    fn held(&self, nodeid: INodeNo) -> Result<Held, Errno> {
        self.inodes.held(nodeid.0).ok_or(Errno::ESTALE)
    }

    /// The live dentry of a nodeid: the core finds it again when an outside change dropped
    /// the one the kernel knows ([`Cache::held_node`]).
    fn node(&self, nodeid: INodeNo) -> Result<NodeRef, Errno> {
        self.inodes
            .with_held(nodeid.0, |h| self.cache.held_node(h))
            .ok_or(Errno::ESTALE)?
            .map_err(errno)
    }

    /// Run `f` on the dentry of `id`, retried on a found-again or other name of the inode
    /// ([`Cache::on_held`]).
    fn with_node<T>(
        &self,
        id: INodeNo,
        f: impl Fn(&NodeRef) -> Result<T, CoreError>,
    ) -> Result<T, Errno> {
        self.cache.on_held(&self.held(id)?, f).map_err(errno)
    }

    /// How long the kernel may keep attributes of an inode: not at all while a writer has it
    /// open (a shared mapping of a passthrough file changes mtime/ctime without the FUSE
    /// inode seeing it), else the policy's TTL.
    fn attr_ttl_of(&self, writers: bool) -> Duration {
        if writers {
            Duration::ZERO
        } else {
            self.policy.attr_ttl
        }
    }

    /// `a` as an attribute reply (GETATTR, SETATTR, readdir's "." and "..") for `nodeid`.
    fn attr_for(&self, nodeid: u64, a: &Attr) -> FileAttr {
        fuse_attr(self.inodes.st_ino(nodeid), a)
    }

    fn entry_reply(&self, parent: INodeNo, node: &NodeRef, reply: ReplyEntry) {
        match self.cache.attr_of_name(node) {
            Ok(a) => {
                let id = self.inodes.register(&self.cache, node, &a, parent.0);
                let ttl = self.policy.entry_ttl;
                reply.entry_with_ttls(
                    &self.attr_ttl_of(self.inodes.has_writers(id)),
                    &ttl,
                    &fuse_attr(id, &a),
                    Generation(self.inodes.generation(id)),
                );
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    /// After a mutation through the mount: the core's attributes of these dentries (and the
    /// kernel's, via the notifier) must not be served stale.
    fn attrs_changed(&self, node: &NodeRef) {
        if let Some(h) = self.inodes.held_of(node) {
            self.cache.held_changed(&h);
        }
        self.cache.forget_attr(node);
    }

    fn dir_changed(&self, dir: &NodeRef) {
        self.cache.forget_attr(dir);
        // Listing streams keep their snapshots: they resume by cookie (listings.rs), and
        // every new stream (offset 0) fetches the directory as it is now.
    }

    /// The snapshot a READDIR(PLUS) of `ino` at `offset` on handle `fh` is served from.
    fn listing(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        plus: bool,
    ) -> Result<Arc<Snapshot>, Errno> {
        if let Some(s) = self.listings.resume(ino.0, fh.0, offset) {
            return Ok(s);
        }
        let ticket = self.listings.ticket();
        let dir = self.node(ino)?;
        let c = self.read_creds(req);
        let l = self.cache.readdir_node(&c, &dir, plus).map_err(errno)?;
        Ok(self.listings.store(ino.0, fh.0, ticket, l))
    }

    fn parent_nodeid(&self, node: &NodeRef) -> u64 {
        node.parent()
            .and_then(|p| self.inodes.nodeid_of(&p))
            .unwrap_or(ROOT)
    }

    fn rename_mode(flags: RenameFlags) -> Result<RenameMode, Errno> {
        // The kernel already refused invalid combinations (EXCHANGE with either other flag)
        // and checked CAP_MKNOD for a whiteout, in the caller's context.
        if flags.contains(RenameFlags::RENAME_WHITEOUT) {
            return Ok(if flags.contains(RenameFlags::RENAME_NOREPLACE) {
                RenameMode::WhiteoutNoReplace
            } else {
                RenameMode::Whiteout
            });
        }
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            Ok(RenameMode::Exchange)
        } else if flags.contains(RenameFlags::RENAME_NOREPLACE) {
            Ok(RenameMode::NoReplace)
        } else {
            Ok(RenameMode::Replace)
        }
    }

    fn child(&self, c: &Creds, dir: &NodeRef, name: &OsStr) -> Option<NodeRef> {
        match self.cache.lookup_child(c, dir, name.as_bytes()) {
            Ok(n) if matches!(n.kind(), NodeKind::Positive(_)) => Some(n),
            _ => None,
        }
    }

    /// The file behind `ino` opened by its backend with open(2) `flags`, which may be O_PATH
    /// (`Backend::open_verified`): verified to be the inode the kernel named (same
    /// `(dev, ino)` as when the nodeid was given out), ESTALE otherwise, after which the name
    /// is forgotten here and in the kernel as for an xattr call.
    fn open_verified(
        &self,
        ino: INodeNo,
        cred: &Cred,
        flags: i32,
    ) -> Result<Box<dyn BackendFile>, Errno> {
        let x = self.xattr_target(ino)?;
        if x.expect.is_none() {
            return Err(Errno::ESTALE);
        }
        x.backend
            .open_verified(cred, x.target(), flags)
            .map_err(|e| self.xattr_error(ino, &x, e))
    }

    /// A SETATTR that sets nothing but the change time (chown(f, -1, -1), and the like): the
    /// kernel sends no field for it without a writeback cache. As ext4 does, move the ctime:
    /// chown(-1, -1) as the caller on the verified inode.
    ///
    /// The kernel sends the same empty SETATTR when a write by another user must drop the
    /// set-user-ID/set-group-ID bits (file_remove_privs with FUSE_HANDLE_KILLPRIV). The
    /// backend's file drops them for a caller without CAP_FSETID if it may (the memory
    /// backend does: a write through a passthrough backing file never reaches it); a local
    /// file system refuses a non-owner's chown(-1, -1) of a set-id file (EPERM), and drops
    /// the bits itself when the data path writes as the caller: such a file is answered
    /// without a change (its ctime moves with the write), not with an error failing the
    /// write.
    fn touch_ctime(&self, req: &Request, ino: INodeNo, node: &NodeRef, reply: ReplyAttr) {
        let cred = self.groups.cred(req.pid(), req.uid(), req.gid());
        let f = match self.open_verified(ino, &cred, libc::O_PATH) {
            Ok(f) => f,
            Err(e) => return reply.error(e),
        };
        // Nothing set: chown(-1, -1) as the caller.
        match f.setattr(&cred, &SetAttr::default()) {
            Ok(a) => {
                self.attrs_changed(node);
                reply.attr(&self.policy.attr_ttl, &self.attr_for(ino.0, &a))
            }
            Err(e) => match f.attr() {
                Ok(a)
                    if a.mode & libc::S_ISUID != 0
                        || a.mode & (libc::S_ISGID | libc::S_IXGRP)
                            == (libc::S_ISGID | libc::S_IXGRP) =>
                {
                    reply.attr(&self.policy.attr_ttl, &self.attr_for(ino.0, &a))
                }
                _ => reply.error(errno(e)),
            },
        }
    }

    /// Queue a kernel invalidation of `nodeid`'s attributes (sent by the notifier thread).
    fn queue_inval_inode(&self, nodeid: u64) {
        let _ = self.notify.send(NotifyMsg::InvalInode(nodeid));
    }
}

fn time_set(t: Option<TimeOrNow>) -> Option<TimeSet> {
    t.map(|t| match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(s) => TimeSet::At(from_system_time(s)),
    })
}

impl fuser::Filesystem for DircacheFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let caps = config.capabilities();
        let p = &self.policy;
        // FUSE_DONT_MASK: the caller's umask comes with each creation; the backend's file
        // system applies it unless the parent has a default ACL (crate::umask).
        // No FUSE_EXPORT_SUPPORT, and FUSE_NO_EXPORT_SUPPORT: the kernel's file handles
        // name (nodeid, generation), and after the kernel forgot an inode (memory pressure,
        // drop_caches) or a remount, a path-based daemon cannot find a file from its inode
        // number, so open_by_handle_at would give ESTALE for files that still exist. Not
        // offered, name_to_handle_at fails cleanly with EOPNOTSUPP (fanotify's FID-only
        // handles still work).
        // No FUSE_ATOMIC_O_TRUNC: with it the daemon truncates in OPEN, before the kernel's
        // busy check, and open(running program, O_RDONLY|O_TRUNC) emptied the program before
        // failing with ETXTBSY. Without it the kernel checks, then sends SETATTR(size 0).
        let mut want = InitFlags::FUSE_NO_EXPORT_SUPPORT
            | InitFlags::FUSE_HANDLE_KILLPRIV
            | InitFlags::FUSE_DONT_MASK;
        if p.readdirplus {
            want |= InitFlags::FUSE_DO_READDIRPLUS;
        }
        if p.parallel_dirops {
            want |= InitFlags::FUSE_PARALLEL_DIROPS;
        }
        if p.cache_symlinks {
            want |= InitFlags::FUSE_CACHE_SYMLINKS;
        }
        if p.no_opendir {
            want |= InitFlags::FUSE_NO_OPENDIR_SUPPORT;
        }
        if p.posix_acl {
            want |= InitFlags::FUSE_POSIX_ACL;
        }
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        // Passthrough reads go to a backing file on SRC's own mount, whose atime rule (not
        // this mount's noatime) applies, and the kernel copies the user's open flags into it
        // (no O_NOATIME): on a noatime mount, reads go through the daemon's descriptors.
        if self.noatime && p.passthrough {
            tracing::info!("noatime: passthrough off, so that reads leave atimes alone");
        }
        if p.passthrough && !self.noatime && root && caps.contains(InitFlags::FUSE_PASSTHROUGH) {
            want |= InitFlags::FUSE_PASSTHROUGH;
            if config.set_max_stack_depth(2).is_ok() {
                self.passthrough = true;
            }
        }
        let missing = want & !caps;
        if !missing.is_empty() {
            tracing::info!("kernel lacks FUSE capabilities {missing:?}");
        }
        if let Err(e) = config.add_capabilities(want & caps) {
            tracing::warn!("could not enable {e:?}");
        }
        let _ = config.set_max_background(64);
        tracing::info!(
            "FUSE {:?}, passthrough {}, policy {:?}",
            config.kernel_abi(),
            self.passthrough,
            self.policy
        );
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.count(Op::lookup);
        let dir = match self.node(parent) {
            Ok(d) => d,
            Err(e) => return reply.error(e),
        };
        let c = self.read_creds(req);
        let r = match self.cache.lookup_child(&c, &dir, name.as_bytes()) {
            Err(CoreError::NotFound | CoreError::Stale) if dir.is_dead() => self
                .node(parent)
                .map(|d| self.cache.lookup_child(&c, &d, name.as_bytes()))
                .unwrap_or(Err(CoreError::Stale)),
            r => r,
        };
        let r = match r {
            Ok(n) => match n.kind() {
                NodeKind::Negative(e) => Err(e),
                NodeKind::Positive(_) => Ok(n),
            },
            Err(e) => Err(e),
        };
        match r {
            Ok(node) => self.entry_reply(parent, &node, reply),
            Err(CoreError::NotFound) if !self.policy.negative_ttl.is_zero() => {
                self.counters
                    .negative_lookups
                    .fetch_add(1, Ordering::Relaxed);
                reply.entry(&self.policy.negative_ttl, &negative_attr(), Generation(0));
            }
            Err(e) => {
                if e == CoreError::NotFound {
                    self.counters
                        .negative_lookups
                        .fetch_add(1, Ordering::Relaxed);
                }
                reply.error(errno(e))
            }
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.count(Op::forget);
        self.listings.forget_dir(ino.0);
        self.inodes.forget(&self.cache, ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        self.count(Op::getattr);
        if let Some(fh) = fh {
            if let Ok(of) = self.open_file(fh) {
                if let Ok(a) = of.fd.attr() {
                    let ttl = self.attr_ttl_of(self.inodes.has_writers(ino.0));
                    return reply.attr(&ttl, &self.attr_for(ino.0, &a));
                }
            }
        }
        let Some(held) = self.inodes.held(ino.0) else {
            return reply.error(Errno::ESTALE);
        };
        let ttl = self.attr_ttl_of(held.has_writers());
        // The core finds a dropped dentry again by the name the kernel knows, and asks the
        // backend when its copy of the attributes may be behind (the held-node contract).
        let node = self.cache.held_node(&held).unwrap_or_else(|_| held.node());
        match self.cache.attr_for_reply(&held, &node) {
            Ok(a) => reply.attr(&ttl, &self.attr_for(ino.0, &a)),
            Err(e) => {
                // An unlinked file that is still open: answer from its descriptor.
                match self.any_open(ino.0).map(|f| f.fd.attr()) {
                    Some(Ok(a)) => reply.attr(&ttl, &self.attr_for(ino.0, &a)),
                    _ => match held.dir_attr() {
                        // A removed directory the kernel still holds (an open descriptor, a
                        // cwd): as natively, its attributes with nlink 0.
                        Some(mut a) if node.is_dead() && e == CoreError::NotFound => {
                            a.nlink = 0;
                            reply.attr(&self.policy.attr_ttl, &self.attr_for(ino.0, &a))
                        }
                        _ => reply.error(errno(e)),
                    },
                }
            }
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.count(Op::setattr);
        let node = match self.node(ino) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        // A size change runs as the caller on the open file's descriptor (ftruncate), or on
        // the node's inode opened for writing as the caller (truncate, open with O_TRUNC),
        // never through a reopen by path as root: the backing file system then clears
        // set-id bits and checks access exactly as for that caller.
        if let Some(size) = size {
            let cred = self.groups.cred(req.pid(), req.uid(), req.gid());
            let of = fh.and_then(|fh| self.open_file(fh).ok());
            let r = match &of {
                Some(of) => Self::truncate_fd(&of.fd, &cred, size).map(|()| of.fd.clone()),
                // open(O_TRUNC) sends this without its handle: the caller's descriptor for
                // writing that open just made is found again without another open.
                None => {
                    let c = self.creds(req);
                    let rw = FdKey::new(ino.0, libc::O_RDWR, c.cred().clone());
                    match self.fds.get(&rw) {
                        Some(fd) => Ok(fd),
                        None => self.open_shared(&c, ino, libc::O_WRONLY | libc::O_NONBLOCK),
                    }
                    .and_then(|fd| Self::truncate_fd(&fd, &cred, size).map(|()| fd))
                }
            };
            let fd = match r {
                Ok(fd) => fd,
                Err(e) => return reply.error(e),
            };
            self.attrs_changed(&node);
            if mode.is_none()
                && uid.is_none()
                && gid.is_none()
                && atime.is_none()
                && mtime.is_none()
            {
                return match fd.attr() {
                    Ok(a) => reply.attr(&self.policy.attr_ttl, &self.attr_for(ino.0, &a)),
                    Err(e) => reply.error(errno(e)),
                };
            }
        }
        if mode.is_none()
            && uid.is_none()
            && gid.is_none()
            && size.is_none()
            && atime.is_none()
            && mtime.is_none()
        {
            return self.touch_ctime(req, ino, &node, reply);
        }
        let set = SetAttr {
            mode: mode.map(|m| m & 0o7777),
            uid,
            gid,
            size: None,
            atime: time_set(atime),
            mtime: time_set(mtime),
        };
        let c = self.creds(req);
        match self.with_node(ino, |n| self.cache.setattr_node(&c, n, &set)) {
            Ok(a) => {
                if a.nlink > 1 {
                    self.attrs_changed(&node);
                }
                reply.attr(&self.policy.attr_ttl, &self.attr_for(ino.0, &a))
            }
            Err(e) if e == Errno::ENOENT || e == Errno::ESTALE => {
                // fchmod/fchown/futimens of an open file whose name is gone: the kernel sends
                // no handle for those, but the inode is still open here.
                let Some(of) = self.any_open(ino.0) else {
                    return reply.error(e);
                };
                match Self::setattr_fd(&of.fd, c.cred(), &set) {
                    Ok(a) => {
                        self.attrs_changed(&node);
                        reply.attr(&self.policy.attr_ttl, &self.attr_for(ino.0, &a))
                    }
                    Err(e) => reply.error(e),
                }
            }
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.count(Op::readlink);
        match self
            .node(ino)
            .and_then(|n| self.cache.readlink_node(&n).map_err(errno))
        {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.count(Op::mknod);
        let dir = match self.node(parent) {
            Ok(d) => d,
            Err(e) => return reply.error(e),
        };
        let c = self.creds(req);
        match with_caller_umask(mode, umask, |mode| {
            self.cache
                .mknod_at(&c, &dir, name.as_bytes(), mode, u64::from(rdev))
        }) {
            Ok(n) => {
                self.dir_changed(&dir);
                self.entry_reply(parent, &n, reply)
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        self.count(Op::mkdir);
        let dir = match self.node(parent) {
            Ok(d) => d,
            Err(e) => return reply.error(e),
        };
        let c = self.creds(req);
        match with_caller_umask(mode & 0o7777, umask, |mode| {
            self.cache.mkdir_at(&c, &dir, name.as_bytes(), mode)
        }) {
            Ok(n) => {
                self.dir_changed(&dir);
                self.entry_reply(parent, &n, reply)
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.count(Op::unlink);
        let dir = match self.node(parent) {
            Ok(d) => d,
            Err(e) => return reply.error(e),
        };
        let c = self.creds(req);
        let victim = self.child(&c, &dir, name);
        match self.with_node(parent, |d| self.cache.unlink_at(&c, d, name.as_bytes())) {
            Ok(()) => {
                self.dir_changed(&dir);
                if let Some(v) = victim {
                    self.attrs_changed(&v);
                }
                reply.ok()
            }
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.count(Op::rmdir);
        let dir = match self.node(parent) {
            Ok(d) => d,
            Err(e) => return reply.error(e),
        };
        let c = self.creds(req);
        match self.with_node(parent, |d| self.cache.rmdir_at(&c, d, name.as_bytes())) {
            Ok(()) => {
                self.dir_changed(&dir);
                reply.ok()
            }
            Err(e) => reply.error(e),
        }
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.count(Op::symlink);
        let dir = match self.node(parent) {
            Ok(d) => d,
            Err(e) => return reply.error(e),
        };
        let c = self.creds(req);
        match self.cache.symlink_at(
            &c,
            &dir,
            link_name.as_bytes(),
            target.as_os_str().as_bytes(),
        ) {
            Ok(n) => {
                self.dir_changed(&dir);
                self.entry_reply(parent, &n, reply)
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.count(Op::rename);
        let mode = match Self::rename_mode(flags) {
            Ok(m) => m,
            Err(e) => return reply.error(e),
        };
        let (dir, newdir) = match (self.node(parent), self.node(newparent)) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => return reply.error(e),
        };
        let c = self.creds(req);
        let moved = self.child(&c, &dir, name);
        let victim = self.child(&c, &newdir, newname);
        let moved_id = moved.as_ref().and_then(|m| self.inodes.nodeid_of(m));
        let victim_id = victim.as_ref().and_then(|v| self.inodes.nodeid_of(v));
        match self
            .cache
            .rename_at(&c, &dir, name.as_bytes(), &newdir, newname.as_bytes(), mode)
        {
            Ok(()) => {
                self.dir_changed(&dir);
                self.dir_changed(&newdir);
                if let Some(v) = &victim {
                    self.attrs_changed(v);
                }
                if let Some(m) = &moved {
                    self.attrs_changed(m);
                }
                // Keep the kernel's nodeids pointing at live dentries after the move.
                if let (Some(id), Some(n)) = (moved_id, self.child(&c, &newdir, newname)) {
                    self.inodes.add_alias(id, &n, newparent.0);
                }
                if mode == RenameMode::Exchange {
                    if let (Some(id), Some(n)) = (victim_id, self.child(&c, &dir, name)) {
                        self.inodes.add_alias(id, &n, parent.0);
                    }
                }
                reply.ok()
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.count(Op::link);
        let (node, newdir) = match (self.node(ino), self.node(newparent)) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => return reply.error(e),
        };
        let c = self.creds(req);
        match self.cache.link_at(&c, &node, &newdir, newname.as_bytes()) {
            Ok(n) => {
                self.dir_changed(&newdir);
                self.attrs_changed(&node);
                // Fresh: the held inode was just marked changed.
                let a = match self.inodes.held(ino.0) {
                    Some(h) => self.cache.attr_for_reply(&h, &n),
                    None => self.cache.attr_of_name(&n),
                };
                match a {
                    Ok(a) => {
                        let id = self.inodes.register(&self.cache, &n, &a, newparent.0);
                        if id != ino.0 {
                            self.queue_inval_inode(ino.0);
                        }
                        reply.entry_with_ttls(
                            &self.policy.attr_ttl,
                            &self.policy.entry_ttl,
                            &fuse_attr(id, &a),
                            Generation(self.inodes.generation(id)),
                        )
                    }
                    Err(e) => reply.error(errno(e)),
                }
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.open_impl(req, ino, flags, reply)
    }

    fn read(
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
        self.read_impl(_req, _ino, fh, offset, size, _flags, _lock_owner, reply)
    }

    fn write(
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
        self.write_impl(
            req,
            _ino,
            fh,
            offset,
            data,
            write_flags,
            flags,
            _lock_owner,
            reply,
        )
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.count(Op::flush);
        // Data goes to the real file at once (passthrough or write on its descriptor) and no
        // locks are kept here, so there is nothing to flush: ENOSYS makes the kernel stop
        // sending FLUSH, saving one round trip on every close().
        reply.error(Errno::from_i32(libc::ENOSYS))
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.release_impl(_req, ino, fh, _flags, _lock_owner, _flush, reply)
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.fsync_impl(_req, _ino, fh, datasync, reply)
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.count(Op::opendir);
        if self.policy.no_opendir {
            // FUSE_NO_OPENDIR_SUPPORT: the kernel stops sending OPENDIR/RELEASEDIR and opens
            // every directory with CACHE_DIR | KEEP_CACHE.
            return reply.error(Errno::ENOSYS);
        }
        if let Err(e) = self.node(ino) {
            return reply.error(e);
        }
        let flags = if self.policy.cache_dir {
            FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE
        } else {
            FopenFlags::empty()
        };
        reply.opened(FileHandle(self.listings.open()), flags)
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        self.count(Op::readdir);
        let list = match self.listing(req, ino, fh, offset, false) {
            Ok(l) => l,
            Err(e) => return reply.error(e),
        };
        let dir = self.inodes.get(ino.0);
        let dev = dir
            .as_ref()
            .and_then(|d| self.cache.getattr(d).ok())
            .map(|a| a.dev)
            .unwrap_or(0);
        let mut off = offset;
        if off == 0 {
            if reply.add(
                INodeNo(self.inodes.st_ino(ino.0)),
                1,
                fuser::FileType::Directory,
                ".",
            ) {
                return reply.ok();
            }
            off = 1;
        }
        if off == 1 {
            let p = dir.as_ref().map(|d| self.parent_nodeid(d)).unwrap_or(ROOT);
            if reply.add(
                INodeNo(self.inodes.st_ino(p)),
                2,
                fuser::FileType::Directory,
                "..",
            ) {
                return reply.ok();
            }
            off = 2;
        }
        let start = list.resume_at(off.max(AFTER_DOTDOT));
        let mut finished = true;
        for (i, (cookie, e)) in list.entries().iter().enumerate().skip(start) {
            // getdents' d_ino: the entry's own number on the directory's device (for a mount
            // point, the covered directory's, as natively).
            let d_ino = self.inodes.ino_of(dev, e.ino);
            if list.ends_chunk_before(i, i > start)
                || reply.add(
                    INodeNo(d_ino.max(2)),
                    *cookie,
                    fuse_kind(e.kind),
                    OsStr::from_bytes(&e.name),
                )
            {
                finished = false;
                break;
            }
        }
        if finished {
            self.listings.finished(ino.0, fh.0, &list);
        }
        reply.ok()
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        self.count(Op::readdirplus);
        let list = match self.listing(req, ino, fh, offset, true) {
            Ok(l) => l,
            Err(e) => return reply.error(e),
        };
        let dir = match self.node(ino) {
            Ok(d) => d,
            Err(e) => return reply.error(e),
        };
        let ttl = self.policy.entry_ttl;
        let mut off = offset;
        if off < 2 {
            // "." and ".." are not linked by the kernel (no lookup count).
            let dattr = match self.cache.getattr(&dir) {
                Ok(a) => a,
                Err(e) => return reply.error(errno(e)),
            };
            // The kernel links neither "." nor "..": their attr.ino is only the d_ino shown.
            let dot = self.attr_for(ino.0, &dattr);
            if off == 0 && reply.add(ino, 1, ".", &ttl, &dot, Generation(0)) {
                return reply.ok();
            }
            let p = self.parent_nodeid(&dir);
            if reply.add(
                INodeNo(p),
                2,
                "..",
                &ttl,
                &self.attr_for(p, &dattr),
                Generation(0),
            ) {
                return reply.ok();
            }
            off = 2;
        }
        let c = self.read_creds(req);
        let start = list.resume_at(off.max(AFTER_DOTDOT));
        let mut finished = true;
        let mut added = false;
        for (i, (cookie, e)) in list.entries().iter().enumerate().skip(start) {
            if list.ends_chunk_before(i, added) {
                finished = false;
                break;
            }
            let Some(node) = self.child(&c, &dir, OsStr::from_bytes(&e.name)) else {
                continue;
            };
            let a = match e.attr {
                Some(a) if a.nlink <= 1 || a.is_dir() => a,
                _ => match self.cache.attr_of_name(&node) {
                    Ok(a) => a,
                    Err(_) => continue,
                },
            };
            let id = self.inodes.register(&self.cache, &node, &a, ino.0);
            if reply.add(
                INodeNo(id),
                *cookie,
                OsStr::from_bytes(&e.name),
                &ttl,
                &fuse_attr(id, &a),
                Generation(self.inodes.generation(id)),
            ) {
                self.inodes.forget(&self.cache, id, 1);
                finished = false;
                break;
            }
            added = true;
        }
        if finished {
            self.listings.finished(ino.0, fh.0, &list);
        }
        reply.ok()
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.count(Op::releasedir);
        self.listings.release(fh.0);
        reply.ok()
    }

    fn fsyncdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.count(Op::fsyncdir);
        let c = self.read_creds(req);
        let r = self.xattr_target(ino).and_then(|x| {
            x.backend
                .fsyncdir(c.cred(), x.target(), datasync)
                .map_err(|e| self.xattr_error(ino, &x, e))
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.count(Op::statfs);
        match self.cache.backend().statfs(b"") {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
            ),
            // What the kernel assumes of a FUSE file system that does not implement STATFS.
            Err(CoreError::NotSupported) => reply.statfs(0, 0, 0, 0, 0, 512, 255, 0),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        self.setxattr_impl(req, ino, name, value, flags, _position, reply)
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.getxattr_impl(req, ino, name, size, reply)
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.listxattr_impl(req, ino, size, reply)
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.removexattr_impl(req, ino, name, reply)
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // With default_permissions the kernel checks access itself; answer existence.
        self.count(Op::access);
        match self.node(ino) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        self.create_impl(req, parent, name, mode, umask, flags, reply)
    }

    /// The inode-flags ioctls (lsattr/chattr, xfs_io): FS_IOC_GETFLAGS/SETFLAGS and
    /// FS_IOC_FSGETXATTR/FSSETXATTR, run as the caller on the verified inode, so the backend's
    /// kernel decides (owner or CAP_FOWNER, CAP_LINUX_IMMUTABLE for `a`/`i`). Every other
    /// ioctl: ENOTTY, quietly (fuser's default logs a warning per call).
    fn ioctl(
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
        self.ioctl_impl(req, ino, fh, _flags, cmd, in_data, _out_size, reply)
    }

    fn fallocate(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.fallocate_impl(req, _ino, fh, offset, length, mode, reply)
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        self.lseek_impl(_req, _ino, fh, offset, whence, reply)
    }

    fn copy_file_range(
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
        self.copy_file_range_impl(
            req, _ino_in, fh_in, offset_in, _ino_out, fh_out, offset_out, len, _flags, reply,
        )
    }
}
