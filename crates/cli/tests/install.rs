//! `dircache install` into a temporary prefix: the binary runs, the mount helper mounts with
//! the installed binary, man pages are valid roff for every command, the bash completion
//! completes subcommands and options, zsh and fish scripts are there; bad input is status 2.

#[path = "../../fuse/tests/common/mod.rs"]
mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_dircache");

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// What bash completes for the words `line` (the last word is being completed).
fn bash_complete(script: &Path, line: &str) -> Vec<String> {
    let words: Vec<&str> = line.split(' ').collect();
    let prog = format!(
        "source {}; COMP_WORDS=({}); COMP_CWORD={}; COMP_LINE='{line}'; COMP_POINT={}; \
         _dircache dircache '{}' '{}'; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        script.display(),
        words
            .iter()
            .map(|w| format!("'{w}'"))
            .collect::<Vec<_>>()
            .join(" "),
        words.len() - 1,
        line.len(),
        words[words.len() - 1],
        words[words.len() - 2],
    );
    let out = Command::new("bash").arg("-c").arg(&prog).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

/// `dircache install --prefix DIR/usr --sbindir DIR/sbin`, which must succeed: the two
/// directories.
fn install_into(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let (prefix, sbin) = (dir.join("usr"), dir.join("sbin"));
    let out = Command::new(BIN)
        .args(["install", "--prefix"])
        .arg(&prefix)
        .arg("--sbindir")
        .arg(&sbin)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (prefix, sbin)
}

#[test]
fn install_into_a_prefix_gives_binary_helper_man_pages_and_completions() {
    let d = tempfile::tempdir().unwrap();
    let (prefix, sbin) = install_into(d.path());

    let bin = prefix.join("bin/dircache");
    assert_eq!(mode(&bin), 0o755);
    let v = Command::new(&bin).arg("--version").output().unwrap();
    assert!(String::from_utf8_lossy(&v.stdout).starts_with("dircache "));

    let helper = sbin.join("mount.fuse.dircache");
    assert_eq!(mode(&helper), 0o755);
    let text = std::fs::read_to_string(&helper).unwrap();
    assert!(
        text.contains(&format!("bin=${{DIRCACHE_BIN:-{}}}", bin.display())),
        "the helper does not run the installed binary:\n{text}"
    );
    assert!(Command::new("sh")
        .arg("-n")
        .arg(&helper)
        .status()
        .unwrap()
        .success());

    let man = prefix.join("share/man/man1");
    for (page, says) in [
        ("dircache.1", "umount"),
        ("dircache-mount.1", "Mount options"),
        ("dircache-umount.1", "lazy"),
        ("dircache-search.1", "ls \\-l"),
        ("dircache-bench-apps.1", ".TH"),
    ] {
        let p = man.join(page);
        assert_eq!(mode(&p), 0o644, "{page}");
        let roff = std::fs::read_to_string(&p).unwrap();
        assert!(
            roff.starts_with(".ie") || roff.contains("\n.TH "),
            "{page} is not a man page"
        );
        assert!(roff.contains(says), "{page} lacks {says:?}");
    }
    assert!(
        !man.join("dircache-delay-proxy.1").exists(),
        "hidden tooling got a man page"
    );
    assert!(!man.join("dircache-help.1").exists());

    let bash = prefix.join("share/bash-completion/completions/dircache");
    let subs = bash_complete(&bash, "dircache um");
    assert_eq!(subs, ["umount"], "bash completion of `dircache um`");
    let opts = bash_complete(&bash, "dircache umount --l");
    assert_eq!(opts, ["--lazy"]);
    let zsh = std::fs::read_to_string(prefix.join("share/zsh/site-functions/_dircache")).unwrap();
    assert!(
        zsh.starts_with("#compdef dircache"),
        "{}",
        &zsh[..40.min(zsh.len())]
    );
    let fish =
        std::fs::read_to_string(prefix.join("share/fish/vendor_completions.d/dircache.fish"))
            .unwrap();
    assert!(fish.contains("complete -c dircache"));
}

/// The installed helper mounts with the installed binary (as mount(8) would run it).
#[test]
fn the_installed_helper_mounts_through_the_installed_binary() {
    if !common::can_mount() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let (prefix, sbin) = install_into(d.path());
    let (src, mnt) = (d.path().join("src"), d.path().join("mnt"));
    std::fs::create_dir_all(src.join("a")).unwrap();
    std::fs::write(src.join("a/f"), b"hello").unwrap();
    std::fs::create_dir(&mnt).unwrap();
    let out = Command::new(sbin.join("mount.fuse.dircache"))
        .arg(&src)
        .arg(&mnt)
        .args(["-o", "ro,nosuid,nodev"])
        .env_remove("DIRCACHE_BIN")
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    let mounted = dircache_fuse::is_mount_point(&mnt);
    let read = std::fs::read(mnt.join("a/f"));
    let um = Command::new(prefix.join("bin/dircache"))
        .arg("umount")
        .arg(&mnt)
        .output()
        .unwrap();
    if dircache_fuse::is_mount_point(&mnt) {
        let _ = Command::new("umount").arg("-l").arg(&mnt).status();
    }
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(mounted);
    assert_eq!(read.unwrap(), b"hello");
    assert!(
        um.status.success(),
        "{}",
        String::from_utf8_lossy(&um.stderr)
    );
}

#[test]
fn install_refuses_bad_input_and_dry_run_writes_nothing() {
    let d = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["install", "--prefix", "relative/path", "--destdir"])
        .arg(d.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("absolute"));

    let out = Command::new(BIN)
        .args(["install", "--dry-run", "--destdir"])
        .arg(d.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("would install"));
    assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);

    let out = Command::new(BIN)
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}
