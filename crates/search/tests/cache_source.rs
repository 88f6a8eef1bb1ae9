//! The same searches answered from a dircache `Cache` (over the local backend) and directly
//! from the file system give the same results.

mod common;

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use common::*;
use dircache_core::{Cache, Config, Cred};
use dircache_local::LocalBackend;
use dircache_search::{search, CacheSource, DirectSource, Flags, SearchRequest, Source};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn results<S: Source>(paths: &str, pat: &str, flags: Flags, src: Arc<S>) -> BTreeSet<String> {
    let req = SearchRequest::new(paths, pat, flags);
    search(&req, src)
        .unwrap_or_else(|e| panic!("{req:?}: {e}"))
        .map(|r| key(&r))
        .collect()
}

#[test]
fn cache_and_direct_agree_on_random_trees() {
    let mut rng = StdRng::seed_from_u64(0xcac4e);
    let is_root = rustix::process::geteuid().is_root();
    let mut compared = 0;
    for round in 0..6 {
        let t = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755))
            .unwrap_or_else(|e| panic!("{e}"));
        let nroots = rng.gen_range(1..3);
        for i in 0..nroots {
            let r = t.path().join(format!("r{i}"));
            std::fs::create_dir(&r).unwrap_or_else(|e| panic!("{e}"));
            let mut budget = 400;
            random_tree(&mut rng, &r, 5, &mut budget);
            deep_chain(&r, 110);
        }
        let backend = Arc::new(LocalBackend::new(t.path()).unwrap_or_else(|e| panic!("{e}")));
        let cache = Cache::new(backend, Config::default()).unwrap_or_else(|e| panic!("{e}"));
        let mut users = vec![Cred::root()];
        if is_root {
            users.push(Cred::new(1000, 1000, []));
        }
        for _ in 0..10 {
            let pat = random_pattern(&mut rng);
            for flags in [
                Flags::NONE,
                Flags::METADATA,
                Flags::X_OK,
                Flags::R_OK | Flags::W_OK,
            ] {
                for cred in &users {
                    let direct_src = if cred.uid == 0 {
                        DirectSource::new()
                    } else {
                        DirectSource::as_cred(cred.clone())
                    };
                    let dpaths: Vec<String> = (0..nroots)
                        .map(|i| t.path().join(format!("r{i}")).to_string_lossy().to_string())
                        .collect();
                    let cpaths: Vec<String> = (0..nroots).map(|i| format!("/r{i}")).collect();
                    let want = results(&dpaths.join(":"), &pat, flags, Arc::new(direct_src));
                    // Twice: cold (filled from the backend) and warm (complete directories).
                    for pass in ["cold", "warm"] {
                        let src = Arc::new(CacheSource::new(
                            cache.clone(),
                            cache.credentials(cred.clone()),
                        ));
                        let got = results(&cpaths.join(":"), &pat, flags, src);
                        assert_eq!(
                            got, want,
                            "round {round} {pass} pattern {pat:?} flags {flags:?} uid {}",
                            cred.uid
                        );
                        compared += got.len();
                    }
                }
            }
        }
    }
    assert!(compared > 1000, "only {compared} results compared");
}
