//! `FastKv`: the hot unary KV RPCs (Range, Put, DeleteRange, Txn) served straight off the
//! HTTP/2 request, in front of tonic's router; every other path (Watch, Lease, Compact, health,
//! ...) passes through to tonic unchanged.
//!
//! Why: under a put or linearizable-read load, tonic's per-request machinery around the
//! handler (the axum router, the boxed route service, the streaming decoder and the encoding
//! response body) cost about as much frontend CPU as the handler itself. A unary call is one
//! length-prefixed message in, one out: this reads the request body, decodes the message, runs
//! the same handler as `KvService` (same tenant resolution, span, metrics and error mapping) and
//! answers with one DATA frame and the `grpc-status` trailers. What tonic would answer
//! differently stays with tonic: a compressed request (`grpc-encoding` other than identity)
//! goes through, and a malformed one gets tonic's own status codes and messages.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use ::http::{HeaderMap, HeaderValue};
use api::etcdserverpb::{DeleteRangeRequest, PutRequest, RangeRequest, TxnRequest};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures::future::{BoxFuture, Either};
use http_body::{Body as _, Frame};
use prost::Message;
use tonic::body::Body;
use tonic::metadata::MetadataMap;
use tonic::{Response, Status};

use crate::errors::Error;
use crate::rpc::handled;
use crate::tenants::Tenants;

/// gRPC's length prefix: a compression flag byte and a big-endian u32 length.
pub const GRPC_HEADER_LEN: usize = 5;
/// The paths served here (etcd's `etcdserverpb.KV` service).
const RANGE_PATH: &str = "/etcdserverpb.KV/Range";
const PUT_PATH: &str = "/etcdserverpb.KV/Put";
const DELETE_RANGE_PATH: &str = "/etcdserverpb.KV/DeleteRange";
const TXN_PATH: &str = "/etcdserverpb.KV/Txn";
const GRPC_ENCODING: &str = "grpc-encoding";
const GRPC_CONTENT_TYPE: &str = "application/grpc";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rpc {
    Range,
    Put,
    DeleteRange,
    Txn,
}

/// A `tower::Layer` putting `FastKv` in front of tonic's routes
/// (`tonic::transport::Server::layer`).
#[derive(Clone)]
pub struct FastKvLayer {
    tenants: Arc<Tenants>,
    max_decode: usize,
    http: axum::Router,
    gateway: Arc<crate::gateway::Gateway>,
}

impl FastKvLayer {
    /// `max_decode`: the largest request message accepted (the KV service's
    /// `max_decoding_message_size`); `http`: the router that answers plain GETs of
    /// `crate::http::CLIENT_PORT_PATHS` on the client port, as an etcd member does; `gateway`:
    /// etcd's JSON gateway (`/v3/...`), served there too.
    pub fn new(
        tenants: Arc<Tenants>,
        max_decode: usize,
        http: axum::Router,
        gateway: Arc<crate::gateway::Gateway>,
    ) -> Self {
        Self {
            tenants,
            max_decode,
            http,
            gateway,
        }
    }
}

impl<S> tower_layer::Layer<S> for FastKvLayer {
    type Service = FastKv<S>;

    fn layer(&self, inner: S) -> FastKv<S> {
        FastKv {
            inner,
            tenants: self.tenants.clone(),
            max_decode: self.max_decode,
            http: self.http.clone(),
            gateway: self.gateway.clone(),
        }
    }
}

#[derive(Clone)]
pub struct FastKv<S> {
    inner: S,
    tenants: Arc<Tenants>,
    max_decode: usize,
    http: axum::Router,
    gateway: Arc<crate::gateway::Gateway>,
}

impl<S> tower_service::Service<::http::Request<Body>> for FastKv<S>
where
    S: tower_service::Service<
            ::http::Request<Body>,
            Response = ::http::Response<Body>,
            Error = Infallible,
        >,
    S::Future: Send + 'static,
{
    type Response = ::http::Response<Body>;
    type Error = Infallible;
    type Future = Either<S::Future, BoxFuture<'static, Result<::http::Response<Body>, Infallible>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: ::http::Request<Body>) -> Self::Future {
        if req.method() == ::http::Method::GET
            && crate::http::CLIENT_PORT_PATHS.contains(&req.uri().path())
        {
            // A plain HTTP GET (gRPC is always a POST): the side port's answer.
            let mut http = self.http.clone();
            return Either::Right(Box::pin(async move {
                let resp = match tower_service::Service::call(&mut http, req).await {
                    Ok(resp) => resp,
                    Err(never) => match never {},
                };
                Ok(resp.map(Body::new))
            }));
        }
        if let Some(route) = crate::gateway::route(&req) {
            // etcd's JSON gateway: a plain HTTP POST of JSON.
            let gateway = self.gateway.clone();
            return Either::Right(Box::pin(async move {
                Ok(gateway.serve(route, req).await.map(Body::new))
            }));
        }
        let Some(rpc) = fast_rpc(&req) else {
            return Either::Left(self.inner.call(req));
        };
        let tenants = self.tenants.clone();
        let max_decode = self.max_decode;
        Either::Right(Box::pin(async move {
            Ok(serve(rpc, &tenants, max_decode, req).await)
        }))
    }
}

/// The RPC a request is for, if it is one served here.
fn fast_rpc(req: &::http::Request<Body>) -> Option<Rpc> {
    let rpc = match req.uri().path() {
        RANGE_PATH => Rpc::Range,
        PUT_PATH => Rpc::Put,
        DELETE_RANGE_PATH => Rpc::DeleteRange,
        TXN_PATH => Rpc::Txn,
        _ => return None,
    };
    match req.headers().get(GRPC_ENCODING) {
        None => Some(rpc),
        Some(v) if v.as_bytes() == b"identity" => Some(rpc),
        Some(_) => None,
    }
}

async fn serve(
    rpc: Rpc,
    tenants: &Tenants,
    max_decode: usize,
    req: ::http::Request<Body>,
) -> ::http::Response<Body> {
    let (parts, body) = req.into_parts();
    let metadata = MetadataMap::from_headers(parts.headers);
    match answer(rpc, tenants, max_decode, &metadata, body).await {
        Ok(message) => grpc_ok(message),
        Err(status) => status.into_http(),
    }
}

/// Decodes the request (as tonic's KV service does, before anything else), then runs the same
/// handler `KvService` runs.
async fn answer(
    rpc: Rpc,
    tenants: &Tenants,
    max_decode: usize,
    metadata: &MetadataMap,
    body: Body,
) -> Result<Bytes, Status> {
    let message = read_message(body, max_decode).await?;
    match rpc {
        Rpc::Range => {
            let req = RangeRequest::decode(message).map_err(decode_error)?;
            let read = tenants.serve("Range", metadata, req, |t, _, caller, r| async move {
                crate::kv::range_message(&t, &caller, r).await
            });
            Ok(read.await?.into_inner())
        }
        Rpc::Put => {
            let req = PutRequest::decode(message).map_err(decode_error)?;
            encoded(
                tenants
                    .serve("Put", metadata, req, |t, id, caller, r| async move {
                        crate::kv::put(&t, id, &caller, r).await
                    })
                    .await?,
            )
        }
        Rpc::DeleteRange => {
            let req = DeleteRangeRequest::decode(message).map_err(decode_error)?;
            encoded(
                tenants
                    .serve(
                        "DeleteRange",
                        metadata,
                        req,
                        |t, id, caller, r| async move {
                            crate::kv::delete_range(&t, id, &caller, r).await
                        },
                    )
                    .await?,
            )
        }
        Rpc::Txn => {
            let req = TxnRequest::decode(message).map_err(decode_error)?;
            encoded(
                tenants
                    .serve("Txn", metadata, req, |t, id, caller, r| async move {
                        crate::kv::txn(&t, id, &caller, r).await
                    })
                    .await?,
            )
        }
    }
}

/// tonic-prost's mapping of a decode error.
fn decode_error(e: prost::DecodeError) -> Status {
    Status::internal(e.to_string())
}

/// One length-prefixed gRPC message: the prefix, then the encoded message.
fn encoded<T: Message>(resp: Response<T>) -> Result<Bytes, Status> {
    let msg = resp.into_inner();
    let len = msg.encoded_len();
    let prefix = u32::try_from(len).map_err(|_| handled(Error::ResponseTooLarge(len)))?;
    let mut buf = BytesMut::with_capacity(GRPC_HEADER_LEN + len);
    buf.put_u8(0);
    buf.put_u32(prefix);
    msg.encode_raw(&mut buf);
    Ok(buf.freeze())
}

/// Reads the request body to its end and answers its one message (without the prefix), with
/// tonic's statuses for what it refuses. A message over the limit is refused as soon as its
/// prefix arrives, before the rest is buffered; bytes after the message are not kept.
/// The next data of a request body (trailers and other frames skipped); None at its end.
pub(crate) async fn next_data(body: &mut Body) -> Option<Result<Bytes, Status>> {
    loop {
        match std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await? {
            Ok(frame) => {
                if let Ok(data) = frame.into_data() {
                    return Some(Ok(data));
                }
            }
            Err(e) => return Some(Err(e)),
        }
    }
}

async fn read_message(mut body: Body, max_decode: usize) -> Result<Bytes, Status> {
    let mut received = Received::Nothing;
    // Bytes of prefix + message once the prefix is in: what a client sends after the one
    // message is read (so the stream ends as the client meant it) but not kept.
    let mut whole = None;
    while let Some(data) = next_data(&mut body).await {
        let data = data?;
        if whole.is_some_and(|w| received.bytes().len() >= w) {
            continue;
        }
        received.push(data);
        if let Some(head) = received.bytes().get(..GRPC_HEADER_LEN) {
            whole = Some(GRPC_HEADER_LEN + check_prefix(head, max_decode)?);
        }
    }
    let mut all = received.freeze();
    if all.is_empty() {
        return Err(Status::internal("Missing request message."));
    }
    // tonic's decoder, when the stream ends inside the prefix or the message.
    let eof = || Status::internal("Unexpected EOF decoding stream.");
    let head = all.get(..GRPC_HEADER_LEN).ok_or_else(eof)?;
    let len = check_prefix(head, max_decode)?;
    all.advance(GRPC_HEADER_LEN);
    if all.len() < len {
        return Err(eof());
    }
    all.truncate(len);
    Ok(all)
}

/// The request body's bytes: almost always one DATA frame, kept without a copy; later frames
/// are appended to a copy.
enum Received {
    Nothing,
    One(Bytes),
    Many(BytesMut),
}

impl Received {
    fn push(&mut self, data: Bytes) {
        *self = match std::mem::replace(self, Received::Nothing) {
            Received::Nothing => Received::One(data),
            Received::One(first) => {
                let mut m = BytesMut::with_capacity(first.len() + data.len());
                m.extend_from_slice(&first);
                m.extend_from_slice(&data);
                Received::Many(m)
            }
            Received::Many(mut m) => {
                m.extend_from_slice(&data);
                Received::Many(m)
            }
        };
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Received::Nothing => &[],
            Received::One(b) => b,
            Received::Many(m) => m,
        }
    }

    fn freeze(self) -> Bytes {
        match self {
            Received::Nothing => Bytes::new(),
            Received::One(b) => b,
            Received::Many(m) => m.freeze(),
        }
    }
}

/// Checks a message prefix as tonic's decoder does; answers the message length.
fn check_prefix(head: &[u8], max_decode: usize) -> Result<usize, Status> {
    let mut head = head;
    match head.get_u8() {
        0 => {}
        1 => {
            return Err(Status::internal(
                "protocol error: received message with compressed-flag but no grpc-encoding was specified",
            ));
        }
        f => {
            return Err(Status::internal(format!(
                "protocol error: received message with invalid compression flag: {f} (valid flags are 0 and 1), while sending request"
            )));
        }
    }
    let len = head.get_u32() as usize;
    if len > max_decode {
        // grpc-go's refusal, which etcd's clients get (tonic's own is OutOfRange, "Error,
        // decoded message length too large").
        return Err(crate::rpc::message_too_large(len, max_decode));
    }
    Ok(len)
}

/// A successful unary answer: headers, one DATA frame, `grpc-status: 0` trailers.
fn grpc_ok(message: Bytes) -> ::http::Response<Body> {
    let mut resp = ::http::Response::new(Body::new(UnaryBody {
        data: Some(message),
        trailers: true,
    }));
    resp.headers_mut().insert(
        ::http::header::CONTENT_TYPE,
        HeaderValue::from_static(GRPC_CONTENT_TYPE),
    );
    resp
}

/// One message, then the OK trailers.
struct UnaryBody {
    data: Option<Bytes>,
    trailers: bool,
}

impl http_body::Body for UnaryBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if let Some(data) = self.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if std::mem::take(&mut self.trailers) {
            let mut t = HeaderMap::with_capacity(1);
            t.insert(Status::GRPC_STATUS, HeaderValue::from_static("0"));
            return Poll::Ready(Some(Ok(Frame::trailers(t))));
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && !self.trailers
    }
}
