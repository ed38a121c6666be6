//! The stateless frontend: etcd's v3 API (KV, Watch, Lease, Cluster, Maintenance, Auth) served
//! from a per-tenant memstore replica rebuilt from the journal; writes journalled as intents,
//! linearizable reads through shared read-index rounds. See README.md and docs/frontend.md.

pub mod admin;
pub mod auth;
pub mod authority;
pub mod catalogue;
pub mod checkpoint;
pub mod cluster;
pub mod coalesce;
pub mod concurrency;
pub mod config;
pub mod errors;
pub mod fast_kv;
pub mod gateway;
pub mod http;
pub mod journal_log;
pub mod kv;
pub mod lease;
pub mod log;
pub mod maintenance;
pub mod metrics;
pub mod quota;
pub mod read_index;
pub mod read_txn;
pub mod replica;
pub mod rpc;
pub mod server;
pub mod shared_tail;
pub mod snapshot;
pub mod tenant;
pub mod tenants;
pub mod tls;
pub mod token;
pub mod watch;
pub mod writer;

pub use config::Config;
pub use server::{Frontend, ServeError};
