//! Mutations through the cache. Each one checks permissions as Linux's VFS does (unless the
//! caller already did), asks the backend, then updates the cached tree so that it stays
//! exactly what the backend now holds.

use crate::file::BackendFile;
use std::sync::Arc;

use super::dentry::{COMPLETE, DEAD, HAS_CHILDREN, MOUNTED};
use super::path::{check_name, join};
use super::{Cache, Creds, NodeKind, NodeRef};
use crate::{Attr, Error, FileType, RenameMode, Result, SetAttr, TimeSet, R_OK, W_OK, X_OK};

/// Whether `a` is `b` or one of its ancestors.
fn is_ancestor(a: &NodeRef, b: &NodeRef) -> bool {
    let mut cur = Some(b.clone());
    while let Some(n) = cur {
        if Arc::ptr_eq(&n, a) {
            return true;
        }
        cur = n.parent_ref();
    }
    false
}

fn want_dir(n: &NodeRef) -> Result<()> {
    match n.kind() {
        NodeKind::Positive(FileType::Directory) if !n.has(DEAD) => Ok(()),
        NodeKind::Positive(FileType::Directory) => Err(Error::NotFound),
        NodeKind::Positive(_) => Err(Error::NotDir),
        NodeKind::Negative(e) => Err(e),
    }
}

impl Cache {
    fn check(&self, c: &Creds, node: &NodeRef, mask: u32) -> Result<()> {
        if c.0.check {
            let a = self.attr_of(node)?;
            self.policy.permission(&c.0.cred, &a, mask)?;
        }
        Ok(())
    }

    /// Linux's `may_delete` sticky rule: in a sticky directory only the owner of the file,
    /// the owner of the directory, or a privileged caller may remove or rename an entry.
    fn check_sticky(&self, c: &Creds, dir: &NodeRef, victim: &NodeRef) -> Result<()> {
        if !c.0.check {
            return Ok(());
        }
        let d = self.attr_of(dir)?;
        if d.mode & libc::S_ISVTX == 0 {
            return Ok(());
        }
        let v = self.attr_of(victim)?;
        let cred = &c.0.cred;
        if cred.uid == d.uid || cred.uid == v.uid || self.policy.owner_or_capable(cred, &v) {
            Ok(())
        } else {
            Err(Error::Perm)
        }
    }

    /// The checks before creating `parent/name`: search permission, EEXIST, then write.
    fn prepare_create(&self, c: &Creds, parent: &NodeRef, name: &[u8]) -> Result<()> {
        want_dir(parent)?;
        check_name(name)?;
        if name == b"." || name == b".." {
            return Err(Error::Exists);
        }
        self.check_absent(c, parent, name)?;
        self.check(c, parent, W_OK | X_OK)
    }

    /// EEXIST if `parent/name` exists. A positive the cache answered alone is confirmed by
    /// the backend first; if the backend no longer has it, the backend is asked again
    /// (stale.rs).
    fn check_absent(&self, c: &Creds, parent: &NodeRef, name: &[u8]) -> Result<()> {
        for _ in 0..2 {
            let mut missed = false;
            let existing = self.child_checked_counted(c, parent, name, &mut missed)?;
            if !matches!(existing.kind(), NodeKind::Positive(_)) {
                return Ok(());
            }
            if self.still_exists(parent, name, &existing, missed) {
                return Err(Error::Exists);
            }
        }
        // Contradicted twice: the backend's own create decides.
        Ok(())
    }

    /// Put a new positive dentry at `parent/name`, replacing whatever negative was there.
    fn install(&self, parent: &NodeRef, name: &[u8], attr: Attr, complete: bool) -> NodeRef {
        if attr.is_dir() {
            // A new inode: no directory that vanished earlier can turn up as it.
            self.forget_detached(&parent.sb, attr.dev, attr.ino);
        }
        let node = self.new_dentry(parent, name, NodeKind::Positive(attr.kind()), Some(attr));
        if complete && self.config.completeness {
            node.set(COMPLETE);
        }
        let old = {
            let mut inner = parent.inner.write();
            inner.bump_gen();
            parent.set(HAS_CHILDREN);
            inner.children_mut().insert(parent, node.clone())
        };
        self.account_new(&node);
        if let Some(old) = old {
            self.kill(&old);
        }
        // The parent's mtime, ctime (and nlink for directories) changed.
        parent.set_attr(None);
        node
    }

    fn create_with(
        &self,
        c: &Creds,
        parent: &NodeRef,
        name: &[u8],
        op: impl FnOnce(&[u8]) -> Result<Attr>,
    ) -> Result<NodeRef> {
        let _t = self.tree_lock.read();
        self.prepare_create(c, parent, name)?;
        let path = join(&self.path_of(parent)?, name);
        let attr = match self.stats.backend.mutation.time(|| op(&path)) {
            // The cache held the name as missing: no longer (stale.rs).
            Err(Error::Exists) => {
                self.drop_stale_child(parent, name, None);
                return Err(Error::Exists);
            }
            r => r?,
        };
        Ok(self.install(parent, name, attr, attr.is_dir()))
    }

    pub fn mkdir_at(&self, c: &Creds, parent: &NodeRef, name: &[u8], mode: u32) -> Result<NodeRef> {
        let b = parent.sb.backend.clone();
        // A new directory is complete and empty (SOSP'15 §5.1).
        self.create_with(c, parent, name, |p| b.mkdir(&c.0.cred, p, mode & 0o7777))
    }

    pub fn mknod_at(
        &self,
        c: &Creds,
        parent: &NodeRef,
        name: &[u8],
        mode: u32,
        rdev: u64,
    ) -> Result<NodeRef> {
        let mode = if mode & libc::S_IFMT == 0 {
            mode | libc::S_IFREG
        } else {
            mode
        };
        if mode & libc::S_IFMT == libc::S_IFDIR {
            return Err(Error::Perm);
        }
        let b = parent.sb.backend.clone();
        self.create_with(c, parent, name, |p| b.mknod(&c.0.cred, p, mode, rdev))
    }

    pub fn symlink_at(
        &self,
        c: &Creds,
        parent: &NodeRef,
        name: &[u8],
        target: &[u8],
    ) -> Result<NodeRef> {
        if target.is_empty() {
            return Err(Error::NotFound);
        }
        if target.len() >= crate::PATH_MAX {
            return Err(Error::NameTooLong);
        }
        if target.contains(&0) {
            return Err(Error::Invalid);
        }
        let b = parent.sb.backend.clone();
        let n = self.create_with(c, parent, name, |p| b.symlink(&c.0.cred, target, p))?;
        n.inner.write().set_target(target);
        Ok(n)
    }

    /// Hard link `node` as `newparent/newname`.
    pub fn link_at(
        &self,
        c: &Creds,
        node: &NodeRef,
        newparent: &NodeRef,
        newname: &[u8],
    ) -> Result<NodeRef> {
        if let NodeKind::Negative(e) = node.kind() {
            return Err(e);
        }
        want_dir(newparent)?;
        check_name(newname)?;
        let _t = self.tree_lock.read();
        // Order as Linux's do_linkat: the new name must not exist, same mount, the
        // protected_hardlinks rule (may_linkat), write permission (may_create), no directories.
        self.check_absent(c, newparent, newname)?;
        if !Arc::ptr_eq(&node.sb, &newparent.sb) {
            return Err(Error::CrossDevice);
        }
        if c.0.check && self.config.protected_hardlinks {
            let a = self.attr_of(node)?;
            let cred = &c.0.cred;
            let safe = a.kind() == FileType::Regular
                && a.mode & libc::S_ISUID == 0
                && !(a.mode & libc::S_ISGID != 0 && a.mode & 0o010 != 0)
                && self.policy.permission(cred, &a, R_OK | W_OK).is_ok();
            if !(self.policy.owner_or_capable(cred, &a) || safe) {
                return Err(Error::Perm);
            }
        }
        self.check(c, newparent, W_OK | X_OK)?;
        if node.is_dir() {
            return Err(Error::Perm);
        }
        let old = self.path_of(node)?;
        let new = join(&self.path_of(newparent)?, newname);
        let attr = match self
            .stats
            .backend
            .mutation
            .time(|| newparent.sb.backend.link(&c.0.cred, &old, &new))
        {
            Err(Error::Exists) => {
                self.drop_stale_child(newparent, newname, None);
                return Err(Error::Exists);
            }
            r => r?,
        };
        let n = self.install(newparent, newname, attr, false);
        let t = node.inner.read().target().map(<[u8]>::to_vec);
        if let Some(t) = t {
            n.inner.write().set_target(&t);
        }
        // Same inode: nlink and ctime changed for every name of it.
        node.set_attr(Some(attr));
        self.note_links(node, &attr);
        self.update_links(node, &attr, Some(attr));
        Ok(n)
    }

    /// Remove `parent/name` from the tree after the backend removed it: a negative entry
    /// takes its place (SOSP'15 §5.2).
    fn uninstall(&self, parent: &NodeRef, name: &[u8], victim: &NodeRef) {
        let neg = self
            .config
            .negatives
            .then(|| self.new_dentry(parent, name, NodeKind::Negative(Error::NotFound), None));
        {
            let mut inner = parent.inner.write();
            inner.bump_gen();
            let ch = inner.children_mut();
            match &neg {
                Some(n) => {
                    ch.insert(parent, n.clone());
                }
                None => {
                    ch.remove(name);
                }
            }
        }
        if let Some(n) = &neg {
            self.account_new(n);
        }
        {
            let _w = self.inval_window();
            self.kill(victim);
        }
        parent.set_attr(None);
    }

    pub fn unlink_at(&self, c: &Creds, parent: &NodeRef, name: &[u8]) -> Result<()> {
        want_dir(parent)?;
        let _t = self.tree_lock.read();
        let victim = self.child_checked(c, parent, name)?;
        if let NodeKind::Negative(e) = victim.kind() {
            return Err(e);
        }
        // Linux's may_delete: permission, sticky bit, then the victim's type.
        self.check(c, parent, W_OK | X_OK)?;
        self.check_sticky(c, parent, &victim)?;
        if victim.is_dir() {
            return Err(Error::IsDir);
        }
        let path = join(&self.path_of(parent)?, name);
        self.stats
            .backend
            .mutation
            .time(|| parent.sb.backend.unlink(&c.0.cred, &path))?;
        let a = victim.attr_copy();
        self.uninstall(parent, name, &victim);
        // The other names of the inode lost a link.
        match a {
            Some(a) => self.update_links(&victim, &a, None),
            None => self.forget_link_attrs(&victim),
        }
        Ok(())
    }

    pub fn rmdir_at(&self, c: &Creds, parent: &NodeRef, name: &[u8]) -> Result<()> {
        want_dir(parent)?;
        match name {
            b"." => return Err(Error::Invalid),
            b".." => return Err(Error::NotEmpty),
            _ => {}
        }
        let _t = self.tree_lock.read();
        let victim = self.child_checked(c, parent, name)?;
        if let NodeKind::Negative(e) = victim.kind() {
            return Err(e);
        }
        self.check(c, parent, W_OK | X_OK)?;
        self.check_sticky(c, parent, &victim)?;
        if !victim.is_dir() {
            return Err(Error::NotDir);
        }
        if victim.has(MOUNTED) {
            return Err(Error::Busy);
        }
        let path = join(&self.path_of(parent)?, name);
        self.stats
            .backend
            .mutation
            .time(|| parent.sb.backend.rmdir(&c.0.cred, &path))?;
        self.uninstall(parent, name, &victim);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub fn rename_at(
        &self,
        c: &Creds,
        parent: &NodeRef,
        name: &[u8],
        newparent: &NodeRef,
        newname: &[u8],
        mode: RenameMode,
    ) -> Result<()> {
        self.rename_slashes(c, parent, name, newparent, newname, mode, [false, false])
    }

    /// `rename_at`; `slash` says whether the old and the new path had a trailing slash, which
    /// Linux's `do_renameat2` checks only after the existence checks of both names.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rename_slashes(
        &self,
        c: &Creds,
        parent: &NodeRef,
        name: &[u8],
        newparent: &NodeRef,
        newname: &[u8],
        mode: RenameMode,
        slash: [bool; 2],
    ) -> Result<()> {
        // The checks follow the mode without the whiteout; the backend gets the whole mode.
        let (full, mode) = (mode, mode.base());
        want_dir(parent)?;
        want_dir(newparent)?;
        if matches!(name, b"." | b"..") {
            return Err(Error::Busy);
        }
        if matches!(newname, b"." | b"..") {
            return Err(if mode == RenameMode::NoReplace {
                Error::Exists
            } else {
                Error::Busy
            });
        }
        check_name(newname)?;
        let _t = self.tree_lock.write();
        let src = self.child_checked(c, parent, name)?;
        if let NodeKind::Negative(e) = src.kind() {
            return Err(e);
        }
        let dst = self.child_checked(c, newparent, newname)?;
        let dst_pos = matches!(dst.kind(), NodeKind::Positive(_));
        if !Arc::ptr_eq(&parent.sb, &newparent.sb) {
            return Err(Error::CrossDevice);
        }
        match mode {
            RenameMode::Exchange if !dst_pos => return Err(Error::NotFound),
            RenameMode::NoReplace if dst_pos => return Err(Error::Exists),
            RenameMode::Exchange if slash[1] && !dst.is_dir() => return Err(Error::NotDir),
            _ => {}
        }
        let src_dir = src.is_dir();
        // Unless the source is a directory, trailing slashes give ENOTDIR.
        if !src_dir && (slash[0] || (mode != RenameMode::Exchange && slash[1])) {
            return Err(Error::NotDir);
        }
        if Arc::ptr_eq(&src, &dst) {
            return Ok(());
        }
        // Linux's rename traps: a directory cannot move below itself (EINVAL), and a target
        // that is an ancestor of the source is not empty (EINVAL for an exchange).
        if src_dir && is_ancestor(&src, newparent) {
            return Err(Error::Invalid);
        }
        if dst_pos && dst.is_dir() && is_ancestor(&dst, parent) {
            return Err(if mode == RenameMode::Exchange {
                Error::Invalid
            } else {
                Error::NotEmpty
            });
        }
        if dst_pos {
            if let (Some(a), Some(b)) = (src.attr_copy(), dst.attr_copy()) {
                if a.ino == b.ino && a.dev == b.dev {
                    // Two names of one file: rename(2) does nothing and succeeds.
                    return Ok(());
                }
            }
        }
        // Linux's vfs_rename: may_delete on the source, then may_create or may_delete on the
        // target (permission and sticky bit before the types), then write permission on a
        // directory that moves to another parent (its `..` changes).
        self.check(c, parent, W_OK | X_OK)?;
        self.check_sticky(c, parent, &src)?;
        self.check(c, newparent, W_OK | X_OK)?;
        if dst_pos {
            self.check_sticky(c, newparent, &dst)?;
            if mode != RenameMode::Exchange {
                if src_dir && !dst.is_dir() {
                    return Err(Error::NotDir);
                }
                if !src_dir && dst.is_dir() {
                    return Err(Error::IsDir);
                }
            }
        }
        if !Arc::ptr_eq(parent, newparent) {
            if src_dir {
                self.check(c, &src, W_OK)?;
            }
            if mode == RenameMode::Exchange && dst.is_dir() {
                self.check(c, &dst, W_OK)?;
            }
        }
        if src.has(MOUNTED) || dst.has(MOUNTED) {
            return Err(Error::Busy);
        }
        let old = join(&self.path_of(parent)?, name);
        let new = join(&self.path_of(newparent)?, newname);
        let _w = self.inval_window();
        // From before the backend renames until the links below are updated, backend paths
        // computed from the old links may name other objects: a backend call by path that
        // overlaps this is asked again (`Cache::by_path`).
        let renaming = self.rename_begin();
        self.stats
            .backend
            .mutation
            .time(|| parent.sb.backend.rename(&c.0.cred, &old, &new, full))?;

        // After a whiteout rename the source name holds the whiteout: no negative there, and
        // the parent's listing is no longer all cached (the next lookup asks the backend).
        let neg = (mode != RenameMode::Exchange && !full.whiteout() && self.config.negatives)
            .then(|| self.new_dentry(parent, name, NodeKind::Negative(Error::NotFound), None));
        {
            // Lock both parents' maps in id order.
            let same = Arc::ptr_eq(parent, newparent);
            let (first, second) = if parent.id <= newparent.id {
                (parent, newparent)
            } else {
                (newparent, parent)
            };
            let mut g1 = first.inner.write();
            let mut g2 = if same {
                None
            } else {
                Some(second.inner.write())
            };
            let (pi, ni) = match (&mut g2, parent.id <= newparent.id) {
                (None, _) => (&mut *g1, None),
                (Some(g2), true) => (&mut *g1, Some(&mut **g2)),
                (Some(g2), false) => (&mut **g2, Some(&mut *g1)),
            };
            // Take the moving dentries out of their maps, relink them, file them again: a
            // dentry is always filed under the name in its link.
            let exchange = mode == RenameMode::Exchange;
            let new_link = |p: &NodeRef, n: &[u8]| {
                Arc::new(super::dentry::Link {
                    parent: Some(Arc::downgrade(p)),
                    name: n.into(),
                })
            };
            pi.bump_gen();
            pi.children_mut().remove_node(name, &src);
            match ni {
                Some(ni) => {
                    ni.bump_gen();
                    if exchange {
                        ni.children_mut().remove_node(newname, &dst);
                    }
                    src.set_link(new_link(newparent, newname));
                    if exchange {
                        dst.set_link(new_link(parent, name));
                        pi.children_mut().insert(parent, dst.clone());
                    }
                    ni.children_mut().insert(newparent, src.clone());
                }
                None => {
                    if exchange {
                        pi.children_mut().remove_node(newname, &dst);
                    }
                    src.set_link(new_link(newparent, newname));
                    if exchange {
                        dst.set_link(new_link(parent, name));
                        pi.children_mut().insert(parent, dst.clone());
                    }
                    pi.children_mut().insert(parent, src.clone());
                }
            }
            if let Some(n) = &neg {
                pi.children_mut().insert(parent, n.clone());
            }
            parent.set(HAS_CHILDREN);
            newparent.set(HAS_CHILDREN);
        }
        drop(renaming);
        if full.whiteout() {
            parent.clear(COMPLETE);
        }
        if let Some(n) = &neg {
            self.account_new(n);
        }
        self.bump_subtree(&src);
        if mode == RenameMode::Exchange {
            self.bump_subtree(&dst);
        } else {
            let a = dst.attr_copy();
            self.kill(&dst);
            if dst_pos {
                match a {
                    Some(a) => self.update_links(&dst, &a, None),
                    None => self.forget_link_attrs(&dst),
                }
            }
        }
        // mtime/ctime of both parents, ctime of the moved inodes, nlink of parents of a
        // moved directory.
        parent.set_attr(None);
        newparent.set_attr(None);
        src.set_attr(None);
        if mode == RenameMode::Exchange {
            dst.set_attr(None);
        }
        Ok(())
    }

    pub fn setattr_node(&self, c: &Creds, node: &NodeRef, set: &SetAttr) -> Result<Attr> {
        if let NodeKind::Negative(e) = node.kind() {
            return Err(e);
        }
        let _t = self.tree_lock.read();
        if c.0.check {
            let a = self.attr_of(node)?;
            let cred = &c.0.cred;
            let owner = self.policy.owner_or_capable(cred, &a);
            if set.mode.is_some() && !owner {
                return Err(Error::Perm);
            }
            if let Some(uid) = set.uid {
                if uid != a.uid && !cred.is_root() {
                    return Err(Error::Perm);
                }
            }
            if let Some(gid) = set.gid {
                if gid != a.gid && !(cred.is_root() || (cred.uid == a.uid && cred.in_group(gid))) {
                    return Err(Error::Perm);
                }
            }
            if set.size.is_some() {
                if a.is_dir() {
                    return Err(Error::IsDir);
                }
                self.policy.permission(cred, &a, W_OK)?;
            }
            let explicit = matches!(set.atime, Some(TimeSet::At(_)))
                || matches!(set.mtime, Some(TimeSet::At(_)));
            let now =
                matches!(set.atime, Some(TimeSet::Now)) || matches!(set.mtime, Some(TimeSet::Now));
            if explicit && !owner {
                return Err(Error::Perm);
            }
            if now && !explicit && !owner {
                self.policy.permission(cred, &a, W_OK)?;
            }
        }
        let path = self.path_of(node)?;
        let attr = self
            .stats
            .backend
            .mutation
            .time(|| node.sb.backend.setattr(&c.0.cred, &path, set))?;
        if set.changes_permissions() && node.is_dir() {
            // Who may search below this directory may have changed: new attributes and
            // version bumps inside one invalidation window (SOSP'15 §3.2).
            let _w = self.inval_window();
            node.set_attr(Some(attr));
            self.bump_subtree(node);
        } else {
            node.set_attr(Some(attr));
        }
        self.note_links(node, &attr);
        self.update_links(node, &attr, Some(attr));
        Ok(attr)
    }

    /// Open a file for data with open(2) `flags` (permission checked unless kernel-checked).
    pub fn open_node(&self, c: &Creds, node: &NodeRef, flags: i32) -> Result<Box<dyn BackendFile>> {
        let mask = match flags & libc::O_ACCMODE {
            libc::O_RDONLY => R_OK,
            libc::O_WRONLY => W_OK,
            _ => R_OK | W_OK,
        } | if flags & libc::O_TRUNC != 0 { W_OK } else { 0 };
        match node.kind() {
            NodeKind::Negative(e) => return Err(e),
            NodeKind::Positive(FileType::Directory) if mask & W_OK != 0 => {
                return Err(Error::IsDir)
            }
            _ => {}
        }
        self.check(c, node, mask)?;
        let path = self.path_of(node)?;
        let fd =
            node.sb
                .backend
                .open(&c.0.cred, &path, flags & !(libc::O_CREAT | libc::O_EXCL), 0)?;
        if flags & libc::O_TRUNC != 0 {
            self.forget_attr(node);
        }
        Ok(fd)
    }

    /// [`open_node`](Self::open_node) of `node` for reading as `c` without its
    /// supplementary groups, when the backend finds they cannot decide the open
    /// ([`Backend::open_read_groupless`](crate::Backend::open_read_groupless)); `Ok(None)`
    /// otherwise (then open with the groups).
    pub fn open_node_read_groupless(
        &self,
        c: &Creds,
        node: &NodeRef,
        flags: i32,
    ) -> Result<Option<Box<dyn BackendFile>>> {
        if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & (libc::O_TRUNC | libc::O_CREAT) != 0
        {
            return Ok(None);
        }
        if let NodeKind::Negative(e) = node.kind() {
            return Err(e);
        }
        self.check(c, node, R_OK)?;
        let path = self.path_of(node)?;
        node.sb
            .backend
            .open_read_groupless(&c.0.cred, &path, flags & !libc::O_EXCL)
    }

    /// Create and open regular file `parent/name` (O_CREAT; O_EXCL in `flags` honoured).
    /// Without O_EXCL, as natively, an existing file is opened and a missing one created,
    /// whatever the cache believed: a name the backend sees otherwise (changed there before
    /// its change feed said so) is asked again, up to [`CREATE_TRIES`] times (stale.rs).
    pub fn create_at(
        &self,
        c: &Creds,
        parent: &NodeRef,
        name: &[u8],
        mode: u32,
        flags: i32,
    ) -> Result<(NodeRef, Box<dyn BackendFile>)> {
        want_dir(parent)?;
        check_name(name)?;
        let excl = flags & libc::O_EXCL != 0;
        let mut tries = 0;
        loop {
            tries += 1;
            let last = tries >= CREATE_TRIES;
            let t = self.tree_lock.read();
            let mut missed = false;
            let existing = self.child_checked_counted(c, parent, name, &mut missed)?;
            if let NodeKind::Positive(_) = existing.kind() {
                if excl {
                    if last || self.still_exists(parent, name, &existing, missed) {
                        return Err(Error::Exists);
                    }
                    continue;
                }
                // Not under the lock: opening a FIFO waits for its other end.
                drop(t);
                match self.open_node(c, &existing, flags) {
                    Err(Error::NotFound) if !last => {
                        self.drop_stale_child(parent, name, Some(&existing));
                        continue;
                    }
                    r => return r.map(|fd| (existing, fd)),
                }
            }
            self.check(c, parent, W_OK | X_OK)?;
            let path = join(&self.path_of(parent)?, name);
            let b = &parent.sb.backend;
            let fd = match self.stats.backend.mutation.time(|| {
                b.open(
                    &c.0.cred,
                    &path,
                    flags | libc::O_CREAT | libc::O_EXCL,
                    mode & 0o7777,
                )
            }) {
                Err(Error::Exists) => {
                    self.drop_stale_child(parent, name, None);
                    if excl || last {
                        return Err(Error::Exists);
                    }
                    continue;
                }
                r => r?,
            };
            let attr = self.stats.backend.getattr.time(|| b.getattr(&path))?;
            let node = self.install(parent, name, attr, false);
            return Ok((node, fd));
        }
    }
}

/// How often [`Cache::create_at`] asks again when the backend contradicts the cache (a name
/// removed or created behind its back, perhaps again and again).
const CREATE_TRIES: u32 = 3;
