//! Shared test helpers: random trees, a reference walker and a reference matcher.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use dircache_search::{search, Flags, SearchRequest, SearchResult, Source};
use rand::rngs::StdRng;
use rand::Rng;

/// A test that cannot run here (no root, no /dev/fuse, ...). Under CI (the `CI` variable is
/// set) that is a failure: CI must run every test. Elsewhere the test returns early, but says
/// so loudly on stderr (past the test harness's output capture).
pub fn cannot_run(why: &str) {
    let test = std::thread::current().name().unwrap_or("?").to_string();
    if std::env::var_os("CI").is_some() {
        panic!("{test}: cannot run ({why}), and CI is set: a skipped test fails in CI");
    }
    // Straight to the stderr descriptor: the test harness captures eprintln! of passing tests.
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!("\n*** SKIPPED {test}: {why}. This test did NOT run (in CI it fails). ***\n")
            .as_bytes(),
    );
}

pub const NAMES: &[&str] = &[
    "a", "b", "ab", "abc", "x.c", "y.c", "z.h", "lib", "src", "Makefile", "a.c", "bc.h",
];

/// Build a random tree under `dir` (which must exist and be mode 0755).
pub fn random_tree(rng: &mut StdRng, dir: &Path, depth: usize, budget: &mut usize) {
    let n = rng.gen_range(0..7);
    for _ in 0..n {
        if *budget == 0 {
            return;
        }
        *budget -= 1;
        let name = NAMES[rng.gen_range(0..NAMES.len())];
        let p = dir.join(name);
        if p.symlink_metadata().is_ok() {
            continue;
        }
        let r: u32 = rng.gen_range(0..100);
        if r < 35 && depth > 0 {
            if std::fs::create_dir(&p).is_err() {
                continue;
            }
            random_tree(rng, &p, depth - 1, budget);
            // Permission-denied subtrees for non-root viewers.
            let mode = match rng.gen_range(0..20) {
                0 => 0o700,
                1 => 0o000,
                2 => 0o711, // searchable, not listable
                3 => 0o744, // listable, not searchable
                _ => 0o755,
            };
            let _ = std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode));
        } else if r < 45 {
            // Relative symlink to a sibling (maybe missing, maybe a directory).
            let t = NAMES[rng.gen_range(0..NAMES.len())];
            let _ = symlink(t, &p);
        } else {
            if std::fs::write(&p, b"x").is_err() {
                continue;
            }
            let mode = [0o644, 0o755, 0o600, 0o700, 0o444][rng.gen_range(0..5)];
            let _ = std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode));
        }
    }
}

/// A chain of `depth` nested directories `d/d/d/...` with a file `deep.c` at the bottom.
pub fn deep_chain(dir: &Path, depth: usize) -> PathBuf {
    let mut p = dir.to_path_buf();
    for _ in 0..depth {
        p.push("d");
    }
    let _ = std::fs::create_dir_all(&p);
    let _ = std::fs::write(p.join("deep.c"), b"");
    p
}

// ---------------------------------------------------------------------------------------
// Reference matcher: whole-path backtracking, written independently of the crate's matcher.

fn glob_full(p: &[u8], s: &[u8]) -> bool {
    match p.split_first() {
        None => s.is_empty(),
        Some((b'*', rest)) => {
            let mut i = 0;
            loop {
                if glob_full(rest, &s[i..]) {
                    return true;
                }
                if i >= s.len() || s[i] == b'/' {
                    return false;
                }
                i += 1;
            }
        }
        Some((b'?', rest)) => {
            glob_full(rest, s) || (!s.is_empty() && s[0] != b'/' && glob_full(rest, &s[1..]))
        }
        Some((c, rest)) => !s.is_empty() && s[0] == *c && glob_full(rest, &s[1..]),
    }
}

/// Does `pattern` match relative path `rel`?
pub fn ref_match(pattern: &str, rel: &str) -> bool {
    pattern.split('|').any(|alt| {
        if let Some(body) = alt.strip_prefix('/') {
            let body = if body.is_empty() { "*" } else { body };
            glob_full(body.as_bytes(), rel.as_bytes())
        } else {
            // Any suffix starting at a component boundary.
            let b = rel.as_bytes();
            std::iter::once(0)
                .chain(
                    b.iter()
                        .enumerate()
                        .filter(|(_, &c)| c == b'/')
                        .map(|(i, _)| i + 1),
                )
                .any(|start| glob_full(alt.as_bytes(), &b[start..]))
        }
    })
}

/// Could anything below directory `rel` match?
pub fn ref_may_descend(pattern: &str, rel: &str) -> bool {
    pattern.split('|').any(|alt| match alt.strip_prefix('/') {
        None => true,
        Some(body) => {
            let body = if body.is_empty() { "*" } else { body };
            let pc: Vec<&str> = body.split('/').collect();
            let dc: Vec<&str> = rel.split('/').collect();
            pc.len() > dc.len()
                && pc
                    .iter()
                    .zip(&dc)
                    .all(|(p, d)| glob_full(p.as_bytes(), d.as_bytes()))
        }
    })
}

// ---------------------------------------------------------------------------------------
// Reference walker: the tree as seen by `viewer` (uid, gid), from mode bits.

#[derive(Clone, Copy)]
pub struct Viewer {
    pub uid: u32,
    pub gid: u32,
}

fn can(v: Viewer, md: &std::fs::Metadata, bit: u32) -> bool {
    if v.uid == 0 {
        return bit != 1 || md.is_dir() || md.mode() & 0o111 != 0;
    }
    let m = md.mode();
    let shift = if md.uid() == v.uid {
        6
    } else if md.gid() == v.gid {
        3
    } else {
        0
    };
    (m >> shift) & bit != 0
}

/// Expected results, as `(path, error)` strings: `path` plain, or `path!source:errno`.
pub fn reference(roots: &[PathBuf], pattern: &str, flags: Flags, v: Viewer) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let stop = flags.contains(Flags::STOPATFIRST);
    for (ri, root) in roots.iter().enumerate() {
        let rs = root.to_string_lossy().to_string();
        let show = |rel: &str| -> String {
            if flags.contains(Flags::INCLUDEROOT) {
                if rel.is_empty() {
                    rs.clone()
                } else {
                    format!("{}/{}", rs.trim_end_matches('/'), rel)
                }
            } else {
                rel.to_string()
            }
        };
        let _ = ri;
        // Stack of (rel dir, x-permission on the chain up to and including its parent).
        let mut stack: Vec<(String, bool)> = vec![(String::new(), true)];
        while let Some((rel, chain_x)) = stack.pop() {
            let full = if rel.is_empty() {
                root.clone()
            } else {
                root.join(&rel)
            };
            let Ok(md) = std::fs::symlink_metadata(&full) else {
                continue;
            };
            if !chain_x || !can(v, &md, 4) || (rel.is_empty() && !can(v, &md, 1)) {
                out.insert(format!("{}!Open:{}", show(&rel), libc::EACCES));
                continue;
            }
            let x_here = chain_x && can(v, &md, 1);
            let Ok(rd) = std::fs::read_dir(&full) else {
                continue;
            };
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                let crel = if rel.is_empty() {
                    name.clone()
                } else {
                    format!("{rel}/{name}")
                };
                let Ok(cmd) = e.path().symlink_metadata() else {
                    continue;
                };
                if ref_match(pattern, &crel) {
                    let mut ok = true;
                    let mask = flags.access_mask();
                    if mask != 0 {
                        ok = x_here
                            && match std::fs::metadata(e.path()) {
                                Ok(t) => [4, 2, 1].iter().all(|&b| mask & b == 0 || can(v, &t, b)),
                                Err(_) => false,
                            };
                    }
                    if ok {
                        if flags.contains(Flags::METADATA) && !x_here {
                            out.insert(format!("{}!Stat:{}", show(&crel), libc::EACCES));
                        } else {
                            out.insert(show(&crel));
                        }
                    }
                }
                if cmd.is_dir() && ref_may_descend(pattern, &crel) {
                    stack.push((crel, x_here));
                }
            }
        }
        if stop && out.iter().any(|s| !s.contains('!')) {
            break;
        }
    }
    out
}

pub fn key(r: &SearchResult) -> String {
    let p = String::from_utf8_lossy(&r.path).to_string();
    match r.error {
        Some(e) => format!("{p}!{:?}:{}", e.source, e.errno),
        None => p,
    }
}

pub fn run<S: Source>(
    roots: &[PathBuf],
    pattern: &str,
    flags: Flags,
    src: Arc<S>,
) -> Vec<SearchResult> {
    let paths: Vec<String> = roots
        .iter()
        .map(|r| r.to_string_lossy().to_string())
        .collect();
    let req = SearchRequest::new(paths.join(":"), pattern, flags);
    match search(&req, src) {
        Ok(s) => s.collect(),
        Err(e) => panic!("search {req:?}: {e}"),
    }
}

pub fn keys(rs: &[SearchResult]) -> BTreeSet<String> {
    rs.iter().map(key).collect()
}

pub fn os(p: &Path) -> &[u8] {
    p.as_os_str().as_bytes()
}

pub fn from_bytes(b: &[u8]) -> PathBuf {
    PathBuf::from(OsStr::from_bytes(b))
}

/// A random pattern over the names the trees use.
pub fn random_pattern(rng: &mut StdRng) -> String {
    let comps = [
        "*", "*.c", "a*", "?b", "a?c", "*b*", "x.c", "lib", "src", "*.h", "a", "ab?", "Makefile",
    ];
    let nalts = rng.gen_range(1..3);
    let mut alts = Vec::new();
    for _ in 0..nalts {
        let n = rng.gen_range(1..4);
        let body: Vec<&str> = (0..n)
            .map(|_| comps[rng.gen_range(0..comps.len())])
            .collect();
        let anchored = rng.gen_bool(0.4);
        alts.push(format!(
            "{}{}",
            if anchored { "/" } else { "" },
            body.join("/")
        ));
    }
    alts.join("|")
}
