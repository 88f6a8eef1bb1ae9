//! Test harness: real mounts that are always unmounted, and helpers to run programs.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub const PY: &str = "/usr/bin/python3";

pub mod gated;
pub mod posix_checks;

/// The core configuration a mount with `policy` needs (bypass mode or not).
fn core_config(policy: &dircache_fuse::CachePolicy) -> dircache_core::Config {
    if policy.bypass {
        dircache_core::Config::bypass_mode()
    } else {
        dircache_core::Config::default()
    }
}

/// Whether real mounts can be made here (root and /dev/fuse). Tests return early otherwise,
/// after [`cannot_run`] (which fails the test under CI).
pub fn can_mount() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root || !Path::new("/dev/fuse").exists() {
        cannot_run("needs root and /dev/fuse");
        return false;
    }
    true
}

/// A test that cannot run here (no root, no /dev/fuse, ...). Under CI (the `CI` variable is
/// set) that is a failure: CI must run every test. Elsewhere the test returns early, but says
/// so loudly on stderr (past the test harness's output capture).
pub fn cannot_run(why: &str) {
    let test = std::thread::current().name().unwrap_or("?").to_string();
    if std::env::var_os("CI").is_some() {
        panic!("{test}: cannot run ({why}), and CI is set: a skipped test fails in CI");
    }
    // Straight to the stderr descriptor: the test harness captures eprintln! of passing tests.
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!("\n*** SKIPPED {test}: {why}. This test did NOT run (in CI it fails). ***\n")
            .as_bytes(),
    );
}

/// A dircache mount served in this process. Drop unmounts (lazily if busy) and joins the
/// serving thread.
pub struct TestMount {
    pub dir: tempfile::TempDir,
    /// The local backend's directory (empty for a memory mount).
    pub src: PathBuf,
    pub mnt: PathBuf,
    /// The backend of a memory mount ([`TestMount::memory`]).
    pub memory: Option<Arc<dircache_core::memory::MemoryBackend>>,
    thread: Option<JoinHandle<()>>,
}

/// Serve `cache` as `cfg` says on a thread of its own.
fn serve(cache: Arc<dircache_core::Cache>, cfg: &dircache_fuse::MountConfig) -> JoinHandle<()> {
    let mounted = dircache_fuse::mount(cache, cfg).expect("mount");
    std::thread::spawn(move || {
        if let Err(e) = mounted.run() {
            eprintln!("session: {e}");
        }
    })
}

impl TestMount {
    pub fn new() -> TestMount {
        Self::with_policy(dircache_fuse::CachePolicy::default())
    }

    pub fn with_policy(policy: dircache_fuse::CachePolicy) -> TestMount {
        Self::local(policy, dircache_local::WatchMode::Auto)
    }

    /// A mount with the default policy whose backend reports no change made in SRC (no change
    /// feed): the window between an outside change and the feed's report, made endless.
    pub fn without_feed() -> TestMount {
        Self::local(
            dircache_fuse::CachePolicy::default(),
            dircache_local::WatchMode::Off,
        )
    }

    /// A read-only mount (MS_RDONLY) of a local backend with the default policy; `fill` puts
    /// the tree into SRC first.
    pub fn read_only(fill: impl FnOnce(&Path)) -> TestMount {
        Self::local_with(
            dircache_fuse::CachePolicy::default(),
            dircache_local::WatchMode::Auto,
            libc::MS_RDONLY,
            fill,
        )
    }

    /// A mount with `policy`; `fill` puts the tree into SRC first (before the change feed
    /// starts: nothing of it is cached by the feed's reports).
    pub fn filled(policy: dircache_fuse::CachePolicy, fill: impl FnOnce(&Path)) -> TestMount {
        Self::local_with(policy, dircache_local::WatchMode::Auto, 0, fill)
    }

    /// A mount with `policy` whose backend reports no change made in SRC (no change feed).
    pub fn with_policy_without_feed(policy: dircache_fuse::CachePolicy) -> TestMount {
        Self::local(policy, dircache_local::WatchMode::Off)
    }

    /// A mount whose change feed uses `watch` (fanotify, inotify).
    pub fn with_watch(watch: dircache_local::WatchMode) -> TestMount {
        Self::local(Default::default(), watch)
    }

    fn local(policy: dircache_fuse::CachePolicy, watch: dircache_local::WatchMode) -> TestMount {
        Self::local_with(policy, watch, 0, |_| {})
    }

    fn local_with(
        policy: dircache_fuse::CachePolicy,
        watch: dircache_local::WatchMode,
        flags: libc::c_ulong,
        fill: impl FnOnce(&Path),
    ) -> TestMount {
        let dir = tempfile::Builder::new()
            .prefix("dcfuse")
            .tempdir()
            .expect("tempdir");
        let src = dir.path().join("src");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&src).expect("mkdir src");
        std::fs::create_dir(&mnt).expect("mkdir mnt");
        // Traversable by the non-root users of the multi-user tests.
        chmod(dir.path(), 0o755);
        fill(&src);
        let backend = if watch == dircache_local::WatchMode::Auto {
            dircache_local::LocalBackend::new(&src)
        } else {
            // No descriptor cache: without a feed nothing would empty it.
            dircache_local::LocalBackend::with_options(&src, 0, watch)
        }
        .expect("local backend");
        let cache =
            dircache_core::Cache::new(Arc::new(backend), core_config(&policy)).expect("cache");
        let mut cfg = dircache_fuse::MountConfig::new(&src, &mnt);
        cfg.policy = policy;
        cfg.kernel.flags |= flags;
        cfg.socket_path = Some(dir.path().join("ctl.sock"));
        let thread = serve(cache, &cfg);
        TestMount {
            dir,
            src,
            mnt,
            memory: None,
            thread: Some(thread),
        }
    }

    /// A mount of a fresh in-memory backend (no SRC: file data in memfds, the caller's umask
    /// applied as a kernel file system applies it), with the default policy. The daemon (this
    /// process) holds one descriptor per file with data: its descriptor limit is raised to
    /// the hard limit.
    pub fn memory() -> TestMount {
        Self::memory_with_policy(dircache_fuse::CachePolicy::default())
    }

    /// [`TestMount::memory`] with `policy`.
    pub fn memory_with_policy(policy: dircache_fuse::CachePolicy) -> TestMount {
        use rustix::process::{getrlimit, setrlimit, Resource};
        let mut lim = getrlimit(Resource::Nofile);
        if lim.current < lim.maximum {
            lim.current = lim.maximum;
            let _ = setrlimit(Resource::Nofile, lim);
        }
        let backend = Arc::new(dircache_core::memory::MemoryBackend::new().applying_umask());
        let mut t = Self::over_backend(backend.clone(), policy);
        t.memory = Some(backend);
        t
    }

    /// A mount of `backend` (no SRC) with `policy`, e.g. a backend wrapped by a test.
    pub fn over_backend(
        backend: Arc<dyn dircache_core::Backend>,
        policy: dircache_fuse::CachePolicy,
    ) -> TestMount {
        let dir = tempfile::Builder::new()
            .prefix("dcback")
            .tempdir()
            .expect("tempdir");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).expect("mkdir mnt");
        chmod(dir.path(), 0o755);
        let cache = dircache_core::Cache::new(backend, core_config(&policy)).expect("cache");
        let mut cfg = dircache_fuse::MountConfig::without_src(&mnt);
        cfg.policy = policy;
        let thread = serve(cache, &cfg);
        TestMount {
            dir,
            src: PathBuf::new(),
            mnt,
            memory: None,
            thread: Some(thread),
        }
    }

    pub fn m(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    pub fn s(&self, rel: &str) -> PathBuf {
        self.src.join(rel)
    }
}

impl Drop for TestMount {
    fn drop(&mut self) {
        if dircache_fuse::unmount(&self.mnt).is_err() {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
        if let Some(t) = self.thread.take() {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !t.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if t.is_finished() {
                let _ = t.join();
            } else {
                eprintln!("session thread did not stop within 10 s");
            }
        }
    }
}

/// A child process that is killed and reaped on drop.
pub struct ChildGuard(pub Option<Child>, pub Option<PathBuf>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(m) = &self.1 {
            if dircache_fuse::is_mount_point(m) {
                let _ = Command::new("umount").arg("-l").arg(m).status();
            }
        }
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub fn chmod(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// Run `sh -c script` in `dir`; returns (status, stdout, stderr).
pub fn sh(dir: &Path, script: &str) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .env("LC_ALL", "C")
        .env("TZ", "UTC")
        .env("GIT_AUTHOR_DATE", "2020-01-01T00:00:00Z")
        .env("GIT_COMMITTER_DATE", "2020-01-01T00:00:00Z")
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@example.com")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@example.com")
        .env("HOME", "/nonexistent")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .stdin(Stdio::null())
        .output()
        .expect("sh")
}

pub fn sh_ok(dir: &Path, script: &str) -> String {
    let o = sh(dir, script);
    assert!(
        o.status.success(),
        "`{script}` in {} failed: {}\n{}",
        dir.display(),
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Run a Python script in `dir`, as `uid` (via setpriv) when given.
pub fn py(dir: &Path, script: &str, uid: Option<u32>) -> String {
    let mut c = match uid {
        Some(u) => {
            let mut c = Command::new("setpriv");
            c.arg(format!("--reuid={u}"))
                .arg(format!("--regid={u}"))
                .arg("--clear-groups")
                .arg(PY);
            c
        }
        None => Command::new(PY),
    };
    let o = c
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .env("LC_ALL", "C")
        .stdin(Stdio::null())
        .output()
        .expect("python3");
    assert!(
        o.status.success(),
        "python in {} failed: {}\n{}",
        dir.display(),
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Poll `f` every millisecond until it is true or `limit` passes; returns the time taken.
pub fn wait_for(limit: Duration, mut f: impl FnMut() -> bool) -> Option<Duration> {
    let t = Instant::now();
    loop {
        if f() {
            return Some(t.elapsed());
        }
        if t.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Path of the built `dircache` binary, building it if needed.
pub fn dircache_bin() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    // The profile these tests were built with (a release test run must not build a whole
    // debug tree too: that doubled the suite's build time).
    let release = !cfg!(debug_assertions);
    let bin = target
        .join(if release { "release" } else { "debug" })
        .join("dircache");
    static BUILD: std::sync::Once = std::sync::Once::new();
    BUILD.call_once(|| {
        let mut args = vec!["build", "-q", "-p", "dircache"];
        if release {
            args.push("--release");
        }
        let st = Command::new(env!("CARGO"))
            .args(&args)
            .current_dir(&root)
            .status()
            .expect("cargo build");
        assert!(st.success(), "cargo build -p dircache failed");
    });
    bin
}

/// A small tree of files for the tool tests.
pub fn make_tree(root: &Path) {
    sh_ok(
        root,
        r#"set -e
mkdir -p a/b/c d/e pkg/sub empty
for i in 1 2 3 4 5 6 7 8 9 10; do echo "file $i" > a/f$i.txt; done
head -c 100000 /dev/zero > a/b/zero.bin
printf 'x%.0s' $(seq 1 5000) > a/b/c/x.txt
ln -s ../a/f1.txt d/link1
ln -s nowhere d/dangling
ln a/f2.txt d/hard2
echo 'VALUE = 42' > pkg/__init__.py
echo 'from . import mod' > pkg/sub/__init__.py
echo 'X = 1' > pkg/sub/mod.py
chmod 600 a/f3.txt
chmod 750 d/e
"#,
    );
}

/// A caller holding CAP_DAC_* searches by itself (a daemon never applies capabilities), so a
/// test that wants a delegated search runs its client side without them: this thread's
/// effective CAP_DAC_OVERRIDE/CAP_DAC_READ_SEARCH are dropped until the guard is dropped.
pub struct NoDacCaps(rustix::thread::CapabilitySets);

pub fn drop_dac_caps() -> NoDacCaps {
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

/// A tmpfs mounted on a fresh directory, unmounted (lazily if busy) on drop: the native oracle
/// for a memory mount where tmpfs and ext4 differ (the memory backend keeps file data in
/// memfds, which are tmpfs files).
pub struct Tmpfs(pub tempfile::TempDir);

impl Tmpfs {
    pub fn new() -> Tmpfs {
        let d = tempfile::Builder::new()
            .prefix("dctmpfs")
            .tempdir()
            .expect("tempdir");
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "mode=1777,size=64m", "tmpfs"])
            .arg(d.path())
            .status()
            .expect("mount");
        assert!(st.success(), "mount -t tmpfs failed");
        Tmpfs(d)
    }

    pub fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.0.path()).status();
    }
}

/// A git session (init, commits, status, diff, gc, fsck) run natively and on `t`'s mount:
/// the outputs, commit hashes included, must be equal.
pub fn git_workflow_matches_native(t: &TestMount) {
    let native = t.dir.path().join("native");
    std::fs::create_dir(&native).unwrap();
    let script = r#"set -e
# Fixed dates: the commit hashes compared below must not depend on the clock.
export GIT_AUTHOR_DATE=@1700000000 GIT_COMMITTER_DATE=@1700000000
git init -q -b main repo
cd repo
mkdir -p src docs
for i in 1 2 3 4 5; do echo "line $i" > src/f$i.c; done
echo readme > docs/README
git add -A
git commit -q -m first
echo change >> src/f2.c
rm src/f3.c
echo new > src/new.c
git status --porcelain
git diff --stat
git diff src/f2.c
git add -A && git commit -q -m second
git status --porcelain
git log --format='%s %H'
git ls-files
git gc -q
git fsck --no-progress 2>&1
git log --format='%s %H'
"#;
    let a = sh_ok(&native, script);
    let b = sh_ok(&t.mnt, script);
    assert_eq!(a, b);
    assert!(a.contains("src/new.c"));
}
