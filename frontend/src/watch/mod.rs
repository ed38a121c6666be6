//! etcd's Watch service: the per-tenant watcher hub fed by the replica's apply loop, the
//! per-stream state machine (creates, cancels, progress, unsynced catch-up from history,
//! fragmentation) and the tonic service. Decisions are written down in `docs/watch.md`.

mod fragment;
mod hub;
mod service;
mod spec;
mod stream;
#[cfg(test)]
mod tests;

use std::sync::{Arc, RwLock};
use std::time::Duration;

use api::etcdserverpb::ResponseHeader;
use memstore::MemStore;

pub use fragment::fragments;
pub use hub::{
    DEFAULT_STREAM_BUFFER, DEFAULT_STREAM_BYTES, Delivery, INVALID_WATCH_ID, Registered,
    StreamHandle, StreamId, SyncOutcome, Unsynced, WatchHub,
};
pub use service::{ResponseStream, WatchService};
pub use spec::{WatchSpec, event_revision};
pub use stream::{Output, run_stream};

/// etcd's default `--watch-progress-notify-interval`.
pub const DEFAULT_PROGRESS_NOTIFY_INTERVAL: Duration = Duration::from_secs(10 * 60);

/// etcd's floor for the progress interval (`minWatchProgressInterval`).
pub const MIN_PROGRESS_NOTIFY_INTERVAL: Duration = Duration::from_millis(100);

/// etcd's default `--max-request-bytes` (1.5 MiB) plus its gRPC overhead allowance (512 KiB):
/// the size above which a `fragment=true` watcher's responses are split.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 1536 * 1024 + 512 * 1024;

/// Most events read from history per catch-up response (etcd sends at most 1000 revisions per
/// unsynced batch); one revision's events are never split.
pub const DEFAULT_CATCH_UP_BATCH: usize = 1000;

/// Responses queued towards gRPC per stream before the stream task waits for the client.
pub const OUTPUT_BUFFER: usize = 16;

/// Bytes of responses (encoded) queued towards gRPC per stream before the stream task waits
/// for the client, whatever their count: 16 responses of a key rewritten with 1.5 MiB values
/// and `prev_kv` held 48 MiB per stream that did not read. A response larger than this waits
/// until the queue is empty, then goes alone.
pub const OUTPUT_BYTES: usize = 4 << 20;

/// The byte budget of one stream's queued responses ([`OUTPUT_BYTES`]): the stream task takes
/// a response's encoded size before it queues the response, and the response stream
/// ([`OutputBytes::stream`]) gives it back as it hands the response to gRPC. Only the stream
/// task queues responses; the errors that end a stream take nothing.
#[derive(Clone)]
pub struct OutputBytes {
    budget: Arc<tokio::sync::Semaphore>,
    most: usize,
    /// What each queued response took, oldest first.
    queued: Arc<std::sync::Mutex<std::collections::VecDeque<tokio::sync::OwnedSemaphorePermit>>>,
}

impl OutputBytes {
    pub fn new(most: usize) -> Self {
        let most = most.clamp(
            1,
            tokio::sync::Semaphore::MAX_PERMITS.min(u32::MAX as usize),
        );
        Self {
            budget: Arc::new(tokio::sync::Semaphore::new(most)),
            most,
            queued: Arc::default(),
        }
    }

    /// Waits until `bytes` (at most the whole budget) fit beside the responses queued, and
    /// holds them for the response about to be queued.
    pub async fn take(&self, bytes: usize) {
        let n = u32::try_from(bytes.clamp(1, self.most)).unwrap_or(u32::MAX);
        // The semaphore is never closed.
        if let Ok(permit) = self.budget.clone().acquire_many_owned(n).await {
            self.lock().push_back(permit);
        }
    }

    /// Bytes the queued responses hold.
    pub fn held(&self) -> usize {
        self.most - self.budget.available_permits()
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::VecDeque<tokio::sync::OwnedSemaphorePermit>>
    {
        self.queued
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `rx` as the stream gRPC reads: each response handed on gives back what it took.
    pub fn stream<T: Send + 'static>(
        self,
        rx: tokio::sync::mpsc::Receiver<Result<T, tonic::Status>>,
    ) -> impl futures::Stream<Item = Result<T, tonic::Status>> + Send + 'static {
        use futures::StreamExt;
        tokio_stream::wrappers::ReceiverStream::new(rx).map(move |item| {
            if item.is_ok() {
                self.lock().pop_front();
            }
            item
        })
    }
}

/// How watch streams behave; `Default` is etcd's defaults.
#[derive(Debug, Clone)]
pub struct WatchConfig {
    /// Period of `progress_notify` responses to idle synced watchers (etcd adds up to 10 %
    /// jitter; so do we). Clamped to at least [`MIN_PROGRESS_NOTIFY_INTERVAL`].
    pub progress_notify_interval: Duration,
    /// Responses of `fragment=true` watchers at least this large are split.
    pub max_response_bytes: usize,
    /// Most events per catch-up response read from history.
    pub catch_up_batch: usize,
}

impl Default for WatchConfig {
    fn default() -> Self {
        Self {
            progress_notify_interval: DEFAULT_PROGRESS_NOTIFY_INTERVAL,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            catch_up_batch: DEFAULT_CATCH_UP_BATCH,
        }
    }
}

/// Errors of the watch layer; their `Display` is etcd's text where a client sees it.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// A create request's range holds no key (its end is not above its key); etcd's
    /// watchStream refuses it before it looks at the id or the start revision.
    #[error("mvcc: watcher range is empty")]
    EmptyRange,
    /// A create request named a watch id already in use on the stream.
    #[error("mvcc: duplicate watch ID provided on the WatchStream")]
    DuplicateId,
    /// The stream was closed (by the client or on shutdown).
    #[error("watch stream closed")]
    StreamClosed,
}

/// Where a watch stream's tenant lives. Implemented by the frontend core.
pub trait WatchSource: Send + Sync + 'static {
    /// Resolves the tenant of a Watch stream (from its request metadata/peer) to its store and
    /// hub; a tenant the source is still learning of (the catalogue's) is waited for.
    fn resolve<'a>(
        &'a self,
        metadata: &'a tonic::metadata::MetadataMap,
    ) -> futures::future::BoxFuture<'a, Result<WatchTarget, tonic::Status>>;

    /// Whether the stream's tenant has a journal leader as etcd's `hasleader` check means it
    /// (`Tenant::has_leader`).
    fn has_leader(&self, _metadata: &tonic::metadata::MetadataMap) -> bool {
        true
    }
}

/// etcd's metadata key and value by which a stream asks to end when its member has no leader
/// (clientv3's `WithRequireLeader`).
pub const REQUIRE_LEADER_KEY: &str = "hasleader";
/// How often a stream that requires a leader checks for one.
pub const LEADER_CHECK_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// Whether a stream's metadata asks for etcd's require-leader behaviour.
pub fn requires_leader(metadata: &tonic::metadata::MetadataMap) -> bool {
    metadata
        .get(REQUIRE_LEADER_KEY)
        .is_some_and(|v| v.as_bytes() == b"true")
}

/// For a stream that requires a leader: ends it (the item `no_leader` sent to `tx`) once
/// `has_leader` turns false, checking every `LEADER_CHECK_EVERY`. It holds `tx` weakly, so the
/// stream still ends when its producer does, and it stops then.
pub fn end_without_leader<T: Send + 'static>(
    tx: &tokio::sync::mpsc::Sender<Result<T, tonic::Status>>,
    has_leader: impl Fn() -> bool + Send + 'static,
) {
    let tx = tx.downgrade();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(LEADER_CHECK_EVERY).await;
            let Some(tx) = tx.upgrade() else {
                return;
            };
            if !has_leader() {
                let _ = tx.send(Err(no_leader())).await;
                return;
            }
        }
    });
}

/// The output channel of a stream (a watch, a keep-alive stream): for a stream that requires a
/// leader (clientv3's `WithRequireLeader`), refused at once without one and ended later, with
/// etcd's "no leader", when `has_leader` turns false.
pub type OutputChannel<T> = (
    tokio::sync::mpsc::Sender<Result<T, tonic::Status>>,
    tokio::sync::mpsc::Receiver<Result<T, tonic::Status>>,
);

/// See [`OutputChannel`]; `buffer` answers are queued before the stream waits for the client.
pub fn output_channel<T: Send + 'static>(
    metadata: &tonic::metadata::MetadataMap,
    buffer: usize,
    has_leader: impl Fn() -> bool + Send + 'static,
) -> Result<OutputChannel<T>, tonic::Status> {
    let require_leader = requires_leader(metadata);
    if require_leader && !has_leader() {
        return Err(no_leader());
    }
    let (tx, rx) = tokio::sync::mpsc::channel(buffer);
    if require_leader {
        end_without_leader(&tx, has_leader);
    }
    Ok((tx, rx))
}

/// etcd's `ErrGRPCNoLeader`.
pub fn no_leader() -> tonic::Status {
    tonic::Status::unavailable(crate::errors::msg::NO_LEADER)
}

/// A tenant's store and hub, and the header fields this frontend answers with.
pub struct WatchTarget {
    pub store: Arc<RwLock<MemStore>>,
    pub hub: Arc<WatchHub>,
    /// cluster_id, member_id, raft_term; the revision is filled per response.
    pub header: ResponseHeader,
    /// Who opened the stream (its token's user): each watch it creates needs READ on its
    /// keys while the tenant's auth is enabled.
    pub caller: crate::auth::Caller,
    /// Most watchers the tenant may have on this frontend (`--tenant-max-watchers`).
    pub max_watchers: Option<usize>,
    /// Ends the stream, with the tenant's refusal, once the catalogue suspends or deletes
    /// the tenant (none: served for as long as the stream lasts).
    pub refusal: Option<crate::tenant::Refusal>,
}
