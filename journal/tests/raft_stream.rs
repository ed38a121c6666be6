//! The Raft `AppendEntriesStream` of a one-node journal in this process, over gRPC on
//! loopback: every request is answered in order, with its `seq`, exactly as the unary
//! `AppendEntries` answers the same request (a reply, or the status code and message).

use std::time::Duration;

use api::strata::journal::raft_client::RaftClient;
use api::strata::journal::{RaftAppendRequest, RaftAppendStreamReply, RaftAppendStreamRequest};
use journal::JournalClient;
use tokio::net::TcpListener;

mod common;

/// Longest wait for the node's shard to elect itself.
const LEADER_WAIT: Duration = Duration::from_secs(30);
/// Longest wait for one reply on the stream.
const REPLY_WAIT: Duration = Duration::from_secs(20);

/// An AppendEntries header (JSON, as the leader sends it) from a vote of term 0 by a node that
/// is not a member: a leader of term >= 1 answers it with its higher vote.
const STALE_HEADER: &str = r#"{"vote":{"leader_id":{"term":0,"node_id":7},"committed":false},"prev_log_id":null,"leader_commit":null}"#;

/// What the unary call answered, in the stream's terms: the reply, or (code, message).
fn unary_outcome(
    r: Result<tonic::Response<api::strata::journal::RaftReply>, tonic::Status>,
) -> (Option<Vec<u8>>, Option<(i32, String)>) {
    match r {
        Ok(r) => (Some(r.into_inner().json), None),
        Err(s) => (None, Some((s.code() as i32, s.message().to_string()))),
    }
}

fn stream_outcome(r: &RaftAppendStreamReply) -> (Option<Vec<u8>>, Option<(i32, String)>) {
    (
        r.reply.as_ref().map(|r| r.json.clone()),
        r.error.as_ref().map(|e| (e.code, e.message.clone())),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_answers_each_request_in_order_as_the_unary_call_does() {
    let dir = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let node = common::serve(common::one_node(&addr, dir.path()), listener).await;

    // Wait until the shard has its leader (its term is then >= 1).
    let c = JournalClient::connect(std::slice::from_ref(&node.addr))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + LEADER_WAIT;
    while !matches!(c.status(0).await, Ok(s) if s.leader_id == 1) {
        assert!(tokio::time::Instant::now() < deadline, "no leader");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let requests = [
        // Unknown shard: NOT_FOUND.
        RaftAppendRequest {
            shard: 99,
            header: STALE_HEADER.into(),
            entries: Vec::new(),
        },
        // A header that is not JSON: INVALID_ARGUMENT.
        RaftAppendRequest {
            shard: 0,
            header: b"not json".to_vec(),
            entries: Vec::new(),
        },
        // A stale leader's heartbeat: a reply carrying the higher vote.
        RaftAppendRequest {
            shard: 0,
            header: STALE_HEADER.into(),
            entries: Vec::new(),
        },
    ];
    let mut raft = RaftClient::connect(format!("http://{}", node.addr))
        .await
        .unwrap();
    let mut expected = Vec::new();
    for r in &requests {
        expected.push(unary_outcome(raft.append_entries(r.clone()).await));
    }
    assert!(
        expected[0]
            .1
            .as_ref()
            .is_some_and(|e| e.0 == tonic::Code::NotFound as i32)
    );
    assert!(
        expected[1]
            .1
            .as_ref()
            .is_some_and(|e| e.0 == tonic::Code::InvalidArgument as i32)
    );
    assert!(
        expected[2]
            .0
            .as_ref()
            .is_some_and(|j| String::from_utf8_lossy(j).contains("HigherVote")),
        "a stale vote gets the higher vote: {:?}",
        expected[2]
    );

    // All three sent before any reply is read, with gaps in their seqs: answered in order,
    // each with its own seq, as the unary call answered it; the stream stays open after an
    // error.
    let (tx, rx) = tokio::sync::mpsc::channel(requests.len());
    let mut replies = raft
        .append_entries_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let seqs = [10u64, 11, 20];
    for (seq, r) in seqs.iter().zip(&requests) {
        tx.send(RaftAppendStreamRequest {
            seq: *seq,
            append: Some(r.clone()),
        })
        .await
        .unwrap();
    }
    for (seq, want) in seqs.iter().zip(&expected) {
        let got = tokio::time::timeout(REPLY_WAIT, replies.message())
            .await
            .expect("a reply in time")
            .unwrap()
            .expect("the stream stays open");
        assert_eq!(got.seq, *seq);
        assert_eq!(&stream_outcome(&got), want, "seq {seq}");
    }
    // The leader closing its side ends the stream.
    drop(tx);
    let end = tokio::time::timeout(REPLY_WAIT, replies.message())
        .await
        .expect("the end in time");
    assert!(matches!(end, Ok(None)), "{end:?}");

    node.stop().await;
}
