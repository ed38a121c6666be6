//! Shared by the compactor's loop tests: a seeded history generator writing to the in-memory
//! journal, full-replay reference replicas, state comparison, and an object store that can be
//! switched off.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use api::etcdserverpb::{
    CompactionRequest, DeleteRangeRequest, LeaseGrantRequest, LeaseRevokeRequest, PutRequest,
    RangeRequest,
};
use api::record::{encode_entry, entry_for_tenant};
use api::strata::entry::Entry;
use api::strata::entry::entry::Request;
use api::strata::journal::record::Kind;
use api::strata::journal::{Record, Tick};
use async_trait::async_trait;
use compactor::store::Store;
use compactor::{Catalog, Journal, MemJournal, ShardStatus, reader};
use futures::stream::BoxStream;
use memstore::MemStore;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;

pub const WAIT: Duration = Duration::from_secs(60);

/// Writes a seeded random history of puts, deletes, leases and compactions for several tenants
/// and keeps every record, so a reference replica can replay all of it.
pub struct History {
    pub journal: MemJournal,
    pub shard: u32,
    pub tenants: Vec<String>,
    pub all: Vec<Record>,
    rng: StdRng,
    time_ms: i64,
    next_id: u64,
    leases: BTreeMap<String, Vec<i64>>,
}

impl History {
    pub fn new(journal: MemJournal, shard: u32, tenants: &[&str], seed: u64) -> Self {
        println!("history seed {seed} (replay: set the same seed in the test)");
        Self {
            journal,
            shard,
            tenants: tenants.iter().map(|t| t.to_string()).collect(),
            all: Vec::new(),
            rng: StdRng::seed_from_u64(seed),
            time_ms: 1_700_000_000_000,
            next_id: 1,
            leases: BTreeMap::new(),
        }
    }

    fn entry(&mut self, tenant: &str, request: Request) -> Kind {
        let id = self.next_id;
        self.next_id += 1;
        let mut request_id = id.to_le_bytes().to_vec();
        request_id.resize(16, 0);
        Kind::Data(encode_entry(&Entry {
            format_version: api::ENTRY_FORMAT_VERSION,
            tenant: tenant.to_string(),
            request_id,
            time_ms: 0,
            request: Some(request),
            ..Default::default()
        }))
    }

    fn random_kind(&mut self) -> Kind {
        let t = self.tenants[self.rng.random_range(0..self.tenants.len())].clone();
        let key = format!("key/{:03}", self.rng.random_range(0..150)).into_bytes();
        let roll = self.rng.random_range(0..100);
        let leases = self.leases.entry(t.clone()).or_default().clone();
        let request = match roll {
            0..=54 => Request::Put(PutRequest {
                key,
                value: format!("v{}", self.next_id).into_bytes(),
                lease: if !leases.is_empty() && self.rng.random_bool(0.2) {
                    leases[self.rng.random_range(0..leases.len())]
                } else {
                    0
                },
                ..Default::default()
            }),
            55..=69 => Request::DeleteRange(DeleteRangeRequest {
                key,
                ..Default::default()
            }),
            70..=79 => {
                let id = 1000 + self.next_id as i64;
                self.leases.entry(t.clone()).or_default().push(id);
                Request::LeaseGrant(LeaseGrantRequest {
                    id,
                    ttl: self.rng.random_range(2..20),
                })
            }
            80..=84 if !leases.is_empty() => {
                let id = leases[self.rng.random_range(0..leases.len())];
                Request::LeaseRevoke(LeaseRevokeRequest { id })
            }
            85..=86 => {
                let top = (self.next_id as i64 / 3).max(2);
                Request::Compact(CompactionRequest {
                    revision: self.rng.random_range(1..top),
                    physical: false,
                })
            }
            _ => return Kind::Tick(Tick {}),
        };
        self.entry(&t, request)
    }

    /// The next random record kind, for tests that append through a real journal.
    pub fn next_kind(&mut self) -> Kind {
        self.random_kind()
    }

    /// Appends `n` records, journal time moving 50-450 ms per record.
    pub fn write(&mut self, n: usize) {
        for _ in 0..n {
            let kind = self.random_kind();
            self.time_ms += self.rng.random_range(50..450);
            let idx = self
                .journal
                .append(self.shard, self.time_ms, vec![kind.clone()]);
            self.all.push(Record {
                index: idx[0],
                term: 1,
                time_ms: self.time_ms,
                kind: Some(kind),
            });
        }
    }

    pub fn last_index(&self) -> u64 {
        self.all.last().map_or(0, |r| r.index)
    }

    /// A replica of `tenant` that applied every record ever written.
    pub fn reference(&self, tenant: &str) -> MemStore {
        let mut s = MemStore::new(memstore::Config::default());
        apply_all(&mut s, tenant, &self.all);
        s
    }
}

pub fn apply_all(store: &mut MemStore, tenant: &str, records: &[Record]) {
    for r in records {
        let e = entry_for_tenant(r, tenant).expect("records decode");
        store.apply(r.index, &e);
    }
}

/// Same keys (every field), revisions, leases (with remaining TTLs) and HashKV.
pub fn assert_same(tenant: &str, got: &MemStore, want: &MemStore) {
    assert_eq!(
        got.applied_index(),
        want.applied_index(),
        "{tenant}: applied index"
    );
    assert_eq!(got.revision(), want.revision(), "{tenant}: revision");
    assert_eq!(
        got.compact_revision(),
        want.compact_revision(),
        "{tenant}: compact revision"
    );
    let all = RangeRequest {
        key: vec![0],
        range_end: vec![0],
        ..Default::default()
    };
    let a = got.range(&all).unwrap();
    let b = want.range(&all).unwrap();
    assert_eq!(a.kvs, b.kvs, "{tenant}: keys");
    assert_eq!(a.count, b.count, "{tenant}: count");
    assert_eq!(
        got.hash_kv(0).unwrap(),
        want.hash_kv(0).unwrap(),
        "{tenant}: hash_kv"
    );
    let la = got.lease_leases().leases;
    let lb = want.lease_leases().leases;
    assert_eq!(la, lb, "{tenant}: leases");
    for l in la {
        assert_eq!(
            got.lease_time_to_live(l.id, true).unwrap(),
            want.lease_time_to_live(l.id, true).unwrap(),
            "{tenant}: lease {}",
            l.id
        );
    }
}

/// Waits until `status` satisfies `pred` (panics with the last status after `WAIT`).
pub async fn wait_status(
    rx: &mut watch::Receiver<ShardStatus>,
    what: &str,
    pred: impl Fn(&ShardStatus) -> bool,
) -> ShardStatus {
    let got = tokio::time::timeout(WAIT, rx.wait_for(|s| pred(s)))
        .await
        .ok()
        .and_then(Result::ok)
        .map(|s| s.clone());
    got.unwrap_or_else(|| {
        panic!(
            "timed out waiting for {what}; last status {:?}",
            *rx.borrow()
        )
    })
}

/// An object store that fails every call while switched off.
#[derive(Debug)]
pub struct FlakyStore {
    pub inner: Arc<dyn ObjectStore>,
    pub down: AtomicBool,
}

impl FlakyStore {
    pub fn new(inner: Arc<dyn ObjectStore>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            down: AtomicBool::new(false),
        })
    }
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }
    fn check(&self) -> object_store::Result<()> {
        if self.down.load(Ordering::SeqCst) {
            Err(object_store::Error::Generic {
                store: "flaky",
                source: "object store switched off by the test".into(),
            })
        } else {
            Ok(())
        }
    }
}

impl fmt::Display for FlakyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FlakyStore({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for FlakyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.check()?;
        self.inner.put_opts(location, payload, opts).await
    }
    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.check()?;
        self.inner.put_multipart_opts(location, opts).await
    }
    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.check()?;
        self.inner.get_opts(location, options).await
    }
    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        if let Err(e) = self.check() {
            return Box::pin(futures::stream::once(async move { Err(e) }));
        }
        self.inner.delete_stream(locations)
    }
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        if let Err(e) = self.check() {
            return Box::pin(futures::stream::once(async move { Err(e) }));
        }
        self.inner.list(prefix)
    }
    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.check()?;
        self.inner.list_with_delimiter(prefix).await
    }
    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.check()?;
        self.inner.copy_opts(from, to, options).await
    }
}

/// `rounds` times: writes 250 records, then waits until every one of `tenants` has a
/// checkpoint covering them.
pub async fn write_and_checkpoint(
    h: &mut History,
    st: &mut watch::Receiver<ShardStatus>,
    tenants: &[&str],
    rounds: usize,
) {
    for _ in 0..rounds {
        h.write(250);
        let last = h.last_index();
        wait_status(st, "checkpoints at the last index", |s| {
            covers_all(s, tenants, last)
        })
        .await;
    }
}

/// Every tenant's newest checkpoint covers `index`.
pub fn covers_all(s: &ShardStatus, tenants: &[&str], index: u64) -> bool {
    tenants
        .iter()
        .all(|t| s.checkpoints.get(*t).is_some_and(|&i| i >= index))
}

/// A fresh replica per tenant from its newest checkpoint plus the retained journal equals one
/// that replayed everything.
pub async fn assert_fresh_replicas_match(
    store: &Store,
    journal: &MemJournal,
    h: &History,
    shard: u32,
) {
    for t in &h.tenants {
        let loaded = reader::latest(store.clone(), t)
            .await
            .unwrap()
            .expect("a checkpoint");
        let mut replica = loaded.store;
        let tail = journal.records(shard, loaded.meta.index + 1);
        if let Some(first) = tail.first() {
            assert_eq!(
                first.index,
                loaded.meta.index + 1,
                "{t}: journal trimmed past the checkpoint"
            );
        }
        apply_all(&mut replica, t, &tail);
        assert_same(t, &replica, &h.reference(t));
    }
}

/// Every manifest in the store names only complete objects with the recorded size and CRC, and
/// the journal is not trimmed past any tenant's newest published checkpoint.
pub async fn assert_store_invariants(catalog: &Catalog, journal: &impl Journal, shard: u32) {
    let first = journal.first_index(shard).await.unwrap();
    for t in catalog.tenants().await.unwrap() {
        let seqs = catalog.manifest_seqs(&t).await.unwrap();
        assert!(!seqs.is_empty(), "{t} has a folder but no manifest");
        for seq in seqs {
            let Some(m) = catalog.read_manifest(&t, seq).await.unwrap() else {
                continue;
            };
            for r in &m.checkpoints {
                catalog.read_checkpoint(r).await.unwrap_or_else(|e| {
                    panic!(
                        "manifest {seq} of {t} names {} which is unusable: {e}",
                        r.path
                    )
                });
            }
        }
        let newest = catalog.latest_manifest(&t).await.unwrap().unwrap();
        let covered = newest.newest().unwrap().index;
        assert!(
            first <= covered + 1,
            "{t}: journal starts at {first}, newest checkpoint covers {covered}"
        );
    }
}
