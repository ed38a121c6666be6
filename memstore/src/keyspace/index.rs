//! The hash index of a key space: slot ids by the 32-bit hash of their key, in one
//! open-addressed array of 16-byte entries (hash and slot id side by side, then where the
//! slot's key and newest value lie) probed linearly.
//!
//! Why not a general hash table: a point read on a large tenant is a chain of dependent cache
//! misses, and the index is its first link. A table with separate control bytes (hashbrown's
//! layout) costs two of them (the control group, then the entry); here the home entry is found
//! by arithmetic on the hash, so the index costs one miss, and its address is known before the
//! lookup starts, so a caller can prefetch it (`prefetch`). The stored 32-bit hash lets a probe
//! pass other keys' entries without reading their slots, and lets the table grow without
//! reading any slot.
//!
//! Layout: an entry is a `u64` word, the hash in the high half and `slot id + 1` in the low
//! half (0 = empty, so a new table is one zeroed allocation: fresh pages, nothing written),
//! and a `u64` of hints: the cache lines of the slot's newest value and key bytes (`Hints`).
//! A lookup whose hash matches prefetches that key and value before it reads the slot, so the
//! slot, the key and the value are in flight together: a read waits for two misses (the
//! entry, then those three) instead of three (the entry, the slot, then the key and value
//! whose addresses the slot holds). Hints are only ever prefetched, never read through: a
//! stale one costs a wasted line, not a wrong answer. They cost 8 bytes per entry (about 17 B
//! per key at 1M keys); random reads one at a time gained 20 %, overwrites 33 %
//! (docs/memstore.md, "Session 9"). A key's home is its hash scaled to the table, so entries
//! lie in hash order (apart from probe runs) and a bulk load sorted by hash writes the array
//! front to back. At most 3/4 of the entries are used (a lookup of a key never stored then
//! ends within a few cache lines); a full table grows by half (any size, not powers of two:
//! after growing it is half full, where doubling left it 3/8 full), a load sizes it two thirds
//! full; removal shifts the run after the hole back, so there are no tombstones and lookups
//! never slow down with churn.

use zerocopy::FromZeros;

use crate::prefetch::{prefetch, prefetch_line};
use crate::zeroed::zeroed_table;

/// Fewest entries of a table that holds anything.
const MIN_CAPACITY: usize = 8;
const EMPTY: u64 = 0;

/// One place of the table: the packed hash and id (`EMPTY` when free), and the hints.
/// Sixteen bytes aligned to sixteen, so an entry never straddles two cache lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromZeros)]
#[repr(C, align(16))]
struct Entry {
    word: u64,
    hints: Hints,
}

/// Where a slot's newest value and key bytes lie: the value's cache line (the key's when the
/// value is empty) in the low 42 bits, the key's line as a signed distance from it in the high
/// 22 (left 0, the value's own line, when the two boxes lie more than 128 MiB apart; 0 alone
/// means no hint). Prefetch addresses only, never read through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, FromZeros)]
#[repr(transparent)]
pub(crate) struct Hints(u64);

/// Bytes per cache line, as a shift.
const LINE_BITS: u32 = 6;
const BASE_BITS: u32 = 42;
const DELTA_BITS: u32 = 64 - BASE_BITS;

impl Hints {
    /// The hints of a slot whose key bytes start at address `key` and whose newest value at
    /// `value` (`None`: an empty value, a tombstone's).
    pub fn new(key: usize, value: Option<usize>) -> Hints {
        let key_line = (key >> LINE_BITS) as u64;
        let base = value.map_or(key_line, |v| (v >> LINE_BITS) as u64);
        if base >> BASE_BITS != 0 {
            return Hints(0);
        }
        let delta = key_line.wrapping_sub(base) as i64;
        let reach = 1i64 << (DELTA_BITS - 1);
        let delta = if (-reach..reach).contains(&delta) {
            delta
        } else {
            0
        };
        Hints(base | ((delta as u64) << BASE_BITS))
    }

    /// The value's line and the key's line, as addresses.
    fn lines(self) -> (usize, usize) {
        let base = self.0 & ((1 << BASE_BITS) - 1);
        // The high bits, sign-extended by the arithmetic shift.
        let delta = (self.0 as i64) >> BASE_BITS;
        let key = base.wrapping_add(delta as u64);
        ((base << LINE_BITS) as usize, (key << LINE_BITS) as usize)
    }

    /// Starts loading the value's first line and the key's.
    pub fn prefetch(self) {
        if self.0 != 0 {
            let (value, key) = self.lines();
            prefetch_line(value);
            prefetch_line(key);
        }
    }

    /// The (value, key) lines as addresses, for tests.
    #[cfg(test)]
    pub fn addresses(self) -> (usize, usize) {
        self.lines()
    }
}

/// An entry a lookup found: its slot id and its place in the table.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Found {
    pub id: u32,
    at: usize,
}

/// Slot ids by key hash. It stores no keys: every answer is a candidate the caller confirms
/// against its slot (`find`'s `is_key`).
#[derive(Debug, Clone, Default)]
pub(crate) struct HashIndex {
    /// Empty, or at least `MIN_CAPACITY` entries.
    entries: Vec<Entry>,
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

/// Most entries a table of `capacity` holds: 3/4 of it.
const fn max_len(capacity: usize) -> usize {
    capacity.saturating_mul(3) / 4
}

/// Entries of a table for `n` keys two thirds full (a load, a shrink after a compaction):
/// room for an eighth more before it grows.
fn capacity_for(n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    (n.saturating_mul(3) / 2 + 1).max(MIN_CAPACITY)
}

/// What a full table of `capacity` grows to: half as large again, so it is half full after
/// growing (doubling would leave it 3/8 full: 43 bytes a key instead of 32).
fn grown(capacity: usize) -> usize {
    capacity.saturating_add(capacity / 2).max(MIN_CAPACITY)
}

impl HashIndex {
    /// An index with room for `n` keys before it grows.
    pub fn with_capacity(n: usize) -> HashIndex {
        HashIndex {
            entries: zeroed_table(capacity_for(n)),
            len: 0,
        }
    }

    /// Builds the index of `(hash, id, hints)` triples (distinct ids; the caller vouches that
    /// no two belong to the same key), placed in the order of their homes so the array is
    /// written front to back. (The hints travel with the pairs: looked up from the slots here
    /// instead, in hash order, one random slot read per key cost a 1M-key load 45 ms against
    /// 15 for sorting the wider triples.)
    pub fn from_pairs(mut triples: Vec<(u32, u32, Hints)>) -> HashIndex {
        let mut index = HashIndex::with_capacity(triples.len());
        // Sorting by hash is sorting by home (homes rise with hashes).
        radix_sort_by_hash(&mut triples);
        for (hash, id, hints) in triples {
            index.insert_unique(hash, id, hints);
        }
        index
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The home entry of `hash`: the hash scaled to the table (`hash * capacity / 2^32`), so
    /// homes rise with hashes whatever the capacity.
    fn home(&self, hash: u32) -> usize {
        ((u128::from(hash) * self.entries.len() as u128) >> 32) as usize
    }

    /// The place after `p`, wrapping at the end.
    fn next(&self, p: usize) -> usize {
        if p + 1 == self.entries.len() {
            0
        } else {
            p + 1
        }
    }

    /// Places from `from` forward to `to`, wrapping at the end.
    fn distance(&self, from: usize, to: usize) -> usize {
        if to >= from {
            to - from
        } else {
            to + self.entries.len() - from
        }
    }

    /// Asks the core to start loading the home entry of `hash`, so a lookup issued a little
    /// later finds it in cache.
    pub fn prefetch(&self, hash: u32) {
        if !self.entries.is_empty() {
            prefetch(&self.entries[self.home(hash)]);
        }
    }

    /// The place of the first entry with `hash` for whose slot id and hints `is_key` holds.
    fn position(&self, hash: u32, mut is_key: impl FnMut(u32, Hints) -> bool) -> Option<usize> {
        if self.entries.is_empty() {
            return None;
        }
        let mut p = self.home(hash);
        loop {
            let e = self.entries[p];
            if e.word == EMPTY {
                return None;
            }
            if hash_of(e.word) == hash && is_key(id_of(e.word), e.hints) {
                return Some(p);
            }
            p = self.next(p);
        }
    }

    /// The first slot id whose entry has `hash` and for which `is_key(id, hints)` holds (the
    /// hints are the entry's, for the caller to prefetch before it reads the slot).
    pub fn find(&self, hash: u32, is_key: impl FnMut(u32, Hints) -> bool) -> Option<u32> {
        self.find_entry(hash, is_key).map(|f| f.id)
    }

    /// `find`, with where the entry lies (for `set_hints`).
    pub fn find_entry(&self, hash: u32, is_key: impl FnMut(u32, Hints) -> bool) -> Option<Found> {
        self.position(hash, is_key).map(|at| Found {
            id: id_of(self.entries[at].word),
            at,
        })
    }

    /// Replaces the hints of the entry `found` names: no second probe. `found` must come from
    /// this index with no insert or removal since (entries move only then).
    pub fn set_hints(&mut self, found: Found, hints: Hints) {
        let e = &mut self.entries[found.at];
        debug_assert_eq!(
            id_of(e.word),
            found.id,
            "the entry moved since it was found"
        );
        e.hints = hints;
    }

    /// Adds slot `id` under `hash`; the caller knows its key is not indexed yet.
    pub fn insert_unique(&mut self, hash: u32, id: u32, hints: Hints) {
        debug_assert!(id < u32::MAX, "slot ids stay below u32::MAX");
        if self.len + 1 > max_len(self.entries.len()) {
            self.resize(grown(self.entries.len()).max(capacity_for(self.len + 1)));
        }
        self.place(Entry {
            word: pack(hash, id),
            hints,
        });
        self.len += 1;
    }

    /// Puts an entry at the first empty place from its home (there always is one).
    fn place(&mut self, e: Entry) {
        let mut p = self.home(hash_of(e.word));
        while self.entries[p].word != EMPTY {
            p = self.next(p);
        }
        self.entries[p] = e;
    }

    /// Removes the entry of slot `id` (indexed under `hash`); false if there is none. The
    /// entries after it in its probe run move back, so every remaining entry is still found
    /// from its home without passing an empty place.
    pub fn remove(&mut self, hash: u32, id: u32) -> bool {
        let Some(mut hole) = self.position(hash, |c, _| c == id) else {
            return false;
        };
        let mut p = hole;
        loop {
            p = self.next(p);
            let e = self.entries[p];
            if e.word == EMPTY {
                break;
            }
            // The entry at `p` may fill the hole when its home is not strictly between the
            // hole and `p` (cyclically): it is then still reached from its home.
            let home = self.home(hash_of(e.word));
            if self.distance(home, p) >= self.distance(hole, p) {
                self.entries[hole] = e;
                hole = p;
            }
        }
        self.entries[hole] = Entry::new_zeroed();
        self.len -= 1;
        true
    }

    /// Moves to a table two thirds full once less than 3/8 of this one is used (after a
    /// compaction removed keys): never right back and forth around one size.
    pub fn shrink_to_fit(&mut self) {
        let capacity = capacity_for(self.len);
        // (A small table may already be the smallest there is.)
        if self.len < max_len(self.entries.len()) / 2 && capacity < self.entries.len() {
            self.resize(capacity);
        }
    }

    /// Moves every entry into a table of `capacity` entries, in the order of the old table,
    /// which is (nearly) the order of their homes in the new one: it is written front to back.
    fn resize(&mut self, capacity: usize) {
        let old = std::mem::replace(&mut self.entries, zeroed_table(capacity));
        if capacity == 0 {
            return;
        }
        // A run that wrapped around the end starts the old table; its entries belong at the
        // end of the new one, so the old table is walked from its first empty place.
        let start = old.iter().position(|e| e.word == EMPTY).unwrap_or(0);
        for &e in old[start..].iter().chain(&old[..start]) {
            if e.word != EMPTY {
                self.place(e);
            }
        }
    }

    /// Every (hash, id) pair, in table order.
    #[cfg(test)]
    fn pairs(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.entries
            .iter()
            .filter(|e| e.word != EMPTY)
            .map(|e| (hash_of(e.word), id_of(e.word)))
    }

    /// The hints of slot `id` (indexed under `hash`).
    #[cfg(test)]
    pub fn hints_of(&self, hash: u32, id: u32) -> Option<Hints> {
        self.position(hash, |c, _| c == id)
            .map(|p| self.entries[p].hints)
    }
}

/// Sorts by hash (the first of each triple), two passes of 16 bits (a counting sort each):
/// linear in the keys, for the millions a checkpoint brings.
fn radix_sort_by_hash<T: Copy + Default>(items: &mut Vec<(u32, u32, T)>) {
    const BITS: u32 = 16;
    if items.len() < 64 {
        items.sort_unstable_by_key(|p| p.0);
        return;
    }
    let mut buf = vec![(0u32, 0u32, T::default()); items.len()];
    for shift in [0, BITS] {
        let digit = |p: &(u32, u32, T)| ((p.0 >> shift) & ((1 << BITS) - 1)) as usize;
        let mut starts = vec![0usize; (1 << BITS) + 1];
        for p in items.iter() {
            starts[digit(p) + 1] += 1;
        }
        for i in 1..starts.len() {
            starts[i] += starts[i - 1];
        }
        for &p in items.iter() {
            let d = digit(&p);
            buf[starts[d]] = p;
            starts[d] += 1;
        }
        std::mem::swap(items, &mut buf);
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
                index.insert_unique(hash, next_id, Hints(u64::from(next_id)));
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
            prop_assert_eq!(index.find(hash, |c, _| c == id), Some(id));
            prop_assert_eq!(
                index.hints_of(hash, id),
                Some(Hints(u64::from(id))),
                "hints move with their entry"
            );
        }
        prop_assert_eq!(index.find(0x1234_5678, |_, _| false), None);
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
        let pairs: Vec<(u32, u32, Hints)> = (0..10_000u32)
            .map(|i| {
                (
                    i.wrapping_mul(2_654_435_761) ^ (i >> 3),
                    i,
                    Hints(u64::from(i) << 7),
                )
            })
            .collect();
        let bulk = HashIndex::from_pairs(pairs.clone());
        let mut one = HashIndex::default();
        for &(h, id, hints) in &pairs {
            one.insert_unique(h, id, hints);
        }
        assert_eq!(bulk.len(), one.len());
        for &(h, id, hints) in &pairs {
            assert_eq!(bulk.find(h, |c, _| c == id), Some(id));
            assert_eq!(one.find(h, |c, _| c == id), Some(id));
            assert_eq!(bulk.hints_of(h, id), Some(hints));
            assert_eq!(one.hints_of(h, id), Some(hints));
        }
        let hashes: Vec<u32> = bulk.pairs().map(|(h, _)| h).collect();
        let descents = hashes.windows(2).filter(|w| w[0] > w[1]).count();
        assert!(descents <= 1, "{descents} places out of hash order");
    }

    #[test]
    fn radix_sort_sorts() {
        let mut pairs: Vec<(u32, u32, u8)> = (0..5000u32)
            .map(|i| (i.wrapping_mul(0x9e37_79b9).rotate_left(7), i, i as u8))
            .collect();
        let mut want = pairs.clone();
        radix_sort_by_hash(&mut pairs);
        assert!(pairs.windows(2).all(|w| w[0].0 <= w[1].0), "in hash order");
        // Each id still with its own hash and companion.
        pairs.sort_unstable();
        want.sort_unstable();
        assert_eq!(pairs, want);
    }

    /// Hints give back the value's and the key's lines; a key too far from its value falls
    /// back to the value's line, an empty value to the key's, an address beyond 48 bits to no
    /// hint at all.
    #[test]
    fn hints_name_the_lines_of_value_and_key() {
        let line = |a: usize| a >> 6 << 6;
        let value = 0x7f12_3456_7890usize;
        for key in [
            value + 100,
            value - 4096,
            value + (100 << 20),
            value - (127 << 20),
        ] {
            assert_eq!(
                Hints::new(key, Some(value)).addresses(),
                (line(value), line(key))
            );
        }
        for far in [value + (129 << 20), value - (129 << 20), 0x10] {
            assert_eq!(
                Hints::new(far, Some(value)).addresses(),
                (line(value), line(value))
            );
        }
        assert_eq!(
            Hints::new(value, None).addresses(),
            (line(value), line(value))
        );
        assert_eq!(Hints::new(value, Some(1 << 48)), Hints(0));
        assert_eq!(Hints::new(1 << 48, None), Hints(0));
    }

    /// The table grows by half at 3/4, a load sizes it two thirds full, it shrinks only below
    /// 3/8 (to two thirds), and an emptied one shrinks back to nothing.
    #[test]
    fn grows_by_half_at_three_quarters_and_shrinks_below_three_eighths() {
        let mut index = HashIndex::default();
        for id in 0..6 {
            index.insert_unique(id * 0x1000_0000, id, Hints::default());
        }
        assert_eq!(index.entries.len(), 8);
        index.insert_unique(7, 6, Hints::default());
        assert_eq!(index.entries.len(), 12);
        for id in 7..100u32 {
            index.insert_unique(id.wrapping_mul(0x9e37_79b9), id, Hints::default());
        }
        // 8, 12, 18, 27, 40, 60, 90, 135: each growth at 3/4 full.
        assert_eq!(index.entries.len(), 135);
        assert!(index.len() <= max_len(135) && index.len() > max_len(90));
        assert_eq!(HashIndex::with_capacity(1000).entries.len(), 1501);
        let hash = |id: u32| {
            if id < 6 {
                id * 0x1000_0000
            } else {
                id.wrapping_mul(0x9e37_79b9)
            }
        };
        // 100 keys in 135 places; max_len(135) = 101, so a shrink waits for fewer than 50.
        for id in 7..57u32 {
            assert!(index.remove(hash(id), id));
            index.shrink_to_fit();
            assert_eq!(index.entries.len(), 135, "{} keys left", index.len());
        }
        assert_eq!(index.len(), 50);
        assert!(index.remove(hash(57), 57));
        index.shrink_to_fit();
        assert_eq!((index.len(), index.entries.len()), (49, capacity_for(49)));
        assert_eq!(capacity_for(49), 74);
        for id in (0..6u32).chain(58..100) {
            assert!(index.remove(hash(id), id));
        }
        index.shrink_to_fit();
        assert_eq!((index.len(), index.entries.len()), (1, MIN_CAPACITY));
        // One key in the smallest table: nothing to shrink to, so no reallocation.
        let before = index.entries.as_ptr();
        index.shrink_to_fit();
        assert_eq!(index.entries.as_ptr(), before);
        assert!(index.remove(7, 6));
        index.shrink_to_fit();
        assert_eq!(index.entries.len(), 0);
        assert_eq!(index.find(7, |_, _| true), None);
    }
}
