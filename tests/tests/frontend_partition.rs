//! Linearizable reads through a journal partition: two `strata frontend` processes over three
//! journal nodes whose links to each other go through TCP proxies. The journal leader is cut off
//! from its peers (frontends still reach every node) while one frontend writes and the other
//! reads: every read that succeeds returns the newest acknowledged write, never an older one,
//! through the old leader's lease running out and the election, and after the heal (a value
//! whose put failed may also be read, at any later time). Writes go on during the cut, once the
//! other two nodes elect a leader: the cut-off leader stops acting as one after 2 s without its
//! quorum, and readers tailing it are sent to the other nodes (docs/journal.md).

use std::time::{Duration, Instant};

use etcd_client::Client;
use strata_tests::deployment::frontend_args;
use strata_tests::journal::{JournalCluster, ProxiedMesh};
use strata_tests::process::{ChildGuard, free_port};
use strata_tests::readiness::{tail_file, wait_ready};

/// One client call's bound (an election may be in progress).
const CALL: Duration = Duration::from_secs(5);
/// How long writes and reads go on while the leader is cut off, then after the heal.
const CUT_FOR: Duration = Duration::from_secs(8);
const HEALED_FOR: Duration = Duration::from_secs(3);
const WAIT: Duration = Duration::from_secs(60);

/// A put that failed at the cut (its outcome unknown to the client) may be applied later than
/// the puts after it: the frontend's journal client goes on retrying its append after the
/// client's call ended (docs/frontend.md). Its value may then be read after a later put was
/// acknowledged, which is linearizable (an operation without an answer may take effect at any
/// later point); an acknowledged value older than the last acknowledged one may not.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_read_never_misses_an_acknowledged_write_while_the_journal_leader_is_cut_off() {
    let ProxiedMesh {
        addrs,
        proxies,
        peers,
    } = ProxiedMesh::start(3).await;
    let c = JournalCluster::start_with_peers(&addrs, &peers, 1, &[]);
    c.wait_leaders(&[0, 1, 2]).await;
    let journals: Vec<String> = addrs.values().cloned().collect();
    let mut frontends = Vec::new();
    let mut endpoints = Vec::new();
    for i in 0..2 {
        let listen = format!("127.0.0.1:{}", free_port());
        let metrics = format!("127.0.0.1:{}", free_port());
        let log = c.dir.path().join(format!("frontend-{i}.log"));
        frontends.push(ChildGuard::strata(
            &format!("frontend-{i}"),
            &frontend_args(&journals, &listen, &metrics, &[]),
            Some(&log),
        ));
        let endpoint = format!("http://{listen}");
        if let Err(e) = wait_ready(&endpoint, WAIT).await {
            panic!("frontend {i}: {e}\n{}", tail_file(&log));
        }
        endpoints.push(endpoint);
    }
    let mut run = Run {
        writer: Client::connect([endpoints[0].clone()], None).await.unwrap(),
        reader: Client::connect([endpoints[1].clone()], None).await.unwrap(),
        acknowledged: -1,
        unknown: Default::default(),
        next: 0,
        reads: 0,
    };
    run.until(Instant::now() + Duration::from_secs(1)).await;
    let before_cut = run.acknowledged;
    // Asked again now: leadership may have moved since (leaders are spread over the nodes).
    let leader_id = c.wait_leaders(&[0, 1, 2]).await[0];
    for ((from, to), p) in &proxies {
        if *from == leader_id || *to == leader_id {
            p.cut();
        }
    }
    run.until(Instant::now() + CUT_FOR).await;
    let during_cut = run.acknowledged;
    for p in proxies.values() {
        p.heal();
    }
    run.until(Instant::now() + HEALED_FOR).await;
    println!(
        "acknowledged: {before_cut} before the cut, {during_cut} by its end, {} at the end",
        run.acknowledged
    );
    assert!(before_cut >= 0, "nothing written before the cut");
    // The cut lasts 8 s; one put and one read take at most 5 s each. Before the cut-off leader
    // stepped down (and its readers moved), every put in the cut waited for it and failed.
    assert!(
        during_cut > before_cut,
        "no write was acknowledged while the leader was cut off"
    );
    assert!(run.acknowledged > during_cut, "no write after the heal");
    assert!(run.reads > 20, "too few reads succeeded: {}", run.reads);
    drop(frontends);
}

/// One frontend writes `k` = 0, 1, 2, ... while the other reads it back after each write.
struct Run {
    writer: Client,
    reader: Client,
    /// The last value whose put was acknowledged.
    acknowledged: i64,
    /// Values whose put failed or timed out: outcome unknown.
    unknown: std::collections::BTreeSet<i64>,
    next: i64,
    reads: u32,
}

impl Run {
    async fn until(&mut self, until: Instant) {
        while Instant::now() < until {
            let value = self.next.to_string();
            let put = tokio::time::timeout(CALL, self.writer.put("k", value, None)).await;
            if matches!(put, Ok(Ok(_))) {
                self.acknowledged = self.next;
            } else {
                self.unknown.insert(self.next);
            }
            self.next += 1;
            let Ok(Ok(got)) = tokio::time::timeout(CALL, self.reader.get("k", None)).await else {
                continue;
            };
            let read: i64 = got
                .kvs()
                .first()
                .map(|kv| std::str::from_utf8(kv.value()).unwrap().parse().unwrap())
                .unwrap_or(-1);
            // A put whose outcome the client did not learn (an error, a timeout) may take
            // effect at any later point, after later puts too (its append is still retried):
            // its value may be read. A value older than the last acknowledged one from a put
            // that was acknowledged may not.
            assert!(
                read >= self.acknowledged || self.unknown.contains(&read),
                "a linearizable read returned {read} after {} was acknowledged",
                self.acknowledged
            );
            self.reads += 1;
        }
    }
}
