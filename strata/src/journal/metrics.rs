//! `strata journal --metrics-listen`: installs the Prometheus recorder (with histogram buckets
//! for the journal's fsync latency and batch sizes) and serves `GET /metrics`, refreshing the
//! per-shard gauges from the node at each scrape.

use std::sync::Arc;

use anyhow::Context;
use journal::JournalNode;
use journal::metrics as m;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

/// Starts serving metrics at `addr` (in the background).
pub async fn serve(addr: &str, node: Arc<JournalNode>) -> anyhow::Result<()> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(m::FSYNC_SECONDS.into()), m::FSYNC_BUCKETS)?
        .set_buckets_for_metric(
            Matcher::Full(m::FSYNC_BATCH_APPENDS.into()),
            m::BATCH_BUCKETS,
        )?
        .set_buckets_for_metric(Matcher::Full(m::ENTRY_RECORDS.into()), m::BATCH_BUCKETS)?
        .install_recorder()
        .context("install the metrics recorder")?;
    let ready = Arc::clone(&node);
    crate::metrics_http::serve(
        addr,
        handle,
        move || m::refresh(&node),
        move || ready.ready(),
    )
    .await
}
