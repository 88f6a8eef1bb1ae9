//! A client that goes away in the middle of a bulk `Subtree` reply: the server's walker
//! threads stop and the connection's server ends (crates/remote/src/server/subtree.rs). Before
//! the fix, the walkers blocked forever sending listings to a packer that had stopped
//! receiving, and `dircache serve` never exited (a server process, its cache and its watch
//! left behind per such connection). Real server (the core cache over the local backend) over
//! a unix socket pair; the client side speaks the protocol by hand and hangs up after the
//! first frame of the reply.

use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use dircache_core::{Backend, Cred};
use dircache_local::LocalBackend;
use dircache_remote::frame::{read_frame, write_frame};
use dircache_remote::proto::{
    decode, encode, features, ClientMsg, Hello, Request, ServerMsg, WireCred, MAX_CLIENT_FRAME,
    MAX_SERVER_FRAME,
};
use dircache_remote::{serve, ServerConfig};

fn me() -> Cred {
    Cred::new(
        rustix::process::geteuid().as_raw(),
        rustix::process::getegid().as_raw(),
        [],
    )
}

#[test]
fn a_client_gone_mid_subtree_ends_the_server() {
    // Many directories: far more listings than the walkers may read ahead of the packer.
    let dir = tempfile::tempdir().unwrap();
    for a in 0..60 {
        for b in 0..50 {
            let d = dir.path().join(format!("d{a:02}/e{b:02}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("f"), b"x").unwrap();
        }
    }
    for round in 0..3 {
        let local: Arc<dyn Backend> = Arc::new(LocalBackend::new(dir.path()).expect("backend"));
        let backend =
            dircache_remote::CachedBackend::new(local, Default::default(), me()).expect("cache");
        let (mut client, server) = UnixStream::pair().expect("socketpair");
        let r = server.try_clone().expect("clone");
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = serve(backend, r, server, ServerConfig::default());
            let _ = done_tx.send(());
        });
        let hello = encode(&ClientMsg::Hello(Hello::new(features::ALL))).unwrap();
        write_frame(&mut client, &hello, MAX_CLIENT_FRAME).unwrap();
        let call = ClientMsg::Call {
            id: 1,
            cred: WireCred {
                uid: rustix::process::geteuid().as_raw(),
                gid: rustix::process::getegid().as_raw(),
                groups: Vec::new(),
            },
            req: Request::Subtree {
                path: Vec::new(),
                budget: 1 << 20,
            },
        };
        write_frame(&mut client, &encode(&call).unwrap(), MAX_CLIENT_FRAME).unwrap();
        let f = read_frame(&mut client, MAX_SERVER_FRAME).unwrap().unwrap();
        assert!(matches!(decode::<ServerMsg>(&f), Ok(ServerMsg::Hello(_))));
        // The root's listing (a frame of its own), then hang up with the rest still coming.
        let f = read_frame(&mut client, MAX_SERVER_FRAME).unwrap().unwrap();
        assert!(matches!(
            decode::<ServerMsg>(&f),
            Ok(ServerMsg::Reply { id: 1, .. })
        ));
        drop(client);
        assert!(
            done_rx.recv_timeout(Duration::from_secs(30)).is_ok(),
            "round {round}: the server did not end within 30 s of its client hanging up \
             mid-subtree (its walkers are stuck)"
        );
    }
}
