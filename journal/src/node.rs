//! One journal node: opens every shard (storage + Raft group), forms a fresh cluster by
//! itself, stamps and proposes appends in order, appends idle ticks, batches ReadIndex rounds,
//! turns applied trims into snapshot + purge, and serves the gRPC services on one listener.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, Raft, ServerState, SnapshotPolicy};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::clock;
use crate::error::ShardError;
use crate::log_store::{ErrorList, LogShared, LogStore, OpenError};
use crate::network::{Network, Peers};
use crate::state_machine::{SmShared, StateMachine};
use crate::types::{JournalRequest, NodeId, TypeConfig};

/// Largest payload of one entry.
pub const MAX_ENTRY_BYTES: usize = 2 * 1024 * 1024;
/// Largest sum of payloads in one Append call.
pub const MAX_APPEND_BYTES: usize = 16 * 1024 * 1024;
/// Largest number of payloads in one Append call.
pub const MAX_APPEND_ENTRIES: usize = 10_000;
/// Queued proposals per shard before appenders wait.
pub const PROPOSAL_QUEUE: usize = 4096;
/// Queued ReadIndex callers per shard before callers wait.
pub const READ_INDEX_QUEUE: usize = 4096;
/// Raft timing (ms): heartbeats, and the election timeout range.
pub const HEARTBEAT_MS: u64 = 100;
pub const ELECTION_TIMEOUT_MIN_MS: u64 = 1000;
pub const ELECTION_TIMEOUT_MAX_MS: u64 = 2000;
/// Entries per AppendEntries message.
pub const MAX_PAYLOAD_ENTRIES: u64 = 1024;
/// Default interval after which an idle shard gets a tick.
pub const DEFAULT_IDLE_TICK: Duration = Duration::from_millis(500);

/// Why a node could not start or serve.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("shard {shard}: {source}")]
    Open { shard: u32, source: OpenError },
    #[error("shard {shard}: state machine: {source}")]
    StateMachine {
        shard: u32,
        source: crate::meta::MetaError,
    },
    #[error("raft config: {0}")]
    Config(#[from] openraft::ConfigError),
    #[error("shard {shard}: raft: {reason}")]
    Raft { shard: u32, reason: String },
    #[error("the node's own id {0} is not in --peers")]
    NotInPeers(NodeId),
    #[error("serving gRPC: {0}")]
    Serve(#[from] tonic::transport::Error),
}

/// How to run a node.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub id: NodeId,
    /// Every member of the initial cluster (including this node): id -> `host:port`. Also the
    /// addresses this node dials, overriding those recorded in the membership.
    pub peers: BTreeMap<NodeId, String>,
    pub data_dir: PathBuf,
    pub shards: u32,
    pub idle_tick: Duration,
    /// A node added to an existing cluster (`replace-node`): never initialises a shard.
    pub join: bool,
    /// Size at which a segment file is closed and a new one started.
    pub segment_bytes: u64,
}

enum Proposal {
    Append {
        payloads: Vec<Vec<u8>>,
        reply: oneshot::Sender<Result<Vec<u64>, ShardError>>,
    },
    Trim {
        below: u64,
        reply: oneshot::Sender<Result<u64, ShardError>>,
    },
}

type ReadIndexWaiter = oneshot::Sender<Result<u64, ShardError>>;

/// One shard on this node.
pub struct Shard {
    pub id: u32,
    pub node_id: NodeId,
    pub raft: Raft<TypeConfig>,
    pub log: Arc<LogShared>,
    pub sm: Arc<SmShared>,
    peers: Arc<Peers>,
    proposals: mpsc::Sender<Proposal>,
    read_index: mpsc::Sender<ReadIndexWaiter>,
}

impl Shard {
    fn unavailable(&self, reason: impl Into<String>) -> ShardError {
        ShardError::Unavailable {
            shard: self.id,
            reason: reason.into(),
        }
    }

    /// The current leader (id and the address to reach it), as this node knows it.
    pub fn leader(&self) -> (Option<NodeId>, Option<String>) {
        let m = self.raft.metrics();
        let m = m.borrow();
        let id = m.current_leader;
        let addr = id.and_then(|id| {
            let recorded = m
                .membership_config
                .membership()
                .get_node(&id)
                .map(|n| n.addr.clone())
                .unwrap_or_default();
            let a = self.peers.addr_of(id, &recorded);
            (!a.is_empty()).then_some(a)
        });
        (id, addr)
    }

    fn not_leader(&self) -> ShardError {
        ShardError::NotLeader {
            shard: self.id,
            leader_addr: self.leader().1,
        }
    }

    fn is_leader(&self) -> bool {
        let m = self.raft.metrics();
        let m = m.borrow();
        m.current_leader == Some(self.node_id) && m.state == ServerState::Leader
    }

    fn map_write_error(
        &self,
        e: RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>,
    ) -> ShardError {
        match e {
            RaftError::APIError(ClientWriteError::ForwardToLeader(_)) => self.not_leader(),
            RaftError::APIError(ClientWriteError::ChangeMembershipError(c)) => {
                ShardError::Invalid(c.to_string())
            }
            RaftError::Fatal(f) => self.fatal(f.to_string()),
        }
    }

    fn fatal(&self, reason: String) -> ShardError {
        if self.log.failed() {
            ShardError::Storage {
                shard: self.id,
                reason,
            }
        } else {
            self.unavailable(reason)
        }
    }

    /// Appends payloads; answers with their indexes once they are committed (durable on a
    /// majority) and applied on this leader.
    pub async fn append(&self, payloads: Vec<Vec<u8>>) -> Result<Vec<u64>, ShardError> {
        if payloads.is_empty() {
            return Ok(Vec::new());
        }
        if self.log.failed() {
            return Err(ShardError::Storage {
                shard: self.id,
                reason: "an earlier write or fsync failed; see status errors".into(),
            });
        }
        let (tx, rx) = oneshot::channel();
        self.proposals
            .send(Proposal::Append {
                payloads,
                reply: tx,
            })
            .await
            .map_err(|_| self.unavailable("shutting down"))?;
        rx.await.map_err(|_| self.unavailable("shutting down"))?
    }

    /// Proposes a trim; answers with the first index that will be retained.
    pub async fn trim(&self, below: u64) -> Result<u64, ShardError> {
        let (tx, rx) = oneshot::channel();
        self.proposals
            .send(Proposal::Trim { below, reply: tx })
            .await
            .map_err(|_| self.unavailable("shutting down"))?;
        rx.await.map_err(|_| self.unavailable("shutting down"))?
    }

    /// An index safe for a linearizable read; concurrent callers share one quorum round.
    pub async fn read_index(&self) -> Result<u64, ShardError> {
        let (tx, rx) = oneshot::channel();
        self.read_index
            .send(tx)
            .await
            .map_err(|_| self.unavailable("shutting down"))?;
        rx.await.map_err(|_| self.unavailable("shutting down"))?
    }
}

/// Orders, stamps and proposes one shard's entries; appends idle ticks.
async fn proposer(shard: Arc<Shard>, mut rx: mpsc::Receiver<Proposal>, idle_tick: Duration) {
    let mut last_stamp = i64::MIN;
    let mut last_activity = Instant::now();
    let mut stamp = |shard: &Shard| {
        let t = clock::stamp(clock::now_ms(), last_stamp.max(shard.log.last_time_ms()));
        last_stamp = t;
        t
    };
    loop {
        let proposal = tokio::select! {
            p = rx.recv() => match p {
                Some(p) => p,
                None => return,
            },
            _ = tokio::time::sleep_until(last_activity + idle_tick) => {
                last_activity = Instant::now();
                if shard.is_leader() {
                    let time_ms = stamp(&shard);
                    match shard.raft.client_write_ff(JournalRequest::Tick { time_ms }).await {
                        // Nobody waits for a tick; keep its responder alive until it is done.
                        Ok(r) => drop(tokio::spawn(r)),
                        Err(e) => tracing::debug!(shard = shard.id, error = %e, "idle tick not proposed"),
                    }
                }
                continue;
            }
        };
        last_activity = Instant::now();
        match proposal {
            Proposal::Append { payloads, reply } => {
                if !shard.is_leader() {
                    let _ = reply.send(Err(shard.not_leader()));
                    continue;
                }
                let mut receivers = Vec::with_capacity(payloads.len());
                let mut failed = None;
                for payload in payloads {
                    let time_ms = stamp(&shard);
                    match shard
                        .raft
                        .client_write_ff(JournalRequest::Data { time_ms, payload })
                        .await
                    {
                        Ok(r) => receivers.push(r),
                        Err(e) => {
                            failed = Some(shard.fatal(e.to_string()));
                            break;
                        }
                    }
                }
                let s = Arc::clone(&shard);
                tokio::spawn(async move {
                    let mut indexes = Vec::with_capacity(receivers.len());
                    for r in receivers {
                        match r.await {
                            Ok(Ok(resp)) => indexes.push(resp.log_id.index),
                            Ok(Err(e)) => {
                                let _ = reply.send(Err(s.map_write_error(RaftError::APIError(e))));
                                return;
                            }
                            Err(_) => {
                                let _ = reply.send(Err(s.fatal("raft stopped".into())));
                                return;
                            }
                        }
                    }
                    let _ = reply.send(match failed {
                        Some(e) => Err(e),
                        None => Ok(indexes),
                    });
                });
            }
            Proposal::Trim { below, reply } => {
                if !shard.is_leader() {
                    let _ = reply.send(Err(shard.not_leader()));
                    continue;
                }
                let time_ms = stamp(&shard);
                let s = Arc::clone(&shard);
                match shard
                    .raft
                    .client_write_ff(JournalRequest::Trim { time_ms, below })
                    .await
                {
                    Ok(r) => {
                        tokio::spawn(async move {
                            let res = match r.await {
                                Ok(Ok(resp)) => Ok(below.min(resp.log_id.index)),
                                Ok(Err(e)) => Err(s.map_write_error(RaftError::APIError(e))),
                                Err(_) => Err(s.fatal("raft stopped".into())),
                            };
                            let _ = reply.send(res);
                        });
                    }
                    Err(e) => {
                        let _ = reply.send(Err(shard.fatal(e.to_string())));
                    }
                }
            }
        }
    }
}

/// Serves ReadIndex callers: every caller queued when a round starts shares that round.
async fn read_index_loop(shard: Arc<Shard>, mut rx: mpsc::Receiver<ReadIndexWaiter>) {
    while let Some(first) = rx.recv().await {
        let mut waiters = vec![first];
        while let Ok(w) = rx.try_recv() {
            waiters.push(w);
        }
        let res = match shard.raft.ensure_linearizable().await {
            Ok(l) => Ok(l.map_or(0, |l| l.index)),
            Err(RaftError::APIError(_)) => Err(shard.not_leader()),
            Err(RaftError::Fatal(f)) => Err(shard.fatal(f.to_string())),
        };
        for w in waiters {
            let _ = w.send(res.clone());
        }
    }
}

/// Turns an applied trim into a snapshot at the trim point; openraft then purges up to it.
async fn trim_loop(shard: Arc<Shard>) {
    let mut rx = shard.sm.trim_target.subscribe();
    loop {
        let target = *rx.borrow_and_update();
        if target > shard.log.first_index() {
            tracing::info!(shard = shard.id, below = target, "trimming the journal");
            if let Err(e) = shard.raft.trigger().snapshot().await {
                tracing::warn!(shard = shard.id, error = %e, "could not trigger the trim snapshot");
            }
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// A running journal node.
pub struct JournalNode {
    pub id: NodeId,
    pub shards: Vec<Arc<Shard>>,
    pub errors: ErrorList,
    pub peers: Arc<Peers>,
    /// Set when the node stops: open read streams end so a graceful shutdown completes.
    pub stopping: tokio::sync::watch::Sender<bool>,
}

impl JournalNode {
    /// Opens (recovering) every shard and starts its Raft group. A fresh node that is not
    /// joining initialises each shard with `peers` as its voters (every node does the same,
    /// which openraft allows); the node `peers[shard % n]` then campaigns first, so leaders
    /// spread over the nodes.
    pub async fn open(config: NodeConfig) -> Result<Arc<Self>, NodeError> {
        if !config.peers.contains_key(&config.id) {
            return Err(NodeError::NotInPeers(config.id));
        }
        let peers = Arc::new(Peers::new(config.peers.clone()));
        let errors: ErrorList = Arc::default();
        let raft_config = Arc::new(
            openraft::Config {
                heartbeat_interval: HEARTBEAT_MS,
                election_timeout_min: ELECTION_TIMEOUT_MIN_MS,
                election_timeout_max: ELECTION_TIMEOUT_MAX_MS,
                snapshot_policy: SnapshotPolicy::Never,
                max_in_snapshot_log_to_keep: 0,
                purge_batch_size: 1,
                max_payload_entries: MAX_PAYLOAD_ENTRIES,
                ..Default::default()
            }
            .validate()?,
        );
        let ids: Vec<NodeId> = config.peers.keys().copied().collect();
        let members: BTreeMap<NodeId, BasicNode> = config
            .peers
            .iter()
            .map(|(id, a)| (*id, BasicNode::new(a.clone())))
            .collect();
        let mut shards = Vec::new();
        for s in 0..config.shards {
            let dir = config.data_dir.join(format!("shard-{s}"));
            let (log, report) = LogShared::open(&dir, s, config.segment_bytes, Arc::clone(&errors))
                .map_err(|source| NodeError::Open { shard: s, source })?;
            tracing::info!(
                shard = s,
                segments = report.segments,
                frames = report.frames,
                torn_tail_cut_bytes = report.torn_tail_cut_bytes,
                first_index = log.first_index(),
                next_index = log.next_index(),
                "journal shard storage recovered"
            );
            let sm = StateMachine::open(&dir, Arc::clone(&log))
                .map_err(|source| NodeError::StateMachine { shard: s, source })?;
            let sm_shared = Arc::clone(&sm.shared);
            let network = Network {
                shard: s,
                peers: Arc::clone(&peers),
            };
            let raft = Raft::new(
                config.id,
                Arc::clone(&raft_config),
                network,
                LogStore {
                    shared: Arc::clone(&log),
                },
                sm,
            )
            .await
            .map_err(|e| NodeError::Raft {
                shard: s,
                reason: e.to_string(),
            })?;
            let (ptx, prx) = mpsc::channel(PROPOSAL_QUEUE);
            let (rtx, rrx) = mpsc::channel(READ_INDEX_QUEUE);
            let shard = Arc::new(Shard {
                id: s,
                node_id: config.id,
                raft,
                log,
                sm: sm_shared,
                peers: Arc::clone(&peers),
                proposals: ptx,
                read_index: rtx,
            });
            tokio::spawn(proposer(Arc::clone(&shard), prx, config.idle_tick));
            tokio::spawn(read_index_loop(Arc::clone(&shard), rrx));
            tokio::spawn(trim_loop(Arc::clone(&shard)));
            if !config.join {
                match shard.raft.initialize(members.clone()).await {
                    Ok(()) => {
                        let designated = ids[(s as usize) % ids.len()];
                        if designated == config.id {
                            let _ = shard.raft.trigger().elect().await;
                        }
                        tracing::info!(shard = s, "initialised a fresh shard");
                    }
                    Err(RaftError::APIError(_)) => {} // already initialised: a restart
                    Err(RaftError::Fatal(f)) => {
                        return Err(NodeError::Raft {
                            shard: s,
                            reason: f.to_string(),
                        });
                    }
                }
            }
            shards.push(shard);
        }
        Ok(Arc::new(JournalNode {
            id: config.id,
            shards,
            errors,
            peers,
            stopping: tokio::sync::watch::Sender::new(false),
        }))
    }

    /// The shard `id`, or the unknown-shard error.
    pub fn shard(&self, id: u32) -> Result<&Arc<Shard>, ShardError> {
        self.shards
            .get(id as usize)
            .ok_or(ShardError::UnknownShard {
                shard: id,
                count: self.shards.len() as u32,
            })
    }

    /// Serves the journal, admin and Raft services on `listener` until `shutdown` resolves,
    /// then stops every Raft group.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send,
    ) -> Result<(), NodeError> {
        let router = crate::service::router(Arc::clone(&self));
        // tonic's `tcp_nodelay` does not reach sockets given through `serve_with_incoming`: set
        // it here, or small responses wait on Nagle's algorithm.
        let incoming = futures::StreamExt::map(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            |s| {
                if let Ok(s) = &s {
                    let _ = s.set_nodelay(true);
                }
                s
            },
        );
        let node = Arc::clone(&self);
        let shutdown = async move {
            shutdown.await;
            node.stopping.send_replace(true);
        };
        let res = router
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await;
        self.stop().await;
        res.map_err(NodeError::from)
    }

    /// Stops every Raft group and flusher.
    pub async fn stop(&self) {
        for s in &self.shards {
            let _ = s.raft.shutdown().await;
            s.log.close();
        }
    }

    /// Voter ids of a shard as this node knows them.
    pub fn voters(&self, shard: &Shard) -> BTreeSet<NodeId> {
        shard
            .raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .collect()
    }
}
