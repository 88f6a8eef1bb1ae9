//! Batched walks: a slow-path miss asks the backend about the rest of the path in one
//! [`Backend::walk`](crate::Backend::walk) (gVisor's gofer Walk; one round trip for a remote
//! backend) instead of one `lookup` per component.
//!
//! When the walk (`walk.rs`) reaches a name its directory does not have cached (and the
//! directory is not complete, so the miss cannot be answered from the cache), the components
//! that follow and are known in advance go with it: up to the end of the path (across the
//! rest of the symlink bodies being resolved), stopping before a `.` or `..` (whose meaning
//! depends on what the components turn out to be) and before an over-long name. The backend
//! walks them without following symlinks and stops at the first one that fails or that is not
//! a directory with components after it (a symlink, a file). Every positive component it
//! reports is cached with its attributes, and a negative for a missing one (ENOENT) right
//! after the last positive directory. The walk then goes on through the cached dentries as
//! before: the search-permission check on every directory, for the caller, happens there,
//! as do mount crossing, symlink resolution (the body is read then) and deep negatives. So
//! caching here makes nothing visible to a caller who could not see it: what a lookup
//! returns is decided by the walk's checks, as for dentries cached by another caller.
//!
//! **Invariant (docs/core.md I12): a dentry cached from a walk's answer is never older than a change made
//! through the cache, or reported to it, before it was cached.** The first component is
//! checked as `child` checks a lookup: against its directory's `gen` and version read before
//! the call (`by_path` retries the call if a rename through the cache raced it). Each later
//! component is cached only below a dentry this same batch created and cached (never below
//! one that was already there, or a revived one), and checked against that dentry's state at
//! creation (`gen` 0 and its first version). A change that touches the walked names after the
//! backend answered has to resolve their directory through the cache: either it finds the new
//! dentry and bumps its `gen` or version (the check fails, nothing more is cached), or it
//! caches a dentry of its own first (this batch then finds it there and stops). Where the
//! batch stops, the walk goes on one component at a time, exactly as without batching.
//! Tested by `race_tests::walk_races_rename_*`.
//!
//! Backends without a cheaper walk get the trait's default (one `lookup` per component, which
//! stops where the walk would have stopped), so their call count does not grow, except when a
//! caller lacks search permission on a directory in the middle: the components below it are
//! looked up although the walk then fails with EACCES.

use std::borrow::Cow;

use super::dentry::{COMPLETE, PENDING};
use super::{Cache, NodeKind, NodeRef};
use crate::{Error, FileType, Result, NAME_MAX};

/// Most components handed to one backend walk.
const MAX_BATCH: usize = 256;

/// The components after the current one that are known before any of them is resolved: the
/// rest of the walk's stack of path buffers, stopping before `.`, `..` or an over-long name.
fn known_ahead<'s>(stack: &'s [(Cow<'_, [u8]>, usize)]) -> Vec<&'s [u8]> {
    let mut out = Vec::new();
    for (buf, pos) in stack.iter().rev() {
        let rest = buf.get(*pos..).unwrap_or_default();
        for c in rest.split(|&b| b == b'/').filter(|c| !c.is_empty()) {
            if c == b"." || c == b".." || c.len() > NAME_MAX || out.len() >= MAX_BATCH {
                return out;
            }
            out.push(c);
        }
    }
    out
}

impl Cache {
    /// `child`, for the walk: on a miss, the components after `name` on the walk's `stack`
    /// are asked about in the same backend walk and cached (module doc). Returns `name`'s
    /// dentry, as `child`.
    pub(crate) fn child_batched(
        &self,
        dir: &NodeRef,
        name: &[u8],
        stack: &[(Cow<'_, [u8]>, usize)],
        missed: &mut bool,
    ) -> Result<NodeRef> {
        if !self.config.walk_batch || name.len() > NAME_MAX {
            return self.child(dir, name, missed);
        }
        {
            let inner = dir.inner.read();
            if let Some(c) = inner.child(name) {
                // A hit, as in `child` (one read lock, not two, on the slow path's hits).
                c.touch();
                return Ok(c.clone());
            }
            if self.config.completeness && dir.has(COMPLETE) {
                drop(inner);
                return self.child(dir, name, missed);
            }
        }
        if dir.has(PENDING) && self.take_pending(dir, true) {
            return self.child_batched(dir, name, stack, missed);
        }
        let ahead = known_ahead(stack);
        if ahead.is_empty() {
            return self.child(dir, name, missed);
        }
        let mut names: Vec<&[u8]> = Vec::with_capacity(ahead.len() + 1);
        names.push(name);
        names.extend_from_slice(&ahead);
        *missed = true;
        let (walked, gen0, ver0) = self.by_path(dir, |dpath| {
            let (gen0, ver0) = (dir.inner.read().gen(), dir.version());
            let w = self
                .stats
                .backend
                .walk
                .time(|| dir.sb.backend.walk(dpath, &names));
            (w, gen0, ver0)
        })?;
        let mut attrs = walked.attrs.iter().take(names.len());
        // The first component: exactly what `child` caches for a lookup's answer.
        let mut below = match attrs.next() {
            Some(a) => self.insert_child_new(
                dir,
                name,
                gen0,
                ver0,
                NodeKind::Positive(a.kind()),
                Some(*a),
            ),
            None => match walked.error {
                Some(Error::NotFound) => self.insert_child_new(
                    dir,
                    name,
                    gen0,
                    ver0,
                    NodeKind::Negative(Error::NotFound),
                    None,
                ),
                Some(e) => return Err(e),
                // A backend that answered nothing and no error: ask again the plain way.
                None => return self.child(dir, name, missed),
            },
        };
        let first = below.0.clone();
        // The others, each below the dentry this batch created for the one before it.
        let mut i = 1;
        while let Some(ver) = below.1 {
            let parent = &below.0;
            if parent.kind() != NodeKind::Positive(FileType::Directory) || i >= names.len() {
                break;
            }
            let (kind, attr) = match attrs.next() {
                Some(a) => (NodeKind::Positive(a.kind()), Some(*a)),
                None if walked.error == Some(Error::NotFound) => {
                    (NodeKind::Negative(Error::NotFound), None)
                }
                None => break,
            };
            below = self.insert_child_new(parent, names[i], 0, ver, kind, attr);
            i += 1;
        }
        Ok(first)
    }
}
