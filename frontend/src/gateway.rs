//! etcd's JSON gateway on the client port: `POST /v3/<service>/<method>` with a JSON body,
//! answered in JSON, as etcd's grpc-gateway answers it (etcd 3.4 also serves the same paths under
//! `/v3beta/`). For clients without gRPC: `curl`, shell scripts, Patroni's and OpenStack's etcd3
//! drivers. Owns the translation only; every request is handed to the same service the gRPC call
//! reaches, so answers and errors are the same. May not touch the services' behaviour.
//!
//! The JSON mapping is protobuf's, as etcd's gateway prints it (generated in `api`): the proto
//! field names (`create_revision`, `ID`, `dbSize`), 64-bit integers as strings, bytes in base64,
//! enum values by name, default values left out; requests take proto or JSON names and numbers
//! or strings, and unknown fields are ignored. An empty body is an empty message. An error is
//! `{"error": m, "message": m, "code": c}` with the HTTP status grpc-gateway maps the code to.
//! Streams (Watch, LeaseKeepAlive) read a sequence of JSON requests from the body and answer one
//! `{"result": ...}` line per response; Snapshot answers its chunks the same way.

use std::pin::Pin;
use std::sync::Arc;

use api::etcdserverpb::auth_server::Auth;
use api::etcdserverpb::cluster_server::Cluster;
use api::etcdserverpb::kv_server::Kv;
use api::etcdserverpb::lease_server::Lease;
use api::etcdserverpb::maintenance_server::Maintenance;
use api::v3electionpb::election_server::Election;
use api::v3lockpb::lock_server::Lock;
use axum::body::Body as HttpBody;
use bytes::{Buf, Bytes, BytesMut};
use futures::{Stream, StreamExt};
use http::{HeaderValue, Method, StatusCode, header};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::body::Body;
use tonic::metadata::MetadataMap;
use tonic::{Code, Request, Response, Status};

use crate::auth::AuthService;
use crate::cluster::ClusterService;
use crate::fast_kv::next_data;
use crate::kv::KvService;
use crate::lease::LeaseService;
use crate::maintenance::MaintenanceService;
use crate::tenants::Tenants;
use crate::watch::WatchService;

/// The path prefixes etcd's gateway serves (3.4: `/v3/` and the older `/v3beta/`).
pub const PREFIXES: [&str; 2] = ["/v3/", "/v3beta/"];

/// Every method path the gateway serves (after its prefix), as etcd declares them.
pub const METHODS: &[&str] = &[
    "kv/range",
    "kv/put",
    "kv/deleterange",
    "kv/txn",
    "kv/compaction",
    "watch",
    "lease/grant",
    "lease/revoke",
    "kv/lease/revoke",
    "lease/keepalive",
    "lease/timetolive",
    "kv/lease/timetolive",
    "lease/leases",
    "kv/lease/leases",
    "cluster/member/add",
    "cluster/member/remove",
    "cluster/member/update",
    "cluster/member/list",
    "cluster/member/promote",
    "maintenance/alarm",
    "maintenance/status",
    "maintenance/defragment",
    "maintenance/hash",
    "maintenance/hashkv",
    "maintenance/snapshot",
    "maintenance/transfer-leadership",
    "maintenance/downgrade",
    "auth/enable",
    "auth/disable",
    "auth/status",
    "auth/authenticate",
    "auth/user/add",
    "auth/user/get",
    "auth/user/list",
    "auth/user/delete",
    "auth/user/changepw",
    "auth/user/grant",
    "auth/user/revoke",
    "auth/role/add",
    "auth/role/get",
    "auth/role/list",
    "auth/role/delete",
    "auth/role/grant",
    "auth/role/revoke",
    "lock/lock",
    "lock/unlock",
    "election/campaign",
    "election/proclaim",
    "election/leader",
    "election/observe",
    "election/resign",
];

/// JSON requests of one stream queued before the body is read further.
const STREAM_INPUT_QUEUE: usize = 16;

/// The services a gateway request is handed to: the very instances gRPC calls reach.
pub struct Gateway {
    pub kv: Arc<KvService>,
    pub watch: Arc<WatchService<Tenants>>,
    pub lease: Arc<LeaseService>,
    pub maintenance: Arc<MaintenanceService>,
    pub cluster: Arc<ClusterService>,
    pub auth: Arc<AuthService>,
    /// The Lock and Election services (built on the services above).
    pub concurrency: crate::concurrency::Handle,
    /// The largest body accepted: a request's JSON is its protobuf's bytes in base64 and more.
    pub max_body: usize,
}

/// Where a gateway request goes: one of [`METHODS`], or none (404).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route(Option<&'static str>);

/// The route of `req` if it is a gateway request: an HTTP request for a `/v3/` path that is
/// not gRPC.
pub fn route(req: &http::Request<Body>) -> Option<Route> {
    // The path first: every gRPC call's path (`/etcdserverpb.KV/Range`) fails this at its
    // first bytes, so the hot path pays no header lookup.
    let path = req.uri().path();
    let method = PREFIXES.iter().find_map(|p| path.strip_prefix(p))?;
    let grpc = req
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    if grpc {
        return None;
    }
    Some(Route(METHODS.iter().copied().find(|m| *m == method)))
}

type Answer = http::Response<HttpBody>;

impl Gateway {
    /// Answers one gateway request, `route` being `route(&req)`.
    pub async fn serve(&self, route: Route, req: http::Request<Body>) -> Answer {
        let Route(Some(method)) = route else {
            return plain(StatusCode::NOT_FOUND, "Not Found");
        };
        if req.method() != Method::POST {
            return plain(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed");
        }
        let (parts, body) = req.into_parts();
        let md = metadata_of(parts.headers);
        let max = self.max_body;
        match method {
            "kv/range" => unary(md, body, max, |r| self.kv.range(r)).await,
            "kv/put" => unary(md, body, max, |r| self.kv.put(r)).await,
            "kv/deleterange" => unary(md, body, max, |r| self.kv.delete_range(r)).await,
            "kv/txn" => unary(md, body, max, |r| self.kv.txn(r)).await,
            "kv/compaction" => unary(md, body, max, |r| self.kv.compact(r)).await,
            "watch" => bidi(md, body, max, |md, input| self.watch.open(md, input)).await,
            "lease/grant" => unary(md, body, max, |r| self.lease.lease_grant(r)).await,
            "lease/revoke" | "kv/lease/revoke" => {
                unary(md, body, max, |r| self.lease.lease_revoke(r)).await
            }
            "lease/keepalive" => {
                bidi(md, body, max, |md, input| async move {
                    self.lease.keep_alives(&md, input).await
                })
                .await
            }
            "lease/timetolive" | "kv/lease/timetolive" => {
                unary(md, body, max, |r| self.lease.lease_time_to_live(r)).await
            }
            "lease/leases" | "kv/lease/leases" => {
                unary(md, body, max, |r| self.lease.lease_leases(r)).await
            }
            "cluster/member/add" => unary(md, body, max, |r| self.cluster.member_add(r)).await,
            "cluster/member/remove" => {
                unary(md, body, max, |r| self.cluster.member_remove(r)).await
            }
            "cluster/member/update" => {
                unary(md, body, max, |r| self.cluster.member_update(r)).await
            }
            "cluster/member/list" => unary(md, body, max, |r| self.cluster.member_list(r)).await,
            "cluster/member/promote" => {
                unary(md, body, max, |r| self.cluster.member_promote(r)).await
            }
            "maintenance/alarm" => unary(md, body, max, |r| self.maintenance.alarm(r)).await,
            "maintenance/status" => unary(md, body, max, |r| self.maintenance.status(r)).await,
            "maintenance/defragment" => {
                unary(md, body, max, |r| self.maintenance.defragment(r)).await
            }
            "maintenance/hash" => unary(md, body, max, |r| self.maintenance.hash(r)).await,
            // etcd 3.4 and 3.5 declare HashKV on Hash's path, so only Hash answers there; 3.6
            // gives HashKV its own path, served here.
            "maintenance/hashkv" => unary(md, body, max, |r| self.maintenance.hash_kv(r)).await,
            "maintenance/snapshot" => {
                server_stream(md, body, max, |r| self.maintenance.snapshot(r)).await
            }
            "maintenance/transfer-leadership" => {
                unary(md, body, max, |r| self.maintenance.move_leader(r)).await
            }
            "maintenance/downgrade" => {
                unary(md, body, max, |r| self.maintenance.downgrade(r)).await
            }
            "auth/enable" => unary(md, body, max, |r| self.auth.auth_enable(r)).await,
            "auth/disable" => unary(md, body, max, |r| self.auth.auth_disable(r)).await,
            "auth/status" => unary(md, body, max, |r| self.auth.auth_status(r)).await,
            "auth/authenticate" => unary(md, body, max, |r| self.auth.authenticate(r)).await,
            "auth/user/add" => unary(md, body, max, |r| self.auth.user_add(r)).await,
            "auth/user/get" => unary(md, body, max, |r| self.auth.user_get(r)).await,
            "auth/user/list" => unary(md, body, max, |r| self.auth.user_list(r)).await,
            "auth/user/delete" => unary(md, body, max, |r| self.auth.user_delete(r)).await,
            "auth/user/changepw" => {
                unary(md, body, max, |r| self.auth.user_change_password(r)).await
            }
            "auth/user/grant" => unary(md, body, max, |r| self.auth.user_grant_role(r)).await,
            "auth/user/revoke" => unary(md, body, max, |r| self.auth.user_revoke_role(r)).await,
            "auth/role/add" => unary(md, body, max, |r| self.auth.role_add(r)).await,
            "auth/role/get" => unary(md, body, max, |r| self.auth.role_get(r)).await,
            "auth/role/list" => unary(md, body, max, |r| self.auth.role_list(r)).await,
            "auth/role/delete" => unary(md, body, max, |r| self.auth.role_delete(r)).await,
            "auth/role/grant" => unary(md, body, max, |r| self.auth.role_grant_permission(r)).await,
            "auth/role/revoke" => {
                unary(md, body, max, |r| self.auth.role_revoke_permission(r)).await
            }
            "lock/lock" => unary(md, body, max, |r| self.concurrency.lock(r)).await,
            "lock/unlock" => unary(md, body, max, |r| self.concurrency.unlock(r)).await,
            "election/campaign" => unary(md, body, max, |r| self.concurrency.campaign(r)).await,
            "election/proclaim" => unary(md, body, max, |r| self.concurrency.proclaim(r)).await,
            "election/leader" => unary(md, body, max, |r| self.concurrency.leader(r)).await,
            "election/observe" => {
                server_stream(md, body, max, |r| self.concurrency.observe(r)).await
            }
            "election/resign" => unary(md, body, max, |r| self.concurrency.resign(r)).await,
            // Not reached: every entry of METHODS has its arm (`every_listed_method_is_routed`).
            _ => plain(StatusCode::NOT_FOUND, "Not Found"),
        }
    }
}

/// One request, a stream of answers (Snapshot's chunks, Observe's leaders), each as a
/// `{"result": ...}` line, as the gateway streams a server-streaming call.
async fn server_stream<Req, Resp, S, F, Fut>(
    md: MetadataMap,
    body: Body,
    max_body: usize,
    call: F,
) -> Answer
where
    Req: DeserializeOwned + Default,
    Resp: Serialize + Send + 'static,
    S: Stream<Item = Result<Resp, Status>> + Send + 'static,
    F: FnOnce(Request<Req>) -> Fut,
    Fut: Future<Output = Result<Response<S>, Status>>,
{
    let req = match read_message(body, max_body).await {
        Ok(r) => r,
        Err(status) => return error(&status),
    };
    match call(request(md, req)).await {
        Ok(answers) => streamed(answers.into_inner()),
        Err(status) => error(&status),
    }
}

/// The gRPC metadata of a gateway request: its HTTP headers, and as grpc-gateway passes them,
/// a `Grpc-Metadata-<name>` header under `<name>` too (so `Grpc-Metadata-Hasleader: true`
/// asks for etcd's require-leader behaviour, as through etcd's gateway).
fn metadata_of(headers: http::HeaderMap) -> MetadataMap {
    let mut extra = http::HeaderMap::new();
    for (name, value) in &headers {
        if let Some(inner) = name.as_str().strip_prefix("grpc-metadata-")
            && let Ok(inner) = http::HeaderName::from_bytes(inner.as_bytes())
        {
            extra.append(inner, value.clone());
        }
    }
    let mut all = headers;
    for (name, value) in extra {
        if let Some(name) = name {
            all.append(name, value);
        }
    }
    MetadataMap::from_headers(all)
}

fn request<T>(metadata: MetadataMap, message: T) -> Request<T> {
    Request::from_parts(metadata, Default::default(), message)
}

/// One request, one answer.
async fn unary<Req, Resp, F, Fut>(md: MetadataMap, body: Body, max_body: usize, call: F) -> Answer
where
    Req: DeserializeOwned + Default,
    Resp: Serialize,
    F: FnOnce(Request<Req>) -> Fut,
    Fut: Future<Output = Result<Response<Resp>, Status>>,
{
    let req = match read_message(body, max_body).await {
        Ok(r) => r,
        Err(status) => return error(&status),
    };
    match call(request(md, req)).await {
        Ok(answer) => json(StatusCode::OK, &answer.into_inner()),
        Err(status) => error(&status),
    }
}

type Answers<Resp> = Pin<Box<dyn Stream<Item = Result<Resp, Status>> + Send + 'static>>;

/// A bidirectional stream: the body's JSON requests in (each at most `max_body` bytes), one
/// line per answer out.
async fn bidi<Req, Resp, F, Opened>(md: MetadataMap, body: Body, max_body: usize, open: F) -> Answer
where
    Req: DeserializeOwned + Send + 'static,
    Resp: Serialize + Send + 'static,
    F: FnOnce(MetadataMap, ReceiverStream<Result<Req, Status>>) -> Opened,
    Opened: Future<Output = Result<Answers<Resp>, Status>>,
{
    let (tx, rx) = mpsc::channel(STREAM_INPUT_QUEUE);
    match open(md, ReceiverStream::new(rx)).await {
        Ok(answers) => {
            tokio::spawn(read_messages(body, max_body, tx));
            streamed(answers)
        }
        Err(status) => error(&status),
    }
}

/// The body read whole (up to `max_body` bytes) and parsed as one message; an empty body is
/// the empty message.
async fn read_message<T: DeserializeOwned + Default>(
    mut body: Body,
    max_body: usize,
) -> Result<T, Status> {
    let mut buf = BytesMut::new();
    while let Some(data) = next_data(&mut body).await {
        let data = data?;
        if buf.len() + data.len() > max_body {
            return Err(Status::invalid_argument(
                crate::errors::msg::REQUEST_TOO_LARGE,
            ));
        }
        buf.extend_from_slice(&data);
    }
    if buf.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(&buf).map_err(|e| Status::invalid_argument(e.to_string()))
}

/// Feeds a stream's JSON requests to `tx` as they arrive in the body (whitespace between them
/// or not). Malformed JSON, or a request longer than `max_body`, ends the requests, as the
/// gateway stops reading there; the answers go on (a watch keeps watching).
async fn read_messages<T: DeserializeOwned + Send>(
    mut body: Body,
    max_body: usize,
    tx: mpsc::Sender<Result<T, Status>>,
) {
    let mut buf = BytesMut::new();
    loop {
        let ended = match next_data(&mut body).await {
            Some(Ok(data)) => {
                buf.extend_from_slice(&data);
                false
            }
            Some(Err(_)) | None => true,
        };
        let (parsed, used, malformed) = complete_messages::<T>(&buf, ended);
        buf.advance(used);
        for message in parsed {
            if tx.send(Ok(message)).await.is_err() {
                return;
            }
        }
        if let Some(e) = malformed {
            tracing::debug!(error = %e, "gateway stream: malformed request; reading stops");
            return;
        }
        if buf.len() > max_body {
            tracing::debug!(
                bytes = buf.len(),
                "gateway stream: request too large; reading stops"
            );
            return;
        }
        if ended {
            return;
        }
    }
}

/// The complete JSON messages at the start of `buf`, how many bytes they used, and the error
/// that stopped the parse if it was not the end of the data so far (at the end of the body an
/// unfinished message is an error too).
fn complete_messages<T: DeserializeOwned>(
    buf: &[u8],
    ended: bool,
) -> (Vec<T>, usize, Option<serde_json::Error>) {
    let mut messages = serde_json::Deserializer::from_slice(buf).into_iter::<T>();
    let mut parsed = Vec::new();
    let mut used = 0;
    loop {
        match messages.next() {
            Some(Ok(m)) => {
                parsed.push(m);
                used = messages.byte_offset();
            }
            Some(Err(e)) if e.is_eof() && !ended => return (parsed, used, None),
            Some(Err(e)) => return (parsed, used, Some(e)),
            None => return (parsed, buf.len(), None),
        }
    }
}

/// A stream of answers as the gateway sends it: `{"result": ...}` per answer, one per line;
/// an error ends it as `{"error": {...}}`.
fn streamed<Resp, S>(answers: S) -> Answer
where
    Resp: Serialize + Send + 'static,
    S: Stream<Item = Result<Resp, Status>> + Send + 'static,
{
    #[derive(Serialize)]
    struct Result_<'a, R> {
        result: &'a R,
    }
    let lines = answers
        .map(|answer| {
            let written = match &answer {
                Ok(r) => serde_json::to_vec(&Result_ { result: r }).map_err(|e| unwritable(&e)),
                Err(status) => Err(status.clone()),
            };
            let (mut line, last) = match written {
                Ok(line) => (line, false),
                // Strings and integers: writing them cannot fail.
                Err(status) => (
                    serde_json::to_vec(&StreamError::of(&status)).unwrap_or_default(),
                    true,
                ),
            };
            line.push(b'\n');
            (Bytes::from(line), last)
        })
        // An error is the last line.
        .scan(false, |done, (line, is_err)| {
            if *done {
                return std::future::ready(None);
            }
            *done = is_err;
            std::future::ready(Some(Ok::<_, std::convert::Infallible>(line)))
        });
    respond(
        StatusCode::OK,
        "application/json",
        HttpBody::from_stream(lines),
    )
}

/// grpc-gateway's error object inside a stream.
#[derive(Serialize)]
struct StreamError {
    error: StreamErrorBody,
}

#[derive(Serialize)]
struct StreamErrorBody {
    grpc_code: i32,
    http_code: u16,
    message: String,
    http_status: &'static str,
}

impl StreamError {
    fn of(status: &Status) -> Self {
        let http = http_status(status.code());
        Self {
            error: StreamErrorBody {
                grpc_code: status.code() as i32,
                http_code: http.as_u16(),
                message: status.message().to_string(),
                http_status: http.canonical_reason().unwrap_or(""),
            },
        }
    }
}

/// grpc-gateway's error body for a unary call.
#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
    message: &'a str,
    code: i32,
}

fn error(status: &Status) -> Answer {
    let body = ErrorBody {
        error: status.message(),
        message: status.message(),
        code: status.code() as i32,
    };
    // Two strings and an integer: writing them cannot fail.
    let body = serde_json::to_vec(&body).unwrap_or_default();
    respond(
        http_status(status.code()),
        "application/json",
        HttpBody::from(body),
    )
}

/// The refusal of an answer JSON cannot express (pbjson refuses an enum value the protobuf does
/// not name, e.g. an alarm type a client invented): Internal, never a panic.
fn unwritable(e: &serde_json::Error) -> Status {
    Status::internal(format!("strata: the answer cannot be written as JSON: {e}"))
}

/// grpc-gateway's `HTTPStatusFromCode` (v1.16, the one etcd 3.5 builds with; 3.4's older
/// gateway answered 412 for FailedPrecondition).
pub fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::Cancelled => StatusCode::REQUEST_TIMEOUT,
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
            StatusCode::BAD_REQUEST
        }
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

fn json<T: Serialize>(status: StatusCode, value: &T) -> Answer {
    match serde_json::to_vec(value) {
        Ok(body) => respond(status, "application/json", HttpBody::from(body)),
        Err(e) => error(&unwritable(&e)),
    }
}

fn plain(status: StatusCode, text: &'static str) -> Answer {
    respond(status, "text/plain; charset=utf-8", HttpBody::from(text))
}

/// An answer with etcd's CORS headers (its client port allows every origin by default).
fn respond(status: StatusCode, content_type: &'static str, body: HttpBody) -> Answer {
    let mut answer = http::Response::new(body);
    *answer.status_mut() = status;
    let h = answer.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("POST, GET, OPTIONS, PUT, DELETE"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static("accept, content-type, authorization"),
    );
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer JSON cannot express is refused as Internal, with grpc-gateway's error body,
    /// instead of taking the connection's task down.
    #[tokio::test]
    async fn an_answer_json_cannot_express_is_an_internal_error() {
        use api::etcdserverpb::{AlarmMember, AlarmResponse};
        let odd = AlarmResponse {
            header: None,
            alarms: vec![AlarmMember {
                member_id: 1,
                alarm: 99,
            }],
        };
        let answer = json(StatusCode::OK, &odd);
        assert_eq!(answer.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body = axum::body::to_bytes(answer.into_body(), usize::MAX)
            .await
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["code"], 13);
        let message = v["message"].as_str().unwrap();
        assert!(message.contains("cannot be written as JSON"), "{message}");
    }
    use api::etcdserverpb::WatchRequest;

    #[test]
    fn stream_requests_are_parsed_as_they_complete() {
        let first = br#"{"create_request":{"key":"YQ=="}} {"cancel_req"#;
        let (parsed, used, err) = complete_messages::<WatchRequest>(first, false);
        assert_eq!(parsed.len(), 1);
        assert!(err.is_none(), "an unfinished message waits for more");
        assert_eq!(&first[used..], br#" {"cancel_req"#);
        let rest = br#" {"cancel_request":{"watch_id":"3"}}"#;
        let (parsed, used, err) = complete_messages::<WatchRequest>(rest, true);
        assert_eq!((parsed.len(), used, err.is_none()), (1, rest.len(), true));
        let (parsed, _, err) = complete_messages::<WatchRequest>(br#"{"progress_re"#, true);
        assert!(parsed.is_empty() && err.is_some(), "cut short at the end");
        let (parsed, _, err) =
            complete_messages::<WatchRequest>(br#"{"create_request":{}} garbage"#, false);
        assert!(
            parsed.len() == 1 && err.is_some(),
            "malformed stops the reading"
        );
    }

    /// Every path in METHODS has an arm in `serve` (a missing one would answer 404 to a POST):
    /// the arms are read back from this file's own source.
    #[test]
    fn every_listed_method_is_routed() {
        let source = include_str!("gateway.rs");
        let body = &source[source.find("match method {").unwrap()..];
        let body = &body[..body.find("// Not reached").unwrap()];
        for m in METHODS {
            assert!(body.contains(&format!("\"{m}\"")), "{m} has no arm");
        }
        assert_eq!(METHODS.len(), 51);
    }

    #[test]
    fn routes_are_found_once_for_v3_paths_that_are_not_grpc() {
        let req = |path: &str, content_type: &str| {
            http::Request::builder()
                .uri(path)
                .header(header::CONTENT_TYPE, content_type)
                .body(Body::empty())
                .unwrap()
        };
        let json = "application/json";
        assert_eq!(
            route(&req("/v3/kv/range", json)),
            Some(Route(Some("kv/range")))
        );
        assert_eq!(
            route(&req("/v3beta/watch", json)),
            Some(Route(Some("watch")))
        );
        assert_eq!(route(&req("/v3/kv/nothing", json)), Some(Route(None)));
        assert_eq!(route(&req("/v3/kv/range", "application/grpc+proto")), None);
        assert_eq!(route(&req("/etcdserverpb.KV/Range", json)), None);
    }

    #[test]
    fn grpc_metadata_headers_are_passed_under_their_own_names() {
        let mut headers = http::HeaderMap::new();
        headers.insert("grpc-metadata-hasleader", HeaderValue::from_static("true"));
        headers.insert("x-strata-tenant", HeaderValue::from_static("acme"));
        let md = metadata_of(headers);
        assert_eq!(md.get("hasleader").unwrap(), "true");
        assert_eq!(md.get("x-strata-tenant").unwrap(), "acme");
        assert!(crate::watch::requires_leader(&md));
    }

    #[test]
    fn codes_map_to_grpc_gateways_statuses() {
        assert_eq!(http_status(Code::InvalidArgument), StatusCode::BAD_REQUEST);
        assert_eq!(
            http_status(Code::FailedPrecondition),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(http_status(Code::OutOfRange), StatusCode::BAD_REQUEST);
        assert_eq!(http_status(Code::NotFound), StatusCode::NOT_FOUND);
        assert_eq!(
            http_status(Code::ResourceExhausted),
            StatusCode::TOO_MANY_REQUESTS
        );
        assert_eq!(
            http_status(Code::Unavailable),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            http_status(Code::Unimplemented),
            StatusCode::NOT_IMPLEMENTED
        );
        assert_eq!(
            http_status(Code::DataLoss),
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }
}
