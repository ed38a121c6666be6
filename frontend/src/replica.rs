//! A tenant's replica: the memstore rebuilt by tailing the tenant's journal shard, the apply
//! loop that feeds it, the watch hub it notifies, and the hand-off of outcomes to the writers
//! waiting for them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::StreamExt;
use memstore::{Applied, MemStore};
use tokio::sync::{oneshot, watch};

use crate::log::{Log, LogError};
use crate::watch::WatchHub;

/// Records applied under one write lock (the stream's ready records, up to this many).
pub const APPLY_CHUNK: usize = 256;
/// First wait before re-opening a failed journal read; doubles up to the max.
pub const READ_RETRY_MIN: Duration = Duration::from_millis(100);
pub const READ_RETRY_MAX: Duration = Duration::from_secs(2);

/// Where the replica stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplicaState {
    /// Catching up to the committed index the journal reported when the replica started.
    CatchingUp,
    /// Caught up once; serving.
    Ready,
    /// Stopped: it cannot go on without diverging (undecodable record, trimmed position with no
    /// checkpoint to load). An operator must look.
    Failed(String),
}

/// One tenant's replica on this frontend.
pub struct Replica {
    tenant: String,
    shard: u32,
    store: Arc<RwLock<MemStore>>,
    hub: Arc<WatchHub>,
    applied: watch::Sender<u64>,
    state: watch::Sender<ReplicaState>,
    term: AtomicU64,
    /// Writers waiting for the outcome of their entry, by request id.
    waiters: Mutex<HashMap<Vec<u8>, oneshot::Sender<Applied>>>,
}

impl Replica {
    pub fn new(tenant: &str, shard: u32, store: MemStore) -> Arc<Self> {
        let applied_index = store.applied_index();
        Arc::new(Self {
            tenant: tenant.to_string(),
            shard,
            store: Arc::new(RwLock::new(store)),
            hub: Arc::new(WatchHub::for_tenant(tenant)),
            applied: watch::channel(applied_index).0,
            state: watch::channel(ReplicaState::CatchingUp).0,
            term: AtomicU64::new(0),
            waiters: Mutex::new(HashMap::new()),
        })
    }

    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    pub fn store(&self) -> &Arc<RwLock<MemStore>> {
        &self.store
    }

    pub fn hub(&self) -> &Arc<WatchHub> {
        &self.hub
    }

    /// Journal term of the newest applied record (etcd's raft_term in headers).
    pub fn term(&self) -> u64 {
        self.term.load(Ordering::Relaxed)
    }

    pub fn applied_index(&self) -> u64 {
        *self.applied.borrow()
    }

    pub fn state(&self) -> ReplicaState {
        self.state.borrow().clone()
    }

    pub fn subscribe_state(&self) -> watch::Receiver<ReplicaState> {
        self.state.subscribe()
    }

    /// Reads the store; a poisoned lock means an apply panicked, which is an invariant breach.
    pub fn read(&self) -> std::sync::RwLockReadGuard<'_, MemStore> {
        self.store
            .read()
            .unwrap_or_else(|p| panic!("memstore lock poisoned by a panicking apply: {p}"))
    }

    /// Waits until the replica has applied `index`; `false` if it failed or `timeout` passed.
    pub async fn wait_applied(&self, index: u64, timeout: Duration) -> bool {
        let mut rx = self.applied.subscribe();
        matches!(
            tokio::time::timeout(timeout, rx.wait_for(|a| *a >= index)).await,
            Ok(Ok(_))
        )
    }

    /// Registers interest in the outcome of the entry carrying `request_id`; must happen before
    /// the entry is appended.
    pub fn expect(&self, request_id: &[u8]) -> oneshot::Receiver<Applied> {
        let (tx, rx) = oneshot::channel();
        self.lock_waiters().insert(request_id.to_vec(), tx);
        rx
    }

    /// Drops interest (the append failed or the caller gave up).
    pub fn forget(&self, request_id: &[u8]) {
        self.lock_waiters().remove(request_id);
    }

    fn lock_waiters(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<Vec<u8>, oneshot::Sender<Applied>>> {
        // The map holds no invariant a panic could break half-way.
        self.waiters.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The apply loop: tails the shard from the replica's applied index and applies every
    /// record. Returns only when the replica failed.
    pub async fn run(self: Arc<Self>, log: Arc<dyn Log>) {
        tokio::spawn(self.clone().watch_readiness(log.clone()));
        let mut backoff = READ_RETRY_MIN;
        loop {
            let from = self.applied_index() + 1;
            let stream = match log.read(self.shard, from).await {
                Ok(s) => s,
                Err(e) => {
                    if self.fail_if_fatal(&e) {
                        return;
                    }
                    tracing::warn!(tenant = %self.tenant, shard = self.shard, error = %e, "journal read failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(READ_RETRY_MAX);
                    continue;
                }
            };
            let mut chunks = stream.ready_chunks(APPLY_CHUNK);
            while let Some(chunk) = chunks.next().await {
                match self.apply_chunk(chunk) {
                    Ok(()) => backoff = READ_RETRY_MIN,
                    Err(ApplyStop::Retry(e)) => {
                        tracing::warn!(tenant = %self.tenant, shard = self.shard, error = %e, "journal read broke; re-opening");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(READ_RETRY_MAX);
                        break;
                    }
                    Err(ApplyStop::Fatal(reason)) => {
                        tracing::error!(tenant = %self.tenant, shard = self.shard, %reason, "replica stopped");
                        self.state.send_replace(ReplicaState::Failed(reason));
                        return;
                    }
                }
            }
        }
    }

    fn fail_if_fatal(&self, e: &LogError) -> bool {
        if let LogError::Trimmed { first_index } = e {
            let reason = format!(
                "journal trimmed below {first_index} but the replica has applied only {}; a checkpoint is needed",
                self.applied_index()
            );
            tracing::error!(tenant = %self.tenant, shard = self.shard, %reason, "replica stopped");
            self.state.send_replace(ReplicaState::Failed(reason));
            return true;
        }
        false
    }

    /// Applies a run of records: all under one write lock, then notifies the hub in order,
    /// hands outcomes to their writers and publishes the new applied index.
    fn apply_chunk(
        &self,
        chunk: Vec<Result<api::strata::journal::Record, LogError>>,
    ) -> Result<(), ApplyStop> {
        let mut applied = Vec::with_capacity(chunk.len());
        let mut stop = None;
        {
            let mut store = self
                .store
                .write()
                .unwrap_or_else(|p| panic!("memstore lock poisoned by a panicking apply: {p}"));
            let mut expected = store.applied_index() + 1;
            for record in chunk {
                let record = match record {
                    Ok(r) => r,
                    Err(LogError::Trimmed { first_index }) => {
                        stop = Some(ApplyStop::Fatal(format!(
                            "journal trimmed below {first_index} while tailing"
                        )));
                        break;
                    }
                    Err(e) => {
                        stop = Some(ApplyStop::Retry(e));
                        break;
                    }
                };
                if record.index < expected {
                    continue; // already applied (a re-opened read overlapping)
                }
                if record.index > expected {
                    stop = Some(ApplyStop::Retry(LogError::Unavailable(format!(
                        "gap in journal read: expected {expected}, got {}",
                        record.index
                    ))));
                    break;
                }
                let entry = match api::record::entry_for_tenant(&record, &self.tenant) {
                    Ok(e) => e,
                    Err(e) => {
                        stop = Some(ApplyStop::Fatal(e.to_string()));
                        break;
                    }
                };
                self.term.fetch_max(record.term, Ordering::Relaxed);
                let out = store.apply(record.index, &entry);
                expected = record.index + 1;
                applied.push((entry.request_id, out));
            }
        }
        self.publish(applied);
        stop.map_or(Ok(()), Err)
    }

    fn publish(&self, applied: Vec<(Vec<u8>, Applied)>) {
        let Some(last) = applied.last().map(|(_, a)| a.index) else {
            return;
        };
        for (request_id, out) in applied {
            self.hub.notify(out.revision, &out.events);
            if !request_id.is_empty()
                && let Some(w) = self.lock_waiters().remove(&request_id)
            {
                let _ = w.send(out);
            }
        }
        self.applied.send_replace(last);
        metrics::gauge!("strata_frontend_applied_index", "tenant" => self.tenant.clone())
            .set(last as f64);
    }

    /// Marks the replica ready once it applied the committed index the journal reported at
    /// start (asking until the journal answers).
    async fn watch_readiness(self: Arc<Self>, log: Arc<dyn Log>) {
        let mut backoff = READ_RETRY_MIN;
        let target = loop {
            match log.status(self.shard).await {
                Ok(s) => break s.committed_index,
                Err(e) => {
                    tracing::warn!(tenant = %self.tenant, shard = self.shard, error = %e, "journal status failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(READ_RETRY_MAX);
                }
            }
        };
        let mut rx = self.applied.subscribe();
        if rx.wait_for(|a| *a >= target).await.is_ok() {
            self.state.send_if_modified(|s| {
                if *s == ReplicaState::CatchingUp {
                    *s = ReplicaState::Ready;
                    true
                } else {
                    false
                }
            });
            tracing::info!(tenant = %self.tenant, shard = self.shard, index = target, "replica caught up; ready");
        }
    }
}

enum ApplyStop {
    Retry(LogError),
    Fatal(String),
}
