//! Memstore figures: puts applied/s, point reads/s, 1000-key prefix ranges/s, event catch-up of
//! a watcher 100k revisions behind (criterion), and
//! bytes of memory per key plus checkpoint write/load time for 1M keys (measured once, with a
//! counting global allocator). Run: `cargo bench -p strata-memstore`; figures go to
//! docs/benchmarks/memstore.md.
// The counting allocator must implement `GlobalAlloc`, an unsafe trait; it only forwards to
// mimalloc (the allocator of the `strata` binary, whose replicas this measures) and adds the
// sizes up.
#![allow(unsafe_code)]

#[path = "support/wire.rs"]
mod wire;

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use api::etcdserverpb::{CompactionRequest, PutRequest, RangeRequest, ResponseHeader};
use api::strata::entry::{Entry, entry::Request};
use api::strata::journal::{Record, record::Kind};
use criterion::{BatchSize, Criterion, Throughput, black_box};
use memstore::checkpoint::{self, CheckpointMeta};
use memstore::{Config, MemStore};
use mimalloc::MiMalloc;
use prost::Message;
use wire::WireEncoder;

/// Bytes currently allocated through the global allocator.
static ALLOCATED: AtomicI64 = AtomicI64::new(0);

struct Counting;

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATED.fetch_add(layout.size() as i64, Ordering::Relaxed);
        unsafe { MiMalloc.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        ALLOCATED.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        unsafe { MiMalloc.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATED.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        unsafe { MiMalloc.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const KEY_LEN: usize = 64;
const VALUE_LEN: usize = 256;
const BIG: usize = 1_000_000;
const PUT_BATCH: usize = 100_000;
const READ_BATCH: usize = 4096;
/// Requests per `range_views` call in the batched-read figures (a frontend would batch the
/// point reads that arrive together).
const READ_BATCH_REQUESTS: usize = 64;
/// gRPC's length prefix before each message (a server writes it ahead of the response).
const GRPC_PREFIX: usize = 5;
const KEYS_PER_NAMESPACE: usize = 1000;
/// How far behind the head the catch-up watcher of the events bench starts.
const WATCH_BEHIND: i64 = 100_000;

/// 64-byte keys shaped like Kubernetes' (`/registry/pods/<ns>/<name>`), 1000 per namespace.
fn key(i: usize) -> Vec<u8> {
    let mut k = format!(
        "/registry/pods/ns{:04}/pod-{:08}-",
        i / KEYS_PER_NAMESPACE,
        i
    )
    .into_bytes();
    k.resize(KEY_LEN, b'x');
    k
}

fn value(i: usize) -> Vec<u8> {
    (0..VALUE_LEN)
        .map(|j| b'a' + ((i + j) % 26) as u8)
        .collect()
}

fn put_entry(i: usize) -> Entry {
    Entry {
        format_version: 1,
        tenant: "bench".into(),
        request_id: Vec::new(),
        time_ms: 1_000,
        request: Some(Request::Put(PutRequest {
            key: key(i),
            value: value(i),
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// `put_entry` with a 16-byte request id, as frontends write every entry (the store then
/// remembers each id in its de-duplication window).
fn put_entry_with_id(i: usize) -> Entry {
    let mut e = put_entry(i);
    e.request_id = (i as u128 + 1).to_le_bytes().to_vec();
    e
}

/// The entries `entry(i)` for `i` in `range` as journal records (record index `i + 1`, journal
/// time `time_ms(i)`), laid out as a replica's decoder leaves them: every payload allocated
/// once, in journal order, after the entries that made them are gone. (Built inline, each
/// payload sat between the freed temporaries of its own entry, which the store's allocations
/// then filled: puts with request ids measured 0.70M against 0.82-0.91M/CPU-s laid out like
/// this, three runs each.)
fn records(
    range: std::ops::Range<usize>,
    entry: fn(usize) -> Entry,
    time_ms: impl Fn(usize) -> i64,
) -> Vec<Record> {
    let encoded: Vec<(usize, Vec<u8>)> = range
        .map(|i| (i, api::record::encode_entry(&entry(i))))
        .collect();
    encoded
        .iter()
        .map(|(i, payload)| Record {
            index: *i as u64 + 1,
            term: 1,
            time_ms: time_ms(*i),
            kind: Some(Kind::Data(payload.clone())),
        })
        .collect()
}

/// Records of `entry(i)` for `i` below `n`, all at journal time 1,000 ms.
fn records_at_one_time(n: usize, entry: fn(usize) -> Entry) -> Vec<Record> {
    records(0..n, entry, |_| 1_000)
}

/// A put of a new value (same length) for an existing key.
fn overwrite_entry(i: usize) -> Entry {
    let mut e = put_entry(i);
    if let Some(Request::Put(p)) = &mut e.request {
        p.value.reverse();
    }
    e
}

fn build(n: usize) -> MemStore {
    // (criterion part only; the one-off figures time their own build)
    let mut s = MemStore::new(Config::default());
    for i in 0..n {
        s.apply(i as u64 + 1, &put_entry(i));
    }
    s
}

/// A fixed pseudo-random permutation step (deterministic read order).
fn scatter(i: usize, n: usize) -> usize {
    (i.wrapping_mul(2_654_435_761)) % n
}

/// CPU time this thread has spent on a core (ns), from the kernel's schedstat: figures on a
/// shared, busy machine are quoted in CPU time as well as wall time.
fn cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse().ok()))
        .unwrap_or(0)
}

/// Runs `f`, prints wall and CPU seconds and the rate of `n` operations per CPU second.
fn timed<T>(what: &str, n: usize, f: impl FnOnce() -> T) -> T {
    let (w, c) = (Instant::now(), cpu_ns());
    let out = f();
    let cpu = (cpu_ns() - c) as f64 / 1e9;
    let wall = w.elapsed().as_secs_f64();
    println!(
        "figure: {what}: wall {wall:.3} s, cpu {cpu:.3} s, {:.0} ops per cpu-second ({n} ops)",
        n as f64 / cpu
    );
    out
}

fn one_off_figures() {
    {
        let shuffled: Vec<Entry> = (0..BIG).map(|i| put_entry(scatter(i, BIG))).collect();
        let s = timed("apply 1M puts of new keys in random key order", BIG, || {
            let mut s = MemStore::new(Config::default());
            for (i, e) in shuffled.iter().enumerate() {
                s.apply(i as u64 + 1, e);
            }
            s
        });
        drop(shuffled);
        drop(s);
        let records = records_at_one_time(BIG, put_entry);
        let s = timed(
            "apply 1M puts of new keys decoded from journal records (entry_for_tenant + apply)",
            BIG,
            || {
                let mut s = MemStore::new(Config::default());
                for r in &records {
                    let e = api::record::entry_for_tenant(r, "bench").expect("bench record");
                    s.apply(r.index, &e);
                }
                s
            },
        );
        drop(s);
        let s = timed(
            "apply 1M puts of new keys decoded from journal records, by value (entry_for_tenant + apply_owned)",
            BIG,
            || {
                let mut s = MemStore::new(Config::default());
                for r in &records {
                    let e = api::record::entry_for_tenant(r, "bench").expect("bench record");
                    s.apply_owned(r.index, e);
                }
                s
            },
        );
        drop(records);
        drop(s);
        let records = records_at_one_time(BIG, put_entry);
        let s = timed(
            "apply 1M puts of new keys decoded from journal records given away (entry_for_tenant_owned + apply_owned)",
            BIG,
            || {
                let mut s = MemStore::new(Config::default());
                for r in records {
                    let index = r.index;
                    let e = api::record::entry_for_tenant_owned(r, "bench").expect("bench record");
                    s.apply_owned(index, e);
                }
                s
            },
        );
        drop(s);
        type EntryOf = fn(usize) -> Entry;
        // (what, entries, whether the store builds watch events)
        let shapes: [(&str, EntryOf, bool); 3] = [
            (
                "apply 1M puts of new keys from journal records with apply_record (the replica's path: the put read in place)",
                put_entry,
                true,
            ),
            (
                "apply 1M puts of new keys from journal records with 16-byte request ids, apply_record",
                put_entry_with_id,
                true,
            ),
            (
                "the same without building watch events (the compactor's replica)",
                put_entry_with_id,
                false,
            ),
        ];
        for (what, entry, emit) in shapes {
            let records = records_at_one_time(BIG, entry);
            let s = timed(what, BIG, || {
                let mut s = MemStore::new(Config::default());
                s.set_emit_events(emit);
                for r in records {
                    black_box(s.apply_record(r, "bench").expect("bench record"));
                }
                s
            });
            drop(s);
        }
    }
    let before = ALLOCATED.load(Ordering::Relaxed);
    let entries: Vec<Entry> = (0..BIG).map(put_entry).collect();
    let entries_bytes = ALLOCATED.load(Ordering::Relaxed) - before;
    let mut store = timed(
        "apply 1M puts of new keys (64 B key, 256 B value)",
        BIG,
        || {
            let mut s = MemStore::new(Config::default());
            for (i, e) in entries.iter().enumerate() {
                s.apply(i as u64 + 1, e);
            }
            s
        },
    );
    let used = ALLOCATED.load(Ordering::Relaxed) - before - entries_bytes;
    drop(entries);
    let raw = (BIG * (KEY_LEN + VALUE_LEN)) as f64;
    println!(
        "figure: memory for 1M keys (64 B key, 256 B value, one version): {} bytes = {:.1} B/key = {:.3}x raw key+value",
        used,
        used as f64 / BIG as f64,
        used as f64 / raw
    );
    let reads: Vec<RangeRequest> = (0..BIG)
        .map(|i| RangeRequest {
            key: key(scatter(i, BIG)),
            ..Default::default()
        })
        .collect();
    timed("point reads, uniformly random over 1M keys", BIG, || {
        for r in &reads {
            black_box(store.range(r).expect("read"));
        }
    });
    // The same reads answering less: the lookup alone (count_only: hash probe, slot, key
    // compare, no response key-value), and the lookup plus the key copy (keys_only: the value
    // is neither read nor copied). The difference to the full read is the value's miss and copy.
    type Lighten = fn(&mut RangeRequest);
    let variants: [(&str, Lighten); 2] = [
        ("count_only (the lookup alone)", |r| r.count_only = true),
        ("keys_only (no value read or copied)", |r| {
            r.keys_only = true
        }),
    ];
    for (what, set) in variants {
        let lighter: Vec<RangeRequest> = reads
            .iter()
            .map(|r| {
                let mut r = r.clone();
                set(&mut r);
                r
            })
            .collect();
        timed(
            &format!("point reads, uniformly random over 1M keys, {what}"),
            BIG,
            || {
                for r in &lighter {
                    black_box(store.range(r).expect("read"));
                }
            },
        );
    }
    let hot: Vec<RangeRequest> = (0..BIG)
        .map(|i| RangeRequest {
            key: key(scatter(i % 1000, BIG)),
            ..Default::default()
        })
        .collect();
    timed("point reads, 1000 hot keys of the 1M", BIG, || {
        for r in &hot {
            black_box(store.range(r).expect("read"));
        }
    });
    drop(reads);
    drop(hot);
    // The same reads with each request's key copied into one reused request, as a server
    // decodes a request just before serving it (the request is in cache, the store is not).
    let flat: Vec<u8> = (0..BIG).flat_map(|i| key(scatter(i, BIG))).collect();
    let mut req = RangeRequest::default();
    timed(
        "point reads, uniformly random over 1M keys, request decoded into a reused buffer",
        BIG,
        || {
            for k in flat.chunks(KEY_LEN) {
                req.key.clear();
                req.key.extend_from_slice(k);
                black_box(store.range(&req).expect("read"));
            }
        },
    );
    drop(flat);
    let flat: Vec<u8> = (0..BIG).flat_map(|i| key(scatter(i % 1000, BIG))).collect();
    timed(
        "point reads, 1000 hot keys of the 1M, request decoded into a reused buffer",
        BIG,
        || {
            for k in flat.chunks(KEY_LEN) {
                req.key.clear();
                req.key.extend_from_slice(k);
                black_box(store.range(&req).expect("read"));
            }
        },
    );
    drop(flat);
    wire_format_reads(&store);
    batched_reads(&store);
    let prefixes: Vec<RangeRequest> = (0..500)
        .map(|i| prefix_request(scatter(i, BIG / KEYS_PER_NAMESPACE)))
        .collect();
    timed("1000-key prefix ranges", prefixes.len(), || {
        for r in &prefixes {
            black_box(store.range(r).expect("range"));
        }
    });
    let rev = store.revision();
    timed(
        "events(): catch-up of the last 10 revisions over all 1M keys",
        1,
        || {
            black_box(store.events(rev - 9, b"\0", b"\0", 1000).expect("events"));
        },
    );
    let behind = rev - WATCH_BEHIND;
    let got = timed(
        "events(): watcher of all keys 100k revisions behind, max 1000",
        1,
        || black_box(store.events(behind, b"\0", b"\0", 1000).expect("events")),
    );
    assert_eq!(got.len(), 1000);
    let watched = prefix_request(950);
    let got = timed(
        "events(): watcher of one 1000-key prefix (ns0950) 100k revisions behind, max 1000",
        1,
        || {
            black_box(
                store
                    .events(behind, &watched.key, &watched.range_end, 1000)
                    .expect("events"),
            )
        },
    );
    assert_eq!(got.len(), 1000);
    let meta = CheckpointMeta {
        tenant: "bench".into(),
        shard: 0,
        index: store.applied_index(),
        revision: store.revision(),
        created_ms: 0,
    };
    let bytes = timed("checkpoint write, 1M keys", 1, || {
        checkpoint::encode(&meta, &store)
    });
    println!("figure: checkpoint size: {} bytes", bytes.len());
    // What a frontend's Snapshot holds the store for: the encode alone, into a buffer it
    // allocated and wrote to beforehand (fresh memory faulted in is most of the figure above).
    let estimate = checkpoint::encoded_len_estimate(&meta, &store);
    let buf = timed("a fresh buffer of the estimate, written once", 1, || {
        checkpoint::touched_buffer(estimate)
    });
    let again = timed("checkpoint write, 1M keys, into that buffer", 1, || {
        checkpoint::encode_into(&meta, &store, buf)
    });
    assert_eq!(again, bytes);
    drop(again);
    let (_, loaded) = timed("checkpoint load, 1M keys", 1, || {
        checkpoint::decode(&bytes).expect("bench checkpoint loads")
    });
    assert!(loaded == store);
    drop(loaded);
    load_in_a_fresh_process(&bytes);
    drop(bytes);
    // After a compaction at the head (the steady state of a compacted tenant).
    store.apply(
        BIG as u64 + 1,
        &Entry {
            format_version: 1,
            tenant: "bench".into(),
            request_id: Vec::new(),
            time_ms: 1_000,
            request: Some(Request::Compact(CompactionRequest {
                revision: rev,
                physical: true,
            })),
            ..Default::default()
        },
    );
    let used = ALLOCATED.load(Ordering::Relaxed) - before;
    println!(
        "figure: after compaction at head: {:.1} B/key = {:.3}x raw",
        used as f64 / BIG as f64,
        used as f64 / raw
    );
    // Updates of live keys (the common Kubernetes write), random key order.
    let updates: Vec<Entry> = (0..BIG).map(|i| overwrite_entry(scatter(i, BIG))).collect();
    let base = store.applied_index();
    timed(
        "apply 1M overwrites of existing keys in random key order",
        BIG,
        || {
            for (i, e) in updates.iter().enumerate() {
                black_box(store.apply(base + i as u64 + 1, e));
            }
        },
    );
}

/// One way of answering a point read in etcd's wire format (what a frontend sends): the
/// request, the frontend's header (its revision set from the answer) and a reusable buffer in;
/// the message length out.
type Answer = fn(&MemStore, &RangeRequest, &ResponseHeader, &mut Vec<u8>) -> usize;

/// Point reads answered as the bytes a frontend sends, over random keys, 1000 hot keys and one
/// key (requests decoded into one reused buffer): `range` alone (no bytes: the store's own
/// figure, for comparison), `range` then prost's encode (the frontend's path before
/// `range_view`), `range_view` encoded into a buffer allocated at its exact size per
/// read (as a server answers), and into one reused buffer (no allocation at all).
fn wire_format_reads(store: &MemStore) {
    let answers: [(&str, Answer); 4] = [
        (
            "range alone, no encoding (the response as the API type)",
            |s, r, _, _| black_box(s.range(r).expect("read")).kvs.len() * (KEY_LEN + VALUE_LEN + 1),
        ),
        ("range + prost encode, buffer per read", |s, r, h, _| {
            let mut resp = s.range(r).expect("read");
            let revision = resp.header.as_ref().map_or(0, |x| x.revision);
            resp.header = Some(ResponseHeader { revision, ..*h });
            let mut out = Vec::with_capacity(GRPC_PREFIX + resp.encoded_len());
            out.extend_from_slice(&[0; GRPC_PREFIX]);
            resp.encode_raw(&mut out);
            black_box(out).len()
        }),
        ("range_view + encode_raw, buffer per read", |s, r, h, _| {
            let view = s.range_view(r).expect("read");
            let h = ResponseHeader {
                revision: view.revision(),
                ..*h
            };
            let mut out = Vec::with_capacity(GRPC_PREFIX + view.encoded_len(&h));
            out.extend_from_slice(&[0; GRPC_PREFIX]);
            view.encode_raw(&h, &mut out);
            black_box(out).len()
        }),
        ("range_view + encode_raw, reused buffer", |s, r, h, out| {
            let view = s.range_view(r).expect("read");
            let h = ResponseHeader {
                revision: view.revision(),
                ..*h
            };
            out.clear();
            out.extend_from_slice(&[0; GRPC_PREFIX]);
            view.encode_raw(&h, out);
            black_box(&out).len()
        }),
    ];
    let header = wire::HEADER;
    let mut req = RangeRequest::default();
    let mut out = Vec::new();
    for (keys, distinct) in [
        ("uniformly random over 1M keys", BIG),
        ("1000 hot keys of the 1M", 1000),
        (
            "one key read over and over (etcd's `benchmark range KEY`)",
            1,
        ),
    ] {
        let flat: Vec<u8> = (0..BIG)
            .flat_map(|i| key(scatter(i % distinct, BIG)))
            .collect();
        for (how, answer) in answers {
            let bytes = timed(
                &format!("point reads in wire format, {keys}, {how}"),
                BIG,
                || {
                    let mut bytes = 0;
                    for k in flat.chunks(KEY_LEN) {
                        req.key.clear();
                        req.key.extend_from_slice(k);
                        bytes += answer(store, &req, &header, &mut out);
                    }
                    bytes
                },
            );
            assert!(
                bytes > BIG * (KEY_LEN + VALUE_LEN),
                "every read found its key"
            );
        }
    }
}

/// The same random and hot point reads one request at a time (`range_view`) and in batches
/// (`range_views`, the lookups of a batch overlapping their misses), each answer encoded into
/// one reused buffer; both from the same prepared requests, so the ratio is the batching's.
fn batched_reads(store: &MemStore) {
    let mut wire = WireEncoder::new();
    let mut encode = |view: &memstore::RangeView<'_>| wire.encode(view);
    for (keys, hot) in [
        ("uniformly random over 1M keys", false),
        ("1000 hot keys of the 1M", true),
    ] {
        let reqs: Vec<RangeRequest> = (0..BIG)
            .map(|i| RangeRequest {
                key: key(scatter(if hot { i % 1000 } else { i }, BIG)),
                ..Default::default()
            })
            .collect();
        let single = timed(
            &format!("point reads in wire format, {keys}, one request at a time (range_view)"),
            BIG,
            || {
                reqs.iter()
                    .map(|r| encode(&store.range_view(r).expect("read")))
                    .sum::<usize>()
            },
        );
        let batched = timed(
            &format!(
                "point reads in wire format, {keys}, batches of {READ_BATCH_REQUESTS} (range_views)"
            ),
            BIG,
            || {
                reqs.chunks(READ_BATCH_REQUESTS)
                    .flat_map(|batch| store.range_views(batch))
                    .map(|v| encode(&v.expect("read")))
                    .sum::<usize>()
            },
        );
        assert_eq!(single, batched, "the same answers");
    }
}

fn prefix_request(ns: usize) -> RangeRequest {
    let prefix = format!("/registry/pods/ns{ns:04}/").into_bytes();
    let mut end = prefix.clone();
    *end.last_mut().expect("non-empty prefix") += 1;
    RangeRequest {
        key: prefix,
        range_end: end,
        ..Default::default()
    }
}

fn benches(c: &mut Criterion) {
    let entries: Vec<Entry> = (0..PUT_BATCH).map(put_entry).collect();
    let mut g = c.benchmark_group("apply");
    g.throughput(Throughput::Elements(PUT_BATCH as u64));
    g.bench_function("put_new_keys_100k", |b| {
        b.iter_batched_ref(
            || MemStore::new(Config::default()),
            |s| {
                for (i, e) in entries.iter().enumerate() {
                    black_box(s.apply(i as u64 + 1, e));
                }
            },
            BatchSize::PerIteration,
        )
    });
    g.bench_function("put_overwrite_100k", |b| {
        b.iter_batched_ref(
            || {
                let mut s = MemStore::new(Config::default());
                for (i, e) in entries.iter().enumerate() {
                    s.apply(i as u64 + 1, e);
                }
                s
            },
            |s| {
                let base = s.applied_index();
                for (i, e) in entries.iter().enumerate() {
                    black_box(s.apply(base + i as u64 + 1, e));
                }
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();

    let store = build(BIG);
    let reads: Vec<RangeRequest> = (0..READ_BATCH)
        .map(|i| RangeRequest {
            key: key(scatter(i, BIG)),
            ..Default::default()
        })
        .collect();
    let mut g = c.benchmark_group("read");
    g.throughput(Throughput::Elements(READ_BATCH as u64));
    g.bench_function("point_read_1m_keys", |b| {
        b.iter(|| {
            for r in &reads {
                black_box(store.range(r).expect("read"));
            }
        })
    });
    g.finish();
    let prefixes: Vec<RangeRequest> = (0..64)
        .map(|i| {
            let ns = scatter(i, BIG / KEYS_PER_NAMESPACE);
            let prefix = format!("/registry/pods/ns{ns:04}/").into_bytes();
            let mut end = prefix.clone();
            *end.last_mut().expect("non-empty prefix") += 1;
            RangeRequest {
                key: prefix,
                range_end: end,
                ..Default::default()
            }
        })
        .collect();
    let got = store.range(&prefixes[0]).expect("prefix").kvs.len();
    assert_eq!(got, KEYS_PER_NAMESPACE);
    let behind = store.revision() - WATCH_BEHIND;
    let mut g = c.benchmark_group("events");
    g.throughput(Throughput::Elements(1000));
    g.bench_function("watcher_100k_behind_max_1000", |b| {
        b.iter(|| black_box(store.events(behind, b"\0", b"\0", 1000).expect("events")))
    });
    g.finish();
    let mut g = c.benchmark_group("range");
    g.throughput(Throughput::Elements(prefixes.len() as u64));
    g.bench_function("prefix_1000_keys", |b| {
        b.iter(|| {
            for r in &prefixes {
                black_box(store.range(r).expect("range"));
            }
        })
    });
    g.finish();
}

/// Set for a child process of the bench: the checkpoint file it only decodes and times.
const DECODE_ONLY: &str = "STRATA_BENCH_DECODE_CHECKPOINT";

/// Fresh processes `load_in_a_fresh_process` starts, one after another.
const FRESH_LOADS: usize = 3;

/// The checkpoint load again, in fresh processes (this bench's binary, started with
/// `DECODE_ONLY`), as a new frontend decodes: the figure above decodes beside the live 1M-key
/// store and moves with this process's memory state. Each is printed: on this VM the kernel's
/// (and the hypervisor's) work to fault fresh memory in varies several-fold from one process
/// to the next, the decode itself much less (docs/benchmarks/memstore.md).
fn load_in_a_fresh_process(bytes: &[u8]) {
    let file = std::env::temp_dir().join(format!("strata-bench-{}.ckpt", std::process::id()));
    std::fs::write(&file, bytes).expect("write the checkpoint file");
    let exe = std::env::current_exe().expect("bench binary");
    let statuses: Vec<_> = (0..FRESH_LOADS)
        .map(|_| {
            std::process::Command::new(&exe)
                .env(DECODE_ONLY, &file)
                .status()
        })
        .collect();
    let _ = std::fs::remove_file(&file);
    for status in statuses {
        assert!(
            status.expect("start the decoding process").success(),
            "the decoding process failed"
        );
    }
}

/// `DECODE_ONLY`'s side: reads the file, then decodes it timed.
fn decode_checkpoint_file(file: &std::ffi::OsStr) {
    let bytes = std::fs::read(file).expect("read the checkpoint file");
    let (_, loaded) = timed(
        "checkpoint load, 1M keys, in a fresh process (as a new frontend decodes)",
        1,
        || checkpoint::decode(&bytes).expect("bench checkpoint loads"),
    );
    assert_eq!(loaded.applied_index(), BIG as u64);
}

fn main() {
    if let Some(file) = std::env::var_os(DECODE_ONLY) {
        decode_checkpoint_file(&file);
        return;
    }
    one_off_figures();
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .configure_from_args();
    benches(&mut c);
    c.final_summary();
}
