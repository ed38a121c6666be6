//! etcd's Lock and Election services (`v3lockpb`, `v3electionpb`) through the `etcd-client`
//! crate's lock and election clients, against Strata (default) or etcd 3.4
//! (`STRATA_TEST_TARGET=etcd`): the keys they write, who holds and who waits, what a caller that
//! goes away leaves behind, Observe's sequence of leaders, and etcd's errors.

mod common;

use std::time::{Duration, Instant};

use common::{WATCH_TIMEOUT, assert_status, connect, enable_auth, login, rev, start};
use etcd_client::{Client, GetOptions, LeaderKey, LockOptions, ProclaimOptions, ResignOptions};
use tonic::Code;

/// How long a call that must wait is given before it counts as not waiting.
const STILL_WAITING: Duration = Duration::from_millis(700);

/// How many keys lie under `prefix`.
async fn count(c: &mut Client, prefix: &str) -> i64 {
    c.get(
        prefix,
        Some(GetOptions::new().with_prefix().with_count_only()),
    )
    .await
    .unwrap()
    .count()
}

/// Waits until `prefix` holds `n` keys.
async fn until_count(c: &mut Client, prefix: &str, n: i64) {
    let deadline = Instant::now() + WATCH_TIMEOUT;
    while count(c, prefix).await != n {
        assert!(Instant::now() < deadline, "{prefix} never held {n} keys");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn key_of(prefix: &str, lease: i64) -> String {
    format!("{prefix}{lease:x}")
}

#[tokio::test]
async fn a_lock_is_held_by_one_lease_and_passed_on_in_order() {
    let (t, mut c) = start().await;
    let first = c.lease_grant(60, None).await.unwrap().id();
    let second = c.lease_grant(60, None).await.unwrap().id();

    let held = c
        .lock("lk", Some(LockOptions::new().with_lease(first)))
        .await
        .unwrap();
    assert_eq!(held.key(), key_of("lk/", first).as_bytes());
    let kv = c.get(held.key(), None).await.unwrap().kvs()[0].clone();
    assert_eq!((kv.value(), kv.lease()), (&b""[..], first));
    assert_eq!(rev(held.header()), kv.create_revision());

    // The same lease locks again at once: one hold, the same key.
    let again = c
        .lock("lk", Some(LockOptions::new().with_lease(first)))
        .await
        .unwrap();
    assert_eq!(again.key(), held.key());
    assert_eq!(count(&mut c, "lk/").await, 1);

    // Another lease waits, its key queued behind the holder's.
    let mut other = connect(t.endpoint()).await;
    let waiting = tokio::spawn(async move {
        other
            .lock("lk", Some(LockOptions::new().with_lease(second)))
            .await
    });
    until_count(&mut c, "lk/", 2).await;
    tokio::time::sleep(STILL_WAITING).await;
    assert!(
        !waiting.is_finished(),
        "a second holder while the first holds"
    );

    let released = c.unlock(held.key()).await.unwrap();
    let taken = tokio::time::timeout(WATCH_TIMEOUT, waiting)
        .await
        .expect("the waiter is never given the lock")
        .unwrap()
        .unwrap();
    assert_eq!(taken.key(), key_of("lk/", second).as_bytes());
    assert!(rev(taken.header()) >= rev(released.header()));

    // The hold ends with its lease.
    c.lease_revoke(second).await.unwrap();
    assert_eq!(count(&mut c, "lk/").await, 0);
    // Unlocking a key that is gone answers a header and changes nothing.
    let at = rev(c.unlock(taken.key()).await.unwrap().header());
    assert_eq!(at, rev(c.get("lk/", None).await.unwrap().header()));
}

#[tokio::test]
async fn a_lock_without_a_lease_gets_a_sixty_second_one() {
    let (_t, mut c) = start().await;
    let held = c.lock("solo", None).await.unwrap();
    let kv = c.get(held.key(), None).await.unwrap().kvs()[0].clone();
    assert!(kv.lease() != 0);
    assert_eq!(held.key(), key_of("solo/", kv.lease()).as_bytes());
    let ttl = c.lease_time_to_live(kv.lease(), None).await.unwrap();
    assert_eq!(ttl.granted_ttl(), 60);
    assert!((50..=60).contains(&ttl.ttl()), "{}", ttl.ttl());
}

#[tokio::test]
async fn a_waiter_that_goes_away_gives_up_its_place() {
    let (t, mut c) = start().await;
    let first = c.lease_grant(60, None).await.unwrap().id();
    let second = c.lease_grant(60, None).await.unwrap().id();
    let held = c
        .lock("gone", Some(LockOptions::new().with_lease(first)))
        .await
        .unwrap();
    let mut other = connect(t.endpoint()).await;
    let waiting = tokio::spawn(async move {
        other
            .lock("gone", Some(LockOptions::new().with_lease(second)))
            .await
    });
    until_count(&mut c, "gone/", 2).await;
    // The waiter's call is dropped (its stream reset): its key is deleted.
    waiting.abort();
    until_count(&mut c, "gone/", 1).await;
    let left = c
        .get("gone/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_eq!(left.kvs()[0].key(), held.key());
}

#[tokio::test]
async fn an_election_has_one_leader_and_observers_see_each_in_turn() {
    let (t, mut c) = start().await;
    let first = c.lease_grant(60, None).await.unwrap().id();
    let second = c.lease_grant(60, None).await.unwrap().id();
    assert_status(c.leader("el").await, Code::Unknown, "election: no leader");

    // An observer started before anyone leads sees the first leader come. (etcd answers the
    // call's headers only with its first leader, so the call is made in a task of its own.)
    let mut watcher = connect(t.endpoint()).await;
    let (tx, mut observed) = tokio::sync::mpsc::unbounded_channel();
    let observer = tokio::spawn(async move {
        let mut stream = watcher.observe("el").await.unwrap();
        while let Some(got) = stream.message().await.unwrap() {
            if tx.send(got).is_err() {
                return;
            }
        }
    });
    let mut next = async || {
        let got = tokio::time::timeout(WATCH_TIMEOUT, observed.recv())
            .await
            .expect("observe delivered nothing")
            .expect("observe ended");
        let kv = got.kv().expect("a leader").clone();
        (
            String::from_utf8(kv.value().to_vec()).unwrap(),
            kv,
            rev(got.header()),
        )
    };

    let won = c.campaign("el", "one", first).await.unwrap();
    let leader = won.leader().expect("a leader key").clone();
    assert_eq!(leader.name(), b"el");
    assert_eq!(leader.key(), key_of("el/", first).as_bytes());
    assert_eq!((leader.rev(), leader.lease()), (rev(won.header()), first));
    let (value, kv, at) = next().await;
    assert_eq!((value.as_str(), kv.key()), ("one", leader.key()));
    assert_eq!(at, kv.mod_revision());
    let now = c.leader("el").await.unwrap();
    assert_eq!(now.kv().unwrap().value(), b"one");

    // A new value without another election.
    let proclaimed = c
        .proclaim(
            "two",
            Some(ProclaimOptions::new().with_leader(leader.clone())),
        )
        .await
        .unwrap();
    let (value, kv, at) = next().await;
    assert_eq!(value, "two");
    assert_eq!((at, kv.mod_revision()), (rev(proclaimed.header()), at));

    // A second candidate waits; a campaign again by the leader's lease changes its value.
    let mut other = connect(t.endpoint()).await;
    let waiting = tokio::spawn(async move { other.campaign("el", "three", second).await });
    until_count(&mut c, "el/", 2).await;
    tokio::time::sleep(STILL_WAITING).await;
    assert!(!waiting.is_finished(), "two leaders at once");
    let again = c.campaign("el", "two-again", first).await.unwrap();
    assert_eq!(again.leader().unwrap().rev(), leader.rev());
    assert_eq!(next().await.0, "two-again");

    // A leader key of another revision is not the leader's.
    let stale = LeaderKey::new()
        .with_name("el")
        .with_key(leader.key())
        .with_rev(leader.rev() - 1)
        .with_lease(first);
    assert_status(
        c.proclaim("x", Some(ProclaimOptions::new().with_leader(stale.clone())))
            .await,
        Code::Unknown,
        "election: not leader",
    );
    // Resigning with it changes nothing.
    c.resign(Some(ResignOptions::new().with_leader(stale)))
        .await
        .unwrap();
    assert!(!waiting.is_finished());

    // The leader resigns: the candidate leads, and the observer follows.
    c.resign(Some(ResignOptions::new().with_leader(leader)))
        .await
        .unwrap();
    let second_won = tokio::time::timeout(WATCH_TIMEOUT, waiting)
        .await
        .expect("the candidate never leads")
        .unwrap()
        .unwrap();
    let second_leader = second_won.leader().unwrap().clone();
    assert_eq!(second_leader.key(), key_of("el/", second).as_bytes());
    let (value, kv, _) = next().await;
    assert_eq!((value.as_str(), kv.key()), ("three", second_leader.key()));
    assert_eq!(
        c.leader("el").await.unwrap().kv().unwrap().value(),
        b"three"
    );

    // The leadership ends with its lease too.
    c.lease_revoke(second).await.unwrap();
    assert_status(c.leader("el").await, Code::Unknown, "election: no leader");
    observer.abort();
}

#[tokio::test]
async fn proclaim_and_resign_need_a_leader_key() {
    let (_t, mut c) = start().await;
    assert_status(
        c.proclaim("v", None).await,
        Code::Unknown,
        "\"leader\" field must be provided",
    );
    assert_status(
        c.resign(None).await,
        Code::Unknown,
        "\"leader\" field must be provided",
    );
}

/// With auth on, every step runs as the caller: a user may lock and campaign under the prefix
/// her role grants, and is denied elsewhere with etcd's message (code Unknown: etcd's lock and
/// election servers hand on their own client's errors as plain errors).
#[tokio::test]
async fn locks_and_elections_run_with_the_callers_permissions() {
    let (t, mut admin) = start().await;
    let app = etcd_client::Permission::read_write("app/").with_prefix();
    enable_auth(&mut admin, ("alice", "alicepw"), "app", &[app]).await;
    let mut alice = login(t.endpoint(), "alice", "alicepw").await;
    let lease = alice.lease_grant(60, None).await.unwrap().id();

    let held = alice
        .lock("app/lk", Some(LockOptions::new().with_lease(lease)))
        .await
        .unwrap();
    assert_eq!(held.key(), key_of("app/lk/", lease).as_bytes());
    alice.unlock(held.key()).await.unwrap();
    let won = alice.campaign("app/el", "v", lease).await.unwrap();
    assert_eq!(
        won.leader().unwrap().key(),
        key_of("app/el/", lease).as_bytes()
    );

    let denied = "etcdserver: permission denied";
    assert_status(
        alice
            .lock("other", Some(LockOptions::new().with_lease(lease)))
            .await,
        Code::Unknown,
        denied,
    );
    assert_status(
        alice.campaign("other", "v", lease).await,
        Code::Unknown,
        denied,
    );
    assert_status(alice.leader("other").await, Code::Unknown, denied);
}

/// The Lock service and clientv3's own recipe (`etcdctl lock`, a `concurrency.Mutex`) write the
/// same keys, so they exclude each other on one name: each waits while the other holds.
#[tokio::test]
async fn the_lock_service_and_etcdctl_lock_exclude_each_other() {
    let (t, mut c) = start().await;
    let ctl = strata_tests::etcdctl::Etcdctl::new(t.endpoint());
    let mut by_etcdctl = ctl.spawn_lines(&["lock", "--ttl=60", "mix"]);
    let held = by_etcdctl.take(1, WATCH_TIMEOUT).remove(0);
    assert!(held.starts_with("mix/"), "{held}");

    let lease = c.lease_grant(60, None).await.unwrap().id();
    let mut other = connect(t.endpoint()).await;
    let waiting = tokio::spawn(async move {
        other
            .lock("mix", Some(LockOptions::new().with_lease(lease)))
            .await
    });
    until_count(&mut c, "mix/", 2).await;
    tokio::time::sleep(STILL_WAITING).await;
    assert!(
        !waiting.is_finished(),
        "locked while etcdctl holds the lock"
    );
    assert!(by_etcdctl.terminate(), "etcdctl lock unlocks on SIGTERM");
    let taken = tokio::time::timeout(WATCH_TIMEOUT, waiting)
        .await
        .expect("the service never takes the lock etcdctl gave up")
        .unwrap()
        .unwrap();
    assert_eq!(taken.key(), key_of("mix/", lease).as_bytes());

    // The other way round: etcdctl waits while the service's hold stands.
    let queued = ctl.spawn_lines(&["lock", "--ttl=60", "mix"]);
    until_count(&mut c, "mix/", 2).await;
    assert_eq!(queued.drain_for(STILL_WAITING), Vec::<String>::new());
    c.unlock(taken.key()).await.unwrap();
    let next = queued.take(1, WATCH_TIMEOUT).remove(0);
    assert!(next.starts_with("mix/") && next != held, "{next}");
}
