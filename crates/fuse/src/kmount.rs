//! The kernel side of a dircache mount: the mount(2) call with exactly the flags mount(8)
//! documents, remounting, and reading back what the kernel holds (/proc/self/mountinfo).
//!
//! dircache mounts with mount(2) itself (not through fuser's mount code) so that every flag
//! mount(8) and fstab hand it reaches the kernel: `ro`, `nosuid`/`suid`, `nodev`/`dev`,
//! `noexec`, the atime family (`noatime`, `nodiratime`, `relatime`, `strictatime`), `sync`,
//! `dirsync` (and `lazytime`, which the kernel ignores for FUSE); the source shown in
//! /proc/mounts (`fsname=`/`source=`) and SELinux context options (passed to the kernel as
//! they are).
//!
//! Set-user-ID bits and device files are never honoured through the mount when the source's
//! own file system ignores them ([`src_restrictions`]): a mount by root never gives more than
//! the file system it serves.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use libc::c_ulong;

/// `(option, MS_* flag, set)`: the kernel flags mount(8) names, each as set or cleared.
pub const FLAG_OPTIONS: &[(&str, c_ulong, bool)] = &[
    ("ro", libc::MS_RDONLY, true),
    ("rw", libc::MS_RDONLY, false),
    ("nosuid", libc::MS_NOSUID, true),
    ("suid", libc::MS_NOSUID, false),
    ("nodev", libc::MS_NODEV, true),
    ("dev", libc::MS_NODEV, false),
    ("noexec", libc::MS_NOEXEC, true),
    ("exec", libc::MS_NOEXEC, false),
    ("noatime", libc::MS_NOATIME, true),
    ("atime", libc::MS_NOATIME, false),
    ("nodiratime", libc::MS_NODIRATIME, true),
    ("diratime", libc::MS_NODIRATIME, false),
    ("relatime", libc::MS_RELATIME, true),
    ("norelatime", libc::MS_RELATIME, false),
    ("strictatime", libc::MS_STRICTATIME, true),
    ("nostrictatime", libc::MS_STRICTATIME, false),
    ("sync", libc::MS_SYNCHRONOUS, true),
    ("async", libc::MS_SYNCHRONOUS, false),
    ("dirsync", libc::MS_DIRSYNC, true),
    ("lazytime", libc::MS_LAZYTIME, true),
    ("nolazytime", libc::MS_LAZYTIME, false),
];

/// The flag a mount(8) option names: `Some((flag, set))`.
pub fn flag_option(name: &str) -> Option<(c_ulong, bool)> {
    FLAG_OPTIONS
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, f, s)| (*f, *s))
}

/// Apply `(flag, set)` changes in order, as mount(8) does. The atime modes exclude each other:
/// the last of `noatime`, `relatime`, `strictatime` wins.
pub fn apply_flags(mut flags: c_ulong, changes: &[(c_ulong, bool)]) -> c_ulong {
    const ATIME: c_ulong = libc::MS_NOATIME | libc::MS_RELATIME | libc::MS_STRICTATIME;
    for &(f, set) in changes {
        if set {
            if f & ATIME != 0 {
                flags &= !ATIME;
            }
            flags |= f;
        } else {
            flags &= !f;
        }
    }
    flags
}

/// Security-module options the kernel takes at mount time (SELinux).
pub const LSM_OPTIONS: &[&str] = &["context", "fscontext", "defcontext", "rootcontext"];

/// Kernel flags and options of a dircache mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelOptions {
    /// `MS_*` flags for mount(2). Default: `MS_NOSUID | MS_NODEV`, as every FUSE file system
    /// mounted directly (libfuse, sshfs); `suid`/`dev` turn them off.
    pub flags: c_ulong,
    /// The source shown in /proc/mounts (`fsname=`, `source=`); `None`: SRC.
    pub fsname: Option<String>,
    /// `context=...` and the other SELinux options, given to the kernel as they are.
    pub lsm: Vec<String>,
}

impl Default for KernelOptions {
    fn default() -> Self {
        KernelOptions {
            flags: libc::MS_NOSUID | libc::MS_NODEV,
            fsname: None,
            lsm: Vec::new(),
        }
    }
}

/// Whether SELinux is active (its file system is mounted), so context options mean something.
pub fn selinux_enabled() -> bool {
    Path::new("/sys/fs/selinux/enforce").exists()
}

/// `MS_NOSUID`/`MS_NODEV` that the file systems under `src` impose: the flags of the file
/// system holding `src` and of every mount below it. A dircache mount always carries them.
pub fn src_restrictions(src: &Path) -> c_ulong {
    let src = &src.canonicalize().unwrap_or_else(|_| src.to_path_buf());
    let mut out = 0;
    if let Ok(st) = rustix::fs::statvfs(src) {
        if st.f_flag.contains(rustix::fs::StatVfsMountFlags::NOSUID) {
            out |= libc::MS_NOSUID;
        }
        if st.f_flag.contains(rustix::fs::StatVfsMountFlags::NODEV) {
            out |= libc::MS_NODEV;
        }
    }
    let prefix = src.as_os_str().as_bytes();
    for e in mount_table() {
        let p = e.mnt.as_os_str().as_bytes();
        let below = p.starts_with(prefix)
            && (prefix == b"/" || p.len() == prefix.len() || p.get(prefix.len()) == Some(&b'/'));
        if below {
            out |= e.flags & (libc::MS_NOSUID | libc::MS_NODEV);
        }
    }
    out
}

/// What `MS_NOSUID`/`MS_NODEV` in `flags` mean, for messages.
pub fn restriction_names(flags: c_ulong) -> &'static str {
    match flags & (libc::MS_NOSUID | libc::MS_NODEV) {
        libc::MS_NOSUID => "set-user-ID bits",
        libc::MS_NODEV => "device files",
        0 => "nothing",
        _ => "set-user-ID bits and device files",
    }
}

/// One line of /proc/self/mountinfo.
#[derive(Debug, Clone)]
pub struct MountEntry {
    pub mnt: PathBuf,
    pub fstype: String,
    pub source: String,
    /// `MS_*` flags of the mount and its super block.
    pub flags: c_ulong,
}

/// /proc/self/mountinfo, in order (later entries are mounted over earlier ones).
pub fn mount_table() -> Vec<MountEntry> {
    let Ok(info) = std::fs::read("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in info.split(|b| *b == b'\n') {
        let f: Vec<&[u8]> = line.split(|b| *b == b' ').collect();
        let Some(dash) = f.iter().position(|x| *x == b"-") else {
            continue;
        };
        if f.len() < dash + 4 || dash < 6 {
            continue;
        }
        let s = |b: &[u8]| String::from_utf8_lossy(&crate::unescape_mountinfo(b)).into_owned();
        let mut flags: c_ulong = 0;
        let mut atime = libc::MS_STRICTATIME;
        for o in f[5].split(|b| *b == b',') {
            match o {
                b"ro" => flags |= libc::MS_RDONLY,
                b"nosuid" => flags |= libc::MS_NOSUID,
                b"nodev" => flags |= libc::MS_NODEV,
                b"noexec" => flags |= libc::MS_NOEXEC,
                b"noatime" => atime = libc::MS_NOATIME,
                b"relatime" => atime = libc::MS_RELATIME,
                b"nodiratime" => flags |= libc::MS_NODIRATIME,
                _ => {}
            }
        }
        flags |= atime;
        for o in f[dash + 3].split(|b| *b == b',') {
            match o {
                b"ro" => flags |= libc::MS_RDONLY,
                b"sync" => flags |= libc::MS_SYNCHRONOUS,
                b"dirsync" => flags |= libc::MS_DIRSYNC,
                b"lazytime" => flags |= libc::MS_LAZYTIME,
                _ => {}
            }
        }
        out.push(MountEntry {
            mnt: PathBuf::from(std::ffi::OsStr::from_bytes(&crate::unescape_mountinfo(
                f[4],
            ))),
            fstype: s(f[dash + 1]),
            source: s(f[dash + 2]),
            flags,
        });
    }
    out
}

/// `path` made absolute with its parent resolved but not its last component, which may be
/// the root of a dead FUSE mount (any access to it fails with ENOTCONN).
pub fn mount_path(path: &Path) -> std::io::Result<PathBuf> {
    if let Ok(p) = path.canonicalize() {
        return Ok(p);
    }
    let abs = std::path::absolute(path)?;
    match (abs.parent(), abs.file_name()) {
        (Some(parent), Some(name)) => Ok(parent.canonicalize()?.join(name)),
        _ => Ok(abs),
    }
}

/// The mount on top at `path`, if `path` is a mount point.
pub fn mount_entry(path: &Path) -> Option<MountEntry> {
    let p = mount_path(path).ok()?;
    mount_table().into_iter().rev().find(|e| e.mnt == p)
}

fn cstr(p: &[u8]) -> std::io::Result<CString> {
    CString::new(p).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))
}

/// Mount a FUSE file system at `mnt`: open /dev/fuse, call mount(2) with `flags` and the
/// FUSE options, and return the /dev/fuse descriptor (the kernel sends INIT on it next).
///
/// `root_perm` (the served root's permission bits) goes into `rootmode`: the kernel creates
/// its root inode with that mode and keeps it until a GETATTR reply lands. A reply the kernel
/// discards (an attribute invalidation of the root, from the change feed, raced with it) left
/// a root with no permission bits, and `default_permissions` refused every other user with
/// EACCES without asking again.
pub fn mount_fuse(
    source: &str,
    mnt: &Path,
    flags: c_ulong,
    allow_other: bool,
    lsm: &[String],
    root_perm: u32,
) -> std::io::Result<OwnedFd> {
    use std::os::unix::fs::MetadataExt;
    let root_type = (std::fs::metadata(mnt)?.mode() & libc::S_IFMT) | (root_perm & 0o7777);
    let dev = c"/dev/fuse";
    // SAFETY: dev is a valid NUL-terminated path; the result is checked.
    let fd = unsafe { libc::open(dev.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: open returned a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: getuid/getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let mut data = format!(
        "fd={},rootmode={root_type:o},user_id={uid},group_id={gid},default_permissions,subtype=dircache",
        fd.as_raw_fd()
    );
    if allow_other {
        data.push_str(",allow_other");
    }
    for o in lsm {
        data.push(',');
        data.push_str(o);
    }
    let (src_c, mnt_c, type_c, data_c) = (
        cstr(source.as_bytes())?,
        cstr(mnt.as_os_str().as_bytes())?,
        cstr(b"fuse")?,
        cstr(data.as_bytes())?,
    );
    // SAFETY: every pointer is a valid NUL-terminated string that outlives the call.
    let r = unsafe {
        libc::mount(
            src_c.as_ptr(),
            mnt_c.as_ptr(),
            type_c.as_ptr(),
            flags,
            data_c.as_ptr().cast(),
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fd)
}

/// Change the flags of the mount at `mnt` (MS_REMOUNT): read-only/read-write and sync
/// on the super block; nosuid, nodev, noexec and the atime flags of the mount. The FUSE
/// connection and the daemon serving it stay as they are.
pub fn remount(mnt: &Path, flags: c_ulong) -> std::io::Result<()> {
    let mnt_c = cstr(mnt.as_os_str().as_bytes())?;
    // Flags a remount cannot change are left out (dirsync is fixed at mount time).
    let flags = (flags & !libc::MS_DIRSYNC) | libc::MS_REMOUNT;
    // SAFETY: mnt_c is a valid NUL-terminated path; the other pointers may be NULL for
    // MS_REMOUNT.
    let r = unsafe {
        libc::mount(
            std::ptr::null(),
            mnt_c.as_ptr(),
            std::ptr::null(),
            flags,
            std::ptr::null(),
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_apply_in_order() {
        let d = KernelOptions::default().flags;
        let f = apply_flags(
            d,
            &[flag_option("suid").unwrap(), flag_option("ro").unwrap()],
        );
        assert_eq!(f, libc::MS_NODEV | libc::MS_RDONLY);
        let f = apply_flags(
            0,
            &[
                flag_option("noatime").unwrap(),
                flag_option("strictatime").unwrap(),
            ],
        );
        assert_eq!(f, libc::MS_STRICTATIME);
        assert!(flag_option("bogus").is_none());
    }

    #[test]
    fn root_is_in_the_table() {
        let e = mount_entry(Path::new("/")).expect("/ is mounted");
        assert_eq!(e.mnt, Path::new("/"));
        assert!(!e.fstype.is_empty());
    }
}
