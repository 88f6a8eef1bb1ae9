//! Credentials of the process behind a request: uid and gid come in the request header,
//! supplementary groups from `/proc/PID/status` (cached briefly per pid).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use dircache_core::Cred;
use parking_lot::Mutex;

/// How long the groups read for a pid are reused.
const GROUPS_TTL: Duration = Duration::from_secs(1);
/// Entries kept before the cache is swept.
const MAX_PIDS: usize = 4096;

/// Per pid: when read, uid, gid, supplementary groups.
type GroupsEntry = (Instant, u32, u32, Vec<u32>);

#[derive(Default)]
pub struct GroupsCache {
    map: Mutex<HashMap<u32, GroupsEntry>>,
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

impl GroupsCache {
    /// The credentials of `pid` running as `uid`/`gid`.
    pub fn cred(&self, pid: u32, uid: u32, gid: u32) -> Cred {
        if pid == 0 {
            return Cred::new(uid, gid, []);
        }
        let now = Instant::now();
        {
            let map = self.map.lock();
            if let Some((t, u, g, groups)) = map.get(&pid) {
                if *u == uid && *g == gid && now.duration_since(*t) < GROUPS_TTL {
                    return Cred::new(uid, gid, groups.iter().copied());
                }
            }
        }
        let groups = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .map(|s| parse_groups(&s))
            .unwrap_or_default();
        let mut map = self.map.lock();
        if map.len() >= MAX_PIDS {
            map.retain(|_, (t, ..)| now.duration_since(*t) < GROUPS_TTL);
        }
        map.insert(pid, (now, uid, gid, groups.clone()));
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
    fn own_process_groups() {
        let c = GroupsCache::default();
        // SAFETY: getuid/getgid/getpid have no preconditions.
        let (uid, gid, pid) = unsafe { (libc::getuid(), libc::getgid(), libc::getpid()) };
        let cred = c.cred(pid as u32, uid, gid);
        assert_eq!(cred.uid, uid);
        let again = c.cred(pid as u32, uid, gid);
        assert_eq!(cred, again);
    }
}
