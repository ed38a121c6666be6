//! A fault run's connection to one frontend as one tenant's client, over either of the two
//! client stacks a deployment meets: the `etcd-client` crate, which cannot name a tenant (the
//! frontend's default tenant answers it), or [`TenantClient`], the clients generated from
//! etcd's own `.proto` files, naming a catalogue tenant in the `x-strata-tenant` header as the
//! trusted proxy in front of production's frontends does. The workload, the observer, the
//! watchers, the lease keeper and the final checks speak only [`Conn`], so both stacks run the
//! same workload and answer to the same checks (docs/design/faults.md).

use std::collections::BTreeMap;

use api::etcdserverpb as pb;
use api::mvccpb;
use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, PutOptions, Txn, TxnOp, WatchOptions,
};
use futures::StreamExt;

use super::OP_TIMEOUT;
use crate::history::{Event, Kv, Outcome, Request, Response};
use crate::tenant::TenantClient;

/// How a workload's clients reach their tenant.
#[derive(Clone, Debug)]
pub enum Stack {
    /// The `etcd-client` crate, naming no tenant: the frontend's default tenant.
    EtcdClient,
    /// [`TenantClient`], naming this catalogue tenant in every request's header.
    Header(String),
}

impl Stack {
    /// The tenant's name, as frontends log it and reports say it.
    pub fn tenant(&self) -> &str {
        match self {
            Stack::EtcdClient => "default",
            Stack::Header(tenant) => tenant,
        }
    }

    /// Connects to `endpoint` (`http://host:port`); `None` if that fails or takes longer than
    /// [`OP_TIMEOUT`] (a paused frontend accepts and never answers).
    pub async fn connect(&self, endpoint: &str) -> Option<Conn> {
        let connect = async {
            match self {
                Stack::EtcdClient => etcd_client::Client::connect([endpoint], None)
                    .await
                    .ok()
                    .map(|c| Conn::Etcd(Box::new(c))),
                Stack::Header(tenant) => TenantClient::connect(endpoint, tenant)
                    .await
                    .ok()
                    .map(|c| Conn::Header(Box::new(c))),
            }
        };
        tokio::time::timeout(OP_TIMEOUT, connect).await.ok()?
    }
}

/// One connection of one tenant's client to one frontend.
/// (Both boxed: each client is large, and they differ in size.)
pub enum Conn {
    Etcd(Box<etcd_client::Client>),
    Header(Box<TenantClient>),
}

/// One message of a watch stream, as the checks need it.
pub struct WatchMessage {
    pub canceled: bool,
    pub cancel_reason: String,
    pub compact_revision: i64,
    pub events: Vec<Event>,
}

/// An open watch stream (the created message comes first, as from etcd).
pub enum Watch {
    Etcd(etcd_client::WatchStream),
    Header(tonic::Streaming<pb::WatchResponse>),
}

/// An open lease keep-alive stream of one lease.
pub enum KeepAlive {
    Etcd(etcd_client::LeaseKeeper, etcd_client::LeaseKeepAliveStream),
    Header(
        i64,
        futures::channel::mpsc::UnboundedSender<pb::LeaseKeepAliveRequest>,
        tonic::Streaming<pb::LeaseKeepAliveResponse>,
    ),
}

impl Conn {
    /// Sends `request` and waits for its outcome (at most [`OP_TIMEOUT`]).
    pub async fn perform(&mut self, request: &Request) -> Outcome {
        let call = async {
            match self {
                Conn::Etcd(c) => perform_etcd(c, request).await.map_err(|e| etcd_outcome(&e)),
                Conn::Header(c) => perform_named(c, request)
                    .await
                    .map_err(|s| status_outcome(&s)),
            }
        };
        match tokio::time::timeout(OP_TIMEOUT, call).await {
            Err(_) => Outcome::Unknown("timed out".into()),
            Ok(Err(failed)) => failed,
            Ok(Ok((revision, response))) => Outcome::Ok { revision, response },
        }
    }

    /// Compacts the tenant's keyspace at `revision`; whether it was acknowledged in time.
    pub async fn compact(&mut self, revision: i64) -> bool {
        let call = async {
            match self {
                Conn::Etcd(c) => c.compact(revision, None).await.is_ok(),
                Conn::Header(c) => {
                    let req = pb::CompactionRequest {
                        revision,
                        physical: false,
                    };
                    c.kv.compact(req).await.is_ok()
                }
            }
        };
        matches!(tokio::time::timeout(OP_TIMEOUT, call).await, Ok(true))
    }

    /// Grants a lease of `ttl` seconds: its id.
    pub async fn grant(&mut self, ttl: i64) -> Result<i64, String> {
        let call = async {
            match self {
                Conn::Etcd(c) => c
                    .lease_grant(ttl, None)
                    .await
                    .map(|r| r.id())
                    .map_err(|e| e.to_string()),
                Conn::Header(c) => c.grant(ttl).await.map_err(|s| s.to_string()),
            }
        };
        tokio::time::timeout(OP_TIMEOUT, call)
            .await
            .unwrap_or_else(|_| Err("timed out".into()))
    }

    /// Opens a keep-alive stream of `lease` and renews it once, as etcd's clients do: refused
    /// if the lease is gone.
    pub async fn keep_alive(&mut self, lease: i64) -> Result<KeepAlive, String> {
        let call = async {
            match self {
                Conn::Etcd(c) => c
                    .lease_keep_alive(lease)
                    .await
                    .map(|(keeper, stream)| KeepAlive::Etcd(keeper, stream))
                    .map_err(|e| e.to_string()),
                Conn::Header(c) => {
                    let (tx, rx) = futures::channel::mpsc::unbounded();
                    let first = pb::LeaseKeepAliveRequest { id: lease };
                    tx.unbounded_send(first).map_err(|e| e.to_string())?;
                    let mut stream = c
                        .lease
                        .lease_keep_alive(rx)
                        .await
                        .map_err(|s| s.to_string())?
                        .into_inner();
                    match stream.message().await.map_err(|s| s.to_string())? {
                        Some(r) if r.ttl > 0 => Ok(KeepAlive::Header(lease, tx, stream)),
                        _ => Err("lease not found".into()),
                    }
                }
            }
        };
        tokio::time::timeout(OP_TIMEOUT, call)
            .await
            .unwrap_or_else(|_| Err("timed out".into()))
    }

    /// Watches `[key, range_end)` (`range_end` empty: `key` alone) from `start_revision`, with
    /// progress notifications.
    pub async fn watch(
        &mut self,
        key: &str,
        range_end: &str,
        start_revision: i64,
    ) -> Result<Watch, String> {
        let call = async {
            match self {
                Conn::Etcd(c) => {
                    let mut options = WatchOptions::new()
                        .with_start_revision(start_revision)
                        .with_progress_notify();
                    if !range_end.is_empty() {
                        options = options.with_range(range_end);
                    }
                    c.watch(key, Some(options))
                        .await
                        .map(Watch::Etcd)
                        .map_err(|e| e.to_string())
                }
                Conn::Header(c) => {
                    use pb::watch_request::RequestUnion;
                    let create = pb::WatchRequest {
                        request_union: Some(RequestUnion::CreateRequest(pb::WatchCreateRequest {
                            key: key.into(),
                            range_end: range_end.into(),
                            start_revision,
                            progress_notify: true,
                            ..Default::default()
                        })),
                    };
                    // The request stream stays open: ending it would end the watch.
                    let requests =
                        futures::stream::iter([create]).chain(futures::stream::pending());
                    c.watch
                        .watch(requests)
                        .await
                        .map(|r| Watch::Header(r.into_inner()))
                        .map_err(|s| s.to_string())
                }
            }
        };
        tokio::time::timeout(OP_TIMEOUT, call)
            .await
            .unwrap_or_else(|_| Err("timed out".into()))
    }

    /// HashKV at `revision`.
    pub async fn hash_kv(&mut self, revision: i64) -> Result<u32, String> {
        match self {
            Conn::Etcd(c) => c
                .hash_kv(revision)
                .await
                .map(|h| h.hash())
                .map_err(|e| e.to_string()),
            Conn::Header(c) => c
                .maintenance
                .hash_kv(pb::HashKvRequest { revision })
                .await
                .map(|h| h.into_inner().hash)
                .map_err(|s| s.to_string()),
        }
    }

    /// Every key of the keyspace at `revision`.
    pub async fn range_all(&mut self, revision: i64) -> Result<BTreeMap<String, Kv>, String> {
        let key_of = |k: &[u8]| String::from_utf8_lossy(k).into_owned();
        match self {
            Conn::Etcd(c) => {
                let options = GetOptions::new().with_all_keys().with_revision(revision);
                let r = c.get("", Some(options)).await.map_err(|e| e.to_string())?;
                Ok(r.kvs()
                    .iter()
                    .map(|kv| (key_of(kv.key()), etcd_kv(kv)))
                    .collect())
            }
            Conn::Header(c) => {
                let req = pb::RangeRequest {
                    key: vec![0],
                    range_end: vec![0],
                    revision,
                    ..Default::default()
                };
                let r = c.kv.range(req).await.map_err(|s| s.to_string())?;
                Ok(r.into_inner()
                    .kvs
                    .iter()
                    .map(|kv| (key_of(&kv.key), pb_kv(kv)))
                    .collect())
            }
        }
    }
}

impl Watch {
    /// The next message; `None` once the stream ended.
    pub async fn message(&mut self) -> Result<Option<WatchMessage>, String> {
        match self {
            Watch::Etcd(s) => {
                let Some(r) = s.message().await.map_err(|e| e.to_string())? else {
                    return Ok(None);
                };
                Ok(Some(WatchMessage {
                    canceled: r.canceled(),
                    cancel_reason: r.cancel_reason().to_string(),
                    compact_revision: r.compact_revision(),
                    events: r.events().iter().filter_map(etcd_event).collect(),
                }))
            }
            Watch::Header(s) => {
                let Some(r) = s.message().await.map_err(|s| s.to_string())? else {
                    return Ok(None);
                };
                Ok(Some(WatchMessage {
                    canceled: r.canceled,
                    cancel_reason: r.cancel_reason,
                    compact_revision: r.compact_revision,
                    events: r.events.iter().filter_map(pb_event).collect(),
                }))
            }
        }
    }
}

impl KeepAlive {
    /// Renews the lease: the TTL answered (0 or less: the lease is gone).
    pub async fn renew(&mut self) -> Result<i64, String> {
        let answer = match self {
            KeepAlive::Etcd(keeper, stream) => {
                keeper.keep_alive().await.map_err(|e| e.to_string())?;
                stream
                    .message()
                    .await
                    .map_err(|e| e.to_string())?
                    .map(|r| r.ttl())
            }
            KeepAlive::Header(lease, tx, stream) => {
                let req = pb::LeaseKeepAliveRequest { id: *lease };
                tx.unbounded_send(req).map_err(|e| e.to_string())?;
                stream
                    .message()
                    .await
                    .map_err(|s| s.to_string())?
                    .map(|r| r.ttl)
            }
        };
        answer.ok_or_else(|| "the keep-alive stream ended".into())
    }
}

async fn perform_etcd(
    client: &mut etcd_client::Client,
    request: &Request,
) -> Result<(i64, Response), etcd_client::Error> {
    let revision = |h: Option<&etcd_client::ResponseHeader>| h.map_or(0, |h| h.revision());
    Ok(match request {
        Request::Get { key } => {
            let r = client.get(key.as_str(), None).await?;
            (
                revision(r.header()),
                Response::Get(r.kvs().first().map(etcd_kv)),
            )
        }
        Request::Put { key, value, lease } => {
            let options = (*lease != 0).then(|| PutOptions::new().with_lease(*lease));
            let r = client.put(key.as_str(), value.as_str(), options).await?;
            (revision(r.header()), Response::Put)
        }
        Request::Delete { key } => {
            let r = client.delete(key.as_str(), None).await?;
            let deleted = r.deleted();
            (revision(r.header()), Response::Delete { deleted })
        }
        Request::Cas { key, expect, value } => {
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    key.as_str(),
                    CompareOp::Equal,
                    *expect,
                )])
                .and_then([TxnOp::put(key.as_str(), value.as_str(), None)]);
            let r = client.txn(txn).await?;
            let succeeded = r.succeeded();
            (revision(r.header()), Response::Cas { succeeded })
        }
        Request::Txn { puts } => {
            let ops: Vec<TxnOp> = puts
                .iter()
                .map(|(k, v)| TxnOp::put(k.as_str(), v.as_str(), None))
                .collect();
            let r = client.txn(Txn::new().and_then(ops)).await?;
            (revision(r.header()), Response::Txn)
        }
        Request::LeaseRevoke { lease } => {
            let r = client.lease_revoke(*lease).await?;
            (revision(r.header()), Response::LeaseRevoke)
        }
    })
}

/// A put inside a txn.
fn put_op(key: &str, value: &str) -> pb::RequestOp {
    pb::RequestOp {
        request: Some(pb::request_op::Request::RequestPut(pb::PutRequest {
            key: key.into(),
            value: value.into(),
            ..Default::default()
        })),
    }
}

async fn perform_named(
    c: &mut TenantClient,
    request: &Request,
) -> Result<(i64, Response), tonic::Status> {
    let revision = |h: Option<pb::ResponseHeader>| h.map_or(0, |h| h.revision);
    Ok(match request {
        Request::Get { key } => {
            let req = pb::RangeRequest {
                key: key.as_str().into(),
                ..Default::default()
            };
            let r = c.kv.range(req).await?.into_inner();
            (revision(r.header), Response::Get(r.kvs.first().map(pb_kv)))
        }
        Request::Put { key, value, lease } => {
            let req = pb::PutRequest {
                key: key.as_str().into(),
                value: value.as_str().into(),
                lease: *lease,
                ..Default::default()
            };
            let r = c.kv.put(req).await?.into_inner();
            (revision(r.header), Response::Put)
        }
        Request::Delete { key } => {
            let req = pb::DeleteRangeRequest {
                key: key.as_str().into(),
                ..Default::default()
            };
            let r = c.kv.delete_range(req).await?.into_inner();
            (revision(r.header), Response::Delete { deleted: r.deleted })
        }
        Request::Cas { key, expect, value } => {
            use pb::compare::{CompareResult, CompareTarget, TargetUnion};
            let req = pb::TxnRequest {
                compare: vec![pb::Compare {
                    result: CompareResult::Equal.into(),
                    target: CompareTarget::Mod.into(),
                    key: key.as_str().into(),
                    target_union: Some(TargetUnion::ModRevision(*expect)),
                    ..Default::default()
                }],
                success: vec![put_op(key, value)],
                failure: Vec::new(),
            };
            let r = c.kv.txn(req).await?.into_inner();
            let succeeded = r.succeeded;
            (revision(r.header), Response::Cas { succeeded })
        }
        Request::Txn { puts } => {
            let req = pb::TxnRequest {
                success: puts.iter().map(|(k, v)| put_op(k, v)).collect(),
                ..Default::default()
            };
            let r = c.kv.txn(req).await?.into_inner();
            (revision(r.header), Response::Txn)
        }
        Request::LeaseRevoke { lease } => {
            let req = pb::LeaseRevokeRequest { id: *lease };
            let r = c.lease.lease_revoke(req).await?.into_inner();
            (revision(r.header), Response::LeaseRevoke)
        }
    })
}

/// An error's meaning for the history: a definite refusal or an unknown outcome.
fn status_outcome(s: &tonic::Status) -> Outcome {
    use tonic::Code;
    match s.code() {
        Code::InvalidArgument
        | Code::NotFound
        | Code::AlreadyExists
        | Code::PermissionDenied
        | Code::FailedPrecondition
        | Code::OutOfRange
        | Code::Unauthenticated
        | Code::ResourceExhausted => Outcome::Failed(format!("{:?}: {}", s.code(), s.message())),
        _ => Outcome::Unknown(s.to_string()),
    }
}

fn etcd_outcome(e: &etcd_client::Error) -> Outcome {
    match e {
        etcd_client::Error::GRpcStatus(s) => status_outcome(s),
        other => Outcome::Unknown(other.to_string()),
    }
}

fn etcd_kv(kv: &etcd_client::KeyValue) -> Kv {
    Kv {
        value: String::from_utf8_lossy(kv.value()).into_owned(),
        create_revision: kv.create_revision(),
        mod_revision: kv.mod_revision(),
        version: kv.version(),
        lease: kv.lease(),
    }
}

fn pb_kv(kv: &mvccpb::KeyValue) -> Kv {
    Kv {
        value: String::from_utf8_lossy(&kv.value).into_owned(),
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        version: kv.version,
        lease: kv.lease,
    }
}

/// An event of the log: the key's state after it (`value` `None` for a delete).
fn event(key: &[u8], kv: Kv, deleted: bool) -> Event {
    Event {
        revision: kv.mod_revision,
        key: String::from_utf8_lossy(key).into_owned(),
        value: (!deleted).then_some(kv.value),
        create_revision: kv.create_revision,
        version: kv.version,
        lease: kv.lease,
    }
}

fn etcd_event(e: &etcd_client::Event) -> Option<Event> {
    let kv = e.kv()?;
    let deleted = e.event_type() == EventType::Delete;
    Some(event(kv.key(), etcd_kv(kv), deleted))
}

fn pb_event(e: &mvccpb::Event) -> Option<Event> {
    let kv = e.kv.as_ref()?;
    let deleted = e.r#type == i32::from(mvccpb::event::EventType::Delete);
    Some(event(&kv.key, pb_kv(kv), deleted))
}
