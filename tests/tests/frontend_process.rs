//! One `strata frontend` process over three `strata journal` processes: the HTTP side port
//! (`/health`, `/readyz`, `/metrics`), `grpc.health.v1`, Status against the real journal, and
//! writes carrying on through a journal node's `kill -9` (a minority) with nothing acknowledged
//! lost, also when the node killed is the shard's leader, which the frontend tails from.

use std::time::Duration;

use etcd_client::{Client, GetOptions};
use strata_tests::deployment::Deployment;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Attempts per write while the journal elects a new leader.
const WRITE_ATTEMPTS: usize = 100;

async fn http_get(addr: &str, path: &str) -> (u16, String) {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn side_port_health_and_status_over_the_real_journal() {
    let d = Deployment::start(1).await;
    let f = d.frontend(0);
    let mut c = Client::connect([f.endpoint()], None).await.unwrap();
    c.put("k", "v", None).await.unwrap();

    assert_eq!(http_get(&f.metrics, "/readyz").await.0, 200);
    let (s, body) = http_get(&f.metrics, "/health").await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(body, r#"{"health":"true","reason":""}"#);
    let (s, body) = http_get(&f.metrics, "/metrics").await;
    assert_eq!(s, 200);
    assert!(
        body.contains(r#"strata_frontend_requests_total{rpc="Put",tenant="default",code="OK"}"#),
        "{body}"
    );
    assert!(body.contains("strata_frontend_journal_lag_entries"));

    let st = c.status().await.unwrap();
    assert!(st.raft_index() >= st.raft_applied_index() && st.raft_applied_index() > 0);
    assert!(st.raft_term() >= 1);
    assert!(st.errors().is_empty(), "{:?}", st.errors());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_carry_on_through_a_journal_node_kill() {
    let mut d = Deployment::start(1).await;
    let mut c = Client::connect([d.frontend(0).endpoint()], None)
        .await
        .unwrap();
    let mut acked = Vec::new();
    for i in 0..300 {
        if i == 100 {
            // The first node is often a shard leader; any one of three is a minority.
            d.kill_journal(0);
        }
        let key = format!("j/{i:04}");
        let mut ok = false;
        for _ in 0..WRITE_ATTEMPTS {
            match tokio::time::timeout(CALL_TIMEOUT, c.put(key.clone(), "v", None)).await {
                Ok(Ok(_)) => {
                    ok = true;
                    break;
                }
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        assert!(
            ok,
            "write {i} never succeeded with two of three journal nodes up"
        );
        acked.push(key);
    }
    assert_eq!(keys_with_prefix(&mut c, "j/").await, acked);
}

/// Every key under `prefix`, in key order (a linearizable read).
async fn keys_with_prefix(c: &mut Client, prefix: &str) -> Vec<String> {
    let r = c
        .get(
            prefix,
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await
        .unwrap();
    r.kvs()
        .iter()
        .map(|kv| kv.key_str().unwrap().to_string())
        .collect()
}

/// Puts `key` through `c`, retrying while the journal elects a new leader; true once acknowledged.
async fn put_retrying(c: &mut Client, key: &str) -> bool {
    for _ in 0..WRITE_ATTEMPTS {
        match tokio::time::timeout(CALL_TIMEOUT, c.put(key, "v", None)).await {
            Ok(Ok(_)) => return true,
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_the_frontend_tails_from_loses_nothing() {
    let mut d = Deployment::start(1).await;
    let mut c = Client::connect([d.frontend(0).endpoint()], None)
        .await
        .unwrap();
    for i in 0..50 {
        assert!(put_retrying(&mut c, &format!("l/{i:04}")).await);
    }
    // The frontend opened its tail at shard 0's leader (--tail-from-leader defaults to true):
    // kill exactly that node.
    let journal = journal::client::JournalClient::connect(d.journal_addrs())
        .await
        .unwrap();
    let leader = journal.status(0).await.unwrap().leader_addr;
    let index = d
        .journal_addrs()
        .iter()
        .position(|a| a.trim_start_matches("http://") == leader.trim_start_matches("http://"))
        .unwrap_or_else(|| panic!("leader {leader:?} not among {:?}", d.journal_addrs()));
    d.kill_journal(index);
    // A write is answered only once this frontend's own replica applied it, so every
    // acknowledgement below proves the tail moved on to a live node.
    for i in 50..150 {
        assert!(
            put_retrying(&mut c, &format!("l/{i:04}")).await,
            "write {i} never succeeded after the leader's kill"
        );
    }
    let want: Vec<String> = (0..150).map(|i| format!("l/{i:04}")).collect();
    assert_eq!(keys_with_prefix(&mut c, "l/").await, want);
}
