//! `strata`: the one binary. Each subcommand lives in its own module, which owns its flags
//! (`Args`, whose doc comments are the `--help`) and its `run`.

mod admin;
mod bench;
mod compactor;
mod dev;
mod dev_tls;
mod frontend;
mod journal;
mod metrics_http;
mod tenant_admin;

use clap::{Parser, Subcommand};

/// mimalloc instead of glibc's malloc for every subcommand: under load a frontend spent ~18% of
/// its CPU in glibc's allocator (arena locking, chunk consolidation); docs/frontend.md has the
/// before/after figures.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Strata: an etcd v3 compatible, multi-tenant store built from a quorum-replicated journal,
/// stateless frontends and a compactor that checkpoints to object storage.
#[derive(Parser)]
#[command(name = "strata", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one journal node (one Raft group per shard, segment storage on local disk).
    Journal(journal::Args),
    /// Run a stateless frontend serving the etcd v3 API.
    Frontend(Box<frontend::Args>),
    /// Run the compactor: checkpoints to object storage, then journal trims.
    Compactor(compactor::Args),
    /// Start a whole local deployment (3 journal nodes, a frontend, a compactor) on 127.0.0.1.
    Dev(dev::Args),
    /// Administer a deployment: tenants, backups.
    Admin(admin::Args),
    /// Benchmark any etcd v3 endpoint (Strata or etcd), modelled on etcd's benchmark tool.
    Bench(bench::Args),
}

fn init_tracing() {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("STRATA_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

fn main() -> anyhow::Result<()> {
    // One process-wide crypto provider (aws-lc-rs), chosen before anything builds a TLS config:
    // see DEPENDENCIES.md, "TLS".
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    init_tracing();
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        match cli.command {
            Command::Journal(args) => journal::run(args).await,
            Command::Frontend(args) => frontend::run(*args).await,
            Command::Compactor(args) => compactor::run(args).await,
            Command::Dev(args) => dev::run(args).await,
            Command::Admin(args) => admin::run(args).await,
            Command::Bench(args) => bench::run(args).await,
        }
    })
}
