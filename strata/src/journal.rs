//! `strata journal`: runs one journal node (the default), or an admin/benchmark sub-command of
//! the journal (`replace-node`, `handoff`, `fsync-probe`, `bench`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Subcommand;

mod bench;
mod metrics;

/// Flags of `strata journal`. Without a sub-command, runs one node: every node of a fresh
/// cluster is started with the same `--peers`, and the cluster forms by itself.
#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    node: NodeArgs,
}

#[derive(clap::Args)]
struct NodeArgs {
    /// A config file (TOML, or JSON if it ends in `.json`) with any of the settings below,
    /// named as the flags (`id`, `listen`, `data-dir`, `shards`, `idle-tick`, `join`,
    /// `segment-bytes`, `metrics-listen`, `internal-trusted-ca-file`, `internal-cert-file`,
    /// `internal-key-file`, `internal-crl-file`, and a `[peers]` table of `id = "host:port"`).
    /// Flags given on the command line override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// This node's id (a positive integer, unique in the cluster).
    #[arg(long, env = "STRATA_JOURNAL_ID")]
    id: Option<u64>,
    /// Address to listen on (client API and Raft traffic) [default: 127.0.0.1:7001].
    #[arg(long)]
    listen: Option<String>,
    /// Every member of the initial cluster, this node included: `1=host:port,2=host:port,...`.
    /// Also the addresses this node dials its peers at.
    #[arg(long)]
    peers: Option<String>,
    /// Directory for this node's segment files and Raft state [default: strata-journal-data].
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Number of shards (Raft groups) every node hosts [default: 4].
    #[arg(long)]
    shards: Option<u32>,
    /// An idle shard gets a tick entry after this long, so journal time moves on
    /// [default: 500ms].
    #[arg(long, value_parser = humantime::parse_duration)]
    idle_tick: Option<Duration>,
    /// Join an existing cluster (a replacement node): never initialise a shard; wait for the
    /// leaders to add this node (`strata journal replace-node`).
    #[arg(long)]
    join: bool,
    /// Size at which a segment file is closed and a new one started [default: 64 MiB].
    #[arg(long)]
    segment_bytes: Option<u64>,
    /// Serve Prometheus metrics at http://<addr>/metrics.
    #[arg(long)]
    metrics_listen: Option<String>,
    /// Tuning: Raft entries of client payloads in flight per shard; Append calls arriving
    /// meanwhile are coalesced into the next entry.
    #[arg(long, default_value_t = journal::node::DEFAULT_MAX_INFLIGHT_ENTRIES)]
    max_inflight_entries: usize,
    /// Tuning: longest wait for the callers of the last committed entry to come back and join
    /// the next one (0, the default, turns it off).
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    coalesce_wait: Duration,
    /// Tuning: a leader fsyncs its own appends in parallel with sending them to the followers
    /// (true), or before (false). Either way nothing is acknowledged, served or committed to
    /// followers before it is durable on a majority including the leader.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    overlap_leader_fsync: bool,
    /// Leader lease for ReadIndex: a leader that a quorum acknowledged less than this long ago
    /// answers without a round to the followers (0 turns it off: every ReadIndex is a round).
    /// At most 1500ms (followers refuse votes for 2 s after they last heard from the leader).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    read_lease: Duration,
    /// Testing only: arm the storage failpoints. While `<data-dir>/FAILPOINTS` exists and names
    /// `write`, `fsync`, `dir-fsync`, `rename` and/or `remove`, segment writes fail as on a full
    /// disk, and fsyncs (of the log, of its directory), renames and removals of files fail with
    /// EIO;
    /// naming `slow-fsync`, every fsync of the log first waits 250 ms (a slow disk); holding
    /// `clock-offset=<ms>`, the node's wall clock reads that much ahead (negative: behind).
    #[arg(long)]
    failpoints: bool,
    /// After a failover, a shard's leadership goes back to its preferred node (the one that
    /// led it when the cluster formed) once that node has been alive and caught up this long
    /// (0 turns automatic hand-offs off; `strata journal handoff` still does them).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    handoff_settle: Duration,
    /// Testing only: answer UNIMPLEMENTED to the stream RPCs, as a node built before them
    /// would, so peers and clients fall back to unary calls with this node.
    #[arg(long, hide = true)]
    refuse_streams: bool,
    /// TLS between journal nodes and with their clients (`--internal-*`).
    #[command(flatten)]
    tls: journal::tls::TlsArgs,
}

impl NodeArgs {
    /// The settings given as flags, over those of `--config`.
    fn merged(&self) -> anyhow::Result<journal::config::FileConfig> {
        let file = match &self.config {
            Some(p) => journal::config::FileConfig::load(p)?,
            None => journal::config::FileConfig::default(),
        };
        let peers = match &self.peers {
            Some(p) => Some(
                parse_peers(p)?
                    .into_iter()
                    .map(|(id, a)| (id.to_string(), a))
                    .collect(),
            ),
            None => None,
        };
        let flags = journal::config::FileConfig {
            id: self.id,
            listen: self.listen.clone(),
            peers,
            data_dir: self.data_dir.clone(),
            shards: self.shards,
            idle_tick: self.idle_tick,
            join: self.join.then_some(true),
            segment_bytes: self.segment_bytes,
            metrics_listen: self.metrics_listen.clone(),
            internal_trusted_ca_file: self.tls.internal_trusted_ca_file.clone(),
            internal_cert_file: self.tls.internal_cert_file.clone(),
            internal_key_file: self.tls.internal_key_file.clone(),
            internal_crl_file: self.tls.internal_crl_file.clone(),
        };
        Ok(flags.over(file))
    }
}

#[derive(Subcommand)]
enum Command {
    /// Replace a (dead) node in every shard: add the new node, let it catch up, remove the old.
    ReplaceNode {
        /// Journal endpoints to talk to (any live nodes), comma-separated.
        #[arg(long, value_delimiter = ',')]
        endpoints: Vec<String>,
        /// Number of shards of the cluster.
        #[arg(long, default_value_t = 4)]
        shards: u32,
        /// Id of the node to remove.
        #[arg(long)]
        remove: u64,
        /// The new node, `id=host:port` (started with `--join`).
        #[arg(long)]
        add: String,
        #[command(flatten)]
        tls: journal::tls::TlsArgs,
    },
    /// Each shard's leader and preferred node (the one that led it when the cluster formed),
    /// and whether a leader hand-off is due; with `--start`, hands each shard whose leader is
    /// not its preferred node back to it, one shard at a time.
    Handoff {
        /// Journal endpoints to talk to (any live nodes), comma-separated.
        #[arg(long, value_delimiter = ',')]
        endpoints: Vec<String>,
        /// Number of shards of the cluster.
        #[arg(long, default_value_t = 4)]
        shards: u32,
        /// Only this shard.
        #[arg(long)]
        shard: Option<u32>,
        /// Hand over now (else only report).
        #[arg(long)]
        start: bool,
        /// Hand over to this node instead of the preferred one.
        #[arg(long, default_value_t = 0)]
        to: u64,
        #[command(flatten)]
        tls: journal::tls::TlsArgs,
    },
    /// Append throughput and latency (p50/p99) at several concurrencies.
    Bench(bench::BenchArgs),
    /// This disk's limit: sequential write + fdatasync per second, and its latency.
    FsyncProbe(bench::ProbeArgs),
}

fn parse_peers(s: &str) -> anyhow::Result<BTreeMap<u64, String>> {
    let mut out = BTreeMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) = part
            .split_once('=')
            .with_context(|| format!("peer {part:?} is not id=host:port"))?;
        let id: u64 = id
            .trim()
            .parse()
            .with_context(|| format!("peer id {id:?} is not a number"))?;
        if id == 0 {
            bail!("peer ids start at 1");
        }
        out.insert(id, addr.trim().to_string());
    }
    if out.is_empty() {
        bail!("--peers lists no peer");
    }
    Ok(out)
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        Some(Command::ReplaceNode {
            endpoints,
            shards,
            remove,
            add,
            tls,
        }) => {
            let client = journal::JournalClient::connect_over(&endpoints, tls.load()?).await?;
            replace_node(client, shards, remove, &add).await
        }
        Some(Command::Handoff {
            endpoints,
            shards,
            shard,
            start,
            to,
            tls,
        }) => {
            let client = journal::JournalClient::connect_over(&endpoints, tls.load()?).await?;
            handoff(client, shard.map_or(0..shards, |s| s..s + 1), start, to).await
        }
        Some(Command::Bench(a)) => bench::bench(a).await,
        Some(Command::FsyncProbe(a)) => bench::fsync_probe(a).await,
        None => run_node(args.node).await,
    }
}

async fn replace_node(
    client: journal::JournalClient,
    shards: u32,
    remove: u64,
    add: &str,
) -> anyhow::Result<()> {
    let added = parse_peers(add)?;
    let (add_id, add_addr) = added.into_iter().next().context("--add is empty")?;
    for shard in 0..shards {
        let voters = client
            .replace_node(shard, remove, add_id, &add_addr)
            .await
            .with_context(|| format!("shard {shard}"))?;
        println!("shard {shard}: voters {voters:?}");
    }
    Ok(())
}

async fn handoff(
    client: journal::JournalClient,
    shards: std::ops::Range<u32>,
    start: bool,
    to: u64,
) -> anyhow::Result<()> {
    let mut failed = 0;
    for shard in shards {
        let report = client.handoff(shard, false, to).await;
        let r = match report {
            Ok(r) if start && r.leader_id != if to == 0 { r.preferred_id } else { to } => {
                client.handoff(shard, true, to).await
            }
            other => other,
        };
        match r {
            Ok(r) => println!(
                "shard {shard}: leader {}, preferred {}: {}",
                r.leader_id, r.preferred_id, r.message
            ),
            Err(e) => {
                failed += 1;
                println!("shard {shard}: {e}");
            }
        }
    }
    anyhow::ensure!(failed == 0, "{failed} shard(s) failed");
    Ok(())
}

async fn run_node(a: NodeArgs) -> anyhow::Result<()> {
    let settings = a.merged()?;
    let listen = settings.listen_or_default();
    let mut config = settings.node_config()?;
    config.batching = journal::node::Batching {
        max_inflight_entries: a.max_inflight_entries,
        coalesce_wait: a.coalesce_wait,
    };
    config.overlap_leader_fsync = a.overlap_leader_fsync;
    anyhow::ensure!(
        a.read_lease <= journal::node::MAX_READ_LEASE,
        "--read-lease must be at most {:?}",
        journal::node::MAX_READ_LEASE
    );
    config.read_lease = a.read_lease;
    config.handoff_settle = (!a.handoff_settle.is_zero()).then_some(a.handoff_settle);
    config.refuse_streams = a.refuse_streams;
    config.tls = journal::tls::load_if(settings.tls_files()?)?;
    if a.refuse_streams {
        tracing::warn!("refusing the stream RPCs (testing the unary fallback)");
    }
    if a.failpoints {
        let file = config.data_dir.join("FAILPOINTS");
        tracing::warn!(trigger = %file.display(), "storage failpoints armed (testing only)");
        journal::failpoint::arm(file);
    }
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .with_context(|| format!("listening on {listen}"))?;
    let id = config.id;
    let config_tls = config.tls.clone();
    tracing::info!(id, internal_tls = config_tls.is_some(), %listen, shards = config.shards, data_dir = %config.data_dir.display(), "starting journal node");
    let node = journal::JournalNode::open(config).await?;
    if let Some(addr) = &settings.metrics_listen {
        metrics::serve(addr, std::sync::Arc::clone(&node)).await?;
    }
    if let Some(tls) = &config_tls {
        journal::tls::watch(tls, a.tls.internal_tls_reload_interval);
    }
    let shutdown = async {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
        }
        tracing::info!("shutting down");
    };
    node.serve(listener, shutdown).await?;
    Ok(())
}
