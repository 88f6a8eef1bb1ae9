//! `dircache mount` and `dircache stats` (owned by the FUSE work).

#[derive(clap::Args)]
pub struct MountArgs {
    pub src: std::path::PathBuf,
    pub mnt: std::path::PathBuf,
}

#[derive(clap::Args)]
pub struct StatsArgs {
    pub mnt: std::path::PathBuf,
}

pub fn run_mount(_a: MountArgs) -> anyhow::Result<i32> {
    anyhow::bail!("not yet implemented")
}

pub fn run_stats(_a: StatsArgs) -> anyhow::Result<i32> {
    anyhow::bail!("not yet implemented")
}
