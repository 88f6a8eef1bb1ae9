//! SRC served one directory below the FUSE root and bind-mounted on MNT (`rootmount.rs`):
//! what users and tools see of the mount is as before (one mount, at MNT, of type
//! `fuse.dircache`; its root is SRC's root), and the kernel decides access to MNT's root by
//! its POSIX ACLs as natively, now that it caches them.

mod common;
use common::*;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(10);
const NOBODY: u32 = 65534;

/// The /proc/self/mountinfo lines of the super block `dev` (major:minor), as
/// `(root, mount point, fstype)`.
fn mounts_of(dev: u64) -> Vec<(String, String, String)> {
    let want = format!("{}:{}", libc::major(dev), libc::minor(dev));
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let dash = f.iter().position(|x| *x == "-")?;
            (f.get(2) == Some(&want.as_str())).then(|| {
                (
                    f[3].to_string(),
                    f[4].to_string(),
                    f.get(dash + 1).unwrap_or(&"").to_string(),
                )
            })
        })
        .collect()
}

/// `sh -c script` as `uid` (no groups); its exit status and stderr.
fn sh_as(uid: u32, script: &str) -> (i32, String) {
    let o = std::process::Command::new("setpriv")
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={uid}"))
        .arg("--clear-groups")
        .args(["sh", "-c", script])
        .env("LC_ALL", "C")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("setpriv");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// One mount of the super block, at MNT, with root `/src`; the tools that look at mounts
/// (findmnt, mountpoint, df, stat -f) find it at MNT; MNT's root is SRC's root (inode
/// number, listing, `..` going up to MNT's parent).
#[test]
fn one_mount_at_mnt_and_its_root_is_srcs() {
    if !can_mount() {
        return;
    }
    let t = TestMount::new();
    std::fs::create_dir(t.s("d")).unwrap();
    std::fs::write(t.s("f"), b"x").unwrap();
    let dev = std::fs::metadata(&t.mnt).unwrap().dev();
    let mnt = t.mnt.to_str().unwrap();
    let all = mounts_of(dev);
    assert_eq!(
        all,
        vec![(
            "/src".to_string(),
            mnt.to_string(),
            "fuse.dircache".to_string()
        )],
        "mounts of the dircache super block"
    );
    assert!(dircache_fuse::is_mount_point(&t.mnt));
    let e = dircache_fuse::kmount::mount_entry(&t.mnt).expect("mount entry");
    assert_eq!(e.fstype, "fuse.dircache");
    let out = sh_ok(
        Path::new("/"),
        &format!("findmnt -n -o TARGET,FSTYPE,FSROOT {mnt}"),
    );
    assert_eq!(
        out.split_whitespace().collect::<Vec<_>>(),
        [mnt, "fuse.dircache", "/src"],
        "findmnt: {out}"
    );
    sh_ok(Path::new("/"), &format!("mountpoint -q {mnt}"));
    let df = sh_ok(Path::new("/"), &format!("df -P {mnt}"));
    assert!(
        df.lines().nth(1).is_some_and(|l| l.ends_with(mnt)),
        "df: {df}"
    );
    let native = rustix::fs::statvfs(&t.src).unwrap();
    let through = rustix::fs::statvfs(&t.mnt).unwrap();
    assert_eq!(
        (native.f_bsize, native.f_blocks, native.f_files),
        (through.f_bsize, through.f_blocks, through.f_files),
        "statfs of MNT is SRC's"
    );
    // MNT's root is SRC's root.
    let (s, m) = (
        std::fs::metadata(&t.src).unwrap(),
        std::fs::metadata(&t.mnt).unwrap(),
    );
    assert_eq!((m.ino(), m.mode(), m.uid()), (s.ino(), s.mode(), s.uid()));
    let mut names: Vec<_> = std::fs::read_dir(&t.mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["d", "f"]);
    let ls = sh_ok(&t.mnt, "ls -a");
    assert_eq!(
        ls.split_whitespace().collect::<Vec<_>>(),
        [".", "..", "d", "f"]
    );
    // `..` of MNT is MNT's parent; `..` of a directory below is MNT.
    let up = std::fs::metadata(t.mnt.join("..")).unwrap();
    let parent = std::fs::metadata(t.dir.path()).unwrap();
    assert_eq!((up.dev(), up.ino()), (parent.dev(), parent.ino()));
    let pwd = sh_ok(&t.m("d"), "cd .. && pwd -P");
    assert_eq!(pwd.trim(), mnt);
    assert_eq!(
        std::fs::canonicalize(t.m("d/..")).unwrap(),
        t.mnt,
        "realpath of d/.."
    );
    // Changes to the root's attributes and entries, outside and through the mount, show.
    chmod(&t.src, 0o751);
    assert!(
        wait_for(LIMIT, || std::fs::metadata(&t.mnt).unwrap().mode() & 0o777
            == 0o751)
        .is_some(),
        "outside chmod of SRC's root not seen"
    );
    // Looked up through the mount first, while missing: only the change feed's report of
    // its creation then shows it (without that lookup the mount's first lookup found it in
    // SRC at once, reported or not).
    assert!(!t.m("new").exists(), "new before it is made");
    std::fs::write(t.s("new"), b"").unwrap();
    assert!(
        wait_for(LIMIT, || t.m("new").exists()).is_some(),
        "outside creation in SRC's root not reported by the change feed"
    );
    std::fs::remove_file(t.m("new")).unwrap();
    assert!(!t.s("new").exists());
    chmod(&t.mnt, 0o755);
    assert_eq!(std::fs::metadata(&t.src).unwrap().mode() & 0o777, 0o755);
}

/// A POSIX ACL on SRC's root denies a user whose mode bits would let through, as natively:
/// one present at mount time, one set natively while the user's walks are warm in the
/// kernel, and one set through the mount; removing it lets the user through again.
#[test]
fn acl_on_srcs_root_denies_as_natively() {
    if !can_mount() {
        return;
    }
    let t = TestMount::read_only(|src| {
        std::fs::create_dir(src.join("d")).unwrap();
        std::fs::write(src.join("d/f"), b"x").unwrap();
        chmod(src, 0o755);
        sh_ok(src, &format!("setfacl -m u:{NOBODY}:--- {}", src.display()));
    });
    // Read-only mount for the first case only; the rest use a writable one below.
    let walk = |root: &Path| sh_as(NOBODY, &format!("stat {}/d/f >/dev/null", root.display()));
    let (code, err) = walk(&t.src);
    assert_ne!(code, 0, "natively the ACL denies");
    assert!(err.contains("Permission denied"), "{err}");
    let (code, err) = walk(&t.mnt);
    assert_ne!(
        code, 0,
        "through the mount the ACL present at mount time denies"
    );
    assert!(err.contains("Permission denied"), "{err}");
    let ls = sh_as(NOBODY, &format!("ls {} >/dev/null", t.mnt.display()));
    assert_ne!(ls.0, 0, "listing MNT allowed: {}", ls.1);
    drop(t);

    let t = TestMount::new();
    std::fs::create_dir(t.s("d")).unwrap();
    std::fs::write(t.s("d/f"), b"x").unwrap();
    chmod(&t.src, 0o755);
    let walk = |root: &Path| sh_as(NOBODY, &format!("stat {}/d/f >/dev/null", root.display()));
    // Warm: the kernel holds the root's (absent) ACL.
    for _ in 0..3 {
        assert_eq!(walk(&t.mnt).0, 0, "walk without an ACL");
    }
    let src = t.src.display().to_string();
    sh_ok(Path::new("/"), &format!("setfacl -m u:{NOBODY}:--- {src}"));
    assert_ne!(walk(&t.src).0, 0, "natively the ACL denies");
    assert!(
        wait_for(LIMIT, || walk(&t.mnt).0 != 0).is_some(),
        "an ACL set on SRC's root natively never denied the walk through the mount"
    );
    sh_ok(Path::new("/"), &format!("setfacl -b {src}"));
    assert!(
        wait_for(LIMIT, || walk(&t.mnt).0 == 0).is_some(),
        "the walk stays denied after the ACL was removed natively"
    );
    // Through the mount: the kernel drops its cached ACL at once.
    let mnt = t.mnt.display().to_string();
    sh_ok(Path::new("/"), &format!("setfacl -m u:{NOBODY}:--- {mnt}"));
    let (code, err) = walk(&t.mnt);
    assert_ne!(code, 0, "an ACL set through the mount did not deny");
    assert!(err.contains("Permission denied"), "{err}");
    assert_ne!(walk(&t.src).0, 0, "the ACL reached SRC's root");
    sh_ok(Path::new("/"), &format!("setfacl -b {mnt}"));
    assert_eq!(walk(&t.mnt).0, 0, "removed through the mount, still denied");
}
