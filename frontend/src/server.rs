//! Wiring: binds the client and metrics ports, starts the tenant (replica, writer, read index),
//! and serves every etcd service, `grpc.health.v1` and the HTTP side port until shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use api::etcdserverpb::auth_server::AuthServer;
use api::etcdserverpb::cluster_server::ClusterServer;
use api::etcdserverpb::kv_server::KvServer;
use api::etcdserverpb::lease_server::LeaseServer;
use api::etcdserverpb::maintenance_server::MaintenanceServer;
use api::etcdserverpb::watch_server::WatchServer;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic_health::ServingStatus;

use crate::auth::AuthService;
use crate::cluster::{ClusterService, Members};
use crate::config::{Config, ConfigError, stable_id};
use crate::journal_log::JournalLog;
use crate::kv::KvService;
use crate::lease::LeaseService;
use crate::log::{Log, LogError};
use crate::maintenance::MaintenanceService;
use crate::tenant::{Identity, Limits, Tenant};
use crate::tenants::Tenants;
use crate::watch::{WatchConfig, WatchService};

/// etcd's allowance for gRPC framing above `--max-request-bytes` (grpcOverheadBytes).
pub const GRPC_OVERHEAD_BYTES: usize = 512 * 1024;
/// etcd allows math.MaxUint32 concurrent streams per connection (many watches, keep-alives).
pub const MAX_CONCURRENT_STREAMS: u32 = u32::MAX;
/// How long `stop` lets in-flight requests and open streams (watches, keep-alives) finish
/// before cutting them off.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// gRPC service names reported by grpc.health.v1 besides "" (the whole server).
const HEALTH_SERVICES: &[&str] = &[
    "etcdserverpb.KV",
    "etcdserverpb.Watch",
    "etcdserverpb.Lease",
    "etcdserverpb.Cluster",
    "etcdserverpb.Maintenance",
];

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot bind {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot reach the journal: {0}")]
    Journal(#[from] LogError),
    #[error("gRPC server failed: {0}")]
    Grpc(#[from] tonic::transport::Error),
    #[error("HTTP server failed: {0}")]
    Http(std::io::Error),
    #[error("cannot load the tenant's checkpoint: {0}")]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    #[error("the replica stopped: {0}")]
    ReplicaFailed(String),
    #[error(transparent)]
    TokenKey(#[from] crate::token::KeyError),
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    #[error(transparent)]
    InternalTls(#[from] journal::tls::TlsError),
}

/// A running frontend.
pub struct Frontend {
    /// Where etcd clients connect.
    pub client_addr: SocketAddr,
    /// Where /health, /readyz and /metrics are served.
    pub metrics_addr: SocketAddr,
    /// Where the admin API is served (`--admin-listen`).
    pub admin_addr: Option<SocketAddr>,
    admin: Option<JoinHandle<Result<(), tonic::transport::Error>>>,
    pub tenants: Arc<Tenants>,
    shutdown: Option<oneshot::Sender<()>>,
    grpc: JoinHandle<Result<(), tonic::transport::Error>>,
    http: JoinHandle<std::io::Result<()>>,
    /// `--shutdown-delay`, and what it turns off while it runs.
    shutdown_delay: Duration,
    draining: Arc<std::sync::atomic::AtomicBool>,
    health: tonic_health::server::HealthReporter,
}

impl Frontend {
    /// Connects to the journal named by `config` and starts serving.
    pub async fn start(config: Config) -> Result<Self, ServeError> {
        config.validate()?;
        // The recorder first: the internal TLS gauges are set as it starts.
        crate::metrics::handle();
        let internal_tls = config.internal_tls.start()?;
        let log = JournalLog::connect_with(&config.journal, config.tail_from_leader, internal_tls)
            .await?;
        Self::start_with_log(config, Arc::new(log)).await
    }

    /// Starts serving over any `Log` (tests use the in-memory one). `config.journal` is not
    /// used here.
    pub async fn start_with_log(config: Config, log: Arc<dyn Log>) -> Result<Self, ServeError> {
        crate::metrics::handle();
        let tls = match (&config.cert_file, &config.key_file) {
            (Some(cert), Some(key)) => Some(Arc::new(
                crate::tls::TlsSetup::load_with_crl(
                    cert,
                    key,
                    config.trusted_ca_file.as_deref(),
                    config.client_crl_file.as_deref(),
                    config.client_cert_auth,
                    config.tenant_domain.as_deref(),
                )?
                .with_max_connections(
                    (config.tenant_max_connections > 0).then_some(config.tenant_max_connections),
                ),
            )),
            _ => None,
        };
        if let Some(tls) = &tls {
            crate::tls::watch(tls, config.tls_reload_interval);
        }
        let served: Vec<String> = config.served_tenants().map(str::to_string).collect();
        let client = bind(config.listen).await?;
        let metrics = bind(config.metrics_listen).await?;
        let client_addr = client.local_addr().map_err(|source| ServeError::Bind {
            addr: config.listen,
            source,
        })?;
        let metrics_addr = metrics.local_addr().map_err(|source| ServeError::Bind {
            addr: config.metrics_listen,
            source,
        })?;

        let urls = config.client_urls(client_addr);
        let first_url = urls.first().cloned().unwrap_or_default();
        let member_id = config.member_id.unwrap_or_else(|| stable_id(&first_url));
        let name = config.name.clone().unwrap_or_else(|| first_url.clone());
        let limits = Limits {
            max_request_bytes: config.max_request_bytes,
            max_txn_ops: config.max_txn_ops,
            no_leader_after: config.no_leader_after,
            request_rate: config.tenant_request_rate,
            request_burst: config.tenant_request_burst,
            max_watchers: (config.tenant_max_watchers > 0).then_some(config.tenant_max_watchers),
        };
        let checkpoints = config
            .object_store
            .as_deref()
            .map(crate::checkpoint::open)
            .transpose()?;
        let tokens = (!config.auth_token_key_file.is_empty())
            .then(|| {
                crate::token::Tokens::from_files(&config.auth_token_key_file, config.auth_token_ttl)
            })
            .transpose()?
            .map(Arc::new);
        // Every tenant's newest checkpoint is fetched and decoded at once, so a frontend of many
        // tenants starts in about the time of its largest.
        let stores = futures::future::try_join_all(
            config
                .served_tenants()
                .map(|name| initial_store(name, config.shard, checkpoints.as_ref())),
        )
        .await?;
        // Several tenants read the shard through one journal read (shared_tail.rs).
        let tails: Arc<dyn Log> = if served.len() > 1 || config.catalogue {
            Arc::new(crate::shared_tail::SharedTail::new(log.clone()))
        } else {
            log.clone()
        };
        let mut started = config.served_tenants().zip(stores).map(|(name, store)| {
            Tenant::start(
                name,
                name,
                config.shard,
                store,
                checkpoints.clone(),
                tails.clone(),
                limits,
                Identity::of(name, member_id),
            )
        });
        let default = match config.default_tenant() {
            Some(_) => started.next(),
            None => None,
        };
        let more = started.collect();
        let mut tenants =
            Tenants::serving(default, more, config.trust_tenant_header).with_tokens(tokens);
        // The catalogue's own replica, and what keeps the tenants served in step with it.
        let (reconciled_tx, reconciled) = tokio::sync::watch::channel(-1i64);
        if config.catalogue {
            let system = api::tenant::SYSTEM_TENANT;
            let shard = api::tenant::SYSTEM_SHARD;
            tenants = tenants.with_catalogue(
                Tenant::start(
                    system,
                    system,
                    shard,
                    initial_store(system, shard, checkpoints.as_ref()).await?,
                    checkpoints.clone(),
                    tails.clone(),
                    limits,
                    Identity::of(system, member_id),
                ),
                reconciled.clone(),
            );
        }
        let tenants = Arc::new(tenants);
        if config.catalogue {
            tokio::spawn(crate::catalogue::follow(
                Arc::downgrade(&tenants),
                crate::catalogue::Loader {
                    shards: config.catalogue_shards(),
                    checkpoints: checkpoints.clone(),
                    log: tails.clone(),
                    limits,
                    member_id,
                    idle_unload: (!config.tenant_idle_unload.is_zero())
                        .then_some(config.tenant_idle_unload),
                    memory_budget: (config.memory_budget > 0).then_some(config.memory_budget),
                },
                reconciled_tx,
            ));
        }

        let (reporter, health) = tonic_health::server::health_reporter();
        reporter
            .set_service_status("", ServingStatus::NotServing)
            .await;
        let draining = Arc::new(std::sync::atomic::AtomicBool::new(false));
        tokio::spawn(report_health(
            reporter.clone(),
            Arc::downgrade(&tenants),
            draining.clone(),
        ));
        tokio::spawn(report_misconfiguration(Arc::downgrade(&tenants)));

        let max_decode = config.max_request_bytes + GRPC_OVERHEAD_BYTES;
        let members = Members::new(member_id, &name, &urls, &config.peer_frontends);
        let side_port = crate::http::router(crate::http::HttpState {
            tenants: tenants.clone(),
            log: log.clone(),
            etcd_version: config.etcd_version.clone(),
            draining: draining.clone(),
        });
        // One instance of each service, shared by the gRPC routes and etcd's JSON gateway.
        let kv = Arc::new(KvService::new(tenants.clone()));
        let watch = Arc::new(WatchService::with_config(
            tenants.clone(),
            WatchConfig {
                progress_notify_interval: config.watch_progress_notify_interval,
                ..WatchConfig::default()
            },
        ));
        let lease = Arc::new(LeaseService::new(tenants.clone()));
        let concurrency = crate::concurrency::Handle(Arc::new(
            crate::concurrency::ConcurrencyService::new(kv.clone(), watch.clone(), lease.clone()),
        ));
        let gateway = Arc::new(crate::gateway::Gateway {
            kv,
            watch,
            lease,
            concurrency,
            maintenance: Arc::new(
                MaintenanceService::new(tenants.clone(), log.clone(), config.etcd_version.clone())
                    .with_members(&members),
            ),
            cluster: Arc::new(ClusterService::new(tenants.clone(), members)),
            auth: Arc::new(AuthService::with_bcrypt_cost(
                tenants.clone(),
                config.bcrypt_cost,
            )),
            max_body: 2 * max_decode,
        });
        let grpc = tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .initial_connection_window_size(api::HTTP2_CONNECTION_WINDOW)
            .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
            // HTTP/1.1 too, as an etcd member's client port: `/health`, `/version` and
            // `/metrics` answer there (fast_kv.rs hands them to the side port's router), and
            // etcd's JSON gateway (`/v3/...`, gateway.rs).
            .accept_http1(true)
            // Outermost: what the connection says about its tenant, and nothing a client sent
            // under the same names (tls.rs).
            .layer(crate::tls::ConnectionLayer)
            // Range, Put, DeleteRange and Txn skip tonic's router and codec (fast_kv.rs).
            .layer(crate::fast_kv::FastKvLayer::new(
                tenants.clone(),
                max_decode,
                side_port.clone(),
                gateway.clone(),
            ))
            .add_service(health)
            .add_service(
                KvServer::from_arc(gateway.kv.clone()).max_decoding_message_size(max_decode),
            )
            .add_service(
                WatchServer::from_arc(gateway.watch.clone()).max_decoding_message_size(max_decode),
            )
            .add_service(
                LeaseServer::from_arc(gateway.lease.clone()).max_decoding_message_size(max_decode),
            )
            .add_service(MaintenanceServer::from_arc(gateway.maintenance.clone()))
            .add_service(ClusterServer::from_arc(gateway.cluster.clone()))
            .add_service(AuthServer::from_arc(gateway.auth.clone()))
            .add_service(
                api::v3lockpb::lock_server::LockServer::new(gateway.concurrency.clone())
                    .max_decoding_message_size(max_decode),
            )
            .add_service(
                api::v3electionpb::election_server::ElectionServer::new(
                    gateway.concurrency.clone(),
                )
                .max_decoding_message_size(max_decode),
            );

        let (shutdown, stop) = oneshot::channel::<()>();
        let stop = futures::FutureExt::shared(async move {
            let _ = stop.await;
        });
        let grpc = tokio::spawn(
            // `Server::tcp_nodelay` is ignored by `serve_with_incoming`: `tls::incoming` sets it
            // on each connection, or every answer waits for Nagle's timer, and runs the TLS
            // handshakes. Each connection is wrapped so that a scheme-prefixed `:authority`
            // (etcdctl 3.4 with `http://` endpoints) reaches h2 as `host:port` (authority.rs).
            grpc.serve_with_incoming_shutdown(
                tokio_stream::StreamExt::map(
                    crate::tls::incoming(client, tls.clone(), Arc::new(Arc::downgrade(&tenants))),
                    // Innermost, `Coalesced` lets many small answers share one write.
                    |conn| {
                        conn.map(|s| {
                            crate::authority::AuthorityNormaliser::new(crate::coalesce::Coalesced(
                                s,
                            ))
                        })
                    },
                ),
                stop.clone(),
            ),
        );
        let service = crate::admin::AdminService::new(tenants.clone(), config.shards, log.clone());
        let (admin_addr, admin) = match (config.admin_listen, service) {
            (Some(addr), Some(service)) => {
                let (addr, task) = serve_admin(
                    &config,
                    addr,
                    service.with_retention(config.deleted_tenant_retention),
                    stop.clone(),
                )
                .await?;
                (Some(addr), Some(task))
            }
            _ => (None, None),
        };
        let router = side_port;
        let http = tokio::spawn(async move {
            axum::serve(metrics, router)
                .with_graceful_shutdown(stop)
                .await
        });
        tracing::info!(
            tenant = %config.tenant,
            more_tenants = config.tenants.len(),
            tls = tls.is_some(),
            shard = config.shard,
            catalogue_shards = %config.catalogue_shards(),
            %client_addr,
            %metrics_addr,
            member_id = format!("{member_id:x}"),
            "frontend serving"
        );
        Ok(Self {
            client_addr,
            metrics_addr,
            admin_addr,
            admin,
            tenants,
            shutdown: Some(shutdown),
            grpc,
            http,
            shutdown_delay: config.shutdown_delay,
            draining,
            health: reporter,
        })
    }

    /// Serves until `signal` completes, a server fails or a tenant's replica stops (then the
    /// process should exit, so that its supervisor restarts it from the newest checkpoints).
    pub async fn run_until(mut self, signal: impl Future<Output = ()>) -> Result<(), ServeError> {
        let failed = replica_failed(&self.tenants);
        tokio::select! {
            () = signal => {}
            reason = failed => {
                let _ = self.stop().await;
                return Err(ServeError::ReplicaFailed(reason));
            }
            r = &mut self.grpc => return flatten_grpc(r),
            r = &mut self.http => return flatten_http(r),
        }
        self.drain().await;
        self.stop().await
    }

    /// `--shutdown-delay`: readiness and gRPC health turn to "not serving" while every request
    /// is still served, so load balancers move new connections elsewhere before `stop`.
    async fn drain(&self) {
        if self.shutdown_delay.is_zero() {
            return;
        }
        self.draining
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.health
            .set_service_status("", ServingStatus::NotServing)
            .await;
        for s in HEALTH_SERVICES {
            self.health
                .set_service_status(*s, ServingStatus::NotServing)
                .await;
        }
        tracing::info!(delay = ?self.shutdown_delay, "shutting down: not ready, still serving");
        tokio::time::sleep(self.shutdown_delay).await;
    }

    /// Stops accepting, lets in-flight requests finish for up to `SHUTDOWN_GRACE` (open watch
    /// and keep-alive streams never finish by themselves), then cuts off the rest.
    pub async fn stop(mut self) -> Result<(), ServeError> {
        if let Some(s) = self.shutdown.take() {
            let _ = s.send(());
        }
        let grpc = match tokio::time::timeout(SHUTDOWN_GRACE, &mut self.grpc).await {
            Ok(r) => flatten_grpc(r),
            Err(_) => {
                tracing::info!("open streams outlived the shutdown grace; closing them");
                self.grpc.abort();
                Ok(())
            }
        };
        if let Some(mut admin) = self.admin.take()
            && tokio::time::timeout(SHUTDOWN_GRACE, &mut admin)
                .await
                .is_err()
        {
            admin.abort();
        }
        let http = match tokio::time::timeout(SHUTDOWN_GRACE, &mut self.http).await {
            Ok(r) => flatten_http(r),
            Err(_) => {
                self.http.abort();
                Ok(())
            }
        };
        grpc.and(http)
    }
}

/// Binds the admin port and serves the admin API there until `stop`: mutual TLS with the
/// `--admin-*` files when given (every client must present a certificate of
/// `--admin-trusted-ca-file`), plain on a loopback address otherwise (`Config::validate`).
async fn serve_admin(
    config: &Config,
    addr: SocketAddr,
    service: crate::admin::AdminService,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<(SocketAddr, JoinHandle<Result<(), tonic::transport::Error>>), ServeError> {
    let tls = match (
        &config.admin_cert_file,
        &config.admin_key_file,
        &config.admin_trusted_ca_file,
    ) {
        (Some(cert), Some(key), Some(ca)) => Some(Arc::new(
            crate::tls::TlsSetup::load_with_crl(
                cert,
                key,
                Some(ca.as_path()),
                config.admin_crl_file.as_deref(),
                true,
                None,
            )?
            .for_port("admin"),
        )),
        _ => None,
    };
    if let Some(tls) = &tls {
        crate::tls::watch(tls, config.tls_reload_interval);
    }
    let listener = bind(addr).await?;
    let bound = listener
        .local_addr()
        .map_err(|source| ServeError::Bind { addr, source })?;
    let incoming = crate::tls::incoming(listener, tls.clone(), Arc::new(Vec::<String>::new()));
    let server = tonic::transport::Server::builder()
        .add_service(api::strata::admin::admin_server::AdminServer::new(service));
    tracing::info!(admin_addr = %bound, tls = tls.is_some(), "admin API serving");
    Ok((
        bound,
        tokio::spawn(server.serve_with_incoming_shutdown(incoming, stop)),
    ))
}

fn flatten_grpc(
    r: Result<Result<(), tonic::transport::Error>, tokio::task::JoinError>,
) -> Result<(), ServeError> {
    match r {
        Ok(r) => r.map_err(ServeError::Grpc),
        Err(e) => Err(ServeError::Http(std::io::Error::other(e))),
    }
}

fn flatten_http(r: Result<std::io::Result<()>, tokio::task::JoinError>) -> Result<(), ServeError> {
    match r {
        Ok(r) => r.map_err(ServeError::Http),
        Err(e) => Err(ServeError::Http(std::io::Error::other(e))),
    }
}

/// Resolves with "tenant X: why" once a replica stopped for good (a tenant's, or the
/// catalogue's); never otherwise. Follows the replicas as the catalogue adds them. Holds the
/// tenants weakly, so it can be spawned.
fn replica_failed(tenants: &Arc<Tenants>) -> impl Future<Output = String> + Send + 'static {
    let tenants = Arc::downgrade(tenants);
    async move {
        loop {
            let Some(states) = tenants.upgrade().map(|t| {
                if let Some(why) = t.failed() {
                    return Err(why);
                }
                Ok(t.replicas()
                    .iter()
                    .map(|t| t.replica.subscribe_state())
                    .collect::<Vec<_>>())
            }) else {
                return futures::future::pending().await;
            };
            let mut states = match states {
                Ok(s) => s,
                Err(why) => return why,
            };
            // A state change, or a tenant loaded since (looked for once a second).
            let pause = tokio::time::sleep(Duration::from_secs(1));
            if states.is_empty() {
                pause.await;
                continue;
            }
            let changed = futures::future::select_all(
                states
                    .iter_mut()
                    .map(|rx| Box::pin(async move { rx.changed().await.is_ok() })),
            );
            tokio::pin!(pause);
            tokio::select! {
                // A replica gone (its tenant dropped) wakes nothing up any more: wait anyway.
                (open, _, _) = changed => if !open { pause.await },
                () = &mut pause => {}
            }
        }
    }
}

/// The store a tenant's replica starts from: its newest checkpoint when `--object-store` is
/// given and holds one, else an empty store (tail from the journal's start).
pub(crate) async fn initial_store(
    tenant: &str,
    shard: u32,
    objects: Option<&crate::checkpoint::Store>,
) -> Result<memstore::MemStore, ServeError> {
    let fresh = || memstore::MemStore::new(memstore::Config::default());
    let Some(objects) = objects else {
        return Ok(fresh());
    };
    match crate::checkpoint::latest(objects, tenant, shard).await? {
        Some(loaded) => {
            tracing::info!(
                tenant = %tenant,
                index = loaded.reference.index,
                revision = loaded.reference.revision,
                path = %loaded.reference.path,
                "starting from checkpoint"
            );
            Ok(loaded.store)
        }
        None => {
            tracing::info!(tenant = %tenant, "no checkpoint yet; replaying the journal from its start");
            Ok(fresh())
        }
    }
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })
}

/// How often the frontend looks for a configuration it cannot serve with
/// (`Tenants::misconfigured`).
const MISCONFIGURATION_CHECK: Duration = Duration::from_secs(5);

/// Logs an error when the frontend finds it cannot serve a tenant (auth enabled elsewhere,
/// no token key here), and again when that ends; `/readyz` and gRPC health say "not serving"
/// meanwhile. Ends with the frontend's tenants.
async fn report_misconfiguration(tenants: std::sync::Weak<Tenants>) {
    let mut reported: Option<String> = None;
    while let Some(tenants) = tenants.upgrade() {
        let now = tenants.misconfigured();
        if now != reported {
            match &now {
                Some(why) => tracing::error!("not ready: {why}"),
                None => tracing::info!("ready again: the configuration problem is gone"),
            }
            reported = now;
        }
        drop(tenants);
        tokio::time::sleep(MISCONFIGURATION_CHECK).await;
    }
}

/// grpc.health.v1 follows `Tenants::readiness`, as `/readyz` does: NOT_SERVING until every
/// replica caught up, SERVING while all serve and the configuration lets them, NOT_SERVING
/// again if one stopped, the configuration keeps one from serving, or the frontend drains.
/// Ends with the frontend's tenants.
async fn report_health(
    reporter: tonic_health::server::HealthReporter,
    tenants: std::sync::Weak<Tenants>,
    draining: Arc<std::sync::atomic::AtomicBool>,
) {
    let Some(mut states) = tenants.upgrade().map(|t| {
        t.replicas()
            .iter()
            .map(|t| t.replica.subscribe_state())
            .collect::<Vec<_>>()
    }) else {
        return;
    };
    if states.is_empty() {
        return;
    }
    loop {
        for rx in &mut states {
            rx.borrow_and_update();
        }
        let Some(ready) = tenants.upgrade().map(|t| t.readiness().is_ok()) else {
            return;
        };
        let status = match ready {
            _ if draining.load(std::sync::atomic::Ordering::Relaxed) => ServingStatus::NotServing,
            true => ServingStatus::Serving,
            false => ServingStatus::NotServing,
        };
        reporter.set_service_status("", status).await;
        for s in HEALTH_SERVICES {
            reporter.set_service_status(*s, status).await;
        }
        // A drain that began while this wrote "serving" may have been overwritten: say so again.
        if status == ServingStatus::Serving && draining.load(std::sync::atomic::Ordering::Relaxed) {
            reporter
                .set_service_status("", ServingStatus::NotServing)
                .await;
            for s in HEALTH_SERVICES {
                reporter
                    .set_service_status(*s, ServingStatus::NotServing)
                    .await;
            }
        }
        // A replica's state changes by itself; the configuration's fitness (auth enabled
        // through another frontend) is looked at again every MISCONFIGURATION_CHECK.
        let changed =
            futures::future::select_all(states.iter_mut().map(|rx| Box::pin(rx.changed())));
        tokio::select! {
            (r, _, _) = changed => if r.is_err() { return },
            () = tokio::time::sleep(MISCONFIGURATION_CHECK) => {}
        }
    }
}
