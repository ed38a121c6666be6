//! openraft's log storage over the segment log, with group commit: appends are written at
//! once and acknowledged (`LogFlushed`) by one flusher thread per shard after a single
//! fdatasync that covers every append queued meanwhile. Also owns the vote (fsync'ed meta
//! file) and the purge point.
// openraft's own error types are large; they are its contract, not ours to box.
#![allow(clippy::result_large_err)]

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{LogState, RaftLogReader, StorageError, StorageIOError, Vote};

use crate::meta::{Meta, MetaError, read_durable, write_durable};
use crate::segment::{FrameHeader, RecoveryReport, SegmentError, SegmentLog, encode_frame};
use crate::types::{
    CodecError, JEntry, JLogId, NodeId, TypeConfig, decode_entry, encode_rest, header_of,
    records_of,
};
use api::strata::journal::Record;

/// The committed log id is persisted at most this often (a stale value is safe: it only
/// bounds what is re-applied at start).
pub const COMMITTED_PERSIST_INTERVAL: Duration = Duration::from_millis(500);
/// At most this many entries are read per `try_get_log_entries` frame batch lock.
const META_FILE: &str = "meta";
const COMMITTED_FILE: &str = "committed";
/// Left by a shard whose storage failed: the first entry whose durability was then unknown.
const STORAGE_FAILED_FILE: &str = "STORAGE_FAILED";

/// Conditions an operator must see (fsync failures, ...), shared by a node's shards.
pub type ErrorList = Arc<Mutex<Vec<String>>>;

/// Locks a mutex, going on with the data if a panicking thread poisoned it (every critical
/// section here leaves the data consistent before anything can panic).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Why records could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Segment(#[from] SegmentError),
    #[error("entry {index}: {source}")]
    Codec { index: u64, source: CodecError },
}

/// Why opening a shard's storage failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Segment(#[from] SegmentError),
    #[error(transparent)]
    Meta(#[from] MetaError),
}

/// What the flusher is asked to do: complete a callback after the next fdatasync, or only
/// run one (for a leader's own append, acknowledged to openraft before it is durable).
enum FlushJob {
    Callback(LogFlushed<TypeConfig>),
    Sync,
}

/// State shared by the log store, its readers, the flusher and the record readers.
pub struct LogShared {
    dir: PathBuf,
    shard: u32,
    /// This node's id: a leader's own entries carry it in their log ids.
    node_id: NodeId,
    /// Acknowledge a leader's own appends to openraft at once and fsync them in parallel with
    /// replication (see `append`); off: every append waits for its fsync.
    overlap_leader_fsync: bool,
    /// Every entry with an index below this is fdatasync'ed on this node. Appliers and the
    /// commit index sent to followers wait for it.
    flushed: tokio::sync::watch::Sender<u64>,
    /// Set when a commit index sent to followers was held back to `flushed`; the node then
    /// sends it again once the flush completes.
    commit_held: AtomicBool,
    log: Mutex<SegmentLog>,
    meta: Mutex<Meta>,
    committed: Mutex<(Option<JLogId>, Option<Instant>)>,
    /// Set after an fsync or write failure: nothing is acknowledged any more.
    failed: AtomicBool,
    errors: ErrorList,
    flush_tx: Mutex<Option<mpsc::Sender<FlushJob>>>,
    /// Truncations of the log so far (a pending fsync raises `flushed` only if none happened
    /// since it looked at the log).
    truncations: std::sync::atomic::AtomicU64,
    /// Held across each fsync and the recording of its failure (`sync_written`).
    sync_one: Mutex<()>,
    /// What the state machine's snapshot file covers, once it is durable (`None`: no snapshot).
    snapshot: tokio::sync::watch::Sender<Option<SnapshotFloor>>,
    /// The last stamp a leader made that this process appended, and when (None: none yet;
    /// what recovery found on disk, and the old stamps blank entries repeat, do not count). A
    /// new leader goes on from it (clock.rs).
    appended: Mutex<Option<(i64, Instant)>>,
}

/// How far the log was written when an fsync started.
#[derive(Clone, Copy, Debug)]
struct Written {
    next_index: u64,
    truncations: u64,
}

/// How long a purge past the whole local log waits for the snapshot that covers it to be
/// durable (openraft installs it on the state-machine task while it purges on its core).
const PURGE_WAITS_FOR_SNAPSHOT: std::time::Duration = std::time::Duration::from_secs(30);

/// Where a durable snapshot leaves the log: its last entry, that entry's time stamp and the
/// record index the log continues at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotFloor {
    pub index: u64,
    pub time_ms: i64,
    pub next_record: u64,
}

fn sio<E: std::error::Error + 'static>(e: &E) -> StorageError<NodeId> {
    StorageIOError::write_logs(openraft::AnyError::new(e)).into()
}

impl LogShared {
    /// Opens the shard's storage under `dir` (recovering the log) and starts its flusher.
    pub fn open(
        dir: &Path,
        shard: u32,
        node_id: NodeId,
        segment_bytes: u64,
        overlap_leader_fsync: bool,
        errors: ErrorList,
    ) -> Result<(Arc<Self>, RecoveryReport), OpenError> {
        crate::meta::create_dir_durable(dir).map_err(|source| MetaError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let meta: Meta = read_durable(&dir.join(META_FILE))?.unwrap_or_default();
        let first = meta.purged.map_or(0, |p| p.index + 1);
        let (mut log, report) =
            SegmentLog::open(dir, first, meta.floor_time_ms, meta.floor_record)?;
        log.set_segment_target_bytes(segment_bytes);
        // The storage failed before this start: entries from where the last good fsync ended
        // were never known durable, whatever the page cache gives back now.
        let marker = dir.join(STORAGE_FAILED_FILE);
        if let Ok(text) = std::fs::read_to_string(&marker) {
            let unknown: u64 = text.trim().parse().map_err(|_| MetaError::Corrupt {
                path: marker.clone(),
                reason: format!("not an index: {text:?}"),
            })?;
            if unknown < log.next_index() {
                tracing::warn!(
                    shard,
                    from = unknown,
                    to = log.next_index(),
                    "storage failed before this start: dropping the entries not known durable (the leader sends them again)"
                );
                log.truncate(unknown.max(first))?;
            }
            crate::meta::remove_file(&marker)
                .and_then(|()| crate::meta::sync_dir(dir))
                .map_err(|source| MetaError::Io {
                    path: marker.clone(),
                    source,
                })?;
        }
        // What recovery found may still sit in the page cache only (after a kill, not a power
        // loss): make it durable before counting it as flushed.
        log.sync()?;
        let flushed = log.next_index();
        let committed: Option<JLogId> = read_durable(&dir.join(COMMITTED_FILE))?.flatten();
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(LogShared {
            dir: dir.to_path_buf(),
            shard,
            node_id,
            overlap_leader_fsync,
            flushed: tokio::sync::watch::Sender::new(flushed),
            commit_held: AtomicBool::new(false),
            appended: Mutex::new(None),
            log: Mutex::new(log),
            meta: Mutex::new(meta),
            committed: Mutex::new((committed, None)),
            failed: AtomicBool::new(false),
            errors,
            flush_tx: Mutex::new(Some(tx)),
            truncations: std::sync::atomic::AtomicU64::new(0),
            sync_one: Mutex::new(()),
            snapshot: tokio::sync::watch::Sender::new(None),
        });
        let weak = Arc::downgrade(&shared);
        std::thread::Builder::new()
            .name(format!("journal-flush-{shard}"))
            .spawn(move || flusher(weak, rx))
            .map_err(|source| MetaError::Io {
                path: dir.to_path_buf(),
                source,
            })?;
        Ok((shared, report))
    }

    /// Stops the flusher thread (pending callbacks are still flushed first).
    pub fn close(&self) {
        lock(&self.flush_tx).take();
    }

    pub fn first_index(&self) -> u64 {
        lock(&self.log).first_index()
    }

    /// Index the next entry gets (one past the last present).
    pub fn next_index(&self) -> u64 {
        lock(&self.log).next_index()
    }

    pub fn last_time_ms(&self) -> i64 {
        lock(&self.log).last_time_ms()
    }

    /// The last stamp a leader made that this process appended, and when it appended it.
    pub fn last_appended(&self) -> Option<(i64, Instant)> {
        *lock(&self.appended)
    }

    pub fn header(&self, index: u64) -> Option<FrameHeader> {
        lock(&self.log).header(index)
    }

    pub fn set_floor_time_ms(&self, t: i64) {
        lock(&self.log).set_floor_time_ms(t);
    }

    /// Record index of the first record present (the first one a reader may ask for).
    pub fn first_record(&self) -> u64 {
        lock(&self.log).first_record()
    }

    /// Header of the first entry present.
    pub fn first_entry(&self) -> Option<FrameHeader> {
        let log = lock(&self.log);
        log.header(log.first_index())
    }

    /// Record index the next record gets (one past the last present).
    pub fn next_record(&self) -> u64 {
        lock(&self.log).next_record()
    }

    /// Header of the entry holding record `record`, if present.
    pub fn entry_of_record(&self, record: u64) -> Option<FrameHeader> {
        lock(&self.log).entry_of_record(record)
    }

    /// The state machine's snapshot covering `floor.index` is durable (loaded at start,
    /// built, or installed from the leader).
    pub fn snapshot_persisted(&self, floor: SnapshotFloor) {
        self.snapshot.send_if_modified(|s| {
            let newer = s.is_none_or(|f| f.index < floor.index);
            if newer {
                *s = Some(floor);
            }
            newer
        });
    }

    /// Waits until a durable snapshot covers entry `index`; an error after
    /// `PURGE_WAITS_FOR_SNAPSHOT`.
    async fn snapshot_covering(&self, index: u64) -> Result<SnapshotFloor, StorageError<NodeId>> {
        let mut rx = self.snapshot.subscribe();
        let waited = tokio::time::timeout(
            PURGE_WAITS_FOR_SNAPSHOT,
            rx.wait_for(|s| s.is_some_and(|f| f.index >= index)),
        )
        .await;
        match waited.ok().and_then(Result::ok).and_then(|floor| *floor) {
            Some(floor) => Ok(floor),
            None => Err(sio(&std::io::Error::other(format!(
                "purge up to entry {index}, past the whole log, but no durable snapshot covers it"
            )))),
        }
    }

    /// Raises the record floor (where an emptied log continues; from an installed snapshot).
    pub fn set_floor_record(&self, r: u64) {
        lock(&self.log).set_floor_record(r);
    }

    /// The records [from, end) (clipped to what is present, at most about `max_bytes` of
    /// frames): locates the entry holding `from` and expands entries into records.
    pub fn read_records(
        &self,
        from: u64,
        end: u64,
        max_bytes: usize,
    ) -> Result<Vec<Record>, ReadError> {
        let Some(first) = self.entry_of_record(from) else {
            return Ok(Vec::new());
        };
        let last = match end.checked_sub(1).and_then(|e| self.entry_of_record(e)) {
            Some(h) => h.index + 1,
            None => self.next_index(),
        };
        let frames = self.read_frames(first.index, last, max_bytes)?;
        let mut out = Vec::new();
        for (h, rest) in &frames {
            records_of(h, rest, from, &mut out).map_err(|e| ReadError::Codec {
                index: h.index,
                source: e,
            })?;
        }
        out.retain(|r| r.index < end);
        Ok(out)
    }

    /// The vote on disk.
    pub fn vote(&self) -> Option<Vote<NodeId>> {
        lock(&self.meta).vote
    }

    /// Entries with an index below this are durable (fdatasync'ed) on this node.
    pub fn flushed(&self) -> u64 {
        *self.flushed.borrow()
    }

    /// Waits until every entry up to `index` is durable on this node; fails if storage
    /// failed first (it never will be then).
    pub async fn wait_flushed(&self, index: u64) -> Result<(), std::io::Error> {
        let mut rx = self.flushed.subscribe();
        loop {
            if *rx.borrow_and_update() > index {
                return Ok(());
            }
            if self.failed() {
                return Err(std::io::Error::other(
                    "journal storage failed before the entry was durable",
                ));
            }
            if rx.changed().await.is_err() {
                return Err(std::io::Error::other("journal storage closed"));
            }
        }
    }

    /// A watch of `flushed`.
    pub fn subscribe_flushed(&self) -> tokio::sync::watch::Receiver<u64> {
        self.flushed.subscribe()
    }

    /// The commit index to send to followers: `committed`, held back to the last entry
    /// durable here. A leader acknowledges its own appends to openraft before their fsync,
    /// so openraft may count this node towards a majority early; followers (and through them
    /// readers) must not learn of a commit until the entry is durable on the leader too.
    pub fn durable_commit(&self, committed: Option<JLogId>) -> Option<JLogId> {
        let c = committed?;
        let flushed = self.flushed();
        if c.index < flushed {
            return Some(c);
        }
        self.commit_held.store(true, Ordering::Release);
        // The flush may have completed (and `commit_push_loop` looked at `commit_held`) since
        // `flushed` was read: wake the loop again, or the commit would wait for the next
        // append or heartbeat.
        if self.flushed() > c.index {
            self.flushed.send_modify(|_| {});
        }
        let h = flushed.checked_sub(1).and_then(|i| self.header(i))?;
        Some(openraft::LogId::new(
            openraft::CommittedLeaderId::new(h.term, h.node),
            h.index,
        ))
    }

    /// True (once) if a commit index was held back since the last call.
    pub fn take_commit_held(&self) -> bool {
        self.commit_held.swap(false, Ordering::AcqRel)
    }

    /// fdatasyncs everything written so far (earlier segments were synced when they were
    /// closed), calls `synced` with the fsync's duration, and only then raises `flushed` to it
    /// (so whatever an acknowledgement lets a client see, the fsync's metrics included, is
    /// already in place). A failure is recorded (`fail`) before the next fsync may start, and
    /// once storage failed nothing is synced or counted durable any more: after a failed fsync
    /// the kernel may have dropped the dirty pages and reports the error once, so a later
    /// fsync's success (the flusher's, or `save_vote`'s) says nothing about them.
    fn sync_written(&self, synced: impl FnOnce(std::time::Duration)) -> std::io::Result<()> {
        let _one = lock(&self.sync_one);
        if self.failed() {
            return Err(std::io::Error::other(
                "journal storage failed earlier; see status errors",
            ));
        }
        let (file, written) = {
            let log = lock(&self.log);
            let written = Written {
                next_index: log.next_index(),
                truncations: self.truncations.load(Ordering::Acquire),
            };
            (log.active_file(), written)
        };
        let started = Instant::now();
        crate::failpoint::slow_fsync();
        if let Err(e) = crate::failpoint::check(crate::failpoint::Failpoint::Fsync)
            .and_then(|()| file.sync_data())
        {
            self.fail(format!("fsync failed: {e}"));
            return Err(e);
        }
        synced(started.elapsed());
        self.raise_flushed(written);
        Ok(())
    }

    /// Raises `flushed` to what an fsync that started at `written` made durable, unless the
    /// log was truncated since: the entries it covered may have been replaced by others it did
    /// not sync (the appends that follow a truncation queue their own fsync). The check and a
    /// truncation's lowering both run under the watch's lock, so neither slips past the other.
    fn raise_flushed(&self, written: Written) {
        self.flushed.send_if_modified(|f| {
            let raise = self.truncations.load(Ordering::Acquire) == written.truncations
                && written.next_index > *f
                && !self.failed();
            if raise {
                *f = written.next_index;
            }
            raise
        });
    }

    /// True once a write or fsync failed.
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// Writes `value` to `path` durably (`meta::write_durable`), or records that storage
    /// failed (`what` failed) and returns the error: metadata that cannot be made durable
    /// (the vote, the purge point, the trim's snapshot) is a failing disk, as a failed fsync
    /// of the log is, so Status names it and nothing more is acknowledged, instead of an error
    /// handed to openraft alone, which stops the shard's core without a word to an operator.
    pub(crate) fn write_durable_or_fail<T: serde::Serialize>(
        &self,
        path: &Path,
        value: &T,
        what: &str,
    ) -> Result<(), MetaError> {
        write_durable(path, value).inspect_err(|e| self.fail(format!("{what} failed: {e}")))
    }

    /// Records that storage failed (`what` for Status and the log): no more appends are
    /// acknowledged, and the next start drops what was not known durable.
    fn fail(&self, what: String) {
        crate::metrics::storage_error(self.shard);
        tracing::error!(dir = %self.dir.display(), error = %what, "journal storage failed; no more appends are acknowledged");
        let first_time = !self.failed.swap(true, Ordering::AcqRel);
        // What was written after the last good fsync may sit in the page cache only, where a
        // restart would read it back and take it for durable: the next start drops it (the
        // leader sends it again). The marker has to outlive a restart of the process, not a
        // power loss (which takes the page cache with it): it is written and renamed in place
        // first, and synced only as far as the failing disk lets it (a failed sync of its own
        // must not keep it from existing).
        if first_time {
            let unknown = self.flushed();
            let marker = self.dir.join(STORAGE_FAILED_FILE);
            let tmp = marker.with_extension("tmp");
            let written = std::fs::write(&tmp, format!("{unknown}\n"))
                .and_then(|()| crate::meta::rename(&tmp, &marker));
            match written {
                Ok(()) => {
                    let _ = std::fs::File::open(&marker).and_then(|f| f.sync_all());
                    let _ = std::fs::File::open(&self.dir).and_then(|d| d.sync_all());
                }
                Err(e) => {
                    tracing::error!(path = %marker.display(), error = %e, "cannot record where the storage failure began");
                }
            }
        }
        // Wake whoever waits for a flush: it will never come.
        self.flushed.send_modify(|_| {});
        let mut errs = lock(&self.errors);
        if !errs.contains(&what) {
            errs.push(what);
        }
    }

    /// Reads frames [start, end) (clipped to what is present): header and body rest each.
    pub fn read_frames(
        &self,
        start: u64,
        end: u64,
        max_bytes: usize,
    ) -> Result<Vec<(FrameHeader, Vec<u8>)>, SegmentError> {
        let located = self.locate_frames(start, end, max_bytes)?;
        self.read_located_frames(located)
    }

    /// Where frames [start, end) are (up to about `max_bytes`), and the truncation count then.
    fn locate_frames(
        &self,
        start: u64,
        end: u64,
        max_bytes: usize,
    ) -> Result<Located, SegmentError> {
        let log = lock(&self.log);
        let truncations = self.truncations.load(Ordering::Acquire);
        let end = end.min(log.next_index());
        let mut frames = Vec::new();
        let mut bytes = 0usize;
        for i in start..end {
            let l = log.locate(i)?;
            bytes += l.2 as usize;
            frames.push((i, l));
            if bytes >= max_bytes {
                break;
            }
        }
        Ok(Located {
            frames,
            truncations,
        })
    }

    /// Reads located frames outside the log's lock. A truncation since they were located may
    /// have cut the file under a read (replication of a leader that just stepped down reads
    /// while the follower it became truncates): the frames before the cut are answered, not an
    /// error, which openraft would take for a broken disk and stop the shard on (found by
    /// review: "failed to fill whole buffer", the shard's Raft core gone). Only what a cut can
    /// cause counts so: the file ending early, or other bytes where the frame was (a bad frame,
    /// or another entry's); any other error (EIO) stays one.
    fn read_located_frames(
        &self,
        located: Located,
    ) -> Result<Vec<(FrameHeader, Vec<u8>)>, SegmentError> {
        let truncated = || self.truncations.load(Ordering::Acquire) != located.truncations;
        let mut out = Vec::with_capacity(located.frames.len());
        for (index, (f, off, len)) in located.frames {
            match SegmentLog::read_located(&f, off, len) {
                Ok((h, _)) if h.index != index && truncated() => break,
                Ok((h, _)) if h.index != index => {
                    return Err(SegmentError::Corrupt {
                        path: PathBuf::from("<segment>"),
                        offset: off,
                        reason: format!("frame of index {} where {index} was located", h.index),
                    });
                }
                Ok(frame) => out.push(frame),
                Err(SegmentError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::UnexpectedEof && truncated() =>
                {
                    break;
                }
                Err(SegmentError::Corrupt { .. }) if truncated() => break,
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }
}

/// Frames located under the log's lock, to be read outside it.
/// Where one frame is: its file, offset and length.
type FramePlace = (Arc<std::fs::File>, u64, u32);

struct Located {
    /// (index, place) of each frame.
    frames: Vec<(u64, FramePlace)>,
    truncations: u64,
}

/// The flusher: one fdatasync for every batch of queued appends, then their callbacks.
fn flusher(shared: std::sync::Weak<LogShared>, rx: mpsc::Receiver<FlushJob>) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while let Ok(job) = rx.try_recv() {
            batch.push(job);
        }
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let result =
            shared.sync_written(|took| crate::metrics::fsynced(shared.shard, took, batch.len()));
        for job in batch {
            if let FlushJob::Callback(cb) = job {
                cb.log_io_completed(match &result {
                    Ok(()) => Ok(()),
                    Err(e) => Err(std::io::Error::new(e.kind(), e.to_string())),
                });
            }
        }
    }
}

/// openraft's log store (and log reader) for one shard.
#[derive(Clone)]
pub struct LogStore {
    pub shared: Arc<LogShared>,
}

/// About how many bytes of entries one AppendEntries carries (at least one entry; etcd's raft
/// sends 1 MiB a message). openraft gives each call one heartbeat interval (100 ms) and sends up
/// to `max_payload_entries` (1,024) entries at once: entries of up to 2 MiB made batches that
/// never arrived in time, were sent again and again, and a follower behind a backlog of large
/// entries never caught up (found by review).
pub const REPLICATION_BATCH_BYTES: usize = 1024 * 1024;

impl LogStore {
    /// The entries [start, end) (clipped to what is present), up to about `max_bytes`.
    fn entries(
        &self,
        start: u64,
        end: u64,
        max_bytes: usize,
    ) -> Result<Vec<JEntry>, StorageError<NodeId>> {
        let start = start.max(self.shared.first_index());
        let frames = self
            .shared
            .read_frames(start, end, max_bytes)
            .map_err(|e| {
                StorageError::from(StorageIOError::read_logs(openraft::AnyError::new(&e)))
            })?;
        frames
            .iter()
            .map(|(h, rest)| {
                decode_entry(h, rest).map_err(|e| {
                    StorageError::from(StorageIOError::read_log_at_index(
                        h.index,
                        openraft::AnyError::new(&e),
                    ))
                })
            })
            .collect()
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<JEntry>, StorageError<NodeId>> {
        let start = match range.start_bound() {
            Bound::Included(x) => *x,
            Bound::Excluded(x) => x + 1,
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(x) => x + 1,
            Bound::Excluded(x) => *x,
            Bound::Unbounded => u64::MAX,
        };
        self.entries(start, end, usize::MAX)
    }

    /// What replication sends in one AppendEntries: at most `REPLICATION_BATCH_BYTES` or so.
    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<JEntry>, StorageError<NodeId>> {
        self.entries(start, end, REPLICATION_BATCH_BYTES)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<NodeId>> {
        let purged = lock(&self.shared.meta).purged;
        let last = lock(&self.shared.log).last();
        let last_log_id = last
            .map(|h| {
                openraft::LogId::new(openraft::CommittedLeaderId::new(h.term, h.node), h.index)
            })
            .or(purged);
        Ok(LogState {
            last_purged_log_id: purged,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError<NodeId>> {
        // A leader's own entries may not be durable yet (acknowledged to openraft early). A
        // vote change is the first thing a node does in a new term, before it acknowledges
        // anything to another leader (even a heartbeat whose prev_log_id matches them), so
        // make them durable here.
        if self.shared.flushed() < self.shared.next_index() {
            self.shared.sync_written(|_| {}).map_err(|e| {
                StorageError::from(StorageIOError::write_vote(openraft::AnyError::new(&e)))
            })?;
        }
        let mut meta = lock(&self.shared.meta);
        let mut next = meta.clone();
        next.vote = Some(*vote);
        self.shared
            .write_durable_or_fail(&self.shared.dir.join(META_FILE), &next, "saving the vote")
            .map_err(|e| {
                StorageError::from(StorageIOError::write_vote(openraft::AnyError::new(&e)))
            })?;
        *meta = next;
        Ok(())
    }

    /// Read by openraft once, at start. A committed vote of this node's own is handed back as
    /// not committed: openraft would otherwise restore the node as leader of its old term at
    /// once, and a leader's fsync overlaps its replication (`overlap_leader_fsync`), so after a
    /// power loss its followers may hold entries its own log lost; the next entries it wrote
    /// in that term would take their log ids, which followers match by id and keep, and the
    /// nodes would hold different entries at one index for good. Not committed, the vote makes
    /// it a follower that campaigns in a new term (as etcd after a restart), which a node
    /// missing committed entries cannot win.
    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError<NodeId>> {
        let vote = lock(&self.shared.meta).vote;
        Ok(vote.map(|v| {
            if v.is_committed() && v.leader_id().voted_for() == Some(self.shared.node_id) {
                Vote::new(v.leader_id().term, self.shared.node_id)
            } else {
                v
            }
        }))
    }

    async fn save_committed(
        &mut self,
        committed: Option<JLogId>,
    ) -> Result<(), StorageError<NodeId>> {
        let mut c = lock(&self.shared.committed);
        c.0 = committed;
        // A leader's commit may run ahead of its own fsync; never persist such a one (a restart
        // after a power loss would look for entries the log no longer has).
        let durable = committed.is_none_or(|l| l.index < self.shared.flushed());
        let due = durable
            && c.1
                .is_none_or(|t| t.elapsed() >= COMMITTED_PERSIST_INTERVAL);
        if due {
            c.1 = Some(Instant::now());
            if let Err(e) = write_durable(&self.shared.dir.join(COMMITTED_FILE), &committed) {
                // Only an optimisation for restarts: log it, do not fail the node.
                tracing::warn!(error = %e, "could not persist the committed index");
            }
        }
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<JLogId>, StorageError<NodeId>> {
        Ok(lock(&self.shared.committed).0)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError<NodeId>>
    where
        I: IntoIterator<Item = JEntry> + Send,
        I::IntoIter: Send,
    {
        if self.shared.failed() {
            let e = std::io::Error::other("journal storage failed earlier; see status errors");
            callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
            return Err(sio(&e));
        }
        let mut own = self.shared.overlap_leader_fsync;
        let last_term = {
            let mut log = lock(&self.shared.log);
            let mut time = log.last_time_ms();
            let mut record = log.next_record();
            let mut headers = Vec::new();
            let mut frames = Vec::new();
            let mut rest = Vec::new();
            // The last stamp a leader made itself (blank and membership entries carry the one
            // before them, however old).
            let mut stamped = None;
            for e in entries {
                own &= e.log_id.leader_id.node_id == self.shared.node_id;
                let h = header_of(&e, time, record);
                if matches!(e.payload, openraft::EntryPayload::Normal(_)) {
                    stamped = Some(h.time_ms);
                }
                time = h.time_ms;
                record = h.end_record();
                rest.clear();
                encode_rest(&e, &mut rest);
                encode_frame(&mut frames, &h, &rest);
                headers.push(h);
            }
            if let Err(e) = log.append(&headers, &frames) {
                drop(log);
                self.shared.fail(format!("log write failed: {e}"));
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                return Err(sio(&e));
            }
            if let Some(t) = stamped {
                *lock(&self.shared.appended) = Some((t, Instant::now()));
            }
            headers.last().map(|h| h.term)
        };
        // A leader appending its own entries of its current term (the vote this node holds is
        // its own, committed, of the entries' term): tell openraft at once, so RaftCore sends
        // them to the followers while the flusher syncs them here (as etcd's leader writes its
        // WAL in parallel with replication). openraft may then count this node towards a
        // majority before its fsync; nothing leaves the node before it, though: appliers wait
        // for `flushed` (so no Append is answered, no record read, no read index served) and
        // followers are sent a commit index held back to it (`durable_commit`). Followers'
        // appends (and a leader's after a vote change) wait for their fsync as before.
        let early = own && {
            let vote = lock(&self.shared.meta).vote;
            vote.is_some_and(|v| {
                v.is_committed()
                    && v.leader_id().voted_for() == Some(self.shared.node_id)
                    && Some(v.leader_id().get_term()) == last_term
            })
        };
        let tx = lock(&self.shared.flush_tx).clone();
        let job = if early {
            callback.log_io_completed(Ok(()));
            FlushJob::Sync
        } else {
            FlushJob::Callback(callback)
        };
        match tx {
            Some(tx) => {
                if let Err(mpsc::SendError(FlushJob::Callback(cb))) = tx.send(job) {
                    cb.log_io_completed(Err(std::io::Error::other("journal flusher stopped")));
                }
            }
            None => {
                if let FlushJob::Callback(cb) = job {
                    cb.log_io_completed(Err(std::io::Error::other("journal storage closed")));
                }
            }
        }
        Ok(())
    }

    async fn truncate(&mut self, log_id: JLogId) -> Result<(), StorageError<NodeId>> {
        tracing::info!(index = log_id.index, "truncating the journal log");
        let mut log = lock(&self.shared.log);
        if log_id.index >= log.next_index() {
            return Ok(());
        }
        self.shared.flushed.send_if_modified(|f| {
            self.shared.truncations.fetch_add(1, Ordering::AcqRel);
            let lower = *f > log_id.index;
            if lower {
                *f = log_id.index;
            }
            lower
        });
        log.truncate(log_id.index).map_err(|e| {
            self.shared.fail(format!("log truncate failed: {e}"));
            sio(&e)
        })?;
        // The cut synced the segment holding it (earlier ones were synced when closed): what is
        // left is durable. Said here because an fsync in flight may no longer raise `flushed`
        // (above), and no append may follow to queue another (a snapshot install after this
        // truncation waits for the applies of what is left, which wait for `flushed`).
        self.shared.flushed.send_if_modified(|f| {
            let raise = log_id.index > *f;
            if raise {
                *f = log_id.index;
            }
            raise
        });
        Ok(())
    }

    async fn purge(&mut self, log_id: JLogId) -> Result<(), StorageError<NodeId>> {
        tracing::info!(upto = log_id.index, "purging the journal log");
        // The state machine restarts from its snapshot, so nothing is purged that a durable
        // snapshot does not cover. An entry not in this log is purged because a snapshot from
        // the leader covers it, which openraft installs on the state machine's task while it
        // purges here: the purge point is written only once the snapshot is durable (else a
        // crash in between leaves a purge point past both the log and the snapshot on disk,
        // and a node that cannot start), and the floors are then the snapshot's (not this
        // log's last entry, which may be a deposed leader's uncommitted one). An entry still in
        // the log waits too (session 13, found by review; openraft 0.9.25 purges those only
        // behind a snapshot already durable here, so the wait returns at once, but nothing in
        // this store relied on that).
        let floor = self.shared.snapshot_covering(log_id.index).await?;
        let (time_ms, end_record) = match self.shared.header(log_id.index) {
            Some(h) => (h.time_ms, h.end_record()),
            None => (floor.time_ms, floor.next_record),
        };
        let mut meta = lock(&self.shared.meta);
        let mut next = meta.clone();
        next.purged = Some(log_id);
        next.floor_time_ms = time_ms.max(meta.floor_time_ms);
        next.floor_record = end_record.max(meta.floor_record);
        self.shared
            .write_durable_or_fail(
                &self.shared.dir.join(META_FILE),
                &next,
                "recording the purge point",
            )
            .map_err(|e| {
                StorageError::from(StorageIOError::write_logs(openraft::AnyError::new(&e)))
            })?;
        *meta = next;
        drop(meta);
        lock(&self.shared.log).purge(log_id.index).map_err(|e| {
            self.shared.fail(format!("purging the log failed: {e}"));
            sio(&e)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::segment::FrameHeader;

    fn log_id(term: u64, node: NodeId, index: u64) -> JLogId {
        openraft::LogId::new(openraft::CommittedLeaderId::new(term, node), index)
    }

    /// A shard's storage in a new directory holding `n` entries (`write_entries`), and a log
    /// store over it.
    fn opened_with(n: u64) -> (tempfile::TempDir, Arc<LogShared>, LogStore) {
        let dir = tempfile::tempdir().unwrap();
        write_entries(dir.path(), n);
        let (shared, _) =
            LogShared::open(dir.path(), 0, 1, 1 << 20, true, ErrorList::default()).unwrap();
        let store = LogStore {
            shared: Arc::clone(&shared),
        };
        (dir, shared, store)
    }

    /// Writes `n` blank entries of term 2 by node 1 straight into the shard's segments.
    fn write_entries(dir: &Path, n: u64) {
        write_entries_from(dir, 0, n);
    }

    /// Appends `n` such entries from index `from` (the log's next index).
    fn write_entries_from(dir: &Path, from: u64, n: u64) {
        let (mut log, _) = SegmentLog::open(dir, 0, 0, 0).unwrap();
        let mut frames = Vec::new();
        let mut headers = Vec::new();
        for i in from..from + n {
            let h = FrameHeader {
                index: i,
                term: 2,
                node: 1,
                time_ms: 0,
                first_record: i,
                count: 1,
            };
            encode_frame(&mut frames, &h, &[0]);
            headers.push(h);
        }
        log.append(&headers, &frames).unwrap();
        log.sync().unwrap();
    }

    #[test]
    fn the_commit_sent_to_followers_never_passes_the_local_flush() {
        let dir = tempfile::tempdir().unwrap();
        write_entries(dir.path(), 3);
        let (shared, _) =
            LogShared::open(dir.path(), 0, 1, 1 << 20, true, ErrorList::default()).unwrap();
        // What recovery found is synced and counts as flushed.
        assert_eq!(shared.flushed(), 3);
        assert_eq!(shared.durable_commit(None), None);
        assert_eq!(
            shared.durable_commit(Some(log_id(2, 1, 1))),
            Some(log_id(2, 1, 1))
        );
        assert!(!shared.take_commit_held());
        // A commit past the flushed log is held back to its last flushed entry, and the hold
        // is reported once (the node then pushes the commit again after the next flush).
        assert_eq!(
            shared.durable_commit(Some(log_id(2, 1, 7))),
            Some(log_id(2, 1, 2))
        );
        assert!(shared.take_commit_held());
        assert!(!shared.take_commit_held());
        shared.close();
    }

    #[tokio::test]
    async fn appliers_wait_for_the_flush_and_fail_when_storage_fails() {
        let dir = tempfile::tempdir().unwrap();
        write_entries(dir.path(), 2);
        let (shared, _) =
            LogShared::open(dir.path(), 0, 1, 1 << 20, true, ErrorList::default()).unwrap();
        shared.wait_flushed(1).await.unwrap();
        let waiter = {
            let shared = Arc::clone(&shared);
            tokio::spawn(async move { shared.wait_flushed(5).await })
        };
        tokio::task::yield_now().await;
        assert!(
            !waiter.is_finished(),
            "entry 5 is not durable, nothing may wait past it"
        );
        shared.fail("fsync failed: injected".into());
        let r = waiter.await.unwrap();
        assert!(
            r.is_err(),
            "a failed shard never makes entry 5 durable: {r:?}"
        );
        shared.close();
    }

    /// A purge past the whole local log (a snapshot from the leader covers it) writes its purge
    /// point only once that snapshot is durable, with the snapshot's floors; with no snapshot it
    /// fails and leaves the purge point where it was.
    #[tokio::test(start_paused = true)]
    async fn a_purge_past_the_log_waits_for_the_snapshot_that_covers_it() {
        use openraft::storage::RaftLogStorage;
        let (dir, shared, mut store) = opened_with(10);
        assert!(store.purge(log_id(3, 2, 50)).await.is_err());
        assert_eq!(lock(&shared.meta).purged, None);
        let meta_file: Option<Meta> = read_durable(&dir.path().join(META_FILE)).unwrap();
        assert!(meta_file.is_none_or(|m| m.purged.is_none()));

        let purging = tokio::spawn(async move {
            let r = store.purge(log_id(3, 2, 50)).await;
            (store, r)
        });
        tokio::task::yield_now().await;
        assert!(
            !purging.is_finished(),
            "purged before the snapshot was durable"
        );
        assert_eq!(lock(&shared.meta).purged, None);
        shared.snapshot_persisted(SnapshotFloor {
            index: 50,
            time_ms: 777,
            next_record: 51,
        });
        let (_store, r) = purging.await.unwrap();
        r.unwrap();
        let meta = lock(&shared.meta).clone();
        assert_eq!(meta.purged, Some(log_id(3, 2, 50)));
        assert_eq!((meta.floor_time_ms, meta.floor_record), (777, 51));
        shared.close();
    }

    /// A purge of entries still in the log waits for a durable snapshot covering them too (the
    /// state machine restarts from its snapshot), then keeps the log's own floors.
    #[tokio::test(start_paused = true)]
    async fn a_purge_inside_the_log_waits_for_a_snapshot_too() {
        use openraft::storage::RaftLogStorage;
        let (_dir, shared, mut store) = opened_with(10);
        assert!(store.purge(log_id(2, 1, 5)).await.is_err());
        assert_eq!(lock(&shared.meta).purged, None);
        shared.snapshot_persisted(SnapshotFloor {
            index: 6,
            time_ms: 777,
            next_record: 7,
        });
        store.purge(log_id(2, 1, 5)).await.unwrap();
        let meta = lock(&shared.meta).clone();
        assert_eq!(meta.purged, Some(log_id(2, 1, 5)));
        assert_eq!(
            (meta.floor_time_ms, meta.floor_record),
            (0, 6),
            "the log's floors"
        );
        shared.close();
    }

    /// Frames located before a truncation and read after it: those before the cut are
    /// answered, the rest left out, without an error (openraft stops the shard on one).
    #[tokio::test]
    async fn a_read_that_meets_a_truncation_answers_what_is_left() {
        use openraft::storage::RaftLogStorage;
        let (_dir, shared, mut store) = opened_with(10);
        let located = shared.locate_frames(0, 10, usize::MAX).unwrap();
        store.truncate(log_id(2, 1, 5)).await.unwrap();
        let frames = shared.read_located_frames(located).unwrap();
        let indexes: Vec<u64> = frames.iter().map(|(h, _)| h.index).collect();
        assert_eq!(indexes, vec![0, 1, 2, 3, 4]);
        shared.close();
    }

    /// An fsync that started before a truncation does not count the entries it covered as
    /// flushed afterwards: they may have been replaced by entries it never synced.
    #[tokio::test]
    async fn an_fsync_from_before_a_truncation_does_not_raise_the_flush() {
        use openraft::storage::RaftLogStorage;
        let (_dir, shared, mut store) = opened_with(3);
        // What `sync_written` records before its fsync.
        let started = Written {
            next_index: shared.next_index(),
            truncations: shared.truncations.load(Ordering::Acquire),
        };
        store.truncate(log_id(2, 1, 1)).await.unwrap();
        assert_eq!((shared.flushed(), shared.next_index()), (1, 1));
        shared.raise_flushed(started);
        assert_eq!(shared.flushed(), 1, "raised past the truncated log");
        shared.close();
    }

    /// Once storage failed (a failed fsync: the kernel may have dropped the pages and reports
    /// the error once), no later fsync, the vote's included, counts anything as durable.
    #[tokio::test]
    async fn nothing_counts_as_flushed_after_a_storage_failure() {
        let (_dir, shared, _store) = opened_with(5);
        // As if entries 3.. had been written but not yet synced.
        shared.flushed.send_replace(3);
        let written = Written {
            next_index: shared.next_index(),
            truncations: shared.truncations.load(Ordering::Acquire),
        };
        shared.fail("fsync failed: injected".into());
        assert!(shared.sync_written(|_| {}).is_err());
        shared.raise_flushed(written);
        assert_eq!(shared.flushed(), 3, "counted durable after the failure");
        assert!(shared.wait_flushed(4).await.is_err());
        assert!(
            shared.wait_flushed(2).await.is_ok(),
            "synced before the failure"
        );
        shared.close();
    }

    /// A start after a storage failure drops what was written after the last good fsync (the
    /// page cache may give it back although the disk never took it), once.
    #[test]
    fn a_start_after_a_storage_failure_drops_what_was_not_known_durable() {
        let (dir, shared, _store) = opened_with(10);
        // As if entries 6.. had been written but not yet synced when the fsync failed.
        shared.flushed.send_replace(6);
        shared.fail("fsync failed: injected".into());
        shared.close();
        drop(shared);
        let reopen = || {
            let (shared, _) =
                LogShared::open(dir.path(), 0, 1, 1 << 20, true, ErrorList::default()).unwrap();
            let next = shared.next_index();
            shared.close();
            next
        };
        assert_eq!(reopen(), 6, "entries not known durable were kept");
        assert!(!dir.path().join(STORAGE_FAILED_FILE).exists());
        write_entries_from(dir.path(), 6, 3);
        assert_eq!(reopen(), 9, "dropped again on a later start");
    }

    /// What a truncation leaves is durable (it syncs the cut), and counts as flushed at once:
    /// an fsync in flight that it made stale no longer raises the flushed index, and no append
    /// may follow to queue another.
    #[tokio::test]
    async fn what_a_truncation_leaves_counts_as_flushed() {
        use openraft::storage::RaftLogStorage;
        let (_dir, shared, mut store) = opened_with(5);
        // As if entries 1.. had been written but not yet synced.
        shared.flushed.send_replace(1);
        store.truncate(log_id(2, 1, 3)).await.unwrap();
        assert_eq!((shared.flushed(), shared.next_index()), (3, 3));
        // A truncation past the end cuts nothing and changes nothing.
        shared.flushed.send_replace(1);
        store.truncate(log_id(2, 1, 7)).await.unwrap();
        assert_eq!((shared.flushed(), shared.next_index()), (1, 3));
        shared.close();
    }
}
