//! Strata's journal: the quorum-replicated, totally ordered log of every shard. Owns the
//! segment storage engine, the openraft glue (log store, state machine, network), the node
//! (stamping, ticks, ReadIndex, trims, membership) with its gRPC services, and the client.
//! It never learns what an etcd request is: payloads are opaque bytes.

pub mod catch_up;
pub mod client;
pub mod clock;
pub mod config;
pub mod error;
pub mod failpoint;
pub mod gate;
pub mod handoff;
pub mod lease;
pub mod log_store;
pub mod meta;
pub mod metrics;
pub mod network;
pub mod node;
pub mod segment;
pub mod service;
pub mod state_machine;
pub mod tls;
pub mod types;

pub use client::{ClientError, JournalClient, ReadStream};
pub use node::{JournalNode, NodeConfig, NodeError};
