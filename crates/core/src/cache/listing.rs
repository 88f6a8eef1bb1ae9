//! Directory listings and completeness (SOSP'15 §5.1, docs/core.md I6).
//!
//! `COMPLETE` on a directory means its children map holds every positive child: readdir is
//! then served from the map and a miss is a negative without a backend call. A backend
//! listing is merged into the map (and the flag set) only if the directory did not change
//! while the backend listed it.

use super::dentry::{COMPLETE, DEAD, HAS_CHILDREN, PENDING};
use super::{Cache, Creds, NodeKind, NodeRef};
use crate::{DirEntry, Error, FileType, Result, R_OK};

impl Cache {
    pub(crate) fn list(
        &self,
        c: &Creds,
        node: &NodeRef,
        want_attrs: bool,
    ) -> Result<Vec<DirEntry>> {
        match node.kind() {
            NodeKind::Positive(FileType::Directory) => {}
            NodeKind::Positive(_) => return Err(Error::NotDir),
            NodeKind::Negative(e) => return Err(e),
        }
        if c.0.check {
            let a = self.attr_of(node)?;
            self.policy.permission(&c.0.cred, &a, R_OK)?;
        }
        if node.has(PENDING) {
            // A warm-restart listing has no file attributes: one that wants them is served
            // from it only where the cache has them all (e.g. only subdirectories).
            self.take_pending(node, true);
        }
        if self.config.completeness && node.has(COMPLETE) {
            let out = self.list_cached(node, want_attrs);
            if let Some(out) = out {
                self.stats.readdir_hits.inc();
                return Ok(out);
            }
        }
        self.stats.readdir_misses.inc();
        let (r, gen0, ver0) = self.by_path(node, |p| {
            let (gen0, ver0) = (node.inner.read().gen(), node.version());
            let r = self
                .stats
                .backend
                .readdir
                .time(|| node.sb.backend.readdir(p, want_attrs));
            (r, gen0, ver0)
        })?;
        let entries = r?;
        if self.trusts_cache() {
            self.merge_listing(node, &entries, gen0, ver0);
        }
        Ok(entries)
    }

    /// The listing from the cache, or `None` if attributes were wanted and some are missing.
    fn list_cached(&self, node: &NodeRef, want_attrs: bool) -> Option<Vec<DirEntry>> {
        let inner = node.inner.read();
        let Some(ch) = &inner.children else {
            return Some(Vec::new());
        };
        let mut out = Vec::with_capacity(ch.len());
        for d in ch.values() {
            let NodeKind::Positive(kind) = d.kind() else {
                continue;
            };
            let name = d.link().name.clone();
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
    pub(crate) fn merge_listing(&self, node: &NodeRef, entries: &[DirEntry], gen0: u64, ver0: u64) {
        let mut stale: Vec<NodeRef> = Vec::new();
        let mut added: Vec<NodeRef> = Vec::new();
        {
            let mut inner = node.inner.write();
            if inner.gen() != gen0 || node.version() != ver0 || node.has(DEAD) {
                return;
            }
            let mut seen = hashbrown::HashSet::with_capacity(entries.len());
            // A plain listing gives getdents' numbers: for a mount point (attributes on
            // another device) the covered directory's, not the one its attributes hold.
            let dir_dev = node.attr.dev();
            for e in entries {
                seen.insert(&e.name[..]);
                let existing = inner.child(&e.name).cloned();
                match existing {
                    Some(d)
                        if d.kind() == NodeKind::Positive(e.kind)
                            && d.attr_copy().is_none_or(|a| {
                                a.ino == e.ino
                                    || (e.attr.is_none() && dir_dev != 0 && a.dev != dir_dev)
                            }) =>
                    {
                        if let Some(a) = e.attr {
                            d.set_attr(Some(a));
                            // A name known without attributes (a plain listing, a remote
                            // names-only one) that turns out hard-linked: `Change::Inode`
                            // must reach it (hardlinks.rs).
                            self.note_links(&d, &a);
                        }
                        if d.attr_copy().is_none() {
                            d.attr.set_ino(e.ino);
                        }
                        continue;
                    }
                    Some(d) => stale.push(d),
                    None => {}
                }
                let d = self.new_dentry(node, &e.name, NodeKind::Positive(e.kind), e.attr);
                // A plain readdir gives no attributes: remember the inode number only.
                d.attr.set_ino(e.ino);
                inner.children_mut().insert(node, d.clone());
                added.push(d);
            }
            if let Some(ch) = inner.children.as_mut() {
                for d in ch.values() {
                    let keep = seen.contains(&d.link().name[..]);
                    if matches!(d.kind(), NodeKind::Positive(_)) && !keep {
                        stale.push(d.clone());
                    }
                }
                for d in &stale {
                    let name = d.link().name.clone();
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
                inner.bump_gen();
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
}
