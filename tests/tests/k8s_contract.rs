//! The Kubernetes storage contract (etcd's `client/v3/kubernetes` package, KEP-4743), exercised
//! the way kube-apiserver uses it: health Get, paginated List pinned to the first page's
//! revision, Count, OptimisticPut/OptimisticDelete, watch from revision+1 with prev_kv and
//! progress notifications, RequestProgress, and the compaction txn on `compact_rev_key`.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{WATCH_TIMEOUT, assert_status, connect, rev, start};
use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, KeyValue, PutOptions, Txn, TxnOp,
    TxnOpResponse, WatchOptions, WatchResponse, WatchStream,
};
use strata_tests::target::{Target, TargetOptions};
use tonic::Code;

/// Period of the server's progress notifications in this suite (kube-apiserver relies on
/// them to advance its watch cache; etcd's default is 10 minutes).
const PROGRESS_INTERVAL: Duration = Duration::from_millis(1000);
/// kube-apiserver's key for coordinating compaction between apiservers.
const COMPACT_REV_KEY: &str = "compact_rev_key";
/// kube-apiserver's health key (`/registry` prefix + `/health`).
const HEALTH_KEY: &str = "/registry/health";

/// A target whose watchers with `progress_notify` get a notification every [`PROGRESS_INTERVAL`].
async fn start_with_progress() -> (Target, Client) {
    let target = Target::start_with(&TargetOptions {
        progress_notify_interval: Some(PROGRESS_INTERVAL),
    })
    .await;
    let client = connect(target.endpoint()).await;
    (target, client)
}

/// `clientv3.GetPrefixRangeEnd`: the prefix with its last byte below 0xff incremented.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// `kubernetes.Client.Get`: one key at a revision (0 = latest), limit 1.
async fn k8s_get(c: &mut Client, key: &str, revision: i64) -> (i64, Option<KeyValue>) {
    let r = c
        .get(
            key,
            Some(GetOptions::new().with_revision(revision).with_limit(1)),
        )
        .await
        .unwrap();
    (rev(r.header()), r.kvs().first().cloned())
}

/// `kubernetes.Client.List`: one page of `[continue or prefix, prefix_end(prefix))`.
async fn k8s_list(
    c: &mut Client,
    prefix: &str,
    limit: i64,
    revision: i64,
    cont: Option<&[u8]>,
) -> (i64, i64, Vec<KeyValue>) {
    let start = cont.map(<[u8]>::to_vec).unwrap_or_else(|| prefix.into());
    let r = c
        .get(
            start,
            Some(
                GetOptions::new()
                    .with_range(prefix_end(prefix.as_bytes()))
                    .with_limit(limit)
                    .with_revision(revision),
            ),
        )
        .await
        .unwrap();
    (rev(r.header()), r.count(), r.kvs().to_vec())
}

/// `kubernetes.Client.Count`: prefix, count only.
async fn k8s_count(c: &mut Client, prefix: &str) -> i64 {
    let r = c
        .get(
            prefix,
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .unwrap();
    assert!(r.kvs().is_empty());
    r.count()
}

/// `kubernetes.Client.OptimisticPut` with GetOnFailure: (succeeded, revision, current kv on failure).
async fn optimistic_put(
    c: &mut Client,
    key: &str,
    value: &str,
    expected: i64,
    lease: i64,
) -> (bool, i64, Option<KeyValue>) {
    let r = c
        .txn(
            Txn::new()
                .when([Compare::mod_revision(key, CompareOp::Equal, expected)])
                .and_then([TxnOp::put(
                    key,
                    value,
                    Some(PutOptions::new().with_lease(lease)),
                )])
                .or_else([TxnOp::get(key, None)]),
        )
        .await
        .unwrap();
    (r.succeeded(), rev(r.header()), failure_kv(&r))
}

/// `kubernetes.Client.OptimisticDelete` with GetOnFailure.
async fn optimistic_delete(
    c: &mut Client,
    key: &str,
    expected: i64,
) -> (bool, i64, Option<KeyValue>) {
    let r = c
        .txn(
            Txn::new()
                .when([Compare::mod_revision(key, CompareOp::Equal, expected)])
                .and_then([TxnOp::delete(key, None)])
                .or_else([TxnOp::get(key, None)]),
        )
        .await
        .unwrap();
    (r.succeeded(), rev(r.header()), failure_kv(&r))
}

fn failure_kv(r: &etcd_client::TxnResponse) -> Option<KeyValue> {
    if r.succeeded() {
        return None;
    }
    match r.op_responses().first() {
        Some(TxnOpResponse::Get(g)) => g.kvs().first().cloned(),
        other => panic!("failure branch must answer the get: {other:?}"),
    }
}

async fn next(w: &mut WatchStream) -> WatchResponse {
    tokio::time::timeout(WATCH_TIMEOUT, w.message())
        .await
        .expect("watch response within the timeout")
        .expect("watch stream error")
        .expect("watch stream ended")
}

#[tokio::test]
async fn health_get_is_linearizable_across_clients() {
    let (t, mut c) = start().await;
    let (r0, kv) = k8s_get(&mut c, HEALTH_KEY, 0).await;
    assert!(kv.is_none(), "nobody writes the health key");
    assert!(r0 >= 1);
    // A write through another connection is visible to the next linearizable read.
    let mut other = connect(t.endpoint()).await;
    for i in 0..5 {
        let w = rev(other
            .put(format!("/registry/configmaps/default/c{i}"), "x", None)
            .await
            .unwrap()
            .header());
        let (r, _) = k8s_get(&mut c, HEALTH_KEY, 0).await;
        assert!(r >= w, "linearizable read at {r} after a write at {w}");
    }
}

#[tokio::test]
async fn paginated_list_pins_the_first_pages_revision_and_count() {
    let (_t, mut c) = start().await;
    let prefix = "/registry/pods/";
    for i in 0..25 {
        c.put(format!("{prefix}ns/pod-{i:02}"), format!("v{i}"), None)
            .await
            .unwrap();
    }
    c.put("/registry/podsecuritypolicies/x", "outside", None)
        .await
        .unwrap();
    c.put("/registry/pods", "the bare prefix key is outside", None)
        .await
        .unwrap();
    let expected: Vec<(Vec<u8>, Vec<u8>)> = (0..25)
        .map(|i| {
            (
                format!("{prefix}ns/pod-{i:02}").into_bytes(),
                format!("v{i}").into_bytes(),
            )
        })
        .collect();

    // Page 1 at the latest revision, then every later page pinned to it, while writes go on.
    let (pinned, count, page) = k8s_list(&mut c, prefix, 10, 0, None).await;
    assert_eq!(count, 25);
    assert_eq!(page.len(), 10);
    let mut listed: Vec<KeyValue> = page;
    let mut writes = 0;
    loop {
        // Concurrent changes after the pinned revision: none may show in later pages.
        c.put(format!("{prefix}ns/pod-{writes:02}"), "changed", None)
            .await
            .unwrap();
        c.put(format!("{prefix}ns/new-{writes:02}"), "new", None)
            .await
            .unwrap();
        c.delete(format!("{prefix}ns/pod-{:02}", 24 - writes), None)
            .await
            .unwrap();
        writes += 1;
        let mut cont = listed.last().unwrap().key().to_vec();
        cont.push(0);
        let (r, count, page) = k8s_list(&mut c, prefix, 10, pinned, Some(&cont)).await;
        assert!(r > pinned, "the header carries the current revision");
        let remaining = 25 - listed.len() as i64;
        assert_eq!(
            count, remaining,
            "count covers the rest of the range at the pin"
        );
        assert_eq!(page.len() as i64, remaining.min(10));
        listed.extend(page);
        if count <= 10 {
            break;
        }
    }
    let got: Vec<(Vec<u8>, Vec<u8>)> = listed
        .iter()
        .map(|kv| (kv.key().to_vec(), kv.value().to_vec()))
        .collect();
    assert_eq!(
        got, expected,
        "the pages together are the list at the pinned revision"
    );
    assert!(listed.iter().all(|kv| kv.mod_revision() <= pinned));

    // Count reflects the present; a list at the latest revision sees the changes.
    let now_count = k8s_count(&mut c, prefix).await;
    assert_eq!(writes, 2, "25 keys in pages of 10");
    assert_eq!(now_count, 25, "two deleted, two created since the pin");
    let (_, latest_count, _) = k8s_list(&mut c, prefix, 0, 0, None).await;
    assert_eq!(latest_count, now_count);
    assert_eq!(k8s_count(&mut c, "/registry/none/").await, 0);
}

/// The same over 3,000 keys in pages of 500, with keys deleted, created and overwritten all
/// over the range (behind and ahead of the next page) between pages: each page's count is the
/// rest of the range at the pinned revision, and the pages together are the range at the pin.
/// A store that counts from per-chunk live counts corrects them for the changes since the pin.
#[tokio::test]
async fn a_paginated_list_of_thousands_counts_at_its_pin_while_keys_change() {
    const KEYS: usize = 3_000;
    const PAGE: i64 = 500;
    let (_t, mut c) = start().await;
    let prefix = "/registry/pods/";
    let key = |i: usize| format!("{prefix}ns{}/pod-{i:05}", i % 7);
    for chunk in (0..KEYS).collect::<Vec<_>>().chunks(100) {
        let puts: Vec<TxnOp> = chunk
            .iter()
            .map(|&i| TxnOp::put(key(i), format!("v{i}"), None))
            .collect();
        c.txn(Txn::new().and_then(puts)).await.unwrap();
    }
    let mut expected: Vec<(Vec<u8>, Vec<u8>)> = (0..KEYS)
        .map(|i| (key(i).into_bytes(), format!("v{i}").into_bytes()))
        .collect();
    expected.sort();

    let (pinned, count, mut listed) = k8s_list(&mut c, prefix, PAGE, 0, None).await;
    assert_eq!(count, KEYS as i64);
    assert_eq!(listed.len() as i64, PAGE);
    let (mut deleted, mut created) = (0i64, 0i64);
    let mut round = 0;
    loop {
        // Changes after the pin, spread over the whole range: every 97th key from a moving
        // start deleted (if still there), a new key beside every 89th, every 83rd overwritten.
        // One txn per kind (a txn may not name a key twice); the overwrites come last, so
        // some re-create a key just deleted (a put without a previous key counts as created).
        let prev = || Some(PutOptions::new().with_prev_key());
        let deletes: Vec<TxnOp> = (round * 13..KEYS)
            .step_by(97)
            .map(|i| TxnOp::delete(key(i), None))
            .collect();
        let creates: Vec<TxnOp> = (round * 7..KEYS)
            .step_by(89)
            .map(|i| TxnOp::put(format!("{}-new{round}", key(i)), "new", prev()))
            .collect();
        let overwrites: Vec<TxnOp> = (round * 5..KEYS)
            .step_by(83)
            .map(|i| TxnOp::put(key(i), "changed", prev()))
            .collect();
        for ops in [deletes, creates, overwrites] {
            let r = c.txn(Txn::new().and_then(ops)).await.unwrap();
            for op in r.op_responses() {
                match op {
                    TxnOpResponse::Delete(d) => deleted += d.deleted(),
                    TxnOpResponse::Put(p) if p.prev_key().is_none() => created += 1,
                    _ => {}
                }
            }
        }
        round += 1;
        let mut cont = listed.last().unwrap().key().to_vec();
        cont.push(0);
        let (r, count, page) = k8s_list(&mut c, prefix, PAGE, pinned, Some(&cont)).await;
        assert!(r > pinned);
        let remaining = KEYS as i64 - listed.len() as i64;
        assert_eq!(
            count, remaining,
            "round {round}: the rest of the range at the pin"
        );
        assert_eq!(page.len() as i64, remaining.min(PAGE));
        listed.extend(page);
        if count <= PAGE {
            break;
        }
    }
    let got: Vec<(Vec<u8>, Vec<u8>)> = listed
        .iter()
        .map(|kv| (kv.key().to_vec(), kv.value().to_vec()))
        .collect();
    assert!(
        got == expected,
        "the pages together are the list at the pin"
    );
    assert!(deleted > 0 && created > 0);
    let now = k8s_count(&mut c, prefix).await;
    assert_eq!(now, KEYS as i64 - deleted + created);
    let (_, latest, _) = k8s_list(&mut c, prefix, PAGE, 0, None).await;
    assert_eq!(latest, now);
}

#[tokio::test]
async fn optimistic_put_and_delete_with_get_on_failure() {
    let (_t, mut c) = start().await;
    let key = "/registry/deployments/default/web";
    // Create: expected mod revision 0 means "must not exist".
    let (ok, created_rev, kv) = optimistic_put(&mut c, key, "v1", 0, 0).await;
    assert!(ok && kv.is_none());
    let (_, got) = k8s_get(&mut c, key, 0).await;
    let got = got.unwrap();
    assert_eq!((got.value(), got.mod_revision()), (&b"v1"[..], created_rev));
    // A second create fails and returns the current object.
    let (ok, r, kv) = optimistic_put(&mut c, key, "v1-again", 0, 0).await;
    assert!(!ok);
    assert_eq!(r, created_rev, "a failed txn does not move the revision");
    let kv = kv.expect("current object on failure");
    assert_eq!((kv.value(), kv.mod_revision()), (&b"v1"[..], created_rev));
    // Update at the right revision succeeds; at a stale one fails with the newer object.
    let (ok, updated_rev, _) = optimistic_put(&mut c, key, "v2", created_rev, 0).await;
    assert!(ok);
    assert_eq!(updated_rev, created_rev + 1);
    let (ok, _, kv) = optimistic_put(&mut c, key, "stale", created_rev, 0).await;
    assert!(!ok);
    assert_eq!(kv.unwrap().value(), b"v2");
    // With a lease (events, leases in kube-apiserver).
    let lease = c.lease_grant(3600, None).await.unwrap().id();
    let ev = "/registry/events/default/e1";
    let (ok, _, _) = optimistic_put(&mut c, ev, "event", 0, lease).await;
    assert!(ok);
    assert_eq!(k8s_get(&mut c, ev, 0).await.1.unwrap().lease(), lease);
    // Delete: stale fails with the current object, right revision deletes.
    let (ok, _, kv) = optimistic_delete(&mut c, key, created_rev).await;
    assert!(!ok);
    assert_eq!(kv.unwrap().mod_revision(), updated_rev);
    let (ok, deleted_rev, _) = optimistic_delete(&mut c, key, updated_rev).await;
    assert!(ok);
    assert!(k8s_get(&mut c, key, 0).await.1.is_none());
    // The object is still readable at its old revision until compaction.
    let (_, old) = k8s_get(&mut c, key, deleted_rev - 1).await;
    assert!(old.is_some());
    // Deleting a missing object: mod revision 0 matches "absent", and the get finds nothing.
    let (ok, _, kv) = optimistic_delete(&mut c, key, updated_rev).await;
    assert!(!ok && kv.is_none());
}

#[tokio::test]
async fn watch_from_list_revision_plus_one_with_prev_kv_and_request_progress() {
    let (_t, c) = start().await;
    watch_like_the_apiserver(c, false).await;
}

#[tokio::test]
async fn watch_from_list_revision_plus_one_with_periodic_progress_notifications() {
    let (_t, c) = start_with_progress().await;
    watch_like_the_apiserver(c, true).await;
}

/// List, then watch from the list's revision + 1 with prev_kv and progress_notify; check the
/// events, then (if `periodic`) an idle progress notification, then RequestProgress.
async fn watch_like_the_apiserver(mut c: Client, periodic: bool) {
    let prefix = "/registry/secrets/";
    c.put(format!("{prefix}a"), "a0", None).await.unwrap();
    c.put(format!("{prefix}b"), "b0", None).await.unwrap();
    // The apiserver lists, then watches from the list's revision + 1.
    let (list_rev, count, _) = k8s_list(&mut c, prefix, 0, 0, None).await;
    assert_eq!(count, 2);
    // Changes between the list and the watch must not be lost.
    c.put(format!("{prefix}a"), "a1", None).await.unwrap();
    let mut w = c
        .watch(
            prefix,
            Some(
                WatchOptions::new()
                    .with_range(prefix_end(prefix.as_bytes()))
                    .with_start_revision(list_rev + 1)
                    .with_prev_key()
                    .with_progress_notify(),
            ),
        )
        .await
        .unwrap();
    let created = next(&mut w).await;
    assert!(created.created());
    c.put(format!("{prefix}c"), "c0", None).await.unwrap();
    c.delete(format!("{prefix}b"), None).await.unwrap();
    c.put("/registry/other/x", "x", None).await.unwrap();
    let last = rev(c
        .put(format!("{prefix}c"), "c1", None)
        .await
        .unwrap()
        .header());

    let mut seen: Vec<(EventType, String, String, Option<String>, i64)> = Vec::new();
    while seen.len() < 4 {
        let r = next(&mut w).await;
        assert!(!r.canceled());
        for e in r.events() {
            let kv = e.kv().unwrap();
            seen.push((
                e.event_type(),
                String::from_utf8_lossy(kv.key()).into_owned(),
                String::from_utf8_lossy(kv.value()).into_owned(),
                e.prev_kv()
                    .map(|p| String::from_utf8_lossy(p.value()).into_owned()),
                kv.mod_revision(),
            ));
        }
    }
    let s = |v: &str| Some(v.to_string());
    let shape: Vec<_> = seen
        .iter()
        .map(|e| (e.0, e.1.as_str(), e.2.as_str(), e.3.clone()))
        .collect();
    assert_eq!(
        shape,
        [
            (EventType::Put, "/registry/secrets/a", "a1", s("a0")),
            (EventType::Put, "/registry/secrets/c", "c0", None),
            (EventType::Delete, "/registry/secrets/b", "", s("b0")),
            (EventType::Put, "/registry/secrets/c", "c1", s("c0")),
        ]
    );
    assert!(seen.windows(2).all(|p| p[0].4 < p[1].4), "revision order");
    assert_eq!(seen[0].4, list_rev + 1);
    assert_eq!(seen[3].4, last);

    // Periodic progress notifications while idle: no events, header at the latest revision.
    if periodic {
        let deadline = tokio::time::Instant::now() + WATCH_TIMEOUT;
        loop {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no progress notification while idle"
            );
            let r = next(&mut w).await;
            assert!(r.events().is_empty(), "no writes happened");
            if rev(r.header()) == last {
                break;
            }
        }
    }
    // RequestProgress (kube-apiserver's consistent reads from cache): answered on the stream.
    c.put("/registry/unwatched/y", "y", None).await.unwrap();
    let current = last + 1;
    w.request_progress().await.unwrap();
    let deadline = tokio::time::Instant::now() + WATCH_TIMEOUT;
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no progress for the request"
        );
        let r = next(&mut w).await;
        assert!(r.events().is_empty());
        if rev(r.header()) == current {
            break;
        }
        w.request_progress().await.unwrap();
    }
}

/// kube-apiserver's compactor: each apiserver runs `txn(version(compact_rev_key) == t) then
/// put(compact_rev_key, rev) else get(compact_rev_key)`, and only the winner calls Compact.
async fn compact_round(c: &mut Client, t: i64, compact_to: i64) -> (i64, i64, bool) {
    let r = c
        .txn(
            Txn::new()
                .when([Compare::version(COMPACT_REV_KEY, CompareOp::Equal, t)])
                .and_then([TxnOp::put(COMPACT_REV_KEY, compact_to.to_string(), None)])
                .or_else([TxnOp::get(COMPACT_REV_KEY, None)]),
        )
        .await
        .unwrap();
    let cur_rev = rev(r.header());
    if !r.succeeded() {
        let kv = failure_kv(&r).expect("compact_rev_key exists once a round won");
        return (kv.version(), cur_rev, false);
    }
    if compact_to != 0 {
        c.compact(compact_to, None).await.unwrap();
    }
    (t + 1, cur_rev, true)
}

#[tokio::test]
async fn compaction_coordinated_through_compact_rev_key() {
    let (t, mut a) = start().await;
    let mut b = connect(t.endpoint()).await;
    let key = "/registry/leases/kube-system/x";
    let first = rev(a.put(key, "1", None).await.unwrap().header());
    // Bootstrap round (rev 0): wins, nothing compacted.
    let (t_a, rev_a, won) = compact_round(&mut a, 0, 0).await;
    assert!(won);
    assert_eq!(t_a, 1);
    a.put(key, "2", None).await.unwrap();
    a.put(key, "3", None).await.unwrap();
    // Apiserver A compacts to the revision it saw in its last round.
    let (t_a, _, won) = compact_round(&mut a, t_a, rev_a).await;
    assert!(won);
    assert_eq!(t_a, 2);
    // Apiserver B, with a stale view (t = 1), loses and learns the current version.
    let (t_b, _, won) = compact_round(&mut b, 1, rev_a + 1).await;
    assert!(!won);
    assert_eq!(t_b, 2);
    // Reads below the compacted revision now fail as etcd's do.
    assert_status(
        a.get(key, Some(GetOptions::new().with_revision(first)))
            .await,
        Code::OutOfRange,
        "etcdserver: mvcc: required revision has been compacted",
    );
    // B's next round with the learned version wins.
    let latest = rev(a.get(key, None).await.unwrap().header());
    let (t_b, _, won) = compact_round(&mut b, t_b, latest).await;
    assert!(won);
    assert_eq!(t_b, 3);
    // A watch from before the compaction is cancelled with the compact revision.
    let mut w = a
        .watch(key, Some(WatchOptions::new().with_start_revision(first)))
        .await
        .unwrap();
    let mut r = next(&mut w).await;
    if r.created() && !r.canceled() {
        r = next(&mut w).await;
    }
    assert!(r.canceled());
    assert_eq!(r.compact_revision(), latest);
    // The data itself is intact.
    let values: BTreeMap<Vec<u8>, Vec<u8>> = a
        .get("/registry/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap()
        .kvs()
        .iter()
        .map(|kv| (kv.key().to_vec(), kv.value().to_vec()))
        .collect();
    assert_eq!(
        values.get(key.as_bytes()).map(Vec::as_slice),
        Some(&b"3"[..])
    );
}

/// kube-apiserver with etcd's auth (`--etcd-...` credentials): its user holds one role that
/// reads and writes `/registry/` and the compaction key, nothing else. The List+Watch flow and
/// the compaction round work as that user; a read outside its keys is denied.
#[tokio::test]
async fn the_apiserver_flow_as_a_user_limited_to_its_keys() {
    use etcd_client::{ConnectOptions, Permission};
    let (t, mut admin) = start().await;
    let perms = [
        Permission::read_write("/registry/").with_prefix(),
        Permission::read_write(COMPACT_REV_KEY),
    ];
    common::enable_auth(&mut admin, ("apiserver", "apiserverpw"), "kube", &perms).await;
    let as_user = |user: &str, password: &str| {
        ConnectOptions::new()
            .with_user(user, password)
            .with_timeout(common::REQUEST_TIMEOUT)
    };
    let endpoint = t.endpoint().to_string();
    let connect_as = |user: &'static str, password: &'static str| {
        let endpoint = endpoint.clone();
        async move {
            Client::connect([endpoint], Some(as_user(user, password)))
                .await
                .unwrap()
        }
    };
    watch_like_the_apiserver(connect_as("apiserver", "apiserverpw").await, false).await;
    let mut c = connect_as("apiserver", "apiserverpw").await;
    let (round, _, won) = compact_round(&mut c, 0, 0).await;
    assert!(won && round == 1);
    assert_status(
        c.get("/other", None).await,
        Code::PermissionDenied,
        "etcdserver: permission denied",
    );
    let mut root = connect_as("root", "rootpw").await;
    root.auth_disable().await.unwrap();
}
