//! The harness of the remote-mount tests (crates/cli/tests/remote_*.rs): `dircache mount
//! localhost:SRC MNT -f` as a child of the test, whose `ssh_command` is a stand-in for ssh
//! that runs the remote command line here (the ssh path is exercised without sshd; the
//! tests over a real sshd use [`crate::sshd`]), the server `dircache serve --stdio SRC` its
//! child.
//!
//! - [`Remote`]: a served tree in a temporary directory (0755, so other users reach it):
//!   `src`, a container cache directory `cache`, the stand-in ssh and the server's command.
//!   The stand-in records its arguments (`ssh-args`) and the server's PID (`server-pid`, the
//!   latest connection's), and refuses to connect while a file `down` exists (as an
//!   unreachable host would). The server logs at `info` to `server.log` (its search calls and
//!   `connection ends after N calls`); [`Remote::serve_as`] runs it as another user.
//! - [`Client`]: one `dircache mount` of a remote ([`Remote::mount`]), a
//!   [`ChildMount`]: Drop unmounts and reaps the daemon, stopping it by PID if it lingers.
//!   The daemon traces every remote call (one `remote call` line in `log`, counted by
//!   [`Client::calls`]).
//! - [`RemoteMount`]: the common case, one mount of its own remote (derefs to the [`Remote`]).
//! - [`eventually`]: wait for something asynchronous (a callback, a log line), polling with
//!   a generous bound ([`WAIT`]) instead of sleeping.
//!
//! The `dircache` binary is the one cargo built for the calling test ([`dircache_bin`]).

use std::ops::Deref;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::child_mount::ChildMount;

/// The longest wait for something asynchronous (generous: CI runs on a loaded 2-core machine).
pub const WAIT: Duration = Duration::from_secs(20);

/// The longest wait for a mount to come up.
const MOUNT_WAIT: Duration = Duration::from_secs(60);

/// The daemon's log filter: every remote call (trace) and what containers do (debug).
const CLIENT_LOG: &str = "dircache_remote::client=trace,dircache_remote::client::container=debug";

/// The `dircache` binary cargo built for the calling test: `CARGO_BIN_EXE_dircache`, which
/// cargo sets when it runs the CLI's integration tests; else the binary next to the test
/// executable's `deps` directory (a test binary run by hand).
pub fn dircache_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("CARGO_BIN_EXE_dircache") {
        return p.into();
    }
    let exe = std::env::current_exe().expect("the test executable");
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|profile| profile.join("dircache"))
        .filter(|b| b.exists());
    bin.unwrap_or_else(|| panic!("no dircache binary next to {}", exe.display()))
}

/// Wait until `cond` holds, at most [`WAIT`]; returns how long it took.
pub fn eventually(what: &str, mut cond: impl FnMut() -> bool) -> Duration {
    eventually_or(what, || if cond() { Ok(()) } else { Err(String::new()) })
}

/// Wait until `cond` holds, at most `limit`; returns how long it took.
pub fn eventually_within(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) -> Duration {
    poll(limit, what, || {
        if cond() {
            Ok(())
        } else {
            Err(String::new())
        }
    })
}

/// Wait until `probe` returns `Ok`, at most [`WAIT`]; the failure names `what` and the last
/// state `probe` described.
pub fn eventually_or(what: &str, probe: impl FnMut() -> Result<(), String>) -> Duration {
    poll(WAIT, what, probe)
}

/// Poll `probe` until it is `Ok` or `limit` passes (then panic). The steps grow with the
/// wait (a twentieth of it, 1 to 5 ms): a quick event is timed to the millisecond, a
/// latency within 5 %, and a slow one does not keep a core busy.
fn poll(limit: Duration, what: &str, mut probe: impl FnMut() -> Result<(), String>) -> Duration {
    let t0 = Instant::now();
    loop {
        match probe() {
            Ok(()) => return t0.elapsed(),
            Err(state) if t0.elapsed() >= limit => panic!("not within {limit:?}: {what}; {state}"),
            Err(_) => std::thread::sleep(
                (t0.elapsed() / 20).clamp(Duration::from_millis(1), Duration::from_millis(5)),
            ),
        }
    }
}

/// `n` pseudo-random bytes from `seed` (xorshift): file contents that compress badly and
/// differ between seeds.
pub fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A small fsx in Python: random writes, reads, truncations, appends, reopenings and syncs on
/// one file under a mount and on a native file, every read and size compared (the script
/// asserts; it prints "done" at the end). The bounds shape the file's sizes and I/O lengths.
pub struct Fsx {
    /// Random seed (the environment's `FSX_SEED` overrides it).
    pub seed: u32,
    /// Initial size of both files.
    pub size: u32,
    /// Operations.
    pub ops: u32,
    /// Writes start below this offset and are shorter than `write_len`.
    pub write_at: u32,
    pub write_len: u32,
    /// Reads start below this offset and are shorter than `read_len`.
    pub read_at: u32,
    pub read_len: u32,
    /// Truncations are to a size below this.
    pub truncate_to: u32,
}

impl Fsx {
    /// The script for the native file `native` and the file `mnt` under the mount.
    pub fn script(&self, native: &Path, mnt: &Path) -> String {
        let Fsx {
            seed,
            size,
            ops,
            write_at,
            write_len,
            read_at,
            read_len,
            truncate_to,
        } = self;
        format!(
            r#"
import os, random
seed = int(os.environ.get("FSX_SEED", "{seed}"))
rnd = random.Random(seed)
paths = ["{native}", "{mnt}"]
init = bytes(rnd.getrandbits(8) for _ in range({size}))
for p in paths:
    with open(p, "wb") as f: f.write(init)
def opn(flags):
    return [os.open(p, flags) for p in paths]
fds = opn(os.O_RDWR)
for i in range({ops}):
    op = rnd.randrange(10)
    if op < 3:
        off = rnd.randrange({write_at}); n = rnd.randrange(1, {write_len})
        data = bytes(rnd.getrandbits(8) for _ in range(min(n, 64))) * (n // 64 + 1)
        for fd in fds: os.pwrite(fd, data[:n], off)
    elif op < 6:
        off = rnd.randrange({read_at}); n = rnd.randrange(1, {read_len})
        a, b = [os.pread(fd, n, off) for fd in fds]
        assert a == b, f"op {{i}}: read {{n}} at {{off}} differs (seed {{seed}})"
    elif op == 6:
        size = rnd.randrange({truncate_to})
        for fd in fds: os.ftruncate(fd, size)
    elif op == 7:
        a, b = [os.fstat(fd).st_size for fd in fds]
        c, d = [os.stat(p).st_size for p in paths]
        assert a == b == c == d, f"op {{i}}: sizes {{a}} {{b}} {{c}} {{d}} (seed {{seed}})"
    elif op == 8:
        for fd in fds: os.close(fd)
        fds = opn(rnd.choice([os.O_RDWR, os.O_RDWR | os.O_APPEND]))
        data = b"appended %d" % i
        for fd in fds: os.write(fd, data)
    else:
        for fd in fds: os.fsync(fd)
for fd in fds: os.close(fd)
print("done")
"#,
            native = native.display(),
            mnt = mnt.display()
        )
    }
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", p.display()));
}

fn write_script(p: &Path, text: &str) {
    std::fs::write(p, text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    chmod(p, 0o755);
}

/// Write the stand-in for ssh as `dir/fake-ssh` and return its path (for `-o ssh_command=`):
/// it refuses while `dir/down` exists, records its arguments in `dir/ssh-args` and its PID
/// (the server's, as it execs it) in `dir/server-pid`, and runs its last argument (the
/// remote command line) with `sh`.
pub fn stand_in_ssh(dir: &Path) -> PathBuf {
    let fake = dir.join("fake-ssh");
    write_script(
        &fake,
        &format!(
            "#!/bin/sh\n\
             # A stand-in for ssh: run the remote command here.\n\
             if [ -e '{down}' ]; then echo 'fake ssh: host unreachable' >&2; exit 255; fi\n\
             printf '%s\\n' \"$@\" > '{args}'\n\
             for last; do :; done\n\
             echo $$ > '{pid}'\n\
             exec sh -c \"exec $last\"\n",
            down = dir.join("down").display(),
            args = dir.join("ssh-args").display(),
            pid = dir.join("server-pid").display(),
        ),
    );
    fake
}

/// A served tree, its cache directory and the commands that reach it; see the module
/// documentation. Mounts ([`Client`]s) must be dropped before it (declare them after it).
pub struct Remote {
    pub dir: tempfile::TempDir,
    /// The served tree (0755).
    pub src: PathBuf,
    /// The mounts' container cache directory (`cache_dir=`, 0700).
    pub cache: PathBuf,
    ssh: PathBuf,
    serve: PathBuf,
    /// What the server's command runs the binary through (`setpriv ...`, [`Remote::serve_as`]).
    serve_prefix: String,
    /// Flags added to `dircache serve` ([`Remote::serve_flags`]).
    serve_flags: String,
}

impl Default for Remote {
    fn default() -> Self {
        Remote::new()
    }
}

impl Remote {
    /// An empty SRC, served by root.
    pub fn new() -> Remote {
        let dir = tempfile::Builder::new()
            .prefix("dcremote")
            .tempdir()
            .expect("tempdir");
        let src = dir.path().join("src");
        let cache = dir.path().join("cache");
        for d in [&src, &cache] {
            std::fs::create_dir(d).expect("mkdir");
        }
        chmod(dir.path(), 0o755);
        chmod(&src, 0o755);
        chmod(&cache, 0o700);
        let ssh = stand_in_ssh(dir.path());
        let serve = dir.path().join("serve");
        let r = Remote {
            dir,
            src,
            cache,
            ssh,
            serve,
            serve_prefix: String::new(),
            serve_flags: String::new(),
        };
        r.write_serve();
        r
    }

    /// Run the server as `uid` (group `uid`, no other groups; through setpriv) over an SRC
    /// it owns (SRC is chowned, recursively).
    pub fn serve_as(&mut self, uid: u32) {
        let st = Command::new("chown")
            .arg("-R")
            .arg(format!("{uid}:{uid}"))
            .arg(&self.src)
            .status()
            .expect("chown");
        assert!(st.success(), "chown -R {uid} {}", self.src.display());
        self.serve_prefix = format!("setpriv --reuid={uid} --regid={uid} --clear-groups ");
        self.write_serve();
    }

    /// Add `flags` (e.g. `--no-cache`) to the server's command line, after its arguments.
    pub fn serve_flags(&mut self, flags: &str) {
        self.serve_flags = format!(" {flags}");
        self.write_serve();
    }

    /// The server's command (`serve_command=`): a script that logs to `server.log` and execs
    /// the binary (through the prefix) with its arguments and the flags, keeping its PID.
    fn write_serve(&self) {
        write_script(
            &self.serve,
            &format!(
                "#!/bin/sh\nDIRCACHE_LOG=info exec {prefix}'{bin}' \"$@\"{flags} 2>>'{log}'\n",
                prefix = self.serve_prefix,
                flags = self.serve_flags,
                bin = dircache_bin().display(),
                log = self.dir.path().join("server.log").display(),
            ),
        );
    }

    /// The server's command, as the mount passes it to ssh.
    pub fn serve_command(&self) -> &Path {
        &self.serve
    }

    /// A path in SRC.
    pub fn s(&self, rel: &str) -> PathBuf {
        self.src.join(rel)
    }

    /// Mount the remote at `DIR/mnt<name>` with `extra` mount options (comma-separated, may
    /// be empty), its log in `DIR/client<name>.log`; returns once the mount answers.
    pub fn mount(&self, name: &str, extra: &str) -> Client {
        self.mount_with(name, extra, &[])
    }

    /// [`Remote::mount`] with `env` added to the daemon's environment.
    pub fn mount_with(&self, name: &str, extra: &str, env: &[(&str, &str)]) -> Client {
        let (cmd, mnt, log) = self.mount_command(name, extra, env);
        let daemon = ChildMount::start(cmd, &mnt, &log, MOUNT_WAIT)
            .unwrap_or_else(|e| panic!("dircache mount {}: {e}", mnt.display()));
        Client { mnt, log, daemon }
    }

    /// Start the daemon of mount `name` again (after [`Client::kill9`]), its output appended
    /// to the same log; with `wait`, return once the mount answers, else at once (a daemon
    /// replays a log left behind before it mounts, and may be killed in the middle of it).
    pub fn remount_with(
        &self,
        name: &str,
        extra: &str,
        env: &[(&str, &str)],
        wait: bool,
    ) -> Client {
        let (cmd, mnt, log) = self.mount_command(name, extra, env);
        let mut daemon = ChildMount::spawn(cmd, &mnt, &log)
            .unwrap_or_else(|e| panic!("dircache mount {}: {e}", mnt.display()));
        if wait {
            daemon
                .wait_mounted(MOUNT_WAIT)
                .unwrap_or_else(|e| panic!("dircache mount {}: {e}", mnt.display()));
        }
        Client { mnt, log, daemon }
    }

    /// The `dircache mount -f` command of mount `name`, its mount point and its log.
    fn mount_command(
        &self,
        name: &str,
        extra: &str,
        env: &[(&str, &str)],
    ) -> (Command, PathBuf, PathBuf) {
        let mnt = self.dir.path().join(format!("mnt{name}"));
        let log = self.dir.path().join(format!("client{name}.log"));
        let mut opts = format!(
            "ssh_command={},serve_command={},cache_dir={}",
            self.ssh.display(),
            self.serve.display(),
            self.cache.display()
        );
        if !extra.is_empty() {
            opts.push(',');
            opts.push_str(extra);
        }
        let mut cmd = Command::new(dircache_bin());
        cmd.arg("mount")
            .arg("-f")
            .arg(format!("localhost:{}", self.src.display()))
            .arg(&mnt)
            .arg("-o")
            .arg(opts)
            .env("DIRCACHE_LOG", CLIENT_LOG)
            .env("NO_COLOR", "1")
            .envs(env.iter().copied());
        (cmd, mnt, log)
    }

    /// The PID of the latest server (by the stand-in ssh).
    pub fn server_pid(&self) -> i32 {
        std::fs::read_to_string(self.dir.path().join("server-pid"))
            .expect("server pid")
            .trim()
            .parse()
            .expect("a pid")
    }

    /// Cut `c`'s connection: new connections are refused (the `down` file, as an
    /// unreachable host), the server is killed by PID, and `c` has seen its connection end.
    pub fn cut(&self, c: &Client) {
        const CLOSED: &str = "the server closed the connection";
        std::fs::write(self.dir.path().join("down"), b"").expect("down");
        let seen = c.log_text().matches(CLOSED).count();
        let pid = self.server_pid();
        // SAFETY: kill(2) of the server this test started (through the stand-in ssh), by PID.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0, "kill {pid}");
        eventually("the client sees its connection end", || {
            c.log_text().matches(CLOSED).count() > seen
        });
    }

    /// Let clients connect again (after [`Remote::cut`]).
    pub fn restore(&self) {
        std::fs::remove_file(self.dir.path().join("down")).expect("remove down");
    }

    /// What the servers logged so far.
    pub fn server_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// The remote's kept container directory (`r-...`), if there is one.
    pub fn kept_dir(&self) -> Option<PathBuf> {
        self.cache_entries()
            .into_iter()
            .find(|p| name_of(p).starts_with("r-"))
    }

    /// Per-mount container directories (`m...`) in the cache directory.
    pub fn per_mount_dirs(&self) -> Vec<PathBuf> {
        self.cache_entries()
            .into_iter()
            .filter(|p| name_of(p).starts_with('m'))
            .collect()
    }

    /// (name, size) of the container files in the kept directory, sorted.
    pub fn containers(&self) -> Vec<(String, u64)> {
        let Some(d) = self.kept_dir() else {
            return Vec::new();
        };
        let mut v: Vec<(String, u64)> = entries(&d)
            .into_iter()
            .map(|p| (name_of(&p), std::fs::metadata(&p).map_or(0, |m| m.len())))
            .filter(|(n, _)| n.starts_with('c'))
            .collect();
        v.sort();
        v
    }

    /// Bytes of the files in the cache directory's container directories now.
    pub fn cached_bytes(&self) -> u64 {
        self.cache_entries()
            .iter()
            .filter(|d| d.is_dir())
            .flat_map(|d| entries(d))
            .map(|f| std::fs::metadata(f).map_or(0, |m| m.len()))
            .sum()
    }

    fn cache_entries(&self) -> Vec<PathBuf> {
        entries(&self.cache)
    }
}

impl Drop for Remote {
    /// The latest server, if it still runs once its clients are gone (it ends when its
    /// client hangs up; a test failing while the client is stuck may leave it): SIGKILL by
    /// PID, if that PID is still a server of this SRC.
    fn drop(&mut self) {
        let Ok(pid) = std::fs::read_to_string(self.dir.path().join("server-pid")) else {
            return;
        };
        let Ok(pid) = pid.trim().parse::<i32>() else {
            return;
        };
        let ours = std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
            let c = String::from_utf8_lossy(&c);
            c.contains("serve") && c.contains(&*self.src.to_string_lossy())
        });
        if ours {
            // SAFETY: kill(2) of this Remote's own server (through the stand-in ssh), by PID.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// The entries of `dir` (none if it cannot be read: a container directory removed meanwhile).
fn entries(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default()
}

fn name_of(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// One mount of a [`Remote`]: the `dircache mount -f` daemon and its log.
pub struct Client {
    pub mnt: PathBuf,
    /// The daemon's stdout and stderr (its trace of remote calls).
    pub log: PathBuf,
    daemon: ChildMount,
}

impl Client {
    /// A path in the mount.
    pub fn m(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// What the daemon logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Remote calls so far whose description contains `what` ("" = all).
    pub fn calls(&self, what: &str) -> usize {
        self.log_text()
            .lines()
            .filter(|l| l.contains("remote call") && l.contains(what))
            .count()
    }

    /// Calls so far that asked the server for file data: `Read`s, and opens asking for the
    /// first bytes with them (`OpenPlus` with `read` > 0).
    pub fn data_calls(&self) -> usize {
        self.calls("Read {") + self.calls("OpenPlus { read: ") - self.calls("OpenPlus { read: 0,")
    }

    /// Unmount and wait for the daemon to exit (its state written).
    pub fn unmount(mut self) {
        self.stop();
    }

    /// Unmount and wait for the daemon to exit (what Drop does).
    pub fn stop(&mut self) {
        self.daemon.stop();
    }

    /// SIGKILL the daemon (by PID), then detach its dead mount.
    pub fn kill9(mut self) {
        self.daemon.kill();
    }

    /// Whether the daemon has exited (e.g. after an unmount by the test).
    pub fn daemon_exited(&mut self) -> bool {
        self.daemon.exited()
    }

    /// The daemon's PID while it runs (for a test's guard to stop it by PID).
    pub fn pid(&self) -> Option<u32> {
        self.daemon.pid()
    }
}

/// One mount of its own [`Remote`] (which it derefs to: `dir`, `src`, `cache`, `s()`,
/// `server_pid()`, ...). Drop unmounts and reaps the daemon, then removes the directory.
pub struct RemoteMount {
    pub mnt: PathBuf,
    /// The daemon's log.
    pub log: PathBuf,
    /// Declared before `remote`: unmounted before its directory goes.
    client: Client,
    remote: Remote,
}

impl Deref for RemoteMount {
    type Target = Remote;

    fn deref(&self) -> &Remote {
        &self.remote
    }
}

impl RemoteMount {
    /// Mount an empty SRC with `extra` mount options.
    pub fn start(extra: &str) -> RemoteMount {
        Self::start_as(extra, None)
    }

    /// With `server_uid`, the server runs as that user over an SRC it owns.
    pub fn start_as(extra: &str, server_uid: Option<u32>) -> RemoteMount {
        let mut remote = Remote::new();
        if let Some(uid) = server_uid {
            remote.serve_as(uid);
        }
        Self::over(remote, extra)
    }

    /// Mount a prepared remote (SRC filled, the server's user chosen).
    pub fn over(remote: Remote, extra: &str) -> RemoteMount {
        let client = remote.mount("", extra);
        RemoteMount {
            mnt: client.mnt.clone(),
            log: client.log.clone(),
            client,
            remote,
        }
    }

    /// A path in the mount.
    pub fn m(&self, rel: &str) -> PathBuf {
        self.client.m(rel)
    }

    /// What the daemon logged so far.
    pub fn log_text(&self) -> String {
        self.client.log_text()
    }

    /// Remote calls so far whose description contains `what` ("" = all).
    pub fn calls(&self, what: &str) -> usize {
        self.client.calls(what)
    }

    /// [`Client::data_calls`].
    pub fn data_calls(&self) -> usize {
        self.client.data_calls()
    }

    /// Write `name` on the server and wait until the mount shows it with that size: the
    /// tree was fetched at mount, so a name made on the server afterwards shows once its
    /// callback has come.
    pub fn put(&self, name: &str, data: impl AsRef<[u8]>) {
        let data = data.as_ref();
        std::fs::write(self.s(name), data).unwrap_or_else(|e| panic!("{name}: {e}"));
        let want = data.len() as u64;
        eventually(&format!("{name} seen through the mount"), || {
            std::fs::metadata(self.m(name)).is_ok_and(|m| m.len() == want)
        });
    }

    /// Unmount and wait for the daemon to exit.
    pub fn stop(&mut self) {
        self.client.stop();
    }

    /// Whether the daemon has exited (e.g. after an unmount by the test).
    pub fn daemon_exited(&mut self) -> bool {
        self.client.daemon_exited()
    }

    /// Unmount, wait for the server to end, and return how many calls it answered in all
    /// (its `connection ends after N calls` line).
    pub fn calls_at_unmount(mut self) -> u64 {
        self.stop();
        const END: &str = "connection ends after ";
        let mut calls = None;
        eventually_or("the server's call count", || {
            let log = self.server_log();
            let Some(i) = log.find(END) else {
                return Err(format!("no call count in the server log:\n{log}"));
            };
            let n: String = log[i + END.len()..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            calls = n.parse().ok();
            Ok(())
        });
        calls.expect("a call count")
    }
}
