//! The watch workloads: N watchers spread over M streams all watch one run-unique prefix (or
//! key); writers put K events; every watcher must receive every acknowledged event exactly once,
//! in revision order. Delivery latency is measured from the put's acknowledgement (as etcd's
//! `watch-latency` does) and from the put's send, per (watcher, event).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use api::etcdserverpb::watch_request::RequestUnion;
use api::etcdserverpb::{PutRequest, RangeRequest, WatchCreateRequest, WatchRequest};
use tokio::sync::{Mutex, Notify, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

use super::BenchError;
use super::conn::Pool;
use super::driver::{Budget, status_text};
use super::keys;
use super::report::Samples;

/// Most watchers one run may create.
pub const MAX_WATCHERS: usize = 1_000_000;
/// Most (watcher, event) deliveries one run may record (24 bytes each are kept).
pub const MAX_DELIVERIES: u64 = 20_000_000;
/// How long every watcher has to be created.
pub const CREATE_TIMEOUT: Duration = Duration::from_secs(60);
/// Stream errors kept verbatim in the verdict.
const MAX_STREAM_ERRORS: usize = 16;

/// What one watch run does.
#[derive(Debug, Clone)]
pub struct WatchPlan {
    /// Watchers in all.
    pub watchers: usize,
    /// gRPC Watch streams carrying them (stream `s` uses connection `s % conns`).
    pub streams: usize,
    /// Puts (events) to write.
    pub puts: u64,
    /// Concurrent writers (writer `c` uses connection `c % conns`).
    pub put_clients: usize,
    /// Puts per second over all writers; 0 = as fast as acknowledged.
    pub put_rate: u64,
    /// Distinct keys the puts cycle over, all under `prefix`.
    pub keys: u64,
    /// Bytes of each key after `prefix`.
    pub key_size: usize,
    pub val_size: usize,
    /// Each put waits until every watcher has its event before the next is sent (etcd's
    /// `watch-latency`); needs one writer.
    pub lockstep: bool,
    /// Watch the whole prefix (true) or only the first key (false, then `keys` must be 1).
    pub watch_prefix: bool,
    /// Run-unique prefix, so events of earlier runs never match.
    pub prefix: Vec<u8>,
    /// How long to wait for outstanding events once the writers are done (and, in lockstep,
    /// for each put's deliveries).
    pub drain_timeout: Duration,
    pub seed: u64,
}

impl WatchPlan {
    pub fn validate(&self) -> Result<(), BenchError> {
        let bad = |m: String| Err(BenchError::InvalidArgs(m));
        if self.watchers == 0 || self.watchers > MAX_WATCHERS {
            return bad(format!("--watchers must be in 1..={MAX_WATCHERS}"));
        }
        if self.streams == 0 || self.streams > self.watchers {
            return bad(format!(
                "--streams must be in 1..=watchers ({})",
                self.watchers
            ));
        }
        if self.puts == 0 {
            return bad("the number of puts must be at least 1".into());
        }
        if self.put_clients == 0 {
            return bad("--put-clients must be at least 1".into());
        }
        if self.lockstep && self.put_clients != 1 {
            return bad("lockstep delivery needs exactly one writer".into());
        }
        if !self.watch_prefix && self.keys != 1 {
            return bad("a single-key watch needs exactly one written key".into());
        }
        if self.val_size > keys::MAX_VAL_SIZE {
            return bad(format!("--val-size exceeds {}", keys::MAX_VAL_SIZE));
        }
        if (self.watchers as u64).saturating_mul(self.puts) > MAX_DELIVERIES {
            return bad(format!(
                "watchers x puts = {} exceeds {MAX_DELIVERIES} deliveries",
                (self.watchers as u64).saturating_mul(self.puts)
            ));
        }
        keys::validate(b"", self.key_size, self.keys)
    }

    fn key(&self, index: u64) -> Vec<u8> {
        let mut k = self.prefix.clone();
        k.extend(keys::key_of(b"", self.key_size, index));
        k
    }

    fn create_request(&self, start_revision: i64) -> WatchCreateRequest {
        let (key, range_end) = if self.watch_prefix {
            (self.prefix.clone(), api::prefix_range_end(&self.prefix))
        } else {
            (self.key(0), Vec::new())
        };
        WatchCreateRequest {
            key,
            range_end,
            start_revision,
            ..Default::default()
        }
    }
}

/// Splits `watchers` over `streams` as evenly as possible (the first streams get one more).
pub fn split(watchers: usize, streams: usize) -> Vec<usize> {
    let streams = streams.max(1);
    (0..streams)
        .map(|s| watchers / streams + usize::from(s < watchers % streams))
        .collect()
}

/// One put as the writer saw it.
#[derive(Debug, Clone, Copy)]
pub struct Ack {
    pub revision: i64,
    pub sent: Instant,
    pub acked: Instant,
}

/// What the checks found.
#[derive(Debug, Clone, Default)]
pub struct Verdict {
    pub watchers: usize,
    pub created: usize,
    pub cancelled: usize,
    pub stream_errors: Vec<String>,
    pub acked_puts: u64,
    /// acked puts x watchers.
    pub expected: u64,
    /// Distinct acknowledged events received, over all watchers.
    pub delivered: u64,
    pub missing: u64,
    pub duplicates: u64,
    pub out_of_order: u64,
    /// Events of puts whose answer the writer never got (errors, timeouts): not failures.
    pub unacked: u64,
    /// Deliveries that arrived before the writer had the put's answer.
    pub before_ack: u64,
}

impl Verdict {
    /// Every watcher created and kept, every acknowledged event delivered once, in order.
    pub fn ok(&self) -> bool {
        self.created == self.watchers
            && self.cancelled == 0
            && self.stream_errors.is_empty()
            && self.missing == 0
            && self.duplicates == 0
            && self.out_of_order == 0
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "ok": self.ok(),
            "watchers": self.watchers,
            "created": self.created,
            "cancelled": self.cancelled,
            "stream_errors": self.stream_errors,
            "acked_puts": self.acked_puts,
            "expected": self.expected,
            "delivered": self.delivered,
            "missing": self.missing,
            "duplicates": self.duplicates,
            "out_of_order": self.out_of_order,
            "unacked_events": self.unacked,
            "before_ack": self.before_ack,
        })
    }
}

/// Checks every watcher's received (revision, time) list against the acknowledged puts and
/// turns each delivery into latency samples (from the ack, from the send).
pub fn verify(acks: &[Ack], received: &[Vec<(i64, Instant)>]) -> (Verdict, Samples, Samples) {
    let by_rev: HashMap<i64, Ack> = acks.iter().map(|a| (a.revision, *a)).collect();
    let mut v = Verdict {
        watchers: received.len(),
        acked_puts: by_rev.len() as u64,
        expected: by_rev.len() as u64 * received.len() as u64,
        ..Default::default()
    };
    let mut from_ack = Samples::new();
    let mut from_send = Samples::new();
    for events in received {
        let mut seen = HashSet::with_capacity(events.len());
        let mut last = i64::MIN;
        for &(rev, at) in events {
            if !seen.insert(rev) {
                v.duplicates += 1;
                continue;
            }
            if rev < last {
                v.out_of_order += 1;
            }
            last = last.max(rev);
            match by_rev.get(&rev) {
                Some(ack) => {
                    v.delivered += 1;
                    if at < ack.acked {
                        v.before_ack += 1;
                    }
                    from_ack.record(at.saturating_duration_since(ack.acked));
                    from_send.record(at.saturating_duration_since(ack.sent));
                }
                None => v.unacked += 1,
            }
        }
    }
    v.missing = v.expected - v.delivered;
    (v, from_ack, from_send)
}

/// Progress shared by the streams and the writers.
#[derive(Default)]
pub(super) struct Shared {
    pub(super) created: AtomicUsize,
    pub(super) failed_streams: AtomicUsize,
    delivered: AtomicU64,
    pub(super) notify: Notify,
}

impl Shared {
    /// Waits until `done()` holds, up to `timeout`; returns whether it holds.
    pub(super) async fn wait_until(&self, timeout: Duration, done: impl Fn() -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if done() {
                return true;
            }
            if tokio::time::timeout_at(deadline, self.notify.notified())
                .await
                .is_err()
            {
                return done();
            }
        }
    }
}

/// What one stream saw.
struct StreamOutcome {
    /// Index of the endpoint the stream talked to.
    endpoint: usize,
    received: Vec<Vec<(i64, Instant)>>,
    created: usize,
    cancelled: usize,
    error: Option<String>,
    create_latency: Samples,
}

async fn run_stream(
    pool: Pool,
    stream: usize,
    watchers: usize,
    create: WatchCreateRequest,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) -> StreamOutcome {
    let mut out = StreamOutcome {
        endpoint: pool.endpoint_of(stream),
        received: vec![Vec::new(); watchers],
        created: 0,
        cancelled: 0,
        error: None,
        create_latency: Samples::new(),
    };
    // Every create is queued before the call: a gRPC server may send its response headers only
    // with its first message, which comes once it has read a create.
    let (tx, rx) = mpsc::channel(watchers.max(1));
    for _ in 0..watchers {
        let req = WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(create.clone())),
        };
        if tx.send(req).await.is_err() {
            break;
        }
    }
    let started = Instant::now();
    let mut client = pool.watch(stream);
    let fail = |out: &mut StreamOutcome, e: String| {
        out.error = Some(e);
        shared.failed_streams.fetch_add(1, Ordering::Relaxed);
        shared.notify.notify_one();
    };
    let mut inbound = match client
        .watch(pool.stream_request(ReceiverStream::new(rx)))
        .await
    {
        Ok(r) => r.into_inner(),
        Err(s) => {
            fail(&mut out, status_text(&s));
            return out;
        }
    };
    let mut local: HashMap<i64, usize> = HashMap::with_capacity(watchers);
    loop {
        let msg = tokio::select! {
            biased;
            _ = stop.changed() => break,
            msg = inbound.message() => msg,
        };
        let resp = match msg {
            Ok(Some(r)) => r,
            Ok(None) => {
                fail(&mut out, "watch stream closed by the server".into());
                break;
            }
            Err(s) => {
                fail(&mut out, status_text(&s));
                break;
            }
        };
        let now = Instant::now();
        if resp.created && out.created < watchers {
            local.insert(resp.watch_id, out.created);
            out.created += 1;
            out.create_latency.record(now - started);
            shared.created.fetch_add(1, Ordering::Relaxed);
            shared.notify.notify_one();
        }
        if resp.canceled {
            out.cancelled += 1;
            fail(
                &mut out,
                format!(
                    "watch {} cancelled: {:?} (compact_revision {})",
                    resp.watch_id, resp.cancel_reason, resp.compact_revision
                ),
            );
            continue;
        }
        if resp.events.is_empty() {
            continue;
        }
        if let Some(&w) = local.get(&resp.watch_id) {
            let n = resp.events.len() as u64;
            out.received[w].extend(
                resp.events
                    .iter()
                    .map(|e| (e.kv.as_ref().map_or(0, |kv| kv.mod_revision), now)),
            );
            shared.delivered.fetch_add(n, Ordering::Relaxed);
            shared.notify.notify_one();
        }
    }
    drop(tx);
    out
}

/// Everything a watch run measured.
pub struct WatchRun {
    pub create: Samples,
    pub create_elapsed: Duration,
    pub puts: Samples,
    pub put_elapsed: Duration,
    pub from_ack: Samples,
    pub from_send: Samples,
    /// First put sent to last event received.
    pub delivery_elapsed: Duration,
    pub verdict: Verdict,
    /// Per endpoint (index in `--endpoints`): delivery latency from the ack and from the send
    /// of the watchers whose stream talked to it, so a tail can be told apart by frontend.
    pub by_endpoint: Vec<(Samples, Samples)>,
}

/// Runs `plan` over `pool`.
pub async fn run(pool: &Pool, plan: &WatchPlan) -> Result<WatchRun, BenchError> {
    plan.validate()?;
    // Watch from just after the revision the writer's endpoint reports now: no event of this
    // run can be missed even if a stream's endpoint lags behind the writer's.
    let header = pool
        .kv(0)
        .range(pool.request(RangeRequest {
            key: plan.prefix.clone(),
            range_end: api::prefix_range_end(&plan.prefix),
            count_only: true,
            ..Default::default()
        }))
        .await
        .map_err(BenchError::Rpc)?
        .into_inner()
        .header;
    let start_revision = header.map_or(0, |h| h.revision) + 1;
    let create = plan.create_request(start_revision);

    let shared = Arc::new(Shared::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut streams = tokio::task::JoinSet::new();
    let create_start = Instant::now();
    for (s, n) in split(plan.watchers, plan.streams).into_iter().enumerate() {
        streams.spawn(run_stream(
            pool.clone(),
            s,
            n,
            create.clone(),
            Arc::clone(&shared),
            stop_rx.clone(),
        ));
    }
    let all_created = shared
        .wait_until(CREATE_TIMEOUT, || {
            shared.created.load(Ordering::Relaxed) == plan.watchers
                || shared.failed_streams.load(Ordering::Relaxed) > 0
        })
        .await;
    let create_elapsed = create_start.elapsed();
    let created = shared.created.load(Ordering::Relaxed);
    if !all_created || created != plan.watchers {
        let _ = stop_tx.send(true);
        let mut errors = Vec::new();
        while let Some(Ok(o)) = streams.join_next().await {
            errors.extend(o.error);
        }
        return Err(BenchError::Setup(format!(
            "only {created} of {} watchers were created within {CREATE_TIMEOUT:?}: {errors:?}",
            plan.watchers
        )));
    }

    let (puts, acks, put_elapsed) = write(pool, plan, &shared).await;
    let expected = acks.len() as u64 * plan.watchers as u64;
    shared
        .wait_until(plan.drain_timeout, || {
            shared.delivered.load(Ordering::Relaxed) >= expected
                || shared.failed_streams.load(Ordering::Relaxed) > 0
        })
        .await;
    let _ = stop_tx.send(true);

    let mut received = Vec::with_capacity(plan.watchers);
    let mut grouped: Vec<Vec<Vec<(i64, Instant)>>> = vec![Vec::new(); pool.endpoints()];
    let mut create_samples = Samples::new();
    let mut verdict_extra = Verdict::default();
    while let Some(joined) = streams.join_next().await {
        match joined {
            Ok(o) => {
                if let Some(g) = grouped.get_mut(o.endpoint) {
                    g.extend(o.received.iter().cloned());
                }
                received.extend(o.received);
                create_samples.merge(o.create_latency);
                verdict_extra.created += o.created;
                verdict_extra.cancelled += o.cancelled;
                if let Some(e) = o.error
                    && verdict_extra.stream_errors.len() < MAX_STREAM_ERRORS
                {
                    verdict_extra.stream_errors.push(e);
                }
            }
            Err(e) => verdict_extra
                .stream_errors
                .push(format!("stream task failed: {e}")),
        }
    }
    let last_event = received.iter().flatten().map(|&(_, at)| at).max();
    let first_send = acks.iter().map(|a| a.sent).min();
    let delivery_elapsed = match (first_send, last_event) {
        (Some(a), Some(b)) => b.saturating_duration_since(a),
        _ => Duration::ZERO,
    };
    // Watchers that never existed (a failed stream) still count as missing everything.
    received.resize(plan.watchers, Vec::new());
    let (mut verdict, from_ack, from_send) = verify(&acks, &received);
    let by_endpoint = grouped
        .iter()
        .map(|g| {
            let (_, a, s) = verify(&acks, g);
            (a, s)
        })
        .collect();
    verdict.created = verdict_extra.created;
    verdict.cancelled = verdict_extra.cancelled;
    verdict.stream_errors = verdict_extra.stream_errors;
    Ok(WatchRun {
        create: create_samples,
        create_elapsed,
        puts,
        put_elapsed,
        from_ack,
        from_send,
        delivery_elapsed,
        verdict,
        by_endpoint,
    })
}

/// The writers: `put_clients` tasks share the put budget, paced to `put_rate` if set.
async fn write(
    pool: &Pool,
    plan: &WatchPlan,
    shared: &Arc<Shared>,
) -> (Samples, Vec<Ack>, Duration) {
    let budget = Arc::new(Budget::new(plan.puts));
    let acks = Arc::new(Mutex::new(Vec::with_capacity(plan.puts as usize)));
    let value = Arc::new(keys::value(plan.val_size, plan.seed));
    let start = tokio::time::Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..plan.put_clients {
        let budget = Arc::clone(&budget);
        let acks = Arc::clone(&acks);
        let value = Arc::clone(&value);
        let shared = Arc::clone(shared);
        let pool = pool.clone();
        let plan = plan.clone();
        tasks.spawn(async move {
            let mut kv = pool.kv(c);
            let mut samples = Samples::new();
            let mut acked = 0u64;
            while let Some(i) = budget.claim() {
                if plan.put_rate > 0 {
                    let slot = Duration::from_secs_f64(i as f64 / plan.put_rate as f64);
                    tokio::time::sleep_until(start + slot).await;
                }
                let req = PutRequest {
                    key: plan.key(i % plan.keys),
                    value: value.to_vec(),
                    ..Default::default()
                };
                let sent = Instant::now();
                match kv.put(pool.request(req)).await {
                    Ok(resp) => {
                        let acked_at = Instant::now();
                        samples.record(acked_at - sent);
                        let revision = resp.into_inner().header.map_or(0, |h| h.revision);
                        acks.lock().await.push(Ack {
                            revision,
                            sent,
                            acked: acked_at,
                        });
                        acked += 1;
                    }
                    Err(s) => samples.record_error(status_text(&s)),
                }
                if plan.lockstep {
                    let want = acked * plan.watchers as u64;
                    let delivered = shared
                        .wait_until(plan.drain_timeout, || {
                            shared.delivered.load(Ordering::Relaxed) >= want
                                || shared.failed_streams.load(Ordering::Relaxed) > 0
                        })
                        .await;
                    if !delivered || shared.failed_streams.load(Ordering::Relaxed) > 0 {
                        samples.record_error(format!(
                            "put {i}: not delivered to every watcher within {:?}; writer stopped",
                            plan.drain_timeout
                        ));
                        break;
                    }
                }
            }
            samples
        });
    }
    let mut samples = Samples::new();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(s) => samples.merge(s),
            Err(e) => samples.record_error(format!("writer task failed: {e}")),
        }
    }
    let elapsed = start.elapsed();
    let acks = std::mem::take(&mut *acks.lock().await);
    (samples, acks, elapsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> WatchPlan {
        WatchPlan {
            watchers: 10,
            streams: 2,
            puts: 5,
            put_clients: 1,
            put_rate: 0,
            keys: 1,
            key_size: 4,
            val_size: 8,
            lockstep: false,
            watch_prefix: true,
            prefix: b"p/".to_vec(),
            drain_timeout: Duration::from_secs(1),
            seed: 1,
        }
    }

    #[test]
    fn split_is_even_and_complete() {
        assert_eq!(split(10, 3), vec![4, 3, 3]);
        assert_eq!(split(1000, 10), vec![100; 10]);
        assert_eq!(split(5, 5), vec![1; 5]);
        assert_eq!(split(7, 1), vec![7]);
        assert_eq!(split(1001, 10).iter().sum::<usize>(), 1001);
    }

    #[test]
    fn plan_validation() {
        assert!(plan().validate().is_ok());
        let mut p = plan();
        p.streams = 11;
        assert!(p.validate().is_err());
        let mut p = plan();
        p.watchers = 0;
        assert!(p.validate().is_err());
        let mut p = plan();
        p.lockstep = true;
        p.put_clients = 2;
        assert!(p.validate().is_err());
        let mut p = plan();
        p.watch_prefix = false;
        p.keys = 3;
        assert!(p.validate().is_err());
        let mut p = plan();
        p.watchers = 1_000_000;
        p.streams = 1;
        p.puts = 1_000;
        assert!(p.validate().is_err()); // 1e9 deliveries
        let mut p = plan();
        p.puts = 0;
        assert!(p.validate().is_err());
    }

    #[test]
    fn create_request_watches_the_prefix_or_one_key() {
        let p = plan();
        let c = p.create_request(7);
        assert_eq!(c.key, b"p/");
        assert_eq!(c.range_end, b"p0");
        assert_eq!(c.start_revision, 7);
        let mut p = plan();
        p.watch_prefix = false;
        let c = p.create_request(7);
        assert_eq!(c.key, b"p/0000");
        assert!(c.range_end.is_empty());
        assert_eq!(p.key(3), b"p/0003");
    }

    fn acks(revs: &[i64], t0: Instant) -> Vec<Ack> {
        revs.iter()
            .map(|&r| Ack {
                revision: r,
                sent: t0 + Duration::from_millis(r as u64 * 10),
                acked: t0 + Duration::from_millis(r as u64 * 10 + 2),
            })
            .collect()
    }

    #[test]
    fn verify_accepts_exactly_once_in_order() {
        let t0 = Instant::now();
        let a = acks(&[5, 6, 7], t0);
        let at = |r: i64, extra: u64| (r, t0 + Duration::from_millis(r as u64 * 10 + extra));
        let rx = vec![
            vec![at(5, 3), at(6, 3), at(7, 3)],
            vec![at(5, 1), at(6, 4), at(7, 12)],
        ];
        let (mut v, mut from_ack, mut from_send) = verify(&a, &rx);
        assert!(!v.ok(), "no watcher was reported created");
        v.created = 2;
        assert!(v.ok(), "{v:?}");
        assert_eq!(v.expected, 6);
        assert_eq!(v.delivered, 6);
        assert_eq!(v.before_ack, 1);
        let s = from_ack.summary(Duration::from_secs(1));
        assert_eq!(s.ok, 6);
        assert_eq!(s.fastest_ns, 0); // arrived before the ack: clamped to 0
        assert_eq!(s.slowest_ns, 10_000_000);
        let s = from_send.summary(Duration::from_secs(1));
        assert_eq!(s.fastest_ns, 1_000_000);
        assert_eq!(s.slowest_ns, 12_000_000);
    }

    #[test]
    fn verify_finds_missing_duplicate_reordered_and_unacked() {
        let t0 = Instant::now();
        let a = acks(&[5, 6, 7], t0);
        let at = |r: i64| (r, t0 + Duration::from_secs(1));
        let (mut v, ..) = verify(&a, &[vec![at(5), at(7)]]);
        v.created = 1;
        assert!(!v.ok());
        assert_eq!(v.missing, 1);
        let (v, ..) = verify(&a, &[vec![at(5), at(6), at(6), at(7)]]);
        assert!(!v.ok());
        assert_eq!(v.duplicates, 1);
        assert_eq!(v.missing, 0);
        let (v, ..) = verify(&a, &[vec![at(6), at(5), at(7)]]);
        assert!(!v.ok());
        assert_eq!(v.out_of_order, 1);
        // an event of a put whose answer was lost is reported, not a failure
        let (mut v, ..) = verify(&a, &[vec![at(5), at(6), at(7), at(8)]]);
        v.created = 1;
        assert!(v.ok(), "{v:?}");
        assert_eq!(v.unacked, 1);
        // a watcher that received nothing misses everything
        let (v, ..) = verify(&a, &[vec![], vec![at(5), at(6), at(7)]]);
        assert_eq!(v.missing, 3);
    }
}
