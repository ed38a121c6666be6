//! The etcd `Maintenance` service: Status (configurable etcd version, sizes from the replica,
//! this member as leader, journal index and term), Alarm (list after a linearizable barrier;
//! activate/deactivate journalled), Defragment (nothing to free in memory: succeeds), Hash and
//! HashKV from the replica; Snapshot streams a checkpoint of the replica (`snapshot.rs`);
//! MoveLeader and Downgrade refused clearly.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use api::etcdserverpb::alarm_request::AlarmAction;
use api::etcdserverpb::maintenance_server::Maintenance;
use api::etcdserverpb::{
    AlarmRequest, AlarmResponse, DefragmentRequest, DefragmentResponse, DowngradeRequest,
    DowngradeResponse, HashKvRequest, HashKvResponse, HashRequest, HashResponse, MoveLeaderRequest,
    MoveLeaderResponse, SnapshotRequest, SnapshotResponse, StatusRequest, StatusResponse,
};
use api::strata::entry::entry::Request as Intent;
use futures::Stream;
use memstore::Outcome;
use tonic::{Request, Response, Status};

use crate::auth::Caller;
use crate::errors::Error;
use crate::log::Log;
use crate::replica::ReplicaState;
use crate::rpc::{RequestId, handled, unary};
use crate::tenant::Tenant;
use crate::tenants::Tenants;

/// How long Status waits for the journal's own status before reporting without it.
pub const JOURNAL_STATUS_TIMEOUT: Duration = Duration::from_secs(3);
/// How long Status waits for a replica catching up before reporting it as such: a tenant
/// loaded for the request replays the journal after its newest checkpoint, which the compactor
/// keeps a short tail behind. With the journal's timeout after it, 4 s at most, inside
/// `etcdctl`'s 5 s command timeout.
const STATUS_CATCH_UP_WAIT: Duration = Duration::from_secs(1);
/// How long Hash and HashKV wait for a replica catching up before hashing what it applied.
const HASH_CATCH_UP_WAIT: Duration = Duration::from_secs(3);

pub struct MaintenanceService {
    tenants: Arc<Tenants>,
    log: Arc<dyn Log>,
    version: String,
    /// Member ids MemberList reports (this frontend's and its peers'), for MoveLeader.
    members: Vec<u64>,
}

impl MaintenanceService {
    pub fn new(tenants: Arc<Tenants>, log: Arc<dyn Log>, version: String) -> Self {
        Self {
            tenants,
            log,
            version,
            members: Vec::new(),
        }
    }

    /// The member ids MemberList reports, so MoveLeader can tell a peer from a stranger.
    pub fn with_members(mut self, members: &crate::cluster::Members) -> Self {
        self.members = members.members.iter().map(|m| m.id).collect();
        self
    }

    /// `tenant` of Status and Snapshot: a suspended tenant's owner may still look at it and
    /// take its data (docs/design/tenants.md, T3).
    async fn tenant_even_suspended<T>(&self, req: &Request<T>) -> Result<Arc<Tenant>, Status> {
        let admitted = self
            .tenants
            .waiting_for(req.metadata(), Tenants::admit_even_suspended);
        admitted.await.map_err(handled)
    }

    /// The tenant, if the request's caller may use the RPCs etcd keeps for the root role
    /// (Snapshot, Defragment, Hash, HashKV, MoveLeader, Downgrade: 3.5's
    /// `authMaintenanceServer`, which answers PermissionDenied otherwise).
    async fn admin<T>(&self, req: &Request<T>) -> Result<Arc<Tenant>, Status> {
        let t = self.tenants.admitted(req.metadata()).await?;
        self.check_admin(t, req).await
    }

    /// The root-role check of `admin` for a tenant already admitted.
    async fn check_admin<T>(
        &self,
        t: Arc<Tenant>,
        req: &Request<T>,
    ) -> Result<Arc<Tenant>, Status> {
        let caller = self
            .tenants
            .caller(&t, req.metadata())
            .await
            .map_err(handled)?;
        if t.replica.auth_enabled() {
            t.replica
                .read()
                .check_admin(&caller.user)
                .map_err(|e| handled(e.into()))?;
        }
        Ok(t)
    }
}

async fn alarm(
    t: &Tenant,
    id: RequestId,
    caller: &Caller,
    req: AlarmRequest,
) -> Result<AlarmResponse, Error> {
    if req.action == AlarmAction::Get as i32 {
        t.read_point().await?;
        let (alarms, revision) = {
            let s = t.replica.read();
            (s.alarms(), s.revision())
        };
        return Ok(AlarmResponse {
            header: Some(t.header(revision)),
            alarms,
        });
    }
    let applied = t.propose(&id, caller, Intent::Alarm(req)).await?;
    match applied.outcome {
        Outcome::Alarm(mut r) => {
            r.header = Some(t.header(applied.revision));
            Ok(r)
        }
        Outcome::Failed(e) => Err(e.into()),
        _ => Err(Error::UnexpectedOutcome("Alarm")),
    }
}

async fn status(t: &Tenant, log: &dyn Log, version: &str) -> Result<StatusResponse, Error> {
    // etcd's order: "no leader" first, then every raised alarm in protobuf's compact text form
    // (`memberID:<id> alarm:<NAME> `, trailing space included, as etcd 3.4 sends it; `etcdctl
    // endpoint status` shows it under ERRORS). A tenant loaded a moment ago for this request
    // is reported once its replica caught up, if that is soon.
    t.replica.settle(STATUS_CATCH_UP_WAIT).await;
    let mut errors = Vec::new();
    let has_leader = t.has_leader();
    if !has_leader {
        errors.push(crate::errors::msg::NO_LEADER.to_string());
    }
    for a in t.replica.read().alarms() {
        let name = api::etcdserverpb::AlarmType::try_from(a.alarm)
            .map_or_else(|_| a.alarm.to_string(), |n| n.as_str_name().to_string());
        errors.push(format!("memberID:{} alarm:{name} ", a.member_id));
    }
    let journal = tokio::time::timeout(JOURNAL_STATUS_TIMEOUT, log.status(t.shard)).await;
    let applied_index = t.replica.applied_index();
    let (raft_index, raft_term) = match journal {
        Ok(Ok(s)) => {
            errors.extend(s.errors.iter().map(|e| format!("journal: {e}")));
            (s.committed_index.max(applied_index), s.term)
        }
        Ok(Err(e)) => {
            errors.push(format!("journal: {e}"));
            (applied_index, t.replica.term())
        }
        Err(_) => {
            errors.push("journal: status timed out".to_string());
            (applied_index, t.replica.term())
        }
    };
    match t.replica.state() {
        ReplicaState::CatchingUp => errors.push("replica catching up with the journal".into()),
        ReplicaState::Failed(reason) => errors.push(format!("replica stopped: {reason}")),
        ReplicaState::Ready => {}
    }
    let (stats, revision) = {
        let s = t.replica.read();
        (s.stats(), s.revision())
    };
    Ok(StatusResponse {
        header: Some(t.header(revision)),
        version: version.to_string(),
        db_size: stats.charged_bytes as i64,
        // Each frontend answers for itself (docs/frontend.md); 0, etcd's "none", while it has
        // not heard from the journal.
        leader: if has_leader { t.identity.member_id } else { 0 },
        raft_index,
        raft_term,
        raft_applied_index: applied_index,
        errors,
        db_size_in_use: stats.charged_live_bytes as i64,
        is_learner: false,
        storage_version: String::new(),
        db_size_quota: 0,
        downgrade_info: None,
    })
}

/// HashKV of the local replica, as etcd hashes its own store (no read index: it answers while
/// the journal has no quorum). A revision above the replica's waits for it to catch up first,
/// so a lagging frontend does not call an existing revision a future one.
async fn hash_kv(t: &Tenant, req: HashKvRequest) -> Result<HashKvResponse, Error> {
    if req.revision > t.replica.read().revision() {
        t.barrier().await?;
    }
    let (h, revision) = hash_of(t, req.revision).await?;
    Ok(HashKvResponse {
        header: Some(t.header(revision)),
        hash: h.hash,
        // -1 before any compaction, as etcd's (`memstore::NEVER_COMPACTED`).
        compact_revision: h.compact_revision,
        hash_revision: h.hash_revision,
    })
}

/// The hash of every key-value version up to `revision` (0: the current one), with the store's
/// revision when the hash began. A read of the whole store, in steps (`MemStore::hash_kv_scan`,
/// `Replica::in_steps`) as a large Range reads, so the apply loop gets the store between them
/// (a compaction in between drops versions the hash counts, so it begins again); after
/// `SCAN_ATTEMPTS` such beginnings, off the async workers as one long read.
async fn hash_of(t: &Tenant, revision: i64) -> Result<(memstore::HashKv, i64), Error> {
    // A tenant loaded a moment ago for this request is hashed once its replica caught up
    // with the journal (if soon), as etcd hashes a member's applied state, not a replay's
    // first steps.
    t.replica.settle(HASH_CATCH_UP_WAIT).await;
    let attempts = crate::kv::SCAN_ATTEMPTS;
    let step =
        |scan: &mut memstore::HashScan, s: &memstore::MemStore| scan.step(s, crate::kv::SCAN_STEP);
    let scan = t
        .replica
        .in_steps(attempts, |s| s.hash_kv_scan(revision), step)
        .await?;
    if let Some(scan) = scan {
        let at = scan.revision();
        return Ok((scan.finish(), at));
    }
    let replica = t.replica.clone();
    let hashed = tokio::task::spawn_blocking(move || {
        replica.read_long(|s| s.hash_kv(revision).map(|h| (h, s.revision())))
    })
    .await
    .map_err(|e| Error::Task(format!("hashing the store: {e}")))?;
    Ok(hashed?)
}

/// Maintenance.Hash of the local replica, as etcd hashes its own backend.
async fn hash(t: &Tenant) -> Result<HashResponse, Error> {
    let (h, revision) = hash_of(t, 0).await?;
    Ok(HashResponse {
        header: Some(t.header(revision)),
        hash: h.hash,
    })
}

type SnapshotStream =
    Pin<Box<dyn Stream<Item = Result<SnapshotResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl Maintenance for MaintenanceService {
    async fn alarm(&self, req: Request<AlarmRequest>) -> Result<Response<AlarmResponse>, Status> {
        self.tenants
            .serve_request("Alarm", req, |t, id, caller, r| async move {
                alarm(&t, id, &caller, r).await
            })
            .await
    }

    async fn status(
        &self,
        req: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        let t = self.tenant_even_suspended(&req).await?;
        unary(
            "Status",
            &t.name,
            RequestId::random(),
            status(&t, self.log.as_ref(), &self.version),
        )
        .await
    }

    async fn defragment(
        &self,
        req: Request<DefragmentRequest>,
    ) -> Result<Response<DefragmentResponse>, Status> {
        let t = self.admin(&req).await?;
        unary("Defragment", &t.name, RequestId::random(), async {
            // The store lives in memory: compaction already frees history; nothing to rewrite.
            // etcd (3.4 to 3.6) answers an empty response, without a header.
            Ok(DefragmentResponse { header: None })
        })
        .await
    }

    async fn hash(&self, req: Request<HashRequest>) -> Result<Response<HashResponse>, Status> {
        let t = self.admin(&req).await?;
        unary("Hash", &t.name, RequestId::random(), hash(&t)).await
    }

    async fn hash_kv(
        &self,
        req: Request<HashKvRequest>,
    ) -> Result<Response<HashKvResponse>, Status> {
        let t = self.admin(&req).await?;
        unary(
            "HashKV",
            &t.name,
            RequestId::random(),
            hash_kv(&t, req.into_inner()),
        )
        .await
    }

    type SnapshotStream = SnapshotStream;

    async fn snapshot(
        &self,
        req: Request<SnapshotRequest>,
    ) -> Result<Response<Self::SnapshotStream>, Status> {
        let t = self
            .check_admin(self.tenant_even_suspended(&req).await?, &req)
            .await?;
        crate::snapshot::snapshot(t).await.map(Response::new)
    }

    /// Every frontend answers as the leader (docs/frontend.md), so a move to itself is done at
    /// once, as etcd answers a move to the current leader; a move to a stranger gets etcd's
    /// "bad leader transferee"; a move to a peer frontend is refused (leadership lives in the
    /// journal, not among frontends).
    async fn move_leader(
        &self,
        req: Request<MoveLeaderRequest>,
    ) -> Result<Response<MoveLeaderResponse>, Status> {
        let t = self.admin(&req).await?;
        let target = req.into_inner().target_id;
        if target == t.identity.member_id {
            let revision = t.replica.read().revision();
            return Ok(Response::new(MoveLeaderResponse {
                header: Some(t.header(revision)),
            }));
        }
        if !self.members.contains(&target) {
            return Err(Status::failed_precondition(
                "etcdserver: bad leader transferee",
            ));
        }
        Err(handled(Error::LeadershipManaged))
    }

    async fn downgrade(
        &self,
        req: Request<DowngradeRequest>,
    ) -> Result<Response<DowngradeResponse>, Status> {
        self.admin(&req).await?;
        Err(handled(Error::DowngradeManaged))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use crate::log::MemLog;
    use crate::replica::ReplicaState;

    /// Status of a tenant whose replica is catching up (loaded a moment ago for this request,
    /// after it was unloaded while idle) reports it caught up, not "catching up", when that
    /// comes soon; one that stays behind longer is reported as it is.
    #[tokio::test]
    async fn status_of_a_tenant_catching_up_reports_it_caught_up() {
        let log = MemLog::new();
        let a = crate::tenant::catching_up_tenant("a", &log, Duration::from_millis(300));
        let status = super::status(&a, &log, "3.5.17").await.unwrap();
        assert_eq!(a.replica.state(), ReplicaState::Ready);
        assert!(status.errors.is_empty(), "{:?}", status.errors);

        let stuck = MemLog::new();
        let behind = crate::tenant::catching_up_tenant("b", &stuck, Duration::from_secs(3600));
        let status = super::status(&behind, &log, "3.5.17").await.unwrap();
        assert!(
            status
                .errors
                .contains(&"replica catching up with the journal".to_string()),
            "{:?}",
            status.errors
        );
    }

    /// HashKV of a tenant whose replica is catching up (loaded a moment ago for this request)
    /// hashes what the journal holds once the replica caught up, not the replay's first steps.
    #[tokio::test]
    async fn a_hash_of_a_tenant_catching_up_is_of_its_caught_up_state() {
        use api::strata::entry::entry::Request as Intent;
        let log = MemLog::new();
        let store = memstore::MemStore::new(memstore::Config::default());
        let writer = crate::tenant::test_tenant_named("a", store, Arc::new(log.clone()), 1, 1);
        crate::tenant::until_ready(std::slice::from_ref(&writer)).await;
        let put = api::etcdserverpb::PutRequest {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
            ..Default::default()
        };
        let id = crate::rpc::RequestId::random();
        let caller = crate::auth::Caller::default();
        writer
            .propose(&id, &caller, Intent::Put(put))
            .await
            .unwrap();
        let want = super::hash_of(&writer, 0).await.unwrap();
        assert_eq!(want.1, 2, "the put's revision");

        // Another replica of the same tenant, held off the journal for a while.
        let woken = crate::tenant::catching_up_tenant("a", &log, Duration::from_millis(300));
        let got = super::hash_of(&woken, 0).await.unwrap();
        assert_eq!(got.1, 2);
        assert_eq!(got.0.hash, want.0.hash);
    }

    /// HashKV of a large store hashes in steps: a put made after it began is answered before
    /// it, and the hash is the one of the revision it began at.
    #[tokio::test]
    async fn a_hash_of_a_large_store_does_not_hold_writes_back() {
        use crate::kv::tests::{large_tenant, late_put};
        let (t, before) = large_tenant(200_000);
        let whole = t.replica.read().hash_kv(0).unwrap();
        let hashing = {
            let t = t.clone();
            tokio::spawn(async move {
                let hashed = super::hash_of(&t, 0).await.unwrap();
                (hashed, std::time::Instant::now())
            })
        };
        // Let the hash begin: it hashes its first step and yields.
        tokio::task::yield_now().await;
        let put_answered = late_put(&t).await;
        let ((h, at), hash_answered) = hashing.await.unwrap();
        assert_eq!((h, at), (whole, before));
        assert!(
            put_answered < hash_answered,
            "the put waited for the hash ({:?} after it)",
            put_answered - hash_answered
        );
    }
}
