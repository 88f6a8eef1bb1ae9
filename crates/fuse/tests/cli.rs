//! The `dircache mount` / `dircache stats` commands, as users run them.

mod common;
use common::*;
use std::process::{Command, Stdio};
use std::time::Duration;

fn run(args: &[&str]) -> std::process::Output {
    Command::new(dircache_bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("dircache")
}

#[test]
fn bad_input_exits_2_with_one_line() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    let mnt = d.path().join("mnt");
    let file = d.path().join("file");
    std::fs::create_dir(&src).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    std::fs::write(&file, b"x").unwrap();
    let (s, m, f) = (
        src.to_str().unwrap(),
        mnt.to_str().unwrap(),
        file.to_str().unwrap(),
    );
    let missing = d.path().join("missing");
    let missing = missing.to_str().unwrap();
    for args in [
        vec!["mount", missing, m],
        vec!["mount", f, m],
        vec!["mount", s, missing],
        vec!["mount", s, f],
        vec!["mount", s, "/proc"],
        vec!["mount", s, m, "-o", "frobnicate"],
        vec!["mount", s, m, "-o", "threads=many"],
        vec!["stats", m],
    ] {
        let o = run(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    }
    if can_mount() {
        // Not enough privilege.
        let o = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(dircache_bin())
            .args(["mount", s, m])
            .output()
            .unwrap();
        assert_eq!(
            o.status.code(),
            Some(2),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let o = run(&["mount", "--help"]);
    let help = String::from_utf8_lossy(&o.stdout);
    for opt in [
        "entry_timeout",
        "negative_timeout",
        "passthrough",
        "threads",
        "allow_other",
        "cache=",
    ] {
        assert!(help.contains(opt), "--help lacks {opt}");
    }
}

fn mounted(p: &std::path::Path) -> bool {
    dircache_fuse::is_mount_point(p)
}

#[test]
fn background_mount_stats_and_sigterm() {
    if !can_mount() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let (src, mnt) = (d.path().join("src"), d.path().join("mnt"));
    std::fs::create_dir(&src).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    std::fs::write(src.join("hello"), b"hi").unwrap();
    let sock = d.path().join("ctl.sock");
    let o = run(&[
        "mount",
        src.to_str().unwrap(),
        mnt.to_str().unwrap(),
        "-o",
        &format!("socket={}", sock.display()),
    ]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // The parent returned once the mount was up.
    let _guard = ChildGuard(None, Some(mnt.clone()));
    assert!(mounted(&mnt));
    assert_eq!(std::fs::read(mnt.join("hello")).unwrap(), b"hi");
    // Mounting again on it is refused.
    let again = run(&["mount", src.to_str().unwrap(), mnt.to_str().unwrap()]);
    assert_eq!(again.status.code(), Some(2));
    // Stats, human and JSON.
    let s = run(&["stats", mnt.to_str().unwrap()]);
    assert!(s.status.success(), "{}", String::from_utf8_lossy(&s.stderr));
    assert!(String::from_utf8_lossy(&s.stdout).contains("kernel requests"));
    let j = run(&["stats", "--json", mnt.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&j.stdout).expect("json");
    assert!(
        v["kernel_requests"]["by_kind"]["lookup"]
            .as_u64()
            .unwrap_or(0)
            >= 1,
        "{v}"
    );
    let pid = v["pid"].as_u64().expect("pid") as i32;
    // SIGTERM unmounts cleanly and the daemon exits.
    // SAFETY: sending a signal to the daemon this test started.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    assert!(
        wait_for(Duration::from_secs(5), || !mounted(&mnt)).is_some(),
        "still mounted after SIGTERM"
    );
    // SAFETY: probing the pid with signal 0.
    assert!(
        wait_for(Duration::from_secs(5), || unsafe { libc::kill(pid, 0) }
            != 0)
        .is_some(),
        "daemon alive"
    );
}

#[test]
fn foreground_and_external_umount() {
    if !can_mount() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let (src, mnt) = (d.path().join("src"), d.path().join("mnt"));
    std::fs::create_dir(&src).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    let child = Command::new(dircache_bin())
        .args(["mount", "-f", src.to_str().unwrap(), mnt.to_str().unwrap()])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let mut g = ChildGuard(Some(child), Some(mnt.clone()));
    assert!(wait_for(Duration::from_secs(10), || mounted(&mnt)).is_some());
    std::fs::write(mnt.join("f"), b"x").unwrap();
    assert_eq!(std::fs::read(src.join("f")).unwrap(), b"x");
    let st = Command::new("umount").arg(&mnt).status().unwrap();
    assert!(st.success());
    let c = g.0.as_mut().unwrap();
    let exited = wait_for(Duration::from_secs(5), || {
        matches!(c.try_wait(), Ok(Some(_)))
    });
    assert!(exited.is_some(), "daemon did not exit after umount");
}

#[test]
fn mount_t_fuse_dircache_helper() {
    if !can_mount() {
        return;
    }
    let helper = std::path::Path::new("/sbin/mount.fuse.dircache");
    let installed_here = !helper.exists();
    if installed_here {
        let script =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/mount.fuse.dircache");
        std::fs::copy(&script, helper).unwrap();
        chmod(helper, 0o755);
    }
    struct Remove(bool);
    impl Drop for Remove {
        fn drop(&mut self) {
            if self.0 {
                let _ = std::fs::remove_file("/sbin/mount.fuse.dircache");
            }
        }
    }
    let _r = Remove(installed_here);
    let d = tempfile::tempdir().unwrap();
    let (src, mnt) = (d.path().join("src"), d.path().join("mnt"));
    std::fs::create_dir(&src).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    std::fs::write(src.join("x"), b"1").unwrap();
    let o = Command::new("mount")
        .args(["-t", "fuse.dircache", "-o", "nosuid,noatime"])
        .arg(&src)
        .arg(&mnt)
        .env("DIRCACHE_BIN", dircache_bin())
        .output()
        .unwrap();
    let _guard = ChildGuard(None, Some(mnt.clone()));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(mounted(&mnt));
    assert_eq!(std::fs::read(mnt.join("x")).unwrap(), b"1");
    let info = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(
        info.lines()
            .any(|l| l.contains(mnt.to_str().unwrap()) && l.contains("fuse.dircache")),
        "{info}"
    );
    assert!(Command::new("umount").arg(&mnt).status().unwrap().success());
    assert!(wait_for(Duration::from_secs(5), || !mounted(&mnt)).is_some());
}
