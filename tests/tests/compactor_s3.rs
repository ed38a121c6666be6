//! The compactor against a real S3-compatible server on loopback (moto): checkpoints, trims and
//! fresh replicas equal to full replays; a large checkpoint as a multipart upload; the server
//! frozen for a while (SIGSTOP) and the compactor catching up once it answers again.

#[path = "../../compactor/tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use api::etcdserverpb::PutRequest;
use api::strata::entry::Entry;
use api::strata::entry::entry::Request;
use common::{
    History, assert_fresh_replicas_match, assert_same, assert_store_invariants, covers_all,
    wait_status, write_and_checkpoint,
};
use compactor::{Catalog, Compactor, Config, MemJournal, reader};
use strata_tests::s3::MotoS3;

const SHARD: u32 = 0;
const TENANTS: [&str; 2] = ["default", "acme"];

fn config() -> Config {
    Config {
        shards: vec![SHARD],
        tenants: vec![("default".into(), SHARD)],
        every_entries: 100,
        every: Duration::from_millis(500),
        keep: 3,
        trim_lag: 1,
        retry_min: Duration::from_millis(100),
        retry_max: Duration::from_secs(1),
        ..Config::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_checkpoints_trims_and_fresh_replicas_match_full_replay() {
    let moto = MotoS3::start("strata");
    let store = compactor::store::open_with(&moto.url("deploy-a"), &moto.options()).unwrap();
    let catalog = Catalog::new(store.clone());
    let journal = MemJournal::new();
    let mut h = History::new(journal.clone(), SHARD, &TENANTS, 101);
    let c = Compactor::spawn(config(), journal.clone(), catalog.clone());
    let mut st = c.status(SHARD).unwrap();
    write_and_checkpoint(&mut h, &mut st, &TENANTS, 4).await;
    let s = wait_status(&mut st, "a trim", |s| s.trimmed_below > 1).await;
    assert_eq!(s.restarts, 0, "{s:?}");
    c.shutdown().await;
    assert_fresh_replicas_match(&store, &journal, &h, SHARD).await;
    assert_store_invariants(&catalog, &journal, SHARD).await;
    let m = catalog.latest_manifest("acme").await.unwrap().unwrap();
    assert_eq!(m.checkpoints.len(), 3, "keep 3: {m:?}");
}

/// Keys and value size of the large tenant: about 20 MB of checkpoint, over the multipart
/// threshold (16 MiB).
const LARGE_KEYS: usize = 100_000;
const LARGE_VALUE: usize = 180;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_checkpoint_goes_up_in_parts_and_loads_back() {
    let moto = MotoS3::start("strata");
    let store = compactor::store::open_with(&moto.url("big"), &moto.options()).unwrap();
    let catalog = Catalog::new(store.clone());
    let mut s = memstore::MemStore::new(memstore::Config::default());
    for i in 0..LARGE_KEYS {
        let mut request_id = (i as u64).to_le_bytes().to_vec();
        request_id.resize(16, 1);
        let e = Entry {
            format_version: api::ENTRY_FORMAT_VERSION,
            tenant: "big".into(),
            request_id,
            time_ms: 1_000 + i as i64,
            request: Some(Request::Put(PutRequest {
                key: format!("/registry/pods/ns-{:03}/pod-{i:07}", i % 97).into_bytes(),
                value: vec![b'v'; LARGE_VALUE],
                ..Default::default()
            })),
            ..Default::default()
        };
        s.apply(i as u64 + 1, &e);
    }
    let meta = memstore::checkpoint::CheckpointMeta {
        tenant: "big".into(),
        shard: SHARD,
        index: s.applied_index(),
        revision: s.revision(),
        created_ms: s.time_ms(),
    };
    let bytes = bytes::Bytes::from(memstore::checkpoint::encode(&meta, &s));
    assert!(
        bytes.len() > compactor::catalog::MULTIPART_THRESHOLD,
        "{} bytes",
        bytes.len()
    );
    let started = Instant::now();
    let r = catalog
        .write_checkpoint(
            "big",
            meta.index,
            meta.revision,
            meta.created_ms,
            1,
            bytes.clone(),
        )
        .await
        .unwrap();
    let secs = started.elapsed().as_secs_f64();
    println!(
        "multipart upload of {} bytes to moto: {secs:.2} s ({:.1} MB/s)",
        bytes.len(),
        bytes.len() as f64 / 1e6 / secs
    );
    catalog.publish("big", SHARD, vec![r], 2).await.unwrap();
    let loaded = reader::latest(store.clone(), "big").await.unwrap().unwrap();
    assert_same("big", &loaded.store, &s);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_frozen_for_a_while_delays_checkpoints_then_the_compactor_catches_up() {
    let moto = MotoS3::start("strata");
    let store = compactor::store::open_with(&moto.url("deploy-b"), &moto.options()).unwrap();
    let catalog = Catalog::new(store.clone());
    let journal = MemJournal::new();
    let mut h = History::new(journal.clone(), SHARD, &TENANTS, 202);
    let c = Compactor::spawn(config(), journal.clone(), catalog.clone());
    let mut st = c.status(SHARD).unwrap();
    h.write(300);
    let before = h.last_index();
    let s0 = wait_status(&mut st, "first checkpoints", |s| {
        covers_all(s, &TENANTS, before)
    })
    .await;

    moto.pause();
    h.write(600);
    // The journal takes every write while the store is frozen (no client is held up) ...
    assert_eq!(journal.last_index(SHARD), h.last_index());
    let s1 = wait_status(&mut st, "the shard applied everything", |s| {
        s.applied_index == h.last_index()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    // ... and nothing can be published or trimmed meanwhile.
    let s2 = st.borrow().clone();
    assert_eq!(
        s2.checkpoints, s0.checkpoints,
        "published while frozen? {s2:?}"
    );
    assert!(s2.behind_entries >= 600, "lag is reported: {s2:?}");
    assert_eq!(s1.trimmed_below, s2.trimmed_below);

    moto.resume();
    let last = h.last_index();
    wait_status(&mut st, "catch-up after the store returns", |s| {
        covers_all(s, &TENANTS, last)
    })
    .await;
    c.shutdown().await;
    assert_fresh_replicas_match(&store, &journal, &h, SHARD).await;
    assert_store_invariants(&catalog, &journal, SHARD).await;
}
