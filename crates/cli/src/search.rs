//! `dircache search` (owned by the search work).

#[derive(clap::Args)]
pub struct SearchArgs {
    pub paths: String,
    pub pattern: String,
}

pub fn run(_a: SearchArgs) -> anyhow::Result<i32> {
    anyhow::bail!("not yet implemented")
}
