//! Where a mount daemon's log goes, and the tracing subscriber of every command.
//!
//! A background mount logs to a file: `-o log=PATH`, else `/var/log/dircache/NAME.log` for
//! root and `$XDG_STATE_HOME/dircache/NAME.log` (`~/.local/state/...`) for other users, NAME
//! being the mount point's path with `/` turned into `-` (`/mnt/data` → `mnt-data`). Started by
//! systemd (a mount unit or a service: `JOURNAL_STREAM` is set) and without `-o log=`, it
//! keeps its stderr, which is the journal. The file is opened (appending, mode 0600, its
//! directory 0700 if created) before the daemon forks, so a log that cannot be written is an
//! error at the command line; the daemon then writes its standard error there too (panics
//! included). `-o debug` logs every FUSE request (level debug); `DIRCACHE_LOG` (an env-filter
//! directive such as `dircache_fuse=trace`) overrides the level in every case.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use anyhow::Context;

/// The subscriber for everything: stderr, level from `DIRCACHE_LOG`, else `default`.
pub fn init(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("DIRCACHE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}

/// The default level of a command that is not a background mount (today's behaviour: errors
/// only, unless `DIRCACHE_LOG` says more).
pub const QUIET: &str = "error";

/// A background daemon's log file, opened before the fork.
pub struct LogFile {
    pub path: PathBuf,
    file: File,
}

/// `NAME` of the default log file for mount point `mnt`.
fn log_name(mnt: &Path) -> String {
    let s = mnt.to_string_lossy();
    let s = s.trim_matches('/');
    if s.is_empty() {
        "root".to_string()
    } else {
        s.replace('/', "-")
    }
}

/// The default log directory of this user, if there is one.
fn default_dir() -> Option<PathBuf> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return Some(PathBuf::from("/var/log/dircache"));
    }
    let state = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| {
            std::env::var_os("HOME")
                .map(PathBuf::from)
                .filter(|p| p.is_absolute())
                .map(|h| h.join(".local/state"))
        })?;
    Some(state.join("dircache"))
}

/// The log of a background mount at `mnt` (absolute): `explicit` (`-o log=`), else the
/// journal (None) when systemd started us, else the default file.
pub fn open(explicit: Option<&Path>, mnt: &Path) -> anyhow::Result<Option<LogFile>> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let path = match explicit {
        Some(p) => p.to_path_buf(),
        None if std::env::var_os("JOURNAL_STREAM").is_some() => return Ok(None),
        None => match default_dir() {
            Some(d) => d.join(format!("{}.log", log_name(mnt))),
            None => anyhow::bail!("no place for the daemon's log (no HOME): give -o log=PATH"),
        },
    };
    if let Some(dir) = path.parent() {
        if !dir.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .with_context(|| format!("creating the log directory {}", dir.display()))?;
        }
    }
    let file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(&path)
        .with_context(|| format!("opening the log {}", path.display()))?;
    Ok(Some(LogFile { path, file }))
}

impl LogFile {
    /// Makes the log this process's standard error (in the daemon, after the fork).
    pub fn redirect_stderr(&self) {
        // SAFETY: dup2 of an open descriptor onto the standard error this process owns.
        unsafe { libc::dup2(self.file.as_raw_fd(), 2) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_names() {
        assert_eq!(log_name(Path::new("/mnt/data")), "mnt-data");
        assert_eq!(log_name(Path::new("/")), "root");
        assert_eq!(log_name(Path::new("/srv/a b/")), "srv-a b");
    }
}
