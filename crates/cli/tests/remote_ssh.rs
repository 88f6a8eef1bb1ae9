//! Remote mounts over a real OpenSSH server on loopback (issue 10): `dircache mount
//! root@127.0.0.1:SRC MNT -f -o serve_command=..,port=N,IdentityFile=..` (the CLI as a user
//! runs it, a child of the test), sshd started by the test with generated keys
//! (`dircache_tests::sshd::Sshd`), the server `dircache serve --stdio SRC` started by sshd for
//! the login. The server command is a wrapper that records its PID (one line per connection)
//! and execs the binary, so a test can kill the server itself. Native behaviour in a
//! temporary directory is the oracle. Guards unmount every mount and stop sshd (by its PID)
//! also when a test fails.

#[path = "../../fuse/tests/common/mod.rs"]
mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{can_mount, cannot_run, py};
use dircache_tests::child_mount::ChildMount;
use dircache_tests::remote::{eventually, eventually_or};
use dircache_tests::sshd::{sshd_available, Sshd};

const BIN: &str = env!("CARGO_BIN_EXE_dircache");

/// The POSIX checks of crates/fuse/tests/posix.rs (common/posix_checks.rs, shared, not
/// copied).
fn posix_checks() -> &'static str {
    common::posix_checks::CHECKS
}

/// Whether this test can run: root, /dev/fuse and openssh-server (a failure under CI).
fn can_run() -> bool {
    if !can_mount() {
        return false;
    }
    if !sshd_available() {
        cannot_run("needs openssh-server and openssh-client");
        return false;
    }
    true
}

/// A served tree and the sshd serving it. Fields drop in order: mounts (declared by the
/// test after this) first, then sshd, then the directory.
struct Server {
    sshd: Sshd,
    dir: tempfile::TempDir,
    src: PathBuf,
}

impl Server {
    fn start() -> Server {
        let dir = tempfile::Builder::new()
            .prefix("dcssh")
            .tempdir()
            .expect("tempdir");
        common::chmod(dir.path(), 0o755);
        let src = dir.path().join("src");
        std::fs::create_dir(&src).unwrap();
        let sshd = Sshd::start().unwrap_or_else(|e| panic!("sshd: {e}"));
        Server { sshd, dir, src }
    }

    fn s(&self, rel: &str) -> PathBuf {
        self.src.join(rel)
    }

    /// Mount SRC through ssh at `DIR/mnt-NAME`, the server's PIDs going to `DIR/pids-NAME`.
    fn mount(&self, name: &str, extra: &[&str]) -> Client {
        let wrapper = self.dir.path().join(format!("serve-{name}"));
        let pids = self.dir.path().join(format!("pids-{name}"));
        std::fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\necho $$ >> '{}'\nexec '{BIN}' \"$@\"\n",
                pids.display()
            ),
        )
        .unwrap();
        common::chmod(&wrapper, 0o755);
        let mnt = self.dir.path().join(format!("mnt-{name}"));
        let mut c = Command::new(BIN);
        c.arg("mount")
            .arg(format!(
                "{}:{}",
                self.sshd.destination(),
                self.src.display()
            ))
            .arg(&mnt)
            .arg("-f")
            .arg("-o")
            .arg(format!("serve_command={}", wrapper.display()));
        for o in self.sshd.mount_options(self.sshd.port()) {
            c.arg("-o").arg(o);
        }
        for o in extra {
            c.arg("-o").arg(o);
        }
        let log = self.dir.path().join(format!("log-{name}"));
        let m = ChildMount::start(c, &mnt, &log, Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("mount {name}: {e}\nsshd log:\n{}", self.sshd.log()));
        Client { m, mnt, pids }
    }
}

/// One client mount (a `dircache mount` daemon, its ssh and its server).
struct Client {
    m: ChildMount,
    mnt: PathBuf,
    pids: PathBuf,
}

impl Client {
    fn p(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// The PIDs of the servers this client's connections ran, oldest first.
    fn server_pids(&self) -> Vec<i32> {
        std::fs::read_to_string(&self.pids)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }
}

/// The names in `p`, or `None` if listing it fails.
fn try_names(p: &Path) -> Option<Vec<String>> {
    let mut v = std::fs::read_dir(p)
        .ok()?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<std::io::Result<Vec<String>>>()
        .ok()?;
    v.sort();
    Some(v)
}

fn names(p: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(p)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn mode(p: &Path) -> Option<u32> {
    std::fs::metadata(p)
        .ok()
        .map(|m| m.permissions().mode() & 0o7777)
}

#[test]
fn posix_checks_match_native_through_sshd() {
    if !can_run() {
        return;
    }
    let srv = Server::start();
    let a = srv.mount("a", &[]);
    let native = srv.dir.path().join("native");
    std::fs::create_dir(&native).unwrap();
    std::fs::create_dir(a.p("w")).unwrap();
    let checks = posix_checks();
    let want = py(&native, checks, None);
    let got = py(&a.p("w"), checks, None);
    for (x, y) in want.lines().zip(got.lines()) {
        assert_eq!(x, y, "native vs remote mount through sshd");
    }
    assert_eq!(
        want.lines().count(),
        got.lines().count(),
        "native:\n{want}\nremote:\n{got}"
    );
    assert!(srv.s("w/r3").exists(), "the files are on the server");
    assert_eq!(a.server_pids().len(), 1, "one connection");
}

/// Caches `d` of `c` in the client and its kernel: the listing, every file's attributes and
/// contents, and a negative entry for `d/new`.
fn warm(c: &Client) {
    let _ = names(&c.p("d"));
    for n in ["f", "h"] {
        let _ = std::fs::read(c.p(&format!("d/{n}")));
    }
    assert!(std::fs::symlink_metadata(c.p("d/new")).is_err());
}

/// A create, rename, unlink, chmod and write made under `root` (client A's mount or the
/// server's tree) show in client `b`, which cached what they change first (kernel TTLs of a
/// day: only a callback can tell it); returns how long each took to show.
fn changes_show_in(b: &Client, root: &Path, src: &Path, label: &str) -> Vec<(String, Duration)> {
    let r = |rel: &str| root.join(rel);
    let mut lat = vec![];
    warm(b);
    write_closed(&r("d/new"), b"created");
    lat.push((
        format!("{label}: create"),
        eventually(&format!("{label}: create"), || {
            b.p("d/new").exists() && names(&b.p("d")).contains(&"new".to_string())
        }),
    ));
    warm_names(b);
    std::fs::rename(r("d/f"), r("d/g")).unwrap();
    lat.push((
        format!("{label}: rename"),
        eventually(&format!("{label}: rename"), || {
            !b.p("d/f").exists() && b.p("d/g").exists() && names(&b.p("d")) == ["g", "h", "new"]
        }),
    ));
    std::fs::remove_file(r("d/g")).unwrap();
    lat.push((
        format!("{label}: unlink"),
        eventually(&format!("{label}: unlink"), || {
            !b.p("d/g").exists() && names(&b.p("d")) == ["h", "new"]
        }),
    ));
    assert_eq!(mode(&b.p("d/h")), Some(0o644));
    common::chmod(&r("d/h"), 0o600);
    lat.push((
        format!("{label}: chmod"),
        eventually(&format!("{label}: chmod"), || {
            mode(&b.p("d/h")) == Some(0o600)
        }),
    ));
    assert_eq!(std::fs::read(b.p("d/h")).unwrap(), b"hhh");
    write_closed(&r("d/h"), b"written!");
    // Session semantics: once close returned, the server has the data (a store-back that
    // failed would have failed the close above).
    assert_eq!(
        std::fs::read(src.join("d/h")).unwrap(),
        b"written!",
        "{label}: write: on the server after close"
    );
    lat.push((
        format!("{label}: write"),
        eventually_or(&format!("{label}: write"), || {
            match std::fs::read(b.p("d/h")) {
                Ok(d) if d == b"written!" => Ok(()),
                r => Err(format!(
                    "B reads {:?}, B's stat says size {:?}",
                    r.map(|d| String::from_utf8_lossy(&d).into_owned()),
                    std::fs::metadata(b.p("d/h")).map(|m| m.len())
                )),
            }
        }),
    ));
    lat
}

/// Write `data` to `path` (created or truncated) and close it, failing on any error,
/// close's included (`std::fs::write` ignores close errors, and a remote mount stores a
/// file back at close).
fn write_closed(path: &Path, data: &[u8]) {
    use std::io::Write;
    use std::os::fd::IntoRawFd;
    let mut f = std::fs::File::create(path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    f.write_all(data)
        .unwrap_or_else(|e| panic!("{path:?}: write: {e}"));
    let fd = f.into_raw_fd();
    // SAFETY: close(2) of the descriptor just taken from the File (owned, closed once).
    let r = unsafe { libc::close(fd) };
    assert_eq!(r, 0, "{path:?}: close: {}", std::io::Error::last_os_error());
}

fn warm_names(b: &Client) {
    let _ = names(&b.p("d"));
    let _ = std::fs::symlink_metadata(b.p("d/f"));
    let _ = std::fs::symlink_metadata(b.p("d/g"));
}

fn reset_tree(src: &Path) {
    let d = src.join("d");
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir(&d).unwrap();
    std::fs::write(d.join("f"), b"fff").unwrap();
    std::fs::write(d.join("h"), b"hhh").unwrap();
    common::chmod(&d.join("h"), 0o644);
}

/// Two clients (two mounts, two ssh sessions, two servers) of one tree: a create, rename,
/// unlink, chmod and write through client A, and the same made on the server directly, show
/// in client B within 100 ms, with the default one-day kernel TTLs.
#[test]
fn two_clients_see_each_others_changes_through_callbacks() {
    if !can_run() {
        return;
    }
    let srv = Server::start();
    reset_tree(&srv.src);
    let a = srv.mount("a", &[]);
    let b = srv.mount("b", &[]);
    assert_ne!(a.server_pids(), b.server_pids(), "two servers");
    // Both clients know the tree first.
    warm(&a);
    let mut lat = changes_show_in(&b, &a.mnt, &srv.src, "through A");
    reset_tree(&srv.src);
    // While the tree is being replaced on the server, B's listing may fail (the directory
    // it read vanished); only the end state is asserted here. One CI dry run saw EIO
    // from B's readdir in this window: inode numbers reused with another type (docs/remote.md,
    // "Known gap").
    eventually("B sees the reset tree", || {
        try_names(&b.p("d")).is_some_and(|n| n == ["f", "h"])
            && std::fs::read(b.p("d/h")).is_ok_and(|d| d == b"hhh")
            && mode(&b.p("d/h")) == Some(0o644)
    });
    lat.extend(changes_show_in(&b, &srv.src, &srv.src, "on the server"));
    // And A sees the server's side of things too (through its own server's callbacks,
    // which may come after B's: a loaded run read ENOENT here once, when this was not
    // awaited).
    eventually_or("A sees the server-side changes", || {
        match std::fs::read(a.p("d/h")) {
            Ok(d) if d == b"written!" => Ok(()),
            r => Err(format!(
                "A reads {:?}",
                r.map(|d| String::from_utf8_lossy(&d).into_owned())
            )),
        }
    });
    let report: Vec<String> = lat
        .iter()
        .map(|(w, d)| format!("{w} {:.1} ms", d.as_secs_f64() * 1e3))
        .collect();
    eprintln!("callback latencies: {report:?}");
    let mut ds: Vec<Duration> = lat.iter().map(|x| x.1).collect();
    ds.sort();
    let median = ds[ds.len() / 2];
    assert!(
        median < Duration::from_millis(100),
        "median callback latency {median:?} over 100 ms: {report:?}"
    );
    // The slowest may be slowed by a loaded machine, but not by much.
    assert!(
        ds[ds.len() - 1] < Duration::from_secs(1),
        "a change took over a second: {report:?}"
    );
}

/// Python: write `path` in 64 KiB chunks (`n` of them, chunk i filled with byte i % 251),
/// touching `marker` after `at` chunks and then waiting for `go` to exist; prints "ok" when
/// the write and close succeeded, else "err ERRNO".
const WRITER: &str = r#"
import os, sys, time
path, n, at, marker, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
try:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for i in range(n):
            os.write(fd, bytes([i % 251]) * 65536)
            if i + 1 == at:
                open(marker, "w").close()
                while not os.path.exists(go):
                    time.sleep(0.005)
    finally:
        os.close(fd)
    print("ok")
except OSError as e:
    print("err", e.errno)
"#;

fn chunks(n: usize) -> Vec<u8> {
    (0..n).flat_map(|i| vec![(i % 251) as u8; 65536]).collect()
}

/// The server killed in the middle of a copy into the mount: the copy fails with EIO (or
/// succeeds whole), what was closed before the kill is on the server, the client reconnects
/// and carries on, and umount works.
#[test]
fn server_killed_mid_copy_loses_nothing_closed() {
    if !can_run() {
        return;
    }
    let srv = Server::start();
    let mut a = srv.mount("a", &["reconnect_timeout=30"]);
    // Closed (and so acknowledged by the server) before the kill.
    let before = chunks(20);
    std::fs::write(a.p("closed"), &before).unwrap();
    std::fs::create_dir(a.p("dir")).unwrap();
    std::fs::write(a.p("dir/small"), b"small").unwrap();
    let pids = a.server_pids();
    assert_eq!(pids.len(), 1);
    let marker = srv.dir.path().join("marker");
    let go = srv.dir.path().join("go");
    let copy = std::process::Command::new("python3")
        .arg("-c")
        .arg(WRITER)
        .arg(a.p("copy"))
        .args(["64", "16"])
        .arg(&marker)
        .arg(&go)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    // A guard: the writer is waited for even if an assertion below fails.
    struct Reap(Option<std::process::Child>, PathBuf);
    impl Drop for Reap {
        fn drop(&mut self) {
            let _ = std::fs::write(&self.1, b"");
            if let Some(mut c) = self.0.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
    let mut copy = Reap(Some(copy), go.clone());
    eventually("the copy is under way", || marker.exists());
    // SAFETY: kill(2) of the server process this test's sshd session started (its PID came
    // from the wrapper script).
    assert_eq!(unsafe { libc::kill(pids[0], libc::SIGKILL) }, 0);
    std::fs::write(&go, b"").unwrap();
    let out = copy
        .0
        .take()
        .unwrap()
        .wait_with_output()
        .expect("the copy ends");
    let res = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if res == "ok" {
        // Success is only allowed if the whole copy arrives: at once, or (a close made while
        // disconnected is logged: docs/remote.md, "Disconnected operation") once the client
        // has reconnected and reintegrated it.
        eventually("the whole copy on the server", || {
            std::fs::read(srv.s("copy")).is_ok_and(|d| d == chunks(64))
        });
    } else {
        // EIO for a call in flight at the kill; ETIMEDOUT for one made while the client is
        // disconnected and ssh has not connected again within the short wait
        // (docs/remote.md, "Disconnected operation").
        assert!(
            [libc::EIO, libc::ETIMEDOUT]
                .iter()
                .any(|e| res == format!("err {e}")),
            "a clear error: {res}"
        );
    }
    // Nothing closed before the kill is lost: on the server, and through the mount after
    // the client reconnected.
    assert_eq!(std::fs::read(srv.s("closed")).unwrap(), before);
    assert_eq!(std::fs::read(srv.s("dir/small")).unwrap(), b"small");
    let t = eventually("the client reconnects", || {
        std::fs::read(a.p("dir/small")).is_ok_and(|d| d == b"small")
    });
    eprintln!("reconnected after {t:?}; the copy said {res:?}");
    assert!(a.server_pids().len() >= 2, "a new server");
    assert_eq!(std::fs::read(a.p("closed")).unwrap(), before);
    // The mount works as before: a new copy through it arrives whole.
    std::fs::write(a.p("again"), &before).unwrap();
    assert_eq!(std::fs::read(srv.s("again")).unwrap(), before);
    // Callbacks flow on the new connection.
    std::fs::write(srv.s("later"), b"l").unwrap();
    eventually("a server-side change after reconnecting", || {
        a.p("later").exists()
    });
    // umount works and the daemon exits.
    dircache_fuse::unmount(&a.mnt).expect("umount");
    a.m.stop();
    assert!(!dircache_tests::child_mount::is_mounted(&a.mnt));
}

/// The server killed with no reconnecting allowed: calls fail with EIO (never hang), and
/// umount works with the server gone.
#[test]
fn server_killed_without_reconnect_gives_eio_and_umount_works() {
    if !can_run() {
        return;
    }
    let srv = Server::start();
    let mut a = srv.mount("a", &["reconnect_timeout=0"]);
    std::fs::write(a.p("f"), b"x").unwrap();
    let pids = a.server_pids();
    // SAFETY: kill(2) of the server process this test's sshd session started.
    assert_eq!(unsafe { libc::kill(pids[0], libc::SIGKILL) }, 0);
    eventually("EIO once the server is gone", || {
        std::fs::metadata(a.p("never-seen")).is_err_and(|e| e.raw_os_error() == Some(libc::EIO))
    });
    assert_eq!(std::fs::read(srv.s("f")).unwrap(), b"x");
    let t0 = Instant::now();
    dircache_fuse::unmount(&a.mnt).expect("umount with the server gone");
    a.m.stop();
    assert!(!dircache_tests::child_mount::is_mounted(&a.mnt));
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "umount took {:?}",
        t0.elapsed()
    );
}
