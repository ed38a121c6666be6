//! `etcdctl snapshot save` against a Strata deployment (three journal processes, one frontend):
//! it succeeds, and the saved file is etcd's own format, a bbolt database followed by the
//! SHA-256 of what precedes it: `etcdctl snapshot status` reads it, Strata's reader of etcd
//! snapshots finds the tenant's keys and leases in it, and an etcd restored from it with
//! `etcdctl snapshot restore` serves the same keys, history and lease as the frontend.

use std::process::Command;

use etcd_client::{Client, GetOptions, PutOptions};
use strata_tests::deployment::Deployment;
use strata_tests::etcd::{EtcdServer, full_kvs, head_revision};
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
async fn etcdctl_snapshot_save_writes_an_etcd_database_that_etcd_restores() {
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
    let delete_rev = c
        .delete("snap/0001", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
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
    let file_arg = path.clone();
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
    assert_eq!(content.len() % 4096, 0, "whole bbolt pages");

    // etcd's own tool reads it: bbolt's consistency check passes, and the revision is the
    // snapshot's (at or after the last write: it follows a read barrier).
    let status = etcdctl_offline(&["snapshot", "status", "-w", "json", &file_arg]);
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    let revision = status["revision"].as_i64().unwrap();
    assert!(revision >= head, "{status}");
    assert_eq!(status["totalSize"].as_u64(), Some(content.len() as u64));
    // Every stored version (600 puts, the delete's tombstone, the last put) and the few keys of
    // the other buckets (auth's two).
    assert!(
        status["totalKey"].as_u64().unwrap() >= KEYS as u64 + 2,
        "{status}"
    );

    // Strata's reader of etcd snapshots reads back what the frontend serves at that revision.
    let state = compactor::etcd_snapshot::read(content).unwrap();
    assert_eq!(state.revision, revision);
    let prefix = |rev: i64| GetOptions::new().with_prefix().with_revision(rev);
    let served: Vec<(Vec<u8>, Vec<u8>, i64)> = c
        .get("snap/", Some(prefix(revision)))
        .await
        .unwrap()
        .kvs()
        .iter()
        .map(|kv| (kv.key().to_vec(), kv.value().to_vec(), kv.lease()))
        .collect();
    assert_eq!(served.len(), KEYS, "600 written, one deleted, one added");
    let read: Vec<(Vec<u8>, Vec<u8>, i64)> = state
        .keys
        .iter()
        .filter(|(k, _)| k.starts_with(b"snap/"))
        .map(|(k, (v, l))| (k.clone(), v.clone(), *l))
        .collect();
    assert_eq!(read, served);
    assert_eq!(
        state.leases.keys().copied().collect::<Vec<_>>(),
        vec![lease]
    );

    // And etcd itself serves it: `etcdctl snapshot restore`, then etcd started on that data
    // directory holds the keys, their history (revisions are kept) and the lease.
    let etcd = EtcdServer::start_restored(&file).await;
    let mut e = Client::connect([etcd.endpoint()], None).await.unwrap();
    for rev in [delete_rev - 1, delete_rev, revision] {
        let from_strata = c.get("snap/", Some(prefix(rev))).await.unwrap();
        let from_etcd = e.get("snap/", Some(prefix(rev))).await.unwrap();
        assert_eq!(
            full_kvs(&from_etcd),
            full_kvs(&from_strata),
            "at revision {rev}"
        );
    }
    // HashKV is etcd's own: the restored etcd hashes its copy of the history alike.
    for rev in [delete_rev - 1, delete_rev, revision] {
        assert_eq!(
            e.hash_kv(rev).await.unwrap().hash(),
            c.hash_kv(rev).await.unwrap().hash(),
            "HashKV at revision {rev}"
        );
    }
    let leases = e.leases().await.unwrap();
    assert_eq!(
        leases.leases().iter().map(|l| l.id()).collect::<Vec<_>>(),
        vec![lease]
    );
    let ttl = e.lease_time_to_live(lease, None).await.unwrap();
    assert_eq!(ttl.granted_ttl(), 3600);
}

/// `etcdctl args..` that reads a file and reaches no server.
fn etcdctl_offline(args: &[&str]) -> String {
    let out = Command::new(strata_tests::etcdctl::etcdctl_bin())
        .env("ETCDCTL_API", "3")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "etcdctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The auth store travels in the file as etcd keeps it: an etcd restored from a snapshot of a
/// tenant with auth enabled enforces it, lets its users in with their passwords (Strata's
/// bcrypt hashes, checked by etcd) and applies their roles' permissions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_roles_and_passwords_survive_into_a_restored_etcd() {
    let d = Deployment::start(1).await;
    let ctl = Etcdctl::new(&d.frontend(0).listen);
    let file = d.dir().join("auth.db");
    let path = file.to_str().unwrap().to_string();
    tokio::task::spawn_blocking(move || {
        for args in [
            &["user", "add", "root:rootpw"][..],
            &["user", "add", "alice:alicepw"],
            &["role", "add", "reader"],
            &[
                "role",
                "grant-permission",
                "reader",
                "--prefix=true",
                "read",
                "/r/",
            ],
            &["user", "grant-role", "alice", "reader"],
            &["put", "/r/a", "1"],
            &["put", "/x", "2"],
            &["auth", "enable"],
        ] {
            ctl.ok(args);
        }
        let out = ctl.ok(&["--user", "root:rootpw", "snapshot", "save", &path]);
        assert!(out.contains("Snapshot saved at"), "{out}");
    })
    .await
    .unwrap();

    let etcd = EtcdServer::start_restored(&file).await;
    let e = Etcdctl::new(etcd.endpoint());
    tokio::task::spawn_blocking(move || {
        assert_eq!(
            e.ok(&["--user", "alice:alicepw", "get", "/r/a"]),
            "/r/a\n1\n"
        );
        let denied = e.fails(&["--user", "alice:alicepw", "get", "/x"]);
        assert!(denied.contains("permission denied"), "{denied}");
        let wrong = e.fails(&["--user", "alice:nope", "get", "/r/a"]);
        assert!(wrong.contains("authentication failed"), "{wrong}");
        let anonymous = e.fails(&["get", "/r/a"]);
        assert!(anonymous.contains("user name is empty"), "{anonymous}");
        assert_eq!(e.ok(&["--user", "root:rootpw", "get", "/x"]), "/x\n2\n");
        assert_eq!(
            e.ok(&["--user", "root:rootpw", "role", "get", "reader"]),
            "Role reader\nKV Read:\n\t[/r/, /r0) (prefix /r/)\nKV Write:\n"
        );
    })
    .await
    .unwrap();
}

/// The same requests sent to a Strata tenant and to a real etcd 3.4 give the same HashKV at
/// every revision, through overwrites, deletes, a txn, a lease revoked with its keys, and two
/// compactions (etcd's hash counts, of the versions at or below the compaction, only those a
/// compaction at the hashed revision would keep), and once every key is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_kv_is_etcd_s_for_the_same_history() {
    let d = Deployment::start(1).await;
    let etcd = EtcdServer::start().await;
    let mut s = Client::connect([d.frontend(0).endpoint()], None)
        .await
        .unwrap();
    let mut e = Client::connect([etcd.endpoint()], None).await.unwrap();
    let mut compactions = Vec::new();
    for step in 0..6 {
        for c in [&mut s, &mut e] {
            // The same lease id on both: it is in the hashed key-values.
            let id = 0x1000 + step;
            let opts = etcd_client::LeaseGrantOptions::new().with_id(id);
            let lease = c.lease_grant(600, Some(opts)).await.unwrap().id();
            for i in 0..8 {
                let opts = (i % 3 == step % 3).then(|| PutOptions::new().with_lease(lease));
                c.put(format!("h/{i}"), format!("v{step}.{i}"), opts)
                    .await
                    .unwrap();
            }
            c.delete(format!("h/{}", step % 8), None).await.unwrap();
            let txn = etcd_client::Txn::new().and_then([
                etcd_client::TxnOp::put(format!("t/{step}"), "a", None),
                etcd_client::TxnOp::put(format!("h/{}", (step + 3) % 8), "txn", None),
            ]);
            c.txn(txn).await.unwrap();
            if step % 2 == 1 {
                c.lease_revoke(lease).await.unwrap();
            }
            if step == 2 || step == 4 {
                let head = head_revision(c, "h/").await;
                c.compact(
                    head - 3,
                    Some(etcd_client::CompactionOptions::new().with_physical()),
                )
                .await
                .unwrap();
            }
        }
        let head = head_revision(&mut s, "h/").await;
        assert_eq!(
            head,
            head_revision(&mut e, "h/").await,
            "the same revisions"
        );
        if step == 2 || step == 4 {
            compactions.push(head - 3);
        }
        // etcd 3.4 refuses the compact revision itself; every revision above it is hashed.
        let from = compactions.last().map_or(1, |c| c + 1);
        for rev in from..=head {
            assert_eq!(
                s.hash_kv(rev).await.unwrap().hash(),
                e.hash_kv(rev).await.unwrap().hash(),
                "HashKV at revision {rev} after step {step}"
            );
        }
    }
    assert_eq!(compactions.len(), 2);
    // With no key live at the hashed revision, etcd counts every version its compaction kept
    // below the compact revision: every key deleted after the last compaction.
    for c in [&mut s, &mut e] {
        c.delete("", Some(etcd_client::DeleteOptions::new().with_all_keys()))
            .await
            .unwrap();
    }
    let head = head_revision(&mut s, "h/").await;
    assert_eq!(
        s.hash_kv(head).await.unwrap().hash(),
        e.hash_kv(head).await.unwrap().hash(),
        "HashKV with nothing live"
    );
}
