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
        // A majority counting me: this many of the others.
        let need = voters.len() / 2;
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
