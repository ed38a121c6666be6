//! `strata frontend`: one stateless frontend serving the etcd v3 API for the tenants of a shard
//! (flags: `frontend::Config`), until Ctrl-C or SIGTERM.

/// Flags of `strata frontend`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub config: frontend::Config,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let fe = frontend::Frontend::start(args.config).await?;
    fe.run_until(shutdown_signal()).await?;
    tracing::info!("frontend stopped");
    Ok(())
}

/// Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
