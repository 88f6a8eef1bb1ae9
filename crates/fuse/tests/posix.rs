//! POSIX behaviour through the mount, each check asserting the native file system's result:
//! the same Python script runs in a native directory and on the mount; outputs must match.

mod common;
use common::posix_checks::*;
use common::*;
use dircache_core::Backend;

#[test]
fn posix_checks_match_native() {
    if !can_mount() {
        return;
    }
    let t = TestMount::new();
    checks_match_native(&t);
    // And the files are really there in SRC.
    assert!(t.s("w/r3").exists());
}

/// The same checks on a mount of the in-memory backend: the front end reaches storage only
/// through the Backend trait.
#[test]
fn posix_checks_match_native_on_memory_backend() {
    if !can_mount() {
        return;
    }
    let t = TestMount::memory();
    checks_match_native(&t);
    // And the files are really there in the backend, with their data.
    let m = t.memory.as_ref().unwrap();
    assert_eq!(m.getattr(b"w/r3").unwrap().size, 1);
}

/// And with the daemon serving every read and write itself (no passthrough), and with every
/// kernel cache off, so that each call reaches the backend.
#[test]
fn posix_checks_match_native_on_memory_backend_uncached() {
    if !can_mount() {
        return;
    }
    let no_passthrough = dircache_fuse::CachePolicy {
        passthrough: false,
        ..Default::default()
    };
    for policy in [no_passthrough, dircache_fuse::CachePolicy::uncached()] {
        let t = TestMount::memory_with_policy(policy);
        checks_match_native(&t);
    }
}

#[test]
fn non_root_users_match_native() {
    if !can_mount() {
        return;
    }
    let t = TestMount::new();
    user_checks_match_native(&t);
    // Files were created as the caller in SRC too.
    let st = std::fs::metadata(t.s("w/mine")).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!((st.uid(), st.gid()), (1000, 1000));
}

#[test]
fn non_root_users_match_native_on_memory_backend() {
    if !can_mount() {
        return;
    }
    let t = TestMount::memory();
    user_checks_match_native(&t);
    let a = t.memory.as_ref().unwrap().getattr(b"w/mine").unwrap();
    assert_eq!((a.uid, a.gid), (1000, 1000));
}

/// chown(f, -1, -1) of the caller's own files, one of them set-user-ID, set-group-ID, ...:
/// the mode after each.
const CHOWN_NOTHING: &str = r#"
import os
for f, mode in [('u', 0o4755), ('g', 0o2755), ('l', 0o2745), ('n', 0o755), ('x', 0o6777)]:
    open(f, 'w').close()
    os.chmod(f, mode)
    os.chown(f, -1, -1)
    print(f, oct(os.stat(f).st_mode & 0o7777))
"#;

/// chown(f, -1, -1) (an empty SETATTR through FUSE, the same request the kernel sends to
/// drop set-id bits after a write) drops set-id bits as natively, for the owner and for
/// root, on a local and on a memory mount. (The local mount kept them: an empty SETATTR of
/// a set-id file was answered without a change.)
#[test]
fn chown_nothing_drops_set_id_bits_as_natively() {
    if !can_mount() {
        return;
    }
    let local = TestMount::new();
    let memory = TestMount::memory();
    let native = local.dir.path().join("native");
    std::fs::create_dir(&native).unwrap();
    for (sub, uid) in [("root", None), ("user", Some(1000))] {
        let dirs = [native.join(sub), local.m(sub), memory.m(sub)];
        for d in &dirs {
            std::fs::create_dir(d).unwrap();
            chmod(d, 0o777);
        }
        let want = py(&dirs[0], CHOWN_NOTHING, uid);
        assert!(want.contains("u 0o755"), "native oracle: {want}");
        assert_eq!(py(&dirs[1], CHOWN_NOTHING, uid), want, "local mount, {sub}");
        assert_eq!(
            py(&dirs[2], CHOWN_NOTHING, uid),
            want,
            "memory mount, {sub}"
        );
    }
}
