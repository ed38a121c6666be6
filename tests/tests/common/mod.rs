//! Helpers shared by the `etcd-client` and Kubernetes-contract suites: a started target with a
//! connected client, and the gRPC status of a failed call.

#![allow(dead_code)] // each test file uses its own subset

use std::time::Duration;

use etcd_client::{Client, ConnectOptions, Error};
use strata_tests::target::Target;
use tonic::Code;

/// Per-request timeout of the test clients (generous: noisy 2-core CI).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a watch may take to deliver what it must deliver.
pub const WATCH_TIMEOUT: Duration = Duration::from_secs(30);

/// Starts a fresh target (Strata by default, etcd with `STRATA_TEST_TARGET=etcd`) and connects.
pub async fn start() -> (Target, Client) {
    let target = Target::start().await;
    let client = connect(target.endpoint()).await;
    (target, client)
}

pub async fn connect(endpoint: &str) -> Client {
    Client::connect(
        [endpoint],
        Some(
            ConnectOptions::new()
                .with_timeout(REQUEST_TIMEOUT)
                .with_connect_timeout(REQUEST_TIMEOUT),
        ),
    )
    .await
    .unwrap_or_else(|e| panic!("connect to {endpoint}: {e}"))
}

/// The gRPC code and message of a failed call; panics on success or a non-gRPC error.
pub fn status<T: std::fmt::Debug>(r: Result<T, Error>) -> (Code, String) {
    match r {
        Ok(v) => panic!("expected a gRPC error, got Ok({v:?})"),
        Err(Error::GRpcStatus(s)) => (s.code(), s.message().to_string()),
        Err(e) => panic!("expected a gRPC status, got {e:?}"),
    }
}

/// Asserts that a call failed with exactly etcd's code and message.
#[track_caller]
pub fn assert_status<T: std::fmt::Debug>(r: Result<T, Error>, code: Code, message: &str) {
    let (c, m) = status(r);
    assert_eq!((c, m.as_str()), (code, message));
}

/// The header revision of a response header.
pub fn rev(h: Option<&etcd_client::ResponseHeader>) -> i64 {
    h.expect("response header").revision()
}

/// Turns auth on with `root` (password `rootpw`) and `user` (`password`), `user` holding the
/// role `role` with `perms`.
pub async fn enable_auth(
    admin: &mut Client,
    (user, password): (&str, &str),
    role: &str,
    perms: &[etcd_client::Permission],
) {
    admin.user_add("root", "rootpw", None).await.unwrap();
    admin.user_grant_role("root", "root").await.unwrap();
    admin.user_add(user, password, None).await.unwrap();
    admin.role_add(role).await.unwrap();
    for perm in perms {
        admin
            .role_grant_permission(role, perm.clone())
            .await
            .unwrap();
    }
    admin.user_grant_role(user, role).await.unwrap();
    admin.auth_enable().await.unwrap();
}

/// A client of `endpoint` logged in as `user`.
pub async fn login(endpoint: &str, user: &str, password: &str) -> Client {
    let options = ConnectOptions::new()
        .with_user(user, password)
        .with_timeout(REQUEST_TIMEOUT);
    Client::connect([endpoint], Some(options))
        .await
        .unwrap_or_else(|e| panic!("log in to {endpoint} as {user}: {e}"))
}
