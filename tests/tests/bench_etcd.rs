//! `strata bench` against a real etcd (Debian's 3.4, one member on loopback): every workload
//! runs to completion with the counts it was asked for, the watch check passes, and failures
//! (unreachable endpoint, bad flags, server errors) are reported as failures.

use std::path::Path;
use std::process::{Command, Output};
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

struct Etcd {
    endpoint: String,
    /// What `strata bench` needs to reach it (its TLS flags, if it serves TLS).
    flags: Vec<String>,
    _child: ChildGuard,
    _dir: tempfile::TempDir,
}

fn start_etcd() -> Etcd {
    start_etcd_with(false)
}

/// One etcd member; with `tls`, its client port serves TLS and demands client certificates
/// (`--client-cert-auth`) of a CA made for it.
fn start_etcd_with(tls: bool) -> Etcd {
    let dir = tempfile::tempdir().expect("temp dir");
    let (client, peer) = (free_port(), free_port());
    let scheme = if tls { "https" } else { "http" };
    let client_url = format!("{scheme}://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let mut flags = Vec::new();
    let mut args = vec![
        "--name=bench".to_string(),
        format!("--data-dir={}", dir.path().join("data").display()),
        format!("--listen-client-urls={client_url}"),
        format!("--advertise-client-urls={client_url}"),
        format!("--listen-peer-urls={peer_url}"),
        format!("--initial-advertise-peer-urls={peer_url}"),
        format!("--initial-cluster=bench={peer_url}"),
    ];
    if tls {
        let ca = strata_tests::certs::Ca::new();
        let ca_file = ca.write(dir.path());
        let (cert, key) = ca.server(&["127.0.0.1"]).write(dir.path(), "server");
        let (client_cert, client_key) = ca.client("bench", &[]).write(dir.path(), "client");
        let path = |p: &Path| p.display().to_string();
        args.extend([
            format!("--cert-file={}", path(&cert)),
            format!("--key-file={}", path(&key)),
            format!("--trusted-ca-file={}", path(&ca_file)),
            "--client-cert-auth".into(),
        ]);
        flags = vec![
            format!("--cacert={}", path(&ca_file)),
            format!("--cert={}", path(&client_cert)),
            format!("--key={}", path(&client_key)),
        ];
    }
    let log = dir.path().join("etcd.log");
    let child = ChildGuard::spawn("etcd", Path::new("etcd"), &args, Some(&log));
    wait_for_port(
        format!("127.0.0.1:{client}").parse().expect("addr"),
        ETCD_READY_TIMEOUT,
    );
    let etcd = Etcd {
        endpoint: format!("127.0.0.1:{client}"),
        flags,
        _child: child,
        _dir: dir,
    };
    // Listening is not serving: wait until a put succeeds (the member has elected itself).
    let deadline = Instant::now() + ETCD_READY_TIMEOUT;
    loop {
        let out = bench(
            &etcd,
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
        if out.status.success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "etcd never served a put: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        pause(RETRY_PAUSE);
    }
    etcd
}

fn bench(etcd: &Etcd, args: &[&str]) -> Output {
    bench_with(etcd, &etcd.flags, args)
}

/// `bench` with `flags` in place of the ones `etcd` needs.
fn bench_with(etcd: &Etcd, flags: &[String], args: &[&str]) -> Output {
    let mut cmd = Command::new(strata_bin());
    cmd.arg("bench")
        .arg(format!("--endpoints={}", etcd.endpoint))
        .args(flags)
        .args(args)
        .env("STRATA_LOG", "warn");
    cmd.output().expect("run strata bench")
}

/// Runs `strata bench --json ARGS`, demands success, returns the parsed report.
fn bench_json(etcd: &Etcd, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let out = bench(etcd, &all);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "strata bench {args:?} failed: {}\nstdout: {stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

/// A watch-latency run of `watchers` watchers and `total` puts delivers every event to every
/// watcher.
fn watch_latency_delivers(etcd: &Etcd, watchers: u64, total: u64) {
    let (w, t) = (watchers.to_string(), total.to_string());
    let wl = bench_json(
        etcd,
        &[
            "watch-latency",
            "--watchers",
            &w,
            "--total",
            &t,
            "--put-rate",
            "0",
        ],
    );
    assert_eq!(wl["verify"]["ok"], true, "{wl}");
    assert_eq!(wl["verify"]["delivered"], watchers * total, "{wl}");
}

/// `--cacert`, `--cert`, `--key`: the KV workloads (raw HTTP/2 over TLS) and the watch ones
/// (tonic over TLS) run against an etcd that demands client certificates; without a client
/// certificate, nothing runs.
#[test]
fn the_workloads_run_over_tls_with_client_certificates() {
    let etcd = start_etcd_with(true);
    let put = bench_json(
        &etcd,
        &["put", "--clients", "4", "--conns", "2", "--total", "200"],
    );
    assert_eq!(
        (put["ok"].clone(), put["errors"].clone()),
        (200.into(), 0.into()),
        "{put}"
    );
    let range = bench_json(&etcd, &["range", "000000", "--prefix", "--total", "100"]);
    assert_eq!(range["ok"], 100, "{range}");
    watch_latency_delivers(&etcd, 3, 10);

    // The CA alone: etcd refuses the handshake.
    let out = bench_with(&etcd, &etcd.flags[..1], &["put", "--total", "1"]);
    assert!(!out.status.success(), "served without a client certificate");
}

#[test]
fn every_workload_runs_against_etcd() {
    let etcd = start_etcd();

    // Eight clients over two connections, as every put run here.
    const PUT: [&str; 5] = ["put", "--clients", "8", "--conns", "2"];
    let put = bench_json(
        &etcd,
        &[
            &PUT[..],
            &[
                "--total",
                "400",
                "--val-size",
                "64",
                "--key-space-size",
                "100",
                "--sequential-keys",
            ],
        ]
        .concat(),
    );
    assert_eq!(put["workload"], "put");
    assert_eq!(put["ok"], 400, "{put}");
    assert_eq!(put["errors"], 0, "{put}");
    assert!(put["rps"].as_f64().unwrap() > 0.0);
    let lat = &put["latency_ms"];
    assert!(lat["p50"].as_f64().unwrap() <= lat["p99"].as_f64().unwrap());
    assert!(lat["p99"].as_f64().unwrap() <= lat["max"].as_f64().unwrap());

    // The same with idle watchers held open (created before the puts, never sent an event:
    // the run fails otherwise), of each kind.
    for kind in ["key", "prefix", "range"] {
        let idle = bench_json(
            &etcd,
            &[
                &PUT[..],
                &[
                    "--total",
                    "200",
                    "--idle-watchers",
                    "250",
                    "--idle-watch-kind",
                    kind,
                ],
            ]
            .concat(),
        );
        assert_eq!(
            (idle["ok"].clone(), idle["errors"].clone()),
            (200.into(), 0.into()),
            "{idle}"
        );
    }

    for consistency in ["l", "s"] {
        let range = bench_json(
            &etcd,
            &[
                "range",
                "000000",
                "--prefix",
                "--consistency",
                consistency,
                "--clients",
                "4",
                "--total",
                "200",
            ],
        );
        assert_eq!(range["ok"], 200, "{range}");
        assert_eq!(range["errors"], 0, "{range}");
    }

    let txn = bench_json(
        &etcd,
        &[
            "txn-put",
            "--clients",
            "4",
            "--total",
            "100",
            "--txn-ops",
            "3",
            "--key-space-size",
            "10",
        ],
    );
    assert_eq!(txn["ok"], 100, "{txn}");

    // The put phase wrote keys 00000000..00000099, so the first CAS on each key (which expects
    // "absent", mod_revision 0) must conflict; the Get teaches the run the key's revision, and
    // a compare on the right revision fails only if another CAS on that key just succeeded.
    let cas = bench_json(
        &etcd,
        &[
            "txn-cas",
            "--clients",
            "4",
            "--total",
            "200",
            "--key-space-size",
            "2",
        ],
    );
    assert_eq!(cas["ok"], 200, "{cas}");
    let conflicts = cas["conflicts"].as_u64().unwrap();
    assert!((1..200).contains(&conflicts), "{cas}");

    let watch = bench_json(
        &etcd,
        &[
            "--conns",
            "2",
            "watch",
            "--watchers",
            "50",
            "--streams",
            "5",
            "--put-total",
            "30",
            "--put-clients",
            "2",
            "--watched-keys",
            "3",
        ],
    );
    let v = &watch["verify"];
    assert_eq!(v["ok"], true, "{watch}");
    assert_eq!(v["expected"], 1500, "{watch}");
    assert_eq!(v["delivered"], 1500, "{watch}");
    assert_eq!(watch["delivery_from_ack"]["ok"], 1500, "{watch}");

    watch_latency_delivers(&etcd, 5, 20);

    // Lock and election cycles, each client its own name and all on one name: every cycle is
    // done, and the clients' leases are revoked at the end.
    for (workload, names) in [("lock", "8"), ("lock", "1"), ("election", "1")] {
        let cycles = bench_json(
            &etcd,
            &[
                "--clients",
                "8",
                "--conns",
                "2",
                workload,
                "--total",
                "200",
                "--names",
                names,
            ],
        );
        assert_eq!(cycles["workload"], workload);
        assert_eq!(
            (cycles["ok"].clone(), cycles["errors"].clone()),
            (200.into(), 0.into()),
            "{workload} over {names} name(s): {cycles}"
        );
        let leases = strata_tests::etcdctl::Etcdctl::new(&etcd.endpoint).ok(&["lease", "list"]);
        assert!(leases.contains("found 0 leases"), "{workload}: {leases}");
    }

    // Server-side errors are counted with etcd's message, and a run where nothing succeeds fails.
    let out = bench(
        &etcd,
        &[
            "--json",
            "txn-put",
            "--total",
            "3",
            "--txn-ops",
            "129",
            "--key-space-size",
            "200",
        ],
    );
    assert!(!out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).expect("JSON report");
    assert_eq!(report["errors"], 3, "{report}");
    let messages = report["error_messages"].to_string();
    assert!(
        messages.contains("too many operations in txn request"),
        "{messages}"
    );
}

#[test]
fn unreachable_endpoints_and_bad_flags_fail() {
    let port = free_port(); // nothing listens here
    let out = Command::new(strata_bin())
        .args([
            "bench",
            &format!("--endpoints=127.0.0.1:{port}"),
            "put",
            "--total",
            "1",
        ])
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot connect"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(strata_bin())
        .args(["bench", "put", "--clients", "0"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--clients"));
}
