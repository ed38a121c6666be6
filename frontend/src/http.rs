//! The HTTP side port: `/health` (etcd's JSON shape: the replica is ready and a linearizable
//! barrier through the journal succeeds), `/readyz` (every replica has caught up), `/livez` (the
//! process is serving and no replica has stopped: a liveness probe, which must not fail
//! because the journal is away) and Prometheus `/metrics`. `/health` checks the tenant an
//! `x-strata-tenant` header names, as a request's would be resolved, or every tenant served.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::log::Log;
use crate::replica::ReplicaState;
use crate::tenant::Tenant;
use crate::tenants::{TENANT_HEADER, Tenants};

/// How long `/health` waits for its journal round trip.
pub const HEALTH_TIMEOUT: Duration = Duration::from_secs(5);
/// How long `/metrics` waits for the journal's committed index (for the lag gauge).
pub const METRICS_STATUS_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Clone)]
pub struct HttpState {
    pub tenants: Arc<Tenants>,
    pub log: Arc<dyn Log>,
    /// What `/version` reports as `etcdserver` (`--etcd-version`).
    pub etcd_version: String,
    /// Set once the frontend is shutting down (`--shutdown-delay`): `/readyz` answers 503.
    pub draining: Arc<std::sync::atomic::AtomicBool>,
}

/// The paths an etcd member also serves over plain HTTP on its client port (`curl
/// http://host:2379/health`, `etcdctl check datascale` reading `/metrics`): GET requests for
/// them on the client port are answered by this router (`FastKv` hands them over).
pub const CLIENT_PORT_PATHS: [&str; 5] = ["/health", "/version", "/metrics", "/readyz", "/livez"];

pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/readyz", get(readyz))
        .route("/livez", get(livez))
        .route("/version", get(version))
        .route("/metrics", get(metrics_text))
        .with_state(state)
}

fn health_body(ok: bool, reason: &str) -> String {
    serde_json::json!({ "health": if ok { "true" } else { "false" }, "reason": reason }).to_string()
}

async fn health(State(s): State<HttpState>, headers: HeaderMap) -> impl IntoResponse {
    let json = [(header::CONTENT_TYPE, "application/json")];
    let tenants: Vec<Arc<Tenant>> = if headers.contains_key(TENANT_HEADER) {
        let metadata = tonic::metadata::MetadataMap::from_headers(headers);
        match s.tenants.waiting_for(&metadata, Tenants::resolve).await {
            Ok(t) => {
                // Loaded a moment ago for this request (it was unloaded while idle): its replica
                // replays the journal after its checkpoint, and is given as long as a read of
                // the tenant would wait for it.
                t.replica.settle(HEALTH_TIMEOUT).await;
                vec![t]
            }
            Err(e) => {
                return (
                    StatusCode::NOT_FOUND,
                    json,
                    health_body(false, &e.to_string()),
                );
            }
        }
    } else {
        // A deleted tenant is no longer served; a suspended one still is (Status works).
        let mut all = s.tenants.all();
        all.retain(|t| t.served() != crate::tenant::Served::Deleted);
        all
    };
    let several = tenants.len() > 1;
    // One journal round trip per shard, however many tenants share it: each tenant then only
    // waits for its replica to apply up to that shard's read index.
    let mut by_shard: std::collections::BTreeMap<u32, Vec<&Arc<Tenant>>> = Default::default();
    for t in &tenants {
        by_shard.entry(t.shard).or_default().push(t);
    }
    let shards = by_shard.into_values().map(|shard| async move {
        let index = match tokio::time::timeout(HEALTH_TIMEOUT, shard[0].read_index()).await {
            Ok(Ok(index)) => Some(index),
            // Each tenant's own check says why (its replica's state first).
            _ => None,
        };
        let checks = shard.into_iter().map(|t| async move {
            tenant_health(t, index).await.map_err(|why| {
                if several {
                    format!("tenant {}: {why}", t.name)
                } else {
                    why
                }
            })
        });
        futures::future::join_all(checks).await
    });
    match futures::future::join_all(shards)
        .await
        .into_iter()
        .flatten()
        .find_map(Result::err)
    {
        None => (StatusCode::OK, json, health_body(true, "")),
        Some(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            json,
            health_body(false, &why),
        ),
    }
}

/// One tenant's `/health`: its replica serves and a read barrier through the journal succeeds
/// (at `index`, its shard's read index, if already taken).
async fn tenant_health(t: &Tenant, index: Option<u64>) -> Result<(), String> {
    match t.replica.state() {
        ReplicaState::Ready => {}
        ReplicaState::CatchingUp => return Err("catching up".into()),
        ReplicaState::Failed(r) => return Err(format!("replica stopped: {r}")),
    }
    let barrier = async {
        match index {
            Some(i) => t.barrier_at(i).await,
            None => t.barrier().await,
        }
    };
    match tokio::time::timeout(HEALTH_TIMEOUT, barrier).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("journal round trip timed out".into()),
    }
}

/// 200 while the replica catches up or serves, 503 once it stopped for good (a restart is the
/// cure). Never waits for the journal: an outage of the journal must not restart frontends
/// that still serve what they hold.
async fn livez(State(s): State<HttpState>) -> impl IntoResponse {
    match s.tenants.failed() {
        None => (StatusCode::OK, "ok\n".to_string()),
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
}

/// etcd's `/version`: the server's version and the cluster's (major.minor.0).
async fn version(State(s): State<HttpState>) -> impl IntoResponse {
    let mut parts = s.etcd_version.split('.');
    let cluster = match (parts.next(), parts.next()) {
        (Some(major), Some(minor)) => format!("{major}.{minor}.0"),
        _ => s.etcd_version.clone(),
    };
    (
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::json!({ "etcdserver": s.etcd_version, "etcdcluster": cluster }).to_string(),
    )
}

async fn readyz(State(s): State<HttpState>) -> impl IntoResponse {
    if s.draining.load(std::sync::atomic::Ordering::Relaxed) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting down\n".to_string(),
        );
    }
    match s.tenants.readiness() {
        Ok(()) => (StatusCode::OK, "ok\n".to_string()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
}

async fn metrics_text(State(s): State<HttpState>) -> impl IntoResponse {
    // One status per shard answers the lag of every tenant on it.
    let tenants = s.tenants.all();
    let shards: std::collections::BTreeSet<u32> = tenants.iter().map(|t| t.shard).collect();
    let committed: std::collections::HashMap<u32, u64> =
        futures::future::join_all(shards.into_iter().map(|shard| {
            let log = s.log.clone();
            async move {
                let st = tokio::time::timeout(METRICS_STATUS_TIMEOUT, log.status(shard)).await;
                (
                    shard,
                    st.ok().and_then(Result::ok).map(|st| st.committed_index),
                )
            }
        }))
        .await
        .into_iter()
        .filter_map(|(shard, committed)| Some((shard, committed?)))
        .collect();
    for t in &tenants {
        crate::metrics::refresh(t, committed.get(&t.shard).copied());
    }
    match crate::metrics::handle() {
        Some(h) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            h.render(),
        ),
        None => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            "another metrics recorder is installed in this process\n".to_string(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::MemLog;

    /// `/health` with no tenant named checks every tenant, but takes one read index per shard:
    /// three tenants of one shard cost one journal round trip, not three.
    #[tokio::test]
    async fn health_takes_one_read_index_per_shard() {
        let log = MemLog::new();
        let tenant = |name: &str| {
            let store = memstore::MemStore::new(memstore::Config::default());
            crate::tenant::test_tenant_named(name, store, Arc::new(log.clone()), 1, 1)
        };
        let tenants = Tenants::serving(Some(tenant("d")), vec![tenant("a"), tenant("b")], true);
        crate::tenant::until_ready(&tenants.all()).await;
        let state = HttpState {
            tenants: Arc::new(tenants),
            log: Arc::new(log.clone()),
            etcd_version: "3.5.17".into(),
            draining: Arc::default(),
        };
        let before = log.read_index_calls();
        let answer = health(State(state), HeaderMap::new()).await.into_response();
        assert_eq!(answer.status(), StatusCode::OK);
        assert_eq!(log.read_index_calls(), before + 1);
    }

    /// `/health` naming a tenant whose replica is still catching up (loaded a moment ago for
    /// this very request, after it was unloaded while idle) waits for it as a read would, and
    /// answers for the tenant caught up rather than "catching up".
    #[tokio::test]
    async fn health_of_a_named_tenant_waits_for_its_replica_to_catch_up() {
        let log = MemLog::new();
        let a = crate::tenant::catching_up_tenant("a", &log, Duration::from_millis(300));
        let state = HttpState {
            tenants: Arc::new(Tenants::serving(None, vec![a.clone()], true)),
            log: Arc::new(log.clone()),
            etcd_version: "3.5.17".into(),
            draining: Arc::default(),
        };
        let mut headers = HeaderMap::new();
        headers.insert(TENANT_HEADER, "a".parse().unwrap());
        let answer = health(State(state), headers).await.into_response();
        assert_eq!(answer.status(), StatusCode::OK);
        assert_eq!(a.replica.state(), ReplicaState::Ready);
    }
}
