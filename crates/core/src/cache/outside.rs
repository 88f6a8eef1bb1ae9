//! Changes made behind the cache's back (`Cache::apply_change` / `invalidate`, Coda-style
//! callbacks from a backend's change feed) and revival.
//!
//! A reported path is found in the cache without asking the backend; a cached positive that
//! still names the same inode is revalidated in place (fresh attributes, bumped subtree), and
//! anything else is killed. Directories killed this way are remembered in `detached` by
//! (dev, ino), so when a lookup later finds the same directory elsewhere (an outside rename),
//! the same dentry is relinked there (`revive`, `revive_below`) and handles on it follow the
//! move. docs/core.md, "Changes behind the cache's back", states the rules and the limits.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::dentry::{Dentry, COMPLETE, DEAD, HAS_CHILDREN};
use super::path;
use super::{Cache, Invalidation, NodeKind, NodeRef, Super};
use crate::{Attr, Change, Cred, Error, FileType, LookupFlags};

impl Cache {
    pub(crate) fn external_change(&self, change: &Change) -> Vec<Invalidation> {
        let mut out = self.external_change_at(change);
        if let Change::Entry { path } = change {
            out.extend(self.follow_changed_link(path));
        }
        out
    }

    /// A change at `path` that names a symbolic link may have been made through it (a file
    /// created or written via a link, perhaps a dangling one): what the link leads to changed
    /// too. Drop a negative found there, and forget the attributes of a positive.
    ///
    /// Whether the name is a link is found without caching it (the cached dentry, else the
    /// backend's answer, left uncached): a report may be applied while the change it reports
    /// is still going on (a file reported as created before its writer wrote it), and a name
    /// cached then would keep the attributes of that instant until the next report (a listing
    /// of a tree just made showed a written file as empty, `a_reported_creation_caches_
    /// nothing_about_the_name`). Only a link's target is walked to (and may be cached).
    fn follow_changed_link(&self, path: &[u8]) -> Vec<Invalidation> {
        let comps: Vec<&[u8]> = path::components(path).collect();
        let Some((&last, dirs)) = comps.split_last() else {
            return Vec::new();
        };
        let cs = self.kernel_checked(Cred::root());
        let st = self.start(super::At::Root);
        let parent = if dirs.is_empty() {
            self.ns.root.root.clone()
        } else {
            match self.walk_any_length(&cs.0, &st, &dirs.join(&b'/'), LookupFlags::FOLLOW) {
                Ok(w) => w.node,
                Err(_) => return Vec::new(),
            }
        };
        if parent.kind() != NodeKind::Positive(FileType::Directory) {
            return Vec::new();
        }
        let cached = parent.inner.read().child(last).cloned();
        let is_link = match cached {
            Some(n) => n.kind() == NodeKind::Positive(FileType::Symlink),
            None => matches!(
                self.backend_lookup(&parent, last),
                Ok(Ok(a)) if a.kind() == FileType::Symlink
            ),
        };
        if !is_link {
            return Vec::new();
        }
        let Ok(w) = self.walk_any_length(&cs.0, &st, path, LookupFlags::FOLLOW) else {
            return Vec::new();
        };
        match w.node.kind() {
            NodeKind::Negative(_) => self.drop_negative_chain(&w.node),
            NodeKind::Positive(_) => {
                let _w = self.inval_window();
                w.node.set_attr(None);
                self.forget_links_unknown(&w.node);
                Vec::new()
            }
        }
    }

    fn external_change_at(&self, change: &Change) -> Vec<Invalidation> {
        let root = self.ns.root.root.clone();
        let (path, attr_only) = match change {
            Change::Overflow => {
                let _w = self.inval_window();
                let children = {
                    let mut inner = root.inner.write();
                    inner.bump_gen();
                    inner.take_children()
                };
                root.clear(COMPLETE);
                root.set_attr(None);
                for c in &children {
                    self.kill(c);
                }
                self.bump_subtree(&root);
                return vec![Invalidation {
                    parent: None,
                    name: Vec::new(),
                    node: None,
                    attr_only: false,
                }];
            }
            Change::Attr { path } => (path, true),
            Change::Entry { path } => (path, false),
            Change::Inode { dev, ino } => return self.inode_changed(*dev, *ino),
        };
        // Find the cached dentry and its parent, without calling the backend.
        let comps: Vec<&[u8]> = path::components(path).collect();
        let Some((&last, dirs)) = comps.split_last() else {
            let _w = self.inval_window();
            root.set_attr(None);
            if !attr_only {
                root.clear(COMPLETE);
            }
            self.bump_subtree(&root);
            return vec![Invalidation {
                parent: None,
                name: Vec::new(),
                node: Some(root),
                attr_only,
            }];
        };
        // The directory part may go through symlinks (a path as a program used it): resolve
        // it through the cache as root, without publishing anything.
        let parent = if dirs.is_empty() {
            root
        } else {
            let dir: Vec<u8> = dirs.join(&b'/');
            let cs = self.kernel_checked(Cred::root());
            let st = self.start(super::At::Root);
            match self.walk_any_length(&cs.0, &st, &dir, LookupFlags::FOLLOW) {
                Ok(w) => w.node,
                Err(_) => return self.invalidate_cached_prefix(dirs),
            }
        };
        match parent.kind() {
            NodeKind::Positive(FileType::Directory) => {}
            // Something exists below a name we thought missing: drop the negative.
            NodeKind::Negative(_) => return self.drop_negative_chain(&parent),
            NodeKind::Positive(_) => return Vec::new(),
        }
        let node = {
            let mut pi = parent.inner.write();
            let node = pi.child(last).cloned();
            if node.is_none() {
                // Not cached: a lookup of the name may be holding the backend's answer from
                // before the change. Bumping `gen` in the same critical section as finding
                // the name absent keeps that answer out of the map (`insert_child`), also for
                // an attribute-only change.
                pi.bump_gen();
            }
            node
        };
        let Some(node) = node else {
            if !attr_only {
                // Not cached, but the parent's listing (and attributes) changed.
                parent.clear(COMPLETE);
                parent.set_attr(None);
                if !self.detached.lock().is_empty() {
                    // Perhaps a directory we lost track of moved here: look, so it revives.
                    let mut missed = false;
                    let _ = self.child(&parent, last, &mut missed);
                }
            }
            return vec![Invalidation {
                parent: Some(parent),
                name: last.to_vec(),
                node: None,
                attr_only,
            }];
        };
        let name = comps.last().map(|c| c.to_vec()).unwrap_or_default();
        // Revalidate before dropping: if the name still holds the same inode (a spurious or
        // attribute-only event), keep the dentry, its subtree and whatever holds it (a
        // directory handle, a kernel inode) and refresh only its attributes.
        let same = !attr_only && self.still_same(&parent, &name, &node);
        if attr_only || same {
            let _w = self.inval_window();
            if same {
                parent.set_attr(None);
            } else {
                node.set_attr(None);
            }
            self.forget_links_unknown(&node);
            if node.is_dir() {
                // A chmod or chown may have changed who can search below it.
                self.bump_subtree(&node);
            }
            return vec![Invalidation {
                parent: Some(parent),
                name,
                node: Some(node),
                attr_only: true,
            }];
        }
        if let NodeKind::Negative(_) = node.kind() {
            if self.still_missing(&parent, &name) {
                return Vec::new();
            }
        }
        let _w = self.inval_window();
        let removed = {
            let mut pi = parent.inner.write();
            pi.bump_gen();
            pi.children.as_mut().and_then(|ch| ch.remove(&name[..]))
        };
        parent.clear(COMPLETE);
        parent.set_attr(None);
        if let Some(r) = &removed {
            self.retire(r);
        }
        drop(_w);
        if !self.detached.lock().is_empty() {
            // Perhaps a directory we lost track of moved here: look, so it revives.
            let mut missed = false;
            let _ = self.child(&parent, &name, &mut missed);
        }
        vec![Invalidation {
            parent: Some(parent),
            name,
            node: removed,
            attr_only: false,
        }]
    }

    /// Take `r`, just taken out of its parent's map because it is gone from the backend
    /// (inside an invalidation window), out of service; the directories cached at and below
    /// it are remembered for revival (they may turn up elsewhere: an outside rename).
    pub(crate) fn retire(&self, r: &NodeRef) {
        self.forget_links_unknown(r);
        let dirs = self.cached_dirs(r);
        self.kill(r);
        let mut d = self.detached.lock();
        for n in dirs {
            // An older entry for the same inode is a directory that lost that inode
            // before `n` had it (removed, its number reused): never revive it instead.
            let (dev, ino) = (n.attr.dev(), n.attr.ino());
            d.retain(|(_, _, o)| !same_inode(o, &n.sb, dev, ino));
            if d.len() >= 256 {
                d.pop_front();
            }
            d.push_back((dev, ino, n));
        }
    }

    /// A directory with inode `(dev, ino)` of `sb`'s file system was just created through the
    /// cache: a remembered detached directory with that inode number was removed and its number
    /// reused, so it must not be revived as the new directory (or in place of a later move of
    /// it).
    pub(crate) fn forget_detached(&self, sb: &Arc<Super>, dev: u64, ino: u64) {
        let mut d = self.detached.lock();
        if !d.is_empty() {
            d.retain(|(_, _, o)| !same_inode(o, sb, dev, ino));
        }
    }

    /// The directories cached at and below `top` whose inode number is known (candidates
    /// for revival if they turn up elsewhere), top first, at most 256.
    fn cached_dirs(&self, top: &NodeRef) -> Vec<NodeRef> {
        let mut out = Vec::new();
        let mut queue = std::collections::VecDeque::from([top.clone()]);
        while let Some(d) = queue.pop_front() {
            if !d.is_dir() || out.len() >= 256 {
                continue;
            }
            if d.attr.ino() != 0 {
                out.push(d.clone());
            }
            if d.has(HAS_CHILDREN) {
                if let Some(ch) = &d.inner.read().children {
                    queue.extend(ch.values().filter(|c| c.is_dir()).cloned());
                }
            }
        }
        out
    }

    /// Whether `parent/name` still names the inode of the cached positive `node`.
    fn still_same(&self, parent: &NodeRef, name: &[u8], node: &NodeRef) -> bool {
        let NodeKind::Positive(kind) = node.kind() else {
            return false;
        };
        let ino = node.attr.ino();
        if ino == 0 {
            return false;
        }
        let dev = node.attr.dev();
        let r = self.backend_lookup(parent, name);
        match r {
            // Same inode number on another device: a file system was mounted over the name.
            Ok(Ok(a)) if a.ino == ino && a.kind() == kind && (dev == 0 || a.dev == dev) => {
                node.set_attr(Some(a));
                self.note_links(node, &a);
                true
            }
            _ => false,
        }
    }

    /// The backend's answer for `parent/name` now (timed as a backend lookup), asked by
    /// `parent`'s current path; `Err` when that path cannot be had.
    pub(super) fn backend_lookup(
        &self,
        parent: &NodeRef,
        name: &[u8],
    ) -> crate::Result<crate::Result<Attr>> {
        self.by_path(parent, |dir| {
            self.stats
                .backend
                .lookup
                .time(|| parent.sb.backend.lookup(dir, name))
        })
    }

    /// Whether `parent/name` is still missing in the backend.
    fn still_missing(&self, parent: &NodeRef, name: &[u8]) -> bool {
        let r = self.backend_lookup(parent, name);
        matches!(r, Ok(Err(Error::NotFound)))
    }

    /// The walk to a changed path's directory failed: drop the first cached negative on the
    /// way, if any (the change says something exists there now).
    fn invalidate_cached_prefix(&self, dirs: &[&[u8]]) -> Vec<Invalidation> {
        let mut cur = self.ns.root.root.clone();
        for c in dirs {
            if let NodeKind::Negative(_) = cur.kind() {
                return self.drop_negative_chain(&cur);
            }
            let next = cur.inner.read().child(c).cloned();
            match next {
                Some(n) => cur = n,
                None => return Vec::new(),
            }
        }
        match cur.kind() {
            NodeKind::Negative(_) => self.drop_negative_chain(&cur),
            _ => Vec::new(),
        }
    }

    // ----------------------------------------------------------------------------------
    // Revival: a directory that vanished turns up elsewhere.

    /// A directory that vanished behind the cache's back and turned up again as `dir/name`
    /// (same dev and inode): bring the same dentry back, relinked, with a new version.
    pub(crate) fn revive(&self, dir: &NodeRef, name: &[u8], a: &Attr) -> Option<NodeRef> {
        let mut d = self.detached.lock();
        if d.is_empty() {
            return None;
        }
        let i = d
            .iter()
            .position(|(dev, ino, _)| (*dev == a.dev || *dev == 0) && *ino == a.ino)?;
        let (_, _, node) = d.remove(i)?;
        if !node.has(DEAD) || !Arc::ptr_eq(&node.sb, &dir.sb) {
            return None;
        }
        node.set_link(Arc::new(super::dentry::Link {
            parent: Some(Arc::downgrade(dir)),
            name: name.into(),
        }));
        node.set_attr(Some(*a));
        node.clear(COMPLETE);
        node.version
            .store(self.seq.fetch_add(1, Ordering::SeqCst), Ordering::Release);
        node.clear(DEAD);
        Some(node)
    }

    /// After `dir` was revived: bring back the directories that were cached below it when it
    /// vanished and are still there (same name and inode), so handles on them work again.
    pub(crate) fn revive_below(&self, dir: &NodeRef) {
        let below: Vec<NodeRef> = {
            let d = self.detached.lock();
            d.iter()
                .map(|(_, _, n)| n.clone())
                .filter(|n| {
                    n.has(DEAD)
                        && n.link()
                            .parent
                            .as_ref()
                            .is_some_and(|p| std::ptr::eq(p.as_ptr(), Arc::as_ptr(dir)))
                })
                .collect()
        };
        for n in below {
            let name = n.name();
            let Ok((r, gen0, ver0)) = self.by_path(dir, |dpath| {
                let (gen0, ver0) = (dir.inner.read().gen(), dir.version());
                let r = self
                    .stats
                    .backend
                    .lookup
                    .time(|| dir.sb.backend.lookup(dpath, &name));
                (r, gen0, ver0)
            }) else {
                return;
            };
            if let Ok(a) = r {
                if a.is_dir() && a.ino == n.attr.ino() {
                    let kind = NodeKind::Positive(FileType::Directory);
                    self.insert_child(dir, &name, gen0, ver0, kind, Some(a));
                }
            }
        }
    }
}

/// Whether the remembered directory `o` has inode `(dev, ino)` in `sb`'s file system (a device
/// number of 0 is unknown and matches, as in `revive`).
fn same_inode(o: &Dentry, sb: &Arc<Super>, dev: u64, ino: u64) -> bool {
    let odev = o.attr.dev();
    o.attr.ino() == ino && (odev == dev || odev == 0 || dev == 0) && Arc::ptr_eq(&o.sb, sb)
}
