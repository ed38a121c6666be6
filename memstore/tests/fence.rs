//! A tenant's own part of its catalogue record (`TenantChange::own` on the tenant's shard):
//! a suspended or deleted tenant's writes are refused where they are applied, whichever
//! frontend journalled them; a change from an older record revision cannot undo a newer one.
//! By example, and random sequences against a naive model through a checkpoint round trip.

mod common;

use api::etcdserverpb::{
    AlarmRequest, AuthEnableRequest, DeleteRangeRequest, LeaseGrantRequest, LeaseKeepAliveRequest,
    LeaseRevokeRequest, RangeRequest, RequestOp, TxnRequest, alarm_request::AlarmAction,
    request_op,
};
use api::strata::entry::{
    AuthChange, Entry, RestoreBegin, TenantChange, TenantOwn, TenantQuotas, auth_change,
    entry::Request, tenant_change::Change,
};
use api::strata::journal::{Record, record::Kind};
use common::{Harness, put, reload};
use memstore::{Code, Error, Outcome};
use proptest::prelude::*;

fn own(suspended: bool, deleted: bool, revision: i64) -> Request {
    Request::TenantChange(TenantChange {
        name: "t".into(),
        change: Some(Change::Own(TenantOwn {
            quotas: Some(TenantQuotas::default()),
            suspended,
            deleted,
            revision,
            name: "t".into(),
        })),
        ..Default::default()
    })
}

fn refusal(outcome: &Outcome) -> Option<&Error> {
    match outcome {
        Outcome::Failed(e @ Error::TenantState { .. }) => Some(e),
        _ => None,
    }
}

/// Every kind of write a client can journal.
fn writes() -> Vec<(&'static str, Request)> {
    let txn = TxnRequest {
        success: vec![RequestOp {
            request: Some(request_op::Request::RequestPut(put("k", "txn"))),
        }],
        ..Default::default()
    };
    vec![
        ("put", Request::Put(put("k", "2"))),
        (
            "delete",
            Request::DeleteRange(DeleteRangeRequest {
                key: b"k".to_vec(),
                ..Default::default()
            }),
        ),
        ("txn", Request::Txn(txn)),
        (
            "grant",
            Request::LeaseGrant(LeaseGrantRequest { id: 8, ttl: 60 }),
        ),
        ("revoke", Request::LeaseRevoke(LeaseRevokeRequest { id: 7 })),
        (
            "keep-alive",
            Request::LeaseKeepAlive(LeaseKeepAliveRequest { id: 7 }),
        ),
        (
            "auth",
            Request::Auth(AuthChange {
                change: Some(auth_change::Change::Enable(AuthEnableRequest {})),
            }),
        ),
    ]
}

/// The put record a frontend journals, applied through the replica's in-place path
/// (`apply_record`), which meets the refusal where every put does.
fn put_record(h: &mut Harness, value: &str) -> Outcome {
    h.index += 1;
    let entry = Entry {
        format_version: api::ENTRY_FORMAT_VERSION,
        tenant: "t".into(),
        request_id: vec![h.index as u8; 16],
        time_ms: h.now_ms,
        request: Some(Request::Put(put("k", value))),
        ..Default::default()
    };
    let record = Record {
        index: h.index,
        term: 1,
        time_ms: h.now_ms,
        kind: Some(Kind::Data(api::record::encode_entry(&entry))),
    };
    h.store
        .apply_record(record, "t")
        .expect("decodes")
        .applied
        .outcome
}

#[test]
fn a_suspended_or_deleted_tenant_s_writes_are_refused_where_they_are_applied() {
    let mut h = Harness::new();
    assert!(matches!(h.put("k", "1").outcome, Outcome::Put(_)));
    assert!(matches!(h.grant(7, 60).outcome, Outcome::LeaseGrant(_)));
    assert_eq!(h.apply(own(true, false, 10)).outcome, Outcome::Own);
    let revision = h.store.revision();
    for (what, request) in writes() {
        let outcome = h.apply(request).outcome;
        let e = refusal(&outcome).unwrap_or_else(|| panic!("{what}: {outcome:?}"));
        assert_eq!(e.to_string(), "strata: tenant t is suspended", "{what}");
        assert_eq!(e.grpc_code(), Code::FailedPrecondition, "{what}");
    }
    let outcome = put_record(&mut h, "record");
    assert!(refusal(&outcome).is_some(), "{outcome:?}");
    assert_eq!(h.store.revision(), revision, "nothing written");
    assert_eq!(h.get("k").unwrap().value, b"1");
    assert!(!h.store.auth_enabled());
    // Reads, compaction, alarms and a staged restore go on: they are the service's or the
    // owner's (Status and Snapshot stay open to a suspended tenant).
    let range = h.store.range(&RangeRequest {
        key: b"k".to_vec(),
        ..Default::default()
    });
    assert_eq!(range.unwrap().kvs.len(), 1);
    assert!(matches!(h.compact(revision).outcome, Outcome::Compact(_)));
    let alarms = Request::Alarm(AlarmRequest {
        action: AlarmAction::Get as i32,
        ..Default::default()
    });
    assert!(matches!(h.apply(alarms).outcome, Outcome::Alarm(_)));
    let begin = Request::RestoreBegin(RestoreBegin {
        restore_id: vec![1; 16],
        checkpoint_index: 0,
    });
    assert!(matches!(h.apply(begin).outcome, Outcome::Restore(_)));

    // A change from an older record (a frontend whose catalogue lags) cannot lift it.
    let Outcome::Failed(e) = h.apply(own(false, false, 9)).outcome else {
        panic!("an older record's change was applied");
    };
    assert_eq!(e.grpc_code(), Code::Aborted);
    assert!(h.store.tenant_own().suspended);
    // Quotas alone (as older builds journalled them) leave the suspension as it is.
    let quotas = TenantQuotas {
        leases: 5,
        ..Default::default()
    };
    let legacy = Request::TenantChange(TenantChange {
        name: "t".into(),
        change: Some(Change::UpdateQuotas(quotas)),
        ..Default::default()
    });
    assert_eq!(h.apply(legacy).outcome, Outcome::Own);
    assert_eq!(h.store.tenant_quotas(), quotas);
    assert!(refusal(&h.put("k", "3").outcome).is_some());

    // A checkpoint keeps the suspension.
    let loaded = reload(&h.store);
    assert!(loaded == h.store);
    h.store = loaded;
    assert!(refusal(&h.put("k", "4").outcome).is_some());

    // Deleted: refused as such; undeleted (the record's next revision): writes again.
    assert_eq!(h.apply(own(false, true, 11)).outcome, Outcome::Own);
    let outcome = h.put("k", "5").outcome;
    assert_eq!(
        refusal(&outcome).map(ToString::to_string).as_deref(),
        Some("strata: tenant t is deleted")
    );
    // The same revision again is applied (the record's quotas may have been synced late).
    assert_eq!(h.apply(own(false, true, 11)).outcome, Outcome::Own);
    assert_eq!(h.apply(own(false, false, 12)).outcome, Outcome::Own);
    assert!(matches!(h.put("k", "6").outcome, Outcome::Put(_)));
    assert!(matches!(put_record(&mut h, "7"), Outcome::Put(_)));
    assert_eq!(h.get("k").unwrap().value, b"7");
}

/// Only the tenant itself applies its own change, and the catalogue refuses one.
#[test]
fn an_own_change_is_only_the_tenant_s_own() {
    let mut h = Harness::new();
    let Outcome::Failed(e) = h.apply_as("u", own(true, false, 1)).outcome else {
        panic!("another tenant's own change was applied");
    };
    assert!(matches!(e, Error::Unsupported(_)), "{e:?}");
    assert!(!h.store.tenant_own().suspended);
    let mut system = Harness::new();
    let Outcome::Failed(e) = system
        .apply_as(api::tenant::SYSTEM_TENANT, own(true, false, 1))
        .outcome
    else {
        panic!("the catalogue applied a tenant's own change");
    };
    assert!(matches!(e, Error::Unsupported(_)), "{e:?}");
}

#[derive(Debug, Clone)]
enum Op {
    Own {
        suspended: bool,
        deleted: bool,
        revision: i64,
    },
    Put,
    Checkpoint,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => (any::<bool>(), any::<bool>(), 0i64..12).prop_map(|(suspended, deleted, revision)| {
            Op::Own {
                suspended,
                deleted,
                revision,
            }
        }),
        3 => Just(Op::Put),
        1 => Just(Op::Checkpoint),
    ]
}

proptest! {
    /// Random own changes (revisions in any order), puts and checkpoint round trips: the
    /// store takes a change exactly when its revision is not older than the last taken, and
    /// refuses a put exactly while the last taken says suspended or deleted.
    #[test]
    fn own_changes_and_writes_agree_with_the_model(ops in prop::collection::vec(op(), 1..80)) {
        let mut h = Harness::new();
        let (mut at, mut fenced, mut puts) = (0i64, false, 0i64);
        for op in &ops {
            match *op {
                Op::Own { suspended, deleted, revision } => {
                    let outcome = h.apply(own(suspended, deleted, revision)).outcome;
                    if revision >= at {
                        prop_assert_eq!(outcome, Outcome::Own);
                        at = revision;
                        fenced = suspended || deleted;
                    } else {
                        let refused = matches!(outcome, Outcome::Failed(Error::TenantChanged { .. }));
                        prop_assert!(refused, "{:?}", outcome);
                    }
                }
                Op::Put => {
                    let outcome = h.put("k", "v").outcome;
                    if fenced {
                        prop_assert!(refusal(&outcome).is_some(), "{:?}", outcome);
                    } else {
                        prop_assert!(matches!(outcome, Outcome::Put(_)), "{:?}", outcome);
                        puts += 1;
                    }
                }
                Op::Checkpoint => {
                    let loaded = reload(&h.store);
                    prop_assert!(loaded == h.store);
                    h.store = loaded;
                }
            }
            prop_assert_eq!(h.store.tenant_own().revision, at);
            prop_assert_eq!(h.store.revision(), 1 + puts);
        }
    }
}
