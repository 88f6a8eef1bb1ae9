//! `dircache serve --stdio ROOT`: the server end of a remote mount, speaking the dircache
//! protocol (docs/protocol.md) on stdin and stdout, as sftp-server does for sshfs. It answers
//! from the local backend over ROOT, so every path stays inside ROOT (no symlink, `..` or
//! rename-race escape). Logs go to stderr (which ssh passes back to the client's terminal).

use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;

#[derive(clap::Args)]
pub struct ServeArgs {
    /// Speak the protocol on standard input and output (the only transport for now).
    #[arg(long)]
    pub stdio: bool,
    /// Directory to serve.
    pub root: PathBuf,
    /// Worker threads answering calls.
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
    /// Do not push invalidations (callbacks) for changes made behind the client's back.
    #[arg(long)]
    pub no_callbacks: bool,
}

pub fn run(a: ServeArgs) -> anyhow::Result<i32> {
    if !a.stdio {
        eprintln!("dircache serve: --stdio is required (the only transport for now)");
        return Ok(2);
    }
    if !(1..=64).contains(&a.workers) {
        eprintln!("dircache serve: --workers must be 1..=64");
        return Ok(2);
    }
    // Creations apply the caller's umask (sent with each call) in each worker's own context.
    // SAFETY: umask has no preconditions.
    unsafe { libc::umask(0) };
    let root = a
        .root
        .canonicalize()
        .with_context(|| a.root.display().to_string())?;
    if !root.is_dir() {
        eprintln!("dircache serve: {}: not a directory", root.display());
        return Ok(2);
    }
    let backend = dircache_local::LocalBackend::new(&root)
        .map_err(|e| anyhow::anyhow!("{}: {e}", root.display()))?;
    let mut cfg = dircache_remote::ServerConfig {
        workers: a.workers,
        ..Default::default()
    };
    // Delegated searches run beneath ROOT (crates/remote/src/server/search.rs).
    cfg.search_root = Some(Arc::new(
        rustix::fs::open(
            &root,
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .with_context(|| root.display().to_string())?,
    ));
    if a.no_callbacks {
        cfg.features &= !dircache_remote::proto::features::CALLBACKS;
    }
    tracing::info!(
        "serving {} on stdio (acting as {})",
        root.display(),
        if cfg.act_as_client {
            "each caller"
        } else {
            "this user"
        }
    );
    // The protocol owns the original stdout; anything printed later goes to stderr instead
    // of corrupting the stream.
    let stdin = std::io::BufReader::with_capacity(
        256 * 1024,
        std::fs::File::from(std::io::stdin().as_fd().try_clone_to_owned()?),
    );
    let stdout = std::fs::File::from(std::io::stdout().as_fd().try_clone_to_owned()?);
    // SAFETY: dup2 of this process's own standard descriptors.
    unsafe { libc::dup2(2, 1) };
    match dircache_remote::serve(Arc::new(backend), stdin, stdout, cfg) {
        Ok(()) => Ok(0),
        Err(e) => {
            eprintln!("dircache serve: {e}");
            Ok(1)
        }
    }
}
