//! Warm runs send no FUSE requests when nothing changed, and the long kernel caching that
//! allows it stays coherent.
//!
//! Each read-only workload of `dircache bench apps` (find, du, ls -lR, fd, stat loops, git
//! status and diff, a no-op make, a Python import, reads of small files) runs twice on a real
//! mount; the daemon's request counters of the second run must be empty, except for the
//! requests the kernel sends whatever the daemon answers (docs/benchmarks.md, "What a warm run
//! still sends"):
//! - STATFS: `find` and `du` (gnulib fts) call `fstatfs` once; the kernel caches no statfs.
//! - GETXATTR `security.selinux`: `ls -l` asks once per device; the answer (EOPNOTSUPP) is
//!   not cached by the kernel, and only ENOSYS would stop it, for every xattr.
//! - (No GETXATTR of the mount root's ACLs: SRC is served below the FUSE root, whose ACLs
//!   the kernel never caches; see `root_acl_cached_for_non_owner_walks_and_ls_l`.)
//! - OPEN / FLUSH / RELEASE of opened files (helper "opens" owns these round trips).
//! - (No GETATTR of a file read: a passthrough read marks the kernel's atime stale after
//!   every read (`fuse_file_accessed` -> `fuse_invalidate_atime`) and the next `stat`
//!   asked; small files opened read-only are served from the page cache instead
//!   (`CachePolicy::cached_reads_max`), whose hits leave the atime alone.)
//! - IOCTL (`other`): Python 3.11's `open()` calls `isatty()` (TCGETS) on every file it
//!   opens, and the kernel forwards every ioctl on a FUSE file.
//!
//! Counting is disturbed when the kernel drops its caches during a run (memory pressure, or
//! `echo 3 > /proc/sys/vm/drop_caches` by another process: `bench apps` does so for its cold
//! runs). A measured run during which /proc/vmstat's drop or reclaim counters moved is run
//! again (up to 30 times).

mod common;
use common::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use dircache_fuse::CachePolicy;

const LIMIT: Duration = Duration::from_secs(10);

/// The daemon's request counts by kind, and the notifier's counts (`notify_*`: changes
/// from the feed, invalidations sent to the kernel).
fn requests(t: &TestMount) -> BTreeMap<String, u64> {
    let v = dircache_fuse::stats::query(
        &t.dir.path().join("ctl.sock"),
        &serde_json::json!({"op": "stats"}),
    )
    .expect("stats");
    let mut m = BTreeMap::new();
    if let Some(o) = v["stats"]["kernel_requests"]["by_kind"].as_object() {
        for (k, n) in o {
            m.insert(k.clone(), n.as_u64().unwrap_or(0));
        }
    }
    if let Some(o) = v["stats"]["notifier"].as_object() {
        for (k, n) in o {
            m.insert(format!("notify_{k}"), n.as_u64().unwrap_or(0));
        }
    }
    m
}

/// /proc/vmstat's counts of what makes the kernel drop cached pages, dentries and inodes:
/// drop_caches writes and page reclaim (memory pressure anywhere on the machine).
fn drops() -> Vec<u64> {
    let s = std::fs::read_to_string("/proc/vmstat").unwrap_or_default();
    let get = |k: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(k).map(|v| v.trim().parse().unwrap_or(0)))
            .unwrap_or(0)
    };
    [
        "drop_pagecache ",
        "drop_slab ",
        "pgscan_kswapd ",
        "pgscan_direct ",
        "slabs_scanned ",
    ]
    .iter()
    .map(|k| get(k))
    .collect()
}

fn diff(a: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    b.iter()
        .filter_map(|(k, n)| {
            let d = n - a.get(k).copied().unwrap_or(0);
            (d > 0).then(|| (k.clone(), d))
        })
        .collect()
}

/// Requests sent by one run of `f` once the kernel's caches are warm, on a run during which
/// nobody dropped them. RELEASE is sent after close returns: the counts settle first.
///
/// Two runs warm up: the first fills the caches, and what it fetched (a listing or data read
/// from the daemon) marks the atime of those inodes stale in the kernel
/// (`fuse_invalidate_atime`), so the second run's `stat`s ask for their attributes once more
/// (GETATTR, which also makes the kernel forget the inode's cached ACLs: `ls -l` asks for
/// them in the run after). Every run after that is the warm state measured here.
///
/// `clean` says whether a run's counts are the expected ones. On this shared machine the
/// kernel also drops cached pages and dentries of idle mounts when others need memory or
/// write drop_caches (not all of it shows in /proc/vmstat: reclaim inside another memory
/// cgroup does not), so an unclean run is repeated: up to 30 runs during which no drop or
/// reclaim was counted (runs with one do not count), within 3 minutes. A cause of ours sends
/// its requests in every run and still fails.
fn warm_requests(
    t: &TestMount,
    mut f: impl FnMut(),
    clean: impl Fn(&BTreeMap<String, u64>) -> bool,
) -> BTreeMap<String, u64> {
    f();
    f();
    let mut last = BTreeMap::new();
    let mut unclean = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    while unclean < 30 && std::time::Instant::now() < deadline {
        settle(t);
        let d0 = drops();
        let r0 = requests(t);
        f();
        settle(t);
        let r1 = requests(t);
        last = diff(&r0, &r1);
        if clean(&last) {
            return last;
        }
        // A run during which the kernel was seen dropping caches does not count.
        if drops() == d0 {
            unclean += 1;
            eprintln!("unclean warm run without a drop or reclaim counted: {last:?}");
        }
    }
    last
}

/// Wait until no request or change arrives for 100 ms (asynchronous RELEASEs of the last
/// run, the change feed's reports of changes made in SRC).
fn settle(t: &TestMount) {
    let mut last = requests(t);
    let mut quiet = 0;
    let _ = wait_for(LIMIT, || {
        std::thread::sleep(Duration::from_millis(20));
        let now = requests(t);
        if now == last {
            quiet += 1;
        } else {
            quiet = 0;
            last = now;
        }
        quiet >= 5
    });
}

/// Whether every kind in `got` is in `allowed`, within its bound.
fn only(got: &BTreeMap<String, u64>, allowed: &[(&str, u64)]) -> bool {
    got.iter()
        .all(|(k, n)| allowed.iter().any(|(a, max)| a == k && n <= max))
}

/// Fail unless every kind in `got` is in `allowed`, within its bound.
fn assert_only(what: &str, got: &BTreeMap<String, u64>, allowed: &[(&str, u64)]) {
    assert!(
        only(got, allowed),
        "{what}: warm runs sent {got:?}; allowed only {allowed:?} (nothing changed)"
    );
}

/// A tree for the workloads: headers in nested directories, a git repository with one
/// modified file, a Makefile whose targets are up to date, a Python package.
fn make_workload_tree(src: &Path) {
    sh_ok(
        src,
        r#"set -e
        for d in a b c; do for s in x y; do
          mkdir -p inc/$d/$s
          for i in $(seq 1 60); do echo "int f$i;" > inc/$d/$s/h$i.h; echo "x" > inc/$d/$s/n$i.txt; done
        done; done
        ln -s a/x inc/link
        mkdir repo && cd repo
        for i in $(seq 1 80); do echo "line $i" > f$i.c; done
        touch -d '2020-01-01' f*.c
        git init -q && git add -A && git commit -qm init && echo changed >> f1.c
        cd .. && mkdir -p mk/out
        printf 'SRCS := $(wildcard ../inc/a/x/*.h)\nOBJS := $(patsubst ../inc/a/x/%%.h,out/%%.o,$(SRCS))\nall: $(OBJS)\nout/%%.o: ../inc/a/x/%%.h\n\ttouch $@\n' > mk/Makefile
        make -s -C mk
        mkdir -p py/pkg
        for i in $(seq 1 20); do echo "import json; X$i = $i" > py/pkg/m$i.py; done
        echo "from . import $(seq -s, -f 'm%g' 1 20)" > py/pkg/__init__.py
        "#,
    );
}

fn run(dir: &Path, script: &str) {
    sh_ok(dir, script);
}

/// The read-only workloads of `bench apps`, warm: the second run sends nothing but the
/// kernel's unavoidable requests (module doc).
#[test]
fn warm_workloads_send_no_requests() {
    if !can_mount() {
        return;
    }
    let t = TestMount::new();
    make_workload_tree(&t.src);
    let m = t.mnt.clone();
    // Output through the mount equals native (the caches being exercised are right).
    assert_eq!(
        sh_ok(&m, "find . -name '*.h' | sort"),
        sh_ok(&t.src, "find . -name '*.h' | sort")
    );
    type Case = (&'static str, &'static str, Vec<(&'static str, u64)>);
    let cases: Vec<Case> = vec![
        ("find", "find . -name '*.h' >/dev/null", vec![("statfs", 1)]),
        ("du -s", "du -s . >/dev/null", vec![("statfs", 1)]),
        // Not at the mount root: the kernel does not keep the root inode's ACLs (each
        // `ls -l` naming the root asks for both of them; see the root ACL test below).
        ("ls -lR", "ls -lR inc >/dev/null", vec![("getxattr", 1)]),
        ("stat loop", "stat inc/*/*/* >/dev/null", vec![]),
        ("fd", "fdfind -u . . >/dev/null", vec![]),
        (
            "git status",
            "git -C repo --no-optional-locks status --porcelain >/dev/null",
            vec![("open", 100), ("flush", 100), ("release", 100)],
        ),
        (
            "git diff",
            "git -C repo --no-optional-locks diff >/dev/null",
            vec![("open", 100), ("flush", 100), ("release", 100)],
        ),
        (
            "no-op make",
            "make -q -C mk",
            vec![("open", 2), ("flush", 2), ("release", 2)],
        ),
        (
            "python import",
            "cd py && python3 -B -c 'import pkg'",
            vec![("open", 30), ("flush", 30), ("release", 30), ("other", 30)],
        ),
        (
            "cat",
            "cat inc/a/x/*.h >/dev/null",
            vec![("open", 60), ("flush", 60), ("release", 60)],
        ),
    ];
    for (what, script, allowed) in cases {
        let got = warm_requests(&t, || run(&m, script), |g| only(g, &allowed));
        eprintln!("warm {what}: {got:?}");
        assert_only(what, &got, &allowed);
    }
}

/// How many opens the daemon answered with a passthrough backing file.
fn passthrough_opens(t: &TestMount) -> u64 {
    let v = dircache_fuse::stats::query(
        &t.dir.path().join("ctl.sock"),
        &serde_json::json!({"op": "stats"}),
    )
    .expect("stats");
    v["stats"]["kernel_requests"]["passthrough_opens"]
        .as_u64()
        .unwrap_or(0)
}

/// Small files opened read-only go through the page cache, larger or written ones through
/// passthrough, and the two share an inode without the kernel refusing an open (it fails
/// an open(2) in the other io mode with EIO): readers then writers, writers then readers,
/// data seen both ways, no stale pages after a passthrough write, changes made in SRC seen.
#[test]
fn cached_and_passthrough_opens_share_an_inode() {
    use std::io::Write;
    use std::os::unix::fs::FileExt;
    if !can_mount() {
        return;
    }
    let t = TestMount::new();
    std::fs::write(t.s("small"), b"hello world\n").unwrap();
    std::fs::write(t.s("big"), vec![7u8; 2 << 20]).unwrap();
    let read = |f: &std::fs::File| {
        let mut b = vec![0u8; 64];
        let n = f.read_at(&mut b, 0).expect("pread");
        b.truncate(n);
        String::from_utf8(b).unwrap()
    };
    let p0 = passthrough_opens(&t);
    assert_eq!(std::fs::read(t.m("small")).unwrap(), b"hello world\n");
    assert_eq!(
        passthrough_opens(&t),
        p0,
        "a small file read went passthrough"
    );
    assert_eq!(std::fs::read(t.m("big")).unwrap().len(), 2 << 20);
    assert_eq!(
        passthrough_opens(&t),
        p0 + 1,
        "a large file read is not passthrough"
    );

    // A reader (page cache), then a writer of the same inode: served alike.
    let r = std::fs::File::open(t.m("small")).unwrap();
    assert_eq!(read(&r), "hello world\n");
    let w = std::fs::OpenOptions::new()
        .write(true)
        .open(t.m("small"))
        .expect("a writer while a cached reader is open");
    w.write_all_at(b"HELLO", 0).unwrap();
    assert_eq!(read(&r), "HELLO world\n");
    assert_eq!(std::fs::read(t.s("small")).unwrap(), b"HELLO world\n");
    let r2 = std::fs::File::open(t.m("small")).expect("a second reader");
    assert_eq!(read(&r2), "HELLO world\n");
    drop((r, w, r2));

    // A writer (passthrough), then a reader: the reader shares the backing file.
    let p1 = passthrough_opens(&t);
    let mut w = std::fs::OpenOptions::new()
        .append(true)
        .open(t.m("small"))
        .unwrap();
    assert_eq!(
        passthrough_opens(&t),
        p1 + 1,
        "a writer alone is not passthrough"
    );
    let r = std::fs::File::open(t.m("small")).expect("a reader while a passthrough writer is open");
    w.write_all(b"more\n").unwrap();
    assert_eq!(read(&r), "HELLO world\nmore\n");
    drop((r, w));
    // Pages read before the passthrough write are not served after it.
    assert_eq!(
        std::fs::read_to_string(t.m("small")).unwrap(),
        "HELLO world\nmore\n"
    );

    // Changed in SRC, same size: read through the mount once the feed reports it.
    std::fs::write(t.s("small"), b"abcde world\nmore\n").unwrap();
    assert!(
        wait_for(LIMIT, || std::fs::read(t.m("small")).ok().as_deref()
            == Some(&b"abcde world\nmore\n"[..]))
        .is_some(),
        "a change made in SRC was not seen: {:?}",
        std::fs::read_to_string(t.m("small"))
    );
}

/// Without passthrough, reads of cached data are page-cache hits, which leave the kernel's
/// atime alone: a warm run that reads files sends only the OPEN/RELEASE round trips. (With
/// passthrough every read marks the atime stale and the next stat asks: GETATTR.)
#[test]
fn warm_reads_without_passthrough_send_no_getattr() {
    if !can_mount() {
        return;
    }
    let t = TestMount::with_policy(CachePolicy {
        passthrough: false,
        ..CachePolicy::default()
    });
    make_workload_tree(&t.src);
    let m = t.mnt.clone();
    for (what, script) in [
        (
            "git status",
            "git -C repo --no-optional-locks status --porcelain >/dev/null",
        ),
        ("cat", "cat inc/a/x/*.h >/dev/null"),
    ] {
        let allowed = [("open", 100), ("flush", 100), ("release", 100)];
        let got = warm_requests(&t, || run(&m, script), |g| only(g, &allowed));
        eprintln!("warm {what} (nopassthrough): {got:?}");
        assert_only(what, &got, &allowed);
    }
}

/// On a read-only mount the kernel never marks an atime stale (`IS_RDONLY`): warm reads send
/// only their OPEN/RELEASE round trips, with passthrough too.
#[test]
fn warm_reads_on_a_read_only_mount_send_no_getattr() {
    if !can_mount() {
        return;
    }
    let t = TestMount::read_only(make_workload_tree);
    let m = t.mnt.clone();
    assert!(
        std::fs::write(t.m("inc/new"), b"").is_err(),
        "the mount is not read-only"
    );
    for (what, script) in [
        (
            "git status",
            "git -C repo --no-optional-locks status --porcelain >/dev/null",
        ),
        ("cat", "cat inc/a/x/*.h >/dev/null"),
        ("ls -lR", "ls -lR inc >/dev/null"),
    ] {
        let allowed = [
            ("open", 100),
            ("flush", 100),
            ("release", 100),
            ("getxattr", 1),
        ];
        let got = warm_requests(&t, || run(&m, script), |g| only(g, &allowed));
        eprintln!("warm {what} (ro): {got:?}");
        assert_only(what, &got, &allowed);
    }
}

/// The kernel caches the POSIX ACLs of the mount's root like any other inode's. A FUSE root
/// inode is made in `fuse_fill_super_common` before the INIT reply sets `fc->posix_acl`, so
/// `fuse_init_inode` marks it ACL_DONT_CACHE for good (6.18.42+): mounted as MNT's root, every
/// path walk through MNT by a user who does not own it asked for `system.posix_acl_access`
/// (`acl_permission_check` -> `check_acl`), and every `ls -l` naming it for both ACLs. SRC is
/// served one directory below the FUSE root (`rootmount.rs`): MNT's root is an inode made by
/// a LOOKUP after INIT. Warm, neither sends anything. (Before: 50 GETXATTR for 50 walks.)
#[test]
fn root_acl_cached_for_non_owner_walks_and_ls_l() {
    if !can_mount() {
        return;
    }
    let t = TestMount::new();
    chmod(t.dir.path(), 0o755);
    std::fs::create_dir(t.s("d")).unwrap();
    std::fs::write(t.s("d/f"), b"x").unwrap();
    let abs = t.m("d/f");
    let n = 50;
    let walks = format!(
        "import os\nfor _ in range({n}): os.stat({:?})\n",
        abs.to_str().unwrap()
    );
    let got = warm_requests(
        &t,
        || {
            py(t.dir.path(), &walks, Some(65534));
        },
        |got| got.is_empty(),
    );
    eprintln!("{n} non-owner walks through the root: {got:?}");
    assert!(
        got.is_empty(),
        "{n} non-owner walks through the root sent {got:?}"
    );
    // `ls -l` of MNT and of its root itself (`-d`), as a user who does not own it: its ACLs
    // (and its entries') come from the kernel's cache. `security.selinux` is asked once per
    // device by each `ls` (the kernel does not cache that EOPNOTSUPP): 2 runs of `ls`.
    let mnt = t.mnt.to_str().unwrap().to_string();
    let ls = format!(
        "import subprocess\nfor a in (['-l'], ['-ld']): subprocess.run(['ls', *a, {mnt:?}], \
         check=True, stdout=subprocess.DEVNULL)\n"
    );
    let allowed = [("getxattr", 2)];
    let got = warm_requests(
        &t,
        || {
            py(t.dir.path(), &ls, Some(65534));
        },
        |got| only(got, &allowed),
    );
    eprintln!("ls -l and ls -ld of MNT as a non-owner: {got:?}");
    assert_only("ls -l MNT (non-owner)", &got, &allowed);
}

/// A listing the kernel reads again (its directory changed) does not make `ls -l` ask for
/// the ACL of every entry: entries the kernel holds come back without touching its cache.
#[test]
fn relisting_a_changed_directory_keeps_cached_acls() {
    if !can_mount() {
        return;
    }
    let t = TestMount::new();
    std::fs::create_dir(t.s("d")).unwrap();
    for i in 0..300 {
        std::fs::write(t.s(&format!("d/f{i}")), b"x").unwrap();
    }
    let ls = || sh_ok(&t.mnt, "ls -l d");
    let _ = warm_requests(
        &t,
        || {
            ls();
        },
        |_| true,
    );
    // A clean attempt: the listing was read again, and `ls -l` asked for the xattrs of the
    // directory itself (its ACLs, after its attributes were asked again; security.selinux)
    // but not of each entry, and looked nothing up. Attempts are repeated only because the
    // machine may drop cached entries meanwhile (see `warm_requests`).
    let clean = |got: &BTreeMap<String, u64>| {
        got.get("readdirplus").copied().unwrap_or(0) >= 1
            && got.get("getxattr").copied().unwrap_or(0) <= 8
            && got.get("lookup").copied().unwrap_or(0) == 0
    };
    for (how, dir) in [("outside", t.src.clone()), ("mount", t.mnt.clone())] {
        let mut got = BTreeMap::new();
        let (mut attempt, mut unclean) = (0, 0);
        while unclean < 5 && attempt < 100 {
            attempt += 1;
            let _ = ls();
            let _ = ls();
            settle(&t);
            let name = format!("new-{how}-{attempt}");
            std::fs::write(dir.join("d").join(&name), b"").unwrap();
            let d0 = drops();
            let r0 = requests(&t);
            assert!(
                wait_for(LIMIT, || ls().contains(&name)).is_some(),
                "{how}: new file never listed"
            );
            settle(&t);
            got = diff(&r0, &requests(&t));
            eprintln!("ls -l after a change ({how}): {got:?}");
            if clean(&got) {
                break;
            }
            if drops() == d0 {
                unclean += 1;
            }
        }
        assert!(
            clean(&got),
            "{how}: after one new name, ls -l asked for the xattrs of every entry again \
             (or the listing was not read again): {got:?}"
        );
    }
}

/// After warm runs (listings, attributes, ACLs and entries all held by the kernel), changes
/// made in SRC and through the mount are seen: the kernel keeps nothing stale.
#[test]
fn changes_after_warm_runs_are_seen() {
    if !can_mount() {
        return;
    }
    let t = TestMount::new();
    std::fs::create_dir(t.s("d")).unwrap();
    for i in 0..50 {
        std::fs::write(t.s(&format!("d/f{i}")), b"x").unwrap();
    }
    let warm = || {
        let _ = warm_requests(
            &t,
            || {
                sh_ok(
                    &t.mnt,
                    "ls -lR . >/dev/null; getfacl -R d >/dev/null 2>&1; stat d/* >/dev/null",
                );
            },
            |_| true,
        );
    };
    let ls = |name: &str| sh_ok(&t.mnt, &format!("ls -l d/{name} 2>/dev/null || true"));
    let facl = |name: &str| sh_ok(&t.mnt, &format!("getfacl -cp d/{name}"));
    for (how, base) in [("outside", t.src.clone()), ("mount", t.mnt.clone())] {
        let p = |n: &str| base.join("d").join(n);
        // A new name in the listing.
        warm();
        std::fs::write(p(&format!("added-{how}")), b"").unwrap();
        let want = format!("added-{how}");
        assert!(
            wait_for(LIMIT, || sh_ok(&t.mnt, "ls d").lines().any(|l| l == want)).is_some(),
            "{how}: new name not listed"
        );
        // An ACL set with setfacl.
        warm();
        sh_ok(&base, "setfacl -m u:4321:r d/f1");
        assert!(
            wait_for(LIMIT, || facl("f1").contains("user:4321:r--")
                && ls("f1").starts_with("-rw-r--r--+"))
            .is_some(),
            "{how}: ACL not seen: {} {}",
            facl("f1"),
            ls("f1")
        );
        sh_ok(&base, "setfacl -b d/f1");
        assert!(
            wait_for(LIMIT, || !facl("f1").contains("4321")
                && ls("f1").starts_with("-rw-r--r-- "))
            .is_some(),
            "{how}: ACL removal not seen: {}",
            ls("f1")
        );
        // chmod.
        warm();
        chmod(&p("f2"), 0o600);
        assert!(
            wait_for(LIMIT, || ls("f2").starts_with("-rw------- ")).is_some(),
            "{how}: chmod not seen: {}",
            ls("f2")
        );
        chmod(&p("f2"), 0o644);
        // mtime.
        warm();
        sh_ok(&base, "touch -m -d '2001-02-03 04:05:06' d/f3");
        assert!(
            wait_for(LIMIT, || sh_ok(&t.mnt, "stat -c %Y d/f3").trim()
                == "981173106")
            .is_some(),
            "{how}: mtime not seen"
        );
        // Removal.
        warm();
        std::fs::remove_file(p(&format!("added-{how}"))).unwrap();
        assert!(
            wait_for(LIMIT, || !sh_ok(&t.mnt, "ls d").lines().any(|l| l == want)).is_some(),
            "{how}: removed name still listed"
        );
        // The same name again (often with the same inode number): listed and found.
        warm();
        std::fs::write(p(&format!("added-{how}")), b"again").unwrap();
        assert!(
            wait_for(LIMIT, || sh_ok(&t.mnt, "ls d").lines().any(|l| l == want)
                && std::fs::read(t.m(&format!("d/{want}"))).ok().as_deref()
                    == Some(b"again"))
            .is_some(),
            "{how}: re-created name not seen"
        );
    }
}
