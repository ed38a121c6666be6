//! Request-id de-duplication: the ids applied within the window, as fixed 16-byte keys in a
//! hash map (id -> revision of the first apply) plus a queue in apply (= journal time) order
//! for pruning. About 50 bytes per remembered request, no allocation per request.

use std::collections::VecDeque;
use std::hash::BuildHasher;

use hashbrown::HashMap;

/// Bytes of a de-duplication key. Frontends, the compactor and `strata admin` all write 16-byte
/// random request ids, which are used as they are; any other length is digested to 16 bytes.
pub const KEY_BYTES: usize = 16;

/// Seed of the map's hasher (any fixed value: the map's order is never observed).
const HASH_SEED: u64 = 0x5eed_0000_dedb_0001;

/// A request id reduced to its de-duplication key.
pub type Key = [u8; KEY_BYTES];

/// The key of request id `id`: the id itself when it has 16 bytes, else a 128-bit digest of it
/// (two independent 64-bit multiply-xorshift lanes over its bytes and length). The digest is
/// fixed forever: every replica, and every checkpoint, must map an id to the same key. Ids are
/// chosen by Strata's own writers, never by clients, so a deliberate collision is not a concern.
pub fn key_of(id: &[u8]) -> Key {
    if let Ok(k) = <Key>::try_from(id) {
        return k;
    }
    let mut a: u64 = 0x243f_6a88_85a3_08d3 ^ id.len() as u64;
    let mut b: u64 = 0x1319_8a2e_0370_7344 ^ (id.len() as u64).rotate_left(32);
    for chunk in id.chunks(8) {
        let mut w = [0u8; 8];
        w[..chunk.len()].copy_from_slice(chunk);
        let w = u64::from_le_bytes(w);
        a = mix(a ^ w);
        b = mix(b.wrapping_add(w).rotate_left(17));
    }
    let mut k = [0u8; KEY_BYTES];
    k[..8].copy_from_slice(&mix(a ^ 0xa409_3822_299f_31d0).to_le_bytes());
    k[8..].copy_from_slice(&mix(b ^ 0x082e_fa98_ec4e_6c89).to_le_bytes());
    k
}

/// splitmix64's finaliser.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// One remembered request, as the queue (and a checkpoint) holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) struct Remembered {
    pub time_ms: i64,
    pub revision: i64,
    pub key: Key,
}

/// The request ids applied within the window.
#[derive(Debug, Clone)]
pub(crate) struct Dedup {
    /// key -> revision right after the first apply.
    by_key: HashMap<Key, i64, foldhash::fast::FixedState>,
    /// Every key of `by_key` once, oldest first (times never decrease).
    queue: VecDeque<Remembered>,
}

impl Default for Dedup {
    fn default() -> Self {
        Dedup {
            by_key: HashMap::with_hasher(foldhash::fast::FixedState::with_seed(HASH_SEED)),
            queue: VecDeque::new(),
        }
    }
}

impl PartialEq for Dedup {
    fn eq(&self, other: &Self) -> bool {
        // The queue determines the map (checked on every insert and load).
        self.queue == other.queue
    }
}

impl Eq for Dedup {}

impl Dedup {
    /// The revision of the first apply of `id`, if it is remembered.
    pub fn get(&self, id: &[u8]) -> Option<i64> {
        if self.by_key.is_empty() {
            return None;
        }
        self.by_key.get(&key_of(id)).copied()
    }

    /// Remembers `id` (not remembered yet) as applied at `time_ms`, ending at `revision`.
    /// `time_ms` must not be older than the newest remembered time.
    pub fn insert(&mut self, id: &[u8], time_ms: i64, revision: i64) {
        let key = key_of(id);
        if let hashbrown::hash_map::Entry::Vacant(v) = self.by_key.entry(key) {
            v.insert(revision);
            self.queue.push_back(Remembered {
                time_ms,
                revision,
                key,
            });
        }
    }

    /// Forgets every id applied before `horizon_ms`.
    pub fn prune(&mut self, horizon_ms: i64) {
        while let Some(r) = self.queue.front() {
            if r.time_ms >= horizon_ms {
                break;
            }
            self.by_key.remove(&r.key);
            self.queue.pop_front();
        }
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &Remembered> {
        self.queue.iter()
    }

    /// Rebuilds from records oldest first (a checkpoint's); refuses times going backwards or a
    /// key twice. The map is filled in the order of the keys' home buckets (see
    /// [`bucket_order`]), so a large window is written into it front to back instead of at
    /// random.
    pub fn from_records(
        records: impl ExactSizeIterator<Item = Remembered>,
    ) -> Result<Dedup, String> {
        let n = records.len();
        let mut queue = VecDeque::with_capacity(n);
        let mut last = i64::MIN;
        for r in records {
            if r.time_ms < last {
                return Err("de-duplication records out of time order".into());
            }
            last = r.time_ms;
            queue.push_back(r);
        }
        let mut by_key =
            HashMap::with_capacity_and_hasher(n, foldhash::fast::FixedState::with_seed(HASH_SEED));
        let records: &[Remembered] = queue.make_contiguous();
        let hasher = by_key.hasher().clone();
        let order = bucket_order(records, by_key.capacity(), |r| hasher.hash_one(r.key));
        for i in order {
            let r = &records[i as usize];
            if by_key.insert(r.key, r.revision).is_some() {
                return Err("a de-duplication key recorded twice".into());
            }
        }
        Ok(Dedup { by_key, queue })
    }
}

/// log2 of the partitions [`bucket_order`] sorts into.
const BULK_PARTITION_BITS: u32 = 12;

/// Positions of `records` ordered by the home bucket of each one's hash in a hashbrown table
/// with room for `capacity` entries (a counting sort on the bucket index's top bits). Inserting
/// in this order touches the table front to back: about one cache miss per table line instead
/// of one per record.
fn bucket_order<T>(records: &[T], capacity: usize, hash: impl Fn(&T) -> u64) -> Vec<u32> {
    // hashbrown keeps 7/8 of a power-of-two bucket count usable (all of it below 8 buckets).
    let buckets = (capacity / 7 * 8).max(capacity).max(1).next_power_of_two();
    let bits = buckets.trailing_zeros();
    let shift = bits.saturating_sub(BULK_PARTITION_BITS);
    let mask = buckets - 1;
    let parts: Vec<u16> = records
        .iter()
        .map(|r| ((hash(r) as usize & mask) >> shift) as u16)
        .collect();
    let mut starts = vec![0usize; (1usize << bits.min(BULK_PARTITION_BITS)) + 1];
    for &p in &parts {
        starts[p as usize + 1] += 1;
    }
    for i in 1..starts.len() {
        starts[i] += starts[i - 1];
    }
    let mut order = vec![0u32; records.len()];
    for (i, &p) in parts.iter().enumerate() {
        order[starts[p as usize]] =
            u32::try_from(i).expect("invariant: a window holds fewer than 2^32 request ids");
        starts[p as usize] += 1;
    }
    order
}

impl crate::MemStore {
    /// How many request ids the de-duplication window holds.
    pub fn remembered_request_ids(&self) -> usize {
        self.state.dedup.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sixteen_byte_ids_are_their_own_keys_and_others_are_digested_stably() {
        let id = [7u8; 16];
        assert_eq!(key_of(&id), id);
        // Pinned: the digest may never change (checkpoints and replicas depend on it).
        let hex: String = key_of(b"abc").iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "5176db222bd5ceb9e7cc3d54e04597c4");
        assert_ne!(key_of(b"abc"), key_of(b"abd"));
        assert_ne!(key_of(&[0u8; 8]), key_of(&[0u8; 9]), "length counts");
        assert_ne!(key_of(&[]), key_of(&[0u8]));
        let mut seen = std::collections::HashSet::new();
        for i in 0..100_000u64 {
            assert!(seen.insert(key_of(&i.to_le_bytes())), "collision at {i}");
        }
    }

    #[test]
    fn prune_forgets_only_older_records() {
        let mut d = Dedup::default();
        d.insert(b"a", 10, 2);
        d.insert(b"b", 20, 3);
        d.insert(b"a", 30, 9); // already remembered: ignored
        assert_eq!(d.get(b"a"), Some(2));
        d.prune(20);
        assert_eq!(d.get(b"a"), None);
        assert_eq!(d.get(b"b"), Some(3));
        assert_eq!(d.len(), 1);
        let copy = Dedup::from_records(d.iter().copied().collect::<Vec<_>>().into_iter()).unwrap();
        assert_eq!(copy, d);
        assert_eq!(copy.get(b"b"), Some(3));
    }

    /// Records of `n` pseudo-random 16-byte ids, one per millisecond.
    fn records(n: u64) -> Vec<Remembered> {
        (0..n)
            .map(|i| {
                let mut key = [0u8; KEY_BYTES];
                key[..8].copy_from_slice(&mix(i).to_le_bytes());
                key[8..].copy_from_slice(&mix(i ^ 0x5555).to_le_bytes());
                Remembered {
                    time_ms: i as i64,
                    revision: i as i64 + 1,
                    key,
                }
            })
            .collect()
    }

    /// The window rebuilt one insert at a time, as before the bucket-order load.
    fn by_inserts(records: &[Remembered]) -> Dedup {
        let mut d = Dedup::default();
        for r in records {
            d.insert(&r.key, r.time_ms, r.revision);
        }
        d
    }

    #[test]
    fn bucket_order_load_equals_one_insert_at_a_time() {
        for n in [0, 1, 7, 8, 100, 5_000, 70_000] {
            let rs = records(n);
            let bulk = Dedup::from_records(rs.iter().copied()).unwrap();
            let one_by_one = by_inserts(&rs);
            assert_eq!(bulk, one_by_one, "{n} records");
            assert_eq!(bulk.by_key, one_by_one.by_key, "{n} records");
            for r in rs.iter().step_by(97) {
                assert_eq!(bulk.get(&r.key), Some(r.revision));
            }
        }
        // A key twice, or times going backwards, are still refused.
        let mut rs = records(1_000);
        rs[900].key = rs[10].key;
        assert!(Dedup::from_records(rs.into_iter()).is_err());
        let mut rs = records(1_000);
        rs[500].time_ms = 3;
        assert!(Dedup::from_records(rs.into_iter()).is_err());
    }

    /// Wall time of rebuilding a 1M-id window both ways, alternating (the machine is shared):
    /// `cargo test --release -p strata-memstore --lib bucket_order_load_timing -- --ignored
    /// --nocapture`.
    #[test]
    #[ignore]
    fn bucket_order_load_timing() {
        // CPU time of this thread (utime + stime, clock ticks of 10 ms): steadier than wall
        // time on a shared machine.
        fn cpu_s() -> f64 {
            let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap_or_default();
            let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
            let f: Vec<f64> = after
                .split_whitespace()
                .map(|x| x.parse().unwrap_or(0.0))
                .collect();
            (f.get(11).copied().unwrap_or(0.0) + f.get(12).copied().unwrap_or(0.0)) / 100.0
        }
        let rs = records(1_000_000);
        for run in 0..5 {
            let (t, c) = (std::time::Instant::now(), cpu_s());
            let mut a = Dedup {
                by_key: HashMap::with_capacity_and_hasher(
                    rs.len(),
                    foldhash::fast::FixedState::with_seed(HASH_SEED),
                ),
                queue: VecDeque::with_capacity(rs.len()),
            };
            for r in &rs {
                a.insert(&r.key, r.time_ms, r.revision);
            }
            let inserts = (t.elapsed().as_secs_f64(), cpu_s() - c);
            drop(a);
            let (t, c) = (std::time::Instant::now(), cpu_s());
            let b = Dedup::from_records(rs.iter().copied()).unwrap();
            let bulk = (t.elapsed().as_secs_f64(), cpu_s() - c);
            drop(b);
            println!(
                "run {run}: one insert at a time {:.3} s ({:.2} s CPU), bucket order {:.3} s ({:.2} s CPU)",
                inserts.0, inserts.1, bulk.0, bulk.1
            );
        }
    }
}
