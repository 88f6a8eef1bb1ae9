//! `dircache serve --stdio ROOT`: the server end of a remote mount, speaking the dircache
//! protocol (docs/protocol.md) on stdin and stdout, as sftp-server does for sshfs. It answers
//! through the core cache over the local backend over ROOT (dircache_remote::cached), so every
//! path stays inside ROOT (no symlink, `..` or rename-race escape). Logs go to stderr (which ssh passes back to the client's terminal).

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
    /// Most directory entries the server's cache keeps (its memory bound: about 0.35 KiB
    /// each, see docs/remote.md); least recently used leaves are evicted beyond it.
    #[arg(long, default_value_t = 262_144)]
    pub max_entries: usize,
    /// Answer from the local backend directly, without the server's cache (every call is
    /// one or more system calls; for comparisons).
    #[arg(long)]
    pub no_cache: bool,
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
    if a.max_entries < 1024 {
        eprintln!("dircache serve: --max-entries must be at least 1024");
        return Ok(2);
    }
    let local_backend = Arc::new(
        dircache_local::LocalBackend::new(&root)
            .map_err(|e| anyhow::anyhow!("{}: {e}", root.display()))?,
    );
    let local: Arc<dyn dircache_core::Backend> = local_backend.clone();
    let mut cfg = dircache_remote::ServerConfig {
        workers: a.workers,
        ..Default::default()
    };
    // The core cache over the local backend answers (docs/remote.md, "The server's cache"),
    // kept coherent by the local change feed.
    let cached = if a.no_cache {
        None
    } else {
        Some(
            dircache_remote::CachedBackend::new(
                local.clone(),
                dircache_core::Config {
                    max_entries: a.max_entries,
                    ..Default::default()
                },
                cfg.own.clone(),
            )
            .map_err(|e| anyhow::anyhow!("{}: {e}", root.display()))?,
        )
    };
    // The cache's feed follows changes to hard-linked files by their inodes itself.
    cfg.link_callbacks = cached.is_none();
    // A feed that reports this server's own changes (inotify: not root) needs them told
    // apart (crates/remote/src/server/echoes.rs). The cache started its feed; without it
    // the server starts one later, fanotify (which leaves them out) when root.
    cfg.own_echoes = match &cached {
        Some(_) => local_backend.feed_reports_own_changes(),
        None => !rustix::process::geteuid().is_root(),
    };
    let backend: Arc<dyn dircache_core::Backend> = match &cached {
        Some(c) => c.clone(),
        None => local,
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
    let r = dircache_remote::serve(backend, stdin, stdout, cfg);
    if let Some(c) = &cached {
        let s = c.stats();
        tracing::info!(
            "server cache: {} entries (~{} KiB), {} fast-path hits, backend calls: {} lookup, \
             {} walk, {} getattr, {} readdir, {} readlink, {} mutation; {} evictions",
            s.entries,
            s.bytes / 1024,
            s.fastpath_hits,
            s.backend_lookup,
            s.backend_walk,
            s.backend_getattr,
            s.backend_readdir,
            s.backend_readlink,
            s.backend_mutation,
            s.evictions
        );
    }
    match r {
        Ok(()) => Ok(0),
        Err(e) => {
            eprintln!("dircache serve: {e}");
            Ok(1)
        }
    }
}
