//! The `GET /metrics` and `GET /readyz` endpoints shared by `strata journal` and `strata
//! compactor`: a minimal HTTP/1.1 responder over a Prometheus handle (the frontend serves its
//! own with axum, beside `/health`, `/livez` and `/readyz`).

use std::sync::Arc;

use anyhow::Context;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Largest HTTP request head the metrics endpoint reads.
const MAX_HTTP_REQUEST: usize = 8 * 1024;
/// How often histogram samples are folded into their buckets: the recorder otherwise keeps
/// every sample (8 bytes each) until the next scrape, and a process nobody scrapes grows by
/// megabytes a minute under load (the frontend does the same in `frontend::metrics`).
pub const UPKEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// Binds `addr` and serves `handle`'s text exposition on `GET /metrics` in the background;
/// `refresh` runs before each scrape (to update gauges read from live state). `GET /readyz`
/// answers 200 when `ready` says so, else 503 with its reason (a Kubernetes readiness probe).
/// Also runs the recorder's upkeep every `UPKEEP_INTERVAL`, scraped or not.
pub async fn serve(
    addr: &str,
    handle: PrometheusHandle,
    refresh: impl Fn() + Send + Sync + 'static,
    ready: impl Fn() -> Result<(), String> + Send + Sync + 'static,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the metrics listener {addr}"))?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(UPKEEP_INTERVAL);
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });
    tracing::info!(addr = %listener.local_addr()?, "serving /metrics");
    let refresh = Arc::new(refresh);
    let ready = Arc::new(ready);
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                continue;
            };
            let handle = handle.clone();
            let refresh = Arc::clone(&refresh);
            let ready = Arc::clone(&ready);
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
                    refresh();
                    ("200 OK", handle.render())
                } else if buf.starts_with(b"GET /readyz ") {
                    match ready() {
                        Ok(()) => ("200 OK", "ok\n".to_string()),
                        Err(why) => ("503 Service Unavailable", format!("{why}\n")),
                    }
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
