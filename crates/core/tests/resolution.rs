//! Path resolution against the local kernel as oracle (rootless): symlinks (relative,
//! absolute, dangling, loops, the 40-link limit), trailing slashes, `.` and `..` — physical
//! `..` (POSIX) through symlinks, and Plan 9 lexical `..` (`DotDot::Lexical`), whose oracle is
//! the kernel resolving the lexically cleaned path. The same tree is built in the memory
//! backend and in a temporary directory (`common::Twin`); every path is resolved twice by the
//! cache (the second time the fast path may answer) under several configurations.

mod common;

use common::{plan9_clean, resolve, root, Twin};
use dircache_core::{At, Config, DotDot, LookupFlags};

fn spec() -> Vec<String> {
    let mut s: Vec<String> = [
        "a/b/c/f",
        "a/b/g",
        "a/file",
        "a/l -> b/c",
        "a/abs -> /a/b",
        "a/up -> ..",
        "a/dangling -> nope",
        "a/tofile -> file",
        "a/tofile_slash -> file/",
        "a/todir_slash -> b/",
        "a/self -> self",
        "a/ping -> pong",
        "a/pong -> ping",
        "a/c/f2",
        "chain/end/x",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // chain/k0 -> k1 -> ... -> k40 -> end: k0 needs 41 links (ELOOP), k1 exactly 40 (allowed).
    for i in 0..40 {
        s.push(format!("chain/k{i} -> k{}", i + 1));
    }
    s.push("chain/k40 -> end".into());
    s
}

const PATHS: &[&str] = &[
    "/",
    ".",
    "..",
    "/..",
    "/../../a/file",
    "a",
    "a/",
    "a/.",
    "a/..",
    "a/b/c/f",
    "a//b///c/./f",
    "a/b/c/f/",
    "a/b/c/f/.",
    "a/b/c/.",
    "a/b/c/..",
    "a/b/c/../..",
    "a/file/",
    "a/file/.",
    "a/file/..",
    "a/file/../file",
    "a/file/x",
    "a/missing/../file",
    "a/missing/x/y",
    "a/b/../file",
    "a/b/../../a/b/g",
    "a/l",
    "a/l/",
    "a/l/.",
    "a/l/..",
    "a/l/f",
    "a/l/../g",
    "a/l/../c/f",
    "a/l/../../file",
    "/a/abs",
    "a/abs/",
    "a/abs/c/f",
    "a/abs/../file",
    "a/abs/..",
    "a/up",
    "a/up/",
    "a/up/a/file",
    "a/up/..",
    "a/up/a/l/../g",
    "a/dangling",
    "a/dangling/",
    "a/dangling/x",
    "a/tofile",
    "a/tofile/",
    "a/tofile_slash",
    "a/tofile_slash/",
    "a/todir_slash",
    "a/todir_slash/g",
    "a/self",
    "a/self/",
    "a/self/x",
    "a/ping",
    "a/ping/x",
    "chain/k0",
    "chain/k1",
    "chain/k1/x",
    "chain/k1/..",
    "chain/k2/x",
    "chain/k0/x",
];

fn flag_sets() -> [LookupFlags; 3] {
    [
        LookupFlags::FOLLOW,
        LookupFlags::NOFOLLOW,
        LookupFlags {
            follow: false,
            directory: true,
        },
    ]
}

fn configs() -> Vec<(&'static str, Config)> {
    vec![
        ("default", Config::default()),
        ("baseline", Config::baseline()),
        (
            "no-completeness",
            Config {
                completeness: false,
                ..Config::default()
            },
        ),
    ]
}

#[test]
fn posix_resolution_matches_the_kernel() {
    let spec = spec();
    let spec: Vec<&str> = spec.iter().map(String::as_str).collect();
    let t = Twin::new(&spec);
    let mut wrong = Vec::new();
    let mut checked = 0;
    for (name, cfg) in configs() {
        let c = t.cache(cfg);
        let r = root(&c);
        // Twice over all paths: the first round fills the cache, the second is served by it.
        for round in 0..2 {
            for p in PATHS {
                for f in flag_sets() {
                    let want = t.kernel(p, f);
                    let got = resolve(&c, &r, At::Root, p, f);
                    checked += 1;
                    if got != want {
                        wrong.push(format!(
                            "{name} round {round} {p:?} {f:?}: cache {got:?}, kernel {want:?}"
                        ));
                    }
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {checked} differ:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

#[test]
fn lexical_dotdot_is_the_kernel_on_the_cleaned_path() {
    let spec = spec();
    let spec: Vec<&str> = spec.iter().map(String::as_str).collect();
    let t = Twin::new(&spec);
    let mut wrong = Vec::new();
    let mut differs_from_posix = 0;
    for fastpath in [true, false] {
        let c = t.cache(Config {
            dotdot: DotDot::Lexical,
            fastpath,
            ..Config::default()
        });
        let r = root(&c);
        for round in 0..2 {
            for p in PATHS {
                for f in flag_sets() {
                    let want = t.kernel(&plan9_clean(p), f);
                    if want != t.kernel(p, f) {
                        differs_from_posix += 1;
                    }
                    let got = resolve(&c, &r, At::Root, p, f);
                    if got != want {
                        wrong.push(format!(
                            "fastpath={fastpath} round {round} {p:?} {f:?}: cache {got:?}, kernel on {:?} {want:?}",
                            plan9_clean(p)
                        ));
                    }
                }
            }
        }
    }
    // The path list must exercise the difference (a/l/.. is a in Plan 9, a/b in POSIX, ...).
    assert!(
        differs_from_posix >= 8,
        "only {differs_from_posix} paths tell lexical from physical"
    );
    assert!(
        wrong.is_empty(),
        "{} differ:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

#[test]
fn relative_lookups_from_a_handle_match_the_kernel() {
    let spec = spec();
    let spec: Vec<&str> = spec.iter().map(String::as_str).collect();
    let t = Twin::new(&spec);
    let rel = [
        "g",
        "c/f",
        "..",
        "../..",
        "../../..",
        "../file",
        "../l/../g",
        "c/../../file",
        "../up/a/b/g",
        "../abs/c/f",
        "./c/.",
        "../../a/b",
        "/a/file",
        "c/f/..",
    ];
    for (name, cfg) in configs() {
        let c = t.cache(cfg);
        let r = root(&c);
        let h = c.opendir(&r, At::Root, b"a/b").expect("opendir a/b");
        for round in 0..2 {
            for p in rel {
                for f in flag_sets() {
                    let want = t.kernel_in(&t.dir.path().join("a/b"), p, f);
                    let got = resolve(&c, &r, At::Dir(&h), p, f);
                    assert_eq!(got, want, "{name} round {round} a/b + {p:?} {f:?}");
                }
            }
        }
    }
}

/// Lexical `..` from a handle: the kernel, started at the handle's directory, on the cleaned
/// relative path (leading `..` kept: they climb above the handle).
#[test]
fn lexical_relative_lookups_from_a_handle() {
    let spec = spec();
    let spec: Vec<&str> = spec.iter().map(String::as_str).collect();
    let t = Twin::new(&spec);
    let rel = [
        "g",
        "..",
        "../..",
        "../../..",
        "../file",
        "../l/../g",
        "c/../../file",
        "../l/..",
        "../up/a/b/g",
        "../abs/c/f",
        "../abs/..",
        "../../a/l/../b",
        "/a/l/..",
        "c/f/..",
    ];
    for fastpath in [true, false] {
        let c = t.cache(Config {
            dotdot: DotDot::Lexical,
            fastpath,
            ..Config::default()
        });
        let r = root(&c);
        let h = c.opendir(&r, At::Root, b"a/b").expect("opendir a/b");
        for round in 0..2 {
            for p in rel {
                for f in flag_sets() {
                    let want = t.kernel_in(&t.dir.path().join("a/b"), &plan9_clean(p), f);
                    let got = resolve(&c, &r, At::Dir(&h), p, f);
                    assert_eq!(
                        got, want,
                        "fastpath={fastpath} round {round} a/b + {p:?} {f:?}"
                    );
                }
            }
        }
    }
}

/// Physical `..` needs search permission on the directory it climbs out of (Linux looks `..`
/// up in it); lexical `..` never looks at that directory, so it may even be missing.
#[test]
fn dotdot_permission_physical_and_lexical() {
    use dircache_core::SetAttr;
    let spec = ["a/locked/x", "a/y"];
    for dotdot in [DotDot::Posix, DotDot::Lexical] {
        // Other users' permissions: the kernel cannot be asked rootless; Linux's rule above.
        let (_m, c) = common::cache_with(
            &spec,
            Config {
                dotdot,
                ..Config::default()
            },
        );
        let r = root(&c);
        let u = common::user(&c, 1000);
        let chmod = SetAttr {
            mode: Some(0o700),
            ..Default::default()
        };
        c.setattr(&r, At::Root, b"a/locked", &chmod, LookupFlags::FOLLOW)
            .unwrap();
        for _ in 0..2 {
            let through_locked = resolve(&c, &u, At::Root, "a/locked/../y", LookupFlags::FOLLOW);
            let through_missing = resolve(&c, &u, At::Root, "a/missing/../y", LookupFlags::FOLLOW);
            match dotdot {
                DotDot::Posix => {
                    assert_eq!(through_locked, Err(libc::EACCES));
                    assert_eq!(through_missing, Err(libc::ENOENT));
                }
                DotDot::Lexical => {
                    assert_eq!(through_locked, Ok("a/y".into()));
                    assert_eq!(through_missing, Ok("a/y".into()));
                }
            }
            // Either way, the locked directory itself stays closed.
            assert_eq!(
                resolve(&c, &u, At::Root, "a/locked/x", LookupFlags::FOLLOW),
                Err(libc::EACCES)
            );
        }
    }
}

/// Replacing a symlink must redirect what was cached through it (SOSP'15 §4.2: "if a symbolic
/// link changes, we must invalidate all descendant aliases").
#[test]
fn retargeted_symlink_redirects_cached_paths() {
    let spec = spec();
    let spec: Vec<&str> = spec.iter().map(String::as_str).collect();
    let t = Twin::new(&spec);
    let c = t.cache(Config::default());
    let r = root(&c);
    let paths = [
        "a/l/f",
        "a/l/c/f",
        "a/l/..",
        "a/l/../g",
        "a/l/",
        "a/up/a/file",
    ];
    for p in paths {
        for _ in 0..2 {
            assert_eq!(
                resolve(&c, &r, At::Root, p, LookupFlags::FOLLOW),
                t.kernel(p, LookupFlags::FOLLOW),
                "{p}"
            );
        }
    }
    // Through the cache, and in the kernel: a/l now points at b (was b/c); a/up at "." (was ..).
    c.unlink(&r, At::Root, b"a/l").unwrap();
    c.symlink(&r, b"b", At::Root, b"a/l").unwrap();
    c.unlink(&r, At::Root, b"a/up").unwrap();
    c.symlink(&r, b".", At::Root, b"a/up").unwrap();
    let d = t.dir.path().join("a");
    std::fs::remove_file(d.join("l")).unwrap();
    std::os::unix::fs::symlink("b", d.join("l")).unwrap();
    std::fs::remove_file(d.join("up")).unwrap();
    std::os::unix::fs::symlink(".", d.join("up")).unwrap();
    for p in paths.iter().chain(&["a/up/file", "a/up/up/up/b"]) {
        for _ in 0..2 {
            assert_eq!(
                resolve(&c, &r, At::Root, p, LookupFlags::FOLLOW),
                t.kernel(p, LookupFlags::FOLLOW),
                "after retarget: {p}"
            );
        }
    }
}

/// The same, when the link changes behind the cache's back and the cache is told.
#[test]
fn symlink_changed_outside_redirects_after_apply_change() {
    use dircache_core::{Backend, Change, Cred};
    let spec = spec();
    let spec: Vec<&str> = spec.iter().map(String::as_str).collect();
    let t = Twin::new(&spec);
    let c = t.cache(Config::default());
    let r = root(&c);
    for _ in 0..2 {
        assert_eq!(
            resolve(&c, &r, At::Root, "a/l/f", LookupFlags::FOLLOW),
            Ok("a/b/c/f".into())
        );
    }
    t.mem.unlink(&Cred::root(), b"a/l").unwrap();
    t.mem.symlink(&Cred::root(), b"b", b"a/l").unwrap();
    c.apply_change(&Change::Entry {
        path: b"a/l".to_vec(),
    });
    assert_eq!(
        resolve(&c, &r, At::Root, "a/l/f", LookupFlags::FOLLOW),
        Err(libc::ENOENT)
    );
    assert_eq!(
        resolve(&c, &r, At::Root, "a/l/g", LookupFlags::FOLLOW),
        Ok("a/b/g".into())
    );
}
