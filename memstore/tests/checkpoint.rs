//! Checkpoint format: round trip, and every kind of damage is refused with `Error::Corrupt`
//! (never a panic): flipped bytes anywhere, truncation, bad magic, a newer version.
mod common;

use api::etcdserverpb::PutRequest;
use api::strata::entry::entry::Request;
use common::*;
use memstore::checkpoint::{self, CheckpointMeta, FORMAT_VERSION, MAGIC};
use memstore::{Error, MemStore};

fn sample() -> (CheckpointMeta, MemStore) {
    let mut h = Harness::new();
    h.grant(7, 30);
    for i in 0..20 {
        h.put(&format!("k{i:02}"), &format!("value-{i}"));
    }
    h.apply(Request::Put(PutRequest {
        key: "leased".into(),
        value: "x".into(),
        lease: 7,
        ..Default::default()
    }));
    h.del("k05", "k08");
    h.compact(10);
    h.apply_with_id(Request::Put(put("dedup", "1")), vec![9; 16]);
    let meta = CheckpointMeta {
        tenant: "tenant-a".into(),
        shard: 3,
        index: h.store.applied_index(),
        revision: h.store.revision(),
        created_ms: h.now_ms,
    };
    (meta, h.store)
}

#[test]
fn round_trip_is_indistinguishable() {
    let (meta, store) = sample();
    let bytes = checkpoint::encode(&meta, &store);
    assert_eq!(&bytes[..8], &MAGIC);
    let (m, loaded) = checkpoint::decode(&bytes).unwrap();
    assert_eq!(m, meta);
    assert!(loaded == store);
    assert_eq!(loaded.stats(), store.stats());
    assert_eq!(loaded.hash_kv(0), store.hash_kv(0));
    assert_eq!(
        loaded.lease_time_to_live(7, true),
        store.lease_time_to_live(7, true)
    );
    // The request-id window travels too.
    let mut a = store.clone();
    let mut b = loaded;
    let e = api::strata::entry::Entry {
        format_version: 1,
        tenant: "t".into(),
        request_id: vec![9; 16],
        time_ms: a.time_ms(),
        request: Some(Request::Put(put("dedup", "2"))),
    };
    let idx = a.applied_index() + 1;
    assert_eq!(a.apply(idx, &e), b.apply(idx, &e));
    assert!(matches!(
        b.apply(idx + 1, &e).outcome,
        memstore::Outcome::Duplicate { .. }
    ));
}

#[test]
fn every_flipped_byte_is_refused() {
    let (meta, store) = sample();
    let bytes = checkpoint::encode(&meta, &store);
    for i in 0..bytes.len() {
        for bit in [0x01u8, 0x80] {
            let mut bad = bytes.clone();
            bad[i] ^= bit;
            match checkpoint::decode(&bad) {
                Err(Error::Corrupt(_)) => {}
                other => panic!(
                    "flip {bit:#x} at byte {i} of {}: {:?}",
                    bytes.len(),
                    other.map(|(m, _)| m)
                ),
            }
        }
    }
}

#[test]
fn truncation_and_foreign_objects_are_refused() {
    let (meta, store) = sample();
    let bytes = checkpoint::encode(&meta, &store);
    for len in [0, 1, 7, 8, 27, 28, bytes.len() / 2, bytes.len() - 1] {
        assert!(
            matches!(checkpoint::decode(&bytes[..len]), Err(Error::Corrupt(_))),
            "truncated to {len}"
        );
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(matches!(
        checkpoint::decode(&longer),
        Err(Error::Corrupt(_))
    ));
    assert!(matches!(
        checkpoint::decode(b"{\"json\": true}"),
        Err(Error::Corrupt(_))
    ));
    // A newer format version (with a valid checksum) is refused by name.
    let mut newer = bytes.clone();
    newer[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    let crc = crc32c::crc32c(&newer[16..]);
    newer[12..16].copy_from_slice(&crc.to_le_bytes());
    match checkpoint::decode(&newer) {
        Err(Error::Corrupt(msg)) => assert!(msg.contains("version"), "{msg}"),
        other => panic!("{:?}", other.map(|(m, _)| m)),
    }
}

#[test]
fn a_body_with_a_valid_checksum_but_garbage_inside_is_refused() {
    let (meta, store) = sample();
    let mut bytes = checkpoint::encode(&meta, &store);
    let n = bytes.len();
    // Scribble over the archive's tail (where rkyv keeps the root) and fix up the crc.
    for b in &mut bytes[n - 16..] {
        *b = 0xff;
    }
    let crc = crc32c::crc32c(&bytes[16..]);
    bytes[12..16].copy_from_slice(&crc.to_le_bytes());
    assert!(matches!(checkpoint::decode(&bytes), Err(Error::Corrupt(_))));
}
