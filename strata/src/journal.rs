//! `strata journal`: runs one journal node (the default), or an admin/benchmark sub-command of
//! the journal (`replace-node`, `fsync-probe`, `bench`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Subcommand;

mod bench;

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
    /// This node's id (a positive integer, unique in the cluster).
    #[arg(long, env = "STRATA_JOURNAL_ID")]
    id: Option<u64>,
    /// Address to listen on (client API and Raft traffic), e.g. 127.0.0.1:7001.
    #[arg(long, default_value = "127.0.0.1:7001")]
    listen: String,
    /// Every member of the initial cluster, this node included: `1=host:port,2=host:port,...`.
    /// Also the addresses this node dials its peers at.
    #[arg(long)]
    peers: Option<String>,
    /// Directory for this node's segment files and Raft state.
    #[arg(long, default_value = "strata-journal-data")]
    data_dir: PathBuf,
    /// Number of shards (Raft groups) every node hosts.
    #[arg(long, default_value_t = 4)]
    shards: u32,
    /// An idle shard gets a tick entry after this long, so journal time moves on.
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    idle_tick: Duration,
    /// Join an existing cluster (a replacement node): never initialise a shard; wait for the
    /// leaders to add this node (`strata journal replace-node`).
    #[arg(long)]
    join: bool,
    /// Size at which a segment file is closed and a new one started.
    #[arg(long, default_value_t = journal::segment::SEGMENT_TARGET_BYTES)]
    segment_bytes: u64,
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
        }) => replace_node(endpoints, shards, remove, &add).await,
        Some(Command::Bench(a)) => bench::bench(a).await,
        Some(Command::FsyncProbe(a)) => bench::fsync_probe(a).await,
        None => run_node(args.node).await,
    }
}

async fn replace_node(
    endpoints: Vec<String>,
    shards: u32,
    remove: u64,
    add: &str,
) -> anyhow::Result<()> {
    let added = parse_peers(add)?;
    let (add_id, add_addr) = added.into_iter().next().context("--add is empty")?;
    let client = journal::JournalClient::connect(&endpoints).await?;
    for shard in 0..shards {
        let voters = client
            .replace_node(shard, remove, add_id, &add_addr)
            .await
            .with_context(|| format!("shard {shard}"))?;
        println!("shard {shard}: voters {voters:?}");
    }
    Ok(())
}

async fn run_node(a: NodeArgs) -> anyhow::Result<()> {
    let id = a.id.context("--id is required")?;
    let listen = a.listen.clone();
    let peers = match &a.peers {
        Some(p) => parse_peers(p)?,
        None => BTreeMap::from([(id, listen.clone())]),
    };
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .with_context(|| format!("listening on {listen}"))?;
    let config = journal::NodeConfig {
        id,
        peers,
        data_dir: a.data_dir,
        shards: a.shards,
        idle_tick: a.idle_tick,
        join: a.join,
        segment_bytes: a.segment_bytes,
    };
    tracing::info!(id, %listen, shards = config.shards, data_dir = %config.data_dir.display(), "starting journal node");
    let node = journal::JournalNode::open(config).await?;
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
