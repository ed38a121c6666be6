//! A tenant's replica: the memstore rebuilt by tailing the tenant's journal shard, the apply
//! loop that feeds it, the watch hub it notifies, the hand-off of outcomes to the writers
//! waiting for them, and the reload from the newest checkpoint when the journal was trimmed
//! past the replica's position.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::StreamExt;
use memstore::{Applied, MemStore, Outcome};
use tokio::sync::{oneshot, watch};

use crate::log::{Log, LogError};
use crate::tenant::Served;
use crate::watch::WatchHub;

/// Records applied under one write lock (the stream's ready records, up to this many).
pub const APPLY_CHUNK: usize = 256;
/// First wait before re-opening a failed journal read; doubles up to the max.
pub const READ_RETRY_MIN: Duration = Duration::from_millis(100);
pub const READ_RETRY_MAX: Duration = Duration::from_secs(2);
/// Most history events handed to the watch hub per store read when a reload replays the
/// revisions the replica skipped.
pub const RELOAD_REPLAY_CHUNK: usize = 1024;

/// Where the replica stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplicaState {
    /// Catching up to the committed index the journal reported when the replica started.
    CatchingUp,
    /// Caught up once; serving.
    Ready,
    /// Stopped: it cannot go on without diverging (undecodable record, or a trimmed position
    /// with no usable checkpoint). An
    /// operator must look (the process exits and its supervisor restarts it).
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
    /// Turned true by `stop`: the apply loop and its helpers end (a tenant unloaded).
    stopped: watch::Sender<bool>,
    term: AtomicU64,
    /// Whether the store's auth is enabled, as of the last apply: lets a request skip token
    /// verification without the store's lock when it is not (the checks themselves run
    /// against the store).
    auth_enabled: AtomicBool,
    /// What the store's own change says of the tenant (`MemStore::tenant_own`: a
    /// `crate::tenant::Served` as u8), as of the last apply: a frontend whose catalogue lags
    /// refuses the tenant's requests once its replica has applied the suspension.
    own_served: AtomicU8,
    /// The same, for the streams that end when it changes (`Tenant::refusal`); requests read
    /// the atomic, which takes no lock.
    own_changes: watch::Sender<Served>,
    /// When the replica last received journal records (ms since `started`): the journal stamps
    /// an idle shard every 500 ms, so silence means it has no leader or cannot be reached.
    heard_at_ms: AtomicU64,
    started: std::time::Instant,
    /// Writers waiting for the outcome of their entry, by request id.
    waiters: Mutex<HashMap<Vec<u8>, oneshot::Sender<Applied>>>,
    /// Where the compactor's checkpoints are, for a reload after a trim (`--object-store`).
    checkpoints: Option<crate::checkpoint::Store>,
    /// Reads of the whole store under way (`read_long`), and their end's signal.
    long_reads: std::sync::atomic::AtomicUsize,
    long_reads_done: tokio::sync::Notify,
    /// Long reads and writes taking turns (see `read_long`); `turn_over` wakes long reads
    /// that waited for a write's turn.
    turns: Mutex<Turns>,
    turn_over: std::sync::Condvar,
}

/// Long reads and writes taking turns at the store.
#[derive(Default)]
struct Turns {
    /// A write (an apply, a reload's swap) waits for long reads to end: no new one starts, so
    /// back-to-back long reads cannot hold the apply loop off for good.
    write_waiting: bool,
    /// Write turns ended so far: a long read waits for at most one, so back-to-back applies
    /// cannot hold it off either.
    ended: u64,
    /// Long reads waiting for a write's turn to end (none: no wake-up to send).
    readers_waiting: usize,
}

/// A write's turn at the store (`Replica::write_turn`): ends, letting long reads start again,
/// when dropped.
struct WriteTurn<'a>(&'a Replica);

impl Drop for WriteTurn<'_> {
    fn drop(&mut self) {
        let mut turns = self.0.lock_turns();
        turns.write_waiting = false;
        turns.ended += 1;
        if turns.readers_waiting > 0 {
            self.0.turn_over.notify_all();
        }
    }
}

/// What `store`'s own change says of its tenant (`MemStore::tenant_own`).
fn own_served(store: &MemStore) -> Served {
    let own = store.tenant_own();
    if own.deleted {
        Served::Deleted
    } else if own.suspended {
        Served::Suspended
    } else {
        Served::Active
    }
}

impl Replica {
    pub fn new(tenant: &str, shard: u32, store: MemStore) -> Arc<Self> {
        Self::with_checkpoints(tenant, shard, store, None)
    }

    /// A replica that, when the journal was trimmed past its position, reloads the newest
    /// checkpoint from `checkpoints` instead of stopping.
    pub fn with_checkpoints(
        tenant: &str,
        shard: u32,
        store: MemStore,
        checkpoints: Option<crate::checkpoint::Store>,
    ) -> Arc<Self> {
        let applied_index = store.applied_index();
        let auth_enabled = AtomicBool::new(store.auth_enabled());
        let own = own_served(&store);
        let (own_served, own_changes) = (AtomicU8::new(own as u8), watch::channel(own).0);
        let hub = WatchHub::for_store_at(tenant, store.revision());
        Arc::new(Self {
            tenant: tenant.to_string(),
            shard,
            store: Arc::new(RwLock::new(store)),
            hub: Arc::new(hub),
            applied: watch::channel(applied_index).0,
            state: watch::channel(ReplicaState::CatchingUp).0,
            stopped: watch::channel(false).0,
            term: AtomicU64::new(0),
            auth_enabled,
            own_served,
            own_changes,
            heard_at_ms: AtomicU64::new(0),
            started: std::time::Instant::now(),
            waiters: Mutex::new(HashMap::new()),
            checkpoints,
            long_reads: std::sync::atomic::AtomicUsize::new(0),
            long_reads_done: tokio::sync::Notify::new(),
            turns: Mutex::new(Turns::default()),
            turn_over: std::sync::Condvar::new(),
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

    /// Whether the tenant's auth was enabled at the last apply (see the field).
    pub fn auth_enabled(&self) -> bool {
        self.auth_enabled.load(Ordering::Relaxed)
    }

    /// What the tenant's own change applied here says of it (Active when none did).
    pub fn own_served(&self) -> Served {
        Served::from_u8(self.own_served.load(Ordering::Relaxed))
    }

    /// Mirrors what requests read without the store's lock, after `store` changed.
    fn note(&self, store: &MemStore) {
        self.auth_enabled
            .store(store.auth_enabled(), Ordering::Relaxed);
        let own = own_served(store);
        if self.own_served.swap(own as u8, Ordering::Relaxed) != own as u8 {
            self.own_changes.send_replace(own);
        }
    }

    /// What the store's own change says of the tenant, as it changes (`own_served`).
    pub fn subscribe_own(&self) -> watch::Receiver<Served> {
        self.own_changes.subscribe()
    }

    pub fn state(&self) -> ReplicaState {
        self.state.borrow().clone()
    }

    pub fn subscribe_state(&self) -> watch::Receiver<ReplicaState> {
        self.state.subscribe()
    }

    /// Waits at most `timeout` while the replica catches up with the journal: a tenant loaded
    /// a moment ago for a request replays the journal after its checkpoint, and what the
    /// request reports (`/health`, Status, Hash, HashKV) is said of it caught up.
    pub async fn settle(&self, timeout: Duration) {
        let mut states = self.subscribe_state();
        let caught_up = states.wait_for(|s| *s != ReplicaState::CatchingUp);
        let _ = tokio::time::timeout(timeout, caught_up).await;
    }

    /// Reads the store; a poisoned lock means an apply panicked, which is an invariant breach.
    pub fn read(&self) -> std::sync::RwLockReadGuard<'_, MemStore> {
        self.store
            .read()
            .unwrap_or_else(|p| panic!("memstore lock poisoned by a panicking apply: {p}"))
    }

    /// Reads the whole store (a snapshot's encoding, a hash of every key): seconds on a large
    /// tenant, so call it off the async workers. Meanwhile the apply loop waits without asking
    /// for the write lock: a writer waiting on the lock would hold back every other reader
    /// behind it (std's lock lets a waiting writer go first), stalling the whole frontend.
    pub fn read_long<R>(&self, f: impl FnOnce(&MemStore) -> R) -> R {
        struct Counted<'a>(&'a Replica);
        impl Drop for Counted<'_> {
            fn drop(&mut self) {
                if self.0.long_reads.fetch_sub(1, Ordering::AcqRel) == 1 {
                    self.0.long_reads_done.notify_waiters();
                }
            }
        }
        {
            let mut turns = self.lock_turns();
            let seen = turns.ended;
            while turns.write_waiting && turns.ended == seen {
                turns.readers_waiting += 1;
                turns = self
                    .turn_over
                    .wait(turns)
                    .unwrap_or_else(|p| p.into_inner());
                turns.readers_waiting -= 1;
            }
            self.long_reads.fetch_add(1, Ordering::AcqRel);
        }
        let _counted = Counted(self);
        f(&self.read())
    }

    /// Runs a read of the store in steps (`begin` starts it, `step` reads on and answers `true`
    /// once done), taking the store's lock for each step only, so the apply loop (and every
    /// reader queued behind it) gets the store between two steps (docs/frontend.md, "Large
    /// ranges read in steps"). A step failing with `Compacted` means a compaction came between
    /// two steps: the read begins again, `attempts` times in all; `None` then, and the caller
    /// reads under one hold of the lock, which no compaction can come into. `begin` failing
    /// (a revision compacted by now included) fails the read.
    pub async fn in_steps<S>(
        &self,
        attempts: u32,
        begin: impl Fn(&MemStore) -> Result<S, memstore::Error>,
        mut step: impl FnMut(&mut S, &MemStore) -> Result<bool, memstore::Error>,
    ) -> Result<Option<S>, memstore::Error> {
        for attempt in 1..=attempts {
            let mut read = begin(&self.read())?;
            loop {
                let stepped = step(&mut read, &self.read());
                match stepped {
                    Ok(true) => return Ok(Some(read)),
                    Ok(false) => tokio::task::yield_now().await,
                    Err(memstore::Error::Compacted) => {
                        tracing::debug!(tenant = %self.tenant, attempt, "a compaction came between two steps of a read; reading again");
                        break;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(None)
    }

    fn lock_turns(&self) -> std::sync::MutexGuard<'_, Turns> {
        // Plain counters: nothing a panic could leave half-done.
        self.turns.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for the long reads under way to end, holding new ones back, before a write asks for
    /// the store's lock (see `read_long`). A long read that got in just before still makes the
    /// write wait for it, as before; it cannot make a read wrong.
    async fn write_turn(&self) -> WriteTurn<'_> {
        self.lock_turns().write_waiting = true;
        let turn = WriteTurn(self);
        self.long_reads_over().await;
        turn
    }

    /// Returns once no `read_long` is under way.
    async fn long_reads_over(&self) {
        // The common case, without registering for a wake-up.
        if self.long_reads.load(Ordering::Acquire) == 0 {
            return;
        }
        loop {
            let done = self.long_reads_done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            if self.long_reads.load(Ordering::Acquire) == 0 {
                return;
            }
            done.await;
        }
    }

    /// Waits until the replica has applied `index`; `false` if it failed or `timeout` passed.
    pub async fn wait_applied(&self, index: u64, timeout: Duration) -> bool {
        // The common case under a read load: already applied, no timer or subscription needed.
        if self.applied_index() >= index {
            return true;
        }
        matches!(
            tokio::time::timeout(timeout, self.until_applied(index)).await,
            Ok(true)
        )
    }

    /// Waits until the replica has applied `index`, with no deadline of its own (the caller's
    /// bounds it); `false` if the replica stopped publishing its progress.
    pub async fn until_applied(&self, index: u64) -> bool {
        if self.applied_index() >= index {
            return true;
        }
        let mut rx = self.applied.subscribe();
        rx.wait_for(|a| *a >= index).await.is_ok()
    }

    /// Registers interest in the outcome of the entry carrying `request_id`; must happen before
    /// the entry is appended. The interest ends when the answer is dropped, however the writer
    /// ends (answered, failed, timed out, or its client gone and its future dropped).
    pub fn expect<'a>(&'a self, request_id: &'a [u8]) -> Pending<'a> {
        let (tx, rx) = oneshot::channel();
        self.lock_waiters().insert(request_id.to_vec(), tx);
        Pending {
            replica: self,
            request_id,
            rx,
            answered: false,
        }
    }

    /// Writers waiting for an outcome.
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.lock_waiters().len()
    }

    fn lock_waiters(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<Vec<u8>, oneshot::Sender<Applied>>> {
        // The map holds no invariant a panic could break half-way.
        self.waiters.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ends the apply loop for good (the tenant is unloaded): no more records are applied, and
    /// the loop's tasks let go of the replica, so its memory goes once the last holder of the
    /// tenant lets go too.
    pub fn stop(&self) {
        self.stopped.send_replace(true);
    }

    pub fn is_stopped(&self) -> bool {
        *self.stopped.borrow()
    }

    /// Resolves once `stop` was called.
    async fn until_stopped(&self) {
        let mut rx = self.stopped.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    /// The apply loop: tails the shard from the replica's applied index and applies every
    /// record. Returns only when the replica failed or was stopped.
    pub async fn run(self: Arc<Self>, log: Arc<dyn Log>) {
        let stop = self.clone();
        tokio::select! {
            () = self.apply_loop(log) => {}
            () = stop.until_stopped() => {
                tracing::info!(tenant = %stop.tenant, shard = stop.shard, "replica stopped: tenant unloaded");
            }
        }
    }

    async fn apply_loop(self: Arc<Self>, log: Arc<dyn Log>) {
        let (readiness, until_stopped, status) = (self.clone(), self.clone(), log.clone());
        tokio::spawn(async move {
            tokio::select! {
                () = readiness.watch_readiness(status) => {}
                () = until_stopped.until_stopped() => {}
            }
        });
        let mut backoff = READ_RETRY_MIN;
        loop {
            let from = self.applied_index() + 1;
            let stream = match log.read(self.shard, from).await {
                Ok(s) => s,
                Err(LogError::Trimmed { first_index }) => {
                    if !self.reload_or_fail(first_index).await {
                        return;
                    }
                    continue;
                }
                Err(e) => {
                    tracing::warn!(tenant = %self.tenant, shard = self.shard, error = %e, "journal read failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(READ_RETRY_MAX);
                    continue;
                }
            };
            let mut chunks = stream.ready_chunks(APPLY_CHUNK);
            while let Some(chunk) = chunks.next().await {
                if chunk.iter().any(Result::is_ok) {
                    self.heard_at_ms
                        .store(self.started.elapsed().as_millis() as u64, Ordering::Relaxed);
                }
                let applied = {
                    let _turn = self.write_turn().await;
                    self.apply_chunk(chunk)
                };
                match applied {
                    Ok(()) => backoff = READ_RETRY_MIN,
                    Err(ApplyStop::Retry(e)) => {
                        tracing::warn!(tenant = %self.tenant, shard = self.shard, error = %e, "journal read broke; re-opening");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(READ_RETRY_MAX);
                        break;
                    }
                    Err(ApplyStop::Trimmed { first_index }) => {
                        if !self.reload_or_fail(first_index).await {
                            return;
                        }
                        break;
                    }
                    Err(ApplyStop::Fatal(reason)) => {
                        self.fail(reason);
                        return;
                    }
                }
            }
        }
    }

    fn fail(&self, reason: String) {
        tracing::error!(tenant = %self.tenant, shard = self.shard, %reason, "replica stopped");
        self.state.send_replace(ReplicaState::Failed(reason));
    }

    /// The journal no longer holds the replica's next record: reload the newest checkpoint
    /// (which covers the trimmed records), or stop. True when the replica can tail on (also
    /// after an object-store error it waits out: the caller reads again, meets the trim again
    /// and comes back here).
    async fn reload_or_fail(&self, first_index: u64) -> bool {
        let applied = self.applied_index();
        if applied + 1 >= first_index {
            // The journal still holds the next record (a read told of a trim below it): no
            // checkpoint is needed, and none is ahead of the replica. Read again.
            tracing::debug!(tenant = %self.tenant, shard = self.shard, first_index, applied, "told of a trim the replica is past; reading on");
            return true;
        }
        match self.reload(first_index).await {
            Ok(index) => {
                tracing::warn!(
                    tenant = %self.tenant,
                    shard = self.shard,
                    first_index,
                    from = applied,
                    to = index,
                    "journal trimmed past the replica; reloaded the newest checkpoint"
                );
                metrics::counter!("strata_frontend_replica_reloads_total", "tenant" => self.tenant.clone())
                    .increment(1);
                true
            }
            Err(Reload::Retry(why)) => {
                tracing::warn!(tenant = %self.tenant, shard = self.shard, first_index, error = %why, "journal trimmed past the replica; the checkpoint could not be read yet, retrying");
                tokio::time::sleep(READ_RETRY_MAX).await;
                true
            }
            Err(Reload::Fatal(why)) => {
                self.fail(format!(
                    "journal trimmed below {first_index} but the replica has applied only {applied}, and it cannot reload: {why}"
                ));
                false
            }
        }
    }

    /// Loads the newest checkpoint and swaps it in; answers its index. A tenant with no
    /// checkpoint at all had no entry below `first_index` (the compactor trims past a tenant
    /// only once it has published one), so a replica that holds nothing yet continues from
    /// there with an empty store.
    async fn reload(&self, first_index: u64) -> Result<u64, Reload> {
        let Some(objects) = &self.checkpoints else {
            return Err(Reload::Fatal(
                "no --object-store to load a checkpoint from".into(),
            ));
        };
        let loaded = match crate::checkpoint::latest_from(
            objects,
            &self.tenant,
            self.shard,
            first_index,
        )
        .await
        {
            Ok(Some(loaded)) => loaded,
            Ok(None) => {
                if !self.read().is_pristine() {
                    return Err(Reload::Fatal(
                        "the object store holds no checkpoint of the tenant".into(),
                    ));
                }
                match crate::checkpoint::shard_trimmed_to(objects, self.shard, first_index).await {
                    Ok(true) => {}
                    Ok(false) => {
                        return Err(Reload::Fatal(format!(
                            "the object store holds no checkpoint of the tenant, and none of any tenant on shard {} covers the journal's first index {first_index}: is --object-store the compactor's?",
                            self.shard
                        )));
                    }
                    Err(e) => return Err(Reload::Retry(e.to_string())),
                }
                let index = first_index - 1;
                let _turn = self.write_turn().await;
                self.swap(MemStore::new_at(memstore::Config::default(), index))
                    .map_err(Reload::Fatal)?;
                return Ok(index);
            }
            Err(e @ crate::checkpoint::CheckpointError::Store(_)) => {
                return Err(Reload::Retry(e.to_string()));
            }
            // Waited out, not fatal, and nothing fetched meanwhile: a second compactor of the
            // shard (a stalled one, a pod on an unreachable node) can publish an older
            // checkpoint just after the other trimmed past it; the one that trimmed publishes a
            // covering checkpoint with its next round.
            Err(e @ crate::checkpoint::CheckpointError::BelowTrim { .. }) => {
                return Err(Reload::Retry(format!(
                    "{e} (waiting for a newer one; if it never comes, --object-store is not this journal's)"
                )));
            }
            Err(e) => return Err(Reload::Fatal(e.to_string())),
        };
        let index = loaded.reference.index;
        debug_assert!(
            index + 1 >= first_index,
            "latest_from loaded below the trim"
        );
        let _turn = self.write_turn().await;
        self.swap(loaded.store).map_err(Reload::Fatal)?;
        Ok(index)
    }

    /// Replaces the store with `new` (a checkpoint ahead of it) atomically for readers, and
    /// brings the watch hub along: the events of the revisions between the two are replayed from
    /// `new`'s history, so no watcher skips one (watchers whose stream cannot take them all are
    /// caught up from history as usual). When `new`'s history no longer reaches back that far,
    /// every watcher is caught up from `new` instead, which cancels it as compacted: a watcher
    /// never silently misses an event.
    /// Writers still waiting keep waiting when their entry comes after the checkpoint's index
    /// (it is applied next and answered as usual). A writer whose entry the checkpoint covers is
    /// answered at once, `Outcome::Duplicate`, when the checkpoint's de-duplication window
    /// remembers its request id (which it does for refused requests too); the frontend's edge
    /// answers etcd's "request timed out" for it. One the window no longer remembers times out
    /// as before, after the request's deadline.
    fn swap(&self, new: MemStore) -> Result<(), String> {
        let mut store = self
            .store
            .write()
            .unwrap_or_else(|p| panic!("memstore lock poisoned by a panicking apply: {p}"));
        if new.applied_index() <= store.applied_index() {
            return Err(format!(
                "the newest checkpoint (index {}) is not ahead of the replica (index {})",
                new.applied_index(),
                store.applied_index()
            ));
        }
        let from = store.revision() + 1;
        let to = new.revision();
        // A watch may go on from the compact revision itself, as in etcd (`MemStore::events`).
        let replayable = from >= new.compact_revision() || from > to;
        let index = new.applied_index();
        let compact = new.compact_revision();
        *store = new;
        self.note(&store);
        if !replayable {
            // The revisions from `from` on are compacted in the checkpoint: watchers that still
            // need them are canceled with compact_revision set, as etcd does after a compaction.
            let moved = self.hub.desync_all(from);
            if moved > 0 {
                tracing::warn!(
                    tenant = %self.tenant,
                    shard = self.shard,
                    watchers = moved,
                    from,
                    compact_revision = compact,
                    "checkpoint history starts after the watchers' position; they are canceled as compacted"
                );
            }
        }
        let mut next = from;
        while replayable && next <= to {
            let events = store
                .events(next, &[0], &[0], RELOAD_REPLAY_CHUNK)
                .map_err(|e| format!("reading the checkpoint's history from {next}: {e}"))?;
            let Some(last) = events.last().map(crate::watch::event_revision) else {
                break;
            };
            self.hub.notify(last, &events);
            next = last + 1;
        }
        self.hub.notify(to, &[]);
        let covered: Vec<_> = {
            let mut waiters = self.lock_waiters();
            let ids: Vec<(Vec<u8>, i64)> = waiters
                .keys()
                .filter_map(|id| store.applied_request(id).map(|rev| (id.clone(), rev)))
                .collect();
            ids.into_iter()
                .filter_map(|(id, rev)| waiters.remove(&id).map(|w| (w, rev)))
                .collect()
        };
        drop(store);
        self.applied.send_replace(index);
        if !covered.is_empty() {
            tracing::info!(
                tenant = %self.tenant,
                shard = self.shard,
                writers = covered.len(),
                index,
                "writers whose entries the checkpoint covers are answered from its request ids"
            );
        }
        for (w, revision) in covered {
            let _ = w.send(Applied {
                index,
                revision,
                outcome: Outcome::Duplicate { revision },
                events: Vec::new(),
            });
        }
        Ok(())
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
                        stop = Some(ApplyStop::Trimmed { first_index });
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
                let (index, term) = (record.index, record.term);
                // A put is read in place from the record; anything else is decoded by value.
                let out = match store.apply_record(record, &self.tenant) {
                    Ok(out) => out,
                    Err(e) => {
                        stop = Some(ApplyStop::Fatal(e.to_string()));
                        break;
                    }
                };
                self.term.fetch_max(term, Ordering::Relaxed);
                expected = index + 1;
                applied.push((out.request_id, out.applied));
            }
            // Once per chunk, still under the lock: the chunk's outcomes are published after
            // it, so no client has learnt of a change (auth enabled, a suspension) before its
            // mirror shows it.
            self.note(&store);
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

    /// Whether the replica received a journal record (an idle tick at least) within `within`
    /// (counted from its start before the first): false means the journal has no leader or
    /// cannot be reached from here.
    pub fn journal_heard_within(&self, within: Duration) -> bool {
        // Records waiting for a long read to end (a snapshot of a large tenant) are no silence.
        if self.lock_turns().write_waiting {
            return true;
        }
        let heard = Duration::from_millis(self.heard_at_ms.load(Ordering::Relaxed));
        self.started.elapsed().saturating_sub(heard) <= within
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
    /// The journal no longer holds the next record: reload from a checkpoint.
    Trimmed {
        first_index: u64,
    },
    Fatal(String),
}

/// Why a reload did not happen.
enum Reload {
    /// The object store could not be read; it may answer later.
    Retry(String),
    /// It never will: the replica stops.
    Fatal(String),
}

/// A writer's interest in the outcome of its entry (`Replica::expect`).
pub struct Pending<'a> {
    replica: &'a Replica,
    request_id: &'a [u8],
    rx: oneshot::Receiver<Applied>,
    /// The outcome came: the replica already took the waiter out (no lock to take at drop).
    answered: bool,
}

impl Pending<'_> {
    /// The outcome, once the replica applied the entry; an error if the replica dropped every
    /// waiter (it stopped).
    pub async fn outcome(&mut self) -> Result<Applied, oneshot::error::RecvError> {
        let outcome = (&mut self.rx).await;
        self.answered = outcome.is_ok();
        outcome
    }

    /// The outcome if it has already arrived.
    pub fn arrived(&mut self) -> Option<Applied> {
        let outcome = self.rx.try_recv().ok();
        self.answered |= outcome.is_some();
        outcome
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.replica.lock_waiters().remove(self.request_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::{Delivery, WatchSpec};
    use api::etcdserverpb::{CompactionRequest, PutRequest};
    use api::strata::entry::{Entry, entry::Request};

    fn apply(store: &mut MemStore, index: u64, request: Request) {
        let entry = Entry {
            format_version: api::ENTRY_FORMAT_VERSION,
            tenant: "t".into(),
            request_id: index.to_le_bytes().to_vec(),
            time_ms: 1_000 + index as i64,
            request: Some(request),
            ..Default::default()
        };
        store.apply(index, &entry);
    }

    /// A store that applied `n` puts (index i puts key k<i % 4>).
    fn store_after(n: u64) -> MemStore {
        let mut s = MemStore::new(memstore::Config::default());
        for i in 1..=n {
            let put = PutRequest {
                key: format!("k{}", i % 4).into_bytes(),
                value: format!("v{i}").into_bytes(),
                ..Default::default()
            };
            apply(&mut s, i, Request::Put(put));
        }
        s
    }

    fn revisions(rx: &mut tokio::sync::mpsc::Receiver<Delivery>) -> Vec<i64> {
        let mut out = Vec::new();
        while let Ok(d) = rx.try_recv() {
            if let Delivery::Events { events, .. } = d {
                out.extend(events.iter().map(crate::watch::event_revision));
            }
        }
        out
    }

    /// The journal record at `index` carrying a put with `request_id` (tenant "t").
    fn put_record(index: u64, request_id: &[u8]) -> api::strata::journal::Record {
        let entry = Entry {
            format_version: api::ENTRY_FORMAT_VERSION,
            tenant: "t".into(),
            request_id: request_id.to_vec(),
            time_ms: 0,
            request: Some(Request::Put(PutRequest {
                key: b"w".to_vec(),
                value: b"v".to_vec(),
                ..Default::default()
            })),
            ..Default::default()
        };
        api::strata::journal::Record {
            index,
            term: 1,
            time_ms: 1_000 + index as i64,
            kind: Some(api::strata::journal::record::Kind::Data(
                api::record::encode_entry(&entry),
            )),
        }
    }

    /// A replica tailing an in-memory journal, a long read holding its store (until `release`
    /// is sent), and a put appended to the journal meanwhile.
    async fn long_read_held_while_a_put_arrives() -> (
        Arc<Replica>,
        std::thread::JoinHandle<()>,
        std::sync::mpsc::Sender<()>,
    ) {
        use crate::log::Log;
        let log = crate::log::MemLog::new();
        let r = Replica::new("t", 0, MemStore::new(Default::default()));
        tokio::spawn(r.clone().run(Arc::new(log.clone())));
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let (release, release_rx) = std::sync::mpsc::channel::<()>();
        let held = {
            let r = r.clone();
            std::thread::spawn(move || {
                r.read_long(|_| {
                    started_tx.send(()).unwrap();
                    release_rx.recv().unwrap();
                })
            })
        };
        started_rx.recv().unwrap();
        let Some(api::strata::journal::record::Kind::Data(payload)) = put_record(1, b"w").kind
        else {
            unreachable!()
        };
        log.append(0, vec![payload]).await.unwrap();
        (r, held, release)
    }

    /// While a long read holds the store, the apply loop waits for it without queueing for the
    /// write lock: a queued writer would hold back every other reader (std's lock lets a waiting
    /// writer go first), which `try_read` shows at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_long_read_does_not_hold_other_readers_back_behind_the_apply_loop() {
        let (r, long, release_tx) = long_read_held_while_a_put_arrives().await;
        let watch_until = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while std::time::Instant::now() < watch_until {
            assert!(
                r.store.try_read().is_ok(),
                "a reader is held back behind the apply loop"
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert_eq!(r.applied_index(), 0, "applied during the long read");
        release_tx.send(()).unwrap();
        long.join().unwrap();
        assert!(
            r.wait_applied(1, std::time::Duration::from_secs(30)).await,
            "the apply loop goes on once the long read ends"
        );
    }

    /// Long reads one after another, overlapping, cannot hold the apply loop off for good: once
    /// it waits, a new long read waits for its turn to end.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn overlapping_long_reads_do_not_hold_the_apply_loop_off() {
        let (r, first, release_tx) = long_read_held_while_a_put_arrives().await;
        while !r.lock_turns().write_waiting {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        // A second long read asked while the apply waits runs after it.
        let second = {
            let r = r.clone();
            std::thread::spawn(move || r.read_long(|s| s.applied_index()))
        };
        // Give it time to get in ahead, as it would without the turn.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        release_tx.send(()).unwrap();
        first.join().unwrap();
        assert_eq!(second.join().unwrap(), 1, "the second long read went first");
    }

    /// Journal silence is records not received; records held back behind a long read (a large
    /// tenant's snapshot) are no silence.
    #[tokio::test]
    async fn a_wait_behind_a_long_read_is_no_journal_silence() {
        let r = Replica::new("t", 0, store_after(1));
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(!r.journal_heard_within(std::time::Duration::from_millis(10)));
        r.lock_turns().write_waiting = true;
        assert!(r.journal_heard_within(std::time::Duration::from_millis(10)));
    }

    /// A checkpoint reload does not fail the writers waiting meanwhile: an entry after the
    /// checkpoint is answered when applied; one it covers is answered at once with the revision
    /// it was applied at (the checkpoint's request ids say so); one whose id the checkpoint does
    /// not know stays unanswered (its writer times out).
    #[test]
    fn a_reload_keeps_writers_waiting() {
        let r = Replica::new("t", 0, store_after(3));
        // `store_after` gives entry i the request id i (little-endian) and revision i + 1.
        let covered = 7u64.to_le_bytes();
        let (after, unknown) = (b"after".as_slice(), b"unknown".as_slice());
        let mut waits_after = r.expect(after);
        let mut waits_covered = r.expect(&covered);
        let mut waits_unknown = r.expect(unknown);
        r.swap(store_after(10)).unwrap();
        let answered = waits_covered
            .arrived()
            .expect("a covered entry is answered by the reload");
        assert_eq!(answered.outcome, Outcome::Duplicate { revision: 8 });
        assert_eq!(answered.revision, 8);
        assert!(waits_after.arrived().is_none());
        assert!(r.apply_chunk(vec![Ok(put_record(11, after))]).is_ok());
        let applied = waits_after
            .arrived()
            .expect("the entry after the checkpoint is answered");
        assert_eq!(applied.index, 11);
        assert!(matches!(applied.outcome, Outcome::Put(_)));
        assert!(waits_unknown.arrived().is_none());
        assert_eq!(r.waiting(), 1);
        drop(waits_after);
        drop(waits_covered);
        drop(waits_unknown);
        assert_eq!(r.waiting(), 0);
    }

    /// A writer whose future is dropped (its client went away, its deadline passed) leaves no
    /// waiter behind, even when its entry never commits.
    #[tokio::test]
    async fn a_writer_that_goes_away_is_forgotten() {
        let r = Replica::new("t", 0, store_after(3));
        let gave_up = tokio::time::timeout(std::time::Duration::from_millis(10), async {
            let mut pending = r.expect(b"never");
            pending.outcome().await
        })
        .await;
        assert!(gave_up.is_err());
        assert_eq!(r.waiting(), 0);
    }

    /// A tenant with no checkpoint, on a journal trimmed before its first entry, continues from
    /// the journal's first index with an empty store; a replica that holds something cannot.
    #[tokio::test]
    async fn no_checkpoint_and_nothing_applied_continues_from_the_first_index() {
        use object_store::ObjectStoreExt;
        let memory = Arc::new(object_store::memory::InMemory::new());
        let objects = crate::checkpoint::Store::from(memory.clone());
        let r = Replica::with_checkpoints(
            "t",
            0,
            MemStore::new(Default::default()),
            Some(objects.clone()),
        );
        // Without the compactor's word for the trim (no tenant's manifest covers it), nothing
        // can be said of the tenant: a wrong store, deleted checkpoints.
        assert!(matches!(r.reload(50).await, Err(Reload::Fatal(_))));
        let other = api::manifest::Manifest {
            format_version: api::manifest::MANIFEST_FORMAT_VERSION,
            tenant: "other".into(),
            shard: 0,
            seq: 1,
            published_ms: 0,
            checkpoints: vec![api::manifest::CheckpointRef {
                path: "tenants/other/checkpoints/x.ckpt".into(),
                index: 49,
                revision: 1,
                size: 0,
                crc32c: 0,
                time_ms: 0,
                created_ms: 0,
            }],
        };
        let path = api::manifest::manifest_path("other", 1).unwrap();
        objects
            .put(
                &object_store::path::Path::from(path),
                other.to_json().into(),
            )
            .await
            .unwrap();
        assert!(matches!(r.reload(50).await, Ok(49)));
        assert_eq!(r.applied_index(), 49);
        assert!(r.apply_chunk(vec![Ok(put_record(50, b"first"))]).is_ok());
        assert_eq!(r.read().revision(), 2);

        let r = Replica::with_checkpoints("t", 0, store_after(3), Some(objects));
        assert!(matches!(r.reload(50).await, Err(Reload::Fatal(_))));
        assert_eq!(r.applied_index(), 3);
    }

    /// On a shard that held no tenant when the compactor trimmed it, its ticks-only record is
    /// the word: one that reaches the journal's first index lets an empty replica continue from
    /// there; one of another shard, or one that stops short, does not.
    #[tokio::test]
    async fn a_ticks_only_record_lets_a_new_tenant_start_on_a_trimmed_shard() {
        use object_store::ObjectStoreExt;
        let memory = Arc::new(object_store::memory::InMemory::new());
        let objects = crate::checkpoint::Store::from(memory.clone());
        let put = |shard: u32, below: u64| {
            let objects = objects.clone();
            async move {
                let r = api::manifest::TicksOnly {
                    format_version: api::manifest::MANIFEST_FORMAT_VERSION,
                    shard,
                    below,
                    written_ms: 0,
                };
                let path = api::manifest::ticks_only_path(shard, below);
                objects
                    .put(&object_store::path::Path::from(path), r.to_json().into())
                    .await
                    .unwrap();
            }
        };
        let r = Replica::with_checkpoints(
            "t",
            2,
            MemStore::new(Default::default()),
            Some(objects.clone()),
        );
        put(1, 80).await;
        put(2, 49).await;
        assert!(matches!(r.reload(50).await, Err(Reload::Fatal(_))));
        assert_eq!(r.applied_index(), 0);
        put(2, 50).await;
        assert!(matches!(r.reload(50).await, Ok(49)));
        assert_eq!(r.applied_index(), 49);
        assert!(r.apply_chunk(vec![Ok(put_record(50, b"first"))]).is_ok());
        assert_eq!(r.read().revision(), 2);
    }

    /// A newest checkpoint the journal was already trimmed past (a second compactor of the
    /// shard published it after the other trimmed) is waited out, not fatal: once a covering
    /// one is published, the reload takes it.
    #[tokio::test]
    async fn a_newest_checkpoint_below_the_trim_is_waited_out() {
        use crate::checkpoint::fixtures::{manifest, publish};
        let objects =
            crate::checkpoint::Store::from(Arc::new(object_store::memory::InMemory::new()));
        // Corrupt as well: were it fetched, the replica would stop on it.
        let stale = publish(&objects, 20, true).await;
        manifest(&objects, 1, vec![stale]).await;
        let r = Replica::with_checkpoints(
            "default",
            0,
            MemStore::new(Default::default()),
            Some(objects.clone()),
        );
        assert!(matches!(r.reload(50).await, Err(Reload::Retry(_))));
        assert_eq!(r.applied_index(), 0);
        let covering = publish(&objects, 49, false).await;
        manifest(&objects, 2, vec![covering]).await;
        assert!(matches!(r.reload(50).await, Ok(49)));
        assert_eq!(r.applied_index(), 49);
    }

    /// Told of a trim it is already past (its next record is the journal's first), a replica
    /// reads on: it neither needs a checkpoint nor stops because none is ahead of it.
    #[tokio::test]
    async fn a_trim_the_replica_is_past_is_no_reason_to_reload() {
        use crate::checkpoint::fixtures::{manifest, publish};
        let objects =
            crate::checkpoint::Store::from(Arc::new(object_store::memory::InMemory::new()));
        let at = publish(&objects, 49, false).await;
        manifest(&objects, 1, vec![at]).await;
        let r = Replica::with_checkpoints("default", 0, store_after(49), Some(objects));
        assert!(r.reload_or_fail(50).await);
        assert_eq!(r.state(), ReplicaState::CatchingUp, "not failed");
        assert_eq!(r.applied_index(), 49);
        // Behind the trim it still reloads.
        let r = Replica::with_checkpoints("default", 0, store_after(3), r.checkpoints.clone());
        assert!(r.reload_or_fail(50).await);
        assert_eq!(r.applied_index(), 49);
    }

    /// An object store that cannot be reached is waited out, not a reason to stop the replica.
    #[tokio::test]
    async fn an_unreachable_object_store_is_retried() {
        let s3 = object_store::aws::AmazonS3Builder::new()
            .with_bucket_name("checkpoints")
            .with_region("us-east-1")
            .with_endpoint("http://127.0.0.1:1")
            .with_allow_http(true)
            .with_access_key_id("k")
            .with_secret_access_key("s")
            .with_retry(object_store::RetryConfig {
                max_retries: 0,
                retry_timeout: std::time::Duration::from_secs(1),
                ..Default::default()
            })
            .build()
            .unwrap();
        let objects = crate::checkpoint::Store::from(Arc::new(s3));
        let r = Replica::with_checkpoints("t", 0, MemStore::new(Default::default()), Some(objects));
        assert!(matches!(r.reload(50).await, Err(Reload::Retry(_))));
        assert_eq!(r.applied_index(), 0);
    }

    #[test]
    fn swap_replays_the_skipped_revisions_to_synced_watchers() {
        let old = store_after(3);
        let old_rev = old.revision();
        let r = Replica::new("t", 0, old);
        let mut h = r.hub().open_stream();
        let w = r
            .hub()
            .register(h.id, 0, WatchSpec::range(b"k", b"l"), 0, old_rev)
            .unwrap();
        assert!(w.synced);
        let new = store_after(10);
        let new_rev = new.revision();
        r.swap(new).unwrap();
        assert_eq!(r.applied_index(), 10);
        assert_eq!(r.read().revision(), new_rev);
        let expected: Vec<i64> = (old_rev + 1..=new_rev).collect();
        assert_eq!(revisions(&mut h.deliveries), expected);
        assert_eq!(r.hub().revision(), new_rev);
    }

    /// Progress answers of a replica started from a checkpoint carry the checkpoint's revision
    /// before any entry is applied.
    #[test]
    fn progress_from_a_checkpoint_reports_its_revision() {
        let r = Replica::new("t", 0, store_after(5));
        let rev = r.read().revision();
        assert!(rev > 1);
        let mut h = r.hub().open_stream();
        r.hub()
            .register(h.id, 0, WatchSpec::range(b"k", b"l"), 0, rev)
            .unwrap();
        r.hub().request_progress(h.id);
        match h.deliveries.try_recv() {
            Ok(Delivery::Progress { revision, .. }) => assert_eq!(revision, rev),
            other => panic!("expected a progress answer, got {other:?}"),
        }
    }

    #[test]
    fn swap_past_compacted_history_sends_watchers_to_catch_up_from_the_new_store() {
        let r = Replica::new("t", 0, store_after(3));
        let mut h = r.hub().open_stream();
        let rev = r.read().revision();
        let w = r
            .hub()
            .register(h.id, 0, WatchSpec::range(b"k", b"l"), 0, rev)
            .unwrap();
        assert!(w.synced);
        let mut new = store_after(10);
        let revision = new.revision();
        apply(
            &mut new,
            11,
            Request::Compact(CompactionRequest {
                revision,
                physical: false,
            }),
        );
        let compact = new.compact_revision();
        r.swap(new).unwrap();
        assert_eq!(r.applied_index(), 11);
        // Nothing was delivered from the compacted gap; the watcher is unsynced at the old
        // revision + 1, where the new store's history answers Compacted (so its stream cancels
        // it with compact_revision set).
        assert!(revisions(&mut h.deliveries).is_empty());
        let behind = r.hub().unsynced(h.id);
        assert_eq!(behind.len(), 1);
        assert_eq!(behind[0].next_rev, rev + 1);
        assert!(matches!(
            r.read().events(behind[0].next_rev, b"k", b"l", 16),
            Err(memstore::Error::Compacted)
        ));
        assert!(compact > rev);
        // A checkpoint that is not ahead of the replica is never swapped in.
        assert!(r.swap(store_after(5)).is_err());
    }
}
