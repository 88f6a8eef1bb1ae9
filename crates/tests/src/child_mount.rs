//! A FUSE file system run in the foreground as our child (sshfs -f, `dircache mount -f`,
//! bindfs -f): [`ChildMount::start`] returns once the mount point shows in
//! `/proc/self/mountinfo` and the file system answered a stat of its root; dropping it
//! unmounts (lazily if busy) and reaps the daemon, stopping it by PID if it lingers.

use std::ffi::CString;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Whether `mnt` is a mount point (in this process's mount namespace).
pub fn is_mounted(mnt: &Path) -> bool {
    let Ok(s) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = mnt.as_os_str().as_bytes();
    s.lines().any(|l| {
        l.split(' ')
            .nth(4)
            .map(|m| unescape_mountinfo(m) == want)
            .unwrap_or(false)
    })
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            if let Some(v) = std::str::from_utf8(&b[i + 1..i + 4])
                .ok()
                .and_then(|o| u8::from_str_radix(o, 8).ok())
            {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// Unmount `mnt` (umount(2), then a lazy one if that fails). The syscall, not umount(8),
/// which stats the file system first: a request the tests that count them would see.
pub fn unmount(mnt: &Path) {
    if !is_mounted(mnt) {
        return;
    }
    if umount2(mnt, 0).is_err() && is_mounted(mnt) {
        let _ = umount2(mnt, libc::MNT_DETACH);
    }
}

fn umount2(mnt: &Path, flags: i32) -> std::io::Result<()> {
    let c = CString::new(mnt.as_os_str().as_bytes())?;
    // SAFETY: c is a NUL-terminated path that outlives the call.
    if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A mounted FUSE daemon, our child; see the module documentation.
pub struct ChildMount {
    mnt: PathBuf,
    child: Option<Child>,
    log: PathBuf,
}

impl ChildMount {
    /// Run `cmd` (a daemon that mounts `mnt` and stays in the foreground), its stdout and
    /// stderr going to `log`; wait up to `limit` for the mount. On failure the error carries
    /// the log, and nothing is left mounted or running.
    pub fn start(
        cmd: Command,
        mnt: &Path,
        log: &Path,
        limit: Duration,
    ) -> Result<ChildMount, String> {
        std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
        let mut m = Self::spawn(cmd, mnt, log)?;
        m.wait_mounted(limit)?;
        Ok(m)
    }

    /// Run `cmd` as [`ChildMount::start`] does, its output appended to `log`, without
    /// waiting for the mount (a daemon that has work to do before it mounts, such as
    /// replaying a log, may be killed in the middle of it).
    pub fn spawn(mut cmd: Command, mnt: &Path, log: &Path) -> Result<ChildMount, String> {
        std::fs::create_dir_all(mnt).map_err(|e| format!("mkdir {}: {e}", mnt.display()))?;
        if is_mounted(mnt) {
            return Err(format!("{} is already a mount point", mnt.display()));
        }
        let logf = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| format!("{}: {e}", log.display()))?;
        let logf2 = logf.try_clone().map_err(|e| e.to_string())?;
        cmd.stdin(Stdio::null()).stdout(logf).stderr(logf2);
        let child = cmd.spawn().map_err(|e| format!("starting {cmd:?}: {e}"))?;
        Ok(ChildMount {
            mnt: mnt.to_path_buf(),
            child: Some(child),
            log: log.to_path_buf(),
        })
    }

    /// Wait up to `limit` for the mount of a daemon [`ChildMount::spawn`] started. On
    /// failure the error carries the log, and nothing is left mounted or running.
    pub fn wait_mounted(&mut self, limit: Duration) -> Result<(), String> {
        let mnt = self.mnt.clone();
        let t0 = Instant::now();
        let parent_dev = mnt
            .parent()
            .and_then(|p| std::fs::metadata(p).ok())
            .map(|md| md.dev());
        loop {
            // Mounted is not enough (sshfs mounts, then connects, and may exit): the file
            // system must have answered a stat of its root.
            if is_mounted(&mnt)
                && std::fs::metadata(&mnt)
                    .map(|md| Some(md.dev()) != parent_dev)
                    .unwrap_or(false)
            {
                return Ok(());
            }
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    self.child = None;
                    let l = self.log_text();
                    self.stop();
                    return Err(format!("exited ({st}) before mounting: {l}"));
                }
            }
            if t0.elapsed() > limit {
                let l = self.log_text();
                self.stop();
                return Err(format!(
                    "did not mount {} within {limit:?}: {l}",
                    mnt.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn path(&self) -> &Path {
        &self.mnt
    }

    /// What the daemon wrote so far.
    pub fn log_text(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        s.trim().to_string()
    }

    /// The daemon's PID (while running).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the daemon has exited (it is reaped then; Drop still detaches a mount left).
    pub fn exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_none_or(|c| c.try_wait().is_ok_and(|st| st.is_some()))
    }

    /// A crash: SIGKILL the daemon (by PID), reap it, and detach its dead mount.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = umount2(&self.mnt, libc::MNT_DETACH);
    }

    /// Unmount and reap the daemon (what Drop does). A daemon still running 20 s after the
    /// unmount (a loaded machine writing its state) gets SIGTERM, then SIGKILL.
    pub fn stop(&mut self) {
        if self.child.is_some() {
            unmount(&self.mnt);
        }
        let Some(mut c) = self.child.take() else {
            return;
        };
        let t0 = Instant::now();
        loop {
            match c.try_wait() {
                Ok(Some(_)) => return,
                Ok(None) if t0.elapsed() < Duration::from_secs(20) => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                _ => break,
            }
        }
        if let Ok(pid) = i32::try_from(c.id()) {
            // SAFETY: kill(2) of our own child, by PID.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let t1 = Instant::now();
        while t1.elapsed() < Duration::from_secs(3) {
            if let Ok(Some(_)) = c.try_wait() {
                unmount(&self.mnt);
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = c.kill();
        let _ = c.wait();
        unmount(&self.mnt);
    }
}

impl Drop for ChildMount {
    fn drop(&mut self) {
        self.stop();
    }
}
