//! What the CLI prints and leaves behind: `dircache search --stat` lines against `ls -ld` (the
//! oracle), and `dircache demo` removing its tree unless `--keep`.

#[path = "../../fuse/tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::process::Command;

use common::{can_mount, cannot_run};

const BIN: &str = env!("CARGO_BIN_EXE_dircache");

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn sh(script: &str) {
    let st = Command::new("sh").arg("-c").arg(script).status().unwrap();
    assert!(st.success(), "{script}");
}

/// Every `--stat` line has the fields `ls -ld` prints for that file (mode with set-id and
/// sticky bits, links, owner and group names or numbers, size or device numbers, local
/// date in ls's recent/old formats), in the same order.
#[test]
fn search_stat_lines_are_ls_l_lines() {
    if !is_root() {
        cannot_run("needs root (chown to an unnamed uid, mknod)");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let r = d.path().display().to_string();
    sh(&format!(
        "cd {r} && mkdir -p sticky.x && chmod 1777 sticky.x && echo hello > plain.x && \
         cp plain.x suid.x && chmod 4755 suid.x && cp plain.x sgid.x && chmod 2640 sgid.x && \
         echo old > old.x && touch -d 2019-03-04T05:06:07 old.x && \
         echo future > future.x && touch -d 2099-01-01 future.x && \
         echo nobody > owned.x && chown 54321:54322 owned.x && \
         ln -s plain.x link.x && mkfifo fifo.x && mknod chr.x c 1 3 && ln plain.x hard.x"
    ));
    let out = Command::new(BIN)
        .args(["search", "--stat", "--no-delegate", &r, "*.x"])
        .env("LC_ALL", "C")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut seen = 0;
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let name = fields.last().unwrap();
        let ls = Command::new("ls")
            .args(["-ld", name])
            .current_dir(d.path())
            .env("LC_ALL", "C")
            .output()
            .unwrap();
        let ls = String::from_utf8(ls.stdout).unwrap();
        let mut want: Vec<&str> = ls.split_whitespace().collect();
        if let Some(arrow) = want.iter().position(|f| *f == "->") {
            want.truncate(arrow); // ls shows a symlink's target; search does not
        }
        assert_eq!(fields, want, "search: {line}\nls:     {ls}");
        seen += 1;
    }
    assert_eq!(seen, 11, "{text}");
}

fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

fn no_mount_under(dir: &Path) {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    let d = dir.display().to_string();
    assert!(!mounts.contains(&d), "a mount is left under {d}:\n{mounts}");
}

/// `dircache demo` unmounts and removes its tree (by default in $TMPDIR), keeps it with
/// `--keep`, and with `--dir` removes only what it created there.
#[test]
fn demo_removes_its_tree_unless_kept() {
    if !can_mount() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let demo = |args: &[&str]| {
        let out = Command::new(BIN)
            .arg("demo")
            .args(args)
            .env("TMPDIR", tmp.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let out = demo(&[]);
    assert!(out.contains("ratio"), "{out}");
    no_mount_under(tmp.path());
    assert_eq!(entries(tmp.path()), Vec::<String>::new(), "{out}");

    demo(&["--keep"]);
    no_mount_under(tmp.path());
    let kept = entries(tmp.path());
    assert_eq!(kept.len(), 1, "{kept:?}");
    let base = tmp.path().join(&kept[0]);
    assert!(base.join("src-tree/include/sys/types.h").is_file());
    std::fs::remove_dir_all(&base).unwrap();

    let own = tmp.path().join("mine");
    std::fs::create_dir(&own).unwrap();
    std::fs::write(own.join("precious"), b"keep me").unwrap();
    demo(&["--dir", own.to_str().unwrap()]);
    no_mount_under(tmp.path());
    assert_eq!(entries(&own), ["precious"]);
}
