//! `-o io_uring`: FUSE over io_uring (the vendored fuser's `src/uring.rs`, docs/opens.md).
//!
//! * With `/sys/module/fuse/parameters/enable_uring` = Y, the POSIX checks of `posix.rs`
//!   (`common/posix_checks.rs`, as root and as uid 1000) give the native results on a mount
//!   served over the ring, and the requests did come from ring entries
//!   (`fuser::uring_requests_served`).
//! * With it N, a mount asking for io_uring is served over `/dev/fuse` (no request from a ring
//!   entry) and gives the same results.
//! * Once the mount has seen a slow request (`fuser::uring_slow_request`), a LOOKUP held in
//!   the backend does not hold up another request from the same CPU (both callers pinned to
//!   it, so both requests go to that CPU's queue): the queue's spare thread serves it. With
//!   one thread per queue (`threads=1`) it waits: the check can fail.
//! * Before a slow request, a queue has no spare (a spare's entry would take the OPEN that
//!   follows a RELEASE, a wake-up of a second thread per open+close): a held LOOKUP holds
//!   up the next request of its CPU.
//!
//! `enable_uring` is one switch for the whole machine: the tests of this file take turns
//! (`SERIAL`) and put back the value they found, also when they fail. Each mount's FUSE
//! connection is aborted if its test panics or runs for more than 5 minutes (a hung ring would
//! otherwise hang the test and the mount).

mod common;
use std::os::linux::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::gated::{self, GatedMount};
use common::posix_checks::*;
use common::*;
use dircache_fuse::CachePolicy;

const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

static SERIAL: Mutex<()> = Mutex::new(());

/// Sets `enable_uring`; puts the old value back when dropped.
struct EnableUring {
    old: String,
}

impl EnableUring {
    fn set(value: &str) -> EnableUring {
        let old = std::fs::read_to_string(ENABLE_URING).unwrap_or_else(|e| {
            panic!("{ENABLE_URING}: {e} (kernel without CONFIG_FUSE_IO_URING?)")
        });
        std::fs::write(ENABLE_URING, value).expect("write enable_uring");
        EnableUring {
            old: old.trim().to_string(),
        }
    }
}

impl Drop for EnableUring {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(ENABLE_URING, &self.old) {
            eprintln!("could not restore {ENABLE_URING} to {}: {e}", self.old);
        }
    }
}

/// Aborts the mount's FUSE connection if the test panics, or from a watchdog after 5 minutes.
struct AbortGuard {
    abort: String,
    done: Arc<AtomicBool>,
}

impl AbortGuard {
    fn new(mnt: &Path) -> AbortGuard {
        let dev = std::fs::metadata(mnt).expect("stat MNT").st_dev();
        let abort = format!("/sys/fs/fuse/connections/{}/abort", libc::minor(dev));
        let done = Arc::new(AtomicBool::new(false));
        let (a, d) = (abort.clone(), done.clone());
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(300);
            while !d.load(Ordering::Relaxed) {
                if Instant::now() > deadline {
                    eprintln!("io_uring test still running after 5 minutes: aborting {a}");
                    abort_connection(&a);
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        AbortGuard { abort, done }
    }
}

/// Aborts a FUSE connection through fusectl, mounting it for the moment if it is not mounted
/// (it is not on this machine).
fn abort_connection(abort: &str) {
    let dir = "/sys/fs/fuse/connections";
    let mounted_here = !Path::new(abort).exists()
        && std::process::Command::new("mount")
            .args(["-t", "fusectl", "fusectl", dir])
            .status()
            .is_ok_and(|s| s.success());
    if let Err(e) = std::fs::write(abort, "1") {
        eprintln!("could not abort the FUSE connection ({abort}): {e}");
    }
    if mounted_here {
        let _ = std::process::Command::new("umount").arg(dir).status();
    }
}

impl Drop for AbortGuard {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
        if std::thread::panicking() {
            abort_connection(&self.abort);
        }
    }
}

fn uring() -> CachePolicy {
    CachePolicy {
        io_uring: true,
        ..CachePolicy::default()
    }
}

/// A test's turn (`SERIAL`), `enable_uring` set to `value`, a mount asking for io_uring and
/// its abort guard, and the ring requests served before the mount. Bind every part (the
/// parts drop in reverse: the guard, the mount, `enable_uring` put back, the turn).
fn uring_mount(
    value: &str,
) -> (
    std::sync::MutexGuard<'static, ()>,
    EnableUring,
    u64,
    TestMount,
    AbortGuard,
) {
    let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let enable = EnableUring::set(value);
    let before = fuser::uring_requests_served();
    let t = TestMount::with_policy(uring());
    let abort = AbortGuard::new(&t.mnt);
    (serial, enable, before, t, abort)
}

/// `stat` of `n` distinct names in a fresh directory of SRC, through the mount.
fn stat_loop(t: &TestMount, n: usize) {
    let d = t.s("statloop");
    std::fs::create_dir_all(&d).expect("mkdir");
    for i in 0..n {
        std::fs::write(d.join(format!("f{i}")), b"x").expect("write");
    }
    for i in 0..n {
        let m = std::fs::metadata(t.m(&format!("statloop/f{i}"))).expect("stat through MNT");
        assert_eq!(m.len(), 1);
    }
}

#[test]
fn posix_checks_match_native_over_io_uring() {
    if !can_mount() {
        return;
    }
    let (_serial, _on, before, t, _abort) = uring_mount("Y");
    checks_match_native(&t);
    stat_loop(&t, 200);
    let served = fuser::uring_requests_served() - before;
    // 200 LOOKUPs of new names alone; the checks send hundreds more.
    assert!(
        served >= 200,
        "only {served} requests came from ring entries: the mount was served over /dev/fuse"
    );
}

#[test]
fn non_root_users_match_native_over_io_uring() {
    if !can_mount() {
        return;
    }
    let (_serial, _on, before, t, _abort) = uring_mount("Y");
    user_checks_match_native(&t);
    let served = fuser::uring_requests_served() - before;
    eprintln!("{served} requests from ring entries");
    assert!(
        served >= 50,
        "only {served} requests came from ring entries"
    );
}

#[test]
fn falls_back_to_dev_fuse_when_enable_uring_is_off() {
    if !can_mount() {
        return;
    }
    let (_serial, _off, before, t, _abort) = uring_mount("N");
    checks_match_native(&t);
    stat_loop(&t, 200);
    assert_eq!(
        fuser::uring_requests_served(),
        before,
        "requests came from ring entries although enable_uring was N"
    );
}

/// Sets `fuser::uring_slow_request` (process-wide); puts the old value back when dropped.
struct SlowRequest(Duration);

impl SlowRequest {
    fn set(d: Duration) -> SlowRequest {
        let old = fuser::uring_slow_request();
        fuser::set_uring_slow_request(d);
        SlowRequest(old)
    }
}

impl Drop for SlowRequest {
    fn drop(&mut self) {
        fuser::set_uring_slow_request(self.0);
    }
}

/// What a mount of the gated backend saw.
struct Blocked {
    /// How long the forced stat beside the held LOOKUPs took (None: not within `within`).
    took: Option<Duration>,
    /// Ring servers started while the LOOKUPs were held (after the slow LOOKUP, if any).
    added_while_held: u64,
}

/// A mount of the gated backend (`common/gated.rs`) over the ring, with `threads` request
/// threads; with `teach`, first one LOOKUP held for 5 ms (a slow request: spares from then
/// on; the test waits for the spare it adds to register). Then `held` LOOKUPs held at once
/// and a forced `stat` of a cached file by another caller, all on one CPU.
fn stat_beside_blocked_lookups_on_one_cpu(
    threads: usize,
    teach: bool,
    held: usize,
    within: Duration,
) -> Blocked {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let _on = EnableUring::set("Y");
    // Only the LOOKUP held on purpose is slow: a request slowed by a busy machine must not
    // teach the mount (the checks without `teach` see a queue of one server).
    let _slow = SlowRequest::set(Duration::from_secs(3));
    let before = fuser::uring_requests_served();
    let g = GatedMount::new(CachePolicy {
        threads,
        // No listing made on a second LOOKUP miss: `d/slow` must be a backend LOOKUP.
        lookahead: false,
        ..uring()
    });
    let _abort = AbortGuard::new(&g.t.mnt);
    let cpu = gated::some_cpu();
    if teach {
        let registered = fuser::uring_servers_registered();
        fuser::set_uring_slow_request(Duration::from_millis(1));
        g.one_slow_lookup(Duration::from_millis(5), Some(cpu));
        fuser::set_uring_slow_request(Duration::from_secs(3));
        if threads > 1 {
            assert!(
                wait_for(Duration::from_secs(30), || {
                    fuser::uring_servers_registered() > registered
                })
                .is_some(),
                "no spare server registered after a LOOKUP held for 5 ms"
            );
        }
    }
    let added = fuser::uring_servers_added();
    let took = g.cached_stat_while_lookups_block(held, within, Some(cpu));
    let added_while_held = fuser::uring_servers_added() - added;
    let served = fuser::uring_requests_served() - before;
    // Two forced stats of d/a and the held LOOKUPs at least, all from ring entries.
    assert!(
        served >= 2 + held as u64,
        "only {served} requests came from ring entries: not served over the ring"
    );
    Blocked {
        took,
        added_while_held,
    }
}

/// The kernel puts a request on the ring queue of the CPU its caller runs on; once a slow
/// request was seen, each queue has a spare thread with its own entry, which serves the next
/// request while the first waits in the backend. Before the spare, one thread per queue
/// served it inline and the stat waited for the gate (20 s).
#[test]
fn blocked_backend_call_does_not_hold_up_its_cpus_queue() {
    if !can_mount() {
        return;
    }
    let b = stat_beside_blocked_lookups_on_one_cpu(4, true, 1, Duration::from_secs(20));
    assert!(
        b.took.is_some(),
        "a stat waited for a LOOKUP blocked in the backend on the same CPU's ring queue"
    );
}

/// Before the mount has seen a slow request its queues have one server each: the first
/// blocked call holds up the next request of its CPU (not answered within 2 s while the gate
/// is closed). A spare from the start would take the OPEN that follows a RELEASE.
#[test]
fn no_spare_before_a_slow_request() {
    if !can_mount() {
        return;
    }
    let b = stat_beside_blocked_lookups_on_one_cpu(4, false, 1, Duration::from_secs(2));
    assert_eq!(
        b.took, None,
        "a stat was served beside the first blocked LOOKUP: a spare was there before any slow request"
    );
}

/// The check above can fail: with one thread per queue (`threads=1`) the stat waits for the
/// blocked LOOKUP (not answered within 2 s while the gate is closed), also after a slow
/// request.
#[test]
fn one_thread_per_queue_serialises_behind_a_blocked_lookup() {
    if !can_mount() {
        return;
    }
    let b = stat_beside_blocked_lookups_on_one_cpu(1, true, 1, Duration::from_secs(2));
    assert_eq!(
        b.took, None,
        "one thread per queue served a stat while blocked in the backend"
    );
}

/// With two LOOKUPs held on one CPU, the queue's first two servers (the first and the spare
/// the slow LOOKUP added) are both blocked: the second, before its backend call
/// (`fuser::may_block`), found no idle spare and started a third server (`threads=4` allows
/// up to four per queue), which serves the stat.
#[test]
fn a_second_blocked_call_adds_a_spare() {
    if !can_mount() {
        return;
    }
    let b = stat_beside_blocked_lookups_on_one_cpu(4, true, 2, Duration::from_secs(20));
    assert!(
        b.added_while_held > 0,
        "no server was added while two were blocked"
    );
    assert!(
        b.took.is_some(),
        "a stat waited for two LOOKUPs blocked in the backend on the same CPU's ring queue"
    );
}
