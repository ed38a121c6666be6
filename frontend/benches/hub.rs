//! What `WatchHub::notify` costs the apply loop per applied put, by the watchers a tenant has:
//! thousands of single-key watchers on keys the put does not touch (leader-election observers,
//! per-node keys), prefix watchers on other prefixes, ranges between two keys elsewhere, and
//! watchers of the key put (a delivery each). `notify` runs once per applied entry, under the hub's lock, on the replica's apply
//! path. Figures: docs/benchmarks/frontend.md, "Session 16".
//!
//! `cargo bench -p strata-frontend --bench hub`

use std::time::Duration;

use api::mvccpb::{Event, KeyValue, event::EventType};
use criterion::{BenchmarkId, Criterion};
use frontend::watch::{StreamHandle, WatchHub, WatchSpec};

fn put(key: &[u8], rev: i64) -> Event {
    Event {
        r#type: EventType::Put as i32,
        kv: Some(KeyValue {
            key: key.to_vec(),
            mod_revision: rev,
            create_revision: 2,
            version: rev - 1,
            value: vec![b'v'; 256],
            ..Default::default()
        }),
        prev_kv: None,
    }
}

/// The spec of watcher `i` of a bench.
type SpecOf = fn(usize) -> WatchSpec;

/// A hub with `n` watchers from `spec(i)`, 100 to a stream.
fn hub_with(n: usize, spec: impl Fn(usize) -> WatchSpec) -> (WatchHub, Vec<StreamHandle>) {
    let hub = WatchHub::with_buffer("bench", 1 << 20);
    let mut streams: Vec<StreamHandle> = Vec::new();
    for i in 0..n {
        if i % 100 == 0 {
            streams.push(hub.open_stream());
        }
        let s = streams.last().expect("a stream").id;
        hub.register(s, 0, spec(i), 0, 1).expect("registered");
    }
    (hub, streams)
}

fn notify(c: &mut Criterion) {
    let mut g = c.benchmark_group("notify_one_put");
    let elsewhere: [(&str, SpecOf); 3] = [
        // Single-key watchers, none on the key put.
        ("key_watchers_elsewhere", |i| {
            WatchSpec::range(format!("/election/{i:06}").as_bytes(), b"")
        }),
        // Prefix watchers on other prefixes.
        ("prefix_watchers_elsewhere", |i| {
            let p = format!("/node/{i:06}/");
            let mut end = p.clone().into_bytes();
            *end.last_mut().expect("not empty") += 1;
            WatchSpec::range(p.as_bytes(), &end)
        }),
        // Ranges between two keys (not prefixes) elsewhere: still looked at one by one.
        ("range_watchers_elsewhere", |i| {
            WatchSpec::range(
                format!("/node/{i:06}/a").as_bytes(),
                format!("/node/{i:06}/m").as_bytes(),
            )
        }),
    ];
    for n in [100usize, 1_000, 10_000] {
        for (name, spec) in elsewhere {
            let (hub, _streams) = hub_with(n, spec);
            let mut rev = 1;
            g.bench_with_input(BenchmarkId::new(name, n), &n, |b, _| {
                b.iter(|| {
                    rev += 1;
                    hub.notify(rev, &[put(b"/registry/pods/a", rev)]);
                })
            });
        }
    }
    // Watchers of the key put: one delivery each, drained after every put.
    let (hub, mut streams) = hub_with(100, |_| WatchSpec::range(b"/registry/pods/a", b""));
    let mut rev = 1;
    g.bench_function("key_watchers_of_the_key/100", |b| {
        b.iter(|| {
            rev += 1;
            hub.notify(rev, &[put(b"/registry/pods/a", rev)]);
            for s in &mut streams {
                while s.deliveries.try_recv().is_ok() {}
                s.queued_bytes
                    .store(0, std::sync::atomic::Ordering::Release);
            }
        })
    });
    g.finish();
}

fn main() {
    let mut c = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    notify(&mut c);
    c.final_summary();
}
