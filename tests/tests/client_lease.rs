//! The Lease service through the `etcd-client` crate: Grant (chosen and generated ids, TTL
//! bounds), KeepAlive, TimeToLive with keys, Leases, Revoke, expiry, and etcd's errors.

mod common;

use std::time::Duration;

use common::{REQUEST_TIMEOUT, assert_status, start};
use etcd_client::{GetOptions, LeaseGrantOptions, LeaseTimeToLiveOptions, PutOptions};
use tonic::Code;

/// etcd's largest lease TTL (`MaxLeaseTTL`, 9e9 seconds).
const MAX_LEASE_TTL: i64 = 9_000_000_000;
/// The smallest TTL etcd grants with default timings (1.5 x election timeout, rounded up).
const MIN_LEASE_TTL: i64 = 2;
/// How long an expired lease's keys may linger before the test fails.
const EXPIRY_DEADLINE: Duration = Duration::from_secs(40);
/// Pause between two polls for an expired key.
const POLL: Duration = Duration::from_millis(200);

#[tokio::test]
async fn grant_keepalive_timetolive_leases_revoke() {
    let (_t, mut c) = start().await;
    let g = c.lease_grant(300, None).await.unwrap();
    assert_eq!(g.ttl(), 300);
    assert!(g.id() > 0);
    assert_eq!(g.error(), "");
    let chosen = c
        .lease_grant(120, Some(LeaseGrantOptions::new().with_id(0x5eed)))
        .await
        .unwrap();
    assert_eq!(chosen.id(), 0x5eed);
    assert_status(
        c.lease_grant(120, Some(LeaseGrantOptions::new().with_id(0x5eed)))
            .await,
        Code::FailedPrecondition,
        "etcdserver: lease already exists",
    );
    assert_status(
        c.lease_grant(MAX_LEASE_TTL + 1, None).await,
        Code::OutOfRange,
        "etcdserver: too large lease TTL",
    );
    let small = c.lease_grant(1, None).await.unwrap();
    assert_eq!(
        small.ttl(),
        MIN_LEASE_TTL,
        "a TTL below the minimum is raised"
    );

    c.put("l/1", "a", Some(PutOptions::new().with_lease(g.id())))
        .await
        .unwrap();
    c.put("l/2", "b", Some(PutOptions::new().with_lease(g.id())))
        .await
        .unwrap();
    c.put("plain", "c", None).await.unwrap();

    let (mut keeper, mut stream) = c.lease_keep_alive(g.id()).await.unwrap();
    keeper.keep_alive().await.unwrap();
    let ka = tokio::time::timeout(REQUEST_TIMEOUT, stream.message())
        .await
        .expect("keep-alive answer")
        .unwrap()
        .expect("keep-alive stream open");
    assert_eq!((ka.id(), ka.ttl()), (g.id(), 300));

    let ttl = c
        .lease_time_to_live(g.id(), Some(LeaseTimeToLiveOptions::new().with_keys()))
        .await
        .unwrap();
    assert_eq!(ttl.id(), g.id());
    assert_eq!(ttl.granted_ttl(), 300);
    // Just after a keep-alive, the time left truncated: 299 (etcd measures it a moment later).
    assert!((290..300).contains(&ttl.ttl()), "{}", ttl.ttl());
    let mut keys: Vec<_> = ttl.keys().to_vec();
    keys.sort();
    assert_eq!(keys, [b"l/1".to_vec(), b"l/2".to_vec()]);
    let no_keys = c.lease_time_to_live(g.id(), None).await.unwrap();
    assert!(no_keys.keys().is_empty(), "keys only when asked");

    let mut ids: Vec<i64> = c
        .leases()
        .await
        .unwrap()
        .leases()
        .iter()
        .map(|l| l.id())
        .collect();
    ids.sort();
    let mut want = vec![g.id(), 0x5eed, small.id()];
    want.sort();
    assert_eq!(ids, want);

    c.lease_revoke(g.id()).await.unwrap();
    let left = c
        .get("", Some(GetOptions::new().with_all_keys()))
        .await
        .unwrap();
    assert_eq!(left.kvs().len(), 1, "revoke deletes the lease's keys");
    assert_eq!(left.kvs()[0].key(), b"plain");
    let gone = c.lease_time_to_live(g.id(), None).await.unwrap();
    assert_eq!(gone.ttl(), -1, "an unknown lease has TTL -1");
    assert_status(
        c.lease_revoke(g.id()).await,
        Code::NotFound,
        "etcdserver: requested lease not found",
    );
    assert!(
        c.lease_keep_alive(g.id()).await.is_err(),
        "keep-alive of a revoked lease must fail"
    );
    assert_status(
        c.put("l/3", "x", Some(PutOptions::new().with_lease(g.id())))
            .await,
        Code::NotFound,
        "etcdserver: requested lease not found",
    );
}

#[tokio::test]
async fn keys_vanish_when_their_lease_expires_and_keepalive_holds_them() {
    let (_t, mut c) = start().await;
    let short = c.lease_grant(MIN_LEASE_TTL, None).await.unwrap().id();
    let kept = c.lease_grant(MIN_LEASE_TTL, None).await.unwrap().id();
    c.put("exp/short", "1", Some(PutOptions::new().with_lease(short)))
        .await
        .unwrap();
    c.put("exp/kept", "2", Some(PutOptions::new().with_lease(kept)))
        .await
        .unwrap();
    let (mut keeper, mut stream) = c.lease_keep_alive(kept).await.unwrap();

    let deadline = tokio::time::Instant::now() + EXPIRY_DEADLINE;
    loop {
        // Keep `kept` alive as a client would, several times per TTL.
        keeper.keep_alive().await.unwrap();
        let ka = tokio::time::timeout(REQUEST_TIMEOUT, stream.message())
            .await
            .expect("keep-alive answer")
            .unwrap()
            .expect("keep-alive stream open");
        assert_eq!(ka.ttl(), MIN_LEASE_TTL, "the kept lease must not expire");
        let r = c
            .get("exp/", Some(GetOptions::new().with_prefix()))
            .await
            .unwrap();
        let keys: Vec<_> = r.kvs().iter().map(|kv| kv.key().to_vec()).collect();
        if keys == [b"exp/kept".to_vec()] {
            break;
        }
        assert_eq!(keys.len(), 2, "{keys:?}");
        assert!(
            tokio::time::Instant::now() < deadline,
            "a {MIN_LEASE_TTL}s lease's key still there after {EXPIRY_DEADLINE:?}"
        );
        tokio::time::sleep(POLL).await;
    }
    assert_eq!(c.lease_time_to_live(short, None).await.unwrap().ttl(), -1);
    let ids: Vec<i64> = c
        .leases()
        .await
        .unwrap()
        .leases()
        .iter()
        .map(|l| l.id())
        .collect();
    assert_eq!(ids, [kept]);
}

/// A client that sends thousands of keep-alives on one stream, each message its own small
/// HTTP/2 DATA frame (as grpc-go frames them), faster than they are answered, gets every answer.
/// h2 drops a connection that leaves too many small frames unread ("too_many_data_frames",
/// GOAWAY), a budget of half the connection window: with the 64 KiB default, about 136 such
/// frames, which a stream reaches as soon as its keep-alives wait for the journal, and then
/// every stream of the connection (a kube-apiserver's watches with it) died.
#[tokio::test]
async fn thousands_of_keep_alives_in_small_frames_on_one_stream_are_all_answered() {
    use api::etcdserverpb::{LeaseKeepAliveRequest, LeaseKeepAliveResponse};
    use prost::Message;
    const N: usize = 5_000;
    let (t, mut c) = start().await;
    let id = c.lease_grant(300, None).await.unwrap().id();
    let addr = t.endpoint().trim_start_matches("http://").to_string();
    let tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    // This client's h2 applies the same budget to the answers it has not read yet.
    let (client, conn) = h2::client::Builder::new()
        .initial_connection_window_size(16 << 20)
        .handshake::<_, bytes::Bytes>(tcp)
        .await
        .unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut client = client.ready().await.unwrap();
    let request = http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}/etcdserverpb.Lease/LeaseKeepAlive"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (response, mut send) = client.send_request(request, false).unwrap();
    let body = LeaseKeepAliveRequest { id }.encode_to_vec();
    let mut message = vec![0u8];
    message.extend((body.len() as u32).to_be_bytes());
    message.extend(body);
    let message = bytes::Bytes::from(message);
    // Queued at once: h2 sends each as its own DATA frame as the window allows.
    for _ in 0..N {
        send.send_data(message.clone(), false).unwrap();
    }
    let response = tokio::time::timeout(REQUEST_TIMEOUT, response)
        .await
        .expect("no response headers")
        .expect("the stream failed");
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let mut buf: Vec<u8> = Vec::new();
    let mut answers = 0;
    while answers < N {
        let chunk = tokio::time::timeout(REQUEST_TIMEOUT, body.data())
            .await
            .unwrap_or_else(|_| panic!("answers stopped after {answers}"))
            .unwrap_or_else(|| panic!("the stream ended after {answers} answers"))
            .unwrap_or_else(|e| panic!("the connection failed after {answers} answers: {e}"));
        let _ = body.flow_control().release_capacity(chunk.len());
        buf.extend_from_slice(&chunk);
        while buf.len() >= 5 {
            let len = u32::from_be_bytes(buf[1..5].try_into().unwrap()) as usize;
            if buf.len() < 5 + len {
                break;
            }
            let answer = LeaseKeepAliveResponse::decode(&buf[5..5 + len]).unwrap();
            assert_eq!((answer.id, answer.ttl), (id, 300));
            answers += 1;
            buf.drain(..5 + len);
        }
    }
    drop(send);
}

/// Steps of the journal leader's wall clock neither expire leases early nor stop them
/// expiring: stamps advance with the monotonic clock, drawn towards the wall clock by at most
/// 1 % of the time elapsed (journal/src/clock.rs), as etcd's leases run on the monotonic clock.
/// Every journal node's clock jumps an hour ahead (the `clock-offset` failpoint): a 60 s lease
/// keeps its minute. Then two hours back: a 3 s lease granted after it still expires (stamped
/// with the wall clock, time stood still for as long as the step, and no lease expired).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_of_the_journal_clock_neither_expire_leases_early_nor_stop_them() {
    use strata_tests::deployment::{Deployment, JOURNAL_NODES, Setup};
    let d = Deployment::start_with(
        1,
        Setup {
            journal_extra: vec!["--failpoints".into()],
            ..Default::default()
        },
    )
    .await;
    let step = |offset_ms: i64| {
        for j in 0..usize::try_from(JOURNAL_NODES).unwrap() {
            let armed = format!("clock-offset={offset_ms}");
            std::fs::write(d.journal_dir(j).join("FAILPOINTS"), armed).unwrap();
        }
    };
    let mut c = common::connect(&d.frontend(0).endpoint()).await;
    let long = c.lease_grant(60, None).await.unwrap().id();
    c.put("long", "v", Some(PutOptions::new().with_lease(long)))
        .await
        .unwrap();
    step(3_600_000);
    for i in 0..20 {
        c.put(format!("k{i}"), "v", None).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ttl = c.lease_time_to_live(long, None).await.unwrap().ttl();
    assert!(
        (50..=60).contains(&ttl),
        "a 60 s lease granted seconds ago has {ttl} s left"
    );
    assert_eq!(c.get("long", None).await.unwrap().kvs().len(), 1);

    step(-3_600_000);
    let short = c.lease_grant(3, None).await.unwrap().id();
    c.put("short", "v", Some(PutOptions::new().with_lease(short)))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + EXPIRY_DEADLINE;
    while !c.get("short", None).await.unwrap().kvs().is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "a 3 s lease still lives after {EXPIRY_DEADLINE:?}: journal time stood still"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// A journal node reboots with its clock an hour ahead and the shard is handed to it: it goes
/// on from the stamps it appended as a follower (journal/src/clock.rs), so journal time does
/// not jump the hour, and no lease kept alive expires. (Were it to jump, the replicas would
/// still count at most a second of the gap.) The seeded fault suite plans the same
/// (`Action::TakeOver`); this one is deterministic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_takes_over_with_its_clock_ahead_expires_no_live_lease() {
    use strata_tests::deployment::{Deployment, Setup};
    let mut d = Deployment::start_with(
        1,
        Setup {
            journal_extra: vec!["--failpoints".into()],
            ..Default::default()
        },
    )
    .await;
    let mut c = common::connect(&d.frontend(0).endpoint()).await;
    let lease = c.lease_grant(30, None).await.unwrap().id();
    c.put("held", "v", Some(PutOptions::new().with_lease(lease)))
        .await
        .unwrap();
    let journal = journal::client::JournalClient::connect(d.journal_addrs())
        .await
        .unwrap();
    let leader = journal.status(0).await.unwrap().leader_id;
    let j = (0..3).find(|&j| j + 1 != leader as usize).unwrap();
    std::fs::write(d.journal_dir(j).join("FAILPOINTS"), "clock-offset=3600000").unwrap();
    d.restart_journal(j);
    let node = j as u64 + 1;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        c.lease_keep_alive(lease).await.unwrap();
        match journal.handoff(0, true, node).await {
            Ok(r) if r.leader_id == node => break,
            other => assert!(
                tokio::time::Instant::now() < deadline,
                "never handed to node {node}: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    for i in 0..20 {
        c.put(format!("k{i}"), "v", None).await.unwrap();
        let (mut keeper, mut answers) = c.lease_keep_alive(lease).await.unwrap();
        keeper.keep_alive().await.unwrap();
        let ttl = answers.message().await.unwrap().map(|a| a.ttl());
        assert_eq!(ttl, Some(30), "keep-alive {i} after the take-over");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let ttl = c.lease_time_to_live(lease, None).await.unwrap().ttl();
    assert!((25..=30).contains(&ttl), "{ttl} s left");
    assert_eq!(c.get("held", None).await.unwrap().kvs().len(), 1);
    // Journal time went on: no step between two records of even a minute.
    use futures::StreamExt;
    let end = journal.read_index(0).await.unwrap();
    let mut records = journal.read(0, 1).await.unwrap();
    let (mut last, mut jump) = (0, 0);
    while let Some(r) = records.next().await {
        let r = r.unwrap();
        if last > 0 {
            jump = jump.max(r.time_ms - last);
        }
        last = r.time_ms;
        if r.index >= end {
            break;
        }
    }
    assert!(
        (0..60_000).contains(&jump),
        "journal time stepped {jump} ms at the take-over"
    );
}
