//! Delegation: a search whose roots lie in a mount whose root names a daemon socket (extended
//! attribute `user.dircache.socket`) is sent to that daemon in one request; the results equal
//! a local search. The "mount" is a tmpfs (needs root) and the daemon is
//! `proto::serve_directory` on a thread, standing in for the FUSE daemon; the clients are
//! configured to trust tmpfs mounts ([`tmpfs_trusted`]) since a real client trusts only
//! `fuse.dircache` mounts (crates/fuse/tests/control.rs tests that with the real daemon).

mod common;

use std::collections::BTreeSet;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::*;
use dircache_search::proto::{
    self, delegate_inline, delegate_with, find_daemon_with, Delegation, SOCKET_XATTR,
};
use dircache_search::{
    search, search_with, ClientConfig, DirectSource, Flags, SearchOptions, SearchRequest,
    SearchStream,
};

fn tmpfs_trusted() -> ClientConfig {
    ClientConfig {
        fstype: "tmpfs".into(),
        ..Default::default()
    }
}

fn delegate(req: &SearchRequest) -> Result<Option<SearchStream>, dircache_search::SearchError> {
    Ok(match delegate_with(req, &tmpfs_trusted())? {
        Delegation::Taken(s) => Some(s),
        Delegation::Local(_) => None,
    })
}

fn find_daemon(p: &Path) -> Option<(PathBuf, PathBuf)> {
    find_daemon_with(p, &tmpfs_trusted()).map(|d| (d.root, d.socket))
}

/// A caller holding CAP_DAC_* searches by itself (a daemon never applies capabilities), so
/// the client side of these tests runs without them (this thread and the threads it starts);
/// they come back on drop.
struct NoDacCaps(rustix::thread::CapabilitySets);

fn drop_dac_caps() -> NoDacCaps {
    use rustix::thread::{capabilities, set_capabilities, CapabilitySet};
    let before = capabilities(None).unwrap_or_else(|e| panic!("{e}"));
    let mut c = before;
    c.effective -= CapabilitySet::DAC_OVERRIDE | CapabilitySet::DAC_READ_SEARCH;
    set_capabilities(None, c).unwrap_or_else(|e| panic!("{e}"));
    NoDacCaps(before)
}

impl Drop for NoDacCaps {
    fn drop(&mut self) {
        let _ = rustix::thread::set_capabilities(None, self.0);
    }
}

/// `proto::search_auto` trusting tmpfs mounts.
fn search_auto(req: &SearchRequest) -> Result<SearchStream, dircache_search::SearchError> {
    if let Some(s) = delegate(req)? {
        return Ok(s);
    }
    let opts = SearchOptions {
        delegate_mounts: true,
        client: tmpfs_trusted(),
        ..Default::default()
    };
    search_with(req, Arc::new(DirectSource::new()), &opts)
}
use rand::rngs::StdRng;
use rand::SeedableRng;

struct Mount(PathBuf);
impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn mount_tmpfs(at: &Path) -> Option<Mount> {
    if !rustix::process::geteuid().is_root() {
        cannot_run("needs root to mount tmpfs");
        return None;
    }
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "tmpfs"])
        .arg(at)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        cannot_run("cannot mount tmpfs");
        return None;
    }
    Some(Mount(at.to_path_buf()))
}

/// A daemon answering search requests for `src`, counting connections.
fn daemon(sock: &Path, src: PathBuf, conns: Arc<AtomicUsize>, know_search: bool) {
    let l = UnixListener::bind(sock).unwrap_or_else(|e| panic!("bind: {e}"));
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            conns.fetch_add(1, Ordering::SeqCst);
            if know_search {
                let _ = proto::serve_directory(s, &src);
            } else {
                // An older daemon: answers every op with an error.
                let mut s = s;
                let _ = proto::read_frame::<_, serde_json::Value>(&mut s);
                let _ = proto::write_frame(
                    &mut s,
                    &serde_json::json!({"ok": false, "error": "unknown op \"search\""}),
                );
            }
        }
    });
}

fn local(req: &SearchRequest) -> BTreeSet<String> {
    search(req, Arc::new(DirectSource::new()))
        .unwrap_or_else(|e| panic!("{e}"))
        .map(|r| key(&r))
        .collect()
}

#[test]
fn delegated_search_equals_local_search() {
    let t = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mnt = t.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap_or_else(|e| panic!("{e}"));
    let Some(_m) = mount_tmpfs(&mnt) else { return };
    let mut rng = StdRng::seed_from_u64(5);
    for d in ["a", "b"] {
        let p = mnt.join(d);
        std::fs::create_dir(&p).unwrap_or_else(|e| panic!("{e}"));
        let mut budget = 400;
        random_tree(&mut rng, &p, 5, &mut budget);
    }
    let sock = t.path().join("daemon.sock");
    rustix::fs::setxattr(
        &mnt,
        SOCKET_XATTR,
        sock.to_string_lossy().as_bytes(),
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap_or_else(|e| panic!("setxattr: {e}"));
    // Found from any path inside the mount, not from outside it.
    let canon_mnt = std::fs::canonicalize(&mnt).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        find_daemon(&mnt.join("a")).map(|x| x.0),
        Some(canon_mnt.clone())
    );
    assert_eq!(find_daemon(t.path()), None);

    // No daemon listening yet: delegation declines, the caller searches locally.
    let a = mnt.join("a").to_string_lossy().to_string();
    let b = mnt.join("b").to_string_lossy().to_string();
    let req = SearchRequest::new(format!("{a}:{b}"), "*.c|/*", Flags::INCLUDEROOT);
    assert!(delegate(&req).unwrap_or_else(|e| panic!("{e}")).is_none());

    let conns = Arc::new(AtomicUsize::new(0));
    daemon(&sock, canon_mnt.clone(), conns.clone(), true);
    let _caps = drop_dac_caps();
    for _ in 0..20 {
        let pat = random_pattern(&mut rng);
        for flags in [
            Flags::INCLUDEROOT,
            Flags::NONE,
            Flags::METADATA | Flags::X_OK,
            Flags::STOPATFIRST,
        ] {
            let req = SearchRequest::new(format!("{a}:{b}"), pat.clone(), flags);
            let before = conns.load(Ordering::SeqCst);
            let s = delegate(&req)
                .unwrap_or_else(|e| panic!("{e}"))
                .unwrap_or_else(|| panic!("not delegated"));
            let got: BTreeSet<String> = s.map(|r| key(&r)).collect();
            assert_eq!(
                conns.load(Ordering::SeqCst),
                before + 1,
                "one request per search"
            );
            if flags.contains(Flags::STOPATFIRST) {
                assert!(got.len() <= 1 || got.iter().any(|k| k.contains('!')));
                continue;
            }
            assert_eq!(got, local(&req), "{pat} {flags:?}");
        }
    }
}

/// `delegate_inline` (what `dircache search` uses) reads the daemon's frames on the
/// iterating thread: no thread of its own, and the same results as `delegate_with` (a reader
/// thread) and as a local search, over many frames, with errors, and when dropped early.
#[test]
fn an_inline_delegated_search_reads_on_the_callers_thread() {
    let t = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mnt = t.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap_or_else(|e| panic!("{e}"));
    let Some(_m) = mount_tmpfs(&mnt) else { return };
    for d in 0..6 {
        let p = mnt.join(format!("d{d}"));
        std::fs::create_dir(&p).unwrap_or_else(|e| panic!("{e}"));
        for f in 0..700 {
            let ext = if f % 2 == 0 { "c" } else { "h" };
            std::fs::write(p.join(format!("f{f}.{ext}")), b"x").unwrap_or_else(|e| panic!("{e}"));
        }
    }
    let closed = mnt.join("d5/closed");
    std::fs::create_dir(&closed).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(closed.join("hidden.c"), b"x").unwrap_or_else(|e| panic!("{e}"));
    let sock = t.path().join("daemon.sock");
    rustix::fs::setxattr(
        &mnt,
        SOCKET_XATTR,
        sock.to_string_lossy().as_bytes(),
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap_or_else(|e| panic!("setxattr: {e}"));
    let canon_mnt = std::fs::canonicalize(&mnt).unwrap_or_else(|e| panic!("{e}"));
    let conns = Arc::new(AtomicUsize::new(0));
    daemon(&sock, canon_mnt, conns.clone(), true);
    // The daemon searches as this caller: without DAC capabilities `closed` (mode 0) is an
    // error result, as in a local search.
    std::fs::set_permissions(&closed, std::os::unix::fs::PermissionsExt::from_mode(0o000))
        .unwrap_or_else(|e| panic!("{e}"));
    let _caps = drop_dac_caps();
    let m = mnt.to_string_lossy().to_string();
    let taken = |d: Delegation| match d {
        Delegation::Taken(s) => s,
        Delegation::Local(why) => panic!("not delegated: {why}"),
    };
    for (pat, flags) in [
        ("*.c", Flags::NONE),
        ("*", Flags::METADATA),
        ("f1*.h|/d3", Flags::INCLUDEROOT),
        ("nothing-matches", Flags::NONE),
    ] {
        let req = SearchRequest::new(m.clone(), pat, flags);
        let inline =
            taken(delegate_inline(&req, &tmpfs_trusted()).unwrap_or_else(|e| panic!("{e}")));
        assert_eq!(inline.own_threads(), 0, "{pat}: a reader thread");
        let got: BTreeSet<String> = inline.map(|r| key(&r)).collect();
        let threaded =
            taken(delegate_with(&req, &tmpfs_trusted()).unwrap_or_else(|e| panic!("{e}")));
        assert_eq!(threaded.own_threads(), 1, "{pat}");
        let other: BTreeSet<String> = threaded.map(|r| key(&r)).collect();
        assert_eq!(got, other, "{pat} {flags:?}");
        assert_eq!(got, local(&req), "{pat} {flags:?}");
        if pat == "*.c" {
            assert!(got.len() > 2100, "{}", got.len());
            assert!(
                got.iter().any(|k| k.contains('!')),
                "the closed directory's error"
            );
        }
    }
    // Dropped after its first result: the connection closes, nothing hangs.
    let req = SearchRequest::new(m.clone(), "*", Flags::NONE);
    let mut s = taken(delegate_inline(&req, &tmpfs_trusted()).unwrap_or_else(|e| panic!("{e}")));
    assert!(s.next().is_some());
    drop(s);
    assert_eq!(conns.load(Ordering::SeqCst), 9);
}

#[test]
fn old_daemon_without_search_falls_back_to_local() {
    let t = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mnt = t.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap_or_else(|e| panic!("{e}"));
    let Some(_m) = mount_tmpfs(&mnt) else { return };
    std::fs::write(mnt.join("x.c"), b"").unwrap_or_else(|e| panic!("{e}"));
    let sock = t.path().join("old.sock");
    rustix::fs::setxattr(
        &mnt,
        SOCKET_XATTR,
        sock.to_string_lossy().as_bytes(),
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap_or_else(|e| panic!("setxattr: {e}"));
    let conns = Arc::new(AtomicUsize::new(0));
    daemon(&sock, mnt.clone(), conns.clone(), false);
    let _caps = drop_dac_caps();
    let req = SearchRequest::new(mnt.to_string_lossy(), "*.c", Flags::NONE);
    assert!(delegate(&req).unwrap_or_else(|e| panic!("{e}")).is_none());
    assert_eq!(conns.load(Ordering::SeqCst), 1);
    let got: Vec<_> = search_auto(&req)
        .unwrap_or_else(|e| panic!("{e}"))
        .map(|r| key(&r))
        .collect();
    assert_eq!(got, vec!["x.c".to_string()]);
}

/// A local search that meets a dircache mount on the way hands the part below it to the
/// mount's daemon with the decomposed pattern (paper §4), and the results are unchanged.
#[test]
fn crossing_into_a_dircache_mount_delegates_the_subtree() {
    let t = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let top = t.path().join("top");
    let mnt = top.join("var").join("tmp");
    std::fs::create_dir_all(&mnt).unwrap_or_else(|e| panic!("{e}"));
    let Some(_m) = mount_tmpfs(&mnt) else { return };
    let mut rng = StdRng::seed_from_u64(17);
    for d in [&top, &mnt] {
        let mut budget = 300;
        random_tree(&mut rng, d, 4, &mut budget);
        let _ = std::fs::write(d.join("foo"), b"");
        let _ = std::fs::create_dir(d.join("tmp"));
        let _ = std::fs::write(d.join("tmp").join("foo"), b"");
    }
    let sock = t.path().join("inner.sock");
    rustix::fs::setxattr(
        &mnt,
        SOCKET_XATTR,
        sock.to_string_lossy().as_bytes(),
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap_or_else(|e| panic!("setxattr: {e}"));
    let conns = Arc::new(AtomicUsize::new(0));
    daemon(
        &sock,
        std::fs::canonicalize(&mnt).unwrap_or_else(|e| panic!("{e}")),
        conns.clone(),
        true,
    );
    let _caps = drop_dac_caps();
    let mut pats: Vec<String> = vec![
        "tmp/foo".into(),
        "var/tmp/foo".into(),
        "/var/tmp/*".into(),
        "*".into(),
        "/x".into(),
    ];
    for _ in 0..30 {
        pats.push(random_pattern(&mut rng));
    }
    let mut delegated = 0;
    for pat in &pats {
        for flags in [Flags::INCLUDEROOT, Flags::METADATA] {
            let req = SearchRequest::new(top.to_string_lossy(), pat.as_str(), flags);
            let want = local(&req);
            let before = conns.load(Ordering::SeqCst);
            let got: BTreeSet<String> = search_auto(&req)
                .unwrap_or_else(|e| panic!("{e}"))
                .map(|r| key(&r))
                .collect();
            delegated += conns.load(Ordering::SeqCst) - before;
            assert!(conns.load(Ordering::SeqCst) - before <= 1);
            assert_eq!(got, want, "{pat} {flags:?}");
        }
    }
    assert!(
        delegated > 10,
        "the mount was delegated only {delegated} times"
    );
}
