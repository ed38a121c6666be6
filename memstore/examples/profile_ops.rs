//! A profiling driver (not a benchmark): applies 1M puts of new keys and then runs point reads,
//! so `perf record` can look at one phase at a time. `cargo run --release -p strata-memstore
//! --example profile_ops -- puts|random|overwrite|reads|hot|load|load-file|snapshot|hash|decoded|decoded-owned|record|chase|floor` (`decoded`:
//! the puts as a replica gets them, journal records through `entry_for_tenant` and `apply`;
//! `decoded-owned` the same through `entry_for_tenant_owned` and `apply_owned`; `record`
//! through `apply_record`, the replica's path, which reads a put in place). `PROFILE_IDS=1`
//! gives every entry a 16-byte request id, as frontends write them. Read modes: `reads`,
//! `hot`, each also as `-view` (`range_view` encoded into a buffer) and `-batch`
//! (`range_views`); `PROFILE_KEYS` sets the store's size, `PROFILE_ROUNDS` the rounds. `load`
//! decodes the store's checkpoint four times, timing each (`PROFILE_KEEP=1` keeps the store
//! alive meanwhile, as the bench does); `load-file` times one decode in a fresh process, as a
//! new frontend decodes (`PROFILE_CHECKPOINT=<file>`: the first run writes it).

#[path = "../benches/support/wire.rs"]
mod wire;

use std::hint::black_box;

use api::etcdserverpb::{CompactionRequest, PutRequest, RangeRequest};
use api::strata::entry::{Entry, entry::Request};
use api::strata::journal::{Record, record::Kind};
use memstore::{Config, MemStore};
use wire::WireEncoder;

/// The allocator of the `strata` binary, so profiles show what a replica spends.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Keys in the store (`PROFILE_KEYS` overrides, e.g. a smaller store under callgrind).
const N: usize = 1_000_000;
/// Point reads per `range_views` call in the `-batch` read modes.
const BATCH: usize = 64;
const KEY_LEN: usize = 64;
const READ_ROUNDS: usize = 5;
const LOAD_ROUNDS: usize = 4;
const DECODED_ROUNDS: usize = 3;

/// A put of `key(i)` with a 256-byte value of `fill` bytes, at journal time 1,000 ms.
fn put_entry(i: usize, fill: u8, request_id: Vec<u8>) -> Entry {
    Entry {
        format_version: 1,
        tenant: "p".into(),
        request_id,
        time_ms: 1_000,
        request: Some(Request::Put(PutRequest {
            key: key(i),
            value: vec![fill; 256],
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn key(i: usize) -> Vec<u8> {
    let mut k = format!("/registry/pods/ns{:04}/pod-{:08}-", i / 1000, i).into_bytes();
    k.resize(KEY_LEN, b'x');
    k
}

/// CPU time of this thread (ns), from the kernel's schedstat.
fn cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse().ok()))
        .unwrap_or(0)
}

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "puts".into());
    let n: usize = env_num("PROFILE_KEYS").unwrap_or(N);
    // `random`: the puts in a scattered key order (a fixed permutation).
    let order = |i: usize| {
        if mode == "random" {
            i.wrapping_mul(2_654_435_761) % n
        } else {
            i
        }
    };
    if mode == "chase" {
        chase();
        return;
    }
    if mode == "floor" {
        floor();
        return;
    }
    // `load-file`: a fresh process decodes the checkpoint at `PROFILE_CHECKPOINT` if there is
    // one; else the store is built as for every mode and its checkpoint written there.
    let checkpoint_file = (mode == "load-file")
        .then(|| std::env::var("PROFILE_CHECKPOINT").expect("PROFILE_CHECKPOINT names a file"));
    if let Some(bytes) = checkpoint_file.as_ref().and_then(|f| std::fs::read(f).ok()) {
        timed_decode("load-file", &bytes);
        return;
    }
    let ids = std::env::var("PROFILE_IDS").is_ok_and(|v| v == "1");
    let entries: Vec<Entry> = (0..n)
        .map(order)
        .map(|i| {
            let id = if ids {
                (i as u128 + 1).to_le_bytes().to_vec()
            } else {
                Vec::new()
            };
            put_entry(i, b'v', id)
        })
        .collect();
    if mode.starts_with("decoded") || mode == "record" {
        // Each round decodes its own copy of the records (made before the store, so the
        // by-value decode can consume them); `PROFILE_ROUNDS` sets the rounds (e.g. 1 under
        // callgrind).
        let owned = mode == "decoded-owned";
        let encoded: Vec<Vec<u8>> = entries.iter().map(api::record::encode_entry).collect();
        drop(entries);
        let rounds = env_num("PROFILE_ROUNDS").unwrap_or(DECODED_ROUNDS);
        for _ in 0..rounds {
            let records: Vec<Record> = encoded
                .iter()
                .enumerate()
                .map(|(i, e)| Record {
                    index: i as u64 + 1,
                    term: 1,
                    time_ms: 1_000,
                    kind: Some(Kind::Data(e.clone())),
                })
                .collect();
            let mut store = MemStore::new(Config::default());
            let (wall, cpu) = (std::time::Instant::now(), cpu_ns());
            for r in records {
                let index = r.index;
                if mode == "record" {
                    black_box(store.apply_record(r, "p").expect("profile record"));
                } else if owned {
                    let e = api::record::entry_for_tenant_owned(r, "p").expect("profile record");
                    black_box(store.apply_owned(index, e));
                } else {
                    let e = api::record::entry_for_tenant(&r, "p").expect("profile record");
                    black_box(store.apply(index, &e));
                }
            }
            println!(
                "{mode}: {:.0} puts per cpu-second (wall {:.3} s)",
                n as f64 / ((cpu_ns() - cpu) as f64 / 1e9),
                wall.elapsed().as_secs_f64()
            );
        }
        return;
    }
    let rounds = if mode == "puts" { 3 } else { 1 };
    let mut store = MemStore::new(Config::default());
    for _ in 0..rounds {
        store = MemStore::new(Config::default());
        let (wall, cpu) = (std::time::Instant::now(), cpu_ns());
        for (i, e) in entries.iter().enumerate() {
            black_box(store.apply(i as u64 + 1, e));
        }
        if mode == "puts" || mode == "random" {
            println!(
                "{mode}: {:.0} puts per cpu-second (wall {:.3} s)",
                n as f64 / ((cpu_ns() - cpu) as f64 / 1e9),
                wall.elapsed().as_secs_f64()
            );
        }
    }
    drop(entries);
    if mode == "puts" || mode == "random" {
        return;
    }
    if mode == "overwrite" {
        // Every key updated once with a new value of the same size, in a scattered key order
        // (the common Kubernetes write: an update of a live object).
        let base = store.applied_index();
        let updates: Vec<Entry> = (0..n)
            .map(|i| put_entry(i.wrapping_mul(2_654_435_761) % n, b'w', Vec::new()))
            .collect();
        // `PROFILE_COMPACT_EVERY=k`: a compaction at the head after every k updates (the
        // steady state of a cluster whose API server compacts on a timer: the history stays
        // short and the memory of replaced versions is reused); 0 or unset: none.
        let every = env_num("PROFILE_COMPACT_EVERY").unwrap_or(0);
        let (wall, cpu) = (std::time::Instant::now(), cpu_ns());
        let (mut index, mut compactions, mut compacting_ns) = (base, 0u64, 0u64);
        for (i, e) in updates.iter().enumerate() {
            index += 1;
            black_box(store.apply(index, e));
            if every > 0 && (i + 1) % every == 0 {
                index += 1;
                let revision = store.revision();
                let start = cpu_ns();
                black_box(store.apply(index, &compact_entry(revision)));
                compacting_ns += cpu_ns() - start;
                compactions += 1;
            }
        }
        println!(
            "{mode}: {:.0} puts per cpu-second (wall {:.3} s), {compactions} compactions of {:.3} ms CPU each",
            n as f64 / ((cpu_ns() - cpu) as f64 / 1e9),
            wall.elapsed().as_secs_f64(),
            compacting_ns as f64 / 1e6 / compactions.max(1) as f64
        );
        return;
    }
    if let Some(file) = checkpoint_file {
        std::fs::write(file, checkpoint_of(&store)).expect("write the checkpoint");
        return;
    }
    if mode == "hash" {
        // HashKV of the whole store (etcd's hash: the versions in revision order), before and
        // after a compaction at the head (which leaves every key's one version below it).
        let mut store = store;
        for round in 0..env_num("PROFILE_ROUNDS").unwrap_or(LOAD_ROUNDS) {
            if round == 1 {
                let at = store.revision();
                store.apply(store.applied_index() + 1, &compact_entry(at));
            }
            let cpu = cpu_ns();
            let h = store.hash_kv(0).expect("hash");
            println!(
                "hash: {:.3} s CPU, compacted at {}",
                (cpu_ns() - cpu) as f64 / 1e9,
                h.compact_revision
            );
        }
        return;
    }
    if mode == "snapshot" {
        // What a frontend's Snapshot holds the store for: the database written into a buffer
        // touched beforehand (as `frontend::snapshot` does), against a checkpoint likewise.
        for _ in 0..env_num("PROFILE_ROUNDS").unwrap_or(LOAD_ROUNDS) {
            let meta = meta_of(&store);
            let buf = memstore::checkpoint::touched_buffer(
                memstore::checkpoint::encoded_len_estimate(&meta, &store),
            );
            let cpu = cpu_ns();
            let len = memstore::checkpoint::encode_into(&meta, &store, buf).len();
            let checkpoint_s = (cpu_ns() - cpu) as f64 / 1e9;
            let estimate = memstore::etcd_db::estimated_len(&store);
            let buf = memstore::checkpoint::touched_buffer(estimate);
            let cpu = cpu_ns();
            let db = memstore::etcd_db::etcd_database_into(&store, buf);
            let db_s = (cpu_ns() - cpu) as f64 / 1e9;
            println!(
                "snapshot: etcd database {:.3} s CPU ({} MB, estimated {} MB), checkpoint {checkpoint_s:.3} s CPU ({} MB)",
                db_s,
                db.len() >> 20,
                estimate >> 20,
                len >> 20
            );
        }
        return;
    }
    if mode == "load" {
        let bytes = checkpoint_of(&store);
        let kept = env_num("PROFILE_KEEP").is_some().then_some(store);
        for _ in 0..LOAD_ROUNDS {
            drop(black_box(timed_decode("load", &bytes)));
        }
        drop(kept);
        return;
    }
    // Read modes: `reads` (random) and `hot` (1000 keys) through `range`; with `-view`
    // through `range_view` encoded into one reused buffer; with `-batch` through
    // `range_views` in batches of `BATCH`, each answer encoded likewise. `PROFILE_ROUNDS` read
    // rounds (0: the build alone, for instruction counts per read by difference).
    let hot = mode.starts_with("hot");
    let flat: Vec<u8> = (0..n)
        .flat_map(|i| {
            let j = if hot { i % 1000 } else { i };
            key(j.wrapping_mul(2_654_435_761) % n)
        })
        .collect();
    let mut wire = WireEncoder::new();
    let mut encode = |view: &memstore::RangeView<'_>| {
        black_box(wire.encode(view));
    };
    let mut req = RangeRequest::default();
    let mut batch = vec![RangeRequest::default(); BATCH];
    for _ in 0..env_num("PROFILE_ROUNDS").unwrap_or(READ_ROUNDS) {
        let (wall, cpu) = (std::time::Instant::now(), cpu_ns());
        if mode.ends_with("-batch") {
            for keys in flat.chunks(KEY_LEN * BATCH) {
                let batch = &mut batch[..keys.len() / KEY_LEN];
                for (r, k) in batch.iter_mut().zip(keys.chunks(KEY_LEN)) {
                    r.key.clear();
                    r.key.extend_from_slice(k);
                }
                for view in store.range_views(batch) {
                    encode(&view.expect("read"));
                }
            }
        } else {
            for k in flat.chunks(KEY_LEN) {
                req.key.clear();
                req.key.extend_from_slice(k);
                if mode.ends_with("-view") {
                    encode(&store.range_view(&req).expect("read"));
                } else {
                    black_box(store.range(&req).expect("read"));
                }
            }
        }
        println!(
            "{mode}: {:.0} reads per cpu-second (wall {:.3} s)",
            n as f64 / ((cpu_ns() - cpu) as f64 / 1e9),
            wall.elapsed().as_secs_f64()
        );
    }
}

/// Lines of the pointer chase: 512 MiB, larger than the 1M-key store, so nearly every step
/// misses every cache.
const CHASE_LINES: usize = 8 << 20;
const CHASE_STEPS: usize = 20_000_000;

/// `chase`: the latency of one dependent memory miss on this machine, the floor under a point
/// read (each of whose steps needs the address the previous one loaded). One 64-byte line per
/// element, linked into a single random cycle (Sattolo's shuffle), walked one load at a time.
/// `PROFILE_CHAINS=k` walks k places of the cycle side by side (k independent misses in
/// flight): the misses per second the core sustains when work overlaps, the ceiling of batched
/// reads.
fn chase() {
    let (next, order) = random_cycle();
    let chains = env_num("PROFILE_CHAINS").unwrap_or(1).clamp(1, 64);
    let starts: Vec<u64> = (0..chains)
        .map(|c| order[c * (CHASE_LINES / chains)])
        .collect();
    drop(order);
    for _ in 0..env_num("PROFILE_ROUNDS").unwrap_or(READ_ROUNDS) {
        let mut at = starts.clone();
        let cpu = cpu_ns();
        for _ in 0..CHASE_STEPS / chains {
            for a in at.iter_mut() {
                *a = next[*a as usize][0];
            }
        }
        black_box(&at);
        let ns = (cpu_ns() - cpu) as f64;
        let misses = (CHASE_STEPS / chains * chains) as f64;
        println!(
            "chase, {chains} chain(s): {:.1} ns per step of a chain, {:.0} misses per cpu-second",
            ns / (CHASE_STEPS / chains) as f64,
            misses / (ns / 1e9)
        );
    }
}

/// `CHASE_LINES` lines of 64 bytes, each line's first word naming the next line of one random
/// cycle through all of them (Sattolo's shuffle), and the cycle's order.
fn random_cycle() -> (Vec<[u64; 8]>, Vec<u64>) {
    let mut next: Vec<[u64; 8]> = vec![[0; 8]; CHASE_LINES];
    let mut order: Vec<u64> = (0..CHASE_LINES as u64).collect();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for i in (1..CHASE_LINES).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % i as u64) as usize);
    }
    for w in order.windows(2) {
        next[w[0] as usize][0] = w[1];
    }
    next[order[CHASE_LINES - 1] as usize][0] = order[0];
    (next, order)
}

/// Work rounds `floor` tries after each read's two misses.
const FLOOR_WORK: [usize; 7] = [4, 8, 16, 24, 32, 48, 64];
/// (rounds on the second miss's line, rounds on nothing loaded) `floor` also tries.
const FLOOR_MIXED: [(usize, usize); 10] = [
    (0, 4),
    (0, 8),
    (0, 16),
    (2, 4),
    (2, 8),
    (2, 16),
    (4, 4),
    (4, 8),
    (8, 0),
    (8, 4),
];

/// Four xorshift chains from `x`, `w` rounds (~24 instructions a round), folded to one word.
fn xorshift_work(x: u64, w: usize) -> u64 {
    let mut chains = [x, x ^ 2, x ^ 4, x ^ 8];
    for _ in 0..w {
        for c in chains.iter_mut() {
            *c ^= *c << 13;
            *c ^= *c >> 7;
            *c ^= *c << 17;
        }
    }
    chains.iter().fold(0, |a, c| a ^ c)
}

/// `floor`: the rate of reads that are nothing but two dependent misses (a random line, then
/// the line it names: an index entry, then the key and value it leads to) followed by `w`
/// rounds of work on what the second miss loaded (`xorshift_work`), against the same reads
/// from one cached line (the work alone). The reads are independent of each other, as
/// one-at-a-time point reads are: the gap shows how much of a read's work the core hides under
/// the next read's misses, and so the best any lookup that needs two misses can do one request
/// at a time on this machine. Then the same with work of two kinds (`FLOOR_MIXED`): rounds on
/// the second miss's line, and rounds on the read's position alone (as a read's hashing and
/// header encoding depend on no miss), which need no scheduler place while the miss is out but
/// still hold the reorder buffer. Compare a point read in wire format: ~70–90 ns cached
/// (`hot-view`), ~380–440 ns over 1M keys (`reads-view`).
fn floor() {
    let (next, order) = random_cycle();
    let reads: Vec<usize> = order
        .iter()
        .step_by(CHASE_LINES / 4_000_000)
        .map(|&l| l as usize)
        .collect();
    let cached = vec![order[0] as usize; reads.len()];
    drop(order);
    let run = |reads: &[usize], dependent: usize, independent: usize| {
        let cpu = cpu_ns();
        let mut sum = 0u64;
        for (i, &r) in reads.iter().enumerate() {
            let entry = next[r][0] as usize;
            let x = next[entry][0] | 1;
            sum = sum.wrapping_add(xorshift_work(x, dependent));
            sum = sum.wrapping_add(xorshift_work(black_box(i as u64) | 1, independent));
        }
        black_box(sum);
        (cpu_ns() - cpu) as f64 / reads.len() as f64
    };
    for _ in 0..env_num("PROFILE_ROUNDS").unwrap_or(1) {
        for w in FLOOR_WORK {
            let alone = run(&cached, w, 0);
            let ns = run(&reads, w, 0);
            println!(
                "floor, {w:3} rounds of work ({alone:.0} ns alone) after two dependent misses: {ns:.0} ns per read, {:.0} reads per cpu-second",
                1e9 / ns
            );
        }
        for (dependent, independent) in FLOOR_MIXED {
            let alone = run(&cached, dependent, independent);
            let ns = run(&reads, dependent, independent);
            println!(
                "floor, {dependent} rounds on the second miss and {independent:2} on nothing loaded ({alone:.0} ns alone): {ns:.0} ns per read, {:.0} reads per cpu-second",
                1e9 / ns
            );
        }
    }
}

fn compact_entry(revision: i64) -> Entry {
    Entry {
        format_version: 1,
        tenant: "p".into(),
        request_id: Vec::new(),
        time_ms: 1_000,
        request: Some(Request::Compact(CompactionRequest {
            revision,
            physical: true,
        })),
        ..Default::default()
    }
}

/// The meta of a checkpoint of `store`.
fn meta_of(store: &MemStore) -> memstore::checkpoint::CheckpointMeta {
    memstore::checkpoint::CheckpointMeta {
        tenant: "p".into(),
        shard: 0,
        index: store.applied_index(),
        revision: store.revision(),
        created_ms: 0,
    }
}

/// The store's checkpoint.
fn checkpoint_of(store: &MemStore) -> Vec<u8> {
    memstore::checkpoint::encode(&meta_of(store), store)
}

/// Decodes `bytes`, printing the CPU and wall time it took.
fn timed_decode(what: &str, bytes: &[u8]) -> MemStore {
    let (wall, cpu) = (std::time::Instant::now(), cpu_ns());
    let (_, loaded) = memstore::checkpoint::decode(bytes).expect("decode");
    println!(
        "{what}: {:.3} s CPU (wall {:.3} s), revision {}",
        (cpu_ns() - cpu) as f64 / 1e9,
        wall.elapsed().as_secs_f64(),
        loaded.revision()
    );
    loaded
}

/// A number from the environment variable `var`, if set and valid.
fn env_num(var: &str) -> Option<usize> {
    std::env::var(var).ok().and_then(|v| v.parse().ok())
}
