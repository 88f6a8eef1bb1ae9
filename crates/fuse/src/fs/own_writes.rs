//! Passthrough writes made through the mount, as the change feed sees them.
//!
//! With passthrough the kernel writes the backing file itself, in the writing thread's
//! context, and the daemon never hears of it: fanotify reports each such write as a change
//! made by that thread, like one made in SRC. The kernel already knows (it invalidates the
//! size and times of its inode after every passthrough write, `fuse_write_update_attr`, and
//! drops attributes of replies sent before the write by their attribute version), so the
//! feed's report needs no kernel invalidation. For as long as a writable passthrough handle
//! is open, the daemon registers (opening thread, file) with the backend
//! ([`Backend::own_writes_begin`](dircache_core::Backend::own_writes_begin)); the notifier
//! applies a report the backend marks as such a write to the core only (`notifier.rs`).

use super::*;

impl CacheFs {
    /// The file to register for a passthrough handle of `node` about to be opened: the
    /// daemon's `fd` when the handle may write and `node` is on the backend whose feed the
    /// notifier reads.
    pub(super) fn own_writes_file(
        &self,
        writable: bool,
        node: &NodeRef,
        fd: &Arc<SharedFd>,
    ) -> Option<Arc<SharedFd>> {
        (writable && Arc::ptr_eq(&self.cache.node_backend(node), self.cache.backend()))
            .then(|| fd.clone())
    }

    /// The passthrough handle `fh` of `file` (from [`CacheFs::own_writes_file`]) was opened
    /// by the thread of `req`: register it before the reply lets the thread write.
    pub(super) fn own_writes_begin(&self, pid: u32, fh: u64, file: Option<Arc<SharedFd>>) {
        let Some(file) = file else {
            return;
        };
        match i32::try_from(pid) {
            Ok(tid) if tid > 0 => self.cache.backend().own_writes_begin(fh, tid, &**file),
            _ => {}
        }
    }

    /// The handle `fh` is released: no write through it can follow.
    pub(super) fn own_writes_end(&self, fh: u64) {
        self.cache.backend().own_writes_end(fh);
    }
}
