//! `strata journal`: not built yet; its issue owns this file.

/// Flags of `strata journal`.
#[derive(clap::Args)]
pub struct Args {}

pub async fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("strata journal is not built yet")
}
