//! The in-memory MVCC state machine of one tenant: etcd's key-value, lease and alarm semantics,
//! applied deterministically from journal entries (see the crate README and docs/memstore.md).

mod auth;
mod catalogue;
mod dedup;
mod error;
mod keyspace;
mod lease;
mod point;
mod prefetch;
mod restore;
mod scan;
mod store;
mod zeroed;

pub mod checkpoint;
pub mod etcd_db;
pub mod validate;

use api::etcdserverpb::{
    AlarmResponse, CompactionResponse, DeleteRangeResponse, LeaseGrantResponse,
    LeaseKeepAliveResponse, LeaseRevokeResponse, PutResponse, TxnResponse,
};
use api::mvccpb;

pub use api::etcdserverpb::{
    AlarmMember, LeaseLeasesResponse, LeaseTimeToLiveResponse, RangeRequest, RangeResponse,
};
pub use auth::{Access, Caller, INITIAL_AUTH_REVISION, ROOT, root_permission};
pub use catalogue::{UID_LEN as TENANT_UID_LEN, purgeable};
pub use error::{Code, Error};
pub use point::RangeView;
pub use restore::{MAX_STAGE_BYTES, RestoreStep};
pub use scan::{HashScan, RangeScan, StepBudget};
pub use store::{MemStore, NEVER_COMPACTED};

/// etcd's default `--max-txn-ops`: what frontends refuse above unless told otherwise.
pub const DEFAULT_MAX_TXN_OPS: usize = 128;
/// The most operations a txn may hold when it is applied (`Config::max_txn_ops`): a ceiling for
/// frontends' `--max-txn-ops` (etcd's default is 128, and etcd lets it be raised, as a
/// migration with `etcdctl make-mirror` needs: it replays each revision of the source as one
/// txn, and a lease expiring with hundreds of keys makes one such revision). A frontend checks
/// its own limit before it journals a txn, so every txn in the journal is within this.
pub const APPLY_MAX_TXN_OPS: usize = 65_536;
/// etcd's minimum lease TTL with default election settings: ceil(1.5 * 10 ticks * 100 ms) = 2 s.
pub const DEFAULT_MIN_LEASE_TTL_SECS: i64 = 2;
/// etcd's `MaxLeaseTTL` (lease/lessor.go): 9,000,000,000 seconds.
pub const MAX_LEASE_TTL_SECS: i64 = 9_000_000_000;
/// etcd extends leases by the election timeout (1 s by default) when a new leader promotes.
pub const DEFAULT_LEADER_CHANGE_EXTEND_MS: i64 = 1_000;
/// The most journal time two consecutive entries' stamps may count towards lease expiry. The
/// journal stamps an idle shard every 500 ms at most (its idle tick, which it keeps at or below
/// this); a longer gap is time the journal could not stamp (no leader, no quorum, a leader's
/// clock stepping forward) and, as in etcd, where no leader means no lease expires, it does not
/// age leases beyond this.
pub const DEFAULT_LEASE_CLOCK_MAX_STEP_MS: i64 = 1_000;
/// etcd's lessor revokes at most 1,000 expired leases a second (`leaseRevokeRate`, 500 every
/// 500 ms), each its own proposal, so a mass expiry spreads over time instead of stalling the
/// server. Here: an applied entry revokes at most this rate times the journal time since the
/// previous entry (counted up to `lease_clock_max_step_ms`), and at least one lease; the
/// others wait, overdue, for the next entries (an idle shard's tick every 500 ms revokes 500).
pub const DEFAULT_LEASE_REVOKES_PER_SECOND: i64 = 1_000;
/// How long an applied request id is remembered for de-duplication (journal time). Duplicates
/// come only from the journal client re-appending a payload it could not confirm, which it does
/// for at most 30 s (`journal::client::RETRY_DEADLINE`, plus one 10 s attempt): 2 minutes leaves
/// a wide margin (clients' own retries are new requests with new ids).
pub const DEFAULT_REQUEST_ID_WINDOW_MS: i64 = 2 * 60 * 1_000;
/// etcd's default backend quota (`--quota-backend-bytes` = 2 GiB).
pub const DEFAULT_QUOTA_BYTES: i64 = 2 * 1024 * 1024 * 1024;
/// What the quota charges for each stored version besides its key and value (tombstones
/// included): about what a version costs etcd's backend (its revision key, the encoded
/// KeyValue's fields, the B+tree's share), so a tenant of tiny values meets NOSPACE near
/// where etcd would, instead of storing ~19 times as many versions (found by a review of
/// limits: empty values were charged their key alone).
pub const DEFAULT_STORED_VERSION_BYTES: i64 = 48;

/// Limits and timings of a store. Every replica of a tenant must use the same values, across
/// releases too: the defaults are frozen (test `apply_rules_are_part_of_the_journal_format`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub max_txn_ops: usize,
    pub min_lease_ttl_secs: i64,
    pub max_lease_ttl_secs: i64,
    pub leader_change_extend_ms: i64,
    /// See `DEFAULT_LEASE_CLOCK_MAX_STEP_MS`.
    pub lease_clock_max_step_ms: i64,
    /// See `DEFAULT_LEASE_REVOKES_PER_SECOND`.
    pub lease_revokes_per_second: i64,
    pub request_id_window_ms: i64,
    /// Stored bytes (keys and values of every version kept) above which writes raise the
    /// NOSPACE alarm and fail; <= 0 disables the quota.
    pub quota_bytes: i64,
    /// See `DEFAULT_STORED_VERSION_BYTES`.
    pub stored_version_bytes: i64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_txn_ops: APPLY_MAX_TXN_OPS,
            min_lease_ttl_secs: DEFAULT_MIN_LEASE_TTL_SECS,
            max_lease_ttl_secs: MAX_LEASE_TTL_SECS,
            leader_change_extend_ms: DEFAULT_LEADER_CHANGE_EXTEND_MS,
            lease_clock_max_step_ms: DEFAULT_LEASE_CLOCK_MAX_STEP_MS,
            lease_revokes_per_second: DEFAULT_LEASE_REVOKES_PER_SECOND,
            request_id_window_ms: DEFAULT_REQUEST_ID_WINDOW_MS,
            quota_bytes: DEFAULT_QUOTA_BYTES,
            stored_version_bytes: DEFAULT_STORED_VERSION_BYTES,
        }
    }
}

/// What applying one journal entry did.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    pub index: u64,
    /// The store revision after the apply.
    pub revision: i64,
    pub outcome: Outcome,
    /// Every event the entry produced (lease expiries first), in revision and sub-revision
    /// order, prev_kv filled whenever the key existed before; none from a store that does not
    /// emit events (`MemStore::set_emit_events`).
    pub events: Vec<mvccpb::Event>,
}

/// What `MemStore::apply_record` did with a journal record: the request id of the entry it
/// carried (empty for shard-wide records and other tenants' entries) and the apply itself.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordApplied {
    pub request_id: Vec<u8>,
    pub applied: Applied,
}

/// The answer to the request an entry carried.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Put(PutResponse),
    DeleteRange(DeleteRangeResponse),
    Txn(TxnResponse),
    Compact(CompactionResponse),
    LeaseGrant(LeaseGrantResponse),
    LeaseRevoke(LeaseRevokeResponse),
    LeaseKeepAlive(LeaseKeepAliveResponse),
    Alarm(AlarmResponse),
    /// An auth change was applied (the frontend answers it with the response its RPC names).
    Auth,
    /// The tenant's own part of its catalogue record was set (a `TenantChange` of its own
    /// name: `TenantOwn`, or quotas alone as older builds journalled them).
    Own,
    /// A catalogue change was applied (`_system` only): the tenant's record after it.
    Tenant(Box<api::strata::admin::TenantRecord>),
    /// A step of a staged restore (`RestoreBegin`, `RestoreChunk`, `RestoreCommit`).
    Restore(RestoreStep),
    /// The request id was applied before (within the window); nothing changed. `revision` is
    /// the store revision right after the first apply.
    Duplicate {
        revision: i64,
    },
    /// The request was refused; nothing changed (lease expiries before it still happened).
    Failed(Error),
    /// Tick, leader change, another tenant's entry, or an index already applied.
    Nothing,
}

/// The result of `hash_kv`: a hash of every key-value version up to `hash_revision`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HashKv {
    pub hash: u32,
    pub compact_revision: i64,
    pub hash_revision: i64,
}

/// Sizes of a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    /// Keys whose newest version is a put.
    pub keys: u64,
    /// Key + value bytes of the live keys.
    pub live_bytes: u64,
    /// Key + value bytes of every version kept (history since the compact revision).
    pub total_bytes: u64,
    /// Versions kept, tombstones included.
    pub versions: u64,
    /// What the quota counts: `total_bytes` plus `stored_version_bytes` per version (what
    /// Status reports as the database size).
    pub charged_bytes: u64,
    /// The same count for the live keys' newest versions only (Status's size in use).
    pub charged_live_bytes: u64,
    pub leases: u64,
    pub revision: i64,
    pub compact_revision: i64,
    pub applied_index: u64,
}

#[cfg(test)]
mod tests {
    use super::Config;

    /// The values every replica applies entries with. Two builds that differ in one of them
    /// compute different outcomes from the same journal (a retried request id remembered by one
    /// and not by the other, a lease that expires on one only, a txn one refuses), and during a
    /// rolling upgrade old and new frontends apply the same journal side by side. So they are
    /// part of what a journal means, like the entry format: a release that needs another value
    /// carries it in the journal (docs/OPERATIONS.md, "Upgrading"); it never changes them here.
    #[test]
    fn apply_rules_are_part_of_the_journal_format() {
        assert_eq!(
            Config::default(),
            Config {
                max_txn_ops: 65_536,
                min_lease_ttl_secs: 2,
                max_lease_ttl_secs: 9_000_000_000,
                leader_change_extend_ms: 1_000,
                lease_clock_max_step_ms: 1_000,
                lease_revokes_per_second: 1_000,
                request_id_window_ms: 120_000,
                quota_bytes: 2 << 30,
                stored_version_bytes: 48,
            },
            "a default that every replica applies with changed: see this test's doc"
        );
    }
}
