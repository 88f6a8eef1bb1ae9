//! Differential tests: the search engine against a reference walker + matcher written here,
//! and against GNU find where the semantics coincide.

mod common;

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use common::*;
use dircache_core::Cred;
use dircache_search::{search, search_with, DirectSource, Flags, SearchOptions, SearchRequest};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn tmp() -> tempfile::TempDir {
    let t = tempfile::Builder::new()
        .prefix("dcsearch")
        .tempdir()
        .unwrap_or_else(|e| panic!("tempdir: {e}"));
    let _ = std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755));
    t
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

const ROOT: Viewer = Viewer { uid: 0, gid: 0 };
const USER: Viewer = Viewer {
    uid: 1000,
    gid: 1000,
};

fn flag_sets() -> Vec<Flags> {
    vec![
        Flags::INCLUDEROOT,
        Flags::NONE,
        Flags::METADATA | Flags::INCLUDEROOT,
        Flags::X_OK,
        Flags::R_OK | Flags::W_OK,
        Flags::METADATA | Flags::X_OK,
    ]
}

#[test]
fn random_trees_match_reference_as_root_and_as_user() {
    let mut rng = StdRng::seed_from_u64(0x5ea4c4);
    let (mut n_match, mut n_err) = (0usize, 0usize);
    for round in 0..12 {
        let t = tmp();
        let mut roots = Vec::new();
        for i in 0..rng.gen_range(1..3) {
            let r = t.path().join(format!("r{i}"));
            std::fs::create_dir(&r).unwrap_or_else(|e| panic!("{e}"));
            let mut budget = 400;
            random_tree(&mut rng, &r, 5, &mut budget);
            let _ = std::fs::set_permissions(&r, std::fs::Permissions::from_mode(0o755));
            roots.push(r);
        }
        for _ in 0..12 {
            let pat = random_pattern(&mut rng);
            for flags in flag_sets() {
                let want = reference(&roots, &pat, flags, ROOT);
                let got = keys(&run(&roots, &pat, flags, Arc::new(DirectSource::new())));
                assert_eq!(
                    got, want,
                    "round {round} pattern {pat:?} flags {flags:?} as root"
                );
                if is_root() {
                    let want = reference(&roots, &pat, flags, USER);
                    let src = Arc::new(DirectSource::as_cred(Cred::new(USER.uid, USER.gid, [])));
                    let got = keys(&run(&roots, &pat, flags, src));
                    n_err += got.iter().filter(|k| k.contains('!')).count();
                    n_match += got.iter().filter(|k| !k.contains('!')).count();
                    assert_eq!(
                        got, want,
                        "round {round} pattern {pat:?} flags {flags:?} as uid 1000"
                    );
                }
            }
        }
    }
    eprintln!("as uid 1000: {n_match} matches, {n_err} errors compared");
    assert!(
        !is_root() || (n_match > 200 && n_err > 20),
        "trees too trivial: {n_match} matches, {n_err} errors"
    );
}

#[test]
fn metadata_is_lstat_of_the_entry() {
    let t = tmp();
    let mut rng = StdRng::seed_from_u64(7);
    let mut budget = 300;
    random_tree(&mut rng, t.path(), 4, &mut budget);
    std::fs::write(t.path().join("plain"), b"abc").unwrap_or_else(|e| panic!("{e}"));
    let _ = std::os::unix::fs::symlink("plain", t.path().join("link"));
    let rs = run(
        &[t.path().to_path_buf()],
        "*",
        Flags::METADATA | Flags::INCLUDEROOT,
        Arc::new(DirectSource::new()),
    );
    assert!(!rs.is_empty());
    for r in rs {
        let Some(st) = r.stat else {
            panic!("no stat for {r:?}")
        };
        let md = std::fs::symlink_metadata(from_bytes(&r.path)).unwrap_or_else(|e| panic!("{e}"));
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            (st.ino, st.mode, st.size),
            (md.ino(), md.mode(), md.size()),
            "{r:?}"
        );
    }
}

fn find(args: &[&str]) -> BTreeSet<String> {
    let out = Command::new("find")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("find: {e}"));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn agrees_with_gnu_find() {
    let mut rng = StdRng::seed_from_u64(99);
    let t = tmp();
    let root = t.path().join("tree");
    std::fs::create_dir(&root).unwrap_or_else(|e| panic!("{e}"));
    let mut budget = 2000;
    random_tree(&mut rng, &root, 6, &mut budget);
    deep_chain(&root, 120);
    let rs = root.to_string_lossy().to_string();
    for name in ["*.c", "a*", "*b*", "lib", "*", "Makefile", "deep.c"] {
        let want = find(&[&rs, "-mindepth", "1", "-name", name]);
        let got = keys(&run(
            std::slice::from_ref(&root),
            name,
            Flags::INCLUDEROOT,
            Arc::new(DirectSource::new()),
        ));
        assert_eq!(got, want, "-name {name}");
    }
    // `*/*.c` is find's -path '*/*/*.c' below the root (a trailing part of at least 2 components).
    let want = find(&[&rs, "-mindepth", "2", "-path", &format!("{rs}/*/*.c")]);
    let got = keys(&run(
        std::slice::from_ref(&root),
        "*/*.c",
        Flags::INCLUDEROOT,
        Arc::new(DirectSource::new()),
    ));
    assert_eq!(got, want, "*/*.c");
    // Non-recursive `/*/*.c` is -mindepth 2 -maxdepth 2.
    let want = find(&[&rs, "-mindepth", "2", "-maxdepth", "2", "-name", "*.c"]);
    let got = keys(&run(
        std::slice::from_ref(&root),
        "/*/*.c",
        Flags::INCLUDEROOT,
        Arc::new(DirectSource::new()),
    ));
    assert_eq!(got, want, "/*/*.c");
    // Executables: find -perm /111 -type f  vs  X_OK on non-directories (as root).
    let want = find(&[
        &rs,
        "-mindepth",
        "1",
        "-name",
        "*.c",
        "-type",
        "f",
        "-perm",
        "/111",
    ]);
    let got: BTreeSet<String> = run(
        std::slice::from_ref(&root),
        "*.c",
        Flags::INCLUDEROOT | Flags::X_OK,
        Arc::new(DirectSource::new()),
    )
    .iter()
    .filter(|r| {
        std::fs::metadata(from_bytes(&r.path))
            .map(|m| m.is_file())
            .unwrap_or(false)
    })
    .map(key)
    .collect();
    let want: BTreeSet<String> = want
        .into_iter()
        .filter(|p| {
            std::fs::symlink_metadata(p)
                .map(|m| m.is_file())
                .unwrap_or(false)
        })
        .collect();
    let got: BTreeSet<String> = got
        .into_iter()
        .filter(|p| {
            std::fs::symlink_metadata(p)
                .map(|m| m.is_file())
                .unwrap_or(false)
        })
        .collect();
    assert_eq!(got, want, "X_OK");
}

#[test]
fn depth_over_100_and_beyond_path_max() {
    let t = tmp();
    // 1500 levels of a 3-byte name: ~6000 bytes, more than PATH_MAX.
    let mut p = t.path().to_path_buf();
    let mut rel = PathBuf::new();
    for _ in 0..1500 {
        rel.push("ddd");
    }
    // create_dir_all would hit ENAMETOOLONG: build it step by step with chdir-free openat.
    let mut fd = rustix::fs::open(
        t.path(),
        rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::PATH,
        rustix::fs::Mode::empty(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    for _ in 0..1500 {
        let _ = rustix::fs::mkdirat(&fd, "ddd", rustix::fs::Mode::from_bits_truncate(0o755));
        fd = rustix::fs::openat(
            &fd,
            "ddd",
            rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::PATH,
            rustix::fs::Mode::empty(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    }
    let f = rustix::fs::openat(
        &fd,
        "bottom.c",
        rustix::fs::OFlags::CREATE | rustix::fs::OFlags::WRONLY,
        rustix::fs::Mode::from_bits_truncate(0o644),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    drop(f);
    p.push("unused");
    let rs = run(
        &[t.path().to_path_buf()],
        "*.c",
        Flags::NONE,
        Arc::new(DirectSource::new()),
    );
    assert_eq!(rs.len(), 1, "{:?}", rs.iter().map(key).collect::<Vec<_>>());
    let want = format!("{}/bottom.c", rel.to_string_lossy());
    assert_eq!(String::from_utf8_lossy(&rs[0].path), want);
    assert!(rs[0].error.is_none());
    // METADATA works that deep too.
    let rs = run(
        &[t.path().to_path_buf()],
        "bottom.c",
        Flags::METADATA,
        Arc::new(DirectSource::new()),
    );
    assert!(rs.len() == 1 && rs[0].stat.is_some());
    // Everything: 1500 dirs + 1 file.
    let rs = run(
        &[t.path().to_path_buf()],
        "*",
        Flags::NONE,
        Arc::new(DirectSource::new()),
    );
    assert_eq!(rs.len(), 1501);
}

#[test]
fn stop_at_first_takes_the_first_root_with_a_match() {
    let t = tmp();
    let dirs: Vec<PathBuf> = (0..4).map(|i| t.path().join(format!("bin{i}"))).collect();
    for d in &dirs {
        std::fs::create_dir(d).unwrap_or_else(|e| panic!("{e}"));
    }
    // bin0: chmod not executable; bin1: none; bin2: executable; bin3: executable.
    std::fs::write(dirs[0].join("chmod"), b"").unwrap_or_else(|e| panic!("{e}"));
    std::fs::set_permissions(
        dirs[0].join("chmod"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    for d in &dirs[2..] {
        std::fs::write(d.join("chmod"), b"").unwrap_or_else(|e| panic!("{e}"));
        std::fs::set_permissions(d.join("chmod"), std::fs::Permissions::from_mode(0o755))
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let missing = t.path().join("nonexistent");
    let mut roots = vec![missing];
    roots.extend(dirs.iter().cloned());
    let rs = run(
        &roots,
        "/chmod",
        Flags::STOPATFIRST | Flags::X_OK | Flags::INCLUDEROOT,
        Arc::new(DirectSource::new()),
    );
    let matches: Vec<_> = rs.iter().filter(|r| r.error.is_none()).collect();
    assert_eq!(matches.len(), 1);
    assert_eq!(from_bytes(&matches[0].path), dirs[2].join("chmod"));
    assert_eq!(matches[0].root, 3);
    // The missing PATH entry is reported inside the results, not as a failure of the call.
    assert!(rs
        .iter()
        .any(|r| r.root == 0 && r.error.is_some_and(|e| e.errno == libc::ENOENT)));
    // Recursive STOPATFIRST: one match from the first root that has any.
    let rs = run(
        &dirs,
        "chmod",
        Flags::STOPATFIRST,
        Arc::new(DirectSource::new()),
    );
    assert_eq!(rs.iter().filter(|r| r.error.is_none()).count(), 1);
    assert_eq!(rs[0].root, 0);
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let t = tmp();
    let f = t.path().join("file");
    std::fs::write(&f, b"").unwrap_or_else(|e| panic!("{e}"));
    let src = Arc::new(DirectSource::new());
    let d = t.path().to_string_lossy().to_string();
    for (paths, pat) in [
        ("", "*"),
        ("a::b", "*"),
        (d.as_str(), ""),
        (d.as_str(), "a||b"),
        (d.as_str(), "a//b"),
        (d.as_str(), "x/"),
    ] {
        assert!(
            search(&SearchRequest::new(paths, pat, Flags::NONE), src.clone()).is_err(),
            "{paths:?} {pat:?}"
        );
    }
    let e = search(
        &SearchRequest::new(f.to_string_lossy(), "*", Flags::NONE),
        src.clone(),
    )
    .err();
    assert!(
        matches!(e, Some(dircache_search::SearchError::NotADirectory(_))),
        "{e:?}"
    );
}

#[test]
fn cancel_and_drop_stop_early() {
    let t = tmp();
    let mut rng = StdRng::seed_from_u64(3);
    for i in 0..20 {
        let d = t.path().join(format!("t{i}"));
        std::fs::create_dir(&d).unwrap_or_else(|e| panic!("{e}"));
        let mut budget = 500;
        random_tree(&mut rng, &d, 6, &mut budget);
    }
    let req = SearchRequest::new(t.path().to_string_lossy(), "*", Flags::NONE);
    let opts = SearchOptions {
        channel_batches: 1,
        ..Default::default()
    };
    let mut s =
        search_with(&req, Arc::new(DirectSource::new()), &opts).unwrap_or_else(|e| panic!("{e}"));
    let c = s.canceller();
    let first = s.next();
    assert!(first.is_some());
    c.cancel();
    let rest = s.count();
    let all = run(
        &[t.path().to_path_buf()],
        "*",
        Flags::NONE,
        Arc::new(DirectSource::new()),
    )
    .len();
    assert!(
        rest + 1 < all,
        "cancel did not stop the search ({rest} of {all})"
    );
    // Dropping a stream mid-way returns promptly (workers blocked on the full channel exit).
    let mut s =
        search_with(&req, Arc::new(DirectSource::new()), &opts).unwrap_or_else(|e| panic!("{e}"));
    let _ = s.next();
    drop(s);
}

#[test]
fn many_roots_and_wide_dirs_stay_within_descriptor_bounds() {
    // 30,000 directories in one directory: the engine never holds more than ~2 descriptors
    // per worker, so this works well under the 20,000-descriptor limit.
    let t = tmp();
    let w = t.path().join("wide");
    std::fs::create_dir(&w).unwrap_or_else(|e| panic!("{e}"));
    for i in 0..30_000 {
        std::fs::create_dir(w.join(format!("{i}"))).unwrap_or_else(|e| panic!("{e}"));
    }
    std::fs::write(w.join("29999").join("needle.c"), b"").unwrap_or_else(|e| panic!("{e}"));
    let t0 = std::time::Instant::now();
    let rs = run(
        &[t.path().to_path_buf()],
        "*.c",
        Flags::NONE,
        Arc::new(DirectSource::new()),
    );
    eprintln!("search took {:?}", t0.elapsed());
    assert_eq!(
        rs.iter().map(key).collect::<Vec<_>>(),
        vec!["wide/29999/needle.c".to_string()]
    );
}

/// A tmpfs mounted inside the tree: results are the same with and without child searches
/// with decomposed patterns at the mount point (paper §4).
#[test]
fn pattern_decomposition_at_a_mount_point() {
    if !is_root() {
        cannot_run("needs root to mount tmpfs");
        return;
    }
    let t = tmp();
    let var = t.path().join("var");
    let mnt = var.join("tmp");
    std::fs::create_dir_all(&mnt).unwrap_or_else(|e| panic!("{e}"));
    let st = Command::new("mount")
        .args(["-t", "tmpfs", "tmpfs"])
        .arg(&mnt)
        .status();
    if !st.is_ok_and(|s| s.success()) {
        cannot_run("cannot mount tmpfs");
        return;
    }
    struct Umount(PathBuf);
    impl Drop for Umount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _g = Umount(mnt.clone());
    let mut rng = StdRng::seed_from_u64(11);
    for d in [&var, &mnt] {
        let mut budget = 300;
        random_tree(&mut rng, d, 4, &mut budget);
        std::fs::write(d.join("foo"), b"").unwrap_or_else(|e| panic!("{e}"));
        let _ = std::fs::create_dir(d.join("tmp"));
        let _ = std::fs::write(d.join("tmp").join("foo"), b"");
    }
    let roots = vec![var.clone()];
    let split = SearchOptions {
        split_at_mounts: true,
        ..Default::default()
    };
    let mut pats: Vec<String> = vec![
        "tmp/foo".into(),
        "/tmp/foo".into(),
        "/tmp/*/*.c|*.h".into(),
        "*".into(),
        "/x".into(),
    ];
    for _ in 0..40 {
        pats.push(random_pattern(&mut rng));
    }
    for pat in &pats {
        for flags in [Flags::INCLUDEROOT, Flags::METADATA] {
            let want = reference(&roots, pat, flags, ROOT);
            let req = SearchRequest::new(var.to_string_lossy(), pat.as_str(), flags);
            let plain: BTreeSet<String> = search(&req, Arc::new(DirectSource::new()))
                .unwrap_or_else(|e| panic!("{e}"))
                .map(|r| key(&r))
                .collect();
            let dec: BTreeSet<String> = search_with(&req, Arc::new(DirectSource::new()), &split)
                .unwrap_or_else(|e| panic!("{e}"))
                .map(|r| key(&r))
                .collect();
            assert_eq!(plain, want, "{pat}");
            assert_eq!(dec, want, "{pat} (decomposed at the mount)");
        }
    }
}
