//! `strata admin backup list|restore` against three journal processes and a `strata compactor`:
//! a tenant is restored to an older checkpoint through the journal, and a replica built from the
//! journal afterwards holds exactly the checkpoint's keys, values, lease attachments and leases,
//! one revision later; and with two frontends, a reader polling both during the restore sees
//! the old state or the restored one, never a mix, both end at the same revision and HashKV, and
//! a watcher gets every change of the restore at that one revision.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use api::etcdserverpb::{
    AuthRoleAddRequest, AuthUserAddRequest, AuthUserDeleteRequest, AuthUserGrantRoleRequest,
    DeleteRangeRequest, LeaseGrantRequest, LeaseRevokeRequest, PutRequest, RangeRequest,
};
use api::record::{encode_entry, entry_for_tenant};
use api::strata::entry::auth_change::Change;
use api::strata::entry::entry::Request;
use api::strata::entry::{AuthChange, Entry};
use compactor::{Catalog, reader};
use futures::StreamExt;
use journal::client::JournalClient;
use memstore::MemStore;
use strata_tests::deployment::Deployment;
use strata_tests::process::{ChildGuard, strata_bin};
use strata_tests::readiness::tail_file;

const SHARD: u32 = 0;
const TENANT: &str = "default";
const WAIT: Duration = Duration::from_secs(90);
/// Leases outlive the test: what is compared must not expire meanwhile.
const LEASE_TTL: i64 = 3600;

fn auth(change: Change) -> Vec<u8> {
    entry(Request::Auth(AuthChange {
        change: Some(change),
    }))
}

fn user_add(name: &str) -> Vec<u8> {
    auth(Change::UserAdd(AuthUserAddRequest {
        name: name.into(),
        // base64 of a stand-in hash: the frontend would send a bcrypt hash.
        hashed_password: "aGFzaA==".into(),
        ..Default::default()
    }))
}

fn entry(request: Request) -> Vec<u8> {
    encode_entry(&Entry {
        format_version: api::ENTRY_FORMAT_VERSION,
        tenant: TENANT.into(),
        request_id: rand::random::<[u8; 16]>().to_vec(),
        time_ms: 0,
        request: Some(request),
        ..Default::default()
    })
}

fn put(key: String, value: &str, lease: i64) -> Vec<u8> {
    entry(Request::Put(PutRequest {
        key: key.into_bytes(),
        value: value.as_bytes().to_vec(),
        lease,
        ..Default::default()
    }))
}

type State = (BTreeMap<Vec<u8>, (Vec<u8>, i64)>, Vec<i64>);

fn state(s: &MemStore) -> State {
    let all = RangeRequest {
        key: vec![0],
        range_end: vec![0],
        ..Default::default()
    };
    let kvs = s
        .range(&all)
        .unwrap()
        .kvs
        .into_iter()
        .map(|kv| (kv.key, (kv.value, kv.lease)))
        .collect();
    let leases = s.lease_leases().leases.into_iter().map(|l| l.id).collect();
    (kvs, leases)
}

/// The tenant as of now: newest checkpoint plus the journal up to a read index.
async fn current(catalog: &Catalog, client: &JournalClient) -> MemStore {
    let mut s = reader::latest_in(catalog, TENANT)
        .await
        .unwrap()
        .unwrap()
        .store;
    let upto = client.read_index(SHARD).await.unwrap();
    let mut stream = Box::pin(client.read(SHARD, s.applied_index() + 1).await.unwrap());
    while s.applied_index() < upto {
        let r = tokio::time::timeout(WAIT, stream.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        s.apply(r.index, &entry_for_tenant(&r, TENANT).unwrap());
    }
    s
}

async fn admin(args: &[String]) -> String {
    let out = tokio::process::Command::new(strata_bin())
        .args(args)
        .output()
        .await
        .expect("run strata admin");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "strata {args:?} failed\n--- stdout ---\n{stdout}\n--- stderr ---\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Runs `strata args`, which must fail: what it printed on stderr.
async fn admin_refused(args: &[String]) -> String {
    let out = tokio::process::Command::new(strata_bin())
        .args(args)
        .output()
        .await
        .expect("run strata admin");
    assert!(!out.status.success(), "strata {args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `strata admin backup restore` against the object store at `url` and the journal nodes
/// `journals`, then `rest`.
fn restore_args(url: &str, journals: &[String], rest: &[&str]) -> Vec<String> {
    let journals = journals.join(",");
    [
        "admin",
        "backup",
        "restore",
        "--object-store",
        url,
        "--journal",
        &journals,
    ]
    .iter()
    .chain(rest)
    .map(|a| a.to_string())
    .collect()
}

async fn wait_checkpoint(catalog: &Catalog, index: u64, log: &std::path::Path) -> u64 {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(m) = catalog.latest_manifest(TENANT).await.unwrap()
            && m.newest().unwrap().index >= index
        {
            return m.newest().unwrap().index;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no checkpoint at {index}\n--- compactor log ---\n{}",
            tail_file(log)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_brings_a_tenant_back_to_an_older_checkpoint_through_the_journal() {
    let deployment = Deployment::start(0).await;
    let journals = deployment.journal_addrs().to_vec();
    let objects = deployment.objects();
    let url = format!("file://{}", objects.display());
    let log = deployment.dir().join("compactor.log");
    let client = JournalClient::connect(&journals).await.unwrap();
    let catalog = Catalog::new(compactor::store::open(&url).unwrap());
    let _compactor =
        deployment.start_compactor(&["--every-entries", "50", "--every", "500ms", "--keep", "200"]);

    // Phase A: two leases, 100 keys (every tenth on lease 100, every seventh on lease 101).
    let mut a = vec![
        entry(Request::LeaseGrant(LeaseGrantRequest {
            ttl: LEASE_TTL,
            id: 100,
        })),
        entry(Request::LeaseGrant(LeaseGrantRequest {
            ttl: LEASE_TTL,
            id: 101,
        })),
    ];
    // Users and roles too: etcd's snapshot restore brings its auth store back.
    a.push(user_add("alice"));
    a.push(auth(Change::RoleAdd(AuthRoleAddRequest {
        name: "reader".into(),
    })));
    a.push(auth(Change::UserGrantRole(AuthUserGrantRoleRequest {
        user: "alice".into(),
        role: "reader".into(),
    })));
    for i in 0..100 {
        let lease = if i % 10 == 0 {
            100
        } else if i % 7 == 0 {
            101
        } else {
            0
        };
        a.push(put(format!("k{i:03}"), "a", lease));
    }
    let idx = client.append(SHARD, a).await.unwrap();
    let checkpoint = wait_checkpoint(&catalog, *idx.last().unwrap(), &log).await;
    let m = catalog.latest_manifest(TENANT).await.unwrap().unwrap();
    let r = m
        .checkpoints
        .iter()
        .find(|c| c.index == checkpoint)
        .unwrap();
    let (_, target) = reader::load(&catalog, TENANT, r).await.unwrap();
    let want = state(&target);
    assert_eq!(want.0.len(), 100);

    // Phase B: overwrite, delete, add keys, a new lease, revoke lease 100 (its keys go).
    let mut b = vec![entry(Request::LeaseGrant(LeaseGrantRequest {
        ttl: LEASE_TTL,
        id: 102,
    }))];
    for i in 50..150 {
        b.push(put(
            format!("k{i:03}"),
            "b",
            if i % 3 == 0 { 102 } else { 0 },
        ));
    }
    b.push(entry(Request::DeleteRange(DeleteRangeRequest {
        key: b"k000".to_vec(),
        range_end: b"k020".to_vec(),
        ..Default::default()
    })));
    b.push(entry(Request::LeaseRevoke(LeaseRevokeRequest { id: 100 })));
    b.push(auth(Change::UserDelete(AuthUserDeleteRequest {
        name: "alice".into(),
    })));
    b.push(user_add("bob"));
    let idx = client.append(SHARD, b).await.unwrap();
    wait_checkpoint(&catalog, *idx.last().unwrap(), &log).await;
    let before = current(&catalog, &client).await;
    assert_ne!(state(&before), want, "phase B changed the tenant");

    let listed =
        admin(&["admin", "backup", "list", "--object-store", &url].map(String::from)).await;
    assert!(
        listed
            .lines()
            .any(|l| l.contains(TENANT) && l.contains(&format!(" {checkpoint} "))),
        "backup list shows checkpoint {checkpoint}:\n{listed}"
    );
    // A mistyped store or tenant fails instead of printing an empty table.
    for args in [
        vec!["--object-store", "file:///nonexistent-strata-store"],
        vec!["--object-store", url.as_str(), "--tenant", "nosuch"],
    ] {
        let out = tokio::process::Command::new(strata_bin())
            .args(["admin", "backup", "list"])
            .args(&args)
            .output()
            .await
            .unwrap();
        assert!(!out.status.success(), "backup list {args:?} succeeded");
    }

    let out = admin(&restore_args(
        &url,
        &journals,
        &["--tenant", TENANT, "--index", &checkpoint.to_string()],
    ))
    .await;
    assert!(out.contains("restored tenant default"), "{out}");
    assert!(
        out.contains("auth restored (1 users, 1 roles, disabled)"),
        "{out}"
    );

    let after = current(&catalog, &client).await;
    assert_eq!(
        state(&after),
        want,
        "keys, values, lease attachments and leases as checkpointed"
    );
    assert_eq!(
        after.revision(),
        before.revision() + 1,
        "the whole restore is one revision, after the last one"
    );
    assert_eq!(after.auth_users(), vec!["alice"], "alice back, bob gone");
    assert_eq!(after.auth_user("alice"), target.auth_user("alice"));
    assert_eq!(after.auth_roles(), vec!["reader"]);
    assert_eq!(
        after.auth_revision(),
        before.auth_revision() + 1,
        "the auth state came back as one change"
    );
    // A second restore to the same point has nothing to do.
    let again = admin(&restore_args(
        &url,
        &journals,
        &["--index", &checkpoint.to_string()],
    ))
    .await;
    assert!(again.contains("already matches"), "{again}");
    drop(deployment);
}

/// Every key and value under `r/` as frontend `endpoint` serves it (linearizable), with the
/// revision of the read.
/// What a restore test goes back to: a deployment with a compactor checkpointing every
/// 500 ms (keeping enough checkpoints that the one restored to is still retained on a slow
/// machine), keys `r/000`.. of `BIG_VALUE` bytes written through frontend 0, and the
/// checkpoint that holds them.
struct Checkpointed {
    deployment: Deployment,
    journals: Vec<String>,
    url: String,
    client: JournalClient,
    catalog: Catalog,
    _compactor: ChildGuard,
    f0: etcd_client::Client,
    /// `r/` as served when the checkpoint was taken.
    want: BTreeMap<Vec<u8>, Vec<u8>>,
    checkpoint: u64,
}

async fn checkpointed(frontends: usize, keys: usize) -> Checkpointed {
    let deployment = Deployment::start(frontends).await;
    let journals = deployment.journal_addrs().to_vec();
    let url = format!("file://{}", deployment.objects().display());
    let log = deployment.dir().join("compactor.log");
    let client = JournalClient::connect(&journals).await.unwrap();
    let catalog = Catalog::new(compactor::store::open(&url).unwrap());
    let _compactor = deployment.start_compactor(&["--every", "500ms", "--keep", "200"]);
    let mut f0 = etcd_client::Client::connect([deployment.frontend(0).endpoint()], None)
        .await
        .unwrap();
    for i in 0..keys {
        f0.put(format!("r/{i:03}"), vec![b'a'; BIG_VALUE], None)
            .await
            .unwrap();
    }
    let (want, _) = served(&mut f0).await;
    let checkpoint = wait_checkpoint(&catalog, client.read_index(SHARD).await.unwrap(), &log).await;
    Checkpointed {
        deployment,
        journals,
        url,
        client,
        catalog,
        _compactor,
        f0,
        want,
        checkpoint,
    }
}

/// A write racing the restore aborts its commit; the command plans again from the newer state,
/// loading the checkpoint again (it drops the target once a plan is in the journal, to bound
/// its memory), and the second plan lands: the tenant holds the checkpoint's keys, the raced
/// key's value included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_raced_by_a_write_plans_again_and_lands() {
    // 150 keys of a value large enough for the plan to take several chunks (and small enough
    // to be read in one answer, under the client's 4 MiB).
    let Checkpointed {
        deployment,
        journals,
        url,
        mut f0,
        want,
        checkpoint,
        ..
    } = checkpointed(1, 150).await;
    for i in 0..150 {
        f0.put(format!("r/{i:03}"), "b", None).await.unwrap();
    }

    // A writer of one key of the plan, until the first attempt has been aborted.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut w = etcd_client::Client::connect([deployment.frontend(0).endpoint()], None)
        .await
        .unwrap();
    let writer = tokio::spawn(async move {
        let mut n = 0;
        while !*stopped.borrow() {
            w.put("r/000", format!("racer-{n}"), None).await.unwrap();
            n += 1;
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        n
    });
    let args = restore_args(&url, &journals, &["--index", &checkpoint.to_string()]);
    let mut cmd = tokio::process::Command::new(strata_bin())
        .args(&args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stderr = tokio::io::BufReader::new(cmd.stderr.take().unwrap());
    let mut said = String::new();
    let aborted = tokio::time::timeout(WAIT, async {
        use tokio::io::AsyncBufReadExt;
        let mut line = String::new();
        while stderr.read_line(&mut line).await.unwrap() > 0 {
            said.push_str(&line);
            if line.contains("the restore was aborted") {
                return true;
            }
            line.clear();
        }
        false
    })
    .await
    .unwrap_or(false);
    stop.send(true).unwrap();
    let writes = writer.await.unwrap();
    assert!(
        aborted,
        "the first attempt was not aborted ({writes} racing writes)\n--- stderr ---\n{said}"
    );
    let rest = tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        let mut rest = String::new();
        stderr.read_to_string(&mut rest).await.unwrap();
        rest
    });
    let out = cmd.wait_with_output().await.unwrap();
    said.push_str(&rest.await.unwrap());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("restored tenant"),
        "{stdout}\n--- stderr ---\n{said}"
    );
    assert!(
        said.contains(&format!("loading checkpoint {checkpoint} again")),
        "{said}"
    );
    // Every frontend has applied the commit once the command returns.
    let (got, _) = served(&mut f0).await;
    let differ = want
        .iter()
        .find(|(k, v)| got.get(*k) != Some(*v))
        .map(|(k, _)| String::from_utf8_lossy(k).into_owned());
    assert!(
        got == want,
        "{} keys served, {} in the checkpoint; first differing: {differ:?}",
        got.len(),
        want.len()
    );
}

async fn served(c: &mut etcd_client::Client) -> (BTreeMap<Vec<u8>, Vec<u8>>, i64) {
    let r = c
        .get("r/", Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .unwrap();
    let kvs = r
        .kvs()
        .iter()
        .map(|kv| (kv.key().to_vec(), kv.value().to_vec()))
        .collect();
    (kvs, r.header().unwrap().revision())
}

/// Reads `r/` from both frontends in turn until `stop`, checking that each read is exactly
/// `old` or `new`; returns how many reads saw each.
async fn poll_for_a_mix(
    mut clients: Vec<etcd_client::Client>,
    old: BTreeMap<Vec<u8>, Vec<u8>>,
    new: BTreeMap<Vec<u8>, Vec<u8>>,
    stop: tokio::sync::watch::Receiver<bool>,
    old_reads: Arc<std::sync::atomic::AtomicUsize>,
) -> (usize, usize) {
    let (mut saw_old, mut saw_new) = (0, 0);
    let mut i = 0usize;
    while !*stop.borrow() {
        let c = &mut clients[i % 2];
        let opts = etcd_client::GetOptions::new().with_prefix();
        // Alternate linearizable and serializable reads.
        let opts = if (i / 2).is_multiple_of(2) {
            opts
        } else {
            opts.with_serializable()
        };
        let r = c.get("r/", Some(opts)).await.unwrap();
        let kvs: BTreeMap<Vec<u8>, Vec<u8>> = r
            .kvs()
            .iter()
            .map(|kv| (kv.key().to_vec(), kv.value().to_vec()))
            .collect();
        if kvs == old {
            saw_old += 1;
            old_reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        } else if kvs == new {
            saw_new += 1;
        } else {
            panic!(
                "frontend {} served a half-restored tenant at revision {}: {} keys, {} of them as restored",
                i % 2,
                r.header().unwrap().revision(),
                kvs.len(),
                kvs.iter().filter(|(k, v)| new.get(*k) == Some(*v)).count()
            );
        }
        i += 1;
    }
    (saw_old, saw_new)
}

/// Bytes of each value of phase A: 100 of them make the restore span several chunks
/// (`compactor::restore::MAX_CHUNK_BYTES`), so atomicity is not an accident of one entry.
const BIG_VALUE: usize = 24 * 1024;

/// A restore written through the journal is seen by every frontend at once: a reader polling
/// both never sees a mix of the old and the restored state, both serve the checkpoint's keys at
/// the same revision with the same HashKV, and a watcher opened before the restore gets every
/// change at that one revision (nothing is cancelled: docs/compactor.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_is_atomic_on_every_frontend_and_watchers_get_it_at_one_revision() {
    // Phase A through frontend 0, then a checkpoint of it.
    let Checkpointed {
        deployment,
        journals,
        url,
        client,
        catalog,
        mut f0,
        want,
        checkpoint,
        _compactor,
    } = checkpointed(2, 100).await;
    let mut f1 = etcd_client::Client::connect([deployment.frontend(1).endpoint()], None)
        .await
        .unwrap();

    // Phase B: overwrite most keys, delete others, add new ones.
    for i in 20..120 {
        f0.put(format!("r/{i:03}"), "b", None).await.unwrap();
    }
    f0.delete(
        "r/000",
        Some(etcd_client::DeleteOptions::new().with_range("r/010")),
    )
    .await
    .unwrap();
    let (before, before_rev) = served(&mut f1).await;
    assert_ne!(before, want);

    // A watcher on frontend 1 from the next revision, opened before the restore.
    let mut watch = f1
        .watch(
            "r/",
            Some(
                etcd_client::WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(before_rev + 1),
            ),
        )
        .await
        .unwrap();

    // A reader polling both frontends all through the restore.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut readers = Vec::new();
    for f in 0..2 {
        readers.push(
            etcd_client::Client::connect([deployment.frontend(f).endpoint()], None)
                .await
                .unwrap(),
        );
    }
    let old_reads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let poller = tokio::spawn(poll_for_a_mix(
        readers,
        before.clone(),
        want.clone(),
        stopped,
        Arc::clone(&old_reads),
    ));
    // The restore starts once both frontends were read before it, so the reader spans it.
    while old_reads.load(std::sync::atomic::Ordering::Relaxed) < 2 {
        assert!(
            !poller.is_finished(),
            "the reader stopped before the restore"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let out = admin(&restore_args(
        &url,
        &journals,
        &["--index", &checkpoint.to_string()],
    ))
    .await;
    assert!(out.contains("restored tenant default"), "{out}");

    // Both frontends serve the checkpoint's keys at one revision, with one HashKV.
    let (kv0, rev0) = served(&mut f0).await;
    let (kv1, rev1) = served(&mut f1).await;
    // Let the reader see the restored state on both for a moment, then stop it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.send(true).unwrap();
    let (saw_old, saw_new) = poller.await.expect("no read saw a half-restored tenant");
    println!("reader: {saw_old} reads of the old state, {saw_new} of the restored one");
    assert!(saw_old >= 2 && saw_new > 0, "the reader spans the restore");
    assert_eq!(kv0, want, "frontend 0 serves the restored keys");
    assert_eq!(kv1, want, "frontend 1 serves the restored keys");
    assert_eq!(rev0, rev1, "both at the revision after the restore");
    assert_eq!(
        rev0,
        before_rev + 1,
        "the whole restore is one new revision"
    );
    let h0 = f0.hash_kv(rev0).await.unwrap().hash();
    let h1 = f1.hash_kv(rev0).await.unwrap().hash();
    assert_eq!(h0, h1, "HashKV at {rev0}");
    let replica = current(&catalog, &client).await;
    assert_eq!(
        replica.hash_kv(rev0).unwrap().hash,
        h0,
        "as a replica from the journal"
    );

    // The watcher saw the restore as events, in revision order, up to the new revision; applied
    // to the state before the restore they give the restored state.
    let mut seen = before;
    let mut last = before_rev;
    while last < rev0 {
        let r = tokio::time::timeout(WAIT, watch.message())
            .await
            .expect("watch events within the timeout")
            .unwrap()
            .expect("watch stream open");
        assert!(!r.canceled(), "a restore does not cancel watchers: {r:?}");
        for e in r.events() {
            let kv = e.kv().unwrap();
            assert_eq!(
                kv.mod_revision(),
                rev0,
                "every change at the restore's revision"
            );
            last = kv.mod_revision();
            match e.event_type() {
                etcd_client::EventType::Put => {
                    seen.insert(kv.key().to_vec(), kv.value().to_vec());
                }
                etcd_client::EventType::Delete => {
                    seen.remove(kv.key());
                }
            }
        }
    }
    assert_eq!(last, rev0);
    assert_eq!(seen, want, "the events replay the restore");
    drop(deployment);
}

/// Keys under `prefix` with their values and leases, as `c` may read them.
/// `etcdctl [flags] snapshot save` of `etcd` into its directory: the file.
async fn save_etcd_snapshot(
    etcd: &strata_tests::etcd::EtcdServer,
    flags: &[&str],
) -> std::path::PathBuf {
    let file = etcd.dir().join("etcd.db");
    let ctl = strata_tests::etcdctl::Etcdctl::new(etcd.endpoint());
    let mut args: Vec<String> = flags.iter().map(|f| f.to_string()).collect();
    args.extend(["snapshot".into(), "save".into(), file.display().to_string()]);
    let out = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        ctl.ok(&args)
    })
    .await
    .unwrap();
    assert!(out.contains("Snapshot saved at"), "{out}");
    file
}

async fn keys_under(c: &mut etcd_client::Client, prefix: &str) -> Vec<(Vec<u8>, Vec<u8>, i64)> {
    c.get(prefix, Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .unwrap()
        .kvs()
        .iter()
        .map(|kv| (kv.key().to_vec(), kv.value().to_vec(), kv.lease()))
        .collect()
}

/// One frontend, three journal nodes and a compactor checkpointing every 500 ms into a
/// directory, with what a restore test reaches them by.
struct Served {
    deployment: Deployment,
    journals: Vec<String>,
    url: String,
    log: std::path::PathBuf,
    client: JournalClient,
    catalog: Catalog,
    _compactor: strata_tests::process::ChildGuard,
}

impl Served {
    async fn start() -> Self {
        let deployment = Deployment::start(1).await;
        let journals = deployment.journal_addrs().to_vec();
        let url = format!("file://{}", deployment.objects().display());
        Served {
            log: deployment.dir().join("compactor.log"),
            client: JournalClient::connect(&journals).await.unwrap(),
            catalog: Catalog::new(compactor::store::open(&url).unwrap()),
            _compactor: deployment.start_compactor(&["--every", "500ms"]),
            deployment,
            journals,
            url,
        }
    }

    /// An etcd client of the frontend.
    async fn client(&self) -> etcd_client::Client {
        etcd_client::Client::connect([self.deployment.frontend(0).endpoint()], None)
            .await
            .unwrap()
    }
}

/// `backup restore --from-file`: a file `etcdctl snapshot save` wrote from a frontend brings
/// the tenant back to it (keys, values, a revoked lease and its keys), at one new revision; a
/// damaged file is refused and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_is_restored_from_an_etcdctl_snapshot_file() {
    let served = Served::start().await;
    let mut c = served.client().await;
    let lease = c.lease_grant(LEASE_TTL, None).await.unwrap().id();
    for i in 0..50 {
        let opts = (i % 5 == 0).then(|| etcd_client::PutOptions::new().with_lease(lease));
        c.put(format!("f/{i:03}"), "a", opts).await.unwrap();
    }
    let want = keys_under(&mut c, "f/").await;
    let file = served.deployment.dir().join("saved.db");
    let ctl = strata_tests::etcdctl::Etcdctl::new(&served.deployment.frontend(0).listen);
    let path = file.to_str().unwrap().to_string();
    let out = tokio::task::spawn_blocking(move || ctl.ok(&["snapshot", "save", &path]))
        .await
        .unwrap();
    assert!(out.contains("Snapshot saved at"), "{out}");

    // Changes after the snapshot: overwrites, deletes, new keys, the lease revoked.
    for i in 25..75 {
        c.put(format!("f/{i:03}"), "b", None).await.unwrap();
    }
    c.delete(
        "f/000",
        Some(etcd_client::DeleteOptions::new().with_range("f/010")),
    )
    .await
    .unwrap();
    c.lease_revoke(lease).await.unwrap();
    wait_checkpoint(
        &served.catalog,
        served.client.read_index(SHARD).await.unwrap(),
        &served.log,
    )
    .await;
    let changed = keys_under(&mut c, "f/").await;
    assert_ne!(changed, want);
    let restore = |file: &std::path::Path| {
        restore_args(
            &served.url,
            &served.journals,
            &["--from-file", file.to_str().unwrap()],
        )
    };

    // A damaged file: its SHA-256 trailer does not match; nothing changes.
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[100] ^= 0xff;
    let damaged = served.deployment.dir().join("damaged.db");
    std::fs::write(&damaged, &bytes).unwrap();
    let stderr = admin_refused(&restore(&damaged)).await;
    assert!(
        stderr.contains("SHA-256 trailer does not match"),
        "{stderr}"
    );
    assert_eq!(keys_under(&mut c, "f/").await, changed);

    let before = c
        .get("f/", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    let out = admin(&restore(&file)).await;
    assert!(
        out.contains("restored tenant default to snapshot") && out.contains("(50 keys, 1 leases"),
        "{out}"
    );
    assert_eq!(
        keys_under(&mut c, "f/").await,
        want,
        "keys, values and leases as saved"
    );
    let after = c
        .get("f/", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    assert_eq!(after, before + 1, "the whole restore is one new revision");
    let ttl = c.lease_time_to_live(lease, None).await.unwrap();
    assert!(ttl.ttl() > 0, "the revoked lease is granted again");
    let again = admin(&restore(&file)).await;
    assert!(again.contains("already matches snapshot"), "{again}");

    // A file saved by a release before session 34 (a checkpoint, zero-padded to 512 * n bytes,
    // then its SHA-256) is still read: here one holding the saved keys and one more.
    let bytes = std::fs::read(&file).unwrap();
    let mut store = compactor::etcd_snapshot::read(&bytes[..])
        .unwrap()
        .into_store("default")
        .unwrap();
    let entry = api::strata::entry::Entry {
        format_version: api::ENTRY_FORMAT_VERSION,
        tenant: "default".into(),
        request: Some(api::strata::entry::entry::Request::Put(
            api::etcdserverpb::PutRequest {
                key: b"f/old-format".to_vec(),
                value: b"c".to_vec(),
                ..Default::default()
            },
        )),
        ..Default::default()
    };
    store.apply(store.applied_index() + 1, &entry);
    let meta = memstore::checkpoint::CheckpointMeta {
        tenant: "default".into(),
        shard: SHARD,
        index: store.applied_index(),
        revision: store.revision(),
        created_ms: 0,
    };
    let mut old = memstore::checkpoint::encode(&meta, &store);
    old.resize(old.len().next_multiple_of(512), 0);
    let sha = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &old);
    old.extend_from_slice(sha.as_ref());
    let old_file = served.deployment.dir().join("old-format.db");
    std::fs::write(&old_file, &old).unwrap();
    let out = admin(&restore(&old_file)).await;
    assert!(out.contains("tenant default at index"), "{out}");
    let mut with_one_more = want.clone();
    with_one_more.push((b"f/old-format".to_vec(), b"c".to_vec(), 0));
    assert_eq!(keys_under(&mut c, "f/").await, with_one_more);
}

/// `backup restore --from-etcd-snapshot`: a snapshot `etcdctl snapshot save` took of a real
/// etcd 3.4 (thousands of keys over many bbolt pages, a value spanning several, overwritten and
/// deleted keys, a lease, users with passwords and roles, auth on) becomes a tenant's keyspace:
/// the same live keys, values and lease, the key the tenant held before gone, and etcd's users
/// log in to Strata with their etcd passwords and the permissions etcd gave them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_snapshot_becomes_a_tenants_keyspace() {
    use etcd_client::{ConnectOptions, Permission, PutOptions};
    let etcd = strata_tests::etcd::EtcdServer::start().await;
    let mut e = etcd_client::Client::connect([etcd.endpoint()], None)
        .await
        .unwrap();
    let lease = e.lease_grant(LEASE_TTL, None).await.unwrap().id();
    // 3,000 pods, every hundredth on the lease, then the first 300 overwritten.
    let first = (0..3000).map(|i| (i, format!("pod {i}"), i % 100 == 0));
    let second = (0..300).map(|i| (i, format!("pod {i} v2"), false));
    for (i, value, leased) in first.chain(second) {
        let opts = leased.then(|| PutOptions::new().with_lease(lease));
        e.put(format!("/registry/pods/ns{}/p{i:05}", i % 7), value, opts)
            .await
            .unwrap();
    }
    e.delete(
        "/registry/pods/ns0/",
        Some(etcd_client::DeleteOptions::new().with_prefix()),
    )
    .await
    .unwrap();
    e.put("/registry/configmaps/big", "x".repeat(20_000), None)
        .await
        .unwrap();
    e.user_add("root", "rootpw", None).await.unwrap();
    e.user_grant_role("root", "root").await.unwrap();
    e.role_add("reader").await.unwrap();
    e.role_grant_permission("reader", Permission::read("/registry/").with_prefix())
        .await
        .unwrap();
    e.user_add("alice", "alicepw", None).await.unwrap();
    e.user_grant_role("alice", "reader").await.unwrap();
    e.auth_enable().await.unwrap();
    let login = |user: &str, password: &str| {
        Some(
            ConnectOptions::new()
                .with_user(user, password)
                .with_timeout(Duration::from_secs(30)),
        )
    };
    let mut root = etcd_client::Client::connect([etcd.endpoint()], login("root", "rootpw"))
        .await
        .unwrap();
    let want = keys_under(&mut root, "/registry/").await;
    let deleted = (0..3000).filter(|i| i % 7 == 0).count();
    assert_eq!(want.len(), 3000 - deleted + 1);
    let file = save_etcd_snapshot(&etcd, &["--user", "root:rootpw"]).await;

    // A Strata tenant with a key of its own and a checkpoint.
    let served = Served::start().await;
    let endpoint = served.deployment.frontend(0).endpoint();
    let mut s = served.client().await;
    s.put("/registry/old", "strata's own", None).await.unwrap();
    wait_checkpoint(
        &served.catalog,
        served.client.read_index(SHARD).await.unwrap(),
        &served.log,
    )
    .await;

    let out = admin(&restore_args(
        &served.url,
        &served.journals,
        &["--from-etcd-snapshot", file.to_str().unwrap()],
    ))
    .await;
    assert!(
        out.contains("restored tenant default to etcd snapshot"),
        "{out}"
    );
    assert!(
        out.contains("auth restored (2 users, 2 roles, enabled)"),
        "{out}"
    );

    // Auth is on now, with etcd's users and passwords.
    let mut root = etcd_client::Client::connect([&endpoint], login("root", "rootpw"))
        .await
        .unwrap();
    let got = keys_under(&mut root, "/registry/").await;
    // Compared key by key: a failure names the first difference, not two 2,500-key dumps.
    let first_difference = got.iter().zip(&want).find(|(g, w)| g != w).map(|(g, w)| {
        (
            String::from_utf8_lossy(&g.0).into_owned(),
            String::from_utf8_lossy(&w.0).into_owned(),
        )
    });
    assert_eq!(
        (got.len(), first_difference),
        (want.len(), None),
        "etcd's live keys, values and leases (Strata's, etcd's)"
    );
    let ttl = root.lease_time_to_live(lease, None).await.unwrap();
    assert_eq!(ttl.granted_ttl(), LEASE_TTL);
    let mut alice = etcd_client::Client::connect([&endpoint], login("alice", "alicepw"))
        .await
        .unwrap();
    assert_eq!(keys_under(&mut alice, "/registry/").await.len(), want.len());
    let denied = alice.put("/registry/x", "v", None).await.unwrap_err();
    assert!(denied.to_string().contains("permission denied"), "{denied}");
    assert!(
        etcd_client::Client::connect([&endpoint], login("alice", "wrong"))
            .await
            .is_err(),
        "a wrong password is refused"
    );
}

/// A tenant the compactor has never checkpointed (created, nothing written yet: the usual start
/// of a move from etcd) takes an etcd snapshot too. On a shard the compactor trimmed while it
/// held no record of the tenant, the restore starts from an empty tenant on the compactor's word,
/// as a frontend starting that tenant does; on a shard never trimmed, from the journal's start.
/// A tenant other than the default one needs its shard named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_snapshot_restores_into_a_tenant_never_checkpointed() {
    use strata_tests::deployment::frontend_args;
    use strata_tests::process::{ChildGuard, free_port};
    use strata_tests::readiness::wait_ready;
    let etcd = strata_tests::etcd::EtcdServer::start().await;
    let mut e = etcd_client::Client::connect([etcd.endpoint()], None)
        .await
        .unwrap();
    for i in 0..500 {
        e.put(format!("/registry/cm/c{i:03}"), format!("v{i}"), None)
            .await
            .unwrap();
    }
    let file = save_etcd_snapshot(&etcd, &[]).await;

    let d = Deployment::start(0).await;
    let journals = d.journal_addrs().to_vec();
    let url = format!("file://{}", d.objects().display());
    // Shard 1 holds no tenant: the compactor trims it behind its idle ticks.
    let _compactor =
        d.start_compactor(&["--shards", "0,1", "--every-entries", "10", "--every", "1s"]);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let mut first = 0;
        for j in &journals {
            first = first.max(strata_tests::journal::first_index_of(j, 1).await);
        }
        if first > 1 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "shard 1 was never trimmed\n{}",
            tail_file(&d.dir().join("compactor.log"))
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let snapshot = file.to_str().unwrap();
    let said = admin_refused(&restore_args(
        &url,
        &journals,
        &["--tenant", "late", "--from-etcd-snapshot", snapshot],
    ))
    .await;
    assert!(said.contains("name its shard with --shard"), "{said}");
    // Trimmed shard 1; shard 2, never trimmed (the compactor does not own it).
    for (tenant, shard) in [("late", "1"), ("other", "2")] {
        let out = admin(&restore_args(
            &url,
            &journals,
            &[
                "--tenant",
                tenant,
                "--shard",
                shard,
                "--from-etcd-snapshot",
                snapshot,
            ],
        ))
        .await;
        assert!(
            out.contains(&format!("restored tenant {tenant} to etcd snapshot")),
            "{out}"
        );
        assert!(out.contains("500 keys put"), "{out}");

        // A frontend of the tenant serves etcd's keys.
        let listen = format!("127.0.0.1:{}", free_port());
        let metrics = format!("127.0.0.1:{}", free_port());
        let log = d.dir().join(format!("frontend-{tenant}.log"));
        let mut args = frontend_args(&journals, &listen, &metrics, &[]);
        args.extend(
            [
                "--tenant",
                tenant,
                "--shard",
                shard,
                "--object-store",
                &d.objects().display().to_string(),
            ]
            .map(String::from),
        );
        let _fe = ChildGuard::strata(&format!("frontend-{tenant}"), &args, Some(&log));
        let endpoint = format!("http://{listen}");
        if let Err(e) = wait_ready(&endpoint, WAIT).await {
            panic!("{e}\n--- frontend log ---\n{}", tail_file(&log));
        }
        let mut c = etcd_client::Client::connect([endpoint], None)
            .await
            .unwrap();
        let got = keys_under(&mut c, "/registry/").await;
        assert_eq!(got.len(), 500, "tenant {tenant}");
        assert_eq!(got[7].1, b"v7");
    }
}

/// `backup export`: a retained checkpoint written as etcd's snapshot file, from the object
/// store alone: `etcdctl snapshot status` reads it at the checkpoint's revision, an etcd
/// restored from it serves what the frontend served at that revision, and the newest or an
/// older checkpoint named by its index can be exported (one not retained is refused, naming
/// those that are).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_is_exported_as_an_etcd_snapshot_file() {
    let served = Served::start().await;
    let mut c = served.client().await;
    let lease = c.lease_grant(LEASE_TTL, None).await.unwrap().id();
    for i in 0..40 {
        let opts = (i % 4 == 0).then(|| etcd_client::PutOptions::new().with_lease(lease));
        c.put(format!("x/{i:03}"), format!("v{i}"), opts)
            .await
            .unwrap();
    }
    c.delete("x/001", None).await.unwrap();
    let index = wait_checkpoint(
        &served.catalog,
        served.client.read_index(SHARD).await.unwrap(),
        &served.log,
    )
    .await;
    let manifest = served
        .catalog
        .latest_manifest(TENANT)
        .await
        .unwrap()
        .unwrap();
    let checkpoint = manifest.newest().unwrap().clone();
    assert_eq!(checkpoint.index, index);

    let file = served.deployment.dir().join("export.db");
    let export = |rest: &[&str]| -> Vec<String> {
        ["admin", "backup", "export", "--object-store", &served.url]
            .iter()
            .chain(rest)
            .map(|a| a.to_string())
            .collect()
    };
    let out = admin(&export(&["--to", file.to_str().unwrap()])).await;
    assert!(
        out.contains(&format!("exported checkpoint {index} of tenant {TENANT}")),
        "{out}"
    );
    let status = tokio::process::Command::new(strata_tests::etcdctl::etcdctl_bin())
        .env("ETCDCTL_API", "3")
        .args(["snapshot", "status", "-w", "json", file.to_str().unwrap()])
        .output()
        .await
        .unwrap();
    assert!(status.status.success(), "{status:?}");
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(
        status["revision"].as_i64(),
        Some(checkpoint.revision),
        "{status}"
    );

    let etcd = strata_tests::etcd::EtcdServer::start_restored(&file).await;
    let mut e = etcd_client::Client::connect([etcd.endpoint()], None)
        .await
        .unwrap();
    let at = etcd_client::GetOptions::new()
        .with_prefix()
        .with_revision(checkpoint.revision);
    let want = c.get("x/", Some(at.clone())).await.unwrap();
    let got = e
        .get("x/", Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .unwrap();
    let kvs = strata_tests::etcd::full_kvs;
    assert_eq!(kvs(&got).len(), 39, "40 put, one deleted");
    assert_eq!(kvs(&got), kvs(&want));
    assert_eq!(
        e.lease_time_to_live(lease, None)
            .await
            .unwrap()
            .granted_ttl(),
        LEASE_TTL
    );

    // Once a newer checkpoint holds a later write, the older one is still exported by its
    // index, the same file as before; one not retained is refused with those that are.
    c.put("x/after", "late", None).await.unwrap();
    let newer = wait_checkpoint(
        &served.catalog,
        served.client.read_index(SHARD).await.unwrap(),
        &served.log,
    )
    .await;
    assert!(newer > index);
    let named = served.deployment.dir().join("named.db");
    let idx = index.to_string();
    admin(&export(&["--index", &idx, "--to", named.to_str().unwrap()])).await;
    assert_eq!(
        std::fs::read(&named).unwrap(),
        std::fs::read(&file).unwrap()
    );
    let out = admin(&export(&["--to", named.to_str().unwrap()])).await;
    assert!(
        out.contains(&format!("exported checkpoint {newer} ")),
        "{out}"
    );
    let stderr = admin_refused(&export(&["--index", "1", "--to", named.to_str().unwrap()])).await;
    assert!(
        stderr.contains("no checkpoint at index 1; retained"),
        "{stderr}"
    );
}
