//! `-o open=noopen` on a remote mount with containers (docs/opens.md, "On a remote mount"):
//! the kernel opens files itself, and the front end opens the inode it names for each READ
//! and WRITE through [`Backend::open_verified`](dircache_core::Backend::open_verified) (as
//! the daemon: the kernel decided the access at open, from the server's mode bits and ACLs;
//! dircache_fuse's fs/noopen.rs). Here such an open of a regular file is served by its
//! container (container/kernel.rs):
//!
//! - **read** (a page-cache miss): a valid container of that very inode (the `(dev, ino)`
//!   the kernel's nodeid was given out for) answers with no round trip, connected or not;
//!   otherwise the server is asked (`OpenVerified`, `FileAttr`) and a file up to
//!   `whole_file_max` is fetched whole into its container (or found unchanged), so the next
//!   misses, and misses while disconnected, are local; larger files are read in ranges.
//! - **write** (WRITE, truncation, fallocate, copy_file_range into it): through to the server
//!   as before, by a [`WriteThrough`] file that makes the container invalid once each call
//!   returned. While disconnected the open fails (ETIMEDOUT) and so does the write(2): see
//!   docs/opens.md for why such writes are not logged.
//!
//! Credentials: a READ carries the uid of whichever task caused it (readahead, a descriptor
//! passed to another process, mmap faults), not necessarily the opener's, so it is never
//! checked against the requester; what it may read is what the kernel's open file may read.
//! The container is only ever used for a READ or WRITE the kernel sends for a file it opened
//! with that access, on the inode it named: the front end resolves the nodeid to its path
//! and `(dev, ino)` (ESTALE when it has neither), and a container of another inode is never
//! used.

use std::sync::Arc;

use dircache_core::{Attr, BackendFile, Cred, Result, SetAttr, Whence, XattrTarget};

use super::{target, Containers, RemoteBackend};
use crate::proto::{Reply, Request};

impl RemoteBackend {
    /// [`Backend::open_verified`](dircache_core::Backend::open_verified) of a regular file
    /// for I/O, with containers (module docs); `None`: not such an open (a directory, an
    /// `O_PATH` descriptor, no identity to check), for the plain path.
    pub(super) fn kernel_open(
        &self,
        cc: &Arc<Containers>,
        cred: &Cred,
        t: XattrTarget<'_>,
        flags: i32,
    ) -> Option<Result<Box<dyn BackendFile>>> {
        if flags & (libc::O_PATH | libc::O_DIRECTORY) != 0 {
            return None;
        }
        let key = t.expect?;
        if flags & libc::O_ACCMODE != libc::O_RDONLY {
            return Some(self.kernel_open_for_writing(cc, cred, t, flags, key));
        }
        // The connection as it is: while disconnected, a container valid at the loss.
        let now = self.conn.lock().clone();
        if let Some(f) = cc.kernel_reuse(&now, key, t.path, cred) {
            return Some(Ok(Box::new(f)));
        }
        Some(self.kernel_fetch(cc, cred, t, flags))
    }

    /// A page-cache miss no valid container answers: ask the server, then fetch the file
    /// whole into its container (unless that version is held already) when it is small
    /// enough, else read in ranges.
    fn kernel_fetch(
        &self,
        cc: &Arc<Containers>,
        cred: &Cred,
        t: XattrTarget<'_>,
        flags: i32,
    ) -> Result<Box<dyn BackendFile>> {
        let conn = self.conn()?;
        // Before the server is asked: a callback (or a write) from now on makes what it says
        // not valid.
        let gen = cc.gen();
        let r = conn.call_as(
            &cred.into(),
            Request::OpenVerified {
                target: target(&t),
                flags,
            },
        )?;
        let Reply::Opened { handle, writable } = r else {
            return Err(dircache_core::Error::Os(libc::EPROTO));
        };
        let rf = self.remote_file(
            conn.clone(),
            handle,
            writable,
            t.path,
            cred,
            flags,
            t.expect,
        );
        let attr = rf.attr()?;
        if attr.mode & libc::S_IFMT != libc::S_IFREG
            || attr.size > cc.whole_file_max
            || Some((attr.dev, attr.ino)) != t.expect
        {
            return Ok(Box::new(rf));
        }
        Ok(Box::new(cc.open(
            &conn, t.path, cred, flags, rf, None, attr, gen, false,
        )?))
    }

    /// A write's open: the server's file, wrapped so that each change invalidates the
    /// container of `key`.
    fn kernel_open_for_writing(
        &self,
        cc: &Arc<Containers>,
        cred: &Cred,
        t: XattrTarget<'_>,
        flags: i32,
        key: (u64, u64),
    ) -> Result<Box<dyn BackendFile>> {
        let c = self.conn()?;
        let r = c.call_as(
            &cred.into(),
            Request::OpenVerified {
                target: target(&t),
                flags,
            },
        )?;
        Ok(Box::new(WriteThrough {
            inner: self.file(c, r, t.path, cred, flags, t.expect)?,
            cc: cc.clone(),
            key,
        }))
    }
}

/// A server file opened for a write under `open=noopen`: every call that may change the
/// data makes the container of `key` invalid once it returned (module docs).
struct WriteThrough {
    inner: Box<dyn BackendFile>,
    cc: Arc<Containers>,
    key: (u64, u64),
}

impl WriteThrough {
    fn changed<T>(&self, r: Result<T>) -> Result<T> {
        self.cc.kernel_written(self.key);
        r
    }
}

impl BackendFile for WriteThrough {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, cred: &Cred, data: &[u8], offset: u64, append: bool) -> Result<usize> {
        self.changed(self.inner.write_at(cred, data, offset, append))
    }

    fn sync(&self, datasync: bool) -> Result<()> {
        self.inner.sync(datasync)
    }

    fn allocate(&self, cred: &Cred, mode: i32, offset: u64, len: u64) -> Result<()> {
        self.changed(self.inner.allocate(cred, mode, offset, len))
    }

    fn seek(&self, offset: i64, whence: Whence) -> Result<u64> {
        self.inner.seek(offset, whence)
    }

    fn set_size(&self, cred: &Cred, size: u64) -> Result<()> {
        self.changed(self.inner.set_size(cred, size))
    }

    fn setattr(&self, cred: &Cred, set: &SetAttr) -> Result<Attr> {
        // Times, mode, owner: the version moves (ctime), the data does not; invalid anyway.
        self.changed(self.inner.setattr(cred, set))
    }

    fn attr(&self) -> Result<Attr> {
        self.inner.attr()
    }

    fn writable(&self) -> bool {
        self.inner.writable()
    }

    fn flush(&self) -> Result<()> {
        self.inner.flush()
    }
}
