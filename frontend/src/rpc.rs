//! Per-request plumbing shared by every service: request ids, the tracing span (tenant and
//! request id fields), per-RPC counters and latency histograms, and turning errors into statuses
//! (logged where they are handled: here).

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Instant;

use metrics::{Counter, Histogram};

use tonic::{Code, Response, Status};
use tracing::Instrument;

use crate::errors::Error;

/// Metric names (units in the name).
pub const REQUESTS_TOTAL: &str = "strata_frontend_requests_total";
pub const REQUEST_DURATION: &str = "strata_frontend_request_duration_seconds";

/// A request's id: 16 random bytes, also the journal entry's request id for writes, so a log
/// line and a journal entry can be matched.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct RequestId([u8; 16]);

impl RequestId {
    pub fn random() -> Self {
        Self(rand::random())
    }

    pub fn bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RequestId({self})")
    }
}

/// Runs one unary RPC body inside its span, records its metrics and maps its error.
pub async fn unary<T, Fut>(
    rpc: &'static str,
    tenant: &str,
    id: RequestId,
    body: Fut,
) -> Result<Response<T>, Status>
where
    Fut: Future<Output = Result<T, Error>>,
{
    let span = tracing::info_span!("rpc", rpc, tenant, request_id = %id);
    let start = Instant::now();
    let result = body.instrument(span.clone()).await;
    let result = result.map_err(|e| {
        let _g = span.enter();
        handled(e)
    });
    observe(rpc, tenant, start, result.as_ref().err().map(Status::code));
    result.map(Response::new)
}

/// Maps an error to its status, logging it at the level it deserves.
pub fn handled(e: Error) -> Status {
    let detail = e.to_string();
    let status = Status::from(e);
    match status.code() {
        Code::Internal | Code::DataLoss => tracing::error!(error = %detail, "request failed"),
        Code::Unavailable => tracing::warn!(error = %detail, "request failed"),
        _ => tracing::debug!(error = %detail, "request refused"),
    }
    status
}

/// grpc-go's refusal of a message over the server's receive limit, which etcd's clients get:
/// ResourceExhausted "grpc: received message larger than max (N vs. M)".
pub fn message_too_large(len: usize, limit: usize) -> Status {
    Status::resource_exhausted(format!(
        "grpc: received message larger than max ({len} vs. {limit})"
    ))
}

/// A request stream's receive error as the client gets it back, the status the stream ends
/// with (etcd's Watch and LeaseKeepAlive return the error their `Recv` met). tonic refuses an
/// oversized message with OutOfRange "Error, decoded message length too large: found N bytes,
/// the limit is: M bytes"; that becomes grpc-go's [`message_too_large`].
pub fn receive_error(status: Status) -> Status {
    let sizes = status
        .message()
        .strip_prefix("Error, decoded message length too large: found ")
        .and_then(|rest| rest.strip_suffix(" bytes"))
        .and_then(|rest| rest.split_once(" bytes, the limit is: "))
        .and_then(|(len, limit)| Some((len.parse().ok()?, limit.parse().ok()?)));
    match sizes {
        Some((len, limit)) if status.code() == Code::OutOfRange => message_too_large(len, limit),
        _ => status,
    }
}

/// (rpc, tenant) pairs whose metric handles are kept; past this, requests resolve their
/// handles in the registry each time (correct, only slower).
pub const MAX_CACHED_RPC_LABELS: usize = 4096;

/// The metric handles of one (rpc, tenant): resolving them in the registry on every request
/// (label strings allocated and hashed) was a visible share of a read's CPU.
struct RpcHandles {
    ok: Counter,
    duration: Histogram,
}

type HandleCache = RwLock<HashMap<&'static str, HashMap<String, Arc<RpcHandles>>>>;

fn cached(rpc: &'static str, tenant: &str) -> Option<Arc<RpcHandles>> {
    static CACHE: OnceLock<HandleCache> = OnceLock::new();
    // Handles taken before the recorder exists would stay no-ops forever.
    crate::metrics::handle()?;
    let cache = CACHE.get_or_init(Default::default);
    let read = cache.read().unwrap_or_else(|p| p.into_inner());
    if let Some(h) = read.get(rpc).and_then(|m| m.get(tenant)) {
        return Some(h.clone());
    }
    let cached: usize = read.values().map(HashMap::len).sum();
    drop(read);
    if cached >= MAX_CACHED_RPC_LABELS {
        return None;
    }
    let h = Arc::new(RpcHandles {
        ok: metrics::counter!(REQUESTS_TOTAL, "rpc" => rpc, "tenant" => tenant.to_string(), "code" => "OK"),
        duration: metrics::histogram!(REQUEST_DURATION, "rpc" => rpc, "tenant" => tenant.to_string()),
    });
    let mut write = cache.write().unwrap_or_else(|p| p.into_inner());
    let entry = write
        .entry(rpc)
        .or_default()
        .entry(tenant.to_string())
        .or_insert(h);
    Some(entry.clone())
}

/// Records one finished request.
pub fn observe(rpc: &'static str, tenant: &str, start: Instant, code: Option<Code>) {
    let elapsed = start.elapsed().as_secs_f64();
    if let Some(h) = cached(rpc, tenant) {
        h.duration.record(elapsed);
        match code {
            None => h.ok.increment(1),
            Some(c) => metrics::counter!(REQUESTS_TOTAL, "rpc" => rpc, "tenant" => tenant.to_string(), "code" => code_name(c))
                .increment(1),
        }
        return;
    }
    let code = code.map_or("OK", code_name);
    metrics::counter!(REQUESTS_TOTAL, "rpc" => rpc, "tenant" => tenant.to_string(), "code" => code)
        .increment(1);
    metrics::histogram!(REQUEST_DURATION, "rpc" => rpc, "tenant" => tenant.to_string())
        .record(elapsed);
}

fn code_name(c: Code) -> &'static str {
    match c {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_random_and_print_as_hex() {
        let a = RequestId::random();
        let b = RequestId::random();
        assert_ne!(a, b);
        let s = a.to_string();
        assert_eq!(s.len(), 32);
        assert!(s.chars().all(|c| c.is_ascii_hexdigit()));
    }

    #[test]
    fn observe_counts_through_cached_handles() {
        let h = crate::metrics::handle().expect("the recorder installs");
        for _ in 0..3 {
            observe("CacheTestRpc", "cache-test", Instant::now(), None);
        }
        observe(
            "CacheTestRpc",
            "cache-test",
            Instant::now(),
            Some(Code::NotFound),
        );
        let text = h.render();
        let line = |needle: &str| {
            text.lines()
                .find(|l| l.starts_with(needle))
                .unwrap_or_else(|| panic!("no {needle} in\n{text}"))
                .rsplit(' ')
                .next()
                .unwrap()
                .to_string()
        };
        let labels = r#"rpc="CacheTestRpc",tenant="cache-test""#;
        assert_eq!(
            line(&format!(r#"{REQUESTS_TOTAL}{{{labels},code="OK"}}"#)),
            "3"
        );
        assert_eq!(
            line(&format!(r#"{REQUESTS_TOTAL}{{{labels},code="NotFound"}}"#)),
            "1"
        );
        assert_eq!(line(&format!("{REQUEST_DURATION}_count{{{labels}}}")), "4");
    }

    #[tokio::test]
    async fn unary_maps_errors_to_statuses() {
        let r: Result<Response<()>, Status> = unary("Put", "t", RequestId::random(), async {
            Err(Error::Stopped)
        })
        .await;
        assert_eq!(r.unwrap_err().code(), Code::Unavailable);
        let r = unary("Put", "t", RequestId::random(), async { Ok(5) }).await;
        assert_eq!(r.unwrap().into_inner(), 5);
    }
}

#[cfg(test)]
mod receive_tests {
    use super::*;

    #[test]
    fn tonics_oversize_refusal_becomes_grpc_gos() {
        let tonic = Status::out_of_range(
            "Error, decoded message length too large: found 3145738 bytes, the limit is: 2097152 bytes",
        );
        let s = receive_error(tonic);
        assert_eq!(s.code(), Code::ResourceExhausted);
        assert_eq!(
            s.message(),
            "grpc: received message larger than max (3145738 vs. 2097152)"
        );
        let other = receive_error(Status::cancelled("gone"));
        assert_eq!((other.code(), other.message()), (Code::Cancelled, "gone"));
        let unlike = receive_error(Status::out_of_range(
            "Error, decoded message length too large",
        ));
        assert_eq!(
            unlike.code(),
            Code::OutOfRange,
            "left as it is when unparsed"
        );
    }
}
