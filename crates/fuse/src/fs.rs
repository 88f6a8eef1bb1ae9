//! The `fuser::Filesystem` over the core cache's node API, in two layers (as mountpoint-s3's
//! `fuse.rs` over its `S3Filesystem`):
//!
//! - the adapter, [`DircacheFs`] (this file): each `fuser::Filesystem` method counts the
//!   operation ([`crate::stats`]), calls one method of the file-system layer, and turns its
//!   `Result<T, Errno>` into the reply (`T`: `EntryOut`, `AttrOut`, `Opened`, `Created`,
//!   `XattrOut`, data, a count). The `fuser::Reply*` types appear only here;
//! - the file-system layer, `CacheFs`: the front end's state (nodeids, open handles, listing
//!   streams) and one method per operation, by subject:
//!   - `fs/nodes.rs`: lookup, forget, getattr, setattr, readlink, mknod, mkdir, unlink,
//!     rmdir, symlink, rename, link, access, statfs, and the node helpers (nodeid to held
//!     node, entry replies, `attrs_changed`/`dir_changed` after a mutation);
//!   - `fs/dirs.rs`: opendir, readdir, readdirplus, releasedir, fsyncdir (listing streams,
//!     `listings.rs`);
//!   - `fs/handles.rs`: open files and passthrough: open, create, read, write, release,
//!     fsync, ioctl, fallocate, lseek, copy_file_range;
//!   - `fs/xattrs.rs`: the target of an xattr call and set/get/list/removexattr;
//!   - `fs/init.rs`: the FUSE capabilities negotiated at INIT.

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
    NodeRef, RenameMode, SetAttr, StatFs, TimeSet, Timespec, XattrTarget,
};
use fuser::{
    AccessFlags, BackingId, CopyFileRangeFlags, Errno, FileAttr, FileHandle, FopenFlags,
    Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags,
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry,
    ReplyIoctl, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
    WriteFlags,
};

use crate::creds::RequestGroups;
use crate::inodes::{Inodes, ROOT};
use crate::leases::LeaseWaits;
use crate::listings::{Listings, Snapshot, AFTER_DOTDOT};
use crate::notifier::NotifyMsg;
use crate::openfds::{FdKey, OpenFds, SharedFd};
use crate::policy::CachePolicy;
use crate::prefetch::Prefetcher;
use crate::stats::{Op, RequestCounters, SOCKET_XATTR};
use crate::umask::with_caller_umask;

mod dirs;
mod handles;
mod init;
mod nodes;
mod noopen;
mod own_writes;
mod served_root;
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

/// An ENTRY reply: a looked-up or new name's attributes, their lifetimes and generation.
struct EntryOut {
    /// The kernel's inode (`attr.ino` is what `stat` shows: `Inodes::st_ino`).
    nodeid: INodeNo,
    attr: FileAttr,
    attr_ttl: Duration,
    entry_ttl: Duration,
    generation: Generation,
}

/// An ATTR reply: attributes and how long the kernel may keep them.
struct AttrOut {
    attr: FileAttr,
    ttl: Duration,
}

/// An OPEN(DIR) or the open half of a CREATE reply: the handle, its open flags, and the
/// passthrough backing file registered for it.
struct Opened {
    fh: FileHandle,
    flags: FopenFlags,
    backing: Option<Arc<BackingId>>,
}

/// A CREATE reply: the new entry (one TTL for its name and attributes) and its open handle.
struct Created {
    nodeid: INodeNo,
    ttl: Duration,
    /// The attributes' TTL: one jiffy for a file open for writing (`handles.rs`).
    attr_ttl: Duration,
    attr: FileAttr,
    generation: Generation,
    opened: Opened,
}

/// A GETXATTR or LISTXATTR reply: the size the caller asked for, or the data.
enum XattrOut {
    Size(u32),
    Data(Vec<u8>),
}

/// The FUSE file system: the adapter ([`fuser::Filesystem`]) over the file-system layer.
pub struct DircacheFs {
    fs: Arc<CacheFs>,
    /// Opens waiting for a lease's break, off the request threads (`leases.rs`).
    leases: Arc<LeaseWaits>,
}

/// Who made a request (the kernel's record), kept for work finished after the request
/// method returned.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Caller {
    pub(crate) pid: u32,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
}

impl Caller {
    fn of(req: &Request) -> Caller {
        Caller {
            pid: req.pid(),
            uid: req.uid(),
            gid: req.gid(),
        }
    }
}

/// The file-system layer over an `Arc<Cache>`: one method per FUSE operation (in `nodes`,
/// `dirs`, `handles`, `xattrs`), each returning `Result<T, Errno>` for the adapter to reply.
struct CacheFs {
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
    /// `open=noopen`: handles of unlinked files the kernel may still have open, by nodeid
    /// (`fs/noopen.rs`).
    orphans: parking_lot::Mutex<HashMap<u64, u64>>,
    /// Lists subdirectories ahead of a walker (cold walks).
    prefetch: Prefetcher,
    /// Lean READDIRPLUS state (`lean.rs`).
    lean: Arc<crate::lean::Lean>,
    /// Listing directories on LOOKUPs (`lookahead.rs`).
    lookahead: crate::lookahead::Lookahead,
}

/// What the front end needs besides the cache.
pub struct FsParts {
    pub inodes: Arc<Inodes>,
    pub counters: Arc<RequestCounters>,
}

impl DircacheFs {
    /// The permission bits of the served root (0 when unknown): the mount's `rootmode`.
    pub(crate) fn root_perm(&self) -> u32 {
        let c = &self.fs.cache;
        c.getattr(&c.root()).map(|a| a.mode & 0o7777).unwrap_or(0)
    }

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
        let prefetch = Prefetcher::new(cache.clone(), policy.prefetch_threads, counters.clone());
        let lean = Arc::new(crate::lean::Lean::new(policy.lean && policy.readdirplus));
        prefetch.set_lean(lean.clone());
        prefetch.set_kernel_readers(policy.kernel_readers);
        let lookahead = crate::lookahead::Lookahead::new(policy.lookahead, policy.lookahead_levels);
        let fs = CacheFs {
            cache,
            policy,
            inodes: inodes.clone(),
            groups: RequestGroups::default(),
            files: OpenFiles::new(),
            fds,
            next_fh: AtomicU64::new(1),
            listings: Listings::new(),
            counters: counters.clone(),
            notify,
            passthrough: false,
            socket_path,
            noatime: false,
            orphans: Default::default(),
            prefetch,
            lean,
            lookahead,
        };
        (
            DircacheFs {
                fs: Arc::new(fs),
                leases: Arc::default(),
            },
            FsParts { inodes, counters },
        )
    }

    /// Serve SRC one directory below a synthetic FUSE root (`rootmount.rs`): before the
    /// kernel sends any request.
    pub fn serve_root_below(&mut self) {
        self.fs.inodes.serve_root_below();
    }

    /// The mount point, where lookahead (`lookahead.rs`) reads listed directories through
    /// the kernel.
    pub fn set_mountpoint(&self, mnt: std::path::PathBuf) {
        self.fs.prefetch.set_mountpoint(mnt);
    }

    /// The mount is `noatime` (reads through it leave the backend's atime alone).
    pub fn set_noatime(&mut self, on: bool) {
        match Arc::get_mut(&mut self.fs) {
            Some(fs) => fs.noatime = on,
            None => tracing::error!("noatime set after requests began: ignored"),
        }
    }

    /// Count a request and time it until the guard is dropped (the method's end).
    fn count(&self, op: Op) -> crate::stats::Timed<'_> {
        self.fs.counters.start(op)
    }
}

impl CacheFs {
    /// Credentials for lookups and reads: the kernel already checked permissions.
    fn read_creds(&self, req: &Request) -> Creds {
        self.cache
            .kernel_checked(Cred::new(req.uid(), req.gid(), []))
    }

    /// Credentials for mutations: with supplementary groups, so the backend creates and
    /// checks as the caller.
    fn creds(&self, req: &Request) -> Creds {
        self.creds_of(Caller::of(req))
    }

    /// [`CacheFs::creds`] of a request's caller, also after its `Request` is gone (an open
    /// a lease waiter repeats: the caller is still blocked in its syscall).
    fn creds_of(&self, c: Caller) -> Creds {
        self.cache
            .kernel_checked(self.groups.cred(c.pid, c.uid, c.gid))
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

fn reply_entry(r: Result<EntryOut, Errno>, reply: ReplyEntry) {
    match r {
        Ok(e) => reply.entry_nodeid(e.nodeid, &e.attr_ttl, &e.entry_ttl, &e.attr, e.generation),
        Err(e) => reply.error(e),
    }
}

fn reply_attr(r: Result<AttrOut, Errno>, reply: ReplyAttr) {
    match r {
        Ok(a) => reply.attr(&a.ttl, &a.attr),
        Err(e) => reply.error(e),
    }
}

fn reply_empty(r: Result<(), Errno>, reply: ReplyEmpty) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

fn reply_opened(r: Result<Opened, Errno>, reply: ReplyOpen) {
    match r {
        Ok(Opened {
            fh,
            flags,
            backing: Some(b),
        }) => reply.opened_passthrough(fh, flags, &b),
        Ok(o) => reply.opened(o.fh, o.flags),
        Err(e) => reply.error(e),
    }
}

fn reply_created(r: Result<Created, Errno>, reply: ReplyCreate) {
    match r {
        Ok(Created {
            nodeid,
            ttl,
            attr_ttl,
            attr,
            generation,
            opened: Opened { fh, flags, backing },
        }) => reply.created_nodeid_ttls(
            nodeid,
            &ttl,
            &attr_ttl,
            &attr,
            generation,
            fh,
            flags,
            backing.as_deref(),
        ),
        Err(e) => reply.error(e),
    }
}

fn reply_written(r: Result<u32, Errno>, reply: ReplyWrite) {
    match r {
        Ok(n) => reply.written(n),
        Err(e) => reply.error(e),
    }
}

fn reply_xattr(r: Result<XattrOut, Errno>, reply: ReplyXattr) {
    match r {
        Ok(XattrOut::Size(n)) => reply.size(n),
        Ok(XattrOut::Data(d)) => reply.data(&d),
        Err(e) => reply.error(e),
    }
}

impl fuser::Filesystem for DircacheFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // INIT comes before any other request: nothing shares the layer yet.
        match Arc::get_mut(&mut self.fs) {
            Some(fs) => fs.init(config),
            None => return Err(std::io::Error::from_raw_os_error(libc::EBUSY)),
        }
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        // The synthetic root's requests are the daemon's own (it attaches the served tree on
        // MNT while mounting): not counted with the kernel's requests for programs.
        if let Some(r) = self.fs.synthetic_lookup(parent, name) {
            return reply_entry(r, reply);
        }
        let _t = self.count(Op::lookup);
        self.fs.lean.looked_up(parent.0);
        reply_entry(self.fs.lookup(req, parent, name), reply)
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let _t = self.count(Op::forget);
        self.fs.forget(ino, nlookup)
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        if let Some(r) = self.fs.synthetic_getattr(ino) {
            return reply_attr(r, reply);
        }
        let _t = self.count(Op::getattr);
        reply_attr(self.fs.getattr(ino, fh), reply)
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
        let _t = self.count(Op::setattr);
        let set = SetAttr {
            mode: mode.map(|m| m & 0o7777),
            uid,
            gid,
            size,
            atime: time_set(atime),
            mtime: time_set(mtime),
        };
        reply_attr(self.fs.setattr(req, ino, set, fh), reply)
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let _t = self.count(Op::readlink);
        match self.fs.readlink(ino) {
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
        let _t = self.count(Op::mknod);
        reply_entry(self.fs.mknod(req, parent, name, mode, umask, rdev), reply)
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
        let _t = self.count(Op::mkdir);
        reply_entry(self.fs.mkdir(req, parent, name, mode, umask), reply)
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _t = self.count(Op::unlink);
        reply_empty(self.fs.unlink(req, parent, name), reply)
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _t = self.count(Op::rmdir);
        reply_empty(self.fs.rmdir(req, parent, name), reply)
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let _t = self.count(Op::symlink);
        reply_entry(self.fs.symlink(req, parent, link_name, target), reply)
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
        let _t = self.count(Op::rename);
        let r = self.fs.rename(req, parent, name, newparent, newname, flags);
        reply_empty(r, reply)
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let _t = self.count(Op::link);
        reply_entry(self.fs.link(req, ino, newparent, newname), reply)
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _t = self.count(Op::open);
        let who = Caller::of(req);
        // A lease's break is waited for on a lease waiter of the caller's uid, never here
        // (leases.rs; docs/security.md P12).
        let (r, deferred) = dircache_core::defer_lease_waits(|| {
            self.fs.open(who, ino, flags, |b| reply.open_backing(b))
        });
        if deferred && r.is_err() {
            let fs = self.fs.clone();
            self.leases.submit(
                who.uid,
                Box::new(move || {
                    let r = fs.open(who, ino, flags, |b| reply.open_backing(b));
                    reply_opened(r, reply)
                }),
            );
            return;
        }
        reply_opened(r, reply)
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let _t = self.count(Op::read);
        match self.fs.read(req, ino, fh, offset, size) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let _t = self.count(Op::write);
        reply_written(
            self.fs
                .write(req, ino, fh, offset, data, write_flags, flags),
            reply,
        )
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let _t = self.count(Op::flush);
        // A backend whose files keep writes locally (a remote mount's containers) stores
        // them back now, and close() gets its error. Not with open=noopen: its FLUSH has no
        // handle (fh 0) and its writes went to the backend at once (fs/noopen.rs).
        if self.fs.cache.backend().flush_on_close() && !self.fs.policy.no_open {
            return reply_empty(self.fs.flush(fh), reply);
        }
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
        let _t = self.count(Op::release);
        self.fs.release(ino, fh);
        reply.ok()
    }

    fn fsync(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _t = self.count(Op::fsync);
        reply_empty(self.fs.fsync(req, ino, fh, datasync), reply)
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _t = self.count(Op::opendir);
        reply_opened(self.fs.opendir(ino), reply)
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let _t = self.count(Op::readdir);
        let r = self.fs.readdir(req, ino, fh, offset, |e| {
            reply.add(e.ino, e.offset, e.kind, e.name)
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let _t = self.count(Op::readdirplus);
        let r = self.fs.readdirplus(req, ino, fh, offset, |e| {
            if e.unlinked {
                reply.add_unlinked(e.ino, e.offset, e.attr.kind, e.name)
            } else {
                reply.add_nodeid(e.ino, e.offset, e.name, &e.ttl, &e.attr, e.generation)
            }
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        let _t = self.count(Op::releasedir);
        self.fs.releasedir(fh);
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
        let _t = self.count(Op::fsyncdir);
        reply_empty(self.fs.fsyncdir(req, ino, datasync), reply)
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let _t = self.count(Op::statfs);
        match self.fs.statfs() {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
            ),
            Err(e) => reply.error(e),
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
        let _t = self.count(Op::setxattr);
        reply_empty(self.fs.setxattr(req, ino, name, value, flags), reply)
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let _t = self.count(Op::getxattr);
        reply_xattr(self.fs.getxattr(req, ino, name, size), reply)
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let _t = self.count(Op::listxattr);
        reply_xattr(self.fs.listxattr(req, ino, size), reply)
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _t = self.count(Op::removexattr);
        reply_empty(self.fs.removexattr(req, ino, name), reply)
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        let _t = self.count(Op::access);
        reply_empty(self.fs.access(ino), reply)
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
        let _t = self.count(Op::create);
        let who = Caller::of(req);
        // As for OPEN: an existing file's lease is waited for on a lease waiter.
        let (r, deferred) = dircache_core::defer_lease_waits(|| {
            self.fs.create(who, parent, name, mode, umask, flags, |b| {
                reply.open_backing(b)
            })
        });
        if deferred && r.is_err() {
            let fs = self.fs.clone();
            let name = name.to_os_string();
            self.leases.submit(
                who.uid,
                Box::new(move || {
                    let r = fs.create(who, parent, &name, mode, umask, flags, |b| {
                        reply.open_backing(b)
                    });
                    reply_created(r, reply)
                }),
            );
            return;
        }
        reply_created(r, reply)
    }

    /// The inode-flags ioctls (lsattr/chattr, xfs_io); every other ioctl: ENOTTY, quietly
    /// (fuser's default logs a warning per call).
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
        let _t = self.count(Op::other);
        match self.fs.ioctl(req, ino, fh, cmd, in_data) {
            Ok(d) => reply.ioctl(0, &d),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let _t = self.count(Op::fallocate);
        reply_empty(self.fs.fallocate(req, ino, fh, offset, length, mode), reply)
    }

    fn lseek(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let _t = self.count(Op::lseek);
        match self.fs.lseek(req, ino, fh, offset, whence) {
            Ok(o) => reply.offset(o),
            Err(e) => reply.error(e),
        }
    }

    fn copy_file_range(
        &self,
        req: &Request,
        ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let _t = self.count(Op::copy_file_range);
        let r = self.fs.copy_file_range(
            req,
            (ino_in, fh_in),
            offset_in,
            (ino_out, fh_out),
            offset_out,
            len,
        );
        reply_written(r, reply)
    }
}
