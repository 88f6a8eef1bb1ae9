//! The throwaway sshd on loopback (`dircache_tests::sshd`), alone and behind the delay proxy,
//! and sshfs mounting through it (the harness the remote tests and `bench remote` use).

use std::time::{Duration, Instant};

use dircache_tests::child_mount::{is_mounted, ChildMount};
use dircache_tests::delay_proxy::DelayProxy;
use dircache_tests::sshd::{can_mount_sshfs, sshd_for_test, Sshd};

fn run_ok(mut c: std::process::Command) -> String {
    let o = c.stdin(std::process::Stdio::null()).output().unwrap();
    assert!(
        o.status.success(),
        "{c:?}: {} {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn ssh_runs_a_command_as_the_current_user() {
    let Some(s) = sshd_for_test() else { return };
    let out = run_ok(s.ssh(s.port(), None, "echo hello from $(id -u)"));
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    assert_eq!(out, format!("hello from {uid}\n"));
    assert!(s.log().contains("Accepted publickey"), "{}", s.log());
    // Stopping it frees the port: nothing listens any more.
    let port = s.port();
    let pid_dir = s.dir().to_path_buf();
    drop(s);
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
    assert!(!pid_dir.exists(), "the key directory is removed");
}

#[test]
fn ssh_through_the_delay_proxy_pays_round_trips() {
    let Some(s) = sshd_for_test() else { return };
    let delay = Duration::from_millis(25);
    let proxy = DelayProxy::start(("127.0.0.1", s.port()), delay).unwrap();
    let t0 = Instant::now();
    let out = run_ok(s.ssh(proxy.port(), None, "echo through"));
    let took = t0.elapsed();
    assert_eq!(out, "through\n");
    let t = proxy.traffic();
    assert_eq!(t.connections, 1, "{t:?}");
    // Version exchange, key exchange, authentication, session, command: several round trips.
    assert!(t.round_trips() >= 4, "{t:?}");
    assert!(t.up_bytes > 1000 && t.down_bytes > 1000, "{t:?}");
    assert!(
        took >= 4 * 2 * delay,
        "ssh through a {delay:?} proxy took only {took:?}"
    );
    eprintln!("ssh through a 25 ms proxy: {took:?}, {t:?}");
}

/// sshfs through `port` (sshd's or a proxy's): the files read through the mount are the
/// server's, and the mount is gone after the guard is dropped.
fn sshfs_roundtrip(s: &Sshd, port: u16, tag: &str) {
    let root = tempfile::tempdir().unwrap();
    let tree = root.path().join("tree");
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    std::fs::write(tree.join("sub/file.txt"), "served by sshd\n").unwrap();
    let mnt = root.path().join("mnt");
    let log = root.path().join("sshfs.log");
    let m = ChildMount::start(
        s.sshfs(port, &tree, &mnt, &[]),
        &mnt,
        &log,
        Duration::from_secs(30),
    )
    .unwrap_or_else(|e| panic!("{tag}: sshfs: {e}\nsshd: {}", s.log()));
    assert_eq!(
        std::fs::read_to_string(mnt.join("sub/file.txt")).unwrap(),
        "served by sshd\n"
    );
    let names: Vec<String> = std::fs::read_dir(&mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["sub".to_string()]);
    assert!(m.pid().is_some());
    drop(m);
    assert!(!is_mounted(&mnt), "{tag}: still mounted after drop");
}

#[test]
fn sshfs_mounts_through_sshd_directly_and_through_the_proxy() {
    if !can_mount_sshfs() {
        return;
    }
    let Some(s) = sshd_for_test() else { return };
    sshfs_roundtrip(&s, s.port(), "direct");
    let proxy = DelayProxy::start(("127.0.0.1", s.port()), Duration::from_millis(2)).unwrap();
    sshfs_roundtrip(&s, proxy.port(), "proxied");
    assert!(proxy.traffic().round_trips() > 5, "{:?}", proxy.traffic());
}

#[test]
fn a_failed_sshfs_mount_leaves_nothing_behind() {
    if !can_mount_sshfs() {
        return;
    }
    let Some(s) = sshd_for_test() else { return };
    let root = tempfile::tempdir().unwrap();
    let mnt = root.path().join("mnt");
    let missing = root.path().join("no-such-dir");
    let e = ChildMount::start(
        s.sshfs(s.port(), &missing, &mnt, &[]),
        &mnt,
        &root.path().join("log"),
        Duration::from_secs(30),
    )
    .map(|m| format!("mounted: {}", m.log_text()))
    .expect_err("sshfs of a missing directory must fail");
    assert!(e.contains("No such file"), "{e}");
    assert!(!is_mounted(&mnt));
}
