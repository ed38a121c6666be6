//! Waiting until an etcd v3 endpoint (etcd or Strata) serves linearizable reads, and log tails
//! for failure messages.

use std::path::Path;
use std::time::Duration;

use api::etcdserverpb::RangeRequest;
use api::etcdserverpb::kv_client::KvClient;

/// Pause between two readiness probes.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(100);
/// Bound on one readiness probe (connect + linearizable Range).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// Bytes of a log file shown in a failure message.
pub const LOG_TAIL_BYTES: usize = 6000;

/// Polls a frontend's `http://<metrics>/readyz` until it answers 200 (its own word that it
/// serves linearizable reads: a client that cannot reach the client port, e.g. one without
/// the TLS CA, waits on this), giving up after `timeout` or as soon as `alive` reports the
/// process gone.
pub async fn wait_readyz_while(
    metrics: &str,
    timeout: Duration,
    mut alive: impl FnMut() -> Result<(), String>,
) -> Result<(), String> {
    let readyz = format!("http://{metrics}");
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        alive()?;
        if crate::curl::request(&readyz, "GET", "/readyz", "").0 == 200 {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!("{readyz}/readyz not 200 after {timeout:?}"));
        }
        tokio::time::sleep(PROBE_INTERVAL).await;
    }
}

/// Polls `endpoint` (`http://host:port`) with a linearizable Range until one succeeds, or
/// returns the last error after `timeout`.
pub async fn wait_ready(endpoint: &str, timeout: Duration) -> Result<(), String> {
    wait_ready_while(endpoint, timeout, || Ok(())).await
}

/// Like [`wait_ready`], but gives up as soon as `alive` reports that the process serving the
/// endpoint is gone.
pub async fn wait_ready_while(
    endpoint: &str,
    timeout: Duration,
    mut alive: impl FnMut() -> Result<(), String>,
) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last = String::from("never probed");
    while tokio::time::Instant::now() < deadline {
        alive()?;
        match tokio::time::timeout(PROBE_TIMEOUT, probe(endpoint)).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => last = e,
            Err(_) => last = format!("probe timed out after {PROBE_TIMEOUT:?}"),
        }
        tokio::time::sleep(PROBE_INTERVAL).await;
    }
    Err(format!("{endpoint} not ready after {timeout:?}: {last}"))
}

async fn probe(endpoint: &str) -> Result<(), String> {
    let mut kv = KvClient::connect(endpoint.to_string())
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let answer = kv
        .range(RangeRequest {
            key: b"strata-readiness-probe".to_vec(),
            ..Default::default()
        })
        .await;
    match answer {
        Ok(_) => Ok(()),
        // With auth enabled the anonymous probe is refused, by etcd and by Strata alike, once
        // its read point is reached: the endpoint serves linearizable reads.
        Err(e) if is_auth_refusal(&e) => Ok(()),
        Err(e) => Err(format!("range: {e}")),
    }
}

fn is_auth_refusal(e: &tonic::Status) -> bool {
    matches!(
        (e.code(), e.message()),
        (
            tonic::Code::InvalidArgument,
            "etcdserver: user name is empty"
        ) | (
            tonic::Code::PermissionDenied,
            "etcdserver: permission denied"
        )
    )
}

/// The last [`LOG_TAIL_BYTES`] of a file (lossy UTF-8), or a note that it could not be read.
pub fn tail_file(path: &Path) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let start = bytes.len().saturating_sub(LOG_TAIL_BYTES);
            String::from_utf8_lossy(&bytes[start..]).into_owned()
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}
