//! The tenant catalogue (`_system`'s TenantChange entries): every rule by example, and random
//! change sequences against a naive model, through a checkpoint round trip.

mod common;

use std::collections::BTreeMap;

use api::strata::admin::{TenantRecord, TenantState};
use api::strata::entry::{TenantChange, TenantQuotas, entry::Request, tenant_change::Change};
use api::tenant::SYSTEM_TENANT;
use common::Harness;
use memstore::checkpoint::{self, CheckpointMeta};
use memstore::{Code, Error, MemStore, Outcome};
use proptest::prelude::*;

/// The shared harness, whose journal clock moves 10 ms before each catalogue change.
struct Catalogue(Harness);

impl std::ops::Deref for Catalogue {
    type Target = Harness;
    fn deref(&self) -> &Harness {
        &self.0
    }
}

impl std::ops::DerefMut for Catalogue {
    fn deref_mut(&mut self) -> &mut Harness {
        &mut self.0
    }
}

impl Catalogue {
    fn new() -> Self {
        let mut h = Harness::new();
        h.now_ms = 5_000;
        Self(h)
    }

    fn apply_as(&mut self, tenant: &str, change: TenantChange) -> Result<TenantRecord, Error> {
        self.now_ms += 10;
        match self
            .0
            .apply_as(tenant, Request::TenantChange(change))
            .outcome
        {
            Outcome::Tenant(r) => Ok(*r),
            Outcome::Failed(e) => Err(e),
            other => panic!("unexpected outcome {other:?}"),
        }
    }

    fn apply(&mut self, change: TenantChange) -> Result<TenantRecord, Error> {
        self.apply_as(SYSTEM_TENANT, change)
    }
}

fn change(name: &str, c: Change) -> TenantChange {
    TenantChange {
        name: name.into(),
        change: Some(c),
        ..Default::default()
    }
}

/// A delete that can be undone for `retention_ms` of journal time.
fn delete(name: &str, retention_ms: i64) -> TenantChange {
    TenantChange {
        retention_ms,
        ..change(name, Change::Delete(true))
    }
}

fn create(name: &str, shard: Option<u32>, shards: u32, uid: u8) -> TenantChange {
    TenantChange {
        uid: vec![uid; 16],
        shard,
        shards,
        ..change(name, Change::Create(TenantQuotas::default()))
    }
}

#[test]
fn create_places_records_and_refuses_what_etcd_users_would_not_expect() {
    let mut c = Catalogue::new();
    let a = c.apply(create("a", None, 3, 1)).unwrap();
    assert_eq!((a.shard, a.state), (0, TenantState::Active as i32));
    assert_eq!(
        (a.created_index, a.created_ms, a.uid),
        (1, 5_010, vec![1; 16])
    );
    assert_eq!(a.revision, 2, "one put, one revision");
    // Placement: the emptiest shard, the lowest of equals.
    assert_eq!(c.apply(create("b", None, 3, 2)).unwrap().shard, 1);
    assert_eq!(c.apply(create("c", Some(1), 3, 3)).unwrap().shard, 1);
    assert_eq!(c.apply(create("d", None, 3, 4)).unwrap().shard, 2);
    assert_eq!(c.apply(create("e", None, 3, 5)).unwrap().shard, 0);
    let dup = c.apply(create("a", None, 3, 9)).unwrap_err();
    assert_eq!(dup.to_string(), "strata: tenant a already exists");
    assert_eq!(dup.grpc_code(), Code::AlreadyExists);
    let bad = c.apply(create("Bad_Name", None, 3, 9)).unwrap_err();
    assert_eq!(bad.grpc_code(), Code::InvalidArgument);
    assert!(bad.to_string().contains("not a DNS label"), "{bad}");
    let reserved = c.apply(create(SYSTEM_TENANT, None, 3, 9)).unwrap_err();
    assert!(matches!(reserved, Error::TenantName(_)));
    let shard = c.apply(create("f", Some(3), 3, 9)).unwrap_err();
    assert_eq!(
        shard.to_string(),
        "strata: shard 3 is not one of the deployment's 3 shards"
    );
    let no_uid = c
        .apply(TenantChange {
            uid: vec![],
            ..create("f", None, 3, 0)
        })
        .unwrap_err();
    assert_eq!(no_uid.grpc_code(), Code::Unimplemented);
    // A refused change changes nothing: same names, same revision.
    let names: Vec<String> = c
        .store
        .tenant_records()
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(names, ["a", "b", "c", "d", "e"]);
    assert_eq!(c.store.revision(), 6);
}

#[test]
fn states_move_as_the_admin_api_says() {
    let mut c = Catalogue::new();
    c.apply(create("a", None, 1, 1)).unwrap();
    let q = TenantQuotas {
        requests_per_second: 100,
        watchers: 5,
        ..Default::default()
    };
    let r = c.apply(change("a", Change::UpdateQuotas(q))).unwrap();
    assert_eq!(r.quotas, Some(q));
    let neg = TenantQuotas {
        leases: -1,
        ..Default::default()
    };
    assert!(c.apply(change("a", Change::UpdateQuotas(neg))).is_err());
    let s = c.apply(change("a", Change::Suspended(true))).unwrap();
    assert_eq!(s.state, TenantState::Suspended as i32);
    let s = c.apply(change("a", Change::Suspended(false))).unwrap();
    assert_eq!(s.state, TenantState::Active as i32);
    let not_deleted = c.apply(change("a", Change::Undelete(true))).unwrap_err();
    assert_eq!(not_deleted.to_string(), "strata: tenant a is not deleted");
    assert_eq!(not_deleted.grpc_code(), Code::FailedPrecondition);
    let d = c.apply(delete("a", 60_000)).unwrap();
    assert_eq!(
        (d.state, d.deleted_ms, d.retention_ms),
        (TenantState::Deleted as i32, c.now_ms, 60_000)
    );
    for refused in [
        Change::Suspended(true),
        Change::Delete(true),
        Change::UpdateQuotas(q),
    ] {
        let e = c.apply(change("a", refused)).unwrap_err();
        assert_eq!(e.to_string(), "strata: tenant a is deleted");
    }
    let u = c.apply(change("a", Change::Undelete(true))).unwrap();
    assert_eq!(
        (u.state, u.deleted_ms, u.retention_ms, u.quotas),
        (TenantState::Active as i32, 0, 0, Some(q))
    );
    assert_eq!(u.uid, vec![1; 16], "undelete keeps the generation");
    let missing = c.apply(change("zz", Change::Suspended(true))).unwrap_err();
    assert_eq!(missing.to_string(), "strata: tenant zz not found");
    assert_eq!(missing.grpc_code(), Code::NotFound);
    // The record read back is the one the change answered.
    assert_eq!(c.store.tenant_record("a"), Some(u.clone()));

    // Past its retention (journal time), a deleted tenant cannot be undeleted: its compactor
    // may have purged it.
    c.apply(create("b", None, 1, 3)).unwrap();
    c.apply(delete("b", 25)).unwrap();
    assert!(!memstore::purgeable(
        &c.store.tenant_record("b").unwrap(),
        c.now_ms + 24
    ));
    assert!(memstore::purgeable(
        &c.store.tenant_record("b").unwrap(),
        c.now_ms + 25
    ));
    c.apply(change("zz", Change::Suspended(true))).unwrap_err(); // 10 ms pass
    c.apply(change("zz", Change::Suspended(true))).unwrap_err(); // 20 ms
    let late = c.apply(change("b", Change::Undelete(true))).unwrap_err(); // 30 ms
    assert!(
        late.to_string().contains("strata: tenant b is purged"),
        "{late}"
    );
    assert!(c.apply(delete("a", -1)).is_err(), "a negative retention");

    // Created again once deleted: a new generation (new uid, new creation, default quotas,
    // active), never the old one's uid; the old one cannot be undeleted any more.
    c.apply(delete("a", 60_000)).unwrap();
    let same_uid = c.apply(create("a", None, 1, 1)).unwrap_err();
    assert_eq!(same_uid.grpc_code(), Code::Unimplemented);
    let g = c.apply(create("a", None, 1, 2)).unwrap();
    assert_eq!(
        (g.uid.clone(), g.state),
        (vec![2; 16], TenantState::Active as i32)
    );
    assert_eq!(
        (g.created_index, g.quotas),
        (c.index, Some(TenantQuotas::default()))
    );
    assert_ne!(
        api::tenant::journal_key("a", &g.uid),
        api::tenant::journal_key("a", &u.uid)
    );
    assert!(c.apply(change("a", Change::Undelete(true))).is_err());
}

/// An admin call whose client gave up can still be appended, and land after a later call:
/// made for the record's revision it read, it is refused then and changes nothing.
#[test]
fn a_change_made_for_an_older_revision_of_the_record_is_refused() {
    let mut c = Catalogue::new();
    let guarded = |c: Change, at: i64| TenantChange {
        if_revision: Some(at),
        ..change("a", c)
    };
    let fresh = c
        .apply(TenantChange {
            if_revision: Some(0),
            ..create("a", None, 1, 1)
        })
        .unwrap();
    let late_suspend = guarded(Change::Suspended(true), fresh.revision);
    let resumed = c
        .apply(guarded(Change::Suspended(false), fresh.revision))
        .unwrap();
    let before = c.store.revision();
    let e = c.apply(late_suspend).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "strata: tenant a changed since revision {} (now at revision {})",
            fresh.revision, resumed.revision
        )
    );
    assert_eq!(e.grpc_code(), Code::Aborted);
    assert_eq!(c.store.revision(), before, "nothing changed");
    let r = c.store.tenant_record("a").unwrap();
    assert_eq!(
        (r.state, r.revision),
        (TenantState::Active as i32, resumed.revision)
    );
    // A create for a name's absence (0) is refused once it exists, and a new generation must
    // name the deleted record's revision.
    let twice = c
        .apply(TenantChange {
            if_revision: Some(0),
            ..create("a", None, 1, 2)
        })
        .unwrap_err();
    assert!(matches!(twice, Error::TenantChanged { now, .. } if now == resumed.revision));
    let deleted = c
        .apply(guarded(Change::Delete(true), resumed.revision))
        .unwrap();
    let stale = TenantChange {
        if_revision: Some(resumed.revision),
        ..create("a", None, 1, 3)
    };
    assert!(matches!(c.apply(stale), Err(Error::TenantChanged { .. })));
    let next = TenantChange {
        if_revision: Some(deleted.revision),
        ..create("a", None, 1, 3)
    };
    assert_eq!(c.apply(next).unwrap().uid, vec![3; 16]);
    // Without one, a change applies to whatever the record is (as before).
    assert!(c.apply(change("a", Change::Suspended(true))).is_ok());
}

#[test]
fn only_the_catalogue_applies_tenant_changes() {
    let mut c = Catalogue::new();
    let e = c.apply_as("a", create("b", None, 1, 1)).unwrap_err();
    assert_eq!(e.grpc_code(), Code::Unimplemented);
    assert!(c.store.tenant_records().is_empty());
    assert_eq!(c.store.revision(), 1);
}

#[test]
fn a_catalogue_change_is_an_event_for_its_watchers() {
    let mut h = Harness::new();
    let applied = h.apply_as(
        SYSTEM_TENANT,
        Request::TenantChange(create("a", None, 2, 7)),
    );
    assert_eq!(applied.events.len(), 1);
    let kv = applied.events[0].kv.as_ref().unwrap();
    assert_eq!(kv.key, b"/tenants/a");
    let r = api::tenant::decode_record(&kv.value, kv.mod_revision).unwrap();
    assert_eq!((r.name.as_str(), r.revision), ("a", 2));
}

/// The model: what each name's record should be.
#[derive(Clone, Debug, PartialEq)]
struct Model {
    shard: u32,
    state: TenantState,
    quotas: TenantQuotas,
    uid: u8,
    created_index: u64,
    /// Journal time after which a deleted tenant cannot be undeleted.
    purge_at: i64,
    /// The catalogue revision of the record's last change.
    revision: i64,
}

/// The `if_revision` a change carries: none, the record's revision as the model has it, or
/// another one (a change made for a record that has moved on since).
#[derive(Clone, Copy, Debug)]
enum Guard {
    None,
    Current,
    Stale(i64),
}

fn guard() -> impl Strategy<Value = Guard> {
    prop_oneof![
        2 => Just(Guard::None),
        2 => Just(Guard::Current),
        1 => prop_oneof![-3i64..0, 1i64..3].prop_map(Guard::Stale),
    ]
}

#[derive(Clone, Debug)]
enum Op {
    Create(usize, Option<u32>, u32, u8),
    Quotas(usize, i64),
    Suspend(usize, bool),
    Delete(usize, i64),
    Undelete(usize),
}

const NAMES: [&str; 5] = ["a", "b", "c-1", "d0", "e"];

fn op() -> impl Strategy<Value = Op> {
    let n = 0..NAMES.len();
    prop_oneof![
        (
            n.clone(),
            proptest::option::of(0u32..4),
            1u32..4,
            any::<u8>()
        )
            .prop_map(|(i, s, n, u)| Op::Create(i, s, n, u)),
        (n.clone(), -1i64..1000).prop_map(|(i, q)| Op::Quotas(i, q)),
        (n.clone(), any::<bool>()).prop_map(|(i, s)| Op::Suspend(i, s)),
        (n.clone(), 0i64..60).prop_map(|(i, r)| Op::Delete(i, r)),
        n.prop_map(Op::Undelete),
    ]
}

/// What the model expects of `op`: the new record, or None for a refusal.
fn model_step(model: &BTreeMap<&str, Model>, op: &Op, index: u64, now: i64) -> Option<Model> {
    let live = |m: &Model| m.state != TenantState::Deleted;
    match *op {
        Op::Create(i, shard, shards, uid) => {
            // A new name, or a deleted one's next generation (with another uid).
            if model.get(NAMES[i]).is_some_and(|m| live(m) || m.uid == uid) {
                return None;
            }
            let shard = match shard {
                Some(s) if s >= shards => return None,
                Some(s) => s,
                None => (0..shards)
                    .min_by_key(|s| model.values().filter(|m| live(m) && m.shard == *s).count())
                    .unwrap(),
            };
            Some(Model {
                shard,
                state: TenantState::Active,
                quotas: TenantQuotas::default(),
                uid,
                created_index: index,
                purge_at: 0,
                revision: 0,
            })
        }
        Op::Quotas(i, q) => {
            let m = model.get(NAMES[i]).filter(|m| live(m) && q >= 0)?;
            Some(Model {
                quotas: TenantQuotas {
                    watchers: q,
                    ..Default::default()
                },
                ..m.clone()
            })
        }
        Op::Suspend(i, s) => {
            let m = model.get(NAMES[i]).filter(|m| live(m))?;
            let state = if s {
                TenantState::Suspended
            } else {
                TenantState::Active
            };
            Some(Model { state, ..m.clone() })
        }
        Op::Delete(i, retention) => {
            let m = model.get(NAMES[i]).filter(|m| live(m))?;
            Some(Model {
                state: TenantState::Deleted,
                purge_at: now + retention,
                ..m.clone()
            })
        }
        Op::Undelete(i) => {
            let m = model
                .get(NAMES[i])
                .filter(|m| !live(m) && now < m.purge_at)?;
            Some(Model {
                state: TenantState::Active,
                ..m.clone()
            })
        }
    }
}

fn to_change(op: &Op) -> TenantChange {
    match *op {
        Op::Create(i, shard, shards, uid) => create(NAMES[i], shard, shards, uid),
        Op::Quotas(i, q) => change(
            NAMES[i],
            Change::UpdateQuotas(TenantQuotas {
                watchers: q,
                ..Default::default()
            }),
        ),
        Op::Suspend(i, s) => change(NAMES[i], Change::Suspended(s)),
        Op::Delete(i, retention) => delete(NAMES[i], retention),
        Op::Undelete(i) => change(NAMES[i], Change::Undelete(true)),
    }
}

fn matches_model(r: &TenantRecord, m: &Model) -> bool {
    r.shard == m.shard
        && r.state == m.state as i32
        && r.quotas == Some(m.quotas)
        && r.uid == vec![m.uid; 16]
        && r.created_index == m.created_index
        && (m.state != TenantState::Deleted || r.deleted_ms + r.retention_ms == m.purge_at)
        && r.revision == m.revision
}

proptest! {
    #[test]
    fn random_changes_agree_with_the_model(
        ops in proptest::collection::vec((op(), guard()), 1..60),
    ) {
        let mut c = Catalogue::new();
        let mut model: BTreeMap<&str, Model> = BTreeMap::new();
        for (op, guard) in &ops {
            let name = match *op {
                Op::Create(i, ..) | Op::Quotas(i, _) | Op::Suspend(i, _)
                | Op::Delete(i, _) | Op::Undelete(i) => NAMES[i],
            };
            let at = model.get(name).map_or(0, |m| m.revision);
            let if_revision = match *guard {
                Guard::None => None,
                Guard::Current => Some(at),
                Guard::Stale(off) => Some(at + off),
            };
            // A change made for another revision of the record is refused whatever it asks.
            let expected = match guard {
                Guard::Stale(_) => None,
                _ => model_step(&model, op, c.index + 1, c.now_ms + 10),
            };
            let before = c.store.revision();
            let got = c.apply(TenantChange { if_revision, ..to_change(op) });
            match (&expected, &got) {
                (Some(m), Ok(r)) => {
                    prop_assert_eq!(r.revision, before + 1);
                    let m = Model { revision: r.revision, ..m.clone() };
                    prop_assert!(matches_model(r, &m), "{op:?}: {r:?} vs {m:?}");
                    model.insert(name, m);
                }
                (None, Err(e)) => {
                    prop_assert_eq!(c.store.revision(), before);
                    if let Guard::Stale(_) = guard {
                        prop_assert_eq!(
                            e,
                            &Error::TenantChanged { name: name.into(), since: if_revision.unwrap(), now: at }
                        );
                    }
                }
                _ => prop_assert!(false, "{op:?}: expected {expected:?}, got {got:?}"),
            }
        }
        let check = |store: &MemStore| -> Result<(), TestCaseError> {
            let records = store.tenant_records();
            prop_assert_eq!(records.len(), model.len());
            for r in &records {
                let m = model.get(r.name.as_str()).expect("a modelled name");
                prop_assert!(matches_model(r, m), "{r:?} vs {m:?}");
            }
            Ok(())
        };
        check(&c.store)?;
        // A checkpoint carries the catalogue whole.
        let meta = CheckpointMeta {
            tenant: SYSTEM_TENANT.into(),
            shard: 0,
            index: c.store.applied_index(),
            revision: c.store.revision(),
            created_ms: c.now_ms,
        };
        let (_, loaded) = checkpoint::decode(&checkpoint::encode(&meta, &c.store)).unwrap();
        check(&loaded)?;
        prop_assert_eq!(loaded.tenant_records(), c.store.tenant_records());
    }
}

/// A tenant's own `TenantChange` sets its quotas (what the catalogue's followers append to the
/// tenant's shard): no revision, enforced by the apply, kept by checkpoints. Nothing else of
/// the catalogue is a tenant's to change.
#[test]
fn a_tenant_s_own_quotas_are_enforced_where_it_applies() {
    use api::etcdserverpb::{LeaseGrantRequest, PutRequest};
    let mut c = Harness::new();
    let apply = |c: &mut Harness, request: Request| c.apply(request).outcome;
    let quotas = |q: TenantQuotas| Request::TenantChange(change("t", Change::UpdateQuotas(q)));
    let grant = |id| Request::LeaseGrant(LeaseGrantRequest { id, ttl: 60 });
    let put = |v: usize| {
        Request::Put(PutRequest {
            key: b"k".to_vec(),
            value: vec![b'v'; v],
            ..Default::default()
        })
    };
    let q = TenantQuotas {
        leases: 1,
        stored_bytes: 4096,
        ..Default::default()
    };
    assert_eq!(apply(&mut c, quotas(q)), Outcome::Own);
    assert_eq!(c.store.revision(), 1, "quotas change no key");
    assert_eq!(c.store.tenant_quotas(), q);
    assert!(matches!(apply(&mut c, grant(1)), Outcome::LeaseGrant(_)));
    let Outcome::Failed(e) = apply(&mut c, grant(2)) else {
        panic!("a second lease over a quota of 1")
    };
    assert_eq!(e.to_string(), "strata: lease quota of 1 reached");
    assert_eq!(e.grpc_code(), Code::ResourceExhausted);
    assert!(matches!(apply(&mut c, put(100)), Outcome::Put(_)));
    assert_eq!(apply(&mut c, put(8000)), Outcome::Failed(Error::NoSpace));
    // Checkpoints carry them.
    let meta = CheckpointMeta {
        tenant: "t".into(),
        shard: 0,
        index: c.store.applied_index(),
        revision: c.store.revision(),
        created_ms: 1_000,
    };
    let (_, loaded) = checkpoint::decode(&checkpoint::encode(&meta, &c.store)).unwrap();
    assert_eq!(loaded.tenant_quotas(), q);
    // Lifted (0: the configuration's), the NOSPACE alarm the quota raised stays until it is
    // disarmed, as etcd's does; then a second lease and the large put go through.
    assert_eq!(apply(&mut c, quotas(TenantQuotas::default())), Outcome::Own);
    assert_eq!(apply(&mut c, grant(2)), Outcome::Failed(Error::NoSpace));
    let disarm = Request::Alarm(api::etcdserverpb::AlarmRequest {
        action: api::etcdserverpb::alarm_request::AlarmAction::Deactivate as i32,
        member_id: 0,
        alarm: api::etcdserverpb::AlarmType::Nospace as i32,
    });
    assert!(matches!(apply(&mut c, disarm), Outcome::Alarm(_)));
    assert!(matches!(apply(&mut c, grant(2)), Outcome::LeaseGrant(_)));
    assert!(matches!(apply(&mut c, put(8000)), Outcome::Put(_)));
    // Another tenant's quotas, or any other catalogue change, are not a tenant's to apply.
    let other = Request::TenantChange(change("u", Change::UpdateQuotas(q)));
    assert!(matches!(
        apply(&mut c, other),
        Outcome::Failed(Error::Unsupported(_))
    ));
    let create = Request::TenantChange(create("t", None, 1, 1));
    assert!(matches!(
        apply(&mut c, create),
        Outcome::Failed(Error::Unsupported(_))
    ));
    assert_eq!(c.store.tenant_quotas(), TenantQuotas::default());
}
