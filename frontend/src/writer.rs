//! Batched appends: concurrent writes to one shard are collected into shared `Append` calls
//! (group commit), bounded in entries and bytes, with a bounded number of appends in flight.
//!
//! An append is not retried past its writers: the journal client retries a failed append at
//! other nodes for up to 30 s, but once every write of the batch has gone (its client's call
//! ended: a deadline, a cancel) or the request deadline (`tenant::REQUEST_TIMEOUT`) has passed,
//! the batch's append is dropped, and with it the retries. Otherwise a write its client had
//! given up on could be appended after the same client's later, acknowledged writes, which etcd
//! never does (its proposal is in the old leader's log ahead of them, or lost).

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::log::{Log, LogError};

/// Most payloads in one append.
pub const MAX_BATCH_ENTRIES: usize = 512;
/// Most payload bytes in one append (a single larger payload still goes alone). Below the
/// journal's gRPC message limit with room for framing.
pub const MAX_BATCH_BYTES: usize = 2 * 1024 * 1024;
/// Appends in flight at once; while they run, the next batch fills. 16, not 4: under 256
/// clients puts were bound by append round trips with CPU to spare (docs/benchmarks/frontend.md,
/// session 4, "Appends in flight"); the journal's append stream takes thousands at once.
pub const MAX_INFLIGHT_APPENDS: usize = 16;
/// Writes waiting to be batched; more wait for room.
pub const WRITE_QUEUE: usize = 8192;

/// Metric names (units in the name): how long the oldest write of a batch waited before its
/// append was sent, and an append's round trip to the journal (both per batch).
pub const BATCH_WAIT_SECONDS: &str = "strata_frontend_append_batch_wait_seconds";
pub const APPEND_SECONDS: &str = "strata_frontend_append_seconds";
/// Appends given up before the journal answered: every write of the batch had gone, or the
/// request deadline passed (the journal client's retries stop with them).
pub const APPENDS_ABANDONED_TOTAL: &str = "strata_frontend_appends_abandoned_total";

struct Pending {
    payload: Vec<u8>,
    queued: Instant,
    done: oneshot::Sender<Result<u64, LogError>>,
}

/// Handle to a shard's writer task.
#[derive(Clone)]
pub struct Writer {
    tx: mpsc::Sender<Pending>,
}

impl Writer {
    /// Starts the writer task for `shard`; it stops when every handle is dropped.
    pub fn spawn(log: Arc<dyn Log>, shard: u32) -> Self {
        let (tx, rx) = mpsc::channel(WRITE_QUEUE);
        tokio::spawn(drive(log, shard, rx));
        Self { tx }
    }

    /// Appends one payload (in a batch with whatever else is waiting); answers its index once
    /// durable.
    pub async fn append(&self, payload: Vec<u8>) -> Result<u64, LogError> {
        let (done, rx) = oneshot::channel();
        self.tx
            .send(Pending {
                payload,
                queued: Instant::now(),
                done,
            })
            .await
            .map_err(|_| LogError::Unavailable("writer stopped".into()))?;
        rx.await
            .map_err(|_| LogError::Unavailable("writer stopped".into()))?
    }
}

/// Resolves once every write of a batch has gone (its caller stopped waiting).
async fn all_gone(dones: &mut [oneshot::Sender<Result<u64, LogError>>]) {
    futures::future::join_all(dones.iter_mut().map(|d| d.closed())).await;
}

async fn drive(log: Arc<dyn Log>, shard: u32, rx: mpsc::Receiver<Pending>) {
    drive_within(log, shard, rx, crate::tenant::REQUEST_TIMEOUT).await
}

/// `drive`, giving up on a batch's append `deadline` after its oldest write was queued.
async fn drive_within(
    log: Arc<dyn Log>,
    shard: u32,
    mut rx: mpsc::Receiver<Pending>,
    deadline: std::time::Duration,
) {
    let inflight = Arc::new(Semaphore::new(MAX_INFLIGHT_APPENDS));
    let mut carry: Option<Pending> = None;
    loop {
        let first = match carry.take() {
            Some(p) => p,
            None => match rx.recv().await {
                Some(p) => p,
                None => return,
            },
        };
        // Wait for room before collecting, so the batch grows while appends are in flight.
        let Ok(permit) = inflight.clone().acquire_owned().await else {
            return;
        };
        // One pass of the scheduler first, so that writes already read off client sockets
        // (their tasks woken, not yet run) join this batch: without it, the first write after
        // a batch's answers left alone in an append of its own in about half the appends under
        // a 256-client put load (docs/benchmarks/frontend.md, session 4).
        tokio::task::yield_now().await;
        let mut bytes = first.payload.len();
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH_ENTRIES {
            match rx.try_recv() {
                Ok(p) if bytes + p.payload.len() > MAX_BATCH_BYTES => {
                    carry = Some(p);
                    break;
                }
                Ok(p) => {
                    bytes += p.payload.len();
                    batch.push(p);
                }
                Err(_) => break,
            }
        }
        let log = log.clone();
        tokio::spawn(async move {
            let _permit = permit;
            metrics::histogram!("strata_frontend_append_batch_entries").record(batch.len() as f64);
            let sent = Instant::now();
            metrics::histogram!(BATCH_WAIT_SECONDS)
                .record(sent.duration_since(batch[0].queued).as_secs_f64());
            let until = tokio::time::Instant::from_std(batch[0].queued) + deadline;
            let (payloads, mut dones): (Vec<_>, Vec<_>) =
                batch.into_iter().map(|p| (p.payload, p.done)).unzip();
            let n = payloads.len();
            let answer = tokio::select! {
                a = log.append(shard, payloads) => a,
                () = all_gone(&mut dones) => {
                    tracing::debug!(shard, writes = n, "every write of the batch has gone; its append is dropped");
                    metrics::counter!(APPENDS_ABANDONED_TOTAL).increment(1);
                    return;
                }
                () = tokio::time::sleep_until(until) => {
                    metrics::counter!(APPENDS_ABANDONED_TOTAL).increment(1);
                    Err(LogError::Unavailable(format!(
                        "the journal did not confirm the append within {deadline:?}"
                    )))
                }
            };
            metrics::histogram!(APPEND_SECONDS).record(sent.elapsed().as_secs_f64());
            match answer {
                Ok(indexes) if indexes.len() == n => {
                    for (done, index) in dones.into_iter().zip(indexes) {
                        let _ = done.send(Ok(index));
                    }
                }
                Ok(indexes) => {
                    let e = LogError::Unavailable(format!(
                        "journal answered {} indexes for {n} payloads",
                        indexes.len()
                    ));
                    tracing::error!(shard, error = %e, "append answer malformed");
                    for done in dones {
                        let _ = done.send(Err(e.clone()));
                    }
                }
                Err(e) => {
                    tracing::warn!(shard, error = %e, "append failed");
                    for done in dones {
                        let _ = done.send(Err(e.clone()));
                    }
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::MemLog;
    use std::collections::BTreeSet;

    /// Counts appends and their sizes around a MemLog, and can hold appends until released.
    struct CountingLog {
        inner: MemLog,
        appends: std::sync::Mutex<Vec<usize>>,
        gate: Semaphore,
    }

    impl Log for CountingLog {
        fn append(
            &self,
            shard: u32,
            payloads: Vec<Vec<u8>>,
        ) -> futures::future::BoxFuture<'_, Result<Vec<u64>, LogError>> {
            Box::pin(async move {
                self.appends.lock().unwrap().push(payloads.len());
                let _g = self.gate.acquire().await.unwrap();
                self.inner.append(shard, payloads).await
            })
        }
        fn read(
            &self,
            shard: u32,
            from: u64,
        ) -> futures::future::BoxFuture<'_, Result<crate::log::RecordStream, LogError>> {
            self.inner.read(shard, from)
        }
        fn read_index(&self, shard: u32) -> futures::future::BoxFuture<'_, Result<u64, LogError>> {
            self.inner.read_index(shard)
        }
        fn status(
            &self,
            shard: u32,
        ) -> futures::future::BoxFuture<'_, Result<api::strata::journal::StatusResponse, LogError>>
        {
            self.inner.status(shard)
        }
    }

    #[tokio::test]
    async fn concurrent_writes_share_appends_and_get_distinct_indexes() {
        let log = Arc::new(CountingLog {
            inner: MemLog::new(),
            appends: Default::default(),
            gate: Semaphore::new(0),
        });
        let w = Writer::spawn(log.clone(), 0);
        let writers: Vec<_> = (0..1000u32)
            .map(|i| {
                let w = w.clone();
                tokio::spawn(async move { w.append(i.to_le_bytes().to_vec()).await })
            })
            .collect();
        // Hold appends until every writer has queued, then let them all through.
        loop {
            let a = log.appends.lock().unwrap().clone();
            if a.len() == MAX_INFLIGHT_APPENDS || a.iter().sum::<usize>() == 1000 {
                break;
            }
            tokio::task::yield_now().await;
        }
        log.gate.add_permits(1_000_000);
        let mut seen = BTreeSet::new();
        for h in writers {
            let idx = h.await.unwrap().unwrap();
            assert!(seen.insert(idx), "index {idx} handed out twice");
        }
        assert_eq!(seen.len(), 1000);
        assert_eq!(*seen.iter().next_back().unwrap(), 1000);
        let appends = log.appends.lock().unwrap().clone();
        assert_eq!(appends.iter().sum::<usize>(), 1000);
        assert!(
            appends.len() < 100,
            "1000 concurrent writes took {} appends",
            appends.len()
        );
        assert!(appends.iter().all(|&n| n <= MAX_BATCH_ENTRIES));
    }

    #[tokio::test]
    async fn batches_respect_the_byte_bound() {
        let log = Arc::new(CountingLog {
            inner: MemLog::new(),
            appends: Default::default(),
            gate: Semaphore::new(0),
        });
        let w = Writer::spawn(log.clone(), 0);
        let big = MAX_BATCH_BYTES / 2 + 1;
        let writers: Vec<_> = (0..6)
            .map(|_| {
                let w = w.clone();
                tokio::spawn(async move { w.append(vec![0u8; big]).await })
            })
            .collect();
        tokio::task::yield_now().await;
        log.gate.add_permits(1000);
        for h in writers {
            h.await.unwrap().unwrap();
        }
        // Two payloads over half the bound never share an append.
        assert!(log.appends.lock().unwrap().iter().all(|&n| n == 1));
    }

    /// A log whose appends never finish, counting the ones dropped unfinished.
    #[derive(Default)]
    struct HangingLog {
        started: std::sync::atomic::AtomicUsize,
        dropped: Arc<std::sync::atomic::AtomicUsize>,
    }

    struct CountDrop(Arc<std::sync::atomic::AtomicUsize>);

    impl Drop for CountDrop {
        fn drop(&mut self) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    impl Log for HangingLog {
        fn append(
            &self,
            _shard: u32,
            _payloads: Vec<Vec<u8>>,
        ) -> futures::future::BoxFuture<'_, Result<Vec<u64>, LogError>> {
            self.started
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let guard = CountDrop(Arc::clone(&self.dropped));
            Box::pin(async move {
                let _guard = guard;
                std::future::pending().await
            })
        }
        fn read(
            &self,
            _shard: u32,
            _from: u64,
        ) -> futures::future::BoxFuture<'_, Result<crate::log::RecordStream, LogError>> {
            unreachable!()
        }
        fn read_index(&self, _shard: u32) -> futures::future::BoxFuture<'_, Result<u64, LogError>> {
            unreachable!()
        }
        fn status(
            &self,
            _shard: u32,
        ) -> futures::future::BoxFuture<'_, Result<api::strata::journal::StatusResponse, LogError>>
        {
            unreachable!()
        }
    }

    async fn until(cond: impl Fn() -> bool) {
        for _ in 0..10_000 {
            if cond() {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("condition not reached");
    }

    #[tokio::test]
    async fn an_append_whose_writers_all_left_is_dropped_with_its_retries() {
        use std::sync::atomic::Ordering::SeqCst;
        let log = Arc::new(HangingLog::default());
        let w = Writer::spawn(log.clone(), 0);
        let writers: Vec<_> = (0..3)
            .map(|i| {
                let w = w.clone();
                tokio::spawn(async move { w.append(vec![i]).await })
            })
            .collect();
        until(|| log.started.load(SeqCst) >= 1).await;
        // Two of three writers leave: the append goes on for the third.
        let mut writers = writers.into_iter();
        let last = writers.next_back().unwrap();
        for h in writers {
            h.abort();
        }
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        // (All three may have shared one append, or not: only appends with a writer left run.)
        let started = log.started.load(SeqCst);
        assert!(
            log.dropped.load(SeqCst) < started,
            "every append was dropped"
        );
        last.abort();
        until(|| log.dropped.load(SeqCst) == log.started.load(SeqCst)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn an_append_unconfirmed_at_the_deadline_fails_and_stops() {
        use std::sync::atomic::Ordering::SeqCst;
        let log = Arc::new(HangingLog::default());
        let (tx, rx) = mpsc::channel(WRITE_QUEUE);
        let w = Writer { tx };
        let deadline = std::time::Duration::from_secs(15);
        tokio::spawn(drive_within(log.clone(), 0, rx, deadline));
        let e = w.append(vec![1]).await;
        assert!(
            matches!(&e, Err(LogError::Unavailable(m)) if m.contains("did not confirm")),
            "{e:?}"
        );
        assert_eq!(log.started.load(SeqCst), 1);
        until(|| log.dropped.load(SeqCst) == 1).await;
    }

    #[tokio::test]
    async fn append_errors_reach_every_writer_of_the_batch() {
        let log = MemLog::new();
        log.set_unavailable(true);
        let w = Writer::spawn(Arc::new(log.clone()), 0);
        let e = w.append(vec![1]).await;
        assert!(matches!(e, Err(LogError::Unavailable(_))));
        log.set_unavailable(false);
        assert_eq!(w.append(vec![2]).await.unwrap(), 1);
    }
}
