//! The compactor's view of object storage: writing checkpoint objects (multipart when large),
//! publishing manifests with Create-only writes, finding the newest manifest, and deleting what no
//! manifest needs any more. The layout and the rules are `api::manifest`'s.

use std::collections::HashSet;

use api::manifest::{
    self, CheckpointRef, MANIFEST_FORMAT_VERSION, Manifest, ManifestError, TENANTS_DIR, TicksOnly,
};
use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, WriteMultipart};
use tracing::{debug, info, warn};

use crate::error::{Error, Result};
use crate::store::Store;

/// Objects larger than this go up as multipart uploads.
pub const MULTIPART_THRESHOLD: usize = 16 * 1024 * 1024;
/// Size of each multipart part (S3 refuses parts under 5 MiB except the last).
pub const MULTIPART_PART_SIZE: usize = 8 * 1024 * 1024;
/// Parts of one upload in flight at once.
const MULTIPART_CONCURRENCY: usize = 4;
/// Manifests kept besides the newest, so that a reader that listed a moment ago still finds the
/// one it chose; older ones are deleted after each publication.
pub const MANIFESTS_KEPT: u64 = 2;
/// Attempts at publishing under the next free sequence number before giving up this round.
const MAX_PUBLISH_ATTEMPTS: u32 = 8;
/// Re-listings when a manifest disappears between listing and reading it.
const MAX_RELISTS: u32 = 4;
/// Attempts at finding an unused checkpoint name (same index, same millisecond).
const MAX_NAME_ATTEMPTS: i64 = 16;

/// What a garbage collection pass deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Gc {
    pub manifests: usize,
    pub checkpoints: usize,
}

/// Manifests and checkpoints of every tenant in one object store.
#[derive(Clone)]
pub struct Catalog {
    store: Store,
}

fn is_not_found(e: &object_store::Error) -> bool {
    matches!(e, object_store::Error::NotFound { .. })
}

impl Catalog {
    pub fn new(store: Store) -> Self {
        Self { store }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Every tenant that has a folder in the store.
    pub async fn tenants(&self) -> Result<Vec<String>> {
        let listed = self
            .store
            .list_with_delimiter(Some(&Path::from(TENANTS_DIR)))
            .await?;
        let mut out: Vec<String> = listed
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename().map(str::to_string))
            .filter(|t| manifest::validate_tenant(t).is_ok())
            .collect();
        out.sort();
        Ok(out)
    }

    /// Sequence numbers of the tenant's manifests, ascending.
    pub async fn manifest_seqs(&self, tenant: &str) -> Result<Vec<u64>> {
        let dir = manifest::manifests_dir(tenant)?;
        self.numbers_in(&dir, manifest::parse_manifest_seq).await
    }

    /// The numbers `parse` reads from the names of the objects under `dir`, ascending.
    async fn numbers_in(&self, dir: &str, parse: fn(&str) -> Option<u64>) -> Result<Vec<u64>> {
        let metas: Vec<_> = self
            .store
            .list(Some(&Path::from(dir)))
            .try_collect()
            .await?;
        let mut out: Vec<u64> = metas
            .iter()
            .filter_map(|m| parse(m.location.as_ref()))
            .collect();
        out.sort_unstable();
        Ok(out)
    }

    /// Reads manifest `seq`; `Ok(None)` if it is gone.
    pub async fn read_manifest(&self, tenant: &str, seq: u64) -> Result<Option<Manifest>> {
        let path = Path::from(manifest::manifest_path(tenant, seq)?);
        let bytes = match self.store.get(&path).await {
            Ok(r) => r.bytes().await?,
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        Ok(Some(Manifest::from_json(tenant, &bytes)?))
    }

    /// The tenant's manifest that readers load (`api::manifest::chosen` of those that parse; an
    /// unparsable one is reported and skipped), or `None` if it has none. Manifests that exist
    /// but of which none parses (written by a newer build, damaged) are an error, never "no
    /// manifest": a tenant started empty from a trimmed journal would be published without its
    /// history.
    pub async fn latest_manifest(&self, tenant: &str) -> Result<Option<Manifest>> {
        for _ in 0..MAX_RELISTS {
            let seqs = self.manifest_seqs(tenant).await?;
            let mut vanished = false;
            let mut unusable = None;
            let mut parsed = Vec::with_capacity(seqs.len());
            for &seq in seqs.iter().rev() {
                match self.read_manifest(tenant, seq).await {
                    Ok(Some(m)) => parsed.push(m),
                    Ok(None) => {
                        vanished = true;
                        break;
                    }
                    Err(Error::Manifest(e)) => {
                        warn!(tenant, seq, error = %e, "skipping unusable manifest");
                        unusable.get_or_insert((seq, e));
                    }
                    Err(e) => return Err(e),
                }
            }
            if !vanished {
                if let Some(m) = manifest::chosen(&parsed) {
                    return Ok(Some(m.clone()));
                }
                return match unusable {
                    None => Ok(None),
                    Some((seq, e)) => Err(Error::NoUsableManifest {
                        tenant: tenant.to_string(),
                        seq,
                        reason: e.to_string(),
                    }),
                };
            }
            debug!(tenant, "a manifest vanished while reading: listing again");
        }
        Err(Error::ManifestRace {
            tenant: tenant.to_string(),
            attempts: MAX_RELISTS,
        })
    }

    /// The shard the tenant's newest manifest that names one names, read leniently (see
    /// `api::manifest::shard_named`); `None` if none does.
    pub async fn newest_manifest_shard(&self, tenant: &str) -> Result<Option<u32>> {
        for seq in self.manifest_seqs(tenant).await?.into_iter().rev() {
            let path = Path::from(manifest::manifest_path(tenant, seq)?);
            match self.store.get(&path).await {
                Ok(r) => {
                    if let Some(shard) = manifest::shard_named(&r.bytes().await?) {
                        return Ok(Some(shard));
                    }
                }
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(None)
    }

    /// Writes a checkpoint object under a name never used before and returns the reference a
    /// manifest will carry. Returns only once the object is complete and readable.
    pub async fn write_checkpoint(
        &self,
        tenant: &str,
        index: u64,
        revision: i64,
        time_ms: i64,
        created_ms: i64,
        bytes: Bytes,
    ) -> Result<CheckpointRef> {
        let size = bytes.len() as u64;
        let crc32c = crc32c::crc32c(&bytes);
        for bump in 0..MAX_NAME_ATTEMPTS {
            let created = created_ms + bump;
            let path = manifest::checkpoint_path(tenant, index, created)?;
            let location = Path::from(path.as_str());
            let written = if bytes.len() > MULTIPART_THRESHOLD {
                self.put_multipart(&location, bytes.clone()).await
            } else {
                self.store
                    .put_opts(
                        &location,
                        bytes.clone().into(),
                        PutOptions::from(PutMode::Create),
                    )
                    .await
                    .map(|_| true)
                    .or_else(|e| match e {
                        object_store::Error::AlreadyExists { .. } => Ok(false),
                        e => Err(e),
                    })
            }?;
            if written {
                return Ok(CheckpointRef {
                    path,
                    index,
                    revision,
                    size,
                    crc32c,
                    time_ms,
                    created_ms: created,
                });
            }
        }
        Err(Error::Corrupt {
            path: manifest::checkpoint_path(tenant, index, created_ms)?,
            reason: "no unused object name found".into(),
        })
    }

    /// Multipart upload of a large object. Multipart uploads cannot be conditional, so a name in
    /// use is detected first; `Ok(false)` means "pick another name".
    async fn put_multipart(&self, location: &Path, bytes: Bytes) -> object_store::Result<bool> {
        match self.store.head(location).await {
            Ok(_) => return Ok(false),
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(e),
        }
        let upload = self.store.put_multipart(location).await?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, MULTIPART_PART_SIZE);
        let expected = bytes.len() as u64;
        let mut rest = bytes;
        while !rest.is_empty() {
            if let Err(e) = writer.wait_for_capacity(MULTIPART_CONCURRENCY).await {
                let _ = writer.abort().await;
                return Err(e);
            }
            let n = rest.len().min(MULTIPART_PART_SIZE);
            writer.put(rest.split_to(n));
        }
        writer.finish().await?;
        // A completed upload is the whole object; check anyway before a manifest may name it.
        let meta = self.store.head(location).await?;
        if meta.size != expected {
            return Err(object_store::Error::Generic {
                store: "multipart",
                source: format!(
                    "{location}: {} bytes after upload, expected {expected}",
                    meta.size
                )
                .into(),
            });
        }
        Ok(true)
    }

    /// Reads and verifies (size, CRC32C) the object a manifest names.
    pub async fn read_checkpoint(&self, r: &CheckpointRef) -> Result<Bytes> {
        let bytes = self
            .store
            .get(&Path::from(r.path.as_str()))
            .await?
            .bytes()
            .await?;
        r.verify(&bytes)?;
        Ok(bytes)
    }

    /// Publishes a manifest naming `checkpoints` (newest first; sorted here anyway) under the
    /// next free sequence number. Every checkpoint must be fully written already.
    pub async fn publish(
        &self,
        tenant: &str,
        shard: u32,
        mut checkpoints: Vec<CheckpointRef>,
        published_ms: i64,
    ) -> Result<Manifest> {
        checkpoints.sort_by(|a, b| b.index.cmp(&a.index).then(b.created_ms.cmp(&a.created_ms)));
        let newest = checkpoints.first().cloned().ok_or(ManifestError::Empty)?;
        for _ in 0..MAX_PUBLISH_ATTEMPTS {
            let seqs = self.manifest_seqs(tenant).await?;
            let seq = seqs.last().map_or(1, |s| s + 1);
            let m = Manifest {
                format_version: MANIFEST_FORMAT_VERSION,
                tenant: tenant.to_string(),
                shard,
                seq,
                published_ms,
                checkpoints: checkpoints.clone(),
            };
            let path = Path::from(manifest::manifest_path(tenant, seq)?);
            match self
                .store
                .put_opts(&path, m.to_json().into(), PutOptions::from(PutMode::Create))
                .await
            {
                Ok(_) => {
                    info!(
                        tenant,
                        shard,
                        seq,
                        index = newest.index,
                        revision = newest.revision,
                        "published manifest"
                    );
                    return Ok(m);
                }
                Err(object_store::Error::AlreadyExists { .. }) => {
                    debug!(tenant, seq, "manifest number taken: trying the next");
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(Error::ManifestRace {
            tenant: tenant.to_string(),
            attempts: MAX_PUBLISH_ATTEMPTS,
        })
    }

    /// The `below` of every `TicksOnly` record of `shard`, ascending.
    pub async fn ticks_only(&self, shard: u32) -> Result<Vec<u64>> {
        let dir = manifest::ticks_only_dir(shard);
        self.numbers_in(&dir, manifest::parse_ticks_only_below)
            .await
    }

    /// Records that `shard` held only ticks and leader changes below `below` (written before
    /// the trim it allows), then deletes all but the `MANIFESTS_KEPT` newest such records.
    pub async fn publish_ticks_only(&self, shard: u32, below: u64, written_ms: i64) -> Result<()> {
        let record = TicksOnly {
            format_version: MANIFEST_FORMAT_VERSION,
            shard,
            below,
            written_ms,
        };
        let path = Path::from(manifest::ticks_only_path(shard, below));
        match self
            .store
            .put_opts(
                &path,
                record.to_json().into(),
                PutOptions::from(PutMode::Create),
            )
            .await
        {
            // The same word written twice (a retry, another compactor) says the same.
            Ok(_) | Err(object_store::Error::AlreadyExists { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        let all = self.ticks_only(shard).await?;
        let old = all.len().saturating_sub(MANIFESTS_KEPT as usize);
        for &below in &all[..old] {
            let path = Path::from(manifest::ticks_only_path(shard, below));
            match self.store.delete(&path).await {
                Ok(()) => {}
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Deletes manifests older than the `MANIFESTS_KEPT` newest but the one readers load
    /// (`api::manifest::chosen`: a late manifest of a stale compactor must not push it out),
    /// then checkpoint objects that no remaining manifest names and that are older than
    /// `newest`'s oldest checkpoint (newer unnamed objects may be a write in progress).
    /// Manifests go first, oldest first, so that at every instant each existing manifest names
    /// only existing objects.
    pub async fn collect_garbage(&self, tenant: &str, newest: &Manifest) -> Result<Gc> {
        let mut gc = Gc::default();
        let seqs = self.manifest_seqs(tenant).await?;
        let floor = newest.seq.saturating_sub(MANIFESTS_KEPT);
        // Every listed manifest, read once: which one readers load, and what the kept ones name.
        let mut parsed = Vec::with_capacity(seqs.len() + 1);
        for &seq in &seqs {
            match self.read_manifest(tenant, seq).await {
                Ok(Some(m)) => parsed.push(m),
                Ok(None) => {}
                // An unparsable manifest is useless to every reader: it protects nothing.
                Err(Error::Manifest(ManifestError::Malformed(_))) => {}
                // Nor does one about to go for its age.
                Err(Error::Manifest(_)) if seq <= floor => {}
                Err(e) => return Err(e),
            }
        }
        if !parsed.iter().any(|m| m.seq == newest.seq) {
            parsed.push(newest.clone());
        }
        let kept = manifest::chosen(&parsed)
            .map(|m| m.seq)
            .filter(|&s| s <= floor);
        for &seq in seqs.iter().filter(|&&s| s <= floor && Some(s) != kept) {
            let path = Path::from(manifest::manifest_path(tenant, seq)?);
            match self.store.delete(&path).await {
                Ok(()) => gc.manifests += 1,
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let mut named: HashSet<String> = parsed
            .iter()
            .filter(|m| m.seq > floor || Some(m.seq) == kept)
            .flat_map(|m| m.checkpoints.iter().map(|c| c.path.clone()))
            .collect();
        named.extend(newest.checkpoints.iter().map(|c| c.path.clone()));
        let Some(oldest) = newest.checkpoints.last().map(|c| c.index) else {
            return Ok(gc);
        };
        let dir = Path::from(manifest::checkpoints_dir(tenant)?);
        let objects: Vec<_> = self.store.list(Some(&dir)).try_collect().await?;
        for o in objects {
            let path = o.location.as_ref();
            let Some(index) = manifest::parse_checkpoint_index(path) else {
                continue;
            };
            if index < oldest && !named.contains(path) {
                match self.store.delete(&o.location).await {
                    Ok(()) => gc.checkpoints += 1,
                    Err(e) if is_not_found(&e) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        if gc != Gc::default() {
            debug!(
                tenant,
                manifests = gc.manifests,
                checkpoints = gc.checkpoints,
                "garbage collected"
            );
        }
        Ok(gc)
    }

    /// Deletes every object of `tenant` (a purged one): its manifests first, so that no
    /// reader picks a checkpoint about to go, then everything else under its folder. Answers
    /// how many objects went; a deletion cut short is finished by the next call.
    pub async fn delete_tenant(&self, tenant: &str) -> Result<usize> {
        let mut deleted = 0;
        for dir in [
            manifest::manifests_dir(tenant)?,
            manifest::tenant_dir(tenant)?,
        ] {
            let objects: Vec<_> = self
                .store
                .list(Some(&Path::from(dir)))
                .try_collect()
                .await?;
            for o in objects {
                match self.store.delete(&o.location).await {
                    Ok(()) => deleted += 1,
                    Err(e) if is_not_found(&e) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(deleted)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use object_store::memory::InMemory;

    use super::*;

    async fn checkpoint(c: &Catalog, index: u64) -> CheckpointRef {
        c.write_checkpoint(
            "t",
            index,
            1,
            0,
            index as i64,
            Bytes::from(vec![index as u8; 8]),
        )
        .await
        .unwrap()
    }

    /// A stale compactor's late manifests (higher numbers, older states) neither become what
    /// readers load nor, through garbage collection, push out the manifest that is.
    #[tokio::test]
    async fn late_manifests_of_a_stale_compactor_do_not_displace_the_newest_state() {
        let c = Catalog::new(Arc::new(InMemory::new()));
        let a = checkpoint(&c, 10).await;
        let b = checkpoint(&c, 30).await;
        c.publish("t", 0, vec![a.clone()], 0).await.unwrap();
        c.publish("t", 0, vec![b.clone(), a.clone()], 0)
            .await
            .unwrap();
        // The stale one publishes three times what it had (index 20 at most).
        let stale = checkpoint(&c, 20).await;
        for _ in 0..3 {
            let m = c
                .publish("t", 0, vec![stale.clone(), a.clone()], 0)
                .await
                .unwrap();
            c.collect_garbage("t", &m).await.unwrap();
        }
        let chosen = c.latest_manifest("t").await.unwrap().unwrap();
        assert_eq!(chosen.seq, 2);
        assert_eq!(chosen.newest().unwrap().index, 30);
        // Everything it names is still there; the stale ones beyond the kept number are gone.
        c.read_checkpoint(&b).await.unwrap();
        c.read_checkpoint(&a).await.unwrap();
        assert_eq!(c.manifest_seqs("t").await.unwrap(), vec![2, 4, 5]);
        // Once the current compactor publishes past it, the old chosen one goes in turn.
        let d = checkpoint(&c, 40).await;
        let m = c.publish("t", 0, vec![d, b.clone()], 0).await.unwrap();
        c.collect_garbage("t", &m).await.unwrap();
        assert_eq!(c.latest_manifest("t").await.unwrap().unwrap().seq, 6);
        assert_eq!(c.manifest_seqs("t").await.unwrap(), vec![5, 6]);
    }
}
