//! `strata compactor`: not built yet; its issue owns this file.

/// Flags of `strata compactor`.
#[derive(clap::Args)]
pub struct Args {}

pub async fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("strata compactor is not built yet")
}
