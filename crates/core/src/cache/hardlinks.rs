//! Hard links: attributes shared by several cached names of one inode.
//!
//! The `hardlinks` table maps (dev, ino) of every cached non-directory with more than one
//! link to its cached names (weakly). A change of the inode's attributes through one name
//! (`link`, `unlink`, `setattr`, a rename over it) sets or forgets them for the others, and an
//! outside change that named only the inode (`Change::Inode`) forgets them for all.

use std::sync::{Arc, Weak};

use super::dentry::Dentry;
use super::{Cache, Invalidation, NodeRef};
use crate::Attr;

/// Cached names of multiply linked inodes, by (dev, ino).
pub(crate) type HardLinks = hashbrown::HashMap<(u64, u64), Vec<Weak<Dentry>>>;

impl Cache {
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

    pub(crate) fn forget_links_unknown(&self, node: &Dentry) {
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
    pub(crate) fn inode_changed(&self, dev: u64, ino: u64) -> Vec<Invalidation> {
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
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::memory::MemoryBackend;
    use crate::{At, Backend, Cache, Change, Config, Cred, LookupFlags};

    /// A name first listed without attributes (a plain listing, or a remote names-only one)
    /// whose attributes a later full listing brings: when those say "hard-linked", the name
    /// is filed under its inode, so an outside change by inode alone (`Change::Inode`: a link
    /// count moved by a name nobody reported) reaches it. Before: the full listing stored the
    /// attributes without filing the name, and the cache kept showing the old link count.
    #[test]
    fn a_name_listed_without_attributes_then_with_them_follows_its_inode() {
        let m = Arc::new(MemoryBackend::new());
        m.populate(&["d/", "e/", "d/a"]);
        let root = Cred::root();
        m.link(&root, b"d/a", b"e/b").expect("link");
        let c = Cache::new(m.clone(), Config::default()).expect("cache");
        let r = c.credentials(root.clone());
        let d = c
            .lookup(&r, At::Root, b"d", LookupFlags::NOFOLLOW)
            .expect("d");
        let names = c.readdir_node(&r, &d, false).expect("names");
        assert!(names.iter().any(|e| e.name == b"a" && e.attr.is_none()));
        let full = c.readdir_node(&r, &d, true).expect("listing");
        let a = full
            .iter()
            .find(|e| e.name == b"a")
            .and_then(|e| e.attr)
            .expect("attributes of a");
        assert_eq!(a.nlink, 2);
        let stat = |p: &[u8]| {
            c.stat(&r, At::Root, p, LookupFlags::NOFOLLOW)
                .expect("stat")
        };
        assert_eq!(stat(b"d/a").nlink, 2);
        // A third name, made behind the cache's back and reported by inode only.
        m.link(&root, b"e/b", b"e/c").expect("link");
        c.apply_change(&Change::Inode {
            dev: a.dev,
            ino: a.ino,
        });
        assert_eq!(
            stat(b"d/a").nlink,
            3,
            "d/a kept the link count from before the inode's change"
        );
    }
}
