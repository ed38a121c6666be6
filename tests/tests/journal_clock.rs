//! Journal time across a restart of every node: the first leader elected has no stamp of
//! another leader's to go on from, and takes its first from the earliest wall clock of the
//! voters that answer (journal/src/clock.rs). A node whose clock came up an hour ahead and wins
//! that election must not move journal time by the hour (every auth token, minted and checked in
//! journal time, would expire at once).

use std::time::Duration;

use futures::StreamExt;
use strata_tests::journal::JournalCluster;

/// The shard the test drives (one shard: one election to wait for).
const SHARD: u32 = 0;
/// How far the first node's clock is set ahead.
const AHEAD_MS: i64 = 3_600_000;
/// Whole-cluster restarts tried before the test gives up on the node ahead winning the election.
const ATTEMPTS: usize = 8;

/// The leader the running nodes `running` agree on in a term after `term` (a restarted node
/// reports the leader and term of the vote it found on disk until an election is held), and
/// that term.
async fn elected_after(c: &JournalCluster, running: &[usize], term: u64) -> (u64, u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let mut seen = Vec::new();
        for &i in running {
            let client = c.client_of(i).await;
            if let Ok(st) = client.status_of(&c.nodes[i].addr, SHARD).await {
                seen.push((st.leader_id, st.term));
            }
        }
        if seen.len() == running.len()
            && seen.windows(2).all(|w| w[0] == w[1])
            && seen[0].0 != 0
            && seen[0].1 > term
        {
            return seen[0];
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no new leader after term {term}: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The largest step of journal time between two consecutive records of `SHARD`, read up to the
/// last committed record.
async fn largest_step(c: &JournalCluster, running: &[usize]) -> i64 {
    let journal = c.client_of(running[0]).await;
    let end = journal.read_index(SHARD).await.expect("a read index");
    let mut records = journal.read(SHARD, 1).await.expect("a read");
    let (mut last, mut step) = (0, 0);
    while let Some(r) = records.next().await {
        let r = r.expect("a record");
        if last > 0 {
            step = step.max(r.time_ms - last);
        }
        last = r.time_ms;
        if r.index >= end {
            break;
        }
    }
    step
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_elected_first_after_every_node_restarted_with_its_clock_ahead_keeps_journal_time() {
    let mut c = JournalCluster::start(3, 1, &["--failpoints".to_string()]);
    c.wait_leaders(&[0, 1, 2]).await;
    let journal = c.client().await;
    journal
        .append(SHARD, vec![b"before".to_vec()])
        .await
        .expect("an append before the restarts");
    let mut term = journal.status(SHARD).await.expect("a status").term;
    for attempt in 1..=ATTEMPTS {
        for i in 0..3 {
            c.kill(i);
        }
        // Node 1 comes back with its clock an hour ahead and campaigns alone, in vain; node 2,
        // with a good clock, comes back a moment later and usually votes for it. Node 3 stays
        // down: node 1's only other clock is node 2's.
        let failpoints = c.nodes[0].data_dir.join("FAILPOINTS");
        std::fs::write(&failpoints, format!("clock-offset={AHEAD_MS}")).expect("arm the clock");
        c.restart(0);
        tokio::time::sleep(Duration::from_millis(2500)).await;
        c.restart(1);
        let (leader, elected_in) = elected_after(&c, &[0, 1], term).await;
        term = elected_in;
        if leader != 1 {
            eprintln!("attempt {attempt}: node {leader} was elected, not the node ahead; again");
            continue;
        }
        let client = c.client_of(0).await;
        client
            .append(SHARD, vec![b"after".to_vec()])
            .await
            .expect("an append after the restarts");
        let step = largest_step(&c, &[0, 1]).await;
        assert!(
            (0..60_000).contains(&step),
            "journal time stepped {step} ms when node 1, an hour ahead, was elected first \
             (logs in {})",
            c.dir.path().display()
        );
        return;
    }
    panic!("node 1 (clock ahead) was never the first elected in {ATTEMPTS} whole-cluster restarts");
}
