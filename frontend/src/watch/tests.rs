//! Watch tests without a network: a real `MemStore` applied entry by entry, a hub notified as the
//! replica does, and stream tasks driven through channels, as the gRPC service drives them.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use api::etcdserverpb::watch_create_request::FilterType;
use api::etcdserverpb::watch_request::RequestUnion;
use api::etcdserverpb::{
    CompactionRequest, DeleteRangeRequest, PutRequest, RequestOp, ResponseHeader,
    WatchCancelRequest, WatchCreateRequest, WatchProgressRequest, WatchRequest, WatchResponse,
    request_op,
};
use api::mvccpb::Event;
use api::mvccpb::event::EventType;
use api::strata::entry::{Entry, entry::Request};
use memstore::{Applied, Config, MemStore};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::mpsc;
use tonic::Status;

use super::*;

/// Generous: the CI machine is small and shared.
const WAIT: Duration = Duration::from_secs(30);

struct Harness {
    store: Arc<RwLock<MemStore>>,
    hub: Arc<WatchHub>,
    index: u64,
    /// Every applied event, for computing what a watcher must see.
    history: Vec<Event>,
    /// The tenant's watcher quota (`WatchTarget::max_watchers`).
    max_watchers: Option<usize>,
}

impl Harness {
    fn new(stream_buffer: usize) -> Self {
        Self::with_limits(stream_buffer, DEFAULT_STREAM_BYTES)
    }

    fn with_limits(stream_buffer: usize, stream_bytes: usize) -> Self {
        let store = MemStore::new(Config::default());
        let hub = WatchHub::with_limits("test", stream_buffer, stream_bytes);
        // As a replica's hub starts (`WatchHub::for_store_at`): at the store's revision.
        hub.notify(store.revision(), &[]);
        Self {
            store: Arc::new(RwLock::new(store)),
            hub: Arc::new(hub),
            index: 0,
            history: Vec::new(),
            max_watchers: None,
        }
    }

    fn apply(&mut self, request: Request) -> Applied {
        let applied = self.apply_unpublished(request);
        self.hub.notify(applied.revision, &applied.events);
        self.history.extend(applied.events.iter().cloned());
        applied
    }

    /// Applies to the store only, as the replica does before it publishes to the hub.
    fn apply_unpublished(&mut self, request: Request) -> Applied {
        self.index += 1;
        let entry = Entry {
            format_version: api::ENTRY_FORMAT_VERSION,
            tenant: "test".into(),
            request_id: self.index.to_be_bytes().repeat(2),
            time_ms: 1_000 + self.index as i64,
            request: Some(request),
            ..Default::default()
        };
        self.store.write().unwrap().apply(self.index, &entry)
    }

    fn put(&mut self, key: &str, value: &str) -> i64 {
        self.apply(Request::Put(PutRequest {
            key: key.into(),
            value: value.into(),
            ..Default::default()
        }))
        .revision
    }

    fn delete(&mut self, key: &str, range_end: &str) -> i64 {
        self.apply(Request::DeleteRange(DeleteRangeRequest {
            key: key.into(),
            range_end: range_end.into(),
            ..Default::default()
        }))
        .revision
    }

    fn txn_puts(&mut self, keys: &[&str], value: &str) -> i64 {
        let ops = keys
            .iter()
            .map(|k| RequestOp {
                request: Some(request_op::Request::RequestPut(PutRequest {
                    key: k.as_bytes().to_vec(),
                    value: value.into(),
                    ..Default::default()
                })),
            })
            .collect();
        self.apply(Request::Txn(api::etcdserverpb::TxnRequest {
            success: ops,
            ..Default::default()
        }))
        .revision
    }

    fn compact(&mut self, revision: i64) {
        self.apply(Request::Compact(CompactionRequest {
            revision,
            physical: false,
        }));
    }

    fn target(&self) -> WatchTarget {
        WatchTarget {
            store: self.store.clone(),
            hub: self.hub.clone(),
            header: ResponseHeader {
                cluster_id: 11,
                member_id: 22,
                revision: 0,
                raft_term: 3,
            },
            caller: Default::default(),
            max_watchers: self.max_watchers,
            refusal: None,
        }
    }

    fn open(&self, config: WatchConfig, out_buffer: usize) -> Client {
        self.open_bounded(config, out_buffer, OUTPUT_BYTES).0
    }

    /// `open` with `out_bytes` for the stream's output budget, which it answers too.
    fn open_bounded(
        &self,
        config: WatchConfig,
        out_buffer: usize,
        out_bytes: usize,
    ) -> (Client, OutputBytes) {
        let (req_tx, req_rx) = mpsc::channel(64);
        let (out_tx, out_rx) = mpsc::channel(out_buffer);
        let input = tokio_stream::wrappers::ReceiverStream::new(req_rx);
        let bytes = OutputBytes::new(out_bytes);
        let output = Output {
            tx: out_tx,
            bytes: bytes.clone(),
        };
        tokio::spawn(run_stream(self.target(), config, input, output));
        let client = Client {
            req: req_tx,
            out: Box::pin(bytes.clone().stream(out_rx)),
        };
        (client, bytes)
    }

    /// What a watcher of `spec` from `start` must receive, from the history: written from
    /// etcd's rules, not with `WatchSpec`'s own methods (an empty end is the key alone, `"\0"`
    /// every key from it, else `[key, end)`; NOPUT and NODELETE drop those events; prev_kv
    /// only when asked for), so a bug there cannot hide in the expectation.
    fn expected(&self, spec: &WatchSpec, start: i64) -> Vec<Event> {
        let (key, end) = (spec.key.as_slice(), spec.range_end.as_slice());
        self.history
            .iter()
            .filter(|e| {
                let kv = e.kv.as_ref().expect("an event has a kv");
                let k = kv.key.as_slice();
                let in_range = match end {
                    [] => k == key,
                    [0] => k >= key,
                    _ => key <= k && k < end,
                };
                let is_put = e.r#type == EventType::Put as i32;
                kv.mod_revision >= start
                    && in_range
                    && !(is_put && spec.no_put)
                    && (is_put || !spec.no_delete)
            })
            .map(|e| {
                let mut e = e.clone();
                if !spec.prev_kv {
                    e.prev_kv = None;
                }
                e
            })
            .collect()
    }
}

struct Client {
    req: mpsc::Sender<Result<WatchRequest, Status>>,
    out: ResponseStream,
}

fn create_req(key: &str, range_end: &str, start: i64) -> WatchCreateRequest {
    WatchCreateRequest {
        key: key.into(),
        range_end: range_end.into(),
        start_revision: start,
        ..Default::default()
    }
}

impl Client {
    async fn send(&self, u: RequestUnion) {
        self.req
            .send(Ok(WatchRequest {
                request_union: Some(u),
            }))
            .await
            .expect("stream task alive");
    }

    async fn create(&self, c: WatchCreateRequest) {
        self.send(RequestUnion::CreateRequest(c)).await;
    }

    async fn next(&mut self) -> WatchResponse {
        tokio::time::timeout(WAIT, futures::StreamExt::next(&mut self.out))
            .await
            .expect("a response within the wait")
            .expect("stream open")
            .expect("not an error")
    }

    /// Asserts nothing arrives for a short while (used only where the absence is the point).
    async fn quiet(&mut self) {
        let r = tokio::time::timeout(
            Duration::from_millis(200),
            futures::StreamExt::next(&mut self.out),
        )
        .await;
        assert!(r.is_err(), "unexpected response {r:?}");
    }

    /// Collects event responses of `watch_id` until `n` events arrived.
    async fn events(&mut self, watch_id: i64, n: usize) -> Vec<WatchResponse> {
        let mut got = Vec::new();
        let mut count = 0;
        while count < n {
            let r = self.next().await;
            assert_eq!(r.watch_id, watch_id, "unexpected response {r:?}");
            assert!(!r.canceled, "unexpected cancel {r:?}");
            count += r.events.len();
            got.push(r);
        }
        assert_eq!(count, n);
        got
    }
}

fn flatten(rs: &[WatchResponse]) -> Vec<Event> {
    rs.iter().flat_map(|r| r.events.iter().cloned()).collect()
}

/// No response holds part of a revision whose other events are in another response.
fn assert_atomic(rs: &[WatchResponse]) {
    let mut last_rev_of_prev: Option<i64> = None;
    for r in rs.iter().filter(|r| !r.events.is_empty()) {
        let first = event_revision(&r.events[0]);
        if let Some(prev) = last_rev_of_prev {
            assert!(
                first > prev,
                "revision {first} split across responses or reordered"
            );
        }
        last_rev_of_prev = r.events.last().map(event_revision);
    }
}

#[tokio::test]
async fn created_then_live_events_with_etcd_headers() {
    let mut h = Harness::new(DEFAULT_STREAM_BUFFER);
    h.put("a", "0");
    let mut c = h.open(WatchConfig::default(), 16);
    c.create(create_req("a", "", 0)).await;
    let created = c.next().await;
    assert!(created.created && !created.canceled);
    assert_eq!(created.watch_id, 0);
    let hdr = created.header.unwrap();
    assert_eq!(
        (hdr.cluster_id, hdr.member_id, hdr.raft_term, hdr.revision),
        (11, 22, 3, 2)
    );
    let r1 = h.put("a", "1");
    h.put("b", "x");
    let r3 = h.put("a", "2");
    let rs = c.events(0, 2).await;
    assert_eq!(
        rs.len(),
        2,
        "one response per revision for a synced watcher"
    );
    assert_eq!(rs[0].header.as_ref().unwrap().revision, r1);
    assert_eq!(rs[1].header.as_ref().unwrap().revision, r3);
    assert_eq!(flatten(&rs), h.expected(&WatchSpec::range(b"a", b""), 3));
    assert!(rs[0].events[0].prev_kv.is_none(), "prev_kv only when asked");
}

#[tokio::test]
async fn past_start_replays_history_then_goes_live() {
    let mut h = Harness::new(DEFAULT_STREAM_BUFFER);
    for i in 0..10 {
        h.put(&format!("k{}", i % 3), &i.to_string());
    }
    h.delete("k1", "");
    let mut c = h.open(WatchConfig::default(), 16);
    c.create(create_req("k", "l", 3)).await;
    let created = c.next().await;
    assert!(created.created);
    assert_eq!(created.header.as_ref().unwrap().revision, 12);
    let replay = c.events(0, 10).await;
    // etcd sends the whole catch-up at once, with the current revision in the header.
    assert_eq!(replay.len(), 1);
    assert_eq!(replay[0].header.as_ref().unwrap().revision, 12);
    let rev = h.put("k9", "live");
    let live = c.events(0, 1).await;
    assert_eq!(live[0].header.as_ref().unwrap().revision, rev);
    let mut all = replay;
    all.extend(live);
    assert_eq!(flatten(&all), h.expected(&WatchSpec::range(b"k", b"l"), 3));
    let last = flatten(&all);
    assert_eq!(last[9].r#type, EventType::Delete as i32);
}

#[tokio::test]
async fn future_start_waits_for_its_revision() {
    let mut h = Harness::new(DEFAULT_STREAM_BUFFER);
    h.put("a", "0");
    let mut c = h.open(WatchConfig::default(), 16);
    c.create(create_req("a", "", 4)).await;
    assert!(c.next().await.created);
    h.put("a", "1"); // rev 3: before the start
    h.put("a", "2"); // rev 4
    let rs = c.events(0, 1).await;
    assert_eq!(event_revision(&rs[0].events[0]), 4);
}

/// A watcher waiting for a future revision that is sent to catch up (a checkpoint reload
/// desyncs every watcher) keeps its start: the catch-up finds nothing yet and must not move the
/// watcher back to the store's revision, or it would get events from before its start.
#[tokio::test]
async fn future_start_survives_a_catch_up() {
    let mut h = Harness::new(DEFAULT_STREAM_BUFFER);
    h.put("a", "0"); // rev 2
    let mut c = h.open(WatchConfig::default(), 16);
    c.create(create_req("a", "", 6)).await;
    assert!(c.next().await.created);
    assert_eq!(h.hub.desync_all(3), 1);
    // Let the stream's catch-up run while the store is still below the start.
    tokio::time::sleep(Duration::from_millis(100)).await;
    for i in 1..=5 {
        h.put("a", &i.to_string()); // revs 3..=7
    }
    let rs = c.events(0, 2).await;
    let revs: Vec<i64> = flatten(&rs).iter().map(event_revision).collect();
    assert_eq!(revs, [6, 7]);
}

#[tokio::test]
async fn compacted_start_is_created_then_cancelled_like_etcd() {
    let mut h = Harness::new(DEFAULT_STREAM_BUFFER);
    for i in 0..6 {
        h.put("k", &i.to_string());
    }
    h.compact(5);
    let mut c = h.open(WatchConfig::default(), 16);
    c.create(create_req("k", "", 2)).await;
    let created = c.next().await;
    assert!(created.created && !created.canceled);
    let cancel = c.next().await;
    assert!(cancel.canceled && !cancel.created);
    assert_eq!(cancel.compact_revision, 5);
    assert_eq!(cancel.watch_id, created.watch_id);
    assert_eq!(cancel.cancel_reason, "");
    // etcd 3.4/3.5 leave the header revision at 0 on this response.
    assert_eq!(cancel.header.as_ref().unwrap().revision, 0);
    assert_eq!(h.hub.watcher_count(), 0);
}

#[tokio::test]
async fn negative_start_and_duplicate_ids_are_refused_as_etcd_does() {
    let mut h = Harness::new(DEFAULT_STREAM_BUFFER);
    h.put("a", "0");
    let mut c = h.open(WatchConfig::default(), 16);
    c.create(create_req("a", "", -1)).await;
    let neg = c.next().await;
    assert!(neg.created && neg.canceled);
    assert_eq!(neg.watch_id, INVALID_WATCH_ID);
    assert_eq!(
        neg.cancel_reason,
        "etcdserver: mvcc: required revision has been compacted"
    );
    let mut with_id = create_req("a", "", 0);
    with_id.watch_id = 7;
    c.create(with_id.clone()).await;
    assert_eq!(c.next().await.watch_id, 7);
    c.create(with_id).await;
    let dup = c.next().await;
    assert!(dup.created && dup.canceled);
    assert_eq!(dup.watch_id, INVALID_WATCH_ID);
    assert_eq!(
        dup.cancel_reason,
        "mvcc: duplicate watch ID provided on the WatchStream"
    );
    c.create(create_req("a", "", 0)).await;
    assert_eq!(c.next().await.watch_id, 0, "generated ids start at 0");
    assert_eq!(h.hub.watcher_count(), 2);
}

/// A range whose end is not above its key watches nothing: etcd's watchStream refuses it before
/// looking at the id or the start revision (found by `tests/tests/etcd_differential.rs`).
#[tokio::test]
async fn an_empty_range_is_refused_before_the_id_and_the_revision() {
    let mut h = Harness::new(DEFAULT_STREAM_BUFFER);
    let revision = h.put("a", "0");
    let mut c = h.open(WatchConfig::default(), 16);
    let mut taken = create_req("k", "", 0);
    taken.watch_id = 3;
    c.create(taken.clone()).await;
    assert_eq!(c.next().await.watch_id, 3);
    for (key, end) in [("k2", "k10"), ("k", "k")] {
        let mut req = create_req(key, end, 0);
        req.watch_id = 3;
        c.create(req).await;
        let refused = c.next().await;
        assert!(refused.created && refused.canceled, "{key}..{end}");
        assert_eq!(refused.watch_id, INVALID_WATCH_ID);
        assert_eq!(refused.cancel_reason, "mvcc: watcher range is empty");
        assert_eq!(refused.header.as_ref().unwrap().revision, revision);
    }
    // Every key from "k" on (`"\0"`) is not an empty range.
    c.create(create_req("k", "\0", 0)).await;
    let created = c.next().await;
    assert!(created.created && !created.canceled);
    assert_eq!(h.hub.watcher_count(), 2);
}

#[tokio::test]
async fn cancel_answers_and_stops_events_unknown_ids_get_nothing() {
    let mut h = Harness::new(DEFAULT_STREAM_BUFFER);
    let mut c = h.open(WatchConfig::default(), 16);
    c.create(create_req("a", "", 0)).await;
    c.create(create_req("b", "", 0)).await;
    assert_eq!(c.next().await.watch_id, 0);
    assert_eq!(c.next().await.watch_id, 1);
    c.send(RequestUnion::CancelRequest(WatchCancelRequest {
        watch_id: 0,
    }))
    .await;
    let cancel = c.next().await;
    assert!(cancel.canceled && cancel.watch_id == 0 && !cancel.created);
    c.send(RequestUnion::CancelRequest(WatchCancelRequest {
        watch_id: 42,
    }))
    .await;
    h.put("a", "x");
    let rev = h.put("b", "y");
    let rs = c.events(1, 1).await;
    assert_eq!(event_revision(&rs[0].events[0]), rev);
    c.quiet().await;
}

#[tokio::test]
async fn filters_and_prev_kv() {
    let mut h = Harness::new(DEFAULT_STREAM_BUFFER);
    h.put("a", "old");
    let mut c = h.open(WatchConfig::default(), 16);
    let mut no_put = create_req("a", "", 0);
    no_put.filters = vec![FilterType::Noput as i32];
    no_put.prev_kv = true;
    let mut no_delete = create_req("a", "", 0);
    no_delete.filters = vec![FilterType::Nodelete as i32];
    no_delete.prev_kv = true;
    c.create(no_put).await;
    c.create(no_delete).await;
    c.next().await;
    c.next().await;
    h.put("a", "new");
    h.delete("a", "");
    let put_resp = c.next().await;
    assert_eq!(put_resp.watch_id, 1);
    let ev = &put_resp.events[0];
    assert_eq!(ev.r#type, EventType::Put as i32);
    assert_eq!(ev.prev_kv.as_ref().unwrap().value, b"old");
    let del_resp = c.next().await;
    assert_eq!(del_resp.watch_id, 0);
    let ev = &del_resp.events[0];
    assert_eq!(ev.r#type, EventType::Delete as i32);
    assert_eq!(ev.prev_kv.as_ref().unwrap().value, b"new");
    c.quiet().await;
}

#[tokio::test]
async fn a_txn_revision_arrives_in_one_response() {
    let mut h = Harness::new(DEFAULT_STREAM_BUFFER);
    let mut c = h.open(WatchConfig::default(), 16);
    c.create(create_req("t", "u", 0)).await;
    c.next().await;
    let rev = h.txn_puts(&["t1", "t2", "t3"], "v");
    let rs = c.events(0, 3).await;
    assert_eq!(rs.len(), 1);
    assert!(rs[0].events.iter().all(|e| event_revision(e) == rev));
}

#[tokio::test]
async fn large_responses_are_fragmented_only_when_asked() {
    let mut h = Harness::new(DEFAULT_STREAM_BUFFER);
    let config = WatchConfig {
        max_response_bytes: 4096,
        ..WatchConfig::default()
    };
    let mut c = h.open(config, 64);
    let mut frag = create_req("f", "g", 0);
    frag.fragment = true;
    c.create(frag).await;
    c.create(create_req("f", "g", 0)).await;
    c.next().await;
    c.next().await;
    let keys: Vec<String> = (0..20).map(|i| format!("f{i:02}")).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    h.apply(Request::Txn(api::etcdserverpb::TxnRequest {
        success: refs
            .iter()
            .map(|k| RequestOp {
                request: Some(request_op::Request::RequestPut(PutRequest {
                    key: k.as_bytes().to_vec(),
                    value: vec![b'x'; 1000],
                    ..Default::default()
                })),
            })
            .collect(),
        ..Default::default()
    }));
    let mut parts = Vec::new();
    loop {
        let r = c.next().await;
        if r.watch_id == 1 {
            assert!(!r.fragment);
            assert_eq!(r.events.len(), 20);
            continue;
        }
        let last = !r.fragment;
        parts.push(r);
        if last {
            break;
        }
    }
    assert!(parts.len() >= 5, "{} fragments", parts.len());
    assert_eq!(parts.iter().map(|p| p.events.len()).sum::<usize>(), 20);
}

#[tokio::test]
async fn request_progress_reports_the_revision_once_synced() {
    let mut h = Harness::new(DEFAULT_STREAM_BUFFER);
    let mut c = h.open(WatchConfig::default(), 16);
    // No watchers: etcd 3.5 answers nothing.
    c.send(RequestUnion::ProgressRequest(WatchProgressRequest {}))
        .await;
    c.quiet().await;
    c.create(create_req("a", "", 0)).await;
    c.next().await;
    h.put("a", "1");
    let rev = h.put("other", "1");
    c.events(0, 1).await;
    c.send(RequestUnion::ProgressRequest(WatchProgressRequest {}))
        .await;
    let p = c.next().await;
    assert_eq!(p.watch_id, INVALID_WATCH_ID);
    assert!(p.events.is_empty() && !p.created && !p.canceled);
    assert_eq!(p.header.as_ref().unwrap().revision, rev);
}

/// A watcher caught up from history while the store is ahead of the hub (applied, not yet
/// published) gets nothing past the hub's revision that way, so a progress answer (the hub's
/// revision) never falls below an event already sent; the rest comes when it is published.
#[tokio::test]
async fn catch_up_stops_at_the_hubs_revision() {
    let mut h = Harness::new(DEFAULT_STREAM_BUFFER);
    let first = h.put("a", "1");
    // Applied to the store only, as between an apply and its publication.
    h.index += 1;
    let entry = Entry {
        format_version: api::ENTRY_FORMAT_VERSION,
        tenant: "test".into(),
        request_id: Vec::new(),
        time_ms: 1_000 + h.index as i64,
        request: Some(Request::Put(PutRequest {
            key: b"a".to_vec(),
            value: b"2".to_vec(),
            ..Default::default()
        })),
        ..Default::default()
    };
    let unpublished = h.store.write().unwrap().apply(h.index, &entry);
    let mut c = h.open(WatchConfig::default(), 16);
    c.create(create_req("a", "", first)).await;
    assert!(c.next().await.created);
    let caught_up = c.events(0, 1).await;
    assert_eq!(event_revision(&caught_up[0].events[0]), first);
    c.send(RequestUnion::ProgressRequest(WatchProgressRequest {}))
        .await;
    let p = c.next().await;
    assert_eq!(p.watch_id, INVALID_WATCH_ID, "{p:?}");
    assert!(p.header.as_ref().unwrap().revision >= first);
    // Published now: it arrives.
    h.hub.notify(unpublished.revision, &unpublished.events);
    let live = c.events(0, 1).await;
    assert_eq!(event_revision(&live[0].events[0]), unpublished.revision);
}

#[tokio::test(start_paused = true)]
async fn periodic_progress_only_for_idle_progress_watchers() {
    let mut h = Harness::new(DEFAULT_STREAM_BUFFER);
    let config = WatchConfig {
        progress_notify_interval: Duration::from_secs(1),
        ..WatchConfig::default()
    };
    let mut c = h.open(config, 16);
    let mut with_progress = create_req("a", "", 0);
    with_progress.progress_notify = true;
    c.create(with_progress).await;
    c.create(create_req("b", "", 0)).await;
    c.next().await;
    c.next().await;
    let rev = h.put("zzz", "1");
    let p = c.next().await; // the paused clock jumps to the first tick
    assert_eq!(p.watch_id, 0);
    assert!(p.events.is_empty());
    assert_eq!(p.header.as_ref().unwrap().revision, rev);
    // An event in the interval elides the next notification (etcd's progress map).
    let rev2 = h.put("a", "1");
    let e = c.next().await;
    assert_eq!(event_revision(&e.events[0]), rev2);
    let p2 = c.next().await;
    assert!(p2.events.is_empty() && p2.watch_id == 0);
    assert_eq!(p2.header.as_ref().unwrap().revision, rev2);
}

/// A consumer that stops reading: its watchers fall behind, `notify` never waits, and once it
/// reads again it receives every event exactly once, in order, revisions whole.
#[tokio::test]
async fn slow_consumer_is_caught_up_from_history_without_gaps() {
    let mut h = Harness::new(4);
    let mut slow = h.open(WatchConfig::default(), 1);
    let mut fast = h.open(WatchConfig::default(), 4096);
    slow.create(create_req("k", "l", 0)).await;
    slow.create(create_req("k5", "", 0)).await;
    fast.create(create_req("k", "l", 0)).await;
    slow.next().await;
    slow.next().await;
    fast.next().await;
    let first = h.store.read().unwrap().revision() + 1;
    for i in 0..600 {
        if i % 50 == 7 {
            h.txn_puts(&["k1", "k5", "k7"], &i.to_string());
        } else if i % 40 == 3 {
            h.delete("k5", "");
        } else {
            h.put(&format!("k{}", i % 10), &i.to_string());
        }
    }
    // Every write above returned while the slow stream read nothing.
    let fast_rs = fast
        .events(0, h.expected(&WatchSpec::range(b"k", b"l"), first).len())
        .await;
    assert_atomic(&fast_rs);
    let slow_spec_all = WatchSpec::range(b"k", b"l");
    let slow_spec_k5 = WatchSpec::range(b"k5", b"");
    let want_all = h.expected(&slow_spec_all, first);
    let want_k5 = h.expected(&slow_spec_k5, first);
    let mut got: BTreeMap<i64, Vec<WatchResponse>> = BTreeMap::new();
    let mut counts = [0usize; 2];
    while counts[0] < want_all.len() || counts[1] < want_k5.len() {
        let r = slow.next().await;
        assert!(!r.canceled && !r.created, "{r:?}");
        counts[r.watch_id as usize] += r.events.len();
        got.entry(r.watch_id).or_default().push(r);
    }
    assert_eq!(flatten(&got[&0]), want_all);
    assert_eq!(flatten(&got[&1]), want_k5);
    assert_atomic(&got[&0]);
    assert_atomic(&got[&1]);
    // Caught up: both are synced again and live events flow.
    let rev = h.put("k5", "live");
    let mut live = [slow.next().await, slow.next().await];
    live.sort_by_key(|r| r.watch_id);
    assert!(live.iter().all(|r| event_revision(&r.events[0]) == rev));
    assert_eq!(h.hub.unsynced_count(), 0);
}

/// A stream that does not read holds about its byte bound of events, not its 128 responses:
/// past the bound its watcher falls back to history, and once the stream reads it still gets
/// every event once, in order.
#[tokio::test]
async fn a_stream_that_does_not_read_holds_its_byte_bound_then_catches_up() {
    const PUTS: usize = 100;
    let mut h = Harness::with_limits(DEFAULT_STREAM_BUFFER, 4 * 1024);
    let mut slow = h.open(WatchConfig::default(), 1);
    slow.create(create_req("k", "l", 0)).await;
    slow.next().await;
    let first = h.store.read().unwrap().revision() + 1;
    let value = "v".repeat(1024);
    for i in 0..PUTS {
        h.put(&format!("k{}", i % 10), &value);
    }
    assert!(
        h.hub.unsynced_count() > 0,
        "{PUTS} responses of 1 KiB queued for a stream bounded to 4 KiB"
    );
    let want = h.expected(&WatchSpec::range(b"k", b"l"), first);
    assert_eq!(want.len(), PUTS);
    let mut got = Vec::new();
    while flatten(&got).len() < PUTS {
        got.push(slow.next().await);
    }
    assert_eq!(flatten(&got), want);
    assert_atomic(&got);
    let rev = h.put("k0", "live");
    assert_eq!(event_revision(&slow.next().await.events[0]), rev);
    assert_eq!(h.hub.unsynced_count(), 0);
}

/// A stream whose client does not read queues responses towards gRPC up to its byte budget,
/// not its response count: the task then waits, the hub holds the rest (here: past its own
/// bound, so the watcher goes unsynced), and reading gets every event in order.
#[tokio::test]
async fn a_stream_that_does_not_read_queues_at_most_its_output_bytes() {
    const PUTS: usize = 20;
    const BUDGET: usize = 250 * 1024;
    let mut h = Harness::with_limits(DEFAULT_STREAM_BUFFER, 1024 * 1024);
    let (mut slow, bytes) = h.open_bounded(WatchConfig::default(), 64, BUDGET);
    slow.create(create_req("k", "l", 0)).await;
    slow.next().await;
    let first = h.store.read().unwrap().revision() + 1;
    let value = "v".repeat(100 * 1024);
    for i in 0..PUTS {
        h.put(&format!("k{}", i % 5), &value);
        // The stream task runs between puts: it moves each response to its output while it may.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(bytes.held() <= BUDGET, "{} bytes queued", bytes.held());
    }
    assert!(
        bytes.held() > BUDGET / 2,
        "the output filled: {}",
        bytes.held()
    );
    assert!(
        h.hub.unsynced_count() > 0,
        "{PUTS} responses of 100 KiB: a 64-response output would have taken them all"
    );
    let want = h.expected(&WatchSpec::range(b"k", b"l"), first);
    let mut got = Vec::new();
    while flatten(&got).len() < PUTS {
        got.push(slow.next().await);
    }
    assert_eq!(flatten(&got), want);
    assert_atomic(&got);
    assert_eq!(bytes.held(), 0, "every response read gave its bytes back");
}

#[tokio::test]
async fn slow_watcher_whose_position_is_compacted_is_cancelled() {
    let mut h = Harness::new(2);
    let mut slow = h.open(WatchConfig::default(), 1);
    slow.create(create_req("k", "", 0)).await;
    slow.next().await;
    for i in 0..20 {
        h.put("k", &i.to_string());
    }
    let compact_at = h.put("k", "last");
    h.compact(compact_at);
    // What was queued before it fell behind still arrives, in order, then the cancel.
    let mut last_rev = 0;
    loop {
        let r = slow.next().await;
        if r.canceled {
            assert_eq!(r.compact_revision, compact_at);
            assert_eq!(r.watch_id, 0);
            break;
        }
        for e in &r.events {
            assert!(event_revision(e) > last_rev);
            last_rev = event_revision(e);
        }
    }
    assert!(last_rev < compact_at);
    assert_eq!(h.hub.watcher_count(), 0);
}

/// Seeded model test: random writes (puts, deletes, txns, compactions lagging the head),
/// random watchers (ranges, start revisions, filters, prev_kv) on streams read concurrently at
/// different speeds; every watcher must receive exactly the history's events it selects from its
/// start, in order, with revisions whole, or be cancelled for compaction after a gap-free prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_histories_match_the_model() {
    /// Per stream: delay after each response read (slow, medium, fast reader).
    const READ_DELAYS_MS: [u64; 3] = [3, 1, 0];
    let seed: u64 = std::env::var("WATCH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_2026);
    println!("REPLAY WITH: WATCH_SEED={seed} cargo test -p strata-frontend random_histories");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut h = Harness::new(8);
    let keys = ["a", "b", "c", "d", "e"];
    for k in keys {
        h.put(k, "init");
    }
    struct W {
        client: usize,
        id: i64,
        spec: WatchSpec,
        start: i64,
    }
    let mut clients: Vec<Client> = (0..READ_DELAYS_MS.len())
        .map(|i| h.open(WatchConfig::default(), [1, 4, 64][i]))
        .collect();
    let mut watchers = Vec::new();
    let mut early: Vec<Vec<WatchResponse>> = vec![Vec::new(); clients.len()];
    for (ci, client) in clients.iter_mut().enumerate() {
        for _ in 0..3 {
            let k = rng.random_range(0..keys.len());
            let range_end = match rng.random_range(0..3) {
                0 => String::new(),
                1 => "\0".to_string(),
                _ => keys[(k + 2).min(keys.len() - 1)].to_string() + "z",
            };
            let now = h.store.read().unwrap().revision();
            let start = match rng.random_range(0..3) {
                0 => 0,
                1 => rng.random_range(1..=now),
                _ => now + rng.random_range(1..20),
            };
            let mut req = create_req(keys[k], &range_end, start);
            req.prev_kv = rng.random_bool(0.5);
            if rng.random_bool(0.2) {
                req.filters = vec![FilterType::Nodelete as i32];
            }
            client.create(req.clone()).await;
            // Catch-up of a watcher created just before may come first.
            let created = loop {
                let r = client.next().await;
                if r.created {
                    break r;
                }
                early[ci].push(r);
            };
            assert!(!created.canceled);
            let start = if start == 0 {
                created.header.as_ref().unwrap().revision + 1
            } else {
                start
            };
            watchers.push(W {
                client: ci,
                id: created.watch_id,
                spec: WatchSpec::from_request(&req),
                start,
            });
        }
    }
    // Readers run during the load; once the history is complete they learn how many events
    // each of their watchers must get and stop when every watcher has them or was cancelled.
    let mut want_txs = Vec::new();
    let readers: Vec<_> = clients
        .into_iter()
        .zip(early)
        .enumerate()
        .map(|(ci, (mut client, early))| {
            let (want_tx, mut want_rx) = tokio::sync::watch::channel(None::<BTreeMap<i64, usize>>);
            want_txs.push(want_tx);
            tokio::spawn(async move {
                let mut got: BTreeMap<i64, Vec<WatchResponse>> = BTreeMap::new();
                let mut cancelled: BTreeMap<i64, i64> = BTreeMap::new();
                let mut early = early.into_iter();
                loop {
                    if let Some(want) = want_rx.borrow_and_update().as_ref() {
                        let complete = want.iter().all(|(id, n)| {
                            cancelled.contains_key(id)
                                || got.get(id).map_or(0, |rs| flatten(rs).len()) >= *n
                        });
                        if complete {
                            return (got, cancelled);
                        }
                    }
                    let r = match early.next() {
                        Some(r) => r,
                        None => tokio::select! {
                            r = client.next() => r,
                            _ = want_rx.changed() => continue,
                        },
                    };
                    if r.canceled {
                        assert!(r.compact_revision > 0, "{r:?}");
                        cancelled.insert(r.watch_id, r.compact_revision);
                    } else {
                        got.entry(r.watch_id).or_default().push(r);
                    }
                    if READ_DELAYS_MS[ci] > 0 {
                        tokio::time::sleep(Duration::from_millis(READ_DELAYS_MS[ci])).await;
                    }
                }
            })
        })
        .collect();
    let mut compacted = 0;
    for step in 0..400 {
        let k = keys[rng.random_range(0..keys.len())];
        match rng.random_range(0..10) {
            0..=5 => {
                h.put(k, &step.to_string());
            }
            6 => {
                h.delete(k, "");
            }
            7 => {
                h.delete("a", "\0");
            }
            8 => {
                h.txn_puts(&["a", "c", "e"], &step.to_string());
            }
            _ => {
                // Compactions lag the head, so fast readers keep up and slow ones may not.
                let rev = h.store.read().unwrap().revision();
                let target = rev - rng.random_range(30..120);
                if rng.random_bool(0.3) && target > compacted {
                    compacted = target;
                    h.compact(compacted);
                }
            }
        }
        if step % 10 == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    let mut complete = 0;
    let mut cancelled_total = 0;
    for (ci, reader) in readers.into_iter().enumerate() {
        let mine: Vec<&W> = watchers.iter().filter(|w| w.client == ci).collect();
        let want: BTreeMap<i64, Vec<Event>> = mine
            .iter()
            .map(|w| (w.id, h.expected(&w.spec, w.start)))
            .collect();
        want_txs[ci].send_replace(Some(want.iter().map(|(id, e)| (*id, e.len())).collect()));
        let (mut got, cancelled) = tokio::time::timeout(WAIT, reader)
            .await
            .unwrap_or_else(|_| panic!("seed {seed}: stream {ci} never delivered everything"))
            .expect("reader ok");
        for w in mine {
            let rs = got.remove(&w.id).unwrap_or_default();
            assert_atomic(&rs);
            let events = flatten(&rs);
            let want = &want[&w.id];
            if let Some(at) = cancelled.get(&w.id) {
                cancelled_total += 1;
                assert!(
                    events.len() <= want.len() && events[..] == want[..events.len()],
                    "seed {seed}: watcher {} on stream {ci} diverged before its cancel",
                    w.id
                );
                // Cancelled only when its position really was compacted.
                let next = events.last().map_or(w.start, |e| event_revision(e) + 1);
                assert!(
                    next <= *at,
                    "seed {seed}: cancelled at {at} though at {next}"
                );
            } else {
                if events != *want {
                    let first = events.iter().zip(want.iter()).position(|(a, b)| a != b);
                    panic!(
                        "seed {seed}: watcher {} on stream {ci} diverged from the model: got {} \
                         events, want {}, first difference at {first:?}: {:?} vs {:?}",
                        w.id,
                        events.len(),
                        want.len(),
                        first.map(|i| &events[i]),
                        first.map(|i| &want[i])
                    );
                }
                complete += 1;
            }
        }
    }
    println!("{complete} watchers complete, {cancelled_total} cancelled by compaction");
    assert!(
        complete > 0,
        "seed {seed}: no watcher's whole history was checked"
    );
}

/// Fan-out figure (docs/watch.md): 1000 watchers of one key over 100 streams, 1000 writes;
/// every event must reach every watcher. Prints throughput and the mean `notify` cost; asserts
/// only completeness. Run: `cargo test -p strata-frontend --release -- --ignored
/// watch_fanout_figure --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a figure, not a check: run on demand with --release"]
async fn watch_fanout_figure() {
    const STREAMS: usize = 100;
    const PER_STREAM: usize = 10;
    const WRITES: usize = 1000;
    let mut h = Harness::new(DEFAULT_STREAM_BUFFER);
    let mut clients = Vec::new();
    for _ in 0..STREAMS {
        let mut c = h.open(WatchConfig::default(), 1024);
        for _ in 0..PER_STREAM {
            c.create(create_req("k", "", 0)).await;
        }
        for _ in 0..PER_STREAM {
            assert!(c.next().await.created);
        }
        clients.push(c);
    }
    let readers: Vec<_> = clients
        .into_iter()
        .map(|mut c| {
            tokio::spawn(async move {
                let mut n = 0;
                while n < WRITES * PER_STREAM {
                    n += c.next().await.events.len();
                }
                n
            })
        })
        .collect();
    let start = std::time::Instant::now();
    let mut in_notify = Duration::ZERO;
    for i in 0..WRITES {
        h.index += 1;
        let entry = Entry {
            format_version: api::ENTRY_FORMAT_VERSION,
            tenant: "test".into(),
            request_id: h.index.to_be_bytes().to_vec(),
            time_ms: h.index as i64,
            request: Some(Request::Put(PutRequest {
                key: b"k".to_vec(),
                value: vec![b'v'; 100],
                ..Default::default()
            })),
            ..Default::default()
        };
        let applied = h.store.write().unwrap().apply(h.index, &entry);
        let t = std::time::Instant::now();
        h.hub.notify(applied.revision, &applied.events);
        in_notify += t.elapsed();
        if i % 100 == 0 {
            tokio::task::yield_now().await;
        }
    }
    let mut total = 0;
    for r in readers {
        total += r.await.unwrap();
    }
    let elapsed = start.elapsed();
    assert_eq!(total, STREAMS * PER_STREAM * WRITES);
    println!(
        "FIGURE: {} watchers, {WRITES} writes: {total} events in {elapsed:?} ({:.0} events/s), \
         mean notify {:?}, watchers that fell behind: {}",
        STREAMS * PER_STREAM,
        total as f64 / elapsed.as_secs_f64(),
        in_notify / WRITES as u32,
        h.hub.unsynced_count()
    );
}

/// A watch created while the store is ahead of the hub (entries applied, not yet published)
/// is answered once the hub has caught up: its created header carries the store's revision,
/// and no progress answer after it carries less (a client would see the revision go back).
#[tokio::test]
async fn created_header_is_never_above_a_following_progress_answer() {
    let mut h = Harness::new(DEFAULT_STREAM_BUFFER);
    h.put("a", "1");
    // Two entries applied to the store only, as the replica does before it publishes them.
    let held: Vec<Applied> = ["2", "3"]
        .into_iter()
        .map(|v| {
            h.apply_unpublished(Request::Put(PutRequest {
                key: "a".into(),
                value: v.into(),
                ..Default::default()
            }))
        })
        .collect();
    let store_rev = h.store.read().unwrap().revision();
    assert!(h.hub.revision() < store_rev);
    let mut c = h.open(WatchConfig::default(), 16);
    c.create(create_req("a", "", 0)).await;
    c.send(RequestUnion::ProgressRequest(WatchProgressRequest {}))
        .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    for applied in held {
        h.hub.notify(applied.revision, &applied.events);
    }
    let created = c.next().await;
    assert!(created.created);
    let created_rev = created.header.unwrap().revision;
    assert_eq!(created_rev, store_rev);
    let progress = c.next().await;
    assert!(progress.events.is_empty() && !progress.created);
    assert!(
        progress.header.unwrap().revision >= created_rev,
        "a progress answer below the created header"
    );
}

/// `WatchHub::reached` returns as soon as `notify` reaches the revision (a wake-up, not its
/// timeout), and at once when the hub is there already.
#[tokio::test]
async fn reached_wakes_when_notify_gets_there() {
    let hub = Arc::new(WatchHub::new());
    hub.notify(3, &[]);
    assert!(hub.reached(3, Duration::ZERO).await);
    let waiting = {
        let hub = hub.clone();
        tokio::spawn(async move { hub.reached(5, WAIT).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    hub.notify(4, &[]);
    assert!(!waiting.is_finished());
    hub.notify(5, &[]);
    assert!(
        tokio::time::timeout(WAIT / 2, waiting)
            .await
            .unwrap()
            .unwrap(),
        "woken by notify, not by its timeout"
    );
}

/// `--tenant-max-watchers`: a create over the quota is refused as etcd refuses a create (created
/// and canceled, no id, the reason), on any of the tenant's streams; a cancel frees a place.
#[tokio::test]
async fn the_watcher_quota_refuses_creates_over_it() {
    let mut h = Harness::new(DEFAULT_STREAM_BUFFER);
    h.max_watchers = Some(2);
    let revision = h.put("a", "0");
    let mut first = h.open(WatchConfig::default(), 16);
    let mut second = h.open(WatchConfig::default(), 16);
    first.create(create_req("a", "", 0)).await;
    let kept = first.next().await;
    assert!(kept.created && !kept.canceled);
    second.create(create_req("b", "", 0)).await;
    assert!(!second.next().await.canceled);
    second.create(create_req("c", "", 0)).await;
    let refused = second.next().await;
    assert!(refused.created && refused.canceled);
    assert_eq!(refused.watch_id, INVALID_WATCH_ID);
    assert_eq!(
        refused.cancel_reason,
        "strata: watcher quota of 2 per frontend reached"
    );
    assert_eq!(refused.header.as_ref().unwrap().revision, revision);
    assert_eq!(h.hub.watcher_count(), 2);
    // A cancel makes room again.
    first
        .send(RequestUnion::CancelRequest(WatchCancelRequest {
            watch_id: kept.watch_id,
        }))
        .await;
    assert!(first.next().await.canceled);
    second.create(create_req("c", "", 0)).await;
    assert!(!second.next().await.canceled);
}
