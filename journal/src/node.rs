//! One journal node: opens every shard (storage + Raft group), forms a fresh cluster by
//! itself, stamps and proposes appends in order, appends idle ticks, batches ReadIndex rounds,
//! turns applied trims into snapshot + purge, and serves the gRPC services on one listener.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, Raft, ServerState, SnapshotPolicy};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::time::Instant;

use crate::clock;
use crate::error::ShardError;
use crate::gate::ProposalGate;
use crate::lease::{LeaseClock, QuorumCheck};
use crate::log_store::{ErrorList, LogShared, LogStore, OpenError};
use crate::network::{Network, Peers};
use crate::state_machine::{SmShared, StateMachine};
use crate::types::{JournalRequest, NodeId, Payloads, TypeConfig};

/// How long a new leader with nothing to go on from waits for the other voters' clocks before
/// its first stamp (crate::clock): once per process and shard, only after every node
/// restarted; a peer that does not answer by then is left out.
pub const PEER_CLOCK_TIMEOUT: Duration = Duration::from_millis(500);
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
/// A leader that no quorum acknowledged for this long stops acting as leader (etcd's
/// CheckQuorum, `crate::lease::QuorumCheck`): by then the other voters may have elected one.
pub const STEP_DOWN_AFTER: Duration = Duration::from_millis(ELECTION_TIMEOUT_MAX_MS);
/// Entries per AppendEntries message.
pub const MAX_PAYLOAD_ENTRIES: u64 = 1024;
/// Default number of Raft entries of client payloads proposed and not yet committed, per
/// shard. Append calls that arrive while this many are in flight queue up and are coalesced
/// into the next entry, so under load one entry (one trip through openraft, one fsync per
/// node) carries many records.
pub const DEFAULT_MAX_INFLIGHT_ENTRIES: usize = 2;
/// Default longest wait, once an in-flight slot is free, for the callers answered by the last
/// completed entry to come back before proposing (never waited for when that entry had a
/// single caller, so a lone appender sees no added latency).
/// Off: a 3-run A/B at 1 and 256 appenders (docs/benchmarks/journal.md, session 3) measured
/// 1500us and 0 within noise of each other, so no timer is kept.
pub const DEFAULT_COALESCE_WAIT: Duration = Duration::ZERO;
/// Coalescing stops adding further Append calls to an entry at this many payload bytes...
pub const MAX_BATCH_BYTES: usize = 1024 * 1024;
/// ...or at this many records (a single larger call still goes whole into one entry).
pub const MAX_BATCH_RECORDS: usize = 4096;
/// Default leader lease for ReadIndex: a leader that a quorum acknowledged less than this long
/// ago answers from it without a round to the followers. Followers refuse votes for
/// `ELECTION_TIMEOUT_MAX_MS` after they last heard from the leader; the lease keeps half of
/// that as the margin for clock rate differences and scheduling (docs/journal.md).
pub const DEFAULT_READ_LEASE: Duration = Duration::from_millis(ELECTION_TIMEOUT_MAX_MS / 2);
/// Longest accepted `--read-lease`: below the followers' vote refusal with a margin.
pub const MAX_READ_LEASE: Duration = Duration::from_millis(ELECTION_TIMEOUT_MAX_MS * 3 / 4);
/// Default interval after which an idle shard gets a tick.
pub const DEFAULT_IDLE_TICK: Duration = Duration::from_millis(500);
/// Longest accepted idle tick. Replicas count at most 1 s of journal time between two
/// consecutive stamps towards lease expiry (a longer gap is an outage: memstore's
/// `DEFAULT_LEASE_CLOCK_MAX_STEP_MS`), so an idle shard must be stamped well within that (timer
/// lateness and stamping add to the tick) or its leases would age slower than time.
pub const MAX_IDLE_TICK: Duration = Duration::from_millis(500);

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
    #[error(
        "shard {shard}: this node (id {id}) starts with no data, but the shard's leader (node \
         {leader}) has seen it acknowledge entries: its data was lost. Rejoining with an empty log \
         could lose committed entries; start it as a new node (a new --id with --join) and \
         replace node {id} with `strata journal replace-node` (docs/OPERATIONS.md)"
    )]
    LostData {
        shard: u32,
        id: NodeId,
        leader: NodeId,
    },
    #[error(
        "an earlier start found this node's data lost ({why}); remove {} only once the node \
         was replaced (docs/OPERATIONS.md)",
        marker.display()
    )]
    DataLostBefore { marker: PathBuf, why: String },
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
    /// Batching of Append calls into Raft entries.
    pub batching: Batching,
    /// A leader fsyncs its own appends in parallel with replicating them (default), instead
    /// of before (see `LogStore::append`).
    pub overlap_leader_fsync: bool,
    /// Leader lease for ReadIndex (`DEFAULT_READ_LEASE`; zero: every ReadIndex is a quorum
    /// round). At most `MAX_READ_LEASE`.
    pub read_lease: Duration,
    /// Automatic leader hand-off: a shard is handed back to its preferred node once that node
    /// has been alive and caught up this long (`None`: only on an admin's request).
    pub handoff_settle: Option<Duration>,
    /// Testing only: answer UNIMPLEMENTED to the stream RPCs (`AppendStream`,
    /// `AppendEntriesStream`), as a node built before them would, so peers and clients use the
    /// unary calls with this node.
    pub refuse_streams: bool,
    /// Internal TLS: served to clients and peers, and used to dial peers (None: plaintext).
    pub tls: Option<Arc<crate::tls::InternalTls>>,
}

/// How Append calls are coalesced into Raft entries (see `DEFAULT_MAX_INFLIGHT_ENTRIES` and
/// `DEFAULT_COALESCE_WAIT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batching {
    pub max_inflight_entries: usize,
    pub coalesce_wait: Duration,
}

impl Default for Batching {
    fn default() -> Self {
        Batching {
            max_inflight_entries: DEFAULT_MAX_INFLIGHT_ENTRIES,
            coalesce_wait: DEFAULT_COALESCE_WAIT,
        }
    }
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
    /// When followers last acknowledged this node's leadership.
    pub(crate) lease: Arc<LeaseClock>,
    /// Whether this node, leading, has gone `STEP_DOWN_AFTER` without a quorum's
    /// acknowledgement (`quorum_loop`).
    pub(crate) quorum: QuorumCheck,
    /// The node that led this shard when the cluster formed (`ids[shard % n]`): leadership is
    /// handed back to it after a failover (`crate::handoff`).
    pub preferred: NodeId,
    /// Closed while this node hands its leadership to another: the shard then holds appends,
    /// trims and read indexes back, and sends no ticks or heartbeats.
    pub(crate) gate: ProposalGate,
    /// A term in which this node asked another to campaign (a hand-off): no lease answers in
    /// it any more, even if the hand-off failed (`crate::handoff`); read indexes take rounds.
    lease_revoked_term: AtomicU64,
    read_lease: Duration,
    /// How long a reader waiting at the end of this node's log waits for the next applied
    /// entry before its stream ends "unavailable": a healthy shard applies an idle tick every
    /// 500 ms, so silence means this node is cut off from its leader (or is a leader without
    /// its quorum), and the reader's client goes on at another node instead of waiting here
    /// for records that the shard commits elsewhere.
    pub(crate) tail_stall: Duration,
    /// A node restarted with a vote on disk refuses vote requests until then (its followers'
    /// refusal to vote, which leases rely on, was lost with the process).
    votes_held_until: Option<std::time::Instant>,
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
        // A node whose storage failed has stopped its Raft group, and one that lost its quorum
        // has stopped acting as leader: either leads nothing any more, whatever its last
        // metrics say.
        let id = m
            .current_leader
            .filter(|l| !(*l == self.node_id && (self.log.failed() || self.quorum.lost())));
        let addr = id.and_then(|id| {
            let a = self.member_addr(m.membership_config.membership(), id);
            (!a.is_empty()).then_some(a)
        });
        (id, addr)
    }

    /// The address to dial member `id` of `membership` at: `--peers` wins over the address the
    /// membership records (empty if neither knows it).
    pub(crate) fn member_addr(
        &self,
        membership: &openraft::Membership<NodeId, BasicNode>,
        id: NodeId,
    ) -> String {
        let recorded = membership
            .get_node(&id)
            .map(|n| n.addr.clone())
            .unwrap_or_default();
        self.peers.addr_of(id, &recorded)
    }

    /// The wall clocks of this shard's other voters that answer within [`PEER_CLOCK_TIMEOUT`]
    /// (asked together; a node down, cut off or too old to know the call is left out).
    async fn peer_clocks(&self) -> Vec<i64> {
        use api::strata::journal::ClockRequest;
        use api::strata::journal::raft_client::RaftClient;
        let voters: Vec<String> = {
            let m = self.raft.metrics();
            let m = m.borrow();
            let membership = m.membership_config.membership();
            membership
                .voter_ids()
                .filter(|id| *id != self.node_id)
                .map(|id| self.member_addr(membership, id))
                .collect()
        };
        let asks = voters.into_iter().map(|addr| async move {
            let ch = self.peers.channel(&addr).ok()?;
            let mut req = tonic::Request::new(ClockRequest {});
            req.set_timeout(PEER_CLOCK_TIMEOUT);
            let mut client = RaftClient::new(ch);
            match tokio::time::timeout(PEER_CLOCK_TIMEOUT, client.clock(req)).await {
                Ok(Ok(r)) => Some(r.into_inner().wall_ms),
                _ => None,
            }
        });
        futures::future::join_all(asks)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// The hosts of every member of this shard, as its peers dial them.
    pub fn member_hosts(&self) -> Vec<String> {
        let m = self.raft.metrics();
        let m = m.borrow();
        m.membership_config
            .membership()
            .nodes()
            .map(|(id, n)| crate::tls::host_of(&self.peers.addr_of(*id, &n.addr)).to_string())
            .collect()
    }

    /// The first record a reader may ask for: what storage holds, raised to the trim point
    /// once storage has dropped the entries below the one holding it (whole entries are
    /// dropped, so the entry holding the trim point stays, its earlier records hidden).
    pub fn first_record(&self) -> u64 {
        let target = *self.sm.trim_target.borrow();
        match self.log.first_entry() {
            Some(h) if target < h.end_record() => h.first_record.max(target),
            Some(h) => h.first_record,
            None => self.log.first_record(),
        }
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

    /// Whether this node leads and takes appends and read indexes: not while it has lost its
    /// quorum (`crate::lease::QuorumCheck`).
    fn serves_as_leader(&self) -> bool {
        self.is_leader() && !self.quorum.lost()
    }

    /// What `QuorumCheck::observe` needs: this node's vote and its configuration's voter sets
    /// (two while joint) while it leads under a committed vote.
    fn leading(&self) -> Option<(openraft::Vote<NodeId>, Vec<BTreeSet<NodeId>>)> {
        let m = self.raft.metrics();
        let m = m.borrow();
        let membership = m.membership_config.membership();
        (m.state == ServerState::Leader
            && m.current_leader == Some(self.node_id)
            && m.vote.is_committed())
        .then(|| (m.vote, membership.get_joint_config().clone()))
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

    fn storage_failed(&self) -> ShardError {
        ShardError::Storage {
            shard: self.id,
            reason: "an earlier write or fsync failed; see status errors".into(),
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

    /// Appends payloads; answers with their record indexes once they are committed (durable on
    /// a majority) and applied on this leader.
    pub async fn append(&self, payloads: Vec<Vec<u8>>) -> Result<Vec<u64>, ShardError> {
        if payloads.is_empty() {
            return Ok(Vec::new());
        }
        if self.log.failed() {
            return Err(self.storage_failed());
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

    /// Proposes a trim; answers with the first record index that will be retained (the first
    /// record of the entry holding `below`: whole entries are trimmed).
    pub async fn trim(&self, below: u64) -> Result<u64, ShardError> {
        let (tx, rx) = oneshot::channel();
        self.proposals
            .send(Proposal::Trim { below, reply: tx })
            .await
            .map_err(|_| self.unavailable("shutting down"))?;
        rx.await.map_err(|_| self.unavailable("shutting down"))?
    }

    /// The node this shard's leadership is being handed to, if a hand-off is in progress.
    pub fn handing_to(&self) -> Option<NodeId> {
        self.gate.handing_to()
    }

    /// Returns once no hand-off is in progress.
    async fn handoff_ended(&self) {
        self.gate.opened().await
    }

    /// Starts a hand-off to `to`: from now on the shard proposes nothing and answers no read
    /// index (they wait for the hand-off to end, then go on here or are sent to the new
    /// leader), and sends no heartbeats.
    pub(crate) fn begin_handoff(&self, to: NodeId) {
        self.gate.close(to);
        self.raft.runtime_config().heartbeat(false);
    }

    /// Ends a hand-off, whatever its outcome: heartbeats and requests resume (a node that is
    /// no longer the leader answers them as a follower does).
    pub(crate) fn end_handoff(&self) {
        self.raft.runtime_config().heartbeat(true);
        self.gate.open();
    }

    /// No lease answers in `term` from now on: this node is about to ask another voter to
    /// campaign, and that voter's acknowledgements, which the lease counts on, do not stop its
    /// own campaign.
    pub(crate) fn revoke_lease(&self, term: u64) {
        self.lease_revoked_term.store(term, Ordering::Release);
    }

    /// True while this node, restarted, still refuses to vote (see `votes_held_until`).
    pub fn votes_held(&self) -> bool {
        self.votes_held_until
            .is_some_and(|t| std::time::Instant::now() < t)
    }

    /// The read index from the leader lease, without a round to the followers: `None` unless
    /// this node leads, has applied an entry of its own term (so every entry committed before
    /// it is applied), still holds its own vote on disk (it granted no other), the membership
    /// is not joint, and a quorum acknowledged a message sent less than `read_lease` ago.
    /// Every Append acknowledged before the call was acknowledged by this leader after
    /// applying it, so the applied end covers it.
    fn lease_read_index(&self) -> Option<u64> {
        if self.read_lease.is_zero() || self.log.failed() || self.handing_to().is_some() {
            return None;
        }
        let now = std::time::Instant::now();
        let (vote, voters) = {
            let m = self.raft.metrics();
            let m = m.borrow();
            let vote = m.vote;
            let term = vote.leader_id().get_term();
            let leading = term != self.lease_revoked_term.load(Ordering::Acquire)
                && m.state == ServerState::Leader
                && m.current_leader == Some(self.node_id)
                && vote.is_committed()
                && vote.leader_id().voted_for() == Some(self.node_id)
                && m.last_applied.is_some_and(|l| l.leader_id.term == term);
            let membership = m.membership_config.membership();
            if !leading || membership.get_joint_config().len() != 1 {
                return None;
            }
            (vote, membership.voter_ids().collect::<BTreeSet<_>>())
        };
        if self.log.vote() != Some(vote) {
            return None;
        }
        let since = self.lease.quorum_since(&vote, &voters, self.node_id, now)?;
        if now >= since + self.read_lease {
            return None;
        }
        Some(self.sm.applied_end.borrow().saturating_sub(1))
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

/// Append calls coalesced into one Raft entry: each caller's record count and reply.
type Waiters = Vec<(usize, oneshot::Sender<Result<Vec<u64>, ShardError>>)>;

/// The Raft entry being built from queued Append calls.
struct Batch {
    payloads: Payloads,
    bytes: usize,
    waiters: Waiters,
}

impl Batch {
    fn new(payloads: Vec<Vec<u8>>, reply: oneshot::Sender<Result<Vec<u64>, ShardError>>) -> Self {
        Batch {
            bytes: payloads.iter().map(Vec::len).sum(),
            waiters: vec![(payloads.len(), reply)],
            payloads: Payloads::from_vecs(&payloads),
        }
    }

    fn full(&self) -> bool {
        self.payloads.len() >= MAX_BATCH_RECORDS || self.bytes >= MAX_BATCH_BYTES
    }

    /// Adds `p` if it is an Append call that fits; otherwise gives it back.
    fn add(&mut self, p: Proposal) -> Option<Proposal> {
        match p {
            Proposal::Append { payloads, reply } => {
                let bytes: usize = payloads.iter().map(Vec::len).sum();
                if self.payloads.len() + payloads.len() > MAX_BATCH_RECORDS
                    || self.bytes + bytes > MAX_BATCH_BYTES
                {
                    return Some(Proposal::Append { payloads, reply });
                }
                self.bytes += bytes;
                self.waiters.push((payloads.len(), reply));
                self.payloads.extend(&payloads);
                None
            }
            other => Some(other),
        }
    }
}

/// The stamp of the next entry this node proposes for `shard` (crate::clock).
async fn next_stamp(stamps: &mut clock::StampClock, shard: &Shard) -> i64 {
    // Another leader's last entry, if this process appended it: a node that just took over
    // goes on from it, whatever its own clock says.
    if let Some((stamp, at)) = shard.log.last_appended() {
        stamps.saw(stamp, at);
    }
    let mut wall = clock::now_ms();
    if stamps.is_fresh() {
        // Nothing to go on from (every node restarted): the earliest clock of the voters.
        let peers = shard.peer_clocks().await;
        let own = wall;
        wall = clock::earliest(own, &peers);
        if wall < own {
            tracing::info!(
                shard = shard.id,
                own_ms = own,
                taken_ms = wall,
                answered = peers.len(),
                "first stamp from a voter's clock, earlier than this node's"
            );
        }
    }
    stamps.stamp(wall, std::time::Instant::now(), shard.log.last_time_ms())
}

/// Orders, stamps and proposes one shard's entries; appends idle ticks. Append calls queued
/// while `max_inflight_entries` entries are in flight are coalesced into one entry (bounded by
/// `MAX_BATCH_BYTES` / `MAX_BATCH_RECORDS`); each caller gets the record indexes of its own
/// payloads, in order.
async fn proposer(
    shard: Arc<Shard>,
    mut rx: mpsc::Receiver<Proposal>,
    idle_tick: Duration,
    batching: Batching,
) {
    let mut stamps = clock::StampClock::default();
    let mut last_activity = Instant::now();
    let inflight = Arc::new(Semaphore::new(batching.max_inflight_entries.max(1)));
    // Callers answered by the most recently committed entry: they tend to come back together.
    let last_done = Arc::new(AtomicUsize::new(0));
    // A proposal taken from the queue that did not fit into the entry being built.
    let mut carry: Option<Proposal> = None;
    loop {
        let proposal = match carry.take() {
            Some(p) => p,
            None => tokio::select! {
                p = rx.recv() => match p {
                    Some(p) => p,
                    None => return,
                },
                _ = tokio::time::sleep_until(last_activity + idle_tick) => {
                    last_activity = Instant::now();
                    let pass = shard.gate.pass();
                    if shard.is_leader() && pass.is_some() {
                        let time_ms = next_stamp(&mut stamps, &shard).await;
                        match shard.raft.client_write_ff(JournalRequest::Tick { time_ms }).await {
                            // Nobody waits for a tick; keep its responder alive until it is done.
                            Ok(r) => drop(tokio::spawn(r)),
                            Err(e) => tracing::debug!(shard = shard.id, error = %e, "idle tick not proposed"),
                        }
                    }
                    continue;
                }
            },
        };
        last_activity = Instant::now();
        match proposal {
            Proposal::Append { payloads, reply } => {
                shard.handoff_ended().await;
                if !shard.serves_as_leader() {
                    let _ = reply.send(Err(shard.not_leader()));
                    continue;
                }
                // Wait for an in-flight slot; calls arriving meanwhile queue up and join.
                let Ok(permit) = Arc::clone(&inflight).acquire_owned().await else {
                    return;
                };
                // Held until the entry is with Raft: a hand-off that began meanwhile waits for
                // it (crate::gate). If one is in progress, after it: propose here or send the
                // caller to the new leader.
                let _pass = shard.gate.pass_when_open().await;
                if !shard.serves_as_leader() {
                    let _ = reply.send(Err(shard.not_leader()));
                    continue;
                }
                let mut batch = Batch::new(payloads, reply);
                while carry.is_none() && !batch.full() {
                    match rx.try_recv() {
                        Ok(p) => carry = batch.add(p),
                        Err(_) => break,
                    }
                }
                // The callers of the entry that just committed are on their way back: give
                // them a moment to join, so entries stay large instead of alternating large
                // and tiny.
                let expected = last_done.load(Ordering::Relaxed);
                if expected > 1 && !batching.coalesce_wait.is_zero() {
                    let deadline = Instant::now() + batching.coalesce_wait;
                    while carry.is_none() && !batch.full() && batch.waiters.len() < expected {
                        match tokio::time::timeout_at(deadline, rx.recv()).await {
                            Ok(Some(p)) => carry = batch.add(p),
                            Ok(None) | Err(_) => break,
                        }
                    }
                }
                let time_ms = next_stamp(&mut stamps, &shard).await;
                let Batch {
                    payloads, waiters, ..
                } = batch;
                crate::metrics::proposed(shard.id, payloads.len());
                tracing::trace!(
                    shard = shard.id,
                    calls = waiters.len(),
                    records = payloads.len(),
                    "proposing a batch"
                );
                match shard
                    .raft
                    .client_write_ff(JournalRequest::Data { time_ms, payloads })
                    .await
                {
                    Ok(r) => {
                        let s = Arc::clone(&shard);
                        let done = Arc::clone(&last_done);
                        let lost = shard.quorum.wait_lost();
                        tokio::spawn(async move {
                            tokio::pin!(r);
                            let r = tokio::select! {
                                r = &mut r => r,
                                // The entry may still commit (if a follower got it and wins the
                                // election), or be dropped: the callers retry elsewhere, so a
                                // payload may be stored twice, as after any retried append.
                                () = lost => {
                                    answer(s.id, waiters, Err(s.unavailable(
                                        "the leader lost its quorum; the append's outcome is unknown",
                                    )));
                                    // The in-flight slot stays taken until Raft is done with it.
                                    let _ = r.await;
                                    drop(permit);
                                    return;
                                }
                            };
                            let res = match r {
                                // Committed by the followers, but this node's own write or
                                // fsync failed: it acknowledges nothing any more (the client
                                // retries elsewhere; a payload may then be stored twice).
                                Ok(Ok(_)) if s.log.failed() => Err(s.storage_failed()),
                                Ok(Ok(resp)) => Ok(resp.data),
                                Ok(Err(e)) => Err(s.map_write_error(RaftError::APIError(e))),
                                Err(_) => Err(s.fatal("raft stopped".into())),
                            };
                            done.store(waiters.len(), Ordering::Relaxed);
                            drop(permit);
                            answer(s.id, waiters, res);
                        });
                    }
                    Err(e) => answer(shard.id, waiters, Err(shard.fatal(e.to_string()))),
                }
            }
            Proposal::Trim { below, reply } => {
                let _pass = shard.gate.pass_when_open().await;
                if !shard.serves_as_leader() {
                    let _ = reply.send(Err(shard.not_leader()));
                    continue;
                }
                let time_ms = next_stamp(&mut stamps, &shard).await;
                let s = Arc::clone(&shard);
                match shard
                    .raft
                    .client_write_ff(JournalRequest::Trim { time_ms, below })
                    .await
                {
                    Ok(r) => {
                        tokio::spawn(async move {
                            let res = match r.await {
                                Ok(Ok(resp)) => Ok(resp.data),
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

/// Answers the Append calls of one entry: `first` is the entry's first record index; each
/// caller gets the consecutive indexes of its own payloads.
fn answer(shard: u32, waiters: Waiters, first: Result<u64, ShardError>) {
    match first {
        Ok(mut next) => {
            let records = waiters.iter().map(|(n, _)| n).sum();
            crate::metrics::appended(shard, waiters.len(), records);
            for (n, reply) in waiters {
                let indexes: Vec<u64> = (next..next + n as u64).collect();
                next += n as u64;
                let _ = reply.send(Ok(indexes));
            }
        }
        Err(e) => {
            for (_, reply) in waiters {
                let _ = reply.send(Err(e.clone()));
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
        // During a hand-off: no lease answer, and no round (its heartbeats would renew the
        // followers' vote refusal). After it, the lease is revoked for this term, and a round
        // on a node that no longer leads answers with the new leader's address.
        shard.handoff_ended().await;
        if shard.quorum.lost() {
            for w in waiters {
                let _ = w.send(Err(shard.not_leader()));
            }
            continue;
        }
        if let Some(index) = shard.lease_read_index() {
            crate::metrics::read_index(shard.id, true, waiters.len());
            for w in waiters {
                let _ = w.send(Ok(index));
            }
            continue;
        }
        crate::metrics::read_index(shard.id, false, waiters.len());
        let lost = shard.quorum.wait_lost();
        let round = tokio::select! {
            r = shard.raft.ensure_linearizable() => r,
            () = lost => {
                for w in waiters {
                    let _ = w.send(Err(shard.not_leader()));
                }
                continue;
            }
        };
        let res = match round {
            // The last record of the read entry; it is applied here, hence still in the log
            // unless a trim dropped it, and then the applied end is a safe (later) index.
            Ok(l) => Ok(l.and_then(|l| shard.log.header(l.index)).map_or_else(
                || shard.sm.applied_end.borrow().saturating_sub(1),
                |h| h.end_record() - 1,
            )),
            Err(RaftError::APIError(_)) => Err(shard.not_leader()),
            Err(RaftError::Fatal(f)) => Err(shard.fatal(f.to_string())),
        };
        for w in waiters {
            let _ = w.send(res.clone());
        }
    }
}

/// Looks at every shard each heartbeat: a leader that no quorum acknowledged for
/// `STEP_DOWN_AFTER` stops acting as leader (`crate::lease::QuorumCheck`). Ends with the node.
async fn quorum_loop(node: std::sync::Weak<JournalNode>) {
    JournalNode::every(node, Duration::from_millis(HEARTBEAT_MS), |node| async move {
        for shard in &node.shards {
            let was = shard.quorum.lost();
            let lost = shard.quorum.observe(
                shard.leading(),
                shard.handing_to().is_some(),
                &shard.lease,
                shard.node_id,
                std::time::Instant::now(),
                STEP_DOWN_AFTER,
            );
            if lost && !was {
                tracing::warn!(
                    shard = shard.id,
                    after = ?STEP_DOWN_AFTER,
                    "no quorum acknowledged this leader: refusing appends and read indexes until one does or another node leads"
                );
                crate::metrics::quorum_lost(shard.id);
            } else if was && !lost {
                tracing::info!(shard = shard.id, "leading again, or following: the quorum is back");
            }
        }
    })
    .await
}

/// Turns an applied trim into a snapshot at the trim point; openraft then purges up to it.
async fn trim_loop(shard: Arc<Shard>) {
    let mut rx = shard.sm.trim_target.subscribe();
    loop {
        let target = *rx.borrow_and_update();
        if target > shard.log.first_record() {
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

/// When a commit index sent to followers was held back to the leader's own fsync
/// (`LogShared::durable_commit`), sends it once that fsync is done: a heartbeat carries the
/// commit index, so followers (and readers tailing them) do not wait for the next append.
async fn commit_push_loop(shard: Arc<Shard>) {
    let mut rx = shard.log.subscribe_flushed();
    while rx.changed().await.is_ok() {
        if shard.log.take_commit_held()
            && shard.is_leader()
            && let Err(e) = shard.raft.trigger().heartbeat().await
        {
            tracing::debug!(shard = shard.id, error = %e, "could not push the commit index");
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
    /// Leader hand-offs: the looks at each shard, one hand-off at a time.
    pub handoffs: crate::handoff::Handoffs,
    /// Testing only: the stream RPCs answer UNIMPLEMENTED (`NodeConfig::refuse_streams`).
    pub refuse_streams: bool,
    /// Per shard, for `ready`: the leader's committed index as this node last learned it.
    pub(crate) catch_up: Vec<crate::catch_up::CatchUp>,
}

/// How long a fresh node waits for each peer's answer before it initialises a shard.
const LOST_DATA_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// A node about to initialise shard `shard` from an empty log asks its peers whether the
/// shard's leader has seen this node acknowledge entries: then its data was lost (a Kubernetes
/// volume gone, a wiped directory), and rejoining under the same id with an empty log would let
/// it vote as if it held nothing, which can lose committed entries (and trips openraft's
/// leaders, which never expect a follower's log to go back). Peers that do not answer in time
/// (a cluster forming, every node starting at once) are no objection. Best effort: a leader
/// elected after the loss has not seen this node, and then nothing tells.
async fn refuse_if_data_was_lost(config: &NodeConfig, shards: &[u32]) -> Result<(), NodeError> {
    use api::strata::journal::StatusRequest;
    use api::strata::journal::journal_client::JournalClient as GrpcClient;
    let marker = config.data_dir.join(DATA_LOST_MARKER);
    if let Ok(why) = std::fs::read_to_string(&marker) {
        return Err(NodeError::DataLostBefore {
            marker,
            why: why.trim().to_string(),
        });
    }
    // One connection per peer, every shard asked over it at once.
    let asks =
        config
            .peers
            .iter()
            .filter(|(id, _)| **id != config.id)
            .map(|(_, addr)| async move {
                let call = async {
                    let Ok(c) = GrpcClient::connect(format!("http://{addr}")).await else {
                        return Vec::new();
                    };
                    let statuses = shards.iter().map(|&shard| {
                        let mut c = c.clone();
                        async move {
                            let status = c.status(StatusRequest { shard }).await.ok()?;
                            Some((shard, status.into_inner()))
                        }
                    });
                    futures::future::join_all(statuses).await
                };
                tokio::time::timeout(LOST_DATA_CHECK_TIMEOUT, call)
                    .await
                    .unwrap_or_default()
            });
    let answers = futures::future::join_all(asks).await;
    for (shard, status) in answers.into_iter().flatten().flatten() {
        if status.leader_id == status.node_id && status.acknowledged_by.contains(&config.id) {
            let refusal = NodeError::LostData {
                shard,
                id: config.id,
                leader: status.node_id,
            };
            // Sticky: later starts refuse too, even once leadership moved to a node that never
            // saw this one acknowledge anything.
            if let Err(e) =
                crate::meta::write_bytes_durable(&marker, format!("{refusal}\n").as_bytes())
            {
                tracing::warn!(path = %marker.display(), error = %e, "cannot record the lost data");
            }
            return Err(refusal);
        }
    }
    Ok(())
}

/// Shortest time without an applied entry after which a reader at the end of the log is sent to
/// another node; longer when idle ticks are rarer (four of them).
pub const TAIL_STALL_MIN: Duration = Duration::from_millis(READY_QUORUM_ACK_MS);

fn tail_stall(idle_tick: Duration) -> Duration {
    TAIL_STALL_MIN.max(idle_tick.saturating_mul(4))
}

/// The file a node that found its data lost leaves in its data directory, so that it keeps
/// refusing to start until an operator replaces it (and clears the directory).
pub const DATA_LOST_MARKER: &str = "DATA_LOST";

/// How recently a quorum must have acknowledged a leader for its node to be ready.
pub const READY_QUORUM_ACK_MS: u64 = 3_000;

impl JournalNode {
    /// The hosts journal nodes are dialled at: those of `--peers` and of every shard's
    /// members (a node added by `replace-node` is in the second).
    pub fn journal_hosts(&self) -> std::collections::BTreeSet<String> {
        let mut hosts: std::collections::BTreeSet<String> = self
            .peers
            .overrides()
            .values()
            .map(|a| crate::tls::host_of(a).to_string())
            .collect();
        for s in &self.shards {
            hosts.extend(s.member_hosts());
        }
        hosts
    }

    /// Whether the node takes part in every shard's quorum: storage working and a leader known
    /// on each shard (itself or a peer it hears from). A Kubernetes readiness probe asks this
    /// (`/readyz` on the metrics port), so a rolling update or a drain does not count a node
    /// that is still recovering, or cut off from its peers, as one of the quorum.
    pub fn ready(&self) -> Result<(), String> {
        for shard in &self.shards {
            if shard.log.failed() {
                return Err(format!("shard {}: storage failed", shard.id));
            }
            if shard.leader().0.is_none() {
                return Err(format!("shard {}: no leader known", shard.id));
            }
            // A follower must be applying what its leader commits (the leader's idle tick
            // commits an entry every 500 ms): a restarted node names the leader of its stored
            // vote before hearing from anyone, and one cut off keeps naming it for a while.
            let heard = shard
                .sm
                .last_applied_at()
                .is_some_and(|t| t.elapsed() <= Duration::from_millis(READY_QUORUM_ACK_MS));
            if !shard.is_leader() && !heard {
                return Err(format!(
                    "shard {}: no entry applied from its leader in the last {READY_QUORUM_ACK_MS} ms",
                    shard.id
                ));
            }
            // ... and hold what its leader had committed a moment ago: a node applying a
            // backlog applies all the time long before it is caught up (`catch_up`).
            if !shard.is_leader()
                && let Some(c) = self.catch_up.get(shard.id as usize)
            {
                let applied = *shard.sm.applied_end.borrow();
                c.check(applied.saturating_sub(1), std::time::Instant::now())
                    .map_err(|why| format!("shard {}: {why}", shard.id))?;
            }
            // A leader cut off from its peers keeps calling itself leader (openraft does not
            // step down without a higher vote): it is ready only while a quorum acknowledges it.
            let m = shard.raft.metrics();
            let m = m.borrow();
            if m.state == ServerState::Leader
                && m.millis_since_quorum_ack
                    .is_none_or(|ms| ms > READY_QUORUM_ACK_MS)
            {
                return Err(format!(
                    "shard {}: leader not acknowledged by a quorum for over {READY_QUORUM_ACK_MS} ms",
                    shard.id
                ));
            }
        }
        Ok(())
    }

    /// Opens (recovering) every shard and starts its Raft group. A fresh node that is not
    /// joining initialises each shard with `peers` as its voters (every node does the same,
    /// which openraft allows); the node `peers[shard % n]` then campaigns first, so leaders
    /// spread over the nodes.
    pub async fn open(config: NodeConfig) -> Result<Arc<Self>, NodeError> {
        if !config.peers.contains_key(&config.id) {
            return Err(NodeError::NotInPeers(config.id));
        }
        let peers = Arc::new(Peers::new(config.peers.clone(), config.tls.clone()));
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
            let (log, report) = LogShared::open(
                &dir,
                s,
                config.id,
                config.segment_bytes,
                config.overlap_leader_fsync,
                Arc::clone(&errors),
            )
            .map_err(|source| NodeError::Open { shard: s, source })?;
            tracing::info!(
                shard = s,
                segments = report.segments,
                frames = report.frames,
                torn_tail_cut_bytes = report.torn_tail_cut_bytes,
                first_index = log.first_index(),
                next_index = log.next_index(),
                first_record = log.first_record(),
                next_record = log.next_record(),
                "journal shard storage recovered"
            );
            let sm = StateMachine::open(&dir, Arc::clone(&log))
                .map_err(|source| NodeError::StateMachine { shard: s, source })?;
            let sm_shared = Arc::clone(&sm.shared);
            let lease = Arc::new(LeaseClock::default());
            let votes_held_until =
                (!config.read_lease.is_zero() && log.vote().is_some()).then(|| {
                    std::time::Instant::now() + Duration::from_millis(ELECTION_TIMEOUT_MAX_MS)
                });
            let network = Network {
                shard: s,
                peers: Arc::clone(&peers),
                log: Arc::clone(&log),
                lease: Arc::clone(&lease),
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
                preferred: ids[(s as usize) % ids.len()],
                gate: ProposalGate::default(),
                lease_revoked_term: AtomicU64::new(0),
                raft,
                log,
                sm: sm_shared,
                peers: Arc::clone(&peers),
                proposals: ptx,
                read_index: rtx,
                lease,
                quorum: QuorumCheck::default(),
                read_lease: config.read_lease,
                tail_stall: tail_stall(config.idle_tick),
                votes_held_until,
            });
            tokio::spawn(proposer(
                Arc::clone(&shard),
                prx,
                config.idle_tick,
                config.batching,
            ));
            tokio::spawn(read_index_loop(Arc::clone(&shard), rrx));
            tokio::spawn(trim_loop(Arc::clone(&shard)));
            tokio::spawn(commit_push_loop(Arc::clone(&shard)));
            shards.push(shard);
        }
        if !config.join {
            // Every empty shard is checked before any is initialised: a shard initialised first
            // would never be checked again at the next start.
            let mut fresh = Vec::new();
            for shard in &shards {
                let initialized =
                    shard
                        .raft
                        .is_initialized()
                        .await
                        .map_err(|f| NodeError::Raft {
                            shard: shard.id,
                            reason: f.to_string(),
                        })?;
                if !initialized {
                    fresh.push(shard.id);
                }
            }
            if !fresh.is_empty() {
                refuse_if_data_was_lost(&config, &fresh).await?;
            }
            for shard in &shards {
                let s = shard.id;
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
        }
        let catch_up = shards.iter().map(|_| Default::default()).collect();
        let node = Arc::new(JournalNode {
            id: config.id,
            shards,
            errors,
            peers,
            stopping: tokio::sync::watch::Sender::new(false),
            handoffs: Default::default(),
            refuse_streams: config.refuse_streams,
            catch_up,
        });
        tokio::spawn(crate::catch_up::sample_loop(Arc::downgrade(&node)));
        tokio::spawn(quorum_loop(Arc::downgrade(&node)));
        tokio::spawn(crate::handoff::rebalance_loop(
            Arc::downgrade(&node),
            config.handoff_settle,
        ));
        Ok(node)
    }

    /// Runs `round` every `period` (a late round delays the next) until the node is dropped or
    /// stopping; the node is held only during a round. The node's background loops.
    pub(crate) async fn every<F, Fut>(
        node: std::sync::Weak<JournalNode>,
        period: Duration,
        mut round: F,
    ) where
        F: FnMut(Arc<JournalNode>) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(node) = node.upgrade() else { return };
            if *node.stopping.borrow() {
                return;
            }
            round(node).await;
        }
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
        let node = Arc::clone(&self);
        let shutdown = async move {
            shutdown.await;
            node.stopping.send_replace(true);
        };
        let res = match self.peers.tls() {
            // Handshakes are made (and `TCP_NODELAY` set) by `InternalTls::incoming`.
            Some(tls) => {
                router
                    .serve_with_incoming_shutdown(tls.incoming(listener), shutdown)
                    .await
            }
            None => {
                // tonic's `tcp_nodelay` does not reach sockets given through
                // `serve_with_incoming`: set it here, or small responses wait on Nagle's
                // algorithm.
                let incoming = futures::StreamExt::map(
                    tokio_stream::wrappers::TcpListenerStream::new(listener),
                    |s| {
                        if let Ok(s) = &s {
                            let _ = s.set_nodelay(true);
                        }
                        s
                    },
                );
                router
                    .serve_with_incoming_shutdown(incoming, shutdown)
                    .await
            }
        };
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
