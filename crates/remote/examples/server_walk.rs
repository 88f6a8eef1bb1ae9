//! Server-side time per `Walk` call: the local backend alone (what `dircache serve --no-cache`
//! does per call) next to the server's cache (`CachedBackend`, what `dircache serve` does),
//! interleaved rounds, medians. Also the same walks end to end through the protocol (a client
//! and a server over a socket pair in this process), counting the server's backend calls.
//!
//! usage: cargo run --release -p dircache-remote --example server_walk [ROUNDS] [WALKS]

use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Instant;

use dircache_core::{Backend, Cred};
use dircache_local::LocalBackend;
use dircache_remote::{serve, CachedBackend, RemoteBackend, ServerConfig};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(7);
    let walks: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let dir = tempfile::tempdir().expect("tempdir");
    // 64 paths of 8 components: a/b/c/d/e/f/gN/fileM.
    let mut paths: Vec<Vec<Vec<u8>>> = Vec::new();
    for g in 0..8 {
        let d = dir.path().join(format!("a/b/c/d/e/f/g{g}"));
        std::fs::create_dir_all(&d).expect("mkdir");
        for m in 0..8 {
            std::fs::write(d.join(format!("file{m}")), b"x").expect("write");
            let p = format!("a/b/c/d/e/f/g{g}/file{m}");
            paths.push(p.split('/').map(|c| c.as_bytes().to_vec()).collect());
        }
    }
    let own = Cred::new(
        rustix::process::geteuid().as_raw(),
        rustix::process::getegid().as_raw(),
        [],
    );
    let local: Arc<dyn Backend> = Arc::new(LocalBackend::new(dir.path()).expect("local"));
    let cached = CachedBackend::new(local.clone(), Default::default(), own).expect("cached");
    let time = |b: &dyn Backend| {
        let t = Instant::now();
        for i in 0..walks {
            let names: Vec<&[u8]> = paths[i % paths.len()].iter().map(|n| &n[..]).collect();
            let w = b.walk(b"", &names);
            assert_eq!(w.attrs.len(), 8);
        }
        t.elapsed().as_secs_f64() / walks as f64 * 1e6
    };
    time(&*cached); // warm the cache
    let (mut l, mut c) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        l.push(time(&*local));
        c.push(time(&*cached));
    }
    let (ml, mc) = (median(l), median(c));
    println!(
        "server-side walk of 8 components ({walks} walks x {rounds} rounds, medians): \
         local backend {ml:.2} us/call, server cache {mc:.2} us/call, ratio {:.1}x",
        ml / mc
    );

    // End to end: a client and a server over a socket pair.
    let e2e = |b: Arc<dyn Backend>| {
        let (a, s) = UnixStream::pair().expect("socketpair");
        let r = s.try_clone().expect("clone");
        std::thread::spawn(move || serve(b, r, s, ServerConfig::default()));
        let client = RemoteBackend::connect(Box::new(a)).expect("connect");
        let t = Instant::now();
        let n = walks / 4;
        for i in 0..n {
            let names: Vec<&[u8]> = paths[i % paths.len()].iter().map(|n| &n[..]).collect();
            assert_eq!(client.walk(b"", &names).attrs.len(), 8);
        }
        let us = t.elapsed().as_secs_f64() / n as f64 * 1e6;
        (us, client.round_trips())
    };
    let before = cached.stats();
    let (mut l, mut c) = (Vec::new(), Vec::new());
    let mut trips = 0;
    for _ in 0..rounds {
        l.push(e2e(local.clone()).0);
        let (us, t) = e2e(cached.clone());
        c.push(us);
        trips = t;
    }
    let after = cached.stats();
    let calls = |s: &dircache_core::StatsSnapshot| {
        s.backend_lookup + s.backend_walk + s.backend_getattr + s.backend_readdir
    };
    println!(
        "end to end over a socket pair ({} walks x {rounds} rounds, medians): \
         local backend {:.2} us/call, server cache {:.2} us/call; \
         {trips} round trips per run; server cache backend calls during them: {}",
        walks / 4,
        median(l),
        median(c),
        calls(&after) - calls(&before)
    );
}
