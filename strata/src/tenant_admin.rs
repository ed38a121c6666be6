//! `strata admin tenant`: the admin API's client (docs/design/tenants.md, T6), speaking to a
//! frontend's admin port (`strata frontend --admin-listen`, `strata dev` serves one on
//! 127.0.0.1:2382); `--json` prints what automation reads. A change is made for the record as
//! the command read it (`if_revision`), so that a change this command gave up on (its append
//! committed late) can never land after a later command's.

use anyhow::Context;
use api::strata::admin::admin_client::AdminClient;
use api::strata::admin::{
    CreateTenantRequest, ListTenantsRequest, TenantName, TenantRecord, TenantResponse, TenantState,
    UpdateQuotasRequest,
};
use api::strata::entry::TenantQuotas;
use tonic::Code;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

/// The admin port `strata dev` serves.
pub const DEV_ADMIN_ENDPOINT: &str = "http://127.0.0.1:2382";

#[derive(clap::Args)]
pub struct Args {
    /// The admin API (`http://host:port`, or `https://` for mutual TLS).
    #[arg(long, env = "STRATA_ADMIN_ENDPOINT", default_value = DEV_ADMIN_ENDPOINT, global = true)]
    endpoint: String,
    /// CA that signed the admin port's certificate (PEM).
    #[arg(long, global = true)]
    cacert: Option<std::path::PathBuf>,
    /// This client's certificate and key (PEM), signed by the admin port's trusted CA.
    #[arg(long, global = true)]
    cert: Option<std::path::PathBuf>,
    #[arg(long, global = true)]
    key: Option<std::path::PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    /// Make the change only if the tenant's record is still at this revision (the REVISION
    /// column; 0: the name has no record), else fail. Without it, the command reads the record
    /// first and makes the change for that revision, reading again if another change landed
    /// in between.
    #[arg(long, global = true)]
    if_revision: Option<i64>,
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Create a tenant: its own keyspace, revisions, leases, users and watches.
    Create {
        name: String,
        /// The shard to place it on (default: the one with the fewest tenants).
        #[arg(long)]
        shard: Option<u32>,
        #[command(flatten)]
        quotas: Quotas,
    },
    /// Show one tenant.
    Get { name: String },
    /// List the tenants.
    List {
        /// Include deleted tenants.
        #[arg(long)]
        deleted: bool,
    },
    /// Replace a tenant's quotas (0: the deployment's default).
    Update {
        name: String,
        #[command(flatten)]
        quotas: Quotas,
    },
    /// Refuse every request of the tenant but Status and Snapshot.
    Suspend { name: String },
    /// Serve a suspended tenant again.
    Resume { name: String },
    /// Refuse the tenant everywhere (NotFound); its data stays until it is undeleted.
    Delete { name: String },
    /// Serve a deleted tenant again, with its data.
    Undelete { name: String },
}

#[derive(clap::Args)]
struct Quotas {
    #[arg(long, default_value_t = 0)]
    stored_bytes: i64,
    #[arg(long, default_value_t = 0)]
    requests_per_second: i64,
    #[arg(long, default_value_t = 0)]
    watchers: i64,
    #[arg(long, default_value_t = 0)]
    leases: i64,
    #[arg(long, default_value_t = 0)]
    connections: i64,
}

impl From<Quotas> for TenantQuotas {
    fn from(q: Quotas) -> Self {
        TenantQuotas {
            stored_bytes: q.stored_bytes,
            requests_per_second: q.requests_per_second,
            watchers: q.watchers,
            leases: q.leases,
            connections: q.connections,
        }
    }
}

async fn connect(args: &Args) -> anyhow::Result<AdminClient<Channel>> {
    let mut endpoint = Channel::from_shared(args.endpoint.clone())
        .with_context(|| format!("bad --endpoint {:?}", args.endpoint))?;
    if args.endpoint.starts_with("https://") {
        let mut tls = ClientTlsConfig::new();
        if let Some(ca) = &args.cacert {
            let pem = std::fs::read(ca).with_context(|| format!("reading {}", ca.display()))?;
            tls = tls.ca_certificate(Certificate::from_pem(pem));
        }
        if let (Some(cert), Some(key)) = (&args.cert, &args.key) {
            let cert =
                std::fs::read(cert).with_context(|| format!("reading {}", cert.display()))?;
            let key = std::fs::read(key).with_context(|| format!("reading {}", key.display()))?;
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        endpoint = endpoint.tls_config(tls)?;
    }
    let channel = endpoint
        .connect()
        .await
        .with_context(|| format!("cannot reach the admin API at {}", args.endpoint))?;
    Ok(AdminClient::new(channel))
}

/// How often a change is read and made again when another change moved the record on in
/// between (each time it is made for the revision just read).
const CHANGE_ATTEMPTS: usize = 5;

type Answer = Result<tonic::Response<TenantResponse>, tonic::Status>;

/// The revision of `name`'s record (0: none), as a change made for it names it.
async fn revision_of(mut client: AdminClient<Channel>, name: &str) -> Result<i64, tonic::Status> {
    let get = TenantName {
        name: name.to_string(),
        if_revision: None,
    };
    match client.get_tenant(get).await {
        Ok(r) => Ok(r.into_inner().tenant.map_or(0, |t| t.revision)),
        Err(s) if s.code() == Code::NotFound => Ok(0),
        Err(s) => Err(s),
    }
}

/// `call` (a change of `name`) made for the revision `given`, or else for the revision just
/// read, read again while another change lands in between (Aborted).
async fn change<Fut: Future<Output = Answer>>(
    client: &AdminClient<Channel>,
    name: &str,
    given: Option<i64>,
    call: impl Fn(AdminClient<Channel>, i64) -> Fut,
) -> Result<Option<TenantRecord>, tonic::Status> {
    if let Some(at) = given {
        return call(client.clone(), at)
            .await
            .map(|r| r.into_inner().tenant);
    }
    let mut attempt = 1;
    loop {
        let at = revision_of(client.clone(), name).await?;
        match call(client.clone(), at).await {
            Err(s) if s.code() == Code::Aborted && attempt < CHANGE_ATTEMPTS => attempt += 1,
            r => return r.map(|r| r.into_inner().tenant),
        }
    }
}

/// A change's `TenantName`.
fn at(name: &str, revision: i64) -> TenantName {
    TenantName {
        name: name.to_string(),
        if_revision: Some(revision),
    }
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let mut client = connect(&args).await?;
    let given = args.if_revision;
    if given.is_some() && matches!(args.command, Command::Get { .. } | Command::List { .. }) {
        anyhow::bail!("--if-revision is for a change, not a read");
    }
    let one = match args.command {
        Command::Create {
            ref name,
            shard,
            quotas,
        } => {
            let quotas = TenantQuotas::from(quotas);
            change(&client, name, given, |mut c, at| async move {
                let create = CreateTenantRequest {
                    name: name.clone(),
                    shard,
                    quotas: Some(quotas),
                    if_revision: Some(at),
                };
                c.create_tenant(create).await
            })
            .await
        }
        Command::Get { ref name } => client
            .get_tenant(TenantName {
                name: name.clone(),
                if_revision: None,
            })
            .await
            .map(|r| r.into_inner().tenant),
        Command::List { deleted } => {
            let list = client
                .list_tenants(ListTenantsRequest { deleted })
                .await
                .map_err(status)?
                .into_inner()
                .tenants;
            if args.json {
                let v: Vec<_> = list.iter().map(json_of).collect();
                println!("{}", serde_json::Value::Array(v));
            } else {
                table(&list);
            }
            return Ok(());
        }
        Command::Update { ref name, quotas } => {
            let quotas = TenantQuotas::from(quotas);
            change(&client, name, given, |mut c, at| async move {
                let update = UpdateQuotasRequest {
                    name: name.clone(),
                    quotas: Some(quotas),
                    if_revision: Some(at),
                };
                c.update_quotas(update).await
            })
            .await
        }
        Command::Suspend { ref name }
        | Command::Resume { ref name }
        | Command::Delete { ref name }
        | Command::Undelete { ref name } => {
            let command = &args.command;
            change(&client, name, given, |mut c, r| async move {
                match command {
                    Command::Suspend { .. } => c.suspend(at(name, r)).await,
                    Command::Resume { .. } => c.resume(at(name, r)).await,
                    Command::Delete { .. } => c.delete(at(name, r)).await,
                    _ => c.undelete(at(name, r)).await,
                }
            })
            .await
        }
    };
    let record = one
        .map_err(status)?
        .context("the admin API answered no tenant")?;
    if args.json {
        println!("{}", json_of(&record));
    } else {
        table(std::slice::from_ref(&record));
    }
    Ok(())
}

/// A refusal as the operator reads it: the server's message (etcdctl prints its errors so).
fn status(s: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{} ({:?})", s.message(), s.code())
}

fn state_name(r: &TenantRecord) -> &'static str {
    match TenantState::try_from(r.state) {
        Ok(TenantState::Active) => "active",
        Ok(TenantState::Suspended) => "suspended",
        Ok(TenantState::Deleted) => "deleted",
        _ => "unknown",
    }
}

fn json_of(r: &TenantRecord) -> serde_json::Value {
    let q = r.quotas.unwrap_or_default();
    serde_json::json!({
        "name": r.name,
        "uid": r.uid.iter().map(|b| format!("{b:02x}")).collect::<String>(),
        "shard": r.shard,
        "state": state_name(r),
        "quotas": {
            "stored_bytes": q.stored_bytes,
            "requests_per_second": q.requests_per_second,
            "watchers": q.watchers,
            "leases": q.leases,
            "connections": q.connections,
        },
        "created_index": r.created_index,
        "created_ms": r.created_ms,
        "deleted_ms": r.deleted_ms,
        "retention_ms": r.retention_ms,
        "revision": r.revision,
    })
}

/// `list` and every command about one tenant, for a terminal.
fn table(records: &[TenantRecord]) {
    println!(
        "{:<24} {:>5}  {:<10} {:>10}  {:<20}",
        "NAME", "SHARD", "STATE", "REVISION", "CREATED"
    );
    for r in records {
        println!(
            "{:<24} {:>5}  {:<10} {:>10}  {:<20}",
            r.name,
            r.shard,
            state_name(r),
            r.revision,
            crate::admin::rfc3339(r.created_ms)
        );
    }
}
