//! `dircache bench lookup`: the core cache's lookups, readdirs and invalidations side by side
//! with the kernel, on a generated source-like tree (issue 2's benchmark).
//!
//! Method. One tree is generated in a temporary directory. Two caches are built over the local
//! backend of that tree: `Config::default()` (the fast path: direct-lookup table and
//! prefix-check cache) and the same with `fastpath: false` (the slow path: component-at-a-time
//! walk over cached dentries). Both are warmed so that every number is a *hit* number. Each
//! case is measured as a batch of lookups timed with one clock read at each end (ns per lookup
//! = elapsed / batch); cases are interleaved round by round and the median over the rounds is
//! reported. Lookups are made as uid 1000 (the tree is root-owned, 0755/0644), so permission
//! checks and the prefix-check cache are exercised; mutations are made as root.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::CString;
use std::hint::black_box;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use dircache_core::{
    At, Attr, Backend, Cache, ChangeFeed, Config, Cred, Creds, DirEntry, Error, LookupFlags,
    RenameMode, SetAttr, StatFs, Walked,
};
use serde_json::{json, Map, Value};

use super::progress::Progress;
use super::sampler::{medians, Sampler};
use super::tree::{self, TempDir};
use super::{alloc, stats};

#[derive(clap::Args)]
pub struct Args {
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
    /// A fast smoke run: small batches and few samples (numbers are noisy).
    #[arg(long)]
    pub quick: bool,
    /// Run only these sections (comma-separated: lookups, readdir, invalidate, threads,
    /// memory), e.g. for profiling one of them; the others are reported as skipped (null in
    /// --json, listed in "skipped_sections").
    #[arg(long, value_delimiter = ',', value_parser = clap::builder::PossibleValuesParser::new(SECTIONS))]
    pub only: Vec<String>,
}

/// The sections of the benchmark, in the order they run (the names `--only` takes).
const SECTIONS: [&str; 5] = ["lookups", "readdir", "invalidate", "threads", "memory"];

/// Sizes of one run.
struct Params {
    /// Recorded rounds of the lookup and readdir cases.
    rounds: usize,
    /// Lookups per sample.
    batch: usize,
    /// Readdir work per sample, in entries (a 10-entry directory is listed `readdir_work / 10`
    /// times per sample).
    readdir_work: usize,
    /// Recorded rounds of the invalidation cases.
    inv_rounds: usize,
    /// Duration of each throughput run.
    thread_time: Duration,
    /// Throughput runs per thread count.
    thread_rounds: usize,
    /// Source tree shape: modules, parts per module, files per part.
    src: (usize, usize, usize),
}

impl Params {
    fn new(quick: bool) -> Params {
        if quick {
            Params {
                rounds: 3,
                batch: 1_000,
                readdir_work: 2_000,
                inv_rounds: 2,
                thread_time: Duration::from_millis(100),
                thread_rounds: 1,
                src: (4, 4, 10),
            }
        } else {
            Params {
                rounds: 21,
                batch: 10_000,
                readdir_work: 20_000,
                inv_rounds: 15,
                thread_time: Duration::from_millis(500),
                thread_rounds: 5,
                src: (16, 8, 20),
            }
        }
    }
}

const DEPTHS: [usize; 5] = [1, 2, 4, 8, 16];
const READDIR_SIZES: [usize; 4] = [10, 100, 1000, 10000];
const INV_SIZES: [usize; 3] = [100, 1000, 10000];

/// The generated tree.
struct Tree {
    tmp: TempDir,
    rootfd: OwnedFd,
    /// Every regular file of the source-like part (relative paths).
    src_files: Vec<String>,
    /// For each invalidation size: the directory and its descendants (relative to it).
    inv: Vec<(usize, String, Vec<String>)>,
}

/// The named single-path cases beyond the depth series.
struct Special {
    key: &'static str,
    path: &'static str,
    /// `None`: must resolve; `Some(e)`: must fail with `e`.
    expect: Option<Error>,
    what: &'static str,
}

const SPECIALS: [Special; 4] = [
    Special {
        key: "negative",
        path: "dir01/dir02/dir03/missing.c",
        expect: Some(Error::NotFound),
        what: "missing file, 4 components",
    },
    Special {
        key: "deep_negative",
        path: "dir01/dir02/nodir/sub/missing.h",
        expect: Some(Error::NotFound),
        what: "under a missing dir, 5 components",
    },
    Special {
        key: "symlink",
        path: "lnk/dir04/dir05/file.c",
        expect: None,
        what: "lnk -> dir01/dir02/dir03, 4 components (6 resolved)",
    },
    Special {
        key: "dotdot",
        path: "dir01/dir02/../dir02/dir03/dir04/file.c",
        expect: None,
        what: "with `..`, 7 components",
    },
];

fn build_tree(p: &Params) -> Result<Tree> {
    let tmp = TempDir::new("bench-lookup", None)?;
    let root = tmp.path().to_path_buf();
    // The deep chain: dirNN/ holds file.c (the target at depth NN+1) and a few siblings.
    let mut dir = root.clone();
    tree::touch(&dir.join("file.c"))?;
    for i in 1..16 {
        dir = dir.join(tree::chain_dir(i));
        std::fs::create_dir(&dir).with_context(|| format!("mkdir {}", dir.display()))?;
        for s in ["file.c", "Makefile", "util.h", "Kconfig"] {
            tree::touch(&dir.join(s))?;
        }
    }
    std::os::unix::fs::symlink("dir01/dir02/dir03", root.join("lnk"))?;
    let (m, s, f) = p.src;
    let src_files = tree::source_tree(&root, "src", m, s, f)?;
    for n in READDIR_SIZES {
        tree::flat_dir(&root.join(format!("big/n{n}")), n)?;
    }
    let mut inv = Vec::new();
    for n in INV_SIZES {
        let d = format!("inv/n{n}");
        let desc = tree::nested_dir(&root.join(&d), n)?;
        inv.push((n, d, desc));
    }
    let rootfd = open_dir(libc::AT_FDCWD, &root)?;
    Ok(Tree {
        tmp,
        rootfd,
        src_files,
        inv,
    })
}

fn open_dir(at: RawFd, p: &Path) -> Result<OwnedFd> {
    let c = CString::new(p.as_os_str().as_bytes())?;
    // SAFETY: `c` is a valid NUL-terminated string; the flags need no mode argument.
    let fd = unsafe {
        libc::openat(
            at,
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("open {}", p.display()));
    }
    // SAFETY: `fd` was just returned by openat and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The local backend over `root` (the one the FUSE mount uses).
pub fn local_backend(root: &Path) -> Result<Arc<dyn Backend>> {
    let b = dircache_local::LocalBackend::new(root)
        .with_context(|| format!("local backend over {}", root.display()))?;
    Ok(Arc::new(b))
}

/// A backend that forwards reads to another backend but performs `setattr` and `rename`
/// without touching the files: the cache's share of a chmod or rename is then measured alone.
struct StubMutations {
    inner: Arc<dyn Backend>,
    attrs: Mutex<HashMap<Vec<u8>, Attr>>,
}

impl Backend for StubMutations {
    fn lookup(&self, dir: &[u8], name: &[u8]) -> dircache_core::Result<Attr> {
        self.inner.lookup(dir, name)
    }
    fn walk(&self, dir: &[u8], names: &[&[u8]]) -> Walked {
        self.inner.walk(dir, names)
    }
    fn getattr(&self, path: &[u8]) -> dircache_core::Result<Attr> {
        self.inner.getattr(path)
    }
    fn readdir(&self, path: &[u8], plus: bool) -> dircache_core::Result<Vec<DirEntry>> {
        self.inner.readdir(path, plus)
    }
    fn readlink(&self, path: &[u8]) -> dircache_core::Result<Vec<u8>> {
        self.inner.readlink(path)
    }
    fn mknod(&self, cred: &Cred, path: &[u8], mode: u32, rdev: u64) -> dircache_core::Result<Attr> {
        self.inner.mknod(cred, path, mode, rdev)
    }
    fn mkdir(&self, cred: &Cred, path: &[u8], mode: u32) -> dircache_core::Result<Attr> {
        self.inner.mkdir(cred, path, mode)
    }
    fn symlink(&self, cred: &Cred, target: &[u8], path: &[u8]) -> dircache_core::Result<Attr> {
        self.inner.symlink(cred, target, path)
    }
    fn link(&self, cred: &Cred, old: &[u8], new: &[u8]) -> dircache_core::Result<Attr> {
        self.inner.link(cred, old, new)
    }
    fn unlink(&self, cred: &Cred, path: &[u8]) -> dircache_core::Result<()> {
        self.inner.unlink(cred, path)
    }
    fn rmdir(&self, cred: &Cred, path: &[u8]) -> dircache_core::Result<()> {
        self.inner.rmdir(cred, path)
    }
    fn rename(
        &self,
        _cred: &Cred,
        _old: &[u8],
        _new: &[u8],
        _mode: RenameMode,
    ) -> dircache_core::Result<()> {
        Ok(())
    }
    fn setattr(&self, _cred: &Cred, path: &[u8], set: &SetAttr) -> dircache_core::Result<Attr> {
        let mut map = self.attrs.lock().map_err(|_| Error::Invalid)?;
        let mut a = match map.get(path) {
            Some(a) => *a,
            None => self.inner.getattr(path)?,
        };
        if let Some(m) = set.mode {
            a.mode = (a.mode & libc::S_IFMT) | (m & 0o7777);
        }
        map.insert(path.to_vec(), a);
        Ok(a)
    }
    fn statfs(&self, path: &[u8]) -> dircache_core::Result<StatFs> {
        self.inner.statfs(path)
    }
    fn open(
        &self,
        cred: &Cred,
        path: &[u8],
        flags: i32,
        mode: u32,
    ) -> dircache_core::Result<Box<dyn dircache_core::BackendFile>> {
        self.inner.open(cred, path, flags, mode)
    }
    fn watch(&self) -> dircache_core::Result<Option<ChangeFeed>> {
        Ok(None)
    }
}

fn cstr(s: &str) -> Result<CString> {
    CString::new(s).map_err(|e| anyhow!("path with NUL: {e}"))
}

/// One batch of `n` cache stats of `path`; ns per lookup.
fn time_cache_stat(cache: &Cache, c: &Creds, path: &[u8], n: usize) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        let _ = black_box(cache.stat(c, At::Root, black_box(path), LookupFlags::FOLLOW));
    }
    t.elapsed().as_nanos() as f64 / n as f64
}

/// One batch of `n` cache lookups (returning a dentry reference) of `path`; ns per lookup.
fn time_cache_lookup(cache: &Cache, c: &Creds, path: &[u8], n: usize) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        let _ = black_box(cache.lookup(c, At::Root, black_box(path), LookupFlags::FOLLOW));
    }
    t.elapsed().as_nanos() as f64 / n as f64
}

/// One batch of `n` fstatat(2) of `path` relative to `dirfd`; ns per call.
fn time_kernel_stat(dirfd: RawFd, path: &CString, n: usize) -> f64 {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    let t = Instant::now();
    for _ in 0..n {
        // SAFETY: `path` is NUL-terminated; `st` is a writable buffer of the right type.
        black_box(unsafe { libc::fstatat(dirfd, black_box(path.as_ptr()), st.as_mut_ptr(), 0) });
    }
    t.elapsed().as_nanos() as f64 / n as f64
}

/// The kernel's result for `path`: `None` if it resolves, else the error.
fn kernel_result(dirfd: RawFd, path: &CString) -> Option<Error> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: as in `time_kernel_stat`.
    let r = unsafe { libc::fstatat(dirfd, path.as_ptr(), st.as_mut_ptr(), 0) };
    if r == 0 {
        None
    } else {
        Some(Error::from(std::io::Error::last_os_error()))
    }
}

/// Open, getdents64 to the end, close: a native listing of `path`. Returns the entry count
/// (including `.` and `..`).
fn getdents_count(dirfd: RawFd, path: &CString, buf: &mut [u8]) -> Result<usize> {
    // SAFETY: `path` is NUL-terminated; the flags need no mode argument.
    let fd = unsafe {
        libc::openat(
            dirfd,
            path.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        bail!("open {:?}: {}", path, std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned here only.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut count = 0;
    loop {
        // SAFETY: `buf` is valid for writes of `buf.len()` bytes for the duration of the call.
        let n = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                fd.as_raw_fd(),
                buf.as_mut_ptr(),
                buf.len(),
            )
        };
        if n < 0 {
            bail!("getdents64: {}", std::io::Error::last_os_error());
        }
        if n == 0 {
            break;
        }
        let n = n as usize;
        let mut off = 0;
        while off + 19 <= n {
            // d_reclen: bytes 16..18 of struct linux_dirent64.
            let reclen = u16::from_ne_bytes([buf[off + 16], buf[off + 17]]) as usize;
            if reclen == 0 {
                break;
            }
            count += 1;
            off += reclen;
        }
    }
    Ok(count)
}

fn keyed(m: &BTreeMap<String, f64>, prefix: &str, keys: &[usize], digits: i32) -> Value {
    let mut o = Map::new();
    for k in keys {
        let v = m.get(&format!("{prefix}{k}")).copied().unwrap_or(f64::NAN);
        o.insert(k.to_string(), json!(stats::round(v, digits)));
    }
    Value::Object(o)
}

fn get(m: &BTreeMap<String, f64>, k: &str) -> f64 {
    m.get(k).copied().unwrap_or(f64::NAN)
}

pub fn run(a: Args) -> Result<i32> {
    let p = Params::new(a.quick);
    let want = |s: &str| a.only.is_empty() || a.only.iter().any(|x| x == s);
    // A step per round of every section that runs.
    let progress = Progress::new("bench lookup", 0);
    progress.set_total(
        [
            ("lookups", 1 + p.rounds),
            ("readdir", 1 + p.rounds.min(11)),
            ("invalidate", 1 + p.inv_rounds),
            ("threads", p.thread_rounds),
            ("memory", 1),
        ]
        .iter()
        .filter(|(s, _)| want(s))
        .map(|(_, n)| *n as u64)
        .sum(),
    );
    let note = |s: &str| {
        if !a.json {
            progress.note(&format!("bench lookup: {s}"));
        }
    };
    // Announces a section as it starts, or says that `--only` skips it.
    let section = |name: &str, what: &str| {
        if want(name) {
            progress.running(what.to_string());
            note(what);
        } else {
            note(&format!("{what}: skipped (--only)"));
        }
    };
    note("generating the tree");
    let t = build_tree(&p)?;
    let root = t.tmp.path();
    let rootfd = t.rootfd.as_raw_fd();

    let fast = Cache::new(local_backend(root)?, Config::default()).context("Cache::new (fast)")?;
    let slow = Cache::new(
        local_backend(root)?,
        Config {
            fastpath: false,
            ..Config::default()
        },
    )
    .context("Cache::new (slow)")?;
    let user = Cred::new(1000, 1000, []);
    let fc = fast.credentials(user.clone());
    let sc = slow.credentials(user.clone());

    // Every single-path case: key, path, expected result.
    let mut cases: Vec<(String, String, Option<Error>)> = DEPTHS
        .iter()
        .map(|d| (format!("d{d}"), tree::depth_path(*d), None))
        .collect();
    for s in &SPECIALS {
        cases.push((s.key.to_string(), s.path.to_string(), s.expect));
    }
    // Check every answer against the kernel and warm both caches.
    for (key, path, expect) in &cases {
        let kr = kernel_result(rootfd, &cstr(path)?);
        if kr != *expect {
            bail!("tree generation: kernel says {kr:?} for {path} ({key}), expected {expect:?}");
        }
        for (name, cache, c) in [("fast", &fast, &fc), ("slow", &slow, &sc)] {
            let r = cache
                .stat(c, At::Root, path.as_bytes(), LookupFlags::FOLLOW)
                .err();
            if r != *expect {
                bail!("{name} cache answers {r:?} for {path} ({key}); the kernel says {expect:?}");
            }
        }
    }
    note("warming the caches with the source tree");
    for f in &t.src_files {
        for (cache, c) in [(&fast, &fc), (&slow, &sc)] {
            cache
                .stat(c, At::Root, f.as_bytes(), LookupFlags::FOLLOW)
                .with_context(|| format!("warming with {f}"))?;
        }
    }

    // ---------------------------------------------------------------- single-path lookups
    section("lookups", "lookups");
    let lk = if want("lookups") {
        let mut s = Sampler::new().progress(&progress);
        for (key, path, _) in &cases {
            let (fast, slow, fc, sc) = (&fast, &slow, &fc, &sc);
            let pb = path.as_bytes().to_vec();
            let cp = cstr(path)?;
            let n = p.batch;
            let pb2 = pb.clone();
            s.add(format!("fast.{key}"), move || {
                Ok(time_cache_stat(fast, fc, &pb, n))
            });
            s.add(format!("slow.{key}"), move || {
                Ok(time_cache_stat(slow, sc, &pb2, n))
            });
            s.add(format!("kernel.{key}"), move || {
                Ok(time_kernel_stat(rootfd, &cp, n))
            });
        }
        {
            let d8 = tree::depth_path(8).into_bytes();
            let (fast, slow, fc, sc, n) = (&fast, &slow, &fc, &sc, p.batch);
            let d8b = d8.clone();
            s.add("fast_noderef.d8", move || {
                Ok(time_cache_lookup(fast, fc, &d8, n))
            });
            s.add("slow_noderef.d8", move || {
                Ok(time_cache_lookup(slow, sc, &d8b, n))
            });
        }
        medians(&s.run(1, p.rounds)?)
    } else {
        BTreeMap::new()
    };

    // ---------------------------------------------------------------- readdir
    section("readdir", "readdir");
    let rd = if want("readdir") {
        for n in READDIR_SIZES {
            let path = format!("big/n{n}");
            let l = fast
                .readdir(&fc, At::Root, path.as_bytes())
                .with_context(|| format!("readdir {path}"))?;
            if l.len() != n {
                bail!("cache readdir of {path}: {} entries, expected {n}", l.len());
            }
            let mut buf = vec![0u8; 64 * 1024];
            let c = getdents_count(rootfd, &cstr(&path)?, &mut buf)?;
            if c != n + 2 {
                bail!("getdents of {path}: {c} entries, expected {}", n + 2);
            }
        }
        let mut s = Sampler::new().progress(&progress);
        for n in READDIR_SIZES {
            let reps = (p.readdir_work / n).max(1);
            let path = format!("big/n{n}").into_bytes();
            let (fast, fc) = (&fast, &fc);
            s.add(format!("cache.{n}"), move || {
                let t = Instant::now();
                for _ in 0..reps {
                    let l = fast.readdir(fc, At::Root, &path)?;
                    black_box(l);
                }
                Ok(t.elapsed().as_nanos() as f64 / 1000.0 / reps as f64)
            });
            let cp = cstr(&format!("big/n{n}"))?;
            let mut buf = vec![0u8; 64 * 1024];
            s.add(format!("getdents.{n}"), move || {
                let t = Instant::now();
                for _ in 0..reps {
                    black_box(getdents_count(rootfd, &cp, &mut buf)?);
                }
                Ok(t.elapsed().as_nanos() as f64 / 1000.0 / reps as f64)
            });
        }
        medians(&s.run(1, p.rounds.min(11))?)
    } else {
        BTreeMap::new()
    };

    // ---------------------------------------------------------------- invalidation
    section("invalidate", "invalidation (chmod, rename)");
    let inv = if want("invalidate") {
        bench_invalidate(&t, &p, &progress)?
    } else {
        BTreeMap::new()
    };

    // ---------------------------------------------------------------- threads
    section("threads", "throughput on 1 and 2 threads");
    let paths: Vec<Vec<u8>> = t.src_files.iter().map(|f| f.as_bytes().to_vec()).collect();
    let mut tp: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
    let mut tcpu: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let cpaths: Vec<CString> = t.src_files.iter().map(|f| cstr(f)).collect::<Result<_>>()?;
    let cache_op = |i: usize| {
        let _ = black_box(fast.stat(&fc, At::Root, &paths[i], LookupFlags::FOLLOW));
    };
    let kernel_op = |i: usize| {
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: NUL-terminated path; `st` is a writable stat buffer.
        black_box(unsafe { libc::fstatat(rootfd, cpaths[i].as_ptr(), st.as_mut_ptr(), 0) });
    };
    let st0 = fast.stats();
    for _ in 0..if want("threads") { p.thread_rounds } else { 0 } {
        progress.inc();
        for n in [1usize, 2] {
            let (wall, cpu) = throughput(paths.len(), n, p.thread_time, &cache_op);
            tp.entry(n).or_default().push(wall);
            tcpu.entry(format!("cache.cpu.{n}")).or_default().push(cpu);
            let (wall, cpu) = throughput(cpaths.len(), n, p.thread_time, &kernel_op);
            tcpu.entry(format!("kernel.wall.{n}"))
                .or_default()
                .push(wall);
            tcpu.entry(format!("kernel.cpu.{n}")).or_default().push(cpu);
        }
    }
    let st1 = fast.stats();
    let fast_hit_rate = {
        let f = (st1.fastpath_hits - st0.fastpath_hits) as f64;
        let w = (st1.slowpath_walks - st0.slowpath_walks) as f64;
        if f + w > 0.0 {
            100.0 * f / (f + w)
        } else {
            f64::NAN
        }
    };
    let thread_stats = json!({
        "fast_hit_percent": stats::round(fast_hit_rate, 2),
        "fastpath_hits": st1.fastpath_hits - st0.fastpath_hits,
        "slowpath_walks": st1.slowpath_walks - st0.slowpath_walks,
        "pcc_misses": st1.pcc_misses - st0.pcc_misses,
        "misses": st1.misses - st0.misses,
    });
    let tcpu = medians(&tcpu);
    let t1 = stats::median(tp.get(&1).map(Vec::as_slice).unwrap_or(&[]));
    let t2 = stats::median(tp.get(&2).map(Vec::as_slice).unwrap_or(&[]));
    drop(fast);
    drop(slow);

    // ---------------------------------------------------------------- memory
    section("memory", "bytes per dentry");
    let mem = if want("memory") {
        let m = bytes_per_dentry(&t, &user)?;
        progress.inc();
        m
    } else {
        Mem {
            per_dentry: f64::NAN,
            marginal: f64::NAN,
            footprint: f64::NAN,
            bytes: 0,
            after_new: 0,
            entries_reported: 0,
            entries_expected: 0,
            stats_bytes: 0,
        }
    };

    // ---------------------------------------------------------------- report
    let kernel_keys: Map<String, Value> = SPECIALS
        .iter()
        .map(|s| {
            (
                s.key.to_string(),
                json!(stats::round(get(&lk, &format!("kernel.{}", s.key)), 1)),
            )
        })
        .collect();
    let slow_keys: Map<String, Value> = SPECIALS
        .iter()
        .map(|s| {
            (
                s.key.to_string(),
                json!(stats::round(get(&lk, &format!("slow.{}", s.key)), 1)),
            )
        })
        .collect();
    drop(progress);
    let skipped: Vec<&str> = SECTIONS.into_iter().filter(|s| !want(s)).collect();
    let out = json!({
        "skipped_sections": skipped,
        "lookup_ns": {
            "fast": keyed(&lk, "fast.d", &DEPTHS, 1),
            "slow": keyed(&lk, "slow.d", &DEPTHS, 1),
            "kernel_stat": keyed(&lk, "kernel.d", &DEPTHS, 1),
            "negative": stats::round(get(&lk, "fast.negative"), 1),
            "deep_negative": stats::round(get(&lk, "fast.deep_negative"), 1),
            "symlink": stats::round(get(&lk, "fast.symlink"), 1),
            "dotdot": stats::round(get(&lk, "fast.dotdot"), 1),
        },
        "readdir_us": {
            "cache": keyed(&rd, "cache.", &READDIR_SIZES, 2),
            "getdents": keyed(&rd, "getdents.", &READDIR_SIZES, 2),
        },
        "invalidate_us": {
            "chmod": keyed(&inv, "chmod.cache.", &INV_SIZES, 2),
            "rename": keyed(&inv, "rename.cache.", &INV_SIZES, 2),
        },
        "threads_lookups_per_s": { "1": t1.round(), "2": t2.round() },
        "bytes_per_dentry": stats::round(mem.per_dentry, 1),
        "details": {
            "method": "medians over interleaved rounds; lookups as uid 1000 via Cache::stat (follow) at At::Root; kernel = fstatat(rootfd, relpath, 0)",
            "rounds": p.rounds,
            "loadavg_at_end": loadavg(),
            "lookups_per_sample": p.batch,
            "paths": cases.iter().map(|(k, p, _)| (k.clone(), json!(p))).collect::<Map<String, Value>>(),
            "lookup_ns_slow_special": slow_keys,
            "lookup_ns_kernel_special": kernel_keys,
            "lookup_noderef_ns_d8": { "fast": stats::round(get(&lk, "fast_noderef.d8"), 1), "slow": stats::round(get(&lk, "slow_noderef.d8"), 1) },
            "invalidate_us_cache_only": {
                "chmod": keyed(&inv, "chmod.stub.", &INV_SIZES, 2),
                "rename": keyed(&inv, "rename.stub.", &INV_SIZES, 2),
            },
            "invalidate_us_backend_alone": {
                "chmod": keyed(&inv, "chmod.backend.", &INV_SIZES, 2),
                "rename": keyed(&inv, "rename.backend.", &INV_SIZES, 2),
            },
            "invalidate_us_syscall": {
                "chmod": keyed(&inv, "chmod.sys.", &INV_SIZES, 2),
                "rename": keyed(&inv, "rename.sys.", &INV_SIZES, 2),
            },
            "invalidated_entries": {
                "chmod": keyed(&inv, "chmod.invalidated.", &INV_SIZES, 0),
                "rename": keyed(&inv, "rename.invalidated.", &INV_SIZES, 0),
            },
            "threads_lookups_per_cpu_s": { "1": get(&tcpu, "cache.cpu.1").round(), "2": get(&tcpu, "cache.cpu.2").round() },
            "threads_kernel_stat_per_s": { "1": get(&tcpu, "kernel.wall.1").round(), "2": get(&tcpu, "kernel.wall.2").round() },
            "threads_kernel_stat_per_cpu_s": { "1": get(&tcpu, "kernel.cpu.1").round(), "2": get(&tcpu, "kernel.cpu.2").round() },
            "threads_fast_cache_stats": thread_stats,
            "threads_samples": tp.iter().map(|(k, v)| (k.to_string(), json!(v.iter().map(|x| x.round()).collect::<Vec<_>>()))).collect::<Map<String, Value>>(),
            "memory": {
                "live_bytes": mem.bytes,
                "live_bytes_after_new": mem.after_new,
                "entries_reported": mem.entries_reported,
                "entries_expected": mem.entries_expected,
                "marginal_bytes_per_dentry": stats::round(mem.marginal, 1),
                "malloc_footprint_bytes_per_dentry": stats::round(mem.footprint, 1),
                "cache_stats_bytes": mem.stats_bytes,
            },
        },
    });
    if a.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print_human(
            &lk,
            &rd,
            &inv,
            &Threads {
                t1,
                t2,
                tcpu: &tcpu,
                fast_hit_rate,
            },
            &mem,
            &p,
            &want,
        );
    }
    Ok(0)
}

/// Medians of the invalidation cases, keyed `{chmod,rename}.{cache,stub,sys}.{n}` (µs) and
/// `{chmod,rename}.invalidated.{n}` (entries the cache reported invalidating per operation).
fn bench_invalidate(t: &Tree, p: &Params, progress: &Progress) -> Result<BTreeMap<String, f64>> {
    let root = t.tmp.path();
    let rootfd = t.rootfd.as_raw_fd();
    let real = Cache::new(local_backend(root)?, Config::default()).context("Cache::new (inv)")?;
    let stub_b: Arc<dyn Backend> = Arc::new(StubMutations {
        inner: local_backend(root)?,
        attrs: Mutex::new(HashMap::new()),
    });
    let stub = Cache::new(stub_b, Config::default()).context("Cache::new (inv stub)")?;
    let rc = real.credentials(Cred::root());
    let sc = stub.credentials(Cred::root());
    // The local backend alone (no cache in front), to split "total" into backend and cache.
    let bare = local_backend(root)?;

    let mut samples: BTreeMap<String, Vec<f64>> = BTreeMap::new();

    let populate = |cache: &Cache, c: &Creds, dir: &str, desc: &[String]| -> Result<()> {
        for d in desc {
            let path = format!("{dir}/{d}");
            cache
                .stat(c, At::Root, path.as_bytes(), LookupFlags::NOFOLLOW)
                .with_context(|| format!("populating {path}"))?;
        }
        Ok(())
    };
    let mut flip = false;
    for round in 0..p.inv_rounds + 1 {
        progress.inc();
        for (n, dir, desc) in &t.inv {
            let renamed = format!("{dir}.renamed");
            for (sys, cache, c) in [("cache", &real, &rc), ("stub", &stub, &sc)] {
                // chmod
                populate(cache, c, dir, desc)?;
                flip = !flip;
                let set = SetAttr {
                    mode: Some(if flip { 0o751 } else { 0o755 }),
                    ..SetAttr::default()
                };
                let before = cache.stats().invalidated_entries;
                let t0 = Instant::now();
                cache
                    .setattr(c, At::Root, dir.as_bytes(), &set, LookupFlags::NOFOLLOW)
                    .with_context(|| format!("chmod {dir}"))?;
                let us = t0.elapsed().as_nanos() as f64 / 1000.0;
                let inval = cache.stats().invalidated_entries.saturating_sub(before) as f64;
                // rename, then back (untimed)
                populate(cache, c, dir, desc)?;
                let before_r = cache.stats().invalidated_entries;
                let t0 = Instant::now();
                cache
                    .rename(
                        c,
                        At::Root,
                        dir.as_bytes(),
                        renamed.as_bytes(),
                        RenameMode::Replace,
                    )
                    .with_context(|| format!("rename {dir}"))?;
                let us_r = t0.elapsed().as_nanos() as f64 / 1000.0;
                let inval_r = cache.stats().invalidated_entries.saturating_sub(before_r) as f64;
                cache
                    .rename(
                        c,
                        At::Root,
                        renamed.as_bytes(),
                        dir.as_bytes(),
                        RenameMode::Replace,
                    )
                    .with_context(|| format!("rename {renamed} back"))?;
                if round > 0 {
                    samples
                        .entry(format!("chmod.{sys}.{n}"))
                        .or_default()
                        .push(us);
                    samples
                        .entry(format!("rename.{sys}.{n}"))
                        .or_default()
                        .push(us_r);
                    if sys == "cache" {
                        samples
                            .entry(format!("chmod.invalidated.{n}"))
                            .or_default()
                            .push(inval);
                        samples
                            .entry(format!("rename.invalidated.{n}"))
                            .or_default()
                            .push(inval_r);
                    }
                }
            }
            // The local backend alone.
            flip = !flip;
            let set = SetAttr {
                mode: Some(if flip { 0o751 } else { 0o755 }),
                ..SetAttr::default()
            };
            let _ = bare.getattr(dir.as_bytes());
            let t0 = Instant::now();
            bare.setattr(&Cred::root(), dir.as_bytes(), &set)
                .with_context(|| format!("backend chmod {dir}"))?;
            let us = t0.elapsed().as_nanos() as f64 / 1000.0;
            let t0 = Instant::now();
            bare.rename(
                &Cred::root(),
                dir.as_bytes(),
                renamed.as_bytes(),
                RenameMode::Replace,
            )
            .with_context(|| format!("backend rename {dir}"))?;
            let us_r = t0.elapsed().as_nanos() as f64 / 1000.0;
            bare.rename(
                &Cred::root(),
                renamed.as_bytes(),
                dir.as_bytes(),
                RenameMode::Replace,
            )
            .with_context(|| format!("backend rename {renamed} back"))?;
            if round > 0 {
                samples
                    .entry(format!("chmod.backend.{n}"))
                    .or_default()
                    .push(us);
                samples
                    .entry(format!("rename.backend.{n}"))
                    .or_default()
                    .push(us_r);
            }
            // The bare system calls, on the same directory.
            let cd = cstr(dir)?;
            let cr = cstr(&renamed)?;
            flip = !flip;
            let t0 = Instant::now();
            // SAFETY: NUL-terminated path relative to an open directory descriptor.
            let r =
                unsafe { libc::fchmodat(rootfd, cd.as_ptr(), if flip { 0o751 } else { 0o755 }, 0) };
            let us = t0.elapsed().as_nanos() as f64 / 1000.0;
            if r != 0 {
                bail!("fchmodat {dir}: {}", std::io::Error::last_os_error());
            }
            let t0 = Instant::now();
            // SAFETY: as above, both paths NUL-terminated.
            let r = unsafe { libc::renameat(rootfd, cd.as_ptr(), rootfd, cr.as_ptr()) };
            let us_r = t0.elapsed().as_nanos() as f64 / 1000.0;
            if r != 0 {
                bail!("renameat {dir}: {}", std::io::Error::last_os_error());
            }
            // SAFETY: as above.
            if unsafe { libc::renameat(rootfd, cr.as_ptr(), rootfd, cd.as_ptr()) } != 0 {
                bail!(
                    "renameat {renamed} back: {}",
                    std::io::Error::last_os_error()
                );
            }
            if round > 0 {
                samples
                    .entry(format!("chmod.sys.{n}"))
                    .or_default()
                    .push(us);
                samples
                    .entry(format!("rename.sys.{n}"))
                    .or_default()
                    .push(us_r);
            }
        }
    }
    Ok(medians(&samples))
}

fn thread_cpu_secs() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write to.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// `threads` threads each calling `op(i)` for i = 0, 1, ... (modulo `n`) for `dur`.
/// Returns (operations per wall-clock second, operations per CPU-second of the threads): if the
/// second does not drop with more threads, a missing wall-clock speedup comes from the machine
/// (other processes), not from contention in what is measured.
fn throughput(n: usize, threads: usize, dur: Duration, op: &(dyn Fn(usize) + Sync)) -> (f64, f64) {
    if n == 0 {
        return (0.0, 0.0);
    }
    let stop = AtomicBool::new(false);
    let total = AtomicU64::new(0);
    let cpu_ns = AtomicU64::new(0);
    let start = Barrier::new(threads + 1);
    let mut elapsed = Duration::ZERO;
    std::thread::scope(|s| {
        for i in 0..threads {
            let (stop, total, start, cpu_ns) = (&stop, &total, &start, &cpu_ns);
            s.spawn(move || {
                let mut idx = i * n / threads;
                let mut count = 0u64;
                start.wait();
                let c0 = thread_cpu_secs();
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..256 {
                        op(idx);
                        idx += 1;
                        if idx == n {
                            idx = 0;
                        }
                    }
                    count += 256;
                }
                let c = thread_cpu_secs() - c0;
                cpu_ns.fetch_add((c * 1e9) as u64, Ordering::Relaxed);
                total.fetch_add(count, Ordering::Relaxed);
            });
        }
        start.wait();
        let t0 = Instant::now();
        std::thread::sleep(dur);
        stop.store(true, Ordering::Relaxed);
        elapsed = t0.elapsed();
    });
    let ops = total.load(Ordering::Relaxed) as f64;
    let cpu = cpu_ns.load(Ordering::Relaxed) as f64 / 1e9;
    (
        ops / elapsed.as_secs_f64(),
        if cpu > 0.0 { ops / cpu } else { 0.0 },
    )
}

struct Mem {
    per_dentry: f64,
    marginal: f64,
    /// Allocator footprint per dentry (usable size + chunk header of each block), everything
    /// counted as for `per_dentry`.
    footprint: f64,
    bytes: i64,
    after_new: i64,
    entries_reported: u64,
    entries_expected: u64,
    stats_bytes: u64,
}

/// Live heap bytes of a fresh cache filled by looking up every file of the tree, divided by
/// the dentries it holds. Counted: everything allocated between `Cache::new` and the end of the
/// fill and still live (dentries, names, the direct-lookup table, the (parent, name) maps, the
/// prefix-check cache, statistics, anything the backend keeps); the backend object itself was
/// created before counting began.
fn bytes_per_dentry(t: &Tree, user: &Cred) -> Result<Mem> {
    let root = t.tmp.path();
    let backend = local_backend(root)?;
    let mut paths: Vec<String> = t.src_files.clone();
    for n in READDIR_SIZES {
        for i in 0..n {
            paths.push(format!("big/n{n}/e{i:05}.o"));
        }
    }
    for (_, dir, desc) in &t.inv {
        paths.extend(desc.iter().map(|d| format!("{dir}/{d}")));
    }
    // Every dentry the fill must create: each path and all its ancestors, plus the root.
    let mut expected: BTreeSet<&str> = BTreeSet::new();
    for pth in &paths {
        let mut end = pth.len();
        loop {
            expected.insert(&pth[..end]);
            match pth[..end].rfind('/') {
                Some(i) => end = i,
                None => break,
            }
        }
    }
    let entries_expected = expected.len() as u64 + 1;

    let base = alloc::live();
    let foot_base = alloc::footprint_live();
    alloc::enable();
    let res = (|| -> Result<(Arc<Cache>, i64)> {
        let cache = Cache::new(backend, Config::default())?;
        let c = cache.credentials(user.clone());
        let after_new = alloc::live() - base;
        for pth in &paths {
            cache
                .stat(&c, At::Root, pth.as_bytes(), LookupFlags::NOFOLLOW)
                .with_context(|| format!("filling with {pth}"))?;
        }
        Ok((cache, after_new))
    })();
    alloc::disable();
    let (cache, after_new) = res?;
    let bytes = alloc::live() - base;
    let foot = alloc::footprint_live() - foot_base;
    let st = cache.stats();
    let entries = if st.entries > 0 {
        st.entries
    } else {
        entries_expected
    };
    Ok(Mem {
        per_dentry: bytes as f64 / entries as f64,
        marginal: (bytes - after_new) as f64 / entries as f64,
        footprint: foot as f64 / entries as f64,
        bytes,
        after_new,
        entries_reported: st.entries,
        entries_expected,
        stats_bytes: st.bytes,
    })
}

/// The first three fields of /proc/loadavg (the machine may be busy: say so).
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "PASS"
    } else {
        "MISS"
    }
}

/// Results of the throughput section.
struct Threads<'a> {
    t1: f64,
    t2: f64,
    tcpu: &'a BTreeMap<String, f64>,
    fast_hit_rate: f64,
}

fn print_human(
    lk: &BTreeMap<String, f64>,
    rd: &BTreeMap<String, f64>,
    inv: &BTreeMap<String, f64>,
    th: &Threads<'_>,
    mem: &Mem,
    p: &Params,
    ran: &dyn Fn(&str) -> bool,
) {
    let skipped = |what: &str| println!("{what}: skipped (--only)");
    let (t1, t2, tcpu, fast_hit_rate) = (th.t1, th.t2, th.tcpu, th.fast_hit_rate);
    println!(
        "dircache bench lookup: medians of {} rounds x {} lookups, uid 1000, Cache::stat vs fstatat(2); load average {}\n",
        p.rounds,
        p.batch,
        loadavg()
    );
    if !ran("lookups") {
        skipped("lookup (ns)");
    } else {
        println!(
            "{:<36} {:>9} {:>9} {:>9} {:>10} {:>11}",
            "lookup (ns)", "fast", "slow", "kernel", "slow/fast", "kernel/fast"
        );
        let mut rows: Vec<(String, String)> = DEPTHS
            .iter()
            .map(|d| (format!("depth {d}"), format!("d{d}")))
            .collect();
        for s in &SPECIALS {
            rows.push((
                format!("{} ({})", s.key, s.what.split(',').next().unwrap_or("")),
                s.key.to_string(),
            ));
        }
        for (label, key) in rows {
            let (f, s, k) = (
                get(lk, &format!("fast.{key}")),
                get(lk, &format!("slow.{key}")),
                get(lk, &format!("kernel.{key}")),
            );
            println!(
                "{label:<36} {f:>9.1} {s:>9.1} {k:>9.1} {:>9.2}x {:>10.2}x",
                s / f,
                k / f
            );
        }
        println!(
            "{:<36} {:>9.1} {:>9.1}   (Cache::lookup, returns a dentry reference)",
            "depth 8, NodeRef",
            get(lk, "fast_noderef.d8"),
            get(lk, "slow_noderef.d8")
        );
    }
    println!();
    if !ran("readdir") {
        skipped("readdir (us)");
    } else {
        println!(
            "{:<36} {:>9} {:>9} {:>10}",
            "readdir (us)", "cache", "getdents", "gd/cache"
        );
        for n in READDIR_SIZES {
            let (c, g) = (
                get(rd, &format!("cache.{n}")),
                get(rd, &format!("getdents.{n}")),
            );
            println!(
                "{:<36} {c:>9.2} {g:>9.2} {:>9.2}x",
                format!("{n} entries"),
                g / c
            );
        }
    }
    println!();
    if !ran("invalidate") {
        skipped("invalidate (us)");
    } else {
        println!(
            "{:<36} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "invalidate (us)", "total", "cache", "backend", "syscall", "entries"
        );
        println!("{:<36}", "  total = Cache op on the local backend; cache = same with the backend's mutations stubbed;\n  backend = LocalBackend op alone, no cache; syscall = bare fchmodat/renameat; entries = invalidated_entries counted by the cache");
        for op in ["chmod", "rename"] {
            for n in INV_SIZES {
                println!(
                    "{:<36} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.0}",
                    format!("{op}, {n} cached descendants"),
                    get(inv, &format!("{op}.cache.{n}")),
                    get(inv, &format!("{op}.stub.{n}")),
                    get(inv, &format!("{op}.backend.{n}")),
                    get(inv, &format!("{op}.sys.{n}")),
                    get(inv, &format!("{op}.invalidated.{n}"))
                );
            }
        }
    }
    println!();
    if !ran("threads") {
        skipped("throughput");
    } else {
        println!(
        "throughput (lookups/s, source-tree paths round-robin): 1 thread {t1:.0}, 2 threads {t2:.0} ({:.2}x)",
        t2 / t1
    );
        println!(
        "  {fast_hit_rate:.1}% of these lookups were fast-path hits (the rest: prefix-check cache misses, slow path)"
    );
        let (c1, c2) = (get(tcpu, "cache.cpu.1"), get(tcpu, "cache.cpu.2"));
        let (k1, k2) = (get(tcpu, "kernel.wall.1"), get(tcpu, "kernel.wall.2"));
        let (kc1, kc2) = (get(tcpu, "kernel.cpu.1"), get(tcpu, "kernel.cpu.2"));
        println!("  per CPU-second of the threads: 1 thread {c1:.0}, 2 threads {c2:.0} ({:.2}x: below 1 = contention)", c2 / c1);
        println!(
        "  control, kernel fstatat: 1 thread {k1:.0}/s, 2 threads {k2:.0}/s ({:.2}x); per CPU-second {kc1:.0} vs {kc2:.0}",
        k2 / k1
    );
    }
    if !ran("memory") {
        skipped("memory");
    } else {
        println!(
        "memory: {} live bytes for {} dentries = {:.1} bytes/dentry ({:.1} excluding Cache::new's {} bytes; cache's own estimate {} bytes)",
        mem.bytes,
        if mem.entries_reported > 0 { mem.entries_reported } else { mem.entries_expected },
        mem.per_dentry,
        mem.marginal,
        mem.after_new,
        mem.stats_bytes
    );
        println!(
            "  allocator footprint (glibc usable size + 8-byte chunk header per block): {:.1} bytes/dentry",
            mem.footprint
        );
    }

    let f8 = get(lk, "fast.d8");
    let s8 = get(lk, "slow.d8");
    let f1 = get(lk, "fast.d1");
    let f16 = get(lk, "fast.d16");
    let ch = get(inv, "chmod.cache.10000");
    let rn = get(inv, "rename.cache.10000");
    let chs = get(inv, "chmod.stub.10000");
    let rns = get(inv, "rename.stub.10000");
    println!("\ntargets (issue 2):");
    // One verdict line per target; a target whose section did not run says so.
    let target = |section: &str, ok: bool, text: String| {
        if ran(section) {
            println!("  {} {text}", verdict(ok));
        } else {
            println!(
                "  SKIP {} (section {section} not run)",
                text.split(':').next().unwrap_or(&text)
            );
        }
    };
    target(
        "lookups",
        f8 <= 60.0,
        format!("8-component fast lookup <= 60 ns: {f8:.1} ns"),
    );
    target(
        "lookups",
        s8 / f8 >= 3.0,
        format!("8-component fast >= 3x slow path: {:.2}x", s8 / f8),
    );
    target(
        "lookups",
        f16 <= 1.5 * f1,
        format!(
            "depth 16 <= 1.5x depth 1: {:.2}x ({f16:.1} / {f1:.1} ns)",
            f16 / f1
        ),
    );
    target(
        "invalidate",
        ch <= 33.0,
        format!("chmod, 10,000 cached descendants <= 33 us: {ch:.1} us (cache part {chs:.1} us)"),
    );
    target(
        "invalidate",
        rn <= 33.0,
        format!("rename, 10,000 cached descendants <= 33 us: {rn:.1} us (cache part {rns:.1} us)"),
    );
    target(
        "threads",
        t2 >= 1.8 * t1,
        format!("2 threads >= 1.8x 1 thread: {:.2}x", t2 / t1),
    );
    target(
        "memory",
        mem.per_dentry <= 256.0,
        format!("<= 256 bytes per dentry: {:.1}", mem.per_dentry),
    );
}
