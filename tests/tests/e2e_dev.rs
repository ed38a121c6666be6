//! `strata dev` itself: what it prints, its HTTP endpoints, supervision of a child that dies,
//! a clean exit 0 on SIGTERM with no process left behind, and a restart on the same data dir
//! keeping the data. Strata only (skipped with `STRATA_TEST_TARGET=etcd`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use strata_tests::deployment::DevDeployment;
use strata_tests::etcdctl::Etcdctl;
use strata_tests::target::{TargetKind, target_kind};

/// How long `strata dev` may take to notice and report a dead child.
const REPORT_DEADLINE: Duration = Duration::from_secs(30);
/// Bound on one HTTP request to the metrics port.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause between two looks at the dev log.
const POLL: Duration = Duration::from_millis(100);

/// `GET path` on `addr`: (status code, body).
fn http_get(addr: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(HTTP_TIMEOUT)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let code = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not HTTP: {out:?}"));
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (code, body.to_string())
}

/// The pid `strata dev` logged for `child` ("started child=\"journal-2\" pid=123").
fn child_pid(log: &str, child: &str) -> u32 {
    let needle = format!("child=\"{child}\" pid=");
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains(&needle))
        .unwrap_or_else(|| panic!("no start line for {child} in:\n{log}"));
    let rest = &line[line.find(&needle).unwrap() + needle.len()..];
    rest.split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// Waits until `strata dev` has printed `text`.
fn wait_for_log(dev: &DevDeployment, text: &str) {
    let deadline = Instant::now() + REPORT_DEADLINE;
    while !dev.log().contains(text) {
        assert!(
            Instant::now() < deadline,
            "strata dev did not print {text:?}:\n{}",
            dev.log()
        );
        pause();
    }
}

fn pause() {
    // Test thread polling a file written by another process.
    #[allow(clippy::disallowed_methods)]
    std::thread::sleep(POLL);
}

#[tokio::test]
async fn dev_prints_serves_supervises_stops_and_restarts() {
    if target_kind() == TargetKind::Etcd {
        eprintln!("skipped: this tests `strata dev`, not etcd");
        return;
    }
    let mut dev = DevDeployment::start().await;
    let endpoint = dev.endpoint().to_string();
    // The harness's own probe may succeed before `strata dev`'s /readyz poll prints "ready".
    wait_for_log(&dev, "Ctrl-C stops everything.");
    let printed = dev.log();
    for line in [
        "strata dev: data in ",
        "  journal-1   127.0.0.1:",
        "  journal-2   127.0.0.1:",
        "  journal-3   127.0.0.1:",
        &format!("  frontend    {endpoint} (etcd v3 gRPC)"),
        &format!("  metrics     http://{}/metrics", dev.metrics_addr()),
        "ready. Try:",
        &format!(
            "etcdctl --endpoints={} put greeting hello",
            endpoint.trim_start_matches("http://")
        ),
    ] {
        assert!(printed.contains(line), "missing {line:?} in:\n{printed}");
    }
    let pinned = std::fs::read_to_string(dev.dir().join("data/dev-ports")).unwrap();
    assert_eq!(pinned.lines().count(), 3, "{pinned}");

    // HTTP endpoints of the frontend.
    assert_eq!(http_get(dev.metrics_addr(), "/health").0, 200);
    assert_eq!(http_get(dev.metrics_addr(), "/readyz").0, 200);
    let (code, metrics) = http_get(dev.metrics_addr(), "/metrics");
    assert_eq!(code, 200);
    assert!(
        metrics.contains("# TYPE"),
        "not Prometheus text: {metrics:.200}"
    );

    let ctl = Etcdctl::new(&endpoint);
    assert_eq!(ctl.ok(&["put", "greeting", "hello"]), "OK\n");

    // A journal node dies: strata dev says so, and the deployment keeps serving on two.
    let pid = child_pid(&printed, "journal-3");
    let killed = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    wait_for_log(&dev, "strata dev: journal-3 exited");
    assert_eq!(ctl.ok(&["put", "greeting", "still-here"]), "OK\n");

    // SIGTERM: children stopped, exit status 0, nothing of the group left.
    let pgid = dev.pid().unwrap();
    let status = dev.restart().await;
    let status = status.expect("strata dev stopped within its grace period");
    assert!(status.success(), "strata dev exited with {status}");
    let log = dev.log();
    assert!(log.contains("strata dev: SIGTERM, stopping..."), "{log}");
    for child in ["frontend", "compactor", "journal-1", "journal-2"] {
        assert!(
            log.contains(&format!("  {child} stopped")),
            "{child}: {log}"
        );
    }
    assert!(log.contains("strata dev: stopped"), "{log}");
    assert_eq!(
        dev.left_processes_behind(),
        Some(false),
        "processes of dev's group outlived it"
    );
    assert!(
        DevDeployment::group_is_gone(pgid),
        "processes of the old group are left"
    );

    // The restart reused the pinned journal ports and kept the data.
    assert_eq!(
        std::fs::read_to_string(dev.dir().join("data/dev-ports")).unwrap(),
        pinned
    );
    let ctl = Etcdctl::new(dev.endpoint());
    assert_eq!(
        ctl.ok(&["get", "greeting", "--print-value-only"]),
        "still-here\n"
    );
}
