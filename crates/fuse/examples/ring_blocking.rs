//! `ring_blocking`: what a backend call that blocks costs the other requests of its CPU, over
//! `/dev/fuse` and over FUSE over io_uring with and without spare servers (docs/opens.md,
//! "Spare servers per queue").
//!
//! Mounts, in this process and side by side, dircache over an in-memory backend whose LOOKUPs
//! of names starting with `slow` sleep `--delay-ms` (a remote round trip, a slow disk), once
//! per system: `dev` (`-o noio_uring`: four `/dev/fuse` readers), `ring1` (`io_uring` with
//! `threads=1`: one server per queue, no spare, as the ring was before the spares) and `ring`
//! (`io_uring`, the default `threads=4`: one server per queue, a spare once a request was slow
//! — here the first slow LOOKUP —, up to four). Every caller
//! thread is pinned to one CPU, so that on the ring all requests go to one queue. Per round,
//! in rotating order:
//!
//! * `stat beside slow`: one thread looks up new `slow` names back to back while another
//!   forces `stat` of a cached file (a GETATTR answered from memory) for `--ms` ms: stats
//!   done and their median and 99th-percentile time;
//! * `4 slow callers`: four threads each look up `--slow` new `slow` names: elapsed time.
//!
//! Prints medians over the rounds and the requests served from ring entries. Needs root and
//! `/dev/fuse`; sets `/sys/module/fuse/parameters/enable_uring` to Y for the run and puts the
//! old value back when it ends (also on error or panic). Mounts are unmounted on the way out.
//!
//! ```text
//! cargo run --release -p dircache-fuse --example ring_blocking -- --rounds 5
//! ```

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use dircache_core::memory::MemoryBackend;
use dircache_core::{Attr, Backend, Cred, DirEntry, RenameMode, SetAttr};
use dircache_fuse::CachePolicy;

const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

#[derive(Parser)]
struct Args {
    /// Interleaved rounds.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Time a backend LOOKUP of a `slow` name takes, in ms.
    #[arg(long, default_value_t = 2)]
    delay_ms: u64,
    /// Length of the `stat beside slow` loop, in ms.
    #[arg(long, default_value_t = 500)]
    ms: u64,
    /// Slow lookups per caller in `4 slow callers`.
    #[arg(long, default_value_t = 50)]
    slow: usize,
    /// The CPU every caller runs on (default: the first this process may use).
    #[arg(long)]
    cpu: Option<usize>,
}

/// The in-memory backend; LOOKUPs of names starting with `slow` sleep first.
struct Slow {
    inner: MemoryBackend,
    delay: Duration,
    lookups: AtomicU64,
}

impl Backend for Slow {
    fn lookup(&self, dir: &[u8], name: &[u8]) -> dircache_core::Result<Attr> {
        if name.starts_with(b"slow") {
            self.lookups.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(self.delay);
        }
        self.inner.lookup(dir, name)
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
    fn mknod(&self, c: &Cred, p: &[u8], mode: u32, rdev: u64) -> dircache_core::Result<Attr> {
        self.inner.mknod(c, p, mode, rdev)
    }
    fn mkdir(&self, c: &Cred, p: &[u8], mode: u32) -> dircache_core::Result<Attr> {
        self.inner.mkdir(c, p, mode)
    }
    fn symlink(&self, c: &Cred, t: &[u8], p: &[u8]) -> dircache_core::Result<Attr> {
        self.inner.symlink(c, t, p)
    }
    fn link(&self, c: &Cred, old: &[u8], new: &[u8]) -> dircache_core::Result<Attr> {
        self.inner.link(c, old, new)
    }
    fn unlink(&self, c: &Cred, p: &[u8]) -> dircache_core::Result<()> {
        self.inner.unlink(c, p)
    }
    fn rmdir(&self, c: &Cred, p: &[u8]) -> dircache_core::Result<()> {
        self.inner.rmdir(c, p)
    }
    fn rename(&self, c: &Cred, o: &[u8], n: &[u8], m: RenameMode) -> dircache_core::Result<()> {
        self.inner.rename(c, o, n, m)
    }
    fn setattr(&self, c: &Cred, p: &[u8], s: &SetAttr) -> dircache_core::Result<Attr> {
        self.inner.setattr(c, p, s)
    }
}

/// Sets `enable_uring` to Y; puts the old value back when dropped.
struct EnableUring(String);

impl EnableUring {
    fn on() -> Result<EnableUring> {
        let old = std::fs::read_to_string(ENABLE_URING).context(ENABLE_URING)?;
        std::fs::write(ENABLE_URING, "Y").context("set enable_uring")?;
        println!("enable_uring: {} before, Y for the run", old.trim());
        Ok(EnableUring(old.trim().to_string()))
    }
}

impl Drop for EnableUring {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(ENABLE_URING, &self.0) {
            eprintln!("could not restore {ENABLE_URING} to {}: {e}", self.0);
        }
        let now = std::fs::read_to_string(ENABLE_URING).unwrap_or_default();
        println!("enable_uring: {} after", now.trim());
    }
}

/// One system's mount; unmounted (and its session joined) when dropped.
struct Mount {
    name: &'static str,
    mnt: PathBuf,
    backend: Arc<Slow>,
    thread: Option<std::thread::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Mount {
    fn new(name: &'static str, policy: CachePolicy, delay: Duration) -> Result<Mount> {
        let dir = tempfile::Builder::new().prefix("dcblock").tempdir()?;
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt)?;
        let inner = MemoryBackend::new();
        let root = Cred::root();
        inner.mkdir(&root, b"s", 0o755)?;
        inner.mknod(&root, b"a", 0o100644, 0)?;
        let backend = Arc::new(Slow {
            inner,
            delay,
            lookups: AtomicU64::new(0),
        });
        let cache = dircache_core::Cache::new(backend.clone(), Default::default())?;
        let mut cfg = dircache_fuse::MountConfig::without_src(&mnt);
        cfg.policy = policy;
        let mounted = dircache_fuse::mount(cache, &cfg)?;
        let thread = std::thread::spawn(move || {
            if let Err(e) = mounted.run() {
                eprintln!("session: {e}");
            }
        });
        Ok(Mount {
            name,
            mnt,
            backend,
            thread: Some(thread),
            _dir: dir,
        })
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if dircache_fuse::unmount(&self.mnt).is_err() {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.mnt)
                .status();
        }
        if let Some(t) = self.thread.take() {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !t.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if t.is_finished() {
                let _ = t.join();
            }
        }
    }
}

fn pin(cpu: usize) {
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    if let Err(e) = rustix::thread::sched_setaffinity(None, &set) {
        eprintln!("sched_setaffinity: {e}");
    }
}

fn forced_stat(p: &Path) -> std::io::Result<()> {
    rustix::fs::statx(
        rustix::fs::CWD,
        p,
        rustix::fs::AtFlags::STATX_FORCE_SYNC,
        rustix::fs::StatxFlags::BASIC_STATS,
    )
    .map(|_| ())
    .map_err(std::io::Error::from)
}

/// Fresh `slow` names: never looked up before on any mount.
static NAME: AtomicU64 = AtomicU64::new(0);

fn slow_lookup(m: &Path) {
    let n = NAME.fetch_add(1, Ordering::Relaxed);
    // A missing name: ENOENT after the backend's delay.
    let _ = std::fs::symlink_metadata(m.join(format!("s/slow{n}")));
}

/// Stats of `a` while another thread looks up slow names: (stats, median µs, p99 µs).
fn stat_beside_slow(m: &Mount, cpu: usize, ms: u64) -> (usize, f64, f64) {
    let stop = Arc::new(AtomicBool::new(false));
    let (mnt, s2) = (m.mnt.clone(), stop.clone());
    let slow = std::thread::spawn(move || {
        pin(cpu);
        while !s2.load(Ordering::Relaxed) {
            slow_lookup(&mnt);
        }
    });
    let a = m.mnt.join("a");
    let (mnt, s3) = (a.clone(), stop.clone());
    let stats = std::thread::spawn(move || {
        pin(cpu);
        // Let the slow caller start first.
        std::thread::sleep(Duration::from_millis(20));
        let end = Instant::now() + Duration::from_millis(ms);
        let mut times = Vec::new();
        while Instant::now() < end {
            let t0 = Instant::now();
            forced_stat(&mnt).expect("stat a");
            times.push(t0.elapsed().as_secs_f64() * 1e6);
        }
        s3.store(true, Ordering::Relaxed);
        times
    });
    let mut times = stats.join().expect("stat thread");
    slow.join().expect("slow thread");
    times.sort_by(f64::total_cmp);
    let q = |f: f64| times[((times.len() - 1) as f64 * f) as usize];
    (times.len(), q(0.5), q(0.99))
}

/// Four callers, `n` slow lookups each: elapsed ms.
fn slow_callers(m: &Mount, cpu: usize, n: usize) -> f64 {
    let t0 = Instant::now();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let mnt = m.mnt.clone();
            std::thread::spawn(move || {
                pin(cpu);
                for _ in 0..n {
                    slow_lookup(&mnt);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("caller");
    }
    t0.elapsed().as_secs_f64() * 1e3
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<()> {
    let args = Args::parse();
    let cpu = args.cpu.unwrap_or_else(|| {
        let set = rustix::thread::sched_getaffinity(None).expect("sched_getaffinity");
        (0..rustix::thread::CpuSet::MAX_CPU)
            .find(|&c| set.is_set(c))
            .unwrap_or(0)
    });
    let delay = Duration::from_millis(args.delay_ms);
    let _uring = EnableUring::on()?;
    // The missing names must be backend LOOKUPs: no listing made on lookups, no prefetch.
    let base = CachePolicy {
        lookahead: false,
        prefetch_threads: 0,
        ..CachePolicy::default()
    };
    let mounts = [
        Mount::new(
            "dev",
            CachePolicy {
                io_uring: false,
                ..base.clone()
            },
            delay,
        )?,
        Mount::new(
            "ring1",
            CachePolicy {
                io_uring: true,
                threads: 1,
                ..base.clone()
            },
            delay,
        )?,
        Mount::new(
            "ring",
            CachePolicy {
                io_uring: true,
                ..base.clone()
            },
            delay,
        )?,
    ];
    for m in &mounts {
        forced_stat(&m.mnt.join("a")).context("first stat")?;
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "CPU {cpu}, backend LOOKUP delay {} ms, {} rounds, load {}",
        args.delay_ms,
        args.rounds,
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let n = mounts.len();
    let mut stat_n = vec![Vec::new(); n];
    let mut stat_med = vec![Vec::new(); n];
    let mut stat_p99 = vec![Vec::new(); n];
    let mut callers = vec![Vec::new(); n];
    let mut ring_served = vec![0u64; n];
    let mut slow_calls = vec![0u64; n];
    for round in 0..args.rounds {
        for k in 0..n {
            let i = (round + k) % n;
            let m = &mounts[i];
            let (served0, calls0) = (
                fuser::uring_requests_served(),
                m.backend.lookups.load(Ordering::Relaxed),
            );
            let (count, med, p99) = stat_beside_slow(m, cpu, args.ms);
            stat_n[i].push(count as f64);
            stat_med[i].push(med);
            stat_p99[i].push(p99);
            callers[i].push(slow_callers(m, cpu, args.slow));
            ring_served[i] += fuser::uring_requests_served() - served0;
            slow_calls[i] += m.backend.lookups.load(Ordering::Relaxed) - calls0;
        }
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "load after {}; servers added to ring queues: {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
        fuser::uring_servers_added()
    );
    println!(
        "{:<6} {:>12} {:>12} {:>12} {:>16} {:>14} {:>14}",
        "system",
        "stats/run",
        "stat med us",
        "stat p99 us",
        "4 callers ms",
        "ring requests",
        "slow lookups"
    );
    for (i, m) in mounts.iter().enumerate() {
        println!(
            "{:<6} {:>12.0} {:>12.1} {:>12.1} {:>16.1} {:>14} {:>14}",
            m.name,
            median(&mut stat_n[i]),
            median(&mut stat_med[i]),
            median(&mut stat_p99[i]),
            median(&mut callers[i]),
            ring_served[i] / args.rounds as u64,
            slow_calls[i] / args.rounds as u64,
        );
    }
    println!(
        "(medians over rounds; ring requests and slow lookups per round; 4 callers ideal: {} ms \
         serialised, {} ms four at a time)",
        4 * args.slow as u64 * args.delay_ms,
        args.slow as u64 * args.delay_ms
    );
    Ok(())
}
