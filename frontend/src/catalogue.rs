//! Following the tenant catalogue (`--catalogue`; docs/design/tenants.md, T1 and T4): the
//! frontend runs a replica of the reserved tenant `_system` (shard 0), whose keyspace holds a
//! record per tenant, and serves every tenant the catalogue places on its shards
//! (`--catalogue-shards`, each tenant's replica reading its own shard): loaded (from
//! its newest checkpoint, then the journal) as soon as the catalogue names it, refused while
//! suspended or deleted, unloaded while idle (`--tenant-idle-unload`) or, least recently used
//! first, while the loaded tenants hold more than `--memory-budget`, and loaded again for the
//! next request naming it. Each change reaches every frontend as the journal entry it is.

use std::sync::{Arc, Weak};
use std::time::Duration;

use api::strata::admin::{TenantRecord, TenantState};
use tokio::sync::watch;

use crate::log::Log;
use crate::tenant::{Identity, Limits, Served, Tenant};
use crate::tenants::Tenants;

/// How long a failed load waits before the follower tries again.
const LOAD_RETRY: Duration = Duration::from_secs(1);
/// Tenants loaded at once (checkpoint fetch and decode) when the catalogue names several.
const LOADS_AT_ONCE: usize = 4;
/// How often a start loading many tenants sums what the loaded ones hold (`reconcile`).
const RESUM_EVERY: Duration = Duration::from_millis(100);
/// How often the follower looks again without a catalogue change: to see that the catalogue's
/// replica caught up, to retry an own-part append that did not land, and to unload idle tenants.
const LOOK_AGAIN: Duration = Duration::from_secs(1);
/// Under `--memory-budget`, a tenant a request named within this long is not unloaded, however
/// full the budget: the tenants in use are not made to load again and again.
const BUDGET_MIN_IDLE: Duration = Duration::from_secs(5);

/// What a tenant loaded from the catalogue starts with: the frontend's own settings.
pub struct Loader {
    /// The shards whose tenants are served here (`--catalogue-shards`).
    pub shards: crate::config::ShardSet,
    pub checkpoints: Option<crate::checkpoint::Store>,
    pub log: Arc<dyn Log>,
    pub limits: Limits,
    pub member_id: u64,
    /// `--tenant-idle-unload`: a tenant of the catalogue no request named for this long, with
    /// no stream open, is unloaded until a request names it again (None: never).
    pub idle_unload: Option<Duration>,
    /// `--memory-budget`: the loaded tenants' database sizes (`Tenants::loaded_bytes`) this
    /// frontend keeps under, by unloading the least recently used idle ones, and by leaving
    /// further tenants unloaded until a request names one (None: no budget).
    pub memory_budget: Option<u64>,
}

impl Loader {
    /// Starts the replica of `r`'s generation from its newest checkpoint (or the journal's
    /// start) on its shard, journalled under its key, in the state and with the quotas `r`
    /// gives it.
    async fn load(&self, r: &TenantRecord) -> Result<Arc<Tenant>, crate::server::ServeError> {
        let (name, key) = (r.name.as_str(), api::tenant::journal_key(&r.name, &r.uid));
        let store = crate::server::initial_store(&key, r.shard, self.checkpoints.as_ref()).await?;
        let t = Tenant::start(
            name,
            &key,
            r.shard,
            store,
            self.checkpoints.clone(),
            self.log.clone(),
            self.limits,
            Identity::of(&key, self.member_id),
        );
        t.set_served(served_of(r));
        t.set_quotas(r.quotas.unwrap_or_default());
        Ok(t)
    }

    /// `load`, answered with the record it loads and `estimate` (several run at once in
    /// `load_all`).
    async fn load_of<'a>(
        &self,
        r: &'a TenantRecord,
        estimate: u64,
    ) -> (
        &'a TenantRecord,
        u64,
        Result<Arc<Tenant>, crate::server::ServeError>,
    ) {
        (r, estimate, self.load(r).await)
    }

    /// What loading `r` is expected to add to the loaded tenants' bytes before it is loaded:
    /// the size of its newest checkpoint (0 without one, or if the store cannot say: the
    /// sum taken once it is loaded counts it then).
    async fn estimate(&self, r: &TenantRecord) -> u64 {
        let Some(store) = &self.checkpoints else {
            return 0;
        };
        let key = api::tenant::journal_key(&r.name, &r.uid);
        match crate::checkpoint::newest_size(store, &key).await {
            Ok(size) => size.unwrap_or(0),
            Err(e) => {
                tracing::warn!(tenant = %r.name, error = %e, "cannot read the size of a tenant's checkpoint; loading it unestimated");
                0
            }
        }
    }

    /// Whether tenants holding `held` bytes fill the memory budget: further tenants are left
    /// dormant.
    fn budget_full(&self, held: u64) -> bool {
        self.memory_budget.is_some_and(|budget| held >= budget)
    }
}

/// Keeps `tenants` in step with the catalogue its `_system` replica holds, for as long as the
/// tenants live. `reconciled` says up to which catalogue revision this frontend serves what
/// the catalogue says (the admin API answers a change once it does here).
pub async fn follow(tenants: Weak<Tenants>, loader: Loader, reconciled: watch::Sender<i64>) {
    let loader = Arc::new(loader);
    let loads = Arc::new(tokio::sync::Semaphore::new(LOADS_AT_ONCE));
    if let Some(budget) = loader.memory_budget {
        metrics::gauge!("strata_frontend_memory_budget_bytes").set(budget as f64);
    }
    let Some(system) = tenants.upgrade().and_then(|t| t.catalogue().cloned()) else {
        return;
    };
    let mut done: i64 = -1;
    let mut loaded = false;
    let mut records = Vec::new();
    let syncing: Syncing = Arc::default();
    let Some(mut wakes) = tenants.upgrade().and_then(|t| t.take_wakes()) else {
        return;
    };
    loop {
        let caught_up = system.replica.state() == crate::replica::ReplicaState::Ready;
        let revision = system.replica.read().revision();
        if revision != done || (caught_up && !loaded) {
            let Some(t) = tenants.upgrade() else { return };
            records = system.replica.read().tenant_records();
            // The loaded tenants' states first, so that requests stop waiting for them
            // (`Tenants::set_followed`) however long the loads take.
            let to_load = follow_states(&t, &records, &loader);
            t.set_followed(revision, caught_up);
            if load_all(&t, to_load, &loader).await {
                done = revision;
                reconciled.send_replace(revision);
                // Every tenant the catalogue had when its replica caught up is served now:
                // the frontend may say it is ready (`Tenants::readiness`).
                if caught_up && !loaded {
                    loaded = true;
                    t.set_catalogue_loaded();
                }
            } else {
                tokio::time::sleep(LOAD_RETRY).await;
                continue;
            }
        }
        if let Some(t) = tenants.upgrade() {
            sync_own(&t, &records, &loader.shards, &syncing);
            if let Some(idle) = loader.idle_unload {
                unload_idle(&t, idle);
            }
            let held = match loader.memory_budget {
                Some(budget) => unload_over_budget(&t, budget, BUDGET_MIN_IDLE),
                None => t.loaded_bytes(),
            };
            metrics::gauge!("strata_frontend_tenants_loaded").set(t.loaded_all().len() as f64);
            metrics::gauge!("strata_frontend_tenants_loaded_bytes").set(held as f64);
        }
        // The next catalogue change (not every record of shard 0: those are mostly other
        // tenants' writes), a request for a dormant tenant, or a second.
        tokio::select! {
            _ = system.replica.hub().reached(revision + 1, LOOK_AGAIN) => {}
            Some(name) = wakes.recv() => {
                let Some(t) = tenants.upgrade() else { return };
                // Loaded in its own task, several at once: many clients coming back at once
                // (a frontend restarted under a budget) do not wait for each other's loads.
                let record = woken_record(&t, &records, &loader.shards, &name);
                let (loader, loads) = (loader.clone(), loads.clone());
                tokio::spawn(async move {
                    let Ok(_permit) = loads.acquire_owned().await else { return };
                    wake(&t, record.as_ref(), &loader, &name).await;
                });
            }
        }
        if tenants.strong_count() == 0 {
            return;
        }
    }
}

/// Unloads the tenants of the catalogue idle for `idle` (`Tenants::unload_if_idle`).
fn unload_idle(tenants: &Tenants, idle: Duration) {
    let names: Vec<String> = tenants
        .loaded_all()
        .iter()
        .map(|t| t.name.clone())
        .collect();
    for name in names {
        if tenants.unload_if_idle(&name, idle) {
            tracing::info!(tenant = %name, idle = ?idle, "tenant idle: unloaded until a request names it");
            metrics::counter!("strata_frontend_tenants_unloaded_idle_total").increment(1);
        }
    }
}

/// Unloads idle tenants, least recently used first, while the tenants loaded hold more than
/// `budget` bytes; none a request named within `min_idle`, none with a stream open. Returns
/// the bytes the tenants loaded then hold.
fn unload_over_budget(tenants: &Tenants, budget: u64, min_idle: Duration) -> u64 {
    let mut held = tenants.loaded_bytes();
    if held <= budget {
        return held;
    }
    let mut idle: Vec<(Duration, Arc<Tenant>)> = tenants
        .loaded_all()
        .into_iter()
        .map(|t| (t.idle_for(), t))
        .filter(|(idle, _)| *idle >= min_idle)
        .collect();
    idle.sort_by_key(|(idle, _)| std::cmp::Reverse(*idle));
    for (_, t) in idle {
        if held <= budget {
            break;
        }
        let bytes = t.replica.read().stats().charged_bytes;
        let name = t.name.clone();
        drop(t);
        if tenants.unload_if_idle(&name, min_idle) {
            held = held.saturating_sub(bytes);
            tracing::info!(tenant = %name, bytes, budget, "over the memory budget: unloaded until a request names it");
            metrics::counter!("strata_frontend_tenants_unloaded_budget_total").increment(1);
        }
    }
    held
}

/// The record that serves dormant tenant `name` here, as the catalogue says now; None if it
/// no longer serves that generation here (the reconcile that saw the change loads a new
/// generation itself).
fn woken_record(
    tenants: &Tenants,
    records: &[TenantRecord],
    shards: &crate::config::ShardSet,
    name: &str,
) -> Option<TenantRecord> {
    let dormant_key = tenants.dormant(name)?;
    records
        .iter()
        .find(|r| {
            r.name == name
                && shards.contains(r.shard)
                && api::tenant::journal_key(&r.name, &r.uid) == dormant_key
                && served_of(r) != Served::Deleted
        })
        .cloned()
}

/// Loads dormant tenant `name` again for the request that named it, as `record` (the one
/// `woken_record` found) says; forgets it if there is none.
async fn wake(tenants: &Tenants, record: Option<&TenantRecord>, loader: &Loader, name: &str) {
    if tenants.dormant(name).is_none() {
        // Loaded (or forgotten) between the request's look and its wake: nothing to wait for.
        tenants.forget_waking(name);
        return;
    }
    let Some(r) = record else {
        tenants.forget_dormant(name);
        return;
    };
    match loader.load(r).await {
        Ok(t) => {
            if tenants.insert_woken(t) {
                tracing::info!(tenant = %name, "idle tenant loaded again for a request");
            } else {
                tracing::info!(tenant = %name, "tenant changed while it was loaded for a request: not served");
            }
        }
        Err(e) => {
            // The waiting request is answered Unavailable, which clients retry: it wakes the
            // tenant again.
            tracing::warn!(tenant = %name, error = %e, "cannot load an idle tenant again");
            tenants.forget_waking(name);
        }
    }
}

/// Serves what `records` say of this frontend's shards; false if a tenant could not be loaded
/// (tried again later).
#[cfg(test)]
async fn reconcile(tenants: &Tenants, records: &[TenantRecord], loader: &Loader) -> bool {
    let to_load = follow_states(tenants, records, loader);
    load_all(tenants, to_load, loader).await
}

/// What `records` say of the tenants loaded or dormant here (their state, quotas, deletion or
/// a new generation), done at once; returns the records of the tenants still to load.
fn follow_states<'r>(
    tenants: &Tenants,
    records: &'r [TenantRecord],
    loader: &Loader,
) -> Vec<&'r TenantRecord> {
    let mut to_load = Vec::new();
    for r in records.iter().filter(|r| loader.shards.contains(r.shard)) {
        let served = served_of(r);
        let quotas = r.quotas.unwrap_or_default();
        let follow = |t: &Tenant| {
            if t.served() != served {
                tracing::info!(tenant = %r.name, state = ?served, "catalogue changed a tenant's state");
                t.set_served(served);
            }
            t.set_quotas(quotas);
        };
        // A tenant this frontend was given (`--tenant`, `--tenants`) under the same name keeps
        // its own keyspace and follows the record's state and quotas.
        if let Some(t) = tenants.fixed(&r.name) {
            follow(&t);
            continue;
        }
        let key = api::tenant::journal_key(&r.name, &r.uid);
        // Unloaded while idle: loaded again by the next request naming it, unless the record
        // deleted it or created it again.
        if let Some(dormant) = tenants.dormant(&r.name) {
            if dormant == key && served != Served::Deleted {
                tenants.update_dormant(&r.name, &key, own_connections(r));
                continue;
            }
            tenants.forget_dormant(&r.name);
        }
        match tenants.loaded(&r.name) {
            // Deleted: unloaded (its memory goes); an undelete loads it again from its
            // checkpoint, which the compactor keeps until the retention is over.
            Some(t) if t.key == key && served == Served::Deleted => {
                tracing::info!(tenant = %r.name, key = %key, "tenant deleted: unloaded");
                tenants.unload(&r.name);
                continue;
            }
            Some(t) if t.key == key => {
                follow(&t);
                continue;
            }
            // A generation the record no longer names: unloaded, and replaced by the record's
            // below.
            Some(old) => {
                tracing::info!(tenant = %r.name, old = %old.key, new = %key, "tenant created again: a new generation");
                tenants.unload(&r.name);
            }
            None => {}
        }
        if served != Served::Deleted {
            to_load.push(r);
        }
    }
    to_load
}

/// Loads the tenants of `to_load`; false if one could not be loaded (tried again later).
async fn load_all(tenants: &Tenants, to_load: Vec<&TenantRecord>, loader: &Loader) -> bool {
    use futures::StreamExt;
    // Several at a time: a frontend starting with many tenants fetches their checkpoints in
    // parallel, each served as soon as it is loaded, and the next load starts as soon as any
    // ends (a large tenant holds up no small ones). Once the loaded tenants fill the memory
    // budget, the rest are served dormant: the first request naming one loads it.
    let mut all_loaded = true;
    // What the loaded tenants hold: summed over every replica at most every `RESUM_EVERY`
    // (before each load, that made a start with many tenants quadratic), and added to as each
    // load ends in between. A replica still replaying the journal grows after its load ends;
    // the next sum sees it.
    let mut held = 0;
    // What the loads in flight are expected to hold (`Loader::estimate`): counted against the
    // budget from their start, so that the loads begun at once go over it by one tenant at
    // most, as loads one after the other would.
    let mut reserved = 0;
    let mut summed_at: Option<std::time::Instant> = None;
    let mut waiting = to_load.into_iter();
    let mut loads = futures::stream::FuturesUnordered::new();
    loop {
        while loads.len() < LOADS_AT_ONCE {
            let Some(r) = waiting.next() else { break };
            if loader.memory_budget.is_some()
                && summed_at.is_none_or(|at| at.elapsed() >= RESUM_EVERY)
            {
                held = tenants.loaded_bytes();
                summed_at = Some(std::time::Instant::now());
            }
            if loader.budget_full(held + reserved) {
                let key = api::tenant::journal_key(&r.name, &r.uid);
                tracing::info!(tenant = %r.name, "memory budget full: tenant served unloaded until a request names it");
                tenants.add_dormant(&r.name, &key, own_connections(r));
                continue;
            }
            let estimate = match loader.memory_budget {
                Some(_) => loader.estimate(r).await,
                None => 0,
            };
            reserved += estimate;
            loads.push(loader.load_of(r, estimate));
        }
        let Some((r, estimate, loaded)) = loads.next().await else {
            break;
        };
        reserved -= estimate;
        match loaded {
            Ok(t) => {
                tracing::info!(tenant = %r.name, state = ?t.served(), "tenant loaded from the catalogue");
                if loader.memory_budget.is_some() {
                    held += t.replica.read().stats().charged_bytes;
                }
                tenants.insert_loaded(t);
            }
            Err(e) => {
                tracing::warn!(tenant = %r.name, error = %e, "cannot load a tenant of the catalogue; trying again");
                all_loaded = false;
            }
        }
    }
    all_loaded
}

/// The connection quota `r` gives its tenant (`Tenant::max_connections`), if any.
fn own_connections(r: &TenantRecord) -> Option<usize> {
    crate::tenant::connection_quota(&r.quotas.unwrap_or_default())
}

/// The tenants whose own part this frontend is appending to their shard.
type Syncing = Arc<std::sync::Mutex<std::collections::HashSet<String>>>;

/// What a catalogue record says that the tenant's own replicas enforce (quotas that change
/// state: stored bytes, leases; suspended or deleted: its writes refused) reaches them as a
/// `TenantChange` of the tenant's own key on its shard (`MemStore::tenant_own`). The admin
/// call that changed the record appends it before answering; wherever a caught-up replica
/// here still differs from its record, this appends it again, once at a time per tenant and
/// again at the next look if it did not land: so a change whose admin frontend died between
/// the two appends, or a record from before tenants had an own part, still reaches the
/// tenant. A replica whose own part comes from a newer record revision than this frontend's
/// catalogue has read is left alone (this frontend lags; the apply would refuse an older
/// record's change anyway). Several frontends may append the same record's part once each:
/// applying it twice changes nothing.
fn sync_own(
    tenants: &Tenants,
    records: &[TenantRecord],
    shards: &crate::config::ShardSet,
    syncing: &Syncing,
) {
    for r in records.iter().filter(|r| shards.contains(r.shard)) {
        let Some(t) = tenants.named(&r.name) else {
            continue;
        };
        if served_of(r) == Served::Deleted
            || t.replica.state() != crate::replica::ReplicaState::Ready
        {
            continue;
        }
        {
            let store = t.replica.read();
            let have = store.tenant_own();
            if have.revision > r.revision || api::tenant::own_agrees(have, r) {
                continue;
            }
        }
        let lock = |s: &Syncing| {
            s.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(r.name.clone())
        };
        if !lock(syncing) {
            continue;
        }
        let syncing = syncing.clone();
        let (change, revision) = (api::tenant::own_change(&t.key, r), r.revision);
        tokio::spawn(async move {
            let id = crate::rpc::RequestId::random();
            let caller = crate::auth::Caller::default();
            match t.propose(&id, &caller, change).await {
                Ok(a) if a.outcome == memstore::Outcome::Own => {
                    tracing::info!(tenant = %t.name, revision, "tenant's own part set on its shard");
                }
                Ok(a) => {
                    tracing::warn!(tenant = %t.name, outcome = ?a.outcome, "tenant's own part refused on its shard")
                }
                Err(e) => {
                    tracing::warn!(tenant = %t.name, error = %e, "cannot set the tenant's own part on its shard; trying again")
                }
            }
            syncing
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(&t.name);
        });
    }
}

fn served_of(r: &TenantRecord) -> Served {
    match TenantState::try_from(r.state) {
        Ok(TenantState::Suspended) => Served::Suspended,
        Ok(TenantState::Deleted) => Served::Deleted,
        _ => Served::Active,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::MemLog;
    use crate::tenant::{test_limits, test_tenant_named};

    fn record(name: &str, shard: u32, state: TenantState) -> TenantRecord {
        TenantRecord {
            name: name.into(),
            shard,
            state: state as i32,
            ..Default::default()
        }
    }

    /// Tenants following a catalogue over `log` (with `fixed` as the default tenant, if
    /// any), and the loader of shard 1's tenants.
    fn following(log: Arc<dyn Log>, fixed: Option<&str>) -> (Tenants, Loader) {
        let tenant = |name: &str| {
            let store = memstore::MemStore::new(memstore::Config::default());
            test_tenant_named(name, store, log.clone(), 1, 1)
        };
        let tenants = Tenants::serving(fixed.map(tenant), Vec::new(), true)
            .with_catalogue(tenant(api::tenant::SYSTEM_TENANT), watch::channel(0).1);
        let loader = Loader {
            shards: crate::config::ShardSet::Only([1].into()),
            checkpoints: None,
            log,
            limits: test_limits(),
            member_id: 1,
            idle_unload: None,
            memory_budget: None,
        };
        (tenants, loader)
    }

    /// `--catalogue-shards`: the tenants of the shards listed, or of every shard, each on its
    /// own shard.
    #[tokio::test]
    async fn the_tenants_of_every_shard_served_here_are_loaded_on_their_shards() {
        use crate::config::ShardSet;
        let records = [
            record("zero", 0, TenantState::Active),
            record("one", 1, TenantState::Active),
            record("two", 2, TenantState::Suspended),
        ];
        for (shards, want) in [
            (ShardSet::All, vec![("zero", 0), ("one", 1), ("two", 2)]),
            (ShardSet::Only([0, 2].into()), vec![("zero", 0), ("two", 2)]),
        ] {
            let (tenants, mut loader) = following(Arc::new(MemLog::new()), None);
            loader.shards = shards.clone();
            assert!(reconcile(&tenants, &records, &loader).await);
            let served: Vec<(String, u32)> = ["zero", "one", "two"]
                .iter()
                .filter_map(|n| tenants.named(n).map(|t| (t.name.clone(), t.shard)))
                .collect();
            let want: Vec<(String, u32)> = want.iter().map(|(n, s)| (n.to_string(), *s)).collect();
            assert_eq!(served, want, "{shards}");
        }
    }

    #[tokio::test]
    async fn the_tenants_of_this_shard_are_served_in_the_state_the_catalogue_says() {
        let (tenants, loader) = following(Arc::new(MemLog::new()), Some("fixed"));
        let records = [
            record("active", 1, TenantState::Active),
            record("paused", 1, TenantState::Suspended),
            record("gone", 1, TenantState::Deleted),
            record("elsewhere", 2, TenantState::Active),
            record("fixed", 1, TenantState::Suspended),
        ];
        assert!(reconcile(&tenants, &records, &loader).await);
        let state = |n: &str| tenants.named(n).map(|t| t.served());
        assert_eq!(state("active"), Some(Served::Active));
        assert_eq!(state("paused"), Some(Served::Suspended), "loaded suspended");
        assert_eq!(state("gone"), None, "a deleted tenant is not loaded");
        assert_eq!(state("elsewhere"), None, "another shard's tenant");
        assert_eq!(
            state("fixed"),
            Some(Served::Suspended),
            "a fixed tenant follows too"
        );
        assert_eq!(tenants.named("active").unwrap().shard, 1);
        // The catalogue itself is no tenant a client can name.
        assert!(tenants.named(api::tenant::SYSTEM_TENANT).is_none());

        // Deleted: unloaded, refused by whoever still holds it, its replica stopped; undeleted:
        // loaded again.
        let deleted = tenants.named("active").unwrap();
        let later = [
            record("active", 1, TenantState::Deleted),
            record("paused", 1, TenantState::Active),
        ];
        assert!(reconcile(&tenants, &later, &loader).await);
        assert_eq!(state("active"), None);
        assert_eq!(deleted.served(), Served::Deleted);
        assert!(deleted.replica.is_stopped());
        assert_eq!(state("paused"), Some(Served::Active));
        let undeleted = [record("active", 1, TenantState::Active)];
        assert!(reconcile(&tenants, &undeleted, &loader).await);
        assert_eq!(state("active"), Some(Served::Active));

        // The record's quotas replace the frontend's flags (none in this test) while non-zero.
        let limited = TenantRecord {
            quotas: Some(api::strata::entry::TenantQuotas {
                requests_per_second: 2,
                watchers: 3,
                ..Default::default()
            }),
            ..record("paused", 1, TenantState::Active)
        };
        assert!(reconcile(&tenants, std::slice::from_ref(&limited), &loader).await);
        let paused = tenants.named("paused").unwrap();
        assert_eq!(paused.max_watchers(), Some(3));
        let admitted = (0..10).filter(|_| paused.admit().is_ok()).count();
        assert_eq!(admitted, 2, "a burst of the rate, then refused");
        // The same quotas again keep the bucket: still empty.
        assert!(reconcile(&tenants, std::slice::from_ref(&limited), &loader).await);
        assert!(paused.admit().is_err());
        let unlimited = record("paused", 1, TenantState::Active);
        assert!(reconcile(&tenants, &[unlimited], &loader).await);
        assert_eq!(paused.max_watchers(), None);
        assert!((0..100).all(|_| paused.admit().is_ok()));
        let mut names = tenants.names();
        names.sort();
        assert_eq!(names, ["active", "fixed", "paused"]);

        // Deleted and created again: a new generation under another key replaces the old one,
        // which is refused from then on by whoever still holds it.
        let old = tenants.named("active").unwrap();
        let again = TenantRecord {
            uid: vec![7; 16],
            ..record("active", 1, TenantState::Active)
        };
        assert!(reconcile(&tenants, std::slice::from_ref(&again), &loader).await);
        let new = tenants.named("active").unwrap();
        assert_eq!(new.key, "active.0707070707070707");
        assert_eq!(new.served(), Served::Active);
        assert_eq!(old.served(), Served::Deleted);
        assert!(old.replica.is_stopped() && !new.replica.is_stopped());
        assert_ne!(new.identity.cluster_id, old.identity.cluster_id);
        // The fixed tenant keeps its own key, whatever the record's uid.
        let fixed = TenantRecord {
            uid: vec![9; 16],
            ..record("fixed", 1, TenantState::Active)
        };
        assert!(reconcile(&tenants, &[fixed], &loader).await);
        assert_eq!(tenants.named("fixed").unwrap().key, "fixed");
    }

    use api::etcdserverpb::{PutRequest, RangeRequest};
    use tonic::metadata::MetadataMap;

    fn naming(name: &str) -> MetadataMap {
        let mut m = MetadataMap::new();
        m.insert(crate::tenants::TENANT_HEADER, name.parse().unwrap());
        m
    }

    /// An idle tenant of the catalogue is unloaded (its store let go) unless a request named
    /// it lately or a stream of it is open; a request naming it then is answered as loading,
    /// wakes it, and once the follower loaded it again it has its keys. A dormant tenant the
    /// catalogue deletes is forgotten: not served, not woken.
    #[tokio::test]
    async fn idle_tenants_are_unloaded_and_woken_by_a_request() {
        let (tenants, loader) = following(Arc::new(MemLog::new()), None);
        let mut wakes = tenants.take_wakes().expect("the follower's");
        let records = [TenantRecord {
            name: "a".into(),
            shard: 1,
            ..Default::default()
        }];
        assert!(reconcile(&tenants, &records, &loader).await);
        let a = tenants.resolve(&naming("a")).unwrap();
        crate::tenant::until_ready(std::slice::from_ref(&a)).await;
        let put = PutRequest {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
            ..Default::default()
        };
        let id = crate::rpc::RequestId::random();
        let caller = crate::auth::Caller::default();
        use api::strata::entry::entry::Request as Intent;
        a.propose(&id, &caller, Intent::Put(put)).await.unwrap();
        let store = Arc::downgrade(a.replica.store());

        let short = Duration::from_millis(20);
        assert!(!tenants.unload_if_idle("a", Duration::from_secs(3600)));
        let stream = a.refusal(false);
        tokio::time::sleep(short * 2).await;
        assert!(
            !tenants.unload_if_idle("a", short),
            "a tenant with an open stream is not idle"
        );
        drop(stream);
        tokio::time::sleep(short * 2).await;
        tenants.resolve(&naming("a")).unwrap();
        assert!(
            !tenants.unload_if_idle("a", short),
            "a request just named it"
        );
        tokio::time::sleep(short * 2).await;
        assert!(tenants.unload_if_idle("a", short));
        assert!(a.replica.is_stopped());
        drop(a);
        assert!(tenants.named("a").is_none());
        assert_eq!(
            tenants.names(),
            ["a"],
            "still served: a certificate may name it"
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while store.strong_count() > 0 {
            assert!(tokio::time::Instant::now() < deadline, "the store is kept");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }

        // Named again: loading (Unavailable, which clients retry), and woken once.
        for _ in 0..2 {
            let e = tenants.resolve(&naming("a")).err().unwrap();
            assert!(matches!(e, crate::errors::Error::Loading(_)), "{e:?}");
            assert_eq!(tonic::Status::from(e).code(), tonic::Code::Unavailable);
        }
        assert_eq!(wakes.recv().await.as_deref(), Some("a"));
        assert!(wakes.try_recv().is_err(), "woken once");
        let woken = woken_record(&tenants, &records, &loader.shards, "a");
        wake(&tenants, woken.as_ref(), &loader, "a").await;
        let a = tenants.resolve(&naming("a")).expect("loaded again");
        crate::tenant::until_ready(std::slice::from_ref(&a)).await;
        let got = a
            .replica
            .read()
            .range(&RangeRequest {
                key: b"k".to_vec(),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(got.kvs[0].value, b"v", "its keys are back");

        // Dormant, then deleted: forgotten.
        tokio::time::sleep(short * 2).await;
        drop(a);
        assert!(tenants.unload_if_idle("a", short));
        let deleted = [TenantRecord {
            state: TenantState::Deleted as i32,
            ..records[0].clone()
        }];
        assert!(reconcile(&tenants, &deleted, &loader).await);
        assert!(tenants.names().is_empty());
        assert!(matches!(
            tenants.resolve(&naming("a")),
            Err(crate::errors::Error::UnknownTenant(_))
        ));
    }

    /// Puts `value` under `key` in `t` through its journal, as a request would.
    async fn put(t: &Tenant, key: &str, value: &[u8]) {
        use api::strata::entry::entry::Request as Intent;
        let put = PutRequest {
            key: key.as_bytes().to_vec(),
            value: value.to_vec(),
            ..Default::default()
        };
        let id = crate::rpc::RequestId::random();
        t.propose(&id, &crate::auth::Caller::default(), Intent::Put(put))
            .await
            .unwrap();
    }

    /// Where a replica's own part differs from its record (a resume whose admin frontend died
    /// before appending it, a record from before own parts), the follower appends the record's;
    /// where the replica's comes from a newer record than this frontend has read, it leaves it.
    #[tokio::test]
    async fn the_follower_brings_a_replica_s_own_part_to_its_record_but_never_back() {
        let log = Arc::new(MemLog::new());
        let (tenants, loader) = following(log.clone(), None);
        let at = |revision, state| TenantRecord {
            revision,
            ..record("p", 1, state)
        };
        assert!(reconcile(&tenants, &[at(5, TenantState::Active)], &loader).await);
        let t = tenants.named("p").unwrap();
        crate::tenant::until_ready(std::slice::from_ref(&t)).await;
        let syncing = Syncing::default();
        let own = |t: &Tenant| t.replica.read().tenant_own().clone();
        // Suspended by the admin call of revision 7 on another frontend.
        let id = crate::rpc::RequestId::random();
        let caller = crate::auth::Caller::default();
        let suspended = api::tenant::own_change(&t.key, &at(7, TenantState::Suspended));
        let a = t.propose(&id, &caller, suspended).await.unwrap();
        assert_eq!(a.outcome, memstore::Outcome::Own);
        // Syncs the record `at` gives and says whether anything was appended within 50 ms.
        let appends = async |record: TenantRecord| {
            let before = log.last_index();
            sync_own(&tenants, &[record], &loader.shards, &syncing);
            tokio::time::sleep(Duration::from_millis(50)).await;
            log.last_index() != before
        };
        // This frontend's catalogue is still at revision 5: nothing is appended.
        assert!(
            !appends(at(5, TenantState::Active)).await,
            "a lagging frontend appended"
        );
        assert!(own(&t).suspended);
        // Resumed at revision 9, but the admin frontend died before appending that: healed.
        let _ = appends(at(9, TenantState::Active)).await; // (waited for below)
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while own(&t).revision != 9 {
            assert!(tokio::time::Instant::now() < deadline, "never healed");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(!own(&t).suspended);
        put(&t, "k", b"v").await;
        let got = t.replica.read().range(&RangeRequest {
            key: b"k".to_vec(),
            ..Default::default()
        });
        assert_eq!(got.unwrap().kvs.len(), 1, "written again");
        // In step: nothing more is appended.
        assert!(!appends(at(9, TenantState::Active)).await);

        // A tenant served by flag is journalled under its name, whatever the record's uid.
        let (tenants, loader) = following(log.clone(), Some("fixed"));
        let fixed = tenants.fixed("fixed").unwrap();
        crate::tenant::until_ready(std::slice::from_ref(&fixed)).await;
        let record = TenantRecord {
            uid: vec![3; 16],
            revision: 4,
            ..record("fixed", 1, TenantState::Suspended)
        };
        sync_own(&tenants, &[record], &loader.shards, &syncing);
        while !own(&fixed).suspended {
            assert!(tokio::time::Instant::now() < deadline, "never synced");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn records_of(names: &[&str]) -> Vec<TenantRecord> {
        names
            .iter()
            .map(|n| record(n, 1, TenantState::Active))
            .collect()
    }

    /// Over the budget, idle tenants are unloaded least recently used first, only as many as
    /// bring the loaded bytes under it; a tenant named lately or with a stream open stays.
    #[tokio::test]
    async fn over_the_memory_budget_the_least_recently_used_idle_tenants_are_unloaded() {
        let (tenants, loader) = following(Arc::new(MemLog::new()), None);
        let tenants = Arc::new(tenants);
        let mut records = records_of(&["a", "b", "c"]);
        records[0].quotas = Some(api::strata::entry::TenantQuotas {
            connections: 2,
            ..Default::default()
        });
        assert!(reconcile(&tenants, &records, &loader).await);
        let short = Duration::from_millis(20);
        // Used in the order a, b, c, each some time after the other.
        for name in ["a", "b", "c"] {
            let t = tenants.resolve(&naming(name)).unwrap();
            crate::tenant::until_ready(std::slice::from_ref(&t)).await;
            put(&t, "k", &[b'v'; 1000]).await;
            tokio::time::sleep(short * 2).await;
        }
        let held = tenants.loaded_bytes();
        assert!(held >= 3000, "{held}");
        let loaded = |n: &str| tenants.loaded(n).is_some();

        unload_over_budget(&tenants, held, short);
        assert!(
            loaded("a") && loaded("b") && loaded("c"),
            "within the budget"
        );
        let after = unload_over_budget(&tenants, held - 1, short);
        assert_eq!(
            after,
            tenants.loaded_bytes(),
            "what it returns is what is held"
        );
        assert!(!loaded("a"), "the least recently used goes first");
        assert!(loaded("b") && loaded("c"), "and no more than needed");
        assert_eq!(
            tenants.dormant("a"),
            Some(api::tenant::journal_key("a", &[]))
        );
        assert!(tenants.loaded_bytes() < held);
        use crate::tls::Directory;
        assert_eq!(
            Arc::downgrade(&tenants).max_connections("a"),
            Some(2),
            "its own connection quota holds while it sleeps"
        );

        // b has a stream open, c was named just now: neither goes, however full the budget.
        let b = tenants.loaded("b").unwrap();
        let stream = b.refusal(false);
        tenants.resolve(&naming("c")).unwrap();
        unload_over_budget(&tenants, 0, Duration::from_secs(5));
        assert!(loaded("b") && loaded("c"));
        tokio::time::sleep(short * 2).await;
        unload_over_budget(&tenants, 0, short);
        assert!(loaded("b"), "a tenant with an open stream stays");
        assert!(!loaded("c"), "idle long enough now");
        drop(stream);
        tokio::time::sleep(short * 2).await;
        unload_over_budget(&tenants, 0, short);
        assert!(!loaded("b"));
        assert_eq!(tenants.loaded_bytes(), 0);
        let mut names = tenants.names();
        names.sort();
        assert_eq!(names, ["a", "b", "c"], "all still served");
    }

    /// A start under the memory budget counts each load against it from the load's start, by
    /// its newest checkpoint's size: the loads begun at once (`LOADS_AT_ONCE`) take it over by
    /// one tenant at most, as loads one after the other would.
    #[tokio::test]
    async fn loads_begun_at_once_count_against_the_budget_from_their_start() {
        use crate::checkpoint::fixtures::{manifest_of, publish_of};
        use api::strata::entry::entry::Request;
        let (tenants, mut loader) = following(Arc::new(MemLog::new()), None);
        let objects =
            crate::checkpoint::Store::from(Arc::new(object_store::memory::InMemory::new()));
        let names = ["a", "b", "c", "d", "e", "f"];
        let mut size = 0;
        for name in names {
            let key = api::tenant::journal_key(name, &[]);
            let mut mem = memstore::MemStore::new(memstore::Config::default());
            for i in 1..=20u64 {
                let put = api::strata::entry::Entry {
                    format_version: api::ENTRY_FORMAT_VERSION,
                    tenant: key.clone(),
                    time_ms: i as i64,
                    request: Some(Request::Put(api::etcdserverpb::PutRequest {
                        key: format!("k{i}").into_bytes(),
                        value: vec![b'v'; 1000],
                        ..Default::default()
                    })),
                    ..Default::default()
                };
                mem.apply(i, &put);
            }
            let r = publish_of(&objects, &key, 1, &mem, false).await;
            size = r.size;
            manifest_of(&objects, &key, 1, 1, vec![r]).await;
        }
        assert!(size > 20_000, "{size}");
        let budget = size * 5 / 2;
        loader.checkpoints = Some(objects);
        loader.memory_budget = Some(budget);
        assert!(reconcile(&tenants, &records_of(&names), &loader).await);
        let loaded: Vec<&str> = names
            .into_iter()
            .filter(|n| tenants.loaded(n).is_some())
            .collect();
        assert_eq!(
            loaded,
            ["a", "b", "c"],
            "two leave room under the budget, the third takes it over"
        );
        for name in ["d", "e", "f"] {
            assert_eq!(
                tenants.dormant(name),
                Some(api::tenant::journal_key(name, &[]))
            );
        }
        let held = tenants.loaded_bytes();
        assert!(
            held > size * 2 && held < budget + size,
            "{held} of {budget}"
        );
    }

    /// With the budget full, tenants the catalogue names are served without being loaded (their
    /// own connection quota enforced all the same); a request wakes one and it is loaded. A
    /// tenant deleted while it was being loaded for a request is not served.
    #[tokio::test]
    async fn with_the_budget_full_further_tenants_are_served_unloaded_until_a_request() {
        let (tenants, mut loader) = following(Arc::new(MemLog::new()), Some("fixed"));
        let tenants = Arc::new(tenants);
        let fixed = tenants.fixed("fixed").unwrap();
        crate::tenant::until_ready(std::slice::from_ref(&fixed)).await;
        put(&fixed, "k", b"fills the budget").await;
        loader.memory_budget = Some(tenants.loaded_bytes() + 1);
        let mut records = records_of(&["first"]);
        assert!(reconcile(&tenants, &records, &loader).await);
        let first = tenants
            .loaded("first")
            .expect("loaded: the budget had room");
        crate::tenant::until_ready(std::slice::from_ref(&first)).await;
        put(&first, "k", b"and now it is full").await;

        records.extend(records_of(&["p", "q", "r", "s", "t"]));
        records[1].quotas = Some(api::strata::entry::TenantQuotas {
            connections: 3,
            ..Default::default()
        });
        assert!(reconcile(&tenants, &records, &loader).await);
        for name in ["p", "q", "r", "s", "t"] {
            assert!(tenants.loaded(name).is_none(), "{name} loaded");
            assert_eq!(
                tenants.dormant(name),
                Some(api::tenant::journal_key(name, &[]))
            );
        }
        let mut names = tenants.names();
        names.sort();
        assert_eq!(names, ["first", "fixed", "p", "q", "r", "s", "t"]);
        use crate::tls::Directory;
        let directory = Arc::downgrade(&tenants);
        assert_eq!(directory.max_connections("p"), Some(3), "p's own quota");
        assert_eq!(directory.max_connections("r"), None);
        // A record's change reaches a sleeping tenant.
        let mut raised = records.clone();
        raised[3].quotas = Some(api::strata::entry::TenantQuotas {
            connections: 5,
            ..Default::default()
        });
        assert!(reconcile(&tenants, &raised, &loader).await);
        assert_eq!(directory.max_connections("r"), Some(5));
        assert!(tenants.loaded("r").is_none(), "and it sleeps on");

        // A request wakes p; the follower loads it.
        let e = tenants.resolve(&naming("p")).err().unwrap();
        assert!(matches!(e, crate::errors::Error::Loading(_)), "{e:?}");
        let woken = woken_record(&tenants, &records, &loader.shards, "p");
        wake(&tenants, woken.as_ref(), &loader, "p").await;
        let p = tenants
            .resolve(&naming("p"))
            .expect("loaded for the request");
        crate::tenant::until_ready(std::slice::from_ref(&p)).await;

        // q is deleted while it is being loaded for a request: not served.
        tenants.resolve(&naming("q")).err().unwrap();
        let woken = woken_record(&tenants, &records, &loader.shards, "q").expect("q's record");
        let mut deleted = records.clone();
        deleted[2].state = TenantState::Deleted as i32;
        assert!(reconcile(&tenants, &deleted, &loader).await);
        let t = loader.load(&woken).await.unwrap();
        assert!(!tenants.insert_woken(t.clone()));
        assert!(t.replica.is_stopped());
        assert!(matches!(
            tenants.resolve(&naming("q")),
            Err(crate::errors::Error::UnknownTenant(_))
        ));
    }

    /// A request for a dormant tenant waits for that tenant's load, not for another's that is
    /// slow (here: never comes).
    #[tokio::test(start_paused = true)]
    async fn a_request_for_a_dormant_tenant_waits_for_its_own_load_only() {
        let (tenants, loader) = following(Arc::new(MemLog::new()), None);
        let tenants = Arc::new(tenants);
        let records = records_of(&["a", "b"]);
        for r in &records {
            tenants.add_dormant(&r.name, &api::tenant::journal_key(&r.name, &r.uid), None);
        }
        // Served as the caught-up catalogue says (else a request waits for that first).
        tenants.set_followed(i64::MAX, true);
        let mut wakes = tenants.take_wakes().expect("the follower's");
        assert!(matches!(
            tenants.resolve(&naming("b")),
            Err(crate::errors::Error::Loading(_))
        ));
        assert_eq!(wakes.recv().await.as_deref(), Some("b"));
        // The follower loads the next tenant woken, and never b.
        let follower = {
            let tenants = tenants.clone();
            tokio::spawn(async move {
                let name = wakes.recv().await.expect("a wake");
                let record = woken_record(&tenants, &records, &loader.shards, &name);
                wake(&tenants, record.as_ref(), &loader, &name).await;
                name
            })
        };
        let started = tokio::time::Instant::now();
        let a = tenants
            .waiting_for(&naming("a"), Tenants::resolve)
            .await
            .expect("loaded for the request");
        assert_eq!(a.name, "a");
        assert!(
            started.elapsed() < crate::tenants::CATCH_UP_WAIT,
            "waited {:?}: for b's load too",
            started.elapsed()
        );
        assert_eq!(follower.await.unwrap(), "a");
        assert!(tenants.loaded("b").is_none());
    }
}
