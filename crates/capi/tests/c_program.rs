//! Compile `examples/which.c` against `include/dircache_search.h` and `libdircachesearch.so`,
//! run it, and compare its output with the Rust API on the same tree.

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use dircache_search::{search, DirectSource, Flags, SearchRequest};

fn lib_dir() -> PathBuf {
    // The test runs from target/<profile>/deps, where cargo leaves the cdylib it built for us
    // (`cargo build` also copies it to target/<profile>).
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("{e}"));
    let deps = exe
        .parent()
        .unwrap_or_else(|| panic!("no parent"))
        .to_path_buf();
    let up = deps
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| deps.clone());
    for d in [deps, up] {
        if d.join("libdircachesearch.so").exists() {
            return d;
        }
    }
    panic!("libdircachesearch.so not built next to {exe:?}");
}

fn compile(out: &Path) {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = lib_dir();
    let st = Command::new("cc")
        .arg("-Wall")
        .arg("-Werror")
        .arg("-o")
        .arg(out)
        .arg(here.join("examples/which.c"))
        .arg("-I")
        .arg(here.join("include"))
        .arg("-L")
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-ldircachesearch")
        .status()
        .unwrap_or_else(|e| panic!("cc: {e}"));
    assert!(st.success(), "cc failed");
}

fn rust_lines(paths: &str, pattern: &str, flags: u32) -> BTreeSet<String> {
    let req = SearchRequest::new(paths, pattern, Flags(flags));
    let s = search(&req, Arc::new(DirectSource::new())).unwrap_or_else(|e| panic!("{e}"));
    s.map(|r| {
        let p = String::from_utf8_lossy(&r.path).to_string();
        match (r.error, r.stat) {
            (Some(e), _) => format!("! {} {} {} {}", r.root, p, e.source as i32, e.errno),
            (None, Some(st)) => format!("{} {} {} {:o}", r.root, p, st.size, st.mode),
            (None, None) => format!("{} {}", r.root, p),
        }
    })
    .collect()
}

#[test]
fn c_which_matches_rust_api() {
    let t = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let exe = t.path().join("which");
    compile(&exe);
    let tree = t.path().join("tree");
    for d in ["bin1", "bin2", "lib/x86_64", "src/a", "src/b/c"] {
        std::fs::create_dir_all(tree.join(d)).unwrap_or_else(|e| panic!("{e}"));
    }
    for (f, mode) in [
        ("bin2/chmod", 0o755),
        ("bin1/chmod", 0o644),
        ("bin2/chown", 0o755),
        ("lib/x86_64/libz.so.1", 0o644),
        ("src/a/x.c", 0o644),
        ("src/b/y.c", 0o644),
        ("src/b/c/z.c", 0o600),
        ("src/b/c/z.h", 0o600),
    ] {
        let p = tree.join(f);
        std::fs::write(&p, b"hello").unwrap_or_else(|e| panic!("{e}"));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let tr = tree.to_string_lossy().to_string();
    let path = format!("{tr}/missing:{tr}/bin1:{tr}/bin2");
    let libs = format!("{tr}/lib/x86_64:{tr}/lib");
    let cases: Vec<(String, &str, u32)> = vec![
        (
            path.clone(),
            "/chmod",
            (Flags::STOPATFIRST | Flags::X_OK | Flags::INCLUDEROOT).0,
        ),
        (path.clone(), "/ch*", (Flags::X_OK | Flags::INCLUDEROOT).0),
        (
            libs,
            "/libz.so.1",
            (Flags::STOPATFIRST | Flags::INCLUDEROOT).0,
        ),
        (tr.clone(), "*.c", Flags::INCLUDEROOT.0),
        (format!("{tr}/src"), "/*/*.c", 0),
        (format!("{tr}/src/b"), "/", Flags::METADATA.0),
        (tr.clone(), "*.c|*.h", Flags::METADATA.0),
    ];
    for (paths, pattern, flags) in cases {
        let out = Command::new(&exe)
            .args([paths.as_str(), pattern, &flags.to_string()])
            .env("DIRCACHE_NO_DELEGATE", "1")
            .output()
            .unwrap_or_else(|e| panic!("run which: {e}"));
        let got: BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect();
        let want = rust_lines(&paths, pattern, flags);
        assert!(!want.is_empty(), "{pattern}: nothing found");
        assert_eq!(got, want, "{paths} {pattern} {flags}");
    }
    // The PATH lookup finds the executable in bin2, not the non-executable one in bin1.
    let out = Command::new(&exe)
        .args([
            path.as_str(),
            "/chmod",
            &(Flags::STOPATFIRST | Flags::X_OK | Flags::INCLUDEROOT)
                .0
                .to_string(),
        ])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("2 {tr}/bin2/chmod")));
    // Bad input: NULL result with errno, exit 2.
    for (p, pat) in [
        ("", "x"),
        (tr.as_str(), "a||b"),
        (&format!("{tr}/bin2/chmod") as &str, "x"),
    ] {
        let out = Command::new(&exe)
            .args([p, pat])
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(out.status.code(), Some(2), "{p} {pat}");
    }
}
