//! A micro-measurement, not a timed test: ns per operation through LocalBackend (with and
//! without the directory-descriptor cache) against plain std::fs calls on the same tree.
//!
//! cargo test --release -p dircache-local --test measure -- --ignored --nocapture

mod common;

use std::fs;
use std::hint::black_box;
use std::time::Instant;

use dircache_core::Backend;
use dircache_local::{LocalBackend, WatchMode};

fn per_op(n: usize, mut f: impl FnMut(usize)) -> f64 {
    for i in 0..n / 10 {
        f(i); // warm up
    }
    let t = Instant::now();
    for i in 0..n {
        f(i);
    }
    t.elapsed().as_nanos() as f64 / n as f64
}

#[test]
#[ignore]
fn measure_local_backend() {
    let t = common::tmp();
    let r = t.path();
    let deep = "a/b/c";
    fs::create_dir_all(r.join(deep)).unwrap();
    for i in 0..1000 {
        fs::write(r.join(format!("{deep}/f{i:04}")), b"x").unwrap();
    }
    let names: Vec<String> = (0..1000).map(|i| format!("f{i:04}")).collect();
    let paths: Vec<String> = names.iter().map(|n| format!("{deep}/{n}")).collect();
    let abs: Vec<std::path::PathBuf> = paths.iter().map(|p| r.join(p)).collect();
    let cached = LocalBackend::with_options(r, 256, WatchMode::Off).unwrap();
    let uncached = LocalBackend::with_options(r, 0, WatchMode::Off).unwrap();
    const N: usize = 100_000;

    println!("operation (depth 4 path, 1000-entry dir)        ns/op");
    let x = per_op(N, |i| {
        black_box(
            cached
                .lookup(deep.as_bytes(), names[i % 1000].as_bytes())
                .unwrap(),
        );
    });
    println!("lookup   LocalBackend, fd cache             {x:>10.0}");
    let x = per_op(N, |i| {
        black_box(
            uncached
                .lookup(deep.as_bytes(), names[i % 1000].as_bytes())
                .unwrap(),
        );
    });
    println!("lookup   LocalBackend, no fd cache          {x:>10.0}");
    let x = per_op(N, |i| {
        black_box(fs::symlink_metadata(&abs[i % 1000]).unwrap());
    });
    println!("lookup   std::fs::symlink_metadata(abs)     {x:>10.0}");
    let x = per_op(N, |i| {
        black_box(cached.getattr(paths[i % 1000].as_bytes()).unwrap());
    });
    println!("getattr  LocalBackend, fd cache             {x:>10.0}");
    let x = per_op(N, |i| {
        black_box(uncached.getattr(paths[i % 1000].as_bytes()).unwrap());
    });
    println!("getattr  LocalBackend, no fd cache          {x:>10.0}");
    let x = per_op(N, |i| {
        black_box(cached.getattr(b"a").unwrap());
        black_box(i);
    });
    println!("getattr  LocalBackend, 1 component          {x:>10.0}");
    let x = per_op(N, |i| {
        black_box(fs::symlink_metadata(r.join("a")).unwrap());
        black_box(i);
    });
    println!("getattr  std::fs, 1 component               {x:>10.0}");

    let deep8 = r.join("1/2/3/4/5/6/7/8");
    fs::create_dir_all(&deep8).unwrap();
    let comps: Vec<&[u8]> = vec![b"1", b"2", b"3", b"4", b"5", b"6", b"7", b"8"];
    let x = per_op(N / 10, |_| {
        black_box(cached.walk(b"", &comps));
    });
    println!("walk     8 components, fd cache warm        {x:>10.0}");
    let x = per_op(N / 10, |_| {
        cached.forget_cached_fds();
        black_box(cached.walk(b"", &comps));
    });
    println!("walk     8 components, fd cache cold        {x:>10.0}");
    let x = per_op(N / 10, |_| {
        black_box(uncached.walk(b"", &comps));
    });
    println!("walk     8 components, no fd cache          {x:>10.0}");
    let x = per_op(N / 10, |_| {
        black_box(fs::symlink_metadata(&deep8).unwrap());
    });
    println!("walk     std::fs lstat of the 8-deep path   {x:>10.0}");

    const M: usize = 500;
    let x = per_op(M, |_| {
        black_box(cached.readdir(deep.as_bytes(), false).unwrap());
    });
    println!("readdir  LocalBackend (1000 entries)        {x:>10.0}");
    let x = per_op(M, |_| {
        black_box(uncached.readdir(deep.as_bytes(), false).unwrap());
    });
    println!("readdir  LocalBackend, no fd cache          {x:>10.0}");
    let dir = r.join(deep);
    let x = per_op(M, |_| {
        let v: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.file_name(), e.file_type().unwrap())
            })
            .collect();
        black_box(v);
    });
    println!("readdir  std::fs::read_dir + file_type      {x:>10.0}");
    let x = per_op(M / 5, |_| {
        black_box(cached.readdir(deep.as_bytes(), true).unwrap());
    });
    println!("readdir+ LocalBackend plus (statx each)     {x:>10.0}");
    let x = per_op(M / 5, |_| {
        let v: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.file_name(), e.metadata().unwrap())
            })
            .collect();
        black_box(v);
    });
    println!("readdir+ std::fs::read_dir + metadata       {x:>10.0}");
}

/// Latency from a change made outside to its report on the change feed.
///
/// cargo test --release -p dircache-local --test measure -- --ignored --nocapture
#[test]
#[ignore]
fn measure_watch_latency() {
    use dircache_core::Change;
    let modes: &[WatchMode] = if common::is_root() {
        &[WatchMode::Fanotify, WatchMode::Inotify]
    } else {
        &[WatchMode::Inotify]
    };
    for &mode in modes {
        let t = common::tmp();
        let b = LocalBackend::with_options(t.path(), 16, mode).unwrap();
        b.set_report_own_changes(true); // the changes come from this process
        let rx = b.watch().unwrap().unwrap();
        let mut lat = Vec::new();
        for i in 0..300 {
            let name = format!("f{i}");
            let want = Change::Entry {
                path: name.as_bytes().to_vec(),
            };
            let start = Instant::now();
            fs::write(t.path().join(&name), b"").unwrap();
            loop {
                let c = rx.recv_timeout(std::time::Duration::from_secs(1)).unwrap();
                if c == want {
                    break;
                }
            }
            lat.push(start.elapsed().as_micros() as u64);
            while rx.try_recv().is_ok() {}
        }
        lat.sort_unstable();
        println!(
            "watch {mode:?}: create -> Change::Entry latency median {} us, p99 {} us, max {} us",
            lat[lat.len() / 2],
            lat[lat.len() * 99 / 100],
            lat[lat.len() - 1]
        );
    }
}
