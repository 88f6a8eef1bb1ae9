//! A cold `git status` on a remote mount (`dircache mount localhost:SRC MNT` through the
//! stand-in ssh of crates/tests/src/remote.rs, `dircache serve --stdio SRC` as a child): git
//! creates `.git/index.lock` at its start and removes or renames it at its end, while the
//! mount's bulk call for the whole tree is still streaming. Those mutations drop only what
//! they can make stale (crates/remote/src/prefetch.rs), so the whole-tree bulk call is not
//! started again (before: every mutation ended it and emptied the buffer, and git's
//! untracked-files pass started `Subtree` calls for the whole tree again). The answer is
//! checked against git on the server's tree.

#[path = "../../fuse/tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::process::Command;

use common::can_mount;
use dircache_tests::remote::Remote;

fn git(dir: &Path, args: &[&str]) -> String {
    let o = Command::new("git")
        .args(["-c", "user.email=t@t", "-c", "user.name=t"])
        .args(args)
        .current_dir(dir)
        .output()
        .expect("git");
    assert!(
        o.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).expect("utf-8")
}

/// 100 directories of 5 subdirectories of 8 files (4,600 entries) committed, five untracked
/// files and one modified.
fn repo(src: &Path) {
    git(src, &["init", "-q", "."]);
    for a in 0..100 {
        for b in 0..5 {
            let d = src.join(format!("d{a:02}/s{b}"));
            std::fs::create_dir_all(&d).unwrap();
            for f in 0..8 {
                std::fs::write(d.join(format!("f{f}.c")), format!("{a} {b} {f}\n")).unwrap();
            }
        }
    }
    git(src, &["add", "-A"]);
    git(src, &["commit", "-qm", "tree"]);
    for u in 0..5 {
        std::fs::write(src.join(format!("d{u:02}/untracked{u}")), b"u").unwrap();
    }
    std::fs::write(src.join("d50/s2/f3.c"), b"changed\n").unwrap();
}

#[test]
fn a_cold_git_status_does_not_fetch_the_tree_again() {
    if !can_mount() {
        return;
    }
    let remote = Remote::new();
    repo(&remote.src);
    let want = git(&remote.src, &["status", "--porcelain"]);
    assert_eq!(want.lines().count(), 6, "{want}");
    let c = remote.mount("", "");
    let got = git(&c.mnt, &["status", "--porcelain"]);
    assert_eq!(got, want, "git status on the mount vs on the server");
    let subtree = c.calls("Subtree");
    let all = c.calls("");
    eprintln!("{subtree} Subtree calls, {all} calls in all");
    // The mount's own bulk call for the whole tree, and two small ones for the listings
    // git's index.lock made stale (`.git`, and the root's with the next budget, 2,048: the
    // rest of the tree stays from the first call). Before: 5-6 (the whole tree again with
    // growing budgets, its listings dropped by every mutation).
    assert!(
        subtree <= 3,
        "{subtree} Subtree calls for a cold git status:\n{}",
        c.log_text()
            .lines()
            .filter(|l| l.contains("remote call") && l.contains("Subtree"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // And again, warm: the answer is still right.
    assert_eq!(git(&c.mnt, &["status", "--porcelain"]), want);
    drop(c);
}
