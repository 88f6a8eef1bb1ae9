//! Keeping the cache true: invalidation windows, version bumps, kills, eviction, directory
//! completeness, changes learned from outside, mounts.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use super::dentry::{Dentry, COMPLETE, DEAD, EVICTED, HAS_CHILDREN, MOUNTED, REFERENCED};
use super::path;
use super::{
    Cache, Creds, Invalidation, Mount, MountOptions, MountSource, Namespace, NodeKind, NodeRef,
    Super,
};
use crate::{Attr, Change, Cred, DirEntry, Error, FileType, LookupFlags, Result, R_OK};

/// An open invalidation window: slow-path walks that overlap it do not publish.
pub(crate) struct InvalWindow<'a>(&'a Cache);

impl Drop for InvalWindow<'_> {
    fn drop(&mut self) {
        self.0.inval_end.fetch_add(1, Ordering::SeqCst);
    }
}

impl Cache {
    /// Open an invalidation window. Everything that can change what a path resolves to, or
    /// who may resolve it, happens inside one: the change itself (attributes, tree links),
    /// then the version bumps of the affected subtrees.
    pub(crate) fn inval_window(&self) -> InvalWindow<'_> {
        self.inval_start.fetch_add(1, Ordering::SeqCst);
        self.stats.invalidations.inc();
        InvalWindow(self)
    }

    /// Give `root` and every cached descendant (following mounts in every namespace) a new
    /// version, which invalidates their DLHT entries and every PCC slot confirming them.
    /// Must be called inside an invalidation window.
    pub(crate) fn bump_subtree(&self, root: &NodeRef) {
        let v = self.seq.fetch_add(1, Ordering::AcqRel);
        let mut n = 0u64;
        let mut stack: Vec<NodeRef> = vec![root.clone()];
        while let Some(d) = stack.pop() {
            // `v` is fresh, so a dentry already holding it was visited in this walk: stale
            // interior references (children moved elsewhere) and bind mounts of a directory
            // inside itself cannot make the walk go round in circles.
            if d.version.swap(v, Ordering::AcqRel) == v {
                continue;
            }
            n += 1;
            let f = d.flags.load(Ordering::Acquire);
            if f & MOUNTED != 0 {
                for ns in self.namespaces.lock().iter().filter_map(Weak::upgrade) {
                    if let Some(m) = ns.mounts.read().get(&d.id) {
                        stack.push(m.root.clone());
                    }
                }
            }
            if f & HAS_CHILDREN == 0 {
                continue;
            }
            // Leaves are not visited: their entries check this (their parent's) version.
            let inner = d.inner.read();
            if let Some(ch) = &inner.children {
                for c in ch.interior.iter().filter_map(Weak::upgrade) {
                    // Only children still filed here; moved ones are reached from their new
                    // parent (or were bumped by the move itself).
                    let here = c
                        .link
                        .load()
                        .parent
                        .as_ref()
                        .is_some_and(|p| std::ptr::eq(p.as_ptr(), Arc::as_ptr(&d)));
                    if here {
                        stack.push(c);
                    }
                }
            }
        }
        self.stats.invalidated_entries.add(n);
    }

    /// Take a dentry out of service: mark it dead and bump its subtree. The caller has
    /// already removed it from its parent's map.
    pub(crate) fn kill(&self, node: &NodeRef) {
        let prev = node.flags.fetch_or(DEAD, Ordering::AcqRel);
        if prev & (DEAD | EVICTED) == 0 {
            self.entries.fetch_sub(1, Ordering::Relaxed);
        }
        self.bump_subtree(node);
        // Its cached children can no longer be reached; free them now.
        let children = node.inner.write().take_children();
        for c in &children {
            self.kill(c);
        }
    }

    /// Count a dentry just inserted in the tree; evict if over the bound.
    pub(crate) fn account_new(&self, node: &NodeRef) {
        // New dentries start referenced: the caller is about to use them.
        node.touch();
        let n = self.entries.fetch_add(1, Ordering::Relaxed) + 1;
        {
            let mut q = self.lru.lock();
            q.push_back(Arc::downgrade(node));
            if q.len() > 2 * self.config.max_entries + 1024 {
                q.retain(|w| w.upgrade().is_some_and(|d| !d.has(DEAD)));
            }
        }
        if n as usize > self.config.max_entries {
            self.evict((self.config.max_entries / 64).max(16));
        }
    }

    /// Evict up to `want` unreferenced leaves (CLOCK: a referenced dentry gets a second chance;
    /// hits only set a bit, they never move list entries).
    pub(crate) fn evict(&self, want: usize) {
        let Some(mut q) = self.lru.try_lock() else {
            return;
        };
        let mut evicted = 0;
        // One pass at most: a dentry just inserted (marked referenced) survives this call.
        let mut budget = q.len();
        while evicted < want && budget > 0 {
            budget -= 1;
            let Some(w) = q.pop_front() else { break };
            let Some(n) = w.upgrade() else { continue };
            let f = n.flags.load(Ordering::Acquire);
            if f & (DEAD | EVICTED) != 0 {
                continue;
            }
            if f & REFERENCED != 0 {
                n.flags.fetch_and(!REFERENCED, Ordering::AcqRel);
                q.push_back(w);
                continue;
            }
            let leaf = n
                .inner
                .read()
                .children
                .as_ref()
                .is_none_or(|c| c.is_empty());
            if !leaf || f & MOUNTED != 0 || n.pins.load(Ordering::Acquire) > 0 {
                q.push_back(w);
                continue;
            }
            let Some(parent) = n.parent_ref() else {
                continue;
            };
            {
                let mut pi = parent.inner.write();
                let name = n.link.load().name.clone();
                if !pi
                    .children
                    .as_mut()
                    .is_some_and(|ch| ch.remove_node(&name, &n))
                {
                    continue;
                }
                if matches!(n.kind, NodeKind::Positive(_)) {
                    // The listing is no longer all here (SOSP'15 §5.1).
                    parent.clear(COMPLETE);
                }
            }
            if n.flags.fetch_or(EVICTED, Ordering::AcqRel) & (DEAD | EVICTED) == 0 {
                self.entries.fetch_sub(1, Ordering::Relaxed);
            }
            n.version
                .store(self.seq.fetch_add(1, Ordering::AcqRel), Ordering::Release);
            evicted += 1;
            self.stats.evictions.inc();
        }
        drop(q);
        if evicted > 0 {
            self.sweep_dlht();
        }
    }

    /// Drop DLHT entries that can no longer be valid (their dentries were invalidated).
    pub(crate) fn sweep_dlht(&self) {
        for ns in self.namespaces.lock().iter().filter_map(Weak::upgrade) {
            let guard = ns.dlht.guard();
            ns.dlht.retain(|_, e| e.valid(), &guard);
        }
    }

    // ----------------------------------------------------------------------------------
    // Hard links: attributes shared by several cached names.

    pub(crate) fn note_links(&self, node: &NodeRef, a: &Attr) {
        if a.nlink > 1 && !a.is_dir() {
            let mut m = self.hardlinks.lock();
            let v = m.entry((a.dev, a.ino)).or_default();
            v.retain(|w| w.strong_count() > 0);
            if !v
                .iter()
                .any(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(node)))
            {
                v.push(Arc::downgrade(node));
            }
        }
    }

    /// After a change to an inode's attributes through one name, make every other cached
    /// name of the same inode forget (or take) the new attributes.
    pub(crate) fn forget_link_attrs(&self, node: &Dentry) {
        let Some(a) = node.attr_copy() else {
            return self.forget_links_unknown(node);
        };
        self.update_links(node, &a, None);
    }

    fn forget_links_unknown(&self, node: &Dentry) {
        // Without attributes we do not know the inode; drop every hard-linked name's attrs
        // whose parent matches nothing cheaper: scan the (small) table.
        let m = self.hardlinks.lock();
        for v in m.values() {
            if v.iter().any(|w| std::ptr::eq(w.as_ptr(), node)) {
                for d in v.iter().filter_map(Weak::upgrade) {
                    d.set_attr(None);
                }
            }
        }
    }

    /// The inode `(dev, ino)` changed (a link count, through a name nobody reported): every
    /// cached name of it that is known to be hard-linked forgets its attributes. A front end
    /// that knows its own names by (dev, ino) does the same for them.
    fn inode_changed(&self, dev: u64, ino: u64) -> Vec<Invalidation> {
        let names: Vec<NodeRef> = self
            .hardlinks
            .lock()
            .get(&(dev, ino))
            .map(|v| v.iter().filter_map(Weak::upgrade).collect())
            .unwrap_or_default();
        if names.is_empty() {
            return Vec::new();
        }
        let _w = self.inval_window();
        names
            .into_iter()
            .map(|n| {
                n.set_attr(None);
                Invalidation {
                    parent: n.parent_ref(),
                    name: n.name(),
                    node: Some(n),
                    attr_only: true,
                }
            })
            .collect()
    }

    /// Set (`Some`) or forget (`None`) the attributes of the other names of `a`'s inode.
    pub(crate) fn update_links(&self, node: &Dentry, a: &Attr, new: Option<Attr>) {
        if a.is_dir() {
            return;
        }
        let m = self.hardlinks.lock();
        if let Some(v) = m.get(&(a.dev, a.ino)) {
            for d in v.iter().filter_map(Weak::upgrade) {
                if !std::ptr::eq(Arc::as_ptr(&d), node) {
                    d.set_attr(new);
                }
            }
        }
    }

    // ----------------------------------------------------------------------------------
    // Directory listings and completeness (SOSP'15 §5.1).

    pub(crate) fn list(
        &self,
        c: &Creds,
        node: &NodeRef,
        want_attrs: bool,
    ) -> Result<Vec<DirEntry>> {
        match node.kind {
            NodeKind::Positive(FileType::Directory) => {}
            NodeKind::Positive(_) => return Err(Error::NotDir),
            NodeKind::Negative(e) => return Err(e),
        }
        if c.0.check {
            let a = self.attr_of(node)?;
            self.policy.permission(&c.0.cred, &a, R_OK)?;
        }
        if self.config.completeness && node.has(COMPLETE) {
            let out = self.list_cached(node, want_attrs);
            if let Some(out) = out {
                self.stats.readdir_hits.inc();
                return Ok(out);
            }
        }
        let mut tries = 0;
        loop {
            let (gen0, ver0) = (node.inner.read().gen, node.version());
            let q = self.quiet();
            let p = self.path_of(node)?;
            self.stats.backend.readdir.inc();
            let entries = node.sb.backend.readdir(&p, want_attrs)?;
            // As in `child`: a rename overlapping the listing may have made `p` another
            // directory's path.
            if !self.still_quiet(q) {
                if tries < 100 {
                    tries += 1;
                    std::thread::yield_now();
                    continue;
                }
                return Ok(entries);
            }
            self.merge_listing(node, &entries, gen0, ver0);
            return Ok(entries);
        }
    }

    /// The listing from the cache, or `None` if attributes were wanted and some are missing.
    fn list_cached(&self, node: &NodeRef, want_attrs: bool) -> Option<Vec<DirEntry>> {
        let inner = node.inner.read();
        let Some(ch) = &inner.children else {
            return Some(Vec::new());
        };
        let mut out = Vec::with_capacity(ch.len());
        for d in ch.values() {
            let NodeKind::Positive(kind) = d.kind else {
                continue;
            };
            let name = d.link.load().name.clone();
            let attr = d.attr_copy();
            if want_attrs && attr.is_none() {
                return None;
            }
            let ino = attr.map_or_else(|| d.attr.ino(), |a| a.ino);
            out.push(DirEntry {
                name: name.to_vec(),
                kind,
                ino,
                attr,
            });
        }
        Some(out)
    }

    /// Merge a backend listing into the cache and mark the directory complete, unless it
    /// changed while the backend was listing it.
    fn merge_listing(&self, node: &NodeRef, entries: &[DirEntry], gen0: u64, ver0: u64) {
        let mut stale: Vec<NodeRef> = Vec::new();
        let mut added: Vec<NodeRef> = Vec::new();
        {
            let mut inner = node.inner.write();
            if inner.gen != gen0 || node.version() != ver0 || node.has(DEAD) {
                return;
            }
            let mut seen = hashbrown::HashSet::with_capacity(entries.len());
            for e in entries {
                seen.insert(&e.name[..]);
                let existing = inner.child(&e.name).cloned();
                match existing {
                    Some(d)
                        if d.kind == NodeKind::Positive(e.kind)
                            && d.attr_copy().is_none_or(|a| a.ino == e.ino) =>
                    {
                        if let Some(a) = e.attr {
                            d.set_attr(Some(a));
                        }
                        d.attr.set_ino(e.ino);
                        continue;
                    }
                    Some(d) => stale.push(d),
                    None => {}
                }
                let d = self.new_dentry(node, &e.name, NodeKind::Positive(e.kind), e.attr);
                // A plain readdir gives no attributes: remember the inode number only.
                d.attr.set_ino(e.ino);
                inner.children_mut().insert(d.clone());
                added.push(d);
            }
            if let Some(ch) = inner.children.as_mut() {
                for d in ch.values() {
                    let keep = seen.contains(&d.link.load().name[..]);
                    if matches!(d.kind, NodeKind::Positive(_)) && !keep {
                        stale.push(d.clone());
                    }
                }
                for d in &stale {
                    let name = d.link.load().name.clone();
                    ch.remove_node(&name, d);
                }
            }
            if !added.is_empty() {
                node.set(HAS_CHILDREN);
            }
            if self.config.completeness {
                node.set(COMPLETE);
            }
            if !stale.is_empty() {
                inner.gen += 1;
            }
        }
        for d in &added {
            self.account_new(d);
        }
        if !stale.is_empty() {
            let _w = self.inval_window();
            for d in &stale {
                self.kill(d);
            }
        }
    }

    // ----------------------------------------------------------------------------------
    // Changes made behind the cache's back.

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
    fn follow_changed_link(&self, path: &[u8]) -> Vec<Invalidation> {
        if path::components(path).next().is_none() {
            return Vec::new();
        }
        let cs = self.kernel_checked(Cred::root());
        let st = self.start(super::At::Root);
        match self.walk_any_length(&cs.0, &st, path, LookupFlags::NOFOLLOW) {
            Ok(w) if w.node.kind == NodeKind::Positive(FileType::Symlink) => {}
            _ => return Vec::new(),
        }
        let Ok(w) = self.walk_any_length(&cs.0, &st, path, LookupFlags::FOLLOW) else {
            return Vec::new();
        };
        match w.node.kind {
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
                    inner.gen += 1;
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
        match parent.kind {
            NodeKind::Positive(FileType::Directory) => {}
            // Something exists below a name we thought missing: drop the negative.
            NodeKind::Negative(_) => return self.drop_negative_chain(&parent),
            NodeKind::Positive(_) => return Vec::new(),
        }
        let node = parent.inner.read().child(last).cloned();
        let Some(node) = node else {
            if !attr_only {
                // Not cached, but the parent's listing (and attributes) changed.
                parent.inner.write().gen += 1;
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
        if let NodeKind::Negative(_) = node.kind {
            if self.still_missing(&parent, &name) {
                return Vec::new();
            }
        }
        let _w = self.inval_window();
        let removed = {
            let mut pi = parent.inner.write();
            pi.gen += 1;
            pi.children.as_mut().and_then(|ch| ch.remove(&name[..]))
        };
        parent.clear(COMPLETE);
        parent.set_attr(None);
        if let Some(r) = &removed {
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
        let NodeKind::Positive(kind) = node.kind else {
            return false;
        };
        let ino = node.attr.ino();
        if ino == 0 {
            return false;
        }
        let Ok(dir) = self.path_of(parent) else {
            return false;
        };
        self.stats.backend.lookup.inc();
        let dev = node.attr.dev();
        match parent.sb.backend.lookup(&dir, name) {
            // Same inode number on another device: a file system was mounted over the name.
            Ok(a) if a.ino == ino && a.kind() == kind && (dev == 0 || a.dev == dev) => {
                node.set_attr(Some(a));
                true
            }
            _ => false,
        }
    }

    /// Whether `parent/name` is still missing in the backend.
    fn still_missing(&self, parent: &NodeRef, name: &[u8]) -> bool {
        let Ok(dir) = self.path_of(parent) else {
            return false;
        };
        self.stats.backend.lookup.inc();
        matches!(parent.sb.backend.lookup(&dir, name), Err(Error::NotFound))
    }

    /// The walk to a changed path's directory failed: drop the first cached negative on the
    /// way, if any (the change says something exists there now).
    fn invalidate_cached_prefix(&self, dirs: &[&[u8]]) -> Vec<Invalidation> {
        let mut cur = self.ns.root.root.clone();
        for c in dirs {
            if let NodeKind::Negative(_) = cur.kind {
                return self.drop_negative_chain(&cur);
            }
            let next = cur.inner.read().child(c).cloned();
            match next {
                Some(n) => cur = n,
                None => return Vec::new(),
            }
        }
        match cur.kind {
            NodeKind::Negative(_) => self.drop_negative_chain(&cur),
            _ => Vec::new(),
        }
    }

    /// Drop the topmost negative of a chain of (deep) negatives ending at `negative`.
    fn drop_negative_chain(&self, negative: &NodeRef) -> Vec<Invalidation> {
        let mut top = negative.clone();
        while let Some(p) = top.parent_ref() {
            match p.kind {
                NodeKind::Negative(_) => top = p,
                _ => break,
            }
        }
        self.drop_child_of(&top)
    }

    fn drop_child_of(&self, negative: &NodeRef) -> Vec<Invalidation> {
        let Some(parent) = negative.parent_ref() else {
            return Vec::new();
        };
        let name = negative.name();
        let _w = self.inval_window();
        let removed = {
            let mut pi = parent.inner.write();
            pi.gen += 1;
            pi.children.as_mut().and_then(|ch| ch.remove(&name[..]))
        };
        parent.clear(COMPLETE);
        if let Some(r) = &removed {
            self.kill(r);
        }
        vec![Invalidation {
            parent: Some(parent),
            name,
            node: removed,
            attr_only: false,
        }]
    }

    // ----------------------------------------------------------------------------------
    // Mounts (SOSP'15 §4.3).

    pub(crate) fn do_mount(
        &self,
        ns: &Arc<Namespace>,
        path: &[u8],
        source: MountSource,
        opts: MountOptions,
    ) -> Result<()> {
        let root_creds = self.kernel_checked(Cred::root());
        let h = self.root_handle(ns);
        let st = self.start(super::At::Dir(&h));
        let w = self.walk(&root_creds.0, &st, path, LookupFlags::FOLLOW)?;
        let (mnt, node) = (w.mnt, w.node);
        if let NodeKind::Negative(e) = node.kind {
            return Err(e);
        }
        if !node.is_dir() {
            return Err(Error::NotDir);
        }
        let new_root = match source {
            MountSource::Backend(b) => {
                let attr = b.getattr(b"")?;
                if !attr.is_dir() {
                    return Err(Error::NotDir);
                }
                let sb = Arc::new(Super { backend: b });
                let nid = self.next_id.fetch_add(1, Ordering::Relaxed);
                let ver = self.seq.fetch_add(1, Ordering::AcqRel);
                Arc::new(Dentry::new(
                    nid,
                    sb,
                    NodeKind::Positive(FileType::Directory),
                    None,
                    b"",
                    ver,
                    Some(attr),
                ))
            }
            MountSource::Bind(src) => {
                let n = self.resolve(
                    &root_creds,
                    super::At::Dir(&h),
                    &src,
                    LookupFlags::FOLLOW,
                    |n, _| n.clone(),
                )?;
                if !n.is_dir() {
                    return Err(Error::NotDir);
                }
                n
            }
        };
        let m = Arc::new(Mount {
            root: new_root,
            parent: Some((mnt, node.clone())),
            opts,
        });
        let _w = self.inval_window();
        {
            let mut mounts = ns.mounts.write();
            if mounts.contains_key(&node.id) {
                return Err(Error::Busy);
            }
            mounts.insert(node.id, m);
        }
        node.set(MOUNTED);
        self.bump_subtree(&node);
        Ok(())
    }

    /// The mount a path lies in (resolved as root).
    fn mount_of(&self, ns: &Arc<Namespace>, path: &[u8]) -> Result<Arc<Mount>> {
        let root_creds = self.kernel_checked(Cred::root());
        let h = self.root_handle(ns);
        let st = self.start(super::At::Dir(&h));
        let w = self.walk(&root_creds.0, &st, path, LookupFlags::FOLLOW)?;
        Ok(w.mnt)
    }

    pub(crate) fn do_umount(&self, ns: &Arc<Namespace>, path: &[u8]) -> Result<()> {
        let m = self.mount_of(ns, path)?;
        let root_creds = self.kernel_checked(Cred::root());
        let h = self.root_handle(ns);
        let node = self.lookup(&root_creds, super::At::Dir(&h), path, LookupFlags::FOLLOW)?;
        if !Arc::ptr_eq(&node, &m.root) {
            return Err(Error::Invalid);
        }
        let Some((_, mp)) = &m.parent else {
            return Err(Error::Invalid);
        };
        let _w = self.inval_window();
        {
            let mut mounts = ns.mounts.write();
            if mounts
                .values()
                .any(|o| o.parent.as_ref().is_some_and(|(pm, _)| Arc::ptr_eq(pm, &m)))
            {
                return Err(Error::Busy);
            }
            mounts.remove(&mp.id);
        }
        self.bump_subtree(&m.root);
        self.bump_subtree(mp);
        Ok(())
    }
}

/// Whether the remembered directory `o` has inode `(dev, ino)` in `sb`'s file system (a device
/// number of 0 is unknown and matches, as in `revive`).
fn same_inode(o: &Dentry, sb: &Arc<Super>, dev: u64, ino: u64) -> bool {
    let odev = o.attr.dev();
    o.attr.ino() == ino && (odev == dev || odev == 0 || dev == 0) && Arc::ptr_eq(&o.sb, sb)
}
