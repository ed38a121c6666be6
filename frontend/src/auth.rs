//! The etcd `Auth` service. Users, roles and key permissions are the tenant's state: every
//! change is journalled as an `AuthChange` and applied by each replica's memstore with etcd's
//! checks and errors (docs/design/auth.md, A1), and every read answers the replica's state
//! after a read barrier (etcd serves its auth reads through raft, so they are linearizable).
//! Passwords are hashed here with bcrypt, as etcd 3.5's server does before proposing, and only
//! the hash enters the journal (A2).
//!
//! Enforcement (tokens, permission checks on every request) is the next step of the design;
//! until it lands, AuthEnable answers etcd's refusals (no root user, no root role) and
//! otherwise `Unimplemented`: auth is never reported enabled while nothing checks it.
//! Authenticate answers "authentication is not enabled", on which clientv3 and etcdctl go on
//! without a token, so a client configured with credentials works as against such an etcd.

use std::sync::Arc;

use api::etcdserverpb::auth_server::Auth;
use api::etcdserverpb::{
    AuthDisableRequest, AuthDisableResponse, AuthEnableRequest, AuthEnableResponse,
    AuthRoleAddRequest, AuthRoleAddResponse, AuthRoleDeleteRequest, AuthRoleDeleteResponse,
    AuthRoleGetRequest, AuthRoleGetResponse, AuthRoleGrantPermissionRequest,
    AuthRoleGrantPermissionResponse, AuthRoleListRequest, AuthRoleListResponse,
    AuthRoleRevokePermissionRequest, AuthRoleRevokePermissionResponse, AuthStatusRequest,
    AuthStatusResponse, AuthUserAddRequest, AuthUserAddResponse, AuthUserChangePasswordRequest,
    AuthUserChangePasswordResponse, AuthUserDeleteRequest, AuthUserDeleteResponse,
    AuthUserGetRequest, AuthUserGetResponse, AuthUserGrantRoleRequest, AuthUserGrantRoleResponse,
    AuthUserListRequest, AuthUserListResponse, AuthUserRevokeRoleRequest,
    AuthUserRevokeRoleResponse, AuthenticateRequest, AuthenticateResponse, ResponseHeader,
};
use api::strata::entry::{AuthChange, auth_change::Change, entry::Request as Intent};
use base64::Engine;
use memstore::{MemStore, Outcome};
use tonic::{Request, Response, Status};

use crate::errors::Error;
use crate::rpc::{RequestId, handled, unary};
use crate::tenant::Tenant;
use crate::tenants::Tenants;

/// etcd's default bcrypt cost (`--bcrypt-cost`; Go's `bcrypt.DefaultCost`).
pub const DEFAULT_BCRYPT_COST: u32 = 10;
/// The costs bcrypt accepts (Go's `bcrypt.MinCost` and `MaxCost`).
pub const BCRYPT_COSTS: std::ops::RangeInclusive<u32> = 4..=31;

/// The longest password bcrypt hashes whole; Go's bcrypt refuses longer ones.
const MAX_PASSWORD_BYTES: usize = 72;

/// The Auth service of a frontend's tenants.
pub struct AuthService {
    tenants: Arc<Tenants>,
    bcrypt_cost: u32,
}

impl AuthService {
    pub fn new(tenants: Arc<Tenants>) -> Self {
        Self::with_bcrypt_cost(tenants, DEFAULT_BCRYPT_COST)
    }

    /// A service hashing passwords at `cost` (etcd's `--bcrypt-cost`, 4 to 31).
    pub fn with_bcrypt_cost(tenants: Arc<Tenants>, cost: u32) -> Self {
        Self {
            tenants,
            bcrypt_cost: cost,
        }
    }

    fn tenant<T>(&self, req: &Request<T>) -> Result<Arc<Tenant>, Status> {
        self.tenants.resolve(req.metadata()).map_err(handled)
    }

    /// Answers a read of the auth state with `answer(replica, header)` after a read barrier.
    async fn read<R, T, F>(
        &self,
        rpc: &'static str,
        req: Request<R>,
        answer: F,
    ) -> Result<Response<T>, Status>
    where
        F: FnOnce(&MemStore, R, ResponseHeader) -> Result<T, Error>,
    {
        let t = self.tenant(&req)?;
        let req = req.into_inner();
        unary(rpc, &t.name, RequestId::random(), async {
            t.barrier().await?;
            let store = t.replica.read();
            answer(&store, req, t.header(store.revision()))
        })
        .await
    }

    /// Journals `change` and answers `answer(header)` once this replica applied it.
    async fn change<R, T, F>(
        &self,
        rpc: &'static str,
        req: Request<R>,
        change: impl FnOnce(R) -> Change,
        answer: F,
    ) -> Result<Response<T>, Status>
    where
        F: FnOnce(ResponseHeader) -> T,
    {
        let t = self.tenant(&req)?;
        let change = change(req.into_inner());
        let id = RequestId::random();
        unary(rpc, &t.name, id, apply(&t, id, change, answer)).await
    }

    /// Hashes `password` as etcd 3.5's server does before proposing: bcrypt at the configured
    /// cost, base64, on the blocking pool (tens of milliseconds of CPU).
    async fn hash(&self, password: String) -> Result<String, Error> {
        if password.len() > MAX_PASSWORD_BYTES {
            return Err(Error::PasswordTooLong(password.len()));
        }
        let cost = self.bcrypt_cost;
        let hashed = tokio::task::spawn_blocking(move || {
            bcrypt::hash_with_result(password, cost)
                .map(|h| h.format_for_version(bcrypt::Version::TwoA))
        })
        .await
        .map_err(|e| Error::Task(format!("hashing a password: {e}")))?
        .map_err(|e| Error::Task(format!("hashing a password: {e}")))?;
        Ok(base64::engine::general_purpose::STANDARD.encode(hashed))
    }
}

/// Proposes one auth change and answers with its outcome.
async fn apply<T>(
    t: &Tenant,
    id: RequestId,
    change: Change,
    answer: impl FnOnce(ResponseHeader) -> T,
) -> Result<T, Error> {
    let intent = Intent::Auth(AuthChange {
        change: Some(change),
    });
    let applied = t.propose(&id, intent).await?;
    match applied.outcome {
        Outcome::Auth => Ok(answer(t.header(applied.revision))),
        Outcome::Failed(e) => Err(e.into()),
        _ => Err(Error::UnexpectedOutcome("Auth")),
    }
}

#[tonic::async_trait]
impl Auth for AuthService {
    async fn auth_enable(
        &self,
        req: Request<AuthEnableRequest>,
    ) -> Result<Response<AuthEnableResponse>, Status> {
        // etcd's refusals first (so `etcdctl auth enable` adds the root role when it is
        // missing, as against etcd); then the honest one.
        self.read("AuthEnable", req, |store, _, _| {
            store.auth_check_enable()?;
            Err(Error::AuthUnavailable)
        })
        .await
    }

    async fn auth_disable(
        &self,
        req: Request<AuthDisableRequest>,
    ) -> Result<Response<AuthDisableResponse>, Status> {
        self.change("AuthDisable", req, Change::Disable, |header| {
            AuthDisableResponse {
                header: Some(header),
            }
        })
        .await
    }

    async fn auth_status(
        &self,
        req: Request<AuthStatusRequest>,
    ) -> Result<Response<AuthStatusResponse>, Status> {
        self.read("AuthStatus", req, |store, _, header| {
            Ok(AuthStatusResponse {
                header: Some(header),
                enabled: store.auth_enabled(),
                auth_revision: store.auth_revision(),
            })
        })
        .await
    }

    async fn authenticate(
        &self,
        req: Request<AuthenticateRequest>,
    ) -> Result<Response<AuthenticateResponse>, Status> {
        self.read("Authenticate", req, |store, _, _| {
            if store.auth_enabled() {
                // Enabled by a newer release sharing this journal: this one cannot mint tokens.
                return Err(Error::AuthUnavailable);
            }
            Err(Error::AuthNotEnabled)
        })
        .await
    }

    async fn user_add(
        &self,
        req: Request<AuthUserAddRequest>,
    ) -> Result<Response<AuthUserAddResponse>, Status> {
        let t = self.tenant(&req)?;
        let mut r = req.into_inner();
        let id = RequestId::random();
        unary("UserAdd", &t.name, id, async {
            let no_password = r.options.is_some_and(|o| o.no_password);
            // An empty name is refused at apply; refuse it before paying for a hash.
            if !r.name.is_empty() && !no_password {
                r.hashed_password = self.hash(std::mem::take(&mut r.password)).await?;
            } else {
                r.hashed_password.clear();
            }
            r.password.clear();
            apply(&t, id, Change::UserAdd(r), |header| AuthUserAddResponse {
                header: Some(header),
            })
            .await
        })
        .await
    }

    async fn user_get(
        &self,
        req: Request<AuthUserGetRequest>,
    ) -> Result<Response<AuthUserGetResponse>, Status> {
        self.read("UserGet", req, |store, r, header| {
            let user = store
                .auth_user(&r.name)
                .ok_or(memstore::Error::UserNotFound)?;
            Ok(AuthUserGetResponse {
                header: Some(header),
                roles: user.roles,
            })
        })
        .await
    }

    async fn user_list(
        &self,
        req: Request<AuthUserListRequest>,
    ) -> Result<Response<AuthUserListResponse>, Status> {
        self.read("UserList", req, |store, _, header| {
            Ok(AuthUserListResponse {
                header: Some(header),
                users: store.auth_users(),
            })
        })
        .await
    }

    async fn user_delete(
        &self,
        req: Request<AuthUserDeleteRequest>,
    ) -> Result<Response<AuthUserDeleteResponse>, Status> {
        self.change("UserDelete", req, Change::UserDelete, |header| {
            AuthUserDeleteResponse {
                header: Some(header),
            }
        })
        .await
    }

    async fn user_change_password(
        &self,
        req: Request<AuthUserChangePasswordRequest>,
    ) -> Result<Response<AuthUserChangePasswordResponse>, Status> {
        let t = self.tenant(&req)?;
        let mut r = req.into_inner();
        let id = RequestId::random();
        unary("UserChangePassword", &t.name, id, async {
            // etcd hashes whatever the user's options: a user without a password keeps none
            // at apply.
            r.hashed_password = self.hash(std::mem::take(&mut r.password)).await?;
            apply(&t, id, Change::UserChangePassword(r), |header| {
                AuthUserChangePasswordResponse {
                    header: Some(header),
                }
            })
            .await
        })
        .await
    }

    async fn user_grant_role(
        &self,
        req: Request<AuthUserGrantRoleRequest>,
    ) -> Result<Response<AuthUserGrantRoleResponse>, Status> {
        self.change("UserGrantRole", req, Change::UserGrantRole, |header| {
            AuthUserGrantRoleResponse {
                header: Some(header),
            }
        })
        .await
    }

    async fn user_revoke_role(
        &self,
        req: Request<AuthUserRevokeRoleRequest>,
    ) -> Result<Response<AuthUserRevokeRoleResponse>, Status> {
        self.change("UserRevokeRole", req, Change::UserRevokeRole, |header| {
            AuthUserRevokeRoleResponse {
                header: Some(header),
            }
        })
        .await
    }

    async fn role_add(
        &self,
        req: Request<AuthRoleAddRequest>,
    ) -> Result<Response<AuthRoleAddResponse>, Status> {
        self.change("RoleAdd", req, Change::RoleAdd, |header| {
            AuthRoleAddResponse {
                header: Some(header),
            }
        })
        .await
    }

    async fn role_get(
        &self,
        req: Request<AuthRoleGetRequest>,
    ) -> Result<Response<AuthRoleGetResponse>, Status> {
        self.read("RoleGet", req, |store, r, header| {
            let perm = store
                .auth_role(&r.role)
                .ok_or(memstore::Error::RoleNotFound)?;
            Ok(AuthRoleGetResponse {
                header: Some(header),
                perm,
            })
        })
        .await
    }

    async fn role_list(
        &self,
        req: Request<AuthRoleListRequest>,
    ) -> Result<Response<AuthRoleListResponse>, Status> {
        self.read("RoleList", req, |store, _, header| {
            Ok(AuthRoleListResponse {
                header: Some(header),
                roles: store.auth_roles(),
            })
        })
        .await
    }

    async fn role_delete(
        &self,
        req: Request<AuthRoleDeleteRequest>,
    ) -> Result<Response<AuthRoleDeleteResponse>, Status> {
        self.change("RoleDelete", req, Change::RoleDelete, |header| {
            AuthRoleDeleteResponse {
                header: Some(header),
            }
        })
        .await
    }

    async fn role_grant_permission(
        &self,
        req: Request<AuthRoleGrantPermissionRequest>,
    ) -> Result<Response<AuthRoleGrantPermissionResponse>, Status> {
        self.change(
            "RoleGrantPermission",
            req,
            Change::RoleGrantPermission,
            |header| AuthRoleGrantPermissionResponse {
                header: Some(header),
            },
        )
        .await
    }

    async fn role_revoke_permission(
        &self,
        req: Request<AuthRoleRevokePermissionRequest>,
    ) -> Result<Response<AuthRoleRevokePermissionResponse>, Status> {
        self.change(
            "RoleRevokePermission",
            req,
            Change::RoleRevokePermission,
            |header| AuthRoleRevokePermissionResponse {
                header: Some(header),
            },
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::errors::msg;
    use crate::log::MemLog;
    use api::authpb::{Permission, permission::Type as PermType};
    use tonic::Code;

    /// A service over a fresh tenant (bcrypt's cheapest cost: the tests hash a few times).
    fn service() -> (AuthService, Arc<Tenant>, MemLog) {
        let store = memstore::MemStore::new(memstore::Config::default());
        let log = MemLog::new();
        let tenant = crate::tenant::test_tenant(store, Arc::new(log.clone()), 7, 9);
        let a = AuthService::with_bcrypt_cost(Arc::new(Tenants::new(tenant.clone())), 4);
        (a, tenant, log)
    }

    fn refused<T: std::fmt::Debug>(r: Result<Response<T>, Status>) -> (Code, String) {
        let s = r.unwrap_err();
        (s.code(), s.message().to_string())
    }

    fn failed(m: &str) -> (Code, String) {
        (Code::FailedPrecondition, m.to_string())
    }

    async fn revision(a: &AuthService) -> u64 {
        let r = a.auth_status(Request::new(AuthStatusRequest {})).await;
        let r = r.unwrap().into_inner();
        assert!(!r.enabled);
        r.auth_revision
    }

    /// Users and roles are journalled, applied and read back with etcd's answers; the journal
    /// holds a bcrypt hash of the password, never the password.
    #[tokio::test]
    async fn users_and_roles_are_managed_through_the_journal() {
        let (a, t, log) = service();
        assert_eq!(revision(&a).await, memstore::INITIAL_AUTH_REVISION);
        let add = |name: &str, password: &str| {
            Request::new(AuthUserAddRequest {
                name: name.into(),
                password: password.into(),
                ..Default::default()
            })
        };
        let r = a.user_add(add("alice", "s3cret-pw")).await.unwrap();
        assert_eq!(r.into_inner().header.unwrap().member_id, 9);
        assert_eq!(revision(&a).await, 2);
        assert!(
            !log.holds_bytes(b"s3cret-pw"),
            "the password reached the journal"
        );
        let hash = t.replica.read().auth_user("alice").unwrap().password;
        let hash = String::from_utf8(hash).unwrap();
        assert!(hash.starts_with("$2a$04$"), "{hash}");
        assert!(bcrypt::verify("s3cret-pw", &hash).unwrap());
        assert_eq!(
            refused(a.user_add(add("alice", "x")).await),
            failed("etcdserver: user name already exists")
        );
        assert_eq!(
            refused(a.user_add(add("", "x")).await),
            (
                Code::InvalidArgument,
                "etcdserver: user name is empty".into()
            )
        );
        assert_eq!(
            refused(a.user_add(add("long", &"p".repeat(73))).await),
            (Code::Unknown, msg::PASSWORD_TOO_LONG.into())
        );
        let grant = |role: &str| {
            Request::new(AuthUserGrantRoleRequest {
                user: "alice".into(),
                role: role.into(),
            })
        };
        assert_eq!(
            refused(a.user_grant_role(grant("reader")).await),
            failed("etcdserver: role name not found")
        );
        let role = Request::new(AuthRoleAddRequest {
            name: "reader".into(),
        });
        a.role_add(role).await.unwrap();
        let perm = Permission {
            perm_type: PermType::Read as i32,
            key: b"/registry/".to_vec(),
            range_end: b"/registry0".to_vec(),
        };
        let grant_perm = Request::new(AuthRoleGrantPermissionRequest {
            name: "reader".into(),
            perm: Some(perm.clone()),
        });
        a.role_grant_permission(grant_perm).await.unwrap();
        a.user_grant_role(grant("reader")).await.unwrap();
        let get = Request::new(AuthUserGetRequest {
            name: "alice".into(),
        });
        assert_eq!(
            a.user_get(get).await.unwrap().into_inner().roles,
            ["reader"]
        );
        let get = Request::new(AuthRoleGetRequest {
            role: "reader".into(),
        });
        assert_eq!(a.role_get(get).await.unwrap().into_inner().perm, [perm]);
        let users = a.user_list(Request::new(AuthUserListRequest {})).await;
        assert_eq!(users.unwrap().into_inner().users, ["alice"]);
        let roles = a.role_list(Request::new(AuthRoleListRequest {})).await;
        assert_eq!(roles.unwrap().into_inner().roles, ["reader"]);
        assert_eq!(revision(&a).await, 5);
        let passwd = Request::new(AuthUserChangePasswordRequest {
            name: "alice".into(),
            password: "other-pw".into(),
            ..Default::default()
        });
        a.user_change_password(passwd).await.unwrap();
        let hash = t.replica.read().auth_user("alice").unwrap().password;
        assert!(bcrypt::verify("other-pw", &String::from_utf8(hash).unwrap()).unwrap());
        let del = Request::new(AuthRoleDeleteRequest {
            role: "reader".into(),
        });
        a.role_delete(del).await.unwrap();
        let get = Request::new(AuthUserGetRequest {
            name: "alice".into(),
        });
        assert!(a.user_get(get).await.unwrap().into_inner().roles.is_empty());
        let del = Request::new(AuthUserDeleteRequest {
            name: "alice".into(),
        });
        a.user_delete(del).await.unwrap();
        let get = Request::new(AuthUserGetRequest {
            name: "alice".into(),
        });
        assert_eq!(
            refused(a.user_get(get).await),
            failed("etcdserver: user name not found")
        );
        let get = Request::new(AuthRoleGetRequest {
            role: "reader".into(),
        });
        assert_eq!(
            refused(a.role_get(get).await),
            failed("etcdserver: role name not found")
        );
    }

    /// AuthEnable answers etcd's refusals, then refuses to enable what nothing would enforce;
    /// Authenticate says auth is not enabled; disabling what is disabled succeeds.
    #[tokio::test]
    async fn auth_is_never_enabled_while_nothing_enforces_it() {
        let (a, _, _) = service();
        let enable = || Request::new(AuthEnableRequest {});
        assert_eq!(
            refused(a.auth_enable(enable()).await),
            failed("etcdserver: root user does not exist")
        );
        let add = Request::new(AuthUserAddRequest {
            name: "root".into(),
            password: "pw".into(),
            ..Default::default()
        });
        a.user_add(add).await.unwrap();
        assert_eq!(
            refused(a.auth_enable(enable()).await),
            failed("etcdserver: root user does not have root role")
        );
        let grant = Request::new(AuthUserGrantRoleRequest {
            user: "root".into(),
            role: "root".into(),
        });
        a.user_grant_role(grant).await.unwrap();
        let (code, message) = refused(a.auth_enable(enable()).await);
        assert_eq!(code, Code::Unimplemented);
        assert!(message.contains("auth cannot be enabled yet"), "{message}");
        assert_eq!(revision(&a).await, 3);
        let auth = Request::new(AuthenticateRequest {
            name: "root".into(),
            password: "pw".into(),
        });
        assert_eq!(
            refused(a.authenticate(auth).await),
            failed(msg::AUTH_NOT_ENABLED)
        );
        let disable = a.auth_disable(Request::new(AuthDisableRequest {})).await;
        assert!(disable.is_ok());
        assert_eq!(
            revision(&a).await,
            3,
            "disabling what is disabled is no change"
        );
    }
}
