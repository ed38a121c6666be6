//! The etcd `Auth` service, until the auth model (users, roles, permissions, tokens) lands:
//! every RPC answers `Unimplemented` with a message saying so. Never a fake success: a client
//! that enables auth must learn that nothing is enforced.

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
use tonic::{Request, Response, Status};

use crate::errors::Error;
use crate::rpc::{handled, observe};

/// Answers every Auth RPC with `Unimplemented`.
#[derive(Debug, Default)]
pub struct AuthService;

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
        _req: Request<AuthDisableRequest>,
    ) -> Result<Response<AuthDisableResponse>, Status> {
        refuse("AuthDisable")
    }

    async fn auth_status(
        &self,
        _req: Request<AuthStatusRequest>,
    ) -> Result<Response<AuthStatusResponse>, Status> {
        refuse("AuthStatus")
    }

    async fn authenticate(
        &self,
        _req: Request<AuthenticateRequest>,
    ) -> Result<Response<AuthenticateResponse>, Status> {
        refuse("Authenticate")
    }

    async fn user_add(
        &self,
        _req: Request<AuthUserAddRequest>,
    ) -> Result<Response<AuthUserAddResponse>, Status> {
        refuse("UserAdd")
    }

    async fn user_get(
        &self,
        _req: Request<AuthUserGetRequest>,
    ) -> Result<Response<AuthUserGetResponse>, Status> {
        refuse("UserGet")
    }

    async fn user_list(
        &self,
        _req: Request<AuthUserListRequest>,
    ) -> Result<Response<AuthUserListResponse>, Status> {
        refuse("UserList")
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
        _req: Request<AuthRoleGetRequest>,
    ) -> Result<Response<AuthRoleGetResponse>, Status> {
        refuse("RoleGet")
    }

    async fn role_list(
        &self,
        _req: Request<AuthRoleListRequest>,
    ) -> Result<Response<AuthRoleListResponse>, Status> {
        refuse("RoleList")
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

    #[tokio::test]
    async fn every_auth_rpc_is_unimplemented() {
        let a = AuthService;
        let s = a
            .auth_enable(Request::new(AuthEnableRequest {}))
            .await
            .unwrap_err();
        assert_eq!(s.code(), tonic::Code::Unimplemented);
        assert!(s.message().contains("auth"), "{}", s.message());
        let s = a
            .auth_status(Request::new(AuthStatusRequest {}))
            .await
            .unwrap_err();
        assert_eq!(s.code(), tonic::Code::Unimplemented);
        let s = a
            .user_add(Request::new(AuthUserAddRequest::default()))
            .await
            .unwrap_err();
        assert_eq!(s.code(), tonic::Code::Unimplemented);
    }
}
