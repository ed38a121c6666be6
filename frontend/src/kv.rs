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
use memstore::Outcome;
use prost::Message;
use tonic::{Request, Response, Status};

use crate::errors::Error;
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
    t.check_size(req.encoded_len())?;
    memstore::validate::range(&req)?;
    if !req.serializable {
        t.barrier().await?;
    }
    let mut resp = t.replica.read().range(&req)?;
    let rev = revision_of(&resp.header, 0);
    resp.header = Some(t.header(rev));
    Ok(resp)
}

pub(crate) async fn put(t: &Tenant, id: RequestId, req: PutRequest) -> Result<PutResponse, Error> {
    t.check_size(req.encoded_len())?;
    memstore::validate::put(&req)?;
    let applied = t.propose(&id, Intent::Put(req)).await?;
    match applied.outcome {
        Outcome::Put(mut r) => {
            r.header = Some(t.header(applied.revision));
            Ok(r)
        }
        Outcome::Duplicate { revision } => Ok(PutResponse {
            header: Some(t.header(revision)),
            ..Default::default()
        }),
        Outcome::Failed(e) => Err(e.into()),
        _ => Err(Error::UnexpectedOutcome("Put")),
    }
}

pub(crate) async fn delete_range(
    t: &Tenant,
    id: RequestId,
    req: DeleteRangeRequest,
) -> Result<DeleteRangeResponse, Error> {
    t.check_size(req.encoded_len())?;
    memstore::validate::delete_range(&req)?;
    let applied = t.propose(&id, Intent::DeleteRange(req)).await?;
    match applied.outcome {
        Outcome::DeleteRange(mut r) => {
            r.header = Some(t.header(applied.revision));
            Ok(r)
        }
        Outcome::Duplicate { revision } => Ok(DeleteRangeResponse {
            header: Some(t.header(revision)),
            ..Default::default()
        }),
        Outcome::Failed(e) => Err(e.into()),
        _ => Err(Error::UnexpectedOutcome("DeleteRange")),
    }
}

pub(crate) async fn txn(t: &Tenant, id: RequestId, req: TxnRequest) -> Result<TxnResponse, Error> {
    t.check_size(req.encoded_len())?;
    memstore::validate::txn(&req, t.limits.max_txn_ops)?;
    if crate::read_txn::is_read_only(&req) {
        return read_only_txn(t, &req).await;
    }
    let applied = t.propose(&id, Intent::Txn(req)).await?;
    match applied.outcome {
        Outcome::Txn(mut r) => {
            r.header = Some(t.header(applied.revision));
            Ok(r)
        }
        Outcome::Duplicate { revision } => Ok(TxnResponse {
            header: Some(t.header(revision)),
            ..Default::default()
        }),
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
        Outcome::Duplicate { revision } => Ok(CompactionResponse {
            header: Some(t.header(revision)),
        }),
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
