//! The unary fallback against a node that really refuses the streams: node 3 runs with
//! `--refuse-streams` (answers UNIMPLEMENTED to `AppendStream` and `AppendEntriesStream`, as a
//! node built before them would). Leaders replicate to it over unary AppendEntries, it
//! replicates over unary calls when it leads, clients append to it and ask it for read indexes
//! over unary calls; a leader kill changes nothing of that, and every node ends up with the
//! same records.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use api::strata::journal::journal_client::JournalClient as GrpcClient;
use api::strata::journal::raft_client::RaftClient;
use api::strata::journal::{AppendRequest, AppendStreamRequest, RaftAppendStreamRequest};
use strata_tests::journal::{Appenders, JournalCluster};

/// Shards: one led by each node.
const SHARDS: u32 = 3;
/// Appenders per shard.
const APPENDERS: usize = 8;
/// How long the appenders may take to reach the next acknowledged count.
const ACK_WAIT: Duration = Duration::from_secs(60);
/// The node that refuses the streams.
const OLD_NODE: u64 = 3;

fn own_args(id: u64) -> Vec<String> {
    let mut a = vec!["--handoff-settle".to_string(), "2s".to_string()];
    if id == OLD_NODE {
        a.push("--refuse-streams".into());
    }
    a
}

/// Read-index checkers on `shard`: each appends, then asks for a read index, which must cover
/// the acknowledged append. Answers how many checks each made.
fn read_index_checkers(
    client: &journal::JournalClient,
    shard: u32,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<u64>> {
    (0..2)
        .map(|t| {
            let (client, stop) = (client.clone(), Arc::clone(stop));
            tokio::spawn(async move {
                let mut checks = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let p = format!("checker {t} shard {shard} check {checks}").into_bytes();
                    let idx = client.append(shard, vec![p]).await.expect("append")[0];
                    let ri = client.read_index(shard).await.expect("read index");
                    assert!(
                        ri >= idx,
                        "shard {shard}: read index {ri} below append {idx}"
                    );
                    checks += 1;
                }
                checks
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_without_the_streams_replicates_appends_and_serves_over_unary_calls() {
    let mut c = JournalCluster::start_with_own_args(3, SHARDS, own_args);
    let old = c.index_of(OLD_NODE);

    // Node 3 leads its preferred shard (2): clients append to it and ask it for read
    // indexes over unary calls, and it replicates over unary calls.
    let deadline = tokio::time::Instant::now() + strata_tests::journal::CONVERGE_TIMEOUT;
    loop {
        let leaders = c.wait_leaders(&[0, 1, 2]).await;
        if leaders == vec![1, 2, 3] {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "leaders {leaders:?} never became [1, 2, 3]"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The refusal is real: both streams answer UNIMPLEMENTED on node 3 (and are served on
    // the others).
    let addr = format!("http://{}", c.nodes[old].addr);
    let req = futures::stream::iter(vec![AppendStreamRequest {
        seq: 1,
        append: Some(AppendRequest {
            shard: 0,
            payloads: Vec::new(),
        }),
        read_index: None,
    }]);
    let s = GrpcClient::connect(addr.clone())
        .await
        .expect("connect")
        .append_stream(req)
        .await
        .expect_err("AppendStream refused");
    assert_eq!(s.code(), tonic::Code::Unimplemented, "{s}");
    let req = futures::stream::iter(Vec::<RaftAppendStreamRequest>::new());
    let s = RaftClient::connect(addr)
        .await
        .expect("connect")
        .append_entries_stream(req)
        .await
        .expect_err("AppendEntriesStream refused");
    assert_eq!(s.code(), tonic::Code::Unimplemented, "{s}");

    let client = c.client().await;
    let appenders: Vec<Appenders> = (0..SHARDS)
        .map(|s| Appenders::start(&client, s, APPENDERS))
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let checkers: Vec<_> = (0..SHARDS)
        .flat_map(|s| read_index_checkers(&client, s, &stop))
        .collect();
    for a in &appenders {
        a.wait_acked(200, ACK_WAIT).await;
    }

    // Kill the leader of shard 0 (node 1): the survivors, one of them without the streams,
    // elect a leader and go on.
    let victim = c.index_of(1);
    c.kill(victim);
    let mut at = Vec::new();
    for a in &appenders {
        at.push(a.acked_count().await);
    }
    for (a, n) in appenders.iter().zip(&at) {
        a.wait_acked(n + 200, ACK_WAIT).await;
    }
    c.restart(victim);
    for a in &appenders {
        let n = a.acked_count().await;
        a.wait_acked(n + 100, ACK_WAIT).await;
    }
    stop.store(true, Ordering::Relaxed);
    for t in checkers {
        assert!(
            t.await.expect("checker panicked") > 0,
            "a checker made no progress"
        );
    }
    c.stop_and_check(appenders, &[0, 1, 2]).await;
}
