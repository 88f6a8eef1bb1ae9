//! `dircache`: mount a directory through the cache, search, statistics, benchmarks.

mod bench;
mod cacheview;
mod conflicts;
mod coreopts;
mod delay_proxy;
mod demo;
mod hoard;
mod install;
mod logs;
mod lsline;
mod metricsopt;
mod mount;
mod progress;
mod remote;
mod search;
mod serve;
mod statwatch;
mod umount;
mod walk;

use clap::{CommandFactory, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "dircache",
    version,
    about = "A user-level directory cache for Linux file systems"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// The main job on a built-in example: mount a generated tree and compare with native.
    Demo(demo::DemoArgs),
    /// Serve directory SRC at MNT through the cache (FUSE).
    Mount(mount::MountArgs),
    /// Unmount a dircache mount and wait for its daemon to exit.
    Umount(umount::UmountArgs),
    /// Live statistics of a running mount.
    Stats(mount::StatsArgs),
    /// Conflicts found reintegrating a remote mount's changes made while disconnected.
    Conflicts(conflicts::ConflictsArgs),
    /// Load a subtree's metadata into the cache and the kernel (a walk as you).
    Warm(cacheview::WarmArgs),
    /// What the cache holds under a directory of a mount (as far as you may list it).
    Cached(cacheview::CachedArgs),
    /// Find files by pattern across directories in one call.
    Search(search::SearchArgs),
    /// Fetch subtrees of a remote mount whole into its container files (for offline use).
    Hoard(hoard::HoardArgs),
    /// Serve directory ROOT to a remote mount over stdin/stdout (started by ssh).
    Serve(serve::ServeArgs),
    /// Install the binary, the mount(8) helper, man pages and shell completions.
    Install(install::InstallArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(install::CompletionsArgs),
    /// Benchmarks (side by side, medians).
    #[command(subcommand)]
    Bench(bench::BenchCmd),
    /// (test tooling) Relay stdin/stdout or a listening port to HOST:PORT with a delay.
    #[command(hide = true)]
    DelayProxy(delay_proxy::Args),
}

fn main() {
    let cli = Cli::parse();
    // A mount sets up its own log (a file once it runs in the background: logs.rs).
    if !matches!(cli.cmd, Cmd::Mount(_)) {
        logs::init(logs::QUIET);
    }
    let code = match cli.cmd {
        Cmd::Demo(a) => demo::run(a),
        Cmd::Mount(a) => mount::run_mount(a),
        Cmd::Umount(a) => umount::run(a),
        Cmd::Stats(a) => mount::run_stats(a),
        Cmd::Conflicts(a) => conflicts::run(a),
        Cmd::Warm(a) => cacheview::run_warm(a),
        Cmd::Cached(a) => cacheview::run_cached(a),
        Cmd::Search(a) => search::run(a),
        Cmd::Serve(a) => serve::run(a),
        Cmd::Hoard(a) => hoard::run(a),
        Cmd::Install(a) => install::run(a, Cli::command()),
        Cmd::Completions(a) => install::completions(a, Cli::command()),
        Cmd::Bench(b) => bench::run(b),
        Cmd::DelayProxy(a) => delay_proxy::run(a),
    };
    match code {
        Ok(c) => std::process::exit(c),
        Err(e) => {
            eprintln!("dircache: {e:#}");
            std::process::exit(1);
        }
    }
}
