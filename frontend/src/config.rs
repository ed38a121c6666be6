//! The frontend's one configuration struct: its doc comments are `strata frontend --help`.

use std::net::SocketAddr;
use std::time::Duration;

/// etcd's default `--max-request-bytes` (1.5 MiB).
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 1_572_864;
/// etcd's default `--max-txn-ops`.
pub const DEFAULT_MAX_TXN_OPS: usize = 128;
/// Default `--no-leader-after`: the journal's election (up to 2 s) plus this frontend noticing
/// a leader that vanished without a word and re-opening its tail (up to ~6 s) must fit, or a
/// journal failover would end every such stream just as it recovers.
pub const DEFAULT_NO_LEADER_AFTER: Duration = Duration::from_secs(10);
/// Shortest `--no-leader-after`: two of the journal's idle ticks (500 ms each).
pub const MIN_NO_LEADER_AFTER: Duration = Duration::from_secs(1);
/// The etcd version reported by `Maintenance.Status` unless configured.
pub const DEFAULT_ETCD_VERSION: &str = "3.5.17";
/// Room left in a journal entry for the envelope around a request (format version, tenant name
/// of at most 63 bytes, request id, tags and lengths): far more than it takes.
const ENVELOPE_BYTES: usize = 4096;
/// Largest `--max-request-bytes` accepted: a request of that size must still fit in one journal
/// entry with its envelope (the journal refuses larger entries), about 2 MiB. etcd accepts more;
/// a larger limit here would accept writes the journal always refuses.
pub const MAX_MAX_REQUEST_BYTES: usize = journal::node::MAX_ENTRY_BYTES - ENVELOPE_BYTES;

/// Serve the etcd v3 API for the tenants of one journal shard, each from its own replica
/// rebuilt from the journal.
#[derive(clap::Args, Debug, Clone)]
pub struct Config {
    /// Journal node addresses, comma separated (host:port or http://host:port).
    #[arg(long, value_delimiter = ',', required = true)]
    pub journal: Vec<String>,

    /// Address for etcd clients (gRPC: KV, Watch, Lease, Cluster, Maintenance, Auth, health).
    #[arg(long, default_value = "127.0.0.1:2379")]
    pub listen: SocketAddr,

    /// Address for HTTP /health, /readyz and Prometheus /metrics.
    #[arg(long, default_value = "127.0.0.1:2381")]
    pub metrics_listen: SocketAddr,

    /// The default tenant: the one a request that names no tenant is served from. Empty
    /// (`--tenant=`) for none, when `--tenants` lists every tenant served: a request must then
    /// name its tenant.
    #[arg(long, default_value = "default")]
    pub tenant: String,

    /// More tenants served on `--shard`, comma separated, each with its own keyspace, revisions,
    /// leases, users and watches. A TLS connection names one by its server name or client
    /// certificate (`--tenant-domain`); else a request names one in the `x-strata-tenant`
    /// header, which only a proxy that authenticates clients may set (`--trust-tenant-header`).
    /// Needs one of the two.
    #[arg(long, value_delimiter = ',')]
    pub tenants: Vec<String>,

    /// Serve the tenant a request names in its `x-strata-tenant` header, whichever it is
    /// (docs/design/tenants.md, T3). Without it, the header may name only the default tenant.
    /// Only behind a proxy that authenticates tenants and sets the header itself: any client
    /// that reaches this port directly could otherwise name any tenant served here.
    #[arg(long)]
    pub trust_tenant_header: bool,

    /// The journal shard that holds the tenants.
    #[arg(long, default_value_t = 0)]
    pub shard: u32,

    /// Serve the client port over TLS with this certificate chain (PEM; etcd's --cert-file).
    #[arg(long)]
    pub cert_file: Option<std::path::PathBuf>,

    /// The private key of `--cert-file` (PEM; etcd's --key-file).
    #[arg(long)]
    pub key_file: Option<std::path::PathBuf>,

    /// Verify client certificates against these CA certificates (PEM; etcd's
    /// --trusted-ca-file). Needs `--cert-file`.
    #[arg(long)]
    pub trusted_ca_file: Option<std::path::PathBuf>,

    /// How often the client and admin ports read their certificate, key and CA files again;
    /// new handshakes use what they hold from then on, so certificates are rotated without a
    /// restart. `0s`: never.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub tls_reload_interval: Duration,

    /// Refuse client certificates this revocation list revokes (PEM; etcd's
    /// --client-crl-file). Needs `--trusted-ca-file`. Read again with the certificates
    /// (`--tls-reload-interval`): a certificate revoked then opens no new connection, and its
    /// open connections are closed.
    #[arg(long)]
    pub client_crl_file: Option<std::path::PathBuf>,

    /// Refuse clients without a certificate signed by `--trusted-ca-file` (etcd's
    /// --client-cert-auth). With `--tenant-domain`, a connection that names a tenant by its
    /// server name must present a certificate for that name.
    #[arg(long)]
    pub client_cert_auth: bool,

    /// Requests a second each tenant may send this frontend (0: no limit). Unary RPCs and the
    /// opening of watch streams count; lease keep-alives and the requests on an open watch
    /// stream do not, so a tenant over its rate keeps its leases. Over it: ResourceExhausted "etcdserver:
    /// too many requests". A deployment's limit per tenant is this times its frontends.
    #[arg(long, default_value_t = 0)]
    pub tenant_request_rate: u32,

    /// Requests each tenant may send at once above `--tenant-request-rate` (default: one
    /// second's worth).
    #[arg(long, default_value_t = 0)]
    pub tenant_request_burst: u32,

    /// Most watchers each tenant may have on this frontend (0: no limit). A create over it is
    /// refused as etcd refuses one: created and canceled at once, with cancel_reason "strata:
    /// watcher quota of N per frontend reached".
    #[arg(long, default_value_t = 0)]
    pub tenant_max_watchers: usize,

    /// Most connections each tenant may hold open to this frontend (0: no limit); counts the
    /// TLS connections that name their tenant (`--tenant-domain`). One more is closed right
    /// after its handshake.
    #[arg(long, default_value_t = 0)]
    pub tenant_max_connections: usize,

    /// Follow the tenant catalogue (the reserved tenant `_system` on shard 0; docs/design/
    /// tenants.md, T1): serve, besides `--tenant` and `--tenants`, every tenant the catalogue
    /// places on `--catalogue-shards` (`--shard` unless given), loaded as it is created, refused while suspended (FailedPrecondition)
    /// or deleted (NotFound). Needs `--tenant-domain` or `--trust-tenant-header`.
    #[arg(long)]
    pub catalogue: bool,

    /// The shards whose catalogue tenants this frontend serves: a comma-separated list
    /// (`0,2`), or `all`: every tenant of the catalogue, whichever shard it is on, so that any
    /// frontend of the deployment serves any tenant and one Service (one wildcard DNS name)
    /// reaches them all; `--memory-budget` and `--tenant-idle-unload` keep what is loaded in
    /// bounds. Default: `--shard` alone.
    #[arg(long, value_parser = parse_shards)]
    pub catalogue_shards: Option<ShardSet>,

    /// A tenant of the catalogue that no request named for this long, with no watch or lease
    /// keep-alive stream open, is unloaded (its memory goes) until a request names it again,
    /// which waits for the load (newest checkpoint, then the journal). `0s`: never.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    pub tenant_idle_unload: Duration,

    /// Most bytes the tenants loaded here may hold, counted as their database sizes (Status's
    /// dbSize: keys, values and history; the process's resident memory is about twice that):
    /// over it, the tenants of the catalogue that no request named for a few seconds and that
    /// have no stream open are unloaded, least recently used first, and further tenants are
    /// served unloaded until a request names one. Accepts `512MiB`, `4GiB`, `2GB` or bytes;
    /// `0`: no budget.
    #[arg(long, default_value = "0", value_parser = parse_bytes)]
    pub memory_budget: u64,

    /// How many journal shards the deployment has: a tenant created here without a shard is
    /// placed on the one with the fewest tenants.
    #[arg(long, default_value_t = 1)]
    pub shards: u32,

    /// Address of the admin API (`strata.admin.Admin`: create, list, suspend, resume, delete,
    /// undelete tenants; `strata admin tenant`). Needs `--catalogue`. Mutual TLS
    /// (`--admin-cert-file`, `--admin-key-file`, `--admin-trusted-ca-file`) unless it is a
    /// loopback address.
    #[arg(long)]
    pub admin_listen: Option<SocketAddr>,

    /// How long a tenant deleted through this frontend's admin API can be undeleted; then its
    /// compactor purges its checkpoints (docs/design/tenants.md, T7).
    #[arg(long, default_value = "7d", value_parser = humantime::parse_duration)]
    pub deleted_tenant_retention: Duration,

    /// The admin port's certificate and key (PEM).
    #[arg(long)]
    pub admin_cert_file: Option<std::path::PathBuf>,
    #[arg(long)]
    pub admin_key_file: Option<std::path::PathBuf>,

    /// The CA whose certificates the admin port accepts: every admin client must present one.
    #[arg(long)]
    pub admin_trusted_ca_file: Option<std::path::PathBuf>,

    /// Admin client certificates this revocation list revokes are refused (PEM; needs
    /// `--admin-trusted-ca-file`), and their open connections closed when it is reloaded.
    #[arg(long)]
    pub admin_crl_file: Option<std::path::PathBuf>,

    /// With TLS, a connection to `<tenant>.<domain>` is a connection of that tenant, and so is
    /// one whose client certificate names `<tenant>.<domain>` (docs/design/tenants.md, T3).
    #[arg(long)]
    pub tenant_domain: Option<String>,

    /// Client URLs this frontend is reached at, listed by Cluster.MemberList
    /// (default: http://<listen>, https:// with TLS). `{tenant}` in a URL is replaced by the
    /// tenant of the request, so that a client that dialled `https://a.<--tenant-domain>` and
    /// follows MemberList (clientv3's endpoint sync) keeps dialling its tenant's name, e.g.
    /// `https://{tenant}.tenants.example.com:2379`.
    #[arg(long, value_delimiter = ',')]
    pub advertise_client_urls: Vec<String>,

    /// Member id reported in response headers and MemberList (default: derived from the first
    /// advertised client URL, so every frontend derives the same ids for its peers).
    #[arg(long)]
    pub member_id: Option<u64>,

    /// Member name reported in MemberList (default: the first advertised client URL).
    #[arg(long)]
    pub name: Option<String>,

    /// etcd version reported by Maintenance.Status (clients enable features by it).
    #[arg(long, default_value = DEFAULT_ETCD_VERSION)]
    pub etcd_version: String,

    /// Largest request accepted, in bytes (etcd's --max-request-bytes).
    #[arg(long, default_value_t = DEFAULT_MAX_REQUEST_BYTES)]
    pub max_request_bytes: usize,

    /// Most operations in one txn (etcd's --max-txn-ops); at most the apply-time limit.
    #[arg(long, default_value_t = DEFAULT_MAX_TXN_OPS)]
    pub max_txn_ops: usize,

    /// bcrypt cost of the password hashes of UserAdd and UserChangePassword (etcd's
    /// --bcrypt-cost, 4 to 31).
    #[arg(long, default_value_t = crate::auth::DEFAULT_BCRYPT_COST)]
    pub bcrypt_cost: u32,

    /// A key auth tokens are signed and verified with (at least 32 bytes, read as they are;
    /// the same files on every frontend of the deployment, e.g. a Kubernetes Secret). Given
    /// several times, the first signs and every one verifies, so a key rotates without
    /// logging anyone out: add the new key second, then first, then drop the old one. Without
    /// any, this frontend cannot enable auth or verify tokens (docs/design/auth.md, A3).
    #[arg(long)]
    pub auth_token_key_file: Vec<std::path::PathBuf>,

    /// How long an auth token is valid (etcd's --auth-token-ttl).
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    pub auth_token_ttl: Duration,

    /// Client URLs of the other frontends serving this tenant, comma separated, listed by
    /// Cluster.MemberList so clients spread over them (`{tenant}` as in
    /// `--advertise-client-urls`).
    #[arg(long, value_delimiter = ',')]
    pub peer_frontends: Vec<String>,

    /// Where the compactor writes checkpoints (`file:///dir` or a path, `s3://bucket[/prefix]`,
    /// `gs://...`, `az://...`; cloud settings from the environment). When given, the replica
    /// starts from the tenant's newest checkpoint and tails the journal from there; without it,
    /// from the journal's start (which fails once the journal was trimmed).
    #[arg(long = "object-store", env = "STRATA_OBJECT_STORE")]
    pub object_store: Option<String>,

    /// Period of progress notifications to idle watchers created with progress_notify (etcd's
    /// --experimental-watch-progress-notify-interval), e.g. 10m, 500ms; at least 100ms.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    pub watch_progress_notify_interval: Duration,

    /// Journal silence (not even an idle tick, which comes every 500 ms) after which streams
    /// opened with etcd's `hasleader` metadata end with "etcdserver: no leader" and new ones are
    /// refused (etcd: three election timeouts), so clients move to another frontend; at least 1s.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub no_leader_after: Duration,

    /// On SIGTERM, go on serving this long while `/readyz` and gRPC health say "not serving",
    /// so that load balancers and Kubernetes endpoints stop sending new connections before the
    /// frontend stops accepting them (then in-flight requests get 5 s more).
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    pub shutdown_delay: Duration,

    /// Tuning: tail the journal from the shard's leader (true), which applies an entry as it
    /// commits it, or from whichever node the client picks (false), where a follower learns of
    /// the commit only with the leader's next message. Either way the tail fails over to the
    /// other nodes.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub tail_from_leader: bool,

    /// TLS to the journal (`--internal-*`).
    #[command(flatten)]
    pub internal_tls: journal::tls::TlsArgs,
}

/// A configuration that cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("--journal needs at least one address")]
    NoJournal,
    #[error(
        "no tenant to serve: give --tenant, or --tenants or --catalogue with --trust-tenant-header or --tenant-domain"
    )]
    NoTenant,
    #[error(transparent)]
    TenantName(#[from] api::manifest::ManifestError),
    #[error("tenant {0:?} is given twice")]
    DuplicateTenant(String),
    #[error(
        "--tenants needs --tenant-domain (TLS connections name their tenant) or --trust-tenant-header (a proxy that authenticates clients names it in the x-strata-tenant header)"
    )]
    UntrustedTenants,
    #[error("--max-request-bytes must be between 1 and {MAX_MAX_REQUEST_BYTES}, got {0}")]
    MaxRequestBytes(usize),
    #[error("--no-leader-after must be at least {MIN_NO_LEADER_AFTER:?}, got {0:?}")]
    NoLeaderAfter(Duration),
    #[error("--max-txn-ops must be between 1 and the apply-time limit {limit}, got {got}")]
    MaxTxnOps { got: usize, limit: usize },
    #[error("--bcrypt-cost must be 4 to 31, got {0}")]
    BcryptCost(u32),
    #[error("--etcd-version must look like 3.5.17, got {0:?}")]
    EtcdVersion(String),
    #[error("client URL {0:?} must start with http:// or https://")]
    Url(String),
    #[error("--cert-file and --key-file go together")]
    CertWithoutKey,
    #[error("{0} needs --cert-file and --key-file (TLS on the client port)")]
    NeedsTls(&'static str),
    #[error(
        "--client-cert-auth needs --trusted-ca-file (the CA client certificates are checked against)"
    )]
    ClientCertAuthWithoutCa,
    #[error(
        "{0} needs the CA it revokes certificates of (--trusted-ca-file, --admin-trusted-ca-file)"
    )]
    CrlWithoutCa(&'static str),
    #[error("--tenant-domain {0:?} is not a domain name")]
    TenantDomain(String),
    #[error(
        "--tenant-max-connections needs --tenant-domain: only TLS connections that name their tenant are counted"
    )]
    ConnectionsWithoutDomain,
    #[error("tenant names starting with '_' are reserved, got {0:?}")]
    ReservedTenant(String),
    #[error("--shard {shard} is not below --shards {shards}")]
    Shard { shard: u32, shards: u32 },
    #[error("--catalogue-shards needs --catalogue")]
    ShardsWithoutCatalogue,
    #[error("--admin-listen needs --catalogue (the admin API changes the catalogue)")]
    AdminWithoutCatalogue,
    #[error(
        "--memory-budget needs --catalogue (only tenants of the catalogue are unloaded and loaded again)"
    )]
    BudgetWithoutCatalogue,
    #[error(
        "--admin-listen {0} is not a loopback address: it needs --admin-cert-file, --admin-key-file and --admin-trusted-ca-file (mutual TLS)"
    )]
    AdminWithoutTls(SocketAddr),
}

impl Config {
    /// A configuration for tests and embedding: one journal address, loopback port 0 listeners.
    pub fn for_test(journal: Vec<String>) -> Self {
        Self {
            journal,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            metrics_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            tenant: "default".into(),
            tenants: Vec::new(),
            trust_tenant_header: false,
            shard: 0,
            cert_file: None,
            key_file: None,
            trusted_ca_file: None,
            client_crl_file: None,
            admin_crl_file: None,
            tls_reload_interval: Duration::from_secs(5),
            client_cert_auth: false,
            tenant_domain: None,
            catalogue: false,
            shards: 1,
            admin_listen: None,
            deleted_tenant_retention: Duration::from_secs(7 * 24 * 3600),
            tenant_idle_unload: Duration::from_secs(600),
            memory_budget: 0,
            catalogue_shards: None,
            admin_cert_file: None,
            admin_key_file: None,
            admin_trusted_ca_file: None,
            tenant_request_rate: 0,
            tenant_request_burst: 0,
            tenant_max_watchers: 0,
            tenant_max_connections: 0,
            advertise_client_urls: Vec::new(),
            member_id: None,
            name: None,
            etcd_version: DEFAULT_ETCD_VERSION.into(),
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            max_txn_ops: DEFAULT_MAX_TXN_OPS,
            bcrypt_cost: crate::auth::DEFAULT_BCRYPT_COST,
            auth_token_key_file: Vec::new(),
            auth_token_ttl: crate::token::DEFAULT_TOKEN_TTL,
            peer_frontends: Vec::new(),
            object_store: None,
            watch_progress_notify_interval: crate::watch::DEFAULT_PROGRESS_NOTIFY_INTERVAL,
            no_leader_after: DEFAULT_NO_LEADER_AFTER,
            shutdown_delay: Duration::ZERO,
            tail_from_leader: true,
            internal_tls: Default::default(),
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.journal.is_empty() || self.journal.iter().any(|j| j.trim().is_empty()) {
            return Err(ConfigError::NoJournal);
        }
        self.validate_tenants()?;
        self.validate_tls()?;
        self.validate_admin()?;
        if self.max_request_bytes == 0 || self.max_request_bytes > MAX_MAX_REQUEST_BYTES {
            return Err(ConfigError::MaxRequestBytes(self.max_request_bytes));
        }
        if self.no_leader_after < MIN_NO_LEADER_AFTER {
            return Err(ConfigError::NoLeaderAfter(self.no_leader_after));
        }
        let limit = memstore::Config::default().max_txn_ops;
        if self.max_txn_ops == 0 || self.max_txn_ops > limit {
            return Err(ConfigError::MaxTxnOps {
                got: self.max_txn_ops,
                limit,
            });
        }
        if !crate::auth::BCRYPT_COSTS.contains(&self.bcrypt_cost) {
            return Err(ConfigError::BcryptCost(self.bcrypt_cost));
        }
        let parts: Vec<&str> = self.etcd_version.split('.').collect();
        if parts.len() != 3 || parts.iter().any(|p| p.parse::<u32>().is_err()) {
            return Err(ConfigError::EtcdVersion(self.etcd_version.clone()));
        }
        for u in self
            .advertise_client_urls
            .iter()
            .chain(&self.peer_frontends)
        {
            if !(u.starts_with("http://") || u.starts_with("https://")) {
                return Err(ConfigError::Url(u.clone()));
            }
        }
        Ok(())
    }

    /// Every tenant served, the default first: checked names (object paths and journal entries
    /// carry them unchanged), no name twice, and more than the default only with
    /// `--trust-tenant-header`.
    fn validate_tenants(&self) -> Result<(), ConfigError> {
        if (!self.tenants.is_empty() || self.catalogue)
            && !self.trust_tenant_header
            && self.tenant_domain.is_none()
        {
            return Err(ConfigError::UntrustedTenants);
        }
        let mut seen = std::collections::HashSet::new();
        for t in self.served_tenants() {
            if t.starts_with('_') {
                return Err(ConfigError::ReservedTenant(t.to_string()));
            }
            api::manifest::validate_tenant(t)?;
            if !seen.insert(t) {
                return Err(ConfigError::DuplicateTenant(t.to_string()));
            }
        }
        if self.memory_budget > 0 && !self.catalogue {
            return Err(ConfigError::BudgetWithoutCatalogue);
        }
        if seen.is_empty() && !self.catalogue {
            return Err(ConfigError::NoTenant);
        }
        if self.catalogue_shards.is_some() && !self.catalogue {
            return Err(ConfigError::ShardsWithoutCatalogue);
        }
        // Placement counts on it; without the catalogue nothing does.
        if self.catalogue {
            let listed = match &self.catalogue_shards {
                Some(ShardSet::Only(shards)) => shards.iter().copied().collect(),
                _ => vec![self.shard],
            };
            if let Some(&shard) = listed.iter().find(|&&s| s >= self.shards) {
                return Err(ConfigError::Shard {
                    shard,
                    shards: self.shards,
                });
            }
        }
        Ok(())
    }

    /// The admin port changes the catalogue, so it needs one, and mutual TLS unless only this
    /// machine can reach it.
    fn validate_admin(&self) -> Result<(), ConfigError> {
        let Some(addr) = self.admin_listen else {
            return Ok(());
        };
        if !self.catalogue {
            return Err(ConfigError::AdminWithoutCatalogue);
        }
        let tls = [
            &self.admin_cert_file,
            &self.admin_key_file,
            &self.admin_trusted_ca_file,
        ];
        if !addr.ip().is_loopback() && tls.iter().any(|f| f.is_none()) {
            return Err(ConfigError::AdminWithoutTls(addr));
        }
        Ok(())
    }

    fn validate_tls(&self) -> Result<(), ConfigError> {
        if self.cert_file.is_some() != self.key_file.is_some() {
            return Err(ConfigError::CertWithoutKey);
        }
        let tls = self.cert_file.is_some();
        if !tls && self.trusted_ca_file.is_some() {
            return Err(ConfigError::NeedsTls("--trusted-ca-file"));
        }
        if !tls && self.tenant_domain.is_some() {
            return Err(ConfigError::NeedsTls("--tenant-domain"));
        }
        if self.tenant_max_connections > 0 && self.tenant_domain.is_none() {
            return Err(ConfigError::ConnectionsWithoutDomain);
        }
        if self.client_cert_auth && self.trusted_ca_file.is_none() {
            return Err(ConfigError::ClientCertAuthWithoutCa);
        }
        if self.client_crl_file.is_some() && self.trusted_ca_file.is_none() {
            return Err(ConfigError::CrlWithoutCa("--client-crl-file"));
        }
        if self.admin_crl_file.is_some() && self.admin_trusted_ca_file.is_none() {
            return Err(ConfigError::CrlWithoutCa("--admin-crl-file"));
        }
        if let Some(d) = &self.tenant_domain {
            let d = d.trim_start_matches('.');
            let label_ok = |l: &str| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            };
            if d.is_empty() || !d.split('.').all(label_ok) {
                return Err(ConfigError::TenantDomain(d.to_string()));
            }
        }
        Ok(())
    }

    /// Whether the client port serves TLS.
    pub fn tls(&self) -> bool {
        self.cert_file.is_some()
    }

    /// The default tenant, if any (`--tenant`, unless given empty).
    pub fn default_tenant(&self) -> Option<&str> {
        (!self.tenant.is_empty()).then_some(self.tenant.as_str())
    }

    /// The shards whose catalogue tenants this frontend serves (`--catalogue-shards`, else
    /// `--shard`).
    pub fn catalogue_shards(&self) -> ShardSet {
        self.catalogue_shards
            .clone()
            .unwrap_or_else(|| ShardSet::Only([self.shard].into()))
    }

    /// Every tenant this frontend serves: the default (if any) first, then `--tenants`.
    pub fn served_tenants(&self) -> impl Iterator<Item = &str> {
        self.default_tenant()
            .into_iter()
            .chain(self.tenants.iter().map(String::as_str))
    }

    /// The advertised client URLs, defaulting to `http://<bound address>` (`https://` with TLS).
    pub fn client_urls(&self, bound: SocketAddr) -> Vec<String> {
        if self.advertise_client_urls.is_empty() {
            let scheme = if self.tls() { "https" } else { "http" };
            vec![format!("{scheme}://{bound}")]
        } else {
            self.advertise_client_urls.clone()
        }
    }
}

/// A stable 64-bit id for a name (member ids from URLs, cluster ids from tenant names):
/// CRC32C of the name in the high half and of its reverse in the low half; never 0.
pub fn stable_id(name: &str) -> u64 {
    let hi = u64::from(crc32c::crc32c(name.as_bytes()));
    let rev: Vec<u8> = name.bytes().rev().collect();
    let lo = u64::from(crc32c::crc32c_append(0x5354_5241, &rev));
    ((hi << 32) | lo).max(1)
}

/// The shards a frontend serves the catalogue's tenants of (`--catalogue-shards`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShardSet {
    /// Every shard.
    All,
    /// These.
    Only(std::collections::BTreeSet<u32>),
}

impl ShardSet {
    pub fn contains(&self, shard: u32) -> bool {
        match self {
            ShardSet::All => true,
            ShardSet::Only(shards) => shards.contains(&shard),
        }
    }
}

impl std::fmt::Display for ShardSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShardSet::All => f.write_str("all"),
            ShardSet::Only(shards) => {
                let list: Vec<String> = shards.iter().map(u32::to_string).collect();
                f.write_str(&list.join(","))
            }
        }
    }
}

/// `all`, or a comma-separated list of shard numbers.
pub fn parse_shards(text: &str) -> Result<ShardSet, String> {
    let text = text.trim();
    if text == "all" {
        return Ok(ShardSet::All);
    }
    let shards = text
        .split(',')
        .map(|s| {
            s.trim().parse::<u32>().map_err(|_| {
                format!("{s:?} is not a shard number (give a list such as 0,2, or all)")
            })
        })
        .collect::<Result<std::collections::BTreeSet<_>, _>>()?;
    Ok(ShardSet::Only(shards))
}

/// A size in bytes: a number, optionally followed by `KiB`, `MiB`, `GiB`, `TiB` (powers of
/// 1024) or `KB`, `MB`, `GB`, `TB` (powers of 1000), as Kubernetes quantities and etcd's
/// documentation write them.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size (a number of bytes, or 512MiB, 4GiB)"))?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        other => return Err(format!("unknown size unit {other:?} in {text:?}")),
    };
    number
        .checked_mul(scale)
        .ok_or_else(|| format!("{text:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_and_decimal_units() {
        assert_eq!(parse_bytes("0"), Ok(0));
        assert_eq!(parse_bytes("1234"), Ok(1234));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("4GiB"), Ok(4 << 30));
        assert_eq!(parse_bytes("2GB"), Ok(2_000_000_000));
        assert_eq!(parse_bytes("3 KiB"), Ok(3 << 10));
        for bad in ["", "GiB", "1.5GiB", "4gib", "-1", "99999999999TiB"] {
            assert!(parse_bytes(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn defaults_validate() {
        Config::for_test(vec!["127.0.0.1:1".into()])
            .validate()
            .unwrap();
    }

    #[test]
    fn bad_values_are_refused() {
        let ok = Config::for_test(vec!["127.0.0.1:1".into()]);
        let mut c = ok.clone();
        c.journal.clear();
        assert!(matches!(c.validate(), Err(ConfigError::NoJournal)));
        let mut c = ok.clone();
        c.max_txn_ops = 0;
        assert!(matches!(c.validate(), Err(ConfigError::MaxTxnOps { .. })));
        for cost in [3, 32] {
            let mut c = ok.clone();
            c.bcrypt_cost = cost;
            assert!(matches!(c.validate(), Err(ConfigError::BcryptCost(_))));
        }
        let mut c = ok.clone();
        c.etcd_version = "3.5".into();
        assert!(matches!(c.validate(), Err(ConfigError::EtcdVersion(_))));
        let mut c = ok.clone();
        c.peer_frontends = vec!["127.0.0.1:2379".into()];
        assert!(matches!(c.validate(), Err(ConfigError::Url(_))));
        let mut c = ok;
        c.max_request_bytes = 0;
        assert!(matches!(c.validate(), Err(ConfigError::MaxRequestBytes(0))));
        // Above what one journal entry holds with its envelope.
        c.max_request_bytes = journal::node::MAX_ENTRY_BYTES;
        assert!(matches!(c.validate(), Err(ConfigError::MaxRequestBytes(_))));
        c.max_request_bytes = MAX_MAX_REQUEST_BYTES;
        assert!(c.validate().is_ok());
        c.no_leader_after = Duration::from_millis(500);
        assert!(matches!(c.validate(), Err(ConfigError::NoLeaderAfter(_))));
    }

    #[test]
    fn the_catalogue_and_the_admin_port_are_checked() {
        let mut c = Config::for_test(vec!["127.0.0.1:1".into()]);
        c.tenant = String::new();
        c.catalogue = true;
        // Tenants of the catalogue must be named by something a client cannot forge alone.
        assert!(matches!(c.validate(), Err(ConfigError::UntrustedTenants)));
        c.trust_tenant_header = true;
        assert!(
            c.validate().is_ok(),
            "no fixed tenant is needed with a catalogue"
        );
        c.shard = 1;
        assert!(matches!(
            c.validate(),
            Err(ConfigError::Shard {
                shard: 1,
                shards: 1
            })
        ));
        c.shards = 2;
        assert!(c.validate().is_ok());
        c.tenants = vec!["_system".into()];
        assert!(matches!(c.validate(), Err(ConfigError::ReservedTenant(_))));
        c.tenants.clear();
        c.admin_listen = Some("127.0.0.1:0".parse().unwrap());
        assert!(c.validate().is_ok(), "plain on loopback");
        c.admin_listen = Some("0.0.0.0:2382".parse().unwrap());
        assert!(matches!(c.validate(), Err(ConfigError::AdminWithoutTls(_))));
        c.admin_cert_file = Some("cert.pem".into());
        c.admin_key_file = Some("key.pem".into());
        assert!(matches!(c.validate(), Err(ConfigError::AdminWithoutTls(_))));
        c.admin_trusted_ca_file = Some("ca.pem".into());
        assert!(c.validate().is_ok());
        c.catalogue = false;
        c.tenant = "default".into();
        assert!(matches!(
            c.validate(),
            Err(ConfigError::AdminWithoutCatalogue)
        ));
        c.admin_listen = None;
        c.memory_budget = 1 << 30;
        assert!(matches!(
            c.validate(),
            Err(ConfigError::BudgetWithoutCatalogue)
        ));
        c.catalogue = true;
        assert!(c.validate().is_ok());

        // --catalogue-shards: with the catalogue, and below --shards.
        c.shards = 4;
        c.catalogue_shards = Some(parse_shards("0,3").unwrap());
        assert!(c.validate().is_ok());
        c.catalogue_shards = Some(parse_shards("2,4").unwrap());
        assert!(matches!(
            c.validate(),
            Err(ConfigError::Shard {
                shard: 4,
                shards: 4
            })
        ));
        c.catalogue_shards = Some(ShardSet::All);
        assert!(c.validate().is_ok());
        c.memory_budget = 0;
        c.catalogue = false;
        assert!(matches!(
            c.validate(),
            Err(ConfigError::ShardsWithoutCatalogue)
        ));
    }

    #[test]
    fn shard_sets_parse_as_lists_or_all() {
        assert_eq!(parse_shards("all"), Ok(ShardSet::All));
        let only = parse_shards(" 2, 0 ,2").unwrap();
        assert_eq!(only, ShardSet::Only([0, 2].into()));
        assert_eq!(only.to_string(), "0,2");
        assert!(only.contains(0) && !only.contains(1));
        assert!(ShardSet::All.contains(u32::MAX));
        assert!(parse_shards("0,x").is_err());
        assert!(parse_shards("").is_err());
        let mut c = Config::for_test(vec!["127.0.0.1:1".into()]);
        c.shard = 3;
        assert_eq!(c.catalogue_shards(), ShardSet::Only([3].into()), "--shard");
    }

    #[test]
    fn tenants_are_checked() {
        let ok = Config::for_test(vec!["127.0.0.1:1".into()]);
        let mut c = ok.clone();
        c.tenants = vec!["a".into(), "b".into()];
        // More tenants than the default only when the header that names them is trusted.
        assert!(matches!(c.validate(), Err(ConfigError::UntrustedTenants)));
        c.trust_tenant_header = true;
        c.validate().unwrap();
        assert_eq!(
            c.served_tenants().collect::<Vec<_>>(),
            ["default", "a", "b"]
        );
        c.tenant.clear();
        c.validate().unwrap();
        assert_eq!(c.default_tenant(), None);
        assert_eq!(c.served_tenants().collect::<Vec<_>>(), ["a", "b"]);
        c.tenants = vec!["a".into(), "a".into()];
        assert!(matches!(c.validate(), Err(ConfigError::DuplicateTenant(t)) if t == "a"));
        c.tenant = "a".into();
        c.tenants = vec!["a".into()];
        assert!(matches!(c.validate(), Err(ConfigError::DuplicateTenant(_))));
        c.tenants = vec!["Bad/Name".into()];
        assert!(matches!(c.validate(), Err(ConfigError::TenantName(_))));
        // TLS connections name their tenant themselves: no header to trust.
        let mut c = ok.clone();
        c.tenants = vec!["a".into()];
        c.cert_file = Some("server.pem".into());
        c.key_file = Some("server.key".into());
        c.tenant_domain = Some("tenants.example.com".into());
        c.validate().unwrap();
        let mut c = ok.clone();
        c.tenant.clear();
        assert!(matches!(c.validate(), Err(ConfigError::NoTenant)));
        c.tenant = "UPPER".into();
        assert!(matches!(c.validate(), Err(ConfigError::TenantName(_))));
    }

    #[test]
    fn tls_flags_are_checked() {
        let ok = Config::for_test(vec!["127.0.0.1:1".into()]);
        let mut c = ok.clone();
        c.cert_file = Some("server.pem".into());
        assert!(matches!(c.validate(), Err(ConfigError::CertWithoutKey)));
        c.key_file = Some("server.key".into());
        c.validate().unwrap();
        assert_eq!(
            c.client_urls("127.0.0.1:2379".parse().unwrap()),
            ["https://127.0.0.1:2379"]
        );
        c.client_cert_auth = true;
        assert!(matches!(
            c.validate(),
            Err(ConfigError::ClientCertAuthWithoutCa)
        ));
        c.trusted_ca_file = Some("ca.pem".into());
        c.tenant_domain = Some("tenants.example.com".into());
        c.validate().unwrap();
        c.tenant_max_connections = 10;
        c.validate().unwrap();
        c.tenant_domain = Some("bad domain".into());
        assert!(matches!(c.validate(), Err(ConfigError::TenantDomain(_))));
        c.tenant_domain = None;
        assert!(matches!(
            c.validate(),
            Err(ConfigError::ConnectionsWithoutDomain)
        ));
        let mut c = ok.clone();
        c.tenant_domain = Some("tenants.example.com".into());
        assert!(matches!(c.validate(), Err(ConfigError::NeedsTls(_))));
        // A revocation list revokes certificates of a CA given with it.
        let mut c = ok;
        c.cert_file = Some("server.pem".into());
        c.key_file = Some("server.key".into());
        c.client_crl_file = Some("crl.pem".into());
        assert!(matches!(
            c.validate(),
            Err(ConfigError::CrlWithoutCa("--client-crl-file"))
        ));
        c.trusted_ca_file = Some("ca.pem".into());
        c.validate().unwrap();
        c.admin_crl_file = Some("admin-crl.pem".into());
        assert!(matches!(
            c.validate(),
            Err(ConfigError::CrlWithoutCa("--admin-crl-file"))
        ));
    }

    #[test]
    fn stable_ids_differ_and_are_stable() {
        let a = stable_id("http://127.0.0.1:2379");
        let b = stable_id("http://127.0.0.1:2380");
        assert_ne!(a, b);
        assert_eq!(a, stable_id("http://127.0.0.1:2379"));
        assert_ne!(stable_id(""), 0);
    }
}
