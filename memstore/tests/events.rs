//! Event replay (`MemStore::events`) against a reference built from every `Applied::events`:
//! many keys (so wide ranges walk the change log and narrow ones merge per-key histories), txns
//! with several changes per revision, lease revokes and range deletes with many, compactions,
//! every `max` cut (never splitting a revision), and the same answers after a checkpoint.
//!
//! Deterministic: the seed is fixed (or `MEMSTORE_EVENTS_SEED=<u64>`) and printed.

mod common;

use api::etcdserverpb::{LeaseGrantRequest, PutRequest, TxnRequest};
use api::mvccpb::Event;
use api::strata::entry::entry::Request;
use common::{Harness, after_compaction, op_del, op_put};
use memstore::{Error, MemStore};

const DEFAULT_SEED: u64 = 0xe7e0_2026_1130_0002;
const KEYS: usize = 300;
const STEPS: usize = 1_500;
const CHECK_EVERY: usize = 100;
const MAXES: [usize; 6] = [0, 1, 3, 10, 200, usize::MAX];

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn key(i: usize) -> String {
    format!("k{i:03}")
}

fn in_range(k: &[u8], key: &[u8], end: &[u8]) -> bool {
    if end.is_empty() {
        k == key
    } else if end == [0] {
        k >= key
    } else {
        k >= key && k < end
    }
}

/// The contract, computed naively: events in the range from `from`, cut after whole revisions
/// at `max` (a first revision larger than `max` comes whole).
fn reference(all: &[Event], from: i64, key: &[u8], end: &[u8], max: usize) -> Vec<Event> {
    let matching: Vec<&Event> = all
        .iter()
        .filter(|e| {
            let kv = e.kv.as_ref().expect("event kv");
            kv.mod_revision >= from && in_range(&kv.key, key, end)
        })
        .collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < matching.len() {
        let rev = matching[i].kv.as_ref().expect("kv").mod_revision;
        let n = matching[i..]
            .iter()
            .take_while(|e| e.kv.as_ref().expect("kv").mod_revision == rev)
            .count();
        if !out.is_empty() && out.len() + n > max {
            break;
        }
        out.extend(matching[i..i + n].iter().map(|e| (*e).clone()));
        i += n;
        if out.len() >= max {
            break;
        }
    }
    out
}

fn ranges() -> Vec<(Vec<u8>, Vec<u8>)> {
    vec![
        (b"\0".to_vec(), b"\0".to_vec()),
        (b"k".to_vec(), b"l".to_vec()),
        (b"k050".to_vec(), b"k250".to_vec()),
        (b"k100".to_vec(), b"\0".to_vec()),
        (b"k010".to_vec(), b"k020".to_vec()),
        (b"k007".to_vec(), Vec::new()),
        (b"k299".to_vec(), b"k2990".to_vec()),
        (b"z".to_vec(), b"a".to_vec()),
    ]
}

fn check(store: &MemStore, all: &[Event], rng: &mut Rng, what: &str) {
    let compact = store.compact_revision();
    let head = store.revision();
    assert_eq!(
        store.events(compact - 1, b"\0", b"\0", 10),
        Err(Error::Compacted),
        "{what}"
    );
    let kept = after_compaction(all, compact);
    let mut froms = vec![compact, compact + 1, head, head + 1];
    for _ in 0..4 {
        froms.push(compact + 1 + rng.below((head - compact) as usize) as i64);
    }
    for from in froms {
        for (k, e) in ranges() {
            for max in MAXES {
                let got = store.events(from, &k, &e, max).expect("events");
                let want = reference(&kept, from, &k, &e, max);
                assert_eq!(
                    got, want,
                    "{what}: events from {from} in {k:?}..{e:?} max {max}"
                );
            }
        }
    }
}

#[test]
fn events_agree_with_every_applied_event() {
    let seed = std::env::var("MEMSTORE_EVENTS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_SEED);
    println!("events test: seed {seed}; replay with MEMSTORE_EVENTS_SEED={seed}");
    let mut rng = Rng(seed);
    let mut h = Harness::new();
    let mut all: Vec<Event> = Vec::new();
    let mut next_lease = 1i64;
    for step in 0..STEPS {
        let applied = match rng.below(20) {
            0..=9 => {
                let k = key(rng.below(KEYS));
                let v = format!("v{step}");
                h.put(&k, &v)
            }
            10 | 11 => h.del(&key(rng.below(KEYS)), ""),
            12 => {
                let a = rng.below(KEYS);
                let b = (a + 1 + rng.below(40)).min(KEYS);
                h.del(&key(a), &key(b))
            }
            13 | 14 => {
                // Several changes in one revision, one key possibly twice via nested txns.
                let mut t = TxnRequest::default();
                // Outer puts on even keys, the nested pair on an odd one (no duplicate keys).
                for _ in 0..1 + rng.below(5) {
                    t.success
                        .push(op_put(&key(rng.below(KEYS / 2) * 2), &format!("t{step}")));
                }
                t.success.sort_by_key(|a| format!("{a:?}"));
                t.success.dedup();
                let k = key(rng.below(KEYS / 2) * 2 + 1);
                t.success.push(common::op_txn(TxnRequest {
                    success: vec![op_put(&k, "n1")],
                    ..Default::default()
                }));
                t.success.push(common::op_txn(TxnRequest {
                    success: vec![op_del(&k, "")],
                    ..Default::default()
                }));
                h.txn(t)
            }
            15 => {
                // A lease with many keys, revoked in one revision.
                let id = next_lease;
                next_lease += 1;
                h.apply(Request::LeaseGrant(LeaseGrantRequest { ttl: 60, id }));
                let start = rng.below(KEYS);
                for i in start..(start + 30).min(KEYS) {
                    let a = h.apply(Request::Put(PutRequest {
                        key: key(i).into_bytes(),
                        value: b"leased".to_vec(),
                        lease: id,
                        ..Default::default()
                    }));
                    all.extend(a.events);
                }
                h.revoke(id)
            }
            16 if rng.below(4) == 0 => {
                let (c, r) = (h.store.compact_revision(), h.store.revision());
                let to = c + 1 + rng.below((r - c).max(1) as usize) as i64;
                h.compact(to.min(r))
            }
            _ => h.put(&key(rng.below(KEYS)), "x"),
        };
        assert!(
            common::failed(&applied).is_none(),
            "step {step} failed: {applied:?}"
        );
        all.extend(applied.events);
        if step % CHECK_EVERY == CHECK_EVERY - 1 {
            check(&h.store, &all, &mut rng, &format!("step {step}"));
            let loaded = common::reload(&h.store);
            assert!(loaded == h.store, "step {step}: checkpoint differs");
            check(&loaded, &all, &mut rng, &format!("step {step}, loaded"));
        }
    }
}
