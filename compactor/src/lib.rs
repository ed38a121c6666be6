//! The compactor: tails journal shards, keeps a memstore replica per tenant, writes checkpoints
//! to object storage, publishes manifests, trims the journal (see README.md).

pub mod catalog;
pub mod error;
pub mod store;

pub use error::{Error, Result};
pub mod source;
