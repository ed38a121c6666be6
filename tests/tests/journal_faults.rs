//! Storage faults on three `strata journal` processes (started with `--failpoints`): while the
//! shard leader's fsync fails, it acknowledges no append and names the error in its Status; the
//! appenders carry on under a new leader; after the fault is cleared and the node restarted,
//! every node holds the same gap-free log with every acknowledged record, and appends go on.

use std::time::Duration;

use api::strata::journal::AppendRequest;
use api::strata::journal::journal_client::JournalClient as GrpcClient;
use strata_tests::journal::{Appenders, JournalCluster};

/// Concurrent appenders during the fault.
const APPENDERS: usize = 16;
/// The shard the test drives.
const SHARD: u32 = 0;
/// How long the test waits for anything to converge.
const WAIT: Duration = Duration::from_secs(60);

/// One Append straight to the node at `addr`, no redirect, no retry.
async fn append_direct(addr: &str, payload: Vec<u8>) -> Result<Vec<u64>, tonic::Status> {
    let mut c = GrpcClient::connect(format!("http://{addr}"))
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let mut req = tonic::Request::new(AppendRequest {
        shard: SHARD,
        payloads: vec![payload],
    });
    req.set_timeout(Duration::from_secs(10));
    c.append(req).await.map(|r| r.into_inner().indexes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fsync_failure_on_the_leader_acknowledges_nothing_and_heals_after_restart() {
    let mut c = JournalCluster::start(3, 1, &["--failpoints".to_string()]);
    let leaders = c.wait_leaders(&[0, 1, 2]).await;
    let leader = c.index_of(leaders[SHARD as usize]);
    let leader_addr = c.nodes[leader].addr.clone();
    let client = c.client().await;
    let appenders = Appenders::start(&client, SHARD, APPENDERS);
    appenders.wait_acked(300, WAIT).await;

    // The leader's disk starts failing its fsyncs.
    let trigger = c.nodes[leader].data_dir.join("FAILPOINTS");
    std::fs::write(&trigger, "fsync").unwrap();
    let status_client = c.client_of(leader).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    let errors = loop {
        let st = status_client
            .status_of(&leader_addr, SHARD)
            .await
            .expect("the failed node still answers Status");
        if !st.errors.is_empty() {
            break st.errors;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "Status never reported the fsync failure"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        errors
            .iter()
            .any(|e| e.contains("fsync failed") && e.contains("Input/output error")),
        "{errors:?}"
    );
    // From now on it acknowledges nothing, however it is asked.
    for i in 0..5 {
        let r = append_direct(&leader_addr, format!("direct {i}").into_bytes()).await;
        assert!(r.is_err(), "the failed node acknowledged an append: {r:?}");
    }
    // The appenders carry on under a new leader.
    let at_fault = appenders.acked_count().await;
    appenders.wait_acked(at_fault + 300, WAIT).await;
    let st = status_client.status_of(&leader_addr, SHARD).await.unwrap();
    assert_ne!(
        st.leader_id, c.nodes[leader].id,
        "the failed node still calls itself the leader"
    );
    let other = (leader + 1) % 3;
    let other_client = c.client_of(other).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let st = other_client
            .status_of(&c.nodes[other].addr, SHARD)
            .await
            .unwrap();
        if st.leader_id != 0 && st.leader_id != c.nodes[leader].id {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no new leader: {st:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Clear the fault and restart the node: it rejoins and catches up.
    std::fs::remove_file(&trigger).unwrap();
    c.kill(leader);
    c.restart(leader);
    let after_restart = appenders.acked_count().await;
    appenders.wait_acked(after_restart + 300, WAIT).await;
    let (acked, failures) = appenders.stop().await;
    assert!(failures.is_empty(), "appends failed: {failures:?}");
    let st = c
        .client_of(leader)
        .await
        .status_of(&leader_addr, SHARD)
        .await
        .unwrap();
    assert!(
        st.errors.is_empty(),
        "a restart clears the condition: {st:?}"
    );

    // Every node: the same gap-free records, every acknowledged one with its bytes.
    c.check_nodes_agree(&[0, 1, 2], SHARD, 0, &acked).await;
    let last = *acked.keys().last().expect("acked");
    // And appends go on, through the restarted node too.
    let idx = c
        .client_of(leader)
        .await
        .append(SHARD, vec![b"after the fault".to_vec()])
        .await
        .unwrap();
    assert!(idx[0] > last);
}
