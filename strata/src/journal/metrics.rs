//! `strata journal --metrics-listen`: installs the Prometheus recorder (with histogram buckets
//! for the journal's fsync latency and batch sizes) and serves `GET /metrics`, refreshing the
//! per-shard gauges from the node at each scrape.

use std::sync::Arc;

use anyhow::Context;
use journal::JournalNode;
use journal::metrics as m;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Largest HTTP request head the metrics endpoint reads.
const MAX_HTTP_REQUEST: usize = 8 * 1024;

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
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the metrics listener {addr}"))?;
    tracing::info!(addr = %listener.local_addr()?, "serving /metrics");
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                continue;
            };
            let handle = handle.clone();
            let node = Arc::clone(&node);
            tokio::spawn(async move {
                let mut buf = Vec::with_capacity(1024);
                let mut chunk = [0u8; 1024];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < MAX_HTTP_REQUEST {
                    match sock.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let (status, body) = if buf.starts_with(b"GET /metrics ") {
                    m::refresh(&node);
                    ("200 OK", handle.render())
                } else {
                    ("404 Not Found", "not found\n".to_string())
                };
                let resp = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = sock.write_all(resp.as_bytes()).await;
            });
        }
    });
    Ok(())
}
