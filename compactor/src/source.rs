//! Where the compactor reads and trims journal shards: the `Journal` trait (read from an index,
//! trim, first retained index), its implementation over `journal::client::JournalClient`, and an
//! in-memory journal with the same contract for tests and benchmarks.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};

use api::strata::journal::Record;
use api::strata::journal::record::Kind;
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::sync::watch;

use crate::error::{Error, Result};

/// Committed records of one shard, in index order, gap-free, endless.
pub type RecordStream = BoxStream<'static, Result<Record>>;

/// The journal operations the compactor needs. Contract (as `JournalClient`'s):
/// - `read(shard, from)` yields every committed record from `from` on, in order, without gaps,
///   then waits for new ones; `Error::Trimmed` if `from` is below the trim point.
/// - `trim(shard, below)` drops records below `below` and returns the first retained index.
/// - `first_index(shard)` is the first retained index (1 on a journal never trimmed).
/// - `append_entries(shard, payloads)` appends encoded entries and returns their indexes once
///   committed (the compactor appends only auto-compaction requests).
pub trait Journal: Clone + Send + Sync + 'static {
    fn read(&self, shard: u32, from: u64) -> impl Future<Output = Result<RecordStream>> + Send;
    fn trim(&self, shard: u32, below: u64) -> impl Future<Output = Result<u64>> + Send;
    fn first_index(&self, shard: u32) -> impl Future<Output = Result<u64>> + Send;
    fn append_entries(
        &self,
        shard: u32,
        payloads: Vec<Vec<u8>>,
    ) -> impl Future<Output = Result<Vec<u64>>> + Send;
}

/// An in-memory journal: appends stamp the given time; readers wake on every append.
#[derive(Clone, Default)]
pub struct MemJournal {
    inner: Arc<MemInner>,
}

struct MemInner {
    shards: Mutex<HashMap<u32, MemShard>>,
    /// Bumped on every append; readers wait on it.
    changed: watch::Sender<u64>,
}

impl Default for MemInner {
    fn default() -> Self {
        Self {
            shards: Mutex::new(HashMap::new()),
            changed: watch::channel(0).0,
        }
    }
}

struct MemShard {
    /// Index of `records[0]` (or of the next record if empty).
    first: u64,
    records: VecDeque<Record>,
    last_time_ms: i64,
}

impl Default for MemShard {
    fn default() -> Self {
        Self {
            first: 1,
            records: VecDeque::new(),
            last_time_ms: 0,
        }
    }
}

impl MemJournal {
    pub fn new() -> Self {
        Self::default()
    }

    fn notifier(&self) -> watch::Receiver<u64> {
        self.inner.changed.subscribe()
    }

    fn notify(&self) {
        self.inner.changed.send_modify(|v| *v += 1);
    }

    /// Appends records of the given kinds at journal time `time_ms` (kept monotonic per shard,
    /// as the journal leader does) and returns their indexes.
    pub fn append(&self, shard: u32, time_ms: i64, kinds: Vec<Kind>) -> Vec<u64> {
        let mut out = Vec::with_capacity(kinds.len());
        {
            let mut shards = self.inner.shards.lock().expect("mem journal lock poisoned");
            let s = shards.entry(shard).or_default();
            let t = time_ms.max(s.last_time_ms);
            s.last_time_ms = t;
            for kind in kinds {
                let index = s.first + s.records.len() as u64;
                s.records.push_back(Record {
                    index,
                    term: 1,
                    time_ms: t,
                    kind: Some(kind),
                });
                out.push(index);
            }
        }
        self.notify();
        out
    }

    /// Index of the last record of `shard` (first - 1 when empty).
    pub fn last_index(&self, shard: u32) -> u64 {
        let shards = self.inner.shards.lock().expect("mem journal lock poisoned");
        shards
            .get(&shard)
            .map_or(0, |s| s.first + s.records.len() as u64 - 1)
    }

    /// All retained records of `shard` from `from` (clamped to the first retained) on.
    pub fn records(&self, shard: u32, from: u64) -> Vec<Record> {
        let shards = self.inner.shards.lock().expect("mem journal lock poisoned");
        let Some(s) = shards.get(&shard) else {
            return Vec::new();
        };
        let skip = from.saturating_sub(s.first) as usize;
        s.records.iter().skip(skip).cloned().collect()
    }

    fn next_batch(&self, shard: u32, from: u64) -> Result<Vec<Record>> {
        let shards = self.inner.shards.lock().expect("mem journal lock poisoned");
        let Some(s) = shards.get(&shard) else {
            return Ok(Vec::new());
        };
        if from < s.first {
            return Err(Error::Trimmed {
                shard,
                wanted: from,
                first_index: s.first,
            });
        }
        let skip = (from - s.first) as usize;
        Ok(s.records
            .iter()
            .skip(skip)
            .take(MEM_READ_BATCH)
            .cloned()
            .collect())
    }
}

/// Records handed to a reader of the in-memory journal at once.
const MEM_READ_BATCH: usize = 1024;

impl Journal for MemJournal {
    async fn read(&self, shard: u32, from: u64) -> Result<RecordStream> {
        // Fail at once when `from` is trimmed, as the real client does.
        self.next_batch(shard, from)?;
        let state = (
            self.clone(),
            self.notifier(),
            from.max(1),
            VecDeque::<Record>::new(),
        );
        let s = futures::stream::unfold(Some(state), move |st| async move {
            let (j, mut rx, mut next, mut buf) = st?;
            loop {
                if let Some(r) = buf.pop_front() {
                    return Some((Ok(r), Some((j, rx, next, buf))));
                }
                rx.borrow_and_update();
                match j.next_batch(shard, next) {
                    Ok(batch) if !batch.is_empty() => {
                        next += batch.len() as u64;
                        buf.extend(batch);
                    }
                    Ok(_) => {
                        if rx.changed().await.is_err() {
                            return None;
                        }
                    }
                    Err(e) => return Some((Err(e), None)),
                }
            }
        });
        Ok(s.boxed())
    }

    async fn trim(&self, shard: u32, below: u64) -> Result<u64> {
        let mut shards = self.inner.shards.lock().expect("mem journal lock poisoned");
        let s = shards.entry(shard).or_default();
        let end = s.first + s.records.len() as u64;
        let below = below.min(end);
        while s.first < below {
            s.records.pop_front();
            s.first += 1;
        }
        Ok(s.first)
    }

    async fn first_index(&self, shard: u32) -> Result<u64> {
        let shards = self.inner.shards.lock().expect("mem journal lock poisoned");
        Ok(shards.get(&shard).map_or(1, |s| s.first))
    }

    async fn append_entries(&self, shard: u32, payloads: Vec<Vec<u8>>) -> Result<Vec<u64>> {
        // Stamped with the newest time of the shard: the in-memory journal has no clock.
        let time_ms = {
            let shards = self.inner.shards.lock().expect("mem journal lock poisoned");
            shards.get(&shard).map_or(0, |s| s.last_time_ms)
        };
        Ok(self.append(
            shard,
            time_ms,
            payloads.into_iter().map(Kind::Data).collect(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::strata::journal::Tick;

    #[tokio::test]
    async fn reads_follow_appends_and_trims_refuse_old_positions() {
        let j = MemJournal::new();
        assert_eq!(j.append(0, 10, vec![Kind::Tick(Tick {}); 3]), vec![1, 2, 3]);
        let mut s = j.read(0, 2).await.unwrap();
        assert_eq!(s.next().await.unwrap().unwrap().index, 2);
        assert_eq!(s.next().await.unwrap().unwrap().index, 3);
        let waiter = tokio::spawn(async move { s.next().await.unwrap().unwrap() });
        j.append(0, 5, vec![Kind::Tick(Tick {})]);
        let r = waiter.await.unwrap();
        assert_eq!((r.index, r.time_ms), (4, 10), "time stays monotonic");
        assert_eq!(j.trim(0, 3).await.unwrap(), 3);
        assert!(matches!(
            j.read(0, 2).await,
            Err(Error::Trimmed { first_index: 3, .. })
        ));
        assert_eq!(j.first_index(0).await.unwrap(), 3);
        assert_eq!(j.last_index(0), 4);
    }
}
