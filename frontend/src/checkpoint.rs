//! Starting a replica from the newest checkpoint in object storage (written by the compactor;
//! layout and manifest in `api::manifest`, object format in `memstore::checkpoint`): newest
//! manifest, then its checkpoints newest first, each verified (size, CRC32C, decode, tenant,
//! index) before use; a bad one is reported and the next older one tried. A large object is
//! fetched as parallel ranged GETs straight into one 16-aligned buffer (its CRC32C computed per
//! part as the parts arrive), so decoding validates it in place without another copy. From a
//! local directory a large object is instead read with plain file reads straight into a buffer
//! the allocator hands out already zeroed (no intermediate part buffers, no copy, no fill).

use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use api::manifest::{CheckpointRef, Manifest};
use futures::{StreamExt, TryStreamExt};
use memstore::MemStore;
use memstore::checkpoint::{CRC_FROM, DecodeOptions, decode_with};
use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::prefix::PrefixStore;
use object_store::{ObjectStore, ObjectStoreExt};
use rkyv::util::AlignedVec;

/// Objects above this size are fetched as parallel ranged GETs.
pub const PARALLEL_FETCH_ABOVE: u64 = 16 * 1024 * 1024;
/// Bytes per ranged GET of a large object.
pub const FETCH_PART_BYTES: u64 = 8 * 1024 * 1024;
/// Ranged GETs in flight at once for one object.
pub const FETCH_CONCURRENCY: usize = 8;
/// The alignment `memstore::checkpoint::decode` validates in place (else it copies).
const CHECKPOINT_ALIGN: usize = 16;
/// Bytes per read (and per CRC32C pass, while they are still in cache) of a local file.
pub const LOCAL_READ_BYTES: usize = 1024 * 1024;

/// The object store checkpoints are read from; for a local directory also the directory, so a
/// large checkpoint is read from its file directly. Dereferences to the object store.
#[derive(Clone)]
pub struct Store {
    objects: Arc<dyn ObjectStore>,
    local: Option<Arc<LocalFileSystem>>,
}

impl<T: ObjectStore> From<Arc<T>> for Store {
    fn from(objects: Arc<T>) -> Store {
        Store {
            objects,
            local: None,
        }
    }
}

impl std::ops::Deref for Store {
    type Target = dyn ObjectStore;

    fn deref(&self) -> &Self::Target {
        &*self.objects
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.objects)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("object store URL {url:?}: {reason}")]
    BadUrl { url: String, reason: String },
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    #[error(transparent)]
    Manifest(#[from] api::manifest::ManifestError),
    #[error("checkpoint {path}: {reason}")]
    Corrupt { path: String, reason: String },
    #[error("no checkpoint of the manifest is usable; newest failed with: {0}")]
    NoneUsable(String),
    /// The tenant's checkpoints are another shard's: this frontend is configured for the wrong
    /// shard (its journal positions would mean nothing against them).
    #[error(
        "tenant {tenant}: its checkpoints are shard {found}'s, this frontend serves shard {shard}"
    )]
    WrongShard {
        tenant: String,
        shard: u32,
        found: u32,
    },
    #[error("decoding task failed: {0}")]
    Task(String),
    /// Every checkpoint the manifest names is below what the journal still holds: the journal
    /// cannot continue from any of them (a newer one is due; see `Replica::reload`).
    #[error(
        "the newest checkpoint is at index {newest}, below the journal's first index {first_index}"
    )]
    BelowTrim { newest: u64, first_index: u64 },
}

fn bad(url: &str, reason: impl std::fmt::Display) -> CheckpointError {
    CheckpointError::BadUrl {
        url: url.to_string(),
        reason: reason.to_string(),
    }
}

/// Opens the store named by `url`, as the compactor names it: `file:///dir` or a plain path,
/// `memory://`, `s3://bucket[/prefix]`, `gs://bucket[/prefix]`, `az://container[/prefix]`; cloud
/// settings from the environment (`AWS_*`, `GOOGLE_*`, `AZURE_*`).
pub fn open(url: &str) -> Result<Store, CheckpointError> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return open_dir(std::path::Path::new(url), url);
    };
    let prefix = rest
        .split_once('/')
        .map_or("", |(_, p)| p)
        .trim_matches('/');
    let store: Arc<dyn ObjectStore> = match scheme {
        "file" => return open_dir(std::path::Path::new(rest), url),
        "memory" => Arc::new(InMemory::new()),
        "s3" | "s3a" => Arc::new(
            AmazonS3Builder::from_env()
                .with_url(url)
                .build()
                .map_err(|e| bad(url, e))?,
        ),
        "gs" => Arc::new(
            GoogleCloudStorageBuilder::from_env()
                .with_url(url)
                .build()
                .map_err(|e| bad(url, e))?,
        ),
        "az" | "azure" | "abfs" | "abfss" => Arc::new(
            MicrosoftAzureBuilder::from_env()
                .with_url(url)
                .build()
                .map_err(|e| bad(url, e))?,
        ),
        other => return Err(bad(url, format!("unsupported scheme {other:?}"))),
    };
    let objects: Arc<dyn ObjectStore> = if prefix.is_empty() {
        store
    } else {
        let p = Path::parse(prefix).map_err(|e| bad(url, e))?;
        Arc::new(PrefixStore::new(store, p))
    };
    Ok(Store {
        objects,
        local: None,
    })
}

fn open_dir(dir: &std::path::Path, url: &str) -> Result<Store, CheckpointError> {
    std::fs::create_dir_all(dir).map_err(|e| bad(url, format!("create {}: {e}", dir.display())))?;
    let local = Arc::new(LocalFileSystem::new_with_prefix(dir).map_err(|e| bad(url, e))?);
    Ok(Store {
        objects: local.clone(),
        local: Some(local),
    })
}

/// A checkpoint loaded into a store.
pub struct Loaded {
    pub reference: CheckpointRef,
    pub store: MemStore,
    pub timings: LoadTimings,
}

/// Where the time of loading one checkpoint went.
#[derive(Clone, Copy, Debug, Default)]
pub struct LoadTimings {
    /// GETs, copy into the aligned buffer and CRC32C.
    pub fetch: Duration,
    /// `memstore::checkpoint::decode` (validation and building the key space).
    pub decode: Duration,
}

/// The manifest of `tenant` readers load (`api::manifest::chosen` of those that parse: a late
/// manifest of a stale compactor naming an older state is passed over), or `None` if it has
/// none. One that vanished since the listing (collected) is skipped; if none parses, the first
/// reason.
async fn latest_manifest(store: &Store, tenant: &str) -> Result<Option<Manifest>, CheckpointError> {
    let dir = Path::from(api::manifest::manifests_dir(tenant)?);
    let metas: Vec<_> = store.list(Some(&dir)).try_collect().await?;
    let mut parsed = Vec::with_capacity(metas.len());
    let mut unusable = None;
    let mut listed = false;
    for meta in &metas {
        if api::manifest::parse_manifest_seq(meta.location.as_ref()).is_none() {
            continue;
        }
        listed = true;
        let bytes = match store.get(&meta.location).await {
            Ok(got) => got.bytes().await?,
            Err(object_store::Error::NotFound { .. }) => continue,
            Err(e) => return Err(e.into()),
        };
        match Manifest::from_json(tenant, &bytes) {
            Ok(m) => parsed.push(m),
            Err(e) => {
                tracing::warn!(tenant, path = %meta.location, error = %e, "skipping unusable manifest");
                unusable.get_or_insert(e);
            }
        }
    }
    if let Some(m) = api::manifest::chosen(&parsed) {
        return Ok(Some(m.clone()));
    }
    match unusable {
        Some(e) => Err(e.into()),
        // Every listed manifest vanished: collected after newer ones were published.
        None if listed => Err(CheckpointError::Store(object_store::Error::NotFound {
            path: dir.to_string(),
            source: "every listed manifest was collected while reading; list again".into(),
        })),
        None => Ok(None),
    }
}

/// Whether the compactor's word says it trimmed this shard up to `first_index`: its
/// `TicksOnly` record of the shard reaches that far (the shard held no tenant's record below),
/// or some tenant's newest manifest names `shard` and covers the journal up to there. The
/// compactor trims a shard only below what every tenant it knows on it has checkpointed, so a
/// tenant without a manifest in the same store had no entry below `first_index`; without that
/// word (a wrong `--object-store`, deleted checkpoints) nothing can be said of it.
pub async fn shard_trimmed_to(
    store: &Store,
    shard: u32,
    first_index: u64,
) -> Result<bool, CheckpointError> {
    let dir = Path::from(api::manifest::ticks_only_dir(shard));
    let records: Vec<_> = store.list(Some(&dir)).try_collect().await?;
    if records
        .iter()
        .filter_map(|r| api::manifest::parse_ticks_only_below(r.location.as_ref()))
        .any(|below| below >= first_index)
    {
        return Ok(true);
    }
    let listed = store
        .list_with_delimiter(Some(&Path::from(api::manifest::TENANTS_DIR)))
        .await?;
    for dir in &listed.common_prefixes {
        let Some(tenant) = dir.filename() else {
            continue;
        };
        if api::manifest::validate_tenant(tenant).is_err() {
            continue;
        }
        match latest_manifest(store, tenant).await {
            Ok(Some(m)) => {
                if m.shard == shard && m.newest().is_some_and(|c| c.index + 1 >= first_index) {
                    return Ok(true);
                }
            }
            Ok(None) | Err(CheckpointError::Manifest(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(false)
}

/// A checkpoint object read into memory, checked against its manifest entry.
#[derive(Debug)]
struct Fetched {
    bytes: Buffer,
    /// CRC32C of `bytes[CRC_FROM..]` (what the object's header checksum covers), when it was
    /// computed along the way: decode then skips its own pass over the object.
    header_crc: Option<u32>,
}

/// A fetched object's bytes: 16-aligned by construction (parts from an object store), or a
/// zeroed allocation a local file was read into (16-aligned in practice, as the allocator
/// places large blocks; decode copies it once if not).
#[derive(Debug)]
enum Buffer {
    Aligned(AlignedVec<CHECKPOINT_ALIGN>),
    Plain(Vec<u8>),
}

impl std::ops::Deref for Buffer {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Buffer::Aligned(b) => b,
            Buffer::Plain(b) => b,
        }
    }
}

/// Reads one checkpoint object into a 16-aligned buffer and checks its size and CRC32C against
/// the manifest: one GET for a small object, parallel ranged GETs for a large one.
async fn fetch(store: &Store, r: &CheckpointRef) -> Result<Fetched, CheckpointError> {
    fetch_in_parts(store, r, PARALLEL_FETCH_ABOVE, FETCH_PART_BYTES).await
}

/// [`fetch`] with the size above which it goes parallel and the part size as parameters.
async fn fetch_in_parts(
    store: &Store,
    r: &CheckpointRef,
    parallel_above: u64,
    part_bytes: u64,
) -> Result<Fetched, CheckpointError> {
    let path = Path::from(r.path.as_str());
    let mismatch = |what: String| CheckpointError::Corrupt {
        path: r.path.clone(),
        reason: what,
    };
    let size = usize::try_from(r.size)
        .map_err(|_| mismatch(format!("size {} does not fit in memory", r.size)))?;
    if r.size > parallel_above
        && let Some(local) = &store.local
    {
        let file = local.path_to_filesystem(&path)?;
        let (buf, parts, per_part) =
            tokio::task::spawn_blocking(move || read_file(&file, size, LOCAL_READ_BYTES))
                .await
                .map_err(|e| CheckpointError::Task(e.to_string()))?
                .map_err(|e| mismatch(e.to_string()))?;
        let header_crc = check_crcs(r, size, &parts, &per_part).map_err(mismatch)?;
        return Ok(Fetched {
            bytes: Buffer::Plain(buf),
            header_crc,
        });
    }
    let mut buf = AlignedVec::<CHECKPOINT_ALIGN>::with_capacity(size);
    if r.size <= parallel_above {
        let bytes = store.get(&path).await?.bytes().await?;
        r.verify(&bytes)?;
        buf.extend_from_slice(&bytes);
        return Ok(Fetched {
            bytes: Buffer::Aligned(buf),
            header_crc: None,
        });
    }
    buf.resize(size, 0);
    // Only the first part may hold bytes the header's crc does not cover.
    let part_bytes = part_bytes.max(CRC_FROM as u64);
    let parts: Vec<Range<u64>> = (0..r.size)
        .step_by(part_bytes as usize)
        .map(|from| from..(from + part_bytes).min(r.size))
        .collect();
    let per_part = fetch_ranges(store, &path, &parts, &mut buf).await?;
    let header_crc = check_crcs(r, size, &parts, &per_part).map_err(mismatch)?;
    Ok(Fetched {
        bytes: Buffer::Aligned(buf),
        header_crc,
    })
}

/// Combines the crcs of an object's parts (per part: the CRC32C of its bytes before
/// `CRC_FROM`, only the first part has any, and of the rest) into the whole object's, which
/// must be the manifest's, and the header's (of `bytes[CRC_FROM..]`), which is returned.
fn check_crcs(
    r: &CheckpointRef,
    size: usize,
    parts: &[Range<u64>],
    per_part: &[(Option<u32>, u32)],
) -> Result<Option<u32>, String> {
    let head_crc = per_part.iter().find_map(|&(head, _)| head);
    let header_crc = parts
        .iter()
        .zip(per_part)
        .fold(None, |acc: Option<u32>, (range, &(_, c))| {
            let len = (range.end.max(CRC_FROM as u64) - range.start.max(CRC_FROM as u64)) as usize;
            Some(match acc {
                None => c,
                Some(a) => crc32c::crc32c_combine(a, c, len),
            })
        })
        .unwrap_or(0);
    let crc = match head_crc {
        Some(h) => crc32c::crc32c_combine(h, header_crc, size.saturating_sub(CRC_FROM)),
        None => header_crc,
    };
    if crc != r.crc32c {
        return Err(format!(
            "crc32c {crc:#010x} but the manifest says {:#010x}",
            r.crc32c
        ));
    }
    Ok((size >= CRC_FROM).then_some(header_crc))
}

/// Reads a local file of `size` bytes (no more, no less) into a zeroed buffer, `part` bytes at a
/// time, with each part's crcs taken while its bytes are still in cache. Returns the buffer,
/// the parts and their crcs.
#[allow(clippy::type_complexity)] // a private helper's three results, named at its one caller
fn read_file(
    file: &std::path::Path,
    size: usize,
    part: usize,
) -> std::io::Result<(Vec<u8>, Vec<Range<u64>>, Vec<(Option<u32>, u32)>)> {
    use std::io::Read;
    let mut f = std::fs::File::open(file)?;
    let len = f.metadata()?.len();
    if len != size as u64 {
        return Err(std::io::Error::other(format!(
            "{} holds {len} bytes, the manifest says {size}",
            file.display()
        )));
    }
    // Zeroed by the allocator: fresh pages come zeroed from the kernel, with no fill pass.
    let mut buf = vec![0u8; size];
    let part = part.max(CRC_FROM);
    let mut parts = Vec::with_capacity(size.div_ceil(part));
    let mut crcs = Vec::with_capacity(size.div_ceil(part));
    for (i, chunk) in buf.chunks_mut(part).enumerate() {
        f.read_exact(chunk)?;
        let start = (i * part) as u64;
        crcs.push(part_crcs(start, chunk));
        parts.push(start..start + chunk.len() as u64);
    }
    Ok((buf, parts, crcs))
}

/// The CRC32C of a part's bytes before `CRC_FROM` (only the first part has any) and of the rest.
fn part_crcs(start: u64, bytes: &[u8]) -> (Option<u32>, u32) {
    let skip = (CRC_FROM as u64)
        .saturating_sub(start)
        .min(bytes.len() as u64) as usize;
    let head = (skip > 0).then(|| crc32c::crc32c(&bytes[..skip]));
    (head, crc32c::crc32c(&bytes[skip..]))
}

/// Ranged GETs of `parts` (several in flight) into `buf`, with each part's crcs.
async fn fetch_ranges(
    store: &Store,
    path: &Path,
    parts: &[Range<u64>],
    buf: &mut [u8],
) -> Result<Vec<(Option<u32>, u32)>, CheckpointError> {
    let mut crcs = vec![(None, 0u32); parts.len()];
    let mut fetched = futures::stream::iter(parts.iter().cloned().enumerate())
        .map(|(i, range)| {
            let store = store.clone();
            let path = path.clone();
            async move { store.get_range(&path, range).await.map(|b| (i, b)) }
        })
        .buffer_unordered(FETCH_CONCURRENCY);
    while let Some(part) = fetched.next().await {
        let (i, bytes) = part?;
        let range = parts[i].start as usize..parts[i].end as usize;
        if bytes.len() != range.len() {
            return Err(CheckpointError::Corrupt {
                path: path.to_string(),
                reason: format!("ranged read of {range:?} returned {} bytes", bytes.len()),
            });
        }
        crcs[i] = part_crcs(parts[i].start, &bytes);
        buf[range].copy_from_slice(&bytes);
    }
    Ok(crcs)
}

/// Reads, verifies and decodes one checkpoint object.
async fn load_one(
    store: &Store,
    tenant: &str,
    shard: u32,
    r: &CheckpointRef,
) -> Result<(MemStore, LoadTimings), CheckpointError> {
    let started = Instant::now();
    let Fetched { bytes, header_crc } = fetch(store, r).await?;
    let fetched = Instant::now();
    let path = r.path.clone();
    let options = DecodeOptions {
        precomputed_crc: header_crc,
    };
    // Decoding a large store is CPU work: keep it off the async workers.
    let (meta, mem) = tokio::task::spawn_blocking(move || decode_with(&bytes, options))
        .await
        .map_err(|e| CheckpointError::Task(e.to_string()))?
        .map_err(|e| CheckpointError::Corrupt {
            path: path.clone(),
            reason: e.to_string(),
        })?;
    let timings = LoadTimings {
        fetch: fetched - started,
        decode: fetched.elapsed(),
    };
    if meta.tenant != tenant
        || meta.shard != shard
        || meta.index != r.index
        || meta.revision != r.revision
    {
        return Err(CheckpointError::Corrupt {
            path,
            reason: format!(
                "object holds tenant {:?} shard {} index {} revision {}; the manifest says tenant {tenant:?} shard {shard} index {} revision {}",
                meta.tenant, meta.shard, meta.index, meta.revision, r.index, r.revision
            ),
        });
    }
    tracing::info!(tenant, path = %r.path, index = r.index, bytes = r.size, fetch_ms = timings.fetch.as_millis() as u64, decode_ms = timings.decode.as_millis() as u64, "checkpoint loaded");
    Ok((mem, timings))
}

/// The size in bytes of `tenant`'s newest checkpoint, or `None` if it has none yet: what
/// loading it is expected to hold, known before it is fetched.
pub async fn newest_size(store: &Store, tenant: &str) -> Result<Option<u64>, CheckpointError> {
    Ok(latest_manifest(store, tenant)
        .await?
        .and_then(|m| m.newest().map(|r| r.size)))
}

/// The newest usable checkpoint of `tenant` on journal shard `shard`, or `None` if the tenant
/// has no manifest yet. A manifest of another shard is an error.
pub async fn latest(
    store: &Store,
    tenant: &str,
    shard: u32,
) -> Result<Option<Loaded>, CheckpointError> {
    latest_from(store, tenant, shard, 0).await
}

/// As [`latest`], among the checkpoints the journal can continue from when its first index is
/// `first_index` (index + 1 at least that): the others are not even fetched.
pub async fn latest_from(
    store: &Store,
    tenant: &str,
    shard: u32,
    first_index: u64,
) -> Result<Option<Loaded>, CheckpointError> {
    let Some(manifest) = latest_manifest(store, tenant).await? else {
        return Ok(None);
    };
    if manifest.shard != shard {
        return Err(CheckpointError::WrongShard {
            tenant: tenant.to_string(),
            shard,
            found: manifest.shard,
        });
    }
    let continuable: Vec<&CheckpointRef> = manifest
        .checkpoints
        .iter()
        .filter(|r| r.index + 1 >= first_index)
        .collect();
    if continuable.is_empty() {
        return Err(CheckpointError::BelowTrim {
            newest: manifest.newest().map_or(0, |r| r.index),
            first_index,
        });
    }
    let mut first_error = None;
    let mut all_missing = true;
    for r in continuable {
        match load_one(store, tenant, shard, r).await {
            Ok((mem, timings)) => {
                return Ok(Some(Loaded {
                    reference: r.clone(),
                    store: mem,
                    timings,
                }));
            }
            // The store failing is no verdict on the checkpoint: the caller may try again.
            Err(CheckpointError::Store(e))
                if !matches!(e, object_store::Error::NotFound { .. }) =>
            {
                return Err(CheckpointError::Store(e));
            }
            Err(e) => {
                tracing::warn!(tenant, path = %r.path, index = r.index, error = %e, "checkpoint unusable; trying the previous one");
                if !matches!(e, CheckpointError::Store(_)) {
                    all_missing = false;
                }
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        // Every object the manifest names is gone: collected while this load read an older
        // manifest. A newer manifest names newer ones: the caller may try again.
        Some(e) if all_missing => Err(e),
        e => Err(CheckpointError::NoneUsable(
            e.map(|e| e.to_string()).unwrap_or_default(),
        )),
    }
}

/// Checkpoints and manifests of tenant `default` on shard 0, for the tests here and the
/// replica's.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;
    use api::manifest::MANIFEST_FORMAT_VERSION;
    use object_store::PutPayload;

    /// A store that applied `index` ticks.
    pub(crate) fn store_at(index: u64) -> MemStore {
        let mut mem = MemStore::new(memstore::Config::default());
        for i in 1..=index {
            let tick = api::strata::entry::Entry {
                format_version: api::ENTRY_FORMAT_VERSION,
                tenant: String::new(),
                request_id: Vec::new(),
                time_ms: i as i64,
                request: Some(api::strata::entry::entry::Request::Tick(
                    api::strata::entry::Tick {},
                )),
                ..Default::default()
            };
            mem.apply(i, &tick);
        }
        mem
    }

    pub(crate) async fn publish(store: &Store, index: u64, corrupt: bool) -> CheckpointRef {
        publish_of(store, "default", 0, &store_at(index), corrupt).await
    }

    /// Writes `mem` as a checkpoint of `tenant` on `shard`, at its applied index.
    pub(crate) async fn publish_of(
        store: &Store,
        tenant: &str,
        shard: u32,
        mem: &MemStore,
        corrupt: bool,
    ) -> CheckpointRef {
        let index = mem.applied_index();
        let meta = memstore::checkpoint::CheckpointMeta {
            tenant: tenant.into(),
            shard,
            index,
            revision: mem.revision(),
            created_ms: 0,
        };
        let mut bytes = memstore::checkpoint::encode(&meta, mem);
        let r = CheckpointRef {
            path: api::manifest::checkpoint_path(tenant, index, 0).unwrap(),
            index,
            revision: mem.revision(),
            size: bytes.len() as u64,
            crc32c: crc32c::crc32c(&bytes),
            time_ms: 0,
            created_ms: 0,
        };
        if corrupt {
            let n = bytes.len();
            bytes[n - 1] ^= 0xff;
        }
        store
            .put(&Path::from(r.path.as_str()), PutPayload::from(bytes))
            .await
            .unwrap();
        r
    }

    pub(crate) async fn manifest(store: &Store, seq: u64, checkpoints: Vec<CheckpointRef>) {
        manifest_of(store, "default", 0, seq, checkpoints).await
    }

    /// Publishes manifest `seq` of `tenant` on `shard`, naming `checkpoints`.
    pub(crate) async fn manifest_of(
        store: &Store,
        tenant: &str,
        shard: u32,
        seq: u64,
        checkpoints: Vec<CheckpointRef>,
    ) {
        let m = Manifest {
            format_version: MANIFEST_FORMAT_VERSION,
            tenant: tenant.into(),
            shard,
            seq,
            published_ms: 0,
            checkpoints,
        };
        store
            .put(
                &Path::from(api::manifest::manifest_path(tenant, seq).unwrap()),
                PutPayload::from(m.to_json()),
            )
            .await
            .unwrap();
    }
}

/// The measurement tests' /proc reader, shared with the other crates' (std only).
#[cfg(test)]
#[path = "../../tests/src/procstat.rs"]
mod procstat;

#[cfg(test)]
mod tests {
    use super::fixtures::{manifest, publish};
    use super::*;
    use object_store::PutPayload;
    use procstat::cpu_and_faults;

    #[tokio::test]
    async fn no_manifest_means_no_checkpoint() {
        let store = Store::from(Arc::new(InMemory::new()));
        assert!(latest(&store, "default", 0).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn newest_usable_checkpoint_is_loaded_and_corrupt_ones_skipped() {
        let store = Store::from(Arc::new(InMemory::new()));
        let old = publish(&store, 5, false).await;
        let bad = publish(&store, 9, true).await;
        manifest(&store, 1, vec![old.clone()]).await;
        manifest(&store, 2, vec![bad, old.clone()]).await;
        let loaded = latest(&store, "default", 0).await.unwrap().unwrap();
        assert_eq!(loaded.reference, old);
        assert_eq!(loaded.store.applied_index(), 5);
    }

    /// A manifest whose objects are all gone (collected while a load read it) is no verdict on
    /// the tenant: the store's NotFound comes back, which a reload retries.
    #[tokio::test]
    async fn a_manifest_whose_objects_are_gone_is_retried_not_refused() {
        let store = Store::from(Arc::new(InMemory::new()));
        let r = publish(&store, 5, false).await;
        manifest(&store, 1, vec![r.clone()]).await;
        store.delete(&Path::from(r.path.as_str())).await.unwrap();
        let Err(e) = latest(&store, "default", 0).await else {
            panic!("a checkpoint that is gone was loaded");
        };
        assert!(
            matches!(
                e,
                CheckpointError::Store(object_store::Error::NotFound { .. })
            ),
            "{e}"
        );
    }

    /// A late manifest of a stale compactor (a higher number, an older state the journal was
    /// trimmed past) is passed over for the one naming the newest state.
    #[tokio::test]
    async fn a_late_manifest_naming_an_older_state_is_passed_over() {
        let store = Store::from(Arc::new(InMemory::new()));
        let current = publish(&store, 30, false).await;
        let stale = publish(&store, 20, false).await;
        manifest(&store, 1, vec![current]).await;
        manifest(&store, 2, vec![stale]).await;
        let loaded = latest(&store, "default", 0).await.unwrap().unwrap();
        assert_eq!(loaded.reference.index, 30);
        // A later manifest of the newest state wins as usual.
        let next = publish(&store, 40, false).await;
        manifest(&store, 3, vec![next]).await;
        let loaded = latest(&store, "default", 0).await.unwrap().unwrap();
        assert_eq!(loaded.reference.index, 40);
    }

    #[tokio::test]
    async fn another_shards_checkpoints_are_refused() {
        let store = Store::from(Arc::new(InMemory::new()));
        let r = publish(&store, 5, false).await;
        manifest(&store, 1, vec![r]).await;
        let Err(e) = latest(&store, "default", 1).await else {
            panic!("shard 0's checkpoint was loaded for shard 1");
        };
        assert!(
            matches!(
                e,
                CheckpointError::WrongShard {
                    shard: 1,
                    found: 0,
                    ..
                }
            ),
            "{e}"
        );
    }

    #[tokio::test]
    async fn large_objects_are_fetched_in_parts_and_checked_whole() {
        let dir = std::env::temp_dir().join(format!("strata-fe-parts-{}", std::process::id()));
        let local = open(dir.to_str().unwrap()).unwrap();
        let memory = Store::from(Arc::new(InMemory::new()));
        for store in [memory, local] {
            fetched_in_parts(&store).await;
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    async fn fetched_in_parts(store: &Store) {
        let store = store.clone();
        let good = publish(&store, 300, false).await;
        let bad = publish(&store, 301, true).await;
        // Parts of 64 bytes (several, the last one short), fetched in parallel.
        assert!(good.size > 3 * 64 && good.size % 64 != 0, "{}", good.size);
        let Fetched {
            bytes: buf,
            header_crc,
        } = fetch_in_parts(&store, &good, 10, 64).await.unwrap();
        assert!((buf.as_ptr() as usize).is_multiple_of(CHECKPOINT_ALIGN));
        let whole = store
            .get(&Path::from(good.path.as_str()))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        assert_eq!(&buf[..], &whole[..]);
        // The header's crc came along, equal to a pass over the whole object, for every part
        // size (parts shorter than the header are widened to it).
        assert_eq!(header_crc, Some(crc32c::crc32c(&whole[CRC_FROM..])));
        for part in [1, 15, 16, 17, 100, good.size - 1, good.size] {
            let f = fetch_in_parts(&store, &good, 10, part).await.unwrap();
            assert_eq!(&f.bytes[..], &whole[..], "parts of {part}");
            assert_eq!(f.header_crc, header_crc, "parts of {part}");
        }
        let (_, decoded) = decode_with(
            &buf,
            DecodeOptions {
                precomputed_crc: header_crc,
            },
        )
        .unwrap();
        assert_eq!(decoded.applied_index(), 300);
        if let Some(local) = &store.local {
            // Read from the file directly: every read size gives the same bytes and crcs.
            let file = local
                .path_to_filesystem(&Path::from(good.path.as_str()))
                .unwrap();
            let size = good.size as usize;
            for part in [1, 15, 16, 17, 100, size - 1, size, LOCAL_READ_BYTES] {
                let (bytes, parts, crcs) = read_file(&file, size, part).unwrap();
                assert_eq!(&bytes[..], &whole[..], "reads of {part}");
                assert_eq!(
                    check_crcs(&good, size, &parts, &crcs).unwrap(),
                    header_crc,
                    "reads of {part}"
                );
            }
            // A file of another size than the manifest says is refused before reading.
            assert!(read_file(&file, size + 1, 64).is_err());
            assert!(read_file(&file, size - 1, 64).is_err());
        }
        let err = fetch_in_parts(&store, &bad, 10, 64).await.unwrap_err();
        assert!(err.to_string().contains("crc32c"), "{err}");
        // A manifest naming a longer object than stored: the ranged read past the end fails.
        let mut longer = good.clone();
        longer.size += 10;
        assert!(fetch_in_parts(&store, &longer, 10, 64).await.is_err());
        // And one naming a shorter object: the whole-object crc cannot match.
        let mut shorter = good.clone();
        shorter.size -= 1;
        assert!(fetch_in_parts(&store, &shorter, 10, 64).await.is_err());
    }

    /// Time to load a checkpoint of `STRATA_LOAD_KEYS` keys (default 1M: 64-byte keys, 256-byte
    /// values) from a local directory, read from its file and through ranged GETs, alternating
    /// (with the process's CPU time and minor faults for each): `cargo test --release -p strata-frontend --lib
    /// load_timing -- --ignored --nocapture`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore]
    async fn load_timing() {
        let keys: usize = std::env::var("STRATA_LOAD_KEYS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1_000_000);
        let same_ms = std::env::var("STRATA_LOAD_SAME_MS").is_ok_and(|v| v == "1");
        let mut mem = MemStore::new(memstore::Config::default());
        for i in 0..keys {
            let e = api::strata::entry::Entry {
                format_version: api::ENTRY_FORMAT_VERSION,
                tenant: "default".into(),
                // 16-byte ids, as frontends write them, one put per journal millisecond: the
                // checkpoint holds the last `DEFAULT_REQUEST_ID_WINDOW_MS` of them (120k), as a
                // tenant written at 1,000 puts/s would (STRATA_LOAD_SAME_MS=1 keeps all 1M).
                request_id: [(i as u64).to_le_bytes(), [0x5a; 8]].concat(),
                time_ms: if same_ms { 1 } else { i as i64 },
                request: Some(api::strata::entry::entry::Request::Put(
                    api::etcdserverpb::PutRequest {
                        key: format!("{i:064}").into_bytes(),
                        value: vec![b'v'; 256],
                        ..Default::default()
                    },
                )),
                ..Default::default()
            };
            mem.apply(i as u64 + 1, &e);
        }
        let dir = std::env::temp_dir().join(format!("strata-load-timing-{}", std::process::id()));
        let store = open(dir.to_str().unwrap()).unwrap();
        let meta = memstore::checkpoint::CheckpointMeta {
            tenant: "default".into(),
            shard: 0,
            index: mem.applied_index(),
            revision: mem.revision(),
            created_ms: 0,
        };
        let bytes = memstore::checkpoint::encode(&meta, &mem);
        println!(
            "{keys} keys, {} request ids remembered, checkpoint of {} MB",
            mem.remembered_request_ids(),
            bytes.len() / 1_000_000
        );
        drop(mem);
        let r = CheckpointRef {
            path: api::manifest::checkpoint_path("default", meta.index, 0).unwrap(),
            index: meta.index,
            revision: meta.revision,
            size: bytes.len() as u64,
            crc32c: crc32c::crc32c(&bytes),
            time_ms: 0,
            created_ms: 0,
        };
        store
            .put(&Path::from(r.path.as_str()), PutPayload::from(bytes))
            .await
            .unwrap();
        manifest(&store, 1, vec![r.clone()]).await;
        // The same directory without its local reader: ranged GETs through the object store.
        let remote_like = Store {
            objects: store.objects.clone(),
            local: None,
        };
        for run in 0..4 {
            // Alternate which way goes first: the machine is shared and noisy.
            for way in if run % 2 == 0 { [0, 1] } else { [1, 0] } {
                let (s, name) = if way == 0 {
                    (&store, "local file read")
                } else {
                    (&remote_like, "ranged GETs")
                };
                // The fetch alone (CPU, faults), then the whole load as a frontend does it.
                let (cpu, faults) = cpu_and_faults("self");
                let t = Instant::now();
                let fetched = fetch(s, &r).await.unwrap();
                let fetch_wall = t.elapsed();
                let (cpu2, faults2) = cpu_and_faults("self");
                drop(fetched);
                let (cpu3, faults3) = cpu_and_faults("self");
                let t = Instant::now();
                let loaded = latest(s, "default", 0).await.unwrap().unwrap();
                let total = t.elapsed();
                let (cpu4, faults4) = cpu_and_faults("self");
                assert_eq!(loaded.store.revision(), meta.revision);
                println!(
                    "run {run}: {name}: fetch alone {:.2} s wall, {:.2} s CPU, {} faults; load {:.2} s (fetch {:.2} s, decode {:.2} s), {:.2} s CPU, {} faults",
                    fetch_wall.as_secs_f64(),
                    cpu2 - cpu,
                    faults2 - faults,
                    total.as_secs_f64(),
                    loaded.timings.fetch.as_secs_f64(),
                    loaded.timings.decode.as_secs_f64(),
                    cpu4 - cpu3,
                    faults4 - faults3
                );
                drop(loaded);
            }
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn urls_open_local_dirs_and_refuse_unknown_schemes() {
        let dir = std::env::temp_dir().join(format!("strata-fe-ckpt-{}", std::process::id()));
        open(&format!("file://{}", dir.display())).unwrap();
        open(dir.to_str().unwrap()).unwrap();
        assert!(matches!(
            open("ftp://x/y"),
            Err(CheckpointError::BadUrl { .. })
        ));
        let _ = std::fs::remove_dir_all(dir);
    }
}
