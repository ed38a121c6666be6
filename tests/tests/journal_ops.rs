//! Operating a `strata journal` process: settings from `--config` (flags over the file) and
//! Prometheus `/metrics` on `--metrics-listen` (appends, records, fsync histogram, batch sizes,
//! per-shard indexes and leader).

use std::time::Duration;

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
