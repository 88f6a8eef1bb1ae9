//! Lean READDIRPLUS (`lean.rs`, `-o lean`): a cold listing sends files without attributes
//! (nodeid 0), and what a program sees is what native readdir and stat show: names, d_ino
//! (the number `stat` shows), d_type, hard links, a name replaced between listing and stat.
//! The kernel's requests show which entries went out lean (a LOOKUP on the first stat).

mod common;
use common::*;
use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, MetadataExt};
use std::path::Path;
use std::time::Duration;

use dircache_fuse::CachePolicy;
use serde_json::{json, Value};

const LIMIT: Duration = Duration::from_secs(20);

fn lookups(t: &TestMount) -> u64 {
    let r = dircache_fuse::stats::query_mount(&t.mnt, &json!({"op": "stats"})).expect("stats");
    let v: &Value = &r["stats"]["kernel_requests"]["by_kind"]["lookup"];
    v.as_u64().unwrap_or(0)
}

/// Run `f(i)` on fresh directories until one attempt sees the request counts it expects:
/// other jobs on this machine drop the kernel's dentries (drop_caches, reclaim), which
/// makes the kernel look names up again. A cause of ours fails every attempt.
fn attempts(mut f: impl FnMut(usize) -> Result<(), String>) {
    let mut last = String::new();
    for i in 0..8 {
        match f(i) {
            Ok(()) => return,
            Err(e) => last = e,
        }
    }
    panic!("8 attempts failed, the last: {last}");
}

fn files(dir: &Path, n: usize) {
    std::fs::create_dir_all(dir.join("sub")).expect("mkdir");
    for f in 0..n {
        std::fs::write(dir.join(format!("f{f}")), b"x").expect("write");
    }
}

fn expect(what: &str, got: u64, want: u64) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!("{what}: {got} LOOKUPs, expected {want}"))
    }
}

/// name -> (d_ino, d_type) from getdents (readdir(3)), without stat.
fn dirents(dir: &Path) -> BTreeMap<String, (u64, u8)> {
    let c = CString::new(dir.as_os_str().as_bytes()).expect("path");
    let mut out = BTreeMap::new();
    // SAFETY: opendir/readdir/closedir on a valid C string; each dirent is read before the
    // next readdir call and the stream is closed once.
    unsafe {
        let d = libc::opendir(c.as_ptr());
        assert!(!d.is_null(), "opendir {}", dir.display());
        loop {
            let e = libc::readdir(d);
            if e.is_null() {
                break;
            }
            let name = std::ffi::CStr::from_ptr((*e).d_name.as_ptr())
                .to_string_lossy()
                .into_owned();
            if name != "." && name != ".." {
                out.insert(name, ((*e).d_ino, (*e).d_type));
            }
        }
        libc::closedir(d);
    }
    out
}

fn fill(src: &Path) {
    let d = src.join("d");
    std::fs::create_dir_all(d.join("sub/deeper")).expect("mkdir");
    for i in 0..12 {
        std::fs::write(d.join(format!("f{i}")), vec![b'x'; i]).expect("write");
    }
    std::fs::hard_link(d.join("f1"), d.join("link-to-f1")).expect("link");
    std::fs::hard_link(d.join("f2"), d.join("sub/link-to-f2")).expect("link");
    symlink("f3", d.join("sym")).expect("symlink");
    let fifo = CString::new(d.join("fifo").as_os_str().as_bytes()).expect("path");
    // SAFETY: mkfifo with a valid C string.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0, "mkfifo");
    std::fs::write(d.join("sub/g"), b"g").expect("write");
}

/// Every entry of `rel` listed through the mount shows native's names and d_type, and d_ino
/// is the number `stat` through the mount then shows (native: the same inode's number).
fn check_dir(t: &TestMount, rel: &str) {
    let got = dirents(&t.m(rel));
    let want = dirents(&t.s(rel));
    let types = |m: &BTreeMap<String, (u64, u8)>| -> BTreeMap<String, u8> {
        m.iter().map(|(k, v)| (k.clone(), v.1)).collect()
    };
    assert_eq!(types(&got), types(&want), "{rel}: names and d_type");
    for (name, (d_ino, _)) in &got {
        let m = std::fs::symlink_metadata(t.m(&format!("{rel}/{name}"))).expect("stat");
        assert_eq!(*d_ino, m.ino(), "{rel}/{name}: d_ino vs st_ino");
    }
}

#[test]
fn a_cold_listing_sends_files_lean_and_shows_what_stat_shows() {
    if !can_mount() {
        return cannot_run("no FUSE");
    }
    let t = TestMount::without_feed();
    fill(&t.src);
    attempts(|i| {
        let rel = format!("a{i}");
        files(&t.s(&rel), 12);
        let before = lookups(&t);
        let names = dirents(&t.m(&rel));
        assert_eq!(names.len(), 13, "{names:?}");
        let mid = lookups(&t);
        expect("the listing (of a{i} only)", mid, before + 1)?;
        // The files went out lean: the first stat of one is a LOOKUP. The subdirectory
        // went out full: no LOOKUP.
        std::fs::symlink_metadata(t.m(&format!("{rel}/f5"))).expect("stat");
        expect("stat of a file listed lean", lookups(&t), mid + 1)?;
        std::fs::symlink_metadata(t.m(&format!("{rel}/sub"))).expect("stat");
        expect("stat of a directory listed full", lookups(&t), mid + 1)
    });
    check_dir(&t, "d");
    check_dir(&t, "d/sub");
    // Hard links: one inode number under both names, as natively.
    let a = std::fs::metadata(t.m("d/f2")).expect("stat").ino();
    let b = std::fs::metadata(t.m("d/sub/link-to-f2"))
        .expect("stat")
        .ino();
    assert_eq!(a, b);
}

#[test]
fn nolean_sends_every_entry_full() {
    if !can_mount() {
        return cannot_run("no FUSE");
    }
    let t = TestMount::with_policy_without_feed(CachePolicy {
        lean: false,
        ..CachePolicy::default()
    });
    fill(&t.src);
    attempts(|i| {
        let rel = format!("a{i}");
        files(&t.s(&rel), 12);
        dirents(&t.m(&rel));
        let mid = lookups(&t);
        std::fs::symlink_metadata(t.m(&format!("{rel}/f5"))).expect("stat");
        expect("stat of a file listed full", lookups(&t), mid)
    });
    check_dir(&t, "d");
}

#[test]
fn lookups_of_lean_names_switch_listings_to_full() {
    if !can_mount() {
        return cannot_run("no FUSE");
    }
    // A mount per attempt: after the first switch, listings are full.
    attempts(|_| {
        let t = TestMount::without_feed();
        files(&t.s("a"), 8);
        files(&t.s("b"), 8);
        // `ls -l a`: listed lean, then every name looked up.
        for (name, _) in dirents(&t.m("a")) {
            std::fs::symlink_metadata(t.m(&format!("a/{name}"))).expect("stat");
        }
        // The next listing is full: its files are stat'ed without a LOOKUP.
        let names = dirents(&t.m("b"));
        let mid = lookups(&t);
        for name in names.keys() {
            std::fs::symlink_metadata(t.m(&format!("b/{name}"))).expect("stat");
        }
        check_dir(&t, "b");
        expect(
            "stats in a directory listed after lookups of lean names",
            lookups(&t),
            mid,
        )
    });
}

#[test]
fn a_name_replaced_between_listing_and_stat_shows_the_new_file() {
    if !can_mount() {
        return cannot_run("no FUSE");
    }
    let t = TestMount::new();
    fill(&t.src);
    let listed = dirents(&t.m("d"));
    let old = listed["f4"].0;
    // Replaced behind the mount's back, after the listing: stat shows the new file, as
    // natively (getdents showed the old one).
    std::fs::write(t.s("d/f4.new"), b"new content").expect("write");
    std::fs::rename(t.s("d/f4.new"), t.s("d/f4")).expect("rename");
    let want = std::fs::metadata(t.s("d/f4")).expect("stat");
    assert!(
        wait_for(LIMIT, || {
            std::fs::metadata(t.m("d/f4")).is_ok_and(|m| m.len() == want.len())
        })
        .is_some(),
        "the replaced f4 not seen"
    );
    let m = std::fs::metadata(t.m("d/f4")).expect("stat");
    assert_ne!(m.ino(), old, "the new file has a new inode");
    assert!(
        wait_for(LIMIT, || dirents(&t.m("d"))["f4"].0 == m.ino()).is_some(),
        "the listing shows the new f4's number"
    );
    check_dir(&t, "d");
}

#[test]
fn a_mount_inside_src_lists_as_natively() {
    if !can_mount() {
        return cannot_run("no FUSE");
    }
    let t = TestMount::without_feed();
    fill(&t.src);
    let inner = t.src.join("d/inner");
    std::fs::create_dir(&inner).expect("mkdir");
    let tmp = Tmpfs::new();
    std::fs::write(tmp.path().join("a"), b"a").expect("write");
    std::fs::create_dir(tmp.path().join("b")).expect("mkdir");
    let out = sh(
        &t.src,
        &format!("mount --bind {} {}", tmp.path().display(), inner.display()),
    );
    if !out.status.success() {
        return cannot_run("mount --bind");
    }
    struct Umount(std::path::PathBuf);
    impl Drop for Umount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.0)
                .status();
        }
    }
    let _u = Umount(inner.clone());
    // The mount point looked up first, then its parent listed lean (getdents shows the
    // covered directory's number), then the mount point listed: what the mount shows
    // matches SRC's.
    // (Its inode number is mapped: another device, inodes.rs `ino_of`.)
    let m = std::fs::metadata(t.m("d/inner")).expect("stat");
    let got = dirents(&t.m("d"));
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        dirents(&t.s("d")).keys().collect::<Vec<_>>()
    );
    check_dir(&t, "d/inner");
    let m2 = std::fs::metadata(t.m("d/inner")).expect("stat");
    assert_eq!(
        (m2.ino(), m2.dev()),
        (m.ino(), m.dev()),
        "the mount point unchanged"
    );
}

#[test]
fn a_listing_reusing_cached_attributes_still_sees_outside_changes() {
    if !can_mount() {
        return cannot_run("no FUSE");
    }
    use std::os::unix::fs::PermissionsExt;
    let t = TestMount::new();
    files(&t.s("r"), 6);
    // `git status`: every file looked up first (attributes cached), then the directory
    // listed (getdents only: the cached attributes are reused).
    for f in 0..6 {
        std::fs::symlink_metadata(t.m(&format!("r/f{f}"))).expect("stat");
    }
    // Changed behind the mount's back after the children were cached: the change feed's
    // report must reach what the listing and stat show.
    chmod(&t.s("r/f2"), 0o600);
    std::fs::write(t.s("r/f3"), b"longer content").expect("write");
    dirents(&t.m("r"));
    let seen = || {
        let a = std::fs::symlink_metadata(t.m("r/f2")).expect("stat");
        let b = std::fs::symlink_metadata(t.m("r/f3")).expect("stat");
        a.permissions().mode() & 0o777 == 0o600 && b.len() == 14
    };
    assert!(wait_for(LIMIT, seen).is_some(), "outside changes not seen");
    // A fresh listing after the reports: the same.
    std::fs::write(t.s("r/new"), b"n").expect("write");
    assert!(
        wait_for(LIMIT, || dirents(&t.m("r")).contains_key("new")).is_some(),
        "new name not listed"
    );
    assert!(seen());
    check_dir(&t, "r");
}

fn kernel_requests(t: &TestMount) -> Value {
    let r = dircache_fuse::stats::query_mount(&t.mnt, &json!({"op": "stats"})).expect("stats");
    r["stats"]["kernel_requests"].clone()
}

/// Wait until the change feed has reported what was changed in SRC (its count of changes
/// stays the same for 300 ms).
fn settle(t: &TestMount) {
    let changes = || {
        let r = dircache_fuse::stats::query_mount(&t.mnt, &json!({"op": "stats"})).expect("stats");
        r["stats"]["notifier"]["changes"].as_u64().unwrap_or(0)
    };
    let mut last = changes();
    for _ in 0..100 {
        std::thread::sleep(Duration::from_millis(300));
        let now = changes();
        if now == last {
            return;
        }
        last = now;
    }
}

fn acl_memo_hits(t: &TestMount) -> u64 {
    kernel_requests(t)["acl_memo_hits"].as_u64().unwrap_or(0)
}

fn have_setfacl() -> bool {
    let ok = std::process::Command::new("setfacl")
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        // setfacl comes from Debian's `acl` package, which .ci/run installs.
        assert!(std::env::var("CI").is_err(), "setfacl missing in CI");
        eprintln!("skipping: setfacl not installed");
    }
    ok
}

fn setfacl(args: &[&str], p: &Path) {
    let st = std::process::Command::new("setfacl")
        .args(args)
        .arg(p)
        .status()
        .expect("setfacl");
    assert!(st.success(), "setfacl {args:?} {}", p.display());
}

/// `getfacl -cp` of each entry of `dir` (sorted by name), as one string.
fn getfacls(dir: &Path) -> String {
    let mut names: Vec<String> = dirents(dir).into_keys().collect();
    names.sort();
    let mut out = String::new();
    for n in names {
        out.push_str(&getfacl(&dir.join(&n)));
    }
    out
}

fn getfacl(p: &Path) -> String {
    let o = std::process::Command::new("getfacl")
        .arg("-cp")
        .arg(p)
        .output()
        .expect("getfacl");
    assert!(o.status.success(), "getfacl {}", p.display());
    format!(
        "{}:\n{}",
        p.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default(),
        String::from_utf8_lossy(&o.stdout)
    )
}

fn ls_l(dir: &Path) {
    let o = std::process::Command::new("ls")
        .arg("-l")
        .arg(dir)
        .output()
        .expect("ls -l");
    assert!(o.status.success(), "ls -l {}", dir.display());
}

/// While the kernel asks for POSIX ACLs (`ls -l`), listings fetch their entries' ACLs ahead
/// (`lean::fill_acls`) and the kernel's requests are answered from what was fetched: the
/// ACLs shown are native's, ACLs present are read as usual, and an ACL added natively
/// afterwards shows, whether the kernel had asked for that file already or not.
#[test]
fn acls_fetched_ahead_of_ls_l_match_native_and_see_outside_changes() {
    if !can_mount() {
        return cannot_run("no FUSE");
    }
    if !have_setfacl() {
        return;
    }
    let t = TestMount::new();
    files(&t.s("a"), 4);
    files(&t.s("b"), 12);
    files(&t.s("c"), 6);
    setfacl(&["-m", "u:1234:r"], &t.s("b/f3"));
    setfacl(&["-d", "-m", "u:1234:rx"], &t.s("b/sub"));
    // Every change the feed reports empties the memo: let the reports of these come first.
    settle(&t);
    // `ls -l a`: the kernel asks for the ACL of each entry.
    ls_l(&t.m("a"));
    // b is listed while ACL requests flow: its entries' ACLs come with the listing.
    let before = acl_memo_hits(&t);
    assert_eq!(getfacls(&t.m("b")), getfacls(&t.s("b")), "ACLs of b");
    let hits = acl_memo_hits(&t) - before;
    // 11 files and `sub` (access and default) have no access ACL fetched ahead; f3 has one.
    assert!(
        hits >= 11,
        "{hits} ACL requests of b answered from ACLs fetched ahead (expected 11 or more)"
    );
    // Added natively to a file the kernel asked about (it cached "no ACL").
    setfacl(&["-m", "u:1234:rw"], &t.s("b/f5"));
    let want = getfacl(&t.s("b/f5"));
    assert!(
        wait_for(LIMIT, || getfacl(&t.m("b/f5")) == want).is_some(),
        "an ACL added natively to b/f5 is not shown: {} vs {want}",
        getfacl(&t.m("b/f5"))
    );
    // c listed only (no ACL asked yet: fetched ahead, remembered absent), then an ACL added
    // natively to c/f1 before the kernel asks.
    ls_l(&t.m("a"));
    dirents(&t.m("c"));
    setfacl(&["-m", "u:1234:rw"], &t.s("c/f1"));
    let want = getfacl(&t.s("c/f1"));
    assert!(
        wait_for(LIMIT, || getfacl(&t.m("c/f1")) == want).is_some(),
        "an ACL added natively to c/f1 is not shown: {} vs {want}",
        getfacl(&t.m("c/f1"))
    );
    assert_eq!(getfacls(&t.m("c")), getfacls(&t.s("c")), "ACLs of c");
}

/// Whether `uid` may read `p` (open for reading), as the kernel decides: "ok" or the errno.
fn read_as(uid: u32, p: &Path) -> String {
    let script = format!(
        "import errno\ntry:\n    open({:?}, 'rb').close(); print('ok')\nexcept OSError as e:\n    print(errno.errorcode[e.errno])",
        p.to_str().expect("utf-8 path")
    );
    py(Path::new("/"), &script, Some(uid)).trim().to_string()
}

/// After a cold `ls -l` the kernel holds "no ACL" for every file it listed (asked once per
/// inode, answered from ACLs fetched ahead: `lean::fill_acls` and the xattr memo). An ACL
/// set later in SRC must then be shown and enforced through the mount as natively: one that
/// takes read access away from a user, and one that gives it to a user the mode bits keep
/// out (the feed's attribute change makes the kernel forget the cached ACL).
#[test]
fn acl_set_in_src_after_a_cold_ls_l_is_shown_and_enforced() {
    if !can_mount() {
        return cannot_run("no FUSE");
    }
    if !have_setfacl() {
        return;
    }
    let t = TestMount::new();
    chmod(&t.src, 0o755);
    files(&t.s("d"), 6);
    chmod(&t.s("d"), 0o755);
    for i in 0..6 {
        chmod(&t.s(&format!("d/f{i}")), if i == 2 { 0o600 } else { 0o644 });
    }
    settle(&t);
    // Cold: the kernel asks for each entry's ACL (answered "none"), and keeps that.
    ls_l(&t.m("d"));
    assert_eq!(getfacls(&t.m("d")), getfacls(&t.s("d")), "ACLs of d");
    assert_eq!(read_as(1001, &t.m("d/f1")), "ok");
    assert_eq!(read_as(1001, &t.m("d/f2")), "EACCES");
    // Taken away natively: f1 stays 0644, but user 1001 has a named entry without r.
    setfacl(&["-m", "u:1001:---"], &t.s("d/f1"));
    assert_eq!(read_as(1001, &t.s("d/f1")), "EACCES", "native f1");
    let want = getfacl(&t.s("d/f1"));
    assert!(
        wait_for(LIMIT, || read_as(1001, &t.m("d/f1")) == "EACCES").is_some(),
        "an ACL denying uid 1001 set in SRC after ls -l is not enforced: {} ({})",
        read_as(1001, &t.m("d/f1")),
        getfacl(&t.m("d/f1"))
    );
    assert_eq!(getfacl(&t.m("d/f1")), want, "f1's ACL through the mount");
    // Given natively: f2 is 0600 root's, user 1001 gets r through a named entry.
    setfacl(&["-m", "u:1001:r"], &t.s("d/f2"));
    assert_eq!(read_as(1001, &t.s("d/f2")), "ok", "native f2");
    let want = getfacl(&t.s("d/f2"));
    assert!(
        wait_for(LIMIT, || read_as(1001, &t.m("d/f2")) == "ok").is_some(),
        "an ACL granting uid 1001 set in SRC after ls -l is not enforced: {} ({})",
        read_as(1001, &t.m("d/f2")),
        getfacl(&t.m("d/f2"))
    );
    assert_eq!(getfacl(&t.m("d/f2")), want, "f2's ACL through the mount");
    // And `ls -l` shows the `+` of both, as natively.
    let ls = |d: &Path| {
        let o = std::process::Command::new("ls")
            .arg("-l")
            .arg(d)
            .output()
            .expect("ls -l");
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() > 8).then(|| format!("{} {}", f[0], f[8]))
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(ls(&t.m("d")), ls(&t.s("d")), "ls -l modes");
    assert!(ls(&t.m("d"))
        .iter()
        .any(|l| l.starts_with("-rw-r--r--+") && l.ends_with("f1")));
}

/// `ls -lR` (a GETXATTR of each entry's ACL) keeps listings full: no LOOKUP of lean names
/// after the first ACL request, over more directories than one full-listing period
/// (`lean::FULL_LISTINGS`): before, every period began lean again and the walker looked up
/// the names of the next directories one by one.
#[test]
fn ls_lr_keeps_listings_full() {
    if !can_mount() {
        return cannot_run("no FUSE");
    }
    attempts(|i| {
        let t = TestMount::without_feed();
        for d in 0..300 {
            let dir = t.s(&format!("w{i}/d{d:03}"));
            std::fs::create_dir_all(&dir).expect("mkdir");
            std::fs::write(dir.join("f"), b"x").expect("write");
        }
        let o = std::process::Command::new("ls")
            .arg("-lR")
            .arg(t.m(&format!("w{i}")))
            .output()
            .expect("ls -lR");
        assert!(o.status.success(), "ls -lR failed");
        let files = String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| l.ends_with(" f"))
            .count();
        assert_eq!(files, 300, "ls -lR output");
        // One LOOKUP: `ls` stats its argument first.
        expect("ls -lR of 300 directories", lookups(&t), 1)
    });
}
