//! Batched point lookups: many keys looked up together in stages (hash index, then slots,
//! then key and value bytes), so the DRAM misses of independent lookups overlap instead of
//! each lookup waiting out its own chain of three.
//!
//! A single lookup is a chain of dependent loads (index entry -> slot -> key and value bytes);
//! each waits for the one before. Here every stage first prefetches the lines of a whole group
//! of lookups, and the next stage finds them in cache: a group's misses are in flight at once
//! instead of one after another. (A rolling pipeline, each key a fixed distance behind the
//! one before, was measured slower on the batches a server gathers, tens of keys: filling
//! and draining it costs more than the stage boundaries it saves.)

use crate::prefetch::{prefetch, prefetch_all};

use super::{KeySpace, Slot, hash_key};

/// Lookups in one group: stage 2 alone then has 8 x 5 lines in flight, more than the core's
/// miss buffers hold; groups of 4 left them idle and groups of 16 and 32 were no faster
/// (alternating runs over 1M keys, docs/memstore.md).
const GROUP: usize = 8;
/// Cache lines of a value prefetched ahead of its copy (the rest follows the hardware's
/// stream prefetcher).
const VALUE_LINES: usize = 4;
const LINE: usize = 64;

impl KeySpace {
    /// The slot of each key (None for a key without versions), in the order of `keys`,
    /// appended to `out`: the same answers as `get_slot` key by key.
    pub fn get_slots<'a>(&'a self, keys: &[&[u8]], out: &mut Vec<Option<&'a Slot>>) {
        out.reserve(keys.len());
        for group in keys.chunks(GROUP) {
            self.get_group(group, out);
        }
    }

    fn get_group<'a>(&'a self, keys: &[&[u8]], out: &mut Vec<Option<&'a Slot>>) {
        // Stage 0: hash each key, prefetch its index entry.
        let mut hashes = [0u32; GROUP];
        for (h, k) in hashes.iter_mut().zip(keys) {
            *h = hash_key(k);
            self.index.prefetch(*h);
        }
        // Stage 1: the index entry whose 32-bit hash matches (the key is confirmed in stage
        // 3); prefetch its slot (every line of it: the newest value's address may be in the
        // second).
        let mut ids = [None; GROUP];
        for (id, &h) in ids.iter_mut().zip(&hashes[..keys.len()]) {
            *id = self.index.find(h, |id, hints| {
                prefetch_all(self.slab.place(id));
                hints.prefetch();
                true
            });
        }
        // Stage 2: prefetch each slot's key bytes and newest value.
        for &id in ids.iter().flatten() {
            let slot = self.slab.get(id);
            prefetch(&*slot.key);
            if let Some(v) = slot.versions.last() {
                for line in v.value.chunks(LINE).take(VALUE_LINES) {
                    prefetch(line);
                }
            }
        }
        // Stage 3: confirm each key; a 32-bit hash shared with another key falls back to the
        // full probe.
        for (&key, id) in keys.iter().zip(ids) {
            out.push(match id {
                Some(id) if &self.slab.get(id).key[..] == key => Some(self.slab.get(id)),
                Some(_) => self.get_slot(key),
                None => None,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::keyspace::Version;

    fn version(main: i64) -> Version {
        Version {
            main,
            sub: 0,
            create: main,
            version: 1,
            lease: 0,
            value: vec![b'v'; 300].into(),
        }
    }

    /// Two keys with the same 32-bit hash: whichever the index meets first, the batched
    /// lookup must still answer each with its own slot (the fallback), and a third key with
    /// that hash but never stored must be absent.
    #[test]
    fn keys_sharing_a_hash_are_told_apart() {
        let mut seen: HashMap<u32, u64> = HashMap::new();
        let mut found = Vec::new();
        for i in 0u64.. {
            let k = format!("key-{i}");
            match seen.insert(hash_key(k.as_bytes()), i) {
                Some(j) => found.push((format!("key-{j}"), k)),
                None => continue,
            }
            if found.len() == 2 {
                break;
            }
        }
        let (a, b) = &found[0];
        let (c, d) = &found[1];
        let mut ks = KeySpace::default();
        for (rev, k) in [(2, a), (3, b), (4, c)] {
            ks.upsert(k.as_bytes(), |_, _| version(rev));
        }
        let keys: Vec<&[u8]> = [a, b, c, d, a, "nope"]
            .iter()
            .map(|k| k.as_bytes())
            .collect();
        let mut got = Vec::new();
        ks.get_slots(&keys, &mut got);
        let single: Vec<Option<&Slot>> = keys.iter().map(|k| ks.get_slot(k)).collect();
        assert_eq!(got, single);
        assert_eq!(got[0].map(|s| &s.key[..]), Some(a.as_bytes()));
        assert_eq!(got[1].map(|s| &s.key[..]), Some(b.as_bytes()));
        assert_eq!(got[2].map(|s| s.versions[0].main), Some(4));
        assert!(
            got[3].is_none(),
            "{d} shares {c}'s hash but was never stored"
        );
        assert!(got[5].is_none());
    }
}
