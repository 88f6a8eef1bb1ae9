//! `-o sched=` (crate::sched): the request threads, and only they, run with the scheduling
//! asked for; requests are still served. One test in its own binary: the mounts' threads are
//! found among this process's threads by name (`fuser-N`), so no other test's mount may run
//! beside it.

mod common;
use common::*;

use dircache_fuse::sched::RequestSched;

/// `(name, nice, rt_priority, policy)` of each thread of this process.
fn threads() -> Vec<(String, i64, u64, u64)> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc/self/task").unwrap() {
        let p = e.unwrap().path();
        let Ok(stat) = std::fs::read_to_string(p.join("stat")) else {
            continue; // exited meanwhile
        };
        let name = std::fs::read_to_string(p.join("comm"))
            .unwrap_or_default()
            .trim()
            .to_string();
        // "tid (comm) S f4 ...": field N (1-based) is index N-3 after the last ')'.
        let rest: Vec<&str> = stat
            .rsplit_once(')')
            .unwrap()
            .1
            .split_whitespace()
            .collect();
        let nice = rest[19 - 3].parse().unwrap();
        let rt_priority = rest[40 - 3].parse().unwrap();
        let policy = rest[41 - 3].parse().unwrap();
        v.push((name, nice, rt_priority, policy));
    }
    v
}

fn is_request_thread(name: &str) -> bool {
    name.strip_prefix("fuser-")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        || name.starts_with("fuser-uring-")
}

/// Mount with `sched`, serve a request, and return the threads' scheduling.
fn mounted_threads(sched: RequestSched) -> Vec<(String, i64, u64, u64)> {
    let policy = dircache_fuse::CachePolicy {
        request_sched: sched,
        threads: 3,
        ..Default::default()
    };
    let t = TestMount::with_policy(policy);
    std::fs::write(t.s("f"), b"served").unwrap();
    assert_eq!(std::fs::read(t.m("f")).unwrap(), b"served");
    let v = threads();
    drop(t);
    v
}

#[test]
fn request_threads_and_only_they_get_the_scheduling_asked_for() {
    if !can_mount() {
        return;
    }
    const SCHED_OTHER: u64 = 0;
    const SCHED_FIFO: u64 = 1;
    for (sched, want) in [
        (RequestSched::Fifo(3), (0, 3, SCHED_FIFO)),
        (RequestSched::Nice(7), (7, 0, SCHED_OTHER)),
        (RequestSched::Inherit, (0, 0, SCHED_OTHER)),
    ] {
        let v = mounted_threads(sched);
        let request: Vec<_> = v.iter().filter(|t| is_request_thread(&t.0)).collect();
        assert!(request.len() >= 3, "{sched:?}: request threads {v:?}");
        for (name, nice, prio, policy) in &request {
            assert_eq!(
                (*nice, *prio, *policy),
                want,
                "{sched:?}: request thread {name} has (nice, rt priority, policy) \
                 ({nice}, {prio}, {policy})"
            );
        }
        for (name, nice, prio, policy) in v.iter().filter(|t| !is_request_thread(&t.0)) {
            assert_eq!(
                (*nice, *prio, *policy),
                (0, 0, SCHED_OTHER),
                "{sched:?}: thread {name} is not a request thread but was changed"
            );
        }
    }
}
