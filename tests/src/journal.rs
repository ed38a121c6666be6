//! A journal cluster of `strata journal` processes on loopback for tests: start, kill -9,
//! restart, per-node clients, waiting for leaders, reading a node's whole shard, and a TCP
//! proxy the test controls to cut a node off from its peers.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use api::strata::journal::Record;
use api::strata::journal::record::Kind;
use journal::JournalClient;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::process::{ChildGuard, free_port};

/// How long the harness waits for a cluster to converge before failing the test.
pub const CONVERGE_TIMEOUT: Duration = Duration::from_secs(60);

/// One `strata journal` process.
pub struct JournalProc {
    pub id: u64,
    pub addr: String,
    pub data_dir: PathBuf,
    pub peers: String,
    pub join: bool,
    /// Flags for this node only, after the cluster's `extra_args`.
    pub own_args: Vec<String>,
    log: PathBuf,
    guard: Option<ChildGuard>,
}

impl JournalProc {
    fn args(&self, shards: u32, extra: &[String]) -> Vec<String> {
        let mut a = vec![
            "journal".into(),
            "--id".into(),
            self.id.to_string(),
            "--listen".into(),
            self.addr.clone(),
            "--peers".into(),
            self.peers.clone(),
            "--data-dir".into(),
            self.data_dir.display().to_string(),
            "--shards".into(),
            shards.to_string(),
        ];
        if self.join {
            a.push("--join".into());
        }
        a.extend_from_slice(extra);
        a.extend_from_slice(&self.own_args);
        a
    }

    pub fn is_running(&mut self) -> bool {
        self.guard.as_mut().is_some_and(ChildGuard::is_running)
    }

    /// Path of the node's log file (stdout and stderr).
    pub fn log_path(&self) -> &Path {
        &self.log
    }
}

/// A cluster of journal processes sharing a temporary directory.
pub struct JournalCluster {
    pub dir: tempfile::TempDir,
    pub shards: u32,
    pub nodes: Vec<JournalProc>,
    pub extra_args: Vec<String>,
}

impl JournalCluster {
    /// Starts `n` nodes (ids 1..=n) with `shards` shards, every node dialling its peers
    /// directly.
    pub fn start(n: u64, shards: u32, extra_args: &[String]) -> Self {
        let addrs: BTreeMap<u64, String> = (1..=n)
            .map(|id| (id, format!("127.0.0.1:{}", free_port())))
            .collect();
        let peers: BTreeMap<u64, String> = (1..=n).map(|id| (id, peers_arg(&addrs))).collect();
        Self::start_with_peers(&addrs, &peers, shards, extra_args)
    }

    /// Starts `n` nodes like `start`, node `id` also given `own_args(id)` (say, its own
    /// `--metrics-listen`).
    pub fn start_with_own_args(n: u64, shards: u32, own_args: impl Fn(u64) -> Vec<String>) -> Self {
        let addrs: BTreeMap<u64, String> = (1..=n)
            .map(|id| (id, format!("127.0.0.1:{}", free_port())))
            .collect();
        let dir = tempfile::tempdir().expect("tempdir");
        let mut c = JournalCluster {
            dir,
            shards,
            nodes: Vec::new(),
            extra_args: Vec::new(),
        };
        for (id, addr) in &addrs {
            let data_dir = c.dir.path().join(format!("node-{id}"));
            let log = c.dir.path().join(format!("node-{id}.log"));
            c.nodes.push(JournalProc {
                id: *id,
                addr: addr.clone(),
                data_dir,
                peers: peers_arg(&addrs),
                join: false,
                own_args: own_args(*id),
                log,
                guard: None,
            });
            c.restart(c.nodes.len() - 1);
        }
        c
    }

    /// Starts nodes listening at `addrs`, node `id` given `peers[id]` as its `--peers` (so a
    /// test can route some links through proxies).
    pub fn start_with_peers(
        addrs: &BTreeMap<u64, String>,
        peers: &BTreeMap<u64, String>,
        shards: u32,
        extra_args: &[String],
    ) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut c = JournalCluster {
            dir,
            shards,
            nodes: Vec::new(),
            extra_args: extra_args.to_vec(),
        };
        for (id, addr) in addrs {
            c.add_node(*id, addr.clone(), peers[id].clone(), false);
        }
        c
    }

    /// Adds and starts a node.
    pub fn add_node(&mut self, id: u64, addr: String, peers: String, join: bool) -> usize {
        let data_dir = self.dir.path().join(format!("node-{id}"));
        let log = self.dir.path().join(format!("node-{id}.log"));
        self.nodes.push(JournalProc {
            id,
            addr,
            data_dir,
            peers,
            join,
            own_args: Vec::new(),
            log,
            guard: None,
        });
        let i = self.nodes.len() - 1;
        self.restart(i);
        i
    }

    /// (Re)starts node `i` with its data directory as it is.
    pub fn restart(&mut self, i: usize) {
        let n = &mut self.nodes[i];
        let args = n.args(self.shards, &self.extra_args);
        n.guard = Some(ChildGuard::strata(
            &format!("journal-{}", n.id),
            &args,
            Some(&n.log),
        ));
    }

    /// `kill -9` node `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut g) = self.nodes[i].guard.take() {
            g.kill();
        }
    }

    /// Index in `nodes` of the node with id `id`.
    pub fn index_of(&self, id: u64) -> usize {
        self.nodes
            .iter()
            .position(|n| n.id == id)
            .unwrap_or_else(|| panic!("no node {id}"))
    }

    /// The `--peers` of a node `new` at `addr` joining in place of node `old`: every node of
    /// the cluster but `old`, and `new`.
    pub fn peers_replacing(&self, old: u64, new: u64, addr: &str) -> String {
        let mut addrs: BTreeMap<u64, String> =
            self.nodes.iter().map(|n| (n.id, n.addr.clone())).collect();
        addrs.remove(&old);
        addrs.insert(new, addr.to_string());
        peers_arg(&addrs)
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.addr.clone()).collect()
    }

    /// A client of every node.
    pub async fn client(&self) -> JournalClient {
        JournalClient::connect(&self.endpoints())
            .await
            .expect("client")
    }

    /// A client of node `i` only.
    pub async fn client_of(&self, i: usize) -> JournalClient {
        JournalClient::connect(std::slice::from_ref(&self.nodes[i].addr))
            .await
            .expect("client")
    }

    /// Waits until every shard has a leader that the running nodes agree on; returns the
    /// leader id of each shard.
    pub async fn wait_leaders(&self, running: &[usize]) -> Vec<u64> {
        let deadline = tokio::time::Instant::now() + CONVERGE_TIMEOUT;
        let mut clients = Vec::new();
        for &i in running {
            clients.push(self.client_of(i).await);
        }
        'again: loop {
            assert!(
                tokio::time::Instant::now() < deadline,
                "shards have no agreed leader after {CONVERGE_TIMEOUT:?}; logs in {}",
                self.dir.path().display()
            );
            let mut leaders = Vec::new();
            for s in 0..self.shards {
                let mut seen = None;
                for (c, &i) in clients.iter().zip(running) {
                    let st = match c.status_of(&self.nodes[i].addr, s).await {
                        Ok(st) => st,
                        Err(_) => {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue 'again;
                        }
                    };
                    if st.leader_id == 0 || seen.is_some_and(|l| l != st.leader_id) {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue 'again;
                    }
                    seen = Some(st.leader_id);
                }
                leaders.push(seen.unwrap_or(0));
            }
            return leaders;
        }
    }

    /// Waits until node `i` has applied (committed) at least `index` on `shard`.
    pub async fn wait_committed(&self, i: usize, shard: u32, index: u64) {
        let c = self.client_of(i).await;
        let deadline = tokio::time::Instant::now() + CONVERGE_TIMEOUT;
        loop {
            if let Ok(st) = c.status_of(&self.nodes[i].addr, shard).await
                && st.committed_index >= index
            {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "node {} did not reach index {index} on shard {shard}",
                self.nodes[i].id
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Every record of `shard` on node `i` from `from` up to and including `to`.
    pub async fn read_node(&self, i: usize, shard: u32, from: u64, to: u64) -> Vec<Record> {
        use futures::StreamExt;
        self.wait_committed(i, shard, to).await;
        let c = self.client_of(i).await;
        let mut s = Box::pin(c.read(shard, from).await.expect("read"));
        let mut out = Vec::new();
        while out.len() as u64 <= to - from {
            let r = tokio::time::timeout(CONVERGE_TIMEOUT, s.next())
                .await
                .expect("read timed out")
                .expect("stream ended")
                .expect("read error");
            out.push(r);
        }
        out
    }

    /// Stops `appenders` (one per shard, in shard order from 0), asserts no append failed, and
    /// checks that nodes `nodes` agree on each shard's records (`check_nodes_agree`).
    pub async fn stop_and_check(&self, appenders: Vec<Appenders>, nodes: &[usize]) {
        for (s, a) in appenders.into_iter().enumerate() {
            let (acked, failures) = a.stop().await;
            assert!(
                failures.is_empty(),
                "shard {s}: appends failed: {failures:?}"
            );
            let shard = u32::try_from(s).expect("shard number");
            self.check_nodes_agree(nodes, shard, 0, &acked).await;
        }
    }

    /// Checks that nodes `nodes` hold the same gap-free records of `shard` from `from` up to
    /// the highest acknowledged index, with journal times that never go back, and that every
    /// acknowledged index holds the acknowledged bytes.
    pub async fn check_nodes_agree(
        &self,
        nodes: &[usize],
        shard: u32,
        from: u64,
        acked: &BTreeMap<u64, Vec<u8>>,
    ) {
        let last = *acked.keys().last().expect("something was acked");
        let mut reference: Option<Vec<Record>> = None;
        for &i in nodes {
            let id = self.nodes[i].id;
            let recs = self.read_node(i, shard, from, last).await;
            let mut prev_time = i64::MIN;
            for (k, r) in recs.iter().enumerate() {
                assert_eq!(
                    r.index,
                    from + k as u64,
                    "node {id} shard {shard} has a gap"
                );
                assert!(r.time_ms >= prev_time, "time went back at {}", r.index);
                prev_time = r.time_ms;
                if let Some(p) = acked.get(&r.index) {
                    assert_eq!(
                        r.kind,
                        Some(Kind::Data(p.clone())),
                        "node {id} shard {shard} index {}",
                        r.index
                    );
                }
            }
            match &reference {
                None => reference = Some(recs),
                Some(r0) => assert_eq!(r0, &recs, "node {id} differs on shard {shard}"),
            }
        }
    }
}

/// Appends `n` payloads `"{label} {i}"` to `shard` one at a time, recording each acknowledged
/// index with its bytes in `acked`.
pub async fn append_acked(
    client: &JournalClient,
    shard: u32,
    label: &str,
    n: u32,
    acked: &mut BTreeMap<u64, Vec<u8>>,
) {
    for i in 0..n {
        let p = format!("{label} {i}").into_bytes();
        let idx = client.append(shard, vec![p.clone()]).await.expect("append")[0];
        acked_once(acked, idx, p);
    }
}

/// Records that `index` was acknowledged for `payload`; an index acknowledged twice (a new
/// leader handing an acknowledged position to another append) fails the test here, since the
/// later payload would otherwise replace the lost one and match the disk.
pub fn acked_once(acked: &mut BTreeMap<u64, Vec<u8>>, index: u64, payload: Vec<u8>) {
    if let Some(first) = acked.insert(index, payload) {
        panic!(
            "index {index} acknowledged twice: first for {:?}, then for {:?}",
            String::from_utf8_lossy(&first),
            String::from_utf8_lossy(&acked[&index])
        );
    }
}

/// `1=addr,2=addr,...`
pub fn peers_arg(addrs: &BTreeMap<u64, String>) -> String {
    addrs
        .iter()
        .map(|(id, a)| format!("{id}={a}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// A TCP proxy on loopback that the test can cut (existing connections are dropped, new ones
/// refused by closing them at once) and heal.
pub struct TcpProxy {
    pub addr: String,
    cut: Arc<watch::Sender<bool>>,
    task: tokio::task::JoinHandle<()>,
}

impl TcpProxy {
    /// Proxies a fresh loopback port to `target`.
    pub async fn start(target: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("addr").to_string();
        let cut = Arc::new(watch::Sender::new(false));
        let c = Arc::clone(&cut);
        let task = tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    return;
                };
                if *c.borrow() {
                    drop(inbound);
                    continue;
                }
                let mut rx = c.subscribe();
                let target = target.clone();
                tokio::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(&target).await else {
                        return;
                    };
                    let _ = inbound.set_nodelay(true);
                    let _ = outbound.set_nodelay(true);
                    let (mut a, mut b) = (inbound, outbound);
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut a, &mut b) => {}
                        _ = rx.wait_for(|cut| *cut) => {}
                    }
                });
            }
        });
        TcpProxy { addr, cut, task }
    }

    /// Drops every connection through the proxy and refuses new ones.
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    /// Lets connections through again.
    pub fn heal(&self) {
        self.cut.send_replace(false);
    }
}

/// Addresses for nodes 1..=n, a TCP proxy on every directed link between them (`(from, to)`),
/// and each node's `--peers`, dialling its peers through its own proxies: a test can cut any
/// node off from the others while clients still reach it.
pub struct ProxiedMesh {
    pub addrs: BTreeMap<u64, String>,
    pub proxies: BTreeMap<(u64, u64), TcpProxy>,
    pub peers: BTreeMap<u64, String>,
}

impl ProxiedMesh {
    pub async fn start(n: u64) -> Self {
        let addrs: BTreeMap<u64, String> = (1..=n)
            .map(|id| (id, format!("127.0.0.1:{}", free_port())))
            .collect();
        let mut proxies = BTreeMap::new();
        for from in 1..=n {
            for to in (1..=n).filter(|to| *to != from) {
                proxies.insert((from, to), TcpProxy::start(addrs[&to].clone()).await);
            }
        }
        let peers = (1..=n)
            .map(|from| {
                let list = (1..=n)
                    .map(|to| match proxies.get(&(from, to)) {
                        Some(p) => format!("{to}={}", p.addr),
                        None => format!("{to}={}", addrs[&to]),
                    })
                    .collect::<Vec<_>>()
                    .join(",");
                (from, list)
            })
            .collect();
        ProxiedMesh {
            addrs,
            proxies,
            peers,
        }
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Closed-loop appenders on one shard: each appends `appender <t> seq <n>` one payload at a
/// time until stopped, recording every acknowledged index with its bytes and every failure.
pub struct Appenders {
    acked: Arc<tokio::sync::Mutex<BTreeMap<u64, Vec<u8>>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<Vec<String>>>,
}

/// Pause between polls of the acknowledged count.
const ACK_POLL: Duration = Duration::from_millis(50);

impl Appenders {
    /// Starts `n` appenders on `shard` through `client`.
    pub fn start(client: &JournalClient, shard: u32, n: usize) -> Self {
        let acked: Arc<tokio::sync::Mutex<BTreeMap<u64, Vec<u8>>>> = Arc::default();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let tasks = (0..n)
            .map(|t| {
                let (client, acked, stop) = (client.clone(), Arc::clone(&acked), Arc::clone(&stop));
                tokio::spawn(async move {
                    let mut failures = Vec::new();
                    let mut seq = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let p = format!("appender {t} seq {seq}").into_bytes();
                        seq += 1;
                        match client.append(shard, vec![p.clone()]).await {
                            Ok(idx) => acked_once(&mut *acked.lock().await, idx[0], p),
                            Err(e) => failures.push(e.to_string()),
                        }
                    }
                    failures
                })
            })
            .collect();
        Self { acked, stop, tasks }
    }

    /// How many appends were acknowledged so far.
    pub async fn acked_count(&self) -> usize {
        self.acked.lock().await.len()
    }

    /// Waits until at least `n` appends were acknowledged; panics after `timeout`.
    pub async fn wait_acked(&self, n: usize, timeout: Duration) {
        let deadline = tokio::time::Instant::now() + timeout;
        while self.acked_count().await < n {
            assert!(
                tokio::time::Instant::now() < deadline,
                "appends stalled below {n}"
            );
            tokio::time::sleep(ACK_POLL).await;
        }
    }

    /// Stops the appenders; answers every acknowledged index with its bytes, and every
    /// failed append's error.
    pub async fn stop(self) -> (BTreeMap<u64, Vec<u8>>, Vec<String>) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut failures = Vec::new();
        for t in self.tasks {
            failures.extend(t.await.expect("appender task panicked"));
        }
        let acked = self.acked.lock().await.clone();
        (acked, failures)
    }
}

/// The first index journal node `addr` (`host:port`) still holds of `shard`, 0 while it cannot
/// answer (tests wait for a trim with it).
pub async fn first_index_of(addr: &str, shard: u32) -> u64 {
    let Ok(mut c) =
        api::strata::journal::journal_client::JournalClient::connect(format!("http://{addr}"))
            .await
    else {
        return 0;
    };
    c.status(api::strata::journal::StatusRequest { shard })
        .await
        .map(|r| r.into_inner().first_index)
        .unwrap_or(0)
}
