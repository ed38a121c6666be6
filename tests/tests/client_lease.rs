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
