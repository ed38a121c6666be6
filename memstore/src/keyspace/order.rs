//! The ordered index of the key space: slot ids in key order, in chunks that each carry a copy
//! of their first key and an order-preserving 16-byte digest per key, so finding a key's place
//! reads the keys themselves only when two digests tie. Each chunk also knows which of its keys
//! are live (newest version a put) and how many, so a range's count at the head revision reads
//! the chunks' counts rather than every key (`count_live`).

use crate::prefetch::prefetch;

/// Most slot ids a chunk holds; a full chunk splits in two (or, when a key is appended after
/// the last one, a new chunk starts so sequential loads leave chunks full).
pub(super) const ORDER_CHUNK: usize = 512;

/// One run of slot ids in key order.
#[derive(Debug, Clone)]
pub(super) struct OrderChunk {
    pub ids: Vec<u32>,
    /// `digest(key, prefix_len)` of each id's key: non-decreasing along `ids`.
    digests: Vec<Digest>,
    /// A copy of the key of `ids[0]` (the top-level search reads no slot).
    first: Box<[u8]>,
    /// `head(first)`: the top-level search reads `first` only when heads tie.
    head: [u8; HEAD_LEN],
    /// Length of a prefix every key of the chunk shares.
    prefix_len: usize,
    /// Whether each id's key is live (its newest version a put): parallel to `ids`.
    live: Vec<bool>,
    /// The number of `true`s in `live`.
    live_count: u32,
}

/// A key's digest: the 16 bytes after its chunk's prefix, big-endian. Sixteen, not eight: keys
/// of one namespace in a chunk that spans two (whose prefix then ends inside the namespace's
/// name) tied on eight bytes, and a tie is settled by reading keys, two misses each
/// (docs/memstore.md, "Session 8").
type Digest = u128;
const DIGEST_BYTES: usize = std::mem::size_of::<Digest>();

/// The `DIGEST_BYTES` bytes of `key` after `prefix_len`, big-endian, zero padded: for keys
/// sharing that prefix, `a < b` implies `digest(a) <= digest(b)`.
fn digest(key: &[u8], prefix_len: usize) -> Digest {
    let rest = key.get(prefix_len..).unwrap_or(&[]);
    let mut b = [0u8; DIGEST_BYTES];
    let n = rest.len().min(DIGEST_BYTES);
    b[..n].copy_from_slice(&rest[..n]);
    Digest::from_be_bytes(b)
}

/// The digest under the shorter prefix `to` of a key whose digest under prefix `from` is `d`,
/// for a key starting with `first[..from]`: the bytes `first[to..from]`, then the top of `d`.
fn reprefix(d: Digest, first: &[u8], from: usize, to: usize) -> Digest {
    let shift = from - to;
    if shift >= DIGEST_BYTES {
        return digest(first, to);
    }
    let mut b = [0u8; DIGEST_BYTES];
    b[..shift].copy_from_slice(&first[to..from]);
    Digest::from_be_bytes(b) | (d >> (8 * shift))
}

/// Bytes of a chunk's first key kept inline for the top-level search.
const HEAD_LEN: usize = 32;

/// The first `HEAD_LEN` bytes of `key`, zero padded: `a < b` implies `head(a) <= head(b)`.
fn head(key: &[u8]) -> [u8; HEAD_LEN] {
    let mut h = [0u8; HEAD_LEN];
    let n = key.len().min(HEAD_LEN);
    h[..n].copy_from_slice(&key[..n]);
    h
}

/// Whether a chunk starting at `first` (with `head(first)` = `first_head`) starts at or
/// below `key`, reading `first` only when the heads tie.
fn starts_at_or_below(
    first_head: &[u8; HEAD_LEN],
    first: &[u8],
    key_head: &[u8; HEAD_LEN],
    key: &[u8],
) -> bool {
    match first_head.cmp(key_head) {
        std::cmp::Ordering::Less => true,
        std::cmp::Ordering::Greater => false,
        std::cmp::Ordering::Equal => first <= key,
    }
}

/// Digests per cache line.
const PER_LINE: usize = 64 / DIGEST_BYTES;
/// Parts the first round of `first_not_below` splits a chunk's digests into.
const PARTS: usize = 8;

/// `digests.partition_point(|&x| x < d)` in two rounds of cache misses instead of one per
/// halving: a chunk's 8 KiB of digests is rarely cached when a key lands in it at random, and
/// each halving of a plain binary search waits for the line the previous one chose. The first
/// round reads the digests at the seven boundaries of eight equal parts, all requested at
/// once; the second requests every line of the one part left, then searches it.
fn first_not_below(digests: &[Digest], d: Digest) -> usize {
    let n = digests.len();
    if n <= PARTS * PER_LINE {
        return digests.partition_point(|&x| x < d);
    }
    let at = |k: usize| k * n / PARTS;
    for k in 1..PARTS {
        prefetch(&digests[at(k)]);
    }
    // The boundaries below `d` (they are sorted, so these are the first ones).
    let below = (1..PARTS).take_while(|&k| digests[at(k)] < d).count();
    let (lo, hi) = (at(below), at(below + 1));
    for line in digests[lo..hi].chunks(PER_LINE) {
        prefetch(&line[0]);
    }
    lo + digests[lo..hi].partition_point(|&x| x < d)
}

/// Length of the longest common prefix of `a` and `b`.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    // Eight bytes at a time, then the first differing byte of the differing word.
    const W: usize = 8;
    let n = a.len().min(b.len());
    let (words_a, _) = a[..n].as_chunks::<W>();
    let (words_b, _) = b[..n].as_chunks::<W>();
    for (w, (x, y)) in words_a.iter().zip(words_b).enumerate() {
        let (x, y) = (u64::from_le_bytes(*x), u64::from_le_bytes(*y));
        if x != y {
            return w * W + ((x ^ y).trailing_zeros() / 8) as usize;
        }
    }
    let i = words_a.len() * W;
    i + a[i..n]
        .iter()
        .zip(&b[i..n])
        .take_while(|(x, y)| x == y)
        .count()
}

impl OrderChunk {
    /// A chunk of `ids` (non-empty, in key order) with its first key, prefix and digests
    /// computed from the keys, and their liveness from `live_of`.
    fn build<'k>(
        ids: Vec<u32>,
        key_of: &impl Fn(u32) -> &'k [u8],
        live_of: &impl Fn(u32) -> bool,
    ) -> OrderChunk {
        let mut live = Vec::with_capacity(ids.capacity());
        live.extend(ids.iter().map(|&id| live_of(id)));
        let live_count = live.iter().filter(|&&l| l).count() as u32;
        let mut c = OrderChunk {
            ids,
            digests: Vec::new(),
            first: Box::default(),
            head: [0; HEAD_LEN],
            prefix_len: 0,
            live,
            live_count,
        };
        c.refresh(key_of);
        c
    }

    /// Live keys among positions `from..to` (clamped to the chunk).
    fn live_between(&self, from: usize, to: usize) -> u64 {
        let to = to.min(self.live.len());
        if from >= to {
            return 0;
        }
        if from == 0 && to == self.live.len() {
            return u64::from(self.live_count);
        }
        self.live[from..to].iter().filter(|&&l| l).count() as u64
    }

    /// Recomputes the first key, the longest shared prefix (that of the first and last keys)
    /// and every digest.
    fn refresh<'k>(&mut self, key_of: &impl Fn(u32) -> &'k [u8]) {
        let (Some(&first), Some(&last)) = (self.ids.first(), self.ids.last()) else {
            return;
        };
        let first = key_of(first);
        self.prefix_len = common_prefix(first, key_of(last));
        self.first = first.into();
        self.head = head(first);
        self.digests.clear();
        self.digests.reserve_exact(self.ids.capacity());
        let l = self.prefix_len;
        self.digests
            .extend(self.ids.iter().map(|&id| digest(key_of(id), l)));
    }

    /// Position of the first key >= `key`, for a `key` not below this chunk's first key (or
    /// any key, for the first chunk): the keys are read only where digests tie.
    fn lower_bound<'k>(&self, key: &[u8], key_of: &impl Fn(u32) -> &'k [u8]) -> usize {
        let l = self.prefix_len;
        if key.get(..l) != self.first.get(..l) {
            // Not sharing the chunk's prefix: past every key of it, or before all of them.
            return if key < &self.first[..] {
                0
            } else {
                self.ids.len()
            };
        }
        let d = digest(key, l);
        let lo = first_not_below(&self.digests, d);
        let ties = self.digests[lo..].partition_point(|&x| x == d);
        lo + self.ids[lo..lo + ties].partition_point(|&id| key_of(id) < key)
    }

    /// Where to split a full chunk: near the middle, between the two neighbours whose keys
    /// share the shortest prefix (read off the digests), so each half covers fewer groups of
    /// similar keys (namespaces, resources) and its own shared prefix grows.
    fn split_point(&self) -> usize {
        let (from, to) = (ORDER_CHUNK / 4, 3 * ORDER_CHUNK / 4);
        let shared = |p: usize| (self.digests[p - 1] ^ self.digests[p]).leading_zeros();
        (from..=to)
            .min_by_key(|&p| (shared(p), p.abs_diff(ORDER_CHUNK / 2)))
            .unwrap_or(ORDER_CHUNK / 2)
    }

    /// The chunk of the ids from `at` on, which this one gives up. Both keep this chunk's
    /// prefix and digests (still valid for either half; the halves may share longer prefixes,
    /// but finding them means reading every key): only the new chunk's first key is read.
    fn split_off<'k>(&mut self, at: usize, key_of: &impl Fn(u32) -> &'k [u8]) -> OrderChunk {
        let mut ids = Vec::with_capacity(ORDER_CHUNK);
        ids.extend_from_slice(&self.ids[at..]);
        let mut digests = Vec::with_capacity(ORDER_CHUNK);
        digests.extend_from_slice(&self.digests[at..]);
        let mut live = Vec::with_capacity(ORDER_CHUNK);
        live.extend_from_slice(&self.live[at..]);
        let live_count = live.iter().filter(|&&l| l).count() as u32;
        self.ids.truncate(at);
        self.digests.truncate(at);
        self.live.truncate(at);
        self.live_count -= live_count;
        let first: Box<[u8]> = key_of(ids[0]).into();
        OrderChunk {
            ids,
            digests,
            head: head(&first),
            first,
            prefix_len: self.prefix_len,
            live,
            live_count,
        }
    }

    /// Puts `id` (whose key is `key`, live or not) at `pos`; the chunk has room.
    fn insert(&mut self, pos: usize, id: u32, key: &[u8], live: bool) {
        let shared = common_prefix(key, &self.first);
        if shared < self.prefix_len {
            // Every key here starts with `first[..prefix_len]`, so its digest under the shorter
            // prefix is those bytes from `shared` on, then the top of its digest now: no key
            // is read.
            let (from, first) = (self.prefix_len, &self.first);
            for d in &mut self.digests {
                *d = reprefix(*d, first, from, shared);
            }
            self.prefix_len = shared;
        }
        if pos == 0 {
            self.first = key.into();
            self.head = head(key);
        }
        self.ids.insert(pos, id);
        self.digests.insert(pos, digest(key, self.prefix_len));
        self.live.insert(pos, live);
        self.live_count += u32::from(live);
    }
}

/// Slot ids in key order, in chunks of at most `ORDER_CHUNK`.
#[derive(Debug, Clone, Default)]
pub(super) struct OrderIndex {
    pub chunks: Vec<OrderChunk>,
}

impl OrderIndex {
    /// Chunks from slot ids in key order, each at least 3/4 full: a chunk ends where, in its
    /// last quarter, two neighbouring keys share the shortest prefix (a namespace boundary,
    /// say), so most chunks hold one group of similar keys.
    pub fn from_sorted<'k>(
        ids: &[u32],
        key_of: &impl Fn(u32) -> &'k [u8],
        live_of: &impl Fn(u32) -> bool,
    ) -> OrderIndex {
        let mut chunks = Vec::with_capacity(ids.len() / (3 * ORDER_CHUNK / 4) + 1);
        let mut rest = ids;
        while !rest.is_empty() {
            let take = if rest.len() <= ORDER_CHUNK {
                rest.len()
            } else {
                let shared = |p: usize| common_prefix(key_of(rest[p - 1]), key_of(rest[p]));
                (3 * ORDER_CHUNK / 4..=ORDER_CHUNK)
                    .rev()
                    .min_by_key(|&p| shared(p))
                    .unwrap_or(ORDER_CHUNK)
            };
            let mut v = Vec::with_capacity(ORDER_CHUNK);
            v.extend_from_slice(&rest[..take]);
            chunks.push(OrderChunk::build(v, key_of, live_of));
            rest = &rest[take..];
        }
        OrderIndex { chunks }
    }

    /// Position of the first key >= `key`: (chunk, offset), offset possibly past the chunk.
    pub fn lower_bound<'k>(&self, key: &[u8], key_of: &impl Fn(u32) -> &'k [u8]) -> (usize, usize) {
        let key_head = head(key);
        let c = self
            .chunks
            .partition_point(|ch| starts_at_or_below(&ch.head, &ch.first, &key_head, key));
        let c = c.saturating_sub(1);
        match self.chunks.get(c) {
            None => (0, 0),
            Some(ch) => (c, ch.lower_bound(key, key_of)),
        }
    }

    /// Takes out slot `id`, whose key is `key` (still readable through `key_of`); a chunk left
    /// empty goes. The chunk's prefix stays valid for the keys left (it may be shorter than
    /// theirs), so no digest changes; only a new first key is copied.
    pub fn remove<'k>(&mut self, id: u32, key: &[u8], key_of: &impl Fn(u32) -> &'k [u8]) {
        let (c, pos) = self.lower_bound(key, key_of);
        let ch = &mut self.chunks[c];
        assert_eq!(
            ch.ids.get(pos),
            Some(&id),
            "invariant: a stored key is found at its own place"
        );
        ch.ids.remove(pos);
        ch.digests.remove(pos);
        if ch.live.remove(pos) {
            ch.live_count -= 1;
        }
        match ch.ids.first() {
            None => {
                self.chunks.remove(c);
            }
            Some(&first) if pos == 0 => {
                ch.first = key_of(first).into();
                ch.head = head(&ch.first);
            }
            Some(_) => {}
        }
    }

    /// Where a new key goes; a key after every other one (sequential loads) costs one
    /// comparison.
    pub fn insert_position<'k>(
        &self,
        key: &[u8],
        key_of: &impl Fn(u32) -> &'k [u8],
    ) -> (usize, usize) {
        if let Some(ch) = self.chunks.last()
            && let Some(&id) = ch.ids.last()
            && key_of(id) < key
        {
            return (self.chunks.len() - 1, ch.ids.len());
        }
        self.lower_bound(key, key_of)
    }

    /// Puts slot `id` (key `key`, live or not) at position (`chunk`, `pos`) as
    /// `insert_position` found it.
    #[allow(clippy::too_many_arguments)]
    pub fn insert<'k>(
        &mut self,
        chunk: usize,
        pos: usize,
        id: u32,
        key: &[u8],
        live: bool,
        key_of: &impl Fn(u32) -> &'k [u8],
    ) {
        let fresh = |id: u32| {
            let mut ids = Vec::with_capacity(ORDER_CHUNK);
            ids.push(id);
            OrderChunk::build(ids, &|_| key, &|_| live)
        };
        if self.chunks.is_empty() {
            self.chunks.push(fresh(id));
            return;
        }
        let last = self.chunks.len() - 1;
        // The end of one chunk is the start of the next: take the one whose keys are more
        // like this one, so chunks stay within a group of similar keys (and digests rarely tie).
        let (chunk, pos) = match self.chunks.get(chunk + 1) {
            Some(next)
                if pos == self.chunks[chunk].ids.len()
                    && common_prefix(key, &next.first)
                        > common_prefix(key, &self.chunks[chunk].first) =>
            {
                (chunk + 1, 0)
            }
            _ => (chunk, pos),
        };
        let ch = &mut self.chunks[chunk];
        if ch.ids.len() < ORDER_CHUNK {
            ch.insert(pos, id, key, live);
        } else if chunk == last && pos == ch.ids.len() {
            self.chunks.push(fresh(id));
        } else {
            let at = ch.split_point();
            let mut tail = ch.split_off(at, key_of);
            if pos < at || (pos == at && key < &tail.first[..]) {
                ch.insert(pos, id, key, live);
            } else {
                tail.insert(pos - at, id, key, live);
            }
            self.chunks.insert(chunk + 1, tail);
        }
    }

    /// Records that the stored key `key` became live (its newest version a put) or not.
    pub fn set_live<'k>(&mut self, key: &[u8], live: bool, key_of: &impl Fn(u32) -> &'k [u8]) {
        let (c, pos) = self.lower_bound(key, key_of);
        let ch = &mut self.chunks[c];
        debug_assert!(
            ch.ids.get(pos).is_some_and(|&id| key_of(id) == key),
            "invariant: a stored key is found at its own place"
        );
        if ch.live[pos] != live {
            ch.live[pos] = live;
            if live {
                ch.live_count += 1;
            } else {
                ch.live_count -= 1;
            }
        }
    }

    /// Live keys from position `from` (as `lower_bound` gives it) up to, not including,
    /// position `to` (the end of the index: `(chunks.len(), 0)`): whole chunks by their
    /// counts, the two ends by their flags.
    pub fn count_live(&self, from: (usize, usize), to: (usize, usize)) -> u64 {
        let ((fc, fp), (tc, tp)) = (from, to);
        if (fc, fp) >= (tc, tp) {
            return 0;
        }
        if fc == tc {
            return self.chunks[fc].live_between(fp, tp);
        }
        let mut n = self.chunks[fc].live_between(fp, usize::MAX);
        n += self.chunks[fc + 1..tc.min(self.chunks.len())]
            .iter()
            .map(|ch| u64::from(ch.live_count))
            .sum::<u64>();
        if let Some(ch) = self.chunks.get(tc) {
            n += ch.live_between(0, tp);
        }
        n
    }
}

#[cfg(test)]
impl OrderIndex {
    /// Panics unless every chunk is non-empty and holds its ids in strictly ascending key
    /// order after the previous chunk's, with its first key, a prefix all its keys share and
    /// the digests those keys give.
    pub(super) fn assert_consistent<'k>(
        &self,
        key_of: &impl Fn(u32) -> &'k [u8],
        live_of: &impl Fn(u32) -> bool,
    ) {
        let mut before: Option<&[u8]> = None;
        for ch in &self.chunks {
            assert!(!ch.ids.is_empty(), "an empty chunk");
            assert_eq!(&ch.first[..], key_of(ch.ids[0]), "first key");
            assert_eq!(ch.head, head(&ch.first));
            for (&id, &d) in ch.ids.iter().zip(&ch.digests) {
                let k = key_of(id);
                assert!(before.is_none_or(|b| b < k), "keys out of order");
                assert!(k.starts_with(&ch.first[..ch.prefix_len]), "prefix");
                assert_eq!(d, digest(k, ch.prefix_len), "digest");
                before = Some(k);
            }
            assert_eq!(ch.ids.len(), ch.digests.len());
            let live: Vec<bool> = ch.ids.iter().map(|&id| live_of(id)).collect();
            assert_eq!(ch.live, live, "live flags");
            assert_eq!(ch.live_count as usize, live.iter().filter(|&&l| l).count());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The two-round search answers as `partition_point` does, for every probe (below, at,
    /// between and above the digests, on runs of equal ones) and every length around its
    /// cut-over to a plain search.
    #[test]
    fn first_not_below_agrees_with_partition_point() {
        for n in [0, 1, 7, 63, 64, 65, 71, 72, 100, 511, 512, 600] {
            let digests: Vec<Digest> = (0..n as Digest).map(|i| (i / 3) * 10).collect();
            let top = digests.last().copied().unwrap_or(0) + 20;
            for d in 0..top {
                assert_eq!(
                    first_not_below(&digests, d),
                    digests.partition_point(|&x| x < d),
                    "{n} digests, probe {d}"
                );
            }
        }
    }

    /// The word-at-a-time common prefix agrees with the byte-by-byte one.
    #[test]
    fn common_prefix_agrees_with_bytewise() {
        let base: Vec<u8> = (0..40u8).collect();
        for len_a in [0, 1, 7, 8, 9, 16, 17, 40] {
            for differ_at in 0..=len_a {
                let a = &base[..len_a];
                let mut b = base[..40].to_vec();
                if differ_at < b.len() {
                    b[differ_at] ^= 0x40;
                }
                for len_b in [0, differ_at, 40] {
                    let b = &b[..len_b];
                    let want = a.iter().zip(b).take_while(|(x, y)| x == y).count();
                    assert_eq!(common_prefix(a, b), want, "{a:?} {b:?}");
                }
            }
        }
    }

    /// A prefix shortened by every amount from 1 to past 8 bytes, at either end of a chunk:
    /// the digests recomputed on the shorter prefix equal those computed from the keys.
    /// Every key of `ch` starts with its prefix, and its digests are those computed from the
    /// keys.
    fn assert_prefix_and_digests<'k>(
        ch: &OrderChunk,
        key_of: &impl Fn(u32) -> &'k [u8],
        after: &str,
    ) {
        let first = key_of(ch.ids[0]);
        assert!(
            ch.ids
                .iter()
                .all(|&i| key_of(i).starts_with(&first[..ch.prefix_len]))
        );
        let want: Vec<Digest> = ch
            .ids
            .iter()
            .map(|&i| digest(key_of(i), ch.prefix_len))
            .collect();
        assert_eq!(ch.digests, want, "digests after inserting {after}");
    }

    #[test]
    fn shortened_prefix_recomputes_digests_exactly() {
        let keys: Vec<Vec<u8>> = [
            "/registry/pods/ns0000/pod-0000000100-a",
            "/registry/pods/ns0000/pod-0000000100-b",
            "/registry/pods/ns0000/pod-0000000100-c",
            "/registry/pods/ns0000/pod-0000000100",
            "/registry/pods/ns0000/pod-0000000101",
            "/registry/pods/ns0000/pod-0000000199",
            "/registry/pods/ns0000/pod-0000002",
            "/registry/pods/ns0000/pod-00009",
            "/registry/pods/ns0000/pod-1",
            "/registry/pods/ns0000/zz",
            "/registry/pods/ns0001/pod",
            "/registry/pods/ns1",
            "/registry/q",
            "/",
            "",
        ]
        .iter()
        .map(|k| k.as_bytes().to_vec())
        .collect();
        let key_of = |id: u32| &keys[id as usize][..];
        let mut ch = OrderChunk::build(vec![0, 1], &key_of, &|_| true);
        // Each next key, placed at its sorted position (front or back), shortens the prefix.
        let mut sorted: Vec<u32> = vec![0, 1];
        for id in 2..keys.len() as u32 {
            let pos = sorted.partition_point(|&s| key_of(s) < key_of(id));
            sorted.insert(pos, id);
            ch.insert(pos, id, key_of(id), true);
            assert_eq!(ch.ids, sorted);
            assert_prefix_and_digests(&ch, &key_of, &String::from_utf8_lossy(key_of(id)));
        }
        assert_eq!(ch.prefix_len, 0);
    }

    /// Inserts keys one by one (in a scrambled order) and checks the index against a sorted
    /// list after each insert, and `lower_bound` for present and absent keys.
    #[test]
    fn inserts_in_any_order_keep_key_order() {
        let keys: Vec<Vec<u8>> = (0..3000u32)
            .map(|i| {
                let j = i.wrapping_mul(2_654_435_761) % 3000;
                format!("/registry/pods/ns{:02}/pod-{:05}", j / 700, j).into_bytes()
            })
            .chain([
                b"".to_vec(),
                b"\0".to_vec(),
                b"/registry".to_vec(),
                vec![0xff; 20],
            ])
            .collect();
        let key_of = |id: u32| &keys[id as usize][..];
        let mut index = OrderIndex::default();
        let mut sorted: Vec<u32> = Vec::new();
        for (id, key) in keys.iter().enumerate() {
            let id = id as u32;
            let (c, p) = index.insert_position(key, &key_of);
            index.insert(c, p, id, key, true, &key_of);
            let at = sorted.partition_point(|&s| key_of(s) < &key[..]);
            sorted.insert(at, id);
            if id.is_multiple_of(97) || id as usize + 1 == keys.len() {
                let flat: Vec<u32> = index.chunks.iter().flat_map(|c| c.ids.clone()).collect();
                assert_eq!(flat, sorted, "after inserting key {id}");
            }
            // Digests (re-computed when the prefix shortens) equal those computed from the keys.
            for ch in &index.chunks {
                assert_prefix_and_digests(ch, &key_of, &format!("key {id}"));
            }
        }
        for probe in keys
            .iter()
            .cloned()
            .chain([b"/registry/pods/ns01/pod-00700x".to_vec(), b"zz".to_vec()])
        {
            let (c, p) = index.lower_bound(&probe, &key_of);
            let before: usize = index.chunks[..c].iter().map(|c| c.ids.len()).sum();
            let want = sorted.partition_point(|&s| key_of(s) < &probe[..]);
            assert_eq!(before + p, want, "lower bound of {probe:?}");
        }
        let rebuilt = OrderIndex::from_sorted(&sorted, &key_of, &|_| true);
        for probe in &keys {
            let (c, p) = rebuilt.lower_bound(probe, &key_of);
            assert_eq!(key_of(rebuilt.chunks[c].ids[p]), &probe[..]);
        }
    }

    /// Live counts follow inserts (through splits), liveness changes and removals: the count
    /// between any two positions equals the live keys between them, counted one by one.
    #[test]
    fn live_counts_follow_inserts_changes_and_removals() {
        let n = 4_000u32;
        let keys: Vec<Vec<u8>> = (0..n)
            .map(|i| {
                // A permutation of 0..n (the multiplier is prime to n): distinct keys.
                let j = u64::from(i) * 2_654_435_761 % u64::from(n);
                format!("/registry/pods/ns{:02}/pod-{:05}", j / 900, j).into_bytes()
            })
            .collect();
        let key_of = |id: u32| &keys[id as usize][..];
        let mut live: Vec<bool> = (0..n).map(|i| i % 3 != 0).collect();
        let mut index = OrderIndex::default();
        for id in 0..n {
            let key = key_of(id);
            let (c, p) = index.insert_position(key, &key_of);
            index.insert(c, p, id, key, live[id as usize], &key_of);
        }
        assert!(index.chunks.len() > 8, "splits happened");
        for id in (0..n).step_by(7) {
            live[id as usize] = !live[id as usize];
            index.set_live(key_of(id), live[id as usize], &key_of);
        }
        let mut present = vec![true; n as usize];
        for id in (0..n).step_by(11) {
            index.remove(id, key_of(id), &key_of);
            present[id as usize] = false;
        }
        let live_of = |id: u32| live[id as usize];
        index.assert_consistent(&key_of, &live_of);
        let mut sorted: Vec<u32> = (0..n).filter(|&id| present[id as usize]).collect();
        sorted.sort_by_key(|&id| key_of(id));
        let end = (index.chunks.len(), 0);
        let probes: Vec<Vec<u8>> = (0..60u32)
            .map(|i| format!("/registry/pods/ns{:02}/pod-{:05}", i % 5, i * 67).into_bytes())
            .chain([
                b"".to_vec(),
                b"/registry/pods/ns01".to_vec(),
                b"zz".to_vec(),
            ])
            .collect();
        for a in &probes {
            for b in &probes {
                let (from, to) = (index.lower_bound(a, &key_of), index.lower_bound(b, &key_of));
                let want = sorted
                    .iter()
                    .filter(|&&id| key_of(id) >= &a[..] && key_of(id) < &b[..] && live_of(id))
                    .count() as u64;
                assert_eq!(index.count_live(from, to), want, "{a:?}..{b:?}");
            }
            let want = sorted
                .iter()
                .filter(|&&id| key_of(id) >= &a[..] && live_of(id))
                .count() as u64;
            assert_eq!(index.count_live(index.lower_bound(a, &key_of), end), want);
        }
        let rebuilt = OrderIndex::from_sorted(&sorted, &key_of, &live_of);
        rebuilt.assert_consistent(&key_of, &live_of);
        assert_eq!(
            rebuilt.count_live((0, 0), (rebuilt.chunks.len(), 0)),
            index.count_live((0, 0), end)
        );
    }
}
