//! Issue 7, findings 3, 10 and 12: nothing stays stale or goes missing.
//!
//! * 3: changes made natively on a file system mounted inside SRC (tmpfs, bind mounts, also
//!   mounted after the daemon started) reach the mount, as they do natively.
//! * 10: cache pressure (a tiny `max_entries`) never turns an existing file into ENOENT.
//! * 12: a chmod or link made natively through another hard-link name shows on every name.

mod common;
use common::*;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an outside change may take to show (natively: immediately).
const LIMIT: Duration = Duration::from_secs(3);

/// A dircache mount over a SRC prepared before mounting (for mounts inside it), with a core
/// configuration of our choice. Drop unmounts FUSE, then every mount made inside SRC, then
/// removes the directory.
struct Fixture {
    src: PathBuf,
    mnt: PathBuf,
    thread: Option<JoinHandle<()>>,
    /// Mounts made inside SRC (unmounted on drop, last first).
    inner: Vec<PathBuf>,
    dir: Option<tempfile::TempDir>,
}

impl Fixture {
    fn new(config: dircache_core::Config, prepare: impl FnOnce(&mut Fixture)) -> Fixture {
        Self::with_policy(config, dircache_fuse::CachePolicy::default(), prepare)
    }

    fn with_policy(
        config: dircache_core::Config,
        policy: dircache_fuse::CachePolicy,
        prepare: impl FnOnce(&mut Fixture),
    ) -> Fixture {
        let dir = tempfile::Builder::new()
            .prefix("dcfeed")
            .tempdir()
            .expect("tempdir");
        chmod(dir.path(), 0o755);
        let src = dir.path().join("src");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&src).expect("mkdir src");
        std::fs::create_dir(&mnt).expect("mkdir mnt");
        let mut f = Fixture {
            src: src.clone(),
            mnt: mnt.clone(),
            thread: None,
            inner: Vec::new(),
            dir: Some(dir),
        };
        prepare(&mut f);
        let backend = dircache_local::LocalBackend::new(&src).expect("local backend");
        let cache = dircache_core::Cache::new(Arc::new(backend), config).expect("cache");
        let mut cfg = dircache_fuse::MountConfig::new(&src, &mnt);
        cfg.policy = policy;
        let mounted = dircache_fuse::mount(cache, &cfg).expect("mount");
        f.thread = Some(std::thread::spawn(move || {
            if let Err(e) = mounted.run() {
                eprintln!("session: {e}");
            }
        }));
        f
    }

    fn m(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    fn s(&self, rel: &str) -> PathBuf {
        self.src.join(rel)
    }

    fn tmp(&self) -> &Path {
        self.dir.as_ref().expect("dir").path()
    }

    /// `mount ARGS... TARGET` (TARGET inside SRC or elsewhere in the fixture), undone on drop.
    fn mount(&mut self, args: &[&str], target: &Path) {
        std::fs::create_dir_all(target).expect("mkdir mount point");
        let st = Command::new("mount")
            .args(args)
            .arg(target)
            .status()
            .expect("mount");
        assert!(st.success(), "mount {args:?} {}", target.display());
        self.inner.push(target.to_path_buf());
    }

    /// Undo the last [`Fixture::mount`].
    fn umount_last(&mut self) {
        let m = self.inner.last().expect("a mount").clone();
        let st = Command::new("umount").arg(&m).status().expect("umount");
        // Still in `inner` on failure, so that Drop unmounts it (lazily).
        assert!(st.success(), "umount {} failed (busy?)", m.display());
        self.inner.pop();
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if self.thread.is_some() && dircache_fuse::unmount(&self.mnt).is_err() {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
        if let Some(t) = self.thread.take() {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !t.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if t.is_finished() {
                let _ = t.join();
            }
        }
        for m in self.inner.drain(..).rev() {
            let _ = Command::new("umount").arg("-l").arg(&m).status();
        }
        drop(self.dir.take());
    }
}

/// Whether uid 1000 can read `p` (runs `cat` as that user).
fn user_reads(p: &Path) -> bool {
    user_cat(p).is_ok()
}

/// `cat p` as uid 1000: Ok, or Err(stderr).
fn user_cat(p: &Path) -> Result<(), String> {
    let o = Command::new("setpriv")
        .args(["--reuid=1000", "--regid=1000", "--clear-groups", "cat"])
        .arg(p)
        .stdout(std::process::Stdio::null())
        .output()
        .expect("setpriv");
    if o.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&o.stderr).into_owned())
    }
}

fn names(p: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(p)
        .map(|r| {
            r.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// `n/d/e/pub` (0644) under `top`, with `n/d` and `n/d/e` 0755.
fn make_pub(top: &Path) {
    std::fs::create_dir_all(top.join("d/e")).unwrap();
    chmod(&top.join("d"), 0o755);
    chmod(&top.join("d/e"), 0o755);
    std::fs::write(top.join("d/e/pub"), b"public\n").unwrap();
    chmod(&top.join("d/e/pub"), 0o644);
}

/// The checks of finding 3 on the file system mounted at SRC/`rel`: a chmod 700 of `d`
/// natively takes uid 1000's access away through the mount; a file created natively appears.
fn check_submount(f: &Fixture, rel: &str) {
    let p = |s: &str| format!("{rel}/{s}");
    assert!(user_reads(&f.m(&p("d/e/pub"))), "{rel}: readable at first");
    assert_eq!(names(&f.m(rel)), names(&f.s(rel)), "{rel}: listing");
    assert!(std::fs::metadata(f.m(&p("fresh"))).is_err());

    chmod(&f.s(&p("d")), 0o700);
    assert!(!user_reads(&f.s(&p("d/e/pub"))), "natively denied");
    assert!(
        wait_for(LIMIT, || !user_reads(&f.m(&p("d/e/pub")))).is_some(),
        "{rel}: uid 1000 still reads MNT/{rel}/d/e/pub after `chmod 700 SRC/{rel}/d`"
    );
    let err = user_cat(&f.m(&p("d/e/pub"))).unwrap_err();
    assert!(
        err.contains("Permission denied"),
        "{rel}: EACCES expected, as natively: {err}"
    );

    std::fs::write(f.s(&p("fresh")), b"new\n").unwrap();
    assert!(
        wait_for(LIMIT, || std::fs::read(f.m(&p("fresh")))
            .is_ok_and(|c| c == b"new\n"))
        .is_some(),
        "{rel}: a file created natively in SRC/{rel} does not appear"
    );
    assert!(
        wait_for(LIMIT, || names(&f.m(rel)) == names(&f.s(rel))).is_some(),
        "{rel}: listing stale: {:?} vs {:?}",
        names(&f.m(rel)),
        names(&f.s(rel))
    );
}

#[test]
fn tmpfs_inside_src_is_kept_up_to_date() {
    if !can_mount() {
        return;
    }
    let f = Fixture::new(dircache_core::Config::default(), |f| {
        let t = f.s("n");
        f.mount(&["-t", "tmpfs", "-o", "mode=0755", "dcfeed"], &t);
        make_pub(&t);
    });
    check_submount(&f, "n");
}

#[test]
fn bind_mount_inside_src_is_kept_up_to_date() {
    if !can_mount() {
        return;
    }
    let f = Fixture::new(dircache_core::Config::default(), |f| {
        // A directory of SRC's own file system, outside SRC, bound inside it.
        let other = f.tmp().join("other");
        std::fs::create_dir(&other).unwrap();
        chmod(&other, 0o755);
        make_pub(&other);
        let b = f.s("b");
        f.mount(&["--bind", other.to_str().unwrap()], &b);
        // And a tmpfs directory bound elsewhere in SRC.
        let t = f.tmp().join("t");
        f.mount(&["-t", "tmpfs", "-o", "mode=0755", "dcfeed"], &t);
        std::fs::create_dir(t.join("sub")).unwrap();
        make_pub(&t.join("sub"));
        let tb = f.s("tb");
        f.mount(&["--bind", t.join("sub").to_str().unwrap()], &tb);
    });
    check_submount(&f, "b");
    check_submount(&f, "tb");
}

#[test]
fn mount_added_after_start_is_followed() {
    if !can_mount() {
        return;
    }
    let mut f = Fixture::new(dircache_core::Config::default(), |f| {
        std::fs::create_dir(f.s("late")).unwrap();
        std::fs::write(f.s("late/under"), b"hidden").unwrap();
    });
    assert_eq!(names(&f.m("late")), vec!["under".to_string()]);
    let t = f.s("late");
    f.mount(&["-t", "tmpfs", "-o", "mode=0755", "dcfeed"], &t);
    make_pub(&t);
    assert!(
        wait_for(LIMIT, || names(&f.m("late")) == names(&f.s("late"))).is_some(),
        "a tmpfs mounted on SRC/late after start is not shown: {:?} vs {:?}",
        names(&f.m("late")),
        names(&f.s("late"))
    );
    check_submount(&f, "late");
    // And unmounted again: the directory below shows through once more.
    f.umount_last();
    assert!(
        wait_for(LIMIT, || names(&f.m("late")) == vec!["under".to_string()]).is_some(),
        "SRC/late unmounted, the mount still shows {:?}",
        names(&f.m("late"))
    );
    assert!(
        wait_for(LIMIT, || std::fs::read(f.m("late/under"))
            .is_ok_and(|c| c == b"hidden"))
        .is_some(),
        "SRC/late/under unreadable after the unmount"
    );
}

/// Issue 8, bug 1 (the same root as finding 10): a file the kernel holds stays up to date
/// after the core was forced to evict hundreds of entries.
#[test]
fn held_file_follows_outside_chmod_after_evictions() {
    if !can_mount() {
        return;
    }
    let config = dircache_core::Config {
        max_entries: 64,
        ..Default::default()
    };
    let policy = dircache_fuse::CachePolicy {
        attr_ttl: Duration::ZERO,
        ..Default::default()
    };
    let f = Fixture::with_policy(config, policy, |f| {
        sh_ok(
            &f.src,
            "set -e; mkdir d; echo t > d/target; chmod 644 d/target; \
             for i in $(seq 1 600); do echo $i > d/f$i; done",
        );
    });
    let held = std::fs::File::open(f.m("d/target")).unwrap();
    for i in 1..=600 {
        std::fs::metadata(f.m(&format!("d/f{i}"))).unwrap();
    }
    chmod(&f.s("d/target"), 0o600);
    assert!(
        wait_for(LIMIT, || std::fs::metadata(f.m("d/target"))
            .is_ok_and(|m| m.mode() & 0o777 == 0o600))
        .is_some(),
        "MNT/d/target still shows mode {:o} after `chmod 600 SRC/d/target`",
        std::fs::metadata(f.m("d/target")).unwrap().mode() & 0o777
    );
    drop(held);
}

/// `find` output for every file under `root`, with `root` cut off each path.
fn find(root: &Path) -> (bool, String, String) {
    let o = Command::new("find")
        .arg(".")
        .args(["-printf", "%p %y %s %m %n %U %G\\n"])
        .current_dir(root)
        .env("LC_ALL", "C")
        .output()
        .expect("find");
    let mut lines: Vec<&str> = std::str::from_utf8(&o.stdout).unwrap().lines().collect();
    lines.sort_unstable();
    (
        o.status.success(),
        lines.join("\n"),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn cache_pressure_never_hides_existing_files() {
    if !can_mount() {
        return;
    }
    let config = dircache_core::Config {
        max_entries: 64,
        ..Default::default()
    };
    let f = Fixture::new(config, |f| {
        sh_ok(
            &f.src,
            "set -e; for d in $(seq 1 20); do mkdir -p d$d/s; \
             for i in $(seq 1 60); do echo $d$i > d$d/f$i; done; \
             for i in $(seq 1 40); do echo $i > d$d/s/g$i; done; done",
        );
    });
    let (_, native, _) = find(&f.src);
    // Directories a program has open (as its working directory would be): the kernel keeps
    // their inodes while it forgets the names below them.
    let held: Vec<std::fs::File> = (1..=20)
        .map(|d| std::fs::File::open(f.m(&format!("d{d}/s"))).unwrap())
        .collect();
    for round in 1..=3 {
        if round == 3 {
            // The kernel forgets the inodes it held (as under memory pressure): it looks
            // every name up again, below directories the core evicted meanwhile.
            std::fs::write("/proc/sys/vm/drop_caches", "2\n").expect("drop_caches");
        }
        let (ok, out, err) = find(&f.mnt);
        let first_err: String = err.lines().take(5).collect::<Vec<_>>().join("\n");
        assert!(
            ok && err.is_empty(),
            "find round {round} failed ({} error lines), e.g.:\n{first_err}",
            err.lines().count()
        );
        assert!(
            out == native,
            "find round {round}: output differs from native"
        );
        // stat of every file by name, too (lookups of names the kernel may have dropped).
        let mut missing = 0;
        for d in 1..=20 {
            let names = (1..=60)
                .map(|i| format!("d{d}/f{i}"))
                .chain((1..=40).map(|i| format!("d{d}/s/g{i}")));
            for rel in names {
                match std::fs::metadata(f.m(&rel)) {
                    Ok(m) if m.len() > 0 => {}
                    _ => missing += 1,
                }
            }
        }
        assert_eq!(missing, 0, "round {round}: files missing through the mount");
    }
    drop(held);
}

#[test]
fn hard_link_changes_through_another_name_show() {
    if !can_mount() {
        return;
    }
    let f = Fixture::new(dircache_core::Config::default(), |f| {
        std::fs::write(f.s("a"), b"x").unwrap();
        chmod(&f.s("a"), 0o644);
        std::fs::hard_link(f.s("a"), f.s("b")).unwrap();
    });
    let m = std::fs::metadata(f.m("a")).unwrap();
    assert_eq!((m.mode() & 0o777, m.nlink()), (0o644, 2));

    chmod(&f.s("b"), 0o600);
    assert!(
        wait_for(LIMIT, || std::fs::metadata(f.m("a"))
            .is_ok_and(|m| m.mode() & 0o777 == 0o600))
        .is_some(),
        "`chmod 600 SRC/b` not seen on MNT/a: mode {:o}",
        std::fs::metadata(f.m("a")).unwrap().mode() & 0o777
    );

    std::fs::hard_link(f.s("b"), f.s("c")).unwrap();
    assert!(
        wait_for(LIMIT, || std::fs::metadata(f.m("a"))
            .is_ok_and(|m| m.nlink() == 3))
        .is_some(),
        "`ln SRC/b SRC/c` not seen on MNT/a: nlink {}",
        std::fs::metadata(f.m("a")).unwrap().nlink()
    );

    std::fs::remove_file(f.s("c")).unwrap();
    assert!(
        wait_for(LIMIT, || std::fs::metadata(f.m("a"))
            .is_ok_and(|m| m.nlink() == 2))
        .is_some(),
        "`rm SRC/c` not seen on MNT/a: nlink {}",
        std::fs::metadata(f.m("a")).unwrap().nlink()
    );
}

/// How long the feed may take in the tests of the feed's filter (generous: a loaded machine).
const FEED: Duration = Duration::from_secs(15);

/// The feed ignores events in directories outside SRC (remembering each as outside): a
/// directory created outside, changed there, then moved into SRC (itself, or a directory above
/// it) must be followed: its later native changes show through the mount. Moved out again, the
/// mount forgets it.
#[test]
fn directory_moved_in_from_outside_shows_its_changes() {
    if !can_mount() {
        return;
    }
    let f = Fixture::new(dircache_core::Config::default(), |f| {
        std::fs::create_dir(f.s("in")).unwrap();
        let out = f.tmp().join("out");
        std::fs::create_dir_all(out.join("d")).unwrap();
        std::fs::create_dir_all(out.join("p/q")).unwrap();
    });
    let out = f.tmp().join("out");
    assert!(names(&f.m("in")).is_empty());
    // Outside changes: the feed sees them (the same file system) and drops them.
    std::fs::write(out.join("d/f"), b"1").unwrap();
    std::fs::write(out.join("p/q/g"), b"1").unwrap();
    std::fs::create_dir(out.join("p/q/sub")).unwrap();
    std::fs::rename(out.join("d"), f.s("in/d")).unwrap();
    std::fs::rename(out.join("p"), f.s("in/p")).unwrap();
    assert!(
        wait_for(FEED, || names(&f.m("in")) == ["d", "p"]).is_some(),
        "moved-in directories not shown: {:?}",
        names(&f.m("in"))
    );
    // Cached through the mount: listings and attributes.
    assert_eq!(names(&f.m("in/d")), ["f"]);
    assert_eq!(names(&f.m("in/p/q")), ["g", "sub"]);
    assert_eq!(std::fs::metadata(f.m("in/d/f")).unwrap().len(), 1);
    assert_eq!(std::fs::metadata(f.m("in/p/q/g")).unwrap().len(), 1);
    // Native changes inside them now.
    std::fs::write(f.s("in/d/f"), b"22").unwrap();
    std::fs::write(f.s("in/d/new"), b"").unwrap();
    std::fs::write(f.s("in/p/q/g"), b"333").unwrap();
    std::fs::remove_dir(f.s("in/p/q/sub")).unwrap();
    let size = |p: &str| std::fs::metadata(f.m(p)).map(|m| m.len()).ok();
    assert!(
        wait_for(FEED, || size("in/d/f") == Some(2)).is_some(),
        "a write in a directory moved in not seen: size {:?}",
        size("in/d/f")
    );
    assert!(
        wait_for(FEED, || names(&f.m("in/d")) == ["f", "new"]).is_some(),
        "a file created in a directory moved in not seen: {:?}",
        names(&f.m("in/d"))
    );
    assert!(
        wait_for(FEED, || size("in/p/q/g") == Some(3)).is_some(),
        "a write below a tree moved in not seen: size {:?}",
        size("in/p/q/g")
    );
    assert!(
        wait_for(FEED, || names(&f.m("in/p/q")) == ["g"]).is_some(),
        "an rmdir below a tree moved in not seen: {:?}",
        names(&f.m("in/p/q"))
    );
    // Out again.
    std::fs::rename(f.s("in/p"), out.join("p2")).unwrap();
    assert!(
        wait_for(FEED, || names(&f.m("in")) == ["d"]).is_some(),
        "a tree moved out still shown: {:?}",
        names(&f.m("in"))
    );
}

/// A file of SRC hard-linked outside SRC, changed through its outside name (chmod, write, ln,
/// rm), shows the change on its SRC name through the mount; so does a singly linked file that
/// is given an outside name and changed through it.
#[test]
fn hard_link_changes_through_an_outside_name_show() {
    if !can_mount() {
        return;
    }
    let f = Fixture::new(dircache_core::Config::default(), |f| {
        let out = f.tmp().join("out");
        std::fs::create_dir(&out).unwrap();
        std::fs::write(f.s("a"), b"x").unwrap();
        chmod(&f.s("a"), 0o644);
        std::fs::hard_link(f.s("a"), out.join("a2")).unwrap();
        std::fs::write(f.s("s"), b"s").unwrap();
        chmod(&f.s("s"), 0o644);
    });
    let out = f.tmp().join("out");
    let st = |p: &str| {
        std::fs::metadata(f.m(p))
            .map(|m| (m.mode() & 0o777, m.nlink(), m.len()))
            .unwrap()
    };
    assert_eq!(st("a"), (0o644, 2, 1));
    assert_eq!(st("s"), (0o644, 1, 1));
    chmod(&out.join("a2"), 0o600);
    assert!(
        wait_for(FEED, || st("a").0 == 0o600).is_some(),
        "`chmod 600 OUT/a2` not seen on MNT/a: {:?}",
        st("a")
    );
    std::fs::write(out.join("a2"), b"written").unwrap();
    assert!(
        wait_for(FEED, || st("a").2 == 7).is_some(),
        "a write through OUT/a2 not seen on MNT/a: {:?}",
        st("a")
    );
    std::fs::hard_link(out.join("a2"), out.join("a3")).unwrap();
    assert!(
        wait_for(FEED, || st("a").1 == 3).is_some(),
        "`ln OUT/a2 OUT/a3` not seen on MNT/a: {:?}",
        st("a")
    );
    std::fs::remove_file(out.join("a3")).unwrap();
    assert!(
        wait_for(FEED, || st("a").1 == 2).is_some(),
        "`rm OUT/a3` not seen on MNT/a: {:?}",
        st("a")
    );
    std::fs::hard_link(f.s("s"), out.join("s2")).unwrap();
    assert!(
        wait_for(FEED, || st("s").1 == 2).is_some(),
        "`ln SRC/s OUT/s2` not seen on MNT/s: {:?}",
        st("s")
    );
    chmod(&out.join("s2"), 0o600);
    assert!(
        wait_for(FEED, || st("s").0 == 0o600).is_some(),
        "`chmod 600 OUT/s2` not seen on MNT/s: {:?}",
        st("s")
    );
}
