//! Starting a replica from the newest checkpoint in object storage (written by the compactor;
//! layout and manifest in `api::manifest`, object format in `memstore::checkpoint`): newest
//! manifest, then its checkpoints newest first, each verified (size, CRC32C, decode, tenant,
//! index) before use; a bad one is reported and the next older one tried.

use std::sync::Arc;

use api::manifest::{CheckpointRef, Manifest};
use futures::TryStreamExt;
use memstore::MemStore;
use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::prefix::PrefixStore;
use object_store::{ObjectStore, ObjectStoreExt};

/// The object store checkpoints are read from.
pub type Store = Arc<dyn ObjectStore>;

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
    #[error("decoding task failed: {0}")]
    Task(String),
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
    let store: Store = match scheme {
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
    if prefix.is_empty() {
        Ok(store)
    } else {
        let p = Path::parse(prefix).map_err(|e| bad(url, e))?;
        Ok(Arc::new(PrefixStore::new(store, p)))
    }
}

fn open_dir(dir: &std::path::Path, url: &str) -> Result<Store, CheckpointError> {
    std::fs::create_dir_all(dir).map_err(|e| bad(url, format!("create {}: {e}", dir.display())))?;
    Ok(Arc::new(
        LocalFileSystem::new_with_prefix(dir).map_err(|e| bad(url, e))?,
    ))
}

/// A checkpoint loaded into a store.
pub struct Loaded {
    pub reference: CheckpointRef,
    pub store: MemStore,
}

/// The newest manifest of `tenant`, or `None` if it has none.
async fn latest_manifest(store: &Store, tenant: &str) -> Result<Option<Manifest>, CheckpointError> {
    let dir = Path::from(api::manifest::manifests_dir(tenant)?);
    let metas: Vec<_> = store.list(Some(&dir)).try_collect().await?;
    let paths: Vec<String> = metas.iter().map(|m| m.location.to_string()).collect();
    let Some((_, path)) = api::manifest::newest_manifest(paths.iter().map(String::as_str)) else {
        return Ok(None);
    };
    let bytes = store.get(&Path::from(path)).await?.bytes().await?;
    Ok(Some(Manifest::from_json(tenant, &bytes)?))
}

/// Reads, verifies and decodes one checkpoint object.
async fn load_one(
    store: &Store,
    tenant: &str,
    r: &CheckpointRef,
) -> Result<MemStore, CheckpointError> {
    let bytes = store
        .get(&Path::from(r.path.as_str()))
        .await?
        .bytes()
        .await?;
    r.verify(&bytes)?;
    let path = r.path.clone();
    // Decoding a large store is CPU work: keep it off the async workers.
    let (meta, mem) = tokio::task::spawn_blocking(move || memstore::checkpoint::decode(&bytes))
        .await
        .map_err(|e| CheckpointError::Task(e.to_string()))?
        .map_err(|e| CheckpointError::Corrupt {
            path: path.clone(),
            reason: e.to_string(),
        })?;
    if meta.tenant != tenant || meta.index != r.index || meta.revision != r.revision {
        return Err(CheckpointError::Corrupt {
            path,
            reason: format!(
                "object holds tenant {:?} index {} revision {}; the manifest says tenant {tenant:?} index {} revision {}",
                meta.tenant, meta.index, meta.revision, r.index, r.revision
            ),
        });
    }
    Ok(mem)
}

/// The newest usable checkpoint of `tenant`, or `None` if the tenant has no manifest yet.
pub async fn latest(store: &Store, tenant: &str) -> Result<Option<Loaded>, CheckpointError> {
    let Some(manifest) = latest_manifest(store, tenant).await? else {
        return Ok(None);
    };
    let mut first_error = None;
    for r in &manifest.checkpoints {
        match load_one(store, tenant, r).await {
            Ok(mem) => {
                return Ok(Some(Loaded {
                    reference: r.clone(),
                    store: mem,
                }));
            }
            Err(e) => {
                tracing::warn!(tenant, path = %r.path, index = r.index, error = %e, "checkpoint unusable; trying the previous one");
                first_error.get_or_insert(e.to_string());
            }
        }
    }
    Err(CheckpointError::NoneUsable(first_error.unwrap_or_default()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::manifest::MANIFEST_FORMAT_VERSION;
    use object_store::PutPayload;

    /// A store that applied `index` ticks.
    fn store_at(index: u64) -> MemStore {
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
            };
            mem.apply(i, &tick);
        }
        mem
    }

    async fn publish(store: &Store, index: u64, corrupt: bool) -> CheckpointRef {
        let mem = &store_at(index);
        let meta = memstore::checkpoint::CheckpointMeta {
            tenant: "default".into(),
            shard: 0,
            index,
            revision: mem.revision(),
            created_ms: 0,
        };
        let mut bytes = memstore::checkpoint::encode(&meta, mem);
        let r = CheckpointRef {
            path: api::manifest::checkpoint_path("default", index, 0).unwrap(),
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

    async fn manifest(store: &Store, seq: u64, checkpoints: Vec<CheckpointRef>) {
        let m = Manifest {
            format_version: MANIFEST_FORMAT_VERSION,
            tenant: "default".into(),
            shard: 0,
            seq,
            published_ms: 0,
            checkpoints,
        };
        store
            .put(
                &Path::from(api::manifest::manifest_path("default", seq).unwrap()),
                PutPayload::from(m.to_json()),
            )
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn no_manifest_means_no_checkpoint() {
        let store: Store = Arc::new(InMemory::new());
        assert!(latest(&store, "default").await.unwrap().is_none());
    }

    #[tokio::test]
    async fn newest_usable_checkpoint_is_loaded_and_corrupt_ones_skipped() {
        let store: Store = Arc::new(InMemory::new());
        let old = publish(&store, 5, false).await;
        let bad = publish(&store, 9, true).await;
        manifest(&store, 1, vec![old.clone()]).await;
        manifest(&store, 2, vec![bad, old.clone()]).await;
        let loaded = latest(&store, "default").await.unwrap().unwrap();
        assert_eq!(loaded.reference, old);
        assert_eq!(loaded.store.applied_index(), 5);
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
