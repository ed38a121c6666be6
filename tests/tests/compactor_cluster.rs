//! The `strata compactor` process against three `strata journal` processes and a local-directory
//! object store: entries appended through the journal client, the compactor `kill -9`ed at
//! seeded random moments while it checkpoints and restarted; after every kill no manifest names a
//! partial or missing object and the journal is not trimmed past a published checkpoint; at the
//! end a fresh replica from checkpoint + journal tail equals one that applied the whole history.

#[path = "../../compactor/tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use api::record::entry_for_tenant;
use api::strata::journal::record::Kind;
use common::{History, assert_same};
use compactor::{Catalog, MemJournal, reader};
use futures::StreamExt;
use journal::client::JournalClient;
use memstore::MemStore;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use strata_tests::deployment::Deployment;
use strata_tests::process::ChildGuard;
use strata_tests::readiness::tail_file;

const SHARD: u32 = 0;
const TENANTS: [&str; 3] = ["default", "acme", "beta"];
/// Kill/restart cycles of the compactor.
const KILLS: usize = 6;
/// Entries appended per cycle, in batches.
const ENTRIES_PER_CYCLE: usize = 240;
const BATCH: usize = 20;
const WAIT: Duration = Duration::from_secs(90);
const SEED: u64 = 0x5eed_c0de;

fn compactor_args(journals: &[String], objects: &Path) -> Vec<String> {
    [
        "compactor",
        "--journal",
        &journals.join(","),
        "--object-store",
        &format!("file://{}", objects.display()),
        "--shards",
        "0",
        "--every-entries",
        "100",
        "--every",
        "700ms",
        "--keep",
        "3",
        "--trim-lag",
        "1",
        "--retry-min",
        "100ms",
        "--retry-max",
        "1s",
        // Rounds pause after each upload and each publish, so the kills land inside them.
        "--test-step-pause",
        "250ms",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Reference replicas: every tenant, applying every record from index 1 as it commits.
struct Reference {
    stores: Mutex<BTreeMap<String, MemStore>>,
    applied: tokio::sync::watch::Sender<u64>,
}

async fn tail_reference(client: JournalClient, reference: Arc<Reference>) {
    let mut stream = Box::pin(client.read(SHARD, 1).await.expect("read from index 1"));
    while let Some(r) = stream.next().await {
        let r = r.unwrap_or_else(|e| panic!("reference tail failed (trimmed under it?): {e}"));
        {
            let mut stores = reference.stores.lock().unwrap();
            for (t, s) in stores.iter_mut() {
                s.apply(r.index, &entry_for_tenant(&r, t).unwrap());
            }
        }
        reference.applied.send_replace(r.index);
    }
}

/// No manifest names a partial or missing object; the journal is not trimmed past any tenant's
/// newest published checkpoint (and not at all while a tenant has none).
/// Checkpoint objects on disk that no manifest names: what a compactor killed between an
/// upload and its publish leaves behind (the next one's garbage collection removes them).
async fn unpublished_checkpoints(
    catalog: &Catalog,
    objects: &Path,
) -> std::collections::HashSet<String> {
    let mut named = std::collections::HashSet::new();
    for t in TENANTS {
        for seq in catalog.manifest_seqs(t).await.unwrap_or_default() {
            if let Ok(Some(m)) = catalog.read_manifest(t, seq).await {
                named.extend(m.checkpoints.into_iter().map(|r| r.path));
            }
        }
    }
    let mut unnamed = std::collections::HashSet::new();
    for t in TENANTS {
        let dir = objects.join("tenants").join(t).join("checkpoints");
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let rel = format!(
                "tenants/{t}/checkpoints/{}",
                e.file_name().to_string_lossy()
            );
            if !named.contains(&rel) {
                unnamed.insert(rel);
            }
        }
    }
    unnamed
}

async fn check_invariants(catalog: &Catalog, client: &JournalClient, when: &str) {
    let first = client.status(SHARD).await.unwrap().first_index;
    let tenants = catalog.tenants().await.unwrap();
    for t in TENANTS {
        if !tenants.iter().any(|x| x == t) {
            assert!(
                first <= 1,
                "{when}: journal trimmed to {first} while {t} has no checkpoint"
            );
            continue;
        }
        let mut newest = None;
        for seq in catalog.manifest_seqs(t).await.unwrap() {
            let Some(m) = catalog.read_manifest(t, seq).await.unwrap() else {
                continue;
            };
            for r in &m.checkpoints {
                let (meta, _) = reader::load(catalog, t, r).await.unwrap_or_else(|e| {
                    panic!(
                        "{when}: manifest {seq} of {t} names {} which is unusable: {e}",
                        r.path
                    )
                });
                assert_eq!(meta.index, r.index);
            }
            newest = Some(m);
        }
        // A compactor killed between its first upload and first publish leaves a checkpoint
        // object and no manifest: the tenant has no published checkpoint yet.
        let Some(newest) = newest else {
            assert!(
                first <= 1,
                "{when}: journal trimmed to {first} while {t} has no manifest"
            );
            continue;
        };
        let covered = newest.newest().unwrap().index;
        assert!(
            first <= covered + 1,
            "{when}: journal starts at {first} but {t}'s newest checkpoint covers only {covered}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_while_checkpointing_never_breaks_manifests_or_trims_and_the_next_compactor_resumes()
{
    println!("seed {SEED:#x} (change SEED to explore other kill points)");
    let mut rng = StdRng::seed_from_u64(SEED);
    let deployment = Deployment::start(0).await;
    let journals = deployment.journal_addrs().to_vec();
    let objects = deployment.dir().join("objects");
    let log = deployment.dir().join("compactor.log");
    let client = JournalClient::connect(&journals).await.unwrap();
    let catalog = Catalog::new(compactor::store::open(objects.to_str().unwrap()).unwrap());

    let reference = Arc::new(Reference {
        stores: Mutex::new(
            TENANTS
                .iter()
                .map(|t| (t.to_string(), MemStore::new(memstore::Config::default())))
                .collect(),
        ),
        applied: tokio::sync::watch::channel(0).0,
    });
    let tail = tokio::spawn(tail_reference(client.clone(), reference.clone()));

    let mut history = History::new(MemJournal::new(), SHARD, &TENANTS, SEED);
    let mut compactor = ChildGuard::strata(
        "compactor",
        &compactor_args(&journals, &objects),
        Some(&log),
    );
    let mut last = 0;
    let mut kills_between_upload_and_publish = 0;
    let mut orphans = std::collections::HashSet::new();
    for cycle in 0..KILLS {
        for _ in 0..ENTRIES_PER_CYCLE / BATCH {
            let mut payloads = Vec::with_capacity(BATCH);
            while payloads.len() < BATCH {
                // Ticks come from the journal itself; only data is appended.
                if let Kind::Data(b) = history.next_kind() {
                    payloads.push(b);
                }
            }
            let idx = client.append(SHARD, payloads).await.unwrap();
            last = *idx.last().unwrap();
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..60))).await;
        }
        if cycle % 2 == 0 {
            // Kill it right after an upload, before that checkpoint is published.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            while tokio::time::Instant::now() < deadline
                && unpublished_checkpoints(&catalog, &objects)
                    .await
                    .difference(&orphans)
                    .next()
                    .is_none()
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        } else {
            // Let it run into a checkpoint round, then kill it somewhere in the middle.
            tokio::time::sleep(Duration::from_millis(rng.random_range(200..1600))).await;
        }
        compactor.kill();
        // A kill between an upload and its publish leaves a new object no manifest names.
        let now = unpublished_checkpoints(&catalog, &objects).await;
        if now.difference(&orphans).next().is_some() {
            kills_between_upload_and_publish += 1;
        }
        orphans = now;
        check_invariants(&catalog, &client, &format!("after kill {cycle}")).await;
        compactor = ChildGuard::strata(
            "compactor",
            &compactor_args(&journals, &objects),
            Some(&log),
        );
    }

    // Liveness: the last compactor catches up to the end and trims.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let mut done = true;
        for t in TENANTS {
            let newest = catalog.latest_manifest(t).await.unwrap();
            done &= newest.is_some_and(|m| m.newest().unwrap().index >= last);
        }
        let first = client.status(SHARD).await.unwrap().first_index;
        if done && first > 1 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "compactor did not catch up to {last} (journal first index {first})\n--- compactor log ---\n{}",
            tail_file(&log)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    compactor.kill();
    check_invariants(&catalog, &client, "at the end").await;
    println!(
        "{kills_between_upload_and_publish} of {KILLS} kills between an upload and its publish"
    );
    assert!(
        kills_between_upload_and_publish > 0,
        "no kill landed inside a round: the test checked idle compactors only"
    );

    // A fresh replica per tenant, from its newest checkpoint plus the journal tail, equals the
    // reference that applied every record.
    let mut applied = reference.applied.subscribe();
    let target = client.status(SHARD).await.unwrap().committed_index;
    tokio::time::timeout(WAIT, applied.wait_for(|&a| a >= target))
        .await
        .expect("reference caught up")
        .unwrap();
    tail.abort();
    let want = reference.stores.lock().unwrap().clone();
    for t in TENANTS {
        let loaded = reader::latest_in(&catalog, t).await.unwrap().unwrap();
        let mut s = loaded.store;
        let mut stream = Box::pin(client.read(SHARD, loaded.meta.index + 1).await.unwrap());
        let goal = want[t].applied_index();
        while s.applied_index() < goal {
            let r = tokio::time::timeout(WAIT, stream.next())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            s.apply(r.index, &entry_for_tenant(&r, t).unwrap());
        }
        assert_same(t, &s, &want[t]);
    }
    drop(deployment);
}
