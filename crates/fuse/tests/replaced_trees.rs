//! Coherence while SRC changes under a reader of the mount (the kernel as the oracle):
//! a tree removed and made again in SRC while programs list it through the mount, and a file
//! read through the mount right after it was written in SRC.

mod common;
use common::*;

use std::collections::BTreeSet;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// Every name any version of the tree has (the listings may show only these).
fn all_names() -> BTreeSet<String> {
    let mut s = BTreeSet::new();
    for d in 0..6 {
        s.insert(format!("d{d}"));
        s.insert(format!("s{d}"));
    }
    for f in 0..12 {
        s.insert(format!("f{f}"));
        s.insert(format!("g{f}"));
    }
    s
}

/// Version `round` of the tree at `src/T`: a varying number of directories and files, so
/// that ext4 hands the numbers of one round's directories to the next round's files and back
/// (the case behind the kernel's stale-inode checks). A name always has the same type.
fn make(src: &Path, round: usize) {
    let t = src.join("T");
    let _ = std::fs::remove_dir_all(&t);
    std::fs::create_dir(&t).unwrap();
    let dirs = 2 + round % 4;
    let files = 3 + (round * 7) % 9;
    for f in 0..files {
        std::fs::write(t.join(format!("f{f}")), b"x").unwrap();
    }
    for d in 0..dirs {
        let dd = t.join(format!("d{d}"));
        std::fs::create_dir(&dd).unwrap();
        for g in 0..(1 + (round + d) % 5) {
            std::fs::write(dd.join(format!("g{g}")), b"y").unwrap();
        }
        std::fs::create_dir(dd.join(format!("s{}", d % 3))).unwrap();
    }
}

/// Every entry of the directory open as `fd`, listed from its start (getdents64).
fn getdents_names(fd: i32) -> Result<Vec<String>, i32> {
    // SAFETY: lseek(2) on a descriptor the caller owns.
    if unsafe { libc::lseek(fd, 0, libc::SEEK_SET) } < 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    let mut buf = vec![0u8; 32768];
    let mut names = Vec::new();
    loop {
        // SAFETY: getdents64 into a buffer of the length given.
        let r = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                fd,
                buf.as_mut_ptr(),
                buf.len() as libc::c_uint,
            )
        };
        if r < 0 {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
        }
        if r == 0 {
            return Ok(names);
        }
        let mut off = 0usize;
        while off < r as usize {
            // struct linux_dirent64: u64 ino, i64 off, u16 reclen, u8 type, name.
            let reclen = u16::from_ne_bytes([buf[off + 16], buf[off + 17]]) as usize;
            let name = &buf[off + 19..off + reclen];
            let end = name.iter().position(|b| *b == 0).unwrap_or(name.len());
            names.push(String::from_utf8_lossy(&name[..end]).into_owned());
            off += reclen;
        }
    }
}

/// A walk of `dir` as `ls -lR` does it: each listing, each entry's lstat, then each
/// subdirectory. Errors other than ENOENT (a name removed meanwhile, as natively) are pushed
/// to `bad`, and so are names no version of the tree has.
fn walk(dir: &Path, names: &BTreeSet<String>, bad: &mut Vec<String>) {
    let rd = match std::fs::read_dir(dir) {
        Ok(r) => r,
        Err(e) => {
            if e.raw_os_error() != Some(libc::ENOENT) {
                bad.push(format!("opendir {}: {e}", dir.display()));
            }
            return;
        }
    };
    let mut subdirs = Vec::new();
    for e in rd {
        let e = match e {
            Ok(e) => e,
            Err(e) => {
                if e.raw_os_error() != Some(libc::ENOENT) {
                    bad.push(format!("readdir {}: {e}", dir.display()));
                }
                return;
            }
        };
        let name = String::from_utf8_lossy(e.file_name().as_bytes()).into_owned();
        if !names.contains(&name) {
            bad.push(format!("{}: a name SRC never had: {name:?}", dir.display()));
        }
        match std::fs::symlink_metadata(e.path()) {
            Ok(m) if m.is_dir() => subdirs.push(e.path()),
            Ok(_) => {}
            Err(e2) if e2.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e2) => bad.push(format!("lstat {}: {e2}", e.path().display())),
        }
    }
    for d in subdirs {
        walk(&d, names, bad);
    }
}

/// A tree removed and made again in SRC (`rm -rf T`, then new directories and files) 300
/// times while one thread walks it through the mount as `ls -lR` does and another lists
/// directories through descriptors opened before the replacements. Natively a listing gives
/// the old entries, the new ones or ENOENT; ext4 reuses the freed inode numbers for the new
/// tree, often with another file type, and the mount must not give EIO (the kernel's old
/// inode marked bad when it is handed the same nodeid for another file), ENOTDIR, ELOOP (a
/// directory inode found at two places), ESTALE or names SRC never had.
#[test]
fn listings_while_the_tree_is_replaced_in_src() {
    listings_while_replaced(dircache_fuse::CachePolicy::default());
}

/// The same with lookahead on (`lookahead.rs`): LOOKUPs list directories and the daemon reads
/// them through the mount, so the kernel is handed many more entries, often with attributes
/// listed a moment before the tree was replaced (ELOOP in 3 of 22 runs before inode
/// identities had a birth time).
#[test]
fn listings_while_the_tree_is_replaced_in_src_with_lookahead() {
    listings_while_replaced(dircache_fuse::CachePolicy {
        lookahead: true,
        ..dircache_fuse::CachePolicy::default()
    });
}

fn listings_while_replaced(policy: dircache_fuse::CachePolicy) {
    if !can_mount() {
        return;
    }
    let t = TestMount::with_policy(policy);
    make(&t.src, 0);
    wait_for(std::time::Duration::from_secs(20), || {
        std::fs::read_dir(t.m("T")).is_ok_and(|r| r.count() >= 5)
    })
    .expect("the first tree seen through the mount");
    let names = all_names();
    let stop = AtomicBool::new(false);
    let rounds = 300;
    let (bad, walks, held_lists) = std::thread::scope(|s| {
        let churn = s.spawn(|| {
            for round in 1..=rounds {
                make(&t.src, round);
            }
            stop.store(true, Ordering::SeqCst);
        });
        let walker = s.spawn(|| {
            let mut bad = Vec::new();
            let mut walks = 0;
            while !stop.load(Ordering::SeqCst) {
                walks += 1;
                walk(&t.m("T"), &names, &mut bad);
            }
            (bad, walks)
        });
        let held = s.spawn(|| {
            let mut bad = Vec::new();
            let mut lists = 0;
            let mut k = 0usize;
            while !stop.load(Ordering::SeqCst) {
                k += 1;
                let rel = match k % 3 {
                    0 => "T".to_string(),
                    i => format!("T/d{}", i - 1),
                };
                let path = std::ffi::CString::new(t.m(&rel).as_os_str().as_bytes()).unwrap();
                // SAFETY: open(2) of a NUL-terminated path; closed below.
                let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY) };
                if fd < 0 {
                    let e = std::io::Error::last_os_error();
                    if e.raw_os_error() != Some(libc::ENOENT) {
                        bad.push(format!("open {rel}: {e}"));
                    }
                    continue;
                }
                // Listed again and again while the tree it named is replaced.
                for _ in 0..10 {
                    lists += 1;
                    match getdents_names(fd) {
                        Ok(ns) => {
                            for n in ns.iter().filter(|n| *n != "." && *n != "..") {
                                if !names.contains(n) {
                                    bad.push(format!("{rel}: a name SRC never had: {n:?}"));
                                }
                            }
                        }
                        Err(e) => {
                            if e != libc::ENOENT {
                                let e = std::io::Error::from_raw_os_error(e);
                                bad.push(format!("getdents {rel} (held): {e}"));
                            }
                            break;
                        }
                    }
                }
                // SAFETY: closing the descriptor opened above.
                unsafe { libc::close(fd) };
            }
            (bad, lists)
        });
        churn.join().unwrap();
        let (mut bad, walks) = walker.join().unwrap();
        let (b2, held_lists) = held.join().unwrap();
        bad.extend(b2);
        (bad, walks, held_lists)
    });
    // ESTALE is not native either: a directory of the kernel's handed out under a new parent
    // (the old one replaced in SRC) made the kernel move its dentry, failing with ESTALE when
    // it could not take the locks at once (`d_splice_alias`; 0-75 per run before such a
    // directory got a nodeid of its own).
    let estale = bad.iter().filter(|b| b.contains("(os error 116)")).count();
    eprintln!(
        "{rounds} replacements, {walks} walks, {held_lists} listings through held descriptors, \
         {} failures, {estale} ESTALE",
        bad.len(),
    );
    let eio = bad.iter().filter(|b| b.contains("os error 5)")).count();
    let enotdir = bad.iter().filter(|b| b.contains("os error 20)")).count();
    assert!(
        bad.is_empty(),
        "{} failures ({eio} EIO, {enotdir} ENOTDIR, {estale} ESTALE), first: {:#?}",
        bad.len(),
        &bad[..bad.len().min(12)]
    );
    // And the end state is the last tree.
    let want: BTreeSet<String> = std::fs::read_dir(t.s("T"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    wait_for(std::time::Duration::from_secs(20), || {
        std::fs::read_dir(t.m("T")).is_ok_and(|r| {
            r.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect::<BTreeSet<_>>()
                == want
        })
    })
    .expect("the last tree seen through the mount");
}

/// A file created in SRC, seen through the mount while still empty, then written in SRC
/// and read through the mount: the read shows what SRC had before it began. Small read-only
/// opens go through the page cache, which the kernel sizes by the attributes it holds (the
/// empty file's, until the change feed reports the write); a read must not be "" or a
/// prefix. The same for a file rewritten with another size after it was read.
#[test]
fn a_file_written_in_src_reads_whole_right_after() {
    if !can_mount() {
        return;
    }
    let t = TestMount::new();
    let rounds = 200;
    let mut wrong = Vec::new();
    for i in 0..rounds {
        let name = format!("n{i}");
        let s = t.s(&name);
        let f = std::fs::File::create(&s).unwrap();
        // The kernel learns the name with size 0 (a LOOKUP in the feed's window, or after).
        let m = t.m(&name);
        wait_for(std::time::Duration::from_secs(20), || m.exists()).expect("name seen");
        let want = format!("content {i} {}\n", "x".repeat(i % 50));
        {
            use std::io::Write;
            let mut f = f;
            f.write_all(want.as_bytes()).unwrap();
        }
        let got = std::fs::read_to_string(&m).unwrap();
        if got != want {
            wrong.push(format!("{name}: read {got:?}, SRC had {want:?}"));
        }
        // Rewritten in SRC with another length after the mount read it (pages cached).
        let again = format!("second {i}\n");
        std::fs::write(&s, &again).unwrap();
        let got = std::fs::read_to_string(&m).unwrap();
        if got != again {
            wrong.push(format!("{name} rewritten: read {got:?}, SRC had {again:?}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} reads differ from SRC, first: {:#?}",
        wrong.len(),
        2 * rounds,
        &wrong[..wrong.len().min(8)]
    );
}
