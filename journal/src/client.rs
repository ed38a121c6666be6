//! The journal client: finds and follows each shard's leader, retries what is safe to retry
//! (payloads carry request ids, so a retried append is applied once downstream), and tails a
//! shard across node failures.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use api::strata::journal::journal_admin_client::JournalAdminClient;
use api::strata::journal::journal_client::JournalClient as GrpcClient;
use api::strata::journal::{
    AppendError, AppendRequest, AppendStreamRequest, AppendStreamResponse, HandoffRequest,
    HandoffResponse, ReadIndexRequest, ReadRequest, Record, ReplaceNodeRequest, StatusRequest,
    StatusResponse, TrimRequest,
};
use futures::{Stream, StreamExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::time::Instant;
use tonic::metadata::{MetadataKey, MetadataMap};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use crate::error::{ERROR_KIND_METADATA, FIRST_INDEX_METADATA, LEADER_METADATA};
use crate::log_store::lock;
use crate::tls::InternalTls;

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
/// Payload bytes buffered between a tailing stream's task and its consumer, whatever the
/// count: 4,096 records of a restore's 1 MiB chunks would be 4 GiB. A record larger than this
/// alone still passes, on its own.
pub const READ_BUFFER_BYTES: usize = 64 * 1024 * 1024;

/// Appends queued on one node's append stream before a caller waits to send.
pub const APPEND_STREAM_QUEUE: usize = 1024;
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

/// A record (or the read's failure) on its way to the consumer, with the share of
/// `READ_BUFFER_BYTES` it holds until taken.
type Buffered = (Result<Record, ClientError>, Option<OwnedSemaphorePermit>);

/// A journal shard's records from [`JournalClient::read`], read ahead of the consumer within a
/// bound of records and bytes.
pub struct ReadStream {
    rx: mpsc::Receiver<Buffered>,
    budget: Arc<Semaphore>,
    limit: usize,
}

impl ReadStream {
    /// Records read ahead and not yet taken, and the bytes they hold (with a record about to
    /// join them).
    pub fn read_ahead(&self) -> (usize, usize) {
        (self.rx.len(), self.limit - self.budget.available_permits())
    }
}

impl Stream for ReadStream {
    type Item = Result<Record, ClientError>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        // A record's bytes leave the buffer as the consumer takes it.
        self.rx.poll_recv(cx).map(|item| item.map(|(r, _bytes)| r))
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
    /// One `AppendStream` per node, shared by every append sent there.
    sessions: Mutex<HashMap<String, Arc<AppendSession>>>,
    /// Nodes that answered `AppendStream` with UNIMPLEMENTED (an older journal): unary appends.
    unary_only: Mutex<HashSet<String>>,
    /// False: every append is a unary `Append` call (`connect_unary_appends`).
    append_stream: bool,
    /// Internal TLS: every node is dialled over it (None: plaintext).
    tls: Option<Arc<InternalTls>>,
}

/// Callers waiting for the answer to their append, by the sequence number sent with it.
type Waiters = HashMap<u64, oneshot::Sender<Answer>>;
/// What a caller of an append stream gets back: the unary call's result.
type Answer = Result<Vec<u64>, Status>;

/// One long-lived `AppendStream` to one node: appends go out tagged with a sequence number,
/// answers come back in any order and wake the caller that waits for that number. When the
/// stream fails, every waiting caller gets the failure (as a unary call would) and the next
/// append opens a new stream.
struct AppendSession {
    tx: mpsc::Sender<AppendStreamRequest>,
    next_seq: AtomicU64,
    /// `None` once the stream failed: no caller may wait on it any more.
    waiters: Mutex<Option<Waiters>>,
}

impl AppendSession {
    /// A sequence number and the receiver of its answer; fails if the stream already failed.
    fn register(&self) -> Result<(u64, oneshot::Receiver<Answer>), Status> {
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        match lock(&self.waiters).as_mut() {
            Some(w) => {
                w.insert(seq, tx);
                Ok((seq, rx))
            }
            None => Err(Status::unavailable("journal append stream closed")),
        }
    }

    fn forget(&self, seq: u64) {
        if let Some(w) = lock(&self.waiters).as_mut() {
            w.remove(&seq);
        }
    }

    fn answer(&self, resp: AppendStreamResponse) {
        let waiter = lock(&self.waiters)
            .as_mut()
            .and_then(|w| w.remove(&resp.seq));
        if let Some(w) = waiter {
            let _ = w.send(match resp.error {
                None => Ok(resp.indexes),
                Some(e) => Err(status_from(e)),
            });
        }
    }

    /// The stream failed: every waiting caller gets `status`, later ones are refused.
    fn fail_all(&self, status: &Status) {
        let waiters = lock(&self.waiters).take().unwrap_or_default();
        for (_, w) in waiters {
            let _ = w.send(Err(status.clone()));
        }
    }
}

/// The status a unary `Append` would have failed with, from a stream's per-append error.
fn status_from(e: AppendError) -> Status {
    let mut md = MetadataMap::new();
    for (k, v) in e.metadata {
        if let (Ok(k), Ok(v)) = (MetadataKey::from_bytes(k.as_bytes()), v.parse()) {
            md.insert(k, v);
        }
    }
    Status::with_metadata(Code::from_i32(e.code), e.message, md)
}

/// Drives `session`'s stream to the node at `endpoint` until it fails or the client is gone.
async fn run_session(
    inner: Weak<Inner>,
    endpoint: String,
    ch: Channel,
    session: Arc<AppendSession>,
    rx: mpsc::Receiver<AppendStreamRequest>,
) {
    let outbound = tokio_stream::wrappers::ReceiverStream::new(rx);
    let failure = match grpc(ch).append_stream(outbound).await {
        Err(s) => {
            if s.code() == Code::Unimplemented
                && let Some(inner) = inner.upgrade()
            {
                tracing::info!(%endpoint, "journal node has no append stream; using unary appends");
                lock(&inner.unary_only).insert(endpoint.clone());
            }
            s
        }
        Ok(resp) => {
            let mut inbound = resp.into_inner();
            loop {
                match inbound.next().await {
                    Some(Ok(r)) => session.answer(r),
                    Some(Err(s)) => break s,
                    None => break Status::unavailable("journal append stream ended"),
                }
            }
        }
    };
    tracing::debug!(%endpoint, status = %failure, "journal append stream closed");
    // Out of the map first, so that callers from now on open a fresh stream.
    if let Some(inner) = inner.upgrade() {
        let mut sessions = lock(&inner.sessions);
        // Only itself: a newer session to the same node may already have taken its place.
        if sessions
            .get(&endpoint)
            .is_some_and(|s| Arc::ptr_eq(s, &session))
        {
            sessions.remove(&endpoint);
        }
    }
    session.fail_all(&failure);
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
        Self::connect_with(endpoints, true, None).await
    }

    /// `connect`, over internal TLS if `tls` is given (the nodes must serve it).
    pub async fn connect_over(
        endpoints: &[String],
        tls: Option<Arc<InternalTls>>,
    ) -> Result<Self, ClientError> {
        Self::connect_with(endpoints, true, tls).await
    }

    /// A client like `connect`'s whose appends are each one unary `Append` call instead of a
    /// message on the node's shared `AppendStream` (for measuring one against the other).
    pub async fn connect_unary_appends(
        endpoints: &[String],
        tls: Option<Arc<InternalTls>>,
    ) -> Result<Self, ClientError> {
        Self::connect_with(endpoints, false, tls).await
    }

    async fn connect_with(
        endpoints: &[String],
        append_stream: bool,
        tls: Option<Arc<InternalTls>>,
    ) -> Result<Self, ClientError> {
        if endpoints.is_empty() {
            return Err(ClientError::NoEndpoints);
        }
        let endpoints: Vec<String> = endpoints.iter().map(|e| normalise(e)).collect();
        let inner = Inner {
            endpoints,
            channels: Mutex::new(HashMap::new()),
            leaders: Mutex::new(HashMap::new()),
            next: AtomicUsize::new(0),
            sessions: Mutex::new(HashMap::new()),
            unary_only: Mutex::new(HashSet::new()),
            append_stream,
            tls,
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
        self.retrying_at(shard, true, |target, ch| {
            self.append_attempt(target, ch, shard, &payloads)
        })
        .await
    }

    /// One attempt of `append` at the node `target`: over that node's shared `AppendStream`,
    /// or a unary `Append` if the node has no such RPC. Fails as the unary call would.
    async fn append_attempt(
        &self,
        target: String,
        ch: Channel,
        shard: u32,
        payloads: &[Vec<u8>],
    ) -> Result<Vec<u64>, Status> {
        let request = || AppendRequest {
            shard,
            payloads: payloads.to_vec(),
        };
        let on_stream = self
            .on_stream(&target, &ch, |seq| AppendStreamRequest {
                seq,
                append: Some(request()),
                read_index: None,
            })
            .await;
        match on_stream {
            Some(Err(s)) if s.code() == Code::Unimplemented => {} // an older node: unary below
            Some(res) => return res,
            None => {}
        }
        grpc(ch)
            .append(timed(request()))
            .await
            .map(|r| r.into_inner().indexes)
    }

    /// One attempt of `read_index` at the node `target`: over its `AppendStream` (one message
    /// on a long-lived stream instead of a unary call per read-index round), or a unary
    /// `ReadIndex` if the node has no stream or does not know read indexes on it (an older
    /// node refuses the request as invalid). Fails as the unary call would.
    async fn read_index_attempt(
        &self,
        target: String,
        ch: Channel,
        shard: u32,
    ) -> Result<u64, Status> {
        let on_stream = self
            .on_stream(&target, &ch, |seq| AppendStreamRequest {
                seq,
                append: None,
                read_index: Some(ReadIndexRequest { shard }),
            })
            .await;
        match on_stream {
            Some(Err(s)) if matches!(s.code(), Code::Unimplemented | Code::InvalidArgument) => {}
            Some(Ok(indexes)) => {
                return match indexes.as_slice() {
                    [index] => Ok(*index),
                    _ => Err(Status::internal(format!(
                        "a read index answered with {} indexes",
                        indexes.len()
                    ))),
                };
            }
            Some(Err(s)) => return Err(s),
            None => {}
        }
        grpc(ch)
            .read_index(timed(ReadIndexRequest { shard }))
            .await
            .map(|r| r.into_inner().index)
    }

    /// Sends the request `build(seq)` on `target`'s shared `AppendStream` and waits for its
    /// answer; `None` when this client does not use streams or the node is known to have none.
    async fn on_stream(
        &self,
        target: &str,
        ch: &Channel,
        build: impl FnOnce(u64) -> AppendStreamRequest,
    ) -> Option<Result<Vec<u64>, Status>> {
        if !self.inner.append_stream || lock(&self.inner.unary_only).contains(target) {
            return None;
        }
        let session = self.session(target, ch.clone());
        let (seq, rx) = match session.register() {
            Ok(r) => r,
            Err(s) => return Some(Err(s)),
        };
        let answer = tokio::time::timeout(ATTEMPT_TIMEOUT, async {
            session
                .tx
                .send(build(seq))
                .await
                .map_err(|_| Status::unavailable("journal append stream closed"))?;
            rx.await
                .map_err(|_| Status::unavailable("journal append stream closed"))?
        })
        .await;
        Some(match answer {
            Ok(res) => res,
            Err(_) => {
                session.forget(seq);
                Err(Status::deadline_exceeded(
                    "journal call not answered in time",
                ))
            }
        })
    }

    /// The append stream to `target`, opened now if there is none.
    fn session(&self, target: &str, ch: Channel) -> Arc<AppendSession> {
        let mut sessions = lock(&self.inner.sessions);
        if let Some(s) = sessions.get(target) {
            return Arc::clone(s);
        }
        let (tx, rx) = mpsc::channel(APPEND_STREAM_QUEUE);
        let session = Arc::new(AppendSession {
            tx,
            next_seq: AtomicU64::new(0),
            waiters: Mutex::new(Some(HashMap::new())),
        });
        sessions.insert(target.to_string(), Arc::clone(&session));
        tokio::spawn(run_session(
            Arc::downgrade(&self.inner),
            target.to_string(),
            ch,
            Arc::clone(&session),
            rx,
        ));
        session
    }

    /// An index safe for a linearizable read of `shard` (confirmed by the leader with a quorum).
    pub async fn read_index(&self, shard: u32) -> Result<u64, ClientError> {
        self.retrying_at(shard, true, |target, ch| {
            self.read_index_attempt(target, ch, shard)
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

    /// Asks the leader of `shard` about handing its leadership to `to` (0: the shard's
    /// preferred node): with `start`, hands it over now and answers once done (a failed
    /// hand-off is `ClientError::Server` with the reason, not retried); else only reports.
    pub async fn handoff(
        &self,
        shard: u32,
        start: bool,
        to: u64,
    ) -> Result<HandoffResponse, ClientError> {
        self.unary_admin(shard, move |ch| async move {
            let mut c = JournalAdminClient::new(ch);
            c.handoff(timed(HandoffRequest { shard, start, to }))
                .await
                .map(|r| r.into_inner())
        })
        .await
    }

    /// Tails `shard` from `from`: every committed record in index order, gap-free, then new
    /// ones as they commit; endless. Reconnects to another node when one fails. Fails at once
    /// (or as the stream's last item) with `Trimmed` if `from` is below the trim point. Reads
    /// ahead of the consumer by at most `READ_BUFFER_RECORDS` records and `READ_BUFFER_BYTES`
    /// of them; beyond that the journal's stream waits (flow control holds the rest on the
    /// node).
    pub async fn read(&self, shard: u32, from: u64) -> Result<ReadStream, ClientError> {
        self.read_buffered(shard, from, READ_BUFFER_BYTES).await
    }

    /// [`JournalClient::read`], reading ahead by at most `bytes` of records (a record larger
    /// than that still passes, alone).
    pub async fn read_buffered(
        &self,
        shard: u32,
        from: u64,
        bytes: usize,
    ) -> Result<ReadStream, ClientError> {
        let first = self.open_read(shard, from).await?;
        let (tx, rx) = mpsc::channel(READ_BUFFER_RECORDS);
        let limit = bytes.clamp(1, u32::MAX as usize);
        let budget = Arc::new(Semaphore::new(limit));
        let this = self.clone();
        let tail_budget = budget.clone();
        tokio::spawn(async move { this.tail(shard, from, first, tx, tail_budget, limit).await });
        Ok(ReadStream { rx, budget, limit })
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
        tx: mpsc::Sender<Buffered>,
        buffered: Arc<Semaphore>,
        limit: usize,
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
                        let bytes = prost::Message::encoded_len(&r).clamp(1, limit) as u32;
                        let permit = tokio::select! {
                            p = buffered.clone().acquire_many_owned(bytes) => p.ok(),
                            _ = tx.closed() => return,
                        };
                        if tx.send((Ok(r), permit)).await.is_err() {
                            return;
                        }
                    }
                    if in_order {
                        continue;
                    }
                }
                Some(Err(s)) => {
                    if let Next::Fail(e) = classify(shard, &s) {
                        let _ = tx.send((Err(e), None)).await;
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
                        let _ = tx.send((Err(e), None)).await;
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
        self.retrying_at(shard, leader, |_, ch| call(ch)).await
    }

    /// `retrying`, telling `call` also which node (`http://host:port`) it talks to.
    async fn retrying_at<T, F, Fut>(
        &self,
        shard: u32,
        leader: bool,
        call: F,
    ) -> Result<T, ClientError>
    where
        F: Fn(String, Channel) -> Fut,
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
            let last = match call(target.clone(), ch).await {
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
        let dial = Endpoint::from_shared(endpoint.to_string())
            .map_err(|e| ClientError::InvalidEndpoint {
                endpoint: endpoint.to_string(),
                reason: e.to_string(),
            })?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .initial_connection_window_size(api::HTTP2_CONNECTION_WINDOW)
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(5));
        let ch = match &self.tls {
            Some(tls) => tls.channel(&dial),
            None => dial.connect_lazy(),
        };
        map.insert(endpoint.to_string(), ch.clone());
        Ok(ch)
    }
}
