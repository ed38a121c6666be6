//! The journal client: finds and follows each shard's leader, retries what is safe to retry
//! (payloads carry request ids, so a retried append is applied once downstream), and tails a
//! shard across node failures.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use api::strata::journal::journal_admin_client::JournalAdminClient;
use api::strata::journal::journal_client::JournalClient as GrpcClient;
use api::strata::journal::{
    AppendRequest, ReadIndexRequest, ReadRequest, Record, ReplaceNodeRequest, StatusRequest,
    StatusResponse, TrimRequest,
};
use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use crate::error::{ERROR_KIND_METADATA, FIRST_INDEX_METADATA, LEADER_METADATA};
use crate::log_store::lock;

/// How long a call keeps retrying (leader changes, restarts) before giving up.
pub const RETRY_DEADLINE: Duration = Duration::from_secs(30);
/// Timeout of one unary attempt.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
/// Timeout of connecting to a node.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// First and largest pause between attempts.
pub const BACKOFF_MIN: Duration = Duration::from_millis(20);
pub const BACKOFF_MAX: Duration = Duration::from_millis(500);
/// Records buffered between a tailing stream's task and its consumer.
pub const READ_BUFFER_RECORDS: usize = 4096;
/// Largest message the client accepts or sends.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// Why a journal call failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClientError {
    #[error("no journal endpoints given")]
    NoEndpoints,
    #[error("invalid journal endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint { endpoint: String, reason: String },
    #[error(
        "shard {shard}: records below {first_index} were trimmed; the first retained index is {first_index}"
    )]
    Trimmed { shard: u32, first_index: u64 },
    #[error("unknown journal shard {shard}: {message}")]
    UnknownShard { shard: u32, message: String },
    #[error("rejected by the journal: {0}")]
    Rejected(String),
    #[error("journal unavailable for shard {shard} after retrying: {last}")]
    Unavailable { shard: u32, last: String },
    #[error("journal error: {0}")]
    Server(String),
}

impl ClientError {
    /// True if the same call may succeed later (the journal was unavailable).
    pub fn is_retryable(&self) -> bool {
        matches!(self, ClientError::Unavailable { .. })
    }
}

/// A client of a journal cluster. Cheap to clone.
#[derive(Clone)]
pub struct JournalClient {
    inner: Arc<Inner>,
}

struct Inner {
    endpoints: Vec<String>,
    channels: Mutex<HashMap<String, Channel>>,
    leaders: Mutex<HashMap<u32, String>>,
    next: AtomicUsize,
}

fn normalise(endpoint: &str) -> String {
    if endpoint.starts_with("http://") || endpoint.starts_with("https://") {
        endpoint.to_string()
    } else {
        format!("http://{endpoint}")
    }
}

/// What to do after a failed attempt.
enum Next {
    /// Permanent: give this error to the caller.
    Fail(ClientError),
    /// Try the given leader address at once.
    Redirect(String),
    /// Try another node after a pause.
    Retry(String),
}

fn classify(shard: u32, s: &Status) -> Next {
    let kind = s
        .metadata()
        .get(ERROR_KIND_METADATA)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    match s.code() {
        Code::FailedPrecondition if kind == "not-leader" => {
            match s
                .metadata()
                .get(LEADER_METADATA)
                .and_then(|v| v.to_str().ok())
            {
                Some(addr) if !addr.is_empty() => Next::Redirect(normalise(addr)),
                _ => Next::Retry(s.message().to_string()),
            }
        }
        Code::OutOfRange => {
            let first_index = s
                .metadata()
                .get(FIRST_INDEX_METADATA)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            Next::Fail(ClientError::Trimmed { shard, first_index })
        }
        Code::NotFound if kind == "unknown-shard" => Next::Fail(ClientError::UnknownShard {
            shard,
            message: s.message().to_string(),
        }),
        Code::InvalidArgument => Next::Fail(ClientError::Rejected(s.message().to_string())),
        Code::Internal if kind == "storage" => Next::Retry(s.message().to_string()),
        Code::Unavailable
        | Code::DeadlineExceeded
        | Code::Cancelled
        | Code::Unknown
        | Code::Aborted
        | Code::ResourceExhausted
        | Code::Internal => Next::Retry(format!("{}: {}", s.code(), s.message())),
        _ => Next::Fail(ClientError::Server(s.to_string())),
    }
}

impl JournalClient {
    /// A client of the nodes at `endpoints` (`host:port` or `http://host:port`). Connections are
    /// made lazily; this fails only on malformed endpoints.
    pub async fn connect(endpoints: &[String]) -> Result<Self, ClientError> {
        if endpoints.is_empty() {
            return Err(ClientError::NoEndpoints);
        }
        let endpoints: Vec<String> = endpoints.iter().map(|e| normalise(e)).collect();
        let inner = Inner {
            endpoints,
            channels: Mutex::new(HashMap::new()),
            leaders: Mutex::new(HashMap::new()),
            next: AtomicUsize::new(0),
        };
        for e in &inner.endpoints {
            inner.channel(e)?;
        }
        Ok(JournalClient {
            inner: Arc::new(inner),
        })
    }

    /// Appends `payloads` to `shard`; returns their indexes once they are durable on a
    /// majority. Follows the leader and retries through leader changes for up to
    /// `RETRY_DEADLINE` (a payload may then be stored twice: entries carry request ids).
    pub async fn append(
        &self,
        shard: u32,
        payloads: Vec<Vec<u8>>,
    ) -> Result<Vec<u64>, ClientError> {
        if payloads.is_empty() {
            return Ok(Vec::new());
        }
        self.unary(shard, true, |mut c| {
            let req = AppendRequest {
                shard,
                payloads: payloads.clone(),
            };
            async move { c.append(timed(req)).await.map(|r| r.into_inner().indexes) }
        })
        .await
    }

    /// An index safe for a linearizable read of `shard` (confirmed by the leader with a quorum).
    pub async fn read_index(&self, shard: u32) -> Result<u64, ClientError> {
        self.unary(shard, true, |mut c| async move {
            c.read_index(timed(ReadIndexRequest { shard }))
                .await
                .map(|r| r.into_inner().index)
        })
        .await
    }

    /// Drops records below `below` on every node; returns the first retained index.
    pub async fn trim(&self, shard: u32, below: u64) -> Result<u64, ClientError> {
        self.unary(shard, true, |mut c| async move {
            c.trim(timed(TrimRequest { shard, below }))
                .await
                .map(|r| r.into_inner().first_index)
        })
        .await
    }

    /// Status of `shard` as the leader (or, failing that, any node) sees it.
    pub async fn status(&self, shard: u32) -> Result<StatusResponse, ClientError> {
        self.unary(shard, false, |mut c| async move {
            c.status(timed(StatusRequest { shard }))
                .await
                .map(|r| r.into_inner())
        })
        .await
    }

    /// Status of `shard` as the node at `endpoint` sees it (no retries).
    pub async fn status_of(
        &self,
        endpoint: &str,
        shard: u32,
    ) -> Result<StatusResponse, ClientError> {
        let ch = self.inner.channel(&normalise(endpoint))?;
        let mut c = grpc(ch);
        c.status(timed(StatusRequest { shard }))
            .await
            .map(|r| r.into_inner())
            .map_err(|s| ClientError::Server(s.to_string()))
    }

    /// Replaces `remove_id` by `add_id` (at `add_addr`) in the voters of `shard`: the new node
    /// is added as a learner, catches up, then one joint change swaps the two.
    pub async fn replace_node(
        &self,
        shard: u32,
        remove_id: u64,
        add_id: u64,
        add_addr: &str,
    ) -> Result<Vec<u64>, ClientError> {
        let add_addr = add_addr.to_string();
        self.unary_admin(shard, move |ch| {
            let req = ReplaceNodeRequest {
                shard,
                remove_id,
                add_id,
                add_addr: add_addr.clone(),
            };
            async move {
                let mut c = JournalAdminClient::new(ch);
                let mut r = tonic::Request::new(req);
                r.set_timeout(RETRY_DEADLINE * 4);
                c.replace_node(r).await.map(|r| r.into_inner().voters)
            }
        })
        .await
    }

    /// Tails `shard` from `from`: every committed record in index order, gap-free, then new
    /// ones as they commit; endless. Reconnects to another node when one fails. Fails at once
    /// (or as the stream's last item) with `Trimmed` if `from` is below the trim point.
    pub async fn read(
        &self,
        shard: u32,
        from: u64,
    ) -> Result<impl Stream<Item = Result<Record, ClientError>> + Send + 'static, ClientError> {
        let first = self.open_read(shard, from).await?;
        let (tx, rx) = mpsc::channel(READ_BUFFER_RECORDS);
        let this = self.clone();
        tokio::spawn(async move { this.tail(shard, from, first, tx).await });
        Ok(tokio_stream::wrappers::ReceiverStream::new(rx))
    }

    async fn open_read(
        &self,
        shard: u32,
        from: u64,
    ) -> Result<tonic::Streaming<api::strata::journal::ReadResponse>, ClientError> {
        self.unary(shard, false, |mut c| async move {
            c.read(ReadRequest { shard, from })
                .await
                .map(|r| r.into_inner())
        })
        .await
    }

    async fn tail(
        &self,
        shard: u32,
        mut next: u64,
        mut stream: tonic::Streaming<api::strata::journal::ReadResponse>,
        tx: mpsc::Sender<Result<Record, ClientError>>,
    ) {
        loop {
            let item = tokio::select! {
                i = stream.next() => i,
                _ = tx.closed() => return,
            };
            match item {
                Some(Ok(batch)) => {
                    let mut in_order = true;
                    for r in batch.records {
                        if r.index != next {
                            // Never deliver a gap or a repeat; resume from what we expect.
                            tracing::warn!(
                                shard,
                                got = r.index,
                                expected = next,
                                "journal read out of order; reconnecting"
                            );
                            in_order = false;
                            break;
                        }
                        next += 1;
                        if tx.send(Ok(r)).await.is_err() {
                            return;
                        }
                    }
                    if in_order {
                        continue;
                    }
                }
                Some(Err(s)) => {
                    if let Next::Fail(e) = classify(shard, &s) {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                    tracing::debug!(shard, status = %s, "journal read stream failed; reconnecting");
                }
                None => tracing::debug!(shard, "journal read stream ended; reconnecting"),
            }
            // Reconnect, preferring another node than the one that just failed.
            self.inner.next.fetch_add(1, Ordering::Relaxed);
            loop {
                match self.open_read(shard, next).await {
                    Ok(s) => {
                        stream = s;
                        break;
                    }
                    Err(e) if e.is_retryable() => {
                        if tx.is_closed() {
                            return;
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                }
            }
        }
    }

    /// Runs `call` against the shard's leader (or any node if `leader` is false), following
    /// redirects and retrying retryable failures until `RETRY_DEADLINE`.
    async fn unary<T, F, Fut>(&self, shard: u32, leader: bool, call: F) -> Result<T, ClientError>
    where
        F: Fn(GrpcClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<T, Status>>,
    {
        self.retrying(shard, leader, |ch| call(grpc(ch))).await
    }

    async fn unary_admin<T, F, Fut>(&self, shard: u32, call: F) -> Result<T, ClientError>
    where
        F: Fn(Channel) -> Fut,
        Fut: std::future::Future<Output = Result<T, Status>>,
    {
        self.retrying(shard, true, call).await
    }

    async fn retrying<T, F, Fut>(&self, shard: u32, leader: bool, call: F) -> Result<T, ClientError>
    where
        F: Fn(Channel) -> Fut,
        Fut: std::future::Future<Output = Result<T, Status>>,
    {
        let deadline = Instant::now() + RETRY_DEADLINE;
        let mut backoff = BACKOFF_MIN;
        let mut target = if leader {
            lock(&self.inner.leaders).get(&shard).cloned()
        } else {
            None
        }
        .unwrap_or_else(|| self.inner.pick());
        let mut redirects = 0;
        loop {
            let ch = self.inner.channel(&target)?;
            let last = match call(ch).await {
                Ok(v) => {
                    if leader {
                        lock(&self.inner.leaders).insert(shard, target);
                    }
                    return Ok(v);
                }
                Err(s) => match classify(shard, &s) {
                    Next::Fail(e) => return Err(e),
                    Next::Redirect(addr) if redirects < self.inner.endpoints.len() + 2 => {
                        redirects += 1;
                        lock(&self.inner.leaders).insert(shard, addr.clone());
                        target = addr;
                        continue;
                    }
                    Next::Redirect(_) => "leader redirects go in circles".to_string(),
                    Next::Retry(why) => why,
                },
            };
            lock(&self.inner.leaders).remove(&shard);
            if Instant::now() + backoff > deadline {
                return Err(ClientError::Unavailable { shard, last });
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
            redirects = 0;
            target = self.inner.pick();
        }
    }
}

fn timed<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(ATTEMPT_TIMEOUT);
    r
}

fn grpc(ch: Channel) -> GrpcClient<Channel> {
    GrpcClient::new(ch)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES)
}

impl Inner {
    fn pick(&self) -> String {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        self.endpoints[i % self.endpoints.len()].clone()
    }

    fn channel(&self, endpoint: &str) -> Result<Channel, ClientError> {
        let mut map = lock(&self.channels);
        if let Some(c) = map.get(endpoint) {
            return Ok(c.clone());
        }
        let ch = Endpoint::from_shared(endpoint.to_string())
            .map_err(|e| ClientError::InvalidEndpoint {
                endpoint: endpoint.to_string(),
                reason: e.to_string(),
            })?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(5))
            .connect_lazy();
        map.insert(endpoint.to_string(), ch.clone());
        Ok(ch)
    }
}
