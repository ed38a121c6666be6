//! The closed-loop driver: `--clients` concurrent tasks share a budget of `--total` operations,
//! each taking the next operation index, issuing it and waiting for its answer before the next,
//! so at most `clients` requests are in flight.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::report::Samples;

/// Most concurrent clients a run may start.
pub const MAX_CLIENTS: usize = 100_000;

/// What one operation came to, when the server answered without an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Done as asked.
    Done,
    /// A compare-and-swap whose compare failed (a conflict, not an error).
    Conflict,
}

/// One operation's future.
pub type OpFuture<'a> = Pin<Box<dyn Future<Output = Result<Outcome, tonic::Status>> + Send + 'a>>;

/// One client's loop body: issues operation `op` (a global index in `0..total`).
pub trait Client: Send + 'static {
    fn op(&mut self, op: u64) -> OpFuture<'_>;
}

/// Everything one closed-loop run measured.
#[derive(Debug, Default)]
pub struct Run {
    pub samples: Samples,
    pub conflicts: u64,
    pub elapsed: Duration,
}

/// Hands out operation indexes `0..total`, each exactly once.
#[derive(Debug)]
pub struct Budget {
    next: AtomicU64,
    total: u64,
}

impl Budget {
    pub fn new(total: u64) -> Self {
        Self {
            next: AtomicU64::new(0),
            total,
        }
    }

    /// The next operation index, or `None` once `total` have been handed out.
    pub fn claim(&self) -> Option<u64> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        (i < self.total).then_some(i)
    }
}

/// Runs `clients.len()` clients against a shared budget of `total` operations.
pub async fn run<C: Client>(clients: Vec<C>, total: u64) -> Run {
    let budget = Arc::new(Budget::new(total));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for mut client in clients {
        let budget = Arc::clone(&budget);
        tasks.spawn(async move {
            let mut samples = Samples::new();
            let mut conflicts = 0u64;
            while let Some(i) = budget.claim() {
                let t = Instant::now();
                match client.op(i).await {
                    Ok(outcome) => {
                        samples.record(t.elapsed());
                        if outcome == Outcome::Conflict {
                            conflicts += 1;
                        }
                    }
                    Err(status) => samples.record_error(status_text(&status)),
                }
            }
            (samples, conflicts)
        });
    }
    let mut run = Run::default();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((samples, conflicts)) => {
                run.samples.merge(samples);
                run.conflicts += conflicts;
            }
            Err(e) => run.samples.record_error(format!("client task failed: {e}")),
        }
    }
    run.elapsed = start.elapsed();
    run
}

/// A gRPC status as etcd's benchmark prints it: code and message.
pub fn status_text(status: &tonic::Status) -> String {
    format!("{:?}: {}", status.code(), status.message())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    struct Recorder {
        seen: Arc<Mutex<Vec<u64>>>,
    }

    impl Client for Recorder {
        fn op(&mut self, op: u64) -> OpFuture<'_> {
            let seen = Arc::clone(&self.seen);
            Box::pin(async move {
                tokio::task::yield_now().await;
                seen.lock().unwrap().push(op);
                match op % 10 {
                    0 => Err(tonic::Status::unavailable("down")),
                    1 => Ok(Outcome::Conflict),
                    _ => Ok(Outcome::Done),
                }
            })
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_operation_runs_exactly_once() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let clients = (0..7)
            .map(|_| Recorder {
                seen: Arc::clone(&seen),
            })
            .collect();
        let mut run = run(clients, 1000).await;
        let mut ops = seen.lock().unwrap().clone();
        ops.sort_unstable();
        assert_eq!(ops, (0..1000).collect::<Vec<_>>());
        assert_eq!(run.samples.error_count(), 100);
        assert_eq!(run.samples.ok(), 900);
        assert_eq!(run.conflicts, 100);
        assert_eq!(
            run.samples.errors().get("Unavailable: down"),
            Some(&100),
            "{:?}",
            run.samples.errors()
        );
        let s = run.samples.summary(run.elapsed);
        assert_eq!(s.ok, 900);
    }

    #[test]
    fn budget_stops_at_total() {
        let b = Budget::new(2);
        assert_eq!(b.claim(), Some(0));
        assert_eq!(b.claim(), Some(1));
        assert_eq!(b.claim(), None);
        assert_eq!(b.claim(), None);
    }
}
