//! `MemStore`: one tenant's whole state and the deterministic `apply` that moves it, plus the
//! reads (range, events, leases, hash) served from it.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};

use api::etcdserverpb::{
    AlarmMember, AlarmRequest, AlarmResponse, AlarmType, CompactionRequest, CompactionResponse,
    Compare, DeleteRangeRequest, DeleteRangeResponse, LeaseGrantRequest, LeaseGrantResponse,
    LeaseKeepAliveRequest, LeaseKeepAliveResponse, LeaseLeasesResponse, LeaseRevokeRequest,
    LeaseRevokeResponse, LeaseStatus, LeaseTimeToLiveResponse, PutRequest, PutResponse,
    RangeRequest, RangeResponse, RequestOp, ResponseHeader, ResponseOp, TxnRequest, TxnResponse,
    alarm_request::AlarmAction, compare, request_op, response_op,
};
use api::mvccpb::{Event, KeyValue, event::EventType};
use api::record::{DecodeError, FastRecord, PutView};
use api::strata::entry::{Entry, entry::Request};
use api::strata::journal::Record;

use crate::auth::{Access, AuthState, Caller, Perms};
use crate::dedup::Dedup;
use crate::keyspace::{KeySpace, Slot, Version, below, bounds, live_at};
use crate::lease::LeaseTable;
use crate::point::RangeView;
use crate::restore::Stage;
use crate::scan::{RangeScan, StepBudget};
use crate::{Applied, Config, Error, HashKv, Outcome, RecordApplied, Stats, validate};

/// The revision of an empty store, as in etcd.
pub(crate) const INITIAL_REVISION: i64 = 1;
/// The compact revision of a store never compacted, as etcd's (`compactMainRev` starts at
/// -1): a first `Compact(0)` is accepted, and HashKV answers it as `compact_revision`.
pub const NEVER_COMPACTED: i64 = -1;

/// Everything a checkpoint holds (`checkpoint` archives it with the keys flattened).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct State {
    pub applied_index: u64,
    pub revision: i64,
    pub compact_revision: i64,
    pub time_ms: i64,
    pub keys: KeySpace,
    pub leases: LeaseTable,
    pub dedup: Dedup,
    /// (member id, alarm type) pairs, sorted.
    pub alarms: BTreeSet<(u64, i32)>,
    pub auth: AuthState,
    /// The restore being staged, if any (see `restore`).
    pub restore: Option<Stage>,
    /// What the tenant catalogue says of this tenant that its replicas enforce (`TenantChange`
    /// of its own name: see `catalogue`): its quotas (each 0 is "the configuration's"), and
    /// whether it is suspended or deleted (writes refused).
    pub own: api::strata::entry::TenantOwn,
}

impl State {
    fn new() -> Self {
        State {
            applied_index: 0,
            revision: INITIAL_REVISION,
            compact_revision: NEVER_COMPACTED,
            time_ms: 0,
            keys: KeySpace::default(),
            leases: LeaseTable::default(),
            dedup: Dedup::default(),
            alarms: BTreeSet::new(),
            auth: AuthState::default(),
            restore: None,
            own: api::strata::entry::TenantOwn::default(),
        }
    }
}

/// One tenant's whole MVCC state. Pure and deterministic: the same entries applied in the same
/// order give the same state on every replica.
#[derive(Debug, Clone)]
pub struct MemStore {
    config: Config,
    pub(crate) state: State,
    /// Whether applies build their watch events (`set_emit_events`). Not state: two stores
    /// that differ only here are equal.
    pub(crate) emit_events: bool,
    /// The restore whose chunks are staged without their values
    /// (`stage_restore_without_values`). Not state.
    pub(crate) valueless_restore: Option<Vec<u8>>,
    /// Every user's merged permissions, derived from `state.auth` (rebuilt after each auth
    /// change and on load; not state).
    auth_perms: Perms,
}

impl PartialEq for MemStore {
    fn eq(&self, other: &Self) -> bool {
        self.config == other.config && self.state == other.state
    }
}

fn header(revision: i64) -> Option<ResponseHeader> {
    Some(ResponseHeader {
        revision,
        ..Default::default()
    })
}

/// A write in progress: every change of one request lands at `rev`, sub-revisions in order.
pub(crate) struct Writer<'a> {
    pub(crate) state: &'a mut State,
    rev: i64,
    sub: u32,
    events: &'a mut Vec<Event>,
    /// False when the store does not build events (`MemStore::set_emit_events`).
    emit: bool,
}

impl Writer<'_> {
    pub(crate) fn new<'a>(
        state: &'a mut State,
        events: &'a mut Vec<Event>,
        emit: bool,
    ) -> Writer<'a> {
        let rev = state.revision + 1;
        Writer {
            state,
            rev,
            sub: 0,
            events,
            emit,
        }
    }

    /// The revision reads inside this write see (etcd's write txn: begin + 1 once it changed).
    fn read_rev(&self) -> i64 {
        if self.sub > 0 { self.rev } else { self.rev - 1 }
    }

    pub(crate) fn put(&mut self, req: &PutRequest) -> PutResponse {
        self.put_bytes(
            req.key.as_slice(),
            req.value.as_slice(),
            PutFlags::of(req),
            None,
        )
    }

    /// The one put: `key` and `value` are copied or moved into the store as their types allow
    /// (a decoded request's `Vec`s move, a record's slices are copied once); the event's
    /// key-value is copied from what the store then holds, unless the caller copied its key
    /// and value ahead (`event_bytes`).
    fn put_bytes<K, V>(
        &mut self,
        key: K,
        value: V,
        flags: PutFlags,
        event_bytes: Option<EventBytes>,
    ) -> PutResponse
    where
        K: AsRef<[u8]> + Into<Box<[u8]>>,
        V: Into<Box<[u8]>>,
    {
        let (rev, sub, emit) = (self.rev, self.sub, self.emit);
        let mut old_lease = 0;
        let mut prev_event = None;
        let mut prev_resp = None;
        let lease = |old_lease| {
            if flags.ignore_lease {
                old_lease
            } else {
                flags.lease
            }
        };
        let id = self.state.keys.upsert(key, |k, versions| {
            let prev = versions
                .and_then(|vs| vs.last())
                .filter(|v| !v.is_tombstone());
            if emit {
                prev_event = versions
                    .and_then(|vs| live_at(vs, rev - 1))
                    .map(|v| v.to_kv(k, false));
            }
            if flags.prev_kv {
                prev_resp = prev.map(|p| p.to_kv(k, false));
            }
            old_lease = prev.map_or(0, |p| p.lease);
            let value: Box<[u8]> = match prev {
                Some(p) if flags.ignore_value => p.value.clone(),
                _ => value.into(),
            };
            Version {
                main: rev,
                sub,
                create: prev.map_or(rev, |p| p.create),
                version: prev.map_or(1, |p| p.version + 1),
                lease: lease(old_lease),
                value,
            }
        });
        let lease = lease(old_lease);
        let slot = self.state.keys.slot(id);
        if old_lease != 0 && old_lease != lease {
            self.state.leases.detach(old_lease, &slot.key);
        }
        if lease != 0 && lease != old_lease {
            self.state.leases.attach(lease, &slot.key);
        }
        self.sub += 1;
        if !emit {
            return PutResponse {
                header: header(self.rev),
                prev_kv: prev_resp,
            };
        }
        let kv = slot.versions.last().map(|v| match event_bytes {
            Some(EventBytes { key, value }) => {
                debug_assert!(key == *slot.key && value == *v.value);
                v.kv_with(key, value)
            }
            None => v.to_kv(&slot.key, false),
        });
        if self.events.capacity() == 0 {
            // Most entries are one put: room for its one event, not the four a first push
            // would make.
            self.events.reserve_exact(1);
        }
        self.events.push(Event {
            r#type: EventType::Put as i32,
            kv,
            prev_kv: prev_event,
        });
        // As etcd's applier: the revision the put wrote at (inside a txn too).
        PutResponse {
            header: header(self.rev),
            prev_kv: prev_resp,
        }
    }

    /// Writes a tombstone for a live key whose newest version carries `lease`.
    pub(crate) fn delete_key(&mut self, key: &[u8], lease: i64) {
        if lease != 0 {
            self.state.leases.detach(lease, key);
        }
        let (rev, sub, emit) = (self.rev, self.sub, self.emit);
        let mut prev_event = None;
        self.state.keys.upsert(key, |_, versions| {
            if emit {
                prev_event = versions
                    .and_then(|vs| live_at(vs, rev - 1))
                    .map(|v| v.to_kv(key, false));
            }
            Version {
                main: rev,
                sub,
                create: 0,
                version: 0,
                lease: 0,
                value: Box::default(),
            }
        });
        self.sub += 1;
        if !emit {
            return;
        }
        self.events.push(Event {
            r#type: EventType::Delete as i32,
            kv: Some(KeyValue {
                key: key.to_vec(),
                mod_revision: self.rev,
                ..Default::default()
            }),
            prev_kv: prev_event,
        });
    }

    fn delete_range(&mut self, req: &DeleteRangeRequest) -> DeleteRangeResponse {
        let mut prev_kvs = Vec::new();
        let victims: Vec<(Vec<u8>, i64)> = self
            .state
            .keys
            .iter_range(&req.key, &req.range_end)
            .filter_map(|(k, vs)| {
                let v = vs.last().filter(|v| !v.is_tombstone())?;
                if req.prev_kv {
                    prev_kvs.push(v.to_kv(k, false));
                }
                Some((k.to_vec(), v.lease))
            })
            .collect();
        for (k, lease) in &victims {
            self.delete_key(k, *lease);
        }
        // As etcd's applier: the revision written at if this or an earlier operation of the
        // txn changed something, else the revision read at.
        DeleteRangeResponse {
            header: header(self.read_rev()),
            deleted: victims.len() as i64,
            prev_kvs,
        }
    }

    /// Ends the write: the revision moves only if something changed.
    pub(crate) fn finish(self) -> i64 {
        if self.sub > 0 {
            self.state.revision = self.rev;
        }
        self.state.revision
    }
}

/// The parts of a put request other than its key and value.
#[derive(Clone, Copy)]
struct PutFlags {
    lease: i64,
    prev_kv: bool,
    ignore_value: bool,
    ignore_lease: bool,
}

impl PutFlags {
    fn of(req: &PutRequest) -> PutFlags {
        PutFlags {
            lease: req.lease,
            prev_kv: req.prev_kv,
            ignore_value: req.ignore_value,
            ignore_lease: req.ignore_lease,
        }
    }

    fn of_view(v: &PutView<'_>) -> PutFlags {
        PutFlags {
            lease: v.lease,
            prev_kv: v.prev_kv,
            ignore_value: v.ignore_value,
            ignore_lease: v.ignore_lease,
        }
    }
}

/// A put event's key and value, copied by a caller before the put runs (they are the put's
/// own key and value; not for `ignore_value`, whose value is the previous one).
struct EventBytes {
    key: Vec<u8>,
    value: Vec<u8>,
}

/// What an entry carries, as far as `apply_parts` must know before running it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Carried {
    /// No request, or a tick: time moves on, nothing else.
    Nothing,
    /// A journal leader change: leases are extended.
    LeaderChange,
    /// A request to de-duplicate and run.
    Request,
}

impl Carried {
    fn of(request: Option<&Request>) -> Carried {
        match request {
            None | Some(Request::Tick(_)) => Carried::Nothing,
            Some(Request::LeaderChange(_)) => Carried::LeaderChange,
            Some(_) => Carried::Request,
        }
    }
}

/// Nested txn decisions, evaluated against the state before the txn (etcd's compareToPath).
struct Path {
    succeeded: bool,
    children: Vec<Path>,
}

impl MemStore {
    pub fn new(config: Config) -> Self {
        Self::from_state(config, State::new())
    }

    /// Whether applies build the watch events of what they change (`Applied::events`; on by
    /// default). A replica nobody watches (the compactor's) turns them off: the copies of every
    /// changed key and value, and of its previous version, are then not made. The state, the
    /// outcomes and every read are the same either way.
    pub fn set_emit_events(&mut self, on: bool) {
        self.emit_events = on;
    }

    /// For a process that applies a restore only to learn its outcome (`strata admin backup
    /// restore`, which appended it): the chunks of restore `restore_id` are staged without
    /// their values, so the stage holds the keys and guards alone instead of a second copy of
    /// the restored state. Every outcome is the same (no check reads a value, and the stage's
    /// byte bound counts the values as sent), but once that restore commits, the keys it put
    /// hold empty values: such a store must then serve nothing and be checkpointed nowhere.
    pub fn stage_restore_without_values(&mut self, restore_id: Vec<u8>) {
        self.valueless_restore = Some(restore_id);
    }

    /// The store of a tenant that has no entry at or below journal index `applied_index`:
    /// what applying that many other tenants' entries (ticks) to a new store leaves, but for
    /// the journal time, which the next entry sets. A replica starts here when the journal was
    /// trimmed before the tenant's first entry.
    pub fn new_at(config: Config, applied_index: u64) -> Self {
        let mut store = Self::new(config);
        store.state.applied_index = applied_index;
        store
    }

    /// True while the store holds nothing a tenant's entry could have left: no key, version,
    /// lease, compaction, alarm or remembered request id (it may have applied ticks).
    pub fn is_pristine(&self) -> bool {
        let st = &self.state;
        st.revision == 1
            && st.compact_revision == NEVER_COMPACTED
            && st.keys.versions == 0
            && st.leases.leases.is_empty()
            && st.alarms.is_empty()
            && st.dedup.len() == 0
            && st.restore.is_none()
            && st.auth == AuthState::default()
    }

    pub(crate) fn from_state(config: Config, state: State) -> Self {
        MemStore {
            config,
            auth_perms: Perms::build(&state.auth),
            state,
            emit_events: true,
            valueless_restore: None,
        }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Replaces the limits (for a store loaded from a checkpoint).
    pub fn set_config(&mut self, config: Config) {
        self.config = config;
    }

    pub fn applied_index(&self) -> u64 {
        self.state.applied_index
    }

    pub fn revision(&self) -> i64 {
        self.state.revision
    }

    pub fn compact_revision(&self) -> i64 {
        self.state.compact_revision
    }

    pub fn time_ms(&self) -> i64 {
        self.state.time_ms
    }

    /// The revision at which the entry carrying `request_id` was applied, while the
    /// de-duplication window still remembers it (`Config::request_id_window_ms`): how a
    /// frontend learns that a write whose outcome it never saw (a checkpoint covered it) was
    /// applied all the same.
    pub fn applied_request(&self, request_id: &[u8]) -> Option<i64> {
        self.state.dedup.get(request_id)
    }

    pub fn stats(&self) -> Stats {
        let k = &self.state.keys;
        Stats {
            keys: k.live_keys,
            live_bytes: k.live_bytes,
            total_bytes: k.total_bytes,
            versions: k.versions,
            charged_bytes: self.charged_bytes(),
            charged_live_bytes: k
                .live_bytes
                .saturating_add(k.live_keys.saturating_mul(self.version_charge())),
            leases: self.state.leases.leases.len() as u64,
            revision: self.state.revision,
            compact_revision: self.state.compact_revision,
            applied_index: self.state.applied_index,
        }
    }

    /// Whether the tenant's auth is enabled.
    pub fn auth_enabled(&self) -> bool {
        self.state.auth.enabled
    }

    /// The tenant's auth revision (etcd's: 1 before any change, one more per change).
    pub fn auth_revision(&self) -> u64 {
        self.state.auth.revision()
    }

    /// A user, roles sorted (etcd's UserGet), or None.
    pub fn auth_user(&self, name: &str) -> Option<api::authpb::User> {
        self.state.auth.user(name)
    }

    /// Every user's name, sorted (etcd's UserList).
    pub fn auth_users(&self) -> Vec<String> {
        self.state.auth.users.keys().cloned().collect()
    }

    /// A role's permissions, sorted by key (etcd's RoleGet; the root role answers read and
    /// write on every key), or None.
    pub fn auth_role(&self, name: &str) -> Option<Vec<api::authpb::Permission>> {
        let role = self.state.auth.role(name)?;
        if name == crate::ROOT {
            return Some(vec![crate::root_permission()]);
        }
        Some(role.key_permission)
    }

    /// Every role's name, sorted (etcd's RoleList).
    pub fn auth_roles(&self) -> Vec<String> {
        self.state.auth.roles.keys().cloned().collect()
    }

    /// Rebuilds what is derived from the auth state, after it changed.
    pub(crate) fn auth_changed(&mut self) {
        self.auth_perms = Perms::build(&self.state.auth);
    }

    /// The whole auth state as a restore carries it (`RestoreCommit.auth`): what
    /// `compactor::restore::plan` compares and stages.
    pub fn auth_export(&self) -> api::strata::entry::RestoreAuth {
        self.state.auth.export()
    }

    /// Why enabling auth would be refused now (etcd's checks), if it would.
    pub fn auth_check_enable(&self) -> Result<(), Error> {
        self.state.auth.check_enable()
    }

    pub fn alarms(&self) -> Vec<AlarmMember> {
        self.state
            .alarms
            .iter()
            .map(|&(member_id, alarm)| AlarmMember { member_id, alarm })
            .collect()
    }

    /// Applies the entry at journal `index` (see the crate docs for the order of effects).
    pub fn apply(&mut self, index: u64, entry: &Entry) -> Applied {
        let request = entry.request.as_ref();
        let caller = Caller {
            user: &entry.user,
            revision: entry.auth_revision,
        };
        self.apply_parts(
            index,
            entry.time_ms,
            &entry.request_id,
            Carried::of(request),
            |s, events| match request {
                Some(req) => match s.check_request(caller, req) {
                    Ok(()) => s.apply_request(index, &entry.tenant, req, events),
                    Err(e) => Outcome::Failed(e),
                },
                None => Outcome::Nothing,
            },
        )
    }

    /// `apply` of an entry the caller gives away (a replica's freshly decoded entry): a put's
    /// key and value bytes move into the store instead of being copied. Same outcome, events
    /// and state as `apply(index, &entry)`.
    pub fn apply_owned(&mut self, index: u64, mut entry: Entry) -> Applied {
        let request_id = std::mem::take(&mut entry.request_id);
        self.apply_entry_without_id(index, entry, &request_id)
    }

    /// Applies journal record `record` as tenant `tenant`'s replica: the same as
    /// `apply_owned(record.index, api::record::entry_for_tenant_owned(record, tenant)?)`
    /// (same outcome, events and state; the entry's request id comes back beside them), but
    /// a put is read straight from the record's bytes (`api::record::put_view`) into the store,
    /// without decoding an `Entry` first. A record that cannot be decoded changes nothing.
    pub fn apply_record(
        &mut self,
        record: Record,
        tenant: &str,
    ) -> Result<RecordApplied, DecodeError> {
        if let Some(done) = self.apply_record_fast(&record, tenant) {
            return Ok(done);
        }
        let index = record.index;
        let mut entry = api::record::entry_for_tenant_owned(record, tenant)?;
        let request_id = std::mem::take(&mut entry.request_id);
        let applied = self.apply_entry_without_id(index, entry, &request_id);
        Ok(RecordApplied {
            request_id,
            applied,
        })
    }

    /// `apply_record` of a record the caller keeps (the fallback decodes from a borrowed
    /// payload, which copies a put's bytes once more; a put itself costs the same).
    pub fn apply_record_ref(
        &mut self,
        record: &Record,
        tenant: &str,
    ) -> Result<RecordApplied, DecodeError> {
        if let Some(done) = self.apply_record_fast(record, tenant) {
            return Ok(done);
        }
        let mut entry = api::record::entry_for_tenant(record, tenant)?;
        let request_id = std::mem::take(&mut entry.request_id);
        let applied = self.apply_entry_without_id(record.index, entry, &request_id);
        Ok(RecordApplied {
            request_id,
            applied,
        })
    }

    /// `apply_owned` of an entry whose request id the caller took out (`request_id`).
    fn apply_entry_without_id(&mut self, index: u64, entry: Entry, request_id: &[u8]) -> Applied {
        let Entry {
            time_ms,
            request,
            user,
            auth_revision,
            tenant,
            ..
        } = entry;
        let caller = Caller {
            user: &user,
            revision: auth_revision,
        };
        self.apply_parts(
            index,
            time_ms,
            request_id,
            Carried::of(request.as_ref()),
            |s, events| {
                if let Some(Err(e)) = request.as_ref().map(|r| s.check_request(caller, r)) {
                    return Outcome::Failed(e);
                }
                match request {
                    Some(Request::Put(p)) => {
                        let flags = PutFlags::of(&p);
                        s.apply_put_with(p.key, p.value, flags, None, events)
                            .map_or_else(Outcome::Failed, Outcome::Put)
                    }
                    Some(other) => s.apply_request(index, &tenant, &other, events),
                    None => Outcome::Nothing,
                }
            },
        )
    }

    /// Starts loading what a put looks up first (its request id in the de-duplication window,
    /// its key in the index): on a large tenant both are cache misses, and issued as the put
    /// starts they overlap instead of running one after the other. (Issued one record ahead,
    /// in the replica's loop, it was slower: parsing the next record twice cost more than the
    /// overlap gained.)
    fn prefetch_put(&self, request_id: &[u8], key: &[u8]) {
        if !request_id.is_empty() {
            self.state.dedup.prefetch(request_id);
        }
        self.state.keys.prefetch(key);
    }

    /// The records `api::record::put_view` reads in place (a put, another tenant's put),
    /// applied; None for every other record.
    fn apply_record_fast(&mut self, record: &Record, tenant: &str) -> Option<RecordApplied> {
        let (index, time_ms) = (record.index, record.time_ms);
        Some(match api::record::put_view(record, tenant)? {
            // With auth enabled a put is checked against its entry's caller: decoded whole.
            FastRecord::Put(_) if self.state.auth.enabled => return None,
            FastRecord::Put(v) => {
                self.prefetch_put(v.request_id, v.key);
                // Done while those lines come in, as none waits for them: the value's copy
                // into the box the store keeps, the event's copies of key and value (all
                // wasted only on a duplicate or a failed put) and the id's copy handed back.
                let value: Box<[u8]> = v.value.into();
                let flags = PutFlags::of_view(&v);
                let event_bytes = (self.emit_events && !flags.ignore_value).then(|| EventBytes {
                    key: v.key.to_vec(),
                    value: v.value.to_vec(),
                });
                let request_id = v.request_id.to_vec();
                let applied = self.apply_parts(
                    index,
                    time_ms,
                    v.request_id,
                    Carried::Request,
                    |s, events| {
                        s.apply_put_with(v.key, value, flags, event_bytes, events)
                            .map_or_else(Outcome::Failed, Outcome::Put)
                    },
                );
                RecordApplied {
                    request_id,
                    applied,
                }
            }
            FastRecord::OtherTenant => RecordApplied {
                request_id: Vec::new(),
                applied: self.apply_parts(index, time_ms, &[], Carried::Nothing, |_, _| {
                    Outcome::Nothing
                }),
            },
        })
    }

    /// The body of every apply: time, lease expiry, de-duplication around `run`, which
    /// applies the request itself (run only when `carried` is a request).
    fn apply_parts(
        &mut self,
        index: u64,
        time_ms: i64,
        request_id: &[u8],
        carried: Carried,
        run: impl FnOnce(&mut Self, &mut Vec<Event>) -> Outcome,
    ) -> Applied {
        if index <= self.state.applied_index {
            return Applied {
                index,
                revision: self.state.revision,
                outcome: Outcome::Nothing,
                events: Vec::new(),
            };
        }
        self.state.applied_index = index;
        // Journal time is monotonic per shard; guard anyway so time never runs backwards here.
        let before = self.state.time_ms;
        let now = time_ms.max(before);
        self.state.time_ms = now;
        // A gap the journal could not stamp (no leader, no quorum, a stepped clock) does not age
        // leases beyond one step: etcd's leases do not expire while there is no leader, and its
        // new leader counts from its own promotion (the LeaderChange entry carries the old
        // leader's last stamp; the new leader's first entry, the real time of promotion). Nor
        // does it age the request-id window: a client's retry of an append whose answer was
        // lost at a failover still finds the first copy, however far the new leader's clock
        // moved journal time (session 24: the fault suite found a put applied twice after a
        // leader with its clock an hour ahead took over).
        let uncounted = now - before - self.config.lease_clock_max_step_ms;
        if before > 0 && uncounted > 0 {
            self.state.leases.postpone_all(uncounted);
            self.state.dedup.postpone_all(uncounted);
        }
        let mut events = Vec::new();
        if carried == Carried::LeaderChange {
            // A new journal leader: extend instead of expiring, so a failover never expires a
            // live lease early (etcd's lessor Promote).
            self.state
                .leases
                .extend_all(now, self.config.leader_change_extend_ms);
        } else if !self.corrupt() {
            // While CORRUPT is raised etcd's lessor proposes the revokes of expired leases and
            // the corrupt applier refuses them: the leases and their keys stay until it is
            // disarmed, then go from the next entry on.
            let counted = if before > 0 {
                (now - before).min(self.config.lease_clock_max_step_ms)
            } else {
                self.config.lease_clock_max_step_ms
            };
            let budget =
                (counted.saturating_mul(self.config.lease_revokes_per_second) / 1000).max(1);
            self.expire_leases(now, budget, &mut events);
        }
        self.prune_dedup(now);

        let outcome = match carried {
            Carried::Nothing | Carried::LeaderChange => Outcome::Nothing,
            Carried::Request => {
                let seen = if request_id.is_empty() {
                    None
                } else {
                    Some(self.state.dedup.look_up(request_id))
                };
                match seen {
                    Some(Err(revision)) => Outcome::Duplicate { revision },
                    Some(Ok(key)) => {
                        let outcome = run(self, &mut events);
                        self.state.dedup.remember(key, now, self.state.revision);
                        outcome
                    }
                    None => run(self, &mut events),
                }
            }
        };
        Applied {
            index,
            revision: self.state.revision,
            outcome,
            events,
        }
    }

    fn prune_dedup(&mut self, now: i64) {
        let horizon = now.saturating_sub(self.config.request_id_window_ms);
        self.state.dedup.prune(horizon);
    }

    /// Revokes up to `budget` leases whose deadline passed, earliest first.
    fn expire_leases(&mut self, now: i64, budget: i64, events: &mut Vec<Event>) {
        for _ in 0..budget {
            let Some(id) = self.state.leases.next_expired(now) else {
                return;
            };
            self.revoke(id, events);
        }
    }

    /// Removes a lease and deletes its keys, in key order, in one revision.
    fn revoke(&mut self, id: i64, events: &mut Vec<Event>) -> i64 {
        let Some(lease) = self.state.leases.remove(id) else {
            return self.state.revision;
        };
        let mut w = Writer::new(&mut self.state, events, self.emit_events);
        for key in &lease.keys {
            if let Some(lease) = w.state.keys.latest_live(key).map(|v| v.lease) {
                w.delete_key(key, lease);
            }
        }
        w.finish()
    }

    fn nospace(&self) -> bool {
        self.state
            .alarms
            .iter()
            .any(|&(_, a)| a == AlarmType::Nospace as i32)
    }

    /// Refuses a write that the NOSPACE alarm or the quota forbids; going over the quota
    /// raises the alarm (member 0: the tenant's store as a whole).
    fn check_space(&mut self, cost: u64) -> Result<(), Error> {
        if self.nospace() {
            return Err(Error::NoSpace);
        }
        let quota = match self.tenant_quotas().stored_bytes {
            0 => self.config.quota_bytes,
            own => own,
        };
        if quota > 0 && self.charged_bytes().saturating_add(cost) > quota as u64 {
            self.state.alarms.insert((0, AlarmType::Nospace as i32));
            return Err(Error::NoSpace);
        }
        Ok(())
    }

    /// What the quota counts of what is stored: keys and values of every version, and
    /// `stored_version_bytes` for each.
    fn charged_bytes(&self) -> u64 {
        let k = &self.state.keys;
        k.total_bytes
            .saturating_add(k.versions.saturating_mul(self.version_charge()))
    }

    fn version_charge(&self) -> u64 {
        self.config.stored_version_bytes.max(0) as u64
    }

    fn corrupt(&self) -> bool {
        !self.state.alarms.is_empty()
            && self
                .state
                .alarms
                .iter()
                .any(|&(_, a)| a == AlarmType::Corrupt as i32)
    }

    /// The permissions `req` needs, checked against `caller` as etcd's auth applier checks a
    /// request it applies (nothing while auth is disabled): puts and deletes need WRITE on their
    /// keys and READ too with `prev_kv`, a put with a lease WRITE on the keys already attached
    /// to it, a txn READ on its compares and the needs of every op of both branches, a lease
    /// revoke WRITE on every attached key unless the caller holds the root role, an auth change
    /// the root role. Compactions, lease grants and keep-alives, alarms, restores and journal
    /// entries need nothing. The frontend runs the same check before it journals a request (so
    /// a denied one costs no entry) and for the reads it serves; the check at apply counts.
    pub fn check_request(&self, caller: Caller<'_>, req: &Request) -> Result<(), Error> {
        let auth = &self.state.auth;
        if !auth.enabled {
            return Ok(());
        }
        match req {
            Request::Put(p) => self.check_put(caller, &p.key, p.lease, p.prev_kv),
            Request::DeleteRange(d) => self.check_delete(caller, &d.key, &d.range_end, d.prev_kv),
            Request::Txn(t) => self.check_txn(caller, t),
            Request::LeaseRevoke(r) => {
                if self.auth_perms.check_admin(auth, caller.user).is_ok() {
                    return Ok(());
                }
                self.check_lease_keys(caller, r.id)
            }
            Request::Auth(_) => self.auth_perms.check_admin(auth, caller.user),
            _ => Ok(()),
        }
    }

    /// READ on `[key, range_end)` (a Range, a watch), as `check_request` checks.
    pub fn check_read(
        &self,
        caller: Caller<'_>,
        key: &[u8],
        range_end: &[u8],
    ) -> Result<(), Error> {
        self.access(caller, key, range_end, Access::Read)
    }

    /// The root role (the admin RPCs: auth management, snapshots, hashes, defragmentation).
    pub fn check_admin(&self, user: &str) -> Result<(), Error> {
        self.auth_perms.check_admin(&self.state.auth, user)
    }

    /// etcd's UserGet and RoleGet rule: the root role, or oneself, or one's own role.
    pub fn check_admin_or(&self, user: &str, own: impl FnOnce(&str) -> bool) -> Result<(), Error> {
        match self.check_admin(user) {
            Err(_) if own(user) => Ok(()),
            r => r,
        }
    }

    /// The stored password hash of user `user` (empty for one without a password), if it
    /// exists: what a request's token is checked against, without decoding the user.
    pub fn auth_password(&self, user: &str) -> Option<&[u8]> {
        self.auth_perms.password(user)
    }

    /// Whether `user` holds `role`.
    pub fn auth_has_role(&self, user: &str, role: &str) -> bool {
        Perms::has_role(&self.state.auth, user, role)
    }

    /// A txn's needs (etcd's `checkTxnAuth`): READ on each compare's range, then every op of
    /// both branches, nested txns included, whichever branch would run.
    pub fn check_txn(&self, caller: Caller<'_>, t: &TxnRequest) -> Result<(), Error> {
        if !self.state.auth.enabled {
            return Ok(());
        }
        for c in &t.compare {
            self.access(caller, &c.key, &c.range_end, Access::Read)?;
        }
        for op in t.success.iter().chain(&t.failure) {
            match &op.request {
                Some(request_op::Request::RequestRange(r)) => {
                    self.access(caller, &r.key, &r.range_end, Access::Read)?;
                }
                Some(request_op::Request::RequestPut(p)) => {
                    self.access(caller, &p.key, b"", Access::Write)?;
                    if p.prev_kv {
                        self.access(caller, &p.key, b"", Access::Read)?;
                    }
                }
                Some(request_op::Request::RequestDeleteRange(d)) => {
                    self.check_delete(caller, &d.key, &d.range_end, d.prev_kv)?;
                }
                Some(request_op::Request::RequestTxn(inner)) => self.check_txn(caller, inner)?,
                None => {}
            }
        }
        Ok(())
    }

    fn access(
        &self,
        caller: Caller<'_>,
        key: &[u8],
        end: &[u8],
        access: Access,
    ) -> Result<(), Error> {
        self.auth_perms
            .check(&self.state.auth, caller, key, end, access)
    }

    /// etcd's Put check: WRITE on the key, WRITE on every key the lease already holds (a user
    /// who could not revoke the lease may not attach to it), READ with `prev_kv`.
    fn check_put(
        &self,
        caller: Caller<'_>,
        key: &[u8],
        lease: i64,
        prev_kv: bool,
    ) -> Result<(), Error> {
        self.access(caller, key, b"", Access::Write)?;
        self.check_lease_keys(caller, lease)?;
        if prev_kv {
            self.access(caller, key, b"", Access::Read)?;
        }
        Ok(())
    }

    fn check_delete(
        &self,
        caller: Caller<'_>,
        key: &[u8],
        end: &[u8],
        prev_kv: bool,
    ) -> Result<(), Error> {
        if prev_kv {
            self.access(caller, key, end, Access::Read)?;
        }
        self.access(caller, key, end, Access::Write)
    }

    /// WRITE on every key attached to lease `id` (none if it does not exist).
    fn check_lease_keys(&self, caller: Caller<'_>, id: i64) -> Result<(), Error> {
        if id == 0 {
            return Ok(());
        }
        for key in self.state.leases.get(id).iter().flat_map(|l| &l.keys) {
            self.access(caller, key, b"", Access::Write)?;
        }
        Ok(())
    }

    fn apply_request(
        &mut self,
        index: u64,
        tenant: &str,
        req: &Request,
        events: &mut Vec<Event>,
    ) -> Outcome {
        // While CORRUPT is raised etcd refuses these before anything else (its corrupt applier
        // wraps the others, the NOSPACE one included); keep-alives and alarms go on. Puts check
        // it where every put path meets (`apply_put_with`).
        if self.corrupt()
            && matches!(
                req,
                Request::DeleteRange(_)
                    | Request::Txn(_)
                    | Request::Compact(_)
                    | Request::LeaseGrant(_)
                    | Request::LeaseRevoke(_)
            )
        {
            return Outcome::Failed(Error::CorruptAlarm);
        }
        // A suspended or deleted tenant's writes are refused here, whichever frontend
        // journalled them (one whose catalogue lags included); what the service itself does to
        // the tenant (compaction, alarms, a staged restore, its own changes) goes on.
        if matches!(
            req,
            Request::DeleteRange(_)
                | Request::Txn(_)
                | Request::LeaseGrant(_)
                | Request::LeaseRevoke(_)
                | Request::LeaseKeepAlive(_)
                | Request::Auth(_)
        ) && let Err(e) = self.check_not_fenced()
        {
            return Outcome::Failed(e);
        }
        let result = match req {
            Request::Put(p) => self.apply_put(p, events).map(Outcome::Put),
            Request::DeleteRange(d) => self.apply_delete_range(d, events).map(Outcome::DeleteRange),
            Request::Txn(t) => self.apply_txn(t, events).map(Outcome::Txn),
            Request::Compact(c) => self.apply_compact(c).map(Outcome::Compact),
            Request::LeaseGrant(g) => self.apply_lease_grant(index, g).map(Outcome::LeaseGrant),
            Request::LeaseRevoke(r) => self.apply_lease_revoke(r, events).map(Outcome::LeaseRevoke),
            Request::LeaseKeepAlive(k) => self.apply_keep_alive(k).map(Outcome::LeaseKeepAlive),
            Request::Alarm(a) => Ok(Outcome::Alarm(self.apply_alarm(a))),
            Request::Auth(a) => self.state.auth.apply(a).map(|()| {
                self.auth_changed();
                Outcome::Auth
            }),
            Request::TenantChange(c) if tenant == api::tenant::SYSTEM_TENANT => self
                .apply_tenant_change(index, c, events)
                .map(|r| Outcome::Tenant(Box::new(r))),
            Request::TenantChange(c) => self.apply_own_change(tenant, c).map(|()| Outcome::Own),
            Request::RestoreBegin(b) => Ok(self.apply_restore_begin(b)),
            Request::RestoreChunk(c) => Ok(self.apply_restore_chunk(c)),
            Request::RestoreCommit(c) => Ok(self.apply_restore_commit(c, events)),
            Request::Tick(_) | Request::LeaderChange(_) => Ok(Outcome::Nothing),
        };
        result.unwrap_or_else(Outcome::Failed)
    }

    /// A put's lease exists. A put on its own checks it before its previous version, a put in
    /// a txn after (etcd's `Put` and `checkRequestPut`).
    fn check_put_lease(&self, flags: PutFlags) -> Result<(), Error> {
        if flags.lease != 0 && !self.state.leases.contains(flags.lease) {
            return Err(Error::LeaseNotFound);
        }
        Ok(())
    }

    /// The previous version `ignore_value` and `ignore_lease` need exists.
    fn check_put_previous(&self, key: &[u8], flags: PutFlags) -> Result<(), Error> {
        if (flags.ignore_value || flags.ignore_lease) && self.state.keys.latest_live(key).is_none()
        {
            return Err(Error::KeyNotFound);
        }
        Ok(())
    }

    /// A plain put of `key` (no lease, no flags) made by the store itself (the catalogue's
    /// records), checked as every put is; the revision it made.
    pub(crate) fn put_internal(
        &mut self,
        key: Vec<u8>,
        value: Vec<u8>,
        events: &mut Vec<Event>,
    ) -> Result<i64, Error> {
        let flags = PutFlags {
            lease: 0,
            prev_kv: false,
            ignore_value: false,
            ignore_lease: false,
        };
        self.apply_put_with(key, value, flags, None, events)?;
        Ok(self.state.revision)
    }

    fn apply_put(&mut self, p: &PutRequest, events: &mut Vec<Event>) -> Result<PutResponse, Error> {
        self.apply_put_with(
            p.key.as_slice(),
            p.value.as_slice(),
            PutFlags::of(p),
            None,
            events,
        )
    }

    /// The checks of a put, then the put in one revision. `key` and `value` are borrowed
    /// (copied into the store) or owned (moved into it): same checks, same result.
    fn apply_put_with<K, V>(
        &mut self,
        key: K,
        value: V,
        flags: PutFlags,
        event_bytes: Option<EventBytes>,
        events: &mut Vec<Event>,
    ) -> Result<PutResponse, Error>
    where
        K: AsRef<[u8]> + Into<Box<[u8]>>,
        V: AsRef<[u8]> + Into<Box<[u8]>>,
    {
        let (k, v) = (key.as_ref(), value.as_ref());
        if self.corrupt() {
            return Err(Error::CorruptAlarm); // every put path comes here
        }
        self.check_not_fenced()?; // and so does this
        validate::put_parts(k, v, flags.lease, flags.ignore_value, flags.ignore_lease)?;
        self.check_space((k.len() + v.len()) as u64 + self.version_charge())?;
        self.check_put_lease(flags)?;
        self.check_put_previous(k, flags)?;
        let mut w = Writer::new(&mut self.state, events, self.emit_events);
        let mut resp = w.put_bytes(key, value, flags, event_bytes);
        resp.header = header(w.finish());
        Ok(resp)
    }

    fn apply_delete_range(
        &mut self,
        d: &DeleteRangeRequest,
        events: &mut Vec<Event>,
    ) -> Result<DeleteRangeResponse, Error> {
        validate::delete_range(d)?;
        let mut w = Writer::new(&mut self.state, events, self.emit_events);
        let mut resp = w.delete_range(d);
        resp.header = header(w.finish());
        Ok(resp)
    }

    fn apply_compact(&mut self, c: &CompactionRequest) -> Result<CompactionResponse, Error> {
        validate::compact(c, self)?;
        self.state.keys.compact(c.revision);
        self.state.compact_revision = c.revision;
        Ok(CompactionResponse {
            header: header(self.state.revision),
        })
    }

    fn apply_lease_grant(
        &mut self,
        index: u64,
        g: &LeaseGrantRequest,
    ) -> Result<LeaseGrantResponse, Error> {
        self.check_space(0)?;
        validate::lease_grant(g, &self.config)?;
        let id = if g.id == 0 {
            self.generate_lease_id(index)
        } else {
            g.id
        };
        if self.state.leases.contains(id) {
            return Err(Error::LeaseExists);
        }
        let quota = self.tenant_quotas().leases;
        if quota > 0 && self.state.leases.len() >= quota.unsigned_abs() as usize {
            return Err(Error::LeaseQuota(quota));
        }
        let ttl = g.ttl.max(self.config.min_lease_ttl_secs);
        let deadline = self.state.time_ms.saturating_add(ttl.saturating_mul(1000));
        self.state.leases.grant(id, ttl, deadline);
        Ok(LeaseGrantResponse {
            header: header(self.state.revision),
            id,
            ttl,
            error: String::new(),
        })
    }

    /// A positive id derived from the journal index (every replica derives the same one),
    /// stepping on while it is taken.
    fn generate_lease_id(&self, index: u64) -> i64 {
        let mut x = index;
        loop {
            x = splitmix64(x);
            let id = (x & (i64::MAX as u64)) as i64;
            if id != 0 && !self.state.leases.contains(id) {
                return id;
            }
        }
    }

    fn apply_lease_revoke(
        &mut self,
        r: &LeaseRevokeRequest,
        events: &mut Vec<Event>,
    ) -> Result<LeaseRevokeResponse, Error> {
        if !self.state.leases.contains(r.id) {
            return Err(Error::LeaseNotFound);
        }
        let rev = self.revoke(r.id, events);
        Ok(LeaseRevokeResponse {
            header: header(rev),
        })
    }

    fn apply_keep_alive(
        &mut self,
        k: &LeaseKeepAliveRequest,
    ) -> Result<LeaseKeepAliveResponse, Error> {
        // An overdue lease waiting for its revoke (more expired at once than an entry revokes)
        // is not renewed: etcd's Renew waits for the revoke and answers "lease not found".
        let Some(lease) = self
            .state
            .leases
            .get(k.id)
            .filter(|l| l.deadline_ms > self.state.time_ms)
        else {
            return Err(Error::LeaseNotFound);
        };
        let ttl = lease.ttl;
        let deadline = self.state.time_ms.saturating_add(ttl.saturating_mul(1000));
        self.state.leases.set_deadline(k.id, deadline);
        Ok(LeaseKeepAliveResponse {
            header: header(self.state.revision),
            id: k.id,
            ttl,
        })
    }

    fn apply_alarm(&mut self, a: &AlarmRequest) -> AlarmResponse {
        let alarms = match AlarmAction::try_from(a.action) {
            Ok(AlarmAction::Get) => self.alarms(),
            Ok(AlarmAction::Activate) => {
                if a.alarm == AlarmType::None as i32 {
                    Vec::new()
                } else {
                    self.state.alarms.insert((a.member_id, a.alarm));
                    vec![AlarmMember {
                        member_id: a.member_id,
                        alarm: a.alarm,
                    }]
                }
            }
            Ok(AlarmAction::Deactivate) => {
                if self.state.alarms.remove(&(a.member_id, a.alarm)) {
                    vec![AlarmMember {
                        member_id: a.member_id,
                        alarm: a.alarm,
                    }]
                } else {
                    Vec::new()
                }
            }
            Err(_) => Vec::new(),
        };
        AlarmResponse {
            header: header(self.state.revision),
            alarms,
        }
    }

    // ---- txn ----

    fn apply_txn(&mut self, t: &TxnRequest, events: &mut Vec<Event>) -> Result<TxnResponse, Error> {
        validate::txn(t, self.config.max_txn_ops)?;
        let cost = txn_put_cost(t, self.version_charge());
        if cost > 0 {
            self.check_space(cost)?;
        }
        let path = self.txn_path(t);
        self.check_txn_ops(t, &path)?;
        let mut w = Writer::new(&mut self.state, events, self.emit_events);
        let mut resp = execute_txn(&mut w, t, &path);
        resp.header = header(w.finish());
        Ok(resp)
    }

    fn txn_path(&self, t: &TxnRequest) -> Path {
        let succeeded = t.compare.iter().all(|c| self.compare(c));
        let ops = if succeeded { &t.success } else { &t.failure };
        let children = ops
            .iter()
            .filter_map(|op| match &op.request {
                Some(request_op::Request::RequestTxn(inner)) => Some(self.txn_path(inner)),
                _ => None,
            })
            .collect();
        Path {
            succeeded,
            children,
        }
    }

    /// etcd's applyCompare against the store as it is (for a txn: the state before it): every
    /// live key of the compare's range must satisfy it; with no key, a value compare fails and
    /// the others compare against zero. Reads no value it does not compare.
    pub fn compare(&self, c: &Compare) -> bool {
        let rev = self.state.revision;
        let mut any = false;
        for (_, v) in self.state.keys.live_in_range(&c.key, &c.range_end, rev) {
            any = true;
            if !compare_version(c, Some(v)) {
                return false;
            }
        }
        if !any {
            if c.target == compare::CompareTarget::Value as i32 {
                return false;
            }
            return compare_version(c, None);
        }
        true
    }

    /// etcd's checkRequests on the chosen branches, against the state before the txn: every
    /// put of the path first (its lease exists; with `ignore_value`/`ignore_lease`, its key),
    /// then every range (its revision is neither compacted nor in the future), so a txn with
    /// both kinds of fault reports etcd's.
    fn check_txn_ops<'t>(&self, t: &'t TxnRequest, path: &Path) -> Result<(), Error> {
        // The deletes met so far, in execution order: a put that needs its key's previous
        // version (`ignore_value`, `ignore_lease`) after a delete that removed the key has none
        // when it runs. etcd's check misses this (its overlap check treats a delete to the end
        // of the keyspace as empty), finds no key when it executes the put, and panics; here
        // the txn is refused as a put without a previous version is.
        let deleted: std::cell::RefCell<Vec<(&'t [u8], &'t [u8])>> = Default::default();
        self.check_txn_path(t, path, &|op| match op {
            request_op::Request::RequestPut(p) => {
                let flags = PutFlags::of(p);
                if (flags.ignore_value || flags.ignore_lease)
                    && deleted.borrow().iter().any(|(key, end)| {
                        bounds(key, end)
                            .is_some_and(|(_, hi)| p.key.as_slice() >= *key && below(&p.key, hi))
                    })
                {
                    return Err(Error::KeyNotFound);
                }
                self.check_put_previous(&p.key, flags)?;
                self.check_put_lease(flags)
            }
            request_op::Request::RequestDeleteRange(d) => {
                deleted.borrow_mut().push((&d.key, &d.range_end));
                Ok(())
            }
            _ => Ok(()),
        })?;
        self.check_txn_path(t, path, &|op| match op {
            request_op::Request::RequestRange(r) => {
                if r.revision > self.state.revision {
                    return Err(Error::FutureRevision);
                }
                if r.revision != 0 && r.revision < self.state.compact_revision {
                    return Err(Error::Compacted);
                }
                Ok(())
            }
            _ => Ok(()),
        })
    }

    /// `check` on every operation of the branches `path` takes, nested txns' in place.
    fn check_txn_path<'t>(
        &self,
        t: &'t TxnRequest,
        path: &Path,
        check: &dyn Fn(&'t request_op::Request) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let ops = if path.succeeded {
            &t.success
        } else {
            &t.failure
        };
        let mut children = path.children.iter();
        for op in ops {
            match &op.request {
                Some(request_op::Request::RequestTxn(inner)) => {
                    if let Some(child) = children.next() {
                        self.check_txn_path(inner, child, check)?;
                    }
                }
                Some(other) => check(other)?,
                None => {}
            }
        }
        Ok(())
    }

    // ---- reads ----

    /// A range read at the request's revision (0 = current).
    pub fn range(&self, req: &RangeRequest) -> Result<RangeResponse, Error> {
        self.range_view(req).map(RangeView::into_response)
    }

    /// `range` answered as a view of the store: the same answer (`RangeView::into_response`
    /// is `range`'s response), or encoded straight into etcd's wire format with the caller's
    /// header (`RangeView::encode_raw`): for a point read, one copy of the key and value into
    /// the caller's buffer and no allocation of the store's own.
    pub fn range_view(&self, req: &RangeRequest) -> Result<RangeView<'_>, Error> {
        validate::range(req)?;
        view_at(&self.state, req, self.state.revision)
    }

    /// `range_view` of each request, in order, with the point reads among them looked up
    /// together (`keyspace::batch`: their cache misses overlap instead of queueing one read
    /// behind another). The same answers as `range_view` request by request.
    pub fn range_views(&self, reqs: &[RangeRequest]) -> Vec<Result<RangeView<'_>, Error>> {
        let state = &self.state;
        let cur = state.revision;
        let is_point = |r: &RangeRequest| r.range_end.is_empty() && !r.key.is_empty();
        let keys: Vec<&[u8]> = reqs
            .iter()
            .filter(|r| is_point(r))
            .map(|r| r.key.as_slice())
            .collect();
        let mut slots = Vec::with_capacity(keys.len());
        state.keys.get_slots(&keys, &mut slots);
        let mut slots = slots.into_iter();
        reqs.iter()
            .map(|req| {
                if !is_point(req) {
                    return self.range_view(req);
                }
                let slot = slots.next().flatten();
                let rev = read_revision(state, req, cur)?;
                Ok(point_view(req, cur, rev, slot))
            })
            .collect()
    }

    /// Events with mod revision >= `from_rev` for keys in the range, oldest first; see the
    /// crate docs. `from_rev` may be the compact revision itself, as in etcd: each key's newest
    /// change there is kept (a delete's tombstone too, until a later compaction), without its
    /// previous value.
    pub fn events(
        &self,
        from_rev: i64,
        key: &[u8],
        range_end: &[u8],
        max: usize,
    ) -> Result<Vec<Event>, Error> {
        if from_rev < self.state.compact_revision {
            return Err(Error::Compacted);
        }
        let ks = &self.state.keys;
        let Some((_, end)) = bounds(key, range_end) else {
            return Ok(Vec::new());
        };
        let few: Vec<(&[u8], &[Version])> = ks
            .iter_range(key, range_end)
            .take(EVENTS_FEW_KEYS + 1)
            .collect();
        if few.len() <= EVENTS_FEW_KEYS {
            // Few keys: merge their own histories from `from_rev` in (revision, sub) order.
            let mut heap = BinaryHeap::with_capacity(few.len());
            for (i, (_, vs)) in few.iter().enumerate() {
                let j = vs.partition_point(|v| v.main < from_rev);
                if let Some(v) = vs.get(j) {
                    heap.push(Reverse((v.main, v.sub, i, j)));
                }
            }
            let changes = std::iter::from_fn(|| {
                let Reverse((_, _, i, j)) = heap.pop()?;
                let (k, vs) = few[i];
                if let Some(v) = vs.get(j + 1) {
                    heap.push(Reverse((v.main, v.sub, i, j + 1)));
                }
                Some((k, &vs[j], vs))
            });
            return Ok(cut_events(changes, max));
        }
        // Many keys: walk the change log from `from_rev`, keeping the changes in the range.
        let changes = ks.changes_from(from_rev).filter_map(|c| {
            let slot = ks.slot(c.slot);
            if &slot.key[..] < key || !below(&slot.key, end) {
                return None;
            }
            let vs = &slot.versions[..];
            let j = vs.partition_point(|v| (v.main, v.sub) < (c.main, c.sub));
            Some((&slot.key[..], &vs[j], vs))
        });
        Ok(cut_events(changes, max))
    }

    /// Whether lease `id` exists (granted, neither revoked nor expired by an applied entry).
    pub fn has_lease(&self, id: i64) -> bool {
        self.state.leases.get(id).is_some()
    }

    /// Remaining TTL (whole seconds, truncated, as etcd) against `time_ms()`.
    pub fn lease_time_to_live(
        &self,
        id: i64,
        keys: bool,
    ) -> Result<LeaseTimeToLiveResponse, Error> {
        let lease = self.state.leases.get(id).ok_or(Error::LeaseNotFound)?;
        // etcd truncates the time left, measured some time after the last keep-alive: right
        // after one it answers TTL - 1. The store's clock is the last entry's stamp, so the time
        // left is counted from a millisecond after it (the lease is gone at 0). An overdue lease
        // still waiting for its revoke answers what etcd's does: the time past, negative, in
        // whole seconds towards zero.
        let remaining_ms = lease.deadline_ms - self.state.time_ms - 1;
        Ok(LeaseTimeToLiveResponse {
            header: header(self.state.revision),
            id,
            ttl: remaining_ms / 1000,
            granted_ttl: lease.ttl,
            keys: if keys {
                lease.keys.iter().map(|k| k.to_vec()).collect()
            } else {
                Vec::new()
            },
        })
    }

    pub fn lease_leases(&self) -> LeaseLeasesResponse {
        LeaseLeasesResponse {
            header: header(self.state.revision),
            leases: self
                .state
                .leases
                .leases
                .keys()
                .map(|&id| LeaseStatus { id })
                .collect(),
        }
    }

    /// A crc32c over every stored version with mod revision <= `revision` (0 = current), in
    /// key then revision order: equal on every replica that applied the same entries.
    pub fn hash_kv(&self, revision: i64) -> Result<HashKv, Error> {
        let mut scan = self.hash_kv_scan(revision)?;
        scan.step(self, StepBudget::UNLIMITED)?;
        Ok(scan.finish())
    }
}

/// Ranges with at most this many keys replay events from the keys' own histories (a merge);
/// wider ones walk the revision-ordered change log.
const EVENTS_FEW_KEYS: usize = 64;

/// One change for `events`: the key, the version written, and all versions of the key.
type Change<'a> = (&'a [u8], &'a Version, &'a [Version]);

/// Turns changes in (revision, sub) order into events, at most `max` of them but never part
/// of a revision (a first revision larger than `max` comes whole). Stops reading `changes` as
/// soon as the answer is known.
fn cut_events<'a>(changes: impl Iterator<Item = Change<'a>>, max: usize) -> Vec<Event> {
    let mut out = Vec::new();
    let mut group: Vec<Change<'a>> = Vec::new();
    let mut changes = changes.peekable();
    while let Some(first) = changes.next() {
        let main = first.1.main;
        group.clear();
        group.push(first);
        loop {
            if !out.is_empty() && out.len() + group.len() > max {
                return out;
            }
            match changes.next_if(|c| c.1.main == main) {
                Some(c) => group.push(c),
                None => break,
            }
        }
        out.extend(group.iter().map(|&(k, v, vs)| event_of(k, v, vs)));
        if out.len() >= max {
            break;
        }
    }
    out
}

/// The watch event of version `v` of key `k`; prev_kv is the key at `v.main - 1`.
fn event_of(k: &[u8], v: &Version, vs: &[Version]) -> Event {
    let prev_kv = live_at(vs, v.main - 1).map(|p| p.to_kv(k, false));
    if v.is_tombstone() {
        Event {
            r#type: EventType::Delete as i32,
            kv: Some(KeyValue {
                key: k.to_vec(),
                mod_revision: v.main,
                ..Default::default()
            }),
            prev_kv,
        }
    } else {
        Event {
            r#type: EventType::Put as i32,
            kv: Some(v.to_kv(k, false)),
            prev_kv,
        }
    }
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Bytes of keys and values a txn may put (both branches, nested included): an upper bound.
fn txn_put_cost(t: &TxnRequest, version_charge: u64) -> u64 {
    t.success
        .iter()
        .chain(t.failure.iter())
        .map(|op| match &op.request {
            Some(request_op::Request::RequestPut(p)) => {
                (p.key.len() + p.value.len()).max(1) as u64 + version_charge
            }
            Some(request_op::Request::RequestTxn(inner)) => txn_put_cost(inner, version_charge),
            _ => 0,
        })
        .sum()
}

/// etcd's compareKV; `None` is a missing key (all zero).
fn compare_version(c: &Compare, v: Option<&Version>) -> bool {
    use compare::{CompareResult, CompareTarget, TargetUnion};
    let ord = match CompareTarget::try_from(c.target) {
        Ok(CompareTarget::Value) => {
            let want: &[u8] = match &c.target_union {
                Some(TargetUnion::Value(x)) => x,
                _ => &[],
            };
            let have: &[u8] = v.map_or(&[], |v| &v.value);
            have.cmp(want)
        }
        Ok(target) => {
            let (have, want) = match target {
                CompareTarget::Version => (
                    v.map_or(0, |v| v.version),
                    match c.target_union {
                        Some(TargetUnion::Version(x)) => x,
                        _ => 0,
                    },
                ),
                CompareTarget::Create => (
                    v.map_or(0, |v| v.create),
                    match c.target_union {
                        Some(TargetUnion::CreateRevision(x)) => x,
                        _ => 0,
                    },
                ),
                CompareTarget::Mod => (
                    v.map_or(0, |v| v.main),
                    match c.target_union {
                        Some(TargetUnion::ModRevision(x)) => x,
                        _ => 0,
                    },
                ),
                CompareTarget::Lease | CompareTarget::Value => (
                    v.map_or(0, |v| v.lease),
                    match c.target_union {
                        Some(TargetUnion::Lease(x)) => x,
                        _ => 0,
                    },
                ),
            };
            have.cmp(&want)
        }
        // An unknown target compares nothing: etcd's switch falls through with result 0.
        Err(_) => std::cmp::Ordering::Equal,
    };
    match CompareResult::try_from(c.result) {
        Ok(CompareResult::Equal) => ord.is_eq(),
        Ok(CompareResult::NotEqual) => ord.is_ne(),
        Ok(CompareResult::Greater) => ord.is_gt(),
        Ok(CompareResult::Less) => ord.is_lt(),
        Err(_) => true,
    }
}

fn execute_txn(w: &mut Writer<'_>, t: &TxnRequest, path: &Path) -> TxnResponse {
    let ops: &[RequestOp] = if path.succeeded {
        &t.success
    } else {
        &t.failure
    };
    let mut children = path.children.iter();
    let mut responses = Vec::with_capacity(ops.len());
    for op in ops {
        let response = match &op.request {
            Some(request_op::Request::RequestRange(r)) => {
                let cur = w.read_rev();
                // Checked before execution (check_txn_ops): cannot fail here.
                let resp = range_at(w.state, r, cur).unwrap_or_else(|_| RangeResponse {
                    header: header(cur),
                    ..Default::default()
                });
                Some(response_op::Response::ResponseRange(resp))
            }
            Some(request_op::Request::RequestPut(p)) => {
                Some(response_op::Response::ResponsePut(w.put(p)))
            }
            Some(request_op::Request::RequestDeleteRange(d)) => Some(
                response_op::Response::ResponseDeleteRange(w.delete_range(d)),
            ),
            Some(request_op::Request::RequestTxn(inner)) => {
                let resp = match children.next() {
                    Some(child) => execute_txn(w, inner, child),
                    None => TxnResponse::default(),
                };
                Some(response_op::Response::ResponseTxn(resp))
            }
            None => None,
        };
        responses.push(ResponseOp { response });
    }
    TxnResponse {
        header: Some(ResponseHeader::default()),
        succeeded: path.succeeded,
        responses,
    }
}

/// etcd's Range apply (mvcc rangeKeys + the server's filters, sort and limit) at store
/// revision `cur`.
pub(crate) fn range_at(
    state: &State,
    req: &RangeRequest,
    cur: i64,
) -> Result<RangeResponse, Error> {
    view_at(state, req, cur).map(RangeView::into_response)
}

/// `range_at` as a view: a point read borrows its key-value from the store (one hash probe,
/// nothing built), any other range is scanned into a response.
fn view_at<'a>(state: &'a State, req: &RangeRequest, cur: i64) -> Result<RangeView<'a>, Error> {
    let rev = read_revision(state, req, cur)?;
    // Point read: no scan.
    if req.range_end.is_empty() {
        return Ok(point_view(req, cur, rev, state.keys.get_slot(&req.key)));
    }
    let mut scan = RangeScan::new(req.clone(), cur, rev);
    scan.step_state(state, StepBudget::UNLIMITED)?;
    Ok(RangeView::owned(cur, scan.into_response()))
}

/// A point read's answer at revision `rev` (checked) of store revision `cur`, from the slot of
/// its key (None: the key has no version).
fn point_view<'a>(req: &RangeRequest, cur: i64, rev: i64, slot: Option<&'a Slot>) -> RangeView<'a> {
    let found = slot.and_then(|s| live_at(&s.versions, rev).map(|v| (&s.key[..], v)));
    let count = i64::from(found.is_some());
    let kv = found.filter(|(_, v)| !req.count_only && passes_filters(req, v));
    RangeView::point(cur, kv, req.keys_only, count)
}

/// The revision a read of `req` reads at, or its error (`view_at`'s checks).
pub(crate) fn read_revision(state: &State, req: &RangeRequest, cur: i64) -> Result<i64, Error> {
    if req.revision > cur {
        return Err(Error::FutureRevision);
    }
    let rev = if req.revision <= 0 { cur } else { req.revision };
    if rev < state.compact_revision {
        return Err(Error::Compacted);
    }
    Ok(rev)
}

pub(crate) fn passes_filters(req: &RangeRequest, v: &Version) -> bool {
    !(req.max_mod_revision != 0 && v.main > req.max_mod_revision
        || req.min_mod_revision != 0 && v.main < req.min_mod_revision
        || req.max_create_revision != 0 && v.create > req.max_create_revision
        || req.min_create_revision != 0 && v.create < req.min_create_revision)
}
