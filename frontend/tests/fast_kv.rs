//! The lean unary KV path (`frontend::fast_kv`) over raw HTTP/2: a message split over several
//! DATA frames is served, and every malformed request gets exactly the status tonic gives the
//! same request on a KV path it still serves itself (`Compact`), so the two paths cannot drift.

use std::sync::Arc;
use std::time::Duration;

use api::etcdserverpb::{PutRequest, PutResponse, RangeRequest, RangeResponse};
use bytes::{BufMut, Bytes, BytesMut};
use frontend::log::MemLog;
use frontend::{Config, Frontend};
use prost::Message;

const WAIT: Duration = Duration::from_secs(30);
/// A path tonic serves itself, with the KV service's decoder settings.
const TONIC_PATH: &str = "/etcdserverpb.KV/Compact";

struct Answer {
    status: String,
    message: String,
    body: Bytes,
}

/// One gRPC call over a fresh HTTP/2 connection; `chunks` are sent as separate DATA frames.
async fn call(
    addr: std::net::SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    chunks: Vec<Bytes>,
) -> Answer {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (send, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut send = send.ready().await.unwrap();
    let mut req = http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let (resp, mut stream) = send.send_request(req.body(()).unwrap(), false).unwrap();
    let n = chunks.len();
    if n == 0 {
        stream.send_data(Bytes::new(), true).unwrap();
    }
    for (i, c) in chunks.into_iter().enumerate() {
        stream.send_data(c, i + 1 == n).unwrap();
    }
    let resp = tokio::time::timeout(WAIT, resp).await.unwrap().unwrap();
    let (parts, mut body) = resp.into_parts();
    let header = |h: &http::HeaderMap, k: &str| {
        h.get(k)
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default()
    };
    if parts.headers.contains_key("grpc-status") {
        // Trailers-only answer.
        return Answer {
            status: header(&parts.headers, "grpc-status"),
            message: header(&parts.headers, "grpc-message"),
            body: Bytes::new(),
        };
    }
    let mut data = BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        body.flow_control().release_capacity(chunk.len()).unwrap();
        data.extend_from_slice(&chunk);
    }
    let trailers = body.trailers().await.unwrap().unwrap_or_default();
    Answer {
        status: header(&trailers, "grpc-status"),
        message: header(&trailers, "grpc-message"),
        body: data.freeze(),
    }
}

fn framed(flag: u8, msg: &[u8]) -> Bytes {
    let mut b = BytesMut::new();
    b.put_u8(flag);
    b.put_u32(u32::try_from(msg.len()).unwrap());
    b.put_slice(msg);
    b.freeze()
}

fn unframed<T: Message + Default>(a: &Answer) -> T {
    assert_eq!(a.status, "0", "grpc-message: {}", a.message);
    assert_eq!(a.body[0], 0);
    let len = u32::from_be_bytes(a.body[1..5].try_into().unwrap()) as usize;
    assert_eq!(a.body.len(), 5 + len);
    T::decode(&a.body[5..]).unwrap()
}

/// The values a Range of `key` over the fast path answers.
async fn values_at(fe: &Frontend, key: &[u8], headers: &[(&str, &str)]) -> Vec<Vec<u8>> {
    let range = RangeRequest {
        key: key.to_vec(),
        ..Default::default()
    }
    .encode_to_vec();
    let a = call(
        fe.client_addr,
        "/etcdserverpb.KV/Range",
        headers,
        vec![framed(0, &range)],
    )
    .await;
    let r: RangeResponse = unframed(&a);
    r.kvs.into_iter().map(|kv| kv.value).collect()
}

async fn start() -> Frontend {
    Frontend::start_with_log(
        Config::for_test(vec!["unused".into()]),
        Arc::new(MemLog::new()),
    )
    .await
    .expect("start frontend")
}

#[tokio::test]
async fn a_message_split_over_frames_is_served() {
    let fe = start().await;
    let put = PutRequest {
        key: b"split".to_vec(),
        value: vec![b'v'; 3000],
        prev_kv: true,
        ..Default::default()
    }
    .encode_to_vec();
    let whole = framed(0, &put);
    // The prefix itself is split, then the message in uneven pieces.
    let chunks = vec![
        whole.slice(..3),
        whole.slice(3..100),
        whole.slice(100..2000),
        whole.slice(2000..),
    ];
    let a = call(fe.client_addr, "/etcdserverpb.KV/Put", &[], chunks).await;
    let r: PutResponse = unframed(&a);
    assert!(r.header.unwrap().revision >= 2);
    assert!(r.prev_kv.is_none());

    let values = values_at(&fe, b"split", &[("grpc-encoding", "identity")]).await;
    assert_eq!(values, vec![vec![b'v'; 3000]]);
    fe.stop().await.unwrap();
}

#[tokio::test]
async fn bytes_after_the_message_are_ignored() {
    let fe = start().await;
    let put = PutRequest {
        key: b"trailing".to_vec(),
        value: b"kept".to_vec(),
        ..Default::default()
    }
    .encode_to_vec();
    // The message, then more frames the server must read past without taking them as part of it.
    let chunks = vec![
        framed(0, &put),
        Bytes::from(vec![0xff; 1000]),
        Bytes::from(vec![0x01; 70_000]),
    ];
    let a = call(fe.client_addr, "/etcdserverpb.KV/Put", &[], chunks).await;
    let _: PutResponse = unframed(&a);
    assert_eq!(
        values_at(&fe, b"trailing", &[]).await,
        vec![b"kept".to_vec()]
    );
    fe.stop().await.unwrap();
}

#[tokio::test]
async fn malformed_requests_get_the_statuses_tonic_gives() {
    let fe = start().await;
    let limit = Config::for_test(vec!["unused".into()]).max_request_bytes
        + frontend::server::GRPC_OVERHEAD_BYTES;
    let mut too_large = BytesMut::new();
    too_large.put_u8(0);
    too_large.put_u32(u32::try_from(limit + 1).unwrap());
    too_large.put_slice(b"only the start of it");
    let cases: Vec<(&str, Vec<Bytes>)> = vec![
        (
            "compressed flag without grpc-encoding",
            vec![framed(1, b"")],
        ),
        ("invalid compression flag", vec![framed(7, b"")]),
        ("no message at all", vec![]),
        (
            "a stream that ends inside the prefix",
            vec![Bytes::from_static(&[0, 0])],
        ),
        (
            "a stream that ends inside the message",
            vec![framed(0, b"abcdef").slice(..8)],
        ),
    ];
    for (what, chunks) in cases {
        for path in ["/etcdserverpb.KV/Put", "/etcdserverpb.KV/Range"] {
            let ours = call(fe.client_addr, path, &[], chunks.clone()).await;
            let tonic = call(fe.client_addr, TONIC_PATH, &[], chunks.clone()).await;
            assert_ne!(ours.status, "0", "{what} on {path} was accepted");
            assert_eq!(
                (&ours.status, &ours.message),
                (&tonic.status, &tonic.message),
                "{what} on {path}"
            );
        }
    }
    // Over the limit: not tonic's OutOfRange but what etcd's clients get from grpc-go.
    for path in ["/etcdserverpb.KV/Put", "/etcdserverpb.KV/Range"] {
        let ours = call(fe.client_addr, path, &[], vec![too_large.clone().freeze()]).await;
        assert_eq!(ours.status, "8", "{path}"); // ResourceExhausted
        // As sent: grpc-message is percent-encoded.
        assert_eq!(
            ours.message,
            format!(
                "grpc: received message larger than max ({} vs. {limit})",
                limit + 1
            )
            .replace(' ', "%20"),
            "{path}"
        );
    }
    // Bytes that are no protobuf: tonic-prost's code (the message names the type, so differs).
    let junk = framed(0, &[0xff, 0xff, 0xff]);
    let ours = call(
        fe.client_addr,
        "/etcdserverpb.KV/Txn",
        &[],
        vec![junk.clone()],
    )
    .await;
    let tonic = call(fe.client_addr, TONIC_PATH, &[], vec![junk]).await;
    assert_eq!(ours.status, tonic.status);
    assert_eq!(ours.status, "13"); // Internal
    fe.stop().await.unwrap();
}

#[tokio::test]
async fn compressed_requests_are_left_to_tonic() {
    let fe = start().await;
    let range = framed(1, b"not really gzip");
    let ours = call(
        fe.client_addr,
        "/etcdserverpb.KV/Range",
        &[("grpc-encoding", "gzip")],
        vec![range.clone()],
    )
    .await;
    let tonic = call(
        fe.client_addr,
        TONIC_PATH,
        &[("grpc-encoding", "gzip")],
        vec![range],
    )
    .await;
    assert_eq!(ours.status, "12", "{}", ours.message); // Unimplemented: no compression here
    assert_eq!(
        (&ours.status, &ours.message),
        (&tonic.status, &tonic.message)
    );
    fe.stop().await.unwrap();
}
