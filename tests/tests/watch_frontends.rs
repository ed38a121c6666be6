//! Watches across frontends: each frontend serves watches from its own replica, so a watch on one
//! frontend must see the writes made through another in revision order, none missing, none
//! repeated; and a watcher whose frontend is killed resumes on another from its last revision + 1
//! with a gap-free, duplicate-free history (etcd's "resumable"). Strata only (three journal nodes
//! and two `strata frontend` processes).

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::connect;
use etcd_client::{Client, DeleteOptions, EventType, GetOptions, Txn, TxnOp, WatchOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use strata_tests::deployment::Deployment;

/// Generous: the CI machine is small and shared.
const TIMEOUT: Duration = Duration::from_secs(60);
const KEYS: usize = 16;
const OPS_PER_WRITER: usize = 150;
const DEFAULT_SEED: u64 = 0x00f2_0f2e;
/// Pause between progress requests while waiting for the last revision.
const PROGRESS_POLL: Duration = Duration::from_millis(100);

/// (revision, key, Some(value) for a put / None for a delete).
type Change = (i64, Vec<u8>, Option<Vec<u8>>);

fn seed() -> u64 {
    let seed = std::env::var("WATCH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_SEED);
    println!("REPLAY WITH: WATCH_SEED={seed} cargo test -p strata-tests --test watch_frontends");
    seed
}

/// Random puts, deletes and two-key txns under `prefix`; records every acknowledged change.
async fn write_load(mut client: Client, prefix: String, seed: u64, acked: Arc<Mutex<Vec<Change>>>) {
    let mut rng = StdRng::seed_from_u64(seed);
    for step in 0..OPS_PER_WRITER {
        let k = format!("{prefix}{:02}", rng.random_range(0..KEYS));
        let v = format!("{seed}-{step}").into_bytes();
        match rng.random_range(0..10) {
            0..=5 => {
                let r = client.put(k.as_str(), v.clone(), None).await.expect("put");
                let rev = r.header().unwrap().revision();
                acked.lock().unwrap().push((rev, k.into_bytes(), Some(v)));
            }
            6..=7 => {
                let r = client
                    .delete(k.as_str(), Some(DeleteOptions::new()))
                    .await
                    .expect("delete");
                if r.deleted() > 0 {
                    let rev = r.header().unwrap().revision();
                    acked.lock().unwrap().push((rev, k.into_bytes(), None));
                }
            }
            _ => {
                let k2 = format!("{prefix}{:02}", (rng.random_range(0..KEYS - 1) + 1));
                if k2 == k {
                    continue;
                }
                let txn = Txn::new().and_then([
                    TxnOp::put(k.as_str(), v.clone(), None),
                    TxnOp::put(k2.as_str(), v.clone(), None),
                ]);
                let r = client.txn(txn).await.expect("txn");
                let rev = r.header().unwrap().revision();
                let mut a = acked.lock().unwrap();
                a.push((rev, k.into_bytes(), Some(v.clone())));
                a.push((rev, k2.into_bytes(), Some(v)));
            }
        }
    }
}

/// The events of one watch response as changes.
fn changes(resp: &etcd_client::WatchResponse) -> Vec<Change> {
    resp.events()
        .iter()
        .map(|e| {
            let kv = e.kv().expect("kv");
            let value = (e.event_type() == EventType::Put).then(|| kv.value().to_vec());
            (kv.mod_revision(), kv.key().to_vec(), value)
        })
        .collect()
}

/// Asserts that `got` (in arrival order) is exactly the acknowledged changes: revisions never
/// go back, no change twice, none missing.
fn assert_exact(seed: u64, got: &[Change], acked: &[Change]) {
    for w in got.windows(2) {
        assert!(
            w[0].0 <= w[1].0,
            "seed {seed}: revision {} after {}",
            w[1].0,
            w[0].0
        );
        assert!(
            !(w[0].0 == w[1].0 && w[0].1 == w[1].1),
            "seed {seed}: change at {} seen twice",
            w[0].0
        );
    }
    let as_map = |c: &[Change]| -> BTreeMap<(i64, Vec<u8>), Option<Vec<u8>>> {
        c.iter()
            .map(|(r, k, v)| ((*r, k.clone()), v.clone()))
            .collect()
    };
    let (got_m, want_m) = (as_map(got), as_map(acked));
    assert_eq!(got_m.len(), got.len(), "seed {seed}: duplicate changes");
    let missing: Vec<_> = want_m.keys().filter(|k| !got_m.contains_key(*k)).collect();
    let extra: Vec<_> = got_m.keys().filter(|k| !want_m.contains_key(*k)).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "seed {seed}: missing {missing:?}, unexpected {extra:?}"
    );
    assert!(
        got_m == want_m,
        "seed {seed}: values differ from the acknowledged writes"
    );
}

/// Reads `stream` into `got` until a progress response shows the watcher has passed `final_rev`
/// (asking for progress whenever the stream goes quiet); panics if that takes too long.
async fn drain_until(stream: &mut etcd_client::WatchStream, final_rev: i64, got: &mut Vec<Change>) {
    let deadline = tokio::time::Instant::now() + 3 * TIMEOUT;
    'outer: loop {
        stream.request_progress().await.expect("request progress");
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let resp = tokio::time::timeout(left, stream.message())
                .await
                .expect("watch delivered everything up to the final revision in time")
                .expect("stream ok")
                .expect("stream open");
            assert!(!resp.canceled(), "{resp:?}");
            if resp.created() {
                continue;
            }
            if resp.events().is_empty() {
                if resp.header().unwrap().revision() >= final_rev {
                    break 'outer;
                }
                tokio::time::sleep(PROGRESS_POLL).await;
                continue 'outer;
            }
            got.extend(changes(&resp));
        }
    }
}

/// Watches `prefix` on `reader` from the revision after `writer`'s current one (so no write of
/// the load can be missed), then starts two writers on `writer`. Returns that current revision,
/// the watch stream, the acknowledged writes and the writer tasks.
async fn watch_then_write(
    writer: &mut Client,
    reader: &mut Client,
    prefix: &str,
    seed: u64,
) -> (
    i64,
    etcd_client::WatchStream,
    Arc<Mutex<Vec<Change>>>,
    Vec<tokio::task::JoinHandle<()>>,
) {
    let init = writer
        .get("/", None)
        .await
        .expect("get")
        .header()
        .unwrap()
        .revision();
    let stream = reader
        .watch(
            prefix,
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(init + 1),
            ),
        )
        .await
        .expect("watch");
    let acked = Arc::new(Mutex::new(Vec::new()));
    let writers = (0..2)
        .map(|w| {
            tokio::spawn(write_load(
                writer.clone(),
                prefix.to_string(),
                seed.wrapping_add(w),
                acked.clone(),
            ))
        })
        .collect();
    (init, stream, acked, writers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_watch_on_one_frontend_sees_writes_through_another() {
    let seed = seed();
    let d = Deployment::start(2).await;
    let mut writer = connect(&d.frontend(0).endpoint()).await;
    let mut reader = connect(&d.frontend(1).endpoint()).await;
    let prefix = "/fe/".to_string();
    let (_, mut stream, acked, writers) =
        watch_then_write(&mut writer, &mut reader, &prefix, seed).await;
    for w in writers {
        tokio::time::timeout(10 * TIMEOUT, w)
            .await
            .expect("writers finish")
            .expect("writer ok");
    }
    // A linearizable read on the watching frontend: it has applied everything acknowledged.
    let final_rev = reader
        .get(prefix.as_str(), Some(GetOptions::new().with_prefix()))
        .await
        .expect("get")
        .header()
        .unwrap()
        .revision();
    let mut got = Vec::new();
    drain_until(&mut stream, final_rev, &mut got).await;
    assert_exact(seed, &got, &acked.lock().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_watcher_resumes_on_another_frontend_after_kill_9() {
    let seed = seed();
    let mut d = Deployment::start(2).await;
    let mut writer = connect(&d.frontend(0).endpoint()).await;
    let mut reader = connect(&d.frontend(1).endpoint()).await;
    let prefix = "/kill/".to_string();
    let (init, mut stream, acked, writers) =
        watch_then_write(&mut writer, &mut reader, &prefix, seed).await;

    // Read until a good part of the load was watched, then kill the watching frontend.
    let mut got: Vec<Change> = Vec::new();
    while got.len() < OPS_PER_WRITER / 2 {
        let resp = tokio::time::timeout(TIMEOUT, stream.message())
            .await
            .expect("events in time")
            .expect("stream ok")
            .expect("stream open");
        got.extend(changes(&resp));
    }
    assert!(
        !writers.iter().all(|w| w.is_finished()),
        "the load was over before the kill"
    );
    d.kill_frontend(1);
    // Whatever was already on the wire may still arrive; then the stream fails.
    loop {
        match tokio::time::timeout(TIMEOUT, stream.message()).await {
            Ok(Ok(Some(resp))) => got.extend(changes(&resp)),
            Ok(Ok(None)) | Ok(Err(_)) => break,
            Err(_) => panic!("the stream of a killed frontend never ended"),
        }
    }
    drop(stream);
    let last = got.last().map_or(init, |c| c.0);

    // Resume on the surviving frontend from the next revision.
    let mut survivor = connect(&d.frontend(0).endpoint()).await;
    let mut stream = survivor
        .watch(
            prefix.as_str(),
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(last + 1),
            ),
        )
        .await
        .expect("watch on the survivor");
    for w in writers {
        tokio::time::timeout(10 * TIMEOUT, w)
            .await
            .expect("writers finish")
            .expect("writer ok");
    }
    let final_rev = survivor
        .get("/", None)
        .await
        .expect("get")
        .header()
        .unwrap()
        .revision();
    drain_until(&mut stream, final_rev, &mut got).await;
    assert_exact(seed, &got, &acked.lock().unwrap());
}
