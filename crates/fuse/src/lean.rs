//! Lean READDIRPLUS for cold walks (`-o lean`, the default; issue 9).
//!
//! A READDIRPLUS entry normally carries the entry's attributes, so a first listing cost one
//! statx per entry in the daemon: a cold `find -name` statted every file of the tree, which
//! native `find` (it reads directories only, d_type tells it what to descend into) never
//! does. A lean listing reads the directory only (getdents, [`Cache::readdir_node`] without
//! attributes) and sends each non-directory entry whose attributes the cache does not hold
//! with nodeid 0 (`ReplyDirectoryPlus::add_unlinked`, vendor/fuser/PATCHED.md): the kernel
//! shows the name with that `d_ino` and `d_type` and instantiates nothing (fs/fuse/readdir.c
//! `fuse_direntplus_link` returns early for nodeid 0); whoever stats it sends a LOOKUP.
//! Directories go out full (a walker descends into them and would look them up anyway), and
//! so does every entry the cache has attributes for (e.g. files `git status` looked up before
//! listing their directory: each is statted once, by its LOOKUP).
//!
//! `d_ino` of a lean entry is getdents' inode number mapped as plain READDIR maps it
//! ([`crate::inodes::Inodes::ino_of`] on the directory's device): the number `stat` shows,
//! and for a mount point the covered inode's, as natively.
//!
//! Programs that stat what they list (`ls -l`, `du`) would pay one LOOKUP per file instead
//! of none, so the mount adapts: after [`HITS`] LOOKUPs of names in directories whose last
//! listing sent entries lean, the next [`FULL_LISTINGS`] listings are full, and the count
//! starts again; a walk that stats everything pays the lookups of about one directory per
//! [`FULL_LISTINGS`] listings.
//!
//! A GETXATTR of a POSIX ACL (`ls -l` asks for each inode's) keeps listings full as well
//! ([`Lean::acl_asked`]), and while such requests come, listings fetch their entries' ACLs
//! ahead ([`fill_acls`]) so that the requests are answered from the core's xattr memo.
//!
//! Nothing is cached here but a set of directory nodeids and two counters: which entries go
//! out lean changes what the kernel instantiates, never what it is told (a lean entry's
//! name, type and number come from the same listing a full entry's would).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dircache_core::{Cache, Creds, DirEntry, FileType, NodeRef, XattrTarget};

/// LOOKUPs of names listed lean that switch the mount to full listings.
pub(crate) const HITS: u32 = 4;
/// Listings served full after the switch.
pub(crate) const FULL_LISTINGS: u32 = 256;
/// Directories remembered as listed lean; the set is cleared when it grows past this.
const MAX_DIRS: usize = 1 << 16;

/// The lean-listing state of one mount.
pub(crate) struct Lean {
    on: bool,
    /// Listings still to be served full.
    full_left: AtomicU32,
    /// LOOKUPs of names listed lean since the last switch.
    hits: AtomicU32,
    /// Directories (nodeids) whose last listing sent entries lean.
    dirs: papaya::HashSet<u64>,
    /// When the kernel last asked for a POSIX ACL (nanoseconds since `start`, 0: never).
    acl_asked: AtomicU64,
    /// Directories (dentry ids) whose ACLs [`Lean::fill_acls`] fetched (or is fetching), with
    /// the xattr memo's generation then; cleared when it grows past [`MAX_DIRS`].
    acl_dirs: papaya::HashMap<u64, u64>,
    start: Instant,
}

/// How long after the kernel's last ACL request listings fetch ACLs ahead ([`fill_acls`]).
const ACL_WINDOW: Duration = Duration::from_secs(2);

impl Lean {
    pub(crate) fn new(on: bool) -> Lean {
        Lean {
            on,
            full_left: AtomicU32::new(0),
            hits: AtomicU32::new(0),
            dirs: papaya::HashSet::new(),
            acl_asked: AtomicU64::new(0),
            acl_dirs: papaya::HashMap::new(),
            start: Instant::now(),
        }
    }

    /// The kernel asked for a POSIX ACL (GETXATTR `system.posix_acl_*`): a program looks at
    /// the inodes it lists (`ls -l`), so listings go out full (it would LOOKUP every lean
    /// entry: `ls -lR` was 15-20 % slower lean) and fetch ACLs ahead ([`Lean::acls_ahead`]).
    pub(crate) fn acl_asked(&self) {
        let now = self.start.elapsed().as_nanos() as u64 | 1;
        self.acl_asked.store(now, Ordering::Relaxed);
        if self.on && self.full_left.load(Ordering::Relaxed) < FULL_LISTINGS {
            self.full_left.store(FULL_LISTINGS, Ordering::Relaxed);
        }
    }

    /// Whether listings fetch ACLs ahead: the kernel asked for one within [`ACL_WINDOW`].
    pub(crate) fn acls_ahead(&self) -> bool {
        let t = self.acl_asked.load(Ordering::Relaxed);
        t != 0 && self.start.elapsed().as_nanos() as u64 <= t + ACL_WINDOW.as_nanos() as u64
    }

    /// Whether `-o lean` is on (full listings then reuse cached children's attributes).
    pub(crate) fn on(&self) -> bool {
        self.on
    }

    /// Whether listings are lean now (for listings made ahead of a walker).
    pub(crate) fn is_lean(&self) -> bool {
        self.on && self.full_left.load(Ordering::Relaxed) == 0
    }

    /// Whether a new listing stream (a READDIRPLUS from offset 0) is lean; a full one counts
    /// against [`FULL_LISTINGS`].
    pub(crate) fn take_listing(&self) -> bool {
        if !self.on {
            return false;
        }
        let left = self.full_left.load(Ordering::Relaxed);
        if left == 0 {
            return true;
        }
        let _ =
            self.full_left
                .compare_exchange(left, left - 1, Ordering::Relaxed, Ordering::Relaxed);
        false
    }

    /// Entries of directory `dir` went out lean.
    pub(crate) fn sent_lean(&self, dir: u64) {
        let d = self.dirs.pin();
        if d.len() >= MAX_DIRS {
            d.clear();
        }
        d.insert(dir);
    }

    /// A LOOKUP in directory `parent` arrived.
    pub(crate) fn looked_up(&self, parent: u64) {
        if !self.on || !self.dirs.pin().contains(&parent) {
            return;
        }
        if self.hits.fetch_add(1, Ordering::Relaxed) + 1 >= HITS {
            self.hits.store(0, Ordering::Relaxed);
            self.full_left.store(FULL_LISTINGS, Ordering::Relaxed);
            self.dirs.pin().clear();
        }
    }
}

/// Give the subdirectories of a lean listing of `dir` their attributes (one statx each):
/// they go out as full entries, and the prefetcher only lists directories it has attributes
/// for (permission check).
pub(crate) fn stat_subdirs(cache: &Cache, c: &Creds, dir: &NodeRef, entries: &[DirEntry]) {
    stat_entries(cache, c, dir, entries, true)
}

/// Give the entries of a listing of `dir` made without attributes the attributes the cache
/// lacks (one statx each; only subdirectories if `dirs_only`).
pub(crate) fn stat_entries(
    cache: &Cache,
    c: &Creds,
    dir: &NodeRef,
    entries: &[DirEntry],
    dirs_only: bool,
) {
    for e in entries {
        if (dirs_only && e.kind != FileType::Directory) || e.attr.is_some() {
            continue;
        }
        if let Ok(n) = cache.lookup_child(c, dir, &e.name) {
            if n.cached_attr().is_none() {
                let _ = cache.attr_of_name(&n);
            }
        }
    }
}

const ACL_ACCESS: &[u8] = b"system.posix_acl_access";
const ACL_DEFAULT: &[u8] = b"system.posix_acl_default";

/// The xattr memo's bit for a POSIX ACL name (`fs/xattrs.rs` numbers them the same).
pub(crate) fn acl_bit(name: &[u8]) -> u8 {
    match name {
        ACL_ACCESS => 1,
        ACL_DEFAULT => 2,
        _ => 0,
    }
}

/// Fetch the POSIX ACLs of the entries of a listing of `dir` ahead of the kernel, which asks
/// for one per inode (`ls -l`: one GETXATTR per file, two per directory), and remember the
/// absent ones in the core's xattr memo ([`Cache::note_xattr_absent`]), from which
/// `fs/xattrs.rs` answers ENODATA without a backend call. `gen` is the memo's generation
/// read before `entries` were listed: any change the core applied since voids the notes.
///
/// Only absences are remembered, and only for an entry whose name, after the ACL read, is
/// still the inode the listing saw with the same ctime: a name renamed over (or the inode
/// renamed away and back, or given an ACL) in between changes the inode or its ctime, and
/// the entry is skipped; the kernel then asks through the usual path, which checks the
/// inode itself. Symlinks are skipped.
pub(crate) fn fill_acls(
    lean: &Lean,
    cache: &Cache,
    c: &Creds,
    dir: &NodeRef,
    entries: &[DirEntry],
    gen: u64,
) {
    let backend = cache.node_backend(dir);
    if backend.acls_listed() {
        // Answered without a call anyway (a remote backend's bulk listings).
        return;
    }
    {
        // Once per directory and memo generation (a prefetch thread and the walker's own
        // listing may both get here).
        let d = lean.acl_dirs.pin();
        if d.get(&dir.id()) == Some(&gen) {
            return;
        }
        if d.len() >= MAX_DIRS {
            d.clear();
        }
        d.insert(dir.id(), gen);
    }
    let Ok(dpath) = cache.node_path(dir) else {
        return;
    };
    let mut path = Vec::with_capacity(dpath.len() + 64);
    for e in entries {
        // A listing reusing cached children has no attributes: the cache's (the READDIRPLUS
        // reply needs them next anyway).
        let attr = e.attr.or_else(|| {
            let n = cache.lookup_child(c, dir, &e.name).ok()?;
            n.cached_attr().or_else(|| cache.attr_of_name(&n).ok())
        });
        let Some(a) = attr else {
            continue;
        };
        let kind = a.kind();
        if kind == FileType::Symlink {
            continue;
        }
        path.clear();
        if !dpath.is_empty() {
            path.extend_from_slice(&dpath);
            path.push(b'/');
        }
        path.extend_from_slice(&e.name);
        let t = XattrTarget {
            path: &path,
            expect: None,
            birth: 0,
            open: None,
        };
        let names: &[&[u8]] = if kind == FileType::Directory {
            &[ACL_ACCESS, ACL_DEFAULT]
        } else {
            &[ACL_ACCESS]
        };
        if names
            .iter()
            .all(|n| cache.xattr_known_absent((a.dev, a.ino), a.birth, acl_bit(n)))
        {
            // Fetched already (e.g. by a prefetch thread before this listing).
            continue;
        }
        let mut absent = 0;
        for n in names {
            if let Err(err) = backend.getxattr(c.cred(), t, n) {
                if err.errno() == libc::ENODATA {
                    absent |= acl_bit(n);
                }
            }
        }
        if absent == 0 {
            continue;
        }
        match backend.getattr(&path) {
            Ok(now)
                if (now.dev, now.ino, now.birth) == (a.dev, a.ino, a.birth)
                    && now.ctime == a.ctime =>
            {
                cache.note_xattr_absent((a.dev, a.ino), a.birth, absent, gen)
            }
            _ => {}
        }
    }
}
