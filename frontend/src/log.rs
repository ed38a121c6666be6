//! The frontend's narrow view of the journal: the `Log` trait, its implementation over the real
//! `journal::client::JournalClient`, and an in-memory implementation for tests.
//!
//! Contract: `append` answers with one index per payload once the payloads are durable;
//! `read(shard, from)` streams every committed record from `from` on, gap-free, and keeps
//! streaming; `read_index` answers an index that is safe for a linearizable read at the moment
//! the call was made; `status` answers the shard's leader, term and committed index.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use api::strata::journal::{LeaderChange, Record, StatusResponse, Tick, record::Kind};
use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::BoxStream;

/// A stream of committed records, in index order.
pub type RecordStream = BoxStream<'static, Result<Record, LogError>>;

/// What can go wrong talking to the journal, classified the way the frontend answers it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LogError {
    /// The journal could not be reached or has no leader right now: retryable.
    #[error("journal unavailable: {0}")]
    Unavailable(String),
    /// The requested position was trimmed; the state below `first_index` lives in checkpoints.
    #[error("journal position trimmed: first retained index is {first_index}")]
    Trimmed { first_index: u64 },
}

/// The journal as the frontend uses it (see the module comment for the contract).
pub trait Log: Send + Sync + 'static {
    fn append(
        &self,
        shard: u32,
        payloads: Vec<Vec<u8>>,
    ) -> BoxFuture<'_, Result<Vec<u64>, LogError>>;
    fn read(&self, shard: u32, from: u64) -> BoxFuture<'_, Result<RecordStream, LogError>>;
    fn read_index(&self, shard: u32) -> BoxFuture<'_, Result<u64, LogError>>;
    fn status(&self, shard: u32) -> BoxFuture<'_, Result<StatusResponse, LogError>>;
}

/// Time each in-memory append advances the log's clock by, in milliseconds.
const MEM_LOG_MS_PER_RECORD: i64 = 1;

struct MemState {
    /// `records[i]` has index `i + 1` (one shard; the shard argument is ignored).
    records: Vec<Record>,
    time_ms: i64,
    term: u64,
    unavailable: bool,
    read_index_calls: u64,
    read_index_delay: Duration,
}

/// An in-memory, single-shard journal for tests: same contract as the real one, plus knobs
/// (clock, outages, read-index latency) and counters.
#[derive(Clone)]
pub struct MemLog {
    state: Arc<Mutex<MemState>>,
    last: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Default for MemLog {
    fn default() -> Self {
        Self::new()
    }
}

impl MemLog {
    pub fn new() -> Self {
        let (last, _) = tokio::sync::watch::channel(0);
        Self {
            state: Arc::new(Mutex::new(MemState {
                records: Vec::new(),
                time_ms: 1_000,
                term: 1,
                unavailable: false,
                read_index_calls: 0,
                read_index_delay: Duration::ZERO,
            })),
            last: Arc::new(last),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MemState> {
        // A test log: a poisoned lock means a test already panicked.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn push(&self, kind: Kind) -> u64 {
        let index = {
            let mut s = self.lock();
            s.time_ms += MEM_LOG_MS_PER_RECORD;
            let index = s.records.len() as u64 + 1;
            let record = Record {
                index,
                term: s.term,
                time_ms: s.time_ms,
                kind: Some(kind),
            };
            s.records.push(record);
            index
        };
        self.last.send_replace(index);
        index
    }

    /// Whether any record, as encoded, contains `needle` (what a journal would hold on disk).
    pub fn holds_bytes(&self, needle: &[u8]) -> bool {
        use prost::Message;
        self.lock()
            .records
            .iter()
            .any(|r| r.encode_to_vec().windows(needle.len()).any(|w| w == needle))
    }

    /// Moves the leader's clock forward (lease expiry happens at the next record).
    pub fn advance_time(&self, ms: i64) {
        self.lock().time_ms += ms;
    }

    /// Appends an idle tick; answers its index.
    pub fn tick(&self) -> u64 {
        self.push(Kind::Tick(Tick {}))
    }

    /// A new leader takes over: the term moves on and its first record is a leader change.
    pub fn leader_change(&self) -> u64 {
        let term = {
            let mut s = self.lock();
            s.term += 1;
            s.term
        };
        self.push(Kind::LeaderChange(LeaderChange { term }))
    }

    /// While set, every call fails with `LogError::Unavailable` (open read streams stay open).
    pub fn set_unavailable(&self, unavailable: bool) {
        self.lock().unavailable = unavailable;
    }

    /// How long each `read_index` takes.
    pub fn set_read_index_delay(&self, delay: Duration) {
        self.lock().read_index_delay = delay;
    }

    pub fn read_index_calls(&self) -> u64 {
        self.lock().read_index_calls
    }

    pub fn last_index(&self) -> u64 {
        *self.last.borrow()
    }

    fn check(&self) -> Result<(), LogError> {
        if self.lock().unavailable {
            return Err(LogError::Unavailable(
                "in-memory log set unavailable".into(),
            ));
        }
        Ok(())
    }
}

impl Log for MemLog {
    fn append(
        &self,
        _shard: u32,
        payloads: Vec<Vec<u8>>,
    ) -> BoxFuture<'_, Result<Vec<u64>, LogError>> {
        Box::pin(async move {
            self.check()?;
            Ok(payloads
                .into_iter()
                .map(|p| self.push(Kind::Data(p)))
                .collect())
        })
    }

    fn read(&self, _shard: u32, from: u64) -> BoxFuture<'_, Result<RecordStream, LogError>> {
        Box::pin(async move {
            self.check()?;
            let log = self.clone();
            let rx = self.last.subscribe();
            let from = from.max(1);
            let stream =
                futures::stream::unfold((log, rx, from), |(log, mut rx, next)| async move {
                    loop {
                        let record = log.lock().records.get(next as usize - 1).cloned();
                        if let Some(r) = record {
                            return Some((Ok(r), (log, rx, next + 1)));
                        }
                        if rx.changed().await.is_err() {
                            return None;
                        }
                    }
                });
            Ok(stream.boxed())
        })
    }

    fn read_index(&self, _shard: u32) -> BoxFuture<'_, Result<u64, LogError>> {
        Box::pin(async move {
            self.check()?;
            let delay = {
                let mut s = self.lock();
                s.read_index_calls += 1;
                s.read_index_delay
            };
            // The index is taken when the call starts, as a leader's ReadIndex is.
            let index = self.last_index();
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            Ok(index)
        })
    }

    fn status(&self, _shard: u32) -> BoxFuture<'_, Result<StatusResponse, LogError>> {
        Box::pin(async move {
            self.check()?;
            let s = self.lock();
            let last = s.records.len() as u64;
            Ok(StatusResponse {
                node_id: 1,
                leader_id: 1,
                leader_addr: "memory".into(),
                term: s.term,
                first_index: 1,
                committed_index: last,
                last_index: last,
                shard_count: 1,
                errors: Vec::new(),
                acknowledged_by: Vec::new(),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn mem_log_streams_existing_then_new_records() {
        let log = MemLog::new();
        let a = log.append(0, vec![b"a".to_vec()]).await.unwrap();
        assert_eq!(a, vec![1]);
        let mut s = log.read(0, 1).await.unwrap();
        assert_eq!(s.next().await.unwrap().unwrap().index, 1);
        log.tick();
        let r = s.next().await.unwrap().unwrap();
        assert_eq!(r.index, 2);
        assert!(matches!(r.kind, Some(Kind::Tick(_))));
        assert!(r.time_ms > 1_000);
    }

    #[tokio::test]
    async fn mem_log_outage_fails_calls() {
        let log = MemLog::new();
        log.set_unavailable(true);
        assert!(matches!(
            log.append(0, vec![vec![1]]).await,
            Err(LogError::Unavailable(_))
        ));
        assert!(log.read_index(0).await.is_err());
        log.set_unavailable(false);
        assert_eq!(log.read_index(0).await.unwrap(), 0);
    }
}
