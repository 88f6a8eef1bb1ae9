//! The protocol end to end in one process: a server over a local backend on a temporary
//! directory, a RemoteBackend talking to it over a unix socket pair; malformed input and
//! confinement attacks against the server.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dircache_core::{Backend, Change, Cred, Error, RenameMode, SetAttr};
use dircache_local::LocalBackend;
use dircache_remote::frame::{read_frame, write_frame};
use dircache_remote::proto::{
    decode, encode, features, ClientMsg, Hello, ProtoError, Request, ServerMsg, WireCred,
    MAX_CLIENT_FRAME, MAX_SERVER_FRAME, VERSION,
};
use dircache_remote::{serve, RemoteBackend, ServerConfig};

struct Server {
    thread: Option<std::thread::JoinHandle<Result<(), ProtoError>>>,
}

impl Server {
    fn start(root: &std::path::Path) -> (Server, UnixStream) {
        // As `dircache serve` does: the core cache over the local backend.
        let local: Arc<dyn Backend> = Arc::new(LocalBackend::new(root).expect("backend"));
        let backend = dircache_remote::CachedBackend::new(local, Default::default(), me())
            .expect("cached backend");
        Self::start_with(backend)
    }

    fn start_with(backend: Arc<dyn Backend>) -> (Server, UnixStream) {
        let (a, b) = UnixStream::pair().expect("socketpair");
        let r = b.try_clone().expect("clone");
        let thread = std::thread::spawn(move || serve(backend, r, b, ServerConfig::default()));
        (
            Server {
                thread: Some(thread),
            },
            a,
        )
    }

    /// The server's result once its client is gone (waits at most 30 s).
    fn finish(mut self) -> Result<(), ProtoError> {
        let t = self.thread.take().expect("thread");
        let end = Instant::now() + Duration::from_secs(30);
        while !t.is_finished() {
            assert!(Instant::now() < end, "server did not finish");
            std::thread::sleep(Duration::from_millis(5));
        }
        t.join().expect("server panicked")
    }
}

fn me() -> Cred {
    Cred::new(
        rustix::process::geteuid().as_raw(),
        rustix::process::getegid().as_raw(),
        [],
    )
}

fn client(root: &std::path::Path) -> (Server, RemoteBackend) {
    let (s, sock) = Server::start(root);
    let c = RemoteBackend::connect(Box::new(sock)).expect("connect");
    (s, c)
}

#[test]
fn operations_match_the_local_backend() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("a/b/c")).unwrap();
    std::fs::write(root.join("a/b/c/f"), b"hello").unwrap();
    std::os::unix::fs::symlink("b/c/f", root.join("a/l")).unwrap();
    let local = LocalBackend::new(root).unwrap();
    let (server, r) = client(root);
    assert_eq!(r.features(), features::ALL);

    // walk: every component in one round trip, the first missing one reported.
    let before = r.round_trips();
    let w = r.walk(b"", &[b"a", b"b", b"c", b"f"]);
    assert_eq!(r.round_trips() - before, 1);
    assert_eq!(w, local.walk(b"", &[b"a", b"b", b"c", b"f"]));
    assert_eq!(w.attrs.len(), 4);
    let w = r.walk(b"a", &[b"b", b"nope", b"x"]);
    assert_eq!(w.attrs.len(), 1);
    assert_eq!(w.error, Some(Error::NotFound));
    let w = r.walk(b"a", &[b"b", b"c", b"f", b"x"]);
    assert_eq!(w.error, Some(Error::NotDir));

    // (Access time aside: the lookups' bulk fetch of `a`, its second miss, read `a/b`.)
    let mut ab = r.getattr(b"a/b").unwrap();
    let want = local.getattr(b"a/b").unwrap();
    ab.atime = want.atime;
    assert_eq!(ab, want);
    assert_eq!(
        r.lookup(b"a", b"l").unwrap(),
        local.lookup(b"a", b"l").unwrap()
    );
    assert_eq!(r.readlink(b"a/l").unwrap(), b"b/c/f");
    // (Access times aside: the listing's bulk prefetch read the directories below it.)
    let no_atime = |mut v: Vec<dircache_core::DirEntry>| {
        v.sort_by(|x, y| x.name.cmp(&y.name));
        for e in &mut v {
            if let Some(a) = &mut e.attr {
                a.atime = Default::default();
            }
        }
        v
    };
    let got = no_atime(r.readdir(b"a", true).unwrap());
    let want = no_atime(local.readdir(b"a", true).unwrap());
    assert_eq!(got, want);
    let (a, b) = (r.statfs(b"").unwrap(), local.statfs(b"").unwrap());
    assert_eq!(
        (a.blocks, a.files, a.bsize, a.namelen),
        (b.blocks, b.files, b.bsize, b.namelen)
    );

    // Mutations.
    let c = me();
    r.mkdir(&c, b"d", 0o750).unwrap();
    assert!(std::fs::metadata(root.join("d")).unwrap().is_dir());
    r.mknod(&c, b"d/n", libc::S_IFREG | 0o640, 0).unwrap();
    r.symlink(&c, b"n", b"d/s").unwrap();
    assert_eq!(
        std::fs::read_link(root.join("d/s")).unwrap().as_os_str(),
        "n"
    );
    let a = r.link(&c, b"d/n", b"d/h").unwrap();
    assert_eq!(a.nlink, 2);
    r.rename(&c, b"d/h", b"d/h2", RenameMode::NoReplace)
        .unwrap();
    assert_eq!(
        r.rename(&c, b"d/n", b"d/h2", RenameMode::NoReplace),
        Err(Error::Exists)
    );
    r.rename(&c, b"d/n", b"d/s", RenameMode::Exchange).unwrap();
    let set = SetAttr {
        mode: Some(0o600),
        ..SetAttr::default()
    };
    assert_eq!(r.setattr(&c, b"d/h2", &set).unwrap().perm(), 0o600);
    r.unlink(&c, b"d/h2").unwrap();
    assert_eq!(r.rmdir(&c, b"d"), Err(Error::NotEmpty));
    r.unlink(&c, b"d/n").unwrap();
    r.unlink(&c, b"d/s").unwrap();
    r.rmdir(&c, b"d").unwrap();
    assert!(!root.join("d").exists());

    // xattrs.
    let t = dircache_core::XattrTarget {
        path: b"a/b/c/f",
        expect: None,
        birth: 0,
        open: None,
    };
    match r.setxattr(&c, t, b"user.k", b"v", 0) {
        Ok(()) => {
            assert_eq!(r.getxattr(&c, t, b"user.k").unwrap(), b"v");
            assert!(r
                .listxattr(&c, t)
                .unwrap()
                .windows(7)
                .any(|w| w == b"user.k\0"));
            r.removexattr(&c, t, b"user.k").unwrap();
        }
        Err(e) => assert_eq!(Err(e), local.setxattr(&c, t, b"user.k", b"v", 0)),
    }

    // Files: large chunks, several chunks in one read.
    let f = r
        .open(
            &c,
            b"big",
            libc::O_CREAT | libc::O_RDWR | libc::O_EXCL,
            0o644,
        )
        .unwrap();
    assert!(f.writable());
    let data: Vec<u8> = (0..3_500_000u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(f.write_at(&c, &data, 0, false).unwrap(), data.len());
    let mut back = vec![0u8; data.len() + 100];
    assert_eq!(f.read_at(&mut back, 0).unwrap(), data.len());
    assert!(back[..data.len()] == data[..]);
    assert_eq!(f.write_at(&c, b"!", 0, true).unwrap(), 1);
    assert_eq!(f.attr().unwrap().size, data.len() as u64 + 1);
    f.set_size(&c, 10).unwrap();
    f.sync(false).unwrap();
    assert_eq!(
        f.seek(0, dircache_core::Whence::End).unwrap(),
        10,
        "SEEK_END"
    );
    drop(f);
    assert_eq!(std::fs::metadata(root.join("big")).unwrap().len(), 10);

    drop(r);
    server.finish().expect("clean end");
}

#[test]
fn huge_directories_stream_in_several_frames() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("h")).unwrap();
    for i in 0..10_000 {
        std::fs::write(dir.path().join(format!("h/file-{i:05}")), b"").unwrap();
    }
    let (server, r) = client(dir.path());
    let e = r.readdir(b"h", true).unwrap();
    assert_eq!(e.len(), 10_000);
    assert!(e.iter().all(|e| e.attr.is_some()));
    // The subtree of the root in one call, bounded.
    let (dirs, complete) = r.subtree(b"", 1 << 20).unwrap();
    assert!(complete);
    let n: usize = dirs.iter().map(|d| d.entries.len()).sum();
    assert_eq!(n, 10_001);
    let (_, complete) = r.subtree(b"", 100).unwrap();
    assert!(!complete);
    drop(r);
    server.finish().expect("clean end");
}

#[test]
fn many_calls_in_flight_from_many_threads() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..50 {
        std::fs::write(dir.path().join(format!("f{i}")), vec![b'x'; i]).unwrap();
    }
    let (server, r) = client(dir.path());
    let r = Arc::new(r);
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let r = r.clone();
            std::thread::spawn(move || {
                for k in 0..200 {
                    let i = (t * 7 + k) % 50;
                    let a = r.getattr(format!("f{i}").as_bytes()).unwrap();
                    assert_eq!(a.size, i as u64);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    drop(r);
    server.finish().expect("clean end");
}

#[test]
fn confinement_holds_against_hostile_paths() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(dir.path().join("secret"), b"outside").unwrap();
    std::os::unix::fs::symlink("/etc", root.join("etc")).unwrap();
    std::os::unix::fs::symlink("../secret", root.join("up")).unwrap();
    let (server, r) = client(&root);
    let c = me();
    // Through a symlink: never followed.
    assert!(r.getattr(b"etc/passwd").is_err());
    assert!(r.walk(b"", &[b"etc", b"passwd"]).error.is_some());
    assert!(r.readdir(b"etc", false).is_err());
    assert!(r.open(&c, b"up", libc::O_RDONLY, 0).is_err());
    assert!(r.open(&c, b"etc/passwd", libc::O_RDONLY, 0).is_err());
    // `..` and names with '/'.
    for bad in [
        &b".."[..],
        b"../secret",
        b"a/../../secret",
        b"/etc/passwd",
        b".",
    ] {
        assert!(
            r.getattr(bad).is_err(),
            "{:?}",
            String::from_utf8_lossy(bad)
        );
        assert!(r.open(&c, bad, libc::O_RDONLY, 0).is_err());
    }
    assert!(r.lookup(b"", b"..").is_err());
    assert!(r.lookup(b"", b"up/../../secret").is_err());
    assert!(r.walk(b"", &[b".."]).error.is_some());
    assert!(r.walk(b"", &[b"../secret"]).error.is_some());
    assert!(r.mkdir(&c, b"../escaped", 0o755).is_err());
    assert!(r.symlink(&c, b"x", b"../escaped").is_err());
    assert!(r
        .rename(&c, b"up", b"../moved", RenameMode::Replace)
        .is_err());
    assert!(r.link(&c, b"../secret", b"stolen").is_err());
    assert!(!dir.path().join("escaped").exists());
    assert!(!dir.path().join("moved").exists());
    assert!(!root.join("stolen").exists());
    assert_eq!(
        std::fs::read(dir.path().join("secret")).unwrap(),
        b"outside"
    );
    drop(r);
    server.finish().expect("clean end");
}

/// A name the server's cache knows as a directory (listed, its file opened and read) is
/// replaced natively by a symlink to a directory outside the root, and a file by a symlink to
/// a file outside (docs/security.md P10, round 3 of the attacks): whatever the server's cache
/// still believes, nothing the client asks next (walks, listings, a `Subtree` call, opens,
/// setattr with a mode and a size, extended attributes) reads or changes what lies outside.
/// Tried with and without letting the server's change feed report the swap first.
#[test]
fn names_swapped_for_symlinks_out_of_the_root_never_lead_out() {
    use dircache_core::XattrTarget;
    for settle in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let out = dir.path().join("out");
        std::fs::create_dir_all(root.join("d")).unwrap();
        std::fs::write(root.join("d/f"), b"inside").unwrap();
        std::fs::write(root.join("g"), b"inside g").unwrap();
        std::fs::create_dir(root.join("e")).unwrap();
        std::fs::write(root.join("e/f"), b"inside e").unwrap();
        std::fs::create_dir(&out).unwrap();
        std::fs::write(out.join("f"), b"outside").unwrap();
        std::fs::write(out.join("only-outside"), b"outside").unwrap();
        {
            let c = std::ffi::CString::new(out.join("f").as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: valid NUL-terminated strings and a 1-byte value.
            let r = unsafe {
                libc::lsetxattr(
                    c.as_ptr(),
                    c"user.outside".as_ptr(),
                    b"o".as_ptr().cast(),
                    1,
                    0,
                )
            };
            assert_eq!(r, 0, "user xattrs on the test's file system");
        }
        let (server, r) = client(&root);
        let c = me();
        let t = |p: &'static [u8]| XattrTarget {
            path: p,
            expect: None,
            birth: 0,
            open: None,
        };
        // Warm the server's cache.
        assert!(r.getattr(b"d/f").is_ok());
        assert!(r.readdir(b"d", true).is_ok());
        assert!(r.getattr(b"g").is_ok());
        let _ = r.subtree(b"", 1000).expect("subtree");
        let mut seen = Vec::new();
        assert!(r.getattr(b"e/f").is_ok());
        drop(r.open(&c, b"e/f", libc::O_RDONLY, 0));
        // Moved out of the root natively, and a file made in it there. Until the server's
        // change feed reports the move, the local backend's cached descriptor of `e` still
        // leads there (docs/security.md, "Deep paths and concurrent moves"); after it, never.
        std::fs::rename(root.join("e"), out.join("e-moved")).unwrap();
        std::fs::write(out.join("e-moved/new"), b"outside, made after the move").unwrap();
        if settle {
            std::thread::sleep(Duration::from_millis(1000));
            if let Ok(f) = r.open(&c, b"e/new", libc::O_RDONLY, 0) {
                let mut buf = vec![0u8; 64];
                let n = f.read_at(&mut buf, 0).unwrap_or(0);
                seen.push(format!(
                    "1 s after e was moved out: read \"e/new\": {:?}",
                    String::from_utf8_lossy(&buf[..n])
                ));
            }
        }
        // Swapped natively.
        std::fs::rename(root.join("d"), root.join("d.old")).unwrap();
        std::os::unix::fs::symlink(&out, root.join("d")).unwrap();
        std::fs::rename(root.join("g"), root.join("g.old")).unwrap();
        std::os::unix::fs::symlink(out.join("f"), root.join("g")).unwrap();
        if settle {
            std::thread::sleep(Duration::from_millis(300));
        }
        for p in [&b"d/f"[..], b"g"] {
            if let Ok(f) = r.open(&c, p, libc::O_RDONLY, 0) {
                let mut buf = vec![0u8; 64];
                let n = f.read_at(&mut buf, 0).unwrap_or(0);
                // The file that was at the name (now at `d.old/f`, inside) may still be
                // served until the feed reports the swap; what is outside never.
                if buf[..n].starts_with(b"outside") {
                    seen.push(format!(
                        "read {:?}: {:?}",
                        String::from_utf8_lossy(p),
                        String::from_utf8_lossy(&buf[..n])
                    ));
                }
            }
            let _ = r.setattr(
                &c,
                p,
                &SetAttr {
                    mode: Some(0o600),
                    ..Default::default()
                },
            );
            let _ = r.setattr(
                &c,
                p,
                &SetAttr {
                    size: Some(1),
                    ..Default::default()
                },
            );
            let _ = r.setxattr(
                &c,
                t(if p == b"g" { b"g" } else { b"d/f" }),
                b"user.escaped",
                b"1",
                0,
            );
            if let Ok(v) = r.getxattr(
                &c,
                t(if p == b"g" { b"g" } else { b"d/f" }),
                b"user.outside",
            ) {
                seen.push(format!("xattr {:?}", String::from_utf8_lossy(&v)));
            }
        }
        for e in r.readdir(b"d", true).unwrap_or_default() {
            if e.name == b"only-outside" {
                seen.push("listed d/only-outside".into());
            }
        }
        if let Ok((dirs, _)) = r.subtree(b"", 1000) {
            for d in dirs {
                for e in d.entries {
                    if e.name == b"only-outside" {
                        seen.push(format!(
                            "subtree listed {:?}/only-outside",
                            String::from_utf8_lossy(&d.dir)
                        ));
                    }
                }
            }
        }
        let w = r.walk(b"", &[b"d", b"only-outside"]);
        if w.error.is_none() {
            seen.push("walked d/only-outside".into());
        }
        let m = std::fs::metadata(out.join("f")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        if m.permissions().mode() & 0o7777 == 0o600 {
            seen.push("chmod reached out/f".into());
        }
        if m.len() != 7 {
            seen.push(format!("truncate reached out/f: {} bytes", m.len()));
        }
        if xattr_of(&out.join("f"), "user.escaped") {
            seen.push("setxattr reached out/f".into());
        }
        assert!(seen.is_empty(), "settle {settle}: {seen:?}");
        drop(r);
        server.finish().expect("clean end");
    }
}

fn xattr_of(p: &std::path::Path, name: &str) -> bool {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    // SAFETY: valid NUL-terminated strings, a null buffer of size 0 (a size query).
    unsafe { libc::lgetxattr(c.as_ptr(), n.as_ptr(), std::ptr::null_mut(), 0) >= 0 }
}

fn raw_hello(s: &mut UnixStream, version: u32) -> ServerMsg {
    let mut h = Hello::new(features::ALL);
    h.version = version;
    write_frame(s, &encode(&ClientMsg::Hello(h)).unwrap(), MAX_CLIENT_FRAME).unwrap();
    let f = read_frame(s, MAX_SERVER_FRAME).unwrap().expect("an answer");
    decode(&f).unwrap()
}

#[test]
fn version_mismatch_is_a_clear_error_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    // The server refuses another version, saying why.
    let (server, mut s) = Server::start(dir.path());
    match raw_hello(&mut s, VERSION + 1) {
        ServerMsg::Refused(why) => assert!(why.contains("version"), "{why}"),
        other => panic!("{other:?}"),
    }
    drop(s);
    assert!(matches!(server.finish(), Err(ProtoError::Version { .. })));
    // The client refuses a server of another version.
    let (mut a, b) = UnixStream::pair().unwrap();
    let t = std::thread::spawn(move || {
        let _ = read_frame(&mut a, MAX_CLIENT_FRAME);
        let mut h = Hello::new(features::ALL);
        h.version = VERSION + 7;
        write_frame(
            &mut a,
            &encode(&ServerMsg::Hello(h)).unwrap(),
            MAX_SERVER_FRAME,
        )
        .unwrap();
        a
    });
    let e = RemoteBackend::connect(Box::new(b)).err().expect("refused");
    assert!(e.to_string().contains("version mismatch"), "{e}");
    drop(t.join());
    // Something that is not a dircache server at all (a login banner).
    let (mut a, b) = UnixStream::pair().unwrap();
    a.write_all(b"Welcome to host!\n").unwrap();
    let e = RemoteBackend::connect(Box::new(b)).err().expect("refused");
    assert!(
        matches!(e, ProtoError::Frame(_) | ProtoError::NotDircache),
        "{e}"
    );
}

/// A connection after the handshake, for raw frames.
fn raw_session(root: &std::path::Path) -> (Server, UnixStream) {
    let (server, mut s) = Server::start(root);
    assert!(matches!(raw_hello(&mut s, VERSION), ServerMsg::Hello(_)));
    (server, s)
}

/// The server closes the stream: reading gives end of file (after any pending replies).
fn closed(s: &mut UnixStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(_) => return false,
        }
    }
}

#[test]
fn malformed_frames_close_the_connection_without_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    // Oversized: refused from the header alone (4 GiB declared, nothing sent).
    let (server, mut s) = raw_session(dir.path());
    s.write_all(&u32::MAX.to_be_bytes()).unwrap();
    assert!(closed(&mut s));
    assert!(matches!(
        server.finish(),
        Err(ProtoError::Frame(
            dircache_remote::frame::FrameError::TooLarge { .. }
        ))
    ));
    // Garbage payload.
    let (server, mut s) = raw_session(dir.path());
    write_frame(&mut s, &[0xff; 40], 100).unwrap();
    assert!(closed(&mut s));
    assert!(matches!(server.finish(), Err(ProtoError::Decode(_))));
    // A valid call followed by trailing bytes in its frame.
    let (server, mut s) = raw_session(dir.path());
    let mut p = encode(&ClientMsg::Call {
        id: 1,
        cred: WireCred {
            uid: 0,
            gid: 0,
            groups: vec![],
        },
        req: Request::Getattr { path: vec![] },
    })
    .unwrap();
    p.extend_from_slice(b"junk");
    write_frame(&mut s, &p, MAX_CLIENT_FRAME).unwrap();
    assert!(closed(&mut s));
    assert!(server.finish().is_err());
    // A second hello.
    let (server, mut s) = raw_session(dir.path());
    write_frame(
        &mut s,
        &encode(&ClientMsg::Hello(Hello::new(0))).unwrap(),
        MAX_CLIENT_FRAME,
    )
    .unwrap();
    assert!(closed(&mut s));
    assert!(matches!(server.finish(), Err(ProtoError::Unexpected(_))));
    // Ends mid-frame.
    let (server, mut s) = raw_session(dir.path());
    s.write_all(&[0, 0, 0, 10, 1, 2]).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    assert!(closed(&mut s));
    assert!(matches!(
        server.finish(),
        Err(ProtoError::Frame(
            dircache_remote::frame::FrameError::Truncated
        ))
    ));
}

#[test]
fn calls_in_flight_get_eio_when_the_server_goes_away() {
    let dir = tempfile::tempdir().unwrap();
    let (mut a, b) = UnixStream::pair().unwrap();
    let t = std::thread::spawn(move || {
        let _ = read_frame(&mut a, MAX_CLIENT_FRAME);
        write_frame(
            &mut a,
            &encode(&ServerMsg::Hello(Hello::new(features::ALL))).unwrap(),
            MAX_SERVER_FRAME,
        )
        .unwrap();
        // Take one call, then hang up without answering.
        let _ = read_frame(&mut a, MAX_CLIENT_FRAME);
    });
    let r = RemoteBackend::connect(Box::new(b)).unwrap();
    let feed = r.watch().unwrap().expect("feed");
    assert_eq!(r.getattr(b""), Err(Error::Os(libc::EIO)));
    t.join().unwrap();
    assert_eq!(r.getattr(b""), Err(Error::Os(libc::EIO)));
    assert!(r.is_closed());
    // Every callback promise is broken.
    assert_eq!(
        feed.recv_timeout(Duration::from_secs(30)),
        Ok(Change::Overflow)
    );
    drop(dir);
}

/// Bulk subtree prefetching: a whole traversal in one round trip, and the prefetched
/// listings never answer with what a later change (a callback, or this client's own
/// mutation) made stale.
#[test]
fn prefetched_listings_save_round_trips_and_stay_coherent() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for d in ["a/b/c", "a/d", "e"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    for f in ["a/f", "a/b/g", "a/b/c/h", "e/i"] {
        std::fs::write(root.join(f), b"x").unwrap();
    }
    let (server, r) = client(root);
    let feed = r.watch().unwrap().expect("callbacks");
    // A find: list every directory; after the first listing, stats of anything below are
    // answered from the held listings too.
    let before = r.round_trips();
    let mut queue = vec![Vec::<u8>::new()];
    let mut seen = 0;
    let mut first = true;
    while let Some(d) = queue.pop() {
        for e in r.readdir(&d, true).unwrap() {
            seen += 1;
            if e.kind == dircache_core::FileType::Directory {
                let mut p = d.clone();
                if !p.is_empty() {
                    p.push(b'/');
                }
                p.extend_from_slice(&e.name);
                queue.push(p);
            }
        }
        if first {
            first = false;
            // (The first listing itself went to the caller, as a cache above would keep it.)
            assert_eq!(r.walk(b"a", &[b"b", b"c", b"h"]).attrs.len(), 3);
            let w = r.walk(b"a", &[b"f", b"x"]);
            assert_eq!((w.attrs.len(), w.error), (1, Some(Error::NotDir)));
            assert_eq!(r.getattr(b"a/b/g").unwrap().size, 1);
            assert_eq!(r.lookup(b"a/b", b"nope"), Err(Error::NotFound));
        }
    }
    assert_eq!(seen, 9);
    assert_eq!(
        r.round_trips() - before,
        1,
        "one bulk call for the whole tree"
    );
    assert!(r.prefetch_hits() >= 9);

    // Prefetch again (a second tree walk from `a`'s parent, listings handed over once).
    let refill = |r: &RemoteBackend| {
        let _ = r.readdir(b"", true).unwrap();
    };
    refill(&r);
    // A change on the server: once its callback has arrived, the held listing is gone.
    std::fs::write(root.join("a/b/new"), b"yy").unwrap();
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        match feed.recv_timeout(Duration::from_secs(30)) {
            Ok(Change::Entry { path }) | Ok(Change::Attr { path }) if path.starts_with(b"a/b") => {
                break
            }
            Ok(Change::Overflow) => break,
            Ok(_) => {}
            Err(e) => panic!("no callback: {e}"),
        }
        assert!(Instant::now() < end);
    }
    let names: Vec<Vec<u8>> = r
        .readdir(b"a/b", true)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert!(names.contains(&b"new".to_vec()), "stale prefetched listing");
    assert_eq!(r.getattr(b"a/b/new").unwrap().size, 2);
    // The directory's own attributes (held in its parent's listing) moved too.
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(root.join("a/b")).unwrap();
    let a = r.getattr(b"a/b").unwrap();
    assert_eq!(
        (a.mtime.sec, a.mtime.nsec as i64),
        (m.mtime(), m.mtime_nsec()),
        "stale mtime"
    );
    // This client's own mutation (a root server with fanotify does not echo it back).
    refill(&r);
    let c = me();
    r.mkdir(&c, b"e/made", 0o755).unwrap();
    let names: Vec<Vec<u8>> = r
        .readdir(b"e", true)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert!(names.contains(&b"made".to_vec()), "stale after own mkdir");
    refill(&r);
    let f = r.open(&c, b"a/f", libc::O_WRONLY, 0).unwrap();
    f.write_at(&c, b"longer", 0, false).unwrap();
    drop(f);
    assert_eq!(
        r.lookup(b"a", b"f").unwrap().size,
        6,
        "stale size after own write"
    );
    drop(r);
    server.finish().expect("clean end");
}

/// Bulk replies stay within the frame limit however long the paths: 3,600 directories
/// with ~2 KiB paths (about 8 MiB of paths in all) come in many frames, not one too large to
/// send (which would end the call with EIO).
#[test]
fn bulk_replies_with_long_paths_fit_in_frames() {
    let dir = tempfile::tempdir().unwrap();
    let mut deep = dir.path().to_path_buf();
    for i in 0..8 {
        deep.push(format!("{i}{}", "d".repeat(240)));
    }
    for p in ["p", "q"] {
        std::fs::create_dir_all(deep.join(p)).unwrap();
        for i in 0..1800 {
            let d = deep.join(p).join(format!("{i:04}{}", "s".repeat(200)));
            std::fs::create_dir(&d).unwrap();
            std::fs::write(d.join("f"), b"").unwrap();
        }
    }
    let (server, r) = client(dir.path());
    let (dirs, complete) = r.subtree(b"", 1 << 20).unwrap();
    assert!(complete);
    let n: usize = dirs.iter().map(|d| d.entries.len()).sum();
    assert_eq!(n, 8 + 2 + 3600 + 3600);
    drop(r);
    server.finish().expect("clean end");
}

/// A tree bigger than the first bulk budget: a depth-first traversal (as `find` makes) needs a
/// handful of round trips, not one per directory: a miss below a cut bulk call fetches that
/// root again with a doubled budget.
#[test]
fn a_find_of_a_tree_bigger_than_the_first_budget_takes_few_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    for a in 0..20 {
        for b in 0..10 {
            let d = dir.path().join(format!("t{a}/s{b}"));
            std::fs::create_dir_all(&d).unwrap();
            for f in 0..10 {
                std::fs::write(d.join(format!("f{f}")), b"").unwrap();
            }
        }
    }
    let (server, r) = client(dir.path());
    let _feed = r.watch().unwrap();
    let before = r.round_trips();
    let mut stack = vec![Vec::<u8>::new()];
    let mut seen = 0;
    while let Some(d) = stack.pop() {
        for e in r.readdir(&d, true).unwrap() {
            seen += 1;
            if e.kind == dircache_core::FileType::Directory {
                stack.push(dircache_remote::prefetch::join(&d, &e.name));
            }
        }
    }
    assert_eq!(seen, 20 + 200 + 2000);
    let trips = r.round_trips() - before;
    assert!(trips <= 4, "{trips} round trips for 221 directories");
    drop(r);
    server.finish().expect("clean end");
}

/// `ls -l` asks every entry for its access ACL: files a bulk reply showed to have no extended
/// attributes answer without a round trip, until a change (here an ACL set on the server
/// directly) is reported for them.
#[test]
fn acl_questions_about_bare_files_need_no_round_trip_until_they_change() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("d")).unwrap();
    for f in ["a", "b"] {
        std::fs::write(dir.path().join("d").join(f), b"").unwrap();
    }
    let (server, r) = client(dir.path());
    let feed = r.watch().unwrap().expect("callbacks");
    let _ = r.readdir(b"", true).unwrap();
    let c = me();
    let acl = |p: &'static [u8]| {
        r.getxattr(
            &c,
            dircache_core::XattrTarget {
                path: p,
                expect: None,
                birth: 0,
                open: None,
            },
            b"system.posix_acl_access",
        )
    };
    let before = r.round_trips();
    assert_eq!(acl(b"d/a"), Err(Error::Os(libc::ENODATA)));
    assert_eq!(acl(b"d/b"), Err(Error::Os(libc::ENODATA)));
    assert_eq!(r.round_trips(), before);
    // An ACL set on the server (user 1000 may read): version 2, then (tag, perm, id) entries.
    let mut v = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (1u16, 6u16, u32::MAX),
        (2, 4, 1000),
        (4, 4, u32::MAX),
        (0x10, 4, u32::MAX),
        (0x20, 4, u32::MAX),
    ] {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    let path = std::ffi::CString::new(dir.path().join("d/a").into_os_string().into_encoded_bytes())
        .unwrap();
    // SAFETY: valid NUL-terminated path and name, a buffer of the given length.
    let rc = unsafe {
        libc::setxattr(
            path.as_ptr(),
            c"system.posix_acl_access".as_ptr(),
            v.as_ptr().cast(),
            v.len(),
            0,
        )
    };
    assert_eq!(rc, 0, "setxattr: {}", std::io::Error::last_os_error());
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        match feed.recv_timeout(Duration::from_secs(30)) {
            Ok(Change::Attr { path } | Change::Entry { path }) if path == b"d/a" => break,
            // An `Inode` callback is an ordinary one (another file's inode-only event): it
            // does not stand for d/a's (it ended this wait before, as in bulk.rs).
            Ok(Change::Overflow) => break,
            Ok(_) => {}
            Err(e) => panic!("no callback: {e}"),
        }
        assert!(Instant::now() < end);
    }
    assert_eq!(acl(b"d/a").map(|v| v.len()), Ok(v.len()), "stale: no ACL");
    assert_eq!(acl(b"d/b"), Err(Error::Os(libc::ENODATA)));
    drop(r);
    server.finish().expect("clean end");
}

/// Stats of paths in directories never listed (as `git status` makes, in index order): the
/// second lookup that misses in a directory fetches it in bulk, so the walk costs a few round
/// trips per directory level, not one per entry; and the listings fetched that way stay
/// coherent (a server-side create seen after its callback, this client's own unlink at once).
#[test]
fn lookups_in_unlisted_directories_take_few_round_trips_and_stay_coherent() {
    let dir = tempfile::tempdir().unwrap();
    let mut paths = vec![];
    for a in 0..4 {
        for b in 0..4 {
            let d = dir.path().join(format!("t{a}/s{b}"));
            std::fs::create_dir_all(&d).unwrap();
            for f in 0..30 {
                std::fs::write(d.join(format!("f{f:02}")), b"x").unwrap();
                paths.push(format!("t{a}/s{b}/f{f:02}"));
            }
        }
    }
    let (server, r) = client(dir.path());
    let feed = r.watch().unwrap().expect("callbacks");
    let before = r.round_trips();
    // As the core cache above would: a directory looked up once is known from then on.
    let mut known = std::collections::HashSet::new();
    for p in &paths {
        let comps: Vec<&str> = p.split('/').collect();
        let mut at = String::new();
        for c in comps {
            let next = if at.is_empty() {
                c.to_string()
            } else {
                format!("{at}/{c}")
            };
            if !known.contains(&next) {
                let a = r.lookup(at.as_bytes(), c.as_bytes()).unwrap();
                assert_eq!(a.is_dir(), !c.starts_with('f'), "{next}");
                known.insert(next.clone());
            }
            at = next;
        }
        // A missing sibling too (git looks for .gitignore in every directory).
        assert_eq!(
            r.lookup(at.rsplit_once('/').unwrap().0.as_bytes(), b".gitignore"),
            Err(Error::NotFound)
        );
    }
    let trips = r.round_trips() - before;
    assert!(
        trips <= 20,
        "{trips} round trips for {} paths in 16 directories",
        paths.len()
    );
    // Held again (a fresh bulk fetch), then changed on the server: the callback drops it
    // before the lookup can answer from it.
    let _ = r.lookup(b"t3/s3", b"zz1");
    let _ = r.lookup(b"t3/s3", b"zz2");
    std::fs::write(dir.path().join("t3/s3/new"), b"yy").unwrap();
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        match feed.recv_timeout(Duration::from_secs(30)) {
            Ok(Change::Entry { path }) if path == b"t3/s3/new" => break,
            Ok(Change::Overflow) => break,
            Ok(_) => {}
            Err(e) => panic!("no callback: {e}"),
        }
        assert!(Instant::now() < end);
    }
    // Found at once (the stale listing was dropped); its size may come with the write's own
    // callback, which can follow the create's.
    loop {
        let size = r
            .lookup(b"t3/s3", b"new")
            .expect("new after its callback")
            .size;
        if size == 2 {
            break;
        }
        assert!(Instant::now() < end, "t3/s3/new still has size {size}");
        let _ = feed.recv_timeout(Duration::from_millis(50));
    }
    // This client's own unlink.
    let _ = r.lookup(b"t2/s2", b"zz1");
    let _ = r.lookup(b"t2/s2", b"zz2");
    r.unlink(&me(), b"t2/s2/f00").unwrap();
    assert_eq!(r.lookup(b"t2/s2", b"f00"), Err(Error::NotFound));
    assert_eq!(r.getattr(b"t2/s2/f00"), Err(Error::NotFound));
    drop(r);
    server.finish().expect("clean end");
}

/// A directory listed again (its cached listing dropped after a change, as `git status`'s
/// own index.lock makes happen to the root) is one plain listing, not its whole subtree again:
/// the listings below are still in the cache above.
#[test]
fn listing_a_directory_again_does_not_fetch_its_subtree_again() {
    let dir = tempfile::tempdir().unwrap();
    for a in 0..10 {
        let d = dir.path().join(format!("t{a}"));
        std::fs::create_dir_all(&d).unwrap();
        for f in 0..20 {
            std::fs::write(d.join(format!("f{f}")), b"").unwrap();
        }
    }
    let (server, r) = client(dir.path());
    let _feed = r.watch().unwrap().expect("callbacks");
    assert_eq!(r.readdir(b"", true).unwrap().len(), 10);
    // (The rest streams in after the root's own listing answered.)
    let end = Instant::now() + Duration::from_secs(30);
    while r.bulk_in_flight() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(
        r.prefetched_entries(),
        200,
        "the first listing brings the subtree"
    );
    for a in 0..10 {
        assert_eq!(
            r.readdir(format!("t{a}").as_bytes(), true).unwrap().len(),
            20
        );
    }
    assert_eq!(r.prefetched_entries(), 0, "all handed over");
    // A mutation of this client drops what the buffer held; the cache above drops the
    // root's listing, and lists it again.
    r.mkdir(&me(), b"new", 0o755).unwrap();
    let before = r.round_trips();
    assert_eq!(r.readdir(b"", true).unwrap().len(), 11);
    assert_eq!(r.round_trips() - before, 1);
    assert_eq!(
        r.prefetched_entries(),
        0,
        "the subtree below (already listed) was fetched again"
    );
    drop(r);
    server.finish().expect("clean end");
}

/// A connector for `connect_again`: while `up` is set, a transport to a new server over
/// `root`; otherwise one that fails its handshake after `fail_after` (as ssh does when the
/// host refuses: the child starts, then exits). Every transport's client end is pushed to
/// `socks` (so the test can cut it).
fn flaky_connector(
    root: std::path::PathBuf,
    up: Arc<std::sync::atomic::AtomicBool>,
    fail_after: Duration,
    socks: Arc<std::sync::Mutex<Vec<UnixStream>>>,
    attempts: Arc<std::sync::atomic::AtomicUsize>,
) -> dircache_remote::client::Connector {
    use std::sync::atomic::Ordering;
    Box::new(move || {
        attempts.fetch_add(1, Ordering::SeqCst);
        if up.load(Ordering::SeqCst) {
            let (s, sock) = Server::start(&root);
            // The server thread ends with its client: nothing to join.
            drop(s);
            socks.lock().unwrap().push(sock.try_clone()?);
            return Ok(Box::new(sock) as Box<dyn dircache_remote::Transport>);
        }
        let (a, b) = UnixStream::pair()?;
        std::thread::spawn(move || {
            std::thread::sleep(fail_after);
            drop(b);
        });
        Ok(Box::new(a) as Box<dyn dircache_remote::Transport>)
    })
}

/// Calls queued behind one reconnection: every call waits at most `reconnect_timeout` from
/// when it started, whatever the number of calls waiting (issue 11: before, each waiting
/// call ran a whole attempt loop of its own after the previous one failed: with N calls the
/// last waited N times the timeout). `revive`: the server comes back partway through, and
/// every call is answered by the new connection.
fn queued_calls_behind_a_reconnection(revive: bool) {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"x").unwrap();
    let up = Arc::new(AtomicBool::new(true));
    let socks = Arc::new(std::sync::Mutex::new(Vec::new()));
    let attempts = Arc::new(AtomicUsize::new(0));
    let timeout = Duration::from_millis(1500);
    let cfg = dircache_remote::ClientConfig {
        reconnect_timeout: timeout,
        prefetch: 0,
        ..Default::default()
    };
    let r = Arc::new(
        RemoteBackend::connect_again(
            flaky_connector(
                dir.path().to_path_buf(),
                up.clone(),
                Duration::from_millis(100),
                socks.clone(),
                attempts.clone(),
            ),
            &cfg,
        )
        .expect("connect"),
    );
    assert!(r.getattr(b"f").is_ok());
    // The server goes away, and stays away (or comes back after 600 ms).
    up.store(false, Ordering::SeqCst);
    for s in socks.lock().unwrap().drain(..) {
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
    let end = Instant::now() + Duration::from_secs(10);
    while !r.is_closed() {
        assert!(Instant::now() < end, "the loss was not noticed");
        std::thread::sleep(Duration::from_millis(5));
    }
    let before = attempts.load(Ordering::SeqCst);
    let reviver = revive.then(|| {
        let up = up.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(600));
            up.store(true, Ordering::SeqCst);
        })
    });
    let callers: Vec<_> = (0..6)
        .map(|i| {
            let r = r.clone();
            std::thread::spawn(move || {
                // Staggered a little: later calls join the attempt under way.
                std::thread::sleep(Duration::from_millis(20 * i));
                let t = Instant::now();
                let got = r.getattr(b"f").map(|_| ());
                (got, t.elapsed())
            })
        })
        .collect();
    let slack = Duration::from_millis(700);
    for (i, c) in callers.into_iter().enumerate() {
        let (got, took) = c.join().unwrap();
        assert!(
            took <= timeout + slack,
            "call {i} waited {took:?}, reconnect_timeout {timeout:?} (answer {got:?})"
        );
        if revive {
            assert_eq!(
                got,
                Ok(()),
                "call {i} after the server came back ({took:?})"
            );
        } else {
            assert_eq!(got, Err(Error::Os(libc::EIO)), "call {i} ({took:?})");
        }
    }
    if let Some(t) = reviver {
        t.join().unwrap();
    }
    // One attempt loop served them all: attempts back off from 50 ms, so a loop of 1.5 s
    // makes at most 6 attempts (each failing after 100 ms); a loop per call would make more.
    let made = attempts.load(Ordering::SeqCst) - before;
    assert!(made <= 8, "{made} connection attempts for one reconnection");
    if revive {
        assert!(r.getattr(b"f").is_ok());
    }
}

/// A server that accepts the connection and never answers the handshake (a hung host, a
/// relay whose far end is stuck) must not hold the reconnection forever: the attempt gives up
/// after `handshake_timeout` and the next one, with backoff, reaches the server once it
/// answers again. Before the bound the reconnecting thread stayed in that handshake for good,
/// so every later call failed with EIO although the server was back.
#[test]
fn a_handshake_never_answered_does_not_hold_the_reconnection() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"x").unwrap();
    let up = Arc::new(AtomicBool::new(true));
    let socks = Arc::new(std::sync::Mutex::new(Vec::<UnixStream>::new()));
    // The far ends of the connections nobody answers, kept open (no end of file).
    let silent = Arc::new(std::sync::Mutex::new(Vec::<UnixStream>::new()));
    let attempts = Arc::new(AtomicUsize::new(0));
    let connector: dircache_remote::client::Connector = {
        let (root, up, socks, silent, attempts) = (
            dir.path().to_path_buf(),
            up.clone(),
            socks.clone(),
            silent.clone(),
            attempts.clone(),
        );
        Box::new(move || {
            attempts.fetch_add(1, Ordering::SeqCst);
            if up.load(Ordering::SeqCst) {
                let (s, sock) = Server::start(&root);
                drop(s);
                socks.lock().unwrap().push(sock.try_clone()?);
                return Ok(Box::new(sock) as Box<dyn dircache_remote::Transport>);
            }
            let (a, b) = UnixStream::pair()?;
            silent.lock().unwrap().push(b);
            Ok(Box::new(a) as Box<dyn dircache_remote::Transport>)
        })
    };
    let timeout = Duration::from_millis(1500);
    let cfg = dircache_remote::ClientConfig {
        reconnect_timeout: timeout,
        handshake_timeout: Duration::from_millis(200),
        prefetch: 0,
        ..Default::default()
    };
    let r = RemoteBackend::connect_again(connector, &cfg).expect("connect");
    assert!(r.getattr(b"f").is_ok());
    // The server goes silent: connections are accepted, the handshake never answered.
    up.store(false, Ordering::SeqCst);
    for s in socks.lock().unwrap().drain(..) {
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
    let end = Instant::now() + Duration::from_secs(10);
    while !r.is_closed() {
        assert!(Instant::now() < end, "the loss was not noticed");
        std::thread::sleep(Duration::from_millis(5));
    }
    let t = Instant::now();
    assert_eq!(r.getattr(b"f").map(|_| ()), Err(Error::Os(libc::EIO)));
    let took = t.elapsed();
    assert!(
        took < timeout + Duration::from_millis(700),
        "a call waited {took:?} for a silent server (reconnect_timeout {timeout:?})"
    );
    let silent_attempts = attempts.load(Ordering::SeqCst);
    // The server answers again: the next call is served by a new connection.
    up.store(true, Ordering::SeqCst);
    let t = Instant::now();
    let got = r.getattr(b"f").map(|_| ());
    assert_eq!(
        got,
        Ok(()),
        "a call after the server came back ({:?}, {} attempts in all): the reconnection \
         is still waiting for a silent server's handshake",
        t.elapsed(),
        attempts.load(Ordering::SeqCst)
    );
    assert!(
        silent_attempts >= 3,
        "{silent_attempts} connection attempts in {took:?} of silence: each handshake \
         should give up after 200 ms"
    );
    drop(r);
    // Each silent connection was ended by the client when it gave up (shut down both ways:
    // the thread that waited for its answer sees end of file too).
    for (i, b) in silent.lock().unwrap().iter_mut().enumerate() {
        b.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = Vec::new();
        assert!(
            b.read_to_end(&mut buf).is_ok(),
            "silent connection {i} was left open by the client"
        );
    }
}

#[test]
fn calls_queued_behind_a_failing_reconnection_wait_at_most_the_timeout() {
    queued_calls_behind_a_reconnection(false);
}

#[test]
fn calls_queued_behind_a_reconnection_are_all_served_by_it() {
    queued_calls_behind_a_reconnection(true);
}

/// A server over `root` offering `features` (as `Server::start`).
fn server_offering(root: &std::path::Path, features: u64) -> (Server, UnixStream) {
    let local: Arc<dyn Backend> = Arc::new(LocalBackend::new(root).expect("backend"));
    let backend = dircache_remote::CachedBackend::new(local, Default::default(), me())
        .expect("cached backend");
    let (a, b) = UnixStream::pair().expect("socketpair");
    let r = b.try_clone().expect("clone");
    let cfg = ServerConfig {
        features,
        ..Default::default()
    };
    let thread = std::thread::spawn(move || serve(backend, r, b, cfg));
    (
        Server {
            thread: Some(thread),
        },
        a,
    )
}

/// What `getattr` of a directory must show, as the kernel reads it now.
fn dir_state(p: &std::path::Path) -> (u64, i64, i64, u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(p).unwrap();
    (m.nlink(), m.mtime(), m.mtime_nsec(), m.size(), m.ino())
}

fn shown(a: &dircache_core::Attr) -> (u64, i64, i64, u64, u64) {
    (
        u64::from(a.nlink),
        a.mtime.sec,
        i64::from(a.mtime.nsec),
        a.size,
        a.ino,
    )
}

/// Creates, a mkdir, a rename between directories and an unlink in a directory, each
/// followed by `getattr` of the directories it changed (what the kernel asks after a
/// create): with `PARENTS` the mutation's reply brings their attributes and the `getattr`s
/// cost no round trip; they always equal the directories' attributes on the server. Round
/// trips per operation.
fn own_mutations_then_getattr(server_features: u64) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("d");
    std::fs::create_dir(&d).unwrap();
    let (server, sock) = server_offering(dir.path(), server_features);
    let r = RemoteBackend::connect(Box::new(sock)).expect("connect");
    let feed = r.watch().unwrap().expect("feed");
    let c = me();
    let check = |what: &str| {
        for (p, host) in [(&b"d"[..], d.clone()), (b"d/sub", d.join("sub"))] {
            if !host.exists() {
                continue;
            }
            let a = r.getattr(p).unwrap();
            assert_eq!(
                shown(&a),
                dir_state(&host),
                "{} after {what}",
                String::from_utf8_lossy(p)
            );
        }
    };
    check("nothing");
    let before = r.round_trips();
    let n = 20;
    for i in 0..n {
        r.mknod(&c, format!("d/f{i}").as_bytes(), libc::S_IFREG | 0o644, 0)
            .unwrap();
        check("a create");
    }
    r.mkdir(&c, b"d/sub", 0o755).unwrap();
    check("a mkdir");
    r.rename(&c, b"d/f0", b"d/sub/f0", RenameMode::Replace)
        .unwrap();
    check("a rename between directories");
    r.unlink(&c, b"d/f1").unwrap();
    check("an unlink");
    let ops = n + 3;
    let per_op = (r.round_trips() - before) as f64 / ops as f64;
    // A change made on the server by someone else: its callback drops what the client held.
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(d.join("ext"), b"x").unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let a = r.getattr(b"d").unwrap();
        if shown(&a) == dir_state(&d) {
            break;
        }
        assert!(
            Instant::now() < end,
            "d's attributes after a change on the server: {:?}, the server's {:?}",
            shown(&a),
            dir_state(&d)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(feed);
    drop(r);
    server.finish().expect("clean end");
    per_op
}

#[test]
fn own_creates_bring_their_directorys_attributes() {
    let per_op = own_mutations_then_getattr(features::ALL);
    // One round trip per mutation (its reply answers the getattrs).
    assert!(per_op <= 1.1, "{per_op} round trips per create + getattr");
}

#[test]
fn a_server_without_parents_still_answers_getattr_by_a_call() {
    let per_op = own_mutations_then_getattr(features::ALL & !features::PARENTS);
    assert!(per_op >= 2.0, "{per_op} round trips per create + getattr");
}

/// An old client (no `PARENTS` in its hello) gets plain replies; a new one gets `Parents`.
#[test]
fn parents_come_only_to_a_client_that_asks() {
    let dir = tempfile::tempdir().unwrap();
    for (offer, wrapped) in [
        (features::ALL & !features::PARENTS, false),
        (features::ALL, true),
    ] {
        let (server, mut s) = Server::start(dir.path());
        let h = Hello::new(offer);
        write_frame(
            &mut s,
            &encode(&ClientMsg::Hello(h)).unwrap(),
            MAX_CLIENT_FRAME,
        )
        .unwrap();
        let ServerMsg::Hello(got) =
            decode(&read_frame(&mut s, MAX_SERVER_FRAME).unwrap().unwrap()).unwrap()
        else {
            panic!("no hello");
        };
        assert_eq!(got.features & features::PARENTS != 0, wrapped);
        let call = ClientMsg::Call {
            id: 1,
            cred: WireCred::from(&me()),
            req: Request::Mkdir {
                path: format!("m{wrapped}").into_bytes(),
                mode: 0o755,
                umask: 0,
            },
        };
        write_frame(&mut s, &encode(&call).unwrap(), MAX_CLIENT_FRAME).unwrap();
        let body = loop {
            match decode::<ServerMsg>(&read_frame(&mut s, MAX_SERVER_FRAME).unwrap().unwrap())
                .unwrap()
            {
                ServerMsg::Reply { id: 1, body, .. } => break body,
                ServerMsg::Callback(_) => continue,
                other => panic!("{other:?}"),
            }
        };
        match body {
            Ok(dircache_remote::proto::Reply::Attr(a)) if !wrapped => assert!(a.is_dir()),
            Ok(dircache_remote::proto::Reply::Parents { parents, reply }) if wrapped => {
                assert!(matches!(*reply, dircache_remote::proto::Reply::Attr(_)));
                assert_eq!(parents.len(), 1);
                assert_eq!(parents[0].0 .0, b"");
                let root = dir_state(dir.path());
                assert_eq!(shown(&parents[0].1), root);
            }
            other => panic!("offered {offer:#x}: {other:?}"),
        }
        drop(s);
        let _ = server.finish();
    }
}

/// Creates in one directory from several threads at once, each followed by a `getattr` of
/// the directory: when they are over, the directory's attributes are the server's (a reply
/// read before another create's change is never kept after that create's reply).
#[test]
fn concurrent_creates_leave_their_directorys_latest_attributes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("d");
    std::fs::create_dir(&d).unwrap();
    let (server, sock) = server_offering(dir.path(), features::ALL);
    let r = Arc::new(RemoteBackend::connect(Box::new(sock)).expect("connect"));
    let feed = r.watch().unwrap().expect("feed");
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let r = r.clone();
            std::thread::spawn(move || {
                for i in 0..25 {
                    let p = format!("d/t{t}-{i}");
                    if i % 5 == 4 {
                        r.mkdir(&me(), p.as_bytes(), 0o755).unwrap();
                    } else {
                        r.mknod(&me(), p.as_bytes(), libc::S_IFREG | 0o644, 0)
                            .unwrap();
                    }
                    r.getattr(b"d").unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(shown(&r.getattr(b"d").unwrap()), dir_state(&d));
    drop(feed);
    drop(r);
    server.finish().expect("clean end");
}

/// A server over `root` whose change feed is recursive inotify (a server that is not root):
/// it cannot tell its own changes from others'.
fn inotify_server(root: &std::path::Path) -> (Server, UnixStream) {
    let local: Arc<dyn Backend> = Arc::new(
        LocalBackend::with_options(root, 0, dircache_local::WatchMode::Inotify).expect("backend"),
    );
    let backend = dircache_remote::CachedBackend::new(local, Default::default(), me())
        .expect("cached backend");
    Server::start_with(backend)
}

/// The paths the callbacks `feed` brings within `wait` name (an `Overflow` as "*").
fn called_back(feed: &dircache_core::ChangeFeed, wait: Duration) -> Vec<String> {
    let end = Instant::now() + wait;
    let mut out = Vec::new();
    while let Some(left) = end.checked_duration_since(Instant::now()) {
        match feed.recv_timeout(left) {
            Ok(Change::Attr { path } | Change::Entry { path }) => {
                out.push(String::from_utf8_lossy(&path).into_owned())
            }
            Ok(Change::Inode { .. }) => out.push("inode".into()),
            Ok(Change::Overflow) => out.push("*".into()),
            Err(_) => break,
        }
    }
    out
}

/// Wait (at most 5 s) for a callback naming `path` on `feed`.
fn wait_for_callback(feed: &dircache_core::ChangeFeed, path: &str) -> Result<(), Vec<String>> {
    let end = Instant::now() + Duration::from_secs(5);
    let mut seen = Vec::new();
    while Instant::now() < end {
        for p in called_back(feed, Duration::from_millis(100)) {
            if p == path || p == "*" {
                return Ok(());
            }
            seen.push(p);
        }
    }
    Err(seen)
}

/// Coda: a client's own changes do not break its own callbacks. Two clients of one tree,
/// each through its own server whose feed is inotify (which reports every change, the
/// server's own too): client A's creates, mkdir, chmod, store (writes then the mtime, as a
/// container's store-back), and unlink come back to A as no callback at all, and to B as
/// callbacks; a change made on the server right after one of A's own (to the same path)
/// still comes to A.
#[test]
fn own_changes_are_not_called_back_but_others_changes_are() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("d");
    std::fs::create_dir(&d).unwrap();
    std::fs::write(d.join("w"), b"old").unwrap();
    std::fs::write(d.join("gone"), b"x").unwrap();
    let (sa, sock_a) = inotify_server(dir.path());
    let (sb, sock_b) = inotify_server(dir.path());
    let a = RemoteBackend::connect(Box::new(sock_a)).expect("connect a");
    let b = RemoteBackend::connect(Box::new(sock_b)).expect("connect b");
    let feed_a = a.watch().unwrap().expect("feed a");
    let feed_b = b.watch().unwrap().expect("feed b");
    // The watches are set up before the first change.
    std::thread::sleep(Duration::from_millis(200));
    let c = me();
    a.mknod(&c, b"d/f", libc::S_IFREG | 0o644, 0).unwrap();
    a.mkdir(&c, b"d/s", 0o755).unwrap();
    a.setattr(
        &c,
        b"d/f",
        &SetAttr {
            mode: Some(0o600),
            ..Default::default()
        },
    )
    .unwrap();
    {
        let f = a.open(&c, b"d/w", libc::O_WRONLY, 0).unwrap();
        assert_eq!(f.write_at(&c, b"new data", 0, false).unwrap(), 8);
        f.set_size(&c, 8).unwrap();
        f.setattr(
            &c,
            &SetAttr {
                mtime: Some(dircache_core::TimeSet::At(dircache_core::Timespec {
                    sec: 1_000_000_000,
                    nsec: 5,
                })),
                ..Default::default()
            },
        )
        .unwrap();
    }
    a.unlink(&c, b"d/gone").unwrap();
    let own = called_back(&feed_a, Duration::from_millis(800));
    assert!(
        own.is_empty(),
        "client A was called back for its own changes: {own:?}"
    );
    // The other client hears of each.
    let others = called_back(&feed_b, Duration::from_millis(800));
    for p in ["d/f", "d/s", "d/w", "d/gone"] {
        assert!(
            others.iter().any(|x| x == p || x == "*"),
            "client B was not called back for {p}: {others:?}"
        );
    }
    // Someone else's change right after A's own change of the same path: A hears of it.
    for round in 0..5 {
        let p = format!("d/r{round}");
        a.mknod(&c, p.as_bytes(), libc::S_IFREG | 0o644, 0).unwrap();
        std::fs::write(dir.path().join(&p), b"local").unwrap();
        wait_for_callback(&feed_a, &p)
            .unwrap_or_else(|seen| panic!("no callback for a local write to {p}: {seen:?}"));
        a.setattr(
            &c,
            p.as_bytes(),
            &SetAttr {
                mode: Some(0o640),
                ..Default::default()
            },
        )
        .unwrap();
        std::fs::set_permissions(dir.path().join(&p), std::fs::Permissions::from_mode(0o600))
            .unwrap();
        wait_for_callback(&feed_a, &p)
            .unwrap_or_else(|seen| panic!("no callback for a local chmod of {p}: {seen:?}"));
        a.unlink(&c, p.as_bytes()).unwrap();
        std::fs::write(dir.path().join(&p), b"again").unwrap();
        wait_for_callback(&feed_a, &p)
            .unwrap_or_else(|seen| panic!("no callback for {p} made again: {seen:?}"));
    }
    drop((feed_a, feed_b));
    drop((a, b));
    sa.finish().expect("clean end");
    sb.finish().expect("clean end");
}

/// One raw call on a session after the handshake: its reply's body (callbacks skipped).
fn raw_call(
    s: &mut UnixStream,
    id: u64,
    req: Request,
) -> Result<dircache_remote::proto::Reply, i32> {
    let call = ClientMsg::Call {
        id,
        cred: WireCred::from(&me()),
        req,
    };
    write_frame(s, &encode(&call).unwrap(), MAX_CLIENT_FRAME).unwrap();
    loop {
        match decode::<ServerMsg>(&read_frame(s, MAX_SERVER_FRAME).unwrap().unwrap()).unwrap() {
            ServerMsg::Reply { id: got, body, .. } if got == id => return body,
            ServerMsg::Callback(_) => continue,
            other => panic!("{other:?}"),
        }
    }
}

/// `Store` (feature STORE) applies its data, then the size, then the attributes, in that
/// order, and answers with the attributes after it: a size below the data's end cuts it, one
/// above zero-fills, the mtime is the one sent (not the write's). Too much data is EINVAL.
#[test]
fn store_writes_then_sizes_then_sets_the_mtime() {
    use dircache_core::{TimeSet, Timespec};
    use dircache_remote::proto::Reply;
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let (server, mut s) = raw_session(dir.path());
    let handle = match raw_call(
        &mut s,
        1,
        Request::Open {
            path: b"f".to_vec(),
            flags: libc::O_CREAT | libc::O_WRONLY,
            mode: 0o644,
            umask: 0,
        },
    ) {
        Ok(Reply::Parents { reply, .. }) => match *reply {
            Reply::Opened { handle, .. } => handle,
            other => panic!("{other:?}"),
        },
        Ok(Reply::Opened { handle, .. }) => handle,
        other => panic!("{other:?}"),
    };
    let when = Timespec {
        sec: 1_296_691_200,
        nsec: 123_000_000,
    };
    let data: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
    for (id, size) in [(2u64, 1000u64), (3, 5000)] {
        let r = raw_call(
            &mut s,
            id,
            Request::Store {
                handle,
                offset: 0,
                data: data.clone(),
                size,
                set: SetAttr {
                    mtime: Some(TimeSet::At(when)),
                    ..Default::default()
                },
            },
        );
        let Ok(Reply::Attr(a)) = r else {
            panic!("{r:?}")
        };
        let on_disk = std::fs::read(dir.path().join("f")).unwrap();
        let mut want = data.clone();
        want.resize(size as usize, 0);
        assert_eq!(on_disk, want, "size {size}");
        let m = std::fs::metadata(dir.path().join("f")).unwrap();
        assert_eq!((a.size, a.mtime), (size, when));
        assert_eq!((m.mtime(), m.mtime_nsec()), (when.sec, when.nsec as i64));
    }
    let r = raw_call(
        &mut s,
        4,
        Request::Store {
            handle,
            offset: 0,
            data: vec![0; dircache_remote::proto::MAX_IO + 1],
            size: 1,
            set: SetAttr::default(),
        },
    );
    assert_eq!(r, Err(libc::EINVAL));
    assert_eq!(std::fs::metadata(dir.path().join("f")).unwrap().len(), 5000);
    drop(s);
    let _ = server.finish();
}
