//! `dircache delay-proxy` (hidden): the TCP delay proxy of the remote tests and benchmarks
//! (`dircache_tests::delay_proxy`) as a program. Without `--listen` it relays stdin/stdout to
//! HOST:PORT, for ssh's `ProxyCommand`:
//!
//! ```text
//! ssh -o 'ProxyCommand=dircache delay-proxy --delay-ms 0.5 %h:%p' host
//! sshfs -o 'ProxyCommand=dircache delay-proxy --delay-ms 0.5 %h:%p' host:/ mnt
//! ```
//!
//! With `--listen ADDR` it accepts connections there and relays each to HOST:PORT, printing
//! the address it listens on, until killed.

use std::io::Write;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use std::path::Path;
use std::sync::{Arc, Once};

use dircache_tests::delay_proxy::{relay_stdio_with, DelayProxy, Shaping, Traffic, DEFAULT_BUFFER};

#[derive(clap::Args)]
pub struct Args {
    /// One-way delay in milliseconds (fractions allowed), added in each direction: the
    /// round-trip time grows by twice this.
    #[arg(long, default_value_t = 0.0)]
    pub delay_ms: f64,
    /// Bytes queued at most per direction and connection.
    #[arg(long, default_value_t = DEFAULT_BUFFER)]
    pub buffer: usize,
    /// Listen on this address (e.g. 127.0.0.1:0) instead of relaying stdin/stdout.
    #[arg(long)]
    pub listen: Option<String>,
    /// Append the traffic counted (one JSON object) to this file when the relay ends
    /// (stdin/stdout mode).
    #[arg(long)]
    pub stats: Option<std::path::PathBuf>,
    /// Where to relay to: HOST:PORT.
    pub target: String,
}

fn traffic_json(t: &Traffic) -> serde_json::Value {
    serde_json::json!({
        "up_bytes": t.up_bytes, "down_bytes": t.down_bytes,
        "up_reads": t.up_reads, "down_reads": t.down_reads,
        "up_bursts": t.up_bursts, "down_bursts": t.down_bursts,
        "round_trips": t.round_trips(), "connections": t.connections,
    })
}

/// Block SIGHUP, SIGTERM and SIGINT in this thread (and the threads it starts from now on);
/// returns the set for `sigwait`.
fn block_exit_signals() -> Result<libc::sigset_t> {
    // SAFETY: the set is initialized by sigemptyset before use; pthread_sigmask changes only
    // this thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGHUP, libc::SIGTERM, libc::SIGINT] {
            libc::sigaddset(&mut set, s);
        }
        let r = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if r != 0 {
            return Err(anyhow!(
                "pthread_sigmask: {}",
                std::io::Error::from_raw_os_error(r)
            ));
        }
        Ok(set)
    }
}

/// Append the counts to `stats` (once, whoever ends the relay first). The other caller waits
/// until the line is written: both exit the process right after, and an exit while the first
/// is still writing lost the counts (ssh's SIGHUP racing the end of the relay).
fn finish(stats: Option<&Path>, shaping: &Arc<Shaping>) {
    static DONE: Once = Once::new();
    DONE.call_once(|| write_counts(stats, shaping));
}

fn write_counts(stats: Option<&Path>, shaping: &Arc<Shaping>) {
    if let Some(f) = stats {
        let line = traffic_json(&shaping.counters.snapshot()).to_string();
        let r = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(f)
            .and_then(|mut o| writeln!(o, "{line}"));
        if let Err(e) = r {
            eprintln!("dircache delay-proxy: {}: {e}", f.display());
        }
    }
}

pub fn run(a: Args) -> Result<i32> {
    if !(0.0..=60_000.0).contains(&a.delay_ms) {
        return Err(anyhow!("--delay-ms: between 0 and 60000"));
    }
    let delay = Duration::from_secs_f64(a.delay_ms / 1e3);
    match &a.listen {
        Some(l) => {
            let p = DelayProxy::start_with(a.target.as_str(), delay, a.buffer, l.as_str())
                .with_context(|| format!("listening on {l}, relaying to {}", a.target))?;
            println!("{}", p.addr());
            std::io::stdout().flush()?;
            // Until killed: the relays run in the proxy's threads.
            loop {
                std::thread::park();
            }
        }
        None => {
            // ssh ends its ProxyCommand with SIGHUP: take SIGHUP/SIGTERM/SIGINT in a thread
            // of our own (blocked everywhere else) so the counts are still written.
            let sigs = block_exit_signals()?;
            let shaping = Shaping::new(delay, a.buffer);
            {
                let (shaping, stats) = (shaping.clone(), a.stats.clone());
                std::thread::spawn(move || {
                    let mut sig: libc::c_int = 0;
                    // SAFETY: `sigs` is an initialized set; `sig` is writable.
                    unsafe { libc::sigwait(&sigs, &mut sig) };
                    finish(stats.as_deref(), &shaping);
                    std::process::exit(0)
                });
            }
            relay_stdio_with(a.target.as_str(), shaping.clone())
                .with_context(|| format!("connecting to {}", a.target))?;
            finish(a.stats.as_deref(), &shaping);
            // The stdin reader may still be blocked in a read: exit rather than join it.
            std::process::exit(0)
        }
    }
}
