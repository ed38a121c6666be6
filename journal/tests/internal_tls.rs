//! A three-node journal over internal TLS, in this process: the nodes elect leaders and
//! replicate over mutually authenticated connections, a client with a certificate of the
//! internal CA appends and reads, and clients without one (plaintext, no certificate, another
//! CA's) are refused.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use api::strata::journal::journal_admin_client::JournalAdminClient;
use api::strata::journal::raft_client::RaftClient;
use api::strata::journal::record::Kind;
use api::strata::journal::{HandoffRequest, RaftMessage};
use futures::StreamExt;
use journal::tls::{InternalTls, TlsFiles};
use journal::{JournalClient, NodeConfig};
use strata_tests::certs::Ca;
use tokio::net::TcpListener;

/// Writes `ca` and a peer certificate for loopback into `dir`; answers the files.
fn files(ca: &Ca, dir: &Path, name: &str) -> TlsFiles {
    let [ca, cert, key] = ca.write_with(&ca.peer(&["127.0.0.1", "localhost"]), dir, name);
    TlsFiles {
        ca,
        cert,
        key,
        crl: None,
    }
}

/// A client certificate of `ca` named `name`, valid for the DNS names `names`, loaded.
fn client_tls(ca: &Ca, dir: &Path, name: &str, names: &[&str]) -> Arc<InternalTls> {
    let [ca_file, cert, key] = ca.write_with(&ca.client(name, names), dir, name);
    let files = TlsFiles {
        ca: ca_file,
        cert,
        key,
        crl: None,
    };
    Arc::new(InternalTls::load(files).expect("load a client's internal TLS"))
}

fn tls(files: TlsFiles) -> Option<Arc<InternalTls>> {
    Some(Arc::new(
        InternalTls::load(files).expect("load internal TLS"),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nodes_and_clients_talk_only_over_mutual_tls() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let mut listeners = Vec::new();
    let mut peers = BTreeMap::new();
    for id in 1..=3u64 {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        peers.insert(id, l.local_addr().unwrap().to_string());
        listeners.push(l);
    }
    let mut nodes = Vec::new();
    for (id, listener) in (1..=3u64).zip(listeners) {
        let data = dir.path().join(format!("node{id}"));
        std::fs::create_dir_all(&data).unwrap();
        let config = NodeConfig {
            id,
            peers: peers.clone(),
            tls: tls(files(&ca, dir.path(), &format!("node{id}"))),
            ..common::one_node(&peers[&id], &data)
        };
        nodes.push(common::serve(config, listener).await);
    }
    let endpoints: Vec<String> = nodes.iter().map(|n| n.addr.clone()).collect();

    // A client of the internal CA: the shard elects a leader (the nodes' votes and
    // heartbeats go over TLS) and an append is acknowledged by a majority.
    let client = JournalClient::connect_over(&endpoints, tls(files(&ca, dir.path(), "client")))
        .await
        .unwrap();
    let index = client
        .append(0, vec![b"over tls".to_vec()])
        .await
        .expect("append over internal TLS")[0];
    let mut read = Box::pin(client.read(0, index).await.unwrap());
    let record = tokio::time::timeout(Duration::from_secs(10), read.next())
        .await
        .expect("a record")
        .expect("a record")
        .expect("a record");
    assert_eq!(record.index, index);
    assert_eq!(
        record.kind,
        Some(Kind::Data(b"over tls".to_vec())),
        "{record:?}"
    );
    // Status may come from a follower, which learns the commit index with the leader's next
    // message: a node of the shard reports a leader and the record committed within seconds.
    let mut status = client.status(0).await.unwrap();
    for _ in 0..100 {
        if status.leader_id != 0 && status.committed_index >= index {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        status = client.status(0).await.unwrap();
    }
    assert!(
        status.leader_id != 0 && status.committed_index >= index,
        "{status:?}"
    );

    // A plaintext client: the node answers only TLS.
    let plain = JournalClient::connect(&endpoints).await.unwrap();
    assert!(
        plain.status_of(&endpoints[0], 0).await.is_err(),
        "a plaintext client is served"
    );
    // A client of another CA: its certificate does not chain to the internal CA, and the
    // node's does not chain to its CA either.
    let other =
        JournalClient::connect_over(&endpoints, tls(files(&Ca::new(), dir.path(), "stranger")))
            .await
            .unwrap();
    assert!(
        other.status_of(&endpoints[0], 0).await.is_err(),
        "a client of another CA is served"
    );
    // A client that trusts the internal CA but presents no certificate.
    let anonymous = tonic::transport::Endpoint::from_shared(format!("https://{}", endpoints[0]))
        .unwrap()
        .tls_config(
            tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(&ca.cert_pem))
                .domain_name("localhost"),
        )
        .unwrap()
        .connect()
        .await;
    let refused = match anonymous {
        Err(_) => true,
        Ok(ch) => api::strata::journal::journal_client::JournalClient::new(ch)
            .status(api::strata::journal::StatusRequest { shard: 0 })
            .await
            .is_err(),
    };
    assert!(refused, "a client without a certificate is served");
    // The client of the internal CA is still served after those refusals.
    client.append(0, vec![b"again".to_vec()]).await.unwrap();

    // A frontend's certificate (the internal CA's, valid for no journal host) appends and
    // reads, but the Raft and admin services answer only journal nodes.
    let frontend = client_tls(&ca, dir.path(), "frontend", &[]);
    let as_frontend = JournalClient::connect_over(&endpoints, Some(Arc::clone(&frontend)))
        .await
        .unwrap();
    as_frontend
        .append(0, vec![b"from a frontend".to_vec()])
        .await
        .expect("a frontend appends");
    let node_tls = tls(files(&ca, dir.path(), "operator")).unwrap();
    let raft_call = |tls: Arc<InternalTls>| {
        let endpoint =
            tonic::transport::Endpoint::from_shared(format!("http://{}", endpoints[0])).unwrap();
        async move {
            let channel = tls.channel(&endpoint);
            let vote = RaftClient::new(channel.clone())
                .vote(RaftMessage {
                    shard: 0,
                    json: b"{}".to_vec(),
                })
                .await;
            let handoff = JournalAdminClient::new(channel)
                .handoff(HandoffRequest {
                    shard: 0,
                    ..Default::default()
                })
                .await;
            (
                vote.err().map(|s| s.code()),
                handoff.err().map(|s| s.code()),
            )
        }
    };
    let (vote, handoff) = raft_call(frontend).await;
    assert_eq!(
        vote,
        Some(tonic::Code::PermissionDenied),
        "a frontend votes"
    );
    assert_eq!(
        handoff,
        Some(tonic::Code::PermissionDenied),
        "a frontend hands a shard over"
    );
    let (vote, handoff) = raft_call(node_tls).await;
    assert_ne!(
        vote,
        Some(tonic::Code::PermissionDenied),
        "a node's vote refused"
    );
    assert_ne!(
        handoff,
        Some(tonic::Code::PermissionDenied),
        "a node's hand-off report refused"
    );

    // Trim deletes history: only the compactor's certificate (valid for strata-compactor)
    // and the nodes' are answered, a frontend's is refused and trims nothing.
    let first = |c: &JournalClient| {
        let c = c.clone();
        async move { c.status(0).await.unwrap().first_index }
    };
    let before = first(&as_frontend).await;
    let refused = as_frontend.trim(0, 2).await.unwrap_err();
    assert!(
        refused.to_string().contains("answers only the compactor"),
        "a frontend trims: {refused}"
    );
    assert_eq!(
        first(&as_frontend).await,
        before,
        "the refused trim trimmed"
    );
    let compactor = client_tls(
        &ca,
        dir.path(),
        "compactor",
        &[journal::tls::COMPACTOR_NAME],
    );
    let as_compactor = JournalClient::connect_over(&endpoints, Some(compactor))
        .await
        .unwrap();
    let kept = as_compactor.trim(0, 2).await.expect("the compactor trims");
    assert!((1..=2).contains(&kept), "first index kept {kept}");

    for n in nodes {
        n.stop().await;
    }
}
