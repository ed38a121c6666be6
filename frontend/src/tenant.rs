//! One served tenant: its replica, its batched writer and shared read-index rounds, and the two
//! paths every RPC takes: `propose` (a write journalled as an intent, answered with the outcome
//! this frontend's replica computed) and `barrier` (a linearizable read point).

use std::sync::Arc;
use std::time::Duration;

use api::ENTRY_FORMAT_VERSION;
use api::etcdserverpb::ResponseHeader;
use api::strata::entry::{Entry, entry::Request};
use memstore::{Applied, MemStore, Outcome};

use crate::auth::Caller;
use crate::errors::Error;
use crate::log::Log;
use crate::read_index::ReadIndexer;
use crate::replica::{Replica, ReplicaState};
use crate::rpc::RequestId;
use crate::writer::Writer;

/// How long a write may take from append to applied, and a linearizable read from read index to
/// applied, before the client gets etcd's "request timed out" (etcd: 5 s + 2 election timeouts;
/// longer here because a noisy journal node may retry an append across a leader change).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// How long a write waited, after the journal answered its append, for this replica's outcome
/// (zero when the replica had applied it first).
pub const APPLY_WAIT_SECONDS: &str = "strata_frontend_apply_wait_seconds";

/// Limits enforced at the edge, before anything reaches the journal.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_request_bytes: usize,
    pub max_txn_ops: usize,
    /// Journal silence after which the tenant has "no leader" (see `Tenant::has_leader`).
    pub no_leader_after: Duration,
    /// Requests a second the tenant may send this frontend (0: no limit), and at once.
    pub request_rate: u32,
    pub request_burst: u32,
    /// Most watchers the tenant may have on this frontend.
    pub max_watchers: Option<usize>,
}

/// Identity reported in response headers.
#[derive(Debug, Clone, Copy)]
pub struct Identity {
    pub cluster_id: u64,
    pub member_id: u64,
}

impl Identity {
    /// This frontend (`member_id`) as a member of the tenant journalled under `key`: each
    /// tenant, and each generation of one, is its own etcd cluster to its clients.
    pub fn of(key: &str, member_id: u64) -> Self {
        Self {
            cluster_id: crate::config::stable_id(&format!("strata/{key}")),
            member_id,
        }
    }
}

/// What the catalogue says of a tenant this frontend serves (`Tenant::served`), or the
/// tenant's own change its replica applied (`Replica::own_served`); ordered from the least
/// refused to the most.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Served {
    Active = 0,
    /// Every RPC but Status and Snapshot is refused.
    Suspended = 1,
    /// Refused as a tenant this frontend does not serve (and unloaded by the catalogue
    /// follower, `Tenants::unload`).
    Deleted = 2,
}

impl Served {
    /// The state an atomic holds as `s as u8`.
    pub fn from_u8(v: u8) -> Self {
        match v {
            1 => Served::Suspended,
            2 => Served::Deleted,
            _ => Served::Active,
        }
    }

    /// What a request of tenant `name` gets in this state (`even_suspended`: Status and
    /// Snapshot, which the owner of a suspended tenant may still use).
    fn check(self, name: &str, even_suspended: bool) -> Result<(), Error> {
        match self {
            Served::Active => Ok(()),
            Served::Suspended if even_suspended => Ok(()),
            Served::Suspended => Err(Error::Suspended(name.to_string())),
            Served::Deleted => Err(Error::UnknownTenant(name.to_string())),
        }
    }
}

/// Waits for a tenant to stop being served (`Tenant::refusal`): a stream opened while it was
/// served ends with the error a new request would get, as soon as the catalogue suspends or
/// deletes it, so a suspended tenant's watches stop delivering and an unloaded tenant's store
/// is not kept alive by its streams. Held for the stream's life, it also counts the stream
/// as a use of the tenant: a tenant with an open stream is never idle (`Tenant::idle_for`).
pub struct Refusal {
    name: String,
    even_suspended: bool,
    states: tokio::sync::watch::Receiver<Served>,
    /// The tenant's own state as its replica applied it (`Replica::subscribe_own`).
    own: tokio::sync::watch::Receiver<Served>,
    _open: OpenStream,
}

/// One open stream of a tenant, counted until dropped.
struct OpenStream(Arc<std::sync::atomic::AtomicUsize>);

impl OpenStream {
    fn new(count: &Arc<std::sync::atomic::AtomicUsize>) -> Self {
        count.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Self(count.clone())
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Milliseconds since the process's first call, a clock for `Tenant::touch` that fits an
/// atomic.
fn now_ms() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let start = *START.get_or_init(std::time::Instant::now);
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
}

impl Refusal {
    /// Resolves with the refusal once the tenant's state refuses what the stream does: as the
    /// catalogue says it, or as the tenant's replica applied it (whichever says so first, as
    /// for `Tenant::check_served`).
    pub async fn wait(&mut self) -> Error {
        loop {
            let state = (*self.states.borrow_and_update()).max(*self.own.borrow_and_update());
            if let Err(e) = state.check(&self.name, self.even_suspended) {
                return e;
            }
            let changed = tokio::select! {
                c = self.states.changed() => c,
                c = self.own.changed() => c,
            };
            if changed.is_err() {
                // The tenant itself is gone.
                return Error::UnknownTenant(self.name.clone());
            }
        }
    }
}

/// The connection quota `quotas` give a tenant of their own (0: none, so the flag's applies).
pub fn connection_quota(quotas: &api::strata::entry::TenantQuotas) -> Option<usize> {
    (quotas.connections > 0).then(|| usize::try_from(quotas.connections).unwrap_or(usize::MAX))
}

pub struct Tenant {
    /// The name clients know it by (resolution, errors, logs and metrics).
    pub name: String,
    /// What it is journalled, replicated, checkpointed and signed under: its name, or for a
    /// tenant of the catalogue its generation's key (`api::tenant::journal_key`).
    pub key: String,
    pub shard: u32,
    pub replica: Arc<Replica>,
    pub limits: Limits,
    pub identity: Identity,
    writer: Writer,
    reads: ReadIndexer,
    /// `limits.request_rate`, if any.
    rate: Option<crate::quota::RateLimit>,
    /// [`APPLY_WAIT_SECONDS`], resolved once: a write records into it without a registry lookup.
    apply_wait: metrics::Histogram,
    /// A [`Served`], set by the catalogue follower (`crate::catalogue`): read by every request.
    served: std::sync::atomic::AtomicU8,
    /// The same, for the streams that end when it refuses them ([`Refusal`]).
    served_changes: tokio::sync::watch::Sender<Served>,
    /// When a request last named it (`now_ms`), and how many streams it has open: what
    /// decides that a tenant of the catalogue is idle and may be unloaded.
    last_used: std::sync::atomic::AtomicU64,
    open_streams: Arc<std::sync::atomic::AtomicUsize>,
    /// Whether the catalogue gives this tenant quotas of its own (`quotas`): requests look
    /// at them only then, so a tenant without any pays no lock.
    own_quotas: std::sync::atomic::AtomicBool,
    quotas: std::sync::RwLock<OwnQuotas>,
}

/// The quotas the catalogue's record of a tenant carries, as this frontend enforces them: each
/// non-zero one replaces the frontend's flag, per frontend as the flags are.
#[derive(Debug, Default)]
struct OwnQuotas {
    quotas: api::strata::entry::TenantQuotas,
    rate: Option<crate::quota::RateLimit>,
}

impl Tenant {
    /// Starts the replica of tenant `name`, journalled under `key` (its name, or a catalogue
    /// tenant's generation), tailing from `store`'s applied index and reloading from
    /// `checkpoints` if the journal is trimmed past it, and its writer and read-index driver.
    #[allow(clippy::too_many_arguments)] // each is one thing a tenant is made of
    pub fn start(
        name: &str,
        key: &str,
        shard: u32,
        store: MemStore,
        checkpoints: Option<crate::checkpoint::Store>,
        log: Arc<dyn Log>,
        limits: Limits,
        identity: Identity,
    ) -> Arc<Self> {
        let replica = Replica::with_checkpoints(key, shard, store, checkpoints);
        tokio::spawn(replica.clone().run(log.clone()));
        Arc::new(Self {
            name: name.to_string(),
            key: key.to_string(),
            shard,
            replica,
            limits,
            identity,
            writer: Writer::spawn(log.clone(), shard),
            reads: ReadIndexer::spawn(log, shard),
            rate: crate::quota::RateLimit::new(limits.request_rate, limits.request_burst),
            apply_wait: metrics::histogram!(APPLY_WAIT_SECONDS),
            served: std::sync::atomic::AtomicU8::new(Served::Active as u8),
            served_changes: tokio::sync::watch::Sender::new(Served::Active),
            last_used: std::sync::atomic::AtomicU64::new(now_ms()),
            open_streams: Arc::default(),
            own_quotas: std::sync::atomic::AtomicBool::new(false),
            quotas: std::sync::RwLock::default(),
        })
    }

    /// Enforces `q`, the catalogue's quotas of this tenant, from now on (a request rate that
    /// did not change keeps its bucket).
    pub fn set_quotas(&self, q: api::strata::entry::TenantQuotas) {
        let mut own = self
            .quotas
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if own.quotas == q {
            return;
        }
        if own.quotas.requests_per_second != q.requests_per_second {
            let rate = u32::try_from(q.requests_per_second.max(0)).unwrap_or(u32::MAX);
            own.rate = crate::quota::RateLimit::new(rate, self.limits.request_burst);
        }
        own.quotas = q;
        self.own_quotas.store(
            q != api::strata::entry::TenantQuotas::default(),
            std::sync::atomic::Ordering::Release,
        );
    }

    /// Most watchers the tenant may have on this frontend: the catalogue's quota, else
    /// `--tenant-max-watchers`.
    pub fn max_watchers(&self) -> Option<usize> {
        if self.own_quotas.load(std::sync::atomic::Ordering::Acquire) {
            let own = self
                .quotas
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if own.quotas.watchers > 0 {
                return usize::try_from(own.quotas.watchers).ok();
            }
        }
        self.limits.max_watchers
    }

    /// Most connections the tenant may hold open to this frontend, if the catalogue gives it
    /// a quota of its own (else `--tenant-max-connections`, which the client port applies).
    pub fn max_connections(&self) -> Option<usize> {
        if !self.own_quotas.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        let own = self
            .quotas
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        connection_quota(&own.quotas)
    }

    /// What the catalogue says of this tenant (Active when no catalogue is followed).
    pub fn served(&self) -> Served {
        Served::from_u8(self.served.load(std::sync::atomic::Ordering::Acquire))
    }

    pub fn set_served(&self, s: Served) {
        self.served
            .store(s as u8, std::sync::atomic::Ordering::Release);
        self.served_changes.send_if_modified(|now| {
            let changed = *now != s;
            *now = s;
            changed
        });
    }

    /// Refuses a suspended or deleted tenant's request (`even_suspended`: Status and Snapshot,
    /// which the owner of a suspended tenant may still use): suspended or deleted by the
    /// catalogue as this frontend follows it, or by the tenant's own change its replica
    /// applied (which a frontend whose catalogue lags may have first).
    pub fn check_served(&self, even_suspended: bool) -> Result<(), Error> {
        self.served()
            .max(self.replica.own_served())
            .check(&self.name, even_suspended)
    }

    /// What a stream of this tenant waits on to end when the tenant stops being served
    /// (watches and lease keep-alives: `even_suspended` false).
    pub fn refusal(&self, even_suspended: bool) -> Refusal {
        Refusal {
            name: self.name.clone(),
            even_suspended,
            states: self.served_changes.subscribe(),
            own: self.replica.subscribe_own(),
            _open: OpenStream::new(&self.open_streams),
        }
    }

    /// Records that a request named this tenant now.
    pub fn touch(&self) {
        self.last_used
            .store(now_ms(), std::sync::atomic::Ordering::Relaxed);
    }

    /// How long no request named this tenant and no stream of it was open: zero while a stream
    /// is open.
    pub fn idle_for(&self) -> Duration {
        if self.open_streams.load(std::sync::atomic::Ordering::Acquire) > 0 {
            return Duration::ZERO;
        }
        let last = self.last_used.load(std::sync::atomic::Ordering::Relaxed);
        Duration::from_millis(now_ms().saturating_sub(last))
    }

    /// A response header at `revision`.
    pub fn header(&self, revision: i64) -> ResponseHeader {
        ResponseHeader {
            cluster_id: self.identity.cluster_id,
            member_id: self.identity.member_id,
            revision,
            raft_term: self.replica.term(),
        }
    }

    /// Admits one request under the tenant's request rate (`--tenant-request-rate`), or refuses
    /// it with etcd's "too many requests".
    pub fn admit(&self) -> Result<(), Error> {
        if self.own_quotas.load(std::sync::atomic::Ordering::Acquire) {
            let own = self
                .quotas
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(rate) = &own.rate {
                return self.charge(rate);
            }
        }
        match &self.rate {
            Some(rate) => self.charge(rate),
            None => Ok(()),
        }
    }

    /// One request against `rate`.
    fn charge(&self, rate: &crate::quota::RateLimit) -> Result<(), Error> {
        if rate.try_acquire() {
            return Ok(());
        }
        metrics::counter!("strata_frontend_requests_limited_total", "tenant" => self.name.clone())
            .increment(1);
        Err(Error::TooManyRequests)
    }

    /// Refuses requests larger than `--max-request-bytes` (etcd checks the proposal's size).
    pub fn check_size(&self, size: usize) -> Result<(), Error> {
        if size > self.limits.max_request_bytes {
            return Err(Error::RequestTooLarge {
                size,
                limit: self.limits.max_request_bytes,
            });
        }
        Ok(())
    }

    fn check_replica(&self) -> Result<(), Error> {
        if let ReplicaState::Failed(reason) = self.replica.state() {
            return Err(Error::ReplicaFailed(reason));
        }
        Ok(())
    }

    /// etcd's "has a leader", for streams opened with its `hasleader` metadata (clientv3's lease
    /// keep-alives, kube-apiserver's and etcdctl's watches): false once the replica has heard
    /// nothing from the journal (not even an idle tick) for `no_leader_after`. etcd then ends
    /// such streams with "etcdserver: no leader" and refuses new ones, so clients move to a
    /// member that can serve them.
    pub fn has_leader(&self) -> bool {
        self.replica
            .journal_heard_within(self.limits.no_leader_after)
    }

    /// Waits until the replica reflects every write committed before this call (shared
    /// read-index round, then wait for apply), under one deadline: a timer is armed only if
    /// the read has to wait at all, and then one, not one per step.
    pub async fn barrier(&self) -> Result<(), Error> {
        self.barrier_after(None).await
    }

    /// `barrier` for a linearizable read of the tenant's own clients: refused after it if the
    /// replica has by then applied the tenant's suspension or deletion. An admin call that
    /// answered before the read began appended that below the read point, so such a read is
    /// as strict as a write, on every frontend, one whose catalogue lags included.
    pub async fn read_point(&self) -> Result<(), Error> {
        self.barrier().await?;
        self.replica.own_served().check(&self.name, false)
    }

    /// `barrier` with the read index of the tenant's shard already known (`/health` takes one
    /// per shard, not one per tenant).
    pub async fn barrier_at(&self, index: u64) -> Result<(), Error> {
        self.barrier_after(Some(index)).await
    }

    /// The journal's read index of the tenant's shard: every entry committed before this call
    /// is at or below it.
    pub async fn read_index(&self) -> Result<u64, Error> {
        tokio::time::timeout(REQUEST_TIMEOUT, self.reads.read_index())
            .await
            .map_err(|_| Error::Timeout { index: 0 })?
            .map_err(Error::from)
    }

    async fn barrier_after(&self, known: Option<u64>) -> Result<(), Error> {
        self.check_replica()?;
        let mut index = known.unwrap_or(0);
        let waited = tokio::time::timeout(REQUEST_TIMEOUT, async {
            if known.is_none() {
                index = self.reads.read_index().await?;
            }
            Ok::<bool, Error>(self.replica.until_applied(index).await)
        })
        .await;
        match waited {
            Ok(Ok(true)) => Ok(()),
            Ok(Err(e)) => Err(e),
            Ok(Ok(false)) | Err(_) => {
                self.check_replica()?;
                Err(Error::Timeout { index })
            }
        }
    }

    /// Journals `request`, sent by `caller`, as an intent and answers the outcome this replica
    /// computed for it. With the tenant's auth enabled the request's permissions are checked
    /// against the replica first (a denied request costs no entry), and again where it counts:
    /// when every replica applies it.
    pub async fn propose(
        &self,
        id: &RequestId,
        caller: &Caller,
        request: Request,
    ) -> Result<Applied, Error> {
        self.check_replica()?;
        if self.replica.auth_enabled() {
            self.replica
                .read()
                .check_request(caller.as_store(), &request)?;
        }
        let entry = Entry {
            format_version: ENTRY_FORMAT_VERSION,
            tenant: self.key.clone(),
            request_id: id.bytes().to_vec(),
            time_ms: 0,
            request: Some(request),
            user: caller.user.clone(),
            auth_revision: caller.revision,
        };
        let payload = api::record::encode_entry(&entry);
        // Registered before the append, so the outcome cannot slip past us.
        let mut pending = self.replica.expect(id.bytes());
        // One deadline from append to applied (one timer per write, not one per step).
        let mut index = 0;
        let answered = tokio::time::timeout(REQUEST_TIMEOUT, async {
            index = self.writer.append(payload).await?;
            let appended = std::time::Instant::now();
            let applied = pending.outcome().await.map_err(|_| Error::Stopped)?;
            self.apply_wait.record(appended.elapsed().as_secs_f64());
            Ok::<Applied, Error>(applied)
        })
        .await;
        let applied = match answered {
            Ok(Ok(applied)) => applied,
            // The entry may have been applied all the same (an append whose commit the journal
            // client could not confirm, an outcome at the deadline): then that is the answer.
            Ok(Err(e)) => pending.arrived().ok_or(e)?,
            Err(_) => match pending.arrived() {
                Some(applied) => applied,
                None => {
                    self.check_replica()?;
                    return Err(Error::Timeout { index });
                }
            },
        };
        // A writer gets `Duplicate` only when a checkpoint reload covered its entry (it is
        // registered before its append, so a first apply answers it): applied, outcome gone.
        match applied.outcome {
            Outcome::Duplicate { revision } => Err(Error::OutcomeUnknown { revision }),
            _ => Ok(applied),
        }
    }
}

/// Waits (at most 10 s, else panics) until every replica of `tenants` caught up (unit tests).
#[cfg(test)]
pub async fn until_ready(tenants: &[Arc<Tenant>]) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tenants
        .iter()
        .any(|t| t.replica.state() != ReplicaState::Ready)
    {
        assert!(tokio::time::Instant::now() < deadline, "never caught up");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Unit tests' tenant: "t" on shard 0 over `log`, starting from `store`, with requests up to
/// 1 MiB and etcd's 128 ops per txn.
#[cfg(test)]
pub fn test_tenant(
    store: MemStore,
    log: Arc<dyn Log>,
    cluster_id: u64,
    member_id: u64,
) -> Arc<Tenant> {
    test_tenant_named("t", store, log, cluster_id, member_id)
}

/// [`test_tenant`] named `name`.
#[cfg(test)]
pub fn test_tenant_named(
    name: &str,
    store: MemStore,
    log: Arc<dyn Log>,
    cluster_id: u64,
    member_id: u64,
) -> Arc<Tenant> {
    Tenant::start(
        name,
        name,
        0,
        store,
        None,
        log,
        test_limits(),
        Identity {
            cluster_id,
            member_id,
        },
    )
}

/// [`test_tenant_named`] `name` over `log`, from an empty store, whose replica is held catching
/// up for `held`: its catch-up asks the journal where to catch up to, and `log` refuses until
/// then (as a tenant loaded a moment ago for a request replays the journal).
#[cfg(test)]
pub fn catching_up_tenant(name: &str, log: &crate::log::MemLog, held: Duration) -> Arc<Tenant> {
    log.set_unavailable(true);
    let store = MemStore::new(memstore::Config::default());
    let t = test_tenant_named(name, store, Arc::new(log.clone()), 1, 1);
    assert_eq!(t.replica.state(), ReplicaState::CatchingUp);
    let journal = log.clone();
    tokio::spawn(async move {
        tokio::time::sleep(held).await;
        journal.set_unavailable(false);
    });
    t
}

/// Unit tests' limits: requests up to 1 MiB, etcd's 128 ops per txn, no quotas.
#[cfg(test)]
pub fn test_limits() -> Limits {
    Limits {
        max_request_bytes: 1 << 20,
        max_txn_ops: 128,
        no_leader_after: crate::config::DEFAULT_NO_LEADER_AFTER,
        request_rate: 0,
        request_burst: 0,
        max_watchers: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::MemLog;

    /// A stopped replica applies nothing more, while its neighbours on the shard go on.
    #[tokio::test]
    async fn a_stopped_replica_applies_nothing_more() {
        let log: Arc<dyn Log> = Arc::new(MemLog::new());
        let fresh = || MemStore::new(memstore::Config::default());
        let (a, b) = (
            test_tenant_named("a", fresh(), log.clone(), 1, 1),
            test_tenant_named("b", fresh(), log.clone(), 1, 1),
        );
        let put = || {
            Request::Put(api::etcdserverpb::PutRequest {
                key: b"k".to_vec(),
                value: b"v".to_vec(),
                ..Default::default()
            })
        };
        let caller = Caller::default();
        a.propose(&RequestId::random(), &caller, put())
            .await
            .unwrap();
        b.barrier().await.unwrap();
        let stopped_at = a.replica.applied_index();
        a.replica.stop();
        assert!(a.replica.is_stopped());
        for _ in 0..3 {
            b.propose(&RequestId::random(), &caller, put())
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(b.replica.applied_index() >= stopped_at + 3);
        assert_eq!(a.replica.applied_index(), stopped_at);
    }
}
