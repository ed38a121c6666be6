//! How far a follower is behind its leader, for readiness (`JournalNode::ready`).
//!
//! A restarted or replaced node applies its leader's backlog as fast as it arrives, so "an entry
//! applied in the last 3 s" is true from its first batch on, long before it holds what the
//! leader has committed. Counted ready then, a rolling update moves on to the next node while
//! this one is still behind, and the shard's quorum becomes the leader plus a node that must
//! receive the whole backlog before it can acknowledge anything new: writes stall for as long.
//! So each follower asks its leader's `Status` for the committed index once a second, and is
//! ready only once it has applied what the leader had committed at a sample at least
//! [`GRACE`] old (a node that is caught up applies a commit within a heartbeat) and at most
//! [`MAX_AGE`] old (a follower that cannot ask its leader cannot say it is caught up).

use std::collections::VecDeque;
use std::sync::{Mutex, Weak};
use std::time::{Duration, Instant};

use api::strata::journal::StatusRequest;
use api::strata::journal::journal_client::JournalClient as GrpcClient;

use crate::node::JournalNode;

/// How often each follower asks its leader for the committed index.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// A sample younger than this is not held against the follower: a commit reaches a caught-up
/// follower with the leader's next message (heartbeats every 100 ms).
pub const GRACE: Duration = Duration::from_millis(500);
/// A follower whose newest usable sample is older than this is not known to be caught up.
pub const MAX_AGE: Duration = Duration::from_secs(5);
/// Time allowed for one `Status` call.
const STATUS_TIMEOUT: Duration = Duration::from_secs(1);
/// Samples kept per shard (enough to always hold one between `GRACE` and `MAX_AGE` old).
const KEPT: usize = 8;

/// The leader's committed index as sampled over time, for one shard.
#[derive(Debug, Default)]
pub struct CatchUp {
    samples: Mutex<VecDeque<(u64, Instant)>>,
}

impl CatchUp {
    /// Records that the leader had committed `committed` at `at`.
    pub fn record(&self, committed: u64, at: Instant) {
        let mut s = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        if s.len() == KEPT {
            s.pop_front();
        }
        s.push_back((committed, at));
    }

    /// Whether a follower that applied up to `applied` holds what its leader had committed at
    /// the newest sample at least [`GRACE`] old (and at most [`MAX_AGE`]); the reason if not.
    pub fn check(&self, applied: u64, now: Instant) -> Result<(), String> {
        let s = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        let usable = s
            .iter()
            .rev()
            .find(|(_, at)| now.saturating_duration_since(*at) >= GRACE);
        match usable {
            Some(&(committed, at)) if now.saturating_duration_since(at) <= MAX_AGE => {
                if applied >= committed {
                    Ok(())
                } else {
                    Err(format!(
                        "behind its leader: applied {applied}, the leader had committed {committed} {} ms ago",
                        now.saturating_duration_since(at).as_millis()
                    ))
                }
            }
            _ => Err(format!(
                "its leader's committed index not learned in the last {} ms",
                MAX_AGE.as_millis()
            )),
        }
    }
}

/// Once a second, asks each shard's leader (on shards this node follows) for its committed
/// index, all shards at once. Ends with the node.
pub async fn sample_loop(node: Weak<JournalNode>) {
    JournalNode::every(node, SAMPLE_EVERY, |node| async move {
        let asks = node.shards.iter().filter_map(|shard| {
            let (Some(leader), Some(addr)) = shard.leader() else {
                return None;
            };
            if leader == node.id {
                return None;
            }
            let channel = node.peers.channel(&addr).ok()?;
            let id = shard.id;
            Some(async move {
                let mut req = tonic::Request::new(StatusRequest { shard: id });
                req.set_timeout(STATUS_TIMEOUT);
                let status =
                    tokio::time::timeout(STATUS_TIMEOUT, GrpcClient::new(channel).status(req))
                        .await
                        .ok()?
                        .ok()?
                        .into_inner();
                // Stamped when the answer came: the leader had committed at least this by then
                // (a slow answer stamped at the ask would leave the follower no grace).
                let answered = Instant::now();
                // Only a leader's own word counts (leadership may have moved meanwhile).
                (status.leader_id == leader && status.node_id == leader).then_some((
                    id,
                    status.committed_index,
                    answered,
                ))
            })
        });
        let answers = futures::future::join_all(asks).await;
        for (shard, committed, answered) in answers.into_iter().flatten() {
            if let Some(c) = node.catch_up.get(shard as usize) {
                c.record(committed, answered);
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_with_a_sample_old_enough_and_not_too_old_and_applied_past_it() {
        let c = CatchUp::default();
        let t0 = Instant::now();
        // Nothing learned yet: not ready, whatever it applied.
        assert!(c.check(1_000, t0).unwrap_err().contains("not learned"));
        c.record(100, t0);
        // Too young to count yet.
        assert!(c.check(1_000, t0 + GRACE / 2).is_err());
        // Old enough: ready once applied reaches it.
        let t = t0 + GRACE;
        assert!(c.check(99, t).unwrap_err().contains("behind its leader"));
        assert!(c.check(100, t).is_ok());
        // A newer sample still too young: the older one is used.
        c.record(500, t);
        assert!(c.check(100, t + GRACE / 2).is_ok());
        // Once it counts, the follower must reach it.
        assert!(c.check(100, t + GRACE).is_err());
        assert!(c.check(500, t + GRACE).is_ok());
        // No sample since: the newest goes stale.
        assert!(
            c.check(500, t + MAX_AGE + Duration::from_millis(1))
                .unwrap_err()
                .contains("not learned")
        );
        // Only the newest `KEPT` are kept.
        for i in 0..20 {
            c.record(1_000 + i, t);
        }
        assert_eq!(c.samples.lock().unwrap().len(), KEPT);
    }
}
