//! `etcdctl snapshot save` against a Strata deployment (three journal processes, one frontend):
//! it succeeds, and the saved file is a checkpoint (`memstore::checkpoint`) zero-padded to a
//! multiple of 512 bytes and followed by the SHA-256 of what precedes it, as etcd's own
//! snapshots end; decoded, it holds the tenant's keys and leases and the same HashKV as the
//! frontend at the snapshot's revision.

use std::process::Command;

use etcd_client::{Client, GetOptions, PutOptions};
use strata_tests::deployment::Deployment;
use strata_tests::etcdctl::Etcdctl;

/// Keys written; with values of a few hundred bytes the file spans several 32 KiB chunks.
const KEYS: usize = 600;
/// etcd's snapshot message size.
const CHUNK: usize = 32 * 1024;
/// The SHA-256 trailer.
const SHA256_BYTES: usize = 32;

/// Lower-case hex SHA-256 of `bytes`, computed by coreutils' `sha256sum` (independent of the
/// frontend's own digest code).
fn sha256sum(bytes: &[u8], scratch: &std::path::Path) -> String {
    std::fs::write(scratch, bytes).unwrap();
    let out = Command::new("sha256sum").arg(scratch).output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()[..64].to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_snapshot_save_writes_a_verified_checkpoint_of_the_tenant() {
    let d = Deployment::start(1).await;
    let mut c = Client::connect([d.frontend(0).endpoint()], None)
        .await
        .unwrap();
    let lease = c.lease_grant(3600, None).await.unwrap().id();
    for i in 0..KEYS {
        let opts = (i % 50 == 0).then(|| PutOptions::new().with_lease(lease));
        c.put(format!("snap/{i:04}"), "v".repeat(300 + i % 7), opts)
            .await
            .unwrap();
    }
    c.delete("snap/0001", None).await.unwrap();
    let head = c
        .put("snap/last", "x", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();

    let file = d.dir().join("snapshot.db");
    let ctl = Etcdctl::new(&d.frontend(0).listen);
    let path = file.to_str().unwrap().to_string();
    let out = tokio::task::spawn_blocking(move || ctl.ok(&["snapshot", "save", &path]))
        .await
        .unwrap();
    assert!(out.contains("Snapshot saved at"), "{out}");

    let bytes = std::fs::read(&file).unwrap();
    let (content, trailer) = bytes.split_at(bytes.len() - SHA256_BYTES);
    let hex: String = trailer.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        hex,
        sha256sum(content, &d.dir().join("content")),
        "the last 32 bytes are the SHA-256 of the rest"
    );
    assert!(content.len() > 2 * CHUNK);
    assert_eq!(
        content.len() % 512,
        0,
        "etcdctl 3.4 wants 512 * n + 32 bytes"
    );
    // The checkpoint's own length, from its header (memstore::checkpoint's layout).
    let meta_len = u32::from_le_bytes(content[16..20].try_into().unwrap()) as usize;
    let body_len = u64::from_le_bytes(content[20..28].try_into().unwrap()) as usize;
    let len = (28 + meta_len).next_multiple_of(16) + body_len;
    assert!(content[len..].iter().all(|&b| b == 0), "zero padding");
    let (meta, store) = memstore::checkpoint::decode(&content[..len]).unwrap();
    assert_eq!(meta.tenant, "default");
    assert!(
        meta.revision >= head,
        "the snapshot follows a read barrier: revision {} before the last write {head}",
        meta.revision
    );

    // Same keys and values as the frontend serves at that revision.
    let all = api::etcdserverpb::RangeRequest {
        key: b"snap/".to_vec(),
        range_end: b"snap0".to_vec(),
        ..Default::default()
    };
    let mine: Vec<(Vec<u8>, Vec<u8>, i64)> = store
        .range(&all)
        .unwrap()
        .kvs
        .into_iter()
        .map(|kv| (kv.key, kv.value, kv.lease))
        .collect();
    let served: Vec<(Vec<u8>, Vec<u8>, i64)> = c
        .get(
            "snap/",
            Some(GetOptions::new().with_prefix().with_revision(meta.revision)),
        )
        .await
        .unwrap()
        .kvs()
        .iter()
        .map(|kv| (kv.key().to_vec(), kv.value().to_vec(), kv.lease()))
        .collect();
    assert_eq!(mine.len(), KEYS, "600 written, one deleted, one added");
    assert_eq!(mine, served);
    assert_eq!(
        store
            .lease_leases()
            .leases
            .iter()
            .map(|l| l.id)
            .collect::<Vec<_>>(),
        vec![lease]
    );

    // HashKV of the decoded checkpoint equals the frontend's at the same revision.
    let want = c.hash_kv(meta.revision).await.unwrap();
    let got = store.hash_kv(meta.revision).unwrap();
    assert_eq!(
        got.hash,
        want.hash(),
        "HashKV at revision {}",
        meta.revision
    );
}
