//! The client's prefetch buffer: directory listings (with attributes) that came in bulk with a
//! [`Subtree`](crate::proto::Request::Subtree) reply and that no one asked for yet. When the
//! core cache first lists directory D, the client asks for D's whole subtree (bounded by an
//! entry budget that doubles with every bulk call, up to the buffer's size) in one round trip;
//! D's own listing answers the call, the rest waits here for the `readdir`, `lookup`, `walk`
//! and `getattr` calls that a `find`, `du`, `ls -lR` or `git status` makes next, which are
//! then answered without a round trip. A listing is handed to `readdir` once (the core cache
//! owns it from then on, and keeps it coherent with the callbacks it gets); lookups only read.
//!
//! **Invariant.** Every listing here was complete and current on the server at some moment
//! after (a) the last callback the client received that could touch it and (b) the last
//! mutation this client made that could touch it; it is dropped before any later callback
//! touching it reaches the cache. How:
//! - Only with the `CALLBACKS` feature (without callbacks nothing could keep it current).
//! - What a change can make stale is a set of [`Stale`] items ([`stale_of`]): a change of
//!   `p` (an entry appeared, disappeared, was replaced, or its attributes changed) touches the
//!   listings of `p`'s parent (which names `p`) and grandparent (which holds the parent's
//!   attributes, moved by an entry change) and every listing at or below `p` (a renamed or
//!   removed directory takes its whole subtree). A change that can move the attributes of an
//!   inode with other links (unlink, link, rename, setattr, a write...) also touches every
//!   listing holding a non-directory with more than one link ([`Stale::Linked`]), and a write
//!   through a handle whose inode is known, every listing naming that inode.
//! - The reader thread applies each callback here first, synchronously, before queueing it
//!   for the cache ([`Prefetch::touched`]); this client's mutations are applied before they
//!   are sent ([`Prefetch::mutation_begin`]). Either drops the listings held that it touches,
//!   and marks them stale in every bulk call in flight: a listing of such a call that arrives
//!   later may have been read on the server before the change (the server reads with several
//!   threads, and runs calls in parallel), so it is dropped on arrival, for the rest of the
//!   call ([`Prefetch::store_part`]); the call itself goes on. A call whose whole root is
//!   touched ends.
//! - A mutation is in flight from before it is sent until its reply arrived (the server
//!   applied it then); a bulk call that starts meanwhile may be read on the server before
//!   the mutation is applied, so it starts with the mutation's stale items too. A bulk call
//!   sent after the reply arrived, or after a callback arrived, is read after the change.
//! - An `Inode` callback (an inode's attributes changed, no path known) touches every listing
//!   naming that inode, and what is known about extended attributes. `Overflow` and a lost
//!   connection drop everything and end every call in flight (a generation moves: parts of
//!   older calls are not stored).
//! - Bounded: at most `max` entries in all; a reply that does not fit is dropped; at most
//!   [`MAX_STALE`] stale items per call in flight (past that, the call ends).
//!
//! **Names first** (feature `NAMES`): a bulk call may bring a directory's names (types, inode
//! numbers, its subdirectories' attributes) before its full listing. Those names-only
//! listings are held apart ([`Prefetch::store_names`]; at most `max` entries more), under
//! the same invariant and dropped by the same changes; a directory's full listing replaces
//! them. They answer a `readdir` without attributes ([`Prefetch::take_names`]: the core
//! cache then holds the names, and lookups of the files wait for the full listing, which
//! stays here for them), and lookups of subdirectories and of names the listing lacks
//! (they stay until the full listing replaces them).

use std::collections::{BTreeMap, BTreeSet, HashMap};

mod bare;
pub mod parents;

use dircache_core::{Attr, DirEntry, Error};

use crate::proto::SubtreeDir;

/// What a change can make stale (module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stale {
    /// The listing of this directory.
    Dir(Vec<u8>),
    /// Every listing at or below this path (the root: everything).
    Tree(Vec<u8>),
    /// Every listing holding a non-directory with more than one link: its attributes (link
    /// count, ctime, size...) change with any of its names.
    Linked,
    /// Every listing holding an entry for this inode number.
    Ino(u64),
}

/// The inode numbers an entry names (its own, and its attributes' if they differ).
fn inos(e: &DirEntry) -> impl Iterator<Item = u64> {
    let a = e.attr.map(|a| a.ino).filter(|i| *i != e.ino);
    std::iter::once(e.ino).chain(a)
}

/// An entry whose attributes another name of the same inode shows too.
fn linked(e: &DirEntry) -> bool {
    e.attr.is_some_and(|a| a.nlink > 1 && !a.is_dir())
}

impl Stale {
    /// Whether the listing of `dir` (holding `entries`) may be stale.
    fn hits(&self, dir: &[u8], entries: &[DirEntry]) -> bool {
        match self {
            Stale::Dir(d) => d == dir,
            Stale::Tree(t) => is_below(dir, t),
            Stale::Linked => entries.iter().any(linked),
            Stale::Ino(i) => entries.iter().any(|e| inos(e).any(|n| n == *i)),
        }
    }

    /// Whether any listing of `dir` may be stale, whatever it holds.
    fn hides(&self, dir: &[u8]) -> bool {
        match self {
            Stale::Dir(d) => d == dir,
            Stale::Tree(t) => is_below(dir, t),
            Stale::Linked | Stale::Ino(_) => false,
        }
    }

    /// Whether every listing at or below `dir` may be stale.
    fn covers(&self, dir: &[u8]) -> bool {
        matches!(self, Stale::Tree(t) if is_below(dir, t))
    }
}

/// What a change of `p` makes stale, as its callback would (module docs): the listings of
/// its parent and grandparent and every listing at or below it.
pub fn stale_of(p: &[u8]) -> Vec<Stale> {
    let par = parent(p);
    let mut v = vec![Stale::Dir(par.to_vec())];
    if !par.is_empty() {
        v.push(Stale::Dir(parent(par).to_vec()));
    }
    v.push(Stale::Tree(p.to_vec()));
    v
}

/// Most stale items one bulk call in flight collects; past that it ends.
pub const MAX_STALE: usize = 4096;

/// Listings waiting to be asked for (module docs).
#[derive(Debug)]
pub struct Prefetch {
    listings: BTreeMap<Vec<u8>, Vec<DirEntry>>,
    entries: usize,
    gen: u64,
    /// Most entries held; 0 turns prefetching off.
    pub max: usize,
    /// Budget of the next bulk call.
    budget: u64,
    /// Listings answered from here (for statistics and tests).
    pub hits: u64,
    /// Roots of bulk calls cut short by their budget, with that budget (a hint, not data: at
    /// most [`MAX_CUT_ROOTS`]). A listing missed below one is fetched with the whole root again,
    /// with the next (larger) budget, rather than one subtree per missed directory; never again
    /// with a budget no larger (the same listings would come again).
    cut: Vec<(Vec<u8>, u64)>,
    /// Streamed bulk calls whose frames are still arriving: (token, root). A caller that wants
    /// a listing below one of them waits for it instead of asking the server itself
    /// (crate::client::bulk). A callback or mutation marks what it touches stale in each
    /// (dropped when it arrives); `Inode`, `Overflow` and a lost connection end them all.
    inflight: Vec<InFlight>,
    next_token: u64,
    /// How callers waited for listings of calls in flight (statistics, tests).
    pub waits: WaitStats,
    /// Paths known to have no extended attributes (from bulk replies; at most `max`), under
    /// the same invariant as the listings. Never a name of an inode with other links.
    bare: bare::BareSet,
    /// Listings held that hold a non-directory with more than one link ([`Stale::Linked`]).
    linked: BTreeSet<Vec<u8>>,
    /// Entries held per inode number ([`Stale::Ino`] looks only when there are some).
    inos: HashMap<u64, u32>,
    /// This client's mutations in flight (sent, not answered): id and what they make stale.
    mutations: Vec<(u64, Vec<Stale>)>,
    next_mutation: u64,
    /// Directories not held here that a lookup had to ask the server about (a hint, not
    /// data: at most [`MAX_MISSED_DIRS`]). A second miss in one of them fetches it in bulk:
    /// programs that stat paths without listing first (`git status` stats every file of its
    /// index) then pay a round trip per directory level, not one per entry.
    missed: BTreeSet<Vec<u8>>,
    /// Directories whose listing this client handed to the cache since the cache last forgot
    /// everything (a hint: at most [`MAX_LISTED_DIRS`]). Listing one again (the cache dropped
    /// just that listing after a change) is a plain `Readdir`: the subtree below is still in
    /// the cache, and a bulk call would fetch all of it again.
    listed: BTreeSet<Vec<u8>>,
    /// Names first: names-only listings whose full listings have not come (module docs).
    names: BTreeMap<Vec<u8>, Vec<DirEntry>>,
    /// Entries in `names`.
    names_entries: usize,
    /// Directory attributes from this client's own mutations (features::PARENTS).
    pub parents: parents::Parents,
}

/// A streamed bulk call in flight.
#[derive(Debug)]
struct InFlight {
    token: u64,
    root: Vec<u8>,
    /// The call's id once sent (for [`ClientMsg::Hurry`](crate::proto::ClientMsg::Hurry)).
    call: Option<u64>,
    /// Directories (relative to `root`) already hurried (at most [`MAX_HURRIED`]).
    hurried: BTreeSet<Vec<u8>>,
    /// Directories (backend paths) whose listings the call brought already: not coming again
    /// (a caller that finds one gone, handed to another caller meanwhile, does not wait for
    /// the rest of the call).
    delivered: BTreeSet<Vec<u8>>,
    /// Directories (backend paths) whose names the call brought (names first): a caller
    /// waiting for the full listing then hurries it as one waiting for attributes.
    named: BTreeSet<Vec<u8>>,
    /// Directories (relative to `root`) hurried for their full listing after their names
    /// came (at most [`MAX_HURRIED`]).
    hurried_full: BTreeSet<Vec<u8>>,
    /// What changes since the call was sent (or still in flight when it was) made stale:
    /// listings it hits are dropped when they arrive (at most [`MAX_STALE`]).
    stale: Vec<Stale>,
}

/// Most directories hurried per bulk call.
pub const MAX_HURRIED: usize = 4096;

/// How callers waited for listings that bulk calls in flight were bringing.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WaitStats {
    /// Waits (a caller found its listing coming, not there yet).
    pub waits: u64,
    /// Their total, in microseconds.
    pub wait_us: u64,
    /// The longest, in microseconds.
    pub max_wait_us: u64,
    /// Hurries sent (a wait past [`HURRY_AFTER_MS`]).
    pub hurries: u64,
    /// Listings stored from bulk replies.
    pub stored: u64,
    /// Listings handed over or looked up while a bulk call was still in flight.
    pub early: u64,
    /// Bulk calls started.
    pub calls: u64,
    /// Listings of bulk calls dropped on arrival: a change since the call was sent may have
    /// made them stale.
    pub stale: u64,
}

/// A caller waiting this long for a listing a bulk call in flight brings hurries it.
pub const HURRY_AFTER_MS: u64 = 2;

/// Most directories remembered as listed.
pub const MAX_LISTED_DIRS: usize = 1 << 16;

/// Most directories remembered in [`Prefetch`]'s lookup misses.
pub const MAX_MISSED_DIRS: usize = 4096;

/// Most cut roots remembered.
pub const MAX_CUT_ROOTS: usize = 64;

/// The first bulk call's entry budget.
pub const FIRST_BUDGET: u64 = 1024;

/// Whether backend path `dir` is `root` or below it.
pub fn is_below(dir: &[u8], root: &[u8]) -> bool {
    root.is_empty() || dir == root || (dir.starts_with(root) && dir.get(root.len()) == Some(&b'/'))
}

/// The key range of the paths strictly below backend path `p` (not the root).
fn below(p: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let mut lo = p.to_vec();
    lo.push(b'/');
    let mut hi = p.to_vec();
    hi.push(b'/' + 1);
    (lo, hi)
}

/// The parent of backend path `p` (the root for a top-level name).
pub fn parent(p: &[u8]) -> &[u8] {
    match p.iter().rposition(|&b| b == b'/') {
        Some(i) => &p[..i],
        None => b"",
    }
}

/// `a/b` for backend paths (`b` alone when `a` is the root, `a` when `b` is empty).
pub fn join(a: &[u8], b: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(a.len() + 1 + b.len());
    p.extend_from_slice(a);
    if !a.is_empty() && !b.is_empty() {
        p.push(b'/');
    }
    p.extend_from_slice(b);
    p
}

impl Prefetch {
    pub fn new(max: usize) -> Prefetch {
        Prefetch {
            listings: BTreeMap::new(),
            entries: 0,
            gen: 0,
            max,
            budget: FIRST_BUDGET,
            hits: 0,
            cut: Vec::new(),
            inflight: Vec::new(),
            next_token: 1,
            waits: WaitStats::default(),
            bare: bare::BareSet::default(),
            linked: BTreeSet::new(),
            inos: HashMap::new(),
            mutations: Vec::new(),
            next_mutation: 1,
            missed: BTreeSet::new(),
            listed: BTreeSet::new(),
            names: BTreeMap::new(),
            names_entries: 0,
            parents: parents::Parents::default(),
        }
    }

    pub fn enabled(&self) -> bool {
        self.max > 0
    }

    pub fn generation(&self) -> u64 {
        self.gen
    }

    /// Listings held.
    pub fn len(&self) -> usize {
        self.listings.len()
    }

    pub fn is_empty(&self) -> bool {
        self.listings.is_empty()
    }

    /// Entries held.
    pub fn entries(&self) -> usize {
        self.entries
    }

    /// The budget for the next bulk call (doubling each time, up to `max`).
    pub fn next_budget(&mut self) -> u64 {
        let b = self.budget.min(self.max as u64);
        self.budget = (self.budget * 2).min(self.max as u64).max(FIRST_BUDGET);
        b
    }

    /// Forget everything and end every bulk call in flight (`Overflow`, `Inode`, a lost
    /// connection). Mutations in flight stay in flight.
    pub fn clear(&mut self) {
        self.parents.clear();
        self.gen += 1;
        self.inflight.clear();
        self.listings.clear();
        self.entries = 0;
        self.bare.clear();
        self.linked.clear();
        self.inos.clear();
        self.names.clear();
        self.names_entries = 0;
    }

    /// A callback touching `path` ([`stale_of`]).
    pub fn touched(&mut self, path: &[u8]) {
        self.drop_stale(&stale_of(path));
    }

    /// A callback about inode `ino` (its attributes changed, no path known: a link count,
    /// or a change through a name outside the served tree): the listings naming it, held or
    /// to come; and the names of that inode known to have no extended attributes.
    pub fn touched_inode(&mut self, ino: u64) {
        self.drop_stale(&[Stale::Ino(ino)]);
        self.bare.remove_ino(ino);
    }

    /// A mutation by this client is about to be sent: drop what it makes stale, here and in
    /// every bulk call in flight, and in every call that starts before it ends
    /// ([`Prefetch::mutation_end`]). Its id.
    pub fn mutation_begin(&mut self, stale: Vec<Stale>) -> u64 {
        // A listing held whole that this client's own change (a create, an unlink in it)
        // makes stale is fetched alone when it is needed again, as one the cache dropped
        // (`was_listed`), not with its parent's subtree (creates in a directory known from
        // a bulk reply fetched the whole tree again with growing budgets).
        for s in &stale {
            if let Stale::Dir(d) = s {
                if self.listings.contains_key(d) {
                    self.mark_listed(d);
                }
            }
        }
        self.drop_listings(&stale);
        // A directory's own attributes: an own mutation changes them only by changing names
        // in it (`Parents::begin`, told by the caller) or by changing the directory itself
        // (a `Tree` or `Ino` of it). Its `Dir` items are listings holding the changed entry's
        // attributes: a store into `d/f` leaves `d`'s attributes as they were (before, each
        // store dropped them, and a build asked for `d`'s attributes again after each object).
        let own: Vec<Stale> = stale
            .iter()
            .filter(|s| !matches!(s, Stale::Dir(_)))
            .cloned()
            .collect();
        self.parents.drop_stale(&own);
        let id = self.next_mutation;
        self.next_mutation += 1;
        self.mutations.push((id, stale));
        id
    }

    /// Mutation `id` was answered (or its connection is gone).
    pub fn mutation_end(&mut self, id: u64) {
        self.mutations.retain(|(m, _)| *m != id);
    }

    /// Mutations in flight (for tests).
    pub fn mutations_in_flight(&self) -> usize {
        self.mutations.len()
    }

    /// Drop the listings held that `stale` hits, and mark them stale in every bulk call in
    /// flight (a call whose whole subtree it covers, or that collected too many, ends).
    pub fn drop_stale(&mut self, stale: &[Stale]) {
        self.parents.drop_stale(stale);
        self.drop_listings(stale);
    }

    /// [`Prefetch::drop_stale`] of the listings only (not the directory attributes of
    /// [`Prefetch::parents`]).
    fn drop_listings(&mut self, stale: &[Stale]) {
        for s in stale {
            match s {
                Stale::Dir(d) => {
                    self.remove(d);
                    self.remove_names(d);
                }
                Stale::Tree(t) if t.is_empty() => {
                    self.names.clear();
                    self.names_entries = 0;
                    self.listings.clear();
                    self.entries = 0;
                    self.bare.clear();
                    self.linked.clear();
                    self.inos.clear();
                }
                Stale::Tree(t) => {
                    self.remove(t);
                    self.remove_names(t);
                    self.bare.remove(t);
                    let (lo, hi) = below(t);
                    let names_below: Vec<Vec<u8>> = self
                        .names
                        .range(lo.clone()..hi.clone())
                        .map(|(k, _)| k.clone())
                        .collect();
                    for k in names_below {
                        self.remove_names(&k);
                    }
                    self.bare.remove_below(t);
                    let keys: Vec<Vec<u8>> = self
                        .listings
                        .range(lo..hi)
                        .map(|(k, _)| k.clone())
                        .collect();
                    for k in keys {
                        self.remove(&k);
                    }
                }
                Stale::Linked => {
                    for k in std::mem::take(&mut self.linked) {
                        self.remove(&k);
                    }
                }
                Stale::Ino(_) if !self.names.is_empty() && self.drop_names_hit(s) => {}
                Stale::Ino(i) if !self.inos.contains_key(i) => {}
                Stale::Ino(_) => {
                    let keys: Vec<Vec<u8>> = self
                        .listings
                        .iter()
                        .filter(|(k, l)| s.hits(k, l))
                        .map(|(k, _)| k.clone())
                        .collect();
                    for k in keys {
                        self.remove(&k);
                    }
                }
            }
        }
        self.inflight.retain_mut(|c| {
            if stale.iter().any(|s| s.covers(&c.root)) {
                return false;
            }
            for s in stale {
                // The same file written again and again adds nothing.
                if !c.stale.contains(s) {
                    c.stale.push(s.clone());
                }
            }
            c.stale.len() <= MAX_STALE
        });
    }

    /// Drop the names-only listings `s` hits; false (to go on with the full listings).
    fn drop_names_hit(&mut self, s: &Stale) -> bool {
        let keys: Vec<Vec<u8>> = self
            .names
            .iter()
            .filter(|(k, l)| s.hits(k, l))
            .map(|(k, _)| k.clone())
            .collect();
        for k in keys {
            self.remove_names(&k);
        }
        false
    }

    fn remove_names(&mut self, dir: &[u8]) -> Option<Vec<DirEntry>> {
        let l = self.names.remove(dir)?;
        self.names_entries -= l.len();
        Some(l)
    }

    fn remove(&mut self, dir: &[u8]) -> Option<Vec<DirEntry>> {
        let l = self.listings.remove(dir)?;
        self.entries -= l.len();
        self.linked.remove(dir);
        for n in l.iter().flat_map(inos) {
            if let Some(c) = self.inos.get_mut(&n) {
                *c -= 1;
                if *c == 0 {
                    self.inos.remove(&n);
                }
            }
        }
        Some(l)
    }

    /// Store one part of the reply of streamed bulk call `token`, as many whole listings as
    /// fit (`root`'s own only when `with_root`): `None` when the call is no longer in flight
    /// (`Inode`, `Overflow` or a change to its root ended it, or the generation moved since
    /// `gen`): nothing stored, the caller stops. Else whether every listing of the part was
    /// kept (none was dropped as stale: module docs).
    pub fn store_part(
        &mut self,
        gen: u64,
        token: u64,
        root: &[u8],
        dirs: Vec<SubtreeDir>,
        with_root: bool,
    ) -> Option<bool> {
        if gen != self.gen || !self.enabled() {
            return None;
        }
        let c = self.inflight.iter_mut().find(|c| c.token == token)?;
        let n = dirs.len();
        let mut fresh = Vec::with_capacity(n);
        for d in dirs {
            let key = join(root, &d.dir);
            let stale = c.stale.iter().any(|s| s.hits(&key, &d.entries));
            c.delivered.insert(key);
            if !stale {
                fresh.push(d);
            }
        }
        let dropped = (n - fresh.len()) as u64;
        self.waits.stored += fresh.len() as u64;
        self.waits.stale += dropped;
        self.put(root, fresh, with_root);
        Some(dropped == 0)
    }

    /// Names first: store the names-only listings of one part of streamed bulk call
    /// `token` (`Reply::Names`), as [`Prefetch::store_part`] stores full ones: `None` when
    /// the call is no longer in flight, else whether none was dropped as stale. A directory
    /// whose full listing is held already keeps that.
    pub fn store_names(
        &mut self,
        gen: u64,
        token: u64,
        root: &[u8],
        dirs: Vec<SubtreeDir>,
        with_root: bool,
    ) -> Option<bool> {
        if gen != self.gen || !self.enabled() {
            return None;
        }
        let c = self.inflight.iter_mut().find(|c| c.token == token)?;
        let mut fresh = Vec::with_capacity(dirs.len());
        let mut dropped = 0;
        for d in dirs {
            let key = join(root, &d.dir);
            if c.stale.iter().any(|s| s.hits(&key, &d.entries)) {
                dropped += 1;
                continue;
            }
            c.named.insert(key.clone());
            if with_root || !d.dir.is_empty() {
                fresh.push((key, d.entries));
            }
        }
        for (key, entries) in fresh {
            if self.listings.contains_key(&key) {
                continue;
            }
            let old = self.names.get(&key).map_or(0, Vec::len);
            if self.names_entries - old + entries.len() > self.max {
                break;
            }
            self.remove_names(&key);
            self.names_entries += entries.len();
            self.names.insert(key, entries);
        }
        self.waits.stale += dropped;
        Some(dropped == 0)
    }

    /// Whether the names of `dir` are held (names only).
    pub fn holds_names(&self, dir: &[u8]) -> bool {
        self.names.contains_key(dir)
    }

    /// The names-only listing of `dir`, handed over. It stays (for lookups of its
    /// subdirectories and missing names) until its full listing replaces it; that stays
    /// for the lookups of its files.
    pub fn take_names(&mut self, dir: &[u8]) -> Option<Vec<DirEntry>> {
        let l = self.names.get(dir)?.clone();
        self.hits += 1;
        if self.in_flight() {
            self.waits.early += 1;
        }
        Some(l)
    }

    /// A listing for a `readdir` without attributes: the full listing when it is held
    /// (handed over and kept, as names handed over are: for the lookups and the listing
    /// with attributes that follow), else the names-only one ([`Prefetch::take_names`]).
    /// Before, a full listing that came before such a `readdir` was taken away, and what
    /// followed it asked the server again, depending on which came first: a directory of
    /// subdirectories only (whose full listing the server answers from the statx its names
    /// made) cost one `Readdir` call in a later walk with attributes, and a lookup of a
    /// subdirectory one `Lookup` (tests/names_first.rs).
    pub fn take_plain(&mut self, dir: &[u8]) -> Option<Vec<DirEntry>> {
        let Some(l) = self.listings.get(dir) else {
            return self.take_names(dir);
        };
        let l = l.clone();
        self.hits += 1;
        if self.in_flight() {
            self.waits.early += 1;
        }
        Some(l)
    }

    fn put(&mut self, root: &[u8], dirs: Vec<SubtreeDir>, with_root: bool) {
        for d in dirs {
            let key = join(root, &d.dir);
            // The full listing replaces the names.
            self.remove_names(&key);
            if d.bare.len() == d.entries.len() {
                for (e, bare) in d.entries.iter().zip(&d.bare) {
                    let ino = e.attr.map_or(e.ino, |a| a.ino);
                    if *bare && !linked(e) && self.bare.len() < self.max {
                        self.bare.insert(join(&key, &e.name), ino);
                    }
                }
            }
            if d.dir.is_empty() && !with_root {
                continue;
            }
            let old = self.listings.get(&key).map_or(0, Vec::len);
            if self.entries - old + d.entries.len() > self.max {
                return;
            }
            self.remove(&key);
            self.entries += d.entries.len();
            for n in d.entries.iter().flat_map(inos) {
                *self.inos.entry(n).or_default() += 1;
            }
            if d.entries.iter().any(linked) {
                self.linked.insert(key.clone());
            }
            self.listings.insert(key, d.entries);
        }
    }

    /// [`Prefetch::is_bare`] without counting a hit (a search answered from the cache asks).
    pub fn knows_bare(&self, path: &[u8]) -> bool {
        self.bare.contains(path)
    }

    /// Whether `path` is known to have no extended attributes.
    pub fn is_bare(&mut self, path: &[u8]) -> bool {
        let b = self.bare.contains(path);
        if b {
            self.hits += 1;
        }
        b
    }

    /// A lookup in `dir` (not held) missed: whether an earlier one did too (then the caller
    /// fetches `dir` in bulk; it is forgotten here). Always false when prefetching is off.
    pub fn missed_again(&mut self, dir: &[u8]) -> bool {
        if !self.enabled() {
            return false;
        }
        if self.missed.remove(dir) {
            return true;
        }
        if self.missed.len() >= MAX_MISSED_DIRS {
            self.missed.clear();
        }
        self.missed.insert(dir.to_vec());
        false
    }

    /// `dir`'s listing was handed to the cache.
    pub fn mark_listed(&mut self, dir: &[u8]) {
        if self.listed.len() >= MAX_LISTED_DIRS {
            self.listed.clear();
        }
        self.listed.insert(dir.to_vec());
    }

    /// Whether `dir`'s listing was handed to the cache before (see `listed`).
    pub fn was_listed(&self, dir: &[u8]) -> bool {
        self.listed.contains(dir)
    }

    /// The cache forgets everything (`Overflow`, a new connection): every directory is new.
    pub fn forget_listed(&mut self) {
        self.listed.clear();
    }

    /// Whether the listing of `dir` is held.
    pub fn holds(&self, dir: &[u8]) -> bool {
        self.listings.contains_key(dir)
    }

    /// A bulk call for `root` with `budget` was cut short by it.
    pub fn mark_cut(&mut self, root: &[u8], budget: u64) {
        if let Some(c) = self.cut.iter_mut().find(|(r, _)| r == root) {
            c.1 = c.1.max(budget);
            return;
        }
        if self.cut.len() >= MAX_CUT_ROOTS {
            self.cut.remove(0);
        }
        self.cut.push((root.to_vec(), budget));
    }

    /// The nearest cut root at or above `dir` whose bulk call had a budget smaller than
    /// `budget`, forgotten (the caller fetches it again with `budget`).
    pub fn cut_root_for(&mut self, dir: &[u8], budget: u64) -> Option<Vec<u8>> {
        let i = (0..self.cut.len())
            .filter(|&i| self.cut[i].1 < budget && is_below(dir, &self.cut[i].0))
            .max_by_key(|&i| self.cut[i].0.len())?;
        Some(self.cut.remove(i).0)
    }

    /// A streamed bulk call for `root` starts: its token, or `None` when a mutation in flight
    /// makes all of it stale (no use asking before it is answered). The call starts with the
    /// stale items of the mutations in flight (module docs).
    pub fn begin(&mut self, root: &[u8]) -> Option<u64> {
        let stale: Vec<Stale> = self
            .mutations
            .iter()
            .flat_map(|(_, s)| s.iter().cloned())
            .collect();
        if stale.iter().any(|s| s.covers(root)) || stale.len() > MAX_STALE {
            return None;
        }
        let t = self.next_token;
        self.next_token += 1;
        self.waits.calls += 1;
        self.inflight.push(InFlight {
            token: t,
            root: root.to_vec(),
            call: None,
            hurried: BTreeSet::new(),
            delivered: BTreeSet::new(),
            named: BTreeSet::new(),
            hurried_full: BTreeSet::new(),
            stale,
        });
        Some(t)
    }

    /// Streamed bulk call `token` was sent as call `call`.
    pub fn sent(&mut self, token: u64, call: u64) {
        if let Some(c) = self.inflight.iter_mut().find(|c| c.token == token) {
            c.call = Some(call);
        }
    }

    /// The calls in flight that may bring `dir` and were not hurried for it yet, each with
    /// `dir` relative to its root (now counted as hurried).
    pub fn to_hurry(&mut self, dir: &[u8]) -> Vec<(u64, Vec<u8>)> {
        let mut out = Vec::new();
        for c in &mut self.inflight {
            let Some(call) = c.call else { continue };
            if !is_below(dir, &c.root)
                || c.hurried.len() >= MAX_HURRIED
                || c.stale.iter().any(|s| s.hides(dir))
            {
                continue;
            }
            let rel = if c.root.is_empty() {
                dir.to_vec()
            } else if dir.len() == c.root.len() {
                Vec::new()
            } else {
                dir[c.root.len() + 1..].to_vec()
            };
            // Its names came: the caller waits for the full listing (names first).
            let set = if c.named.contains(dir) {
                &mut c.hurried_full
            } else {
                &mut c.hurried
            };
            if set.len() < MAX_HURRIED && set.insert(rel.clone()) {
                out.push((call, rel));
            }
        }
        out
    }

    /// Streamed bulk call `token` is over.
    pub fn end(&mut self, token: u64) {
        self.inflight.retain(|c| c.token != token);
    }

    /// Whether a streamed bulk call is in flight.
    pub fn in_flight(&self) -> bool {
        !self.inflight.is_empty()
    }

    /// Whether a streamed bulk call in flight may still bring `dir`'s listing (it is not
    /// held, and no call that may bring it brought it already or would drop it as stale).
    pub fn coming(&self, dir: &[u8]) -> bool {
        !self.listings.contains_key(dir)
            && self.inflight.iter().any(|c| {
                is_below(dir, &c.root)
                    && !c.delivered.contains(dir)
                    && !c.stale.iter().any(|s| s.hides(dir))
            })
    }

    /// The listing of `dir`, handed over (once).
    pub fn take(&mut self, dir: &[u8]) -> Option<Vec<DirEntry>> {
        let l = self.remove(dir)?;
        self.hits += 1;
        if self.in_flight() {
            self.waits.early += 1;
        }
        Some(l)
    }

    /// `dir/name` from a held listing of `dir` (full, or names only): its attributes,
    /// NotFound if the complete listing lacks it, `None` when `dir` is not held (or the entry
    /// has no attributes: a file of a names-only listing).
    pub fn lookup(&mut self, dir: &[u8], name: &[u8]) -> Option<Result<Attr, Error>> {
        let l = self.listings.get(dir).or_else(|| self.names.get(dir))?;
        let r = match l.iter().find(|e| e.name == name) {
            Some(e) => Ok(e.attr?),
            None => Err(Error::NotFound),
        };
        self.hits += 1;
        Some(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dircache_core::FileType;

    fn e(name: &str) -> DirEntry {
        DirEntry {
            name: name.as_bytes().to_vec(),
            kind: FileType::Directory,
            ino: 1,
            attr: Some(Attr::default()),
        }
    }

    fn sd(dir: &str, names: &[&str]) -> SubtreeDir {
        SubtreeDir {
            dir: dir.as_bytes().to_vec(),
            entries: names.iter().map(|n| e(n)).collect(),
            bare: names.iter().map(|n| n.starts_with('a')).collect(),
        }
    }

    #[test]
    fn an_own_store_into_a_file_keeps_its_directory_attributes() {
        // The create's reply left `obj`'s attributes (features::PARENTS); the store of the
        // object's data (a call on its handle: what `RemoteFile::stale` gives) does not
        // change them. Before, it dropped them: one `Getattr` of the directory per object.
        let mut p = Prefetch::new(0);
        let dirs = vec![b"obj".to_vec()];
        let dir = Attr {
            ino: 5,
            mode: libc::S_IFDIR | 0o755,
            ..Attr::default()
        };
        let c = p.parents.begin(&dirs);
        p.parents
            .end(c, &dirs, Some(vec![(b"obj".to_vec(), dir)]), true);
        let mut store = stale_of(b"obj/f.o");
        store.extend([Stale::Linked, Stale::Ino(77)]);
        let m = p.mutation_begin(store);
        p.mutation_end(m);
        assert_eq!(p.parents.get(b"obj"), Some(dir));
        // A change of the directory itself still drops them: by path, by inode, and a
        // callback for an entry in it.
        for stale in [stale_of(b"obj"), vec![Stale::Ino(5)], stale_of(b"obj/g.o")] {
            let c = p.parents.begin(&dirs);
            p.parents
                .end(c, &dirs, Some(vec![(b"obj".to_vec(), dir)]), true);
            if stale == stale_of(b"obj/g.o") {
                p.touched(b"obj/g.o");
            } else {
                let m = p.mutation_begin(stale.clone());
                p.mutation_end(m);
            }
            assert_eq!(p.parents.get(b"obj"), None, "{stale:?}");
        }
    }

    /// One whole bulk reply for `root`, stored as a call's only part.
    fn store(p: &mut Prefetch, root: &[u8], dirs: Vec<SubtreeDir>, with_root: bool) {
        let g = p.generation();
        let t = p.begin(root).expect("not hidden");
        p.store_part(g, t, root, dirs, with_root);
        p.end(t);
    }

    fn filled() -> Prefetch {
        let mut p = Prefetch::new(100);
        store(
            &mut p,
            b"r",
            vec![
                sd("", &["a", "a!"]),
                sd("a", &["b", "x"]),
                sd("a/b", &["c"]),
                sd("a!", &["y"]),
            ],
            false,
        );
        p
    }

    #[test]
    fn callbacks_drop_the_parent_and_everything_below() {
        let mut p = filled();
        assert_eq!(p.len(), 3, "the root's own listing is the caller's");
        assert_eq!(p.entries(), 4);
        assert!(matches!(p.lookup(b"r/a", b"x"), Some(Ok(_))));
        assert!(matches!(
            p.lookup(b"r/a", b"zz"),
            Some(Err(Error::NotFound))
        ));
        assert!(p.lookup(b"r", b"a").is_none(), "not held");
        // Bareness of the root's entries is kept though its listing is the caller's.
        let mut q = filled();
        assert!(q.is_bare(b"r/a") && q.is_bare(b"r/a!") && !q.is_bare(b"r/a/x"));
        q.touched(b"r/a!");
        assert!(!q.is_bare(b"r/a!") && q.is_bare(b"r/a"));
        q.touched(b"r");
        assert!(!q.is_bare(b"r/a"));
        // A change to r/a/b/c drops r/a/b (its parent) and r/a (the parent's attributes).
        p.touched(b"r/a/b/c");
        assert!(p.lookup(b"r/a/b", b"c").is_none());
        assert!(p.lookup(b"r/a", b"x").is_none());
        assert!(p.lookup(b"r/a!", b"y").is_some());
        let mut p = filled();
        // A change to r/a/x drops r/a (its parent), not r/a/b.
        p.touched(b"r/a/x");
        assert!(p.lookup(b"r/a", b"x").is_none());
        assert!(p.lookup(b"r/a/b", b"c").is_some());
        // A change to r/a drops r/a/b below it, not the sibling r/a! (which sorts between).
        p.touched(b"r/a");
        assert!(p.lookup(b"r/a/b", b"c").is_none());
        assert!(p.lookup(b"r/a!", b"y").is_some());
        assert_eq!(p.entries(), 1);
        assert_eq!(p.take(b"r/a!").map(|l| l.len()), Some(1));
        assert!(p.take(b"r/a!").is_none(), "handed over once");
        assert_eq!(p.entries(), 0);
    }

    #[test]
    fn a_reply_older_than_a_clear_or_too_big_is_not_stored() {
        let mut p = Prefetch::new(100);
        let g = p.generation();
        let t = p.begin(b"").unwrap();
        p.clear();
        assert_eq!(p.store_part(g, t, b"", vec![sd("d", &["x"])], false), None);
        assert!(p.is_empty());
        let mut p = Prefetch::new(2);
        store(&mut p, b"", vec![sd("d", &["x", "y", "z"])], false);
        assert!(p.is_empty());
        store(&mut p, b"", vec![sd("d", &["x", "y"])], false);
        assert_eq!(p.entries(), 2);
        // The same listing again replaces it (no double count).
        store(&mut p, b"", vec![sd("d", &["x", "y"])], false);
        assert_eq!(p.entries(), 2);
        p.clear();
        assert!(p.is_empty() && p.entries() == 0);
    }

    #[test]
    fn misses_below_a_cut_root_refetch_the_root() {
        let mut p = Prefetch::new(100);
        p.mark_cut(b"a", 10);
        p.mark_cut(b"a/b", 10);
        p.mark_cut(b"", 10);
        assert_eq!(p.cut_root_for(b"a/b/c", 20).as_deref(), Some(&b"a/b"[..]));
        assert_eq!(p.cut_root_for(b"a/bc", 20).as_deref(), Some(&b"a"[..]));
        assert_eq!(
            p.cut_root_for(b"x", 10),
            None,
            "not again with the same budget"
        );
        assert_eq!(p.cut_root_for(b"x", 20).as_deref(), Some(&b""[..]));
        assert_eq!(p.cut_root_for(b"x", 40), None);
    }

    #[test]
    fn streamed_parts_are_kept_only_while_their_call_is_in_flight() {
        let mut p = Prefetch::new(100);
        let g = p.generation();
        let t = p.begin(b"r").unwrap();
        assert!(p.coming(b"r/a") && p.coming(b"r") && !p.coming(b"ra") && !p.coming(b"x"));
        assert_eq!(
            p.store_part(g, t, b"r", vec![sd("a", &["b"])], false),
            Some(true)
        );
        assert!(!p.coming(b"r/a"), "held now");
        assert!(p.lookup(b"r/a", b"b").is_some());
        // Handed over: not coming again (a second caller does not wait for the whole call).
        assert!(p.take(b"r/a").is_some());
        assert!(!p.coming(b"r/a") && !p.holds(b"r/a") && p.coming(b"r/b"));
        // A callback below the root does not end the call: what it touches is dropped when it
        // arrives, the rest is kept.
        p.touched(b"r/x/y");
        assert!(p.coming(b"r/z") && !p.coming(b"r/x") && !p.coming(b"r/x/y/w"));
        assert!(p.coming(b"r/x/yy"), "a sibling of the touched path");
        assert_eq!(
            p.store_part(
                g,
                t,
                b"r",
                vec![sd("z", &["b"]), sd("x", &["y"]), sd("x/y/w", &["q"])],
                false
            ),
            Some(false)
        );
        assert!(p.lookup(b"r/z", b"b").is_some());
        assert!(p.lookup(b"r/x", b"y").is_none() && !p.holds(b"r/x/y/w"));
        assert_eq!((p.waits.stored, p.waits.stale), (2, 2));
        // A change to the call's root (here its parent's entry for it) ends it.
        p.touched(b"r");
        assert!(!p.coming(b"r/q") && !p.in_flight());
        assert_eq!(p.store_part(g, t, b"r", vec![sd("q", &["b"])], false), None);
        let t2 = p.begin(b"").unwrap();
        p.end(t2);
        assert!(!p.coming(b"q"));
        let t3 = p.begin(b"").unwrap();
        p.clear();
        assert_eq!(
            p.store_part(p.generation(), t3, b"", vec![sd("q", &["b"])], false),
            None
        );
    }

    /// Mutations by this client: what they touch is dropped, held or in flight; a call that
    /// starts while one is in flight starts with its stale items; a directory renamed away
    /// takes its subtree; other links of an inode whose attributes move are dropped too.
    #[test]
    fn mutations_drop_what_they_touch_and_calls_started_meanwhile_inherit_it() {
        let mut p = filled();
        let g = p.generation();
        let t = p.begin(b"r").unwrap();
        // Rename of directory r/a to s/a: r/a's subtree, r (its parent), s, and the grandparent
        // (the root's listing) are stale.
        let mut stale = stale_of(b"r/a");
        stale.extend(stale_of(b"s/a"));
        let m = p.mutation_begin(stale);
        assert!(p.lookup(b"r/a", b"x").is_none() && p.lookup(b"r/a/b", b"c").is_none());
        assert!(p.lookup(b"r/a!", b"y").is_some(), "a sibling stays");
        assert!(!p.coming(b"r/a/b") && p.coming(b"r/q"));
        // Started while the rename is in flight: the server may read before it is applied.
        let g2 = p.generation();
        let t2 = p.begin(b"s").unwrap();
        assert!(!p.coming(b"s/a/k") && p.coming(b"s/other"));
        assert_eq!(
            p.store_part(
                g2,
                t2,
                b"s",
                vec![sd("a/k", &["z"]), sd("other", &["o"])],
                false
            ),
            Some(false)
        );
        assert!(!p.holds(b"s/a/k") && p.holds(b"s/other"));
        assert!(p.begin(b"r/a/b").is_none(), "all of it stale: not asked");
        p.mutation_end(m);
        assert_eq!(p.mutations_in_flight(), 0);
        // After the reply: a new call is read after the rename, and kept.
        let t3 = p.begin(b"s/a").unwrap();
        assert_eq!(
            p.store_part(g2, t3, b"s/a", vec![sd("b", &["c"])], false),
            Some(true)
        );
        assert!(p.holds(b"s/a/b"));
        // The first call still drops what the rename touched (read before it, maybe).
        assert_eq!(
            p.store_part(g, t, b"r", vec![sd("a/b", &["c"]), sd("n", &["m"])], false),
            Some(false)
        );
        assert!(!p.holds(b"r/a/b") && p.holds(b"r/n"));
        // An inode with two names: a mutation that moves its attributes drops both listings.
        let mut two = e("h");
        two.kind = FileType::Regular;
        two.attr = Some(Attr {
            nlink: 2,
            mode: libc::S_IFREG | 0o644,
            ..Attr::default()
        });
        let mut one = sd("l1", &[]);
        one.entries.push(two.clone());
        one.bare.push(true);
        let mut other = sd("l2", &["plain"]);
        other.entries.push(two);
        other.bare.push(true);
        store(&mut p, b"", vec![one, other, sd("l3", &["x"])], false);
        assert!(p.holds(b"l1") && p.holds(b"l2"));
        assert!(
            !p.is_bare(b"l1/h"),
            "never bare: another name may get attributes"
        );
        let mut unlink = stale_of(b"l1/h");
        unlink.push(Stale::Linked);
        let m = p.mutation_begin(unlink);
        assert!(!p.holds(b"l1") && !p.holds(b"l2") && p.holds(b"l3"));
        p.mutation_end(m);
        // An Inode callback, or a write through a handle of a known inode: listings naming it.
        let mut q = filled();
        q.touched_inode(1);
        assert!(
            q.is_empty() && q.entries() == 0,
            "every entry of filled() is inode 1"
        );
        let mut f = sd("l4", &[]);
        f.entries.push(DirEntry {
            name: b"w".to_vec(),
            kind: FileType::Regular,
            ino: 77,
            attr: Some(Attr {
                ino: 77,
                nlink: 1,
                ..Attr::default()
            }),
        });
        store(&mut p, b"", vec![f], false);
        let m = p.mutation_begin(vec![Stale::Ino(77)]);
        assert!(!p.holds(b"l4") && p.holds(b"l3"));
        p.mutation_end(m);
    }

    #[test]
    fn a_second_lookup_miss_in_a_directory_asks_for_it_in_bulk() {
        let mut p = Prefetch::new(100);
        assert!(!p.missed_again(b"a"));
        assert!(!p.missed_again(b"b"));
        assert!(p.missed_again(b"a"));
        assert!(!p.missed_again(b"a"), "forgotten once fetched");
        assert!(!Prefetch::new(0).missed_again(b"a") && !Prefetch::new(0).holds(b"a"));
    }

    #[test]
    fn budgets_double_up_to_the_size() {
        let mut p = Prefetch::new(5000);
        assert_eq!(p.next_budget(), 1024);
        assert_eq!(p.next_budget(), 2048);
        assert_eq!(p.next_budget(), 4096);
        assert_eq!(p.next_budget(), 5000);
        assert_eq!(p.next_budget(), 5000);
    }
}
