//! A CLI mount serves SRC one directory below the FUSE root, bind-mounted on MNT
//! (`crates/fuse/src/rootmount.rs`): every way of unmounting MNT ends the daemon (MNT is the
//! only mount of the super block), a killed daemon leaves a mount that answers ENOTCONN and
//! that `umount MNT` removes, a non-empty MNT (`-o nonempty`) shows SRC and then its own
//! files again, and the control socket (`stats`, `cached`, `search`) is found from MNT.

#[path = "../../fuse/tests/common/mod.rs"]
mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use common::{can_mount, wait_for};

const BIN: &str = env!("CARGO_BIN_EXE_dircache");
const LIMIT: Duration = Duration::from_secs(20);

fn dircache(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// The root field of MNT's line in mountinfo: the directory of the super block it shows.
fn mount_root(mnt: &Path) -> String {
    let want = mnt.to_str().unwrap();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.get(4) == Some(&want)).then(|| f[3].to_string())
        })
        .unwrap_or_else(|| panic!("{want} is not in mountinfo"))
}

/// Makes `fsopen` fail with ENOSYS in the command's process, as on a kernel without the new
/// mount API (before 5.2): a seccomp filter installed between fork and exec.
fn deny_fsopen(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    fn stmt(code: u32, k: u32) -> libc::sock_filter {
        libc::sock_filter {
            code: code as u16,
            jt: 0,
            jf: 0,
            k,
        }
    }
    // Load the syscall number (offset 0 of seccomp_data); fsopen: ENOSYS; else allow.
    let filter = [
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0),
        libc::sock_filter {
            code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
            jt: 0,
            jf: 1,
            k: libc::SYS_fsopen as u32,
        },
        stmt(
            libc::BPF_RET | libc::BPF_K,
            libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
        ),
        stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW),
    ];
    // SAFETY: the closure runs in the child between fork and exec; it allocates nothing and
    // makes two prctl calls on the filter array, which outlives them (moved into the closure).
    unsafe {
        cmd.pre_exec(move || {
            let prog = libc::sock_fprog {
                len: filter.len() as u16,
                filter: filter.as_ptr() as *mut libc::sock_filter,
            };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER,
                    &prog as *const libc::sock_fprog,
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The mount points of every mount of the super block `dev` (major:minor).
fn mounts_of(dev: u64) -> Vec<String> {
    let want = format!("{}:{}", libc::major(dev), libc::minor(dev));
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.get(2) == Some(&want.as_str())).then(|| f[4].to_string())
        })
        .collect()
}

/// Whether no mount of the super block `dev` is left at `mnt`. (Not "no mount of `dev` at
/// all": once the super block is gone its anonymous device number is free, and a test
/// running in parallel mounted with the same number at its own MNT.)
fn gone(dev: u64, mnt: &Path) -> bool {
    !mounts_of(dev).iter().any(|m| Path::new(m) == mnt)
}

/// A foreground daemon (`dircache mount -f`) on `SRC`/`MNT` of a temporary directory; on
/// drop MNT is unmounted lazily if still mounted and the daemon killed and reaped.
struct Daemon {
    dir: tempfile::TempDir,
    src: PathBuf,
    mnt: PathBuf,
    child: Option<Child>,
}

impl Daemon {
    fn start(opts: &[&str], fill_mnt: impl FnOnce(&Path)) -> Daemon {
        Daemon::start_cmd(opts, fill_mnt, |_| {})
    }

    /// As [`Daemon::start`], with `tweak` applied to the daemon's command first.
    fn start_cmd(
        opts: &[&str],
        fill_mnt: impl FnOnce(&Path),
        tweak: impl FnOnce(&mut Command),
    ) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let (src, mnt) = (dir.path().join("src"), dir.path().join("mnt"));
        std::fs::create_dir(&src).unwrap();
        std::fs::create_dir(&mnt).unwrap();
        std::fs::write(src.join("hello"), b"hi").unwrap();
        std::fs::create_dir(src.join("d")).unwrap();
        fill_mnt(&mnt);
        let sock = dir.path().join("ctl.sock");
        let mut o = format!("socket={}", sock.display());
        for x in opts {
            o.push(',');
            o.push_str(x);
        }
        let mut cmd = Command::new(BIN);
        cmd.args(["mount", "-f", src.to_str().unwrap(), mnt.to_str().unwrap()])
            .args(["-o", &o])
            .stdin(Stdio::null());
        tweak(&mut cmd);
        let child = cmd.spawn().unwrap();
        let d = Daemon {
            dir,
            src,
            mnt,
            child: Some(child),
        };
        assert!(
            wait_for(LIMIT, || std::fs::read(d.mnt.join("hello"))
                .is_ok_and(|b| b == b"hi"))
            .is_some(),
            "never mounted"
        );
        d
    }

    fn m(&self) -> &str {
        self.mnt.to_str().unwrap()
    }

    /// Whether the daemon exited within the limit.
    fn exits(&mut self) -> bool {
        let c = self.child.as_mut().unwrap();
        wait_for(LIMIT, || matches!(c.try_wait(), Ok(Some(_)))).is_some()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if dircache_fuse::kmount::mount_entry(&self.mnt).is_some() {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `umount MNT`, `fusermount3 -u MNT` and `dircache umount MNT` each remove the only mount
/// of the super block, and the daemon exits.
#[test]
fn every_unmount_ends_the_daemon() {
    if !can_mount() {
        return;
    }
    for how in ["umount", "fusermount3", "dircache umount"] {
        let mut d = Daemon::start(&[], |_| {});
        let dev = std::fs::metadata(&d.mnt).unwrap().dev();
        assert_eq!(mounts_of(dev), [d.m()], "{how}: mounts of the super block");
        let st = match how {
            "umount" => Command::new("umount").arg(&d.mnt).output().unwrap(),
            "fusermount3" => Command::new("fusermount3")
                .arg("-u")
                .arg(&d.mnt)
                .output()
                .unwrap(),
            _ => dircache(&["umount", d.m()]),
        };
        assert!(
            st.status.success(),
            "{how}: {}",
            String::from_utf8_lossy(&st.stderr)
        );
        assert!(d.exits(), "{how}: the daemon did not exit");
        assert!(gone(dev, &d.mnt), "{how}: {:?}", mounts_of(dev));
        assert!(!dircache_fuse::is_mount_point(&d.mnt), "{how}");
        assert!(!d.mnt.join("hello").exists(), "{how}: SRC still shows");
    }
}

/// A killed daemon: MNT answers ENOTCONN (below it too), stays the only mount of the super
/// block, and `umount MNT` removes it.
#[test]
fn killed_daemon_then_umount() {
    if !can_mount() {
        return;
    }
    let mut d = Daemon::start(&[], |_| {});
    let dev = std::fs::metadata(&d.mnt).unwrap().dev();
    let c = d.child.as_mut().unwrap();
    c.kill().unwrap();
    c.wait().unwrap();
    // MNT's own attributes may come from the kernel's cache (as before this layout); what
    // needs the daemon fails.
    for p in [d.mnt.join("hello"), d.mnt.join("d"), d.mnt.join("new")] {
        let e = std::fs::metadata(&p).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOTCONN), "{}", p.display());
    }
    let e = std::fs::read_dir(&d.mnt).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTCONN), "listing MNT");
    assert_eq!(mounts_of(dev), [d.m()]);
    let o = Command::new("umount").arg(&d.mnt).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(gone(dev, &d.mnt), "{:?}", mounts_of(dev));
    assert!(std::fs::read_dir(&d.mnt).unwrap().next().is_none());
}

/// `-o nonempty`: MNT's own files are hidden while mounted and back after the unmount.
#[test]
fn nonempty_mount_point_shows_src_then_its_own_files() {
    if !can_mount() {
        return;
    }
    let mut d = Daemon::start(&["nonempty"], |mnt| {
        std::fs::write(mnt.join("own"), b"mine").unwrap();
    });
    assert!(!d.mnt.join("own").exists());
    assert_eq!(std::fs::read(d.mnt.join("hello")).unwrap(), b"hi");
    let o = dircache(&["umount", d.m()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(d.exits());
    assert_eq!(std::fs::read(d.mnt.join("own")).unwrap(), b"mine");
}

/// The control socket is found from MNT (its root's xattr) and the paths clients send reach
/// SRC (mountinfo's root `/src` less the `user.dircache.fsroot` prefix): `stats`, `cached`
/// of MNT and of a directory, and a delegated `search`.
#[test]
fn control_socket_from_mnt() {
    if !can_mount() {
        return;
    }
    let d = Daemon::start(&[], |_| {});
    std::fs::write(d.src.join("d/needle.txt"), b"").unwrap();
    let _ = std::fs::read_dir(d.mnt.join("d")).unwrap().count();
    let o = dircache(&["stats", "--json", d.m()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["mnt"], d.m(), "{v}");
    for (path, want) in [(".", ""), ("d", "d")] {
        let o = dircache(&["cached", d.m(), path, "--json"]);
        assert!(
            o.status.success(),
            "cached {path}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(
            (&v["ok"], &v["cached"]),
            (&true.into(), &true.into()),
            "{v}"
        );
        assert_eq!(v["path"], want, "cached {path}: {v}");
    }
    let o = dircache(&["cached", d.m(), "d", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["totals"]["files"], 1, "cached d: {v}");
    // As a user (root searches by itself: the daemon never applies capabilities).
    for p in [d.dir.path(), &d.src, &d.src.join("d")] {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", BIN])
        .args(["search", "--verbose"])
        .arg(&d.mnt)
        .arg("needle*")
        .env_remove("DIRCACHE_NO_DELEGATE")
        .output()
        .unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(o.status.success(), "search: {err}");
    assert!(
        err.contains("delegated to the mount's daemon"),
        "search: {err}"
    );
    // Results are relative to the searched directory (no `--root`).
    assert_eq!(out.trim(), "d/needle.txt", "search");
}

/// Without the new mount API (`fsopen` answering ENOSYS, as before Linux 5.2) the daemon
/// mounts with mount(2) and SRC's root is the FUSE root: MNT shows SRC, writes reach it, the
/// control socket answers for MNT and its subdirectories, and `umount` ends the daemon. The
/// same mount with the new API shows the super block's `/src` (so the filter is what changed
/// the path taken).
#[test]
fn without_the_new_mount_api_src_is_the_fuse_root() {
    if !can_mount() {
        return;
    }
    let usual = Daemon::start(&[], |_| {});
    assert_eq!(mount_root(&usual.mnt), "/src", "with fsopen");
    drop(usual);

    let mut d = Daemon::start_cmd(&[], |_| {}, deny_fsopen);
    assert_eq!(mount_root(&d.mnt), "/", "without fsopen");
    let dev = std::fs::metadata(&d.mnt).unwrap().dev();
    assert_eq!(mounts_of(dev), [d.m()]);
    std::fs::write(d.mnt.join("d/new"), b"through").unwrap();
    assert_eq!(std::fs::read(d.src.join("d/new")).unwrap(), b"through");
    let mut names: Vec<_> = std::fs::read_dir(&d.mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names, ["d", "hello"]);
    let o = dircache(&["stats", "--json", d.m()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["mnt"], d.m(), "{v}");
    let o = dircache(&["cached", d.m(), "d", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((&v["path"], &v["ok"]), (&"d".into(), &true.into()), "{v}");
    let o = Command::new("umount").arg(&d.mnt).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(d.exits(), "the daemon did not exit");
    assert!(gone(dev, &d.mnt), "{:?}", mounts_of(dev));
}
