//! What the client accepts from a server (docs/security.md P13): the client trusts the server
//! for the contents of its tree, not for the shape of what it sends. Names in listings are
//! single components (not empty, not `.` or `..`, no `/`, no NUL), the directory paths of
//! `Subtree` listings and of callbacks are clean relative paths (such components joined by
//! `/`, or empty for the root), and one call brings at most
//! [`ClientConfig::max_call_entries`](super::ClientConfig::max_call_entries) directory
//! entries over all its frames. A server that breaks any of these is broken or hostile: the
//! connection is closed, as the server closes one on a malformed frame.

use std::collections::HashMap;

use dircache_core::DirEntry;

use crate::proto::{Callback, Reply, SubtreeDir};

/// Whether `name` is one path component.
pub(super) fn good_name(name: &[u8]) -> bool {
    !name.is_empty() && name != b"." && name != b".." && !name.contains(&b'/') && !name.contains(&0)
}

/// Whether `path` is a clean relative path (empty: the root).
pub(super) fn good_path(path: &[u8]) -> bool {
    path.is_empty() || path.split(|&b| b == b'/').all(good_name)
}

fn entries_ok(entries: &[DirEntry]) -> Result<u64, String> {
    match entries.iter().find(|e| !good_name(&e.name)) {
        Some(e) => Err(format!(
            "a listing holds the name {:?}",
            String::from_utf8_lossy(&e.name)
        )),
        None => Ok(entries.len() as u64),
    }
}

fn dirs_ok(dirs: &[SubtreeDir]) -> Result<u64, String> {
    let mut n = 0;
    for d in dirs {
        if !good_path(&d.dir) {
            return Err(format!(
                "a subtree listing of the path {:?}",
                String::from_utf8_lossy(&d.dir)
            ));
        }
        n += entries_ok(&d.entries)?;
    }
    Ok(n)
}

/// The directory entries a reply frame brings, or why it is refused.
pub(super) fn check_reply(body: &Result<Reply, i32>) -> Result<u64, String> {
    match body {
        Ok(r) => reply_entries(r),
        Err(_) => Ok(0),
    }
}

fn reply_entries(r: &Reply) -> Result<u64, String> {
    match r {
        Reply::Entries(e) => entries_ok(e),
        Reply::Subtree { dirs, .. } | Reply::Names(dirs) => dirs_ok(dirs),
        Reply::Parents { reply, .. } => reply_entries(reply),
        _ => Ok(0),
    }
}

/// Whether a callback names a clean path.
pub(super) fn check_callback(c: &Callback) -> Result<(), String> {
    match c {
        Callback::Attr(p) | Callback::Entry(p) if !good_path(p) => Err(format!(
            "a callback for the path {:?}",
            String::from_utf8_lossy(p)
        )),
        _ => Ok(()),
    }
}

/// Entries received per call still in flight (the reader thread's).
#[derive(Default)]
pub(super) struct CallEntries {
    by_call: HashMap<u64, u64>,
}

impl CallEntries {
    /// Count `n` entries for call `id` (`last`: its last frame); an error past `max`.
    pub(super) fn add(&mut self, id: u64, n: u64, last: bool, max: u64) -> Result<(), String> {
        let total = if n == 0 {
            self.by_call.get(&id).copied().unwrap_or(0)
        } else {
            let t = self.by_call.entry(id).or_default();
            *t = t.saturating_add(n);
            *t
        };
        if last {
            self.by_call.remove(&id);
        }
        if total > max {
            return Err(format!(
                "call {id} brought {total} entries, more than {max}"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_paths() {
        for bad in [&b""[..], b".", b"..", b"a/b", b"a\0b"] {
            assert!(!good_name(bad), "{bad:?}");
        }
        assert!(good_name(b"..."));
        assert!(good_path(b""));
        assert!(good_path(b"a/b/c"));
        for bad in [&b"/a"[..], b"a/", b"a//b", b"a/../b", b"./a", b"a/\0"] {
            assert!(!good_path(bad), "{bad:?}");
        }
    }

    #[test]
    fn entries_per_call_are_capped_and_forgotten_at_the_end() {
        let mut c = CallEntries::default();
        assert!(c.add(1, 60, false, 100).is_ok());
        assert!(c.add(2, 60, false, 100).is_ok());
        assert!(c.add(1, 60, false, 100).is_err());
        assert!(c.add(2, 40, true, 100).is_ok());
        assert!(!c.by_call.contains_key(&2));
    }
}
