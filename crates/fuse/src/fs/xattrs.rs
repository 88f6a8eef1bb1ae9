//! Extended attributes through the FUSE front end: the target of a call (node, backend path,
//! the inode the kernel named) and the four xattr operations, each returning
//! `Result<T, Errno>` for the adapter (`fs.rs`) to reply.

use super::*;

/// The node of an xattr call, the backend of its file system, its path there and the
/// (dev, ino) the kernel's node is.
pub(super) struct XattrCall {
    pub(super) node: NodeRef,
    pub(super) backend: Arc<dyn Backend>,
    pub(super) path: Vec<u8>,
    pub(super) expect: Option<(u64, u64)>,
    /// The birth time digest the nodeid was given out with (0: unknown): a file that reused
    /// the number since is another file.
    pub(super) birth: u32,
    /// An open descriptor of the inode, for a file whose names are all gone.
    pub(super) open: Option<Arc<SharedFd>>,
}

impl XattrCall {
    pub(super) fn target(&self) -> XattrTarget<'_> {
        XattrTarget {
            path: &self.path,
            expect: self.expect,
            birth: self.birth,
            open: self.open.as_ref().and_then(|f| f.fd()),
        }
    }
}

impl CacheFs {
    /// What an xattr call on `ino` is about: the node, its backend path, and the (dev, ino)
    /// of the inode the kernel's node stands for. The backend acts on that inode only, with
    /// the caller's rights: a path renamed over from outside since the kernel's lookup gives
    /// ESTALE (the kernel then looks the name up again), never another user's file.
    pub(super) fn xattr_target(&self, ino: INodeNo) -> Result<XattrCall, Errno> {
        let node = self.node(ino)?;
        let expect = self.inodes.key(ino.0);
        let birth = self.inodes.birth(ino.0);
        if node.is_dead() {
            // A file unlinked while open: its open descriptor names it, as natively.
            let open = self.any_open(ino.0).map(|f| f.fd.clone());
            if let Some(open) = open {
                let backend = self.cache.node_backend(&node);
                return Ok(XattrCall {
                    node,
                    backend,
                    path: Vec::new(),
                    expect,
                    birth,
                    open: Some(open),
                });
            }
            // Its name is gone or names another inode (node() found no live alias): the
            // kernel looks the name up again on ESTALE.
            return Err(Errno::ESTALE);
        }
        let path = match self.cache.node_path(&node) {
            Ok(p) => p,
            // It (or a directory above it) died since node() found it: an outside change
            // applied meanwhile. As above: ESTALE, never ENOENT for a name that may exist.
            Err(CoreError::NotFound) => return Err(Errno::ESTALE),
            Err(e) => return Err(errno(e)),
        };
        let backend = self.cache.node_backend(&node);
        Ok(XattrCall {
            node,
            backend,
            path,
            expect,
            birth,
            open: None,
        })
    }

    /// The errno for a failed xattr call. ESTALE means the node's path names another inode
    /// now (renamed over from outside, the change not yet applied): forget that name here
    /// and in the kernel first, so that the kernel's retry (it looks the name up again on
    /// ESTALE) finds the file that is there now, as a native call would.
    ///
    /// ENOENT from the backend for a node's path means the same: the name was removed from
    /// outside and the change feed has not reported it yet (the kernel's dentry and the
    /// core's are both from before). An ENOENT would fail an `open(O_CREAT)` that natively
    /// creates the file (the kernel reads the old inode's ACL for its permission check):
    /// forget the name and answer ESTALE, so the kernel's retry sees the name missing.
    pub(super) fn xattr_error(&self, ino: INodeNo, x: &XattrCall, e: CoreError) -> Errno {
        let gone = e == CoreError::NotFound && x.open.is_none();
        if (e == CoreError::Stale || gone) && Arc::ptr_eq(&x.backend, self.cache.backend()) {
            self.forget_name(ino, &x.node, &x.path);
            if gone {
                return Errno::ESTALE;
            }
        }
        errno(e)
    }

    /// Forget the name `path` of `node` (the kernel's `ino`) here and in the kernel: it names
    /// another inode or none now, changed outside and not yet reported.
    pub(super) fn forget_name(&self, ino: INodeNo, node: &NodeRef, path: &[u8]) {
        let parent = self.parent_nodeid(node);
        let invals = self.cache.invalidate(path);
        let mut msgs = vec![
            NotifyMsg::InvalEntry(parent, node.name()),
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

    pub(super) fn xattr_blocked(&self, name: &OsStr) -> bool {
        !self.policy.security_xattrs && name.as_bytes().starts_with(b"security.")
    }

    /// An xattr value (or list) for a call with buffer `size`: its size when the caller asks
    /// for it (0), ERANGE when it does not fit.
    pub(super) fn xattr_out(size: u32, v: Vec<u8>) -> Result<XattrOut, Errno> {
        if size == 0 {
            Ok(XattrOut::Size(v.len() as u32))
        } else if (size as usize) < v.len() {
            Err(Errno::from_i32(libc::ERANGE))
        } else {
            Ok(XattrOut::Data(v))
        }
    }

    pub(super) fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
    ) -> Result<(), Errno> {
        if self.xattr_blocked(name) {
            return Err(Errno::from_i32(libc::EOPNOTSUPP));
        }
        let x = self.xattr_target(ino)?;
        let c = self.creds(req);
        x.backend
            .setxattr(c.cred(), x.target(), name.as_bytes(), value, flags)
            .map_err(|e| self.xattr_error(ino, &x, e))?;
        self.attrs_changed(&x.node);
        Ok(())
    }

    pub(super) fn getxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        size: u32,
    ) -> Result<XattrOut, Errno> {
        if ino.0 == self.inodes.root() && name.as_bytes() == SOCKET_XATTR.as_bytes() {
            if let Some(p) = &self.socket_path {
                return Self::xattr_out(size, p.as_os_str().as_bytes().to_vec());
            }
        }
        if let Some(r) = self.fsroot_xattr(ino, name, size) {
            return r;
        }
        if self.xattr_blocked(name) {
            return Err(Errno::from_i32(libc::EOPNOTSUPP));
        }
        // The kernel's POSIX ACL fetch (FUSE_POSIX_ACL): answer a known absence directly.
        let acl_bit = crate::lean::acl_bit(name.as_bytes());
        let acl_key = if acl_bit != 0 {
            // Listings fetch ACLs ahead while the kernel asks for them (`lean.rs`).
            self.lean.acl_asked();
            self.inodes.key(ino.0)
        } else {
            None
        };
        // The file the nodeid was given out for (its birth): not another that reused the number.
        let birth = self.inodes.birth(ino.0);
        if let Some(k) = acl_key {
            if self.cache.xattr_known_absent(k, birth, acl_bit) {
                self.counters.acl_memo_hits.fetch_add(1, Ordering::Relaxed);
                return Err(Errno::from_i32(libc::ENODATA));
            }
        }
        let acl_gen = self.cache.xattr_memo_gen();
        let x = self.xattr_target(ino)?;
        // Groups matter for user.* reads only (the kernel's ACL fetches need none).
        let c = if acl_bit != 0 {
            self.read_creds(req)
        } else {
            self.creds(req)
        };
        dircache_core::before_backend_call();
        let v = match x.backend.getxattr(c.cred(), x.target(), name.as_bytes()) {
            Ok(v) => v,
            Err(e) => {
                if e.errno() == libc::ENODATA {
                    if let Some(k) = acl_key {
                        self.cache.note_xattr_absent(k, birth, acl_bit, acl_gen);
                    }
                }
                return Err(self.xattr_error(ino, &x, e));
            }
        };
        Self::xattr_out(size, v)
    }

    pub(super) fn listxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        size: u32,
    ) -> Result<XattrOut, Errno> {
        let x = self.xattr_target(ino)?;
        let c = self.creds(req);
        let names = x
            .backend
            .listxattr(c.cred(), x.target())
            .map_err(|e| self.xattr_error(ino, &x, e))?;
        let list: Vec<u8> = names
            .split(|b| *b == 0)
            .filter(|n| !n.is_empty() && !self.xattr_blocked(OsStr::from_bytes(n)))
            .flat_map(|n| n.iter().copied().chain(std::iter::once(0)))
            .collect();
        Self::xattr_out(size, list)
    }

    pub(super) fn removexattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
    ) -> Result<(), Errno> {
        if self.xattr_blocked(name) {
            return Err(Errno::from_i32(libc::EOPNOTSUPP));
        }
        let x = self.xattr_target(ino)?;
        let c = self.creds(req);
        x.backend
            .removexattr(c.cred(), x.target(), name.as_bytes())
            .map_err(|e| self.xattr_error(ino, &x, e))?;
        self.attrs_changed(&x.node);
        Ok(())
    }
}
