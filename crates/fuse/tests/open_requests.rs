//! FUSE requests per open+close, per write and per created file, counted by the daemon on a
//! real mount (its control socket's `kernel_requests.by_kind`): what `dircache bench apps`
//! measures as time, made deterministic. See docs/opens.md.

mod common;
use common::*;

use std::collections::BTreeMap;
use std::os::unix::fs::OpenOptionsExt;

use std::io::{Read, Write};

/// The requests the daemon has seen so far, by kind, and `total`.
fn requests(t: &TestMount) -> BTreeMap<String, u64> {
    let v = dircache_fuse::stats::query(
        &t.dir.path().join("ctl.sock"),
        &serde_json::json!({"op": "stats"}),
    )
    .expect("stats");
    let kr = &v["stats"]["kernel_requests"];
    let mut m: BTreeMap<String, u64> = kr["by_kind"]
        .as_object()
        .map(|o| {
            o.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_u64()?)))
                .filter(|(_, n)| *n > 0)
                .collect()
        })
        .unwrap_or_default();
    m.insert("total".into(), kr["total"].as_u64().unwrap_or(0));
    m
}

/// What happened between two [`requests`] snapshots (kinds that did not change left out).
fn delta(a: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    b.iter()
        .filter_map(|(k, n)| {
            let d = n - a.get(k).copied().unwrap_or(0);
            (d > 0).then(|| (k.clone(), d))
        })
        .collect()
}

fn no_passthrough() -> dircache_fuse::CachePolicy {
    dircache_fuse::CachePolicy {
        passthrough: false,
        ..Default::default()
    }
}

const N: u64 = 200;

/// Requests for `N` open+read+close of a file whose data and attributes the kernel has (a
/// plain read into a buffer: no fstat, which after a passthrough read asks for the atime).
fn open_read_close(t: &TestMount) -> BTreeMap<String, u64> {
    std::fs::write(t.m("f"), b"0123456789").unwrap();
    let read = || {
        let mut buf = [0u8; 64];
        let n = std::fs::File::open(t.m("f"))
            .unwrap()
            .read(&mut buf)
            .unwrap();
        assert_eq!(&buf[..n], b"0123456789");
    };
    // Warm: name, attributes and (without passthrough) pages in the kernel.
    read();
    let a = requests(t);
    for _ in 0..N {
        read();
    }
    delta(&a, &requests(t))
}

/// The default (`open=rpc`, passthrough): an OPEN and a RELEASE per open+close, nothing else.
#[test]
fn open_close_costs_open_and_release() {
    if !can_mount() {
        return;
    }
    let t = TestMount::new();
    let d = open_read_close(&t);
    assert_eq!(d.get("open"), Some(&N), "{d:?}");
    assert_eq!(d.get("release"), Some(&N), "{d:?}");
    assert!(d["total"] <= 2 * N + 2, "{d:?}");
}

/// Writes through the daemon (no passthrough) no longer make the kernel ask for
/// `security.capability` before each one (FUSE_HANDLE_KILLPRIV_V2): one WRITE per write(2).
#[test]
fn writes_do_not_ask_for_security_capability() {
    if !can_mount() {
        return;
    }
    for (label, policy) in [
        ("passthrough", dircache_fuse::CachePolicy::default()),
        ("nopassthrough", no_passthrough()),
    ] {
        let t = TestMount::with_policy(policy);
        std::fs::write(t.m("log"), b"").unwrap();
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(t.m("log"))
            .unwrap();
        let a = requests(&t);
        for _ in 0..N {
            f.write_all(b"abc\n").unwrap();
        }
        let d = delta(&a, &requests(&t));
        drop(f);
        // At most the first write to the inode asks (then the kernel marks it S_NOSEC).
        assert!(
            d.get("getxattr").copied().unwrap_or(0) <= 1,
            "{label}: {d:?}"
        );
        assert!(
            d["total"] <= N + 2,
            "{label}: more than one request per write: {d:?}"
        );
        assert_eq!(
            std::fs::read(t.s("log")).unwrap(),
            b"abc\n".repeat(N as usize),
            "{label}: the data"
        );
    }
}

/// Creating a file with O_CREAT|O_EXCL, writing it in 3 pieces and closing it: LOOKUP (the
/// kernel asks whether the name exists), CREATE, GETATTR of the directory (the kernel
/// marks its attributes stale after a creation and checks permissions on the next walk),
/// one GETXATTR of `security.capability` (the first write to an inode; before
/// FUSE_HANDLE_KILLPRIV_V2 every write asked), RELEASE, and without passthrough a WRITE per
/// write(2).
#[test]
fn requests_per_created_file() {
    if !can_mount() {
        return;
    }
    for (label, policy, want) in [
        ("passthrough", dircache_fuse::CachePolicy::default(), 5),
        ("nopassthrough", no_passthrough(), 8),
    ] {
        let t = TestMount::with_policy(policy);
        std::fs::create_dir(t.m("d")).unwrap();
        let a = requests(&t);
        for i in 0..N {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o444)
                .open(t.m(&format!("d/f{i}")))
                .unwrap();
            for part in [&b"0123"[..], b"456", b"789"] {
                f.write_all(part).unwrap();
            }
        }
        let d = delta(&a, &requests(&t));
        assert!(
            d["total"] <= want * N + 10,
            "{label}: more than {want} requests per created file: {d:?}"
        );
        for i in 0..N {
            assert_eq!(
                std::fs::read(t.s(&format!("d/f{i}"))).unwrap(),
                b"0123456789",
                "{label}: SRC/d/f{i}"
            );
        }
    }
}
