//! Credentials of the process behind a request: uid and gid come in the request header,
//! supplementary groups from `/proc/PID/status`, read for every request that needs them.
//!
//! The kernel's request carries the requesting thread's id, fs uid and fs gid, not its groups.
//! While the request is in flight the caller is blocked in its syscall, so its status file
//! names its groups as they are now. Nothing is reused across requests: a process that drops a
//! group with setgroups(2) acts without it from its next request on, and a reused pid never
//! gets a former process's groups. The status file must also show the header's fs uid and fs
//! gid (it may not if the caller died and its pid was reused before the read); otherwise the
//! request gets no supplementary groups. Reading it costs a few microseconds per request.

use dircache_core::Cred;

/// Reads a request's supplementary groups (module docs).
#[derive(Default)]
pub struct RequestGroups;

/// The fourth field (the fs id) of a `Uid:` or `Gid:` line of a `/proc/PID/status` file.
fn fs_id(status: &str, key: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))?
        .split_whitespace()
        .nth(3)?
        .parse()
        .ok()
}

/// Parse the `Groups:` line of a `/proc/PID/status` file.
pub fn parse_groups(status: &str) -> Vec<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|rest| {
            rest.split_whitespace()
                .filter_map(|g| g.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The groups in `status` when it is the status of a thread with fs uid `uid` and fs gid
/// `gid`; none otherwise.
fn groups_of(status: &str, uid: u32, gid: u32) -> Vec<u32> {
    if fs_id(status, "Uid:") == Some(uid) && fs_id(status, "Gid:") == Some(gid) {
        parse_groups(status)
    } else {
        Vec::new()
    }
}

/// The bytes of `/proc/PID/status` (not necessarily UTF-8: the `Name:` line is the task's
/// name as set). One read into a buffer that holds a usual status file, and one at its end.
fn read_status(pid: u32) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut f = std::fs::File::open(format!("/proc/{pid}/status")).ok()?;
    let mut buf = Vec::with_capacity(4096);
    f.read_to_end(&mut buf).ok()?;
    Some(buf)
}

impl RequestGroups {
    /// The credentials of thread `pid` running as `uid`/`gid` (the request header's).
    pub fn cred(&self, pid: u32, uid: u32, gid: u32) -> Cred {
        if pid == 0 {
            return Cred::new(uid, gid, []);
        }
        let groups = read_status(pid)
            .map(|s| groups_of(&String::from_utf8_lossy(&s), uid, gid))
            .unwrap_or_default();
        Cred::new(uid, gid, groups)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_groups_line() {
        let s = "Name:\tbash\nUid:\t0\t0\t0\t0\nGroups:\t4 24 27 \nNgid:\t0\n";
        assert_eq!(parse_groups(s), vec![4, 24, 27]);
        assert_eq!(parse_groups("Groups:\t\n"), Vec::<u32>::new());
        assert_eq!(parse_groups("Name: x\n"), Vec::<u32>::new());
    }

    #[test]
    fn groups_only_for_the_headers_fs_ids() {
        let s = "Uid:\t1000\t1000\t1000\t1001\nGid:\t50\t50\t50\t51\nGroups:\t4 24\n";
        assert_eq!(groups_of(s, 1001, 51), vec![4, 24]);
        assert_eq!(groups_of(s, 1000, 51), Vec::<u32>::new());
        assert_eq!(groups_of(s, 1001, 50), Vec::<u32>::new());
        assert_eq!(groups_of("Groups:\t4\n", 0, 0), Vec::<u32>::new());
    }

    #[test]
    fn own_process_groups() {
        let c = RequestGroups;
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
}
