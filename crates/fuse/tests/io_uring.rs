//! `-o io_uring`: FUSE over io_uring (the vendored fuser's `src/uring.rs`, docs/opens.md).
//!
//! * With `/sys/module/fuse/parameters/enable_uring` = Y, the POSIX checks of `posix.rs`
//!   (`common/posix_checks.rs`, as root and as uid 1000) give the native results on a mount
//!   served over the ring, and the requests did come from ring entries
//!   (`fuser::uring_requests_served`).
//! * With it N, a mount asking for io_uring is served over `/dev/fuse` (no request from a ring
//!   entry) and gives the same results.
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
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let _on = EnableUring::set("Y");
    let before = fuser::uring_requests_served();
    let t = TestMount::with_policy(uring());
    let _abort = AbortGuard::new(&t.mnt);
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
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let _on = EnableUring::set("Y");
    let before = fuser::uring_requests_served();
    let t = TestMount::with_policy(uring());
    let _abort = AbortGuard::new(&t.mnt);
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
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let _off = EnableUring::set("N");
    let before = fuser::uring_requests_served();
    let t = TestMount::with_policy(uring());
    let _abort = AbortGuard::new(&t.mnt);
    checks_match_native(&t);
    stat_loop(&t, 200);
    assert_eq!(
        fuser::uring_requests_served(),
        before,
        "requests came from ring entries although enable_uring was N"
    );
}
