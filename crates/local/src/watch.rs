//! The change feed: reports changes made to the tree behind the cache's back.
//!
//! Two sources, chosen by [`WatchMode`]:
//!
//! * **fanotify** (root only): one group with `FAN_REPORT_DFID_NAME | FAN_REPORT_FID` and a
//!   filesystem mark on every file system the backend serves: the root's, and that of every
//!   mount whose mount point lies below the root (tmpfs, bind mounts), found in
//!   `/proc/self/mountinfo` and followed while it changes (POLLPRI on that file: new mounts are
//!   marked, and a mount point that gained or lost a mount is reported as `Entry`). Each event
//!   names a directory by file system id, file handle and a name; the handle is resolved with
//!   `open_by_handle_at` through each mount of that file system below the root (so a bind
//!   mount's view is reported too) and `readlink("/proc/self/fd/N")`, then events outside the
//!   root are dropped. Resolutions are memoised in a bounded map (positive and negative: a
//!   directory elsewhere on the file system costs one resolution, not one per event), emptied
//!   only when a directory is moved out of, into or within the root (an event whose old or new
//!   parent resolves below the root, or cannot be resolved), on an overflow, or when the mounts
//!   change: a move between two directories outside the root, or a directory created or
//!   removed anywhere, changes no memoised answer. Events about a non-directory by inode only
//!   (its link count changed, through a name nobody reported) or through a name outside the
//!   root (a chmod, write, `ln` or `rm` of an outside hard link) are reported by inode,
//!   `Change::Inode`, if the backend ever answered about that inode (`served.rs`); the inode
//!   number is read from the handle itself where the file system's layout is known (ext4,
//!   XFS, tmpfs: `fid.rs`), so other jobs' files cost no system call; elsewhere the handle is
//!   opened as before (and a file found by its outside name is not reported). After each read
//!   the thread waits 1 ms for events to gather (a write flood elsewhere would otherwise wake
//!   it for every few events). No descriptor is kept per directory or per
//!   submount (it would keep the submount from being unmounted). A file system below the root
//!   that cannot be marked (proc, sysfs: no file handles) is logged; changes made on it
//!   outside the mount are not reported.
//! * **inotify** (fallback, or when asked): one watch per directory under the root, added
//!   recursively at start and for every directory created or moved in later. Watches cost no
//!   descriptors (they count against `fs.inotify.max_user_watches`). A link count change is
//!   reported on the inode only, so every hard-linked file the backend answers about gets a
//!   watch of its own, reported as `Change::Inode` (`links.rs`).
//!
//! The thread sends `Change::Entry` for create/delete/move (old and new names), `Change::Attr`
//! for attrib/modify, `Change::Inode` for inode-only attribute events (fanotify; inotify's
//! watches on hard-linked files) and
//! `Change::Overflow` when the kernel lost events (a front end's own passthrough writes are
//! reported marked, `own.rs`). It empties the
//! backend's directory-descriptor cache on every directory create/delete/move and on overflow.
//! It stops when the backend is dropped (an eventfd wakes it) or, when the receiver is dropped,
//! at the next event it tries to send; its descriptors close when it returns.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::Sender;
use dircache_core::{Change, ChangeFeed, Error, Result};

use crate::{path_bytes, FdCache, LocalBackend};

/// Which kernel interface the change feed uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WatchMode {
    /// fanotify when possible (root, kernel support), else inotify.
    #[default]
    Auto,
    /// fanotify only; `watch()` fails if it is unavailable.
    Fanotify,
    /// recursive inotify only.
    Inotify,
    /// no change feed: `watch()` returns `None`.
    Off,
}

pub(crate) struct Watcher {
    stop: OwnedFd,
    thread: Option<JoinHandle<()>>,
    /// It leaves out the changes made through the backend (fanotify, by thread).
    pub(crate) skips_own: bool,
}

fn last_err() -> Error {
    Error::from(std::io::Error::last_os_error())
}

impl Watcher {
    pub(crate) fn start(b: &LocalBackend, mode: WatchMode) -> Result<(Watcher, ChangeFeed)> {
        let source = match mode {
            WatchMode::Off => return Err(Error::NotSupported),
            WatchMode::Fanotify => Source::Fan(Fan::new(b)?),
            WatchMode::Inotify => Source::Ino(Ino::new(b)?),
            WatchMode::Auto => match Fan::new(b) {
                Ok(f) => Source::Fan(f),
                Err(e) => {
                    tracing::info!("dircache-local: fanotify unavailable ({e}), using inotify");
                    Source::Ino(Ino::new(b)?)
                }
            },
        };
        let skips_own = match &source {
            Source::Fan(f) => f.mutators.is_some(),
            _ => false,
        };
        // SAFETY: eventfd takes two integers and returns a new descriptor or -1.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if efd < 0 {
            return Err(last_err());
        }
        // SAFETY: efd is a freshly created descriptor that nothing else owns.
        let stop = unsafe { OwnedFd::from_raw_fd(efd) };
        let stop2 = stop.try_clone().map_err(Error::from)?;
        let (tx, rx) = crossbeam_channel::unbounded();
        let fds = b.fds.clone();
        // While this feed runs, the descriptor cache may be used (the thread empties it on
        // every directory change from outside); `run` undoes this when it ends.
        fds.feeds.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        let fds2 = fds.clone();
        let thread = match std::thread::Builder::new()
            .name("dircache-watch".into())
            .spawn(move || run(source, stop2, tx, fds2))
        {
            Ok(t) => t,
            Err(e) => {
                fds.feeds.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
                return Err(Error::from(e));
            }
        };
        Ok((
            Watcher {
                stop,
                thread: Some(thread),
                skips_own,
            },
            rx,
        ))
    }

    pub(crate) fn stop(mut self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd.
        unsafe { libc::write(self.stop.as_raw_fd(), (&one as *const u64).cast(), 8) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

enum Source {
    Fan(Fan),
    Ino(Ino),
}

impl Source {
    fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        match self {
            Source::Fan(f) => f.fd.as_fd(),
            Source::Ino(i) => i.ino.as_fd(),
        }
    }
    /// Read what is pending; push changes; return whether directory structure changed.
    fn read(&mut self, out: &mut Vec<Change>) -> bool {
        match self {
            Source::Fan(f) => f.read(out),
            Source::Ino(i) => i.read(out),
        }
    }
    /// Whether the queue must be read now even if poll reports nothing: a released
    /// passthrough handle waits for it (`own.rs`, [`crate::own::OwnWrites::ending`]).
    fn must_drain(&self) -> bool {
        match self {
            Source::Fan(f) => f.own.as_ref().is_some_and(|o| o.ending()),
            Source::Ino(_) => false,
        }
    }
    /// The hard-linked files' watches (`links.rs`), read with the rest (inotify only).
    fn links_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        match self {
            Source::Fan(_) => None,
            Source::Ino(i) => Some(i.links.fd()),
        }
    }
    /// A descriptor that reports changes of the mount table (POLLPRI), if followed.
    fn mounts_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        match self {
            Source::Fan(f) => f.mountinfo.as_ref().map(|m| m.as_fd()),
            Source::Ino(_) => None,
        }
    }
    /// The mount table changed; push changes; return whether directory structure changed.
    fn mounts_changed(&mut self, out: &mut Vec<Change>) -> bool {
        match self {
            Source::Fan(f) => f.mounts_changed(out),
            Source::Ino(_) => false,
        }
    }
}

fn run(source: Source, stop: OwnedFd, tx: Sender<Change>, fds: Arc<FdCache>) {
    run_loop(source, stop, tx, &fds);
    // No feed keeps the descriptor cache coherent any more (unless another one runs).
    fds.feeds.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    fds.clear();
}

fn run_loop(mut source: Source, stop: OwnedFd, tx: Sender<Change>, fds: &FdCache) {
    let mut out = Vec::new();
    loop {
        let mut pfd = [
            libc::pollfd {
                fd: source.fd().as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: stop.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                // A negative descriptor is ignored by poll.
                fd: source.mounts_fd().map_or(-1, |f| f.as_raw_fd()),
                events: libc::POLLPRI,
                revents: 0,
            },
            libc::pollfd {
                fd: source.links_fd().map_or(-1, |f| f.as_raw_fd()),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let drain = source.must_drain();
        // SAFETY: pfd is a live array of four pollfd structures.
        let r = unsafe { libc::poll(pfd.as_mut_ptr(), 4, if drain { 0 } else { -1 }) };
        if r < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            tracing::error!("dircache-local: watcher poll failed: {}", last_err());
            let _ = tx.send(Change::Overflow);
            return;
        }
        if pfd[1].revents != 0 {
            return;
        }
        if pfd[0].revents == 0 && pfd[2].revents == 0 && pfd[3].revents == 0 && !drain {
            continue;
        }
        out.clear();
        let mut structural = false;
        if pfd[2].revents != 0 {
            // Mounts appeared or went away under the root: mark the new file systems first,
            // so no event of theirs is missed after the mount points are reported.
            structural |= source.mounts_changed(&mut out);
        }
        structural |= source.read(&mut out);
        if structural {
            fds.clear();
        }
        for c in out.drain(..) {
            if tx.send(c).is_err() {
                return; // receiver dropped
            }
        }
        if pfd[0].revents != 0 || pfd[3].revents != 0 {
            // Let events gather before the next read: a busy file system (the fanotify mark
            // covers all of it: other jobs' builds) would otherwise wake this thread for every
            // few events, and the wakeups, not the events, would cost most. Bounds what a
            // change waits behind a burst by this much.
            std::thread::sleep(COALESCE);
        }
    }
}

/// The pause after each read of events (see `run_loop`).
const COALESCE: std::time::Duration = std::time::Duration::from_millis(1);

/// More than any one fanotify event can take with this group's flags (metadata, and at most
/// three FID records with a handle of up to MAX_HANDLE_SZ = 128 bytes and a name of up to
/// NAME_MAX bytes each, for FAN_RENAME): a read that left this much of the buffer unused
/// found the queue empty.
const MAX_EVENT_LEN: usize = 4096;

/// `read` calls of the fanotify reader in this process (a test's measure of coalescing).
static READS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many times the fanotify readers of this process have read their queue.
pub fn fanotify_reads() -> u64 {
    READS.load(std::sync::atomic::Ordering::Relaxed)
}

// ---------------------------------------------------------------------------------------------
// fanotify

/// A mount through which the backend serves files: the one holding the root, and every mount
/// whose mount point lies below the root (tmpfs, bind mounts, ...). Each file system reached
/// this way has a filesystem mark; an event names its file system by fsid and is resolved
/// through every mount of that file system, so a file reachable under two mount points (a
/// bind mount) is reported under both paths.
struct MountRef {
    /// The kernel's mount id (`/proc/self/mountinfo`, confirmed by statx).
    id: u64,
    /// Mount point relative to the root; empty for the mount holding the root.
    rel: Vec<u8>,
    /// The file system's id as fanotify reports it (statfs `f_fsid`).
    fsid: [u8; 8],
    /// The device number the backend reports for files on it.
    dev: u64,
    /// How its file handles hold inode numbers, if known (`fid.rs`).
    codec: Option<crate::fid::Codec>,
}

struct Fan {
    fd: OwnedFd,
    /// Descriptor on the root (O_RDONLY) for open_by_handle_at; submounts are opened beneath
    /// it when needed (holding a descriptor on them would keep them from being unmounted).
    mount: OwnedFd,
    root: Vec<u8>,
    /// The mounts the backend serves; `mounts[0]` holds the root.
    mounts: Vec<MountRef>,
    /// File systems with a mark (by fsid).
    marked: std::collections::HashSet<[u8; 8]>,
    /// `/proc/self/mountinfo`: POLLPRI when the mount table changes.
    mountinfo: Option<std::fs::File>,
    /// (mount id, handle bytes) -> path relative to the root (None: not under the root).
    /// Emptied when a directory is moved from or into a directory below the root (or one
    /// that cannot be resolved), and when the mounts change: no other event changes where a
    /// directory is relative to the root.
    handles: HashMap<(u64, Vec<u8>), Option<Vec<u8>>>,
    buf: Vec<u64>,
    /// Events caused by threads that mutate through the backend are skipped: they are the
    /// cache's own changes, applied already. Re-reporting them would make the cache drop
    /// entries a front end (a kernel) is still using. `None`: report everything.
    mutators: Option<Arc<parking_lot::Mutex<std::collections::HashSet<i32>>>>,
    /// The non-directories the backend answered about (`served.rs`).
    served: Arc<crate::served::Served>,
    /// Passthrough writes a front end registered (`own.rs`): their reports are marked.
    /// `None` with `report_own_changes`.
    own: Option<crate::own::Reader>,
}

const FAN_MASK: u64 = libc::FAN_CREATE
    | libc::FAN_DELETE
    | libc::FAN_MOVED_FROM
    | libc::FAN_MOVED_TO
    | libc::FAN_ATTRIB
    | libc::FAN_MODIFY
    | libc::FAN_ONDIR;

const HANDLE_CACHE: usize = 16384;

/// A file system id as fanotify and statfs report it.
type Fsid = [u8; 8];

/// Undo the octal escapes (`\040` for a space...) of a `/proc/self/mountinfo` field.
fn unescape_mountinfo(f: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(f.len());
    let mut i = 0;
    while i < f.len() {
        if f[i] == b'\\' && i + 4 <= f.len() {
            let oct = &f[i + 1..i + 4];
            if oct.iter().all(|c| (b'0'..=b'7').contains(c)) {
                let v = oct
                    .iter()
                    .fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
                if let Ok(b) = u8::try_from(v) {
                    out.push(b);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(f[i]);
        i += 1;
    }
    out
}

/// Mounts (id, mount point relative to `root`) whose mount point lies strictly below `root`,
/// from the text of `/proc/self/mountinfo`, outer mount points first.
///
/// FUSE file systems are left out: an ordinary user can mount one inside SRC (fusermount),
/// and its server could leave the watcher thread (root) waiting forever on the open, statx or
/// statfs needed to watch it, which would stop the change feed for everyone. Changes made
/// there outside the mount are not reported.
fn mounts_below(mountinfo: &[u8], root: &[u8]) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    for line in mountinfo.split(|&c| c == b'\n') {
        let mut f = line.split(|&c| c == b' ');
        let (Some(id), Some(_parent), Some(_dev), Some(_root), Some(mp)) =
            (f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            continue;
        };
        // After the optional fields, "-" and the file system type.
        let fstype = f.skip_while(|x| *x != b"-").nth(1).unwrap_or(b"");
        if fstype.starts_with(b"fuse") {
            continue;
        }
        let Some(id) = std::str::from_utf8(id)
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
        else {
            continue;
        };
        let mp = unescape_mountinfo(mp);
        let rel = if root == b"/" {
            mp.strip_prefix(b"/").map(<[u8]>::to_vec)
        } else {
            mp.strip_prefix(root)
                .and_then(|r| r.strip_prefix(b"/"))
                .map(<[u8]>::to_vec)
        };
        match rel {
            Some(r) if !r.is_empty() => out.push((id, r)),
            _ => {}
        }
    }
    out.sort_by_key(|(_, r)| r.iter().filter(|&&c| c == b'/').count());
    out
}

/// The mount id and fsid of the file system `fd` is on.
fn mount_identity(fd: &OwnedFd) -> Option<(u64, [u8; 8])> {
    mount_identity_dev(fd).map(|(id, fsid, _)| (id, fsid))
}

/// The mount id, fsid and device number of the file system `fd` is on.
fn mount_identity_dev(fd: &OwnedFd) -> Option<(u64, [u8; 8], u64)> {
    let sx = rustix::fs::statx(
        fd,
        c"",
        rustix::fs::AtFlags::EMPTY_PATH,
        rustix::fs::StatxFlags::MNT_ID,
    )
    .ok()?;
    // SAFETY: statfs is plain old data; zeroed is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is live and `st` is a writable statfs.
    if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut st) } != 0 {
        return None;
    }
    // SAFETY: fsid_t is two 32-bit integers (8 bytes, no padding), as in fanotify's records.
    let fsid: [u8; 8] = unsafe { std::mem::transmute_copy(&st.f_fsid) };
    Some((
        sx.stx_mnt_id,
        fsid,
        libc::makedev(sx.stx_dev_major, sx.stx_dev_minor),
    ))
}

impl Fan {
    fn new(b: &LocalBackend) -> Result<Fan> {
        // SAFETY: fanotify_init takes two flag words and returns a descriptor or -1.
        let fd = unsafe {
            libc::fanotify_init(
                // The mark covers the whole file system, so a busy build elsewhere could fill a
                // bounded queue and force an Overflow (a full cache flush) although nothing
                // under the root changed: the queue is unlimited instead (root only).
                libc::FAN_CLASS_NOTIF
                    | libc::FAN_UNLIMITED_QUEUE
                    | libc::FAN_CLOEXEC
                    | libc::FAN_NONBLOCK
                    | libc::FAN_REPORT_DFID_NAME
                    | libc::FAN_REPORT_FID
                    | libc::FAN_REPORT_TID,
                (libc::O_RDONLY | libc::O_CLOEXEC) as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(last_err());
        }
        // SAFETY: fd is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // open_by_handle_at (and fanotify_mark with a NULL path) need a real, not O_PATH,
        // descriptor on the file system: open the root itself (no path walk to race with).
        let mount = rustix::fs::openat(
            &b.root,
            c".",
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| Error::from_errno(e.raw_os_error()))?;
        let (root_id, root_fsid, root_dev) =
            mount_identity_dev(&mount).ok_or(Error::NotSupported)?;
        let root_codec = crate::fid::Codec::for_fd(mount.as_fd());
        let root = path_bytes(&b.root_path).to_vec();
        let mut me = Fan {
            fd,
            mount,
            root,
            mounts: Vec::new(),
            marked: std::collections::HashSet::new(),
            mountinfo: std::fs::File::open("/proc/self/mountinfo").ok(),
            handles: HashMap::new(),
            served: b.served.clone(),
            buf: vec![0u64; 8192],
            mutators: (!b
                .report_own_changes
                .load(std::sync::atomic::Ordering::Relaxed))
            .then(|| b.mutators.clone()),
            own: (!b
                .report_own_changes
                .load(std::sync::atomic::Ordering::Relaxed))
            .then(|| crate::own::Reader::new(b.own.clone())),
        };
        Fan::mark(&me.fd, &mut me.marked, me.mount.as_fd(), root_fsid)?;
        me.mounts.push(MountRef {
            id: root_id,
            rel: Vec::new(),
            fsid: root_fsid,
            dev: root_dev,
            codec: root_codec,
        });
        // Every mount below the root must be watched too, or the feed would miss its changes.
        let mut ignored = Vec::new();
        let _ = me.rescan(&mut ignored);
        Ok(me)
    }

    /// Add a filesystem mark on the file system of `fd` (once per fsid).
    fn mark(
        fan: &OwnedFd,
        marked: &mut std::collections::HashSet<[u8; 8]>,
        fd: std::os::fd::BorrowedFd<'_>,
        fsid: [u8; 8],
    ) -> Result<()> {
        if marked.contains(&fsid) {
            return Ok(());
        }
        // SAFETY: both descriptors are live; a NULL path marks the object `fd` refers to
        // (its whole file system, with FAN_MARK_FILESYSTEM).
        let r = unsafe {
            libc::fanotify_mark(
                fan.as_raw_fd(),
                libc::FAN_MARK_ADD | libc::FAN_MARK_FILESYSTEM,
                FAN_MASK,
                fd.as_raw_fd(),
                std::ptr::null(),
            )
        };
        if r < 0 {
            return Err(last_err());
        }
        marked.insert(fsid);
        Ok(())
    }

    /// Open the root of mount `m` (beneath the root, no symlinks) if it is still that mount.
    fn open_mount(&self, m: &MountRef) -> Option<OwnedFd> {
        let mut p = m.rel.clone();
        p.extend_from_slice(b"/.");
        let fd = rustix::fs::openat2(
            &self.mount,
            &p[..],
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
            crate::RESOLVE,
        )
        .ok()?;
        match mount_identity(&fd) {
            Some((id, _)) if id == m.id => Some(fd),
            _ => None,
        }
    }

    /// Bring the list of mounts below the root up to date with the mount table. A mount that
    /// appeared or went away changes what its mount point shows: reported as `Entry`. A file
    /// system that cannot be marked (no file handles or no fsid: proc, sysfs, some FUSE file
    /// systems) is logged: changes made on it outside the mount are not reported. (Falling
    /// back to inotify for everything instead would make a SRC of `/` watch every directory.)
    /// Returns whether a mount below the root appeared or went away: the mount table of the
    /// namespace changes whenever anything is mounted anywhere (other jobs' FUSE mounts), and
    /// only a change below the root moves what the fd cache's paths name.
    fn rescan(&mut self, out: &mut Vec<Change>) -> bool {
        let text = match std::fs::read("/proc/self/mountinfo") {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!("dircache-local: cannot read the mount table: {e}");
                // Not known what changed: as if everything did.
                return true;
            }
        };
        let now = mounts_below(&text, &self.root);
        let mut changed = false;
        // Gone (or moved) mounts.
        let mut kept = vec![true; self.mounts.len()];
        for (i, m) in self.mounts.iter().enumerate().skip(1) {
            if !now.iter().any(|(id, rel)| *id == m.id && *rel == m.rel) {
                kept[i] = false;
                changed = true;
                out.push(Change::Entry {
                    path: m.rel.clone(),
                });
            }
        }
        let mut i = 0;
        self.mounts.retain(|_| {
            i += 1;
            kept[i - 1]
        });
        // New mounts.
        for (id, rel) in now {
            if self.mounts.iter().any(|m| m.id == id && m.rel == rel) {
                continue;
            }
            let mut p = rel.clone();
            p.extend_from_slice(b"/.");
            let fd = match rustix::fs::openat2(
                &self.mount,
                &p[..],
                rustix::fs::OFlags::RDONLY
                    | rustix::fs::OFlags::DIRECTORY
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
                crate::RESOLVE,
            ) {
                Ok(fd) => fd,
                // Hidden by a later mount, under a symlink, or gone already.
                Err(_) => continue,
            };
            let Some((real_id, fsid, dev)) = mount_identity_dev(&fd) else {
                continue;
            };
            // A mount stacked over this one answers for the mount point.
            if real_id != id || self.mounts.iter().any(|m| m.id == real_id && m.rel == rel) {
                continue;
            }
            if let Err(e) = Fan::mark(&self.fd, &mut self.marked, fd.as_fd(), fsid) {
                let shown = String::from_utf8_lossy(&rel).into_owned();
                tracing::warn!(
                    "dircache-local: changes made outside the mount on the file system \
                     mounted at {shown} are not reported ({e})"
                );
            }
            changed = true;
            out.push(Change::Entry { path: rel.clone() });
            let codec = crate::fid::Codec::for_fd(fd.as_fd());
            self.mounts.push(MountRef {
                id,
                rel,
                fsid,
                dev,
                codec,
            });
        }
        self.handles.clear();
        changed
    }

    /// The mount table changed: follow it. Structural (empties the fd cache) only if a mount
    /// below the root changed.
    fn mounts_changed(&mut self, out: &mut Vec<Change>) -> bool {
        self.rescan(out)
    }

    /// Paths relative to the root of the directory with this handle on the file system
    /// `fsid`, one per mount it is reached through (none: not under the root), and whether
    /// some mount could not say (not memoised; the directory may be below the root).
    fn resolve(&mut self, fsid: &[u8], key: &[u8]) -> (Vec<Vec<u8>>, bool) {
        let mut idx: Vec<usize> = (0..self.mounts.len())
            .filter(|&i| self.mounts[i].fsid == fsid)
            .collect();
        if idx.is_empty() {
            // An fsid statfs and fanotify disagree on (btrfs subvolumes): try every mount.
            idx = (0..self.mounts.len()).collect();
        }
        let mut out = Vec::new();
        let mut unknown = false;
        for i in idx {
            let id = self.mounts[i].id;
            let k = (id, key.to_vec());
            let v = match self.handles.get(&k) {
                Some(v) => v.clone(),
                None => match self.resolve_uncached(i, key) {
                    Some(v) => {
                        if self.handles.len() >= HANDLE_CACHE {
                            self.handles.clear();
                        }
                        self.handles.insert(k, v.clone());
                        v
                    }
                    None => {
                        unknown = true;
                        None
                    }
                },
            };
            if let Some(p) = v {
                if !out.contains(&p) {
                    out.push(p);
                }
            }
        }
        (out, unknown)
    }

    /// Open the object of a file handle through mount `i` (O_PATH). `Err(true)`: the handle
    /// is stale (its object is gone for good); `Err(false)`: not opened for another reason.
    fn open_handle(&self, i: usize, key: &[u8]) -> std::result::Result<OwnedFd, bool> {
        // `key` is a struct file_handle: u32 handle_bytes, i32 handle_type, bytes. Copy it into
        // 8-byte-aligned storage for the kernel.
        let mut h = vec![0u64; key.len().div_ceil(8)];
        // SAFETY: `h` has at least key.len() bytes; the regions do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(key.as_ptr(), h.as_mut_ptr().cast::<u8>(), key.len())
        };
        let sub;
        let mfd = if i == 0 {
            self.mount.as_raw_fd()
        } else {
            sub = self.open_mount(&self.mounts[i]).ok_or(false)?;
            sub.as_raw_fd()
        };
        // SAFETY: `h` holds a complete file_handle (its size was checked by the parser);
        // the mount descriptor is live.
        let fd = unsafe {
            libc::open_by_handle_at(
                mfd,
                h.as_mut_ptr().cast::<libc::file_handle>(),
                libc::O_PATH | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error().raw_os_error() == Some(libc::ESTALE));
        }
        // SAFETY: fresh descriptor owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// The path below the root of a handle's object through mount `i`: `Some(None)` if it is
    /// not below the root (or gone for good), `None` if that could not be found out.
    fn resolve_uncached(&self, i: usize, key: &[u8]) -> Option<Option<Vec<u8>>> {
        let fd = match self.open_handle(i, key) {
            Ok(fd) => fd,
            Err(true) => return Some(None),
            Err(false) => return None,
        };
        // Removed (a directory rmdir'ed or renamed over, whose handle an attribute event
        // names): nowhere below the root. Its /proc link is its last path with " (deleted)"
        // appended, which was reported as a change of a name nobody has (`d2/e0 (deleted)`,
        // looked up in the backend by the front end's notifier).
        if rustix::fs::fstat(&fd).is_ok_and(|st| st.st_nlink == 0) {
            return Some(None);
        }
        // The path through mount `i` (open_by_handle_at opened it on that mount).
        let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).ok()?;
        let p = path_bytes(&link);
        if p == self.root.as_slice() {
            return Some(Some(Vec::new()));
        }
        if self.root == b"/" {
            return Some(p.strip_prefix(b"/").map(<[u8]>::to_vec));
        }
        Some(
            p.strip_prefix(self.root.as_slice())
                .and_then(|rest| rest.strip_prefix(b"/"))
                .map(<[u8]>::to_vec),
        )
    }

    /// (dev, ino) of a handle's object read from the handle itself, if its file system's
    /// layout is known (`fid.rs`).
    fn decode(&self, fsid: &[u8], key: &[u8]) -> Option<(u64, u64)> {
        let m = self.mounts.iter().find(|m| m.fsid == fsid)?;
        Some((m.dev, m.codec?.ino(key)?))
    }

    /// A link count changed (the event named no directory): report the inode if the backend
    /// ever answered about it (`served.rs`).
    fn link_count_changed(&self, fsid: &[u8; 8], key: &[u8], out: &mut Vec<Change>) {
        if let Some((dev, ino)) = self.decode(fsid, key) {
            if self.served.contains(dev, ino) {
                out.push(Change::Inode { dev, ino });
            }
            return;
        }
        // Unknown handle layout: ask the kernel where the file is.
        if self.below_root(fsid, key) {
            if let Some((dev, ino)) = self.identify(fsid, key) {
                out.push(Change::Inode { dev, ino });
            }
        }
    }

    /// Whether the non-directory a file handle names is found below the root now (the name
    /// the kernel finds for it, through any mount of its file system below the root). Not
    /// memoised: a file's name, unlike a directory's, is not followed by the handle map. A
    /// file hard-linked both inside and outside the root may be found by its outside name
    /// and then go unreported.
    fn below_root(&self, fsid: &[u8], key: &[u8]) -> bool {
        let mut idx: Vec<usize> = (0..self.mounts.len())
            .filter(|&i| self.mounts[i].fsid == fsid)
            .collect();
        if idx.is_empty() {
            idx = (0..self.mounts.len()).collect();
        }
        idx.into_iter()
            .any(|i| matches!(self.resolve_uncached(i, key), Some(Some(_))))
    }

    /// (dev, ino) of the object of a file handle on file system `fsid`.
    fn identify(&self, fsid: &[u8], key: &[u8]) -> Option<(u64, u64)> {
        let mut idx: Vec<usize> = (0..self.mounts.len())
            .filter(|&i| self.mounts[i].fsid == fsid)
            .collect();
        if idx.is_empty() {
            idx = (0..self.mounts.len()).collect();
        }
        for i in idx {
            if let Ok(fd) = self.open_handle(i, key) {
                let sx = rustix::fs::statx(
                    &fd,
                    c"",
                    rustix::fs::AtFlags::EMPTY_PATH,
                    rustix::fs::StatxFlags::INO,
                )
                .ok()?;
                return Some((
                    libc::makedev(sx.stx_dev_major, sx.stx_dev_minor),
                    sx.stx_ino,
                ));
            }
        }
        None
    }

    /// An event naming a non-directory by its directory and name, outside the root, and by
    /// its own handle: a change through an outside hard-link name (chmod, write, `ln`, `rm`,
    /// `mv`) of a file that may have a name below the root: reported by inode if the backend
    /// ever answered about it (`served.rs`). An unknown handle layout is not reported (the
    /// kernel would name the file by whichever of its names it finds first).
    fn outside_file_event(&self, object: Option<&([u8; 8], Vec<u8>)>, out: &mut Vec<Change>) {
        if let Some((dev, ino)) = object.and_then(|(fsid, h)| self.decode(fsid, h)) {
            if self.served.contains(dev, ino) {
                out.push(Change::Inode { dev, ino });
            }
        }
    }

    /// Read and parse what is queued. A read that leaves room for the largest event came
    /// back short because the kernel found the queue empty (fanotify_read copies events
    /// until none is left or the next one does not fit): that counts as a drain, and the
    /// reader returns to its coalescing pause instead of reading again at once. Reading
    /// until EAGAIN let a reader that parses about as fast as events come (other jobs'
    /// writes anywhere on the file system, each one FAN_MODIFY) chase them one event per
    /// `read`: 18,090 reads during one `tar xf` on the mount with the reader slowed by
    /// strace, about two reads per pause without it (docs/opens.md).
    fn read(&mut self, out: &mut Vec<Change>) -> bool {
        let mut structural = false;
        let mut buf = std::mem::take(&mut self.buf);
        loop {
            let cap = buf.len() * 8;
            // SAFETY: reads at most `cap` bytes into our live buffer.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), cap) };
            READS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let empty = n <= 0 || (n as usize).saturating_add(MAX_EVENT_LEN) <= cap;
            if n > 0 {
                // SAFETY: the buffer is a Vec<u64> of `cap` bytes; we view its first n as bytes.
                let bytes =
                    unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), n as usize) };
                structural |= self.parse(bytes, out);
            }
            if empty {
                if let Some(own) = &self.own {
                    own.drained();
                }
                self.buf = buf;
                return structural;
            }
        }
    }

    fn parse(&mut self, bytes: &[u8], out: &mut Vec<Change>) -> bool {
        let meta_size = std::mem::size_of::<libc::fanotify_event_metadata>();
        let mut structural = false;
        let mut off = 0;
        while off + meta_size <= bytes.len() {
            // SAFETY: at least meta_size bytes remain; read_unaligned copes with alignment.
            let m: libc::fanotify_event_metadata =
                unsafe { std::ptr::read_unaligned(bytes[off..].as_ptr().cast()) };
            let len = m.event_len as usize;
            if len < meta_size || off + len > bytes.len() {
                break;
            }
            let ev = &bytes[off..off + len];
            off += len;
            if m.fd >= 0 {
                // Not expected in FID mode; never leak it.
                // SAFETY: the kernel gave us this descriptor; we own it.
                drop(unsafe { OwnedFd::from_raw_fd(m.fd) });
            }
            if m.mask & libc::FAN_Q_OVERFLOW != 0 {
                out.push(Change::Overflow);
                structural = true;
                self.handles.clear();
                continue;
            }
            let is_dir = m.mask & libc::FAN_ONDIR != 0;
            let entry_ev = m.mask
                & (libc::FAN_CREATE | libc::FAN_DELETE | libc::FAN_MOVED_FROM | libc::FAN_MOVED_TO)
                != 0;
            // With FAN_REPORT_TID, `pid` is the thread that caused the event. Decided before
            // the records are copied out: most events during a creating workload on the
            // mount are the daemon's own (a create, three attribute changes per file).
            let own_thread = self
                .mutators
                .as_ref()
                .is_some_and(|tids| tids.lock().contains(&m.pid));
            if own_thread && !(is_dir && entry_ev) {
                continue;
            }
            // Find the directory handle and name, and the object's own handle.
            let mut rec = m.metadata_len as usize;
            let mut target: Option<(Fsid, Vec<u8>, Option<Vec<u8>>)> = None;
            let mut object: Option<([u8; 8], Vec<u8>)> = None;
            while rec + 4 <= ev.len() {
                let info_type = ev[rec];
                let rlen = u16::from_ne_bytes([ev[rec + 2], ev[rec + 3]]) as usize;
                if rlen < 4 || rec + rlen > ev.len() {
                    break;
                }
                let r = &ev[rec..rec + rlen];
                rec += rlen;
                // header (4) + fsid (8) + file_handle (8 + handle_bytes) [+ name NUL]
                if r.len() < 20 {
                    continue;
                }
                let hb = u32::from_ne_bytes([r[12], r[13], r[14], r[15]]) as usize;
                if 20 + hb > r.len() {
                    continue;
                }
                let mut fsid = [0u8; 8];
                fsid.copy_from_slice(&r[4..12]);
                let handle = r[12..20 + hb].to_vec();
                match info_type {
                    libc::FAN_EVENT_INFO_TYPE_DFID_NAME => {
                        let name_bytes = &r[20 + hb..];
                        let end = name_bytes
                            .iter()
                            .position(|&c| c == 0)
                            .unwrap_or(name_bytes.len());
                        let name = name_bytes[..end].to_vec();
                        let name = if name.is_empty() || name == b"." {
                            None
                        } else {
                            Some(name)
                        };
                        target = Some((fsid, handle, name));
                    }
                    libc::FAN_EVENT_INFO_TYPE_DFID if target.is_none() => {
                        target = Some((fsid, handle, None));
                    }
                    libc::FAN_EVENT_INFO_TYPE_FID => object = Some((fsid, handle)),
                    _ => {}
                }
            }
            // The directory the event names, resolved once (memoised by handle: events in
            // directories elsewhere on the file system cost one resolution per directory).
            let (dirs, unknown) = match &target {
                Some((fsid, handle, _)) => self.resolve(fsid, handle),
                None => (Vec::new(), true),
            };
            if is_dir && entry_ev && (unknown || !dirs.is_empty()) {
                // A directory below the root appeared, disappeared or moved: the fd cache's
                // paths may be wrong now.
                structural = true;
                if m.mask & (libc::FAN_MOVED_FROM | libc::FAN_MOVED_TO) != 0 {
                    // Moved out of, into or within the root: memoised handle paths below it
                    // (or outside, for a tree moved in) are wrong. A move between two
                    // directories outside the root changes no directory's path below it,
                    // and a created or removed directory no other directory's.
                    self.handles.clear();
                }
            }
            // Skipped only now: our own directory moves must still empty the handle map, or
            // later events from others would be reported under the directory's old path.
            if own_thread {
                continue;
            }
            let Some((_, _, name)) = target else {
                // No directory and name: a change of a file's inode that named no path (the
                // link count, after `ln` or `rm` of another name). Every name of the inode
                // may show it: reported by inode, if a name below the root may show it.
                if let Some((fsid, h)) = object.filter(|_| !is_dir) {
                    self.link_count_changed(&fsid, &h, out);
                }
                continue;
            };
            if !is_dir && dirs.is_empty() {
                self.outside_file_event(object.as_ref(), out);
            }
            // A write the front end let a thread make on a file (FUSE passthrough), and
            // nothing else: marked as its own (`own.rs`). Only a FAN_MODIFY alone, by a
            // registered thread, on its registered file (the object's own id): an event of
            // any other thread or file, or merged with another kind, is not.
            let own_write = m.mask & (FAN_MASK | libc::FAN_Q_OVERFLOW) == libc::FAN_MODIFY
                && match (&self.own, &object) {
                    (Some(own), Some(obj)) => own.is_own(m.pid, obj),
                    _ => false,
                };
            // An attribute or data change of a file below the root is also reported by inode
            // (if served): the path names the file as the event was read, and a rename through
            // the front end made before the report is applied moves the name the report
            // names (the report then finds nothing there, and the kernel kept the file's old
            // pages and attributes under its new name for good: `torture.rs` seed 310).
            let by_inode = !entry_ev && !is_dir && !own_write && !dirs.is_empty();
            for dir in dirs {
                let path = match &name {
                    Some(n) => {
                        let mut p = dir;
                        if !p.is_empty() {
                            p.push(b'/');
                        }
                        p.extend_from_slice(n);
                        p
                    }
                    None => dir,
                };
                if entry_ev {
                    out.push(Change::Entry { path });
                } else {
                    if own_write {
                        if let Some(own) = &self.own {
                            own.mark(&path);
                        }
                    }
                    out.push(Change::Attr { path });
                }
            }
            if by_inode {
                if let Some((fsid, h)) = &object {
                    self.link_count_changed(fsid, h, out);
                }
            }
        }
        structural
    }
}

// ---------------------------------------------------------------------------------------------
// inotify

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};

struct Ino {
    ino: Inotify,
    /// The backend root (O_PATH); directories are opened beneath it with openat2.
    root: OwnedFd,
    /// watch -> directory path relative to the root.
    wds: HashMap<WatchDescriptor, Vec<u8>>,
    /// MOVED_FROM of a directory waiting for its MOVED_TO: cookie -> old path.
    moves: HashMap<u32, Vec<u8>>,
    /// Watches on the hard-linked files the backend answered about (`links.rs`): a link
    /// count change is reported on the inode only, not to the directories' watches.
    links: Arc<crate::links::Links>,
}

fn ino_mask() -> AddWatchFlags {
    AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_ONLYDIR
}

fn jn(dir: &[u8], name: &[u8]) -> Vec<u8> {
    crate::join(dir, name)
}

impl Ino {
    fn new(b: &LocalBackend) -> Result<Ino> {
        let ino = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK)
            .map_err(|e| Error::from_errno(e as i32))?;
        let mut me = Ino {
            ino,
            root: b.root.try_clone().map_err(Error::from)?,
            wds: HashMap::new(),
            moves: HashMap::new(),
            links: Arc::new(crate::links::Links::new()?),
        };
        me.add_tree(Vec::new(), &mut Vec::new())?;
        b.add_links(&me.links);
        Ok(me)
    }

    /// Watch `rel` and every directory below it. Entries found below a directory that
    /// appeared after the fact are reported in `found` (they may predate the watch).
    ///
    /// Each directory is opened with openat2 beneath the root (no symlinks), and the watch is
    /// added through `/proc/self/fd/N`, so a symlink swapped into the path can never make us
    /// watch something outside the root. The descriptor is closed right away.
    fn add_tree(&mut self, rel: Vec<u8>, found: &mut Vec<Change>) -> Result<()> {
        use rustix::fs::{Mode, OFlags};
        let mut stack = vec![rel];
        let top = stack[0].clone();
        let mut buf = vec![std::mem::MaybeUninit::<u8>::uninit(); 32 * 1024];
        while let Some(dir) = stack.pop() {
            let mut p = dir.clone();
            if !p.is_empty() {
                p.push(b'/');
            }
            p.push(b'.');
            let fd = match rustix::fs::openat2(
                &self.root,
                &p[..],
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
                crate::RESOLVE,
            ) {
                Ok(fd) => fd,
                Err(e) if top.is_empty() && dir.is_empty() => {
                    return Err(Error::from_errno(e.raw_os_error()))
                }
                Err(_) => continue, // vanished, or not a directory any more
            };
            let proc_path = format!("/proc/self/fd/{}", fd.as_raw_fd());
            let wd = match self.ino.add_watch(proc_path.as_str(), ino_mask()) {
                Ok(wd) => wd,
                Err(e) if top.is_empty() && dir.is_empty() => {
                    return Err(Error::from_errno(e as i32))
                }
                Err(e) => {
                    tracing::warn!("dircache-local: inotify watch failed: {e}");
                    continue;
                }
            };
            self.wds.insert(wd, dir.clone());
            let mut it = rustix::fs::RawDir::new(&fd, &mut buf);
            while let Some(Ok(ent)) = it.next() {
                let name = ent.file_name().to_bytes();
                if name == b"." || name == b".." {
                    continue;
                }
                let child = jn(&dir, name);
                if !top.is_empty() {
                    found.push(Change::Entry {
                        path: child.clone(),
                    });
                }
                let is_dir = match ent.file_type() {
                    rustix::fs::FileType::Directory => true,
                    rustix::fs::FileType::Unknown => rustix::fs::statx(
                        &fd,
                        name,
                        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
                        rustix::fs::StatxFlags::TYPE,
                    )
                    .map(|s| u32::from(s.stx_mode) & libc::S_IFMT == libc::S_IFDIR)
                    .unwrap_or(false),
                    _ => false,
                };
                if is_dir {
                    stack.push(child);
                }
            }
        }
        Ok(())
    }

    fn remove_tree(&mut self, rel: &[u8]) {
        let gone: Vec<WatchDescriptor> = self
            .wds
            .iter()
            .filter(|(_, p)| under(p, rel))
            .map(|(wd, _)| *wd)
            .collect();
        for wd in gone {
            self.wds.remove(&wd);
            let _ = self.ino.rm_watch(wd);
        }
    }

    fn rename_tree(&mut self, old: &[u8], new: &[u8]) {
        for p in self.wds.values_mut() {
            if under(p, old) {
                let mut n = new.to_vec();
                n.extend_from_slice(&p[old.len()..]);
                *p = n;
            }
        }
    }

    fn read(&mut self, out: &mut Vec<Change>) -> bool {
        use std::os::unix::ffi::OsStrExt;
        self.links.read(out);
        let mut structural = false;
        loop {
            let evs = match self.ino.read_events() {
                Ok(e) if !e.is_empty() => e,
                _ => break,
            };
            for ev in evs {
                if ev.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                    out.push(Change::Overflow);
                    structural = true;
                    // Directories made or moved while events were lost have no watch, and
                    // mapped paths may be stale: map every directory again (adding a watch
                    // to a watched directory returns its existing descriptor). Watches of
                    // directories that left the root stay unmapped, so they are ignored.
                    self.wds.clear();
                    self.moves.clear();
                    if let Err(e) = self.add_tree(Vec::new(), &mut Vec::new()) {
                        tracing::warn!("dircache-local: inotify rescan failed: {e}");
                    }
                    continue;
                }
                if ev.mask.contains(AddWatchFlags::IN_IGNORED) {
                    self.wds.remove(&ev.wd);
                    continue;
                }
                let Some(dir) = self.wds.get(&ev.wd).cloned() else {
                    continue;
                };
                let path = match &ev.name {
                    Some(n) => jn(&dir, n.as_bytes()),
                    None => dir.clone(),
                };
                let is_dir = ev.mask.contains(AddWatchFlags::IN_ISDIR);
                let m = ev.mask;
                if m.intersects(AddWatchFlags::IN_ATTRIB | AddWatchFlags::IN_MODIFY) {
                    out.push(Change::Attr { path });
                    continue;
                }
                out.push(Change::Entry { path: path.clone() });
                if !is_dir {
                    continue;
                }
                structural = true;
                if m.contains(AddWatchFlags::IN_CREATE) {
                    let mut found = Vec::new();
                    let _ = self.add_tree(path, &mut found);
                    out.extend(found);
                } else if m.contains(AddWatchFlags::IN_DELETE) {
                    self.remove_tree(&path);
                } else if m.contains(AddWatchFlags::IN_MOVED_FROM) {
                    self.moves.insert(ev.cookie, path);
                } else if m.contains(AddWatchFlags::IN_MOVED_TO) {
                    match self.moves.remove(&ev.cookie) {
                        Some(old) => self.rename_tree(&old, &path),
                        None => {
                            let mut found = Vec::new();
                            let _ = self.add_tree(path, &mut found);
                            out.extend(found);
                        }
                    }
                }
            }
            // A MOVED_FROM whose MOVED_TO did not arrive in the same batch left the root.
            let left: Vec<Vec<u8>> = self.moves.drain().map(|(_, p)| p).collect();
            for p in left {
                self.remove_tree(&p);
            }
        }
        structural
    }
}

fn under(p: &[u8], dir: &[u8]) -> bool {
    p == dir || (p.len() > dir.len() && p.starts_with(dir) && p[dir.len()] == b'/')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An overflow (events lost) is reported as such, whatever the filter remembers, and
    /// empties what it remembers.
    #[test]
    fn an_overflow_is_reported_and_forgets_resolutions() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            // Under CI a test that cannot run fails (as `tests/common`'s `cannot_run`).
            assert!(std::env::var_os("CI").is_none(), "fanotify needs root");
            eprintln!("*** SKIPPED: fanotify needs root; this test did NOT run ***");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let b = LocalBackend::with_options(d.path(), 16, WatchMode::Fanotify).unwrap();
        let mut fan = Fan::new(&b).unwrap();
        fan.handles.insert((1, vec![1, 2, 3]), None);
        let meta = libc::fanotify_event_metadata {
            event_len: std::mem::size_of::<libc::fanotify_event_metadata>() as u32,
            vers: libc::FANOTIFY_METADATA_VERSION,
            reserved: 0,
            metadata_len: std::mem::size_of::<libc::fanotify_event_metadata>() as u16,
            mask: libc::FAN_Q_OVERFLOW,
            fd: libc::FAN_NOFD,
            pid: 0,
        };
        // SAFETY: the metadata is plain old data; we view its bytes.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&meta as *const libc::fanotify_event_metadata).cast::<u8>(),
                std::mem::size_of_val(&meta),
            )
        };
        let mut out = Vec::new();
        assert!(fan.parse(bytes, &mut out), "an overflow is structural");
        assert_eq!(out, vec![Change::Overflow]);
        assert!(fan.handles.is_empty());
    }

    #[test]
    fn mountinfo_lines_below_the_root() {
        let text = b"22 1 8:1 / / rw - ext4 /dev/sda1 rw\n\
            30 22 0:40 / /srv/src/n rw shared:5 - tmpfs t rw\n\
            34 30 0:50 / /srv/src/n/user rw,nosuid - fuse.sshfs u@h: rw\n\
            31 30 0:41 / /srv/src/n/deep\\040x rw - tmpfs t rw\n\
            32 22 8:1 /other /srv/src2 rw - ext4 /dev/sda1 rw\n\
            33 22 8:1 /other /srv/src rw - ext4 /dev/sda1 rw\n";
        assert_eq!(
            mounts_below(text, b"/srv/src"),
            vec![(30, b"n".to_vec()), (31, b"n/deep x".to_vec())]
        );
        assert_eq!(mounts_below(text, b"/").len(), 4);
        assert_eq!(unescape_mountinfo(b"a\\011b\\\\"), b"a\tb\\\\".to_vec());
    }
}
