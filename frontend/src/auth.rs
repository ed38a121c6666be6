//! The etcd `Auth` service, and `Caller`, who a request comes from. Users, roles and key
//! permissions are the tenant's state: every change is journalled as an `AuthChange` and
//! applied by each replica's memstore with etcd's checks and errors (docs/design/auth.md, A1),
//! and every read answers the replica's state after a read barrier (etcd serves its auth reads
//! through raft, so they are linearizable). Passwords are hashed here with bcrypt, as etcd
//! 3.5's server does before proposing, and only the hash enters the journal (A2).
//! Authenticate checks a password against the replica and signs a token (`crate::token`) that
//! every frontend of the deployment accepts (A3); `Tenants::caller` turns a request's token
//! back into its caller, whose permissions the services check (A4 to A6).

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
use crate::rpc::{RequestId, unary};
use crate::tenant::Tenant;
use crate::tenants::Tenants;

/// etcd's default bcrypt cost (`--bcrypt-cost`; Go's `bcrypt.DefaultCost`).
pub const DEFAULT_BCRYPT_COST: u32 = 10;
/// The costs bcrypt accepts (Go's `bcrypt.MinCost` and `MaxCost`).
pub const BCRYPT_COSTS: std::ops::RangeInclusive<u32> = 4..=31;

/// The longest password bcrypt hashes whole; Go's bcrypt refuses longer ones.
const MAX_PASSWORD_BYTES: usize = 72;

/// Who sent a request: the user and auth revision its verified token names (etcd's
/// `AuthInfo`), or nobody (no token, or the tenant's auth disabled). See `Tenants::caller`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Caller {
    pub user: String,
    pub revision: u64,
}

impl Caller {
    pub fn as_store(&self) -> memstore::Caller<'_> {
        memstore::Caller {
            user: &self.user,
            revision: self.revision,
        }
    }
}

/// The Auth service of a frontend's tenants.
pub struct AuthService {
    tenants: Arc<Tenants>,
    bcrypt_cost: u32,
    /// bcrypt runs (hashes and checks) at once: one per core. bcrypt costs tens of
    /// milliseconds of CPU on purpose; without a bound a burst of Authenticate calls (a
    /// password-guessing client, a fleet of clients re-authenticating after an auth change)
    /// would take every core from the tenants' reads and writes. Beyond it they queue.
    bcrypt_slots: tokio::sync::Semaphore,
}

impl AuthService {
    pub fn new(tenants: Arc<Tenants>) -> Self {
        Self::with_bcrypt_cost(tenants, DEFAULT_BCRYPT_COST)
    }

    /// A service hashing passwords at `cost` (etcd's `--bcrypt-cost`, 4 to 31).
    pub fn with_bcrypt_cost(tenants: Arc<Tenants>, cost: u32) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self {
            tenants,
            bcrypt_cost: cost,
            bcrypt_slots: tokio::sync::Semaphore::new(cores),
        }
    }

    /// Runs one bcrypt operation on the blocking pool, within `bcrypt_slots`.
    async fn bcrypt<T: Send + 'static>(
        &self,
        what: &str,
        run: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, Error> {
        let _slot = self
            .bcrypt_slots
            .acquire()
            .await
            .map_err(|e| Error::Task(format!("{what}: {e}")))?;
        tokio::task::spawn_blocking(run)
            .await
            .map_err(|e| Error::Task(format!("{what}: {e}")))
    }

    /// Answers a read of the auth state with `answer(replica, caller, request, header)` after
    /// a read barrier.
    async fn read<R, T, F>(
        &self,
        rpc: &'static str,
        req: Request<R>,
        answer: F,
    ) -> Result<Response<T>, Status>
    where
        F: FnOnce(&MemStore, &Caller, R, ResponseHeader) -> Result<T, Error>,
    {
        self.tenants
            .serve_request(rpc, req, |t, _, caller, r| async move {
                t.read_point().await?;
                let store = t.replica.read();
                answer(&store, &caller, r, t.header(store.revision()))
            })
            .await
    }

    /// Journals `change` and answers `answer(header)` once this replica applied it (the
    /// change needs the root role while auth is enabled: checked when it is applied).
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
        self.tenants
            .serve_request(rpc, req, |t, id, caller, r| async move {
                apply(&t, id, &caller, change(r), answer).await
            })
            .await
    }

    /// A change carrying a password: hashed here first, as etcd 3.5's server does, but only
    /// for a caller allowed to make it (bcrypt's CPU is not spent for a refused request).
    async fn change_with_password<R, T>(
        &self,
        rpc: &'static str,
        req: Request<R>,
        hash_into: impl FnOnce(&mut R) -> Option<&mut String>,
        change: impl FnOnce(R) -> Change,
        answer: impl FnOnce(ResponseHeader) -> T,
    ) -> Result<Response<T>, Status> {
        self.tenants
            .serve_request(rpc, req, |t, id, caller, mut r| async move {
                t.replica.read().check_admin(&caller.user)?;
                if let Some(password) = hash_into(&mut r) {
                    *password = self.hash(std::mem::take(password)).await?;
                }
                apply(&t, id, &caller, change(r), answer).await
            })
            .await
    }

    /// Hashes `password` as etcd 3.5's server does before proposing: bcrypt at the configured
    /// cost, base64, on the blocking pool (tens of milliseconds of CPU).
    async fn hash(&self, password: String) -> Result<String, Error> {
        if password.len() > MAX_PASSWORD_BYTES {
            return Err(Error::PasswordTooLong(password.len()));
        }
        let cost = self.bcrypt_cost;
        let hashed = self
            .bcrypt("hashing a password", move || {
                bcrypt::hash_with_result(password, cost)
                    .map(|h| h.format_for_version(bcrypt::Version::TwoA))
            })
            .await?
            .map_err(|e| Error::Task(format!("hashing a password: {e}")))?;
        Ok(base64::engine::general_purpose::STANDARD.encode(hashed))
    }

    /// etcd's Authenticate: the user exists, has a password, and it matches (bcrypt, on the
    /// blocking pool); then a token minted at the auth revision the password was read at.
    /// No journal entry: any frontend verifies the token by its signature (A3).
    async fn authenticate_user(
        &self,
        t: &Tenant,
        name: String,
        password: String,
    ) -> Result<AuthenticateResponse, Error> {
        t.barrier().await?;
        let (user, revision) = {
            let store = t.replica.read();
            if !store.auth_enabled() {
                return Err(Error::AuthNotEnabled);
            }
            (store.auth_user(&name), store.auth_revision())
        };
        let tokens = self.tenants.tokens().ok_or(Error::NoTokenKey)?;
        let user = user.ok_or(Error::AuthFailed)?;
        if user.options.is_some_and(|o| o.no_password) {
            return Err(memstore::Error::NoPasswordUser.into());
        }
        let credential = crate::token::credential_of(&user.password);
        let hash = String::from_utf8(user.password).map_err(|_| Error::AuthFailed)?;
        let matches = self
            .bcrypt("checking a password", move || {
                bcrypt::verify(password, &hash)
            })
            .await?;
        if !matches.unwrap_or(false) {
            tracing::info!(user = %name, "invalid password");
            return Err(Error::AuthFailed);
        }
        let (store_revision, now_ms) = {
            let store = t.replica.read();
            (store.revision(), store.time_ms())
        };
        Ok(AuthenticateResponse {
            header: Some(t.header(store_revision)),
            token: tokens.sign(&t.key, &name, &credential, revision, now_ms),
        })
    }
}

/// Proposes one auth change and answers with its outcome.
async fn apply<T>(
    t: &Tenant,
    id: RequestId,
    caller: &Caller,
    change: Change,
    answer: impl FnOnce(ResponseHeader) -> T,
) -> Result<T, Error> {
    let intent = Intent::Auth(AuthChange {
        change: Some(change),
    });
    let applied = t.propose(&id, caller, intent).await?;
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
        let tokens = self.tenants.tokens();
        self.tenants
            .serve_request("AuthEnable", req, |t, id, caller, r| async move {
                t.barrier().await?;
                {
                    let store = t.replica.read();
                    if !store.auth_enabled() {
                        // etcd's refusals first (on which `etcdctl auth enable` adds and grants the
                        // root role by itself), then ours: a frontend that could not verify the
                        // tokens of an enabled tenant must not enable it.
                        store.auth_check_enable()?;
                        tokens.ok_or(Error::NoTokenKey)?;
                    }
                }
                apply(&t, id, &caller, Change::Enable(r), |header| {
                    AuthEnableResponse {
                        header: Some(header),
                    }
                })
                .await
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
        self.read("AuthStatus", req, |store, caller, _, header| {
            store.check_admin(&caller.user)?;
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
        let t = self.tenants.admitted(req.metadata()).await?;
        let r = req.into_inner();
        unary(
            "Authenticate",
            &t.name,
            RequestId::random(),
            self.authenticate_user(&t, r.name, r.password),
        )
        .await
    }

    async fn user_add(
        &self,
        req: Request<AuthUserAddRequest>,
    ) -> Result<Response<AuthUserAddResponse>, Status> {
        self.change_with_password(
            "UserAdd",
            req,
            |r| {
                let no_password = r.options.is_some_and(|o| o.no_password);
                r.hashed_password = std::mem::take(&mut r.password);
                // An empty name is refused at apply: no hash is paid for it.
                if r.name.is_empty() || no_password {
                    r.hashed_password.clear();
                    return None;
                }
                Some(&mut r.hashed_password)
            },
            Change::UserAdd,
            |header| AuthUserAddResponse {
                header: Some(header),
            },
        )
        .await
    }

    async fn user_get(
        &self,
        req: Request<AuthUserGetRequest>,
    ) -> Result<Response<AuthUserGetResponse>, Status> {
        self.read("UserGet", req, |store, caller, r, header| {
            store.check_admin_or(&caller.user, |me| me == r.name)?;
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
        self.read("UserList", req, |store, caller, _, header| {
            store.check_admin(&caller.user)?;
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
        // etcd hashes whatever the user's options: a user without a password keeps none at
        // apply.
        self.change_with_password(
            "UserChangePassword",
            req,
            |r| {
                r.hashed_password = std::mem::take(&mut r.password);
                Some(&mut r.hashed_password)
            },
            Change::UserChangePassword,
            |header| AuthUserChangePasswordResponse {
                header: Some(header),
            },
        )
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
        self.read("RoleGet", req, |store, caller, r, header| {
            store.check_admin_or(&caller.user, |me| store.auth_has_role(me, &r.role))?;
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
        self.read("RoleList", req, |store, caller, _, header| {
            store.check_admin(&caller.user)?;
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

    /// A service whose frontend has a token key.
    fn service_with_tokens() -> (AuthService, Arc<Tenant>) {
        let store = memstore::MemStore::new(memstore::Config::default());
        let log = MemLog::new();
        let tenant = crate::tenant::test_tenant(store, Arc::new(log), 7, 9);
        let tokens = crate::token::Tokens::new(&[7; 32], crate::token::DEFAULT_TOKEN_TTL);
        let tenants = Tenants::new(tenant.clone()).with_tokens(Some(Arc::new(tokens)));
        (AuthService::with_bcrypt_cost(Arc::new(tenants), 4), tenant)
    }

    fn with_token<T>(message: T, token: &str) -> Request<T> {
        let mut r = Request::new(message);
        r.metadata_mut().insert("token", token.parse().unwrap());
        r
    }

    /// AuthEnable answers etcd's refusals, then needs the frontend's token key; enabled,
    /// Authenticate checks the password and hands out a token, and the auth RPCs need the
    /// root role (a user may read itself and its own roles).
    #[tokio::test]
    async fn enabling_authenticating_and_the_root_role() {
        let (bare, _, _) = service();
        let enable = || Request::new(AuthEnableRequest {});
        assert_eq!(
            refused(bare.auth_enable(enable()).await),
            failed("etcdserver: root user does not exist")
        );
        let user = |name: &str, password: &str| {
            Request::new(AuthUserAddRequest {
                name: name.into(),
                password: password.into(),
                ..Default::default()
            })
        };
        bare.user_add(user("root", "pw")).await.unwrap();
        assert_eq!(
            refused(bare.auth_enable(enable()).await),
            failed("etcdserver: root user does not have root role")
        );
        let to_root = || {
            Request::new(AuthUserGrantRoleRequest {
                user: "root".into(),
                role: "root".into(),
            })
        };
        bare.user_grant_role(to_root()).await.unwrap();
        let (code, message) = refused(bare.auth_enable(enable()).await);
        assert_eq!(code, Code::FailedPrecondition);
        assert!(message.contains("--auth-token-key-file"), "{message}");
        let auth = |name: &str, password: &str| {
            Request::new(AuthenticateRequest {
                name: name.into(),
                password: password.into(),
            })
        };
        assert_eq!(
            refused(bare.authenticate(auth("root", "pw")).await),
            failed(msg::AUTH_NOT_ENABLED)
        );

        let (a, t) = service_with_tokens();
        a.user_add(user("root", "pw")).await.unwrap();
        a.user_add(user("alice", "alice-pw")).await.unwrap();
        a.user_grant_role(to_root()).await.unwrap();
        a.auth_enable(enable()).await.unwrap();
        assert!(t.replica.read().auth_enabled());
        let bad = (Code::InvalidArgument, msg::AUTH_FAILED.to_string());
        assert_eq!(refused(a.authenticate(auth("root", "nope")).await), bad);
        assert_eq!(refused(a.authenticate(auth("nobody", "pw")).await), bad);
        let root = a.authenticate(auth("root", "pw")).await.unwrap();
        let root = root.into_inner().token;
        let alice = a.authenticate(auth("alice", "alice-pw")).await.unwrap();
        let alice = alice.into_inner().token;

        // Without a token, with a forged one, as a user without the root role, as root.
        assert_eq!(
            refused(a.user_list(Request::new(AuthUserListRequest {})).await),
            (
                Code::InvalidArgument,
                "etcdserver: user name is empty".into()
            )
        );
        let forged = format!("{}x", &root[..root.len() - 1]);
        assert_eq!(
            refused(
                a.user_list(with_token(AuthUserListRequest {}, &forged))
                    .await
            ),
            (Code::Unauthenticated, msg::INVALID_AUTH_TOKEN.into())
        );
        assert_eq!(
            refused(
                a.user_list(with_token(AuthUserListRequest {}, &alice))
                    .await
            ),
            (
                Code::PermissionDenied,
                "etcdserver: permission denied".into()
            )
        );
        let users = a.user_list(with_token(AuthUserListRequest {}, &root)).await;
        assert_eq!(users.unwrap().into_inner().users, ["alice", "root"]);
        // alice may read herself, not root.
        let get = |name: &str| AuthUserGetRequest { name: name.into() };
        assert!(a.user_get(with_token(get("alice"), &alice)).await.is_ok());
        assert_eq!(
            refused(a.user_get(with_token(get("root"), &alice)).await).0,
            Code::PermissionDenied
        );
        // Changes need the root role too, checked as they are applied.
        let role = AuthRoleAddRequest { name: "r".into() };
        assert_eq!(
            refused(a.role_add(with_token(role.clone(), &alice)).await).0,
            Code::PermissionDenied
        );
        a.role_add(with_token(role, &root)).await.unwrap();
        // A token is checked against the auth state as it is now: the change did not make it
        // old (as etcd's simple tokens, clients need not authenticate again).
        let caller = crate::tenants::tests_caller(&a.tenants, &t, &root).await;
        assert_eq!(caller.revision, t.replica.read().auth_revision());
        assert_eq!(
            t.replica.read().check_read(caller.as_store(), b"k", b""),
            Ok(())
        );
        // A new password, or the user gone, ends its tokens.
        let passwd = AuthUserChangePasswordRequest {
            name: "alice".into(),
            password: "new-pw".into(),
            ..Default::default()
        };
        a.user_change_password(with_token(passwd, &root))
            .await
            .unwrap();
        let invalid = (Code::Unauthenticated, msg::INVALID_AUTH_TOKEN.to_string());
        let mine = |token: &str| with_token(get("alice"), token);
        assert_eq!(refused(a.user_get(mine(&alice)).await), invalid);
        let alice = a.authenticate(auth("alice", "new-pw")).await.unwrap();
        let alice = alice.into_inner().token;
        assert!(a.user_get(mine(&alice)).await.is_ok());
        let delete = AuthUserDeleteRequest {
            name: "alice".into(),
        };
        a.user_delete(with_token(delete, &root)).await.unwrap();
        assert_eq!(refused(a.user_get(mine(&alice)).await), invalid);
        let status = a.auth_status(with_token(AuthStatusRequest {}, &root)).await;
        let status = status.unwrap().into_inner();
        assert!(status.enabled);
        a.auth_disable(with_token(AuthDisableRequest {}, &root))
            .await
            .unwrap();
        assert!(!t.replica.read().auth_enabled());
        // Disabled, tokens are ignored and nothing is checked.
        assert!(
            a.user_list(with_token(AuthUserListRequest {}, "garbage"))
                .await
                .is_ok()
        );
    }

    /// bcrypt runs within the service's slots: with every slot taken, an Authenticate waits
    /// (it does not spend a core), and goes on once one is free.
    #[tokio::test]
    async fn password_checks_wait_for_a_bcrypt_slot() {
        let (a, _) = service_with_tokens();
        let user = Request::new(AuthUserAddRequest {
            name: "root".into(),
            password: "pw".into(),
            ..Default::default()
        });
        a.user_add(user).await.unwrap();
        let grant = Request::new(AuthUserGrantRoleRequest {
            user: "root".into(),
            role: "root".into(),
        });
        a.user_grant_role(grant).await.unwrap();
        a.auth_enable(Request::new(AuthEnableRequest {}))
            .await
            .unwrap();
        let a = Arc::new(a);
        let all = a.bcrypt_slots.available_permits() as u32;
        let taken = a.bcrypt_slots.acquire_many(all).await.unwrap();
        let login = {
            let a = a.clone();
            tokio::spawn(async move {
                let r = AuthenticateRequest {
                    name: "root".into(),
                    password: "pw".into(),
                };
                a.authenticate(Request::new(r)).await
            })
        };
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert!(!login.is_finished(), "authenticated without a slot");
        drop(taken);
        let token = login.await.unwrap().unwrap().into_inner().token;
        assert!(!token.is_empty());
    }
}
