//! The served tree one directory below the FUSE root, bind-mounted on MNT.
//!
//! The kernel makes a FUSE file system's root inode in `fuse_fill_super_common`, before the
//! INIT reply sets `fc->posix_acl`, so `fuse_init_inode` marks it `ACL_DONT_CACHE` for good
//! (no forget resets it since 6.18.42). A mount whose root is the FUSE root therefore asks
//! the daemon for `system.posix_acl_access` on every path walk through MNT by a user who does
//! not own SRC's root (`acl_permission_check` -> `check_acl`), and for both ACLs on every
//! `ls -l` naming it. Every inode the kernel makes after INIT caches its ACLs as usual.
//!
//! So a mount by root is made in three steps with the new mount API, and nothing of it is
//! visible before the last one:
//! 1. [`create`]: `fsopen("fuse")`, the options, `fsmount`: a detached mount of the FUSE
//!    file system, whose root (nodeid 1) is a synthetic directory holding one name,
//!    [`SERVED_NAME`], SRC's root (a nodeid of its own, `Inodes::root`);
//! 2. the daemon answers INIT (and then serves);
//! 3. [`attach`]: `open_tree(OPEN_TREE_CLONE)` of `SERVED_NAME` below that root (a LOOKUP
//!    after INIT: an inode whose ACLs the kernel caches) and `move_mount` of the clone on
//!    MNT; the first mount is dropped with its descriptor. MNT is then the only mount of the
//!    super block: `umount MNT` ends the connection as before, and /proc/self/mountinfo shows
//!    the mount with root `/src` (`findmnt` prints `SOURCE[/src]`).
//!
//! mountinfo shows the mount's root as `/src` (the served tree's path in the super block); the
//! daemon tells control clients so through the xattr [`FSROOT_XATTR`] of MNT's root (next to
//! the socket's), and they strip it from mountinfo's root field: paths on the control socket
//! stay relative to SRC's root (`dircache_search::proto`).
//!
//! When the kernel has no new mount API (ENOSYS from `fsopen`), the mount is made with
//! mount(2) as before (`kmount::mount_fuse`): SRC's root is the FUSE root (nodeid 1); the
//! path is tested by `crates/cli/tests/mount_layout.rs` under a seccomp filter denying `fsopen`.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use libc::c_ulong;
use rustix::mount::{
    fsconfig_create, fsconfig_set_flag, fsconfig_set_string, fsmount, fsopen, move_mount,
    open_tree, FsMountFlags, FsOpenFlags, MountAttrFlags, MoveMountFlags, OpenTreeFlags,
};

/// The name SRC's root has in the synthetic FUSE root.
pub const SERVED_NAME: &str = "src";

/// Extended attribute of MNT's root holding the served tree's path in the super block
/// (`/src`): what to strip from mountinfo's root field (`dircache_search::proto`).
pub const FSROOT_XATTR: &str = "user.dircache.fsroot";

/// The permission bits of the synthetic root (reached only by the daemon, through the
/// detached mount's descriptor, while it attaches the served tree).
pub const SYNTHETIC_ROOT_MODE: u32 = 0o700;

/// A FUSE file system created and mounted nowhere yet: the /dev/fuse descriptor (INIT comes
/// on it next) and the detached mount of the synthetic root.
pub struct Detached {
    pub dev: OwnedFd,
    mount: OwnedFd,
}

/// Whether the kernel lacks the new mount API (fall back to mount(2)).
pub fn unsupported(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENOSYS)
}

/// Create the FUSE file system (step 1 of the module doc) with mount(2)'s `flags` (see
/// `kmount::FLAG_OPTIONS`), the mount's source name and SELinux options.
pub fn create(
    source: &str,
    flags: c_ulong,
    allow_other: bool,
    lsm: &[String],
) -> std::io::Result<Detached> {
    let fs = fsopen("fuse", FsOpenFlags::FSOPEN_CLOEXEC)?;
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")?;
    let dev = OwnedFd::from(dev);
    let (uid, gid) = (
        rustix::process::getuid().as_raw(),
        rustix::process::getgid().as_raw(),
    );
    let set = |k: &str, v: &str| fsconfig_set_string(&fs, k, v);
    set("source", source)?;
    set("fd", &dev.as_raw_fd().to_string())?;
    set(
        "rootmode",
        &format!("{:o}", libc::S_IFDIR | SYNTHETIC_ROOT_MODE),
    )?;
    set("user_id", &uid.to_string())?;
    set("group_id", &gid.to_string())?;
    set("subtype", "dircache")?;
    fsconfig_set_flag(&fs, "default_permissions")?;
    if allow_other {
        fsconfig_set_flag(&fs, "allow_other")?;
    }
    // Super block flags.
    for (f, name) in [
        (libc::MS_RDONLY, "ro"),
        (libc::MS_SYNCHRONOUS, "sync"),
        (libc::MS_DIRSYNC, "dirsync"),
        (libc::MS_LAZYTIME, "lazytime"),
    ] {
        if flags & f != 0 {
            fsconfig_set_flag(&fs, name)?;
        }
    }
    for o in lsm {
        match o.split_once('=') {
            Some((k, v)) => set(k, v)?,
            None => fsconfig_set_flag(&fs, o.as_str())?,
        }
    }
    fsconfig_create(&fs)?;
    let mount = fsmount(&fs, FsMountFlags::FSMOUNT_CLOEXEC, mount_attrs(flags))?;
    Ok(Detached { dev, mount })
}

/// The per-mount flags of mount(2)'s `flags`, as `fsmount` takes them.
fn mount_attrs(flags: c_ulong) -> MountAttrFlags {
    let mut a = MountAttrFlags::empty();
    for (f, m) in [
        (libc::MS_RDONLY, MountAttrFlags::MOUNT_ATTR_RDONLY),
        (libc::MS_NOSUID, MountAttrFlags::MOUNT_ATTR_NOSUID),
        (libc::MS_NODEV, MountAttrFlags::MOUNT_ATTR_NODEV),
        (libc::MS_NOEXEC, MountAttrFlags::MOUNT_ATTR_NOEXEC),
        (libc::MS_NODIRATIME, MountAttrFlags::MOUNT_ATTR_NODIRATIME),
    ] {
        if flags & f != 0 {
            a |= m;
        }
    }
    // mount(2)'s default is relatime; noatime and strictatime replace it.
    if flags & libc::MS_NOATIME != 0 {
        a |= MountAttrFlags::MOUNT_ATTR_NOATIME;
    } else if flags & libc::MS_STRICTATIME != 0 {
        a |= MountAttrFlags::MOUNT_ATTR_STRICTATIME;
    }
    a
}

/// Step 3 of the module doc: mount the served tree (the daemon must be serving: the kernel
/// looks [`SERVED_NAME`] up) on `mnt`. The detached mount of the synthetic root goes away
/// with `d`, also on failure (and with it the super block, if nothing else holds it).
pub fn attach(d: Detached, mnt: &Path) -> std::io::Result<()> {
    let Detached { dev, mount } = d;
    drop(dev);
    let tree = open_tree(
        &mount,
        SERVED_NAME,
        OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
    )?;
    drop(mount);
    move_mount(
        &tree,
        "",
        rustix::fs::CWD,
        mnt,
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH | MoveMountFlags::MOVE_MOUNT_T_SYMLINKS,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_attrs_follow_flags() {
        let a = mount_attrs(libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOATIME);
        assert!(a.contains(MountAttrFlags::MOUNT_ATTR_NOSUID));
        assert!(a.contains(MountAttrFlags::MOUNT_ATTR_NODEV));
        assert!(a.contains(MountAttrFlags::MOUNT_ATTR_NOATIME));
        assert!(!a.contains(MountAttrFlags::MOUNT_ATTR_RDONLY));
    }
}
