//! The kernel's root inode of a dircache mount has the served root's permission bits from
//! the start (`rootmode`), not none until a GETATTR reply lands. The kernel discards a reply
//! that raced with an invalidation of the root (the change feed sends one for every change
//! in SRC's top directory), and with `default_permissions` a root without permission bits
//! refused every other user with EACCES without asking the daemon again: a rare flake of
//! `xattr.rs` (`dropped_group_is_dropped_at_once` at `mnt/w/warm0`,
//! `acl_set_by_owner_outside_group_clears_sgid` at `mnt/f`).

mod common;
use common::*;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;

/// The mode the kernel holds for `p` now, without asking the file system
/// (`AT_STATX_DONT_SYNC`).
fn kernel_cached_mode(p: &std::path::Path) -> u32 {
    let c = CString::new(p.as_os_str().as_bytes()).expect("path without NUL");
    // SAFETY: an all-zero statx is a valid value to be overwritten.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: c is a NUL-terminated path and st a live statx buffer.
    let r = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_STATX_DONT_SYNC,
            libc::STATX_MODE,
            &mut st,
        )
    };
    assert_eq!(
        r,
        0,
        "statx {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
    u32::from(st.stx_mode)
}

#[test]
fn kernel_root_inode_starts_with_the_src_roots_mode() {
    if !can_mount() {
        return;
    }
    let t = TestMount::new();
    let want = std::fs::metadata(&t.src).expect("stat SRC").mode();
    let got = kernel_cached_mode(&t.mnt);
    assert_eq!(
        format!("{got:o}"),
        format!("{want:o}"),
        "the kernel's root inode before any GETATTR vs SRC's root"
    );
}
