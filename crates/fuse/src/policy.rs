//! The kernel cache policy: every choice about what the kernel's FUSE caches (the Coda
//! "MiniCache") may keep, in one place.
//!
//! The daemon invalidates explicitly (a dedicated notifier thread pushes `inval_entry` and
//! `inval_inode` for every change the core cache learns about), so the kernel is given long
//! timeouts: with TTL 0 a stat of a 3-component path costs 7 round trips (~80 us), with long
//! TTLs it costs ~2-3 us and no request at all (DESIGN.md §3).

use std::time::Duration;

/// One day: the default for every kernel timeout (entries, attributes, negative entries).
pub const LONG_TTL: Duration = Duration::from_secs(24 * 3600);

/// What the kernel may cache, and how requests are answered. `CachePolicy::default()` is the
/// fast configuration; [`CachePolicy::uncached`] turns every kernel cache off for comparisons.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachePolicy {
    /// How long the kernel may keep a name -> inode translation (LOOKUP replies).
    pub entry_ttl: Duration,
    /// How long the kernel may keep attributes (GETATTR / LOOKUP replies).
    pub attr_ttl: Duration,
    /// How long the kernel may keep a negative entry ("no such name"); replies with nodeid 0.
    /// Zero answers ENOENT without a kernel negative entry.
    pub negative_ttl: Duration,
    /// Ask for READDIRPLUS always (FUSE_DO_READDIRPLUS without READDIRPLUS_AUTO): a listing
    /// brings the attributes of every entry, so `ls -l`, `find` and `du` need no LOOKUP.
    /// Entries the kernel already holds go out with nodeid 0 (`fs/dirs.rs`): a full entry
    /// for a known inode makes the kernel forget its cached ACLs.
    pub readdirplus: bool,
    /// Lean READDIRPLUS (`lean.rs`): a first listing reads only the directory (getdents) and
    /// sends entries of non-directories without attributes (nodeid 0: the kernel shows the
    /// name, inode number and type and instantiates nothing), so a cold `find -name` makes no
    /// statx per file; directories and entries whose attributes the cache holds go out full.
    /// Switches to full entries for a while when names sent lean are looked up (`ls -l`, `du`).
    pub lean: bool,
    /// With `lean`: files go out lean also when the cache holds their attributes (set for
    /// remote mounts, whose core has every entry's attributes from bulk listings: without
    /// it a cold `find` made the kernel instantiate every file of the tree; a LOOKUP of a
    /// lean entry is answered from the cache, with no round trip).
    pub lean_cached: bool,
    /// Directory listings cached in the kernel's page cache (FOPEN_CACHE_DIR + FOPEN_KEEP_CACHE)
    /// and revalidated only through explicit `inval_inode` (the kernel resets a cached
    /// listing when the directory's mtime it holds changes, or drops its pages under memory
    /// pressure; it is then read again with one READDIRPLUS per chunk).
    pub cache_dir: bool,
    /// Answer OPENDIR with ENOSYS once (FUSE_NO_OPENDIR_SUPPORT): the kernel then opens every
    /// directory itself with CACHE_DIR|KEEP_CACHE and never sends OPENDIR/RELEASEDIR again,
    /// saving two round trips per directory a program opens.
    pub no_opendir: bool,
    /// Keep file data in the page cache across opens (FOPEN_KEEP_CACHE); external writes are
    /// reported by the change feed and invalidate the data with `inval_inode`.
    pub keep_cache: bool,
    /// FUSE passthrough (kernel 6.9+, daemon needs CAP_SYS_ADMIN): reads and writes go straight
    /// to the real file, as Coda's MiniCache redirected `rdwr` to the container file.
    /// Warm cost: every passthrough read marks the kernel's atime stale
    /// (`fuse_invalidate_atime`), so the next `stat` of a file that was read sends a GETATTR;
    /// page-cache hits send nothing, hence `cached_reads_max` for small files.
    pub passthrough: bool,
    /// With passthrough: read-only opens of regular files of at most this many bytes are
    /// served from the kernel's page cache (FOPEN_KEEP_CACHE: the first read is one READ to
    /// the daemon, later ones page-cache hits) instead of passthrough. Every passthrough read
    /// marks the kernel's atime stale, so the next `stat` of a file read (git status, make,
    /// Python imports) was a GETATTR; a page-cache hit touches nothing. An inode is open in
    /// one of the two modes at a time (`fs/handles.rs`, `IoModes`). 0: every open passthrough.
    pub cached_reads_max: u64,
    /// `-o open=noopen`: answer the first OPEN with ENOSYS (FUSE_NO_OPEN_SUPPORT), so the
    /// kernel opens files itself and never sends OPEN or RELEASE again: an open and close
    /// cost no request. No passthrough; each data request opens the file for itself
    /// (`fs/noopen.rs`, docs/opens.md). Off (`open=rpc`): OPEN and RELEASE reach the daemon,
    /// which opens as the caller, with passthrough.
    pub no_open: bool,
    /// FUSE_PARALLEL_DIROPS: lookups and readdirs in one directory run concurrently.
    pub parallel_dirops: bool,
    /// FUSE_CACHE_SYMLINKS: the kernel keeps symlink targets in its page cache.
    pub cache_symlinks: bool,
    /// FUSE_POSIX_ACL: the kernel asks for `system.posix_acl_*` once per inode and caches the
    /// answer (until `inval_inode`, a GETATTR it sends, or a full READDIRPLUS entry for the
    /// inode, which dircache avoids). `ls -l` asks for `system.posix_acl_access` of every file;
    /// without this each of those is a round trip that the kernel never caches.
    pub posix_acl: bool,
    /// Pass `security.*` extended attributes through. Off: getxattr/listxattr of `security.*`
    /// answer EOPNOTSUPP, which makes `ls -l` (coreutils' `getfilecon_cache`) stop asking for
    /// `security.selinux` after the first file of the device instead of one round trip per
    /// file. The kernel never caches those answers (DESIGN.md §3).
    pub security_xattrs: bool,
    /// Request threads (fuser `n_threads`, each with its own cloned /dev/fuse descriptor).
    pub threads: usize,
    /// Background threads that list the subdirectories of a directory a walker just listed,
    /// one level ahead of it (`prefetch.rs`); 0 turns prefetching off.
    pub prefetch_threads: usize,
    /// List a small directory on the second LOOKUP of a name it does not hold (`lookahead.rs`):
    /// the siblings that follow (`git status` lstat-ing every tracked file) are answered from
    /// the listing and the directory becomes complete (misses and its READDIRPLUS are free).
    /// On by default (`-o nolookahead` turns it off). It was off for a while: a tree replaced
    /// in SRC while walked gave ELOOP in 3 of 22 runs of `replaced_trees.rs`, a directory
    /// listed before the replacement given the nodeid of an ancestor that had its inode
    /// number since (fixed in `inodes.rs`: a directory has one name).
    pub lookahead: bool,
    /// With `lookahead`: levels of subdirectories listed and read through the mount ahead of
    /// a program looking names up one by one, below a directory listed on its lookups
    /// (`Prefetcher::ahead_of_lookups`; `-o ahead=N`, 0 = none). Off (0) by default: with 1
    /// or 2, a cold `git status` of the benchmark tree sent 1.6-2.4k fewer LOOKUPs but took
    /// longer (0.67 / 0.72 s against 0.50 s, 5 interleaved runs; docs/benchmarks.md): the
    /// listings and reads ahead cost more CPU than the round trips they save on 2 cores.
    pub lookahead_levels: u8,
    /// With `lookahead`: threads reading directories through the mount at once
    /// (`Prefetcher::read_through_kernel`, `-o kreaders=N`); 0: no directory is read through
    /// the mount (the program's lookups then reach the daemon one by one).
    pub kernel_readers: usize,
    /// Descriptors of open files one uid may make the daemon hold (opens of the same file
    /// with the same access by the same caller share one). 0: half of what the process limit
    /// leaves after a reserve for the daemon itself. Past it the caller gets EMFILE.
    pub max_open_per_user: usize,
    /// Bypass mode (`-o bypass`, ByVFS): the core cache answers nothing from what it holds
    /// (it must be built with `dircache_core::Config::bypass_mode()`), so each request is one
    /// backend call; see [`CachePolicy::bypassing`] for what the kernel may keep.
    pub bypass: bool,
    /// Serve requests over FUSE over io_uring (vendored fuser's `src/uring.rs`) when the kernel
    /// offers it (`/sys/module/fuse/parameters/enable_uring` = Y); otherwise (or with
    /// `-o noio_uring`) over `/dev/fuse`. On by default: each CPU's queue has a spare server
    /// that takes over while a request blocks in the backend (docs/opens.md).
    pub io_uring: bool,
    /// Leader/follower reading of `/dev/fuse` (`-o readers=leader`, vendored fuser's
    /// `src/lf.rs`): one request thread reads at a time and serves requests answered without
    /// blocking itself; before one that may block it hands reading to another. Off by default
    /// (`readers=all`: every thread reads, and the kernel wakes the one that waited longest):
    /// on the loaded 2-vCPU test machine one hot reader lost (docs/opens.md, issue 9).
    pub leader_follower: bool,
    /// Microseconds the reading thread polls for the next request after a reply while
    /// requests come back to back (`-o spin=US`, with `readers=leader`); 0: never.
    pub spin_us: u32,
    /// With `leader_follower`: hand reading on before a call that may block only if a
    /// request is waiting right then (`-o readers=lazy`; vendored fuser's `LfConfig::lazy`).
    pub lazy_handoff: bool,
    /// Scheduling of the request threads (`-o sched=other|nice:N|fifo:N`; crate::sched).
    /// Unchanged by default: docs/opens.md, "Request threads' priority".
    pub request_sched: crate::sched::RequestSched,
}

impl Default for CachePolicy {
    fn default() -> Self {
        CachePolicy {
            entry_ttl: LONG_TTL,
            attr_ttl: LONG_TTL,
            negative_ttl: LONG_TTL,
            readdirplus: true,
            lean: true,
            lean_cached: false,
            cache_dir: true,
            no_opendir: true,
            keep_cache: true,
            passthrough: true,
            cached_reads_max: 1 << 20,
            no_open: false,
            parallel_dirops: true,
            cache_symlinks: true,
            posix_acl: true,
            security_xattrs: false,
            threads: 4,
            prefetch_threads: 2,
            lookahead: true,
            lookahead_levels: 0,
            kernel_readers: crate::prefetch::KERNEL_READERS,
            max_open_per_user: 0,
            bypass: false,
            io_uring: true,
            leader_follower: false,
            spin_us: 0,
            lazy_handoff: false,
            request_sched: crate::sched::RequestSched::Inherit,
        }
    }
}

impl CachePolicy {
    /// This policy in bypass mode: no metadata cached between the caller and the backend.
    /// Kernel TTLs 0 and no kernel negative entries (each access is a LOOKUP or GETATTR the
    /// backend answers: an outside change is seen by the next access, without waiting for the
    /// change feed), plain READDIR (with TTL 0 the entries READDIRPLUS brings are looked up
    /// again anyway, so it would cost a backend lookup per entry for nothing), listings not
    /// cached (`cache_dir` and `noopendir`, which makes the kernel cache them, off). Kept as
    /// they are: file data (`keep_cache`, passthrough; the change feed still invalidates
    /// them), POSIX ACLs cached per inode by the kernel (needed for the kernel's permission
    /// checks; invalidated by the feed), threads, descriptor limits.
    pub fn bypassing(self) -> CachePolicy {
        CachePolicy {
            bypass: true,
            entry_ttl: Duration::ZERO,
            attr_ttl: Duration::ZERO,
            negative_ttl: Duration::ZERO,
            readdirplus: false,
            cache_dir: false,
            no_opendir: false,
            lookahead: false,
            ..self
        }
    }

    /// Every kernel cache off (TTL 0, no negative entries, no cached listings or data, no
    /// passthrough): what a naive FUSE file system does. For measurements only.
    pub fn uncached() -> CachePolicy {
        CachePolicy {
            entry_ttl: Duration::ZERO,
            attr_ttl: Duration::ZERO,
            negative_ttl: Duration::ZERO,
            readdirplus: false,
            lean: false,
            lean_cached: false,
            cache_dir: false,
            no_opendir: false,
            keep_cache: false,
            passthrough: false,
            cached_reads_max: 0,
            no_open: false,
            parallel_dirops: true,
            cache_symlinks: false,
            posix_acl: false,
            security_xattrs: true,
            threads: 4,
            prefetch_threads: 0,
            lookahead: false,
            lookahead_levels: 0,
            kernel_readers: crate::prefetch::KERNEL_READERS,
            max_open_per_user: 0,
            bypass: false,
            io_uring: false,
            leader_follower: false,
            spin_us: 0,
            lazy_handoff: false,
            request_sched: crate::sched::RequestSched::Inherit,
        }
    }
}
