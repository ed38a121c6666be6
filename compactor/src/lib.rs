//! The compactor: tails journal shards, keeps a memstore replica per tenant, writes checkpoints
//! to object storage, publishes manifests, trims the journal (see README.md).

pub mod auto_compaction;
pub mod catalog;
pub mod clock;
pub mod config;
pub mod error;
pub mod etcd_snapshot;
pub mod journal_source;
pub mod purge;
pub mod reader;
pub mod restore;
pub mod shard;
pub mod source;
pub mod store;

use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinSet;

pub use catalog::Catalog;
pub use config::Config;
pub use error::{Error, Result};
pub use shard::ShardStatus;
pub use source::{Journal, MemJournal};

/// A running compactor: one loop per owned shard.
pub struct Compactor {
    shutdown: watch::Sender<bool>,
    tasks: JoinSet<()>,
    status: Vec<(u32, watch::Receiver<ShardStatus>)>,
}

impl Compactor {
    /// Starts one loop per shard of `config` (validated by the caller: `Config::validate`).
    pub fn spawn<J: Journal>(config: Config, journal: J, catalog: Catalog) -> Self {
        let config = Arc::new(config);
        let (shutdown, shutdown_rx) = watch::channel(false);
        let mut tasks = JoinSet::new();
        let mut status = Vec::new();
        for &shard in &config.shards {
            let (tx, rx) = watch::channel(ShardStatus {
                shard,
                ..ShardStatus::default()
            });
            let worker = shard::ShardWorker {
                shard,
                journal: journal.clone(),
                catalog: catalog.clone(),
                config: config.clone(),
                status: tx,
            };
            tasks.spawn(worker.run(shutdown_rx.clone()));
            status.push((shard, rx));
        }
        Self {
            shutdown,
            tasks,
            status,
        }
    }

    /// Progress of `shard`'s loop, updated as it goes.
    pub fn status(&self, shard: u32) -> Option<watch::Receiver<ShardStatus>> {
        self.status
            .iter()
            .find(|(s, _)| *s == shard)
            .map(|(_, rx)| rx.clone())
    }

    /// Stops every loop (an upload in flight is abandoned: its object, if complete, is unnamed
    /// and collected later) and waits for them.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        while self.tasks.join_next().await.is_some() {}
    }

    /// Waits until every loop ended (they end only on shutdown).
    pub async fn wait(&mut self) {
        while self.tasks.join_next().await.is_some() {}
    }
}
