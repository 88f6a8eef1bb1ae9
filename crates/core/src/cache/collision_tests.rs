//! Forced signature collisions (docs/core.md, "Signatures"): with `dlht::force_collisions`
//! every signature falls into one of 4 values, so every lookup meets entries of other paths.
//!
//! * `forced_collisions_never_give_another_paths_dentry_with_verify_path`: with
//!   `Config::verify_path`, every answer is still the backend's for that exact path (files,
//!   missing names, deep negatives, `..`, symlinks, relative lookups from a handle).
//! * `forced_collisions_do_give_wrong_answers_without_verification`: the same lookups without
//!   `verify_path` do return another path's entry: the hook really collides, and the default
//!   configuration rests on the 128-bit keyed signature (no collision found in practice).

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
