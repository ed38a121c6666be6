//! Restoring a tenant to a checkpoint through the journal: the difference between the tenant's
//! current state and the checkpoint's, as ordinary etcd requests (lease grants, guarded txns of
//! puts and deletes, lease revokes). Appended as journal entries, every replica (frontends, the
//! compactor) follows, watchers see the changes as events, and revisions keep moving forward.
//!
//! Each txn compares the mod revision (or absence) of every key it touches with the state the
//! plan was computed from, so a write that raced the restore makes that txn fail instead of
//! being overwritten; the caller then plans again from the newer state.

use std::collections::{BTreeMap, BTreeSet};

use api::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use api::etcdserverpb::request_op::Request as OpRequest;
use api::etcdserverpb::{
    Compare, DeleteRangeRequest, LeaseGrantRequest, LeaseRevokeRequest, PutRequest, RangeRequest,
    RequestOp, TxnRequest,
};
use api::mvccpb::KeyValue;
use api::strata::entry::entry::Request;
use memstore::MemStore;

/// Operations per txn (etcd's default limit is 128 ops per txn; compares count separately).
pub const MAX_OPS_PER_TXN: usize = 64;
/// Key + value bytes per txn, well under etcd's 1.5 MiB request limit.
pub const MAX_TXN_BYTES: usize = 1024 * 1024;

/// The requests that turn one state into another, in the order they must be applied.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Plan {
    pub requests: Vec<Request>,
    pub grants: usize,
    pub puts: usize,
    pub deletes: usize,
    pub revokes: usize,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }
}

fn all_keys(s: &MemStore) -> BTreeMap<Vec<u8>, KeyValue> {
    let req = RangeRequest {
        key: vec![0],
        range_end: vec![0],
        ..Default::default()
    };
    s.range(&req)
        .map(|r| r.kvs.into_iter().map(|kv| (kv.key.clone(), kv)).collect())
        .unwrap_or_default()
}

fn leases(s: &MemStore) -> BTreeMap<i64, i64> {
    s.lease_leases()
        .leases
        .into_iter()
        .map(|l| {
            let ttl = s
                .lease_time_to_live(l.id, false)
                .map(|t| t.granted_ttl)
                .unwrap_or(0);
            (l.id, ttl)
        })
        .collect()
}

fn compare_unchanged(key: &[u8], current: Option<&KeyValue>) -> Compare {
    match current {
        Some(kv) => Compare {
            result: CompareResult::Equal as i32,
            target: CompareTarget::Mod as i32,
            key: key.to_vec(),
            target_union: Some(TargetUnion::ModRevision(kv.mod_revision)),
            ..Default::default()
        },
        None => Compare {
            result: CompareResult::Equal as i32,
            target: CompareTarget::Version as i32,
            key: key.to_vec(),
            target_union: Some(TargetUnion::Version(0)),
            ..Default::default()
        },
    }
}

/// What to append so that `current` ends with `target`'s keys, values and key-to-lease
/// attachments, and `target`'s set of leases. Leases missing in `current` are granted with
/// their granted TTL (their countdown restarts); leases of both keep `current`'s deadline.
pub fn plan(current: &MemStore, target: &MemStore) -> Plan {
    let mut p = Plan::default();
    let cur_leases = leases(current);
    let tgt_leases = leases(target);
    for (&id, &ttl) in &tgt_leases {
        if !cur_leases.contains_key(&id) {
            p.requests.push(Request::LeaseGrant(LeaseGrantRequest {
                ttl: ttl.max(1),
                id,
            }));
            p.grants += 1;
        }
    }

    let cur = all_keys(current);
    let tgt = all_keys(target);
    let keys: BTreeSet<&Vec<u8>> = cur.keys().chain(tgt.keys()).collect();
    let mut txn = TxnRequest::default();
    let mut bytes = 0usize;
    for key in keys {
        let c = cur.get(key);
        let op = match (c, tgt.get(key)) {
            (Some(c), Some(t)) if c.value == t.value && c.lease == t.lease => continue,
            (_, Some(t)) => {
                p.puts += 1;
                bytes += key.len() + t.value.len();
                OpRequest::RequestPut(PutRequest {
                    key: key.clone(),
                    value: t.value.clone(),
                    lease: t.lease,
                    ..Default::default()
                })
            }
            (Some(_), None) => {
                p.deletes += 1;
                bytes += key.len();
                OpRequest::RequestDeleteRange(DeleteRangeRequest {
                    key: key.clone(),
                    ..Default::default()
                })
            }
            (None, None) => continue,
        };
        txn.compare.push(compare_unchanged(key, c));
        txn.success.push(RequestOp { request: Some(op) });
        if txn.success.len() >= MAX_OPS_PER_TXN || bytes >= MAX_TXN_BYTES {
            p.requests.push(Request::Txn(std::mem::take(&mut txn)));
            bytes = 0;
        }
    }
    if !txn.success.is_empty() {
        p.requests.push(Request::Txn(txn));
    }

    for &id in cur_leases.keys() {
        if !tgt_leases.contains_key(&id) {
            p.requests
                .push(Request::LeaseRevoke(LeaseRevokeRequest { id }));
            p.revokes += 1;
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::strata::entry::Entry;

    fn entry(n: u64, request: Request) -> Entry {
        let mut request_id = n.to_le_bytes().to_vec();
        request_id.resize(16, 9);
        Entry {
            format_version: api::ENTRY_FORMAT_VERSION,
            tenant: "t".into(),
            request_id,
            time_ms: 1_000 + n as i64,
            request: Some(request),
        }
    }

    fn put(key: &str, value: &str, lease: i64) -> Request {
        Request::Put(PutRequest {
            key: key.into(),
            value: value.into(),
            lease,
            ..Default::default()
        })
    }

    struct Replica {
        store: MemStore,
        n: u64,
    }

    impl Replica {
        fn apply(&mut self, r: Request) -> memstore::Outcome {
            self.n += 1;
            self.store.apply(self.n, &entry(self.n, r)).outcome
        }
    }

    /// (key, value, lease) of every key, and the lease ids.
    type Visible = (Vec<(Vec<u8>, Vec<u8>, i64)>, Vec<i64>);

    fn keys_and_leases(s: &MemStore) -> Visible {
        let kvs = all_keys(s)
            .into_values()
            .map(|kv| (kv.key, kv.value, kv.lease))
            .collect();
        (kvs, leases(s).into_keys().collect())
    }

    #[test]
    fn applying_the_plan_reaches_the_target_and_conflicts_fail_the_txn() {
        let mut r = Replica {
            store: MemStore::new(memstore::Config::default()),
            n: 0,
        };
        r.apply(Request::LeaseGrant(LeaseGrantRequest { ttl: 600, id: 7 }));
        for i in 0..200 {
            r.apply(put(
                &format!("k{i:03}"),
                "old",
                if i % 10 == 0 { 7 } else { 0 },
            ));
        }
        let target = r.store.clone();
        // Diverge: change, delete, add keys, a new lease, revoke lease 7 (deleting its keys).
        r.apply(put("k001", "new", 0));
        r.apply(Request::DeleteRange(DeleteRangeRequest {
            key: b"k002".to_vec(),
            ..Default::default()
        }));
        r.apply(Request::LeaseGrant(LeaseGrantRequest { ttl: 600, id: 8 }));
        for i in 200..300 {
            r.apply(put(&format!("k{i:03}"), "extra", 8));
        }
        r.apply(Request::LeaseRevoke(LeaseRevokeRequest { id: 7 }));
        let before = r.store.revision();

        let p = plan(&r.store, &target);
        assert_eq!((p.grants, p.revokes), (1, 1), "{p:?}");
        assert_eq!(p.deletes, 100);
        assert_eq!(
            p.puts,
            2 + 20,
            "k001, k002 and the 20 keys revoked with lease 7"
        );
        assert!(p.requests.len() > 2, "txns split at {MAX_OPS_PER_TXN} ops");

        // A write racing the restore makes the txn that touches it fail.
        let mut raced = Replica {
            store: r.store.clone(),
            n: r.n,
        };
        raced.apply(put("k001", "racing", 0));
        let mut failed = 0;
        for req in p.requests.clone() {
            if let memstore::Outcome::Txn(t) = raced.apply(req) {
                failed += usize::from(!t.succeeded);
            }
        }
        assert_eq!(failed, 1, "exactly the txn holding k001 fails");

        for req in p.requests {
            match r.apply(req) {
                memstore::Outcome::Txn(t) => assert!(t.succeeded),
                memstore::Outcome::Failed(e) => panic!("{e}"),
                _ => {}
            }
        }
        assert_eq!(keys_and_leases(&r.store), keys_and_leases(&target));
        assert!(r.store.revision() > before, "revisions move forward");
        assert!(plan(&r.store, &target).is_empty());
    }
}
