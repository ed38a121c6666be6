//! Request checks etcd makes before a request reaches its store (v3rpc `key.go`, the lessor's
//! TTL bound): the same functions `apply` runs, public so the frontend can refuse bad requests
//! before appending them to the journal.

use std::collections::HashSet;

use api::etcdserverpb::{
    CompactionRequest, DeleteRangeRequest, LeaseGrantRequest, PutRequest, RangeRequest, RequestOp,
    TxnRequest, request_op::Request,
};

use crate::{Config, Error, MemStore};

/// etcd's checkRangeRequest.
pub fn range(req: &RangeRequest) -> Result<(), Error> {
    if req.key.is_empty() {
        return Err(Error::EmptyKey);
    }
    Ok(())
}

/// etcd's checkPutRequest.
pub fn put(req: &PutRequest) -> Result<(), Error> {
    put_parts(
        &req.key,
        &req.value,
        req.lease,
        req.ignore_value,
        req.ignore_lease,
    )
}

/// `put` of a request given as its parts (a put read in place from a journal record).
pub(crate) fn put_parts(
    key: &[u8],
    value: &[u8],
    lease: i64,
    ignore_value: bool,
    ignore_lease: bool,
) -> Result<(), Error> {
    if key.is_empty() {
        return Err(Error::EmptyKey);
    }
    if ignore_value && !value.is_empty() {
        return Err(Error::ValueProvided);
    }
    if ignore_lease && lease != 0 {
        return Err(Error::LeaseProvided);
    }
    Ok(())
}

/// etcd's checkDeleteRequest.
pub fn delete_range(req: &DeleteRangeRequest) -> Result<(), Error> {
    if req.key.is_empty() {
        return Err(Error::EmptyKey);
    }
    Ok(())
}

/// etcd's checkTxnRequest (op counts per level, empty keys) followed by checkIntervals on both
/// branches (a key put twice, or put and deleted, in one txn).
pub fn txn(req: &TxnRequest, max_txn_ops: usize) -> Result<(), Error> {
    check_txn_request(req, max_txn_ops as i64)?;
    check_intervals(&req.success)?;
    check_intervals(&req.failure)?;
    Ok(())
}

/// The lessor's bound on TTLs (a TTL below the minimum is raised, not refused).
pub fn lease_grant(req: &LeaseGrantRequest, config: &Config) -> Result<(), Error> {
    if req.ttl > config.max_lease_ttl_secs {
        return Err(Error::LeaseTtlTooLarge);
    }
    Ok(())
}

/// The store's compaction bounds, checked against a replica's current state.
pub fn compact(req: &CompactionRequest, store: &MemStore) -> Result<(), Error> {
    if req.revision <= store.compact_revision() {
        return Err(Error::Compacted);
    }
    if req.revision > store.revision() {
        return Err(Error::FutureRevision);
    }
    Ok(())
}

fn check_txn_request(req: &TxnRequest, max_ops: i64) -> Result<(), Error> {
    let opc = req
        .compare
        .len()
        .max(req.success.len())
        .max(req.failure.len()) as i64;
    if opc > max_ops {
        return Err(Error::TooManyOps);
    }
    if req.compare.iter().any(|c| c.key.is_empty()) {
        return Err(Error::EmptyKey);
    }
    for op in req.success.iter().chain(req.failure.iter()) {
        check_request_op(op, max_ops - opc)?;
    }
    Ok(())
}

fn check_request_op(op: &RequestOp, max_ops: i64) -> Result<(), Error> {
    match &op.request {
        Some(Request::RequestRange(r)) => range(r),
        Some(Request::RequestPut(p)) => put(p),
        Some(Request::RequestDeleteRange(d)) => delete_range(d),
        Some(Request::RequestTxn(t)) => check_txn_request(t, max_ops),
        None => Err(Error::KeyNotFound),
    }
}

/// A half-open interval with etcd's "affine string" bounds; an empty `end` is +infinity.
struct Interval {
    begin: Vec<u8>,
    end: Vec<u8>,
}

impl Interval {
    fn point(k: &[u8]) -> Self {
        let mut end = k.to_vec();
        end.push(0);
        Interval {
            begin: k.to_vec(),
            end,
        }
    }

    fn contains(&self, k: &[u8]) -> bool {
        self.begin.as_slice() <= k && (self.end.is_empty() || k < self.end.as_slice())
    }
}

fn intersects(dels: &[Interval], k: &[u8]) -> bool {
    dels.iter().any(|iv| iv.contains(k))
}

/// etcd's checkIntervals: returns this level's puts and deletes (children included).
fn check_intervals(reqs: &[RequestOp]) -> Result<(HashSet<Vec<u8>>, Vec<Interval>), Error> {
    let mut dels: Vec<Interval> = Vec::new();
    for op in reqs {
        if let Some(Request::RequestDeleteRange(d)) = &op.request {
            if d.range_end.is_empty() {
                dels.push(Interval::point(&d.key));
            } else {
                dels.push(Interval {
                    begin: d.key.clone(),
                    end: d.range_end.clone(),
                });
            }
        }
    }
    let mut puts: HashSet<Vec<u8>> = HashSet::new();
    for op in reqs {
        let Some(Request::RequestTxn(t)) = &op.request else {
            continue;
        };
        let (puts_then, dels_then) = check_intervals(&t.success)?;
        let (puts_else, dels_else) = check_intervals(&t.failure)?;
        for k in &puts_then {
            if puts.contains(k) || intersects(&dels, k) {
                return Err(Error::DuplicateKey);
            }
            puts.insert(k.clone());
        }
        for k in &puts_else {
            if puts.contains(k) && !puts_then.contains(k) {
                return Err(Error::DuplicateKey);
            }
            if intersects(&dels, k) {
                return Err(Error::DuplicateKey);
            }
            puts.insert(k.clone());
        }
        // etcd unions the children's deletes restricted to ["\0", +inf): every interval whose
        // end is above "\0" (an inverted one such as [k, "\0") overlaps nothing anyway).
        dels.extend(dels_then);
        dels.extend(dels_else);
    }
    for op in reqs {
        if let Some(Request::RequestPut(p)) = &op.request {
            if puts.contains(&p.key) || intersects(&dels, &p.key) {
                return Err(Error::DuplicateKey);
            }
            puts.insert(p.key.clone());
        }
    }
    Ok((puts, dels))
}
