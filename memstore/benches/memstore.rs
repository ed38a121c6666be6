//! Memstore figures: puts applied/s, point reads/s, 1000-key prefix ranges/s (criterion), and
//! bytes of memory per key plus checkpoint write/load time for 1M keys (measured once, with a
//! counting global allocator). Run: `cargo bench -p strata-memstore`; figures go to
//! docs/benchmarks/memstore.md.
// The counting allocator must implement `GlobalAlloc`, an unsafe trait; it only forwards to the
// system allocator and adds the sizes up.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use api::etcdserverpb::{CompactionRequest, PutRequest, RangeRequest};
use api::strata::entry::{Entry, entry::Request};
use criterion::{BatchSize, Criterion, Throughput, black_box};
use memstore::checkpoint::{self, CheckpointMeta};
use memstore::{Config, MemStore};

/// Bytes currently allocated through the global allocator.
static ALLOCATED: AtomicI64 = AtomicI64::new(0);

struct Counting;

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATED.fetch_add(layout.size() as i64, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        ALLOCATED.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATED.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const KEY_LEN: usize = 64;
const VALUE_LEN: usize = 256;
const BIG: usize = 1_000_000;
const PUT_BATCH: usize = 100_000;
const READ_BATCH: usize = 4096;
const KEYS_PER_NAMESPACE: usize = 1000;

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
    }
}

fn build(n: usize) -> MemStore {
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

fn one_off_figures() {
    let before = ALLOCATED.load(Ordering::Relaxed);
    let t = Instant::now();
    let mut store = build(BIG);
    let build_time = t.elapsed();
    let used = ALLOCATED.load(Ordering::Relaxed) - before;
    let raw = (BIG * (KEY_LEN + VALUE_LEN)) as f64;
    println!(
        "figure: build 1M keys by apply: {:.2} s ({:.0} puts/s)",
        build_time.as_secs_f64(),
        BIG as f64 / build_time.as_secs_f64()
    );
    println!(
        "figure: memory for 1M keys (64 B key, 256 B value, one version): {} bytes = {:.1} B/key = {:.3}x raw key+value",
        used,
        used as f64 / BIG as f64,
        used as f64 / raw
    );
    let meta = CheckpointMeta {
        tenant: "bench".into(),
        shard: 0,
        index: store.applied_index(),
        revision: store.revision(),
        created_ms: 0,
    };
    let t = Instant::now();
    let bytes = checkpoint::encode(&meta, &store);
    let enc = t.elapsed();
    let t = Instant::now();
    let (_, loaded) = checkpoint::decode(&bytes).expect("bench checkpoint loads");
    let dec = t.elapsed();
    println!(
        "figure: checkpoint of 1M keys: {} bytes, write {:.3} s, load {:.3} s",
        bytes.len(),
        enc.as_secs_f64(),
        dec.as_secs_f64()
    );
    assert!(loaded == store);
    drop(loaded);
    drop(bytes);
    // After a compaction at the head (the steady state of a compacted tenant).
    let rev = store.revision();
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
        },
    );
    let used = ALLOCATED.load(Ordering::Relaxed) - before;
    println!(
        "figure: after compaction at head: {:.1} B/key = {:.3}x raw",
        used as f64 / BIG as f64,
        used as f64 / raw
    );
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

fn main() {
    one_off_figures();
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .configure_from_args();
    benches(&mut c);
    c.final_summary();
}
