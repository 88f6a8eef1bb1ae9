//! `dircache mount` and `dircache stats` (owned by the FUSE work).
//!
//! `dircache mount SRC MNT` checks its input, forks, and the child mounts and serves; the
//! parent waits on a pipe until the mount is up (exit 0) or reports the child's error (exit 2
//! for bad input, 1 otherwise). `-f` stays in the foreground. SIGINT/SIGTERM/SIGHUP unmount
//! cleanly; so do `umount MNT` and `fusermount -u MNT` from outside.
//!
//! `mount -t fuse.dircache SRC MNT -o OPTS` (and /etc/fstab) works through the helper
//! `crates/fuse/scripts/mount.fuse.dircache`, installed as `/sbin/mount.fuse.dircache`; so does
//! `mount -o remount,ro MNT`, which reaches `dircache mount SRC MNT -o remount,...`: the flags
//! of the existing mount change (mount(2) with MS_REMOUNT), the daemon keeps serving.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use dircache_fuse::sched::RequestSched;
use dircache_fuse::{kmount, CachePolicy, KernelOptions, MountConfig};

const OPTIONS_HELP: &str = "\
Mount options (-o opt[,opt...]; defaults in brackets), as mount(8) and fstab name them:
  ro / rw                    read-only or read-write mount [rw]
  nosuid / suid              ignore set-user-id bits [nosuid; suid through mount(8)]
  nodev / dev                ignore device files [nodev; dev through mount(8)]
                             (always nosuid/nodev where SRC's file systems are)
  noexec / exec              forbid execution [exec]
  relatime / noatime / strictatime, atime, nodiratime / diratime  access times [relatime]
  sync / async, dirsync      synchronous I/O [async]
  lazytime / nolazytime      passed to the kernel (which ignores it for FUSE)
  remount                    change the flags of the mount at MNT (ro/rw, nosuid, ...);
                             SRC is not used; other options are ignored
  nonempty                   mount over a non-empty MNT (refused otherwise)
  allow_other / noallow_other  other users may use the mount [allow_other]
  default_permissions        always on: the kernel checks permissions
  fsname=NAME, source=NAME   source shown in /proc/mounts [SRC]
  context=, fscontext=, defcontext=, rootcontext=  SELinux labels (kernel options)
  threads=N                  FUSE request threads (and at most N per io_uring queue), 1..=1024 [4]
  readers=all|leader|lazy    all: every request thread reads /dev/fuse; leader: one reads
                             and serves what does not block itself, handing reading on
                             before what may block; lazy: as leader, but hands on only
                             when a request is waiting then (docs/opens.md) [all]
  spin=US                    with readers=leader: poll US microseconds for the next request
                             after a reply while requests come back to back, 0..=1000 [0]
  sched=other|nice:N|fifo:N  scheduling of the request threads: nice value -20..=19, or
                             SCHED_FIFO priority 1..=99 (needs CAP_SYS_NICE; any user of
                             the mount then runs daemon work ahead of every normal task:
                             docs/opens.md) [other]
  prefetch=N / noprefetch    threads listing subdirectories one level ahead of a tree
                             walk (cold find, du, ls -R), 1..=64 [2]
  entry_timeout=SECS         kernel entry TTL, 0..=31536000 [86400]
  attr_timeout=SECS          kernel attribute TTL, 0..=31536000 [86400]
  negative_timeout=SECS      kernel negative-entry TTL, 0 = none, 0..=31536000 [86400]
  cache=on|off               off = every kernel cache off, TTLs 0 (for comparisons) [on]
  bypass                     ByVFS: no metadata cache; each request is one backend call
                             (TTLs 0, plain readdir, listings uncached; for tmpfs/pmem SRC)
  readdirplus / noreaddirplus  listings carry attributes [readdirplus]
  lean / nolean              READDIRPLUS without attributes for files until they are looked up [lean]
  lookahead / nolookahead    list a small directory on its second LOOKUP miss
                             [lookahead; never on remote mounts]
  ahead=N                    with lookahead: levels of subdirectories listed and read
                             ahead of lookups one by one (git status), 0..=8 [0]
  kreaders=N                 with lookahead: threads reading directories through the mount
                             ahead of lookups one by one, 0..=64, 0 = none [8]
  cache_dir / nocache_dir    listings cached in the kernel [cache_dir]
  opendir / noopendir        noopendir = no OPENDIR/RELEASEDIR round trips [noopendir]
  keep_cache / nokeep_cache  file data kept across opens [keep_cache]
  passthrough / nopassthrough  FUSE passthrough for file data (root, 6.9+) [passthrough]
  open=rpc|noopen            rpc: OPEN/RELEASE reach the daemon, which opens as the caller
                             (passthrough possible); noopen: the kernel opens files itself,
                             no request per open+close, no passthrough (docs/opens.md)
                             [rpc]
  acl / noacl                POSIX ACLs cached by the kernel [acl]
  security_xattrs / nosecurity_xattrs  pass security.* xattrs [nosecurity_xattrs]
  io_uring / noio_uring      FUSE over io_uring if the kernel offers it (enable_uring=Y),
                             else /dev/fuse (docs/opens.md) [io_uring]
  max_entries=N              core cache size in dentries [1048576]
  pcc_slots=N                core: prefix-check cache slots per credential [65536]
  Core cache optimizations, each on by default (nofoo turns foo off; docs/core.md):
  completeness / nocompleteness    complete listings answer readdir and misses [on]
  negatives / nonegatives          names known missing answer ENOENT [on]
  deep_negatives / nodeep_negatives  below a missing name, ENOTDIR under files [on]
  protected_hardlinks / noprotected_hardlinks  fs.protected_hardlinks=1 for link [on]
  fastpath / nofastpath            full-path direct lookup + prefix-check cache [on]
  symlink_aliases / nosymlink_aliases  paths through symlinks on the fast path [on]
  walk_batch / nowalk_batch        missing components walked in one backend call [on]
  verify_path / noverify_path      compare full paths on fast-path hits [off]
                             (the last four act on whole-path lookups: the control socket,
                             a remote server; FUSE requests name one component each)
  max_open_per_user=N        backend descriptors one uid may make the daemon hold (opens of
                             one file with the same access share one); past it EMFILE
                             [half of what the process limit leaves after a reserve]
  socket=PATH                stats socket, an absolute path [/run/dircache/PID.sock]
  log=PATH                   the background daemon's log file (an absolute path)
                             [/var/log/dircache/MNT.log for root, else
                             $XDG_STATE_HOME/dircache/MNT.log; the journal under systemd]
  debug                      log every FUSE request (level debug) [off]
  metrics=ADDR:PORT          serve OpenMetrics text at http://ADDR:PORT/metrics (an IP
                             literal; loopback only unless metrics_public; port 0: any) [off]
  metrics_public             allow a metrics address outside loopback (no authentication)
  persist=PATH               warm restart: load the cache's listings and negatives from the
                             snapshot PATH (an absolute path; a file, 0600, root's) at mount,
                             each directory checked against the tree first, and write it
                             when the mount ends [none]
Remote SRC ([user@]host:[path], docs/remote.md): ssh_command=CMD, port=N, serve_command=PATH,
  reconnect_timeout=SECS [10], subtree=N [131072], and ssh options Key=Value (IdentityFile=...);
  container files: cache_dir=PATH [/var/cache/dircache for root, else ~/.cache/dircache],
  cache_size=BYTES [1G], whole_file_max=BYTES [64M], nocontainers (ranged reads/writes),
  disconnected=on|off [on] (cached files and directories usable while the server is away)
Accepted and ignored (for mount(8) and fstab): defaults, auto, noauto, user, nouser,
  users, nofail, _netdev, subtype=dircache, x-*, comment=*; on remount also the options
  mount(8) reads back from /proc/mounts (user_id=, group_id=, rootmode=, ...)";

/// Longest timeout accepted: a year.
const MAX_TIMEOUT_SECS: f64 = 365.0 * 24.0 * 3600.0;
/// Most request threads accepted.
const MAX_THREADS: usize = 1024;
/// Largest per-user descriptor cap accepted (the process limit is lower; the daemon clamps).
const MAX_OPEN_PER_USER: usize = 1 << 20;
/// Longest socket path (`sun_path` holds 108 bytes with the terminating NUL).
const MAX_SOCKET_PATH: usize = 107;

#[derive(clap::Args)]
#[command(after_help = OPTIONS_HELP)]
pub struct MountArgs {
    /// Directory to serve.
    pub src: PathBuf,
    /// Where to mount it.
    pub mnt: PathBuf,
    /// Mount options, comma-separated (see below).
    #[arg(short = 'o', value_name = "OPTS")]
    pub options: Vec<String>,
    /// Stay in the foreground (default: background once the mount is up).
    #[arg(short = 'f', long = "foreground")]
    pub foreground: bool,
}

#[derive(clap::Args)]
pub struct StatsArgs {
    /// Mount point of a running dircache mount.
    pub mnt: PathBuf,
    /// Machine-readable output.
    #[arg(long, conflicts_with = "watch")]
    pub json: bool,
    /// One line of rates every SECS seconds (default 1), like vmstat, until the mount ends.
    #[arg(long, value_name = "SECS", num_args = 0..=1, default_missing_value = "1")]
    pub watch: Option<f64>,
    /// With --watch: stop after this many lines.
    #[arg(long, requires = "watch")]
    pub count: Option<u64>,
}

/// A bad-input error: one line on stderr, exit status 2.
#[derive(Debug)]
pub struct Usage(pub String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// Parsed `-o` options.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    pub policy: CachePolicy,
    /// Kernel flag options in the order given: `(MS_* flag, set)`.
    pub flags: Vec<(libc::c_ulong, bool)>,
    pub allow_other: bool,
    pub max_entries: Option<usize>,
    pub socket: Option<PathBuf>,
    pub fsname: Option<String>,
    /// SELinux options for the kernel (`context=...`).
    pub lsm: Vec<String>,
    /// `-o remount`: change the flags of an existing mount.
    pub remount: bool,
    /// `-o nonempty`: mount over a non-empty directory.
    pub nonempty: bool,
    /// `-o persist=PATH`: the warm-restart snapshot.
    pub persist: Option<PathBuf>,
    /// Core `Config` switches in the order given (`-o nocompleteness`, ...).
    pub core: Vec<(bool, &'static crate::coreopts::Switch)>,
    /// `-o pcc_slots=N`.
    pub pcc_slots: Option<usize>,
    /// `-o log=PATH`: the background daemon's log (logs.rs has the default).
    pub log: Option<PathBuf>,
    /// `-o debug`: log every request.
    pub debug: bool,
    /// `-o metrics=ADDR:PORT` (metricsopt.rs).
    pub metrics: Option<std::net::SocketAddr>,
    /// `-o metrics_public`: a non-loopback metrics address is wanted.
    pub metrics_public: bool,
}

impl Options {
    /// The kernel options of a new mount.
    pub fn kernel(&self) -> KernelOptions {
        let d = KernelOptions::default();
        KernelOptions {
            flags: kmount::apply_flags(d.flags, &self.flags),
            fsname: self.fsname.clone(),
            lsm: self.lsm.clone(),
        }
    }
}

fn secs(v: &str, opt: &str) -> Result<Duration, Usage> {
    v.parse::<f64>()
        .ok()
        .filter(|s| (0.0..=MAX_TIMEOUT_SECS).contains(s))
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .ok_or_else(|| {
            Usage(format!(
                "bad value for -o {opt}: {v:?} (seconds from 0 to {MAX_TIMEOUT_SECS} expected)"
            ))
        })
}

fn num(v: &str, opt: &str, max: usize) -> Result<usize, Usage> {
    v.parse::<usize>()
        .ok()
        .filter(|n| (1..=max).contains(n))
        .ok_or_else(|| {
            Usage(format!(
                "bad value for -o {opt}: {v:?} (a number from 1 to {max} expected)"
            ))
        })
}

fn socket_path(v: Option<&str>) -> Result<PathBuf, Usage> {
    let v = v.unwrap_or("");
    if v.is_empty() || !v.starts_with('/') {
        return Err(Usage(format!(
            "bad value for -o socket: {v:?} (an absolute path expected)"
        )));
    }
    if v.len() > MAX_SOCKET_PATH {
        return Err(Usage(format!(
            "bad value for -o socket: a path of {} bytes (at most {MAX_SOCKET_PATH}: the limit of a unix socket address)",
            v.len()
        )));
    }
    Ok(PathBuf::from(v))
}

fn persist_path(v: Option<&str>) -> Result<PathBuf, Usage> {
    file_path(v, "persist")
}

/// The value of `-o opt=PATH` naming a file: absolute, not a directory.
fn file_path(v: Option<&str>, opt: &str) -> Result<PathBuf, Usage> {
    let v = v.unwrap_or("");
    if !v.starts_with('/') || v.ends_with('/') {
        return Err(Usage(format!(
            "bad value for -o {opt}: {v:?} (an absolute path of a file expected)"
        )));
    }
    let p = PathBuf::from(v);
    if p.is_dir() {
        return Err(Usage(format!(
            "-o {opt}={v}: a directory (a file expected)"
        )));
    }
    Ok(p)
}

/// Split an option list at commas outside double quotes (`context="a,b"`), as mount(8) does.
pub(crate) fn split_options(list: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut quoted) = (0, false);
    for (i, c) in list.char_indices() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => {
                out.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&list[start..]);
    out
}

/// Parse `-o` option lists.
pub fn parse_options(lists: &[String]) -> Result<Options, Usage> {
    let mut o = Options {
        policy: CachePolicy::default(),
        flags: Vec::new(),
        allow_other: true,
        max_entries: None,
        socket: None,
        fsname: None,
        lsm: Vec::new(),
        remount: false,
        nonempty: false,
        persist: None,
        log: None,
        debug: false,
        core: Vec::new(),
        pcc_slots: None,
        metrics: None,
        metrics_public: false,
    };
    let mut cache_off = false;
    let mut bypass = false;
    let mut overrides: Vec<(String, Option<String>)> = Vec::new();
    // Options mount(8) reads back from /proc/mounts and hands to the helper on remount.
    let mut kernel_shown: Vec<String> = Vec::new();
    for list in lists {
        for opt in split_options(list)
            .into_iter()
            .map(str::trim)
            .filter(|s| !s.is_empty())
        {
            let (k, v) = match opt.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (opt, None),
            };
            let no_value = || -> Result<(), Usage> {
                match v {
                    Some(_) => Err(Usage(format!("-o {k} takes no value"))),
                    None => Ok(()),
                }
            };
            if let Some(f) = kmount::flag_option(k) {
                no_value()?;
                o.flags.push(f);
                continue;
            }
            match k {
                "remount" => {
                    no_value()?;
                    o.remount = true;
                }
                "nonempty" => {
                    no_value()?;
                    o.nonempty = true;
                }
                "bypass" => {
                    no_value()?;
                    bypass = true;
                }
                "cache" => match v {
                    Some("on") => {}
                    Some("off") => cache_off = true,
                    _ => return Err(Usage(format!("bad value for -o cache: {v:?} (on or off)"))),
                },
                "allow_other"
                | "noallow_other"
                | "default_permissions"
                | "defaults"
                | "auto"
                | "noauto"
                | "user"
                | "nouser"
                | "users"
                | "nofail"
                | "_netdev" => {
                    no_value()?;
                    match k {
                        "allow_other" => o.allow_other = true,
                        "noallow_other" => o.allow_other = false,
                        _ => {}
                    }
                }
                "comment" => {}
                k if k.starts_with("x-") => {}
                "fsname" | "source" => match v {
                    Some(n) if !n.is_empty() => {
                        if o.fsname.as_deref().is_some_and(|f| f != n) {
                            return Err(Usage(format!(
                                "-o {k}={n} conflicts with the source given before ({:?})",
                                o.fsname.as_deref().unwrap_or("")
                            )));
                        }
                        o.fsname = Some(n.to_string());
                    }
                    _ => return Err(Usage(format!("-o {k} needs a name"))),
                },
                "subtype" => {
                    if v != Some("dircache") {
                        return Err(Usage(format!(
                            "bad value for -o subtype: {v:?} (dircache mounts are fuse.dircache)"
                        )));
                    }
                }
                k if kmount::LSM_OPTIONS.contains(&k) => match v {
                    Some(c) if !c.is_empty() => {
                        if !kmount::selinux_enabled() {
                            return Err(Usage(format!(
                                "-o {k}: SELinux is not enabled on this system (no labels to set)"
                            )));
                        }
                        o.lsm.push(opt.to_string());
                    }
                    _ => return Err(Usage(format!("-o {k} needs an SELinux context"))),
                },
                "user_id" | "group_id" | "rootmode" | "max_read" | "blksize" | "fd"
                | "seclabel" => {
                    kernel_shown.push(opt.to_string());
                }
                "max_entries" => o.max_entries = Some(num(v.unwrap_or(""), k, usize::MAX)?),
                "pcc_slots" => {
                    o.pcc_slots = Some(num(v.unwrap_or(""), k, crate::coreopts::MAX_PCC_SLOTS)?)
                }
                _ if crate::coreopts::parse(k).is_some() => {
                    no_value()?;
                    o.core.extend(crate::coreopts::parse(k));
                }
                "socket" => o.socket = Some(socket_path(v)?),
                "persist" => o.persist = Some(persist_path(v)?),
                "log" => o.log = Some(file_path(v, "log")?),
                "debug" => o.debug = true,
                "metrics" => o.metrics = Some(crate::metricsopt::addr(v)?),
                "metrics_public" => {
                    no_value()?;
                    o.metrics_public = true;
                }
                "threads" | "max_open_per_user" | "entry_timeout" | "attr_timeout"
                | "negative_timeout" | "readdirplus" | "noreaddirplus" | "lean" | "nolean"
                | "lookahead" | "nolookahead" | "cache_dir" | "nocache_dir" | "opendir"
                | "noopendir" | "keep_cache" | "nokeep_cache" | "passthrough" | "nopassthrough"
                | "acl" | "noacl" | "security_xattrs" | "nosecurity_xattrs" | "open"
                | "prefetch" | "noprefetch" | "io_uring" | "noio_uring" | "readers" | "spin"
                | "ahead" | "kreaders" | "sched" => {
                    overrides.push((k.to_string(), v.map(str::to_string)));
                }
                _ => return Err(Usage(format!("unknown mount option -o {opt}"))),
            }
        }
    }
    if let Some(first) = kernel_shown.first() {
        if !o.remount {
            return Err(Usage(format!(
                "-o {first}: set by dircache itself (accepted only with remount)"
            )));
        }
    }
    crate::metricsopt::check(o.metrics, o.metrics_public)?;
    if cache_off {
        o.policy = CachePolicy::uncached();
    }
    if bypass {
        o.policy = o.policy.bypassing();
        if let Some((_, s)) = o.core.iter().find(|(on, _)| *on) {
            return Err(Usage(format!(
                "-o {}: the core caches nothing with -o bypass",
                s.name
            )));
        }
    }
    for (k, v) in overrides {
        let p = &mut o.policy;
        let v = v.as_deref();
        let boolean = |v: Option<&str>| -> Result<(), Usage> {
            match v {
                None => Ok(()),
                Some(_) => Err(Usage(format!("-o {k} takes no value"))),
            }
        };
        match k.as_str() {
            "threads" => p.threads = num(v.unwrap_or(""), &k, MAX_THREADS)?,
            "prefetch" => p.prefetch_threads = num(v.unwrap_or(""), &k, 64)?,
            "kreaders" => {
                p.kernel_readers = v
                    .and_then(|v| v.parse::<usize>().ok())
                    .filter(|n| *n <= 64)
                    .ok_or_else(|| {
                        Usage(format!(
                            "bad value for -o kreaders: {v:?} (0 to 64 expected)"
                        ))
                    })?
            }
            "readers" => {
                (p.leader_follower, p.lazy_handoff) = match v {
                    Some("leader") => (true, false),
                    Some("lazy") => (true, true),
                    Some("all") => (false, false),
                    _ => return Err(Usage("-o readers takes leader, lazy or all".into())),
                }
            }
            "spin" => {
                p.spin_us = v
                    .and_then(|v| v.parse::<u32>().ok())
                    .filter(|n| *n <= 1000)
                    .ok_or_else(|| Usage("-o spin takes microseconds from 0 to 1000".into()))?
            }
            "sched" => p.request_sched = v.unwrap_or("").parse().map_err(Usage)?,
            "ahead" => {
                p.lookahead_levels = v
                    .and_then(|v| v.parse::<u8>().ok())
                    .filter(|n| *n <= 8)
                    .ok_or_else(|| {
                        Usage(format!("bad value for -o ahead: {v:?} (0 to 8 expected)"))
                    })?
            }
            "noprefetch" => {
                boolean(v)?;
                p.prefetch_threads = 0
            }
            "max_open_per_user" => {
                p.max_open_per_user = num(v.unwrap_or(""), &k, MAX_OPEN_PER_USER)?
            }
            "entry_timeout" => p.entry_ttl = secs(v.unwrap_or(""), &k)?,
            "attr_timeout" => p.attr_ttl = secs(v.unwrap_or(""), &k)?,
            "negative_timeout" => p.negative_ttl = secs(v.unwrap_or(""), &k)?,
            "open" => {
                p.no_open = match v {
                    Some("rpc") => false,
                    Some("noopen") => true,
                    _ => return Err(Usage("-o open takes rpc or noopen".into())),
                }
            }
            other => {
                boolean(v)?;
                let (on, name) = match other.strip_prefix("no") {
                    Some(n) => (false, n),
                    None => (true, other),
                };
                match name {
                    "readdirplus" => p.readdirplus = on,
                    "lean" => p.lean = on,
                    "lookahead" => p.lookahead = on,
                    "cache_dir" => p.cache_dir = on,
                    "opendir" => p.no_opendir = !on,
                    "keep_cache" => p.keep_cache = on,
                    "passthrough" => p.passthrough = on,
                    "acl" => p.posix_acl = on,
                    "security_xattrs" => p.security_xattrs = on,
                    "io_uring" => p.io_uring = on,
                    _ => return Err(Usage(format!("unknown mount option -o {other}"))),
                }
            }
        }
    }
    if matches!(o.policy.request_sched, RequestSched::Fifo(_))
        && o.policy.spin_us > 0
        && o.policy.leader_follower
    {
        // A real-time thread polling for requests holds its CPU from every normal task.
        return Err(Usage(
            "-o sched=fifo:N with -o spin: a real-time thread would poll its CPU away".into(),
        ));
    }
    if o.policy.no_open && !o.policy.posix_acl {
        // The kernel alone decides access under noopen, and without ACLs it reads only the
        // mode bits: a user an ACL refuses would read through the daemon's root descriptor.
        return Err(Usage(
            "-o open=noopen needs -o acl: without the kernel checking ACLs, a user an ACL \
             refuses could read and write files (docs/opens.md)"
                .into(),
        ));
    }
    Ok(o)
}

/// The error for a path on a FUSE mount whose daemon is gone (ENOTCONN), else `e` as is.
fn path_error(p: &Path, e: &std::io::Error) -> Usage {
    if e.raw_os_error() == Some(libc::ENOTCONN) {
        let d = p.display();
        return Usage(format!(
            "{d}: a FUSE mount whose daemon is gone ({e}): unmount it first with `umount {d}` \
             (or `fusermount3 -u {d}`)"
        ));
    }
    Usage(format!("{}: {e}", p.display()))
}

fn need_root(what: &str) -> Result<(), Usage> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(Usage(format!(
            "not enough privilege: dircache mount must run as root ({what})"
        )));
    }
    Ok(())
}

/// `-o remount`: change the flags of the dircache mount at `mnt`, starting from the flags it
/// has (so `remount,ro` keeps nosuid, nodev, noexec...). SRC is not used.
pub fn remount(mnt: &Path, o: &Options) -> Result<(), Usage> {
    if let Err(e) = std::fs::metadata(mnt) {
        return Err(path_error(mnt, &e));
    }
    let Some(entry) = kmount::mount_entry(mnt) else {
        return Err(Usage(format!(
            "{}: not mounted (nothing to remount)",
            mnt.display()
        )));
    };
    if entry.fstype != "fuse.dircache" {
        return Err(Usage(format!(
            "{}: not a dircache mount (it is {})",
            mnt.display(),
            entry.fstype
        )));
    }
    need_root("remount calls mount(2)")?;
    let mut flags = kmount::apply_flags(entry.flags, &o.flags);
    // Turning suid/dev on: never where SRC's file systems ignore them (as at mount time).
    // SRC is the mount's source, which is its path unless the mount was given an fsname.
    let turning_on = entry.flags & !flags & (libc::MS_NOSUID | libc::MS_NODEV);
    if turning_on != 0 {
        let src = Path::new(&entry.source);
        if !(src.is_absolute() && src.is_dir()) {
            return Err(Usage(format!(
                "{}: cannot turn suid/dev on by remount: the mount's source {:?} is not the \
                 path of its SRC (fsname=); mount it again instead",
                mnt.display(),
                entry.source
            )));
        }
        let kept = kmount::src_restrictions(src) & turning_on;
        if kept != 0 {
            eprintln!(
                "dircache: {}: its file system ignores {}: so does the mount",
                src.display(),
                kmount::restriction_names(kept)
            );
            flags |= kept;
        }
    }
    kmount::remount(&entry.mnt, flags).map_err(|e| Usage(format!("remount {}: {e}", mnt.display())))
}

/// Check SRC, MNT, /dev/fuse and privileges before mounting.
pub fn check_input(src: &Path, mnt: &Path, nonempty: bool) -> Result<(), Usage> {
    match std::fs::metadata(src) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(Usage(format!("{}: not a directory", src.display()))),
        Err(e) => return Err(path_error(src, &e)),
    }
    match std::fs::metadata(mnt) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(Usage(format!(
                "{}: mount point is not a directory",
                mnt.display()
            )))
        }
        Err(e) => return Err(path_error(mnt, &e)),
    }
    if dircache_fuse::is_mount_point(mnt) {
        return Err(Usage(format!("{}: already a mount point", mnt.display())));
    }
    if !nonempty {
        match std::fs::read_dir(mnt) {
            Ok(mut d) => {
                if d.next().is_some() {
                    return Err(Usage(format!(
                        "{}: mount point is not empty (its files would be hidden; -o nonempty \
                         mounts over them anyway)",
                        mnt.display()
                    )));
                }
            }
            Err(e) => return Err(path_error(mnt, &e)),
        }
    }
    if !Path::new("/dev/fuse").exists() {
        return Err(Usage(
            "/dev/fuse does not exist (is the fuse module loaded?)".into(),
        ));
    }
    need_root("it mounts with mount(2) and creates files as the calling user")?;
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        return Err(Usage(format!("/dev/fuse: {e}")));
    }
    Ok(())
}

fn pipe() -> anyhow::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0i32; 2];
    // SAFETY: fds is a valid array of two ints.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error()).context("pipe");
    }
    // SAFETY: pipe2 returned two fresh descriptors that nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Status message from the daemon child to the waiting parent: `0` ready, else `code msg`.
fn report(w: &mut Option<std::fs::File>, code: i32, msg: &str) {
    if let Some(mut f) = w.take() {
        let _ = write!(f, "{code} {msg}");
    }
}

pub fn run_mount(a: MountArgs) -> anyhow::Result<i32> {
    // A remote SRC (`host:path`): its options out of -o; its server checks the directory.
    let (remote, options) = match crate::remote::split(&a.src, &a.options) {
        Ok(x) => x,
        Err(Usage(m)) => {
            eprintln!("dircache: {m}");
            return Ok(2);
        }
    };
    let checked = parse_options(&options).and_then(|o| {
        if o.remount {
            remount(&a.mnt, &o)?;
        } else {
            let src = if remote.is_some() { &a.mnt } else { &a.src };
            check_input(src, &a.mnt, o.nonempty)?;
        }
        Ok(o)
    });
    let opts = match checked {
        Ok(o) if o.remount => return Ok(0),
        Ok(o) => o,
        Err(Usage(m)) => {
            eprintln!("dircache: {m}");
            return Ok(2);
        }
    };
    // The mount keeps nosuid/nodev where SRC's file systems have them (dircache_fuse::mount
    // enforces it); say so here, where the user sees it.
    let kept = kmount::src_restrictions(&a.src) & !opts.kernel().flags;
    if kept != 0 && remote.is_none() {
        eprintln!(
            "dircache: {}: its file system ignores {}: so does the mount",
            a.src.display(),
            kmount::restriction_names(kept)
        );
    }
    let level = if opts.debug { "debug" } else { "info" };
    let mut log = None;
    if a.foreground {
        crate::logs::init(if opts.debug {
            level
        } else {
            crate::logs::QUIET
        });
    } else {
        let mnt = kmount::mount_path(&a.mnt).unwrap_or_else(|_| a.mnt.clone());
        log = match crate::logs::open(opts.log.as_deref(), &mnt) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("dircache: {e:#}");
                return Ok(1);
            }
        };
    }
    let log_hint = log
        .as_ref()
        .map(|l| format!(" (the daemon's log: {})", l.path.display()))
        .unwrap_or_default();
    let mut status_pipe: Option<std::fs::File> = None;
    if !a.foreground {
        let (r, w) = pipe()?;
        // SAFETY: the process is single-threaded here (nothing has spawned a thread yet), so
        // the child may continue running arbitrary Rust code after fork.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(std::io::Error::last_os_error()).context("fork");
        }
        if pid > 0 {
            drop(w);
            let mut s = String::new();
            let _ = std::fs::File::from(r).read_to_string(&mut s);
            let (code, msg) = s.split_once(' ').unwrap_or((s.as_str(), ""));
            return match code.parse::<i32>() {
                Ok(0) => Ok(0),
                Ok(c) => {
                    eprintln!("dircache: {msg}{log_hint}");
                    Ok(c)
                }
                Err(_) => {
                    eprintln!(
                        "dircache: the mount daemon exited before the mount was ready{log_hint}"
                    );
                    Ok(1)
                }
            };
        }
        drop(r);
        // SAFETY: setsid has no preconditions; detaches from the controlling terminal.
        unsafe { libc::setsid() };
        status_pipe = Some(std::fs::File::from(w));
        if let Some(l) = &log {
            l.redirect_stderr();
        }
        crate::logs::init(level);
        tracing::info!(
            "dircache {} mounting {} on {} (pid {})",
            env!("CARGO_PKG_VERSION"),
            a.src.display(),
            a.mnt.display(),
            std::process::id()
        );
    }
    match serve(&a, opts, remote, &mut status_pipe) {
        Ok(()) => Ok(0),
        Err(e) => {
            tracing::error!("{e:#}");
            let code = if e.downcast_ref::<Usage>().is_some() {
                2
            } else {
                1
            };
            if status_pipe.is_some() {
                report(&mut status_pipe, code, &format!("{e:#}"));
                Ok(code)
            } else if code == 2 {
                eprintln!("dircache: {e:#}");
                Ok(2)
            } else {
                Err(e)
            }
        }
    }
}

fn block_signals() -> libc::sigset_t {
    // SAFETY: a zeroed sigset_t is valid input for sigemptyset, which initializes it.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: set is a valid sigset_t; signal numbers are valid.
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGHUP);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    set
}

fn serve(
    a: &MountArgs,
    opts: Options,
    remote: Option<crate::remote::Remote>,
    status: &mut Option<std::fs::File>,
) -> anyhow::Result<()> {
    // Signals are handled by one thread with sigwait; every other thread inherits the mask.
    let set = block_signals();
    // The process umask stays 0: request threads set their own to the caller's around each
    // creation (dircache_fuse's umask module), so the umask applies only without a default ACL.
    // SAFETY: umask has no preconditions.
    unsafe { libc::umask(0) };
    let mnt = a
        .mnt
        .canonicalize()
        .with_context(|| a.mnt.display().to_string())?;
    let mut containers = None;
    let (src, backend): (PathBuf, Arc<dyn dircache_core::Backend>) = match &remote {
        Some(r) => {
            let b = r.connect()?;
            containers = b.containers().map(crate::remote::RemoveContainers);
            (a.src.clone(), Arc::new(b))
        }
        None => {
            let src = a
                .src
                .canonicalize()
                .with_context(|| a.src.display().to_string())?;
            let backend = dircache_local::LocalBackend::new(&src)
                .map_err(|e| anyhow::anyhow!("{}: {e}", src.display()))?;
            (src, Arc::new(backend))
        }
    };
    let mut config = if opts.policy.bypass {
        dircache_core::Config::bypass_mode()
    } else {
        dircache_core::Config::default()
    };
    if let Some(n) = opts.max_entries {
        config.max_entries = n;
    }
    if let Some(n) = opts.pcc_slots {
        config.pcc_slots = n;
    }
    crate::coreopts::apply(&mut config, &opts.core);
    let cache =
        dircache_core::Cache::new(backend, config).map_err(|e| anyhow::anyhow!("cache: {e}"))?;
    let socket = opts
        .socket
        .clone()
        .unwrap_or_else(dircache_fuse::stats::default_socket_path);
    let mut cfg = match remote {
        Some(_) => MountConfig::without_src(&mnt),
        None => MountConfig::new(&src, &mnt),
    };
    cfg.policy = opts.policy.clone();
    // A remote core has every listed entry's attributes (bulk listings): files still go out
    // lean (fs/dirs.rs), so a cold `find` instantiates no file inode in the kernel.
    cfg.policy.lean_cached = remote.is_some();
    // Lookahead (fuse/src/lookahead.rs) is measured on local trees only: a remote mount's
    // round trips per workload are what its tests count, and it lists in bulk already.
    cfg.policy.lookahead &= remote.is_none();
    cfg.kernel = opts.kernel();
    if cfg.src.is_none() && cfg.kernel.fsname.is_none() {
        cfg.kernel.fsname = Some(src.display().to_string());
    }
    cfg.allow_other = opts.allow_other;
    cfg.socket_path = Some(socket);
    cfg.persist = opts.persist.clone();
    cfg.metrics = opts.metrics;
    let mounted = dircache_fuse::mount(cache, &cfg).map_err(|e| anyhow::anyhow!("{e}"))?;
    tracing::info!("mounted {} on {}", src.display(), mnt.display());

    let mnt2 = mnt.clone();
    std::thread::Builder::new()
        .name("dircache-signals".into())
        .spawn(move || {
            let mut sig: libc::c_int = 0;
            // SAFETY: set is an initialized sigset_t and sig a valid out pointer.
            while unsafe { libc::sigwait(&set, &mut sig) } == 0 {
                tracing::info!("signal {sig}: unmounting {}", mnt2.display());
                if let Err(e) = dircache_fuse::unmount(&mnt2) {
                    tracing::warn!("unmount {}: {e}", mnt2.display());
                }
            }
        })?;

    if status.is_some() {
        report(status, 0, "ready");
        // The parent has exited: detach from its terminal's stdio.
        if let Ok(null) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")
        {
            // Standard error stays where logs.rs put it (the log file, or the journal).
            for fd in 0..2 {
                // SAFETY: dup2 onto the standard descriptors, which this process owns.
                unsafe { libc::dup2(null.as_raw_fd(), fd) };
            }
        }
    }
    mounted.run().map_err(|e| anyhow::anyhow!("{e}"))?;
    tracing::info!("unmounted {}", mnt.display());
    drop(containers);
    Ok(())
}

pub fn run_stats(a: StatsArgs) -> anyhow::Result<i32> {
    if let Some(every) = a.watch {
        return crate::statwatch::run(&a.mnt, every, a.count);
    }
    let resp = match dircache_fuse::stats::query_mount(&a.mnt, &serde_json::json!({"op": "stats"}))
    {
        Ok(r) => r,
        Err(e @ dircache_fuse::Error::NotDircache(..)) => {
            eprintln!("dircache: {e}");
            return Ok(2);
        }
        Err(e) => anyhow::bail!("stats: {e}"),
    };
    if resp.get("ok").and_then(|v| v.as_bool()) != Some(true) {
        anyhow::bail!(
            "daemon: {}",
            resp.get("error")
                .and_then(|v| v.as_str())
                .unwrap_or("error")
        );
    }
    let stats = resp.get("stats").cloned().unwrap_or_default();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&stats)?);
    } else {
        print!("{}", human(&stats));
    }
    Ok(0)
}

fn human(s: &serde_json::Value) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let g = |v: &serde_json::Value, k: &str| v.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
    let _ = writeln!(
        out,
        "dircache mount {} -> {} (pid {}, up {:.0} s)",
        s.get("src").and_then(|v| v.as_str()).unwrap_or("?"),
        s.get("mnt").and_then(|v| v.as_str()).unwrap_or("?"),
        g(s, "pid"),
        s.get("uptime_s").and_then(|v| v.as_f64()).unwrap_or(0.0)
    );
    let core = s.get("core").cloned().unwrap_or_default();
    let hits = g(&core, "hits");
    let misses = g(&core, "misses");
    let rate = if hits + misses > 0 {
        100.0 * hits as f64 / (hits + misses) as f64
    } else {
        0.0
    };
    let _ = writeln!(out, "core cache:   {hits} hits, {misses} misses ({rate:.1}% hit rate), {} negative hits, {} fast-path hits",
        g(&core, "negative_hits"), g(&core, "fastpath_hits"));
    let _ = writeln!(out, "{}", crate::statwatch::by_kind(&core));
    let _ = writeln!(
        out,
        "  entries:    {} dentries, {} fast-table entries, {} bytes, {} evictions",
        g(&core, "entries"),
        g(&core, "fast_entries"),
        g(&core, "bytes"),
        g(&core, "evictions")
    );
    let _ = writeln!(
        out,
        "  backend:    lookup {} walk {} getattr {} readdir {} readlink {} mutation {}",
        g(&core, "backend_lookup"),
        g(&core, "backend_walk"),
        g(&core, "backend_getattr"),
        g(&core, "backend_readdir"),
        g(&core, "backend_readlink"),
        g(&core, "backend_mutation")
    );
    let _ = writeln!(
        out,
        "  invalidations: {} ({} entries)",
        g(&core, "invalidations"),
        g(&core, "invalidated_entries")
    );
    let kr = s.get("kernel_requests").cloned().unwrap_or_default();
    let _ = writeln!(
        out,
        "kernel requests: {} total, {} negative lookups, {} passthrough opens",
        g(&kr, "total"),
        g(&kr, "negative_lookups"),
        g(&kr, "passthrough_opens")
    );
    if let Some(m) = kr.get("by_kind").and_then(|v| v.as_object()) {
        let mut kinds: Vec<_> = m.iter().collect();
        kinds.sort_by_key(|(_, v)| std::cmp::Reverse(v.as_u64().unwrap_or(0)));
        for (k, v) in kinds {
            let _ = writeln!(out, "  {k:<16} {}", v.as_u64().unwrap_or(0));
        }
    }
    let _ = writeln!(out, "kernel inodes:  {}", g(s, "kernel_inodes"));
    let pf = s.get("prefetch").cloned().unwrap_or_default();
    let _ = writeln!(
        out,
        "prefetch:     {} listings ahead of walks, {} dropped, {} pending, {} on lookups ({} read through the mount), {} ahead of lookups ({} read)",
        g(&pf, "listings"),
        g(&pf, "dropped"),
        g(&pf, "pending"),
        g(&pf, "lookahead"),
        g(&pf, "lookahead_kernel_reads"),
        g(&pf, "lookahead_ahead"),
        g(&pf, "lookahead_ahead_reads")
    );
    let n = s.get("notifier").cloned().unwrap_or_default();
    let _ = writeln!(
        out,
        "notifier:     {} changes, {} inval_entry, {} inval_inode, {} errors",
        g(&n, "changes"),
        g(&n, "inval_entry"),
        g(&n, "inval_inode"),
        g(&n, "errors")
    );
    let b = s.get("backend").cloned().unwrap_or_default();
    if b.get("round_trips").is_some() {
        let _ = writeln!(out, "remote:       {} round trips", g(&b, "round_trips"));
    }
    if b.get("containers_fetches").is_some() {
        let _ = writeln!(
            out,
            "containers:   {} fetches ({} bytes), {} hits with no round trip, {} revalidated at \
             open, {} stores back ({} bytes), {} evictions",
            g(&b, "containers_fetches"),
            g(&b, "containers_fetched_bytes"),
            g(&b, "containers_hits"),
            g(&b, "containers_revalidated_at_open"),
            g(&b, "containers_stores"),
            g(&b, "containers_stored_bytes"),
            g(&b, "containers_evictions")
        );
        let _ = writeln!(
            out,
            "  held:       {} of {} bytes{}; from the last mount: {} taken over, {} revalidated \
             at mount, {} stale",
            g(&b, "containers_bytes"),
            g(&b, "containers_max_bytes"),
            if g(&b, "containers_kept") == 1 {
                " (kept across mounts)"
            } else {
                " (this mount's only)"
            },
            g(&b, "containers_restored"),
            g(&b, "containers_revalidated_at_mount"),
            g(&b, "containers_stale_at_mount")
        );
    }
    if b.get("conflicts").is_some() {
        let _ = writeln!(
            out,
            "disconnected: {} disconnections, {} records reintegrated, {} conflicts (dircache \
             conflicts MNT)",
            g(&b, "disconnections"),
            g(&b, "reintegrated"),
            g(&b, "conflicts")
        );
    }
    let m = s.get("memory").cloned().unwrap_or_default();
    let _ = writeln!(out, "memory:       {} bytes resident", g(&m, "rss_bytes"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Options, Usage> {
        parse_options(&[s.to_string()])
    }

    #[test]
    fn defaults() {
        let o = p("").unwrap();
        assert_eq!(o.policy, CachePolicy::default());
        assert!(o.allow_other);
        assert!(o.flags.is_empty());
        assert_eq!(o.kernel(), KernelOptions::default());
    }

    #[test]
    fn kernel_flags_and_ignored() {
        let o = p("ro,suid,defaults,noauto,x-systemd.automount,_netdev,nofail").unwrap();
        assert_eq!(o.kernel().flags, libc::MS_RDONLY | libc::MS_NODEV);
        let o = p("fsname=a,source=a,context=\"x,y\"");
        if kmount::selinux_enabled() {
            assert_eq!(o.unwrap().lsm, vec!["context=\"x,y\"".to_string()]);
        } else {
            assert!(o.unwrap_err().0.contains("SELinux"));
        }
        assert!(p("fsname=a,source=b").is_err());
        assert!(p("user_id=0").is_err());
        assert!(p("remount,ro,user_id=0,group_id=0").unwrap().remount);
    }

    #[test]
    fn policy_options() {
        let o = parse_options(&[
            "threads=2,entry_timeout=1.5".into(),
            "nopassthrough,noacl,opendir".into(),
        ])
        .unwrap();
        assert_eq!(o.policy.threads, 2);
        assert_eq!(o.policy.entry_ttl, Duration::from_millis(1500));
        assert!(!o.policy.passthrough);
        assert!(!o.policy.posix_acl);
        assert!(!o.policy.no_opendir);
        let o = p("cache=off,readdirplus").unwrap();
        assert_eq!(o.policy.attr_ttl, Duration::ZERO);
        assert!(o.policy.readdirplus);
        let o = p("max_entries=1000,socket=/tmp/x.sock,fsname=foo").unwrap();
        assert_eq!(o.max_entries, Some(1000));
        assert_eq!(o.socket, Some(PathBuf::from("/tmp/x.sock")));
        assert_eq!(o.fsname.as_deref(), Some("foo"));
        let o = p("persist=/var/tmp/dc.snap").unwrap();
        assert_eq!(o.persist, Some(PathBuf::from("/var/tmp/dc.snap")));
        assert!(p("persist=rel.snap").is_err());
        assert!(p("persist").is_err());
        assert!(p("persist=/tmp/").is_err());
        assert!(p("persist=/tmp").is_err());
        assert!(!p("").unwrap().policy.no_open);
        assert!(p("open=noopen").unwrap().policy.no_open);
        assert!(!p("open=noopen,open=rpc").unwrap().policy.no_open);
    }

    #[test]
    fn bypass_option() {
        let o = p("bypass").unwrap();
        assert!(o.policy.bypass);
        assert_eq!(o.policy.entry_ttl, Duration::ZERO);
        assert_eq!(o.policy.negative_ttl, Duration::ZERO);
        assert!(!o.policy.readdirplus && !o.policy.cache_dir && !o.policy.no_opendir);
        assert!(o.policy.passthrough, "data stays as the mount's");
        let o = p("bypass,attr_timeout=2,readdirplus").unwrap();
        assert_eq!(o.policy.attr_ttl, Duration::from_secs(2));
        assert!(o.policy.readdirplus, "explicit options win");
        assert!(!p("").unwrap().policy.bypass);
        assert!(p("bypass=1").is_err());
    }

    #[test]
    fn read_only_mounts_keep_rpc_unless_asked() {
        // noopen reads ESTALE from a file replaced in SRC while open (docs/opens.md,
        // "Read-only mounts and `open=noopen`"): a mount option asks for it, `ro` does not.
        assert!(!p("ro").unwrap().policy.no_open);
        assert!(p("ro,open=noopen").unwrap().policy.no_open);
    }

    #[test]
    fn sched_option() {
        let p = |s: &str| parse_options(&[s.to_string()]);
        assert_eq!(
            p("").unwrap().policy.request_sched,
            RequestSched::Inherit,
            "unchanged by default"
        );
        assert_eq!(
            p("sched=fifo:2").unwrap().policy.request_sched,
            RequestSched::Fifo(2)
        );
        assert_eq!(
            p("sched=nice:-5").unwrap().policy.request_sched,
            RequestSched::Nice(-5)
        );
        assert!(p("sched").is_err() && p("sched=fifo:0").is_err());
        assert!(p("sched=fifo:1,readers=leader,spin=30").is_err());
        assert!(p("sched=nice:-5,readers=leader,spin=30").is_ok());
    }

    #[test]
    fn readers_and_spin_options() {
        let d = p("").unwrap().policy;
        assert!(
            !d.leader_follower && d.spin_us == 0,
            "every thread reads, no polling"
        );
        let o = p("readers=leader,spin=30").unwrap().policy;
        assert!(o.leader_follower && o.spin_us == 30 && !o.lazy_handoff);
        let o = p("readers=lazy").unwrap().policy;
        assert!(o.leader_follower && o.lazy_handoff);
        assert!(
            !p("readers=leader,readers=all")
                .unwrap()
                .policy
                .leader_follower
        );
        assert_eq!(p("spin=0").unwrap().policy.spin_us, 0);
        assert!(p("readers=some").is_err() && p("readers").is_err());
        assert!(p("spin=1001").is_err() && p("spin").is_err() && p("spin=-1").is_err());
    }

    #[test]
    fn io_uring_option() {
        assert!(p("").unwrap().policy.io_uring, "on by default");
        assert!(!p("noio_uring").unwrap().policy.io_uring);
        assert!(p("io_uring").unwrap().policy.io_uring);
        assert!(
            !p("io_uring,noio_uring").unwrap().policy.io_uring,
            "the last word wins"
        );
    }

    #[test]
    fn prefetch_option() {
        assert_eq!(p("prefetch=3").unwrap().policy.prefetch_threads, 3);
        assert_eq!(p("noprefetch").unwrap().policy.prefetch_threads, 0);
        assert_eq!(parse_options(&[]).unwrap().policy.prefetch_threads, 2);
        assert_eq!(p("kreaders=0").unwrap().policy.kernel_readers, 0);
        assert_eq!(p("kreaders=3").unwrap().policy.kernel_readers, 3);
        assert!(p("kreaders=65").is_err() && p("kreaders").is_err());
        assert!(p("prefetch=0").is_err());
        assert!(p("prefetch=65").is_err());
        assert!(p("noprefetch=1").is_err());
    }

    #[test]
    fn bad_options() {
        assert!(p("bogus").is_err());
        assert!(p("open").is_err());
        assert!(p("open=kernel").is_err());
        assert!(p("threads=0").is_err());
        assert!(p("threads=x").is_err());
        assert!(p("entry_timeout=-1").is_err());
        assert!(p("entry_timeout=1e300").is_err());
        assert!(p("attr_timeout=NaN").is_err());
        assert!(p("threads=1025").is_err());
        assert!(p("max_open_per_user=0").is_err());
        assert!(p("max_open_per_user=-1").is_err());
        assert!(p("max_open_per_user=x").is_err());
        assert_eq!(
            p("max_open_per_user=40").unwrap().policy.max_open_per_user,
            40
        );
        assert!(p("socket=").is_err());
        assert!(p("socket=x.sock").is_err());
        assert!(p("ro=1").is_err());
        assert!(p("cache=maybe").is_err());
        assert!(p("nopassthrough=1").is_err());
        assert!(p("nobogus").is_err());
        let e = p("frobnicate").unwrap_err();
        assert!(e.0.contains("frobnicate"), "{e}");
    }

    #[test]
    fn input_checks() {
        let d = tempfile_dir();
        let f = d.join("file");
        std::fs::write(&f, b"x").unwrap();
        assert!(check_input(&d.join("missing"), &d, false)
            .unwrap_err()
            .0
            .contains("missing"));
        assert!(check_input(&f, &d, true)
            .unwrap_err()
            .0
            .contains("not a directory"));
        assert!(check_input(&d, &d.join("missing"), false).is_err());
        assert!(check_input(&d, Path::new("/proc"), false)
            .unwrap_err()
            .0
            .contains("mount point"));
        let _ = std::fs::remove_dir_all(&d);
    }

    fn tempfile_dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("dircache-mount-test-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
