//! Checkpoint figures for docs/benchmarks/compactor.md: builds a tenant of N keys (64-byte keys,
//! 256-byte values by default) in a memstore, then measures encode, write to the object store
//! (single put or multipart), read + verify, and decode (load) time.
//!
//! cargo run --release -p strata-compactor --example checkpoint_bench -- <store-url> [keys] [key-bytes] [value-bytes]
//! S3 settings come from the environment (AWS_ENDPOINT_URL, AWS_ALLOW_HTTP, AWS_ACCESS_KEY_ID, ...).

use std::time::Instant;

use api::etcdserverpb::PutRequest;
use api::strata::entry::Entry;
use api::strata::entry::entry::Request;
use compactor::Catalog;
use memstore::checkpoint::{self, CheckpointMeta};
use object_store::ObjectStoreExt;

/// CPU seconds (user + system) this process used so far, from /proc/self/stat (Linux, 100 Hz
/// ticks): on a shared, busy machine CPU time is a steadier figure than wall time.
fn cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // Fields after the command name: state is index 0, utime 11, stime 12.
    (ticks(11) + ticks(12)) / 100.0
}

fn arg<T: std::str::FromStr>(args: &[String], i: usize, default: T) -> T {
    args.get(i).and_then(|s| s.parse().ok()).unwrap_or(default)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let url = args.get(1).cloned().unwrap_or_else(|| "memory://".into());
    let keys: usize = arg(&args, 2, 1_000_000);
    let key_bytes: usize = arg(&args, 3, 64);
    let value_bytes: usize = arg(&args, 4, 256);
    let tenant = "bench";

    let t = Instant::now();
    let mut store = memstore::MemStore::new(memstore::Config {
        quota_bytes: 0,
        ..memstore::Config::default()
    });
    for i in 0..keys {
        let mut key = format!("/registry/bench/{i:012}").into_bytes();
        key.resize(key_bytes, b'k');
        let mut request_id = (i as u64).to_le_bytes().to_vec();
        request_id.resize(16, 0);
        let e = Entry {
            format_version: api::ENTRY_FORMAT_VERSION,
            tenant: tenant.into(),
            request_id,
            time_ms: i as i64,
            request: Some(Request::Put(PutRequest {
                key,
                value: vec![b'v'; value_bytes],
                ..Default::default()
            })),
            ..Default::default()
        };
        store.apply(i as u64 + 1, &e);
    }
    println!(
        "built {keys} keys ({key_bytes} B keys, {value_bytes} B values) in {:.2} s",
        t.elapsed().as_secs_f64()
    );

    let meta = CheckpointMeta {
        tenant: tenant.into(),
        shard: 0,
        index: store.applied_index(),
        revision: store.revision(),
        created_ms: store.time_ms(),
    };
    let t = Instant::now();
    let c = cpu_secs();
    let bytes = bytes::Bytes::from(checkpoint::encode(&meta, &store));
    let encode = t.elapsed().as_secs_f64();
    let encode_cpu = cpu_secs() - c;
    let mb = bytes.len() as f64 / 1e6;
    println!(
        "encode: {mb:.1} MB in {encode:.2} s wall ({:.0} MB/s), {encode_cpu:.2} s CPU",
        mb / encode
    );

    let catalog = Catalog::new(compactor::store::open(&url)?);
    let t = Instant::now();
    let c = cpu_secs();
    let r = catalog
        .write_checkpoint(
            tenant,
            meta.index,
            meta.revision,
            meta.created_ms,
            compactor::clock::wall_ms(),
            bytes.clone(),
        )
        .await?;
    let write = t.elapsed().as_secs_f64();
    let write_cpu = cpu_secs() - c;
    println!(
        "write to {url}: {mb:.1} MB in {write:.2} s wall ({:.0} MB/s), {write_cpu:.2} s CPU (this process)",
        mb / write
    );
    println!("encode + write: {:.0} MB/s wall", mb / (encode + write));

    let t = Instant::now();
    let c = cpu_secs();
    let fetched = catalog.read_checkpoint(&r).await?;
    let read = t.elapsed().as_secs_f64();
    let read_cpu = cpu_secs() - c;
    let t = Instant::now();
    let c = cpu_secs();
    let (_, loaded) = checkpoint::decode(&fetched)?;
    let decode = t.elapsed().as_secs_f64();
    let decode_cpu = cpu_secs() - c;
    println!(
        "read + verify: {read:.2} s wall, {read_cpu:.2} s CPU; decode (load {} keys): {decode:.2} s wall, {decode_cpu:.2} s CPU; total load {:.2} s wall",
        loaded.stats().keys,
        read + decode
    );
    assert_eq!(loaded.revision(), store.revision());
    catalog
        .store()
        .delete(&object_store::path::Path::from(r.path.as_str()))
        .await?;
    Ok(())
}
