//! The KV workloads' clients: put, range (linearizable or serializable), txn-put (several puts
//! per txn) and txn-cas (Kubernetes' OptimisticPut: a txn on the key's mod_revision that puts on
//! success and reads the key back on failure).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use api::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use api::etcdserverpb::request_op::Request as OpRequest;
use api::etcdserverpb::response_op::Response as OpResponse;
use api::etcdserverpb::{
    Compare, PutRequest, PutResponse, RangeRequest, RangeResponse, RequestOp, TxnRequest,
    TxnResponse,
};
use bytes::Bytes;

use super::driver::{Client, OpFuture, Outcome};
use super::grpc::{KV_PUT, KV_RANGE, KV_TXN, Unary};
use super::keys::KeyGen;

/// Puts one key per operation.
pub struct PutClient {
    pub rpc: Unary,
    pub keys: KeyGen,
    pub value: Arc<Vec<u8>>,
}

impl Client for PutClient {
    fn op(&mut self, op: u64) -> OpFuture<'_> {
        let req = PutRequest {
            key: self.keys.key(op),
            value: self.value.to_vec(),
            ..Default::default()
        };
        Box::pin(async move {
            self.rpc.call::<PutResponse>(KV_PUT, &req).await?;
            Ok(Outcome::Done)
        })
    }
}

/// Reads the same key or range on every operation (the request is encoded once).
pub struct RangeClient {
    rpc: Unary,
    framed: Bytes,
}

impl RangeClient {
    pub fn new(mut rpc: Unary, request: &RangeRequest) -> Self {
        let framed = rpc.frame(request);
        Self { rpc, framed }
    }
}

impl Client for RangeClient {
    fn op(&mut self, _op: u64) -> OpFuture<'_> {
        let framed = self.framed.clone();
        Box::pin(async move {
            self.rpc
                .call_framed::<RangeResponse>(KV_RANGE, framed)
                .await?;
            Ok(Outcome::Done)
        })
    }
}

/// `txn_ops` puts of distinct keys in one txn per operation.
pub struct TxnPutClient {
    pub rpc: Unary,
    pub keys: KeyGen,
    pub key_space: u64,
    pub txn_ops: usize,
    pub value: Arc<Vec<u8>>,
}

/// The `txn_ops` distinct key indexes starting at `first`, wrapping around the key space.
/// The caller guarantees `txn_ops <= key_space` (etcd refuses a txn that puts one key twice).
pub fn txn_indexes(first: u64, txn_ops: usize, key_space: u64) -> Vec<u64> {
    (0..txn_ops as u64)
        .map(|j| (first + j) % key_space)
        .collect()
}

impl Client for TxnPutClient {
    fn op(&mut self, op: u64) -> OpFuture<'_> {
        let first = self.keys.index(op.saturating_mul(self.txn_ops as u64));
        let success = txn_indexes(first, self.txn_ops, self.key_space)
            .into_iter()
            .map(|i| RequestOp {
                request: Some(OpRequest::RequestPut(PutRequest {
                    key: self.keys.key_of(i),
                    value: self.value.to_vec(),
                    ..Default::default()
                })),
            })
            .collect();
        let req = TxnRequest {
            compare: Vec::new(),
            success,
            failure: Vec::new(),
        };
        Box::pin(async move {
            self.rpc.call::<TxnResponse>(KV_TXN, &req).await?;
            Ok(Outcome::Done)
        })
    }
}

/// The mod_revision last seen per key index (absent = 0), shared by every client of a run as
/// one kube-apiserver's watch cache is shared by its requests.
pub type SeenRevisions = Arc<Mutex<HashMap<u64, i64>>>;

/// Compare-and-swap on mod_revision, as kube-apiserver's OptimisticPut does: it expects the
/// mod_revision last seen for the key, and on a failed compare learns the current one from the
/// Get in the txn's failure branch, so the next attempt on that key can succeed. Conflicts are
/// then real races between clients writing the same key.
pub struct TxnCasClient {
    pub rpc: Unary,
    pub keys: KeyGen,
    pub value: Arc<Vec<u8>>,
    pub seen: SeenRevisions,
}

fn seen_get(seen: &SeenRevisions, index: u64) -> i64 {
    // A poisoned map only means another client panicked mid-insert; its data is still valid.
    let map = seen
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    map.get(&index).copied().unwrap_or(0)
}

/// Records `revision` for `index` unless a newer one is already known.
fn seen_update(seen: &SeenRevisions, index: u64, revision: i64) {
    let mut map = seen
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let slot = map.entry(index).or_insert(0);
    *slot = (*slot).max(revision);
}

/// The OptimisticPut txn: `If(ModRevision(key) == expected).Then(Put(key, value)).Else(Get(key))`.
pub fn cas_txn(key: Vec<u8>, value: Vec<u8>, expected_mod_revision: i64) -> TxnRequest {
    TxnRequest {
        compare: vec![Compare {
            result: CompareResult::Equal as i32,
            target: CompareTarget::Mod as i32,
            key: key.clone(),
            range_end: Vec::new(),
            target_union: Some(TargetUnion::ModRevision(expected_mod_revision)),
        }],
        success: vec![RequestOp {
            request: Some(OpRequest::RequestPut(PutRequest {
                key: key.clone(),
                value,
                ..Default::default()
            })),
        }],
        failure: vec![RequestOp {
            request: Some(OpRequest::RequestRange(RangeRequest {
                key,
                ..Default::default()
            })),
        }],
    }
}

impl Client for TxnCasClient {
    fn op(&mut self, op: u64) -> OpFuture<'_> {
        let index = self.keys.index(op);
        let expected = seen_get(&self.seen, index);
        let req = cas_txn(self.keys.key_of(index), self.value.to_vec(), expected);
        Box::pin(async move {
            let resp: TxnResponse = self.rpc.call(KV_TXN, &req).await?;
            if resp.succeeded {
                let revision = resp.header.map_or(0, |h| h.revision);
                seen_update(&self.seen, index, revision);
                return Ok(Outcome::Done);
            }
            let current = resp
                .responses
                .into_iter()
                .find_map(|r| match r.response {
                    Some(OpResponse::ResponseRange(range)) => Some(range),
                    _ => None,
                })
                .and_then(|range| range.kvs.into_iter().next())
                .map_or(0, |kv| kv.mod_revision);
            seen_update(&self.seen, index, current);
            Ok(Outcome::Conflict)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seen_revisions_only_move_forward() {
        let seen = SeenRevisions::default();
        assert_eq!(seen_get(&seen, 3), 0);
        seen_update(&seen, 3, 10);
        seen_update(&seen, 3, 7); // a slower client's older answer
        assert_eq!(seen_get(&seen, 3), 10);
        seen_update(&seen, 3, 12);
        assert_eq!(seen_get(&seen, 3), 12);
    }

    #[test]
    fn txn_keys_are_distinct_and_wrap() {
        assert_eq!(txn_indexes(8, 4, 10), vec![8, 9, 0, 1]);
        assert_eq!(txn_indexes(0, 1, 1), vec![0]);
        let ix = txn_indexes(3, 10, 10);
        let set: std::collections::BTreeSet<_> = ix.iter().collect();
        assert_eq!(set.len(), 10);
    }

    #[test]
    fn cas_txn_is_kubernetes_optimistic_put() {
        let t = cas_txn(b"k".to_vec(), b"v".to_vec(), 42);
        assert_eq!(t.compare.len(), 1);
        let c = &t.compare[0];
        assert_eq!(c.target, CompareTarget::Mod as i32);
        assert_eq!(c.result, CompareResult::Equal as i32);
        assert_eq!(c.target_union, Some(TargetUnion::ModRevision(42)));
        assert!(matches!(
            &t.success[0].request,
            Some(OpRequest::RequestPut(p)) if p.key == b"k" && p.value == b"v"
        ));
        assert!(matches!(
            &t.failure[0].request,
            Some(OpRequest::RequestRange(r)) if r.key == b"k" && r.range_end.is_empty()
        ));
    }
}
