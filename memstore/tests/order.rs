//! The ordered index under many keys inserted in scrambled order (chunks split, first keys
//! change, digests tie and get recomputed): every range answer, after deletes, a compaction
//! (which re-packs the index) and a checkpoint round trip, agrees with a `BTreeMap`.

mod common;

use std::collections::BTreeMap;

use api::etcdserverpb::{DeleteRangeRequest, RangeRequest};
use api::strata::entry::entry::Request;
use common::Harness;

/// Keys written: enough for several chunk splits (chunks hold at most 512 keys).
const KEYS: u64 = 6_000;
/// Fixed seed of the key order; printed so a failure can be replayed.
const SEED: u64 = 0x6f72_6465_7273;

fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Kubernetes-like keys of varied shape: namespaces of different sizes, names that are
/// prefixes of each other, long equal runs, a few short and binary keys.
fn key_for(r: u64) -> Vec<u8> {
    match r % 10 {
        0 => format!("/registry/pods/ns{}/p{}", r % 7, r % 500).into_bytes(),
        1 => format!("/registry/pods/ns{}/p{}x", r % 7, r % 500).into_bytes(),
        2 => vec![b'a'; (r % 40) as usize + 1],
        3 => vec![(r % 256) as u8, ((r >> 8) % 3) as u8],
        _ => format!(
            "/registry/{}/ns{:03}/name-{:06}",
            ["pods", "configmaps", "leases"][(r % 3) as usize],
            (r >> 4) % 40,
            r % 100_000
        )
        .into_bytes(),
    }
}

fn ranges(model: &BTreeMap<Vec<u8>, Vec<u8>>) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out = vec![
        (b"\0".to_vec(), b"\0".to_vec()),
        (b"/registry/pods/".to_vec(), b"/registry/pods0".to_vec()),
        (
            b"/registry/pods/ns3/p".to_vec(),
            b"/registry/pods/ns3/q".to_vec(),
        ),
        (b"a".to_vec(), b"b".to_vec()),
        (b"/registry/leases/ns01".to_vec(), b"\0".to_vec()),
    ];
    // Ranges starting and ending at stored keys and just beside them.
    for (i, k) in model.keys().enumerate().step_by(97) {
        let mut after = k.clone();
        after.push(0);
        out.push((k.clone(), after.clone()));
        out.push((after, b"/registry/z".to_vec()));
        if i % 2 == 0 {
            out.push((k.clone(), Vec::new()));
        }
    }
    out
}

fn check(h: &Harness, model: &BTreeMap<Vec<u8>, Vec<u8>>, when: &str) {
    for (key, end) in ranges(model) {
        let got = h
            .store
            .range(&RangeRequest {
                key: key.clone(),
                range_end: end.clone(),
                ..Default::default()
            })
            .expect("range");
        let want: Vec<(&Vec<u8>, &Vec<u8>)> = if end.is_empty() {
            model.get_key_value(&key).into_iter().collect()
        } else if end == b"\0" {
            model.range(key.clone()..).collect()
        } else if end <= key {
            Vec::new()
        } else {
            model.range(key.clone()..end.clone()).collect()
        };
        let got: Vec<(&Vec<u8>, &Vec<u8>)> =
            got.kvs.iter().map(|kv| (&kv.key, &kv.value)).collect();
        assert_eq!(got, want, "{when}: range {key:?}..{end:?} (seed {SEED:#x})");
    }
}

/// Puts `key` = `value` into the store and the model alike.
fn put(h: &mut Harness, model: &mut BTreeMap<Vec<u8>, Vec<u8>>, key: Vec<u8>, value: Vec<u8>) {
    h.apply(Request::Put(api::etcdserverpb::PutRequest {
        key: key.clone(),
        value: value.clone(),
        ..Default::default()
    }));
    model.insert(key, value);
}

#[test]
fn scrambled_inserts_deletes_compaction_and_reload_keep_key_order() {
    println!("replay: SEED = {SEED:#x}");
    let mut h = Harness::new();
    let mut model = BTreeMap::new();
    let mut x = SEED;
    for i in 0..KEYS {
        let key = key_for(splitmix(&mut x));
        put(&mut h, &mut model, key, format!("v{i}").into_bytes());
    }
    check(&h, &model, "after inserts");
    // Delete every third key, one by one, and one whole prefix.
    let doomed: Vec<Vec<u8>> = model.keys().step_by(3).cloned().collect();
    for k in &doomed {
        h.apply(Request::DeleteRange(DeleteRangeRequest {
            key: k.clone(),
            ..Default::default()
        }));
        model.remove(k);
    }
    h.apply(Request::DeleteRange(DeleteRangeRequest {
        key: b"/registry/configmaps/".to_vec(),
        range_end: b"/registry/configmaps0".to_vec(),
        ..Default::default()
    }));
    model.retain(|k, _| !k.starts_with(b"/registry/configmaps/"));
    check(&h, &model, "after deletes");
    let rev = h.store.revision();
    h.compact(rev);
    check(&h, &model, "after compaction");
    // New keys into the re-packed index.
    for i in 0..KEYS / 4 {
        let key = key_for(splitmix(&mut x));
        put(&mut h, &mut model, key, b"w".to_vec());
        if i % 500 == 0 {
            check(&h, &model, "inserts after compaction");
        }
    }
    h.store = common::reload(&h.store);
    check(&h, &model, "after checkpoint reload");
    for _ in 0..KEYS / 4 {
        let key = key_for(splitmix(&mut x));
        put(&mut h, &mut model, key, b"z".to_vec());
    }
    check(&h, &model, "inserts after reload");
}
