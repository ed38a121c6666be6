//! Property test of the snapshot format: a store after a random sequence of puts, deletes,
//! txns (several changes in one revision), lease grants and revokes (a revoke deletes its keys
//! in one revision) and compactions, written as etcd's database (`memstore::etcd_db`, what a
//! frontend's Snapshot streams) and read back a version at a time, answers every read the store
//! answers: at every revision from the compaction to the head, the newest version of each key
//! at or below it (tombstones hiding the key) is the store's answer, field for field. The
//! versions come in strictly increasing revision order, the leases and the revision read back
//! as the store's, and the file is no longer than its estimate.
//!
//! Deterministic: proptest's default seed; `PROPTEST_CASES` sets the cases (default 128).

use std::collections::BTreeMap;

use api::etcdserverpb::{
    CompactionRequest, DeleteRangeRequest, LeaseGrantRequest, LeaseRevokeRequest, PutRequest,
    RangeRequest, RequestOp, TxnRequest, request_op,
};
use api::mvccpb::KeyValue;
use api::strata::entry::{Entry, entry::Request};
use compactor::etcd_snapshot::{StoredVersion, read, versions};
use memstore::{Config, MemStore};
use proptest::prelude::*;

const KEYS: [&str; 4] = ["a", "b", "b/c", "d"];
const LEASES: [i64; 2] = [0x10, 0x20];

#[derive(Debug, Clone)]
enum Op {
    Put {
        key: usize,
        value: u8,
        lease: Option<usize>,
    },
    Delete {
        key: usize,
    },
    DeleteAll,
    /// Puts of two different keys in one revision.
    Txn {
        key: usize,
        value: u8,
    },
    Grant {
        lease: usize,
    },
    Revoke {
        lease: usize,
    },
    /// Compaction this many revisions below the head.
    Compact {
        back: i64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0..KEYS.len(), any::<u8>(), proptest::option::of(0..LEASES.len()))
            .prop_map(|(key, value, lease)| Op::Put { key, value, lease }),
        2 => (0..KEYS.len()).prop_map(|key| Op::Delete { key }),
        1 => Just(Op::DeleteAll),
        2 => (0..KEYS.len(), any::<u8>()).prop_map(|(key, value)| Op::Txn { key, value }),
        1 => (0..LEASES.len()).prop_map(|lease| Op::Grant { lease }),
        1 => (0..LEASES.len()).prop_map(|lease| Op::Revoke { lease }),
        1 => (0i64..6).prop_map(|back| Op::Compact { back }),
    ]
}

fn put(key: &str, value: u8, lease: i64) -> PutRequest {
    PutRequest {
        key: key.into(),
        value: vec![value; 1 + usize::from(value) % 5],
        lease,
        ..Default::default()
    }
}

/// The request of `op` on `store` (None: nothing to do, e.g. a compaction of nothing).
fn request(op: &Op, store: &MemStore) -> Option<Request> {
    Some(match *op {
        Op::Put { key, value, lease } => {
            Request::Put(put(KEYS[key], value, lease.map_or(0, |l| LEASES[l])))
        }
        Op::Delete { key } => Request::DeleteRange(DeleteRangeRequest {
            key: KEYS[key].into(),
            ..Default::default()
        }),
        Op::DeleteAll => Request::DeleteRange(DeleteRangeRequest {
            key: vec![0],
            range_end: vec![0],
            ..Default::default()
        }),
        Op::Txn { key, value } => Request::Txn(TxnRequest {
            success: [key, (key + 1) % KEYS.len()]
                .iter()
                .map(|&k| RequestOp {
                    request: Some(request_op::Request::RequestPut(put(KEYS[k], value, 0))),
                })
                .collect(),
            ..Default::default()
        }),
        Op::Grant { lease } => Request::LeaseGrant(LeaseGrantRequest {
            ttl: 60 + lease as i64,
            id: LEASES[lease],
        }),
        Op::Revoke { lease } => Request::LeaseRevoke(LeaseRevokeRequest { id: LEASES[lease] }),
        Op::Compact { back } => {
            let revision = store.revision() - back;
            if revision <= store.compact_revision().max(1) {
                return None;
            }
            Request::Compact(CompactionRequest {
                revision,
                physical: true,
            })
        }
    })
}

/// The live keys at `rev` as the versions say: each key's newest version at or below it,
/// unless that is a tombstone.
fn state_at(versions: &[StoredVersion], rev: i64) -> BTreeMap<Vec<u8>, KeyValue> {
    let mut state = BTreeMap::new();
    for v in versions.iter().take_while(|v| v.main <= rev) {
        if v.tombstone {
            state.remove(&v.kv.key);
        } else {
            state.insert(v.kv.key.clone(), v.kv.clone());
        }
    }
    state
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(128)
    ))]

    #[test]
    fn the_database_answers_every_read_the_store_answers(
        ops in proptest::collection::vec(op(), 1..60)
    ) {
        let mut store = MemStore::new(Config::default());
        let mut entry = Entry {
            format_version: api::ENTRY_FORMAT_VERSION,
            tenant: "t".into(),
            ..Default::default()
        };
        for (i, op) in ops.iter().enumerate() {
            entry.request = request(op, &store);
            if entry.request.is_some() {
                // Refusals (a put on a lease not granted, a grant of a lease that exists)
                // change nothing, as in etcd.
                store.apply(i as u64 + 1, &entry);
            }
        }
        let db = memstore::etcd_db::etcd_database(&store);
        prop_assert!(db.len() <= memstore::etcd_db::estimated_len(&store));
        let vs = versions(&db[..]).expect("the database reads");
        for pair in vs.windows(2) {
            prop_assert!((pair[0].main, pair[0].sub) < (pair[1].main, pair[1].sub));
        }
        let all = |revision| RangeRequest {
            key: vec![0],
            range_end: vec![0],
            revision,
            ..Default::default()
        };
        for rev in store.compact_revision().max(1)..=store.revision() {
            let want: BTreeMap<Vec<u8>, KeyValue> = store
                .range(&all(rev))
                .expect("a read at or above the compaction")
                .kvs
                .into_iter()
                .map(|kv| (kv.key.clone(), kv))
                .collect();
            prop_assert_eq!(state_at(&vs, rev), want, "at revision {}", rev);
        }
        let state = read(&db[..]).expect("the database reads");
        let leases: BTreeMap<i64, i64> = store
            .lease_leases()
            .leases
            .iter()
            .map(|l| {
                let ttl = store.lease_time_to_live(l.id, false).expect("a listed lease");
                (l.id, ttl.granted_ttl)
            })
            .collect();
        prop_assert_eq!(state.leases, leases);
        prop_assert_eq!(
            state.revision,
            vs.last().map_or(0, |v| v.main),
        );
        prop_assert!(state.revision <= store.revision());
    }
}
