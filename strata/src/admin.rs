//! `strata admin`: not built yet; its issue owns this file.

/// Flags of `strata admin`.
#[derive(clap::Args)]
pub struct Args {}

pub async fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("strata admin is not built yet")
}
