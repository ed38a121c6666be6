//! The per-tenant watcher hub: which watchers exist, which are synced (fed by `notify`) and
//! which are unsynced (behind, caught up from the store's history by their stream), and the
//! bounded per-stream delivery queues. `notify` never blocks: a watcher whose stream queue is
//! full is moved to unsynced at the first revision it did not get, as etcd's watchable store
//! moves slow watchers aside.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use api::mvccpb::Event;
use tokio::sync::{Notify, mpsc};

use super::WatchError;
use super::spec::{WatchSpec, event_revision};

/// Responses buffered per watch stream before its watchers are moved to unsynced (etcd's
/// `chanBufLen`).
pub const DEFAULT_STREAM_BUFFER: usize = 128;

/// Bytes of events (keys, values, previous values) queued per watch stream before its watchers
/// are moved to unsynced, whatever the number of responses: a stream that does not read holds
/// at most this much (plus one delivery), and its watchers catch up from history once it reads
/// again. Each watcher's events are its own copies, so 128 responses of 2 MiB values with their
/// previous values held about 275 MB per stream that never read (found by a review of limits).
pub const DEFAULT_STREAM_BYTES: usize = 8 * 1024 * 1024;

/// The watch id etcd uses for "no watcher" (a failed create, a stream-wide progress response).
pub const INVALID_WATCH_ID: i64 = -1;

/// Identifies one watch stream (one gRPC `Watch` call) inside a hub.
pub type StreamId = u64;

/// What the hub hands a stream: a batch for one watcher, or a progress notification.
#[derive(Debug, Clone, PartialEq)]
pub enum Delivery {
    /// Events of whole revisions for `watch_id`, already filtered and shaped for it; `revision`
    /// is the header revision etcd sends with them.
    Events {
        watch_id: i64,
        revision: i64,
        events: Vec<Event>,
    },
    /// Every watcher named (one, or all of the stream's for `INVALID_WATCH_ID`) has received
    /// every event up to `revision`.
    Progress { watch_id: i64, revision: i64 },
}

impl Delivery {
    /// What the delivery holds in event bytes (keys, values, previous values), for the byte
    /// bound of a stream's queue.
    pub fn bytes(&self) -> usize {
        match self {
            Delivery::Events { events, .. } => events
                .iter()
                .map(|e| {
                    let kv = |kv: &Option<api::mvccpb::KeyValue>| {
                        kv.as_ref().map_or(0, |kv| kv.key.len() + kv.value.len())
                    };
                    kv(&e.kv) + kv(&e.prev_kv)
                })
                .sum(),
            Delivery::Progress { .. } => 0,
        }
    }
}

/// How a catch-up attempt ended (see [`WatchHub::try_sync`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncOutcome {
    /// The watcher is synced: `notify` feeds it from now on.
    Synced,
    /// The hub has seen revisions at or past the position: read the store again.
    Behind,
    /// The watcher no longer exists (cancelled meanwhile).
    Gone,
}

/// One unsynced watcher as its stream needs it for catching up.
#[derive(Debug, Clone)]
pub struct Unsynced {
    pub watch_id: i64,
    pub spec: Arc<WatchSpec>,
    pub next_rev: i64,
}

/// A watcher registered by [`WatchHub::register`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registered {
    pub watch_id: i64,
    /// The revision etcd puts in the created response's header.
    pub revision: i64,
    /// False when the watcher starts behind and its stream must catch it up.
    pub synced: bool,
}

/// The receiving side a stream gets from [`WatchHub::open_stream`].
pub struct StreamHandle {
    pub id: StreamId,
    pub deliveries: mpsc::Receiver<Delivery>,
    /// Event bytes queued in `deliveries`: the stream takes a delivery's `bytes()` off when it
    /// takes the delivery.
    pub queued_bytes: Arc<AtomicUsize>,
    /// Woken when one of the stream's watchers became unsynced and needs catching up.
    pub wake: Arc<Notify>,
}

struct Watcher {
    spec: Arc<WatchSpec>,
    /// Every event below this revision has been queued for (or skipped by) the watcher.
    next_rev: i64,
    synced: bool,
}

struct StreamSlot {
    tx: mpsc::Sender<Delivery>,
    queued_bytes: Arc<AtomicUsize>,
    wake: Arc<Notify>,
    watchers: HashMap<i64, Watcher>,
    /// etcd's next generated watch id for this stream.
    next_id: i64,
    /// A `RequestProgress` arrived while a watcher was unsynced (or the queue was full): it is
    /// answered as soon as every watcher of the stream is synced (etcd 3.5 `deferredProgress`).
    progress_deferred: bool,
}

impl StreamSlot {
    fn all_synced(&self) -> bool {
        self.watchers.values().all(|w| w.synced)
    }

    /// Queues a stream-wide progress response if every watcher is synced; true when answered
    /// (or when there is nobody to answer, as etcd does).
    fn try_progress_all(&mut self, revision: i64) -> bool {
        if self.watchers.is_empty() {
            return true;
        }
        if !self.all_synced() {
            return false;
        }
        let d = Delivery::Progress {
            watch_id: INVALID_WATCH_ID,
            revision,
        };
        self.tx.try_send(d).is_ok()
    }
}

struct HubState {
    /// The last revision passed to `notify`.
    revision: i64,
    streams: HashMap<StreamId, StreamSlot>,
    next_stream: StreamId,
    index: WatchIndex,
    /// Streams with a deferred progress request (`StreamSlot::progress_deferred`).
    deferred: BTreeSet<StreamId>,
}

/// Which watchers an event may concern, so that `notify` visits those and not every watcher
/// of the tenant (etcd keeps a map of single keys and an interval tree of ranges):
/// - single-key watchers by their key;
/// - prefix watchers (a range from `p` to etcd's prefix end of `p`, which holds exactly the
///   keys starting with `p`) by their prefix, looked up for each prefix length in use;
/// - the others (ranges between two keys, every key from one) in a list with their specs,
///   checked against a revision's keys before the watcher is looked up.
///
/// A tenant's single-key watchers can be thousands (leader-election observers, per-node
/// keys), and so can its prefix watchers (per-node prefixes); kube-apiserver watches one
/// prefix per resource.
#[derive(Default)]
struct WatchIndex {
    by_key: HashMap<Vec<u8>, Vec<(StreamId, i64)>>,
    by_prefix: HashMap<Vec<u8>, Vec<(StreamId, i64)>>,
    /// The prefix lengths `by_prefix` holds, with how many prefixes of each.
    prefix_lens: std::collections::BTreeMap<usize, usize>,
    ranged: Vec<(StreamId, i64, Arc<WatchSpec>)>,
}

/// Where the index keeps a watcher of `spec`.
#[derive(Debug, PartialEq, Eq)]
enum Place {
    Key,
    Prefix,
    Ranged,
}

fn place(spec: &WatchSpec) -> Place {
    if spec.range_end.is_empty() {
        Place::Key
    } else if spec.range_end != [0] && api::prefix_range_end(&spec.key) == spec.range_end {
        Place::Prefix
    } else {
        Place::Ranged
    }
}

/// Removes `id` from the list under `key`, and the list once empty; true if it was the last.
fn remove_id(
    map: &mut HashMap<Vec<u8>, Vec<(StreamId, i64)>>,
    key: &[u8],
    id: (StreamId, i64),
) -> bool {
    let Some(ids) = map.get_mut(key) else {
        return false;
    };
    ids.retain(|&x| x != id);
    if ids.is_empty() {
        map.remove(key);
        return true;
    }
    false
}

impl WatchIndex {
    fn insert(&mut self, spec: &Arc<WatchSpec>, id: (StreamId, i64)) {
        match place(spec) {
            Place::Key => self.by_key.entry(spec.key.clone()).or_default().push(id),
            Place::Prefix => {
                let ids = self.by_prefix.entry(spec.key.clone()).or_default();
                if ids.is_empty() {
                    *self.prefix_lens.entry(spec.key.len()).or_default() += 1;
                }
                ids.push(id);
            }
            Place::Ranged => self.ranged.push((id.0, id.1, spec.clone())),
        }
    }

    fn remove(&mut self, spec: &WatchSpec, id: (StreamId, i64)) {
        match place(spec) {
            Place::Key => {
                remove_id(&mut self.by_key, &spec.key, id);
            }
            Place::Prefix => {
                let len = spec.key.len();
                if remove_id(&mut self.by_prefix, &spec.key, id)
                    && let Some(n) = self.prefix_lens.get_mut(&len)
                {
                    *n -= 1;
                    if *n == 0 {
                        self.prefix_lens.remove(&len);
                    }
                }
            }
            Place::Ranged => {
                if let Some(at) = self.ranged.iter().position(|r| (r.0, r.1) == id) {
                    self.ranged.swap_remove(at);
                }
            }
        }
    }

    /// Watchers indexed.
    #[cfg(test)]
    fn len(&self) -> usize {
        let listed =
            |m: &HashMap<Vec<u8>, Vec<(StreamId, i64)>>| m.values().map(Vec::len).sum::<usize>();
        listed(&self.by_key) + listed(&self.by_prefix) + self.ranged.len()
    }

    /// The watchers whose range holds a key of `group` (one revision's events). Two keys of
    /// one revision under one watcher (a txn) name it twice; `notify` skips the second visit,
    /// the watcher's position being past the revision by then.
    fn candidates(&self, group: &[Event]) -> Vec<(StreamId, i64)> {
        let keys = || {
            group
                .iter()
                .filter_map(|e| e.kv.as_ref().map(|kv| &kv.key[..]))
        };
        let mut out: Vec<(StreamId, i64)> = self
            .ranged
            .iter()
            .filter(|(_, _, spec)| keys().any(|k| spec.contains(k)))
            .map(|&(stream, id, _)| (stream, id))
            .collect();
        for k in keys() {
            if let Some(ids) = self.by_key.get(k) {
                out.extend(ids);
            }
            for (&len, _) in self.prefix_lens.range(..=k.len()) {
                if let Some(ids) = self.by_prefix.get(&k[..len]) {
                    out.extend(ids);
                }
            }
        }
        out
    }
}

/// A tenant's watchers. Shared by the replica's apply loop (`notify`) and every watch stream of
/// the tenant on this frontend.
pub struct WatchHub {
    state: Mutex<HubState>,
    stream_buffer: usize,
    stream_bytes: usize,
    tenant: String,
    /// Wakes watch creations waiting for the hub to catch up with the store (`reached`).
    /// Signalled only while one waits: a channel send per applied entry costs several locks.
    advanced: tokio::sync::watch::Sender<()>,
}

impl Default for WatchHub {
    fn default() -> Self {
        Self::new()
    }
}

impl WatchHub {
    /// A hub for the default tenant with etcd's per-stream buffer.
    pub fn new() -> Self {
        Self::for_tenant("default")
    }

    /// A hub whose metrics carry `tenant` as their label.
    pub fn for_tenant(tenant: &str) -> Self {
        Self::with_buffer(tenant, DEFAULT_STREAM_BUFFER)
    }

    /// A hub over a store already at `revision` (a replica started from a checkpoint): progress
    /// answers carry that revision until the first entry is applied, never 0 (etcd clients do
    /// not take a progress response with revision 0 for one).
    pub fn for_store_at(tenant: &str, revision: i64) -> Self {
        let hub = Self::for_tenant(tenant);
        hub.lock().revision = revision;
        hub
    }

    /// A hub whose streams buffer at most `stream_buffer` responses (at least 1) before their
    /// watchers fall back to catching up from history.
    pub fn with_buffer(tenant: &str, stream_buffer: usize) -> Self {
        Self::with_limits(tenant, stream_buffer, DEFAULT_STREAM_BYTES)
    }

    /// A hub whose streams queue at most `stream_buffer` responses and about `stream_bytes` of
    /// events (always one delivery) before their watchers fall back to catching up from history.
    pub fn with_limits(tenant: &str, stream_buffer: usize, stream_bytes: usize) -> Self {
        Self {
            state: Mutex::new(HubState {
                revision: 0,
                streams: HashMap::new(),
                next_stream: 1,
                index: WatchIndex::default(),
                deferred: BTreeSet::new(),
            }),
            stream_buffer: stream_buffer.max(1),
            stream_bytes,
            tenant: tenant.to_string(),
            advanced: tokio::sync::watch::Sender::new(()),
        }
    }

    /// Waits (at most `timeout`) until `notify` has reached `revision`: the store may be a
    /// chunk of entries ahead of the hub (applied, not yet published). True if it has.
    pub async fn reached(&self, revision: i64, timeout: std::time::Duration) -> bool {
        // Subscribed before the revision is read: a `notify` that advances it afterwards sees
        // this receiver (both under the hub's lock) and wakes it.
        let mut rx = self.advanced.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|()| self.revision() >= revision))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    fn lock(&self) -> MutexGuard<'_, HubState> {
        // A panic while holding the lock leaves plain maps behind, still consistent enough to
        // serve; recover rather than poisoning every stream of the tenant.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The last revision `notify` was called with.
    pub fn revision(&self) -> i64 {
        self.lock().revision
    }

    /// Number of watchers over all streams.
    pub fn watcher_count(&self) -> usize {
        self.lock().streams.values().map(|s| s.watchers.len()).sum()
    }

    /// Number of watchers currently behind (being caught up from history).
    pub fn unsynced_count(&self) -> usize {
        self.lock()
            .streams
            .values()
            .map(|s| s.watchers.values().filter(|w| !w.synced).count())
            .sum()
    }

    /// The tenant label of this hub's metrics.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// Called by the replica after applying an entry (in revision order, also with no events):
    /// hands each synced watcher the events it selects, one delivery per revision; a watcher
    /// whose stream queue is full becomes unsynced at the first revision it missed. Never waits.
    pub fn notify(&self, revision: i64, events: &[Event]) {
        let mut st = self.lock();
        let mut wake_waiters = false;
        if revision > st.revision {
            st.revision = revision;
            wake_waiters = self.advanced.receiver_count() > 0;
        }
        let hub_rev = st.revision;
        let mut newly_unsynced = 0usize;
        let mut woken: Vec<StreamId> = Vec::new();
        let HubState {
            streams,
            index,
            deferred,
            ..
        } = &mut *st;
        for (rev, group) in group_by_revision(events) {
            for (stream, watch_id) in index.candidates(group) {
                let Some(slot) = streams.get_mut(&stream) else {
                    continue;
                };
                let Some(w) = slot.watchers.get_mut(&watch_id) else {
                    continue;
                };
                if !w.synced || rev < w.next_rev {
                    continue;
                }
                let selected: Vec<Event> = group
                    .iter()
                    .filter(|e| w.spec.selects(e))
                    .map(|e| w.spec.shape(e))
                    .collect();
                if selected.is_empty() {
                    continue;
                }
                let d = Delivery::Events {
                    watch_id,
                    revision: rev,
                    events: selected,
                };
                // Counted before the send, so the stream never takes off more than was put on;
                // a queue holding bytes takes no more past the bound.
                let size = d.bytes();
                let before = slot.queued_bytes.fetch_add(size, Ordering::AcqRel);
                let sent = if before > 0 && before + size > self.stream_bytes {
                    Err(mpsc::error::TrySendError::Full(d))
                } else {
                    slot.tx.try_send(d)
                };
                if sent.is_err() {
                    slot.queued_bytes.fetch_sub(size, Ordering::AcqRel);
                }
                match sent {
                    Ok(()) => w.next_rev = rev + 1,
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        // Everything below `rev` is queued; `rev` and later come from history
                        // once the stream has room again (later revisions skip it: unsynced).
                        w.next_rev = rev;
                        w.synced = false;
                        newly_unsynced += 1;
                        woken.push(stream);
                    }
                    // The stream is going away; its drop guard removes it.
                    Err(mpsc::error::TrySendError::Closed(_)) => {}
                }
            }
        }
        woken.sort_unstable();
        woken.dedup();
        for stream in woken {
            if let Some(slot) = streams.get(&stream) {
                slot.wake.notify_one();
            }
        }
        // Streams waiting to answer a progress request (entries whose slot answered elsewhere
        // or went away leave here).
        deferred.retain(|stream| match streams.get_mut(stream) {
            Some(slot) if slot.progress_deferred => {
                let answered = slot.try_progress_all(hub_rev);
                if answered {
                    slot.progress_deferred = false;
                }
                !answered
            }
            _ => false,
        });
        drop(st);
        // Outside the hub's lock: a waiter's check reads the revision under it while holding
        // the channel's.
        if wake_waiters {
            self.advanced.send_replace(());
        }
        if newly_unsynced > 0 {
            tracing::debug!(
                tenant = %self.tenant,
                watchers = newly_unsynced,
                revision,
                "watchers fell behind their stream and are caught up from history"
            );
            metrics::counter!("strata_watch_slow_watchers_total", "tenant" => self.tenant.clone())
                .increment(newly_unsynced as u64);
        }
    }

    /// The store under the hub was replaced by one whose history no longer holds the
    /// revisions from `from` on (a checkpoint reload after a journal trim): every synced watcher
    /// has seen everything below `from` and becomes unsynced at `from`, so its stream catches it
    /// up from the new store's history, which cancels it with `compact_revision` set when that
    /// history is compacted, as etcd cancels a watcher whose position was compacted. Unsynced
    /// watchers keep their position and meet the same fate. Answers how many were moved.
    pub fn desync_all(&self, from: i64) -> usize {
        let mut st = self.lock();
        let mut moved = 0usize;
        for slot in st.streams.values_mut() {
            let mut wake = false;
            for w in slot.watchers.values_mut() {
                if w.synced {
                    w.synced = false;
                    w.next_rev = w.next_rev.max(from);
                    moved += 1;
                }
                wake = true;
            }
            if wake {
                slot.wake.notify_one();
            }
        }
        moved
    }

    /// Opens a stream: its delivery queue and wake-up signal.
    pub fn open_stream(&self) -> StreamHandle {
        let (tx, rx) = mpsc::channel(self.stream_buffer);
        let wake = Arc::new(Notify::new());
        let queued_bytes = Arc::new(AtomicUsize::new(0));
        let mut st = self.lock();
        let id = st.next_stream;
        st.next_stream += 1;
        st.streams.insert(
            id,
            StreamSlot {
                tx,
                queued_bytes: queued_bytes.clone(),
                wake: wake.clone(),
                watchers: HashMap::new(),
                next_id: 0,
                progress_deferred: false,
            },
        );
        StreamHandle {
            id,
            deliveries: rx,
            queued_bytes,
            wake,
        }
    }

    /// Closes a stream and drops all its watchers.
    pub fn close_stream(&self, stream: StreamId) {
        let mut st = self.lock();
        if let Some(slot) = st.streams.remove(&stream) {
            for (id, w) in slot.watchers {
                st.index.remove(&w.spec, (stream, id));
            }
        }
        st.deferred.remove(&stream);
    }

    /// Registers a watcher on `stream`. `watch_id` 0 asks for a generated id (etcd's
    /// `AutoWatchID`); a taken id fails with [`WatchError::DuplicateId`], a range holding no
    /// key with [`WatchError::EmptyRange`] before anything else. `start_rev` 0 means
    /// "from now"; `store_rev` is the store's revision read just before this call (the store is
    /// never behind the hub), so "now" never includes a write already acknowledged.
    pub fn register(
        &self,
        stream: StreamId,
        watch_id: i64,
        spec: WatchSpec,
        start_rev: i64,
        store_rev: i64,
    ) -> Result<Registered, WatchError> {
        if spec.is_empty() {
            return Err(WatchError::EmptyRange);
        }
        let mut st = self.lock();
        let now = st.revision.max(store_rev);
        let slot = st
            .streams
            .get_mut(&stream)
            .ok_or(WatchError::StreamClosed)?;
        let id = if watch_id == 0 {
            while slot.watchers.contains_key(&slot.next_id) {
                slot.next_id += 1;
            }
            let id = slot.next_id;
            slot.next_id += 1;
            id
        } else if slot.watchers.contains_key(&watch_id) {
            return Err(WatchError::DuplicateId);
        } else {
            watch_id
        };
        // As etcd: synced when starting now or in the future, else caught up from history.
        let synced = start_rev == 0 || start_rev > now;
        let next_rev = if start_rev == 0 { now + 1 } else { start_rev };
        let spec = Arc::new(spec);
        slot.watchers.insert(
            id,
            Watcher {
                spec: spec.clone(),
                next_rev,
                synced,
            },
        );
        if !synced {
            slot.wake.notify_one();
        }
        st.index.insert(&spec, (stream, id));
        Ok(Registered {
            watch_id: id,
            revision: now,
            synced,
        })
    }

    /// Removes a watcher; false if the stream has no such watcher.
    pub fn cancel(&self, stream: StreamId, watch_id: i64) -> bool {
        let mut st = self.lock();
        let Some(w) = st
            .streams
            .get_mut(&stream)
            .and_then(|s| s.watchers.remove(&watch_id))
        else {
            return false;
        };
        st.index.remove(&w.spec, (stream, watch_id));
        true
    }

    /// The stream's unsynced watchers, lowest position first.
    pub fn unsynced(&self, stream: StreamId) -> Vec<Unsynced> {
        let st = self.lock();
        let mut out: Vec<Unsynced> = st
            .streams
            .get(&stream)
            .map(|s| {
                s.watchers
                    .iter()
                    .filter(|(_, w)| !w.synced)
                    .map(|(&watch_id, w)| Unsynced {
                        watch_id,
                        spec: w.spec.clone(),
                        next_rev: w.next_rev,
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.sort_by_key(|u| (u.next_rev, u.watch_id));
        out
    }

    /// After a stream sent an unsynced watcher every event below `next_rev` from the store's
    /// history: marks it synced if the hub has not been notified of `next_rev` or later yet
    /// (then `notify` delivers everything from `next_rev` on), else records the position.
    pub fn try_sync(&self, stream: StreamId, watch_id: i64, next_rev: i64) -> SyncOutcome {
        let mut st = self.lock();
        let hub_rev = st.revision;
        let Some(slot) = st.streams.get_mut(&stream) else {
            return SyncOutcome::Gone;
        };
        let Some(w) = slot.watchers.get_mut(&watch_id) else {
            return SyncOutcome::Gone;
        };
        w.next_rev = next_rev;
        if hub_rev >= next_rev {
            return SyncOutcome::Behind;
        }
        w.synced = true;
        if slot.progress_deferred && slot.try_progress_all(hub_rev) {
            slot.progress_deferred = false;
        }
        SyncOutcome::Synced
    }

    /// etcd's `RequestProgress`: queues a progress response (watch id -1) with the hub's
    /// revision if every watcher of the stream is synced, else defers it until they are.
    pub fn request_progress(&self, stream: StreamId) {
        let mut st = self.lock();
        let rev = st.revision;
        if let Some(slot) = st.streams.get_mut(&stream)
            && !slot.progress_deferred
            && !slot.try_progress_all(rev)
        {
            slot.progress_deferred = true;
            st.deferred.insert(stream);
        }
    }

    /// The periodic progress notification of one watcher: queued only while it is synced (as
    /// etcd's `progressIfSync`); true if queued.
    pub fn progress_one(&self, stream: StreamId, watch_id: i64) -> bool {
        let st = self.lock();
        let rev = st.revision;
        let Some(slot) = st.streams.get(&stream) else {
            return false;
        };
        match slot.watchers.get(&watch_id) {
            Some(w) if w.synced => slot
                .tx
                .try_send(Delivery::Progress {
                    watch_id,
                    revision: rev,
                })
                .is_ok(),
            _ => false,
        }
    }
}

/// Splits events (in revision order) into runs of one revision each.
fn group_by_revision(events: &[Event]) -> Vec<(i64, &[Event])> {
    let mut out = Vec::new();
    let mut start = 0;
    for i in 1..=events.len() {
        if i == events.len() || event_revision(&events[i]) != event_revision(&events[start]) {
            out.push((event_revision(&events[start]), &events[start..i]));
            start = i;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::mvccpb::KeyValue;
    use api::mvccpb::event::EventType;

    fn put(key: &str, rev: i64) -> Event {
        Event {
            r#type: EventType::Put as i32,
            kv: Some(KeyValue {
                key: key.as_bytes().to_vec(),
                mod_revision: rev,
                create_revision: rev,
                version: 1,
                value: b"v".to_vec(),
                ..Default::default()
            }),
            prev_kv: None,
        }
    }

    #[test]
    fn generated_ids_skip_taken_ones_and_duplicates_fail() {
        let hub = WatchHub::new();
        let s = hub.open_stream();
        let spec = || WatchSpec::range(b"a", b"");
        assert_eq!(hub.register(s.id, 1, spec(), 0, 0).unwrap().watch_id, 1);
        assert_eq!(hub.register(s.id, 0, spec(), 0, 0).unwrap().watch_id, 0);
        assert_eq!(hub.register(s.id, 0, spec(), 0, 0).unwrap().watch_id, 2);
        assert!(matches!(
            hub.register(s.id, 2, spec(), 0, 0),
            Err(WatchError::DuplicateId)
        ));
        // Ids are per stream.
        let s2 = hub.open_stream();
        assert_eq!(hub.register(s2.id, 2, spec(), 0, 0).unwrap().watch_id, 2);
        assert_eq!(hub.watcher_count(), 4);
        hub.close_stream(s.id);
        assert_eq!(hub.watcher_count(), 1);
    }

    #[test]
    fn notify_groups_per_revision_and_respects_start() {
        let hub = WatchHub::new();
        let mut s = hub.open_stream();
        let r = hub
            .register(s.id, 0, WatchSpec::range(b"a", b"\0"), 0, 3)
            .unwrap();
        assert_eq!((r.revision, r.synced), (3, true));
        // Revision 3 is "before now" for this watcher even if the hub is told of it late.
        hub.notify(3, &[put("a", 3)]);
        hub.notify(5, &[put("a", 4), put("b", 5), put("c", 5)]);
        let d1 = s.deliveries.try_recv().unwrap();
        let d2 = s.deliveries.try_recv().unwrap();
        assert!(s.deliveries.try_recv().is_err());
        assert_eq!(
            d1,
            Delivery::Events {
                watch_id: r.watch_id,
                revision: 4,
                events: vec![put("a", 4)]
            }
        );
        assert!(
            matches!(d2, Delivery::Events { revision: 5, ref events, .. } if events.len() == 2)
        );
    }

    /// `notify` reaches watchers through the index (single keys by key, ranges in a set): over
    /// random opens, registrations of single-key and ranged watchers (filters included),
    /// cancels, stream closes and revisions of one to three puts and deletes (one key twice,
    /// as a txn may), every stream receives exactly what a walk of every watcher selects.
    #[test]
    fn notify_through_the_index_reaches_exactly_the_selecting_watchers() {
        use rand::rngs::StdRng;
        use rand::{Rng, SeedableRng};
        let mut rng = StdRng::seed_from_u64(0x1de_c0de);
        let hub = WatchHub::with_buffer("t", 1 << 16);
        let mut streams: Vec<StreamHandle> = Vec::new();
        // Every live watcher: (stream, watch id, spec).
        let mut live: Vec<(StreamId, i64, WatchSpec)> = Vec::new();
        let key = |rng: &mut StdRng| format!("k{}", rng.random_range(0..12)).into_bytes();
        let mut rev = 1;
        for _ in 0..3_000 {
            match rng.random_range(0..10) {
                0 => streams.push(hub.open_stream()),
                1..=4 if !streams.is_empty() => {
                    let stream = streams[rng.random_range(0..streams.len())].id;
                    let k = key(&mut rng);
                    let mut spec = match rng.random_range(0..6) {
                        0 => WatchSpec::range(&k, b"\0"),
                        // A prefix: "", "k", "k1" or the whole key.
                        1 | 2 => {
                            let p = &k[..rng.random_range(0..=k.len())];
                            WatchSpec::range(p, &api::prefix_range_end(p))
                        }
                        3 => WatchSpec::range(&k, &key(&mut rng)),
                        _ => WatchSpec::range(&k, b""),
                    };
                    if spec.is_empty() {
                        continue;
                    }
                    spec.no_delete = rng.random_bool(0.2);
                    let r = hub.register(stream, 0, spec.clone(), 0, rev).unwrap();
                    live.push((stream, r.watch_id, spec));
                }
                5 if !live.is_empty() => {
                    let (stream, id, _) = live.swap_remove(rng.random_range(0..live.len()));
                    assert!(hub.cancel(stream, id));
                    assert!(!hub.cancel(stream, id), "cancelled twice");
                }
                6 if !streams.is_empty() => {
                    let gone = streams.swap_remove(rng.random_range(0..streams.len()));
                    hub.close_stream(gone.id);
                    live.retain(|(s, _, _)| *s != gone.id);
                }
                _ => {
                    rev += 1;
                    let mut events: Vec<Event> = (0..rng.random_range(1..4))
                        .map(|_| {
                            let mut e = put(std::str::from_utf8(&key(&mut rng)).unwrap(), rev);
                            if rng.random_bool(0.3) {
                                e.r#type = EventType::Delete as i32;
                            }
                            e
                        })
                        .collect();
                    if rng.random_bool(0.2) {
                        let again = events[0].clone();
                        events.push(again);
                    }
                    hub.notify(rev, &events);
                    for s in &mut streams {
                        let mut got: Vec<(i64, usize)> = Vec::new();
                        while let Ok(d) = s.deliveries.try_recv() {
                            match d {
                                Delivery::Events {
                                    watch_id,
                                    revision,
                                    events,
                                } => {
                                    assert_eq!(revision, rev);
                                    got.push((watch_id, events.len()));
                                }
                                other => panic!("{other:?}"),
                            }
                        }
                        s.queued_bytes.store(0, Ordering::Release);
                        got.sort_unstable();
                        let mut want: Vec<(i64, usize)> = live
                            .iter()
                            .filter(|(stream, _, _)| *stream == s.id)
                            .map(|(_, id, spec)| {
                                (*id, events.iter().filter(|e| spec.selects(e)).count())
                            })
                            .filter(|&(_, n)| n > 0)
                            .collect();
                        want.sort_unstable();
                        assert_eq!(got, want, "stream {} at revision {rev}", s.id);
                    }
                }
            }
        }
        assert_eq!(hub.watcher_count(), live.len());
        let st = hub.lock();
        assert_eq!(
            st.index.len(),
            live.len(),
            "the index holds exactly the live watchers"
        );
    }

    #[test]
    fn prefix_ranges_are_told_from_other_ranges() {
        let cases: [(&[u8], &[u8], Place); 5] = [
            (b"a", b"", Place::Key),
            (b"a\xff", b"b", Place::Prefix),
            (b"a", b"c", Place::Ranged),
            (b"a", b"\0", Place::Ranged),
            // All 0xff: its "prefix end" is every key from it, not a prefix.
            (b"\xff", b"\0", Place::Ranged),
        ];
        for (key, end, want) in cases {
            assert_eq!(place(&WatchSpec::range(key, end)), want, "{key:?} {end:?}");
        }
        // What a prefix range holds is exactly the keys starting with the prefix.
        let spec = WatchSpec::range(b"a\xff", &api::prefix_range_end(b"a\xff"));
        for k in [
            &b"a\xff"[..],
            b"a\xff\x00",
            b"a\xff\xff\xff",
            b"a\xfe",
            b"b",
            b"a",
        ] {
            assert_eq!(spec.contains(k), k.starts_with(b"a\xff"), "{k:?}");
        }
    }

    /// A progress request that found the stream's queue full waits, and the next entry
    /// notified (with or without events for the stream) answers it once the queue has room.
    #[test]
    fn a_progress_request_deferred_by_a_full_queue_is_answered_by_a_later_notify() {
        let hub = WatchHub::with_buffer("t", 1);
        let mut s = hub.open_stream();
        let r = hub
            .register(s.id, 0, WatchSpec::range(b"a", b""), 0, 1)
            .unwrap();
        hub.notify(2, &[put("a", 2)]);
        hub.request_progress(s.id);
        assert!(matches!(
            s.deliveries.try_recv().unwrap(),
            Delivery::Events { revision: 2, .. }
        ));
        assert!(s.deliveries.try_recv().is_err(), "the progress had no room");
        hub.notify(3, &[put("b", 3)]);
        assert_eq!(
            s.deliveries.try_recv().unwrap(),
            Delivery::Progress {
                watch_id: INVALID_WATCH_ID,
                revision: 3
            }
        );
        // Answered once: the next entry brings nothing.
        hub.notify(4, &[put("b", 4)]);
        assert!(s.deliveries.try_recv().is_err());
        assert!(hub.cancel(s.id, r.watch_id));
    }

    /// A stream's queue takes events up to about its byte bound (always one delivery), then
    /// its watcher falls back to history, however few responses are queued.
    #[test]
    fn a_queue_holding_its_bytes_moves_the_watcher_to_unsynced() {
        let hub = WatchHub::with_limits("t", 128, 1_000);
        let s = hub.open_stream();
        let w = hub
            .register(s.id, 0, WatchSpec::range(b"k", b""), 0, 1)
            .unwrap()
            .watch_id;
        let big = |rev: i64| {
            let mut e = put("k", rev);
            e.kv.as_mut().unwrap().value = vec![b'v'; 399];
            e.prev_kv = Some(KeyValue {
                key: b"k".to_vec(),
                value: vec![b'p'; 99],
                ..Default::default()
            });
            e
        };
        assert_eq!(
            Delivery::Events {
                watch_id: w,
                revision: 2,
                events: vec![big(2)]
            }
            .bytes(),
            500
        );
        for rev in 2..=6 {
            hub.notify(rev, &[big(rev)]);
        }
        // Shaped for the watcher (no prev_kv asked): 400 bytes each; a third would pass 1,000.
        assert_eq!(s.deliveries.len(), 2);
        assert_eq!(s.queued_bytes.load(Ordering::Acquire), 800);
        let u = hub.unsynced(s.id);
        assert_eq!((u[0].watch_id, u[0].next_rev), (w, 4));
        // One delivery always goes, whatever its size, into an empty queue.
        let hub = WatchHub::with_limits("t", 128, 10);
        let mut s = hub.open_stream();
        hub.register(s.id, 0, WatchSpec::range(b"k", b""), 0, 1)
            .unwrap();
        hub.notify(2, &[big(2)]);
        hub.notify(3, &[big(3)]);
        assert_eq!(s.deliveries.len(), 1);
        assert_eq!(s.queued_bytes.load(Ordering::Acquire), 400);
        let _ = s.deliveries.try_recv();
    }

    #[test]
    fn full_queue_moves_watcher_to_unsynced_at_first_missed_revision() {
        let hub = WatchHub::with_buffer("t", 2);
        let mut s = hub.open_stream();
        let w = hub
            .register(s.id, 0, WatchSpec::range(b"k", b""), 0, 1)
            .unwrap()
            .watch_id;
        for rev in 2..=6 {
            hub.notify(rev, &[put("k", rev)]);
        }
        assert_eq!(s.deliveries.len(), 2);
        let u = hub.unsynced(s.id);
        assert_eq!(u.len(), 1);
        assert_eq!((u[0].watch_id, u[0].next_rev), (w, 4));
        // Progress requests are deferred while a watcher is unsynced.
        hub.request_progress(s.id);
        assert_eq!(s.deliveries.len(), 2);
        while s.deliveries.try_recv().is_ok() {}
        // Caught up to 5 while the hub is at 6: behind; to 7: synced, and the deferred
        // progress is answered then.
        assert_eq!(hub.try_sync(s.id, w, 6), SyncOutcome::Behind);
        assert_eq!(hub.try_sync(s.id, w, 7), SyncOutcome::Synced);
        assert_eq!(
            s.deliveries.try_recv().unwrap(),
            Delivery::Progress {
                watch_id: INVALID_WATCH_ID,
                revision: 6
            }
        );
        hub.notify(7, &[put("k", 7)]);
        assert!(matches!(
            s.deliveries.try_recv().unwrap(),
            Delivery::Events { revision: 7, .. }
        ));
    }

    #[test]
    fn past_start_is_unsynced_future_start_is_synced() {
        let hub = WatchHub::new();
        let s = hub.open_stream();
        hub.notify(10, &[]);
        let past = hub
            .register(s.id, 0, WatchSpec::range(b"k", b""), 10, 10)
            .unwrap();
        assert!(!past.synced);
        let future = hub
            .register(s.id, 0, WatchSpec::range(b"k", b""), 11, 10)
            .unwrap();
        assert!(future.synced);
        assert!(!hub.progress_one(s.id, past.watch_id));
        assert!(hub.progress_one(s.id, future.watch_id));
        assert!(hub.cancel(s.id, past.watch_id));
        assert!(!hub.cancel(s.id, past.watch_id));
    }
}
