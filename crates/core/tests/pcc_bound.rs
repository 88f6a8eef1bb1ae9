//! The prefix-check caches of all credentials together stay within a small bound, however many
//! credentials call (`Config::pcc_budget`, pcc.rs): any local user can make a daemon check
//! requests under many uids and group sets, and each checked credential used to get a 512 KiB
//! table up front (1,024 of them kept: 512 MiB).
//!
//! Measured two ways: the heap itself (a counting global allocator: live bytes after each new
//! credential, against the same cache before the churn), and the cache's own accounting.
//! Credentials evicted to stay within the bound still get exactly the backend's answers: users
//! with private directories check their own (granted) and each other's (EACCES) between the
//! churn, so a prefix-check result can never outlive its credential into another one's.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Arc;

use dircache_core::memory::MemoryBackend;
use dircache_core::{At, Backend, Cache, Config, Cred, Error, LookupFlags};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to the system allocator, only counting the bytes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        LIVE.fetch_add(n as isize - l.size() as isize, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static A: Counting = Counting;

/// The heap is counted for the whole process: the tests take turns.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The default bound on all prefix-check caches together.
const PCC_BOUND: isize = 4 << 20;
/// What else each kept credential may cost (its state, its group list, its slot in the map:
/// at most 1,024 are kept), and the maps' own growth.
const OTHER: isize = 1 << 20;

const PRIVATE_USERS: u32 = 6;
const DIRS: usize = 40;
const FILES: usize = 50;

fn file(i: usize) -> String {
    format!("pub/d{:02}/f{:02}", (i / FILES) % DIRS, i % FILES)
}

fn stat(c: &Cache, cred: &dircache_core::Creds, p: &str) -> Result<(), Error> {
    c.stat(cred, At::Root, p.as_bytes(), LookupFlags::FOLLOW)
        .map(drop)
}

/// Every private user reaches its own file and none of the others'.
fn check_private(c: &Cache, round: usize) {
    let hits = c.stats().fastpath_hits;
    for u in 1..=PRIVATE_USERS {
        let me = c.credentials(Cred::new(u, u, []));
        for v in 1..=PRIVATE_USERS {
            let p = format!("home/u{v}/secret");
            // Twice: the second one may come from the fast path.
            for _ in 0..2 {
                let r = stat(c, &me, &p);
                if u == v {
                    assert!(r.is_ok(), "round {round}: uid {u} on its own {p}: {r:?}");
                } else {
                    assert!(
                        matches!(r, Err(Error::Access)),
                        "round {round}: uid {u} on {p} (0700, uid {v}): {r:?}"
                    );
                }
            }
        }
    }
    // Each own file's second lookup: the prefix-check cache works after evictions too.
    let fast = c.stats().fastpath_hits - hits;
    assert!(
        fast >= u64::from(PRIVATE_USERS),
        "round {round}: {fast} fast-path hits"
    );
}

/// The tree both tests walk: a private 0700 home with a 0600 secret per user, and the
/// shared files.
fn tree() -> Arc<MemoryBackend> {
    let m = Arc::new(MemoryBackend::new());
    let root = Cred::root();
    m.mkdir(&root, b"home", 0o777).expect("home");
    for u in 1..=PRIVATE_USERS {
        let me = Cred::new(u, u, []);
        let d = format!("home/u{u}");
        m.mkdir(&me, d.as_bytes(), 0o700).expect("private dir");
        m.mknod(
            &me,
            format!("{d}/secret").as_bytes(),
            libc::S_IFREG | 0o600,
            0,
        )
        .expect("secret");
    }
    let spec: Vec<String> = (0..DIRS * FILES).map(file).collect();
    let spec: Vec<&str> = spec.iter().map(String::as_str).collect();
    m.populate(&spec);
    m
}

#[test]
fn many_credentials_stay_within_the_bound_and_get_correct_answers() {
    let _turn = one_at_a_time();
    let m = tree();
    let c = Cache::new(m.clone(), Config::default()).expect("cache");

    // Every dentry and direct-lookup entry the churn will use, made up front.
    let r = c.credentials(Cred::root());
    for i in 0..DIRS * FILES {
        stat(&c, &r, &file(i)).expect("warm");
    }
    check_private(&c, 0);
    drop(r);
    let base = LIVE.load(Ordering::Relaxed);
    assert_eq!(Config::default().pcc_budget, PCC_BOUND as usize);

    let mut peak = 0;
    let mut peak_pcc = 0;
    // Some are held throughout (as by requests in flight): those cannot be evicted.
    let mut held = Vec::new();
    for i in 0..3000usize {
        let id = 100_000 + i as u32;
        // Distinct users and distinct group sets.
        let cred = Cred::new(id, id, [id, 7, (i % 13) as u32]);
        let cs = c.credentials(cred);
        // Most walk 100 files; every tenth walks all 2,000 (its cache wants to grow).
        let n = if i % 10 == 0 { DIRS * FILES } else { 100 };
        for k in 0..n {
            stat(&c, &cs, &file(i * 7 + k)).expect("public file");
        }
        if i % 60 == 0 {
            held.push(cs);
        } else {
            drop(cs);
        }
        let pcc = c.stats().pcc_bytes;
        peak_pcc = peak_pcc.max(pcc);
        assert!(
            pcc <= PCC_BOUND as u64,
            "after {} credentials the prefix-check caches hold {pcc} bytes",
            i + 1
        );
        let live = LIVE.load(Ordering::Relaxed) - base;
        peak = peak.max(live);
        assert!(
            live <= PCC_BOUND + OTHER,
            "after {} credentials the cache holds {live} more bytes than before them (bound \
             {PCC_BOUND} + {OTHER})",
            i + 1
        );
        if i % 250 == 249 {
            check_private(&c, i + 1);
        }
    }
    check_private(&c, 3000);
    eprintln!("peak {peak} bytes above the warm cache, prefix-check caches {peak_pcc}");
    assert!(
        peak_pcc > PCC_BOUND as u64 * 3 / 4,
        "the bound was never approached: eviction untested"
    );
}

/// The same from four threads at once (credentials created, grown and evicted while others
/// are used): the accounting never exceeds the bound and every answer stays the backend's.
#[test]
fn concurrent_churn_stays_within_the_bound() {
    let _turn = one_at_a_time();
    let m = tree();
    // A small budget, so that the threads evict each other's credentials all the time.
    let budget = 256 << 10;
    let c = Cache::new(
        m.clone(),
        Config {
            pcc_budget: budget,
            ..Config::default()
        },
    )
    .expect("cache");
    std::thread::scope(|s| {
        for t in 0..4u32 {
            let c = &c;
            s.spawn(move || {
                for i in 0..400u32 {
                    let id = 200_000 + t * 10_000 + i;
                    let cs = c.credentials(Cred::new(id, id, [id]));
                    let n = if i % 10 == 0 { 1000 } else { 60 };
                    for k in 0..n {
                        stat(c, &cs, &file((i * 13 + k) as usize)).expect("public file");
                    }
                    let pcc = c.stats().pcc_bytes;
                    assert!(
                        pcc <= budget as u64,
                        "thread {t}: {pcc} bytes of PCC tables"
                    );
                    // A private user now and then, from every thread.
                    let u = 1 + (i + t) % PRIVATE_USERS;
                    let me = c.credentials(Cred::new(u, u, []));
                    for v in 1..=PRIVATE_USERS {
                        let r = stat(c, &me, &format!("home/u{v}/secret"));
                        assert_eq!(r.is_ok(), u == v, "thread {t}: uid {u} on u{v}: {r:?}");
                        if u != v {
                            assert!(matches!(r, Err(Error::Access)), "uid {u} on u{v}: {r:?}");
                        }
                    }
                }
            });
        }
    });
    assert!(c.stats().pcc_bytes <= budget as u64);
    check_private(&c, 0);
}
