//! The `fuser::Filesystem` over the core cache's node API.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crossbeam_channel::Sender;
use dircache_core::{
    Attr, Backend, Cache, Cred, Creds, DirEntry, Error as CoreError, FileType, NodeKind, NodeRef,
    RenameMode, SetAttr, TimeSet, Timespec, XattrTarget,
};
use fuser::{
    AccessFlags, CopyFileRangeFlags, Errno, FileAttr, FileHandle, FopenFlags, Generation, INodeNo,
    InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;

use crate::creds::RequestGroups;
use crate::inodes::{Inodes, Key, ROOT};
use crate::notifier::NotifyMsg;
use crate::openfds::{FdKey, OpenFds, SharedFd};
use crate::policy::CachePolicy;
use crate::stats::{Op, RequestCounters, SOCKET_XATTR};
use crate::umask::with_caller_umask;
use dircache_local::creds::{ActAs, Caps};

fn errno(e: CoreError) -> Errno {
    Errno::from_i32(e.errno())
}

/// Switch this thread to `cred` for the data path (write, fallocate, truncate,
/// copy_file_range, setattr on a descriptor; `shared` for a passthrough registration, whose
/// credentials serve every opener): [`Caps::AdminOnly`]. Nothing changes when the daemon is
/// not root (it could not switch).
fn as_caller(cred: &Cred, shared: bool) -> Result<ActAs, CoreError> {
    ActAs::when(
        dircache_local::creds::process_is_root(),
        cred,
        Caps::AdminOnly { shared },
    )
}

fn io_errno(e: std::io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

fn last_errno() -> Errno {
    io_errno(std::io::Error::last_os_error())
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

/// Attributes of an open descriptor (fstat).
pub fn attr_of_fd(fd: impl AsFd) -> std::io::Result<Attr> {
    let st = rustix::fs::fstat(fd)?;
    Ok(Attr {
        ino: st.st_ino,
        dev: st.st_dev,
        mode: st.st_mode,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: st.st_rdev,
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        blksize: st.st_blksize as u32,
        atime: Timespec {
            sec: st.st_atime,
            nsec: st.st_atime_nsec as u32,
        },
        mtime: Timespec {
            sec: st.st_mtime,
            nsec: st.st_mtime_nsec as u32,
        },
        ctime: Timespec {
            sec: st.st_ctime,
            nsec: st.st_ctime_nsec as u32,
        },
    })
}

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

/// The node of an xattr call, the backend of its file system, its path there and the
/// (dev, ino) the kernel's node is.
struct XattrCall {
    node: NodeRef,
    backend: Arc<dyn Backend>,
    path: Vec<u8>,
    expect: Option<(u64, u64)>,
    /// An open descriptor of the inode, for a file whose names are all gone.
    open: Option<Arc<SharedFd>>,
}

impl XattrCall {
    fn target(&self) -> XattrTarget<'_> {
        XattrTarget {
            path: &self.path,
            expect: self.expect,
            open: self.open.as_ref().map(|f| f.as_fd()),
        }
    }
}

struct OpenFile {
    /// The daemon's descriptor, shared by the same caller's opens of the inode with the same
    /// flags (see `openfds`).
    fd: Arc<SharedFd>,
    nodeid: u64,
    node: NodeRef,
    writable: bool,
    backing: bool,
    /// The opener, for data the kernel sends on nobody's behalf (page cache writeback).
    cred: Cred,
}

/// The FUSE file system: a front end over an `Arc<Cache>`.
pub struct DircacheFs {
    cache: Arc<Cache>,
    policy: CachePolicy,
    src: PathBuf,
    src_fd: Option<OwnedFd>,
    inodes: Arc<Inodes>,
    groups: RequestGroups,
    files: Mutex<HashMap<u64, Arc<OpenFile>>>,
    fds: OpenFds,
    next_fh: AtomicU64,
    listings: Mutex<HashMap<u64, Arc<Vec<DirEntry>>>>,
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
    /// A file system serving `cache` (whose backend is rooted at `src`, used for xattrs and
    /// statfs; empty when the backend is not a local directory). `notify` feeds the notifier
    /// thread.
    pub fn new(
        cache: Arc<Cache>,
        policy: CachePolicy,
        src: &Path,
        notify: Sender<NotifyMsg>,
        socket_path: Option<PathBuf>,
    ) -> (DircacheFs, FsParts) {
        let root = cache.root();
        let root_attr = cache.getattr(&root).ok();
        let inodes = Arc::new(Inodes::new(root, root_attr.as_ref()));
        let counters = Arc::new(RequestCounters::default());
        let src_fd = rustix::fs::open(
            src,
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .ok();
        let fds = OpenFds::new(policy.max_open_per_user);
        let fs = DircacheFs {
            cache,
            policy,
            src: src.to_path_buf(),
            src_fd,
            inodes: inodes.clone(),
            groups: RequestGroups,
            files: Mutex::new(HashMap::new()),
            fds,
            next_fh: AtomicU64::new(1),
            listings: Mutex::new(HashMap::new()),
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

    /// On a `noatime` mount, make reads through the backend descriptor `fd` (the daemon's
    /// own, and the kernel's passthrough reads) leave the atime alone. The descriptor was
    /// opened as the caller, who may not own the file (O_NOATIME at open would then be
    /// EPERM); F_SETFL runs as the daemon (CAP_FOWNER) and grants no access, only drops the
    /// atime update the mount option promises.
    fn apply_noatime(&self, fd: &impl AsFd) {
        if !self.noatime {
            return;
        }
        let r = rustix::fs::fcntl_getfl(fd)
            .and_then(|fl| rustix::fs::fcntl_setfl(fd, fl | rustix::fs::OFlags::NOATIME));
        if let Err(e) = r {
            tracing::debug!("O_NOATIME: {e}");
        }
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

    /// The live dentry of a nodeid. When the core dropped the dentry the kernel knows (a
    /// change learned from the feed invalidated it, or it was evicted before the kernel's
    /// reference pinned it), find the name again from the parent and rebind the nodeid if it
    /// is still the same inode.
    fn node(&self, nodeid: INodeNo) -> Result<NodeRef, Errno> {
        self.node_depth(nodeid.0, 0)
    }

    /// Run `f` on the dentry of `id`; if it failed because the notifier thread invalidated
    /// that dentry meanwhile, find it again and retry once.
    fn with_node<T>(
        &self,
        id: INodeNo,
        f: impl Fn(&NodeRef) -> Result<T, CoreError>,
    ) -> Result<T, Errno> {
        let n = self.node(id)?;
        let (n, r) = match f(&n) {
            Err(CoreError::NotFound | CoreError::Stale) if n.is_dead() => {
                let n = self.node(id)?;
                let r = f(&n);
                (n, r)
            }
            r => (n, r),
        };
        match r {
            Err(e @ (CoreError::NotFound | CoreError::Stale)) => {
                self.with_other_alias(id, &n, f).ok_or_else(|| errno(e))
            }
            r => r.map_err(errno),
        }
    }

    /// Whether dentry `node` still names inode `key` in the backend (the core may not have
    /// heard yet that the name was removed or replaced in SRC). Only an identity check of the
    /// name (lstat as the daemon): nothing is served from it.
    fn names_key(&self, node: &NodeRef, key: Key) -> bool {
        if node.is_dead() {
            return false;
        }
        let mut names = vec![node.name()];
        let Some(mut p) = node.parent() else {
            return false;
        };
        while let Some(pp) = p.parent() {
            if p.is_dead() {
                return false;
            }
            names.push(p.name());
            p = pp;
        }
        if p.is_dead() {
            return false;
        }
        let name = names.remove(0);
        names.reverse();
        let dir = names.join(&b'/');
        match self.cache.backend().lookup(&dir, &name) {
            Ok(a) => (a.dev, a.ino) == key,
            Err(_) => false,
        }
    }

    /// Run `f` on another name of `id` after it failed with ENOENT or ESTALE on the preferred
    /// one: a hard link removed or replaced in SRC stays in the core until the change feed
    /// reports it, and the file must still be reachable through its remaining names. The
    /// name that worked is preferred from then on.
    fn with_other_alias<T>(
        &self,
        id: INodeNo,
        tried: &NodeRef,
        f: impl Fn(&NodeRef) -> Result<T, CoreError>,
    ) -> Option<T> {
        for a in self.inodes.aliases(id.0) {
            if Arc::ptr_eq(&a, tried) || a.is_dead() {
                continue;
            }
            if let Ok(v) = f(&a) {
                self.inodes.prefer(id.0, &a);
                return Some(v);
            }
        }
        None
    }

    fn node_depth(&self, id: u64, depth: u32) -> Result<NodeRef, Errno> {
        let (n, parent, name, key) = self.inodes.locate(id).ok_or(Errno::ESTALE)?;
        if !n.is_dead() && !n.is_evicted() {
            return Ok(n);
        }
        if id == ROOT {
            let r = self.cache.root();
            self.inodes.add_alias(ROOT, &r, 0);
            return Ok(r);
        }
        if depth > 4096 || parent == 0 {
            return Ok(n);
        }
        let p = self.node_depth(parent, depth + 1)?;
        let c = self.cache.kernel_checked(Cred::root());
        match self.cache.lookup_child(&c, &p, &name) {
            Ok(fresh) if matches!(fresh.kind(), NodeKind::Positive(_)) => {
                match self.cache.getattr(&fresh) {
                    Ok(a) if (a.dev, a.ino) == key => {
                        self.inodes.add_alias(id, &fresh, parent);
                        Ok(fresh)
                    }
                    _ => Ok(n),
                }
            }
            _ => Ok(n),
        }
    }

    /// Attributes of `fd`, a descriptor the backend's `open` gave: the backend's answer when
    /// it has one (a memory backend's descriptor is not of the inode it stands for), else
    /// fstat's.
    fn fd_attr(&self, fd: impl AsFd) -> std::io::Result<Attr> {
        match self.cache.backend().fstat(fd.as_fd()) {
            Err(CoreError::NotSupported) => attr_of_fd(fd),
            r => r.map_err(std::io::Error::from),
        }
    }

    fn open_file(&self, fh: FileHandle) -> Result<Arc<OpenFile>, Errno> {
        self.files.lock().get(&fh.0).cloned().ok_or(Errno::EBADF)
    }

    /// Attributes for a reply: fresh from the backend when they may have changed through
    /// another name or an open writer.
    fn attr_of(&self, node: &NodeRef, force_fresh: bool) -> Result<Attr, CoreError> {
        if force_fresh {
            self.cache.forget_attr(node);
        }
        let a = self.cache.getattr(node)?;
        // Hard-linked files: another name may have changed nlink/ctime behind this dentry.
        if !force_fresh && a.nlink > 1 && !a.is_dir() {
            self.cache.forget_attr(node);
            return self.cache.getattr(node);
        }
        Ok(a)
    }

    /// How long the kernel may keep attributes of an inode with `writers` open writable
    /// handles: not at all while there are some (a shared mapping of a passthrough file
    /// changes mtime/ctime without the FUSE inode seeing it), else the policy's TTL.
    fn attr_ttl_of(&self, writers: u32) -> Duration {
        if writers > 0 {
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
        match self.attr_of(node, false) {
            Ok(a) => {
                let id = self
                    .inodes
                    .register(node, &a, parent.0, |n, k| self.names_key(n, k));
                let ttl = self.policy.entry_ttl;
                let writers = self.inodes.info(id).map(|i| i.writers).unwrap_or(0);
                reply.entry_with_ttls(
                    &self.attr_ttl_of(writers),
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
        self.inodes.clear_acl_absent();
        for a in self.inodes.mark_stale_dentry(node) {
            self.cache.forget_attr(&a);
        }
        self.cache.forget_attr(node);
    }

    fn dir_changed(&self, dir: &NodeRef) {
        self.inodes.clear_acl_absent();
        self.cache.forget_attr(dir);
        if let Some(id) = self.inodes.nodeid_of(dir) {
            self.listings.lock().remove(&id);
        }
    }

    fn listing(
        &self,
        req: &Request,
        ino: INodeNo,
        offset: u64,
        plus: bool,
    ) -> Result<Arc<Vec<DirEntry>>, Errno> {
        if offset > 0 {
            if let Some(l) = self.listings.lock().get(&ino.0) {
                return Ok(l.clone());
            }
        }
        let dir = self.node(ino)?;
        let c = self.read_creds(req);
        let l = Arc::new(self.cache.readdir_node(&c, &dir, plus).map_err(errno)?);
        self.listings.lock().insert(ino.0, l.clone());
        Ok(l)
    }

    fn parent_nodeid(&self, node: &NodeRef) -> u64 {
        node.parent()
            .and_then(|p| self.inodes.nodeid_of(&p))
            .unwrap_or(ROOT)
    }

    fn real_path_fd(&self, node: &NodeRef) -> Result<OwnedFd, Errno> {
        let dirfd = self.src_fd.as_ref().ok_or(Errno::EIO)?;
        let p = self.cache.node_path(node).map_err(errno)?;
        let p: &[u8] = if p.is_empty() { b"." } else { &p };
        dircache_local::open_beneath(
            dirfd.as_fd(),
            p,
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::CLOEXEC,
        )
        .map_err(|e| Errno::from_i32(e.raw_os_error()))
    }

    /// What an xattr call on `ino` is about: the node, its backend path, and the (dev, ino)
    /// of the inode the kernel's node stands for. The backend acts on that inode only, with
    /// the caller's rights: a path renamed over from outside since the kernel's lookup gives
    /// ESTALE (the kernel then looks the name up again), never another user's file.
    fn xattr_target(&self, ino: INodeNo) -> Result<XattrCall, Errno> {
        let node = self.node(ino)?;
        let expect = self.inodes.locate(ino.0).map(|l| l.3);
        if node.is_dead() {
            // A file unlinked while open: its open descriptor names it, as natively.
            let open = self
                .files
                .lock()
                .values()
                .find(|f| f.nodeid == ino.0)
                .map(|f| f.fd.clone());
            if let Some(open) = open {
                let backend = self.cache.node_backend(&node);
                return Ok(XattrCall {
                    node,
                    backend,
                    path: Vec::new(),
                    expect,
                    open: Some(open),
                });
            }
            // Its name is gone or names another inode (node() found no live alias): the
            // kernel looks the name up again on ESTALE.
            return Err(Errno::ESTALE);
        }
        let path = self.cache.node_path(&node).map_err(errno)?;
        let backend = self.cache.node_backend(&node);
        Ok(XattrCall {
            node,
            backend,
            path,
            expect,
            open: None,
        })
    }

    /// The errno for a failed xattr call. ESTALE means the node's path names another inode
    /// now (renamed over from outside, the change not yet applied): forget that name here
    /// and in the kernel first, so that the kernel's retry (it looks the name up again on
    /// ESTALE) finds the file that is there now, as a native call would.
    fn xattr_error(&self, ino: INodeNo, x: &XattrCall, e: CoreError) -> Errno {
        if e == CoreError::Stale && Arc::ptr_eq(&x.backend, self.cache.backend()) {
            let parent = self.parent_nodeid(&x.node);
            let invals = self.cache.invalidate(&x.path);
            self.inodes.clear_acl_absent();
            let mut msgs = vec![
                NotifyMsg::InvalEntry(parent, x.node.name()),
                NotifyMsg::InvalInode(parent),
                NotifyMsg::InvalInode(ino.0),
            ];
            for inv in invals {
                if let Some(p) = inv.parent.as_ref().and_then(|p| self.inodes.nodeid_of(p)) {
                    msgs.push(NotifyMsg::InvalEntry(p, inv.name));
                }
                if let Some(n) = inv.node.as_ref().and_then(|n| self.inodes.nodeid_of(n)) {
                    msgs.push(NotifyMsg::InvalInode(n));
                }
            }
            for m in msgs {
                let _ = self.notify.send(m);
            }
        }
        errno(e)
    }

    fn proc_path(fd: &OwnedFd) -> std::ffi::CString {
        // A decimal number never contains NUL.
        std::ffi::CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap_or_default()
    }

    fn xattr_blocked(&self, name: &OsStr) -> bool {
        !self.policy.security_xattrs && name.as_bytes().starts_with(b"security.")
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

    fn add_open(&self, of: OpenFile) -> u64 {
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

    fn open_flags(flags: i32) -> i32 {
        // The kernel handles O_CREAT/O_EXCL itself; offsets come with every request, so the
        // daemon's descriptor must not append (a write of a caller whose file appends is
        // made with RWF_APPEND instead, see `write`); O_DIRECT is the kernel file's business.
        flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY | libc::O_APPEND | libc::O_DIRECT)
    }

    /// The requester of a data operation on `of`: the caller in the request header, or the
    /// opener when the kernel sends it on nobody's behalf (pid 0: page cache writeback).
    fn io_cred(&self, req: &Request, of: &OpenFile) -> Cred {
        if req.pid() == 0 {
            of.cred.clone()
        } else {
            self.groups.cred(req.pid(), req.uid(), req.gid())
        }
    }

    /// Check that `fd` is the real inode the kernel's `nodeid` stands for (the path may name
    /// another file since the kernel's lookup). ESTALE makes the kernel look the name up again.
    fn check_same_inode(&self, nodeid: u64, fd: &OwnedFd) -> Result<(), Errno> {
        let Some((_, _, _, key)) = self.inodes.locate(nodeid) else {
            return Ok(());
        };
        if key == (u64::MAX, u64::MAX) {
            return Ok(());
        }
        let a = self.fd_attr(fd).map_err(io_errno)?;
        if (a.dev, a.ino) != key {
            tracing::debug!("open of nodeid {nodeid}: the path names another inode now");
            return Err(Errno::ESTALE);
        }
        Ok(())
    }

    /// The daemon's descriptor for an open of `ino` with `oflags` by `c`: the one this caller
    /// already holds for the inode with the same flags, else a new one opened as the caller
    /// (within the caller's share of descriptors) and checked to be the kernel's inode.
    fn open_shared(&self, c: &Creds, ino: INodeNo, oflags: i32) -> Result<Arc<SharedFd>, Errno> {
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
    fn backing_for(
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
    fn has_privs(&self, of: &OpenFile) -> bool {
        // The core's attributes (what the kernel was told), else the real file's now.
        self.cache
            .getattr(&of.node)
            .ok()
            .or_else(|| self.fd_attr(&*of.fd).ok())
            .map(|a| a.mode & (libc::S_ISUID | libc::S_ISGID) != 0)
            .unwrap_or(true)
    }

    /// After a write-like call on a file that had set-id bits: the backing file system may
    /// have cleared them; the kernel must not keep the old mode (it decides exec and access
    /// with it).
    fn privs_maybe_killed(&self, of: &OpenFile) {
        self.backend_drops_privs(&of.node, &of.cred);
        self.cache.forget_attr(&of.node);
        self.queue_inval_inode(of.nodeid);
    }

    /// After `cred` wrote to or truncated `node` through a descriptor: a backend that is not a
    /// local directory does not see that, and is asked to drop set-id bits as for that caller
    /// with an empty setattr (see `touch_ctime`); a local file system drops them itself.
    fn backend_drops_privs(&self, node: &NodeRef, cred: &Cred) {
        if self.src_fd.is_none() {
            let c = self.cache.kernel_checked(cred.clone());
            if let Err(e) = self.cache.setattr_node(&c, node, &SetAttr::default()) {
                tracing::debug!("dropping set-id bits after a write: {e}");
            }
        }
    }

    /// chown, chmod and utimens of an open file through its descriptor, as `cred`.
    fn setattr_fd(fd: &SharedFd, cred: &Cred, set: &SetAttr) -> Result<Attr, Errno> {
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
    fn truncate_fd(fd: &SharedFd, cred: &Cred, size: u64) -> Result<(), Errno> {
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

    fn fopen_flags(&self) -> FopenFlags {
        if self.policy.keep_cache {
            FopenFlags::FOPEN_KEEP_CACHE
        } else {
            FopenFlags::empty()
        }
    }

    /// An O_PATH descriptor of the real file behind `ino`, verified to be the inode the
    /// kernel named (same `(dev, ino)` as when the nodeid was given out): ESTALE otherwise.
    fn verified_path_fd(&self, ino: INodeNo, node: &NodeRef) -> Result<OwnedFd, Errno> {
        let key = self
            .inodes
            .locate(ino.0)
            .map(|l| l.3)
            .ok_or(Errno::ESTALE)?;
        let fd = self.real_path_fd(node)?;
        let st = rustix::fs::fstat(&fd).map_err(|e| Errno::from_i32(e.raw_os_error()))?;
        if (st.st_dev, st.st_ino) != key {
            return Err(Errno::ESTALE);
        }
        Ok(fd)
    }

    /// A descriptor to run an inode-flags ioctl on: the handle the kernel opened for it
    /// (files), else (directories, which get no handle under FUSE_NO_OPENDIR_SUPPORT) the
    /// verified directory reopened read-only.
    fn ioctl_fd(&self, ino: INodeNo, fh: FileHandle) -> Result<OwnedFd, Errno> {
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

    /// A SETATTR that sets nothing but the change time (chown(f, -1, -1), and the like): the
    /// kernel sends no field for it without a writeback cache. As ext4 does, move the ctime:
    /// chown(-1, -1) as the caller on the verified inode.
    ///
    /// The kernel sends the same empty SETATTR when a write by another user must drop the
    /// set-user-ID/set-group-ID bits (file_remove_privs with FUSE_HANDLE_KILLPRIV): the data
    /// path drops them itself, as the caller. A chown(-1, -1) as that caller would try to drop
    /// them too and fail with EPERM for a non-owner, failing the write; so a file with those
    /// bits is answered without a change (its ctime moves with the write).
    fn touch_ctime(&self, req: &Request, ino: INodeNo, node: &NodeRef, reply: ReplyAttr) {
        if self.src_fd.is_none() {
            // A backend that is not a local directory gets the empty setattr itself (a
            // memory backend drops set-id bits for a caller without CAP_FSETID, as the kernel
            // asks; its writes cannot).
            let c = self.creds(req);
            let r = self.with_node(ino, |n| self.cache.setattr_node(&c, n, &SetAttr::default()));
            self.attrs_changed(node);
            return match r {
                Ok(a) => reply.attr(&self.policy.attr_ttl, &self.attr_for(ino.0, &a)),
                Err(e) => reply.error(e),
            };
        }
        let fd = match self.verified_path_fd(ino, node) {
            Ok(fd) => fd,
            Err(e) => return reply.error(e),
        };
        if let Ok(a) = attr_of_fd(&fd) {
            let setid = a.mode & libc::S_ISUID != 0
                || a.mode & (libc::S_ISGID | libc::S_IXGRP) == (libc::S_ISGID | libc::S_IXGRP);
            if setid {
                return reply.attr(&self.policy.attr_ttl, &self.attr_for(ino.0, &a));
            }
        }
        let cred = self.groups.cred(req.pid(), req.uid(), req.gid());
        let r = self.cache.backend().as_caller(&cred, &mut || {
            rustix::fs::chownat(
                &fd,
                "",
                None,
                None,
                rustix::fs::AtFlags::EMPTY_PATH | rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
            )
            .map_err(|e| CoreError::from(std::io::Error::from(e)))
        });
        if let Err(e) = r {
            return reply.error(errno(e));
        }
        self.attrs_changed(node);
        match attr_of_fd(&fd) {
            Ok(a) => reply.attr(&self.policy.attr_ttl, &self.attr_for(ino.0, &a)),
            Err(e) => reply.error(io_errno(e)),
        }
    }

    /// Open flags for a handle the daemon serves (no passthrough) of a file opened with
    /// open(2) `flags`. A caller that appends gets direct I/O: through the page cache the
    /// kernel splits a write at a page boundary into two WRITEs, and two appends could then
    /// land with another writer's data between them (a native O_APPEND write is one piece).
    fn fopen_flags_for(&self, flags: i32) -> FopenFlags {
        if flags & libc::O_APPEND != 0 {
            FopenFlags::FOPEN_DIRECT_IO
        } else {
            self.fopen_flags()
        }
    }

    /// Queue a kernel invalidation of `nodeid`'s attributes (sent by the notifier thread).
    fn queue_inval_inode(&self, nodeid: u64) {
        let _ = self.notify.send(NotifyMsg::InvalInode(nodeid));
    }
}

fn is_writable(flags: i32) -> bool {
    matches!(flags & libc::O_ACCMODE, libc::O_WRONLY | libc::O_RDWR) || flags & libc::O_TRUNC != 0
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
        self.inodes.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        self.count(Op::getattr);
        if let Some(fh) = fh {
            if let Ok(of) = self.open_file(fh) {
                if let Ok(a) = self.fd_attr(&*of.fd) {
                    let writers = self.inodes.info(ino.0).map(|i| i.writers).unwrap_or(0);
                    return reply.attr(&self.attr_ttl_of(writers), &self.attr_for(ino.0, &a));
                }
            }
        }
        let Some(info) = self.inodes.info(ino.0) else {
            return reply.error(Errno::ESTALE);
        };
        // Fresh from the backend when the core's copy may be behind: changed through another
        // name, or an open handle (reads move the atime under relatime, writes and shared
        // mappings mtime and ctime; the kernel invalidates its own copy after reads and
        // writes, and asks here).
        let fresh = info.stale || info.writers > 0 || info.opens > 0;
        let ttl = self.attr_ttl_of(info.writers);
        if info.stale {
            self.inodes.set_stale(ino.0, false);
        }
        // The core dropped the dentry (a change seen in SRC): find the inode again by the
        // name the kernel knows, if it is still there.
        let node = if info.node.is_dead() {
            self.node(ino).unwrap_or(info.node)
        } else {
            info.node
        };
        match self.attr_of(&node, fresh) {
            Ok(a) => {
                if a.is_dir() {
                    self.inodes.note_dir_attr(ino.0, &a);
                }
                reply.attr(&ttl, &self.attr_for(ino.0, &a))
            }
            Err(e) => {
                // An unlinked file that is still open: answer from its descriptor.
                let of = self
                    .files
                    .lock()
                    .values()
                    .find(|f| f.nodeid == ino.0)
                    .cloned();
                match of.map(|f| self.fd_attr(&*f.fd)) {
                    Some(Ok(a)) => reply.attr(&ttl, &self.attr_for(ino.0, &a)),
                    _ => match self.inodes.dir_attr(ino.0) {
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
            self.backend_drops_privs(&node, &cred);
            self.attrs_changed(&node);
            if mode.is_none()
                && uid.is_none()
                && gid.is_none()
                && atime.is_none()
                && mtime.is_none()
            {
                return match self.fd_attr(&*fd) {
                    Ok(a) => reply.attr(&self.policy.attr_ttl, &self.attr_for(ino.0, &a)),
                    Err(e) => reply.error(io_errno(e)),
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
                let of = self
                    .files
                    .lock()
                    .values()
                    .find(|f| f.nodeid == ino.0)
                    .cloned();
                let Some(of) = of else {
                    return reply.error(e);
                };
                let r = match self.cache.backend().fsetattr(c.cred(), of.fd.as_fd(), &set) {
                    Err(CoreError::NotSupported) => Self::setattr_fd(&of.fd, c.cred(), &set),
                    r => r.map_err(errno),
                };
                match r {
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
                self.inodes.set_stale(ino.0, false);
                match self.attr_of(&n, true) {
                    Ok(a) => {
                        let id = self
                            .inodes
                            .register(&n, &a, newparent.0, |n, k| self.names_key(n, k));
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

    fn fsync(
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
        reply.opened(FileHandle(0), flags)
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        self.count(Op::readdir);
        let list = match self.listing(req, ino, offset, false) {
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
        let start = (off - 2) as usize;
        let mut finished = true;
        for (i, e) in list.iter().enumerate().skip(start) {
            // getdents' d_ino: the entry's own number on the directory's device (for a mount
            // point, the covered directory's, as natively).
            let d_ino = self.inodes.ino_of(dev, e.ino);
            if reply.add(
                INodeNo(d_ino.max(2)),
                (i + 3) as u64,
                fuse_kind(e.kind),
                OsStr::from_bytes(&e.name),
            ) {
                finished = false;
                break;
            }
        }
        if finished && start > 0 {
            self.listings.lock().remove(&ino.0);
        }
        reply.ok()
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        self.count(Op::readdirplus);
        let list = match self.listing(req, ino, offset, true) {
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
        let start = (off - 2) as usize;
        let mut finished = true;
        for (i, e) in list.iter().enumerate().skip(start) {
            let Some(node) = self.child(&c, &dir, OsStr::from_bytes(&e.name)) else {
                continue;
            };
            let a = match e.attr {
                Some(a) if a.nlink <= 1 || a.is_dir() => a,
                _ => match self.attr_of(&node, false) {
                    Ok(a) => a,
                    Err(_) => continue,
                },
            };
            let id = self
                .inodes
                .register(&node, &a, ino.0, |n, k| self.names_key(n, k));
            if reply.add(
                INodeNo(id),
                (i + 3) as u64,
                OsStr::from_bytes(&e.name),
                &ttl,
                &fuse_attr(id, &a),
                Generation(self.inodes.generation(id)),
            ) {
                self.inodes.forget(id, 1);
                finished = false;
                break;
            }
        }
        if finished && start > 0 {
            self.listings.lock().remove(&ino.0);
        }
        reply.ok()
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.count(Op::releasedir);
        reply.ok()
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.count(Op::fsyncdir);
        if self.src_fd.is_none() {
            // No local directory below (a memory backend): nothing to make durable, as tmpfs.
            return reply.ok();
        }
        let fd = match self.node(ino).and_then(|n| self.real_path_fd(&n)) {
            Ok(fd) => fd,
            Err(e) => return reply.error(e),
        };
        // An O_PATH descriptor cannot be synced: reopen it read-only through /proc.
        let p = Self::proc_path(&fd);
        let dfd = match rustix::fs::open(
            p.as_c_str(),
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        ) {
            Ok(d) => d,
            Err(e) => return reply.error(Errno::from_i32(e.raw_os_error())),
        };
        let r = if datasync {
            rustix::fs::fdatasync(&dfd)
        } else {
            rustix::fs::fsync(&dfd)
        };
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(Errno::from_i32(e.raw_os_error())),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.count(Op::statfs);
        if let Ok(s) = self.cache.backend().statfs(b"") {
            return reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
            );
        }
        match rustix::fs::statvfs(&self.src) {
            Ok(s) => reply.statfs(
                s.f_blocks,
                s.f_bfree,
                s.f_bavail,
                s.f_files,
                s.f_ffree,
                s.f_bsize as u32,
                s.f_namemax as u32,
                s.f_frsize as u32,
            ),
            Err(e) => reply.error(Errno::from_i32(e.raw_os_error())),
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
        self.count(Op::setxattr);
        if self.xattr_blocked(name) {
            return reply.error(Errno::from_i32(libc::EOPNOTSUPP));
        }
        let x = match self.xattr_target(ino) {
            Ok(t) => t,
            Err(e) => return reply.error(e),
        };
        let c = self.creds(req);
        if let Err(e) = x
            .backend
            .setxattr(c.cred(), x.target(), name.as_bytes(), value, flags)
        {
            return reply.error(self.xattr_error(ino, &x, e));
        }
        self.attrs_changed(&x.node);
        reply.ok()
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.count(Op::getxattr);
        if ino.0 == ROOT && name.as_bytes() == SOCKET_XATTR.as_bytes() {
            if let Some(p) = &self.socket_path {
                let v = p.as_os_str().as_bytes();
                return if size == 0 {
                    reply.size(v.len() as u32)
                } else if (size as usize) < v.len() {
                    reply.error(Errno::from_i32(libc::ERANGE))
                } else {
                    reply.data(v)
                };
            }
        }
        if self.xattr_blocked(name) {
            return reply.error(Errno::from_i32(libc::EOPNOTSUPP));
        }
        // The kernel's POSIX ACL fetch (FUSE_POSIX_ACL): answer a known absence directly.
        let acl_bit = match name.as_bytes() {
            b"system.posix_acl_access" => 1,
            b"system.posix_acl_default" => 2,
            _ => 0,
        };
        let acl_key = if acl_bit != 0 {
            self.inodes.locate(ino.0).map(|l| l.3)
        } else {
            None
        };
        if let Some(k) = acl_key {
            if self.inodes.acl_absent(k, acl_bit) {
                self.counters.acl_memo_hits.fetch_add(1, Ordering::Relaxed);
                return reply.error(Errno::from_i32(libc::ENODATA));
            }
        }
        let acl_gen = self.inodes.acl_gen();
        let x = match self.xattr_target(ino) {
            Ok(t) => t,
            Err(e) => return reply.error(e),
        };
        // Groups matter for user.* reads only (the kernel's ACL fetches need none).
        let c = if acl_bit != 0 {
            self.read_creds(req)
        } else {
            self.creds(req)
        };
        let v = match x.backend.getxattr(c.cred(), x.target(), name.as_bytes()) {
            Ok(v) => v,
            Err(e) => {
                if e.errno() == libc::ENODATA {
                    if let Some(k) = acl_key {
                        self.inodes.note_acl_absent(k, acl_bit, acl_gen);
                    }
                }
                return reply.error(self.xattr_error(ino, &x, e));
            }
        };
        if size == 0 {
            reply.size(v.len() as u32)
        } else if (size as usize) < v.len() {
            reply.error(Errno::from_i32(libc::ERANGE))
        } else {
            reply.data(&v)
        }
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.count(Op::listxattr);
        let x = match self.xattr_target(ino) {
            Ok(t) => t,
            Err(e) => return reply.error(e),
        };
        let c = self.creds(req);
        let names = match x.backend.listxattr(c.cred(), x.target()) {
            Ok(v) => v,
            Err(e) => return reply.error(self.xattr_error(ino, &x, e)),
        };
        let list: Vec<u8> = names
            .split(|b| *b == 0)
            .filter(|n| !n.is_empty() && !self.xattr_blocked(OsStr::from_bytes(n)))
            .flat_map(|n| n.iter().copied().chain(std::iter::once(0)))
            .collect();
        if size == 0 {
            reply.size(list.len() as u32)
        } else if (size as usize) < list.len() {
            reply.error(Errno::from_i32(libc::ERANGE))
        } else {
            reply.data(&list)
        }
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.count(Op::removexattr);
        if self.xattr_blocked(name) {
            return reply.error(Errno::from_i32(libc::EOPNOTSUPP));
        }
        let x = match self.xattr_target(ino) {
            Ok(t) => t,
            Err(e) => return reply.error(e),
        };
        let c = self.creds(req);
        if let Err(e) = x.backend.removexattr(c.cred(), x.target(), name.as_bytes()) {
            return reply.error(self.xattr_error(ino, &x, e));
        }
        self.attrs_changed(&x.node);
        reply.ok()
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
        let a = match self
            .fd_attr(&fd)
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

    fn lseek(
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
