//! Idle watchers for a write workload (`strata bench put --idle-watchers N`): watchers of keys,
//! prefixes or ranges the workload never writes, held open while it runs, so the figure shows
//! what a server pays per write for watchers that have nothing to receive (every put is offered
//! to the tenant's watchers; an unindexed hub walks them all).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use api::etcdserverpb::watch_request::RequestUnion;
use api::etcdserverpb::{WatchCreateRequest, WatchRequest};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_stream::wrappers::ReceiverStream;

use super::BenchError;
use super::conn::Pool;
use super::watch::{CREATE_TIMEOUT, Shared};

/// Watchers per stream (as the watch workload's default spreads them).
pub const WATCHERS_PER_STREAM: usize = 100;

/// What each idle watcher watches, under a run-unique prefix no workload writes.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdleKind {
    /// One key each.
    Key,
    /// One prefix each (what `etcdctl watch --prefix` and kube-apiserver send).
    Prefix,
    /// One range `[k/a, k/b)` each, not a prefix.
    Range,
}

/// The create request of idle watcher `i` under `prefix`.
pub fn create_request(prefix: &str, kind: IdleKind, i: usize) -> WatchCreateRequest {
    let base = format!("{prefix}{i:08}");
    let (key, range_end) = match kind {
        IdleKind::Key => (base.into_bytes(), Vec::new()),
        IdleKind::Prefix => {
            let key = format!("{base}/").into_bytes();
            let end = api::prefix_range_end(&key);
            (key, end)
        }
        IdleKind::Range => (
            format!("{base}/a").into_bytes(),
            format!("{base}/b").into_bytes(),
        ),
    };
    WatchCreateRequest {
        key,
        range_end,
        ..Default::default()
    }
}

/// Idle watchers held open until [`IdleWatchers::close`].
pub struct IdleWatchers {
    stop: watch::Sender<bool>,
    streams: JoinSet<Result<(), String>>,
}

impl IdleWatchers {
    /// Opens `n` watchers of `kind` over the pool's connections and waits until every one is
    /// created.
    pub async fn open(pool: &Pool, n: usize, kind: IdleKind) -> Result<Self, BenchError> {
        let prefix = format!("bench-idle/{:016x}/", rand::random::<u64>());
        let (stop, stopped) = watch::channel(false);
        let shared = Arc::new(Shared::default());
        let mut streams = JoinSet::new();
        for (s, first) in (0..n).step_by(WATCHERS_PER_STREAM).enumerate() {
            let count = WATCHERS_PER_STREAM.min(n - first);
            let (tx, rx) = mpsc::channel(count);
            for i in first..first + count {
                let create = create_request(&prefix, kind, i);
                let req = WatchRequest {
                    request_union: Some(RequestUnion::CreateRequest(create)),
                };
                tx.send(req)
                    .await
                    .map_err(|_| BenchError::Setup("idle watch queue closed".into()))?;
            }
            let request = pool.stream_request(ReceiverStream::new(rx));
            let mut client = pool.watch(s);
            let (shared, mut stopped) = (shared.clone(), stopped.clone());
            streams.spawn(async move {
                let _keep_open = tx;
                let watched = watch_idle(&mut client, request, &shared, &mut stopped).await;
                if watched.is_err() {
                    shared.failed_streams.fetch_add(1, Ordering::Relaxed);
                    shared.notify.notify_one();
                }
                watched
            });
        }
        let all = shared
            .wait_until(CREATE_TIMEOUT, || {
                shared.created.load(Ordering::Relaxed) == n
                    || shared.failed_streams.load(Ordering::Relaxed) > 0
            })
            .await;
        let mut idle = Self { stop, streams };
        let created = shared.created.load(Ordering::Relaxed);
        if !all || created != n {
            let errors = idle.close().await.err().unwrap_or_default();
            return Err(BenchError::Setup(format!(
                "only {created} of {n} idle watchers were created within {CREATE_TIMEOUT:?} {errors}"
            )));
        }
        Ok(idle)
    }

    /// Closes every stream; an error if a watcher failed while open (cancelled, an event).
    pub async fn close(&mut self) -> Result<(), String> {
        let _ = self.stop.send(true);
        let mut errors = Vec::new();
        while let Some(joined) = self.streams.join_next().await {
            match joined {
                Ok(Ok(())) => {}
                Ok(Err(e)) => errors.push(e),
                Err(e) => errors.push(format!("idle watch task failed: {e}")),
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(format!("{errors:?}"))
        }
    }
}

/// One stream of idle watchers, until `stopped` changes: counts its creations into `shared`;
/// an error if a watcher is cancelled, receives an event, or the stream ends.
async fn watch_idle(
    client: &mut api::etcdserverpb::watch_client::WatchClient<tonic::transport::Channel>,
    request: tonic::Request<ReceiverStream<WatchRequest>>,
    shared: &Shared,
    stopped: &mut watch::Receiver<bool>,
) -> Result<(), String> {
    let mut inbound = client
        .watch(request)
        .await
        .map_err(|s| s.message().to_string())?
        .into_inner();
    loop {
        tokio::select! {
            _ = stopped.changed() => return Ok(()),
            msg = inbound.message() => match msg {
                Ok(Some(r)) if r.canceled => {
                    return Err(format!("idle watch cancelled: {}", r.cancel_reason))
                }
                Ok(Some(r)) if !r.events.is_empty() => {
                    return Err("an idle watcher received an event".into())
                }
                Ok(Some(r)) => {
                    if r.created {
                        shared.created.fetch_add(1, Ordering::Relaxed);
                        shared.notify.notify_one();
                    }
                }
                Ok(None) => return Err("idle watch stream closed".into()),
                Err(s) => return Err(s.message().to_string()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_watches_its_own_corner_of_the_run_prefix() {
        let key = create_request("p/", IdleKind::Key, 7);
        assert_eq!((key.key, key.range_end), (b"p/00000007".to_vec(), vec![]));
        let prefix = create_request("p/", IdleKind::Prefix, 7);
        assert_eq!(prefix.key, b"p/00000007/");
        assert_eq!(prefix.range_end, b"p/000000070");
        let range = create_request("p/", IdleKind::Range, 7);
        assert_eq!(
            (range.key, range.range_end),
            (b"p/00000007/a".to_vec(), b"p/00000007/b".to_vec())
        );
    }
}
