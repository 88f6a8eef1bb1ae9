//! Negative entries (SOSP'15 §5.2, docs/core.md I7): a negative dentry holds the errno its
//! name gives (ENOENT, or ENOTDIR below a non-directory). Deep negatives hang below negatives
//! and files, so `missing/x/y` is one DLHT probe; the walk creates them (`walk_any_length`),
//! mutations replace them (`install`), and an outside change that says something exists below
//! a negative drops the whole chain here.

use super::dentry::COMPLETE;
use super::{Cache, Invalidation, NodeKind, NodeRef};
use crate::Error;

impl Cache {
    /// A negative child of `dir` (deep negatives under negatives and non-directories, or a
    /// miss in a complete directory).
    pub(crate) fn negative_child(&self, dir: &NodeRef, name: &[u8], err: Error) -> NodeRef {
        let gen0 = dir.inner.read().gen();
        self.insert_child(
            dir,
            name,
            gen0,
            dir.version(),
            NodeKind::Negative(err),
            None,
        )
    }

    /// Drop the topmost negative of a chain of (deep) negatives ending at `negative`.
    pub(crate) fn drop_negative_chain(&self, negative: &NodeRef) -> Vec<Invalidation> {
        let mut top = negative.clone();
        while let Some(p) = top.parent_ref() {
            match p.kind() {
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
            pi.bump_gen();
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
}
