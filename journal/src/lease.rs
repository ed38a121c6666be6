//! The leader lease behind cheap ReadIndex answers: when each follower last accepted this
//! node's leadership (the send time of the AppendEntries or heartbeat it acknowledged), and
//! from that, since when a quorum has. Pure bookkeeping: the caller supplies the clock.
//!
//! Why a lease is safe (docs/journal.md, "ReadIndex from the leader lease"): a follower that
//! accepts an AppendEntries of this leader refuses every vote request for openraft's
//! `leader_lease` (= the election timeout maximum) after it received it, so while a quorum has
//! acknowledged a message sent less than `lease < leader_lease` ago, no other node can collect
//! a majority of votes without this node's own vote, which `Shard::lease_read_index` checks
//! separately.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::Instant;

use openraft::Vote;

use crate::log_store::lock;
use crate::types::NodeId;

/// Per follower: the newest send time of a message it acknowledged, under which vote.
/// Also, per follower, when this node last received an acceptance from it (whatever the
/// vote): a leader handing its shard over waits until the followers' vote refusal, which each
/// restarted when it accepted that message, has run out (`crate::handoff`).
#[derive(Default)]
pub struct LeaseClock {
    acks: Mutex<HashMap<NodeId, (Vote<NodeId>, Instant)>>,
    heard: Mutex<HashMap<NodeId, Instant>>,
}

impl LeaseClock {
    /// `target` answered a message sent at `sent` under `vote` by accepting it (success or a
    /// log conflict: both mean it took `vote` as its leader's).
    pub fn acked(&self, target: NodeId, vote: Vote<NodeId>, sent: Instant) {
        let mut acks = lock(&self.acks);
        let e = acks.entry(target).or_insert((vote, sent));
        if e.0 != vote || e.1 < sent {
            *e = (vote, sent);
        }
    }

    /// `target`'s acceptance of a message arrived here at `at`.
    pub fn heard(&self, target: NodeId, at: Instant) {
        let mut heard = lock(&self.heard);
        let e = heard.entry(target).or_insert(at);
        if *e < at {
            *e = at;
        }
    }

    /// When `target`'s latest acceptance arrived here, if one did.
    pub fn last_heard(&self, target: NodeId) -> Option<Instant> {
        lock(&self.heard).get(&target).copied()
    }

    /// The latest instant such that a quorum of `voters` (counting `me`, the leader, whose
    /// own vote the caller checks) acknowledged a message sent at or after it under `vote`;
    /// `None` if no quorum has (yet) under this vote, or `me` is not a voter.
    pub fn quorum_since(
        &self,
        vote: &Vote<NodeId>,
        voters: &BTreeSet<NodeId>,
        me: NodeId,
        now: Instant,
    ) -> Option<Instant> {
        if !voters.contains(&me) {
            return None;
        }
        self.majority_since(vote, voters, me, now)
    }

    /// The latest instant such that a majority of `voters` acknowledged a message sent at or
    /// after it under `vote`, `me` counting as the newest acknowledgement if it is one of them
    /// (a leader leaving the voters leads a joint configuration whose new half it is not in);
    /// `None` if no majority has.
    pub fn majority_since(
        &self,
        vote: &Vote<NodeId>,
        voters: &BTreeSet<NodeId>,
        me: NodeId,
        now: Instant,
    ) -> Option<Instant> {
        // A majority: this many of the others, besides me if I am a voter.
        let need = voters.len() / 2 + 1 - usize::from(voters.contains(&me));
        if need == 0 {
            return Some(now);
        }
        let acks = lock(&self.acks);
        let mut times: Vec<Instant> = voters
            .iter()
            .filter(|id| **id != me)
            .filter_map(|id| acks.get(id))
            .filter(|(v, _)| v == vote)
            .map(|(_, t)| *t)
            .collect();
        if times.len() < need {
            return None;
        }
        times.sort_unstable_by(|a, b| b.cmp(a));
        Some(times[need - 1])
    }
}

/// etcd's CheckQuorum, kept by the journal itself: openraft 0.9 leaves a leader cut off from
/// its peers leading until it hears a higher vote, so appends sent to it wait out the client's
/// whole attempt while the other voters have long elected a leader. Once a leader has gone
/// `after` without a quorum acknowledging anything it sent, the shard stops acting as leader
/// (`Shard::serves_as_leader`): appends and read indexes are refused with no leader named, the ones
/// waiting are answered "unavailable" (the client retries them elsewhere), and the node reports
/// no leader. It leads again as soon as a quorum acknowledges it, or follows the new leader.
pub struct QuorumCheck {
    /// The vote this node has been leading under, and since when (restarted while a hand-off
    /// holds heartbeats back, so none counts against it).
    leading: Mutex<Option<(Vote<NodeId>, Instant)>>,
    lost: tokio::sync::watch::Sender<bool>,
}

impl Default for QuorumCheck {
    fn default() -> Self {
        QuorumCheck {
            leading: Mutex::new(None),
            lost: tokio::sync::watch::Sender::new(false),
        }
    }
}

impl QuorumCheck {
    /// One look at `now`: `leading` is this node's vote and its configuration's voter sets (one,
    /// or two while joint: a quorum needs a majority of each) while it leads under a committed
    /// vote (`None` otherwise: nothing to check);
    /// `holding` is true while a hand-off holds heartbeats back. Publishes and answers whether
    /// the leader has gone longer than `after` without a quorum of `clock`'s acknowledgements.
    pub fn observe(
        &self,
        leading: Option<(Vote<NodeId>, Vec<BTreeSet<NodeId>>)>,
        holding: bool,
        clock: &LeaseClock,
        me: NodeId,
        now: Instant,
        after: std::time::Duration,
    ) -> bool {
        let lost = {
            let mut l = lock(&self.leading);
            match leading {
                None => {
                    *l = None;
                    false
                }
                Some((vote, configs)) => {
                    let since = match *l {
                        Some((v, t)) if v == vote && !holding => t,
                        _ => {
                            *l = Some((vote, now));
                            now
                        }
                    };
                    // Every configuration's majority at once: the oldest of their latest.
                    let quorum = configs
                        .iter()
                        .map(|voters| clock.majority_since(&vote, voters, me, now))
                        .try_fold(now, |all, t| t.map(|t| all.min(t)));
                    let heard = quorum.map_or(since, |t| t.max(since));
                    now.saturating_duration_since(heard) > after
                }
            }
        };
        self.lost.send_if_modified(|was| {
            let changed = *was != lost;
            *was = lost;
            changed
        });
        lost
    }

    /// Whether the last look found the leader without its quorum.
    pub fn lost(&self) -> bool {
        *self.lost.borrow()
    }

    /// Resolves once a look finds the leader without its quorum (at once if the last did).
    pub fn wait_lost(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.lost.subscribe();
        async move {
            let _ = rx.wait_for(|lost| *lost).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn committed(term: u64, node: NodeId) -> Vote<NodeId> {
        let mut v = Vote::new(term, node);
        v.commit();
        v
    }

    #[test]
    fn a_quorum_needs_a_majority_of_the_voters_counting_the_leader() {
        let t0 = Instant::now();
        let v = committed(3, 1);
        let voters3: BTreeSet<NodeId> = [1, 2, 3].into();
        let c = LeaseClock::default();
        assert_eq!(c.quorum_since(&v, &voters3, 1, t0), None);
        c.acked(2, v, t0 + Duration::from_millis(5));
        assert_eq!(
            c.quorum_since(&v, &voters3, 1, t0),
            Some(t0 + Duration::from_millis(5))
        );
        // The newer of two acknowledgements counts; an older one never lowers it.
        c.acked(3, v, t0 + Duration::from_millis(9));
        c.acked(2, v, t0 + Duration::from_millis(1));
        assert_eq!(
            c.quorum_since(&v, &voters3, 1, t0),
            Some(t0 + Duration::from_millis(9))
        );
        // Five voters: two followers needed, the lease runs from the older of the two newest.
        let voters5: BTreeSet<NodeId> = [1, 2, 3, 4, 5].into();
        assert_eq!(
            c.quorum_since(&v, &voters5, 1, t0),
            Some(t0 + Duration::from_millis(5))
        );
        c.acked(4, v, t0 + Duration::from_millis(7));
        assert_eq!(
            c.quorum_since(&v, &voters5, 1, t0),
            Some(t0 + Duration::from_millis(7))
        );
        // Not a voter: no lease. Alone: always.
        assert_eq!(c.quorum_since(&v, &voters3, 9, t0), None);
        assert_eq!(c.quorum_since(&v, &[1].into(), 1, t0), Some(t0));
    }

    /// A lease clock and a quorum check of node 1, and the time the test starts at.
    fn quorum_fixture() -> (LeaseClock, QuorumCheck, Instant) {
        (
            LeaseClock::default(),
            QuorumCheck::default(),
            Instant::now(),
        )
    }

    /// One look of the fixture's check at `t0 + ms`, among voters 1–3 with `after` = 2 s;
    /// `vote` is `None` when node 1 does not lead.
    fn look(
        (c, q, t0): &(LeaseClock, QuorumCheck, Instant),
        vote: Option<Vote<NodeId>>,
        holding: bool,
        ms: u64,
    ) -> bool {
        let voters: BTreeSet<NodeId> = [1, 2, 3].into();
        q.observe(
            vote.map(|v| (v, vec![voters])),
            holding,
            c,
            1,
            *t0 + Duration::from_millis(ms),
            Duration::from_millis(2000),
        )
    }

    #[test]
    fn a_leader_without_a_quorum_for_too_long_is_found_lost_and_recovers() {
        let f = quorum_fixture();
        let (c, q, t0) = &f;
        let vote = committed(4, 1);
        let v = Some(vote);
        // A new leader gets 2 s from its first look, acknowledged or not.
        assert!(!look(&f, v, false, 0));
        assert!(!look(&f, v, false, 2000));
        assert!(look(&f, v, false, 2001));
        assert!(q.lost());
        // One follower acknowledges a message sent at 1900 ms: a quorum with the leader.
        c.acked(2, vote, *t0 + Duration::from_millis(1900));
        assert!(!look(&f, v, false, 2100));
        assert!(!q.lost());
        assert!(!look(&f, v, false, 3900));
        assert!(look(&f, v, false, 3901));
        // Acknowledgements under another vote do not count: a new term starts its own clock.
        let newer = Some(committed(5, 1));
        c.acked(3, vote, *t0 + Duration::from_millis(5000));
        assert!(!look(&f, newer, false, 6000));
        assert!(look(&f, newer, false, 8001));
        // Not leading: nothing is lost, and leading again under the same vote starts afresh.
        assert!(!look(&f, None, false, 9000));
        assert!(!look(&f, newer, false, 9000));
        assert!(!look(&f, newer, false, 11000));
        assert!(look(&f, newer, false, 11001));
    }

    /// While the voters change (a joint configuration), a quorum is a majority of the old
    /// voters and a majority of the new, the leader counting in each it belongs to.
    #[test]
    fn a_joint_configuration_needs_a_majority_of_each_half() {
        let (c, q, t0) = quorum_fixture();
        let vote = committed(4, 1);
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let after = Duration::from_millis(2000);
        // Node 1 stays, 2 and 3 give way to 4 and 5.
        let joint = || vec![[1, 2, 3].into(), [1, 4, 5].into()];
        assert!(!q.observe(Some((vote, joint())), false, &c, 1, at(0), after));
        // Acknowledged by the old half only (2 and 3): no majority of the new one.
        c.acked(2, vote, at(1900));
        c.acked(3, vote, at(1900));
        assert!(q.observe(Some((vote, joint())), false, &c, 1, at(2001), after));
        // One of the new half too: a majority of both, counting the leader in each.
        c.acked(4, vote, at(1950));
        assert!(!q.observe(Some((vote, joint())), false, &c, 1, at(2100), after));
        // The quorum dates from the older of the two halves' acknowledgements.
        assert!(!q.observe(Some((vote, joint())), false, &c, 1, at(3900), after));
        assert!(q.observe(Some((vote, joint())), false, &c, 1, at(3901), after));
        // A leader leaving the voters ([1, 2, 3] to [2, 3, 4]) does not count in the new half.
        let leaving = || vec![[1, 2, 3].into(), [2, 3, 4].into()];
        c.acked(2, vote, at(5000));
        c.acked(3, vote, at(5000));
        assert!(!q.observe(Some((vote, leaving())), false, &c, 1, at(6000), after));
        c.acked(2, vote, at(6000));
        c.acked(4, vote, at(6000));
        assert!(!q.observe(Some((vote, leaving())), false, &c, 1, at(7500), after));
        // Nothing acknowledged after 6000: both halves' majorities date from then.
        assert!(!q.observe(Some((vote, leaving())), false, &c, 1, at(8000), after));
        assert!(q.observe(Some((vote, leaving())), false, &c, 1, at(8001), after));
    }

    #[test]
    fn a_hand_off_holding_heartbeats_back_is_not_a_lost_quorum() {
        let f = quorum_fixture();
        let vote = committed(4, 1);
        let v = Some(vote);
        f.0.acked(2, vote, f.2);
        assert!(!look(&f, v, false, 0));
        // Heartbeats held back for 5 s: never lost, and after the hand-off failed, the leader
        // gets 2 s again from the last look that saw it holding.
        for t in (500..=5000).step_by(500) {
            assert!(!look(&f, v, true, t));
        }
        assert!(!look(&f, v, false, 7000));
        assert!(look(&f, v, false, 7001));
    }

    #[tokio::test]
    async fn waiters_learn_of_a_lost_quorum() {
        let f = quorum_fixture();
        let v = Some(committed(4, 1));
        let wait = tokio::spawn(f.1.wait_lost());
        assert!(!look(&f, v, false, 0));
        tokio::task::yield_now().await;
        assert!(!wait.is_finished());
        assert!(look(&f, v, false, 2001));
        tokio::time::timeout(Duration::from_secs(5), wait)
            .await
            .expect("the waiter learns of the lost quorum")
            .unwrap();
    }

    #[test]
    fn acknowledgements_under_another_vote_do_not_count() {
        let t0 = Instant::now();
        let old = committed(3, 1);
        let new = committed(5, 1);
        let voters: BTreeSet<NodeId> = [1, 2, 3].into();
        let c = LeaseClock::default();
        c.acked(2, old, t0 + Duration::from_millis(5));
        assert_eq!(c.quorum_since(&new, &voters, 1, t0), None);
        // A newer vote replaces the entry even with an earlier send time.
        c.acked(2, new, t0 + Duration::from_millis(2));
        assert_eq!(
            c.quorum_since(&new, &voters, 1, t0),
            Some(t0 + Duration::from_millis(2))
        );
        assert_eq!(c.quorum_since(&old, &voters, 1, t0), None);
    }
}
