//! A frontend stopped (SIGSTOP) while the compactor checkpoints and trims the journal past its
//! position, then resumed (SIGCONT): it reloads the newest checkpoint instead of exiting, serves
//! the same data as a frontend that never stopped (equal HashKV), and a watch opened on it
//! before the stop still receives every event, once and in order.

use std::process::Command;
use std::time::{Duration, Instant};

use api::strata::journal::StatusRequest;
use api::strata::journal::journal_client::JournalClient;
use etcd_client::{Client, EventType, WatchOptions};
use strata_tests::deployment::{Deployment, frontend_args};
use strata_tests::process::{ChildGuard, free_port};
use strata_tests::readiness::{tail_file, wait_ready};

/// Generous bound for every wait (a busy 2-core machine, a compactor round every second).
const WAIT: Duration = Duration::from_secs(90);
/// Writes made while the frontend is stopped, before waiting for the trim: with `VALUE_BYTES`
/// each (6.4 MB), far more than the journal's read stream to the stopped frontend can buffer
/// (its queue and hyper's 2 MB HTTP/2 stream window), so the stream is still behind when the
/// trim comes.
const WRITES_WHILE_STOPPED: usize = 400;
const VALUE_BYTES: usize = 16 * 1024;
const PREFIX: &str = "rl/";

/// (first retained index, committed index) of shard 0 on one journal node.
async fn journal_status(journal: &str) -> Option<(u64, u64)> {
    let mut c = JournalClient::connect(format!("http://{journal}"))
        .await
        .ok()?;
    let s = c
        .status(StatusRequest { shard: 0 })
        .await
        .ok()?
        .into_inner();
    Some((s.first_index, s.committed_index))
}

fn signal(child: &ChildGuard, sig: &str) {
    let pid = child.id().expect("the frontend runs").to_string();
    let ok = Command::new("kill")
        .args([sig, &pid])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill {sig} {pid} failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_frontend_reloads_a_checkpoint_after_the_journal_was_trimmed_past_it() {
    let d = Deployment::start(1).await;
    let objects = d.objects();
    let _compactor =
        d.start_compactor(&["--every-entries", "50", "--every", "1s", "--trim-lag", "0"]);
    let listen = format!("127.0.0.1:{}", free_port());
    let metrics = format!("127.0.0.1:{}", free_port());
    let log = d.dir().join("frontend-reload.log");
    let mut args = frontend_args(d.journal_addrs(), &listen, &metrics, &[]);
    args.extend(["--object-store".into(), objects.display().to_string()]);
    let mut fe = ChildGuard::strata("frontend-reload", &args, Some(&log));
    let endpoint = format!("http://{listen}");
    if let Err(e) = wait_ready(&endpoint, WAIT).await {
        panic!("{e}\n--- frontend log ---\n{}", tail_file(&log));
    }

    let mut w = Client::connect([d.frontend(0).endpoint()], None)
        .await
        .unwrap();
    let mut f = Client::connect([endpoint.clone()], None).await.unwrap();
    let mut acked = Vec::new(); // (key, revision) of every acknowledged put, in order
    for i in 0..20 {
        let key = format!("{PREFIX}before/{i:03}");
        let r = w.put(key.clone(), "b", None).await.unwrap();
        acked.push((key, r.header().unwrap().revision()));
    }
    let start = f
        .get(PREFIX, None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision()
        + 1;
    let mut events = f
        .watch(
            PREFIX,
            Some(WatchOptions::new().with_prefix().with_start_revision(start)),
        )
        .await
        .unwrap();
    acked.retain(|(_, rev)| *rev >= start);

    // Stop the frontend, then write until every journal node trimmed past its position.
    signal(&fe, "-STOP");
    let mut stopped_at = 0;
    for j in d.journal_addrs() {
        if let Some((_, committed)) = journal_status(j).await {
            stopped_at = stopped_at.max(committed);
        }
    }
    let mut n = 0usize;
    let deadline = Instant::now() + WAIT;
    loop {
        let batch = if n == 0 { WRITES_WHILE_STOPPED } else { 5 };
        for _ in 0..batch {
            let key = format!("{PREFIX}during/{n:05}");
            let r = w
                .put(key.clone(), vec![b'd'; VALUE_BYTES], None)
                .await
                .unwrap();
            acked.push((key, r.header().unwrap().revision()));
            n += 1;
        }
        let mut all_trimmed = true;
        for j in d.journal_addrs() {
            let first = journal_status(j).await.map_or(0, |(first, _)| first);
            all_trimmed &= first > stopped_at + 1;
        }
        if all_trimmed {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the journal was never trimmed past index {stopped_at}\n--- compactor log ---\n{}",
            tail_file(&d.dir().join("compactor.log"))
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Resume it: it must reload and serve, not exit.
    signal(&fe, "-CONT");
    let last_key = format!("{PREFIX}after");
    let r = w.put(last_key.clone(), "a", None).await.unwrap();
    let last_rev = r.header().unwrap().revision();
    acked.push((last_key.clone(), last_rev));
    let deadline = Instant::now() + WAIT;
    loop {
        assert!(
            fe.is_running(),
            "the resumed frontend exited\n--- its log ---\n{}",
            tail_file(&log)
        );
        if let Ok(Ok(got)) =
            tokio::time::timeout(Duration::from_secs(5), f.get(last_key.clone(), None)).await
            && got.kvs().len() == 1
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the resumed frontend never served the last write\n--- its log ---\n{}",
            tail_file(&log)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        text.contains("reloaded the newest checkpoint"),
        "the resumed frontend caught up without a reload (the journal kept its position?)\n{}",
        tail_file(&log)
    );
    assert_eq!(
        f.hash_kv(last_rev).await.unwrap().hash(),
        w.hash_kv(last_rev).await.unwrap().hash(),
        "the reloaded replica differs at revision {last_rev}"
    );

    // The watch opened before the stop saw every acknowledged put, once, in revision order.
    let mut seen = Vec::new();
    let deadline = Instant::now() + WAIT;
    while seen.last().map(|(_, rev)| *rev) != Some(last_rev) {
        let left = deadline.saturating_duration_since(Instant::now());
        let msg = tokio::time::timeout(left, events.message())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "the watch stalled after {} of {} events",
                    seen.len(),
                    acked.len()
                )
            })
            .unwrap()
            .expect("the watch stream ended");
        assert!(
            !msg.canceled(),
            "the watch was cancelled: {:?} (compact revision {})",
            msg.cancel_reason(),
            msg.compact_revision()
        );
        for e in msg.events() {
            assert_eq!(e.event_type(), EventType::Put);
            let kv = e.kv().unwrap();
            seen.push((kv.key_str().unwrap().to_string(), kv.mod_revision()));
        }
    }
    assert_eq!(seen, acked, "events missing, repeated or out of order");
}
