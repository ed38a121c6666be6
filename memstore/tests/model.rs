//! Property test: random operation sequences applied to the memstore and to a deliberately
//! naive reference model (a full snapshot of every revision); every range at every revision,
//! every outcome, every event and every replay of history must agree. A checkpoint taken in the
//! middle of each sequence must load into a store that behaves identically for the rest. Ranges
//! read a key at a time while the sequence goes on applying (`MemStore::range_scan`) must answer
//! what the model held at the revision they began at, or meet a compaction past it.
//!
//! The model is written from etcd's documented behaviour, not from the store's code: puts with
//! `ignore_value`/`ignore_lease` (and the order of their checks alone and inside a txn), every
//! compare target, request ids applied once within a (shortened) window, lease grants and
//! keep-alives with their answers. Only txn validation (overlapping keys, op counts) is the
//! shared `validate` module, unit-tested on its own.
//!
//! Deterministic: the seed is fixed (or `MEMSTORE_MODEL_SEED=<u64>`), printed, and proptest
//! shrinks a failure to a minimal sequence. Cases: `MEMSTORE_MODEL_CASES` (default 192).

mod common;

use std::collections::BTreeMap;

use api::etcdserverpb::{
    CompactionRequest, Compare, DeleteRangeRequest, LeaseGrantRequest, LeaseKeepAliveRequest,
    LeaseRevokeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest, compare, request_op,
    response_op,
};
use api::mvccpb::{Event, KeyValue, event::EventType};
use api::strata::entry::{Entry, LeaderChange, Tick, entry::Request};
use api::strata::journal::{Record, record::Kind};
use memstore::checkpoint::{self, CheckpointMeta};
use memstore::{Config, Error, MemStore, Outcome, RangeScan, StepBudget};
use proptest::prelude::*;

const KEYS: [&str; 5] = ["a", "ab", "b", "c", "d"];
const ENDS: [&str; 5] = ["", "b", "c", "e", "\0"];
const DEFAULT_SEED: u64 = 0x5747_a7a0_2026_1130;
const DEFAULT_CASES: u32 = 192;
const EXTEND_MS: i64 = 1_000;
const MIN_TTL: i64 = 2;
const LEASE_STEP_MS: i64 = 2_000;
/// Expired leases revoked per second of journal time, lowered so that entries meet more
/// expired leases than they may revoke.
const REVOKES_PER_SECOND: i64 = 1;
/// The de-duplication window, shortened so that sequences see ids both remembered and forgotten.
const ID_WINDOW_MS: i64 = 20_000;

type Snapshot = BTreeMap<Vec<u8>, KeyValue>;

fn in_range(k: &[u8], key: &[u8], end: &[u8]) -> bool {
    if end.is_empty() {
        k == key
    } else if end == [0] {
        k >= key
    } else {
        k >= key && k < end
    }
}

/// The naive model: one full copy of the key space per revision.
struct Model {
    now: i64,
    /// The last entry's stamp (0: none yet).
    stamp: i64,
    compact: i64,
    snaps: Vec<Snapshot>, // snaps[r - 1] is the state at revision r
    events: Vec<Event>,
    /// id -> (ttl, deadline)
    leases: BTreeMap<i64, (i64, i64)>,
    /// request id -> (journal time, store revision right after its first apply)
    ids: BTreeMap<Vec<u8>, (i64, i64)>,
}

/// What the model predicts for one entry.
#[derive(Debug, PartialEq)]
enum Predicted {
    Failed(Error),
    Put(Option<KeyValue>),
    Delete(i64, Vec<KeyValue>),
    Txn(TxnShape),
    Granted { id: i64, ttl: i64 },
    KeptAlive { id: i64, ttl: i64 },
    Duplicate(i64),
    Ok,
}

/// The parts of a txn response the model checks.
#[derive(Debug, PartialEq)]
struct TxnShape {
    succeeded: bool,
    ops: Vec<OpShape>,
}

#[derive(Debug, PartialEq)]
enum OpShape {
    Range(Vec<KeyValue>, i64),
    Put,
    Delete(i64),
    Txn(TxnShape),
}

struct Write<'a> {
    model: &'a Model,
    cur: Snapshot,
    rev: i64,
    events: Vec<Event>,
    /// A put kept the value or lease of a key this write had deleted (a txn that deletes a key
    /// and then puts it with `ignore_value`): the whole request is refused.
    kept_a_deleted_key: bool,
}

impl Write<'_> {
    fn put(&mut self, p: &PutRequest) -> Option<KeyValue> {
        let prev = self.cur.get(&p.key).cloned();
        if (p.ignore_value || p.ignore_lease) && prev.is_none() {
            self.kept_a_deleted_key = true;
        }
        let kv = KeyValue {
            key: p.key.clone(),
            create_revision: prev.as_ref().map_or(self.rev, |x| x.create_revision),
            mod_revision: self.rev,
            version: prev.as_ref().map_or(1, |x| x.version + 1),
            value: match &prev {
                Some(x) if p.ignore_value => x.value.clone(),
                _ => p.value.clone(),
            },
            lease: match &prev {
                Some(x) if p.ignore_lease => x.lease,
                _ => p.lease,
            },
        };
        self.cur.insert(p.key.clone(), kv.clone());
        self.events.push(Event {
            r#type: EventType::Put as i32,
            kv: Some(kv),
            prev_kv: self.model.head().get(&p.key).cloned(),
        });
        prev
    }

    fn delete(&mut self, key: &[u8], end: &[u8]) -> Vec<KeyValue> {
        let victims: Vec<KeyValue> = self
            .cur
            .values()
            .filter(|kv| in_range(&kv.key, key, end))
            .cloned()
            .collect();
        for kv in &victims {
            self.cur.remove(&kv.key);
            self.events.push(Event {
                r#type: EventType::Delete as i32,
                kv: Some(KeyValue {
                    key: kv.key.clone(),
                    mod_revision: self.rev,
                    ..Default::default()
                }),
                prev_kv: self.model.head().get(&kv.key).cloned(),
            });
        }
        victims
    }
}

impl Model {
    fn new() -> Self {
        Model {
            now: 1_000_000,
            stamp: 0,
            compact: memstore::NEVER_COMPACTED,
            snaps: vec![Snapshot::new()],
            events: Vec::new(),
            leases: BTreeMap::new(),
            ids: BTreeMap::new(),
        }
    }

    fn rev(&self) -> i64 {
        self.snaps.len() as i64
    }

    fn head(&self) -> &Snapshot {
        self.snaps.last().unwrap()
    }

    fn at(&self, rev: i64) -> Result<&Snapshot, Error> {
        if rev > self.rev() {
            return Err(Error::FutureRevision);
        }
        let rev = if rev <= 0 { self.rev() } else { rev };
        if rev < self.compact {
            return Err(Error::Compacted);
        }
        Ok(&self.snaps[rev as usize - 1])
    }

    fn range(&self, key: &[u8], end: &[u8], rev: i64) -> Result<Vec<KeyValue>, Error> {
        Ok(self
            .at(rev)?
            .values()
            .filter(|kv| in_range(&kv.key, key, end))
            .cloned()
            .collect())
    }

    fn begin(&self) -> Write<'_> {
        Write {
            model: self,
            cur: self.head().clone(),
            rev: self.rev() + 1,
            events: Vec::new(),
            kept_a_deleted_key: false,
        }
    }

    fn commit(&mut self, snap: Snapshot, events: Vec<Event>, out: &mut Vec<Event>) {
        if !events.is_empty() {
            self.snaps.push(snap);
            self.events.extend(events.iter().cloned());
            out.extend(events);
        }
    }

    fn revoke(&mut self, id: i64, out: &mut Vec<Event>) {
        self.leases.remove(&id);
        let keys: Vec<Vec<u8>> = self
            .head()
            .values()
            .filter(|kv| kv.lease == id)
            .map(|kv| kv.key.clone())
            .collect();
        let mut w = self.begin();
        for k in keys {
            w.delete(&k, b"");
        }
        let (cur, events) = (w.cur, w.events);
        self.commit(cur, events, out);
    }

    fn apply(
        &mut self,
        now: i64,
        req: &Request,
        id: Option<&[u8]>,
        out: &mut Vec<Event>,
    ) -> Predicted {
        self.now = now;
        // Stamps further apart than the lease clock's step age leases by the step only.
        let before = self.stamp;
        self.stamp = now;
        if before > 0 && now - before > LEASE_STEP_MS {
            for (_, deadline) in self.leases.values_mut() {
                *deadline += now - before - LEASE_STEP_MS;
            }
            // Nor do they age the request-id window by more.
            for (t, _) in self.ids.values_mut() {
                *t += now - before - LEASE_STEP_MS;
            }
        }
        if matches!(req, Request::LeaderChange(_)) {
            for (ttl, deadline) in self.leases.values_mut() {
                *deadline = now + *ttl * 1000 + EXTEND_MS;
            }
        } else {
            // At most the rate times the time since the previous entry (one step at most), at
            // least one.
            let counted = if before > 0 {
                (now - before).min(LEASE_STEP_MS)
            } else {
                LEASE_STEP_MS
            };
            for _ in 0..(counted * REVOKES_PER_SECOND / 1000).max(1) {
                let Some((&id, _)) = self
                    .leases
                    .iter()
                    .filter(|(_, (_, d))| *d <= now)
                    .min_by_key(|(id, (_, d))| (*d, **id))
                else {
                    break;
                };
                self.revoke(id, out);
            }
        }
        // A request id is applied once while the window remembers it; a failed request's id
        // too. Expiries above happen either way.
        self.ids.retain(|_, (t, _)| *t >= now - ID_WINDOW_MS);
        if let Some((_, revision)) = id.and_then(|id| self.ids.get(id)) {
            return Predicted::Duplicate(*revision);
        }
        let predicted = match self.request(req, out) {
            Ok(p) => p,
            Err(e) => Predicted::Failed(e),
        };
        if let Some(id) = id {
            self.ids.insert(id.to_vec(), (now, self.rev()));
        }
        predicted
    }

    fn request(&mut self, req: &Request, out: &mut Vec<Event>) -> Result<Predicted, Error> {
        match req {
            Request::Put(p) => {
                // A lone put checks its lease first, then the key that ignore_* needs.
                if p.lease != 0 && !self.leases.contains_key(&p.lease) {
                    return Err(Error::LeaseNotFound);
                }
                if (p.ignore_value || p.ignore_lease) && !self.head().contains_key(&p.key) {
                    return Err(Error::KeyNotFound);
                }
                let mut w = self.begin();
                let prev = w.put(p);
                let (cur, events) = (w.cur, w.events);
                self.commit(cur, events, out);
                Ok(Predicted::Put(if p.prev_kv { prev } else { None }))
            }
            Request::DeleteRange(d) => {
                let mut w = self.begin();
                let victims = w.delete(&d.key, &d.range_end);
                let (cur, events) = (w.cur, w.events);
                self.commit(cur, events, out);
                Ok(Predicted::Delete(
                    victims.len() as i64,
                    if d.prev_kv { victims } else { Vec::new() },
                ))
            }
            Request::Txn(t) => {
                // Request validation is the shared `validate` module (unit-tested on its own).
                memstore::validate::txn(t, memstore::DEFAULT_MAX_TXN_OPS)?;
                self.check_branch(t)?;
                let mut w = self.begin();
                let shape = run_txn(&mut w, t, self.head());
                if w.kept_a_deleted_key {
                    return Err(Error::KeyNotFound);
                }
                let (cur, events) = (w.cur, w.events);
                self.commit(cur, events, out);
                Ok(Predicted::Txn(shape))
            }
            Request::Compact(c) => {
                if c.revision <= self.compact {
                    return Err(Error::Compacted);
                }
                if c.revision > self.rev() {
                    return Err(Error::FutureRevision);
                }
                self.compact = c.revision;
                Ok(Predicted::Ok)
            }
            Request::LeaseGrant(g) => {
                if self.leases.contains_key(&g.id) {
                    return Err(Error::LeaseExists);
                }
                let ttl = g.ttl.max(MIN_TTL);
                self.leases.insert(g.id, (ttl, self.now + ttl * 1000));
                Ok(Predicted::Granted { id: g.id, ttl })
            }
            Request::LeaseRevoke(r) => {
                if !self.leases.contains_key(&r.id) {
                    return Err(Error::LeaseNotFound);
                }
                self.revoke(r.id, out);
                Ok(Predicted::Ok)
            }
            Request::LeaseKeepAlive(k) => {
                // An overdue lease waiting for its revoke is not renewed.
                let now = self.now;
                let Some((ttl, deadline)) = self.leases.get_mut(&k.id).filter(|(_, d)| *d > now)
                else {
                    return Err(Error::LeaseNotFound);
                };
                *deadline = self.now + *ttl * 1000;
                Ok(Predicted::KeptAlive {
                    id: k.id,
                    ttl: *ttl,
                })
            }
            _ => Ok(Predicted::Ok),
        }
    }

    /// Apply-time checks of the branches a txn takes, against the state before it: each put
    /// in order, first the key its ignore_* flags need, then its lease (the reverse of a lone
    /// put's order, as in etcd).
    fn check_branch(&self, t: &TxnRequest) -> Result<(), Error> {
        let ops = if compares_hold(self.head(), &t.compare) {
            &t.success
        } else {
            &t.failure
        };
        for op in ops {
            match &op.request {
                Some(request_op::Request::RequestPut(p)) => {
                    if (p.ignore_value || p.ignore_lease) && !self.head().contains_key(&p.key) {
                        return Err(Error::KeyNotFound);
                    }
                    if p.lease != 0 && !self.leases.contains_key(&p.lease) {
                        return Err(Error::LeaseNotFound);
                    }
                }
                Some(request_op::Request::RequestTxn(inner)) => self.check_branch(inner)?,
                _ => {}
            }
        }
        Ok(())
    }
}

fn compares_hold(snap: &Snapshot, compares: &[Compare]) -> bool {
    compares.iter().all(|c| {
        let kvs: Vec<&KeyValue> = snap
            .values()
            .filter(|kv| in_range(&kv.key, &c.key, &c.range_end))
            .collect();
        let value_target = c.target == compare::CompareTarget::Value as i32;
        if kvs.is_empty() && value_target {
            return false;
        }
        let zero = KeyValue::default();
        let check = |kv: &KeyValue| {
            let ord = match c.target_union.clone() {
                Some(compare::TargetUnion::Value(v)) => kv.value.cmp(&v),
                Some(compare::TargetUnion::Version(v)) => kv.version.cmp(&v),
                Some(compare::TargetUnion::ModRevision(v)) => kv.mod_revision.cmp(&v),
                Some(compare::TargetUnion::CreateRevision(v)) => kv.create_revision.cmp(&v),
                Some(compare::TargetUnion::Lease(v)) => kv.lease.cmp(&v),
                None => std::cmp::Ordering::Equal,
            };
            match compare::CompareResult::try_from(c.result).unwrap() {
                compare::CompareResult::Equal => ord.is_eq(),
                compare::CompareResult::NotEqual => ord.is_ne(),
                compare::CompareResult::Greater => ord.is_gt(),
                compare::CompareResult::Less => ord.is_lt(),
            }
        };
        if kvs.is_empty() {
            check(&zero)
        } else {
            kvs.into_iter().all(check)
        }
    })
}

/// Executes the taken branches; nested compares read `before` (the state before the txn).
fn run_txn(w: &mut Write<'_>, t: &TxnRequest, before: &Snapshot) -> TxnShape {
    let succeeded = compares_hold(before, &t.compare);
    let ops = if succeeded { &t.success } else { &t.failure };
    let mut shapes = Vec::new();
    for op in ops {
        shapes.push(match &op.request {
            Some(request_op::Request::RequestRange(r)) => {
                let kvs = w
                    .cur
                    .values()
                    .filter(|kv| in_range(&kv.key, &r.key, &r.range_end))
                    .cloned()
                    .collect();
                let read_rev = if w.events.is_empty() {
                    w.rev - 1
                } else {
                    w.rev
                };
                OpShape::Range(kvs, read_rev)
            }
            Some(request_op::Request::RequestPut(p)) => {
                w.put(p);
                OpShape::Put
            }
            Some(request_op::Request::RequestDeleteRange(d)) => {
                OpShape::Delete(w.delete(&d.key, &d.range_end).len() as i64)
            }
            Some(request_op::Request::RequestTxn(inner)) => OpShape::Txn(run_txn(w, inner, before)),
            None => unreachable!("validation refuses empty ops"),
        });
    }
    TxnShape {
        succeeded,
        ops: shapes,
    }
}

fn shape_of(resp: &api::etcdserverpb::TxnResponse) -> TxnShape {
    TxnShape {
        succeeded: resp.succeeded,
        ops: resp
            .responses
            .iter()
            .map(|r| match r.response.as_ref().unwrap() {
                response_op::Response::ResponseRange(x) => {
                    OpShape::Range(x.kvs.clone(), x.header.as_ref().unwrap().revision)
                }
                response_op::Response::ResponsePut(_) => OpShape::Put,
                response_op::Response::ResponseDeleteRange(x) => OpShape::Delete(x.deleted),
                response_op::Response::ResponseTxn(x) => OpShape::Txn(shape_of(x)),
            })
            .collect(),
    }
}

fn observed(outcome: &Outcome) -> Predicted {
    match outcome {
        Outcome::Failed(e) => Predicted::Failed(e.clone()),
        Outcome::Put(p) => Predicted::Put(p.prev_kv.clone()),
        Outcome::DeleteRange(d) => Predicted::Delete(d.deleted, d.prev_kvs.clone()),
        Outcome::Txn(t) => Predicted::Txn(shape_of(t)),
        Outcome::LeaseGrant(g) => Predicted::Granted {
            id: g.id,
            ttl: g.ttl,
        },
        Outcome::LeaseKeepAlive(k) => Predicted::KeptAlive {
            id: k.id,
            ttl: k.ttl,
        },
        Outcome::Duplicate { revision } => Predicted::Duplicate(*revision),
        _ => Predicted::Ok,
    }
}

// ---- generators ----

fn key() -> impl Strategy<Value = Vec<u8>> {
    prop::sample::select(KEYS.to_vec()).prop_map(|k| k.as_bytes().to_vec())
}

fn end() -> impl Strategy<Value = Vec<u8>> {
    prop::sample::select(ENDS.to_vec()).prop_map(|k| k.as_bytes().to_vec())
}

/// Puts, a fifth of them keeping the previous value or lease (`ignore_value` goes with an empty
/// value and `ignore_lease` with lease 0, as validation requires).
fn put_req() -> impl Strategy<Value = PutRequest> {
    (
        key(),
        0u8..4,
        prop_oneof![3 => Just(0i64), 1 => 1i64..4],
        any::<bool>(),
        prop_oneof![8 => Just((false, false)), 1 => Just((true, false)), 1 => Just((false, true))],
    )
        .prop_map(
            |(key, v, lease, prev_kv, (ignore_value, ignore_lease))| PutRequest {
                key,
                value: if ignore_value {
                    Vec::new()
                } else {
                    vec![b'0' + v]
                },
                lease: if ignore_lease { 0 } else { lease },
                prev_kv,
                ignore_value,
                ignore_lease,
            },
        )
}

fn compare_req() -> impl Strategy<Value = Compare> {
    (
        key(),
        prop_oneof![3 => Just(Vec::new()), 1 => end()],
        0i32..4,
        0u8..5,
        0i64..6,
    )
        .prop_map(|(key, range_end, result, target, n)| {
            let (target, union) = match target {
                0 => (
                    compare::CompareTarget::Value,
                    compare::TargetUnion::Value(vec![b'0' + (n as u8 % 4)]),
                ),
                1 => (
                    compare::CompareTarget::Version,
                    compare::TargetUnion::Version(n % 3),
                ),
                2 => (
                    compare::CompareTarget::Mod,
                    compare::TargetUnion::ModRevision(n),
                ),
                3 => (
                    compare::CompareTarget::Create,
                    compare::TargetUnion::CreateRevision(n),
                ),
                _ => (
                    compare::CompareTarget::Lease,
                    compare::TargetUnion::Lease(n % 4),
                ),
            };
            Compare {
                result,
                target: target as i32,
                key,
                range_end,
                target_union: Some(union),
            }
        })
}

fn flat_op() -> impl Strategy<Value = RequestOp> {
    prop_oneof![
        3 => put_req().prop_map(request_op::Request::RequestPut),
        1 => (key(), end()).prop_map(|(key, range_end)| request_op::Request::RequestDeleteRange(DeleteRangeRequest { key, range_end, prev_kv: false })),
        1 => (key(), end()).prop_map(|(key, range_end)| request_op::Request::RequestRange(RangeRequest { key, range_end, ..Default::default() })),
    ]
    .prop_map(|r| RequestOp { request: Some(r) })
}

fn txn_req(depth: u32) -> BoxedStrategy<TxnRequest> {
    let op: BoxedStrategy<RequestOp> = if depth == 0 {
        flat_op().boxed()
    } else {
        prop_oneof![4 => flat_op(), 1 => txn_req(depth - 1).prop_map(|t| RequestOp { request: Some(request_op::Request::RequestTxn(t)) })].boxed()
    };
    (
        prop::collection::vec(compare_req(), 0..3),
        prop::collection::vec(op.clone(), 0..4),
        prop::collection::vec(op, 0..3),
    )
        .prop_map(|(compare, success, failure)| TxnRequest {
            compare,
            success,
            failure,
        })
        .boxed()
}

/// One journal entry: how far time moves, the request, and its request id (from a pool of four,
/// a third of requests; none for ticks and leader changes, which carry none).
fn step() -> impl Strategy<Value = Step> {
    let req = prop_oneof![
        6 => put_req().prop_map(Request::Put),
        2 => (key(), end(), any::<bool>()).prop_map(|(key, range_end, prev_kv)| Request::DeleteRange(DeleteRangeRequest { key, range_end, prev_kv })),
        4 => txn_req(1).prop_map(Request::Txn),
        1 => (0i64..6).prop_map(|back| Request::Compact(CompactionRequest { revision: -back, physical: true })),
        2 => (1i64..4, 1i64..12).prop_map(|(id, ttl)| Request::LeaseGrant(LeaseGrantRequest { ttl, id })),
        1 => (1i64..4).prop_map(|id| Request::LeaseRevoke(LeaseRevokeRequest { id })),
        1 => (1i64..4).prop_map(|id| Request::LeaseKeepAlive(LeaseKeepAliveRequest { id })),
        1 => Just(Request::Tick(Tick {})),
        1 => Just(Request::LeaderChange(LeaderChange { term: 1 })),
    ];
    (
        prop_oneof![3 => Just(0i64), 2 => 0i64..4_000, 1 => 0i64..15_000],
        req,
        prop_oneof![2 => Just(None), 1 => (0u8..4).prop_map(Some)],
    )
        .prop_map(|(advance, req, id)| {
            let id = id
                .filter(|_| !matches!(req, Request::Tick(_) | Request::LeaderChange(_)))
                .map(|n| vec![b'r', n]);
            (advance, req, id)
        })
}

type Step = (i64, Request, Option<Vec<u8>>);

// ---- the check ----

fn entry(now: i64, req: &Request, id: &Option<Vec<u8>>) -> Entry {
    Entry {
        format_version: 1,
        tenant: "t".into(),
        request_id: id.clone().unwrap_or_default(),
        time_ms: now,
        request: Some(req.clone()),
        ..Default::default()
    }
}

/// Compact requests are generated relative to the head: resolve them.
fn resolve(req: &Request, model: &Model) -> Request {
    match req {
        Request::Compact(c) => Request::Compact(CompactionRequest {
            revision: model.rev() + c.revision,
            physical: true,
        }),
        r => r.clone(),
    }
}

fn check_reads(store: &MemStore, model: &Model) -> Result<(), TestCaseError> {
    prop_assert_eq!(store.revision(), model.rev());
    prop_assert_eq!(store.compact_revision(), model.compact);
    for rev in (model.compact.max(1) - 2)..=(model.rev() + 1) {
        for (k, e) in [("\0", "\0"), ("a", "b"), ("b", ""), ("ab", "\0")] {
            let req = RangeRequest {
                key: k.into(),
                range_end: e.into(),
                revision: rev,
                ..Default::default()
            };
            let got = store.range(&req).map(|r| r.kvs);
            prop_assert_eq!(
                &got,
                &model.range(k.as_bytes(), e.as_bytes(), rev),
                "range {:?}..{:?} at {}",
                k,
                e,
                rev
            );
        }
    }
    let req = RangeRequest {
        key: "a".into(),
        range_end: "\0".into(),
        limit: 2,
        ..Default::default()
    };
    let resp = store.range(&req).unwrap();
    let all = model.range(b"a", b"\0", 0).unwrap();
    prop_assert_eq!(resp.count, all.len() as i64);
    prop_assert_eq!(resp.more, all.len() > 2);
    prop_assert_eq!(&resp.kvs[..], &all[..all.len().min(2)]);
    for from in (model.compact - 1)..=(model.rev() + 1) {
        let got = store.events(from, b"\0", b"\0", usize::MAX);
        if from < model.compact {
            prop_assert_eq!(got, Err(Error::Compacted));
        } else {
            // From the compact revision itself, as etcd: each key's newest change there.
            let want: Vec<Event> = common::after_compaction(&model.events, model.compact)
                .into_iter()
                .filter(|e| e.kv.as_ref().unwrap().mod_revision >= from)
                .collect();
            prop_assert_eq!(got.unwrap(), want, "events from {}", from);
        }
    }
    let leases: Vec<i64> = store.lease_leases().leases.iter().map(|l| l.id).collect();
    prop_assert_eq!(leases, model.leases.keys().copied().collect::<Vec<_>>());
    for (&id, &(ttl, deadline)) in &model.leases {
        let t = store.lease_time_to_live(id, true).unwrap();
        prop_assert_eq!(t.granted_ttl, ttl);
        // Overdue (waiting for its revoke): negative, as etcd's.
        prop_assert_eq!(t.ttl, (deadline - store.time_ms() - 1) / 1000);
        let keys: Vec<Vec<u8>> = model
            .head()
            .values()
            .filter(|kv| kv.lease == id)
            .map(|kv| kv.key.clone())
            .collect();
        prop_assert_eq!(t.keys, keys);
    }
    let s = store.stats();
    prop_assert_eq!(s.keys, model.head().len() as u64);
    prop_assert_eq!(
        s.live_bytes,
        model
            .head()
            .values()
            .map(|kv| (kv.key.len() + kv.value.len()) as u64)
            .sum::<u64>()
    );
    Ok(())
}

/// A Range read step by step (`MemStore::range_scan`) while the sequence goes on applying.
struct OpenScan {
    scan: RangeScan,
    req: RangeRequest,
    /// The store's revision when it began: the revision it reads at.
    rev: i64,
    budget: StepBudget,
}

/// The scans begun along a sequence, by the step they begin at: each range form, plain and with
/// a limit, keys only, count only, and sorted (by value, by mod revision descending with a
/// limit); a step reads one key, or copies one key (however many it only counts).
fn scan_at(i: usize, rev: i64) -> (RangeRequest, StepBudget) {
    use api::etcdserverpb::range_request::{SortOrder, SortTarget};
    let (k, e) = [("\0", "\0"), ("a", "b"), ("ab", "\0"), ("a", "d")][i % 4];
    let mut req = RangeRequest {
        key: k.into(),
        range_end: e.into(),
        ..Default::default()
    };
    match (i / 4) % 5 {
        0 => {}
        1 => req.limit = 2,
        2 => req.keys_only = true,
        3 => {
            req.count_only = true;
            req.revision = rev;
        }
        _ => {
            req.sort_target = [SortTarget::Value, SortTarget::Mod][i % 2] as i32;
            req.sort_order = [SortOrder::Ascend, SortOrder::Descend][i % 2] as i32;
            req.limit = [0, 2][i % 2];
            req.keys_only = i.is_multiple_of(3);
        }
    }
    let budget = if i.is_multiple_of(2) {
        StepBudget {
            keys: 1,
            bytes: usize::MAX,
        }
    } else {
        StepBudget {
            keys: usize::MAX,
            bytes: 1,
        }
    };
    (req, budget)
}

/// What the model answers for `req` at `rev`: (kvs, count, more).
fn model_range(
    model: &Model,
    req: &RangeRequest,
    rev: i64,
) -> Result<(Vec<KeyValue>, i64, bool), Error> {
    use api::etcdserverpb::range_request::{SortOrder, SortTarget};
    let mut kvs = model.range(&req.key, &req.range_end, rev)?;
    let count = kvs.len() as i64;
    let key_of = |kv: &KeyValue| match SortTarget::try_from(req.sort_target).unwrap() {
        SortTarget::Key => (kv.key.clone(), 0),
        SortTarget::Version => (Vec::new(), kv.version),
        SortTarget::Create => (Vec::new(), kv.create_revision),
        SortTarget::Mod => (Vec::new(), kv.mod_revision),
        SortTarget::Value => (kv.value.clone(), 0),
    };
    // Stable: ties stay in key order.
    match SortOrder::try_from(req.sort_order).unwrap() {
        SortOrder::None => {}
        SortOrder::Ascend => kvs.sort_by_key(key_of),
        SortOrder::Descend => kvs.sort_by_key(|kv| std::cmp::Reverse(key_of(kv))),
    }
    let more = req.limit > 0 && kvs.len() > req.limit as usize;
    if req.limit > 0 {
        kvs.truncate(req.limit as usize);
    }
    if req.count_only {
        kvs.clear();
    }
    if req.keys_only {
        kvs.iter_mut().for_each(|kv| kv.value.clear());
    }
    Ok((kvs, count, more))
}

/// Steps each open scan once (all the way with `to_end`); a scan that finished must answer what
/// the model holds at its revision, and one that failed must have met a compaction past it.
fn step_scans(
    scans: &mut Vec<OpenScan>,
    store: &MemStore,
    model: &Model,
    to_end: bool,
) -> Result<(), TestCaseError> {
    let mut open = Vec::new();
    for mut s in scans.drain(..) {
        let budget = if to_end {
            StepBudget::UNLIMITED
        } else {
            s.budget
        };
        match s.scan.step(store, budget) {
            Ok(false) => open.push(s),
            Ok(true) => {
                prop_assert_eq!(s.scan.revision(), s.rev);
                let want = model_range(model, &s.req, s.rev);
                prop_assert!(want.is_ok(), "a scan at {} outlived its compaction", s.rev);
                let resp = s.scan.into_response();
                prop_assert_eq!(
                    (resp.kvs, resp.count, resp.more),
                    want.unwrap(),
                    "scan {:?} at {}",
                    &s.req,
                    s.rev
                );
            }
            Err(e) => {
                prop_assert_eq!(e, Error::Compacted);
                prop_assert!(
                    model.compact > s.rev,
                    "a scan at {} failed uncompacted",
                    s.rev
                );
            }
        }
    }
    *scans = open;
    Ok(())
}

fn run_case(steps: &[Step]) -> Result<(), TestCaseError> {
    let config = Config {
        leader_change_extend_ms: EXTEND_MS,
        lease_clock_max_step_ms: LEASE_STEP_MS,
        lease_revokes_per_second: REVOKES_PER_SECOND,
        min_lease_ttl_secs: MIN_TTL,
        request_id_window_ms: ID_WINDOW_MS,
        ..Config::default()
    };
    let mut store = MemStore::new(config.clone());
    // The same entries through `apply_owned` (a replica's by-value path) must give the same
    // outcomes, events and state.
    let mut owned = MemStore::new(config.clone());
    // And the same entries as journal records through `apply_record` (the replica's path, which
    // reads a put in place).
    let mut recorded = MemStore::new(config.clone());
    // And the same records through a store that builds no events (the compactor's replica):
    // the same outcomes and state, no events.
    let mut silent = MemStore::new(config.clone());
    silent.set_emit_events(false);
    let mut model = Model::new();
    let mut restored: Option<MemStore> = None;
    let mut now = model.now;
    let mut scans = Vec::new();
    for (i, (advance, req, id)) in steps.iter().enumerate() {
        if i == steps.len() / 2 {
            let meta = CheckpointMeta {
                tenant: "t".into(),
                shard: 0,
                index: store.applied_index(),
                revision: store.revision(),
                created_ms: now,
            };
            let bytes = checkpoint::encode(&meta, &store);
            let (m, mut loaded) =
                checkpoint::decode(&bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
            loaded.set_config(config.clone());
            prop_assert_eq!(m, meta);
            prop_assert!(
                loaded == store,
                "a loaded checkpoint differs from its store"
            );
            restored = Some(loaded);
        }
        now += advance;
        let req = resolve(req, &model);
        let index = i as u64 + 1;
        let applied = store.apply(index, &entry(now, &req, id));
        let mut events = Vec::new();
        let predicted = model.apply(now, &req, id.as_deref(), &mut events);
        prop_assert_eq!(
            observed(&applied.outcome),
            predicted,
            "step {}: {:?}",
            i,
            req
        );
        prop_assert_eq!(&applied.events, &events, "events of step {}", i);
        prop_assert_eq!(applied.revision, model.rev());
        prop_assert_eq!(
            &owned.apply_owned(index, entry(now, &req, id)),
            &applied,
            "apply_owned diverged at step {}",
            i
        );
        let record = Record {
            index,
            term: 1,
            time_ms: now,
            kind: Some(Kind::Data(api::record::encode_entry(&entry(now, &req, id)))),
        };
        let quietly = silent
            .apply_record_ref(&record, "t")
            .map_err(|e| TestCaseError::fail(e.to_string()))?
            .applied;
        prop_assert_eq!(
            &quietly.outcome,
            &applied.outcome,
            "silent store, step {}",
            i
        );
        prop_assert_eq!(quietly.revision, applied.revision);
        prop_assert!(quietly.events.is_empty(), "a silent store built events");
        let by_record = recorded
            .apply_record(record, "t")
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(
            &by_record.applied,
            &applied,
            "apply_record diverged at step {}",
            i
        );
        if let Some(r) = restored.as_mut() {
            prop_assert_eq!(
                &r.apply(index, &entry(now, &req, id)),
                &applied,
                "restored store diverged at step {}",
                i
            );
        }
        check_reads(&store, &model)?;
        step_scans(&mut scans, &store, &model, false)?;
        let (req, budget) = scan_at(i, store.revision());
        scans.push(OpenScan {
            scan: store.range_scan(&req).unwrap(),
            req,
            rev: store.revision(),
            budget,
        });
    }
    step_scans(&mut scans, &store, &model, true)?;
    prop_assert!(owned == store, "apply_owned left a different state");
    prop_assert!(recorded == store, "apply_record left a different state");
    prop_assert!(
        silent == store,
        "a store without events left a different state"
    );
    prop_assert_eq!(silent.hash_kv(0).unwrap(), store.hash_kv(0).unwrap());
    if let Some(r) = restored {
        prop_assert!(r == store);
        prop_assert_eq!(r.hash_kv(0).unwrap(), store.hash_kv(0).unwrap());
    }
    Ok(())
}

#[test]
fn memstore_agrees_with_the_naive_model() {
    let (mut runner, seed) = common::seeded_runner("MEMSTORE_MODEL", DEFAULT_SEED, DEFAULT_CASES);
    let result = runner.run(&prop::collection::vec(step(), 1..60), |steps| {
        run_case(&steps)
    });
    if let Err(e) = result {
        panic!("model disagreement (replay with MEMSTORE_MODEL_SEED={seed}): {e}");
    }
}
