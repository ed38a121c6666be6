//! The journal's Prometheus metrics (through the `metrics` facade; the binary installs the
//! exporter): names, and the helpers that record them. Labels are bounded: `shard` only.

use std::time::Duration;

use crate::node::JournalNode;

/// Append calls answered with success.
pub const APPENDS_TOTAL: &str = "strata_journal_appends_total";
/// Records (payloads) acknowledged.
pub const RECORDS_TOTAL: &str = "strata_journal_records_total";
/// Latency of one fdatasync of a segment.
pub const FSYNC_SECONDS: &str = "strata_journal_fsync_seconds";
/// Raft entry batches (openraft `append` calls) made durable by one fsync: group commit.
pub const FSYNC_BATCH_APPENDS: &str = "strata_journal_fsync_batch_appends";
/// Records carried by one proposed Raft entry (coalesced Append calls).
pub const ENTRY_RECORDS: &str = "strata_journal_entry_records";
/// ReadIndex callers answered, by `path`: `lease` (from the leader lease, no round) or
/// `round` (a quorum round, `ensure_linearizable`).
pub const READ_INDEX_TOTAL: &str = "strata_journal_read_index_total";
/// Storage failures (write, fsync, vote) since start.
pub const STORAGE_ERRORS_TOTAL: &str = "strata_journal_storage_errors_total";
/// Times this node, leading, went `STEP_DOWN_AFTER` without a quorum's acknowledgement and
/// stopped taking appends (etcd's CheckQuorum; `crate::lease::QuorumCheck`).
pub const QUORUM_LOST_TOTAL: &str = "strata_journal_quorum_lost_total";
/// Leader hand-offs tried by this node, by `outcome` (`done`, `failed`).
pub const HANDOFFS_TOTAL: &str = "strata_journal_handoffs_total";
/// How long a hand-off kept the shard's writes paused.
pub const HANDOFF_PAUSE_SECONDS: &str = "strata_journal_handoff_pause_seconds";
/// Per shard: committed (applied) record index, last record index in the local log, first
/// retained record index, current term, leader id (0: unknown), 1 if this node leads, 1 if the
/// shard's storage failed.
pub const COMMITTED_INDEX: &str = "strata_journal_committed_index";
pub const LAST_INDEX: &str = "strata_journal_last_index";
pub const FIRST_INDEX: &str = "strata_journal_first_index";
pub const TERM: &str = "strata_journal_term";
pub const LEADER_ID: &str = "strata_journal_leader_id";
pub const IS_LEADER: &str = "strata_journal_is_leader";
pub const STORAGE_FAILED: &str = "strata_journal_storage_failed";

/// Histogram buckets (seconds) for fsync latency.
pub const FSYNC_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];
/// Histogram buckets for batch sizes (fsync batches, records per entry).
pub const BATCH_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0,
];

fn shard_label(shard: u32) -> [(&'static str, String); 1] {
    [("shard", shard.to_string())]
}

/// `calls` Append calls carrying `records` records in all were acknowledged (once per entry,
/// not per call: a registry lookup per call showed in profiles).
pub(crate) fn appended(shard: u32, calls: usize, records: usize) {
    let l = shard_label(shard);
    metrics::counter!(APPENDS_TOTAL, &l).increment(calls as u64);
    metrics::counter!(RECORDS_TOTAL, &l).increment(records as u64);
}

pub(crate) fn fsynced(shard: u32, took: Duration, appends: usize) {
    metrics::histogram!(FSYNC_SECONDS, &shard_label(shard)).record(took.as_secs_f64());
    metrics::histogram!(FSYNC_BATCH_APPENDS, &shard_label(shard)).record(appends as f64);
}

pub(crate) fn proposed(shard: u32, records: usize) {
    metrics::histogram!(ENTRY_RECORDS, &shard_label(shard)).record(records as f64);
}

pub(crate) fn read_index(shard: u32, lease: bool, callers: usize) {
    let labels = [
        ("shard", shard.to_string()),
        ("path", (if lease { "lease" } else { "round" }).to_string()),
    ];
    metrics::counter!(READ_INDEX_TOTAL, &labels).increment(callers as u64);
}

pub(crate) fn handoff(shard: u32, done: bool, paused: Duration) {
    let labels = [
        ("shard", shard.to_string()),
        (
            "outcome",
            (if done { "done" } else { "failed" }).to_string(),
        ),
    ];
    metrics::counter!(HANDOFFS_TOTAL, &labels).increment(1);
    metrics::histogram!(HANDOFF_PAUSE_SECONDS, &shard_label(shard)).record(paused.as_secs_f64());
}

pub(crate) fn quorum_lost(shard: u32) {
    metrics::counter!(QUORUM_LOST_TOTAL, &shard_label(shard)).increment(1);
}

pub(crate) fn storage_error(shard: u32) {
    metrics::counter!(STORAGE_ERRORS_TOTAL, &shard_label(shard)).increment(1);
}

/// Sets the per-shard gauges from the node's current state (call before rendering).
pub fn refresh(node: &JournalNode) {
    for shard in &node.shards {
        let l = shard_label(shard.id);
        let (leader, _) = shard.leader();
        let term = shard.raft.metrics().borrow().current_term;
        let committed = shard.sm.applied_end.borrow().saturating_sub(1);
        metrics::gauge!(COMMITTED_INDEX, &l).set(committed as f64);
        metrics::gauge!(LAST_INDEX, &l).set(shard.log.next_record().saturating_sub(1) as f64);
        metrics::gauge!(FIRST_INDEX, &l).set(shard.first_record() as f64);
        metrics::gauge!(TERM, &l).set(term as f64);
        metrics::gauge!(LEADER_ID, &l).set(leader.unwrap_or(0) as f64);
        metrics::gauge!(IS_LEADER, &l).set(if leader == Some(node.id) { 1.0 } else { 0.0 });
        metrics::gauge!(STORAGE_FAILED, &l).set(if shard.log.failed() { 1.0 } else { 0.0 });
    }
}
