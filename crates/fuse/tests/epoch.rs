//! Lost changes (`Change::Overflow`: a change feed that overflowed, a remote connection whose
//! callback promises broke) must also drop the kernel's negative entries, which nobody can
//! name: the notifier increments the connection's epoch (FUSE_NOTIFY_INC_EPOCH, Linux 6.16).
//!
//! The mount here has no change feed, so changes made in SRC are lost by construction (the
//! window between a change and a feed's report, made endless); the test then injects the
//! `Overflow` a feed reports when it lost events, through the notifier's channel, exactly as
//! the feed's would be applied. The remote counterpart (a server killed, its promises
//! broken) is crates/cli/tests/remote_mount.rs `the_client_reconnects_after_the_server_is_killed`.

mod common;

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::{can_mount, wait_for};
use dircache_core::Change;
use dircache_fuse::NotifyMsg;

/// A mount of SRC without a change feed, served on a thread; unmounted on drop.
struct Mount {
    dir: tempfile::TempDir,
    notify: crossbeam_channel::Sender<NotifyMsg>,
    counters: Arc<dircache_fuse::stats::RequestCounters>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Mount {
    fn new() -> Mount {
        let dir = tempfile::Builder::new()
            .prefix("dcepoch")
            .tempdir()
            .expect("tempdir");
        let src = dir.path().join("src");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&src).unwrap();
        std::fs::create_dir(&mnt).unwrap();
        let backend =
            dircache_local::LocalBackend::with_options(&src, 0, dircache_local::WatchMode::Off)
                .expect("local backend");
        let cache =
            dircache_core::Cache::new(Arc::new(backend), Default::default()).expect("cache");
        let cfg = dircache_fuse::MountConfig::new(&src, &mnt);
        assert_eq!(cfg.policy.negative_ttl, dircache_fuse::policy::LONG_TTL);
        let mounted = dircache_fuse::mount(cache, &cfg).expect("mount");
        let notify = mounted.notify_sender();
        let counters = mounted.counters.clone();
        let thread = std::thread::spawn(move || {
            if let Err(e) = mounted.run() {
                eprintln!("session: {e}");
            }
        });
        Mount {
            dir,
            notify,
            counters,
            thread: Some(thread),
        }
    }

    fn m(&self, rel: &str) -> std::path::PathBuf {
        self.dir.path().join("mnt").join(rel)
    }

    fn s(&self, rel: &str) -> std::path::PathBuf {
        self.dir.path().join("src").join(rel)
    }

    /// What a change feed reports when it lost events, applied by the notifier thread;
    /// returns once the notifier has sent what it made of it (a marker change queued after
    /// it has started). No polling: other programs on a shared machine drop the kernel's
    /// caches (benchmarks write /proc/sys/vm/drop_caches), which would reveal stale names
    /// given time; the checks that follow run at once.
    fn overflow(&self) {
        let changes = || self.counters.changes.load(Ordering::SeqCst);
        let before = changes();
        for c in [
            Change::Overflow,
            Change::Attr {
                path: b"no-such-marker".to_vec(),
            },
        ] {
            self.notify.send(NotifyMsg::Change(c)).expect("notifier");
        }
        assert!(
            wait_for(Duration::from_secs(10), || changes() >= before + 2).is_some(),
            "the notifier did not apply the Overflow"
        );
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let mnt = self.dir.path().join("mnt");
        if dircache_fuse::unmount(&mnt).is_err() {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&mnt)
                .status();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn absent(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_err_and(|e| e.raw_os_error() == Some(libc::ENOENT))
}

/// Negative entries the kernel holds for a day (answered by a LOOKUP, and from a complete
/// listing), then names created behind the cache's back, then an Overflow: each name is found
/// by name at once.
#[test]
fn overflow_drops_kernel_negative_entries() {
    if !can_mount() {
        return;
    }
    let t = Mount::new();
    std::fs::create_dir(t.s("d")).unwrap();
    std::fs::write(t.s("d/here"), b"x").unwrap();
    // The kernel caches these misses (one-day negative TTL): one by a plain LOOKUP, one in
    // a directory whose complete listing the cache holds.
    assert!(absent(&t.m("g")));
    assert_eq!(std::fs::read_dir(t.m("d")).unwrap().count(), 1);
    assert!(absent(&t.m("d/g")));
    let lookups = |t: &Mount| t.counters.get(dircache_fuse::stats::Op::lookup);
    let before = lookups(&t);
    assert!(absent(&t.m("g")) && absent(&t.m("d/g")));
    assert_eq!(
        lookups(&t),
        before,
        "the misses were kernel negative entries"
    );
    // Changes nobody reports.
    std::fs::write(t.s("g"), b"g").unwrap();
    std::fs::write(t.s("d/g"), b"dg").unwrap();
    assert!(absent(&t.m("g")), "a negative entry stays without a report");
    // The feed lost events: it says so.
    let epochs = t.counters.notify_inc_epoch.load(Ordering::Relaxed);
    t.overflow();
    assert!(
        std::fs::metadata(t.m("g")).is_ok() && std::fs::metadata(t.m("d/g")).is_ok(),
        "names created while changes were lost are invisible by name after the Overflow"
    );
    assert_eq!(std::fs::read(t.m("d/g")).unwrap(), b"dg");
    assert_eq!(
        t.counters.notify_inc_epoch.load(Ordering::Relaxed),
        epochs + 1,
        "one epoch increment"
    );
    // Positive entries made before the Overflow were dropped too: a name removed behind the
    // cache's back is gone after the next one.
    assert!(std::fs::metadata(t.m("d/here")).is_ok());
    std::fs::remove_file(t.s("d/here")).unwrap();
    assert!(std::fs::metadata(t.m("d/here")).is_ok(), "still cached");
    t.overflow();
    assert!(
        absent(&t.m("d/here")),
        "a removed name stays after the Overflow"
    );
}
