//! Storage faults on three `strata journal` processes (started with `--failpoints`): while the
//! shard leader's fsync of its log or of its directory fails, it acknowledges no append and names
//! the error in its Status; the appenders carry on under a new leader; after the fault is
//! cleared and the node restarted, every node holds the same gap-free log with every
//! acknowledged record, and appends go on. A follower whose trim cannot be made durable (a
//! directory fsync, a rename or a remove failing) names the failure too. A slow disk fails
//! nothing.

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
    leader_storage_failure("fsync", &[], "fsync failed").await;
}

/// A directory fsync that fails (a segment created as the log rolls over, with small segments
/// here so it rolls often) is a storage failure like a failed fsync of the log: the segment's
/// name may not survive a power loss, so nothing after it may be acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn directory_fsync_failure_on_the_leader_acknowledges_nothing_and_heals_after_restart() {
    leader_storage_failure(
        "dir-fsync",
        &["--segment-bytes=65536".to_string()],
        "dir-fsync failpoint",
    )
    .await;
}

/// The leader's storage starts failing at `failpoint` (journal started with `extra` flags):
/// Status names an error containing `error` and "Input/output error"; the node acknowledges
/// nothing more, however asked; a new leader takes over; after the fault is cleared and the
/// node restarted, every node holds the same gap-free log with every acknowledged record.
async fn leader_storage_failure(failpoint: &str, extra: &[String], error: &str) {
    let mut args = vec!["--failpoints".to_string()];
    args.extend(extra.iter().cloned());
    let mut c = JournalCluster::start(3, 1, &args);
    let (leader, appenders) = under_load(&c).await;
    let leader_addr = c.nodes[leader].addr.clone();

    // The leader's disk starts failing.
    let trigger = c.nodes[leader].data_dir.join("FAILPOINTS");
    std::fs::write(&trigger, failpoint).unwrap();
    let status_client = c.client_of(leader).await;
    let errors = reported_errors(&c, leader, failpoint).await;
    assert!(
        errors
            .iter()
            .any(|e| e.contains(error) && e.contains("Input/output error")),
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

/// Entries the leader sends before its own fsync completes (`--overlap-leader-fsync`, on by
/// default) can be on its followers and gone from its own log after a power loss. Emulated here:
/// all three nodes killed, the leader's last entries cut from its log (as a lost page cache
/// would), then all restarted. The leader must not resume leading in its old term, where its
/// next entries would reuse the log ids of the ones the followers hold (openraft restores a
/// leader whose committed vote is its own at once, and matches entries by log id): the nodes
/// would then hold different entries at the same index forever. It campaigns in a new term
/// instead, which it cannot win with the shorter log, and takes the entries back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_that_lost_its_unsynced_tail_does_not_resume_its_old_term() {
    /// Entries cut from the leader's log.
    const CUT: u64 = 20;
    let mut c = JournalCluster::start(3, 1, &[]);
    let leaders = c.wait_leaders(&[0, 1, 2]).await;
    let leader = c.index_of(leaders[SHARD as usize]);
    let client = c.client().await;
    let mut acked = std::collections::BTreeMap::new();
    strata_tests::journal::append_acked(&client, SHARD, "before", 60, &mut acked).await;
    let last = *acked.keys().last().unwrap();
    for i in 0..3 {
        c.wait_committed(i, SHARD, last).await;
    }
    for i in 0..3 {
        c.kill(i);
    }
    let log_dir = |i: usize| c.nodes[i].data_dir.join(format!("shard-{SHARD}"));
    let next_of = |dir: &std::path::Path| {
        journal::segment::SegmentLog::open(dir, 0, 0, 0)
            .expect("the log opens")
            .0
            .next_index()
    };
    let leader_dir = log_dir(leader);
    let (mut log, _) = journal::segment::SegmentLog::open(&leader_dir, 0, 0, 0).unwrap();
    let leader_next = log.next_index();
    log.truncate(leader_next - CUT).unwrap();
    drop(log);
    // What the leader had committed was durable on disk before the cut; the cut stands for a
    // page cache lost with the power, so the commit point it persisted goes too.
    let _ = std::fs::remove_file(leader_dir.join("committed"));
    for i in (0..3).filter(|&i| i != leader) {
        let next = next_of(&log_dir(i));
        assert!(
            next > leader_next - CUT + 5,
            "follower {i} holds too little of the cut entries ({next} against {leader_next})"
        );
    }
    for i in 0..3 {
        c.restart(i);
    }
    c.wait_leaders(&[0, 1, 2]).await;
    let client = c.client().await;
    strata_tests::journal::append_acked(&client, SHARD, "after", 40, &mut acked).await;
    let last = *acked.keys().last().unwrap();
    for i in 0..3 {
        c.wait_committed(i, SHARD, last).await;
    }
    c.check_nodes_agree(&[0, 1, 2], SHARD, 1, &acked).await;
}

/// A slow disk is not a failed one (the `slow-fsync` failpoint: every fsync of the log waits
/// 250 ms first). With both followers slow, every majority holds a slow fsync, so an append is
/// acknowledged no sooner than one of them; yet nothing fails, no node reports an error, and
/// once the disks are fast again every node holds the same log with every acknowledged record.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_fsyncs_on_the_followers_slow_commits_and_fail_nothing() {
    let c = JournalCluster::start(3, 1, &["--failpoints".to_string()]);
    let (leader, appenders) = under_load(&c).await;
    let leader_addr = c.nodes[leader].addr.clone();

    let followers: Vec<usize> = (0..3).filter(|&n| n != leader).collect();
    let triggers: Vec<_> = followers
        .iter()
        .map(|&n| c.nodes[n].data_dir.join("FAILPOINTS"))
        .collect();
    for t in &triggers {
        std::fs::write(t, journal::failpoint::SLOW_FSYNC_NAME).unwrap();
    }
    // An fsync already under way when the failpoint was armed is not slowed: wait for the
    // next ones to begin.
    tokio::time::sleep(journal::failpoint::SLOW_FSYNC * 2).await;
    for i in 0..3 {
        let started = tokio::time::Instant::now();
        append_direct(&leader_addr, format!("slow {i}").into_bytes())
            .await
            .expect("a slow disk still acknowledges");
        let took = started.elapsed();
        assert!(
            took >= journal::failpoint::SLOW_FSYNC,
            "acknowledged after {took:?}, before any follower's slow fsync could finish"
        );
    }
    let during = appenders.acked_count().await;
    appenders.wait_acked(during + 20, WAIT).await;
    for n in 0..3 {
        let st = c
            .client_of(n)
            .await
            .status_of(&c.nodes[n].addr, SHARD)
            .await
            .unwrap();
        assert!(st.errors.is_empty(), "node {n} reports {:?}", st.errors);
    }

    for t in &triggers {
        std::fs::remove_file(t).unwrap();
    }
    let healed = appenders.acked_count().await;
    appenders.wait_acked(healed + 300, WAIT).await;
    let (acked, failures) = appenders.stop().await;
    assert!(failures.is_empty(), "appends failed: {failures:?}");
    c.check_nodes_agree(&[0, 1, 2], SHARD, 0, &acked).await;
}

/// A follower whose directory fsync fails when it makes a trim durable (`dir-fsync`: the
/// snapshot file, then the purge point, are renamed into place) says so in its Status, as for
/// a failed fsync of the log; before, the failed snapshot write went to openraft alone and the
/// follower stopped trimming without a word. The other two trim and go on appending; restarted
/// on a healthy disk, it reports nothing and holds the same records from the trim point on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_trim_that_cannot_be_made_durable_is_a_storage_failure() {
    follower_trim_failure("dir-fsync", &[], 16).await;
}

/// The same when the snapshot file cannot be renamed into place (`rename`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_trim_whose_snapshot_cannot_be_renamed_is_a_storage_failure() {
    follower_trim_failure("rename", &[], 16).await;
}

/// The same when the segments a trim drops cannot be removed (`remove`; small segments and
/// 1 KiB records, so that the trim point lies segments past the start).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_trim_whose_segments_cannot_be_removed_is_a_storage_failure() {
    follower_trim_failure("remove", &["--segment-bytes=65536".to_string()], 1024).await;
}

/// A follower's `failpoint` is armed (journal started with `extra` flags, records of
/// `record_bytes`) and the shard is trimmed at 200: its Status names the trim's failure, the
/// other two trim and go on appending; restarted on a healthy disk, it reports nothing and
/// holds the same records from the trim point on.
async fn follower_trim_failure(failpoint: &str, extra: &[String], record_bytes: usize) {
    let mut args = vec!["--failpoints".to_string()];
    args.extend(extra.iter().cloned());
    let mut c = JournalCluster::start(3, 1, &args);
    let leaders = c.wait_leaders(&[0, 1, 2]).await;
    let leader = c.index_of(leaders[SHARD as usize]);
    let follower = (leader + 1) % 3;
    let client = c.client().await;
    let mut acked = std::collections::BTreeMap::new();
    let record = |what: &str, i: u32| {
        let mut r = format!("{what} {i} ").into_bytes();
        r.resize(record_bytes.max(r.len()), b'.');
        r
    };
    for i in 0..300u32 {
        let payload = record("before", i);
        let idx = client.append(SHARD, vec![payload.clone()]).await.unwrap()[0];
        acked.insert(idx, payload);
    }
    let trigger = c.nodes[follower].data_dir.join("FAILPOINTS");
    std::fs::write(&trigger, failpoint).unwrap();
    assert_eq!(client.trim(SHARD, 200).await.unwrap(), 200);

    let errors = reported_errors(&c, follower, "trim").await;
    let injected = format!("{failpoint} failpoint");
    assert!(
        errors
            .iter()
            .any(|e| (e.contains("snapshot") || e.contains("purg")) && e.contains(&injected)),
        "{errors:?}"
    );
    // The other two trimmed, and appends go on through them.
    for i in (0..3).filter(|&i| i != follower) {
        assert!(status(&c, i).await.errors.is_empty(), "node {i}");
    }
    for i in 0..50u32 {
        let payload = record("during", i);
        let idx = client.append(SHARD, vec![payload.clone()]).await.unwrap()[0];
        acked.insert(idx, payload);
    }

    std::fs::remove_file(&trigger).unwrap();
    c.kill(follower);
    c.restart(follower);
    for i in 0..50u32 {
        let payload = record("after", i);
        let idx = client.append(SHARD, vec![payload.clone()]).await.unwrap()[0];
        acked.insert(idx, payload);
    }
    let deadline = tokio::time::Instant::now() + WAIT;
    while !status(&c, follower).await.errors.is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "still failed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.check_nodes_agree(&[0, 1, 2], SHARD, 200, &acked).await;
}

/// Node `i`'s Status of the shard.
async fn status(c: &JournalCluster, i: usize) -> api::strata::journal::StatusResponse {
    c.client_of(i)
        .await
        .status_of(&c.nodes[i].addr, SHARD)
        .await
        .unwrap()
}

/// The errors node `i`'s Status lists once it lists any (it still answers Status after its
/// storage failed); fails the test if it lists none within `WAIT`.
async fn reported_errors(c: &JournalCluster, i: usize, failure: &str) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let st = status(c, i).await;
        if !st.errors.is_empty() {
            return st.errors;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "node {i}'s Status never reported the {failure} failure: {st:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits for `c`'s shard leaders, starts `APPENDERS` appenders on `SHARD` and waits until 300
/// appends were acknowledged; returns the shard leader's index and the appenders.
async fn under_load(c: &JournalCluster) -> (usize, Appenders) {
    let leaders = c.wait_leaders(&[0, 1, 2]).await;
    let leader = c.index_of(leaders[SHARD as usize]);
    let appenders = Appenders::start(&c.client().await, SHARD, APPENDERS);
    appenders.wait_acked(300, WAIT).await;
    (leader, appenders)
}
