//! ReadIndex from the leader lease (on by default, 1 s): a read index always covers every
//! append acknowledged before the call, across a leader kill; and a leader cut off from its
//! peers (TCP proxies on every link) never answers from its lease once the lease has run out,
//! while the other two elect a leader and commit past it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use api::strata::journal::journal_client::JournalClient as GrpcClient;
use api::strata::journal::{AppendRequest, ReadIndexRequest, ReadRequest, StatusRequest};
use strata_tests::journal::{JournalCluster, ProxiedMesh, TcpProxy};
use strata_tests::process::free_port;

/// The journal's default `--read-lease`.
const LEASE: Duration = Duration::from_secs(1);
/// How long one direct ReadIndex attempt may take before it counts as unanswered.
const ATTEMPT: Duration = Duration::from_secs(2);
/// Bound of the append sent to the cut-off leader at the cut: past its step-down (2 s) with a
/// wide margin, below the journal client's 10 s attempt.
const IN_FLIGHT_BOUND: Duration = Duration::from_secs(8);
/// How long the cut-off leader is probed after its lease ran out.
const PROBE_AFTER_LEASE: Duration = Duration::from_secs(4);
/// Concurrent appenders and readers of the coverage test.
const APPENDERS: usize = 8;
const READERS: usize = 4;
/// Reads each coverage phase must complete (before and after the leader kill).
const READS_PER_PHASE: u64 = 300;
/// Longest wait for a phase's reads.
const PHASE_TIMEOUT: Duration = Duration::from_secs(60);

/// One ReadIndex call to the node at `addr` only: no retries, no leader following.
async fn read_index_at(addr: &str, shard: u32) -> Result<u64, String> {
    let call = async {
        let mut c = GrpcClient::connect(format!("http://{addr}"))
            .await
            .map_err(|e| e.to_string())?;
        c.read_index(ReadIndexRequest { shard })
            .await
            .map(|r| r.into_inner().index)
            .map_err(|s| s.to_string())
    };
    match tokio::time::timeout(ATTEMPT, call).await {
        Ok(r) => r,
        Err(_) => Err("no answer in time".into()),
    }
}

/// One Append of `payload` to the node at `addr` only, bounded by `within`: no retries.
async fn append_at(
    addr: &str,
    shard: u32,
    payload: &[u8],
    within: Duration,
) -> Result<Vec<u64>, tonic::Status> {
    let mut c = GrpcClient::connect(format!("http://{addr}"))
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let mut req = tonic::Request::new(AppendRequest {
        shard,
        payloads: vec![payload.to_vec()],
    });
    req.set_timeout(within);
    c.append(req).await.map(|r| r.into_inner().indexes)
}

async fn read_index_metric(addr: &str, path: &str) -> Option<f64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).await.ok()?;
    let needle = format!("path=\"{path}\"");
    text.lines()
        .filter(|l| l.starts_with("strata_journal_read_index_total") && l.contains(&needle))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .reduce(|a, b| a + b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn read_index_covers_every_acknowledged_append_across_a_leader_kill() {
    let metrics: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let mut c = JournalCluster::start_with_own_args(3, 1, |id| {
        vec!["--metrics-listen".into(), metrics[id as usize - 1].clone()]
    });
    let leaders = c.wait_leaders(&[0, 1, 2]).await;
    let client = c.client().await;
    client.append(0, vec![b"warm".to_vec()]).await.unwrap();

    let acked = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..APPENDERS {
        let (client, acked, stop) = (client.clone(), Arc::clone(&acked), Arc::clone(&stop));
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if let Ok(idx) = client
                    .append(0, vec![format!("a{t} {n}").into_bytes()])
                    .await
                {
                    acked.fetch_max(idx[0], Ordering::SeqCst);
                }
                n += 1;
            }
            Ok::<(), String>(())
        }));
    }
    for _ in 0..READERS {
        let (client, acked, stop, reads) = (
            client.clone(),
            Arc::clone(&acked),
            Arc::clone(&stop),
            Arc::clone(&reads),
        );
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let floor = acked.load(Ordering::SeqCst);
                // Failures (a leader change) are retried by the client; one that gives up is
                // not an answer, only a wrong answer fails the test.
                if let Ok(ri) = client.read_index(0).await {
                    if ri < floor {
                        return Err(format!(
                            "read index {ri} below {floor}, acknowledged before the call"
                        ));
                    }
                    reads.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok(())
        }));
    }
    let wait_reads = |target: u64| {
        let reads = Arc::clone(&reads);
        async move {
            let deadline = Instant::now() + PHASE_TIMEOUT;
            while reads.load(Ordering::Relaxed) < target {
                assert!(Instant::now() < deadline, "reads stalled below {target}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    wait_reads(READS_PER_PHASE).await;
    let leader = c.index_of(leaders[0]);
    // The leader answered (most) reads from its lease, not with a round each.
    let lease_reads = read_index_metric(&metrics[leader], "lease").await;
    assert!(
        lease_reads.is_some_and(|n| n > 0.0),
        "no ReadIndex was answered from the lease: {lease_reads:?}"
    );
    c.kill(leader);
    let after_kill = reads.load(Ordering::Relaxed);
    wait_reads(after_kill + READS_PER_PHASE).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap().unwrap();
    }
}

/// Shards of the partition test, and the one whose leader is cut off.
const SHARDS: u32 = 3;
const SHARD: u32 = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cut_off_leader_never_answers_from_its_lease_after_it_ran_out() {
    // A proxy on every directed link (from, to), so whichever node leads can be cut off.
    let ProxiedMesh {
        addrs,
        proxies,
        peers,
    } = ProxiedMesh::start(3).await;
    let c = JournalCluster::start_with_peers(&addrs, &peers, SHARDS, &[]);
    let leaders = c.wait_leaders(&[0, 1, 2]).await;
    let leader_id = leaders[SHARD as usize];
    let leader = c.index_of(leader_id);
    let others: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    let cut_links: Vec<&TcpProxy> = proxies
        .iter()
        .filter(|((from, to), _)| *from == leader_id || *to == leader_id)
        .map(|(_, p)| p)
        .collect();
    let all = c.client().await;
    let mut last = 0;
    for i in 0..20u32 {
        last = all
            .append(SHARD, vec![format!("before {i}").into_bytes()])
            .await
            .unwrap()[0];
    }
    // Connected, the leader answers, covering what was acknowledged.
    let ri = read_index_at(&c.nodes[leader].addr, SHARD).await.unwrap();
    assert!(ri >= last, "read index {ri} below acknowledged {last}");

    // A reader waiting at the end of the leader's log.
    let tail = {
        let mut g = GrpcClient::connect(format!("http://{}", c.nodes[leader].addr))
            .await
            .unwrap();
        let mut stream = g
            .read(ReadRequest {
                shard: SHARD,
                from: last + 1,
            })
            .await
            .unwrap()
            .into_inner();
        tokio::spawn(async move {
            loop {
                match tokio::time::timeout(IN_FLIGHT_BOUND, stream.message()).await {
                    Ok(Ok(Some(_))) => continue,
                    Ok(Ok(None)) => return Err("the stream ended without an error".to_string()),
                    Ok(Err(s)) => return Ok(s),
                    Err(_) => return Err(format!("nothing for {IN_FLIGHT_BOUND:?}")),
                }
            }
        })
    };
    for p in &cut_links {
        p.cut();
    }
    // Nothing the leader sends from now on is acknowledged: its lease started before this.
    let cut_at = Instant::now();
    let expired = cut_at + LEASE;
    // An append in flight at the cut-off leader is answered once it stops acting as leader
    // (after 2 s without a quorum), well before this call's bound, instead of waiting for a
    // commit that cannot come.
    let leader_addr = c.nodes[leader].addr.clone();
    let in_flight = {
        let addr = leader_addr.clone();
        tokio::spawn(async move { append_at(&addr, SHARD, b"at the cut", IN_FLIGHT_BOUND).await })
    };
    // The other two elect a leader (once their vote refusal ran out) and commit past it.
    let two = journal::JournalClient::connect(&[
        c.nodes[others[0]].addr.clone(),
        c.nodes[others[1]].addr.clone(),
    ])
    .await
    .unwrap();
    let during_task = tokio::spawn(async move {
        two.append(SHARD, vec![b"during".to_vec()])
            .await
            .map(|v| v[0])
    });
    let mut answered_after = Vec::new();
    let mut probes_after = 0;
    while Instant::now() < expired + PROBE_AFTER_LEASE {
        let started = Instant::now();
        let r = read_index_at(&c.nodes[leader].addr, SHARD).await;
        if started >= expired {
            probes_after += 1;
            if let Ok(ri) = r {
                answered_after.push((started - cut_at, ri));
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(probes_after > 0, "the probe loop never ran after the lease");
    assert!(
        answered_after.is_empty(),
        "the cut-off leader answered read indexes after its lease ran out (time since the cut, index): {answered_after:?}"
    );
    let during = during_task.await.unwrap().unwrap();
    assert!(during > last);
    match in_flight.await.unwrap() {
        Err(s) => assert!(
            s.code() == tonic::Code::Unavailable && s.message().contains("lost its quorum"),
            "the append in flight at the cut-off leader: {s:?}"
        ),
        Ok(ix) => panic!("an append at the cut-off leader was acknowledged at {ix:?}"),
    }
    // Its reader is sent elsewhere: nothing applies there any more.
    match tail.await.unwrap() {
        Ok(s) => assert!(
            s.code() == tonic::Code::Unavailable && s.message().contains("no entry applied"),
            "the reader at the cut-off leader: {s:?}"
        ),
        Err(e) => panic!("the reader at the cut-off leader: {e}"),
    }
    // Still cut off, it refuses appends at once without naming a leader (so clients try the
    // other nodes), and reports no leader.
    let refused = append_at(&leader_addr, SHARD, b"after", ATTEMPT)
        .await
        .expect_err("an append at the cut-off leader");
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert_eq!(
        refused
            .metadata()
            .get("x-strata-error")
            .and_then(|v| v.to_str().ok()),
        Some("not-leader"),
        "{refused:?}"
    );
    assert!(
        refused.metadata().get("x-strata-leader").is_none(),
        "the cut-off leader named a leader: {refused:?}"
    );
    let mut g = GrpcClient::connect(format!("http://{leader_addr}"))
        .await
        .unwrap();
    let st = g
        .status(StatusRequest { shard: SHARD })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        st.leader_id, 0,
        "the cut-off node still reports a leader: {st:?}"
    );
    for p in &cut_links {
        p.heal();
    }
    // Healed, the old leader follows and the shard's read index covers the majority's append.
    let ri = all.read_index(SHARD).await.unwrap();
    assert!(ri >= during, "read index {ri} below {during}");
}
