//! Answers of the cache that a mutation finds stale: the name was changed in the backend
//! before its change feed said so (or with no feed at all), and the cache still holds the
//! old answer — a positive for a name that is gone, or a negative (or nothing) for one that
//! exists.
//!
//! A mutation must not fail for a reason that exists only in the cache. Natively an
//! open(O_CREAT) without O_EXCL opens the file at the name or creates it, and never fails
//! with EEXIST (nor with ENOENT for a missing last name); O_EXCL, mknod, mkdir, symlink and
//! link say EEXIST exactly when the name exists. So EEXIST is answered only when the backend
//! says so: a positive the cache answered without asking is confirmed by the backend first
//! ([`Cache::still_exists`]), and whatever the backend contradicts is dropped
//! ([`Cache::drop_stale_child`]), so that the next lookup of the name asks the backend.
//! The cost is one backend lookup, only when a creation meets a name the cache holds as
//! existing (through FUSE: only when the kernel believed it missing, which it does only when
//! the kernel's and the cache's views differ).

use std::sync::Arc;

use super::dentry::COMPLETE;
use super::{Cache, NodeKind, NodeRef};
use crate::Error;

impl Cache {
    /// Whether the positive `node` found at `parent/name` still exists in the backend: true
    /// without asking when the backend just gave it (`missed`). A positive the backend no
    /// longer has is dropped.
    pub(crate) fn still_exists(
        &self,
        parent: &NodeRef,
        name: &[u8],
        node: &NodeRef,
        missed: bool,
    ) -> bool {
        if missed {
            return true;
        }
        let r = self.backend_lookup(parent, name);
        match r {
            Ok(Err(Error::NotFound)) => {
                self.drop_stale_child(parent, name, Some(node));
                false
            }
            // Present, or no clear answer: the cache's answer stands.
            _ => true,
        }
    }

    /// Drop the cache's entry for `parent/name` after the backend contradicted it: `stale`
    /// is the positive found gone (only it is dropped: a dentry installed meanwhile by a
    /// mutation through the cache stays); `None` when the backend has the name and the
    /// cache a negative or nothing (a negative is dropped). Either way the parent's listing
    /// and attributes changed behind the cache's back, and a lookup of the name racing this
    /// does not cache the answer it got before (`gen`).
    pub(crate) fn drop_stale_child(&self, parent: &NodeRef, name: &[u8], stale: Option<&NodeRef>) {
        let _w = self.inval_window();
        let removed = {
            let mut pi = parent.inner.write();
            let found = match (pi.child(name), stale) {
                (Some(cur), Some(s)) => Arc::ptr_eq(cur, s),
                (Some(cur), None) => matches!(cur.kind(), NodeKind::Negative(_)),
                (None, _) => false,
            };
            pi.bump_gen();
            if found {
                pi.children.as_mut().and_then(|ch| ch.remove(name))
            } else {
                None
            }
        };
        parent.clear(COMPLETE);
        parent.set_attr(None);
        if let Some(r) = &removed {
            self.retire(r);
        }
    }
}
