//! A one-node journal served in the test's own process over gRPC on loopback, for the
//! journal crate's integration tests.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use journal::{JournalNode, NodeConfig};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// Node 1 alone at `addr` with its data in `dir`: one shard, 1 MiB segments, the defaults
/// otherwise. Tests change what they need with struct update syntax.
pub fn one_node(addr: &str, dir: &Path) -> NodeConfig {
    NodeConfig {
        id: 1,
        peers: BTreeMap::from([(1, addr.to_string())]),
        data_dir: dir.to_path_buf(),
        shards: 1,
        idle_tick: Duration::from_millis(500),
        join: false,
        segment_bytes: 1 << 20,
        batching: Default::default(),
        overlap_leader_fsync: true,
        read_lease: journal::node::DEFAULT_READ_LEASE,
        handoff_settle: Some(journal::handoff::DEFAULT_HANDOFF_SETTLE),
        refuse_streams: false,
        tls: None,
    }
}

/// A node serving until `stop`.
pub struct Running {
    pub addr: String,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Stops serving and waits until the node has shut down.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.task.await.expect("node task panicked");
    }
}

/// Opens the node of `config` and serves it on `listener`.
pub async fn serve(config: NodeConfig, listener: TcpListener) -> Running {
    let addr = listener.local_addr().expect("local addr").to_string();
    let node = JournalNode::open(config).await.expect("open node");
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        node.serve(listener, async {
            let _ = rx.await;
        })
        .await
        .expect("serve");
    });
    Running {
        addr,
        stop: Some(tx),
        task,
    }
}
