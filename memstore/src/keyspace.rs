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

    /// Appends the version `make` builds from the key's current versions (None for a key never
    /// stored), with one B-tree descent, and keeps the counters.
    pub fn upsert(&mut self, key: &[u8], make: impl FnOnce(Option<&[Version]>) -> Version) {
        use std::collections::btree_map::Entry;
        let kl = key.len() as u64;
        // One descent (the entry API) costs far less than a second descent would; the key
        // allocation it needs up front is the one a new key keeps.
        match self.map.entry(key.into()) {
            Entry::Occupied(mut o) => {
                let vs = o.get_mut();
                let v = make(Some(vs));
                if let Some(last) = vs.last().filter(|l| !l.is_tombstone()) {
                    self.live_keys -= 1;
                    self.live_bytes -= kl + last.value.len() as u64;
                }
                Self::count(
                    &mut self.live_keys,
                    &mut self.live_bytes,
                    &mut self.total_bytes,
                    kl,
                    &v,
                );
                vs.push(v);
            }
            Entry::Vacant(e) => {
                let v = make(None);
                Self::count(
                    &mut self.live_keys,
                    &mut self.live_bytes,
                    &mut self.total_bytes,
                    kl,
                    &v,
                );
                // vec![v] allocates exactly one slot: most keys keep a single version.
                e.insert(vec![v]);
            }
        }
        self.versions += 1;
    }

    fn count(
        live_keys: &mut u64,
        live_bytes: &mut u64,
        total_bytes: &mut u64,
        kl: u64,
        v: &Version,
    ) {
        let added = kl + v.value.len() as u64;
        if !v.is_tombstone() {
            *live_keys += 1;
            *live_bytes += added;
        }
        *total_bytes += added;
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

impl KeySpace {
    /// Builds the key space from its archived form: one pass over the archived map (already in
    /// key order), then a bulk-built `BTreeMap`; the counters are recomputed and must agree.
    pub fn from_archived(a: &ArchivedKeySpace) -> Result<KeySpace, String> {
        let mut ks = KeySpace::default();
        let mut entries: Vec<(Box<[u8]>, Vec<Version>)> = Vec::with_capacity(a.map.len());
        for (k, vs) in a.map.iter() {
            let key: &[u8] = k;
            if vs.is_empty() {
                return Err("a key without versions".into());
            }
            let mut versions = Vec::with_capacity(vs.len());
            for v in vs.iter() {
                versions.push(Version {
                    main: v.main.to_native(),
                    sub: v.sub.to_native(),
                    create: v.create.to_native(),
                    version: v.version.to_native(),
                    lease: v.lease.to_native(),
                    value: Box::from(&v.value[..]),
                });
            }
            let kl = key.len() as u64;
            for v in &versions {
                ks.total_bytes += kl + v.value.len() as u64;
            }
            if let Some(last) = versions.last().filter(|v| !v.is_tombstone()) {
                ks.live_keys += 1;
                ks.live_bytes += kl + last.value.len() as u64;
            }
            ks.versions += versions.len() as u64;
            entries.push((Box::from(key), versions));
        }
        let n = entries.len();
        ks.map = entries.into_iter().collect();
        if ks.map.len() != n {
            return Err("duplicate keys".into());
        }
        let archived_counters = (
            a.live_keys.to_native(),
            a.live_bytes.to_native(),
            a.total_bytes.to_native(),
            a.versions.to_native(),
        );
        if archived_counters != (ks.live_keys, ks.live_bytes, ks.total_bytes, ks.versions) {
            return Err("key space counters disagree with its keys".into());
        }
        Ok(ks)
    }
}
