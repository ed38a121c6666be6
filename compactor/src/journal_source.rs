//! `Journal` over the real journal cluster: `journal::client::JournalClient`.

use futures::StreamExt;
use journal::client::{ClientError, JournalClient};

use crate::error::{Error, Result};
use crate::source::{Journal, RecordStream};

fn map(shard: u32, wanted: u64, e: ClientError) -> Error {
    match e {
        ClientError::Trimmed { first_index, .. } => Error::Trimmed {
            shard,
            wanted,
            first_index,
        },
        other => Error::Journal {
            shard,
            reason: other.to_string(),
        },
    }
}

impl Journal for JournalClient {
    async fn read(&self, shard: u32, from: u64) -> Result<RecordStream> {
        let stream = JournalClient::read(self, shard, from)
            .await
            .map_err(|e| map(shard, from, e))?;
        Ok(stream
            .map(move |r| r.map_err(|e| map(shard, from, e)))
            .boxed())
    }

    async fn trim(&self, shard: u32, below: u64) -> Result<u64> {
        JournalClient::trim(self, shard, below)
            .await
            .map_err(|e| map(shard, below, e))
    }

    async fn first_index(&self, shard: u32) -> Result<u64> {
        let status = JournalClient::status(self, shard)
            .await
            .map_err(|e| map(shard, 0, e))?;
        Ok(status.first_index)
    }

    async fn append_entries(&self, shard: u32, payloads: Vec<Vec<u8>>) -> Result<Vec<u64>> {
        JournalClient::append(self, shard, payloads)
            .await
            .map_err(|e| map(shard, 0, e))
    }
}
