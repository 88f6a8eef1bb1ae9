//! statfs answers kept for a short time (`-o statfs_timeout=SECS`).
//!
//! `find` and `du` (gnulib's fts) call fstatfs on the directory they start from to learn the
//! file system's type, and `df` asks for the free space: without this, each of those calls is
//! a round trip, and a warm `find` of an unchanged tree at 5 ms RTT spent 5 of its 11 ms
//! waiting for one. No callback can say when the answer changes (any write on the server's
//! file system, by anyone, moves the free counts), so an answer is reused for `ttl` from when
//! it came and asked again after that (a zero `ttl`: every call asks), as NFS clients keep
//! attributes for a time.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use dircache_core::{Result, StatFs};
use parking_lot::Mutex;

/// At most this many paths' answers are kept (then all are forgotten at once): a mount asks
/// for a few (the root, the directories `find` starts from).
const MAX_PATHS: usize = 256;

/// The recent statfs answers, by path.
pub(super) struct StatfsCache {
    ttl: Duration,
    by_path: Mutex<HashMap<Vec<u8>, (Instant, StatFs)>>,
}

impl StatfsCache {
    pub(super) fn new(ttl: Duration) -> StatfsCache {
        StatfsCache {
            ttl,
            by_path: Mutex::new(HashMap::new()),
        }
    }

    /// The answer for `path` if one came less than `ttl` ago, else `ask()`'s (kept when it
    /// is an answer, not an error).
    pub(super) fn get(&self, path: &[u8], ask: impl FnOnce() -> Result<StatFs>) -> Result<StatFs> {
        if self.ttl.is_zero() {
            return ask();
        }
        if let Some((at, s)) = self.by_path.lock().get(path) {
            if at.elapsed() < self.ttl {
                return Ok(*s);
            }
        }
        let asked = Instant::now();
        let s = ask()?;
        let mut m = self.by_path.lock();
        if m.len() >= MAX_PATHS && !m.contains_key(path) {
            m.clear();
        }
        // Aged from when it was asked: never kept past `ttl` after the server answered.
        m.insert(path.to_vec(), (asked, s));
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dircache_core::Error;

    fn fs(n: u64) -> StatFs {
        StatFs {
            blocks: n,
            bfree: n,
            bavail: n,
            files: n,
            ffree: n,
            bsize: 4096,
            namelen: 255,
            frsize: 4096,
        }
    }

    #[test]
    fn answers_are_reused_within_the_ttl_only() {
        let c = StatfsCache::new(Duration::from_millis(200));
        let mut asked = 0;
        for _ in 0..3 {
            let s = c
                .get(b"", || {
                    asked += 1;
                    Ok(fs(asked))
                })
                .unwrap();
            assert_eq!(s.blocks, 1);
        }
        assert_eq!(asked, 1);
        // Another path is asked for itself.
        assert_eq!(c.get(b"sub", || Ok(fs(7))).unwrap().blocks, 7);
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(c.get(b"", || Ok(fs(9))).unwrap().blocks, 9);
    }

    #[test]
    fn errors_are_not_kept_and_zero_ttl_always_asks() {
        let c = StatfsCache::new(Duration::from_secs(60));
        assert!(c.get(b"", || Err(Error::Os(libc::EIO))).is_err());
        assert_eq!(c.get(b"", || Ok(fs(2))).unwrap().blocks, 2);
        let z = StatfsCache::new(Duration::ZERO);
        assert_eq!(z.get(b"", || Ok(fs(1))).unwrap().blocks, 1);
        assert_eq!(z.get(b"", || Ok(fs(2))).unwrap().blocks, 2);
    }
}
