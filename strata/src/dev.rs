//! `strata dev`: not built yet; its issue owns this file.

/// Flags of `strata dev`.
#[derive(clap::Args)]
pub struct Args {}

pub async fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("strata dev is not built yet")
}
