//! Disconnected operation at its edges (docs/remote.md, "Disconnected operation"), with real
//! parts: `dircache mount localhost:SRC MNT` through the shared remote harness
//! (crates/tests/src/remote.rs: a stand-in ssh running `dircache serve --stdio SRC`, which
//! refuses connections while cut), a real FUSE mount, the server killed by PID to cut the
//! connection. What the server holds at the end is the oracle.
//!
//! - a file opened for writing while connected and closed while cut off: the close succeeds,
//!   its contents are logged and reintegrated (also after a kill -9 of the client);
//! - misses while cut off answer at once: no call waits for the reconnection once it is known
//!   to fail (the `offline_waits` counter of `dircache stats`);
//! - right after the reintegration (the log gone), a file it stored reads back, not ENOENT.

#[path = "../../fuse/tests/common/mod.rs"]
mod common;

use std::io::{Seek, SeekFrom, Write};
use std::os::fd::IntoRawFd;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{can_mount, sh_ok};
use dircache_tests::remote::{eventually, eventually_or, Client, Remote};

const BIN: &str = env!("CARGO_BIN_EXE_dircache");

fn errno<T>(r: std::io::Result<T>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
}

/// `r`'s value, or a panic naming `what` with the client's log.
fn ok<T>(c: &Client, what: &str, r: std::io::Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("{what}: {e}\n{}", c.log_text()))
}

/// `dircache stats --json MNT`'s `backend` counter `name`.
fn counter(c: &Client, name: &str) -> u64 {
    let out = Command::new(BIN)
        .arg("stats")
        .arg("--json")
        .arg(&c.mnt)
        .output()
        .expect("dircache stats");
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stats JSON");
    v["backend"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no backend.{name} in {v}"))
}

/// Wait until `f` reads `want` through `c` with no round trip: its container is valid (the
/// callbacks of its making have come), so it is usable while cut off.
fn cached(c: &Client, f: &str, want: &[u8]) {
    eventually(&format!("{f} cached with no round trip"), || {
        let before = c.calls("");
        std::fs::read(c.m(f)).is_ok_and(|d| d == want) && c.calls("") == before
    });
}

/// The modification log directory of `r`'s cache directory (one `cml-*`).
fn log_dir(r: &Remote) -> std::path::PathBuf {
    let dirs: Vec<_> = std::fs::read_dir(&r.cache)
        .expect("cache dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("cml-"))
        })
        .collect();
    assert_eq!(dirs.len(), 1, "one modification log: {dirs:?}");
    dirs[0].clone()
}

/// Open `p` for writing while connected, append `first`, then (after `cut`) append `second`
/// and close: close(2)'s result.
fn write_across_a_cut(p: &Path, first: &[u8], second: &[u8], cut: impl FnOnce()) -> i32 {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(p)
        .unwrap_or_else(|e| panic!("open {}: {e}", p.display()));
    f.seek(SeekFrom::End(0)).unwrap();
    f.write_all(first).unwrap();
    cut();
    f.write_all(second).unwrap();
    let fd = f.into_raw_fd();
    // SAFETY: close(2) of the descriptor just taken from the File (closed once, here).
    if unsafe { libc::close(fd) } == 0 {
        0
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
    }
}

/// A server file `w` ("base\n") cached by a client, opened for writing, written ("first\n"),
/// the connection cut, written again ("second\n") and closed: the close must succeed.
fn session_closed_while_cut_off() -> (Remote, Client) {
    let r = Remote::new();
    std::fs::write(r.s("w"), b"base\n").unwrap();
    let c = r.mount("", "reconnect_timeout=30");
    cached(&c, "w", b"base\n");
    let rc = write_across_a_cut(&c.m("w"), b"first\n", b"second\n", || r.cut(&c));
    assert_eq!(rc, 0, "close(2) while cut off: errno {rc}");
    (r, c)
}

/// Coda's store-back of a session that ends while disconnected: a file opened for writing
/// while connected and closed while cut off. The close succeeds, the contents are logged in
/// the modification log and stored on the server at the reconnection, whole.
#[test]
fn a_file_opened_before_the_cut_and_closed_during_it_is_reintegrated() {
    if !can_mount() {
        return;
    }
    let (r, c) = session_closed_while_cut_off();
    assert_eq!(std::fs::read(c.m("w")).unwrap(), b"base\nfirst\nsecond\n");
    assert_eq!(
        std::fs::read(r.s("w")).unwrap(),
        b"base\n",
        "nothing reached the server while cut off\n{}",
        c.log_text()
    );
    r.restore();
    eventually_or("the session's data on the server", || {
        let d = std::fs::read(r.s("w")).unwrap_or_default();
        (d == b"base\nfirst\nsecond\n")
            .then_some(())
            .ok_or_else(|| format!("{:?}\n{}", String::from_utf8_lossy(&d), c.log_text()))
    });
    eventually("the log emptied", || !log_dir(&r).join("log").exists());
    assert_eq!(
        ok(
            &c,
            "read w after the reintegration",
            std::fs::read(c.m("w"))
        ),
        b"base\nfirst\nsecond\n"
    );
    assert!(
        !std::fs::read_dir(&r.src).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .contains("conflict")),
        "no conflict copy of the client's own store"
    );
}

/// The same session's log survives a crash: the client is killed (SIGKILL, by PID) after the
/// close while still cut off; the next mount replays the log and the server gets the data.
#[test]
fn a_session_closed_while_cut_off_survives_a_kill9() {
    if !can_mount() {
        return;
    }
    let (r, c) = session_closed_while_cut_off();
    c.kill9();
    assert!(log_dir(&r).join("log").exists(), "the store is logged");
    assert_eq!(std::fs::read(r.s("w")).unwrap(), b"base\n");
    r.restore();
    let c = r.mount("", "reconnect_timeout=30");
    eventually("the store replayed by the next mount", || {
        std::fs::read(r.s("w")).is_ok_and(|d| d == b"base\nfirst\nsecond\n")
    });
    assert_eq!(std::fs::read(c.m("w")).unwrap(), b"base\nfirst\nsecond\n");
}

/// While cut off, once a reconnection attempt has failed, a miss is answered at once: ENOENT
/// for a name a complete listing lacks (a cached directory's, a directory made while cut
/// off), ETIMEDOUT for what was never cached (a name in a directory never listed, a file
/// never fetched). No call waits for the reconnection (`offline_waits` stays put), so the
/// misses take far less than their count times the 2 s grace.
#[test]
fn misses_while_cut_off_answer_at_once() {
    if !can_mount() {
        return;
    }
    let r = Remote::new();
    sh_ok(
        &r.src,
        "mkdir -p d cold && printf one > d/a && printf never > d/unread && printf x > cold/x",
    );
    let c = r.mount("", "reconnect_timeout=10");
    eventually("d listed with no round trip", || {
        let before = c.calls("");
        std::fs::read_dir(c.m("d")).is_ok_and(|d| d.count() == 2)
            && errno(std::fs::metadata(c.m("d/missing"))) == Some(libc::ENOENT)
            && c.calls("") == before
    });
    cached(&c, "d/a", b"one");
    r.cut(&c);
    eventually("a reconnection attempt failed", || {
        c.log_text().contains("reconnecting (attempt 1)")
    });
    let waits = counter(&c, "offline_waits");
    let t0 = Instant::now();
    let mut took = Vec::new();
    let mut timed = |what: &str, f: &mut dyn FnMut()| {
        let t = Instant::now();
        f();
        took.push((what.to_string(), t.elapsed()));
    };
    timed("a name a cached listing lacks", &mut || {
        assert_eq!(errno(std::fs::metadata(c.m("d/other"))), Some(libc::ENOENT))
    });
    timed("mkdir while cut off", &mut || {
        ok(&c, "mkdir d/new", std::fs::create_dir(c.m("d/new")))
    });
    timed("create in it", &mut || {
        ok(
            &c,
            "create d/new/f",
            std::fs::write(c.m("d/new/f"), b"made"),
        )
    });
    timed("rename in it (a lookup of the new name)", &mut || {
        ok(
            &c,
            "rename",
            std::fs::rename(c.m("d/new/f"), c.m("d/new/g")),
        )
    });
    timed("a name the new directory lacks", &mut || {
        assert_eq!(
            errno(std::fs::metadata(c.m("d/new/nothing"))),
            Some(libc::ENOENT)
        )
    });
    timed("a name in a directory never listed", &mut || {
        assert_eq!(
            errno(std::fs::metadata(c.m("cold/x"))),
            Some(libc::ETIMEDOUT)
        )
    });
    timed("a file never fetched", &mut || {
        assert_eq!(errno(std::fs::read(c.m("d/unread"))), Some(libc::ETIMEDOUT))
    });
    let all = t0.elapsed();
    eprintln!("misses while cut off: {took:?}; all: {all:?}");
    assert_eq!(
        counter(&c, "offline_waits"),
        waits,
        "no call waited for the reconnection: {took:?}"
    );
    // Seven operations; before, each miss among them waited the 2 s grace.
    assert!(all < Duration::from_secs(5), "{took:?}");
    assert_eq!(std::fs::read(c.m("d/new/g")).unwrap(), b"made");
    r.restore();
    eventually("reintegrated", || {
        std::fs::read(r.s("d/new/g")).is_ok_and(|d| d == b"made")
    });
    eventually("the never-listed directory after the reconnection", || {
        std::fs::read(c.m("cold/x")).is_ok_and(|d| d == b"x")
    });
}
