//! The KV service through the `etcd-client` crate: Range, Put, DeleteRange, Txn and Compact with
//! every option, and etcd's error codes and messages, against Strata (default) or etcd 3.4.

mod common;

use common::{assert_status, rev, start};
use etcd_client::{
    CompactionOptions, Compare, CompareOp, DeleteOptions, GetOptions, PutOptions, SortOrder,
    SortTarget, Txn, TxnOp, TxnOpResponse,
};
use tonic::Code;

fn keys(kvs: &[etcd_client::KeyValue]) -> Vec<String> {
    kvs.iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .collect()
}

#[tokio::test]
async fn put_options_and_revisions() {
    let (_t, mut c) = start().await;
    let first = c.put("a", "1", None).await.unwrap();
    let r1 = rev(first.header());
    assert!(
        r1 >= 2,
        "a fresh store is at revision 1; the first put makes it 2"
    );
    assert!(first.prev_key().is_none());

    let second = c
        .put("a", "2", Some(PutOptions::new().with_prev_key()))
        .await
        .unwrap();
    assert_eq!(rev(second.header()), r1 + 1);
    let prev = second.prev_key().expect("prev_kv");
    assert_eq!((prev.key(), prev.value()), (&b"a"[..], &b"1"[..]));
    assert_eq!(prev.mod_revision(), r1);
    assert_eq!(prev.version(), 1);

    let got = c.get("a", None).await.unwrap();
    let kv = &got.kvs()[0];
    assert_eq!(kv.value(), b"2");
    assert_eq!(kv.create_revision(), r1);
    assert_eq!(kv.mod_revision(), r1 + 1);
    assert_eq!(kv.version(), 2);
    assert_eq!(kv.lease(), 0);

    // ignore_value keeps the value, ignore_lease keeps the lease.
    let lease = c.lease_grant(300, None).await.unwrap().id();
    c.put("leased", "v", Some(PutOptions::new().with_lease(lease)))
        .await
        .unwrap();
    c.put("leased", "", Some(PutOptions::new().with_ignore_lease()))
        .await
        .unwrap();
    let kv = c.get("leased", None).await.unwrap().kvs()[0].clone();
    assert_eq!((kv.value(), kv.lease()), (&b""[..], lease));
    c.put(
        "leased",
        "",
        Some(PutOptions::new().with_ignore_value().with_lease(lease)),
    )
    .await
    .unwrap();
    let kv = c.get("leased", None).await.unwrap().kvs()[0].clone();
    assert_eq!((kv.value(), kv.version()), (&b""[..], 3));
    c.put(
        "leased",
        "back",
        Some(PutOptions::new().with_ignore_lease()),
    )
    .await
    .unwrap();
    c.put("leased", "", Some(PutOptions::new().with_ignore_value()))
        .await
        .unwrap();
    // ignore_value alone keeps the value but sets the lease given (none): the key is detached.
    let kv = c.get("leased", None).await.unwrap().kvs()[0].clone();
    assert_eq!((kv.value(), kv.lease()), (&b"back"[..], 0));
}

#[tokio::test]
async fn put_errors_are_etcds() {
    let (_t, mut c) = start().await;
    assert_status(
        c.put("", "v", None).await,
        Code::InvalidArgument,
        "etcdserver: key is not provided",
    );
    assert_status(
        c.put("nokey", "", Some(PutOptions::new().with_ignore_value()))
            .await,
        Code::InvalidArgument,
        "etcdserver: key not found",
    );
    assert_status(
        c.put("k", "v", Some(PutOptions::new().with_ignore_value()))
            .await,
        Code::InvalidArgument,
        "etcdserver: value is provided",
    );
    assert_status(
        c.put(
            "k",
            "",
            Some(PutOptions::new().with_ignore_lease().with_lease(7)),
        )
        .await,
        Code::InvalidArgument,
        "etcdserver: lease is provided",
    );
    assert_status(
        c.put("k", "v", Some(PutOptions::new().with_lease(0x1234_5678)))
            .await,
        Code::NotFound,
        "etcdserver: requested lease not found",
    );
    // etcd's default --max-request-bytes is 1.5 MiB.
    let big = vec![b'x'; 1_600_000]; // over 1.5 MiB, under gRPC's own limit (+512 KiB)
    assert_status(
        c.put("big", big, None).await,
        Code::InvalidArgument,
        "etcdserver: request is too large",
    );
    // Over gRPC's own limit (the setting + 512 KiB): grpc-go's refusal, as etcd's.
    let huge = vec![b'x'; 2_200_000];
    assert_status(
        c.put("huge", huge, None).await,
        Code::ResourceExhausted,
        "grpc: received message larger than max (2200011 vs. 2097152)",
    );
    // None of the failures wrote anything.
    let all = c
        .get("", Some(GetOptions::new().with_all_keys()))
        .await
        .unwrap();
    assert_eq!(all.count(), 0, "{:?}", keys(all.kvs()));
    assert_eq!(
        rev(all.header()),
        1,
        "failed requests must not move the revision"
    );
}

#[tokio::test]
async fn range_options() {
    let (_t, mut c) = start().await;
    // Insertion order differs from key order, values differ from key order.
    for (k, v) in [
        ("r/b", "3"),
        ("r/a", "2"),
        ("r/c", "1"),
        ("s/x", "9"),
        ("r/a", "4"),
    ] {
        c.put(k, v, None).await.unwrap();
    }
    let first_rev = c.get("r/b", None).await.unwrap().kvs()[0].create_revision();

    let prefix = c
        .get("r/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_eq!(keys(prefix.kvs()), ["r/a", "r/b", "r/c"]);
    assert_eq!(prefix.count(), 3);
    assert!(!prefix.more());

    let range = c
        .get("r/a", Some(GetOptions::new().with_range("r/c")))
        .await
        .unwrap();
    assert_eq!(keys(range.kvs()), ["r/a", "r/b"]);
    let from = c
        .get("r/c", Some(GetOptions::new().with_from_key()))
        .await
        .unwrap();
    assert_eq!(keys(from.kvs()), ["r/c", "s/x"]);
    let all = c
        .get("", Some(GetOptions::new().with_all_keys()))
        .await
        .unwrap();
    assert_eq!(keys(all.kvs()), ["r/a", "r/b", "r/c", "s/x"]);

    let limited = c
        .get("r/", Some(GetOptions::new().with_prefix().with_limit(2)))
        .await
        .unwrap();
    assert_eq!(keys(limited.kvs()), ["r/a", "r/b"]);
    assert_eq!(limited.count(), 3);
    assert!(limited.more());

    let keys_only = c
        .get("r/", Some(GetOptions::new().with_prefix().with_keys_only()))
        .await
        .unwrap();
    assert!(keys_only.kvs().iter().all(|kv| kv.value().is_empty()));
    assert_eq!(keys_only.kvs()[0].version(), 2, "keys-only keeps metadata");

    let count_only = c
        .get(
            "r/",
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .unwrap();
    assert_eq!(count_only.count(), 3);
    assert!(count_only.kvs().is_empty());

    let sort = |t, o| Some(GetOptions::new().with_prefix().with_sort(t, o));
    let by = |r: etcd_client::GetResponse| keys(r.kvs());
    assert_eq!(
        by(c.get("r/", sort(SortTarget::Key, SortOrder::Descend))
            .await
            .unwrap()),
        ["r/c", "r/b", "r/a"]
    );
    assert_eq!(
        by(c.get("r/", sort(SortTarget::Value, SortOrder::Ascend))
            .await
            .unwrap()),
        ["r/c", "r/b", "r/a"]
    );
    assert_eq!(
        by(c.get("r/", sort(SortTarget::Create, SortOrder::Ascend))
            .await
            .unwrap()),
        ["r/b", "r/a", "r/c"]
    );
    assert_eq!(
        by(c.get("r/", sort(SortTarget::Mod, SortOrder::Descend))
            .await
            .unwrap()),
        ["r/a", "r/c", "r/b"]
    );
    assert_eq!(
        by(c.get("r/", sort(SortTarget::Version, SortOrder::Descend))
            .await
            .unwrap())[0],
        "r/a"
    );
    // Sorted and limited: etcd sorts the whole range, then cuts.
    assert_eq!(
        by(c.get(
            "r/",
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Key, SortOrder::Descend)
                    .with_limit(1)
            )
        )
        .await
        .unwrap()),
        ["r/c"]
    );

    // Historical reads.
    let old = c
        .get(
            "r/",
            Some(GetOptions::new().with_prefix().with_revision(first_rev + 1)),
        )
        .await
        .unwrap();
    assert_eq!(keys(old.kvs()), ["r/a", "r/b"]);
    assert_eq!(old.kvs()[0].value(), b"2");

    // Revision filters.
    let latest = rev(all.header());
    let modified_last = c
        .get(
            "",
            Some(
                GetOptions::new()
                    .with_all_keys()
                    .with_min_mod_revision(latest),
            ),
        )
        .await
        .unwrap();
    assert_eq!(keys(modified_last.kvs()), ["r/a"]);
    let created_first = c
        .get(
            "",
            Some(
                GetOptions::new()
                    .with_all_keys()
                    .with_max_create_revision(first_rev),
            ),
        )
        .await
        .unwrap();
    assert_eq!(keys(created_first.kvs()), ["r/b"]);
    let created_later = c
        .get(
            "",
            Some(
                GetOptions::new()
                    .with_all_keys()
                    .with_min_create_revision(first_rev + 1)
                    .with_max_mod_revision(first_rev + 3),
            ),
        )
        .await
        .unwrap();
    assert_eq!(keys(created_later.kvs()), ["r/c", "s/x"]);

    // Serializable reads see the same data.
    let ser = c
        .get("r/b", Some(GetOptions::new().with_serializable()))
        .await
        .unwrap();
    assert_eq!(ser.kvs()[0].value(), b"3");

    // Future revision and empty key errors.
    assert_status(
        c.get("r/a", Some(GetOptions::new().with_revision(latest + 10)))
            .await,
        Code::OutOfRange,
        "etcdserver: mvcc: required revision is a future revision",
    );
    assert_status(
        c.get("", None).await,
        Code::InvalidArgument,
        "etcdserver: key is not provided",
    );
}

#[tokio::test]
async fn delete_range_options() {
    let (_t, mut c) = start().await;
    for k in ["d/1", "d/2", "d/3", "e/1", "f/1"] {
        c.put(k, format!("v{k}"), None).await.unwrap();
    }
    let none = c.delete("missing", None).await.unwrap();
    assert_eq!(none.deleted(), 0);
    let one = c
        .delete("d/1", Some(DeleteOptions::new().with_prev_key()))
        .await
        .unwrap();
    assert_eq!(one.deleted(), 1);
    assert_eq!(one.prev_kvs()[0].value(), b"vd/1");
    let ranged = c
        .delete("d/2", Some(DeleteOptions::new().with_range("d/3")))
        .await
        .unwrap();
    assert_eq!(ranged.deleted(), 1);
    assert!(ranged.prev_kvs().is_empty(), "no prev_kv unless asked");
    let prefix = c
        .delete(
            "d/",
            Some(DeleteOptions::new().with_prefix().with_prev_key()),
        )
        .await
        .unwrap();
    assert_eq!(keys(prefix.prev_kvs()), ["d/3"]);
    let from = c
        .delete("f/", Some(DeleteOptions::new().with_from_key()))
        .await
        .unwrap();
    assert_eq!(from.deleted(), 1);
    let rest = c
        .get("", Some(GetOptions::new().with_all_keys()))
        .await
        .unwrap();
    assert_eq!(keys(rest.kvs()), ["e/1"]);
    // One revision per deleting request, none for a delete of nothing.
    let before = rev(rest.header());
    c.delete("nothing", None).await.unwrap();
    let del = c
        .delete("", Some(DeleteOptions::new().with_all_keys()))
        .await
        .unwrap();
    assert_eq!(del.deleted(), 1);
    assert_eq!(rev(del.header()), before + 1);
    assert_status(
        c.delete("", None).await,
        Code::InvalidArgument,
        "etcdserver: key is not provided",
    );
}

#[tokio::test]
async fn txn_compares_branches_and_limits() {
    let (_t, mut c) = start().await;
    let put = c.put("t", "1", None).await.unwrap();
    let created = rev(put.header());
    let lease = c.lease_grant(300, None).await.unwrap().id();
    c.put("leased", "x", Some(PutOptions::new().with_lease(lease)))
        .await
        .unwrap();

    // Every compare target, all true.
    let txn = Txn::new()
        .when([
            Compare::value("t", CompareOp::Equal, "1"),
            Compare::version("t", CompareOp::Equal, 1),
            Compare::create_revision("t", CompareOp::Equal, created),
            Compare::mod_revision("t", CompareOp::Less, created + 10),
            Compare::lease("leased", CompareOp::Equal, lease),
            Compare::version("missing", CompareOp::Equal, 0),
            Compare::value("t", CompareOp::NotEqual, "2"),
            Compare::create_revision("t", CompareOp::Greater, 0),
        ])
        .and_then([
            TxnOp::put("t", "2", Some(PutOptions::new().with_prev_key())),
            TxnOp::get("t", None),
            TxnOp::delete("leased", Some(DeleteOptions::new().with_prev_key())),
        ])
        .or_else([TxnOp::put("failed", "yes", None)]);
    let r = c.txn(txn).await.unwrap();
    assert!(r.succeeded());
    let ops = r.op_responses();
    assert_eq!(ops.len(), 3);
    match &ops[0] {
        TxnOpResponse::Put(p) => assert_eq!(p.prev_key().unwrap().value(), b"1"),
        other => panic!("{other:?}"),
    }
    match &ops[1] {
        TxnOpResponse::Get(g) => {
            // A txn's reads see its own earlier writes; the whole txn is one revision.
            assert_eq!(g.kvs()[0].value(), b"2");
            assert_eq!(g.kvs()[0].mod_revision(), rev(r.header()));
        }
        other => panic!("{other:?}"),
    }
    match &ops[2] {
        TxnOpResponse::Delete(d) => assert_eq!(d.deleted(), 1),
        other => panic!("{other:?}"),
    }
    assert_eq!(rev(r.header()), created + 2, "one txn, one revision");

    // A false compare runs the failure branch.
    let r = c
        .txn(
            Txn::new()
                .when([Compare::mod_revision("t", CompareOp::Equal, created)])
                .and_then([TxnOp::put("t", "never", None)])
                .or_else([TxnOp::get("t", None)]),
        )
        .await
        .unwrap();
    assert!(!r.succeeded());
    match &r.op_responses()[0] {
        TxnOpResponse::Get(g) => assert_eq!(g.kvs()[0].value(), b"2"),
        other => panic!("{other:?}"),
    }
    // Compare over a range: every key in it must match.
    c.put("p/1", "same", None).await.unwrap();
    c.put("p/2", "same", None).await.unwrap();
    let r = c
        .txn(Txn::new().when([Compare::value("p/", CompareOp::Equal, "same").with_prefix()]))
        .await
        .unwrap();
    assert!(r.succeeded());
    c.put("p/3", "other", None).await.unwrap();
    let r = c
        .txn(Txn::new().when([Compare::value("p/", CompareOp::Equal, "same").with_prefix()]))
        .await
        .unwrap();
    assert!(!r.succeeded());
    // Nested txn.
    let r = c
        .txn(
            Txn::new().and_then([TxnOp::txn(
                Txn::new()
                    .when([Compare::value("t", CompareOp::Equal, "2")])
                    .and_then([TxnOp::put("nested", "ok", None)]),
            )]),
        )
        .await
        .unwrap();
    match &r.op_responses()[0] {
        TxnOpResponse::Txn(inner) => assert!(inner.succeeded()),
        other => panic!("{other:?}"),
    }
    assert_eq!(c.get("nested", None).await.unwrap().kvs()[0].value(), b"ok");

    // Limits and validation.
    let too_many: Vec<TxnOp> = (0..129)
        .map(|i| TxnOp::put(format!("many/{i}"), "x", None))
        .collect();
    assert_status(
        c.txn(Txn::new().and_then(too_many)).await,
        Code::InvalidArgument,
        "etcdserver: too many operations in txn request",
    );
    let max: Vec<TxnOp> = (0..128)
        .map(|i| TxnOp::put(format!("many/{i}"), "x", None))
        .collect();
    c.txn(Txn::new().and_then(max)).await.unwrap();
    assert_status(
        c.txn(Txn::new().and_then([TxnOp::put("dup", "1", None), TxnOp::put("dup", "2", None)]))
            .await,
        Code::InvalidArgument,
        "etcdserver: duplicate key given in txn request",
    );
    assert_status(
        c.txn(Txn::new().and_then([
            TxnOp::put("dup/a", "1", None),
            TxnOp::delete("dup/", Some(DeleteOptions::new().with_prefix())),
        ]))
        .await,
        Code::InvalidArgument,
        "etcdserver: duplicate key given in txn request",
    );
    assert_status(
        c.txn(Txn::new().and_then([TxnOp::put("", "1", None)]))
            .await,
        Code::InvalidArgument,
        "etcdserver: key is not provided",
    );
    assert_eq!(
        c.get("dup", Some(GetOptions::new().with_prefix()))
            .await
            .unwrap()
            .count(),
        0
    );
}

#[tokio::test]
async fn compaction_and_compacted_reads() {
    let (_t, mut c) = start().await;
    let r1 = rev(c.put("c", "1", None).await.unwrap().header());
    c.put("c", "2", None).await.unwrap();
    let r3 = rev(c.put("c", "3", None).await.unwrap().header());
    c.compact(r3 - 1, None).await.unwrap();
    assert_status(
        c.get("c", Some(GetOptions::new().with_revision(r1))).await,
        Code::OutOfRange,
        "etcdserver: mvcc: required revision has been compacted",
    );
    let at = c
        .get("c", Some(GetOptions::new().with_revision(r3 - 1)))
        .await
        .unwrap();
    assert_eq!(at.kvs()[0].value(), b"2");
    assert_status(
        c.compact(r3 - 1, None).await,
        Code::OutOfRange,
        "etcdserver: mvcc: required revision has been compacted",
    );
    assert_status(
        c.compact(r3 + 100, None).await,
        Code::OutOfRange,
        "etcdserver: mvcc: required revision is a future revision",
    );
    let physical = c
        .compact(r3, Some(CompactionOptions::new().with_physical()))
        .await
        .unwrap();
    assert!(rev(physical.header()) >= r3);
    assert_eq!(c.get("c", None).await.unwrap().kvs()[0].value(), b"3");
    // Compaction does not create a revision visible to clients' writes.
    let next = rev(c.put("c", "4", None).await.unwrap().header());
    assert_eq!(next, r3 + 1);
}
