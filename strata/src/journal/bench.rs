//! `strata journal bench` and `strata journal fsync-probe`: the journal's own figures, append
//! throughput and latency at several concurrencies, and this disk's sequential write+fdatasync
//! limit.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;

/// Largest number of concurrent appenders one run may start.
const MAX_CLIENTS: usize = 4096;

/// Flags of `strata journal bench`.
#[derive(clap::Args)]
pub struct BenchArgs {
    /// Journal endpoints, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    endpoints: Vec<String>,
    /// Shard to append to.
    #[arg(long, default_value_t = 0)]
    shard: u32,
    /// Concurrency levels to measure, comma-separated; one closed-loop appender each.
    #[arg(long, value_delimiter = ',', default_value = "1,16,256")]
    clients: Vec<usize>,
    /// Measured time per concurrency level (after a warm-up of a tenth of it).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Payload bytes per entry.
    #[arg(long, default_value_t = 256)]
    entry_bytes: usize,
    /// Entries (payloads) per Append call, as the frontend batches them (up to 512); with
    /// more than one, each row is followed by the figures per entry.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Connections (HTTP/2) per journal node the appenders share (appender i uses connection
    /// i % conns). One is the fastest here: 32 measured 0.5-0.75x of one at 256 appenders
    /// (docs/benchmarks/journal.md).
    #[arg(long, default_value_t = 1)]
    conns: usize,
    /// What each client does in a closed loop: `append` (one payload per call) or
    /// `read-index` (ReadIndex calls, to measure their cost on the leader).
    #[arg(long, value_enum, default_value_t = Op::Append)]
    op: Op,
    /// How appends travel: `stream` (the client's default: one shared `AppendStream` per node)
    /// or `unary` (one `Append` call each).
    #[arg(long, value_enum, default_value_t = AppendRpc::Stream)]
    append_rpc: AppendRpc,
    /// Process ids of the journal nodes (comma-separated): the report adds their CPU time per
    /// operation, summed, next to this client's own (from /proc/<pid>/stat).
    #[arg(long, value_delimiter = ',')]
    node_pids: Vec<u32>,
    /// To nodes that serve internal TLS (`--internal-*`).
    #[command(flatten)]
    tls: journal::tls::TlsArgs,
    /// Journal endpoints (comma-separated) to tail while appending: for each, the report adds
    /// when the appended records arrived on a `Read` stream served by that node, relative to
    /// the append's acknowledgement (negative: before it), as p50/p99 in ms.
    #[arg(long, value_delimiter = ',')]
    read_lag_from: Vec<String>,
}

/// When each record arrived on one reader's stream (index, instant), for `--read-lag-from`.
type Arrivals = Vec<(u64, Instant)>;

/// Tails `shard` on the one node `endpoint` from `from` until `stop`, noting each record's
/// arrival.
async fn tail_arrivals(
    endpoint: String,
    shard: u32,
    from: u64,
    stop: Arc<AtomicBool>,
    tls: Option<Arc<journal::tls::InternalTls>>,
) -> anyhow::Result<Arrivals> {
    use futures::StreamExt;
    let client = journal::JournalClient::connect_over(std::slice::from_ref(&endpoint), tls).await?;
    let mut stream = Box::pin(client.read(shard, from).await?);
    let mut out = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        match tokio::time::timeout(READ_LAG_POLL, stream.next()).await {
            Ok(Some(r)) => out.push((r?.index, Instant::now())),
            Ok(None) => break,
            Err(_) => {}
        }
    }
    Ok(out)
}

/// How often a `--read-lag-from` reader checks whether the level ended while nothing arrives.
const READ_LAG_POLL: Duration = Duration::from_millis(100);

/// p50 and p99 (ms) of `arrival - acknowledgement` over the acknowledged records `acks`.
fn read_lag(acks: &std::collections::HashMap<u64, Instant>, arrivals: &Arrivals) -> String {
    let mut lag: Vec<f64> = arrivals
        .iter()
        .filter_map(|(i, at)| {
            let ack = acks.get(i)?;
            Some(if at >= ack {
                at.duration_since(*ack).as_secs_f64() * 1e3
            } else {
                -(ack.duration_since(*at).as_secs_f64() * 1e3)
            })
        })
        .collect();
    if lag.is_empty() {
        return "no records".into();
    }
    lag.sort_unstable_by(f64::total_cmp);
    let at =
        |p: f64| lag[(((p / 100.0) * lag.len() as f64).ceil() as usize).clamp(1, lag.len()) - 1];
    format!(
        "p50 {:.3} ms, p99 {:.3} ms ({} records)",
        at(50.0),
        at(99.0),
        lag.len()
    )
}

/// How `strata journal bench` sends appends.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AppendRpc {
    Stream,
    Unary,
}

/// Clock ticks per second of /proc/<pid>/stat times (USER_HZ, 100 on Linux).
const CLOCK_TICKS_PER_S: f64 = 100.0;

/// CPU time (user + system) a process used so far, from /proc/<pid>/stat; `None` if unreadable.
fn cpu_time(pid: &str) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command (which may hold spaces) start after the last ')'.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the command.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_secs_f64(ticks as f64 / CLOCK_TICKS_PER_S))
}

/// CPU time of this process and the sum of `pids`'.
fn cpu_times(pids: &[u32]) -> (Duration, Duration) {
    let own = cpu_time("self").unwrap_or_default();
    let nodes = pids.iter().filter_map(|p| cpu_time(&p.to_string())).sum();
    (own, nodes)
}

/// The operation `strata journal bench` measures.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Op {
    Append,
    ReadIndex,
}

/// Flags of `strata journal fsync-probe`.
#[derive(clap::Args)]
pub struct ProbeArgs {
    /// Directory on the disk to probe (a temporary file is written there and removed).
    #[arg(long, default_value = ".")]
    dir: PathBuf,
    /// How long to probe.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Bytes per write.
    #[arg(long, default_value_t = 4096)]
    block_bytes: usize,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

pub async fn bench(a: BenchArgs) -> anyhow::Result<()> {
    let rpc = a.append_rpc;
    let tls = a.tls.load()?;
    let connect = |e: Vec<String>| {
        let tls = tls.clone();
        async move {
            match rpc {
                AppendRpc::Stream => journal::JournalClient::connect_over(&e, tls).await,
                AppendRpc::Unary => journal::JournalClient::connect_unary_appends(&e, tls).await,
            }
        }
    };
    let client = connect(a.endpoints.clone()).await?;
    // Wait for a leader (a fresh cluster may still be electing).
    client
        .append(a.shard, vec![vec![0u8; a.entry_bytes]])
        .await
        .context("first append")?;
    let (what, per_s) = match a.op {
        Op::Append => {
            println!(
                "journal append, {} B entries, shard {}",
                a.entry_bytes, a.shard
            );
            ("appends", "appends/s")
        }
        Op::ReadIndex => {
            println!("journal read index, shard {}", a.shard);
            ("reads", "reads/s")
        }
    };
    println!(
        "{:>8} {:>10} {:>12} {:>9} {:>9} {:>9} {:>11} {:>11}",
        "clients", what, per_s, "p50 ms", "p99 ms", "max ms", "client us", "nodes us"
    );
    anyhow::ensure!(a.conns >= 1, "--conns must be at least 1");
    anyhow::ensure!(
        (1..=journal::node::MAX_APPEND_ENTRIES).contains(&a.batch),
        "--batch must be in 1..={}",
        journal::node::MAX_APPEND_ENTRIES
    );
    let mut clients = vec![client];
    for _ in 1..a.conns.min(MAX_CLIENTS) {
        clients.push(connect(a.endpoints.clone()).await?);
    }
    for &n in &a.clients {
        anyhow::ensure!(
            (1..=MAX_CLIENTS).contains(&n),
            "--clients must be in 1..={MAX_CLIENTS}"
        );
        let conns = n.min(clients.len());
        let warm = a.duration / 10;
        let stop = Arc::new(AtomicBool::new(false));
        let mut readers = Vec::new();
        if !a.read_lag_from.is_empty() {
            let from = clients[0].status(a.shard).await?.last_index + 1;
            for ep in &a.read_lag_from {
                readers.push((
                    ep.clone(),
                    tokio::spawn(tail_arrivals(
                        ep.clone(),
                        a.shard,
                        from,
                        Arc::clone(&stop),
                        tls.clone(),
                    )),
                ));
            }
        }
        let start = Instant::now() + warm;
        let mut tasks = Vec::new();
        for t in 0..n {
            let (client, stop) = (clients[t % conns].clone(), Arc::clone(&stop));
            let mut payload = vec![0u8; a.entry_bytes];
            let tag = (t as u64).to_le_bytes();
            let k = tag.len().min(payload.len());
            payload[..k].copy_from_slice(&tag[..k]);
            let (shard, op, batch) = (a.shard, a.op, a.batch);
            let track_acks = !a.read_lag_from.is_empty();
            tasks.push(tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut acked = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let t0 = Instant::now();
                    match op {
                        Op::Append => {
                            let idx = client.append(shard, vec![payload.clone(); batch]).await?;
                            if track_acks && t0 >= start {
                                let now = Instant::now();
                                acked.extend(idx.into_iter().map(|i| (i, now)));
                            }
                        }
                        Op::ReadIndex => {
                            client.read_index(shard).await?;
                        }
                    }
                    if t0 >= start {
                        lat.push(t0.elapsed());
                    }
                }
                Ok::<_, journal::ClientError>((lat, acked))
            }));
        }
        tokio::time::sleep(warm).await;
        let cpu0 = cpu_times(&a.node_pids);
        tokio::time::sleep(a.duration).await;
        let cpu1 = cpu_times(&a.node_pids);
        stop.store(true, Ordering::Relaxed);
        let elapsed = start.elapsed();
        let mut all = Vec::new();
        let mut acks = std::collections::HashMap::new();
        for t in tasks {
            let (lat, acked) = t.await??;
            all.extend(lat);
            acks.extend(acked);
        }
        all.sort_unstable();
        // CPU per operation over the measured window (operations started in it).
        let per_op = |d: Duration| d.as_secs_f64() * 1e6 / all.len().max(1) as f64;
        let nodes_us = if a.node_pids.is_empty() {
            "-".to_string()
        } else {
            format!("{:.1}", per_op(cpu1.1.saturating_sub(cpu0.1)))
        };
        println!(
            "{:>8} {:>10} {:>12.0} {:>9.2} {:>9.2} {:>9.2} {:>11.1} {:>11}",
            n,
            all.len(),
            all.len() as f64 / elapsed.as_secs_f64(),
            ms(percentile(&all, 50.0)),
            ms(percentile(&all, 99.0)),
            ms(all.last().copied().unwrap_or_default()),
            per_op(cpu1.0.saturating_sub(cpu0.0)),
            nodes_us,
        );
        if a.batch > 1 {
            let records = (all.len() * a.batch) as f64;
            let per_record =
                |d: Duration| format!("{:.2}", d.as_secs_f64() * 1e6 / records.max(1.0));
            println!(
                "{:>8} {} entries per append: {:.0} entries/s, client {} us and nodes {} us per entry",
                "",
                a.batch,
                records / elapsed.as_secs_f64(),
                per_record(cpu1.0.saturating_sub(cpu0.0)),
                if a.node_pids.is_empty() {
                    "-".to_string()
                } else {
                    per_record(cpu1.1.saturating_sub(cpu0.1))
                },
            );
        }
        for (ep, r) in readers {
            let arrivals = r.await??;
            println!(
                "{:>8} read lag from {ep}: {}",
                "",
                read_lag(&acks, &arrivals)
            );
        }
    }
    Ok(())
}

pub async fn fsync_probe(a: ProbeArgs) -> anyhow::Result<()> {
    let path = a
        .dir
        .join(format!(".strata-fsync-probe-{}", std::process::id()));
    let res = tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<Duration>> {
        let mut f = std::fs::File::create(&path).with_context(|| path.display().to_string())?;
        let block = vec![0x5au8; a.block_bytes];
        let mut lat = Vec::new();
        let end = Instant::now() + a.duration;
        let run = (|| -> std::io::Result<()> {
            while Instant::now() < end {
                let t0 = Instant::now();
                f.write_all(&block)?;
                f.sync_data()?;
                lat.push(t0.elapsed());
            }
            Ok(())
        })();
        let _ = std::fs::remove_file(&path);
        run?;
        Ok(lat)
    })
    .await??;
    let mut lat = res;
    lat.sort_unstable();
    let total: Duration = lat.iter().sum();
    println!(
        "sequential {} B write + fdatasync in {}: {} ops, {:.0} ops/s, p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
        a.block_bytes,
        a.dir.display(),
        lat.len(),
        lat.len() as f64 / total.as_secs_f64().max(f64::MIN_POSITIVE),
        ms(percentile(&lat, 50.0)),
        ms(percentile(&lat, 99.0)),
        ms(lat.last().copied().unwrap_or_default()),
    );
    Ok(())
}
