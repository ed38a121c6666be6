//! The segment log: one shard's append-only log on disk, as numbered segment files of frames
//! (length + CRC32C + body), with crash recovery (torn tail cut, earlier corruption refused),
//! positional reads, suffix truncation and prefix purge. Synchronous and runtime-free: the
//! group-commit flusher (`log_store.rs`) decides when to call `sync`.

use std::collections::{BTreeMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Every segment file starts with these 8 bytes (magic + format version 2: frames carry the
/// first record index and record count of their Raft entry).
pub const SEGMENT_MAGIC: &[u8; 8] = b"STRJSEG\x02";
/// Magic of format version 1 (one record per Raft entry), refused with a clear error.
pub const SEGMENT_MAGIC_V1: &[u8; 8] = b"STRJSEG\x01";
/// A new segment is started once the active one holds this many bytes.
pub const SEGMENT_TARGET_BYTES: u64 = 64 * 1024 * 1024;
/// Length + CRC32C in front of every frame body.
pub const FRAME_HEADER_BYTES: usize = 8;
/// Fixed part of a frame body: index, term, leader node, time_ms, first record, record count
/// (u32) and 4 reserved bytes.
pub const BODY_HEADER_BYTES: usize = 48;
/// Largest frame body accepted on read; anything larger is corruption (entries are capped far below).
pub const MAX_FRAME_BODY_BYTES: usize = 64 * 1024 * 1024;
const SEGMENT_SUFFIX: &str = ".seg";

/// Why the segment log failed.
#[derive(Debug, thiserror::Error)]
pub enum SegmentError {
    #[error("segment log I/O error at {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error(
        "segment log corrupt at {path} offset {offset}: {reason}; records after it exist, so this is not a torn tail: refusing to start"
    )]
    Corrupt {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    #[error("segment log: index {index} is not present (log holds [{first}, {next}))")]
    Missing { index: u64, first: u64, next: u64 },
    #[error("segment log: append of index {got} but the next index is {expected}")]
    NotContiguous { got: u64, expected: u64 },
    #[error(
        "segment file {path} has format version 1 (one record per Raft entry); this build reads version 2 only: start from an empty data directory (or let the node catch up from its peers after wiping it)"
    )]
    OldFormat { path: PathBuf },
}

impl SegmentError {
    fn io(path: &Path, source: io::Error) -> Self {
        SegmentError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// The fixed fields of a frame; the rest of the body is opaque to this module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// Raft log index.
    pub index: u64,
    pub term: u64,
    pub node: u64,
    pub time_ms: i64,
    /// Record index of the entry's first record: the previous entry's `first_record + count`,
    /// computed identically on every node from its own log.
    pub first_record: u64,
    /// Records the entry carries (at least 1).
    pub count: u32,
}

impl FrameHeader {
    /// One past the entry's last record index.
    pub fn end_record(&self) -> u64 {
        self.first_record + u64::from(self.count)
    }
}

/// Where a frame lives, and its header (kept in memory so log ids need no disk read).
#[derive(Debug, Clone, Copy)]
struct Pos {
    segment: u64,
    offset: u64,
    len: u32,
    header: FrameHeader,
}

struct Segment {
    path: PathBuf,
    file: Arc<File>,
}

/// What recovery found and did, for the log line at start.
#[derive(Debug, Default, Clone)]
pub struct RecoveryReport {
    pub segments: usize,
    pub frames: u64,
    pub torn_tail_cut_bytes: u64,
}

/// One shard's log on disk. Not thread-safe by itself; `log_store.rs` wraps it in a mutex.
pub struct SegmentLog {
    dir: PathBuf,
    /// Segments by the index of their first frame.
    segments: BTreeMap<u64, Segment>,
    /// First segment key of the active (last) segment, and its write offset.
    active: u64,
    active_len: u64,
    /// Frames present, from `first` on.
    first: u64,
    positions: VecDeque<Pos>,
    /// Time of the last frame, or the floor given by the caller when the log is empty.
    floor_time_ms: i64,
    /// Record index the next frame gets when the log is empty (end of the purged prefix).
    floor_record: u64,
    /// Size at which the active segment is closed and a new one started.
    target_bytes: u64,
}

/// Encodes one frame: length, CRC32C of the body, body.
pub fn encode_frame(out: &mut Vec<u8>, header: &FrameHeader, rest: &[u8]) {
    let body_len = BODY_HEADER_BYTES + rest.len();
    let start = out.len();
    out.extend_from_slice(&(body_len as u32).to_le_bytes());
    out.extend_from_slice(&[0u8; 4]);
    out.extend_from_slice(&header.index.to_le_bytes());
    out.extend_from_slice(&header.term.to_le_bytes());
    out.extend_from_slice(&header.node.to_le_bytes());
    out.extend_from_slice(&header.time_ms.to_le_bytes());
    out.extend_from_slice(&header.first_record.to_le_bytes());
    out.extend_from_slice(&header.count.to_le_bytes());
    out.extend_from_slice(&[0u8; 4]);
    out.extend_from_slice(rest);
    let crc = crc32c::crc32c(&out[start + FRAME_HEADER_BYTES..]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn decode_body_header(body: &[u8]) -> FrameHeader {
    FrameHeader {
        index: u64_at(body, 0),
        term: u64_at(body, 8),
        node: u64_at(body, 16),
        time_ms: u64_at(body, 24) as i64,
        first_record: u64_at(body, 32),
        count: u32::from_le_bytes([body[40], body[41], body[42], body[43]]),
    }
}

/// Parses the frame at `buf[at..]`: Ok(Some((header, body range, next offset))) if a whole valid
/// frame is there, Ok(None) at the exact end, Err(reason) otherwise.
#[allow(clippy::type_complexity)]
fn parse_frame(
    buf: &[u8],
    at: usize,
) -> Result<Option<(FrameHeader, std::ops::Range<usize>, usize)>, String> {
    if at == buf.len() {
        return Ok(None);
    }
    if buf.len() - at < FRAME_HEADER_BYTES {
        return Err("incomplete frame header".into());
    }
    let len = u32::from_le_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]) as usize;
    let crc = u32::from_le_bytes([buf[at + 4], buf[at + 5], buf[at + 6], buf[at + 7]]);
    if !(BODY_HEADER_BYTES..=MAX_FRAME_BODY_BYTES).contains(&len) {
        return Err(format!("impossible frame length {len}"));
    }
    let body_start = at + FRAME_HEADER_BYTES;
    if buf.len() - body_start < len {
        return Err("frame runs past the end of the file".into());
    }
    let body = &buf[body_start..body_start + len];
    if crc32c::crc32c(body) != crc {
        return Err("checksum mismatch".into());
    }
    Ok(Some((
        decode_body_header(body),
        body_start + BODY_HEADER_BYTES..body_start + len,
        body_start + len,
    )))
}

fn segment_name(first_index: u64) -> String {
    format!("{first_index:020}{SEGMENT_SUFFIX}")
}

fn sync_dir(dir: &Path) -> Result<(), SegmentError> {
    crate::meta::sync_dir(dir).map_err(|e| SegmentError::io(dir, e))
}

impl SegmentLog {
    /// Opens (creating if needed) the log in `dir`. Frames with index < `first_index` are
    /// skipped (they were purged; their segment may still hold them). `floor_time_ms` and
    /// `floor_record` are the time and the record end of the entry just before `first_index`,
    /// used while the log is empty.
    pub fn open(
        dir: &Path,
        first_index: u64,
        floor_time_ms: i64,
        floor_record: u64,
    ) -> Result<(Self, RecoveryReport), SegmentError> {
        crate::meta::create_dir_durable(dir).map_err(|e| SegmentError::io(dir, e))?;
        let mut keys = Vec::new();
        for ent in std::fs::read_dir(dir).map_err(|e| SegmentError::io(dir, e))? {
            let ent = ent.map_err(|e| SegmentError::io(dir, e))?;
            let name = ent.file_name().to_string_lossy().to_string();
            if let Some(stem) = name.strip_suffix(SEGMENT_SUFFIX)
                && let Ok(k) = stem.parse::<u64>()
            {
                keys.push(k);
            }
        }
        keys.sort_unstable();
        let mut log = SegmentLog {
            dir: dir.to_path_buf(),
            segments: BTreeMap::new(),
            active: 0,
            active_len: 0,
            first: first_index,
            positions: VecDeque::new(),
            floor_time_ms,
            floor_record,
            target_bytes: SEGMENT_TARGET_BYTES,
        };
        let mut report = RecoveryReport::default();
        // Segments wholly below the purge point are garbage from an interrupted purge.
        let mut live = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            let next_start = keys.get(i + 1).copied();
            if next_start.is_some_and(|n| n <= first_index) {
                let p = dir.join(segment_name(*k));
                crate::meta::remove_file(&p).map_err(|e| SegmentError::io(&p, e))?;
            } else {
                live.push(*k);
            }
        }
        let mut expected: Option<u64> = None;
        // Record end of the previous frame: each frame must start where the one before ended.
        let mut prev_end: Option<u64> = None;
        for (i, key) in live.iter().enumerate() {
            let is_last = i + 1 == live.len();
            let path = dir.join(segment_name(*key));
            let buf = std::fs::read(&path).map_err(|e| SegmentError::io(&path, e))?;
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(|e| SegmentError::io(&path, e))?;
            if let Some(exp) = expected
                && exp != *key
            {
                return Err(SegmentError::Corrupt {
                    path,
                    offset: 0,
                    reason: format!("segment starts at index {key} but {exp} was expected"),
                });
            }
            let mut at = SEGMENT_MAGIC.len();
            if buf.starts_with(SEGMENT_MAGIC_V1) {
                return Err(SegmentError::OldFormat { path });
            }
            if buf.len() < SEGMENT_MAGIC.len() || &buf[..SEGMENT_MAGIC.len()] != SEGMENT_MAGIC {
                if is_last && buf.len() < SEGMENT_MAGIC.len() && SEGMENT_MAGIC.starts_with(&buf) {
                    // Crashed while creating the segment: rewrite its header.
                    file.set_len(0).map_err(|e| SegmentError::io(&path, e))?;
                    file.write_all_at(SEGMENT_MAGIC, 0)
                        .and_then(|_| file.sync_all())
                        .map_err(|e| SegmentError::io(&path, e))?;
                    report.torn_tail_cut_bytes += buf.len() as u64;
                    at = SEGMENT_MAGIC.len();
                    log.segments.insert(
                        *key,
                        Segment {
                            path,
                            file: Arc::new(file),
                        },
                    );
                    log.active = *key;
                    log.active_len = at as u64;
                    expected = Some(*key);
                    continue;
                }
                return Err(SegmentError::Corrupt {
                    path,
                    offset: 0,
                    reason: "bad segment magic".into(),
                });
            }
            let mut next_index = *key;
            loop {
                match parse_frame(&buf, at) {
                    Ok(None) => break,
                    Ok(Some((h, body, next))) => {
                        if h.index != next_index {
                            // A valid checksum with the wrong index is never a torn write.
                            return Err(SegmentError::Corrupt {
                                path,
                                offset: at as u64,
                                reason: format!(
                                    "frame holds index {} where {next_index} was expected",
                                    h.index
                                ),
                            });
                        }
                        if h.count == 0 || prev_end.is_some_and(|e| e != h.first_record) {
                            return Err(SegmentError::Corrupt {
                                path,
                                offset: at as u64,
                                reason: format!(
                                    "frame {} starts at record {} with {} records where record {} was expected",
                                    h.index,
                                    h.first_record,
                                    h.count,
                                    prev_end.unwrap_or(0)
                                ),
                            });
                        }
                        prev_end = Some(h.end_record());
                        if h.index >= log.first {
                            if log.positions.is_empty() {
                                log.first = h.index;
                            }
                            let offset = body.start - BODY_HEADER_BYTES - FRAME_HEADER_BYTES;
                            log.positions.push_back(Pos {
                                segment: *key,
                                offset: offset as u64,
                                len: (next - offset) as u32,
                                header: h,
                            });
                            report.frames += 1;
                        }
                        next_index += 1;
                        at = next;
                    }
                    Err(reason) => {
                        if !is_last || valid_frame_after(&buf, at, next_index) {
                            return Err(SegmentError::Corrupt {
                                path,
                                offset: at as u64,
                                reason,
                            });
                        }
                        tracing::warn!(
                            path = %path.display(),
                            offset = at,
                            cut_bytes = buf.len() - at,
                            %reason,
                            "cutting torn tail of the journal log"
                        );
                        report.torn_tail_cut_bytes += (buf.len() - at) as u64;
                        file.set_len(at as u64)
                            .and_then(|_| file.sync_all())
                            .map_err(|e| SegmentError::io(&path, e))?;
                        break;
                    }
                }
            }
            expected = Some(next_index);
            log.active = *key;
            log.active_len = at as u64;
            log.segments.insert(
                *key,
                Segment {
                    path,
                    file: Arc::new(file),
                },
            );
        }
        report.segments = log.segments.len();
        if log.positions.is_empty() {
            // Nothing present: the log continues right after the purge point (or after the last
            // frame of a segment whose frames were all purged).
            let next = expected.unwrap_or(first_index).max(first_index);
            log.first = next;
            if log.segments.is_empty() {
                log.create_segment(next)?;
            } else if expected.is_some_and(|e| e < first_index) {
                // The surviving segment ends below the purge point: start a fresh one there.
                log.create_segment(first_index)?;
            }
        } else if log.first < first_index {
            log.first = first_index;
        }
        Ok((log, report))
    }

    fn create_segment(&mut self, first_index: u64) -> Result<(), SegmentError> {
        let path = self.dir.join(segment_name(first_index));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(|e| SegmentError::io(&path, e))?;
        file.write_all_at(SEGMENT_MAGIC, 0)
            .and_then(|_| file.sync_all())
            .map_err(|e| SegmentError::io(&path, e))?;
        sync_dir(&self.dir)?;
        self.segments.insert(
            first_index,
            Segment {
                path,
                file: Arc::new(file),
            },
        );
        self.active = first_index;
        self.active_len = SEGMENT_MAGIC.len() as u64;
        Ok(())
    }

    /// Changes the size at which segments roll over (tests use small segments).
    pub fn set_segment_target_bytes(&mut self, bytes: u64) {
        self.target_bytes = bytes.max(SEGMENT_MAGIC.len() as u64 + 1);
    }

    /// Index of the first frame present (or of the next frame, if none is).
    pub fn first_index(&self) -> u64 {
        self.first
    }

    /// Index the next appended frame must carry.
    pub fn next_index(&self) -> u64 {
        self.first + self.positions.len() as u64
    }

    /// Header of the last frame present.
    pub fn last(&self) -> Option<FrameHeader> {
        self.positions.back().map(|p| p.header)
    }

    /// Time of the last frame present, else the floor.
    pub fn last_time_ms(&self) -> i64 {
        self.last().map_or(self.floor_time_ms, |h| h.time_ms)
    }

    pub fn set_floor_time_ms(&mut self, t: i64) {
        self.floor_time_ms = self.floor_time_ms.max(t);
    }

    /// Record index the next frame gets: the last frame's record end, else the floor.
    pub fn next_record(&self) -> u64 {
        self.last().map_or(self.floor_record, |h| h.end_record())
    }

    /// Record index of the first record present (or of the next one, if none is).
    pub fn first_record(&self) -> u64 {
        self.positions
            .front()
            .map_or(self.floor_record, |p| p.header.first_record)
    }

    /// The record end of the purged prefix (what an empty log continues from).
    pub fn floor_record(&self) -> u64 {
        self.floor_record
    }

    /// Raises the record floor (a snapshot installed from the leader says where records go on).
    pub fn set_floor_record(&mut self, r: u64) {
        self.floor_record = self.floor_record.max(r);
    }

    /// Header of the entry holding record `record`, if present.
    pub fn entry_of_record(&self, record: u64) -> Option<FrameHeader> {
        let i = self
            .positions
            .partition_point(|p| p.header.end_record() <= record);
        self.positions
            .get(i)
            .map(|p| p.header)
            .filter(|h| h.first_record <= record)
    }

    /// Header of the frame at `index`, if present.
    pub fn header(&self, index: u64) -> Option<FrameHeader> {
        let i = index.checked_sub(self.first)?;
        self.positions.get(i as usize).map(|p| p.header)
    }

    /// Writes frames (already encoded with `encode_frame`, headers given in order) to the
    /// active segment. Not durable until `sync` (or the flusher) has run.
    pub fn append(&mut self, headers: &[FrameHeader], frames: &[u8]) -> Result<(), SegmentError> {
        if let Some(h) = headers.first()
            && (h.index != self.next_index() || h.first_record != self.next_record())
        {
            return Err(SegmentError::NotContiguous {
                got: h.index,
                expected: self.next_index(),
            });
        }
        if self.active_len >= self.target_bytes
            && let Some(h) = headers.first()
        {
            self.sync()?;
            self.create_segment(h.index)?;
        }
        let seg = &self.segments[&self.active];
        crate::failpoint::check(crate::failpoint::Failpoint::Write)
            .and_then(|()| seg.file.write_all_at(frames, self.active_len))
            .map_err(|e| SegmentError::io(&seg.path, e))?;
        let mut at = 0usize;
        for h in headers {
            let len =
                u32::from_le_bytes([frames[at], frames[at + 1], frames[at + 2], frames[at + 3]]);
            let total = FRAME_HEADER_BYTES as u32 + len;
            self.positions.push_back(Pos {
                segment: self.active,
                offset: self.active_len + at as u64,
                len: total,
                header: *h,
            });
            at += total as usize;
        }
        self.active_len += frames.len() as u64;
        Ok(())
    }

    /// The active segment's file, for a flusher that syncs outside the lock.
    pub fn active_file(&self) -> Arc<File> {
        Arc::clone(&self.segments[&self.active].file)
    }

    /// fdatasync of the active segment (earlier segments were synced when they were closed).
    pub fn sync(&self) -> Result<(), SegmentError> {
        let seg = &self.segments[&self.active];
        seg.file
            .sync_data()
            .map_err(|e| SegmentError::io(&seg.path, e))
    }

    /// Where the frame at `index` lives: file, offset, length. Read it with `read_located`
    /// outside any lock.
    pub fn locate(&self, index: u64) -> Result<(Arc<File>, u64, u32), SegmentError> {
        let missing = || SegmentError::Missing {
            index,
            first: self.first,
            next: self.next_index(),
        };
        let i = index.checked_sub(self.first).ok_or_else(missing)?;
        let p = self.positions.get(i as usize).ok_or_else(missing)?;
        Ok((Arc::clone(&self.segments[&p.segment].file), p.offset, p.len))
    }

    /// Reads and verifies one frame; returns its header and the opaque rest of its body.
    pub fn read_located(
        file: &File,
        offset: u64,
        len: u32,
    ) -> Result<(FrameHeader, Vec<u8>), SegmentError> {
        let mut buf = vec![0u8; len as usize];
        file.read_exact_at(&mut buf, offset)
            .map_err(|e| SegmentError::io(Path::new("<segment>"), e))?;
        match parse_frame(&buf, 0) {
            Ok(Some((h, body, _))) => Ok((h, buf[body].to_vec())),
            Ok(None) => Err(SegmentError::Corrupt {
                path: PathBuf::from("<segment>"),
                offset,
                reason: "empty frame".into(),
            }),
            Err(reason) => Err(SegmentError::Corrupt {
                path: PathBuf::from("<segment>"),
                offset,
                reason,
            }),
        }
    }

    /// Reads the frame at `index` (convenience for single-threaded callers and tests).
    pub fn read(&self, index: u64) -> Result<(FrameHeader, Vec<u8>), SegmentError> {
        let (f, off, len) = self.locate(index)?;
        Self::read_located(&f, off, len)
    }

    /// Removes every frame with index >= `index`, durably.
    pub fn truncate(&mut self, index: u64) -> Result<(), SegmentError> {
        if index >= self.next_index() {
            return Ok(());
        }
        let keep = index.saturating_sub(self.first) as usize;
        let cut = self.positions.get(keep).copied();
        self.positions.truncate(keep);
        let Some(cut) = cut else { return Ok(()) };
        // Drop whole segments after the one holding the cut, the last first, then shorten that
        // one: a crash (or a power loss) anywhere in between leaves a gap-free log, longer than
        // asked (what a new leader cuts again), never segments with a hole between them, which
        // recovery refuses.
        let later: Vec<u64> = self
            .segments
            .range(cut.segment + 1..)
            .rev()
            .map(|(k, _)| *k)
            .collect();
        for k in later {
            if let Some(seg) = self.segments.remove(&k) {
                crate::meta::remove_file(&seg.path).map_err(|e| SegmentError::io(&seg.path, e))?;
                crate::failpoint::check(crate::failpoint::Failpoint::Truncate)
                    .map_err(|e| SegmentError::io(&seg.path, e))?;
            }
        }
        sync_dir(&self.dir)?;
        let seg = &self.segments[&cut.segment];
        seg.file
            .set_len(cut.offset)
            .and_then(|_| seg.file.sync_all())
            .map_err(|e| SegmentError::io(&seg.path, e))?;
        sync_dir(&self.dir)?;
        self.active = cut.segment;
        self.active_len = cut.offset;
        Ok(())
    }

    /// Forgets every frame with index <= `upto` and deletes segments that then hold nothing
    /// live. The caller records the purge point durably first (meta file), so that a crash in
    /// between leaves segments that recovery skips.
    pub fn purge(&mut self, upto: u64) -> Result<(), SegmentError> {
        if upto < self.first {
            return Ok(());
        }
        if let Some(h) = self.header(upto) {
            self.floor_time_ms = self.floor_time_ms.max(h.time_ms);
            self.floor_record = self.floor_record.max(h.end_record());
        }
        let drop_n = (upto + 1 - self.first).min(self.positions.len() as u64) as usize;
        self.positions.drain(..drop_n);
        let empty = self.positions.is_empty();
        self.first = upto + 1;
        if empty {
            // Everything is gone: start a fresh segment at the new first index.
            let old: Vec<u64> = self.segments.keys().copied().collect();
            self.create_segment(self.first)?;
            for k in old {
                if k != self.first
                    && let Some(seg) = self.segments.remove(&k)
                {
                    crate::meta::remove_file(&seg.path)
                        .map_err(|e| SegmentError::io(&seg.path, e))?;
                }
            }
        } else {
            let first_live = self.positions.front().map_or(self.active, |p| p.segment);
            let dead: Vec<u64> = self.segments.range(..first_live).map(|(k, _)| *k).collect();
            for k in dead {
                if let Some(seg) = self.segments.remove(&k) {
                    crate::meta::remove_file(&seg.path)
                        .map_err(|e| SegmentError::io(&seg.path, e))?;
                }
            }
        }
        sync_dir(&self.dir)?;
        Ok(())
    }

    /// Number of segment files on disk (for tests and status).
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }
}

/// True if some offset after `damaged` (where the frame of index `next_index` should start but
/// does not parse) starts a whole, valid frame that could follow it: then the damage at hand is
/// not a torn tail. A frame `d` bytes further on can carry at most `next_index + d / 56` (every
/// frame takes at least its two headers): a frame found inside the torn frame's own payload
/// (a value that holds bytes shaped like a frame) does not count unless its index fits.
fn valid_frame_after(buf: &[u8], damaged: usize, next_index: u64) -> bool {
    const MIN_FRAME_BYTES: usize = FRAME_HEADER_BYTES + BODY_HEADER_BYTES;
    (damaged + 1..buf.len()).any(|at| {
        let most = next_index + ((at - damaged) / MIN_FRAME_BYTES) as u64;
        matches!(parse_frame(buf, at), Ok(Some((h, _, _))) if h.index >= next_index && h.index <= most)
    })
}
