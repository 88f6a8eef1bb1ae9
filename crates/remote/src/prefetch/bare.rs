//! The paths known to have no extended attributes ([`super::Prefetch`]'s `bare`), with the
//! inode number of each, so that an `Inode` callback (an inode changed, no path known) drops
//! the names of that inode only. Before, it dropped every path: one file removed on a root
//! server (fanotify reports the link count by inode) made every directory's ACL unknown again,
//! and a search over a held tree had to ask the server for each ([`dircache_search::held`]).

use std::collections::{BTreeMap, HashMap};

use super::below;

#[derive(Debug, Default)]
pub struct BareSet {
    paths: BTreeMap<Vec<u8>, u64>,
    by_ino: HashMap<u64, Vec<Vec<u8>>>,
}

impl BareSet {
    pub fn len(&self) -> usize {
        self.paths.len()
    }

    pub fn contains(&self, path: &[u8]) -> bool {
        self.paths.contains_key(path)
    }

    pub fn insert(&mut self, path: Vec<u8>, ino: u64) {
        if let Some(old) = self.paths.insert(path.clone(), ino) {
            self.unindex(&path, old);
        }
        self.by_ino.entry(ino).or_default().push(path);
    }

    fn unindex(&mut self, path: &[u8], ino: u64) {
        if let Some(v) = self.by_ino.get_mut(&ino) {
            v.retain(|p| p != path);
            if v.is_empty() {
                self.by_ino.remove(&ino);
            }
        }
    }

    pub fn remove(&mut self, path: &[u8]) {
        if let Some(ino) = self.paths.remove(path) {
            self.unindex(path, ino);
        }
    }

    /// Every path strictly below `t`.
    pub fn remove_below(&mut self, t: &[u8]) {
        let (lo, hi) = below(t);
        let keys: Vec<Vec<u8>> = self.paths.range(lo..hi).map(|(k, _)| k.clone()).collect();
        for k in keys {
            self.remove(&k);
        }
    }

    /// The names of inode `ino`.
    pub fn remove_ino(&mut self, ino: u64) {
        for p in self.by_ino.remove(&ino).unwrap_or_default() {
            self.paths.remove(&p);
        }
    }

    pub fn clear(&mut self) {
        self.paths.clear();
        self.by_ino.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inode_drops_its_names_only() {
        let mut b = BareSet::default();
        b.insert(b"a".to_vec(), 1);
        b.insert(b"a/x".to_vec(), 2);
        b.insert(b"a/y".to_vec(), 2);
        b.insert(b"b".to_vec(), 3);
        b.remove_ino(2);
        assert!(b.contains(b"a") && b.contains(b"b"));
        assert!(!b.contains(b"a/x") && !b.contains(b"a/y"));
        b.insert(b"a/z".to_vec(), 4);
        b.remove_below(b"a");
        assert!(b.contains(b"a") && !b.contains(b"a/z"));
        b.remove_ino(4);
        assert_eq!(b.len(), 2);
        b.remove(b"a");
        b.remove_ino(1);
        assert_eq!(b.len(), 1);
    }
}
