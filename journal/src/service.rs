//! The gRPC services of a journal node: `Journal` (clients), `JournalAdmin` (membership) and
//! `Raft` (peers), all on one listener.

use std::collections::BTreeSet;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use api::strata::journal::journal_admin_server::{JournalAdmin, JournalAdminServer};
use api::strata::journal::journal_server::{Journal, JournalServer};
use api::strata::journal::raft_server::{Raft as RaftSvc, RaftServer};
use api::strata::journal::{
    AppendError, AppendRequest, AppendResponse, AppendStreamRequest, AppendStreamResponse,
    CampaignRequest, CampaignResponse, ClockReply, ClockRequest, HandoffRequest, HandoffResponse,
    RaftAppendRequest, RaftAppendStreamReply, RaftAppendStreamRequest, RaftMessage, RaftReply,
    ReadIndexRequest, ReadIndexResponse, ReadRequest, ReadResponse, ReplaceNodeRequest,
    ReplaceNodeResponse, StatusRequest, StatusResponse, TrimRequest, TrimResponse,
};
use futures::stream::FuturesUnordered;
use futures::{Stream, StreamExt};
use openraft::BasicNode;
use serde::Serialize;
use tokio::sync::mpsc;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::server::Router;
use tonic::{Request, Response, Status, Streaming};

use crate::error::{ERROR_KIND_METADATA, FIRST_INDEX_METADATA, LEADER_METADATA, ShardError};
use crate::handoff::{CAUGHT_UP_ENTRIES, matched_index};
use crate::log_store::ReadError;
use crate::log_store::lock;
use crate::network::{MAX_RAFT_MESSAGE_BYTES, decode_append};
use crate::node::{JournalNode, MAX_APPEND_BYTES, MAX_APPEND_ENTRIES, MAX_ENTRY_BYTES, Shard};
use crate::segment::SegmentError;
use crate::tls::COMPACTOR_NAME;

/// Records per Read message at most (and bytes, below).
pub const READ_BATCH_BYTES: usize = 1024 * 1024;
/// Read messages buffered per stream before the server waits for the client.
pub const READ_STREAM_BUFFER: usize = 16;
/// Answers buffered per append stream before the server waits for the client to read.
pub const APPEND_STREAM_BUFFER: usize = 1024;
/// Requests of one append stream in progress at once; beyond it the server stops reading the
/// stream (HTTP/2 flow control then holds the client back).
pub const APPEND_STREAM_MAX_INFLIGHT: usize = 4096;
/// Replies buffered per Raft AppendEntries stream before the server waits for the leader to
/// read (the leader keeps one request in flight per stream).
pub const RAFT_STREAM_BUFFER: usize = 4;
/// Largest client message accepted (above the entry limit, so oversize gets our own error).
pub const MAX_CLIENT_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// Whether the caller's certificate is valid for the host of a member of some shard or of
/// `--peers`, or for the name `also` (checked as a server name would be).
fn certified_as<T>(node: &JournalNode, req: &Request<T>, also: Option<&str>) -> bool {
    let certs = req.peer_certs();
    let Some(leaf) = certs.as_ref().and_then(|c| c.first()) else {
        return false;
    };
    also.is_some_and(|name| crate::tls::valid_for(leaf, name))
        || node
            .journal_hosts()
            .iter()
            .any(|h| crate::tls::valid_for(leaf, h))
}

/// A call refused for the caller's certificate: counted, logged and answered.
fn refused(what: &str, message: &str) -> Status {
    ::metrics::counter!("strata_internal_tls_peer_calls_refused_total").increment(1);
    tracing::warn!(call = what, "{message}");
    Status::permission_denied(message)
}

/// With internal TLS, the Raft and admin services answer only journal nodes: callers whose
/// certificate is valid for the host of a member of some shard or of `--peers`. A frontend's or
/// compactor's certificate, which names no journal host, may append and read, but not vote,
/// replicate, campaign or change membership.
fn journal_nodes_only(
    node: Arc<JournalNode>,
) -> impl FnMut(Request<()>) -> Result<Request<()>, Status> + Clone {
    move |req: Request<()>| {
        if node.peers.tls().is_none() {
            return Ok(req);
        }
        if certified_as(&node, &req, None) {
            return Ok(req);
        }
        Err(refused(
            "raft or admin",
            "the journal's Raft and admin services answer only journal nodes: a certificate valid for a member's host",
        ))
    }
}

/// With internal TLS, `Trim` answers only the compactor (a certificate valid for
/// [`COMPACTOR_NAME`]) and journal nodes: a trim deletes history no checkpoint may cover yet, so
/// a frontend's certificate, which parses tenants' traffic, may not.
fn compactor_only<T>(node: &JournalNode, req: &Request<T>) -> Result<(), Status> {
    if node.peers.tls().is_none() || certified_as(node, req, Some(COMPACTOR_NAME)) {
        return Ok(());
    }
    Err(refused(
        "trim",
        "the journal's Trim answers only the compactor: a certificate valid for strata-compactor",
    ))
}

/// All services of `node`, ready to serve.
pub fn router(node: Arc<JournalNode>) -> Router {
    let nodes_only = journal_nodes_only(Arc::clone(&node));
    let svc = JournalSvc {
        node: Arc::clone(&node),
    };
    tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .initial_connection_window_size(api::HTTP2_CONNECTION_WINDOW)
        .add_service(
            JournalServer::new(svc.clone())
                .max_decoding_message_size(MAX_CLIENT_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_CLIENT_MESSAGE_BYTES),
        )
        .add_service(InterceptedService::new(
            JournalAdminServer::new(svc.clone()),
            nodes_only.clone(),
        ))
        .add_service(InterceptedService::new(
            RaftServer::new(svc)
                .max_decoding_message_size(MAX_RAFT_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_RAFT_MESSAGE_BYTES),
            nodes_only,
        ))
}

#[derive(Clone)]
struct JournalSvc {
    node: Arc<JournalNode>,
}

impl JournalSvc {
    fn shard(&self, id: u32) -> Result<Arc<Shard>, Status> {
        self.node.shard(id).cloned().map_err(Status::from)
    }
}

type ReadStream = Pin<Box<dyn Stream<Item = Result<ReadResponse, Status>> + Send + 'static>>;
type AppendStream =
    Pin<Box<dyn Stream<Item = Result<AppendStreamResponse, Status>> + Send + 'static>>;
type RaftAppendStream =
    Pin<Box<dyn Stream<Item = Result<RaftAppendStreamReply, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl Journal for JournalSvc {
    async fn append(
        &self,
        request: Request<AppendRequest>,
    ) -> Result<Response<AppendResponse>, Status> {
        let indexes = append_one(&self.node, request.into_inner()).await?;
        Ok(Response::new(AppendResponse { indexes }))
    }

    type AppendStreamStream = AppendStream;

    async fn append_stream(
        &self,
        request: Request<Streaming<AppendStreamRequest>>,
    ) -> Result<Response<AppendStream>, Status> {
        if self.node.refuse_streams {
            return Err(refused_stream("AppendStream"));
        }
        let inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(APPEND_STREAM_BUFFER);
        tokio::spawn(serve_append_stream(Arc::clone(&self.node), inbound, tx));
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    type ReadStream = ReadStream;

    async fn read(&self, request: Request<ReadRequest>) -> Result<Response<ReadStream>, Status> {
        let req = request.into_inner();
        let shard = self.shard(req.shard)?;
        let first = shard.first_record();
        if req.from < first {
            return Err(ShardError::Trimmed {
                shard: shard.id,
                first_index: first,
            }
            .into());
        }
        let (tx, rx) = mpsc::channel(READ_STREAM_BUFFER);
        tokio::spawn(stream_records(
            shard,
            req.from,
            tx,
            self.node.stopping.subscribe(),
        ));
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn read_index(
        &self,
        request: Request<ReadIndexRequest>,
    ) -> Result<Response<ReadIndexResponse>, Status> {
        let index = read_index_one(&self.node, request.into_inner()).await?;
        Ok(Response::new(ReadIndexResponse { index }))
    }

    async fn trim(&self, request: Request<TrimRequest>) -> Result<Response<TrimResponse>, Status> {
        compactor_only(&self.node, &request)?;
        let req = request.into_inner();
        let shard = self.shard(req.shard)?;
        let first_index = shard.trim(req.below).await?;
        Ok(Response::new(TrimResponse { first_index }))
    }

    async fn status(
        &self,
        request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        let shard = self.shard(request.into_inner().shard)?;
        let (leader_id, leader_addr) = shard.leader();
        let (term, acknowledged_by) = {
            let m = shard.raft.metrics();
            let m = m.borrow();
            let acked = m.replication.as_ref().map_or_else(Vec::new, |r| {
                r.iter()
                    .filter(|(id, matched)| **id != self.node.id && matched.is_some())
                    .map(|(id, _)| *id)
                    .collect()
            });
            (m.current_term, acked)
        };
        let last_index = shard.log.next_record().saturating_sub(1);
        let applied_end = *shard.sm.applied_end.borrow();
        Ok(Response::new(StatusResponse {
            node_id: self.node.id,
            leader_id: leader_id.unwrap_or(0),
            leader_addr: leader_addr.unwrap_or_default(),
            term,
            first_index: shard.first_record(),
            committed_index: applied_end.saturating_sub(1),
            last_index,
            shard_count: self.node.shards.len() as u32,
            errors: lock(&self.node.errors).clone(),
            acknowledged_by,
        }))
    }
}

/// What a unary `ReadIndex` answers, and what a read index on an `AppendStream` answers (as its
/// one index).
async fn read_index_one(node: &JournalNode, req: ReadIndexRequest) -> Result<u64, Status> {
    let shard = node.shard(req.shard).map_err(Status::from)?;
    Ok(shard.read_index().await?)
}

/// Checks one append against the limits, then appends it: what a unary `Append` does, and what
/// each request of an `AppendStream` does.
async fn append_one(node: &JournalNode, req: AppendRequest) -> Result<Vec<u64>, Status> {
    let shard = node.shard(req.shard).map_err(Status::from)?;
    if req.payloads.len() > MAX_APPEND_ENTRIES {
        return Err(ShardError::Invalid(format!(
            "{} entries in one append exceed the limit of {MAX_APPEND_ENTRIES}",
            req.payloads.len()
        ))
        .into());
    }
    let mut total = 0;
    for p in &req.payloads {
        if p.len() > MAX_ENTRY_BYTES {
            return Err(ShardError::TooLarge {
                size: p.len(),
                max: MAX_ENTRY_BYTES,
            }
            .into());
        }
        total += p.len();
    }
    if total > MAX_APPEND_BYTES {
        return Err(ShardError::RequestTooLarge {
            size: total,
            max: MAX_APPEND_BYTES,
        }
        .into());
    }
    let shard = Arc::clone(shard);
    Ok(shard.append(req.payloads).await?)
}

/// A failed append of a stream, carrying what the unary call's status would (code, message,
/// the `x-strata-*` metadata).
fn append_error(s: &Status) -> AppendError {
    let metadata = [ERROR_KIND_METADATA, LEADER_METADATA, FIRST_INDEX_METADATA]
        .into_iter()
        .filter_map(|k| {
            let v = s.metadata().get(k)?.to_str().ok()?;
            Some((k.to_string(), v.to_string()))
        })
        .collect();
    AppendError {
        code: s.code() as i32,
        message: s.message().to_string(),
        metadata,
    }
}

/// Serves one `AppendStream`: every request runs as a unary `Append` would, up to
/// `APPEND_STREAM_MAX_INFLIGHT` at once, all polled by this one task (no task per request);
/// each is answered as soon as it finishes. Ends when the client closes its side and every
/// open request is answered, or when the client goes away.
async fn serve_append_stream(
    node: Arc<JournalNode>,
    mut inbound: Streaming<AppendStreamRequest>,
    tx: mpsc::Sender<Result<AppendStreamResponse, Status>>,
) {
    let mut inflight = FuturesUnordered::new();
    let mut inbound_open = true;
    let mut stopping = node.stopping.subscribe();
    loop {
        if *stopping.borrow_and_update() && inbound_open {
            // The node is shutting down: take no more appends, answer those in flight, then
            // end the stream so the client moves to another node (and the server can stop).
            inbound_open = false;
        }
        if !inbound_open && inflight.is_empty() {
            if *stopping.borrow() {
                let _ = tx
                    .send(Err(Status::unavailable("journal node is stopping")))
                    .await;
            }
            return;
        }
        tokio::select! {
            req = inbound.next(), if inbound_open && inflight.len() < APPEND_STREAM_MAX_INFLIGHT => {
                match req {
                    Some(Ok(AppendStreamRequest { seq, append, read_index })) => {
                        let node = Arc::clone(&node);
                        inflight.push(async move {
                            let res = match (append, read_index) {
                                (Some(a), None) => append_one(&node, a).await,
                                (None, Some(r)) => read_index_one(&node, r).await.map(|i| vec![i]),
                                _ => Err(Status::invalid_argument(
                                    "append stream request without exactly one of an append and a read index",
                                )),
                            };
                            (seq, res)
                        });
                    }
                    Some(Err(s)) => {
                        tracing::debug!(status = %s, "append stream: client side failed");
                        return;
                    }
                    None => inbound_open = false,
                }
            }
            Some((seq, res)) = inflight.next(), if !inflight.is_empty() => {
                let resp = match res {
                    Ok(indexes) => AppendStreamResponse { seq, indexes, error: None },
                    Err(s) => AppendStreamResponse { seq, indexes: Vec::new(), error: Some(append_error(&s)) },
                };
                if tx.send(Ok(resp)).await.is_err() {
                    return;
                }
            }
            r = stopping.changed(), if inbound_open => if r.is_err() { inbound_open = false },
            _ = tx.closed() => return,
        }
    }
}

/// Streams committed records of `shard` from `from` into `tx` until the client goes away.
async fn stream_records(
    shard: Arc<Shard>,
    mut next: u64,
    tx: mpsc::Sender<Result<ReadResponse, Status>>,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) {
    let mut applied = shard.sm.applied_end.subscribe();
    // From the last entry applied here, or from the stream's start if none has since the
    // node opened.
    let opened = std::time::Instant::now();
    let stalled_at = || {
        tokio::time::Instant::from_std(shard.sm.last_applied_at().unwrap_or(opened))
            + shard.tail_stall
    };
    loop {
        if *stopping.borrow_and_update() {
            let _ = tx
                .send(Err(Status::unavailable("journal node is stopping")))
                .await;
            return;
        }
        let first = shard.first_record();
        if next < first {
            let _ = tx
                .send(Err(ShardError::Trimmed {
                    shard: shard.id,
                    first_index: first,
                }
                .into()))
                .await;
            return;
        }
        let end = *applied.borrow_and_update();
        if next < end {
            let records = match shard.log.read_records(next, end, READ_BATCH_BYTES) {
                Ok(r) => r,
                Err(ReadError::Segment(SegmentError::Missing { .. }))
                    if shard.first_record() > next =>
                {
                    continue;
                }
                Err(e) => {
                    tracing::error!(shard = shard.id, error = %e, "journal read failed");
                    let _ = tx.send(Err(Status::internal(e.to_string()))).await;
                    return;
                }
            };
            if records.first().is_none_or(|r| r.index != next) {
                if shard.first_record() > next {
                    continue; // trimmed meanwhile: the check above answers
                }
                let _ = tx
                    .send(Err(Status::internal(format!("record {next} is missing"))))
                    .await;
                return;
            }
            next += records.len() as u64;
            if tx.send(Ok(ReadResponse { records })).await.is_err() {
                return;
            }
            continue;
        }
        tokio::select! {
            r = applied.changed() => {
                if r.is_err() {
                    return;
                }
            }
            _ = stopping.changed() => {}
            _ = tx.closed() => return,
            () = tokio::time::sleep_until(stalled_at()) => {
                let stall = shard.tail_stall;
                tracing::debug!(shard = shard.id, next, ?stall, "no entry applied for a while; sending the reader elsewhere");
                let _ = tx
                    .send(Err(ShardError::Unavailable {
                        shard: shard.id,
                        reason: format!(
                            "no entry applied on this node for {stall:?}: it may be cut off from the shard's leader; read from another node"
                        ),
                    }
                    .into()))
                    .await;
                return;
            }
        }
    }
}

#[tonic::async_trait]
impl JournalAdmin for JournalSvc {
    async fn handoff(
        &self,
        request: Request<HandoffRequest>,
    ) -> Result<Response<HandoffResponse>, Status> {
        let req = request.into_inner();
        let shard = self.shard(req.shard)?;
        let (leader, leader_addr) = shard.leader();
        if leader != Some(self.node.id) {
            return Err(ShardError::NotLeader {
                shard: shard.id,
                leader_addr,
            }
            .into());
        }
        let to = if req.to == 0 { shard.preferred } else { req.to };
        let message = if req.start {
            match crate::handoff::hand_off(&self.node, &shard, to).await {
                Ok(paused) => format!(
                    "handed to node {to}; writes paused {} ms",
                    paused.as_millis()
                ),
                // Not retried by the client: the caller decides whether to ask again.
                Err(e) => return Err(Status::failed_precondition(e.to_string())),
            }
        } else if to == self.node.id {
            format!("node {to} leads the shard: nothing to hand over")
        } else if let Some(target) = shard.handing_to() {
            format!("handing over to node {target} now")
        } else {
            match crate::log_store::lock(&self.node.handoffs.settle).healthy_since(shard.id) {
                Some((n, since)) if n == to => format!(
                    "node {to} has been alive and caught up for {} ms",
                    since.elapsed().as_millis()
                ),
                _ => format!("node {to} is not alive and caught up"),
            }
        };
        Ok(Response::new(HandoffResponse {
            leader_id: shard.leader().0.unwrap_or(0),
            preferred_id: shard.preferred,
            message,
        }))
    }

    async fn replace_node(
        &self,
        request: Request<ReplaceNodeRequest>,
    ) -> Result<Response<ReplaceNodeResponse>, Status> {
        let req = request.into_inner();
        let shard = self.shard(req.shard)?;
        let map_err = |e: openraft::error::RaftError<
            u64,
            openraft::error::ClientWriteError<u64, BasicNode>,
        >|
         -> Status {
            match e {
                openraft::error::RaftError::APIError(
                    openraft::error::ClientWriteError::ForwardToLeader(_),
                ) => ShardError::NotLeader {
                    shard: shard.id,
                    leader_addr: shard.leader().1,
                }
                .into(),
                other => Status::failed_precondition(other.to_string()),
            }
        };
        // No hand-off on this node while the voters change (crate::handoff::Handoffs).
        let _no_handoff = self.node.handoffs.membership_change().await;
        let mut voters: BTreeSet<u64> = self.node.voters(&shard);
        if req.add_id != 0 && !voters.contains(&req.add_id) {
            tracing::info!(shard = shard.id, add = req.add_id, addr = %req.add_addr, "adding a learner");
            // Not openraft's blocking wait: it counts a learner as caught up while it is fewer
            // than 5000 entries behind, so on a young log a node that is not even running
            // would become a voter at once.
            shard
                .raft
                .add_learner(req.add_id, BasicNode::new(req.add_addr.clone()), false)
                .await
                .map_err(map_err)?;
            learner_caught_up(&shard, req.add_id).await?;
            voters.insert(req.add_id);
        }
        if req.remove_id != 0 {
            voters.remove(&req.remove_id);
        }
        if voters == self.node.voters(&shard) {
            return Ok(Response::new(ReplaceNodeResponse {
                voters: voters.into_iter().collect(),
            }));
        }
        tracing::info!(shard = shard.id, ?voters, "changing the voters");
        let done = shard
            .raft
            .change_membership(voters, false)
            .await
            .map_err(map_err)?;
        // The voters of the configuration the change committed, not the metrics: openraft
        // publishes those once per turn of its loop, and a busy turn can commit and answer the
        // change's second (uniform) step before it publishes, so they may still show the joint
        // configuration.
        let voters = done
            .membership
            .as_ref()
            .map(|m| m.voter_ids().collect::<BTreeSet<_>>())
            .unwrap_or_default()
            .into_iter()
            .collect();
        Ok(Response::new(ReplaceNodeResponse { voters }))
    }
}

/// How long `ReplaceNode` waits for a new learner to catch up before it answers that it has
/// not (the client gives one attempt 10 s).
const LEARNER_CATCH_UP_WAIT: Duration = Duration::from_secs(8);

/// Waits until learner `id` of `shard` is at most `CAUGHT_UP_ENTRIES` behind this leader's
/// log, for up to `LEARNER_CATCH_UP_WAIT`. A learner still behind then stays a learner: the
/// answer says so, and asking again once it runs and has caught up finishes the change.
async fn learner_caught_up(shard: &Shard, id: u64) -> Result<(), Status> {
    let deadline = tokio::time::Instant::now() + LEARNER_CATCH_UP_WAIT;
    loop {
        let (leads, matched, last) = {
            let m = shard.raft.metrics();
            let m = m.borrow();
            let matched = matched_index(&m, id);
            (
                m.replication.is_some(),
                matched,
                m.last_log_index.unwrap_or(0),
            )
        };
        if !leads {
            return Err(ShardError::NotLeader {
                shard: shard.id,
                leader_addr: shard.leader().1,
            }
            .into());
        }
        if matched.is_some_and(|m| m + CAUGHT_UP_ENTRIES >= last) {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            let behind = matched.map_or(last, |m| last.saturating_sub(m));
            return Err(Status::failed_precondition(format!(
                "shard {}: node {id} is a learner {behind} entries behind after {LEARNER_CATCH_UP_WAIT:?}; \
                 once it runs (started with --join) and has caught up, ask again",
                shard.id
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One AppendEntries from the leader, as the unary call and each message of a stream serve it.
async fn raft_append(
    node: &JournalNode,
    req: RaftAppendRequest,
) -> Result<Response<RaftReply>, Status> {
    let shard = node.shard(req.shard).map_err(Status::from)?;
    let rpc = decode_append(&req).map_err(Status::invalid_argument)?;
    reply(&shard.raft.append_entries(rpc).await)
}

/// Serves one AppendEntries stream from a leader: each request in order, answered before the
/// next is read (openraft sends one at a time). Ends when the leader closes its side or goes
/// away, or when this node stops (the leader then reopens or falls back to another path).
async fn serve_raft_stream(
    node: Arc<JournalNode>,
    mut inbound: Streaming<RaftAppendStreamRequest>,
    tx: mpsc::Sender<Result<RaftAppendStreamReply, Status>>,
) {
    let mut stopping = node.stopping.subscribe();
    loop {
        if *stopping.borrow_and_update() {
            return;
        }
        let req = tokio::select! {
            r = inbound.next() => r,
            r = stopping.changed() => {
                if r.is_err() {
                    return;
                }
                continue;
            }
        };
        let RaftAppendStreamRequest { seq, append } = match req {
            Some(Ok(r)) => r,
            Some(Err(s)) => {
                tracing::debug!(status = %s, "raft stream: leader side failed");
                return;
            }
            None => return,
        };
        let res = match append {
            Some(a) => raft_append(&node, a).await,
            None => Err(Status::invalid_argument(
                "raft stream request without an append",
            )),
        };
        let out = match res {
            Ok(r) => RaftAppendStreamReply {
                seq,
                reply: Some(r.into_inner()),
                error: None,
            },
            Err(s) => RaftAppendStreamReply {
                seq,
                reply: None,
                error: Some(AppendError {
                    code: s.code() as i32,
                    message: s.message().to_string(),
                    metadata: Default::default(),
                }),
            },
        };
        if tx.send(Ok(out)).await.is_err() {
            return;
        }
    }
}

fn reply<T: Serialize>(v: &T) -> Result<Response<RaftReply>, Status> {
    serde_json::to_vec(v)
        .map(|json| Response::new(RaftReply { json }))
        .map_err(|e| Status::internal(e.to_string()))
}

#[tonic::async_trait]
impl RaftSvc for JournalSvc {
    async fn append_entries(
        &self,
        request: Request<RaftAppendRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        raft_append(&self.node, request.into_inner()).await
    }

    type AppendEntriesStreamStream = RaftAppendStream;

    async fn append_entries_stream(
        &self,
        request: Request<Streaming<RaftAppendStreamRequest>>,
    ) -> Result<Response<RaftAppendStream>, Status> {
        if self.node.refuse_streams {
            return Err(refused_stream("AppendEntriesStream"));
        }
        let inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(RAFT_STREAM_BUFFER);
        tokio::spawn(serve_raft_stream(Arc::clone(&self.node), inbound, tx));
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn vote(&self, request: Request<RaftMessage>) -> Result<Response<RaftReply>, Status> {
        let req = request.into_inner();
        let shard = self.shard(req.shard)?;
        if shard.votes_held() {
            return Err(Status::unavailable(
                "restarted recently: no votes until a lease granted before the restart ran out",
            ));
        }
        let rpc = serde_json::from_slice(&req.json)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        reply(&shard.raft.vote(rpc).await)
    }

    async fn install_snapshot(
        &self,
        request: Request<RaftMessage>,
    ) -> Result<Response<RaftReply>, Status> {
        let req = request.into_inner();
        let shard = self.shard(req.shard)?;
        let rpc = serde_json::from_slice(&req.json)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        reply(&shard.raft.install_snapshot(rpc).await)
    }

    async fn clock(&self, _: Request<ClockRequest>) -> Result<Response<ClockReply>, Status> {
        Ok(Response::new(ClockReply {
            wall_ms: crate::clock::now_ms(),
        }))
    }

    async fn campaign(
        &self,
        request: Request<CampaignRequest>,
    ) -> Result<Response<CampaignResponse>, Status> {
        let req = request.into_inner();
        let shard = self.shard(req.shard)?;
        {
            let m = shard.raft.metrics();
            let m = m.borrow();
            // Only the leader this node follows, in its current term, hands over: a late or
            // stray request must not start an election.
            if m.current_leader != Some(req.leader_id) || m.current_term != req.term {
                return Err(Status::failed_precondition(format!(
                    "this node follows {:?} in term {}, not node {} in term {}",
                    m.current_leader, m.current_term, req.leader_id, req.term
                )));
            }
            if !m
                .membership_config
                .membership()
                .voter_ids()
                .any(|v| v == self.node.id)
            {
                return Err(Status::failed_precondition(
                    "this node is not a voter of the shard",
                ));
            }
        }
        tracing::info!(
            shard = shard.id,
            from = req.leader_id,
            term = req.term,
            "campaigning at the leader's request"
        );
        shard
            .raft
            .trigger()
            .elect()
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        Ok(Response::new(CampaignResponse {}))
    }
}

/// What a node built before the stream RPCs answers them (`NodeConfig::refuse_streams`).
fn refused_stream(name: &str) -> Status {
    Status::unimplemented(format!(
        "{name} is refused by this node (--refuse-streams, testing the unary fallback)"
    ))
}
