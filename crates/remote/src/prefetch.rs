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
//! mutation this client made; it is dropped before any later callback touching it reaches the
//! cache. How:
//! - Only with the `CALLBACKS` feature (without callbacks nothing could keep it current).
//! - The reader thread applies each callback here first, synchronously, before queueing it
//!   for the cache: `Entry`/`Attr` of `p` drop the listings of `p`'s parent (which names `p`)
//!   and grandparent (which holds the parent's attributes, moved by an entry change) and every
//!   listing at or below `p`; `Inode` and `Overflow` drop everything.
//! - Every callback and every mutation this client sends (at its start and again at its end)
//!   bumps a generation; a bulk reply is kept only if the generation did not move between
//!   sending the call and storing the reply (a change racing the server's walk could otherwise
//!   be reported before the stale listing arrives). Mutations also drop everything.
//! - Bounded: at most `max` entries in all; a reply that does not fit is dropped.

use std::collections::{BTreeMap, BTreeSet};

use dircache_core::{Attr, DirEntry, Error};

use crate::proto::SubtreeDir;

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
    /// (crate::client::bulk). Any callback or mutation ends them all (their later frames are
    /// not stored: the generation moved).
    inflight: Vec<InFlight>,
    next_token: u64,
    /// How callers waited for listings of calls in flight (statistics, tests).
    pub waits: WaitStats,
    /// Paths known to have no extended attributes (from bulk replies; at most `max`), under
    /// the same invariant as the listings.
    bare: BTreeSet<Vec<u8>>,
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
            bare: BTreeSet::new(),
            missed: BTreeSet::new(),
            listed: BTreeSet::new(),
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

    /// Forget everything (a mutation by this client, `Overflow`, `Inode`).
    pub fn clear(&mut self) {
        self.gen += 1;
        self.inflight.clear();
        self.listings.clear();
        self.entries = 0;
        self.bare.clear();
    }

    /// A callback touching `path`: drop its parent's and grandparent's listings and everything
    /// at or below it.
    pub fn touched(&mut self, path: &[u8]) {
        self.gen += 1;
        self.inflight.clear();
        // The parent's listing names `path`; the grandparent's holds the parent's own
        // attributes (mtime, ctime, link count), which an entry change moves too.
        let par = parent(path);
        self.remove(par);
        if !par.is_empty() {
            self.remove(parent(par));
        }
        if path.is_empty() {
            self.listings.clear();
            self.entries = 0;
            self.bare.clear();
            return;
        }
        self.remove(path);
        self.bare.remove(path);
        let mut lo = path.to_vec();
        lo.push(b'/');
        let mut hi = path.to_vec();
        hi.push(b'/' + 1);
        let bare_below: Vec<Vec<u8>> = self.bare.range(lo.clone()..hi.clone()).cloned().collect();
        for k in bare_below {
            self.bare.remove(&k);
        }
        let below: Vec<Vec<u8>> = self
            .listings
            .range(lo..hi)
            .map(|(k, _)| k.clone())
            .collect();
        for k in below {
            self.remove(&k);
        }
    }

    fn remove(&mut self, dir: &[u8]) -> Option<Vec<DirEntry>> {
        let l = self.listings.remove(dir)?;
        self.entries -= l.len();
        Some(l)
    }

    /// Store the listings of a bulk reply for `root` if nothing moved since generation `gen`,
    /// as many whole listings as fit; `root`'s own only when `with_root`.
    pub fn store(&mut self, gen: u64, root: &[u8], dirs: Vec<SubtreeDir>, with_root: bool) {
        if gen != self.gen || !self.enabled() {
            return;
        }
        self.put(root, dirs, with_root);
    }

    /// [`Prefetch::store`] for one part of streamed bulk call `token` (whole listings only):
    /// false when the call is no longer in flight (a callback or mutation ended it, or the
    /// generation moved since `gen`): nothing stored, the caller stops.
    pub fn store_part(
        &mut self,
        gen: u64,
        token: u64,
        root: &[u8],
        dirs: Vec<SubtreeDir>,
        with_root: bool,
    ) -> bool {
        if gen != self.gen || !self.enabled() || !self.inflight.iter().any(|c| c.token == token) {
            return false;
        }
        self.waits.stored += dirs.len() as u64;
        if let Some(c) = self.inflight.iter_mut().find(|c| c.token == token) {
            c.delivered.extend(dirs.iter().map(|d| join(root, &d.dir)));
        }
        self.put(root, dirs, with_root);
        true
    }

    fn put(&mut self, root: &[u8], dirs: Vec<SubtreeDir>, with_root: bool) {
        for d in dirs {
            let key = join(root, &d.dir);
            if d.bare.len() == d.entries.len() {
                for (e, bare) in d.entries.iter().zip(&d.bare) {
                    if *bare && self.bare.len() < self.max {
                        self.bare.insert(join(&key, &e.name));
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
            self.entries = self.entries - old + d.entries.len();
            self.listings.insert(key, d.entries);
        }
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

    /// A streamed bulk call for `root` starts: its token.
    pub fn begin(&mut self, root: &[u8]) -> u64 {
        let t = self.next_token;
        self.next_token += 1;
        self.inflight.push(InFlight {
            token: t,
            root: root.to_vec(),
            call: None,
            hurried: BTreeSet::new(),
            delivered: BTreeSet::new(),
        });
        t
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
            if !is_below(dir, &c.root) || c.hurried.len() >= MAX_HURRIED {
                continue;
            }
            let rel = if c.root.is_empty() {
                dir.to_vec()
            } else if dir.len() == c.root.len() {
                Vec::new()
            } else {
                dir[c.root.len() + 1..].to_vec()
            };
            if c.hurried.insert(rel.clone()) {
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
    /// held, and no call that may bring it brought it already).
    pub fn coming(&self, dir: &[u8]) -> bool {
        !self.listings.contains_key(dir)
            && self
                .inflight
                .iter()
                .any(|c| is_below(dir, &c.root) && !c.delivered.contains(dir))
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

    /// `dir/name` from a held listing of `dir`: its attributes, NotFound if the complete
    /// listing lacks it, `None` when `dir` is not held (or the entry has no attributes).
    pub fn lookup(&mut self, dir: &[u8], name: &[u8]) -> Option<Result<Attr, Error>> {
        let l = self.listings.get(dir)?;
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

    fn filled() -> Prefetch {
        let mut p = Prefetch::new(100);
        let g = p.generation();
        p.store(
            g,
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
    fn a_reply_older_than_a_callback_or_too_big_is_not_stored() {
        let mut p = Prefetch::new(100);
        let g = p.generation();
        p.touched(b"somewhere/else");
        p.store(g, b"", vec![sd("d", &["x"])], false);
        assert!(p.is_empty());
        let mut p = Prefetch::new(2);
        let g = p.generation();
        p.store(g, b"", vec![sd("d", &["x", "y", "z"])], false);
        assert!(p.is_empty());
        p.store(g, b"", vec![sd("d", &["x", "y"])], false);
        assert_eq!(p.entries(), 2);
        // The same listing again replaces it (no double count).
        p.store(g, b"", vec![sd("d", &["x", "y"])], false);
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
        let t = p.begin(b"r");
        assert!(p.coming(b"r/a") && p.coming(b"r") && !p.coming(b"ra") && !p.coming(b"x"));
        assert!(p.store_part(g, t, b"r", vec![sd("a", &["b"])], false));
        assert!(!p.coming(b"r/a"), "held now");
        assert!(p.lookup(b"r/a", b"b").is_some());
        // Handed over: not coming again (a second caller does not wait for the whole call).
        assert!(p.take(b"r/a").is_some());
        assert!(!p.coming(b"r/a") && !p.holds(b"r/a") && p.coming(b"r/b"));
        // A callback ends every call in flight: later parts are not kept, nobody waits.
        p.touched(b"r/x/y");
        assert!(!p.coming(b"r/z"));
        let g2 = p.generation();
        assert!(!p.store_part(g2, t, b"r", vec![sd("z", &["b"])], false));
        assert!(p.lookup(b"r/z", b"b").is_none());
        let t2 = p.begin(b"");
        p.end(t2);
        assert!(!p.coming(b"q"));
        let t3 = p.begin(b"");
        p.clear();
        assert!(!p.store_part(p.generation(), t3, b"", vec![sd("q", &["b"])], false));
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
