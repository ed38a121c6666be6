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
use memstore::Outcome;
use prost::Message;
use tonic::{Request, Response, Status};

use crate::errors::Error;
use crate::fast_kv::GRPC_HEADER_LEN;
use crate::rpc::{RequestId, unary};
use crate::tenant::Tenant;
use crate::tenants::Tenants;

pub struct KvService {
    tenants: Arc<Tenants>,
}

impl KvService {
    pub fn new(tenants: Arc<Tenants>) -> Self {
        Self { tenants }
    }

    fn tenant<T>(&self, req: &Request<T>) -> Result<Arc<Tenant>, Status> {
        self.tenants
            .resolve(req.metadata())
            .map_err(crate::rpc::handled)
    }
}

/// Header revision of a store answer, else the given one.
fn revision_of(h: &Option<ResponseHeader>, fallback: i64) -> i64 {
    h.as_ref().map_or(fallback, |h| h.revision)
}

pub(crate) async fn range(t: &Tenant, req: RangeRequest) -> Result<RangeResponse, Error> {
    range_ready(t, &req).await?;
    let mut resp = t.replica.read().range(&req)?;
    let rev = revision_of(&resp.header, 0);
    resp.header = Some(t.header(rev));
    Ok(resp)
}

/// A Range answered as one length-prefixed gRPC message, encoded straight from the store
/// (`MemStore::range_view`: a point read copies its key and value once, into the answer's
/// buffer, with no response structs in between). Same answer, byte for byte, as [`range`]
/// encoded by prost.
pub(crate) async fn range_message(t: &Tenant, req: RangeRequest) -> Result<Bytes, Error> {
    range_ready(t, &req).await?;
    let store = t.replica.read();
    let view = store.range_view(&req)?;
    let header = t.header(view.revision());
    let len = view.encoded_len(&header);
    let mut buf = BytesMut::with_capacity(GRPC_HEADER_LEN + len);
    buf.put_u8(0);
    buf.put_u32(u32::try_from(len).map_err(|_| Error::ResponseTooLarge(len))?);
    view.encode_raw(&header, &mut buf);
    Ok(buf.freeze())
}

/// What a Range checks and waits for before it reads the replica.
async fn range_ready(t: &Tenant, req: &RangeRequest) -> Result<(), Error> {
    // No size check: etcd checks the size of what it proposes to Raft, and a Range is served
    // from a read index (gRPC's own limit, `--max-request-bytes` + 512 KiB, still holds).
    memstore::validate::range(req)?;
    if !req.serializable {
        t.barrier().await?;
    }
    Ok(())
}

pub(crate) async fn put(t: &Tenant, id: RequestId, req: PutRequest) -> Result<PutResponse, Error> {
    // etcd's gRPC layer validates the request before the server sizes its Raft proposal.
    memstore::validate::put(&req)?;
    t.check_size(req.encoded_len())?;
    let applied = t.propose(&id, Intent::Put(req)).await?;
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
    req: DeleteRangeRequest,
) -> Result<DeleteRangeResponse, Error> {
    memstore::validate::delete_range(&req)?;
    t.check_size(req.encoded_len())?;
    let applied = t.propose(&id, Intent::DeleteRange(req)).await?;
    match applied.outcome {
        Outcome::DeleteRange(mut r) => {
            r.header = Some(t.header(applied.revision));
            Ok(r)
        }
        Outcome::Failed(e) => Err(e.into()),
        _ => Err(Error::UnexpectedOutcome("DeleteRange")),
    }
}

pub(crate) async fn txn(t: &Tenant, id: RequestId, req: TxnRequest) -> Result<TxnResponse, Error> {
    memstore::validate::txn(&req, t.limits.max_txn_ops)?;
    if crate::read_txn::is_read_only(&req) {
        // Served from a read index, as etcd serves it: no proposal to size.
        return read_only_txn(t, &req).await;
    }
    t.check_size(req.encoded_len())?;
    let applied = t.propose(&id, Intent::Txn(req)).await?;
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
/// `isTxnReadonly`), compares and ranges at one revision of the local replica.
async fn read_only_txn(t: &Tenant, req: &TxnRequest) -> Result<TxnResponse, Error> {
    if !crate::read_txn::is_serializable(req) {
        t.barrier().await?;
    }
    let store = t.replica.read();
    let mut resp = crate::read_txn::execute(&store, req)?;
    resp.header = Some(t.header(store.revision()));
    Ok(resp)
}

async fn compact(
    t: &Tenant,
    id: RequestId,
    req: CompactionRequest,
) -> Result<CompactionResponse, Error> {
    t.check_size(req.encoded_len())?;
    // Checked against a replica that has caught up with every committed write, so a
    // revision that exists is never refused as a future one.
    t.barrier().await?;
    memstore::validate::compact(&req, &t.replica.read())?;
    let applied = t.propose(&id, Intent::Compact(req)).await?;
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
        let t = self.tenant(&req)?;
        let id = RequestId::random();
        unary("Range", &t.name, id, range(&t, req.into_inner())).await
    }

    async fn put(&self, req: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        let t = self.tenant(&req)?;
        let id = RequestId::random();
        unary("Put", &t.name, id, put(&t, id, req.into_inner())).await
    }

    async fn delete_range(
        &self,
        req: Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        let t = self.tenant(&req)?;
        let id = RequestId::random();
        unary(
            "DeleteRange",
            &t.name,
            id,
            delete_range(&t, id, req.into_inner()),
        )
        .await
    }

    async fn txn(&self, req: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        let t = self.tenant(&req)?;
        let id = RequestId::random();
        unary("Txn", &t.name, id, txn(&t, id, req.into_inner())).await
    }

    async fn compact(
        &self,
        req: Request<CompactionRequest>,
    ) -> Result<Response<CompactionResponse>, Status> {
        let t = self.tenant(&req)?;
        let id = RequestId::random();
        unary("Compact", &t.name, id, compact(&t, id, req.into_inner())).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::MemLog;
    use crate::tenant::{Identity, Limits};
    use api::etcdserverpb::range_request::{SortOrder, SortTarget};
    use memstore::MemStore;

    fn tenant() -> Arc<Tenant> {
        Tenant::start(
            "t",
            0,
            MemStore::new(memstore::Config::default()),
            None,
            Arc::new(MemLog::new()),
            Limits {
                max_request_bytes: 1 << 20,
                max_txn_ops: 128,
                no_leader_after: crate::config::DEFAULT_NO_LEADER_AFTER,
            },
            Identity {
                cluster_id: u64::MAX - 7,
                member_id: 0x1234_5678_9abc,
            },
        )
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
            put(&t, RequestId::random(), req).await.unwrap();
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
            let expected = framed(&range(&t, case.clone()).await.unwrap());
            let ours = range_message(&t, case.clone()).await.unwrap();
            assert_eq!(ours, expected, "{case:?}");
        }
        // Errors are the same errors: a future revision, and a compacted one.
        let compaction = CompactionRequest {
            revision: 3,
            ..Default::default()
        };
        compact(&t, RequestId::random(), compaction).await.unwrap();
        for revision in [99, 2] {
            let case = RangeRequest {
                revision,
                ..req("a", "")
            };
            let a = range(&t, case.clone()).await.unwrap_err().to_string();
            let b = range_message(&t, case).await.unwrap_err().to_string();
            assert_eq!(a, b);
        }
    }
}
