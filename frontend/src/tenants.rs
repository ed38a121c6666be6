//! Tenant resolution: which tenant a request belongs to. Until TLS server names, client
//! certificates and the tenant catalogue land, a frontend serves one tenant; a request may name
//! it in the `x-strata-tenant` metadata header, and naming another tenant is refused (never
//! silently served from the wrong keyspace).

use std::future::Future;
use std::sync::Arc;

use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};

use crate::auth::Caller;
use crate::errors::Error;
use crate::rpc::{RequestId, handled, unary};
use crate::tenant::Tenant;
use crate::token::{Tokens, credential_of};
use crate::watch::{WatchSource, WatchTarget};

/// Metadata header naming the tenant of a request.
pub const TENANT_HEADER: &str = "x-strata-tenant";

/// The metadata keys a token travels in: clientv3's, and the one etcd's JSON gateway makes of
/// an HTTP `Authorization` header.
const TOKEN_KEYS: [&str; 2] = ["token", "authorization"];

/// The tenants this frontend serves.
pub struct Tenants {
    default: Arc<Tenant>,
    /// Signs and verifies auth tokens; None without `--auth-token-key-file` (auth cannot be
    /// enabled through this frontend then, and tokens are not accepted).
    tokens: Option<Arc<Tokens>>,
}

impl Tenants {
    pub fn new(default: Arc<Tenant>) -> Self {
        Self {
            default,
            tokens: None,
        }
    }

    /// Tenants whose auth tokens `tokens` signs and verifies.
    pub fn with_tokens(mut self, tokens: Option<Arc<Tokens>>) -> Self {
        self.tokens = tokens;
        self
    }

    pub fn tokens(&self) -> Option<&Arc<Tokens>> {
        self.tokens.as_ref()
    }

    /// Why this frontend cannot serve its tenant although the replica is caught up: the
    /// tenant's auth is enabled (by another frontend) and this one has no token key, so it
    /// could verify no token and every request would be refused. Readiness says so, so a load
    /// balancer sends the clients elsewhere.
    pub fn misconfigured(&self) -> Option<String> {
        (self.tokens.is_none() && self.default.replica.auth_enabled()).then(|| {
            format!(
                "auth is enabled for tenant {} and this frontend has no auth token key (--auth-token-key-file): it cannot verify any token",
                self.default.name
            )
        })
    }

    /// Who sent a request of tenant `t` (etcd's `AuthInfoFromCtx`): nobody while the tenant's
    /// auth is disabled (a token is then ignored, as etcd ignores it) or when the request
    /// carries no token; else the user its token names, checked against the auth state as it
    /// is now, as etcd checks its simple tokens (`crate::token`). "etcdserver: invalid auth
    /// token" (on which clients authenticate again) for a token that is not this deployment's,
    /// names another tenant, expired, or whose user is gone or has another password since. A
    /// token minted after a change this replica has not applied yet waits for it, as a read.
    pub async fn caller(&self, t: &Tenant, metadata: &MetadataMap) -> Result<Caller, Error> {
        let Some(token) = token_of(t, metadata)? else {
            return Ok(Caller::default());
        };
        match self.check_token(t, token, false)? {
            Some(caller) => Ok(caller),
            None => {
                t.barrier().await?;
                self.check_token(t, token, true)?
                    .ok_or(Error::InvalidAuthToken)
            }
        }
    }

    /// `caller` without waiting for the replica (a watch stream's: its checks run at each
    /// create, against the store as it then is).
    pub fn identify(&self, t: &Tenant, metadata: &MetadataMap) -> Result<Caller, Error> {
        match token_of(t, metadata)? {
            Some(token) => self
                .check_token(t, token, true)?
                .ok_or(Error::InvalidAuthToken),
            None => Ok(Caller::default()),
        }
    }

    /// The caller `token` names, checked under one hold of the replica: signed by this
    /// deployment for this tenant, not expired in journal time, its user still there with the
    /// password it was minted against. None when it was minted at an auth revision this replica
    /// has not applied yet (unless `ahead_ok`): the caller waits for the replica and asks again.
    fn check_token(
        &self,
        t: &Tenant,
        token: &str,
        ahead_ok: bool,
    ) -> Result<Option<Caller>, Error> {
        let tokens = self.tokens.as_ref().ok_or(Error::InvalidAuthToken)?;
        let store = t.replica.read();
        let claims = tokens
            .verify(token, &t.name, store.time_ms())
            .ok_or(Error::InvalidAuthToken)?;
        let revision = store.auth_revision();
        if claims.revision > revision && !ahead_ok {
            return Ok(None);
        }
        let hash = store
            .auth_password(&claims.username)
            .ok_or(Error::InvalidAuthToken)?;
        if credential_of(hash) != claims.credential {
            return Err(Error::InvalidAuthToken);
        }
        Ok(Some(Caller {
            user: claims.username,
            revision,
        }))
    }

    /// One unary RPC as every service runs it: the request's tenant, a request id and the
    /// caller its token names, then `body`, inside the RPC's span, metrics and error mapping
    /// (`rpc::unary`).
    pub async fn serve<R, T, Fut>(
        &self,
        rpc: &'static str,
        metadata: &MetadataMap,
        message: R,
        body: impl FnOnce(Arc<Tenant>, RequestId, Caller, R) -> Fut,
    ) -> Result<Response<T>, Status>
    where
        Fut: Future<Output = Result<T, Error>>,
    {
        let t = self.resolve(metadata).map_err(handled)?;
        let id = RequestId::random();
        let name = t.name.clone();
        unary(rpc, &name, id, async {
            let caller = self.caller(&t, metadata).await?;
            body(t, id, caller, message).await
        })
        .await
    }

    /// `serve` of a tonic request.
    pub async fn serve_request<R, T, Fut>(
        &self,
        rpc: &'static str,
        req: Request<R>,
        body: impl FnOnce(Arc<Tenant>, RequestId, Caller, R) -> Fut,
    ) -> Result<Response<T>, Status>
    where
        Fut: Future<Output = Result<T, Error>>,
    {
        let (metadata, _, message) = req.into_parts();
        self.serve(rpc, &metadata, message, body).await
    }

    /// The configured tenant (health, metrics and status report on it).
    pub fn default_tenant(&self) -> &Arc<Tenant> {
        &self.default
    }

    /// The tenant of a request.
    pub fn resolve(&self, metadata: &MetadataMap) -> Result<Arc<Tenant>, Error> {
        match metadata.get(TENANT_HEADER) {
            None => Ok(self.default.clone()),
            Some(v) => match v.to_str() {
                Ok(name) if name == self.default.name => Ok(self.default.clone()),
                Ok(name) => Err(Error::UnknownTenant(name.to_string())),
                Err(_) => Err(Error::UnknownTenant(
                    String::from_utf8_lossy(v.as_bytes()).into(),
                )),
            },
        }
    }
}

/// The token a request of tenant `t` carries, if the tenant's auth is enabled (a token is
/// ignored otherwise, as etcd ignores it).
fn token_of<'m>(t: &Tenant, metadata: &'m MetadataMap) -> Result<Option<&'m str>, Error> {
    if !t.replica.auth_enabled() {
        return Ok(None);
    }
    let Some(token) = TOKEN_KEYS.iter().find_map(|k| metadata.get(*k)) else {
        return Ok(None);
    };
    let token = token.to_str().map_err(|_| Error::InvalidAuthToken)?;
    // The gateway's `Authorization` may say `Bearer <token>`.
    Ok(Some(token.strip_prefix("Bearer ").unwrap_or(token)))
}

impl WatchSource for Tenants {
    fn resolve(&self, metadata: &MetadataMap) -> Result<WatchTarget, tonic::Status> {
        let tenant = Tenants::resolve(self, metadata).map_err(crate::rpc::handled)?;
        let caller = self
            .identify(&tenant, metadata)
            .map_err(crate::rpc::handled)?;
        Ok(WatchTarget {
            caller,
            store: tenant.replica.store().clone(),
            hub: tenant.replica.hub().clone(),
            header: tenant.header(0),
        })
    }

    fn has_leader(&self, metadata: &MetadataMap) -> bool {
        Tenants::resolve(self, metadata).is_ok_and(|t| t.has_leader())
    }
}

/// The caller a request carrying `token` is served as (unit tests).
#[cfg(test)]
pub(crate) async fn tests_caller(tenants: &Tenants, t: &Tenant, token: &str) -> Caller {
    let mut metadata = MetadataMap::new();
    metadata.insert("token", token.parse().expect("ascii token"));
    tenants.caller(t, &metadata).await.expect("a valid token")
}
