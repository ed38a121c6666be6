//! `MemStore::apply_record` (the replica's path: a put read in place from the journal record by
//! `api::record::put_view`) against the general path (`entry_for_tenant_owned` + `apply_owned`)
//! on random records: canonical puts, puts encoded with fields reordered, repeated, unknown or
//! explicitly default, with over-long varints, other tenants' puts (also with a tenant that is
//! not UTF-8), newer format versions, other requests, truncated and corrupted payloads. Both
//! must give the same request id, outcome, events and state, or both refuse the record; and
//! `put_view` must read exactly what prost decodes.
//!
//! Deterministic: the seed is fixed (or `MEMSTORE_RECORD_SEED=<u64>`) and printed; cases:
//! `MEMSTORE_RECORD_CASES` (default 256).

mod common;

use api::etcdserverpb::{DeleteRangeRequest, LeaseGrantRequest, PutRequest};
use api::record::{FastRecord, entry_for_tenant, entry_for_tenant_owned, put_view};
use api::strata::entry::{Entry, Tick, entry::Request};
use api::strata::journal::{Record, record::Kind};
use memstore::{Config, MemStore, Outcome};
use proptest::prelude::*;

use prost::Message;

const DEFAULT_SEED: u64 = 0x7265_636f_7264_0005;
const DEFAULT_CASES: u32 = 256;
const TENANT: &str = "t";

/// One protobuf field as this test writes it: field number and value.
#[derive(Debug, Clone)]
enum Field {
    Varint(u32, u64),
    Bytes(u32, Vec<u8>),
}

/// How a payload is written and then damaged.
#[derive(Debug, Clone)]
struct Shape {
    /// Fields of the entry (and of the put inside it) in reverse order.
    reversed: bool,
    /// Varints padded to a non-minimal encoding (one more byte), as prost still reads them.
    long_varints: bool,
    /// The first field of the put written twice (prost keeps the last).
    repeat_put_field: bool,
    /// An unknown field (number 9, varint) in the entry.
    unknown_field: bool,
    /// Cut the payload to this fraction (per mille) of its length.
    truncate: Option<u16>,
    /// Xor a byte (position per mille of the length, mask).
    flip: Option<(u16, u8)>,
}

/// One record to apply.
#[derive(Debug, Clone)]
struct Spec {
    tenant: Vec<u8>,
    request_id: Vec<u8>,
    format_version: Option<u64>,
    time_field: Option<u64>,
    body: Body,
    shape: Shape,
    advance_ms: i64,
}

#[derive(Debug, Clone)]
enum Body {
    /// A put; each field `None` is left out, `Some` written even when it is the default.
    Put {
        key: Option<Vec<u8>>,
        value: Option<Vec<u8>>,
        lease: Option<i64>,
        prev_kv: Option<u64>,
        ignore_value: Option<u64>,
        ignore_lease: Option<u64>,
    },
    /// Any other request, encoded by prost.
    Other(Request),
}

fn write_varint(mut x: u64, long: bool, out: &mut Vec<u8>) {
    let mut bytes = Vec::new();
    loop {
        let b = (x & 0x7f) as u8;
        x >>= 7;
        if x == 0 {
            bytes.push(b);
            break;
        }
        bytes.push(b | 0x80);
    }
    if long && bytes.len() < 10 {
        // One more (zero) group: the same number, one byte longer.
        let last = bytes.len() - 1;
        bytes[last] |= 0x80;
        bytes.push(0);
    }
    out.extend_from_slice(&bytes);
}

fn write_fields(fields: &[Field], long: bool) -> Vec<u8> {
    let mut out = Vec::new();
    for f in fields {
        match f {
            Field::Varint(n, v) => {
                write_varint(u64::from(*n) << 3, long, &mut out);
                write_varint(*v, long, &mut out);
            }
            Field::Bytes(n, b) => {
                write_varint((u64::from(*n) << 3) | 2, long, &mut out);
                write_varint(b.len() as u64, long, &mut out);
                out.extend_from_slice(b);
            }
        }
    }
    out
}

fn payload(spec: &Spec) -> Vec<u8> {
    let shape = &spec.shape;
    let mut entry = Vec::new();
    if let Some(v) = spec.format_version {
        entry.push(Field::Varint(1, v));
    }
    entry.push(Field::Bytes(2, spec.tenant.clone()));
    if !spec.request_id.is_empty() {
        entry.push(Field::Bytes(3, spec.request_id.clone()));
    }
    if let Some(t) = spec.time_field {
        entry.push(Field::Varint(4, t));
    }
    if shape.unknown_field {
        entry.push(Field::Varint(9, 77));
    }
    match &spec.body {
        Body::Put {
            key,
            value,
            lease,
            prev_kv,
            ignore_value,
            ignore_lease,
        } => {
            let mut put = Vec::new();
            put.extend(key.clone().map(|k| Field::Bytes(1, k)));
            put.extend(value.clone().map(|v| Field::Bytes(2, v)));
            put.extend(lease.map(|l| Field::Varint(3, l as u64)));
            put.extend(prev_kv.map(|b| Field::Varint(4, b)));
            put.extend(ignore_value.map(|b| Field::Varint(5, b)));
            put.extend(ignore_lease.map(|b| Field::Varint(6, b)));
            if shape.repeat_put_field
                && let Some(first) = put.first().cloned()
            {
                put.push(first);
            }
            if shape.reversed {
                put.reverse();
            }
            entry.push(Field::Bytes(10, write_fields(&put, shape.long_varints)));
        }
        Body::Other(request) => {
            let whole = Entry {
                request: Some(request.clone()),
                ..Default::default()
            };
            // The request's own field, as prost writes it, appended below.
            let mut bytes = whole.encode_to_vec();
            if shape.reversed {
                entry.reverse();
            }
            let mut out = write_fields(&entry, shape.long_varints);
            out.append(&mut bytes);
            return damage(out, shape);
        }
    }
    if shape.reversed {
        entry.reverse();
    }
    damage(write_fields(&entry, shape.long_varints), shape)
}

fn damage(mut bytes: Vec<u8>, shape: &Shape) -> Vec<u8> {
    if let Some(per_mille) = shape.truncate {
        bytes.truncate(bytes.len() * usize::from(per_mille) / 1000);
    }
    if let Some((at, mask)) = shape.flip
        && !bytes.is_empty()
    {
        let i = (bytes.len() - 1) * usize::from(at) / 1000;
        bytes[i] ^= mask;
    }
    bytes
}

fn small_bytes(choices: &'static [&'static [u8]]) -> impl Strategy<Value = Vec<u8>> {
    prop::sample::select(choices).prop_map(<[u8]>::to_vec)
}

fn flag() -> impl Strategy<Value = Option<u64>> {
    prop_oneof![
        4 => Just(None),
        2 => Just(Some(0)),
        2 => Just(Some(1)),
        1 => Just(Some(300)),
    ]
}

fn body() -> impl Strategy<Value = Body> {
    let put = (
        prop::option::weighted(0.95, small_bytes(&[b"a", b"b", b"c", b"", b"/registry/x"])),
        prop::option::weighted(0.9, small_bytes(&[b"1", b"22", b"", b"value-value"])),
        prop_oneof![
            6 => Just(None),
            2 => Just(Some(0i64)),
            2 => Just(Some(7i64)),
            1 => Just(Some(8i64)),
            1 => Just(Some(99i64)),
            1 => Just(Some(-1i64)),
        ],
        flag(),
        prop_oneof![6 => Just(None), 1 => flag()],
        prop_oneof![6 => Just(None), 1 => flag()],
    )
        .prop_map(
            |(key, value, lease, prev_kv, ignore_value, ignore_lease)| Body::Put {
                key,
                value,
                lease,
                prev_kv,
                ignore_value,
                ignore_lease,
            },
        );
    let other = prop_oneof![
        small_bytes(&[b"a", b"b", b"c"]).prop_map(|key| Request::DeleteRange(DeleteRangeRequest {
            key,
            ..Default::default()
        })),
        prop::sample::select(&[7i64, 8])
            .prop_map(|id| Request::LeaseGrant(LeaseGrantRequest { ttl: 5, id })),
        Just(Request::Tick(Tick {})),
    ]
    .prop_map(Body::Other);
    prop_oneof![8 => put, 2 => other]
}

fn shape() -> impl Strategy<Value = Shape> {
    (
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.05),
        prop::bool::weighted(0.05),
        prop::option::weighted(0.05, 0u16..1000),
        prop::option::weighted(0.05, (0u16..1000, 1u8..=255)),
    )
        .prop_map(
            |(reversed, long_varints, repeat_put_field, unknown_field, truncate, flip)| Shape {
                reversed,
                long_varints,
                repeat_put_field,
                unknown_field,
                truncate,
                flip,
            },
        )
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        prop_oneof![
            8 => Just(TENANT.as_bytes().to_vec()),
            1 => Just(b"u".to_vec()),
            1 => Just(Vec::new()),
            1 => Just(vec![0xff, 0xfe]),
        ],
        prop_oneof![
            3 => Just(Vec::new()),
            3 => (0u8..6).prop_map(|i| vec![i; 16]),
            1 => Just(b"abc".to_vec()),
        ],
        prop_oneof![
            2 => Just(None),
            8 => Just(Some(1u64)),
            1 => Just(Some(0u64)),
            1 => Just(Some(2u64)),
            1 => Just(Some((1u64 << 32) | 1)),
        ],
        prop::option::weighted(0.2, 0u64..5_000),
        body(),
        shape(),
        prop_oneof![4 => Just(0i64), 1 => 0i64..8_000, 1 => Just(150_000i64)],
    )
        .prop_map(
            |(tenant, request_id, format_version, time_field, body, shape, advance_ms)| Spec {
                tenant,
                request_id,
                format_version,
                time_field,
                body,
                shape,
                advance_ms,
            },
        )
}

/// What a run saw, so the test can demand that the fast path really ran.
#[derive(Default)]
struct Seen {
    records: u64,
    fast_puts: u64,
    fast_other_tenant: u64,
}

/// `put_view` must read what prost decodes, whenever it reads anything.
fn check_view(record: &Record, seen: &mut Seen) -> Result<(), TestCaseError> {
    let Some(fast) = put_view(record, TENANT) else {
        return Ok(());
    };
    let decoded = entry_for_tenant(record, TENANT)
        .map_err(|e| TestCaseError::fail(format!("put_view read a record prost refuses: {e}")))?;
    match fast {
        FastRecord::Put(v) => {
            seen.fast_puts += 1;
            prop_assert_eq!(decoded.request, Some(Request::Put(v.to_request())));
            prop_assert_eq!(&decoded.request_id[..], v.request_id);
            prop_assert_eq!(decoded.tenant.as_bytes(), TENANT.as_bytes());
        }
        FastRecord::OtherTenant => {
            seen.fast_other_tenant += 1;
            prop_assert_eq!(decoded.request, Some(Request::Tick(Tick {})));
        }
    }
    Ok(())
}

fn run_case(specs: &[Spec], seen: &mut Seen) -> Result<(), TestCaseError> {
    let mut fast = MemStore::new(Config::default());
    let mut by_ref = MemStore::new(Config::default());
    let mut general = MemStore::new(Config::default());
    let mut now = 1_000_000i64;
    for (i, spec) in specs.iter().enumerate() {
        now += spec.advance_ms;
        let record = Record {
            index: i as u64 + 1,
            term: 1,
            time_ms: now,
            kind: Some(Kind::Data(payload(spec))),
        };
        seen.records += 1;
        check_view(&record, seen)?;
        let want = entry_for_tenant_owned(record.clone(), TENANT).map(|e| {
            let id = e.request_id.clone();
            (id, general.apply_owned(record.index, e))
        });
        let got = fast.apply_record(record.clone(), TENANT);
        let got_ref = by_ref.apply_record_ref(&record, TENANT);
        match (want, got, got_ref) {
            (Ok((id, applied)), Ok(a), Ok(b)) => {
                prop_assert_eq!(&a, &b, "apply_record_ref differs at step {}", i);
                prop_assert_eq!(a.request_id, id, "request id at step {}", i);
                prop_assert_eq!(a.applied, applied, "step {}: {:?}", i, spec);
            }
            (Err(_), Err(_), Err(_)) => {}
            (want, got, got_ref) => {
                return Err(TestCaseError::fail(format!(
                    "step {i}: general {:?}, apply_record {:?}, apply_record_ref {:?}: {spec:?}",
                    want.map(|w| w.1.outcome),
                    got.map(|g| g.applied.outcome),
                    got_ref.map(|g| g.applied.outcome)
                )));
            }
        }
        prop_assert!(fast == general, "state after step {}: {:?}", i, spec);
        prop_assert!(by_ref == general, "state (by ref) after step {}", i);
    }
    Ok(())
}

#[test]
fn apply_record_agrees_with_the_general_path_on_random_records() {
    let (mut runner, seed) = common::seeded_runner("MEMSTORE_RECORD", DEFAULT_SEED, DEFAULT_CASES);
    let seen = std::cell::RefCell::new(Seen::default());
    let result = runner.run(&prop::collection::vec(spec(), 1..40), |specs| {
        run_case(&specs, &mut seen.borrow_mut())
    });
    if let Err(e) = result {
        panic!("apply_record disagreement (replay with MEMSTORE_RECORD_SEED={seed}): {e}");
    }
    let seen = seen.into_inner();
    println!(
        "{} records, {} read in place as puts, {} as other tenants' puts",
        seen.records, seen.fast_puts, seen.fast_other_tenant
    );
    // The generator writes most records in the shape the fast path reads: if it stopped
    // reading them, this test would compare the general path with itself.
    assert!(
        seen.fast_puts * 3 > seen.records,
        "fast path too rarely taken"
    );
    assert!(
        seen.fast_other_tenant > 0,
        "other tenants' puts never read in place"
    );
}

/// A put exactly as the frontend writes it takes the fast path, and every field arrives.
#[test]
fn a_frontend_put_is_read_in_place_with_every_field() {
    let entry = Entry {
        format_version: api::ENTRY_FORMAT_VERSION,
        tenant: TENANT.into(),
        request_id: vec![9; 16],
        time_ms: 0,
        request: Some(Request::Put(PutRequest {
            key: b"k".to_vec(),
            value: vec![1; 1000],
            lease: 0,
            prev_kv: true,
            ignore_value: false,
            ignore_lease: false,
        })),
        ..Default::default()
    };
    let record = Record {
        index: 1,
        term: 1,
        time_ms: 5_000,
        kind: Some(Kind::Data(api::record::encode_entry(&entry))),
    };
    let Some(FastRecord::Put(v)) = put_view(&record, TENANT) else {
        panic!("a canonical put was not read in place");
    };
    assert_eq!((v.key, v.value.len(), v.prev_kv), (&b"k"[..], 1000, true));
    assert_eq!(v.request_id, &[9; 16][..]);
    assert_eq!(put_view(&record, "other"), Some(FastRecord::OtherTenant));
    let mut store = MemStore::new(Config::default());
    let done = store.apply_record(record.clone(), TENANT).expect("apply");
    assert_eq!(done.request_id, vec![9; 16]);
    assert!(matches!(done.applied.outcome, Outcome::Put(_)));
    assert_eq!(
        store.time_ms(),
        5_000,
        "the record's stamp is the entry's time"
    );
    // The same record again (a retried append at a later index) is a duplicate.
    let again = Record { index: 2, ..record };
    let dup = store.apply_record(again, TENANT).expect("apply");
    assert_eq!(
        dup.applied.outcome,
        Outcome::Duplicate {
            revision: done.applied.revision
        }
    );
}
