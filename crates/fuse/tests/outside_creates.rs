//! open(O_CREAT) and mknod(2) through the mount on a name that SRC changed behind the cache's
//! and the kernel's back, before any change feed said so (none here: the window between an
//! outside change and the feed's report, made endless). Natively an open(O_CREAT) without
//! O_EXCL opens the file at the name if there is one and creates it if there is none: it never
//! fails with EEXIST, nor with ENOENT for a missing last name; O_EXCL and mknod(2) say EEXIST
//! exactly when the name exists. The native results are the oracle (a twin directory).
//!
//! A CI dry run once saw EEXIST from the first open(O_CREAT) after a file was removed in SRC
//! (`open_requests::noopen_name_removed_outside_is_forgotten_at_the_first_io`): the kernel's
//! entry had been dropped by the feed's report of the file's creation, the LOOKUP found the
//! core's dentry still positive but the file gone (ENOENT, the core kept its dentry), and the
//! kernel's MKNOD (CREATE with `open=rpc`) then met the core's stale positive: EEXIST (with
//! `open=rpc`: ENOENT from opening it). Here an entry timeout of 0 makes the kernel look the
//! name up at each open, as after that report.

mod common;
use common::*;

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::time::Duration;

fn policies() -> [(&'static str, dircache_fuse::CachePolicy); 2] {
    [
        ("rpc", dircache_fuse::CachePolicy::default()),
        (
            "noopen",
            dircache_fuse::CachePolicy {
                no_open: true,
                ..Default::default()
            },
        ),
    ]
}

/// RELEASEs the daemon has served so far.
fn releases(t: &TestMount) -> u64 {
    let v = dircache_fuse::stats::query(
        &t.dir.path().join("ctl.sock"),
        &serde_json::json!({"op": "stats"}),
    )
    .expect("stats");
    v["stats"]["kernel_requests"]["by_kind"]["release"]
        .as_u64()
        .unwrap_or(0)
}

/// A file read through the mount, then removed in SRC: an open(O_CREAT) through the mount
/// creates it again (with and without O_EXCL), as natively.
#[test]
fn create_over_a_name_removed_outside() {
    if !can_mount() {
        return;
    }
    let mut got = Vec::new();
    for (label, policy) in policies() {
        let t = TestMount::with_policy_without_feed(dircache_fuse::CachePolicy {
            entry_ttl: Duration::ZERO,
            ..policy
        });
        for name in ["g", "x"] {
            std::fs::write(t.s(name), b"old").unwrap();
            let before = releases(&t);
            // The core now holds the name; the read drops its copy of the attributes
            // (`open=noopen`: after the READ; `open=rpc`: at the RELEASE after close).
            assert_eq!(std::fs::read(t.m(name)).unwrap(), b"old", "{label}");
            if label == "rpc" {
                let done = wait_for(Duration::from_secs(20), || releases(&t) > before);
                assert!(done.is_some(), "{label}: no RELEASE after 20 s");
            }
            std::fs::remove_file(t.s(name)).unwrap();
        }
        let created = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(t.m("g"))
            .and_then(|mut f| f.write_all(b"new"));
        let created = created.map(|()| String::from_utf8(std::fs::read(t.s("g")).unwrap()));
        got.push(format!(
            "{label} O_CREAT {:?}",
            created.map_err(|e| e.raw_os_error())
        ));
        let created = std::fs::OpenOptions::new()
            .create_new(true)
            .write(true)
            .mode(0o600)
            .open(t.m("x"))
            .and_then(|mut f| f.write_all(b"excl"));
        let created = created.map(|()| String::from_utf8(std::fs::read(t.s("x")).unwrap()));
        got.push(format!(
            "{label} O_EXCL {:?}",
            created.map_err(|e| e.raw_os_error())
        ));
    }
    let want = [
        "rpc O_CREAT Ok(Ok(\"new\"))",
        "rpc O_EXCL Ok(Ok(\"excl\"))",
        "noopen O_CREAT Ok(Ok(\"new\"))",
        "noopen O_EXCL Ok(Ok(\"excl\"))",
    ];
    assert_eq!(got, want);
}

const LOOK: &str = r#"
import os, errno
for n in ['theirs', 'mine', 'excl', 'node']:
    try:
        os.stat('d/' + n); print(n, 'exists')
    except OSError as x:
        print(n, errno.errorcode[x.errno])
"#;

const OPEN: &str = r#"
import os, errno
def e(f, *a):
    try:
        r = f(*a)
        if isinstance(r, int) and r > 2:
            os.write(r, b'new'); os.close(r)
        return 'ok'
    except OSError as x:
        return errno.errorcode.get(x.errno, str(x.errno))
print('O_CREAT on root 0644', e(os.open, 'd/theirs', os.O_CREAT | os.O_WRONLY, 0o644))
print('O_CREAT on own', e(os.open, 'd/mine', os.O_CREAT | os.O_WRONLY, 0o644))
def read(p):
    try:
        with open(p, 'rb') as f:
            return f.read()
    except OSError as x:
        return errno.errorcode.get(x.errno, str(x.errno))
print('own now', read('d/mine'))
print('O_CREAT|O_EXCL', e(os.open, 'd/excl', os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
print('mknod', e(os.mknod, 'd/node', 0o100644))
print('mkfifo', e(os.mkfifo, 'd/node', 0o644))
"#;

/// Names looked up (missing) through the mount by uid 1000, then created in SRC: opened as
/// natively by that user's open(O_CREAT) — EACCES on root's 0644 file, its own file opened and
/// written in place — while O_EXCL, mknod(2) and mkfifo(3) say EEXIST.
#[test]
fn create_over_a_name_created_outside() {
    if !can_mount() {
        return;
    }
    let mut got = Vec::new();
    let mut want = Vec::new();
    for (label, policy) in policies() {
        let t = TestMount::with_policy_without_feed(policy);
        let native = t.dir.path().join("native");
        std::fs::create_dir(&native).unwrap();
        for d in [&native, &t.src] {
            std::fs::create_dir(d.join("d")).unwrap();
            std::os::unix::fs::chown(d.join("d"), Some(1000), Some(1000)).unwrap();
        }
        let looked = py(&native, LOOK, Some(1000));
        assert_eq!(py(&t.mnt, LOOK, Some(1000)), looked, "{label}: lookups");
        for d in [&native, &t.src] {
            for n in ["theirs", "mine", "excl", "node"] {
                std::fs::write(d.join("d").join(n), b"old!").unwrap();
                chmod(&d.join("d").join(n), 0o644);
            }
            for n in ["mine", "excl", "node"] {
                std::os::unix::fs::chown(d.join("d").join(n), Some(1000), Some(1000)).unwrap();
            }
        }
        let native = py(&native, OPEN, Some(1000));
        assert!(
            native.contains("O_CREAT on own ok") && native.contains("own now b'new!'"),
            "native oracle: {native}"
        );
        want.push(format!("{label}:\n{native}"));
        got.push(format!("{label}:\n{}", py(&t.mnt, OPEN, Some(1000))));
        assert_eq!(std::fs::read(t.s("d/theirs")).unwrap(), b"old!", "{label}");
    }
    assert_eq!(got.join(""), want.join(""));
}
