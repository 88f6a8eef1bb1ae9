//! `dircache bench ...`: each benchmark in its own module.

mod ablation;
mod alloc;
mod apps;
mod lookup;
mod outside_drops;
mod plot;
mod progress;
mod remote;
mod sampler;
mod search;
mod stats;
mod tree;

/// Empty the page, inode and dentry caches (after a sync): a cold run's start.
fn drop_caches() -> anyhow::Result<()> {
    use anyhow::Context;
    // SAFETY: sync(2) has no preconditions.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3\n").context("echo 3 > /proc/sys/vm/drop_caches")
}

#[derive(clap::Subcommand)]
pub enum BenchCmd {
    /// Core cache lookups vs the kernel, on a generated tree.
    Lookup(lookup::Args),
    /// Real programs on native, bindfs and dircache mounts, warm and cold.
    Apps(apps::Args),
    /// (internal) A stat/open loop over paths, timed by `bench apps`.
    #[command(hide = true)]
    StatLoop(apps::StatLoopArgs),
    /// Search vs find, bfs and fd, locally and on a dircache mount.
    Search(search::Args),
    /// Remote trees over ssh: native, sshfs and dircache remote at several RTTs.
    Remote(Box<remote::Args>),
    /// (internal) A stat/open+read loop over a list of paths, timed by `bench remote`.
    #[command(hide = true)]
    RemoteLoop(remote::LoopArgs),
}

pub fn run(cmd: BenchCmd) -> anyhow::Result<i32> {
    match cmd {
        BenchCmd::Lookup(a) => lookup::run(a),
        BenchCmd::Apps(a) => apps::run(a),
        BenchCmd::StatLoop(a) => apps::stat_loop(a),
        BenchCmd::Search(a) => search::run(a),
        BenchCmd::Remote(a) => remote::run(*a),
        BenchCmd::RemoteLoop(a) => remote::run_loop(a),
    }
}
