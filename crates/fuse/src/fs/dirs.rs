//! Directory streams of the FUSE front end: opendir, readdir, readdirplus, releasedir and
//! fsyncdir, served from per-stream listing snapshots resumed by cookie (`listings.rs`).
//! The entries go to the adapter through a callback (`add`), which returns true when the
//! kernel's buffer is full, as `fuser`'s directory replies do.

use super::*;

/// One READDIR entry.
pub(super) struct DirEntry<'a> {
    pub(super) ino: INodeNo,
    /// The cookie the next READDIR of the stream resumes after.
    pub(super) offset: u64,
    pub(super) kind: fuser::FileType,
    pub(super) name: &'a OsStr,
}

/// One READDIRPLUS entry: a READDIR entry with an ENTRY reply's attributes.
pub(super) struct DirEntryPlus<'a> {
    pub(super) ino: INodeNo,
    pub(super) offset: u64,
    pub(super) name: &'a OsStr,
    pub(super) ttl: Duration,
    pub(super) attr: FileAttr,
    pub(super) generation: Generation,
    /// The kernel already holds this name and inode: send it with nodeid 0 (only `ino`,
    /// `offset`, the kind of `attr` and `name` go out), so that the kernel keeps what it has
    /// cached for it. See [`CacheFs::readdirplus`].
    pub(super) unlinked: bool,
}

impl CacheFs {
    /// The handle of a new listing stream of `ino` and its open flags; ENOSYS with
    /// `no_opendir` (FUSE_NO_OPENDIR_SUPPORT: the kernel stops sending OPENDIR/RELEASEDIR and
    /// opens every directory with CACHE_DIR | KEEP_CACHE).
    pub(super) fn opendir(&self, ino: INodeNo) -> Result<Opened, Errno> {
        if self.policy.no_opendir {
            return Err(Errno::ENOSYS);
        }
        self.node(ino)?;
        let flags = if self.policy.cache_dir {
            FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE
        } else {
            FopenFlags::empty()
        };
        Ok(Opened {
            fh: FileHandle(self.listings.open()),
            flags,
            backing: None,
        })
    }

    /// READDIR of `ino` on stream `fh` from `offset`: the entries go to `add` until it
    /// reports the buffer full.
    pub(super) fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut add: impl FnMut(DirEntry<'_>) -> bool,
    ) -> Result<(), Errno> {
        let (list, _) = self.listing(req, ino, fh, offset, false)?;
        let dir = self.inodes.get(ino.0);
        let dev = dir
            .as_ref()
            .and_then(|d| self.cache.getattr(d).ok())
            .map(|a| a.dev)
            .unwrap_or(0);
        let mut off = offset;
        if off == 0 {
            if add(DirEntry {
                ino: INodeNo(self.inodes.st_ino(ino.0)),
                offset: 1,
                kind: fuser::FileType::Directory,
                name: OsStr::new("."),
            }) {
                return Ok(());
            }
            off = 1;
        }
        if off == 1 {
            let p = dir
                .as_ref()
                .map(|d| self.parent_nodeid(d))
                .unwrap_or(self.inodes.root());
            if add(DirEntry {
                ino: INodeNo(self.inodes.st_ino(p)),
                offset: 2,
                kind: fuser::FileType::Directory,
                name: OsStr::new(".."),
            }) {
                return Ok(());
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
                || add(DirEntry {
                    ino: INodeNo(d_ino.max(2)),
                    offset: *cookie,
                    kind: fuse_kind(e.kind),
                    name: OsStr::from_bytes(&e.name),
                })
            {
                finished = false;
                break;
            }
        }
        if finished {
            self.listings.finished(ino.0, fh.0, &list);
        }
        Ok(())
    }

    /// READDIRPLUS of `ino` on stream `fh` from `offset`: as [`CacheFs::readdir`], and every
    /// entry but "." and ".." is looked up (the kernel holds it when `add` took it).
    ///
    /// An entry the kernel already holds by this name ([`Inodes::held_by_kernel`]) goes out
    /// unlinked (nodeid 0): the listing shows it, and the kernel keeps its dentry, inode,
    /// attributes and cached ACLs as they are. A full entry for a known inode would make the
    /// kernel forget that inode's cached POSIX ACLs (`fuse_direntplus_link` calls
    /// `forget_all_cached_acls`), so after any re-read of a listing (the directory changed,
    /// or the kernel dropped its cached pages) `ls -l` sent one GETXATTR
    /// (`system.posix_acl_access`) per entry. What the kernel holds is current: every change
    /// the core learns of reaches it as `inval_inode` / `inval_entry` from the notifier.
    pub(super) fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut add: impl FnMut(DirEntryPlus<'_>) -> bool,
    ) -> Result<(), Errno> {
        let (list, lean) = self.listing(req, ino, fh, offset, true)?;
        let dir = self.node(ino)?;
        let ttl = self.policy.entry_ttl;
        let mut off = offset;
        if off < 2 {
            // "." and ".." are not linked by the kernel (no lookup count).
            let dattr = self.cache.getattr(&dir).map_err(errno)?;
            // The kernel links neither "." nor "..": their attr.ino is only the d_ino shown.
            let dot = self.attr_for(ino.0, &dattr);
            if off == 0
                && add(DirEntryPlus {
                    ino,
                    offset: 1,
                    name: OsStr::new("."),
                    ttl,
                    attr: dot,
                    generation: Generation(0),
                    unlinked: false,
                })
            {
                return Ok(());
            }
            let p = self.parent_nodeid(&dir);
            if add(DirEntryPlus {
                ino: INodeNo(p),
                offset: 2,
                name: OsStr::new(".."),
                ttl,
                attr: self.attr_for(p, &dattr),
                generation: Generation(0),
                unlinked: false,
            }) {
                return Ok(());
            }
            off = 2;
        }
        let c = self.read_creds(req);
        let start = list.resume_at(off.max(AFTER_DOTDOT));
        let mut finished = true;
        let mut added = false;
        let mut sent_lean = false;
        let mut dir_dev: Option<u64> = None;
        for (i, (cookie, e)) in list.entries().iter().enumerate().skip(start) {
            if list.ends_chunk_before(i, added) {
                finished = false;
                break;
            }
            let Some(node) = self.child(&c, &dir, OsStr::from_bytes(&e.name)) else {
                continue;
            };
            // A lean listing (`lean.rs`): a file the cache has no attributes for (any file
            // with `lean_cached`) goes out with getdents' number and type only.
            let is_lean = lean
                && e.kind != FileType::Directory
                && (self.policy.lean_cached || (e.attr.is_none() && node.cached_attr().is_none()));
            // (number shown, attributes, the inode linked to the kernel's new dentry if any).
            // Unlinked entries (nodeid 0) are shown, not linked: not remembered as told.
            let (d_ino, attr, linked) = if is_lean {
                let dev = *dir_dev
                    .get_or_insert_with(|| self.cache.getattr(&dir).map(|a| a.dev).unwrap_or(0));
                let d_ino = self.inodes.ino_of(dev, e.ino).max(2);
                let attr = FileAttr {
                    ino: INodeNo(d_ino),
                    kind: fuse_kind(e.kind),
                    ..negative_attr()
                };
                (d_ino, attr, None)
            } else {
                let a = match e.attr {
                    Some(a) if a.nlink <= 1 || a.is_dir() => a,
                    _ => match self.cache.attr_of_name(&node) {
                        Ok(a) => a,
                        Err(_) => continue,
                    },
                };
                if node.kind() != NodeKind::Positive(a.kind()) {
                    // The core's dentry is of another type than the listing shows (the name
                    // was replaced in SRC, not reported yet): a LOOKUP finds the file.
                    let d_ino = self.inodes.ino_of(a.dev, a.ino).max(2);
                    (d_ino, fuse_attr(d_ino, &a), None)
                } else if let Some(id) = self.inodes.held_by_kernel(&node, &a) {
                    // Only the number and type go out.
                    let st_ino = self.inodes.st_ino(id);
                    (st_ino, fuse_attr(st_ino, &a), None)
                } else {
                    let id = self.inodes.register(&self.cache, &node, &a, ino.0);
                    (id, self.attr_for(id, &a), Some(id))
                }
            };
            let generation = linked.map_or(0, |id| self.inodes.generation(id));
            if add(DirEntryPlus {
                ino: INodeNo(d_ino),
                offset: *cookie,
                name: OsStr::from_bytes(&e.name),
                ttl,
                attr,
                generation: Generation(generation),
                unlinked: linked.is_none(),
            }) {
                if let Some(id) = linked {
                    self.inodes.forget(&self.cache, id, 1);
                }
                finished = false;
                break;
            }
            if is_lean && !sent_lean {
                sent_lean = true;
                self.lean.sent_lean(ino.0);
            }
            added = true;
        }
        if finished {
            self.listings.finished(ino.0, fh.0, &list);
        }
        Ok(())
    }

    pub(super) fn releasedir(&self, fh: FileHandle) {
        self.listings.release(fh.0);
    }

    pub(super) fn fsyncdir(
        &self,
        req: &Request,
        ino: INodeNo,
        datasync: bool,
    ) -> Result<(), Errno> {
        let c = self.read_creds(req);
        let x = self.xattr_target(ino)?;
        x.backend
            .fsyncdir(c.cred(), x.target(), datasync)
            .map_err(|e| self.xattr_error(ino, &x, e))
    }

    /// The snapshot a READDIR(PLUS) of `ino` at `offset` on handle `fh` is served from, and
    /// whether its files go out lean (`lean.rs`).
    fn listing(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        plus: bool,
    ) -> Result<(Arc<Snapshot>, bool), Errno> {
        if let Some(s) = self.listings.resume(ino.0, fh.0, offset) {
            return Ok((s, plus && self.lean.is_lean()));
        }
        let ticket = self.listings.ticket();
        let dir = self.node(ino)?;
        let c = self.read_creds(req);
        // Being listed ahead of us: take that listing rather than make a second one.
        self.prefetch.wait_for(&dir);
        // Lean (`lean.rs`): read the directory only, statx its subdirectories alone.
        let lean = plus
            && if offset <= AFTER_DOTDOT {
                self.lean.take_listing()
            } else {
                self.lean.is_lean()
            };
        // Full entries with `-o lean` of a directory with cached children: the names from
        // getdents (or the cache, e.g. a listing made lean ahead of the walker), the
        // attributes of children the cache holds reused (e.g. files `git status` looked up
        // before listing their directory) and only the others fetched, per entry in
        // `readdirplus`, instead of a backend listing that statx'es every entry again. A
        // directory without any is listed with attributes by the backend (one pass).
        let reuse = self.policy.lean && dir.has_children();
        let want = plus && !lean && !reuse && !dir.is_complete();
        let acl_gen = self.cache.xattr_memo_gen();
        let l = self.cache.readdir_node(&c, &dir, want).map_err(errno)?;
        if lean {
            crate::lean::stat_subdirs(&self.cache, &c, &dir, &l);
        } else if plus && offset <= AFTER_DOTDOT && self.lean.acls_ahead() {
            // `ls -l`: the kernel asks for each entry's ACL next (`lean::fill_acls`).
            crate::lean::fill_acls(&self.lean, &self.cache, &c, &dir, &l, acl_gen);
        }
        let snap = self.listings.store(ino.0, fh.0, ticket, l);
        if offset <= AFTER_DOTDOT {
            // A new stream: a walker may go into these subdirectories next (prefetch.rs).
            let subdirs = snap
                .entries()
                .iter()
                .filter_map(|(_, e)| (e.kind == FileType::Directory).then_some(&e.name[..]));
            self.prefetch.listed(&c, &dir, subdirs);
        }
        Ok((snap, lean))
    }
}
