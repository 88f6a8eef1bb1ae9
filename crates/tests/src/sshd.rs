//! A throwaway OpenSSH server on loopback for remote-tree tests and benchmarks.
//!
//! [`Sshd::start`] generates, in a fresh temporary directory, a host key, a client key pair
//! and an `authorized_keys` file, writes its own `sshd_config` (loopback only, a free port,
//! public-key authentication only, `PermitRootLogin prohibit-password`, `StrictModes no`,
//! `UsePAM no`, `UseDNS no`, the real `sftp-server` subsystem) and runs `/usr/sbin/sshd -D -e
//! -f CONFIG` as a child in its own process group. It returns once sshd logs that it listens.
//! Dropping it stops sshd (and the per-connection sshd processes it forked) by its process
//! group id, then removes the directory.
//!
//! Clients: [`Sshd::ssh_args`] is the ssh command line (`-F none`, no host key checking, the
//! generated key, the port; optionally a `ProxyCommand`), [`Sshd::ssh_options`] the same as
//! `Key=Value` pairs for `sshfs -o` / `dircache mount -o`. A [`crate::delay_proxy::DelayProxy`]
//! in front of [`Sshd::port`] adds latency: connect to the proxy's port instead.
//!
//! Needs Debian's `openssh-server` (and `openssh-client`); [`sshd_available`] says whether
//! they are installed, so tests can call their `cannot_run()` otherwise.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

pub const SSHD: &str = "/usr/sbin/sshd";
const SFTP_SERVER: &str = "/usr/lib/openssh/sftp-server";

/// Whether sshd, ssh and ssh-keygen are installed.
pub fn sshd_available() -> bool {
    Path::new(SSHD).exists() && which("ssh").is_some() && which("ssh-keygen").is_some()
}

/// The first `name` on PATH.
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// A started sshd for a test, or `None` (after [`crate::cannot_run`]: a failure under CI)
/// when openssh-server is not installed.
pub fn sshd_for_test() -> Option<Sshd> {
    if !sshd_available() {
        crate::cannot_run(
            "needs openssh-server and openssh-client (apt-get install openssh-server)",
        );
        return None;
    }
    Some(Sshd::start().unwrap_or_else(|e| panic!("sshd: {e}")))
}

/// Whether a test can mount with sshfs here (root, /dev/fuse, sshfs); if not, says so
/// through [`crate::cannot_run`] (a failure under CI).
pub fn can_mount_sshfs() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !Path::new("/dev/fuse").exists() {
        crate::cannot_run("needs root and /dev/fuse");
        return false;
    }
    if which("sshfs").is_none() {
        crate::cannot_run("needs sshfs (apt-get install sshfs)");
        return false;
    }
    true
}

/// A free TCP port on 127.0.0.1 (bound and released: another process may take it meanwhile,
/// which [`Sshd::start`] detects and retries).
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The lines sshd wrote on stderr so far, and whether it has exited.
#[derive(Default)]
struct Log {
    lines: Vec<String>,
    eof: bool,
}

/// sshd's stderr lines, shared with the thread reading them.
type SharedLog = Arc<(Mutex<Log>, Condvar)>;

/// A running sshd; see the module documentation.
pub struct Sshd {
    dir: tempfile::TempDir,
    port: u16,
    child: Option<Child>,
    log: SharedLog,
    user: String,
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let o = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{cmd:?}: {e}"))?;
    if !o.status.success() {
        return Err(format!(
            "{cmd:?}: {} {}",
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        ));
    }
    Ok(())
}

fn keygen(path: &Path) -> Result<(), String> {
    run(Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "dircache-test", "-f"])
        .arg(path))
}

/// The name of the user running this process (the one the client logs in as).
pub fn current_user() -> String {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    if uid == 0 {
        return "root".into();
    }
    Command::new("id")
        .arg("-un")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| uid.to_string())
}

impl Sshd {
    /// Start sshd on a free loopback port (see the module documentation). Errors are strings
    /// with sshd's log.
    pub fn start() -> Result<Sshd, String> {
        Sshd::start_in(&std::env::temp_dir())
    }

    /// As [`Sshd::start`], with the keys and config in a new directory under `parent`.
    pub fn start_in(parent: &Path) -> Result<Sshd, String> {
        if !sshd_available() {
            return Err("openssh-server is not installed (apt-get install openssh-server)".into());
        }
        // sshd insists on its privilege separation directory.
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 && !Path::new("/run/sshd").is_dir() {
            std::fs::create_dir_all("/run/sshd").map_err(|e| format!("mkdir /run/sshd: {e}"))?;
        }
        let mut dir = tempfile::Builder::new()
            .prefix("dircache-sshd-")
            .tempdir_in(parent)
            .map_err(|e| format!("tempdir: {e}"))?;
        keygen(&dir.path().join("host_ed25519"))?;
        keygen(&dir.path().join("client_ed25519"))?;
        std::fs::copy(
            dir.path().join("client_ed25519.pub"),
            dir.path().join("authorized_keys"),
        )
        .map_err(|e| format!("authorized_keys: {e}"))?;
        let mut last = String::new();
        for _attempt in 0..5 {
            let port = free_port().map_err(|e| format!("free port: {e}"))?;
            match Sshd::spawn(dir.path(), port) {
                Ok((child, log)) => {
                    let mut s = Sshd {
                        dir,
                        port,
                        child: Some(child),
                        log,
                        user: current_user(),
                    };
                    match s.wait_listening(Duration::from_secs(20)) {
                        Ok(()) => return Ok(s),
                        Err(e) => {
                            s.stop();
                            last = e;
                            // Another process took the port: try another.
                            if !last.contains("Address already in use") {
                                return Err(last);
                            }
                            dir = std::mem::replace(
                                &mut s.dir,
                                tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?,
                            );
                        }
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }

    fn spawn(dir: &Path, port: u16) -> Result<(Child, SharedLog), String> {
        let sftp = if Path::new(SFTP_SERVER).exists() {
            SFTP_SERVER
        } else {
            "internal-sftp"
        };
        let config = format!(
            "ListenAddress 127.0.0.1\n\
             Port {port}\n\
             HostKey {d}/host_ed25519\n\
             AuthorizedKeysFile {d}/authorized_keys\n\
             PidFile none\n\
             PermitRootLogin prohibit-password\n\
             PubkeyAuthentication yes\n\
             PasswordAuthentication no\n\
             KbdInteractiveAuthentication no\n\
             StrictModes no\n\
             UsePAM no\n\
             UseDNS no\n\
             PrintMotd no\n\
             MaxStartups 100:30:200\n\
             MaxSessions 100\n\
             LogLevel INFO\n\
             Subsystem sftp {sftp}\n",
            d = dir.display()
        );
        let cfg = dir.join("sshd_config");
        std::fs::write(&cfg, config).map_err(|e| format!("writing sshd_config: {e}"))?;
        let mut cmd = Command::new(SSHD);
        cmd.args(["-D", "-e", "-f"])
            .arg(&cfg)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // Its own process group: a terminal's ctrl-c does not reach it (Drop stops it), and
        // Drop can stop the connection processes it forked with it.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = cmd.spawn().map_err(|e| format!("starting {SSHD}: {e}"))?;
        let log: SharedLog = Arc::default();
        if let Some(err) = child.stderr.take() {
            let log = log.clone();
            std::thread::spawn(move || {
                for l in BufReader::new(err).lines() {
                    let Ok(l) = l else { break };
                    let (m, cv) = &*log;
                    m.lock().unwrap_or_else(|e| e.into_inner()).lines.push(l);
                    cv.notify_all();
                }
                let (m, cv) = &*log;
                m.lock().unwrap_or_else(|e| e.into_inner()).eof = true;
                cv.notify_all();
            });
        }
        Ok((child, log))
    }

    /// Wait until sshd logs "Server listening on" (or exits, or `limit` passes).
    fn wait_listening(&self, limit: Duration) -> Result<(), String> {
        let (m, cv) = &*self.log;
        let t0 = Instant::now();
        let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if g.lines.iter().any(|l| l.contains("Server listening on")) {
                return Ok(());
            }
            if g.eof {
                return Err(format!("sshd exited: {}", g.lines.join("\n")));
            }
            let left = limit.saturating_sub(t0.elapsed());
            if left.is_zero() {
                return Err(format!(
                    "sshd did not listen within {limit:?}: {}",
                    g.lines.join("\n")
                ));
            }
            g = cv
                .wait_timeout(g, left)
                .map(|r| r.0)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// The port sshd listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The user clients log in as (the current user).
    pub fn user(&self) -> &str {
        &self.user
    }

    /// `user@127.0.0.1`.
    pub fn destination(&self) -> String {
        format!("{}@127.0.0.1", self.user)
    }

    /// The client's private key.
    pub fn client_key(&self) -> PathBuf {
        self.dir.path().join("client_ed25519")
    }

    /// The temporary directory holding keys and config.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// sshd's log so far.
    pub fn log(&self) -> String {
        let (m, _) = &*self.log;
        m.lock().unwrap_or_else(|e| e.into_inner()).lines.join("\n")
    }

    /// The client options (besides the port) as `Key=Value` pairs, for `ssh -o`, `sshfs -o`
    /// and `dircache mount -o`: the generated key only, no known-hosts file, batch mode.
    pub fn ssh_options(&self) -> Vec<(String, String)> {
        [
            ("IdentityFile", self.client_key().display().to_string()),
            ("IdentitiesOnly", "yes".into()),
            ("StrictHostKeyChecking", "no".into()),
            ("UserKnownHostsFile", "/dev/null".into()),
            ("GlobalKnownHostsFile", "/dev/null".into()),
            ("BatchMode", "yes".into()),
            ("LogLevel", "ERROR".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// The client options for an sshfs-style mount command through `port` (`port=N` and
    /// [`Sshd::ssh_options`] as `Key=Value`), one per `-o`, e.g. for
    /// `dircache mount user@127.0.0.1:PATH MNT -o ...`.
    pub fn mount_options(&self, port: u16) -> Vec<String> {
        let mut v = vec![format!("port={port}")];
        v.extend(
            self.ssh_options()
                .into_iter()
                .map(|(k, val)| format!("{k}={val}")),
        );
        v
    }

    /// `ssh` arguments (without the destination and command): `-F none`, [`Sshd::ssh_options`],
    /// `-p port`, and `-o ProxyCommand=...` if given (`%h`/`%p` are ssh's host and port).
    pub fn ssh_args(&self, port: u16, proxy_command: Option<&str>) -> Vec<String> {
        let mut v = vec!["-F".to_string(), "none".to_string()];
        for (k, val) in self.ssh_options() {
            v.push("-o".into());
            v.push(format!("{k}={val}"));
        }
        if let Some(p) = proxy_command {
            v.push("-o".into());
            v.push(format!("ProxyCommand={p}"));
        }
        v.push("-p".into());
        v.push(port.to_string());
        v
    }

    /// An `ssh` command to `port` (sshd's own or a proxy's) running `remote` (one string, as
    /// ssh joins its arguments anyway).
    pub fn ssh(&self, port: u16, proxy_command: Option<&str>, remote: &str) -> Command {
        let mut c = Command::new("ssh");
        c.args(self.ssh_args(port, proxy_command))
            .arg(self.destination())
            .arg(remote);
        c
    }

    /// An `sshfs -f` command mounting `remote_path` of this server at `mnt` through `port`
    /// (sshd's own or a proxy's), with [`Sshd::ssh_options`] and the `extra` sshfs options
    /// (e.g. `kernel_cache`, `dir_cache=yes`). Run it with [`crate::child_mount::ChildMount`].
    pub fn sshfs(&self, port: u16, remote_path: &Path, mnt: &Path, extra: &[&str]) -> Command {
        let mut c = Command::new("sshfs");
        c.arg("-f")
            .arg(format!("{}:{}", self.destination(), remote_path.display()))
            .arg(mnt)
            .args(["-F", "none", "-p"])
            .arg(port.to_string());
        let mut opts: Vec<String> = self
            .ssh_options()
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        opts.extend(extra.iter().map(|s| s.to_string()));
        c.arg("-o").arg(opts.join(","));
        c
    }

    fn stop(&mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        let Ok(pid) = i32::try_from(c.id()) else {
            let _ = c.kill();
            let _ = c.wait();
            return;
        };
        // SAFETY: kill(2) of the process group we created for our child (its pid).
        unsafe { libc::kill(-pid, libc::SIGTERM) };
        let t0 = Instant::now();
        loop {
            match c.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if t0.elapsed() < Duration::from_secs(5) => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                _ => {
                    // SAFETY: as above.
                    unsafe { libc::kill(-pid, libc::SIGKILL) };
                    let _ = c.wait();
                    break;
                }
            }
        }
        // Connection processes left in the group (sessions still open) are stopped too.
        // SAFETY: as above; ESRCH when the group is empty.
        unsafe { libc::kill(-pid, libc::SIGTERM) };
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        self.stop();
    }
}
