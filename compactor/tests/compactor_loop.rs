//! The compactor loop against the in-memory journal and real object stores (local directory,
//! in-memory, and one that can be switched off): checkpoints, trims, fresh replicas equal to full
//! replays, fallback past a corrupt checkpoint, restarts, and outages.

mod common;

use std::sync::Arc;
use std::time::Duration;

use api::manifest;
use common::{
    FlakyStore, History, assert_fresh_replicas_match, assert_store_invariants, covers_all,
    wait_status, write_and_checkpoint,
};
use compactor::store::Store;
use compactor::{Catalog, Compactor, Config, MemJournal, reader};
use memstore::MemStore;

use object_store::ObjectStore;
use object_store::memory::InMemory;

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
        retry_min: Duration::from_millis(50),
        retry_max: Duration::from_millis(400),
        ..Config::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_trim_and_fresh_replicas_match_full_replay_on_a_local_dir() {
    let dir = tempfile::tempdir().unwrap();
    let store = compactor::store::open(dir.path().to_str().unwrap()).unwrap();
    let catalog = Catalog::new(store.clone());
    let journal = MemJournal::new();
    let mut h = History::new(journal.clone(), SHARD, &TENANTS, 11);
    let c = Compactor::spawn(config(), journal.clone(), catalog.clone());
    let mut st = c.status(SHARD).unwrap();
    write_and_checkpoint(&mut h, &mut st, &TENANTS, 6).await;
    let s = wait_status(&mut st, "a trim", |s| s.trimmed_below > 1).await;
    assert!(s.rounds >= 6, "{s:?}");
    c.shutdown().await;
    use compactor::Journal;
    assert!(
        journal.first_index(SHARD).await.unwrap() > 1,
        "journal was trimmed"
    );
    assert_fresh_replicas_match(&store, &journal, &h, SHARD).await;
    assert_store_invariants(&catalog, &journal, SHARD).await;
    // Retention: the newest manifest keeps `keep` checkpoints, and older objects are gone.
    for t in TENANTS {
        let m = catalog.latest_manifest(t).await.unwrap().unwrap();
        assert_eq!(m.checkpoints.len(), 3, "{t}: keep 3");
        let dir = dir.path().join(manifest::checkpoints_dir(t).unwrap());
        let files = std::fs::read_dir(dir).unwrap().count();
        assert!(
            files <= 3 + 1,
            "{t}: {files} checkpoint objects left, garbage not collected"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_is_rejected_and_the_previous_checkpoint_is_used() {
    let dir = tempfile::tempdir().unwrap();
    let store = compactor::store::open(dir.path().to_str().unwrap()).unwrap();
    let catalog = Catalog::new(store.clone());
    let journal = MemJournal::new();
    let mut h = History::new(journal.clone(), SHARD, &TENANTS, 23);
    let c = Compactor::spawn(config(), journal.clone(), catalog.clone());
    let mut st = c.status(SHARD).unwrap();
    h.write(700);
    let last = h.last_index();
    wait_status(&mut st, "checkpoints at the last index", |s| {
        covers_all(s, &TENANTS, last)
    })
    .await;
    c.shutdown().await;

    let m = catalog.latest_manifest("default").await.unwrap().unwrap();
    assert!(m.checkpoints.len() >= 2);
    let newest = &m.checkpoints[0];
    let file = dir.path().join(&newest.path);
    let mut bytes = std::fs::read(&file).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&file, &bytes).unwrap();

    // The object's own checksum rejects it even without the manifest's CRC.
    let Err(err) = memstore::checkpoint::decode(&bytes) else {
        panic!("a checkpoint with a flipped byte was accepted");
    };
    assert!(matches!(err, memstore::Error::Corrupt(_)), "{err:?}");

    let loaded = reader::latest(store.clone(), "default")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        loaded.reference, m.checkpoints[1],
        "fell back to the previous checkpoint"
    );
    assert_eq!(loaded.skipped.len(), 1);
    // trim_lag = 1 keeps the journal from the previous checkpoint on: replay still works.
    assert_fresh_replicas_match(&store, &journal, &h, SHARD).await;

    // A compactor restarted now resumes from the previous checkpoint and publishes new ones
    // without the corrupt object.
    let c = Compactor::spawn(config(), journal.clone(), catalog.clone());
    let mut st = c.status(SHARD).unwrap();
    h.write(300);
    let last = h.last_index();
    wait_status(&mut st, "checkpoints after restart", |s| {
        covers_all(s, &TENANTS, last)
    })
    .await;
    c.shutdown().await;
    let m2 = catalog.latest_manifest("default").await.unwrap().unwrap();
    assert!(
        m2.checkpoints.iter().all(|c| c.path != newest.path),
        "corrupt object dropped from the manifest"
    );
    assert_fresh_replicas_match(&store, &journal, &h, SHARD).await;
    assert_store_invariants(&catalog, &journal, SHARD).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_resumes_from_published_checkpoints() {
    let store: Store = Arc::new(InMemory::new());
    let catalog = Catalog::new(store.clone());
    let journal = MemJournal::new();
    let mut h = History::new(journal.clone(), SHARD, &TENANTS, 37);
    for round in 0..3 {
        let c = Compactor::spawn(config(), journal.clone(), catalog.clone());
        let mut st = c.status(SHARD).unwrap();
        h.write(400);
        let last = h.last_index();
        wait_status(&mut st, "checkpoints at the last index", |s| {
            covers_all(s, &TENANTS, last)
        })
        .await;
        let s = st.borrow().clone();
        assert_eq!(s.restarts, 0, "round {round}: {s:?}");
        c.shutdown().await;
        assert_fresh_replicas_match(&store, &journal, &h, SHARD).await;
        assert_store_invariants(&catalog, &journal, SHARD).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn object_store_outage_delays_checkpoints_and_the_compactor_catches_up() {
    let flaky = FlakyStore::new(Arc::new(InMemory::new()));
    let store: Store = flaky.clone() as Arc<dyn ObjectStore>;
    let catalog = Catalog::new(store.clone());
    let journal = MemJournal::new();
    let mut h = History::new(journal.clone(), SHARD, &TENANTS, 41);
    let c = Compactor::spawn(config(), journal.clone(), catalog.clone());
    let mut st = c.status(SHARD).unwrap();
    h.write(300);
    let before = h.last_index();
    let s0 = wait_status(&mut st, "first checkpoints", |s| {
        covers_all(s, &TENANTS, before)
    })
    .await;

    flaky.set_down(true);
    h.write(600);
    let s1 = wait_status(&mut st, "failed rounds", |s| s.failed_rounds >= 2).await;
    assert!(s1.behind_entries >= 600, "lag is reported: {s1:?}");
    assert_eq!(
        s1.checkpoints, s0.checkpoints,
        "nothing published while down"
    );
    let trimmed_while_down = s1.trimmed_below;
    // Appends were never held up: the journal took all of them.
    assert_eq!(journal.last_index(SHARD), h.last_index());

    flaky.set_down(false);
    let last = h.last_index();
    let s2 = wait_status(&mut st, "catch-up", |s| covers_all(s, &TENANTS, last)).await;
    assert_eq!(
        s2.restarts, 0,
        "outage handled by retries, not restarts: {s2:?}"
    );
    let s3 = wait_status(&mut st, "trim after catch-up", |s| {
        s.trimmed_below > trimmed_while_down
    })
    .await;
    assert!(s3.trimmed_below > before.min(trimmed_while_down));
    c.shutdown().await;
    assert_fresh_replicas_match(&store, &journal, &h, SHARD).await;
    assert_store_invariants(&catalog, &journal, SHARD).await;
}

/// Runs a compactor over `h` on a local directory until both tenants have checkpoints and the
/// journal was trimmed; returns the directory and its catalog.
async fn published_and_trimmed(
    h: &mut History,
    journal: &MemJournal,
) -> (tempfile::TempDir, Catalog) {
    let dir = tempfile::tempdir().unwrap();
    let store = compactor::store::open(dir.path().to_str().unwrap()).unwrap();
    let catalog = Catalog::new(store);
    let c = Compactor::spawn(config(), journal.clone(), catalog.clone());
    let mut st = c.status(SHARD).unwrap();
    write_and_checkpoint(h, &mut st, &TENANTS, 4).await;
    wait_status(&mut st, "a trim", |s| s.trimmed_below > 1).await;
    c.shutdown().await;
    (dir, catalog)
}

/// Every manifest of every tenant: (tenant, seq, shard).
async fn manifests(catalog: &Catalog) -> Vec<(String, u64, u32)> {
    let mut out = Vec::new();
    for t in catalog.tenants().await.unwrap() {
        for seq in catalog.manifest_seqs(&t).await.unwrap() {
            if let Ok(Some(m)) = catalog.read_manifest(&t, seq).await {
                out.push((t.clone(), seq, m.shard));
            } else {
                out.push((t.clone(), seq, u32::MAX));
            }
        }
    }
    out
}

/// A compactor of shard `SHARD` (whose loop is expected to stop on an error) and shard 1, where
/// tenant "other" writes `rounds` times 150 entries, each checkpointed; answers both shards'
/// status once shard `SHARD` restarted twice, and requires shard 1 never to have restarted.
async fn blocked_shard_beside_another(
    journal: &MemJournal,
    catalog: &Catalog,
    seed: u64,
    rounds: usize,
) -> (compactor::ShardStatus, compactor::ShardStatus) {
    const OTHER_SHARD: u32 = 1;
    let mut other = History::new(journal.clone(), OTHER_SHARD, &["other"], seed);
    let c = Compactor::spawn(
        Config {
            shards: vec![SHARD, OTHER_SHARD],
            ..config()
        },
        journal.clone(),
        catalog.clone(),
    );
    let mut st0 = c.status(SHARD).unwrap();
    let mut st1 = c.status(OTHER_SHARD).unwrap();
    for _ in 0..rounds {
        other.write(150);
        let last = other.last_index();
        wait_status(&mut st1, "the other shard's checkpoints", |s| {
            covers_all(s, &["other"], last)
        })
        .await;
    }
    let s0 = wait_status(&mut st0, "the blocked shard's restarts", |s| {
        s.restarts >= 2
    })
    .await;
    let s1 = st1.borrow().clone();
    c.shutdown().await;
    assert_eq!(s1.restarts, 0, "{s1:?}");
    (s0, s1)
}

/// A tenant whose checkpoints are all unusable blocks its own shard's loop; the compactor's other
/// shard (whose journal was never trimmed) must not take the tenant over and publish it empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_with_no_usable_checkpoint_is_not_adopted_by_another_shard() {
    let journal = MemJournal::new();
    let mut h = History::new(journal.clone(), SHARD, &TENANTS, 53);
    let (dir, catalog) = published_and_trimmed(&mut h, &journal).await;
    for t in TENANTS {
        let m = catalog.latest_manifest(t).await.unwrap().unwrap();
        for r in &m.checkpoints {
            let file = dir.path().join(&r.path);
            let mut bytes = std::fs::read(&file).unwrap();
            let mid = bytes.len() / 2;
            bytes[mid] ^= 0x40;
            std::fs::write(&file, &bytes).unwrap();
        }
    }
    let before = manifests(&catalog).await;

    let (s0, s1) = blocked_shard_beside_another(&journal, &catalog, 59, 3).await;
    assert!(
        s0.last_error
            .as_deref()
            .is_some_and(|e| e.contains("checkpoint")),
        "{s0:?}"
    );
    assert!(
        TENANTS.iter().all(|t| !s1.checkpoints.contains_key(*t)),
        "the other shard published a tenant that is not its own: {s1:?}"
    );
    let after: Vec<_> = manifests(&catalog)
        .await
        .into_iter()
        .filter(|(t, _, _)| t != "other")
        .collect();
    assert_eq!(after, before, "the tenants' manifests changed");
    assert!(before.iter().all(|(_, _, shard)| *shard == SHARD));
}

/// Manifests that exist but that this build cannot read (a newer build's, say, after a rollback)
/// are not "no manifest": on a trimmed journal the tenant would be published without its history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_manifests_stop_the_loop_instead_of_starting_the_tenant_empty() {
    let journal = MemJournal::new();
    let mut h = History::new(journal.clone(), SHARD, &TENANTS, 61);
    let (dir, catalog) = published_and_trimmed(&mut h, &journal).await;
    for seq in catalog.manifest_seqs("default").await.unwrap() {
        let mut m = catalog
            .read_manifest("default", seq)
            .await
            .unwrap()
            .unwrap();
        m.format_version = manifest::MANIFEST_FORMAT_VERSION + 1;
        let path = dir
            .path()
            .join(manifest::manifest_path("default", seq).unwrap());
        std::fs::write(path, m.to_json()).unwrap();
    }
    let Err(e) = catalog.latest_manifest("default").await else {
        panic!("unreadable manifests were taken for none");
    };
    assert!(e.to_string().contains("no manifest can be read"), "{e}");
    let before = manifests(&catalog).await;

    let c = Compactor::spawn(config(), journal.clone(), catalog.clone());
    let mut st = c.status(SHARD).unwrap();
    h.write(250);
    let s = wait_status(&mut st, "restarts", |s| s.restarts >= 2).await;
    c.shutdown().await;
    assert!(
        s.last_error
            .as_deref()
            .is_some_and(|e| e.contains("no manifest can be read")),
        "{s:?}"
    );
    assert_eq!(
        manifests(&catalog).await,
        before,
        "a manifest was published or deleted"
    );

    // They name shard 0: another shard of the same compactor goes on as usual.
    let (_, s1) = blocked_shard_beside_another(&journal, &catalog, 67, 1).await;
    assert_eq!(s1.restarts, 0, "{s1:?}");
}

/// A tenant whose keys did not change gets no new checkpoint each round (journal ticks alone
/// move its index), only once the journal grew by `every_entries` since its newest: the `keep`
/// newest checkpoints stay distinct states for longer (found by review: copies of the current
/// state pushed every earlier one out within minutes). A change of its keys is checkpointed
/// at the next round as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ticks_alone_do_not_make_a_checkpoint_each_round() {
    let catalog = Catalog::new(Arc::new(InMemory::new()));
    let journal = MemJournal::new();
    let mut h = History::new(journal.clone(), SHARD, &TENANTS, 31);
    let c = Compactor::spawn(
        Config {
            every: Duration::from_millis(100),
            ..config()
        },
        journal.clone(),
        catalog.clone(),
    );
    let mut st = c.status(SHARD).unwrap();
    h.write(50);
    let last = h.last_index();
    let s = wait_status(&mut st, "checkpoints of the writes", |s| {
        covers_all(s, &TENANTS, last)
    })
    .await;
    let before = s.checkpoints.clone();
    let tick = || api::strata::journal::record::Kind::Tick(api::strata::journal::Tick {});
    journal.append(SHARD, 1, vec![tick(); 60]);
    // Ten rounds' worth of time: none of them may checkpoint a tenant that only saw ticks.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        st.borrow().checkpoints,
        before,
        "a checkpoint of ticks alone"
    );
    // Past `every_entries` (100) since the newest: a new checkpoint, so the journal can be trimmed.
    let grown = *journal.append(SHARD, 1, vec![tick(); 60]).last().unwrap();
    wait_status(&mut st, "a checkpoint once the journal grew", |s| {
        covers_all(s, &TENANTS, grown)
    })
    .await;
    // A change of keys: checkpointed at the next round.
    h.write(5);
    let last = h.last_index();
    wait_status(&mut st, "a checkpoint of the change", |s| {
        s.checkpoints.values().any(|&i| i >= last)
    })
    .await;
    c.shutdown().await;
}

/// A shard with no tenant yet is trimmed once its ticks grew by `every_entries`, each time
/// behind a ticks-only record (a frontend starts a later tenant on the trimmed shard only with
/// that word; two are kept). A tenant that comes later is checkpointed from an empty store, equal
/// to a replica that applied every tick from the first, and from then on the shard is trimmed
/// only below what the tenant's checkpoints cover, with no new ticks-only record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_without_tenants_is_trimmed_behind_its_ticks_only_record() {
    use compactor::Journal;
    const EMPTY: u32 = 1;
    let store: Store = Arc::new(InMemory::new());
    let catalog = Catalog::new(store.clone());
    let journal = MemJournal::new();
    let c = Compactor::spawn(
        Config {
            shards: vec![EMPTY],
            tenants: vec![],
            every: Duration::from_millis(100),
            ..config()
        },
        journal.clone(),
        catalog.clone(),
    );
    let mut st = c.status(EMPTY).unwrap();
    let mut all = Vec::new();
    let mut time_ms = 1_600_000_000_000;
    let mut ticks = |n: usize| {
        for _ in 0..n {
            time_ms += 500;
            let kind = api::strata::journal::record::Kind::Tick(api::strata::journal::Tick {});
            let index = journal.append(EMPTY, time_ms, vec![kind.clone()])[0];
            all.push(api::strata::journal::Record {
                index,
                term: 1,
                time_ms,
                kind: Some(kind),
            });
        }
    };
    // Fewer than `every_entries` (100): ten rounds' worth of time, no trim.
    ticks(60);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(st.borrow().trimmed_below, 0, "trimmed too early");
    assert!(catalog.ticks_only(EMPTY).await.unwrap().is_empty());
    let mut trimmed = 1;
    for _ in 0..3 {
        ticks(120);
        let s = wait_status(&mut st, "a trim of the ticks", |s| {
            s.trimmed_below > trimmed
        })
        .await;
        trimmed = s.trimmed_below;
        assert_eq!(journal.first_index(EMPTY).await.unwrap(), trimmed);
        let records = catalog.ticks_only(EMPTY).await.unwrap();
        assert!(
            records.last().is_some_and(|&below| below >= trimmed),
            "trimmed below {trimmed} with ticks-only records {records:?}"
        );
        assert!(records.len() <= 2, "old records kept: {records:?}");
    }
    let words = catalog.ticks_only(EMPTY).await.unwrap();

    // A tenant arrives on the trimmed shard.
    let mut h = History::new(journal.clone(), EMPTY, &["late"], 41);
    let mut st_rounds = st.clone();
    write_and_checkpoint(&mut h, &mut st_rounds, &["late"], 3).await;
    let loaded = reader::latest(store.clone(), "late")
        .await
        .unwrap()
        .expect("a checkpoint of the late tenant");
    let mut reference = MemStore::new(memstore::Config::default());
    all.extend(h.all.iter().cloned());
    common::apply_all(
        &mut reference,
        "late",
        &all[..all
            .iter()
            .position(|r| r.index == loaded.meta.index)
            .unwrap()
            + 1],
    );
    common::assert_same("late", &loaded.store, &reference);
    let s = wait_status(&mut st, "a trim behind the tenant's checkpoints", |s| {
        s.trimmed_below > h.all[0].index
    })
    .await;
    assert_store_invariants(&catalog, &journal, EMPTY).await;
    assert_eq!(
        catalog.ticks_only(EMPTY).await.unwrap(),
        words,
        "a ticks-only record written while the shard holds a tenant"
    );
    let newest = catalog.latest_manifest("late").await.unwrap().unwrap();
    assert!(
        s.trimmed_below <= newest.checkpoints[1].index + 1,
        "{s:?} {newest:?}"
    );
    c.shutdown().await;
}
