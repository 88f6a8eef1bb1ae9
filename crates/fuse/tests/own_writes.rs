//! Passthrough writes made through the mount, as the change feed reports them
//! (`crates/fuse/src/fs/own_writes.rs`, docs/opens.md "Creating"): fanotify reports them as
//! the writing thread's changes; the daemon recognises a write of a thread it let write that
//! very file and tells the kernel nothing (the kernel invalidated its copy itself), while
//! every other change — another process's, or the same thread's to another file — is still
//! invalidated as before.

mod common;
use common::*;

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

/// The notifier's counters (`changes`, `own_writes`, `inval_inode`, `inval_entry`).
fn notifier(t: &TestMount) -> serde_json::Value {
    let v = dircache_fuse::stats::query(
        &t.dir.path().join("ctl.sock"),
        &serde_json::json!({"op": "stats"}),
    )
    .expect("stats");
    v["stats"]["notifier"].clone()
}

fn n(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or(0)
}

/// Whether the feed is fanotify here (root): the only source that names the writer.
fn fanotify_here() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

const N: u64 = 50;

/// N writes through one open descriptor, each reported by the feed before the next: every
/// report is recognised as the mount's own write and costs the kernel no invalidation
/// (before: one `inval_inode` per report).
#[test]
fn passthrough_writes_cause_no_kernel_invalidation() {
    if !can_mount() {
        return;
    }
    if !fanotify_here() {
        cannot_run("fanotify needs root");
        return;
    }
    let t = TestMount::new();
    // Created first: a CREATE queues no invalidation (its nodeid is new to the kernel), nor
    // does a write-only OPEN (nothing can map it; docs/opens.md).
    std::fs::write(t.m("log"), b"").unwrap();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(t.m("log"))
        .unwrap();
    // The feed's reports of the creation are in before the baseline.
    let a = notifier_quiet(&t);
    for i in 0..N {
        f.write_all(b"abc\n").unwrap();
        let seen = wait_for(Duration::from_secs(10), || {
            n(&notifier(&t), "changes") > n(&a, "changes") + i
        });
        assert!(
            seen.is_some(),
            "write {i} never reported: {:?}",
            notifier(&t)
        );
    }
    let b = notifier(&t);
    drop(f);
    let d = |k| n(&b, k) - n(&a, k);
    eprintln!(
        "{N} writes: {} reports, {} own, {} inval_inode",
        d("changes"),
        d("own_writes"),
        d("inval_inode")
    );
    assert_eq!(d("own_writes"), d("changes"), "{a} -> {b}");
    assert_eq!(d("inval_inode") + d("inval_entry"), 0, "{a} -> {b}");
    assert_eq!(
        std::fs::read(t.s("log")).unwrap(),
        b"abc\n".repeat(N as usize)
    );
    assert_eq!(std::fs::metadata(t.m("log")).unwrap().len(), 4 * N);
}

/// Wait until the notifier's counters stay the same for 4 polls 50 ms apart (≤ 10 s).
fn notifier_quiet(t: &TestMount) -> serde_json::Value {
    let mut last = notifier(t);
    let mut quiet = 0;
    let _ = wait_for(Duration::from_secs(10), || {
        std::thread::sleep(Duration::from_millis(50));
        let now = notifier(t);
        quiet = if now == last { quiet + 1 } else { 0 };
        last = now;
        quiet >= 4
    });
    last
}

/// N open(O_APPEND) + write + close cycles, as loggers append: the feed reads a cycle's
/// write after its RELEASE more often than not, and such a report is still the mount's own
/// (the registration waits for the feed, `crates/local/src/own.rs`). Before, a report read
/// after the release was taken for an outside change: 2–4 `inval_inode` per 50 cycles, and
/// the next cycle's open asked GETATTR and GETXATTR again.
#[test]
fn writes_of_released_handles_cause_no_kernel_invalidation() {
    if !can_mount() {
        return;
    }
    if !fanotify_here() {
        cannot_run("fanotify needs root");
        return;
    }
    let t = TestMount::new();
    std::fs::write(t.m("log"), b"").unwrap();
    let a = notifier_quiet(&t);
    for _ in 0..N {
        std::fs::OpenOptions::new()
            .append(true)
            .open(t.m("log"))
            .unwrap()
            .write_all(b"abc\n")
            .unwrap();
    }
    let seen = wait_for(Duration::from_secs(10), || {
        n(&notifier(&t), "changes") > n(&a, "changes")
    });
    assert!(seen.is_some(), "no write reported: {:?}", notifier(&t));
    let b = notifier_quiet(&t);
    let d = |k| n(&b, k) - n(&a, k);
    eprintln!(
        "{N} append cycles: {} reports, {} own, {} inval_inode",
        d("changes"),
        d("own_writes"),
        d("inval_inode")
    );
    assert_eq!(d("own_writes"), d("changes"), "{a} -> {b}");
    assert_eq!(d("inval_inode") + d("inval_entry"), 0, "{a} -> {b}");
    assert_eq!(std::fs::metadata(t.m("log")).unwrap().len(), 4 * N);
}

/// Wait until the mount shows `rel` with `size` bytes (the kernel's cached attributes were
/// dropped); panic after 10 s.
fn wait_size(t: &TestMount, rel: &str, size: u64, what: &str) {
    let seen = wait_for(Duration::from_secs(10), || {
        std::fs::metadata(t.m(rel)).map(|m| m.len()).ok() == Some(size)
    });
    assert!(
        seen.is_some(),
        "{what}: MNT/{rel} has {:?} bytes, SRC/{rel} {size}",
        std::fs::metadata(t.m(rel)).map(|m| m.size())
    );
}

/// Native changes racing writes through the mount are never lost: while this thread keeps
/// writing MNT/busy through a passthrough descriptor, (1) another process appends to
/// SRC/other, (2) this same thread appends to SRC/other, (3) another process appends to
/// SRC/busy itself; each shows through the mount (the kernel kept the attributes of `other`
/// for a day: only an invalidation makes it ask again).
fn racing_native_changes_are_seen(t: &TestMount) {
    std::fs::write(t.s("other"), b"").unwrap();
    let mut busy = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(t.m("busy"))
        .unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    /// Stops the writer thread also when an assertion fails (the scope joins it).
    struct Stop<'a>(&'a std::sync::atomic::AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
    std::thread::scope(|s| {
        let stopper = Stop(&stop);
        // Another thread of this process keeps writing through the mount meanwhile.
        let w = s.spawn(|| {
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(t.m("busy"))
                .unwrap();
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                f.write_all(b"m").unwrap();
                n += 1;
            }
            n
        });
        let mut size = 0;
        for round in 0..20 {
            // Cached in the kernel with its current size.
            wait_size(t, "other", size, "before");
            busy.write_all(b"b").unwrap();
            if round % 2 == 0 {
                let out = std::process::Command::new("sh")
                    .arg("-c")
                    .arg(format!("printf 'xy' >> '{}'", t.s("other").display()))
                    .status()
                    .unwrap();
                assert!(out.success());
            } else {
                std::fs::OpenOptions::new()
                    .append(true)
                    .open(t.s("other"))
                    .unwrap()
                    .write_all(b"xy")
                    .unwrap();
            }
            busy.write_all(b"b").unwrap();
            size += 2;
            wait_size(
                t,
                "other",
                size,
                if round % 2 == 0 {
                    "another process's append"
                } else {
                    "this thread's native append"
                },
            );
        }
        drop(stopper);
        let m = w.join().unwrap();
        // Another process appends to the busy file itself.
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("printf 'native' >> '{}'", t.s("busy").display()))
            .status()
            .unwrap();
        assert!(out.success());
        let want = 40 + m + 6;
        assert_eq!(std::fs::metadata(t.s("busy")).unwrap().len(), want);
        wait_size(t, "busy", want, "another process's append to the busy file");
    });
    drop(busy);
    let want = std::fs::metadata(t.s("busy")).unwrap().len();
    wait_size(t, "busy", want, "after close");
}

#[test]
fn native_changes_racing_own_writes_are_seen() {
    if !can_mount() {
        return;
    }
    if !fanotify_here() {
        cannot_run("fanotify needs root");
        return;
    }
    let t = TestMount::new();
    racing_native_changes_are_seen(&t);
    let v = notifier(&t);
    eprintln!("fanotify: {v}");
    assert!(n(&v, "own_writes") > 0, "{v}");
}

/// The inotify feed names no writer: every report is handled as before (no own writes), and
/// the same races are seen.
#[test]
fn inotify_feed_reports_every_write() {
    if !can_mount() {
        return;
    }
    let t = TestMount::with_watch(dircache_local::WatchMode::Inotify);
    racing_native_changes_are_seen(&t);
    let v = notifier(&t);
    eprintln!("inotify: {v}");
    assert_eq!(n(&v, "own_writes"), 0, "{v}");
    assert!(n(&v, "changes") > 0, "{v}");
}
