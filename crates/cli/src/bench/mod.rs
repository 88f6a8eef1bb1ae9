//! `dircache bench ...`: each benchmark in its own module.

mod lookup;
mod search;

#[derive(clap::Subcommand)]
pub enum BenchCmd {
    /// Core cache lookups vs the kernel, on a generated tree.
    Lookup(lookup::Args),
    /// Search vs find, bfs and fd, locally and on a dircache mount.
    Search(search::Args),
}

pub fn run(cmd: BenchCmd) -> anyhow::Result<i32> {
    match cmd {
        BenchCmd::Lookup(a) => lookup::run(a),
        BenchCmd::Search(a) => search::run(a),
    }
}
