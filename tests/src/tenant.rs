//! etcd's gRPC clients for one tenant of a frontend that serves several: every request carries
//! the `x-strata-tenant` header, as the trusted proxy in front of such a frontend sets it
//! (docs/design/tenants.md, T3). The `etcd-client` crate cannot add a header, so these are the
//! clients generated from etcd's own `.proto` files (`api`), which speak the same wire format.

use api::etcdserverpb::auth_client::AuthClient;
use api::etcdserverpb::cluster_client::ClusterClient;
use api::etcdserverpb::kv_client::KvClient;
use api::etcdserverpb::lease_client::LeaseClient;
use api::etcdserverpb::maintenance_client::MaintenanceClient;
use api::etcdserverpb::watch_client::WatchClient;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// The header a request names its tenant in.
pub const TENANT_HEADER: &str = "x-strata-tenant";

/// Adds the tenant header (and, once set, an auth token) to every request.
#[derive(Clone)]
pub struct Named {
    tenant: MetadataValue<Ascii>,
    token: Option<MetadataValue<Ascii>>,
}

impl Interceptor for Named {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        req.metadata_mut()
            .insert(TENANT_HEADER, self.tenant.clone());
        if let Some(t) = &self.token {
            req.metadata_mut().insert("token", t.clone());
        }
        Ok(req)
    }
}

type Svc = InterceptedService<Channel, Named>;

/// One tenant's KV, Watch, Lease, Maintenance and Auth clients over one connection (a clone
/// shares it).
#[derive(Clone)]
pub struct TenantClient {
    pub tenant: String,
    pub kv: KvClient<Svc>,
    pub watch: WatchClient<Svc>,
    pub lease: LeaseClient<Svc>,
    pub maintenance: MaintenanceClient<Svc>,
    pub auth: AuthClient<Svc>,
    pub cluster: ClusterClient<Svc>,
    channel: Channel,
}

impl TenantClient {
    /// Connects to `endpoint` (`http://host:port`) as a client of `tenant`.
    pub async fn connect(endpoint: &str, tenant: &str) -> Result<Self, tonic::transport::Error> {
        let channel = Channel::from_shared(endpoint.to_string())
            .expect("a valid endpoint URL")
            .connect()
            .await?;
        Ok(Self::over(channel, tenant, None))
    }

    /// The same connection, sending `token` with every request (after `Authenticate`).
    pub fn with_token(&self, token: &str) -> Self {
        Self::over(self.channel.clone(), &self.tenant, Some(token))
    }

    /// A lease of `ttl` seconds: its id.
    pub async fn grant(&mut self, ttl: i64) -> Result<i64, tonic::Status> {
        let req = api::etcdserverpb::LeaseGrantRequest { ttl, id: 0 };
        Ok(self.lease.lease_grant(req).await?.into_inner().id)
    }

    /// Opens a watch of `key` from `start_revision` (0: from now) and answers the stream once
    /// the watch is created; the open or the creation failing is the error.
    pub async fn watch_key(
        &mut self,
        key: &str,
        start_revision: i64,
    ) -> Result<tonic::Streaming<api::etcdserverpb::WatchResponse>, tonic::Status> {
        use api::etcdserverpb::watch_request::RequestUnion;
        use api::etcdserverpb::{WatchCreateRequest, WatchRequest};
        use futures::StreamExt;
        let create = WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
                key: key.into(),
                start_revision,
                ..Default::default()
            })),
        };
        let requests = futures::stream::iter([create]).chain(futures::stream::pending());
        let mut events = self.watch.watch(requests).await?.into_inner();
        let created = events
            .message()
            .await?
            .ok_or_else(|| tonic::Status::unavailable("the watch stream ended"))?;
        if !created.created {
            return Err(tonic::Status::internal(format!("not created: {created:?}")));
        }
        Ok(events)
    }

    fn over(channel: Channel, tenant: &str, token: Option<&str>) -> Self {
        let named = Named {
            tenant: tenant.parse().expect("an ASCII tenant name"),
            token: token.map(|t| t.parse().expect("an ASCII token")),
        };
        Self {
            tenant: tenant.to_string(),
            kv: KvClient::with_interceptor(channel.clone(), named.clone()),
            watch: WatchClient::with_interceptor(channel.clone(), named.clone()),
            lease: LeaseClient::with_interceptor(channel.clone(), named.clone()),
            maintenance: MaintenanceClient::with_interceptor(channel.clone(), named.clone()),
            auth: AuthClient::with_interceptor(channel.clone(), named.clone()),
            cluster: ClusterClient::with_interceptor(channel.clone(), named),
            channel,
        }
    }
}

/// The command line `strata admin tenant <args> <tls> --endpoint <endpoint> --json`.
pub fn admin_command<S: AsRef<std::ffi::OsStr>>(
    endpoint: &str,
    tls: &[String],
    args: &[S],
) -> std::process::Command {
    let mut command = std::process::Command::new(crate::process::strata_bin());
    command
        .args(["admin", "tenant"])
        .args(args)
        .args(tls)
        .args(["--endpoint", endpoint, "--json"]);
    command
}

/// `strata admin tenant <args> --endpoint <admin> --json` with `tls` flags (`--cacert`,
/// `--cert`, `--key`; none for a plain loopback admin port): the JSON printed, or the error
/// text.
pub fn admin_as(
    endpoint: &str,
    tls: &[String],
    args: &[&str],
) -> Result<serde_json::Value, String> {
    let out = admin_command(endpoint, tls, args)
        .output()
        .expect("run strata admin tenant");
    if out.status.success() {
        let text = String::from_utf8_lossy(&out.stdout);
        Ok(serde_json::from_str(text.trim())
            .unwrap_or_else(|e| panic!("{args:?} printed no JSON ({e}): {text}")))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}
