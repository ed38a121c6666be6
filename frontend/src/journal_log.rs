//! `Log` over the real journal: `journal::client::JournalClient`, with its errors classified
//! into the frontend's `LogError`, and the tail read from the shard's leader where it can be.

use std::sync::Arc;

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

/// How long opening a tail waits for the shard to have a leader before it reads from any node.
pub const LEADER_WAIT: std::time::Duration = std::time::Duration::from_secs(3);
/// Pause between two questions for the leader while waiting.
pub const LEADER_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// How often a tail opened at the leader asks whether the leader is still the same node; when
/// it moved, the stream ends and the replica re-opens it (at the new leader).
pub const LEADER_RECHECK: std::time::Duration = std::time::Duration::from_secs(2);

/// `stream`, ended cleanly once `current()` (asked every `every`) names a leader other than
/// `leader`: after a leader change (a rolling restart of the journal, say) the tail would
/// otherwise stay on a follower until its stream broke. An unknown or empty answer (an
/// election under way, a node unreachable) changes nothing.
fn until_leader_moves<S, F, Fut>(
    stream: S,
    leader: String,
    current: F,
    every: std::time::Duration,
) -> RecordStream
where
    S: futures::Stream<Item = Result<api::strata::journal::Record, LogError>> + Send + 'static,
    F: Fn() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Option<String>> + Send + 'static,
{
    let moved = async move {
        loop {
            tokio::time::sleep(every).await;
            if let Some(now) = current().await
                && !now.is_empty()
                && host_port(&now) != host_port(&leader)
            {
                tracing::info!(from = %leader, to = %now, "journal leader moved; re-opening the tail there");
                return;
            }
        }
    };
    stream.take_until(moved).boxed()
}

/// `host:port` of an endpoint given as `host:port` or `http(s)://host:port[/]`.
fn host_port(endpoint: &str) -> &str {
    let e = endpoint
        .strip_prefix("http://")
        .or_else(|| endpoint.strip_prefix("https://"))
        .unwrap_or(endpoint);
    e.trim_end_matches('/')
}

/// `endpoints` with the one naming `leader` (a journal node's `host:port`) moved to the front;
/// `None` if none of them names it.
fn leader_first(endpoints: &[String], leader: &str) -> Option<Vec<String>> {
    let at = endpoints
        .iter()
        .position(|e| host_port(e) == host_port(leader))?;
    let mut ordered = endpoints.to_vec();
    let l = ordered.remove(at);
    ordered.insert(0, l);
    Some(ordered)
}

/// The real journal, through its client.
#[derive(Clone)]
pub struct JournalLog {
    client: journal::client::JournalClient,
    endpoints: Vec<String>,
    tail_from_leader: bool,
    /// Internal TLS, for every connection to the journal.
    tls: Option<Arc<journal::tls::InternalTls>>,
}

impl JournalLog {
    /// A client of the nodes at `endpoints` whose tails start at the shard's leader.
    pub async fn connect(endpoints: &[String]) -> Result<Self, LogError> {
        Self::connect_with(endpoints, true, None).await
    }

    /// A client of the nodes at `endpoints`; `tail_from_leader` as `--tail-from-leader`, over
    /// internal TLS if `tls` is given.
    pub async fn connect_with(
        endpoints: &[String],
        tail_from_leader: bool,
        tls: Option<Arc<journal::tls::InternalTls>>,
    ) -> Result<Self, LogError> {
        let client = journal::client::JournalClient::connect_over(endpoints, tls.clone())
            .await
            .map_err(classify)?;
        Ok(Self {
            client,
            endpoints: endpoints.to_vec(),
            tail_from_leader,
            tls,
        })
    }

    /// A client whose first read goes to `shard`'s current leader: the leader applies an entry
    /// as it commits it, while a follower learns of the commit only with the leader's next
    /// message, so a tail from a follower hands this frontend its own writes later (under a
    /// 256-client put load a write waited 5 ms on average, p90 up to 20 ms, for its own
    /// replica after the journal had answered it: docs/benchmarks/frontend.md, session 5).
    /// The client's failover is unchanged: when that stream breaks it moves on to the other
    /// nodes. `None` when the leader is unknown or not among the configured endpoints.
    async fn leader_reader(&self, shard: u32) -> Option<(journal::client::JournalClient, String)> {
        if !self.tail_from_leader {
            return None;
        }
        // A journal that just started may not have elected a leader yet: ask again a few times
        // rather than tail from a follower for the frontend's whole life.
        let deadline = tokio::time::Instant::now() + LEADER_WAIT;
        let leader = loop {
            match self.client.status(shard).await {
                Ok(s) if !s.leader_addr.is_empty() => break s.leader_addr,
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(shard, error = %e, "no journal status; tailing from any node");
                    return None;
                }
            }
            if tokio::time::Instant::now() + LEADER_POLL > deadline {
                return None;
            }
            tokio::time::sleep(LEADER_POLL).await;
        };
        let ordered = leader_first(&self.endpoints, &leader)?;
        tracing::debug!(shard, %leader, "tailing the journal from the shard's leader");
        let client = journal::client::JournalClient::connect_over(&ordered, self.tls.clone())
            .await
            .ok()?;
        Some((client, leader))
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
            let Some((client, leader)) = self.leader_reader(shard).await else {
                let stream = self.client.read(shard, from).await.map_err(classify)?;
                return Ok(stream.map(|r| r.map_err(classify)).boxed());
            };
            let stream = client.read(shard, from).await.map_err(classify)?;
            let status = self.client.clone();
            let current = move || {
                let status = status.clone();
                async move { status.status(shard).await.ok().map(|s| s.leader_addr) }
            };
            Ok(until_leader_moves(
                stream.map(|r| r.map_err(classify)),
                leader,
                current,
                LEADER_RECHECK,
            ))
        })
    }

    fn read_index(&self, shard: u32) -> BoxFuture<'_, Result<u64, LogError>> {
        Box::pin(async move { self.client.read_index(shard).await.map_err(classify) })
    }

    fn status(&self, shard: u32) -> BoxFuture<'_, Result<StatusResponse, LogError>> {
        Box::pin(async move { self.client.status(shard).await.map_err(classify) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn eps(list: &[&str]) -> Vec<String> {
        list.iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn the_leader_goes_first_whatever_the_endpoint_spelling() {
        let e = eps(&["127.0.0.1:1", "http://127.0.0.1:2/", "127.0.0.1:3"]);
        assert_eq!(
            leader_first(&e, "127.0.0.1:2").unwrap(),
            eps(&["http://127.0.0.1:2/", "127.0.0.1:1", "127.0.0.1:3"])
        );
        assert_eq!(
            leader_first(&e, "http://127.0.0.1:3").unwrap(),
            eps(&["127.0.0.1:3", "127.0.0.1:1", "http://127.0.0.1:2/"])
        );
        assert_eq!(leader_first(&e, "127.0.0.1:1").unwrap(), e);
    }

    fn record(index: u64) -> Result<api::strata::journal::Record, LogError> {
        Ok(api::strata::journal::Record {
            index,
            ..Default::default()
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_tail_ends_when_the_leader_moves_and_not_before() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let asked = Arc::new(AtomicUsize::new(0));
        let answers = asked.clone();
        // Same leader (other spelling), no answer, an empty one, then another node.
        let current = move || {
            let n = answers.fetch_add(1, Ordering::SeqCst);
            async move {
                match n {
                    0 => Some("http://127.0.0.1:1".to_string()),
                    1 => None,
                    2 => Some(String::new()),
                    _ => Some("127.0.0.1:2".to_string()),
                }
            }
        };
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let every = std::time::Duration::from_secs(2);
        let mut s = until_leader_moves(rx, "127.0.0.1:1".into(), current, every);
        tx.unbounded_send(record(1)).unwrap();
        assert_eq!(s.next().await.unwrap().unwrap().index, 1);
        // Three checks that must not end it; records keep flowing between them.
        for i in 2..5 {
            tokio::time::sleep(every).await;
            tx.unbounded_send(record(i)).unwrap();
            assert_eq!(s.next().await.unwrap().unwrap().index, i);
        }
        assert_eq!(asked.load(Ordering::SeqCst), 3);
        // The fourth check names another node: the stream ends though its source is open.
        assert!(s.next().await.is_none());
        assert_eq!(asked.load(Ordering::SeqCst), 4);
        drop(tx);
    }

    #[test]
    fn an_unknown_or_empty_leader_changes_nothing() {
        let e = eps(&["127.0.0.1:1", "127.0.0.1:2"]);
        assert!(leader_first(&e, "10.0.0.9:1").is_none());
        assert!(leader_first(&e, "").is_none());
    }
}
