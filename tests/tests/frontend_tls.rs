//! The client port over TLS, as etcd serves it (`--cert-file`, `--key-file`,
//! `--trusted-ca-file`, `--client-cert-auth`), driven by etcdctl and curl with their own TLS
//! flags, and the tenant a TLS connection names (`--tenant-domain`): by the server name it
//! dials, else by its client certificate; a connection never changes tenant.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use api::etcdserverpb::kv_client::KvClient;
use api::etcdserverpb::{PutRequest, RangeRequest};
use strata_tests::certs::Ca;
use strata_tests::deployment::{Deployment, frontend_args};
use strata_tests::etcdctl::Etcdctl;
use strata_tests::process::{ChildGuard, free_port};
use strata_tests::readiness::tail_file;
use strata_tests::tenant::TENANT_HEADER;
use tonic::Code;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

/// `--tenant-domain` of the tests' frontends (their certificates name `*.tenants.test`).
const TENANT_DOMAIN: &str = "--tenant-domain=tenants.test";

/// The test's certificates, as files.
struct Pki {
    ca: Ca,
    dir: PathBuf,
}

impl Pki {
    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    /// etcdctl's TLS flags for the client certificate `name` (none if `None`).
    fn etcdctl_flags(&self, name: Option<&str>) -> Vec<String> {
        let mut flags = vec![format!("--cacert={}", self.path("ca.pem"))];
        if let Some(n) = name {
            flags.push(format!("--cert={}", self.path(&format!("{n}.pem"))));
            flags.push(format!("--key={}", self.path(&format!("{n}.key"))));
        }
        flags
    }

    /// A gRPC connection presenting client certificate `name`, dialling server name `sni`.
    async fn channel(&self, endpoint: &str, name: &str, sni: &str) -> Channel {
        self.try_channel(endpoint, name, sni).await.unwrap()
    }

    /// A new connection of tenant `tenant` (its certificate and server name) that serves a
    /// put of `key`, or None if the connection or the put is refused.
    async fn served(&self, endpoint: &str, tenant: &str, key: &str) -> Option<Channel> {
        let c = self
            .try_channel(endpoint, tenant, &format!("{tenant}.tenants.test"))
            .await
            .ok()?;
        put(&c, None, key).await.ok()?;
        Some(c)
    }

    /// `served`, tried until it is (30 s at most; then panics saying `why`, with the tail of
    /// the frontend's `log`).
    async fn served_within(
        &self,
        endpoint: &str,
        (tenant, key): (&str, &str),
        why: &str,
        log: &Path,
    ) -> Channel {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(c) = self.served(endpoint, tenant, key).await {
                return c;
            }
            assert!(Instant::now() < deadline, "{why}\n{}", tail_file(log));
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn try_channel(
        &self,
        endpoint: &str,
        name: &str,
        sni: &str,
    ) -> Result<Channel, tonic::transport::Error> {
        let read = |f: String| std::fs::read_to_string(self.path(&f)).unwrap();
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca.cert_pem))
            .identity(Identity::from_pem(
                read(format!("{name}.pem")),
                read(format!("{name}.key")),
            ))
            .domain_name(sni);
        Channel::from_shared(endpoint.to_string())
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect()
            .await
    }
}

fn write_pki(dir: &Path) -> Pki {
    let ca = Ca::new();
    ca.write(dir);
    ca.server(&["*.tenants.test", "localhost", "127.0.0.1"])
        .write(dir, "server");
    // An operator's certificate that names no tenant, and one per tenant.
    ca.client("root", &["operator.example"])
        .write(dir, "operator");
    ca.client("app", &["a.tenants.test"]).write(dir, "a");
    ca.client("app", &["b.tenants.test"]).write(dir, "b");
    // Signed by another CA: not trusted.
    Ca::new()
        .client("root", &["operator.example"])
        .write(dir, "stranger");
    Pki {
        ca,
        dir: dir.to_path_buf(),
    }
}

async fn put(
    channel: &Channel,
    tenant_header: Option<&str>,
    key: &str,
) -> Result<i64, tonic::Status> {
    let mut req = tonic::Request::new(PutRequest {
        key: key.into(),
        value: b"v".to_vec(),
        ..Default::default()
    });
    if let Some(t) = tenant_header {
        req.metadata_mut().insert(TENANT_HEADER, t.parse().unwrap());
    }
    KvClient::new(channel.clone())
        .put(req)
        .await
        .map(|r| r.into_inner().header.unwrap().revision)
}

async fn count(channel: &Channel) -> i64 {
    KvClient::new(channel.clone())
        .range(RangeRequest {
            key: vec![0],
            range_end: vec![0],
            count_only: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .count
}

/// A deployment (journal nodes and one plain frontend) with the test's certificates written
/// into its directory.
async fn deployment_with_pki() -> (Deployment, Pki) {
    let d = Deployment::start(1).await;
    let pki = write_pki(d.dir());
    (d, pki)
}

/// A TLS frontend's process and addresses.
struct TlsFrontend {
    _child: ChildGuard,
    listen: String,
    metrics: String,
    log: PathBuf,
    /// `http://` address of its admin API, if it follows the catalogue.
    admin: Option<String>,
}

/// A TLS frontend over `d`'s journal, with `extra` flags (`{port}` in them: its client port),
/// once ready.
async fn start_tls(d: &Deployment, pki: &Pki, extra: &[&str]) -> TlsFrontend {
    let listen = format!("127.0.0.1:{}", free_port());
    let metrics = format!("127.0.0.1:{}", free_port());
    let mut args = frontend_args(d.journal_addrs(), &listen, &metrics, &[]);
    args.extend([
        format!("--cert-file={}", pki.path("server.pem")),
        format!("--key-file={}", pki.path("server.key")),
        format!("--trusted-ca-file={}", pki.path("ca.pem")),
    ]);
    let port = listen.rsplit(':').next().unwrap().to_string();
    args.extend(extra.iter().map(|a| a.replace("{port}", &port)));
    let log = d
        .dir()
        .join(format!("frontend-tls-{}.log", listen.replace(':', "-")));
    let fe = ChildGuard::strata("frontend-tls", &args, Some(&log));
    strata_tests::readiness::wait_readyz_while(&metrics, Duration::from_secs(60), || Ok(()))
        .await
        .unwrap_or_else(|e| panic!("not ready: {e}\n{}", tail_file(&log)));
    TlsFrontend {
        _child: fe,
        listen,
        metrics,
        log,
        admin: None,
    }
}

/// `start_tls` following the catalogue (`--catalogue`, its admin API on a port of its own),
/// tenants named under the test's domain.
async fn start_catalogue_tls(d: &Deployment, pki: &Pki, extra: &[&str]) -> TlsFrontend {
    let admin_listen = format!("127.0.0.1:{}", free_port());
    let admin_flag = format!("--admin-listen={admin_listen}");
    let mut flags = vec![TENANT_DOMAIN, "--catalogue", &admin_flag];
    flags.extend_from_slice(extra);
    let mut fe = start_tls(d, pki, &flags).await;
    fe.admin = Some(format!("http://{admin_listen}"));
    fe
}

impl TlsFrontend {
    /// `strata admin tenant ARGS` on the frontend's admin API; panics (with its log's tail)
    /// if refused.
    fn admin(&self, args: &[&str]) -> serde_json::Value {
        let admin = self.admin.as_deref().expect("a frontend of the catalogue");
        strata_tests::tenant::admin_as(admin, &[], args)
            .unwrap_or_else(|e| panic!("{args:?}: {e}\n{}", tail_file(&self.log)))
    }

    /// How many lines of the frontend's log say `what`.
    fn logged(&self, what: &str) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .matches(what)
            .count()
    }

    /// Waits until the log says `what` at least `times` times (30 s at most; then panics
    /// saying `why`).
    async fn until_logged(&self, what: &str, times: usize, why: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.logged(what) < times {
            assert!(Instant::now() < deadline, "{why}\n{}", tail_file(&self.log));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The value of the sample `name` (with its labels) on the frontend's `/metrics`.
    fn metric(&self, name: &str) -> Option<f64> {
        let page =
            strata_tests::curl::request(&format!("http://{}", self.metrics), "GET", "/metrics", "")
                .1;
        page.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<f64>().ok())
    }
}

/// etcdctl at `endpoint` with the client certificate `name` (none if `None`).
fn etcdctl_as<'p>(
    pki: &'p Pki,
    endpoint: &str,
) -> impl Fn(Option<&str>, &[&str]) -> strata_tests::etcdctl::Outcome + 'p {
    let etcdctl = Etcdctl::new(endpoint);
    move |name, cmd| {
        let flags = pki.etcdctl_flags(name);
        let mut all: Vec<&str> = flags.iter().map(String::as_str).collect();
        all.extend_from_slice(cmd);
        etcdctl.run(&all)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_client_certificates_naming_tenants() {
    let (d, pki) = deployment_with_pki().await;
    let fe = start_tls(
        &d,
        &pki,
        &[
            "--client-cert-auth",
            TENANT_DOMAIN,
            "--tenants=a,b",
            "--advertise-client-urls=https://{tenant}.tenants.test:{port}",
        ],
    )
    .await;
    let (listen, log) = (&fe.listen, &fe.log);
    let port = listen.rsplit(':').next().unwrap();
    let endpoint = format!("https://{listen}");
    let with = etcdctl_as(&pki, &endpoint);

    // etcdctl with the operator's certificate: the default tenant, as against etcd.
    let out = with(Some("operator"), &["put", "k", "default-value"]);
    assert!(out.success, "{}\n{}", out.stderr, tail_file(log));
    let out = with(Some("operator"), &["get", "k", "--print-value-only"]);
    assert_eq!(out.stdout.trim(), "default-value", "{}", out.stderr);
    let out = with(Some("operator"), &["endpoint", "health"]);
    // etcdctl 3.4 prints its health report on stderr.
    assert!(out.success && out.stderr.contains("is healthy"), "{out:?}");
    // --client-cert-auth: no certificate, or one from another CA, gets no connection.
    for name in [None, Some("stranger")] {
        // (Short timeouts: etcdctl retries a refused handshake until they run out.)
        let out = with(
            name,
            &["--dial-timeout=2s", "--command-timeout=3s", "get", "k"],
        );
        assert!(!out.success, "{name:?} was served: {}", out.stdout);
    }

    // etcdctl with tenant a's certificate (an IP endpoint sends no server name): tenant a.
    let out = with(Some("a"), &["put", "k", "a-value"]);
    assert!(out.success, "{}", out.stderr);
    let out = with(Some("a"), &["get", "k", "--print-value-only"]);
    assert_eq!(out.stdout.trim(), "a-value");
    let out = with(Some("operator"), &["get", "k", "--print-value-only"]);
    assert_eq!(out.stdout.trim(), "default-value", "a's write stayed in a");

    // The server name names the tenant; its certificate must be that tenant's.
    let b = pki.channel(&endpoint, "b", "b.tenants.test").await;
    assert_eq!(
        put(&b, None, "only-in-b").await.unwrap(),
        2,
        "b's first write"
    );
    assert_eq!(count(&b).await, 1);
    let a_as_b = pki.channel(&endpoint, "a", "b.tenants.test").await;
    let e = put(&a_as_b, None, "x").await.unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (
            Code::PermissionDenied,
            "strata: the client certificate is not one of tenant b's (it must name b.tenants.test)"
        )
    );
    // A connection never changes tenant: a header naming another is refused.
    let a = pki.channel(&endpoint, "a", "localhost").await;
    let e = put(&a, Some("b"), "x").await.unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (
            Code::PermissionDenied,
            "strata: this connection is tenant a's; it cannot name tenant b"
        )
    );
    put(&a, Some("a"), "a2").await.unwrap();
    assert_eq!(count(&a).await, 2, "k and a2");
    assert_eq!(count(&b).await, 1, "nothing of a's reached b");
    // A client cannot pose as its connection: the connection's tenant is set by the server.
    let operator = pki.channel(&endpoint, "operator", "localhost").await;
    let mut req = tonic::Request::new(RangeRequest {
        key: b"only-in-b".to_vec(),
        ..Default::default()
    });
    req.metadata_mut()
        .insert("x-strata-connection-tenant", "b".parse().unwrap());
    let r = KvClient::new(operator)
        .range(req)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.count, 0,
        "the forged entry was ignored: the default tenant answered"
    );

    // Plain HTTP/1.1 over TLS too: etcd's /health on the client port, with curl.
    let out = std::process::Command::new("curl")
        .args(["-s", "--max-time", "10"])
        .args(["--cacert", &pki.path("ca.pem")])
        .args(["--cert", &pki.path("operator.pem")])
        .args(["--key", &pki.path("operator.key")])
        .arg(format!("{endpoint}/health"))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        r#"{"health":"true","reason":""}"#
    );
    // MemberList advertises each tenant's own name, so a client that follows it (clientv3's
    // endpoint sync) keeps dialling its tenant.
    let out = with(Some("operator"), &["member", "list"]);
    let default_url = format!("https://default.tenants.test:{port}");
    assert!(out.stdout.contains(&default_url), "{out:?}");
    let members = api::etcdserverpb::cluster_client::ClusterClient::new(b.clone())
        .member_list(api::etcdserverpb::MemberListRequest::default())
        .await
        .unwrap()
        .into_inner()
        .members;
    assert_eq!(
        members[0].client_ur_ls,
        [format!("https://b.tenants.test:{port}")]
    );
}

/// etcd's `--client-cert-auth` with auth enabled: a request without a token is checked as the
/// user its certificate's common name names, as etcd checks it; a token still comes first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificates_common_name_is_its_user() {
    let (d, pki) = deployment_with_pki().await;
    pki.ca
        .client("alice", &["alice.example"])
        .write(d.dir(), "alice");
    pki.ca
        .client("mallory", &["mallory.example"])
        .write(d.dir(), "mallory");
    // The deployment's token key (written for its frontend): `--user` still mints tokens.
    let key = format!(
        "--auth-token-key-file={}",
        d.dir().join("auth-token.key").display()
    );
    let fe = start_tls(&d, &pki, &["--client-cert-auth", &key]).await;
    let (listen, log) = (&fe.listen, &fe.log);
    let endpoint = format!("https://{listen}");
    let with = etcdctl_as(&pki, &endpoint);
    let ok = |name: &str, cmd: &[&str]| {
        let out = with(Some(name), cmd);
        assert!(
            out.success,
            "{name} {cmd:?}: {}\n{}",
            out.stderr,
            tail_file(log)
        );
        out.stdout
    };
    // Before auth is enabled a certificate's name means nothing: everyone may write.
    ok("alice", &["put", "r/a", "1"]);
    ok("operator", &["user", "add", "root:rootpw"]);
    ok("operator", &["role", "add", "root"]);
    ok("operator", &["user", "grant-role", "root", "root"]);
    ok("operator", &["user", "add", "alice:alicepw"]);
    ok("operator", &["role", "add", "reader"]);
    ok(
        "operator",
        &[
            "role",
            "grant-permission",
            "reader",
            "--prefix=true",
            "read",
            "r/",
        ],
    );
    ok("operator", &["user", "grant-role", "alice", "reader"]);
    ok("operator", &["auth", "enable"]);

    // The operator's certificate says CN=root: root, with no password given.
    ok("operator", &["put", "r/b", "2"]);
    // alice reads what her role grants and writes nothing.
    assert_eq!(
        ok("alice", &["get", "r/a", "--print-value-only"]).trim(),
        "1"
    );
    let out = with(Some("alice"), &["put", "r/a", "3"]);
    assert!(
        !out.success && out.stderr.contains("etcdserver: permission denied"),
        "{out:?}"
    );
    // A name that is no user is denied.
    let out = with(Some("mallory"), &["get", "r/a"]);
    assert!(
        !out.success && out.stderr.contains("etcdserver: permission denied"),
        "{out:?}"
    );
    // A token comes first: alice's certificate with root's password writes.
    ok("alice", &["--user=root:rootpw", "put", "r/a", "4"]);
    assert_eq!(
        ok("operator", &["get", "r/a", "--print-value-only"]).trim(),
        "4"
    );
}

/// `--tenant-max-connections`: a tenant's connection beyond its quota is closed after the
/// handshake; other tenants are not affected, and a closed connection frees its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_connections_beyond_its_quota_are_closed() {
    let (d, pki) = deployment_with_pki().await;
    let fe = start_tls(
        &d,
        &pki,
        &[TENANT_DOMAIN, "--tenants=a,b", "--tenant-max-connections=1"],
    )
    .await;
    let (listen, metrics, log) = (&fe.listen, &fe.metrics, &fe.log);
    let endpoint = format!("https://{listen}");
    let b1 = pki.channel(&endpoint, "b", "b.tenants.test").await;
    put(&b1, None, "k").await.unwrap();
    // A second connection of b: closed once its handshake is done.
    assert!(
        pki.served(&endpoint, "b", "k").await.is_none(),
        "b's second connection was served\n{}",
        tail_file(log)
    );
    // a has its own quota; b's first connection goes on.
    let a1 = pki.channel(&endpoint, "a", "a.tenants.test").await;
    put(&a1, None, "k").await.unwrap();
    put(&b1, None, "k2").await.unwrap();
    // Closing b's connection frees its place.
    drop(b1);
    pki.served_within(&endpoint, ("b", "k3"), "b never got its place back", log)
        .await;
    let metrics =
        strata_tests::curl::request(&format!("http://{metrics}"), "GET", "/metrics", "").1;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("strata_frontend_connections_refused_total{tenant=\"b\"}")),
        "no refused-connections counter for b"
    );
}

/// The catalogue's connection quota of a tenant (`strata admin tenant create --connections`)
/// is enforced on TLS connections that name it, as `--tenant-max-connections` is, and changed
/// live: raised by `update`, the next connection is served. A tenant created without one has
/// no limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_catalogue_s_connection_quota_is_enforced_and_changed_live() {
    let (d, pki) = deployment_with_pki().await;
    let fe = start_catalogue_tls(&d, &pki, &[]).await;
    let log = &fe.log;
    let admin = |args: &[&str]| fe.admin(args);
    admin(&["create", "a", "--connections", "1"]);
    admin(&["create", "b"]);
    let endpoint = format!("https://{}", fe.listen);
    let a1 = pki.channel(&endpoint, "a", "a.tenants.test").await;
    put(&a1, None, "k").await.unwrap();
    assert!(
        pki.served(&endpoint, "a", "k").await.is_none(),
        "a's second connection was served\n{}",
        tail_file(log)
    );
    // b has no quota of its own, and there is no flag: no limit.
    let b = [
        pki.channel(&endpoint, "b", "b.tenants.test").await,
        pki.channel(&endpoint, "b", "b.tenants.test").await,
        pki.channel(&endpoint, "b", "b.tenants.test").await,
    ];
    for c in &b {
        put(c, None, "k").await.unwrap();
    }
    // Raised: a's next connection is served, its first still is.
    admin(&["update", "a", "--connections", "2"]);
    let why = "the raised quota never let a second connection in";
    let a2 = pki.served_within(&endpoint, ("a", "k2"), why, log).await;
    put(&a1, None, "k3").await.unwrap();
    put(&a2, None, "k4").await.unwrap();
    assert!(
        pki.served(&endpoint, "a", "k").await.is_none(),
        "a's third connection was served with a quota of 2\n{}",
        tail_file(log)
    );
}

/// A catalogue tenant a TLS connection names by its server name through its whole life: served
/// dormant under a full memory budget and loaded by the first connection naming it, unloaded
/// while idle and loaded again by the next request of a connection still open, refused once
/// deleted, and empty once created again under its name (another generation).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_named_by_its_server_name_sleeps_wakes_and_is_created_again() {
    let (d, pki) = deployment_with_pki().await;
    let fe = start_catalogue_tls(&d, &pki, &["--tenant-idle-unload=1s", "--memory-budget=1"]).await;
    let log = &fe.log;
    let admin = |args: &[&str]| fe.admin(args);
    let logged = |what: &str| fe.logged(what);
    let endpoint = format!("https://{}", fe.listen);
    admin(&["create", "a"]);
    let a = pki
        .served_within(&endpoint, ("a", "in-a"), "a never served", log)
        .await;

    // a holds a byte: the budget is full, so b is served without being loaded.
    admin(&["create", "b"]);
    let why = "b was loaded over the budget";
    fe.until_logged("memory budget full: tenant served unloaded", 1, why)
        .await;
    let woken = logged("idle tenant loaded again for a request");
    let b = pki.channel(&endpoint, "b", "b.tenants.test").await;
    assert_eq!(put(&b, None, "in-b").await.unwrap(), 2, "b's first write");
    assert_eq!(
        logged("idle tenant loaded again for a request"),
        woken + 1,
        "the connection's request loaded b"
    );

    // Idle for a second, both are unloaded; the open connections' next requests load them
    // again, each with its own keys.
    let why = "a and b were never unloaded while idle";
    fe.until_logged("tenant idle: unloaded", 2, why).await;
    assert_eq!(count(&b).await, 1);
    assert_eq!(count(&a).await, 1);
    // A connection naming b by its certificate alone (no server name of the domain), while
    // b sleeps: b's certificate names it among the tenants served, dormant ones included.
    let why = "a and b were never unloaded again";
    fe.until_logged("tenant idle: unloaded", 4, why).await;
    let by_certificate = pki.channel(&endpoint, "b", "localhost").await;
    assert_eq!(
        count(&by_certificate).await,
        1,
        "b's key, by b's certificate"
    );
    let b2 = pki.channel(&endpoint, "b", "b.tenants.test").await;
    assert_eq!(count(&b2).await, 1, "a new connection naming b");

    // Deleted: refused on the connections open and to new ones.
    admin(&["delete", "b"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let refused = loop {
        match put(&b, None, "after-delete").await {
            Err(e) => break e,
            Ok(_) => {
                assert!(Instant::now() < deadline, "b served after its deletion");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert_eq!(refused.code(), Code::NotFound, "{refused:?}");
    assert!(
        pki.served(&endpoint, "b", "after-delete").await.is_none(),
        "a new connection naming deleted b was served"
    );

    // Created again: the name serves another, empty keyspace.
    admin(&["create", "b"]);
    let b3 = pki
        .served_within(
            &endpoint,
            ("b", "new"),
            "b's new generation never served",
            log,
        )
        .await;
    assert_eq!(count(&b3).await, 1, "only the new generation's key");
    let r = KvClient::new(b3.clone())
        .range(RangeRequest {
            key: b"new".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.kvs[0].mod_revision, 2, "the new generation's first write");
    assert_eq!(count(&a).await, 1, "a untouched");
}

/// Certificates rotated on disk are served to new connections without a restart
/// (`--tls-reload-interval`; etcd reads its files at each handshake). A connection made before
/// keeps going. Files that do not load (half a rotation: a certificate without its key) are
/// refused, said in a metric, and the last good ones serve on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_are_rotated_without_a_restart() {
    let (d, pki) = deployment_with_pki().await;
    let fe = start_tls(
        &d,
        &pki,
        &["--client-cert-auth", "--tls-reload-interval=100ms"],
    )
    .await;
    let (listen, log) = (&fe.listen, &fe.log);
    let endpoint = format!("https://{listen}");
    let metric = |name: &str| fe.metric(name);
    let failing = "strata_frontend_tls_reload_failing{port=\"client\"}";
    assert_eq!(metric(failing), Some(0.0));
    let expires = "strata_frontend_tls_certificate_expiration_timestamp_seconds{port=\"client\"}";
    // The test CA's certificates are valid until 4096: after 2100-01-01 at least.
    assert!(
        metric(expires).is_some_and(|at| at > 4_102_444_800.0),
        "{:?}",
        metric(expires)
    );

    // The old CA's files, for a client that stays with it.
    let old = d.dir().join("old");
    std::fs::create_dir(&old).unwrap();
    for f in ["ca.pem", "operator.pem", "operator.key"] {
        std::fs::copy(pki.dir.join(f), old.join(f)).unwrap();
    }
    let open = pki.channel(&endpoint, "operator", "localhost").await;
    put(&open, None, "before").await.unwrap();
    let with = etcdctl_as(&pki, &endpoint);

    // Half a rotation: the new certificate, the old key. Refused; the old files serve on.
    let next = Ca::new();
    let server = next.server(&["localhost", "127.0.0.1"]);
    std::fs::write(pki.path("server.pem"), &server.cert_pem).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric(failing) != Some(1.0) {
        assert!(
            Instant::now() < deadline,
            "half a rotation was not refused\n{}",
            tail_file(log)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let out = with(Some("operator"), &["get", "before", "--print-value-only"]);
    assert_eq!(out.stdout.trim(), "v", "{out:?}\n{}", tail_file(log));

    // The rest: its key, the new CA, and the operator's certificate of the new CA.
    std::fs::write(pki.path("server.key"), &server.key_pem).unwrap();
    next.write(&pki.dir);
    next.client("root", &["operator.example"])
        .write(&pki.dir, "operator");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = with(Some("operator"), &["put", "after", "v"]);
        if out.success {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new certificates were never served: {}\n{}",
            out.stderr,
            tail_file(log)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(metric(failing), Some(0.0));
    let reloads = "strata_frontend_tls_reloads_total{port=\"client\",result=";
    assert!(metric(&format!("{reloads}\"loaded\"}}")).is_some_and(|n| n >= 1.0));
    assert!(metric(&format!("{reloads}\"refused\"}}")).is_some_and(|n| n >= 1.0));

    // A client of the old CA gets no new connection.
    let path = |f: &str| old.join(f).display().to_string();
    let out = Etcdctl::new(&endpoint).run(&[
        // Refused at the handshake: no need to wait for the default timeouts.
        "--dial-timeout=2s",
        "--command-timeout=3s",
        &format!("--cacert={}", path("ca.pem")),
        &format!("--cert={}", path("operator.pem")),
        &format!("--key={}", path("operator.key")),
        "get",
        "after",
    ]);
    assert!(!out.success, "the old CA's client was served: {out:?}");
    // The connection made before the rotation serves on.
    put(&open, None, "still").await.unwrap();
}

/// `--client-crl-file` (etcd's flag): a certificate the list revokes gets no connection, and
/// when a list that revokes it is written, its open connection is closed (its next request
/// fails) while another certificate's goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_client_certificate_is_cut_off() {
    let (d, pki) = deployment_with_pki().await;
    let crl = pki.path("crl.pem");
    std::fs::write(&crl, pki.ca.crl(&[])).unwrap();
    let a = pki.ca.client("app", &["a.tenants.test"]);
    a.write(&pki.dir, "a");
    let fe = start_tls(
        &d,
        &pki,
        &[
            "--client-cert-auth",
            "--tls-reload-interval=100ms",
            &format!("--client-crl-file={crl}"),
        ],
    )
    .await;
    let (listen, log) = (&fe.listen, &fe.log);
    let endpoint = format!("https://{listen}");
    let open_a = pki.channel(&endpoint, "a", "localhost").await;
    let open_operator = pki.channel(&endpoint, "operator", "localhost").await;
    put(&open_a, None, "by-a").await.unwrap();
    put(&open_operator, None, "by-operator").await.unwrap();

    std::fs::write(&crl, pki.ca.crl(&[&a])).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while put(&open_a, None, "by-a").await.is_ok() {
        assert!(
            Instant::now() < deadline,
            "a's connection outlived its revocation\n{}",
            tail_file(log)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Its connection was closed (not only new ones refused), and the operator's goes on.
    assert_eq!(
        fe.metric("strata_frontend_connections_revoked_total{port=\"client\"}"),
        Some(1.0)
    );
    put(&open_operator, None, "still").await.unwrap();
    let with = etcdctl_as(&pki, &endpoint);
    let out = with(
        Some("a"),
        &["--dial-timeout=2s", "--command-timeout=3s", "get", "by-a"],
    );
    assert!(!out.success, "a revoked certificate was served: {out:?}");
    let out = with(Some("operator"), &["get", "by-a", "--print-value-only"]);
    assert_eq!(out.stdout.trim(), "v", "{out:?}");
}

/// The `--internal-*` flags of a process holding `cert` and `key`, of the CA in `ca`.
fn internal_flags(ca: &Path, cert: &Path, key: &Path) -> Vec<String> {
    [
        ("--internal-trusted-ca-file", ca),
        ("--internal-cert-file", cert),
        ("--internal-key-file", key),
    ]
    .iter()
    .map(|(flag, path)| format!("{flag}={}", path.display()))
    .collect()
}

/// A deployment over internal TLS (`--internal-*` on every journal node and the frontend)
/// survives the loss of a journal node: the others go on committing, the node restarted
/// rejoins over TLS (its peers' connections to it are made again through the TLS connector),
/// and once another node is killed the shard commits only with the rejoined node's vote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_node_restarted_under_internal_tls_rejoins_its_peers() {
    use strata_tests::deployment::Setup;
    let pki = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let ca_file = ca.write(pki.path());
    let (cert, key) = ca.peer(&["127.0.0.1"]).write(pki.path(), "internal");
    let internal = internal_flags(&ca_file, &cert, &key);
    let frontend_flags = internal.clone();
    let mut d = Deployment::start_with(
        1,
        Setup {
            journal_extra: internal,
            frontend_extra: Box::new(move |_| frontend_flags.clone()),
            ..Default::default()
        },
    )
    .await;
    let endpoint = d.frontend(0).endpoint();
    let channel = || async {
        Channel::from_shared(endpoint.clone())
            .unwrap()
            .connect()
            .await
            .unwrap()
    };
    // Puts retried for a while: a killed leader's shard elects another first.
    let put_eventually = |c: Channel, key: &'static str| async move {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match put(&c, None, key).await {
                Ok(rev) => return rev,
                Err(e) => assert!(Instant::now() < deadline, "put {key}: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let c = channel().await;
    put_eventually(c.clone(), "before").await;
    d.kill_journal(0);
    put_eventually(c.clone(), "one-down").await;
    d.restart_journal(0);
    // Give the restarted node time to be heard from, then take another: only its vote and
    // log make a majority now.
    let journal_log = d.dir().join("journal-1.log");
    tokio::time::sleep(Duration::from_secs(3)).await;
    d.kill_journal(1);
    let rev = put_eventually(c.clone(), "rejoined").await;
    let kvs = KvClient::new(c)
        .range(RangeRequest {
            key: b"\0".to_vec(),
            range_end: b"\0".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .kvs;
    let keys: Vec<&[u8]> = kvs.iter().map(|kv| kv.key.as_slice()).collect();
    assert_eq!(
        keys,
        [&b"before"[..], b"one-down", b"rejoined"],
        "at revision {rev}\n{}",
        tail_file(&journal_log)
    );
}

/// `--internal-crl-file` on the journal nodes: once a list revoking the frontend's internal
/// certificate is written, the nodes close the connections the frontend holds open (not only
/// refuse new ones), so its writes stop within the reload interval instead of going on until
/// it happens to reconnect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_frontend_certificate_is_cut_off_from_the_journal() {
    use strata_tests::deployment::Setup;
    let pki = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let ca_file = ca.write(pki.path());
    let (node_cert, node_key) = ca.peer(&["127.0.0.1"]).write(pki.path(), "node");
    let frontend = ca.peer(&["frontend.test"]);
    let (frontend_cert, frontend_key) = frontend.write(pki.path(), "frontend");
    let crl = pki.path().join("crl.pem");
    std::fs::write(&crl, ca.crl(&[])).unwrap();
    let mut journal_extra = internal_flags(&ca_file, &node_cert, &node_key);
    journal_extra.extend([
        format!("--internal-crl-file={}", crl.display()),
        "--internal-tls-reload-interval=100ms".into(),
    ]);
    let frontend_flags = internal_flags(&ca_file, &frontend_cert, &frontend_key);
    let d = Deployment::start_with(
        1,
        Setup {
            journal_extra,
            frontend_extra: Box::new(move |_| frontend_flags.clone()),
            ..Default::default()
        },
    )
    .await;
    let c = Channel::from_shared(d.frontend(0).endpoint())
        .unwrap()
        .connect()
        .await
        .unwrap();
    // A put that does not finish within 5 s counts as failed (the frontend retries appends).
    let put_within = |key: &'static str| {
        let c = c.clone();
        async move {
            tokio::time::timeout(Duration::from_secs(5), put(&c, None, key))
                .await
                .map_err(|_| "timed out".to_string())
                .and_then(|r| r.map_err(|e| e.to_string()))
        }
    };
    put_within("before").await.unwrap();

    std::fs::write(&crl, ca.crl(&[&frontend])).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while put_within("after").await.is_ok() {
        assert!(
            Instant::now() < deadline,
            "the frontend's open connections outlived its revocation\n{}",
            tail_file(&d.dir().join("journal-1.log"))
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let closed = (1..=3)
        .map(|i| std::fs::read_to_string(d.dir().join(format!("journal-{i}.log"))).unwrap())
        .filter(|log| log.contains("internal connections closed"))
        .count();
    assert!(closed >= 1, "no journal node closed a connection");
    assert!(
        put_within("still-after").await.is_err(),
        "the frontend reconnected with a revoked certificate"
    );
}
