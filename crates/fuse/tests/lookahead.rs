//! Listing a directory on LOOKUPs (`lookahead.rs`, `-o lookahead`): the second lstat of a
//! name a small directory does not hold lists it (with attributes) and reads it through the
//! mount, so the names that follow cost no backend lookup and, once the kernel holds them,
//! no LOOKUP; what programs see stays what the tree holds (native lstat is the oracle), also
//! when SRC changes after or while directories are listed this way; directories the caller
//! may not read, and large ones looked up a few times, are not listed.

mod common;
use common::*;
use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use dircache_fuse::CachePolicy;

/// The default policy with lookahead on (the default, stated: `CachePolicy::lookahead`).
fn on() -> CachePolicy {
    CachePolicy {
        lookahead: true,
        ..CachePolicy::default()
    }
}
use serde_json::{json, Value};

const LIMIT: Duration = Duration::from_secs(20);

fn stats(t: &TestMount) -> Value {
    dircache_fuse::stats::query_mount(&t.mnt, &json!({"op": "stats"})).expect("stats")["stats"]
        .clone()
}

fn num(v: &Value, path: &[&str]) -> u64 {
    let mut v = v;
    for p in path {
        v = &v[*p];
    }
    v.as_u64()
        .unwrap_or_else(|| panic!("no number at {path:?} in {v}"))
}

fn backend_lookups(t: &TestMount) -> u64 {
    num(&stats(t), &["core", "backend_lookup"])
}

fn lookahead(t: &TestMount) -> u64 {
    num(&stats(t), &["prefetch", "lookahead"])
}

fn kernel_reads(t: &TestMount) -> u64 {
    num(&stats(t), &["prefetch", "lookahead_kernel_reads"])
}

fn kernel_lookups(t: &TestMount) -> u64 {
    num(&stats(t), &["kernel_requests", "by_kind", "lookup"])
}

/// `n` files of different sizes and one subdirectory in `dir`.
fn files(dir: &Path, n: usize) {
    std::fs::create_dir_all(dir.join("sub")).expect("mkdir");
    for f in 0..n {
        std::fs::write(dir.join(format!("f{f}")), vec![b'x'; f % 17]).expect("write");
    }
}

/// inode, size, mode, nlink, mtime.
type Stat = (u64, u64, u32, u64, i64);

/// What lstat shows of a path (None: it does not exist).
fn lstat(p: &Path) -> Option<Stat> {
    std::fs::symlink_metadata(p)
        .ok()
        .map(|m| (m.ino(), m.len(), m.mode(), m.nlink(), m.mtime()))
}

/// name -> lstat of every entry of `dir`.
fn view(dir: &Path) -> BTreeMap<String, Option<Stat>> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return BTreeMap::new();
    };
    rd.filter_map(|e| e.ok())
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            (name, lstat(&dir.join(e.file_name())))
        })
        .collect()
}

/// Run `f(i)` on fresh directories until one attempt sees the counts it expects: other jobs
/// on this machine drop the kernel's dentries (drop_caches, reclaim), which makes the kernel
/// look names up again. A cause of ours fails every attempt.
fn attempts(mut f: impl FnMut(usize) -> Result<(), String>) {
    let mut last = String::new();
    for i in 0..6 {
        match f(i) {
            Ok(()) => return,
            Err(e) => last = e,
        }
    }
    panic!("6 attempts failed, the last: {last}");
}

#[test]
fn lstats_in_a_directory_list_it_once_and_match_native() {
    if !can_mount() {
        return cannot_run("no FUSE");
    }
    let t = TestMount::filled(on(), |s| files(&s.join("d"), 100));
    std::fs::symlink_metadata(t.m("d")).expect("stat d");
    let (b0, l0) = (backend_lookups(&t), lookahead(&t));
    for f in 0..100 {
        let rel = format!("d/f{f}");
        assert_eq!(lstat(&t.m(&rel)), lstat(&t.s(&rel)), "{rel}");
    }
    // `f0` is one backend lookup; `f1`, the second miss, listed `d`; the rest came from it.
    assert_eq!(
        backend_lookups(&t) - b0,
        1,
        "backend lookups for 100 lstats"
    );
    assert_eq!(lookahead(&t) - l0, 1, "listings on lookups");
    // A name that is not there: a miss of a complete directory, no backend call.
    assert!(lstat(&t.m("d/none")).is_none());
    assert_eq!(
        backend_lookups(&t) - b0,
        1,
        "backend lookups after a missing name"
    );
    assert_eq!(view(&t.m("d")), view(&t.s("d")));
}

#[test]
fn the_kernel_holds_the_siblings_after_two_lookups() {
    if !can_mount() {
        return cannot_run("no FUSE");
    }
    let t = TestMount::filled(on(), |s| {
        for i in 0..6 {
            files(&s.join(format!("k{i}")), 60);
        }
    });
    attempts(|i| {
        let d = format!("k{i}");
        std::fs::symlink_metadata(t.m(&d)).map_err(|e| e.to_string())?;
        let r0 = kernel_reads(&t);
        lstat(&t.m(&format!("{d}/f0")));
        lstat(&t.m(&format!("{d}/f1")));
        if wait_for(LIMIT, || kernel_reads(&t) > r0).is_none() {
            return Err(format!("{d}: no read through the mount"));
        }
        let k0 = kernel_lookups(&t);
        for f in 2..60 {
            let rel = format!("{d}/f{f}");
            if lstat(&t.m(&rel)) != lstat(&t.s(&rel)) {
                return Err(format!("{rel} differs from native"));
            }
        }
        // 58 LOOKUPs without the read through the mount.
        match kernel_lookups(&t) - k0 {
            0 => Ok(()),
            n => Err(format!("{d}: {n} LOOKUPs for 58 lstats after the read")),
        }
    });
}

#[test]
fn a_directory_listed_on_lookups_sees_outside_changes() {
    if !can_mount() {
        return cannot_run("no FUSE");
    }
    let t = TestMount::filled(on(), |s| files(&s.join("c"), 20));
    let l0 = lookahead(&t);
    for f in 0..20 {
        lstat(&t.m(&format!("c/f{f}")));
    }
    assert_eq!(lookahead(&t) - l0, 1, "listings on lookups");
    assert!(wait_for(LIMIT, || kernel_reads(&t) >= 1).is_some());
    // Behind the mount's back, after the listing: every change must show.
    std::fs::write(t.s("c/new"), b"new file").expect("write");
    std::fs::remove_file(t.s("c/f3")).expect("rm");
    std::fs::set_permissions(t.s("c/f4"), std::fs::Permissions::from_mode(0o600)).expect("chmod");
    std::fs::write(t.s("c/f5"), b"longer content now").expect("write");
    std::fs::rename(t.s("c/f6"), t.s("c/g6")).expect("rename");
    std::fs::create_dir(t.s("c/newdir")).expect("mkdir");
    let same = || {
        ["new", "f3", "f4", "f5", "f6", "g6", "newdir"]
            .iter()
            .all(|n| lstat(&t.m(&format!("c/{n}"))) == lstat(&t.s(&format!("c/{n}"))))
    };
    assert!(wait_for(LIMIT, same).is_some(), "outside changes not seen");
    assert!(
        wait_for(LIMIT, || view(&t.m("c")) == view(&t.s("c"))).is_some(),
        "listing differs: {:?} vs {:?}",
        view(&t.m("c")),
        view(&t.s("c"))
    );
}

#[test]
fn changes_while_lookups_list_directories_are_never_kept() {
    if !can_mount() {
        return cannot_run("no FUSE");
    }
    const DIRS: usize = 24;
    let t = TestMount::filled(on(), |s| {
        for i in 0..DIRS {
            files(&s.join(format!("r/d{i}")), 30);
        }
    });
    let src = t.s("r");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mutator = {
        let (src, stop) = (src.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let d = src.join(format!("d{}", n % DIRS as u64));
                let f = d.join(format!("f{}", (n * 7) % 30));
                match n % 4 {
                    0 => drop(std::fs::write(d.join(format!("x{n}")), b"created")),
                    1 => drop(std::fs::remove_file(&f)),
                    2 => drop(std::fs::write(&f, vec![b'y'; (n % 50) as usize])),
                    _ => drop(std::fs::rename(&f, d.join(format!("moved{n}")))),
                }
                n += 1;
                std::thread::sleep(Duration::from_micros(200));
            }
        })
    };
    // Lookups that list each directory while the mutator changes it.
    for round in 0..3 {
        for i in 0..DIRS {
            for f in 0..30 {
                lstat(&t.m(&format!("r/d{i}/f{}", (f + round) % 30)));
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    mutator.join().expect("mutator");
    assert!(lookahead(&t) >= 1, "no directory was listed on lookups");
    for i in 0..DIRS {
        let rel = format!("r/d{i}");
        let ok = wait_for(LIMIT, || {
            let names: Vec<String> = view(&t.s(&rel)).into_keys().collect();
            view(&t.m(&rel)) == view(&t.s(&rel))
                && names
                    .iter()
                    .chain(["f0", "f1", "nothere"].map(String::from).iter())
                    .all(|n| {
                        let p = format!("{rel}/{n}");
                        lstat(&t.m(&p)) == lstat(&t.s(&p))
                    })
        });
        assert!(
            ok.is_some(),
            "{rel}: mount {:?} native {:?}",
            view(&t.m(&rel)),
            view(&t.s(&rel))
        );
    }
}

#[test]
fn unreadable_and_large_directories_are_not_listed_on_two_lookups() {
    if !can_mount() {
        return cannot_run("no FUSE");
    }
    let t = TestMount::filled(on(), |s| {
        // Searchable, not readable by others: lookups as another user must not list it.
        files(&s.join("x"), 10);
        chmod(&s.join("x"), 0o711);
        chmod(s, 0o755);
        // Large: 3,000 names of 40 bytes (well over 64 KiB of directory).
        std::fs::create_dir(s.join("big")).expect("mkdir");
        for f in 0..3000 {
            std::fs::write(s.join(format!("big/{f:0>40}")), b"").expect("write");
        }
    });
    let big = t.s("big");
    let size = std::fs::metadata(&big).expect("stat").len();
    // (Two lookups in the root list the root.)
    std::fs::symlink_metadata(t.m("x")).expect("stat x");
    std::fs::symlink_metadata(t.m("big")).expect("stat big");
    let l0 = lookahead(&t);
    let out = py(
        &t.mnt,
        "import os\nprint(sum(os.lstat('x/f%d' % i).st_size for i in range(10)))",
        Some(65534),
    );
    let want: u64 = (0..10).map(|f| (f % 17) as u64).sum();
    assert_eq!(out.trim(), want.to_string(), "lstat as uid 65534");
    for f in 0..5 {
        lstat(&t.m(&format!("big/{f:0>40}")));
    }
    assert_eq!(
        lookahead(&t) - l0,
        0,
        "listed on lookups (big dir {size} bytes)"
    );
    // Enough lookups of a large directory (one per KiB of its size) list it.
    if size <= 1 << 20 {
        let b0 = backend_lookups(&t);
        for f in 5..(5 + size / 1024 + 1) {
            lstat(&t.m(&format!("big/{f:0>40}")));
        }
        assert_eq!(lookahead(&t) - l0, 1, "big dir of {size} bytes not listed");
        assert!(backend_lookups(&t) - b0 <= size / 1024);
        for f in [1000, 2999] {
            let rel = format!("big/{f:0>40}");
            assert_eq!(lstat(&t.m(&rel)), lstat(&t.s(&rel)));
        }
    }
}

#[test]
fn stats_after_a_lean_listing_fetch_attributes_without_listing_again() {
    if !can_mount() {
        return cannot_run("no FUSE");
    }
    let t = TestMount::filled(on(), |s| files(&s.join("l"), 40));
    std::fs::symlink_metadata(t.m("l")).expect("stat l");
    let readdirs = || num(&stats(&t), &["core", "backend_readdir"]);
    let r0 = readdirs();
    // `du`: the listing (lean: names only), then a stat of each entry.
    let names: Vec<_> = std::fs::read_dir(t.m("l"))
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names.len(), 41);
    for n in &names {
        let rel = format!("l/{}", n.to_string_lossy());
        assert_eq!(lstat(&t.m(&rel)), lstat(&t.s(&rel)), "{rel}");
    }
    assert_eq!(readdirs() - r0, 1, "backend listings");
    assert_eq!(view(&t.m("l")), view(&t.s("l")));
}

#[test]
fn nolookahead_looks_up_every_name() {
    if !can_mount() {
        return cannot_run("no FUSE");
    }
    let t = TestMount::filled(
        CachePolicy {
            lookahead: false,
            ..CachePolicy::default()
        },
        |s| files(&s.join("d"), 30),
    );
    std::fs::symlink_metadata(t.m("d")).expect("stat d");
    let b0 = backend_lookups(&t);
    for f in 0..30 {
        let rel = format!("d/f{f}");
        assert_eq!(lstat(&t.m(&rel)), lstat(&t.s(&rel)), "{rel}");
    }
    assert_eq!(backend_lookups(&t) - b0, 30, "{}", stats(&t));
    assert_eq!(lookahead(&t), 0);
}

/// A plain `umount` (no MNT_DETACH) right after lookups made lookahead read directories
/// through the mount: the reads must not make it fail with EBUSY (they go through a
/// detached clone of the mount, `Prefetcher::read_through_kernel`, which holds the file
/// system but not the mount the user unmounts). Four large directories, two lstats in each
/// (four reads through the mount start at once), then umount2(MNT, 0), on 8 fresh mounts (EBUSY in 6 of 12 before).
#[test]
fn a_plain_umount_during_reads_through_the_mount_is_not_busy() {
    if !can_mount() {
        return cannot_run("no FUSE");
    }
    let mut busy = 0;
    let rounds = 8;
    for _ in 0..rounds {
        let t = TestMount::filled(on(), |s| {
            for d in 0..4 {
                files(&s.join(format!("k{d}")), 900);
            }
        });
        for d in 0..4 {
            std::fs::symlink_metadata(t.m(&format!("k{d}"))).expect("stat k");
        }
        let r0 = kernel_reads(&t);
        for d in 0..4 {
            lstat(&t.m(&format!("k{d}/f0")));
            lstat(&t.m(&format!("k{d}/f1")));
        }
        let path = std::ffi::CString::new(t.mnt.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: umount2(2) of a NUL-terminated path.
        if unsafe { libc::umount2(path.as_ptr(), 0) } != 0 {
            let e = std::io::Error::last_os_error();
            assert_eq!(e.raw_os_error(), Some(libc::EBUSY), "umount: {e}");
            busy += 1;
            // The reads did start (else this round proves nothing either way).
            assert!(
                wait_for(LIMIT, || kernel_reads(&t) > r0).is_some(),
                "no read through the mount"
            );
        } else {
            // Unmounted: the session ends once the last read is done (the drop waits).
            assert!(
                wait_for(LIMIT, || !dircache_fuse::is_mount_point(&t.mnt)).is_some(),
                "still mounted after umount"
            );
        }
    }
    assert_eq!(
        busy, 0,
        "umount failed with EBUSY in {busy} of {rounds} rounds"
    );
}

/// The kernel marks the atime of a directory it read from the file system stale; lookahead's
/// read of a directory through the mount must not leave it so (the next `stat` of the
/// directory by a program was a GETATTR: `cli/tests/cached_view.rs`'s warm walk sent 1-4).
#[test]
fn a_directory_read_through_the_mount_needs_no_getattr_after() {
    if !can_mount() {
        return cannot_run("no FUSE");
    }
    let t = TestMount::filled(on(), |s| {
        for i in 0..6 {
            files(&s.join(format!("k{i}")), 60);
        }
    });
    let getattrs = |t: &TestMount| num(&stats(t), &["kernel_requests", "by_kind", "getattr"]);
    attempts(|i| {
        let d = t.m(&format!("k{i}"));
        std::fs::symlink_metadata(&d).map_err(|e| e.to_string())?;
        let r0 = kernel_reads(&t);
        lstat(&d.join("f0"));
        lstat(&d.join("f1"));
        if wait_for(LIMIT, || kernel_reads(&t) > r0).is_none() {
            return Err(format!("k{i}: no read through the mount"));
        }
        let g0 = getattrs(&t);
        let seen = lstat(&d);
        let n = getattrs(&t) - g0;
        if n != 0 {
            return Err(format!("k{i}: stat after the read sent {n} GETATTR"));
        }
        assert_eq!(seen, lstat(&t.s(&format!("k{i}"))), "k{i}");
        Ok(())
    });
}

fn ahead_reads(t: &TestMount) -> u64 {
    num(&stats(t), &["prefetch", "lookahead_ahead_reads"])
}

/// Six outside changes in `dir` (relative to SRC and MNT), made after it was read ahead:
/// a new file, a removed one, a chmod, new content, a rename, a new directory.
fn change_outside(t: &TestMount, dir: &str) -> Vec<String> {
    let s = |n: &str| t.s(&format!("{dir}/{n}"));
    std::fs::write(s("new"), b"new file").expect("write");
    std::fs::remove_file(s("f3")).expect("rm");
    std::fs::set_permissions(s("f4"), std::fs::Permissions::from_mode(0o600)).expect("chmod");
    std::fs::write(s("f5"), b"longer content now than before").expect("write");
    std::fs::rename(s("f6"), s("g6")).expect("rename");
    std::fs::create_dir(s("newdir")).expect("mkdir");
    ["new", "f3", "f4", "f5", "f6", "g6", "newdir"]
        .iter()
        .map(|n| format!("{dir}/{n}"))
        .collect()
}

/// Reads ahead of lookups, two levels (`-o ahead=2`; off by default).
fn ahead2() -> CachePolicy {
    CachePolicy {
        lookahead_levels: 2,
        ..on()
    }
}

/// What `git status` does cold: lstat of every tracked path in path order. Two lookups in
/// `g` list it; its subdirectories and theirs (`-o ahead=2`) are listed and read
/// through the mount ahead of the lstat calls, which then send no LOOKUP; a file changed in
/// SRC after its directory was read ahead shows as SRC has it.
#[test]
fn subdirectories_are_read_ahead_of_lookups_and_see_outside_changes() {
    if !can_mount() {
        return cannot_run("no FUSE");
    }
    // Each g alone in its directory: no siblings read ahead (`ahead_of_lookups`).
    let t = TestMount::filled(ahead2(), |s| {
        for i in 0..6 {
            let g = s.join(format!("p{i}/g"));
            files(&g, 10);
            for d in 0..3 {
                files(&g.join(format!("s{d}")), 40);
                files(&g.join(format!("s{d}/t")), 20);
            }
        }
    });
    // Per g: s0..s2 and sub (level 1), s*/sub and s*/t (level 2), s*/t/sub (level 3: not).
    const AHEAD: u64 = 4 + 6;
    // MNT listed: the lookups of `p*` are not misses of MNT.
    std::fs::read_dir(&t.mnt).expect("ls MNT").for_each(drop);
    let mut done = String::new();
    attempts(|i| {
        let g = format!("p{i}/g");
        done = g.clone();
        std::fs::symlink_metadata(t.m(&g)).map_err(|e| e.to_string())?;
        let a0 = ahead_reads(&t);
        lstat(&t.m(&format!("{g}/f0")));
        lstat(&t.m(&format!("{g}/f1")));
        if wait_for(LIMIT, || ahead_reads(&t) >= a0 + AHEAD).is_none() {
            return Err(format!(
                "{g}: {} of {AHEAD} subdirectories read ahead",
                ahead_reads(&t) - a0
            ));
        }
        let k0 = kernel_lookups(&t);
        let mut n = 0;
        for d in 0..3 {
            for f in 0..40 {
                let rel = format!("{g}/s{d}/f{f}");
                if lstat(&t.m(&rel)) != lstat(&t.s(&rel)) {
                    return Err(format!("{rel} differs from native"));
                }
                n += 1;
            }
            for f in 0..20 {
                let rel = format!("{g}/s{d}/t/f{f}");
                if lstat(&t.m(&rel)) != lstat(&t.s(&rel)) {
                    return Err(format!("{rel} differs from native"));
                }
                n += 1;
            }
        }
        match kernel_lookups(&t) - k0 {
            0 => Ok(()),
            l => Err(format!("{g}: {l} LOOKUPs for {n} lstats read ahead")),
        }
    });
    // Behind the mount's back, after the reads ahead: a level-1 and a level-2 directory.
    let (s1, t2) = (format!("{done}/s1"), format!("{done}/s2/t"));
    let mut changed = change_outside(&t, &s1);
    changed.extend(change_outside(&t, &t2));
    let same = || {
        changed
            .iter()
            .all(|rel| lstat(&t.m(rel)) == lstat(&t.s(rel)))
    };
    assert!(
        wait_for(LIMIT, same).is_some(),
        "outside changes not seen: {:?}",
        changed
            .iter()
            .map(|rel| (rel, lstat(&t.m(rel)), lstat(&t.s(rel))))
            .collect::<Vec<_>>()
    );
    for d in [&s1, &t2] {
        assert!(
            wait_for(LIMIT, || view(&t.m(d)) == view(&t.s(d))).is_some(),
            "{d}: listing differs: {:?} vs {:?}",
            view(&t.m(d)),
            view(&t.s(d))
        );
    }
}

/// A directory a walker's prefetch listed into the core (complete, with attributes) but
/// the kernel does not hold: LOOKUPs of its names are hits in the core, each a round trip.
/// Two of them read it through the mount; the lstat calls that follow send no LOOKUP, and a
/// file changed in SRC afterwards shows as SRC has it.
#[test]
fn lookups_in_a_directory_listed_ahead_of_a_walker_read_it_through_the_mount() {
    if !can_mount() {
        return cannot_run("no FUSE");
    }
    let full = CachePolicy {
        lean: false,
        ..on()
    };
    let t = TestMount::filled(full, |s| {
        for i in 0..6 {
            for d in 0..4 {
                files(&s.join(format!("w{i}/s{d}")), 30);
            }
        }
    });
    let listings = |t: &TestMount| num(&stats(t), &["prefetch", "listings"]);
    std::fs::read_dir(&t.mnt).expect("ls MNT").for_each(drop);
    let mut done = String::new();
    attempts(|i| {
        let w = format!("w{i}");
        done = format!("{w}/s0");
        let p0 = listings(&t);
        // `ls w`: its parent was listed, so its subdirectories are listed ahead (prefetch.rs).
        std::fs::read_dir(t.m(&w))
            .map_err(|e| e.to_string())?
            .for_each(drop);
        if wait_for(LIMIT, || listings(&t) >= p0 + 4).is_none() {
            return Err(format!("{w}: subdirectories not prefetched"));
        }
        let b0 = backend_lookups(&t);
        let r0 = kernel_reads(&t);
        lstat(&t.m(&format!("{w}/s0/f0")));
        lstat(&t.m(&format!("{w}/s0/f1")));
        if wait_for(LIMIT, || kernel_reads(&t) > r0).is_none() {
            return Err(format!("{w}/s0: no read through the mount"));
        }
        let k0 = kernel_lookups(&t);
        for f in 2..30 {
            let rel = format!("{w}/s0/f{f}");
            if lstat(&t.m(&rel)) != lstat(&t.s(&rel)) {
                return Err(format!("{rel} differs from native"));
            }
        }
        if backend_lookups(&t) != b0 {
            return Err(format!("{w}/s0: backend lookups in a complete directory"));
        }
        match kernel_lookups(&t) - k0 {
            0 => Ok(()),
            n => Err(format!("{w}/s0: {n} LOOKUPs for 28 lstats after the read")),
        }
    });
    let changed = change_outside(&t, &done);
    assert!(
        wait_for(LIMIT, || changed
            .iter()
            .all(|rel| lstat(&t.m(rel)) == lstat(&t.s(rel))))
        .is_some(),
        "outside changes not seen"
    );
    assert!(
        wait_for(LIMIT, || view(&t.m(&done)) == view(&t.s(&done))).is_some(),
        "listing differs"
    );
}

/// git's lstat calls go from a directory's files to its subdirectories, then to the next
/// directory in path order: the siblings after a directory listed on lookups (its parent
/// listed) are read ahead too, and their lstat calls send no LOOKUP; a file changed in SRC
/// after its directory was read ahead shows as SRC has it.
#[test]
fn siblings_after_a_directory_listed_on_lookups_are_read_ahead() {
    if !can_mount() {
        return cannot_run("no FUSE");
    }
    let t = TestMount::filled(ahead2(), |s| {
        for i in 0..6 {
            for d in ["a", "b", "c"] {
                files(&s.join(format!("q{i}/{d}")), 30);
            }
        }
    });
    let mut done = String::new();
    attempts(|i| {
        let q = format!("q{i}");
        done = q.clone();
        std::fs::read_dir(t.m(&q))
            .map_err(|e| e.to_string())?
            .for_each(drop);
        let a0 = ahead_reads(&t);
        lstat(&t.m(&format!("{q}/a/f0")));
        lstat(&t.m(&format!("{q}/a/f1")));
        // a/sub, b, c, b/sub, c/sub.
        if wait_for(LIMIT, || ahead_reads(&t) >= a0 + 5).is_none() {
            return Err(format!("{q}: {} of 5 read ahead", ahead_reads(&t) - a0));
        }
        let k0 = kernel_lookups(&t);
        for d in ["b", "c"] {
            for f in 0..30 {
                let rel = format!("{q}/{d}/f{f}");
                if lstat(&t.m(&rel)) != lstat(&t.s(&rel)) {
                    return Err(format!("{rel} differs from native"));
                }
            }
        }
        match kernel_lookups(&t) - k0 {
            0 => Ok(()),
            n => Err(format!(
                "{q}: {n} LOOKUPs for 60 lstats in siblings read ahead"
            )),
        }
    });
    let changed = change_outside(&t, &format!("{done}/c"));
    assert!(
        wait_for(LIMIT, || changed
            .iter()
            .all(|rel| lstat(&t.m(rel)) == lstat(&t.s(rel))))
        .is_some(),
        "outside changes not seen"
    );
}

/// Make open_tree(2) fail with EPERM on every thread of this process, for good (a seccomp
/// filter synchronised to all threads), as for a daemon that may not clone mounts (no
/// CAP_SYS_ADMIN, or a container's seccomp profile).
#[cfg(target_arch = "x86_64")]
fn refuse_open_tree_in_this_process() {
    use libc::{sock_filter, sock_fprog, BPF_ABS, BPF_JEQ, BPF_JMP, BPF_K, BPF_LD, BPF_RET, BPF_W};
    let op = |code: u32, jt, jf, k| sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    let arch_x86_64 = 0xc000_003e; // AUDIT_ARCH_X86_64
    let filter = [
        // seccomp_data.arch (offset 4): anything else is let through.
        op(BPF_LD | BPF_W | BPF_ABS, 0, 0, 4),
        op(BPF_JMP | BPF_JEQ | BPF_K, 0, 3, arch_x86_64),
        // seccomp_data.nr (offset 0).
        op(BPF_LD | BPF_W | BPF_ABS, 0, 0, 0),
        op(BPF_JMP | BPF_JEQ | BPF_K, 0, 1, libc::SYS_open_tree as u32),
        op(
            BPF_RET | BPF_K,
            0,
            0,
            libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
        ),
        op(BPF_RET | BPF_K, 0, 0, libc::SECCOMP_RET_ALLOW),
    ];
    let prog = sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr() as *mut sock_filter,
    };
    // SAFETY: seccomp(2) with a filter program that outlives the call (the kernel copies it).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_TSYNC,
            &prog as *const sock_fprog,
        )
    };
    assert_eq!(rc, 0, "seccomp: {}", std::io::Error::last_os_error());
}

/// Set in the child process of `a_plain_umount_after_lookups_without_open_tree_is_not_busy`.
const NO_OPEN_TREE: &str = "DIRCACHE_TEST_NO_OPEN_TREE";

/// `a_plain_umount_during_reads_through_the_mount_is_not_busy` for a daemon that may not
/// clone the mount (open_tree(2) refused with EPERM, in a child process of this test: a
/// seccomp filter cannot be taken back): the lookups are answered as natively and a plain
/// umount right after them never fails with EBUSY (the daemon opened the directories on
/// the mount itself to read them through it before).
#[test]
#[cfg(target_arch = "x86_64")]
fn a_plain_umount_after_lookups_without_open_tree_is_not_busy() {
    if !can_mount() {
        return cannot_run("no FUSE");
    }
    if std::env::var_os(NO_OPEN_TREE).is_none() {
        let o = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "a_plain_umount_after_lookups_without_open_tree_is_not_busy",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(NO_OPEN_TREE, "1")
            .output()
            .expect("child test");
        let out = String::from_utf8_lossy(&o.stdout);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "child: {out}\n{err}");
        assert!(
            out.contains("1 passed"),
            "the child ran nothing: {out}\n{err}"
        );
        return;
    }
    let mut busy = 0;
    let rounds = 8;
    // Mounted first: mounting clones a tree too (`rootmount.rs`).
    let mounts: Vec<_> = (0..rounds)
        .map(|_| {
            TestMount::filled(on(), |s| {
                for d in 0..4 {
                    files(&s.join(format!("k{d}")), 900);
                }
            })
        })
        .collect();
    refuse_open_tree_in_this_process();
    for t in mounts {
        for d in 0..4 {
            std::fs::symlink_metadata(t.m(&format!("k{d}"))).expect("stat k");
        }
        let seen: Vec<_> = (0..4)
            .flat_map(|d| ["f0", "f1"].map(|f| format!("k{d}/{f}")))
            .map(|p| (lstat(&t.m(&p)), p))
            .collect();
        let path = std::ffi::CString::new(t.mnt.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: umount2(2) of a NUL-terminated path.
        if unsafe { libc::umount2(path.as_ptr(), 0) } != 0 {
            let e = std::io::Error::last_os_error();
            assert_eq!(e.raw_os_error(), Some(libc::EBUSY), "umount: {e}");
            busy += 1;
        } else {
            assert!(
                wait_for(LIMIT, || !dircache_fuse::is_mount_point(&t.mnt)).is_some(),
                "still mounted after umount"
            );
        }
        for (got, p) in seen {
            assert_eq!(got, lstat(&t.s(&p)), "{p}");
        }
    }
    assert_eq!(
        busy, 0,
        "umount failed with EBUSY in {busy} of {rounds} rounds"
    );
}

/// `-o kreaders=0` (`CachePolicy::kernel_readers`): directories listed on lookups are not
/// read through the mount (the bench's "does the read pay for itself" variant): every lstat
/// that follows is a LOOKUP, answered from the core's listing (no backend lookup), and what
/// it answers is native's.
#[test]
fn kreaders_0_reads_nothing_through_the_mount() {
    if !can_mount() {
        return cannot_run("no FUSE");
    }
    let t = TestMount::filled(
        CachePolicy {
            kernel_readers: 0,
            ..on()
        },
        |s| files(&s.join("d"), 60),
    );
    std::fs::symlink_metadata(t.m("d")).expect("stat d");
    let (b0, l0) = (backend_lookups(&t), lookahead(&t));
    lstat(&t.m("d/f0"));
    lstat(&t.m("d/f1"));
    assert_eq!(lookahead(&t) - l0, 1, "listings on lookups");
    // A read through the mount, if one were queued, starts within this.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(kernel_reads(&t), 0, "reads through the mount");
    let k0 = kernel_lookups(&t);
    for f in 2..60 {
        let rel = format!("d/f{f}");
        assert_eq!(lstat(&t.m(&rel)), lstat(&t.s(&rel)), "{rel}");
    }
    assert_eq!(kernel_lookups(&t) - k0, 58, "LOOKUPs for 58 lstats");
    assert_eq!(backend_lookups(&t) - b0, 1, "backend lookups");
}
