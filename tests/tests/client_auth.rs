//! Auth across stateless frontends: two `strata frontend` processes of one tenant over three
//! journal nodes, sharing the deployment's token key. A token minted by one is honoured by the
//! other and by a frontend restarted after it was minted; a permission revoked on one is
//! enforced on the other at once, for tokens minted before it too; a password changed on one
//! ends the user's tokens on the other.

use api::authpb::{Permission, permission::Type as PermType};
use api::etcdserverpb::auth_client::AuthClient;
use api::etcdserverpb::kv_client::KvClient;
use api::etcdserverpb::*;
use strata_tests::curl;
use strata_tests::deployment::{Deployment, frontend_args};
use strata_tests::process::{ChildGuard, free_port};
use strata_tests::readiness::tail_file;
use tonic::transport::Channel;
use tonic::{Code, Request};

async fn clients(endpoint: String) -> (AuthClient<Channel>, KvClient<Channel>) {
    let channel = Channel::from_shared(endpoint)
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    (AuthClient::new(channel.clone()), KvClient::new(channel))
}

fn as_user<T>(message: T, token: &str) -> Request<T> {
    let mut r = Request::new(message);
    r.metadata_mut()
        .insert("token", token.parse().expect("ascii token"));
    r
}

async fn login(auth: &mut AuthClient<Channel>, name: &str, password: &str) -> String {
    let r = AuthenticateRequest {
        name: name.into(),
        password: password.into(),
    };
    auth.authenticate(r)
        .await
        .expect("authenticate")
        .into_inner()
        .token
}

fn put(key: &str) -> PutRequest {
    PutRequest {
        key: key.into(),
        value: b"v".to_vec(),
        ..Default::default()
    }
}

fn get(key: &str) -> RangeRequest {
    RangeRequest {
        key: key.into(),
        ..Default::default()
    }
}

fn status<T>(r: Result<tonic::Response<T>, tonic::Status>) -> (Code, String) {
    match r {
        Ok(_) => (Code::Ok, String::new()),
        Err(s) => (s.code(), s.message().to_string()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_and_permissions_hold_across_frontends() {
    let mut d = Deployment::start(2).await;
    let (mut auth0, mut kv0) = clients(d.frontend(0).endpoint()).await;
    let (mut auth1, mut kv1) = clients(d.frontend(1).endpoint()).await;
    // Set up on frontend 0, auth disabled: root, and alice who reads /r/ and writes /w.
    let user = |name: &str| AuthUserAddRequest {
        name: name.into(),
        password: format!("{name}-pw"),
        ..Default::default()
    };
    auth0.user_add(user("root")).await.unwrap();
    auth0.user_add(user("alice")).await.unwrap();
    let grant = |user: &str, role: &str| AuthUserGrantRoleRequest {
        user: user.into(),
        role: role.into(),
    };
    auth0.user_grant_role(grant("root", "root")).await.unwrap();
    let role = AuthRoleAddRequest { name: "app".into() };
    auth0.role_add(role).await.unwrap();
    let perm = |t: PermType, key: &str, end: &str| AuthRoleGrantPermissionRequest {
        name: "app".into(),
        perm: Some(Permission {
            perm_type: t as i32,
            key: key.into(),
            range_end: end.into(),
        }),
    };
    auth0
        .role_grant_permission(perm(PermType::Read, "/r/", "/r0"))
        .await
        .unwrap();
    auth0
        .role_grant_permission(perm(PermType::Write, "/w", ""))
        .await
        .unwrap();
    auth0.user_grant_role(grant("alice", "app")).await.unwrap();
    kv0.put(put("/r/a")).await.unwrap();
    auth0.auth_enable(AuthEnableRequest {}).await.unwrap();

    // Minted on frontend 0, honoured on frontend 1.
    let alice = login(&mut auth0, "alice", "alice-pw").await;
    assert_eq!(
        status(kv1.range(as_user(get("/r/a"), &alice)).await).0,
        Code::Ok
    );
    assert_eq!(
        status(kv1.put(as_user(put("/w"), &alice)).await).0,
        Code::Ok
    );
    let denied = (
        Code::PermissionDenied,
        "etcdserver: permission denied".into(),
    );
    assert_eq!(status(kv1.put(as_user(put("/r/a"), &alice)).await), denied);
    assert_eq!(status(kv1.range(as_user(get("/x"), &alice)).await), denied);
    assert_eq!(
        status(kv1.range(get("/r/a")).await),
        (
            Code::InvalidArgument,
            "etcdserver: user name is empty".into()
        )
    );

    // Root on frontend 1 takes /w away: alice's token, minted before, is denied on frontend 0
    // at once (checked against the auth state as it is now, as etcd's simple tokens are).
    let root = login(&mut auth1, "root", "root-pw").await;
    let revoke = AuthRoleRevokePermissionRequest {
        role: "app".into(),
        key: "/w".into(),
        range_end: Vec::new(),
    };
    auth1
        .role_revoke_permission(as_user(revoke, &root))
        .await
        .unwrap();
    assert_eq!(status(kv0.put(as_user(put("/w"), &alice)).await), denied);
    assert_eq!(
        status(kv0.range(as_user(get("/r/a"), &alice)).await).0,
        Code::Ok
    );
    // A new password, set on frontend 1, ends her tokens on frontend 0 ("invalid auth token":
    // clients authenticate again, and must use the new password).
    let passwd = AuthUserChangePasswordRequest {
        name: "alice".into(),
        password: "new-pw".into(),
        ..Default::default()
    };
    auth1
        .user_change_password(as_user(passwd, &root))
        .await
        .unwrap();
    assert_eq!(
        status(kv0.range(as_user(get("/r/a"), &alice)).await),
        (
            Code::Unauthenticated,
            "etcdserver: invalid auth token".into()
        )
    );
    let alice = login(&mut auth0, "alice", "new-pw").await;
    assert_eq!(
        status(kv0.range(as_user(get("/r/a"), &alice)).await).0,
        Code::Ok
    );

    // A frontend restarted after the token was minted honours it: tokens live in no process.
    d.kill_frontend(1);
    d.restart_frontend(1).await;
    let (_, mut kv1) = clients(d.frontend(1).endpoint()).await;
    assert_eq!(
        status(kv1.range(as_user(get("/r/a"), &alice)).await).0,
        Code::Ok
    );
    // A token that is not the deployment's is refused.
    let forged = format!("{}x", &alice[..alice.len() - 1]);
    assert_eq!(
        status(kv1.range(as_user(get("/r/a"), &forged)).await),
        (
            Code::Unauthenticated,
            "etcdserver: invalid auth token".into()
        )
    );

    // A frontend started without the deployment's token key could verify no token: it says
    // so in its log and stays out of service (`/readyz` 503) instead of refusing everyone.
    let listen = format!("127.0.0.1:{}", free_port());
    let metrics = format!("127.0.0.1:{}", free_port());
    let log = d.dir().join("frontend-keyless.log");
    let _keyless = ChildGuard::strata(
        "frontend-keyless",
        &frontend_args(d.journal_addrs(), &listen, &metrics, &[]),
        Some(&log),
    );
    let readyz = format!("http://{metrics}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let (code, body) = loop {
        let (code, body) = curl::request(&readyz, "GET", "/readyz", "");
        if body.contains("token key") || std::time::Instant::now() > deadline {
            break (code, body);
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert_eq!(code, 503, "{body}\n{}", tail_file(&log));
    assert!(
        body.contains(
            "auth is enabled for tenant default and this frontend has no auth token key (--auth-token-key-file)"
        ),
        "{body}"
    );
    // gRPC health says the same, so a balancer that probes the client port moves on too.
    let channel = tonic::transport::Channel::from_shared(format!("http://{listen}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let status = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: "etcdserverpb.KV".into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status;
        if status == tonic_health::pb::health_check_response::ServingStatus::NotServing as i32 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "gRPC health still says {status} while /readyz refuses"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("not ready: auth is enabled")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no error logged:\n{}",
            tail_file(&log)
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
