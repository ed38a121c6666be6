//! Moving a keyspace from etcd into Strata with etcd's own tool: `etcdctl make-mirror` from a
//! real etcd 3.4 (Debian's) into `strata dev` copies every key under a prefix, then follows
//! etcd's changes (puts, deletes, a txn) until stopped, as an operator would run it before
//! pointing a cluster's API servers at Strata (docs/OPERATIONS.md, "Moving a cluster from
//! etcd"). Strata only (skipped with `STRATA_TEST_TARGET=etcd`).

use std::time::{Duration, Instant};

use strata_tests::deployment::DevDeployment;
use strata_tests::etcd::EtcdServer;
use strata_tests::etcdctl::Etcdctl;
use strata_tests::target::{TargetKind, target_kind};

/// The prefix mirrored (Kubernetes keeps everything under it).
const PREFIX: &str = "/registry/";
/// How long the mirror may take to catch up with etcd on a busy 2-core machine.
const CATCH_UP: Duration = Duration::from_secs(90);
/// Pause between two comparisons of the keyspaces.
const POLL: Duration = Duration::from_millis(250);

/// Every key and value under `PREFIX`, as `etcdctl get --prefix` prints them.
fn keyspace(ctl: &Etcdctl) -> String {
    ctl.ok(&["get", "--prefix", PREFIX])
}

/// Puts pods `0..count` of namespace `ns`, each valued `"pod {ns}/{i} {version}"`.
fn put_pods(ctl: &Etcdctl, ns: usize, count: usize, version: &str) {
    for i in 0..count {
        let key = format!("{PREFIX}pods/ns{ns}/pod-{i:03}");
        ctl.ok(&["put", &key, &format!("pod {ns}/{i} {version}")]);
    }
}

/// A pause between two polls of external processes.
// A plain test thread polling two processes: a blocking sleep is right.
#[allow(clippy::disallowed_methods)]
fn pause() {
    std::thread::sleep(POLL);
}

/// Waits until Strata holds exactly etcd's keys and values under `PREFIX`.
// A plain test thread polling two processes: a blocking sleep is right.
#[allow(clippy::disallowed_methods)]
fn wait_mirrored(etcd: &Etcdctl, strata: &Etcdctl, what: &str) {
    let deadline = Instant::now() + CATCH_UP;
    loop {
        let (want, got) = (keyspace(etcd), keyspace(strata));
        if want == got {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: Strata's keyspace differs from etcd's after {CATCH_UP:?}\n\
             etcd has {} lines, Strata {}",
            want.lines().count(),
            got.lines().count()
        );
        std::thread::sleep(POLL);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn make_mirror_copies_an_etcd_keyspace_into_strata_and_follows_it() {
    if target_kind() == TargetKind::Etcd {
        eprintln!("skipped: this moves data from etcd into Strata");
        return;
    }
    let source = EtcdServer::start().await;
    // As docs/OPERATIONS.md says: the mirror replays a revision as one txn, which may hold
    // more than etcd's default 128 operations.
    let dev = DevDeployment::start_with(&["--frontend-arg=--max-txn-ops=65536".to_string()]).await;
    let etcd = Etcdctl::new(source.endpoint());
    let strata = Etcdctl::new(dev.endpoint());

    // A small cluster's worth of objects: created, some updated, some deleted, one leased, and
    // keys outside the prefix that must stay behind.
    for ns in 0..5 {
        put_pods(&etcd, ns, 60, "v1");
    }
    put_pods(&etcd, 1, 50, "v2");
    etcd.ok(&["del", "--prefix", &format!("{PREFIX}pods/ns4/pod-01")]);
    let lease = etcd.ok(&["lease", "grant", "600"]);
    let lease_id = lease
        .split_whitespace()
        .nth(1)
        .unwrap_or_else(|| panic!("lease grant printed {lease:?}"));
    etcd.ok(&[
        "put",
        &format!("{PREFIX}masterleases/10.0.0.1"),
        "endpoint",
        "--lease",
        lease_id,
    ]);
    etcd.ok(&["put", "/other/not-mirrored", "x"]);

    let mirror = etcd.spawn_lines(&["make-mirror", "--prefix", PREFIX, dev.endpoint()]);
    wait_mirrored(&etcd, &strata, "the initial copy");
    assert_eq!(
        keyspace(&strata).lines().count(),
        2 * (5 * 60 - 10 + 1),
        "every object but the 10 deleted, with the leased one: a key and a value line each"
    );
    assert_eq!(strata.ok(&["get", "/other/not-mirrored"]), "");

    // etcd keeps changing while the mirror runs: it follows.
    put_pods(&etcd, 5, 30, "v1");
    etcd.ok(&["del", "--prefix", &format!("{PREFIX}pods/ns0/")]);
    etcd.ok_stdin(
        &["txn"],
        &format!(
            "value(\"{PREFIX}pods/ns2/pod-000\") = \"pod 2/0 v1\"\n\n\
             put {PREFIX}pods/ns2/pod-000 \"pod 2/0 v2\"\n\
             del {PREFIX}pods/ns2/pod-001\n\n\n"
        ),
    );
    // Events on one lease: its expiry deletes 200 keys in one etcd revision, which the mirror
    // replays as one txn of 200 deletes.
    let events_lease = etcd.ok(&["lease", "grant", "10"]);
    let events_lease = events_lease
        .split_whitespace()
        .nth(1)
        .unwrap_or_else(|| panic!("lease grant printed {events_lease:?}"))
        .to_string();
    for i in 0..200 {
        let key = format!("{PREFIX}events/ns1/ev-{i:03}");
        etcd.ok(&["put", &key, "event", "--lease", &events_lease]);
    }
    wait_mirrored(&etcd, &strata, "the changes made while mirroring");
    let events = format!("{PREFIX}events/");
    let deadline = Instant::now() + CATCH_UP;
    while !etcd
        .ok(&["get", "--prefix", "--keys-only", &events])
        .is_empty()
    {
        assert!(
            Instant::now() < deadline,
            "etcd's events lease never expired"
        );
        pause();
    }
    wait_mirrored(&etcd, &strata, "a lease expiry of 200 keys in one revision");
    assert_eq!(strata.ok(&["get", "--prefix", "--keys-only", &events]), "");
    assert_eq!(
        strata.ok(&[
            "get",
            "--print-value-only",
            &format!("{PREFIX}pods/ns2/pod-000")
        ]),
        "pod 2/0 v2\n"
    );
    assert_eq!(
        strata.ok(&[
            "get",
            "--prefix",
            "--keys-only",
            &format!("{PREFIX}pods/ns0/")
        ]),
        ""
    );
    // Leases are not mirrored: the key arrives as a plain key (docs/OPERATIONS.md).
    let leased = format!("{PREFIX}masterleases/10.0.0.1");
    assert!(
        etcd.ok(&["get", &leased, "-w", "fields"])
            .contains(&format!(
                "\"Lease\" : {}",
                i64::from_str_radix(lease_id, 16).unwrap()
            )),
        "etcd's key carries its lease"
    );
    assert!(
        strata
            .ok(&["get", &leased, "-w", "fields"])
            .contains("\"Lease\" : 0"),
        "the mirrored key has no lease"
    );
    drop(mirror);
}
