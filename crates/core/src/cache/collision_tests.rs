//! Forced signature collisions (docs/core.md, "Signatures"): with `dlht::force_collisions`
//! every signature falls into one of 4 values, so every lookup meets entries of other paths.
//!
//! * `forced_collisions_never_give_another_paths_dentry_with_verify_path`: with
//!   `Config::verify_path`, every answer is still the backend's for that exact path (files,
//!   missing names, deep negatives, `..`, symlinks, relative lookups from a handle).
//! * `forced_collisions_do_give_wrong_answers_without_verification`: the same lookups without
//!   `verify_path` do return another path's entry: the hook really collides, and the default
//!   configuration rests on the 128-bit keyed signature (no collision found in practice).
//! * `uncommon_parts_follow_their_entries`: the uncommon parts of DLHT entries (symlinks on
//!   the path, filed by odd stamp in `Dlht::extras`) are dropped with their entries (no
//!   orphans after replacements and sweeps), and an entry whose parts are missing is never
//!   used: the lookup takes the slow path and still gives the backend's answer.

use std::sync::Arc;

use super::dlht::force_collisions;
use crate::memory::MemoryBackend;
use crate::{At, Backend, Cache, Config, Cred, Error, LookupFlags};

/// Looks paths up with signatures forced to collide and compares each answer (inode number or
/// error) with the backend's; returns how many differed (panics at the first with
/// `verify_path`).
fn run(verify_path: bool) -> usize {
    let b = Arc::new(MemoryBackend::new());
    let mut spec = vec!["lnk -> d0/s1".to_string()];
    for d in 0..4 {
        for s in 0..4 {
            for f in 0..6 {
                spec.push(format!("d{d}/s{s}/f{f}.c"));
            }
        }
    }
    let spec_ref: Vec<&str> = spec.iter().map(String::as_str).collect();
    b.populate(&spec_ref);
    let cache = Cache::new(
        b.clone(),
        Config {
            verify_path,
            ..Config::default()
        },
    )
    .expect("cache");
    let user = cache.credentials(Cred::new(1000, 1000, []));
    let mut paths: Vec<String> = Vec::new();
    for d in 0..4 {
        for s in 0..4 {
            paths.push(format!("d{d}/s{s}"));
            for f in 0..7 {
                // f6 is missing; its `x` below is a deep negative.
                paths.push(format!("d{d}/s{s}/f{f}.c"));
                paths.push(format!("d{d}/s{s}/f{f}.c/x"));
            }
            paths.push(format!("d{d}/s{s}/../s{}/f1.c", (s + 1) % 4));
        }
    }
    for f in 0..7 {
        paths.push(format!("lnk/f{f}.c"));
    }
    let truth = |p: &str| -> Result<u64, Error> {
        // The backend does not follow symlinks: resolve `lnk` and `..` by hand.
        let mut comps: Vec<&str> = Vec::new();
        for c in p.split('/') {
            match c {
                ".." => {
                    comps.pop();
                }
                "lnk" => comps.extend(["d0", "s1"]),
                c => comps.push(c),
            }
        }
        b.getattr(comps.join("/").as_bytes()).map(|a| a.ino)
    };
    let h = cache.opendir(&user, At::Root, b"d1").expect("opendir d1");
    let _guard = force_collisions();
    let mut wrong = 0;
    // Several rounds: the first publishes, later ones hit the fast path.
    for _ in 0..3 {
        for p in &paths {
            let want = truth(p);
            let got = cache
                .stat(&user, At::Root, p.as_bytes(), LookupFlags::FOLLOW)
                .map(|a| a.ino);
            if got != want {
                if verify_path {
                    panic!("{p}: cache {got:?}, backend {want:?}");
                }
                wrong += 1;
            }
            // The same names relative to a handle on d1 (hashed after its lexical path).
            if let Some(rel) = p.strip_prefix("d1/") {
                let got = cache
                    .stat(&user, At::Dir(&h), rel.as_bytes(), LookupFlags::FOLLOW)
                    .map(|a| a.ino);
                if got != want {
                    if verify_path {
                        panic!("d1 + {rel}: cache {got:?}, backend {want:?}");
                    }
                    wrong += 1;
                }
            }
        }
    }
    let st = cache.stats();
    assert!(
        st.fastpath_hits > 100,
        "the fast path was used ({} hits)",
        st.fastpath_hits
    );
    wrong
}

#[test]
fn forced_collisions_never_give_another_paths_dentry_with_verify_path() {
    assert_eq!(run(true), 0);
}

#[test]
fn forced_collisions_do_give_wrong_answers_without_verification() {
    assert!(run(false) > 0, "the hook did not make signatures collide");
}

#[test]
fn uncommon_parts_follow_their_entries() {
    use crate::SetAttr;
    let b = Arc::new(MemoryBackend::new());
    b.populate(&["lnk -> d0", "d0/f0.c", "d0/f1.c", "d1/g.c"]);
    let cache = Cache::new(b.clone(), Config::default()).expect("cache");
    let user = cache.credentials(Cred::new(1000, 1000, []));
    let root = cache.credentials(Cred::root());
    let ino = |p: &str| b.getattr(p.as_bytes()).map(|a| a.ino);
    let stat = |p: &str| {
        cache
            .stat(&user, At::Root, p.as_bytes(), LookupFlags::FOLLOW)
            .map(|a| a.ino)
    };
    let fast = || cache.stats().fastpath_hits;
    for round in 0..40u32 {
        for p in ["lnk/f0.c", "lnk/f1.c", "d1/g.c", "lnk"] {
            let want = ino(&p.replace("lnk", "d0"));
            assert_eq!(stat(p), want, "{p} in round {round}");
        }
        // Bumps d0's subtree: every entry through `lnk` is replaced at its next publication.
        let set = SetAttr {
            mode: Some(if round % 2 == 0 { 0o751 } else { 0o755 }),
            ..SetAttr::default()
        };
        cache
            .setattr(&root, At::Root, b"d0", &set, LookupFlags::FOLLOW)
            .expect("chmod d0");
        if round % 10 == 9 {
            cache.sweep_dlht();
        }
    }
    for p in ["lnk/f0.c", "lnk/f1.c"] {
        stat(p).expect("republish");
    }
    let (odd, filed, orphans) = cache.ns.dlht.extra_counts();
    assert!(odd >= 2, "entries through the symlink have parts: {odd}");
    assert_eq!((filed, orphans), (odd, 0), "parts without their entry");
    // A hit now: the entry and its parts are there.
    let f0 = fast();
    assert_eq!(stat("lnk/f0.c"), ino("d0/f0.c"));
    assert_eq!(fast(), f0 + 1, "a fast-path hit through the symlink");
    // Parts gone (as when a reader races the entry's replacement): no hit, the right answer.
    cache.ns.dlht.drop_extras();
    let f1 = fast();
    assert_eq!(stat("lnk/f0.c"), ino("d0/f0.c"));
    assert_eq!(fast(), f1, "an entry without its parts was used");
    // The slow path published it again, with its parts: hits resume.
    assert_eq!(stat("lnk/f0.c"), ino("d0/f0.c"));
    assert_eq!(fast(), f1 + 1);
}
