//! Every optimization of the cache is a switch here, so each can be measured on and off.

/// How `..` is resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DotDot {
    /// POSIX: `a/b/..` needs search permission on `a/b`, and `..` after a symlink goes to the
    /// parent of the link's target.
    #[default]
    Posix,
    /// Plan 9 lexical semantics: `a/b/..` is `a`, whatever `b` is.
    Lexical,
}

/// Cache configuration. `Config::default()` turns every optimization on.
#[derive(Debug, Clone)]
pub struct Config {
    /// The direct-lookup hash table and prefix-check cache (SOSP'15 §3.1). Off: every lookup
    /// walks component by component (the "slow path", still served from cached dentries).
    pub fastpath: bool,
    /// On a direct-lookup hit, compare the full path stored with the entry to the one asked
    /// for, so that a signature collision can never return a wrong entry.
    pub verify_path: bool,
    /// Directory completeness (§5.1): readdir from the cache, misses in complete directories
    /// answered without the backend.
    pub completeness: bool,
    /// Negative dentries (§5.2): remember names that do not exist.
    pub negatives: bool,
    /// Deep negatives: remember `a/b/c` missing when `a` is missing, and ENOTDIR under files.
    pub deep_negatives: bool,
    /// Symlink aliases (§4.2): publish paths that go through symbolic links in the
    /// direct-lookup table (`/X/L/Z`, with `/X/L -> Y`, as an entry for the dentry of
    /// `/X/Y/Z` that also checks the link), so they take the fast path. Off: such paths are
    /// always resolved by the slow path (a path ending in a symlink is still published for
    /// the link itself, as for `lstat`).
    pub symlink_aliases: bool,
    /// `..` semantics.
    pub dotdot: DotDot,
    /// Most dentries kept (positive and negative); eviction starts from the leaves above this.
    pub max_entries: usize,
    /// Most slots of each credential's prefix-check cache (8 bytes each, 2-way
    /// set-associative tables of 64, 128, ... slots, added as the credential uses them).
    pub pcc_slots: usize,
    /// Most bytes the prefix-check caches of all credentials hold together. Each starts
    /// without a table and grows with use (64 slots, then doubling, up to `pcc_slots`);
    /// credentials nobody holds are evicted to make room, and a credential whose table does
    /// not fit does without (its lookups take the slow path). Bounds what callers with many
    /// distinct credentials can make the cache allocate (pcc.rs).
    pub pcc_budget: usize,
    /// Linux's `fs.protected_hardlinks=1`: only the owner (or root) may hard-link a file that
    /// is not a plain regular file the caller can read and write.
    pub protected_hardlinks: bool,
    /// Batched walks (cache/batch.rs): when the slow path reaches a name that is not cached,
    /// the components after it that are known in advance go to one [`crate::Backend::walk`]
    /// (one round trip for a remote backend) instead of one `lookup` each.
    pub walk_batch: bool,
    /// Bypass mode (ByVFS; `cache/bypass.rs`): every lookup, getattr, readlink and readdir is
    /// answered by one backend call; the tree keeps dentries only as identities for front
    /// ends (held nodes, backend paths), never as answers. For memory-speed backends, where
    /// the bookkeeping costs more than the call it saves. Use [`Config::bypass_mode`], which also
    /// turns off what would cache answers (fast path, completeness, negatives, batches).
    pub bypass: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            fastpath: true,
            verify_path: false,
            completeness: true,
            negatives: true,
            deep_negatives: true,
            symlink_aliases: true,
            dotdot: DotDot::Posix,
            max_entries: 1 << 20,
            pcc_slots: 1 << 16,
            pcc_budget: 4 << 20,
            protected_hardlinks: true,
            walk_batch: true,
            bypass: false,
        }
    }
}

impl Config {
    /// Bypass mode: nothing cached is used as an answer (the `bypass` field).
    pub fn bypass_mode() -> Config {
        Config {
            bypass: true,
            ..Config::baseline()
        }
    }

    /// Every optimization off: a plain component-at-a-time cache of positive entries.
    pub fn baseline() -> Config {
        Config {
            fastpath: false,
            verify_path: false,
            completeness: false,
            negatives: false,
            deep_negatives: false,
            symlink_aliases: false,
            walk_batch: false,
            ..Config::default()
        }
    }
}
