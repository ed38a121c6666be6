//! `strata compactor`: tails the owned journal shards, checkpoints every tenant to object
//! storage, publishes manifests, trims the journal; optionally serves Prometheus `/metrics`.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use compactor::{Catalog, Compactor, Config};
use tracing::{info, warn};

/// Flags of `strata compactor`.
#[derive(clap::Args)]
pub struct Args {
    /// Journal nodes, comma-separated `host:port` (any subset; the client finds leaders).
    #[arg(long, value_delimiter = ',', required = true)]
    journal: Vec<String>,
    /// Where checkpoints go: `file:///dir` (or a path), `s3://bucket[/prefix]`,
    /// `gs://bucket[/prefix]`, `az://container[/prefix]`, `memory://`. Cloud settings come from
    /// the environment (AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID, AWS_ALLOW_HTTP, ...).
    #[arg(long = "object-store", env = "STRATA_OBJECT_STORE")]
    object_store: String,
    /// Journal shards this compactor owns, comma-separated (one compactor per shard).
    #[arg(long, value_delimiter = ',', default_value = "0")]
    shards: Vec<u32>,
    /// Checkpoint a shard's tenants after this many journal records.
    #[arg(long, default_value_t = compactor::config::DEFAULT_EVERY_ENTRIES)]
    every_entries: u64,
    /// ... or at least this often while records arrive.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    every: Duration,
    /// Checkpoints kept per tenant (restore points).
    #[arg(long, default_value_t = compactor::config::DEFAULT_KEEP)]
    keep: usize,
    /// Trim the journal below the checkpoint this many places behind the newest (1 keeps one
    /// fallback checkpoint usable with the journal; 0 trims to the newest).
    #[arg(long, default_value_t = compactor::config::DEFAULT_TRIM_LAG)]
    trim_lag: usize,
    /// Tenants to checkpoint even before they write, as `name` (shard 0) or `name=shard`;
    /// repeatable. Tenants found in the object store or the journal are checkpointed too.
    #[arg(long = "tenant", default_value = "default")]
    tenants: Vec<String>,
    /// First pause after a failed checkpoint round (doubles up to --retry-max).
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    retry_min: Duration,
    /// Longest pause between failed checkpoint rounds.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    retry_max: Duration,
    /// Auto-compaction of every tenant's MVCC history, as etcd's flag: `periodic` keeps about
    /// --auto-compaction-retention of wall-clock history, `revision` keeps that many revisions.
    /// Off unless a retention is given (etcd's default; kube-apiserver compacts by itself).
    #[arg(long, default_value = "periodic")]
    auto_compaction_mode: String,
    /// What auto-compaction keeps: a duration (`1h`, `30m`) or a bare number of hours for
    /// `periodic`, a number of revisions for `revision`; `0` turns it off.
    #[arg(long, default_value = "0")]
    auto_compaction_retention: String,
    /// How often auto-compaction checks each tenant (default as etcd: retention/10, at most
    /// 6 minutes, for periodic; 5 minutes for revision).
    #[arg(long, value_parser = humantime::parse_duration)]
    auto_compaction_check_interval: Option<Duration>,
    /// Serve Prometheus metrics at http://<addr>/metrics.
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// How often the tenant catalogue is read for tenants to purge (deleted longer ago than
    /// their retention, older generations of a name created again).
    #[arg(long, default_value = "1m", value_parser = humantime::parse_duration)]
    catalogue_every: Duration,
    /// Testing only: pause this long after each checkpoint upload and each manifest publish
    /// (fault tests kill the compactor between the steps of a round).
    #[arg(long, hide = true, default_value = "0s", value_parser = humantime::parse_duration)]
    test_step_pause: Duration,
    /// TLS to the journal (`--internal-*`).
    #[command(flatten)]
    internal_tls: journal::tls::TlsArgs,
}

fn parse_tenant(s: &str) -> anyhow::Result<(String, u32)> {
    match s.split_once('=') {
        Some((t, shard)) => Ok((
            t.to_string(),
            shard
                .parse()
                .with_context(|| format!("--tenant {s}: shard is not a number"))?,
        )),
        None => Ok((s.to_string(), 0)),
    }
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let config = Config {
        shards: args.shards,
        tenants: args
            .tenants
            .iter()
            .map(|t| parse_tenant(t))
            .collect::<anyhow::Result<_>>()?,
        every_entries: args.every_entries,
        every: args.every,
        keep: args.keep,
        trim_lag: args.trim_lag,
        retry_min: args.retry_min,
        retry_max: args.retry_max,
        auto_compaction: compactor::auto_compaction::Policy::parse(
            &args.auto_compaction_mode,
            &args.auto_compaction_retention,
            args.auto_compaction_check_interval,
        )?,
        catalogue_every: args.catalogue_every,
        step_pause: args.test_step_pause,
    };
    config.validate()?;
    if let Some(addr) = args.metrics_listen {
        serve_metrics(addr).await?;
    }
    let store = compactor::store::open(&args.object_store)?;
    let journal =
        journal::client::JournalClient::connect_over(&args.journal, args.internal_tls.start()?)
            .await?;
    info!(object_store = %args.object_store, shards = ?config.shards, every_entries = config.every_entries, every = ?config.every, keep = config.keep, auto_compaction = ?config.auto_compaction, "compactor starting");
    let c = Compactor::spawn(config, journal, Catalog::new(store));
    shutdown_signal().await;
    info!("compactor stopping");
    c.shutdown().await;
    Ok(())
}

async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            warn!(error = %e, "cannot listen for SIGTERM; stopping on Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

/// Buckets of the compactor's histograms (seconds): a checkpoint upload takes from
/// milliseconds (a small tenant, a local folder) to minutes (a large tenant over S3).
const UPLOAD_SECONDS_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// Installs the Prometheus recorder and serves its text exposition on `GET /metrics`.
async fn serve_metrics(addr: SocketAddr) -> anyhow::Result<()> {
    // Histograms get buckets, so dashboards can aggregate them across compactors
    // (`histogram_quantile` over `_bucket`); the exporter's default is a summary.
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets(UPLOAD_SECONDS_BUCKETS)
        .context("histogram buckets")?
        .install_recorder()
        .context("install the metrics recorder")?;
    crate::metrics_http::serve(&addr.to_string(), handle, || {}, || Ok(())).await
}
