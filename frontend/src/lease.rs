//! The etcd `Lease` service: Grant, Revoke and every keep-alive journalled as intents (so expiry
//! is decided by journal time on every replica alike); TimeToLive and Leases read the replica
//! after a linearizable barrier.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use api::etcdserverpb::lease_server::Lease;
use api::etcdserverpb::{
    LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    LeaseLeasesRequest, LeaseLeasesResponse, LeaseRevokeRequest, LeaseRevokeResponse,
    LeaseTimeToLiveRequest, LeaseTimeToLiveResponse,
};
use api::strata::entry::entry::Request as Intent;
use futures::{Stream, StreamExt};
use memstore::Outcome;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

use crate::auth::Caller;
use crate::errors::Error;
use crate::rpc::{RequestId, handled, observe, unary};
use crate::tenant::Tenant;
use crate::tenants::Tenants;

/// Keep-alive answers buffered per stream before the stream stops reading requests.
pub const KEEPALIVE_QUEUE: usize = 16;

pub struct LeaseService {
    tenants: Arc<Tenants>,
}

impl LeaseService {
    pub fn new(tenants: Arc<Tenants>) -> Self {
        Self { tenants }
    }

    /// A keep-alive stream over any source of requests: the gRPC call's, or the JSON
    /// gateway's (`crate::gateway`). A tenant not known here may have been created a moment
    /// ago through another frontend: the catalogue is caught up with before refusing.
    pub async fn keep_alives<S>(
        &self,
        metadata: &tonic::metadata::MetadataMap,
        incoming: S,
    ) -> Result<KeepAliveStream, Status>
    where
        S: Stream<Item = Result<LeaseKeepAliveRequest, Status>> + Unpin + Send + 'static,
    {
        let t = self
            .tenants
            .waiting_for(metadata, Tenants::resolve)
            .await
            .map_err(handled)?;
        let leader_of = t.clone();
        let (tx, rx) = crate::watch::output_channel(metadata, KEEPALIVE_QUEUE, move || {
            leader_of.has_leader()
        })?;
        let stream_id = RequestId::random();
        let span =
            tracing::info_span!("lease_keep_alive", tenant = %t.name, stream_id = %stream_id);
        let refusal = t.refusal(false);
        tokio::spawn(serve_keep_alives(t, incoming, tx, refusal).instrument(span));
        Ok(Box::pin(ReceiverStream::new(rx)))
    }
}

/// A server-chosen lease id, as etcd picks one: random, positive, never 0.
fn new_lease_id() -> i64 {
    loop {
        let id = rand::random::<i64>() & i64::MAX;
        if id != 0 {
            return id;
        }
    }
}

async fn grant(
    t: &Tenant,
    id: RequestId,
    caller: &Caller,
    mut req: LeaseGrantRequest,
) -> Result<LeaseGrantResponse, Error> {
    if req.id == 0 {
        req.id = new_lease_id();
    }
    memstore::validate::lease_grant(&req, &memstore::Config::default())?;
    let applied = t.propose(&id, caller, Intent::LeaseGrant(req)).await?;
    match applied.outcome {
        Outcome::LeaseGrant(mut r) => {
            r.header = Some(t.header(applied.revision));
            Ok(r)
        }
        Outcome::Failed(e) => Err(e.into()),
        _ => Err(Error::UnexpectedOutcome("LeaseGrant")),
    }
}

async fn revoke(
    t: &Tenant,
    id: RequestId,
    caller: &Caller,
    req: LeaseRevokeRequest,
) -> Result<LeaseRevokeResponse, Error> {
    let applied = t.propose(&id, caller, Intent::LeaseRevoke(req)).await?;
    match applied.outcome {
        Outcome::LeaseRevoke(mut r) => {
            r.header = Some(t.header(applied.revision));
            Ok(r)
        }
        Outcome::Failed(e) => Err(e.into()),
        _ => Err(Error::UnexpectedOutcome("LeaseRevoke")),
    }
}

/// One keep-alive: journalled, answered from the outcome. A lease that does not exist (any
/// more) is answered with TTL 0, as etcd does, not with an error. One the replica does not hold
/// is looked for again after a read barrier, and answered without a journal entry if it is still
/// missing: a client renewing leases that are gone (a revoked session, a stale id) costs a read
/// round, not an fsynced entry on every journal replica. A grant committed after the barrier is
/// later than the keep-alive, which is then answered as etcd answers one that precedes it.
async fn keep_alive(
    t: &Tenant,
    id: RequestId,
    req: LeaseKeepAliveRequest,
) -> Result<LeaseKeepAliveResponse, Error> {
    let lease = req.id;
    if !t.replica.read().has_lease(lease) {
        t.barrier().await?;
        let (known, revision) = {
            let store = t.replica.read();
            (store.has_lease(lease), store.revision())
        };
        if !known {
            return Ok(LeaseKeepAliveResponse {
                header: Some(t.header(revision)),
                id: lease,
                ttl: 0,
            });
        }
    }
    // Keep-alives need no permission (etcd renews any lease for any client).
    let applied = t
        .propose(&id, &Caller::default(), Intent::LeaseKeepAlive(req))
        .await?;
    match applied.outcome {
        Outcome::LeaseKeepAlive(mut r) => {
            r.header = Some(t.header(applied.revision));
            Ok(r)
        }
        Outcome::Failed(memstore::Error::LeaseNotFound) => Ok(LeaseKeepAliveResponse {
            header: Some(t.header(applied.revision)),
            id: lease,
            ttl: 0,
        }),
        Outcome::Failed(e) => Err(e.into()),
        _ => Err(Error::UnexpectedOutcome("LeaseKeepAlive")),
    }
}

/// TimeToLive of a lease that does not exist answers TTL -1, as etcd does.
async fn time_to_live(
    t: &Tenant,
    req: LeaseTimeToLiveRequest,
) -> Result<LeaseTimeToLiveResponse, Error> {
    t.read_point().await?;
    let (result, revision) = {
        let store = t.replica.read();
        (store.lease_time_to_live(req.id, req.keys), store.revision())
    };
    match result {
        Ok(mut r) => {
            r.header = Some(t.header(revision));
            Ok(r)
        }
        Err(memstore::Error::LeaseNotFound) => Ok(LeaseTimeToLiveResponse {
            header: Some(t.header(revision)),
            id: req.id,
            ttl: -1,
            granted_ttl: 0,
            keys: Vec::new(),
        }),
        Err(e) => Err(e.into()),
    }
}

async fn leases(t: &Tenant) -> Result<LeaseLeasesResponse, Error> {
    t.read_point().await?;
    let (mut r, revision) = {
        let store = t.replica.read();
        (store.lease_leases(), store.revision())
    };
    r.header = Some(t.header(revision));
    Ok(r)
}

/// Keep-alives of one stream journalled at once (answered in the order they came): a client
/// holding thousands of leases on one stream (clientv3 sends each lease's keep-alive on its
/// client's one stream) is not held to one journal round trip per lease.
pub const KEEPALIVE_PIPELINE: usize = 64;

/// Serves one keep-alive stream: up to `KEEPALIVE_PIPELINE` requests in flight, answers sent in
/// request order. Ends after the first error answer, when the client ends its side (once the
/// keep-alives in flight are answered) or goes away.
async fn serve_keep_alives<S>(
    t: Arc<Tenant>,
    mut incoming: S,
    tx: mpsc::Sender<Result<LeaseKeepAliveResponse, Status>>,
    mut refusal: crate::tenant::Refusal,
) where
    S: Stream<Item = Result<LeaseKeepAliveRequest, Status>> + Unpin,
{
    let one = |req: LeaseKeepAliveRequest| {
        let t = &t;
        async move {
            let id = RequestId::random();
            let start = Instant::now();
            let out = keep_alive(t, id, req)
                .instrument(tracing::debug_span!("keep_alive", request_id = %id))
                .await
                .map_err(handled);
            observe(
                "LeaseKeepAlive",
                &t.name,
                start,
                out.as_ref().err().map(Status::code),
            );
            out
        }
    };
    let mut in_flight = futures::stream::FuturesOrdered::new();
    let mut reading = true;
    loop {
        tokio::select! {
            msg = incoming.next(), if reading && in_flight.len() < KEEPALIVE_PIPELINE => match msg {
                Some(Ok(req)) => in_flight.push_back(one(req)),
                Some(Err(e)) => {
                    // As etcd's LeaseKeepAlive: the stream ends with the error its receive met.
                    tracing::debug!(error = %e, "keep-alive stream receive failed");
                    let _ = tx.send(Err(crate::rpc::receive_error(e))).await;
                    return;
                }
                None => reading = false,
            },
            Some(out) = in_flight.next() => {
                let failed = out.is_err();
                if tx.send(out).await.is_err() || failed {
                    return;
                }
            }
            // Suspended or deleted: the stream ends as a new one would be refused, and lets
            // go of the tenant.
            e = refusal.wait(), if reading || !in_flight.is_empty() => {
                tracing::debug!(error = %e, "keep-alive stream ended: the tenant is not served");
                let _ = tx.send(Err(handled(e))).await;
                return;
            }
            else => return,
        }
    }
}

pub type KeepAliveStream =
    Pin<Box<dyn Stream<Item = Result<LeaseKeepAliveResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl Lease for LeaseService {
    async fn lease_grant(
        &self,
        req: Request<LeaseGrantRequest>,
    ) -> Result<Response<LeaseGrantResponse>, Status> {
        self.tenants
            .serve_request("LeaseGrant", req, |t, id, caller, r| async move {
                grant(&t, id, &caller, r).await
            })
            .await
    }

    async fn lease_revoke(
        &self,
        req: Request<LeaseRevokeRequest>,
    ) -> Result<Response<LeaseRevokeResponse>, Status> {
        self.tenants
            .serve_request("LeaseRevoke", req, |t, id, caller, r| async move {
                revoke(&t, id, &caller, r).await
            })
            .await
    }

    type LeaseKeepAliveStream = KeepAliveStream;

    async fn lease_keep_alive(
        &self,
        req: Request<Streaming<LeaseKeepAliveRequest>>,
    ) -> Result<Response<Self::LeaseKeepAliveStream>, Status> {
        let (metadata, _, incoming) = req.into_parts();
        self.keep_alives(&metadata, incoming)
            .await
            .map(Response::new)
    }

    async fn lease_time_to_live(
        &self,
        req: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        let t = self.tenants.admitted(req.metadata()).await?;
        let id = RequestId::random();
        unary(
            "LeaseTimeToLive",
            &t.name,
            id,
            time_to_live(&t, req.into_inner()),
        )
        .await
    }

    async fn lease_leases(
        &self,
        req: Request<LeaseLeasesRequest>,
    ) -> Result<Response<LeaseLeasesResponse>, Status> {
        let t = self.tenants.admitted(req.metadata()).await?;
        let id = RequestId::random();
        unary("LeaseLeases", &t.name, id, leases(&t)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::MemLog;

    fn tenant(log: &MemLog) -> Arc<Tenant> {
        let store = memstore::MemStore::new(memstore::Config::default());
        crate::tenant::test_tenant(store, Arc::new(log.clone()), 7, 9)
    }

    /// A lease of `ttl` seconds granted through `t`: its id.
    async fn lease_of(t: &Tenant, ttl: i64) -> i64 {
        let req = LeaseGrantRequest { ttl, id: 0 };
        grant(t, RequestId::random(), &Caller::default(), req)
            .await
            .unwrap()
            .id
    }

    /// A keep-alive of a lease that exists is journalled; one of a lease that never existed
    /// or was revoked is answered TTL 0 after a read barrier, with nothing journalled; one of a
    /// lease another frontend granted is found after the barrier even if this replica had not
    /// applied the grant yet.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn keep_alives_of_missing_leases_are_answered_without_a_journal_entry() {
        let log = MemLog::new();
        let t = tenant(&log);
        let keep = |t: Arc<Tenant>, id: i64| async move {
            keep_alive(&t, RequestId::random(), LeaseKeepAliveRequest { id })
                .await
                .unwrap()
        };
        let granted = lease_of(&t, 30).await;
        let before = log.last_index();
        let live = keep(t.clone(), granted).await;
        assert_eq!((live.id, live.ttl), (granted, 30));
        assert_eq!(
            log.last_index(),
            before + 1,
            "a live lease's keep-alive is journalled"
        );

        let (before, reads) = (log.last_index(), log.read_index_calls());
        let missing = keep(t.clone(), granted + 1).await;
        assert_eq!((missing.id, missing.ttl), (granted + 1, 0));
        assert_eq!(
            missing.header.unwrap().revision,
            t.replica.read().revision()
        );
        assert_eq!(
            log.last_index(),
            before,
            "nothing journalled for a missing lease"
        );
        assert_eq!(
            log.read_index_calls(),
            reads + 1,
            "looked for after a barrier"
        );

        revoke(
            &t,
            RequestId::random(),
            &Caller::default(),
            LeaseRevokeRequest { id: granted },
        )
        .await
        .unwrap();
        let before = log.last_index();
        assert_eq!(keep(t.clone(), granted).await.ttl, 0);
        assert_eq!(
            log.last_index(),
            before,
            "nothing journalled for a revoked lease"
        );

        let other = tenant(&log);
        let elsewhere = lease_of(&other, 40).await;
        let renewed = keep(t.clone(), elsewhere).await;
        assert_eq!((renewed.id, renewed.ttl), (elsewhere, 40));
    }

    /// A keep-alive stream open when the catalogue suspends its tenant ends with the
    /// suspension's error (and lets go of the tenant); keep-alives before it are answered.
    #[tokio::test]
    async fn a_suspension_ends_an_open_keep_alive_stream() {
        let log = MemLog::new();
        let t = tenant(&log);
        let granted = lease_of(&t, 30).await;
        let (req_tx, req_rx) = mpsc::unbounded_channel();
        let (tx, mut answers) = mpsc::channel(KEEPALIVE_QUEUE);
        let task = tokio::spawn(serve_keep_alives(
            t.clone(),
            tokio_stream::wrappers::UnboundedReceiverStream::new(req_rx),
            tx,
            t.refusal(false),
        ));
        req_tx
            .send(Ok(LeaseKeepAliveRequest { id: granted }))
            .unwrap();
        let live = answers.recv().await.expect("an answer").expect("renewed");
        assert_eq!((live.id, live.ttl), (granted, 30));

        t.set_served(crate::tenant::Served::Suspended);
        let end = tokio::time::timeout(std::time::Duration::from_secs(10), answers.recv())
            .await
            .expect("the stream ends at once")
            .expect("an answer")
            .expect_err("the suspension");
        assert_eq!(end.code(), tonic::Code::FailedPrecondition);
        assert!(end.message().contains("is suspended"), "{end:?}");
        tokio::time::timeout(std::time::Duration::from_secs(10), task)
            .await
            .expect("the task ends")
            .unwrap();
        assert!(answers.recv().await.is_none(), "nothing after the error");
        assert_eq!(Arc::strong_count(&t), 1, "the stream let go of the tenant");
    }

    /// A keep-alive stream whose receive fails ends with that error, as etcd's does; tonic's
    /// refusal of an oversized message is answered as grpc-go's.
    #[tokio::test]
    async fn a_failed_receive_ends_the_keep_alive_stream_with_its_error() {
        let log = MemLog::new();
        let t = tenant(&log);
        let oversized = Status::out_of_range(
            "Error, decoded message length too large: found 3000000 bytes, the limit is: 2097152 bytes",
        );
        let (tx, mut answers) = mpsc::channel(KEEPALIVE_QUEUE);
        let refusal = t.refusal(false);
        serve_keep_alives(t, futures::stream::iter([Err(oversized)]), tx, refusal).await;
        let end = answers
            .recv()
            .await
            .expect("an answer")
            .expect_err("an error");
        assert_eq!(end.code(), tonic::Code::ResourceExhausted);
        assert_eq!(
            end.message(),
            "grpc: received message larger than max (3000000 vs. 2097152)"
        );
        assert!(answers.recv().await.is_none(), "and nothing after it");
    }

    /// Keep-alives on one stream are journalled without waiting for each other's outcome: while
    /// the replica cannot apply (a long read holds its store), every keep-alive sent is appended
    /// and none answered; once it applies, each is answered, in the order sent.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn keep_alives_on_one_stream_are_pipelined_and_answered_in_order() {
        let log = MemLog::new();
        let t = tenant(&log);
        let mut leases = Vec::new();
        for ttl in [30, 40, 50, 60, 70] {
            let req = LeaseGrantRequest { ttl, id: 0 };
            let granted = grant(&t, RequestId::random(), &Caller::default(), req)
                .await
                .unwrap();
            leases.push((granted.id, ttl));
        }
        let before = log.last_index();

        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let (release, release_rx) = std::sync::mpsc::channel::<()>();
        let held = {
            let t = t.clone();
            std::thread::spawn(move || {
                t.replica.read_long(|_| {
                    started_tx.send(()).unwrap();
                    release_rx.recv().unwrap();
                })
            })
        };
        started_rx.recv().unwrap();

        let (req_tx, req_rx) = mpsc::unbounded_channel();
        let (tx, mut answers) = mpsc::channel(KEEPALIVE_QUEUE);
        tokio::spawn(serve_keep_alives(
            t.clone(),
            tokio_stream::wrappers::UnboundedReceiverStream::new(req_rx),
            tx,
            t.refusal(false),
        ));
        for &(id, _) in &leases {
            req_tx.send(Ok(LeaseKeepAliveRequest { id })).unwrap();
        }
        let all_appended = tokio::time::timeout(std::time::Duration::from_secs(20), async {
            while log.last_index() < before + leases.len() as u64 {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
        .await;
        assert!(
            all_appended.is_ok(),
            "only {} of {} keep-alives were journalled before the first was answered",
            log.last_index() - before,
            leases.len()
        );
        assert!(
            answers.try_recv().is_err(),
            "answered before it was applied"
        );

        release.send(()).unwrap();
        held.join().unwrap();
        for &(id, ttl) in &leases {
            let answer = answers
                .recv()
                .await
                .expect("an answer")
                .expect("a keep-alive");
            assert_eq!((answer.id, answer.ttl), (id, ttl));
        }
        // The client ends its side: the stream ends once nothing is in flight.
        drop(req_tx);
        assert!(answers.recv().await.is_none());
    }
}
