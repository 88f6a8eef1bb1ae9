//! Containers under `-o open=noopen` (the kernel opens files itself: no OPEN, RELEASE or FLUSH
//! reaches the daemon; docs/opens.md, "On a remote mount"). What reaches the daemon are the
//! kernel's page-cache misses (READ) and its writes (WRITE, truncation, fallocate), each on the
//! inode the kernel named, with no handle (client/noopen.rs).
//!
//! - A READ is answered from the inode's container when it is *valid* (the same rule as for
//!   opens: its callback holds, or it was valid when the connection was lost and disconnected
//!   operation keeps the promises), with no round trip: [`Containers::kernel_reuse`].
//! - A write goes through to the server as it is made; once the server has acknowledged it
//!   (or failed it: it may have landed in part), the container is made invalid and the
//!   callback counter moves ([`Containers::kernel_written`]), so a fetch that overlapped the
//!   write is not valid either, and the next miss asks the server (Open, FileAttr: the version
//!   changed, the file is fetched again). No page-cache miss reads a container older than a
//!   write this client had acknowledged.
//! - No read grant is recorded for these reads (the kernel decided the access, not the
//!   server): an `open=rpc` mount taking the containers over still asks the server at open.

use std::sync::Arc;

use super::{Containers, Key};
use crate::client::{Conn, ContainerFile};
use dircache_core::Cred;

impl Containers {
    /// A read-only file on the container of `key` (the inode the kernel named, at `path`)
    /// when it is valid, whole and not being fetched: a page-cache miss answered with no
    /// round trip.
    pub(in crate::client) fn kernel_reuse(
        self: &Arc<Self>,
        conn: &Arc<Conn>,
        key: Key,
        path: &[u8],
        cred: &Cred,
    ) -> Option<ContainerFile> {
        let mut st = self.st.lock();
        st.clock += 1;
        let now = st.clock;
        let e = st.by_key.get_mut(&key)?;
        if !e.valid || e.fetching || e.attr.is_none() {
            return None;
        }
        e.opens += 1;
        e.used = now;
        let file = e.file.clone();
        st.stats.kernel_read_hits += 1;
        Some(ContainerFile {
            cc: self.clone(),
            key,
            file,
            remote: None,
            conn: conn.clone(),
            cred: cred.clone(),
            path: path.to_vec(),
            writable: false,
        })
    }

    /// A write to the file `key` went to the server (or failed, maybe in part): its container
    /// is no longer valid, and a fetch in flight is not either (the callback counter moves).
    pub(in crate::client) fn kernel_written(&self, key: Key) {
        let mut st = self.st.lock();
        st.gen += 1;
        st.stats.kernel_writes += 1;
        if let Some(e) = st.by_key.get_mut(&key) {
            Self::invalidate(e);
        }
    }
}
