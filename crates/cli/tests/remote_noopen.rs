//! `-o open=noopen` on a remote mount (docs/opens.md, docs/remote.md "open=noopen"), with real
//! parts: `dircache mount localhost:SRC MNT` through a stand-in ssh running `dircache serve
//! --stdio SRC`, real FUSE mounts; native files are the oracle; the client kernel's requests
//! are read from `dircache stats --json`.

#[path = "../../fuse/tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::{can_mount, py, sh};
use dircache_tests::have_tool;
use dircache_tests::remote::{eventually, random_bytes, Fsx, Remote, RemoteMount as Mount};

const BIN: &str = env!("CARGO_BIN_EXE_dircache");

/// The client kernel's FUSE requests of the mount at `mnt` so far, by kind.
fn requests(mnt: &Path) -> serde_json::Value {
    let o = Command::new(BIN)
        .args(["stats", "--json"])
        .arg(mnt)
        .output()
        .expect("dircache stats");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("stats json");
    v["kernel_requests"]["by_kind"].clone()
}

/// The backend's counters of the mount at `mnt` (`dircache stats --json`, `backend`).
fn backend(mnt: &Path) -> serde_json::Value {
    let o = Command::new(BIN)
        .args(["stats", "--json"])
        .arg(mnt)
        .output()
        .expect("dircache stats");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("stats json");
    v["backend"].clone()
}

/// Read `p` whole after dropping the kernel's cached pages of it (POSIX_FADV_DONTNEED), so
/// that the read is a page-cache miss: READs reach the daemon.
fn read_uncached(p: &Path) -> std::io::Result<Vec<u8>> {
    let f = std::fs::File::open(p)?;
    rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed)?;
    let mut v = Vec::new();
    std::io::Read::read_to_end(&mut &f, &mut v)?;
    Ok(v)
}

fn count(by_kind: &serde_json::Value, kind: &str) -> u64 {
    by_kind[kind].as_u64().unwrap_or(0)
}

/// Requests but FORGET and GETXATTR (`dircache stats` itself asks the mount's root for an
/// extended attribute: 2 GETXATTRs per call).
fn total(by_kind: &serde_json::Value) -> u64 {
    by_kind
        .as_object()
        .map(|m| {
            m.iter()
                .filter(|(k, _)| !matches!(k.as_str(), "forget" | "getxattr"))
                .filter_map(|(_, v)| v.as_u64())
                .sum()
        })
        .unwrap_or(0)
}

/// Under `open=noopen` the kernel alone decides access; with `noacl` it reads only the mode
/// bits, and a user an ACL refuses read the file through the daemon (seen before this check:
/// `for A only` printed for uid 1001, on a local and on a remote mount). The combination is
/// refused, for local and remote mounts alike; `open=noopen` alone mounts.
#[test]
fn noopen_without_acls_is_refused() {
    if !can_mount() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let mnt = dir.path().join("mnt");
    let cache = dir.path().join("cache");
    for d in [&src, &mnt, &cache] {
        std::fs::create_dir(d).unwrap();
    }
    common::chmod(&cache, 0o700);
    let ssh = dircache_tests::remote::stand_in_ssh(dir.path());
    let remote_opts = format!(
        "ssh_command={},serve_command={BIN},cache_dir={}",
        ssh.display(),
        cache.display()
    );
    let local = src.display().to_string();
    let remote = format!("localhost:{}", src.display());
    for (what, opts) in [
        (&local, "open=noopen,noacl".to_string()),
        (&remote, format!("{remote_opts},open=noopen,noacl")),
    ] {
        let mut child = Command::new(BIN)
            .arg("mount")
            .arg("-f")
            .arg(what)
            .arg(&mnt)
            .arg("-o")
            .arg(&opts)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // A refused mount exits at once; one that mounts stays in the foreground.
        let start = std::time::Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break Some(s);
            }
            if dircache_fuse::is_mount_point(&mnt) || start.elapsed().as_secs() >= 20 {
                break None;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        if status.is_none() {
            let _ = Command::new("umount").arg(&mnt).status();
            let _ = child.kill();
            let _ = child.wait();
        }
        assert!(
            status.is_some_and(|s| !s.success()),
            "{what} -o {opts} mounted"
        );
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            std::io::Read::read_to_string(&mut e, &mut err).unwrap();
        }
        assert!(err.contains("open=noopen needs -o acl"), "{err}");
    }
}

/// With `open=noopen` a remote mount's open+read+close of a file the kernel has cached sends
/// no request at all, not even FLUSH (before: one FLUSH per close, answered as a no-op:
/// 2,000 FLUSHes for 2,000 opens), and reads the right bytes.
#[test]
fn noopen_open_read_close_sends_nothing() {
    if !can_mount() {
        return;
    }
    let t = Mount::start("open=noopen");
    let data = random_bytes(200_000, 11);
    t.put("f", &data);
    assert_eq!(std::fs::read(t.m("f")).unwrap(), data);
    // The server's write of `f` sends callbacks that may land after the first read: wait
    // until an open+read+close sends nothing, then 50 more must send nothing either.
    eventually("an open+read+close with no request", || {
        let before = total(&requests(&t.mnt));
        std::fs::read(t.m("f")).unwrap() == data && total(&requests(&t.mnt)) == before
    });
    let before = requests(&t.mnt);
    for _ in 0..50 {
        assert_eq!(std::fs::read(t.m("f")).unwrap(), data);
    }
    let after = requests(&t.mnt);
    assert_eq!(
        total(&after),
        total(&before),
        "no request: before {before}, after {after}"
    );
    // The first OPEN and the first close's FLUSH are answered ENOSYS: the kernel sends no
    // more of either, and no RELEASE. (Two FLUSHes were counted once in a loaded full run,
    // cause not found; the 50 reads above sent none either way.)
    assert!(count(&after, "flush") <= 2, "{after}");
    assert!(count(&after, "open") <= 1, "{after}");
    assert_eq!(count(&after, "release"), 0, "{after}");
}

/// A read-only remote mount with `open=noopen` opens without requests: an open+read+close of a
/// cached file sends nothing, and reads the server's bytes, also after the server changed the
/// file; a plain `ro` mount keeps an OPEN and a RELEASE per open (noopen is asked for, never
/// implied: docs/opens.md, "Read-only mounts and `open=noopen`"). Before (when `ro` implied
/// it, with the default off): "not within 20s: ro: an open+read+close sending 0 OPEN and
/// RELEASE and nothing else".
#[test]
fn read_only_mount_opens_without_requests() {
    if !can_mount() {
        return;
    }
    for (opts, per_open) in [("ro,open=noopen", 0), ("ro", 1)] {
        let t = Mount::start(opts);
        let data = random_bytes(300_000, 12);
        t.put("f", &data);
        eventually("the file read through the mount", || {
            std::fs::read(t.m("f")).is_ok_and(|d| d == data)
        });
        // Callbacks of the server's write may land after the first read: wait for an
        // open+read+close that sends nothing but OPEN and RELEASE.
        eventually(
            &format!(
                "{opts}: an open+read+close sending {per_open} OPEN and RELEASE and nothing else"
            ),
            || {
                let before = requests(&t.mnt);
                let ok = std::fs::read(t.m("f")).unwrap() == data;
                let after = requests(&t.mnt);
                ok && total(&after) - total(&before) == 2 * per_open
                    && count(&after, "read") == count(&before, "read")
            },
        );
        let before = requests(&t.mnt);
        for _ in 0..50 {
            assert_eq!(std::fs::read(t.m("f")).unwrap(), data);
        }
        let after = requests(&t.mnt);
        for kind in ["open", "release"] {
            assert_eq!(
                count(&after, kind) - count(&before, kind),
                50 * per_open,
                "{opts}: {kind} per open: before {before}, after {after}"
            );
        }
        assert_eq!(
            total(&after) - total(&before),
            2 * 50 * per_open,
            "{opts}: nothing else: before {before}, after {after}"
        );
        // A change on the server is read through the mount (its callback drops the pages).
        let new = random_bytes(300_000, 13);
        t.put("f", &new);
        eventually(&format!("{opts}: the server's change read"), || {
            std::fs::read(t.m("f")).is_ok_and(|d| d == new)
        });
        let e = std::fs::write(t.m("g"), b"x").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{opts}: {e}");
    }
}

/// A small fsx through a noopen remote mount (random writes, reads, truncations, appends,
/// reopenings and syncs, next to a native file): every read and size agrees; the server's
/// file equals the native one when the last close returns (writes go to the server as they
/// are made); a change made on the server is read through the mount once its callback came.
#[test]
fn noopen_random_operations_match_a_native_file_and_see_server_changes() {
    if !can_mount() {
        return;
    }
    let t = Mount::start("open=noopen");
    let native = t.dir.path().join("native-fsx");
    let script = Fsx {
        seed: 5,
        size: 200_000,
        ops: 1500,
        write_at: 300_000,
        write_len: 50_000,
        read_at: 350_000,
        read_len: 80_000,
        truncate_to: 300_000,
    }
    .script(&native, &t.m("fsx"));
    assert_eq!(py(t.dir.path(), &script, None).trim(), "done");
    let want = std::fs::read(&native).unwrap();
    assert_eq!(
        std::fs::read(t.s("fsx")).unwrap(),
        want,
        "the server's copy"
    );
    assert_eq!(std::fs::read(t.m("fsx")).unwrap(), want, "the mount's");
    // Written through the mount: on the server when close returns.
    std::fs::write(t.m("w"), b"through the mount").unwrap();
    assert_eq!(std::fs::read(t.s("w")).unwrap(), b"through the mount");
    // Changed on the server (same size): read anew once the callback has come.
    std::fs::write(t.s("w"), b"ON THE SERVER NOW").unwrap();
    eventually("the server's change read through the mount", || {
        std::fs::read(t.m("w")).is_ok_and(|d| d == b"ON THE SERVER NOW")
    });
}

/// Access under noopen is the client kernel's: with ACLs on (required), a user the server's
/// ACL refuses is refused by the kernel too, also right after another user read the file
/// (its pages in the kernel's cache, where a read would need no request).
#[test]
fn noopen_denies_what_the_servers_acl_denies() {
    if !can_mount() || !have_tool("setfacl") {
        return;
    }
    let t = Mount::start("open=noopen");
    t.put("secret", b"for A only");
    let out = sh(
        &t.src,
        "chown 0:2000 secret && chmod 640 secret && setfacl -m u:1001:--- secret",
    );
    assert!(out.status.success());
    let as_user = |uid: u32, path: &Path| {
        sh(
            t.dir.path(),
            &format!(
                "setpriv --reuid={uid} --regid=2000 --clear-groups cat {}",
                path.display()
            ),
        )
    };
    assert!(!as_user(1001, &t.s("secret")).status.success());
    // The ACL reaches the client (its callback moves the ctime): wait until A reads and B
    // is refused, then both once more with A's pages in the kernel's cache.
    eventually("A reads and B is refused through the mount", || {
        let a = as_user(1000, &t.m("secret"));
        a.status.success()
            && a.stdout == b"for A only"
            && !as_user(1001, &t.m("secret")).status.success()
    });
    let a = as_user(1000, &t.m("secret"));
    assert_eq!(a.stdout, b"for A only");
    let b = as_user(1001, &t.m("secret"));
    assert!(
        !b.status.success() && String::from_utf8_lossy(&b.stderr).contains("Permission denied"),
        "B read {:?}",
        String::from_utf8_lossy(&b.stdout)
    );
}

/// Containers under noopen (docs/opens.md, "On a remote mount"): a file read once, and one
/// only hoarded, are read again after the connection is cut and their pages dropped from the
/// kernel's cache: the READs are answered from the containers, with the same bytes. Before
/// (no containers under noopen) such a read failed: "Connection timed out (os error 110)".
#[test]
fn noopen_misses_while_cut_off_are_read_from_containers() {
    if !can_mount() {
        return;
    }
    let r = Remote::new();
    let read_once = random_bytes(1_000_000, 21);
    let hoarded = random_bytes(300_000, 22);
    std::fs::write(r.s("f"), &read_once).unwrap();
    std::fs::write(r.s("h"), &hoarded).unwrap();
    let c = r.mount("", "open=noopen,reconnect_timeout=30");
    assert_eq!(read_uncached(&c.m("f")).unwrap(), read_once);
    let o = Command::new(BIN)
        .arg("hoard")
        .arg(&c.mnt)
        .arg(c.m("h"))
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "hoard: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    // A second miss of the file read once is local already (no data call; the kernel's
    // lookups may still bring listings).
    let data_calls = |c: &dircache_tests::remote::Client| c.calls("Verified") + c.calls("Read {");
    let calls = data_calls(&c);
    assert_eq!(read_uncached(&c.m("f")).unwrap(), read_once);
    assert_eq!(
        data_calls(&c),
        calls,
        "a miss with a valid container: no data call:\n{}",
        c.log_text()
    );
    r.cut(&c);
    for (name, want) in [("f", &read_once), ("h", &hoarded)] {
        let reads = count(&requests(&c.mnt), "read");
        let got =
            read_uncached(&c.m(name)).unwrap_or_else(|e| panic!("{name} read while cut off: {e}"));
        assert!(got == *want, "{name}: other bytes while cut off");
        assert!(
            count(&requests(&c.mnt), "read") > reads,
            "{name}: the read reached the daemon (its pages were dropped)"
        );
    }
    let b = backend(&c.mnt);
    assert!(
        b["containers_noopen_read_hits"].as_u64().unwrap_or(0) > 0,
        "{b}"
    );
    assert_eq!(b["offline"], 1, "{b}");
    // A write while cut off fails (it is not kept anywhere): the program sees it.
    let w = std::fs::OpenOptions::new()
        .write(true)
        .open(c.m("f"))
        .and_then(|mut f| std::io::Write::write_all(&mut f, b"while cut off"));
    assert!(w.is_err(), "a write while cut off under noopen succeeded");
    r.restore();
    eventually("the server's f unchanged after the reconnection", || {
        std::fs::read(r.s("f")).is_ok_and(|d| d == read_once)
    });
}

/// A container never answers a miss with bytes older than what the server holds: after a
/// change made on the server (same size) has reached the client, and after a write through
/// the mount, a page-cache miss reads the new bytes; the miss before the change was local.
#[test]
fn noopen_misses_after_changes_read_fresh_bytes() {
    if !can_mount() {
        return;
    }
    let t = Mount::start("open=noopen");
    let v1 = random_bytes(300_000, 31);
    t.put("f", &v1);
    eventually("the first version read through the mount", || {
        read_uncached(&t.m("f")).is_ok_and(|d| d == v1)
    });
    // The callbacks of the server's write may come after that read's fetch: wait until a miss
    // makes no round trip.
    let data_calls = || t.calls("Verified") + t.calls("Read {");
    eventually("a miss answered from the container", || {
        let calls = data_calls();
        read_uncached(&t.m("f")).is_ok_and(|d| d == v1) && data_calls() == calls
    });
    // Changed on the server, same size: read fresh once the callback came, and again after
    // the pages are dropped (not the old container).
    let v2 = random_bytes(300_000, 32);
    std::fs::write(t.s("f"), &v2).unwrap();
    eventually("the server's change read through the mount", || {
        read_uncached(&t.m("f")).is_ok_and(|d| d == v2)
    });
    for _ in 0..5 {
        assert!(
            read_uncached(&t.m("f")).unwrap() == v2,
            "an old version read"
        );
    }
    // Written through the mount (after the container holds v2): a miss reads the write.
    let mut want = v2.clone();
    want[100_000..100_005].copy_from_slice(b"WRITE");
    {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(t.m("f"))
            .unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, b"WRITE", 100_000).unwrap();
    }
    assert!(
        std::fs::read(t.s("f")).unwrap() == want,
        "the server's copy"
    );
    assert!(
        read_uncached(&t.m("f")).unwrap() == want,
        "a miss after a write through the mount read the old container"
    );
    // Truncated through the mount, then grown on the server: the same.
    std::fs::OpenOptions::new()
        .write(true)
        .open(t.m("f"))
        .unwrap()
        .set_len(1000)
        .unwrap();
    assert!(
        read_uncached(&t.m("f")).unwrap() == want[..1000],
        "after truncate"
    );
}
