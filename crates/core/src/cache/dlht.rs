//! Signatures and the direct-lookup hash table (DLHT), SOSP'15 §3.1.
//!
//! **Signatures.** A path is keyed by SipHash-1-3-128 under a random key per namespace, over
//! the path relative to the namespace root (leading slashes dropped; a relative path from a
//! [`super::DirHandle`] is hashed after the handle's lexical path and a `/`). Which bytes are
//! hashed depends on whether the path may hold `..` ([`super::path::has_dotdot`]):
//! - without `..`, the bytes **as given** ([`raw_key`]): `a//b/./c` is its own key, distinct
//!   from `a/b/c`, published by the slow path when it resolved exactly that string (no
//!   normalization on the hit path);
//! - with `..`, the lexical form ([`norm_lex`]: components joined by single `/`, no `.`,
//!   `..` resolved against the prefix), and the fast path resolves `prefix/..` only after
//!   confirming `prefix` (docs/core.md, "`..` and symlinks").
//!
//! SipHash is a keyed PRF: without the key, nobody can construct colliding paths. The hasher
//! is streaming, so the state after hashing a directory's path plus `/` can be stored in a
//! directory handle and resumed for relative lookups (§3.3).
//!
//! **DLHT entries are self-validating.** An entry records the version of its target dentry
//! and its parent (and of every symlink the path went through, [`Seen`]) when it was
//! inserted; it is valid only while all those versions are unchanged. Invalidation therefore
//! only bumps versions; dead entries are swept lazily (`Cache::sweep_dlht` in `evict.rs`).
//! The per-credential half of a fast-path hit is in `pcc.rs`.

use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use siphasher::sip128::{Hasher128, SipHasher13};

use super::path;
use super::{MountOptions, NodeRef};
use crate::cache::dentry::{DEAD, EVICTED};

pub(crate) type Sig = u128;

/// Marker byte hashed after a path to form the key of "this path with its final symlink
/// followed". NUL cannot occur in a path, so the key cannot collide with a real path's.
pub(crate) const FOLLOW_MARK: &[u8] = b"\0";

#[derive(Clone, Copy)]
pub(crate) struct SigKey(pub u64, pub u64);

impl SigKey {
    pub(crate) fn random() -> SigKey {
        let mut b = [0u8; 16];
        // A key that cannot be drawn falls back to a fixed one: signatures stay correct (the
        // table still verifies versions and the PCC), only collision resistance is weaker.
        if getrandom::getrandom(&mut b).is_err() {
            tracing::warn!("getrandom failed; using a fixed signature key");
            b = *b"dircache-sigkey!";
        }
        let k0 = u64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8]));
        let k1 = u64::from_le_bytes(b[8..].try_into().unwrap_or([0; 8]));
        SigKey(k0, k1)
    }
    #[inline]
    pub(crate) fn hasher(&self) -> SipHasher13 {
        SipHasher13::new_with_keys(self.0, self.1)
    }
}

#[inline]
pub(crate) fn finish(h: &SipHasher13) -> Sig {
    collide(h.finish128().as_u128())
}

#[inline]
fn collide(sig: Sig) -> Sig {
    #[cfg(test)]
    if COLLIDE.with(std::cell::Cell::get) {
        // 4 signatures in all; the PCC set index (high half) is the same for every one.
        return sig & 3;
    }
    sig
}

#[cfg(test)]
thread_local! {
    static COLLIDE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Tests: make every signature this thread computes collide with many others, until the
/// returned guard is dropped (`collision_tests.rs`).
#[cfg(test)]
pub(crate) fn force_collisions() -> impl Drop {
    struct Off;
    impl Drop for Off {
        fn drop(&mut self) {
            COLLIDE.with(|c| c.set(false));
        }
    }
    COLLIDE.with(|c| c.set(true));
    Off
}

/// Signature of `path` hashed after `h`: the same value as `write(path)` then [`finish`],
/// computed in one pass (no tail buffering, no copy of the state when `h` ends on a word).
#[inline]
pub(crate) fn sig_of(h: &SipHasher13, path: &[u8]) -> Sig {
    collide(h.hash(path).as_u128())
}

/// A dentry as a walk saw it: its version and its parent's. Invalidations bump the versions
/// of the changed dentry and of every *interior* dentry below it (directories and entries with
/// cached children) but not of leaves, so a leaf is only current while its parent's version
/// is unchanged too (docs/core.md, I1).
#[derive(Clone)]
pub(crate) struct Seen {
    pub(crate) node: NodeRef,
    pub(crate) ver: u64,
    pub(crate) up: Option<(NodeRef, u64)>,
}

impl Seen {
    /// The dentry's versions now (slow path: upgrades the parent link).
    pub(crate) fn now(node: &NodeRef) -> Seen {
        let up = node.parent_ref().map(|p| {
            let v = p.version.load(Ordering::Acquire);
            (p, v)
        });
        Seen {
            node: node.clone(),
            ver: node.version.load(Ordering::Acquire),
            up,
        }
    }

    #[inline]
    pub(crate) fn valid(&self) -> bool {
        self.node.version.load(Ordering::Acquire) == self.ver
            && self.node.flags.load(Ordering::Acquire) & (DEAD | EVICTED) == 0
            && self
                .up
                .as_ref()
                .is_none_or(|(p, v)| p.version.load(Ordering::Acquire) == *v)
    }

    pub(crate) fn same(&self, o: &Seen) -> bool {
        let up = match (&self.up, &o.up) {
            (None, None) => true,
            (Some((a, x)), Some((b, y))) => Arc::ptr_eq(a, b) && x == y,
            _ => false,
        };
        Arc::ptr_eq(&self.node, &o.node) && self.ver == o.ver && up
    }
}

/// One DLHT entry (24 bytes; papaya boxes it with its 16-byte key: 40 bytes in all).
///
/// **Validity by bound.** The entry keeps no versions: `stamp` is a value of the cache's `seq`
/// taken before the publishing walk's last check that no invalidation window had opened
/// (`publish`), and the entry is valid while its dentry and the dentry's parent both have
/// versions *below* it. Every version store takes a fresh value from `seq` (creations,
/// `bump_subtree`, eviction, revival), so a store ordered after that reservation is
/// `>= stamp`: any bump of the node or its parent after publication (a window opening after
/// the check, I4) makes the entry invalid at once, as a changed recorded version did. A bump
/// ordered before the reservation either lies inside a window the walk overlapped (it then
/// publishes nothing) or was seen by the walk's own `Seen::valid` re-check at publication.
/// The stamp doubles as the entry's unique id for the PCC (values of `seq` are never reused).
/// (It was 48 bytes: node and parent versions were kept next to a separate stamp; then 32,
/// with a pointer to the uncommon parts, which now live in [`Dlht::extras`].)
///
/// **Stamp parity.** A walk reserves two values of `seq` per entry, the first even: an entry
/// without uncommon parts has the even one as its stamp, an entry with them the odd one (its
/// [`EntryExtra`] is filed under that stamp in [`Dlht::extras`]). Neither value is ever a
/// version, so `version < even + 1` holds exactly when `version < even`: the bound is the same.
pub(crate) struct FastEntry {
    pub(crate) node: NodeRef,
    /// The parent as the walk saw it (leaves are not bumped when their parent is: I1).
    pub(crate) up: Option<NodeRef>,
    /// Unique id of this entry (PCC slots name the entry they confirm) and validity bound;
    /// odd if the entry has an [`EntryExtra`].
    pub(crate) stamp: u64,
}

/// The uncommon parts of a DLHT entry (symlinks on the path, a mount's options, the path).
pub(crate) struct EntryExtra {
    /// Symlinks the path went through, as the walk saw them.
    pub(crate) deps: Box<[Seen]>,
    /// Options of the mount the entry lies in, when not the defaults.
    pub(crate) mount: MountOptions,
    /// The path key that was hashed (`raw_key` or `norm_lex`), kept only when
    /// `Config::verify_path` is on.
    pub(crate) path: Option<Box<[u8]>>,
}

impl FastEntry {
    /// Whether the entry has an [`EntryExtra`] (filed under its stamp).
    #[inline]
    pub(crate) fn has_extra(&self) -> bool {
        self.stamp & 1 == 1
    }

    /// Valid, given its uncommon parts `x` (`None` for an entry without any).
    #[inline]
    pub(crate) fn valid(&self, x: Option<&EntryExtra>) -> bool {
        self.node.version.load(Ordering::Acquire) < self.stamp
            && self.node.flags.load(Ordering::Acquire) & (DEAD | EVICTED) == 0
            && self
                .up
                .as_ref()
                .is_none_or(|p| p.version.load(Ordering::Acquire) < self.stamp)
            && x.is_none_or(|x| x.deps.iter().all(Seen::valid))
    }

    /// Whether this entry names the dentry (and parent) `seen` names.
    pub(crate) fn same_target(&self, seen: &Seen) -> bool {
        let up = match (&self.up, &seen.up) {
            (None, None) => true,
            (Some(a), Some((b, _))) => Arc::ptr_eq(a, b),
            _ => false,
        };
        Arc::ptr_eq(&self.node, &seen.node) && up
    }
}

/// Signatures are already uniformly random: hash tables index by their low bits as they are.
#[derive(Default)]
pub(crate) struct SigHasher(u64);

impl Hasher for SigHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u128(&mut self, v: u128) {
        self.0 = v as u64;
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// A signature as the DLHT's key: two words (8-aligned, where a `u128` is 16-aligned and
/// would pad a 24-byte entry's box to 48), hashed by its low word.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Key(u64, u64);

impl std::hash::Hash for Key {
    fn hash<H: Hasher>(&self, h: &mut H) {
        h.write_u64(self.0);
    }
}

#[inline]
fn key(sig: Sig) -> Key {
    Key(sig as u64, (sig >> 64) as u64)
}

type Map<K, V> = papaya::HashMap<K, V, BuildHasherDefault<SigHasher>>;

/// The direct-lookup table: entries by signature, and the uncommon parts of the few entries
/// that have any, by stamp. An entry's parts are filed before the entry and dropped by
/// whoever takes the entry out (replacement, retraction, sweep), so a reader that finds an
/// odd-stamped entry but not its parts treats the entry as invalid (it was just taken out).
pub(crate) struct Dlht {
    map: Map<Key, FastEntry>,
    extras: Map<u64, EntryExtra>,
}

impl Dlht {
    pub(crate) fn new() -> Dlht {
        Dlht {
            map: papaya::HashMap::builder()
                .hasher(BuildHasherDefault::default())
                .build(),
            extras: papaya::HashMap::builder()
                .hasher(BuildHasherDefault::default())
                .build(),
        }
    }

    #[inline]
    pub(crate) fn guard(&self) -> impl papaya::Guard + '_ {
        self.map.guard()
    }

    #[inline]
    pub(crate) fn get<'g>(&self, sig: Sig, guard: &'g impl papaya::Guard) -> Option<&'g FastEntry> {
        self.map.get(&key(sig), guard)
    }

    /// `f` of `e`'s uncommon parts (`None` if it has none), or `None` if they are gone.
    #[inline]
    pub(crate) fn with_extra<R>(
        &self,
        e: &FastEntry,
        f: impl FnOnce(Option<&EntryExtra>) -> R,
    ) -> Option<R> {
        if !e.has_extra() {
            return Some(f(None));
        }
        let x = self.extras.pin();
        x.get(&e.stamp).map(|x| f(Some(x)))
    }

    /// Whether `e` is valid (its uncommon parts included).
    #[inline]
    pub(crate) fn valid(&self, e: &FastEntry) -> bool {
        self.with_extra(e, |x| e.valid(x)).unwrap_or(false)
    }

    /// File `e` under `sig` (its stamp odd exactly when `x` is given), replacing any entry.
    pub(crate) fn insert(&self, sig: Sig, e: FastEntry, x: Option<EntryExtra>) {
        debug_assert_eq!(e.has_extra(), x.is_some());
        if let Some(x) = x {
            self.extras.pin().insert(e.stamp, x);
        }
        let guard = self.map.guard();
        if let Some(old) = self.map.insert(key(sig), e, &guard) {
            if old.has_extra() {
                self.extras.pin().remove(&old.stamp);
            }
        }
    }

    /// Take out the entry under `sig` if it is the one with `stamp`.
    pub(crate) fn remove(&self, sig: Sig, stamp: u64) {
        let guard = self.map.guard();
        let _ = self
            .map
            .remove_if(&key(sig), |_, e| e.stamp == stamp, &guard);
        // Ours is out of the map either way (replaced, or taken out here): its parts go too.
        if stamp & 1 == 1 {
            self.extras.pin().remove(&stamp);
        }
    }

    /// Take out every entry that can no longer be valid.
    pub(crate) fn sweep(&self) {
        let mut gone = Vec::new();
        let guard = self.map.guard();
        self.map.retain(
            |_, e| {
                let keep = self.valid(e);
                if !keep && e.has_extra() {
                    gone.push(e.stamp);
                }
                keep
            },
            &guard,
        );
        let x = self.extras.pin();
        for s in gone {
            x.remove(&s);
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Tests: (entries with an odd stamp, their parts filed, parts without an entry).
    #[cfg(test)]
    pub(crate) fn extra_counts(&self) -> (usize, usize, usize) {
        let m = self.map.pin();
        let odd: std::collections::HashSet<u64> = m
            .values()
            .filter(|e| e.has_extra())
            .map(|e| e.stamp)
            .collect();
        let x = self.extras.pin();
        let orphans = x.keys().filter(|s| !odd.contains(s)).count();
        (odd.len(), x.len(), orphans)
    }

    /// Tests: lose every entry's uncommon parts (as a reader racing their removal would).
    #[cfg(test)]
    pub(crate) fn drop_extras(&self) {
        self.extras.pin().clear();
    }
}

/// The fast path's key for a path without `..`: its bytes as given, after the handle's
/// lexical path (or alone for an absolute path, leading slashes dropped).
pub(crate) fn raw_key(lex: &[u8], path: &[u8]) -> Vec<u8> {
    if path.first() == Some(&b'/') {
        let i = path.iter().position(|&b| b != b'/').unwrap_or(path.len());
        return path[i..].to_vec();
    }
    let mut out = Vec::with_capacity(lex.len() + 1 + path.len());
    out.extend_from_slice(lex);
    if !lex.is_empty() {
        out.push(b'/');
    }
    out.extend_from_slice(path);
    out
}

/// `lex` joined with the lexical form of `path` (no `.`, no empty components; `..` kept).
pub(crate) fn norm_lex(lex: &[u8], path: &[u8]) -> Vec<u8> {
    let abs = path.first() == Some(&b'/');
    let mut out: Vec<u8> = if abs { Vec::new() } else { lex.to_vec() };
    for c in path::components(path) {
        match c {
            b"." => {}
            b".." => match out.iter().rposition(|&b| b == b'/') {
                Some(i) => out.truncate(i),
                None => out.clear(),
            },
            c => {
                if !out.is_empty() {
                    out.push(b'/');
                }
                out.extend_from_slice(c);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streaming_hash_resumes_from_a_prefix() {
        let k = SigKey::random();
        let whole = sig_of(&k.hasher(), b"usr/include/linux/fs.h");
        let mut h = k.hasher();
        h.write(b"usr/include/");
        assert_eq!(sig_of(&h, b"linux/fs.h"), whole);
        assert_ne!(sig_of(&k.hasher(), b"usr/include/linux/fs.g"), whole);
    }

    #[test]
    fn one_shot_and_streaming_signatures_agree() {
        let k = SigKey::random();
        for prefix in [&b""[..], b"a", b"usr/include/", b"0123456"] {
            let mut h = k.hasher();
            h.write(prefix);
            for len in 0..40 {
                let p: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
                let mut s = h;
                s.write(&p);
                assert_eq!(sig_of(&h, &p), finish(&s), "prefix {prefix:?}, len {len}");
            }
        }
    }

    #[test]
    fn keys_differ_per_instance() {
        let (a, b) = (SigKey::random(), SigKey::random());
        assert_ne!(sig_of(&a.hasher(), b"x"), sig_of(&b.hasher(), b"x"));
    }
}
