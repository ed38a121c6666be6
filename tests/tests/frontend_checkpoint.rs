//! A frontend started after the compactor checkpointed and trimmed the journal: with
//! `--object-store` it starts from the newest checkpoint, tails the rest and serves the same
//! data (equal HashKV); without it, it refuses to serve a partial replica and exits.

use std::time::{Duration, Instant};

use etcd_client::{Client, GetOptions};
use strata_tests::deployment::{Deployment, frontend_args};
use strata_tests::journal::first_index_of;
use strata_tests::process::{ChildGuard, free_port, strata_bin};
use strata_tests::procstat::cpu_and_faults;
use strata_tests::readiness::{tail_file, wait_ready};

const KEYS: usize = 300;
const WAIT: Duration = Duration::from_secs(90);

async fn first_index(journal: &str) -> u64 {
    first_index_of(journal, 0).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frontend_starts_from_checkpoint_after_trim() {
    let d = Deployment::start(1).await;
    let objects = d.objects();
    let _compactor =
        d.start_compactor(&["--every-entries", "50", "--every", "1s", "--trim-lag", "0"]);
    let mut c = Client::connect([d.frontend(0).endpoint()], None)
        .await
        .unwrap();
    // Auth state too, written before the trim: only the checkpoint holds it then.
    c.user_add("alice", "pw", None).await.unwrap();
    c.role_add("reader").await.unwrap();
    c.user_grant_role("alice", "reader").await.unwrap();
    for i in 0..KEYS {
        c.put(format!("ck/{i:04}"), format!("v{i}"), None)
            .await
            .unwrap();
    }
    // Wait until the compactor trimmed the journal (so a replay from index 1 is impossible).
    let deadline = Instant::now() + WAIT;
    loop {
        let mut trimmed = false;
        for j in d.journal_addrs() {
            if first_index(j).await > 1 {
                trimmed = true;
            }
        }
        if trimmed {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "journal never trimmed\n--- compactor log ---\n{}",
            tail_file(&d.dir().join("compactor.log"))
        );
        // Keep writing so the compactor has rounds to run.
        c.put("ck/tick", "t", None).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A few writes after the checkpoint: the new frontend must tail them from the journal.
    for i in 0..20 {
        c.put(format!("ck/after/{i:02}"), "a", None).await.unwrap();
    }

    // With --object-store: starts from the checkpoint and serves everything.
    let listen = format!("127.0.0.1:{}", free_port());
    let metrics = format!("127.0.0.1:{}", free_port());
    let log = d.dir().join("frontend-ckpt.log");
    let mut args = frontend_args(d.journal_addrs(), &listen, &metrics, &[]);
    args.extend(["--object-store".into(), objects.display().to_string()]);
    let _fe = ChildGuard::strata("frontend-ckpt", &args, Some(&log));
    let endpoint = format!("http://{listen}");
    if let Err(e) = wait_ready(&endpoint, WAIT).await {
        panic!("{e}\n--- frontend log ---\n{}", tail_file(&log));
    }
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        log_text.contains("starting from checkpoint"),
        "the new frontend did not use a checkpoint:\n{}",
        tail_file(&log)
    );
    let mut n = Client::connect([endpoint], None).await.unwrap();
    let all = n
        .get(
            "ck/",
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .unwrap();
    let expected = c
        .get(
            "ck/",
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .unwrap()
        .count();
    assert!(expected as usize >= KEYS + 20);
    assert_eq!(all.count(), expected);
    let rev = c
        .get("ck/", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    n.get("ck/", None).await.unwrap();
    assert_eq!(
        n.hash_kv(rev).await.unwrap().hash(),
        c.hash_kv(rev).await.unwrap().hash(),
        "the checkpoint-started replica differs at revision {rev}"
    );
    assert_eq!(n.user_list().await.unwrap().users(), ["alice"]);
    assert_eq!(n.user_get("alice").await.unwrap().roles(), ["reader"]);

    // Without --object-store: the journal's start is gone, so it must not serve; it exits.
    let listen = format!("127.0.0.1:{}", free_port());
    let metrics = format!("127.0.0.1:{}", free_port());
    let log = d.dir().join("frontend-nockpt.log");
    let mut bare = ChildGuard::strata(
        "frontend-nockpt",
        &frontend_args(d.journal_addrs(), &listen, &metrics, &[]),
        Some(&log),
    );
    let deadline = Instant::now() + WAIT;
    while bare.is_running() {
        assert!(
            Instant::now() < deadline,
            "a frontend without checkpoints kept running over a trimmed journal\n{}",
            tail_file(&log)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("trimmed"),
        "{}",
        tail_file(&log)
    );
}

/// A shard that held no tenant is trimmed by the compactor (its idle ticks would otherwise grow
/// forever), and a frontend of a new tenant on it still starts: empty, from the journal's first
/// index, on the word of the compactor's ticks-only record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_tenant_starts_on_a_shard_trimmed_while_it_held_no_tenant() {
    let d = Deployment::start(0).await;
    let _compactor =
        d.start_compactor(&["--shards", "0,1", "--every-entries", "10", "--every", "1s"]);
    // Idle ticks every 500 ms: shard 1 grows by 10 in about 5 s.
    let deadline = Instant::now() + WAIT;
    let mut trimmed = 0;
    while trimmed <= 1 {
        assert!(
            Instant::now() < deadline,
            "shard 1 was never trimmed\n--- compactor log ---\n{}",
            tail_file(&d.dir().join("compactor.log"))
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        for j in d.journal_addrs() {
            trimmed = trimmed.max(first_index_of(j, 1).await);
        }
    }
    let listen = format!("127.0.0.1:{}", free_port());
    let metrics = format!("127.0.0.1:{}", free_port());
    let log = d.dir().join("frontend-late.log");
    let mut args = frontend_args(d.journal_addrs(), &listen, &metrics, &[]);
    args.extend([
        "--tenant".into(),
        "late".into(),
        "--shard".into(),
        "1".into(),
        "--object-store".into(),
        d.objects().display().to_string(),
    ]);
    let _fe = ChildGuard::strata("frontend-late", &args, Some(&log));
    let endpoint = format!("http://{listen}");
    if let Err(e) = wait_ready(&endpoint, WAIT).await {
        panic!("{e}\n--- frontend log ---\n{}", tail_file(&log));
    }
    let mut c = Client::connect([endpoint], None).await.unwrap();
    let put = c.put("late/a", "1", None).await.unwrap();
    assert_eq!(
        put.header().unwrap().revision(),
        2,
        "a new tenant's first write"
    );
    let got = c.get("late/a", None).await.unwrap();
    assert_eq!(got.kvs()[0].value(), b"1");
}

/// Keys of the ready-timing tenant (issue 5: 1M keys of 64 bytes with 256-byte values).
const READY_KEYS_DEFAULT: usize = 1_000_000;
/// Puts per journal append while loading it.
const READY_APPEND_BATCH: usize = 5_000;
/// Puts appended after the checkpoint: the journal tail the new frontend replays.
const READY_TAIL: usize = 2_000;
/// Loading a million keys through the journal and checkpointing them takes minutes here.
const READY_WAIT: Duration = Duration::from_secs(900);

/// Time for a new `strata frontend` to serve a tenant of `STRATA_READY_KEYS` keys (default 1M)
/// from the compactor's checkpoint plus a journal tail: from spawning the process to its first
/// linearizable read, with the frontend's CPU time and minor faults up to then (`STRATA_BIN_B`
/// alternates a second binary with the first, `STRATA_READY_RUNS` sets the number of starts).
/// A measurement, run on purpose with the release binary:
/// `cargo build --release -p strata && STRATA_BIN=$CARGO_TARGET_DIR/release/strata cargo test
/// --release -p strata-tests --test frontend_checkpoint ready_timing -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn ready_timing_on_a_large_tenant() {
    use api::record::encode_entry;
    use api::strata::entry::{Entry, entry::Request};
    let keys: usize = std::env::var("STRATA_READY_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(READY_KEYS_DEFAULT);
    let d = Deployment::start(0).await;
    let client = journal::client::JournalClient::connect(d.journal_addrs())
        .await
        .unwrap();
    let put = |i: usize| {
        let mut key = format!("/registry/pods/ns{:04}/pod-{i:08}-", i / 1000).into_bytes();
        key.resize(64, b'x');
        encode_entry(&Entry {
            format_version: api::ENTRY_FORMAT_VERSION,
            tenant: "default".into(),
            request_id: rand::random::<[u8; 16]>().to_vec(),
            time_ms: 0,
            request: Some(Request::Put(api::etcdserverpb::PutRequest {
                key,
                value: vec![b'v'; 256],
                ..Default::default()
            })),
            ..Default::default()
        })
    };
    let t = Instant::now();
    let mut last = 0;
    for from in (0..keys).step_by(READY_APPEND_BATCH) {
        let batch = (from..(from + READY_APPEND_BATCH).min(keys))
            .map(put)
            .collect();
        last = *client.append(0, batch).await.unwrap().last().unwrap();
    }
    println!("{keys} puts appended in {:.1} s", t.elapsed().as_secs_f64());
    // One round every 30 s: the first checkpoint covers the load, and the next (an encode of
    // ~400 MB, CPU the frontends would compete for) comes after the timed starts, mostly.
    let _compactor = d.start_compactor(&["--every", "30s"]);
    let catalog = compactor::Catalog::new(
        compactor::store::open(&d.objects().display().to_string()).unwrap(),
    );
    let deadline = Instant::now() + READY_WAIT;
    let checkpoint = loop {
        if let Some(m) = catalog.latest_manifest("default").await.unwrap()
            && let Some(n) = m.newest()
            && n.index >= last
        {
            break n.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no checkpoint at {last}\n{}",
            tail_file(&d.dir().join("compactor.log"))
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    println!(
        "checkpoint at index {} ({} MB) after {:.1} s",
        checkpoint.index,
        checkpoint.size / 1_000_000,
        t.elapsed().as_secs_f64()
    );
    let tail = (keys..keys + READY_TAIL).map(put).collect();
    let tail_last = *client.append(0, tail).await.unwrap().last().unwrap();

    // STRATA_BIN_B: a second binary, alternated with the first run by run (an A/B in one
    // deployment, so both start from the same checkpoint and tail on the same machine state).
    let bins: Vec<(&str, std::path::PathBuf)> = std::iter::once(("A", strata_bin()))
        .chain(std::env::var_os("STRATA_BIN_B").map(|b| ("B", std::path::PathBuf::from(b))))
        .collect();
    let runs: usize = std::env::var("STRATA_READY_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(READY_RUNS_DEFAULT);
    for run in 0..runs {
        let (label, bin) = &bins[run % bins.len()];
        let listen = format!("127.0.0.1:{}", free_port());
        let metrics = format!("127.0.0.1:{}", free_port());
        let log = d.dir().join(format!("frontend-ready-{run}.log"));
        let mut args = frontend_args(d.journal_addrs(), &listen, &metrics, &[]);
        args.extend(["--object-store".into(), d.objects().display().to_string()]);
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let started = Instant::now();
        let fe = ChildGuard::spawn(&format!("frontend-ready-{run}"), bin, &args, Some(&log));
        let endpoint = format!("http://{listen}");
        if let Err(e) = wait_ready(&endpoint, WAIT).await {
            panic!("{e}\n--- frontend log ---\n{}", tail_file(&log));
        }
        let ready = started.elapsed();
        let (cpu, faults) = fe
            .id()
            .map(|pid| cpu_and_faults(&pid.to_string()))
            .unwrap_or_default();
        let mut c = Client::connect([endpoint], None).await.unwrap();
        let count = c
            .get(
                "/registry/",
                Some(GetOptions::new().with_prefix().with_count_only()),
            )
            .await
            .unwrap()
            .count();
        assert_eq!(count as usize, keys + READY_TAIL);
        println!(
            "run {run} ({label}): ready in {:.2} s, frontend CPU {cpu:.2} s, {faults} minor faults, load {} (checkpoint {} + tail to {tail_last}); the frontend's log:",
            ready.as_secs_f64(),
            load.split_whitespace().next().unwrap_or("?"),
            checkpoint.index
        );
        // Where the time went, by the frontend's own log lines (UTC timestamps).
        for line in std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .take(40)
        {
            println!("  {line}");
        }
        drop(fe);
    }
}

/// Starts timed by `ready_timing_on_a_large_tenant` unless `STRATA_READY_RUNS` says otherwise.
const READY_RUNS_DEFAULT: usize = 3;
