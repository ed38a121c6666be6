//! Three `strata journal` processes on loopback: kill -9 the leader under 256 concurrent
//! appenders, whole-cluster restart, trim on every node, and replacing a dead node.

use std::collections::BTreeMap;
use std::time::Duration;

use journal::ClientError;
use strata_tests::journal::{Appenders, JournalCluster, acked_once, append_acked};
use strata_tests::process::free_port;

/// Concurrent appenders in the failover test.
const APPENDERS: usize = 256;
/// The shard the tests drive.
const SHARD: u32 = 0;

/// How long the appenders may take to reach the next acknowledged count.
const ACK_WAIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_leader_under_256_appenders_then_restart() {
    let mut c = JournalCluster::start(3, 2, &[]);
    let leaders = c.wait_leaders(&[0, 1, 2]).await;
    let client = c.client().await;
    let appenders = Appenders::start(&client, SHARD, APPENDERS);
    appenders.wait_acked(2000, ACK_WAIT).await;
    let leader = c.index_of(leaders[SHARD as usize]);
    c.kill(leader);
    let at_kill = appenders.acked_count().await;
    // The appenders carry on under a new leader.
    appenders.wait_acked(at_kill + 2000, ACK_WAIT).await;
    c.restart(leader);
    appenders.wait_acked(at_kill + 3000, ACK_WAIT).await;
    let (acked, failures) = appenders.stop().await;
    assert!(failures.is_empty(), "appends failed: {failures:?}");
    c.check_nodes_agree(&[0, 1, 2], SHARD, 0, &acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn whole_cluster_restart_keeps_every_committed_entry() {
    let mut c = JournalCluster::start(3, 1, &[]);
    c.wait_leaders(&[0, 1, 2]).await;
    let client = c.client().await;
    let mut acked = BTreeMap::new();
    for i in 0..200u32 {
        let p = format!("entry {i}").into_bytes();
        let idx = client
            .append(SHARD, vec![p.clone(), p.clone()])
            .await
            .unwrap();
        acked_once(&mut acked, idx[0], p.clone());
        acked_once(&mut acked, idx[1], p);
    }
    for i in 0..3 {
        c.kill(i);
    }
    for i in 0..3 {
        c.restart(i);
    }
    c.wait_leaders(&[0, 1, 2]).await;
    c.check_nodes_agree(&[0, 1, 2], SHARD, 0, &acked).await;
    // And it takes writes again.
    let client = c.client().await;
    let idx = client
        .append(SHARD, vec![b"after restart".to_vec()])
        .await
        .unwrap();
    assert!(idx[0] > *acked.keys().last().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn trim_drops_the_prefix_on_every_node() {
    let c = JournalCluster::start(3, 1, &["--segment-bytes".into(), "4096".into()]);
    c.wait_leaders(&[0, 1, 2]).await;
    let client = c.client().await;
    let mut last = 0;
    for i in 0..300u32 {
        last = client
            .append(SHARD, vec![vec![i as u8; 100]])
            .await
            .unwrap()[0];
    }
    let first = client.trim(SHARD, 200).await.unwrap();
    assert_eq!(first, 200);
    for (i, n) in c.nodes.iter().enumerate() {
        let nc = c.client_of(i).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let st = nc.status_of(&n.addr, SHARD).await.unwrap();
            if st.first_index == 200 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "node {} still starts at {}",
                n.id,
                st.first_index
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // The segment files holding only trimmed records are gone.
        let seg0 = n.data_dir.join("shard-0").join(format!("{:020}.seg", 0));
        assert!(!seg0.exists(), "{} still exists", seg0.display());
        match nc.read(SHARD, 10).await {
            Err(ClientError::Trimmed {
                first_index: 200, ..
            }) => {}
            Err(e) => panic!("node {}: wrong error {e}", n.id),
            Ok(_) => panic!("node {}: read below the trim point succeeded", n.id),
        }
        let recs = c.read_node(i, SHARD, 200, last).await;
        assert_eq!(recs.len() as u64, last - 199);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replace_a_dead_node_with_one_command() {
    let mut c = JournalCluster::start(3, 2, &[]);
    c.wait_leaders(&[0, 1, 2]).await;
    let client = c.client().await;
    let mut acked = BTreeMap::new();
    append_acked(&client, SHARD, "before", 100, &mut acked).await;
    // Node 3 dies for good; node 4 joins in its place.
    c.kill(2);
    let addr4 = format!("127.0.0.1:{}", free_port());
    let n4 = c.add_node(4, addr4.clone(), c.peers_replacing(3, 4, &addr4), true);
    let out = std::process::Command::new(strata_tests::process::strata_bin())
        .args([
            "journal",
            "replace-node",
            "--endpoints",
            &format!("{},{}", c.nodes[0].addr, c.nodes[1].addr),
            "--shards",
            "2",
            "--remove",
            "3",
            "--add",
            &format!("4={addr4}"),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "replace-node failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("shard 0: voters [1, 2, 4]"), "{text}");
    assert!(text.contains("shard 1: voters [1, 2, 4]"), "{text}");
    // With node 2 down too, nodes 1 and 4 are a majority: node 4 is a voter.
    c.kill(1);
    let client = c.client().await;
    append_acked(&client, SHARD, "after", 20, &mut acked).await;
    c.check_nodes_agree(&[0, n4], SHARD, 0, &acked).await;
}

/// Replacing a node by one that is not running yet: the new node is added as a learner but not
/// made a voter (a voter that holds nothing would leave the shard one failure from losing its
/// quorum); the answer says why. Once the node runs, asking again completes the change.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_node_becomes_a_voter_only_once_it_has_caught_up() {
    let mut c = JournalCluster::start(3, 1, &[]);
    c.wait_leaders(&[0, 1, 2]).await;
    let client = c.client().await;
    let mut acked = BTreeMap::new();
    append_acked(&client, SHARD, "before", 50, &mut acked).await;
    c.kill(2);
    let addr4 = format!("127.0.0.1:{}", free_port());
    let err = client
        .replace_node(SHARD, 3, 4, &addr4)
        .await
        .expect_err("node 4 is not running");
    assert!(
        err.to_string().contains("node 4 is a learner"),
        "unexpected answer: {err}"
    );
    // Still voters 1, 2 and 3: nodes 1 and 2 are a majority and keep committing.
    append_acked(&client, SHARD, "meanwhile", 20, &mut acked).await;
    let n4 = c.add_node(4, addr4.clone(), c.peers_replacing(3, 4, &addr4), true);
    let voters = client
        .replace_node(SHARD, 3, 4, &addr4)
        .await
        .expect("node 4 runs now");
    assert_eq!(voters, vec![1, 2, 4]);
    append_acked(&client, SHARD, "after", 20, &mut acked).await;
    c.check_nodes_agree(&[0, 1, n4], SHARD, 0, &acked).await;
}

/// A node whose data directory is lost (a Kubernetes volume gone) and that comes back under its
/// old id refuses to start, saying why, instead of rejoining with an empty log; the cluster goes
/// on with the other two. A node that never had data (a staggered first start) joins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_lost_its_data_refuses_to_rejoin_under_its_old_id() {
    let mut c = JournalCluster::start(3, 2, &[]);
    let leaders = c.wait_leaders(&[0, 1, 2]).await;
    // The node to lose leads no shard: a leader elected after the loss never saw it
    // acknowledge anything, and then nothing tells (the check is best effort). With three
    // nodes and two shards one of them leads none.
    let lost = (0..3)
        .rev()
        .find(|&i| !leaders.iter().any(|&l| c.index_of(l) == i))
        .expect("a node leading no shard");
    let others: Vec<usize> = (0..3).filter(|&i| i != lost).collect();
    let client = c.client().await;
    let mut acked = BTreeMap::new();
    append_acked(&client, SHARD, "before", 20, &mut acked).await;
    // Every leader has now seen the node acknowledge entries.
    c.wait_committed(lost, SHARD, *acked.keys().last().unwrap())
        .await;

    c.kill(lost);
    std::fs::remove_dir_all(&c.nodes[lost].data_dir).unwrap();
    let refused = async |c: &mut JournalCluster| {
        c.restart(lost);
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while c.nodes[lost].is_running() {
            assert!(
                std::time::Instant::now() < deadline,
                "a node that lost its data is still running"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        std::fs::read_to_string(c.nodes[lost].log_path()).unwrap()
    };
    let log = refused(&mut c).await;
    assert!(log.contains("its data was lost"), "{log}");
    // The refusal sticks (a marker in its data directory), whoever leads by the next start.
    assert!(c.nodes[lost].data_dir.join("DATA_LOST").exists());
    let log = refused(&mut c).await;
    assert!(
        log.contains("an earlier start found this node's data lost"),
        "{log}"
    );

    append_acked(&client, SHARD, "after", 20, &mut acked).await;
    c.check_nodes_agree(&others, SHARD, 0, &acked).await;
}

/// Nodes started one after another on empty directories (a StatefulSet creating its pods in
/// order) form the cluster: the last one, started after the first two have a quorum, had no
/// data to lose and is not refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_node_started_after_its_peers_joins_them() {
    let addrs: BTreeMap<u64, String> = (1..=3)
        .map(|id| (id, format!("127.0.0.1:{}", free_port())))
        .collect();
    let peers = strata_tests::journal::peers_arg(&addrs);
    let mut c = JournalCluster::start_with_peers(
        &addrs.iter().take(2).map(|(i, a)| (*i, a.clone())).collect(),
        &(1..=2).map(|i| (i, peers.clone())).collect(),
        1,
        &[],
    );
    c.wait_leaders(&[0, 1]).await;
    let client = c.client().await;
    let mut acked = BTreeMap::new();
    append_acked(&client, SHARD, "two", 10, &mut acked).await;
    let third = c.add_node(3, addrs[&3].clone(), peers, false);
    c.wait_leaders(&[0, 1, third]).await;
    append_acked(&client, SHARD, "three", 10, &mut acked).await;
    c.check_nodes_agree(&[0, 1, third], SHARD, 0, &acked).await;
}

/// A follower that comes back behind a backlog of large entries (~160 MiB of 1 MiB entries)
/// catches up, and appends go on meanwhile. openraft gives each AppendEntries one heartbeat
/// interval (100 ms); a batch of up to 1,024 such entries never arrived in time and was sent
/// again and again, the leader spent its CPU on it, and writes stopped for minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follower_behind_a_backlog_of_large_entries_catches_up() {
    use futures::StreamExt;
    const BACKLOG: usize = 160;
    const ENTRY_BYTES: usize = 1024 * 1024;
    let mut c = JournalCluster::start(3, 1, &[]);
    let leader = c.wait_leaders(&[0, 1, 2]).await[SHARD as usize];
    let follower = (0..3).find(|&i| c.index_of(leader) != i).unwrap();
    let client = c.client().await;
    c.kill(follower);
    let last = futures::stream::iter(0..BACKLOG)
        .map(|i| {
            let client = client.clone();
            async move {
                client
                    .append(SHARD, vec![vec![i as u8; ENTRY_BYTES]])
                    .await
                    .expect("append")[0]
            }
        })
        .buffer_unordered(4)
        .collect::<Vec<u64>>()
        .await
        .into_iter()
        .max()
        .unwrap();
    c.restart(follower);
    // Appends go on while it catches up, each answered well within the client's deadline.
    let mut acked = BTreeMap::new();
    let started = tokio::time::Instant::now();
    tokio::time::timeout(
        Duration::from_secs(30),
        append_acked(&client, SHARD, "during", 20, &mut acked),
    )
    .await
    .expect("appends stalled while the follower caught up");
    println!(
        "20 appends during the catch-up took {:?}",
        started.elapsed()
    );
    c.wait_committed(follower, SHARD, last).await;
    let last = *acked.keys().last().unwrap();
    c.wait_committed(follower, SHARD, last).await;
}
