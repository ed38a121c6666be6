//! `strata bench`: a load generator for any etcd v3 endpoint (Strata or etcd itself), modelled
//! on etcd's `benchmark` tool: put, range, txn-put, txn-cas, watch, watch-latency, and lock and
//! election cycles, each printing total time, requests/s, a latency histogram and
//! percentiles, and errors.

mod concurrency;
mod conn;
mod driver;
mod grpc;
mod idle;
mod keys;
mod kv;
mod report;
mod watch;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use api::etcdserverpb::RangeRequest;

use conn::Pool;
use driver::MAX_CLIENTS;

/// What can go wrong in a benchmark run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The flags make no sense; nothing was sent.
    #[error("invalid arguments: {0}")]
    InvalidArgs(String),
    /// An endpoint could not be reached.
    #[error("cannot connect to {url}: {source}")]
    Connect {
        url: String,
        #[source]
        source: tonic::transport::Error,
    },
    /// An endpoint could not be reached (raw HTTP/2 connections of the KV workloads).
    #[error("cannot connect to {url}: {reason}")]
    Dial { url: String, reason: String },
    /// A set-up request failed.
    #[error("request failed: {}: {}", .0.code(), .0.message())]
    Rpc(tonic::Status),
    /// The workload could not be set up (e.g. watchers not created).
    #[error("set-up failed: {0}")]
    Setup(String),
}

/// Flags shared by every workload (they may be given before or after the workload's name).
#[derive(clap::Args, Debug, Clone)]
pub struct Common {
    /// gRPC endpoints, `host:port` or `http://host:port`, comma-separated; connections are
    /// spread over them round-robin.
    #[arg(
        long,
        global = true,
        value_delimiter = ',',
        default_value = "127.0.0.1:2379"
    )]
    pub endpoints: Vec<String>,
    /// Number of gRPC (HTTP/2) connections.
    #[arg(long, global = true, default_value_t = 1)]
    pub conns: usize,
    /// Number of concurrent clients, i.e. requests in flight (client i uses connection i % conns).
    #[arg(long, global = true, default_value_t = 1)]
    pub clients: usize,
    /// Tenant to name in the `x-strata-tenant` header (Strata only; etcd ignores it).
    #[arg(long, global = true)]
    pub tenant: Option<String>,
    /// `name:password` to authenticate as (etcdctl's `--user`): every request then carries
    /// the token, on Strata and etcd alike, so runs with auth enabled compare.
    #[arg(long, global = true)]
    pub user: Option<String>,
    /// Deadline of each unary request, kept by the client (no `grpc-timeout` header is sent, as
    /// etcd's benchmark tool sends none: a server-side timer per request would be measured too).
    #[arg(long, global = true, default_value = "30s", value_parser = humantime::parse_duration)]
    pub request_timeout: Duration,
    /// Print one JSON object on stdout instead of the text report.
    #[arg(long, global = true)]
    pub json: bool,
    /// Seed of the key and value generators (random keys replay with the same seed).
    #[arg(long, global = true, default_value_t = 1)]
    pub seed: u64,
    /// Connect over TLS, trusting the CA certificates in this file (PEM; etcdctl's
    /// `--cacert`): bare `host:port` endpoints are then `https://`.
    #[arg(long, global = true)]
    pub cacert: Option<std::path::PathBuf>,
    /// The client certificate to present (PEM; etcdctl's `--cert`), with `--key`.
    #[arg(long, global = true, requires = "cacert", requires = "tls_key")]
    pub cert: Option<std::path::PathBuf>,
    /// The client certificate's private key (PEM; etcdctl's `--key`). (Its id is not `key`:
    /// the range workload has a `key` argument.)
    #[arg(long = "key", id = "tls_key", global = true, requires = "cert")]
    pub key: Option<std::path::PathBuf>,
}

impl Common {
    /// The run's TLS, if `--cacert` is given.
    fn tls(&self) -> Result<Option<conn::ClientTls>, BenchError> {
        self.cacert
            .as_deref()
            .map(|ca| conn::ClientTls::from_files(ca, self.cert.as_deref(), self.key.as_deref()))
            .transpose()
    }
}

/// Flags of `strata bench`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub common: Common,
    #[command(subcommand)]
    pub workload: Workload,
}

#[derive(clap::Subcommand, Debug)]
pub enum Workload {
    /// Put keys (one key per request).
    Put(PutArgs),
    /// Range over a key or a key range, linearizable or serializable.
    Range(RangeArgs),
    /// Txns of several puts each.
    TxnPut(TxnPutArgs),
    /// Compare-and-swap txns on mod_revision, as kube-apiserver's OptimisticPut (puts on
    /// success, reads the key on failure; a failed compare is a conflict, not an error).
    TxnCas(TxnCasArgs),
    /// Watch fan-out: N watchers on M streams, writers put K events; checks that every watcher
    /// gets every event exactly once, in order, and measures delivery latency.
    Watch(WatchArgs),
    /// Watch latency as etcd measures it: each put waits until every watcher has its event.
    WatchLatency(WatchLatencyArgs),
    /// Lock then Unlock (etcd's server-side lock service, as `etcdctl lock`), each client
    /// under a lease of its own; one operation is the whole cycle.
    Lock(CycleArgs),
    /// Campaign then Resign (etcd's election service, as `etcdctl elect`), each client under a
    /// lease of its own; one operation is the whole cycle.
    Election(CycleArgs),
}

/// Key and value shape of the write workloads.
#[derive(clap::Args, Debug, Clone)]
pub struct KeyArgs {
    /// Key size in bytes (a zero-padded key index after --key-prefix).
    #[arg(long, default_value_t = 8)]
    pub key_size: usize,
    /// Value size in bytes.
    #[arg(long, default_value_t = 8)]
    pub val_size: usize,
    /// Number of distinct keys written.
    #[arg(long, default_value_t = 1)]
    pub key_space_size: u64,
    /// Write keys in order (operation i writes key i % key-space-size) instead of at random.
    #[arg(long)]
    pub sequential_keys: bool,
    /// Prefix of every key (counted in --key-size).
    #[arg(long, default_value = "")]
    pub key_prefix: String,
}

#[derive(clap::Args, Debug)]
pub struct PutArgs {
    /// Total number of put requests.
    #[arg(long, default_value_t = 10_000)]
    pub total: u64,
    #[command(flatten)]
    pub keys: KeyArgs,
    /// Watchers of keys the puts never write, held open during the run (what idle watchers
    /// cost the server per put).
    #[arg(long, default_value_t = 0)]
    pub idle_watchers: usize,
    /// What each idle watcher watches: its own key, prefix or (non-prefix) range.
    #[arg(long, value_enum, default_value = "prefix")]
    pub idle_watch_kind: idle::IdleKind,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Consistency {
    /// Linearizable.
    L,
    /// Serializable.
    S,
}

#[derive(clap::Args, Debug)]
pub struct RangeArgs {
    /// Key to read.
    pub key: String,
    /// End of the range (exclusive); without it a single key is read.
    pub end: Option<String>,
    /// l (linearizable) or s (serializable).
    #[arg(long, value_enum, default_value = "l")]
    pub consistency: Consistency,
    /// Total number of range requests.
    #[arg(long, default_value_t = 10_000)]
    pub total: u64,
    /// Read every key with KEY as prefix (conflicts with END).
    #[arg(long, conflicts_with = "end")]
    pub prefix: bool,
    /// Maximum number of keys returned (0 = no limit).
    #[arg(long, default_value_t = 0)]
    pub limit: i64,
}

#[derive(clap::Args, Debug)]
pub struct TxnPutArgs {
    /// Total number of txn requests.
    #[arg(long, default_value_t = 10_000)]
    pub total: u64,
    /// Puts per txn (distinct keys; at most --key-space-size).
    #[arg(long, default_value_t = 1)]
    pub txn_ops: usize,
    #[command(flatten)]
    pub keys: KeyArgs,
}

#[derive(clap::Args, Debug)]
pub struct TxnCasArgs {
    /// Total number of txn requests (conflicts included).
    #[arg(long, default_value_t = 10_000)]
    pub total: u64,
    #[command(flatten)]
    pub keys: KeyArgs,
}

#[derive(clap::Args, Debug)]
pub struct WatchArgs {
    /// Number of watchers, all watching the run's key prefix.
    #[arg(long, default_value_t = 100)]
    pub watchers: usize,
    /// Number of Watch streams carrying them (spread over the connections).
    #[arg(long, default_value_t = 10)]
    pub streams: usize,
    /// Number of puts (events each watcher must receive).
    #[arg(long, default_value_t = 100)]
    pub put_total: u64,
    /// Number of concurrent writers.
    #[arg(long, default_value_t = 1)]
    pub put_clients: usize,
    /// Puts per second over all writers (0 = as fast as they are acknowledged).
    #[arg(long, default_value_t = 0)]
    pub put_rate: u64,
    /// Number of distinct keys written under the run's prefix.
    #[arg(long, default_value_t = 1)]
    pub watched_keys: u64,
    /// Size of each key after the run's prefix.
    #[arg(long, default_value_t = 8)]
    pub key_size: usize,
    /// Value size in bytes.
    #[arg(long, default_value_t = 8)]
    pub val_size: usize,
    /// How long to wait for outstanding events once the writers are done.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub drain_timeout: Duration,
}

#[derive(clap::Args, Debug)]
pub struct CycleArgs {
    /// Total number of cycles (Lock and Unlock, or Campaign and Resign).
    #[arg(long, default_value_t = 1_000)]
    pub total: u64,
    /// Number of lock (or election) names the clients share: client c takes name c % names.
    /// As many as --clients: no contention; 1: every client queues for one.
    #[arg(long, default_value_t = 1)]
    pub names: usize,
}

#[derive(clap::Args, Debug)]
pub struct WatchLatencyArgs {
    /// Number of puts.
    #[arg(long, default_value_t = 1_000)]
    pub total: u64,
    /// Puts per second (0 = next put as soon as every watcher has the previous event).
    #[arg(long, default_value_t = 100)]
    pub put_rate: u64,
    /// Number of watchers of the key.
    #[arg(long, default_value_t = 10)]
    pub watchers: usize,
    /// Number of Watch streams carrying them (default: one per watcher, as etcd's tool).
    #[arg(long)]
    pub streams: Option<usize>,
    /// Size of the key after the run's prefix.
    #[arg(long, default_value_t = 8)]
    pub key_size: usize,
    /// Value size in bytes.
    #[arg(long, default_value_t = 8)]
    pub val_size: usize,
    /// How long each put's event may take to reach every watcher.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub drain_timeout: Duration,
}

impl Common {
    fn validate(&self) -> Result<(), BenchError> {
        if self.clients == 0 || self.clients > MAX_CLIENTS {
            return Err(BenchError::InvalidArgs(format!(
                "--clients must be in 1..={MAX_CLIENTS}"
            )));
        }
        if self.endpoints.is_empty() || self.endpoints.iter().any(String::is_empty) {
            return Err(BenchError::InvalidArgs(
                "--endpoints needs at least one host:port".into(),
            ));
        }
        Ok(())
    }
}

fn check_total(total: u64) -> Result<(), BenchError> {
    if total == 0 {
        return Err(BenchError::InvalidArgs("--total must be at least 1".into()));
    }
    Ok(())
}

impl KeyArgs {
    fn validate(&self) -> Result<(), BenchError> {
        if self.val_size > keys::MAX_VAL_SIZE {
            return Err(BenchError::InvalidArgs(format!(
                "--val-size exceeds {}",
                keys::MAX_VAL_SIZE
            )));
        }
        keys::validate(
            self.key_prefix.as_bytes(),
            self.key_size,
            self.key_space_size,
        )
    }

    fn keygen(&self, seed: u64) -> Result<keys::KeyGen, BenchError> {
        keys::KeyGen::new(
            self.key_prefix.as_bytes(),
            self.key_size,
            self.key_space_size,
            self.sequential_keys,
            seed,
        )
    }
}

/// A run-unique key prefix for the watch workloads.
fn run_prefix() -> Vec<u8> {
    format!("bench-watch/{:016x}/", rand::random::<u64>()).into_bytes()
}

impl Workload {
    fn name(&self) -> &'static str {
        match self {
            Workload::Put(_) => "put",
            Workload::Range(_) => "range",
            Workload::TxnPut(_) => "txn-put",
            Workload::TxnCas(_) => "txn-cas",
            Workload::Watch(_) => "watch",
            Workload::WatchLatency(_) => "watch-latency",
            Workload::Lock(_) => "lock",
            Workload::Election(_) => "election",
        }
    }

    /// Checks the flags without touching the network.
    fn validate(&self, common: &Common) -> Result<(), BenchError> {
        common.validate()?;
        match self {
            Workload::Put(a) => {
                check_total(a.total)?;
                a.keys.validate()
            }
            Workload::Range(a) => {
                check_total(a.total)?;
                if a.key.is_empty() {
                    return Err(BenchError::InvalidArgs("the range key is empty".into()));
                }
                if a.limit < 0 {
                    return Err(BenchError::InvalidArgs("--limit must be >= 0".into()));
                }
                Ok(())
            }
            Workload::TxnPut(a) => {
                check_total(a.total)?;
                a.keys.validate()?;
                if a.txn_ops == 0 || a.txn_ops as u64 > a.keys.key_space_size {
                    return Err(BenchError::InvalidArgs(format!(
                        "--txn-ops must be in 1..=key-space-size ({}): a txn may not put a key twice",
                        a.keys.key_space_size
                    )));
                }
                Ok(())
            }
            Workload::TxnCas(a) => {
                check_total(a.total)?;
                a.keys.validate()
            }
            Workload::Watch(a) => watch_plan(a, common.seed).validate(),
            Workload::WatchLatency(a) => watch_latency_plan(a, common.seed).validate(),
            Workload::Lock(a) | Workload::Election(a) => {
                check_total(a.total)?;
                if a.names == 0 {
                    return Err(BenchError::InvalidArgs("--names must be at least 1".into()));
                }
                Ok(())
            }
        }
    }
}

fn watch_plan(a: &WatchArgs, seed: u64) -> watch::WatchPlan {
    watch::WatchPlan {
        watchers: a.watchers,
        streams: a.streams,
        puts: a.put_total,
        put_clients: a.put_clients,
        put_rate: a.put_rate,
        keys: a.watched_keys,
        key_size: a.key_size,
        val_size: a.val_size,
        lockstep: false,
        watch_prefix: true,
        prefix: run_prefix(),
        drain_timeout: a.drain_timeout,
        seed,
    }
}

fn watch_latency_plan(a: &WatchLatencyArgs, seed: u64) -> watch::WatchPlan {
    watch::WatchPlan {
        watchers: a.watchers,
        streams: a.streams.unwrap_or(a.watchers),
        puts: a.total,
        put_clients: 1,
        put_rate: a.put_rate,
        keys: 1,
        key_size: a.key_size,
        val_size: a.val_size,
        lockstep: true,
        watch_prefix: false,
        prefix: run_prefix(),
        drain_timeout: a.drain_timeout,
        seed,
    }
}

/// Seed of client `client`'s generators: distinct per client, replayable per run seed.
fn client_seed(seed: u64, client: usize) -> u64 {
    seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ client as u64
}

/// The metadata every request of the run carries: the tenant header, and with `--user` the
/// token Authenticate answered (asked once, of the first endpoint: a token is valid on every
/// endpoint of a Strata deployment, and etcd's on every member).
async fn request_headers(
    common: &Common,
    tls: Option<&conn::ClientTls>,
) -> anyhow::Result<Vec<(&'static str, String)>> {
    let mut headers = Vec::new();
    if let Some(t) = &common.tenant {
        headers.push((conn::TENANT_HEADER, t.clone()));
    }
    if let Some(user) = &common.user {
        let (name, password) = user
            .split_once(':')
            .ok_or_else(|| anyhow::anyhow!("--user must be name:password"))?;
        let first = common
            .endpoints
            .first()
            .map(String::as_str)
            .unwrap_or_default();
        let auth_pool = Pool::connect(
            std::slice::from_ref(&first.to_string()),
            1,
            &[],
            common.request_timeout,
            tls,
        )
        .await
        .map_err(|e| anyhow::anyhow!("connect to {first} to authenticate: {e}"))?;
        let mut auth = auth_pool.auth(0);
        let mut req = tonic::Request::new(api::etcdserverpb::AuthenticateRequest {
            name: name.to_string(),
            password: password.to_string(),
        });
        if let Some(t) = &common.tenant {
            let t = t
                .parse()
                .map_err(|_| anyhow::anyhow!("--tenant {t:?} is not ASCII"))?;
            req.metadata_mut().insert(conn::TENANT_HEADER, t);
        }
        let token = auth
            .authenticate(req)
            .await
            .map_err(|e| anyhow::anyhow!("authenticate as {name}: {}", e.message()))?
            .into_inner()
            .token;
        headers.push(("token", token));
    }
    Ok(headers)
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let Args { common, workload } = args;
    workload.validate(&common)?;
    tracing::info!(
        workload = workload.name(),
        endpoints = ?common.endpoints,
        conns = common.conns,
        clients = common.clients,
        "benchmark starting"
    );
    let tls = common.tls()?;
    let headers = request_headers(&common, tls.as_ref()).await?;
    if !matches!(workload, Workload::Watch(_) | Workload::WatchLatency(_)) {
        let pool = grpc::UnaryPool::connect(
            &common.endpoints,
            common.conns,
            &headers,
            common.request_timeout,
            tls.as_ref(),
        )
        .await?;
        let idle = match &workload {
            Workload::Put(a) if a.idle_watchers > 0 => {
                let watch_pool = Pool::connect(
                    &common.endpoints,
                    common.conns,
                    &headers,
                    common.request_timeout,
                    tls.as_ref(),
                )
                .await?;
                let idle =
                    idle::IdleWatchers::open(&watch_pool, a.idle_watchers, a.idle_watch_kind)
                        .await?;
                tracing::info!(
                    watchers = a.idle_watchers,
                    kind = ?a.idle_watch_kind,
                    "idle watchers open"
                );
                Some(idle)
            }
            _ => None,
        };
        let result = run_closed_loop(&pool, &common, &workload).await;
        if let Some(mut idle) = idle {
            idle.close()
                .await
                .map_err(|e| anyhow::anyhow!("an idle watcher failed during the run: {e}"))?;
        }
        return result;
    }
    let pool = Pool::connect(
        &common.endpoints,
        common.conns,
        &headers,
        common.request_timeout,
        tls.as_ref(),
    )
    .await?;
    match &workload {
        Workload::Watch(a) => {
            run_watch(&pool, &common, workload.name(), watch_plan(a, common.seed)).await
        }
        Workload::WatchLatency(a) => {
            run_watch(
                &pool,
                &common,
                workload.name(),
                watch_latency_plan(a, common.seed),
            )
            .await
        }
        _ => unreachable!("closed-loop workloads returned above"),
    }
}

async fn run_closed_loop(
    pool: &grpc::UnaryPool,
    common: &Common,
    workload: &Workload,
) -> anyhow::Result<()> {
    let n = common.clients;
    let mut run = match workload {
        Workload::Put(a) => {
            let value = Arc::new(keys::value(a.keys.val_size, common.seed));
            let mut clients = Vec::with_capacity(n);
            for c in 0..n {
                clients.push(kv::PutClient {
                    rpc: pool.client(c),
                    keys: a.keys.keygen(client_seed(common.seed, c))?,
                    value: Arc::clone(&value),
                });
            }
            driver::run(clients, a.total).await
        }
        Workload::Range(a) => {
            let key = a.key.as_bytes().to_vec();
            let range_end = if a.prefix {
                api::prefix_range_end(&key)
            } else {
                a.end.clone().map(String::into_bytes).unwrap_or_default()
            };
            let request = RangeRequest {
                key,
                range_end,
                limit: a.limit,
                serializable: a.consistency == Consistency::S,
                ..Default::default()
            };
            let clients = (0..n)
                .map(|c| kv::RangeClient::new(pool.client(c), &request))
                .collect();
            driver::run(clients, a.total).await
        }
        Workload::TxnPut(a) => {
            let value = Arc::new(keys::value(a.keys.val_size, common.seed));
            let mut clients = Vec::with_capacity(n);
            for c in 0..n {
                clients.push(kv::TxnPutClient {
                    rpc: pool.client(c),
                    keys: a.keys.keygen(client_seed(common.seed, c))?,
                    key_space: a.keys.key_space_size,
                    txn_ops: a.txn_ops,
                    value: Arc::clone(&value),
                });
            }
            driver::run(clients, a.total).await
        }
        Workload::TxnCas(a) => {
            let value = Arc::new(keys::value(a.keys.val_size, common.seed));
            let seen = kv::SeenRevisions::default();
            let mut clients = Vec::with_capacity(n);
            for c in 0..n {
                clients.push(kv::TxnCasClient {
                    rpc: pool.client(c),
                    keys: a.keys.keygen(client_seed(common.seed, c))?,
                    value: Arc::clone(&value),
                    seen: Arc::clone(&seen),
                });
            }
            driver::run(clients, a.total).await
        }
        Workload::Lock(a) | Workload::Election(a) => {
            let kind = match workload {
                Workload::Lock(_) => concurrency::Kind::Lock,
                _ => concurrency::Kind::Election,
            };
            let prefix = format!("bench-{}/{:016x}/", kind.name(), rand::random::<u64>());
            let mut clients = Vec::with_capacity(n);
            let mut leases = Vec::with_capacity(n);
            for c in 0..n {
                let mut rpc = pool.client(c);
                let lease = match concurrency::grant(&mut rpc).await {
                    Ok(lease) => lease,
                    Err(e) => {
                        // The leases granted so far go with the run.
                        let _ = concurrency::revoke(&mut rpc, &leases).await;
                        anyhow::bail!("lease for client {c}: {}", e.message());
                    }
                };
                leases.push(lease);
                clients.push(concurrency::CycleClient {
                    rpc,
                    kind,
                    name: concurrency::name_of(&prefix, c, a.names),
                    lease,
                });
            }
            let run = driver::run(clients, a.total).await;
            if let Err(e) = concurrency::revoke(&mut pool.client(0), &leases).await {
                tracing::warn!(error = %e.message(), "cannot revoke the run's leases; they expire in {} s", concurrency::LEASE_TTL);
            }
            run
        }
        Workload::Watch(_) | Workload::WatchLatency(_) => {
            unreachable!("watch workloads run in run_watch")
        }
    };
    let summary = run.samples.summary(run.elapsed);
    if common.json {
        let mut j = summary.to_json();
        j["workload"] = workload.name().into();
        j["endpoints"] = common.endpoints.clone().into();
        j["conns"] = pool.conns().into();
        j["clients"] = common.clients.into();
        j["error_messages"] = errors_json(run.samples.errors());
        if matches!(workload, Workload::TxnCas(_)) {
            j["conflicts"] = run.conflicts.into();
        }
        println!("{j}");
    } else {
        print!(
            "{}",
            summary.render_text(workload.name(), run.samples.errors())
        );
        if matches!(workload, Workload::TxnCas(_)) {
            println!(
                "  Conflicts:\t{} of {} answered txns ({:.2}%)",
                run.conflicts,
                summary.ok,
                percent(run.conflicts, summary.ok)
            );
        }
    }
    if summary.ok == 0 {
        anyhow::bail!(
            "no request succeeded ({} errors)",
            run.samples.error_count()
        );
    }
    Ok(())
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

fn errors_json(errors: &BTreeMap<String, u64>) -> serde_json::Value {
    errors
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::Value::from(*v)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

async fn run_watch(
    pool: &Pool,
    common: &Common,
    name: &str,
    plan: watch::WatchPlan,
) -> anyhow::Result<()> {
    let mut r = watch::run(pool, &plan).await?;
    let create = r.create.summary(r.create_elapsed);
    let puts = r.puts.summary(r.put_elapsed);
    let from_ack = r.from_ack.summary(r.delivery_elapsed);
    let from_send = r.from_send.summary(r.delivery_elapsed);
    let by_endpoint: Vec<_> = r
        .by_endpoint
        .iter_mut()
        .map(|(a, s)| (a.summary(r.delivery_elapsed), s.summary(r.delivery_elapsed)))
        .collect();
    let v = &r.verdict;
    if common.json {
        let j = serde_json::json!({
            "workload": name,
            "endpoints": common.endpoints,
            "conns": pool.conns(),
            "watchers": plan.watchers,
            "streams": plan.streams,
            "puts": plan.puts,
            "create": create.to_json(),
            "put": merge_errors(puts.to_json(), r.puts.errors()),
            "delivery_from_ack": from_ack.to_json(),
            "delivery_from_send": from_send.to_json(),
            "delivery_by_endpoint": by_endpoint
                .iter()
                .enumerate()
                .map(|(i, (a, s))| serde_json::json!({
                    "endpoint": common.endpoints.get(i),
                    "from_ack": a.to_json(),
                    "from_send": s.to_json(),
                }))
                .collect::<Vec<_>>(),
            "verify": v.to_json(),
        });
        println!("{j}");
    } else {
        let empty = BTreeMap::new();
        print!(
            "{}",
            create.render_text(
                "Watch creation (per watcher, from its stream's start)",
                &empty
            )
        );
        print!(
            "{}",
            puts.render_text("Puts (writer latency)", r.puts.errors())
        );
        print!(
            "{}",
            from_ack.render_text(
                "Event delivery latency, from the put's acknowledgement (Requests/sec = events/s)",
                &empty
            )
        );
        print!(
            "{}",
            from_send.render_text("Event delivery latency, from the put's send", &empty)
        );
        if by_endpoint.len() > 1 {
            println!("\nDelivery by endpoint (p50 / p99 / max ms, from the ack; from the send):");
            for (i, (a, s)) in by_endpoint.iter().enumerate() {
                let (a, s) = (a.to_json(), s.to_json());
                let ms =
                    |x: &serde_json::Value, p: &str| x["latency_ms"][p].as_f64().unwrap_or(0.0);
                println!(
                    "  {}:\t{:.2} / {:.2} / {:.2}; {:.2} / {:.2} / {:.2}",
                    common.endpoints.get(i).map_or("?", String::as_str),
                    ms(&a, "p50"),
                    ms(&a, "p99"),
                    ms(&a, "max"),
                    ms(&s, "p50"),
                    ms(&s, "p99"),
                    ms(&s, "max"),
                );
            }
        }
        println!("\nVerification:");
        println!("  Watchers created:\t{} of {}", v.created, v.watchers);
        println!(
            "  Events expected:\t{} ({} acknowledged puts x {} watchers)",
            v.expected, v.acked_puts, v.watchers
        );
        println!("  Events delivered:\t{}", v.delivered);
        println!("  Missing:\t{}", v.missing);
        println!("  Duplicates:\t{}", v.duplicates);
        println!("  Out of order:\t{}", v.out_of_order);
        println!("  Cancelled:\t{}", v.cancelled);
        println!("  Unacknowledged puts' events:\t{}", v.unacked);
        println!("  Delivered before the put's ack:\t{}", v.before_ack);
        for e in &v.stream_errors {
            println!("  Stream error:\t{e}");
        }
        println!(
            "  Result:\t{}",
            if v.ok() {
                "every event delivered exactly once, in order"
            } else {
                "FAILED"
            }
        );
    }
    if !v.ok() {
        anyhow::bail!(
            "watch verification failed: {} missing, {} duplicates, {} out of order, {} of {} watchers created, {} cancelled, stream errors {:?}",
            v.missing,
            v.duplicates,
            v.out_of_order,
            v.created,
            v.watchers,
            v.cancelled,
            v.stream_errors
        );
    }
    Ok(())
}

fn merge_errors(mut j: serde_json::Value, errors: &BTreeMap<String, u64>) -> serde_json::Value {
    j["error_messages"] = errors_json(errors);
    j
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn parse(argv: &[&str]) -> Result<Args, String> {
        let argv = std::iter::once("bench").chain(argv.iter().copied());
        Cli::try_parse_from(argv)
            .map(|c| c.args)
            .map_err(|e| e.to_string())
    }

    fn check(argv: &[&str]) -> Result<(), String> {
        let a = parse(argv)?;
        a.workload.validate(&a.common).map_err(|e| e.to_string())
    }

    #[test]
    fn etcd_style_flags_parse_anywhere() {
        let a = parse(&[
            "--endpoints",
            "127.0.0.1:1,127.0.0.1:2",
            "--conns",
            "4",
            "put",
            "--clients",
            "256",
            "--total",
            "100",
            "--key-size",
            "8",
            "--val-size",
            "256",
            "--key-space-size",
            "1000",
            "--sequential-keys",
        ])
        .unwrap();
        assert_eq!(a.common.endpoints, vec!["127.0.0.1:1", "127.0.0.1:2"]);
        assert_eq!(a.common.conns, 4);
        assert_eq!(a.common.clients, 256);
        let Workload::Put(p) = &a.workload else {
            panic!("not put: {a:?}")
        };
        assert_eq!(p.total, 100);
        assert!(p.keys.sequential_keys);
        assert_eq!(p.keys.key_space_size, 1000);
        assert!(a.workload.validate(&a.common).is_ok());

        let a = parse(&["range", "foo", "--consistency", "s", "--total", "5"]).unwrap();
        let Workload::Range(r) = &a.workload else {
            panic!("not range")
        };
        assert_eq!(r.consistency, Consistency::S);
        assert_eq!(r.key, "foo");
        assert!(r.end.is_none());
        assert_eq!(a.common.endpoints, vec!["127.0.0.1:2379"]);
        assert!(parse(&["range", "foo", "--consistency", "x"]).is_err());
        assert!(parse(&["range", "a", "b", "--prefix"]).is_err());
    }

    #[test]
    fn argument_validation() {
        assert!(check(&["put", "--clients", "0"]).is_err());
        assert!(check(&["put", "--total", "0"]).is_err());
        assert!(check(&["put", "--key-size", "2", "--key-space-size", "1000"]).is_err());
        assert!(check(&["put", "--val-size", "2000000"]).is_err());
        assert!(check(&["put", "--endpoints", ""]).is_err());
        assert!(check(&["range", ""]).is_err());
        assert!(check(&["range", "k", "--limit", "-1"]).is_err());
        assert!(check(&["txn-put", "--txn-ops", "4", "--key-space-size", "3"]).is_err());
        assert!(check(&["txn-put", "--txn-ops", "3", "--key-space-size", "3"]).is_ok());
        assert!(check(&["txn-cas", "--key-space-size", "100"]).is_ok());
        assert!(check(&["watch", "--watchers", "5", "--streams", "6"]).is_err());
        assert!(check(&["watch", "--watchers", "1000", "--streams", "10"]).is_ok());
        assert!(check(&["watch-latency", "--watchers", "3"]).is_ok());
        assert!(check(&["watch-latency", "--watchers", "0"]).is_err());
    }

    #[test]
    fn client_seeds_differ() {
        assert_ne!(client_seed(1, 0), client_seed(1, 1));
        assert_ne!(client_seed(1, 0), client_seed(2, 0));
        assert_eq!(client_seed(3, 4), client_seed(3, 4));
    }

    #[test]
    fn run_prefixes_are_unique() {
        assert_ne!(run_prefix(), run_prefix());
        assert!(run_prefix().starts_with(b"bench-watch/"));
        assert_eq!(percent(1, 4), 25.0);
        assert_eq!(percent(1, 0), 0.0);
    }
}
