//! Mounts, bind mounts and namespaces (SOSP'15 §4.3).
//!
//! Each [`Namespace`] has its own DLHT and signature key and a mount table keyed by
//! mount-point dentry id. A bind mount is a mount whose root is an existing dentry; mounts
//! behave as recursive binds (a mount on a dentry shows wherever that dentry is reached).
//! Walks cross into mounts (`cross`) and climb out of them on `..` (`dotdot`); mounting and
//! unmounting bump the mount point's subtree (I1).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::RwLock;

use super::dentry::{Dentry, MOUNTED};
use super::dlht::{Dlht, SigKey};
use super::{Cache, NodeKind, NodeRef, Super};
use crate::{Backend, Cred, Error, FileType, LookupFlags, Result};
use siphasher::sip128::SipHasher13;

/// A mount: a file system (or a bound directory) attached at a mount point.
pub(crate) struct Mount {
    pub(crate) root: NodeRef,
    /// The mount and dentry this mount covers; `None` for a namespace root.
    pub(crate) parent: Option<(Arc<Mount>, NodeRef)>,
    pub(crate) opts: MountOptions,
}

/// A mount namespace: a mount table and its own direct-lookup table.
pub struct Namespace {
    pub(crate) base: SipHasher13,
    pub(crate) dlht: Dlht,
    pub(crate) root: Arc<Mount>,
    /// Mount point dentry id -> what is mounted there.
    pub(crate) mounts: RwLock<hashbrown::HashMap<u64, Arc<Mount>>>,
}

impl Namespace {
    pub(crate) fn new(root: Arc<Mount>, mounts: hashbrown::HashMap<u64, Arc<Mount>>) -> Namespace {
        let key = SigKey::random();
        Namespace {
            base: key.hasher(),
            dlht: Dlht::new(),
            root,
            mounts: RwLock::new(mounts),
        }
    }
}

/// Per-mount options (§4.3).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MountOptions {
    /// Mutations fail with EROFS.
    pub read_only: bool,
    /// Set-user-id and set-group-id bits are ignored (reported by [`Cache::mount_options`]).
    pub nosuid: bool,
    /// Files may not be executed: access(X_OK) on non-directories fails with EACCES.
    pub noexec: bool,
}

/// What to mount.
pub enum MountSource {
    /// A new file system served by another backend.
    Backend(Arc<dyn Backend>),
    /// A bind mount: an existing directory of the same namespace, by absolute path.
    Bind(Vec<u8>),
}

impl Cache {
    /// `..` of (mnt, cur): the parent, climbing out of mounts; the namespace root is its own
    /// parent.
    pub(crate) fn dotdot(
        &self,
        ns: &Namespace,
        mnt: &Arc<Mount>,
        cur: &NodeRef,
    ) -> (Arc<Mount>, NodeRef) {
        let mut mnt = mnt.clone();
        let mut cur = cur.clone();
        loop {
            if Arc::ptr_eq(&cur, &mnt.root) {
                match &mnt.parent {
                    Some((pm, mp)) if !Arc::ptr_eq(&mnt, &ns.root) => {
                        let (pm, mp) = (pm.clone(), mp.clone());
                        mnt = pm;
                        cur = mp;
                        continue;
                    }
                    _ => return (mnt, cur),
                }
            }
            return match cur.parent_ref() {
                Some(p) => (mnt, p),
                None => (mnt.clone(), cur),
            };
        }
    }

    /// Follow mounts stacked on `node` in `ns`.
    pub(crate) fn cross(
        &self,
        ns: &Namespace,
        mnt: &Arc<Mount>,
        node: NodeRef,
    ) -> (Arc<Mount>, NodeRef) {
        let mut mnt = mnt.clone();
        let mut node = node;
        while node.has(MOUNTED) {
            let m = ns.mounts.read().get(&node.id).cloned();
            match m {
                // Only a mount made on this dentry as seen through `mnt`: a bind mount of a
                // directory holding a mount point shows the covered directory (MS_BIND without
                // MS_REC does not replicate submounts).
                Some(m)
                    if m.parent
                        .as_ref()
                        .is_some_and(|(pm, _)| Arc::ptr_eq(pm, &mnt)) =>
                {
                    node = m.root.clone();
                    mnt = m;
                }
                _ => break,
            }
        }
        (mnt, node)
    }

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
        if let NodeKind::Negative(e) = node.kind() {
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
                let ver = self.seq.fetch_add(1, Ordering::SeqCst);
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
