//! Request threads and `/dev/fuse` (issue 9). By default every request thread reads; with
//! `-o readers=leader` one thread reads at a time (leader/follower, vendored fuser's
//! `src/lf.rs`) and keeps serving requests answered from the cache; before a backend call it
//! hands reading to another thread. These tests hold a backend LOOKUP and check what else the
//! mount still serves meanwhile.

mod common;
use common::posix_checks::*;
use common::*;

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use dircache_core::memory::MemoryBackend;
use dircache_core::{Attr, Backend, Cred, DirEntry, RenameMode, Result, SetAttr};

/// A LOOKUP of `slow` waits here while the gate is closed.
#[derive(Default)]
struct Gate {
    /// (closed, lookups waiting)
    state: Mutex<(bool, usize)>,
    cv: Condvar,
}

impl Gate {
    fn close(&self) {
        self.state.lock().unwrap().0 = true;
    }
    fn open(&self) {
        self.state.lock().unwrap().0 = false;
        self.cv.notify_all();
    }
    fn pass(&self) {
        let mut s = self.state.lock().unwrap();
        if !s.0 {
            return;
        }
        s.1 += 1;
        self.cv.notify_all();
        // Bounded, so that a failing test cannot hang the daemon for good.
        let (mut s, _) = self
            .cv
            .wait_timeout_while(s, Duration::from_secs(120), |s| s.0)
            .unwrap();
        s.1 -= 1;
    }
    fn waiting(&self) -> usize {
        self.state.lock().unwrap().1
    }
}

/// The in-memory backend with a gate in front of LOOKUPs of the name `slow`.
struct Gated {
    inner: MemoryBackend,
    gate: Arc<Gate>,
}

impl Backend for Gated {
    fn lookup(&self, dir: &[u8], name: &[u8]) -> Result<Attr> {
        if name == b"slow" {
            self.gate.pass();
        }
        self.inner.lookup(dir, name)
    }
    fn getattr(&self, path: &[u8]) -> Result<Attr> {
        self.inner.getattr(path)
    }
    fn readdir(&self, path: &[u8], plus: bool) -> Result<Vec<DirEntry>> {
        self.inner.readdir(path, plus)
    }
    fn readlink(&self, path: &[u8]) -> Result<Vec<u8>> {
        self.inner.readlink(path)
    }
    fn mknod(&self, cred: &Cred, path: &[u8], mode: u32, rdev: u64) -> Result<Attr> {
        self.inner.mknod(cred, path, mode, rdev)
    }
    fn mkdir(&self, cred: &Cred, path: &[u8], mode: u32) -> Result<Attr> {
        self.inner.mkdir(cred, path, mode)
    }
    fn symlink(&self, cred: &Cred, target: &[u8], path: &[u8]) -> Result<Attr> {
        self.inner.symlink(cred, target, path)
    }
    fn link(&self, cred: &Cred, old: &[u8], new: &[u8]) -> Result<Attr> {
        self.inner.link(cred, old, new)
    }
    fn unlink(&self, cred: &Cred, path: &[u8]) -> Result<()> {
        self.inner.unlink(cred, path)
    }
    fn rmdir(&self, cred: &Cred, path: &[u8]) -> Result<()> {
        self.inner.rmdir(cred, path)
    }
    fn rename(&self, cred: &Cred, old: &[u8], new: &[u8], mode: RenameMode) -> Result<()> {
        self.inner.rename(cred, old, new, mode)
    }
    fn setattr(&self, cred: &Cred, path: &[u8], set: &SetAttr) -> Result<Attr> {
        self.inner.setattr(cred, path, set)
    }
}

/// `stat` that always reaches the daemon (a GETATTR even while the kernel's copy is valid).
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

/// Mount the gated backend with `policy`; stat `d/a` (cached), then close the gate and start a
/// `stat d/slow` that waits in the backend. Returns how long a forced `stat d/a` by another
/// thread took while `stat d/slow` was held (None: not done within `within`), after opening
/// the gate and checking both stats succeeded.
fn cached_stat_while_lookup_blocks(
    policy: dircache_fuse::CachePolicy,
    within: Duration,
) -> Option<Duration> {
    let gate = Arc::new(Gate::default());
    let inner = MemoryBackend::new();
    inner.mkdir(&Cred::root(), b"d", 0o755).unwrap();
    inner.mknod(&Cred::root(), b"d/a", 0o100644, 0).unwrap();
    inner.mknod(&Cred::root(), b"d/slow", 0o100644, 0).unwrap();
    let t = TestMount::over_backend(
        Arc::new(Gated {
            inner,
            gate: gate.clone(),
        }),
        policy,
    );
    // Whatever happens below, the gate opens before the mount goes (fields drop in order).
    struct OpenOnDrop(Arc<Gate>);
    impl Drop for OpenOnDrop {
        fn drop(&mut self) {
            self.0.open();
        }
    }
    let _open = OpenOnDrop(gate.clone());
    let a: PathBuf = t.m("d/a");
    forced_stat(&a).expect("stat d/a");
    gate.close();
    let slow = t.m("d/slow");
    let held = std::thread::spawn(move || forced_stat(&slow));
    assert!(
        wait_for(Duration::from_secs(30), || gate.waiting() == 1).is_some(),
        "the LOOKUP of d/slow never reached the backend"
    );
    let (tx, rx) = mpsc::channel();
    let other = std::thread::spawn(move || {
        let t0 = Instant::now();
        let r = forced_stat(&a);
        let _ = tx.send(t0.elapsed());
        r
    });
    let took = rx.recv_timeout(within).ok();
    // The held LOOKUP is still held: the stat above did not get through by its release.
    assert_eq!(gate.waiting(), 1, "the gate let d/slow through early");
    gate.open();
    held.join()
        .unwrap()
        .expect("stat d/slow after the gate opened");
    other.join().unwrap().expect("stat d/a");
    took
}

/// No listing made on a second LOOKUP miss: `d/slow` must be a backend LOOKUP.
fn no_lookahead(p: dircache_fuse::CachePolicy) -> dircache_fuse::CachePolicy {
    dircache_fuse::CachePolicy {
        lookahead: false,
        ..p
    }
}

/// Leader/follower reading (`-o readers=leader`, four threads): a LOOKUP blocked in the
/// backend does not hold up another caller's stat of a cached file. Fails if reading were
/// serialised behind the blocked request (as with one thread, below): it did fail, after
/// 20 s, before the hand-off before backend calls (`dircache_core::set_before_backend_call`).
#[test]
fn leader_hands_reading_on_before_a_blocking_lookup() {
    if !can_mount() {
        return;
    }
    let policy = dircache_fuse::CachePolicy {
        leader_follower: true,
        ..no_lookahead(Default::default())
    };
    assert!(policy.threads > 1);
    let took = cached_stat_while_lookup_blocks(policy, Duration::from_secs(20));
    assert!(
        took.is_some(),
        "a cached stat waited for a LOOKUP blocked in the backend: reading is serialised"
    );
}

/// The same with the default: every thread reads (`-o readers=all`).
#[test]
fn blocked_backend_lookup_does_not_stop_cached_stat() {
    if !can_mount() {
        return;
    }
    let policy = no_lookahead(dircache_fuse::CachePolicy::default());
    assert!(!policy.leader_follower && policy.threads > 1);
    let took = cached_stat_while_lookup_blocks(policy, Duration::from_secs(20));
    assert!(took.is_some(), "a cached stat waited for a blocked LOOKUP");
}

/// The check above can fail: with one request thread the cached stat waits for the blocked
/// LOOKUP (it is not answered within 2 s while the gate is closed).
#[test]
fn one_thread_serialises_behind_a_blocked_lookup() {
    if !can_mount() {
        return;
    }
    let policy = dircache_fuse::CachePolicy {
        threads: 1,
        ..no_lookahead(Default::default())
    };
    let took = cached_stat_while_lookup_blocks(policy, Duration::from_secs(2));
    assert_eq!(
        took, None,
        "one thread served a stat while blocked elsewhere"
    );
}

/// `posix.rs`'s checks (as root and as uid 1000) give the native results with
/// `-o readers=leader`, also polling for the next request (`-o spin=50`).
#[test]
fn posix_checks_match_native_with_one_reader_at_a_time() {
    if !can_mount() {
        return;
    }
    for spin_us in [0, 50] {
        let policy = dircache_fuse::CachePolicy {
            leader_follower: true,
            spin_us,
            ..Default::default()
        };
        let t = TestMount::with_policy(policy.clone());
        checks_match_native(&t);
        user_checks_match_native(&TestMount::with_policy(policy));
    }
}
