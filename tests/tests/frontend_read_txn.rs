//! Read-only Txns (every op a Range) are served on the read path, not journalled: over real
//! journal processes and two frontends, a read-only txn on one frontend sees every write the
//! other acknowledged before it was sent (compare and range at one read index), and the frontend
//! that only served read-only txns never appended anything.

use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp, TxnOpResponse};
use strata_tests::deployment::Deployment;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Bound on any single client call.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Acknowledged writes each checked by a read-only txn on the other frontend.
const WRITES: usize = 60;
/// The frontend's histogram of entries per journal append: its count is the number of appends.
const APPENDS_METRIC: &str = "strata_frontend_append_batch_entries_count";

async fn connect(endpoint: String) -> Client {
    tokio::time::timeout(CALL_TIMEOUT, Client::connect([endpoint], None))
        .await
        .expect("connect timed out")
        .expect("connect")
}

/// Journal appends frontend `metrics` made so far (0 before the first).
async fn appends(metrics: &str) -> u64 {
    let mut s = tokio::net::TcpStream::connect(metrics).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).await.unwrap();
    body.lines()
        .find_map(|l| l.strip_prefix(APPENDS_METRIC))
        .map_or(0, |v| v.trim().parse().expect("a counter value"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_txns_see_every_acknowledged_write_and_append_nothing() {
    let d = Deployment::start(2).await;
    let mut writer = connect(d.frontend(0).endpoint()).await;
    let mut reader = connect(d.frontend(1).endpoint()).await;
    let reader_metrics = d.frontend(1).metrics.clone();
    let before = appends(&reader_metrics).await;

    for i in 0..WRITES {
        let key = format!("rt/{:03}", i % 10);
        let value = format!("v{i}");
        let put = writer.put(key.clone(), value.clone(), None).await.unwrap();
        let rev = put.header().unwrap().revision();
        // Sent after the ack, on the other frontend: compare and range must both see it.
        let txn = Txn::new()
            .when([Compare::mod_revision(key.clone(), CompareOp::Equal, rev)])
            .and_then([TxnOp::get(key.clone(), None)])
            .or_else([TxnOp::get(key.clone(), None)]);
        let resp = tokio::time::timeout(CALL_TIMEOUT, reader.txn(txn))
            .await
            .expect("txn timed out")
            .unwrap();
        let Some(TxnOpResponse::Get(got)) = resp.op_responses().into_iter().next() else {
            panic!("write {i}: no range answer in {resp:?}");
        };
        assert!(
            resp.succeeded(),
            "write {i} at revision {rev} invisible to the compare: {:?}",
            got.kvs().first().map(|kv| kv.mod_revision())
        );
        assert_eq!(got.kvs().len(), 1, "write {i}");
        assert_eq!(got.kvs()[0].value(), value.as_bytes(), "write {i}");
        assert!(resp.header().unwrap().revision() >= rev, "write {i}");
    }
    assert_eq!(
        appends(&reader_metrics).await,
        before,
        "read-only txns went through the journal"
    );

    // The counter does move when this frontend journals something: a txn with a put.
    let txn = Txn::new().and_then([TxnOp::put("rt/written", "x", None)]);
    assert!(reader.txn(txn).await.unwrap().succeeded());
    assert!(appends(&reader_metrics).await > before);
}
