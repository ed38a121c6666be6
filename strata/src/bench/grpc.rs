//! The closed-loop KV workloads' gRPC client: unary etcd calls framed by hand over raw HTTP/2
//! (`h2`) connections, without tonic's channel (a tower buffer task plus hyper's dispatch task
//! between every request and its socket). The load generator shares the machine's cores with
//! the servers it measures, so every microsecond it spends per request is taken from them; this
//! client is still a plain gRPC client that works against any etcd endpoint (etcd's own
//! benchmark tool likewise multiplexes N clients over M connections without per-request tasks).

use std::future::poll_fn;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use h2::client::SendRequest;
use http::header::{CONTENT_TYPE, HeaderValue, TE};
use http::uri::{Authority, PathAndQuery, Scheme};
use prost::Message;
use tokio::net::TcpStream;
use tonic::{Code, Status};

use super::BenchError;
use super::conn::{
    CONNECT_TIMEOUT, ClientTls, MAX_RESPONSE_BYTES, check_pool_args, endpoint_url_for,
};

/// gRPC's message prefix: one compression flag byte and a big-endian u32 length.
const GRPC_PREFIX_LEN: usize = 5;
/// HTTP/2 stream window we announce (h2's default is 64 KiB): big answers need no window
/// update round trip per stream.
pub const STREAM_WINDOW_BYTES: u32 = 1 << 20;
/// HTTP/2 connection window we announce: many clients share a connection.
pub const CONNECTION_WINDOW_BYTES: u32 = 16 << 20;

/// etcd's KV methods, as gRPC paths.
pub const KV_RANGE: &str = "/etcdserverpb.KV/Range";
pub const KV_PUT: &str = "/etcdserverpb.KV/Put";
pub const KV_TXN: &str = "/etcdserverpb.KV/Txn";

/// The raw HTTP/2 connections of one run.
#[derive(Clone)]
pub struct UnaryPool {
    conns: Vec<Unary>,
}

impl UnaryPool {
    /// Opens `conns` HTTP/2 connections, connection `i` to `endpoints[i % n]`: plaintext, or
    /// TLS with `tls`.
    pub async fn connect(
        endpoints: &[String],
        conns: usize,
        headers: &[(&'static str, String)],
        request_timeout: Duration,
        tls: Option<&ClientTls>,
    ) -> Result<Self, BenchError> {
        check_pool_args(endpoints, conns)?;
        let headers = headers
            .iter()
            .map(|(name, value)| {
                let v = HeaderValue::from_str(value).map_err(|_| {
                    BenchError::InvalidArgs(format!("{name} {value:?} is not ASCII"))
                })?;
                Ok((*name, v))
            })
            .collect::<Result<Vec<_>, BenchError>>()?;
        let mut out = Vec::with_capacity(conns);
        for i in 0..conns {
            let url = endpoint_url_for(&endpoints[i % endpoints.len()], tls.is_some());
            out.push(Unary::connect(&url, headers.clone(), request_timeout, tls).await?);
        }
        Ok(Self { conns: out })
    }

    pub fn conns(&self) -> usize {
        self.conns.len()
    }

    /// The client for client number `client` (its connection is `client % conns`).
    pub fn client(&self, client: usize) -> Unary {
        self.conns[client % self.conns.len()].clone()
    }
}

/// One client's handle on a shared HTTP/2 connection.
#[derive(Clone)]
pub struct Unary {
    send: SendRequest<Bytes>,
    scheme: Scheme,
    authority: Authority,
    headers: Vec<(&'static str, HeaderValue)>,
    timeout: Duration,
    buf: BytesMut,
}

/// An HTTP/2 client connection over `io`, driven by a task of its own.
async fn start_h2<T>(io: T) -> Result<SendRequest<Bytes>, h2::Error>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (send, connection) = h2::client::Builder::new()
        .initial_window_size(STREAM_WINDOW_BYTES)
        .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
        .handshake::<_, Bytes>(io)
        .await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "benchmark connection closed");
        }
    });
    Ok(send)
}

fn dial_error(url: &str, reason: impl std::fmt::Display) -> BenchError {
    BenchError::Dial {
        url: url.to_string(),
        reason: reason.to_string(),
    }
}

impl Unary {
    async fn connect(
        url: &str,
        headers: Vec<(&'static str, HeaderValue)>,
        timeout: Duration,
        tls: Option<&ClientTls>,
    ) -> Result<Self, BenchError> {
        let uri: http::Uri = url
            .parse()
            .map_err(|e| BenchError::InvalidArgs(format!("endpoint {url}: {e}")))?;
        let tls = match (uri.scheme(), tls) {
            (Some(s), _) if *s == Scheme::HTTP => None,
            (Some(s), Some(tls)) if *s == Scheme::HTTPS => Some(tls),
            (Some(s), None) if *s == Scheme::HTTPS => {
                return Err(BenchError::InvalidArgs(format!(
                    "endpoint {url}: https:// needs --cacert"
                )));
            }
            _ => {
                return Err(BenchError::InvalidArgs(format!(
                    "endpoint {url}: http:// or https:// only"
                )));
            }
        };
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| BenchError::InvalidArgs(format!("endpoint {url}: no host:port")))?;
        let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(authority.as_str()))
            .await
            .map_err(|_| dial_error(url, "connect timed out"))?
            .map_err(|e| dial_error(url, e))?;
        tcp.set_nodelay(true).map_err(|e| dial_error(url, e))?;
        let send = match tls {
            None => start_h2(tcp).await,
            Some(tls) => {
                let name = rustls::pki_types::ServerName::try_from(authority.host().to_string())
                    .map_err(|e| dial_error(url, e))?;
                let stream = tokio::time::timeout(
                    CONNECT_TIMEOUT,
                    tokio_rustls::TlsConnector::from(tls.rustls.clone()).connect(name, tcp),
                )
                .await
                .map_err(|_| dial_error(url, "TLS handshake timed out"))?
                .map_err(|e| dial_error(url, e))?;
                start_h2(stream).await
            }
        }
        .map_err(|e| dial_error(url, e))?;
        Ok(Self {
            send,
            scheme: if tls.is_some() {
                Scheme::HTTPS
            } else {
                Scheme::HTTP
            },
            authority,
            headers,
            timeout,
            buf: BytesMut::new(),
        })
    }

    /// Frames `req` as a gRPC message (prefix + protobuf), ready for `call_framed`.
    pub fn frame(&mut self, req: &impl Message) -> Bytes {
        let len = req.encoded_len();
        self.buf.reserve(GRPC_PREFIX_LEN + len);
        self.buf.put_u8(0);
        // encoded_len of a request under MAX_RESPONSE_BYTES fits; larger ones are refused below.
        self.buf.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
        // Encoding into a BytesMut cannot run out of room (it grows).
        let _ = req.encode(&mut self.buf);
        self.buf.split().freeze()
    }

    /// One unary call: `req` to `path`, the decoded answer or the server's status.
    pub async fn call<Resp: Message + Default>(
        &mut self,
        path: &'static str,
        req: &impl Message,
    ) -> Result<Resp, Status> {
        let framed = self.frame(req);
        self.call_framed(path, framed).await
    }

    /// One unary call with a message already framed by `frame` (sent as is: no copy).
    pub async fn call_framed<Resp: Message + Default>(
        &mut self,
        path: &'static str,
        framed: Bytes,
    ) -> Result<Resp, Status> {
        let timeout = self.timeout;
        match tokio::time::timeout(timeout, self.exchange(path, framed)).await {
            Ok(r) => r,
            Err(_) => Err(Status::deadline_exceeded(format!(
                "no answer within {timeout:?} (client-side deadline)"
            ))),
        }
    }

    async fn exchange<Resp: Message + Default>(
        &mut self,
        path: &'static str,
        framed: Bytes,
    ) -> Result<Resp, Status> {
        let mut parts = http::uri::Parts::default();
        parts.scheme = Some(self.scheme.clone());
        parts.authority = Some(self.authority.clone());
        parts.path_and_query = Some(PathAndQuery::from_static(path));
        let uri = http::Uri::from_parts(parts)
            .map_err(|e| Status::internal(format!("bad request URI: {e}")))?;
        let mut request = http::Request::post(uri)
            .body(())
            .map_err(|e| Status::internal(format!("bad request: {e}")))?;
        let headers = request.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        headers.insert(TE, HeaderValue::from_static("trailers"));
        for (name, value) in &self.headers {
            headers.insert(*name, value.clone());
        }

        poll_fn(|cx| self.send.poll_ready(cx))
            .await
            .map_err(h2_status)?;
        let (response, mut body_out) = self.send.send_request(request, false).map_err(h2_status)?;
        body_out.send_data(framed, true).map_err(h2_status)?;

        let response = response.await.map_err(h2_status)?;
        let (head, mut body) = response.into_parts();
        // A trailers-only answer (an error) carries grpc-status in its headers.
        if let Some(status) = Status::from_header_map(&head.headers) {
            return Err(if status.code() == Code::Ok {
                Status::internal("trailers-only answer with status OK and no message")
            } else {
                status
            });
        }
        if head.status != http::StatusCode::OK {
            return Err(Status::unknown(format!("HTTP status {}", head.status)));
        }
        let mut message: Option<Bytes> = None;
        let mut gathered = BytesMut::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.map_err(h2_status)?;
            let _ = body.flow_control().release_capacity(chunk.len());
            if gathered.len() + chunk.len() > MAX_RESPONSE_BYTES + GRPC_PREFIX_LEN {
                return Err(Status::resource_exhausted(
                    "answer larger than the bench allows",
                ));
            }
            match message.take() {
                None if gathered.is_empty() => message = Some(chunk),
                None => gathered.extend_from_slice(&chunk),
                Some(first) => {
                    gathered.extend_from_slice(&first);
                    gathered.extend_from_slice(&chunk);
                }
            }
        }
        let trailers = body.trailers().await.map_err(h2_status)?;
        match trailers.as_ref().and_then(Status::from_header_map) {
            Some(s) if s.code() == Code::Ok => {}
            Some(s) => return Err(s),
            None => return Err(Status::internal("answer without grpc-status")),
        }
        let data = message.unwrap_or_else(|| gathered.freeze());
        decode(data)
    }
}

/// The one message of a unary answer.
fn decode<Resp: Message + Default>(mut data: Bytes) -> Result<Resp, Status> {
    if data.len() < GRPC_PREFIX_LEN {
        return Err(Status::internal("answer without a message"));
    }
    let compressed = data.get_u8();
    let len = data.get_u32() as usize;
    if compressed != 0 {
        return Err(Status::unimplemented(
            "compressed answer (none was asked for)",
        ));
    }
    if data.len() != len {
        return Err(Status::internal(format!(
            "answer of {} bytes announced {len}",
            data.len()
        )));
    }
    Resp::decode(data).map_err(|e| Status::internal(format!("cannot decode the answer: {e}")))
}

/// An HTTP/2 failure as the gRPC status a gRPC client would report.
fn h2_status(e: h2::Error) -> Status {
    let code = match e.reason() {
        Some(h2::Reason::CANCEL) => Code::Cancelled,
        Some(h2::Reason::REFUSED_STREAM) => Code::Unavailable,
        Some(h2::Reason::ENHANCE_YOUR_CALM) => Code::ResourceExhausted,
        _ => Code::Unavailable,
    };
    Status::new(code, format!("http2: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::etcdserverpb::{RangeResponse, ResponseHeader};

    #[test]
    fn framing_round_trips() {
        let resp = RangeResponse {
            header: Some(ResponseHeader {
                revision: 7,
                ..Default::default()
            }),
            count: 3,
            ..Default::default()
        };
        let mut buf = BytesMut::new();
        buf.put_u8(0);
        buf.put_u32(resp.encoded_len() as u32);
        resp.encode(&mut buf).unwrap();
        let back: RangeResponse = decode(buf.freeze()).unwrap();
        assert_eq!(back, resp);
    }

    #[test]
    fn bad_frames_are_errors() {
        assert!(decode::<RangeResponse>(Bytes::from_static(&[0, 0])).is_err());
        // Announces 9 bytes, carries 1.
        assert!(decode::<RangeResponse>(Bytes::from_static(&[0, 0, 0, 0, 9, 8])).is_err());
        // Compressed flag set.
        assert_eq!(
            decode::<RangeResponse>(Bytes::from_static(&[1, 0, 0, 0, 0]))
                .unwrap_err()
                .code(),
            Code::Unimplemented
        );
    }

    #[tokio::test]
    async fn https_and_unreachable_endpoints_are_refused() {
        let t = Duration::from_secs(1);
        let r = UnaryPool::connect(&["https://127.0.0.1:1".to_string()], 1, &[], t, None).await;
        assert!(matches!(r, Err(BenchError::InvalidArgs(_))));
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        let r = UnaryPool::connect(&[format!("127.0.0.1:{port}")], 1, &[], t, None).await;
        assert!(matches!(r, Err(BenchError::Dial { .. })), "{:?}", r.err());
    }
}
