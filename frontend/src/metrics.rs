//! Prometheus metrics: the process-wide recorder, and the per-tenant gauges refreshed at scrape
//! time (applied index, journal lag, watchers, keys and bytes). Names carry their unit.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use crate::tenant::Tenant;

/// Latency buckets (seconds) of the request and append histograms.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
];

/// How often histogram samples are folded into their buckets when nothing scrapes `/metrics`
/// (a recorder from `build_recorder` otherwise keeps every sample until the next scrape).
pub const UPKEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the Prometheus recorder once per process; `None` if another recorder was installed
/// first (an embedding program's), in which case `/metrics` reports that.
pub fn handle() -> Option<&'static PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets(LATENCY_BUCKETS)
                .ok()?
                .build_recorder();
            let handle = recorder.handle();
            metrics::set_global_recorder(recorder).ok()?;
            let upkeep = handle.clone();
            // A plain thread, not a task: the recorder outlives any one runtime (tests).
            #[allow(clippy::disallowed_methods)] // a periodic timer outside any runtime
            let spawned = std::thread::Builder::new()
                .name("metrics-upkeep".into())
                .spawn(move || {
                    loop {
                        std::thread::sleep(UPKEEP_INTERVAL);
                        upkeep.run_upkeep();
                    }
                });
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "no metrics upkeep thread: histograms drain only when scraped");
            }
            Some(handle)
        })
        .as_ref()
}

/// Refreshes the gauges that are cheaper to read at scrape time than to keep current.
pub fn refresh(t: &Tenant, committed_index: Option<u64>) {
    let tenant = t.name.clone();
    let applied = t.replica.applied_index();
    let stats = t.replica.read().stats();
    metrics::gauge!("strata_frontend_applied_index", "tenant" => tenant.clone())
        .set(applied as f64);
    if let Some(c) = committed_index {
        metrics::gauge!("strata_frontend_journal_lag_entries", "tenant" => tenant.clone())
            .set(c.saturating_sub(applied) as f64);
    }
    metrics::gauge!("strata_frontend_watchers", "tenant" => tenant.clone())
        .set(t.replica.hub().watcher_count() as f64);
    metrics::gauge!("strata_frontend_keys", "tenant" => tenant.clone()).set(stats.keys as f64);
    metrics::gauge!("strata_frontend_live_bytes", "tenant" => tenant.clone())
        .set(stats.live_bytes as f64);
    metrics::gauge!("strata_frontend_stored_bytes", "tenant" => tenant.clone())
        .set(stats.charged_bytes as f64);
    metrics::gauge!("strata_frontend_revision", "tenant" => tenant.clone())
        .set(stats.revision as f64);
    metrics::gauge!("strata_frontend_leases", "tenant" => tenant).set(stats.leases as f64);
    // The process collector's resident memory, which etcd exports and `etcdctl check
    // datascale` reads from a member's /metrics.
    if let Some(rss) = resident_bytes() {
        metrics::gauge!("process_resident_memory_bytes").set(rss as f64);
    }
}

/// This process's resident set (`VmRSS` of /proc/self/status), where there is a /proc.
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
