//! `dircache umount MNT [-l]`: unmount a dircache mount and wait for its daemon to exit, so
//! that whatever the daemon does at the end (`-o persist` writes its snapshot) is done when
//! the command returns. `umount(8)` and `fusermount3 -u` return as soon as the kernel has
//! detached the mount, while the daemon may still be running.

use std::path::{Path, PathBuf};
use std::time::Duration;

use dircache_fuse::kmount;

#[derive(clap::Args)]
pub struct UmountArgs {
    /// The mount point.
    pub mnt: PathBuf,
    /// Lazy unmount (as `umount -l`): detach now, even if busy; the daemon exits when the
    /// last user is gone, so the command does not wait for it.
    #[arg(short = 'l', long)]
    pub lazy: bool,
    /// How long to wait for the daemon to exit after the unmount, in seconds.
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
}

/// The daemon's process, held by a pidfd taken before the unmount (so a recycled pid can
/// never be mistaken for it).
fn daemon_pidfd(mnt: &Path) -> Option<(u32, std::os::fd::OwnedFd)> {
    let resp = dircache_fuse::stats::query_mount(mnt, &serde_json::json!({"op": "stats"})).ok()?;
    let pid = resp.get("stats")?.get("pid")?.as_u64()?;
    let pid = u32::try_from(pid).ok()?;
    let p = rustix::process::Pid::from_raw(i32::try_from(pid).ok()?)?;
    let fd = rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok()?;
    Some((pid, fd))
}

/// Whether the process behind `fd` exited within `timeout`.
fn wait_exit(fd: &std::os::fd::OwnedFd, timeout: Duration) -> bool {
    use rustix::event::{poll, PollFd, PollFlags};
    let t = rustix::time::Timespec {
        tv_sec: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: i64::from(timeout.subsec_nanos()),
    };
    loop {
        let mut p = [PollFd::new(fd, PollFlags::IN)];
        match poll(&mut p, Some(&t)) {
            Ok(n) => return n > 0,
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return false,
        }
    }
}

fn unmount(mnt: &Path, lazy: bool) -> std::io::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let flags = if lazy {
            rustix::mount::UnmountFlags::DETACH
        } else {
            rustix::mount::UnmountFlags::empty()
        };
        return rustix::mount::unmount(mnt, flags).map_err(Into::into);
    }
    // A user's own FUSE mount: the set-uid helper unmounts it.
    let mut c = std::process::Command::new("fusermount3");
    c.arg(if lazy { "-uz" } else { "-u" }).arg(mnt);
    let out = c.output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ))
    }
}

pub fn run(a: UmountArgs) -> anyhow::Result<i32> {
    let mnt = match kmount::mount_path(&a.mnt) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("dircache umount: {}: {e}", a.mnt.display());
            return Ok(2);
        }
    };
    let Some(entry) = kmount::mount_entry(&mnt) else {
        eprintln!("dircache umount: {}: not mounted", mnt.display());
        return Ok(2);
    };
    if entry.fstype != "fuse.dircache" {
        eprintln!(
            "dircache umount: {}: not a dircache mount (it is {})",
            mnt.display(),
            entry.fstype
        );
        return Ok(2);
    }
    // None when the daemon is gone (a dead mount) or does not answer: unmount all the same.
    let daemon = daemon_pidfd(&mnt);
    if let Err(e) = unmount(&mnt, a.lazy) {
        if e.raw_os_error() == Some(libc::EBUSY) {
            eprintln!(
                "dircache umount: {}: target is busy (programs have files or directories open \
                 there; `dircache umount -l` detaches it now)",
                mnt.display()
            );
        } else {
            eprintln!("dircache umount: {}: {e}", mnt.display());
        }
        return Ok(1);
    }
    if let (Some((pid, fd)), false) = (daemon, a.lazy) {
        if !wait_exit(&fd, Duration::from_secs(a.timeout)) {
            eprintln!(
                "dircache umount: {} is unmounted, but its daemon (pid {pid}) is still running \
                 after {} s",
                mnt.display(),
                a.timeout
            );
            return Ok(1);
        }
    }
    Ok(0)
}
