//! The `dircache mount` / `dircache stats` commands, as users run them.

mod common;
use common::*;
use std::process::{Command, Stdio};
use std::time::Duration;

fn run(args: &[&str]) -> std::process::Output {
    Command::new(dircache_bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("dircache")
}

#[test]
fn bad_input_exits_2_with_one_line() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    let mnt = d.path().join("mnt");
    let file = d.path().join("file");
    std::fs::create_dir(&src).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    std::fs::write(&file, b"x").unwrap();
    let (s, m, f) = (
        src.to_str().unwrap(),
        mnt.to_str().unwrap(),
        file.to_str().unwrap(),
    );
    let missing = d.path().join("missing");
    let missing = missing.to_str().unwrap();
    for args in [
        vec!["mount", missing, m],
        vec!["mount", f, m],
        vec!["mount", s, missing],
        vec!["mount", s, f],
        vec!["mount", s, "/proc"],
        vec!["mount", s, m, "-o", "frobnicate"],
        vec!["mount", s, m, "-o", "threads=many"],
        vec!["stats", m],
    ] {
        let o = run(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    }
    if can_mount() {
        // Not enough privilege.
        let o = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(dircache_bin())
            .args(["mount", s, m])
            .output()
            .unwrap();
        assert_eq!(
            o.status.code(),
            Some(2),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let o = run(&["mount", "--help"]);
    let help = String::from_utf8_lossy(&o.stdout);
    for opt in [
        "entry_timeout",
        "negative_timeout",
        "passthrough",
        "threads",
        "allow_other",
        "cache=",
    ] {
        assert!(help.contains(opt), "--help lacks {opt}");
    }
}

fn mounted(p: &std::path::Path) -> bool {
    dircache_fuse::is_mount_point(p)
}

#[test]
fn background_mount_stats_and_sigterm() {
    if !can_mount() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let (src, mnt) = (d.path().join("src"), d.path().join("mnt"));
    std::fs::create_dir(&src).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    std::fs::write(src.join("hello"), b"hi").unwrap();
    let sock = d.path().join("ctl.sock");
    let o = run(&[
        "mount",
        src.to_str().unwrap(),
        mnt.to_str().unwrap(),
        "-o",
        &format!("socket={}", sock.display()),
    ]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // The parent returned once the mount was up.
    let _guard = ChildGuard(None, Some(mnt.clone()));
    assert!(mounted(&mnt));
    assert_eq!(std::fs::read(mnt.join("hello")).unwrap(), b"hi");
    // Mounting again on it is refused.
    let again = run(&["mount", src.to_str().unwrap(), mnt.to_str().unwrap()]);
    assert_eq!(again.status.code(), Some(2));
    // Stats, human and JSON.
    let s = run(&["stats", mnt.to_str().unwrap()]);
    assert!(s.status.success(), "{}", String::from_utf8_lossy(&s.stderr));
    assert!(String::from_utf8_lossy(&s.stdout).contains("kernel requests"));
    assert!(String::from_utf8_lossy(&s.stdout).contains("prefetch:"));
    let j = run(&["stats", "--json", mnt.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&j.stdout).expect("json");
    assert!(v["prefetch"]["listings"].is_u64(), "{v}");
    assert!(
        v["kernel_requests"]["by_kind"]["lookup"]
            .as_u64()
            .unwrap_or(0)
            >= 1,
        "{v}"
    );
    let pid = v["pid"].as_u64().expect("pid") as i32;
    // SIGTERM unmounts cleanly and the daemon exits.
    // SAFETY: sending a signal to the daemon this test started.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    assert!(
        wait_for(Duration::from_secs(5), || !mounted(&mnt)).is_some(),
        "still mounted after SIGTERM"
    );
    // SAFETY: probing the pid with signal 0.
    assert!(
        wait_for(Duration::from_secs(5), || unsafe { libc::kill(pid, 0) }
            != 0)
        .is_some(),
        "daemon alive"
    );
}

#[test]
fn foreground_and_external_umount() {
    if !can_mount() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let (src, mnt) = (d.path().join("src"), d.path().join("mnt"));
    std::fs::create_dir(&src).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    let child = Command::new(dircache_bin())
        .args(["mount", "-f", src.to_str().unwrap(), mnt.to_str().unwrap()])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let mut g = ChildGuard(Some(child), Some(mnt.clone()));
    assert!(wait_for(Duration::from_secs(10), || mounted(&mnt)).is_some());
    std::fs::write(mnt.join("f"), b"x").unwrap();
    assert_eq!(std::fs::read(src.join("f")).unwrap(), b"x");
    let st = Command::new("umount").arg(&mnt).status().unwrap();
    assert!(st.success());
    let c = g.0.as_mut().unwrap();
    let exited = wait_for(Duration::from_secs(5), || {
        matches!(c.try_wait(), Ok(Some(_)))
    });
    assert!(exited.is_some(), "daemon did not exit after umount");
}

#[test]
fn mount_t_fuse_dircache_helper() {
    if !can_mount() {
        return;
    }
    // Installed for this test and the others of this file that use it (they run in parallel).
    let _h = Helper::install();
    let d = tempfile::tempdir().unwrap();
    let (src, mnt) = (d.path().join("src"), d.path().join("mnt"));
    std::fs::create_dir(&src).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    std::fs::write(src.join("x"), b"1").unwrap();
    let o = Command::new("mount")
        .args(["-t", "fuse.dircache", "-o", "nosuid,noatime"])
        .arg(&src)
        .arg(&mnt)
        .env("DIRCACHE_BIN", dircache_bin())
        .output()
        .unwrap();
    let _guard = ChildGuard(None, Some(mnt.clone()));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(mounted(&mnt));
    assert_eq!(std::fs::read(mnt.join("x")).unwrap(), b"1");
    let info = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(
        info.lines()
            .any(|l| l.contains(mnt.to_str().unwrap()) && l.contains("fuse.dircache")),
        "{info}"
    );
    assert!(Command::new("umount").arg(&mnt).status().unwrap().success());
    assert!(wait_for(Duration::from_secs(5), || !mounted(&mnt)).is_some());
}

// ---- Mount options as mount(8) and fstab hand them (issue 7, findings 13 and 21) ----

/// One /proc/self/mountinfo line: per-mount options, type, source, super options.
#[derive(Debug)]
struct MountInfo {
    opts: Vec<String>,
    fstype: String,
    source: String,
    super_opts: Vec<String>,
}

impl MountInfo {
    fn has(&self, o: &str) -> bool {
        self.opts.iter().any(|x| x == o)
    }
    fn has_super(&self, o: &str) -> bool {
        self.super_opts.iter().any(|x| x == o)
    }
}

fn mountinfo(mnt: &std::path::Path) -> Option<MountInfo> {
    let info = std::fs::read("/proc/self/mountinfo").unwrap();
    let want = mnt.as_os_str().as_encoded_bytes();
    let mut found = None;
    for line in info.split(|b| *b == b'\n') {
        let f: Vec<String> = line
            .split(|b| *b == b' ')
            .map(|x| String::from_utf8_lossy(&dircache_fuse::unescape_mountinfo(x)).into_owned())
            .collect();
        if f.len() < 10 || f[4].as_bytes() != want {
            continue;
        }
        let dash = f.iter().position(|x| x == "-")?;
        found = Some(MountInfo {
            opts: f[5].split(',').map(str::to_string).collect(),
            fstype: f[dash + 1].clone(),
            source: f[dash + 2].clone(),
            super_opts: f[dash + 3].split(',').map(str::to_string).collect(),
        });
    }
    found
}

/// Unmounts (lazily) whatever is mounted on the path at the end, also a dead FUSE mount that
/// `is_mount_point` cannot see (its root answers ENOTCONN).
struct Umount(std::path::PathBuf);

impl Drop for Umount {
    fn drop(&mut self) {
        for _ in 0..3 {
            if mountinfo(&self.0).is_none() {
                break;
            }
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

/// `/sbin/mount.fuse.dircache` installed from this tree while alive (shared by the tests of
/// this file, which run in parallel); removed (or the previous content restored) by the last.
struct Helper;

static HELPER: std::sync::Mutex<(usize, Option<Option<Vec<u8>>>)> =
    std::sync::Mutex::new((0, None));
const HELPER_PATH: &str = "/sbin/mount.fuse.dircache";

impl Helper {
    fn install() -> Helper {
        let mut g = HELPER.lock().unwrap_or_else(|e| e.into_inner());
        if g.0 == 0 {
            let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("scripts/mount.fuse.dircache");
            let ours = std::fs::read(&script).unwrap();
            let before = std::fs::read(HELPER_PATH).ok();
            if before.as_deref() != Some(&ours[..]) {
                std::fs::write(HELPER_PATH, &ours).unwrap();
                chmod(std::path::Path::new(HELPER_PATH), 0o755);
                g.1 = Some(before);
            } else {
                g.1 = None;
            }
        }
        g.0 += 1;
        Helper
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        let mut g = HELPER.lock().unwrap_or_else(|e| e.into_inner());
        g.0 -= 1;
        if g.0 == 0 {
            match g.1.take() {
                Some(Some(prev)) => {
                    let _ = std::fs::write(HELPER_PATH, prev);
                }
                Some(None) => {
                    let _ = std::fs::remove_file(HELPER_PATH);
                }
                None => {}
            }
        }
    }
}

/// `mount(8)` with the helper, as root.
fn mount8(args: &[&str]) -> std::process::Output {
    Command::new("mount")
        .args(args)
        .env("DIRCACHE_BIN", dircache_bin())
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn assert_ok(o: &std::process::Output, what: &str) {
    assert!(
        o.status.success(),
        "{what}: {} {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
}

fn assert_usage(o: &std::process::Output, what: &str, mention: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{what}: {err}");
    assert_eq!(err.lines().count(), 1, "{what}: {err}");
    assert!(!err.contains("panicked"), "{what}: {err}");
    assert!(err.contains(mention), "{what}: {err:?} lacks {mention:?}");
}

fn src_mnt(d: &tempfile::TempDir) -> (std::path::PathBuf, std::path::PathBuf) {
    let (src, mnt) = (d.path().join("src"), d.path().join("mnt"));
    std::fs::create_dir(&src).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    chmod(d.path(), 0o755);
    (src, mnt)
}

#[test]
fn bad_option_values_exit_2_naming_the_option() {
    let d = tempfile::tempdir().unwrap();
    let (_src, mnt) = src_mnt(&d);
    let _u = Umount(mnt.clone());
    // A missing SRC: every mistake in the options must be reported first, naming the option.
    let missing = d.path().join("missing");
    let (s, m) = (missing.to_str().unwrap(), mnt.to_str().unwrap());
    let long = format!("socket=/{}", "s".repeat(200));
    for (opt, mention) in [
        ("entry_timeout=1e300", "entry_timeout"),
        ("attr_timeout=1e20", "attr_timeout"),
        ("negative_timeout=-1", "negative_timeout"),
        ("entry_timeout=nan", "entry_timeout"),
        ("attr_timeout=inf", "attr_timeout"),
        ("entry_timeout=", "entry_timeout"),
        ("negative_timeout=400000000", "negative_timeout"),
        ("threads=99999999999", "threads"),
        ("threads=100000", "threads"),
        ("socket=", "socket"),
        ("socket=rel/x.sock", "socket"),
        (long.as_str(), "socket"),
        ("fsname=", "fsname"),
        ("subtype=other", "subtype"),
        ("context=system_u:object_r:tmp_t:s0", "SELinux"),
    ] {
        let o = run(&["mount", s, m, "-o", opt]);
        assert_usage(&o, opt, mention);
    }
    // Accepted bounds.
    let o = run(&[
        "mount",
        s,
        m,
        "-o",
        "entry_timeout=31536000,attr_timeout=0.5",
    ]);
    assert_usage(&o, "good timeouts, missing SRC", "missing");
}

#[test]
fn nonempty_mount_point_refused_unless_nonempty() {
    if !can_mount() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let (src, mnt) = src_mnt(&d);
    let _u = Umount(mnt.clone());
    std::fs::write(mnt.join("hidden"), b"x").unwrap();
    let sock = format!("socket={}", d.path().join("ctl.sock").display());
    let (s, m) = (src.to_str().unwrap(), mnt.to_str().unwrap());
    let o = run(&["mount", s, m, "-o", &sock]);
    assert_usage(&o, "non-empty MNT", "nonempty");
    assert!(mountinfo(&mnt).is_none(), "mounted over a non-empty MNT");
    let o = run(&["mount", s, m, "-o", &format!("nonempty,{sock}")]);
    assert_ok(&o, "-o nonempty");
    assert!(mountinfo(&mnt).is_some());
    assert!(!mnt.join("hidden").exists());
}

#[test]
fn dead_mount_says_unmount_first() {
    if !can_mount() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let (src, mnt) = src_mnt(&d);
    let _u = Umount(mnt.clone());
    let child = Command::new(dircache_bin())
        .args(["mount", "-f", src.to_str().unwrap(), mnt.to_str().unwrap()])
        .arg("-o")
        .arg(format!("socket={}", d.path().join("ctl.sock").display()))
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let mut g = ChildGuard(Some(child), None);
    assert!(wait_for(Duration::from_secs(10), || mounted(&mnt)).is_some());
    let c = g.0.as_mut().unwrap();
    c.kill().unwrap(); // SIGKILL: the mount stays, without a daemon
    c.wait().unwrap();
    let e = std::fs::metadata(&mnt).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTCONN));
    let o = run(&["mount", src.to_str().unwrap(), mnt.to_str().unwrap()]);
    assert_usage(
        &o,
        "mount on a dead mount",
        &format!("umount {}", mnt.display()),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("fusermount3 -u"), "{err}");
    let o = run(&[
        "mount",
        src.to_str().unwrap(),
        mnt.to_str().unwrap(),
        "-o",
        "remount,ro",
    ]);
    assert_usage(
        &o,
        "remount of a dead mount",
        &format!("umount {}", mnt.display()),
    );
}

#[test]
fn kernel_options_reach_mountinfo() {
    if !can_mount() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let (src, mnt) = src_mnt(&d);
    std::fs::write(src.join("f"), b"x").unwrap();
    let _u = Umount(mnt.clone());
    let sock = format!("socket={}", d.path().join("ctl.sock").display());
    let (s, m) = (src.to_str().unwrap(), mnt.to_str().unwrap());
    // Defaults: nosuid, nodev, relatime; the source is SRC.
    assert_ok(&run(&["mount", s, m, "-o", &sock]), "default mount");
    let i = mountinfo(&mnt).expect("mounted");
    assert!(
        i.has("nosuid") && i.has("nodev") && i.has("relatime") && i.has("rw"),
        "{i:?}"
    );
    assert_eq!(i.fstype, "fuse.dircache");
    assert_eq!(i.source, s);
    assert!(Command::new("umount").arg(&mnt).status().unwrap().success());
    assert!(wait_for(Duration::from_secs(5), || mountinfo(&mnt).is_none()).is_some());
    // fsname, strictatime, nodiratime, noexec, sync, dirsync.
    let o = run(&[
        "mount",
        s,
        m,
        "-o",
        &format!("fsname=my data,strictatime,nodiratime,noexec,sync,dirsync,{sock}"),
    ]);
    assert_ok(&o, "flags");
    let i = mountinfo(&mnt).expect("mounted");
    assert_eq!(i.source, "my data", "{i:?}");
    assert!(i.has("nodiratime") && i.has("noexec"), "{i:?}");
    assert!(
        !i.has("relatime") && !i.has("noatime"),
        "strictatime: {i:?}"
    );
    assert!(i.has_super("sync") && i.has_super("dirsync"), "{i:?}");
    assert!(Command::new("umount").arg(&mnt).status().unwrap().success());
    assert!(wait_for(Duration::from_secs(5), || mountinfo(&mnt).is_none()).is_some());
    // source= is the same as fsname=; ro refuses writes with EROFS; noatime.
    let o = run(&[
        "mount",
        s,
        m,
        "-o",
        &format!("source=elsewhere,ro,noatime,{sock}"),
    ]);
    assert_ok(&o, "ro");
    let i = mountinfo(&mnt).expect("mounted");
    assert_eq!(i.source, "elsewhere", "{i:?}");
    assert!(i.has("ro") && i.has("noatime"), "{i:?}");
    assert_eq!(std::fs::read(mnt.join("f")).unwrap(), b"x");
    let e = std::fs::write(mnt.join("g"), b"y").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
}

/// A setuid copy of `id` owned by uid 1001 and a /dev/null node in SRC; returns what uid 1000
/// sees as its euid running the copy through the mount, and whether root can write the node.
fn suid_dev_probe(src: &std::path::Path, mnt: &std::path::Path) -> (String, bool) {
    use std::os::unix::fs::PermissionsExt;
    let id = src.join("id");
    if !id.exists() {
        std::fs::copy("/usr/bin/id", &id).unwrap();
        std::os::unix::fs::chown(&id, Some(1001), Some(1001)).unwrap();
        std::fs::set_permissions(&id, std::fs::Permissions::from_mode(0o4755)).unwrap();
        let st = Command::new("mknod")
            .arg(src.join("null"))
            .args(["c", "1", "3"])
            .status()
            .unwrap();
        assert!(st.success());
        chmod(&src.join("null"), 0o666);
    }
    let o = Command::new("setpriv")
        .args(["--reuid=1000", "--regid=1000", "--clear-groups"])
        .arg(mnt.join("id"))
        .arg("-u")
        .output()
        .unwrap();
    assert_ok(&o, "id through the mount");
    let euid = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let dev = std::fs::OpenOptions::new()
        .write(true)
        .open(mnt.join("null"))
        .is_ok();
    (euid, dev)
}

#[test]
fn suid_and_dev_through_mount8_and_fstab_defaults() {
    if !can_mount() {
        return;
    }
    let _h = Helper::install();
    let d = tempfile::tempdir().unwrap();
    let (src, mnt) = src_mnt(&d);
    let _u = Umount(mnt.clone());
    let (s, m) = (src.to_str().unwrap(), mnt.to_str().unwrap());
    let sock = format!("socket={}", d.path().join("ctl.sock").display());
    // The direct command defaults to nosuid,nodev (as fuse/sshfs do).
    assert_ok(&run(&["mount", s, m, "-o", &sock]), "direct");
    assert_eq!(suid_dev_probe(&src, &mnt), ("1000".to_string(), false));
    assert!(Command::new("umount").arg(&mnt).status().unwrap().success());
    assert!(wait_for(Duration::from_secs(5), || mountinfo(&mnt).is_none()).is_some());
    // mount(8) as root: suid and dev are mount(8)'s defaults (it never passes them on).
    let o = mount8(&[
        "-t",
        "fuse.dircache",
        "-o",
        &format!("defaults,{sock}"),
        s,
        m,
    ]);
    assert_ok(&o, "mount -t fuse.dircache -o defaults");
    let i = mountinfo(&mnt).expect("mounted");
    assert!(!i.has("nosuid") && !i.has("nodev"), "{i:?}");
    assert_eq!(suid_dev_probe(&src, &mnt), ("1001".to_string(), true));
    assert!(Command::new("umount").arg(&mnt).status().unwrap().success());
    assert!(wait_for(Duration::from_secs(5), || mountinfo(&mnt).is_none()).is_some());
    // ... and nosuid,nodev are kept when asked for.
    let o = mount8(&[
        "-t",
        "fuse.dircache",
        "-o",
        &format!("nosuid,nodev,{sock}"),
        s,
        m,
    ]);
    assert_ok(&o, "mount -t fuse.dircache -o nosuid,nodev");
    let i = mountinfo(&mnt).expect("mounted");
    assert!(i.has("nosuid") && i.has("nodev"), "{i:?}");
    assert_eq!(suid_dev_probe(&src, &mnt), ("1000".to_string(), false));
}

#[test]
fn suid_dev_never_more_than_src_allows() {
    if !can_mount() {
        return;
    }
    let tmpfs = |dir: &std::path::Path| {
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "nosuid,nodev,size=8m", "dctmp"])
            .arg(dir)
            .status()
            .unwrap();
        assert!(st.success());
        chmod(dir, 0o755);
    };
    // SRC on a nosuid,nodev file system, and a nosuid,nodev file system mounted inside SRC.
    for inside in [false, true] {
        let d = tempfile::tempdir().unwrap();
        let (src, mnt) = src_mnt(&d);
        let sub = if inside { src.join("sub") } else { src.clone() };
        if inside {
            std::fs::create_dir(&sub).unwrap();
        }
        tmpfs(&sub);
        let _us = Umount(sub.clone());
        let _u = Umount(mnt.clone());
        let sock = format!("socket={}", d.path().join("ctl.sock").display());
        let o = run(&[
            "mount",
            src.to_str().unwrap(),
            mnt.to_str().unwrap(),
            "-o",
            &format!("suid,dev,{sock}"),
        ]);
        assert_ok(&o, "suid,dev over a nosuid,nodev SRC");
        let i = mountinfo(&mnt).expect("mounted");
        assert!(i.has("nosuid") && i.has("nodev"), "inside={inside}: {i:?}");
        let msub = if inside { mnt.join("sub") } else { mnt.clone() };
        assert_eq!(suid_dev_probe(&sub, &msub), ("1000".to_string(), false));
        // Nor can a remount turn them on.
        let o = run(&[
            "mount",
            src.to_str().unwrap(),
            mnt.to_str().unwrap(),
            "-o",
            "remount,suid,dev",
        ]);
        assert_ok(&o, "remount,suid,dev");
        let i = mountinfo(&mnt).expect("mounted");
        assert!(
            i.has("nosuid") && i.has("nodev"),
            "remount, inside={inside}: {i:?}"
        );
        assert_eq!(suid_dev_probe(&sub, &msub), ("1000".to_string(), false));
        drop(_u);
    }
}

#[test]
fn remount_ro_and_rw() {
    if !can_mount() {
        return;
    }
    let _h = Helper::install();
    let d = tempfile::tempdir().unwrap();
    let (src, mnt) = src_mnt(&d);
    let _u = Umount(mnt.clone());
    let (s, m) = (src.to_str().unwrap(), mnt.to_str().unwrap());
    // Not mounted: refused.
    assert_usage(
        &run(&["mount", s, m, "-o", "remount,ro"]),
        "remount of nothing",
        "not mounted",
    );
    let sock = format!("socket={}", d.path().join("ctl.sock").display());
    assert_ok(
        &run(&["mount", s, m, "-o", &format!("noexec,{sock}")]),
        "mount",
    );
    std::fs::write(mnt.join("a"), b"1").unwrap();
    // dircache mount SRC MNT -o remount,ro: read-only, the other flags kept.
    assert_ok(&run(&["mount", s, m, "-o", "remount,ro"]), "remount,ro");
    let i = mountinfo(&mnt).expect("mounted");
    assert!(
        i.has("ro") && i.has("nosuid") && i.has("nodev") && i.has("noexec"),
        "{i:?}"
    );
    let e = std::fs::write(mnt.join("b"), b"2").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    assert_eq!(std::fs::read(mnt.join("a")).unwrap(), b"1");
    assert_ok(
        &run(&["mount", s, m, "-o", "remount,rw,exec"]),
        "remount,rw",
    );
    let i = mountinfo(&mnt).expect("mounted");
    assert!(i.has("rw") && !i.has("noexec") && i.has("nosuid"), "{i:?}");
    std::fs::write(mnt.join("b"), b"2").unwrap();
    // mount(8): mount -o remount,ro MNT goes through the helper.
    assert_ok(&mount8(&["-o", "remount,ro", m]), "mount -o remount,ro");
    let i = mountinfo(&mnt).expect("mounted");
    assert!(i.has("ro") && i.has("nosuid"), "{i:?}");
    let e = std::fs::write(mnt.join("c"), b"3").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    assert_ok(&mount8(&["-o", "remount,rw", m]), "mount -o remount,rw");
    std::fs::write(mnt.join("c"), b"3").unwrap();
    assert_eq!(std::fs::read(src.join("c")).unwrap(), b"3");
    // Still the same daemon serving: the mount answers.
    assert_eq!(std::fs::read(mnt.join("b")).unwrap(), b"2");
}
