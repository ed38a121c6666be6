//! A one-node journal in this process: append, read, read index, status, trim, restart,
//! oversize and unknown-shard errors, through the real client over gRPC on loopback.

use std::collections::BTreeMap;
use std::time::Duration;

use api::strata::journal::record::Kind;
use futures::StreamExt;
use journal::{ClientError, JournalClient, NodeConfig};
use tokio::net::TcpListener;

mod common;

use common::Running;

async fn start(dir: &std::path::Path, port: u16, idle_tick: Duration) -> Running {
    let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let config = NodeConfig {
        shards: 2,
        idle_tick,
        segment_bytes: 4096,
        ..common::one_node(&addr, dir)
    };
    common::serve(config, listener).await
}

async fn wait_leader(c: &JournalClient, shard: u32) {
    for _ in 0..600 {
        if let Ok(s) = c.status(shard).await
            && s.leader_id != 0
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no leader for shard {shard}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn append_read_trim_restart_round_trip() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path(), 0, Duration::from_millis(200)).await;
    let c = JournalClient::connect(std::slice::from_ref(&node.addr))
        .await
        .unwrap();
    wait_leader(&c, 0).await;

    // Appends from many tasks at once, batches of several payloads.
    let mut tasks = Vec::new();
    for t in 0..16u8 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            for i in 0..10u8 {
                let payloads = vec![vec![t, i, 0], vec![t, i, 1]];
                let idx = c.append(0, payloads.clone()).await.unwrap();
                assert_eq!(idx.len(), 2);
                assert_eq!(idx[1], idx[0] + 1, "one append's payloads are contiguous");
                acked.extend(idx.into_iter().zip(payloads));
            }
            acked
        }));
    }
    let mut acked: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    for t in tasks {
        acked.extend(t.await.unwrap());
    }
    assert_eq!(acked.len(), 320);
    let last = *acked.keys().last().unwrap();

    // Read from 0: gap-free, monotonic time, every acked payload at its index.
    let mut s = Box::pin(c.read(0, 0).await.unwrap());
    let mut prev_time = i64::MIN;
    let mut leader_changes = 0;
    for want in 0..=last {
        let r = tokio::time::timeout(Duration::from_secs(30), s.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(r.index, want);
        assert!(r.time_ms >= prev_time, "time went back at {want}");
        prev_time = r.time_ms;
        match r.kind.unwrap() {
            Kind::Data(d) => assert_eq!(Some(&d), acked.get(&want)),
            Kind::LeaderChange(_) => leader_changes += 1,
            Kind::Tick(_) => assert!(!acked.contains_key(&want)),
        }
    }
    assert!(leader_changes >= 1);
    // The stream goes on: an idle tick arrives without any client traffic.
    let r = tokio::time::timeout(Duration::from_secs(30), s.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(r.index, last + 1);
    assert!(matches!(r.kind, Some(Kind::Tick(_))));

    let ri = c.read_index(0).await.unwrap();
    assert!(ri > last);
    let st = c.status(0).await.unwrap();
    assert_eq!(st.leader_id, 1);
    assert_eq!(st.shard_count, 2);
    assert!(st.errors.is_empty());

    // Bad input.
    let big = vec![0u8; journal::node::MAX_ENTRY_BYTES + 1];
    let e = c.append(0, vec![big]).await.unwrap_err();
    assert!(
        matches!(e, ClientError::Rejected(ref m) if m.contains("exceeds")),
        "{e}"
    );
    let e = c.append(7, vec![b"x".to_vec()]).await.unwrap_err();
    assert!(
        matches!(e, ClientError::UnknownShard { shard: 7, .. }),
        "{e}"
    );

    // Trim, then a reader below the trim point is told the first retained index.
    let first = c.trim(0, 100).await.unwrap();
    assert_eq!(first, 100);
    for _ in 0..600 {
        if c.status(0).await.unwrap().first_index == 100 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(c.status(0).await.unwrap().first_index, 100);
    match c.read(0, 5).await {
        Err(ClientError::Trimmed {
            first_index: 100, ..
        }) => {}
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("read below the trim point succeeded"),
    }
    let mut s = Box::pin(c.read(0, 100).await.unwrap());
    let r = s.next().await.unwrap().unwrap();
    assert_eq!(r.index, 100);
    assert_eq!(r.kind, Some(Kind::Data(acked[&100].clone())));

    // Restart on the same port and directory: everything from the trim point on is still there.
    let addr = node.addr.clone();
    let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
    node.stop().await;
    let node = start(dir.path(), port, Duration::from_millis(200)).await;
    let c = JournalClient::connect(std::slice::from_ref(&node.addr))
        .await
        .unwrap();
    wait_leader(&c, 0).await;
    assert_eq!(c.status(0).await.unwrap().first_index, 100);
    let more = c.append(0, vec![b"after".to_vec()]).await.unwrap();
    assert!(more[0] > last);
    let mut s = Box::pin(c.read(0, 100).await.unwrap());
    let mut prev_time = i64::MIN;
    for want in 100..=more[0] {
        let r = tokio::time::timeout(Duration::from_secs(30), s.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(r.index, want);
        assert!(r.time_ms >= prev_time);
        prev_time = r.time_ms;
        if let Some(p) = acked.get(&want) {
            assert_eq!(r.kind, Some(Kind::Data(p.clone())));
        }
    }
    node.stop().await;
}

/// A reader that does not keep up holds at most its byte budget of records, however many are
/// committed (a restore's 1 MiB chunks once piled up by the thousand in a reader's buffer), and
/// still gets every record in order once it reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_reader_buffers_at_most_its_byte_budget() {
    const RECORD: usize = 512 * 1024;
    const RECORDS: usize = 24;
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path(), 0, Duration::from_secs(60)).await;
    let c = JournalClient::connect(std::slice::from_ref(&node.addr))
        .await
        .unwrap();
    wait_leader(&c, 0).await;
    let mut acked = Vec::new();
    for i in 0..RECORDS / 4 {
        let payloads: Vec<Vec<u8>> = (0..4).map(|j| vec![(4 * i + j) as u8; RECORD]).collect();
        acked.extend(c.append(0, payloads).await.unwrap());
    }
    let first = acked[0];

    let budget = 4 * RECORD;
    let mut s = c.read_buffered(0, first, budget).await.unwrap();
    // Give the reader's task every chance to read ahead.
    let mut seen = (0, 0);
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        seen = s.read_ahead();
    }
    let (records, bytes) = seen;
    assert!(records >= 2, "the reader reads ahead: {seen:?}");
    assert!(
        records <= 4 && bytes <= budget,
        "{records} records of {RECORD} bytes ({bytes} bytes) buffered against a budget of {budget}"
    );
    for (n, &index) in acked.iter().enumerate() {
        let r = tokio::time::timeout(Duration::from_secs(30), s.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(r.index, index);
        assert!(matches!(r.kind, Some(Kind::Data(ref d)) if d.len() == RECORD && d[0] == n as u8));
    }
}
