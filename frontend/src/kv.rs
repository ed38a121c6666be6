//! The etcd `KV` service: Range (linearizable through a shared read-index round, or
//! serializable from the local replica at once), read-only Txns the same way, and Put,
//! DeleteRange, other Txns and Compact journalled as intents and answered with the outcome the
//! replica computed.

use std::sync::Arc;

use api::etcdserverpb::kv_server::Kv;
use api::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse, ResponseHeader, TxnRequest, TxnResponse,
};
use api::strata::entry::entry::Request as Intent;
use bytes::{BufMut, Bytes, BytesMut};
use memstore::{Outcome, StepBudget};
use prost::Message;
use tonic::{Request, Response, Status};

use crate::auth::Caller;
use crate::errors::Error;
use crate::fast_kv::GRPC_HEADER_LEN;
use crate::rpc::RequestId;
use crate::tenant::Tenant;
use crate::tenants::Tenants;

pub struct KvService {
    tenants: Arc<Tenants>,
}

impl KvService {
    pub fn new(tenants: Arc<Tenants>) -> Self {
        Self { tenants }
    }
}

/// Header revision of a store answer, else the given one.
fn revision_of(h: &Option<ResponseHeader>, fallback: i64) -> i64 {
    h.as_ref().map_or(fallback, |h| h.revision)
}

pub(crate) async fn range(
    t: &Tenant,
    caller: &Caller,
    req: RangeRequest,
) -> Result<RangeResponse, Error> {
    range_ready(t, caller, &req).await?;
    let mut resp = read_range(t, &req).await?;
    let rev = revision_of(&resp.header, 0);
    resp.header = Some(t.header(rev));
    Ok(resp)
}

/// A Range answered as one length-prefixed gRPC message. A point read is encoded straight from
/// the store (`MemStore::range_view`: it copies its key and value once, into the answer's
/// buffer, with no response structs in between); a range over keys is read in steps
/// ([`read_range`]) and encoded once read. Same answer, byte for byte, as [`range`] encoded by
/// prost.
pub(crate) async fn range_message(
    t: &Tenant,
    caller: &Caller,
    req: RangeRequest,
) -> Result<Bytes, Error> {
    range_ready(t, caller, &req).await?;
    if !req.range_end.is_empty() {
        let mut resp = read_range(t, &req).await?;
        resp.header = Some(t.header(revision_of(&resp.header, 0)));
        return grpc_message(resp.encoded_len(), |buf| resp.encode_raw(buf));
    }
    let store = t.replica.read();
    let view = store.range_view(&req)?;
    let header = t.header(view.revision());
    grpc_message(view.encoded_len(&header), |buf| {
        view.encode_raw(&header, buf)
    })
}

/// One uncompressed gRPC message of `len` bytes, which `encode` writes after the prefix.
fn grpc_message(len: usize, encode: impl FnOnce(&mut BytesMut)) -> Result<Bytes, Error> {
    let mut buf = BytesMut::with_capacity(GRPC_HEADER_LEN + len);
    buf.put_u8(0);
    buf.put_u32(u32::try_from(len).map_err(|_| Error::ResponseTooLarge(len))?);
    encode(&mut buf);
    Ok(buf.freeze())
}

/// What a Range over keys reads under one hold of the replica's lock: about a millisecond of
/// work here. Between two steps the apply loop (and every reader queued behind it) gets the
/// store, so a LIST of a large prefix no longer holds the tenant's writes back for its whole
/// length (docs/frontend.md, "Large ranges read in steps").
pub(crate) const SCAN_STEP: StepBudget = StepBudget {
    keys: 4_096,
    bytes: 1 << 20,
};
/// How often a Range over keys is begun in steps after compactions came between its steps,
/// before it reads under one hold of the lock. One at the current revision begins again at a
/// later revision (as linearizable); one pinned to a revision a compaction passed fails as it
/// would have had it come after the compaction.
pub(crate) const SCAN_ATTEMPTS: u32 = 3;

/// Reads a Range from the replica: a point read at once, a range over keys in steps
/// (`MemStore::range_scan`), at the revision of the store when it began.
async fn read_range(t: &Tenant, req: &RangeRequest) -> Result<RangeResponse, Error> {
    if !req.range_end.is_empty() {
        let scan = t
            .replica
            .in_steps(
                SCAN_ATTEMPTS,
                |s| s.range_scan(req),
                |scan, s| scan.step(s, SCAN_STEP),
            )
            .await?;
        if let Some(scan) = scan {
            return Ok(scan.into_response());
        }
    }
    // A point read, or the whole range under one hold of the lock: `range` is the scan in one
    // step.
    Ok(t.replica.read().range(req)?)
}

/// What a Range checks and waits for before it reads the replica: its form, the read point,
/// then (with the tenant's auth enabled) READ on its keys, against the auth state at that point.
async fn range_ready(t: &Tenant, caller: &Caller, req: &RangeRequest) -> Result<(), Error> {
    // No size check: etcd checks the size of what it proposes to Raft, and a Range is served
    // from a read index (gRPC's own limit, `--max-request-bytes` + 512 KiB, still holds).
    memstore::validate::range(req)?;
    if !req.serializable {
        t.read_point().await?;
    }
    if t.replica.auth_enabled() {
        t.replica
            .read()
            .check_read(caller.as_store(), &req.key, &req.range_end)?;
    }
    Ok(())
}

pub(crate) async fn put(
    t: &Tenant,
    id: RequestId,
    caller: &Caller,
    req: PutRequest,
) -> Result<PutResponse, Error> {
    // etcd's gRPC layer validates the request before the server sizes its Raft proposal.
    memstore::validate::put(&req)?;
    t.check_size(req.encoded_len())?;
    let applied = t.propose(&id, caller, Intent::Put(req)).await?;
    match applied.outcome {
        Outcome::Put(mut r) => {
            r.header = Some(t.header(applied.revision));
            Ok(r)
        }
        Outcome::Failed(e) => Err(e.into()),
        _ => Err(Error::UnexpectedOutcome("Put")),
    }
}

pub(crate) async fn delete_range(
    t: &Tenant,
    id: RequestId,
    caller: &Caller,
    req: DeleteRangeRequest,
) -> Result<DeleteRangeResponse, Error> {
    memstore::validate::delete_range(&req)?;
    t.check_size(req.encoded_len())?;
    let applied = t.propose(&id, caller, Intent::DeleteRange(req)).await?;
    match applied.outcome {
        Outcome::DeleteRange(mut r) => {
            r.header = Some(t.header(applied.revision));
            Ok(r)
        }
        Outcome::Failed(e) => Err(e.into()),
        _ => Err(Error::UnexpectedOutcome("DeleteRange")),
    }
}

pub(crate) async fn txn(
    t: &Tenant,
    id: RequestId,
    caller: &Caller,
    req: TxnRequest,
) -> Result<TxnResponse, Error> {
    memstore::validate::txn(&req, t.limits.max_txn_ops)?;
    if crate::read_txn::is_read_only(&req) {
        // Served from a read index, as etcd serves it: no proposal to size.
        return read_only_txn(t, caller, &req).await;
    }
    t.check_size(req.encoded_len())?;
    let applied = t.propose(&id, caller, Intent::Txn(req)).await?;
    match applied.outcome {
        Outcome::Txn(mut r) => {
            r.header = Some(t.header(applied.revision));
            Ok(r)
        }
        Outcome::Failed(e) => Err(e.into()),
        _ => Err(Error::UnexpectedOutcome("Txn")),
    }
}

/// A txn whose every op is a Range: served on the read path like a Range (etcd's
/// `isTxnReadonly`), compares and ranges at one revision of the local replica, its ranges over
/// keys read in steps as a lone Range's (`read_txn::TxnScan`).
async fn read_only_txn(
    t: &Tenant,
    caller: &Caller,
    req: &TxnRequest,
) -> Result<TxnResponse, Error> {
    if !crate::read_txn::is_serializable(req) {
        t.read_point().await?;
    }
    if t.replica.auth_enabled() {
        t.replica.read().check_txn(caller.as_store(), req)?;
    }
    let scan = t
        .replica
        .in_steps(
            SCAN_ATTEMPTS,
            |s| crate::read_txn::TxnScan::begin(s, req),
            |scan, s| scan.step(s, SCAN_STEP),
        )
        .await?;
    let (mut resp, revision) = match scan {
        Some(scan) => {
            let revision = scan.revision();
            (scan.into_response(), revision)
        }
        None => {
            // Compactions kept coming between the steps: under one hold of the lock.
            let store = t.replica.read();
            (crate::read_txn::execute(&store, req)?, store.revision())
        }
    };
    resp.header = Some(t.header(revision));
    Ok(resp)
}

async fn compact(
    t: &Tenant,
    id: RequestId,
    caller: &Caller,
    req: CompactionRequest,
) -> Result<CompactionResponse, Error> {
    t.check_size(req.encoded_len())?;
    // Checked against a replica that has caught up with every committed write, so a
    // revision that exists is never refused as a future one.
    t.barrier().await?;
    memstore::validate::compact(&req, &t.replica.read())?;
    let applied = t.propose(&id, caller, Intent::Compact(req)).await?;
    match applied.outcome {
        Outcome::Compact(mut r) => {
            r.header = Some(t.header(applied.revision));
            Ok(r)
        }
        Outcome::Failed(e) => Err(e.into()),
        _ => Err(Error::UnexpectedOutcome("Compact")),
    }
}

#[tonic::async_trait]
impl Kv for KvService {
    async fn range(&self, req: Request<RangeRequest>) -> Result<Response<RangeResponse>, Status> {
        self.tenants
            .serve_request("Range", req, |t, _, caller, r| async move {
                range(&t, &caller, r).await
            })
            .await
    }

    async fn put(&self, req: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        self.tenants
            .serve_request("Put", req, |t, id, caller, r| async move {
                put(&t, id, &caller, r).await
            })
            .await
    }

    async fn delete_range(
        &self,
        req: Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        self.tenants
            .serve_request("DeleteRange", req, |t, id, caller, r| async move {
                delete_range(&t, id, &caller, r).await
            })
            .await
    }

    async fn txn(&self, req: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        self.tenants
            .serve_request("Txn", req, |t, id, caller, r| async move {
                txn(&t, id, &caller, r).await
            })
            .await
    }

    async fn compact(
        &self,
        req: Request<CompactionRequest>,
    ) -> Result<Response<CompactionResponse>, Status> {
        self.tenants
            .serve_request("Compact", req, |t, id, caller, r| async move {
                compact(&t, id, &caller, r).await
            })
            .await
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::log::MemLog;
    use api::etcdserverpb::range_request::{SortOrder, SortTarget};
    use memstore::MemStore;

    fn tenant() -> Arc<Tenant> {
        let store = MemStore::new(memstore::Config::default());
        crate::tenant::test_tenant(
            store,
            Arc::new(MemLog::new()),
            u64::MAX - 7,
            0x1234_5678_9abc,
        )
    }

    /// A Range over a large key range lets writes apply while it reads (it reads in steps and
    /// gives the replica's lock back between them): a put made after the Range began is answered
    /// before the Range is, and the Range answers the store as it was when it began. One thread
    /// runs every task in turn, so the order does not depend on the machine's speed.
    #[tokio::test]
    async fn a_large_range_does_not_hold_writes_back() {
        const KEYS: usize = 200_000;
        let (t, before) = large_tenant(KEYS);
        let all = RangeRequest {
            key: b"k".to_vec(),
            range_end: b"l".to_vec(),
            serializable: true,
            ..Default::default()
        };
        let listing = {
            let t = t.clone();
            tokio::spawn(async move {
                let resp = range(&t, &Caller::default(), all).await.unwrap();
                (resp, std::time::Instant::now())
            })
        };
        // Let the Range begin: it reads its first step and yields.
        tokio::task::yield_now().await;
        let put_answered = late_put(&t).await;
        let (resp, range_answered) = listing.await.unwrap();
        assert_eq!(resp.count, KEYS as i64);
        assert_eq!(resp.header.unwrap().revision, before, "read at its start");
        assert!(resp.kvs.iter().all(|kv| kv.key != b"k~late"));
        assert!(
            put_answered < range_answered,
            "the put waited for the range ({:?} after it)",
            put_answered - range_answered
        );
    }

    /// A compaction past the revision a large Range reads at, landing between two of its steps:
    /// a Range at the current revision begins again (and sees what came before the compaction),
    /// one pinned to that revision fails as compacted.
    #[tokio::test]
    async fn a_compaction_during_a_large_range_makes_it_begin_again() {
        const KEYS: usize = 400_000;
        let (t, before) = large_tenant(KEYS);
        let all = |revision| RangeRequest {
            key: b"k".to_vec(),
            range_end: b"l".to_vec(),
            serializable: true,
            // Not `count_only`: that is counted at once, with no steps to come between.
            keys_only: true,
            revision,
            ..Default::default()
        };
        let ranges = [0, before].map(|revision| {
            let t = t.clone();
            tokio::spawn(async move { range(&t, &Caller::default(), all(revision)).await })
        });
        let reading = {
            let t = t.clone();
            tokio::spawn(async move {
                txn(
                    &t,
                    RequestId::random(),
                    &Caller::default(),
                    read_only_txn_over_all(),
                )
                .await
            })
        };
        // Let both Ranges begin: each reads its first step and yields.
        tokio::task::yield_now().await;
        late_put(&t).await;
        let compaction = CompactionRequest {
            revision: before + 1,
            ..Default::default()
        };
        compact(&t, RequestId::random(), &Caller::default(), compaction)
            .await
            .unwrap();
        let [latest, pinned] = ranges;
        let latest = latest.await.unwrap().unwrap();
        assert_eq!(
            latest.count,
            KEYS as i64 + 1,
            "read again after the compaction"
        );
        assert!(latest.header.unwrap().revision > before);
        let pinned = pinned.await.unwrap().unwrap_err();
        assert!(
            matches!(pinned, Error::Store(memstore::Error::Compacted)),
            "{pinned:?}"
        );
        // The txn began again too, its compare evaluated again: k~late exists by then.
        let again = reading.await.unwrap().unwrap();
        assert!(!again.succeeded);
        assert!(again.header.unwrap().revision > before);
        assert_eq!(range_count(&again, 0), KEYS as i64 + 1);
    }

    /// A read-only Txn: if `k~late` does not exist, a range over every `k…` key (keys only)
    /// and a point read of `k~late`; else the same range alone.
    fn read_only_txn_over_all() -> TxnRequest {
        use api::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
        use api::etcdserverpb::{Compare, RequestOp, request_op};
        let op = |key: &[u8], range_end: &[u8]| RequestOp {
            request: Some(request_op::Request::RequestRange(RangeRequest {
                key: key.to_vec(),
                range_end: range_end.to_vec(),
                serializable: true,
                keys_only: true,
                ..Default::default()
            })),
        };
        TxnRequest {
            compare: vec![Compare {
                key: b"k~late".to_vec(),
                target: CompareTarget::Version as i32,
                result: CompareResult::Equal as i32,
                target_union: Some(TargetUnion::Version(0)),
                ..Default::default()
            }],
            success: vec![op(b"k", b"l"), op(b"k~late", b"")],
            failure: vec![op(b"k", b"l")],
        }
    }

    fn range_count(resp: &TxnResponse, i: usize) -> i64 {
        match &resp.responses[i].response {
            Some(api::etcdserverpb::response_op::Response::ResponseRange(r)) => r.count,
            other => panic!("not a range: {other:?}"),
        }
    }

    /// A read-only Txn's range over many keys reads in steps as a lone Range's: a put made
    /// after the txn began is answered before it, and the txn answers the store as it was when
    /// it began, its compare included.
    #[tokio::test]
    async fn a_large_read_only_txn_does_not_hold_writes_back() {
        const KEYS: usize = 200_000;
        let (t, before) = large_tenant(KEYS);
        let reading = {
            let t = t.clone();
            tokio::spawn(async move {
                let resp = txn(
                    &t,
                    RequestId::random(),
                    &Caller::default(),
                    read_only_txn_over_all(),
                )
                .await;
                (resp.unwrap(), std::time::Instant::now())
            })
        };
        tokio::task::yield_now().await;
        let put_answered = late_put(&t).await;
        let (resp, txn_answered) = reading.await.unwrap();
        assert!(resp.succeeded, "k~late did not exist when the txn began");
        assert_eq!(resp.header.unwrap().revision, before, "read at its start");
        assert_eq!(range_count(&resp, 0), KEYS as i64);
        assert_eq!(range_count(&resp, 1), 0, "k~late came after the txn began");
        assert!(
            put_answered < txn_answered,
            "the put waited for the txn ({:?} after it)",
            put_answered - txn_answered
        );
    }

    /// A put of a new key `k~late` through `t`, answered at the instant returned.
    pub(crate) async fn late_put(t: &Tenant) -> std::time::Instant {
        let late = PutRequest {
            key: b"k~late".to_vec(),
            value: b"w".to_vec(),
            ..Default::default()
        };
        put(t, RequestId::random(), &Caller::default(), late)
            .await
            .unwrap();
        std::time::Instant::now()
    }

    /// A tenant over an in-memory log whose store holds `keys` keys `k0000000`, ... (16-byte
    /// values, written by txns of 50,000 puts straight into the store), and its revision.
    pub(crate) fn large_tenant(keys: usize) -> (Arc<Tenant>, i64) {
        use api::etcdserverpb::{RequestOp, request_op};
        use api::strata::entry::Entry;
        const PER_TXN: usize = 50_000;
        let txns = keys.div_ceil(PER_TXN) as u64;
        let mut store = MemStore::new(memstore::Config::default());
        for i in 0..txns {
            let puts = (i as usize * PER_TXN..keys.min((i as usize + 1) * PER_TXN))
                .map(|j| RequestOp {
                    request: Some(request_op::Request::RequestPut(PutRequest {
                        key: format!("k{j:07}").into_bytes(),
                        value: vec![b'v'; 16],
                        ..Default::default()
                    })),
                })
                .collect();
            let entry = Entry {
                format_version: 1,
                tenant: "t".into(),
                request: Some(Intent::Txn(TxnRequest {
                    success: puts,
                    ..Default::default()
                })),
                ..Default::default()
            };
            store.apply(i + 1, &entry);
        }
        let before = store.revision();
        let log = Arc::new(MemLog::new());
        // The store stands for the log's first records.
        for _ in 0..txns {
            log.tick();
        }
        let t = crate::tenant::test_tenant(store, log, 1, 2);
        (t, before)
    }

    /// The frame `range` would be answered with through prost.
    fn framed(resp: &RangeResponse) -> Bytes {
        let mut buf = BytesMut::new();
        buf.put_u8(0);
        buf.put_u32(u32::try_from(resp.encoded_len()).unwrap());
        resp.encode_raw(&mut buf);
        buf.freeze()
    }

    #[tokio::test]
    async fn range_message_is_the_range_answer_byte_for_byte() {
        let t = tenant();
        for (i, key) in ["a", "b", "b1", "c", "a"].iter().enumerate() {
            let req = PutRequest {
                key: key.as_bytes().to_vec(),
                value: vec![b'v'; i * 100],
                ..Default::default()
            };
            put(&t, RequestId::random(), &Caller::default(), req)
                .await
                .unwrap();
        }
        let req = |key: &str, end: &str| RangeRequest {
            key: key.as_bytes().to_vec(),
            range_end: end.as_bytes().to_vec(),
            ..Default::default()
        };
        let cases = vec![
            req("a", ""),
            req("missing", ""),
            RangeRequest {
                revision: 1,
                ..req("a", "")
            },
            RangeRequest {
                keys_only: true,
                serializable: true,
                ..req("b", "")
            },
            RangeRequest {
                count_only: true,
                ..req("a", "")
            },
            req("a", "c"),
            req("\0", "\0"),
            RangeRequest {
                limit: 1,
                sort_order: SortOrder::Descend as i32,
                sort_target: SortTarget::Value as i32,
                ..req("a", "z")
            },
            RangeRequest {
                min_mod_revision: 3,
                ..req("a", "")
            },
        ];
        for case in cases {
            let expected = framed(&range(&t, &Caller::default(), case.clone()).await.unwrap());
            let ours = range_message(&t, &Caller::default(), case.clone())
                .await
                .unwrap();
            assert_eq!(ours, expected, "{case:?}");
        }
        // Errors are the same errors: a future revision, and a compacted one.
        let compaction = CompactionRequest {
            revision: 3,
            ..Default::default()
        };
        compact(&t, RequestId::random(), &Caller::default(), compaction)
            .await
            .unwrap();
        for revision in [99, 2] {
            let case = RangeRequest {
                revision,
                ..req("a", "")
            };
            let a = range(&t, &Caller::default(), case.clone())
                .await
                .unwrap_err()
                .to_string();
            let b = range_message(&t, &Caller::default(), case)
                .await
                .unwrap_err()
                .to_string();
            assert_eq!(a, b);
        }
    }
}
