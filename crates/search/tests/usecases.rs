//! The paper's use cases (§2, §3.1), as in the README.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use dircache_search::{search, DirectSource, Flags, SearchRequest, SearchResult};

fn touch(p: &Path, mode: u32) {
    if let Some(d) = p.parent() {
        std::fs::create_dir_all(d).unwrap_or_else(|e| panic!("{e}"));
    }
    std::fs::write(p, b"data").unwrap_or_else(|e| panic!("{e}"));
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("{e}"));
}

fn paths(rs: &[SearchResult]) -> Vec<String> {
    let mut v: Vec<String> = rs
        .iter()
        .filter(|r| r.error.is_none())
        .map(|r| String::from_utf8_lossy(&r.path).into_owned())
        .collect();
    v.sort();
    v
}

fn go(paths_: &str, pattern: &str, flags: Flags) -> Vec<SearchResult> {
    let req = SearchRequest::new(paths_, pattern, flags);
    search(&req, Arc::new(DirectSource::new()))
        .unwrap_or_else(|e| panic!("{e}"))
        .collect()
}

struct Fixture {
    _t: tempfile::TempDir,
    r: String,
}

fn fixture() -> Fixture {
    let t = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let r = t.path().to_string_lossy().into_owned();
    let p = t.path();
    touch(&p.join("bin/chmod"), 0o644); // not executable: skipped by X_OK
    touch(&p.join("usr/bin/chmod"), 0o755);
    touch(&p.join("usr/bin/chown"), 0o755);
    touch(&p.join("home/fred/bin/chmod"), 0o755);
    touch(&p.join("usr/lib/x86_64-linux-gnu/libselinux.so.1"), 0o644);
    touch(&p.join("lib64/libselinux.so.1"), 0o644);
    touch(&p.join("src/main.c"), 0o644);
    touch(&p.join("src/util/str.c"), 0o644);
    touch(&p.join("src/util/str.h"), 0o644);
    touch(&p.join("src/util/deep/x.c"), 0o644);
    touch(&p.join("README"), 0o644);
    Fixture { _t: t, r }
}

#[test]
fn path_search_chmod() {
    let f = fixture();
    let path = format!("{r}/bin:{r}/usr/bin:{r}/home/fred/bin", r = f.r);
    let rs = go(
        &path,
        "/chmod",
        Flags::INCLUDEROOT | Flags::STOPATFIRST | Flags::X_OK,
    );
    assert_eq!(paths(&rs), vec![format!("{}/usr/bin/chmod", f.r)]);
    // Tab completion: every executable starting with `ch`.
    let rs = go(&path, "/ch*", Flags::INCLUDEROOT | Flags::X_OK);
    assert_eq!(
        paths(&rs),
        vec![
            format!("{}/home/fred/bin/chmod", f.r),
            format!("{}/usr/bin/chmod", f.r),
            format!("{}/usr/bin/chown", f.r)
        ]
    );
}

#[test]
fn library_search_over_several_directories() {
    let f = fixture();
    let libpath = format!(
        "{r}/opt/lib:{r}/usr/local/lib:{r}/usr/lib/x86_64-linux-gnu:{r}/lib64",
        r = f.r
    );
    let rs = go(
        &libpath,
        "/libselinux.so.1",
        Flags::INCLUDEROOT | Flags::STOPATFIRST,
    );
    assert_eq!(
        paths(&rs),
        vec![format!("{}/usr/lib/x86_64-linux-gnu/libselinux.so.1", f.r)]
    );
    // The missing directories are reported inside the results, the search went on.
    assert_eq!(
        rs.iter()
            .filter(|r| r.error.is_some_and(|e| e.errno == libc::ENOENT))
            .count(),
        2
    );
}

#[test]
fn glob_star_slash_star_c() {
    let f = fixture();
    // `cat */*.c` in src: non-recursive.
    let rs = go(&format!("{}/src", f.r), "/*/*.c", Flags::NONE);
    assert_eq!(paths(&rs), vec!["util/str.c"]);
    // `*/*.c` without the anchor: any .c file with a parent directory below the root.
    let rs = go(&f.r, "*/*.c", Flags::NONE);
    assert_eq!(
        paths(&rs),
        vec!["src/main.c", "src/util/deep/x.c", "src/util/str.c"]
    );
}

#[test]
fn ls_l_with_metadata() {
    let f = fixture();
    let rs = go(&format!("{}/src/util", f.r), "/", Flags::METADATA);
    let names = paths(&rs);
    assert_eq!(names, vec!["deep", "str.c", "str.h"]);
    for r in &rs {
        let st = r.stat.unwrap_or_else(|| panic!("no stat for {r:?}"));
        if r.path == b"str.c" {
            assert_eq!((st.size, st.mode & 0o777), (4, 0o644));
        }
        if r.path == b"deep" {
            assert!(st.is_dir());
        }
    }
}

#[test]
fn recursive_star_c_like_find_name() {
    let f = fixture();
    let rs = go(&f.r, "*.c", Flags::INCLUDEROOT);
    assert_eq!(
        paths(&rs),
        vec![
            format!("{}/src/main.c", f.r),
            format!("{}/src/util/deep/x.c", f.r),
            format!("{}/src/util/str.c", f.r)
        ]
    );
    // Alternatives: sources and headers in one search.
    let rs = go(&format!("{}/src", f.r), "*.c|*.h", Flags::NONE);
    assert_eq!(
        paths(&rs),
        vec!["main.c", "util/deep/x.c", "util/str.c", "util/str.h"]
    );
    // Concatenate two directories (`/` lists each).
    let rs = go(
        &format!("{r}/usr/bin:{r}/home/fred/bin", r = f.r),
        "/",
        Flags::INCLUDEROOT,
    );
    assert_eq!(paths(&rs).len(), 3);
}
