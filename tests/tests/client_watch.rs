//! The Watch service through the `etcd-client` crate: several watches on one stream, chosen and
//! generated ids, historical and future start revisions, prev_kv, filters, RequestProgress,
//! fragmentation, cancel, and a watch on a compacted revision — against Strata or etcd 3.4.

mod common;

use common::{WATCH_TIMEOUT, rev, start};
use etcd_client::{
    EventType, GetOptions, PutOptions, Txn, TxnOp, WatchFilterType, WatchOptions, WatchResponse,
    WatchStream,
};

/// The next response on a watch stream, failing the test after [`WATCH_TIMEOUT`].
async fn next(stream: &mut WatchStream) -> WatchResponse {
    tokio::time::timeout(WATCH_TIMEOUT, stream.message())
        .await
        .expect("watch response within the timeout")
        .expect("watch stream error")
        .expect("watch stream ended")
}

/// One event, flattened: (watch id, type, key, value, mod revision, prev value).
type Ev = (i64, &'static str, String, String, i64, Option<String>);

fn flatten(resp: &WatchResponse) -> Vec<Ev> {
    resp.events()
        .iter()
        .map(|e| {
            let kv = e.kv().expect("event kv");
            (
                resp.watch_id(),
                match e.event_type() {
                    EventType::Put => "PUT",
                    EventType::Delete => "DELETE",
                },
                String::from_utf8_lossy(kv.key()).into_owned(),
                String::from_utf8_lossy(kv.value()).into_owned(),
                kv.mod_revision(),
                e.prev_kv()
                    .map(|p| String::from_utf8_lossy(p.value()).into_owned()),
            )
        })
        .collect()
}

/// Reads responses until `n` events have arrived; panics on any cancel.
async fn events(stream: &mut WatchStream, n: usize) -> Vec<Ev> {
    let mut out = Vec::new();
    while out.len() < n {
        let r = next(stream).await;
        assert!(!r.canceled(), "watch cancelled: {:?}", r.cancel_reason());
        out.extend(flatten(&r));
    }
    assert_eq!(out.len(), n, "more events than expected: {out:?}");
    out
}

#[tokio::test]
async fn historical_live_prev_kv_and_revision_order() {
    let (_t, mut c) = start().await;
    let r1 = rev(c.put("h/a", "1", None).await.unwrap().header());
    c.put("h/b", "2", None).await.unwrap();
    c.put("h/a", "3", None).await.unwrap();
    c.delete("h/b", None).await.unwrap();
    c.put("other", "x", None).await.unwrap();

    let mut w = c
        .watch(
            "h/",
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(r1)
                    .with_prev_key(),
            ),
        )
        .await
        .unwrap();
    let created = next(&mut w).await;
    assert!(created.created());
    let id = created.watch_id();
    let got = events(&mut w, 4).await;
    let s = |v: &str| Some(v.to_string());
    assert_eq!(
        got,
        [
            (id, "PUT", "h/a".into(), "1".into(), r1, None),
            (id, "PUT", "h/b".into(), "2".into(), r1 + 1, None),
            (id, "PUT", "h/a".into(), "3".into(), r1 + 2, s("1")),
            (id, "DELETE", "h/b".into(), "".into(), r1 + 3, s("2")),
        ]
    );
    // Live events follow, in revision order; a txn's events share one revision.
    let t = c
        .txn(Txn::new().and_then([
            TxnOp::put("h/x", "tx1", None),
            TxnOp::put("h/y", "tx2", None),
            TxnOp::put("not-watched", "z", None),
        ]))
        .await
        .unwrap();
    let tr = rev(t.header());
    let got = events(&mut w, 2).await;
    assert_eq!(
        got,
        [
            (id, "PUT", "h/x".into(), "tx1".into(), tr, None),
            (id, "PUT", "h/y".into(), "tx2".into(), tr, None),
        ]
    );
    for i in 0..20 {
        c.put(format!("h/seq/{i:02}"), i.to_string(), None)
            .await
            .unwrap();
    }
    let got = events(&mut w, 20).await;
    for (i, e) in got.iter().enumerate() {
        assert_eq!(e.2, format!("h/seq/{i:02}"));
        assert_eq!(e.4, tr + 1 + i as i64, "one revision per put, in order");
    }
}

#[tokio::test]
async fn several_watches_on_one_stream_with_chosen_ids_filters_and_cancel() {
    let (_t, mut c) = start().await;
    let start_rev = rev(c.get("x", None).await.unwrap().header()) + 1;
    let mut w = c
        .watch(
            "a",
            Some(
                WatchOptions::new()
                    .with_watch_id(100)
                    .with_start_revision(start_rev),
            ),
        )
        .await
        .unwrap();
    let r = next(&mut w).await;
    assert!(r.created());
    assert_eq!(r.watch_id(), 100, "the client's chosen id is kept");
    w.watch(
        "b",
        Some(
            WatchOptions::new()
                .with_watch_id(200)
                .with_start_revision(start_rev)
                .with_filters([WatchFilterType::NoDelete]),
        ),
    )
    .await
    .unwrap();
    let r = next(&mut w).await;
    assert!(r.created());
    assert_eq!(r.watch_id(), 200);
    w.watch(
        "b",
        Some(
            WatchOptions::new()
                .with_watch_id(300)
                .with_start_revision(start_rev)
                .with_filters([WatchFilterType::NoPut]),
        ),
    )
    .await
    .unwrap();
    let r = next(&mut w).await;
    assert!(r.created());
    assert_eq!(r.watch_id(), 300);

    c.put("a", "1", None).await.unwrap();
    c.put("b", "2", None).await.unwrap();
    c.delete("b", None).await.unwrap();
    c.delete("a", None).await.unwrap();
    let mut got: Vec<(i64, &str, String)> = events(&mut w, 4)
        .await
        .into_iter()
        .map(|e| (e.0, e.1, e.2))
        .collect();
    // Per watch, events are in revision order; across watches the interleaving is free.
    got.sort_by_key(|e| e.0);
    assert_eq!(
        got,
        [
            (100, "PUT", "a".into()),
            (100, "DELETE", "a".into()),
            (200, "PUT", "b".into()),
            (300, "DELETE", "b".into()),
        ]
    );

    // A duplicate watch id is refused: created and cancelled at once, with id -1 as etcd does.
    w.watch("c", Some(WatchOptions::new().with_watch_id(100)))
        .await
        .unwrap();
    let r = next(&mut w).await;
    assert!(r.created() && r.canceled(), "{r:?}");
    assert_eq!(r.watch_id(), -1);
    assert_eq!(
        r.cancel_reason(),
        "mvcc: duplicate watch ID provided on the WatchStream"
    );

    // Cancel one; the others keep delivering.
    w.cancel(100).await.unwrap();
    let r = next(&mut w).await;
    assert!(r.canceled());
    assert_eq!(r.watch_id(), 100);
    c.put("a", "after-cancel", None).await.unwrap();
    c.put("b", "3", None).await.unwrap();
    let got = events(&mut w, 1).await;
    assert_eq!((got[0].0, got[0].2.as_str()), (200, "b"));

    // Without a chosen id, the server generates distinct ones.
    let mut w2 = c.watch("g", None).await.unwrap();
    let first = next(&mut w2).await;
    w2.watch("h", None).await.unwrap();
    let second = next(&mut w2).await;
    assert!(first.created() && second.created());
    assert_ne!(first.watch_id(), second.watch_id());
}

#[tokio::test]
async fn future_start_revision_and_request_progress() {
    let (_t, mut c) = start().await;
    let now = rev(c.put("f", "0", None).await.unwrap().header());
    // A watch starting two revisions ahead skips the next one.
    let mut w = c
        .watch("f", Some(WatchOptions::new().with_start_revision(now + 2)))
        .await
        .unwrap();
    assert!(next(&mut w).await.created());
    c.put("f", "1", None).await.unwrap();
    c.put("f", "2", None).await.unwrap();
    let got = events(&mut w, 1).await;
    assert_eq!((got[0].3.as_str(), got[0].4), ("2", now + 2));

    // RequestProgress: once the watcher is synced, a response with no events whose header
    // carries the current revision; not tied to any one watch (id -1).
    c.put("unrelated", "x", None).await.unwrap();
    let current = rev(c.get("unrelated", None).await.unwrap().header());
    w.request_progress().await.unwrap();
    let deadline = tokio::time::Instant::now() + WATCH_TIMEOUT;
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no progress notification"
        );
        let r = next(&mut w).await;
        assert!(r.events().is_empty(), "unexpected events {:?}", flatten(&r));
        assert!(!r.canceled() && !r.created());
        assert_eq!(r.watch_id(), -1);
        if rev(r.header()) == current {
            break;
        }
        // An older revision is allowed only while the watcher catches up; ask again.
        assert!(rev(r.header()) < current);
        w.request_progress().await.unwrap();
    }
}

#[tokio::test]
async fn compacted_start_revision_cancels_with_compact_revision() {
    let (_t, mut c) = start().await;
    let r1 = rev(c.put("k", "1", None).await.unwrap().header());
    c.put("k", "2", None).await.unwrap();
    let r3 = rev(c.put("k", "3", None).await.unwrap().header());
    c.compact(r3, None).await.unwrap();
    let mut w = c
        .watch("k", Some(WatchOptions::new().with_start_revision(r1)))
        .await
        .unwrap();
    // etcd answers created, then cancels with the compact revision (or both at once).
    let mut r = next(&mut w).await;
    if r.created() && !r.canceled() {
        r = next(&mut w).await;
    }
    assert!(r.canceled(), "{r:?}");
    assert_eq!(r.compact_revision(), r3);
    assert!(r.events().is_empty());
}

/// A watch starting exactly at the compact revision replays what the compaction kept there,
/// as etcd's does (only a start below it is compacted): the put made at it, without the value
/// before, then what came after.
#[tokio::test]
async fn watch_from_the_compacted_revision_itself() {
    let (_t, mut c) = start().await;
    c.put("k", "1", None).await.unwrap();
    c.put("k", "2", None).await.unwrap();
    let r3 = rev(c.put("k", "3", None).await.unwrap().header());
    let r4 = rev(c.delete("k", None).await.unwrap().header());
    c.compact(r3, None).await.unwrap();
    let mut w = c
        .watch(
            "k",
            Some(WatchOptions::new().with_start_revision(r3).with_prev_key()),
        )
        .await
        .unwrap();
    assert!(next(&mut w).await.created());
    let got = events(&mut w, 2).await;
    let id = got[0].0;
    assert_eq!(
        got,
        [
            (id, "PUT", "k".into(), "3".into(), r3, None),
            (
                id,
                "DELETE",
                "k".into(),
                String::new(),
                r4,
                Some("3".into())
            ),
        ]
    );
}

/// A delete made at the compact revision keeps its tombstone until a later compaction, so a
/// watch from there sees it: etcd's fix of its lost delete events (etcd-io/etcd#18089, fixed
/// by etcd-io/etcd#18274), which Strata follows. Debian's etcd 3.4.23 predates the fix and
/// skips the delete; against it the test accepts either.
#[tokio::test]
async fn watch_from_a_compact_revision_that_deleted_sees_the_delete() {
    let (t, mut c) = start().await;
    c.put("d", "1", None).await.unwrap();
    let rd = rev(c.delete("d", None).await.unwrap().header());
    c.compact(rd, None).await.unwrap();
    let rp = rev(c.put("d", "2", None).await.unwrap().header());
    let mut w = c
        .watch(
            "d",
            Some(WatchOptions::new().with_start_revision(rd).with_prev_key()),
        )
        .await
        .unwrap();
    assert!(next(&mut w).await.created());
    let r = next(&mut w).await;
    let id = r.watch_id();
    let delete = (id, "DELETE", "d".to_string(), String::new(), rd, None);
    let put = (id, "PUT", "d".to_string(), "2".to_string(), rp, None);
    let mut got = flatten(&r);
    if got.len() == 1 && got[0] == delete {
        got.extend(events(&mut w, 1).await);
    }
    match t.kind() {
        strata_tests::target::TargetKind::Strata => assert_eq!(got, [delete, put]),
        strata_tests::target::TargetKind::Etcd => assert!(
            got == [delete.clone(), put.clone()] || got == [put],
            "{got:?}"
        ),
    }
}

#[tokio::test]
async fn large_history_arrives_whole_with_and_without_fragmentation() {
    let (_t, mut c) = start().await;
    // Two ~1 MiB values in two revisions: one catch-up response would exceed 1.5 MiB.
    let value = vec![b'v'; 1024 * 1024];
    let r1 = rev(c.put("big/1", value.clone(), None).await.unwrap().header());
    c.put("big/2", value.clone(), None).await.unwrap();
    c.put("big/3", "small", None).await.unwrap();
    for fragment in [true, false] {
        let mut opts = WatchOptions::new().with_prefix().with_start_revision(r1);
        if fragment {
            opts = opts.with_fragment();
        }
        let mut w = c.watch("big/", Some(opts)).await.unwrap();
        assert!(next(&mut w).await.created());
        let got = events(&mut w, 3).await;
        assert_eq!(
            got.iter().map(|e| e.2.as_str()).collect::<Vec<_>>(),
            ["big/1", "big/2", "big/3"],
            "fragment={fragment}"
        );
        assert_eq!(got[0].3.len(), value.len());
        assert_eq!(got[1].3.len(), value.len());
    }
    // The data is intact for readers too.
    let all = c
        .get(
            "big/",
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await
        .unwrap();
    assert_eq!(all.count(), 3);
}

/// A lease of `ttl` seconds with `{prefix}a` = 1 and `{prefix}b` = 2 attached; answers the
/// lease and the revision of the first put.
async fn two_keys_on_a_lease(c: &mut etcd_client::Client, prefix: &str, ttl: i64) -> (i64, i64) {
    let lease = c.lease_grant(ttl, None).await.unwrap().id();
    let opts = || Some(PutOptions::new().with_lease(lease));
    let r = rev(c
        .put(format!("{prefix}a"), "1", opts())
        .await
        .unwrap()
        .header());
    c.put(format!("{prefix}b"), "2", opts()).await.unwrap();
    (lease, r)
}

/// A lease nobody keeps alive expires by itself: its keys are deleted in one revision, and a
/// watcher sees the deletes with their previous values; the lease and the keys are gone.
#[tokio::test]
async fn lease_expiry_produces_delete_events() {
    let (_t, mut c) = start().await;
    // The unleased key first: the expiry must come after every put of the test.
    c.put("lx/c", "kept", None).await.unwrap();
    let (lease, r) = two_keys_on_a_lease(&mut c, "lx/", 3).await;
    let mut w = c
        .watch(
            "lx/",
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(r + 2)
                    .with_prev_key(),
            ),
        )
        .await
        .unwrap();
    assert!(next(&mut w).await.created());
    let got = events(&mut w, 2).await;
    let expired_at = got[0].4;
    let mut seen: Vec<_> = got
        .iter()
        .map(|e| (e.1, e.2.clone(), e.4, e.5.clone()))
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            (
                "DELETE",
                "lx/a".to_string(),
                expired_at,
                Some("1".to_string())
            ),
            (
                "DELETE",
                "lx/b".to_string(),
                expired_at,
                Some("2".to_string())
            ),
        ],
        "an expiry deletes every key of the lease in one revision, with prev_kv"
    );
    assert!(expired_at > r + 1, "the expiry is a revision of its own");
    let left = c
        .get("lx/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    let keys: Vec<_> = left.kvs().iter().map(|kv| kv.key_str().unwrap()).collect();
    assert_eq!(keys, ["lx/c"]);
    let ttl = c.lease_time_to_live(lease, None).await.unwrap();
    assert_eq!(ttl.ttl(), -1, "an expired lease is gone");
}

#[tokio::test]
async fn lease_revoke_produces_delete_events() {
    let (_t, mut c) = start().await;
    let (lease, r) = two_keys_on_a_lease(&mut c, "lw/", 300).await;
    let mut w = c
        .watch(
            "lw/",
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(r + 2)
                    .with_prev_key(),
            ),
        )
        .await
        .unwrap();
    assert!(next(&mut w).await.created());
    let revoked = rev(c.lease_revoke(lease).await.unwrap().header());
    let got = events(&mut w, 2).await;
    let mut keys: Vec<_> = got.iter().map(|e| (e.1, e.2.clone(), e.4)).collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            ("DELETE", "lw/a".to_string(), revoked),
            ("DELETE", "lw/b".to_string(), revoked)
        ],
        "a revoke deletes every key of the lease in one revision"
    );
    assert!(got.iter().all(|e| e.5.is_some()), "prev_kv on deletes");
}

/// A watch request over gRPC's receive limit (etcd's --max-request-bytes plus 512 KiB) ends the
/// stream with grpc-go's refusal, as etcd's Watch returns the error its receive met, instead of
/// an end without a status.
#[tokio::test]
async fn an_oversized_watch_request_ends_the_stream_with_grpc_gos_refusal() {
    use api::etcdserverpb::watch_client::WatchClient;
    use api::etcdserverpb::watch_request::RequestUnion;
    use api::etcdserverpb::{WatchCreateRequest, WatchRequest};

    let (t, _c) = start().await;
    let mut client = WatchClient::connect(t.endpoint().to_string())
        .await
        .unwrap();
    let create = WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: vec![b'k'; 2_200_000],
            ..Default::default()
        })),
    };
    let status = tokio::time::timeout(WATCH_TIMEOUT, async {
        let mut stream = match client.watch(futures::stream::iter([create])).await {
            Ok(answer) => answer.into_inner(),
            Err(status) => return status,
        };
        loop {
            match stream.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("the stream ended without a status"),
                Err(status) => return status,
            }
        }
    })
    .await
    .expect("an answer within the timeout");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert_eq!(
        status.message(),
        "grpc: received message larger than max (2200010 vs. 2097152)"
    );
}
