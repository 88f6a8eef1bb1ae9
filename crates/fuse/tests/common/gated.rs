//! A backend whose LOOKUPs of the name `slow` can be held at a gate, and the check that a
//! mount still answers a cached `stat` while one is held (`readers.rs`, `io_uring.rs`).

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use dircache_core::memory::MemoryBackend;
use dircache_core::{Attr, Backend, Cred, DirEntry, RenameMode, Result, SetAttr};

use super::{wait_for, TestMount};

/// A LOOKUP of `slow` waits here while the gate is closed.
#[derive(Default)]
pub struct Gate {
    /// (closed, lookups waiting)
    state: Mutex<(bool, usize)>,
    cv: Condvar,
}

impl Gate {
    pub fn close(&self) {
        self.state.lock().unwrap().0 = true;
    }
    pub fn open(&self) {
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
    pub fn waiting(&self) -> usize {
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
pub fn forced_stat(p: &Path) -> std::io::Result<()> {
    rustix::fs::statx(
        rustix::fs::CWD,
        p,
        rustix::fs::AtFlags::STATX_FORCE_SYNC,
        rustix::fs::StatxFlags::BASIC_STATS,
    )
    .map(|_| ())
    .map_err(std::io::Error::from)
}

/// Keeps the calling thread on `cpu` (the kernel puts a FUSE-over-io_uring request on the
/// queue of the CPU its caller runs on).
pub fn pin_to(cpu: usize) {
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    rustix::thread::sched_setaffinity(None, &set).expect("sched_setaffinity");
}

/// The first CPU this thread may run on.
pub fn some_cpu() -> usize {
    let set = rustix::thread::sched_getaffinity(None).expect("sched_getaffinity");
    (0..rustix::thread::CpuSet::MAX_CPU)
        .find(|&c| set.is_set(c))
        .expect("no CPU in the affinity mask")
}

/// Opens the gate when dropped.
struct OpenOnDrop(Arc<Gate>);
impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.open();
    }
}

/// A mount of the gated backend holding `d/a`, `d/slow`, `e/slow` and `f/slow`.
pub struct GatedMount {
    pub gate: Arc<Gate>,
    // Whatever happens, the gate opens before the mount goes (fields drop in order).
    _open: OpenOnDrop,
    pub t: TestMount,
}

impl GatedMount {
    pub fn new(policy: dircache_fuse::CachePolicy) -> GatedMount {
        let gate = Arc::new(Gate::default());
        let inner = MemoryBackend::new();
        inner.mkdir(&Cred::root(), b"d", 0o755).unwrap();
        inner.mknod(&Cred::root(), b"d/a", 0o100644, 0).unwrap();
        inner.mknod(&Cred::root(), b"d/slow", 0o100644, 0).unwrap();
        inner.mkdir(&Cred::root(), b"e", 0o755).unwrap();
        inner.mknod(&Cred::root(), b"e/slow", 0o100644, 0).unwrap();
        inner.mkdir(&Cred::root(), b"f", 0o755).unwrap();
        inner.mknod(&Cred::root(), b"f/slow", 0o100644, 0).unwrap();
        let t = TestMount::over_backend(
            Arc::new(Gated {
                inner,
                gate: gate.clone(),
            }),
            policy,
        );
        GatedMount {
            _open: OpenOnDrop(gate.clone()),
            gate,
            t,
        }
    }

    /// A `stat f/slow` (on `cpu` only, if given) whose LOOKUP is held at the gate for at
    /// least `hold`: one slow request, after which a ring session adds spare servers
    /// (`fuser::uring_slow_request`).
    pub fn one_slow_lookup(&self, hold: Duration, cpu: Option<usize>) {
        let gate = &self.gate;
        gate.close();
        let slow = self.t.m("f/slow");
        let h = std::thread::spawn(move || {
            if let Some(c) = cpu {
                pin_to(c);
            }
            forced_stat(&slow)
        });
        assert!(
            wait_for(Duration::from_secs(30), || gate.waiting() == 1).is_some(),
            "the LOOKUP of f/slow never reached the backend"
        );
        std::thread::sleep(hold);
        gate.open();
        h.join().unwrap().expect("stat f/slow");
    }

    /// Stat `d/a` (cached), then close the gate and start a `stat d/slow` that waits in the
    /// backend. Returns how long a forced `stat d/a` by another thread took while `stat
    /// d/slow` was held (None: not done within `within`), after opening the gate and checking
    /// both stats succeeded. With `cpu`, both callers run on that CPU only.
    pub fn cached_stat_while_lookup_blocks(
        &self,
        within: Duration,
        cpu: Option<usize>,
    ) -> Option<Duration> {
        self.cached_stat_while_lookups_block(1, within, cpu)
    }

    /// The same with `held` (1 or 2) LOOKUPs held at once (`d/slow`, `e/slow`), each started
    /// once the one before it waits in the backend.
    pub fn cached_stat_while_lookups_block(
        &self,
        held: usize,
        within: Duration,
        cpu: Option<usize>,
    ) -> Option<Duration> {
        let gate = &self.gate;
        let a: PathBuf = self.t.m("d/a");
        forced_stat(&a).expect("stat d/a");
        gate.close();
        let mut holding = Vec::new();
        for (i, dir) in ["d", "e"].into_iter().take(held).enumerate() {
            let slow = self.t.m(&format!("{dir}/slow"));
            holding.push(std::thread::spawn(move || {
                if let Some(c) = cpu {
                    pin_to(c);
                }
                forced_stat(&slow)
            }));
            assert!(
                wait_for(Duration::from_secs(30), || gate.waiting() == i + 1).is_some(),
                "the LOOKUP of {dir}/slow never reached the backend"
            );
        }
        let (tx, rx) = mpsc::channel();
        let other = std::thread::spawn(move || {
            if let Some(c) = cpu {
                pin_to(c);
            }
            let t0 = Instant::now();
            let r = forced_stat(&a);
            let _ = tx.send(t0.elapsed());
            r
        });
        let took = rx.recv_timeout(within).ok();
        // The held LOOKUPs are still held: the stat above did not get through by a release.
        assert_eq!(gate.waiting(), held, "the gate let a LOOKUP through early");
        gate.open();
        for h in holding {
            h.join()
                .unwrap()
                .expect("stat of slow after the gate opened");
        }
        other.join().unwrap().expect("stat d/a");
        took
    }
}
