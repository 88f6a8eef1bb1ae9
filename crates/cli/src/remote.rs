//! `dircache mount [user@]host:[path] MNT`: a remote tree, served by `dircache serve --stdio
//! path` on the other machine, started through ssh as sshfs starts sftp-server (ssh does the
//! authentication and the encryption).
//!
//! A SRC with a `:` before any `/` is remote (as for sshfs and scp). Remote options, taken out
//! of `-o` before the mount options are parsed:
//! - `ssh_command=CMD` the ssh program and leading arguments, split at spaces [ssh]
//! - `port=N` ssh's `-p N`
//! - `serve_command=PATH` the dircache binary on the remote host [dircache]
//! - `reconnect_timeout=SECS` after the connection is lost, how long calls wait while ssh is
//!   started again (with backoff) before they fail with EIO; 0 = never reconnect [10]
//! - `statfs_timeout=SECS` how long a statfs answer (`df`; `find` and `du` ask for the file
//!   system's type) is reused before the server is asked again, 0 = every time [5]
//! - `subtree=N` directory entries the client may hold from bulk subtree replies, 0 = no bulk
//!   prefetching [131072] (dircache_remote::prefetch)
//! - `cache_dir=PATH` where container files go (a directory per remote, kept across mounts,
//!   is made in it; PATH must belong to the daemon's user and be writable by no one else,
//!   as must every directory on the way to it unless sticky)
//!   [`/var/cache/dircache`
//!   for root, else `$XDG_CACHE_HOME/dircache` or `~/.cache/dircache`]; without a value,
//!   `cache_dir` is the local mount option (kernel-cached listings)
//! - `cache_size=BYTES` bytes of container files kept, least recently used ones not open
//!   evicted beyond it (suffixes K, M, G, T) [1G]
//! - `whole_file_max=BYTES` larger files are read and written in ranges [64M]
//! - `nocontainers` no container files: reads and writes go to the server in ranges
//!   (`containers` is the default)
//! - `disconnected=on|off` disconnected operation: while the server cannot be reached, what
//!   is cached stays usable and misses fail with ETIMEDOUT after a short wait; `off`: calls
//!   wait up to `reconnect_timeout`, then EIO [on] (dircache_remote::client::disconnected)
//! - any option whose name starts with a capital letter (`IdentityFile=...`,
//!   `StrictHostKeyChecking=no`, `ProxyCommand=...`, ...) is an ssh option, passed as
//!   `-o Key=Value`.
//!
//! The command run is `CMD -x -a -o ClearAllForwardings=yes [-p N] [-o K=V ...] [user@]host
//! 'PATH serve --stdio DIR'`: the last argument is the remote command line, one argument (ssh
//! joins its arguments for the remote shell anyway), with DIR single-quoted (an empty `path`
//! is `.`, the login directory, as for sshfs).

use std::path::Path;
use std::process::Command;

use crate::mount::Usage;

/// Where a remote mount's server runs and how to reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remote {
    /// `[user@]host`.
    pub host: String,
    /// The directory on the host ("." when none was given).
    pub path: String,
    pub ssh_command: Vec<String>,
    pub port: Option<u16>,
    pub ssh_options: Vec<String>,
    pub serve_command: String,
    /// Entries the client's prefetch buffer holds (0 = no bulk prefetch).
    pub prefetch: usize,
    /// How long calls wait for a new connection after one is lost (0 = no reconnecting).
    pub reconnect_timeout: std::time::Duration,
    /// How long a statfs answer is reused (`statfs_timeout=`).
    pub statfs_ttl: std::time::Duration,
    /// Whole-file container files (`None`: `nocontainers`).
    pub containers: Option<dircache_remote::ContainerConfig>,
    /// Disconnected operation (`disconnected=off`: false).
    pub disconnected: bool,
}

/// Closes a mount's containers when dropped (the daemon exits without dropping its backend):
/// the remote's directory keeps them with its index written; a per-mount directory is
/// removed.
pub struct RemoveContainers(pub std::sync::Arc<dircache_remote::Containers>);

impl Drop for RemoveContainers {
    fn drop(&mut self) {
        tracing::info!("containers: {:?}", self.0.stats());
        self.0.close();
    }
}

/// A byte count with an optional binary suffix (K, M, G, T).
fn parse_bytes(v: &str) -> Option<u64> {
    let v = v.trim();
    let (num, mult) = match v.char_indices().last()? {
        (i, c) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return None,
            };
            (&v[..i], m)
        }
        _ => (v, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mult)
}

/// Whether `src` names a remote tree: a `:` before any `/`.
pub fn is_remote(src: &Path) -> bool {
    let s = src.as_os_str().as_encoded_bytes();
    match s.iter().position(|&b| b == b':') {
        Some(colon) => !s[..colon].contains(&b'/'),
        None => false,
    }
}

/// For a remote `src`: the remote spec and the `-o` lists without the remote options; for a
/// local one `None` and the lists as given.
pub fn split(src: &Path, lists: &[String]) -> Result<(Option<Remote>, Vec<String>), Usage> {
    if !is_remote(src) {
        return Ok((None, lists.to_vec()));
    }
    let s = src
        .to_str()
        .ok_or_else(|| Usage(format!("{}: not UTF-8", src.display())))?;
    let (host, path) = s.split_once(':').unwrap_or((s, ""));
    if host.is_empty() || host.starts_with('-') || host.starts_with('@') || host.ends_with('@') {
        return Err(Usage(format!(
            "{s}: bad host (expected [user@]host:[path])"
        )));
    }
    let mut r = Remote {
        host: host.to_string(),
        path: if path.is_empty() {
            ".".into()
        } else {
            path.into()
        },
        ssh_command: vec!["ssh".into()],
        port: None,
        ssh_options: Vec::new(),
        serve_command: "dircache".into(),
        prefetch: dircache_remote::ClientConfig::default().prefetch,
        reconnect_timeout: dircache_remote::ClientConfig::default().reconnect_timeout,
        statfs_ttl: dircache_remote::ClientConfig::default().statfs_ttl,
        containers: Some(Default::default()),
        disconnected: true,
    };
    let mut containers = dircache_remote::ContainerConfig::default();
    let mut use_containers = true;
    let mut rest = Vec::new();
    for list in lists {
        let mut kept = Vec::new();
        for opt in crate::mount::split_options(list) {
            let (k, v) = match opt.split_once('=') {
                Some((k, v)) => (k.trim(), Some(v)),
                None => (opt.trim(), None),
            };
            let need = || {
                v.filter(|v| !v.is_empty())
                    .ok_or_else(|| Usage(format!("-o {k} needs a value")))
            };
            match k {
                "ssh_command" => {
                    r.ssh_command = need()?.split_whitespace().map(str::to_string).collect();
                }
                "port" => {
                    r.port = Some(
                        need()?
                            .parse()
                            .ok()
                            .filter(|&p: &u16| p > 0)
                            .ok_or_else(|| Usage(format!("bad value for -o port: {v:?}")))?,
                    )
                }
                "serve_command" => r.serve_command = need()?.to_string(),
                "reconnect_timeout" => {
                    r.reconnect_timeout = need()?
                        .parse::<f64>()
                        .ok()
                        .filter(|s| (0.0..=86400.0).contains(s))
                        .map(std::time::Duration::from_secs_f64)
                        .ok_or_else(|| {
                            Usage(format!("bad value for -o reconnect_timeout: {v:?}"))
                        })?
                }
                "statfs_timeout" => {
                    r.statfs_ttl = need()?
                        .parse::<f64>()
                        .ok()
                        .filter(|s| (0.0..=86400.0).contains(s))
                        .map(std::time::Duration::from_secs_f64)
                        .ok_or_else(|| Usage(format!("bad value for -o statfs_timeout: {v:?}")))?
                }
                "subtree" => {
                    r.prefetch = need()?
                        .parse()
                        .ok()
                        .filter(|&n: &usize| n <= 1 << 24)
                        .ok_or_else(|| Usage(format!("bad value for -o subtree: {v:?}")))?
                }
                "cache_dir" if v.is_some() => {
                    containers.dir = Some(std::path::PathBuf::from(need()?));
                }
                "cache_size" | "whole_file_max" => {
                    let n = parse_bytes(need()?)
                        .filter(|&n| n > 0)
                        .ok_or_else(|| Usage(format!("bad value for -o {k}: {v:?}")))?;
                    if k == "cache_size" {
                        containers.max_bytes = n;
                    } else {
                        containers.whole_file_max = n;
                    }
                }
                "containers" if v.is_none() => use_containers = true,
                "nocontainers" if v.is_none() => use_containers = false,
                "disconnected" => {
                    r.disconnected = match need()? {
                        "on" => true,
                        "off" => false,
                        _ => return Err(Usage(format!("bad value for -o disconnected: {v:?}"))),
                    }
                }
                k if k.starts_with(|c: char| c.is_ascii_uppercase()) => {
                    let v = need()?;
                    r.ssh_options.push(format!("{k}={}", v.trim_matches('"')));
                }
                _ => kept.push(opt),
            }
        }
        if !kept.is_empty() {
            rest.push(kept.join(","));
        }
    }
    r.containers = use_containers.then_some(containers);
    Ok((Some(r), rest))
}

/// The modification log directory of remote tree `host:path` in cache directory `base`:
/// `cml-HASH`, HASH the FNV-1a 64 of `host:path` in hex.
pub fn log_dir(base: &Path, host: &str, path: &str) -> std::path::PathBuf {
    let id = format!("{host}:{path}");
    let hash = id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, c| {
        (h ^ u64::from(c)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    base.join(format!("cml-{hash:016x}"))
}

/// How long a call that needs the server waits for the reconnection while disconnected
/// (then ETIMEDOUT).
const DISCONNECTED_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// `s` quoted for a POSIX shell.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

impl Remote {
    /// Which remote tree this is, for the containers kept across mounts: the daemon's uid,
    /// `[user@]host`, the port and the path.
    pub fn identity(&self) -> String {
        format!(
            "{}:{}:{}:{}",
            rustix::process::geteuid().as_raw(),
            self.host,
            self.port.unwrap_or(22),
            self.path
        )
    }

    /// The ssh command line (module docs).
    pub fn command(&self) -> Command {
        let mut c = Command::new(&self.ssh_command[0]);
        c.args(&self.ssh_command[1..]);
        c.args(["-x", "-a", "-o", "ClearAllForwardings=yes"]);
        if let Some(p) = self.port {
            c.arg("-p").arg(p.to_string());
        }
        for o in &self.ssh_options {
            c.arg("-o").arg(o);
        }
        c.arg(&self.host);
        c.arg(format!(
            "{} serve --stdio {}",
            shell_quote(&self.serve_command),
            shell_quote(&self.path)
        ));
        c
    }

    /// The client modification log of this remote tree (with containers and disconnected
    /// operation): `cml-HASH` in the cache directory, HASH naming `host:path`, so that a
    /// later mount of the same tree finds what was not reintegrated.
    fn modification_log(&self) -> anyhow::Result<Option<std::path::PathBuf>> {
        let Some(c) = &self.containers else {
            return Ok(None);
        };
        let base = c
            .dir
            .clone()
            .unwrap_or_else(dircache_remote::client::container::default_cache_base);
        Ok(Some(log_dir(&base, &self.host, &self.path)))
    }

    /// Start the server through ssh and do the handshake; the same again whenever the
    /// connection is lost (up to `reconnect_timeout`).
    pub fn connect(&self) -> anyhow::Result<dircache_remote::RemoteBackend> {
        let containers = match &self.containers {
            Some(c) => Some(std::sync::Arc::new(
                dircache_remote::Containers::new(&dircache_remote::ContainerConfig {
                    remote: Some(self.identity()),
                    ..c.clone()
                })
                .map_err(|e| {
                    anyhow::anyhow!(
                        "cache directory {}: {e}",
                        c.dir
                            .clone()
                            .unwrap_or_else(dircache_remote::client::container::default_cache_base)
                            .display()
                    )
                })?,
            )),
            None => None,
        };
        if let Some(c) = &containers {
            c.start_checkpoints();
        }
        let cfg = dircache_remote::ClientConfig {
            prefetch: self.prefetch,
            reconnect_timeout: self.reconnect_timeout,
            handshake_timeout: dircache_remote::client::HANDSHAKE_TIMEOUT,
            statfs_ttl: self.statfs_ttl,
            max_call_entries: dircache_remote::MAX_CALL_ENTRIES,
            containers,
            disconnected: match self.disconnected {
                true => Some(dircache_remote::Disconnected::with_log(
                    DISCONNECTED_GRACE.min(self.reconnect_timeout),
                    self.modification_log()?,
                )),
                false => None,
            },
        };
        let me = self.clone();
        let connector: dircache_remote::client::Connector = Box::new(move || {
            let cmd = me.command();
            tracing::info!("starting {cmd:?}");
            let t = dircache_remote::ChildTransport::spawn(cmd).map_err(|e| {
                std::io::Error::new(e.kind(), format!("{}: {e}", me.ssh_command[0]))
            })?;
            Ok(Box::new(t) as Box<dyn dircache_remote::Transport>)
        });
        let backend =
            dircache_remote::RemoteBackend::connect_again(connector, &cfg).map_err(|e| {
                anyhow::anyhow!(
                    "{}:{}: no dircache server: {e} (ssh's own messages, if any, are above)",
                    self.host,
                    self.path
                )
            })?;
        // The whole tree starts coming in bulk now, while the mount is being set up
        // (dircache_remote::client::bulk).
        backend.prefetch_root();
        Ok(backend)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(c: &Command) -> Vec<String> {
        std::iter::once(c.get_program())
            .chain(c.get_args())
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn remote_sources_are_told_apart() {
        assert!(is_remote(Path::new("host:/x")));
        assert!(is_remote(Path::new("u@host:")));
        assert!(is_remote(Path::new("host:rel/dir")));
        assert!(!is_remote(Path::new("/a:b")));
        assert!(!is_remote(Path::new("./a:b")));
        assert!(!is_remote(Path::new("dir/x:y")));
        assert!(!is_remote(Path::new("plain")));
    }

    #[test]
    fn options_become_an_ssh_command() {
        let (r, rest) = split(
            Path::new("me@box:/srv/my tree"),
            &[
                "ro,port=2222,IdentityFile=/k/id,ssh_command=/usr/bin/ssh -v".into(),
                "serve_command=/opt/dc,StrictHostKeyChecking=no".into(),
                "entry_timeout=5".into(),
            ],
        )
        .unwrap();
        let r = r.unwrap();
        assert_eq!(rest, vec!["ro".to_string(), "entry_timeout=5".into()]);
        assert_eq!(
            args(&r.command()),
            [
                "/usr/bin/ssh",
                "-v",
                "-x",
                "-a",
                "-o",
                "ClearAllForwardings=yes",
                "-p",
                "2222",
                "-o",
                "IdentityFile=/k/id",
                "-o",
                "StrictHostKeyChecking=no",
                "me@box",
                "'/opt/dc' serve --stdio '/srv/my tree'",
            ]
        );
        let (r, _) = split(Path::new("box:"), &[]).unwrap();
        assert_eq!(r.unwrap().path, ".");
        let (r, _) = split(Path::new("box:it's"), &[]).unwrap();
        assert!(args(&r.unwrap().command())
            .last()
            .unwrap()
            .ends_with(r"'it'\''s'"));
        for bad in [":x", "-oProxyCommand=evil:x", "@:x"] {
            assert!(split(Path::new(bad), &[]).is_err(), "{bad}");
        }
        assert!(split(Path::new("h:x"), &["port=0".into()]).is_err());
        assert!(split(Path::new("h:x"), &["port=x".into()]).is_err());
        assert!(split(Path::new("h:x"), &["IdentityFile".into()]).is_err());
        // Containers: on by default; their options; `cache_dir` without a value is the local
        // option and stays.
        let (r, rest) = split(
            Path::new("h:x"),
            &["cache_dir,cache_dir=/c,cache_size=2M,whole_file_max=10".into()],
        )
        .unwrap();
        let c = r.unwrap().containers.unwrap();
        assert_eq!(rest, vec!["cache_dir".to_string()]);
        assert_eq!(
            (c.dir.unwrap(), c.max_bytes, c.whole_file_max),
            (std::path::PathBuf::from("/c"), 2 << 20, 10)
        );
        let (r, _) = split(Path::new("h:x"), &["nocontainers".into()]).unwrap();
        assert!(r.unwrap().containers.is_none());
        assert!(split(Path::new("h:x"), &["cache_size=1X".into()]).is_err());
        assert!(split(Path::new("h:x"), &["cache_size=0".into()]).is_err());
        // Local sources keep every option.
        let (r, rest) = split(Path::new("/src"), &["port=1".into()]).unwrap();
        assert!(r.is_none());
        assert_eq!(rest, vec!["port=1".to_string()]);
    }
}
