//! A search of a real dircache FUSE mount (in this process) returns the same results as a
//! local search of its SRC: delegated to the daemon when it serves the `search` op, searched
//! through the mount otherwise. Needs root and /dev/fuse (without them: fails under CI, skips loudly otherwise).

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use dircache_search::proto::{delegate, search_auto};
use dircache_search::{search, DirectSource, Flags, SearchRequest, SearchResult};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn key(r: &SearchResult) -> String {
    let p = String::from_utf8_lossy(&r.path).into_owned();
    match r.error {
        Some(e) => format!("{p}!{:?}:{}", e.source, e.errno),
        None => match r.stat {
            Some(st) => format!("{p} {:o} {}", st.mode, st.size),
            None => p,
        },
    }
}

fn tree(rng: &mut StdRng, dir: &Path, depth: usize) {
    for i in 0..rng.gen_range(2..8) {
        let name = ["a", "b.c", "c.h", "lib", "x.c", "chmod", "d"][rng.gen_range(0..7)];
        let p = dir.join(format!("{name}{i}"));
        if depth > 0 && rng.gen_bool(0.3) {
            std::fs::create_dir(&p).unwrap_or_else(|e| panic!("{e}"));
            tree(rng, &p, depth - 1);
        } else {
            std::fs::write(&p, b"xy").unwrap_or_else(|e| panic!("{e}"));
            let mode = if rng.gen_bool(0.5) { 0o755 } else { 0o644 };
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))
                .unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

#[test]
fn search_on_a_dircache_mount_equals_search_of_src() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !Path::new("/dev/fuse").exists() {
        // Under CI a test that cannot run fails; elsewhere it says so loudly.
        assert!(
            std::env::var_os("CI").is_none(),
            "needs root and /dev/fuse, and CI is set: a skipped test fails in CI"
        );
        // Straight to the stderr descriptor: the harness captures eprintln! of passing tests.
        let _ = std::io::Write::write_all(
            &mut std::io::stderr(),
            b"\n*** SKIPPED: needs root and /dev/fuse. This test did NOT run. ***\n",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
        .unwrap_or_else(|e| panic!("{e}"));
    let src = dir.path().join("src");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&src).unwrap_or_else(|e| panic!("{e}"));
    std::fs::create_dir(&mnt).unwrap_or_else(|e| panic!("{e}"));
    let mut rng = StdRng::seed_from_u64(42);
    for d in ["one", "two"] {
        std::fs::create_dir(src.join(d)).unwrap_or_else(|e| panic!("{e}"));
        tree(&mut rng, &src.join(d), 4);
    }
    let backend = dircache_local::LocalBackend::new(&src).unwrap_or_else(|e| panic!("{e}"));
    let cache = dircache_core::Cache::new(Arc::new(backend), dircache_core::Config::default())
        .unwrap_or_else(|e| panic!("{e}"));
    let mut cfg = dircache_fuse::MountConfig::new(&src, &mnt);
    cfg.socket_path = Some(dir.path().join("ctl.sock"));
    let mounted = dircache_fuse::mount(cache, &cfg).unwrap_or_else(|e| panic!("mount: {e}"));
    let th = std::thread::spawn(move || {
        let _ = mounted.run();
    });
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            if dircache_fuse::unmount(self.0).is_err() {
                let _ = std::process::Command::new("umount")
                    .arg("-l")
                    .arg(self.0)
                    .status();
            }
        }
    }
    let guard = Unmount(&mnt);
    let mut delegated = 0;
    let patterns = [
        "*.c",
        "/*",
        "/one/*/*.c|*.h",
        "chmod*",
        "*/lib*",
        "/two/d*/x.c*",
    ];
    for pat in patterns {
        for flags in [
            Flags::NONE,
            Flags::METADATA,
            Flags::X_OK,
            Flags::STOPATFIRST | Flags::X_OK,
        ] {
            let on = |base: &Path| {
                format!(
                    "{}:{}",
                    base.join("one").display(),
                    base.join("two").display()
                )
            };
            let want: BTreeSet<String> = search(
                &SearchRequest::new(on(&src), pat, flags),
                Arc::new(DirectSource::new()),
            )
            .unwrap_or_else(|e| panic!("{e}"))
            .map(|r| key(&r))
            .collect();
            let req = SearchRequest::new(on(&mnt), pat, flags);
            if delegate(&req).unwrap_or_else(|e| panic!("{e}")).is_some() {
                delegated += 1;
            }
            let got: BTreeSet<String> = search_auto(&req)
                .unwrap_or_else(|e| panic!("{e}"))
                .map(|r| key(&r))
                .collect();
            if flags.contains(Flags::STOPATFIRST) {
                assert_eq!(got.len(), want.len().min(1), "{pat} {flags:?}");
                continue;
            }
            // st_dev differs between the mount and SRC: compare mode and size only (key()).
            assert_eq!(got, want, "{pat} {flags:?}");
        }
    }
    eprintln!(
        "{delegated} of {} searches were delegated to the daemon",
        patterns.len() * 4
    );
    drop(guard);
    let _ = th.join();
}
