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
    // FORGET comes when the kernel evicts inodes (memory pressure): not the workload's.
    let forgets = m.remove("forget").unwrap_or(0);
    m.insert(
        "total".into(),
        kr["total"].as_u64().unwrap_or(0).saturating_sub(forgets),
    );
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
    // Warm: name, attributes and (without passthrough) pages in the kernel. The file was just
    // written through the mount: the first read-only open after the writer's close may go
    // passthrough and drop the kernel's attributes (docs/opens.md), so the next one asks for
    // them and fills the page cache (a full run once counted that GETATTR and READ in the
    // measured loop). Warm until one open+read costs no more than its OPEN and RELEASE.
    read();
    for _ in 0..10 {
        let b = requests(t);
        read();
        let _ = wait_for(std::time::Duration::from_secs(5), || {
            let d = delta(&b, &requests(t));
            d.get("release") >= d.get("open")
        });
        if delta(&b, &requests(t)).get("total").copied().unwrap_or(0) <= 2 {
            break;
        }
    }
    let a = requests(t);
    for _ in 0..N {
        read();
    }
    // The kernel sends the last RELEASE after close returns (in the background).
    let _ = wait_for(std::time::Duration::from_secs(5), || {
        let d = delta(&a, &requests(t));
        d.get("release") >= d.get("open")
    });
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
        eprintln!("{label}: {N} created files: {d:?}");
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

/// `-o open=noopen`.
fn noopen() -> dircache_fuse::CachePolicy {
    dircache_fuse::CachePolicy {
        no_open: true,
        ..Default::default()
    }
}

/// `open=noopen`: an open+read+close of a cached file costs no request at all (the first
/// OPEN, answered ENOSYS, is in the warm-up).
#[test]
fn open_close_costs_nothing_with_noopen() {
    if !can_mount() {
        return;
    }
    let t = TestMount::with_policy(noopen());
    let d = open_read_close(&t);
    assert!(d.get("total").copied().unwrap_or(0) <= 2, "{d:?}");
}

/// `open=noopen`: a created file costs LOOKUP, MKNOD (the first CREATE is answered ENOSYS),
/// GETATTR of the directory, the first write's GETXATTR and one WRITE per write(2); no
/// OPEN, no RELEASE.
#[test]
fn requests_per_created_file_noopen() {
    if !can_mount() {
        return;
    }
    let t = TestMount::with_policy(noopen());
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
    eprintln!("noopen: {N} created files: {d:?}");
    assert_eq!((d.get("release"), d.get("open")), (None, Some(&1)), "{d:?}");
    assert!(d["total"] <= 7 * N + 10, "{d:?}");
    for i in 0..N {
        assert_eq!(
            std::fs::read(t.s(&format!("d/f{i}"))).unwrap(),
            b"0123456789",
            "SRC/d/f{i}"
        );
    }
}

/// `open=noopen`: data written through the mount is in SRC at once, and data changed in SRC
/// shows through the mount (the feed drops the kernel's pages) — also for a file whose pages
/// the kernel has.
#[test]
fn noopen_data_both_ways() {
    if !can_mount() {
        return;
    }
    let t = TestMount::with_policy(noopen());
    std::fs::write(t.m("a"), b"through the mount").unwrap();
    assert_eq!(std::fs::read(t.s("a")).unwrap(), b"through the mount");
    std::fs::write(t.s("b"), b"native one").unwrap();
    // An outside write is seen once the change feed has reported it (docs/core.md, "Before
    // the report"): a listing made between the native create and its write holds size 0
    // until then (a CI dry run read `[]` here once).
    let seen = wait_for(std::time::Duration::from_secs(10), || {
        std::fs::read(t.m("b")).ok().as_deref() == Some(&b"native one"[..])
    });
    assert!(seen.is_some(), "MNT/b: {:?}", std::fs::read(t.m("b")));
    std::fs::write(t.s("b"), b"native two, longer").unwrap();
    let seen = wait_for(std::time::Duration::from_secs(10), || {
        std::fs::read(t.m("b")).ok().as_deref() == Some(&b"native two, longer"[..])
    });
    assert!(seen.is_some(), "MNT/b: {:?}", std::fs::read(t.m("b")));
    // Read-modify-write through one descriptor, then a native append.
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(t.m("a"))
        .unwrap();
    let mut s = String::new();
    f.read_to_string(&mut s).unwrap();
    f.write_all(b", more").unwrap();
    drop(f);
    assert_eq!(std::fs::read(t.s("a")).unwrap(), b"through the mount, more");
    std::fs::OpenOptions::new()
        .append(true)
        .open(t.s("a"))
        .unwrap()
        .write_all(b", native")
        .unwrap();
    let seen = wait_for(std::time::Duration::from_secs(10), || {
        std::fs::read(t.m("a")).ok().as_deref() == Some(&b"through the mount, more, native"[..])
    });
    assert!(seen.is_some(), "MNT/a: {:?}", std::fs::read(t.m("a")));
}

/// What uid 1000 may do to root's and its own files; run natively and on the mount.
const ACCESS: &str = r#"
import os, errno
def e(f, *a):
    try:
        r = f(*a)
        if isinstance(r, int) and r > 2: os.close(r)
        return 'ok'
    except OSError as x:
        return errno.errorcode.get(x.errno, str(x.errno))
print('read 0600', e(os.open, 'secret', os.O_RDONLY))
print('write 0644', e(os.open, 'public', os.O_WRONLY))
print('trunc 0644', e(os.open, 'public', os.O_RDONLY | os.O_TRUNC))
print('read 0644', e(os.open, 'public', os.O_RDONLY))
print('create in 0755', e(os.open, 'new', os.O_CREAT | os.O_WRONLY, 0o644))
fd = os.open('mine/ro', os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o444)
print('write to 0444 it created', os.write(fd, b'abc'), os.pread(fd, 10, 0))
os.ftruncate(fd, 1); print('ftruncate it', os.fstat(fd).st_size)
os.close(fd)
print('reopen 0444 for writing', e(os.open, 'mine/ro', os.O_WRONLY))
fd = os.open('mine/rw', os.O_CREAT | os.O_RDWR, 0o644); os.write(fd, b'xyz')
os.chmod('mine/rw', 0)
print('read after chmod 0', os.pread(fd, 10, 0))
os.close(fd)
print('open after chmod 0', e(os.open, 'mine/rw', os.O_RDONLY))
"#;

/// `open=noopen`: the kernel's permission check at open is the access decision, as
/// natively: EACCES where native says so, and an open file keeps the access it was opened
/// with (a 0444 file written through the descriptor that created it; a file read after
/// chmod 0).
#[test]
fn noopen_access_matches_native() {
    if !can_mount() {
        return;
    }
    for (label, policy) in [
        ("rpc", dircache_fuse::CachePolicy::default()),
        ("noopen", noopen()),
    ] {
        let t = TestMount::with_policy(policy);
        let native = t.dir.path().join("native");
        std::fs::create_dir(&native).unwrap();
        for d in [&native, &t.src] {
            std::fs::write(d.join("secret"), b"s").unwrap();
            chmod(&d.join("secret"), 0o600);
            std::fs::write(d.join("public"), b"p").unwrap();
            chmod(&d.join("public"), 0o644);
            std::fs::create_dir(d.join("mine")).unwrap();
            std::os::unix::fs::chown(d.join("mine"), Some(1000), Some(1000)).unwrap();
        }
        let want = py(&native, ACCESS, Some(1000));
        assert!(
            want.starts_with("read 0600 EACCES"),
            "native oracle: {want}"
        );
        assert_eq!(py(&t.mnt, ACCESS, Some(1000)), want, "{label}");
    }
}

/// `open=noopen`: a name removed in SRC that the kernel still believes in is opened by the
/// kernel without asking; the I/O on it fails with ESTALE and the name is forgotten, so an
/// open(O_CREAT) soon creates, as natively (with `open=rpc` the first one does).
#[test]
fn noopen_name_removed_outside_is_forgotten_at_the_first_io() {
    if !can_mount() {
        return;
    }
    let t = TestMount::with_policy(noopen());
    std::fs::write(t.s("g"), b"old").unwrap();
    // An outside write is seen once the change feed has reported it (docs/core.md): a
    // loaded machine widens that window (a CI dry run read 0 bytes here once).
    let t0 = std::time::Instant::now();
    while std::fs::read(t.m("g")).unwrap() != b"old" {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(10),
            "old data never seen"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    std::fs::remove_file(t.s("g")).unwrap();
    let mut errors = Vec::new();
    for _ in 0..3000 {
        let r = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(t.m("g"))
            .and_then(|mut f| f.write_all(b"new"));
        match r {
            Ok(()) => break,
            Err(e) => errors.push(e.raw_os_error()),
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    // Writes fail with ESTALE (the first, which forgets the name) or ENOENT (the name
    // already forgotten, by it or by the change feed, but the kernel's entry not yet dropped:
    // the notifier's invalidation is asynchronous); then the open creates.
    assert!(
        errors.len() < 3000
            && errors
                .iter()
                .all(|e| *e == Some(libc::ESTALE) || *e == Some(libc::ENOENT)),
        "{} {:?}",
        errors.len(),
        &errors[..errors.len().min(5)]
    );
    assert_eq!(std::fs::read(t.s("g")).unwrap(), b"new");
    assert_eq!(std::fs::read(t.m("g")).unwrap(), b"new");
}

/// `open=noopen`: the daemon opens the inode the kernel named for each request, checked
/// before it is opened. After another file is renamed over the name in SRC (and before any
/// change feed could say so: none here), a read (past the kernel's page cache) or write
/// through a descriptor opened before fails with ESTALE: it never reads or changes the file
/// now under the name.
#[test]
fn noopen_io_never_reaches_a_file_renamed_over_the_name() {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileExt;
    if !can_mount() {
        return;
    }
    let t = TestMount::with_policy_without_feed(noopen());
    std::fs::write(t.s("f"), b"file f").unwrap();
    std::fs::write(t.s("secret"), b"the secret").unwrap();
    let r = std::fs::File::open(t.m("f")).unwrap();
    let w = std::fs::OpenOptions::new()
        .write(true)
        .open(t.m("f"))
        .unwrap();
    let mut buf = [0u8; 64];
    let n = r.read_at(&mut buf, 0).unwrap();
    assert_eq!(&buf[..n], b"file f");
    std::fs::rename(t.s("secret"), t.s("f")).unwrap();
    // Drop the kernel's pages of f, so that the next read reaches the daemon.
    // SAFETY: fadvise on a descriptor this test owns.
    let rc = unsafe { libc::posix_fadvise(r.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(rc, 0);
    let e = r.read_at(&mut buf, 0).map(|n| buf[..n].to_vec());
    assert_eq!(e.map_err(|e| e.raw_os_error()), Err(Some(libc::ESTALE)));
    let e = w.write_at(b"XXX", 0).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{e}");
    assert_eq!(std::fs::read(t.s("f")).unwrap(), b"the secret");
}

/// The notifier's `inval_inode` notifications so far, sent or refused by the kernel.
fn inval_inodes(t: &TestMount) -> u64 {
    let v = dircache_fuse::stats::query(
        &t.dir.path().join("ctl.sock"),
        &serde_json::json!({"op": "stats"}),
    )
    .expect("stats");
    let n = &v["stats"]["notifier"];
    n["inval_inode"].as_u64().unwrap_or(0) + n["errors"].as_u64().unwrap_or(0)
}

/// Wait until the kernel's RELEASEs (sent in the background after close) caught up with
/// the CREATEs and OPENs since `a`.
fn releases_done(t: &TestMount, a: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    let done = wait_for(std::time::Duration::from_secs(20), || {
        let d = delta(a, &requests(t));
        d.get("release").copied().unwrap_or(0)
            >= d.get("create").copied().unwrap_or(0) + d.get("open").copied().unwrap_or(0)
    });
    let d = delta(a, &requests(t));
    assert!(done.is_some(), "RELEASEs missing after 20 s: {d:?}");
    d
}

/// Creating a file queues no kernel invalidation from the daemon's request handlers: its
/// nodeid is new to the kernel (an
/// `inval_inode` queued while creating raced the reply and was refused, ENOENT), and at
/// close the kernel was already told the file's last attributes — after create+close
/// (mkstemp), and after create, write, fchmod, futimens (tar xf, cp -p: the last SETATTR's
/// reply). Each invalidation cost the notifier thread a wakeup and a write to /dev/fuse.
#[test]
fn creating_files_sends_no_invalidation() {
    use std::os::unix::fs::PermissionsExt;
    if !can_mount() {
        return;
    }
    // No change feed: the count is the request handlers' own, not the feed's echo of the
    // passthrough writes (handled apart: own_writes.rs).
    let t = TestMount::without_feed();
    std::fs::create_dir(t.m("d")).unwrap();
    let a = requests(&t);
    let i0 = inval_inodes(&t);
    for i in 0..N {
        // mkstemp: O_RDWR|O_CREAT|O_EXCL 0600, close, unlink.
        let p = t.m(&format!("d/tmp{i}"));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&p)
            .unwrap();
        drop(f);
        std::fs::remove_file(&p).unwrap();
        // tar xf: create, write, chmod, set the times, close.
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(t.m(&format!("d/x{i}")))
            .unwrap();
        f.write_all(b"data of the archive member\n").unwrap();
        f.set_permissions(std::fs::Permissions::from_mode(0o644))
            .unwrap();
        f.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000))
            .unwrap();
        drop(f);
    }
    let d = releases_done(&t, &a);
    let sent = inval_inodes(&t) - i0;
    eprintln!("{N} mkstemp + {N} tar-like files: {d:?}, {sent} inval_inode");
    assert!(
        sent <= N / 10,
        "{sent} inval_inode notifications for {} created files: {d:?}",
        2 * N
    );
    // What was written is there, with its mode and times.
    for i in 0..N {
        let m = std::fs::metadata(t.m(&format!("d/x{i}"))).unwrap();
        assert_eq!(m.permissions().mode() & 0o7777, 0o644, "x{i}");
        assert_eq!(
            m.modified().unwrap(),
            std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000),
            "x{i}"
        );
        assert_eq!(
            std::fs::read(t.m(&format!("d/x{i}"))).unwrap(),
            b"data of the archive member\n"
        );
    }
}

/// A file created open for writing: its attributes in the kernel expire within a jiffy (writes
/// through a shared mapping of a passthrough file never reach the FUSE inode), so `stat`
/// through the mount asks the daemon while it is open — here shown by a change made in SRC
/// with no change feed to report it. (The invalidation that was meant to do this was queued
/// before the CREATE reply and usually reached the kernel before the nodeid did: refused,
/// leaving the reply's day-long TTL.)
#[test]
fn created_file_open_for_writing_has_no_attribute_lifetime() {
    if !can_mount() {
        return;
    }
    let t = TestMount::without_feed();
    let mut stale = Vec::new();
    let mut open = Vec::new();
    for i in 0..20 {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(t.m(&format!("w{i}")))
            .unwrap();
        assert_eq!(std::fs::metadata(t.m(&format!("w{i}"))).unwrap().len(), 0);
        // Written behind the kernel's back (as a shared mapping would).
        std::fs::OpenOptions::new()
            .append(true)
            .open(t.s(&format!("w{i}")))
            .unwrap()
            .write_all(b"0123456789")
            .unwrap();
        // Within a jiffy the creating open's attributes still count; then stat asks.
        let seen = wait_for(std::time::Duration::from_secs(2), || {
            std::fs::metadata(t.m(&format!("w{i}"))).unwrap().len() == 10
        });
        if seen.is_none() {
            stale.push((i, std::fs::metadata(t.m(&format!("w{i}"))).unwrap().len()));
            break;
        }
        open.push(f);
    }
    assert!(stale.is_empty(), "stat showed stale sizes: {stale:?}");
}

/// Coherence after a creation through the mount: a change made in SRC directly (data,
/// mode) to a file created, written and closed through the mount is seen through it. The
/// invalidations the daemon no longer sends for its own creations must not hide changes
/// made by others.
#[test]
fn created_file_changed_in_src_is_seen() {
    use std::os::unix::fs::PermissionsExt;
    if !can_mount() {
        return;
    }
    let t = TestMount::new();
    for i in 0..10 {
        let name = format!("c{i}");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(t.m(&name))
            .unwrap();
        f.write_all(b"first\n").unwrap();
        f.set_permissions(std::fs::Permissions::from_mode(0o640))
            .unwrap();
        drop(f);
        // Known to the kernel with its attributes and data.
        assert_eq!(std::fs::read(t.m(&name)).unwrap(), b"first\n");
        assert_eq!(
            std::fs::metadata(t.m(&name)).unwrap().permissions().mode() & 0o777,
            0o640
        );
        // Changed by someone else, in SRC.
        std::fs::write(t.s(&name), b"second, longer\n").unwrap();
        std::fs::set_permissions(t.s(&name), std::fs::Permissions::from_mode(0o604)).unwrap();
        let seen = wait_for(std::time::Duration::from_secs(20), || {
            std::fs::metadata(t.m(&name))
                .is_ok_and(|m| m.permissions().mode() & 0o777 == 0o604 && m.len() == 15)
                && std::fs::read(t.m(&name)).is_ok_and(|d| d == b"second, longer\n")
        });
        assert!(
            seen.is_some(),
            "{name}: SRC's change not seen through the mount in 20 s: {:?}",
            std::fs::metadata(t.m(&name))
        );
    }
}

/// Requests of `n` appends of 4 bytes each in open(O_WRONLY|O_APPEND) + write + close
/// cycles to `t.m(name)` (a log line per run, as shells and loggers append), once the
/// RELEASEs came back. Runs during which the kernel evicted the inode (a LOOKUP: another
/// process's drop_caches) are run again, up to 10 times.
fn append_cycles(t: &TestMount, name: &str, n: u64) -> BTreeMap<String, u64> {
    let mut d = BTreeMap::new();
    for _ in 0..10 {
        let a = requests(t);
        for _ in 0..n {
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(t.m(name))
                .unwrap();
            f.write_all(b"abc\n").unwrap();
        }
        d = releases_done(t, &a);
        if !d.contains_key("lookup") {
            break;
        }
    }
    d
}

/// A write-only open cannot be mapped (mmap needs read access), and the kernel marks its
/// own size and times stale after every write through it (`fuse_write_update_attr`), so
/// the daemon does not invalidate the kernel's attributes at such an open or at its
/// release. Before, each cycle of open(O_APPEND) + 4-byte write + close cost GETATTR (the
/// next open's permission check after the invalidation), OPEN, GETXATTR of
/// `security.capability` (the refreshed attributes clear the inode's S_NOSEC, so the next
/// write asks again) and RELEASE: now OPEN and RELEASE.
#[test]
fn append_cycles_cost_open_and_release() {
    if !can_mount() {
        return;
    }
    const CYCLES: u64 = 50;
    let t = TestMount::new();
    std::fs::write(t.m("log"), b"").unwrap();
    // Warm: the kernel holds the inode and has asked once for `security.capability`.
    let _ = append_cycles(&t, "log", 2);
    let d = append_cycles(&t, "log", CYCLES);
    eprintln!("{CYCLES} append cycles: {d:?}");
    assert_eq!(d.get("open"), Some(&CYCLES), "{d:?}");
    assert!(
        d.get("getattr").copied().unwrap_or(0) <= 2,
        "a GETATTR per append cycle: {d:?}"
    );
    assert!(
        d.get("getxattr").copied().unwrap_or(0) <= 2,
        "a GETXATTR per append cycle: {d:?}"
    );
    assert!(d["total"] <= 2 * CYCLES + 4, "{d:?}");
    assert_eq!(
        std::fs::read(t.s("log")).unwrap(),
        b"abc\n".repeat((CYCLES + 2) as usize)
    );
}

/// A file held open write-only by one process (a logger) while others append to it in
/// open + write + close cycles: a write-only passthrough handle cannot be mapped and the
/// kernel marks its own size and times stale after each write through it, so the
/// attributes the kernel is given keep their lifetime. Before, any writer open made every
/// attribute reply expire at once: each cycle's open asked GETATTR again, and the next
/// write GETXATTR `security.capability` (the same chain made `append_cycles_cost_open_and_release`
/// flaky: a cycle's RELEASE still on its way when the next open asked).
#[test]
fn appends_beside_a_write_only_holder_keep_the_attributes() {
    use std::os::unix::fs::MetadataExt;
    if !can_mount() {
        return;
    }
    const CYCLES: u64 = 50;
    let t = TestMount::new();
    std::fs::write(t.m("log"), b"").unwrap();
    let mut holder = std::fs::OpenOptions::new()
        .append(true)
        .open(t.m("log"))
        .unwrap();
    holder.write_all(b"held\n").unwrap();
    // The write marked the kernel's size stale: this stat asks, and its reply's lifetime
    // decides whether the cycles' opens ask again.
    assert_eq!(std::fs::metadata(t.m("log")).unwrap().size(), 5);
    let _ = append_cycles(&t, "log", 2);
    let d = append_cycles(&t, "log", CYCLES);
    eprintln!("{CYCLES} append cycles beside a holder: {d:?}");
    assert_eq!(d.get("open"), Some(&CYCLES), "{d:?}");
    assert!(
        d.get("getattr").copied().unwrap_or(0) <= 2,
        "a GETATTR per append cycle: {d:?}"
    );
    assert!(d["total"] <= 2 * CYCLES + 4, "{d:?}");
    // Nothing stale: the holder's and the cycles' writes are all seen.
    holder.write_all(b"held\n").unwrap();
    let want = 2 * 5 + (CYCLES + 2) * 4;
    assert_eq!(std::fs::metadata(t.m("log")).unwrap().size(), want);
    assert_eq!(std::fs::metadata(t.s("log")).unwrap().size(), want);
}

/// With no invalidation at a write-only open and its release, nothing goes stale: right
/// after each append cycle `stat` through the mount shows SRC's size, mtime and ctime (the
/// kernel marked its own copy stale at the write), and changes made in SRC after the
/// cycles are seen.
#[test]
fn append_cycles_leave_nothing_stale() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if !can_mount() {
        return;
    }
    let t = TestMount::new();
    std::fs::write(t.m("log"), b"").unwrap();
    let same = |what: &str| {
        let m = std::fs::metadata(t.m("log")).unwrap();
        let s = std::fs::metadata(t.s("log")).unwrap();
        assert_eq!(
            (
                m.len(),
                m.mtime(),
                m.mtime_nsec(),
                m.ctime(),
                m.ctime_nsec()
            ),
            (
                s.len(),
                s.mtime(),
                s.mtime_nsec(),
                s.ctime(),
                s.ctime_nsec()
            ),
            "{what}: size, mtime, ctime through the mount vs SRC"
        );
        assert_eq!(m.mode(), s.mode(), "{what}: mode through the mount vs SRC");
    };
    for i in 0..20 {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(t.m("log"))
            .unwrap();
        f.write_all(b"abc\n").unwrap();
        drop(f);
        same(&format!("after append cycle {i}"));
    }
    // Changed in SRC: seen through the mount (the change feed).
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(t.s("log"))
        .unwrap();
    f.write_all(b"from SRC\n").unwrap();
    drop(f);
    std::fs::set_permissions(t.s("log"), std::fs::Permissions::from_mode(0o640)).unwrap();
    let want = std::fs::metadata(t.s("log")).unwrap();
    let seen = wait_for(std::time::Duration::from_secs(20), || {
        std::fs::metadata(t.m("log"))
            .is_ok_and(|m| m.len() == want.len() && m.mode() == want.mode())
    });
    assert!(
        seen.is_some(),
        "SRC's append and chmod not seen through the mount in 20 s: {:?}",
        std::fs::metadata(t.m("log"))
    );
}

/// Set-id bits killed in SRC by a write-only append cycle are not kept by the kernel, which
/// held them and leaves killing them to the daemon (FUSE_HANDLE_KILLPRIV_V2): the release
/// of such a handle still invalidates when the kernel was told set-id bits. No change feed
/// (which would report the mode change after its delay): the release is what tells.
#[test]
fn append_cycle_killing_setid_bits_is_not_kept_by_the_kernel() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if !can_mount() {
        return;
    }
    let t = TestMount::without_feed();
    std::fs::write(t.m("log"), b"").unwrap();
    // Set-id bits: u+s set through the mount (the kernel holds the mode), then a write-only
    // append cycle: the daemon's write kills the bit in SRC (it writes without CAP_FSETID),
    // while the kernel, whose caller has CAP_FSETID, keeps it and sends nothing.
    std::fs::set_permissions(t.m("log"), std::fs::Permissions::from_mode(0o4766)).unwrap();
    assert_eq!(
        std::fs::metadata(t.m("log")).unwrap().mode() & 0o7777,
        0o4766
    );
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(t.m("log"))
        .unwrap();
    f.write_all(b"abc\n").unwrap();
    drop(f);
    assert_eq!(
        std::fs::metadata(t.s("log")).unwrap().mode() & 0o7777,
        0o766,
        "SRC: the write through the mount kills u+s"
    );
    // The mode the kernel holds and decides access and exec with: a permission check
    // (refreshes what was invalidated), then its cached mode (`AT_STATX_DONT_SYNC`; a plain
    // `stat` would refresh it anyway, the write marked the times stale).
    let kernels_mode = || {
        rustix::fs::access(t.m("log"), rustix::fs::Access::READ_OK).unwrap();
        rustix::fs::statx(
            rustix::fs::CWD,
            t.m("log"),
            rustix::fs::AtFlags::STATX_DONT_SYNC,
            rustix::fs::StatxFlags::MODE,
        )
        .unwrap()
        .stx_mode as u32
            & 0o7777
    };
    let fresh = wait_for(std::time::Duration::from_secs(10), || {
        kernels_mode() == 0o766
    });
    assert!(
        fresh.is_some(),
        "the kernel keeps the killed u+s: {:o}",
        kernels_mode()
    );
}
