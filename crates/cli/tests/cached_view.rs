//! `dircache warm` and `dircache cached` on real mounts (the `dircache` binary, background
//! daemon): a warmed tree is walked by `find` and `du` without a FUSE request; `cached` shows a
//! listed directory as complete and a missed name as a negative entry, and forgets both after
//! a change made in SRC; it bounds its output; and it shows another user's names only to a
//! caller who could list them (the kernel's answer for that caller).

#[path = "../../fuse/tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::can_mount;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_dircache");
/// Longest wait for the change feed to reach the daemon (generous: CI is loaded).
const LIMIT: Duration = Duration::from_secs(20);

/// A background `dircache mount SRC MNT`, unmounted (and its daemon waited for) on drop.
struct Mounted {
    _dir: tempfile::TempDir,
    src: PathBuf,
    mnt: PathBuf,
    /// The daemon's control socket.
    socket: PathBuf,
}

impl Mounted {
    /// Mount a tree made by `fill` (in SRC) with `-o opts`. The temporary directory is 0755, so
    /// that other users can reach the mount.
    fn new(opts: &str, fill: impl FnOnce(&Path)) -> Mounted {
        Self::mount(false, opts, fill)
    }

    /// A remote mount of SRC (`localhost:SRC`) through a stand-in ssh that runs
    /// `dircache serve --stdio SRC` here (as crates/cli/tests/remote_mount.rs does).
    fn remote(fill: impl FnOnce(&Path)) -> Mounted {
        Self::mount(true, "", fill)
    }

    fn mount(remote: bool, opts: &str, fill: impl FnOnce(&Path)) -> Mounted {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let (src, mnt) = (dir.path().join("src"), dir.path().join("mnt"));
        std::fs::create_dir(&src).unwrap();
        std::fs::create_dir(&mnt).unwrap();
        fill(&src);
        let mut c = Command::new(BIN);
        c.arg("mount");
        if remote {
            let fake = dircache_tests::remote::stand_in_ssh(dir.path());
            c.arg(format!("localhost:{}", src.display())).arg(&mnt);
            c.arg("-o").arg(format!(
                "ssh_command={},serve_command={BIN}",
                fake.display()
            ));
        } else {
            c.arg(&src).arg(&mnt);
        }
        c.arg("-o")
            .arg(format!("log={}", dir.path().join("log").display()));
        if !opts.is_empty() {
            c.args(["-o", opts]);
        }
        let out = c.output().unwrap();
        assert!(
            out.status.success(),
            "mount: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let cfg = dircache_search::ClientConfig::default();
        let socket = dircache_search::proto::daemon_of_mount_root(&mnt, &cfg)
            .map(|d| d.socket)
            .unwrap_or_default();
        let m = Mounted {
            _dir: dir,
            src,
            mnt,
            socket,
        };
        assert!(m.socket.is_absolute(), "no control socket");
        m
    }

    /// The daemon's FUSE request counts by kind, asked on its socket directly (no getxattr
    /// of the mount root, so asking costs no request).
    fn requests(&self) -> BTreeMap<String, u64> {
        let v = dircache_fuse::stats::query(&self.socket, &serde_json::json!({"op": "stats"}))
            .expect("stats");
        let s = &v["stats"];
        let by_kind = s["kernel_requests"]["by_kind"].as_object().into_iter();
        let notifier = s["notifier"].as_object().into_iter();
        by_kind
            .flatten()
            .map(|(k, n)| (k.clone(), n.as_u64().unwrap_or(0)))
            .chain(
                notifier
                    .flatten()
                    .map(|(k, n)| (format!("notify_{k}"), n.as_u64().unwrap_or(0))),
            )
            .collect()
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new(BIN).arg("umount").arg(&self.mnt).status();
        if dircache_fuse::is_mount_point(&self.mnt) {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
    }
}

/// Run `BIN args` as `uid` (setpriv, no groups) or as root: (exit status, stdout, stderr).
fn dircache(uid: Option<u32>, args: &[&str]) -> (i32, String, String) {
    let out = match uid {
        Some(u) => Command::new("setpriv")
            .args([
                &format!("--reuid={u}"),
                &format!("--regid={u}"),
                "--clear-groups",
                BIN,
            ])
            .args(args)
            .output(),
        None => Command::new(BIN).args(args).output(),
    }
    .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `dircache cached MNT PATH --json ...` as root: the daemon's answer.
fn cached(m: &Mounted, path: &str, extra: &[&str]) -> Value {
    let mnt = m.mnt.to_str().unwrap();
    let path = if path.is_empty() { "." } else { path };
    let mut args = vec!["cached", mnt, path, "--json"];
    args.extend_from_slice(extra);
    let (code, out, err) = dircache(None, &args);
    assert_eq!(code, 0, "cached {path}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// The entry for directory `path` in a `cached` answer.
fn dir_of<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    v["dirs"]
        .as_array()?
        .iter()
        .find(|d| d["path"].as_str() == Some(path))
}

fn negatives(d: &Value) -> Vec<String> {
    d["negatives"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n.as_str().map(str::to_string))
        .collect()
}

/// /proc/vmstat's counts of what makes the kernel drop cached dentries and inodes
/// (drop_caches, reclaim): a measured run during which they moved is run again.
fn drops() -> Vec<u64> {
    let s = std::fs::read_to_string("/proc/vmstat").unwrap_or_default();
    [
        "drop_pagecache ",
        "drop_slab ",
        "pgscan_kswapd ",
        "pgscan_direct ",
        "slabs_scanned ",
    ]
    .iter()
    .map(|k| {
        s.lines()
            .find_map(|l| l.strip_prefix(k).map(|v| v.trim().parse().unwrap_or(0)))
            .unwrap_or(0)
    })
    .collect()
}

fn tree(src: &Path) {
    for a in 0..4 {
        for b in 0..4 {
            let d = src.join(format!("a{a}/b{b}"));
            std::fs::create_dir_all(&d).unwrap();
            for f in 0..8 {
                std::fs::write(d.join(format!("f{f}.c")), b"int x;\n").unwrap();
            }
            std::os::unix::fs::symlink("f0.c", d.join("link")).unwrap();
        }
    }
}

fn run(cmd: &str, arg: &Path) -> String {
    let out = Command::new(cmd).arg(arg).output().unwrap();
    assert!(out.status.success(), "{cmd}: {:?}", out);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn warm_then_find_and_du_send_no_requests() {
    if !can_mount() {
        return;
    }
    // With lookahead (the default): its reads of a directory through the mount refresh the
    // kernel's atime of it after reading (`fuse_readdir` marks it stale; the next `stat` was
    // one GETATTR, 1-4 per run in 3 of 6 runs before).
    let m = Mounted::new("lookahead", tree);
    let mnt = m.mnt.to_str().unwrap();
    // From before the warm: a drop between the warm and the measured walk leaves the kernel
    // cold as well (its FORGETs arrive later).
    let mut d0 = drops();
    let (code, out, err) = dircache(None, &["warm", mnt, "--json"]);
    assert_eq!(code, 0, "warm: {err}");
    let s: Value = serde_json::from_str(&out).unwrap();
    // 1 root + 4 + 16 directories, 128 files, 16 symlinks: what the walk saw.
    assert_eq!(s["dirs"], 21, "{s}");
    assert_eq!(s["files"], 128, "{s}");
    assert_eq!(s["symlinks"], 16, "{s}");
    assert!(s["fuse_requests"].as_u64().unwrap() > 0, "{s}");
    assert!(s["entries_cached"].as_u64().unwrap() >= 165, "{s}");
    let native = (
        run("find", &m.src).lines().count(),
        run("du", &m.src).lines().count(),
    );
    // `find` and `du` (gnulib fts) call fstatfs once each: the kernel caches no statfs, so
    // STATFS is the one request a warm walk cannot save.
    for attempt in 0.. {
        let before = m.requests();
        let walked = (
            run("find", &m.mnt).lines().count(),
            run("du", &m.mnt).lines().count(),
        );
        let after = m.requests();
        assert_eq!(walked, native);
        let sent: BTreeMap<_, _> = after
            .iter()
            .filter(|(k, _)| k.as_str() != "statfs" && !k.starts_with("notify_"))
            .map(|(k, n)| (k.clone(), n - before.get(k).copied().unwrap_or(0)))
            .filter(|(_, n)| *n > 0)
            .collect();
        if sent.is_empty() {
            break;
        }
        // The kernel dropped its caches meanwhile (another process, memory pressure): warm
        // again and measure again.
        let notified: BTreeMap<_, _> = after
            .iter()
            .filter(|(k, n)| k.starts_with("notify_") && before.get(*k) != Some(n))
            .collect();
        assert!(
            d0 != drops() && attempt < 30,
            "find and du after warm sent FUSE requests: {sent:?} (the daemon's notifier \
             meanwhile: {notified:?}; /proc/vmstat drops {d0:?} -> {:?})",
            drops()
        );
        d0 = drops();
        let (code, _, err) = dircache(None, &["warm", mnt]);
        assert_eq!(code, 0, "warm: {err}");
    }
    // A second warm finds everything cached: it costs no request either.
    let (code, out, err) = dircache(None, &["warm", mnt, "a1", "--json"]);
    assert_eq!(code, 0, "warm a1: {err}");
    let s: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(s["dirs"], 5, "{s}");
    // Bad input: a path outside the mount, a file, not a dircache mount.
    assert_eq!(dircache(None, &["warm", mnt, "../x"]).0, 2);
    assert_eq!(dircache(None, &["warm", mnt, "a0/b0/f0.c"]).0, 2);
    assert_eq!(
        dircache(None, &["warm", m.src.to_str().unwrap()]).0,
        2,
        "SRC is not a mount"
    );
}

#[test]
fn cached_shows_listings_and_negatives_and_forgets_them_after_changes() {
    if !can_mount() {
        return;
    }
    // No prefetch: nothing lists a directory but the test.
    let m = Mounted::new("noprefetch", |src| {
        std::fs::create_dir_all(src.join("d")).unwrap();
        for n in ["a", "b", "c"] {
            std::fs::write(src.join("d").join(n), b"x").unwrap();
        }
        std::os::unix::fs::symlink("a", src.join("d/l")).unwrap();
        std::fs::create_dir_all(src.join("e")).unwrap();
        std::fs::create_dir_all(src.join("many")).unwrap();
    });
    assert_eq!(std::fs::read_dir(m.mnt.join("d")).unwrap().count(), 4);
    let e = std::fs::symlink_metadata(m.mnt.join("e/missing")).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    for i in 0..50 {
        let _ = std::fs::symlink_metadata(m.mnt.join(format!("many/m{i:02}")));
    }

    let v = cached(&m, "d", &[]);
    let d = dir_of(&v, "d").unwrap_or_else(|| panic!("d: {v}"));
    assert_eq!(d["complete"], true, "{v}");
    assert_eq!(
        (&d["positive"], &d["files"], &d["symlinks"]),
        (&Value::from(4), &Value::from(3), &Value::from(1)),
        "{v}"
    );
    let v = cached(&m, "e", &[]);
    let e = dir_of(&v, "e").unwrap_or_else(|| panic!("e: {v}"));
    assert_eq!(negatives(e), ["missing"], "{v}");
    // From the root: both directories, totals over them.
    let v = cached(&m, "", &[]);
    assert!(
        dir_of(&v, "d").is_some() && dir_of(&v, "e").is_some(),
        "{v}"
    );
    assert!(v["totals"]["negatives"].as_u64().unwrap() >= 51, "{v}");
    // The text view says the same.
    let (code, text, err) = dircache(None, &["cached", m.mnt.to_str().unwrap(), "e"]);
    assert_eq!(code, 0, "{err}");
    assert!(text.contains("1 negative: missing"), "{text}");

    // Bounded output: 5 names, then "…45 more".
    let v = cached(&m, "many", &["--max-names", "5"]);
    let many = dir_of(&v, "many").unwrap();
    assert_eq!(negatives(many), ["m00", "m01", "m02", "m03", "m04"], "{v}");
    assert_eq!(many["more_negatives"], 45, "{v}");
    let (_, text, _) = dircache(
        None,
        &[
            "cached",
            m.mnt.to_str().unwrap(),
            "many",
            "--max-names",
            "5",
        ],
    );
    assert!(text.contains("m04 …45 more"), "{text}");
    let v = cached(&m, "", &["--max-dirs", "1"]);
    assert_eq!(v["dirs"].as_array().unwrap().len(), 1, "{v}");
    assert!(v["more_dirs"].as_u64().unwrap() >= 3, "{v}");

    // Changes in SRC (behind the mount's back): the feed makes the cache forget both.
    std::fs::write(m.src.join("d/new"), b"y").unwrap();
    std::fs::write(m.src.join("e/missing"), b"z").unwrap();
    let t0 = Instant::now();
    loop {
        let d = cached(&m, "d", &[]);
        let e = cached(&m, "e", &[]);
        let d_complete = dir_of(&d, "d").map(|x| x["complete"] == true);
        let e_negs = dir_of(&e, "e").map(negatives).unwrap_or_default();
        if d_complete == Some(false) && e_negs.is_empty() {
            break;
        }
        assert!(
            t0.elapsed() < LIMIT,
            "not forgotten within {LIMIT:?}: d {d}, e {e}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // And the mount shows the new state.
    assert_eq!(std::fs::read_dir(m.mnt.join("d")).unwrap().count(), 5);
    assert!(m.mnt.join("e/missing").exists());
    // Not a directory, not cached, outside the mount.
    let (code, _, err) = dircache(None, &["cached", m.mnt.to_str().unwrap(), "d/a"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("not a directory"), "{err}");
    let v = cached(&m, "nowhere", &[]);
    assert_eq!(v["cached"], false, "{v}");
    assert_eq!(
        dircache(None, &["cached", m.mnt.to_str().unwrap(), "../x"]).0,
        2
    );
}

/// The attack: user B asks the daemon what it caches in user A's 0700 directory, which root
/// listed (so the cache holds its names). B must learn no name there, as `ls` as B does not;
/// A, who may list it, sees them.
#[test]
fn cached_shows_no_names_to_a_user_who_cannot_list() {
    if !can_mount() {
        return;
    }
    no_names_for_a_user_who_cannot_list(false, false);
}

/// The same on a remote mount, where the core's access policy decides (mode bits of the
/// attributes the server reported, as the client kernel's `default_permissions` does).
#[test]
fn cached_on_a_remote_mount_shows_no_names_to_a_user_who_cannot_list() {
    if !can_mount() {
        return;
    }
    no_names_for_a_user_who_cannot_list(true, false);
}

/// The same attack where mode bits allow and a POSIX ACL on the server denies B (`u:B:---`
/// on 0755 directories): the client kernel applies the ACL, so must `cached` (the core's
/// policy alone reads mode bits: with the ACL check removed B got the names).
#[test]
fn cached_on_a_remote_mount_follows_the_servers_acls() {
    if !can_mount() {
        return;
    }
    no_names_for_a_user_who_cannot_list(true, true);
}

/// The same ACL attack on a local mount (the kernel decides there).
#[test]
fn cached_follows_acls_on_a_local_mount() {
    if !can_mount() {
        return;
    }
    no_names_for_a_user_who_cannot_list(false, true);
}

/// `acl`: A's directories are 0755 with an ACL entry denying B everything, instead of 0700.
fn no_names_for_a_user_who_cannot_list(remote: bool, acl: bool) {
    const A: u32 = 1000;
    const B: u32 = 1001;
    let fill = |src: &Path| {
        let p = src.join("private");
        std::fs::create_dir_all(p.join("inner")).unwrap();
        std::fs::write(p.join("secret-a"), b"x").unwrap();
        std::fs::write(p.join("inner/secret-b"), b"x").unwrap();
        std::fs::create_dir(src.join("open")).unwrap();
        std::fs::write(src.join("open/public"), b"x").unwrap();
        for q in [&p, &p.join("inner")] {
            std::os::unix::fs::chown(q, Some(A), Some(A)).unwrap();
            let mode = if acl { 0o755 } else { 0o700 };
            std::fs::set_permissions(q, std::fs::Permissions::from_mode(mode)).unwrap();
            if acl {
                let st = Command::new("setfacl")
                    .args(["-m", &format!("u:{B}:---")])
                    .arg(q)
                    .status()
                    .expect("setfacl");
                assert!(st.success(), "setfacl");
            }
        }
    };
    let m = if remote {
        Mounted::remote(fill)
    } else {
        Mounted::new("", fill)
    };
    let mnt = m.mnt.to_str().unwrap();
    // Root fills the cache: listings and negatives inside A's directory.
    assert_eq!(std::fs::read_dir(m.mnt.join("private")).unwrap().count(), 2);
    assert_eq!(
        std::fs::read_dir(m.mnt.join("private/inner"))
            .unwrap()
            .count(),
        1
    );
    assert!(!m.mnt.join("private/ghost-name").exists());
    assert!(!m.mnt.join("private/inner/ghost-deep").exists());
    assert_eq!(std::fs::read_dir(m.mnt.join("open")).unwrap().count(), 1);
    assert!(!m.mnt.join("open/nope").exists());
    let secrets = ["secret", "ghost", "inner"];

    // The kernel's answer for B: no listing.
    let ls = Command::new("setpriv")
        .args([
            &format!("--reuid={B}"),
            &format!("--regid={B}"),
            "--clear-groups",
        ])
        .args(["ls", "-a"])
        .arg(m.mnt.join("private"))
        .output()
        .unwrap();
    assert!(!ls.status.success());
    assert!(
        String::from_utf8_lossy(&ls.stderr).contains("Permission denied"),
        "{ls:?}"
    );

    // B asks the daemon: the same refusal, no name.
    for path in ["private", "private/inner"] {
        let (code, out, err) = dircache(Some(B), &["cached", mnt, path, "--json"]);
        assert_ne!(code, 0, "B got {path}: {out}");
        assert!(err.contains("permission denied"), "{path}: {err}");
        // (The error names the path B typed, nothing more.)
        for s in secrets {
            assert!(!out.contains(s), "{path}: {out}");
        }
        assert!(!err.contains("secret") && !err.contains("ghost"), "{err}");
    }
    // From the root: `private` is named (B may list the root) but marked denied, with nothing
    // about its contents; `open` is shown with its negative.
    let (code, out, err) = dircache(Some(B), &["cached", mnt, "--json"]);
    assert_eq!(code, 0, "{err}");
    for s in secrets {
        assert!(!out.contains(s), "B sees {s:?}: {out}");
    }
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(dir_of(&v, "private").unwrap()["denied"], true, "{v}");
    assert_eq!(negatives(dir_of(&v, "open").unwrap()), ["nope"], "{v}");
    let (_, text, _) = dircache(Some(B), &["cached", mnt]);
    assert!(text.contains("private: not shown"), "{text}");
    for s in secrets {
        assert!(!text.contains(s), "B sees {s:?}: {text}");
    }

    // A may list both: A sees the negatives (names) and counts.
    let (code, out, err) = dircache(Some(A), &["cached", mnt, "private", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(negatives(dir_of(&v, "private").unwrap()), ["ghost-name"]);
    assert_eq!(
        negatives(dir_of(&v, "private/inner").unwrap()),
        ["ghost-deep"]
    );
    // Root sees everything.
    let v = cached(&m, "", &[]);
    assert_eq!(negatives(dir_of(&v, "private").unwrap()), ["ghost-name"]);
}
