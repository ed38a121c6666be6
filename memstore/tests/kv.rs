//! etcd key-value semantics: revisions, versions, tombstones, ranges (limits, sort, filters,
//! revisions), txns (sub-revisions, nesting, overlap validation, compares), compaction, events.
mod common;

use api::etcdserverpb::{
    PutRequest, RangeRequest, TxnRequest, compare::CompareResult, range_request::SortOrder,
    range_request::SortTarget, response_op::Response,
};
use api::mvccpb::event::EventType;
use api::strata::entry::entry::Request;
use common::*;
use memstore::{Error, Outcome};

fn range(h: &Harness, r: RangeRequest) -> Result<api::etcdserverpb::RangeResponse, Error> {
    h.store.range(&r)
}

fn keys(resp: &api::etcdserverpb::RangeResponse) -> Vec<String> {
    resp.kvs
        .iter()
        .map(|kv| String::from_utf8(kv.key.clone()).unwrap())
        .collect()
}

fn txn(
    compare: Vec<api::etcdserverpb::Compare>,
    success: Vec<api::etcdserverpb::RequestOp>,
    failure: Vec<api::etcdserverpb::RequestOp>,
) -> TxnRequest {
    TxnRequest {
        compare,
        success,
        failure,
    }
}

#[test]
fn version_resets_after_delete_and_create_revision_moves() {
    let mut h = Harness::new();
    h.put("k", "a"); // rev 2
    h.put("k", "b"); // rev 3
    h.del("k", ""); // rev 4
    h.put("k", "c"); // rev 5
    let kv = h.get("k").unwrap();
    assert_eq!((kv.create_revision, kv.mod_revision, kv.version), (5, 5, 1));
    let old = h.get_at("k", 3).unwrap();
    assert_eq!(
        (old.create_revision, old.mod_revision, old.version),
        (2, 3, 2)
    );
    assert!(
        h.get_at("k", 4).is_none(),
        "tombstone hides the key at its revision"
    );
}

#[test]
fn put_returns_prev_kv_and_events_carry_prev_kv() {
    let mut h = Harness::new();
    h.put("k", "a");
    let a = h.apply(Request::Put(PutRequest {
        key: "k".into(),
        value: "b".into(),
        prev_kv: true,
        ..Default::default()
    }));
    let Outcome::Put(resp) = &a.outcome else {
        panic!("{a:?}")
    };
    assert_eq!(resp.header.as_ref().unwrap().revision, 3);
    assert_eq!(resp.prev_kv.as_ref().unwrap().value, b"a");
    assert_eq!(a.events.len(), 1);
    assert_eq!(a.events[0].prev_kv.as_ref().unwrap().value, b"a");
    assert_eq!(a.events[0].kv.as_ref().unwrap().version, 2);
    let d = h.del("k", "");
    assert_eq!(d.events[0].r#type, EventType::Delete as i32);
    let kv = d.events[0].kv.as_ref().unwrap();
    assert_eq!((kv.mod_revision, kv.version, kv.create_revision), (4, 0, 0));
    assert!(kv.value.is_empty());
}

#[test]
fn ignore_value_and_ignore_lease() {
    let mut h = Harness::new();
    h.grant(7, 60);
    h.apply(Request::Put(PutRequest {
        key: "k".into(),
        value: "v".into(),
        lease: 7,
        ..Default::default()
    }));
    h.apply(Request::Put(PutRequest {
        key: "k".into(),
        ignore_value: true,
        ignore_lease: true,
        ..Default::default()
    }));
    let kv = h.get("k").unwrap();
    assert_eq!(
        (kv.value.as_slice(), kv.lease, kv.version),
        (&b"v"[..], 7, 2)
    );
    // Both flags need an existing key.
    let a = h.apply(Request::Put(PutRequest {
        key: "missing".into(),
        ignore_value: true,
        ..Default::default()
    }));
    assert_eq!(failed(&a), Some(Error::KeyNotFound));
    // And refuse a value/lease alongside.
    let a = h.apply(Request::Put(PutRequest {
        key: "k".into(),
        value: "x".into(),
        ignore_value: true,
        ..Default::default()
    }));
    assert_eq!(failed(&a), Some(Error::ValueProvided));
    let a = h.apply(Request::Put(PutRequest {
        key: "k".into(),
        lease: 7,
        ignore_lease: true,
        ..Default::default()
    }));
    assert_eq!(failed(&a), Some(Error::LeaseProvided));
    assert_eq!(
        h.store.revision(),
        3,
        "failed puts do not move the revision"
    );
}

#[test]
fn range_forms_single_prefix_all_and_empty() {
    let mut h = Harness::new();
    for k in ["a", "b", "b1", "b2", "c"] {
        h.put(k, "v");
    }
    let r = |k: &str, e: &[u8]| RangeRequest {
        key: k.into(),
        range_end: e.to_vec(),
        ..Default::default()
    };
    assert_eq!(keys(&range(&h, r("b", b"")).unwrap()), ["b"]);
    assert_eq!(keys(&range(&h, r("b", b"c")).unwrap()), ["b", "b1", "b2"]);
    assert_eq!(
        keys(&range(&h, r("b", b"\0")).unwrap()),
        ["b", "b1", "b2", "c"]
    );
    assert_eq!(
        keys(&range(&h, r("\0", b"\0")).unwrap()),
        ["a", "b", "b1", "b2", "c"]
    );
    assert!(
        range(&h, r("c", b"b")).unwrap().kvs.is_empty(),
        "range_end <= key is empty"
    );
    assert_eq!(range(&h, r("", b"")), Err(Error::EmptyKey));
}

#[test]
fn limit_more_count_keys_only_count_only() {
    let mut h = Harness::new();
    for k in ["a", "b", "c", "d"] {
        h.put(k, "value");
    }
    let base = RangeRequest {
        key: "a".into(),
        range_end: "z".into(),
        ..Default::default()
    };
    let resp = range(
        &h,
        RangeRequest {
            limit: 2,
            ..base.clone()
        },
    )
    .unwrap();
    assert_eq!(
        (keys(&resp), resp.more, resp.count),
        (vec!["a".to_string(), "b".into()], true, 4)
    );
    let resp = range(
        &h,
        RangeRequest {
            limit: 4,
            ..base.clone()
        },
    )
    .unwrap();
    assert_eq!((resp.kvs.len(), resp.more), (4, false));
    let resp = range(
        &h,
        RangeRequest {
            limit: -1,
            ..base.clone()
        },
    )
    .unwrap();
    assert_eq!(resp.kvs.len(), 4, "a negative limit means no limit");
    let resp = range(
        &h,
        RangeRequest {
            keys_only: true,
            ..base.clone()
        },
    )
    .unwrap();
    assert!(
        resp.kvs
            .iter()
            .all(|kv| kv.value.is_empty() && kv.version == 1)
    );
    let resp = range(
        &h,
        RangeRequest {
            count_only: true,
            limit: 1,
            ..base.clone()
        },
    )
    .unwrap();
    assert_eq!((resp.kvs.len(), resp.count, resp.more), (0, 4, false));
    assert_eq!(resp.header.unwrap().revision, 5);
}

#[test]
fn sort_orders_and_targets() {
    let mut h = Harness::new();
    h.put("a", "3");
    h.put("b", "1");
    h.put("c", "2");
    h.put("b", "1"); // b: version 2, mod 5
    let base = RangeRequest {
        key: "a".into(),
        range_end: "z".into(),
        ..Default::default()
    };
    let sorted = |o: SortOrder, t: SortTarget| {
        keys(
            &range(
                &h,
                RangeRequest {
                    sort_order: o as i32,
                    sort_target: t as i32,
                    ..base.clone()
                },
            )
            .unwrap(),
        )
    };
    assert_eq!(sorted(SortOrder::Descend, SortTarget::Key), ["c", "b", "a"]);
    assert_eq!(
        sorted(SortOrder::Ascend, SortTarget::Value),
        ["b", "c", "a"]
    );
    assert_eq!(
        sorted(SortOrder::None, SortTarget::Value),
        ["b", "c", "a"],
        "a non-key target sorts ascending by default"
    );
    assert_eq!(sorted(SortOrder::Descend, SortTarget::Mod), ["b", "c", "a"]);
    assert_eq!(
        sorted(SortOrder::Ascend, SortTarget::Create),
        ["a", "b", "c"]
    );
    assert_eq!(
        sorted(SortOrder::Descend, SortTarget::Version),
        ["b", "a", "c"],
        "ties keep key order"
    );
    // Sort happens before the limit.
    let resp = range(
        &h,
        RangeRequest {
            sort_order: SortOrder::Descend as i32,
            limit: 1,
            ..base.clone()
        },
    )
    .unwrap();
    assert_eq!(
        (keys(&resp), resp.more, resp.count),
        (vec!["c".to_string()], true, 3)
    );
}

#[test]
fn min_max_filters_apply_before_limit_but_not_to_count() {
    let mut h = Harness::new();
    h.put("a", "1"); // 2
    h.put("b", "1"); // 3
    h.put("c", "1"); // 4
    h.put("a", "2"); // 5 (create 2)
    let base = RangeRequest {
        key: "a".into(),
        range_end: "z".into(),
        ..Default::default()
    };
    let resp = range(
        &h,
        RangeRequest {
            min_mod_revision: 4,
            ..base.clone()
        },
    )
    .unwrap();
    assert_eq!(
        (keys(&resp), resp.count),
        (vec!["a".to_string(), "c".into()], 3)
    );
    let resp = range(
        &h,
        RangeRequest {
            max_mod_revision: 3,
            ..base.clone()
        },
    )
    .unwrap();
    assert_eq!(keys(&resp), ["b"]);
    let resp = range(
        &h,
        RangeRequest {
            min_create_revision: 3,
            ..base.clone()
        },
    )
    .unwrap();
    assert_eq!(keys(&resp), ["b", "c"]);
    let resp = range(
        &h,
        RangeRequest {
            max_create_revision: 2,
            ..base.clone()
        },
    )
    .unwrap();
    assert_eq!(keys(&resp), ["a"]);
    let resp = range(
        &h,
        RangeRequest {
            min_mod_revision: 3,
            limit: 1,
            ..base.clone()
        },
    )
    .unwrap();
    assert_eq!((keys(&resp), resp.more), (vec!["a".to_string()], true));
    // A filtered point read still counts the key.
    let resp = range(
        &h,
        RangeRequest {
            key: "b".into(),
            min_mod_revision: 4,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!((resp.kvs.len(), resp.count), (0, 1));
}

#[test]
fn revision_reads_compacted_and_future() {
    let mut h = Harness::new();
    h.put("k", "1"); // 2
    h.put("k", "2"); // 3
    h.put("k", "3"); // 4
    let at = |h: &Harness, rev| {
        range(
            h,
            RangeRequest {
                key: "k".into(),
                revision: rev,
                ..Default::default()
            },
        )
    };
    assert_eq!(at(&h, 2).unwrap().kvs[0].value, b"1");
    assert_eq!(
        at(&h, 2).unwrap().header.unwrap().revision,
        4,
        "header carries the current revision"
    );
    assert_eq!(at(&h, 5), Err(Error::FutureRevision));
    assert!(at(&h, 1).unwrap().kvs.is_empty());
    let c = h.compact(3);
    assert!(matches!(c.outcome, Outcome::Compact(_)));
    assert_eq!(h.store.compact_revision(), 3);
    assert_eq!(at(&h, 2), Err(Error::Compacted));
    assert_eq!(
        at(&h, 3).unwrap().kvs[0].value,
        b"2",
        "the compact revision itself stays readable"
    );
    assert_eq!(failed(&h.compact(3)), Some(Error::Compacted));
    assert_eq!(failed(&h.compact(2)), Some(Error::Compacted));
    assert_eq!(failed(&h.compact(9)), Some(Error::FutureRevision));
    assert_eq!(
        h.store.revision(),
        4,
        "compaction does not move the revision"
    );
}

/// (etcd compact revision, reads at etcd revisions with their values, whether the key stays).
type CompactionRow = (i64, &'static [(i64, Option<&'static str>)], bool);

/// The worked example of etcd's key_index.go, one row per compaction (docs/memstore.md).
#[test]
fn key_index_compaction_worked_example() {
    // put(1.0); put(2.0); tombstone(3.0); put(4.0); tombstone(5.0) on "foo" — our store starts
    // at revision 1, so etcd's revision r is our r + 1: offset every revision by one.
    let build = || {
        let mut h = Harness::new();
        h.put("foo", "r1");
        h.put("foo", "r2");
        h.del("foo", "");
        h.put("foo", "r4");
        h.del("foo", "");
        h
    };
    // (etcd compact rev, revisions whose reads still work and their values)
    let rows: [CompactionRow; 5] = [
        (
            2,
            &[(2, Some("r2")), (3, None), (4, Some("r4")), (5, None)],
            true,
        ),
        (3, &[(3, None), (4, Some("r4")), (5, None)], true),
        (4, &[(4, Some("r4")), (5, None)], true),
        // The tombstone at the compact revision stays until a later compaction, as in etcd
        // since etcd-io/etcd#18274 (the example's "compact(5): {empty} {5.0(t)}").
        (5, &[(5, None)], true),
        (6, &[(6, None)], false),
    ];
    for (compact_at, reads, key_kept) in rows {
        let mut h = build();
        if compact_at == 6 {
            h.put("other", "x"); // etcd's revision 6 exists only after one more write
        }
        assert!(matches!(
            h.compact(compact_at + 1).outcome,
            Outcome::Compact(_)
        ));
        for &(rev, want) in reads {
            let got = h
                .get_at("foo", rev + 1)
                .map(|kv| String::from_utf8(kv.value).unwrap());
            assert_eq!(got.as_deref(), want, "compact({compact_at}) read at {rev}");
        }
        assert_eq!(
            range(
                &h,
                RangeRequest {
                    key: "foo".into(),
                    revision: compact_at,
                    ..Default::default()
                }
            ),
            Err(Error::Compacted)
        );
        // A key whose generations are all gone leaves no trace: its versions are freed.
        let versions_of_foo = h.store.stats().versions - u64::from(compact_at == 6);
        assert_eq!(versions_of_foo > 0, key_kept, "compact({compact_at})");
    }
}

#[test]
fn txn_sub_revisions_share_one_revision() {
    let mut h = Harness::new();
    h.put("c", "x"); // 2
    let a = h.txn(txn(
        vec![],
        vec![
            op_put("a", "1"),
            op_put("b", "1"),
            op_del("c", ""),
            op_get("a", ""),
        ],
        vec![],
    ));
    let Outcome::Txn(resp) = &a.outcome else {
        panic!("{a:?}")
    };
    assert!(resp.succeeded);
    assert_eq!(resp.header.as_ref().unwrap().revision, 3);
    assert_eq!(a.events.len(), 3);
    let types: Vec<i32> = a.events.iter().map(|e| e.r#type).collect();
    assert_eq!(
        types,
        [
            EventType::Put as i32,
            EventType::Put as i32,
            EventType::Delete as i32
        ]
    );
    assert!(
        a.events
            .iter()
            .all(|e| e.kv.as_ref().unwrap().mod_revision == 3)
    );
    // The range inside the txn sees the txn's own put.
    let Some(Response::ResponseRange(r)) = &resp.responses[3].response else {
        panic!()
    };
    assert_eq!(r.kvs[0].value, b"1");
    assert_eq!(r.header.as_ref().unwrap().revision, 3);
    // A read-only txn does not move the revision.
    let a = h.txn(txn(vec![], vec![op_get("a", "")], vec![]));
    assert_eq!(a.revision, 3);
}

/// The headers of a txn's own responses, as etcd's applier fills them: a put's is the revision
/// it wrote at; a delete's the revision written at if it or an earlier operation changed
/// something, else the revision read at; a range's the revision it read; a nested txn's has
/// no revision. (Found by `tests/tests/etcd_differential.rs` against etcd 3.4.)
#[test]
fn txn_operation_headers_carry_etcds_revisions() {
    let mut h = Harness::new();
    h.put("c", "x"); // 2
    let a = h.txn(txn(
        vec![],
        vec![
            op_get("a", ""),
            op_del("nothing", ""),
            op_put("a", "1"),
            op_del("nothing", ""),
            op_txn(txn(vec![], vec![op_get("a", "")], vec![])),
        ],
        vec![],
    ));
    let Outcome::Txn(resp) = &a.outcome else {
        panic!("{a:?}")
    };
    let revisions: Vec<Option<i64>> = resp
        .responses
        .iter()
        .map(|r| {
            let h = match r.response.as_ref().expect("a response") {
                Response::ResponseRange(r) => &r.header,
                Response::ResponseDeleteRange(r) => &r.header,
                Response::ResponsePut(r) => &r.header,
                Response::ResponseTxn(r) => &r.header,
            };
            h.as_ref().map(|h| h.revision)
        })
        .collect();
    assert_eq!(revisions, [Some(2), Some(2), Some(3), Some(3), Some(0)]);
    // Alone, a delete that deletes nothing answers the current revision.
    let a = h.del("nothing", "");
    let Outcome::DeleteRange(d) = &a.outcome else {
        panic!("{a:?}")
    };
    assert_eq!(d.header.as_ref().map(|h| h.revision), Some(3));
}

/// etcd checks every put of a write txn (its lease, its key for `ignore_value`) before any
/// range (compacted or future revision), whatever their order in the txn.
#[test]
fn txn_reports_a_put_fault_before_a_range_fault() {
    let mut h = Harness::new();
    h.put("a", "1"); // 2
    h.put("a", "2"); // 3
    h.compact(3);
    let mut stale = op_get("a", "");
    if let Some(api::etcdserverpb::request_op::Request::RequestRange(r)) = &mut stale.request {
        r.revision = 2;
    }
    let mut leased = op_put("b", "1");
    if let Some(api::etcdserverpb::request_op::Request::RequestPut(p)) = &mut leased.request {
        p.lease = 77;
    }
    let a = h.txn(txn(vec![], vec![stale.clone(), leased], vec![]));
    assert_eq!(failed(&a), Some(Error::LeaseNotFound));
    // With the put valid, the range's fault is the one reported.
    let a = h.txn(txn(vec![], vec![stale, op_put("b", "1")], vec![]));
    assert_eq!(failed(&a), Some(Error::Compacted));
}

/// A put that keeps the previous value or lease (`ignore_value`, `ignore_lease`) after a delete
/// of the rest of the keyspace in the same txn: etcd's overlap check lets it through (a delete
/// to the end counts as empty), and etcd 3.4 then panics applying it (found by
/// `tests/tests/etcd_differential.rs`). The txn is refused as such a put of a missing key is,
/// and changes nothing.
#[test]
fn txn_refuses_to_keep_the_value_of_a_key_it_deleted() {
    let mut h = Harness::new();
    h.put("a", "1"); // 2
    h.put("k", "2"); // 3
    let keep_value = |key: &str| {
        let mut op = op_put(key, "");
        if let Some(api::etcdserverpb::request_op::Request::RequestPut(p)) = &mut op.request {
            p.ignore_value = true;
        }
        op
    };
    let delete_from_a = op_del("a", "\0");
    let a = h.txn(txn(
        vec![],
        vec![delete_from_a.clone(), keep_value("k")],
        vec![],
    ));
    assert_eq!(failed(&a), Some(Error::KeyNotFound));
    assert_eq!(h.store.revision(), 3);
    assert_eq!(h.get("k").map(|kv| kv.value), Some(b"2".to_vec()));
    // Before the delete, or on a key the delete leaves, the put keeps the value.
    let a = h.txn(txn(vec![], vec![keep_value("a"), op_del("k", "")], vec![]));
    assert!(failed(&a).is_none(), "{a:?}");
    assert_eq!(h.get("a").map(|kv| kv.value), Some(b"1".to_vec()));
}

/// A put's two faults, a missing previous version and an unknown lease: alone, etcd reports
/// the lease; inside a txn, the key (`checkRequestPut` checks it first).
#[test]
fn put_fault_order_alone_and_in_a_txn() {
    let mut h = Harness::new();
    let both = || {
        let mut p = put("missing", "");
        p.ignore_value = true;
        p.lease = 77;
        p
    };
    let a = h.apply(Request::Put(both()));
    assert_eq!(failed(&a), Some(Error::LeaseNotFound));
    let op = api::etcdserverpb::RequestOp {
        request: Some(api::etcdserverpb::request_op::Request::RequestPut(both())),
    };
    let a = h.txn(txn(vec![], vec![op], vec![]));
    assert_eq!(failed(&a), Some(Error::KeyNotFound));
}

#[test]
fn txn_compares_single_key_missing_key_and_range_end() {
    let mut h = Harness::new();
    h.put("a1", "x");
    h.put("a2", "x");
    h.put("a2", "y");
    let succeeded = |h: &mut Harness, c| {
        let a = h.txn(txn(vec![c], vec![], vec![]));
        let Outcome::Txn(r) = a.outcome else {
            panic!("{a:?}")
        };
        r.succeeded
    };
    assert!(succeeded(
        &mut h,
        cmp_value("a1", CompareResult::Equal, "x")
    ));
    assert!(!succeeded(
        &mut h,
        cmp_value("a1", CompareResult::Greater, "x")
    ));
    assert!(succeeded(&mut h, cmp_value("a1", CompareResult::Less, "y")));
    assert!(succeeded(
        &mut h,
        cmp_value("a1", CompareResult::NotEqual, "y")
    ));
    // Missing key: version/create/mod/lease compare as 0; value compares always fail.
    assert!(succeeded(
        &mut h,
        cmp_version("zz", "", CompareResult::Equal, 0)
    ));
    assert!(!succeeded(
        &mut h,
        cmp_value("zz", CompareResult::NotEqual, "q")
    ));
    assert!(!succeeded(
        &mut h,
        cmp_value("zz", CompareResult::Equal, "")
    ));
    // With range_end every key must satisfy.
    assert!(succeeded(
        &mut h,
        cmp_version("a", "b", CompareResult::Greater, 0)
    ));
    assert!(!succeeded(
        &mut h,
        cmp_version("a", "b", CompareResult::Equal, 1)
    ));
    assert!(succeeded(
        &mut h,
        cmp_version("a", "\0", CompareResult::Less, 3)
    ));
    assert!(
        succeeded(&mut h, cmp_version("b", "c", CompareResult::Equal, 0)),
        "empty range compares as a missing key"
    );
}

#[test]
fn nested_txn_compares_see_the_state_before_the_txn() {
    let mut h = Harness::new();
    h.put("k", "old");
    let inner = txn(
        vec![cmp_value("k", CompareResult::Equal, "old")],
        vec![op_put("seen", "old")],
        vec![op_put("seen", "new")],
    );
    let a = h.txn(txn(vec![], vec![op_put("k", "new"), op_txn(inner)], vec![]));
    let Outcome::Txn(resp) = &a.outcome else {
        panic!("{a:?}")
    };
    let Some(Response::ResponseTxn(inner_resp)) = &resp.responses[1].response else {
        panic!()
    };
    assert!(inner_resp.succeeded);
    assert_eq!(h.get("seen").unwrap().value, b"old");
    assert_eq!(a.events.len(), 2);
}

#[test]
fn txn_overlap_validation_matches_etcd() {
    let mut h = Harness::new();
    let dup = |h: &mut Harness, t| failed(&h.txn(t)) == Some(Error::DuplicateKey);
    assert!(dup(
        &mut h,
        txn(vec![], vec![op_put("a", "1"), op_put("a", "2")], vec![])
    ));
    assert!(dup(
        &mut h,
        txn(vec![], vec![op_put("a", "1"), op_del("a", "")], vec![])
    ));
    assert!(dup(
        &mut h,
        txn(vec![], vec![op_del("a", "c"), op_put("b", "1")], vec![])
    ));
    assert!(dup(
        &mut h,
        txn(
            vec![],
            vec![
                op_del("a", ""),
                op_txn(txn(vec![], vec![op_put("a", "1")], vec![]))
            ],
            vec![]
        )
    ));
    assert!(dup(
        &mut h,
        txn(
            vec![],
            vec![
                op_put("a", "1"),
                op_txn(txn(vec![], vec![op_put("a", "1")], vec![]))
            ],
            vec![]
        )
    ));
    // Then/else of one nested txn are exclusive: the same key in both is fine.
    assert!(!dup(
        &mut h,
        txn(
            vec![],
            vec![op_txn(txn(
                vec![],
                vec![op_put("a", "1")],
                vec![op_put("a", "2")]
            ))],
            vec![]
        )
    ));
    // Top-level success and failure are checked separately.
    assert!(!dup(
        &mut h,
        txn(vec![], vec![op_put("a", "1")], vec![op_put("a", "2")])
    ));
    // Two deletes may overlap.
    assert!(!dup(
        &mut h,
        txn(vec![], vec![op_del("a", "c"), op_del("b", "")], vec![])
    ));
    // etcd quirks kept: a delete with range_end "\0" is an empty interval to the check, and a
    // put in one nested txn is not checked against a delete in a later sibling.
    assert!(!dup(
        &mut h,
        txn(vec![], vec![op_del("a", "\0"), op_put("b", "1")], vec![])
    ));
    h.put("k", "v");
    let rev = h.store.revision();
    let a = h.txn(txn(
        vec![],
        vec![
            op_txn(txn(vec![], vec![op_put("k", "2")], vec![])),
            op_txn(txn(vec![], vec![op_del("k", "")], vec![])),
        ],
        vec![],
    ));
    assert_eq!(a.revision, rev + 1);
    assert_eq!(
        a.events.len(),
        2,
        "put then delete of one key in one revision"
    );
    assert!(h.get("k").is_none());
    assert_eq!(h.store.events(rev + 1, b"k", b"", 10).unwrap(), a.events);
}

#[test]
fn txn_limits_and_empty_keys() {
    // etcd's default limit (a frontend's; the store applies up to `APPLY_MAX_TXN_OPS`).
    let mut h = Harness::with_config(memstore::Config {
        max_txn_ops: memstore::DEFAULT_MAX_TXN_OPS,
        ..memstore::Config::default()
    });
    let many: Vec<_> = (0..129).map(|i| op_put(&format!("k{i}"), "v")).collect();
    assert_eq!(
        failed(&h.txn(txn(vec![], many.clone(), vec![]))),
        Some(Error::TooManyOps)
    );
    assert!(!matches!(
        h.txn(txn(vec![], many[..128].to_vec(), vec![])).outcome,
        Outcome::Failed(_)
    ));
    assert_eq!(
        failed(&h.txn(txn(
            vec![cmp_value("", CompareResult::Equal, "")],
            vec![],
            vec![]
        ))),
        Some(Error::EmptyKey)
    );
    assert_eq!(
        failed(&h.txn(txn(vec![], vec![op_put("", "v")], vec![]))),
        Some(Error::EmptyKey)
    );
    assert_eq!(
        failed(&h.txn(txn(
            vec![],
            vec![api::etcdserverpb::RequestOp { request: None }],
            vec![]
        ))),
        Some(Error::KeyNotFound)
    );
    // Nested levels get the budget that the outer level leaves (etcd: maxTxnOps - opc).
    let inner: Vec<_> = (0..64).map(|i| op_put(&format!("n{i}"), "v")).collect();
    let outer: Vec<_> = (0..64)
        .map(|i| op_put(&format!("o{i}"), "v"))
        .chain([op_txn(txn(vec![], inner, vec![]))])
        .collect();
    assert_eq!(
        failed(&h.txn(txn(vec![], outer, vec![]))),
        Some(Error::TooManyOps)
    );
}

#[test]
fn failing_txn_changes_nothing() {
    let mut h = Harness::new();
    h.put("a", "1");
    let before = h.store.clone();
    // The put's lease does not exist: the whole txn fails, the first put included.
    let bad = api::etcdserverpb::RequestOp {
        request: Some(api::etcdserverpb::request_op::Request::RequestPut(
            PutRequest {
                key: "b".into(),
                lease: 99,
                ..Default::default()
            },
        )),
    };
    let a = h.txn(txn(vec![], vec![op_put("a", "2"), bad], vec![]));
    assert_eq!(failed(&a), Some(Error::LeaseNotFound));
    assert!(a.events.is_empty());
    assert_eq!(
        h.store.range(&RangeRequest {
            key: "\0".into(),
            range_end: "\0".into(),
            ..Default::default()
        }),
        before.range(&RangeRequest {
            key: "\0".into(),
            range_end: "\0".into(),
            ..Default::default()
        })
    );
    assert_eq!(h.store.revision(), before.revision());
    // Errors only count in the branch taken.
    let ok = h.txn(txn(
        vec![cmp_value("a", CompareResult::Equal, "1")],
        vec![op_put("c", "1")],
        vec![op_put("", "x")],
    ));
    assert_eq!(
        failed(&ok),
        Some(Error::EmptyKey),
        "request checks cover both branches"
    );
    let bad_else = api::etcdserverpb::RequestOp {
        request: Some(api::etcdserverpb::request_op::Request::RequestPut(
            PutRequest {
                key: "b".into(),
                lease: 99,
                ..Default::default()
            },
        )),
    };
    let ok = h.txn(txn(
        vec![cmp_value("a", CompareResult::Equal, "1")],
        vec![op_put("c", "1")],
        vec![bad_else],
    ));
    assert!(
        matches!(ok.outcome, Outcome::Txn(_)),
        "apply-time checks cover only the branch taken"
    );
    // A range at a future revision inside a txn fails the txn.
    let future = api::etcdserverpb::RequestOp {
        request: Some(api::etcdserverpb::request_op::Request::RequestRange(
            RangeRequest {
                key: "a".into(),
                revision: 100,
                ..Default::default()
            },
        )),
    };
    assert_eq!(
        failed(&h.txn(txn(vec![], vec![op_put("d", "1"), future], vec![]))),
        Some(Error::FutureRevision)
    );
}

#[test]
fn events_replay_history_without_splitting_revisions() {
    let mut h = Harness::new();
    h.put("a", "1"); // 2
    h.txn(txn(
        vec![],
        vec![op_put("a", "2"), op_put("b", "1")],
        vec![],
    )); // 3
    h.del("a", ""); // 4
    h.put("z", "1"); // 5
    let all = h.store.events(2, b"a", b"c", 100).unwrap();
    let revs: Vec<i64> = all
        .iter()
        .map(|e| e.kv.as_ref().unwrap().mod_revision)
        .collect();
    assert_eq!(revs, [2, 3, 3, 4]);
    assert_eq!(all[3].prev_kv.as_ref().unwrap().value, b"2");
    assert!(all[0].prev_kv.is_none());
    // max = 2 would split revision 3: stop after revision 2.
    assert_eq!(h.store.events(2, b"a", b"c", 2).unwrap().len(), 1);
    // max smaller than one revision still returns that whole revision.
    assert_eq!(h.store.events(3, b"a", b"c", 1).unwrap().len(), 2);
    assert_eq!(h.store.events(3, b"b", b"", 10).unwrap().len(), 1);
    h.compact(3);
    assert_eq!(h.store.events(2, b"a", b"c", 10), Err(Error::Compacted));
    // From the compact revision itself, as etcd: its changes are kept, without the values before.
    let from3 = h.store.events(3, b"a", b"c", 10).unwrap();
    let revs: Vec<(i64, bool)> = from3
        .iter()
        .map(|e| (e.kv.as_ref().unwrap().mod_revision, e.prev_kv.is_some()))
        .collect();
    assert_eq!(revs, [(3, false), (3, false), (4, true)]);
    assert_eq!(h.store.events(4, b"a", b"c", 10).unwrap().len(), 1);
    // A delete at the compact revision keeps its tombstone until a later compaction, so a
    // watch from there sees it (etcd since etcd-io/etcd#18274; 3.4.23 lost it).
    h.compact(4);
    let from4 = h.store.events(4, b"a", b"c", 10).unwrap();
    assert_eq!(from4.len(), 1);
    assert_eq!(from4[0].r#type, EventType::Delete as i32);
    assert_eq!(from4[0].kv.as_ref().unwrap().key, b"a");
    assert!(from4[0].prev_kv.is_none());
    assert_eq!(h.store.events(3, b"a", b"c", 10), Err(Error::Compacted));
    assert!(h.get_at("a", 4).is_none());
    assert_eq!(h.store.stats().versions, 3);
    h.compact(5);
    assert!(h.store.events(5, b"a", b"c", 10).unwrap().is_empty());
    assert_eq!(
        h.store.stats().versions,
        2,
        "a's tombstone went at the next compaction"
    );
}

#[test]
fn stale_index_is_ignored() {
    let mut h = Harness::new();
    h.put("a", "1");
    let entry = api::strata::entry::Entry {
        format_version: 1,
        tenant: "t".into(),
        request_id: vec![],
        time_ms: h.now_ms,
        request: Some(Request::Put(put("a", "2"))),
        ..Default::default()
    };
    let a = h.store.apply(1, &entry);
    assert_eq!(a.outcome, Outcome::Nothing);
    assert_eq!(h.get("a").unwrap().value, b"1");
    assert_eq!(h.store.applied_index(), 1);
}

#[test]
fn request_ids_are_applied_once_within_the_window() {
    let mut h = Harness::new();
    let id = vec![1u8; 16];
    let first = h.apply_with_id(Request::Put(put("a", "1")), id.clone());
    assert_eq!(first.revision, 2);
    h.put("a", "2");
    let again = h.apply_with_id(Request::Put(put("a", "1")), id.clone());
    assert_eq!(again.outcome, Outcome::Duplicate { revision: 2 });
    assert_eq!(h.get("a").unwrap().value, b"2");
    assert_eq!(h.store.applied_request(&id), Some(2));
    assert_eq!(h.store.applied_request(&[2u8; 16]), None);
    assert_eq!(h.store.applied_request(b"short id"), None);
    // Journal time moving in steps the replicas count in full (one longer gap counts as one
    // step only: checkpoint.rs, `a_stamping_gap_ages_the_request_id_window_by_one_step_only`).
    for _ in 0..memstore::DEFAULT_REQUEST_ID_WINDOW_MS / 1_000 {
        h.tick(1_000);
    }
    h.tick(1);
    assert_eq!(
        h.store.applied_request(&id),
        None,
        "outside the window the id is forgotten"
    );
    let later = h.apply_with_id(Request::Put(put("a", "1")), id);
    assert!(
        matches!(later.outcome, Outcome::Put(_)),
        "outside the window the id is forgotten"
    );
}

#[test]
fn hash_kv_is_consistent_and_revision_scoped() {
    let mut a = Harness::new();
    let mut b = Harness::new();
    for h in [&mut a, &mut b] {
        h.put("x", "1");
        h.put("y", "2");
        h.del("x", "");
    }
    assert_eq!(a.store.hash_kv(0).unwrap(), b.store.hash_kv(0).unwrap());
    let at3 = a.store.hash_kv(3).unwrap();
    a.put("z", "3");
    assert_eq!(
        a.store.hash_kv(3).unwrap(),
        at3,
        "later writes do not change an older hash"
    );
    assert_ne!(
        a.store.hash_kv(0).unwrap().hash,
        b.store.hash_kv(0).unwrap().hash
    );
    assert_eq!(at3.hash_revision, 3);
    assert_eq!(a.store.hash_kv(99), Err(Error::FutureRevision));
    a.compact(4);
    assert_eq!(a.store.hash_kv(3), Err(Error::Compacted));
    assert_eq!(a.store.hash_kv(0).unwrap().compact_revision, 4);
}

#[test]
fn stats_track_live_and_history_bytes() {
    let mut h = Harness::new();
    h.put("ab", "1234"); // 6 bytes
    h.put("ab", "12"); // 4 bytes
    let s = h.store.stats();
    assert_eq!(
        (s.keys, s.live_bytes, s.total_bytes, s.versions),
        (1, 4, 10, 2)
    );
    h.del("ab", "");
    let s = h.store.stats();
    assert_eq!(
        (s.keys, s.live_bytes, s.total_bytes, s.versions),
        (0, 0, 12, 3)
    );
    // Compacted at the delete's revision, the tombstone stays (a watch may start there).
    h.compact(h.store.revision());
    let s = h.store.stats();
    assert_eq!(
        (s.keys, s.live_bytes, s.total_bytes, s.versions),
        (0, 0, 2, 1)
    );
    h.put("c", "d");
    h.compact(h.store.revision());
    let s = h.store.stats();
    assert_eq!(
        (s.keys, s.live_bytes, s.total_bytes, s.versions),
        (1, 2, 2, 1)
    );
}
