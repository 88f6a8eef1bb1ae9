//! A read-only view of what the cache holds, for `dircache cached`: which children a directory
//! has cached (positive and negative), whether it is complete, its version. Nothing here asks
//! the backend or changes the cache (no CLOCK bit is set, no pending snapshot contents are
//! installed); each call takes one dentry's `inner` read lock for a snapshot and releases it.
//!
//! Who may see the names is not decided here: a front end answering a user (outside a FUSE
//! request) must check that the user could list the directory (crates/fuse/src/cacheview.rs).

use super::dentry::PENDING;
use super::{Dentry, NodeRef};

impl Dentry {
    /// The child `name` as the cache holds it (positive or negative), without asking the
    /// backend; `None` if nothing is cached under that name.
    pub fn cached_child(&self, name: &[u8]) -> Option<NodeRef> {
        self.inner.read().child(name).cloned()
    }

    /// Every child the cache holds (positive entries, negative entries, and the negatives
    /// hanging below a negative or a file), in no particular order.
    pub fn cached_children(&self) -> Vec<NodeRef> {
        self.inner
            .read()
            .children
            .as_ref()
            .map(|c| c.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Call `f` with every child [`Dentry::cached_children`] would return, under this
    /// dentry's read lock and without cloning a reference to each (a search over a held tree
    /// visits every dentry once: one atomic increment and decrement each was a tenth of its
    /// time). `f` must not call into the cache; reading the child's own state is fine.
    pub fn for_each_cached_child(&self, mut f: impl FnMut(&NodeRef)) {
        if let Some(c) = self.inner.read().children.as_ref() {
            c.values().for_each(&mut f);
        }
    }

    /// Call `f` with the current name, without copying it.
    pub fn with_name<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        let link = self.link();
        f(&link.name)
    }

    /// `(dev, ino)` as last known: the inode number is kept even for entries learned from a
    /// listing; the device is 0 if attributes were never stored.
    pub fn identity(&self) -> (u64, u64) {
        (self.attr.dev(), self.attr.ino())
    }

    /// Whether a warm-restart snapshot's contents for this directory wait to be installed at
    /// its first use (they are not counted as cached children until then).
    pub fn is_pending(&self) -> bool {
        self.has(PENDING)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::memory::MemoryBackend;
    use crate::{At, Backend, Cache, Config, Cred, LookupFlags};

    #[test]
    fn children_listed_without_backend_calls() {
        let b = Arc::new(MemoryBackend::new());
        let r = Cred::root();
        b.mkdir(&r, b"d", 0o755).unwrap();
        b.mknod(&r, b"d/f", 0o100644, 0).unwrap();
        let cache = Cache::new(b, Config::default()).unwrap();
        let me = cache.credentials(Cred::root());
        assert!(cache.readdir(&me, At::Root, b"d").is_ok());
        assert!(cache
            .stat(&me, At::Root, b"d/missing", LookupFlags::NOFOLLOW)
            .is_err());
        let root = cache.root();
        let d = root.cached_child(b"d").expect("d cached");
        assert!(d.is_complete());
        let before = cache.stats();
        let mut names: Vec<_> = d
            .cached_children()
            .iter()
            .map(|c| (c.name(), c.file_type().is_some()))
            .collect();
        names.sort();
        assert_eq!(
            names,
            vec![(b"f".to_vec(), true), (b"missing".to_vec(), false)]
        );
        assert!(root.cached_child(b"nothing").is_none());
        let after = cache.stats();
        assert_eq!(before.backend_lookup, after.backend_lookup);
        assert_eq!(before.backend_readdir, after.backend_readdir);
    }
}
