//! `Log` over the real journal: `journal::client::JournalClient`, with its errors classified
//! into the frontend's `LogError`.

use api::strata::journal::StatusResponse;
use futures::StreamExt;
use futures::future::BoxFuture;

use crate::log::{Log, LogError, RecordStream};

fn classify(e: journal::client::ClientError) -> LogError {
    match e {
        journal::client::ClientError::Trimmed { first_index, .. } => {
            LogError::Trimmed { first_index }
        }
        other => LogError::Unavailable(other.to_string()),
    }
}

/// The real journal, through its client.
#[derive(Clone)]
pub struct JournalLog {
    client: journal::client::JournalClient,
}

impl JournalLog {
    pub async fn connect(endpoints: &[String]) -> Result<Self, LogError> {
        let client = journal::client::JournalClient::connect(endpoints)
            .await
            .map_err(classify)?;
        Ok(Self { client })
    }
}

impl Log for JournalLog {
    fn append(
        &self,
        shard: u32,
        payloads: Vec<Vec<u8>>,
    ) -> BoxFuture<'_, Result<Vec<u64>, LogError>> {
        Box::pin(async move { self.client.append(shard, payloads).await.map_err(classify) })
    }

    fn read(&self, shard: u32, from: u64) -> BoxFuture<'_, Result<RecordStream, LogError>> {
        Box::pin(async move {
            let stream = self.client.read(shard, from).await.map_err(classify)?;
            Ok(stream.map(|r| r.map_err(classify)).boxed())
        })
    }

    fn read_index(&self, shard: u32) -> BoxFuture<'_, Result<u64, LogError>> {
        Box::pin(async move { self.client.read_index(shard).await.map_err(classify) })
    }

    fn status(&self, shard: u32) -> BoxFuture<'_, Result<StatusResponse, LogError>> {
        Box::pin(async move { self.client.status(shard).await.map_err(classify) })
    }
}
