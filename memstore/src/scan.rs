//! `RangeScan`: a Range over a key range read in bounded steps, so that a caller holding the
//! store behind a lock can let writes apply between the steps.
//!
//! Why: a Range over a large prefix (a Kubernetes LIST of every pod, a `count_only` over a
//! whole resource) reads and copies every key in it; in one go that holds the store for a
//! second or more per million keys, and every write of the tenant waits that long to apply.
//! etcd serves such reads from a read transaction that writers do not wait for.
//!
//! A scan fixes the revision it reads at when it begins (the store's revision, or the
//! request's) and reads the keys in order, at most a step's budget at a time, resuming at the
//! first key it has not read. The MVCC history makes that exact: whatever applies between two
//! steps has a higher revision, which the scan does not see, and the keys it adds or removes
//! are found (or not) in key order as any key would be. The one thing that can break a scan is
//! a compaction past its revision between two steps: the step then fails with
//! [`Error::Compacted`], as the Range would have had it arrived after the compaction. A caller
//! reading at the current revision can begin again (a later revision is just as linearizable).
//!
//! A scan run in one unlimited step is `MemStore::range` itself: both are this code. The same
//! goes for `HashScan` and `MemStore::hash_kv`.

use api::etcdserverpb::{RangeRequest, RangeResponse, ResponseHeader, range_request};
use api::mvccpb::KeyValue;

use crate::etcd_db::{RevisionKey, encode_kv};
use crate::keyspace::{CountWalk, Version, live_at};
use crate::store::{State, passes_filters};
use crate::{Error, HashKv, MemStore};

use range_request::{SortOrder, SortTarget};

/// How much one step of a scan may read before it hands the store back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepBudget {
    /// Keys visited (live or not, copied or only counted); also the changes a count from the
    /// key space's live counts looks at in a step (`CountWalk`).
    pub keys: usize,
    /// Bytes of keys and values copied into the answer.
    pub bytes: usize,
}

impl StepBudget {
    /// The whole range in one step.
    pub const UNLIMITED: StepBudget = StepBudget {
        keys: usize::MAX,
        bytes: usize::MAX,
    };
}

/// A Range being read step by step; see the module docs.
#[derive(Debug)]
pub struct RangeScan {
    /// The request, its `key` moved to the first key not yet read.
    req: RangeRequest,
    /// The store's revision when the scan began: the answer's header revision.
    header_revision: i64,
    /// The revision read at.
    rev: i64,
    order: SortOrder,
    target: SortTarget,
    filtered: bool,
    /// Matching keys kept at most (etcd fetches `limit + 1` to learn `more`).
    fetch_limit: usize,
    /// Keep values even for `keys_only` (a sort by value needs them; dropped at the end).
    copy_values: bool,
    count: i64,
    counting: Counting,
    hits: Vec<KeyValue>,
    /// Every key the answer needs has been read (the count may still be walking).
    keys_done: bool,
    done: bool,
}

/// How a scan learns its count.
#[derive(Debug)]
enum Counting {
    /// A range that keeps only its first matches: decided at the first step.
    Undecided,
    /// Key by key as the scan reads them (a sort or a filter reads every key anyway).
    ByKeys,
    /// From the key space's live counts and the changes since the scan's revision, walked a
    /// step at a time beside the reading of the first matches.
    Walking(Box<CountWalk>),
    /// Known: `count` is the whole range's, so the scan stops at `fetch_limit` matches.
    Known,
}

/// Changes since a scan's revision that counting from the live counts may always look at;
/// beyond this, only as many as the range's live keys (each change looked at costs about what
/// a key read does, so counting key by key is then as cheap).
const MIN_COUNT_CHANGES: usize = 4_096;

impl MemStore {
    /// Begins a step-by-step Range (checked as `range` checks it); read it with
    /// [`RangeScan::step`] against this store, with any entries applied between the steps.
    pub fn range_scan(&self, req: &RangeRequest) -> Result<RangeScan, Error> {
        crate::validate::range(req)?;
        let state = &self.state;
        let rev = crate::store::read_revision(state, req, state.revision)?;
        Ok(RangeScan::new(req.clone(), state.revision, rev))
    }
}

impl RangeScan {
    pub(crate) fn new(req: RangeRequest, header_revision: i64, rev: i64) -> RangeScan {
        let order = SortOrder::try_from(req.sort_order).unwrap_or(SortOrder::None);
        let target = SortTarget::try_from(req.sort_target).unwrap_or(SortTarget::Key);
        let filtered = req.min_mod_revision != 0
            || req.max_mod_revision != 0
            || req.min_create_revision != 0
            || req.max_create_revision != 0;
        // etcd fetches limit + 1 to learn `more` unless it must sort or filter first.
        let fetch_limit = if req.count_only {
            0
        } else if req.limit > 0 && order == SortOrder::None && !filtered {
            (req.limit + 1) as usize
        } else {
            usize::MAX
        };
        // Keys ascending is the order the keys are read in; a target without an order is
        // sorted ascending (etcd's rule).
        let order = match (target, order) {
            (SortTarget::Key, SortOrder::Ascend) => SortOrder::None,
            (t, SortOrder::None) if t != SortTarget::Key => SortOrder::Ascend,
            (_, o) => o,
        };
        let copy_values =
            !req.keys_only || (order != SortOrder::None && target == SortTarget::Value);
        RangeScan {
            req,
            header_revision,
            rev,
            order,
            target,
            filtered,
            fetch_limit,
            copy_values,
            count: 0,
            counting: if fetch_limit == usize::MAX {
                Counting::ByKeys
            } else {
                Counting::Undecided
            },
            hits: Vec::new(),
            keys_done: false,
            done: false,
        }
    }

    /// The answer's header revision: the store's revision when the scan began.
    pub fn revision(&self) -> i64 {
        self.header_revision
    }

    /// Reads on from where the last step stopped, within `budget`; `Ok(true)` once the range
    /// has been read whole. Fails with [`Error::Compacted`] if `store` has been compacted past
    /// the scan's revision (the scan cannot go on; nothing else about it changed).
    pub fn step(&mut self, store: &MemStore, budget: StepBudget) -> Result<bool, Error> {
        self.step_state(&store.state, budget)
    }

    pub(crate) fn step_state(&mut self, state: &State, budget: StepBudget) -> Result<bool, Error> {
        if self.done {
            return Ok(true);
        }
        if self.rev < state.compact_revision {
            return Err(Error::Compacted);
        }
        // A range that keeps only its first matches (a limit without a sort or filter, or a
        // count only) need not read past them when the count comes from the live counts.
        if matches!(self.counting, Counting::Undecided) {
            let ks = &state.keys;
            let walk = ks.count_walk(&self.req.key, &self.req.range_end, self.rev);
            let changes = ks.changes_since(self.rev);
            self.counting = if changes <= MIN_COUNT_CHANGES.max(walk.at_head() as usize) {
                Counting::Walking(Box::new(walk))
            } else {
                Counting::ByKeys
            };
        }
        if let Counting::Walking(walk) = &mut self.counting
            && let Some(n) = walk.step(&state.keys, budget.keys)
        {
            self.count = n as i64;
            self.counting = Counting::Known;
        }
        if !self.keys_done {
            self.read_keys(state, budget);
        }
        self.done = self.keys_done && !matches!(self.counting, Counting::Walking(_));
        Ok(self.done)
    }

    /// Reads keys on from where the last step stopped, within `budget`.
    fn read_keys(&mut self, state: &State, budget: StepBudget) {
        let by_keys = matches!(self.counting, Counting::ByKeys);
        let (mut keys, mut bytes) = (0usize, 0usize);
        let mut resume = None;
        for (k, vs) in state.keys.iter_range(&self.req.key, &self.req.range_end) {
            if !by_keys && self.hits.len() >= self.fetch_limit {
                break;
            }
            // At least one key a step, so that every step makes progress.
            if keys > 0 && (keys >= budget.keys || bytes >= budget.bytes) {
                resume = Some(k.to_vec());
                break;
            }
            keys += 1;
            let Some(v) = live_at(vs, self.rev) else {
                continue;
            };
            if by_keys {
                self.count += 1;
            }
            if self.hits.len() < self.fetch_limit
                && (!self.filtered || passes_filters(&self.req, v))
            {
                let value: &[u8] = if self.copy_values { &v.value } else { &[] };
                bytes += k.len() + value.len();
                self.hits.push(v.kv_with(k.to_vec(), value.to_vec()));
                trim(&mut self.hits, self.order, self.target, self.req.limit);
            }
        }
        match resume {
            Some(k) => self.req.key = k,
            None => self.keys_done = true,
        }
    }

    /// The Range's answer (header: the revision only). Call once [`step`](Self::step) has
    /// answered `true`.
    pub fn into_response(mut self) -> RangeResponse {
        debug_assert!(self.done, "a range scan answered before it was read whole");
        sort(&mut self.hits, self.order, self.target);
        let mut more = false;
        if self.req.limit > 0 && self.hits.len() > self.req.limit as usize {
            self.hits.truncate(self.req.limit as usize);
            more = true;
        }
        if self.req.keys_only && self.copy_values {
            for kv in &mut self.hits {
                kv.value = Vec::new();
            }
        }
        RangeResponse {
            header: Some(ResponseHeader {
                revision: self.header_revision,
                ..Default::default()
            }),
            kvs: self.hits,
            more,
            count: self.count,
        }
    }
}

/// `MemStore::hash_kv` read in steps, as [`RangeScan`] reads a Range. The hash is etcd's
/// (`mvcc/kvstore.go`, `hashByRev`): a CRC-32C of the bucket name `key`, then of each version
/// etcd's backend holds at or below the hashed revision `rev`, in revision order, as its
/// revision key and its encoded `mvccpb.KeyValue` (the bytes `etcd_db` writes). Of the versions
/// at or below the compact revision, etcd counts only those a compaction at `rev` would keep
/// (each key's newest version at or below `rev`, unless a tombstone), or, when no key is live at
/// `rev`, those its compaction kept (each key's newest at or below the compact revision, unless
/// a tombstone). So a Strata tenant and an etcd holding the same history answer HashKV alike
/// (an etcd restored from the tenant's snapshot, say).
///
/// The steps: the keys in key order, collecting their versions at or below the compact
/// revision that count (none when never compacted); those, sorted, in revision order; then
/// the change log's versions above the compact revision up to `rev`. Entries applied between
/// two steps add only versions above `rev`, which the hash leaves out; a compaction in
/// between (at any revision) drops versions the hash counts, so the next step fails with
/// [`Error::Compacted`] and the hash must begin again.
#[derive(Debug)]
pub struct HashScan {
    rev: i64,
    compact_revision: i64,
    header_revision: i64,
    hash: u32,
    phase: HashPhase,
    /// The encoded KeyValue being hashed (reused).
    buf: Vec<u8>,
}

#[derive(Debug)]
enum HashPhase {
    /// Walking the keys from `next` (None: the first) for their versions at or below the
    /// compact revision that count.
    Kept {
        next: Option<Vec<u8>>,
        found: Vec<Kept>,
        any_live: bool,
    },
    /// Hashing those, sorted by revision, from `at`.
    HashKept {
        found: Vec<Kept>,
        at: usize,
    },
    /// Hashing the logged versions from revision `from` up to `rev`.
    Logged {
        from: (i64, u32),
    },
    Done,
}

/// A version at or below the compact revision that a hash may count: the newest of its key
/// there, not a tombstone; `newest_at_rev` when no later version of the key is at or below the
/// hashed revision (etcd's `keep` of that revision holds it).
#[derive(Debug, Clone, Copy)]
struct Kept {
    main: i64,
    sub: u32,
    slot: u32,
    newest_at_rev: bool,
}

impl MemStore {
    /// Begins a step-by-step `hash_kv` of `revision` (0: the current one), checked as
    /// `hash_kv` checks it.
    pub fn hash_kv_scan(&self, revision: i64) -> Result<HashScan, Error> {
        let state = &self.state;
        let rev = if revision <= 0 {
            state.revision
        } else {
            revision
        };
        if rev > state.revision {
            return Err(Error::FutureRevision);
        }
        if rev < state.compact_revision {
            return Err(Error::Compacted);
        }
        let phase = if state.compact_revision > 0 {
            HashPhase::Kept {
                next: None,
                found: Vec::new(),
                any_live: false,
            }
        } else {
            HashPhase::Logged { from: (0, 0) }
        };
        Ok(HashScan {
            rev,
            compact_revision: state.compact_revision,
            header_revision: state.revision,
            hash: crc32c::crc32c(b"key"),
            phase,
            buf: Vec::new(),
        })
    }
}

impl HashScan {
    /// The store's revision when the hash began.
    pub fn revision(&self) -> i64 {
        self.header_revision
    }

    /// Hashes on from where the last step stopped, within `budget` (at least one key or
    /// version); `Ok(true)` once every version is hashed. Fails with [`Error::Compacted`] if
    /// `store` was compacted since the hash began.
    pub fn step(&mut self, store: &MemStore, budget: StepBudget) -> Result<bool, Error> {
        let state = &store.state;
        if matches!(self.phase, HashPhase::Done) {
            return Ok(true);
        }
        if state.compact_revision != self.compact_revision {
            return Err(Error::Compacted);
        }
        let ks = &state.keys;
        let (mut n, mut bytes) = (0usize, 0usize);
        let spent = |n: usize, bytes: usize| n > 0 && (n >= budget.keys || bytes >= budget.bytes);
        let (rev, compact) = (self.rev, self.compact_revision);
        let (phase, hash, buf) = (&mut self.phase, &mut self.hash, &mut self.buf);
        loop {
            match phase {
                HashPhase::Kept {
                    next,
                    found,
                    any_live,
                } => {
                    let mut resume = None;
                    for (id, slot) in ks.slots_from(next.as_deref()) {
                        if spent(n, bytes) {
                            resume = Some(slot.key.to_vec());
                            break;
                        }
                        n += 1;
                        let vs = &slot.versions[..];
                        let at_rev = vs.partition_point(|v| v.main <= rev);
                        let at_compact = vs.partition_point(|v| v.main <= compact);
                        *any_live |= at_rev > 0 && !vs[at_rev - 1].is_tombstone();
                        if at_compact > 0 && !vs[at_compact - 1].is_tombstone() {
                            let v = &vs[at_compact - 1];
                            found.push(Kept {
                                main: v.main,
                                sub: v.sub,
                                slot: id,
                                newest_at_rev: at_rev == at_compact,
                            });
                        }
                    }
                    if resume.is_some() {
                        *next = resume;
                        return Ok(false);
                    }
                    let mut found = std::mem::take(found);
                    if *any_live {
                        found.retain(|k| k.newest_at_rev);
                    }
                    found.sort_unstable_by_key(|k| (k.main, k.sub));
                    *phase = HashPhase::HashKept { found, at: 0 };
                }
                HashPhase::HashKept { found, at } => {
                    while let Some(k) = found.get(*at) {
                        if spent(n, bytes) {
                            return Ok(false);
                        }
                        let slot = ks.slot(k.slot);
                        if let Some(v) = version_of(&slot.versions, k.main, k.sub) {
                            bytes += hash_version(hash, buf, &slot.key, v);
                        }
                        n += 1;
                        *at += 1;
                    }
                    *phase = HashPhase::Logged {
                        from: (compact + 1, 0),
                    };
                }
                HashPhase::Logged { from } => {
                    let mut stopped = None;
                    for c in ks.changes_at_or_after(*from) {
                        if c.main > rev {
                            break;
                        }
                        if spent(n, bytes) {
                            stopped = Some((c.main, c.sub));
                            break;
                        }
                        let slot = ks.slot(c.slot);
                        if let Some(v) = version_of(&slot.versions, c.main, c.sub) {
                            bytes += hash_version(hash, buf, &slot.key, v);
                        }
                        n += 1;
                    }
                    match stopped {
                        Some(at) => {
                            *phase = HashPhase::Logged { from: at };
                            return Ok(false);
                        }
                        None => {
                            *phase = HashPhase::Done;
                            return Ok(true);
                        }
                    }
                }
                HashPhase::Done => return Ok(true),
            }
        }
    }

    /// The hash (call once [`step`](Self::step) has answered `true`).
    pub fn finish(self) -> HashKv {
        debug_assert!(
            matches!(self.phase, HashPhase::Done),
            "a hash answered before every version was hashed"
        );
        HashKv {
            hash: self.hash,
            compact_revision: self.compact_revision,
            hash_revision: self.rev,
        }
    }
}

/// Adds version `v` of `key` to `hash` as etcd's backend holds it (`buf`: scratch); the bytes
/// hashed.
fn hash_version(hash: &mut u32, buf: &mut Vec<u8>, key: &[u8], v: &Version) -> usize {
    let rev_key = RevisionKey::new(v.main, v.sub, v.is_tombstone());
    buf.clear();
    encode_kv(key, v, buf);
    *hash = crc32c::crc32c_append(*hash, &rev_key);
    *hash = crc32c::crc32c_append(*hash, buf);
    rev_key.len() + buf.len()
}

/// The version of `versions` written at (`main`, `sub`).
fn version_of(versions: &[Version], main: i64, sub: u32) -> Option<&Version> {
    versions
        .binary_search_by_key(&(main, sub), |v| (v.main, v.sub))
        .ok()
        .map(|i| &versions[i])
}

/// A sorted range with a limit keeps only the `limit + 1` first in its order, sorting whenever
/// it holds twice that (a stable sort of the kept ones, in key order, followed by later keys:
/// ties come out in key order, as one sort of every key would give them).
fn trim(hits: &mut Vec<KeyValue>, order: SortOrder, target: SortTarget, limit: i64) {
    if order == SortOrder::None || limit <= 0 {
        return;
    }
    let keep = limit as usize + 1;
    if hits.len() >= 2 * keep.max(512) {
        sort(hits, order, target);
        hits.truncate(keep);
    }
}

fn sort(hits: &mut [KeyValue], order: SortOrder, target: SortTarget) {
    let cmp = |a: &KeyValue, b: &KeyValue| match target {
        SortTarget::Key => a.key.cmp(&b.key),
        SortTarget::Version => a.version.cmp(&b.version),
        SortTarget::Create => a.create_revision.cmp(&b.create_revision),
        SortTarget::Mod => a.mod_revision.cmp(&b.mod_revision),
        SortTarget::Value => a.value.cmp(&b.value),
    };
    match order {
        SortOrder::None => {}
        SortOrder::Descend => hits.sort_by(|a, b| cmp(b, a)),
        SortOrder::Ascend => hits.sort_by(cmp),
    }
}

#[cfg(test)]
mod tests {
    use api::etcdserverpb::PutRequest;
    use api::strata::entry::{Entry, entry::Request};

    use super::*;

    /// Applies `request` as the entry at `index`.
    fn apply(store: &mut MemStore, index: u64, request: Request) {
        let entry = Entry {
            format_version: 1,
            tenant: "t".into(),
            request: Some(request),
            ..Default::default()
        };
        store.apply(index, &entry);
    }

    fn put(key: Vec<u8>, value: Vec<u8>) -> Request {
        Request::Put(PutRequest {
            key,
            value,
            ..Default::default()
        })
    }

    /// `n` keys whose values repeat every 7 keys (ties for a sort by value).
    fn store_of(n: usize) -> MemStore {
        let mut s = MemStore::new(crate::Config::default());
        for i in 0..n {
            let key = format!("k{i:05}").into_bytes();
            apply(&mut s, i as u64 + 1, put(key, vec![b'v', (i % 7) as u8]));
        }
        s
    }

    /// A sorted range with a limit holds at most about twice `limit + 1` matches at any step,
    /// whatever the step's size, and still answers one stable sort of every key cut at the
    /// limit.
    #[test]
    fn a_sorted_limited_scan_stays_small_and_answers_one_sort() {
        const KEYS: usize = 3_000;
        let store = store_of(KEYS);
        let all = |req: &RangeRequest| RangeRequest {
            sort_order: 0,
            sort_target: 0,
            limit: 0,
            ..req.clone()
        };
        for (target, order) in [
            (SortTarget::Value, SortOrder::Descend),
            (SortTarget::Value, SortOrder::Ascend),
            (SortTarget::Mod, SortOrder::Descend),
        ] {
            for limit in [1i64, 10, 700] {
                let req = RangeRequest {
                    key: b"k".to_vec(),
                    range_end: b"l".to_vec(),
                    sort_target: target as i32,
                    sort_order: order as i32,
                    limit,
                    ..Default::default()
                };
                let mut want = store.range(&all(&req)).unwrap().kvs;
                assert_eq!(want.len(), KEYS);
                let by = |kv: &KeyValue| match target {
                    SortTarget::Value => (kv.value.clone(), 0),
                    _ => (Vec::new(), kv.mod_revision),
                };
                match order {
                    SortOrder::Descend => want.sort_by_key(|kv| std::cmp::Reverse(by(kv))),
                    _ => want.sort_by_key(by),
                }
                want.truncate(limit as usize);
                for keys in [1, 7, 1_000, usize::MAX] {
                    let mut scan = store.range_scan(&req).unwrap();
                    let budget = StepBudget {
                        keys,
                        bytes: usize::MAX,
                    };
                    while !scan.step(&store, budget).unwrap() {
                        assert!(scan.hits.len() <= 2 * (limit as usize + 1).max(512));
                    }
                    let resp = scan.into_response();
                    assert_eq!(resp.count, KEYS as i64);
                    assert!(resp.more);
                    assert_eq!(
                        resp.kvs, want,
                        "{target:?} {order:?} limit {limit}, {keys} a step"
                    );
                }
            }
        }
    }

    /// A range that keeps only its first matches (a limit without a sort, a count only) takes
    /// its count from the key space's live counts and stops reading once it has its matches: at
    /// the head at once; at an older revision by walking the changes since, a step's budget at
    /// a time, even with a compaction (at or below its revision) in between; with more changes
    /// since than the range has keys, key by key. Always the answer `range` gives.
    #[test]
    fn a_limited_range_counts_from_the_live_counts_and_stops_early() {
        let mut store = store_of(3_000);
        let at = store.revision();
        // 5,000 overwrites and 100 deletes after `at`.
        for i in 0..5_100usize {
            let key = format!("k{:05}", i % 3_000).into_bytes();
            let request = if i < 5_000 {
                put(key, b"later".to_vec())
            } else {
                Request::DeleteRange(api::etcdserverpb::DeleteRangeRequest {
                    key,
                    ..Default::default()
                })
            };
            apply(&mut store, 10_000 + i as u64, request);
        }
        let few = StepBudget {
            keys: 20,
            bytes: usize::MAX,
        };
        // (revision, its count, how the first step counts): at the head nothing changed since;
        // 1,100 changes since `at + 4000` walked 20 a step; 5,100 since `at`, more than the
        // range's 2,900 live keys and than 4,096.
        let cases = [
            (0, 2_900, "known"),
            (at + 4_000, 3_000, "walking"),
            (at, 3_000, "by keys"),
        ];
        for (revision, count, first) in cases {
            for (limit, count_only) in [(10, false), (0, true)] {
                let req = RangeRequest {
                    key: b"k".to_vec(),
                    range_end: b"l".to_vec(),
                    revision,
                    limit,
                    count_only,
                    ..Default::default()
                };
                let mut scan = store.range_scan(&req).unwrap();
                let done = scan.step(&store, few).unwrap();
                let counting = match scan.counting {
                    Counting::Known => "known",
                    Counting::Walking(_) => "walking",
                    Counting::ByKeys => "by keys",
                    Counting::Undecided => "undecided",
                };
                assert_eq!((done, counting), (first == "known", first), "at {revision}");
                if first == "walking" {
                    // The first matches were read at once; only the count goes on.
                    assert!(scan.keys_done);
                }
                while !scan.step(&store, few).unwrap() {}
                let resp = scan.into_response();
                assert_eq!(resp.count, count);
                assert_eq!(resp.kvs.len(), limit as usize);
                assert_eq!(resp.more, limit > 0);
                let whole = store.range(&req).unwrap();
                assert_eq!((whole.count, whole.kvs), (resp.count, resp.kvs));
            }
        }
        // A compaction at or below the walk's revision, between two of its steps, changes
        // nothing it counts.
        let req = RangeRequest {
            key: b"k".to_vec(),
            range_end: b"l".to_vec(),
            revision: at + 4_000,
            count_only: true,
            ..Default::default()
        };
        let mut scan = store.range_scan(&req).unwrap();
        assert!(!scan.step(&store, few).unwrap());
        let compaction = api::etcdserverpb::CompactionRequest {
            revision: at + 3_000,
            physical: true,
        };
        apply(&mut store, 20_000, Request::Compact(compaction));
        while !scan.step(&store, few).unwrap() {}
        assert_eq!(scan.into_response().count, 3_000);
        assert_eq!(store.range(&req).unwrap().count, 3_000);
    }

    /// A limited range inside a txn, after the txn's own deletes (already in the live counts,
    /// at a revision the store has not reached yet), counts the revision it reads at: found by
    /// the etcd differential test when the head of a count was the store's revision.
    #[test]
    fn a_txn_range_after_its_own_deletes_counts_its_revision() {
        use api::etcdserverpb::{
            DeleteRangeRequest, RequestOp, TxnRequest, request_op, response_op,
        };
        let mut store = store_of(3);
        let at = store.revision();
        let range = |revision| RangeRequest {
            key: b"k".to_vec(),
            range_end: b"l".to_vec(),
            limit: 1,
            revision,
            ..Default::default()
        };
        let ops = vec![
            request_op::Request::RequestDeleteRange(DeleteRangeRequest {
                key: b"k".to_vec(),
                range_end: b"l".to_vec(),
                ..Default::default()
            }),
            request_op::Request::RequestRange(range(at)),
            request_op::Request::RequestRange(range(0)),
        ];
        let txn = TxnRequest {
            success: ops
                .into_iter()
                .map(|r| RequestOp { request: Some(r) })
                .collect(),
            ..Default::default()
        };
        let entry = Entry {
            format_version: 1,
            tenant: "t".into(),
            request: Some(Request::Txn(txn)),
            ..Default::default()
        };
        let applied = store.apply(100, &entry);
        let crate::Outcome::Txn(resp) = applied.outcome else {
            panic!("{:?}", applied.outcome);
        };
        let counts: Vec<i64> = resp
            .responses
            .iter()
            .filter_map(|r| match &r.response {
                Some(response_op::Response::ResponseRange(r)) => Some(r.count),
                _ => None,
            })
            .collect();
        assert_eq!(counts, [3, 0], "at {at}, then at the txn's own revision");
    }

    /// Hashing in steps, with entries applied between them (overwrites, new keys, deletes),
    /// gives the hash of the revision it began at, the one `hash_kv` gives at once; a
    /// compaction between two steps fails the next one.
    #[test]
    fn a_hash_in_steps_is_the_hash_of_its_revision() {
        let mut store = store_of(2_000);
        for i in 0..500usize {
            let key = format!("k{:05}", i * 3).into_bytes();
            apply(&mut store, 3_000 + i as u64, put(key, b"again".to_vec()));
        }
        let at = store.revision();
        let whole = store.hash_kv(0).unwrap();
        let mut scan = store.hash_kv_scan(0).unwrap();
        let few = StepBudget {
            keys: 7,
            bytes: usize::MAX,
        };
        let mut index = 10_000;
        let mut steps = 0usize;
        while !scan.step(&store, few).unwrap() {
            steps += 1;
            let key = |i: usize| format!("k{:05}", i % 2_000).into_bytes();
            let delete = Request::DeleteRange(api::etcdserverpb::DeleteRangeRequest {
                key: key(steps * 17 + 5),
                ..Default::default()
            });
            let writes = [
                put(key(steps * 13), b"later".to_vec()),
                put([key(steps * 11), b"x".to_vec()].concat(), b"new".to_vec()),
                delete,
            ];
            for request in writes {
                index += 1;
                apply(&mut store, index, request);
            }
        }
        assert!(steps > 200, "{steps} steps");
        assert_eq!(scan.revision(), at);
        assert_eq!(scan.finish(), whole);
        assert_eq!(store.hash_kv(at).unwrap(), whole);
        assert_ne!(store.hash_kv(0).unwrap().hash, whole.hash);

        let mut scan = store.hash_kv_scan(at).unwrap();
        assert!(!scan.step(&store, few).unwrap());
        let compaction = api::etcdserverpb::CompactionRequest {
            revision: at - 100,
            physical: true,
        };
        apply(&mut store, index + 1, Request::Compact(compaction));
        assert_eq!(scan.step(&store, few), Err(Error::Compacted));
        // Begun again, it hashes what the compaction left.
        let mut scan = store.hash_kv_scan(at).unwrap();
        while !scan.step(&store, few).unwrap() {}
        let after = scan.finish();
        assert_eq!(after, store.hash_kv(at).unwrap());
        assert_eq!(after.compact_revision, at - 100);
        // In steps through the compacted keys (those kept below the compaction, then the log),
        // with writes between the steps: the same hash.
        let mut scan = store.hash_kv_scan(at).unwrap();
        let mut index = index + 1;
        let mut steps = 0usize;
        while !scan.step(&store, few).unwrap() {
            steps += 1;
            index += 1;
            let key = format!("k{:05}", (steps * 7) % 2_000).into_bytes();
            apply(&mut store, index, put(key, b"later still".to_vec()));
        }
        assert!(steps > 300, "{steps} steps");
        assert_eq!(scan.finish(), after);
    }

    /// A step reads at most its budget (and always at least one key), and the scan resumes at
    /// the first key it did not read, seeing neither the keys nor the versions written after
    /// it began.
    #[test]
    fn steps_keep_to_their_budget_and_resume_where_they_stopped() {
        let mut store = store_of(10);
        let req = RangeRequest {
            key: b"k".to_vec(),
            range_end: b"l".to_vec(),
            ..Default::default()
        };
        let mut scan = store.range_scan(&req).unwrap();
        let one_key = StepBudget {
            keys: 1,
            bytes: usize::MAX,
        };
        assert!(!scan.step(&store, one_key).unwrap());
        assert_eq!(scan.hits.len(), 1);
        assert_eq!(scan.req.key, b"k00001");
        // Nothing to copy allowed: still one key a step.
        let nothing = StepBudget { keys: 0, bytes: 0 };
        assert!(!scan.step(&store, nothing).unwrap());
        assert_eq!(scan.hits.len(), 2);
        // Writes between steps: a new key inside the range, and an overwrite ahead of the scan.
        let before = store.revision();
        for (i, key) in [b"k00001a".as_slice(), b"k00005"].into_iter().enumerate() {
            apply(
                &mut store,
                100 + i as u64,
                put(key.to_vec(), b"new".to_vec()),
            );
        }
        let bytes = StepBudget {
            keys: usize::MAX,
            bytes: 3 * 8,
        };
        assert!(!scan.step(&store, bytes).unwrap());
        assert_eq!(scan.hits.len(), 5, "three keys of 8 bytes copied");
        while !scan.step(&store, one_key).unwrap() {}
        let resp = scan.into_response();
        assert_eq!(resp.header.unwrap().revision, before);
        assert_eq!(resp.count, 10);
        let at_start = RangeRequest {
            revision: before,
            ..req
        };
        assert_eq!(resp.kvs, store.range(&at_start).unwrap().kvs);
        assert!(resp.kvs.iter().all(|kv| kv.value != b"new"));
    }
}

#[cfg(test)]
mod etcd_hash_tests {
    use api::etcdserverpb::{DeleteRangeRequest, PutRequest};
    use api::strata::entry::{Entry, entry::Request};

    use crate::MemStore;

    /// etcd 3.4.23 answered HashKV 1471606496 at revision 5 after these four requests.
    #[test]
    fn hash_kv_is_etcd_s() {
        let mut s = MemStore::new(crate::Config::default());
        let put = |k: &str, v: &str| {
            Request::Put(PutRequest {
                key: k.into(),
                value: v.into(),
                ..Default::default()
            })
        };
        let requests = [
            put("k1", "v1"),
            put("k2", "v2"),
            put("k3", "v3"),
            Request::DeleteRange(DeleteRangeRequest {
                key: b"k2".to_vec(),
                ..Default::default()
            }),
        ];
        for (i, request) in requests.into_iter().enumerate() {
            let entry = Entry {
                format_version: 1,
                tenant: "t".into(),
                request: Some(request),
                ..Default::default()
            };
            s.apply(i as u64 + 1, &entry);
        }
        assert_eq!(s.revision(), 5);
        assert_eq!(s.hash_kv(0).unwrap().hash, 1_471_606_496);
    }
}
