//! What the bulk-call tests (`bulk.rs`, `bulk_mutations.rs`) share: the caller's credentials,
//! every listing of a tree, and waiting for a bulk call to end.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use dircache_core::{Backend, Cred, DirEntry, FileType};
use dircache_remote::prefetch::join;
use dircache_remote::RemoteBackend;

/// The test's own credentials.
pub fn me() -> Cred {
    Cred::new(
        rustix::process::geteuid().as_raw(),
        rustix::process::getegid().as_raw(),
        [],
    )
}

/// Every listing at or below `top`, depth first as `find` lists: path -> `row` of each
/// entry, sorted by name.
pub fn listings<T>(
    b: &dyn Backend,
    top: &[u8],
    row: impl Fn(DirEntry) -> T,
) -> BTreeMap<Vec<u8>, Vec<T>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![top.to_vec()];
    while let Some(d) = stack.pop() {
        let mut l: Vec<(Vec<u8>, T)> = b
            .readdir(&d, true)
            .unwrap()
            .into_iter()
            .map(|e| {
                if e.kind == FileType::Directory {
                    stack.push(join(&d, &e.name));
                }
                (e.name.clone(), row(e))
            })
            .collect();
        l.sort_by(|a, b| a.0.cmp(&b.0));
        out.insert(d, l.into_iter().map(|(_, r)| r).collect());
    }
    out
}

/// Wait (at most 60 s) until no bulk call of `r` is in flight.
pub fn wait_for_bulk(r: &RemoteBackend) {
    let end = Instant::now() + Duration::from_secs(60);
    while r.bulk_in_flight() {
        assert!(Instant::now() < end, "the bulk call did not end");
        std::thread::sleep(Duration::from_millis(5));
    }
}
