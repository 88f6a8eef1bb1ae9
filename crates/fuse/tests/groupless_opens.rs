//! Read-only opens without the caller's supplementary groups (docs/opens.md, "What an
//! open+read costs, and where"): the daemon skips reading `/proc/TID/status` when the groups
//! cannot decide the open — the caller owns the file and the directory it is opened from, or
//! is root, on a file system whose access is mode bits and POSIX ACLs — and reads them
//! whenever they can, judged on the real file and directory, not on what the cache believes.

mod common;
use common::*;

use std::os::unix::fs::chown;
use std::path::Path;
use std::process::{Command, Stdio};

/// Opens the daemon has made without reading the caller's groups so far.
fn groupless_opens(t: &TestMount) -> u64 {
    let v = dircache_fuse::stats::query(
        &t.dir.path().join("ctl.sock"),
        &serde_json::json!({"op": "stats"}),
    )
    .expect("stats");
    v["stats"]["kernel_requests"]["groupless_opens"]
        .as_u64()
        .expect("kernel_requests.groupless_opens in the stats")
}

/// Read `path` (relative to `dir`) `n` times as uid 1000, gid 1000, supplementary group 1001;
/// what was read the last time, or the errno name of the failure.
fn read_as_user(dir: &Path, path: &str, n: usize) -> String {
    let script = format!(
        "import errno\nfor _ in range({n}):\n    try:\n        r = open({path:?}, 'rb').read().decode()\n    except OSError as e:\n        r = errno.errorcode[e.errno]\nprint(r)"
    );
    let o = Command::new("setpriv")
        .args(["--reuid=1000", "--regid=1000", "--groups=1001", PY, "-c"])
        .arg(script)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("setpriv python3");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

fn fill(d: &Path) {
    std::fs::create_dir(d.join("u")).unwrap();
    chown(d.join("u"), Some(1000), Some(1000)).unwrap();
    chmod(&d.join("u"), 0o755);
    std::fs::write(d.join("u/mine"), b"mine").unwrap();
    chown(d.join("u/mine"), Some(1000), Some(1000)).unwrap();
    std::fs::write(d.join("u/theirs"), b"theirs").unwrap();
    chown(d.join("u/theirs"), Some(1002), Some(1002)).unwrap();
    std::fs::write(d.join("rootfile"), b"root").unwrap();
    for f in ["u/mine", "u/theirs", "rootfile"] {
        chmod(&d.join(f), 0o644);
    }
}

/// Root's reads and an owner's reads are opened without the groups; another user's read of
/// a file they do not own reads them, as before. Every read returns the data.
#[test]
fn reads_by_the_owner_or_root_skip_the_groups() {
    if !can_mount() {
        return;
    }
    let t = TestMount::filled(Default::default(), fill);
    let n = 20;
    let g0 = groupless_opens(&t);
    for _ in 0..n {
        assert_eq!(std::fs::read(t.m("rootfile")).unwrap(), b"root");
    }
    let g1 = groupless_opens(&t);
    assert_eq!(g1 - g0, n, "root's {n} reads of its file");
    assert_eq!(read_as_user(&t.mnt, "u/mine", n as usize), "mine");
    let g2 = groupless_opens(&t);
    assert_eq!(
        g2 - g1,
        n,
        "the owner's {n} reads of its file in its directory"
    );
    assert_eq!(read_as_user(&t.mnt, "u/theirs", n as usize), "theirs");
    assert_eq!(
        groupless_opens(&t),
        g2,
        "a read of another user's file must read the caller's groups"
    );
}

/// The kernel and the cache still believe the caller owns a file (or its directory) that
/// was chowned in SRC (no change feed: the window before its report, made endless), and the
/// new owner's group, which the caller is in, is refused what others may do (mode 0604 /
/// 0705). Natively the open fails with EACCES; through the mount the daemon must see on the
/// real file that the groups decide and open with them: EACCES too, not the data.
#[test]
fn groups_decide_an_open_once_the_owner_changed_in_src() {
    if !can_mount() {
        return;
    }
    let t = TestMount::without_feed();
    let native = t.dir.path().join("native");
    std::fs::create_dir(&native).unwrap();
    chmod(&native, 0o755);
    for d in [&native, &t.src] {
        // f: a 0604 file owned by the caller; e: a 0705 directory owned by the caller.
        std::fs::create_dir(d.join("d")).unwrap();
        chown(d.join("d"), Some(1000), Some(1000)).unwrap();
        chmod(&d.join("d"), 0o755);
        std::fs::write(d.join("d/f"), b"f").unwrap();
        chown(d.join("d/f"), Some(1000), Some(1001)).unwrap();
        chmod(&d.join("d/f"), 0o604);
        std::fs::create_dir(d.join("e")).unwrap();
        chown(d.join("e"), Some(1000), Some(1001)).unwrap();
        chmod(&d.join("e"), 0o705);
        std::fs::write(d.join("e/g"), b"g").unwrap();
        chown(d.join("e/g"), Some(1000), Some(1000)).unwrap();
        chmod(&d.join("e/g"), 0o644);
    }
    // The mount's kernel and cache learn the owner (1000) of each.
    assert_eq!(read_as_user(&t.mnt, "d/f", 1), "f");
    assert_eq!(read_as_user(&t.mnt, "e/g", 1), "g");
    assert_eq!(read_as_user(&native, "d/f", 1), "f");
    // The cache's own attributes too (a release drops them; a GETATTR fetches them again):
    // so the daemon's choice rests on the open files it checks, not on the cache's belief.
    for p in ["d/f", "e/g", "e"] {
        gated::forced_stat(&t.m(p)).unwrap();
    }
    for d in [&native, &t.src] {
        chown(d.join("d/f"), Some(1002), None).unwrap();
        chown(d.join("e"), Some(1002), None).unwrap();
    }
    assert_eq!(read_as_user(&native, "d/f", 1), "EACCES", "native oracle");
    assert_eq!(read_as_user(&native, "e/g", 1), "EACCES", "native oracle");
    assert_eq!(
        read_as_user(&t.mnt, "d/f", 1),
        "EACCES",
        "a file chowned in SRC: its group refuses the caller"
    );
    assert_eq!(
        read_as_user(&t.mnt, "e/g", 1),
        "EACCES",
        "a directory chowned in SRC: its group refuses the caller search"
    );
}
