//! Leader hand-off: gives a shard's leadership back to its preferred node (the node that led it
//! when the cluster formed) once that node is back, caught up and healthy, without ever losing
//! an acknowledged append or serving a stale read (docs/journal.md, "Leader hand-off").
//! `Settle` is the pure rule saying when; `hand_off` is the procedure; `rebalance_loop` looks
//! at every shard this node leads and hands off at most one shard at a time.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use api::strata::journal::CampaignRequest;
use api::strata::journal::raft_client::RaftClient;
use openraft::{BasicNode, RaftMetrics, ServerState, Vote};

use crate::log_store::lock;
use crate::node::{ELECTION_TIMEOUT_MAX_MS, JournalNode, Shard};
use crate::types::NodeId;

/// Default time the preferred node must have been alive and caught up, continuously, before
/// its shard is handed back to it (so a node that flaps is not handed work at every start).
pub const DEFAULT_HANDOFF_SETTLE: Duration = Duration::from_secs(10);
/// How often the leader looks at its shards.
pub const CHECK_INTERVAL: Duration = Duration::from_millis(500);
/// A follower counts as alive when its latest acceptance of an AppendEntries arrived this
/// recently (heartbeats go every 100 ms).
pub const ALIVE_WITHIN: Duration = Duration::from_secs(1);
/// A follower counts as caught up when its matched log is at most this many Raft entries
/// behind the leader's last.
pub const CAUGHT_UP_ENTRIES: u64 = 64;
/// Added to the followers' vote refusal (`ELECTION_TIMEOUT_MAX_MS` after they last accepted a
/// message of the leader) before a node is counted on to grant the preferred node its vote.
pub const REFUSAL_MARGIN: Duration = Duration::from_millis(300);
/// Longest a hand-off keeps the shard's writes paused (waiting for the target to hold the
/// whole log, for enough voters to be free to vote, and for the election); after it the
/// leader resumes.
pub const HANDOFF_TIMEOUT: Duration = Duration::from_secs(5);
/// Timeout of the Campaign call to the target.
pub const CAMPAIGN_RPC_TIMEOUT: Duration = Duration::from_secs(1);
/// Poll interval of the hand-off's waits (they last milliseconds to a few seconds).
const POLL: Duration = Duration::from_millis(2);

/// The followers' vote refusal after they last accepted a message of the leader, plus margin.
fn refusal() -> Duration {
    Duration::from_millis(ELECTION_TIMEOUT_MAX_MS) + REFUSAL_MARGIN
}

/// Why a hand-off did not happen (the leader went on leading, unless said otherwise).
#[derive(Debug, Clone, thiserror::Error)]
pub enum HandoffError {
    #[error("this node does not lead shard {0}")]
    NotLeader(u32),
    #[error("node {to} is not a voter of shard {shard}")]
    NotVoter { shard: u32, to: NodeId },
    #[error("node {0} already leads the shard")]
    AlreadyLeads(NodeId),
    #[error("shard {0}: another hand-off or a membership change is in progress on this node")]
    InProgress(u32),
    #[error("shard {0}: its voters are changing (a joint configuration)")]
    MembershipChanging(u32),
    #[error(
        "shard {shard}: node {to} did not catch up (or voters stayed bound) within {HANDOFF_TIMEOUT:?}"
    )]
    CatchUp { shard: u32, to: NodeId },
    #[error("shard {shard}: node {to} refused to campaign: {reason}")]
    Campaign {
        shard: u32,
        to: NodeId,
        reason: String,
    },
    #[error(
        "shard {shard}: node {to} did not become leader within {HANDOFF_TIMEOUT:?}; leader now: {now:?}"
    )]
    NotElected {
        shard: u32,
        to: NodeId,
        now: Option<NodeId>,
    },
}

/// What the leader sees of one shard it leads at one look.
#[derive(Debug, Clone, Copy)]
pub struct Observation {
    /// The vote it leads under.
    pub vote: Vote<NodeId>,
    /// The shard's preferred node, when it is another voter: and whether it is alive and
    /// caught up right now.
    pub target: Option<(NodeId, bool)>,
}

/// Per shard: since when this node leads it under which vote, and since when its preferred
/// node has been alive and caught up. Pure: the caller supplies the observations and the clock.
#[derive(Debug, Default)]
pub struct Settle {
    leading: HashMap<u32, (Vote<NodeId>, Instant)>,
    healthy: HashMap<u32, (NodeId, Instant)>,
}

impl Settle {
    /// Records one look at `shard` (`None`: this node does not lead it); answers the node to
    /// hand it to now, if any: its preferred node, alive and caught up for `settle` without a
    /// break, while this node led it under one vote for at least `settle` and the followers'
    /// vote refusal (so this node's own vote is free for the preferred node). `settle = None`:
    /// automatic hand-offs are off (the looks still feed `leading_since`).
    pub fn observe(
        &mut self,
        shard: u32,
        obs: Option<Observation>,
        now: Instant,
        settle: Option<Duration>,
    ) -> Option<NodeId> {
        let Some(obs) = obs else {
            self.leading.remove(&shard);
            self.healthy.remove(&shard);
            return None;
        };
        let leading = self.leading.entry(shard).or_insert((obs.vote, now));
        if leading.0 != obs.vote {
            *leading = (obs.vote, now);
            self.healthy.remove(&shard);
        }
        let leading_since = leading.1;
        let target = match obs.target {
            Some((to, true)) => {
                let h = self.healthy.entry(shard).or_insert((to, now));
                if h.0 != to {
                    *h = (to, now);
                }
                Some((to, h.1))
            }
            _ => {
                self.healthy.remove(&shard);
                None
            }
        };
        let settle = settle?;
        let (to, healthy_since) = target?;
        (now >= healthy_since + settle && now >= leading_since + settle.max(refusal()))
            .then_some(to)
    }

    /// Since when this node leads `shard` under `vote`, as far as its looks tell.
    pub fn leading_since(&self, shard: u32, vote: &Vote<NodeId>) -> Option<Instant> {
        self.leading
            .get(&shard)
            .filter(|(v, _)| v == vote)
            .map(|(_, t)| *t)
    }

    /// Since when `shard`'s preferred node has been alive and caught up, if it is.
    pub fn healthy_since(&self, shard: u32) -> Option<(NodeId, Instant)> {
        self.healthy.get(&shard).copied()
    }

    /// A hand-off of `shard` was tried: its preferred node's settle period starts again.
    pub fn restart(&mut self, shard: u32) {
        self.healthy.remove(&shard);
    }
}

/// The node's hand-off state: the looks, and the one hand-off or membership change running at
/// a time.
#[derive(Default)]
pub struct Handoffs {
    pub settle: std::sync::Mutex<Settle>,
    running: tokio::sync::Mutex<()>,
}

impl Handoffs {
    /// Waits until no hand-off runs on this node, then keeps any from starting until the guard
    /// is dropped. A membership change (`ReplaceNode`) holds it: a hand-off would move the
    /// leadership away in the middle of the change (which then fails and is asked again of the
    /// new leader), and its own count of free voters does not hold for a joint configuration.
    pub async fn membership_change(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.running.lock().await
    }
}

/// The last log index `node` has acknowledged to this leader (`None`: none yet, or this node
/// does not lead).
pub fn matched_index(m: &RaftMetrics<NodeId, BasicNode>, node: NodeId) -> Option<u64> {
    m.replication
        .as_ref()
        .and_then(|r| r.get(&node).copied().flatten())
        .map(|l| l.index)
}

/// What `observe` needs of a shard's metrics: `None` unless this node leads it.
pub fn look(shard: &Shard, now: Instant) -> Option<Observation> {
    if shard.log.failed() {
        return None;
    }
    let m = shard.raft.metrics();
    let m = m.borrow();
    let vote = m.vote;
    if m.state != ServerState::Leader
        || m.current_leader != Some(shard.node_id)
        || !vote.is_committed()
    {
        return None;
    }
    let to = shard.preferred;
    let voter = m
        .membership_config
        .membership()
        .voter_ids()
        .any(|v| v == to);
    if to == shard.node_id || !voter {
        return Some(Observation { vote, target: None });
    }
    let alive = shard
        .lease
        .last_heard(to)
        .is_some_and(|t| now.saturating_duration_since(t) < ALIVE_WITHIN);
    let last = m.last_log_index.unwrap_or(0);
    let matched = matched_index(&m, to).unwrap_or(0);
    let caught_up = matched + CAUGHT_UP_ENTRIES >= last;
    Some(Observation {
        vote,
        target: Some((to, alive && caught_up)),
    })
}

/// Hands the leadership of `shard` to `to`, safely:
/// 1. the shard holds appends, trims and read indexes back (after the hand-off they go on
///    here, or are answered with the new leader's address; no lease read is served from here
///    on), idle ticks and heartbeats stop;
/// 2. it waits until `to` holds this node's whole log (so `to` can win and loses nothing: the
///    log is whole once every proposal that passed the gate before it closed reached the log
///    store, `crate::gate`), and
///    until, without `to`, a majority of the voters minus one is free to vote: this node once it
///    led for the followers' vote refusal, a follower once that long passed since its last
///    acceptance of a message arrived here (with three voters, this node's own vote is enough,
///    and it waits for it before the pause);
/// 3. asks `to` to campaign, and waits until `to` leads.
///
/// Whatever happens, the shard then resumes (as leader if it still is). Answers how long
/// writes were paused.
pub async fn hand_off(
    node: &JournalNode,
    shard: &Arc<Shard>,
    to: NodeId,
) -> Result<Duration, HandoffError> {
    let Ok(_one) = node.handoffs.running.try_lock() else {
        return Err(HandoffError::InProgress(shard.id));
    };
    let now = Instant::now();
    let Some(obs) = look(shard, now) else {
        return Err(HandoffError::NotLeader(shard.id));
    };
    if to == shard.node_id {
        return Err(HandoffError::AlreadyLeads(to));
    }
    let (voters, term, joint) = {
        let m = shard.raft.metrics();
        let m = m.borrow();
        let membership = m.membership_config.membership();
        (
            membership.voter_ids().collect::<BTreeSet<_>>(),
            m.current_term,
            membership.get_joint_config().len() != 1,
        )
    };
    if joint {
        // A membership change left half done (its leader died between the two steps): the
        // new leader finishes it when it is asked again; until then the count of free voters
        // below would be wrong.
        return Err(HandoffError::MembershipChanging(shard.id));
    }
    if !voters.contains(&to) {
        return Err(HandoffError::NotVoter {
            shard: shard.id,
            to,
        });
    }
    let leading_since = lock(&node.handoffs.settle)
        .leading_since(shard.id, &obs.vote)
        .unwrap_or(now);
    if voters.len() / 2 == 1 {
        // Three voters: this node's own vote, free once it led for the followers' vote
        // refusal, is all the target needs besides its own. Wait for that before pausing.
        tokio::time::sleep_until((leading_since + refusal()).into()).await;
    }
    tracing::info!(
        shard = shard.id,
        to,
        term,
        "handing the shard's leadership over"
    );
    let started = Instant::now();
    let pause = Paused::begin(shard, to);
    let res = steps(node, shard, to, obs.vote, &voters, leading_since, term).await;
    drop(pause);
    let paused = started.elapsed();
    lock(&node.handoffs.settle).restart(shard.id);
    match &res {
        Ok(()) => {
            crate::metrics::handoff(shard.id, true, paused);
            tracing::info!(
                shard = shard.id,
                to,
                paused_ms = paused.as_millis() as u64,
                "leadership handed over"
            );
        }
        Err(e) => {
            crate::metrics::handoff(shard.id, false, paused);
            tracing::warn!(shard = shard.id, to, error = %e, "leadership hand-off failed; resuming");
        }
    }
    res.map(|()| paused)
}

/// A shard's hand-off pause, ended when dropped: also when the task running the hand-off is
/// dropped half-way (an admin call whose client gave up or went away cancels its handler),
/// so that a shard never stays paused.
struct Paused<'a>(&'a Shard);

impl<'a> Paused<'a> {
    fn begin(shard: &'a Shard, to: NodeId) -> Self {
        shard.begin_handoff(to);
        Paused(shard)
    }
}

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        self.0.end_handoff();
    }
}

async fn steps(
    node: &JournalNode,
    shard: &Shard,
    to: NodeId,
    vote: Vote<NodeId>,
    voters: &BTreeSet<NodeId>,
    leading_since: Instant,
    term: u64,
) -> Result<(), HandoffError> {
    let deadline = Instant::now() + HANDOFF_TIMEOUT;
    // The target's own vote, plus this many others.
    let need = voters.len() / 2;
    loop {
        let now = Instant::now();
        let (still, matched) = {
            let m = shard.raft.metrics();
            let m = m.borrow();
            let matched = matched_index(&m, to);
            (m.vote == vote && m.state == ServerState::Leader, matched)
        };
        if !still {
            return Err(HandoffError::NotLeader(shard.id));
        }
        // Once the gate is quiet nothing more reaches this node's log. A round through the
        // Raft core then follows every entry handed over before: openraft gives a message's
        // entries to the log store before it takes the next message, so the store's last
        // index is final (the metrics may not show it yet). The target must hold all of it,
        // or this node refuses it its vote (a failed hand-off, never an unsafe one).
        let caught_up = shard.gate.quiet() && {
            shard
                .raft
                .with_raft_state(|_| ())
                .await
                .map_err(|_| HandoffError::NotLeader(shard.id))?;
            let last = shard.log.next_index().checked_sub(1);
            matched.is_some() && matched >= last
        };
        let free = voters
            .iter()
            .filter(|v| **v != to)
            .filter(|v| {
                let since = if **v == shard.node_id {
                    Some(leading_since)
                } else {
                    shard.lease.last_heard(**v)
                };
                since.is_none_or(|t| now >= t + refusal())
            })
            .count();
        if caught_up && free >= need {
            break;
        }
        if now >= deadline {
            return Err(HandoffError::CatchUp {
                shard: shard.id,
                to,
            });
        }
        tokio::time::sleep(POLL).await;
    }
    // From here `to` may campaign at any moment, although it acknowledged this leader lately:
    // this leader's lease no longer proves that no other leader exists (docs/journal.md).
    shard.revoke_lease(vote.leader_id().get_term());
    campaign(node, shard, to, term).await?;
    loop {
        let leader = {
            let m = shard.raft.metrics();
            let m = m.borrow();
            m.current_leader
        };
        if leader == Some(to) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(HandoffError::NotElected {
                shard: shard.id,
                to,
                now: leader,
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Asks `to` to campaign for `shard` now.
async fn campaign(
    node: &JournalNode,
    shard: &Shard,
    to: NodeId,
    term: u64,
) -> Result<(), HandoffError> {
    let err = |reason: String| HandoffError::Campaign {
        shard: shard.id,
        to,
        reason,
    };
    let addr = shard.member_addr(
        shard.raft.metrics().borrow().membership_config.membership(),
        to,
    );
    let ch = node
        .peers
        .channel(&addr)
        .map_err(|e| err(format!("bad address {addr}: {e}")))?;
    let mut req = tonic::Request::new(CampaignRequest {
        shard: shard.id,
        leader_id: shard.node_id,
        term,
    });
    req.set_timeout(CAMPAIGN_RPC_TIMEOUT);
    RaftClient::new(ch)
        .campaign(req)
        .await
        .map_err(|s| err(format!("{}: {}", s.code(), s.message())))?;
    Ok(())
}

/// Looks at every shard every `CHECK_INTERVAL`; with `settle` set, hands a shard to its
/// preferred node once `Settle::observe` says so, one shard at a time. Ends with the node.
pub async fn rebalance_loop(node: Weak<JournalNode>, settle: Option<Duration>) {
    JournalNode::every(node, CHECK_INTERVAL, |node| async move {
        let now = Instant::now();
        let mut due = None;
        for s in &node.shards {
            let obs = look(s, now);
            let to = lock(&node.handoffs.settle).observe(s.id, obs, now, settle);
            if due.is_none()
                && let Some(to) = to
            {
                due = Some((Arc::clone(s), to));
            }
        }
        if let Some((s, to)) = due {
            let _ = hand_off(&node, &s, to).await;
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vote(term: u64, node: NodeId) -> Vote<NodeId> {
        let mut v = Vote::new(term, node);
        v.commit();
        v
    }

    const SETTLE: Duration = Duration::from_secs(10);

    fn obs(term: u64, healthy: bool) -> Option<Observation> {
        Some(Observation {
            vote: vote(term, 2),
            target: Some((1, healthy)),
        })
    }

    #[test]
    fn hands_off_only_after_the_target_was_healthy_for_the_whole_settle_period() {
        let mut s = Settle::default();
        let t0 = Instant::now();
        assert_eq!(s.observe(0, obs(3, true), t0, Some(SETTLE)), None);
        assert_eq!(
            s.observe(0, obs(3, true), t0 + SETTLE / 2, Some(SETTLE)),
            None
        );
        assert_eq!(
            s.observe(0, obs(3, true), t0 + SETTLE, Some(SETTLE)),
            Some(1)
        );
    }

    #[test]
    fn an_unhealthy_look_or_a_new_vote_starts_the_period_again() {
        let mut s = Settle::default();
        let t0 = Instant::now();
        s.observe(0, obs(3, true), t0, Some(SETTLE));
        s.observe(0, obs(3, false), t0 + SETTLE / 2, Some(SETTLE));
        s.observe(0, obs(3, true), t0 + SETTLE / 2, Some(SETTLE));
        assert_eq!(s.observe(0, obs(3, true), t0 + SETTLE, Some(SETTLE)), None);
        assert_eq!(
            s.observe(0, obs(3, true), t0 + SETTLE * 3 / 2, Some(SETTLE)),
            Some(1)
        );
        // Leading anew (another term): both periods start again.
        let t1 = t0 + SETTLE * 2;
        assert_eq!(s.observe(0, obs(4, true), t1, Some(SETTLE)), None);
        assert_eq!(
            s.leading_since(0, &vote(4, 2)),
            Some(t1),
            "leading under the new vote since t1"
        );
        assert_eq!(
            s.observe(0, obs(4, true), t1 + SETTLE, Some(SETTLE)),
            Some(1)
        );
        // Not leading: forgotten.
        assert_eq!(s.observe(0, None, t1 + SETTLE, Some(SETTLE)), None);
        assert_eq!(s.leading_since(0, &vote(4, 2)), None);
    }

    #[test]
    fn off_never_hands_off_and_a_short_settle_still_waits_for_the_vote_refusal() {
        let mut s = Settle::default();
        let t0 = Instant::now();
        s.observe(0, obs(3, true), t0, None);
        assert_eq!(s.observe(0, obs(3, true), t0 + SETTLE * 10, None), None);
        assert!(s.healthy_since(0).is_some());
        let mut s = Settle::default();
        let short = Some(Duration::from_millis(100));
        s.observe(0, obs(3, true), t0, short);
        assert_eq!(
            s.observe(0, obs(3, true), t0 + Duration::from_secs(1), short),
            None
        );
        assert_eq!(s.observe(0, obs(3, true), t0 + refusal(), short), Some(1));
        // Tried: the period starts again.
        s.restart(0);
        assert_eq!(s.observe(0, obs(3, true), t0 + refusal(), short), None);
        // No preferred node elsewhere: nothing to do.
        let none = Some(Observation {
            vote: vote(3, 2),
            target: None,
        });
        assert_eq!(s.observe(0, none, t0 + SETTLE * 10, short), None);
    }
}
