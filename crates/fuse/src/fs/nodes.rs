//! Operations on nodes (names and inodes) of the FUSE front end: lookup, attributes, the
//! namespace mutations (mknod, mkdir, unlink, rmdir, symlink, rename, link), and the helpers
//! that map the kernel's nodeids to the core's held nodes and keep both informed after a
//! mutation. Each operation returns `Result<T, Errno>` for the adapter (`fs.rs`) to reply.

use super::*;

impl CacheFs {
    /// The held inode of a nodeid (ESTALE when the kernel's nodeid is unknown).
    pub(super) fn held(&self, nodeid: INodeNo) -> Result<Held, Errno> {
        self.inodes.held(nodeid.0).ok_or(Errno::ESTALE)
    }

    /// The live dentry of a nodeid: the core finds it again when an outside change dropped
    /// the one the kernel knows ([`Cache::held_node`]).
    pub(super) fn node(&self, nodeid: INodeNo) -> Result<NodeRef, Errno> {
        self.inodes
            .with_held(nodeid.0, |h| self.cache.held_node(h))
            .ok_or(Errno::ESTALE)?
            .map_err(errno)
    }

    /// The live dentry of directory nodeid `dir`, for a namespace change in it (CREATE,
    /// MKNOD, MKDIR, SYMLINK, LINK, RENAME, UNLINK, RMDIR). A held directory that died and is not found again where the kernel has it
    /// (removed or replaced in SRC: its name holds another inode now, or nothing) gives
    /// ESTALE. The kernel resolved the path to its inode before the change feed's report
    /// reached it (the report's `inval_entry` races the walk), and Linux walks the path
    /// again once with LOOKUP_REVAL on ESTALE, so the operation meets what the name holds
    /// now, as natively. ENOENT failed a program that created a file in a directory renamed
    /// over another in SRC (torture seed 540,
    /// `coherence.rs::a_create_into_a_directory_replaced_in_src_lands_in_the_new_one`).
    /// Limit: a walk that starts at the dead directory itself (a process whose working
    /// directory it is) meets it again on the retry and gets ESTALE, where natively a removed
    /// directory gives ENOENT.
    pub(super) fn dir_node(&self, dir: INodeNo) -> Result<NodeRef, Errno> {
        let n = self.node(dir)?;
        if n.is_dead() {
            return Err(Errno::ESTALE);
        }
        Ok(n)
    }

    /// `e`, the answer of an operation on a name in directory `dir`: ESTALE for an ENOENT
    /// once `dir` has died (the operation raced the report that killed it, see
    /// [`CacheFs::dir_node`]).
    pub(super) fn in_dir(dir: &NodeRef, e: Errno) -> Errno {
        if e == Errno::ENOENT && dir.is_dead() {
            Errno::ESTALE
        } else {
            e
        }
    }

    /// Run `f` on the dentry of `id`, retried on a found-again or other name of the inode
    /// ([`Cache::on_held`]).
    pub(super) fn with_node<T>(
        &self,
        id: INodeNo,
        f: impl Fn(&NodeRef) -> Result<T, CoreError>,
    ) -> Result<T, Errno> {
        self.cache.on_held(&self.held(id)?, f).map_err(errno)
    }

    /// How long the kernel may keep attributes `a` of `nodeid`: not at all while they may go
    /// stale without its knowing ([`Inodes::attrs_may_go_stale`]: a writer it does not see
    /// is open — a shared mapping of a passthrough file changes mtime/ctime without the FUSE
    /// inode seeing it — or any writer and `a` has set-id bits), else the policy's TTL. A
    /// write-only passthrough handle alone keeps the TTL: with none, every open of a file
    /// being appended to asked GETATTR (and then GETXATTR `security.capability`) again
    /// while the last cycle's RELEASE was on its way.
    pub(super) fn attr_ttl_for(&self, nodeid: u64, a: &Attr) -> Duration {
        let setid = a.mode & (libc::S_ISUID | libc::S_ISGID) != 0;
        if self.inodes.attrs_may_go_stale(nodeid, setid) {
            Duration::ZERO
        } else {
            self.policy.attr_ttl
        }
    }

    /// `a` as an attribute reply (GETATTR, SETATTR, readdir's "." and "..", an entry) for
    /// `nodeid`, remembered as what the kernel holds (`Inodes::told`).
    pub(super) fn attr_for(&self, nodeid: u64, a: &Attr) -> FileAttr {
        self.inodes.told(nodeid, a);
        fuse_attr(self.inodes.st_ino(nodeid), a)
    }

    /// `a` with its attribute TTL ([`CacheFs::attr_ttl_for`]), as a reply for `nodeid`.
    fn attr_out(&self, nodeid: u64, a: &Attr) -> AttrOut {
        AttrOut {
            attr: self.attr_for(nodeid, a),
            ttl: self.attr_ttl_for(nodeid, a),
        }
    }

    /// The entry reply for `node`, a child of `parent`, registered as a nodeid the kernel
    /// now holds.
    pub(super) fn entry(&self, parent: INodeNo, node: &NodeRef) -> Result<EntryOut, Errno> {
        // Bypass: the core just asked the backend for this node (the lookup or creation being
        // answered stored those attributes); asking again would be a second backend call.
        let a = match node
            .cached_attr()
            .filter(|_| self.policy.bypass && !node.is_dead())
        {
            Some(a) => a,
            None => self.cache.attr_of_name(node).map_err(errno)?,
        };
        let id = self.inodes.register(&self.cache, node, &a, parent.0);
        Ok(EntryOut {
            nodeid: INodeNo(id),
            attr: self.attr_for(id, &a),
            attr_ttl: self.attr_ttl_for(id, &a),
            entry_ttl: self.policy.entry_ttl,
            generation: Generation(self.inodes.generation(id)),
        })
    }

    /// After a mutation through the mount: the core's attributes of these dentries (and the
    /// kernel's, via the notifier) must not be served stale.
    pub(super) fn attrs_changed(&self, node: &NodeRef) {
        if let Some(h) = self.inodes.held_of(node) {
            self.cache.held_changed(&h);
        }
        self.cache.forget_attr(node);
    }

    pub(super) fn dir_changed(&self, dir: &NodeRef) {
        self.cache.forget_attr(dir);
        // Listing streams keep their snapshots: they resume by cookie (listings.rs), and
        // every new stream (offset 0) fetches the directory as it is now.
    }

    pub(super) fn parent_nodeid(&self, node: &NodeRef) -> u64 {
        node.parent()
            .and_then(|p| self.inodes.nodeid_of(&p))
            .unwrap_or(self.inodes.root())
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

    pub(super) fn child(&self, c: &Creds, dir: &NodeRef, name: &OsStr) -> Option<NodeRef> {
        match self.cache.lookup_child(c, dir, name.as_bytes()) {
            Ok(n) if matches!(n.kind(), NodeKind::Positive(_)) => Some(n),
            _ => None,
        }
    }

    /// The file behind `ino` opened by its backend with open(2) `flags`, which may be O_PATH
    /// (`Backend::open_verified`): verified to be the inode the kernel named (same
    /// `(dev, ino)` as when the nodeid was given out), ESTALE otherwise, after which the name
    /// is forgotten here and in the kernel as for an xattr call.
    pub(super) fn open_verified(
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
    fn touch_ctime(&self, req: &Request, ino: INodeNo, node: &NodeRef) -> Result<AttrOut, Errno> {
        let cred = self.groups.cred(req.pid(), req.uid(), req.gid());
        let f = self.open_verified(ino, &cred, libc::O_PATH)?;
        // Nothing set: chown(-1, -1) as the caller.
        match f.setattr(&cred, &SetAttr::default()) {
            Ok(a) => {
                self.attrs_changed(node);
                Ok(self.attr_out(ino.0, &a))
            }
            Err(e) => match f.attr() {
                Ok(a)
                    if a.mode & libc::S_ISUID != 0
                        || a.mode & (libc::S_ISGID | libc::S_IXGRP)
                            == (libc::S_ISGID | libc::S_IXGRP) =>
                {
                    Ok(self.attr_out(ino.0, &a))
                }
                _ => Err(errno(e)),
            },
        }
    }

    pub(super) fn lookup(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
    ) -> Result<EntryOut, Errno> {
        // Not `dir_node`: a lookup in a dead directory answers ENOENT (what it knew, as any
        // answer within the feed's latency; the creation that may follow gives ESTALE). With
        // ESTALE, a walk in a tree replaced again and again in SRC met a dead directory on
        // its retry too and failed with ESTALE (`replaced_trees.rs`, 1 walk in 30,000).
        let dir = self.node(parent)?;
        let c = self.read_creds(req);
        self.lookahead
            .before_lookup(&self.cache, &self.prefetch, &c, &dir, name.as_bytes());
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
            // The dentry found may die before its attributes are read (an outside change
            // applied meanwhile: the name removed or replaced, or, after a few tries in the
            // core, a directory that keeps changing): that is no answer about the name, and an
            // ENOENT for a name that exists would fail the caller. ESTALE makes the kernel
            // walk the path again (LOOKUP_REVAL), as for any object that went stale.
            Ok(node) => match self.entry(parent, &node) {
                Err(e) if e == Errno::ENOENT && node.is_dead() => Err(Errno::ESTALE),
                r => r,
            },
            Err(CoreError::NotFound) if !self.policy.negative_ttl.is_zero() => {
                self.counters
                    .negative_lookups
                    .fetch_add(1, Ordering::Relaxed);
                Ok(EntryOut {
                    nodeid: INodeNo(0),
                    attr: negative_attr(),
                    attr_ttl: self.policy.negative_ttl,
                    entry_ttl: self.policy.negative_ttl,
                    generation: Generation(0),
                })
            }
            Err(e) => {
                if e == CoreError::NotFound {
                    self.counters
                        .negative_lookups
                        .fetch_add(1, Ordering::Relaxed);
                }
                Err(errno(e))
            }
        }
    }

    /// The kernel dropped `nlookup` references to `ino`.
    pub(super) fn forget(&self, ino: INodeNo, nlookup: u64) {
        self.listings.forget_dir(ino.0);
        self.inodes.forget(&self.cache, ino.0, nlookup);
        if self.policy.no_open && self.inodes.get(ino.0).is_none() {
            self.drop_orphan(ino.0);
        }
    }

    pub(super) fn getattr(&self, ino: INodeNo, fh: Option<FileHandle>) -> Result<AttrOut, Errno> {
        if let Some(fh) = fh {
            if let Ok(of) = self.open_file(fh) {
                match of.fd.attr() {
                    Ok(a) => {
                        return Ok(AttrOut {
                            attr: self.attr_for(ino.0, &a),
                            ttl: self.attr_ttl_for(ino.0, &a),
                        });
                    }
                    // The open file is lost (a remote file that could not be reopened after
                    // a reconnection): its path may name another file by now.
                    Err(CoreError::Os(libc::EIO)) => return Err(Errno::EIO),
                    Err(_) => {}
                }
            }
        }
        let held = self.held(ino)?;
        let out = |a: &Attr| AttrOut {
            attr: self.attr_for(ino.0, a),
            ttl: self.attr_ttl_for(ino.0, a),
        };
        // The core finds a dropped dentry again by the name the kernel knows, and asks the
        // backend when its copy of the attributes may be behind (the held-node contract),
        // in one call: a dentry killed between the two steps is found again.
        let (node, r) = self.cache.held_attr(&held);
        let r = match r {
            // The name the core has not seen go names another file by now (removed or
            // replaced in SRC, not yet reported): not this inode's attributes (another
            // type would make the kernel mark its inode bad: EIO). Neither the number nor
            // the birth is checked for a provisional identity (made up while disconnected,
            // its birth unknown): the file now at its name is it, with the server's number
            // and birth (core `held_node`).
            Ok(a)
                if ino.0 != self.inodes.root()
                    && !self.cache.provisional(held.key())
                    && ((a.dev, a.ino) != held.key()
                        || !self.inodes.same_birth(ino.0, a.birth)) =>
            {
                Err(CoreError::NotFound)
            }
            r => r,
        };
        match r {
            Ok(a) => Ok(out(&a)),
            Err(e) => {
                // An unlinked file that is still open: answer from its descriptor.
                match self.any_open(ino.0).map(|f| f.fd.attr()) {
                    Some(Ok(a)) => Ok(out(&a)),
                    _ => match held.dir_attr() {
                        // A removed directory the kernel still holds (an open descriptor, a
                        // cwd): as natively, its attributes with nlink 0.
                        Some(mut a)
                            if (node.is_dead() && e == CoreError::Stale)
                                || e == CoreError::NotFound =>
                        {
                            a.nlink = 0;
                            Ok(self.attr_out(ino.0, &a))
                        }
                        _ => Err(errno(e)),
                    },
                }
            }
        }
    }

    /// SETATTR of `ino` with the fields of `set` (`fh`: the handle of an ftruncate).
    pub(super) fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        set: SetAttr,
        fh: Option<FileHandle>,
    ) -> Result<AttrOut, Errno> {
        let node = self.node(ino)?;
        let others_none = set.mode.is_none()
            && set.uid.is_none()
            && set.gid.is_none()
            && set.atime.is_none()
            && set.mtime.is_none();
        // A size change runs as the caller on the open file's descriptor (ftruncate), or on
        // the node's inode opened for writing as the caller (truncate, open with O_TRUNC),
        // never through a reopen by path as root: the backing file system then clears
        // set-id bits and checks access exactly as for that caller.
        if let Some(size) = set.size {
            let cred = self.groups.cred(req.pid(), req.uid(), req.gid());
            // (`open=noopen`: handle 0, a descriptor for this request: fs/noopen.rs.)
            let of = fh.and_then(|fh| self.io_file(req, ino, fh, true).ok());
            let fd = match &of {
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
            }?;
            self.attrs_changed(&node);
            if others_none {
                let a = fd.attr().map_err(errno)?;
                return Ok(self.attr_out(ino.0, &a));
            }
        }
        if others_none && set.size.is_none() {
            return self.touch_ctime(req, ino, &node);
        }
        let set = SetAttr { size: None, ..set };
        let c = self.creds(req);
        match self.with_node(ino, |n| self.cache.setattr_node(&c, n, &set)) {
            Ok(a) => {
                if a.nlink > 1 {
                    self.attrs_changed(&node);
                }
                Ok(self.attr_out(ino.0, &a))
            }
            Err(e) if e == Errno::ENOENT || e == Errno::ESTALE => {
                // fchmod/fchown/futimens of an open file whose name is gone: the kernel sends
                // no handle for those, but the inode is still open here.
                let of = self.any_open(ino.0).ok_or(e)?;
                let a = Self::setattr_fd(&of.fd, c.cred(), &set)?;
                self.attrs_changed(&node);
                Ok(self.attr_out(ino.0, &a))
            }
            Err(e) => Err(e),
        }
    }

    pub(super) fn readlink(&self, ino: INodeNo) -> Result<Vec<u8>, Errno> {
        self.node(ino)
            .and_then(|n| self.cache.readlink_node(&n).map_err(errno))
    }

    pub(super) fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> Result<EntryOut, Errno> {
        let dir = self.dir_node(parent)?;
        let c = self.creds(req);
        let n = with_caller_umask(mode, umask, |mode| {
            self.cache
                .mknod_at(&c, &dir, name.as_bytes(), mode, u64::from(rdev))
        })
        .map_err(|e| match e {
            // The kernel sends MKNOD only for a name it holds as missing (fs/namei.c
            // `lookup_open`, `filename_create`), and the backend has it: the kernel's entry
            // is stale (made in SRC before the change feed said so; the core dropped its own
            // copy). ESTALE makes the kernel look the path up again (LOOKUP_REVAL) and
            // decide on what it finds, as natively: mknod(2) and open(O_CREAT|O_EXCL) say
            // EEXIST, an open(O_CREAT) (`open=noopen` creates with MKNOD) opens the file as
            // its caller. (A MKNOD does not say whether the open had O_EXCL: replying with
            // the existing file's entry would let O_EXCL open it.)
            CoreError::Exists => {
                let _ = self
                    .notify
                    .send(NotifyMsg::InvalEntry(parent.0, name.as_bytes().to_vec()));
                Errno::ESTALE
            }
            e => Self::in_dir(&dir, errno(e)),
        })?;
        self.dir_changed(&dir);
        self.entry(parent, &n)
    }

    pub(super) fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
    ) -> Result<EntryOut, Errno> {
        let dir = self.dir_node(parent)?;
        let c = self.creds(req);
        let n = with_caller_umask(mode & 0o7777, umask, |mode| {
            self.cache.mkdir_at(&c, &dir, name.as_bytes(), mode)
        })
        .map_err(|e| Self::in_dir(&dir, errno(e)))?;
        self.dir_changed(&dir);
        self.entry(parent, &n)
    }

    pub(super) fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr) -> Result<(), Errno> {
        let dir = self.dir_node(parent)?;
        let c = self.creds(req);
        let victim = self.child(&c, &dir, name);
        let orphan = self.keep_orphan(&c, &dir, name);
        let open = victim.as_ref().and_then(|v| self.open_writer_told(v));
        let r = self
            .with_node(parent, |d| self.cache.unlink_at(&c, d, name.as_bytes()))
            .map_err(|e| Self::in_dir(&dir, e));
        if let (Err(_), Some(id)) = (&r, orphan) {
            self.drop_orphan(id);
        }
        r?;
        self.dir_changed(&dir);
        if let Some(v) = victim {
            self.attrs_changed(&v);
        }
        // The kernel drops the link count and moves the ctime of its inode itself at an
        // UNLINK (fs/fuse `fuse_entry_unlinked`): if its size and times were the file's
        // before, they are now, and the RELEASE of a writer still open (mkstemp's close and
        // unlink race the kernel's RELEASE) needs no invalidation (`kernel_told_current`).
        if let Some((id, of)) = open {
            if let Ok(a) = of.fd.attr() {
                self.inodes.told(id, &a);
            }
        }
        Ok(())
    }

    /// `victim`'s nodeid and an open handle of it when a writer has it open through the
    /// daemon and the kernel was last told its attributes as they are now.
    fn open_writer_told(&self, victim: &NodeRef) -> Option<(u64, Arc<super::handles::OpenFile>)> {
        let id = self.inodes.nodeid_of(victim)?;
        if !self.inodes.has_writers(id) {
            return None;
        }
        let of = self.any_open(id)?;
        let a = of.fd.attr().ok()?;
        self.inodes.told_is(id, &a).then_some((id, of))
    }

    pub(super) fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr) -> Result<(), Errno> {
        let dir = self.dir_node(parent)?;
        let c = self.creds(req);
        self.with_node(parent, |d| self.cache.rmdir_at(&c, d, name.as_bytes()))
            .map_err(|e| Self::in_dir(&dir, e))?;
        self.dir_changed(&dir);
        Ok(())
    }

    pub(super) fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
    ) -> Result<EntryOut, Errno> {
        let dir = self.dir_node(parent)?;
        let c = self.creds(req);
        let n = self
            .cache
            .symlink_at(
                &c,
                &dir,
                link_name.as_bytes(),
                target.as_os_str().as_bytes(),
            )
            .map_err(|e| Self::in_dir(&dir, errno(e)))?;
        self.dir_changed(&dir);
        self.entry(parent, &n)
    }

    pub(super) fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        let mode = Self::rename_mode(flags)?;
        let (dir, newdir) = match (self.dir_node(parent), self.dir_node(newparent)) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => return Err(e),
        };
        let c = self.creds(req);
        let moved = self.child(&c, &dir, name);
        let victim = self.child(&c, &newdir, newname);
        let moved_id = moved.as_ref().and_then(|m| self.inodes.nodeid_of(m));
        let victim_id = victim.as_ref().and_then(|v| self.inodes.nodeid_of(v));
        self.cache
            .rename_at(&c, &dir, name.as_bytes(), &newdir, newname.as_bytes(), mode)
            .map_err(|e| Self::in_dir(&newdir, Self::in_dir(&dir, errno(e))))?;
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
        Ok(())
    }

    pub(super) fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
    ) -> Result<EntryOut, Errno> {
        let (node, newdir) = match (self.node(ino), self.dir_node(newparent)) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => return Err(e),
        };
        let c = self.creds(req);
        let n = self
            .cache
            .link_at(&c, &node, &newdir, newname.as_bytes())
            .map_err(|e| Self::in_dir(&newdir, errno(e)))?;
        self.dir_changed(&newdir);
        self.attrs_changed(&node);
        // Fresh: the held inode was just marked changed.
        let a = match self.inodes.held(ino.0) {
            Some(h) => self.cache.attr_for_reply(&h, &n),
            None => self.cache.attr_of_name(&n),
        }
        .map_err(errno)?;
        let id = self.inodes.register(&self.cache, &n, &a, newparent.0);
        if id != ino.0 {
            self.queue_inval_inode(ino.0);
        }
        Ok(EntryOut {
            nodeid: INodeNo(id),
            attr: self.attr_for(id, &a),
            attr_ttl: self.attr_ttl_for(id, &a),
            entry_ttl: self.policy.entry_ttl,
            generation: Generation(self.inodes.generation(id)),
        })
    }

    /// ACCESS: with default_permissions the kernel checks access itself; answer existence.
    pub(super) fn access(&self, ino: INodeNo) -> Result<(), Errno> {
        self.node(ino).map(|_| ())
    }

    pub(super) fn statfs(&self) -> Result<StatFs, Errno> {
        match self.cache.backend().statfs(b"") {
            Ok(s) => Ok(s),
            // What the kernel assumes of a FUSE file system that does not implement STATFS.
            Err(CoreError::NotSupported) => Ok(StatFs {
                blocks: 0,
                bfree: 0,
                bavail: 0,
                files: 0,
                ffree: 0,
                bsize: 512,
                namelen: 255,
                frsize: 0,
            }),
            Err(e) => Err(errno(e)),
        }
    }
}
