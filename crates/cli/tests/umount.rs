//! `dircache umount`: unmounts a CLI-started (background) mount and returns only once the
//! daemon has exited (its `-o persist` snapshot is written by then); a busy mount is refused
//! with status 1 and detached by `-l`; anything but a dircache mount is bad input (status 2).

#[path = "../../fuse/tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::can_mount;

const BIN: &str = env!("CARGO_BIN_EXE_dircache");

fn dircache(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

/// Whether process `pid` runs (exists and is not a zombie waiting for its parent, init).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        // "pid (comm) S ...": the state follows the last ')'.
        s.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

fn mounted(mnt: &Path) -> bool {
    dircache_fuse::is_mount_point(mnt)
}

/// A background mount started by the CLI; lazily unmounted on drop if a test left it.
struct Mounted {
    _dir: tempfile::TempDir,
    src: PathBuf,
    mnt: PathBuf,
    snap: PathBuf,
}

impl Mounted {
    fn new() -> Mounted {
        let dir = tempfile::tempdir().unwrap();
        let (src, mnt, snap) = (
            dir.path().join("src"),
            dir.path().join("mnt"),
            dir.path().join("snap"),
        );
        for d in 0..100 {
            let p = src.join(format!("d{d}"));
            std::fs::create_dir_all(&p).unwrap();
            for f in 0..10 {
                std::fs::write(p.join(format!("f{f}")), b"x").unwrap();
            }
        }
        std::fs::create_dir(&mnt).unwrap();
        let opt = format!("persist={}", snap.display());
        let out = dircache(&[
            "mount",
            src.to_str().unwrap(),
            mnt.to_str().unwrap(),
            "-o",
            &opt,
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(mounted(&mnt));
        Mounted {
            _dir: dir,
            src,
            mnt,
            snap,
        }
    }

    fn m(&self) -> &str {
        self.mnt.to_str().unwrap()
    }

    fn daemon_pid(&self) -> u32 {
        let out = dircache(&["stats", self.m(), "--json"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["pid"].as_u64().expect("pid in stats") as u32
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if mounted(&self.mnt) {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
    }
}

#[test]
fn umount_waits_for_the_daemon_and_its_snapshot() {
    if !can_mount() {
        return;
    }
    let m = Mounted::new();
    let n = common::sh_ok(&m.mnt, "find . | wc -l");
    assert_eq!(n.trim(), "1101");
    let pid = m.daemon_pid();
    assert!(running(pid));
    assert!(!m.snap.exists(), "the snapshot is written at unmount");
    let out = dircache(&["umount", m.m()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Checked at once: the command returned only after the daemon was gone.
    assert!(
        !running(pid),
        "dircache umount returned while its daemon (pid {pid}) still ran"
    );
    assert!(m.snap.is_file(), "the daemon's snapshot is not written");
    assert!(!mounted(&m.mnt));
    assert!(m.src.join("d7/f3").is_file());
}

#[test]
fn a_busy_mount_is_refused_and_detached_lazily() {
    if !can_mount() {
        return;
    }
    let m = Mounted::new();
    let pid = m.daemon_pid();
    let mut user = Command::new("sleep")
        .arg("60")
        .current_dir(m.mnt.join("d1"))
        .spawn()
        .unwrap();
    let out = dircache(&["umount", m.m()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("busy"), "{err}");
    assert!(mounted(&m.mnt), "a refused unmount left the mount in place");

    let out = dircache(&["umount", "-l", m.m()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!mounted(&m.mnt));
    // The busy user still works in its (detached) directory; once it goes, so does the daemon.
    assert!(std::fs::read_dir(format!("/proc/{}/cwd", user.id())).is_ok());
    user.kill().unwrap();
    user.wait().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while running(pid) {
        assert!(
            std::time::Instant::now() < deadline,
            "daemon {pid} outlived its lazy unmount"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn umount_of_anything_else_is_bad_input() {
    let d = tempfile::tempdir().unwrap();
    for (path, says) in [
        (d.path().to_str().unwrap(), "not mounted"),
        ("/proc", "not a dircache mount"),
        ("/nonexistent/dircache", "No such file"),
    ] {
        let out = dircache(&["umount", path]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{path}: {err}");
        assert!(err.contains(says), "{path}: {err}");
    }
}
