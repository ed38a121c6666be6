//! The gate between a shard's proposers and a leadership hand-off (`crate::handoff`).
//!
//! A hand-off may ask its target to campaign only once the target holds the leader's whole
//! log: the leader refuses its vote to a candidate whose log is shorter than its own. Closing
//! the gate is not enough on its own: a proposer that looked just before the gate closed may
//! still be handing its entry to Raft, and that entry would reach the leader's log after the
//! hand-off found the target caught up. So each proposal holds a pass while it goes to Raft,
//! and the hand-off waits until the gate is closed and no pass is out (`quiet`); only then does
//! it read the leader's last log index, through the Raft core so that it follows every entry
//! handed over before.
//!
//! Owns nothing but the two flags; never talks to Raft itself.

use std::sync::atomic::{AtomicUsize, Ordering, fence};

use tokio::sync::watch;

use crate::types::NodeId;

/// Whether proposals may go to Raft, and how many are on their way.
#[derive(Debug)]
pub struct ProposalGate {
    /// The node the shard's leadership is being handed to; 0: none (the gate is open).
    handing_to: watch::Sender<NodeId>,
    /// Passes out: proposals between their look at the gate and the end of their hand-over
    /// to Raft.
    passes: AtomicUsize,
}

/// A proposal's permission to go to Raft; the gate counts it until it is dropped.
#[derive(Debug)]
pub struct Pass<'a>(&'a ProposalGate);

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        self.0.passes.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Default for ProposalGate {
    fn default() -> Self {
        ProposalGate {
            handing_to: watch::Sender::new(0),
            passes: AtomicUsize::new(0),
        }
    }
}

impl ProposalGate {
    /// A pass, unless a hand-off is in progress.
    pub fn pass(&self) -> Option<Pass<'_>> {
        // Counted first, then the gate read; `close` writes the gate, then reads the count.
        // With a full fence between each write and read, at least one side sees the other:
        // the proposal backs off, or the hand-off waits for its pass.
        self.passes.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let pass = Pass(self);
        self.handing_to().is_none().then_some(pass)
    }

    /// A pass once no hand-off is in progress (waiting for hand-offs to end).
    pub async fn pass_when_open(&self) -> Pass<'_> {
        loop {
            if let Some(p) = self.pass() {
                return p;
            }
            self.opened().await;
        }
    }

    /// Starts a hand-off to `to`: no pass is given from now on.
    pub fn close(&self, to: NodeId) {
        self.handing_to.send_replace(to);
        fence(Ordering::SeqCst);
    }

    /// Ends the hand-off: passes are given again.
    pub fn open(&self) {
        self.handing_to.send_replace(0);
    }

    /// True when the gate is closed and every pass given before is back: nothing more goes to
    /// Raft until the gate opens.
    pub fn quiet(&self) -> bool {
        self.handing_to().is_some() && self.passes.load(Ordering::SeqCst) == 0
    }

    /// The node the leadership is being handed to, if a hand-off is in progress.
    pub fn handing_to(&self) -> Option<NodeId> {
        Some(*self.handing_to.borrow()).filter(|n| *n != 0)
    }

    /// Returns once no hand-off is in progress.
    pub async fn opened(&self) {
        if self.handing_to().is_some() {
            let mut rx = self.handing_to.subscribe();
            let _ = rx.wait_for(|to| *to == 0).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_pass_given_before_the_gate_closed_keeps_it_from_being_quiet() {
        let gate = ProposalGate::default();
        let pass = gate.pass().expect("open gate");
        gate.close(3);
        assert_eq!(gate.handing_to(), Some(3));
        assert!(!gate.quiet(), "a proposal is still on its way to Raft");
        assert!(gate.pass().is_none(), "no pass while closed");
        assert!(!gate.quiet(), "a refused pass is not counted as out");
        drop(pass);
        assert!(gate.quiet());
        gate.open();
        assert!(!gate.quiet(), "an open gate is never quiet");
        assert!(gate.pass().is_some());
    }

    #[tokio::test]
    async fn a_waiting_proposal_gets_its_pass_when_the_hand_off_ends() {
        let gate = Arc::new(ProposalGate::default());
        gate.close(2);
        let waiter = {
            let gate = Arc::clone(&gate);
            tokio::spawn(async move {
                let _pass = gate.pass_when_open().await;
                gate.handing_to()
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "no pass while the hand-off runs");
        assert!(gate.quiet());
        gate.open();
        assert_eq!(waiter.await.expect("waiter"), None);
    }

    /// Proposers on other threads take passes as fast as they can; once the closed gate is
    /// quiet, not one more pass is given until it opens.
    #[test]
    fn once_quiet_no_proposal_gets_through() {
        let gate = Arc::new(ProposalGate::default());
        let through = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let proposers: Vec<_> = (0..3)
            .map(|_| {
                let (gate, through, stop) =
                    (Arc::clone(&gate), Arc::clone(&through), Arc::clone(&stop));
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        if let Some(_pass) = gate.pass() {
                            // The proposal goes to Raft while it holds the pass.
                            through.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                })
            })
            .collect();
        for round in 0..200 {
            gate.close(1);
            while !gate.quiet() {
                std::hint::spin_loop();
            }
            let seen = through.load(Ordering::SeqCst);
            for _ in 0..1_000 {
                std::hint::spin_loop();
            }
            assert_eq!(
                through.load(Ordering::SeqCst),
                seen,
                "round {round}: a proposal went through a quiet gate"
            );
            gate.open();
            let open_at = through.load(Ordering::SeqCst);
            while through.load(Ordering::SeqCst) == open_at {
                std::hint::spin_loop();
            }
        }
        stop.store(true, Ordering::Relaxed);
        for p in proposers {
            p.join().expect("proposer");
        }
    }
}
