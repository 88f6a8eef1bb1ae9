//! Open files of the in-memory backend: what [`MemoryBackend`](super::MemoryBackend)'s
//! `open` and `open_verified` return.
//!
//! A [`MemFile`] is an [`FdFile`] over its own open file description of the file's memfd
//! (none for a directory, or with `O_PATH`) for the data, and the backend's tree for
//! everything else: its attributes are the inode's (merged with the memfd's data half, see
//! `content`), and chmod, chown, utimens and truncation through it are the tree's setattr, as
//! the caller. A write or an allocation by a caller without CAP_FSETID drops the file's
//! set-id bits in the tree, as a kernel file system does (the memfd's own mode means
//! nothing).
//!
//! **Invariant (orphans).** While a `MemFile` of an inode exists, the inode stays in the tree
//! (`Inode::opens` counts them): when its last name goes it is kept with link count 0 (an
//! orphan, in no directory), so the open file still has attributes and can be changed, as an
//! unlinked open file natively; the last `MemFile`'s drop removes it.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;

use parking_lot::Mutex;

use super::{notify, Feeds, Tree, MEMORY_DEV, ROOT_INO};
use crate::file::{BackendFile, FdFile, Whence};
use crate::{Attr, Change, Cred, Error, Result, SetAttr};

/// An open file of a [`MemoryBackend`](super::MemoryBackend) (module docs).
pub struct MemFile {
    tree: Arc<Mutex<Tree>>,
    ino: u64,
    /// The data: an open file description of the memfd (regular files, not `O_PATH`).
    data: Option<FdFile>,
    /// The backend's change feeds, when it reports its changes.
    feeds: Option<Feeds>,
}

impl MemFile {
    /// An open file of inode `ino` of `tree` (`t`: the locked tree), over `fd` for data.
    pub(super) fn new(
        tree: &Arc<Mutex<Tree>>,
        t: &mut Tree,
        ino: u64,
        fd: Option<OwnedFd>,
        feeds: Option<Feeds>,
    ) -> Result<MemFile> {
        t.get_mut(ino)?.opens += 1;
        Ok(MemFile {
            tree: tree.clone(),
            ino,
            data: fd.map(FdFile::new),
            feeds,
        })
    }

    fn data(&self) -> Result<&FdFile> {
        self.data.as_ref().ok_or(Error::Os(libc::EBADF))
    }

    /// Report a change of this file's attributes (it may have no name left to report).
    fn changed(&self) {
        if let Some(f) = &self.feeds {
            notify(
                f,
                &[Change::Inode {
                    dev: MEMORY_DEV,
                    ino: self.ino,
                }],
            );
        }
    }

    /// After `cred` changed the data: set-id bits dropped as for that caller.
    fn modified(&self, cred: &Cred) -> Result<()> {
        self.tree.lock().remove_privs(cred, self.ino)?;
        self.changed();
        Ok(())
    }
}

impl Drop for MemFile {
    fn drop(&mut self) {
        let mut t = self.tree.lock();
        let gone = match t.inodes.get_mut(&self.ino) {
            Some(n) => {
                n.opens = n.opens.saturating_sub(1);
                n.opens == 0 && n.attr.nlink == 0 && self.ino != ROOT_INO
            }
            None => false,
        };
        if gone {
            t.inodes.remove(&self.ino);
        }
    }
}

impl BackendFile for MemFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        self.data()?.read_at(buf, offset)
    }

    fn write_at(&self, cred: &Cred, data: &[u8], offset: u64, append: bool) -> Result<usize> {
        let n = self.data()?.write_at(cred, data, offset, append)?;
        if n > 0 {
            self.modified(cred)?;
        }
        Ok(n)
    }

    fn sync(&self, datasync: bool) -> Result<()> {
        match &self.data {
            Some(f) => f.sync(datasync),
            // Nothing to make durable (a directory), as on tmpfs.
            None => Ok(()),
        }
    }

    fn allocate(&self, cred: &Cred, mode: i32, offset: u64, len: u64) -> Result<()> {
        self.data()?.allocate(cred, mode, offset, len)?;
        self.modified(cred)
    }

    fn seek(&self, offset: i64, whence: Whence) -> Result<u64> {
        self.data()?.seek(offset, whence)
    }

    /// The tree's truncation as `cred` (set-id bits dropped for a caller without
    /// CAP_FSETID); through a file not opened for writing, write permission is checked, as
    /// for open(O_TRUNC).
    fn set_size(&self, cred: &Cred, size: u64) -> Result<()> {
        let set = SetAttr {
            size: Some(size),
            ..SetAttr::default()
        };
        self.tree
            .lock()
            .setattr_as(cred, self.ino, &set, self.writable())?;
        self.changed();
        Ok(())
    }

    fn setattr(&self, cred: &Cred, set: &SetAttr) -> Result<Attr> {
        let set = SetAttr { size: None, ..*set };
        let a = {
            let mut t = self.tree.lock();
            t.setattr(cred, self.ino, &set)?;
            t.attr(self.ino)?
        };
        self.changed();
        Ok(a)
    }

    fn attr(&self) -> Result<Attr> {
        self.tree.lock().attr(self.ino)
    }

    fn writable(&self) -> bool {
        self.data.as_ref().is_some_and(|f| f.writable())
    }

    fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.data.as_ref().and_then(|f| f.fd())
    }

    fn as_caller(
        &self,
        cred: &Cred,
        shared: bool,
        f: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        self.data()?.as_caller(cred, shared, f)
    }

    // `copy_to`: the trait's default (a read here, a `write_at` of the destination), so that
    // a memory destination sees the write as its caller's (set-id bits).
}
