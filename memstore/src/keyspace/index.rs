//! The hash index of a key space: slot ids by the 32-bit hash of their key, in one
//! open-addressed array of 8-byte entries (hash and slot id side by side) probed linearly.
//!
//! Why not a general hash table: a point read on a large tenant is a chain of dependent cache
//! misses, and the index is its first link. A table with separate control bytes (hashbrown's
//! layout) costs two of them (the control group, then the entry); here the home entry is found
//! by arithmetic on the hash, so the index costs one miss, and its address is known before the
//! lookup starts, so a caller can prefetch it (`prefetch`). The stored 32-bit hash lets a probe
//! pass other keys' entries without reading their slots, and lets the table grow without
//! reading any slot.
//!
//! Layout: an entry is one `u64`, the hash in the high half and `slot id + 1` in the low half
//! (0 = empty, so a new table is one zeroed allocation: fresh pages, nothing written). A key's
//! home is the top bits of its hash, so entries lie in hash order (apart from probe runs) and a
//! bulk load sorted by hash writes the array front to back. At most 3/4 of the entries are used
//! (a lookup of a key never stored then ends within two cache lines on average); removal shifts
//! the run after the hole back, so there are no tombstones and lookups never slow down with
//! churn.

use crate::prefetch::prefetch;

/// Fewest entries of a table that holds anything.
const MIN_CAPACITY: usize = 8;
const EMPTY: u64 = 0;

/// Slot ids by key hash. It stores no keys: every answer is a candidate the caller confirms
/// against its slot (`find`'s `is_key`).
#[derive(Debug, Clone, Default)]
pub(crate) struct HashIndex {
    /// Empty, or a power of two of at least `MIN_CAPACITY` entries.
    entries: Vec<u64>,
    len: usize,
}

fn pack(hash: u32, id: u32) -> u64 {
    (u64::from(hash) << 32) | (u64::from(id) + 1)
}

fn hash_of(e: u64) -> u32 {
    (e >> 32) as u32
}

fn id_of(e: u64) -> u32 {
    (e as u32).wrapping_sub(1)
}

/// Most entries a table of `capacity` holds.
const fn max_len(capacity: usize) -> usize {
    capacity / 4 * 3
}

/// Entries of a table for `n` keys (at most 3/4 used).
fn capacity_for(n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    n.saturating_mul(4)
        .div_ceil(3)
        .next_power_of_two()
        .max(MIN_CAPACITY)
}

impl HashIndex {
    /// An index with room for `n` keys before it grows.
    pub fn with_capacity(n: usize) -> HashIndex {
        HashIndex {
            entries: vec![EMPTY; capacity_for(n)],
            len: 0,
        }
    }

    /// Builds the index of `(hash, id)` pairs (distinct ids; the caller vouches that no two
    /// belong to the same key), placed in the order of their homes so the array is written
    /// front to back.
    pub fn from_pairs(mut pairs: Vec<(u32, u32)>) -> HashIndex {
        let mut index = HashIndex::with_capacity(pairs.len());
        // Sorting by hash is sorting by home (the home is the hash's top bits).
        radix_sort_by_hash(&mut pairs);
        for (hash, id) in pairs {
            index.insert_unique(hash, id);
        }
        index
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The home entry of `hash`: its top bits.
    fn home(&self, hash: u32) -> usize {
        let bits = self.entries.len().trailing_zeros();
        // A capacity of 2^32 entries or more keeps every bit of the hash (one probe run
        // then spreads over the extra entries' neighbours: correct, just never that large).
        (u64::from(hash) >> 32u32.saturating_sub(bits)) as usize
    }

    /// Asks the core to start loading the home entry of `hash`, so a lookup issued a little
    /// later finds it in cache.
    pub fn prefetch(&self, hash: u32) {
        if !self.entries.is_empty() {
            prefetch(&self.entries[self.home(hash)]);
        }
    }

    /// The first slot id whose entry has `hash` and for which `is_key(id)` holds.
    pub fn find(&self, hash: u32, mut is_key: impl FnMut(u32) -> bool) -> Option<u32> {
        if self.entries.is_empty() {
            return None;
        }
        let mask = self.entries.len() - 1;
        let mut p = self.home(hash);
        loop {
            let e = self.entries[p];
            if e == EMPTY {
                return None;
            }
            if hash_of(e) == hash && is_key(id_of(e)) {
                return Some(id_of(e));
            }
            p = (p + 1) & mask;
        }
    }

    /// Adds slot `id` under `hash`; the caller knows its key is not indexed yet.
    pub fn insert_unique(&mut self, hash: u32, id: u32) {
        debug_assert!(id < u32::MAX, "slot ids stay below u32::MAX");
        if self.len + 1 > max_len(self.entries.len()) {
            self.resize(capacity_for(self.len + 1));
        }
        self.place(pack(hash, id));
        self.len += 1;
    }

    /// Puts an entry at the first empty place from its home (there always is one).
    fn place(&mut self, e: u64) {
        let mask = self.entries.len() - 1;
        let mut p = self.home(hash_of(e));
        while self.entries[p] != EMPTY {
            p = (p + 1) & mask;
        }
        self.entries[p] = e;
    }

    /// Removes the entry of slot `id` (indexed under `hash`); false if there is none. The
    /// entries after it in its probe run move back, so every remaining entry is still found
    /// from its home without passing an empty place.
    pub fn remove(&mut self, hash: u32, id: u32) -> bool {
        if self.entries.is_empty() {
            return false;
        }
        let mask = self.entries.len() - 1;
        let target = pack(hash, id);
        let mut hole = self.home(hash);
        loop {
            match self.entries[hole] {
                EMPTY => return false,
                e if e == target => break,
                _ => hole = (hole + 1) & mask,
            }
        }
        let mut p = hole;
        loop {
            p = (p + 1) & mask;
            let e = self.entries[p];
            if e == EMPTY {
                break;
            }
            // The entry at `p` may fill the hole when its home is not strictly between the
            // hole and `p` (cyclically): it is then still reached from its home.
            let home = self.home(hash_of(e));
            if (p.wrapping_sub(home) & mask) >= (p.wrapping_sub(hole) & mask) {
                self.entries[hole] = e;
                hole = p;
            }
        }
        self.entries[hole] = EMPTY;
        self.len -= 1;
        true
    }

    /// Moves to the smallest table that holds the entries (after a compaction removed keys).
    pub fn shrink_to_fit(&mut self) {
        let capacity = capacity_for(self.len);
        if capacity < self.entries.len() {
            self.resize(capacity);
        }
    }

    /// Moves every entry into a table of `capacity` entries, in the order of the old table,
    /// which is (nearly) the order of their homes in the new one: it is written front to back.
    fn resize(&mut self, capacity: usize) {
        let old = std::mem::replace(&mut self.entries, vec![EMPTY; capacity]);
        if capacity == 0 {
            return;
        }
        // A run that wrapped around the end starts the old table; its entries belong at the
        // end of the new one, so the old table is walked from its first empty place.
        let start = old.iter().position(|&e| e == EMPTY).unwrap_or(0);
        for &e in old[start..].iter().chain(&old[..start]) {
            if e != EMPTY {
                self.place(e);
            }
        }
    }

    /// Every (hash, id) pair, in table order.
    #[cfg(test)]
    fn pairs(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.entries
            .iter()
            .filter(|&&e| e != EMPTY)
            .map(|&e| (hash_of(e), id_of(e)))
    }
}

/// Sorts pairs by hash, two passes of 16 bits (a counting sort each): linear in the pairs, for
/// the millions of keys a checkpoint brings.
fn radix_sort_by_hash(pairs: &mut Vec<(u32, u32)>) {
    const BITS: u32 = 16;
    if pairs.len() < 64 {
        pairs.sort_unstable_by_key(|p| p.0);
        return;
    }
    let mut buf = vec![(0u32, 0u32); pairs.len()];
    for shift in [0, BITS] {
        let digit = |p: &(u32, u32)| ((p.0 >> shift) & ((1 << BITS) - 1)) as usize;
        let mut starts = vec![0usize; (1 << BITS) + 1];
        for p in pairs.iter() {
            starts[digit(p) + 1] += 1;
        }
        for i in 1..starts.len() {
            starts[i] += starts[i - 1];
        }
        for &p in pairs.iter() {
            let d = digit(&p);
            buf[starts[d]] = p;
            starts[d] += 1;
        }
        std::mem::swap(pairs, &mut buf);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    /// The index must answer as a map from id to hash does: for every hash, exactly the ids
    /// stored under it (found one by one with `is_key` rejecting the others), through inserts,
    /// removals, growth and shrinking, with hashes crowded into few homes so runs are long and
    /// wrap around the table's end.
    fn check_against_map(ops: &[(bool, u32, u8)]) -> Result<(), TestCaseError> {
        let mut index = HashIndex::default();
        let mut model: HashMap<u32, u32> = HashMap::new();
        let mut next_id = 0u32;
        for &(insert, raw, crowd) in ops {
            // Crowded hashes: few distinct top bits, many equal hashes.
            let hash = match crowd % 3 {
                0 => raw,
                1 => raw | 0xffff_0000,
                _ => raw % 7,
            };
            if insert || model.is_empty() {
                index.insert_unique(hash, next_id);
                model.insert(next_id, hash);
                next_id += 1;
            } else {
                let victim = *model
                    .keys()
                    .nth(raw as usize % model.len())
                    .expect("not empty");
                let h = model.remove(&victim).expect("present");
                prop_assert!(index.remove(h, victim));
                prop_assert!(!index.remove(h, victim), "removed twice");
                if raw % 5 == 0 {
                    index.shrink_to_fit();
                }
            }
            prop_assert_eq!(index.len(), model.len());
        }
        for (&id, &hash) in &model {
            prop_assert_eq!(index.find(hash, |c| c == id), Some(id));
        }
        prop_assert_eq!(index.find(0x1234_5678, |_| false), None);
        let mut got: Vec<(u32, u32)> = index.pairs().collect();
        let mut want: Vec<(u32, u32)> = model.iter().map(|(&id, &h)| (h, id)).collect();
        got.sort_unstable();
        want.sort_unstable();
        prop_assert_eq!(got, want);
        Ok(())
    }

    proptest! {
        #[test]
        fn the_index_answers_as_a_map(ops in proptest::collection::vec(
            (proptest::bool::weighted(0.7), any::<u32>(), any::<u8>()), 0..400)) {
            check_against_map(&ops)?;
        }
    }

    /// A bulk-built index holds what inserting the same pairs one by one gives, and its array
    /// is filled in hash order (no entry before its home except runs wrapping the end).
    #[test]
    fn from_pairs_equals_inserts() {
        let pairs: Vec<(u32, u32)> = (0..10_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) ^ (i >> 3), i))
            .collect();
        let bulk = HashIndex::from_pairs(pairs.clone());
        let mut one = HashIndex::default();
        for &(h, id) in &pairs {
            one.insert_unique(h, id);
        }
        assert_eq!(bulk.len(), one.len());
        for &(h, id) in &pairs {
            assert_eq!(bulk.find(h, |c| c == id), Some(id));
            assert_eq!(one.find(h, |c| c == id), Some(id));
        }
        let hashes: Vec<u32> = bulk.pairs().map(|(h, _)| h).collect();
        let descents = hashes.windows(2).filter(|w| w[0] > w[1]).count();
        assert!(descents <= 1, "{descents} places out of hash order");
    }

    #[test]
    fn radix_sort_sorts() {
        let mut pairs: Vec<(u32, u32)> = (0..5000u32)
            .map(|i| (i.wrapping_mul(0x9e37_79b9).rotate_left(7), i))
            .collect();
        let mut want = pairs.clone();
        want.sort_by_key(|p| p.0);
        radix_sort_by_hash(&mut pairs);
        assert_eq!(
            pairs.iter().map(|p| p.0).collect::<Vec<_>>(),
            want.iter().map(|p| p.0).collect::<Vec<_>>()
        );
    }

    /// The table grows at 3/4 and an emptied one shrinks back to nothing.
    #[test]
    fn grows_at_three_quarters_and_shrinks() {
        let mut index = HashIndex::default();
        for id in 0..6 {
            index.insert_unique(id * 0x1000_0000, id);
        }
        assert_eq!(index.entries.len(), 8);
        index.insert_unique(7, 6);
        assert_eq!(index.entries.len(), 16);
        for id in 0..6 {
            assert!(index.remove(id * 0x1000_0000, id));
        }
        assert!(index.remove(7, 6));
        index.shrink_to_fit();
        assert_eq!(index.entries.len(), 0);
        assert_eq!(index.find(7, |_| true), None);
    }
}
