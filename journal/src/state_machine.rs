//! The journal's Raft state machine. The journal's "state" is the log itself, so this only
//! tracks how far the shard has applied (readers wait on it), the membership history, and the
//! trim point; its snapshot is the trim point (log id of the last trimmed entry, membership,
//! time stamp), persisted so a restart after a trim knows where the log starts.

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use openraft::storage::RaftStateMachine;
use openraft::{
    BasicNode, EntryPayload, RaftSnapshotBuilder, Snapshot, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership,
};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::log_store::{LogShared, SnapshotFloor, lock};
use crate::meta::{MetaError, read_durable};
use crate::types::{JEntry, JLogId, JournalRequest, NodeId, TypeConfig};

const SNAPSHOT_FILE: &str = "snapshot";
/// Membership history kept for building snapshots at an older index.
const MAX_MEMBERSHIP_HISTORY: usize = 16;

/// The persisted snapshot: openraft's meta plus the time stamp and record end of its last
/// entry (the first record index retained after the trim).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SnapshotBlob {
    pub meta: SnapshotMeta<NodeId, BasicNode>,
    pub time_ms: i64,
    #[serde(default)]
    pub next_record: u64,
    /// The record index trims asked to keep from (records below it are not served even where
    /// their entry, holding later records too, is still stored).
    #[serde(default)]
    pub trimmed_below: u64,
}

impl SnapshotBlob {
    /// Where this snapshot leaves the log (`None` for one that covers no entry).
    fn floor(&self) -> Option<SnapshotFloor> {
        self.meta.last_log_id.map(|l| SnapshotFloor {
            index: l.index,
            time_ms: self.time_ms,
            next_record: self.next_record,
        })
    }
}

#[derive(Default)]
struct SmState {
    last_applied: Option<JLogId>,
    memberships: Vec<StoredMembership<NodeId, BasicNode>>,
    snapshot: Option<SnapshotBlob>,
    builds: u64,
}

/// Shared between openraft's state machine handle and the shard's server side.
pub struct SmShared {
    path: PathBuf,
    state: Mutex<SmState>,
    log: Arc<LogShared>,
    /// One past the last applied record index: readers serve records below it. Sent on every
    /// applied entry, idle ticks included, so its receivers also learn that entries apply.
    pub applied_end: watch::Sender<u64>,
    /// When an entry last applied here (`None`: none since the shard opened).
    applied_at: Mutex<Option<std::time::Instant>>,
    /// The first record index a trim asked to keep, always the first record of an entry
    /// (0: none yet).
    pub trim_target: watch::Sender<u64>,
}

impl SmShared {
    /// When an entry (an idle tick included) last applied here; `None` if none has since the
    /// shard opened. A healthy shard applies one at least every idle tick.
    pub fn last_applied_at(&self) -> Option<std::time::Instant> {
        *lock(&self.applied_at)
    }
}

/// openraft's state machine (and snapshot builder) handle.
#[derive(Clone)]
pub struct StateMachine {
    pub shared: Arc<SmShared>,
}

fn serr<E: std::error::Error + 'static>(e: &E) -> StorageError<NodeId> {
    StorageIOError::write_snapshot(None, openraft::AnyError::new(e)).into()
}

impl StateMachine {
    /// Loads the persisted snapshot (if any) from `dir`.
    pub fn open(dir: &Path, log: Arc<LogShared>) -> Result<Self, MetaError> {
        let path = dir.join(SNAPSHOT_FILE);
        let blob: Option<SnapshotBlob> = read_durable(&path)?;
        let mut st = SmState::default();
        let mut applied_end = 0;
        let mut trim = 0;
        if let Some(b) = &blob {
            st.last_applied = b.meta.last_log_id;
            st.memberships.push(b.meta.last_membership.clone());
            applied_end = b.next_record;
            trim = b.next_record.max(b.trimmed_below);
            log.set_floor_time_ms(b.time_ms);
            log.set_floor_record(b.next_record);
            if let Some(floor) = b.floor() {
                log.snapshot_persisted(floor);
            }
        }
        st.snapshot = blob;
        Ok(StateMachine {
            shared: Arc::new(SmShared {
                path,
                state: Mutex::new(st),
                log,
                applied_end: watch::Sender::new(applied_end),
                applied_at: Mutex::new(None),
                trim_target: watch::Sender::new(trim),
            }),
        })
    }

    /// Writes the snapshot file durably (the caller holds the state lock: a build and an
    /// install write the same temporary file) and tells the log what it now covers: a purge past
    /// the log waits for that (`LogShared::snapshot_covering`).
    fn write_snapshot(&self, blob: &SnapshotBlob) -> Result<(), MetaError> {
        self.shared
            .log
            .write_durable_or_fail(&self.shared.path, blob, "writing the snapshot")?;
        if let Some(floor) = blob.floor() {
            self.shared.log.snapshot_persisted(floor);
        }
        Ok(())
    }

    fn effective_membership(
        st: &SmState,
        index: Option<u64>,
    ) -> StoredMembership<NodeId, BasicNode> {
        st.memberships
            .iter()
            .rev()
            .find(|m| index.is_none_or(|i| m.log_id().is_none_or(|l| l.index <= i)))
            .cloned()
            .unwrap_or_default()
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        let target = *self.shared.trim_target.borrow();
        let mut st = lock(&self.shared.state);
        let current = st.snapshot.as_ref().and_then(|s| s.meta.last_log_id);
        // The snapshot covers exactly what the last trim dropped: the entries whose records
        // all lie below trim_target (whole entries only: the entry holding trim_target stays).
        let boundary = self
            .shared
            .log
            .entry_of_record(target)
            .map_or(target, |h| h.first_record);
        let header = boundary
            .checked_sub(1)
            .and_then(|r| self.shared.log.entry_of_record(r));
        let blob = match (header, current) {
            (Some(h), cur) if cur.is_none_or(|c| c.index < h.index) => {
                let log_id =
                    openraft::LogId::new(openraft::CommittedLeaderId::new(h.term, h.node), h.index);
                st.builds += 1;
                let blob = SnapshotBlob {
                    meta: SnapshotMeta {
                        last_log_id: Some(log_id),
                        last_membership: Self::effective_membership(&st, Some(h.index)),
                        snapshot_id: format!("{}-{}-{}", h.term, h.index, st.builds),
                    },
                    time_ms: h.time_ms,
                    next_record: h.end_record(),
                    trimmed_below: target,
                };
                self.write_snapshot(&blob).map_err(|e| serr(&e))?;
                // Older membership entries than the snapshot's are no longer needed.
                let keep_from = st
                    .memberships
                    .iter()
                    .rposition(|m| m.log_id().is_none_or(|l| l.index <= h.index))
                    .unwrap_or(0);
                st.memberships.drain(..keep_from);
                st.snapshot = Some(blob.clone());
                blob
            }
            _ => match &mut st.snapshot {
                Some(b) if b.trimmed_below < target => {
                    // The trim moved within the entry the last snapshot kept: remember it.
                    let mut next = b.clone();
                    next.trimmed_below = target;
                    self.write_snapshot(&next).map_err(|e| serr(&e))?;
                    *b = next.clone();
                    next
                }
                Some(b) => b.clone(),
                None => {
                    // Asked with nothing trimmed (openraft at start with a purged log but no
                    // snapshot file, which our purge order never leaves): cover what is applied.
                    let blob = SnapshotBlob {
                        meta: SnapshotMeta {
                            last_log_id: st.last_applied,
                            last_membership: Self::effective_membership(&st, None),
                            snapshot_id: "applied".into(),
                        },
                        time_ms: self.shared.log.last_time_ms(),
                        next_record: *self.shared.applied_end.borrow(),
                        trimmed_below: 0,
                    };
                    self.write_snapshot(&blob).map_err(|e| serr(&e))?;
                    st.snapshot = Some(blob.clone());
                    blob
                }
            },
        };
        let data = serde_json::to_vec(&blob).map_err(|e| serr(&e))?;
        Ok(Snapshot {
            meta: blob.meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = StateMachine;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<JLogId>, StoredMembership<NodeId, BasicNode>), StorageError<NodeId>> {
        let st = lock(&self.shared.state);
        Ok((st.last_applied, Self::effective_membership(&st, None)))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<u64>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = JEntry> + Send,
        I::IntoIter: Send,
    {
        let entries: Vec<JEntry> = entries.into_iter().collect();
        // A leader's own entries may be committed before its own fsync finished (see
        // `LogStore::append`): apply (and so answer, serve, confirm) only what is durable here.
        if let Some(last) = entries.last() {
            self.shared
                .log
                .wait_flushed(last.log_id.index)
                .await
                .map_err(|e| {
                    StorageError::from(StorageIOError::write_state_machine(
                        openraft::AnyError::new(&e),
                    ))
                })?;
        }
        let mut out = Vec::new();
        let mut st = lock(&self.shared.state);
        let mut end = None;
        for e in entries {
            // Applied entries are committed, hence in the log (purges stop at the trim point,
            // which is applied already).
            let h = self.shared.log.header(e.log_id.index).ok_or_else(|| {
                StorageError::from(StorageIOError::read_log_at_index(
                    e.log_id.index,
                    openraft::AnyError::error("applied entry is missing from the log"),
                ))
            })?;
            st.last_applied = Some(e.log_id);
            end = Some(h.end_record());
            let mut result = h.first_record;
            match e.payload {
                EntryPayload::Membership(m) => {
                    st.memberships
                        .push(StoredMembership::new(Some(e.log_id), m));
                    if st.memberships.len() > MAX_MEMBERSHIP_HISTORY {
                        st.memberships.remove(0);
                    }
                }
                EntryPayload::Normal(JournalRequest::Trim { below, .. }) => {
                    // Never past the trim entry itself. Storage drops whole entries below the
                    // one holding `below`; readers are refused everything below `below`.
                    let below = below.min(h.first_record);
                    self.shared.trim_target.send_if_modified(|t| {
                        if below > *t {
                            *t = below;
                            true
                        } else {
                            false
                        }
                    });
                    result =
                        (*self.shared.trim_target.borrow()).max(self.shared.log.first_record());
                }
                _ => {}
            }
            out.push(result);
        }
        if let Some(end) = end {
            *lock(&self.shared.applied_at) = Some(std::time::Instant::now());
            self.shared.applied_end.send_replace(end);
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<NodeId>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<NodeId>> {
        let mut blob: SnapshotBlob = serde_json::from_slice(snapshot.get_ref()).map_err(|e| {
            StorageError::from(StorageIOError::read_snapshot(
                None,
                openraft::AnyError::new(&e),
            ))
        })?;
        blob.meta = meta.clone();
        // Under the state lock, as `build_snapshot` writes: the two write the same temporary
        // file, and openraft may run a build (after a trim entry) while it installs.
        let mut st = lock(&self.shared.state);
        self.write_snapshot(&blob).map_err(|e| serr(&e))?;
        self.shared.log.set_floor_time_ms(blob.time_ms);
        self.shared.log.set_floor_record(blob.next_record);
        st.last_applied = meta.last_log_id;
        st.memberships = vec![meta.last_membership.clone()];
        let end = blob.next_record;
        let trim = end.max(blob.trimmed_below);
        st.snapshot = Some(blob);
        self.shared.trim_target.send_if_modified(|t| {
            if trim > *t {
                *t = trim;
                true
            } else {
                false
            }
        });
        *lock(&self.shared.applied_at) = Some(std::time::Instant::now());
        self.shared.applied_end.send_replace(end);
        tracing::info!(upto = end, "installed a trim snapshot from the leader");
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        let st = lock(&self.shared.state);
        match &st.snapshot {
            None => Ok(None),
            Some(b) => {
                let data = serde_json::to_vec(b).map_err(|e| serr(&e))?;
                Ok(Some(Snapshot {
                    meta: b.meta.clone(),
                    snapshot: Box::new(Cursor::new(data)),
                }))
            }
        }
    }
}
