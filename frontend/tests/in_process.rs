//! The frontend served in-process over the in-memory journal (`MemLog`), driven by the
//! `etcd-client` crate: every KV, Lease, Cluster, Maintenance and Auth RPC, their options and
//! error codes, plus the HTTP side port. The multi-process suites over the real journal live in
//! `tests/tests/frontend_*.rs`.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    AlarmAction, AlarmType, Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions,
    LeaseTimeToLiveOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp, WatchOptions,
};
use frontend::log::MemLog;
use frontend::{Config, Frontend};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::Code;

const WAIT: Duration = Duration::from_secs(30);

struct Harness {
    log: MemLog,
    fe: Frontend,
    client: Client,
}

async fn start_with(config: Config, log: MemLog) -> Harness {
    let fe = Frontend::start_with_log(config, Arc::new(log.clone()))
        .await
        .expect("start frontend");
    let client = Client::connect([format!("http://{}", fe.client_addr)], None)
        .await
        .expect("connect");
    Harness { log, fe, client }
}

async fn start() -> Harness {
    start_with(Config::for_test(vec!["unused".into()]), MemLog::new()).await
}

fn code(e: etcd_client::Error) -> (Code, String) {
    match e {
        etcd_client::Error::GRpcStatus(s) => (s.code(), s.message().to_string()),
        other => panic!("expected a gRPC status, got {other:?}"),
    }
}

async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.unwrap();
    let status = buf[9..12].parse().unwrap();
    let body = buf.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

#[tokio::test]
async fn put_get_with_options() {
    let mut h = start().await;
    let c = &mut h.client;
    let r = c.put("a", "1", None).await.unwrap();
    let rev1 = r.header().unwrap().revision();
    assert_eq!(rev1, 2, "etcd starts at revision 1; the first put makes 2");
    c.put("b", "2", None).await.unwrap();
    c.put("c", "3", None).await.unwrap();
    let r = c
        .put("a", "4", Some(PutOptions::new().with_prev_key()))
        .await
        .unwrap();
    assert_eq!(r.prev_key().unwrap().value(), b"1");
    let header = r.header().unwrap();
    assert_ne!(header.cluster_id(), 0);
    assert_ne!(header.member_id(), 0);

    let r = c.get("a", None).await.unwrap();
    assert_eq!(r.kvs()[0].value(), b"4");
    assert_eq!(r.kvs()[0].version(), 2);
    assert_eq!(r.kvs()[0].create_revision(), rev1);

    // Historical read.
    let r = c
        .get("a", Some(GetOptions::new().with_revision(rev1)))
        .await
        .unwrap();
    assert_eq!(r.kvs()[0].value(), b"1");

    // Prefix/range, limit, sort, keys-only, count-only, serializable.
    let r = c
        .get("", Some(GetOptions::new().with_all_keys().with_limit(2)))
        .await
        .unwrap();
    assert_eq!(r.kvs().len(), 2);
    assert!(r.more());
    assert_eq!(r.count(), 3);
    let r = c
        .get(
            "",
            Some(
                GetOptions::new()
                    .with_all_keys()
                    .with_sort(SortTarget::Key, SortOrder::Descend),
            ),
        )
        .await
        .unwrap();
    let keys: Vec<_> = r.kvs().iter().map(|kv| kv.key().to_vec()).collect();
    assert_eq!(keys, vec![b"c".to_vec(), b"b".to_vec(), b"a".to_vec()]);
    let r = c
        .get("a", Some(GetOptions::new().with_prefix().with_keys_only()))
        .await
        .unwrap();
    assert!(r.kvs()[0].value().is_empty());
    let r = c
        .get(
            "",
            Some(GetOptions::new().with_all_keys().with_count_only()),
        )
        .await
        .unwrap();
    assert_eq!((r.count(), r.kvs().len()), (3, 0));
    let r = c
        .get("b", Some(GetOptions::new().with_serializable()))
        .await
        .unwrap();
    assert_eq!(r.kvs()[0].value(), b"2");

    // Delete with prev_kv and a range.
    let r = c
        .delete("a", Some(DeleteOptions::new().with_prev_key()))
        .await
        .unwrap();
    assert_eq!(r.deleted(), 1);
    assert_eq!(r.prev_kvs()[0].value(), b"4");
    let r = c
        .delete("b", Some(DeleteOptions::new().with_range("d")))
        .await
        .unwrap();
    assert_eq!(r.deleted(), 2);
    let r = c
        .get("", Some(GetOptions::new().with_all_keys()))
        .await
        .unwrap();
    assert_eq!(r.count(), 0);
    h.fe.stop().await.unwrap();
}

#[tokio::test]
async fn txn_compare_and_swap() {
    let mut h = start().await;
    let c = &mut h.client;
    let put = c.put("k", "v1", None).await.unwrap();
    let mod_rev = put.header().unwrap().revision();
    let txn = Txn::new()
        .when([Compare::mod_revision("k", CompareOp::Equal, mod_rev)])
        .and_then([TxnOp::put("k", "v2", None)])
        .or_else([TxnOp::get("k", None)]);
    let r = c.txn(txn.clone()).await.unwrap();
    assert!(r.succeeded());
    // Same txn again: the mod revision moved, so the failure branch runs and reads.
    let r = c.txn(txn).await.unwrap();
    assert!(!r.succeeded());
    match &r.op_responses()[0] {
        etcd_client::TxnOpResponse::Get(g) => assert_eq!(g.kvs()[0].value(), b"v2"),
        other => panic!("expected a get, got {other:?}"),
    }
    let r = c
        .txn(
            Txn::new()
                .when([
                    Compare::value("k", CompareOp::Equal, "v2"),
                    Compare::version("k", CompareOp::Equal, 2),
                    Compare::create_revision("k", CompareOp::Equal, mod_rev),
                ])
                .and_then([TxnOp::delete("k", None)]),
        )
        .await
        .unwrap();
    assert!(r.succeeded());
    assert_eq!(c.get("k", None).await.unwrap().count(), 0);
    h.fe.stop().await.unwrap();
}

#[tokio::test]
async fn bad_requests_get_etcd_errors_and_change_nothing() {
    let mut h = start().await;
    let c = &mut h.client;
    let before = h.log.last_index();

    let (cd, m) = code(c.put("", "v", None).await.unwrap_err());
    assert_eq!(
        (cd, m.as_str()),
        (Code::InvalidArgument, "etcdserver: key is not provided")
    );

    let big = vec![b'x'; frontend::config::DEFAULT_MAX_REQUEST_BYTES + 1];
    let (cd, m) = code(c.put("big", big.clone(), None).await.unwrap_err());
    assert_eq!(
        (cd, m.as_str()),
        (Code::InvalidArgument, "etcdserver: request is too large")
    );
    // etcd validates a request before it sizes its Raft proposal: the request's own fault wins.
    let (cd, m) = code(
        c.put(
            "big",
            big.clone(),
            Some(PutOptions::new().with_ignore_lease().with_lease(7)),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(
        (cd, m.as_str()),
        (Code::InvalidArgument, "etcdserver: lease is provided")
    );
    // A Range is served from a read index, not proposed: etcd does not size it.
    let found = c.get(big, None).await.expect("a range with a large key");
    assert_eq!(found.count(), 0);

    let ops: Vec<TxnOp> = (0..129)
        .map(|i| TxnOp::put(format!("k{i}"), "v", None))
        .collect();
    let (cd, m) = code(c.txn(Txn::new().and_then(ops)).await.unwrap_err());
    assert_eq!(
        (cd, m.as_str()),
        (
            Code::InvalidArgument,
            "etcdserver: too many operations in txn request"
        )
    );

    let dup = Txn::new().and_then([TxnOp::put("d", "1", None), TxnOp::put("d", "2", None)]);
    let (cd, m) = code(c.txn(dup).await.unwrap_err());
    assert_eq!(
        (cd, m.as_str()),
        (
            Code::InvalidArgument,
            "etcdserver: duplicate key given in txn request"
        )
    );

    let (cd, m) = code(
        c.put("x", "v", Some(PutOptions::new().with_ignore_value()))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (cd, m.as_str()),
        (Code::InvalidArgument, "etcdserver: value is provided")
    );

    assert_eq!(
        h.log.last_index(),
        before,
        "refused requests reached the journal"
    );

    let (cd, m) = code(
        c.get("x", Some(GetOptions::new().with_revision(1000)))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (cd, m.as_str()),
        (
            Code::OutOfRange,
            "etcdserver: mvcc: required revision is a future revision"
        )
    );
    h.fe.stop().await.unwrap();
}

#[tokio::test]
async fn compaction_and_compacted_reads() {
    let mut h = start().await;
    let c = &mut h.client;
    let r1 = c
        .put("k", "1", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    let r2 = c
        .put("k", "2", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    c.put("k", "3", None).await.unwrap();
    c.compact(r2, None).await.unwrap();
    let (cd, m) = code(
        c.get("k", Some(GetOptions::new().with_revision(r1)))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (cd, m.as_str()),
        (
            Code::OutOfRange,
            "etcdserver: mvcc: required revision has been compacted"
        )
    );
    let r = c
        .get("k", Some(GetOptions::new().with_revision(r2)))
        .await
        .unwrap();
    assert_eq!(r.kvs()[0].value(), b"2");
    let (cd, _) = code(c.compact(r1, None).await.unwrap_err());
    assert_eq!(cd, Code::OutOfRange);
    let (cd, m) = code(c.compact(10_000, None).await.unwrap_err());
    assert_eq!(
        (cd, m.as_str()),
        (
            Code::OutOfRange,
            "etcdserver: mvcc: required revision is a future revision"
        )
    );
    h.fe.stop().await.unwrap();
}

#[tokio::test]
async fn leases_grant_keepalive_ttl_revoke_and_expiry() {
    let mut h = start().await;
    let c = &mut h.client;
    let lease = c.lease_grant(30, None).await.unwrap();
    assert_eq!(lease.ttl(), 30);
    let id = lease.id();
    assert!(id > 0);
    c.put("leased", "v", Some(PutOptions::new().with_lease(id)))
        .await
        .unwrap();

    let ttl = c
        .lease_time_to_live(id, Some(LeaseTimeToLiveOptions::new().with_keys()))
        .await
        .unwrap();
    assert_eq!(ttl.granted_ttl(), 30);
    assert!(ttl.ttl() > 0 && ttl.ttl() <= 30);
    assert_eq!(ttl.keys(), &[b"leased".to_vec()]);

    let (mut keeper, mut stream) = c.lease_keep_alive(id).await.unwrap();
    keeper.keep_alive().await.unwrap();
    let ka = tokio::time::timeout(WAIT, stream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!((ka.id(), ka.ttl()), (id, 30));

    let leases = c.leases().await.unwrap();
    assert!(leases.leases().iter().any(|l| l.id() == id));

    c.lease_revoke(id).await.unwrap();
    assert_eq!(c.get("leased", None).await.unwrap().count(), 0);

    // Not found: keep-alive answers TTL 0, TimeToLive answers TTL -1, Revoke is NotFound.
    keeper.keep_alive().await.unwrap();
    let ka = tokio::time::timeout(WAIT, stream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(ka.ttl(), 0);
    let ttl = c.lease_time_to_live(id, None).await.unwrap();
    assert_eq!(ttl.ttl(), -1);
    let (cd, m) = code(c.lease_revoke(id).await.unwrap_err());
    assert_eq!(
        (cd, m.as_str()),
        (Code::NotFound, "etcdserver: requested lease not found")
    );

    // Expiry is journal time: let it pass the TTL as a live journal does, ticking every 500 ms
    // (a longer gap between stamps ages leases by 1 s only: an outage).
    let short = c.lease_grant(5, None).await.unwrap().id();
    c.put("short", "v", Some(PutOptions::new().with_lease(short)))
        .await
        .unwrap();
    for _ in 0..12 {
        h.log.advance_time(500);
        h.log.tick();
    }
    assert_eq!(c.get("short", None).await.unwrap().count(), 0);
    assert_eq!(c.lease_time_to_live(short, None).await.unwrap().ttl(), -1);

    let (cd, m) = code(c.lease_grant(10_000_000_000, None).await.unwrap_err());
    assert_eq!(
        (cd, m.as_str()),
        (Code::OutOfRange, "etcdserver: too large lease TTL")
    );
    drop((keeper, stream));
    h.fe.stop().await.unwrap();
}

#[tokio::test]
async fn cluster_maintenance_and_auth() {
    let mut config = Config::for_test(vec!["unused".into()]);
    config.peer_frontends = vec!["http://127.0.0.1:1".into()];
    config.etcd_version = "3.5.99".into();
    let mut h = start_with(config, MemLog::new()).await;
    let c = &mut h.client;

    let ml = c.member_list().await.unwrap();
    assert_eq!(ml.members().len(), 2);
    assert_eq!(
        ml.members()[0].client_urls(),
        &[format!("http://{}", h.fe.client_addr)]
    );
    let own_id = ml.members()[0].id();
    let (cd, m) = code(c.member_add(["http://x:1"], None).await.unwrap_err());
    assert_eq!(cd, Code::FailedPrecondition);
    assert!(m.contains("membership is managed by the service"), "{m}");
    assert_eq!(
        code(c.member_remove(own_id).await.unwrap_err()).0,
        Code::FailedPrecondition
    );

    c.put("k", "v", None).await.unwrap();
    let st = c.status().await.unwrap();
    assert_eq!(st.version(), "3.5.99");
    assert_eq!(st.leader(), own_id);
    assert_eq!(st.header().unwrap().member_id(), own_id);
    assert!(st.raft_index() >= 1);
    assert!(st.db_size() > 0);

    let al = c
        .alarm(AlarmAction::Get, AlarmType::None, None)
        .await
        .unwrap();
    assert!(al.alarms().is_empty());
    c.defragment().await.unwrap();
    let h1 = c.hash_kv(0).await.unwrap();
    assert_eq!(h1.hash(), c.hash_kv(0).await.unwrap().hash());
    c.put("k", "v2", None).await.unwrap();
    assert_ne!(h1.hash(), c.hash_kv(0).await.unwrap().hash());
    let whole = c.hash().await.unwrap().hash();
    assert_eq!(c.hash().await.unwrap().hash(), whole, "Hash is stable");
    c.put("k", "v3", None).await.unwrap();
    assert_ne!(
        c.hash().await.unwrap().hash(),
        whole,
        "a write changes Hash"
    );

    // MoveLeader: to itself done at once, to the peer frontend refused (leadership lives in
    // the journal), to a stranger etcd's "bad leader transferee".
    c.move_leader(own_id).await.unwrap();
    let peer_id = ml.members()[1].id();
    let (cd, m) = code(c.move_leader(peer_id).await.unwrap_err());
    assert_eq!(cd, Code::FailedPrecondition);
    assert!(m.contains("leadership is managed by the journal"), "{m}");
    let (cd, m) = code(c.move_leader(peer_id ^ 1).await.unwrap_err());
    assert_eq!(
        (cd, m.as_str()),
        (
            Code::FailedPrecondition,
            "etcdserver: bad leader transferee"
        )
    );
    // Users are journalled and read back; a frontend without a token key cannot enable auth.
    assert!(c.user_list().await.unwrap().users().is_empty());
    c.user_add("root", "p", None).await.unwrap();
    c.user_grant_role("root", "root").await.unwrap();
    assert_eq!(c.user_list().await.unwrap().users(), ["root"]);
    let (cd, m) = code(c.auth_enable().await.unwrap_err());
    assert_eq!(cd, Code::FailedPrecondition);
    assert!(m.contains("--auth-token-key-file"), "{m}");
    // Snapshot streams the replica's checkpoint (compactor issue): at least one non-empty chunk.
    let mut s = c.snapshot().await.unwrap();
    let first = s.message().await.unwrap().expect("a snapshot chunk");
    assert!(!first.blob().is_empty());
    h.fe.stop().await.unwrap();
}

#[tokio::test]
async fn watch_is_served_on_the_client_port() {
    let mut h = start().await;
    let mut stream = h
        .client
        .watch("w", Some(WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    h.client.put("w1", "v", None).await.unwrap();
    loop {
        let r = tokio::time::timeout(WAIT, stream.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if let Some(ev) = r.events().first() {
            assert_eq!(ev.kv().unwrap().key(), b"w1");
            break;
        }
    }
    drop(stream);
    h.fe.stop().await.unwrap();
}

/// The status a response stream ends with (its messages skipped), within `WAIT`.
macro_rules! status_at_end {
    ($stream:expr, $what:literal) => {
        tokio::time::timeout(WAIT, async {
            loop {
                match $stream.message().await {
                    Ok(Some(_)) => continue,
                    Ok(None) => panic!(concat!($what, " ended without a status")),
                    Err(e) => return e,
                }
            }
        })
        .await
        .expect(concat!($what, " ended"))
    };
}

/// etcd's require-leader streams (`hasleader` metadata, as clientv3's keep-alives and
/// kube-apiserver's watches send it): once the frontend has heard nothing from the journal (not
/// even an idle tick) for `--no-leader-after`, such watch and keep-alive streams end with
/// Unavailable "etcdserver: no leader" and new ones are refused, so clients move to another
/// frontend; other streams go on; once the journal is heard again they are served.
#[tokio::test]
async fn require_leader_streams_end_when_the_journal_falls_silent() {
    let config = Config {
        no_leader_after: Duration::from_millis(2_000),
        ..Config::for_test(vec!["unused".into()])
    };
    let mut h = start_with(config, MemLog::new()).await;
    // The in-memory journal does not tick by itself: tick as the journal's idle tick does while
    // it is "up".
    let up = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let ticker = {
        let (log, up) = (h.log.clone(), up.clone());
        tokio::spawn(async move {
            loop {
                if up.load(std::sync::atomic::Ordering::Relaxed) {
                    log.tick();
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    let mut strict = Client::connect(
        [format!("http://{}", h.fe.client_addr)],
        Some(ConnectOptions::new().with_require_leader(true)),
    )
    .await
    .unwrap();
    let lease = strict.lease_grant(60, None).await.unwrap().id();
    let mut strict_watch = strict
        .watch("w", Some(WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    let (_keeper, mut keep_alive) = strict.lease_keep_alive(lease).await.unwrap();
    let mut plain_watch = h
        .client
        .watch("w", Some(WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    // From here on the journal is silent.
    up.store(false, std::sync::atomic::Ordering::Relaxed);
    let no_leader = (Code::Unavailable, "etcdserver: no leader".to_string());
    assert_eq!(code(status_at_end!(strict_watch, "the watch")), no_leader);
    assert_eq!(
        code(status_at_end!(keep_alive, "the keep-alive stream")),
        no_leader
    );
    let Err(refused) = strict.watch("w", None).await else {
        panic!("a require-leader watch was accepted without a leader");
    };
    assert_eq!(code(refused), no_leader);
    // Status says so as etcd's does (leader 0, "etcdserver: no leader" first); HashKV still
    // hashes the local replica.
    let st = h.client.status().await.unwrap();
    assert_eq!(st.leader(), 0);
    assert_eq!(
        st.errors().first().map(String::as_str),
        Some("etcdserver: no leader")
    );
    h.client.hash_kv(0).await.unwrap();

    // The journal is heard again: the stream that did not ask goes on, new ones are served.
    up.store(true, std::sync::atomic::Ordering::Relaxed);
    h.client.put("w1", "v", None).await.unwrap();
    let event = tokio::time::timeout(WAIT, async {
        loop {
            let r = plain_watch.message().await.unwrap().unwrap();
            if let Some(ev) = r.events().first() {
                return ev.kv().unwrap().key().to_vec();
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(event, b"w1");
    let mut again = strict.watch("w", None).await.unwrap();
    drop((again.message(), plain_watch));
    let st = h.client.status().await.unwrap();
    assert_ne!(st.leader(), 0);
    assert!(st.errors().is_empty(), "{:?}", st.errors());
    ticker.abort();
    h.fe.stop().await.unwrap();
}

#[tokio::test]
async fn http_health_readiness_and_metrics() {
    let mut h = start().await;
    h.client.put("k", "v", None).await.unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (s, _) = http_get(h.fe.metrics_addr, "/readyz").await;
        if s == 200 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (s, body) = http_get(h.fe.metrics_addr, "/health").await;
    assert_eq!(s, 200);
    assert!(body.contains(r#""health":"true""#), "{body}");
    let (s, body) = http_get(h.fe.metrics_addr, "/metrics").await;
    assert_eq!(s, 200);
    for m in [
        "strata_frontend_requests_total",
        "strata_frontend_request_duration_seconds_bucket",
        "strata_frontend_applied_index",
        "strata_frontend_keys",
        "strata_frontend_journal_lag_entries",
    ] {
        assert!(body.contains(m), "{m} missing from /metrics");
    }
    // grpc.health.v1 on the client port: the whole server and each etcd service.
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", h.fe.client_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut hc = tonic_health::pb::health_client::HealthClient::new(channel);
    for service in [
        "",
        "etcdserverpb.KV",
        "etcdserverpb.Watch",
        "etcdserverpb.Lease",
    ] {
        let r = hc
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            r.status,
            tonic_health::pb::health_check_response::ServingStatus::Serving as i32,
            "{service:?}"
        );
    }
    // An outage turns /health red (the journal round trip fails) and Unavailable for writes.
    h.log.set_unavailable(true);
    let (s, body) = http_get(h.fe.metrics_addr, "/health").await;
    assert_eq!(s, 503, "{body}");
    // ...but not /livez: a journal outage is no reason to restart a frontend.
    let (s, body) = http_get(h.fe.metrics_addr, "/livez").await;
    assert_eq!((s, body.as_str()), (200, "ok\n"));
    // HashKV and Hash read the local replica, as etcd's do: no journal round trip.
    h.client.hash_kv(0).await.unwrap();
    h.client.hash().await.unwrap();
    let (cd, _) = code(h.client.put("k", "v", None).await.unwrap_err());
    assert_eq!(cd, Code::Unavailable);
    h.log.set_unavailable(false);
    h.client.put("k", "v3", None).await.unwrap();
    h.fe.stop().await.unwrap();
}

#[tokio::test]
async fn another_tenant_in_metadata_is_refused() {
    let h = start().await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", h.fe.client_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut kv = api::etcdserverpb::kv_client::KvClient::new(channel);
    let mut req = tonic::Request::new(api::etcdserverpb::RangeRequest {
        key: b"k".to_vec(),
        ..Default::default()
    });
    req.metadata_mut()
        .insert("x-strata-tenant", "someone-else".parse().unwrap());
    let e = kv.range(req).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    let mut req = tonic::Request::new(api::etcdserverpb::RangeRequest {
        key: b"k".to_vec(),
        ..Default::default()
    });
    req.metadata_mut()
        .insert("x-strata-tenant", "default".parse().unwrap());
    kv.range(req).await.unwrap();
    h.fe.stop().await.unwrap();
}

/// The client port also answers plain HTTP/1.1 GETs of `/health`, `/version` and `/metrics`,
/// as an etcd member's does (`curl http://host:2379/health`, `etcdctl check datascale` reading
/// `process_resident_memory_bytes`), while gRPC goes on on the same port.
#[tokio::test]
async fn client_port_answers_etcds_plain_http_paths() {
    let mut config = Config::for_test(vec!["unused".into()]);
    config.etcd_version = "3.5.17".into();
    let mut h = start_with(config, MemLog::new()).await;
    h.client.put("k", "v", None).await.unwrap();
    let (s, body) = http_get(h.fe.client_addr, "/health").await;
    assert_eq!(
        (s, body.as_str()),
        (200, r#"{"health":"true","reason":""}"#)
    );
    let (s, body) = http_get(h.fe.client_addr, "/version").await;
    assert_eq!(s, 200);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&body).unwrap(),
        serde_json::json!({"etcdserver": "3.5.17", "etcdcluster": "3.5.0"})
    );
    let (s, body) = http_get(h.fe.client_addr, "/metrics").await;
    assert_eq!(s, 200);
    let rss = body
        .lines()
        .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
        .unwrap_or_else(|| panic!("no resident memory in {body}"));
    assert!(rss.parse::<f64>().unwrap() > 1e6, "{rss}");
    assert_eq!(
        h.client.get("k", None).await.unwrap().kvs()[0].value(),
        b"v"
    );
    h.fe.stop().await.unwrap();
}

/// `--shutdown-delay`: after the signal the frontend reports itself not ready (so load
/// balancers move on) while it still serves every request, then stops accepting.
#[tokio::test]
async fn shutdown_delay_turns_readiness_off_while_still_serving() {
    let mut config = Config::for_test(vec!["unused".into()]);
    config.shutdown_delay = Duration::from_secs(2);
    let mut h = start_with(config, MemLog::new()).await;
    let (client_addr, metrics_addr) = (h.fe.client_addr, h.fe.metrics_addr);
    h.client.put("k", "before", None).await.unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let fe = h.fe;
    let running = tokio::spawn(fe.run_until(async {
        let _ = rx.await;
    }));
    tx.send(()).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    loop {
        let (s, body) = http_get(metrics_addr, "/readyz").await;
        if s == 503 {
            assert_eq!(body, "shutting down\n");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "still ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!running.is_finished(), "stopped before its delay");
    h.client.put("k", "during", None).await.unwrap();
    tokio::time::timeout(WAIT, running)
        .await
        .expect("stops after its delay")
        .unwrap()
        .unwrap();
    assert!(tokio::net::TcpStream::connect(client_addr).await.is_err());
}

/// A replica that cannot go on (here: an entry of its own tenant in a format newer than this
/// build's) fails `/livez`, so Kubernetes restarts the frontend; `/readyz` fails too.
#[tokio::test]
async fn a_stopped_replica_fails_liveness() {
    use frontend::log::Log;
    let log = MemLog::new();
    let h = start_with(Config::for_test(vec!["unused".into()]), log.clone()).await;
    let (s, _) = http_get(h.fe.metrics_addr, "/livez").await;
    assert_eq!(s, 200);
    let newer = api::strata::entry::Entry {
        format_version: api::ENTRY_FORMAT_VERSION + 1,
        tenant: "default".into(),
        request_id: vec![1; 16],
        time_ms: 0,
        request: Some(api::strata::entry::entry::Request::Tick(
            api::strata::entry::Tick {},
        )),
        ..Default::default()
    };
    log.append(0, vec![api::record::encode_entry(&newer)])
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    let body = loop {
        let (s, body) = http_get(h.fe.metrics_addr, "/livez").await;
        if s == 503 {
            break body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still alive: {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(body.starts_with("replica stopped: "), "{body}");
    assert_eq!(http_get(h.fe.metrics_addr, "/readyz").await.0, 503);
    let _ = h.fe.stop().await;
}
