//! `strata bench watch`'s delivery latency split by endpoint (`delivery_by_endpoint`), against a
//! real etcd (Debian's 3.4, one member on loopback) named three times in `--endpoints`: every
//! watcher's deliveries are counted under the endpoint its stream's connection went to.

use std::process::Command;

use strata_tests::etcd::EtcdServer;
use strata_tests::process::strata_bin;

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

#[tokio::test]
async fn watch_deliveries_are_split_by_the_endpoint_of_each_stream() {
    let etcd = EtcdServer::start().await;
    let endpoint = etcd.endpoint().trim_start_matches("http://").to_string();

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
