//! `strata dev`: a whole local deployment in one command — three journal nodes, a frontend and
//! a compactor (objects in a local folder), as child processes of this binary on 127.0.0.1, with
//! their data under one directory; supervised, and stopped cleanly on Ctrl-C or SIGTERM.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};

/// Journal nodes in a dev deployment (the smallest cluster that survives one failure).
const JOURNAL_NODES: u64 = 3;
/// The auth token key's file in the data directory.
const TOKEN_KEY_FILE: &str = "auth-token.key";
/// File under the data dir that pins the journal nodes' addresses across restarts: the journal
/// cluster remembers its members' addresses, so a restart must reuse them.
const PORTS_FILE: &str = "dev-ports";
/// Sub-directory for the children's logs.
const LOG_DIR: &str = "logs";
/// Sub-directory used as the compactor's object store (`file://` URL).
const OBJECTS_DIR: &str = "objects";
/// Tries at picking a free port that no other child of this deployment will take.
const FREE_PORT_ATTEMPTS: usize = 64;
/// Pause between two readiness probes of the frontend.
const READY_POLL: Duration = Duration::from_millis(200);
/// Pause between two checks of the children's state.
const SUPERVISE_POLL: Duration = Duration::from_millis(500);
/// Bound on one readiness probe (HTTP GET /readyz).
const READY_PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest /readyz answer read.
const READY_MAX_RESPONSE: usize = 16 * 1024;
/// Journal segment size of a dev deployment: a trim frees disk only segment by segment, and
/// the production default (64 MiB) would keep a laptop's light load on disk for hours.
const DEV_SEGMENT_BYTES: u64 = 8 * 1024 * 1024;

/// Flags of `strata dev`.
#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    #[command(subcommand)]
    command: Option<DevCommand>,
    /// Directory for all data: journal segments, object storage, logs (created if missing;
    /// a second run reuses it, journal ports included).
    #[arg(long, default_value = ".strata-dev")]
    data_dir: PathBuf,
    /// Address the frontend serves etcd clients on.
    #[arg(long, default_value = "127.0.0.1:2379")]
    listen: SocketAddr,
    /// Address of the admin API (`strata admin tenant ...`): the frontend follows the tenant
    /// catalogue and serves every tenant created there, named by the `x-strata-tenant` header.
    #[arg(long, default_value = "127.0.0.1:2382")]
    admin_listen: SocketAddr,
    /// Address of the frontend's HTTP /health, /readyz and /metrics (default: a free port).
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// Journal shards (Raft groups) per node.
    #[arg(long, default_value_t = 4)]
    shards: u32,
    /// An extra flag for `strata frontend`, e.g. `--frontend-arg=--etcd-version=3.5.17`
    /// (repeatable).
    #[arg(long = "frontend-arg", allow_hyphen_values = true)]
    frontend_args: Vec<String>,
    /// Do not start a compactor (the journal then keeps every entry).
    #[arg(long)]
    no_compactor: bool,
    /// Auto-compaction mode of the compactor, as etcd's flag: `periodic` or `revision`.
    #[arg(long, default_value = "periodic")]
    auto_compaction_mode: String,
    /// Auto-compaction retention, as etcd's flag (`1h`, `30m`, hours, or revisions); `0`, the
    /// default as in etcd, is off: kube-apiserver compacts by itself every 5 minutes.
    #[arg(long, default_value = "0")]
    auto_compaction_retention: String,
    /// An extra flag for `strata compactor`, e.g. `--compactor-arg=--every=10s` (repeatable).
    #[arg(long = "compactor-arg", allow_hyphen_values = true)]
    compactor_args: Vec<String>,
    /// How long the frontend may take to become ready before `strata dev` gives up.
    #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
    ready_timeout: Duration,
    /// On shutdown, how long each child gets after SIGTERM before it is killed.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    stop_grace: Duration,
    /// Serve etcd clients over TLS, with a CA of this deployment (made once, kept in
    /// `<data-dir>/tls/`): a client certificate from `strata dev cert <tenant>` names a
    /// tenant of the catalogue, so etcdctl reaches it; no certificate, the default tenant.
    /// The journal nodes, the frontend and the compactor then also talk to each other over
    /// mutual TLS, with an internal CA of their own (`<data-dir>/tls/internal/`).
    #[arg(long)]
    tls: bool,
}

#[derive(clap::Subcommand, Debug)]
enum DevCommand {
    /// Issue a client certificate naming a tenant, signed by the CA of a `strata dev --tls`
    /// deployment (made now, with its server certificate, if it has not run yet): `etcdctl
    /// --cacert <data-dir>/tls/ca.pem --cert .. --key ..` reaches it.
    Cert(crate::dev_tls::CertArgs),
}

/// One supervised child process.
struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
    /// Set once the child exited (seen by supervision or shutdown).
    exited: Option<ExitStatus>,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    if let Some(DevCommand::Cert(cert)) = args.command {
        return crate::dev_tls::cert(cert);
    }
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("create data dir {}", args.data_dir.display()))?;
    let data_dir = args
        .data_dir
        .canonicalize()
        .with_context(|| format!("resolve data dir {}", args.data_dir.display()))?;
    let logs = data_dir.join(LOG_DIR);
    std::fs::create_dir_all(&logs).with_context(|| format!("create {}", logs.display()))?;
    let exe = std::env::current_exe().context("locate the strata binary")?;

    let journal_addrs = journal_addresses(&data_dir)?;
    let metrics = match args.metrics_listen {
        Some(a) => a,
        None => free_loopback_addr_except(
            &[&[args.listen, args.admin_listen], journal_addrs.as_slice()].concat(),
        )?,
    };
    let peers = journal_addrs
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{}={a}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    let journal_list = journal_addrs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",");

    // Signals are caught from the start, so a Ctrl-C during start-up still stops every child.
    let mut sigint = signal(SignalKind::interrupt()).context("install SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("install SIGTERM handler")?;

    let mut procs: Vec<Proc> = Vec::new();
    let started = start_all(
        &exe,
        &args,
        &data_dir,
        &logs,
        &journal_addrs,
        &peers,
        &journal_list,
        metrics,
        &mut procs,
    )
    .await;
    if let Err(e) = started {
        stop_all(&mut procs, args.stop_grace).await;
        return Err(e);
    }
    let compactor_started = procs.iter().any(|p| p.name == "compactor");

    println!("strata dev: data in {}", data_dir.display());
    for (i, a) in journal_addrs.iter().enumerate() {
        println!("  journal-{}   {a}", i + 1);
    }
    let scheme = if args.tls { "https" } else { "http" };
    println!("  frontend    {scheme}://{} (etcd v3 gRPC)", args.listen);
    println!("  metrics     http://{metrics}/metrics  (/health, /readyz)");
    println!(
        "  admin       http://{} (strata admin tenant ...)",
        args.admin_listen
    );
    if compactor_started {
        println!(
            "  compactor   objects in file://{}",
            data_dir.join(OBJECTS_DIR).display()
        );
    } else {
        println!("  compactor   not started (--no-compactor)");
    }
    println!("  logs        {}", logs.display());
    println!("waiting for the frontend to be ready...");

    // Readiness, while watching for children dying and for signals.
    let ready = wait_ready(metrics, args.ready_timeout);
    tokio::pin!(ready);
    loop {
        tokio::select! {
            r = &mut ready => {
                if let Err(e) = r {
                    eprintln!("strata dev: {e:#}; see the logs in {}", logs.display());
                    stop_all(&mut procs, args.stop_grace).await;
                    bail!("the frontend did not become ready");
                }
                break;
            }
            _ = sigint.recv() => return shutdown(&mut procs, args.stop_grace, "SIGINT").await,
            _ = sigterm.recv() => return shutdown(&mut procs, args.stop_grace, "SIGTERM").await,
            _ = tokio::time::sleep(READY_POLL) => {
                if let Some(dead) = reap_exited(&mut procs) {
                    let p = &procs[dead];
                    eprintln!(
                        "strata dev: {} exited during start-up ({}); see {}",
                        p.name,
                        describe(p.exited),
                        p.log.display()
                    );
                    stop_all(&mut procs, args.stop_grace).await;
                    bail!("{} exited during start-up", procs[dead].name);
                }
            }
        }
    }
    // Either endpoint form works with etcdctl (the frontend normalises the URL etcdctl 3.4
    // sends as the HTTP/2 authority; docs/frontend.md); host:port is the shorter.
    println!("ready. Try:");
    println!("  export ETCDCTL_API=3");
    if args.tls {
        let tls = data_dir.join(crate::dev_tls::TLS_DIR);
        let etcdctl = format!(
            "etcdctl --endpoints=https://{} --cacert={}",
            args.listen,
            tls.join("ca.pem").display()
        );
        let data = data_dir.display();
        println!("  {etcdctl} put greeting hello");
        println!("  {etcdctl} endpoint status -w table");
        println!("  strata admin tenant create team-a");
        println!("  strata dev cert team-a --data-dir {data}   # a client certificate naming it");
        println!(
            "  {etcdctl} --cert={0}/team-a.pem --key={0}/team-a.key put greeting hi   # team-a's keyspace",
            tls.display()
        );
    } else {
        println!("  etcdctl --endpoints={} put greeting hello", args.listen);
        println!("  etcdctl --endpoints={} get greeting", args.listen);
        println!(
            "  etcdctl --endpoints={} endpoint status -w table",
            args.listen
        );
        println!(
            "  curl -s -X POST http://{}/v3/kv/range -d '{{\"key\": \"Z3JlZXRpbmc=\"}}'   # etcd's JSON gateway",
            args.listen
        );
        println!(
            "  strata admin tenant create team-a   # another keyspace, named by the x-strata-tenant header (or by a client certificate with --tls)"
        );
    }
    println!("Ctrl-C stops everything.");

    // Supervision: any child that exits is reported; the others keep running.
    let mut tick = tokio::time::interval(SUPERVISE_POLL);
    loop {
        tokio::select! {
            _ = sigint.recv() => return shutdown(&mut procs, args.stop_grace, "SIGINT").await,
            _ = sigterm.recv() => return shutdown(&mut procs, args.stop_grace, "SIGTERM").await,
            _ = tick.tick() => {
                while let Some(i) = reap_exited(&mut procs) {
                    let p = &procs[i];
                    eprintln!(
                        "strata dev: {} exited ({}); see {}. The others keep running; Ctrl-C stops them.",
                        p.name,
                        describe(p.exited),
                        p.log.display()
                    );
                    tracing::warn!(child = %p.name, "child process exited");
                }
                if procs.iter().all(|p| p.exited.is_some()) {
                    bail!("every process of the deployment has exited");
                }
            }
        }
    }
}

/// The deployment's auth token key, made on the first start (32 random bytes, readable by
/// its owner only) and kept with the data, so tokens outlive a restart as they outlive a
/// frontend's in a real deployment.
fn token_key(data_dir: &Path) -> anyhow::Result<std::path::PathBuf> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = data_dir.join(TOKEN_KEY_FILE);
    if !path.exists() {
        let key: [u8; 32] = rand::random();
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("create {}", path.display()))?;
        f.write_all(&key)?;
        f.sync_all()?;
    }
    Ok(path)
}

/// Starts the journal nodes, the frontend and the compactor (if any), in that order.
#[allow(clippy::too_many_arguments)]
async fn start_all(
    exe: &Path,
    args: &Args,
    data_dir: &Path,
    logs: &Path,
    journal_addrs: &[SocketAddr],
    peers: &str,
    journal_list: &str,
    metrics: SocketAddr,
    procs: &mut Vec<Proc>,
) -> anyhow::Result<()> {
    let path = |p: &Path| p.display().to_string();
    // With --tls, every process dials the journal over mutual TLS: the journal nodes with a
    // certificate for their host, the frontend and the compactor with one for no host (so they
    // may not call the journal's Raft and admin services); only the compactor's names
    // strata-compactor, which the journal's Trim requires.
    let internal_flags = |files: crate::dev_tls::ServerFiles| -> Vec<String> {
        vec![
            "--internal-trusted-ca-file".into(),
            path(&files.ca),
            "--internal-cert-file".into(),
            path(&files.cert),
            "--internal-key-file".into(),
            path(&files.key),
        ]
    };
    let (internal_node, internal, internal_compactor): (Vec<String>, Vec<String>, Vec<String>) =
        if args.tls {
            (
                internal_flags(crate::dev_tls::ensure_internal(data_dir)?),
                internal_flags(crate::dev_tls::ensure_internal_client(data_dir)?),
                internal_flags(crate::dev_tls::ensure_internal_compactor(data_dir)?),
            )
        } else {
            (Vec::new(), Vec::new(), Vec::new())
        };
    for (i, addr) in journal_addrs.iter().enumerate() {
        let id = i + 1;
        let name = format!("journal-{id}");
        procs.push(spawn(
            exe,
            &name,
            &[
                "journal".into(),
                "--id".into(),
                id.to_string(),
                "--listen".into(),
                addr.to_string(),
                "--peers".into(),
                peers.to_string(),
                "--data-dir".into(),
                data_dir.join(&name).display().to_string(),
                "--shards".into(),
                args.shards.to_string(),
                "--segment-bytes".into(),
                DEV_SEGMENT_BYTES.to_string(),
            ]
            .into_iter()
            .chain(internal_node.iter().cloned())
            .collect::<Vec<_>>(),
            logs,
        )?);
    }
    let objects = data_dir.join(OBJECTS_DIR);
    std::fs::create_dir_all(&objects).with_context(|| format!("create {}", objects.display()))?;
    let objects_url = format!("file://{}", objects.display());
    // The frontend starts from the newest checkpoint: once the compactor has trimmed the
    // journal, a restarted deployment cannot replay from index 1.
    let mut frontend: Vec<String> = vec![
        "frontend".into(),
        "--journal".into(),
        journal_list.to_string(),
        "--listen".into(),
        args.listen.to_string(),
        "--metrics-listen".into(),
        metrics.to_string(),
        "--object-store".into(),
        objects_url.clone(),
        "--auth-token-key-file".into(),
        token_key(data_dir)?.display().to_string(),
        // The tenant catalogue: tenants created through the admin API are served here, named
        // by the header (a laptop has no proxy to trust, nor anyone else on loopback). Placed
        // over every shard, as in production, and all served by this one frontend.
        "--catalogue".into(),
        "--trust-tenant-header".into(),
        "--shards".into(),
        args.shards.to_string(),
        "--catalogue-shards".into(),
        "all".into(),
        "--admin-listen".into(),
        args.admin_listen.to_string(),
    ];
    if args.tls {
        // A client certificate for `<tenant>.tenants.localhost` names a tenant; none, or one
        // naming no tenant, is the default tenant's, as without TLS.
        let files = crate::dev_tls::ensure(data_dir)?;
        frontend.extend([
            "--cert-file".into(),
            path(&files.cert),
            "--key-file".into(),
            path(&files.key),
            "--trusted-ca-file".into(),
            path(&files.ca),
            "--tenant-domain".into(),
            crate::dev_tls::TENANT_DOMAIN.into(),
        ]);
    }
    frontend.extend(internal.iter().cloned());
    frontend.extend(args.frontend_args.iter().cloned());
    procs.push(spawn(exe, "frontend", &frontend, logs)?);
    if !args.no_compactor {
        let shards = (0..args.shards)
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let mut argv: Vec<String> = vec![
            "compactor".into(),
            "--journal".into(),
            journal_list.to_string(),
            "--object-store".into(),
            objects_url,
            "--shards".into(),
            shards,
            "--auto-compaction-mode".into(),
            args.auto_compaction_mode.clone(),
            "--auto-compaction-retention".into(),
            args.auto_compaction_retention.clone(),
        ];
        argv.extend(internal_compactor);
        argv.extend(args.compactor_args.iter().cloned());
        procs.push(spawn(exe, "compactor", &argv, logs)?);
    }
    Ok(())
}

/// Spawns `exe args..` with output appended to `<logs>/<name>.log`.
fn spawn(exe: &Path, name: &str, args: &[String], logs: &Path) -> anyhow::Result<Proc> {
    let log = logs.join(format!("{name}.log"));
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .with_context(|| format!("open {}", log.display()))?;
    let child = Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(f.try_clone().context("clone log handle")?)
        .stderr(f)
        // A backstop: if this process unwinds without stopping its children, they die with it.
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("start {name}"))?;
    tracing::info!(child = name, pid = child.id(), "started");
    Ok(Proc {
        name: name.to_string(),
        child,
        log,
        exited: None,
    })
}

/// The journal nodes' addresses: the ones pinned in the data dir by an earlier run, else fresh
/// free loopback ports, pinned for the next run.
fn journal_addresses(data_dir: &Path) -> anyhow::Result<Vec<SocketAddr>> {
    let path = data_dir.join(PORTS_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let addrs = text
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(|l| {
                    l.split_once('=')
                        .map(|(_, a)| a.trim())
                        .unwrap_or(l)
                        .parse::<SocketAddr>()
                        .with_context(|| format!("bad line {l:?} in {}", path.display()))
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            if addrs.len() as u64 != JOURNAL_NODES {
                bail!(
                    "{} names {} journal nodes, expected {JOURNAL_NODES}",
                    path.display(),
                    addrs.len()
                );
            }
            for a in &addrs {
                if TcpListener::bind(a).is_err() {
                    bail!(
                        "journal address {a} (pinned in {}) is in use: is another `strata dev` running on this data dir?",
                        path.display()
                    );
                }
            }
            Ok(addrs)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let addrs = (0..JOURNAL_NODES)
                .map(|_| free_loopback_addr())
                .collect::<anyhow::Result<Vec<_>>>()?;
            let text: String = addrs
                .iter()
                .enumerate()
                .map(|(i, a)| format!("journal-{}={a}\n", i + 1))
                .collect();
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, text).with_context(|| format!("write {}", tmp.display()))?;
            std::fs::rename(&tmp, &path).with_context(|| format!("write {}", path.display()))?;
            Ok(addrs)
        }
        Err(e) => Err(e).with_context(|| format!("read {}", path.display())),
    }
}

/// A loopback address whose port was free a moment ago, for a child to listen on.
///
/// Picked above the kernel's range of ports for outgoing connections
/// (`net.ipv4.ip_local_port_range`, 32768–60999 by default), when it leaves room: between the
/// pick and the child's bind, a port of that range can be given to any process's outgoing
/// connection (a CI run saw a journal node fail to start that way, next to a busy etcd). Each
/// pick moves on from the last one (the port is not held in between), from a place chosen by
/// the process id, so that two `strata dev`s starting together rarely try the same port.
fn free_loopback_addr() -> anyhow::Result<SocketAddr> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static CURSOR: AtomicU32 = AtomicU32::new(u32::MAX);
    let first = ephemeral_ports_end().saturating_add(1);
    let span = u32::from(u16::MAX - first) + 1;
    if span >= 64 {
        if CURSOR.load(Ordering::Relaxed) == u32::MAX {
            let _ = CURSOR.compare_exchange(
                u32::MAX,
                std::process::id().wrapping_mul(7919) % span,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
        for _ in 0..span.min(1024) {
            let offset = CURSOR.fetch_add(1, Ordering::Relaxed) % span;
            let Ok(offset) = u16::try_from(offset) else {
                continue;
            };
            if let Ok(l) = TcpListener::bind(("127.0.0.1", first + offset)) {
                return l.local_addr().context("local address");
            }
        }
    }
    let l = TcpListener::bind("127.0.0.1:0").context("bind 127.0.0.1:0")?;
    l.local_addr().context("local address")
}

/// The last port of the kernel's range for outgoing connections (60999 if it cannot be read).
fn ephemeral_ports_end() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| t.split_whitespace().nth(1).and_then(|p| p.parse().ok()))
        .unwrap_or(60_999)
}

/// A free loopback address that is none of `taken`: those may be free right now only because
/// their owner has not started yet (the client port a test picked, the journal ports).
fn free_loopback_addr_except(taken: &[SocketAddr]) -> anyhow::Result<SocketAddr> {
    for _ in 0..FREE_PORT_ATTEMPTS {
        let a = free_loopback_addr()?;
        if !taken.iter().any(|t| t.port() == a.port()) {
            return Ok(a);
        }
    }
    anyhow::bail!("no free loopback port after {FREE_PORT_ATTEMPTS} attempts")
}

/// Polls the frontend's `GET /readyz` until it answers 200.
async fn wait_ready(metrics: SocketAddr, timeout: Duration) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last = String::from("no answer yet");
    while tokio::time::Instant::now() < deadline {
        match tokio::time::timeout(READY_PROBE_TIMEOUT, http_status(metrics, "/readyz")).await {
            Ok(Ok(200)) => return Ok(()),
            Ok(Ok(code)) => last = format!("/readyz answered {code}"),
            Ok(Err(e)) => last = format!("{e:#}"),
            Err(_) => last = "/readyz timed out".into(),
        }
        tokio::time::sleep(READY_POLL).await;
    }
    bail!("frontend not ready after {timeout:?}: {last}")
}

/// The status code of `GET <path>` on `addr` (HTTP/1.1, connection closed after).
async fn http_status(addr: SocketAddr, path: &str) -> anyhow::Result<u16> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut buf = Vec::new();
    (&mut stream)
        .take(READY_MAX_RESPONSE as u64)
        .read_to_end(&mut buf)
        .await?;
    let head = String::from_utf8_lossy(&buf);
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok())
        .with_context(|| format!("not an HTTP answer: {:?}", head.lines().next()))?;
    Ok(code)
}

/// Index of a child that has exited, recording its status.
fn reap_exited(procs: &mut [Proc]) -> Option<usize> {
    for (i, p) in procs.iter_mut().enumerate() {
        if p.exited.is_none()
            && let Ok(Some(status)) = p.child.try_wait()
        {
            p.exited = Some(status);
            return Some(i);
        }
    }
    None
}

async fn shutdown(procs: &mut [Proc], grace: Duration, why: &str) -> anyhow::Result<()> {
    println!("strata dev: {why}, stopping...");
    stop_all(procs, grace).await;
    println!("strata dev: stopped");
    Ok(())
}

/// Stops the children: frontend and compactor first, then the journal nodes; each gets SIGTERM
/// and `grace` to exit, then SIGKILL.
async fn stop_all(procs: &mut [Proc], grace: Duration) {
    let (journals, others): (Vec<&mut Proc>, Vec<&mut Proc>) = procs
        .iter_mut()
        .partition(|p| p.name.starts_with("journal"));
    stop_group(others, grace).await;
    stop_group(journals, grace).await;
}

async fn stop_group(group: Vec<&mut Proc>, grace: Duration) {
    for p in &group {
        if p.exited.is_none()
            && let Some(pid) = p.child.id().and_then(|id| i32::try_from(id).ok())
        {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
    }
    // One grace period for the whole group: they were all signalled at once.
    let deadline = tokio::time::Instant::now() + grace;
    for p in group {
        if p.exited.is_some() {
            continue;
        }
        match tokio::time::timeout_at(deadline, p.child.wait()).await {
            Ok(Ok(status)) => {
                p.exited = Some(status);
                println!("  {} stopped ({})", p.name, describe(p.exited));
            }
            _ => {
                let _ = p.child.start_kill();
                p.exited = p.child.wait().await.ok();
                println!("  {} killed after {grace:?}", p.name);
            }
        }
    }
}

fn describe(status: Option<ExitStatus>) -> String {
    match status {
        Some(s) => s.to_string(),
        None => "status unknown".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_picked_above_the_kernels_outgoing_range_and_never_twice_in_a_row() {
        let end = ephemeral_ports_end();
        let picks: Vec<u16> = (0..5)
            .map(|_| free_loopback_addr().expect("a free port").port())
            .collect();
        if u32::from(end) + 64 <= u32::from(u16::MAX) {
            assert!(picks.iter().all(|p| *p > end), "{picks:?} not above {end}");
        }
        for w in picks.windows(2) {
            assert_ne!(w[0], w[1], "{picks:?}");
        }
        for p in &picks {
            TcpListener::bind(("127.0.0.1", *p)).expect("the picked port is free");
        }
    }
}
