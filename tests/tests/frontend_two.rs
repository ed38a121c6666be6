//! Two `strata frontend` processes on one tenant over three `strata journal` processes: a write
//! on one is visible to a linearizable read on the other; `kill -9` of a frontend in the middle
//! of a write load loses no acknowledged write and the client carries on against the other; the
//! restarted frontend catches up and its HashKV equals the other's.

use std::collections::BTreeMap;
use std::time::Duration;

use etcd_client::{Client, GetOptions};
use strata_tests::deployment::Deployment;

/// Bound on any single client call in these tests (a journal leader change may be in progress).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Writes before, and after, the kill.
const WRITES_BEFORE_KILL: usize = 100;
const WRITES_AFTER_KILL: usize = 100;
/// Attempts per write while a frontend disappears under the client.
const WRITE_ATTEMPTS: usize = 50;

async fn connect(endpoints: &[String]) -> Client {
    tokio::time::timeout(CALL_TIMEOUT, Client::connect(endpoints, None))
        .await
        .expect("connect timed out")
        .expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_on_one_frontend_is_read_linearizably_on_the_other() {
    let d = Deployment::start(2).await;
    let mut a = connect(&[d.frontend(0).endpoint()]).await;
    let mut b = connect(&[d.frontend(1).endpoint()]).await;
    for i in 0..20 {
        let key = format!("k{i}");
        let put = a.put(key.clone(), format!("v{i}"), None).await.unwrap();
        let rev = put.header().unwrap().revision();
        // No waiting: the very next linearizable read on the other frontend must see it.
        let got = b.get(key, None).await.unwrap();
        assert_eq!(
            got.kvs().len(),
            1,
            "write {i} invisible on the other frontend"
        );
        assert_eq!(got.kvs()[0].value(), format!("v{i}").as_bytes());
        assert!(got.header().unwrap().revision() >= rev);
    }
    // Same cluster id everywhere; each frontend reports itself as leader and its own member id.
    let sa = a.status().await.unwrap();
    let sb = b.status().await.unwrap();
    assert_eq!(
        sa.header().unwrap().cluster_id(),
        sb.header().unwrap().cluster_id()
    );
    assert_ne!(
        sa.header().unwrap().member_id(),
        sb.header().unwrap().member_id()
    );
}

/// Puts `key` until one attempt is acknowledged; false if every attempt failed.
async fn put_with_retries(c: &mut Client, key: &str, value: &str) -> bool {
    for _ in 0..WRITE_ATTEMPTS {
        match tokio::time::timeout(CALL_TIMEOUT, c.put(key, value, None)).await {
            Ok(Ok(_)) => return true,
            Ok(Err(_)) | Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_a_frontend_loses_no_acknowledged_write() {
    let mut d = Deployment::start(2).await;
    let endpoints = d.endpoints();
    // The load runs through a client that knows both frontends, as a Kubernetes API server does.
    let mut c = connect(&endpoints).await;
    let mut acked: BTreeMap<String, String> = BTreeMap::new();

    let mut i = 0;
    while i < WRITES_BEFORE_KILL {
        let (k, v) = (format!("load/{i:05}"), format!("v{i}"));
        assert!(
            put_with_retries(&mut c, &k, &v).await,
            "write {i} failed with both frontends up"
        );
        acked.insert(k, v);
        i += 1;
    }
    // Kill frontend 0 while writes are in flight on a second connection to it.
    let mut direct = connect(&[d.frontend(0).endpoint()]).await;
    // It writes until the kill stops it, so the kill always lands among its writes.
    let inflight = tokio::spawn(async move {
        let mut ok = Vec::new();
        for j in 0.. {
            let k = format!("direct/{j:05}");
            match tokio::time::timeout(CALL_TIMEOUT, direct.put(k.clone(), "d", None)).await {
                Ok(Ok(_)) => ok.push(k),
                _ => break,
            }
        }
        ok
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !inflight.is_finished(),
        "the direct writer stopped before the kill"
    );
    d.kill_frontend(0);
    let direct_acked = inflight.await.unwrap();
    assert!(!direct_acked.is_empty(), "no direct write before the kill");

    while i < WRITES_BEFORE_KILL + WRITES_AFTER_KILL {
        let (k, v) = (format!("load/{i:05}"), format!("v{i}"));
        assert!(
            put_with_retries(&mut c, &k, &v).await,
            "the client could not carry on against the surviving frontend (write {i})"
        );
        acked.insert(k, v);
        i += 1;
    }

    // Every acknowledged write is on the survivor.
    let mut survivor = connect(&[d.frontend(1).endpoint()]).await;
    let all = survivor
        .get("load/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    let got: BTreeMap<String, String> = all
        .kvs()
        .iter()
        .map(|kv| {
            (
                kv.key_str().unwrap().to_string(),
                kv.value_str().unwrap().to_string(),
            )
        })
        .collect();
    for (k, v) in &acked {
        assert_eq!(got.get(k), Some(v), "acknowledged write {k} lost");
    }
    for k in &direct_acked {
        let r = survivor.get(k.as_str(), None).await.unwrap();
        assert_eq!(
            r.count(),
            1,
            "acknowledged write {k} (to the killed frontend) lost"
        );
    }

    // The restarted frontend catches up: same HashKV at the same revision.
    d.restart_frontend(0).await;
    let mut restarted = connect(&[d.frontend(0).endpoint()]).await;
    let rev = survivor
        .get("load/", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    // A linearizable read makes the restarted replica apply at least `rev`.
    restarted.get("load/", None).await.unwrap();
    let h1 = survivor.hash_kv(rev).await.unwrap();
    let h0 = restarted.hash_kv(rev).await.unwrap();
    assert_eq!(h0.hash(), h1.hash(), "replicas differ at revision {rev}");
    assert_eq!(h0.compact_version(), h1.compact_version());
    let n = restarted
        .get(
            "load/",
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .unwrap()
        .count();
    assert_eq!(n as usize, got.len());
}
