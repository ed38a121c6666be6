//! One frontend process serving several tenants of one shard (`--tenants`,
//! `--trust-tenant-header`; docs/design/tenants.md, T4's first step): the same keys written in
//! each never cross in ranges, revisions, watches, leases, HashKV or auth tokens; a `kill -9`
//! and restart loads every tenant from its own checkpoint after the compactor trimmed the
//! journal; and a request that names no tenant, or one not served, is refused.

use std::time::{Duration, Instant};

use api::etcdserverpb::watch_request::RequestUnion;
use api::etcdserverpb::{
    AuthEnableRequest, AuthRoleAddRequest, AuthUserAddRequest, AuthUserGrantRoleRequest,
    AuthenticateRequest, DeleteRangeRequest, HashKvRequest, LeaseGrantRequest, LeaseRevokeRequest,
    LeaseTimeToLiveRequest, PutRequest, RangeRequest, RangeResponse, WatchCreateRequest,
    WatchRequest,
};
use api::mvccpb::KeyValue;
use futures::StreamExt;
use strata_tests::deployment::{Deployment, Setup, frontend_args};
use strata_tests::journal::first_index_of;
use strata_tests::process::{ChildGuard, free_port};
use strata_tests::readiness::tail_file;
use strata_tests::tenant::TenantClient;
use tonic::Code;

const WAIT: Duration = Duration::from_secs(90);

/// A deployment whose one frontend serves the default tenant and `a` and `b`, loading them from
/// checkpoints the compactor writes.
async fn deployment() -> Deployment {
    Deployment::start_with(
        1,
        Setup {
            frontend_extra: Box::new(|dir| {
                vec![
                    "--tenants".into(),
                    "a,b".into(),
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

async fn put(c: &mut TenantClient, key: &str, value: &str, lease: i64) -> i64 {
    c.kv.put(PutRequest {
        key: key.into(),
        value: value.into(),
        lease,
        ..Default::default()
    })
    .await
    .unwrap_or_else(|e| panic!("put {key} in {}: {e}", c.tenant))
    .into_inner()
    .header
    .unwrap()
    .revision
}

async fn get(c: &mut TenantClient, key: &str) -> RangeResponse {
    c.kv.range(RangeRequest {
        key: key.into(),
        ..Default::default()
    })
    .await
    .unwrap_or_else(|e| panic!("get {key} in {}: {e}", c.tenant))
    .into_inner()
}

/// Every key of the tenant, with the revision of the answer.
async fn all(c: &mut TenantClient) -> (i64, Vec<KeyValue>) {
    let r =
        c.kv.range(RangeRequest {
            key: vec![0],
            range_end: vec![0],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    (r.header.unwrap().revision, r.kvs)
}

/// A linearizable read of one key, answered or refused.
async fn get_probe(c: &mut TenantClient) -> Result<RangeResponse, tonic::Status> {
    c.kv.range(RangeRequest {
        key: b"probe".to_vec(),
        ..Default::default()
    })
    .await
    .map(tonic::Response::into_inner)
}

async fn hash_kv(c: &mut TenantClient) -> u32 {
    c.maintenance
        .hash_kv(HashKvRequest { revision: 0 })
        .await
        .unwrap()
        .into_inner()
        .hash
}

/// Opens a watch of `key` in `c`'s tenant from `start_revision` and answers the stream once
/// the watch is created.
async fn watch(
    c: &mut TenantClient,
    key: &str,
    start_revision: i64,
) -> tonic::Streaming<api::etcdserverpb::WatchResponse> {
    c.watch_key(key, start_revision)
        .await
        .unwrap_or_else(|e| panic!("watch {key} in {}: {e:?}", c.tenant))
}

/// The values of the next `n` events a watch delivers (waiting at most 10 s for each).
async fn next_values(
    events: &mut tonic::Streaming<api::etcdserverpb::WatchResponse>,
    n: usize,
) -> Vec<String> {
    let mut values = Vec::new();
    while values.len() < n {
        let r = tokio::time::timeout(Duration::from_secs(10), events.message())
            .await
            .expect("an event within 10 s")
            .unwrap()
            .expect("the watch stays open");
        for e in r.events {
            let kv = e.kv.unwrap();
            values.push(String::from_utf8(kv.value).unwrap());
        }
    }
    values
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_of_one_frontend_never_cross_and_restart_from_their_checkpoints() {
    let mut d = deployment().await;
    let endpoint = d.frontend(0).endpoint();
    let mut a = TenantClient::connect(&endpoint, "a").await.unwrap();
    let mut b = TenantClient::connect(&endpoint, "b").await.unwrap();
    let mut default = etcd_client::Client::connect([endpoint.as_str()], None)
        .await
        .unwrap();

    // A watch of `k` in `a` from now, and the same keys written in both tenants.
    let mut a_watch = watch(&mut a, "k", 0).await;
    assert_eq!(
        put(&mut b, "k", "b1", 0).await,
        2,
        "each tenant starts at revision 1"
    );
    assert_eq!(put(&mut b, "k", "b2", 0).await, 3);
    assert_eq!(
        put(&mut a, "k", "a1", 0).await,
        2,
        "b's writes are not a's revisions"
    );
    let ra = get(&mut a, "k").await;
    let rb = get(&mut b, "k").await;
    assert_eq!(ra.kvs[0].value, b"a1");
    assert_eq!(
        (ra.kvs[0].version, ra.header.as_ref().unwrap().revision),
        (1, 2)
    );
    assert_eq!(rb.kvs[0].value, b"b2");
    assert_eq!(
        (rb.kvs[0].version, rb.header.as_ref().unwrap().revision),
        (2, 3)
    );
    // Each tenant is its own etcd cluster to its clients.
    let default_header = default.get("k", None).await.unwrap();
    assert!(
        default_header.kvs().is_empty(),
        "nothing crossed into the default tenant"
    );
    let cluster_ids = [
        ra.header.unwrap().cluster_id,
        rb.header.unwrap().cluster_id,
        default_header.header().unwrap().cluster_id(),
    ];
    assert!(
        cluster_ids[0] != cluster_ids[1]
            && cluster_ids[1] != cluster_ids[2]
            && cluster_ids[0] != cluster_ids[2],
        "{cluster_ids:?}"
    );
    // a's watch saw a's put only; b's history replays b's two puts only.
    assert_eq!(next_values(&mut a_watch, 1).await, ["a1"]);
    let mut b_replay = watch(&mut b, "k", 1).await;
    assert_eq!(next_values(&mut b_replay, 2).await, ["b1", "b2"]);
    put(&mut b, "k", "b3", 0).await;
    put(&mut a, "k", "a2", 0).await;
    assert_eq!(
        next_values(&mut a_watch, 1).await,
        ["a2"],
        "b3 must not reach a's watch"
    );
    assert_eq!(next_values(&mut b_replay, 1).await, ["b3"]);

    // Lease ids are per tenant: the same id granted in both, revoked in one only.
    for c in [&mut a, &mut b] {
        let g = c
            .lease
            .lease_grant(LeaseGrantRequest { ttl: 600, id: 0x77 })
            .await
            .unwrap()
            .into_inner();
        assert_eq!((g.id, g.error.as_str()), (0x77, ""));
    }
    put(&mut a, "leased", "a", 0x77).await;
    put(&mut b, "leased", "b", 0x77).await;
    b.lease
        .lease_revoke(LeaseRevokeRequest { id: 0x77 })
        .await
        .unwrap();
    assert!(
        get(&mut b, "leased").await.kvs.is_empty(),
        "b's revoke deleted b's key"
    );
    assert_eq!(get(&mut a, "leased").await.kvs[0].value, b"a");
    let ttl = a
        .lease
        .lease_time_to_live(LeaseTimeToLiveRequest {
            id: 0x77,
            keys: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(ttl.ttl > 0 && ttl.keys == [b"leased".to_vec()], "{ttl:?}");
    let gone = b
        .lease
        .lease_revoke(LeaseRevokeRequest { id: 0x77 })
        .await
        .unwrap_err();
    assert_eq!(
        (gone.code(), gone.message()),
        (Code::NotFound, "etcdserver: requested lease not found")
    );

    // A delete of everything in b leaves a alone.
    b.kv.delete_range(DeleteRangeRequest {
        key: vec![0],
        range_end: vec![0],
        ..Default::default()
    })
    .await
    .unwrap();
    assert!(all(&mut b).await.1.is_empty());
    assert_eq!(all(&mut a).await.1.len(), 2);
    assert_ne!(hash_kv(&mut a).await, hash_kv(&mut b).await);

    // A tenant this frontend does not serve is refused, not served from another keyspace.
    let mut stranger = TenantClient::connect(&endpoint, "c").await.unwrap();
    let e = get_probe(&mut stranger).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert!(e.message().contains("\"c\" is not served"), "{e:?}");

    // The compactor checkpoints every tenant it finds in the journal and trims below them all.
    let _compactor =
        d.start_compactor(&["--every-entries", "20", "--every", "1s", "--trim-lag", "0"]);
    let deadline = Instant::now() + WAIT;
    let mut i = 0;
    while first_index_of(&d.journal_addrs()[0], 0).await <= 1 {
        assert!(
            Instant::now() < deadline,
            "journal never trimmed\n--- compactor log ---\n{}",
            tail_file(&d.dir().join("compactor.log"))
        );
        // Writes in both tenants give the compactor rounds to run.
        put(&mut a, &format!("a/{i}"), "x", 0).await;
        put(&mut b, &format!("b/{i}"), "y", 0).await;
        i += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    put(&mut a, "after-trim", "a", 0).await;
    let before = [all(&mut a).await, all(&mut b).await];
    let hashes = [hash_kv(&mut a).await, hash_kv(&mut b).await];

    // kill -9 and restart: each tenant comes back from its own checkpoint plus the tail.
    d.kill_frontend(0);
    d.restart_frontend(0).await;
    let log = std::fs::read_to_string(d.frontend_log(0)).unwrap();
    for t in ["a", "b"] {
        assert!(
            log.lines()
                .any(|l| l.contains("starting from checkpoint")
                    && l.contains(&format!("tenant={t} "))),
            "tenant {t} did not start from its checkpoint:\n{}",
            tail_file(d.frontend_log(0))
        );
    }
    let mut a = TenantClient::connect(&endpoint, "a").await.unwrap();
    let mut b = TenantClient::connect(&endpoint, "b").await.unwrap();
    assert_eq!([all(&mut a).await, all(&mut b).await], before);
    assert_eq!([hash_kv(&mut a).await, hash_kv(&mut b).await], hashes);
    let rev_a = before[0].0;
    assert_eq!(put(&mut a, "k", "a3", 0).await, rev_a + 1);

    // Auth is per tenant: a token of a is no token of b, even for the same user and password.
    let mut tokens = Vec::new();
    for c in [&mut a, &mut b] {
        c.auth
            .user_add(AuthUserAddRequest {
                name: "root".into(),
                password: "pw".into(),
                ..Default::default()
            })
            .await
            .unwrap();
        c.auth
            .role_add(AuthRoleAddRequest {
                name: "root".into(),
            })
            .await
            .unwrap();
        c.auth
            .user_grant_role(AuthUserGrantRoleRequest {
                user: "root".into(),
                role: "root".into(),
            })
            .await
            .unwrap();
        c.auth.auth_enable(AuthEnableRequest {}).await.unwrap();
        let token = c
            .auth
            .authenticate(AuthenticateRequest {
                name: "root".into(),
                password: "pw".into(),
            })
            .await
            .unwrap()
            .into_inner()
            .token;
        tokens.push(token);
    }
    let mut a_root = a.with_token(&tokens[0]);
    get(&mut a_root, "k").await;
    let mut b_with_a_token = b.with_token(&tokens[0]);
    let e = get_probe(&mut b_with_a_token).await.unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (Code::Unauthenticated, "etcdserver: invalid auth token")
    );
    let mut b_root = b.with_token(&tokens[1]);
    assert!(get(&mut b_root, "k").await.kvs.is_empty());
    // The default tenant's auth is still off: etcdctl-style clients go on without a token.
    default.put("plain", "v", None).await.unwrap();
}

/// A frontend with no default tenant (`--tenant=`) refuses requests that name none; one given
/// `--tenants` without `--trust-tenant-header` refuses to start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unnamed_requests_need_a_default_tenant_and_more_tenants_need_a_trusted_header() {
    let d = Deployment::start(1).await;
    let listen = format!("127.0.0.1:{}", free_port());
    let metrics = format!("127.0.0.1:{}", free_port());
    let mut args = frontend_args(d.journal_addrs(), &listen, &metrics, &[]);
    args.extend([
        "--tenant=".into(),
        "--tenants=a".into(),
        "--trust-tenant-header".into(),
    ]);
    let log = d.dir().join("frontend-no-default.log");
    let _fe = ChildGuard::strata("frontend-no-default", &args, Some(&log));
    let endpoint = format!("http://{listen}");
    // Readiness of a frontend whose tenants must be named: ask as tenant a.
    let deadline = Instant::now() + WAIT;
    let mut a = loop {
        if let Ok(mut a) = TenantClient::connect(&endpoint, "a").await
            && get_probe(&mut a).await.is_ok()
        {
            break a;
        }
        assert!(Instant::now() < deadline, "not ready:\n{}", tail_file(&log));
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // Tenant a of this frontend and tenant a of the deployment's are one tenant: same journal.
    put(&mut a, "shared", "1", 0).await;
    let e = etcd_client::Client::connect([endpoint.as_str()], None)
        .await
        .unwrap()
        .get("shared", None)
        .await
        .unwrap_err();
    match e {
        etcd_client::Error::GRpcStatus(s) => {
            assert_eq!(s.code(), Code::NotFound);
            assert_eq!(
                s.message(),
                "strata: the request names no tenant (x-strata-tenant) and this frontend serves no default tenant"
            );
        }
        other => panic!("expected NotFound, got {other:?}"),
    }
    // The deployment's frontend serves only its default tenant and, without
    // --trust-tenant-header, refuses a header naming another.
    let mut a_elsewhere = TenantClient::connect(&d.frontend(0).endpoint(), "a")
        .await
        .unwrap();
    let e = get_probe(&mut a_elsewhere).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound);

    let mut args = frontend_args(
        d.journal_addrs(),
        &format!("127.0.0.1:{}", free_port()),
        &format!("127.0.0.1:{}", free_port()),
        &[],
    );
    args.push("--tenants=a".into());
    let out = std::process::Command::new(strata_tests::process::strata_bin())
        .args(&args)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--tenants needs --tenant-domain"),
        "{stderr}"
    );
}

/// `--tenant-request-rate`: a tenant over its rate gets etcd's "too many requests", within the
/// bucket's bound; another tenant of the same frontend is served meanwhile, and the limited
/// tenant's lease keep-alives go on. `--tenant-max-watchers`: a create over the quota is
/// refused, per tenant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_over_its_quotas_is_refused_alone() {
    const RATE: u32 = 20;
    let d = Deployment::start_with(
        1,
        Setup {
            frontend_extra: Box::new(|_| {
                vec![
                    "--tenants=a,b".into(),
                    "--trust-tenant-header".into(),
                    format!("--tenant-request-rate={RATE}"),
                    format!("--tenant-request-burst={RATE}"),
                    "--tenant-max-watchers=2".into(),
                ]
            }),
            ..Setup::default()
        },
    )
    .await;
    let endpoint = d.frontend(0).endpoint();
    let mut a = TenantClient::connect(&endpoint, "a").await.unwrap();
    let mut b = TenantClient::connect(&endpoint, "b").await.unwrap();

    // Two watchers per tenant on this frontend: a's third is refused, b has its own two.
    let _a_watches = [watch(&mut a, "w1", 0).await, watch(&mut a, "w2", 0).await];
    let create = WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: b"w3".to_vec(),
            ..Default::default()
        })),
    };
    let requests = futures::stream::iter([create]).chain(futures::stream::pending());
    let mut third = a.watch.watch(requests).await.unwrap().into_inner();
    let refused = third.message().await.unwrap().unwrap();
    assert!(refused.created && refused.canceled, "{refused:?}");
    assert_eq!(
        refused.cancel_reason,
        "strata: watcher quota of 2 per frontend reached"
    );
    let _b_watches = [watch(&mut b, "w1", 0).await, watch(&mut b, "w2", 0).await];

    let lease = a.grant(60).await.unwrap();
    let (keep_alive_tx, keep_alive_rx) = tokio::sync::mpsc::channel(4);
    let mut keep_alives = a
        .lease
        .lease_keep_alive(futures::stream::unfold(
            keep_alive_rx,
            |mut rx| async move { rx.recv().await.map(|m| (m, rx)) },
        ))
        .await
        .unwrap()
        .into_inner();

    // Flood: at most the burst plus what the rate refills while it lasts is admitted.
    let started = Instant::now();
    let (mut admitted, mut refused) = (0u32, 0u32);
    for _ in 0..200 {
        match get_probe(&mut a).await {
            Ok(_) => admitted += 1,
            Err(e) => {
                assert_eq!(
                    (e.code(), e.message()),
                    (Code::ResourceExhausted, "etcdserver: too many requests")
                );
                refused += 1;
            }
        }
    }
    let bound = RATE + (started.elapsed().as_secs_f64() * f64::from(RATE)).ceil() as u32 + 1;
    assert!(refused > 0, "nothing refused ({admitted} admitted)");
    assert!(
        admitted <= bound,
        "{admitted} admitted, at most {bound} allowed"
    );

    // Tenant b has its own bucket; tenant a's lease keep-alives are not charged.
    for _ in 0..5 {
        get_probe(&mut b).await.unwrap();
    }
    keep_alive_tx
        .send(api::etcdserverpb::LeaseKeepAliveRequest { id: lease })
        .await
        .unwrap();
    let renewed = tokio::time::timeout(Duration::from_secs(10), keep_alives.message())
        .await
        .expect("a keep-alive answer")
        .unwrap()
        .unwrap();
    assert_eq!((renewed.id, renewed.ttl), (lease, 60));
    assert!(
        strata_tests::curl::has_metric(
            &d.frontend(0).metrics,
            "strata_frontend_requests_limited_total{tenant=\"a\"}"
        ),
        "no limited-requests counter for a"
    );
    // The bucket refills: after a second, a is served again.
    tokio::time::sleep(Duration::from_secs(1)).await;
    get_probe(&mut a).await.unwrap();
}
