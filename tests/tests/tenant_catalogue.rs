//! The tenant catalogue and the admin API (docs/design/tenants.md, T1, T6; `--catalogue`,
//! `--admin-listen`, `strata admin tenant`), against real processes:
//! - through `strata dev` and the `strata admin tenant` command: create, duplicate create,
//!   bad names, get, list, update (a request rate enforced at once, for that tenant only; a
//!   lease quota enforced by the tenant's replicas once appended to its shard),
//!   suspend (every RPC but Status refused with FailedPrecondition), resume, delete
//!   (NotFound), undelete (the data is back), a restart that keeps all of it, and a name
//!   created again after a delete: a new tenant with none of the old one's keys;
//! - across frontends, the admin port under mutual TLS (no certificate, or another CA's, is
//!   refused): a tenant created through one frontend's admin port is served by another
//!   frontend that was running already, isolated from the default tenant, and still after the
//!   compactor trimmed the journal and that frontend was killed with `kill -9`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use api::etcdserverpb::{
    LeaseGrantRequest, LeaseKeepAliveRequest, PutRequest, RangeRequest, StatusRequest,
};
use strata_tests::certs::Ca;
use strata_tests::curl;
use strata_tests::deployment::{Deployment, DevDeployment, Setup, frontend_args};
use strata_tests::journal::first_index_of;
use strata_tests::process::{ChildGuard, free_port};
use strata_tests::readiness::{tail_file, wait_ready};
use strata_tests::tenant::{TenantClient, admin_as};
use tonic::Code;

const WAIT: Duration = Duration::from_secs(90);

/// `strata admin tenant <args> --endpoint <admin> --json`: the JSON printed, or the error text.
fn admin(endpoint: &str, args: &[&str]) -> Result<serde_json::Value, String> {
    admin_as(endpoint, &[], args)
}

async fn put(c: &mut TenantClient, key: &str, value: &str) -> Result<i64, tonic::Status> {
    let r =
        c.kv.put(PutRequest {
            key: key.into(),
            value: value.into(),
            ..Default::default()
        })
        .await?;
    Ok(r.into_inner().header.unwrap().revision)
}

async fn get(c: &mut TenantClient, key: &str) -> Result<Option<Vec<u8>>, tonic::Status> {
    let r =
        c.kv.range(RangeRequest {
            key: key.into(),
            ..Default::default()
        })
        .await?;
    Ok(r.into_inner().kvs.first().map(|kv| kv.value.clone()))
}

/// `get` once the frontend serves it (a restart, another frontend's catalogue change), within
/// `WAIT`; `log` says why not.
async fn get_eventually(
    c: &mut TenantClient,
    key: &str,
    log: impl Fn() -> String,
) -> Option<Vec<u8>> {
    let deadline = Instant::now() + WAIT;
    loop {
        match get(c, key).await {
            Ok(v) => return v,
            Err(e) => assert!(
                Instant::now() < deadline,
                "{} not served: {e:?}\n{}",
                c.tenant,
                log()
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Writes fresh keys to `c` until `done` holds, within `WAIT`: the journal moves on, so the
/// compactor has rounds to run. `what` and `log` say what never happened.
async fn write_until<F, Fut>(
    c: &mut TenantClient,
    what: &str,
    log: impl Fn() -> String,
    mut done: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + WAIT;
    let mut i = 0u64;
    while !done().await {
        assert!(Instant::now() < deadline, "{what}\n{}", log());
        put(c, &format!("filler/{i}"), "x").await.unwrap();
        i += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_command_drives_the_catalogue_of_strata_dev() {
    let mut dev = DevDeployment::start().await;
    let admin_at = dev.admin_endpoint().to_string();
    let endpoint = dev.endpoint().to_string();

    let created = admin(&admin_at, &["create", "team-a", "--watchers", "7"]).unwrap();
    assert_eq!(created["name"], "team-a");
    assert_eq!(created["state"], "active");
    assert_eq!(
        created["shard"], 0,
        "the first tenant goes to the lowest of the shards with the fewest"
    );
    assert_eq!(created["quotas"]["watchers"], 7);
    assert_eq!(created["uid"].as_str().unwrap().len(), 32);

    // Answered once this frontend serves it: the first request needs no retry.
    let mut a = TenantClient::connect(&endpoint, "team-a").await.unwrap();
    assert_eq!(
        put(&mut a, "k", "in-a").await.unwrap(),
        2,
        "a keyspace of its own"
    );
    let mut default = TenantClient::connect(&endpoint, "default").await.unwrap();
    assert_eq!(get(&mut default, "k").await.unwrap(), None);

    let dup = admin(&admin_at, &["create", "team-a"]).unwrap_err();
    assert!(
        dup.contains("strata: tenant team-a already exists"),
        "{dup}"
    );
    assert!(dup.contains("AlreadyExists"), "{dup}");
    let bad = admin(&admin_at, &["create", "Team_A"]).unwrap_err();
    assert!(bad.contains("is not a DNS label"), "{bad}");
    let missing = admin(&admin_at, &["get", "nobody"]).unwrap_err();
    assert!(
        missing.contains("strata: tenant nobody not found"),
        "{missing}"
    );
    admin(&admin_at, &["create", "team-b"]).unwrap();
    let list = admin(&admin_at, &["list"]).unwrap();
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["team-a", "team-b"]);
    let updated = admin(&admin_at, &["update", "team-a", "--leases", "10"]).unwrap();
    assert_eq!(updated["quotas"]["leases"], 10);
    assert_eq!(
        updated["quotas"]["watchers"], 0,
        "update replaces the quotas"
    );

    // Suspended: refused with FailedPrecondition (clients do not retry it for ever), but the
    // owner can still look at it. Streams open at the time end with the same error: a watch
    // delivers nothing more, a lease is kept alive no longer.
    let mut watching = a.watch_key("k", 0).await.unwrap();
    let lease = a.grant(60).await.unwrap();
    let (keep_tx, keep_rx) = futures::channel::mpsc::unbounded();
    keep_tx
        .unbounded_send(LeaseKeepAliveRequest { id: lease })
        .unwrap();
    let mut keeping = a
        .lease
        .lease_keep_alive(keep_rx)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(keeping.message().await.unwrap().unwrap().ttl, 60);
    let suspended = admin(&admin_at, &["suspend", "team-a"]).unwrap();
    assert_eq!(suspended["state"], "suspended");
    for (what, ended) in [
        (
            "watch",
            tokio::time::timeout(WAIT, watching.message())
                .await
                .map(|r| r.map(|_| ())),
        ),
        (
            "keep-alive",
            tokio::time::timeout(WAIT, keeping.message())
                .await
                .map(|r| r.map(|_| ())),
        ),
    ] {
        let e = ended
            .unwrap_or_else(|_| panic!("the {what} stream goes on after the suspension"))
            .expect_err("ended by the suspension");
        assert_eq!(e.code(), Code::FailedPrecondition, "{what}: {e:?}");
        assert_eq!(e.message(), "strata: tenant team-a is suspended", "{what}");
    }
    drop(keep_tx);
    let e = put(&mut a, "k", "x").await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert_eq!(e.message(), "strata: tenant team-a is suspended");
    assert_eq!(
        get(&mut a, "k").await.unwrap_err().code(),
        Code::FailedPrecondition
    );
    a.maintenance
        .status(StatusRequest {})
        .await
        .expect("Status of a suspended tenant");
    put(&mut default, "other", "served").await.unwrap();
    let resumed = admin(&admin_at, &["resume", "team-a"]).unwrap();
    assert_eq!(put(&mut a, "k2", "back").await.unwrap(), 3);

    // A change made for the record as it was before the resume (a suspend whose command gave
    // up, its append landing late) is refused and changes nothing; one for the record's
    // revision goes through.
    let (was, now) = (
        suspended["revision"].as_i64().unwrap(),
        resumed["revision"].as_i64().unwrap(),
    );
    let late = admin(
        &admin_at,
        &["suspend", "team-a", "--if-revision", &was.to_string()],
    )
    .unwrap_err();
    assert!(
        late.contains(&format!(
            "strata: tenant team-a changed since revision {was} (now at revision {now})"
        )) && late.contains("Aborted"),
        "{late}"
    );
    assert_eq!(
        admin(&admin_at, &["get", "team-a"]).unwrap()["state"],
        "active"
    );
    get(&mut a, "k2").await.expect("still served");
    let fresh = ["create", "team-c", "--if-revision", "0"];
    assert_eq!(admin(&admin_at, &fresh).unwrap()["state"], "active");
    let e = admin(&admin_at, &fresh).unwrap_err();
    assert!(e.contains("changed since revision 0"), "{e}");
    let delete_c = ["delete", "team-c", "--if-revision"];
    let c_at = admin(&admin_at, &["get", "team-c"]).unwrap()["revision"].to_string();
    assert_eq!(
        admin(&admin_at, &[&delete_c[..], &[c_at.as_str()]].concat()).unwrap()["state"],
        "deleted"
    );
    let e = admin(&admin_at, &["get", "team-a", "--if-revision", "1"]).unwrap_err();
    assert!(e.contains("--if-revision is for a change"), "{e}");

    // The catalogue's request rate is enforced at once, for that tenant only, with etcd's
    // code and message; set back to 0, the frontend's default (none here) applies again.
    let limit = [
        "update",
        "team-a",
        "--requests-per-second",
        "2",
        "--leases",
        "10",
    ];
    admin(&admin_at, &limit).unwrap();
    let started = Instant::now();
    let mut admitted = 0;
    for _ in 0..20 {
        match get(&mut a, "k").await {
            Ok(_) => admitted += 1,
            Err(e) => {
                assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
                assert_eq!(e.message(), "etcdserver: too many requests");
            }
        }
        get(&mut default, "k")
            .await
            .expect("the default tenant is not limited");
    }
    // A burst of 2, then 2 a second.
    let bound = 2.0 + 2.0 * started.elapsed().as_secs_f64() + 1.0;
    assert!(
        f64::from(admitted) <= bound,
        "{admitted} admitted, at most {bound}"
    );
    admin(&admin_at, &["update", "team-a", "--leases", "10"]).unwrap();
    for _ in 0..20 {
        get(&mut a, "k").await.expect("no rate limit any more");
    }

    // The lease quota changes state, so the tenant's replicas enforce it: the frontend appends
    // it to the tenant's shard after the catalogue change, and a grant over it is refused.
    admin(&admin_at, &["update", "team-a", "--leases", "1"]).unwrap();
    let grant = || LeaseGrantRequest { ttl: 60, id: 0 };
    let deadline = Instant::now() + WAIT;
    let refused = loop {
        match a.lease.lease_grant(grant()).await {
            Ok(_) => assert!(Instant::now() < deadline, "lease quota never enforced"),
            Err(e) => break e,
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert_eq!(refused.message(), "strata: lease quota of 1 reached");
    default
        .lease
        .lease_grant(grant())
        .await
        .expect("the default tenant has no lease quota");
    admin(&admin_at, &["update", "team-a", "--leases", "10"]).unwrap();
    let deadline = Instant::now() + WAIT;
    while let Err(e) = a.lease.lease_grant(grant()).await {
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        assert!(Instant::now() < deadline, "lease quota never raised");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Deleted: not served at all, not listed; undeleted with its data.
    assert_eq!(
        admin(&admin_at, &["delete", "team-a"]).unwrap()["state"],
        "deleted"
    );
    let e = get(&mut a, "k").await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    let list = admin(&admin_at, &["list"]).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 1);
    let all = admin(&admin_at, &["list", "--deleted"]).unwrap();
    assert_eq!(all.as_array().unwrap().len(), 3, "team-c deleted above");
    let e = admin(&admin_at, &["suspend", "team-a"]).unwrap_err();
    assert!(e.contains("strata: tenant team-a is deleted"), "{e}");
    assert_eq!(
        admin(&admin_at, &["undelete", "team-a"]).unwrap()["state"],
        "active"
    );
    assert_eq!(
        get(&mut a, "k").await.unwrap().as_deref(),
        Some(&b"in-a"[..])
    );

    // A restart keeps the catalogue and every tenant's keys.
    dev.restart().await;
    let mut a = TenantClient::connect(&endpoint, "team-a").await.unwrap();
    let v = get_eventually(&mut a, "k2", || dev.log_tail()).await;
    assert_eq!(v.as_deref(), Some(&b"back"[..]), "after a restart");
    let got = admin(&admin_at, &["get", "team-a"]).unwrap();
    assert_eq!(
        (got["state"].as_str(), got["quotas"]["leases"].as_i64()),
        (Some("active"), Some(10))
    );

    // Deleted and created again: another tenant under the same name (a new uid, an empty
    // keyspace from revision 1, no quotas), never the old one's data.
    admin(&admin_at, &["delete", "team-a"]).unwrap();
    let again = admin(&admin_at, &["create", "team-a"]).unwrap();
    assert_ne!(again["uid"], got["uid"]);
    assert_eq!(again["quotas"]["leases"], 0);
    assert_eq!(
        get(&mut a, "k2").await.unwrap(),
        None,
        "the old generation's key"
    );
    assert_eq!(put(&mut a, "k", "new").await.unwrap(), 2);
    let e = admin(&admin_at, &["undelete", "team-a"]).unwrap_err();
    assert!(e.contains("is not deleted"), "{e}");
}

/// Three journal nodes and one frontend serving the tenants of the catalogue, named by the
/// `x-strata-tenant` header.
async fn one_catalogue_frontend() -> Deployment {
    Deployment::start_with(
        1,
        Setup {
            frontend_extra: Box::new(|dir| {
                vec![
                    "--catalogue".into(),
                    "--trust-tenant-header".into(),
                    "--object-store".into(),
                    dir.join("objects").display().to_string(),
                ]
            }),
            ..Setup::default()
        },
    )
    .await
}

/// Another frontend of `d`'s journal, named `name`, with `extra` flags, logging to `log`;
/// ready when this returns, with its client endpoint.
async fn another_frontend(
    d: &Deployment,
    name: &str,
    extra: &[String],
    log: &std::path::Path,
) -> (ChildGuard, String) {
    let (listen, metrics) = (free_port(), free_port());
    let mut args = frontend_args(
        d.journal_addrs(),
        &format!("127.0.0.1:{listen}"),
        &format!("127.0.0.1:{metrics}"),
        &[],
    );
    args.extend(extra.iter().cloned());
    let child = ChildGuard::strata(name, &args, Some(log));
    let endpoint = format!("http://127.0.0.1:{listen}");
    wait_ready(&endpoint, WAIT)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", tail_file(log)));
    (child, endpoint)
}

/// A second frontend of `d`'s journal following the catalogue, for its admin port
/// (`admin_port`, with `extra` flags), logging to `log`; ready when this returns.
async fn admin_frontend(
    d: &Deployment,
    admin_port: u16,
    extra: &[String],
    log: &std::path::Path,
) -> ChildGuard {
    let mut args = vec![
        "--catalogue".into(),
        "--trust-tenant-header".into(),
        "--admin-listen".into(),
        format!("127.0.0.1:{admin_port}"),
    ];
    args.extend(extra.iter().cloned());
    another_frontend(d, "admin-frontend", &args, log).await.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_frontend_serves_what_the_catalogue_says_across_kill_and_trim() {
    let mut d = one_catalogue_frontend().await;
    // A second frontend, only for its admin port: mutual TLS, with an admin CA of its own.
    let certs = d.dir().join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    let ca = Ca::new();
    let ca_file = ca.write(&certs);
    let (server_cert, server_key) = ca.server(&["localhost"]).write(&certs, "admin-server");
    let (op_cert, op_key) = ca
        .client("operator", &["operator.example"])
        .write(&certs, "op");
    let (bad_cert, bad_key) = Ca::new()
        .client("operator", &["operator.example"])
        .write(&certs, "stranger");
    let path = |p: &std::path::Path| p.display().to_string();
    let (admin_port, admin_log) = (free_port(), d.dir().join("admin-frontend.log"));
    let tls_args = [
        "--admin-cert-file".into(),
        path(&server_cert),
        "--admin-key-file".into(),
        path(&server_key),
        "--admin-trusted-ca-file".into(),
        path(&ca_file),
    ];
    let _admin_frontend = admin_frontend(&d, admin_port, &tls_args, &admin_log).await;
    let admin_at = format!("https://localhost:{admin_port}");
    let tls = |cert: &std::path::Path, key: &std::path::Path| {
        vec![
            "--cacert".to_string(),
            path(&ca_file),
            "--cert".into(),
            path(cert),
            "--key".into(),
            path(key),
        ]
    };
    let operator = tls(&op_cert, &op_key);
    // No client certificate, or one of another CA: no admin API.
    let refused = admin_as(&admin_at, &["--cacert".into(), path(&ca_file)], &["list"]);
    assert!(refused.is_err(), "{refused:?}");
    let refused = admin_as(&admin_at, &tls(&bad_cert, &bad_key), &["list"]);
    assert!(refused.is_err(), "{refused:?}");
    // Nor over plain HTTP/2.
    let plain = admin(&format!("http://127.0.0.1:{admin_port}"), &["list"]);
    assert!(plain.is_err(), "{plain:?}");
    let admin = |args: &[&str]| admin_as(&admin_at, &operator, args);
    admin(&["create", "blue"]).unwrap();

    // The serving frontend learns of `blue` from the journal, with no restart; a request that
    // reaches it before it applied the create waits for it instead of getting NotFound, so
    // the first one succeeds (twice over: the create's answer raced the other frontend).
    let endpoint = d.frontend(0).endpoint();
    let mut blue = TenantClient::connect(&endpoint, "blue").await.unwrap();
    put(&mut blue, "k", "blue-1")
        .await
        .unwrap_or_else(|e| panic!("{e:?}\n{}", tail_file(d.frontend_log(0))));
    admin(&["create", "cyan"]).unwrap();
    let mut cyan = TenantClient::connect(&endpoint, "cyan").await.unwrap();
    assert_eq!(put(&mut cyan, "k", "cyan-1").await.unwrap(), 2);
    // A watch stream too (kube-apiserver opens watches as it starts).
    admin(&["create", "teal"]).unwrap();
    let mut teal = TenantClient::connect(&endpoint, "teal").await.unwrap();
    let mut events = teal
        .watch_key("k", 0)
        .await
        .unwrap_or_else(|e| panic!("{e:?}\n{}", tail_file(d.frontend_log(0))));
    put(&mut teal, "k", "teal-1").await.unwrap();
    let event = tokio::time::timeout(WAIT, events.message())
        .await
        .expect("an event")
        .unwrap()
        .unwrap();
    assert_eq!(event.events[0].kv.as_ref().unwrap().value, b"teal-1");
    let mut default = TenantClient::connect(&endpoint, "default").await.unwrap();
    assert_eq!(get(&mut default, "k").await.unwrap(), None);
    let stranger = TenantClient::connect(&endpoint, "green").await.unwrap();
    let mut stranger = stranger;
    assert_eq!(
        get(&mut stranger, "k").await.unwrap_err().code(),
        Code::NotFound
    );

    // The compactor checkpoints `blue` and the catalogue and trims shard 0 below them.
    let _compactor =
        d.start_compactor(&["--every-entries", "20", "--every", "1s", "--trim-lag", "0"]);
    let compactor_log = || tail_file(&d.dir().join("compactor.log"));
    let journal = d.journal_addrs()[0].clone();
    write_until(
        &mut blue,
        "journal never trimmed",
        compactor_log,
        || async { first_index_of(&journal, 0).await > 1 },
    )
    .await;
    let suspended = admin(&["suspend", "blue"]).unwrap();
    assert_eq!(suspended["state"], "suspended");

    // kill -9 and restart: the catalogue and `blue` come back from their checkpoints, `blue`
    // still suspended; resumed, it has its keys.
    d.kill_frontend(0);
    d.restart_frontend(0).await;
    let log = std::fs::read_to_string(d.frontend_log(0)).unwrap();
    assert!(
        log.lines()
            .any(|l| l.contains("starting from checkpoint") && l.contains("tenant=_system ")),
        "the catalogue did not start from its checkpoint:\n{}",
        tail_file(d.frontend_log(0))
    );
    // Ready only once the catalogue's tenants are loaded: the first request after that is
    // answered as the catalogue says, never NotFound (which clients would not retry).
    strata_tests::readiness::wait_readyz_while(&d.frontend(0).metrics, WAIT, || Ok(()))
        .await
        .unwrap_or_else(|e| panic!("never ready: {e}\n{}", tail_file(d.frontend_log(0))));
    let mut blue = TenantClient::connect(&endpoint, "blue").await.unwrap();
    let e = get(&mut blue, "k").await.unwrap_err();
    assert_eq!(
        e.code(),
        Code::FailedPrecondition,
        "blue not back as suspended: {e:?}"
    );
    admin(&["resume", "blue"]).unwrap();
    let v = get_eventually(&mut blue, "k", || tail_file(d.frontend_log(0))).await;
    assert_eq!(v.as_deref(), Some(&b"blue-1"[..]), "after resume");
}

/// Files under `dir`, recursively (none if it does not exist).
fn files_under(dir: &std::path::Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| {
            let p = e.path();
            if p.is_dir() { files_under(&p) } else { 1 }
        })
        .sum()
}

/// T7 end to end: a deleted tenant can be undeleted within its retention; past it the
/// compactor purges its checkpoints and the journal is trimmed without it, while its
/// neighbour keeps everything; an older generation of a name created again is purged at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_compactor_purges_what_the_catalogue_is_done_with() {
    let admin_port = free_port();
    let mut d = Deployment::start_with(
        1,
        Setup {
            frontend_extra: Box::new(move |dir| {
                vec![
                    "--catalogue".into(),
                    "--trust-tenant-header".into(),
                    "--object-store".into(),
                    dir.join("objects").display().to_string(),
                    "--admin-listen".into(),
                    format!("127.0.0.1:{admin_port}"),
                    "--deleted-tenant-retention".into(),
                    "3s".into(),
                ]
            }),
            ..Setup::default()
        },
    )
    .await;
    let admin_at = format!("http://127.0.0.1:{admin_port}");
    let endpoint = d.frontend(0).endpoint();
    let _compactor = d.start_compactor(&[
        "--every-entries",
        "10",
        "--every",
        "1s",
        "--trim-lag",
        "0",
        "--catalogue-every",
        "1s",
    ]);
    let folder = |r: &serde_json::Value| {
        let uid = r["uid"].as_str().unwrap();
        d.objects()
            .join("tenants")
            .join(format!("{}.{}", r["name"].as_str().unwrap(), &uid[..16]))
    };
    let gone = admin(&admin_at, &["create", "gone"]).unwrap();
    let kept = admin(&admin_at, &["create", "kept"]).unwrap();
    let twice = admin(&admin_at, &["create", "twice"]).unwrap();
    let mut clients = Vec::new();
    for t in ["gone", "kept", "twice"] {
        let mut c = TenantClient::connect(&endpoint, t).await.unwrap();
        put(&mut c, "k", t).await.unwrap();
        clients.push(c);
    }
    let [mut c_gone, mut c_kept, _] = <[TenantClient; 3]>::try_from(clients).ok().unwrap();
    // Every tenant checkpointed.
    let compactor_log = || tail_file(&d.dir().join("compactor.log"));
    write_until(&mut c_kept, "never checkpointed", compactor_log, || {
        std::future::ready(
            [&gone, &kept, &twice]
                .iter()
                .all(|r| files_under(&folder(r)) > 0),
        )
    })
    .await;

    // Within the retention an undelete brings the data back.
    admin(&admin_at, &["delete", "gone"]).unwrap();
    admin(&admin_at, &["undelete", "gone"]).unwrap();
    assert_eq!(
        get_eventually(&mut c_gone, "k", || tail_file(d.frontend_log(0))).await,
        Some(b"gone".to_vec())
    );
    // Created again within its retention: the older generation is purged at once.
    admin(&admin_at, &["delete", "twice"]).unwrap();
    let twice_again = admin(&admin_at, &["create", "twice"]).unwrap();
    assert_ne!(folder(&twice), folder(&twice_again));
    // Past the retention: purged, never undeleted.
    let deleted = admin(&admin_at, &["delete", "gone"]).unwrap();
    assert_eq!(deleted["retention_ms"], 3000);
    // Writes move the journal on, so the catalogue is checkpointed with a later time.
    write_until(&mut c_kept, "never purged", compactor_log, || {
        std::future::ready(files_under(&folder(&gone)) + files_under(&folder(&twice)) == 0)
    })
    .await;
    let e = admin(&admin_at, &["undelete", "gone"]).unwrap_err();
    assert!(e.contains("strata: tenant gone is purged"), "{e}");
    let log = std::fs::read_to_string(d.dir().join("compactor.log")).unwrap();
    assert_eq!(log.matches("tenant purged").count(), 2, "{log}");

    // The neighbour keeps its keys and checkpoints, and the journal is trimmed past the purged
    // tenants' entries (nothing of theirs holds it).
    assert!(files_under(&folder(&kept)) > 0);
    assert_eq!(get(&mut c_kept, "k").await.unwrap(), Some(b"kept".to_vec()));
    let journal = d.journal_addrs()[0].clone();
    let purged_at = first_index_of(&journal, 0).await;
    write_until(
        &mut c_kept,
        "journal not trimmed after the purge",
        compactor_log,
        || async { first_index_of(&journal, 0).await > purged_at },
    )
    .await;
    // A frontend restarted after all this serves the neighbour and the new generation.
    d.kill_frontend(0);
    d.restart_frontend(0).await;
    let mut c_kept = TenantClient::connect(&endpoint, "kept").await.unwrap();
    let v = get_eventually(&mut c_kept, "k", || tail_file(d.frontend_log(0))).await;
    assert_eq!(v, Some(b"kept".to_vec()));
    let mut c_twice = TenantClient::connect(&endpoint, "twice").await.unwrap();
    assert_eq!(
        get_eventually(&mut c_twice, "k", || tail_file(d.frontend_log(0))).await,
        None
    );
}

/// `strata dev --tls` and `strata dev cert`: etcdctl, which cannot set a header, reaches a
/// tenant of the catalogue with a client certificate naming it, and the default tenant with
/// none; the deployment's CA is kept, so a certificate issued before a restart still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_reaches_a_catalogue_tenant_of_strata_dev_tls_by_certificate() {
    let mut dev = DevDeployment::start_with(&["--tls".to_string()]).await;
    let admin_at = dev.admin_endpoint().to_string();
    let data = dev.dir().join("data");
    let tls_dir = data.join("tls");
    admin(&admin_at, &["create", "team-a"]).unwrap();
    let out = std::process::Command::new(strata_tests::process::strata_bin())
        .args(["dev", "cert", "team-a", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    let files: Vec<&str> = printed.lines().collect();
    assert_eq!(
        files,
        [
            tls_dir.join("team-a.pem").display().to_string(),
            tls_dir.join("team-a.key").display().to_string()
        ]
    );
    let etcdctl = strata_tests::etcdctl::Etcdctl::new(dev.endpoint());
    let ca = format!("--cacert={}", tls_dir.join("ca.pem").display());
    let as_team_a = |args: &[&str]| {
        let mut all = vec![
            ca.clone(),
            format!("--cert={}", files[0]),
            format!("--key={}", files[1]),
        ];
        all.extend(args.iter().map(|a| a.to_string()));
        etcdctl.ok(&all.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let as_default = |args: &[&str]| {
        let mut all = vec![ca.as_str()];
        all.extend_from_slice(args);
        etcdctl.ok(&all)
    };
    as_team_a(&["put", "greeting", "hi from a"]);
    as_default(&["put", "greeting", "hello"]);
    assert_eq!(
        as_team_a(&["get", "greeting", "--print-value-only"]).trim(),
        "hi from a"
    );
    assert_eq!(
        as_default(&["get", "greeting", "--print-value-only"]).trim(),
        "hello"
    );
    // Its own revisions: team-a's first put was its revision 2, whatever the default's.
    let status = as_team_a(&["get", "greeting", "-w", "json"]);
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["kvs"][0]["create_revision"], 2, "{status}");
    // Plain text to the TLS port is not served.
    let plain = strata_tests::etcdctl::Etcdctl::new(&dev.endpoint().replace("https", "http"))
        .run(&["get", "greeting"]);
    assert!(!plain.success, "served over plain text: {}", plain.stdout);

    // Inside, the journal is served over mutual TLS with a CA of its own: a plaintext client
    // and a tenant's certificate are refused, the deployment's internal certificate is served,
    // and the compactor (which read team-a's creation) reads the journal over it.
    let journal_at = dev
        .log()
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("journal-1")
                .map(|a| a.trim().to_string())
        })
        .expect("strata dev prints journal-1's address");
    let internal = tls_dir.join("internal");
    // A journal client of journal-1 with the certificate and key `tls` (none: plaintext).
    let client = |tls: Option<(PathBuf, PathBuf)>| {
        let journal_at = journal_at.clone();
        let ca = internal.join("ca.pem");
        async move {
            let files = tls.map(|(cert, key)| journal::tls::TlsFiles {
                ca,
                cert,
                key,
                crl: None,
            });
            let tls = journal::tls::load_if(files).unwrap();
            journal::JournalClient::connect_over(std::slice::from_ref(&journal_at), tls)
                .await
                .unwrap()
        }
    };
    let status = |tls| {
        let (client, journal_at) = (client(tls), journal_at.clone());
        async move { client.await.status_of(&journal_at, 0).await }
    };
    assert!(
        status(None).await.is_err(),
        "the journal is served over plain text"
    );
    let tenant_cert = (PathBuf::from(files[0]), PathBuf::from(files[1]));
    assert!(
        status(Some(tenant_cert)).await.is_err(),
        "a tenant's certificate reaches the journal"
    );
    let internal_files = |stem: &str| {
        Some((
            internal.join(format!("{stem}.pem")),
            internal.join(format!("{stem}.key")),
        ))
    };
    status(internal_files("server"))
        .await
        .expect("the internal certificate is served");
    // Trim answers the compactor's certificate (valid for strata-compactor), not the
    // frontend's. (Below index 1: nothing is trimmed.)
    let trim_as = |stem: &str| {
        let client = client(internal_files(stem));
        async move { client.await.trim(0, 1).await.map_err(|e| e.to_string()) }
    };
    let refused = trim_as("client").await.unwrap_err();
    assert!(refused.contains("answers only the compactor"), "{refused}");
    trim_as("compactor")
        .await
        .expect("the compactor's certificate trims");
    let compactor_log = data.join("logs/compactor.log");
    let deadline = Instant::now() + WAIT;
    while !std::fs::read_to_string(&compactor_log)
        .unwrap_or_default()
        .lines()
        .any(|l| l.contains("new tenant on shard") && l.contains("team-a"))
    {
        assert!(
            Instant::now() < deadline,
            "the compactor never read team-a's creation\n{}",
            tail_file(&compactor_log)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Restarted: the same CA, so the certificate issued before still names team-a.
    dev.restart().await;
    assert_eq!(
        as_team_a(&["get", "greeting", "--print-value-only"]).trim(),
        "hi from a"
    );
    // A tenant suspended is refused to etcdctl as to any client.
    admin(&admin_at, &["suspend", "team-a"]).unwrap();
    let mut all = vec![
        ca.clone(),
        format!("--cert={}", files[0]),
        format!("--key={}", files[1]),
    ];
    all.extend(["get", "greeting"].map(String::from));
    let refused = etcdctl.fails(&all.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(
        refused.contains("strata: tenant team-a is suspended"),
        "{refused}"
    );
}

/// Whether the frontend's log says it unloaded tenant `name` while idle.
fn unloaded(frontend_log: &std::path::Path, name: &str) -> bool {
    std::fs::read_to_string(frontend_log)
        .unwrap_or_default()
        .lines()
        .any(|l| l.contains("tenant idle: unloaded") && l.contains(&format!("tenant={name} ")))
}

/// Waits until the frontend's log says each of `names` was unloaded while idle.
async fn until_unloaded(frontend_log: &std::path::Path, names: &[&str]) {
    let deadline = Instant::now() + WAIT;
    while !names.iter().all(|n| unloaded(frontend_log, n)) {
        assert!(
            Instant::now() < deadline,
            "not every one of {names:?} was unloaded\n{}",
            tail_file(frontend_log)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `--tenant-idle-unload`: a tenant no request named for that long, with no stream open, is
/// unloaded; the next request naming it waits for it to be loaded again and finds its keys. A
/// tenant with a watch open is never idle, and its watch goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_tenant_is_unloaded_and_the_next_request_loads_it_again() {
    let dev =
        DevDeployment::start_with(&["--frontend-arg=--tenant-idle-unload=2s".to_string()]).await;
    let (admin_at, endpoint) = (dev.admin_endpoint().to_string(), dev.endpoint().to_string());
    let frontend_log = dev.dir().join("data/logs/frontend.log");
    admin(&admin_at, &["create", "sleepy"]).unwrap();
    admin(&admin_at, &["create", "watched"]).unwrap();
    let mut sleepy = TenantClient::connect(&endpoint, "sleepy").await.unwrap();
    put(&mut sleepy, "k", "kept").await.unwrap();
    let mut watched = TenantClient::connect(&endpoint, "watched").await.unwrap();
    let mut events = watched.watch_key("w", 0).await.unwrap();

    until_unloaded(&frontend_log, &["sleepy"]).await;
    assert!(
        curl::has_metric(
            dev.metrics_addr(),
            "strata_frontend_tenants_unloaded_idle_total "
        ),
        "no idle-unload counter"
    );
    // The first request after it is served, with the keys it had: it waited for the load.
    assert_eq!(
        get(&mut sleepy, "k").await.unwrap().as_deref(),
        Some(&b"kept"[..])
    );
    assert!(
        std::fs::read_to_string(&frontend_log)
            .unwrap()
            .contains("idle tenant loaded again for a request"),
        "{}",
        tail_file(&frontend_log)
    );
    // Its revisions go on from where they were.
    assert_eq!(put(&mut sleepy, "k2", "more").await.unwrap(), 3);

    // `watched` had its watch open all along: never unloaded, and the watch still delivers.
    assert!(
        !unloaded(&frontend_log, "watched"),
        "a tenant with an open watch was unloaded"
    );
    put(&mut watched, "w", "seen").await.unwrap();
    let event = tokio::time::timeout(WAIT, events.message())
        .await
        .expect("an event")
        .unwrap()
        .unwrap();
    assert_eq!(event.events[0].kv.as_ref().unwrap().value, b"seen");
}

/// Every RPC that names an unloaded tenant wakes it and waits for the load, as KV and Watch
/// do: Maintenance (Status, HashKV, Alarm), Cluster (MemberList), Lease (Leases, TimeToLive),
/// Auth (Authenticate) and the `/health` of one tenant. Each tenant here is first named, after
/// its unload, by one of them: each must be answered, not refused as loading (Unavailable,
/// which etcd's clients do not retry for every RPC).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_naming_an_idle_tenant_waits_for_its_load() {
    use api::etcdserverpb::{
        AlarmRequest, AuthEnableRequest, AuthUserAddRequest, AuthUserGrantRoleRequest,
        AuthenticateRequest, HashKvRequest, LeaseLeasesRequest, LeaseTimeToLiveRequest,
        MemberListRequest, StatusRequest,
    };
    let dev =
        DevDeployment::start_with(&["--frontend-arg=--tenant-idle-unload=1s".to_string()]).await;
    let (admin_at, endpoint) = (dev.admin_endpoint().to_string(), dev.endpoint().to_string());
    let frontend_log = dev.dir().join("data/logs/frontend.log");
    let names = [
        "status", "hashkv", "alarm", "members", "leases", "ttl", "auth", "health",
    ];
    let mut clients = std::collections::BTreeMap::new();
    for name in names {
        admin(&admin_at, &["create", name]).unwrap();
        let mut c = TenantClient::connect(&endpoint, name).await.unwrap();
        put(&mut c, "k", name).await.unwrap();
        clients.insert(name, c);
    }
    let lease = clients.get_mut("ttl").unwrap().grant(3600).await.unwrap();
    let leased = clients
        .get_mut("leases")
        .unwrap()
        .grant(3600)
        .await
        .unwrap();
    let auth = &mut clients.get_mut("auth").unwrap().auth;
    let user = AuthUserAddRequest {
        name: "root".into(),
        password: "secret".into(),
        ..Default::default()
    };
    auth.user_add(user).await.unwrap();
    let grant = AuthUserGrantRoleRequest {
        user: "root".into(),
        role: "root".into(),
    };
    auth.user_grant_role(grant).await.unwrap();
    auth.auth_enable(AuthEnableRequest {}).await.unwrap();

    until_unloaded(&frontend_log, &names).await;

    let c = |name: &str| clients[name].clone();
    let status = c("status").maintenance.status(StatusRequest {}).await;
    assert!(status.unwrap().into_inner().header.unwrap().revision >= 2);
    let hash = c("hashkv")
        .maintenance
        .hash_kv(HashKvRequest { revision: 0 })
        .await;
    assert_ne!(hash.unwrap().into_inner().hash, 0);
    let alarms = c("alarm").maintenance.alarm(AlarmRequest::default()).await;
    assert!(alarms.unwrap().into_inner().alarms.is_empty());
    let members = c("members")
        .cluster
        .member_list(MemberListRequest::default())
        .await;
    assert_eq!(members.unwrap().into_inner().members.len(), 1);
    let leases = c("leases").lease.lease_leases(LeaseLeasesRequest {}).await;
    let ids: Vec<i64> = leases
        .unwrap()
        .into_inner()
        .leases
        .iter()
        .map(|l| l.id)
        .collect();
    assert_eq!(ids, vec![leased]);
    let ttl = LeaseTimeToLiveRequest {
        id: lease,
        keys: false,
    };
    let ttl = c("ttl").lease.lease_time_to_live(ttl).await.unwrap();
    assert!(ttl.into_inner().ttl > 3000);
    let login = AuthenticateRequest {
        name: "root".into(),
        password: "secret".into(),
    };
    let token = c("auth").auth.authenticate(login).await.unwrap();
    assert!(!token.into_inner().token.is_empty());
    let metrics = format!("http://{}", dev.metrics_addr());
    let (code, health) = curl::get_with(&metrics, "/health", &[("x-strata-tenant", "health")]);
    assert_eq!(code, 200, "{health}");
    assert!(health.contains(r#""health":"true""#), "{health}");

    // Each was loaded again for the request that named it.
    let log = std::fs::read_to_string(&frontend_log).unwrap();
    for name in names {
        assert!(
            log.lines()
                .any(|l| l.contains("idle tenant loaded again for a request")
                    && l.contains(&format!("tenant={name}"))),
            "{name} was not loaded again\n{}",
            tail_file(&frontend_log)
        );
    }
}

/// `--memory-budget`: over it, the least recently used idle tenant is unloaded (and only as
/// many as bring the loaded bytes under it); the next request naming it finds its keys. After
/// a restart, the tenants beyond the budget are served unloaded until a request names one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_memory_budget_the_least_recently_used_tenants_are_unloaded() {
    const VALUE: usize = 100_000;
    let mut dev = DevDeployment::start_with(&[
        "--frontend-arg=--memory-budget=250KB".to_string(),
        // Only the budget unloads here.
        "--frontend-arg=--tenant-idle-unload=0s".to_string(),
    ])
    .await;
    let (admin_at, endpoint) = (dev.admin_endpoint().to_string(), dev.endpoint().to_string());
    let frontend_log = dev.dir().join("data/logs/frontend.log");
    let lines_with = |needle: &str| -> Vec<String> {
        std::fs::read_to_string(&frontend_log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_string)
            .collect()
    };
    let unloaded = |name: &str| {
        lines_with("over the memory budget: unloaded")
            .iter()
            .filter(|l| l.contains(&format!("tenant={name} ")))
            .count()
    };
    let names = ["t1", "t2", "t3", "t4", "t5", "t6"];
    let mut clients = Vec::new();
    for name in names {
        admin(&admin_at, &["create", name]).unwrap();
        let mut c = TenantClient::connect(&endpoint, name).await.unwrap();
        put(&mut c, "k", &name.repeat(VALUE / 2)).await.unwrap();
        clients.push(c);
        // One after the other: t1 is the least recently used.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // 600 KB loaded against a 250 KB budget: the four least recently used go, t1 first, and
    // t5 and t6 stay (500 KB would still be over; 200 KB is under).
    let deadline = Instant::now() + WAIT;
    while unloaded("t4") == 0 {
        assert!(
            Instant::now() < deadline,
            "nothing unloaded\n{}",
            tail_file(&frontend_log)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    for name in ["t1", "t2", "t3", "t4"] {
        assert_eq!(unloaded(name), 1, "{name}\n{}", tail_file(&frontend_log));
    }
    assert_eq!(unloaded("t5") + unloaded("t6"), 0, "more than needed went");
    let order: Vec<String> = lines_with("over the memory budget: unloaded");
    assert!(
        order[0].contains("tenant=t1 "),
        "the least recently used first: {order:?}"
    );
    assert!(curl::has_metric(
        dev.metrics_addr(),
        "strata_frontend_tenants_unloaded_budget_total "
    ));
    assert!(curl::has_metric(
        dev.metrics_addr(),
        "strata_frontend_tenants_loaded_bytes "
    ));
    // Named again: loaded for the request, with its keys and revisions.
    assert_eq!(
        get(&mut clients[0], "k").await.unwrap(),
        Some("t1".repeat(VALUE / 2).into_bytes())
    );
    assert_eq!(put(&mut clients[0], "k2", "more").await.unwrap(), 3);

    // Restarted: the first tenants loaded fill the budget, the rest are served unloaded
    // until a request names one.
    drop(clients);
    dev.restart().await;
    let deadline = Instant::now() + WAIT;
    while lines_with("memory budget full: tenant served unloaded").is_empty() {
        assert!(
            Instant::now() < deadline,
            "every tenant loaded at start\n{}",
            tail_file(&frontend_log)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for name in names {
        let mut c = TenantClient::connect(&endpoint, name).await.unwrap();
        assert_eq!(
            get(&mut c, "k").await.unwrap(),
            Some(name.repeat(VALUE / 2).into_bytes()),
            "{name}"
        );
    }
}

/// `--catalogue-shards all`: one frontend serves the tenants of every shard, each tenant's
/// writes journalled on the shard the catalogue placed it on (the others only tick). A
/// frontend given `--catalogue-shards 1` serves the tenant of shard 1 alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_frontend_serves_the_tenants_of_every_shard() {
    let admin_port = free_port();
    let catalogue = move |shards: &str| -> Vec<String> {
        [
            "--catalogue",
            "--trust-tenant-header",
            "--shards",
            "4",
            "--catalogue-shards",
            shards,
        ]
        .map(String::from)
        .to_vec()
    };
    let d = Deployment::start_with(
        1,
        Setup {
            frontend_extra: Box::new(move |_| {
                let mut args = catalogue("all");
                args.extend(["--admin-listen".into(), format!("127.0.0.1:{admin_port}")]);
                args
            }),
            ..Setup::default()
        },
    )
    .await;
    let admin_at = format!("http://127.0.0.1:{admin_port}");
    let tenants = ["t0", "t1", "t2", "t3"];
    for (i, t) in tenants.iter().enumerate() {
        let created = admin(&admin_at, &["create", t]).unwrap();
        assert_eq!(
            created["shard"], i,
            "placed on the shard with the fewest tenants"
        );
    }
    let journal = journal::client::JournalClient::connect(d.journal_addrs())
        .await
        .unwrap();
    // The highest committed index any node reports: what one node says may lag (a follower
    // answering after the leader did made a shard seem to shrink).
    let committed = || async {
        let mut all = Vec::new();
        for shard in 0..4 {
            let mut highest = 0;
            for addr in d.journal_addrs() {
                if let Ok(st) = journal.status_of(addr, shard).await {
                    highest = highest.max(st.committed_index);
                }
            }
            all.push(highest);
        }
        all
    };
    let endpoint = d.frontend(0).endpoint();
    const PUTS: u64 = 40;
    for (i, t) in tenants.iter().enumerate() {
        let mut c = TenantClient::connect(&endpoint, t).await.unwrap();
        let before = committed().await;
        for k in 0..PUTS {
            let revision = put(&mut c, &format!("k{k}"), t).await.unwrap();
            assert_eq!(revision, k as i64 + 2, "{t}: a keyspace of its own");
        }
        let after = committed().await;
        for shard in 0..4 {
            let grew = after[shard] - before[shard];
            if shard == i {
                assert!(grew >= PUTS, "{t}'s shard {shard} grew by {grew}");
            } else {
                assert!(grew < PUTS, "shard {shard} grew by {grew} while {t} wrote");
            }
        }
    }

    // A frontend of shard 1's tenants alone.
    let log = d.dir().join("shard-1-frontend.log");
    let (_shard_1, endpoint) =
        another_frontend(&d, "shard-1-frontend", &catalogue("1"), &log).await;
    let mut t1 = TenantClient::connect(&endpoint, "t1").await.unwrap();
    assert_eq!(
        get_eventually(&mut t1, "k0", || tail_file(&log))
            .await
            .as_deref(),
        Some(&b"t1"[..])
    );
    let mut t0 = TenantClient::connect(&endpoint, "t0").await.unwrap();
    let e = get(&mut t0, "k0").await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
}

/// A request naming a tenant this frontend does not know, while the journal has no quorum:
/// whether the tenant exists cannot be learned, so the answer is the outage's (Unavailable,
/// which etcd clients retry), not NotFound (which they do not, and which a kube-apiserver
/// would report as a missing cluster). Found by the fault suite's review.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_tenant_during_a_journal_outage_is_unavailable_not_not_found() {
    let mut d = one_catalogue_frontend().await;
    let mut c = TenantClient::connect(&d.frontend(0).endpoint(), "nobody")
        .await
        .unwrap();
    let e = get(&mut c, "k").await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "the journal up: {e}");

    d.kill_journal(0);
    d.kill_journal(1);
    // A surviving leader answers read indexes from its lease for up to a second more (no
    // other leader can be elected meanwhile: docs/journal.md), so NotFound is still right
    // until it notices; then Unavailable, and nothing else.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let e = get(&mut c, "k").await.unwrap_err();
        match e.code() {
            Code::Unavailable => break,
            Code::NotFound if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            _ => panic!("the journal without quorum: {e}"),
        }
    }

    d.restart_journal(0);
    d.restart_journal(1);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match get(&mut c, "k").await {
            Err(e) if e.code() == Code::NotFound => break,
            other => assert!(
                Instant::now() < deadline,
                "the journal back, still not NotFound: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A suspension is strict for writes once its admin call answered, even on a frontend that
/// could not follow the catalogue meanwhile: frontend 0 is paused (SIGSTOP) while another
/// frontend's admin port suspends the tenant, and writes are queued to it; once it runs again
/// none of them is applied (each refused as suspended, at its edge or where the tenant's
/// replicas apply it). Resumed, it writes again, and the data is what it was before the
/// suspension. (Which of the two refuses here depends on what the woken frontend reads first;
/// `frontend::admin`'s unit test holds a frontend's catalogue back for certain.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_queued_to_a_paused_frontend_are_refused_after_the_suspension_answered() {
    let d = one_catalogue_frontend().await;
    let (admin_port, admin_log) = (free_port(), d.dir().join("admin-frontend.log"));
    let _admin_frontend = admin_frontend(&d, admin_port, &[], &admin_log).await;
    let admin_at = format!("http://127.0.0.1:{admin_port}");
    admin(&admin_at, &["create", "amber"]).unwrap();
    let endpoint = d.frontend(0).endpoint();
    let mut amber = TenantClient::connect(&endpoint, "amber").await.unwrap();
    put(&mut amber, "k", "before")
        .await
        .unwrap_or_else(|e| panic!("{e:?}\n{}", tail_file(d.frontend_log(0))));

    let pid = d.frontend_pid(0).expect("frontend 0 runs");
    strata_tests::deployment::pause_process(pid);
    let suspended = admin(&admin_at, &["suspend", "amber"]);
    let writes: Vec<_> = (0..16)
        .map(|i| {
            let mut c = amber.clone();
            tokio::spawn(async move { put(&mut c, &format!("w{i}"), "during").await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    strata_tests::deployment::resume_process(pid);
    assert_eq!(
        suspended.unwrap()["state"],
        "suspended",
        "{}",
        tail_file(&admin_log)
    );
    for w in writes {
        let refused = w.await.unwrap().unwrap_err();
        assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
        assert!(
            refused.message().contains("amber is suspended"),
            "{refused:?}"
        );
    }

    admin(&admin_at, &["resume", "amber"]).unwrap();
    let deadline = Instant::now() + WAIT;
    while let Err(e) = put(&mut amber, "after", "resumed").await {
        assert!(
            Instant::now() < deadline,
            "never writable again: {e:?}\n{}",
            tail_file(d.frontend_log(0))
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(get(&mut amber, "k").await.unwrap().unwrap(), b"before");
    for i in 0..16 {
        assert_eq!(get(&mut amber, &format!("w{i}")).await.unwrap(), None);
    }
}
