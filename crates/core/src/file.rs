//! Open files of a backend: what [`Backend::open`](crate::Backend::open) returns.
//!
//! A front end (FUSE) reads, writes, syncs, allocates, seeks and changes attributes of an
//! open file only through [`BackendFile`], so a backend without local descriptors (a remote
//! one) can serve the same front end. [`FdFile`] is the one implementation over a local
//! descriptor (the local backend's files, the memory backend's memfds).
//!
//! ## Credentials
//!
//! Every method that changes the file (`write_at`, `allocate`, `set_size`, `setattr`,
//! `copy_to`) takes the requester's [`Cred`] and runs as that requester, so the file system
//! holding the file decides as it would for that user: set-user-ID and set-group-ID bits are
//! cleared on a write by a user without CAP_FSETID, quota and reserved blocks apply to that
//! user, chown/chmod/utimens are permitted or not for that user. Reads, syncs, seeks and
//! `attr` need no credentials: the open itself was checked (as the caller) when the file was
//! opened. [`FdFile`] switches with the [`CallerFn`] its backend gave it
//! ([`FdFile::acting_as`]); without one (a backend whose permission checks are its own) it
//! runs the syscall as the process.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use crate::{Attr, Cred, Error, Result, SetAttr, TimeSet};

/// Where [`BackendFile::seek`] starts from: lseek(2)'s `whence`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Whence {
    Set,
    Cur,
    End,
    /// SEEK_DATA: the next offset at or after `offset` holding data.
    Data,
    /// SEEK_HOLE: the next hole at or after `offset` (the end of file counts as one).
    Hole,
}

impl Whence {
    /// lseek(2)'s `whence` number; EINVAL for an unknown one.
    pub fn from_raw(whence: i32) -> Result<Whence> {
        Ok(match whence {
            libc::SEEK_SET => Whence::Set,
            libc::SEEK_CUR => Whence::Cur,
            libc::SEEK_END => Whence::End,
            libc::SEEK_DATA => Whence::Data,
            libc::SEEK_HOLE => Whence::Hole,
            _ => return Err(Error::Invalid),
        })
    }
}

/// An open file of a backend (module docs for the credential rule).
pub trait BackendFile: Send + Sync {
    /// Read up to `buf.len()` bytes at `offset`; fewer only at the end of the file.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize>;

    /// Write `data` at `offset` as `cred`, or at the end of the file at the time of the
    /// write when `append` (one piece, as an O_APPEND write: another appender's data never
    /// lands in between). Returns how much was written (short only if an error stopped the
    /// write after some data went in).
    fn write_at(&self, cred: &Cred, data: &[u8], offset: u64, append: bool) -> Result<usize>;

    /// fsync(2), or fdatasync(2) if `datasync`.
    fn sync(&self, datasync: bool) -> Result<()>;

    /// fallocate(2) with `mode` (FALLOC_FL_* bits) as `cred`.
    fn allocate(&self, cred: &Cred, mode: i32, offset: u64, len: u64) -> Result<()>;

    /// lseek(2) on the file; what a front end needs it for is SEEK_DATA and SEEK_HOLE (reads
    /// and writes are positional, so no offset of the open file is ever used for I/O).
    fn seek(&self, offset: i64, whence: Whence) -> Result<u64>;

    /// ftruncate(2) as `cred`. A file opened read-only is truncated as for
    /// open(O_RDONLY|O_TRUNC): the same inode, opened for writing as `cred`.
    fn set_size(&self, cred: &Cred, size: u64) -> Result<()>;

    /// chown, chmod and utimens of the open file as `cred` (`set.size` is ignored: see
    /// [`set_size`](Self::set_size)); nothing set moves the change time only, as
    /// chown(f, -1, -1) does. Returns the new attributes.
    fn setattr(&self, cred: &Cred, set: &SetAttr) -> Result<Attr>;

    /// The file's attributes now (fstat).
    fn attr(&self) -> Result<Attr>;

    /// Whether the file was opened for writing.
    fn writable(&self) -> bool;

    /// close(2) of a descriptor of the file (FUSE FLUSH, sent only when
    /// [`Backend::flush_on_close`](crate::Backend::flush_on_close)): a file that keeps
    /// writes locally stores them here, and its error is close's. Default: nothing to do.
    fn flush(&self) -> Result<()> {
        Ok(())
    }

    /// A local descriptor of the file, if there is one: for what only a descriptor can do
    /// (a FUSE passthrough backing file, inode-flag ioctls, copy_file_range between two
    /// descriptors). A remote file has none.
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    /// Run `f` (a syscall the front end makes on [`fd`](Self::fd)) as `cred`, as this
    /// file's own mutations run; `shared` when the credentials serve later I/O of other users
    /// too (registering a passthrough backing file: the kernel keeps the registering thread's
    /// credentials for every read and write of it). Default: not supported.
    fn as_caller(
        &self,
        _cred: &Cred,
        _shared: bool,
        _f: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        Err(Error::NotSupported)
    }

    /// Copy up to `len` bytes at `offset_in` of this file to `dst` at `offset_out`, writing
    /// as `cred` (copy_file_range(2)). Default: one read and one write of at most 1 MiB.
    fn copy_to(
        &self,
        cred: &Cred,
        offset_in: u64,
        dst: &dyn BackendFile,
        offset_out: u64,
        len: u64,
    ) -> Result<usize> {
        copy_by_read_write(self, cred, offset_in, dst, offset_out, len)
    }
}

/// [`BackendFile::copy_to`] without a kernel copy: one read of at most 1 MiB from `src`, one
/// write of it to `dst` as `cred`.
pub fn copy_by_read_write(
    src: &(impl BackendFile + ?Sized),
    cred: &Cred,
    offset_in: u64,
    dst: &dyn BackendFile,
    offset_out: u64,
    len: u64,
) -> Result<usize> {
    let mut buf = vec![0u8; len.min(1 << 20) as usize];
    let n = src.read_at(&mut buf, offset_in)?;
    if n == 0 {
        return Ok(0);
    }
    dst.write_at(cred, &buf[..n], offset_out, false)
}

impl std::fmt::Debug for dyn BackendFile + '_ {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackendFile")
            .field("fd", &self.fd())
            .finish_non_exhaustive()
    }
}

/// How an [`FdFile`] runs a syscall as a caller: `(cred, shared, f)` runs `f` with `cred`'s
/// file-system credentials (`shared` as in [`BackendFile::as_caller`]). Given by the backend
/// (the local backend's switches the thread's fs uid, gid, groups and capabilities).
pub type CallerFn = fn(&Cred, bool, &mut dyn FnMut() -> Result<()>) -> Result<()>;

fn run_as_process(_cred: &Cred, _shared: bool, f: &mut dyn FnMut() -> Result<()>) -> Result<()> {
    f()
}

/// A [`BackendFile`] over a local descriptor: every operation is the syscall on it.
pub struct FdFile {
    fd: OwnedFd,
    caller: CallerFn,
}

fn os(e: rustix::io::Errno) -> Error {
    Error::from_errno(e.raw_os_error())
}

/// The `/proc/self/fd` name of `fd`: the same inode, whatever its names are now.
fn proc_path(fd: BorrowedFd<'_>) -> String {
    use std::os::fd::AsRawFd;
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

impl FdFile {
    /// A file over `fd` whose mutations run as the process (no credential switch).
    pub fn new(fd: OwnedFd) -> FdFile {
        FdFile {
            fd,
            caller: run_as_process,
        }
    }

    /// Run mutations as the caller with `caller` (module docs).
    pub fn acting_as(mut self, caller: CallerFn) -> FdFile {
        self.caller = caller;
        self
    }

    /// `f` as `cred` (for the file's own mutations: not shared).
    fn as_cred<T>(&self, cred: &Cred, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let mut f = Some(f);
        let mut out = None;
        (self.caller)(cred, false, &mut || {
            if let Some(f) = f.take() {
                out = Some(f()?);
            }
            Ok(())
        })?;
        out.ok_or(Error::Os(libc::EIO))
    }

    fn flags(&self) -> rustix::fs::OFlags {
        rustix::fs::fcntl_getfl(&self.fd).unwrap_or(rustix::fs::OFlags::empty())
    }
}

impl AsFd for FdFile {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Attributes of an open descriptor (statx of the descriptor itself).
pub fn attr_of_fd(fd: impl AsFd) -> Result<Attr> {
    let st = rustix::fs::statx(
        fd,
        "",
        rustix::fs::AtFlags::EMPTY_PATH,
        rustix::fs::StatxFlags::BASIC_STATS | rustix::fs::StatxFlags::BTIME,
    )
    .map_err(os)?;
    Ok(Attr::from_statx(&st))
}

fn timespec(t: Option<TimeSet>) -> rustix::fs::Timespec {
    match t {
        None => rustix::fs::Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_OMIT,
        },
        Some(TimeSet::Now) => rustix::fs::Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_NOW,
        },
        Some(TimeSet::At(t)) => rustix::fs::Timespec {
            tv_sec: t.sec,
            tv_nsec: i64::from(t.nsec) as _,
        },
    }
}

/// utimensat(2) timestamps for a setattr's atime and mtime (UTIME_OMIT when not set).
pub fn timestamps(atime: Option<TimeSet>, mtime: Option<TimeSet>) -> rustix::fs::Timestamps {
    rustix::fs::Timestamps {
        last_access: timespec(atime),
        last_modification: timespec(mtime),
    }
}

impl BackendFile for FdFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        let mut done = 0usize;
        while done < buf.len() {
            match rustix::io::pread(&self.fd, &mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(os(e)),
            }
        }
        Ok(done)
    }

    fn write_at(&self, cred: &Cred, data: &[u8], offset: u64, append: bool) -> Result<usize> {
        self.as_cred(cred, || {
            let mut done = 0usize;
            while done < data.len() {
                let r = if append {
                    rustix::io::pwritev2(
                        &self.fd,
                        &[std::io::IoSlice::new(&data[done..])],
                        0,
                        rustix::io::ReadWriteFlags::APPEND,
                    )
                } else {
                    rustix::io::pwrite(&self.fd, &data[done..], offset + done as u64)
                };
                match r {
                    Ok(n) => done += n,
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(_) if done > 0 => break,
                    Err(e) => return Err(os(e)),
                }
            }
            Ok(done)
        })
    }

    fn sync(&self, datasync: bool) -> Result<()> {
        if datasync {
            rustix::fs::fdatasync(&self.fd)
        } else {
            rustix::fs::fsync(&self.fd)
        }
        .map_err(os)
    }

    fn allocate(&self, cred: &Cred, mode: i32, offset: u64, len: u64) -> Result<()> {
        let mode = rustix::fs::FallocateFlags::from_bits_retain(mode as u32);
        self.as_cred(cred, || {
            rustix::fs::fallocate(&self.fd, mode, offset, len).map_err(os)
        })
    }

    fn seek(&self, offset: i64, whence: Whence) -> Result<u64> {
        use rustix::fs::SeekFrom;
        let neg = || Error::Invalid;
        let from = match whence {
            Whence::Set => SeekFrom::Start(u64::try_from(offset).map_err(|_| neg())?),
            Whence::Cur => SeekFrom::Current(offset),
            Whence::End => SeekFrom::End(offset),
            Whence::Data => {
                SeekFrom::Data(u64::try_from(offset).map_err(|_| Error::Os(libc::ENXIO))?)
            }
            Whence::Hole => {
                SeekFrom::Hole(u64::try_from(offset).map_err(|_| Error::Os(libc::ENXIO))?)
            }
        };
        rustix::fs::seek(&self.fd, from).map_err(os)
    }

    fn set_size(&self, cred: &Cred, size: u64) -> Result<()> {
        self.as_cred(cred, || {
            if self.writable() {
                return rustix::fs::ftruncate(&self.fd, size).map_err(os);
            }
            let w = rustix::fs::open(
                proc_path(self.fd.as_fd()),
                rustix::fs::OFlags::WRONLY
                    | rustix::fs::OFlags::NONBLOCK
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .map_err(os)?;
            rustix::fs::ftruncate(&w, size).map_err(os)
        })
    }

    fn setattr(&self, cred: &Cred, set: &SetAttr) -> Result<Attr> {
        self.as_cred(cred, || {
            let nothing = set.uid.is_none()
                && set.gid.is_none()
                && set.mode.is_none()
                && set.atime.is_none()
                && set.mtime.is_none();
            if set.uid.is_some() || set.gid.is_some() || nothing {
                // chownat(AT_EMPTY_PATH) also works on an O_PATH descriptor.
                rustix::fs::chownat(
                    &self.fd,
                    "",
                    set.uid.map(rustix::fs::Uid::from_raw),
                    set.gid.map(rustix::fs::Gid::from_raw),
                    rustix::fs::AtFlags::EMPTY_PATH | rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
                )
                .map_err(os)?;
            }
            if let Some(m) = set.mode {
                rustix::fs::fchmod(&self.fd, rustix::fs::Mode::from_raw_mode(m & 0o7777))
                    .map_err(os)?;
            }
            if set.atime.is_some() || set.mtime.is_some() {
                rustix::fs::futimens(&self.fd, &timestamps(set.atime, set.mtime)).map_err(os)?;
            }
            Ok(())
        })?;
        self.attr()
    }

    fn attr(&self) -> Result<Attr> {
        attr_of_fd(&self.fd)
    }

    fn writable(&self) -> bool {
        let fl = self.flags();
        !fl.contains(rustix::fs::OFlags::PATH)
            && matches!(
                fl & rustix::fs::OFlags::RWMODE,
                rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::RDWR
            )
    }

    fn fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.fd.as_fd())
    }

    fn as_caller(
        &self,
        cred: &Cred,
        shared: bool,
        f: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        (self.caller)(cred, shared, f)
    }

    fn copy_to(
        &self,
        cred: &Cred,
        offset_in: u64,
        dst: &dyn BackendFile,
        offset_out: u64,
        len: u64,
    ) -> Result<usize> {
        let Some(out) = dst.fd() else {
            return copy_by_read_write(self, cred, offset_in, dst, offset_out, len);
        };
        let mut oin = offset_in;
        let mut oout = offset_out;
        let len = len.min(u64::from(u32::MAX)) as usize;
        // As the caller: the destination's file system clears set-id bits as for that user.
        let mut n = 0;
        dst.as_caller(cred, false, &mut || {
            n = rustix::fs::copy_file_range(&self.fd, Some(&mut oin), out, Some(&mut oout), len)
                .map_err(os)?;
            Ok(())
        })?;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    fn tmpfile() -> OwnedFd {
        rustix::fs::open(
            std::env::temp_dir(),
            rustix::fs::OFlags::TMPFILE | rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::from_raw_mode(0o600),
        )
        .unwrap_or_else(|e| panic!("O_TMPFILE in {:?}: {e}", std::env::temp_dir()))
    }

    fn me() -> Cred {
        Cred::new(
            rustix::process::getuid().as_raw(),
            rustix::process::getgid().as_raw(),
            [],
        )
    }

    /// The raw syscall's answer, for comparison.
    fn raw_seek(fd: &OwnedFd, off: i64, whence: i32) -> std::result::Result<u64, i32> {
        let w = match whence {
            libc::SEEK_DATA => rustix::fs::SeekFrom::Data(off as u64),
            libc::SEEK_HOLE => rustix::fs::SeekFrom::Hole(off as u64),
            _ => unreachable!(),
        };
        rustix::fs::seek(fd, w).map_err(|e| e.raw_os_error())
    }

    #[test]
    fn seek_data_and_hole_match_the_syscall() {
        let raw = tmpfile();
        let f = FdFile::new(raw.try_clone().unwrap());
        // Data at 0..4096 and at 1 MiB..+4096, a hole between and after the end.
        f.write_at(&me(), &[1u8; 4096], 0, false).unwrap();
        f.write_at(&me(), &[2u8; 4096], 1 << 20, false).unwrap();
        let size = f.attr().unwrap().size;
        assert_eq!(size, (1 << 20) + 4096);
        for off in [
            0i64,
            100,
            4096,
            8192,
            1 << 19,
            1 << 20,
            (1 << 20) + 4095,
            size as i64,
        ] {
            for (w, whence) in [
                (Whence::Data, libc::SEEK_DATA),
                (Whence::Hole, libc::SEEK_HOLE),
            ] {
                let ours = f.seek(off, w).map_err(|e| e.errno());
                assert_eq!(
                    ours,
                    raw_seek(&raw, off, whence),
                    "offset {off} whence {whence}"
                );
            }
        }
        // Past the end: ENXIO for both.
        assert_eq!(
            f.seek(size as i64 + 1, Whence::Data).map_err(|e| e.errno()),
            Err(libc::ENXIO)
        );
        assert_eq!(Whence::from_raw(77), Err(Error::Invalid));
    }

    #[test]
    fn append_goes_to_the_end_whatever_the_offset() {
        let raw = tmpfile();
        let f = FdFile::new(raw.try_clone().unwrap());
        assert_eq!(f.write_at(&me(), b"hello", 0, false).unwrap(), 5);
        // Someone else writes at the end meanwhile, directly.
        rustix::io::pwrite(&raw, b" world", 5).unwrap();
        // An append "at 0" lands after both.
        assert_eq!(f.write_at(&me(), b"!", 0, true).unwrap(), 1);
        let mut buf = [0u8; 64];
        let n = f.read_at(&mut buf, 0).unwrap();
        assert_eq!(&buf[..n], b"hello world!");
        // read_at at the end: nothing, not an error.
        assert_eq!(f.read_at(&mut buf, 12).unwrap(), 0);
        assert!(f.writable());
    }

    #[test]
    fn allocate_and_set_size_match_the_syscalls() {
        let a = tmpfile();
        let b = tmpfile();
        let f = FdFile::new(a.try_clone().unwrap());
        f.allocate(&me(), 0, 0, 65536).unwrap();
        rustix::fs::fallocate(&b, rustix::fs::FallocateFlags::empty(), 0, 65536).unwrap();
        let (sa, sb) = (
            rustix::fs::fstat(&a).unwrap(),
            rustix::fs::fstat(&b).unwrap(),
        );
        assert_eq!((sa.st_size, sa.st_blocks), (sb.st_size, sb.st_blocks));
        // KEEP_SIZE: blocks, no size.
        let keep = libc::FALLOC_FL_KEEP_SIZE;
        f.allocate(&me(), keep, 65536, 65536).unwrap();
        rustix::fs::fallocate(&b, rustix::fs::FallocateFlags::KEEP_SIZE, 65536, 65536).unwrap();
        let (sa, sb) = (
            rustix::fs::fstat(&a).unwrap(),
            rustix::fs::fstat(&b).unwrap(),
        );
        assert_eq!((sa.st_size, sa.st_blocks), (sb.st_size, sb.st_blocks));
        assert_eq!(sa.st_size, 65536);
        // An invalid mode is the syscall's error.
        let bad = f.allocate(&me(), 0x7fff_0000, 0, 1).map_err(|e| e.errno());
        let raw = rustix::fs::fallocate(
            &b,
            rustix::fs::FallocateFlags::from_bits_retain(0x7fff_0000),
            0,
            1,
        )
        .map_err(|e| e.raw_os_error());
        assert_eq!(bad, raw);
        assert!(bad.is_err());
        f.set_size(&me(), 10).unwrap();
        assert_eq!(f.attr().unwrap().size, 10);
        assert_eq!(f.attr().unwrap().ino, rustix::fs::fstat(&a).unwrap().st_ino);
    }

    #[test]
    fn set_size_of_a_read_only_file_reopens_it_for_writing() {
        let dir = std::env::temp_dir().join(format!("dircache-fdfile-{}", std::process::id()));
        std::fs::write(&dir, b"0123456789").unwrap();
        let ro =
            rustix::fs::open(&dir, rustix::fs::OFlags::RDONLY, rustix::fs::Mode::empty()).unwrap();
        let f = FdFile::new(ro);
        assert!(!f.writable());
        f.set_size(&me(), 4).unwrap();
        let len = std::fs::metadata(&dir).unwrap().len();
        std::fs::remove_file(&dir).unwrap();
        assert_eq!(len, 4);
        assert!(f.fd().is_some_and(|fd| fd.as_raw_fd() >= 0));
    }

    #[test]
    fn copy_to_copies_through_both_paths() {
        let a = FdFile::new(tmpfile());
        let b = FdFile::new(tmpfile());
        a.write_at(&me(), b"abcdefgh", 0, false).unwrap();
        // Descriptor to descriptor (copy_file_range).
        assert_eq!(a.copy_to(&me(), 2, &b, 1, 4).unwrap(), 4);
        // The default (read, then write) through a file without a descriptor.
        struct NoFd(FdFile);
        impl BackendFile for NoFd {
            fn read_at(&self, buf: &mut [u8], o: u64) -> Result<usize> {
                self.0.read_at(buf, o)
            }
            fn write_at(&self, c: &Cred, d: &[u8], o: u64, a: bool) -> Result<usize> {
                self.0.write_at(c, d, o, a)
            }
            fn sync(&self, d: bool) -> Result<()> {
                self.0.sync(d)
            }
            fn allocate(&self, c: &Cred, m: i32, o: u64, l: u64) -> Result<()> {
                self.0.allocate(c, m, o, l)
            }
            fn seek(&self, o: i64, w: Whence) -> Result<u64> {
                self.0.seek(o, w)
            }
            fn set_size(&self, c: &Cred, s: u64) -> Result<()> {
                self.0.set_size(c, s)
            }
            fn setattr(&self, c: &Cred, s: &SetAttr) -> Result<Attr> {
                self.0.setattr(c, s)
            }
            fn attr(&self) -> Result<Attr> {
                self.0.attr()
            }
            fn writable(&self) -> bool {
                self.0.writable()
            }
        }
        let c = NoFd(FdFile::new(tmpfile()));
        assert_eq!(b.copy_to(&me(), 0, &c, 0, 100).unwrap(), 5);
        let mut buf = [0u8; 16];
        let n = c.read_at(&mut buf, 0).unwrap();
        assert_eq!(&buf[..n], b"\0cdef");
    }
}
