//! `strata bench`: not built yet; its issue owns this file.

/// Flags of `strata bench`.
#[derive(clap::Args)]
pub struct Args {}

pub async fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("strata bench is not built yet")
}
