//! The `AppendStream` RPC that `JournalClient::append` uses: each request of a stream answers
//! exactly as a unary `Append` would (same codes, messages, metadata), by its sequence number;
//! a stream broken under many appenders loses no acknowledged append and the appenders carry on
//! on a new stream.

use std::collections::HashMap;
use std::time::Duration;

use api::strata::journal::journal_client::JournalClient as GrpcClient;
use api::strata::journal::{
    AppendRequest, AppendStreamRequest, AppendStreamResponse, ReadIndexRequest,
};
use futures::StreamExt;
use journal::ClientError;
use journal::error::{ERROR_KIND_METADATA, FIRST_INDEX_METADATA, LEADER_METADATA};
use journal::node::MAX_ENTRY_BYTES;
use strata_tests::journal::{Appenders, JournalCluster, TcpProxy};
use tokio::sync::mpsc;

/// The shard the tests drive.
const SHARD: u32 = 0;
/// Concurrent appenders while the stream breaks.
const APPENDERS: usize = 64;
/// How long the appenders may take to reach the next acknowledged count.
const ACK_WAIT: Duration = Duration::from_secs(60);
/// How long a test waits for one answer on a raw stream.
const ANSWER_WAIT: Duration = Duration::from_secs(30);
/// How long the proxy stays cut.
const CUT_FOR: Duration = Duration::from_secs(2);

async fn grpc(addr: &str) -> GrpcClient<tonic::transport::Channel> {
    GrpcClient::connect(format!("http://{addr}"))
        .await
        .expect("connect")
        .max_decoding_message_size(64 * 1024 * 1024)
        .max_encoding_message_size(64 * 1024 * 1024)
}

/// The `x-strata-*` metadata of a status, as the stream carries it.
fn strata_metadata(s: &tonic::Status) -> HashMap<String, String> {
    [ERROR_KIND_METADATA, LEADER_METADATA, FIRST_INDEX_METADATA]
        .into_iter()
        .filter_map(|k| {
            let v = s.metadata().get(k)?.to_str().ok()?;
            Some((k.to_string(), v.to_string()))
        })
        .collect()
}

/// Sends `reqs` on one stream (as `(seq, request)`), answers them by sequence number.
struct RawStream {
    tx: mpsc::Sender<AppendStreamRequest>,
    rx: tonic::Streaming<AppendStreamResponse>,
}

impl RawStream {
    async fn open(addr: &str) -> Self {
        let (tx, rx) = mpsc::channel(64);
        let resp = grpc(addr)
            .await
            .append_stream(futures::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|m| (m, rx))
            }))
            .await
            .expect("open append stream");
        RawStream {
            tx,
            rx: resp.into_inner(),
        }
    }

    async fn ask(
        &mut self,
        reqs: Vec<(u64, Option<AppendRequest>)>,
    ) -> HashMap<u64, AppendStreamResponse> {
        let reqs = reqs
            .into_iter()
            .map(|(seq, append)| AppendStreamRequest {
                seq,
                append,
                read_index: None,
            })
            .collect();
        self.ask_raw(reqs).await
    }

    async fn ask_raw(
        &mut self,
        reqs: Vec<AppendStreamRequest>,
    ) -> HashMap<u64, AppendStreamResponse> {
        let n = reqs.len();
        for req in reqs {
            self.tx.send(req).await.expect("stream open");
        }
        let mut out = HashMap::new();
        while out.len() < n {
            let r = tokio::time::timeout(ANSWER_WAIT, self.rx.next())
                .await
                .expect("answer in time")
                .expect("stream still open")
                .expect("no stream error");
            assert!(
                out.insert(r.seq, r.clone()).is_none(),
                "seq {} answered twice",
                r.seq
            );
        }
        out
    }
}

/// Asserts that the stream's answer to `req` is the unary call's answer to it.
async fn assert_same_as_unary(addr: &str, req: AppendRequest, streamed: &AppendStreamResponse) {
    let unary = grpc(addr).await.append(req).await.map(|_| ());
    assert_same_error(unary, streamed);
}

/// Asserts that a failed streamed call carries the unary call's status: code, message and
/// metadata.
fn assert_same_error(unary: Result<(), tonic::Status>, streamed: &AppendStreamResponse) {
    match (unary, &streamed.error) {
        (Err(s), Some(e)) => {
            assert_eq!(e.code, s.code() as i32, "code of {s:?}");
            assert_eq!(e.message, s.message());
            assert_eq!(e.metadata, strata_metadata(&s));
            assert!(streamed.indexes.is_empty());
        }
        (u, e) => panic!("unary answered {u:?}, the stream {e:?}"),
    }
}

/// A 3-node cluster with shard `SHARD`'s leader elected: the cluster, the leader's position and a
/// follower's.
async fn three_nodes() -> (JournalCluster, usize, usize) {
    let c = JournalCluster::start(3, 1, &[]);
    let leaders = c.wait_leaders(&[0, 1, 2]).await;
    let leader = c.index_of(leaders[SHARD as usize]);
    (c, leader, (leader + 1) % 3)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_streamed_append_answers_as_the_unary_call_would() {
    let (c, leader, follower) = three_nodes().await;
    let (leader_addr, follower_addr) =
        (c.nodes[leader].addr.clone(), c.nodes[follower].addr.clone());

    let good = |p: &[u8]| AppendRequest {
        shard: SHARD,
        payloads: vec![p.to_vec()],
    };
    let oversize = AppendRequest {
        shard: SHARD,
        payloads: vec![vec![0u8; MAX_ENTRY_BYTES + 1]],
    };
    let unknown = AppendRequest {
        shard: 99,
        payloads: vec![b"x".to_vec()],
    };
    let mut s = RawStream::open(&leader_addr).await;
    let answers = s
        .ask(vec![
            (10, Some(oversize.clone())),
            (11, Some(good(b"one"))),
            (12, Some(unknown.clone())),
            (13, None),
            (14, Some(good(b"two"))),
        ])
        .await;
    assert_same_as_unary(&leader_addr, oversize, &answers[&10]).await;
    assert_same_as_unary(&leader_addr, unknown, &answers[&12]).await;
    assert_eq!(
        answers[&13].error.as_ref().map(|e| e.code),
        Some(tonic::Code::InvalidArgument as i32)
    );
    let (one, two) = (&answers[&11], &answers[&14]);
    assert!(one.error.is_none() && two.error.is_none(), "{answers:?}");
    assert_eq!((one.indexes.len(), two.indexes.len()), (1, 1));
    assert_ne!(one.indexes[0], two.indexes[0]);
    // The stream stays usable after errors.
    let again = s.ask(vec![(15, Some(good(b"three")))]).await;
    assert!(again[&15].error.is_none() && again[&15].indexes.len() == 1);
    let records = c
        .read_node(leader, SHARD, one.indexes[0], again[&15].indexes[0])
        .await;
    let data: Vec<_> = records
        .iter()
        .filter_map(|r| match &r.kind {
            Some(api::strata::journal::record::Kind::Data(d)) => Some(d.clone()),
            _ => None,
        })
        .collect();
    assert!(data.contains(&b"one".to_vec()) && data.contains(&b"three".to_vec()));

    // A follower answers a streamed append as its unary Append: not the leader, with the
    // leader's address (the journal redirects; it never forwards).
    let mut f = RawStream::open(&follower_addr).await;
    let answer = f.ask(vec![(1, Some(good(b"via follower")))]).await;
    assert!(answer[&1].error.is_some(), "a follower took an append");
    {
        assert_same_as_unary(&follower_addr, good(b"via follower"), &answer[&1]).await;
        assert_eq!(
            answer[&1]
                .error
                .as_ref()
                .unwrap()
                .metadata
                .get(LEADER_METADATA),
            Some(&leader_addr)
        );
    }

    // The client classifies streamed errors as it did unary ones, and follows the leader.
    let client = c.client_of(follower).await;
    let too_large = client
        .append(SHARD, vec![vec![0u8; MAX_ENTRY_BYTES + 1]])
        .await;
    assert!(
        matches!(too_large, Err(ClientError::Rejected(_))),
        "{too_large:?}"
    );
    let unknown = client.append(99, vec![b"x".to_vec()]).await;
    assert!(
        matches!(unknown, Err(ClientError::UnknownShard { shard: 99, .. })),
        "{unknown:?}"
    );
    let idx = client
        .append(SHARD, vec![b"a".to_vec(), b"b".to_vec()])
        .await
        .expect("append through a follower-only client");
    assert_eq!(idx.len(), 2);
    assert_eq!(idx[1], idx[0] + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broken_stream_loses_no_acknowledged_append() {
    let c = JournalCluster::start(3, 1, &[]);
    let leaders = c.wait_leaders(&[0, 1, 2]).await;
    let leader = c.index_of(leaders[SHARD as usize]);
    let proxy = TcpProxy::start(c.nodes[leader].addr.clone()).await;
    let client = journal::JournalClient::connect(std::slice::from_ref(&proxy.addr))
        .await
        .expect("client");
    let appenders = Appenders::start(&client, SHARD, APPENDERS);
    appenders.wait_acked(500, ACK_WAIT).await;
    for round in 0..3 {
        // Every connection through the proxy drops: the shared stream breaks with appends
        // in flight; they are retried on a new stream once the proxy lets connections through.
        proxy.cut();
        tokio::time::sleep(CUT_FOR).await;
        let at_cut = appenders.acked_count().await;
        proxy.heal();
        appenders.wait_acked(at_cut + 500, ACK_WAIT).await;
        eprintln!("round {round}: {} acked", appenders.acked_count().await);
    }
    let (acked, failures) = appenders.stop().await;
    assert!(failures.is_empty(), "appends failed: {failures:?}");
    c.check_nodes_agree(&[0, 1, 2], SHARD, 0, &acked).await;
}

/// A read index asked on the append stream: an index at least that of an append acknowledged
/// before it, never above what a unary `ReadIndex` asked afterwards answers; errors as the unary
/// call's (unknown shard; a follower's redirect to the leader); a request with both an append
/// and a read index refused; and the client's `read_index` follows the leader over the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_streamed_read_index_answers_as_the_unary_call_would() {
    let (c, leader, follower) = three_nodes().await;
    let (leader_addr, follower_addr) =
        (c.nodes[leader].addr.clone(), c.nodes[follower].addr.clone());
    let read_index = |seq, shard| AppendStreamRequest {
        seq,
        append: None,
        read_index: Some(ReadIndexRequest { shard }),
    };
    let mut s = RawStream::open(&leader_addr).await;
    let acked = s
        .ask(vec![(
            1,
            Some(AppendRequest {
                shard: SHARD,
                payloads: vec![b"w".to_vec()],
            }),
        )])
        .await;
    let written = acked[&1].indexes[0];
    let both = AppendStreamRequest {
        seq: 4,
        append: Some(AppendRequest {
            shard: SHARD,
            payloads: vec![b"x".to_vec()],
        }),
        read_index: Some(ReadIndexRequest { shard: SHARD }),
    };
    let answers = s
        .ask_raw(vec![read_index(2, SHARD), read_index(3, 99), both])
        .await;
    assert!(answers[&2].error.is_none(), "{answers:?}");
    assert_eq!(answers[&2].indexes.len(), 1);
    let streamed = answers[&2].indexes[0];
    assert!(
        streamed >= written,
        "read index {streamed} below the acknowledged append {written}"
    );
    let unary = grpc(&leader_addr)
        .await
        .read_index(ReadIndexRequest { shard: SHARD })
        .await
        .expect("unary read index")
        .into_inner()
        .index;
    assert!(unary >= streamed, "unary {unary} after streamed {streamed}");
    let unknown = grpc(&leader_addr)
        .await
        .read_index(ReadIndexRequest { shard: 99 })
        .await
        .map(|_| ());
    assert_same_error(unknown, &answers[&3]);
    assert_eq!(
        answers[&4].error.as_ref().map(|e| e.code),
        Some(tonic::Code::InvalidArgument as i32)
    );

    // A follower answers as its unary ReadIndex does: a redirect naming the leader.
    let mut f = RawStream::open(&follower_addr).await;
    let answer = f.ask_raw(vec![read_index(1, SHARD)]).await;
    assert!(
        answer[&1].error.is_some(),
        "a follower answered a read index"
    );
    {
        let unary = grpc(&follower_addr)
            .await
            .read_index(ReadIndexRequest { shard: SHARD })
            .await
            .map(|_| ());
        assert_same_error(unary, &answer[&1]);
        assert_eq!(
            answer[&1]
                .error
                .as_ref()
                .and_then(|e| e.metadata.get(LEADER_METADATA)),
            Some(&leader_addr)
        );
    }

    // The client asks over the stream and follows the leader from a follower-only list.
    let client = c.client_of(follower).await;
    let idx = client
        .read_index(SHARD)
        .await
        .expect("read index through a follower-only client");
    assert!(idx >= written);
    assert!(matches!(
        client.read_index(99).await,
        Err(ClientError::UnknownShard { shard: 99, .. })
    ));
}
