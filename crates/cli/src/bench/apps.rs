//! `dircache bench apps`: real programs on native SRC, on a bindfs mount and on a dircache
//! mount of SRC, warm and cold, interleaved, with the FUSE requests that reached each daemon
//! (issue 3's benchmark; the targets it judges are issue 9's).
//!
//! Method. A source-like tree with a git repository, directories of 10..10,000 entries, a deep
//! chain with a symlink and a large file are generated in a temporary SRC. For every workload,
//! first the cold runs then the warm runs; within each phase, `runs` rounds, every round running
//! the workload once per system (order rotated each round). Cold: the FUSE mount is unmounted and
//! mounted again and `echo 3 > /proc/sys/vm/drop_caches` empties the page, inode and dentry caches
//! (for native too). Warm: one untimed run first; a warm run with a drop_caches by another
//! program on the machine since the system's previous run (or during it: /proc/vmstat's drop
//! counters) is done again after an untimed run, up to 5 times (`outside_drops::warm_run`,
//! shared with `bench remote`; a note and JSON `rewarmed` say how often). Timing is the wall
//! time of the program (fork, exec and exit included) except for the
//! stat/open/readdir/mkstemp/read loops, which run in a hidden subcommand of this binary that
//! times its own loop. Requests: `perf stat -e
//! fuse:fuse_request_send --filter 'connection == <dev of the mount>' -a`, enabled through a
//! control fifo just around the timed part; null for native. For dircache mounts the
//! daemon's own counters (`dircache stats`) also give the requests by kind, read before and
//! after each run. Daemon CPU: the FUSE daemon's user + system time (`/proc/PID/stat`, all its
//! threads, those that ended included) from just before the program starts until the daemon
//! is idle after it ended (its CPU time unchanged over [`SETTLE`]: the work a run left to
//! background threads counts for that run), in milliseconds, median per row; null for
//! native. Program CPU: the program's user + system time (its children's included), from
//! this process's `cutime`/`cstime` around its run.
//!
//! Systems (`--systems`, run in the order given, rotated each round): native, bindfs,
//! passthrough_hp (libfuse's example, when on PATH) and dircache, also as variants with extra
//! mount options (`dircache:noprefetch`, `dircache:threads=2+noreaddirplus`), so that each
//! optimisation can be measured on and off in one interleaved run. `--tree DIR` walks an
//! existing tree (real content) instead of the generated one: only the read-only walks.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::json;

use super::plot::{self, PlotFile};
use super::progress::{interleaved_rounds, Progress};
use super::stats::median_u64;
use super::tree::{self, TempDir};
use super::{ablation, drop_caches, outside_drops, stats};

#[derive(clap::Args)]
pub struct Args {
    /// Print a JSON list of rows instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Timed runs per workload, system and cache state.
    #[arg(long)]
    pub runs: Option<usize>,
    /// Small tree, small file, 2 runs: a smoke run.
    #[arg(long)]
    pub quick: bool,
    /// Only workloads whose name contains one of these (comma-separated) strings.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Only these systems, in this order (comma-separated: native, bindfs, passthrough_hp,
    /// dircache, dircache-base (a mount by `--base-binary`), or dircache:OPTS for a dircache
    /// mount with extra `-o OPTS`, options joined with `+`, e.g.
    /// dircache:noprefetch+threads=2; dircache-base:OPTS likewise) [native,bindfs,dircache].
    #[arg(long, value_delimiter = ',')]
    pub systems: Vec<String>,
    /// Walk an existing directory instead of the generated tree: only the read-only walks
    /// run (find, du, ls -lR, updatedb, and git status/diff in the first directory with a
    /// `.git` found within 3 levels). Nothing in it is changed.
    #[arg(long)]
    pub tree: Option<PathBuf>,
    /// Only this cache state [cold and warm; with --ablation also kcold]: cold = remounted
    /// and the kernel's caches dropped; kcold = the kernel's caches dropped, the daemon's
    /// cache kept (filled by an untimed run); warm = after an untimed run.
    #[arg(long, value_parser = ["cold", "kcold", "warm"])]
    pub cache: Option<String>,
    /// Directory to create the temporary tree in (default: $TMPDIR or /tmp).
    #[arg(long)]
    pub base: Option<PathBuf>,
    /// The dircache binary of system `dircache-base` (e.g. a build of main), measured beside
    /// this binary's `dircache` in the same interleaved rounds.
    #[arg(long, value_name = "PATH")]
    pub base_binary: Option<PathBuf>,
    /// Also draw the results into this SVG file: bars of the time ratio to native (to the
    /// all-on mount with --ablation) per workload and system, log scale.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Ablation: a dircache mount with every optimization on against the same mount with one
    /// turned off (each core switch, then prefetch, lean, readdirplus as mount options), on
    /// find, du, ls -lR, git status and a stat loop of missing names, cold, kcold and warm;
    /// time over the all-on mount's, FUSE requests and the core's backend calls per run.
    #[arg(long, conflicts_with = "systems")]
    pub ablation: bool,
}

#[derive(clap::Args)]
pub struct StatLoopArgs {
    /// stat | open | readdir | mkstemp | read | stat-names (N distinct missing names
    /// PATH/missing-I)
    #[arg(long)]
    pub mode: String,
    /// Directory to chdir into first.
    #[arg(long)]
    pub dir: PathBuf,
    /// Iterations.
    #[arg(long, default_value_t = 1)]
    pub n: usize,
    /// The path is expected not to exist (stat/open): fail if it does, or if it is missing
    /// without this flag.
    #[arg(long)]
    pub missing: bool,
    /// The path (relative to --dir) operated on.
    pub path: PathBuf,
}

/// The hidden loop: prints the seconds the loop took (after chdir, before exit).
pub fn stat_loop(a: StatLoopArgs) -> Result<i32> {
    std::env::set_current_dir(&a.dir).with_context(|| format!("chdir {}", a.dir.display()))?;
    let c = CString::new(a.path.as_os_str().as_bytes())?;
    if a.mode == "stat-names" && a.path.join("missing-0").symlink_metadata().is_ok() {
        bail!("{}/missing-0 exists", a.path.display());
    }
    if a.mode == "stat" || a.mode == "open" {
        let exists =
            std::fs::symlink_metadata(&a.path).is_ok() && std::fs::metadata(&a.path).is_ok();
        if exists == a.missing {
            bail!(
                "{}: exists={exists}, expected {}",
                a.path.display(),
                !a.missing
            );
        }
    }
    let t = Instant::now();
    match a.mode.as_str() {
        "stat" => {
            let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
            for _ in 0..a.n {
                // SAFETY: `c` is NUL-terminated and `st` a writable stat buffer.
                std::hint::black_box(unsafe { libc::stat(c.as_ptr(), st.as_mut_ptr()) });
            }
        }
        "stat-names" => {
            let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
            for i in 0..a.n {
                let mut p = a.path.as_os_str().as_bytes().to_vec();
                p.extend_from_slice(format!("/missing-{i}\0").as_bytes());
                // SAFETY: `p` is NUL-terminated and `st` a writable stat buffer.
                std::hint::black_box(unsafe { libc::stat(p.as_ptr().cast(), st.as_mut_ptr()) });
            }
        }
        "open" => {
            for _ in 0..a.n {
                // SAFETY: `c` is NUL-terminated; O_RDONLY needs no mode.
                let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
                if fd >= 0 {
                    // SAFETY: `fd` was just opened by us and is closed once.
                    unsafe { libc::close(fd) };
                }
            }
        }
        "readdir" => {
            let mut buf = vec![0u8; 64 * 1024];
            for _ in 0..a.n {
                // SAFETY: as for "open"; O_DIRECTORY needs no mode.
                let fd = unsafe {
                    libc::open(
                        c.as_ptr(),
                        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
                    )
                };
                if fd < 0 {
                    bail!(
                        "open {}: {}",
                        a.path.display(),
                        std::io::Error::last_os_error()
                    );
                }
                // SAFETY: `fd` is ours alone.
                let fd = unsafe { OwnedFd::from_raw_fd(fd) };
                loop {
                    // SAFETY: `buf` is writable for its whole length during the call.
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
                }
            }
        }
        "mkstemp" => {
            let mut tmpl = a.path.as_os_str().as_bytes().to_vec();
            tmpl.extend_from_slice(b"/tmpXXXXXX\0");
            for _ in 0..a.n {
                let mut t = tmpl.clone();
                // SAFETY: `t` is a writable NUL-terminated template ending in XXXXXX.
                let fd = unsafe { libc::mkstemp(t.as_mut_ptr().cast()) };
                if fd < 0 {
                    bail!("mkstemp: {}", std::io::Error::last_os_error());
                }
                // SAFETY: `fd` is ours, closed once; `t` now names the file created.
                unsafe {
                    libc::close(fd);
                    libc::unlink(t.as_ptr().cast());
                }
            }
        }
        "read" => {
            let mut buf = vec![0u8; 1 << 20];
            for _ in 0..a.n {
                let mut f = fs::File::open(&a.path)?;
                while f.read(&mut buf)? > 0 {}
            }
        }
        m => bail!("unknown mode {m}"),
    }
    println!("{}", t.elapsed().as_secs_f64());
    Ok(0)
}

// ---------------------------------------------------------------------------------- systems

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Native,
    Bindfs,
    /// libfuse's example `passthrough_hp` (found on PATH; not packaged by Debian).
    PassthroughHp,
    Dircache,
}

/// One system measured: a kind, and for dircache extra `-o` options (a variant such as
/// `dircache:noprefetch`, named after them).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Sys {
    kind: Kind,
    opts: &'static str,
    label: &'static str,
    /// A mount by `--base-binary` (`dircache-base`, `dircache-base:OPTS`).
    base: bool,
}

impl Sys {
    const NATIVE: Sys = Sys::plain(Kind::Native, "native");
    const BINDFS: Sys = Sys::plain(Kind::Bindfs, "bindfs");
    const PASSTHROUGH_HP: Sys = Sys::plain(Kind::PassthroughHp, "passthrough_hp");
    const DIRCACHE: Sys = Sys::plain(Kind::Dircache, "dircache");
    /// A dircache mount by `--base-binary`.
    const DIRCACHE_BASE: Sys = Sys {
        base: true,
        ..Sys::plain(Kind::Dircache, "dircache-base")
    };

    const fn plain(kind: Kind, label: &'static str) -> Sys {
        Sys {
            kind,
            opts: "",
            label,
            base: false,
        }
    }

    fn name(self) -> &'static str {
        self.label
    }

    /// `native`, `bindfs`, `passthrough_hp`, `dircache` or `dircache:OPTS` (a dircache mount
    /// with `-o OPTS` in addition, shown as `dircache:OPTS`).
    fn parse(s: &str) -> Result<Sys> {
        for k in [
            Sys::NATIVE,
            Sys::BINDFS,
            Sys::PASSTHROUGH_HP,
            Sys::DIRCACHE,
            Sys::DIRCACHE_BASE,
        ] {
            if s == k.label {
                return Ok(k);
            }
        }
        let (o, base) = match s.strip_prefix("dircache-base:") {
            Some(o) => (Some(o), true),
            None => (s.strip_prefix("dircache:"), false),
        };
        match o {
            Some(o) if !o.is_empty() => Ok(Sys {
                kind: Kind::Dircache,
                // A handful per run, alive until exit.
                opts: Box::leak(o.replace('+', ",").into_boxed_str()),
                label: Box::leak(s.to_string().into_boxed_str()),
                base,
            }),
            _ => bail!(
                "unknown system {s:?} (native, bindfs, passthrough_hp, dircache, dircache:OPTS, dircache-base)"
            ),
        }
    }

    /// A file name for this system's mount point and log.
    fn file_name(self) -> String {
        self.label
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect()
    }
}

fn is_mounted(mnt: &Path) -> bool {
    let Ok(s) = fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = mnt.as_os_str().as_bytes();
    s.lines().any(|l| {
        l.split(' ')
            .nth(4)
            .map(|m| m.as_bytes() == want)
            .unwrap_or(false)
    })
}

/// A FUSE daemon running in the foreground as our child, mounted on `mnt`. Dropping it
/// unmounts (lazily if need be) and reaps the daemon, killing it by PID if it lingers.
struct Mount {
    sys: Sys,
    src: PathBuf,
    mnt: PathBuf,
    child: Option<Child>,
    log: PathBuf,
}

impl Mount {
    fn start(sys: Sys, src: &Path, mnt: &Path, log: &Path) -> Result<Mount> {
        fs::create_dir_all(mnt)?;
        if is_mounted(mnt) {
            bail!("{} is already a mount point", mnt.display());
        }
        let mut cmd = match sys.kind {
            Kind::Bindfs => {
                let mut c = Command::new("bindfs");
                c.arg("-f").arg(src).arg(mnt);
                c
            }
            Kind::PassthroughHp => {
                let mut c = Command::new("passthrough_hp");
                c.arg("--foreground").arg(src).arg(mnt);
                c
            }
            Kind::Dircache => {
                let exe = if sys.base {
                    BASE_BINARY
                        .get()
                        .cloned()
                        .context("system dircache-base needs --base-binary")?
                } else {
                    std::env::current_exe().context("current_exe")?
                };
                let mut c = Command::new(exe);
                c.arg("mount").arg(src).arg(mnt).arg("-f");
                if !sys.opts.is_empty() {
                    c.arg("-o").arg(sys.opts);
                }
                // Extra mount options for every dircache system (e.g. `open=noopen`).
                if let Some(o) = std::env::var_os("DIRCACHE_BENCH_OPTIONS") {
                    c.arg("-o").arg(o);
                }
                c
            }
            Kind::Native => bail!("native is not a mount"),
        };
        let logf = fs::File::create(log)?;
        cmd.stdin(Stdio::null())
            .stdout(logf.try_clone()?)
            .stderr(logf);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", sys.name()))?;
        let mut m = Mount {
            sys,
            src: src.to_path_buf(),
            mnt: mnt.to_path_buf(),
            child: Some(child),
            log: log.to_path_buf(),
        };
        let t0 = Instant::now();
        loop {
            if is_mounted(mnt) {
                return Ok(m);
            }
            if let Some(c) = m.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    m.child = None;
                    let log = fs::read_to_string(log).unwrap_or_default();
                    bail!(
                        "{} exited ({st}) before mounting: {}",
                        sys.name(),
                        log.trim()
                    );
                }
            }
            if t0.elapsed() > Duration::from_secs(10) {
                bail!("{} did not mount {} within 10 s", sys.name(), mnt.display());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The connection number the fuse tracepoints report for this mount (the kernel dev_t of
    /// its superblock).
    fn connection(&self) -> Result<u64> {
        let dev = fs::metadata(&self.mnt)?.dev();
        let (ma, mi) = (libc::major(dev) as u64, libc::minor(dev) as u64);
        Ok((ma << 20) | mi)
    }

    fn stop(&mut self) {
        // Only the owner of the daemon unmounts.
        if self.child.is_some() && is_mounted(&self.mnt) {
            let ok = Command::new("umount")
                .arg(&self.mnt)
                .stderr(Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if !ok {
                let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
            }
        }
        if let Some(mut c) = self.child.take() {
            let t0 = Instant::now();
            loop {
                match c.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if t0.elapsed() < Duration::from_secs(3) => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    _ => {
                        if let Ok(pid) = i32::try_from(c.id()) {
                            // SAFETY: plain kill(2) of our own child, by PID.
                            unsafe { libc::kill(pid, libc::SIGTERM) };
                        }
                        let t1 = Instant::now();
                        while t1.elapsed() < Duration::from_secs(2) {
                            if let Ok(Some(_)) = c.try_wait() {
                                return;
                            }
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        let _ = c.kill();
                        let _ = c.wait();
                        break;
                    }
                }
            }
        }
    }

    /// Unmount and mount again (a cold kernel cache for this mount).
    fn recycle(&mut self) -> Result<()> {
        self.stop();
        let mut fresh = Mount::start(self.sys, &self.src, &self.mnt, &self.log)?;
        // `fresh` is dropped without a child, so it leaves the new mount alone.
        self.child = fresh.child.take();
        Ok(())
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        self.stop();
    }
}

struct System {
    sys: Sys,
    /// Where the workloads see SRC.
    dir: PathBuf,
    mount: Option<Mount>,
}

// ---------------------------------------------------------------------------------- perf

/// `perf stat` of fuse:fuse_request_send for one connection, enabled around the timed part.
struct PerfCounter {
    child: Child,
    ctl: fs::File,
    ack: fs::File,
    out: PathBuf,
}

fn mkfifo(p: &Path) -> Result<()> {
    let _ = fs::remove_file(p);
    let c = CString::new(p.as_os_str().as_bytes())?;
    // SAFETY: NUL-terminated path.
    if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
        bail!(
            "mkfifo {}: {}",
            p.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// Read one line ("ack") from `f` with a timeout.
fn read_ack(f: &mut fs::File, timeout: Duration) -> Result<()> {
    let mut pfd = libc::pollfd {
        fd: f.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let r = unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as i32) };
    if r <= 0 {
        bail!("perf did not acknowledge within {timeout:?}");
    }
    let mut buf = [0u8; 64];
    let _ = f.read(&mut buf)?;
    Ok(())
}

impl PerfCounter {
    fn start(work: &Path, connection: u64) -> Result<PerfCounter> {
        let ctl_p = work.join("perf.ctl");
        let ack_p = work.join("perf.ack");
        let out = work.join("perf.out");
        mkfifo(&ctl_p)?;
        mkfifo(&ack_p)?;
        let child = Command::new("perf")
            .args(["stat", "-e", "fuse:fuse_request_send", "--filter"])
            .arg(format!("connection == {connection}"))
            .args(["-a", "-x,", "-D", "-1", "-o"])
            .arg(&out)
            .arg("--control")
            .arg(format!("fifo:{},{}", ctl_p.display(), ack_p.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting perf")?;
        // Opening with O_RDWR never blocks on a fifo, so a perf that died cannot hang us.
        let ctl = fs::OpenOptions::new().read(true).write(true).open(&ctl_p)?;
        let ack = fs::OpenOptions::new().read(true).write(true).open(&ack_p)?;
        let mut p = PerfCounter {
            child,
            ctl,
            ack,
            out,
        };
        p.command("enable")?;
        Ok(p)
    }

    fn command(&mut self, c: &str) -> Result<()> {
        self.ctl.write_all(format!("{c}\n").as_bytes())?;
        read_ack(&mut self.ack, Duration::from_secs(10))
    }

    /// Stop counting and return the count.
    fn finish(mut self) -> Result<u64> {
        let r = self.command("disable");
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // SAFETY: kill(2) of our own child by PID.
            unsafe { libc::kill(pid, libc::SIGINT) };
        }
        let _ = self.child.wait();
        r?;
        let s = fs::read_to_string(&self.out)?;
        for l in s.lines() {
            if l.contains("fuse_request_send") {
                let f = l.split(',').next().unwrap_or("");
                return f
                    .trim()
                    .parse::<u64>()
                    .map_err(|_| anyhow!("perf output: {l}"));
            }
        }
        bail!("no count in perf output: {s}")
    }
}

impl Drop for PerfCounter {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

// ---------------------------------------------------------------------------------- workloads

#[derive(Clone, Copy, PartialEq, Eq)]
enum Prep {
    /// Read-only: nothing to set up or clean.
    None,
    /// An empty scratch directory; removed after.
    Empty,
    /// The tree extracted into the scratch directory (through the same system).
    Tree,
}

enum Action {
    /// A program; `{D}` is replaced by the system's view of SRC, `{S}` by the scratch dir,
    /// `{T}` by the tarball.
    Cmd(Vec<&'static str>),
    /// The hidden loop: mode, iterations, path relative to the system's view of SRC.
    Loop(&'static str, usize, String),
}

struct Workload {
    name: String,
    prep: Prep,
    action: Action,
    /// Operations per run, for a per-operation figure (loops only).
    ops: usize,
}

const STAT_PATHS: [(&str, &str); 6] = [
    ("1 component", "tree/README"),
    ("8 components", "tree/deep/a/b/c/d/e/f/file.c"),
    ("missing file", "tree/deep/a/b/c/missing.c"),
    ("missing dir", "tree/deep/a/missingdir/x/y.c"),
    ("symlink", "tree/lnk/d/e/f/file.c"),
    ("dotdot", "tree/deep/a/b/../b/c/d/file.c"),
];
const READDIR_SIZES: [usize; 4] = [10, 100, 1000, 10000];

fn workloads(quick: bool) -> Vec<Workload> {
    let w = |name: &str, prep, args: Vec<&'static str>| Workload {
        name: name.to_string(),
        prep,
        action: Action::Cmd(args),
        ops: 1,
    };
    let mut v = vec![
        w(
            "find -name",
            Prep::None,
            vec!["find", "{W}", "-name", "*.h"],
        ),
        w("du -s", Prep::None, vec!["du", "-s", "{W}"]),
        w("ls -lR", Prep::None, vec!["ls", "-lR", "{W}"]),
        w(
            "git status",
            Prep::None,
            vec![
                "git",
                "-C",
                "{G}",
                "--no-optional-locks",
                "-c",
                "core.checkStat=minimal",
                "status",
                "--porcelain",
            ],
        ),
        w(
            "git diff",
            Prep::None,
            vec![
                "git",
                "-C",
                "{G}",
                "--no-optional-locks",
                "-c",
                "core.checkStat=minimal",
                "diff",
            ],
        ),
        w(
            "updatedb walk",
            Prep::None,
            vec![
                "find",
                "{W}",
                "-type",
                "d",
                "-printf",
                "%T@ %p\\n",
                "-o",
                "-print",
            ],
        ),
        w("tar xf", Prep::Empty, vec!["tar", "xf", "{T}", "-C", "{S}"]),
        w("rm -r", Prep::Tree, vec!["rm", "-r", "{S}/tree"]),
        w("cp -r", Prep::Empty, vec!["cp", "-r", "{D}/tree", "{S}/"]),
    ];
    let n = if quick { 2_000 } else { 20_000 };
    for mode in ["stat", "open"] {
        for (what, p) in STAT_PATHS {
            v.push(Workload {
                name: format!("{mode} {what} x{n}"),
                prep: Prep::None,
                action: Action::Loop(mode, n, p.to_string()),
                ops: n,
            });
        }
    }
    v.push(Workload {
        name: format!("stat missing names x{n}"),
        prep: Prep::None,
        action: Action::Loop("stat-names", n, "tree/deep/a".to_string()),
        ops: n,
    });
    for size in READDIR_SIZES {
        let reps = ((if quick { 20_000 } else { 200_000 }) / size).max(5);
        v.push(Workload {
            name: format!("readdir {size} x{reps}"),
            prep: Prep::None,
            action: Action::Loop("readdir", reps, format!("dirs/n{size}")),
            ops: reps,
        });
    }
    let mk = if quick { 200 } else { 2_000 };
    v.push(Workload {
        name: format!("mkstemp x{mk}"),
        prep: Prep::Empty,
        action: Action::Loop("mkstemp", mk, "{S}".to_string()),
        ops: mk,
    });
    v.push(Workload {
        name: if quick {
            "read 64 MiB".into()
        } else {
            "read 1 GiB".into()
        },
        prep: Prep::None,
        action: Action::Loop("read", 1, "data/big.bin".to_string()),
        ops: 1,
    });
    v
}

/// Generate SRC: `tree/` (source-like files, a deep chain, a symlink, a git repository with
/// one commit and a few uncommitted changes), `dirs/nN`, `data/big.bin`, `scratch/`; and a
/// tarball of `tree` next to SRC.
fn generate(base: &Path, quick: bool, big: bool) -> Result<(PathBuf, PathBuf)> {
    let src = base.join("src");
    let t = src.join("tree");
    fs::create_dir_all(&t)?;
    let (m, s, f) = if quick { (4, 4, 10) } else { (20, 8, 25) };
    tree::source_tree(&t, "kernel", m, s, f)?;
    fs::write(t.join("README"), "a generated source-like tree\n")?;
    let mut d = t.join("deep");
    for c in ["a", "b", "c", "d", "e", "f"] {
        d = d.join(c);
        fs::create_dir_all(&d)?;
        fs::write(d.join("file.c"), "int x;\n")?;
    }
    fs::write(t.join("deep/file.c"), "int x;\n")?;
    std::os::unix::fs::symlink("deep/a/b/c", t.join("lnk"))?;
    let git = |args: &[&str]| tree::git(&t, args);
    // No file may be written in the second the index is: git cannot trust the stat data of
    // such a "racily clean" entry and reads the file at every `git status` (which, with
    // --no-optional-locks, never writes the refreshed index back), so the work of the git
    // workloads would depend on the clock (17 to 558 requests per warm run were seen).
    std::thread::sleep(Duration::from_millis(1100));
    git(&["init", "-q"])?;
    git(&["add", "-A"])?;
    git(&["commit", "-q", "-m", "initial import"])?;
    git(&["gc", "-q"])?;
    // The changes below keep each file's size: they must fall in a later second than the
    // committed files for `core.checkStat=minimal` to see them at all.
    std::thread::sleep(Duration::from_millis(1100));
    for i in 0..3 {
        fs::write(
            t.join(format!("kernel/module0{i}/Makefile")),
            format!("obj-y += changed{i}.o\n"),
        )?;
    }
    for n in READDIR_SIZES {
        tree::flat_dir(&src.join(format!("dirs/n{n}")), n)?;
    }
    fs::create_dir_all(src.join("scratch"))?;
    fs::create_dir_all(src.join("data"))?;
    // Only the read workload reads it: not written when it does not run.
    let size: usize = match (big, quick) {
        (false, _) => 0,
        (true, true) => 64 << 20,
        (true, false) => 1 << 30,
    };
    let mut f = fs::File::create(src.join("data/big.bin"))?;
    let chunk: Vec<u8> = (0..(1usize << 20)).map(|i| (i * 31 % 251) as u8).collect();
    for _ in 0..size / chunk.len() {
        f.write_all(&chunk)?;
    }
    f.sync_all()?;
    let tar = base.join("tree.tar");
    let st = Command::new("tar")
        .arg("cf")
        .arg(&tar)
        .arg("-C")
        .arg(&src)
        .arg("tree")
        .status()?;
    if !st.success() {
        bail!("tar cf failed");
    }
    Ok((src, tar))
}

fn run_quiet(cmd: &mut Command) -> Result<()> {
    let o = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()?;
    if !o.status.success() {
        bail!(
            "{:?} failed ({}): {}",
            cmd,
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    Ok(())
}

struct Ctx {
    exe: PathBuf,
    tar: PathBuf,
    work: PathBuf,
    perf: bool,
    /// The walked tree and the git work tree, relative to SRC ("" = SRC itself).
    walk_rel: String,
    git_rel: String,
}

/// `dir` joined with `rel` (`dir` itself for an empty `rel`), as a string.
fn join_rel(dir: &Path, rel: &str) -> String {
    if rel.is_empty() {
        dir.to_string_lossy().into_owned()
    } else {
        dir.join(rel).to_string_lossy().into_owned()
    }
}

/// The git work tree below `tree` for the git workloads: `tree` itself or the first
/// directory found breadth-first (3 levels) that holds `.git`; relative to `tree`.
fn find_git(tree: &Path) -> Option<String> {
    let mut level = vec![PathBuf::new()];
    for _ in 0..3 {
        let mut next = Vec::new();
        for rel in level {
            let d = tree.join(&rel);
            if d.join(".git").exists() {
                return Some(rel.to_string_lossy().into_owned());
            }
            let Ok(rd) = fs::read_dir(&d) else { continue };
            let mut subs: Vec<PathBuf> = rd
                .flatten()
                .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
                .map(|e| rel.join(e.file_name()))
                .collect();
            subs.sort();
            next.extend(subs);
        }
        level = next;
    }
    None
}

/// One measured run of `w` on `s`: (seconds, requests).
/// FUSE requests by kind a dircache daemon counted (`dircache stats`), 0 for others.
fn daemon_requests(s: &System) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    let Some(mnt) = s.mount.as_ref().filter(|m| m.sys.kind == Kind::Dircache) else {
        return m;
    };
    let req = json!({"op": "stats"});
    if let Ok(v) = dircache_fuse::stats::query_mount(&mnt.mnt, &req) {
        if let Some(o) = v["stats"]["kernel_requests"]["by_kind"].as_object() {
            for (k, n) in o {
                m.insert(k.clone(), n.as_u64().unwrap_or(0));
            }
        }
    }
    m
}

/// One measured run: seconds, requests (perf), and for dircache the requests by kind.
/// ... and the core's backend calls (lookup + getattr + readdir) the daemon made, and the
/// daemon's CPU time in seconds ([`daemon_cpu`]).
type RunResult = (
    f64,
    Option<u64>,
    BTreeMap<String, u64>,
    Option<u64>,
    Option<f64>,
    f64,
);

/// How long a daemon's CPU time must stay the same to count as idle after a run.
const SETTLE: Duration = Duration::from_millis(60);
/// The longest wait for a daemon to go idle after a run.
const MAX_SETTLE: Duration = Duration::from_secs(2);

/// The sum of fields `a` and `b` (numbered as in proc(5), from 1) of a `/proc/PID/stat`
/// line, in clock ticks.
fn stat_ticks(stat: &str, a: usize, b: usize) -> Option<u64> {
    // After the command name (in parentheses; it may hold spaces and parentheses): field 3.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let get = |n: usize| f.get(n.checked_sub(3)?)?.parse::<u64>().ok();
    Some(get(a)? + get(b)?)
}

/// Clock ticks in seconds.
fn ticks_secs(ticks: u64) -> Option<f64> {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| ticks as f64 / hz as f64)
}

/// User + system CPU seconds of process `pid` and all its threads so far (`/proc/PID/stat`
/// utime and stime, which include the threads that ended).
fn cpu_secs(pid: u32) -> Option<f64> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    ticks_secs(stat_ticks(&s, 14, 15)?)
}

/// User + system CPU seconds of this process's waited-for children so far
/// (`/proc/self/stat` cutime and cstime): around one program's run, that program's CPU.
fn children_cpu_secs() -> f64 {
    fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| stat_ticks(&s, 16, 17))
        .and_then(ticks_secs)
        .unwrap_or(0.0)
}

/// The PID of `s`'s FUSE daemon (none for native).
fn daemon_pid(s: &System) -> Option<u32> {
    s.mount.as_ref()?.child.as_ref().map(|c| c.id())
}

/// The daemon's CPU seconds once it is idle (unchanged for [`SETTLE`], at most
/// [`MAX_SETTLE`] of waiting).
fn daemon_cpu_settled(pid: u32) -> Option<f64> {
    let t0 = Instant::now();
    let mut last = cpu_secs(pid)?;
    let mut since = Instant::now();
    while t0.elapsed() < MAX_SETTLE {
        std::thread::sleep(Duration::from_millis(10));
        let now = cpu_secs(pid)?;
        if now != last {
            last = now;
            since = Instant::now();
        } else if since.elapsed() >= SETTLE {
            break;
        }
    }
    Some(last)
}

/// The core's backend lookup + getattr + readdir calls so far (`dircache stats`), for
/// dircache mounts.
fn backend_calls(s: &System) -> Option<u64> {
    let mnt = s.mount.as_ref().filter(|m| m.sys.kind == Kind::Dircache)?;
    let v = dircache_fuse::stats::query_mount(&mnt.mnt, &json!({"op": "stats"})).ok()?;
    let core = &v["stats"]["core"];
    ["backend_lookup", "backend_getattr", "backend_readdir"]
        .iter()
        .map(|k| core[k].as_u64())
        .sum()
}

/// The cache state a run starts in (`--cache`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    /// Remounted (a fresh daemon) and the kernel's caches dropped.
    Cold,
    /// The kernel's caches dropped, the daemon (and its cache) kept.
    KernelCold,
    /// Nothing dropped.
    Warm,
}

impl State {
    fn name(self) -> &'static str {
        match self {
            State::Cold => "cold",
            State::KernelCold => "kcold",
            State::Warm => "warm",
        }
    }
}

fn run_once(ctx: &Ctx, s: &mut System, w: &Workload, state: State) -> Result<RunResult> {
    // One scratch directory per system: a change made natively must not race the FUSE
    // daemons' coherence (that is tested elsewhere, not timed here).
    let scratch = s.dir.join(format!("scratch/run-{}", s.sys.file_name()));
    match w.prep {
        Prep::None => {}
        Prep::Empty => {
            fs::create_dir_all(&scratch).with_context(|| format!("mkdir {}", scratch.display()))?
        }
        Prep::Tree => {
            fs::create_dir_all(&scratch)?;
            run_quiet(
                Command::new("tar")
                    .arg("xf")
                    .arg(&ctx.tar)
                    .arg("-C")
                    .arg(&scratch),
            )?;
        }
    }
    if state == State::Cold {
        if let Some(m) = s.mount.as_mut() {
            m.recycle()?;
        }
    }
    if state != State::Warm {
        drop_caches()?;
    } else {
        // Write back what earlier runs left dirty, so no run pays for another's writeback
        // (drop_caches syncs first for the cold runs).
        // SAFETY: sync(2) has no preconditions.
        unsafe { libc::sync() };
    }
    let sub = |a: &str| -> String {
        a.replace("{W}", &join_rel(&s.dir, &ctx.walk_rel))
            .replace("{G}", &join_rel(&s.dir, &ctx.git_rel))
            .replace("{D}", &s.dir.to_string_lossy())
            .replace("{S}", &scratch.to_string_lossy())
            .replace("{T}", &ctx.tar.to_string_lossy())
    };
    let mut cmd = match &w.action {
        Action::Cmd(args) => {
            let mut c = Command::new(args[0]);
            c.args(args[1..].iter().map(|a| sub(a)));
            c
        }
        Action::Loop(mode, n, path) => {
            let mut c = Command::new(&ctx.exe);
            c.args([
                "bench",
                "stat-loop",
                "--mode",
                mode,
                "--n",
                &n.to_string(),
                "--dir",
            ])
            .arg(&s.dir)
            .arg(sub(path));
            if path.contains("missing") {
                c.arg("--missing");
            }
            c
        }
    };
    if state != State::Warm {
        // drop_caches also evicted the program and its libraries: load them again (for every
        // system alike) so that "cold" means a cold file system, not a cold program.
        let prog = match &w.action {
            Action::Cmd(args) => PathBuf::from(args[0]),
            Action::Loop(..) => ctx.exe.clone(),
        };
        let _ = Command::new(prog)
            .arg("--version")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let kinds0 = daemon_requests(s);
    let be0 = backend_calls(s);
    let pid = daemon_pid(s);
    let cpu0 = pid.and_then(cpu_secs);
    let perf = match (&s.mount, ctx.perf) {
        (Some(m), true) => Some(PerfCounter::start(&ctx.work, m.connection()?)?),
        _ => None,
    };
    let pc0 = children_cpu_secs();
    let t0 = Instant::now();
    let out = cmd
        .output()
        .with_context(|| format!("running {}", w.name))?;
    let wall = t0.elapsed().as_secs_f64();
    let prog_cpu = (children_cpu_secs() - pc0).max(0.0);
    let requests = match perf {
        Some(p) => Some(p.finish()?),
        None => None,
    };
    let cpu = match (pid, cpu0) {
        (Some(p), Some(c0)) => daemon_cpu_settled(p).map(|c1| (c1 - c0).max(0.0)),
        _ => None,
    };
    let be1 = backend_calls(s);
    let mut kinds = daemon_requests(s);
    // A query costs requests of its own (the socket xattr, statfs): counted once in
    // `kinds`, measured by asking once more.
    let again = daemon_requests(s);
    // The same for the backend calls (the queries' own, if any, measured by asking again).
    let backend = match (be0, be1, backend_calls(s)) {
        (Some(a), Some(b), Some(c)) => {
            Some(b.saturating_sub(a).saturating_sub(c.saturating_sub(b)))
        }
        _ => None,
    };
    for (k, n) in kinds.iter_mut() {
        let own = again.get(k).copied().unwrap_or(0).saturating_sub(*n);
        *n = n
            .saturating_sub(kinds0.get(k).copied().unwrap_or(0))
            .saturating_sub(own);
    }
    kinds.retain(|_, n| *n > 0);
    let cleanup = if w.prep != Prep::None {
        fs::remove_dir_all(&scratch)
    } else {
        Ok(())
    };
    // git diff exits 0; find over a mount may print errors: any failure is reported.
    if !out.status.success() {
        bail!(
            "{} on {}: {} {}",
            w.name,
            s.sys.name(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    cleanup.with_context(|| format!("removing {} after {}", scratch.display(), w.name))?;
    let secs = match w.action {
        Action::Loop(..) => {
            let so = String::from_utf8_lossy(&out.stdout);
            so.trim()
                .parse::<f64>()
                .map_err(|_| anyhow!("stat-loop printed {so:?}"))?
        }
        Action::Cmd(_) => wall,
    };
    Ok((secs, requests, kinds, backend, cpu, prog_cpu))
}

pub(super) struct Row {
    pub(super) workload: String,
    pub(super) system: &'static str,
    pub(super) cache: &'static str,
    pub(super) times: Vec<f64>,
    pub(super) requests: Vec<u64>,
    /// Requests by kind of each run (dircache only).
    pub(super) kinds: Vec<BTreeMap<String, u64>>,
    pub(super) ops: usize,
    pub(super) error: Option<String>,
    /// The core's backend calls of each run (dircache only).
    pub(super) backend: Vec<u64>,
    /// The daemon's CPU seconds of each run (FUSE mounts only; module doc).
    pub(super) cpu: Vec<f64>,
    /// The program's own CPU seconds of each run (user + system, its children included).
    pub(super) prog_cpu: Vec<f64>,
    /// Untimed runs added to warm the caches again after a drop by another program
    /// (`outside_drops::warm_run`).
    pub(super) rewarmed: usize,
}

/// `--base-binary`: the binary of system `dircache-base`.
static BASE_BINARY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

pub fn run(a: Args) -> Result<i32> {
    if let Some(b) = &a.base_binary {
        let _ = BASE_BINARY.set(fs::canonicalize(b).with_context(|| format!("{}", b.display()))?);
    }
    let runs = a.runs.unwrap_or(if a.quick { 2 } else { 5 }).max(1);
    // Opened first: a path that cannot be written fails before any measuring.
    let plot = a.plot.as_deref().map(PlotFile::create).transpose()?;
    let progress = Progress::new("bench apps", 0);
    let note = |s: &str| progress.note(&format!("bench apps: {s}"));
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        note("not root: mounts, perf -a and drop_caches will probably fail");
    }
    let base = TempDir::new("bench-apps", a.base.as_deref())?;
    let (src, tar, walk_rel, git_rel) = match &a.tree {
        Some(t) => {
            let t = fs::canonicalize(t).with_context(|| format!("--tree {}", t.display()))?;
            let git = find_git(&t);
            note(&format!(
                "walking {} (git work tree: {})",
                t.display(),
                git.as_deref()
                    .map(|g| if g.is_empty() { "." } else { g })
                    .unwrap_or("none, git workloads skipped")
            ));
            (t, PathBuf::new(), String::new(), git.unwrap_or_default())
        }
        None => {
            note(&format!("generating the tree in {}", base.path().display()));
            let big = workloads(a.quick)
                .iter()
                .any(|w| w.name.starts_with("read ") && selected(&a, w));
            let (src, tar) = generate(base.path(), a.quick, big)?;
            (src, tar, "tree".to_string(), "tree".to_string())
        }
    };
    let has_git = a.tree.is_none() || src.join(&git_rel).join(".git").exists();
    let perf_ok = Command::new("perf")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !perf_ok {
        note("perf not found (apt-get install linux-perf): requests will be null");
    }
    let ctx = Ctx {
        exe: std::env::current_exe()?,
        tar,
        work: base.path().to_path_buf(),
        perf: perf_ok,
        walk_rel,
        git_rel,
    };

    let wanted: Vec<Sys> = if a.ablation {
        ablation::systems()
            .iter()
            .map(|s| Sys::parse(s))
            .collect::<Result<_>>()?
    } else if a.systems.is_empty() {
        vec![Sys::NATIVE, Sys::BINDFS, Sys::DIRCACHE]
    } else {
        a.systems
            .iter()
            .map(|s| Sys::parse(s))
            .collect::<Result<_>>()?
    };
    // Declared after `base`, so dropped (unmounted) before the tree is removed.
    let mut systems: Vec<System> = Vec::new();
    for sys in wanted {
        if sys.kind == Kind::Native {
            systems.push(System {
                sys,
                dir: src.clone(),
                mount: None,
            });
            continue;
        }
        let mnt = base.path().join(format!("mnt-{}", sys.file_name()));
        let log = base.path().join(format!("{}.log", sys.file_name()));
        match Mount::start(sys, &src, &mnt, &log) {
            Ok(m) => systems.push(System {
                sys,
                dir: mnt,
                mount: Some(m),
            }),
            Err(e) => note(&format!("skipping {}: {e:#}", sys.name())),
        }
    }
    if systems.is_empty() {
        bail!("no system to run on");
    }

    let mut rows: Vec<Row> = Vec::new();
    let wls: Vec<Workload> = workloads(a.quick)
        .into_iter()
        .filter(|w| selected(&a, w))
        // An existing tree: only the read-only walks (no scratch, no generated paths).
        .filter(|w| {
            a.tree.is_none()
                || (w.prep == Prep::None
                    && matches!(w.action, Action::Cmd(_))
                    && (has_git || !w.name.starts_with("git ")))
        })
        .collect();
    let states: Vec<State> = [State::Cold, State::KernelCold, State::Warm]
        .into_iter()
        .filter(|st| match a.cache.as_deref() {
            Some(c) => c == st.name(),
            // kcold only for the ablation, unless asked for.
            None => a.ablation || *st != State::KernelCold,
        })
        .collect();
    let state_names: Vec<&str> = states.iter().map(|st| st.name()).collect();
    progress.set_total((wls.len() * states.len() * runs * systems.len()) as u64);
    for w in &wls {
        note(&format!(
            "{} ({runs} runs x {} systems x {})",
            w.name,
            systems.len(),
            state_names.join("/")
        ));
        for &state in &states {
            let cache = state.name();
            let first = rows.len();
            for s in &systems {
                rows.push(Row {
                    workload: w.name.clone(),
                    system: s.sys.name(),
                    cache,
                    times: vec![],
                    requests: vec![],
                    kinds: vec![],
                    ops: w.ops,
                    error: None,
                    backend: vec![],
                    cpu: vec![],
                    prog_cpu: vec![],
                    rewarmed: 0,
                });
            }
            // Per system, the drop count before its last warm run (`outside_drops::warm_run`).
            let mut drops = vec![outside_drops::count(); systems.len()];
            if state != State::Cold {
                // An untimed run first: fills the kernel's caches (warm) or the daemon's
                // (kcold: the timed runs drop the kernel's).
                for (i, s) in systems.iter_mut().enumerate() {
                    progress.running(format!(
                        "{} ({cache}), untimed first run: {}",
                        w.name,
                        s.sys.name()
                    ));
                    if let Err(e) = run_once(&ctx, s, w, State::Warm) {
                        rows[first + i].error = Some(format!("{e:#}"));
                    }
                }
            }
            let names: Vec<&str> = systems.iter().map(|s| s.sys.name()).collect();
            let label = |r: usize, s: &str| format!("{} ({cache}), round {r}/{runs}: {s}", w.name);
            interleaved_rounds(&progress, runs, &names, label, |i| {
                if rows[first + i].error.is_some() {
                    return Ok(());
                }
                let res = if state == State::Warm {
                    let row = &mut rows[first + i];
                    let s = &mut systems[i];
                    outside_drops::warm_run(&mut drops[i], &mut row.rewarmed, || {
                        run_once(&ctx, s, w, state)
                    })
                } else {
                    run_once(&ctx, &mut systems[i], w, state)
                };
                match res {
                    Ok((t, req, kinds, be, cpu, pcpu)) => {
                        rows[first + i].backend.extend(be);
                        rows[first + i].cpu.extend(cpu);
                        rows[first + i].prog_cpu.push(pcpu);
                        rows[first + i].kinds.push(kinds);
                        rows[first + i].times.push(t);
                        if let Some(q) = req {
                            rows[first + i].requests.push(q);
                        }
                    }
                    Err(e) => {
                        note(&format!("{e:#}"));
                        rows[first + i].error = Some(format!("{e:#}"));
                    }
                }
                Ok(())
            })?;
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
    // Unmount before printing (and before `base` goes).
    drop(systems);
    drop(progress);

    if a.json {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                let has = !r.times.is_empty();
                let mut o = json!({
                    "workload": r.workload,
                    "system": r.system,
                    "cache": r.cache,
                    "median_s": if has { json!(stats::median(&r.times)) } else { json!(null) },
                    "min_s": if has { json!(stats::min(&r.times)) } else { json!(null) },
                    "max_s": if has { json!(stats::max(&r.times)) } else { json!(null) },
                    "requests": if r.requests.is_empty() { json!(null) } else { json!(median_u64(&r.requests)) },
                    "backend_calls": if r.backend.is_empty() { json!(null) } else { json!(median_u64(&r.backend)) },
                    "daemon_cpu_ms": if r.cpu.is_empty() { json!(null) } else { json!((stats::median(&r.cpu) * 1e3).round()) },
                    "program_cpu_ms": if r.prog_cpu.is_empty() { json!(null) } else { json!((stats::median(&r.prog_cpu) * 1e3).round()) },
                    "requests_by_kind": if r.kinds.iter().all(|k| k.is_empty()) { json!(null) } else { json!(median_kinds(&r.kinds).into_iter().collect::<BTreeMap<_, _>>()) },
                });
                if let (true, Some(m)) = (r.rewarmed > 0, o.as_object_mut()) {
                    m.insert("rewarmed".into(), json!(r.rewarmed));
                }
                if let (Some(e), Some(m)) = (&r.error, o.as_object_mut()) {
                    m.insert("error".into(), json!(e));
                }
                o
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else if a.ablation {
        ablation::print_table(&rows, runs);
    } else {
        print_table(&rows, runs);
    }
    if let Some(p) = plot {
        let path = p.path().display().to_string();
        p.write(&chart(&rows, runs, a.ablation))?;
        eprintln!("bench apps: plot written to {path}");
    }
    Ok(0)
}

/// Whether `w` runs: `--only`, and with `--ablation` only the ablation's workloads.
fn selected(a: &Args, w: &Workload) -> bool {
    (a.only.is_empty() || a.only.iter().any(|o| w.name.contains(o.as_str())))
        && (!a.ablation || ablation::WORKLOADS.iter().any(|p| w.name.starts_with(p)))
}

/// The `--plot` chart: median time over the baseline's (native, the all-on mount for
/// `--ablation`, else the first system) per workload and cache state.
fn chart(rows: &[Row], runs: usize, ablation: bool) -> plot::Chart {
    let base = if ablation {
        "dircache"
    } else if rows.iter().any(|r| r.system == "native") {
        "native"
    } else {
        rows.first().map(|r| r.system).unwrap_or("native")
    };
    let mut bars = Vec::new();
    for r in rows.iter().filter(|r| r.system != base) {
        let b = rows
            .iter()
            .find(|b| b.system == base && b.workload == r.workload && b.cache == r.cache);
        let (Some(b), false) = (b, r.times.is_empty()) else {
            continue;
        };
        if b.times.is_empty() {
            continue;
        }
        bars.push(plot::Bar {
            group: format!("{} ({})", r.workload, r.cache),
            series: r
                .system
                .strip_prefix("dircache:")
                .unwrap_or(r.system)
                .to_string(),
            value: stats::median(&r.times) / stats::median(&b.times),
        });
    }
    let what = if ablation {
        "one optimization off: time / all on".to_string()
    } else {
        format!("time / {base}")
    };
    plot::Chart {
        title: format!("dircache bench apps: {what}, median of {runs} interleaved runs"),
        subtitle: plot::run_parameters(),
        axis: format!(
            "{what} (log scale; right of 1× = slower than {})",
            if ablation { "all on" } else { base }
        ),
        groups_axis: "workload (cache state)".into(),
        bars,
    }
}

/// Median count of each request kind over the runs (a run without a kind counts 0),
/// largest first.
fn median_kinds(runs: &[BTreeMap<String, u64>]) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = stats::median_by_kind(runs).into_iter().collect();
    out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    out
}

fn print_table(rows: &[Row], runs: usize) {
    println!("dircache bench apps: median of {runs} interleaved runs [min-max]; ratio to native; requests = FUSE requests reaching the daemon (median; for dircache, the most frequent kinds as its own counters saw them); prog / daemon = CPU (user+system) of the program and of the FUSE daemon per run, the daemon's until it is idle after the program (median); load average at end {}", super::lookup::loadavg());
    let mut by: BTreeMap<(String, &str), Vec<&Row>> = BTreeMap::new();
    let mut order: Vec<(String, &str)> = Vec::new();
    for r in rows {
        let k = (r.workload.clone(), r.cache);
        if !by.contains_key(&k) {
            order.push(k.clone());
        }
        by.entry(k).or_default().push(r);
    }
    for k in order {
        let Some(rs) = by.get(&k) else { continue };
        let native = rs
            .iter()
            .find(|r| r.system == "native")
            .map(|r| stats::median(&r.times));
        let mut line = format!("{:<28} {:<5}", k.0, k.1);
        for r in rs {
            if let Some(e) = &r.error {
                let short: String = e.chars().take(40).collect();
                line.push_str(&format!(" | {}: ERROR {short}", r.system));
                continue;
            }
            let med = stats::median(&r.times);
            let mut cell = if r.ops > 1 {
                format!(" | {} {:.2} us/op", r.system, med / r.ops as f64 * 1e6)
            } else {
                format!(
                    " | {} {:.4}s [{:.4}-{:.4}]",
                    r.system,
                    med,
                    stats::min(&r.times),
                    stats::max(&r.times)
                )
            };
            if let Some(n) = native {
                if r.system != "native" && n > 0.0 {
                    cell.push_str(&format!(" {:.2}x", med / n));
                }
            }
            if !r.requests.is_empty() {
                cell.push_str(&format!(" req {}", median_u64(&r.requests)));
            }
            if !r.prog_cpu.is_empty() && r.ops <= 1 {
                cell.push_str(&format!(" prog {:.0}ms", stats::median(&r.prog_cpu) * 1e3));
            }
            if !r.cpu.is_empty() {
                cell.push_str(&format!(" daemon {:.0}ms", stats::median(&r.cpu) * 1e3));
            }
            let kinds = median_kinds(&r.kinds);
            if !kinds.is_empty() {
                let top: Vec<String> = kinds
                    .iter()
                    .take(4)
                    .map(|(k, n)| format!("{k} {n}"))
                    .collect();
                cell.push_str(&format!(" ({})", top.join(", ")));
            }
            line.push_str(&cell);
        }
        println!("{line}");
    }
    print_targets(rows);
}

/// Issue 3's targets, judged on the dircache rows.
fn print_targets(rows: &[Row]) {
    let med = |w: &str, sys: &str, cache: &str| -> Option<f64> {
        rows.iter()
            .find(|r| r.workload == w && r.system == sys && r.cache == cache && !r.times.is_empty())
            .map(|r| stats::median(&r.times))
    };
    let has_dc = rows
        .iter()
        .any(|r| r.system == "dircache" && !r.times.is_empty());
    if !has_dc {
        println!("\ntargets (issue 9): no dircache rows (mount unavailable), nothing to judge");
        return;
    }
    let verdict = |ok: bool| if ok { "PASS" } else { "MISS" };
    let mut names: Vec<&str> = Vec::new();
    for r in rows {
        if !names.contains(&r.workload.as_str()) {
            names.push(&r.workload);
        }
    }
    println!("\ntargets (issue 9):");
    // Warm <= 1.10x native on every metadata workload.
    let mut worst: Vec<(f64, &str)> = Vec::new();
    let mut missing = Vec::new();
    for w in names.iter().filter(|w| !w.starts_with("read ")) {
        match (med(w, "dircache", "warm"), med(w, "native", "warm")) {
            (Some(d), Some(n)) if n > 0.0 => worst.push((d / n, w)),
            _ => missing.push(*w),
        }
    }
    worst.sort_by(|a, b| b.0.total_cmp(&a.0));
    let over: Vec<String> = worst
        .iter()
        .filter(|(r, _)| *r > 1.10)
        .map(|(r, w)| format!("{w} {r:.2}x"))
        .collect();
    let ran_warm = rows.iter().any(|r| r.cache == "warm");
    if ran_warm {
        println!(
            "  {} warm <= 1.10x native on every metadata workload: {} of {} over{}{}",
            verdict(over.is_empty() && missing.is_empty()),
            over.len(),
            worst.len(),
            if over.is_empty() {
                String::new()
            } else {
                format!(": {}", over.join(", "))
            },
            if missing.is_empty() {
                String::new()
            } else {
                format!("; no result: {}", missing.join(", "))
            }
        );
    }
    // Warm stat of an 8-component path with 0 requests.
    if let Some(r) = rows.iter().find(|r| {
        r.workload.starts_with("stat 8 components") && r.system == "dircache" && r.cache == "warm"
    }) {
        let q = if r.requests.is_empty() {
            None
        } else {
            Some(median_u64(&r.requests))
        };
        println!(
            "  {} warm stat of an 8-component path reaches the daemon 0 times: {q:?} requests",
            verdict(q == Some(0))
        );
    }
    // Readdir of a cached 10,000-entry directory faster than native.
    if let Some(w) = names.iter().find(|w| w.starts_with("readdir 10000")) {
        if let (Some(d), Some(n)) = (med(w, "dircache", "warm"), med(w, "native", "warm")) {
            println!(
                "  {} warm readdir of 10,000 entries faster than native: {:.2}x native",
                verdict(d < n),
                d / n
            );
        }
    }
    // Cold <= 2x native and faster than bindfs on every workload.
    let mut bad = Vec::new();
    let mut judged = 0;
    for w in &names {
        let (Some(d), Some(n)) = (med(w, "dircache", "cold"), med(w, "native", "cold")) else {
            continue;
        };
        judged += 1;
        let peers: Vec<(&str, f64)> = ["bindfs", "passthrough_hp"]
            .into_iter()
            .filter_map(|p| med(w, p, "cold").map(|m| (p, m)))
            .collect();
        if d > 2.0 * n || peers.iter().any(|(_, b)| d >= *b) {
            let shown: Vec<String> = peers
                .iter()
                .map(|(p, b)| format!("{p} {:.2}x", b / n))
                .collect();
            bad.push(format!(
                "{w} {:.2}x{}",
                d / n,
                if shown.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", shown.join(", "))
                }
            ));
        }
    }
    if judged > 0 {
        println!(
            "  {} cold <= 2x native and faster than every FUSE peer run: {} of {judged} fail{}",
            verdict(bad.is_empty()),
            bad.len(),
            if bad.is_empty() {
                String::new()
            } else {
                format!(": {}", bad.join(", "))
            }
        );
    }
    // Sequential read >= 0.9x native throughput.
    if let Some(w) = names.iter().find(|w| w.starts_with("read ")) {
        for cache in ["warm", "cold"] {
            if let (Some(d), Some(n)) = (med(w, "dircache", cache), med(w, "native", cache)) {
                println!(
                    "  {} {w} ({cache}) >= 0.9x native throughput: {:.2}x",
                    verdict(n / d >= 0.9),
                    n / d
                );
            }
        }
    }
}

#[cfg(test)]
mod cpu_tests {
    use super::stat_ticks;

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        // A command name with a space and a parenthesis; utime 7, stime 5, cutime 3, cstime 2.
        let line = "42 (a b) c) S 1 42 42 0 -1 4194560 100 0 0 0 7 5 3 2 20 0 1 0 99 0 0";
        assert_eq!(stat_ticks(line, 14, 15), Some(12));
        assert_eq!(stat_ticks(line, 16, 17), Some(5));
        assert_eq!(stat_ticks(line, 99, 15), None);
        assert_eq!(stat_ticks("no parenthesis", 14, 15), None);
    }
}
