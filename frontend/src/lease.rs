//! The etcd `Lease` service: Grant, Revoke and every keep-alive journalled as intents (so expiry
//! is decided by journal time on every replica alike); TimeToLive and Leases read the replica
//! after a linearizable barrier.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use api::etcdserverpb::lease_server::Lease;
use api::etcdserverpb::{
    LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    LeaseLeasesRequest, LeaseLeasesResponse, LeaseRevokeRequest, LeaseRevokeResponse,
    LeaseTimeToLiveRequest, LeaseTimeToLiveResponse,
};
use api::strata::entry::entry::Request as Intent;
use futures::{Stream, StreamExt};
use memstore::Outcome;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

use crate::errors::Error;
use crate::rpc::{RequestId, handled, observe, unary};
use crate::tenant::Tenant;
use crate::tenants::Tenants;

/// Keep-alive answers buffered per stream before the stream stops reading requests.
pub const KEEPALIVE_QUEUE: usize = 16;

pub struct LeaseService {
    tenants: Arc<Tenants>,
}

impl LeaseService {
    pub fn new(tenants: Arc<Tenants>) -> Self {
        Self { tenants }
    }

    fn tenant<T>(&self, req: &Request<T>) -> Result<Arc<Tenant>, Status> {
        self.tenants.resolve(req.metadata()).map_err(handled)
    }
}

/// A server-chosen lease id, as etcd picks one: random, positive, never 0.
fn new_lease_id() -> i64 {
    loop {
        let id = rand::random::<i64>() & i64::MAX;
        if id != 0 {
            return id;
        }
    }
}

async fn grant(
    t: &Tenant,
    id: RequestId,
    mut req: LeaseGrantRequest,
) -> Result<LeaseGrantResponse, Error> {
    if req.id == 0 {
        req.id = new_lease_id();
    }
    memstore::validate::lease_grant(&req, &memstore::Config::default())?;
    let applied = t.propose(&id, Intent::LeaseGrant(req)).await?;
    match applied.outcome {
        Outcome::LeaseGrant(mut r) => {
            r.header = Some(t.header(applied.revision));
            Ok(r)
        }
        Outcome::Duplicate { revision } => Err(Error::OutcomeUnknown { revision }),
        Outcome::Failed(e) => Err(e.into()),
        _ => Err(Error::UnexpectedOutcome("LeaseGrant")),
    }
}

async fn revoke(
    t: &Tenant,
    id: RequestId,
    req: LeaseRevokeRequest,
) -> Result<LeaseRevokeResponse, Error> {
    let applied = t.propose(&id, Intent::LeaseRevoke(req)).await?;
    match applied.outcome {
        Outcome::LeaseRevoke(mut r) => {
            r.header = Some(t.header(applied.revision));
            Ok(r)
        }
        Outcome::Duplicate { revision } => Ok(LeaseRevokeResponse {
            header: Some(t.header(revision)),
        }),
        Outcome::Failed(e) => Err(e.into()),
        _ => Err(Error::UnexpectedOutcome("LeaseRevoke")),
    }
}

/// One keep-alive: journalled, answered from the outcome. A lease that does not exist (any
/// more) is answered with TTL 0, as etcd does, not with an error.
async fn keep_alive(
    t: &Tenant,
    id: RequestId,
    req: LeaseKeepAliveRequest,
) -> Result<LeaseKeepAliveResponse, Error> {
    let lease = req.id;
    let applied = t.propose(&id, Intent::LeaseKeepAlive(req)).await?;
    match applied.outcome {
        Outcome::LeaseKeepAlive(mut r) => {
            r.header = Some(t.header(applied.revision));
            Ok(r)
        }
        Outcome::Failed(memstore::Error::LeaseNotFound) => Ok(LeaseKeepAliveResponse {
            header: Some(t.header(applied.revision)),
            id: lease,
            ttl: 0,
        }),
        Outcome::Duplicate { revision } => Err(Error::OutcomeUnknown { revision }),
        Outcome::Failed(e) => Err(e.into()),
        _ => Err(Error::UnexpectedOutcome("LeaseKeepAlive")),
    }
}

/// TimeToLive of a lease that does not exist answers TTL -1, as etcd does.
async fn time_to_live(
    t: &Tenant,
    req: LeaseTimeToLiveRequest,
) -> Result<LeaseTimeToLiveResponse, Error> {
    t.barrier().await?;
    let (result, revision) = {
        let store = t.replica.read();
        (store.lease_time_to_live(req.id, req.keys), store.revision())
    };
    match result {
        Ok(mut r) => {
            r.header = Some(t.header(revision));
            Ok(r)
        }
        Err(memstore::Error::LeaseNotFound) => Ok(LeaseTimeToLiveResponse {
            header: Some(t.header(revision)),
            id: req.id,
            ttl: -1,
            granted_ttl: 0,
            keys: Vec::new(),
        }),
        Err(e) => Err(e.into()),
    }
}

async fn leases(t: &Tenant) -> Result<LeaseLeasesResponse, Error> {
    t.barrier().await?;
    let (mut r, revision) = {
        let store = t.replica.read();
        (store.lease_leases(), store.revision())
    };
    r.header = Some(t.header(revision));
    Ok(r)
}

type KeepAliveStream =
    Pin<Box<dyn Stream<Item = Result<LeaseKeepAliveResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl Lease for LeaseService {
    async fn lease_grant(
        &self,
        req: Request<LeaseGrantRequest>,
    ) -> Result<Response<LeaseGrantResponse>, Status> {
        let t = self.tenant(&req)?;
        let id = RequestId::random();
        unary("LeaseGrant", &t.name, id, grant(&t, id, req.into_inner())).await
    }

    async fn lease_revoke(
        &self,
        req: Request<LeaseRevokeRequest>,
    ) -> Result<Response<LeaseRevokeResponse>, Status> {
        let t = self.tenant(&req)?;
        let id = RequestId::random();
        unary("LeaseRevoke", &t.name, id, revoke(&t, id, req.into_inner())).await
    }

    type LeaseKeepAliveStream = KeepAliveStream;

    async fn lease_keep_alive(
        &self,
        req: Request<Streaming<LeaseKeepAliveRequest>>,
    ) -> Result<Response<Self::LeaseKeepAliveStream>, Status> {
        let t = self.tenant(&req)?;
        let require_leader = crate::watch::requires_leader(req.metadata());
        if require_leader && !t.has_leader() {
            return Err(crate::watch::no_leader());
        }
        let mut incoming = req.into_inner();
        let (tx, rx) = mpsc::channel(KEEPALIVE_QUEUE);
        if require_leader {
            let t = t.clone();
            crate::watch::end_without_leader(&tx, move || t.has_leader());
        }
        let stream_id = RequestId::random();
        let span =
            tracing::info_span!("lease_keep_alive", tenant = %t.name, stream_id = %stream_id);
        tokio::spawn(
            async move {
                while let Some(msg) = incoming.next().await {
                    let req = match msg {
                        Ok(r) => r,
                        Err(e) => {
                            tracing::debug!(error = %e, "keep-alive stream ended by client");
                            return;
                        }
                    };
                    let id = RequestId::random();
                    let start = Instant::now();
                    let out = keep_alive(&t, id, req)
                        .instrument(tracing::debug_span!("keep_alive", request_id = %id))
                        .await
                        .map_err(handled);
                    observe(
                        "LeaseKeepAlive",
                        &t.name,
                        start,
                        out.as_ref().err().map(Status::code),
                    );
                    let failed = out.is_err();
                    if tx.send(out).await.is_err() || failed {
                        return;
                    }
                }
            }
            .instrument(span),
        );
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn lease_time_to_live(
        &self,
        req: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        let t = self.tenant(&req)?;
        let id = RequestId::random();
        unary(
            "LeaseTimeToLive",
            &t.name,
            id,
            time_to_live(&t, req.into_inner()),
        )
        .await
    }

    async fn lease_leases(
        &self,
        req: Request<LeaseLeasesRequest>,
    ) -> Result<Response<LeaseLeasesResponse>, Status> {
        let t = self.tenant(&req)?;
        let id = RequestId::random();
        unary("LeaseLeases", &t.name, id, leases(&t)).await
    }
}
