//! Bypass mode (`Config::bypass`, ByVFS, `../shared/papers/byvfs-bypass-vfs-for-pm.txt`): for
//! a memory-speed backend (tmpfs, pmem) the cache's bookkeeping can cost more than the
//! backend call it saves. In bypass mode every query is answered by the backend:
//!
//! - a lookup asks the backend every time ([`Cache::child_bypass`]) and reconciles the cached
//!   name with the answer (same inode: fresh attributes on the same dentry; another inode or
//!   none: the old dentry is killed as for an outside change);
//! - attributes (`attr_of`), symlink targets (`link_target`) and listings (`list`) are asked
//!   of the backend every time; listings are not merged into the tree;
//! - no fast path, completeness, negatives or batched walks (`Config::bypass_mode()` turns them
//!   off).
//!
//! What stays is the tree of dentries as *identities*: a front end holds dentries (the
//! held-node contract, `held.rs`), computes backend paths from their links, and mutations
//! keep the tree's links exact (renames, removals), exactly as without bypass. Nothing in it
//! is used as an answer, so nothing in it can be stale; permission checks, credentials and
//! the verification of held nodes are the same code as without bypass.

use std::sync::atomic::Ordering;

use super::dentry::{DEAD, EVICTED};
use super::invalidate::OPTIMISTIC_TRIES;
use super::{Cache, NodeKind, NodeRef};
use crate::{Attr, Error, Result};

impl Cache {
    /// Child `name` of directory `dir` from the backend (one `lookup`), reconciled with the
    /// dentry cached under that name. An absent name gives an uncached (dead) negative.
    pub(crate) fn child_bypass(&self, dir: &NodeRef, name: &[u8]) -> Result<NodeRef> {
        let mut tries = 0;
        loop {
            tries += 1;
            let (r, gen0, ver0) = self.by_path(dir, |dpath| {
                let (gen0, ver0) = (dir.inner.read().gen(), dir.version());
                let r = self
                    .stats
                    .backend
                    .lookup
                    .time(|| dir.sb.backend.lookup(dpath, name));
                (r, gen0, ver0)
            })?;
            let attr = match r {
                Ok(a) => Some(a),
                Err(Error::NotFound) => {
                    self.stats.negative_misses.inc();
                    None
                }
                Err(e) => return Err(e),
            };
            let mut gen = gen0;
            let cached = dir.inner.read().child(name).cloned();
            if let Some(c) = cached {
                match attr {
                    Some(a) if same_object(&c, &a) => {
                        c.set_attr(Some(a));
                        self.note_links(&c, &a);
                        return Ok(c);
                    }
                    _ => {
                        if let Some(g) = self.drop_cached_name(dir, name, &c, gen0) {
                            gen = g;
                        }
                    }
                }
            }
            let Some(a) = attr else {
                let n = self.new_dentry(dir, name, NodeKind::Negative(Error::NotFound), None);
                n.set(DEAD);
                return Ok(n);
            };
            let node =
                self.insert_child(dir, name, gen, ver0, NodeKind::Positive(a.kind()), Some(a));
            // Refused (the directory changed while the backend answered): ask again, as
            // `child` does; a directory that keeps changing gets the last answer, uncached.
            if !node.has(DEAD) || dir.has(DEAD | EVICTED) || tries >= OPTIMISTIC_TRIES {
                return Ok(node);
            }
        }
    }

    /// Take `c`, cached as `dir`/`name`, out of the tree: the backend no longer has it there.
    /// Returns the directory's new `gen` if nothing else changed it since `gen0` (the answer
    /// that found `c` stale may then be cached).
    fn drop_cached_name(&self, dir: &NodeRef, name: &[u8], c: &NodeRef, gen0: u64) -> Option<u64> {
        let (removed, gen) = {
            let mut inner = dir.inner.write();
            let unchanged = inner.gen() == gen0;
            let removed = inner
                .children
                .as_mut()
                .is_some_and(|ch| ch.remove_node(name, c));
            if removed {
                inner.bump_gen();
            }
            (removed, unchanged.then_some(inner.gen()))
        };
        if removed {
            let _w = self.inval_window();
            self.kill(c);
            dir.set_attr(None);
        }
        gen
    }

    /// Bypass: the backend answered `a` for `node`'s path; if that is another object now (its
    /// name was replaced behind the cache's back, which no cached state tells here), take the
    /// dentry out of the tree as a lookup would and answer ENOENT: the attributes of the new
    /// object are not `node`'s (a front end would give them to the inode it holds).
    pub(crate) fn bypass_check_attr(&self, node: &NodeRef, a: &Attr) -> Result<()> {
        if same_object(node, a) {
            return Ok(());
        }
        if let Some(p) = node.parent_ref() {
            let name = node.link().name.clone();
            let gen = p.inner.read().gen();
            self.drop_cached_name(&p, &name, node, gen);
        }
        Err(Error::NotFound)
    }

    /// Whether the dentry's cached answers may be used (never in bypass mode).
    #[inline]
    pub(crate) fn trusts_cache(&self) -> bool {
        !self.config.bypass
    }
}

/// Whether `c` is the object the backend now reports as `a` (same type and inode; an inode
/// number of 0 is unknown and matches).
fn same_object(c: &NodeRef, a: &Attr) -> bool {
    let (ino, dev) = (c.attr.ino(), c.attr.dev());
    c.kind() == NodeKind::Positive(a.kind())
        && (ino == 0 || ino == a.ino)
        && (dev == 0 || dev == a.dev)
        && c.flags.load(Ordering::Acquire) & DEAD == 0
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::memory::MemoryBackend;
    use crate::{At, Backend, Cache, Config, Cred, Error, LookupFlags, SetAttr};

    fn setup() -> (Arc<MemoryBackend>, Arc<Cache>) {
        let b = Arc::new(MemoryBackend::new());
        let r = Cred::root();
        b.mkdir(&r, b"d", 0o755).unwrap();
        b.mknod(&r, b"d/f", 0o100644, 0).unwrap();
        b.symlink(&r, b"f", b"d/l").unwrap();
        let c = Cache::new(b.clone(), Config::bypass_mode()).unwrap();
        (b, c)
    }

    /// Every query is a backend call: nothing is answered from the tree, not even twice in a
    /// row, and the statistics count no hit.
    #[test]
    fn every_query_asks_the_backend() {
        let (_b, c) = setup();
        let k = c.kernel_checked(Cred::root());
        let root = c.root();
        let d = c.lookup_child(&k, &root, b"d").unwrap();
        let s0 = c.stats();
        for _ in 0..3 {
            let f = c.lookup_child(&k, &d, b"f").unwrap();
            c.getattr(&f).unwrap();
            let l = c.lookup_child(&k, &d, b"l").unwrap();
            assert_eq!(c.readlink_node(&l).unwrap(), b"f");
            assert_eq!(c.readdir_node(&k, &d, true).unwrap().len(), 2);
            assert_eq!(c.lookup_child(&k, &d, b"nope").err(), Some(Error::NotFound));
        }
        let s1 = c.stats();
        assert_eq!(s1.hits - s0.hits, 0, "hits in bypass mode");
        assert_eq!(s1.negative_hits - s0.negative_hits, 0);
        assert_eq!(s1.backend_lookup - s0.backend_lookup, 9);
        assert_eq!(s1.backend_getattr - s0.backend_getattr, 3);
        assert_eq!(s1.backend_readlink - s0.backend_readlink, 3);
        assert_eq!(s1.backend_readdir - s0.backend_readdir, 3);
        assert_eq!(s1.readdir_hits - s0.readdir_hits, 0);
    }

    /// Lookups racing a name that keeps changing type behind the cache's back: every answer
    /// is a dentry of the type the backend gave, getattr never reports another type for it
    /// (a dentry replaced meanwhile is dead: ENOENT), and once the changes stop the next
    /// lookup is the backend's truth with one dentry cached under the name.
    #[test]
    fn lookups_racing_outside_replacements_stay_consistent() {
        let (b, c) = setup();
        let r = Cred::root();
        let k = c.kernel_checked(r.clone());
        let d = c.lookup_child(&k, &c.root(), b"d").unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 0..20_000 {
                    if i % 2 == 0 {
                        let _ = b.mknod(&r, b"d/x", 0o100644, 0);
                        let _ = b.unlink(&r, b"d/x");
                    } else {
                        let _ = b.mkdir(&r, b"d/x", 0o755);
                        let _ = b.rmdir(&r, b"d/x");
                    }
                    if i % 3 == 0 {
                        let _ = b.mkdir(&r, b"d/x", 0o755);
                    }
                }
                stop.store(true, std::sync::atomic::Ordering::Release);
            });
            for _ in 0..2 {
                s.spawn(|| {
                    while !stop.load(std::sync::atomic::Ordering::Acquire) {
                        match c.lookup_child(&k, &d, b"x") {
                            Ok(n) => match c.getattr(&n) {
                                Ok(a) => assert_eq!(n.file_type(), Some(a.kind())),
                                Err(e) => assert_eq!(e, Error::NotFound),
                            },
                            Err(e) => assert_eq!(e, Error::NotFound),
                        }
                    }
                });
            }
        });
        let truth = b.lookup(b"d", b"x");
        let n = c.lookup_child(&k, &d, b"x");
        match (truth, n) {
            (Ok(a), Ok(n)) => {
                assert_eq!(n.file_type(), Some(a.kind()));
                assert!(!n.is_dead());
            }
            (Err(Error::NotFound), Err(Error::NotFound)) => {}
            (t, n) => panic!("backend {t:?}, cache {:?}", n.map(|n| n.file_type())),
        }
        let live = d
            .inner
            .read()
            .children
            .as_ref()
            .map_or(0, |ch| ch.values().filter(|n| n.name() == b"x").count());
        assert!(live <= 1);
    }

    /// The xattr-absence memo (held.rs) remembers nothing either.
    #[test]
    fn no_xattr_absence_is_remembered() {
        let (_b, c) = setup();
        let g = c.xattr_memo_gen();
        c.note_xattr_absent((1, 2), 3, 1, g);
        assert!(!c.xattr_known_absent((1, 2), 3, 1));
    }

    /// Changes made behind the cache's back, with nobody reporting them, are seen by the
    /// next query; a name that keeps its inode keeps its dentry (what a front end holds).
    #[test]
    fn outside_changes_are_seen_at_once() {
        let (b, c) = setup();
        let r = Cred::root();
        let k = c.kernel_checked(r.clone());
        let user = c.credentials(Cred::new(1000, 1000, []));
        let root = c.root();
        let d = c.lookup_child(&k, &root, b"d").unwrap();
        let f = c.lookup_child(&k, &d, b"f").unwrap();
        assert_eq!(c.getattr(&f).unwrap().mode & 0o777, 0o644);
        let set = SetAttr {
            mode: Some(0o600),
            ..SetAttr::default()
        };
        b.setattr(&r, b"d/f", &set).unwrap();
        assert_eq!(c.getattr(&f).unwrap().mode & 0o777, 0o600);
        let again = c.lookup_child(&k, &d, b"f").unwrap();
        assert!(Arc::ptr_eq(&f, &again), "same inode, new dentry");
        // Created, removed and replaced outside.
        b.mknod(&r, b"d/g", 0o100644, 0).unwrap();
        assert!(c.lookup_child(&k, &d, b"g").is_ok());
        b.unlink(&r, b"d/g").unwrap();
        assert_eq!(c.lookup_child(&k, &d, b"g").err(), Some(Error::NotFound));
        // Replaced by another file: the old dentry must not take the new file's attributes.
        b.mknod(&r, b"d/h", 0o100644, 0).unwrap();
        let h = c.lookup_child(&k, &d, b"h").unwrap();
        let h_ino = c.getattr(&h).unwrap().ino;
        b.unlink(&r, b"d/h").unwrap();
        b.mknod(&r, b"d/h2", 0o100600, 0).unwrap();
        b.rename(&r, b"d/h2", b"d/h", crate::RenameMode::Replace)
            .unwrap();
        assert_eq!(c.getattr(&h).err(), Some(Error::NotFound));
        assert!(h.is_dead());
        let h2 = c.lookup_child(&k, &d, b"h").unwrap();
        assert_ne!(c.getattr(&h2).unwrap().ino, h_ino);
        b.unlink(&r, b"d/h").unwrap();
        let ino = c.getattr(&f).unwrap().ino;
        b.unlink(&r, b"d/f").unwrap();
        b.mkdir(&r, b"d/f", 0o700).unwrap();
        let nf = c.lookup_child(&k, &d, b"f").unwrap();
        assert!(f.is_dead(), "the replaced name's dentry lives on");
        assert!(nf.is_dir());
        assert_ne!(c.getattr(&nf).unwrap().ino, ino);
        let names: Vec<Vec<u8>> = c
            .readdir_node(&k, &d, false)
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names.len(), 2);
        // A path lookup checks permissions with the attributes the backend has now.
        assert!(c
            .stat(&user, At::Root, b"d/f", LookupFlags::NOFOLLOW)
            .is_ok());
        b.setattr(
            &r,
            b"d",
            &SetAttr {
                mode: Some(0o700),
                ..SetAttr::default()
            },
        )
        .unwrap();
        assert_eq!(
            c.stat(&user, At::Root, b"d/f", LookupFlags::NOFOLLOW),
            Err(Error::Access)
        );
    }
}
