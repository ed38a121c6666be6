//! `strata bench watch`'s delivery latency split by endpoint (`delivery_by_endpoint`), against a
//! real etcd (Debian's 3.4, one member on loopback) named three times in `--endpoints`: every
//! watcher's deliveries are counted under the endpoint its stream's connection went to.

use std::process::Command;

use serde_json::Value;

use strata_tests::etcd::EtcdServer;
use strata_tests::process::strata_bin;

/// Runs `strata bench --endpoints=ENDPOINTS --json --conns CONNS watch --watchers W --streams S
/// --put-total P`, which must succeed, and returns its JSON report.
fn watch_report(endpoints: &str, conns: u32, watchers: u32, streams: u32, puts: u32) -> Value {
    let out = Command::new(strata_bin())
        .arg("bench")
        .arg(format!("--endpoints={endpoints}"))
        .args(["--json", "--conns", &conns.to_string(), "watch"])
        .args(["--watchers", &watchers.to_string()])
        .args(["--streams", &streams.to_string()])
        .args(["--put-total", &puts.to_string()])
        .env("STRATA_LOG", "warn")
        .output()
        .expect("run strata bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "strata bench watch failed: {}\nstdout: {stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

#[tokio::test]
async fn watch_deliveries_are_split_by_the_endpoint_of_each_stream() {
    let etcd = EtcdServer::start().await;
    let endpoint = etcd.endpoint().trim_start_matches("http://").to_string();

    // Three endpoint entries (the same member), three connections: stream s uses connection
    // s % 3, i.e. endpoint entry s % 3. Six streams of five watchers: two streams, ten
    // watchers, per entry; ten puts, so 100 deliveries under each.
    let endpoints = format!("{endpoint},{endpoint},{endpoint}");
    let report = watch_report(&endpoints, 3, 30, 6, 10);
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
    let report = watch_report(&endpoints, 2, 20, 4, 5);
    let counts: Vec<u64> = report["delivery_by_endpoint"]
        .as_array()
        .unwrap_or_else(|| panic!("no delivery_by_endpoint: {report}"))
        .iter()
        .map(|e| e["from_ack"]["ok"].as_u64().expect("ok count"))
        .collect();
    assert_eq!(counts, [50, 50, 0], "{report}");
}
