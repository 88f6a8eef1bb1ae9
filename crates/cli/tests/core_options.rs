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
