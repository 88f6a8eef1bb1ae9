//! # dircache-fuse
//!
//! The FUSE front end of dircache. Following Coda's MiniCache/Venus split, the kernel's FUSE
//! caches (dentries, attributes, negative entries, cached directory listings, passthrough
//! I/O) are the small fast cache, and this daemon is the cache manager behind it:
//!
//! - requests that reach the daemon are answered from the core cache ([`fs::DircacheFs`], a
//!   thin adapter over the file-system layer, see [`fs`]);
//! - the kernel gets long timeouts ([`CachePolicy`]) because the daemon invalidates
//!   explicitly, from one dedicated thread ([`notifier`]) fed by the backend's change feed;
//! - file data goes to the backend's open file ([`dircache_core::BackendFile`]; FUSE
//!   passthrough when it has a local descriptor);
//! - statistics are served on a unix socket ([`stats`]).
//!
//! Nodeids: SRC's root is 1, or `inodes::SERVED_ROOT` when it is served below a synthetic
//! FUSE root ([`rootmount`], every mount made with the new mount API); every other inode's
//! nodeid is derived from its backend `(dev, ino)` (the backend's inode number on SRC's own
//! device), so all hard links share one and `st_ino` seen
//! through the mount is stable across FORGET and remounts; a new file that reuses the inode
//! number of one the kernel still holds gets a nodeid of its own while `st_ino` stays the
//! backend's ([`inodes`]).
//!
//! Every action taken for a request runs with the requester's credentials on the inode the
//! kernel named (verified by `(dev, ino)`): the front end reaches the files only through the
//! `Backend` and `BackendFile` traits, which take the requester's `Cred` (the local backend
//! switches with `dircache_local::creds`); no path into SRC is built here. See
//! `docs/security.md`.
//!
//! Modules:
//! - [`fs`]: the `fuser::Filesystem` adapter ([`DircacheFs`]: replies to the kernel) over the
//!   file-system layer, one file per subject: `fs/nodes.rs` (lookup, attributes, namespace
//!   mutations), `fs/dirs.rs` (directory streams), `fs/handles.rs` (open files, data,
//!   passthrough), `fs/xattrs.rs` (extended attributes), `fs/init.rs` (INIT capabilities);
//! - [`inodes`]: the kernel's nodeids and inode numbers, and the held nodes they stand for;
//! - `listings`: directory listing streams (per-name cookies, per-stream snapshots);
//! - `openfds`: the daemon's descriptors for open files, shared and bounded per user;
//! - [`creds`]: the requester's supplementary groups; `umask`: the caller's umask at creation;
//! - [`notifier`]: the only thread telling the kernel to drop cached state; [`policy`]: what
//!   the kernel's caches may keep; [`stats`]: request counters and the control socket;
//!   [`kmount`]: the kernel side of the mount (mount(2), remount, mountinfo);
//!   [`rootmount`]: SRC served one directory below the FUSE root, bind-mounted on MNT (so
//!   the kernel caches the ACLs of the mount's root).

pub mod cacheview;
pub mod creds;
pub mod fs;
pub mod inodes;
pub mod kmount;
mod lean;
pub mod leases;
mod listings;
mod lookahead;
pub mod metrics;
pub mod notifier;
mod openfds;
pub mod policy;
pub mod prefetch;
pub mod rootmount;
pub mod sched;
pub mod stats;
mod umask;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::Sender;
use dircache_core::{Cache, Persist};

pub use fs::DircacheFs;
pub use kmount::KernelOptions;
pub use notifier::NotifyMsg;
pub use policy::CachePolicy;

/// Errors of the FUSE front end.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("mount {mnt}: {source}")]
    Mount {
        mnt: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}: not a dircache mount ({1})")]
    NotDircache(PathBuf, std::io::Error),
    #[error("control protocol: {0}")]
    Protocol(String),
    #[error("{0}")]
    Core(#[from] dircache_core::Error),
}

/// How to mount.
#[derive(Debug, Clone)]
pub struct MountConfig {
    /// The local directory the cache's backend serves, if it is one: only mount setup uses
    /// it (its file system's restrictions apply to the mount, it names the mount, searches
    /// are delegated below it); the file system itself reaches storage only through the
    /// backend. `None` for a backend of another kind (e.g.
    /// [`dircache_core::memory::MemoryBackend`]).
    pub src: Option<PathBuf>,
    pub mnt: PathBuf,
    pub policy: CachePolicy,
    /// Kernel flags and options (ro, nosuid, fsname=...): see [`kmount`].
    pub kernel: KernelOptions,
    /// Let every user use the mount (allow_other); permissions are checked by the kernel.
    pub allow_other: bool,
    /// Where to serve statistics (`None`: no control socket).
    pub socket_path: Option<PathBuf>,
    /// Warm restart (`-o persist=PATH`): the snapshot loaded into the cache at mount (if it
    /// is valid and of this tree) and written when the mount ends. See
    /// `dircache_core::Persist`.
    pub persist: Option<PathBuf>,
    /// Serve OpenMetrics text at `http://ADDR:PORT/metrics` ([`metrics`]; the caller decides
    /// which addresses are allowed). Port 0: any free port, shown by `dircache stats`.
    pub metrics: Option<std::net::SocketAddr>,
}

impl MountConfig {
    pub fn new(src: &Path, mnt: &Path) -> MountConfig {
        MountConfig {
            src: Some(src.to_path_buf()),
            mnt: mnt.to_path_buf(),
            policy: CachePolicy::default(),
            kernel: KernelOptions::default(),
            allow_other: true,
            socket_path: None,
            persist: None,
            metrics: None,
        }
    }

    /// A mount at `mnt` of a cache whose backend is not a local directory.
    pub fn without_src(mnt: &Path) -> MountConfig {
        MountConfig {
            src: None,
            ..MountConfig::new(Path::new(""), mnt)
        }
    }
}

/// A mounted and serving file system. Call [`Mounted::run`] to wait until it is unmounted.
pub struct Mounted {
    /// Serving since the mount was made (the served tree is attached through the daemon).
    session: fuser::BackgroundSession,
    notify_tx: Sender<NotifyMsg>,
    notifier: Option<JoinHandle<()>>,
    _control: Option<stats::ControlServer>,
    _metrics: Option<metrics::MetricsServer>,
    pub mnt: PathBuf,
    pub counters: Arc<stats::RequestCounters>,
    pub inodes: Arc<inodes::Inodes>,
    /// What the snapshot of `-o persist` installed at mount (`None`: no option, or the
    /// snapshot was missing or refused, with a warning logged).
    pub persist_loaded: Option<dircache_core::LoadReport>,
    persist: Option<(Arc<Cache>, Persist)>,
}

/// Mount `cache` at `cfg.mnt`. When this returns the mount is up (the kernel's INIT was
/// answered) and requests are served (threads of their own); [`Mounted::run`] waits for the
/// end and cleans up.
pub fn mount(cache: Arc<Cache>, cfg: &MountConfig) -> Result<Mounted, Error> {
    if cfg.policy.bypass != cache.config().bypass {
        // A bypass policy over a caching core would serve cached answers with TTLs 0 (and
        // the reverse would re-ask the backend under long kernel TTLs): refuse the mix.
        return Err(Error::Core(dircache_core::Error::Invalid));
    }
    // Before anything can reach the cache: a snapshot is loaded only into a fresh one.
    let persist = cfg
        .persist
        .as_ref()
        .map(|p| Persist::new(p, persist_source(cfg)));
    // Bound before mounting: an address in use fails the mount before anything is mounted.
    let metrics_listener = cfg
        .metrics
        .map(|a| {
            metrics::MetricsListener::bind(a).map_err(|e| {
                Error::Io(std::io::Error::new(
                    e.kind(),
                    format!("metrics on {a}: {e}"),
                ))
            })
        })
        .transpose()?;
    let metrics_addr = metrics_listener
        .as_ref()
        .map(metrics::MetricsListener::local_addr)
        .transpose()?;
    let persist_loaded = persist.as_ref().and_then(|p| load_snapshot(&cache, p));
    let feed = match cache.backend().watch() {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!("backend change feed unavailable: {e}");
            None
        }
    };
    let mut policy = cfg.policy.clone();
    // Without a change feed a listing made on lookups (`lookahead.rs`) would hide names
    // created in SRC later from lookups that used to ask the backend: only with a feed.
    policy.lookahead &= feed.is_some();
    let (tx, rx) = crossbeam_channel::unbounded();
    let (mut fs, parts) =
        DircacheFs::new(cache.clone(), policy, tx.clone(), cfg.socket_path.clone());
    fs.set_noatime(cfg.kernel.flags & libc::MS_NOATIME != 0);
    // Resolved before the mount is up (afterwards it would be a request to ourselves).
    if let Ok(m) = std::fs::canonicalize(&cfg.mnt) {
        fs.set_mountpoint(m);
    }
    // Refused before anything is mounted when the daemon may not set it.
    cfg.policy
        .request_sched
        .probe()
        .map_err(|e| Error::Io(std::io::Error::new(e.kind(), format!("-o sched: {e}"))))?;
    let mut fc = fuser::Config::default();
    fc.thread_start = cfg.policy.request_sched.thread_start();
    fc.n_threads = Some(cfg.policy.threads.max(1));
    fc.clone_fd = true;
    fc.io_uring = cfg.policy.io_uring;
    // Backend calls on a cache miss may block: the reading thread hands reading on first.
    dircache_core::set_before_backend_call(fuser::may_block);
    fc.leader_follower = cfg.policy.leader_follower.then_some(fuser::LfConfig {
        spin: std::time::Duration::from_micros(cfg.policy.spin_us.into()),
        lazy: cfg.policy.lazy_handoff,
    });
    let (session, abi, _served_below) = mount_session(fs, cfg, fc)?;
    // Until `Mounted` exists, a failure leaves no dead mount behind.
    let guard = UnmountOnError(Some(cfg.mnt.clone()));
    let state = notifier::NotifierState::new(
        cache.clone(),
        parts.inodes.clone(),
        parts.counters.clone(),
        abi.map_or(0, |v| v.1),
    );
    let notifier = notifier::spawn(state, session.notifier(), rx, feed)?;
    guard.disarm();
    let persist = persist.map(|p| (cache.clone(), p));
    let source = |cache: Arc<Cache>| {
        let inodes = parts.inodes.clone();
        stats::StatsSource {
            cache,
            requests: parts.counters.clone(),
            src: cfg.src.clone(),
            mnt: cfg.mnt.clone(),
            kernel_inodes: Arc::new(move || inodes.len()),
            started: std::time::Instant::now(),
            metrics: metrics_addr,
        }
    };
    let metrics = match metrics_listener {
        Some(l) => Some(metrics::MetricsServer::start(l, source(cache.clone()))?),
        None => None,
    };
    let control = match &cfg.socket_path {
        Some(p) => {
            let src = source(cache);
            match stats::ControlServer::start(p, src) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!("control socket {}: {e}", p.display());
                    None
                }
            }
        }
        None => None,
    };
    Ok(Mounted {
        session,
        notify_tx: tx,
        notifier: Some(notifier),
        _control: control,
        _metrics: metrics,
        mnt: cfg.mnt.clone(),
        counters: parts.counters,
        inodes: parts.inodes,
        persist_loaded,
        persist,
    })
}

/// The identity a snapshot must name: SRC's path, else the mount's source name.
fn persist_source(cfg: &MountConfig) -> Vec<u8> {
    match (&cfg.src, &cfg.kernel.fsname) {
        (Some(src), _) => src.as_os_str().as_bytes().to_vec(),
        (None, Some(n)) => n.as_bytes().to_vec(),
        (None, None) => b"dircache".to_vec(),
    }
}

fn load_snapshot(cache: &Cache, p: &Persist) -> Option<dircache_core::LoadReport> {
    if !p.path.exists() {
        tracing::info!("persist: no snapshot at {} yet", p.path.display());
        return None;
    }
    let t = std::time::Instant::now();
    match cache.load_snapshot(p) {
        Ok(r) => {
            tracing::info!(
                "persist: {} loaded in {:?}: {} directories, {} validated ({} listings, {} \
                 entries, {} negatives), {} changed, {} gone",
                p.path.display(),
                t.elapsed(),
                r.dirs,
                r.validated,
                r.listings,
                r.entries,
                r.negatives,
                r.changed,
                r.missing
            );
            Some(r)
        }
        Err(e) => {
            tracing::warn!("persist: snapshot ignored: {e}");
            None
        }
    }
}

fn save_snapshot(cache: &Cache, p: &Persist) {
    let t = std::time::Instant::now();
    match cache.save_snapshot(p) {
        Ok(r) => tracing::info!(
            "persist: {} written in {:?}: {} directories, {} listings ({} entries), {} \
             negatives, {} racy, {} bytes",
            p.path.display(),
            t.elapsed(),
            r.dirs,
            r.listings,
            r.entries,
            r.negatives,
            r.racy,
            r.bytes
        ),
        Err(e) => tracing::warn!("persist: snapshot not written: {e}"),
    }
}

/// The FUSE file system made with `cfg.kernel`, the handshake done, serving, and mounted on
/// `cfg.mnt`: SRC one directory below the FUSE root ([`rootmount`]), or with mount(2) as
/// the FUSE root ([`kmount::mount_fuse`]) on a kernel without the new mount API. Returns the
/// session, the kernel's FUSE ABI and whether SRC is served below the root.
fn mount_session(
    mut fs: DircacheFs,
    cfg: &MountConfig,
    fc: fuser::Config,
) -> Result<(fuser::BackgroundSession, Option<fuser::Version>, bool), Error> {
    let err = |source: std::io::Error| Error::Mount {
        mnt: cfg.mnt.clone(),
        source,
    };
    let mut flags = cfg.kernel.flags;
    if let Some(src) = &cfg.src {
        let imposed = kmount::src_restrictions(src) & !flags;
        if imposed != 0 {
            tracing::warn!(
                "{}: its file system ignores {}: so does the mount",
                src.display(),
                kmount::restriction_names(imposed)
            );
            flags |= imposed;
        }
    }
    let source = match (&cfg.kernel.fsname, &cfg.src) {
        (Some(n), _) => n.clone(),
        (None, Some(src)) => src.display().to_string(),
        (None, None) => "dircache".to_string(),
    };
    let acl = if cfg.allow_other {
        fuser::SessionACL::All
    } else {
        fuser::SessionACL::Owner
    };
    match rootmount::create(&source, flags, cfg.allow_other, &cfg.kernel.lsm) {
        Ok(detached) => {
            fs.serve_root_below();
            let dev = detached.dev.try_clone().map_err(err)?;
            let session = fuser::Session::from_fd(fs, dev, acl, fc).map_err(err)?;
            let abi = session.kernel_abi();
            let session = session.spawn().map_err(err)?;
            // On failure the detached mount goes, and with it the connection: the session
            // ends.
            if let Err(e) = rootmount::attach(detached, &cfg.mnt) {
                let _ = session.join();
                return Err(err(e));
            }
            return Ok((session, abi, true));
        }
        Err(e) if rootmount::unsupported(&e) => {
            tracing::info!("no new mount API ({e}): SRC's root is the FUSE root");
        }
        Err(e) => return Err(err(e)),
    }
    // The root's permission bits for the kernel's first root inode (kmount::mount_fuse).
    let root_perm = fs.root_perm();
    let fd = kmount::mount_fuse(
        &source,
        &cfg.mnt,
        flags,
        cfg.allow_other,
        &cfg.kernel.lsm,
        root_perm,
    )
    .map_err(err)?;
    let guard = UnmountOnError(Some(cfg.mnt.clone()));
    let session = fuser::Session::from_fd(fs, fd, acl, fc).map_err(err)?;
    let abi = session.kernel_abi();
    let session = session.spawn().map_err(err)?;
    guard.disarm();
    Ok((session, abi, false))
}

/// Unmounts (detached) on drop unless disarmed: a mount whose setup failed is not left dead.
struct UnmountOnError(Option<PathBuf>);

impl UnmountOnError {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for UnmountOnError {
    fn drop(&mut self) {
        if let Some(m) = self.0.take() {
            let Ok(c) = CString::new(m.as_os_str().as_bytes()) else {
                return;
            };
            // SAFETY: c is a valid NUL-terminated path.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

impl Mounted {
    /// A sender for the notifier thread (for changes learned elsewhere).
    pub fn notify_sender(&self) -> Sender<NotifyMsg> {
        self.notify_tx.clone()
    }

    /// Wait until the file system is unmounted (by [`unmount`], `umount`,
    /// `fusermount -u`, or the kernel aborting the connection).
    pub fn run(self) -> Result<(), Error> {
        let Mounted {
            session,
            notify_tx,
            notifier,
            _control,
            _metrics,
            mnt,
            persist,
            ..
        } = self;
        // The session does not own the mount (dircache called mount(2)): if serving ends
        // with an error while still mounted, unmount rather than leave a dead mount.
        let r = session.join().map_err(Error::Io);
        if r.is_err() && kmount::mount_entry(&mnt).is_some_and(|e| e.fstype == "fuse.dircache") {
            let _ = unmount(&mnt);
        }
        let _ = notify_tx.send(NotifyMsg::Stop);
        if let Some(h) = notifier {
            let _ = h.join();
        }
        drop(_control);
        // The port is free once `run` returns.
        drop(_metrics);
        // The kernel is gone: the cache is written as it stands.
        if let Some((cache, p)) = &persist {
            save_snapshot(cache, p);
        }
        r
    }
}

/// Unmount `mnt`: a plain umount, lazily detached when busy.
pub fn unmount(mnt: &Path) -> std::io::Result<()> {
    let c = CString::new(mnt.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: c is a valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), 0) } == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EBUSY) {
        // SAFETY: as above.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
            return Ok(());
        }
        return Err(std::io::Error::last_os_error());
    }
    Err(e)
}

/// Whether `path` is a mount point (an entry of /proc/self/mountinfo).
pub fn is_mount_point(path: &Path) -> bool {
    let Ok(canon) = path.canonicalize() else {
        return false;
    };
    let Ok(info) = std::fs::read("/proc/self/mountinfo") else {
        return false;
    };
    let want = canon.as_os_str().as_bytes();
    info.split(|b| *b == b'\n').any(|line| {
        line.split(|b| *b == b' ')
            .nth(4)
            .map(unescape_mountinfo)
            .as_deref()
            == Some(want)
    })
}

/// Undo mountinfo's octal escapes (`\040` for space and so on).
pub fn unescape_mountinfo(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'\\'
            && i + 3 < s.len()
            && s[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (s[i + 1] - b'0') * 64 + (s[i + 2] - b'0') * 8 + (s[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_unescape() {
        assert_eq!(unescape_mountinfo(b"/a\\040b"), b"/a b".to_vec());
        assert_eq!(unescape_mountinfo(b"/plain"), b"/plain".to_vec());
        assert_eq!(unescape_mountinfo(b"/x\\"), b"/x\\".to_vec());
    }

    #[test]
    fn root_is_a_mount_point() {
        assert!(is_mount_point(Path::new("/")));
        assert!(is_mount_point(Path::new("/proc")));
        let d = tempfile::tempdir().unwrap();
        assert!(!is_mount_point(d.path()));
    }
}
