//! The synthetic FUSE root of a mount that serves SRC one directory below it
//! (`rootmount.rs`): nodeid 1 is a directory holding one name, `rootmount::SERVED_NAME`,
//! SRC's root (nodeid `Inodes::root`). Only the daemon reaches it, while it attaches the
//! served tree on MNT (the kernel asks GETATTR of the root, then LOOKUP of the name); every
//! other request naming nodeid 1 finds no node (ESTALE), as for any nodeid the daemon does
//! not know.

use super::*;

impl CacheFs {
    /// Whether nodeid 1 is the synthetic root (SRC's root has another nodeid).
    fn synthetic(&self, ino: INodeNo) -> bool {
        ino.0 == ROOT && self.inodes.root() != ROOT
    }

    /// GETATTR of the synthetic root; `None` for every other nodeid.
    pub(super) fn synthetic_getattr(&self, ino: INodeNo) -> Option<Result<AttrOut, Errno>> {
        if !self.synthetic(ino) {
            return None;
        }
        let (uid, gid) = (
            rustix::process::geteuid().as_raw(),
            rustix::process::getegid().as_raw(),
        );
        Some(Ok(AttrOut {
            attr: FileAttr {
                ino: INodeNo(ROOT),
                size: 0,
                blocks: 0,
                atime: UNIX_EPOCH,
                mtime: UNIX_EPOCH,
                ctime: UNIX_EPOCH,
                crtime: UNIX_EPOCH,
                kind: fuser::FileType::Directory,
                perm: crate::rootmount::SYNTHETIC_ROOT_MODE as u16,
                nlink: 3,
                uid,
                gid,
                rdev: 0,
                blksize: 4096,
                flags: 0,
            },
            ttl: self.policy.attr_ttl,
        }))
    }

    /// LOOKUP in the synthetic root: SRC's root under `rootmount::SERVED_NAME` (its nodeid
    /// is never forgotten, so the reply takes no reference), ENOENT for any other name;
    /// `None` when `parent` is not the synthetic root. The attributes come with TTL 0: MNT's
    /// first `stat` asks the daemon, as for a FUSE root made from `rootmode` (a daemon
    /// killed before anyone used the mount leaves a root that answers ENOTCONN, which the
    /// CLI reports as a dead mount to unmount).
    pub(super) fn synthetic_lookup(
        &self,
        parent: INodeNo,
        name: &OsStr,
    ) -> Option<Result<EntryOut, Errno>> {
        if !self.synthetic(parent) {
            return None;
        }
        if name.as_bytes() != crate::rootmount::SERVED_NAME.as_bytes() {
            return Some(Err(Errno::ENOENT));
        }
        let root = INodeNo(self.inodes.root());
        Some(self.getattr(root, None).map(|a| EntryOut {
            nodeid: root,
            attr: a.attr,
            attr_ttl: Duration::ZERO,
            entry_ttl: self.policy.entry_ttl,
            generation: Generation(self.inodes.generation(root.0)),
        }))
    }

    /// GETXATTR of `rootmount::FSROOT_XATTR` on SRC's root when it is served below the FUSE
    /// root: `/src`; `None` otherwise (the name is then an ordinary xattr).
    pub(super) fn fsroot_xattr(
        &self,
        ino: INodeNo,
        name: &OsStr,
        size: u32,
    ) -> Option<Result<XattrOut, Errno>> {
        let root = self.inodes.root();
        if root == ROOT || ino.0 != root || name != crate::rootmount::FSROOT_XATTR {
            return None;
        }
        let v = format!("/{}", crate::rootmount::SERVED_NAME).into_bytes();
        Some(Self::xattr_out(size, v))
    }
}
