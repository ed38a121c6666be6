//! The multi-version key space: one ordered map from each key to its compact list of versions
//! (etcd's key_index generations flattened, tombstones included), with the byte counters the
//! stats and the quota read.

use std::collections::BTreeMap;
use std::ops::Bound;

use api::mvccpb::KeyValue;

/// One stored version of a key: a put, or a tombstone (`version == 0`).
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) struct Version {
    /// Main revision of the change (the key's mod_revision).
    pub main: i64,
    /// Sub-revision: position of the change inside its revision.
    pub sub: u32,
    /// create_revision of the generation this version belongs to (0 for a tombstone).
    pub create: i64,
    /// Version inside the generation, from 1; 0 marks a tombstone.
    pub version: i64,
    pub lease: i64,
    pub value: Box<[u8]>,
}

impl Version {
    pub fn is_tombstone(&self) -> bool {
        self.version == 0
    }

    pub fn to_kv(&self, key: &[u8], keys_only: bool) -> KeyValue {
        KeyValue {
            key: key.to_vec(),
            create_revision: self.create,
            mod_revision: self.main,
            version: self.version,
            value: if keys_only {
                Vec::new()
            } else {
                self.value.to_vec()
            },
            lease: self.lease,
        }
    }
}

/// The newest version visible at `rev` (any sub-revision of `rev` counts), tombstones included.
pub(crate) fn version_at(versions: &[Version], rev: i64) -> Option<&Version> {
    let n = versions.partition_point(|v| v.main <= rev);
    if n == 0 { None } else { Some(&versions[n - 1]) }
}

/// The live (non-tombstone) version visible at `rev`.
pub(crate) fn live_at(versions: &[Version], rev: i64) -> Option<&Version> {
    version_at(versions, rev).filter(|v| !v.is_tombstone())
}

/// Map bounds of a key range.
pub(crate) type KeyBounds<'a> = (Bound<&'a [u8]>, Bound<&'a [u8]>);

/// etcd's range forms: empty `range_end` is the single key, `"\0"` is every key >= `key`,
/// anything else is `[key, range_end)` (empty when `range_end <= key`).
pub(crate) fn bounds<'a>(key: &'a [u8], range_end: &'a [u8]) -> Option<KeyBounds<'a>> {
    if range_end.is_empty() {
        Some((Bound::Included(key), Bound::Included(key)))
    } else if range_end == [0] {
        Some((Bound::Included(key), Bound::Unbounded))
    } else if range_end <= key {
        None
    } else {
        Some((Bound::Included(key), Bound::Excluded(range_end)))
    }
}

/// Every key with its versions, plus running byte counters.
#[derive(
    Debug, Clone, Default, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
pub(crate) struct KeySpace {
    pub map: BTreeMap<Box<[u8]>, Vec<Version>>,
    /// Keys whose newest version is a put.
    pub live_keys: u64,
    /// Key + value bytes of the newest version of live keys.
    pub live_bytes: u64,
    /// Key + value bytes of every stored version (history included).
    pub total_bytes: u64,
    /// Number of stored versions (tombstones included).
    pub versions: u64,
}

impl KeySpace {
    /// Iterates `(key, versions)` over etcd's range.
    pub fn iter_range<'a>(
        &'a self,
        key: &'a [u8],
        range_end: &'a [u8],
    ) -> impl Iterator<Item = (&'a [u8], &'a [Version])> + 'a {
        let inner = bounds(key, range_end).map(|b| self.map.range::<[u8], _>(b));
        inner.into_iter().flatten().map(|(k, v)| (&k[..], &v[..]))
    }

    /// Live keys visible at `rev` in the range, in key order.
    pub fn live_in_range<'a>(
        &'a self,
        key: &'a [u8],
        range_end: &'a [u8],
        rev: i64,
    ) -> impl Iterator<Item = (&'a [u8], &'a Version)> + 'a {
        self.iter_range(key, range_end)
            .filter_map(move |(k, vs)| live_at(vs, rev).map(|v| (k, v)))
    }

    pub fn latest_live(&self, key: &[u8]) -> Option<&Version> {
        self.map
            .get(key)
            .and_then(|vs| vs.last())
            .filter(|v| !v.is_tombstone())
    }

    /// Appends a version to `key` (newest last) and keeps the counters.
    pub fn push(&mut self, key: &[u8], v: Version) {
        let kl = key.len() as u64;
        let added = kl + v.value.len() as u64;
        let tomb = v.is_tombstone();
        match self.map.get_mut(key) {
            Some(vs) => {
                if let Some(last) = vs.last().filter(|l| !l.is_tombstone()) {
                    self.live_keys -= 1;
                    self.live_bytes -= kl + last.value.len() as u64;
                }
                vs.push(v);
            }
            None => {
                // vec![v] allocates exactly one slot: most keys keep a single version.
                self.map.insert(key.into(), vec![v]);
            }
        }
        if !tomb {
            self.live_keys += 1;
            self.live_bytes += added;
        }
        self.total_bytes += added;
        self.versions += 1;
    }

    /// Drops history at or below `rev` as etcd's keyIndex.compact does: of the versions <= rev
    /// only the newest survives, and only if it is a put; keys left empty disappear.
    pub fn compact(&mut self, rev: i64) {
        let mut freed_bytes = 0u64;
        let mut freed_versions = 0u64;
        self.map.retain(|key, vs| {
            let n = vs.partition_point(|v| v.main <= rev);
            if n == 0 {
                return true;
            }
            let keep_from = if vs[n - 1].is_tombstone() { n } else { n - 1 };
            if keep_from > 0 {
                for v in &vs[..keep_from] {
                    freed_bytes += (key.len() + v.value.len()) as u64;
                }
                freed_versions += keep_from as u64;
                vs.drain(..keep_from);
                vs.shrink_to_fit();
            }
            !vs.is_empty()
        });
        self.total_bytes -= freed_bytes;
        self.versions -= freed_versions;
    }
}
