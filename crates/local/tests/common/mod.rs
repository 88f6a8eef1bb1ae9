//! Helpers shared by the LocalBackend integration tests: the kernel (std::fs / libc) is the
//! oracle every answer is compared with.
#![allow(dead_code)]

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use dircache_core::{Attr, Timespec};

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// For tests that need root: whether we are root; if not, [`cannot_run`] (fails under CI).
pub fn need_root(why: &str) -> bool {
    if is_root() {
        return true;
    }
    cannot_run(&format!("needs root: {why}"));
    false
}

/// A test that cannot run here (no root, no /dev/fuse, ...). Under CI (the `CI` variable is
/// set) that is a failure: CI must run every test. Elsewhere the test returns early, but says
/// so loudly on stderr (past the test harness's output capture).
pub fn cannot_run(why: &str) {
    let test = std::thread::current().name().unwrap_or("?").to_string();
    if std::env::var_os("CI").is_some() {
        panic!("{test}: cannot run ({why}), and CI is set: a skipped test fails in CI");
    }
    // Straight to the stderr descriptor: the test harness captures eprintln! of passing tests.
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!("\n*** SKIPPED {test}: {why}. This test did NOT run (in CI it fails). ***\n")
            .as_bytes(),
    );
}

pub fn tmp() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("dircache-local-")
        .tempdir()
        .unwrap()
}

/// What lstat says, as an Attr.
pub fn kattr(p: &Path) -> std::io::Result<Attr> {
    let m = std::fs::symlink_metadata(p)?;
    Ok(Attr {
        ino: m.ino(),
        dev: m.dev(),
        mode: m.mode(),
        nlink: m.nlink() as u32,
        uid: m.uid(),
        gid: m.gid(),
        rdev: m.rdev(),
        size: m.size(),
        blocks: m.blocks(),
        blksize: m.blksize() as u32,
        atime: Timespec {
            sec: m.atime(),
            nsec: m.atime_nsec() as u32,
        },
        mtime: Timespec {
            sec: m.mtime(),
            nsec: m.mtime_nsec() as u32,
        },
        ctime: Timespec {
            sec: m.ctime(),
            nsec: m.ctime_nsec() as u32,
        },
        birth: m
            .created()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| {
                dircache_core::birth_digest(d.as_secs() as i64, d.subsec_nanos())
            }),
    })
}

pub fn p(root: &Path, rel: &str) -> PathBuf {
    if rel.is_empty() {
        root.to_path_buf()
    } else {
        root.join(rel)
    }
}

/// The errno of an io::Error.
pub fn eno(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

/// Run `f` on a fresh thread whose real/effective/fs ids and groups are switched to the given
/// user with raw per-thread syscalls (setresuid, not setfsuid: an independent oracle). The
/// thread ends afterwards, so nothing needs restoring.
pub fn as_user<T: Send + 'static>(
    uid: u32,
    gid: u32,
    groups: &[u32],
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let groups = groups.to_vec();
    std::thread::spawn(move || {
        // SAFETY: raw per-thread credential syscalls with valid pointers/lengths.
        unsafe {
            assert_eq!(
                libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()),
                0
            );
            assert_eq!(libc::syscall(libc::SYS_setresgid, gid, gid, gid), 0);
            assert_eq!(libc::syscall(libc::SYS_setresuid, uid, uid, uid), 0);
        }
        f()
    })
    .join()
    .unwrap()
}

pub fn errno_of<T>(r: dircache_core::Result<T>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => e.errno(),
    }
}

pub fn kerrno<T>(r: std::io::Result<T>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => eno(&e),
    }
}
