//! `SharedTail`: one journal read per shard for every tenant replica of this frontend
//! (docs/design/tenants.md, T4), instead of one per tenant. Every other `Log` call goes to the
//! journal unchanged.
//!
//! A feed per shard reads the journal once and keeps the last [`WINDOW`] records. A replica's
//! `read(shard, from)` is served from the feed when `from` is inside its window or just past
//! its end; a replica further behind (it loaded an older checkpoint, or fell out of the window
//! while a long apply held it) reads the journal on its own and joins the feed as soon as its
//! next record is in the window again. The feed re-opens its read after a journal error; when
//! the journal was trimmed past it, it reports the trim to the replicas that reach that point
//! (they reload their checkpoints, as with their own read) and starts again where the first
//! replica asks next.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use api::strata::journal::{Record, StatusResponse};
use futures::StreamExt;
use futures::future::BoxFuture;
use tokio::sync::watch;

use crate::log::{Log, LogError, RecordStream};

/// Records a feed keeps for replicas that are a little behind, and their most payload bytes
/// (the newest record is kept whatever its size).
pub const WINDOW: usize = 4096;
pub const WINDOW_BYTES: usize = 64 << 20;
/// Pause before the feed re-opens a failed read (doubling up to `REOPEN_MAX`).
const REOPEN_MIN: Duration = Duration::from_millis(50);
const REOPEN_MAX: Duration = Duration::from_secs(2);

/// The journal, with one read per shard shared by every reader of this process.
pub struct SharedTail {
    inner: Arc<dyn Log>,
    feeds: Mutex<HashMap<u32, Arc<Feed>>>,
    window: (usize, usize),
}

impl SharedTail {
    pub fn new(inner: Arc<dyn Log>) -> Self {
        Self::with_window(inner, WINDOW, WINDOW_BYTES)
    }

    /// A feed window of `records` records and `bytes` payload bytes at most.
    pub fn with_window(inner: Arc<dyn Log>, records: usize, bytes: usize) -> Self {
        Self {
            inner,
            feeds: Mutex::new(HashMap::new()),
            window: (records.max(1), bytes),
        }
    }

    /// The shard's feed, started at `from` if there is none yet.
    fn feed(&self, shard: u32, from: u64) -> Arc<Feed> {
        let mut feeds = self.feeds.lock().unwrap_or_else(|e| e.into_inner());
        feeds
            .entry(shard)
            .or_insert_with(|| {
                let feed = Arc::new(Feed::new(from, self.window));
                tokio::spawn(feed.clone().run(self.inner.clone(), shard));
                feed
            })
            .clone()
    }
}

struct Feed {
    state: Mutex<FeedState>,
    /// Most records and payload bytes kept.
    window: (usize, usize),
    /// Bumped after every change of `state`: readers wait on it.
    changes: watch::Sender<u64>,
}

struct FeedState {
    /// Consecutive records, the oldest first; `records[0]` has index `first`.
    records: VecDeque<Record>,
    /// Payload bytes of `records`.
    bytes: usize,
    first: u64,
    /// The index the feed reads next (`first + records.len()`).
    next: u64,
    /// The journal no longer holds `next`: why, until a reader restarts the feed.
    trimmed: Option<u64>,
    /// A reader asked to restart the trimmed feed at this index (only ever set while
    /// `trimmed` is: the read that met the trim has ended by then).
    restart: Option<u64>,
}

impl Feed {
    fn new(from: u64, window: (usize, usize)) -> Self {
        Self {
            window,
            state: Mutex::new(FeedState {
                records: VecDeque::new(),
                bytes: 0,
                first: from,
                next: from,
                trimmed: None,
                restart: None,
            }),
            changes: watch::channel(0).0,
        }
    }

    fn lock(&self) -> MutexGuard<'_, FeedState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn changed(&self) {
        self.changes.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Whether a reader whose next record is `cursor` can follow the feed from here.
    fn covers(&self, cursor: u64) -> bool {
        let s = self.lock();
        s.trimmed.is_none() && s.first <= cursor && cursor <= s.next
    }

    /// Reads the shard for as long as the process runs.
    async fn run(self: Arc<Self>, log: Arc<dyn Log>, shard: u32) {
        let mut backoff = REOPEN_MIN;
        loop {
            let from = {
                let mut s = self.lock();
                if let Some(at) = s.restart.take() {
                    s.records.clear();
                    s.bytes = 0;
                    s.first = at;
                    s.next = at;
                    s.trimmed = None;
                }
                if s.trimmed.is_some() {
                    None
                } else {
                    Some(s.next)
                }
            };
            let Some(from) = from else {
                // Trimmed: wait for a reader to say where to start again.
                let mut rx = self.changes.subscribe();
                while self.lock().restart.is_none() {
                    if rx.changed().await.is_err() {
                        return;
                    }
                }
                continue;
            };
            let mut stream = match log.read(shard, from).await {
                Ok(s) => s,
                Err(e) => {
                    self.failed(e, &mut backoff).await;
                    continue;
                }
            };
            while let Some(item) = stream.next().await {
                match item {
                    Ok(record) => {
                        if !self.push(record) {
                            break;
                        }
                        backoff = REOPEN_MIN;
                    }
                    Err(e) => {
                        self.failed(e, &mut backoff).await;
                        break;
                    }
                }
            }
        }
    }

    /// Appends the next record; false on a gap (the read is re-opened).
    fn push(&self, record: Record) -> bool {
        {
            let mut s = self.lock();
            if record.index < s.next {
                return true;
            }
            if record.index > s.next {
                tracing::warn!(
                    index = record.index,
                    expected = s.next,
                    "gap in the shared journal read; re-opening"
                );
                return false;
            }
            s.bytes += payload_len(&record);
            s.records.push_back(record);
            s.next += 1;
            let (records, bytes) = self.window;
            while s.records.len() > records || (s.bytes > bytes && s.records.len() > 1) {
                if let Some(old) = s.records.pop_front() {
                    s.bytes -= payload_len(&old);
                    s.first += 1;
                }
            }
        }
        self.changed();
        true
    }

    async fn failed(&self, e: LogError, backoff: &mut Duration) {
        match e {
            LogError::Trimmed { first_index } => {
                self.lock().trimmed = Some(first_index);
                self.changed();
            }
            LogError::Unavailable(why) => {
                tracing::warn!(error = %why, "shared journal read failed; re-opening");
                tokio::time::sleep(*backoff).await;
                *backoff = (*backoff * 2).min(REOPEN_MAX);
            }
        }
    }
}

fn payload_len(r: &Record) -> usize {
    match &r.kind {
        Some(api::strata::journal::record::Kind::Data(d)) => d.len(),
        _ => 0,
    }
}

/// What a reader of the feed gets next.
enum Next {
    Record(Record),
    Trimmed(u64),
    /// The feed moved on without it (window passed, or restarted elsewhere).
    Left,
    Wait,
}

/// One reader's stream over the feed from `cursor`, falling back to its own journal read when
/// the feed cannot serve it, and joining the feed again when it can.
struct Reader {
    feed: Arc<Feed>,
    log: Arc<dyn Log>,
    shard: u32,
    cursor: u64,
    changes: watch::Receiver<u64>,
    /// Its own journal read while it is behind the feed.
    own: Option<RecordStream>,
}

impl Reader {
    fn next_from_feed(&mut self) -> Next {
        self.changes.borrow_and_update();
        let mut s = self.feed.lock();
        if self.cursor < s.first {
            return Next::Left;
        }
        if let Some(r) = s.records.get((self.cursor - s.first) as usize) {
            return Next::Record(r.clone());
        }
        match s.trimmed {
            // The journal still holds this reader's next record (it waited ahead of the feed,
            // which met a trim it had not reached): the feed starts again there, and the
            // readers before it meet the trim on their own reads, if it concerns them.
            Some(first_index)
                if self.cursor >= s.next && s.restart.is_none() && self.cursor >= first_index =>
            {
                s.restart = Some(self.cursor);
                drop(s);
                self.feed.changed();
                Next::Wait
            }
            // (A restart asked for is the feed's next state: wait for it.)
            Some(first_index) if self.cursor >= s.next && s.restart.is_none() => {
                Next::Trimmed(first_index)
            }
            _ => Next::Wait,
        }
    }

    async fn next(&mut self) -> Option<Result<Record, LogError>> {
        loop {
            if let Some(own) = &mut self.own {
                if self.feed.covers(self.cursor) {
                    self.own = None;
                    continue;
                }
                let item = own.next().await?;
                if let Ok(r) = &item {
                    self.cursor = self.cursor.max(r.index + 1);
                }
                return Some(item);
            }
            match self.next_from_feed() {
                Next::Record(r) => {
                    self.cursor = r.index + 1;
                    return Some(Ok(r));
                }
                Next::Trimmed(first_index) => {
                    return Some(Err(LogError::Trimmed { first_index }));
                }
                Next::Left => match self.log.read(self.shard, self.cursor).await {
                    Ok(s) => self.own = Some(s),
                    Err(e) => return Some(Err(e)),
                },
                Next::Wait => {
                    if self.changes.changed().await.is_err() {
                        return None;
                    }
                }
            }
        }
    }
}

impl Log for SharedTail {
    fn append(
        &self,
        shard: u32,
        payloads: Vec<Vec<u8>>,
    ) -> BoxFuture<'_, Result<Vec<u64>, LogError>> {
        self.inner.append(shard, payloads)
    }

    fn read(&self, shard: u32, from: u64) -> BoxFuture<'_, Result<RecordStream, LogError>> {
        Box::pin(async move {
            let from = from.max(1);
            let feed = self.feed(shard, from);
            {
                // A trimmed feed starts again where the first reader after the trim asks.
                let mut s = feed.lock();
                if s.trimmed.is_some() && s.restart.is_none() {
                    s.restart = Some(from);
                }
            }
            feed.changed();
            let reader = Reader {
                changes: feed.changes.subscribe(),
                feed,
                log: self.inner.clone(),
                shard,
                cursor: from,
                own: None,
            };
            let stream = futures::stream::unfold(reader, |mut r| async move {
                r.next().await.map(|item| (item, r))
            });
            Ok(stream.boxed())
        })
    }

    fn read_index(&self, shard: u32) -> BoxFuture<'_, Result<u64, LogError>> {
        self.inner.read_index(shard)
    }

    fn status(&self, shard: u32) -> BoxFuture<'_, Result<StatusResponse, LogError>> {
        self.inner.status(shard)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

    use super::*;
    use crate::log::MemLog;

    /// The in-memory journal, counting reads, trimmed below `floor`.
    #[derive(Clone)]
    struct Counted {
        log: MemLog,
        reads: Arc<AtomicUsize>,
        floor: Arc<AtomicU64>,
        /// Open reads end at their next record once this is set (a broken connection).
        cut: Arc<std::sync::atomic::AtomicBool>,
    }

    impl Counted {
        fn new() -> Self {
            Self {
                log: MemLog::new(),
                reads: Arc::default(),
                floor: Arc::new(AtomicU64::new(1)),
                cut: Arc::default(),
            }
        }
    }

    impl Log for Counted {
        fn append(
            &self,
            shard: u32,
            payloads: Vec<Vec<u8>>,
        ) -> BoxFuture<'_, Result<Vec<u64>, LogError>> {
            self.log.append(shard, payloads)
        }

        fn read(&self, shard: u32, from: u64) -> BoxFuture<'_, Result<RecordStream, LogError>> {
            self.reads.fetch_add(1, Ordering::Relaxed);
            let first_index = self.floor.load(Ordering::Relaxed);
            if from < first_index {
                return Box::pin(async move { Err(LogError::Trimmed { first_index }) });
            }
            let cut = self.cut.clone();
            let read = self.log.read(shard, from);
            Box::pin(async move {
                let s = read.await?;
                let s = s.take_while(move |_| futures::future::ready(!cut.load(Ordering::Relaxed)));
                Ok(s.boxed())
            })
        }

        fn read_index(&self, shard: u32) -> BoxFuture<'_, Result<u64, LogError>> {
            self.log.read_index(shard)
        }

        fn status(&self, shard: u32) -> BoxFuture<'_, Result<StatusResponse, LogError>> {
            self.log.status(shard)
        }
    }

    async fn append(log: &Counted, n: usize) {
        for i in 0..n {
            log.append(0, vec![vec![i as u8; 10]]).await.unwrap();
        }
    }

    /// The next `n` indexes a stream yields (each within 5 s).
    async fn indexes(s: &mut RecordStream, n: usize) -> Vec<u64> {
        let mut got = Vec::new();
        for _ in 0..n {
            let r = tokio::time::timeout(Duration::from_secs(5), s.next())
                .await
                .expect("a record within 5 s")
                .expect("the stream goes on")
                .expect("a record");
            got.push(r.index);
        }
        got
    }

    #[tokio::test]
    async fn readers_at_different_places_share_one_read() {
        let inner = Counted::new();
        append(&inner, 10).await;
        let tail = SharedTail::new(Arc::new(inner.clone()));
        let mut a = tail.read(0, 1).await.unwrap();
        let mut b = tail.read(0, 6).await.unwrap();
        assert_eq!(indexes(&mut a, 10).await, (1..=10).collect::<Vec<_>>());
        assert_eq!(indexes(&mut b, 5).await, (6..=10).collect::<Vec<_>>());
        // New records reach both, live.
        append(&inner, 3).await;
        assert_eq!(indexes(&mut a, 3).await, [11, 12, 13]);
        assert_eq!(indexes(&mut b, 3).await, [11, 12, 13]);
        assert_eq!(
            inner.reads.load(Ordering::Relaxed),
            1,
            "one journal read for both"
        );
    }

    #[tokio::test]
    async fn a_reader_behind_the_window_reads_alone_then_joins() {
        let inner = Counted::new();
        append(&inner, 50).await;
        let tail = SharedTail::with_window(Arc::new(inner.clone()), 8, usize::MAX);
        // (Less than the window, so the feed cannot leave this reader behind.)
        let mut ahead = tail.read(0, 45).await.unwrap();
        assert_eq!(indexes(&mut ahead, 6).await, (45..=50).collect::<Vec<_>>());
        // The window holds 45..=50 now: a reader from 1 reads on its own...
        let mut behind = tail.read(0, 1).await.unwrap();
        assert_eq!(indexes(&mut behind, 50).await, (1..=50).collect::<Vec<_>>());
        assert_eq!(inner.reads.load(Ordering::Relaxed), 2);
        // ...and then follows the feed: no third read for what comes next.
        for i in 51..=70 {
            append(&inner, 1).await;
            assert_eq!(indexes(&mut behind, 1).await, [i]);
            assert_eq!(indexes(&mut ahead, 1).await, [i]);
        }
        assert_eq!(inner.reads.load(Ordering::Relaxed), 2);
    }

    #[tokio::test]
    async fn a_large_record_window_is_bounded_by_bytes() {
        let inner = Counted::new();
        for _ in 0..5 {
            inner.append(0, vec![vec![7; 1000]]).await.unwrap();
        }
        let tail = SharedTail::with_window(Arc::new(inner.clone()), 100, 2500);
        let mut a = tail.read(0, 1).await.unwrap();
        assert_eq!(indexes(&mut a, 5).await, [1, 2, 3, 4, 5]);
        let feed = tail.feed(0, 1);
        let s = feed.lock();
        assert_eq!((s.first, s.next, s.bytes), (4, 6, 2000));
    }

    async fn next_error(s: &mut RecordStream) -> LogError {
        tokio::time::timeout(Duration::from_secs(5), s.next())
            .await
            .expect("an answer within 5 s")
            .expect("the stream goes on")
            .expect_err("an error")
    }

    #[tokio::test]
    async fn a_trim_reaches_the_readers_and_the_feed_starts_again_where_asked() {
        let inner = Counted::new();
        append(&inner, 5).await;
        let tail = SharedTail::with_window(Arc::new(inner.clone()), 2, usize::MAX);
        let mut a = tail.read(0, 1).await.unwrap();
        assert_eq!(indexes(&mut a, 5).await, [1, 2, 3, 4, 5]);
        // A reader behind the window meets the trim on its own read.
        inner.floor.store(4, Ordering::Relaxed);
        let mut behind = tail.read(0, 2).await.unwrap();
        let e = next_error(&mut behind).await;
        assert!(matches!(e, LogError::Trimmed { first_index: 4 }), "{e:?}");
        // The shared read breaks and the journal is trimmed past it: a reader at the feed's end
        // is told, as its own read would tell it.
        inner.floor.store(9, Ordering::Relaxed);
        inner.cut.store(true, Ordering::Relaxed);
        append(&inner, 3).await;
        let e = next_error(&mut a).await;
        assert!(matches!(e, LogError::Trimmed { first_index: 9 }), "{e:?}");
        // It reloads (a checkpoint at 8) and reads from 9: the feed starts again there.
        inner.cut.store(false, Ordering::Relaxed);
        let mut reloaded = tail.read(0, 9).await.unwrap();
        append(&inner, 2).await;
        assert_eq!(indexes(&mut reloaded, 2).await, [9, 10]);
        let mut joined = tail.read(0, 10).await.unwrap();
        append(&inner, 1).await;
        assert_eq!(indexes(&mut joined, 2).await, [10, 11]);
        assert_eq!(indexes(&mut reloaded, 1).await, [11]);
    }

    /// A reader waiting ahead of the feed (a replica loaded from a newer checkpoint than the
    /// one the feed started for) is not told of a trim below its own next record: the feed
    /// starts again there. (It was told, and its replica, unable to load a checkpoint newer
    /// than itself, stopped: found by fault seed 0x5eed3c45.)
    #[tokio::test]
    async fn a_reader_ahead_of_a_trimmed_feed_reads_on() {
        let inner = Counted::new();
        append(&inner, 5).await;
        let tail = SharedTail::with_window(Arc::new(inner.clone()), 2, usize::MAX);
        let mut a = tail.read(0, 1).await.unwrap();
        assert_eq!(indexes(&mut a, 5).await, [1, 2, 3, 4, 5]);
        let mut ahead = tail.read(0, 9).await.unwrap();
        // The shared read breaks and the journal is trimmed below 9 meanwhile.
        inner.floor.store(9, Ordering::Relaxed);
        inner.cut.store(true, Ordering::Relaxed);
        append(&inner, 5).await;
        let feed = tail.feed(0, 1);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while feed.lock().trimmed.is_none() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the feed never met the trim"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        inner.cut.store(false, Ordering::Relaxed);
        assert_eq!(indexes(&mut ahead, 2).await, [9, 10]);
        // The reader whose next record is gone is told, on its own read.
        let e = next_error(&mut a).await;
        assert!(matches!(e, LogError::Trimmed { first_index: 9 }), "{e:?}");
    }

    #[tokio::test]
    async fn appends_from_many_writers_reach_every_reader_in_order() {
        let inner = Counted::new();
        let tail = Arc::new(SharedTail::with_window(
            Arc::new(inner.clone()),
            16,
            usize::MAX,
        ));
        let mut readers = Vec::new();
        for from in [1, 1, 3] {
            readers.push(tail.read(0, from).await.unwrap());
        }
        let writers: Vec<_> = (0..4)
            .map(|_| {
                let tail = tail.clone();
                tokio::spawn(async move {
                    for _ in 0..50 {
                        tail.append(0, vec![vec![1; 8]]).await.unwrap();
                    }
                })
            })
            .collect();
        for w in writers {
            w.await.unwrap();
        }
        for (r, from) in readers.iter_mut().zip([1u64, 1, 3]) {
            let n = (200 - from + 1) as usize;
            assert_eq!(indexes(r, n).await, (from..=200).collect::<Vec<_>>());
        }
    }
}
