//! Property tests of the point-read path: on random stores (puts with and without leases,
//! deletes, compactions, keys and values long enough for multi-byte lengths), every point read
//! (`range` with no `range_end`, any revision, count_only, keys_only, min/max filters, limit,
//! sort) answers exactly what the general range path answers for the same key as the range
//! `[key, key + "\0")`, errors included; and `range_view`'s wire encoding, with any header, is
//! byte for byte prost's encoding of `range`'s response with that header (ranges too); and
//! `range_views` of all those requests together (the batched lookup, point reads mixed with
//! ranges, missing and empty keys) answers each exactly as `range` does alone.
//!
//! Deterministic: the seed is fixed (or `MEMSTORE_POINT_SEED=<u64>`), printed, and proptest
//! shrinks a failure. Cases: `MEMSTORE_POINT_CASES` (default 128).

mod common;

use api::etcdserverpb::{
    CompactionRequest, DeleteRangeRequest, LeaseGrantRequest, PutRequest, RangeRequest,
    ResponseHeader,
};
use api::strata::entry::entry::Request;
use common::Harness;
use memstore::RangeView;
use proptest::prelude::*;
use prost::Message;

const DEFAULT_SEED: u64 = 0x9017_7e4d_2026_1201;
const DEFAULT_CASES: u32 = 128;
/// Leases granted before the random steps (puts attach to them or to none).
const LEASES: [i64; 3] = [7, 300, 0x7fff_ffff_ffff_0001];

/// Keys of several shapes: short, sharing prefixes, and one over 127 bytes (two-byte length).
fn keys() -> Vec<Vec<u8>> {
    let mut long = b"/registry/long/".to_vec();
    long.resize(200, b'k');
    vec![
        b"a".to_vec(),
        b"ab".to_vec(),
        b"b".to_vec(),
        b"b\0".to_vec(),
        b"/registry/pods/ns/p".to_vec(),
        long,
    ]
}

/// One mutation of the random store.
#[derive(Debug, Clone)]
enum Step {
    Put {
        key: usize,
        value_len: usize,
        lease: Option<usize>,
    },
    Delete {
        key: usize,
    },
    /// Compacts at `back` revisions below the head.
    Compact {
        back: i64,
    },
}

fn step() -> impl Strategy<Value = Step> {
    let n = keys().len();
    prop_oneof![
        6 => (0..n, prop_oneof![Just(0usize), 1..20usize, 120..300usize], prop::option::of(0..LEASES.len()))
            .prop_map(|(key, value_len, lease)| Step::Put { key, value_len, lease }),
        2 => (0..n).prop_map(|key| Step::Delete { key }),
        1 => (0..6i64).prop_map(|back| Step::Compact { back }),
    ]
}

/// A point read's options (the key is chosen per read).
#[derive(Debug, Clone)]
struct Read {
    key: usize,
    /// Revision relative to the head: may be in the future, compacted, or 0 / negative.
    revision: i64,
    count_only: bool,
    keys_only: bool,
    limit: i64,
    sort: (i32, i32),
    min_mod: i64,
    max_mod: i64,
    min_create: i64,
    max_create: i64,
    serializable: bool,
}

fn read() -> impl Strategy<Value = Read> {
    let n = keys().len();
    let filter = || prop_oneof![3 => Just(0i64), 1 => 1..40i64];
    (
        0..=n,
        -3..40i64,
        any::<(bool, bool, bool)>(),
        prop_oneof![Just(0i64), 1..3i64],
        (0..3i32, 0..5i32),
        (filter(), filter(), filter(), filter()),
    )
        .prop_map(
            |(key, revision, (count_only, keys_only, serializable), limit, sort, f)| Read {
                key,
                revision,
                count_only,
                keys_only,
                limit,
                sort,
                min_mod: f.0,
                max_mod: f.1,
                min_create: f.2,
                max_create: f.3,
                serializable,
            },
        )
}

fn header() -> impl Strategy<Value = ResponseHeader> {
    let id = || prop_oneof![Just(0u64), 1..200u64, any::<u64>()];
    (id(), id(), id()).prop_map(|(cluster_id, member_id, raft_term)| ResponseHeader {
        cluster_id,
        member_id,
        revision: 0,
        raft_term,
    })
}

fn request(keys: &[Vec<u8>], r: &Read) -> RangeRequest {
    RangeRequest {
        // One index past the keys is a key never written; the empty key is refused.
        key: match keys.get(r.key) {
            Some(k) => k.clone(),
            None if r.revision % 2 == 0 => b"never".to_vec(),
            None => Vec::new(),
        },
        range_end: Vec::new(),
        limit: r.limit,
        revision: r.revision,
        sort_order: r.sort.0,
        sort_target: r.sort.1,
        serializable: r.serializable,
        keys_only: r.keys_only,
        count_only: r.count_only,
        min_mod_revision: r.min_mod,
        max_mod_revision: r.max_mod,
        min_create_revision: r.min_create,
        max_create_revision: r.max_create,
    }
}

/// The store the steps build (after the leases are granted).
fn build(steps: &[Step]) -> Harness {
    let keys = keys();
    let mut h = Harness::new();
    for id in LEASES {
        h.apply(Request::LeaseGrant(LeaseGrantRequest { ttl: 3600, id }));
    }
    for (i, s) in steps.iter().enumerate() {
        match s {
            Step::Put {
                key,
                value_len,
                lease,
            } => {
                h.apply(Request::Put(PutRequest {
                    key: keys[*key].clone(),
                    value: (0..*value_len).map(|j| (i + j) as u8).collect(),
                    lease: lease.map_or(0, |l| LEASES[l]),
                    ..Default::default()
                }));
            }
            Step::Delete { key } => {
                h.apply(Request::DeleteRange(DeleteRangeRequest {
                    key: keys[*key].clone(),
                    ..Default::default()
                }));
            }
            Step::Compact { back } => {
                let revision = h.store.revision() - back;
                if revision > h.store.compact_revision() {
                    h.apply(Request::Compact(CompactionRequest {
                        revision,
                        physical: true,
                    }));
                }
            }
        }
    }
    h
}

/// The encoding of `range(req)`'s response with `header` (revision kept), as prost writes it.
fn prost_encoding(
    h: &Harness,
    req: &RangeRequest,
    header: &ResponseHeader,
) -> Result<Vec<u8>, memstore::Error> {
    let mut resp = h.store.range(req)?;
    resp.header = Some(ResponseHeader {
        revision: resp.header.as_ref().map_or(0, |x| x.revision),
        ..*header
    });
    Ok(resp.encode_to_vec())
}

fn view_encoding(view: &RangeView<'_>, header: &ResponseHeader) -> Vec<u8> {
    let header = ResponseHeader {
        revision: view.revision(),
        ..*header
    };
    let bytes = view.encode_to_vec(&header);
    assert_eq!(bytes.len(), view.encoded_len(&header), "encoded_len");
    bytes
}

fn run_case(
    steps: &[Step],
    reads: &[(Read, ResponseHeader)],
    base: i64,
) -> Result<(), TestCaseError> {
    let h = build(steps);
    let keys = keys();
    let mut batch = Vec::new();
    for (r, hdr) in reads {
        let mut req = request(&keys, r);
        // Revisions around what this store holds: compacted, head, future, 0 and negative.
        if req.revision > 0 {
            req.revision += base;
        }
        batch.push(req.clone());
        let point = h.store.range(&req);
        let mut as_range = req.clone();
        as_range.range_end = req.key.iter().copied().chain([0]).collect();
        if req.key.is_empty() {
            as_range.range_end.clear();
        }
        let general = h.store.range(&as_range);
        prop_assert_eq!(&point, &general, "point read {:?} vs the range path", req);
        let view = h.store.range_view(&req);
        prop_assert_eq!(
            view.as_ref()
                .map(view_encoding_of(hdr))
                .map_err(Clone::clone),
            prost_encoding(&h, &req, hdr),
            "wire encoding of {:?}",
            req
        );
        prop_assert_eq!(
            h.store.range_view(&req).map(RangeView::into_response),
            point,
            "into_response"
        );
        // The Owned (range) form encodes as prost does too.
        if !req.key.is_empty() {
            for end in [as_range.range_end.clone(), b"\0".to_vec(), b"b".to_vec()] {
                let ranged = RangeRequest {
                    range_end: end,
                    ..req.clone()
                };
                if ranged.key.len().is_multiple_of(2) {
                    batch.push(ranged.clone());
                }
                prop_assert_eq!(
                    h.store
                        .range_view(&ranged)
                        .as_ref()
                        .map(view_encoding_of(hdr))
                        .map_err(Clone::clone),
                    prost_encoding(&h, &ranged, hdr),
                    "wire encoding of {:?}",
                    ranged
                );
            }
        }
    }
    // The batched lookup answers each request as a lone one does.
    let batched: Vec<_> = h
        .store
        .range_views(&batch)
        .into_iter()
        .map(|v| v.map(RangeView::into_response))
        .collect();
    let single: Vec<_> = batch.iter().map(|r| h.store.range(r)).collect();
    prop_assert_eq!(batched, single, "range_views of {:?}", batch);
    Ok(())
}

fn view_encoding_of(hdr: &ResponseHeader) -> impl Fn(&RangeView<'_>) -> Vec<u8> + '_ {
    move |v| view_encoding(v, hdr)
}

#[test]
fn point_reads_agree_with_the_range_path_and_prost() {
    let (mut runner, seed) = common::seeded_runner("MEMSTORE_POINT", DEFAULT_SEED, DEFAULT_CASES);
    let strategy = (
        prop::collection::vec(step(), 0..80),
        prop::collection::vec((read(), header()), 1..40),
        -2..3i64,
    );
    let result = runner.run(&strategy, |(steps, reads, base)| {
        run_case(&steps, &reads, base)
    });
    if let Err(e) = result {
        panic!("point read disagreement (replay with MEMSTORE_POINT_SEED={seed}): {e}");
    }
}

/// A hand-checked answer: the bytes of a known response, so the encoding is not only
/// compared with itself through prost.
#[test]
fn point_read_encoding_of_a_known_answer() {
    let mut h = Harness::new();
    h.put("k", "v");
    let req = RangeRequest {
        key: b"k".to_vec(),
        ..Default::default()
    };
    let view = h.store.range_view(&req).unwrap();
    assert_eq!(view.revision(), 2);
    let header = ResponseHeader {
        cluster_id: 1,
        member_id: 0,
        revision: 2,
        raft_term: 300,
    };
    let bytes = view.encode_to_vec(&header);
    #[rustfmt::skip]
    let want: &[u8] = &[
        0x0a, 7, 0x08, 1, 0x18, 2, 0x20, 0xac, 0x02, // header {cluster 1, revision 2, term 300}
        0x12, 12, 0x0a, 1, b'k', 0x10, 2, 0x18, 2, 0x20, 1, 0x2a, 1, b'v', // kv
        0x20, 1, // count 1
    ];
    assert_eq!(bytes, want);
    let count_only = RangeRequest {
        count_only: true,
        ..req.clone()
    };
    let view = h.store.range_view(&count_only).unwrap();
    assert_eq!(
        view.encode_to_vec(&header),
        [&want[..9], &[0x20, 1][..]].concat()
    );
    let missing = RangeRequest {
        key: b"nope".to_vec(),
        ..Default::default()
    };
    let view = h.store.range_view(&missing).unwrap();
    assert_eq!(view.encode_to_vec(&header), &want[..9]);
}
