//! Credentials of the process behind a request: uid and gid come in the request header,
//! supplementary groups from `/proc/PID/status`, read for every request that needs them.
//!
//! The kernel's request carries the requesting thread's id, fs uid and fs gid, not its groups.
//! While the request is in flight the caller is blocked in its syscall, so its status file
//! names its groups as they are now. Nothing is reused across requests: a process that drops a
//! group with setgroups(2) acts without it from its next request on, and a reused pid never
//! gets a former process's groups. The status file must also show the header's fs uid and fs
//! gid (it may not if the caller died and its pid was reused before the read); otherwise the
//! request gets no supplementary groups.
//!
//! The descriptor of a pid's status file is kept (a few per daemon, [`KEPT_STATUS_FILES`]) and
//! read again from offset 0 for its next request: procfs generates the text afresh at every
//! read from offset 0, so what is read is always the thread's state at that moment, and the
//! descriptor stays bound to the task it was opened for (`struct pid`): once that task has
//! exited every read fails with ESRCH, also after its pid was reused, and the pid's file is
//! opened again (then naming the new task). One `pread` instead of open, fstat, lseek, two
//! reads and close: the open of a cached file (OPEN) spent about half of its time in the
//! daemon here (docs/opens.md, "The cost of each request").

use std::collections::HashMap;
use std::fs::File;
use std::sync::Arc;

use dircache_core::Cred;
use parking_lot::Mutex;

/// How many status descriptors (one per recent caller thread) are kept.
pub const KEPT_STATUS_FILES: usize = 64;

/// Reads a request's supplementary groups (module docs).
#[derive(Default)]
pub struct RequestGroups {
    /// Open `/proc/PID/status` files of recent callers, by pid.
    kept: Mutex<HashMap<u32, Arc<File>>>,
}

/// The numbers in `field` (whitespace-separated decimal ids).
fn ids(field: &[u8]) -> impl Iterator<Item = Option<u32>> + '_ {
    field
        .split(|b| b.is_ascii_whitespace())
        .filter(|w| !w.is_empty())
        .map(|w| std::str::from_utf8(w).ok()?.parse().ok())
}

/// The groups in the text of a `/proc/PID/status` file when it is the status of a thread with
/// fs uid `uid` and fs gid `gid` (the fourth id of its `Uid:` and `Gid:` lines); none
/// otherwise. One pass over the bytes, up to the `Groups:` line.
fn groups_of(status: &[u8], uid: u32, gid: u32) -> Vec<u32> {
    let (mut fsuid, mut fsgid) = (None, None);
    for line in status.split(|&b| b == b'\n') {
        if let Some(r) = line.strip_prefix(b"Uid:") {
            fsuid = ids(r).nth(3).flatten();
        } else if let Some(r) = line.strip_prefix(b"Gid:") {
            fsgid = ids(r).nth(3).flatten();
        } else if let Some(r) = line.strip_prefix(b"Groups:") {
            if fsuid != Some(uid) || fsgid != Some(gid) {
                return Vec::new();
            }
            return ids(r).flatten().collect();
        }
    }
    Vec::new()
}

/// Whether `buf` holds a whole `Groups:` line (the last line [`groups_of`] needs: `Uid:` and
/// `Gid:` come before it).
fn has_groups_line(buf: &[u8]) -> bool {
    buf.windows(8)
        .position(|w| w == b"Groups:\t" || w == b"Groups: ")
        .is_some_and(|at| buf[at..].contains(&b'\n'))
}

/// The text of the status file `f` now: read from offset 0 (which makes procfs generate it
/// afresh) up to the end of its `Groups:` line or the end of the file.
fn read_status_at(f: &File) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; 4096];
    let mut len = 0;
    loop {
        if len == buf.len() {
            buf.resize(len * 2, 0);
        }
        let n = f.read_at(&mut buf[len..], len as u64)?;
        len += n;
        if n == 0 || has_groups_line(&buf[..len]) {
            buf.truncate(len);
            return Ok(buf);
        }
    }
}

impl RequestGroups {
    /// The status text of thread `pid` now, through a kept descriptor when there is one that
    /// still names a live task, else a newly opened (and then kept) one.
    fn status(&self, pid: u32) -> Option<Vec<u8>> {
        let kept = self.kept.lock().get(&pid).cloned();
        if let Some(f) = kept {
            match read_status_at(&f) {
                Ok(s) => return Some(s),
                // ESRCH: the task it was opened for has exited (its pid may name another
                // one now).
                Err(_) => {
                    let mut m = self.kept.lock();
                    if m.get(&pid).is_some_and(|k| Arc::ptr_eq(k, &f)) {
                        m.remove(&pid);
                    }
                }
            }
        }
        let f = Arc::new(File::open(format!("/proc/{pid}/status")).ok()?);
        let s = read_status_at(&f).ok()?;
        let mut m = self.kept.lock();
        if m.len() >= KEPT_STATUS_FILES && !m.contains_key(&pid) {
            // Forget one (callers come and go; any will do).
            if let Some(k) = m.keys().next().copied() {
                m.remove(&k);
            }
        }
        m.insert(pid, f);
        Some(s)
    }

    /// The credentials of thread `pid` running as `uid`/`gid` (the request header's).
    pub fn cred(&self, pid: u32, uid: u32, gid: u32) -> Cred {
        if pid == 0 {
            return Cred::new(uid, gid, []);
        }
        let groups = self
            .status(pid)
            .map(|s| groups_of(&s, uid, gid))
            .unwrap_or_default();
        Cred::new(uid, gid, groups)
    }

    /// How many status descriptors are kept now.
    #[cfg(test)]
    fn kept(&self) -> usize {
        self.kept.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_groups_line() {
        let s = b"Name:\tbash\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nGroups:\t4 24 27 \nNgid:\t0\n";
        assert_eq!(groups_of(s, 0, 0), vec![4, 24, 27]);
        assert_eq!(
            groups_of(b"Uid:\t0 0 0 0\nGid:\t0 0 0 0\nGroups:\t\n", 0, 0),
            Vec::<u32>::new()
        );
        assert_eq!(groups_of(b"Name: x\n", 0, 0), Vec::<u32>::new());
        // A name that is not UTF-8 does not matter.
        assert_eq!(
            groups_of(
                b"Name:\t\xff\nUid:\t0 0 0 0\nGid:\t0 0 0 0\nGroups:\t5\n",
                0,
                0
            ),
            vec![5]
        );
    }

    #[test]
    fn groups_only_for_the_headers_fs_ids() {
        let s = b"Uid:\t1000\t1000\t1000\t1001\nGid:\t50\t50\t50\t51\nGroups:\t4 24\n";
        assert_eq!(groups_of(s, 1001, 51), vec![4, 24]);
        assert_eq!(groups_of(s, 1000, 51), Vec::<u32>::new());
        assert_eq!(groups_of(s, 1001, 50), Vec::<u32>::new());
        assert_eq!(groups_of(b"Groups:\t4\n", 0, 0), Vec::<u32>::new());
    }

    #[test]
    fn own_process_groups() {
        let c = RequestGroups::default();
        // SAFETY: getuid/getgid/getpid have no preconditions.
        let (uid, gid, pid) = unsafe { (libc::getuid(), libc::getgid(), libc::getpid()) };
        let cred = c.cred(pid as u32, uid, gid);
        assert_eq!(cred.uid, uid);
        let mut mine = rustix::process::getgroups()
            .unwrap_or_default()
            .into_iter()
            .map(|g| g.as_raw())
            .collect::<Vec<_>>();
        mine.sort_unstable();
        let mut got = cred.groups().to_vec();
        got.sort_unstable();
        assert_eq!(got, mine);
        let again = c.cred(pid as u32, uid, gid);
        assert_eq!(cred, again);
    }

    /// A thread that changes its groups between two requests is seen with its groups of the
    /// moment at each (the kept descriptor is read afresh), and a thread that has exited gets
    /// no groups and loses its kept descriptor.
    #[test]
    fn kept_status_is_read_afresh_and_dropped_when_the_thread_exits() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let c = RequestGroups::default();
        let (ask, asked) = std::sync::mpsc::channel::<Vec<u32>>();
        let (tell, told) = std::sync::mpsc::channel::<u32>();
        let t = std::thread::spawn(move || {
            while let Ok(g) = asked.recv() {
                // SAFETY: a live slice of gid_t; the raw syscall changes this thread only.
                let r = unsafe { libc::syscall(libc::SYS_setgroups, g.len(), g.as_ptr()) };
                assert_eq!(r, 0);
                // SAFETY: gettid has no preconditions.
                tell.send(unsafe { libc::gettid() } as u32).unwrap();
            }
        });
        ask.send(vec![4242, 4243]).unwrap();
        let tid = told.recv().unwrap();
        let mut g = c.cred(tid, 0, 0).groups().to_vec();
        g.sort_unstable();
        assert_eq!(g, vec![4242, 4243]);
        assert_eq!(c.kept(), 1);
        ask.send(vec![4343]).unwrap();
        assert_eq!(told.recv().unwrap(), tid);
        assert_eq!(c.cred(tid, 0, 0).groups(), &[4343]);
        assert_eq!(c.kept(), 1);
        // Not for other fs ids.
        assert!(c.cred(tid, 1, 0).groups().is_empty());
        drop(ask);
        t.join().unwrap();
        // `join` returns once the kernel cleared the thread's tid, which comes before the
        // thread is reaped: until then its status (and groups) can still be read. Bounded.
        let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while c.cred(tid, 0, 0).groups().contains(&4343) {
            assert!(
                std::time::Instant::now() < end,
                "an exited thread's groups still given after 10 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    #[test]
    fn groups_line_found_only_when_whole() {
        assert!(has_groups_line(b"Uid:\t0\nGroups:\t1 2\nNgid:"));
        assert!(!has_groups_line(b"Uid:\t0\nGroups:\t1 2"));
        assert!(!has_groups_line(b"Uid:\t0\n"));
    }
}
