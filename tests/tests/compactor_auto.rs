//! Auto-compaction (`strata compactor --auto-compaction-mode revision|periodic`) against three
//! journal processes and a frontend process: history is written through the frontend, the
//! compactor journals a Compact, and the frontend then refuses reads below the compact revision
//! with etcd's error while the retained history still reads.

use std::path::Path;
use std::time::Duration;

use etcd_client::{Client, GetOptions, WatchOptions};
use strata_tests::deployment::Deployment;
use strata_tests::process::ChildGuard;
use strata_tests::readiness::tail_file;

const WAIT: Duration = Duration::from_secs(60);
const COMPACTED: &str = "etcdserver: mvcc: required revision has been compacted";

fn compactor_args(d: &Deployment, objects: &Path, auto: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "compactor",
        "--journal",
        &d.journal_addrs().join(","),
        "--object-store",
        &format!("file://{}", objects.display()),
        "--every",
        "1s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(auto.iter().map(|s| s.to_string()));
    args
}

/// The frontend's compact revision, as an etcd client learns it: a watch of `k` (written by
/// every test) from revision 1 is cancelled with `compact_revision` once history below it is
/// gone, and replays `k`'s events while nothing is (then 0).
async fn compact_revision(c: &mut Client) -> i64 {
    let mut stream = c
        .watch("k", Some(WatchOptions::new().with_start_revision(1)))
        .await
        .unwrap();
    loop {
        let r = tokio::time::timeout(WAIT, stream.message())
            .await
            .expect("watch answers")
            .unwrap()
            .expect("watch stream open");
        if r.canceled() {
            assert!(
                r.compact_revision() > 0,
                "cancelled without compaction: {r:?}"
            );
            return r.compact_revision();
        }
        if !r.events().is_empty() {
            return 0;
        }
    }
}

/// Waits until the frontend reports a compact revision of at least `at_least`.
async fn wait_compacted(c: &mut Client, at_least: i64, log: &Path) -> i64 {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let got = compact_revision(c).await;
        if got >= at_least {
            return got;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no auto-compaction to {at_least} (frontend at {got})\n--- compactor log ---\n{}",
            tail_file(log)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn assert_compacted_read(c: &mut Client, revision: i64) {
    match c
        .get("k", Some(GetOptions::new().with_revision(revision)))
        .await
    {
        Err(etcd_client::Error::GRpcStatus(s)) => {
            assert_eq!(s.code(), tonic::Code::OutOfRange);
            assert_eq!(s.message(), COMPACTED);
        }
        other => panic!("read at compacted revision {revision}: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revision_mode_keeps_the_last_n_revisions() {
    const RETENTION: i64 = 10;
    let d = Deployment::start(1).await;
    let log = d.dir().join("compactor.log");
    let _compactor = ChildGuard::strata(
        "compactor",
        &compactor_args(
            &d,
            &d.dir().join("objects"),
            &[
                "--auto-compaction-mode",
                "revision",
                "--auto-compaction-retention",
                &RETENTION.to_string(),
                "--auto-compaction-check-interval",
                "200ms",
            ],
        ),
        Some(&log),
    );
    let mut c = Client::connect([d.frontend(0).endpoint()], None)
        .await
        .unwrap();
    let mut head = 0;
    for i in 0..30 {
        head = c
            .put("k", format!("v{i}"), None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
    }
    // Writes stopped at `head`: the policy ends at exactly head - RETENTION.
    let want = head - RETENTION;
    let got = wait_compacted(&mut c, want, &log).await;
    assert_eq!(
        got, want,
        "revision mode keeps exactly {RETENTION} revisions"
    );
    assert_compacted_read(&mut c, want - 1).await;
    let kept = c
        .get("k", Some(GetOptions::new().with_revision(want)))
        .await
        .unwrap();
    assert_eq!(kept.kvs()[0].mod_revision(), want);
    // No further compaction without writes (etcd skips a revision it already compacted at).
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(compact_revision(&mut c).await, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_mode_compacts_history_older_than_the_retention() {
    let d = Deployment::start(1).await;
    let log = d.dir().join("compactor.log");
    let _compactor = ChildGuard::strata(
        "compactor",
        &compactor_args(
            &d,
            &d.dir().join("objects"),
            &[
                "--auto-compaction-mode",
                "periodic",
                "--auto-compaction-retention",
                "2s",
            ],
        ),
        Some(&log),
    );
    let mut c = Client::connect([d.frontend(0).endpoint()], None)
        .await
        .unwrap();
    let first = c
        .put("k", "first", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    // Keep writing until the frontend reports a compaction past the first write.
    let deadline = tokio::time::Instant::now() + WAIT;
    let (compacted, head) = loop {
        let head = c
            .put("k", "more", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        let got = compact_revision(&mut c).await;
        if got > first {
            break (got, head);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no periodic compaction\n--- compactor log ---\n{}",
            tail_file(&log)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Periodic compacts at a revision sampled at least one window earlier: never past the head.
    assert!(compacted <= head, "compacted {compacted}, head {head}");
    assert_compacted_read(&mut c, first).await;
    let latest = c
        .get("k", Some(GetOptions::new().with_revision(head)))
        .await
        .unwrap();
    assert_eq!(latest.kvs()[0].mod_revision(), head);
}
