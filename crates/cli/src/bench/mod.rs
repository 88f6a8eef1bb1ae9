//! `dircache bench ...`: each benchmark in its own module.

mod lookup;

#[derive(clap::Subcommand)]
pub enum BenchCmd {
    /// Core cache lookups vs the kernel, on a generated tree.
    Lookup(lookup::Args),
}

pub fn run(cmd: BenchCmd) -> anyhow::Result<i32> {
    match cmd {
        BenchCmd::Lookup(a) => lookup::run(a),
    }
}
