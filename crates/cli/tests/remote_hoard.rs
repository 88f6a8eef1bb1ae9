//! Containers across mounts and hoarding (docs/remote.md, "Containers across mounts",
//! "Hoarding"), with real parts: `dircache mount localhost:SRC MNT` through a stand-in ssh
//! running `dircache serve --stdio SRC` as a child, real FUSE mounts mounted, unmounted and
//! killed one after the other over the same cache directory. The client's round trips are
//! counted from its trace log (every call is one `remote call` line).

#[path = "../../fuse/tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{can_mount, sh, sh_ok};
// The remote-mount harness (crates/tests/src/remote.rs): a `Remote` (a served tree, its
// cache directory, a stand-in ssh) mounted by `Client`s one after the other.
use dircache_tests::have_tool;
use dircache_tests::remote::{eventually_within, random_bytes, Client, Remote};

const BIN: &str = env!("CARGO_BIN_EXE_dircache");

/// Wait until `cond` holds, at most `secs` s.
fn eventually(secs: u64, what: &str, cond: impl FnMut() -> bool) {
    eventually_within(Duration::from_secs(secs), what, cond);
}

fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Unmount, mount again: unchanged files (at the top and in a subdirectory) are not fetched
/// again, and once the mount's bulk reply has revalidated them their read opens make no
/// round trip at all.
#[test]
fn unchanged_files_are_reused_after_a_remount() {
    if !can_mount() {
        return;
    }
    let r = Remote::new();
    let f = random_bytes(1 << 20, 1);
    let g = random_bytes(300_000, 2);
    std::fs::write(r.s("f"), &f).unwrap();
    std::fs::create_dir(r.s("d")).unwrap();
    std::fs::write(r.s("d/g"), &g).unwrap();
    let c = r.mount("1", "");
    assert_eq!(read(&c.m("f")), f);
    assert_eq!(read(&c.m("d/g")), g);
    assert!(c.data_calls() >= 2, "fetched:\n{}", c.log_text());
    c.unmount();
    assert!(
        r.kept_dir().is_some_and(|d| d.join("index").exists()),
        "an index in the remote's directory: {:?}",
        std::fs::read_dir(&r.cache).unwrap().collect::<Vec<_>>()
    );
    let c = r.mount("2", "");
    eventually(20, "the bulk reply revalidated both", || {
        c.log_text().matches("read grants restored").count() >= 2
    });
    let before = c.calls("");
    assert_eq!(read(&c.m("f")), f);
    assert_eq!(read(&c.m("d/g")), g);
    assert_eq!(c.data_calls(), 0, "no data fetched:\n{}", c.log_text());
    assert_eq!(
        c.calls(""),
        before,
        "no round trip for the opens:\n{}",
        c.log_text()
    );
    assert_eq!(r.containers().len(), 2, "{:?}", r.containers());
}

/// A file changed on the server between mounts (same size, its mtime put back: only ctime
/// tells) is fetched again, never served stale, whether the bulk reply or the open finds it
/// changed; an unchanged one beside it is not fetched again.
#[test]
fn a_file_changed_between_mounts_is_fetched_again() {
    if !can_mount() {
        return;
    }
    let r = Remote::new();
    std::fs::write(r.s("same"), b"unchanged").unwrap();
    std::fs::write(r.s("changed"), b"version one").unwrap();
    sh_ok(&r.src, "touch -d 2020-01-01 changed");
    // Bulk revalidation at mount (default), and revalidation at open (no bulk replies).
    for (round, extra) in [(1, ""), (2, "subtree=0")] {
        let c = r.mount(&format!("a{round}"), extra);
        assert_eq!(read(&c.m("same")), b"unchanged");
        let old = read(&c.m("changed"));
        c.unmount();
        let new: &[u8] = if old == b"version one" {
            b"version two"
        } else {
            b"version one"
        };
        std::fs::write(r.s("changed"), new).unwrap();
        sh_ok(&r.src, "touch -d 2020-01-01 changed");
        let c = r.mount(&format!("b{round}"), extra);
        assert_eq!(read(&c.m("changed")), new, "round {round}: fresh");
        assert_eq!(read(&c.m("same")), b"unchanged");
        let reads = c.log_text();
        assert_eq!(
            c.data_calls(),
            1,
            "round {round}: only the changed file fetched:\n{reads}"
        );
        assert_eq!(read(&c.m("changed")), new, "round {round}: stays fresh");
        c.unmount();
    }
}

/// kill -9 of the client in the middle of fetching a new version of a file the index lists:
/// the next mount serves the right content, removes the half-fetched container, and reuses
/// the unchanged file.
#[test]
fn a_client_killed_mid_fetch_leaves_nothing_misusable() {
    if !can_mount() {
        return;
    }
    let r = Remote::new();
    let n = 48 << 20;
    let v1 = random_bytes(n, 3);
    let v2 = random_bytes(n, 4);
    std::fs::write(r.s("big"), &v1).unwrap();
    std::fs::write(r.s("small"), b"small file").unwrap();
    let c = r.mount("1", "");
    assert_eq!(read(&c.m("small")), b"small file");
    assert!(read(&c.m("big")) == v1);
    // The index lists both (written about once a second).
    eventually(20, "the index lists both containers", || {
        c.log_text()
            .contains("container index written: 2 containers")
    });
    std::fs::write(r.s("big"), &v2).unwrap();
    eventually(10, "the callback reaches the client", || {
        c.log_text().contains("containers invalid")
    });
    // Fetch the new version and kill the client when its container is half written.
    let reader = Command::new("cat")
        .arg(c.m("big"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut reader = scopeguard_child(reader);
    let kept = r.kept_dir().expect("kept dir");
    eventually(10, "a half-fetched container", || {
        std::fs::read_dir(&kept)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with('c'))
            .filter_map(|e| e.metadata().ok())
            .any(|m| m.len() > 0 && m.len() < n as u64 && m.len() != 10)
    });
    c.kill9();
    let _ = reader.0.wait();
    let c = r.mount("2", "");
    // Nothing left but whole containers (the half-fetched one is removed at mount).
    for (name, size) in r.containers() {
        assert!(
            size == 10 || size == n as u64,
            "{name}: {size} bytes left behind"
        );
    }
    assert!(r.per_mount_dirs().is_empty(), "{:?}", r.per_mount_dirs());
    assert_eq!(read(&c.m("small")), b"small file");
    assert_eq!(c.data_calls(), 0, "small reused:\n{}", c.log_text());
    assert!(read(&c.m("big")) == v2, "the new version");
}

/// Kills a child by PID when dropped (a test failing midway leaves no process behind).
struct ChildGuard(Child);

fn scopeguard_child(c: Child) -> ChildGuard {
    ChildGuard(c)
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Two mounts of the same remote at once: the first holds the remote's directory, the
/// second gets a per-mount directory (removed when it ends); both read right.
#[test]
fn a_second_mount_of_the_same_remote_gets_its_own_directory() {
    if !can_mount() {
        return;
    }
    let r = Remote::new();
    std::fs::write(r.s("f"), b"shared").unwrap();
    let a = r.mount("a", "");
    let b = r.mount("b", "");
    assert_eq!(read(&a.m("f")), b"shared");
    assert_eq!(read(&b.m("f")), b"shared");
    assert_eq!(
        r.per_mount_dirs().len(),
        1,
        "the second mount's own directory"
    );
    assert!(b.log_text().contains("used by another mount"));
    assert_eq!(r.containers().len(), 1, "the first mount's container");
    b.unmount();
    assert!(r.per_mount_dirs().is_empty(), "removed with its mount");
    a.unmount();
    assert_eq!(r.containers().len(), 1, "kept");
}

/// The read grants kept across mounts never let a user read what the server refuses: user
/// B (refused by an ACL entry the client's kernel does not check under `noacl`) stays
/// refused after a remount; user A, granted before, is refused after an ACL on the file's
/// directory (only the directory changed) took the access away between mounts; a file in
/// an unchanged directory is still read with no round trip.
#[test]
fn read_grants_across_mounts_follow_the_server() {
    if !can_mount() {
        return;
    }
    if !have_tool("setfacl") {
        return;
    }
    let r = Remote::new();
    sh_ok(
        &r.src,
        "mkdir -m 755 d e && for f in d/secret e/open; do echo for A > $f; done && \
         chown 0:2000 d/secret e/open && chmod 640 d/secret e/open && \
         setfacl -m u:1001:--- d/secret",
    );
    let as_user = |uid: u32, path: &Path| {
        sh(
            r.dir.path(),
            &format!(
                "setpriv --reuid={uid} --regid=2000 --clear-groups cat {}",
                path.display()
            ),
        )
    };
    let c = r.mount("1", "noacl");
    for p in ["d/secret", "e/open"] {
        let a = as_user(1000, &c.m(p));
        assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
    }
    assert!(!as_user(1001, &c.m("d/secret")).status.success());
    c.unmount();
    // Between mounts: A loses the directory d (an ACL on d only; the file is unchanged).
    sh_ok(&r.src, "setfacl -m u:1000:--- d");
    assert!(
        !as_user(1000, &r.s("d/secret")).status.success(),
        "natively"
    );
    let c = r.mount("2", "noacl");
    eventually(20, "the bulk reply revalidated both", || {
        c.log_text()
            .contains("container of \"e/open\": unchanged, 1 read grants restored")
            && c.log_text()
                .contains("container of \"d/secret\": unchanged")
    });
    let b = as_user(1001, &c.m("d/secret"));
    assert!(!b.status.success(), "B read after the remount");
    let a = as_user(1000, &c.m("d/secret"));
    assert!(
        !a.status.success(),
        "A read through a directory the server now refuses: {:?}",
        String::from_utf8_lossy(&a.stdout)
    );
    let before = c.calls("");
    let a = as_user(1000, &c.m("e/open"));
    assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
    assert_eq!(
        c.calls(""),
        before,
        "A's grant on e/open kept:\n{}",
        c.log_text()
    );
}

/// `dircache hoard MNT MNT/rel` (not on a terminal), which must succeed: its stdout and stderr.
fn hoard(c: &Client, rel: &str) -> (String, String) {
    let out = Command::new(BIN)
        .arg("hoard")
        .arg(&c.mnt)
        .arg(c.m(rel))
        .stdin(Stdio::null())
        .output()
        .expect("dircache hoard");
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "{so}\n{se}");
    (so, se)
}

/// `dircache hoard MNT PATH`: every regular file of the subtree fetched whole (the later
/// reads make no round trip at all), a file above `whole_file_max` skipped and said so, no
/// progress bar on a non-terminal; the counters of `dircache stats` follow. A subtree larger
/// than `cache_size` is warned about and the files beyond it skipped.
#[test]
fn hoard_fetches_a_subtree_for_later_reads_without_round_trips() {
    if !can_mount() {
        return;
    }
    let r = Remote::new();
    let mut want = Vec::new();
    for (i, rel) in [
        "proj/a.c",
        "proj/b.c",
        "proj/sub/c.h",
        "proj/sub/deep/d.txt",
    ]
    .iter()
    .enumerate()
    {
        let data = random_bytes(20_000 + i * 1000, 10 + i as u64);
        std::fs::create_dir_all(r.s(rel).parent().unwrap()).unwrap();
        std::fs::write(r.s(rel), &data).unwrap();
        want.push((rel.to_string(), data));
    }
    std::fs::write(r.s("proj/big.bin"), random_bytes(300_000, 20)).unwrap();
    std::fs::write(r.s("elsewhere"), b"not hoarded").unwrap();
    let c = r.mount("1", "whole_file_max=100K");
    let (so, se) = hoard(&c, "proj");
    eprintln!("dircache hoard printed:\n{so}");
    assert!(so.contains("hoarded 4 files"), "{so}");
    assert!(so.contains("4 fetched"), "{so}");
    assert!(
        so.contains("skipped 1 files") && so.contains("whole_file_max"),
        "{so}"
    );
    assert!(
        !se.contains('\u{1b}'),
        "no progress bar off a terminal: {se:?}"
    );
    let fetched = c.data_calls();
    let before = c.calls("");
    for (rel, data) in &want {
        assert_eq!(&read(&c.m(rel)), data, "{rel}");
    }
    assert_eq!(c.data_calls(), fetched, "nothing fetched again");
    assert_eq!(
        c.calls(""),
        before,
        "the hoarded files read with no round trip:\n{}",
        c.log_text()
    );
    let stats = Command::new(BIN)
        .args(["stats", "--json"])
        .arg(&c.mnt)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
    let b = &v["backend"];
    assert_eq!(b["containers_fetches"], 4, "{b}");
    assert!(b["containers_hits"].as_u64().unwrap() >= 4, "{b}");
    assert_eq!(b["containers_kept"], 1, "{b}");
    let human = Command::new(BIN).arg("stats").arg(&c.mnt).output().unwrap();
    let human = String::from_utf8_lossy(&human.stdout);
    assert!(human.contains("containers:   4 fetches"), "{human}");
    c.unmount();
    // A cache_size smaller than the subtree: warned, the files beyond it skipped.
    let c = r.mount("2", "whole_file_max=100K,cache_size=50K");
    let (so, se) = hoard(&c, "proj");
    assert!(se.contains("more than the mount's cache_size"), "{se}");
    assert!(so.contains("beyond cache_size"), "{so}");
}
