//! Loading a tenant's newest usable checkpoint: newest manifest, then its checkpoints newest
//! first, each verified (size, CRC32C, `memstore::checkpoint::decode`, tenant and index) before
//! use; a bad one is reported and the next older one is tried.

use api::manifest::{self, CheckpointRef, Manifest};
use memstore::MemStore;
use memstore::checkpoint::{self, CheckpointMeta};
use tracing::warn;

use crate::catalog::Catalog;
use crate::error::{Error, Result};
use crate::store::Store;

/// A checkpoint loaded into a store.
pub struct Loaded {
    /// The manifest it was found through.
    pub manifest: Manifest,
    /// The manifest entry that was loaded.
    pub reference: CheckpointRef,
    pub meta: CheckpointMeta,
    pub store: MemStore,
    /// Newer checkpoints of the manifest that were unusable, with the reason.
    pub skipped: Vec<(CheckpointRef, Error)>,
}

/// Reads, verifies and decodes one checkpoint object a manifest names.
pub async fn load(
    catalog: &Catalog,
    tenant: &str,
    r: &CheckpointRef,
) -> Result<(CheckpointMeta, MemStore)> {
    let bytes = catalog.read_checkpoint(r).await?;
    let path = r.path.clone();
    // Decoding a large store is CPU work: keep it off the async worker threads.
    let (meta, store) = tokio::task::spawn_blocking(move || checkpoint::decode(&bytes))
        .await
        .map_err(|e| Error::Task(e.to_string()))?
        .map_err(|e| Error::Corrupt {
            path: path.clone(),
            reason: e.to_string(),
        })?;
    if meta.tenant != tenant || meta.index != r.index || meta.revision != r.revision {
        return Err(Error::Corrupt {
            path,
            reason: format!(
                "object holds tenant {:?} index {} revision {}, manifest says tenant {tenant:?} index {} revision {}",
                meta.tenant, meta.index, meta.revision, r.index, r.revision
            ),
        });
    }
    Ok((meta, store))
}

/// The newest usable checkpoint of `tenant` in `catalog`, or `None` if the tenant has no
/// manifest. Fails with the newest checkpoint's error when none of the manifest's is usable,
/// and when manifests exist but none can be read.
pub async fn latest_in(catalog: &Catalog, tenant: &str) -> Result<Option<Loaded>> {
    let Some(manifest) = catalog.latest_manifest(tenant).await? else {
        return Ok(None);
    };
    newest_usable(catalog, tenant, manifest).await.map(Some)
}

/// The newest usable checkpoint `manifest` names (each also checked to be of the manifest's
/// shard); fails with the newest checkpoint's error when none is usable.
pub async fn newest_usable(catalog: &Catalog, tenant: &str, manifest: Manifest) -> Result<Loaded> {
    let mut skipped = Vec::new();
    for r in &manifest.checkpoints {
        let loaded = load(catalog, tenant, r).await.and_then(|(meta, store)| {
            if meta.shard == manifest.shard {
                Ok((meta, store))
            } else {
                Err(Error::Corrupt {
                    path: r.path.clone(),
                    reason: format!(
                        "object holds shard {}, the manifest says shard {}",
                        meta.shard, manifest.shard
                    ),
                })
            }
        });
        match loaded {
            Ok((meta, store)) => {
                return Ok(Loaded {
                    reference: r.clone(),
                    manifest: manifest.clone(),
                    meta,
                    store,
                    skipped,
                });
            }
            Err(e) if e.is_retryable() && !is_missing(&e) => return Err(e),
            Err(e) => {
                warn!(tenant, path = %r.path, index = r.index, error = %e, "checkpoint unusable; trying the previous one");
                skipped.push((r.clone(), e));
            }
        }
    }
    if skipped.is_empty() {
        return Err(Error::Corrupt {
            path: manifest::manifests_dir(tenant)?,
            reason: "the newest manifest names no checkpoint".into(),
        });
    }
    let (_, first) = skipped.swap_remove(0);
    Err(first)
}

/// `latest_in` over a bare store.
pub async fn latest(store: Store, tenant: &str) -> Result<Option<Loaded>> {
    latest_in(&Catalog::new(store), tenant).await
}

fn is_missing(e: &Error) -> bool {
    matches!(e, Error::Store(object_store::Error::NotFound { .. }))
}
