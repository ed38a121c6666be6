//! `strata frontend`: not built yet; its issue owns this file.

/// Flags of `strata frontend`.
#[derive(clap::Args)]
pub struct Args {}

pub async fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("strata frontend is not built yet")
}
