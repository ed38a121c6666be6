//! The etcd `Auth` service, until the auth model (users, roles, permissions, tokens) lands
//! (docs/design/auth.md). Reads answer the true state, as etcd answers them with auth
//! disabled and no user or role: AuthStatus says disabled, Authenticate "authentication is not
//! enabled" (on which clientv3 and etcdctl go on without a token, so a client configured with
//! credentials works as against such an etcd), the lists are empty, a get finds nothing, and
//! disabling what is disabled succeeds. Every change answers `Unimplemented`: never a fake
//! success, so a client that enables auth or adds a user learns that nothing is enforced.

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
    AuthUserRevokeRoleResponse, AuthenticateRequest, AuthenticateResponse,
};
use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::errors::Error;
use crate::rpc::{RequestId, handled, observe, unary};
use crate::tenant::Tenant;
use crate::tenants::Tenants;

/// etcd's auth revision before any auth change (its store starts at 1).
pub const INITIAL_AUTH_REVISION: u64 = 1;

/// The Auth service of a frontend whose tenants have auth disabled and no users or roles.
pub struct AuthService {
    tenants: Arc<Tenants>,
}

impl AuthService {
    pub fn new(tenants: Arc<Tenants>) -> Self {
        Self { tenants }
    }

    /// Answers a read of the auth state with `answer(header)`, the header at the tenant's
    /// current revision (etcd answers its auth reads from its member's state).
    async fn read<T, F>(
        &self,
        rpc: &'static str,
        req: &Request<impl Sized>,
        answer: F,
    ) -> Result<Response<T>, Status>
    where
        F: FnOnce(api::etcdserverpb::ResponseHeader) -> Result<T, Error>,
    {
        let t: Arc<Tenant> = self.tenants.resolve(req.metadata()).map_err(handled)?;
        unary(rpc, &t.name, RequestId::random(), async {
            let revision = t.replica.read().revision();
            answer(t.header(revision))
        })
        .await
    }
}

fn refuse<T>(rpc: &'static str) -> Result<Response<T>, Status> {
    let start = std::time::Instant::now();
    let status = handled(Error::AuthUnavailable);
    observe(rpc, "", start, Some(status.code()));
    Err(status)
}

#[tonic::async_trait]
impl Auth for AuthService {
    async fn auth_enable(
        &self,
        _req: Request<AuthEnableRequest>,
    ) -> Result<Response<AuthEnableResponse>, Status> {
        refuse("AuthEnable")
    }

    async fn auth_disable(
        &self,
        req: Request<AuthDisableRequest>,
    ) -> Result<Response<AuthDisableResponse>, Status> {
        // Disabling what is disabled succeeds, as in etcd.
        self.read("AuthDisable", &req, |header| {
            Ok(AuthDisableResponse {
                header: Some(header),
            })
        })
        .await
    }

    async fn auth_status(
        &self,
        req: Request<AuthStatusRequest>,
    ) -> Result<Response<AuthStatusResponse>, Status> {
        self.read("AuthStatus", &req, |header| {
            Ok(AuthStatusResponse {
                header: Some(header),
                enabled: false,
                auth_revision: INITIAL_AUTH_REVISION,
            })
        })
        .await
    }

    async fn authenticate(
        &self,
        req: Request<AuthenticateRequest>,
    ) -> Result<Response<AuthenticateResponse>, Status> {
        self.read("Authenticate", &req, |_| Err(Error::AuthNotEnabled))
            .await
    }

    async fn user_add(
        &self,
        _req: Request<AuthUserAddRequest>,
    ) -> Result<Response<AuthUserAddResponse>, Status> {
        refuse("UserAdd")
    }

    async fn user_get(
        &self,
        req: Request<AuthUserGetRequest>,
    ) -> Result<Response<AuthUserGetResponse>, Status> {
        self.read("UserGet", &req, |_| Err(Error::AuthUserNotFound))
            .await
    }

    async fn user_list(
        &self,
        req: Request<AuthUserListRequest>,
    ) -> Result<Response<AuthUserListResponse>, Status> {
        self.read("UserList", &req, |header| {
            Ok(AuthUserListResponse {
                header: Some(header),
                users: Vec::new(),
            })
        })
        .await
    }

    async fn user_delete(
        &self,
        _req: Request<AuthUserDeleteRequest>,
    ) -> Result<Response<AuthUserDeleteResponse>, Status> {
        refuse("UserDelete")
    }

    async fn user_change_password(
        &self,
        _req: Request<AuthUserChangePasswordRequest>,
    ) -> Result<Response<AuthUserChangePasswordResponse>, Status> {
        refuse("UserChangePassword")
    }

    async fn user_grant_role(
        &self,
        _req: Request<AuthUserGrantRoleRequest>,
    ) -> Result<Response<AuthUserGrantRoleResponse>, Status> {
        refuse("UserGrantRole")
    }

    async fn user_revoke_role(
        &self,
        _req: Request<AuthUserRevokeRoleRequest>,
    ) -> Result<Response<AuthUserRevokeRoleResponse>, Status> {
        refuse("UserRevokeRole")
    }

    async fn role_add(
        &self,
        _req: Request<AuthRoleAddRequest>,
    ) -> Result<Response<AuthRoleAddResponse>, Status> {
        refuse("RoleAdd")
    }

    async fn role_get(
        &self,
        req: Request<AuthRoleGetRequest>,
    ) -> Result<Response<AuthRoleGetResponse>, Status> {
        self.read("RoleGet", &req, |_| Err(Error::AuthRoleNotFound))
            .await
    }

    async fn role_list(
        &self,
        req: Request<AuthRoleListRequest>,
    ) -> Result<Response<AuthRoleListResponse>, Status> {
        self.read("RoleList", &req, |header| {
            Ok(AuthRoleListResponse {
                header: Some(header),
                roles: Vec::new(),
            })
        })
        .await
    }

    async fn role_delete(
        &self,
        _req: Request<AuthRoleDeleteRequest>,
    ) -> Result<Response<AuthRoleDeleteResponse>, Status> {
        refuse("RoleDelete")
    }

    async fn role_grant_permission(
        &self,
        _req: Request<AuthRoleGrantPermissionRequest>,
    ) -> Result<Response<AuthRoleGrantPermissionResponse>, Status> {
        refuse("RoleGrantPermission")
    }

    async fn role_revoke_permission(
        &self,
        _req: Request<AuthRoleRevokePermissionRequest>,
    ) -> Result<Response<AuthRoleRevokePermissionResponse>, Status> {
        refuse("RoleRevokePermission")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::errors::msg;
    use crate::log::MemLog;
    use tonic::Code;

    fn service() -> AuthService {
        let store = memstore::MemStore::new(memstore::Config::default());
        let tenant = crate::tenant::test_tenant(store, Arc::new(MemLog::new()), 7, 9);
        AuthService::new(Arc::new(Tenants::new(tenant)))
    }

    /// Reads answer what etcd answers with auth disabled and no user or role; changes are
    /// refused as not available.
    #[tokio::test]
    async fn reads_answer_the_disabled_state_and_changes_are_unimplemented() {
        let a = service();
        let status = a
            .auth_status(Request::new(AuthStatusRequest {}))
            .await
            .unwrap()
            .into_inner();
        assert!(!status.enabled);
        assert_eq!(status.auth_revision, INITIAL_AUTH_REVISION);
        assert_eq!(status.header.unwrap().member_id, 9);
        let s = a
            .authenticate(Request::new(AuthenticateRequest::default()))
            .await
            .unwrap_err();
        assert_eq!(
            (s.code(), s.message()),
            (Code::FailedPrecondition, msg::AUTH_NOT_ENABLED)
        );
        let users = a.user_list(Request::new(AuthUserListRequest {})).await;
        assert!(users.unwrap().into_inner().users.is_empty());
        let roles = a.role_list(Request::new(AuthRoleListRequest {})).await;
        assert!(roles.unwrap().into_inner().roles.is_empty());
        let s = a
            .user_get(Request::new(AuthUserGetRequest::default()))
            .await
            .unwrap_err();
        assert_eq!(
            (s.code(), s.message()),
            (Code::FailedPrecondition, msg::USER_NOT_FOUND)
        );
        let s = a
            .role_get(Request::new(AuthRoleGetRequest::default()))
            .await
            .unwrap_err();
        assert_eq!(
            (s.code(), s.message()),
            (Code::FailedPrecondition, msg::ROLE_NOT_FOUND)
        );
        assert!(
            a.auth_disable(Request::new(AuthDisableRequest {}))
                .await
                .is_ok()
        );
        let s = a
            .auth_enable(Request::new(AuthEnableRequest {}))
            .await
            .unwrap_err();
        assert_eq!(s.code(), Code::Unimplemented);
        assert!(s.message().contains("auth"), "{}", s.message());
        let s = a
            .user_add(Request::new(AuthUserAddRequest::default()))
            .await
            .unwrap_err();
        assert_eq!(s.code(), Code::Unimplemented);
        let s = a
            .role_add(Request::new(AuthRoleAddRequest::default()))
            .await
            .unwrap_err();
        assert_eq!(s.code(), Code::Unimplemented);
    }
}
