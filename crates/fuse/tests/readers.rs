//! Request threads and `/dev/fuse` (issue 9). By default every request thread reads; with
//! `-o readers=leader` one thread reads at a time (leader/follower, vendored fuser's
//! `src/lf.rs`) and keeps serving requests answered from the cache; before a backend call it
//! hands reading to another thread; with `-o readers=lazy` it does so only if a request is
//! waiting then (else a standby follower steps in after 10 ms). These tests hold a backend LOOKUP and check what else the
//! mount still serves meanwhile.

mod common;
use common::posix_checks::*;
use common::*;

use std::time::Duration;

use common::gated::GatedMount;

/// Mount the gated backend with `policy` and time a cached `stat` while a LOOKUP is held
/// (`common/gated.rs`).
fn cached_stat_while_lookup_blocks(
    policy: dircache_fuse::CachePolicy,
    within: Duration,
) -> Option<Duration> {
    GatedMount::new(policy).cached_stat_while_lookup_blocks(within, None)
}

/// No listing made on a second LOOKUP miss: `d/slow` must be a backend LOOKUP. Over
/// `/dev/fuse` whatever `enable_uring` says (the ring is `io_uring.rs`'s).
fn no_lookahead(p: dircache_fuse::CachePolicy) -> dircache_fuse::CachePolicy {
    dircache_fuse::CachePolicy {
        lookahead: false,
        io_uring: false,
        ..p
    }
}

/// Leader/follower reading (`-o readers=leader`, four threads): a LOOKUP blocked in the
/// backend does not hold up another caller's stat of a cached file. Fails if reading were
/// serialised behind the blocked request (as with one thread, below): it did fail, after
/// 20 s, before the hand-off before backend calls (`dircache_core::set_before_backend_call`).
#[test]
fn leader_hands_reading_on_before_a_blocking_lookup() {
    if !can_mount() {
        return;
    }
    let policy = dircache_fuse::CachePolicy {
        leader_follower: true,
        ..no_lookahead(Default::default())
    };
    assert!(policy.threads > 1);
    let took = cached_stat_while_lookup_blocks(policy, Duration::from_secs(20));
    assert!(
        took.is_some(),
        "a cached stat waited for a LOOKUP blocked in the backend: reading is serialised"
    );
}

/// Lazy hand-off (`-o readers=lazy`): the leader keeps leading into the blocked LOOKUP (no
/// request waited when it went in), so the cached stat that comes after it is served only
/// once the standby follower finds the leader in that call for 10 ms (it looks every 20 ms)
/// and lets every follower read (a burst). With two LOOKUPs held, the second one is read
/// that way and the stat by another follower of the burst. Without the standby (its
/// takeover time set to an hour) the stat waited for the gate, as with one thread (below):
/// "round 0: a cached stat waited for 1 LOOKUP(s) blocked in the backend".
#[test]
fn lazy_leader_lets_followers_read_while_it_blocks() {
    if !can_mount() {
        return;
    }
    let policy = dircache_fuse::CachePolicy {
        leader_follower: true,
        lazy_handoff: true,
        ..no_lookahead(Default::default())
    };
    for round in 0..4 {
        let held = 1 + round % 2;
        let took = GatedMount::new(policy.clone()).cached_stat_while_lookups_block(
            held,
            Duration::from_secs(20),
            None,
        );
        assert!(
            took.is_some(),
            "round {round}: a cached stat waited for {held} LOOKUP(s) blocked in the backend"
        );
    }
}

/// The same with the default: every thread reads (`-o readers=all`).
#[test]
fn blocked_backend_lookup_does_not_stop_cached_stat() {
    if !can_mount() {
        return;
    }
    let policy = no_lookahead(dircache_fuse::CachePolicy::default());
    assert!(!policy.leader_follower && policy.threads > 1);
    let took = cached_stat_while_lookup_blocks(policy, Duration::from_secs(20));
    assert!(took.is_some(), "a cached stat waited for a blocked LOOKUP");
}

/// The check above can fail: with one request thread the cached stat waits for the blocked
/// LOOKUP (it is not answered within 2 s while the gate is closed).
#[test]
fn one_thread_serialises_behind_a_blocked_lookup() {
    if !can_mount() {
        return;
    }
    let policy = dircache_fuse::CachePolicy {
        threads: 1,
        ..no_lookahead(Default::default())
    };
    let took = cached_stat_while_lookup_blocks(policy, Duration::from_secs(2));
    assert_eq!(
        took, None,
        "one thread served a stat while blocked elsewhere"
    );
}

/// `posix.rs`'s checks (as root and as uid 1000) give the native results with
/// `-o readers=leader`, also polling for the next request (`-o spin=50`), and with
/// `-o readers=lazy`.
#[test]
fn posix_checks_match_native_with_one_reader_at_a_time() {
    if !can_mount() {
        return;
    }
    for (spin_us, lazy_handoff) in [(0, false), (50, false), (0, true)] {
        let policy = dircache_fuse::CachePolicy {
            leader_follower: true,
            lazy_handoff,
            spin_us,
            io_uring: false,
            ..Default::default()
        };
        let t = TestMount::with_policy(policy.clone());
        checks_match_native(&t);
        user_checks_match_native(&TestMount::with_policy(policy));
    }
}
