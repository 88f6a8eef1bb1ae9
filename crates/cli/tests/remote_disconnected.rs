//! Disconnected operation on a remote mount (docs/remote.md, "Disconnected operation"), with
//! real parts: `dircache mount localhost:SRC MNT` through a stand-in ssh that runs `dircache
//! serve --stdio SRC` as a child, a real FUSE mount. The connection is cut by killing the
//! server (by PID) while the stand-in ssh refuses new connections (a `down` file, as an
//! unreachable host would); it is restored by removing that file. Native files are the
//! oracle.

#[path = "../../fuse/tests/common/mod.rs"]
mod common;

use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{can_mount, sh_ok};
use dircache_tests::remote::{eventually, Client, Remote, WAIT};

const BIN: &str = env!("CARGO_BIN_EXE_dircache");

/// A remote (the shared harness, crates/tests/src/remote.rs: the stand-in ssh, the server
/// killed by PID) and its one mount, which a test cuts, restores, crashes and starts again.
/// Derefs to the [`Remote`] (`src`, `dir`, `cache`, `s()`, `restore()`). Drop unmounts and
/// reaps the daemon.
struct Mount {
    /// Declared before `remote`: unmounted before its directory goes.
    client: Option<Client>,
    remote: Remote,
    extra: String,
    mnt: PathBuf,
    log: PathBuf,
}

impl Deref for Mount {
    type Target = Remote;

    fn deref(&self) -> &Remote {
        &self.remote
    }
}

impl Mount {
    fn start(extra: &str) -> Mount {
        Mount::start_with(extra, &[])
    }

    /// [`Mount::start`] with `env` added to the daemon's environment.
    fn start_with(extra: &str, env: &[(&str, &str)]) -> Mount {
        let remote = Remote::new();
        let client = remote.mount_with("", extra, env);
        Mount {
            mnt: client.mnt.clone(),
            log: client.log.clone(),
            client: Some(client),
            remote,
            extra: extra.to_string(),
        }
    }

    fn client(&self) -> &Client {
        self.client.as_ref().expect("a running daemon")
    }

    /// Start the daemon again (after [`Mount::crash`]) and wait for the mount.
    fn spawn(&mut self) {
        self.spawn_with(&[], true);
    }

    /// Start the daemon again with `env` added to its environment; with `wait`, wait for
    /// the mount (a log left behind is replayed before it appears).
    fn spawn_with(&mut self, env: &[(&str, &str)], wait: bool) {
        self.client = Some(self.remote.remount_with("", &self.extra, env, wait));
    }

    /// Kill the daemon (SIGKILL, by PID) and detach its dead mount.
    fn crash(&mut self) {
        self.client.take().expect("a daemon").kill9();
        eventually("the dead mount detached", || {
            !dircache_fuse::is_mount_point(&self.mnt)
        });
    }

    fn m(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// What the daemons logged so far (one log, appended to by each start).
    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Remote calls so far (every call is one `remote call` line).
    fn calls(&self) -> usize {
        self.client().calls("")
    }

    /// Cut the connection: new connections are refused, the server is killed, and the
    /// client has seen its connection end.
    fn cut(&self) {
        self.remote.cut(self.client());
    }
}

/// A tree as [`tree`] shows it: (relative name, permission bits, content or link target).
type Tree = Vec<(String, u32, Option<Vec<u8>>)>;

/// Every entry below `dir` (sorted, relative names; directories end in `/`) with its
/// permission bits, and each regular file's content or each symlink's target.
fn tree(dir: &Path) -> Tree {
    try_tree(dir).unwrap_or_else(|e| panic!("{e}"))
}

/// [`tree`], or the first error met (with the path it was met on).
fn try_tree(dir: &Path) -> Result<Tree, String> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    let at = |what: &str, p: &Path, e: std::io::Error| format!("{what} {}: {e}", p.display());
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).map_err(|e| at("readdir", &d, e))? {
            let p = e.map_err(|e| at("readdir", &d, e))?.path();
            let rel = p.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
            let md = std::fs::symlink_metadata(&p).map_err(|e| at("lstat", &p, e))?;
            let mode = md.permissions().mode() & 0o7777;
            if md.is_dir() {
                stack.push(p);
                out.push((rel + "/", mode, None));
            } else if md.is_file() {
                let data = std::fs::read(&p).map_err(|e| at("read", &p, e))?;
                out.push((rel, mode, Some(data)));
            } else {
                let t = std::fs::read_link(&p).map_err(|e| at("readlink", &p, e))?;
                out.push((rel, 0, Some(t.as_os_str().as_encoded_bytes().to_vec())));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// `find DIR` sorted, names relative to DIR, with each regular file's content.
fn snapshot(dir: &Path) -> Vec<(String, Option<Vec<u8>>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("readdir {}: {e}", d.display())) {
            let e = e.unwrap();
            let p = e.path();
            let rel = p.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
            let md = std::fs::symlink_metadata(&p)
                .unwrap_or_else(|e| panic!("lstat {}: {e}", p.display()));
            if md.is_dir() {
                stack.push(p);
                out.push((rel + "/", None));
            } else if md.is_file() {
                let data =
                    std::fs::read(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
                out.push((rel, Some(data)));
            } else {
                let t = std::fs::read_link(&p).unwrap();
                out.push((format!("{rel} -> {}", t.display()), None));
            }
        }
    }
    out.sort();
    out
}

fn errno(r: std::io::Result<impl Sized>) -> Option<i32> {
    errno_of(&r)
}

/// [`errno`] of a result kept for a message.
fn errno_of<T>(r: &std::io::Result<T>) -> Option<i32> {
    r.as_ref().err().and_then(|e| e.raw_os_error())
}

/// Cut from the server, the client keeps serving what it cached: listings, attributes and
/// negative entries of directories it had listed, the data of files it had fetched (valid
/// when the connection ended), as they were at the cut (a change made on the server meanwhile
/// shows after the reconnection). What it never cached fails with ETIMEDOUT after a short
/// wait, not after `reconnect_timeout`.
#[test]
fn cached_files_and_directories_stay_usable_while_disconnected() {
    if !can_mount() {
        return;
    }
    let t = Mount::start("reconnect_timeout=30");
    sh_ok(
        &t.src,
        "mkdir -p d/sub cold && printf one > d/a && printf two > d/b && printf three > \
         d/sub/c && ln -s a d/link && printf never > d/unread && printf cold > cold/x && \
         printf top > f",
    );
    // Cache: d's listings and every file but `unread` (fetched into containers), a miss.
    let listing = |t: &Mount| {
        let mut v: Vec<String> = std::fs::read_dir(t.m("d"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    // The whole listing: one taken before the callbacks of the last names arrived lacks
    // them until they do (seen under load: ["a", "b", "sub"]).
    eventually("the tree shows", || {
        t.m("d/sub/c").exists() && listing(&t) == ["a", "b", "link", "sub", "unread"]
    });
    let names = listing(&t);
    assert_eq!(names, ["a", "b", "link", "sub", "unread"]);
    let mut want = snapshot(&t.s("d"));
    want.retain(|(n, _)| n != "unread");
    let read_all = |t: &Mount| {
        let mut got = Vec::new();
        for (n, _) in &want {
            let p = t
                .m("d")
                .join(n.split(" -> ").next().unwrap().trim_end_matches('/'));
            let md = std::fs::symlink_metadata(&p)
                .unwrap_or_else(|e| panic!("lstat {}: {e}", p.display()));
            got.push(if md.is_dir() {
                (n.clone(), None)
            } else if md.is_file() {
                let d = std::fs::read(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
                (n.clone(), Some(d))
            } else {
                let l = std::fs::read_link(&p).unwrap();
                (
                    format!("{} -> {}", n.split(" -> ").next().unwrap(), l.display()),
                    None,
                )
            });
        }
        got
    };
    assert_eq!(
        errno(std::fs::metadata(t.m("d/missing"))),
        Some(libc::ENOENT)
    );
    // Until a whole pass needs no round trip: every callback of the files' creation has
    // come (a late one would leave a container invalid, i.e. not usable while cut off).
    eventually("a pass over the cached tree with no round trip", || {
        let before = t.calls();
        assert_eq!(read_all(&t), want);
        assert_eq!(std::fs::read(t.m("f")).unwrap(), b"top");
        assert_eq!(listing(&t), names);
        t.calls() == before
    });

    t.cut();
    // A change on the server while cut off: not seen until the reconnection.
    std::fs::write(t.s("f"), b"changed on the server").unwrap();
    let started = Instant::now();
    assert_eq!(listing(&t), names, "the listing of a cached directory");
    assert_eq!(
        read_all(&t),
        want,
        "cached attributes, symlinks and file data"
    );
    assert_eq!(std::fs::read(t.m("f")).unwrap(), b"top", "the cached copy");
    assert_eq!(
        errno(std::fs::metadata(t.m("d/missing"))),
        Some(libc::ENOENT),
        "a cached negative entry"
    );
    assert_eq!(
        std::fs::read_to_string(t.m("d/link")).unwrap(),
        "one",
        "through a cached symlink"
    );
    let cached_took = started.elapsed();
    // Never cached: a file whose data was never fetched, a directory never listed.
    let t0 = Instant::now();
    assert_eq!(
        errno(std::fs::read(t.m("d/unread"))),
        Some(libc::ETIMEDOUT),
        "a file never fetched"
    );
    assert_eq!(
        errno(std::fs::metadata(t.m("cold/x"))),
        Some(libc::ETIMEDOUT),
        "a name in a directory never listed"
    );
    let misses_took = t0.elapsed();
    assert!(
        misses_took < Duration::from_secs(15),
        "misses fail after a short wait, not reconnect_timeout (30 s): {misses_took:?}"
    );
    eprintln!("cached reads while cut: {cached_took:?}; two misses: {misses_took:?}");

    t.restore();
    // Revalidated on reconnection: the server's new version.
    eventually("the server's change after reconnecting", || {
        std::fs::read(t.m("f")).is_ok_and(|d| d == b"changed on the server")
    });
    assert_eq!(std::fs::read(t.m("d/unread")).unwrap(), b"never");
    assert_eq!(std::fs::read(t.m("cold/x")).unwrap(), b"cold");
    assert_eq!(read_all(&t), want);
    // Callbacks flow again.
    std::fs::write(t.s("later"), b"l").unwrap();
    eventually("a server-side change after reconnecting", || {
        t.m("later").exists()
    });
}

/// `-o disconnected=off`: the behaviour without disconnected operation, EIO for what needs
/// the server once `reconnect_timeout` has passed, cached files included.
#[test]
fn disconnected_off_gives_eio() {
    if !can_mount() {
        return;
    }
    let t = Mount::start("disconnected=off,reconnect_timeout=1");
    sh_ok(&t.src, "mkdir d && printf one > d/a");
    eventually("the tree shows", || t.m("d/a").exists());
    assert_eq!(std::fs::read(t.m("d/a")).unwrap(), b"one");
    t.cut();
    // Polled here rather than with `eventually`: a failure shows the last read's result and
    // time, and the daemon's log (reconnection attempts).
    let start = Instant::now();
    loop {
        let t0 = Instant::now();
        let r = std::fs::read(t.m("d/a"));
        if errno_of(&r) == Some(libc::EIO) {
            break;
        }
        assert!(
            start.elapsed() < WAIT,
            "not within {WAIT:?}: EIO for a cached file; last read: {r:?} in {:?}; log:\n{}",
            t0.elapsed(),
            t.log_text()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // Polled too: the containers are invalidated at once by the connection's reader, the
    // cache forgets its listings when the notifier thread applies the loss's Overflow, which
    // load delays (a listing from the cache right after the EIO above failed 4 of 85 runs).
    eventually("EIO for a cached directory's listing", || {
        errno(std::fs::read_dir(t.m("d")).and_then(|r| r.collect::<Result<Vec<_>, _>>()))
            == Some(libc::EIO)
    });
    t.restore();
    eventually("back after reconnecting", || {
        std::fs::read(t.m("d/a")).is_ok_and(|d| d == b"one")
    });
}

/// The modification log of the mount's cache directory (one `cml-*` directory).
fn log_dir(t: &Mount) -> PathBuf {
    let dirs: Vec<PathBuf> = std::fs::read_dir(&t.cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("cml-"))
        .collect();
    assert_eq!(dirs.len(), 1, "one modification log: {dirs:?}");
    dirs[0].clone()
}

/// `cp -r` of a small tree into the mount while cut off, then renames, removals, a chmod and
/// a symlink: all answered locally (the copy reads back equal to the native one at once) and
/// logged (0600, fsync'ed); once the connection is back, reintegrated in order, so the
/// server's tree equals a native copy with the same changes, and the log is gone.
#[test]
fn a_copy_made_while_disconnected_is_reintegrated() {
    if !can_mount() {
        return;
    }
    let t = Mount::start("reconnect_timeout=30");
    let base = t.dir.path();
    sh_ok(
        base,
        "mkdir -p native/sub/deeper native/empty && printf hello > native/a && : > native/zero \
         && head -c 300000 /dev/urandom > native/sub/big && printf x > native/sub/deeper/x && \
         chmod 640 native/a && chmod 700 native/sub/deeper && ln -s ../a native/sub/link",
    );
    sh_ok(&t.src, "mkdir inbox && printf keep > inbox/kept");
    eventually("the tree shows", || t.m("inbox/kept").exists());
    // Listed, until a listing needs no round trip (the callbacks of its making have come):
    // a name missing from a complete listing is known missing while cut off.
    eventually("inbox listed with no round trip", || {
        let before = t.calls();
        assert_eq!(std::fs::read_dir(t.m("inbox")).unwrap().count(), 1);
        assert!(!t.m("inbox/copy").exists());
        t.calls() == before
    });
    t.cut();
    let changes = "cp -r native {d}/copy && mv {d}/copy/a {d}/copy/a2 && rm {d}/copy/zero && \
                   chmod 600 {d}/copy/sub/big && mkdir {d}/copy/gone && rmdir {d}/copy/gone && \
                   ln -s a2 {d}/copy/toa2 && printf more >> {d}/copy/sub/deeper/x";
    let started = Instant::now();
    sh_ok(
        base,
        &changes.replace("{d}", &t.m("inbox").display().to_string()),
    );
    let took = started.elapsed();
    sh_ok(
        base,
        &format!("mkdir expected && {}", changes.replace("{d}", "expected")),
    );
    // Served locally while cut off, equal to the native copy.
    assert_eq!(tree(&t.m("inbox/copy")), tree(&base.join("expected/copy")));
    assert!(
        !t.s("inbox/copy").exists(),
        "nothing reached the server yet"
    );
    let log = log_dir(&t);
    {
        use std::os::unix::fs::PermissionsExt;
        let m = std::fs::metadata(log.join("log")).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
        assert!(m.len() > 8, "records logged");
    }
    eprintln!("cp -r and changes while cut off: {took:?}");
    t.restore();
    eventually("the copy reintegrated on the server", || {
        t.s("inbox/copy/sub/deeper/x").exists() && !log.join("log").exists()
    });
    assert_eq!(tree(&t.s("inbox/copy")), tree(&base.join("expected/copy")));
    // Through the mount once the reconnection's Overflow has been applied: every name the
    // walk finds answers (no ENOENT or ESTALE for a moment right after the log is gone).
    let want = tree(&base.join("expected/copy"));
    eventually("the copy through the mount", || {
        match try_tree(&t.m("inbox/copy")) {
            Ok(got) => got == want,
            Err(e) => panic!("right after the reintegration, through the mount: {e}"),
        }
    });
    assert_eq!(std::fs::read(t.s("inbox/kept")).unwrap(), b"keep");
    assert!(t.log_text().contains("reintegrating"), "{}", t.log_text());
}

/// The same file changed on the server and on the client while cut off: neither version is
/// lost. The server's stays at its name, the client's is kept beside it as
/// `name.dircache-conflict-TIME`, the conflict is logged and listed in the log directory's
/// `conflicts`; a file changed only on the client is stored at its name.
#[test]
fn a_conflict_keeps_both_versions() {
    if !can_mount() {
        return;
    }
    let t = Mount::start("reconnect_timeout=30,metrics=127.0.0.1:0");
    sh_ok(&t.src, "printf base > both && printf base > mine");
    eventually("the files show", || t.m("mine").exists());
    // Read until the callbacks of their creation have come (no round trip), then opened for
    // writing (granted by the server) before the cut.
    eventually("containers valid with no round trip", || {
        let before = t.calls();
        for f in ["both", "mine"] {
            assert_eq!(std::fs::read(t.m(f)).unwrap(), b"base");
        }
        t.calls() == before
    });
    for f in ["both", "mine"] {
        drop(
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(t.m(f))
                .unwrap(),
        );
    }
    t.cut();
    std::fs::write(t.s("both"), b"the server's version").unwrap();
    std::fs::write(t.m("both"), b"the client's version").unwrap();
    std::fs::write(t.m("mine"), b"changed on the client only").unwrap();
    assert_eq!(std::fs::read(t.m("both")).unwrap(), b"the client's version");
    t.restore();
    let conflict = || {
        std::fs::read_dir(&t.src)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .find(|n| n.starts_with("both.dircache-conflict-"))
    };
    // Its name shows before its data is written (a CI dry run read it empty once).
    eventually("the conflict's copy on the server", || {
        conflict()
            .is_some_and(|k| std::fs::read(t.s(&k)).is_ok_and(|d| d == b"the client's version"))
    });
    let kept = conflict().unwrap();
    assert_eq!(std::fs::read(t.s("both")).unwrap(), b"the server's version");
    eventually("the client-only change stored", || {
        std::fs::read(t.s("mine")).is_ok_and(|d| d == b"changed on the client only")
    });
    eventually("both versions through the mount", || {
        std::fs::read(t.m("both")).is_ok_and(|d| d == b"the server's version")
            && std::fs::read(t.m(&kept)).is_ok_and(|d| d == b"the client's version")
    });
    assert!(t.log_text().contains("conflict"), "{}", t.log_text());
    let listed = std::fs::read_to_string(log_dir(&t).join("conflicts")).unwrap();
    assert_eq!(listed.lines().count(), 1, "{listed}");
    assert!(listed.contains(&format!("\tboth\t{kept}\t")), "{listed}");
    let out = Command::new(BIN)
        .arg("conflicts")
        .arg(&t.mnt)
        .arg("--cache-dir")
        .arg(&t.cache)
        .output()
        .expect("dircache conflicts");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(
        text.starts_with(&format!(
            "both: changed on the server; the local version is {kept}"
        )),
        "{text}"
    );
    // Counted in `dircache stats` and on the metrics endpoint.
    let stats = |json: bool| {
        let mut c = Command::new(BIN);
        c.arg("stats");
        if json {
            c.arg("--json");
        }
        let out = c.arg(&t.mnt).output().expect("dircache stats");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let v: serde_json::Value = serde_json::from_str(&stats(true)).unwrap();
    let b = &v["backend"];
    assert_eq!(b["conflicts"], 1, "{b}");
    assert_eq!(b["disconnections"], 1, "{b}");
    assert!(b["reintegrated"].as_u64().unwrap() >= 2, "{b}");
    let human = stats(false);
    assert!(human.contains(", 1 conflicts"), "{human}");
    let addr: std::net::SocketAddr = v["metrics"].as_str().expect("metrics").parse().unwrap();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    use std::io::{Read, Write};
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    assert!(
        body.lines()
            .any(|l| l == "dircache_remote_conflicts_total 1"),
        "{body}"
    );
}

/// The client killed (SIGKILL) while cut off with logged changes: nothing closed before the
/// kill is lost. The next mount of the same tree replays the log left in the cache
/// directory on its first connection, once: the server gets every change, and a file
/// appended to while cut off has its appended bytes once.
#[test]
fn a_log_left_by_a_killed_client_is_replayed_by_the_next_mount() {
    if !can_mount() {
        return;
    }
    let mut t = Mount::start("reconnect_timeout=30");
    sh_ok(&t.src, "mkdir inbox && printf base > inbox/grow");
    eventually("the tree shows", || t.m("inbox/grow").exists());
    eventually("inbox listed and grow cached with no round trip", || {
        let before = t.calls();
        assert_eq!(std::fs::read_dir(t.m("inbox")).unwrap().count(), 1);
        assert!(!t.m("inbox/new").exists());
        assert_eq!(std::fs::read(t.m("inbox/grow")).unwrap(), b"base");
        t.calls() == before
    });
    drop(
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(t.m("inbox/grow"))
            .unwrap(),
    );
    t.cut();
    sh_ok(
        t.dir.path(),
        "mkdir mnt/inbox/new && printf one > mnt/inbox/new/f && printf +more >> \
         mnt/inbox/grow && mv mnt/inbox/new/f mnt/inbox/new/g",
    );
    t.crash();
    assert!(
        !t.s("inbox/new").exists(),
        "nothing reached the server before the kill"
    );
    t.restore();
    t.spawn();
    eventually("the log replayed by the next mount", || {
        std::fs::read(t.s("inbox/new/g")).is_ok_and(|d| d == b"one")
    });
    assert!(!t.s("inbox/new/f").exists());
    assert_eq!(std::fs::read(t.s("inbox/grow")).unwrap(), b"base+more");
    assert_eq!(std::fs::read(t.m("inbox/grow")).unwrap(), b"base+more");
    assert_eq!(std::fs::read(t.m("inbox/new/g")).unwrap(), b"one");
    assert!(
        !log_dir(&t).join("log").exists(),
        "the log is gone once replayed"
    );
}

/// The records in a modification log file (its framing: docs/remote.md, "The client
/// modification log": an 8-byte header, then `len` u32 LE, an 8-byte check, the body).
fn logged_records(log: &Path) -> usize {
    let b = std::fs::read(log).unwrap_or_default();
    let (mut n, mut at) = (0, 8);
    while at + 12 <= b.len() {
        let len = u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize;
        at += 12 + len;
        n += 1;
    }
    n
}

/// Replays begun so far (lines of the log's replay journal).
fn begun(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("replay"))
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

/// The client killed (SIGKILL, by PID) again and again in the middle of reintegrating a
/// long log, once on the reconnection of a live mount and then during the replay each next
/// mount makes before it appears, each time right after a record was applied on the server
/// and before it was marked done (the test-only pause `DIRCACHE_TEST_REPLAY_DELAY_MS` sits
/// there): nothing is lost or applied twice. The server's tree equals the same commands run
/// natively: appends once, no conflict copy of the client's own writes, renames and
/// symlinks not failing the rest.
#[test]
fn a_client_killed_in_the_middle_of_reintegration_applies_each_change_once() {
    if !can_mount() {
        return;
    }
    let slow = [("DIRCACHE_TEST_REPLAY_DELAY_MS", "300")];
    let mut t = Mount::start_with("reconnect_timeout=30", &slow);
    let base = &t.dir.path().to_path_buf();
    sh_ok(
        base,
        "mkdir -p native/sub && printf hello > native/a && printf bee > native/b && printf c \
         > native/sub/c && ln -s ../a native/sub/link && mkdir -p expected/inbox && printf \
         base > expected/inbox/grow && printf old > expected/inbox/keep",
    );
    sh_ok(
        &t.src,
        "mkdir inbox && printf base > inbox/grow && printf old > inbox/keep",
    );
    eventually("the tree shows", || t.m("inbox/keep").exists());
    eventually("inbox listed and grow cached with no round trip", || {
        let before = t.calls();
        assert_eq!(std::fs::read_dir(t.m("inbox")).unwrap().count(), 2);
        assert!(!t.m("inbox/copy").exists());
        assert_eq!(std::fs::read(t.m("inbox/grow")).unwrap(), b"base");
        t.calls() == before
    });
    drop(
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(t.m("inbox/grow"))
            .unwrap(),
    );
    t.cut();
    let changes = "cp -r native {d}/copy && mv {d}/copy/a {d}/copy/a2 && printf +more >> \
                   {d}/grow && printf +again >> {d}/copy/a2 && rm {d}/copy/b && chmod 600 \
                   {d}/copy/sub/c && ln -s a2 {d}/copy/toa2 && mkdir {d}/copy/gone && rmdir \
                   {d}/copy/gone && for i in 1 2 3 4 5 6; do printf $i >> {d}/copy/n; done && \
                   mv {d}/copy/sub {d}/copy/sub2 && printf +third >> {d}/grow && printf \
                   +last >> {d}/copy/sub2/c";
    sh_ok(
        base,
        &changes.replace("{d}", &t.m("inbox").display().to_string()),
    );
    sh_ok(base, &changes.replace("{d}", "expected/inbox"));
    let dir = log_dir(&t);
    let n = logged_records(&dir.join("log"));
    assert!(n >= 20, "a long log: {n} records");
    // Kill points: a few records in, on the reconnection of the live mount; then further
    // on, each during the replay of the next mount's first connection.
    let points = [2, n / 3, n / 2, 2 * n / 3, n - 2];
    t.restore();
    let mut cut_short = 0;
    for (i, &k) in points.iter().enumerate() {
        if i > 0 {
            t.spawn_with(&slow, false);
        }
        eventually(&format!("{k} of {n} records begun"), || begun(&dir) >= k);
        t.crash();
        if dir.join("log").exists() {
            cut_short += 1;
        }
    }
    assert_eq!(cut_short, points.len(), "every kill cut a replay short");
    assert_ne!(
        std::fs::read(t.s("inbox/copy/sub2/c")).ok().as_deref(),
        Some(&b"c+last"[..]),
        "the last record was not replayed yet"
    );
    t.spawn();
    eventually("the rest replayed and the log gone", || {
        !dir.join("log").exists()
    });
    assert_eq!(tree(&t.s("inbox")), tree(&base.join("expected/inbox")));
    eventually("the same through the mount", || {
        try_tree(&t.m("inbox")).is_ok_and(|g| g == tree(&base.join("expected/inbox")))
    });
    assert!(
        !dir.join("conflicts").exists(),
        "no conflict: {}",
        std::fs::read_to_string(dir.join("conflicts")).unwrap_or_default()
    );
    let text = t.log_text();
    assert!(
        text.contains("may be applied already"),
        "a record applied before a kill was met again:\n{text}"
    );
}

/// Run `script` with `sh -c` as `uid` (gid `uid`, no supplementary groups).
fn sh_as(uid: u32, script: &str) -> std::process::Output {
    Command::new("setpriv")
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={uid}"))
        .args(["--clear-groups", "sh", "-c", script])
        .output()
        .expect("setpriv sh")
}

/// Audit (docs/security.md P10b): the copy a conflict keeps of a writer's local version is
/// private to that writer. The file it was changed from may be private (0600) or have a
/// POSIX ACL denying other users what its mode bits allow; the copy is a new file, which gets
/// neither the ACL nor, before, those bits: it was created 0666 (a file opened while
/// disconnected was logged with mode 0666 and umask 0), and user 1001 read (and could have
/// written) user 1000's private edits from the copy on the server.
#[test]
fn a_conflict_copy_is_private_to_its_writer() {
    if !can_mount() {
        return;
    }
    let t = Mount::start("reconnect_timeout=30");
    sh_ok(
        &t.src,
        "mkdir d && printf base > d/acl && printf base > d/own && chown -R 1000:1000 d \
         && chmod 755 d && chmod 644 d/acl && chmod 600 d/own && setfacl -m u:1001:--- d/acl",
    );
    let names = ["acl", "own"];
    for n in names {
        // The oracle: natively, 1001 may not read the file.
        let native = t.s(&format!("d/{n}"));
        assert!(!sh_as(1001, &format!("cat {}", native.display()))
            .status
            .success());
        let f = t.m(&format!("d/{n}"));
        eventually("the file shows", || f.exists());
        // User 1000's opens granted by the server (read, then read-write) before the cut.
        eventually("a container valid with no round trip", || {
            let before = t.calls();
            let o = sh_as(1000, &format!("cat {}", f.display()));
            assert!(o.status.success(), "{o:?}");
            t.calls() == before
        });
        let o = sh_as(1000, &format!("exec 3<>{}", f.display()));
        assert!(o.status.success(), "{o:?}");
    }
    t.cut();
    for n in names {
        std::fs::write(t.s(&format!("d/{n}")), b"the server's version").unwrap();
        let f = t.m(&format!("d/{n}"));
        let o = sh_as(1000, &format!("printf 'my private edit' > {}", f.display()));
        assert!(o.status.success(), "write while disconnected: {o:?}");
    }
    t.restore();
    let mut leaks = Vec::new();
    for n in names {
        let copy = || {
            std::fs::read_dir(t.s("d"))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .find(|k| k.starts_with(&format!("{n}.dircache-conflict-")))
        };
        dircache_tests::remote::eventually_or("the conflict's copy on the server", || {
            if copy().is_some_and(|k| {
                std::fs::read(t.s(&format!("d/{k}"))).is_ok_and(|d| d == b"my private edit")
            }) {
                Ok(())
            } else {
                Err(format!(
                    "{n}: {:?}\n{}",
                    std::fs::read_dir(t.s("d"))
                        .unwrap()
                        .map(|e| e.unwrap().file_name())
                        .collect::<Vec<_>>(),
                    t.log_text()
                ))
            }
        });
        let kept = t.s(&format!("d/{}", copy().unwrap()));
        use std::os::unix::fs::MetadataExt;
        let md = std::fs::metadata(&kept).unwrap();
        assert_eq!(md.uid(), 1000, "the copy is its writer's");
        let read = sh_as(1001, &format!("cat {}", kept.display()));
        if read.status.success() {
            leaks.push(format!(
                "user 1001, whom the original {n} denies, read its conflict copy (mode {:o}): {:?}",
                md.mode() & 0o7777,
                String::from_utf8_lossy(&read.stdout)
            ));
        }
        // Its writer reads it.
        assert!(sh_as(1000, &format!("cat {}", kept.display()))
            .status
            .success());
    }
    assert!(leaks.is_empty(), "{leaks:#?}");
}

/// Audit (docs/security.md P10b): a conflict copy's name can be guessed (the time), so
/// another user with write access to the directory can put files there first. The writer's
/// data must never go into such a file: before, the copy was opened with O_CREAT | O_TRUNC,
/// and user 1000's private edits went into user 1001's own 0666 file.
#[test]
fn a_conflict_copy_never_goes_into_a_planted_file() {
    if !can_mount() {
        return;
    }
    let t = Mount::start("reconnect_timeout=30");
    sh_ok(
        &t.src,
        "mkdir d && printf base > d/own && chown -R 1000:1000 d && chmod 777 d \
         && chmod 600 d/own",
    );
    let f = t.m("d/own");
    eventually("the file shows", || f.exists());
    eventually("a container valid with no round trip", || {
        let before = t.calls();
        assert!(sh_as(1000, &format!("cat {}", f.display()))
            .status
            .success());
        t.calls() == before
    });
    assert!(sh_as(1000, &format!("exec 3<>{}", f.display()))
        .status
        .success());
    t.cut();
    // User 1001 plants the names of the next minutes, world-writable.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let o = sh_as(
        1001,
        &format!(
            "umask 0; cd {} && t={} && while [ $t -lt {} ]; do : > own.dircache-conflict-$t; \
             t=$((t+1)); done",
            t.s("d").display(),
            now - 5,
            now + 600
        ),
    );
    assert!(o.status.success(), "{o:?}");
    std::fs::write(t.s("d/own"), b"the server's version").unwrap();
    let o = sh_as(1000, &format!("printf 'my private edit' > {}", f.display()));
    assert!(o.status.success(), "write while disconnected: {o:?}");
    t.restore();
    use std::os::unix::fs::MetadataExt;
    let holders = || -> Vec<(String, u32)> {
        std::fs::read_dir(t.s("d"))
            .unwrap()
            .filter_map(|e| {
                let p = e.unwrap().path();
                let d = std::fs::read(&p).ok()?;
                (d == b"my private edit").then(|| {
                    let uid = std::fs::metadata(&p).unwrap().uid();
                    (p.file_name().unwrap().to_string_lossy().into_owned(), uid)
                })
            })
            .collect()
    };
    eventually("the local version on the server", || !holders().is_empty());
    let h = holders();
    assert!(
        h.iter().all(|(_, uid)| *uid == 1000),
        "the private edit went into another user's file: {h:?}"
    );
}
