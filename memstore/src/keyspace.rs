//! The multi-version key space: every key with its compact list of versions (etcd's key_index
//! generations flattened, tombstones included) in a slab, a hash index for point lookups, an
//! ordered index for ranges, a revision-ordered change log for event replay, and the byte
//! counters the stats and the quota read.

use std::collections::{BTreeSet, VecDeque};
use std::hash::BuildHasher;
use std::ops::Bound;

use api::mvccpb::KeyValue;

mod batch;
mod bulk;
mod index;
mod order;

pub(crate) use bulk::KeySpaceBuilder;
use index::{Found, HashIndex, Hints};
use order::OrderIndex;

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
        let value = if keys_only {
            Vec::new()
        } else {
            self.value.to_vec()
        };
        self.kv_with(key.to_vec(), value)
    }

    /// This version as a `KeyValue` with key and value bytes the caller already holds.
    pub fn kv_with(&self, key: Vec<u8>, value: Vec<u8>) -> KeyValue {
        KeyValue {
            key,
            create_revision: self.create,
            mod_revision: self.main,
            version: self.version,
            value,
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

/// Whether `key` lies below the upper bound `end`.
pub(crate) fn below(key: &[u8], end: Bound<&[u8]>) -> bool {
    match end {
        Bound::Included(e) => key <= e,
        Bound::Excluded(e) => key < e,
        Bound::Unbounded => true,
    }
}

/// Slots per slab chunk: the slab grows a chunk at a time, so it never copies itself and never
/// holds more than one partly used chunk.
const SLAB_CHUNK_BITS: u32 = 12;
const SLAB_CHUNK: usize = 1 << SLAB_CHUNK_BITS;
/// A compaction that empties more than 1/REPACK_ABOVE of the keys re-packs the ordered index
/// whole instead of removing them one by one.
const REPACK_ABOVE: usize = 16;
/// Seed of the hash index. Fixed, so the store stays free of randomness; the hash only places
/// slot ids in the table and never decides anything a client sees.
const HASH_SEED: u64 = 0x5354_5241_5441_4b56;
static HASHER: foldhash::quality::FixedState = foldhash::quality::FixedState::with_seed(HASH_SEED);

/// A key's 32-bit hash, kept beside its slot id in the hash index.
fn hash_key(key: &[u8]) -> u32 {
    let h = HASHER.hash_one(key);
    (h ^ (h >> 32)) as u32
}

/// One key with all its versions, oldest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Slot {
    pub key: Box<[u8]>,
    pub versions: Versions,
}

/// A key's versions, oldest first: the one version most keys have is kept inline in the slot
/// (no allocation, no pointer to follow on a read); a key with history keeps a `Vec`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Versions {
    One(Version),
    /// Two or more versions; never fewer (a key with no version left is removed).
    Many(Vec<Version>),
}

impl std::ops::Deref for Versions {
    type Target = [Version];

    fn deref(&self) -> &[Version] {
        match self {
            Versions::One(v) => std::slice::from_ref(v),
            Versions::Many(vs) => vs,
        }
    }
}

impl Versions {
    /// Whether the newest version is a put.
    pub fn is_live(&self) -> bool {
        self.last().is_some_and(|v| !v.is_tombstone())
    }

    /// Versions from a non-empty list, oldest first.
    fn from_vec(mut vs: Vec<Version>) -> Versions {
        match (vs.len(), vs.pop()) {
            (1, Some(v)) => Versions::One(v),
            (_, last) => {
                vs.extend(last);
                Versions::Many(vs)
            }
        }
    }

    fn push(&mut self, v: Version) {
        match self {
            Versions::Many(vs) => vs.push(v),
            Versions::One(_) => {
                let Versions::One(old) = std::mem::replace(self, Versions::Many(Vec::new())) else {
                    unreachable!("matched One above");
                };
                *self = Versions::Many(vec![old, v]);
            }
        }
    }

    /// Drops the `n` oldest versions; false when none is left.
    fn drop_oldest(&mut self, n: usize) -> bool {
        if n == 0 {
            return true;
        }
        let Versions::Many(vs) = self else {
            return false;
        };
        if n >= vs.len() {
            return false;
        }
        vs.drain(..n);
        if vs.len() == 1 {
            if let Some(v) = vs.pop() {
                *self = Versions::One(v);
            }
        } else {
            vs.shrink_to_fit();
        }
        true
    }
}

/// Whether `versions` (oldest first) hold something a compaction at `compact_rev` drops: more
/// than one version at or below it, or a tombstone below it. Never true of a key space this
/// code compacted; a loader notes such keys so the next compaction visits them (`unlogged`).
fn holds_compactable(versions: &[Version], compact_rev: i64) -> bool {
    match versions.partition_point(|v| v.main <= compact_rev) {
        0 => false,
        1 => versions[0].is_tombstone() && versions[0].main < compact_rev,
        _ => true,
    }
}

/// One entry of the change log: the version of slot `slot` written at (`main`, `sub`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Change {
    pub main: i64,
    pub sub: u32,
    pub slot: u32,
}

/// Counting the keys of a range live at an older revision without reading the range: its
/// count at the head, from the ordered index's live counts, corrected for each key changed
/// since (from the change log: live then instead of as at the head), the changes looked at a
/// budget at a time so a caller can let writes apply in between (`RangeScan`). Writes after
/// the head it began at are left out; a compaction at or below `rev` drops no change it looks
/// at (those are all above `rev`), and one above `rev` ends the caller's scan anyway.
#[derive(Debug)]
pub(crate) struct CountWalk {
    key: Box<[u8]>,
    range_end: Box<[u8]>,
    rev: i64,
    head: i64,
    /// Live keys of the range at `head`.
    at_head: i64,
    /// Sum over the keys of the range changed since `rev` and looked at: live at `rev` minus
    /// live at `head`.
    correction: i64,
    /// The next change to look at, as (main, sub).
    next: (i64, u32),
    /// Slots looked at (a key changed twice counts once).
    seen: BTreeSet<u32>,
}

impl CountWalk {
    /// The range's live keys at the head the walk began at.
    pub fn at_head(&self) -> u64 {
        self.at_head as u64
    }

    /// Looks at up to `n` (at least one) more changes; the count once every change up to the
    /// head has been looked at.
    pub fn step(&mut self, ks: &KeySpace, n: usize) -> Option<u64> {
        let bounds = bounds(&self.key, &self.range_end);
        let start = ks.log.partition_point(|c| (c.main, c.sub) < self.next);
        for (looked, c) in ks.log.range(start..).enumerate() {
            if c.main > self.head {
                break;
            }
            if looked >= n.max(1) {
                self.next = (c.main, c.sub);
                return None;
            }
            if !self.seen.insert(c.slot) {
                continue;
            }
            let slot = ks.slab.get(c.slot);
            let inside =
                bounds.is_some_and(|(_, end)| slot.key[..] >= *self.key && below(&slot.key, end));
            if inside {
                self.correction += i64::from(live_at(&slot.versions, self.rev).is_some())
                    - i64::from(live_at(&slot.versions, self.head).is_some());
            }
        }
        self.next = (self.head + 1, 0);
        Some((self.at_head + self.correction) as u64)
    }
}

/// The slab of key slots, in fixed-size chunks (a slot id never moves).
#[derive(Debug, Clone, Default)]
struct Slab {
    chunks: Vec<Vec<Option<Slot>>>,
    /// Ids of emptied slots, reused first.
    free: Vec<u32>,
}

impl Slab {
    fn get(&self, id: u32) -> &Slot {
        self.chunks[(id >> SLAB_CHUNK_BITS) as usize][id as usize & (SLAB_CHUNK - 1)]
            .as_ref()
            .expect("invariant: every indexed slot id holds a key")
    }

    /// Where slot `id` lives, without reading it (for a prefetch).
    fn place(&self, id: u32) -> &Option<Slot> {
        &self.chunks[(id >> SLAB_CHUNK_BITS) as usize][id as usize & (SLAB_CHUNK - 1)]
    }

    /// The hash index's hints for slot `id`: where its key bytes and newest value lie.
    fn hints(&self, id: u32) -> Hints {
        let slot = self.get(id);
        let value = slot
            .versions
            .last()
            .filter(|v| !v.value.is_empty())
            .map(|v| v.value.as_ptr().addr());
        Hints::new(slot.key.as_ptr().addr(), value)
    }

    fn get_mut(&mut self, id: u32) -> &mut Slot {
        self.chunks[(id >> SLAB_CHUNK_BITS) as usize][id as usize & (SLAB_CHUNK - 1)]
            .as_mut()
            .expect("invariant: every indexed slot id holds a key")
    }

    fn insert(&mut self, slot: Slot) -> u32 {
        if let Some(id) = self.free.pop() {
            self.chunks[(id >> SLAB_CHUNK_BITS) as usize][id as usize & (SLAB_CHUNK - 1)] =
                Some(slot);
            return id;
        }
        if self.chunks.last().is_none_or(|c| c.len() == SLAB_CHUNK) {
            self.chunks.push(Vec::with_capacity(SLAB_CHUNK));
        }
        let n = self.chunks.len() - 1;
        let id = u32::try_from(n * SLAB_CHUNK + self.chunks[n].len())
            .ok()
            .filter(|&id| id < u32::MAX)
            .expect("invariant: a tenant holds fewer than 2^32 - 1 keys");
        self.chunks[n].push(Some(slot));
        id
    }

    fn remove(&mut self, id: u32) {
        self.chunks[(id >> SLAB_CHUNK_BITS) as usize][id as usize & (SLAB_CHUNK - 1)] = None;
        self.free.push(id);
    }
}

/// Every key with its versions, the indexes over them, plus running byte counters.
#[derive(Debug, Clone, Default)]
pub(crate) struct KeySpace {
    slab: Slab,
    /// Slot ids by hash of their key: point reads and writes.
    index: HashIndex,
    /// Slot ids in key order: ranges.
    order: OrderIndex,
    /// Every stored version newer than the compact revision, in (main, sub) order: event
    /// replay. Appended by writes, trimmed at the front by compaction.
    log: VecDeque<Change>,
    /// Keys a loaded checkpoint gave history at or below its compact revision that a
    /// compaction would have dropped (the log does not name them): the next compaction visits
    /// them as well. Empty for every store this code compacted and wrote.
    unlogged: Vec<u32>,
    /// Keys whose newest version is a put.
    pub live_keys: u64,
    /// Key + value bytes of the newest version of live keys.
    pub live_bytes: u64,
    /// Key + value bytes of every stored version (history included).
    pub total_bytes: u64,
    /// Number of stored versions (tombstones included).
    pub versions: u64,
}

/// Logical equality: the same keys with the same versions and counters (the indexes are
/// derived from them).
impl PartialEq for KeySpace {
    fn eq(&self, other: &Self) -> bool {
        (
            self.live_keys,
            self.live_bytes,
            self.total_bytes,
            self.versions,
        ) == (
            other.live_keys,
            other.live_bytes,
            other.total_bytes,
            other.versions,
        ) && self.index.len() == other.index.len()
            && self.log == other.log_remapped(self)
            && self.iter_all().eq(other.iter_all())
    }
}

impl Eq for KeySpace {}

/// Keys and versions in key order over a range.
pub(crate) struct RangeIter<'a> {
    ks: &'a KeySpace,
    chunk: usize,
    pos: usize,
    end: Bound<&'a [u8]>,
    /// A single-key range answered from the hash index.
    single: Option<Option<&'a Slot>>,
}

impl<'a> Iterator for RangeIter<'a> {
    type Item = (&'a [u8], &'a [Version]);

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(single) = &mut self.single {
            return single.take().map(|s| (&s.key[..], &s.versions[..]));
        }
        loop {
            let ids = &self.ks.order.chunks.get(self.chunk)?.ids;
            let Some(&id) = ids.get(self.pos) else {
                self.chunk += 1;
                self.pos = 0;
                continue;
            };
            self.pos += 1;
            let slot = self.ks.slab.get(id);
            if !below(&slot.key, self.end) {
                self.chunk = self.ks.order.chunks.len();
                return None;
            }
            return Some((&slot.key[..], &slot.versions[..]));
        }
    }
}

impl KeySpace {
    fn find(&self, key: &[u8]) -> Option<u32> {
        self.find_hashed(hash_key(key), key).map(|f| f.id)
    }

    /// The slot id of `key`, whose hash is `hash`. Once an entry's hash matches, the key bytes
    /// and the newest value its hints name are prefetched before the slot is read, so the
    /// slot, the key (for the comparison) and the value (for a read's answer, a put's
    /// previous key-value) come in together: one miss after the index entry's, not two.
    fn find_hashed(&self, hash: u32, key: &[u8]) -> Option<Found> {
        let slab = &self.slab;
        self.index.find_entry(hash, |id, hints| {
            hints.prefetch();
            &slab.get(id).key[..] == key
        })
    }

    /// Asks the core to start loading the index entry where a lookup of `key` begins.
    pub fn prefetch(&self, key: &[u8]) {
        self.index.prefetch(hash_key(key));
    }

    /// The versions of `key`, oldest first, if it has any.
    pub fn get(&self, key: &[u8]) -> Option<&[Version]> {
        self.find(key).map(|id| &self.slab.get(id).versions[..])
    }

    /// The slot (key and versions) of `key`, if it has any version.
    pub fn get_slot(&self, key: &[u8]) -> Option<&Slot> {
        self.find(key).map(|id| self.slab.get(id))
    }

    /// The key and versions of a slot named by the change log.
    pub fn slot(&self, id: u32) -> &Slot {
        self.slab.get(id)
    }

    /// Every slot with its id, in key order, from the first key at or after `from` (None: from
    /// the first key).
    pub fn slots_from(&self, from: Option<&[u8]>) -> impl Iterator<Item = (u32, &Slot)> + '_ {
        let (chunk, pos) = from.map_or((0, 0), |k| self.lower_bound(k));
        self.order
            .chunks
            .iter()
            .enumerate()
            .skip(chunk)
            .flat_map(move |(c, ch)| ch.ids.iter().skip(if c == chunk { pos } else { 0 }))
            .map(|&id| (id, self.slab.get(id)))
    }

    /// The change log entries from revision (`main`, `sub`) on, oldest first.
    pub fn changes_at_or_after(&self, from: (i64, u32)) -> impl Iterator<Item = &Change> + '_ {
        let start = self.log.partition_point(|c| (c.main, c.sub) < from);
        self.log.range(start..)
    }

    /// Position of the first key >= `key`: (chunk, offset), offset possibly past the chunk.
    fn lower_bound(&self, key: &[u8]) -> (usize, usize) {
        let slab = &self.slab;
        self.order.lower_bound(key, &|id| &slab.get(id).key[..])
    }

    /// Iterates `(key, versions)` over etcd's range, in key order.
    pub fn iter_range<'a>(&'a self, key: &'a [u8], range_end: &'a [u8]) -> RangeIter<'a> {
        match bounds(key, range_end) {
            None => RangeIter {
                ks: self,
                chunk: self.order.chunks.len(),
                pos: 0,
                end: Bound::Unbounded,
                single: None,
            },
            Some(_) if range_end.is_empty() => RangeIter {
                ks: self,
                chunk: 0,
                pos: 0,
                end: Bound::Unbounded,
                single: Some(self.find(key).map(|id| self.slab.get(id))),
            },
            Some((_, end)) => {
                let (chunk, pos) = self.lower_bound(key);
                RangeIter {
                    ks: self,
                    chunk,
                    pos,
                    end,
                    single: None,
                }
            }
        }
    }

    /// Every key with its versions, in key order.
    pub fn iter_all(&self) -> RangeIter<'_> {
        RangeIter {
            ks: self,
            chunk: 0,
            pos: 0,
            end: Bound::Unbounded,
            single: None,
        }
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

    /// The number of keys in etcd's range whose newest version is a put, from the ordered
    /// index's live counts: whole chunks by their counts, the two ends by their flags.
    pub fn count_live_head(&self, key: &[u8], range_end: &[u8]) -> u64 {
        let Some((_, end)) = bounds(key, range_end) else {
            return 0;
        };
        if range_end.is_empty() {
            return u64::from(self.latest_live(key).is_some());
        }
        let slab = &self.slab;
        let key_of = |id: u32| &slab.get(id).key[..];
        let from = self.order.lower_bound(key, &key_of);
        let to = match end {
            Bound::Excluded(e) => self.order.lower_bound(e, &key_of),
            _ => (self.order.chunks.len(), 0),
        };
        self.order.count_live(from, to)
    }

    /// The number of changes logged above `rev`.
    pub fn changes_since(&self, rev: i64) -> usize {
        self.log.len() - self.log.partition_point(|c| c.main <= rev)
    }

    /// Begins counting the keys of etcd's range live at `rev` (at or above the compact
    /// revision) from the live counts and the changes since `rev`; see [`CountWalk`].
    pub fn count_walk(&self, key: &[u8], range_end: &[u8], rev: i64) -> CountWalk {
        // The live counts reflect every logged change, a txn's own earlier operations
        // included while it applies (at a revision the store has not reached yet): the head
        // is the last change's revision, not the store's.
        let head = self.log.back().map_or(rev, |c| c.main.max(rev));
        CountWalk {
            key: key.into(),
            range_end: range_end.into(),
            rev,
            head,
            at_head: self.count_live_head(key, range_end) as i64,
            correction: 0,
            next: (rev + 1, 0),
            seen: BTreeSet::new(),
        }
    }

    pub fn latest_live(&self, key: &[u8]) -> Option<&Version> {
        self.get(key)
            .and_then(|vs| vs.last())
            .filter(|v| !v.is_tombstone())
    }

    /// Number of keys stored (tombstoned ones with history included).
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// The change log entries with main revision >= `from_rev`, oldest first.
    pub fn changes_from(&self, from_rev: i64) -> impl Iterator<Item = &Change> + '_ {
        let start = self.log.partition_point(|c| c.main < from_rev);
        self.log.range(start..)
    }

    /// Appends the version `make` builds from the key (as stored) and its current versions
    /// (None for a key never stored), with one hash probe (plus the ordered insert for a new
    /// key), and keeps the counters and the change log. A new key's bytes move into the store
    /// when `key` owns them. Returns the key's slot id.
    pub fn upsert<K>(
        &mut self,
        key: K,
        make: impl FnOnce(&[u8], Option<&[Version]>) -> Version,
    ) -> u32
    where
        K: AsRef<[u8]> + Into<Box<[u8]>>,
    {
        let k = key.as_ref();
        let kl = k.len() as u64;
        let h = hash_key(k);
        let found = self.find_hashed(h, k);
        let (id, added, live, main, sub) = match found {
            Some(found) => {
                let id = found.id;
                let slot = self.slab.get_mut(id);
                let v = make(&slot.key, Some(&slot.versions));
                let was_live = slot.versions.is_live();
                if let Some(last) = slot.versions.last().filter(|l| !l.is_tombstone()) {
                    self.live_keys -= 1;
                    self.live_bytes -= kl + last.value.len() as u64;
                }
                let facts = (kl + v.value.len() as u64, !v.is_tombstone(), v.main, v.sub);
                slot.versions.push(v);
                // A new newest value: the index's hints follow it (the entry found above;
                // nothing was inserted or removed since).
                self.index.set_hints(found, self.slab.hints(id));
                if was_live != facts.1 {
                    // A delete, or a put after one: the ordered index's live counts follow
                    // (an overwrite of a live key, the common write, changes nothing there).
                    let slab = &self.slab;
                    self.order
                        .set_live(&slab.get(id).key, facts.1, &|id| &slab.get(id).key[..]);
                }
                (id, facts.0, facts.1, facts.2, facts.3)
            }
            None => {
                let v = make(k, None);
                let facts = (kl + v.value.len() as u64, !v.is_tombstone(), v.main, v.sub);
                let slab = &self.slab;
                let (chunk, pos) = self.order.insert_position(k, &|id| &slab.get(id).key[..]);
                let id = self.slab.insert(Slot {
                    key: key.into(),
                    versions: Versions::One(v),
                });
                self.index.insert_unique(h, id, self.slab.hints(id));
                let slab = &self.slab;
                let key = &slab.get(id).key;
                self.order
                    .insert(chunk, pos, id, key, facts.1, &|id| &slab.get(id).key[..]);
                (id, facts.0, facts.1, facts.2, facts.3)
            }
        };
        if live {
            self.live_keys += 1;
            self.live_bytes += added;
        }
        self.total_bytes += added;
        self.versions += 1;
        self.log.push_back(Change {
            main,
            sub,
            slot: id,
        });
        id
    }

    /// Drops history at or below `rev` as etcd's keyIndex.compact does (since etcd's fix of
    /// its lost delete events, etcd-io/etcd#18274): of the versions <= rev only the newest
    /// survives, if it is a put or a tombstone at `rev` itself; keys left empty disappear. The
    /// change log forgets every change below `rev` and what was dropped at `rev`: a watch may
    /// start at the compact revision itself, as in etcd, and sees every change made there.
    ///
    /// Only the keys the forgotten part of the log names are visited: every other key has at
    /// most one version at or below `rev`, a put the previous compaction kept, so there is
    /// nothing to drop (the log holds every version at or above the previous compact revision,
    /// a tombstone kept there included). A compaction therefore costs what was written since
    /// the last one, not the tenant's size.
    pub fn compact(&mut self, rev: i64) {
        let (mut touched, at_rev) = self.forget_changes(rev);
        touched.append(&mut self.unlogged);
        // Each key once, in slab order (neighbouring slots share cache lines and pages).
        touched.sort_unstable();
        touched.dedup();
        let emptied = self.drop_history(touched.into_iter(), rev);
        self.remove_emptied(emptied);
        self.relog_survivors(at_rev);
    }

    /// Takes the changes at or below `rev` out of the log: the slots they name, and those of
    /// them made at `rev` itself (for [`KeySpace::relog_survivors`]).
    fn forget_changes(&mut self, rev: i64) -> (Vec<u32>, Vec<Change>) {
        let gone = self.log.partition_point(|c| c.main <= rev);
        let below = self.log.partition_point(|c| c.main < rev);
        let at_rev: Vec<Change> = self.log.range(below..gone).copied().collect();
        let touched: Vec<u32> = self.log.drain(..gone).map(|c| c.slot).collect();
        if self.log.capacity() > 2 * self.log.len() {
            self.log.shrink_to_fit();
        }
        (touched, at_rev)
    }

    /// Logs again, at the front, the changes made at the compact revision whose versions the
    /// compaction kept (after emptied keys left the slab).
    fn relog_survivors(&mut self, at_rev: Vec<Change>) {
        for c in at_rev.into_iter().rev() {
            let Some(slot) = self.slab.place(c.slot) else {
                continue;
            };
            let vs = &slot.versions[..];
            let j = vs.partition_point(|v| (v.main, v.sub) < (c.main, c.sub));
            if vs
                .get(j)
                .is_some_and(|v| (v.main, v.sub) == (c.main, c.sub))
            {
                self.log.push_front(c);
            }
        }
    }

    /// Drops the versions at or below `rev` that a compaction frees from each of `ids`; the
    /// ids of keys left without versions (still in every index).
    fn drop_history(&mut self, ids: impl Iterator<Item = u32>, rev: i64) -> Vec<u32> {
        let mut freed_bytes = 0u64;
        let mut freed_versions = 0u64;
        let mut emptied = Vec::new();
        for id in ids {
            let slot = self.slab.get_mut(id);
            let vs = &mut slot.versions;
            let n = vs.partition_point(|v| v.main <= rev);
            if n == 0 {
                continue;
            }
            // The newest version at or below `rev` stays, unless it is a tombstone below `rev`
            // (one at `rev` stays for a watch from there, until a later compaction).
            let newest = &vs[n - 1];
            let keep_from = if newest.is_tombstone() && newest.main < rev {
                n
            } else {
                n - 1
            };
            if keep_from > 0 {
                for v in &vs[..keep_from] {
                    freed_bytes += (slot.key.len() + v.value.len()) as u64;
                }
                freed_versions += keep_from as u64;
                if !vs.drop_oldest(keep_from) {
                    emptied.push(id);
                }
            }
        }
        self.total_bytes -= freed_bytes;
        self.versions -= freed_versions;
        emptied
    }

    /// Takes keys left without versions out of the indexes and the slab: one by one from the
    /// ordered index when they are few, else by re-packing it whole into full chunks (a
    /// tenant-wide delete would otherwise pay a search per key).
    fn remove_emptied(&mut self, emptied: Vec<u32>) {
        if emptied.is_empty() {
            return;
        }
        let repack = emptied.len() > self.len() / REPACK_ABOVE;
        for &id in &emptied {
            let slab = &self.slab;
            let key = &slab.get(id).key;
            self.index.remove(hash_key(key), id);
            if !repack {
                self.order.remove(id, key, &|id| &slab.get(id).key[..]);
            }
            self.slab.remove(id);
        }
        if repack {
            let slab = &self.slab;
            let kept: Vec<u32> = self
                .order
                .chunks
                .iter()
                .flat_map(|c| c.ids.iter())
                .copied()
                .filter(|&id| slab.place(id).is_some())
                .collect();
            self.order = OrderIndex::from_sorted(&kept, &|id| &slab.get(id).key[..], &|id| {
                slab.get(id).versions.is_live()
            });
        }
        self.index.shrink_to_fit();
    }

    /// A compaction the way it was done before the log told which keys to visit: every key
    /// in key order. The reference the log-driven one is tested against.
    #[cfg(test)]
    fn compact_every_key(&mut self, rev: i64) {
        let (_, at_rev) = self.forget_changes(rev);
        self.unlogged.clear();
        let ids: Vec<u32> = self
            .order
            .chunks
            .iter()
            .flat_map(|c| c.ids.clone())
            .collect();
        let emptied = self.drop_history(ids.into_iter(), rev);
        self.remove_emptied(emptied);
        self.relog_survivors(at_rev);
    }

    /// The change log expressed in `other`'s slot ids (for equality across two key spaces).
    fn log_remapped(&self, other: &KeySpace) -> VecDeque<Change> {
        self.log
            .iter()
            .map(|c| Change {
                slot: other.find(&self.slab.get(c.slot).key).unwrap_or(u32::MAX),
                ..*c
            })
            .collect()
    }

    /// Builds a key space from keys in strictly ascending order, each with its versions oldest
    /// first; the change log gets every version at or above `compact_rev` (as a compaction
    /// leaves it). Errors name the defect.
    pub fn from_sorted(
        keys: impl Iterator<Item = (Box<[u8]>, Vec<Version>)>,
        compact_rev: i64,
    ) -> Result<KeySpace, String> {
        let (lower, _) = keys.size_hint();
        let mut ks = KeySpace::default();
        let mut ordered: Vec<u32> = Vec::with_capacity(lower);
        let mut log: Vec<Change> = Vec::new();
        let mut pending: Vec<(u32, u32, Hints)> = Vec::with_capacity(lower);
        for (key, versions) in keys {
            if versions.is_empty() {
                return Err("a key without versions".into());
            }
            if let Some(&prev) = ordered.last()
                && ks.slab.get(prev).key >= key
            {
                return Err("keys out of order or duplicated".into());
            }
            let kl = key.len() as u64;
            let mut last: Option<(i64, u32)> = None;
            for v in &versions {
                if last.is_some_and(|l| l >= (v.main, v.sub)) {
                    return Err("versions out of revision order".into());
                }
                last = Some((v.main, v.sub));
                ks.total_bytes += kl + v.value.len() as u64;
            }
            if let Some(l) = versions.last().filter(|v| !v.is_tombstone()) {
                ks.live_keys += 1;
                ks.live_bytes += kl + l.value.len() as u64;
            }
            ks.versions += versions.len() as u64;
            let hash = hash_key(&key);
            let compactable = holds_compactable(&versions, compact_rev);
            let id = ks.slab.insert(Slot {
                key,
                versions: Versions::from_vec(versions),
            });
            if compactable {
                ks.unlogged.push(id);
            }
            for v in ks.slab.get(id).versions.iter() {
                if v.main >= compact_rev {
                    log.push(Change {
                        main: v.main,
                        sub: v.sub,
                        slot: id,
                    });
                }
            }
            pending.push((hash, id, ks.slab.hints(id)));
            ordered.push(id);
        }
        ks.index = HashIndex::from_pairs(pending);
        log.sort_unstable_by_key(|c| (c.main, c.sub));
        if log
            .windows(2)
            .any(|w| (w[0].main, w[0].sub) == (w[1].main, w[1].sub))
        {
            return Err("two changes at one revision and sub-revision".into());
        }
        ks.log = log.into();
        let slab = &ks.slab;
        ks.order = OrderIndex::from_sorted(&ordered, &|id| &slab.get(id).key[..], &|id| {
            slab.get(id).versions.is_live()
        });
        Ok(ks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(main: i64) -> Version {
        Version {
            main,
            sub: 0,
            create: 1,
            version: main,
            lease: 0,
            value: vec![b'v'; 3].into(),
        }
    }

    /// One version inline, a second moves them to a `Vec`, dropping back to one goes inline.
    #[test]
    fn versions_switch_between_inline_and_vec() {
        let mut vs = Versions::One(version(1));
        assert_eq!(vs.iter().map(|v| v.main).collect::<Vec<_>>(), [1]);
        vs.push(version(2));
        vs.push(version(3));
        assert_eq!(vs.iter().map(|v| v.main).collect::<Vec<_>>(), [1, 2, 3]);
        assert!(vs.drop_oldest(2));
        assert!(matches!(vs, Versions::One(ref v) if v.main == 3));
        assert!(!vs.drop_oldest(1), "no version left");
        let vs = Versions::from_vec(vec![version(4), version(5)]);
        assert_eq!(vs.len(), 2);
        assert!(matches!(
            Versions::from_vec(vec![version(6)]),
            Versions::One(_)
        ));
    }

    /// A put (or, with `tombstone`, a delete) of `key` at revision `main` with a value of
    /// `len` bytes, its create revision and version following the key's history as etcd's do.
    fn write_sized(ks: &mut KeySpace, key: Vec<u8>, main: i64, tombstone: bool, len: usize) {
        ks.upsert(key, |_, prev| {
            let last = prev.and_then(|vs| vs.last()).filter(|v| !v.is_tombstone());
            Version {
                main,
                sub: 0,
                create: if tombstone {
                    0
                } else {
                    last.map_or(main, |v| v.create)
                },
                version: if tombstone {
                    0
                } else {
                    last.map_or(1, |v| v.version + 1)
                },
                lease: 0,
                value: vec![b'v'; len].into(),
            }
        });
    }

    mod compaction {
        use proptest::prelude::*;

        use super::super::*;

        /// Keys enough for the ordered index to split into several chunks.
        const KEYS: u16 = 1500;

        #[derive(Debug, Clone)]
        enum Op {
            Put(u16),
            Delete(u16),
            /// Compact this many revisions below the head.
            Compact(u8),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                6 => (0..KEYS).prop_map(Op::Put),
                3 => (0..KEYS).prop_map(Op::Delete),
                1 => (0u8..30).prop_map(Op::Compact),
            ]
        }

        fn key(i: u16) -> Vec<u8> {
            format!("/registry/pods/ns{}/p{:05}", i % 7, i).into_bytes()
        }

        /// A put (or, with `tombstone`, a delete) of `key` at revision `main`, with a value of
        /// `main % 5` bytes.
        fn write(ks: &mut KeySpace, key: Vec<u8>, main: i64, tombstone: bool) {
            super::write_sized(ks, key, main, tombstone, (main % 5) as usize);
        }

        /// What a compaction at `rev` must leave: keys in order in every index, and no key
        /// with more than one version at or below `rev` or with a tombstone there.
        fn assert_compacted(ks: &KeySpace, rev: i64) {
            let slab = &ks.slab;
            ks.order
                .assert_consistent(&|id| &slab.get(id).key[..], &|id| {
                    slab.get(id).versions.is_live()
                });
            let mut keys = 0;
            for (key, versions) in ks.iter_all() {
                keys += 1;
                assert_eq!(ks.get(key).map(|vs| vs.len()), Some(versions.len()));
                let old = versions.partition_point(|v| v.main <= rev);
                assert!(old <= 1, "{old} versions at or below {rev}");
                assert!(
                    old == 0 || !versions[0].is_tombstone() || versions[0].main == rev,
                    "a tombstone below the compact revision kept"
                );
            }
            assert_eq!(keys, ks.len());
        }

        /// Counting a range from the ordered index's live counts (at the head, and at older
        /// revisions by walking the changes since, three a step) answers what a walk of its
        /// keys answers.
        fn assert_counts(ks: &KeySpace, compacted: i64, rev: i64) {
            let ranges: [(&[u8], &[u8]); 5] = [
                (b"\0", b"\0"),
                (b"/registry/pods/ns1", b"/registry/pods/ns4"),
                (b"/registry/pods/ns3/p00500", b"\0"),
                (b"/registry/pods/ns2/", b"/registry/pods/ns2/p01000"),
                (b"/registry/pods/ns5/p00012", b""),
            ];
            for (k, e) in ranges {
                for at in [compacted, (compacted + rev) / 2, rev - 1, rev] {
                    let at = at.max(compacted);
                    let want = if e.is_empty() {
                        ks.get(k).and_then(|vs| live_at(vs, at)).iter().count()
                    } else {
                        ks.live_in_range(k, e, at).count()
                    };
                    // Three changes a step.
                    let mut walk = ks.count_walk(k, e, at);
                    let got = std::iter::from_fn(|| Some(walk.step(ks, 3)))
                        .flatten()
                        .next();
                    assert_eq!(got, Some(want as u64), "{k:?}..{e:?} at {at} of {rev}");
                }
                let head = ks.live_in_range(k, e, rev).count() as u64;
                assert_eq!(ks.count_live_head(k, e), head, "{k:?}..{e:?} at the head");
            }
            assert_eq!(
                ks.changes_since(compacted),
                ks.changes_from(compacted + 1).count()
            );
        }

        /// Keys with their versions, oldest first, in key order.
        type Keys = Vec<(Box<[u8]>, Vec<Version>)>;

        /// Keys with 1 to 4 versions each (the last a tombstone where asked), revisions rising
        /// from 2, in key order: what a checkpoint hands a loader; and the last revision.
        fn history(shapes: &[(usize, bool)]) -> (Keys, i64) {
            let mut rev = 1;
            let mut keys: Keys = Vec::new();
            for (i, &(n, ends_deleted)) in shapes.iter().enumerate() {
                let mut ks = KeySpace::default();
                for j in 0..n {
                    rev += 1;
                    write(
                        &mut ks,
                        key(i as u16),
                        rev,
                        ends_deleted && j == n - 1 && n > 1,
                    );
                }
                let (k, vs) = ks.iter_all().next().expect("one key written");
                keys.push((k.into(), vs.to_vec()));
            }
            keys.sort_by(|a, b| a.0.cmp(&b.0));
            (keys, rev)
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(40))]

            /// A checkpoint may hold history at or below its compact revision that a
            /// compaction would drop (no store of ours writes one, but the loaders accept it,
            /// and the log does not name those keys): through either loader, the next
            /// compaction still leaves what a visit of every key leaves.
            #[test]
            fn loaded_history_below_the_compact_revision_is_compacted_too(
                shapes in proptest::collection::vec((1usize..5, any::<bool>()), 1..300),
                compact_pct in 0i64..=100,
                at_pct in 0i64..=100,
            ) {
                let (keys, rev) = history(&shapes);
                let compact_rev = rev * compact_pct / 100;
                let at = compact_rev + (rev - compact_rev) * at_pct / 100;
                let loaded = KeySpace::from_sorted(keys.clone().into_iter(), compact_rev).unwrap();
                let mut b = KeySpaceBuilder::new(keys.len(), 0, compact_rev);
                for (k, vs) in keys {
                    b.push_many(k, vs).unwrap();
                }
                for mut ks in [loaded, b.finish().unwrap()] {
                    let mut reference = ks.clone();
                    reference.compact_every_key(at);
                    ks.compact(at);
                    prop_assert!(ks == reference);
                    assert_compacted(&ks, at);
                }
            }

            /// The compaction that visits only the keys the log names leaves exactly what a
            /// visit of every key leaves, over few keys (emptied keys re-pack the ordered
            /// index) and many (they leave it one by one; the first 1500 are enough for
            /// several chunks).
            #[test]
            fn visiting_logged_keys_equals_visiting_every_key(
                keys in 1u16..KEYS,
                preload in 0u16..KEYS,
                ops in proptest::collection::vec(op(), 1..400),
            ) {
                let mut ks = KeySpace::default();
                let (mut rev, mut compacted) = (0i64, 0i64);
                let key = |i: u16| key(i % keys);
                for i in 0..preload.min(keys) {
                    rev += 1;
                    write(&mut ks, key(((u32::from(i) * 7919) % u32::from(keys)) as u16), rev, false);
                }
                for op in ops {
                    match op {
                        Op::Put(i) => {
                            rev += 1;
                            write(&mut ks, key(i), rev, false);
                        }
                        Op::Delete(i) => {
                            if ks.latest_live(&key(i)).is_some() {
                                rev += 1;
                                write(&mut ks, key(i), rev, true);
                            }
                        }
                        Op::Compact(back) => {
                            let at = rev - i64::from(back);
                            if at <= compacted {
                                continue;
                            }
                            let mut reference = ks.clone();
                            reference.compact_every_key(at);
                            ks.compact(at);
                            compacted = at;
                            prop_assert!(ks == reference);
                            assert_compacted(&ks, at);
                            assert_counts(&ks, compacted, rev);
                        }
                    }
                }
                assert_counts(&ks, compacted, rev);
            }
        }
    }

    /// Every index entry's hints name the cache lines of its key and newest value, through
    /// new keys, overwrites, deletes, a compaction and a bulk load.
    #[test]
    fn index_hints_follow_the_newest_value() {
        fn check(ks: &KeySpace) {
            let line = |addr: usize| addr >> 6 << 6;
            let (mut keys, mut exact) = (0, 0);
            for (key, versions) in ks.iter_all() {
                let id = ks.find(key).expect("indexed");
                let hints = ks.index.hints_of(hash_key(key), id).expect("hints");
                let (value, key) = hints.addresses();
                let slot = ks.slab.get(id);
                let newest = versions.last().expect("a version");
                let want_key = line(slot.key.as_ptr().addr());
                if newest.value.is_empty() {
                    assert_eq!((value, key), (want_key, want_key));
                } else {
                    assert_eq!(value, line(newest.value.as_ptr().addr()));
                    // The key's line, unless the two boxes lie too far apart to say.
                    assert!(key == want_key || key == value, "key hint");
                }
                keys += 1;
                exact += usize::from(key == want_key);
            }
            // Boxes of one small store lie within 128 MiB of each other: (nearly) every key's
            // own line is named.
            assert!(
                exact * 100 >= keys * 99,
                "{exact} of {keys} key hints exact"
            );
        }
        let mut ks = KeySpace::default();
        let mut main = 0;
        for round in 0..3 {
            for i in 0..2000u32 {
                main += 1;
                let tombstone = round == 1 && i % 3 == 0;
                let len = if tombstone { 0 } else { 10 + i as usize % 300 };
                let key = format!("/k/{:05}", (i * 7919) % 2000).into_bytes();
                write_sized(&mut ks, key, main, tombstone, len);
            }
            check(&ks);
        }
        ks.compact(main - 1000);
        check(&ks);
        let keys: Vec<(Box<[u8]>, Vec<Version>)> = ks
            .iter_all()
            .map(|(k, vs)| (k.into(), vs.to_vec()))
            .collect();
        let loaded = KeySpace::from_sorted(keys.into_iter(), main - 1000).expect("loads");
        check(&loaded);
    }

    /// The inline version must not make a slot bigger than the 96 bytes it replaces
    /// (40-byte slot + a 56-byte one-version allocation).
    #[test]
    fn slot_stays_small() {
        assert!(
            std::mem::size_of::<Option<Slot>>() <= 80,
            "{}",
            std::mem::size_of::<Option<Slot>>()
        );
    }
}
