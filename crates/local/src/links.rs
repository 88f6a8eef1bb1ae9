//! Watches on hard-linked files, for the inotify change feed (`watch.rs`).
//!
//! The inotify feed watches directories, which report changes made through the names in
//! them. A change of a file's link count is reported on the inode alone, with no directory
//! and no name (the kernel's `fsnotify_link_count`: `fsnotify_inode(inode, FS_ATTRIB)`, no
//! parent notified): `rm` of one name of a hard-linked file, or a rename over it, tells
//! the directory watch only that the name went, and what its other names show (the link
//! count, the ctime) changes unreported. fanotify's filesystem mark sees such events (by
//! inode, `Change::Inode`); inotify only through a watch on the file itself.
//!
//! So while an inotify feed runs, every non-directory, non-symlink with more than one link
//! that the backend answers about gets a watch of its own (`IN_ATTRIB`, `IN_MODIFY`,
//! `IN_MOVE_SELF`) in a second inotify instance, and its events are reported as
//! `Change::Inode`: link count changes, and changes made through names outside the root.
//! The watch is added before the answer leaves the backend (the answer is the file's
//! attributes taken after the watch was added, so no change falls between them), once per
//! inode; the kernel drops it when the file's last name goes (`IN_IGNORED`).
//!
//! Limits: at most [`CAP`] files are watched (each watch pins its inode in the kernel's
//! inode cache and counts against `fs.inotify.max_user_watches`, with the directories);
//! beyond, hard-linked files are served unwatched (logged once). A watch needs read
//! permission on the file (inotify's rule): a hard-linked file the server's user may not
//! read is not watched. A symlink with several links is not watched. A file that gets its
//! second link later is watched from the next time the backend answers about it (the feed
//! reports the new name, and the servers' `linked_inode` asks about it at once).

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

use dircache_core::{Attr, Change, Error, FileType, Result};
use parking_lot::Mutex;
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};

/// Files watched at most.
pub(crate) const CAP: usize = 16_384;

/// The events of a watched file that are reported (by inode).
fn mask() -> WatchFlags {
    WatchFlags::ATTRIB | WatchFlags::MODIFY | WatchFlags::MOVE_SELF
}

/// Whether a file with these attributes is watched: not a directory (reported by path), not
/// a symlink, more than one link.
pub(crate) fn wanted(a: &Attr) -> bool {
    a.nlink > 1 && !a.is_dir() && a.kind() != FileType::Symlink
}

#[derive(Default)]
struct Watched {
    /// watch descriptor -> (dev, ino).
    wds: HashMap<i32, (u64, u64)>,
    /// The inodes in `wds`.
    inodes: HashSet<(u64, u64)>,
}

/// One inotify instance holding the watches of hard-linked files; shared by the backend
/// (which adds watches) and the feed's thread (which reads them).
pub(crate) struct Links {
    fd: OwnedFd,
    watched: Mutex<Watched>,
    /// Whether [`CAP`] was reached and logged.
    full: AtomicBool,
}

impl Links {
    pub(crate) fn new() -> Result<Links> {
        let fd = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK)
            .map_err(|e| Error::from_errno(e.raw_os_error()))?;
        Ok(Links {
            fd,
            watched: Mutex::default(),
            full: AtomicBool::new(false),
        })
    }

    /// The instance's descriptor, readable when events wait.
    pub(crate) fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Watch the file `a` describes, if [`wanted`] and not watched yet; `open` gives an
    /// `O_PATH` descriptor of it (at the name `a` was taken from). Returns the attributes to
    /// answer with: taken again after the watch was added when it was, else `a`.
    pub(crate) fn watch(&self, a: Attr, open: impl FnOnce() -> Option<OwnedFd>) -> Attr {
        if !wanted(&a) {
            return a;
        }
        let key = (a.dev, a.ino);
        let mut w = self.watched.lock();
        if w.inodes.contains(&key) {
            return a;
        }
        if w.inodes.len() >= CAP {
            if !self.full.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "dircache-local: {CAP} hard-linked files watched: more are not (a change \
                     of their link count through another name goes unreported)"
                );
            }
            return a;
        }
        let Some(fd) = open() else {
            return a;
        };
        // The name may name another file by now: watch only the one answered about.
        match crate::statx_fd(fd.as_fd()) {
            Ok(b) if (b.dev, b.ino) == key => {}
            _ => return a,
        }
        let proc_path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        let wd = match inotify::add_watch(&self.fd, proc_path.as_str(), mask()) {
            Ok(wd) => wd,
            Err(e) => {
                tracing::debug!("dircache-local: no watch on a hard-linked file: {e}");
                return a;
            }
        };
        w.wds.insert(wd, key);
        w.inodes.insert(key);
        drop(w);
        match crate::statx_fd(fd.as_fd()) {
            Ok(b) if (b.dev, b.ino) == key => b,
            _ => a,
        }
    }

    /// Read the pending events: `Change::Inode` for each watched file's event,
    /// `Change::Overflow` if the kernel lost some.
    pub(crate) fn read(&self, out: &mut Vec<Change>) {
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
        let mut r = inotify::Reader::new(&self.fd, &mut buf);
        loop {
            let ev = match r.next() {
                Ok(ev) => ev,
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => return, // WOULDBLOCK: nothing more for now
            };
            let flags = ev.events();
            if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
                out.push(Change::Overflow);
                continue;
            }
            let mut w = self.watched.lock();
            let Some(&(dev, ino)) = w.wds.get(&ev.wd()) else {
                continue;
            };
            if flags.contains(ReadFlags::IGNORED) {
                w.wds.remove(&ev.wd());
                w.inodes.remove(&(dev, ino));
                continue;
            }
            out.push(Change::Inode { dev, ino });
        }
    }
}
