//! One shard's compaction loop: rebuild every tenant's replica from its newest checkpoint, tail
//! the shard, apply each record to every tenant, and every N records or T seconds run a round:
//! encode each tenant's checkpoint, upload it and publish its manifest in the background (the
//! loop keeps applying meanwhile), then trim the journal below what every tenant's published
//! checkpoints cover. Failed rounds back off; nothing here ever blocks client traffic.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use api::etcdserverpb::CompactionRequest;
use api::manifest::{self, CheckpointRef, Manifest};
use api::record::entry_for_tenant;
use api::strata::entry::Entry;
use api::strata::entry::entry::Request;
use api::strata::journal::record::Kind;
use api::strata::journal::{Record, Tick};
use bytes::Bytes;
use futures::StreamExt;
use memstore::MemStore;
use memstore::checkpoint::{self, CheckpointMeta};
use prost::Message;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use crate::auto_compaction::Tracker;
use crate::catalog::Catalog;
use crate::clock::wall_ms;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::purge::Catalogue;
use crate::reader;
use crate::source::Journal;

/// How often the loop looks at its timers and reports how far behind it is.
const TICK: Duration = Duration::from_secs(1);
/// A "behind" warning is logged at most this often while rounds fail.
const BEHIND_LOG_EVERY: Duration = Duration::from_secs(10);
/// Auto-compaction outcomes waiting for the loop (one per tenant at most is in flight).
const AUTO_OUTCOMES: usize = 64;
/// Bytes of a request id (the frontend's convention).
const REQUEST_ID_BYTES: usize = 16;

/// The answer of one journalled auto-compaction: (tenant, revision, appended).
type AutoOutcome = (String, i64, bool);

/// What one shard's loop has done so far; published on a `watch` channel for tests and status.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardStatus {
    pub shard: u32,
    /// True once every tenant's replica is loaded and the shard is being tailed.
    pub running: bool,
    /// Last journal index applied.
    pub applied_index: u64,
    /// Newest published checkpoint index per tenant.
    pub checkpoints: BTreeMap<String, u64>,
    /// First index the journal retains after this compactor's last trim (0: never trimmed).
    pub trimmed_below: u64,
    /// Rounds that published every tenant's checkpoint.
    pub rounds: u64,
    /// Rounds that failed (some object-store or journal call did not succeed).
    pub failed_rounds: u64,
    /// Records applied beyond the oldest tenant's newest published checkpoint.
    pub behind_entries: u64,
    /// Times the loop restarted from the object store after an error.
    pub restarts: u64,
    pub last_error: Option<String>,
}

struct Tenant {
    store: MemStore,
    /// The tenant's newest manifest's checkpoints, newest first (empty: none published yet).
    published: Vec<CheckpointRef>,
}

impl Tenant {
    /// A tenant's replica as the compactor keeps it: nobody watches it, so its applies build
    /// no watch events (`MemStore::set_emit_events`).
    fn new(mut store: MemStore, published: Vec<CheckpointRef>) -> Self {
        store.set_emit_events(false);
        Self { store, published }
    }
}

/// Manifests read at once when a trim checks what the store's newest manifests cover.
const TRIM_MANIFEST_READS: usize = 16;

/// Where a loop starts: this shard's tenants as loaded, the tenants whose newest manifest names
/// another shard (with that shard), and the journal's first index.
struct Start {
    tenants: BTreeMap<String, Tenant>,
    elsewhere: BTreeMap<String, u32>,
    /// Tenants the catalogue is done with (`crate::purge`): not loaded, their objects deleted,
    /// their entries applied as ticks.
    purged: BTreeSet<String>,
    first_index: u64,
}

/// What a background round produced for one tenant.
type RoundResult = Vec<(String, Result<Manifest>)>;

/// One encoded checkpoint waiting to be uploaded.
struct Job {
    tenant: String,
    index: u64,
    revision: i64,
    time_ms: i64,
    bytes: Bytes,
    previous: Vec<CheckpointRef>,
}

pub(crate) struct ShardWorker<J: Journal> {
    pub shard: u32,
    pub journal: J,
    pub catalog: Catalog,
    pub config: Arc<Config>,
    pub status: watch::Sender<ShardStatus>,
}

impl<J: Journal> ShardWorker<J> {
    /// Runs until `shutdown` turns true; every error restarts the loop from the object store
    /// after a backoff.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let mut backoff = self.config.retry_min;
        loop {
            let result = self.run_once(&mut shutdown).await;
            let e = match result {
                Ok(()) => return,
                Err(e) => e,
            };
            if e.is_retryable() {
                warn!(shard = self.shard, error = %e, retry_in = ?backoff, "compactor loop failed; restarting from the object store");
            } else {
                error!(shard = self.shard, error = %e, retry_in = ?backoff, "compactor loop failed; restarting from the object store");
            }
            self.status.send_modify(|s| {
                s.running = false;
                s.restarts += 1;
                s.last_error = Some(e.to_string());
            });
            metrics::counter!("strata_compactor_restarts_total", "shard" => self.shard.to_string())
                .increment(1);
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = stopped(&mut shutdown) => return,
            }
            backoff = (backoff * 2).min(self.config.retry_max);
        }
    }

    /// Loads every tenant of this shard from its newest usable checkpoint.
    async fn load(&self) -> Result<Start> {
        let first_index = self.journal.first_index(self.shard).await?.max(1);
        let mut names: BTreeSet<String> = self.catalog.tenants().await?.into_iter().collect();
        names.extend(
            self.config
                .tenants
                .iter()
                .filter(|(_, s)| *s == self.shard)
                .map(|(t, _)| t.clone()),
        );
        let mut tenants = BTreeMap::new();
        let mut elsewhere = BTreeMap::new();
        let purged = match Catalogue::read(&self.catalog).await {
            Ok(Some(c)) => c.done_with(names.iter()),
            Ok(None) => BTreeSet::new(),
            Err(e) if e.is_retryable() => return Err(e),
            // A catalogue that cannot be read only delays purging: every tenant stays.
            Err(e) => {
                warn!(shard = self.shard, error = %e, "cannot read the tenant catalogue; purging later");
                BTreeSet::new()
            }
        };
        for name in &purged {
            self.purge(name).await?;
        }
        for name in names.into_iter().filter(|n| !purged.contains(n)) {
            let configured_here = self
                .config
                .tenants
                .iter()
                .any(|(t, s)| *t == name && *s == self.shard);
            // The manifest says which shard the tenant lives on: another shard's tenant is left
            // alone before any of its checkpoints is read.
            let newest = match self.catalog.latest_manifest(&name).await {
                // None can be read: if they name another shard, that shard's loop stops on
                // them, not this one.
                Err(e @ Error::NoUsableManifest { .. }) => {
                    match self.catalog.newest_manifest_shard(&name).await? {
                        Some(shard) if shard != self.shard => {
                            elsewhere.insert(name, shard);
                            continue;
                        }
                        _ => return Err(e),
                    }
                }
                other => other?,
            };
            let manifest = match newest {
                Some(m) if m.shard != self.shard => {
                    elsewhere.insert(name, m.shard);
                    continue;
                }
                Some(m) => m,
                None if configured_here => {
                    tenants.insert(
                        name,
                        Tenant::new(MemStore::new(memstore::Config::default()), Vec::new()),
                    );
                    continue;
                }
                None => continue,
            };
            match reader::newest_usable(&self.catalog, &name, manifest).await {
                Ok(loaded) => {
                    if loaded.meta.index + 1 < first_index {
                        return Err(Error::Unrecoverable {
                            tenant: name,
                            shard: self.shard,
                            checkpoint: loaded.meta.index,
                            first_index,
                        });
                    }
                    let bad: BTreeSet<&str> = loaded
                        .skipped
                        .iter()
                        .map(|(r, _)| r.path.as_str())
                        .collect();
                    let published = loaded
                        .manifest
                        .checkpoints
                        .iter()
                        .filter(|c| !bad.contains(c.path.as_str()))
                        .cloned()
                        .collect();
                    info!(shard = self.shard, tenant = %name, index = loaded.meta.index, revision = loaded.meta.revision, "tenant loaded from checkpoint");
                    tenants.insert(name, Tenant::new(loaded.store, published));
                }
                Err(e) if e.is_retryable() => return Err(e),
                Err(e) => {
                    // Every checkpoint of this shard's tenant is unusable. Only a journal that
                    // still holds the whole history can rebuild it.
                    if first_index > 1 {
                        return Err(e);
                    }
                    warn!(shard = self.shard, tenant = %name, error = %e, "no usable checkpoint; rebuilding from the whole journal");
                    tenants.insert(
                        name,
                        Tenant::new(MemStore::new(memstore::Config::default()), Vec::new()),
                    );
                }
            }
        }
        Ok(Start {
            tenants,
            elsewhere,
            purged,
            first_index,
        })
    }

    async fn run_once(&self, shutdown: &mut watch::Receiver<bool>) -> Result<()> {
        let Start {
            mut tenants,
            elsewhere,
            mut purged,
            first_index,
        } = self.load().await?;
        // Purged tenants whose objects are still to be deleted.
        let mut undeleted: BTreeSet<String> = BTreeSet::new();
        let mut catalogue_ticker = tokio::time::interval(self.config.catalogue_every);
        catalogue_ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        catalogue_ticker.tick().await; // `load` just read it
        let mut stream = self.journal.read(self.shard, first_index).await?;
        let mut applied = first_index - 1;
        let mut refused: BTreeSet<String> = BTreeSet::new();
        let mut since_round: u64 = 0;
        let mut last_round = Instant::now();
        let mut last_success = Instant::now();
        let mut last_behind_log = Instant::now();
        let mut next_attempt = Instant::now();
        let mut backoff = self.config.retry_min;
        let mut failures: u64 = 0;
        // A failed round is retried after its backoff even if no record arrives meanwhile.
        let mut retry_pending = false;
        let mut round: Option<JoinHandle<RoundResult>> = None;
        // Auto-compaction: one tracker per tenant, checked on its own interval; the appends run
        // in the background and report here.
        let started = Instant::now();
        let mut trackers: BTreeMap<String, Tracker> = BTreeMap::new();
        let mut auto_ticker = self.config.auto_compaction.map(|p| {
            let mut t = tokio::time::interval(p.check_every);
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            t
        });
        let (auto_tx, mut auto_rx) = mpsc::channel::<AutoOutcome>(AUTO_OUTCOMES);
        let mut ticker = tokio::time::interval(TICK);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        self.status.send_modify(|s| {
            s.shard = self.shard;
            s.running = true;
            s.applied_index = applied;
            s.checkpoints = newest_indexes(&tenants);
            s.last_error = None;
        });
        info!(
            shard = self.shard,
            from = first_index,
            tenants = tenants.len(),
            "tailing shard"
        );

        let result = loop {
            tokio::select! {
                item = stream.next() => {
                    let record = match item {
                        Some(Ok(r)) => r,
                        Some(Err(e)) => break Err(e),
                        None => break Err(Error::Journal { shard: self.shard, reason: "read stream ended".into() }),
                    };
                    if record.index != applied + 1 {
                        break Err(Error::Journal {
                            shard: self.shard,
                            reason: format!("record {} after {applied}: gap or repeat", record.index),
                        });
                    }
                    if let Err(e) = apply(&mut tenants, &elsewhere, &mut refused, &purged, &record) {
                        break Err(e);
                    }
                    applied = record.index;
                    since_round += 1;
                }
                done = async { round.as_mut().expect("guarded by the if").await }, if round.is_some() => {
                    round = None;
                    let results = match done {
                        Ok(r) => r,
                        Err(e) => break Err(Error::Task(e.to_string())),
                    };
                    let mut ok = true;
                    for (tenant, r) in results {
                        match r {
                            Ok(m) => {
                                if let Some(t) = tenants.get_mut(&tenant) {
                                    t.published = m.checkpoints;
                                }
                            }
                            Err(e) => {
                                ok = false;
                                warn!(shard = self.shard, tenant = %tenant, error = %e, "checkpoint round failed for tenant");
                                self.status.send_modify(|s| s.last_error = Some(format!("{tenant}: {e}")));
                            }
                        }
                    }
                    if ok {
                        failures = 0;
                        backoff = self.config.retry_min;
                        last_success = Instant::now();
                        self.status.send_modify(|s| s.rounds += 1);
                        metrics::counter!("strata_compactor_rounds_total", "shard" => self.shard.to_string(), "result" => "ok").increment(1);
                    } else {
                        failures += 1;
                        retry_pending = true;
                        next_attempt = Instant::now() + backoff;
                        backoff = (backoff * 2).min(self.config.retry_max);
                        self.status.send_modify(|s| s.failed_rounds += 1);
                        metrics::counter!("strata_compactor_rounds_total", "shard" => self.shard.to_string(), "result" => "failed").increment(1);
                    }
                    self.status.send_modify(|s| s.checkpoints = newest_indexes(&tenants));
                    self.trim(&tenants, &refused).await;
                }
                _ = ticker.tick() => {
                    let behind = behind_entries(&tenants, applied);
                    let behind_secs = last_success.elapsed().as_secs_f64();
                    metrics::gauge!("strata_compactor_applied_index", "shard" => self.shard.to_string()).set(applied as f64);
                    metrics::gauge!("strata_compactor_behind_entries", "shard" => self.shard.to_string()).set(behind as f64);
                    metrics::gauge!("strata_compactor_behind_seconds", "shard" => self.shard.to_string()).set(behind_secs);
                    if failures > 0 && last_behind_log.elapsed() >= BEHIND_LOG_EVERY {
                        last_behind_log = Instant::now();
                        warn!(shard = self.shard, behind_entries = behind, behind_seconds = behind_secs as u64, failed_rounds = failures, retry_in = ?next_attempt.saturating_duration_since(Instant::now()), "compactor is behind: object store rounds failing; the journal keeps growing until they succeed");
                    }
                }
                // Not while a round uploads: it could publish a purged tenant's checkpoint after
                // its objects were deleted.
                _ = catalogue_ticker.tick(), if round.is_none() => {
                    match Catalogue::read(&self.catalog).await {
                        Ok(Some(c)) => {
                            for name in c.done_with(tenants.keys()) {
                                tenants.remove(&name);
                                trackers.remove(&name);
                                purged.insert(name.clone());
                                undeleted.insert(name);
                            }
                        }
                        Ok(None) => {}
                        Err(e) => warn!(shard = self.shard, error = %e, "cannot read the tenant catalogue; purging later"),
                    }
                    // Objects of purged tenants, deleted now or at a later tick if the store fails.
                    let mut left = BTreeSet::new();
                    for name in std::mem::take(&mut undeleted) {
                        if let Err(e) = self.purge(&name).await {
                            warn!(shard = self.shard, tenant = %name, error = %e, "cannot delete a purged tenant's objects yet");
                            left.insert(name);
                        }
                    }
                    undeleted = left;
                }
                _ = async { auto_ticker.as_mut().expect("guarded by the if").tick().await }, if auto_ticker.is_some() => {
                    self.auto_compact(&tenants, &mut trackers, started.elapsed(), &auto_tx);
                }
                Some((tenant, revision, ok)) = auto_rx.recv() => {
                    if let Some(t) = trackers.get_mut(&tenant) {
                        t.done(started.elapsed(), revision, ok);
                    }
                }
                _ = stopped(shutdown) => break Ok(()),
            }
            self.status.send_modify(|s| {
                s.applied_index = applied;
                s.behind_entries = behind_entries(&tenants, applied);
            });
            let due = retry_pending
                || since_round >= self.config.every_entries
                || (since_round > 0 && last_round.elapsed() >= self.config.every);
            if due && round.is_none() && Instant::now() >= next_attempt {
                match self.start_round(&mut tenants).await {
                    Ok(Some(handle)) => round = Some(handle),
                    // Nothing to checkpoint (no tenant yet, or every tenant's newest checkpoint
                    // is current): the compactor is not behind, and
                    // `strata_compactor_behind_seconds` must not grow. (A shard whose tenants
                    // are refused is never trimmed: it is behind.)
                    Ok(None) if refused.is_empty() => {
                        last_success = Instant::now();
                        if tenants.is_empty() {
                            self.trim_ticks_only(first_index, applied).await;
                        }
                    }
                    Ok(None) => {}
                    Err(e) => break Err(e),
                }
                since_round = 0;
                retry_pending = false;
                last_round = Instant::now();
            }
        };
        if let Some(r) = round {
            r.abort();
        }
        result
    }

    /// Deletes the objects of a tenant the catalogue is done with.
    async fn purge(&self, tenant: &str) -> Result<()> {
        let objects = self.catalog.delete_tenant(tenant).await?;
        info!(
            shard = self.shard,
            tenant,
            objects,
            "tenant purged: deleted past its retention, or an older generation of its name"
        );
        metrics::counter!("strata_compactor_tenants_purged_total", "shard" => self.shard.to_string())
            .increment(1);
        Ok(())
    }

    /// One auto-compaction check of every tenant: a due compaction is appended to the journal
    /// as an ordinary Compact entry of the tenant (a fresh request id, as a client's), so every
    /// replica compacts at the same revision when it applies it.
    fn auto_compact(
        &self,
        tenants: &BTreeMap<String, Tenant>,
        trackers: &mut BTreeMap<String, Tracker>,
        now: Duration,
        outcomes: &mpsc::Sender<AutoOutcome>,
    ) {
        let Some(policy) = self.config.auto_compaction else {
            return;
        };
        for (name, t) in tenants {
            let revision = t.store.revision();
            let Some(tracker) = trackers.get_mut(name) else {
                trackers.insert(name.clone(), Tracker::new(policy, now, revision));
                continue;
            };
            let Some(at) = tracker.check(now, revision, t.store.compact_revision()) else {
                continue;
            };
            info!(shard = self.shard, tenant = %name, revision = at, current = revision, mode = ?policy.mode, "auto-compaction");
            let entry = Entry {
                format_version: api::ENTRY_FORMAT_VERSION,
                tenant: name.clone(),
                request_id: rand::random::<[u8; REQUEST_ID_BYTES]>().to_vec(),
                time_ms: 0,
                request: Some(Request::Compact(CompactionRequest {
                    revision: at,
                    physical: false,
                })),
                ..Default::default()
            };
            let payload = api::record::encode_entry(&entry);
            let journal = self.journal.clone();
            let shard = self.shard;
            let tenant = name.clone();
            let outcomes = outcomes.clone();
            tokio::spawn(async move {
                let ok = match journal.append_entries(shard, vec![payload]).await {
                    Ok(_) => true,
                    Err(e) => {
                        warn!(shard, tenant = %tenant, revision = at, error = %e, "auto-compaction append failed; retrying at the next check");
                        false
                    }
                };
                let result = if ok { "ok" } else { "failed" };
                metrics::counter!("strata_compactor_auto_compactions_total", "shard" => shard.to_string(), "result" => result).increment(1);
                let _ = outcomes.send((tenant, at, ok)).await;
            });
        }
    }

    /// Encodes every tenant that moved since its newest published checkpoint (here: the loop
    /// pauses applying while encoding) and starts the upload in the background.
    async fn start_round(
        &self,
        tenants: &mut BTreeMap<String, Tenant>,
    ) -> Result<Option<JoinHandle<RoundResult>>> {
        let mut jobs = Vec::new();
        for (name, t) in tenants.iter_mut() {
            let index = t.store.applied_index();
            if index == 0 || t.published.first().is_some_and(|c| c.index >= index) {
                continue;
            }
            // A tenant whose keys did not change since its newest checkpoint (only journal
            // ticks, keep-alives and the like moved its index) gets a new one only once the
            // journal has grown by `every_entries` since: a copy of the same state each round
            // pushed every earlier state out of the `keep` newest within minutes (found by
            // review), while skipping costs a new replica at most that many entries to replay.
            if t.published.first().is_some_and(|c| {
                c.revision == t.store.revision() && index - c.index < self.config.every_entries
            }) {
                continue;
            }
            let meta = CheckpointMeta {
                tenant: name.clone(),
                shard: self.shard,
                index,
                revision: t.store.revision(),
                created_ms: t.store.time_ms(),
            };
            let store = std::mem::replace(&mut t.store, MemStore::new(memstore::Config::default()));
            let (store, bytes) = tokio::task::spawn_blocking(move || {
                let bytes = checkpoint::encode(&meta, &store);
                (store, bytes)
            })
            .await
            .map_err(|e| Error::Task(format!("encoding a checkpoint: {e}")))?;
            jobs.push(Job {
                tenant: name.clone(),
                index,
                revision: store.revision(),
                time_ms: store.time_ms(),
                bytes: Bytes::from(bytes),
                previous: t.published.clone(),
            });
            t.store = store;
        }
        if jobs.is_empty() {
            return Ok(None);
        }
        let catalog = self.catalog.clone();
        let journal = self.journal.clone();
        let shard = self.shard;
        let keep = self.config.keep;
        let pause = self.config.step_pause;
        Ok(Some(tokio::spawn(upload_round(
            catalog, journal, shard, keep, pause, jobs,
        ))))
    }

    /// Trims the journal below the lowest index every tenant's checkpoints cover (the
    /// checkpoint `trim_lag` places behind each tenant's newest).
    async fn trim(&self, tenants: &BTreeMap<String, Tenant>, refused: &BTreeSet<String>) {
        if !refused.is_empty() {
            debug!(
                shard = self.shard,
                "not trimming: the shard holds tenants that cannot be checkpointed"
            );
            return;
        }
        let Some(below) = trim_point(tenants, self.config.trim_lag) else {
            return;
        };
        let trimmed_below = self.status.borrow().trimmed_below;
        if below <= trimmed_below {
            return;
        }
        // Another compactor of the shard (a rolling restart's overlap, a process that stalled)
        // may have published newer manifests naming older checkpoints than this one's: trim
        // only below what the newest manifest in the store covers too.
        let mut below = below;
        let newest: Vec<(String, Result<Option<Manifest>>)> =
            futures::stream::iter(tenants.keys().cloned())
                .map(|name| {
                    let catalog = self.catalog.clone();
                    async move {
                        let newest = catalog.latest_manifest(&name).await;
                        (name, newest)
                    }
                })
                .buffer_unordered(TRIM_MANIFEST_READS)
                .collect()
                .await;
        for (name, newest) in newest {
            let covered = match newest {
                Ok(m) => m.and_then(|m| m.checkpoints.get(self.config.trim_lag).map(|c| c.index)),
                Err(e) => {
                    warn!(shard = self.shard, tenant = %name, error = %e, "not trimming: the newest manifest could not be read");
                    return;
                }
            };
            let Some(covered) = covered else {
                debug!(shard = self.shard, tenant = %name, "not trimming: the newest manifest in the store covers too little");
                return;
            };
            below = below.min(covered + 1);
        }
        if below <= trimmed_below {
            return;
        }
        self.trim_journal(below).await;
    }

    /// A shard that holds no tenant yet (every record so far a tick or a leader change) would
    /// otherwise keep its idle ticks forever (about 170,000 a day). Once the journal grew by
    /// `every_entries` since its first index, the loop writes the `TicksOnly` record, which lets
    /// a tenant that comes later start empty on the trimmed journal (a frontend needs that
    /// word), and then trims below what it applied. Nothing of a tenant is below: a record of
    /// one would have made it a tenant of this loop.
    async fn trim_ticks_only(&self, first_index: u64, applied: u64) {
        let below = applied + 1;
        let trimmed_below = self.status.borrow().trimmed_below.max(first_index);
        if below < trimmed_below.saturating_add(self.config.every_entries) {
            return;
        }
        if let Err(e) = self
            .catalog
            .publish_ticks_only(self.shard, below, wall_ms())
            .await
        {
            warn!(shard = self.shard, below, error = %e, "not trimming the tenant-less shard: its ticks-only record could not be written");
            return;
        }
        self.trim_journal(below).await;
    }

    async fn trim_journal(&self, below: u64) {
        match self.journal.trim(self.shard, below).await {
            Ok(first) => {
                debug!(shard = self.shard, below, first, "journal trimmed");
                metrics::gauge!("strata_compactor_trimmed_below", "shard" => self.shard.to_string()).set(first as f64);
                self.status.send_modify(|s| s.trimmed_below = first);
            }
            Err(e) => {
                warn!(shard = self.shard, below, error = %e, "journal trim failed; retrying after the next round")
            }
        }
    }
}

/// Resolves once `shutdown` is true (or its sender is gone).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|s| *s).await;
}

/// The index below which the journal may be trimmed: one past the lowest index covered by the
/// checkpoint `lag` places behind each tenant's newest. `None` while a tenant has too few.
fn trim_point(tenants: &BTreeMap<String, Tenant>, lag: usize) -> Option<u64> {
    let mut low: Option<u64> = None;
    for t in tenants.values() {
        let covered = t.published.get(lag)?.index;
        low = Some(low.map_or(covered, |l| l.min(covered)));
    }
    low.map(|l| l + 1)
}

fn newest_indexes(tenants: &BTreeMap<String, Tenant>) -> BTreeMap<String, u64> {
    tenants
        .iter()
        .filter_map(|(n, t)| t.published.first().map(|c| (n.clone(), c.index)))
        .collect()
}

fn behind_entries(tenants: &BTreeMap<String, Tenant>, applied: u64) -> u64 {
    tenants
        .values()
        .map(|t| applied.saturating_sub(t.published.first().map_or(0, |c| c.index)))
        .max()
        .unwrap_or(0)
}

/// The tenant a data record belongs to (None for ticks and leader changes).
fn owner(record: &Record) -> Result<Option<String>> {
    match &record.kind {
        Some(Kind::Data(bytes)) => {
            let entry = Entry::decode(bytes.as_slice()).map_err(|source| {
                api::record::DecodeError::Malformed {
                    index: record.index,
                    source,
                }
            })?;
            Ok(Some(entry.tenant))
        }
        _ => Ok(None),
    }
}

/// Applies one record to every tenant replica: its owner gets the entry, every other tenant the
/// tick it stands for (`api::record::entry_for_tenant`'s rule). A tenant seen for the first time
/// starts from an empty store (trimming never passes a tenant without a checkpoint, so its whole
/// history is still in the journal), unless its checkpoints are published for another shard
/// (`elsewhere`) or its name cannot name objects: such a tenant is `refused` (not checkpointed,
/// and the journal is not trimmed while it has entries here).
fn apply(
    tenants: &mut BTreeMap<String, Tenant>,
    elsewhere: &BTreeMap<String, u32>,
    refused: &mut BTreeSet<String>,
    purged: &BTreeSet<String>,
    record: &Record,
) -> Result<()> {
    let owner = owner(record)?;
    if let Some(o) = &owner
        && !tenants.contains_key(o)
        && !refused.contains(o)
        && !purged.contains(o)
    {
        if let Some(shard) = elsewhere.get(o) {
            error!(tenant = %o, index = record.index, checkpoints_for_shard = shard, "tenant has entries on this shard but its checkpoints are another shard's: its entries here are not checkpointed and the journal will not be trimmed");
            refused.insert(o.clone());
        } else if manifest::validate_tenant(o).is_ok() {
            info!(tenant = %o, index = record.index, "new tenant on shard");
            tenants.insert(
                o.clone(),
                Tenant::new(MemStore::new(memstore::Config::default()), Vec::new()),
            );
        } else {
            error!(tenant = ?o, index = record.index, "tenant name cannot name objects: its entries are not checkpointed and the journal will not be trimmed");
            refused.insert(o.clone());
        }
    }
    // The entry every non-owner applies: the same position as a tick.
    let tick_record = Record {
        kind: Some(Kind::Tick(Tick {})),
        ..record.clone()
    };
    let shared = entry_for_tenant(
        if owner.is_some() {
            &tick_record
        } else {
            record
        },
        "",
    )?;
    for (name, t) in tenants.iter_mut() {
        if owner.as_deref() == Some(name.as_str()) {
            t.store.apply_record_ref(record, name)?;
        } else {
            t.store.apply(record.index, &shared);
        }
    }
    Ok(())
}

/// Uploads each job's checkpoint, publishes its tenant's manifest and collects garbage; runs in
/// the background while the shard loop keeps applying.
async fn upload_round<J: Journal>(
    catalog: Catalog,
    journal: J,
    shard: u32,
    keep: usize,
    pause: Duration,
    jobs: Vec<Job>,
) -> RoundResult {
    let mut out = Vec::with_capacity(jobs.len());
    for job in jobs {
        let tenant = job.tenant.clone();
        let r = upload_one(&catalog, &journal, shard, keep, pause, job).await;
        out.push((tenant, r));
    }
    out
}

async fn upload_one<J: Journal>(
    catalog: &Catalog,
    journal: &J,
    shard: u32,
    keep: usize,
    pause: Duration,
    job: Job,
) -> Result<Manifest> {
    let started = Instant::now();
    let size = job.bytes.len();
    let new = catalog
        .write_checkpoint(
            &job.tenant,
            job.index,
            job.revision,
            job.time_ms,
            wall_ms(),
            job.bytes,
        )
        .await?;
    if !pause.is_zero() {
        tokio::time::sleep(pause).await; // testing only: a kill lands between upload and publish
    }
    let mut list = vec![new];
    list.extend(job.previous.into_iter().filter(|c| c.index < job.index));
    list.truncate(keep);
    // A checkpoint the journal no longer continues from (another compactor of the shard, in a
    // rolling restart's overlap or after this one stalled, trimmed past it) would make every
    // new frontend fail to start from the newest manifest: not published.
    let first_index = journal.first_index(shard).await?;
    if job.index + 1 < first_index {
        return Err(Error::Trimmed {
            shard,
            wanted: job.index + 1,
            first_index,
        });
    }
    let m = catalog.publish(&job.tenant, shard, list, wall_ms()).await?;
    if !pause.is_zero() {
        tokio::time::sleep(pause).await; // testing only: a kill lands between publish and trim
    }
    let secs = started.elapsed().as_secs_f64();
    metrics::histogram!("strata_compactor_checkpoint_upload_seconds").record(secs);
    metrics::counter!("strata_compactor_checkpoint_bytes_total", "shard" => shard.to_string())
        .increment(size as u64);
    debug!(tenant = %job.tenant, shard, index = job.index, bytes = size, seconds = secs, "checkpoint published");
    if let Err(e) = catalog.collect_garbage(&job.tenant, &m).await {
        warn!(tenant = %job.tenant, shard, error = %e, "garbage collection failed; retrying after the next checkpoint");
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::MemJournal;
    use api::strata::journal::Tick;

    /// A checkpoint the journal was trimmed past (by another compactor of the shard) is not
    /// published: the newest manifest would name a state no frontend can continue from.
    #[tokio::test]
    async fn a_checkpoint_below_the_journal_is_not_published() {
        let journal = MemJournal::new();
        journal.append(0, 1_000, vec![Kind::Tick(Tick {}); 20]);
        journal.trim(0, 11).await.unwrap();
        let catalog = Catalog::new(Arc::new(object_store::memory::InMemory::new()));
        let meta = memstore::checkpoint::CheckpointMeta {
            tenant: "acme".into(),
            shard: 0,
            index: 0,
            revision: 1,
            created_ms: 0,
        };
        let job = |index: u64| Job {
            tenant: "acme".into(),
            index,
            revision: 1,
            time_ms: 1_000,
            bytes: Bytes::from(memstore::checkpoint::encode(
                &memstore::checkpoint::CheckpointMeta {
                    index,
                    ..meta.clone()
                },
                &MemStore::new_at(memstore::Config::default(), index),
            )),
            previous: Vec::new(),
        };
        let refused = upload_one(&catalog, &journal, 0, 3, Duration::ZERO, job(5)).await;
        assert!(
            matches!(
                refused,
                Err(Error::Trimmed {
                    first_index: 11,
                    ..
                })
            ),
            "{refused:?}"
        );
        assert!(catalog.latest_manifest("acme").await.unwrap().is_none());
        // Right at the trim point it continues: published.
        let m = upload_one(&catalog, &journal, 0, 3, Duration::ZERO, job(10))
            .await
            .unwrap();
        assert_eq!(m.newest().unwrap().index, 10);
    }

    /// A purged tenant's entries still in the journal are applied as ticks: they never bring
    /// the tenant back (its checkpoints would reappear and hold the trim floor).
    #[test]
    fn a_purged_tenant_s_entries_do_not_bring_it_back() {
        let record = |index: u64, tenant: &str| Record {
            index,
            time_ms: 1_000,
            kind: Some(Kind::Data(api::record::encode_entry(&Entry {
                format_version: api::ENTRY_FORMAT_VERSION,
                tenant: tenant.into(),
                request: Some(api::strata::entry::entry::Request::Put(
                    api::etcdserverpb::PutRequest {
                        key: b"k".to_vec(),
                        value: b"v".to_vec(),
                        ..Default::default()
                    },
                )),
                ..Default::default()
            }))),
            ..Default::default()
        };
        let mut tenants = BTreeMap::new();
        let mut refused = BTreeSet::new();
        let purged = BTreeSet::from(["gone.0101010101010101".to_string()]);
        let elsewhere = BTreeMap::new();
        apply(
            &mut tenants,
            &elsewhere,
            &mut refused,
            &purged,
            &record(1, "kept"),
        )
        .unwrap();
        apply(
            &mut tenants,
            &elsewhere,
            &mut refused,
            &purged,
            &record(2, "gone.0101010101010101"),
        )
        .unwrap();
        assert_eq!(tenants.keys().collect::<Vec<_>>(), ["kept"]);
        assert!(refused.is_empty(), "a purged tenant does not hold the trim");
        assert_eq!(
            tenants["kept"].store.applied_index(),
            2,
            "its entry is a tick"
        );
        assert_eq!(tenants["kept"].store.revision(), 2);
    }

    fn reference(index: u64) -> CheckpointRef {
        CheckpointRef {
            path: format!("tenants/acme/checkpoints/{index:020}-0.ckpt"),
            index,
            revision: 1,
            size: 0,
            crc32c: 0,
            time_ms: 0,
            created_ms: 0,
        }
    }

    /// The trim stays below what the newest manifest in the store covers, even when this
    /// compactor published newer checkpoints (another compactor of the shard published after it).
    #[tokio::test]
    async fn the_trim_stays_below_the_newest_manifest_in_the_store() {
        let journal = MemJournal::new();
        journal.append(0, 1_000, vec![Kind::Tick(Tick {}); 30]);
        let catalog = Catalog::new(Arc::new(object_store::memory::InMemory::new()));
        let worker = ShardWorker {
            shard: 0,
            journal: journal.clone(),
            catalog: catalog.clone(),
            config: Arc::new(Config {
                tenants: Vec::new(),
                keep: 3,
                trim_lag: 1,
                ..Config::default()
            }),
            status: watch::Sender::new(ShardStatus::default()),
        };
        let mut tenants = BTreeMap::new();
        tenants.insert(
            "acme".to_string(),
            Tenant::new(
                MemStore::new(memstore::Config::default()),
                vec![reference(20), reference(10)],
            ),
        );
        // The other compactor's manifest, newer than this one's, covers less.
        catalog
            .publish("acme", 0, vec![reference(8), reference(4)], 0)
            .await
            .unwrap();
        worker.trim(&tenants, &BTreeSet::new()).await;
        assert_eq!(journal.first_index(0).await.unwrap(), 5);
        // Once the newest manifest covers what this one published, the trim follows it.
        catalog
            .publish("acme", 0, vec![reference(20), reference(10)], 0)
            .await
            .unwrap();
        worker.trim(&tenants, &BTreeSet::new()).await;
        assert_eq!(journal.first_index(0).await.unwrap(), 11);
    }
}
