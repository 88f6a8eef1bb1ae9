//! Credentials: who is asking.

/// The identity an access decision is made for: fs uid, fs gid and supplementary groups.
///
/// Two `Cred`s that compare equal share one prefix-check cache (see [`crate::Cache::credentials`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Cred {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups, sorted and without duplicates.
    groups: Box<[u32]>,
}

impl Cred {
    pub fn new(uid: u32, gid: u32, groups: impl IntoIterator<Item = u32>) -> Cred {
        let mut g: Vec<u32> = groups.into_iter().collect();
        g.sort_unstable();
        g.dedup();
        Cred {
            uid,
            gid,
            groups: g.into_boxed_slice(),
        }
    }

    /// uid 0, gid 0, no supplementary groups.
    pub fn root() -> Cred {
        Cred::new(0, 0, [])
    }

    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    pub fn groups(&self) -> &[u32] {
        &self.groups
    }

    /// Whether `gid` is the primary group or one of the supplementary groups.
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.binary_search(&gid).is_ok()
    }
}
