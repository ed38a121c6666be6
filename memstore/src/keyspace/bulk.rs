//! Bulk loading of a key space from keys already in ascending order (a checkpoint's): the slab,
//! hash index, change log and ordered index are sized once from the counts the caller knows,
//! slot ids are handed out in key order (so the ordered index is `0..n` and no key is ever
//! searched for), and a key with one version goes straight into its slot (no `Vec` made and
//! dropped per key). The result is the key space `KeySpace::from_sorted` would build from the
//! same keys, slot for slot.

use std::collections::VecDeque;

use super::{
    Change, KeySpace, SLAB_CHUNK, Slab, Slot, Version, Versions, hash_key, holds_compactable,
    index::{HashIndex, Hints},
    order::OrderIndex,
};

/// Builds a [`KeySpace`] from keys pushed in strictly ascending order, each with its versions
/// oldest first; every version above the compact revision joins the change log. Each defect
/// (a key out of order or twice, a key without versions, versions out of revision order, two
/// changes at one revision) is an error naming it, as `KeySpace::from_sorted` names it; after
/// an error the builder is dropped, not used further.
pub(crate) struct KeySpaceBuilder {
    ks: KeySpace,
    /// Each pushed key's (hash, slot id, index hints), in push order (= slot id).
    hashes: Vec<(u32, u32, Hints)>,
    log: Vec<Change>,
    compact_rev: i64,
}

impl KeySpaceBuilder {
    /// A builder with room for `keys` keys holding `versions` versions in all (hints: more is
    /// accepted, at the cost of growing), whose change log starts above `compact_rev`.
    pub fn new(keys: usize, versions: usize, compact_rev: i64) -> KeySpaceBuilder {
        KeySpaceBuilder {
            ks: KeySpace {
                slab: Slab {
                    chunks: Vec::with_capacity(keys.div_ceil(SLAB_CHUNK)),
                    free: Vec::new(),
                },
                ..KeySpace::default()
            },
            hashes: Vec::with_capacity(keys),
            log: Vec::with_capacity(versions),
            compact_rev,
        }
    }

    /// Adds the next key with its single version.
    pub fn push_one(&mut self, key: Box<[u8]>, version: Version) -> Result<(), String> {
        self.push(key, Versions::One(version))
    }

    /// Adds the next key with its versions, oldest first.
    pub fn push_many(&mut self, key: Box<[u8]>, versions: Vec<Version>) -> Result<(), String> {
        if versions.is_empty() {
            return Err("a key without versions".into());
        }
        self.push(key, Versions::from_vec(versions))
    }

    fn push(&mut self, key: Box<[u8]>, versions: Versions) -> Result<(), String> {
        let id = u32::try_from(self.hashes.len())
            .ok()
            .filter(|&id| id < u32::MAX)
            .ok_or_else(|| "more keys than a key space holds".to_string())?;
        if let Some(prev) = id.checked_sub(1)
            && self.ks.slab.get(prev).key >= key
        {
            return Err("keys out of order or duplicated".into());
        }
        let ks = &mut self.ks;
        let kl = key.len() as u64;
        let mut last: Option<(i64, u32)> = None;
        for v in versions.iter() {
            if last.is_some_and(|l| l >= (v.main, v.sub)) {
                return Err("versions out of revision order".into());
            }
            last = Some((v.main, v.sub));
            ks.total_bytes += kl + v.value.len() as u64;
            if v.main >= self.compact_rev {
                self.log.push(Change {
                    main: v.main,
                    sub: v.sub,
                    slot: id,
                });
            }
        }
        if let Some(l) = versions.last().filter(|v| !v.is_tombstone()) {
            ks.live_keys += 1;
            ks.live_bytes += kl + l.value.len() as u64;
        }
        if holds_compactable(&versions, self.compact_rev) {
            ks.unlogged.push(id);
        }
        ks.versions += versions.len() as u64;
        let hash = hash_key(&key);
        let chunks = &mut ks.slab.chunks;
        if chunks.last().is_none_or(|c| c.len() == SLAB_CHUNK) {
            chunks.push(Vec::with_capacity(SLAB_CHUNK));
        }
        if let Some(chunk) = chunks.last_mut() {
            chunk.push(Some(Slot { key, versions }));
        }
        self.hashes.push((hash, id, ks.slab.hints(id)));
        Ok(())
    }

    /// The key space: hash index filled in home-bucket order, change log in revision order,
    /// ordered index over the slots as pushed.
    pub fn finish(self) -> Result<KeySpace, String> {
        let KeySpaceBuilder {
            mut ks,
            hashes,
            mut log,
            ..
        } = self;
        let n = hashes.len();
        ks.index = HashIndex::from_pairs(hashes);
        log.sort_unstable_by_key(|c| (c.main, c.sub));
        if log
            .windows(2)
            .any(|w| (w[0].main, w[0].sub) == (w[1].main, w[1].sub))
        {
            return Err("two changes at one revision and sub-revision".into());
        }
        ks.log = VecDeque::from(log);
        let ids: Vec<u32> = (0..n as u32).collect();
        let slab = &ks.slab;
        ks.order = OrderIndex::from_sorted(&ids, &|id| &slab.get(id).key[..], &|id| {
            slab.get(id).versions.is_live()
        });
        Ok(ks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(main: i64, sub: u32, version: i64, value: &str) -> Version {
        Version {
            main,
            sub,
            create: if version == 0 { 0 } else { main },
            version,
            lease: 0,
            value: value.as_bytes().into(),
        }
    }

    /// Keys with one version, with history, ending in a tombstone; some at or below the compact
    /// revision: the builder's key space equals `from_sorted`'s, slot ids and log included.
    #[test]
    fn builder_equals_from_sorted() {
        let mut keys: Vec<(Box<[u8]>, Vec<Version>)> = Vec::new();
        let mut rev = 1;
        for i in 0..10_000u32 {
            let key: Box<[u8]> = format!("/k/{i:06}").into_bytes().into();
            let n = 1 + (i % 4) as i64;
            let vs = (0..n)
                .map(|j| {
                    rev += 1;
                    if i % 7 == 0 && j == n - 1 && n > 1 {
                        v(rev, 0, 0, "")
                    } else {
                        v(rev, (j % 2) as u32, j + 1, "value")
                    }
                })
                .collect();
            keys.push((key, vs));
        }
        let compact = rev / 3;
        let reference = KeySpace::from_sorted(keys.clone().into_iter(), compact).unwrap();
        let mut b = KeySpaceBuilder::new(keys.len(), 0, compact);
        for (k, vs) in keys {
            if vs.len() == 1 {
                b.push_one(k, vs.into_iter().next().unwrap()).unwrap();
            } else {
                b.push_many(k, vs).unwrap();
            }
        }
        let built = b.finish().unwrap();
        assert!(built == reference);
        assert_eq!(built.log, reference.log, "same slot ids in the change log");
        let (b_ids, r_ids): (Vec<u32>, Vec<u32>) = (
            built
                .order
                .chunks
                .iter()
                .flat_map(|c| c.ids.clone())
                .collect(),
            reference
                .order
                .chunks
                .iter()
                .flat_map(|c| c.ids.clone())
                .collect(),
        );
        assert_eq!(b_ids, r_ids);
        for probe in ["/k/000000", "/k/004567", "/k/009999", "/k/", "/k/010000"] {
            assert_eq!(built.get(probe.as_bytes()), reference.get(probe.as_bytes()));
        }
    }

    #[test]
    fn defects_are_refused_with_from_sorted_words() {
        let k = |s: &str| -> Box<[u8]> { s.as_bytes().into() };
        // A builder that already holds key "b" at revision 2.
        let started = || {
            let mut b = KeySpaceBuilder::new(2, 2, 0);
            b.push_one(k("b"), v(2, 0, 1, "x")).unwrap();
            b
        };
        let err = |r: Result<(), String>| r.unwrap_err();
        assert_eq!(
            err(started().push_one(k("a"), v(3, 0, 1, "x"))),
            "keys out of order or duplicated"
        );
        assert_eq!(
            err(started().push_one(k("b"), v(3, 0, 1, "x"))),
            "keys out of order or duplicated"
        );
        assert_eq!(
            err(started().push_many(k("c"), Vec::new())),
            "a key without versions"
        );
        assert_eq!(
            err(started().push_many(k("c"), vec![v(5, 0, 1, "x"), v(4, 0, 2, "y")])),
            "versions out of revision order"
        );
        let mut b = started();
        b.push_one(k("d"), v(2, 0, 1, "x")).unwrap();
        assert_eq!(
            b.finish().unwrap_err(),
            "two changes at one revision and sub-revision"
        );
    }
}
