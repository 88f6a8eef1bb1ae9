//! The core cache's optimizations as mount options: turning one off through `-o` changes
//! what the mount's own counters (`dircache stats --json`) show for the same workload.

#[path = "../../fuse/tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::process::Command;

use common::can_mount;

const BIN: &str = env!("CARGO_BIN_EXE_dircache");

/// Backend lookups the daemon made while `ls d` and then two stats of each of 20 missing
/// names in `d` ran on a fresh mount with `opts` (kernel negative entries off, so every stat
/// reaches the daemon).
fn backend_lookups(opts: &str) -> u64 {
    let dir = tempfile::tempdir().unwrap();
    let (src, mnt) = (dir.path().join("src"), dir.path().join("mnt"));
    std::fs::create_dir_all(src.join("d")).unwrap();
    for i in 0..10 {
        std::fs::write(src.join(format!("d/f{i}")), b"x").unwrap();
    }
    std::fs::create_dir(&mnt).unwrap();
    let o = format!(
        "negative_timeout=0,noprefetch{}{opts}",
        if opts.is_empty() { "" } else { "," }
    );
    let out = Command::new(BIN)
        .arg("mount")
        .arg(&src)
        .arg(&mnt)
        .args([
            "-o",
            &o,
            "-o",
            &format!("log={}", dir.path().join("log").display()),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stats = |mnt: &Path| -> u64 {
        let out = Command::new(BIN)
            .arg("stats")
            .arg(mnt)
            .arg("--json")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["core"]["backend_lookup"]
            .as_u64()
            .expect("core.backend_lookup")
    };
    let listed = std::fs::read_dir(mnt.join("d")).map(|r| r.count());
    let before = stats(&mnt);
    for round in 0..2 {
        for i in 0..20 {
            let e = std::fs::metadata(mnt.join(format!("d/missing{i}"))).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "round {round}");
        }
    }
    let after = stats(&mnt);
    let um = Command::new(BIN).arg("umount").arg(&mnt).status().unwrap();
    if dircache_fuse::is_mount_point(&mnt) {
        let _ = Command::new("umount").arg("-l").arg(&mnt).status();
    }
    assert!(um.success());
    assert_eq!(listed.unwrap(), 10);
    after - before
}

#[test]
fn turning_core_optimizations_off_shows_in_the_counters() {
    if !can_mount() {
        return;
    }
    // Completeness: the listed directory answers every miss.
    assert_eq!(backend_lookups(""), 0, "default");
    // Without it, each name is asked once; the negative entry answers the second stat.
    assert_eq!(backend_lookups("nocompleteness"), 20, "nocompleteness");
    // Without negatives either, every stat is a backend lookup.
    assert_eq!(
        backend_lookups("nocompleteness,nonegatives"),
        40,
        "nocompleteness,nonegatives"
    );
    // The last word wins.
    assert_eq!(
        backend_lookups("nocompleteness,completeness"),
        0,
        "completeness again"
    );
}

#[test]
fn core_options_are_checked() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().to_str().unwrap();
    for (opt, says) in [
        ("nofastpath=1", "takes no value"),
        ("pcc_slots=0", "pcc_slots"),
        ("bypass,completeness", "bypass"),
        ("nocompletenes", "unknown mount option"),
    ] {
        let out = Command::new(BIN)
            .args(["mount", p, p, "-o", opt])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "-o {opt}: {err}");
        assert!(err.contains(says), "-o {opt}: {err}");
    }
    let help = Command::new(BIN)
        .args(["mount", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for s in [
        "nocompleteness",
        "nonegatives",
        "nofastpath",
        "pcc_slots=N",
        "nowalk_batch",
    ] {
        assert!(help.contains(s), "--help lacks {s}");
    }
}

/// `dircache stats --watch`: a header and one line of rates per interval; the rates follow a
/// workload (stats of missing names show as negative hits), and the watch ends with the mount.
#[test]
fn stats_watch_prints_rates_that_follow_the_workload() {
    if !can_mount() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (src, mnt) = (dir.path().join("src"), dir.path().join("mnt"));
    std::fs::create_dir_all(src.join("d")).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    let log = format!(
        "negative_timeout=0,log={}",
        dir.path().join("log").display()
    );
    let out = Command::new(BIN)
        .arg("mount")
        .arg(&src)
        .arg(&mnt)
        .args(["-o", &log])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let worker = {
        let (stop, m) = (stop.clone(), mnt.clone());
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = std::fs::metadata(m.join(format!("d/missing{}", i % 50)));
                i += 1;
            }
        })
    };
    let watch = Command::new(BIN)
        .arg("stats")
        .arg(&mnt)
        .args(["--watch", "0.3", "--count", "3"])
        .output()
        .unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    worker.join().unwrap();
    // Once the mount is gone, a watch without a count ends by itself.
    let mut late = Command::new(BIN)
        .arg("stats")
        .arg(&mnt)
        .args(["--watch", "0.2"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let um = Command::new(BIN).arg("umount").arg(&mnt).status().unwrap();
    if dircache_fuse::is_mount_point(&mnt) {
        let _ = Command::new("umount").arg("-l").arg(&mnt).status();
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let ended = loop {
        if let Some(st) = late.try_wait().unwrap() {
            break Some(st);
        }
        if std::time::Instant::now() > deadline {
            let _ = late.kill();
            let _ = late.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(um.success());
    assert!(
        watch.status.success(),
        "{}",
        String::from_utf8_lossy(&watch.stderr)
    );
    let text = String::from_utf8(watch.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "a header and 3 lines:\n{text}");
    assert!(lines[0].contains("neg/s"), "{text}");
    let neg_col = lines[0]
        .split_whitespace()
        .position(|c| c == "neg/s")
        .unwrap();
    // The header's "rss MiB" is two words; the data columns line up with the others.
    let neg: Vec<f64> = lines[1..]
        .iter()
        .map(|l| l.split_whitespace().nth(neg_col).unwrap().parse().unwrap())
        .collect();
    assert!(
        neg.iter().all(|n| *n > 0.0),
        "negative hits per second: {neg:?}\n{text}"
    );
    assert!(
        ended.is_some_and(|s| s.success()),
        "the watch outlived its mount"
    );
}
