//! An in-memory backend, for unit tests and for mounting through FUSE (the proof that the front
//! end reaches storage only through [`Backend`]: crates/fuse runs its POSIX tests on one).
//!
//! [`MemoryBackend`] keeps a tree of inodes behind one mutex and answers every [`Backend`]
//! method with Linux's semantics for the common cases: inode numbers, modes, owners, link counts
//! (including hard links and directory `..` links), symbolic links, timestamps, the three rename
//! modes, and the errno Linux gives (ENOENT, ENOTDIR, EISDIR, EEXIST, ENOTEMPTY, EINVAL, EBUSY,
//! EPERM, EACCES, ELOOP for a symlink in a non-final component, ENAMETOOLONG).
//!
//! Regular files have data: one memfd each. [`Backend::open`] gives a [`MemFile`] per open:
//! a new open file description of the memfd for the data, the tree for the attributes (also
//! after the file was unlinked: see `memory/file.rs`); see `memory/content.rs` for how the
//! tree's attributes and the memfd's are kept in agreement. No extended attributes (the POSIX ACL names are absent), no
//! data for fifos, sockets and devices. [`MemoryBackend::applying_umask`] makes creations apply
//! the calling thread's umask, as a kernel file system does (the FUSE front end relies on it).
//!
//! Mutations are checked like the kernel checks a `*at` syscall made by the caller relative to
//! the parent directory (as the local backend has the kernel check them): search permission on
//! the parent (not on its ancestors: the cache checks those itself), write+search on the
//! parent, the sticky-bit rule, only the owner or root may chmod or set explicit times, only root
//! may change the owner, the owner may change the group only to one of his groups, CAP_MKNOD for
//! devices, protected hard links. New files belong to the caller (group from a setgid parent).
//! Queries (lookup, getattr, readdir, readlink) are not checked: the cache does that itself.
//!
//! Tests change the tree "behind the cache's back" by calling the same `Backend` methods on the
//! same object (usually with [`Cred::root`]). [`MemoryBackend::calls`] counts every call made.
//! [`MemoryBackend::with_watch`] makes `watch()` return a feed reporting every mutation.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::{
    Attr, Backend, BackendFile, Change, ChangeFeed, Cred, DirEntry, Error, FileType, RenameMode,
    Result, SetAttr, StatFs, TimeSet, Timespec, Walked, XattrTarget, NAME_MAX, PATH_MAX,
    XATTR_UNSUPPORTED,
};

/// Device number reported for every inode.
pub const MEMORY_DEV: u64 = 0x4d45;
/// Inode number of the root directory.
pub const ROOT_INO: u64 = 1;

const S_IFMT: u32 = libc::S_IFMT;
const S_ISUID: u32 = libc::S_ISUID;
const S_ISGID: u32 = libc::S_ISGID;
const S_ISVTX: u32 = libc::S_ISVTX;
/// The kernel's __FMODE_EXEC, which FUSE passes in the open flags of an execve.
const FMODE_EXEC: i32 = 0x20;

mod content;
mod file;
use content::Content;
pub use file::MemFile;

enum Data {
    Dir(BTreeMap<Vec<u8>, u64>),
    Symlink(Vec<u8>),
    /// A regular file: its memfd once it has needed one (see `content`).
    File(Option<Content>),
    Other,
}

struct Inode {
    attr: Attr,
    data: Data,
    /// Open files ([`MemFile`]) of this inode: an inode whose last name goes while one is
    /// open stays (link count 0, in no directory: an orphan) until the last one is dropped.
    opens: u32,
}

struct Tree {
    inodes: HashMap<u64, Inode>,
    next_ino: u64,
    last_time: Timespec,
}

/// An in-memory [`Backend`] for unit tests. See the module documentation.
pub struct MemoryBackend {
    /// Shared with the open files ([`MemFile`]), which answer from the tree.
    tree: Arc<Mutex<Tree>>,
    calls: AtomicU64,
    watch_enabled: bool,
    /// Apply the calling thread's umask to created modes, as a kernel file system does.
    umask: bool,
    feeds: Feeds,
}

impl Default for MemoryBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBackend")
            .field("inodes", &self.tree.lock().inodes.len())
            .finish()
    }
}

fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0)
    {
        return Err(Error::Invalid);
    }
    if name.len() > NAME_MAX {
        return Err(Error::NameTooLong);
    }
    Ok(())
}

/// The components of a backend path. Its length is not limited (PATH_MAX bounds a syscall's
/// path argument, not depth); each component is checked.
fn components(path: &[u8]) -> Result<Vec<&[u8]>> {
    if path.is_empty() {
        return Ok(Vec::new());
    }
    let v: Vec<&[u8]> = path.split(|&b| b == b'/').collect();
    for c in &v {
        check_name(c)?;
    }
    Ok(v)
}

fn split(path: &[u8]) -> Result<(&[u8], &[u8])> {
    components(path)?;
    if path.is_empty() {
        return Err(Error::Busy);
    }
    Ok(match path.iter().rposition(|&b| b == b'/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (&b""[..], path),
    })
}

/// Linux's generic_permission for mode bits (no ACLs); root overrides except exec of files
/// without any x bit.
fn permitted(cred: &Cred, a: &Attr, mask: u32) -> bool {
    if cred.is_root() {
        return mask & 1 == 0 || a.kind() == FileType::Directory || a.mode & 0o111 != 0;
    }
    let bits = if cred.uid == a.uid {
        (a.mode >> 6) & 7
    } else if cred.in_group(a.gid) {
        (a.mode >> 3) & 7
    } else {
        a.mode & 7
    };
    bits & mask == mask
}

fn owner_or_root(cred: &Cred, a: &Attr) -> bool {
    cred.is_root() || cred.uid == a.uid
}

impl Tree {
    fn now(&mut self) -> Timespec {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let mut t = Timespec {
            sec: d.as_secs() as i64,
            nsec: d.subsec_nanos(),
        };
        // Strictly increasing, so every change is visible in the timestamps.
        if t <= self.last_time {
            t = self.last_time;
            t.nsec += 1;
            if t.nsec >= 1_000_000_000 {
                t.sec += 1;
                t.nsec = 0;
            }
        }
        self.last_time = t;
        t
    }

    fn get(&self, ino: u64) -> Result<&Inode> {
        self.inodes.get(&ino).ok_or(Error::Stale)
    }

    fn get_mut(&mut self, ino: u64) -> Result<&mut Inode> {
        self.inodes.get_mut(&ino).ok_or(Error::Stale)
    }

    fn children(&self, ino: u64) -> Result<&BTreeMap<Vec<u8>, u64>> {
        match &self.get(ino)?.data {
            Data::Dir(m) => Ok(m),
            _ => Err(Error::NotDir),
        }
    }

    fn children_mut(&mut self, ino: u64) -> Result<&mut BTreeMap<Vec<u8>, u64>> {
        match &mut self.get_mut(ino)?.data {
            Data::Dir(m) => Ok(m),
            _ => Err(Error::NotDir),
        }
    }

    /// Resolve a directory path (never following symlinks: a symlink component is ELOOP).
    /// No permission is checked on the way: the cache checks search permission on ancestors
    /// itself (it knows about directory references), as with the local backend.
    fn resolve_dir(&self, path: &[u8]) -> Result<u64> {
        let mut ino = ROOT_INO;
        for c in components(path)? {
            let next = *self.children(ino)?.get(c).ok_or(Error::NotFound)?;
            match self.get(next)?.attr.kind() {
                FileType::Directory => {}
                FileType::Symlink => return Err(Error::Loop),
                _ => return Err(Error::NotDir),
            }
            ino = next;
        }
        Ok(ino)
    }

    /// The parent directory of `path` and the final name. With `cred`, search permission on
    /// the parent is checked (needed to look the final name up), as a `*at` syscall relative
    /// to the parent directory does.
    fn parent<'p>(&self, path: &'p [u8], cred: Option<&Cred>) -> Result<(u64, &'p [u8])> {
        let (dir, name) = split(path)?;
        let d = self.resolve_dir(dir)?;
        if let Some(cred) = cred {
            if !permitted(cred, &self.get(d)?.attr, 1) {
                return Err(Error::Access);
            }
        }
        Ok((d, name))
    }

    fn lookup_in(&self, dir: u64, name: &[u8]) -> Result<u64> {
        self.children(dir)?
            .get(name)
            .copied()
            .ok_or(Error::NotFound)
    }

    /// The attributes of `ino`; for a regular file with content, merged with its memfd's.
    fn attr(&self, ino: u64) -> Result<Attr> {
        let n = self.get(ino)?;
        match &n.data {
            Data::File(Some(c)) => c.merge(n.attr),
            _ => Ok(n.attr),
        }
    }

    /// The content of regular file `ino`, set up (empty) if it has none yet.
    fn content(&mut self, ino: u64) -> Result<&Content> {
        let n = self.inodes.get_mut(&ino).ok_or(Error::Stale)?;
        let Data::File(slot) = &mut n.data else {
            return Err(Error::Invalid);
        };
        if slot.is_none() {
            *slot = Some(Content::new(ino, &n.attr)?);
        }
        match &self.get(ino)?.data {
            Data::File(Some(c)) => Ok(c),
            _ => Err(Error::Invalid),
        }
    }

    /// May `cred` add or remove entries of directory `dir`?
    fn may_write_dir(&self, cred: &Cred, dir: u64) -> Result<()> {
        if permitted(cred, &self.get(dir)?.attr, 3) {
            Ok(())
        } else {
            Err(Error::Access)
        }
    }

    /// The sticky-bit rule for removing/renaming `child` out of `dir`.
    fn sticky_ok(&self, cred: &Cred, dir: u64, child: u64) -> Result<()> {
        let d = self.get(dir)?.attr;
        let c = self.get(child)?.attr;
        if d.mode & S_ISVTX != 0 && !cred.is_root() && cred.uid != d.uid && cred.uid != c.uid {
            return Err(Error::Perm);
        }
        Ok(())
    }

    /// The kernel's `may_create_in_sticky`, for an O_CREAT open of the existing `child` of
    /// `dir`: in a sticky, world-writable directory, a name that neither the caller nor the
    /// directory's owner owns is EACCES (also for root, and before a final symlink's ELOOP),
    /// except regular files and FIFOs (this backend models fs.protected_regular = 0 and
    /// fs.protected_fifos = 0) and directories (EISDIR comes first).
    fn create_in_sticky_ok(&self, cred: &Cred, dir: u64, child: u64) -> Result<()> {
        let d = self.get(dir)?.attr;
        let c = self.get(child)?.attr;
        let exempt = matches!(
            c.kind(),
            FileType::Regular | FileType::Fifo | FileType::Directory
        );
        if !exempt
            && d.mode & S_ISVTX != 0
            && d.mode & 0o002 != 0
            && c.uid != d.uid
            && c.uid != cred.uid
        {
            return Err(Error::Access);
        }
        Ok(())
    }

    fn touch_dir(&mut self, dir: u64) -> Result<()> {
        let t = self.now();
        let a = &mut self.get_mut(dir)?.attr;
        a.mtime = t;
        a.ctime = t;
        Ok(())
    }

    fn touch_ctime(&mut self, ino: u64) -> Result<()> {
        let t = self.now();
        self.get_mut(ino)?.attr.ctime = t;
        Ok(())
    }

    /// Create a new inode `name` in `dir` owned by `cred`.
    fn create(
        &mut self,
        cred: &Cred,
        dir: u64,
        name: &[u8],
        mode: u32,
        rdev: u64,
        data: Data,
    ) -> Result<Attr> {
        check_name(name)?;
        // EEXIST before EACCES, as Linux (filename_create, then may_create).
        if self.children(dir)?.contains_key(name) {
            return Err(Error::Exists);
        }
        self.may_write_dir(cred, dir)?;
        let parent = self.get(dir)?.attr;
        let is_dir = mode & S_IFMT == libc::S_IFDIR;
        let mut mode = mode;
        let gid = if parent.mode & S_ISGID != 0 {
            if is_dir {
                mode |= S_ISGID;
            } else if mode & S_ISGID != 0
                && mode & 0o010 != 0
                && !cred.is_root()
                && !cred.in_group(parent.gid)
            {
                mode &= !S_ISGID;
            }
            parent.gid
        } else {
            if !is_dir
                && mode & S_ISGID != 0
                && mode & 0o010 != 0
                && !cred.is_root()
                && !cred.in_group(cred.gid)
            {
                mode &= !S_ISGID;
            }
            cred.gid
        };
        let t = self.now();
        let ino = self.next_ino;
        self.next_ino += 1;
        let size = match &data {
            Data::Symlink(target) => target.len() as u64,
            Data::Dir(_) => 4096,
            Data::File(_) | Data::Other => 0,
        };
        let attr = Attr {
            ino,
            dev: MEMORY_DEV,
            mode,
            nlink: if is_dir { 2 } else { 1 },
            uid: cred.uid,
            gid,
            rdev,
            size,
            blocks: if is_dir { 8 } else { 0 },
            blksize: 4096,
            atime: t,
            mtime: t,
            ctime: t,
            birth: 0,
        };
        self.inodes.insert(
            ino,
            Inode {
                attr,
                data,
                opens: 0,
            },
        );
        self.children_mut(dir)?.insert(name.to_vec(), ino);
        if is_dir {
            self.get_mut(dir)?.attr.nlink += 1;
        }
        self.touch_dir(dir)?;
        Ok(attr)
    }

    /// Drop one link of `ino`, freeing it when none remain.
    fn drop_link(&mut self, ino: u64) -> Result<()> {
        let a = &mut self.get_mut(ino)?.attr;
        if a.kind() == FileType::Directory {
            a.nlink = 0;
        } else {
            a.nlink = a.nlink.saturating_sub(1);
        }
        if a.nlink == 0 {
            if self.get(ino)?.opens > 0 {
                // Open: an orphan until its last open file goes (`MemFile`'s drop).
                self.touch_ctime(ino)?;
            } else {
                self.inodes.remove(&ino);
            }
        } else {
            self.touch_ctime(ino)?;
        }
        Ok(())
    }

    /// Whether directory `anc` is `ino` or one of its ancestors (walks down from `anc`).
    fn is_ancestor(&self, anc: u64, ino: u64) -> bool {
        if anc == ino {
            return true;
        }
        let mut stack = vec![anc];
        while let Some(d) = stack.pop() {
            if let Ok(ch) = self.children(d) {
                for &c in ch.values() {
                    if c == ino {
                        return true;
                    }
                    if matches!(self.get(c).map(|n| &n.data), Ok(Data::Dir(_))) {
                        stack.push(c);
                    }
                }
            }
        }
        false
    }

    /// rename(2)/renameat2(2), with the checks in the order Linux makes them
    /// (do_renameat2, then vfs_rename with may_delete/may_create, then the file system).
    fn rename(&mut self, cred: &Cred, old: &[u8], new: &[u8], mode: RenameMode) -> Result<()> {
        let (od, oname) = self.parent(old, Some(cred))?;
        let (nd, nname) = self.parent(new, Some(cred))?;
        let src = self.lookup_in(od, oname)?;
        let dst = match self.lookup_in(nd, nname) {
            Ok(i) => Some(i),
            Err(Error::NotFound) => None,
            Err(e) => return Err(e),
        };
        match mode {
            // No character devices for whiteouts here (as a file system without them).
            RenameMode::Whiteout | RenameMode::WhiteoutNoReplace => return Err(Error::Invalid),
            RenameMode::NoReplace if dst.is_some() => return Err(Error::Exists),
            RenameMode::Exchange if dst.is_none() => return Err(Error::NotFound),
            _ => {}
        }
        let sa = self.attr(src)?;
        let src_dir = sa.kind() == FileType::Directory;
        // lock_rename's "trap": the source may not be an ancestor of the new parent, the
        // target not an ancestor of the old parent.
        if od != nd {
            if src_dir && self.is_ancestor(src, nd) {
                return Err(Error::Invalid);
            }
            if let Some(d) = dst {
                if self.is_ancestor(d, od) {
                    return Err(if mode == RenameMode::Exchange {
                        Error::Invalid
                    } else {
                        Error::NotEmpty
                    });
                }
            }
        }
        if dst == Some(src) {
            return Ok(()); // same inode: nothing to do (rename(2) semantics)
        }
        // may_delete(old_dir, source)
        self.may_write_dir(cred, od)?;
        self.sticky_ok(cred, od, src)?;
        let dst_dir = match dst {
            None => {
                // may_create(new_dir)
                self.may_write_dir(cred, nd)?;
                false
            }
            Some(d) => {
                let dst_dir = self.attr(d)?.kind() == FileType::Directory;
                // may_delete(new_dir, target, is_dir)
                self.may_write_dir(cred, nd)?;
                self.sticky_ok(cred, nd, d)?;
                let is_dir = if mode == RenameMode::Exchange {
                    dst_dir
                } else {
                    src_dir
                };
                if is_dir && !dst_dir {
                    return Err(Error::NotDir);
                }
                if !is_dir && dst_dir {
                    return Err(Error::IsDir);
                }
                dst_dir
            }
        };
        // A directory that changes parent gets a new "..": write permission on it needed.
        if od != nd {
            if src_dir && !permitted(cred, &sa, 2) {
                return Err(Error::Access);
            }
            if let (RenameMode::Exchange, Some(d), true) = (mode, dst, dst_dir) {
                if !permitted(cred, &self.attr(d)?, 2) {
                    return Err(Error::Access);
                }
            }
        }
        if let (RenameMode::Replace | RenameMode::NoReplace, Some(d), true) = (mode, dst, dst_dir) {
            if !self.children(d)?.is_empty() {
                return Err(Error::NotEmpty);
            }
        }
        // All checks passed: apply.
        match (mode, dst) {
            (RenameMode::Exchange, Some(d)) => {
                let dst_dir = self.attr(d)?.kind() == FileType::Directory;
                self.children_mut(od)?.insert(oname.to_vec(), d);
                self.children_mut(nd)?.insert(nname.to_vec(), src);
                if od != nd && src_dir != dst_dir {
                    let (from, to) = if src_dir { (od, nd) } else { (nd, od) };
                    self.get_mut(from)?.attr.nlink -= 1;
                    self.get_mut(to)?.attr.nlink += 1;
                }
                self.touch_ctime(d)?;
            }
            (_, dst) => {
                self.children_mut(od)?.remove(oname);
                if let Some(d) = dst {
                    if self.attr(d)?.kind() == FileType::Directory {
                        self.get_mut(nd)?.attr.nlink -= 1;
                    }
                    self.drop_link(d)?;
                }
                self.children_mut(nd)?.insert(nname.to_vec(), src);
                if src_dir && od != nd {
                    self.get_mut(od)?.attr.nlink -= 1;
                    self.get_mut(nd)?.attr.nlink += 1;
                }
            }
        }
        self.touch_ctime(src)?;
        self.touch_dir(od)?;
        self.touch_dir(nd)?;
        Ok(())
    }

    fn setattr(&mut self, cred: &Cred, ino: u64, set: &SetAttr) -> Result<()> {
        self.setattr_as(cred, ino, set, false)
    }

    /// `setattr`; `opened_for_writing`: `cred` truncates through a file it opened for
    /// writing (ftruncate), which needs no write permission now.
    fn setattr_as(
        &mut self,
        cred: &Cred,
        ino: u64,
        set: &SetAttr,
        opened_for_writing: bool,
    ) -> Result<()> {
        let a = self.attr(ino)?;
        let kind = a.kind();
        // Check everything before changing anything.
        if let Some(uid) = set.uid {
            if !cred.is_root() && (uid != a.uid || cred.uid != a.uid) {
                return Err(Error::Perm);
            }
        }
        if let Some(gid) = set.gid {
            if !cred.is_root() && (cred.uid != a.uid || (gid != a.gid && !cred.in_group(gid))) {
                return Err(Error::Perm);
            }
        }
        if set.mode.is_some() {
            if kind == FileType::Symlink {
                return Err(Error::Os(libc::EOPNOTSUPP));
            }
            if !owner_or_root(cred, &a) {
                return Err(Error::Perm);
            }
        }
        if set.size.is_some() {
            match kind {
                FileType::Directory => return Err(Error::IsDir),
                FileType::Regular => {}
                _ => return Err(Error::Invalid),
            }
            if !opened_for_writing && !permitted(cred, &a, 2) {
                return Err(Error::Access);
            }
        }
        // utimensat: both UTIME_NOW is a "touch" (owner, or write permission: EACCES);
        // anything else that sets a time (explicit, or NOW next to OMIT) needs ownership
        // (EPERM), as Linux's vfs_utimes/setattr_prepare.
        let touch = set.atime == Some(TimeSet::Now) && set.mtime == Some(TimeSet::Now);
        if touch {
            if !owner_or_root(cred, &a) && !permitted(cred, &a, 2) {
                return Err(Error::Access);
            }
        } else if (set.atime.is_some() || set.mtime.is_some()) && !owner_or_root(cred, &a) {
            return Err(Error::Perm);
        }
        let t = self.now();
        let pick = |s: Option<TimeSet>| match s {
            None => None,
            Some(TimeSet::Now) => Some(t),
            Some(TimeSet::At(x)) => Some(x),
        };
        let has_content = matches!(self.get(ino)?.data, Data::File(Some(_)));
        if has_content || set.size.is_some_and(|s| s > 0) {
            // The data half lives in the memfd (see `content`): size and times go there.
            let c = self.content(ino)?;
            if let Some(size) = set.size {
                c.resize(size, t)?;
            }
            c.set_times(pick(set.atime), pick(set.mtime))?;
        }
        let na = &mut self.get_mut(ino)?.attr;
        if *set == SetAttr::default() && kind != FileType::Directory {
            // Nothing to set: what the FUSE kernel sends (FUSE_HANDLE_KILLPRIV) when a caller
            // without CAP_FSETID writes to a set-id file, for the file system to drop the bits
            // (forced: no permission needed), as Linux's file_remove_privs; and for
            // chown(f, -1, -1), which drops them too, also root's.
            na.mode &= !S_ISUID;
            if na.mode & 0o010 != 0 {
                na.mode &= !S_ISGID;
            }
        }
        if set.uid.is_some() || set.gid.is_some() {
            na.uid = set.uid.unwrap_or(na.uid);
            na.gid = set.gid.unwrap_or(na.gid);
            if kind != FileType::Directory {
                na.mode &= !S_ISUID;
                if na.mode & 0o010 != 0 {
                    na.mode &= !S_ISGID;
                }
            }
        }
        if let Some(m) = set.mode {
            let mut m = m & 0o7777;
            if !cred.is_root() && !cred.in_group(na.gid) {
                m &= !S_ISGID;
            }
            na.mode = (na.mode & S_IFMT) | m;
        }
        if let Some(size) = set.size {
            // Truncation by someone without CAP_FSETID drops set-user-ID and (group-executable)
            // set-group-ID, as Linux's file_remove_privs.
            if !cred.is_root() {
                na.mode &= !S_ISUID;
                if na.mode & 0o010 != 0 {
                    na.mode &= !S_ISGID;
                }
            }
            na.size = size;
            na.blocks = size.div_ceil(512);
            na.mtime = t;
        }
        na.atime = pick(set.atime).unwrap_or(na.atime);
        na.mtime = pick(set.mtime).unwrap_or(na.mtime);
        na.ctime = t;
        Ok(())
    }

    /// After `cred` wrote to (or allocated in) regular file `ino`: a caller without
    /// CAP_FSETID drops its set-user-ID and (group-executable) set-group-ID bits, as Linux's
    /// file_remove_privs, moving the ctime. Returns whether the mode changed.
    fn remove_privs(&mut self, cred: &Cred, ino: u64) -> Result<bool> {
        let a = self.get(ino)?.attr;
        let setid = a.mode & S_ISUID != 0 || a.mode & (S_ISGID | 0o010) == (S_ISGID | 0o010);
        if cred.is_root() || a.kind() != FileType::Regular || !setid {
            return Ok(false);
        }
        let t = self.now();
        let na = &mut self.get_mut(ino)?.attr;
        na.mode &= !S_ISUID;
        if na.mode & 0o010 != 0 {
            na.mode &= !S_ISGID;
        }
        na.ctime = t;
        Ok(true)
    }
}

impl MemoryBackend {
    /// An empty tree: a root directory 0755 owned by root, inode [`ROOT_INO`].
    pub fn new() -> MemoryBackend {
        let mut tree = Tree {
            inodes: HashMap::new(),
            next_ino: ROOT_INO + 1,
            last_time: Timespec::default(),
        };
        let t = tree.now();
        let attr = Attr {
            ino: ROOT_INO,
            dev: MEMORY_DEV,
            mode: libc::S_IFDIR | 0o755,
            nlink: 2,
            uid: 0,
            gid: 0,
            rdev: 0,
            size: 4096,
            blocks: 8,
            blksize: 4096,
            atime: t,
            mtime: t,
            ctime: t,
            birth: 0,
        };
        tree.inodes.insert(
            ROOT_INO,
            Inode {
                attr,
                data: Data::Dir(BTreeMap::new()),
                opens: 0,
            },
        );
        MemoryBackend {
            tree: Arc::new(Mutex::new(tree)),
            calls: AtomicU64::new(0),
            watch_enabled: false,
            umask: false,
            feeds: Feeds::default(),
        }
    }

    /// Like [`MemoryBackend::new`], but `watch()` returns a feed that reports every mutation
    /// (as a backend that sees its own changes would).
    pub fn with_watch() -> MemoryBackend {
        MemoryBackend {
            watch_enabled: true,
            ..MemoryBackend::new()
        }
    }

    /// How many `Backend` calls were made so far (a `walk` counts once, as one round trip).
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Reset the call counter to zero.
    pub fn reset_calls(&self) {
        self.calls.store(0, Ordering::Relaxed);
    }

    /// Number of inodes in the tree (root included; not those of files unlinked while open).
    pub fn inode_count(&self) -> usize {
        let t = self.tree.lock();
        t.inodes.values().filter(|n| n.attr.nlink > 0).count()
    }

    /// Build directories and files quickly (as root): paths ending in `/` are directories,
    /// `name -> target` makes a symlink, anything else an empty 0644 file. Parents are created.
    /// Does not count as calls. Panics on impossible input: for test setup only.
    pub fn populate(&self, spec: &[&str]) {
        let root = Cred::root();
        let before = self.calls();
        for s in spec {
            let (path, target) = match s.split_once(" -> ") {
                Some((p, t)) => (p, Some(t)),
                None => (*s, None),
            };
            let is_dir = path.ends_with('/');
            let path = path.trim_end_matches('/');
            let mut prefix = String::new();
            let comps: Vec<&str> = path.split('/').collect();
            for (i, c) in comps.iter().enumerate() {
                if !prefix.is_empty() {
                    prefix.push('/');
                }
                prefix.push_str(c);
                let last = i + 1 == comps.len();
                let r = if !last || is_dir {
                    self.mkdir(&root, prefix.as_bytes(), 0o755).map(drop)
                } else if let Some(t) = target {
                    self.symlink(&root, t.as_bytes(), prefix.as_bytes())
                        .map(drop)
                } else {
                    self.mknod(&root, prefix.as_bytes(), libc::S_IFREG | 0o644, 0)
                        .map(drop)
                };
                match r {
                    Ok(()) | Err(Error::Exists) => {}
                    Err(e) => panic!("populate {s}: {e}"),
                }
            }
        }
        self.calls.store(before, Ordering::Relaxed);
    }

    /// This backend, applying the calling thread's umask to the modes of files it creates,
    /// as a kernel file system does (the FUSE front end sets a request thread's umask to the
    /// caller's around a creation). Default: modes are taken as given.
    pub fn applying_umask(mut self) -> MemoryBackend {
        self.umask = true;
        self
    }

    /// A new open file of inode `ino` (`t`: the locked tree) over `fd` for data.
    fn file(&self, t: &mut Tree, ino: u64, fd: Option<OwnedFd>) -> Result<MemFile> {
        let feeds = self.watch_enabled.then(|| self.feeds.clone());
        MemFile::new(&self.tree, t, ino, fd, feeds)
    }

    /// `mode` with the thread's umask applied, when this backend applies it.
    fn masked(&self, mode: u32) -> Result<u32> {
        if !self.umask {
            return Ok(mode);
        }
        Ok(mode & !(content::thread_umask()? & 0o777))
    }

    fn count(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
    }

    fn notify(&self, changes: &[Change]) {
        if self.watch_enabled {
            notify(&self.feeds, changes);
        }
    }
}

/// The senders of the change feeds `watch` gave out (shared with the open files, whose
/// changes are reported too).
type Feeds = Arc<Mutex<Vec<crossbeam_channel::Sender<Change>>>>;

/// Report `changes` on every feed; a feed whose receiver is gone is forgotten.
fn notify(feeds: &Feeds, changes: &[Change]) {
    feeds
        .lock()
        .retain(|tx| changes.iter().all(|c| tx.send(c.clone()).is_ok()));
}

fn entry(path: &[u8]) -> Change {
    Change::Entry {
        path: path.to_vec(),
    }
}

impl Backend for MemoryBackend {
    fn lookup(&self, dir: &[u8], name: &[u8]) -> Result<Attr> {
        self.count();
        check_name(name)?;
        let t = self.tree.lock();
        let d = t.resolve_dir(dir)?;
        let i = t.lookup_in(d, name)?;
        t.attr(i)
    }

    fn walk(&self, dir: &[u8], names: &[&[u8]]) -> Walked {
        self.count();
        let t = self.tree.lock();
        let mut out = Walked::default();
        if names.is_empty() {
            return out; // as the trait's default walk
        }
        let mut cur = match t.resolve_dir(dir) {
            Ok(d) => d,
            Err(e) => {
                out.error = Some(e);
                return out;
            }
        };
        for (i, name) in names.iter().enumerate() {
            let r = check_name(name)
                .and_then(|_| t.lookup_in(cur, name))
                .and_then(|i| t.attr(i));
            match r {
                Ok(a) => {
                    out.attrs.push(a);
                    if i + 1 < names.len() && !a.is_dir() {
                        // As the trait's default walk: a symlink is not followed either.
                        out.error = Some(Error::NotDir);
                        break;
                    }
                    cur = a.ino;
                }
                Err(e) => {
                    out.error = Some(e);
                    break;
                }
            }
        }
        out
    }

    fn getattr(&self, path: &[u8]) -> Result<Attr> {
        self.count();
        let t = self.tree.lock();
        if path.is_empty() {
            return t.attr(ROOT_INO);
        }
        let (d, name) = t.parent(path, None)?;
        let i = t.lookup_in(d, name)?;
        t.attr(i)
    }

    fn readdir(&self, path: &[u8], plus: bool) -> Result<Vec<DirEntry>> {
        self.count();
        let t = self.tree.lock();
        let d = t.resolve_dir(path)?;
        let mut out = Vec::new();
        for (name, &ino) in t.children(d)? {
            let a = t.attr(ino)?;
            out.push(DirEntry {
                name: name.clone(),
                kind: a.kind(),
                ino,
                attr: plus.then_some(a),
            });
        }
        Ok(out)
    }

    fn readlink(&self, path: &[u8]) -> Result<Vec<u8>> {
        self.count();
        let t = self.tree.lock();
        let (d, name) =
            t.parent(path, None)
                .map_err(|e| if e == Error::Busy { Error::Invalid } else { e })?;
        let i = t.lookup_in(d, name)?;
        match &t.get(i)?.data {
            Data::Symlink(target) => Ok(target.clone()),
            _ => Err(Error::Invalid),
        }
    }

    fn mknod(&self, cred: &Cred, path: &[u8], mode: u32, rdev: u64) -> Result<Attr> {
        self.count();
        let kind_bits = mode & S_IFMT;
        let mode = match kind_bits {
            0 => libc::S_IFREG | (mode & 0o7777),
            libc::S_IFREG | libc::S_IFIFO | libc::S_IFSOCK => mode,
            libc::S_IFCHR | libc::S_IFBLK => {
                if !cred.is_root() {
                    return Err(Error::Perm);
                }
                mode
            }
            libc::S_IFDIR => return Err(Error::Perm),
            _ => return Err(Error::Invalid),
        };
        let rdev = if matches!(mode & S_IFMT, libc::S_IFCHR | libc::S_IFBLK) {
            rdev
        } else {
            0
        };
        let a = {
            let mut t = self.tree.lock();
            let (d, name) = t.parent(path, Some(cred)).map_err(|e| {
                if e == Error::Busy {
                    Error::Exists
                } else {
                    e
                }
            })?;
            let data = if mode & S_IFMT == libc::S_IFREG {
                Data::File(None)
            } else {
                Data::Other
            };
            t.create(cred, d, name, self.masked(mode)?, rdev, data)?
        };
        self.notify(&[entry(path)]);
        Ok(a)
    }

    fn mkdir(&self, cred: &Cred, path: &[u8], mode: u32) -> Result<Attr> {
        self.count();
        let a = {
            let mut t = self.tree.lock();
            let (d, name) = t.parent(path, Some(cred)).map_err(|e| {
                if e == Error::Busy {
                    Error::Exists
                } else {
                    e
                }
            })?;
            t.create(
                cred,
                d,
                name,
                libc::S_IFDIR | self.masked(mode & 0o1777)?,
                0,
                Data::Dir(BTreeMap::new()),
            )?
        };
        self.notify(&[entry(path)]);
        Ok(a)
    }

    fn symlink(&self, cred: &Cred, target: &[u8], path: &[u8]) -> Result<Attr> {
        self.count();
        if target.is_empty() {
            return Err(Error::NotFound);
        }
        if target.len() >= PATH_MAX || target.contains(&0) {
            return Err(if target.contains(&0) {
                Error::Invalid
            } else {
                Error::NameTooLong
            });
        }
        let a = {
            let mut t = self.tree.lock();
            let (d, name) = t.parent(path, Some(cred)).map_err(|e| {
                if e == Error::Busy {
                    Error::Exists
                } else {
                    e
                }
            })?;
            t.create(
                cred,
                d,
                name,
                libc::S_IFLNK | 0o777,
                0,
                Data::Symlink(target.to_vec()),
            )?
        };
        self.notify(&[entry(path)]);
        Ok(a)
    }

    fn link(&self, cred: &Cred, old: &[u8], new: &[u8]) -> Result<Attr> {
        self.count();
        let a = {
            let mut t = self.tree.lock();
            let (od, oname) = t.parent(old, Some(cred)).map_err(|e| {
                if e == Error::Busy {
                    Error::Perm
                } else {
                    e
                }
            })?;
            let src = t.lookup_in(od, oname)?;
            let (nd, nname) = t.parent(new, Some(cred)).map_err(|e| {
                if e == Error::Busy {
                    Error::Exists
                } else {
                    e
                }
            })?;
            let sa = t.attr(src)?;
            // The kernel's order: EEXIST, protected_hardlinks (EPERM), may_create (EACCES),
            // then EPERM for a directory.
            if t.children(nd)?.contains_key(nname) {
                return Err(Error::Exists);
            }
            // fs.protected_hardlinks: the owner, or a regular non-set-id file one may read and
            // write.
            if !owner_or_root(cred, &sa) {
                let setid =
                    sa.mode & S_ISUID != 0 || sa.mode & (S_ISGID | 0o010) == (S_ISGID | 0o010);
                if sa.kind() != FileType::Regular || setid || !permitted(cred, &sa, 6) {
                    return Err(Error::Perm);
                }
            }
            t.may_write_dir(cred, nd)?;
            if sa.kind() == FileType::Directory {
                return Err(Error::Perm);
            }
            t.children_mut(nd)?.insert(nname.to_vec(), src);
            t.get_mut(src)?.attr.nlink += 1;
            t.touch_ctime(src)?;
            t.touch_dir(nd)?;
            t.attr(src)?
        };
        self.notify(&[entry(new), Change::Attr { path: old.to_vec() }]);
        Ok(a)
    }

    fn unlink(&self, cred: &Cred, path: &[u8]) -> Result<()> {
        self.count();
        {
            let mut t = self.tree.lock();
            let (d, name) = t.parent(path, Some(cred)).map_err(|e| {
                if e == Error::Busy {
                    Error::IsDir
                } else {
                    e
                }
            })?;
            let i = t.lookup_in(d, name)?;
            // may_delete's order: EACCES, sticky EPERM, then the type.
            t.may_write_dir(cred, d)?;
            t.sticky_ok(cred, d, i)?;
            if t.attr(i)?.kind() == FileType::Directory {
                return Err(Error::IsDir);
            }
            t.children_mut(d)?.remove(name);
            t.drop_link(i)?;
            t.touch_dir(d)?;
        }
        self.notify(&[entry(path)]);
        Ok(())
    }

    fn rmdir(&self, cred: &Cred, path: &[u8]) -> Result<()> {
        self.count();
        {
            let mut t = self.tree.lock();
            let (d, name) = t.parent(path, Some(cred))?;
            let i = t.lookup_in(d, name)?;
            t.may_write_dir(cred, d)?;
            t.sticky_ok(cred, d, i)?;
            if t.attr(i)?.kind() != FileType::Directory {
                return Err(Error::NotDir);
            }
            if !t.children(i)?.is_empty() {
                return Err(Error::NotEmpty);
            }
            t.children_mut(d)?.remove(name);
            t.drop_link(i)?;
            t.get_mut(d)?.attr.nlink -= 1;
            t.touch_dir(d)?;
        }
        self.notify(&[entry(path)]);
        Ok(())
    }

    fn rename(&self, cred: &Cred, old: &[u8], new: &[u8], mode: RenameMode) -> Result<()> {
        self.count();
        self.tree.lock().rename(cred, old, new, mode)?;
        self.notify(&[entry(old), entry(new)]);
        Ok(())
    }

    fn setattr(&self, cred: &Cred, path: &[u8], set: &SetAttr) -> Result<Attr> {
        self.count();
        let a = {
            let mut t = self.tree.lock();
            let ino = if path.is_empty() {
                ROOT_INO
            } else {
                let (d, name) = t.parent(path, Some(cred))?;
                t.lookup_in(d, name)?
            };
            t.setattr(cred, ino, set)?;
            t.attr(ino)?
        };
        self.notify(&[Change::Attr {
            path: path.to_vec(),
        }]);
        Ok(a)
    }

    fn statfs(&self, _path: &[u8]) -> Result<StatFs> {
        self.count();
        let n = self.tree.lock().inodes.len() as u64;
        Ok(StatFs {
            blocks: 1 << 20,
            bfree: 1 << 19,
            bavail: 1 << 19,
            files: 1 << 20,
            ffree: (1u64 << 20).saturating_sub(n),
            bsize: 4096,
            namelen: NAME_MAX as u32,
            frsize: 4096,
        })
    }

    /// Opens a regular file (creating it with O_CREAT, `mode` as for mknod): a [`MemFile`]
    /// over a new open file description of its memfd with the access mode and O_APPEND of
    /// `flags` (see `content`), whose attributes are the tree's. Checked as openat(2) by the caller relative to the parent: search
    /// permission on the parent; for a new file, write permission on it (after EEXIST for
    /// O_EXCL); for an existing one, read and/or write permission on the file as the access
    /// mode asks (write for O_TRUNC too; execute only, for an open for execve, __FMODE_EXEC),
    /// and ownership for O_NOATIME. A symbolic link is
    /// ELOOP (the final component is never followed), a directory EISDIR for writing or
    /// O_CREAT; other
    /// file types, and directories for reading, have no data here (EOPNOTSUPP).
    fn open(
        &self,
        cred: &Cred,
        path: &[u8],
        flags: i32,
        mode: u32,
    ) -> Result<Box<dyn BackendFile>> {
        self.count();
        let creat = flags & libc::O_CREAT != 0;
        let acc = flags & libc::O_ACCMODE;
        let writes = acc != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
        let mut created = false;
        let file = {
            let mut t = self.tree.lock();
            let ino = if path.is_empty() {
                ROOT_INO
            } else {
                let (d, name) = t.parent(path, Some(cred))?;
                match t.lookup_in(d, name) {
                    Ok(_) if creat && flags & libc::O_EXCL != 0 => return Err(Error::Exists),
                    Ok(i) if creat => {
                        t.create_in_sticky_ok(cred, d, i)?;
                        i
                    }
                    Ok(i) => i,
                    Err(Error::NotFound) if creat => {
                        let mode = self.masked(libc::S_IFREG | (mode & 0o7777))?;
                        created = true;
                        t.create(cred, d, name, mode, 0, Data::File(None))?.ino
                    }
                    Err(e) => return Err(e),
                }
            };
            let a = t.attr(ino)?;
            if flags & libc::O_DIRECTORY != 0 && a.kind() != FileType::Directory {
                return Err(Error::NotDir);
            }
            match a.kind() {
                FileType::Regular => {}
                FileType::Symlink => return Err(Error::Loop),
                FileType::Directory if writes || creat => return Err(Error::IsDir),
                _ => return Err(Error::NotSupported),
            }
            if !created {
                let mask = match acc {
                    // An open for execve (the FUSE kernel passes its __FMODE_EXEC): execute
                    // permission, not read.
                    libc::O_RDONLY if flags & FMODE_EXEC != 0 => 1,
                    libc::O_RDONLY => 4,
                    libc::O_WRONLY => 2,
                    _ => 6,
                } | if flags & libc::O_TRUNC != 0 { 2 } else { 0 };
                if !permitted(cred, &a, mask) {
                    return Err(Error::Access);
                }
                if flags & libc::O_NOATIME != 0 && !owner_or_root(cred, &a) {
                    return Err(Error::Perm);
                }
            }
            if flags & libc::O_TRUNC != 0 && !created {
                // As truncate(2) by the caller (setattr's rules: set-id bits dropped).
                t.setattr(
                    cred,
                    ino,
                    &SetAttr {
                        size: Some(0),
                        ..SetAttr::default()
                    },
                )?;
            }
            let fd = t.content(ino)?.reopen(flags)?;
            self.file(&mut t, ino, Some(fd))?
        };
        if created {
            self.notify(&[entry(path)]);
        } else if flags & libc::O_TRUNC != 0 {
            self.notify(&[Change::Attr {
                path: path.to_vec(),
            }]);
        }
        Ok(Box::new(file))
    }

    /// The inode `target` names, found by its number when its names are all gone
    /// (`target.open`: an orphan, kept while open), opened as [`open`](Backend::open) opens
    /// a file but without permission checks (the kernel checked the caller's own open, see
    /// the trait): a regular file's data with the access mode of `flags`; a directory, and
    /// anything with `O_PATH`, without data (attributes only; syncing it is nothing to do,
    /// as on tmpfs).
    fn open_verified(
        &self,
        _cred: &Cred,
        target: XattrTarget<'_>,
        flags: i32,
    ) -> Result<Box<dyn BackendFile>> {
        self.count();
        let mut t = self.tree.lock();
        let ino = match (target.open, target.expect) {
            (Some(_), Some((_, ino))) => ino,
            (Some(_), None) => return Err(Error::Stale),
            (None, _) if target.path.is_empty() => ROOT_INO,
            (None, _) => {
                let (d, name) = t.parent(target.path, None)?;
                t.lookup_in(d, name)?
            }
        };
        if target.expect.is_some_and(|e| e != (MEMORY_DEV, ino)) {
            return Err(Error::Stale);
        }
        let a = t.attr(ino)?;
        if flags & libc::O_DIRECTORY != 0 && a.kind() != FileType::Directory {
            return Err(Error::NotDir);
        }
        let writes = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let fd = match a.kind() {
            _ if flags & libc::O_PATH != 0 => None,
            FileType::Regular => Some(t.content(ino)?.reopen(flags)?),
            FileType::Directory if writes => return Err(Error::IsDir),
            FileType::Directory => None,
            FileType::Symlink => return Err(Error::Loop),
            _ => return Err(Error::NotSupported),
        };
        Ok(Box::new(self.file(&mut t, ino, fd)?))
    }

    /// No extended attributes (EOPNOTSUPP, as a file system without them), except that the
    /// POSIX ACL names are absent (ENODATA), as Linux treats a file system without ACLs: a
    /// FUSE front end that lets the kernel enforce ACLs (FUSE_POSIX_ACL) takes EOPNOTSUPP
    /// for an error and would refuse every chmod and create.
    fn getxattr(&self, _cred: &Cred, target: XattrTarget<'_>, name: &[u8]) -> Result<Vec<u8>> {
        self.count();
        if target.open.is_none() && !target.path.is_empty() {
            let t = self.tree.lock();
            let (d, name) = t.parent(target.path, None)?;
            t.lookup_in(d, name)?;
        }
        match name {
            b"system.posix_acl_access" | b"system.posix_acl_default" => {
                Err(Error::Os(libc::ENODATA))
            }
            _ => Err(XATTR_UNSUPPORTED),
        }
    }

    fn watch(&self) -> Result<Option<ChangeFeed>> {
        self.count();
        if !self.watch_enabled {
            return Ok(None);
        }
        let (tx, rx) = crossbeam_channel::unbounded();
        self.feeds.lock().push(tx);
        Ok(Some(rx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> Cred {
        Cred::root()
    }
    fn user(uid: u32) -> Cred {
        Cred::new(uid, uid, [])
    }
    fn sa() -> SetAttr {
        SetAttr::default()
    }

    /// Backend paths are not syscall arguments: a node 40 KiB deep has a backend path that
    /// long, and every operation on it works (only names over NAME_MAX are refused).
    #[test]
    fn backend_paths_longer_than_path_max() {
        let m = MemoryBackend::new();
        let name = [b'd'; 200];
        let mut p = Vec::new();
        for _ in 0..200 {
            if !p.is_empty() {
                p.push(b'/');
            }
            p.extend_from_slice(&name);
            m.mkdir(&root(), &p, 0o755).unwrap();
        }
        assert!(p.len() > 40_000);
        let f = [&p[..], b"/f"].concat();
        m.mknod(&root(), &f, libc::S_IFREG | 0o644, 0).unwrap();
        assert_eq!(m.lookup(&p, b"f").unwrap().kind(), FileType::Regular);
        assert_eq!(m.getattr(&f).unwrap().kind(), FileType::Regular);
        assert_eq!(m.readdir(&p, false).unwrap().len(), 1);
        let g = [&p[..], b"/g"].concat();
        m.rename(&root(), &f, &g, RenameMode::Replace).unwrap();
        m.unlink(&root(), &g).unwrap();
        assert_eq!(m.lookup(&p, &[b'x'; 256]).unwrap_err(), Error::NameTooLong);
        assert_eq!(m.getattr(&f).unwrap_err(), Error::NotFound);
    }

    #[test]
    fn memory_create_lookup_readdir() {
        let m = MemoryBackend::new();
        let d = m.mkdir(&root(), b"d", 0o755).unwrap();
        assert!(d.is_dir());
        assert_eq!(d.nlink, 2);
        assert_eq!(m.getattr(b"").unwrap().nlink, 3);
        let f = m.mknod(&root(), b"d/f", libc::S_IFREG | 0o644, 0).unwrap();
        assert_eq!(f.kind(), FileType::Regular);
        assert_eq!(m.lookup(b"d", b"f").unwrap(), f);
        assert_eq!(m.getattr(b"d/f").unwrap(), f);
        let l = m.symlink(&root(), b"../x", b"d/l").unwrap();
        assert_eq!((l.kind(), l.size), (FileType::Symlink, 4));
        assert_eq!(m.readlink(b"d/l").unwrap(), b"../x");
        assert_eq!(m.readlink(b"d/f").unwrap_err(), Error::Invalid);
        let names: Vec<_> = m
            .readdir(b"d", false)
            .unwrap()
            .into_iter()
            .map(|e| (e.name, e.kind, e.attr.is_some()))
            .collect();
        assert_eq!(
            names,
            vec![
                (b"f".to_vec(), FileType::Regular, false),
                (b"l".to_vec(), FileType::Symlink, false)
            ]
        );
        assert!(m
            .readdir(b"d", true)
            .unwrap()
            .iter()
            .all(|e| e.attr.unwrap().ino == e.ino));
        assert_eq!(m.lookup(b"d", b"nope").unwrap_err(), Error::NotFound);
        assert_eq!(m.lookup(b"d/f", b"x").unwrap_err(), Error::NotDir);
        assert_eq!(m.lookup(b"d/l", b"x").unwrap_err(), Error::Loop);
        assert_eq!(m.lookup(b"nope", b"x").unwrap_err(), Error::NotFound);
        assert_eq!(m.readdir(b"d/f", false).unwrap_err(), Error::NotDir);
        assert_eq!(m.lookup(b"", b"..").unwrap_err(), Error::Invalid);
        assert_eq!(m.lookup(b"", &[b'x'; 256]).unwrap_err(), Error::NameTooLong);
        assert_eq!(m.mkdir(&root(), b"d", 0o755).unwrap_err(), Error::Exists);
        assert_eq!(
            m.mknod(&root(), b"d/f", libc::S_IFREG, 0).unwrap_err(),
            Error::Exists
        );
        assert_eq!(
            m.mkdir(&root(), b"d/f/x", 0o755).unwrap_err(),
            Error::NotDir
        );
        assert_eq!(m.mkdir(&root(), b"", 0o755).unwrap_err(), Error::Exists);
        let w = m.walk(b"", &[b"d", b"f", b"x"]);
        assert_eq!((w.attrs.len(), w.error), (2, Some(Error::NotDir)));
        let w = m.walk(b"", &[b"d", b"nope"]);
        assert_eq!((w.attrs.len(), w.error), (1, Some(Error::NotFound)));
        let w = m.walk(b"", &[b"d", b"l", b"x"]);
        assert_eq!((w.attrs.len(), w.error), (2, Some(Error::NotDir)));
        let w = m.walk(b"d/l", &[b"x"]);
        assert_eq!((w.attrs.len(), w.error), (0, Some(Error::Loop)));
    }

    #[test]
    fn memory_calls_are_counted() {
        let m = MemoryBackend::new();
        m.populate(&["a/b/c", "a/d/", "a/l -> b"]);
        assert_eq!(m.calls(), 0);
        m.lookup(b"a", b"b").unwrap();
        m.getattr(b"a/b/c").unwrap();
        let _ = m.lookup(b"a", b"zz");
        m.walk(b"", &[b"a", b"b", b"c"]);
        assert_eq!(m.calls(), 4);
        m.reset_calls();
        assert_eq!(m.calls(), 0);
        assert_eq!(m.getattr(b"a/l").unwrap().kind(), FileType::Symlink);
        assert!(m.getattr(b"a/d").unwrap().is_dir());
    }

    #[test]
    fn memory_links_and_unlink() {
        let m = MemoryBackend::new();
        m.populate(&["d/", "f"]);
        let a = m.link(&root(), b"f", b"d/g").unwrap();
        assert_eq!(a.nlink, 2);
        assert_eq!(m.getattr(b"d/g").unwrap().ino, m.getattr(b"f").unwrap().ino);
        assert_eq!(m.link(&root(), b"d", b"d2").unwrap_err(), Error::Perm);
        assert_eq!(m.link(&root(), b"f", b"d/g").unwrap_err(), Error::Exists);
        m.unlink(&root(), b"f").unwrap();
        assert_eq!(m.getattr(b"d/g").unwrap().nlink, 1);
        assert_eq!(m.unlink(&root(), b"d").unwrap_err(), Error::IsDir);
        assert_eq!(m.rmdir(&root(), b"d/g").unwrap_err(), Error::NotDir);
        assert_eq!(m.rmdir(&root(), b"d").unwrap_err(), Error::NotEmpty);
        let n = m.inode_count();
        m.unlink(&root(), b"d/g").unwrap();
        assert_eq!(m.inode_count(), n - 1);
        m.rmdir(&root(), b"d").unwrap();
        assert_eq!(m.getattr(b"").unwrap().nlink, 2);
        assert_eq!(m.rmdir(&root(), b"").unwrap_err(), Error::Busy);
        assert_eq!(m.unlink(&root(), b"d").unwrap_err(), Error::NotFound);
    }

    #[test]
    fn memory_rename_modes() {
        let m = MemoryBackend::new();
        m.populate(&["a", "b", "d1/sub/x", "d2/", "empty/", "full/x"]);
        let ia = m.getattr(b"a").unwrap().ino;
        let ib = m.getattr(b"b").unwrap().ino;
        assert_eq!(
            m.rename(&root(), b"a", b"b", RenameMode::NoReplace)
                .unwrap_err(),
            Error::Exists
        );
        m.rename(&root(), b"a", b"b", RenameMode::Exchange).unwrap();
        assert_eq!(
            (m.getattr(b"a").unwrap().ino, m.getattr(b"b").unwrap().ino),
            (ib, ia)
        );
        assert_eq!(
            m.rename(&root(), b"a", b"zz", RenameMode::Exchange)
                .unwrap_err(),
            Error::NotFound
        );
        m.rename(&root(), b"a", b"b", RenameMode::Replace).unwrap();
        assert_eq!(m.getattr(b"b").unwrap().ino, ib);
        assert_eq!(m.getattr(b"a").unwrap_err(), Error::NotFound);
        assert_eq!(
            m.rename(&root(), b"d1", b"full", RenameMode::Replace)
                .unwrap_err(),
            Error::NotEmpty
        );
        assert_eq!(
            m.rename(&root(), b"b", b"empty", RenameMode::Replace)
                .unwrap_err(),
            Error::IsDir
        );
        assert_eq!(
            m.rename(&root(), b"empty", b"b", RenameMode::Replace)
                .unwrap_err(),
            Error::NotDir
        );
        assert_eq!(
            m.rename(&root(), b"d1", b"d1/sub/y", RenameMode::Replace)
                .unwrap_err(),
            Error::Invalid
        );
        assert_eq!(
            m.rename(&root(), b"nope", b"x", RenameMode::Replace)
                .unwrap_err(),
            Error::NotFound
        );
        // directory across parents: link counts follow
        let root_links = m.getattr(b"").unwrap().nlink;
        m.rename(&root(), b"d1", b"d2/d1", RenameMode::NoReplace)
            .unwrap();
        assert_eq!(m.getattr(b"").unwrap().nlink, root_links - 1);
        assert_eq!(m.getattr(b"d2").unwrap().nlink, 3);
        assert_eq!(
            m.lookup(b"d2/d1/sub", b"x").unwrap().kind(),
            FileType::Regular
        );
        // directory onto an empty directory replaces it
        m.rename(&root(), b"d2/d1", b"empty", RenameMode::Replace)
            .unwrap();
        assert!(m.getattr(b"empty/sub").unwrap().is_dir());
        assert_eq!(m.getattr(b"d2").unwrap().nlink, 2);
        assert_eq!(m.getattr(b"").unwrap().nlink, root_links - 1);
        // exchange a file and a directory across parents
        m.rename(&root(), b"b", b"full", RenameMode::Exchange)
            .unwrap();
        assert!(m.getattr(b"b").unwrap().is_dir());
        // rename onto a hard link of itself is a no-op
        m.link(&root(), b"full", b"hl").unwrap();
        m.rename(&root(), b"full", b"hl", RenameMode::Replace)
            .unwrap();
        assert_eq!(m.getattr(b"full").unwrap().nlink, 2);
    }

    /// memory_vs_kernel seed 1795744034133171380 step 676: root's O_CREAT open of a symlink
    /// that uid 1000 owns in a sticky world-writable directory is EACCES in the kernel
    /// (`may_create_in_sticky`, before the symlink's ELOOP); the memory backend said ELOOP.
    #[test]
    fn creat_of_anothers_name_in_a_sticky_dir_is_eacces() {
        let m = MemoryBackend::new();
        m.populate(&["sticky/", "plain/"]);
        for d in [&b"sticky"[..], b"plain"] {
            let mode = if d == b"sticky" { 0o1777 } else { 0o777 };
            m.setattr(
                &root(),
                d,
                &SetAttr {
                    mode: Some(mode),
                    ..sa()
                },
            )
            .unwrap();
        }
        let creat = libc::O_CREAT | libc::O_RDWR;
        let open = |c: &Cred, p: &[u8]| m.open(c, p, creat, 0o644).map(|_| ()).unwrap_err();
        m.symlink(&user(1000), b"b/b", b"sticky/theirs").unwrap();
        m.symlink(&root(), b"b/b", b"sticky/roots").unwrap();
        m.symlink(&user(1000), b"b/b", b"plain/theirs").unwrap();
        assert_eq!(open(&root(), b"sticky/theirs"), Error::Access);
        assert_eq!(open(&user(1001), b"sticky/theirs"), Error::Access);
        // The caller's own, the directory owner's, or outside a sticky directory: ELOOP.
        assert_eq!(open(&user(1000), b"sticky/theirs"), Error::Loop);
        assert_eq!(open(&user(1000), b"sticky/roots"), Error::Loop);
        assert_eq!(open(&root(), b"plain/theirs"), Error::Loop);
        // Without O_CREAT the rule does not apply.
        let plain = m
            .open(&root(), b"sticky/theirs", libc::O_RDWR, 0)
            .map(|_| ())
            .unwrap_err();
        assert_eq!(plain, Error::Loop);
    }

    #[test]
    fn memory_ownership_and_permissions() {
        let m = MemoryBackend::new();
        m.populate(&["open/", "closed/", "sticky/", "setgid/", "priv/open/"]);
        let chmod = |p: &[u8], mode| {
            m.setattr(
                &root(),
                p,
                &SetAttr {
                    mode: Some(mode),
                    ..sa()
                },
            )
            .unwrap()
        };
        chmod(b"open", 0o777);
        chmod(b"sticky", 0o1777);
        chmod(b"setgid", 0o2777);
        m.setattr(
            &root(),
            b"setgid",
            &SetAttr {
                gid: Some(4242),
                ..sa()
            },
        )
        .unwrap();
        chmod(b"priv", 0o700);
        chmod(b"priv/open", 0o777);
        let u = Cred::new(1000, 100, [4242]);
        let a = m.mkdir(&u, b"open/x", 0o755).unwrap();
        assert_eq!((a.uid, a.gid), (1000, 100));
        let a = m.mknod(&u, b"setgid/f", libc::S_IFREG | 0o644, 0).unwrap();
        assert_eq!(a.gid, 4242);
        let a = m.mkdir(&u, b"setgid/d", 0o755).unwrap();
        assert_eq!((a.gid, a.mode & S_ISGID), (4242, S_ISGID));
        assert_eq!(m.mkdir(&u, b"closed/x", 0o755).unwrap_err(), Error::Access);
        // Ancestors are the cache's business: priv (0700 root) does not stop a create in
        // priv/open (0777), as mkdirat relative to a descriptor of priv/open would not.
        m.mkdir(&u, b"priv/open/x", 0o755).unwrap();
        // Search permission on the parent itself is needed.
        chmod(b"open", 0o776);
        assert_eq!(m.mkdir(&u, b"open/y", 0o755).unwrap_err(), Error::Access);
        chmod(b"open", 0o777);
        assert_eq!(
            m.mknod(&u, b"open/dev", libc::S_IFCHR | 0o644, 5)
                .unwrap_err(),
            Error::Perm
        );
        // sticky
        m.mknod(&user(7), b"sticky/f", libc::S_IFREG | 0o644, 0)
            .unwrap();
        assert_eq!(m.unlink(&u, b"sticky/f").unwrap_err(), Error::Perm);
        assert_eq!(
            m.rename(&u, b"sticky/f", b"sticky/g", RenameMode::Replace)
                .unwrap_err(),
            Error::Perm
        );
        m.unlink(&user(7), b"sticky/f").unwrap();
        // chmod/chown rules
        m.mknod(&user(7), b"open/f7", libc::S_IFREG | 0o644, 0)
            .unwrap();
        let set_mode = SetAttr {
            mode: Some(0o600),
            ..sa()
        };
        assert_eq!(
            m.setattr(&u, b"open/f7", &set_mode).unwrap_err(),
            Error::Perm
        );
        assert_eq!(
            m.setattr(&user(7), b"open/f7", &set_mode).unwrap().perm(),
            0o600
        );
        assert_eq!(
            m.setattr(
                &user(7),
                b"open/f7",
                &SetAttr {
                    uid: Some(8),
                    ..sa()
                }
            )
            .unwrap_err(),
            Error::Perm
        );
        assert_eq!(
            m.setattr(
                &user(7),
                b"open/f7",
                &SetAttr {
                    gid: Some(4242),
                    ..sa()
                }
            )
            .unwrap_err(),
            Error::Perm
        );
        let a = m
            .setattr(
                &root(),
                b"open/f7",
                &SetAttr {
                    uid: Some(8),
                    ..sa()
                },
            )
            .unwrap();
        assert_eq!(a.uid, 8);
        // truncate needs write permission; explicit times need ownership
        assert_eq!(
            m.setattr(
                &u,
                b"open/f7",
                &SetAttr {
                    size: Some(0),
                    ..sa()
                }
            )
            .unwrap_err(),
            Error::Access
        );
        let t = SetAttr {
            mtime: Some(TimeSet::At(Timespec { sec: 5, nsec: 0 })),
            ..sa()
        };
        assert_eq!(m.setattr(&u, b"open/f7", &t).unwrap_err(), Error::Perm);
        assert_eq!(
            m.setattr(&root(), b"open/f7", &t).unwrap().mtime,
            Timespec { sec: 5, nsec: 0 }
        );
        // chmod of a symlink: EOPNOTSUPP
        m.symlink(&root(), b"x", b"open/l").unwrap();
        assert_eq!(
            m.setattr(&root(), b"open/l", &set_mode).unwrap_err(),
            Error::Os(libc::EOPNOTSUPP)
        );
        // protected hard links
        assert_eq!(m.link(&u, b"open/f7", b"open/h").unwrap_err(), Error::Perm);
    }

    #[test]
    fn memory_setattr_and_times() {
        let m = MemoryBackend::new();
        m.populate(&["f", "d/"]);
        let before = m.getattr(b"f").unwrap();
        let a = m
            .setattr(
                &root(),
                b"f",
                &SetAttr {
                    mode: Some(0o4755),
                    ..sa()
                },
            )
            .unwrap();
        assert_eq!(a.mode, libc::S_IFREG | 0o4755);
        assert!(a.ctime > before.ctime);
        assert_eq!(a.mtime, before.mtime);
        let a = m
            .setattr(
                &root(),
                b"f",
                &SetAttr {
                    uid: Some(3),
                    ..sa()
                },
            )
            .unwrap();
        assert_eq!((a.uid, a.mode & S_ISUID), (3, 0)); // chown clears setuid
        let a = m
            .setattr(
                &root(),
                b"f",
                &SetAttr {
                    size: Some(1000),
                    ..sa()
                },
            )
            .unwrap();
        assert_eq!(a.size, 1000);
        assert_eq!(
            m.setattr(
                &root(),
                b"d",
                &SetAttr {
                    size: Some(0),
                    ..sa()
                }
            )
            .unwrap_err(),
            Error::IsDir
        );
        let t1 = Timespec { sec: 100, nsec: 7 };
        let a = m
            .setattr(
                &root(),
                b"f",
                &SetAttr {
                    atime: Some(TimeSet::At(t1)),
                    ..sa()
                },
            )
            .unwrap();
        assert_eq!(a.atime, t1);
        assert_ne!(a.mtime, t1);
        let a = m
            .setattr(
                &root(),
                b"f",
                &SetAttr {
                    mtime: Some(TimeSet::Now),
                    ..sa()
                },
            )
            .unwrap();
        assert_eq!(a.atime, t1);
        assert!(a.mtime.sec > 1_000_000_000);
        let d0 = m.getattr(b"d").unwrap();
        m.mknod(&root(), b"d/x", libc::S_IFIFO | 0o600, 0).unwrap();
        let d1 = m.getattr(b"d").unwrap();
        assert!(d1.mtime > d0.mtime && d1.ctime > d0.ctime);
        assert_eq!(
            m.setattr(
                &root(),
                b"missing",
                &SetAttr {
                    mode: Some(0o600),
                    ..sa()
                }
            )
            .unwrap_err(),
            Error::NotFound
        );
    }

    #[test]
    fn memory_watch_reports_mutations() {
        let m = MemoryBackend::new();
        assert!(m.watch().unwrap().is_none());
        let m = MemoryBackend::with_watch();
        let rx = m.watch().unwrap().unwrap();
        m.mkdir(&root(), b"d", 0o755).unwrap();
        m.rename(&root(), b"d", b"e", RenameMode::Replace).unwrap();
        m.setattr(
            &root(),
            b"e",
            &SetAttr {
                mode: Some(0o700),
                ..sa()
            },
        )
        .unwrap();
        let got: Vec<Change> = rx.try_iter().collect();
        assert_eq!(
            got,
            vec![
                Change::Entry {
                    path: b"d".to_vec()
                },
                Change::Entry {
                    path: b"d".to_vec()
                },
                Change::Entry {
                    path: b"e".to_vec()
                },
                Change::Attr {
                    path: b"e".to_vec()
                },
            ]
        );
        drop(rx);
        m.mkdir(&root(), b"f", 0o755).unwrap(); // a dropped feed is forgotten
        assert!(m.feeds.lock().is_empty());
    }

    const RW: i32 = libc::O_RDWR;

    type File = Box<dyn BackendFile>;

    /// Write `data` at the end of `f`, as root.
    fn write(f: &File, data: &[u8]) {
        let end = f.attr().unwrap().size;
        assert_eq!(f.write_at(&root(), data, end, false).unwrap(), data.len());
    }

    fn read_all(f: &File) -> Vec<u8> {
        let mut buf = vec![0u8; 4096];
        let n = f.read_at(&mut buf, 0).unwrap();
        buf.truncate(n);
        buf
    }

    fn truncate(m: &MemoryBackend, path: &[u8], size: u64) -> Attr {
        m.setattr(
            &root(),
            path,
            &SetAttr {
                size: Some(size),
                ..sa()
            },
        )
        .unwrap()
    }

    #[test]
    fn memory_data_written_through_one_open_is_read_through_another() {
        let m = MemoryBackend::new();
        let w = m
            .open(&root(), b"f", libc::O_CREAT | libc::O_WRONLY, 0o640)
            .unwrap();
        let a = m.getattr(b"f").unwrap();
        assert_eq!((a.mode, a.size, a.nlink), (libc::S_IFREG | 0o640, 0, 1));
        write(&w, b"hello");
        let r = m.open(&root(), b"f", libc::O_RDONLY, 0).unwrap();
        assert_eq!(read_all(&r), b"hello");
        // Each open is its own open file description: its own offset and access mode.
        assert!(w.writable() && !r.writable());
        assert_eq!(
            r.write_at(&root(), b"x", 0, false).unwrap_err(),
            Error::Os(libc::EBADF)
        );
        let r2 = m.open(&root(), b"f", libc::O_RDONLY, 0).unwrap();
        let mut b = [0u8; 2];
        assert_eq!(rustix::io::read(r.fd().unwrap(), &mut b).unwrap(), 2);
        assert_eq!(rustix::io::read(r2.fd().unwrap(), &mut b).unwrap(), 2);
        assert_eq!(&b, b"he");
        // Size and blocks come from the data; type, mode, owner and inode from the tree.
        let a = m.getattr(b"f").unwrap();
        assert_eq!(a.size, 5);
        assert!(a.blocks > 0);
        let f = r.attr().unwrap();
        assert_eq!(f, a);
        assert_eq!((f.dev, f.mode), (MEMORY_DEV, libc::S_IFREG | 0o640));
        // Not the memfd's attributes (its own inode, mode and owner).
        let st = rustix::fs::fstat(r.fd().unwrap()).unwrap();
        assert_ne!((st.st_dev, st.st_ino), (f.dev, f.ino));
    }

    #[test]
    fn memory_open_flags_and_permissions() {
        let m = MemoryBackend::new();
        m.populate(&["d/", "d/l -> f"]);
        let creat = libc::O_CREAT | libc::O_WRONLY;
        drop(m.open(&root(), b"d/f", creat, 0o600).unwrap());
        assert_eq!(
            m.open(&root(), b"d/f", creat | libc::O_EXCL, 0o600)
                .unwrap_err(),
            Error::Exists
        );
        assert_eq!(
            m.open(&root(), b"d/nope", libc::O_RDONLY, 0).unwrap_err(),
            Error::NotFound
        );
        assert_eq!(
            m.open(&root(), b"d/l", libc::O_RDONLY, 0).unwrap_err(),
            Error::Loop
        );
        assert_eq!(
            m.open(&root(), b"d", libc::O_WRONLY, 0).unwrap_err(),
            Error::IsDir
        );
        assert_eq!(
            m.open(&root(), b"d/f", libc::O_RDONLY | libc::O_DIRECTORY, 0)
                .unwrap_err(),
            Error::NotDir
        );
        write(
            &m.open(&root(), b"d/f", libc::O_WRONLY, 0).unwrap(),
            b"data",
        );
        // O_TRUNC empties the file (and needs write permission).
        let u = user(1000);
        assert_eq!(
            m.open(&u, b"d/f", libc::O_RDONLY | libc::O_TRUNC, 0)
                .unwrap_err(),
            Error::Access
        );
        assert_eq!(m.getattr(b"d/f").unwrap().size, 4);
        let before = m.getattr(b"d/f").unwrap();
        drop(
            m.open(&root(), b"d/f", libc::O_WRONLY | libc::O_TRUNC, 0)
                .unwrap(),
        );
        let after = m.getattr(b"d/f").unwrap();
        assert_eq!(after.size, 0);
        assert!(after.mtime > before.mtime && after.ctime > before.ctime);
        // Reading needs read permission, writing write permission (0600 root: neither).
        assert_eq!(
            m.open(&u, b"d/f", libc::O_RDONLY, 0).unwrap_err(),
            Error::Access
        );
        assert_eq!(m.open(&u, b"d/f", RW, 0).unwrap_err(), Error::Access);
        // Creating needs write permission on the parent (0755 root); EEXIST comes first.
        assert_eq!(m.open(&u, b"d/g", creat, 0o644).unwrap_err(), Error::Access);
        assert_eq!(
            m.open(&u, b"d/f", creat | libc::O_EXCL, 0o644).unwrap_err(),
            Error::Exists
        );
        m.setattr(
            &root(),
            b"d",
            &SetAttr {
                mode: Some(0o777),
                ..sa()
            },
        )
        .unwrap();
        // A new file is opened whatever its mode says, and belongs to its creator.
        let fd = m.open(&u, b"d/g", creat, 0o444).unwrap();
        write(&fd, b"mine");
        let a = m.getattr(b"d/g").unwrap();
        assert_eq!((a.uid, a.perm(), a.size), (1000, 0o444, 4));
        assert_eq!(
            m.open(&user(7), b"d/g", libc::O_RDONLY | libc::O_NOATIME, 0)
                .unwrap_err(),
            Error::Perm
        );
        // An open for execve needs execute permission, not read (a 0711 program).
        m.setattr(
            &root(),
            b"d/f",
            &SetAttr {
                mode: Some(0o711),
                ..sa()
            },
        )
        .unwrap();
        assert_eq!(
            m.open(&u, b"d/f", libc::O_RDONLY, 0).unwrap_err(),
            Error::Access
        );
        drop(m.open(&u, b"d/f", libc::O_RDONLY | FMODE_EXEC, 0).unwrap());
        assert_eq!(
            m.open(&u, b"d/g", libc::O_RDONLY | FMODE_EXEC, 0)
                .unwrap_err(),
            Error::Access
        );
        // Opening for reading changes no timestamp.
        let a = m.getattr(b"d/g").unwrap();
        drop(m.open(&u, b"d/g", libc::O_RDONLY, 0).unwrap());
        let b = m.getattr(b"d/g").unwrap();
        assert_eq!((a.mtime, a.ctime), (b.mtime, b.ctime));
    }

    #[test]
    fn memory_append_appends_at_the_real_end() {
        let m = MemoryBackend::new();
        let w = m.open(&root(), b"f", libc::O_CREAT | RW, 0o644).unwrap();
        write(&w, b"hello");
        let a = m
            .open(&root(), b"f", libc::O_WRONLY | libc::O_APPEND, 0)
            .unwrap();
        // The other description writes where it says; the appending one at the end.
        w.write_at(&root(), b"HELLO!", 0, false).unwrap();
        a.write_at(&root(), b" world", 0, true).unwrap();
        assert_eq!(read_all(&w), b"HELLO! world");
        // The description itself appends (O_APPEND), the other one does not.
        rustix::io::write(a.fd().unwrap(), b"!").unwrap();
        rustix::io::write(w.fd().unwrap(), b"h").unwrap();
        assert_eq!(read_all(&w), b"hELLO! world!");
        let fl = rustix::fs::fcntl_getfl(a.fd().unwrap()).unwrap();
        assert!(fl.contains(rustix::fs::OFlags::APPEND));
    }

    #[test]
    fn memory_truncate_resizes_the_data() {
        let m = MemoryBackend::new();
        let fd = m.open(&root(), b"f", libc::O_CREAT | RW, 0o644).unwrap();
        write(&fd, b"0123456789");
        let before = m.getattr(b"f").unwrap();
        let a = truncate(&m, b"f", 3);
        assert_eq!(a.size, 3);
        assert!(a.mtime > before.mtime && a.ctime > before.ctime);
        assert_eq!(read_all(&fd), b"012");
        let a = truncate(&m, b"f", 6);
        assert_eq!(fd.attr().unwrap(), a);
        assert_eq!(read_all(&fd), b"012\0\0\0");
        // A file that never had data is given some by a truncation.
        m.populate(&["empty"]);
        assert_eq!(truncate(&m, b"empty", 2).size, 2);
        let r = m.open(&root(), b"empty", libc::O_RDONLY, 0).unwrap();
        assert_eq!(read_all(&r), b"\0\0");
        // Explicit times go to the data half too.
        let t = Timespec { sec: 77, nsec: 5 };
        let a = m
            .setattr(
                &root(),
                b"f",
                &SetAttr {
                    mtime: Some(TimeSet::At(t)),
                    ..sa()
                },
            )
            .unwrap();
        assert_eq!(a.mtime, t);
        assert_eq!(fd.attr().unwrap().mtime, t);
        // A write moves mtime and ctime.
        write(&fd, b"x");
        let b = m.getattr(b"f").unwrap();
        assert!(b.mtime > t && b.ctime >= a.ctime);
    }

    #[test]
    fn memory_unlinked_open_file_keeps_its_data() {
        let m = MemoryBackend::new();
        let fd = m.open(&root(), b"f", libc::O_CREAT | RW, 0o640).unwrap();
        write(&fd, b"still here");
        let ino = m.getattr(b"f").unwrap().ino;
        m.unlink(&root(), b"f").unwrap();
        assert_eq!(m.getattr(b"f").unwrap_err(), Error::NotFound);
        write(&fd, b"!");
        assert_eq!(read_all(&fd), b"still here!");
        let a = fd.attr().unwrap();
        assert_eq!(
            (a.ino, a.nlink, a.size, a.mode),
            (ino, 0, 11, libc::S_IFREG | 0o640)
        );
        // fchmod and futimens through the descriptor, with the caller's rights.
        let chmod = SetAttr {
            mode: Some(0o600),
            ..sa()
        };
        assert_eq!(fd.setattr(&user(5), &chmod).unwrap_err(), Error::Perm);
        let t = Timespec { sec: 9, nsec: 0 };
        let set = SetAttr {
            mtime: Some(TimeSet::At(t)),
            ..chmod
        };
        let b = fd.setattr(&root(), &set).unwrap();
        assert_eq!((b.perm(), b.mtime, b.nlink, b.size), (0o600, t, 0, 11));
        assert!(b.ctime > a.ctime);
        assert_eq!(fd.attr().unwrap(), b);
        // Renamed over: the same.
        let g = m.open(&root(), b"g", libc::O_CREAT | RW, 0o600).unwrap();
        write(&g, b"old");
        m.populate(&["h"]);
        m.rename(&root(), b"h", b"g", RenameMode::Replace).unwrap();
        assert_eq!(read_all(&g), b"old");
        assert_eq!(g.attr().unwrap().nlink, 0);
    }

    /// An unlinked file's inode (an orphan) stays while one of its open files does, and goes
    /// with the last one; one unlinked while not open goes at once.
    #[test]
    fn memory_orphans_stay_while_open_and_go_with_the_last_open_file() {
        let m = MemoryBackend::new();
        let kept = m.open(&root(), b"kept", libc::O_CREAT | RW, 0o600).unwrap();
        write(&kept, b"k");
        let second = m.open(&root(), b"kept", libc::O_RDONLY, 0).unwrap();
        let kept_ino = m.getattr(b"kept").unwrap().ino;
        m.unlink(&root(), b"kept").unwrap();
        for i in 0..100 {
            let p = format!("f{i}");
            let f = m
                .open(&root(), p.as_bytes(), libc::O_CREAT | RW, 0o600)
                .unwrap();
            write(&f, b"data");
            drop(f);
            m.unlink(&root(), p.as_bytes()).unwrap();
        }
        // The root and the orphan.
        assert_eq!(m.tree.lock().inodes.len(), 2);
        assert_eq!(m.inode_count(), 1);
        let a = kept.attr().unwrap();
        assert_eq!((a.ino, a.nlink, a.size), (kept_ino, 0, 1));
        drop(kept);
        assert_eq!(second.attr().unwrap().ino, kept_ino);
        assert_eq!(read_all(&second), b"k");
        drop(second);
        assert_eq!(m.tree.lock().inodes.len(), 1);
        // A removed directory held open (open_verified) the same.
        m.populate(&["d/"]);
        let d = m
            .open_verified(
                &root(),
                XattrTarget {
                    path: b"d",
                    expect: None,
                    birth: 0,
                    open: None,
                },
                libc::O_RDONLY | libc::O_DIRECTORY,
            )
            .unwrap();
        m.rmdir(&root(), b"d").unwrap();
        assert_eq!(d.attr().unwrap().nlink, 0);
        drop(d);
        assert_eq!(m.tree.lock().inodes.len(), 1);
    }

    /// Writes, allocations and truncations through an open file drop set-id bits as the
    /// caller does natively (file_remove_privs): not for root, not set-group-ID without group
    /// execute; a truncation through a file opened for writing needs no write permission
    /// now, one through a read-only file does (open(O_TRUNC)).
    #[test]
    fn memory_writes_through_open_files_drop_set_id_bits_as_the_caller() {
        let m = MemoryBackend::new();
        m.populate(&["f"]);
        let mode = |mode| {
            m.setattr(
                &root(),
                b"f",
                &SetAttr {
                    mode: Some(mode),
                    ..sa()
                },
            )
            .unwrap();
        };
        let perm = || m.getattr(b"f").unwrap().perm();
        let f = m.open(&root(), b"f", RW, 0).unwrap();
        mode(0o6777);
        f.write_at(&root(), b"x", 0, false).unwrap();
        assert_eq!(perm(), 0o6777);
        f.write_at(&user(1000), b"x", 0, false).unwrap();
        assert_eq!(perm(), 0o777);
        mode(0o6767);
        f.write_at(&user(1000), b"x", 0, true).unwrap();
        assert_eq!(perm(), 0o2767);
        mode(0o6777);
        f.allocate(&user(1000), 0, 0, 8192).unwrap();
        assert_eq!((perm(), m.getattr(b"f").unwrap().size), (0o777, 8192));
        // Others may not write 0o4744: through root's open for writing, the truncation is
        // allowed (and drops the bit); through a read-only open it is not.
        mode(0o4744);
        f.set_size(&user(1000), 3).unwrap();
        assert_eq!((perm(), m.getattr(b"f").unwrap().size), (0o744, 3));
        mode(0o4744);
        let r = m.open(&root(), b"f", libc::O_RDONLY, 0).unwrap();
        assert_eq!(r.set_size(&user(1000), 0).unwrap_err(), Error::Access);
        r.set_size(&root(), 1).unwrap();
        assert_eq!((perm(), r.attr().unwrap().size), (0o4744, 1));
        // setattr through the file ignores a size.
        let a = f
            .setattr(
                &root(),
                &SetAttr {
                    size: Some(100),
                    mode: Some(0o600),
                    ..sa()
                },
            )
            .unwrap();
        assert_eq!((a.perm(), a.size), (0o600, 1));
    }

    /// open_verified opens the inode the target names (by number when its names are gone)
    /// or fails with ESTALE; data for regular files, none with O_PATH or for directories.
    #[test]
    fn memory_open_verified_finds_the_inode() {
        let m = MemoryBackend::new();
        m.populate(&["d/"]);
        let w = m.open(&root(), b"d/f", libc::O_CREAT | RW, 0o644).unwrap();
        write(&w, b"data");
        let ino = m.getattr(b"d/f").unwrap().ino;
        let at = |path: &'static [u8], expect| XattrTarget {
            path,
            expect,
            birth: 0,
            open: None,
        };
        let f = m
            .open_verified(
                &user(5),
                at(b"d/f", Some((MEMORY_DEV, ino))),
                libc::O_RDONLY,
            )
            .unwrap();
        assert_eq!(
            (read_all(&f), f.attr().unwrap().ino),
            (b"data".to_vec(), ino)
        );
        assert_eq!(
            m.open_verified(&root(), at(b"d/f", Some((MEMORY_DEV, ino + 1))), 0)
                .unwrap_err(),
            Error::Stale
        );
        assert_eq!(
            m.open_verified(&root(), at(b"d/f", None), libc::O_DIRECTORY)
                .unwrap_err(),
            Error::NotDir
        );
        let p = m
            .open_verified(&root(), at(b"d/f", None), libc::O_PATH)
            .unwrap();
        assert!(p.fd().is_none() && !p.writable());
        let mut buf = [0u8; 4];
        assert_eq!(p.read_at(&mut buf, 0).unwrap_err(), Error::Os(libc::EBADF));
        // A directory: attributes, and a sync that has nothing to do (as tmpfs).
        let d = m
            .open_verified(&root(), at(b"d", None), libc::O_RDONLY | libc::O_DIRECTORY)
            .unwrap();
        assert!(d.attr().unwrap().is_dir());
        d.sync(false).unwrap();
        m.fsyncdir(&root(), at(b"d", None), true).unwrap();
        assert_eq!(
            m.open_verified(&root(), at(b"d", None), libc::O_WRONLY)
                .unwrap_err(),
            Error::IsDir
        );
        // Unlinked: found through the open file, by inode number.
        m.unlink(&root(), b"d/f").unwrap();
        let target = XattrTarget {
            path: b"",
            expect: Some((MEMORY_DEV, ino)),
            birth: 0,
            open: w.fd(),
        };
        let o = m.open_verified(&root(), target, libc::O_PATH).unwrap();
        assert_eq!(o.attr().unwrap().nlink, 0);
        // An empty setattr (a ctime touch, or the kernel's kill-privs request) as a user.
        let before = o.attr().unwrap();
        let after = o.setattr(&user(5), &sa()).unwrap();
        assert!(after.ctime > before.ctime);
    }

    #[test]
    fn memory_hard_links_share_data() {
        let m = MemoryBackend::new();
        m.populate(&["d/"]);
        let fd = m.open(&root(), b"f", libc::O_CREAT | RW, 0o644).unwrap();
        write(&fd, b"shared");
        let a = m.link(&root(), b"f", b"d/g").unwrap();
        assert_eq!((a.nlink, a.size), (2, 6));
        let g = m.open(&root(), b"d/g", RW, 0).unwrap();
        g.write_at(&root(), b"S", 0, false).unwrap();
        assert_eq!(read_all(&fd), b"Shared");
        truncate(&m, b"d/g", 2);
        assert_eq!(m.getattr(b"f").unwrap().size, 2);
        m.unlink(&root(), b"f").unwrap();
        assert_eq!(fd.attr().unwrap().nlink, 1);
        assert_eq!(read_all(&m.open(&root(), b"d/g", RW, 0).unwrap()), b"Sh");
    }

    /// An empty setattr drops set-id bits: what the FUSE kernel asks after a write by a
    /// caller without CAP_FSETID, and what chown(f, -1, -1) does natively, also root's (the
    /// kernel never asks for root's writes); directories keep them.
    #[test]
    fn memory_empty_setattr_removes_privs() {
        let m = MemoryBackend::new();
        m.populate(&["f", "g", "d/"]);
        let mode = |p: &[u8], mode| {
            m.setattr(
                &root(),
                p,
                &SetAttr {
                    mode: Some(mode),
                    ..sa()
                },
            )
            .unwrap()
        };
        mode(b"f", 0o6777);
        mode(b"g", 0o6767);
        mode(b"d", 0o3777);
        assert_eq!(m.setattr(&user(1000), b"f", &sa()).unwrap().perm(), 0o777);
        mode(b"f", 0o6777);
        assert_eq!(m.setattr(&root(), b"f", &sa()).unwrap().perm(), 0o777);
        // set-group-ID without group execute is mandatory locking, not a privilege.
        assert_eq!(m.setattr(&user(1000), b"g", &sa()).unwrap().perm(), 0o2767);
        assert_eq!(m.setattr(&user(1000), b"d", &sa()).unwrap().perm(), 0o3777);
    }

    #[test]
    fn memory_applies_the_thread_umask_when_asked() {
        let run = |m: MemoryBackend| {
            std::thread::spawn(move || {
                // This thread's own fs context, so its umask is its own (as a FUSE request
                // thread's).
                // (`unshare` is deprecated for CLONE_FILES's sake; CLONE_FS is harmless.)
                #[allow(deprecated)]
                rustix::thread::unshare(rustix::thread::UnshareFlags::FS).unwrap();
                let old = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
                drop(m.open(&root(), b"f", libc::O_CREAT | RW, 0o666).unwrap());
                m.mkdir(&root(), b"d", 0o777).unwrap();
                m.mknod(&root(), b"n", libc::S_IFIFO | 0o666, 0).unwrap();
                rustix::process::umask(old);
                [b"f".as_slice(), b"d", b"n"].map(|p| m.getattr(p).unwrap().perm())
            })
            .join()
            .unwrap()
        };
        assert_eq!(
            run(MemoryBackend::new().applying_umask()),
            [0o600, 0o700, 0o600]
        );
        assert_eq!(run(MemoryBackend::new()), [0o666, 0o777, 0o666]);
    }
}
