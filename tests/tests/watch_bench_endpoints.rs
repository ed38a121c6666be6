//! `strata bench watch`'s delivery latency split by endpoint (`delivery_by_endpoint`), against a
//! real etcd (Debian's 3.4, one member on loopback) named three times in `--endpoints`: every
//! watcher's deliveries are counted under the endpoint its stream's connection went to.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use strata_tests::process::{ChildGuard, free_port, strata_bin, wait_for_port};

/// How long etcd may take to start and elect itself on a busy 2-core machine.
const ETCD_READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Pause between readiness probes.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

// A plain test thread (no runtime) waiting between probe processes: a blocking sleep is right.
#[allow(clippy::disallowed_methods)]
fn pause(d: Duration) {
    std::thread::sleep(d);
}

/// Runs `strata bench --endpoints=ENDPOINTS ARGS`; (success, stdout, stderr).
fn bench(endpoints: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(strata_bin())
        .arg("bench")
        .arg(format!("--endpoints={endpoints}"))
        .args(args)
        .env("STRATA_LOG", "warn")
        .output()
        .expect("run strata bench");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn watch_deliveries_are_split_by_the_endpoint_of_each_stream() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (client, peer) = (free_port(), free_port());
    let client_url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let args = vec![
        "--name=split".to_string(),
        format!("--data-dir={}", dir.path().join("data").display()),
        format!("--listen-client-urls={client_url}"),
        format!("--advertise-client-urls={client_url}"),
        format!("--listen-peer-urls={peer_url}"),
        format!("--initial-advertise-peer-urls={peer_url}"),
        format!("--initial-cluster=split={peer_url}"),
    ];
    let _etcd = ChildGuard::spawn(
        "etcd",
        Path::new("etcd"),
        &args,
        Some(&dir.path().join("etcd.log")),
    );
    let endpoint = format!("127.0.0.1:{client}");
    wait_for_port(endpoint.parse().expect("addr"), ETCD_READY_TIMEOUT);
    let deadline = Instant::now() + ETCD_READY_TIMEOUT;
    loop {
        let (ok, _, err) = bench(
            &endpoint,
            &[
                "put",
                "--total",
                "1",
                "--key-prefix",
                "ready/",
                "--key-size",
                "7",
            ],
        );
        if ok {
            break;
        }
        assert!(Instant::now() < deadline, "etcd never served a put: {err}");
        pause(RETRY_PAUSE);
    }

    // Three endpoint entries (the same member), three connections: stream s uses connection
    // s % 3, i.e. endpoint entry s % 3. Six streams of five watchers: two streams, ten
    // watchers, per entry; ten puts, so 100 deliveries under each.
    let endpoints = format!("{endpoint},{endpoint},{endpoint}");
    let (ok, out, err) = bench(
        &endpoints,
        &[
            "--json",
            "--conns",
            "3",
            "watch",
            "--watchers",
            "30",
            "--streams",
            "6",
            "--put-total",
            "10",
        ],
    );
    assert!(ok, "strata bench watch failed: {err}\nstdout: {out}");
    let report: serde_json::Value =
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"));
    assert_eq!(report["verify"]["ok"], true, "{report}");
    assert_eq!(report["verify"]["delivered"], 300, "{report}");
    let split = report["delivery_by_endpoint"]
        .as_array()
        .unwrap_or_else(|| panic!("no delivery_by_endpoint: {report}"));
    assert_eq!(split.len(), 3, "{report}");
    for e in split {
        assert_eq!(e["endpoint"], endpoint.as_str(), "{report}");
        assert_eq!(e["from_ack"]["ok"], 100, "{report}");
        assert_eq!(e["from_send"]["ok"], 100, "{report}");
    }

    // Two connections over the three entries: the third endpoint entry carries nothing.
    let (ok, out, err) = bench(
        &endpoints,
        &[
            "--json",
            "--conns",
            "2",
            "watch",
            "--watchers",
            "20",
            "--streams",
            "4",
            "--put-total",
            "5",
        ],
    );
    assert!(ok, "strata bench watch failed: {err}\nstdout: {out}");
    let report: serde_json::Value =
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"));
    let counts: Vec<u64> = report["delivery_by_endpoint"]
        .as_array()
        .unwrap_or_else(|| panic!("no delivery_by_endpoint: {report}"))
        .iter()
        .map(|e| e["from_ack"]["ok"].as_u64().expect("ok count"))
        .collect();
    assert_eq!(counts, [50, 50, 0], "{report}");
}
