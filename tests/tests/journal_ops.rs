//! Operating a `strata journal` process: settings from `--config` (flags over the file) and
//! Prometheus `/metrics` on `--metrics-listen` (appends, records, fsync histogram, batch sizes,
//! per-shard indexes and leader).

use std::time::Duration;

use futures::StreamExt;
use strata_tests::journal::JournalCluster;
use strata_tests::process::free_port;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long the test waits for anything to converge.
const WAIT: Duration = Duration::from_secs(60);

async fn scrape(addr: &str) -> String {
    get(addr, "/metrics").await
}

/// The whole HTTP answer to `GET path` (retried until the listener is up).
async fn get(addr: &str, path: &str) -> String {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Ok(mut s) = tokio::net::TcpStream::connect(addr).await {
            s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
                .await
                .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            return out;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no metrics at {addr}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn config_file_and_metrics() {
    let cfg_dir = tempfile::tempdir().unwrap();
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    let cfg = cfg_dir.path().join("journal.toml");
    // The file asks for 3 shards; the harness's `--shards 2` flag wins.
    std::fs::write(
        &cfg,
        format!("shards = 3\nidle-tick = \"200ms\"\nmetrics-listen = \"{metrics_addr}\"\n"),
    )
    .unwrap();
    let c = JournalCluster::start(1, 2, &["--config".into(), cfg.display().to_string()]);
    c.wait_leaders(&[0]).await;
    let client = c.client().await;
    let st = client.status(0).await.unwrap();
    assert_eq!(st.shard_count, 2, "the flag overrides the file");
    for i in 0..5u8 {
        client
            .append(0, vec![vec![i; 10], vec![i; 20]])
            .await
            .unwrap();
    }
    let text = scrape(&metrics_addr).await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert_eq!(
        value(&text, "strata_journal_appends_total{shard=\"0\"}"),
        Some(5.0),
        "{text}"
    );
    assert_eq!(
        value(&text, "strata_journal_records_total{shard=\"0\"}"),
        Some(10.0),
        "{text}"
    );
    assert_eq!(
        value(&text, "strata_journal_is_leader{shard=\"0\"}"),
        Some(1.0)
    );
    assert_eq!(
        value(&text, "strata_journal_leader_id{shard=\"1\"}"),
        Some(1.0)
    );
    assert_eq!(
        value(&text, "strata_journal_storage_failed{shard=\"0\"}"),
        Some(0.0)
    );
    let committed = value(&text, "strata_journal_committed_index{shard=\"0\"}").unwrap();
    assert!(committed >= 10.0, "{committed}");
    let fsyncs = value(&text, "strata_journal_fsync_seconds_count{shard=\"0\"}").unwrap();
    assert!(fsyncs >= 5.0, "every append is fsync'ed: {fsyncs}");
    assert!(
        text.contains("strata_journal_fsync_seconds_bucket{shard=\"0\",le=\"0.001\"}"),
        "{text}"
    );
    assert!(
        value(&text, "strata_journal_entry_records_sum{shard=\"0\"}").unwrap() >= 10.0,
        "{text}"
    );
    assert!(text.contains("strata_journal_fsync_batch_appends_count{shard=\"0\"}"));
}

/// `GET /readyz` on the metrics port: 200 while the node is part of every shard's quorum, 503
/// with the reason once its peers are gone (a leader left alone included), 200 again when they
/// are back. A Kubernetes readiness probe (infra/kubernetes/journal.yaml) asks it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readyz_follows_the_quorum() {
    let metrics: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let mut c = JournalCluster::start_with_own_args(3, 2, |id| {
        vec!["--metrics-listen".into(), metrics[id as usize - 1].clone()]
    });
    c.wait_leaders(&[0, 1, 2]).await;
    let readyz = |addr: String| async move {
        let text = get(&addr, "/readyz").await;
        (text.starts_with("HTTP/1.1 200"), text)
    };
    let until = |addr: String, want: bool| async move {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let (ready, text) = readyz(addr.clone()).await;
            if ready == want {
                return text;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{addr} /readyz never became {want}: {text}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    for m in &metrics {
        until(m.clone(), true).await;
    }
    // Node 1 alone: whether it led a shard or followed, it is no part of a quorum.
    c.kill(1);
    c.kill(2);
    let text = until(metrics[0].clone(), false).await;
    assert!(text.starts_with("HTTP/1.1 503"), "{text}");
    assert!(
        [
            "no leader known",
            "not acknowledged by a quorum",
            "no entry applied from its leader"
        ]
        .iter()
        .any(|why| text.contains(why)),
        "{text}"
    );
    c.restart(1);
    c.restart(2);
    until(metrics[0].clone(), true).await;
    assert!(
        get(&metrics[0], "/nothing")
            .await
            .starts_with("HTTP/1.1 404")
    );
}

/// A follower restarted behind a backlog is not ready until it holds what its leader had
/// committed: every 200 answered while it catches up is checked against its own committed index,
/// which must have reached the leader's from before the restart. (Before, "an entry applied in
/// the last 3 s" made it ready from its first applied batch, and a rolling update moved on to
/// the next node while the shard's quorum still waited for this one.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readyz_waits_for_a_restarted_follower_to_catch_up() {
    const BACKLOG_APPENDS: usize = 96;
    const PAYLOADS_PER_APPEND: usize = 16;
    const PAYLOAD_BYTES: usize = 64 * 1024;
    let metrics: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let mut c = JournalCluster::start_with_own_args(3, 1, |id| {
        vec!["--metrics-listen".into(), metrics[id as usize - 1].clone()]
    });
    let leader = c.wait_leaders(&[0, 1, 2]).await[0];
    let follower = (0..3).find(|&i| c.index_of(leader) != i).unwrap();
    let client = c.client().await;
    let follower_addr = c.endpoints()[follower].clone();
    let ready =
        |addr: String| async move { get(&addr, "/readyz").await.starts_with("HTTP/1.1 200") };
    let deadline = tokio::time::Instant::now() + WAIT;
    while !ready(metrics[follower].clone()).await {
        assert!(tokio::time::Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    c.kill(follower);
    // About 100 MB the follower has to fetch when it comes back.
    let appends = (0..BACKLOG_APPENDS).map(|i| {
        let client = client.clone();
        async move {
            let payloads = (0..PAYLOADS_PER_APPEND)
                .map(|j| vec![(i * PAYLOADS_PER_APPEND + j) as u8; PAYLOAD_BYTES])
                .collect();
            client.append(0, payloads).await.expect("append")
        }
    });
    let last = futures::stream::iter(appends)
        .buffer_unordered(4)
        .collect::<Vec<Vec<u64>>>()
        .await
        .into_iter()
        .flatten()
        .max()
        .unwrap();
    c.restart(follower);
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut not_ready = Vec::new();
    loop {
        let text = get(&metrics[follower], "/readyz").await;
        if text.starts_with("HTTP/1.1 200") {
            let applied = client
                .status_of(&follower_addr, 0)
                .await
                .expect("status of the follower")
                .committed_index;
            assert!(
                applied >= last,
                "ready while it had applied {applied} of the {last} committed before it came back (earlier answers: {not_ready:?})"
            );
            break;
        }
        // The reasons met, once each (their figures change with every answer).
        if let Some(why) = text.lines().last() {
            let why: String = why.chars().filter(|c| !c.is_ascii_digit()).collect();
            if !not_ready.contains(&why) {
                not_ready.push(why);
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never ready again: {not_ready:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    println!("answers before ready: {not_ready:?}");
}
