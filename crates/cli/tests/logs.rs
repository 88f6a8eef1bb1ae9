//! The background daemon's log: `-o log=PATH` gets the mount's life and, with `-o debug`,
//! every request; root's default is /var/log/dircache/NAME.log; under systemd
//! (`JOURNAL_STREAM`) the daemon keeps its standard error; a mount that fails after the fork
//! says where the log is.

#[path = "../../fuse/tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::can_mount;

const BIN: &str = env!("CARGO_BIN_EXE_dircache");

struct Tree {
    dir: tempfile::TempDir,
    src: PathBuf,
    mnt: PathBuf,
}

impl Tree {
    fn new() -> Tree {
        let dir = tempfile::tempdir().unwrap();
        let (src, mnt) = (dir.path().join("src"), dir.path().join("mnt"));
        std::fs::create_dir_all(src.join("a")).unwrap();
        std::fs::create_dir(&mnt).unwrap();
        Tree { dir, src, mnt }
    }

    fn mount(&self, opts: &str, env: &[(&str, &str)], stderr: Stdio) -> Output {
        let mut c = Command::new(BIN);
        c.arg("mount").arg(&self.src).arg(&self.mnt);
        if !opts.is_empty() {
            c.args(["-o", opts]);
        }
        c.env_remove("JOURNAL_STREAM").env_remove("DIRCACHE_LOG");
        for (k, v) in env {
            c.env(k, v);
        }
        c.stderr(stderr).output().unwrap()
    }

    fn umount(&self) {
        let out = Command::new(BIN)
            .arg("umount")
            .arg(&self.mnt)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        if dircache_fuse::is_mount_point(&self.mnt) {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
    }
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn log_option_records_the_mount_and_debug_records_requests() {
    if !can_mount() {
        return;
    }
    let t = Tree::new();
    let log = t.dir.path().join("quiet.log");
    let out = t.mount(&format!("log={}", log.display()), &[], Stdio::piped());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(std::fs::metadata(t.mnt.join("a/missing")).is_err());
    t.umount();
    let text = read(&log);
    let src = t.src.display().to_string();
    assert!(text.contains(&format!("mounted {src} on")), "{text}");
    assert!(text.contains("unmounted"), "{text}");
    assert!(
        !text.contains("LOOKUP"),
        "requests logged without -o debug:\n{text}"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&log).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    let dlog = t.dir.path().join("debug.log");
    let out = t.mount(
        &format!("debug,log={}", dlog.display()),
        &[],
        Stdio::piped(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(std::fs::metadata(t.mnt.join("a/missing")).is_err());
    t.umount();
    let text = read(&dlog);
    assert!(
        text.lines()
            .any(|l| l.contains("LOOKUP") && l.contains("missing")),
        "the LOOKUP of a/missing is not in the debug log:\n{text}"
    );
}

#[test]
fn root_logs_to_var_log_dircache_by_default() {
    if !can_mount() {
        return;
    }
    let t = Tree::new();
    let mnt = t.mnt.canonicalize().unwrap();
    let name = mnt.to_str().unwrap().trim_matches('/').replace('/', "-");
    let log = PathBuf::from(format!("/var/log/dircache/{name}.log"));
    let out = t.mount("", &[], Stdio::piped());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    t.umount();
    let text = read(&log);
    let _ = std::fs::remove_file(&log);
    assert!(text.contains("unmounted"), "{text}");
}

#[test]
fn under_systemd_the_daemon_keeps_its_stderr() {
    if !can_mount() {
        return;
    }
    let t = Tree::new();
    let err = t.dir.path().join("journal");
    let f = std::fs::File::create(&err).unwrap();
    let out = t.mount("", &[("JOURNAL_STREAM", "8:1234")], Stdio::from(f));
    assert!(out.status.success(), "{}", read(&err));
    t.umount();
    let text = read(&err);
    assert!(
        text.contains("unmounted"),
        "the daemon's log is not on its stderr:\n{text}"
    );
    let name = t.mnt.canonicalize().unwrap();
    let name = name.to_str().unwrap().trim_matches('/').replace('/', "-");
    assert!(!Path::new(&format!("/var/log/dircache/{name}.log")).exists());
}

#[test]
fn a_failed_mount_says_where_the_log_is() {
    if !can_mount() {
        return;
    }
    let t = Tree::new();
    let log = t.dir.path().join("fail.log");
    // The remote connection is made by the daemon, after the fork: its failure is in the log.
    let out = Command::new(BIN)
        .arg("mount")
        .arg(format!("localhost:{}", t.src.display()))
        .arg(&t.mnt)
        .args([
            "-o",
            &format!("ssh_command=/bin/false,log={}", log.display()),
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("the daemon's log: {}", log.display())),
        "{err}"
    );
    assert!(read(&log).contains("ERROR"), "{}", read(&log));
    assert!(!dircache_fuse::is_mount_point(&t.mnt));

    let out = t.mount("log=relative.log", &[], Stdio::piped());
    assert_eq!(out.status.code(), Some(2));
    let out = t.mount("log=/proc/no/such/dir/x.log", &[], Stdio::piped());
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("log"));
    assert!(!dircache_fuse::is_mount_point(&t.mnt));
}
