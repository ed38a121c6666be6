//! `strata admin tenant`: the admin API's client (docs/design/tenants.md, T6). Every command is
//! one RPC to a frontend's admin port (`strata frontend --admin-listen`, `strata dev` serves
//! one on 127.0.0.1:2382); `--json` prints what automation reads.

use anyhow::Context;
use api::strata::admin::admin_client::AdminClient;
use api::strata::admin::{
    CreateTenantRequest, ListTenantsRequest, TenantName, TenantRecord, TenantState,
    UpdateQuotasRequest,
};
use api::strata::entry::TenantQuotas;
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

pub async fn run(args: Args) -> anyhow::Result<()> {
    let mut client = connect(&args).await?;
    let name = |n: &String| TenantName { name: n.clone() };
    let one = match args.command {
        Command::Create {
            ref name,
            shard,
            quotas,
        } => client
            .create_tenant(CreateTenantRequest {
                name: name.clone(),
                shard,
                quotas: Some(quotas.into()),
            })
            .await
            .map(|r| r.into_inner().tenant),
        Command::Get { name: ref n } => client
            .get_tenant(name(n))
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
        Command::Update {
            name: ref n,
            quotas,
        } => client
            .update_quotas(UpdateQuotasRequest {
                name: n.clone(),
                quotas: Some(quotas.into()),
            })
            .await
            .map(|r| r.into_inner().tenant),
        Command::Suspend { name: ref n } => {
            client.suspend(name(n)).await.map(|r| r.into_inner().tenant)
        }
        Command::Resume { name: ref n } => {
            client.resume(name(n)).await.map(|r| r.into_inner().tenant)
        }
        Command::Delete { name: ref n } => {
            client.delete(name(n)).await.map(|r| r.into_inner().tenant)
        }
        Command::Undelete { name: ref n } => client
            .undelete(name(n))
            .await
            .map(|r| r.into_inner().tenant),
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
