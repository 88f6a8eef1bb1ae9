//! Helpers for dircache's integration tests: per-thread file-system credentials, a "jail"
//! thread that runs syscalls chrooted into a tree (so absolute paths, absolute symlink targets
//! and `..` above the root behave as they do under the cache's own root), kernel versions of
//! the operations the oracle compares, and a small reference [`KernelBackend`] so the core can
//! be tested independently of `dircache-local`.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;

use dircache_core::{
    Attr, Backend, Cred, DirEntry, Error, FileType, RenameMode, Result, SetAttr, TimeSet, Timespec,
};

pub mod child_mount;
pub mod delay_proxy;
pub mod kernel;
pub mod remote;
pub mod sshd;

/// A test that cannot run here (no root, no sshd, no /dev/fuse, ...). Under CI (the `CI`
/// variable is set) that is a failure: CI must run every test. Elsewhere the test returns
/// early, but says so loudly on stderr (past the test harness's output capture).
pub fn cannot_run(why: &str) {
    let test = std::thread::current().name().unwrap_or("?").to_string();
    if std::env::var_os("CI").is_some() {
        panic!("{test}: cannot run ({why}), and CI is set: a skipped test fails in CI");
    }
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!("\n*** SKIPPED {test}: {why}. This test did NOT run (in CI it fails). ***\n")
            .as_bytes(),
    );
}

/// Whether the program `tool` runs here (`tool --version`); if not, the test cannot run
/// ([`cannot_run`]: a failure under CI) and the caller returns.
pub fn have_tool(tool: &str) -> bool {
    let runs = std::process::Command::new(tool)
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok();
    if !runs {
        cannot_run(&format!("{tool} missing"));
    }
    runs
}

/// The errno of the last failed libc call.
pub fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// Convert a byte path to a C string; an embedded NUL gives EINVAL (as the kernel cannot
/// even be asked).
pub fn cstr(p: &[u8]) -> Result<CString> {
    CString::new(p.to_vec()).map_err(|_| Error::Invalid)
}

/// Attributes from a `struct stat`.
pub fn attr_from_stat(st: &libc::stat) -> Attr {
    Attr {
        ino: st.st_ino,
        dev: st.st_dev,
        mode: st.st_mode,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: st.st_rdev,
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        blksize: st.st_blksize as u32,
        atime: Timespec {
            sec: st.st_atime,
            nsec: st.st_atime_nsec as u32,
        },
        mtime: Timespec {
            sec: st.st_mtime,
            nsec: st.st_mtime_nsec as u32,
        },
        ctime: Timespec {
            sec: st.st_ctime,
            nsec: st.st_ctime_nsec as u32,
        },
        birth: 0,
    }
}

/// Switch the *calling thread's* fs uid, fs gid and supplementary groups with raw syscalls
/// (glibc's wrappers would change every thread of the process). Returns a guard that switches
/// back to root on drop.
pub fn become_fs(cred: &Cred) -> FsCredGuard {
    set_fs_cred(cred.uid, cred.gid, cred.groups());
    FsCredGuard(())
}

/// Restores root fs credentials when dropped.
pub struct FsCredGuard(());

impl Drop for FsCredGuard {
    fn drop(&mut self) {
        set_fs_cred(0, 0, &[]);
    }
}

fn set_fs_cred(uid: u32, gid: u32, groups: &[u32]) {
    // Order: groups and gid while still fs-root, uid last; back to root: uid first.
    unsafe {
        if uid == 0 {
            libc::syscall(libc::SYS_setfsuid, 0);
        }
        let r = libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr());
        assert_eq!(r, 0, "setgroups: errno {}", errno());
        libc::syscall(libc::SYS_setfsgid, gid);
        libc::syscall(libc::SYS_setfsuid, uid);
        // setfsuid returns the previous value; read back to make sure it took.
        let now = libc::syscall(libc::SYS_setfsuid, u32::MAX) as u32;
        assert_eq!(now, uid, "setfsuid did not take");
        let nowg = libc::syscall(libc::SYS_setfsgid, u32::MAX) as u32;
        assert_eq!(nowg, gid, "setfsgid did not take");
    }
}

/// Run `f` with the calling thread's fs credentials switched to `cred`.
pub fn as_cred<R>(cred: &Cred, f: impl FnOnce() -> R) -> R {
    let _g = become_fs(cred);
    f()
}

type Job = Box<dyn FnOnce() + Send>;

/// A worker thread with its own fs struct (`unshare(CLONE_FS)`) chrooted into a directory:
/// every syscall it runs resolves `/` and `..` at that directory, as the cache does at its root.
pub struct Jail {
    tx: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    root: PathBuf,
}

impl Jail {
    pub fn new(root: &Path) -> Jail {
        let (tx, rx) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::channel::<std::result::Result<(), i32>>();
        let r = root.to_path_buf();
        let thread = std::thread::spawn(move || {
            let setup = (|| unsafe {
                if libc::unshare(libc::CLONE_FS) != 0 {
                    return Err(errno());
                }
                let c = CString::new(r.as_os_str().as_bytes()).unwrap();
                if libc::chroot(c.as_ptr()) != 0 {
                    return Err(errno());
                }
                if libc::chdir(c"/".as_ptr()) != 0 {
                    return Err(errno());
                }
                Ok(())
            })();
            let ok = setup.is_ok();
            ready_tx.send(setup).unwrap();
            if !ok {
                return;
            }
            while let Ok(job) = rx.recv() {
                job();
            }
        });
        ready_rx
            .recv()
            .unwrap()
            .expect("jail setup (unshare/chroot) failed; tests must run as root");
        Jail {
            tx: Some(tx),
            thread: Some(thread),
            root: root.to_path_buf(),
        }
    }

    /// The real directory this jail is chrooted into.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Run `f` in the jail as root.
    pub fn run<R: Send + 'static>(&self, f: impl FnOnce() -> R + Send + 'static) -> R {
        let (rtx, rrx) = mpsc::channel();
        self.tx
            .as_ref()
            .unwrap()
            .send(Box::new(move || {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
                let _ = rtx.send(r);
            }))
            .unwrap();
        match rrx.recv().unwrap() {
            Ok(r) => r,
            Err(p) => std::panic::resume_unwind(p),
        }
    }

    /// Run `f` in the jail with fs credentials `cred`.
    pub fn run_as<R: Send + 'static>(
        &self,
        cred: &Cred,
        f: impl FnOnce() -> R + Send + 'static,
    ) -> R {
        let c = cred.clone();
        self.run(move || as_cred(&c, f))
    }
}

impl Drop for Jail {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A minimal reference backend over a real directory, written for the tests: the parent of
/// every path is opened with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` from a descriptor
/// of the root (so it can never escape, whatever the cache hands it), the final component is
/// handled with `*at` calls, and mutations run under the caller's fs credentials.
pub struct KernelBackend {
    root: std::fs::File,
}

/// An owned descriptor (closed on drop).
struct Fd(i32);

impl Drop for Fd {
    fn drop(&mut self) {
        if self.0 >= 0 {
            unsafe { libc::close(self.0) };
        }
    }
}

impl KernelBackend {
    pub fn new(root: &Path) -> std::io::Result<KernelBackend> {
        let root = std::fs::File::open(root)?;
        Ok(KernelBackend { root })
    }

    fn fd(&self) -> i32 {
        use std::os::fd::AsRawFd;
        self.root.as_raw_fd()
    }

    /// Open the directory `dir` (a backend path) beneath the root, following no symlinks.
    fn open_dir(&self, dir: &[u8], flags: i32) -> Result<Fd> {
        let p = if dir.is_empty() {
            cstr(b".")?
        } else {
            cstr(dir)?
        };
        let mut how: libc::open_how = unsafe { std::mem::zeroed() };
        how.flags = (flags | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64;
        how.resolve =
            libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                self.fd(),
                p.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if fd < 0 {
            let e = errno();
            // A symlink on the way is not something the cache should ever hand us.
            return Err(Error::from_errno(if e == libc::ELOOP {
                libc::ENOTDIR
            } else {
                e
            }));
        }
        Ok(Fd(fd as i32))
    }

    /// The parent directory's descriptor and the final name ("." for the root itself).
    fn split(&self, path: &[u8]) -> Result<(Fd, CString)> {
        match path.iter().rposition(|&b| b == b'/') {
            Some(i) => Ok((
                self.open_dir(&path[..i], libc::O_PATH)?,
                cstr(&path[i + 1..])?,
            )),
            None if path.is_empty() => Ok((self.open_dir(b"", libc::O_PATH)?, cstr(b".")?)),
            None => Ok((self.open_dir(b"", libc::O_PATH)?, cstr(path)?)),
        }
    }

    fn lstat(&self, path: &[u8]) -> Result<Attr> {
        let (d, n) = self.split(path)?;
        kernel::fstatat(d.0, &n, false).map_err(Error::from_errno)
    }
}

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = dir.to_vec();
    if !p.is_empty() {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

fn chk(r: i32) -> Result<()> {
    if r < 0 {
        Err(Error::from_errno(errno()))
    } else {
        Ok(())
    }
}

impl Backend for KernelBackend {
    fn lookup(&self, dir: &[u8], name: &[u8]) -> Result<Attr> {
        self.lstat(&join(dir, name))
    }

    fn getattr(&self, path: &[u8]) -> Result<Attr> {
        self.lstat(path)
    }

    fn readdir(&self, path: &[u8], plus: bool) -> Result<Vec<DirEntry>> {
        let d = self.open_dir(path, libc::O_PATH)?;
        let mut out = kernel::readdir_at(d.0, c".").map_err(Error::from_errno)?;
        if plus {
            for e in &mut out {
                e.attr = self.lstat(&join(path, &e.name)).ok();
            }
        }
        Ok(out)
    }

    fn readlink(&self, path: &[u8]) -> Result<Vec<u8>> {
        let (d, n) = self.split(path)?;
        kernel::readlinkat(d.0, &n).map_err(Error::from_errno)
    }

    fn mknod(&self, cred: &Cred, path: &[u8], mode: u32, rdev: u64) -> Result<Attr> {
        let (d, n) = self.split(path)?;
        as_cred(cred, || {
            chk(unsafe { libc::mknodat(d.0, n.as_ptr(), mode, rdev) })
        })?;
        self.lstat(path)
    }

    fn mkdir(&self, cred: &Cred, path: &[u8], mode: u32) -> Result<Attr> {
        let (d, n) = self.split(path)?;
        as_cred(cred, || {
            chk(unsafe { libc::mkdirat(d.0, n.as_ptr(), mode) })
        })?;
        self.lstat(path)
    }

    fn symlink(&self, cred: &Cred, target: &[u8], path: &[u8]) -> Result<Attr> {
        let (d, n) = self.split(path)?;
        let t = cstr(target)?;
        as_cred(cred, || {
            chk(unsafe { libc::symlinkat(t.as_ptr(), d.0, n.as_ptr()) })
        })?;
        self.lstat(path)
    }

    fn link(&self, cred: &Cred, old: &[u8], new: &[u8]) -> Result<Attr> {
        let (od, on) = self.split(old)?;
        let (nd, nn) = self.split(new)?;
        as_cred(cred, || {
            chk(unsafe { libc::linkat(od.0, on.as_ptr(), nd.0, nn.as_ptr(), 0) })
        })?;
        self.lstat(new)
    }

    fn unlink(&self, cred: &Cred, path: &[u8]) -> Result<()> {
        let (d, n) = self.split(path)?;
        as_cred(cred, || chk(unsafe { libc::unlinkat(d.0, n.as_ptr(), 0) }))
    }

    fn rmdir(&self, cred: &Cred, path: &[u8]) -> Result<()> {
        let (d, n) = self.split(path)?;
        as_cred(cred, || {
            chk(unsafe { libc::unlinkat(d.0, n.as_ptr(), libc::AT_REMOVEDIR) })
        })
    }

    fn rename(&self, cred: &Cred, old: &[u8], new: &[u8], mode: RenameMode) -> Result<()> {
        let (od, on) = self.split(old)?;
        let (nd, nn) = self.split(new)?;
        as_cred(cred, || {
            kernel::renameat2(od.0, &on, nd.0, &nn, mode).map_err(Error::from_errno)
        })
    }

    fn setattr(&self, cred: &Cred, path: &[u8], set: &SetAttr) -> Result<Attr> {
        let (d, n) = self.split(path)?;
        as_cred(cred, || {
            kernel::setattr_at(d.0, &n, set).map_err(Error::from_errno)
        })?;
        self.lstat(path)
    }
}

/// `TimeSet` to a `timespec` for utimensat.
pub fn timespec_of(t: Option<TimeSet>) -> libc::timespec {
    match t {
        None => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        Some(TimeSet::Now) => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        Some(TimeSet::At(ts)) => libc::timespec {
            tv_sec: ts.sec,
            tv_nsec: ts.nsec as i64,
        },
    }
}

/// The file type of a `d_type` value (DT_UNKNOWN is not expected on ext4/tmpfs).
pub fn ftype_of_dtype(d: u8) -> FileType {
    match d {
        libc::DT_DIR => FileType::Directory,
        libc::DT_LNK => FileType::Symlink,
        libc::DT_CHR => FileType::CharDevice,
        libc::DT_BLK => FileType::BlockDevice,
        libc::DT_FIFO => FileType::Fifo,
        libc::DT_SOCK => FileType::Socket,
        _ => FileType::Regular,
    }
}
