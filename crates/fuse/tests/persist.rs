//! Warm restart (`-o persist=PATH`): what changed in SRC while it was not mounted is never
//! served from the snapshot, and a bad snapshot is ignored. Native `find`/`ls -lR` of SRC is
//! the oracle.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use common::*;
use dircache_core::LoadReport;

/// A mount served in this process with `persist=snap`. `finish` unmounts and waits for the
/// daemon's end (the snapshot is written then); drop does the same on failure.
struct PersistMount {
    mnt: PathBuf,
    thread: Option<JoinHandle<()>>,
    loaded: Option<LoadReport>,
}

impl PersistMount {
    fn new(src: &Path, mnt: &Path, snap: &Path, policy: dircache_fuse::CachePolicy) -> Self {
        let backend = dircache_local::LocalBackend::new(src).expect("local backend");
        let cache = dircache_core::Cache::new(Arc::new(backend), dircache_core::Config::default())
            .expect("cache");
        let mut cfg = dircache_fuse::MountConfig::new(src, mnt);
        cfg.policy = policy;
        cfg.persist = Some(snap.to_path_buf());
        let mounted = dircache_fuse::mount(cache, &cfg).expect("mount");
        let loaded = mounted.persist_loaded;
        let thread = std::thread::spawn(move || {
            if let Err(e) = mounted.run() {
                eprintln!("session: {e}");
            }
        });
        PersistMount {
            mnt: mnt.to_path_buf(),
            thread: Some(thread),
            loaded,
        }
    }

    /// Unmount and wait until the daemon has written its snapshot and stopped.
    fn finish(mut self) {
        dircache_fuse::unmount(&self.mnt).expect("unmount");
        let t = self.thread.take().expect("thread");
        assert!(
            wait_for(Duration::from_secs(30), || t.is_finished()).is_some(),
            "the daemon did not stop after unmount"
        );
        t.join().expect("join");
    }
}

impl Drop for PersistMount {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            if dircache_fuse::unmount(&self.mnt).is_err() {
                let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
            }
            let _ = wait_for(Duration::from_secs(10), || t.is_finished());
            if t.is_finished() {
                let _ = t.join();
            }
        }
    }
}

/// What a tree looks like: `find` (path, mode, size, type, links) and `ls -lR`, with paths
/// relative to `dir`.
fn picture(dir: &Path) -> String {
    sh_ok(
        dir,
        "find . -printf '%p %m %s %y %n %i\\n' | sort; ls -lRn --time-style=+%s .",
    )
}

/// Wait until every directory of `dir` was last changed more than 2 s ago (the snapshot does
/// not trust directories changed within 2 s of its writing).
fn wait_settled(dir: &Path) {
    let newest = sh_ok(dir, "find . -type d -printf '%C@\\n' | sort -n | tail -1");
    let newest: f64 = newest.trim().parse().expect("ctime");
    let ok = wait_for(Duration::from_secs(10), || {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .expect("clock")
            .as_secs_f64();
        now > newest + 2.2
    });
    assert!(ok.is_some(), "clock did not advance");
}

struct Dirs {
    _d: tempfile::TempDir,
    src: PathBuf,
    mnt: PathBuf,
    snap: PathBuf,
}

fn dirs() -> Dirs {
    let d = tempfile::Builder::new()
        .prefix("dcpersist")
        .tempdir()
        .expect("tempdir");
    chmod(d.path(), 0o755);
    let src = d.path().join("src");
    let mnt = d.path().join("mnt");
    std::fs::create_dir(&src).expect("mkdir src");
    std::fs::create_dir(&mnt).expect("mkdir mnt");
    let snap = d.path().join("state").join("snap");
    std::fs::create_dir(d.path().join("state")).expect("mkdir state");
    sh_ok(
        &src,
        "mkdir -p a/sub/deeper b c d/inner e f/untouched g h/same && \
         echo 1 > a/f1 && echo 22 > a/f2 && echo 333 > a/sub/g && echo h > a/sub/deeper/h && \
         echo x > b/x && echo y > b/y && echo z > d/inner/z && echo k > e/keep && \
         echo u > f/untouched/u && echo t > top && ln -s ../top f/link && ln b/x b/x2 && \
         echo s > h/same/s",
    );
    Dirs {
        _d: d,
        src,
        mnt,
        snap,
    }
}

fn scenario(policy: dircache_fuse::CachePolicy) {
    let t = dirs();
    let (src, mnt, snap) = (&t.src, &t.mnt, &t.snap);
    wait_settled(src);

    // First mount: no snapshot yet. Walk everything; learn some names missing.
    let m = PersistMount::new(src, mnt, snap, policy.clone());
    assert!(m.loaded.is_none());
    assert_eq!(picture(mnt), picture(src));
    for missing in ["a/later", "e/nope", "f/untouched/nothere", "h/same/gone2"] {
        assert!(!mnt.join(missing).exists());
    }
    // Just before the snapshot: a change in g (racy: g is not trusted).
    // Looked up through the mount first, while missing: the mount then holds it missing
    // (a negative in the core and the kernel), and only the change feed's report of its
    // creation shows it. Without that lookup the mount's first lookup asked SRC and found it
    // at once, whether the feed had reported it or not.
    assert!(!mnt.join("g/racy1").exists(), "g/racy1 before it is made");
    sh_ok(src, "echo 1 > g/racy1");
    // An outside change reaches the mount through the change feed, soon.
    assert!(
        wait_for(Duration::from_secs(10), || mnt.join("g/racy1").exists()).is_some(),
        "the change feed did not report g/racy1"
    );
    m.finish();
    assert!(snap.exists(), "snapshot written at unmount");
    let meta = std::fs::metadata(snap).expect("snapshot");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(meta.mode() & 0o777, 0o600);
    assert_eq!(meta.uid(), 0);

    // While unmounted (the first one right away, in the snapshot's second).
    sh_ok(
        src,
        "echo 2 > g/racy2 && \
         echo new > a/later && rm b/x && mv b/y b/y2 && mv e/keep c/kept && echo n > e/nope && \
         chmod 600 a/f1 && chmod 700 a/sub && mv a/sub/deeper c/deeper && \
         rm -r d/inner && echo file > d/inner && mv top a/top && \
         echo longer >> a/f2 && touch -d @1000000000 b",
    );

    // Second mount: the snapshot is loaded, checked, and nothing stale is served.
    let m = PersistMount::new(src, mnt, snap, policy.clone());
    let l = m.loaded.expect("snapshot loaded");
    // Names first, looked up directly (negatives and complete listings are what could lie).
    for p in [
        "a/later",
        "e/nope",
        "b/y2",
        "c/kept",
        "c/deeper/h",
        "a/top",
        "g/racy2",
        "d/inner",
    ] {
        assert!(mnt.join(p).exists(), "{p} must exist");
    }
    for p in ["b/x", "b/y", "e/keep", "a/sub/deeper", "top", "d/inner/z"] {
        assert!(!mnt.join(p).exists(), "{p} must not exist");
    }
    assert!(!mnt.join("f/untouched/nothere").exists());
    let f1 = std::fs::metadata(mnt.join("a/f1")).expect("a/f1");
    assert_eq!(f1.mode() & 0o777, 0o600, "chmod while unmounted");
    assert_eq!(picture(mnt), picture(src));
    // Only the untouched directories were trusted.
    assert!(l.validated >= 3, "{l:?}");
    assert!(l.changed >= 7, "{l:?}");
    assert!(l.missing >= 1, "{l:?}");

    // And once more, with the tree unchanged since: the second snapshot serves all of it
    // (written once the changes are older than the racy window).
    wait_settled(src);
    m.finish();
    let m = PersistMount::new(src, mnt, snap, policy);
    let l = m.loaded.expect("snapshot loaded");
    assert_eq!((l.validated, l.changed, l.missing), (l.dirs, 0, 0), "{l:?}");
    assert!(l.listings >= 12, "every directory was listed: {l:?}");
    assert_eq!(picture(mnt), picture(src));
    m.finish();
}

#[test]
fn changes_while_unmounted_are_never_served_stale() {
    if !can_mount() {
        return;
    }
    scenario(dircache_fuse::CachePolicy::default());
}

/// Without readdirplus the restored listings themselves answer READDIR.
#[test]
fn changes_while_unmounted_are_never_served_stale_noreaddirplus() {
    if !can_mount() {
        return;
    }
    let policy = dircache_fuse::CachePolicy {
        readdirplus: false,
        ..Default::default()
    };
    scenario(policy);
}

#[test]
fn corrupt_or_truncated_snapshots_are_ignored() {
    if !can_mount() {
        return;
    }
    let t = dirs();
    let (src, mnt, snap) = (&t.src, &t.mnt, &t.snap);
    wait_settled(src);
    let m = PersistMount::new(src, mnt, snap, Default::default());
    assert_eq!(picture(mnt), picture(src));
    m.finish();
    let good = std::fs::read(snap).expect("snapshot");
    assert!(good.len() > 64);
    let mut flipped = good.clone();
    let mid = good.len() / 2;
    flipped[mid] ^= 0x5a;
    let bad: [(&str, Vec<u8>); 5] = [
        ("truncated", good[..good.len() - 7].to_vec()),
        ("header only", good[..20].to_vec()),
        ("flipped byte", flipped),
        ("empty", Vec::new()),
        ("garbage", b"not a snapshot at all\n".repeat(100)),
    ];
    for (what, bytes) in bad {
        std::fs::write(snap, &bytes).expect("write");
        chmod(snap, 0o600);
        let m = PersistMount::new(src, mnt, snap, Default::default());
        assert!(m.loaded.is_none(), "{what}: must be ignored");
        sh_ok(src, "echo more >> a/f2");
        assert_eq!(picture(mnt), picture(src), "{what}");
        m.finish();
        // Replaced by a good one at unmount.
        let again = std::fs::read(snap).expect("snapshot");
        assert_ne!(again, bytes, "{what}: rewritten at unmount");
    }
    // A snapshot others can read or write is refused.
    chmod(snap, 0o644);
    let m = PersistMount::new(src, mnt, snap, Default::default());
    assert!(m.loaded.is_none(), "mode 0644 must be refused");
    assert_eq!(picture(mnt), picture(src));
    m.finish();
    // The snapshot of another tree is refused.
    let other = dirs();
    let m = PersistMount::new(&other.src, &other.mnt, snap, Default::default());
    assert!(
        m.loaded.is_none(),
        "a snapshot of another SRC must be refused"
    );
    assert_eq!(picture(&other.mnt), picture(&other.src));
    m.finish();
}

/// The command line: `dircache mount -f SRC MNT -o persist=PATH` writes the snapshot when
/// unmounted and uses it next time.
#[test]
fn cli_persist_option() {
    if !can_mount() {
        return;
    }
    let t = dirs();
    let (src, mnt, snap) = (&t.src, &t.mnt, &t.snap);
    wait_settled(src);
    let opt = format!("persist={}", snap.display());
    for round in 0..2 {
        let child = Command::new(dircache_bin())
            .args(["mount", "-f"])
            .arg(src)
            .arg(mnt)
            .args(["-o", &opt])
            .env("DIRCACHE_LOG", "info")
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        let mut g = ChildGuard(Some(child), Some(mnt.clone()));
        assert!(
            wait_for(Duration::from_secs(20), || dircache_fuse::is_mount_point(
                mnt
            ))
            .is_some(),
            "mounted"
        );
        assert_eq!(picture(mnt), picture(src));
        if round == 0 {
            sh_ok(src, "echo new > b/late");
        }
        assert!(Command::new("umount")
            .arg(mnt)
            .status()
            .expect("umount")
            .success());
        let c = g.0.take().expect("child");
        let out = c.wait_with_output().expect("wait");
        assert!(out.status.success(), "daemon exit: {}", out.status);
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(
            snap.exists(),
            "round {round}: snapshot written; log:\n{log}"
        );
        if round == 1 {
            assert!(
                log.contains("persist:") && log.contains("validated"),
                "snapshot loaded on the second mount; log:\n{log}"
            );
        }
    }
}
