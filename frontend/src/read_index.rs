//! Shared read-index rounds: concurrent linearizable readers of one shard share one journal
//! `ReadIndex` round trip (DESIGN invariant 5).
//!
//! A reader that arrives while a round is in flight waits for the *next* round: the in-flight
//! round may have been answered before the reader's request existed, so its index could miss a
//! write the reader must see. One driver task per shard takes every waiting reader, runs one
//! round, answers all of them, and starts again.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use crate::log::{Log, LogError};

/// Readers that may wait for a round at once; more wait for room (backpressure, not failure).
pub const READ_INDEX_QUEUE: usize = 4096;

type Waiter = oneshot::Sender<Result<u64, LogError>>;

/// Handle to a shard's read-index driver.
#[derive(Clone)]
pub struct ReadIndexer {
    tx: mpsc::Sender<Waiter>,
}

impl ReadIndexer {
    /// Starts the driver task for `shard`; it stops when every handle is dropped.
    pub fn spawn(log: Arc<dyn Log>, shard: u32) -> Self {
        let (tx, rx) = mpsc::channel(READ_INDEX_QUEUE);
        tokio::spawn(drive(log, shard, rx));
        Self { tx }
    }

    /// An index safe for a linearizable read issued now.
    pub async fn read_index(&self) -> Result<u64, LogError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(tx)
            .await
            .map_err(|_| LogError::Unavailable("read-index driver stopped".into()))?;
        rx.await
            .map_err(|_| LogError::Unavailable("read-index driver stopped".into()))?
    }
}

async fn drive(log: Arc<dyn Log>, shard: u32, mut rx: mpsc::Receiver<Waiter>) {
    let mut round: Vec<Waiter> = Vec::new();
    while let Some(first) = rx.recv().await {
        round.push(first);
        // Everyone who asked before this round starts shares it.
        while let Ok(w) = rx.try_recv() {
            round.push(w);
        }
        let result = log.read_index(shard).await;
        metrics::counter!("strata_frontend_read_index_rounds_total").increment(1);
        metrics::histogram!("strata_frontend_read_index_round_readers").record(round.len() as f64);
        for w in round.drain(..) {
            let _ = w.send(result.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::MemLog;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn concurrent_readers_share_rounds() {
        let log = MemLog::new();
        log.append(0, vec![vec![1], vec![2]]).await.unwrap();
        log.set_read_index_delay(Duration::from_millis(10));
        let ri = ReadIndexer::spawn(Arc::new(log.clone()), 0);
        let readers: Vec<_> = (0..100)
            .map(|_| {
                let ri = ri.clone();
                tokio::spawn(async move { ri.read_index().await })
            })
            .collect();
        for r in readers {
            assert_eq!(r.await.unwrap().unwrap(), 2);
        }
        // The first round takes whoever was queued; everyone else shares the second.
        let calls = log.read_index_calls();
        assert!((1..=2).contains(&calls), "{calls} rounds for 100 readers");
    }

    #[tokio::test(start_paused = true)]
    async fn reader_arriving_mid_round_waits_for_the_next_round() {
        let log = MemLog::new();
        log.set_read_index_delay(Duration::from_millis(50));
        let ri = ReadIndexer::spawn(Arc::new(log.clone()), 0);
        let early = {
            let ri = ri.clone();
            tokio::spawn(async move { ri.read_index().await })
        };
        // Let the first round start (it captures index 0), then a write commits.
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(log.read_index_calls(), 1);
        let idx = log.append(0, vec![vec![7]]).await.unwrap()[0];
        let late = ri.read_index().await.unwrap();
        assert!(late >= idx, "late reader got {late}, write was at {idx}");
        assert_eq!(early.await.unwrap().unwrap(), 0);
        assert_eq!(log.read_index_calls(), 2);
    }

    #[tokio::test]
    async fn errors_reach_every_reader_of_the_round() {
        let log = MemLog::new();
        log.set_unavailable(true);
        let ri = ReadIndexer::spawn(Arc::new(log.clone()), 0);
        assert!(matches!(
            ri.read_index().await,
            Err(LogError::Unavailable(_))
        ));
        log.set_unavailable(false);
        assert_eq!(ri.read_index().await.unwrap(), 0);
    }
}
