//! Thin wrappers over the `*at` syscalls, returning the raw errno on failure. Callers choose
//! the thread (a [`crate::Jail`]) and the fs credentials.

use std::ffi::{CStr, CString};

use dircache_core::{Attr, DirEntry, RenameMode, SetAttr};

use crate::{attr_from_stat, errno, ftype_of_dtype, timespec_of};

/// Result with a raw errno.
pub type KResult<T> = std::result::Result<T, i32>;

fn chk(r: i32) -> KResult<()> {
    if r < 0 {
        Err(errno())
    } else {
        Ok(())
    }
}

pub fn fstatat(dirfd: i32, path: &CStr, follow: bool) -> KResult<Attr> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let flags = if follow { 0 } else { libc::AT_SYMLINK_NOFOLLOW };
    chk(unsafe { libc::fstatat(dirfd, path.as_ptr(), &mut st, flags) })?;
    let mut a = attr_from_stat(&st);
    // The birth time (not in `struct stat`), as backends report it.
    let mut sx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: statx(2) into a zeroed struct of the right type.
    let r = unsafe { libc::statx(dirfd, path.as_ptr(), flags, libc::STATX_BTIME, &mut sx) };
    if r == 0 && sx.stx_mask & libc::STATX_BTIME != 0 && sx.stx_ino == st.st_ino {
        a.birth = dircache_core::birth_digest(sx.stx_btime.tv_sec, sx.stx_btime.tv_nsec);
    }
    Ok(a)
}

/// access(2) for the *effective* (fs) ids of the calling thread: faccessat2 with AT_EACCESS.
pub fn faccess(dirfd: i32, path: &CStr, mask: u32) -> KResult<()> {
    let r = unsafe {
        libc::syscall(
            libc::SYS_faccessat2,
            dirfd,
            path.as_ptr(),
            mask as i32,
            libc::AT_EACCESS,
        )
    };
    if r < 0 {
        Err(errno())
    } else {
        Ok(())
    }
}

/// Open a directory for reading and list it (no `.`/`..`), sorted by name.
pub fn readdir_at(dirfd: i32, path: &CStr) -> KResult<Vec<DirEntry>> {
    let fd = unsafe {
        libc::openat(
            dirfd,
            path.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(errno());
    }
    let dir = unsafe { libc::fdopendir(fd) };
    if dir.is_null() {
        let e = errno();
        unsafe { libc::close(fd) };
        return Err(e);
    }
    let mut out = Vec::new();
    loop {
        let ent = unsafe { libc::readdir64(dir) };
        if ent.is_null() {
            break;
        }
        let ent = unsafe { &*ent };
        let name = unsafe { CStr::from_ptr(ent.d_name.as_ptr()) }
            .to_bytes()
            .to_vec();
        if name == b"." || name == b".." {
            continue;
        }
        out.push(DirEntry {
            name,
            kind: ftype_of_dtype(ent.d_type),
            ino: ent.d_ino,
            attr: None,
        });
    }
    unsafe { libc::closedir(dir) };
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

pub fn readlinkat(dirfd: i32, path: &CStr) -> KResult<Vec<u8>> {
    let mut buf = vec![0u8; 8192];
    let n = unsafe { libc::readlinkat(dirfd, path.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(errno());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

pub fn renameat2(
    olddir: i32,
    old: &CStr,
    newdir: i32,
    new: &CStr,
    mode: RenameMode,
) -> KResult<()> {
    let flags: u32 = match mode {
        RenameMode::Replace => 0,
        RenameMode::NoReplace => libc::RENAME_NOREPLACE,
        RenameMode::Exchange => libc::RENAME_EXCHANGE,
        RenameMode::Whiteout => libc::RENAME_WHITEOUT,
        RenameMode::WhiteoutNoReplace => libc::RENAME_WHITEOUT | libc::RENAME_NOREPLACE,
    };
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            olddir,
            old.as_ptr(),
            newdir,
            new.as_ptr(),
            flags,
        )
    };
    if r < 0 {
        Err(errno())
    } else {
        Ok(())
    }
}

pub fn mkdirat(dirfd: i32, path: &CStr, mode: u32) -> KResult<()> {
    chk(unsafe { libc::mkdirat(dirfd, path.as_ptr(), mode) })
}

pub fn mknodat(dirfd: i32, path: &CStr, mode: u32, rdev: u64) -> KResult<()> {
    chk(unsafe { libc::mknodat(dirfd, path.as_ptr(), mode, rdev) })
}

pub fn symlinkat(target: &CStr, dirfd: i32, path: &CStr) -> KResult<()> {
    chk(unsafe { libc::symlinkat(target.as_ptr(), dirfd, path.as_ptr()) })
}

pub fn linkat(dirfd: i32, old: &CStr, new: &CStr) -> KResult<()> {
    chk(unsafe { libc::linkat(dirfd, old.as_ptr(), dirfd, new.as_ptr(), 0) })
}

pub fn unlinkat(dirfd: i32, path: &CStr, dir: bool) -> KResult<()> {
    chk(unsafe {
        libc::unlinkat(
            dirfd,
            path.as_ptr(),
            if dir { libc::AT_REMOVEDIR } else { 0 },
        )
    })
}

/// An `O_PATH` descriptor of a directory (search permission on the way, nothing on it).
pub fn open_dir_path(dirfd: i32, path: &CStr) -> KResult<i32> {
    let fd = unsafe {
        libc::openat(
            dirfd,
            path.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        Err(errno())
    } else {
        Ok(fd)
    }
}

pub fn close(fd: i32) {
    unsafe { libc::close(fd) };
}

/// chown, chmod, truncate, utimens in that order; a final symlink is followed only for chmod
/// and truncate when `follow` (as the syscalls do).
pub fn setattr_follow(dirfd: i32, path: &CStr, set: &SetAttr, follow: bool) -> KResult<()> {
    let nf = if follow { 0 } else { libc::AT_SYMLINK_NOFOLLOW };
    if set.uid.is_some() || set.gid.is_some() {
        let u = set.uid.unwrap_or(u32::MAX);
        let g = set.gid.unwrap_or(u32::MAX);
        chk(unsafe { libc::fchownat(dirfd, path.as_ptr(), u, g, nf) })?;
    }
    if let Some(m) = set.mode {
        chk(unsafe { libc::fchmodat(dirfd, path.as_ptr(), m & 0o7777, 0) })?;
    }
    if let Some(sz) = set.size {
        // As truncate(2): EISDIR for directories, EINVAL for other non-regular files (never
        // open a FIFO), then write permission.
        let a = fstatat(dirfd, path, follow)?;
        match a.mode & libc::S_IFMT {
            libc::S_IFREG => {}
            libc::S_IFDIR => return Err(libc::EISDIR),
            _ => return Err(libc::EINVAL),
        }
        let fd = unsafe {
            libc::openat(
                dirfd,
                path.as_ptr(),
                libc::O_WRONLY
                    | libc::O_NONBLOCK
                    | libc::O_CLOEXEC
                    | if follow { 0 } else { libc::O_NOFOLLOW },
            )
        };
        if fd < 0 {
            return Err(errno());
        }
        let r = unsafe { libc::ftruncate(fd, sz as i64) };
        let e = errno();
        unsafe { libc::close(fd) };
        if r < 0 {
            return Err(e);
        }
    }
    if set.atime.is_some() || set.mtime.is_some() {
        let ts = [timespec_of(set.atime), timespec_of(set.mtime)];
        chk(unsafe { libc::utimensat(dirfd, path.as_ptr(), ts.as_ptr(), nf) })?;
    }
    Ok(())
}

/// setattr of a path the cache already resolved (never follows a final symlink).
pub fn setattr_at(dirfd: i32, path: &CStr, set: &SetAttr) -> KResult<()> {
    setattr_follow(dirfd, path, set, false)
}

/// A C string from bytes (panics on NUL: callers filter those).
pub fn c(p: &[u8]) -> CString {
    CString::new(p.to_vec()).expect("NUL in path")
}
