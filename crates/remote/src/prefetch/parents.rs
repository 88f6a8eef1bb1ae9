//! Directory attributes from this client's own mutations (`features::PARENTS`): a reply to a
//! call that adds or removes a name carries the attributes of the directories it changed,
//! read after the call was done. They answer the next `getattr` of such a directory (the
//! kernel asks after each create, the core having forgotten them) under the callback promise,
//! as the listings of the prefetch buffer do: a callback or a mutation that may change a
//! directory drops them, and the attributes of a directory are kept only from the reply to
//! the last mutation of it that started (two creates in flight in one directory: the reply
//! that comes last may have been read before the other's change).

use std::collections::{BTreeMap, HashMap};

use dircache_core::Attr;

use super::{below, Stale};

/// At most this many directories' attributes are held (beyond: all dropped).
const MAX_HELD: usize = 4096;

#[derive(Debug, Default)]
pub struct Parents {
    /// Directory -> its attributes after this client's last mutation in it.
    attrs: BTreeMap<Vec<u8>, Attr>,
    /// Directory -> the last mutation started that changes its names (a reply of another
    /// is not kept for it).
    started: HashMap<Vec<u8>, u64>,
    next: u64,
    /// Inodes whose attributes changed while mutations were in flight, with the last
    /// sequence number started then: a reply of a mutation started at or before it is not
    /// kept for a directory with that inode number. Emptied when no mutation is in flight.
    ino_drops: Vec<(u64, u64)>,
    /// `getattr`s answered from here (for statistics and tests).
    pub hits: u64,
}

/// At most this many inode drops are remembered while mutations are in flight (beyond: no
/// reply in flight is kept).
const MAX_INO_DROPS: usize = 1024;

impl Parents {
    /// A mutation changing names in `dirs` is about to be sent: their attributes held are
    /// stale from now on. Its sequence number, for [`Parents::end`].
    pub fn begin(&mut self, dirs: &[Vec<u8>]) -> u64 {
        self.next += 1;
        for d in dirs {
            self.attrs.remove(d);
            self.started.insert(d.clone(), self.next);
        }
        self.next
    }

    /// Mutation `seq` of `dirs` is over, with `got`, the directories' attributes after it
    /// (`None`: failed, or not sent); kept only with `keep` (under a callback promise).
    pub fn end(
        &mut self,
        seq: u64,
        dirs: &[Vec<u8>],
        got: Option<Vec<(Vec<u8>, Attr)>>,
        keep: bool,
    ) {
        for (d, a) in got.into_iter().flatten() {
            let changed = self
                .ino_drops
                .iter()
                .any(|(at, ino)| *ino == a.ino && *at >= seq);
            if keep && !changed && self.started.get(&d) == Some(&seq) {
                if self.attrs.len() >= MAX_HELD {
                    self.attrs.clear();
                }
                self.attrs.insert(d, a);
            }
        }
        for d in dirs {
            if self.started.get(d) == Some(&seq) {
                self.started.remove(d);
            }
        }
        if self.started.is_empty() {
            self.ino_drops.clear();
        }
    }

    /// The attributes of directory `path`, if held.
    pub fn get(&mut self, path: &[u8]) -> Option<Attr> {
        let a = self.attrs.get(path).copied();
        if a.is_some() {
            self.hits += 1;
        }
        a
    }

    /// Directories held (for tests).
    pub fn len(&self) -> usize {
        self.attrs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.attrs.is_empty()
    }

    /// Drop what `stale` may have changed: a directory whose listing is stale, every
    /// directory at or below a stale tree, those of a stale inode; and the replies still to
    /// come for them are not kept (a callback may overtake the reply to a call whose
    /// attributes were read before that change).
    pub fn drop_stale(&mut self, stale: &[Stale]) {
        for s in stale {
            match s {
                Stale::Dir(d) => {
                    self.attrs.remove(d);
                    self.started.remove(d);
                }
                Stale::Tree(t) if t.is_empty() => self.clear(),
                Stale::Tree(t) => {
                    self.attrs.remove(t);
                    self.started.remove(t);
                    let (lo, hi) = below(t);
                    let keys: Vec<Vec<u8>> = self
                        .attrs
                        .range(lo.clone()..hi.clone())
                        .map(|(k, _)| k.clone())
                        .collect();
                    for k in keys {
                        self.attrs.remove(&k);
                    }
                    self.started.retain(|k, _| {
                        !(k.as_slice() >= lo.as_slice() && k.as_slice() < hi.as_slice())
                    });
                }
                Stale::Ino(ino) => {
                    self.attrs.retain(|_, a| a.ino != *ino);
                    // Which directory a reply to come is for is not known by inode: the
                    // replies are checked by their attributes' inode when they come (a
                    // store into a file, which names its inode, while a create runs in
                    // a build with -j2 dropped every reply in flight).
                    match (
                        self.started.is_empty(),
                        self.ino_drops.len() < MAX_INO_DROPS,
                    ) {
                        (true, _) => {}
                        (false, true) => self.ino_drops.push((self.next, *ino)),
                        (false, false) => {
                            self.started.clear();
                            self.ino_drops.clear();
                        }
                    }
                }
                // Directories only: no other links.
                Stale::Linked => {}
            }
        }
    }

    /// Drop everything (a lost connection, an `Overflow`).
    pub fn clear(&mut self) {
        self.attrs.clear();
        self.started.clear();
        self.ino_drops.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(ino: u64, nlink: u32) -> Attr {
        Attr {
            ino,
            nlink,
            mode: libc::S_IFDIR | 0o755,
            ..Attr::default()
        }
    }

    #[test]
    fn only_the_last_started_mutation_of_a_directory_leaves_its_attributes() {
        let mut p = Parents::default();
        let d = vec![b"d".to_vec()];
        let a = p.begin(&d);
        let b = p.begin(&d);
        // B's reply first (read after both changes), then A's (read before B's change).
        p.end(b, &d, Some(vec![(b"d".to_vec(), attr(1, 4))]), true);
        p.end(a, &d, Some(vec![(b"d".to_vec(), attr(1, 3))]), true);
        assert_eq!(p.get(b"d"), Some(attr(1, 4)));
        // A's reply first, then B's: B's stays.
        let a = p.begin(&d);
        let b = p.begin(&d);
        p.end(a, &d, Some(vec![(b"d".to_vec(), attr(1, 5))]), true);
        assert_eq!(p.get(b"d"), None);
        p.end(b, &d, Some(vec![(b"d".to_vec(), attr(1, 6))]), true);
        assert_eq!(p.get(b"d"), Some(attr(1, 6)));
    }

    #[test]
    fn another_inode_changing_while_a_reply_is_in_flight_keeps_the_reply() {
        // A build with -j2: a store into one object (its inode, 77) while the create of
        // another runs in the same directory (inode 1). Before, every reply in flight was
        // dropped: the kernel's getattr of the directory after the create cost a call.
        let mut p = Parents::default();
        let d = vec![b"obj".to_vec()];
        let a = p.begin(&d);
        p.drop_stale(&[Stale::Ino(77)]);
        p.end(a, &d, Some(vec![(b"obj".to_vec(), attr(1, 2))]), true);
        assert_eq!(p.get(b"obj"), Some(attr(1, 2)));
        // A mutation that started after the change is not affected by it either; one that
        // started before the directory's own inode changed is.
        let a = p.begin(&d);
        p.drop_stale(&[Stale::Ino(1)]);
        let b = p.begin(&d);
        p.end(a, &d, Some(vec![(b"obj".to_vec(), attr(1, 3))]), true);
        assert_eq!(p.get(b"obj"), None);
        p.end(b, &d, Some(vec![(b"obj".to_vec(), attr(1, 4))]), true);
        assert_eq!(p.get(b"obj"), Some(attr(1, 4)));
        assert!(p.ino_drops.is_empty(), "nothing in flight");
    }

    #[test]
    fn a_callback_overtaking_the_reply_wins() {
        let mut p = Parents::default();
        let d = vec![b"x/d".to_vec()];
        for stale in [
            Stale::Dir(b"x/d".to_vec()),
            Stale::Tree(b"x".to_vec()),
            Stale::Tree(Vec::new()),
            // The directory's own inode.
            Stale::Ino(1),
        ] {
            let a = p.begin(&d);
            p.drop_stale(std::slice::from_ref(&stale));
            p.end(a, &d, Some(vec![(b"x/d".to_vec(), attr(1, 2))]), true);
            assert_eq!(p.get(b"x/d"), None, "{stale:?}");
        }
        // And one after it drops what is held.
        for stale in [
            Stale::Dir(b"x/d".to_vec()),
            Stale::Tree(b"x".to_vec()),
            Stale::Ino(1),
        ] {
            let a = p.begin(&d);
            p.end(a, &d, Some(vec![(b"x/d".to_vec(), attr(1, 2))]), true);
            assert_eq!(p.get(b"x/d"), Some(attr(1, 2)));
            p.drop_stale(std::slice::from_ref(&stale));
            assert_eq!(p.get(b"x/d"), None, "{stale:?}");
        }
        // Not kept without a callback promise.
        let a = p.begin(&d);
        p.end(a, &d, Some(vec![(b"x/d".to_vec(), attr(1, 2))]), false);
        assert_eq!(p.get(b"x/d"), None);
    }
}
