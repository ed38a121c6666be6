//! Leases: grant (client or deterministic id), TTL bounds, revoke, keep-alive, expiry by
//! journal time, extension on a journal leader change, time-to-live and listing; alarms.
mod common;

use api::etcdserverpb::{
    AlarmRequest, AlarmType, LeaseGrantRequest, PutRequest, alarm_request::AlarmAction,
};
use api::mvccpb::event::EventType;
use api::strata::entry::entry::Request;
use common::*;
use memstore::{Config, Error, Outcome};

fn put_with_lease(h: &mut Harness, k: &str, lease: i64) -> memstore::Applied {
    h.apply(Request::Put(PutRequest {
        key: k.into(),
        value: "v".into(),
        lease,
        ..Default::default()
    }))
}

#[test]
fn grant_with_client_id_min_ttl_and_bounds() {
    let mut h = Harness::new();
    let Outcome::LeaseGrant(g) = h.grant(42, 1).outcome else {
        panic!()
    };
    assert_eq!(
        (g.id, g.ttl),
        (42, 2),
        "TTLs below the minimum are raised to it (etcd: 2 s)"
    );
    assert_eq!(h.store.revision(), 1, "granting does not move the revision");
    assert_eq!(failed(&h.grant(42, 10)), Some(Error::LeaseExists));
    assert_eq!(
        failed(&h.grant(43, memstore::MAX_LEASE_TTL_SECS + 1)),
        Some(Error::LeaseTtlTooLarge)
    );
    assert!(matches!(
        h.grant(44, memstore::MAX_LEASE_TTL_SECS).outcome,
        Outcome::LeaseGrant(_)
    ));
}

#[test]
fn generated_ids_are_deterministic_positive_and_unique() {
    let mut a = Harness::new();
    let mut b = Harness::new();
    let mut ids = Vec::new();
    for _ in 0..50 {
        let (Outcome::LeaseGrant(x), Outcome::LeaseGrant(y)) =
            (a.grant(0, 10).outcome, b.grant(0, 10).outcome)
        else {
            panic!()
        };
        assert_eq!(x.id, y.id);
        assert!(x.id > 0);
        ids.push(x.id);
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 50);
}

#[test]
fn revoke_deletes_attached_keys_in_one_revision() {
    let mut h = Harness::new();
    h.grant(1, 60);
    put_with_lease(&mut h, "b", 1); // 2
    put_with_lease(&mut h, "a", 1); // 3
    put_with_lease(&mut h, "c", 1); // 4
    h.put("c", "detached"); // 5: c leaves the lease
    let a = h.revoke(1);
    assert_eq!(a.revision, 6);
    let keys: Vec<_> = a
        .events
        .iter()
        .map(|e| (e.kv.as_ref().unwrap().key.clone(), e.r#type))
        .collect();
    assert_eq!(
        keys,
        [
            (b"a".to_vec(), EventType::Delete as i32),
            (b"b".to_vec(), EventType::Delete as i32)
        ]
    );
    assert!(h.get("c").is_some());
    assert_eq!(failed(&h.revoke(1)), Some(Error::LeaseNotFound));
    // A lease without keys goes without a revision.
    h.grant(2, 60);
    assert_eq!(h.revoke(2).revision, 6);
}

#[test]
fn put_with_unknown_lease_fails() {
    let mut h = Harness::new();
    assert_eq!(
        failed(&put_with_lease(&mut h, "k", 5)),
        Some(Error::LeaseNotFound)
    );
    assert_eq!(h.store.revision(), 1);
}

#[test]
fn expiry_by_journal_time_each_lease_its_own_revision() {
    let mut h = Harness::new();
    h.grant(1, 10);
    h.grant(2, 10);
    h.grant(3, 30);
    put_with_lease(&mut h, "k1", 1);
    put_with_lease(&mut h, "k2", 2);
    put_with_lease(&mut h, "k3", 3);
    assert_eq!(h.store.revision(), 4);
    assert!(h.pass(9_500).is_empty());
    let a = h.tick(500);
    assert_eq!(a.outcome, Outcome::Nothing);
    assert_eq!(a.events.len(), 2);
    assert_eq!(a.events[0].kv.as_ref().unwrap().mod_revision, 5);
    assert_eq!(a.events[1].kv.as_ref().unwrap().mod_revision, 6);
    assert_eq!(a.revision, 6);
    assert_eq!(h.store.lease_leases().leases.len(), 1);
    assert_eq!(
        h.store.lease_time_to_live(1, false),
        Err(Error::LeaseNotFound)
    );
}

#[test]
fn expiry_happens_before_the_request_in_the_same_entry() {
    let mut h = Harness::new();
    h.grant(1, 10);
    h.pass(9_500);
    h.now_ms += 500;
    let a = h.keep_alive(1);
    assert_eq!(
        failed(&a),
        Some(Error::LeaseNotFound),
        "the lease expired at this entry's time"
    );
}

#[test]
fn keep_alive_extends_and_time_to_live_reports() {
    let mut h = Harness::new();
    h.grant(1, 10);
    put_with_lease(&mut h, "k", 1);
    h.pass(6_500);
    let ttl = h.store.lease_time_to_live(1, true).unwrap();
    assert_eq!(
        (ttl.ttl, ttl.granted_ttl, ttl.keys),
        (3, 10, vec![b"k".to_vec()])
    );
    assert!(
        h.store
            .lease_time_to_live(1, false)
            .unwrap()
            .keys
            .is_empty()
    );
    let Outcome::LeaseKeepAlive(k) = h.keep_alive(1).outcome else {
        panic!()
    };
    assert_eq!((k.id, k.ttl), (1, 10));
    // Right after a keep-alive etcd answers TTL - 1 (the time left, truncated, some time later).
    assert_eq!(h.store.lease_time_to_live(1, false).unwrap().ttl, 9);
    h.tick(500);
    assert_eq!(h.store.lease_time_to_live(1, false).unwrap().ttl, 9);
    h.tick(500);
    assert_eq!(h.store.lease_time_to_live(1, false).unwrap().ttl, 8);
    h.pass(8_999);
    assert!(h.get("k").is_some());
    h.tick(1);
    assert!(h.get("k").is_none());
    assert_eq!(failed(&h.keep_alive(1)), Some(Error::LeaseNotFound));
}

#[test]
fn leader_change_extends_every_lease() {
    let config = Config {
        leader_change_extend_ms: 1_000,
        ..Config::default()
    };
    let mut h = Harness::with_config(config);
    h.grant(1, 10);
    put_with_lease(&mut h, "k", 1);
    h.pass(500);
    // The journal leader died. The new leader's LeaderChange entry carries the old leader's last
    // stamp (a Raft blank entry has no time of its own); its first own entry comes 15 s later,
    // past the lease's deadline. As etcd's new leader counts from its promotion, the lease then
    // has its whole TTL again.
    let a = h.leader_change(0);
    assert!(a.events.is_empty(), "a failover never expires a lease");
    let a = h.tick(15_000);
    assert!(a.events.is_empty(), "a failover never expires a lease");
    // Its whole TTL, as etcd answers it a moment after a keep-alive: 10 s left, 9 answered.
    assert_eq!(h.store.lease_time_to_live(1, false).unwrap().ttl, 9);
    assert!(h.pass(9_999).is_empty());
    assert!(h.get("k").is_some());
    let a = h.tick(1);
    assert_eq!(a.events.len(), 1);

    // A LeaderChange stamped late itself: the whole TTL and the extension from then on.
    let mut h = Harness::with_config(Config {
        leader_change_extend_ms: 1_000,
        ..Config::default()
    });
    h.grant(1, 10);
    h.pass(500);
    assert!(h.leader_change(15_000).events.is_empty());
    // 11 s left (TTL and extension), answered as etcd would a moment later: 10.
    assert_eq!(h.store.lease_time_to_live(1, false).unwrap().ttl, 10);
}

/// A journal that could not stamp entries for a while (no quorum, the same leader throughout: no
/// LeaderChange) does not age leases by the whole gap: only by one step of the lease clock.
#[test]
fn a_stamping_gap_ages_leases_by_one_step_only() {
    let mut h = Harness::new();
    h.grant(1, 5);
    put_with_lease(&mut h, "k", 1);
    h.pass(2_000);
    assert!(
        h.tick(20_000).events.is_empty(),
        "a stall expired the lease"
    );
    // 2 s before, 1 s of the gap: 2 s are left (answered as etcd would just after: 1).
    assert_eq!(h.store.lease_time_to_live(1, false).unwrap().ttl, 1);
    assert!(h.pass(1_999).is_empty());
    assert_eq!(h.tick(1).events.len(), 1);
    assert!(h.get("k").is_none());
}

#[test]
fn lease_state_survives_overwrite_and_delete() {
    let mut h = Harness::new();
    h.grant(1, 60);
    h.grant(2, 60);
    put_with_lease(&mut h, "k", 1);
    put_with_lease(&mut h, "k", 2);
    assert!(h.store.lease_time_to_live(1, true).unwrap().keys.is_empty());
    assert_eq!(h.store.lease_time_to_live(2, true).unwrap().keys.len(), 1);
    h.del("k", "");
    assert!(h.store.lease_time_to_live(2, true).unwrap().keys.is_empty());
    assert_eq!(h.revoke(2).events.len(), 0);
}

#[test]
fn alarms_nospace_blocks_puts_not_deletes() {
    let mut h = Harness::new();
    h.put("a", "1");
    let alarm = |action| alarm(action, 0, AlarmType::Nospace);
    let Outcome::Alarm(r) = h.apply(alarm(AlarmAction::Activate)).outcome else {
        panic!()
    };
    assert_eq!(r.alarms.len(), 1);
    assert_eq!(h.store.alarms().len(), 1);
    assert_eq!(failed(&h.put("b", "1")), Some(Error::NoSpace));
    assert_eq!(
        failed(&h.txn(api::etcdserverpb::TxnRequest {
            compare: vec![],
            success: vec![],
            failure: vec![op_put("x", "1")]
        })),
        Some(Error::NoSpace)
    );
    assert!(matches!(
        h.txn(api::etcdserverpb::TxnRequest {
            compare: vec![],
            success: vec![op_get("a", "")],
            failure: vec![]
        })
        .outcome,
        Outcome::Txn(_)
    ));
    assert_eq!(
        failed(&h.apply(Request::LeaseGrant(LeaseGrantRequest { ttl: 10, id: 0 }))),
        Some(Error::NoSpace)
    );
    assert!(matches!(h.del("a", "").outcome, Outcome::DeleteRange(_)));
    let Outcome::Alarm(r) = h
        .apply(Request::Alarm(AlarmRequest {
            action: AlarmAction::Get as i32,
            member_id: 0,
            alarm: 0,
        }))
        .outcome
    else {
        panic!()
    };
    assert_eq!(r.alarms.len(), 1);
    h.apply(alarm(AlarmAction::Deactivate));
    assert!(h.store.alarms().is_empty());
    assert!(matches!(h.put("b", "1").outcome, Outcome::Put(_)));
}

#[test]
fn quota_raises_nospace() {
    // 148 bytes of quota: the first put is charged 91 + 48.
    let mut h = Harness::with_config(Config {
        quota_bytes: 148,
        ..Config::default()
    });
    assert!(matches!(
        h.put("k", &"x".repeat(90)).outcome,
        Outcome::Put(_)
    ));
    let a = h.put("k2", &"x".repeat(20));
    assert_eq!(failed(&a), Some(Error::NoSpace));
    assert_eq!(h.store.alarms()[0].alarm, AlarmType::Nospace as i32);
    assert_eq!(h.store.revision(), 2, "the refused put changed nothing");
}

/// The quota charges every stored version 48 bytes besides its key and value (about what etcd's
/// backend spends on one), so tiny values meet NOSPACE near where etcd's would.
#[test]
fn quota_charges_each_version_besides_its_bytes() {
    let mut h = Harness::with_config(Config {
        quota_bytes: 1_000,
        ..Config::default()
    });
    // 3-byte keys, empty values: 51 bytes a version; 19 fit in 1,000.
    for i in 0..19 {
        assert!(
            matches!(h.put(&format!("k{i:02}"), "").outcome, Outcome::Put(_)),
            "put {i}"
        );
    }
    assert_eq!(h.store.stats().charged_bytes, 19 * 51);
    assert_eq!(
        h.store.stats().charged_live_bytes,
        19 * 51,
        "every version is live"
    );
    assert_eq!(failed(&h.put("k19", "")), Some(Error::NoSpace));
    assert_eq!(h.store.stats().versions, 19);
}

#[test]
fn unsupported_requests_fail_cleanly() {
    let mut h = Harness::new();
    let a = h.apply(Request::TenantChange(api::strata::entry::TenantChange {
        name: "t".into(),
        ..Default::default()
    }));
    assert!(matches!(failed(&a), Some(Error::Unsupported(_))));
    assert_eq!(h.store.revision(), 1);
}

/// While CORRUPT is raised every write, lease grant and revoke and compaction fails with
/// etcd's "etcdserver: corrupt cluster" (DataLoss) and changes nothing, before NOSPACE is
/// looked at; keep-alives and reads go on; disarmed, writes work again.
#[test]
fn corrupt_alarm_refuses_writes_until_disarmed() {
    let mut h = Harness::new();
    h.put("a", "1");
    h.grant(7, 60);
    let alarm = |action, kind| alarm(action, 3, kind);
    h.apply(alarm(AlarmAction::Activate, AlarmType::Nospace));
    h.apply(alarm(AlarmAction::Activate, AlarmType::Corrupt));
    let revision = h.store.revision();
    let corrupt = Some(Error::CorruptAlarm);
    assert_eq!(failed(&h.put("b", "1")), corrupt, "before NOSPACE");
    assert_eq!(failed(&h.del("a", "")), corrupt);
    assert_eq!(failed(&h.compact(revision)), corrupt);
    assert_eq!(failed(&h.grant(8, 60)), corrupt);
    assert_eq!(failed(&h.revoke(7)), corrupt);
    let write_txn = api::etcdserverpb::TxnRequest {
        compare: vec![],
        success: vec![op_get("a", "")],
        failure: vec![op_put("x", "1")],
    };
    assert_eq!(failed(&h.txn(write_txn)), corrupt);
    assert!(matches!(
        h.keep_alive(7).outcome,
        Outcome::LeaseKeepAlive(_)
    ));
    assert_eq!(h.store.revision(), revision, "nothing changed");
    assert_eq!(h.get("a").unwrap().value, b"1");
    let e = Error::CorruptAlarm;
    assert_eq!(
        (e.grpc_code(), e.grpc_message().as_str()),
        (memstore::Code::DataLoss, "etcdserver: corrupt cluster")
    );
    // Through a checkpoint the alarm stays.
    assert_eq!(reload(&h.store).alarms().len(), 2);
    h.apply(alarm(AlarmAction::Deactivate, AlarmType::Corrupt));
    assert_eq!(
        failed(&h.put("b", "1")),
        Some(Error::NoSpace),
        "NOSPACE is still raised"
    );
    h.apply(alarm(AlarmAction::Deactivate, AlarmType::Nospace));
    assert!(matches!(h.put("b", "1").outcome, Outcome::Put(_)));
}

/// While CORRUPT is raised a lease that runs out is not revoked (etcd's lessor proposes the
/// revoke and the corrupt applier refuses it): its key stays; disarmed, the next entry expires
/// it.
#[test]
fn corrupt_alarm_holds_lease_expiry_back() {
    let mut h = Harness::new();
    h.grant(7, 5);
    h.apply(Request::Put(PutRequest {
        key: b"leased".to_vec(),
        value: b"v".to_vec(),
        lease: 7,
        ..Default::default()
    }));
    let alarm = |action| alarm(action, 3, AlarmType::Corrupt);
    h.apply(alarm(AlarmAction::Activate));
    let expired = h.pass(10_000);
    assert!(expired.is_empty(), "{expired:?}");
    assert!(
        h.get("leased").is_some(),
        "the key outlives its lease under CORRUPT"
    );
    h.apply(alarm(AlarmAction::Deactivate));
    h.tick(100);
    assert!(
        h.get("leased").is_none(),
        "disarmed, the overdue lease expires"
    );
}

/// A mass expiry is spread as etcd's lessor spreads it (1,000 revokes a second of journal
/// time: an idle tick 500 ms after the last entry revokes 500, an entry 1 ms after the last at
/// least one), each lease in its own revision, earliest deadline (then lowest id) first. A lease
/// waiting overdue is not renewed by a keep-alive, and its time to live is negative, as etcd's.
#[test]
fn a_mass_expiry_is_spread_at_a_thousand_revokes_a_second() {
    const LEASES: i64 = 2_500;
    let mut h = Harness::new();
    for id in 1..=LEASES {
        h.grant(id, 10);
        put_with_lease(&mut h, &format!("k{id:05}"), id);
    }
    assert!(h.pass(9_500).is_empty());
    let first = h.tick(500);
    assert_eq!(
        first.events.len(),
        500,
        "the tick at the deadline revokes 500"
    );
    assert_eq!(first.revision, 1 + LEASES + 500, "one revision per lease");
    let revoked: Vec<_> = first
        .events
        .iter()
        .map(|e| e.kv.as_ref().unwrap().key.clone())
        .collect();
    assert_eq!(revoked.first().unwrap(), b"k00001");
    assert_eq!(revoked.last().unwrap(), b"k00500");
    h.now_ms += 1;
    let kept = h.keep_alive(LEASES);
    assert_eq!(
        failed(&kept),
        Some(Error::LeaseNotFound),
        "overdue: not renewed"
    );
    assert_eq!(kept.events.len(), 1, "an entry 1 ms later revokes one");
    assert_eq!(h.tick(499).events.len(), 499);
    assert_eq!(h.tick(500).events.len(), 500);
    let ttl = h.store.lease_time_to_live(LEASES, false).unwrap();
    assert_eq!(ttl.ttl, -1, "1 s overdue");
    assert!(h.get(&format!("k{LEASES:05}")).is_some(), "not revoked yet");
    assert_eq!(
        h.store.lease_leases().leases.len() as i64,
        LEASES - 500 - 1 - 499 - 500
    );
    assert_eq!(h.pass(1_000).len(), 1_000);
    assert!(h.store.lease_leases().leases.is_empty());
    assert!(h.get(&format!("k{LEASES:05}")).is_none());
}

/// An alarm request of `action` on `member_id`'s `kind` alarm.
fn alarm(action: AlarmAction, member_id: u64, kind: AlarmType) -> Request {
    Request::Alarm(AlarmRequest {
        action: action as i32,
        member_id,
        alarm: kind as i32,
    })
}
