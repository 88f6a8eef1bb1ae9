//! `dircache bench remote`: metadata workloads on a tree served over ssh, side by side:
//! local native, sshfs (defaults), sshfs `-o kernel_cache,dir_cache=yes`, and a dircache
//! remote mount (`dircache mount user@host:path MNT -o port=..,IdentityFile=..,serve_command=..`,
//! reported as unavailable while this binary does not serve remote sources) (issue 10).
//! On request (`--systems ...,dircache-local`), a local dircache mount of the served tree
//! too: a remote warm run's FUSE requests side by side with a local mount's.
//!
//! Method. A throwaway sshd on loopback (`dircache_tests::sshd`, generated keys) serves the
//! tree; every ssh connection goes through a TCP delay proxy (`dircache_tests::delay_proxy`)
//! that adds RTT/2 each way (at RTT 0 the relay is still there, without delay) and counts
//! bytes and bursts: round trips = client-to-server bursts, an approximation that counts
//! requests sent together while waiting as one. Each mounted system has its own proxy, so its
//! traffic is its own. For every RTT, every workload, cold then warm: `runs` rounds, each
//! running the workload once per system in a rotated order. Cold: `echo 3 >
//! /proc/sys/vm/drop_caches` empties the page, inode and dentry caches of client and server
//! alike (one machine), then the mount is unmounted and mounted again (a new ssh connection,
//! so a new sftp-server / dircache serve process too) and the workload starts as soon as the
//! mount is up: what a client fetches in the background from the mount on (dircache fetches
//! the tree's metadata) overlaps the timed run, and its traffic (with the ssh handshake, for
//! every system alike) is counted in the cold run's bytes and round trips. Native is cold
//! after drop_caches. Warm: one untimed run first; a warm run with a drop_caches by another
//! program on the machine since the system's previous run (or during it: /proc/vmstat's drop
//! counters) is done again after an untimed run, up to 5 times (`outside_drops::warm_run`).
//! Programs are timed by wall time (fork and exec included); the stat/open loops run in a
//! hidden subcommand of this binary that times its own loop over a list of paths.
//!
//! Every mount is unmounted, every process (sshfs, ssh, dircache, sshd) stopped and the tree
//! removed also on error and on SIGINT/SIGTERM (checked between runs).

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use dircache_tests::child_mount::ChildMount;
use dircache_tests::delay_proxy::{DelayProxy, Traffic};
use dircache_tests::sshd::{sshd_available, which, Sshd};
use serde_json::json;

use super::plot::{self, PlotFile};
use super::progress::{interleaved_rounds, Progress};
use super::stats::{self, median_u64};
use super::tree::{self, TempDir};
use super::{drop_caches, outside_drops};

#[derive(clap::Args)]
pub struct Args {
    /// Round-trip times to add (comma-separated; `0`, `500us`, `1ms`, `5ms`; a bare number is
    /// milliseconds). Each direction gets half.
    #[arg(long, value_delimiter = ',', default_value = "0,1ms")]
    pub rtt: Vec<String>,
    /// Print a JSON list of rows instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also write the JSON rows to this file (with the table on stdout).
    #[arg(long)]
    pub json_out: Option<PathBuf>,
    /// A small tree (3,000 entries) and 2 runs: a smoke run.
    #[arg(long)]
    pub quick: bool,
    /// Timed runs per workload, system, RTT and cache state (default 3, 2 with --quick).
    #[arg(long)]
    pub runs: Option<usize>,
    /// Entries of the generated tree (default 80,000, 3,000 with --quick).
    #[arg(long)]
    pub entries: Option<usize>,
    /// Serve this existing tree instead of a generated one (read-only workloads only; git
    /// status needs a git work tree at its top).
    #[arg(long)]
    pub src: Option<PathBuf>,
    /// Paths per stat/open loop (default 2,000, 300 with --quick).
    #[arg(long)]
    pub loop_paths: Option<usize>,
    /// Opens of the 1 MB file per run of `open+read 1MB` (20 opens are a timed window of
    /// 1-2 ms, which one preemption on a loaded machine can double).
    #[arg(long, default_value_t = BLOB_OPENS)]
    pub blob_opens: usize,
    /// Only workloads whose name contains one of these (comma-separated) strings.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Only these systems (comma-separated: native, sshfs, sshfs-cache, dircache,
    /// dircache-base, dircache-local). `dircache-local` (a local dircache mount of the served
    /// tree, no ssh: what the remote mount's warm FUSE requests are compared with) runs only
    /// when named here.
    #[arg(long, value_delimiter = ',')]
    pub systems: Vec<String>,
    /// Directory for the temporary tree and mount points (default: $TMPDIR or /tmp).
    #[arg(long)]
    pub base: Option<PathBuf>,
    /// The dircache binary the server runs (`-o serve_command=`; default: this binary).
    #[arg(long)]
    pub serve_command: Option<PathBuf>,
    /// Also run system `dircache-base`: a remote mount by this dircache binary (client and
    /// server), for a change measured against its base in the same interleaved rounds.
    #[arg(long, value_name = "PATH")]
    pub base_binary: Option<PathBuf>,
    /// Cache states to run (comma-separated: cold, warm).
    #[arg(long, value_delimiter = ',', default_value = "cold,warm")]
    pub cache: Vec<String>,
    /// Give up on one run after this many seconds (the run's process is killed).
    #[arg(long, default_value_t = 900)]
    pub timeout: u64,
    /// Also draw the results into this SVG file: bars of the time ratio to native per
    /// workload, system and RTT, log scale.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
}

/// The hidden loop's arguments (`dircache bench remote-loop`).
#[derive(clap::Args)]
pub struct LoopArgs {
    /// stat | open-read | uncached-read (open, drop the file's cached pages with
    /// POSIX_FADV_DONTNEED, read, close: every read a page-cache miss)
    #[arg(long)]
    pub mode: String,
    /// Directory to chdir into first.
    #[arg(long)]
    pub dir: PathBuf,
    /// The paths are expected not to exist (stat): fail if one does.
    #[arg(long)]
    pub missing: bool,
    /// File with one path (relative to --dir) per line.
    pub list: PathBuf,
    /// Also count the CPU time this process's threads (a mount's daemon) spend during the
    /// loop.
    #[arg(long)]
    pub cpu_of: Option<u32>,
}

/// `dircache bench remote-loop`: stat (lstat) or open+read+close each listed path once;
/// prints the seconds the loop took and the CPU seconds this process spent in it.
pub fn run_loop(a: LoopArgs) -> Result<i32> {
    let list = fs::read_to_string(&a.list).with_context(|| format!("{}", a.list.display()))?;
    let paths: Vec<&str> = list.lines().filter(|l| !l.is_empty()).collect();
    std::env::set_current_dir(&a.dir).with_context(|| format!("chdir {}", a.dir.display()))?;
    let mut buf = vec![0u8; 1 << 16];
    let mut wrong = 0usize;
    let of = a.cpu_of.map(|p| p.to_string());
    let other0 = of.as_deref().and_then(task_cpu);
    let cpu0 = own_cpu();
    let t = Instant::now();
    match a.mode.as_str() {
        "stat" => {
            for p in &paths {
                let exists = fs::symlink_metadata(p).is_ok();
                if exists == a.missing {
                    wrong += 1;
                }
            }
        }
        "open-read" => {
            for p in &paths {
                match fs::File::open(p) {
                    Ok(mut f) => while f.read(&mut buf)? > 0 {},
                    Err(_) => wrong += 1,
                }
            }
        }
        "uncached-read" => {
            for p in &paths {
                match fs::File::open(p) {
                    Ok(mut f) => {
                        rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed)?;
                        while f.read(&mut buf)? > 0 {}
                    }
                    Err(_) => wrong += 1,
                }
            }
        }
        m => bail!("unknown mode {m}"),
    }
    let secs = t.elapsed().as_secs_f64();
    let cpu = own_cpu().saturating_sub(cpu0);
    let other = of.as_deref().and_then(task_cpu).zip(other0);
    let cpu = cpu
        + other.map_or(Duration::ZERO, |(b, a)| {
            Duration::from_nanos(b.saturating_sub(a))
        });
    if wrong > 0 {
        bail!(
            "{wrong} of {} paths were {}",
            paths.len(),
            if a.missing { "present" } else { "missing" }
        );
    }
    println!("{secs} {}", cpu.as_secs_f64());
    Ok(0)
}

/// CPU time this process has used so far (up to date for its running thread too, unlike
/// `/proc/self/schedstat`, which moves at ticks and context switches).
fn own_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// Nanoseconds the threads of process `pid` have run on a CPU so far (the first field of each
/// `/proc/PID/task/TID/schedstat`, summed; up to date for threads that are not running, as
/// a mount's daemon mostly is between the loop's requests): a loop's cost in CPU time, apart
/// from how long it waited for a CPU on a loaded machine.
fn task_cpu(pid: &str) -> Option<u64> {
    let mut sum = 0u64;
    for t in fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let Ok(t) = t else { continue };
        // A thread that exited meanwhile: its time is in no file any more.
        let Ok(st) = fs::read_to_string(t.path().join("schedstat")) else {
            continue;
        };
        sum += st.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(sum)
}

// ---------------------------------------------------------------------------------- signals

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// SIGINT/SIGTERM set [`STOP`]; the bench checks it between runs and unwinds (dropping every
/// mount, process and temporary directory) instead of dying with them in place.
fn catch_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: installs an async-signal-safe handler (one atomic store); the sigaction
        // struct is zeroed and then filled in.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

fn check_stop() -> Result<()> {
    if STOP.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------- systems

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Sys {
    Native,
    Sshfs,
    SshfsCache,
    Dircache,
    /// dircache from `--base-binary` (client and server), beside this binary's: a change
    /// measured against its base in the same interleaved rounds.
    DircacheBase,
    /// A local dircache mount of the served tree (`dircache mount SRC MNT`, no ssh, no
    /// proxy): the same FUSE front end over the local backend, to tell the remote client's
    /// costs (and warm requests) from FUSE's own. Runs only when named in `--systems`.
    DircacheLocal,
}

impl Sys {
    const ALL: [Sys; 6] = [
        Sys::Native,
        Sys::Sshfs,
        Sys::SshfsCache,
        Sys::Dircache,
        Sys::DircacheBase,
        Sys::DircacheLocal,
    ];

    fn is_dircache(self) -> bool {
        matches!(self, Sys::Dircache | Sys::DircacheBase | Sys::DircacheLocal)
    }

    /// Whether `--systems` (`wanted`) asks for this system: every system but
    /// `dircache-local` when none are named.
    fn wanted(self, wanted: &[String]) -> bool {
        match wanted.is_empty() {
            true => self != Sys::DircacheLocal,
            false => wanted.iter().any(|x| x == self.name()),
        }
    }

    /// Whether the system reaches the served tree over ssh (a mount behind a delay proxy).
    fn is_remote(self) -> bool {
        !matches!(self, Sys::Native | Sys::DircacheLocal)
    }

    fn name(self) -> &'static str {
        match self {
            Sys::Native => "native",
            Sys::Sshfs => "sshfs",
            Sys::SshfsCache => "sshfs-cache",
            Sys::Dircache => "dircache",
            Sys::DircacheBase => "dircache-base",
            Sys::DircacheLocal => "dircache-local",
        }
    }
}

/// One system: where the workloads see the served directory, its mount and proxy.
struct System {
    sys: Sys,
    dir: PathBuf,
    mnt: Option<PathBuf>,
    proxy: Option<DelayProxy>,
    mount: Option<ChildMount>,
    /// Why this system has no results (mount failed).
    unavailable: Option<String>,
}

struct Env {
    exe: PathBuf,
    serve: PathBuf,
    src: PathBuf,
    work: PathBuf,
    sshd: Option<Sshd>,
    timeout: Duration,
    /// `--base-binary`: the `dircache-base` system's client and server.
    base_bin: Option<PathBuf>,
}

impl Env {
    /// The log file of `sys`'s mount process.
    fn log(&self, sys: Sys) -> PathBuf {
        self.work.join(format!("{}.log", sys.name()))
    }

    /// The mount command of `sys` through `port`.
    fn mount_cmd(&self, sys: Sys, port: u16, mnt: &Path) -> Result<Command> {
        if sys == Sys::DircacheLocal {
            let mut c = Command::new(&self.exe);
            c.arg("mount").arg(&self.src).arg(mnt).arg("-f");
            return Ok(c);
        }
        let sshd = self.sshd.as_ref().ok_or_else(|| anyhow!("no sshd"))?;
        Ok(match sys {
            Sys::Sshfs => sshd.sshfs(port, &self.src, mnt, &[]),
            Sys::SshfsCache => sshd.sshfs(port, &self.src, mnt, &["kernel_cache", "dir_cache=yes"]),
            Sys::Dircache | Sys::DircacheBase => {
                let (exe, serve) = match (sys, &self.base_bin) {
                    (Sys::DircacheBase, Some(b)) => (b, b),
                    (Sys::DircacheBase, None) => bail!("no --base-binary"),
                    _ => (&self.exe, &self.serve),
                };
                // The CLI contract of issue 10: sshfs-style options, ssh options passed through.
                let mut c = Command::new(exe);
                c.arg("mount")
                    .arg(format!("{}:{}", sshd.destination(), self.src.display()))
                    .arg(mnt)
                    .arg("-f")
                    .arg("-o")
                    .arg(format!("serve_command={}", serve.display()));
                for o in sshd.mount_options(port) {
                    c.arg("-o").arg(o);
                }
                // Extra mount options for system `dircache` only (e.g. `open=noopen`), so that
                // `dircache-base` (`--base-binary`, possibly this binary) runs without them in
                // the same rounds.
                if let (Sys::Dircache, Some(o)) = (sys, std::env::var_os("DIRCACHE_BENCH_OPTIONS"))
                {
                    c.arg("-o").arg(o);
                }
                c
            }
            Sys::Native | Sys::DircacheLocal => bail!("{} is not a remote mount", sys.name()),
        })
    }

    fn mount(&self, s: &mut System) -> Result<()> {
        let Some(mnt) = &s.mnt else {
            return Ok(());
        };
        let port = match (&s.proxy, s.sys) {
            (Some(proxy), _) => proxy.port(),
            (None, Sys::DircacheLocal) => 0,
            (None, _) => return Ok(()),
        };
        if let Some(mut m) = s.mount.take() {
            m.stop();
        }
        let cmd = self.mount_cmd(s.sys, port, mnt)?;
        let log = self.log(s.sys);
        let m = ChildMount::start(cmd, mnt, &log, Duration::from_secs(60))
            .map_err(|e| anyhow!("{}: {e}", s.sys.name()))?;
        s.mount = Some(m);
        // The mount answers a stat before its control socket answers `dircache stats`: a
        // cold run's request counts would be missing (seen on a local mount).
        if s.sys.is_dircache() {
            let end = Instant::now() + Duration::from_secs(10);
            while mount_stats(mnt).is_none() && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------- workloads

enum Action {
    /// A program; `{D}` is replaced by the system's view of the served directory, `{X}` by
    /// this binary.
    Cmd(Vec<&'static str>),
    /// The hidden loop: mode, list file (in the work dir), paths missing.
    Loop(&'static str, &'static str, bool),
}

struct Workload {
    name: String,
    action: Action,
    /// Operations per run (loops), for a per-operation figure.
    ops: usize,
    /// Needs a git work tree.
    git: bool,
    /// Needs the generated 1 MB file and C project (issue 11's rows).
    project: bool,
    /// Timed with the server cut off (issue 11's disconnected reads): on dircache, the delay
    /// proxy is stopped before the timed run and started again after it; warm only, native
    /// and dircache only.
    disconnected: bool,
}

fn workloads(loop_n: usize, blob_n: usize) -> Vec<Workload> {
    let w = |name: &str, args: Vec<&'static str>| Workload {
        name: name.to_string(),
        action: Action::Cmd(args),
        ops: 1,
        git: false,
        project: false,
        disconnected: false,
    };
    let mut git = w(
        "git status",
        vec![
            "git",
            "-C",
            "{D}",
            "--no-optional-locks",
            "-c",
            "core.checkStat=minimal",
            "-c",
            "core.trustctime=false",
            "status",
            "--porcelain",
        ],
    );
    git.git = true;
    // Issue 11's rows: a cached 1 MB file opened and read (per open), a no-op `make` and a
    // whole `make -j2` of the generated C project.
    let mut make_noop = w("make no-op", vec!["make", "-s", "-C", "{D}/cproj"]);
    make_noop.project = true;
    let mut make_build = w(
        "make -j2 build",
        vec![
            "sh",
            "-c",
            "make -s -C {D}/cproj clean && make -s -j2 -C {D}/cproj",
        ],
    );
    make_build.project = true;
    let blob = Workload {
        name: format!("open+read 1MB x{blob_n}"),
        action: Action::Loop("open-read", "blob.list", false),
        ops: blob_n,
        git: false,
        project: true,
        disconnected: false,
    };
    vec![
        w("find", vec!["find", "{D}"]),
        w("du -s", vec!["du", "-s", "{D}"]),
        w("ls -lR", vec!["ls", "-lR", "{D}"]),
        git,
        Workload {
            name: format!("stat hit x{loop_n}"),
            action: Action::Loop("stat", "hit.list", false),
            ops: loop_n,
            git: false,
            project: false,
            disconnected: false,
        },
        Workload {
            name: format!("stat miss x{loop_n}"),
            action: Action::Loop("stat", "miss.list", true),
            ops: loop_n,
            git: false,
            project: false,
            disconnected: false,
        },
        Workload {
            name: format!("open+read x{loop_n}"),
            action: Action::Loop("open-read", "hit.list", false),
            ops: loop_n,
            git: false,
            project: false,
            disconnected: false,
        },
        w("find -name '*.c'", vec!["find", "{D}", "-name", "*.c"]),
        w("search '*.c'", vec!["{X}", "search", "{D}", "*.c"]),
        blob,
        make_build,
        make_noop,
        // Every read a page-cache miss (the file's pages dropped after its open): natively a
        // read from the disk, on a remote mount from the container or the server.
        Workload {
            name: format!("uncached open+read x{loop_n}"),
            action: Action::Loop("uncached-read", "hit.list", false),
            ops: loop_n,
            git: false,
            project: false,
            disconnected: false,
        },
        // Last: each of its rounds cuts the connection, and the reconnection after it makes
        // the client forget what it cached (docs/remote.md, "Disconnected operation").
        Workload {
            name: format!("disconnected open+read x{loop_n}"),
            action: Action::Loop("open-read", "hit.list", false),
            ops: loop_n,
            git: false,
            project: false,
            disconnected: true,
        },
        Workload {
            name: format!("disconnected uncached open+read x{loop_n}"),
            action: Action::Loop("uncached-read", "hit.list", false),
            ops: loop_n,
            git: false,
            project: false,
            disconnected: true,
        },
    ]
}

/// The error of a run of a workload that does not apply to the system (its rows are dropped).
const NOT_APPLICABLE: &str = "not applicable";

/// Opens of the 1 MB file per run of its workload.
const BLOB_OPENS: usize = 20;
/// The generated 1 MB file (relative to the tree).
const BLOB: &str = "data/blob-1mb.bin";
/// C files of the generated project.
const C_FILES: usize = 24;

/// A small C project in `dir/cproj`: `C_FILES` .c files with a shared header and a Makefile
/// linking them into one program; ignored by git once built.
fn c_project(dir: &Path) -> Result<()> {
    let p = dir.join("cproj");
    fs::create_dir_all(&p)?;
    fs::write(p.join(".gitignore"), "*.o\nprog\n")?;
    let mut h = String::from("#pragma once\n");
    let mut main = String::from(
        "#include <stdio.h>\n#include \"common.h\"\nint main(void) {\n    long s = 0;\n",
    );
    for i in 0..C_FILES {
        h.push_str(&format!("long f{i}(long x);\n"));
        let mut body = format!("#include \"common.h\"\nlong f{i}(long x) {{\n    long s = x;\n");
        for k in 0..40 {
            body.push_str(&format!("    s = s * {} + {};\n", k + 3, i * 7 + k));
        }
        body.push_str("    return s;\n}\n");
        fs::write(p.join(format!("f{i}.c")), body)?;
        main.push_str(&format!("    s += f{i}({i});\n"));
    }
    main.push_str("    printf(\"%ld\\n\", s);\n    return 0;\n}\n");
    fs::write(p.join("common.h"), h)?;
    fs::write(p.join("main.c"), main)?;
    fs::write(
        p.join("Makefile"),
        "SRCS := $(wildcard *.c)\nOBJS := $(SRCS:.c=.o)\nCFLAGS := -O1\n\n\
         prog: $(OBJS)\n\t$(CC) -o $@ $(OBJS)\n\n%.o: %.c common.h\n\t$(CC) $(CFLAGS) -c -o $@ $<\n\n\
         clean:\n\trm -f $(OBJS) prog\n\n.PHONY: clean\n",
    )?;
    Ok(())
}

/// Generate a source-like tree of about `entries` entries with a git repository (one commit,
/// three files changed since) in `dir`.
fn generate(dir: &Path, entries: usize) -> Result<()> {
    // A module: its directory, a Makefile, 8 parts of 60 files.
    let (parts, files) = (8, 60);
    let per_module = 2 + parts * (1 + files);
    let modules = entries.div_ceil(per_module).max(1);
    tree::source_tree(dir, "src", modules, parts, files)?;
    fs::write(dir.join("README"), "a generated source-like tree\n")?;
    fs::create_dir_all(dir.join("data"))?;
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let blob: Vec<u8> = (0..1_000_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    fs::write(dir.join(BLOB), blob)?;
    c_project(dir)?;
    let git = |args: &[&str]| tree::git(dir, args);
    git(&["init", "-q"])?;
    // No automatic gc in the background after the commit: the `gc` below would find it
    // running and fail ("gc is already running").
    git(&["config", "gc.auto", "0"])?;
    git(&["add", "-A"])?;
    git(&["commit", "-q", "-m", "initial import"])?;
    git(&["gc", "-q"])?;
    for i in 0..3.min(modules) {
        fs::write(
            dir.join(format!("src/module{i:02}/Makefile")),
            format!("obj-y += changed{i}.o\n"),
        )?;
    }
    // Built once, so that `make` is a no-op until the build workload runs.
    let st = Command::new("make")
        .args(["-s", "-j2", "-C"])
        .arg(dir.join("cproj"))
        .stdin(Stdio::null())
        .status()
        .context("make (apt-get install make gcc)")?;
    if !st.success() {
        bail!("building the generated C project failed: {st}");
    }
    Ok(())
}

/// Walk `root` natively: (entries, regular files up to 64 KiB, directories), relative paths,
/// `.git` skipped.
fn survey(root: &Path) -> Result<(usize, Vec<String>, Vec<String>)> {
    let mut entries = 0;
    let mut files = Vec::new();
    let mut dirs = vec![String::new()];
    let mut i = 0;
    while i < dirs.len() {
        let rel = dirs[i].clone();
        i += 1;
        let mut names: Vec<(String, fs::FileType, u64)> = Vec::new();
        for e in fs::read_dir(root.join(&rel))? {
            let e = e?;
            let md = e.metadata()?;
            names.push((
                e.file_name().to_string_lossy().into_owned(),
                md.file_type(),
                md.len(),
            ));
        }
        names.sort_by(|a, b| a.0.cmp(&b.0));
        for (n, ft, len) in names {
            entries += 1;
            let p = if rel.is_empty() {
                n.clone()
            } else {
                format!("{rel}/{n}")
            };
            if ft.is_dir() && n != ".git" {
                dirs.push(p);
            } else if ft.is_file() && len <= 64 << 10 && !p.contains('\n') {
                files.push(p);
            }
        }
    }
    Ok((entries, files, dirs))
}

/// `n` items of `v` spread evenly over it.
fn spread<T: Clone>(v: &[T], n: usize) -> Vec<T> {
    if v.is_empty() {
        return Vec::new();
    }
    (0..n.min(v.len()))
        .map(|i| v[i * v.len() / n.min(v.len())].clone())
        .collect()
}

/// Run `cmd` with a time limit: (wall seconds, stdout). The child is killed by PID when the
/// limit passes or the bench is interrupted.
fn timed(mut cmd: Command, limit: Duration) -> Result<(f64, std::process::Output)> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let t0 = Instant::now();
    let child = cmd.spawn().with_context(|| format!("starting {cmd:?}"))?;
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let r = child.wait_with_output();
        let took = t0.elapsed().as_secs_f64();
        let _ = tx.send((took, r));
    });
    let deadline = Instant::now() + limit;
    loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok((took, r)) => {
                let _ = waiter.join();
                return Ok((took, r?));
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                if Instant::now() >= deadline || STOP.load(Ordering::SeqCst) {
                    if let Ok(p) = i32::try_from(pid) {
                        // SAFETY: kill(2) of our own child by PID (not yet reaped: the waiter
                        // has not returned).
                        unsafe { libc::kill(p, libc::SIGKILL) };
                    }
                    let _ = rx.recv();
                    let _ = waiter.join();
                    check_stop()?;
                    bail!("{cmd:?} did not finish within {limit:?}");
                }
            }
            Err(e) => bail!("waiting for {cmd:?}: {e}"),
        }
    }
}

struct RunResult {
    secs: f64,
    traffic: Option<Traffic>,
    lines: usize,
    /// The client kernel's FUSE requests by kind during the run (dircache only).
    requests: Option<BTreeMap<String, u64>>,
    /// The client's calls and `Hurry` messages during the run (dircache only; cold: since
    /// the mount). The proxy's round trips count bursts, a `Hurry` among them.
    calls: Option<(u64, u64)>,
    /// The client's calls by kind during the run (dircache: `backend.calls_<Kind>`).
    call_kinds: Option<BTreeMap<String, u64>>,
    /// CPU seconds of a loop workload: the loop's own, plus its mount daemon's (dircache).
    cpu: Option<f64>,
}

/// A dircache mount's remote calls so far by kind (`dircache stats`: `backend.calls_<Kind>`;
/// empty for a binary without them).
fn backend_call_kinds(mnt: &Path) -> Option<BTreeMap<String, u64>> {
    let v = mount_stats(mnt)?;
    let o = v["backend"].as_object()?;
    Some(
        o.iter()
            .filter_map(|(k, n)| Some((k.strip_prefix("calls_")?.to_string(), n.as_u64()?)))
            .collect(),
    )
}

/// The counts of `after` less those of `before`, by kind (none that are 0).
fn counts_since(
    after: &BTreeMap<String, u64>,
    before: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(k, n)| {
            (
                k.clone(),
                n.saturating_sub(before.get(k).copied().unwrap_or(0)),
            )
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// A dircache mount's remote calls and hurries so far (`dircache stats`: `backend`).
fn backend_calls(mnt: &Path) -> Option<(u64, u64)> {
    let v = mount_stats(mnt)?;
    let b = &v["backend"];
    Some((
        b["round_trips"].as_u64()?,
        b["bulk_hurries"].as_u64().unwrap_or(0),
    ))
}

/// `dircache stats MNT` of a dircache mount.
fn mount_stats(mnt: &Path) -> Option<serde_json::Value> {
    dircache_fuse::stats::query_mount(mnt, &json!({"op": "stats"}))
        .ok()
        .map(|v| v["stats"].clone())
}

/// The FUSE requests by kind a dircache mount's daemon counted so far.
fn kernel_requests(mnt: &Path) -> Option<BTreeMap<String, u64>> {
    let v = mount_stats(mnt)?;
    let o = v["kernel_requests"]["by_kind"].as_object()?;
    Some(
        o.iter()
            .map(|(k, n)| (k.clone(), n.as_u64().unwrap_or(0)))
            .collect(),
    )
}

/// The requests between two snapshots, less the one GETXATTR by which `dircache stats`
/// finds the daemon of the mount (the second snapshot's own).
fn requests_since(
    after: &BTreeMap<String, u64>,
    before: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    let mut d: BTreeMap<String, u64> = after
        .iter()
        .map(|(k, n)| {
            (
                k.clone(),
                n.saturating_sub(before.get(k).copied().unwrap_or(0)),
            )
        })
        .collect();
    if let Some(g) = d.get_mut("getxattr") {
        *g = g.saturating_sub(1);
    }
    d.retain(|_, n| *n > 0);
    d
}

/// Whether the dircache mount at `mnt` is disconnected now: `backend.offline` of `dircache
/// stats`, or for a binary without it, its log (`log`): more "disconnected from the server"
/// lines than "reconnected after" ones.
fn is_offline(mnt: &Path, log: &Path) -> Option<bool> {
    if let Some(n) = mount_stats(mnt).and_then(|v| v["backend"]["offline"].as_u64()) {
        return Some(n > 0);
    }
    let text = fs::read_to_string(log).ok()?;
    Some(
        text.matches("disconnected from the server:").count()
            > text.matches("reconnected after").count(),
    )
}

/// Wait (at most `limit`) until the dircache mount at `mnt` is offline or online.
fn wait_offline(mnt: &Path, log: &Path, offline: bool, limit: Duration) -> Result<()> {
    let end = Instant::now() + limit;
    loop {
        check_stop()?;
        if is_offline(mnt, log) == Some(offline) {
            return Ok(());
        }
        if Instant::now() > end {
            bail!(
                "the mount did not become {} within {limit:?}",
                if offline { "disconnected" } else { "connected" }
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Cut `s` off its server: its proxy is stopped (every connection shut down, new ones
/// refused) and the mount has seen the loss. Returns the proxy's port and delay.
fn cut_off(env: &Env, s: &mut System) -> Result<(u16, Duration)> {
    let mnt = s.mnt.clone().ok_or_else(|| anyhow!("not a mount"))?;
    let p = s.proxy.take().ok_or_else(|| anyhow!("no proxy"))?;
    let (port, delay) = (p.port(), p.delay());
    drop(p);
    wait_offline(&mnt, &env.log(s.sys), true, Duration::from_secs(30))?;
    Ok((port, delay))
}

/// Undo [`cut_off`]: a proxy on the same port again, and the mount connected.
fn reconnect(env: &Env, s: &mut System, port: u16, delay: Duration) -> Result<()> {
    let sshd = env.sshd.as_ref().ok_or_else(|| anyhow!("no sshd"))?;
    let end = Instant::now() + Duration::from_secs(10);
    let p = loop {
        match DelayProxy::start_with(
            ("127.0.0.1", sshd.port()),
            delay,
            dircache_tests::delay_proxy::DEFAULT_BUFFER,
            ("127.0.0.1", port),
        ) {
            Ok(p) => break p,
            Err(e) if Instant::now() > end => bail!("proxy on port {port} again: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    s.proxy = Some(p);
    if let Some(mnt) = &s.mnt {
        wait_offline(mnt, &env.log(s.sys), false, Duration::from_secs(60))?;
    }
    Ok(())
}

/// Whether a workload's command runs as nobody. `dircache search` never delegates for a caller
/// with CAP_DAC_* (a daemon searches with the caller's ids and no capabilities), so on a
/// dircache mount, as root, it runs as nobody (the generated tree is world-readable: the same
/// results); so does the native row's, so that both pay the same start (before, the dircache
/// rows went through `setpriv`, an exec more than native: ~4 ms of a ~50 ms search) and see
/// the tree as the same user. sshfs mounts are root's without `allow_other`: as root there.
fn search_as_nobody(sys: Sys, args: &[&str], root: bool) -> bool {
    root && args.get(1) == Some(&"search") && (sys.is_dircache() || sys == Sys::Native)
}

/// Run `c` as nobody (uid and gid 65534, no supplementary groups: std drops them when a root
/// parent sets a uid without groups), switched between fork and exec: no launcher program.
fn as_nobody(c: &mut Command) {
    use std::os::unix::process::CommandExt;
    c.uid(65534).gid(65534);
}

fn run_once(env: &Env, s: &mut System, w: &Workload, cold: bool) -> Result<RunResult> {
    check_stop()?;
    // Cold traffic is counted from before the mount (see the module comment).
    let mut before = None;
    if cold {
        drop_caches()?;
        before = s.proxy.as_ref().map(DelayProxy::traffic);
        env.mount(s)?;
    }
    if w.disconnected && !matches!(s.sys, Sys::Native | Sys::Dircache) {
        bail!("{NOT_APPLICABLE} (disconnected reads: native and dircache only)");
    }
    let d = s.dir.to_string_lossy().into_owned();
    // `dircache-base` runs its own commands (`search`: the base's client library too).
    let exe = match (s.sys, &env.base_bin) {
        (Sys::DircacheBase, Some(b)) => b.to_string_lossy().into_owned(),
        _ => env.exe.to_string_lossy().into_owned(),
    };
    // The mount's daemon, whose CPU time a loop counts with its own.
    let daemon = s
        .mount
        .as_ref()
        .and_then(ChildMount::pid)
        .filter(|_| s.sys.is_dircache());
    let make_cmd = || match &w.action {
        Action::Cmd(args) => {
            let prog = args[0].replace("{X}", &exe);
            let mut c = Command::new(&prog);
            if search_as_nobody(s.sys, args, rustix::process::geteuid().is_root()) {
                as_nobody(&mut c);
            }
            c.args(args[1..].iter().map(|a| a.replace("{D}", &d)));
            c
        }
        Action::Loop(mode, list, missing) => {
            let mut c = Command::new(&env.exe);
            c.args(["bench", "remote-loop", "--mode", mode, "--dir", &d]);
            if *missing {
                c.arg("--missing");
            }
            if let Some(p) = daemon {
                c.arg("--cpu-of").arg(p.to_string());
            }
            c.arg(env.work.join(list));
            c
        }
    };
    let cmd = make_cmd();
    if cold {
        // drop_caches evicted the program too: load it again (for every system alike), so
        // "cold" means a cold file system, not a cold program.
        let _ = Command::new(cmd.get_program())
            .arg("--version")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    let dircache_mnt = s.mnt.clone().filter(|_| s.sys.is_dircache());
    // Disconnected reads: the files cached and granted while connected (the reconnection
    // after the previous round made the client forget them, and its forgetting may land
    // after a first pass), until passes make no round trip; then the server cut off.
    let mut cut = None;
    if w.disconnected && s.sys == Sys::Dircache {
        if let Some(mnt) = &dircache_mnt {
            wait_offline(mnt, &env.log(s.sys), false, Duration::from_secs(60))?;
        }
        let (mut passes, mut quiet) = (0, 0);
        // Two quiet passes in a row: nothing the reconnection set off is still landing.
        while quiet < 2 {
            let t0 = s.proxy.as_ref().map(DelayProxy::traffic);
            let (_, out) = timed(make_cmd(), env.timeout)?;
            if !out.status.success() {
                bail!(
                    "{} (connected, untimed) on {}: {} {}",
                    w.name,
                    s.sys.name(),
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            let trips = match (&s.proxy, t0) {
                (Some(p), Some(t0)) => p.traffic().since(&t0).round_trips(),
                _ => 0,
            };
            passes += 1;
            quiet = if trips == 0 { quiet + 1 } else { 0 };
            if quiet < 2 && passes >= 10 {
                bail!(
                    "{}: every connected pass made round trips ({trips} the last)",
                    w.name
                );
            }
        }
        cut = Some(cut_off(env, s)?);
    }
    let before = before.or_else(|| s.proxy.as_ref().map(DelayProxy::traffic));
    let req_before = dircache_mnt.as_deref().and_then(kernel_requests);
    let calls_before = match cold {
        true => Some((0, 0)),
        false => dircache_mnt.as_deref().and_then(backend_calls),
    };
    let kinds_before = match cold {
        true => Some(BTreeMap::new()),
        false => dircache_mnt.as_deref().and_then(backend_call_kinds),
    };
    let res = timed(cmd, env.timeout);
    let req_after = dircache_mnt.as_deref().and_then(kernel_requests);
    let call_kinds = match (
        dircache_mnt.as_deref().and_then(backend_call_kinds),
        kinds_before,
    ) {
        (Some(a), Some(b)) => Some(counts_since(&a, &b)),
        _ => None,
    };
    let calls = match (
        dircache_mnt.as_deref().and_then(backend_calls),
        calls_before,
    ) {
        (Some(a), Some(b)) => Some((a.0.saturating_sub(b.0), a.1.saturating_sub(b.1))),
        _ => None,
    };
    if let Some((port, delay)) = cut {
        reconnect(env, s, port, delay)?;
    }
    let (wall, out) = res?;
    let traffic = match (&s.proxy, before) {
        (Some(p), Some(b)) if cut.is_none() => Some(p.traffic().since(&b)),
        _ => None,
    };
    let requests = match (req_after, req_before) {
        (Some(a), Some(b)) => Some(requests_since(&a, &b)),
        _ => None,
    };
    if !out.status.success() {
        bail!(
            "{} on {}: {} {}",
            w.name,
            s.sys.name(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let (secs, cpu) = match w.action {
        Action::Loop(..) => {
            let so = String::from_utf8_lossy(&out.stdout);
            let mut f = so.split_whitespace().map(str::parse::<f64>);
            let secs = f
                .next()
                .and_then(Result::ok)
                .ok_or_else(|| anyhow!("remote-loop printed {so:?}"))?;
            (secs, f.next().and_then(Result::ok))
        }
        Action::Cmd(_) => (wall, None),
    };
    Ok(RunResult {
        secs,
        traffic,
        lines: out.stdout.as_slice().lines().count(),
        requests,
        calls,
        call_kinds,
        cpu,
    })
}

struct Row {
    workload: String,
    system: &'static str,
    rtt_ms: f64,
    cache: &'static str,
    times: Vec<f64>,
    round_trips: Vec<u64>,
    bytes: Vec<u64>,
    /// The client kernel's FUSE requests by kind, per run (dircache).
    requests: Vec<BTreeMap<String, u64>>,
    /// The client's calls and hurries, per run (dircache).
    calls: Vec<(u64, u64)>,
    /// The client's calls by kind, per run (dircache).
    call_kinds: Vec<BTreeMap<String, u64>>,
    /// CPU seconds per run of a loop workload (the loop's, plus its mount daemon's).
    cpu: Vec<f64>,
    ops: usize,
    lines: Option<usize>,
    error: Option<String>,
    /// Untimed runs added to warm the caches again after a drop by another program
    /// (`outside_drops::warm_run`).
    rewarmed: usize,
}

/// "1ms", "500us", "0.5", "2s" → seconds; a bare number is milliseconds.
fn parse_rtt(s: &str) -> Result<Duration> {
    let s = s.trim();
    let (num, mult) = if let Some(v) = s.strip_suffix("us") {
        (v, 1e-6)
    } else if let Some(v) = s.strip_suffix("ms") {
        (v, 1e-3)
    } else if let Some(v) = s.strip_suffix('s') {
        (v, 1.0)
    } else {
        (s, 1e-3)
    };
    let x: f64 = num
        .trim()
        .parse()
        .map_err(|_| anyhow!("bad --rtt value {s:?} (e.g. 0, 500us, 1ms, 5ms)"))?;
    if !(0.0..=10.0).contains(&(x * mult)) {
        bail!("--rtt {s}: between 0 and 10 s");
    }
    Ok(Duration::from_secs_f64(x * mult))
}

pub fn run(a: Args) -> Result<i32> {
    // Opened first: a path that cannot be written fails before any measuring.
    let plot = a.plot.as_deref().map(PlotFile::create).transpose()?;
    let note = |s: &str| eprintln!("bench remote: {s}");
    let runs = a.runs.unwrap_or(if a.quick { 2 } else { 3 }).max(1);
    let rtts: Vec<Duration> = a.rtt.iter().map(|s| parse_rtt(s)).collect::<Result<_>>()?;
    let loop_n = a.loop_paths.unwrap_or(if a.quick { 300 } else { 2_000 });
    let entries = a.entries.unwrap_or(if a.quick { 3_000 } else { 80_000 });
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        note("not root: mounts and drop_caches will probably fail");
    }
    catch_signals();
    let base = TempDir::new("bench-remote", a.base.as_deref())?;
    let src = match &a.src {
        Some(s) => fs::canonicalize(s).with_context(|| format!("{}", s.display()))?,
        None => {
            let s = base.path().join("served");
            note(&format!(
                "generating a tree of about {entries} entries in {}",
                s.display()
            ));
            generate(&s, entries)?;
            s
        }
    };
    let (n_entries, files, dirs) = survey(&src)?;
    let hit = spread(&files, loop_n);
    let miss: Vec<String> = spread(&dirs, loop_n.min(dirs.len().max(1)))
        .iter()
        .cycle()
        .take(loop_n)
        .enumerate()
        .map(|(i, d)| {
            if d.is_empty() {
                format!("no-such-file-{i}.c")
            } else {
                format!("{d}/no-such-file-{i}.c")
            }
        })
        .collect();
    fs::write(base.path().join("hit.list"), hit.join("\n") + "\n")?;
    fs::write(base.path().join("miss.list"), miss.join("\n") + "\n")?;
    fs::write(
        base.path().join("blob.list"),
        format!("{BLOB}\n").repeat(a.blob_opens.max(1)),
    )?;
    let has_git = src.join(".git").exists();
    note(&format!(
        "tree {}: {n_entries} entries, {} small files, {} directories{}",
        src.display(),
        files.len(),
        dirs.len(),
        if has_git { ", git work tree" } else { "" }
    ));
    let exe = std::env::current_exe()?;
    let want = |s: Sys| s.wanted(&a.systems);
    let remote_wanted = Sys::ALL.iter().any(|s| s.is_remote() && want(*s));
    let sshd = if remote_wanted {
        if !sshd_available() {
            bail!("openssh-server is not installed (apt-get install openssh-server sshfs)");
        }
        note("starting sshd on loopback");
        Some(Sshd::start_in(base.path()).map_err(|e| anyhow!("sshd: {e}"))?)
    } else {
        None
    };
    let env = Env {
        serve: a.serve_command.clone().unwrap_or_else(|| exe.clone()),
        exe,
        src: src.clone(),
        work: base.path().to_path_buf(),
        sshd,
        timeout: Duration::from_secs(a.timeout.max(1)),
        base_bin: a.base_binary.clone(),
    };
    let has_project = src.join(BLOB).exists() && src.join("cproj/Makefile").exists();
    let result = bench(&a, &env, runs, &rtts, loop_n, has_git, has_project);
    // Unmount (systems dropped inside `bench`), stop sshd, then remove the tree.
    drop(env);
    let rows = result?;
    if let Some(f) = &a.json_out {
        fs::write(f, serde_json::to_string_pretty(&json_rows(&rows))? + "\n")
            .with_context(|| format!("{}", f.display()))?;
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&json_rows(&rows))?);
    } else {
        print_table(&rows, runs, n_entries);
    }
    if let Some(p) = plot {
        let path = p.path().display().to_string();
        p.write(&chart(&rows, runs, n_entries, rtts.len() > 1))?;
        note(&format!("plot written to {path}"));
    }
    Ok(0)
}

/// The `--plot` chart: median time over native's in the same RTT run, per workload and cache
/// state; one series per system (and RTT, when several ran).
fn chart(rows: &[Row], runs: usize, entries: usize, by_rtt: bool) -> plot::Chart {
    let bars = rows
        .iter()
        .filter(|r| r.system != "native" && !r.times.is_empty())
        .filter_map(|r| {
            let n = native_median(rows, r).filter(|n| *n > 0.0)?;
            Some(plot::Bar {
                group: format!("{} ({})", r.workload, r.cache),
                series: if by_rtt {
                    format!("{}, RTT {} ms", r.system, r.rtt_ms)
                } else {
                    r.system.to_string()
                },
                value: stats::median(&r.times) / n,
            })
        })
        .collect();
    plot::Chart {
        title: format!(
            "dircache bench remote: time / native, {entries}-entry tree over ssh, median of \
             {runs} interleaved runs"
        ),
        subtitle: plot::run_parameters(),
        axis: "time / native (log scale; right of 1× = slower than native)".into(),
        groups_axis: "workload (cache state)".into(),
        bars,
    }
}

fn bench(
    a: &Args,
    env: &Env,
    runs: usize,
    rtts: &[Duration],
    loop_n: usize,
    has_git: bool,
    has_project: bool,
) -> Result<Vec<Row>> {
    let progress = Progress::new("bench remote", 0);
    let note = |s: &str| progress.note(&format!("bench remote: {s}"));
    let want = |s: Sys| s.wanted(&a.systems);
    let mut systems: Vec<System> = Vec::new();
    for sys in Sys::ALL {
        if !want(sys) || (sys == Sys::DircacheBase && env.base_bin.is_none()) {
            continue;
        }
        if sys == Sys::Native {
            systems.push(System {
                sys,
                dir: env.src.clone(),
                mnt: None,
                proxy: None,
                mount: None,
                unavailable: None,
            });
            continue;
        }
        if (sys == Sys::Sshfs || sys == Sys::SshfsCache) && which("sshfs").is_none() {
            note("sshfs not installed (apt-get install sshfs): no sshfs rows");
            continue;
        }
        let mnt = env.work.join(format!("mnt-{}", sys.name()));
        let proxy = match sys.is_remote() {
            true => {
                let sshd = env.sshd.as_ref().ok_or_else(|| anyhow!("no sshd"))?;
                Some(DelayProxy::start(
                    ("127.0.0.1", sshd.port()),
                    Duration::ZERO,
                )?)
            }
            false => None,
        };
        let mut s = System {
            sys,
            dir: mnt.clone(),
            mnt: Some(mnt),
            proxy,
            mount: None,
            unavailable: None,
        };
        if let Err(e) = env.mount(&mut s) {
            let msg: String = format!("{e:#}").chars().take(300).collect();
            note(&format!("{} unavailable: {msg}", sys.name()));
            s.unavailable = Some(msg);
        }
        systems.push(s);
    }
    if systems.is_empty() {
        bail!("no system to run on");
    }
    let wls: Vec<Workload> = workloads(loop_n, a.blob_opens.max(1))
        .into_iter()
        .filter(|w| has_git || !w.git)
        .filter(|w| has_project || !w.project)
        .filter(|w| a.only.is_empty() || a.only.iter().any(|o| w.name.contains(o.as_str())))
        .collect();
    let mut rows: Vec<Row> = Vec::new();
    let states = ["cold", "warm"]
        .iter()
        .filter(|c| a.cache.iter().any(|x| x == *c))
        .count();
    progress.set_total((rtts.len() * wls.len() * states * runs * systems.len()) as u64);
    for &rtt in rtts {
        for s in &systems {
            if let Some(p) = &s.proxy {
                p.set_delay(rtt / 2);
            }
        }
        let rtt_ms = stats::round(rtt.as_secs_f64() * 1e3, 3);
        for w in &wls {
            note(&format!(
                "rtt {rtt_ms} ms: {} ({runs} runs x {} systems x cold/warm)",
                w.name,
                systems.len()
            ));
            for cache in ["cold", "warm"] {
                if !a.cache.iter().any(|c| c == cache) || (w.disconnected && cache == "cold") {
                    continue;
                }
                let cold = cache == "cold";
                let first = rows.len();
                for s in &systems {
                    rows.push(Row {
                        workload: w.name.clone(),
                        system: s.sys.name(),
                        rtt_ms,
                        cache,
                        times: vec![],
                        round_trips: vec![],
                        bytes: vec![],
                        requests: vec![],
                        calls: vec![],
                        call_kinds: vec![],
                        cpu: vec![],
                        ops: w.ops,
                        lines: None,
                        error: s.unavailable.as_ref().map(|u| format!("unavailable: {u}")),
                        rewarmed: 0,
                    });
                }
                // Per system, the drop count before its last warm run (`outside_drops::warm_run`).
                let mut drops = vec![outside_drops::count(); systems.len()];
                if !cold {
                    for (i, s) in systems.iter_mut().enumerate() {
                        if rows[first + i].error.is_some() {
                            continue;
                        }
                        progress.running(format!(
                            "RTT {rtt_ms} ms, {} (warm), untimed first run: {}",
                            w.name,
                            s.sys.name()
                        ));
                        match run_once(env, s, w, false) {
                            Ok(r) => rows[first + i].lines = Some(r.lines),
                            Err(e) => {
                                check_stop()?;
                                rows[first + i].error = Some(format!("{e:#}"));
                            }
                        }
                    }
                }
                let names: Vec<&str> = systems.iter().map(|s| s.sys.name()).collect();
                let label = |r: usize, s: &str| {
                    format!(
                        "RTT {rtt_ms} ms, {} ({cache}), round {r}/{runs}: {s}",
                        w.name
                    )
                };
                interleaved_rounds(&progress, runs, &names, label, |i| {
                    if rows[first + i].error.is_some() {
                        return Ok(());
                    }
                    let res = if cold || w.disconnected {
                        run_once(env, &mut systems[i], w, cold)
                    } else {
                        let row = &mut rows[first + i];
                        let s = &mut systems[i];
                        outside_drops::warm_run(&mut drops[i], &mut row.rewarmed, || {
                            run_once(env, s, w, false)
                        })
                    };
                    match res {
                        Ok(res) => {
                            let row = &mut rows[first + i];
                            row.times.push(res.secs);
                            row.lines.get_or_insert(res.lines);
                            if let Some(t) = res.traffic {
                                row.round_trips.push(t.round_trips());
                                row.bytes.push(t.bytes());
                            }
                            if let Some(q) = res.requests {
                                row.requests.push(q);
                            }
                            if let Some(c) = res.calls {
                                row.calls.push(c);
                            }
                            if let Some(k) = res.call_kinds.filter(|k| !k.is_empty()) {
                                row.call_kinds.push(k);
                            }
                            if let Some(c) = res.cpu {
                                row.cpu.push(c);
                            }
                        }
                        Err(e) => {
                            check_stop()?;
                            note(&format!("{e:#}"));
                            rows[first + i].error = Some(format!("{e:#}"));
                        }
                    }
                    Ok(())
                })?;
            }
        }
    }
    for r in rows.iter().filter(|r| r.rewarmed > 0) {
        note(&outside_drops::rewarmed_note(
            &r.workload,
            r.system,
            r.cache,
            r.rewarmed,
        ));
    }
    // Unmount and stop the proxies before printing.
    drop(systems);
    // No rows for systems a workload does not apply to (disconnected reads on sshfs).
    rows.retain(|r| {
        !r.error
            .as_deref()
            .is_some_and(|e| e.starts_with(NOT_APPLICABLE))
    });
    Ok(rows)
}

/// Per kind, the median over runs of the requests of that kind (0 where a run had none);
/// and the median of the runs' totals.
fn median_requests(runs: &[BTreeMap<String, u64>]) -> (BTreeMap<String, u64>, u64) {
    let totals: Vec<u64> = runs.iter().map(|m| m.values().sum()).collect();
    (stats::median_by_kind(runs), stats::median_u64(&totals))
}

fn native_median(rows: &[Row], r: &Row) -> Option<f64> {
    rows.iter()
        .find(|n| {
            n.system == "native"
                && n.workload == r.workload
                && n.cache == r.cache
                && n.rtt_ms == r.rtt_ms
                && !n.times.is_empty()
        })
        .map(|n| stats::median(&n.times))
}

fn json_rows(rows: &[Row]) -> Vec<serde_json::Value> {
    rows
        .iter()
        .map(|r| {
            let has = !r.times.is_empty();
            let med = stats::median(&r.times);
            let mut o = json!({
                "workload": r.workload,
                "system": r.system,
                "rtt_ms": r.rtt_ms,
                "cache": r.cache,
                "median_s": if has { json!(med) } else { json!(null) },
                "min_s": if has { json!(stats::min(&r.times)) } else { json!(null) },
                "max_s": if has { json!(stats::max(&r.times)) } else { json!(null) },
                "runs": r.times.len(),
                "ops": r.ops,
                "ratio_to_native": match native_median(rows, r) {
                    Some(n) if has && n > 0.0 => json!(stats::round(med / n, 3)),
                    _ => json!(null),
                },
                "round_trips": if r.round_trips.is_empty() { json!(null) } else { json!(median_u64(&r.round_trips)) },
                "bytes": if r.bytes.is_empty() { json!(null) } else { json!(median_u64(&r.bytes)) },
                "output_lines": r.lines,
                "cpu_s": if r.cpu.is_empty() { json!(null) } else { json!(stats::median(&r.cpu)) },
            });
            if !r.requests.is_empty() {
                if let Some(m) = o.as_object_mut() {
                    let (by, total) = median_requests(&r.requests);
                    m.insert("kernel_requests".into(), json!(total));
                    m.insert("kernel_requests_by_kind".into(), json!(by));
                }
            }
            if !r.calls.is_empty() {
                if let Some(m) = o.as_object_mut() {
                    let (c, h): (Vec<u64>, Vec<u64>) = r.calls.iter().copied().unzip();
                    m.insert("calls".into(), json!(median_u64(&c)));
                    m.insert("hurries".into(), json!(median_u64(&h)));
                }
            }
            if !r.call_kinds.is_empty() {
                if let Some(m) = o.as_object_mut() {
                    m.insert(
                        "calls_by_kind".into(),
                        json!(stats::median_by_kind(&r.call_kinds)),
                    );
                }
            }
            if let (true, Some(m)) = (r.rewarmed > 0, o.as_object_mut()) {
                m.insert("rewarmed".into(), json!(r.rewarmed));
            }
            if let (Some(e), Some(m)) = (&r.error, o.as_object_mut()) {
                m.insert("error".into(), json!(e));
            }
            o
        })
        .collect()
}

fn human_bytes(b: u64) -> String {
    if b >= 10 << 20 {
        format!("{}M", b >> 20)
    } else if b >= 10 << 10 {
        format!("{}k", b >> 10)
    } else {
        format!("{b}")
    }
}

fn print_table(rows: &[Row], runs: usize, entries: usize) {
    println!(
        "dircache bench remote: {entries}-entry tree over ssh on loopback through a delay \
         proxy; median of {runs} interleaved runs; x = ratio to native; rt = round trips \
         (client-to-server bursts, a Hurry among them), B = bytes both ways, calls = the dircache \
         client's calls, hurries = its Hurry messages, cpu = CPU time per operation of a loop \
         and its dircache mount's daemon, apart from waiting for a CPU (medians); load average \
         at end {}",
        super::lookup::loadavg()
    );
    let mut by: BTreeMap<(u64, usize, &str), Vec<&Row>> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    for r in rows {
        if !order.contains(&r.workload) {
            order.push(r.workload.clone());
        }
    }
    for r in rows {
        let w = order.iter().position(|o| *o == r.workload).unwrap_or(0);
        by.entry(((r.rtt_ms * 1000.0) as u64, w, r.cache))
            .or_default()
            .push(r);
    }
    let mut unavailable: BTreeMap<&str, String> = BTreeMap::new();
    let mut last_rtt = None;
    for ((rtt_us, w, cache), rs) in &by {
        if last_rtt != Some(*rtt_us) {
            println!("\nRTT {} ms", *rtt_us as f64 / 1000.0);
            last_rtt = Some(*rtt_us);
        }
        let native = rs
            .iter()
            .find(|r| r.system == "native" && !r.times.is_empty())
            .map(|r| stats::median(&r.times));
        let native_lines = rs
            .iter()
            .find(|r| r.system == "native")
            .and_then(|r| r.lines);
        let mut line = format!("{:<20} {:<4}", order[*w], cache);
        for r in rs {
            if let Some(e) = &r.error {
                if let Some(u) = e.strip_prefix("unavailable: ") {
                    unavailable.insert(r.system, u.to_string());
                    line.push_str(&format!(" | {} unavailable", r.system));
                } else {
                    let short: String = e.chars().take(60).collect();
                    line.push_str(&format!(" | {}: ERROR {short}", r.system));
                }
                continue;
            }
            let med = stats::median(&r.times);
            let mut cell = if r.ops > 1 {
                format!(" | {} {:.1}us/op", r.system, med / r.ops as f64 * 1e6)
            } else {
                format!(" | {} {:.3}s", r.system, med)
            };
            if let Some(n) = native {
                if r.system != "native" && n > 0.0 {
                    cell.push_str(&format!(" {:.1}x", med / n));
                }
            }
            if !r.cpu.is_empty() && r.ops > 1 {
                let c = stats::median(&r.cpu) / r.ops as f64 * 1e6;
                cell.push_str(&format!(" cpu {c:.1}us/op"));
            }
            if !r.round_trips.is_empty() {
                cell.push_str(&format!(
                    " rt {} B {}",
                    median_u64(&r.round_trips),
                    human_bytes(median_u64(&r.bytes))
                ));
            }
            if !r.requests.is_empty() {
                cell.push_str(&format!(" req {}", median_requests(&r.requests).1));
            }
            if !r.calls.is_empty() {
                let (c, h): (Vec<u64>, Vec<u64>) = r.calls.iter().copied().unzip();
                cell.push_str(&format!(
                    " calls {} hurries {}",
                    median_u64(&c),
                    median_u64(&h)
                ));
            }
            if let (Some(l), Some(n)) = (r.lines, native_lines) {
                if l != n {
                    cell.push_str(&format!(" (output {l} lines, native {n})"));
                }
            }
            line.push_str(&cell);
        }
        println!("{line}");
    }
    for (s, why) in unavailable {
        println!("\n{s} unavailable: {why}");
    }
    print_requests(rows);
    print_call_kinds(rows);
    print_targets(rows);
}

/// The client's calls per run of each dircache row, by kind (medians): what its round trips
/// are.
fn print_call_kinds(rows: &[Row]) {
    let with: Vec<&Row> = rows.iter().filter(|r| !r.call_kinds.is_empty()).collect();
    if with.is_empty() {
        return;
    }
    println!("\nclient calls per run (dircache, medians by kind; `calls` above):");
    for r in with {
        let by = stats::median_by_kind(&r.call_kinds);
        let kinds: Vec<String> = by.iter().map(|(k, n)| format!("{k} {n}")).collect();
        println!(
            "  RTT {} ms {:<4} {:<20} {:<13} {}",
            r.rtt_ms,
            r.cache,
            r.workload,
            r.system,
            kinds.join(", ")
        );
    }
}

/// The client kernel's FUSE requests per run of each dircache row, by kind (medians): where
/// a warm run's time goes when it makes no round trip.
fn print_requests(rows: &[Row]) {
    let with: Vec<&Row> = rows.iter().filter(|r| !r.requests.is_empty()).collect();
    if with.is_empty() {
        return;
    }
    println!("\nclient kernel FUSE requests per run (dircache, medians by kind; `req` above):");
    for r in with {
        let (by, total) = median_requests(&r.requests);
        let kinds: Vec<String> = by.iter().map(|(k, n)| format!("{k} {n}")).collect();
        println!(
            "  RTT {} ms {:<4} {:<20} {:<13} {total}: {}",
            r.rtt_ms,
            r.cache,
            r.workload,
            r.system,
            kinds.join(", ")
        );
    }
}

/// Issue 10's targets, judged on the dircache rows.
fn print_targets(rows: &[Row]) {
    let find = |w: &str, sys: &str, rtt: f64, cache: &str| -> Option<&Row> {
        rows.iter().find(|r| {
            r.workload == w
                && r.system == sys
                && r.rtt_ms == rtt
                && r.cache == cache
                && !r.times.is_empty()
        })
    };
    let med = |r: &Row| stats::median(&r.times);
    let verdict = |ok: bool| if ok { "PASS" } else { "MISS" };
    if !rows
        .iter()
        .any(|r| r.system == "dircache" && !r.times.is_empty())
    {
        println!("\ntargets (issue 10): no dircache rows, nothing to judge");
        return;
    }
    println!("\ntargets (issue 10):");
    let mut rtts: Vec<f64> = rows.iter().map(|r| r.rtt_ms).collect();
    rtts.sort_by(f64::total_cmp);
    rtts.dedup();
    let metadata = ["find", "du -s", "ls -lR", "git status"];
    if rtts.contains(&1.0) {
        let mut parts = Vec::new();
        let mut ok = true;
        for w in metadata {
            if let (Some(d), Some(s)) = (
                find(w, "dircache", 1.0, "cold"),
                find(w, "sshfs", 1.0, "cold"),
            ) {
                let x = med(s) / med(d);
                ok &= x >= 20.0;
                parts.push(format!("{w} {x:.1}x"));
            }
        }
        if !parts.is_empty() {
            println!(
                "  {} cold metadata at 1 ms RTT >= 20x faster than sshfs: {}",
                verdict(ok),
                parts.join(", ")
            );
        }
    } else {
        println!("  (no 1 ms RTT run: cold metadata vs sshfs not judged; use --rtt 1ms)");
    }
    for &rtt in &rtts {
        let mut over = Vec::new();
        let mut trips = Vec::new();
        let mut judged = 0;
        for r in rows
            .iter()
            .filter(|r| r.system == "dircache" && r.rtt_ms == rtt && r.cache == "warm")
            // Issue 11's row, judged there.
            .filter(|r| !r.workload.starts_with("disconnected"))
        {
            let Some(n) = find(&r.workload, "native", rtt, "warm") else {
                continue;
            };
            if r.times.is_empty() {
                over.push(format!("{} no result", r.workload));
                continue;
            }
            judged += 1;
            let x = med(r) / med(n);
            if x > 1.2 {
                over.push(format!("{} {x:.2}x", r.workload));
            }
            let rt = median_u64(&r.round_trips);
            if rt > 0 {
                trips.push(format!("{} {rt}", r.workload));
            }
        }
        println!(
            "  {} warm at {rtt} ms RTT within 1.2x native, zero round trips: {judged} judged; over: [{}]; round trips: [{}]",
            verdict(over.is_empty() && trips.is_empty() && judged > 0),
            over.join(", "),
            trips.join(", ")
        );
    }
    if rtts.contains(&5.0) {
        for cache in ["cold", "warm"] {
            let w = rows
                .iter()
                .find(|r| r.workload.starts_with("search"))
                .map(|r| r.workload.clone());
            let f = rows
                .iter()
                .find(|r| r.workload.starts_with("find -name"))
                .map(|r| r.workload.clone());
            if let (Some(w), Some(f)) = (w, f) {
                if let (Some(d), Some(s)) = (
                    find(&w, "dircache", 5.0, cache),
                    find(&f, "sshfs", 5.0, cache),
                ) {
                    let x = med(s) / med(d);
                    println!(
                        "  {} {cache} delegated search at 5 ms RTT >= 50x faster than find over sshfs: {x:.1}x",
                        verdict(x >= 50.0)
                    );
                }
            }
        }
    } else {
        println!("  (no 5 ms RTT run: delegated search not judged; use --rtt 5ms)");
    }
    print_targets_11(rows);
}

/// Issue 11's targets (warm, 5 ms RTT): open+read of a cached 1 MB file <= 2x native,
/// `git status` and a no-op `make` <= 1.2x, `make -j2` of a small C project <= 1.5x,
/// disconnected reads (cached small files, the server cut off) at local speed (<= 1.2x).
fn print_targets_11(rows: &[Row]) {
    let find = |pre: &str, sys: &str| -> Option<&Row> {
        rows.iter().find(|r| {
            r.workload.starts_with(pre)
                && r.system == sys
                && r.rtt_ms == 5.0
                && r.cache == "warm"
                && !r.times.is_empty()
        })
    };
    println!("\ntargets (issue 11, warm, 5 ms RTT):");
    let mut any = false;
    for (pre, bound) in [
        ("open+read 1MB", 2.0),
        ("git status", 1.2),
        ("make no-op", 1.2),
        ("make -j2 build", 1.5),
        // "Disconnected reads at local speed": judged as the warm rows are.
        ("disconnected open+read", 1.2),
        ("disconnected uncached open+read", 1.2),
    ] {
        if let (Some(d), Some(n)) = (find(pre, "dircache"), find(pre, "native")) {
            any = true;
            let x = stats::median(&d.times) / stats::median(&n.times);
            let trips = if d.round_trips.is_empty() {
                "the server cut off".to_string()
            } else {
                format!("{} round trips", median_u64(&d.round_trips))
            };
            println!(
                "  {} {pre} within {bound}x native: {x:.2}x ({trips})",
                if x <= bound { "PASS" } else { "MISS" },
            );
        }
    }
    if !any {
        println!("  (no warm 5 ms RTT rows of dircache and native: use --rtt 5ms)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The native and dircache rows of `search` start the same way, as the same user (as
    /// root): the same program, switched to nobody without a launcher; sshfs's stay root's.
    #[test]
    fn search_rows_start_alike_as_nobody() {
        assert!(
            rustix::process::geteuid().is_root(),
            "the bench's tests run as root"
        );
        let id_of = |sys: Sys| {
            let args = ["id", "search"];
            let mut c = Command::new("sh");
            if search_as_nobody(sys, &args, true) {
                as_nobody(&mut c);
            }
            c.args([
                "-c",
                "id -u; id -g; id -G; cat /proc/self/status | grep ^CapEff",
            ]);
            let out = c.output().expect("sh");
            assert!(out.status.success(), "{out:?}");
            (
                c.get_program().to_owned(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
            )
        };
        let nobody = "65534\n65534\n65534\nCapEff:\t0000000000000000\n";
        for sys in [
            Sys::Native,
            Sys::Dircache,
            Sys::DircacheBase,
            Sys::DircacheLocal,
        ] {
            assert_eq!(
                id_of(sys),
                ("sh".into(), nobody.to_string()),
                "{}",
                sys.name()
            );
        }
        assert!(id_of(Sys::Sshfs).1.starts_with("0\n0\n"));
        assert!(!search_as_nobody(Sys::Native, &["find", "{D}"], true));
        assert!(!search_as_nobody(Sys::Dircache, &["{X}", "search"], false));
    }

    #[test]
    fn rtt_values() {
        assert_eq!(parse_rtt("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_rtt("1ms").unwrap(), Duration::from_millis(1));
        assert_eq!(parse_rtt("5").unwrap(), Duration::from_millis(5));
        assert_eq!(parse_rtt("500us").unwrap(), Duration::from_micros(500));
        assert_eq!(parse_rtt("0.5s").unwrap(), Duration::from_millis(500));
        assert!(parse_rtt("fast").is_err());
        assert!(parse_rtt("-1ms").is_err());
    }

    #[test]
    fn spread_picks_evenly() {
        let v: Vec<usize> = (0..10).collect();
        assert_eq!(spread(&v, 5), vec![0, 2, 4, 6, 8]);
        assert_eq!(spread(&v, 20), v);
        assert!(spread::<usize>(&[], 3).is_empty());
    }

    #[test]
    fn local_mount_runs_only_when_named() {
        let none: Vec<String> = Vec::new();
        assert!(Sys::Dircache.wanted(&none) && Sys::Native.wanted(&none));
        assert!(!Sys::DircacheLocal.wanted(&none));
        let named = vec!["native".to_string(), "dircache-local".to_string()];
        assert!(Sys::DircacheLocal.wanted(&named) && Sys::Native.wanted(&named));
        assert!(!Sys::Dircache.wanted(&named));
        assert!(Sys::DircacheLocal.is_dircache());
    }
}
