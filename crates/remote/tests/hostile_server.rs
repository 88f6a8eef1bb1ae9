//! A hostile server against the client (docs/security.md P13): a fake server speaks the
//! protocol over a socket pair and answers with what a real server never sends — names that
//! are not one path component, paths that climb, callbacks for such paths, a listing that
//! never ends. The client must neither pass such names on (to its cache, the kernel, its
//! prefetch buffer) nor grow without bound; it closes the connection, as the server closes
//! one on a malformed frame.

use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use dircache_core::{Backend, DirEntry, FileType};
use dircache_remote::frame::{read_frame, write_frame};
use dircache_remote::proto::{
    decode, encode, features, Callback, ClientMsg, Hello, Reply, Request, ServerMsg, SubtreeDir,
    MAX_CLIENT_FRAME, MAX_SERVER_FRAME,
};
use dircache_remote::{ClientConfig, RemoteBackend};

fn entry(name: &[u8]) -> DirEntry {
    DirEntry {
        name: name.to_vec(),
        kind: FileType::Regular,
        ino: 7,
        attr: None,
    }
}

fn send(s: &mut UnixStream, msg: &ServerMsg) -> bool {
    match encode(msg) {
        Ok(p) => write_frame(s, &p, MAX_SERVER_FRAME).is_ok(),
        Err(_) => false,
    }
}

/// A fake server on `s`: the handshake, then `answer` for every call (false: stop).
fn fake(
    mut s: UnixStream,
    mut answer: impl FnMut(&mut UnixStream, u64, Request) -> bool + Send + 'static,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let _ = s.set_write_timeout(Some(Duration::from_secs(5)));
        let Ok(Some(f)) = read_frame(&mut s, MAX_CLIENT_FRAME) else {
            return;
        };
        let Ok(ClientMsg::Hello(_)) = decode::<ClientMsg>(&f) else {
            return;
        };
        if !send(&mut s, &ServerMsg::Hello(Hello::new(features::ALL))) {
            return;
        }
        while let Ok(Some(f)) = read_frame(&mut s, MAX_CLIENT_FRAME) {
            if let Ok(ClientMsg::Call { id, req, .. }) = decode::<ClientMsg>(&f) {
                if !answer(&mut s, id, req) {
                    return;
                }
            }
        }
    })
}

/// A client connected to a fake server answering with `answer`.
fn client(
    max_call_entries: u64,
    answer: impl FnMut(&mut UnixStream, u64, Request) -> bool + Send + 'static,
) -> (RemoteBackend, std::thread::JoinHandle<()>) {
    let (a, b) = UnixStream::pair().expect("socketpair");
    let server = fake(b, answer);
    let cfg = ClientConfig {
        prefetch: 0,
        reconnect_timeout: Duration::ZERO,
        max_call_entries,
        ..Default::default()
    };
    let r = RemoteBackend::connect_with(Box::new(a), &cfg).expect("connect");
    (r, server)
}

fn wait_closed(r: &RemoteBackend) -> bool {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(5) {
        if r.is_closed() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// Listings whose names are not single components, `Subtree` listings of climbing paths and
/// callbacks for them: none reaches the caller, the connection is closed. Before: the
/// client handed `a/b`, `..`, `.`, the empty name and a name with a NUL on as entries of
/// the directory.
#[test]
fn names_that_are_not_one_component_close_the_connection() {
    let mut seen = Vec::new();
    for bad in [&b"a/b"[..], b"..", b".", b"", b"x\0y", b"../../etc"] {
        let bad_name = bad.to_vec();
        let (r, server) = client(1 << 20, move |s, id, req| {
            let body = match req {
                Request::Readdir { .. } => Ok(Reply::Entries(vec![entry(b"ok"), entry(&bad_name)])),
                _ => Err(libc::ENOSYS),
            };
            send(
                s,
                &ServerMsg::Reply {
                    id,
                    last: true,
                    body,
                },
            )
        });
        match r.readdir(b"", false) {
            Ok(l) => seen.push(format!(
                "{:?}: listed {:?}",
                String::from_utf8_lossy(bad),
                l.iter()
                    .map(|e| String::from_utf8_lossy(&e.name).into_owned())
                    .collect::<Vec<_>>()
            )),
            Err(_) => {
                if !wait_closed(&r) {
                    seen.push(format!(
                        "{:?}: connection kept",
                        String::from_utf8_lossy(bad)
                    ));
                }
            }
        }
        drop(r);
        let _ = server.join();
    }
    // A Subtree listing of a path that climbs.
    for dir in [&b".."[..], b"a/../../b", b"/etc", b"a//b"] {
        let d = dir.to_vec();
        let (r, server) = client(1 << 20, move |s, id, req| {
            let body = match req {
                Request::Subtree { .. } => Ok(Reply::Subtree {
                    dirs: vec![
                        SubtreeDir {
                            dir: Vec::new(),
                            entries: vec![entry(b"ok")],
                            bare: Vec::new(),
                        },
                        SubtreeDir {
                            dir: d.clone(),
                            entries: vec![entry(b"passwd")],
                            bare: Vec::new(),
                        },
                    ],
                    complete: true,
                }),
                _ => Err(libc::ENOSYS),
            };
            send(
                s,
                &ServerMsg::Reply {
                    id,
                    last: true,
                    body,
                },
            )
        });
        if let Ok((dirs, _)) = r.subtree(b"", 100) {
            seen.push(format!(
                "subtree gave {:?}",
                dirs.iter()
                    .map(|d| String::from_utf8_lossy(&d.dir).into_owned())
                    .collect::<Vec<_>>()
            ));
        }
        drop(r);
        let _ = server.join();
    }
    // A callback for a path that climbs, sent before the reply to the first call.
    for path in [&b"../x"[..], b"a/../../x", b"/x"] {
        let p = path.to_vec();
        let (r, server) = client(1 << 20, move |s, id, _req| {
            send(s, &ServerMsg::Callback(Callback::Entry(p.clone())))
                && send(
                    s,
                    &ServerMsg::Reply {
                        id,
                        last: true,
                        body: Err(libc::ENOENT),
                    },
                )
        });
        let _ = r.getattr(b"f");
        if !wait_closed(&r) {
            seen.push(format!(
                "callback for {:?}: connection kept",
                String::from_utf8_lossy(path)
            ));
        }
        drop(r);
        let _ = server.join();
    }
    assert!(seen.is_empty(), "{seen:#?}");
}

/// A listing that never ends (frames of 4096 entries, never the last): the client stops
/// at `max_call_entries` and closes the connection. Before: it kept every entry of every
/// frame for as long as the server sent them (here 400,000 entries with a cap of 50,000,
/// then a last frame: `readdir` answered with all of them).
#[test]
fn an_endless_listing_is_cut_off() {
    const FRAME: usize = 4096;
    const SENT_AT_MOST: usize = 400_000;
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = sent.clone();
    let (r, server) = client(50_000, move |s, id, req| {
        if !matches!(req, Request::Readdir { .. }) {
            return send(
                s,
                &ServerMsg::Reply {
                    id,
                    last: true,
                    body: Err(libc::ENOSYS),
                },
            );
        }
        let mut n = 0;
        while n < SENT_AT_MOST {
            let e: Vec<DirEntry> = (n..n + FRAME)
                .map(|i| entry(format!("f{i}").as_bytes()))
                .collect();
            n += FRAME;
            let last = n >= SENT_AT_MOST;
            if !send(
                s,
                &ServerMsg::Reply {
                    id,
                    last,
                    body: Ok(Reply::Entries(e)),
                },
            ) {
                break;
            }
            count.store(n, std::sync::atomic::Ordering::SeqCst);
        }
        false
    });
    let got = r.readdir(b"", false);
    assert!(
        got.is_err(),
        "readdir answered with {} entries (the server sent {}, the cap is 50000)",
        got.as_ref().map_or(0, Vec::len),
        sent.load(std::sync::atomic::Ordering::SeqCst)
    );
    assert!(wait_closed(&r), "the connection was kept");
    drop(r);
    let _ = server.join();
}
