//! Raft traffic between journal nodes over gRPC (the `strata.journal.Raft` service): the
//! openraft network (client side, one lazily connected channel per peer address shared by all
//! shards) and the service that hands incoming messages to the right shard's Raft.
// openraft's own error types are large; they are its contract, not ours to box.
#![allow(clippy::result_large_err)]

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use api::strata::journal::raft_client::RaftClient;
use api::strata::journal::{
    RaftAppendRequest, RaftAppendStreamReply, RaftAppendStreamRequest, RaftMessage, RaftReply,
};
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, Vote};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tonic::transport::{Channel, Endpoint};

use crate::lease::LeaseClock;
use crate::log_store::{LogShared, lock};
use crate::types::{JLogId, NodeId, TypeConfig, decode_wire, encode_wire};

/// Timeout of connecting to a peer.
pub const PEER_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Largest gRPC message between nodes (a batch of up to `max_payload_entries` entries).
pub const MAX_RAFT_MESSAGE_BYTES: usize = 256 * 1024 * 1024;
/// AppendEntries requests queued on one peer stream before the sender waits (openraft 0.9
/// keeps one in flight per follower; an abandoned one may still sit in the queue).
const RAFT_STREAM_QUEUE: usize = 4;
/// A peer stream whose last this many calls were all dropped before their replies came (by
/// openraft's timeout) is replaced by a new one.
const RAFT_STREAM_MAX_ABANDONED: u32 = 3;

/// Addresses of peers: the local `--peers` list wins over addresses in the membership (so an
/// operator or a test can route a node's traffic differently), and channels are shared.
pub struct Peers {
    overrides: BTreeMap<NodeId, String>,
    channels: Mutex<HashMap<String, Channel>>,
    /// Internal TLS: peers are dialled over it (None: plaintext).
    tls: Option<Arc<crate::tls::InternalTls>>,
}

impl Peers {
    pub fn new(
        overrides: BTreeMap<NodeId, String>,
        tls: Option<Arc<crate::tls::InternalTls>>,
    ) -> Self {
        Peers {
            overrides,
            channels: Mutex::new(HashMap::new()),
            tls,
        }
    }

    /// Internal TLS, if peers are dialled (and this node serves) over it.
    pub fn tls(&self) -> Option<&Arc<crate::tls::InternalTls>> {
        self.tls.as_ref()
    }

    /// The address to dial for `id`, given the address the membership records.
    pub fn addr_of(&self, id: NodeId, recorded: &str) -> String {
        self.overrides
            .get(&id)
            .cloned()
            .unwrap_or_else(|| recorded.to_string())
    }

    pub fn overrides(&self) -> &BTreeMap<NodeId, String> {
        &self.overrides
    }

    pub(crate) fn channel(&self, addr: &str) -> Result<Channel, tonic::transport::Error> {
        let mut map = lock(&self.channels);
        if let Some(c) = map.get(addr) {
            return Ok(c.clone());
        }
        let url = if addr.starts_with("http") {
            addr.to_string()
        } else {
            format!("http://{addr}")
        };
        let endpoint = Endpoint::from_shared(url)?
            .connect_timeout(PEER_CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .initial_connection_window_size(api::HTTP2_CONNECTION_WINDOW)
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(5));
        let ch = match &self.tls {
            Some(tls) => tls.channel(&endpoint),
            None => endpoint.connect_lazy(),
        };
        map.insert(addr.to_string(), ch.clone());
        Ok(ch)
    }
}

/// The openraft network factory of one shard.
#[derive(Clone)]
pub struct Network {
    pub shard: u32,
    pub peers: Arc<Peers>,
    /// The shard's log: the commit index sent to followers is held back to what is durable.
    pub log: Arc<LogShared>,
    /// Where acknowledged AppendEntries are recorded for the leader lease.
    pub lease: Arc<LeaseClock>,
}

/// A connection to one peer for one shard.
pub struct PeerConn {
    shard: u32,
    log: Arc<LogShared>,
    lease: Arc<LeaseClock>,
    target: NodeId,
    client: Result<RaftClient<Channel>, String>,
    /// The AppendEntries stream to the target, opened at the first AppendEntries; dropped
    /// (and opened again at the next one) after any failure, timeout or cancelled call.
    stream: Option<RaftStream>,
    /// The target answered UNIMPLEMENTED to the stream (an older node): unary calls only.
    unary_only: bool,
}

/// One open AppendEntries stream to a peer.
struct RaftStream {
    tx: tokio::sync::mpsc::Sender<RaftAppendStreamRequest>,
    rx: tonic::Streaming<RaftAppendStreamReply>,
    next_seq: u64,
    /// A request was sent and its reply not read yet (its caller may have been dropped).
    in_flight: bool,
    /// Calls in a row dropped before their reply came.
    abandoned: u32,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerConn;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> PeerConn {
        let addr = self.peers.addr_of(target, &node.addr);
        let client = self
            .peers
            .channel(&addr)
            .map(|c| {
                RaftClient::new(c)
                    .max_decoding_message_size(MAX_RAFT_MESSAGE_BYTES)
                    .max_encoding_message_size(MAX_RAFT_MESSAGE_BYTES)
            })
            .map_err(|e| format!("bad peer address {addr}: {e}"));
        PeerConn {
            shard: self.shard,
            log: Arc::clone(&self.log),
            lease: Arc::clone(&self.lease),
            target,
            client,
            stream: None,
            unary_only: false,
        }
    }
}

/// Header of an AppendEntries request (its entries travel in binary).
#[derive(Serialize, Deserialize)]
struct AppendHeader {
    vote: Vote<NodeId>,
    prev_log_id: Option<JLogId>,
    leader_commit: Option<JLogId>,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Msg(String);

fn decode_reply<T: DeserializeOwned, E: DeserializeOwned + std::error::Error>(
    target: NodeId,
    reply: Result<tonic::Response<RaftReply>, tonic::Status>,
) -> Result<T, RPCError<NodeId, BasicNode, E>> {
    let reply = reply.map_err(|s| {
        if peer_unreachable(s.code()) {
            RPCError::Unreachable(Unreachable::new(&Msg(s.to_string())))
        } else {
            RPCError::Network(NetworkError::new(&Msg(s.to_string())))
        }
    })?;
    let r: Result<T, E> = serde_json::from_slice(&reply.into_inner().json)
        .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
    r.map_err(|e| RPCError::RemoteError(RemoteError::new(target, e)))
}

/// Whether a failed call to a peer means the peer (or the way to it) is down, so openraft backs
/// off (`peer_backoff`) instead of retrying at once. Besides refused connections (Unavailable)
/// and timeouts, a connection accepted and closed at once (a proxy or sidecar whose upstream is
/// gone, a peer shutting down) fails as Cancelled or Unknown: as a plain network error, openraft
/// retried it at once, about 2,000 times a second per shard, each attempt logged twice.
fn peer_unreachable(code: tonic::Code) -> bool {
    matches!(
        code,
        tonic::Code::Unavailable
            | tonic::Code::DeadlineExceeded
            | tonic::Code::Cancelled
            | tonic::Code::Unknown
    )
}

/// The pauses before each retry at an unreachable peer: 100 ms doubling to 500 ms (openraft's
/// own constant 500 ms), reset by the first call that succeeds.
fn peer_backoff() -> impl Iterator<Item = Duration> {
    (0u32..).map(|i| Duration::from_millis(100u64.saturating_mul(1 << i.min(3)).min(500)))
}

impl PeerConn {
    fn client<E: std::error::Error>(
        &self,
    ) -> Result<RaftClient<Channel>, RPCError<NodeId, BasicNode, E>> {
        self.client
            .clone()
            .map_err(|e| RPCError::Unreachable(Unreachable::new(&Msg(e))))
    }
}

impl PeerConn {
    /// Sends one AppendEntries over the peer stream (opening it first if needed) and waits
    /// for its reply; answers as the unary call would. openraft bounds each call by its
    /// heartbeat interval and drops the call when that passes: the stream then stays, and the
    /// late reply is skipped by its `seq` (reopening a stream under load, when such timeouts
    /// happen, costs a round trip and more work on a busy follower). A stream that failed, or
    /// whose last `RAFT_STREAM_MAX_ABANDONED` calls were all abandoned, is dropped and the next
    /// call opens a new one. A target that does not know the stream gets this and every later
    /// message of the session as a unary call.
    async fn append_on_stream(
        &mut self,
        msg: RaftAppendRequest,
        option: &RPCOption,
    ) -> Result<tonic::Response<RaftReply>, tonic::Status> {
        let PeerConn {
            shard,
            target,
            client,
            stream: slot,
            unary_only,
            ..
        } = self;
        let exchange = async {
            if slot
                .as_ref()
                .is_some_and(|s| s.abandoned >= RAFT_STREAM_MAX_ABANDONED)
            {
                *slot = None;
            }
            let stream = match slot {
                Some(s) => s,
                None => {
                    let mut c = client.clone().map_err(tonic::Status::unavailable)?;
                    let (tx, rx) = tokio::sync::mpsc::channel(RAFT_STREAM_QUEUE);
                    match c
                        .append_entries_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
                        .await
                    {
                        Ok(r) => slot.insert(RaftStream {
                            tx,
                            rx: r.into_inner(),
                            next_seq: 0,
                            in_flight: false,
                            abandoned: 0,
                        }),
                        Err(s) if s.code() == tonic::Code::Unimplemented => {
                            tracing::info!(
                                shard = *shard,
                                target = *target,
                                "peer has no AppendEntries stream; using unary calls"
                            );
                            *unary_only = true;
                            return c.append_entries(msg).await.map(|r| r.into_inner());
                        }
                        Err(s) => return Err(s),
                    }
                }
            };
            if stream.in_flight {
                // The previous call was dropped before its reply came.
                stream.abandoned += 1;
            }
            let seq = stream.next_seq;
            stream.next_seq += 1;
            stream
                .tx
                .send(RaftAppendStreamRequest {
                    seq,
                    append: Some(msg),
                })
                .await
                .map_err(|_| tonic::Status::unavailable("raft stream to the peer closed"))?;
            stream.in_flight = true;
            loop {
                let r =
                    stream.rx.message().await?.ok_or_else(|| {
                        tonic::Status::unavailable("raft stream ended by the peer")
                    })?;
                // A reply to an earlier request whose caller gave up: skip it.
                if r.seq < seq {
                    continue;
                }
                if r.seq != seq {
                    return Err(tonic::Status::internal(format!(
                        "raft stream reply {} to request {seq}",
                        r.seq
                    )));
                }
                stream.in_flight = false;
                stream.abandoned = 0;
                return match (r.reply, r.error) {
                    (_, Some(e)) => Err(tonic::Status::new(tonic::Code::from(e.code), e.message)),
                    (Some(reply), None) => Ok(reply),
                    (None, None) => Err(tonic::Status::internal("raft stream reply is empty")),
                };
            }
        };
        // openraft's own timeout (the same `hard_ttl`) normally ends the call first, as a
        // timeout; this one only guards a caller that sets none.
        let res = match tokio::time::timeout(option.hard_ttl() * 2, exchange).await {
            Ok(r) => r,
            Err(_) => Err(tonic::Status::deadline_exceeded(
                "raft stream: no reply in time",
            )),
        };
        if res.is_err() {
            *slot = None;
        }
        res.map(tonic::Response::new)
    }
}

fn with_timeout<T>(msg: T, option: &RPCOption) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.set_timeout(option.hard_ttl());
    req
}

impl RaftNetwork<TypeConfig> for PeerConn {
    fn backoff(&self) -> openraft::network::Backoff {
        openraft::network::Backoff::new(peer_backoff())
    }

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        let header = AppendHeader {
            vote: rpc.vote,
            prev_log_id: rpc.prev_log_id,
            leader_commit: self.log.durable_commit(rpc.leader_commit),
        };
        let msg = RaftAppendRequest {
            shard: self.shard,
            header: serde_json::to_vec(&header)
                .map_err(|e| RPCError::Network(NetworkError::new(&e)))?,
            entries: rpc.entries.iter().map(encode_wire).collect(),
        };
        // Taken before sending: the follower's lease starts later, when it receives this.
        let sent = std::time::Instant::now();
        let reply = if self.unary_only {
            let mut c = self.client()?;
            c.append_entries(with_timeout(msg, &option)).await
        } else {
            self.append_on_stream(msg, &option).await
        };
        let resp: AppendEntriesResponse<NodeId> = decode_reply(self.target, reply)?;
        match resp {
            AppendEntriesResponse::Success
            | AppendEntriesResponse::PartialSuccess(_)
            | AppendEntriesResponse::Conflict => {
                self.lease.acked(self.target, rpc.vote, sent);
                self.lease.heard(self.target, std::time::Instant::now());
            }
            AppendEntriesResponse::HigherVote(_) => {}
        }
        Ok(resp)
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        let msg = RaftMessage {
            shard: self.shard,
            json: serde_json::to_vec(&rpc).map_err(|e| RPCError::Network(NetworkError::new(&e)))?,
        };
        let mut c = self.client()?;
        decode_reply(
            self.target,
            c.install_snapshot(with_timeout(msg, &option)).await,
        )
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        let msg = RaftMessage {
            shard: self.shard,
            json: serde_json::to_vec(&rpc).map_err(|e| RPCError::Network(NetworkError::new(&e)))?,
        };
        let mut c = self.client()?;
        decode_reply(self.target, c.vote(with_timeout(msg, &option)).await)
    }
}

/// Rebuilds an AppendEntries request received over the wire.
pub fn decode_append(req: &RaftAppendRequest) -> Result<AppendEntriesRequest<TypeConfig>, String> {
    let h: AppendHeader = serde_json::from_slice(&req.header).map_err(|e| e.to_string())?;
    let entries = req
        .entries
        .iter()
        .map(|b| decode_wire(b).map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(AppendEntriesRequest {
        vote: h.vote,
        prev_log_id: h.prev_log_id,
        leader_commit: h.leader_commit,
        entries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreachable_peer_is_retried_after_growing_pauses() {
        let pauses: Vec<u64> = peer_backoff()
            .take(6)
            .map(|d| d.as_millis() as u64)
            .collect();
        assert_eq!(pauses, vec![100, 200, 400, 500, 500, 500]);
        // Far on, still bounded (no overflow of the shift).
        assert_eq!(peer_backoff().nth(100), Some(Duration::from_millis(500)));
    }

    #[test]
    fn connection_failures_back_off_and_answers_do_not() {
        for c in [
            tonic::Code::Unavailable,
            tonic::Code::DeadlineExceeded,
            tonic::Code::Cancelled,
            tonic::Code::Unknown,
        ] {
            assert!(peer_unreachable(c), "{c:?}");
        }
        for c in [
            tonic::Code::InvalidArgument,
            tonic::Code::Internal,
            tonic::Code::NotFound,
            tonic::Code::ResourceExhausted,
        ] {
            assert!(!peer_unreachable(c), "{c:?}");
        }
    }
}
