//! Checkpoint format: round trip, and every kind of damage is refused with `Error::Corrupt`
//! (never a panic): flipped bytes anywhere, truncation, bad magic, a newer version.
mod common;
#[path = "../../tests/src/procstat.rs"]
mod procstat;

/// The `strata` binary allocates through mimalloc; the decode measurement below should too.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use api::etcdserverpb::PutRequest;
use api::strata::entry::entry::Request;
use common::*;
use memstore::checkpoint::{self, CheckpointMeta, DecodeOptions, FORMAT_VERSION, MAGIC};
use memstore::{Error, MemStore, Outcome};
use procstat::cpu_and_faults;

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
    for change in sample_auth() {
        let a = h.apply(Request::Auth(api::strata::entry::AuthChange {
            change: Some(change),
        }));
        assert_eq!(a.outcome, Outcome::Auth);
    }
    let meta = CheckpointMeta {
        tenant: "tenant-a".into(),
        shard: 3,
        index: h.store.applied_index(),
        revision: h.store.revision(),
        created_ms: h.now_ms,
    };
    (meta, h.store)
}

/// A user with a role that holds a permission.
fn sample_auth() -> Vec<api::strata::entry::auth_change::Change> {
    use api::etcdserverpb::{
        AuthRoleAddRequest, AuthRoleGrantPermissionRequest, AuthUserAddRequest,
        AuthUserGrantRoleRequest,
    };
    use api::strata::entry::auth_change::Change;
    vec![
        Change::UserAdd(AuthUserAddRequest {
            name: "alice".into(),
            hashed_password: "JDJhJDEwJGhhc2g=".into(),
            ..Default::default()
        }),
        Change::RoleAdd(AuthRoleAddRequest {
            name: "reader".into(),
        }),
        Change::RoleGrantPermission(AuthRoleGrantPermissionRequest {
            name: "reader".into(),
            perm: Some(api::authpb::Permission {
                perm_type: 0,
                key: "k".into(),
                range_end: "l".into(),
            }),
        }),
        Change::UserGrantRole(AuthUserGrantRoleRequest {
            user: "alice".into(),
            role: "reader".into(),
        }),
    ]
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
    assert_eq!(loaded.auth_revision(), 5);
    assert_eq!(loaded.auth_user("alice"), store.auth_user("alice"));
    assert_eq!(loaded.auth_user("alice").unwrap().roles, ["reader"]);
    assert_eq!(loaded.auth_role("reader").unwrap().len(), 1);
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
        ..Default::default()
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

/// A request id is a duplicate while `now <= first apply + window` and forgotten one
/// millisecond later, the same in a store and in its checkpoint loaded at any point between.
#[test]
fn the_request_id_window_ends_at_its_edge_and_checkpoints_keep_it() {
    let window = memstore::DEFAULT_REQUEST_ID_WINDOW_MS;
    let mut h = Harness::new();
    let id = vec![3u8; 16];
    let short_id = b"eight-by".to_vec(); // not 16 bytes: digested
    let first = h.apply_with_id(Request::Put(put("a", "1")), id.clone());
    h.apply_with_id(Request::Put(put("b", "1")), short_id.clone());
    let t0 = h.now_ms;
    for i in 0..1000 {
        h.tick(window / 2000);
        let mut other = (i as u64).to_le_bytes().to_vec();
        other.resize(16, 0x55);
        h.apply_with_id(Request::Put(put("c", "x")), other);
    }
    assert!(h.now_ms < t0 + window);
    // Journal time moves on in steps the replicas count in full (a longer gap would not age
    // the window: the next test).
    while h.now_ms < t0 + window - 1_000 {
        h.tick(1_000);
    }
    // Exactly at the edge: still remembered, on the store and on its checkpoint.
    h.now_ms = t0 + window;
    let meta = |s: &MemStore| CheckpointMeta {
        tenant: "t".into(),
        shard: 0,
        index: s.applied_index(),
        revision: s.revision(),
        created_ms: 0,
    };
    let at_edge = h.apply_with_id(Request::Put(put("a", "2")), id.clone());
    assert_eq!(
        at_edge.outcome,
        memstore::Outcome::Duplicate {
            revision: first.revision
        }
    );
    let (_, mut loaded) =
        checkpoint::decode(&checkpoint::encode(&meta(&h.store), &h.store)).unwrap();
    assert!(loaded == h.store);
    assert_eq!(
        loaded.remembered_request_ids(),
        h.store.remembered_request_ids()
    );
    // One millisecond past it: forgotten on both, applied as new on both.
    h.now_ms += 1;
    let e = api::strata::entry::Entry {
        format_version: api::ENTRY_FORMAT_VERSION,
        tenant: "t".into(),
        request_id: id,
        time_ms: h.now_ms,
        request: Some(Request::Put(put("a", "3"))),
        ..Default::default()
    };
    let idx = h.index + 1;
    let on_store = h.store.apply(idx, &e);
    assert!(matches!(on_store.outcome, memstore::Outcome::Put(_)));
    assert_eq!(loaded.apply(idx, &e), on_store);
    assert!(loaded == h.store);
    // The digested id went out of the window with it; the later ones are still there.
    h.index = idx;
    assert!(matches!(
        h.apply_with_id(Request::Put(put("b", "2")), short_id)
            .outcome,
        memstore::Outcome::Put(_)
    ));
    assert!(h.store.remembered_request_ids() > 900);
}

/// A gap in journal time longer than the lease clock's step (a new leader whose clock is an
/// hour ahead) ages the request-id window by one step only, as it ages leases: a retried append
/// whose first copy came before the gap is still a duplicate after it. The postponed window
/// round-trips through a checkpoint, and ends a full window of counted time later.
#[test]
fn a_stamping_gap_ages_the_request_id_window_by_one_step_only() {
    let window = memstore::DEFAULT_REQUEST_ID_WINDOW_MS;
    let mut h = Harness::new();
    let id = vec![7u8; 16];
    let first = h.apply_with_id(Request::Put(put("a", "1")), id.clone());
    for i in 0..300u64 {
        let mut other = i.to_le_bytes().to_vec();
        other.resize(16, 0x66);
        h.apply_with_id(Request::Put(put("c", "x")), other);
    }
    h.tick(3_600_000);
    let again = h.apply_with_id(Request::Put(put("a", "2")), id.clone());
    assert_eq!(
        again.outcome,
        memstore::Outcome::Duplicate {
            revision: first.revision
        },
        "an hour's step of journal time forgot the id"
    );
    let meta = CheckpointMeta {
        tenant: "t".into(),
        shard: 0,
        index: h.store.applied_index(),
        revision: h.store.revision(),
        created_ms: 0,
    };
    let (_, loaded) = checkpoint::decode(&checkpoint::encode(&meta, &h.store)).unwrap();
    assert!(loaded == h.store);
    // A window of counted time later (one second of the hour counted), it is forgotten.
    for _ in 0..window / 1_000 {
        h.tick(1_000);
    }
    assert!(matches!(
        h.apply_with_id(Request::Put(put("a", "3")), id).outcome,
        memstore::Outcome::Put(_)
    ));
}

/// The window holds one record per request, and a checkpoint carrying 200k of them loads back
/// equal (the flat array of format 3).
#[test]
fn a_large_request_id_window_round_trips() {
    let mut h = Harness::new();
    for i in 0..200_000u64 {
        let mut id = i.to_le_bytes().to_vec();
        id.resize(16, 1);
        h.apply_with_id(Request::Put(put(&format!("k{}", i % 100), "v")), id);
        if i % 1000 == 0 {
            h.now_ms += 1;
        }
    }
    assert_eq!(h.store.remembered_request_ids(), 200_000);
    let loaded = reload(&h.store);
    assert!(loaded == h.store);
    assert_eq!(loaded.remembered_request_ids(), 200_000);
}

/// Stores of many shapes: no key, one key, an odd count, keys with
/// histories of several versions, tombstones, a compaction, leases and a request-id window.
fn varied_stores() -> Vec<MemStore> {
    let mut out = vec![Harness::new().store];
    let mut h = Harness::new();
    h.put("only", "1");
    out.push(h.store.clone());
    let mut h = Harness::new();
    h.grant(11, 60);
    for round in 0..4 {
        for i in 0..301 {
            if (i + round) % 3 == 0 {
                let mut id = ((round * 1000 + i) as u64).to_le_bytes().to_vec();
                id.resize(16, 7);
                h.apply_with_id(
                    Request::Put(put(&format!("k{i:04}"), &format!("r{round}"))),
                    id,
                );
            } else if i % 7 == 0 {
                h.apply(Request::Put(PutRequest {
                    key: format!("k{i:04}").into(),
                    value: vec![b'l'; i],
                    lease: 11,
                    ..Default::default()
                }));
            }
        }
        h.del("k0100", "k0120");
        h.tick(5);
    }
    out.push(h.store.clone());
    h.compact(h.store.revision() / 2);
    out.push(h.store);
    out
}

#[test]
fn decode_with_a_precomputed_crc_equals_decode() {
    for (n, store) in varied_stores().into_iter().enumerate() {
        let meta = meta_of(&store);
        let bytes = checkpoint::encode(&meta, &store);
        let (m1, plain) = checkpoint::decode(&bytes).unwrap();
        let options = DecodeOptions {
            precomputed_crc: Some(crc32c::crc32c(&bytes[checkpoint::CRC_FROM..])),
        };
        let (m2, with_crc) = checkpoint::decode_with(&bytes, options).unwrap();
        assert_eq!(m1, meta);
        assert_eq!(m2, meta);
        assert!(plain == store, "store {n}");
        assert!(with_crc == plain, "store {n}");
        assert_eq!(with_crc.stats(), store.stats(), "store {n}");
        assert_eq!(with_crc.hash_kv(0), store.hash_kv(0), "store {n}");
        assert_eq!(
            with_crc.remembered_request_ids(),
            store.remembered_request_ids()
        );
        assert_eq!(
            with_crc.events(store.compact_revision() + 1, b"\0", b"\0", 100_000),
            store.events(store.compact_revision() + 1, b"\0", b"\0", 100_000),
            "store {n}"
        );
    }
}

/// Encoding into a buffer the caller holds gives `encode`'s bytes, whatever the buffer held
/// and however small it was; a buffer of the estimate's capacity does not grow.
#[test]
fn encode_into_a_given_buffer_equals_encode() {
    for (n, store) in varied_stores().into_iter().enumerate() {
        let meta = meta_of(&store);
        let bytes = checkpoint::encode(&meta, &store);
        let estimate = checkpoint::encoded_len_estimate(&meta, &store);
        assert!(
            estimate >= bytes.len(),
            "store {n}: the estimate is an upper bound"
        );
        let roomy = Vec::with_capacity(estimate);
        let ptr = roomy.as_ptr();
        let into = checkpoint::encode_into(&meta, &store, roomy);
        assert_eq!(into, bytes, "store {n}");
        assert_eq!(into.as_ptr(), ptr, "store {n}: the buffer grew");
        let dirty = vec![0xab; 100];
        assert_eq!(
            checkpoint::encode_into(&meta, &store, dirty),
            bytes,
            "store {n}"
        );
    }
}

/// A crc the caller computed while reading stands in for decode's own pass over the object:
/// the right one is accepted, a wrong one refused, and every flipped byte still refused (with
/// the caller's crc computed over the damaged bytes, as a reader would).
#[test]
fn a_precomputed_crc_stands_in_for_the_second_pass() {
    let (meta, store) = sample();
    let bytes = checkpoint::encode(&meta, &store);
    let crc = crc32c::crc32c(&bytes[checkpoint::CRC_FROM..]);
    let with = |c| DecodeOptions {
        precomputed_crc: Some(c),
    };
    let (_, loaded) = checkpoint::decode_with(&bytes, with(crc)).unwrap();
    assert!(loaded == store);
    assert!(matches!(
        checkpoint::decode_with(&bytes, with(crc ^ 1)),
        Err(Error::Corrupt(_))
    ));
    for i in 0..bytes.len() {
        let mut bad = bytes.clone();
        bad[i] ^= 0x10;
        let c = crc32c::crc32c(&bad[checkpoint::CRC_FROM.min(bad.len())..]);
        assert!(
            matches!(
                checkpoint::decode_with(&bad, with(c)),
                Err(Error::Corrupt(_))
            ),
            "flip at byte {i}"
        );
    }
    // Garbage inside a body whose crc is right: refused by validation.
    let mut garbage = bytes.clone();
    let n = garbage.len();
    for b in &mut garbage[n - 16..] {
        *b = 0xff;
    }
    let c = crc32c::crc32c(&garbage[16..]);
    garbage[12..16].copy_from_slice(&c.to_le_bytes());
    assert!(matches!(
        checkpoint::decode_with(&garbage, with(c)),
        Err(Error::Corrupt(_))
    ));
}

/// Resident set size of this process, from /proc (Linux), in bytes.
fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// What the request-id window costs: memory per remembered id, and encode/decode time of a
/// store holding `STRATA_DEDUP_IDS` (default 1M) of them and nothing else. A measurement, not a
/// check: `cargo test --release -p strata-memstore --test checkpoint dedup_window_cost --
/// --ignored --nocapture`.
#[test]
#[ignore]
fn dedup_window_cost() {
    let n: u64 = env_or("STRATA_DEDUP_IDS", 1_000_000);
    let mut store = MemStore::new(memstore::Config::default());
    let entries: Vec<api::strata::entry::Entry> = (0..n)
        .map(|i| api::strata::entry::Entry {
            format_version: api::ENTRY_FORMAT_VERSION,
            tenant: "t".into(),
            request_id: pseudo_random_id(i),
            // 1M requests within one minute of journal time: all inside the window.
            time_ms: 1_000_000 + (i * 60_000 / n) as i64,
            request: Some(Request::Alarm(api::etcdserverpb::AlarmRequest::default())),
            ..Default::default()
        })
        .collect();
    let before = rss_bytes();
    let t = std::time::Instant::now();
    for (i, e) in entries.iter().enumerate() {
        store.apply(i as u64 + 1, e);
    }
    let apply = t.elapsed();
    let grown = rss_bytes().saturating_sub(before);
    let meta = CheckpointMeta {
        tenant: "t".into(),
        shard: 0,
        index: store.applied_index(),
        revision: store.revision(),
        created_ms: 0,
    };
    let t = std::time::Instant::now();
    let bytes = checkpoint::encode(&meta, &store);
    let encode = t.elapsed();
    let t = std::time::Instant::now();
    let (_, loaded) = checkpoint::decode(&bytes).unwrap();
    let decode = t.elapsed();
    assert!(loaded == store);
    println!(
        "{n} request ids: apply {:.3} s, RSS +{} MB ({} bytes/id), checkpoint {} MB ({} bytes/id), encode {:.3} s, decode {:.3} s",
        apply.as_secs_f64(),
        grown / 1_000_000,
        grown / n,
        bytes.len() / 1_000_000,
        bytes.len() as u64 / n,
        encode.as_secs_f64(),
        decode.as_secs_f64()
    );
}

/// The request-id window in its steady state: requests with 16-byte ids at 20 per journal
/// millisecond, past the point where the window is full, so it forgets one id per request. It
/// must then hold exactly the ids of the last `window` milliseconds: a retry of the newest is
/// a duplicate, a retry of one just outside the window is applied again. Requests that change
/// nothing (alarm lists), so the window is most of what an apply does; the CPU per request is
/// printed. In CI: 100k requests, a 1 s window (20,000 ids). As the measurement of
/// docs/compactor.md: `STRATA_DEDUP_PUTS=4000000 STRATA_DEDUP_WINDOW_MS=120000
/// STRATA_DEDUP_ROUNDS=3 cargo test --release -p strata-memstore --test checkpoint
/// dedup_window_steady_state -- --nocapture` (2.4M ids held).
#[test]
fn dedup_window_steady_state() {
    let n: u64 = env_or("STRATA_DEDUP_PUTS", 100_000);
    let window_ms = env_or("STRATA_DEDUP_WINDOW_MS", 1_000) as i64;
    let time_of = |i: u64| 1_000_000 + (i / 20) as i64;
    let entry = |i: u64, time_ms: i64| api::strata::entry::Entry {
        format_version: api::ENTRY_FORMAT_VERSION,
        tenant: "t".into(),
        request_id: pseudo_random_id(i),
        time_ms,
        request: Some(Request::Alarm(api::etcdserverpb::AlarmRequest::default())),
        ..Default::default()
    };
    assert!(
        time_of(n - 1) - time_of(0) > 2 * window_ms,
        "the run must outlast the window twice to reach the steady state"
    );
    let entries: Vec<api::strata::entry::Entry> = (0..n).map(|i| entry(i, time_of(i))).collect();
    let now = time_of(n - 1);
    // Forgotten: applied before now - window.
    let held = (0..n).filter(|&i| time_of(i) >= now - window_ms).count();
    let oldest_held = n - held as u64;
    for round in 0..env_or("STRATA_DEDUP_ROUNDS", 1) {
        let mut store = MemStore::new(memstore::Config {
            request_id_window_ms: window_ms,
            ..memstore::Config::default()
        });
        let (cpu, _) = cpu_and_faults("self");
        let t = std::time::Instant::now();
        for (i, e) in entries.iter().enumerate() {
            store.apply(i as u64 + 1, e);
        }
        let wall = t.elapsed().as_secs_f64();
        let cpu = cpu_and_faults("self").0 - cpu;
        println!(
            "round {round}: {n} requests, {} ids remembered at the end: wall {wall:.3} s, CPU {cpu:.2} s, {:.0} ns CPU per request",
            store.remembered_request_ids(),
            cpu * 1e9 / n as f64
        );
        assert_eq!(store.remembered_request_ids(), held, "round {round}");
        let retry = |store: &mut MemStore, i: u64| {
            let index = store.applied_index() + 1;
            store.apply(index, &entry(i, now)).outcome
        };
        assert!(
            matches!(retry(&mut store, n - 1), Outcome::Duplicate { .. }),
            "round {round}: the newest id must be remembered"
        );
        assert!(
            matches!(retry(&mut store, oldest_held), Outcome::Duplicate { .. }),
            "round {round}: the oldest id inside the window must be remembered"
        );
        assert!(
            matches!(retry(&mut store, oldest_held - 1), Outcome::Alarm(_)),
            "round {round}: an id outside the window must be applied again"
        );
    }
}

/// A measurement's size from the environment variable `name`, else `default`.
fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Request id `i` of a measurement: 16 pseudo-random bytes, as frontends write them.
fn pseudo_random_id(i: u64) -> Vec<u8> {
    [
        i.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_le_bytes(),
        (i ^ 0x5555)
            .wrapping_mul(0xbf58_476d_1ce4_e5b9)
            .to_le_bytes(),
    ]
    .concat()
}

/// What decoding the ready-timing tenant costs (issue 5: `STRATA_DECODE_KEYS` keys, default 1M,
/// of 64 bytes with 256-byte values, as many 16-byte request ids in the window): wall and CPU
/// time, minor faults and RSS growth per decode, five decodes. A measurement, not a check:
/// `cargo test --release -p strata-memstore --test checkpoint decode_cost -- --ignored
/// --nocapture`.
#[test]
#[ignore]
fn decode_cost_of_a_large_tenant() {
    let n: u64 = env_or("STRATA_DECODE_KEYS", 1_000_000);
    let mut store = MemStore::new(memstore::Config::default());
    for i in 0..n {
        let mut key = format!("/registry/pods/ns{:04}/pod-{i:08}-", i / 1000).into_bytes();
        key.resize(64, b'x');
        let e = api::strata::entry::Entry {
            format_version: api::ENTRY_FORMAT_VERSION,
            tenant: "t".into(),
            request_id: pseudo_random_id(i),
            time_ms: 1_000_000,
            request: Some(Request::Put(PutRequest {
                key,
                value: vec![b'v'; 256],
                ..Default::default()
            })),
            ..Default::default()
        };
        store.apply(i + 1, &e);
    }
    let meta = CheckpointMeta {
        tenant: "t".into(),
        shard: 0,
        index: store.applied_index(),
        revision: store.revision(),
        created_ms: 0,
    };
    let bytes = checkpoint::encode(&meta, &store);
    // A new frontend decodes into memory fresh from the kernel: nothing of the source store
    // stays around to be reused.
    drop(store);
    let mut aligned = rkyv::util::AlignedVec::<16>::with_capacity(bytes.len());
    aligned.extend_from_slice(&bytes);
    let crc = crc32c::crc32c(&aligned[checkpoint::CRC_FROM..]);
    println!("{n} keys, checkpoint of {} MB", aligned.len() / 1_000_000);
    for run in 0..5 {
        let (rss, (cpu, faults)) = (rss_bytes(), cpu_and_faults("self"));
        let t = std::time::Instant::now();
        let (_, loaded) = checkpoint::decode_with(
            &aligned,
            DecodeOptions {
                precomputed_crc: Some(crc),
            },
        )
        .unwrap();
        let wall = t.elapsed();
        let (cpu2, faults2) = cpu_and_faults("self");
        let grown = rss_bytes().saturating_sub(rss);
        println!(
            "run {run}: decode {:.3} s wall, {:.2} s CPU, {} minor faults, RSS +{} MB",
            wall.as_secs_f64(),
            cpu2 - cpu,
            faults2 - faults,
            grown / 1_000_000
        );
        if run == 0 {
            assert!(
                checkpoint::encode(&meta, &loaded) == bytes,
                "re-encoded differently"
            );
        }
    }
}

/// A seeded stream of requests over a small key set: puts (some with request ids, some
/// repeated ids), range deletes, txns and compactions at a revision a little behind.
fn random_request(rng: &mut u64, revision: i64, compacted: i64) -> (Request, Vec<u8>) {
    let mut next = |n: u64| {
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        *rng % n
    };
    let key = |i: u64| format!("/k/{i:03}");
    let request = match next(20) {
        0 => Request::DeleteRange(api::etcdserverpb::DeleteRangeRequest {
            key: key(next(200)).into_bytes(),
            range_end: key(next(200) + 5).into_bytes(),
            prev_kv: true,
        }),
        1 if revision - 5 > compacted => Request::Compact(api::etcdserverpb::CompactionRequest {
            revision: compacted + 1 + next((revision - 5 - compacted) as u64) as i64,
            physical: false,
        }),
        2 => Request::Txn(api::etcdserverpb::TxnRequest {
            compare: vec![cmp_version(
                &key(next(200)),
                "",
                api::etcdserverpb::compare::CompareResult::Greater,
                1,
            )],
            success: vec![
                op_put(&key(next(200)), "txn-yes"),
                op_del(&key(next(200)), ""),
            ],
            failure: vec![op_put(&key(next(200)), "txn-no")],
        }),
        _ => Request::Put(PutRequest {
            key: key(next(200)).into_bytes(),
            value: vec![b'a' + next(26) as u8; next(300) as usize],
            prev_kv: next(2) == 0,
            ..Default::default()
        }),
    };
    // Every other request carries an id; now and then one already used (a retry).
    let id = match next(4) {
        0 => Vec::new(),
        1 => vec![next(8) as u8; 16],
        _ => {
            let mut id = (*rng).to_le_bytes().to_vec();
            id.resize(16, 7);
            id
        }
    };
    (request, id)
}

/// A store decoded from a checkpoint (its key space bulk-built) keeps step with the store that
/// wrote it: under the same later requests (puts, deletes, txns, compactions, retried ids)
/// every outcome and event is the same, and so are ranges at every revision, the hash and the
/// next checkpoint. Seeded: `STRATA_CHECKPOINT_SEED` replays a printed seed.
#[test]
fn a_decoded_store_keeps_step_with_its_source() {
    let seeds: Vec<u64> = match std::env::var("STRATA_CHECKPOINT_SEED") {
        Ok(s) => vec![s.parse().expect("STRATA_CHECKPOINT_SEED is a number")],
        Err(_) => vec![0x5eed_0001, 0x5eed_0002, 0x5eed_0003],
    };
    for seed in seeds {
        println!("seed {seed} (replay: STRATA_CHECKPOINT_SEED={seed})");
        let mut rng = seed | 1;
        let mut h = Harness::new();
        let mut compacted = 0;
        let step = |h: &mut Harness, rng: &mut u64, compacted: &mut i64| {
            let (request, id) = random_request(rng, h.store.revision(), *compacted);
            if let Request::Compact(c) = &request {
                *compacted = c.revision;
            }
            h.now_ms += 3;
            (h.apply_with_id(request.clone(), id.clone()), request, id)
        };
        for _ in 0..3_000 {
            step(&mut h, &mut rng, &mut compacted);
        }
        let mut copy = Harness {
            store: reload(&h.store),
            index: h.index,
            now_ms: h.now_ms,
        };
        assert!(copy.store == h.store, "seed {seed}: decoded store differs");
        for i in 0..2_000 {
            let (applied, request, id) = step(&mut h, &mut rng, &mut compacted);
            copy.now_ms = h.now_ms;
            let again = copy.apply_with_id(request, id);
            assert_eq!(
                again, applied,
                "seed {seed}: request {i} after the checkpoint"
            );
        }
        assert!(copy.store == h.store, "seed {seed}");
        assert!(compacted > 0, "seed {seed}: the stream compacted nothing");
        let head = h.store.revision();
        for rev in [compacted, (compacted + head) / 2, head] {
            let all = api::etcdserverpb::RangeRequest {
                key: b"\0".to_vec(),
                range_end: b"\0".to_vec(),
                revision: rev,
                ..Default::default()
            };
            assert_eq!(
                copy.store.range(&all).unwrap(),
                h.store.range(&all).unwrap(),
                "seed {seed}: range at {rev}"
            );
            assert_eq!(
                copy.store.hash_kv(rev).unwrap(),
                h.store.hash_kv(rev).unwrap(),
                "seed {seed}: hash at {rev}"
            );
        }
        let meta = meta_of(&h.store);
        assert!(
            checkpoint::encode(&meta, &copy.store) == checkpoint::encode(&meta, &h.store),
            "seed {seed}: the next checkpoints differ"
        );
    }
}
