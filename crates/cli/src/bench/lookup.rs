//! `dircache bench lookup` (owned by the bench work).

#[derive(clap::Args)]
pub struct Args {
    #[arg(long)]
    pub json: bool,
}

pub fn run(_a: Args) -> anyhow::Result<i32> {
    anyhow::bail!("not yet implemented")
}
