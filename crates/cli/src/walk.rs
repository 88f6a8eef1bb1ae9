//! The walk of `dircache warm` and `dircache hoard`: directories of a mount listed in this
//! process as the calling user (the kernel checks every permission on the way, and every
//! request reaches the daemon with the caller's credentials), several at once. Every entry
//! is lstat'ed (not d_type alone: the kernel then holds its attributes, as `du` or `ls -l`
//! need them) and shown to a [`Visitor`]. The walk follows no symbolic link and stays on one
//! file system (like `find -xdev`): it lists only the subdirectories on device `dev`.

use std::fs::Metadata;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex};

/// What a walk reports, from its worker threads.
pub trait Visitor: Sync {
    /// An entry of a listed directory and its lstat (an entry removed meanwhile is left out).
    fn entry(&self, path: &Path, md: &Metadata);

    /// `dir` was listed (all its entries shown).
    fn listed(&self, _dir: &Path) {}

    /// `path` could not be listed or lstat'ed.
    fn error(&self, path: &Path, e: &std::io::Error);
}

/// Walk the directories `dirs` and their subdirectories on device `dev`, `jobs` directories
/// at once (at least one); returns when every directory has been listed.
pub fn walk(dirs: Vec<PathBuf>, dev: u64, jobs: usize, visitor: &impl Visitor) {
    let queue = Queue {
        state: Mutex::new((dirs, 0)),
        more: Condvar::new(),
    };
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| {
                while let Some(dir) = queue.next() {
                    let found = list(&dir, dev, visitor);
                    queue.done(found);
                }
            });
        }
    });
}

/// The directories to list (a stack) and how many are being listed.
struct Queue {
    state: Mutex<(Vec<PathBuf>, usize)>,
    more: Condvar,
}

impl Queue {
    /// Next directory to list, or `None` when all are done.
    fn next(&self) -> Option<PathBuf> {
        let mut q = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(p) = q.0.pop() {
                q.1 += 1;
                return Some(p);
            }
            if q.1 == 0 {
                return None;
            }
            q = self.more.wait(q).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// A directory listed: its subdirectories `found` are to be listed.
    fn done(&self, found: Vec<PathBuf>) {
        let mut q = self.state.lock().unwrap_or_else(|e| e.into_inner());
        q.1 -= 1;
        q.0.extend(found);
        self.more.notify_all();
    }
}

/// List `dir` and lstat each entry; returns its subdirectories on device `dev`.
fn list(dir: &Path, dev: u64, visitor: &impl Visitor) -> Vec<PathBuf> {
    use std::os::unix::fs::MetadataExt;

    let mut sub = Vec::new();
    let rd = match std::fs::read_dir(dir) {
        Ok(r) => r,
        Err(e) => {
            visitor.error(dir, &e);
            return sub;
        }
    };
    for ent in rd {
        let ent = match ent {
            Ok(e) => e,
            Err(e) => {
                visitor.error(dir, &e);
                break;
            }
        };
        let p = ent.path();
        match std::fs::symlink_metadata(&p) {
            Ok(md) => {
                visitor.entry(&p, &md);
                if md.is_dir() && md.dev() == dev {
                    sub.push(p);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {} // removed meanwhile
            Err(e) => visitor.error(&p, &e),
        }
    }
    visitor.listed(dir);
    sub
}
