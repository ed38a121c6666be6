//! etcd's lock and election services (`v3lockpb.Lock`, `v3electionpb.Election`), which every
//! etcd member serves on its client port beside KV, Watch and Lease: jetcd's lock and election
//! clients, the `etcd-client` crate's `lock`/`campaign`, and the JSON gateway's `/v3/lock/*` and
//! `/v3/election/*` call them instead of building the recipes themselves.
//!
//! Built as etcd builds them (its `v3lock` and `v3election` servers over clientv3's
//! `concurrency` package): out of KV, Lease and Watch requests, each handed to the very service
//! instance a gRPC call reaches, with the caller's metadata. So the caller's tenant, user,
//! permissions and request limits apply to every step exactly as to its own requests, and the
//! keys are the ones etcd writes (`<name>/<lease in hex>`), so a client mixing these services
//! with clientv3's own `concurrency` recipes on the same names interoperates.
//!
//! - **Lock**: the caller's key is put under `<name>/` with its lease unless it exists; the
//!   holder is the oldest key there (smallest create revision); a waiter watches the newest key
//!   older than its own until it is deleted, then looks again. A request naming no lease gets a
//!   lease of 60 s (etcd's session default), never kept alive: the hold ends with it.
//! - **Election**: the same queue; the leader's key holds the leader's value. `Proclaim` and
//!   `Resign` act only while the key is the one created at the leader's revision.
//! - A waiting `Lock` or `Campaign` whose caller goes away gives up its place (a `Lock`'s key is
//!   deleted on any failure of the wait, a candidacy only when the caller is gone), as etcd's
//!   do.
//!
//! Owns the recipes (keys, txns and waits) only; may not touch how the services it calls
//! behave.

use std::sync::Arc;

use api::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use api::etcdserverpb::kv_server::Kv;
use api::etcdserverpb::lease_server::Lease;
use api::etcdserverpb::range_request::{SortOrder, SortTarget};
use api::etcdserverpb::{
    Compare, DeleteRangeRequest, LeaseGrantRequest, PutRequest, RangeRequest, RangeResponse,
    RequestOp, ResponseHeader, TxnRequest, TxnResponse, WatchCreateRequest, WatchRequest,
    WatchResponse, request_op, response_op, watch_request,
};
use api::mvccpb::KeyValue;
use api::mvccpb::event::EventType;
use api::v3electionpb::election_server::Election;
use api::v3electionpb::{
    CampaignRequest, CampaignResponse, LeaderKey, LeaderRequest, LeaderResponse, ProclaimRequest,
    ProclaimResponse, ResignRequest, ResignResponse,
};
use api::v3lockpb::lock_server::Lock;
use api::v3lockpb::{LockRequest, LockResponse, UnlockRequest, UnlockResponse};
use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};

use crate::kv::KvService;
use crate::lease::LeaseService;
use crate::tenants::Tenants;
use crate::watch::WatchService;

/// The TTL of the lease granted to a `Lock` or `Campaign` that names none (clientv3
/// `concurrency`'s default session TTL).
pub const SESSION_TTL: i64 = 60;
/// Leader answers of one `Observe` buffered before it waits for its client.
const OBSERVE_QUEUE: usize = 16;

/// etcd's errors of these services, with its messages (plain errors in etcd, so gRPC code
/// Unknown).
const NOT_LEADER: &str = "election: not leader";
const NO_LEADER: &str = "election: no leader";
const MISSING_LEADER: &str = "\"leader\" field must be provided";
const SESSION_EXPIRED: &str = "mutex: session is expired";
const LOST_WATCHER: &str = "lost watcher waiting for delete";

/// The Lock and Election services over the services a gRPC call reaches.
pub struct ConcurrencyService {
    kv: Arc<KvService>,
    watch: Arc<WatchService<Tenants>>,
    lease: Arc<LeaseService>,
}

type Answers<T> = std::pin::Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// What `Observe` answers: one leader after another.
pub type ObserveStream = Answers<LeaderResponse>;

impl ConcurrencyService {
    pub fn new(
        kv: Arc<KvService>,
        watch: Arc<WatchService<Tenants>>,
        lease: Arc<LeaseService>,
    ) -> Self {
        Self { kv, watch, lease }
    }

    async fn txn(&self, md: &MetadataMap, txn: TxnRequest) -> Result<TxnResponse, Status> {
        Ok(self.kv.txn(request(md, txn)).await?.into_inner())
    }

    async fn range(&self, md: &MetadataMap, range: RangeRequest) -> Result<RangeResponse, Status> {
        Ok(self.kv.range(request(md, range)).await?.into_inner())
    }

    /// The lease of a session: `lease`, or a new one of [`SESSION_TTL`] when it is 0.
    async fn session_lease(&self, md: &MetadataMap, lease: i64) -> Result<i64, Status> {
        if lease != 0 {
            return Ok(lease);
        }
        let grant = LeaseGrantRequest {
            ttl: SESSION_TTL,
            id: 0,
        };
        Ok(self
            .lease
            .lease_grant(request(md, grant))
            .await?
            .into_inner()
            .id)
    }

    /// A watch of `key` (to `range_end`) from revision `from`.
    async fn watch_from(
        &self,
        md: &MetadataMap,
        key: &[u8],
        range_end: Vec<u8>,
        from: i64,
    ) -> Result<Answers<WatchResponse>, Status> {
        let create = WatchRequest {
            request_union: Some(watch_request::RequestUnion::CreateRequest(
                WatchCreateRequest {
                    key: key.to_vec(),
                    range_end,
                    start_revision: from,
                    ..Default::default()
                },
            )),
        };
        // The request side stays open: a closed one would end the watch.
        let input = futures::stream::iter([Ok(create)]).chain(futures::stream::pending());
        self.watch.open(md.clone(), input).await
    }

    /// Waits until `key` is deleted, watching from revision `from`.
    async fn wait_delete(&self, md: &MetadataMap, key: &[u8], from: i64) -> Result<(), Status> {
        let mut answers = self.watch_from(md, key, Vec::new(), from).await?;
        while let Some(answer) = answers.next().await {
            let answer = answer?;
            if answer.canceled {
                return Err(cancelled(&answer));
            }
            if answer
                .events
                .iter()
                .any(|e| e.r#type == EventType::Delete as i32)
            {
                return Ok(());
            }
        }
        Err(Status::unknown(LOST_WATCHER))
    }

    /// Waits until no key under `prefix` created at or before `max_create_revision` is left:
    /// the newest of them is watched until deleted, then the next (clientv3 `waitDeletes`).
    async fn wait_deletes(
        &self,
        md: &MetadataMap,
        prefix: &[u8],
        max_create_revision: i64,
    ) -> Result<(), Status> {
        loop {
            let mut newest = queue(prefix, SortOrder::Descend);
            newest.max_create_revision = max_create_revision;
            let found = self.range(md, newest).await?;
            let Some(kv) = found.kvs.first() else {
                return Ok(());
            };
            self.wait_delete(md, &kv.key, revision(&found.header))
                .await?;
        }
    }

    async fn lock(&self, md: &MetadataMap, req: LockRequest) -> Result<LockResponse, Status> {
        let lease = self.session_lease(md, req.lease).await?;
        let prefix = prefix(&req.name);
        let key = member_key(&prefix, lease);
        let owner = || range_op(queue(&prefix, SortOrder::Ascend));
        let resp = self
            .txn(
                md,
                TxnRequest {
                    compare: vec![created_at(&key, 0)],
                    success: vec![put_op(&key, Vec::new(), lease), owner()],
                    failure: vec![range_op(point(&key)), owner()],
                },
            )
            .await?;
        let mine = if resp.succeeded {
            revision(&resp.header)
        } else {
            first_kv(&resp, 0)?.create_revision
        };
        if ranged(&resp, 1)?
            .kvs
            .first()
            .is_none_or(|o| o.create_revision == mine)
        {
            return Ok(LockResponse {
                header: resp.header,
                key,
            });
        }
        // Waiting: the key is given up if the wait fails or the caller goes away.
        let withdraw = Withdraw::new(self, md, &key, None);
        self.wait_deletes(md, &prefix, mine - 1).await?;
        let held = self.range(md, point(&key)).await?;
        withdraw.disarm();
        if held.kvs.is_empty() {
            // The lease ended while waiting.
            return Err(Status::unknown(SESSION_EXPIRED));
        }
        Ok(LockResponse {
            header: held.header,
            key,
        })
    }

    async fn unlock(&self, md: &MetadataMap, req: UnlockRequest) -> Result<UnlockResponse, Status> {
        let delete = DeleteRangeRequest {
            key: req.key,
            ..Default::default()
        };
        let resp = self
            .kv
            .delete_range(request(md, delete))
            .await?
            .into_inner();
        Ok(UnlockResponse {
            header: resp.header,
        })
    }

    async fn campaign(
        &self,
        md: &MetadataMap,
        req: CampaignRequest,
    ) -> Result<CampaignResponse, Status> {
        let lease = self.session_lease(md, req.lease).await?;
        let prefix = prefix(&req.name);
        let key = member_key(&prefix, lease);
        let resp = self
            .txn(
                md,
                TxnRequest {
                    compare: vec![created_at(&key, 0)],
                    success: vec![put_op(&key, req.value.clone(), lease)],
                    failure: vec![range_op(point(&key))],
                },
            )
            .await?;
        let mut rev = revision(&resp.header);
        if !resp.succeeded {
            // Already a candidate (the same lease): announce the value asked for now.
            let kv = first_kv(&resp, 0)?;
            rev = kv.create_revision;
            if kv.value != req.value {
                let leader = LeaderKey {
                    name: req.name.clone(),
                    key: key.clone(),
                    rev,
                    lease,
                };
                if let Err(e) = self.proclaim_as(md, &leader, req.value.clone()).await {
                    self.resign_as(md, &leader).await?;
                    return Err(e);
                }
            }
        }
        let withdraw = Withdraw::new(self, md, &key, Some(rev));
        let waited = self.wait_deletes(md, &prefix, rev - 1).await;
        // Only a caller that went away withdraws its candidacy (the guard's drop).
        withdraw.disarm();
        waited?;
        Ok(CampaignResponse {
            header: resp.header,
            leader: Some(LeaderKey {
                name: req.name,
                key,
                rev,
                lease,
            }),
        })
    }

    /// Puts `value` on the leader's key while it is the one created at its revision.
    async fn proclaim_as(
        &self,
        md: &MetadataMap,
        leader: &LeaderKey,
        value: Vec<u8>,
    ) -> Result<Option<ResponseHeader>, Status> {
        let resp = self
            .txn(
                md,
                TxnRequest {
                    compare: vec![created_at(&leader.key, leader.rev)],
                    success: vec![put_op(&leader.key, value, leader.lease)],
                    failure: Vec::new(),
                },
            )
            .await?;
        if !resp.succeeded {
            return Err(Status::unknown(NOT_LEADER));
        }
        Ok(resp.header)
    }

    /// Deletes the leader's key if it is the one created at its revision.
    async fn resign_as(
        &self,
        md: &MetadataMap,
        leader: &LeaderKey,
    ) -> Result<Option<ResponseHeader>, Status> {
        Ok(self
            .txn(md, resign_txn(&leader.key, leader.rev))
            .await?
            .header)
    }

    async fn proclaim(
        &self,
        md: &MetadataMap,
        req: ProclaimRequest,
    ) -> Result<ProclaimResponse, Status> {
        let mut leader = req.leader.ok_or_else(|| Status::unknown(MISSING_LEADER))?;
        // As etcd: a leader key naming no lease proclaims under a new session's lease.
        leader.lease = self.session_lease(md, leader.lease).await?;
        let header = self.proclaim_as(md, &leader, req.value).await?;
        Ok(ProclaimResponse { header })
    }

    async fn resign(&self, md: &MetadataMap, req: ResignRequest) -> Result<ResignResponse, Status> {
        let leader = req.leader.ok_or_else(|| Status::unknown(MISSING_LEADER))?;
        let header = self.resign_as(md, &leader).await?;
        Ok(ResignResponse { header })
    }

    async fn leader(&self, md: &MetadataMap, req: LeaderRequest) -> Result<LeaderResponse, Status> {
        let found = self
            .range(md, queue(&prefix(&req.name), SortOrder::Ascend))
            .await?;
        let Some(kv) = found.kvs.into_iter().next() else {
            return Err(Status::unknown(NO_LEADER));
        };
        Ok(LeaderResponse {
            header: found.header,
            kv: Some(kv),
        })
    }

    /// Every leader of the election from now on, and each new value of each: the current
    /// leader (or the first to come, if there is none), its key's puts until it is deleted,
    /// then the next (clientv3 `Election.Observe`). Ends when the caller goes away; an error
    /// ends it with that error (etcd ends the stream without one).
    async fn observe(
        self: &Arc<Self>,
        md: MetadataMap,
        req: LeaderRequest,
    ) -> Result<ObserveStream, Status> {
        let (tx, rx) = mpsc::channel(OBSERVE_QUEUE);
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let sent = tx.clone();
            let run = async {
                if let Err(e) = this.observe_into(&md, &prefix(&req.name), &tx).await {
                    let _ = tx.send(Err(as_etcd(e))).await;
                }
            };
            tokio::select! {
                () = run => {}
                () = sent.closed() => {}
            }
        });
        Ok(Box::pin(ReceiverStream::new(rx)))
    }

    async fn observe_into(
        &self,
        md: &MetadataMap,
        prefix: &[u8],
        tx: &mpsc::Sender<Result<LeaderResponse, Status>>,
    ) -> Result<(), Status> {
        let send = |header: Option<ResponseHeader>, kv: KeyValue| async move {
            tx.send(Ok(LeaderResponse {
                header,
                kv: Some(kv),
            }))
            .await
            .is_ok()
        };
        loop {
            let found = self.range(md, queue(prefix, SortOrder::Ascend)).await?;
            let (header, kv) = match found.kvs.into_iter().next() {
                Some(kv) => (found.header, kv),
                None => {
                    // No leader: the first key put under the prefix from here on is.
                    let from = revision(&found.header);
                    let mut answers = self
                        .watch_from(md, prefix, api::prefix_range_end(prefix), from)
                        .await?;
                    loop {
                        let answer = answers
                            .next()
                            .await
                            .ok_or_else(|| Status::unknown(LOST_WATCHER))??;
                        if answer.canceled {
                            return Err(cancelled(&answer));
                        }
                        let put = answer
                            .events
                            .into_iter()
                            .find(|e| e.r#type == EventType::Put as i32)
                            .and_then(|e| e.kv);
                        if let Some(kv) = put {
                            let mut header = answer.header.unwrap_or_default();
                            header.revision = kv.mod_revision;
                            break (Some(header), kv);
                        }
                    }
                }
            };
            let from = revision(&header) + 1;
            let key = kv.key.clone();
            if !send(header, kv).await {
                return Ok(());
            }
            // The leader's new values until its key is deleted.
            let mut answers = self.watch_from(md, &key, Vec::new(), from).await?;
            'leader: loop {
                let answer = answers
                    .next()
                    .await
                    .ok_or_else(|| Status::unknown(LOST_WATCHER))??;
                if answer.canceled {
                    return Err(cancelled(&answer));
                }
                for event in answer.events {
                    if event.r#type == EventType::Delete as i32 {
                        break 'leader;
                    }
                    if let Some(kv) = event.kv
                        && !send(answer.header, kv).await
                    {
                        return Ok(());
                    }
                }
            }
        }
    }
}

/// Gives up a waiter's place (deletes its key, or resigns a candidacy) when dropped armed: the
/// caller went away (its call's future was dropped) or the wait failed.
struct Withdraw {
    kv: Arc<KvService>,
    md: MetadataMap,
    txn: Option<TxnRequest>,
}

impl Withdraw {
    /// For `key`; with `created`, only while the key is the one created at that revision.
    fn new(s: &ConcurrencyService, md: &MetadataMap, key: &[u8], created: Option<i64>) -> Self {
        let txn = match created {
            Some(rev) => resign_txn(key, rev),
            None => TxnRequest {
                success: vec![delete_op(key)],
                ..Default::default()
            },
        };
        Self {
            kv: Arc::clone(&s.kv),
            md: md.clone(),
            txn: Some(txn),
        }
    }

    fn disarm(mut self) {
        self.txn = None;
    }
}

impl Drop for Withdraw {
    fn drop(&mut self) {
        if let Some(txn) = self.txn.take() {
            let (kv, md) = (Arc::clone(&self.kv), self.md.clone());
            tokio::spawn(async move {
                if let Err(e) = kv.txn(request(&md, txn)).await {
                    tracing::warn!(error = %e, "a withdrawn lock or candidacy kept its key");
                }
            });
        }
    }
}

/// A request to a service, with `md` as its metadata (as if the caller had sent it).
fn request<T>(md: &MetadataMap, message: T) -> Request<T> {
    Request::from_parts(md.clone(), Default::default(), message)
}

/// `<name>/`: every key of the lock or election lies below it.
fn prefix(name: &[u8]) -> Vec<u8> {
    let mut p = name.to_vec();
    p.push(b'/');
    p
}

/// A session's key under `prefix`: the lease in hex, as Go's `%x` prints an `int64`.
fn member_key(prefix: &[u8], lease: i64) -> Vec<u8> {
    let hex = if lease < 0 {
        format!("-{:x}", lease.unsigned_abs())
    } else {
        format!("{lease:x}")
    };
    [prefix, hex.as_bytes()].concat()
}

/// The oldest (`Ascend`) or newest (`Descend`) key under `prefix` by create revision.
fn queue(prefix: &[u8], order: SortOrder) -> RangeRequest {
    RangeRequest {
        key: prefix.to_vec(),
        range_end: api::prefix_range_end(prefix),
        limit: 1,
        sort_order: order as i32,
        sort_target: SortTarget::Create as i32,
        ..Default::default()
    }
}

fn point(key: &[u8]) -> RangeRequest {
    RangeRequest {
        key: key.to_vec(),
        ..Default::default()
    }
}

fn created_at(key: &[u8], rev: i64) -> Compare {
    Compare {
        key: key.to_vec(),
        target: CompareTarget::Create as i32,
        result: CompareResult::Equal as i32,
        target_union: Some(TargetUnion::CreateRevision(rev)),
        ..Default::default()
    }
}

fn put_op(key: &[u8], value: Vec<u8>, lease: i64) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestPut(PutRequest {
            key: key.to_vec(),
            value,
            lease,
            ..Default::default()
        })),
    }
}

fn range_op(range: RangeRequest) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestRange(range)),
    }
}

fn delete_op(key: &[u8]) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestDeleteRange(
            DeleteRangeRequest {
                key: key.to_vec(),
                ..Default::default()
            },
        )),
    }
}

/// Deletes `key` if it is the one created at `rev`.
fn resign_txn(key: &[u8], rev: i64) -> TxnRequest {
    TxnRequest {
        compare: vec![created_at(key, rev)],
        success: vec![delete_op(key)],
        failure: Vec::new(),
    }
}

fn revision(header: &Option<ResponseHeader>) -> i64 {
    header.as_ref().map_or(0, |h| h.revision)
}

/// The range answer at `i` of a txn's responses.
fn ranged(resp: &TxnResponse, i: usize) -> Result<&RangeResponse, Status> {
    match resp.responses.get(i).and_then(|r| r.response.as_ref()) {
        Some(response_op::Response::ResponseRange(r)) => Ok(r),
        _ => Err(Status::internal("a txn's range answered something else")),
    }
}

/// The first key-value of the range answer at `i`: one the txn's compare found.
fn first_kv(resp: &TxnResponse, i: usize) -> Result<&KeyValue, Status> {
    ranged(resp, i)?
        .kvs
        .first()
        .ok_or_else(|| Status::internal("a key the txn's compare found is not in its range"))
}

/// The error a cancelled watch stands for (a compacted revision, as clientv3 reports it).
fn cancelled(answer: &WatchResponse) -> Status {
    if answer.compact_revision > 0 {
        Status::out_of_range("etcdserver: mvcc: required revision has been compacted")
    } else if answer.cancel_reason.is_empty() {
        Status::unknown(LOST_WATCHER)
    } else {
        Status::unknown(answer.cancel_reason.clone())
    }
}

/// A call's metadata and message handed to `serve`, its answer wrapped for tonic.
async fn answer<Req, Resp>(
    req: Request<Req>,
    serve: impl AsyncFnOnce(&MetadataMap, Req) -> Result<Resp, Status>,
) -> Result<Response<Resp>, Status> {
    let (md, _, req) = req.into_parts();
    serve(&md, req).await.map(Response::new).map_err(as_etcd)
}

/// An error of a step as etcd's Lock and Election answer it: etcd runs them through its own
/// client, which turns every etcd error (the messages starting `etcdserver: `) into a plain
/// error, so they reach the caller with code Unknown and the same message. Other errors (a
/// connection's, Strata's own tenant errors) keep their code.
fn as_etcd(status: Status) -> Status {
    if status.code() != tonic::Code::Unknown && status.message().starts_with("etcdserver: ") {
        Status::unknown(status.message())
    } else {
        status
    }
}

/// A tonic handle on the service (it is shared with the JSON gateway).
#[derive(Clone)]
pub struct Handle(pub Arc<ConcurrencyService>);

#[tonic::async_trait]
impl Lock for Handle {
    async fn lock(&self, req: Request<LockRequest>) -> Result<Response<LockResponse>, Status> {
        answer(req, async |md, r| self.0.lock(md, r).await).await
    }

    async fn unlock(
        &self,
        req: Request<UnlockRequest>,
    ) -> Result<Response<UnlockResponse>, Status> {
        answer(req, async |md, r| self.0.unlock(md, r).await).await
    }
}

#[tonic::async_trait]
impl Election for Handle {
    async fn campaign(
        &self,
        req: Request<CampaignRequest>,
    ) -> Result<Response<CampaignResponse>, Status> {
        answer(req, async |md, r| self.0.campaign(md, r).await).await
    }

    async fn proclaim(
        &self,
        req: Request<ProclaimRequest>,
    ) -> Result<Response<ProclaimResponse>, Status> {
        answer(req, async |md, r| self.0.proclaim(md, r).await).await
    }

    async fn leader(
        &self,
        req: Request<LeaderRequest>,
    ) -> Result<Response<LeaderResponse>, Status> {
        answer(req, async |md, r| self.0.leader(md, r).await).await
    }

    type ObserveStream = ObserveStream;

    async fn observe(
        &self,
        req: Request<LeaderRequest>,
    ) -> Result<Response<ObserveStream>, Status> {
        let (md, _, req) = req.into_parts();
        self.0.observe(md, req).await.map(Response::new)
    }

    async fn resign(
        &self,
        req: Request<ResignRequest>,
    ) -> Result<Response<ResignResponse>, Status> {
        answer(req, async |md, r| self.0.resign(md, r).await).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_errors_reach_the_caller_as_etcds_client_hands_them_on() {
        let denied = as_etcd(Status::permission_denied("etcdserver: permission denied"));
        assert_eq!(
            (denied.code(), denied.message()),
            (tonic::Code::Unknown, "etcdserver: permission denied")
        );
        let own = as_etcd(Status::failed_precondition("strata: tenant a is suspended"));
        assert_eq!(own.code(), tonic::Code::FailedPrecondition);
    }

    #[test]
    fn keys_are_etcds() {
        assert_eq!(
            member_key(b"lk/", 0x694d_77aa_9e38_260f),
            b"lk/694d77aa9e38260f"
        );
        assert_eq!(member_key(b"lk/", 1), b"lk/1");
        assert_eq!(member_key(b"lk/", -1), b"lk/-1");
        assert_eq!(prefix(b"el"), b"el/");
        let q = queue(b"el/", SortOrder::Descend);
        assert_eq!((q.range_end.as_slice(), q.limit), (&b"el0"[..], 1));
        assert_eq!(q.sort_target, SortTarget::Create as i32);
    }
}
