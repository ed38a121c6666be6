//! One watch stream (one gRPC `Watch` call): answers create/cancel/progress requests as etcd's
//! `serverWatchStream` does, forwards the hub's deliveries, catches unsynced watchers up from the
//! store's history, sends periodic progress notifications and fragments large responses. One
//! task per stream, so everything a stream sends is in one order.

use std::collections::HashMap;
use std::sync::{Arc, RwLock, RwLockReadGuard};
use std::time::Duration;

use api::etcdserverpb::watch_request::RequestUnion;
use api::etcdserverpb::{ResponseHeader, WatchCreateRequest, WatchRequest, WatchResponse};
use api::mvccpb::Event;
use futures::{Stream, StreamExt};
use memstore::MemStore;
use rand::Rng;
use tokio::sync::mpsc;
use tonic::Status;
use tracing::Instrument;

use super::hub::{Delivery, INVALID_WATCH_ID, StreamHandle, SyncOutcome, Unsynced, WatchHub};
use super::spec::{WatchSpec, event_revision};
use super::{
    MIN_PROGRESS_NOTIFY_INTERVAL, OutputBytes, WatchConfig, WatchError, WatchTarget, fragments,
};

/// etcd's `rpctypes.ErrCompacted` text, the cancel reason for a negative start revision.
const ERR_COMPACTED_REASON: &str = "etcdserver: mvcc: required revision has been compacted";
/// etcd's reason for a watch its user may not read: the gRPC status's text, as Go prints it.
const PERMISSION_DENIED_REASON: &str =
    "rpc error: code = PermissionDenied desc = etcdserver: permission denied";
/// How long a watch creation waits for the hub to publish what the store already applied (a
/// chunk of entries: microseconds, unless the apply loop is held up by a long read).
const HUB_CATCH_UP: std::time::Duration = std::time::Duration::from_secs(1);

/// Per-watcher options the stream needs (the hub keeps the selection).
struct WatcherOpts {
    progress_notify: bool,
    fragment: bool,
    /// etcd's `progress[id]`: true when nothing was sent to the watcher since the last tick,
    /// so the next tick sends a progress notification.
    progress_due: bool,
}

/// The client is gone: stop the stream.
struct Closed;

/// Removes the stream's watchers from the hub however the task ends.
struct HubGuard {
    hub: Arc<WatchHub>,
    stream: u64,
}

impl Drop for HubGuard {
    fn drop(&mut self) {
        self.hub.close_stream(self.stream);
    }
}

struct StreamTask {
    store: Arc<RwLock<MemStore>>,
    hub: Arc<WatchHub>,
    header: ResponseHeader,
    config: WatchConfig,
    stream: u64,
    out: mpsc::Sender<Result<WatchResponse, Status>>,
    /// The bytes `out` may hold (`OutputBytes`).
    out_bytes: OutputBytes,
    active: HashMap<i64, WatcherOpts>,
    /// Event bytes the hub queued for this stream (`StreamHandle::queued_bytes`).
    queued_bytes: Arc<std::sync::atomic::AtomicUsize>,
    caller: crate::auth::Caller,
    max_watchers: Option<usize>,
}

/// Where a stream's responses go: the channel gRPC reads (through [`OutputBytes::stream`]) and
/// the byte budget of what it holds.
pub struct Output {
    pub tx: mpsc::Sender<Result<WatchResponse, Status>>,
    pub bytes: OutputBytes,
}

/// Serves one watch stream until the client goes away: reads requests from `input`, writes
/// responses to `out`. The frontend's `WatchService` spawns it per gRPC call; tests drive it
/// directly with channels.
pub async fn run_stream<S>(target: WatchTarget, config: WatchConfig, input: S, out: Output)
where
    S: Stream<Item = Result<WatchRequest, Status>> + Unpin + Send,
{
    let StreamHandle {
        id,
        deliveries,
        queued_bytes,
        wake,
    } = target.hub.open_stream();
    let _guard = HubGuard {
        hub: target.hub.clone(),
        stream: id,
    };
    let span = tracing::debug_span!("watch_stream", tenant = %target.hub.tenant(), stream = id);
    let task = StreamTask {
        store: target.store,
        hub: target.hub,
        header: target.header,
        config,
        stream: id,
        out: out.tx,
        out_bytes: out.bytes,
        active: HashMap::new(),
        queued_bytes,
        caller: target.caller,
        max_watchers: target.max_watchers,
    };
    serve(task, input, deliveries, wake, target.refusal)
        .instrument(span)
        .await;
}

async fn serve<S>(
    mut task: StreamTask,
    mut input: S,
    mut deliveries: mpsc::Receiver<Delivery>,
    wake: Arc<tokio::sync::Notify>,
    mut refusal: Option<crate::tenant::Refusal>,
) where
    S: Stream<Item = Result<WatchRequest, Status>> + Unpin + Send,
{
    let period = progress_period(task.config.progress_notify_interval);
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut input_open = true;
    loop {
        let step = tokio::select! {
            _ = task.out.closed() => Err(Closed),
            d = deliveries.recv() => match d {
                Some(d) => task.deliver(d).await,
                None => Err(Closed),
            },
            r = input.next(), if input_open => match r {
                Some(Ok(req)) => task.handle_request(req).await,
                Some(Err(status)) => {
                    // As etcd's Watch: the stream ends with the error its receive met.
                    tracing::debug!(%status, "watch stream receive failed");
                    let _ = task.out.send(Err(crate::rpc::receive_error(status))).await;
                    Err(Closed)
                }
                // The client closed its side: as etcd, keep sending until it goes away.
                None => {
                    input_open = false;
                    Ok(())
                }
            },
            () = wake.notified() => task.catch_up(&mut deliveries).await,
            _ = ticker.tick() => {
                task.periodic_progress();
                Ok(())
            }
            e = refused(&mut refusal) => {
                tracing::debug!(error = %e, "watch stream ended: the tenant is not served");
                let _ = task.out.send(Err(crate::rpc::handled(e))).await;
                Err(Closed)
            }
        };
        if step.is_err() {
            break;
        }
    }
    tracing::debug!("watch stream closed");
}

/// The tenant's refusal once it stops being served; never without one.
async fn refused(refusal: &mut Option<crate::tenant::Refusal>) -> crate::errors::Error {
    match refusal {
        Some(r) => r.wait().await,
        None => std::future::pending().await,
    }
}

/// etcd's interval: clamped to its minimum, plus up to 10 % jitter so watchers created
/// together do not report together.
fn progress_period(interval: Duration) -> Duration {
    let base = interval.max(MIN_PROGRESS_NOTIFY_INTERVAL);
    let jitter_ms = (base.as_millis() / 10).max(1) as u64;
    base + Duration::from_millis(rand::rng().random_range(0..jitter_ms))
}

fn read_store(store: &RwLock<MemStore>) -> RwLockReadGuard<'_, MemStore> {
    // A poisoned lock means the apply loop panicked; the replica reports that. Reading the
    // last consistent state is still what a watcher should see until the stream closes.
    store.read().unwrap_or_else(|p| p.into_inner())
}

impl StreamTask {
    fn header(&self, revision: i64) -> Option<ResponseHeader> {
        Some(ResponseHeader {
            revision,
            ..self.header
        })
    }

    fn store_revision(&self) -> i64 {
        read_store(&self.store).revision()
    }

    /// Queues `resp` once its bytes fit the stream's budget (or the client went away).
    async fn send(&self, resp: WatchResponse) -> Result<(), Closed> {
        tokio::select! {
            () = self.out_bytes.take(prost::Message::encoded_len(&resp)) => {}
            _ = self.out.closed() => return Err(Closed),
        }
        self.out.send(Ok(resp)).await.map_err(|_| Closed)
    }

    /// Sends events of whole revisions to a watcher, fragmenting if it asked for that.
    async fn send_events(
        &mut self,
        watch_id: i64,
        revision: i64,
        events: Vec<Event>,
    ) -> Result<(), Closed> {
        let Some(opts) = self.active.get_mut(&watch_id) else {
            // Cancelled: etcd drops what was still queued for it.
            return Ok(());
        };
        opts.progress_due = false;
        let fragment = opts.fragment;
        let n = events.len() as u64;
        let resp = WatchResponse {
            header: self.header(revision),
            watch_id,
            events,
            ..Default::default()
        };
        if fragment {
            for part in fragments(resp, self.config.max_response_bytes) {
                self.send(part).await?;
            }
        } else {
            self.send(resp).await?;
        }
        metrics::counter!("strata_watch_events_sent_total", "tenant" => self.hub.tenant().to_string())
            .increment(n);
        Ok(())
    }

    async fn deliver(&mut self, d: Delivery) -> Result<(), Closed> {
        self.queued_bytes
            .fetch_sub(d.bytes(), std::sync::atomic::Ordering::AcqRel);
        match d {
            Delivery::Events {
                watch_id,
                revision,
                events,
            } => self.send_events(watch_id, revision, events).await,
            Delivery::Progress { watch_id, revision } => {
                if watch_id != INVALID_WATCH_ID && !self.active.contains_key(&watch_id) {
                    return Ok(());
                }
                self.send(WatchResponse {
                    header: self.header(revision),
                    watch_id,
                    ..Default::default()
                })
                .await
            }
        }
    }

    async fn handle_request(&mut self, req: WatchRequest) -> Result<(), Closed> {
        match req.request_union {
            Some(RequestUnion::CreateRequest(c)) => self.create(c).await,
            Some(RequestUnion::CancelRequest(c)) => {
                if self.hub.cancel(self.stream, c.watch_id) {
                    self.active.remove(&c.watch_id);
                    let rev = self.store_revision();
                    self.send(WatchResponse {
                        header: self.header(rev),
                        watch_id: c.watch_id,
                        canceled: true,
                        ..Default::default()
                    })
                    .await?;
                }
                // etcd answers nothing for an unknown id.
                Ok(())
            }
            Some(RequestUnion::ProgressRequest(_)) => {
                self.hub.request_progress(self.stream);
                Ok(())
            }
            // etcd ignores a request without a body rather than ending the stream.
            None => Ok(()),
        }
    }

    async fn create(&mut self, c: WatchCreateRequest) -> Result<(), Closed> {
        // One hold of the store for its revision and the caller's permission.
        let (store_rev, permitted) = {
            let store = read_store(&self.store);
            (store.revision(), self.permitted(&store, &c))
        };
        // The created header carries at least the store's revision (a client that read at it
        // must not see a watch start below it), and every progress answer after it the hub's:
        // let the hub reach the store first, so no progress answer falls below the header.
        if !self.hub.reached(store_rev, HUB_CATCH_UP).await {
            tracing::debug!(
                store_rev,
                hub_rev = self.hub.revision(),
                "hub behind the store"
            );
        }
        if c.start_revision < 0 {
            return self.refuse(store_rev, ERR_COMPACTED_REASON).await;
        }
        if !permitted {
            // etcd 3.5: created and canceled, under the id asked for, the stream going on.
            return self
                .send(WatchResponse {
                    header: self.header(store_rev),
                    watch_id: c.watch_id,
                    created: true,
                    canceled: true,
                    cancel_reason: PERMISSION_DENIED_REASON.to_string(),
                    ..Default::default()
                })
                .await;
        }
        // The tenant's watcher quota on this frontend. Creates racing on other streams may each
        // pass the count before registering: over by at most their number.
        if let Some(max) = self.max_watchers
            && self.hub.watcher_count() >= max
        {
            metrics::counter!("strata_frontend_watchers_refused_total", "tenant" => self.hub.tenant().to_string())
                .increment(1);
            let reason = format!("strata: watcher quota of {max} per frontend reached");
            return self.refuse(store_rev, &reason).await;
        }
        let spec = WatchSpec::from_request(&c);
        match self
            .hub
            .register(self.stream, c.watch_id, spec, c.start_revision, store_rev)
        {
            Ok(reg) => {
                self.active.insert(
                    reg.watch_id,
                    WatcherOpts {
                        progress_notify: c.progress_notify,
                        fragment: c.fragment,
                        progress_due: true,
                    },
                );
                tracing::debug!(
                    watch_id = reg.watch_id,
                    start_revision = c.start_revision,
                    synced = reg.synced,
                    "watcher created"
                );
                self.send(WatchResponse {
                    header: self.header(reg.revision),
                    watch_id: reg.watch_id,
                    created: true,
                    ..Default::default()
                })
                .await
            }
            Err(WatchError::StreamClosed) => Err(Closed),
            Err(e @ (WatchError::EmptyRange | WatchError::DuplicateId)) => {
                self.refuse(store_rev, &e.to_string()).await
            }
        }
    }

    /// Whether the stream's caller may read every key the watch names (always, with auth
    /// disabled). Stricter than etcd in one case: etcd checks a watch from a key on (range end
    /// "\0") as if it named the key alone; here it needs the whole range.
    fn permitted(&self, store: &MemStore, c: &WatchCreateRequest) -> bool {
        let key: &[u8] = if c.key.is_empty() { &[0] } else { &c.key };
        store
            .check_read(self.caller.as_store(), key, &c.range_end)
            .is_ok()
    }

    /// etcd's answer to a create request it refuses: created and canceled at once, with no
    /// watch id and the reason.
    async fn refuse(&mut self, revision: i64, reason: &str) -> Result<(), Closed> {
        self.send(WatchResponse {
            header: self.header(revision),
            watch_id: INVALID_WATCH_ID,
            created: true,
            canceled: true,
            cancel_reason: reason.to_string(),
            ..Default::default()
        })
        .await
    }

    /// Catches every unsynced watcher of the stream up from the store's history.
    async fn catch_up(&mut self, deliveries: &mut mpsc::Receiver<Delivery>) -> Result<(), Closed> {
        // The list first, then the queue length: whatever was queued for these watchers
        // before they fell behind is in the queue now, and goes out before their history.
        let behind = self.hub.unsynced(self.stream);
        if behind.is_empty() {
            return Ok(());
        }
        let queued = deliveries.len();
        for _ in 0..queued {
            match deliveries.try_recv() {
                Ok(d) => self.deliver(d).await?,
                Err(_) => break,
            }
        }
        for u in behind {
            self.catch_up_one(u).await?;
        }
        Ok(())
    }

    async fn catch_up_one(&mut self, u: Unsynced) -> Result<(), Closed> {
        let mut next = u.next_rev;
        loop {
            if !self.active.contains_key(&u.watch_id) {
                return Ok(());
            }
            // Nothing past what the hub has announced: the store may be a few entries ahead of
            // it (applied, not yet published), and a progress answer carries the hub's
            // revision, which must not fall below an event already sent. The rest comes by
            // `notify` once the watcher is synced. (The hub is read first: it never runs ahead
            // of the store.)
            let hub_rev = self.hub.revision();
            let (read, store_rev, compact_rev) = {
                let store = read_store(&self.store);
                (
                    store.events(
                        next,
                        &u.spec.key,
                        &u.spec.range_end,
                        self.config.catch_up_batch,
                    ),
                    store.revision().min(hub_rev),
                    store.compact_revision(),
                )
            };
            let events = match read {
                Ok(mut events) => {
                    events.retain(|e| event_revision(e) <= store_rev);
                    events
                }
                Err(memstore::Error::Compacted) => {
                    return self.cancel_compacted(u.watch_id, compact_rev).await;
                }
                Err(e) => {
                    tracing::error!(watch_id = u.watch_id, error = %e, "watch history read failed");
                    return self.cancel_with_reason(u.watch_id, e.to_string()).await;
                }
            };
            let last = events.last().map(event_revision);
            let selected: Vec<Event> = events
                .iter()
                .filter(|e| u.spec.selects(e))
                .map(|e| u.spec.shape(e))
                .collect();
            if !selected.is_empty() {
                self.send_events(u.watch_id, store_rev, selected).await?;
            }
            next = match last {
                // Possibly cut at the batch bound: read on from the next revision.
                Some(l) if l < store_rev => l + 1,
                // Everything up to the store's revision was read; a watcher waiting for a later
                // start revision keeps it.
                _ => next.max(store_rev + 1),
            };
            if next > store_rev {
                match self.hub.try_sync(self.stream, u.watch_id, next) {
                    SyncOutcome::Synced | SyncOutcome::Gone => return Ok(()),
                    SyncOutcome::Behind => {}
                }
            }
        }
    }

    /// etcd's answer to a watcher whose position was compacted: canceled, compact_revision
    /// set, no reason, header revision 0 (as etcd 3.4/3.5 send it).
    async fn cancel_compacted(&mut self, watch_id: i64, compact_rev: i64) -> Result<(), Closed> {
        if !self.hub.cancel(self.stream, watch_id) {
            return Ok(());
        }
        self.active.remove(&watch_id);
        tracing::debug!(
            watch_id,
            compact_rev,
            "watcher cancelled: position compacted"
        );
        self.send(WatchResponse {
            header: self.header(0),
            watch_id,
            canceled: true,
            compact_revision: compact_rev,
            ..Default::default()
        })
        .await
    }

    async fn cancel_with_reason(&mut self, watch_id: i64, reason: String) -> Result<(), Closed> {
        if !self.hub.cancel(self.stream, watch_id) {
            return Ok(());
        }
        self.active.remove(&watch_id);
        let rev = self.store_revision();
        self.send(WatchResponse {
            header: self.header(rev),
            watch_id,
            canceled: true,
            cancel_reason: reason,
            ..Default::default()
        })
        .await
    }

    /// etcd's progress ticker: a watcher with `progress_notify` that was sent nothing since the
    /// last tick gets a progress notification (only while synced).
    fn periodic_progress(&mut self) {
        for (&id, opts) in self.active.iter_mut() {
            if !opts.progress_notify {
                continue;
            }
            if opts.progress_due {
                self.hub.progress_one(self.stream, id);
            }
            opts.progress_due = true;
        }
    }
}
