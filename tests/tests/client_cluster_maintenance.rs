//! The Cluster and Maintenance services through the `etcd-client` crate: MemberList, Status,
//! Alarm, Defragment, Hash, HashKV; and Strata's own answers where the service manages what an
//! etcd member would (membership, leadership, auth).

mod common;

use common::{assert_status, rev, start, status};
use etcd_client::{AlarmAction, AlarmOptions, AlarmType};
use strata_tests::target::TargetKind;
use tonic::Code;

#[tokio::test]
async fn member_list_names_the_endpoint() {
    let (t, mut c) = start().await;
    let r = c.member_list().await.unwrap();
    let h = r.header().expect("header");
    assert_ne!(h.cluster_id(), 0);
    assert_ne!(h.member_id(), 0);
    assert!(!r.members().is_empty());
    assert!(r.members().iter().all(|m| m.id() != 0));
    assert!(
        r.members()
            .iter()
            .any(|m| m.client_urls().iter().any(|u| u == t.endpoint())),
        "no member serves {}: {:?}",
        t.endpoint(),
        r.members()
    );
    assert!(
        r.members().iter().any(|m| m.id() == h.member_id()),
        "the answering member is listed"
    );
}

#[tokio::test]
async fn status_alarm_defragment() {
    let (_t, mut c) = start().await;
    c.put("s", "1", None).await.unwrap();
    let s = c.status().await.unwrap();
    assert!(s.version().starts_with("3."), "{}", s.version());
    assert!(s.db_size() > 0);
    assert_ne!(s.leader(), 0);
    assert!(s.raft_index() > 0);
    assert!(s.raft_term() > 0);
    assert!(s.errors().is_empty(), "{:?}", s.errors());
    assert!(rev(s.header()) >= 2);

    let alarms = c
        .alarm(AlarmAction::Get, AlarmType::None, None)
        .await
        .unwrap();
    assert_eq!(alarms.alarms().len(), 0, "a fresh cluster has no alarms");
    // Disarming an alarm that is not raised is a no-op success.
    let member = c.member_list().await.unwrap().header().unwrap().member_id();
    let mut opts = AlarmOptions::new();
    opts.with_member(member);
    let disarm = c
        .alarm(AlarmAction::Deactivate, AlarmType::Nospace, Some(opts))
        .await
        .unwrap();
    assert!(disarm.alarms().is_empty());

    // An empty answer, no header, as every etcd since 3.4 sends.
    let defrag = c.defragment().await.unwrap();
    assert!(defrag.header().is_none(), "{defrag:?}");
    c.put("s", "2", None).await.unwrap();
    assert_eq!(c.get("s", None).await.unwrap().kvs()[0].value(), b"2");
}

#[tokio::test]
async fn hash_and_hash_kv_are_stable_at_a_revision() {
    let (t, mut c) = start().await;
    // etcd 3.4 predates HashKVResponse.hash_revision (3.5); Strata speaks 3.5 and fills it.
    let expect_hash_rev = |r: i64| if t.kind() == TargetKind::Etcd { 0 } else { r };
    for i in 0..10 {
        c.put(format!("h/{i}"), format!("v{i}"), None)
            .await
            .unwrap();
    }
    let at = rev(c.put("h/last", "x", None).await.unwrap().header());
    let a = c.hash_kv(at).await.unwrap();
    let b = c.hash_kv(at).await.unwrap();
    assert_eq!(
        a.hash(),
        b.hash(),
        "HashKV at one revision is deterministic"
    );
    assert_eq!(a.hash_revision(), expect_hash_rev(at));
    c.put("h/more", "y", None).await.unwrap();
    let later = c.hash_kv(0).await.unwrap();
    assert_eq!(
        later.hash_revision(),
        expect_hash_rev(at + 1),
        "revision 0 means the latest"
    );
    assert_ne!(later.hash(), a.hash(), "a new write changes the hash");
    let again = c.hash_kv(at).await.unwrap();
    assert_eq!(again.hash(), a.hash(), "history is hashed as it was");
    c.compact(at, None).await.unwrap();
    let compacted = c.hash_kv(0).await.unwrap();
    assert_eq!(compacted.compact_version(), at);
    // Maintenance.Hash: the same with no write in between, another after one.
    let h = c.hash().await.unwrap().hash();
    assert_eq!(c.hash().await.unwrap().hash(), h, "Hash is stable");
    c.put("hash/after", "x", None).await.unwrap();
    assert_ne!(c.hash().await.unwrap().hash(), h, "a write changes Hash");
}

/// A membership change naming an id no member has, and the promotion of a voting member, get
/// etcd's own answers (NotFound "member not found", FailedPrecondition "can only promote a
/// learner member"); neither changes anything, so the test runs against etcd as well.
#[tokio::test]
async fn membership_changes_of_unknown_or_voting_members_get_etcds_answers() {
    let (_t, mut c) = start().await;
    let members = c.member_list().await.unwrap().members().to_vec();
    let own = members[0].id();
    // An id no member has: one more than the largest listed.
    const NOT_FOUND: &str = "etcdserver: member not found";
    let unknown = members
        .iter()
        .map(|m| m.id())
        .max()
        .unwrap()
        .wrapping_add(1);
    assert_status(c.member_remove(unknown).await, Code::NotFound, NOT_FOUND);
    assert_status(
        c.member_update(unknown, vec!["http://127.0.0.1:1".to_string()])
            .await,
        Code::NotFound,
        NOT_FOUND,
    );
    assert_status(c.member_promote(unknown).await, Code::NotFound, NOT_FOUND);
    assert_status(
        c.member_promote(own).await,
        Code::FailedPrecondition,
        "etcdserver: can only promote a learner member",
    );
    let after = c.member_list().await.unwrap().members().to_vec();
    assert_eq!(
        after.iter().map(|m| m.id()).collect::<Vec<_>>(),
        members.iter().map(|m| m.id()).collect::<Vec<_>>(),
        "nothing changed"
    );
}

/// With no auth model yet, Strata's auth state is etcd's with auth disabled and no user or
/// role, and its reads say so as etcd's do: Authenticate "authentication is not enabled" (what
/// lets clientv3 go on without a token), empty lists, nothing found, and disabling succeeds.
/// AuthStatus (etcd 3.5 on) is checked against Strata only.
#[tokio::test]
async fn auth_reads_answer_as_etcd_with_auth_disabled() {
    let (t, mut c) = start().await;
    let mut auth = c.auth_client();
    assert_status(
        auth.authenticate("root".into(), "pw".into()).await,
        Code::FailedPrecondition,
        "etcdserver: authentication is not enabled",
    );
    assert!(c.user_list().await.unwrap().users().is_empty());
    assert!(c.role_list().await.unwrap().roles().is_empty());
    assert_status(
        c.user_get("root").await,
        Code::FailedPrecondition,
        "etcdserver: user name not found",
    );
    assert_status(
        c.role_get("root").await,
        Code::FailedPrecondition,
        "etcdserver: role name not found",
    );
    c.auth_disable().await.unwrap();
    if t.kind() == TargetKind::Strata {
        let mut raw = api::etcdserverpb::auth_client::AuthClient::connect(t.endpoint().to_string())
            .await
            .unwrap();
        let status = raw
            .auth_status(api::etcdserverpb::AuthStatusRequest {})
            .await
            .unwrap()
            .into_inner();
        assert!(!status.enabled);
        assert_eq!(
            status.auth_revision, 1,
            "etcd's auth store starts at revision 1"
        );
    }
}

/// Membership and leadership are the service's business: Strata refuses them clearly.
/// (Against etcd these RPCs change a real member, so the test only runs against Strata.)
#[tokio::test]
async fn strata_refuses_membership_and_leadership_changes_clearly() {
    let (t, mut c) = start().await;
    if t.kind() == TargetKind::Etcd {
        eprintln!("skipped: etcd really changes membership; this checks Strata's own answers");
        return;
    }
    let id = c.member_list().await.unwrap().members()[0].id();
    let (code, msg) = status(c.member_add(["http://127.0.0.1:1"], None).await);
    assert_eq!(code, Code::FailedPrecondition);
    assert!(
        msg.contains("membership is managed by the service"),
        "{msg}"
    );
    let (code, _) = status(c.member_remove(id).await);
    assert_eq!(code, Code::FailedPrecondition);
    let (code, _) = status(
        c.member_update(id, vec!["http://127.0.0.1:1".to_string()])
            .await,
    );
    assert_eq!(code, Code::FailedPrecondition);
    // Nothing changed: still one served membership.
    assert_eq!(c.member_list().await.unwrap().members()[0].id(), id);
    c.put("still", "works", None).await.unwrap();
}

/// Users, roles and permissions are managed as etcd manages them, with its answers: each
/// change journalled and read back (linearizably) from the replica, every refusal with etcd's
/// code and message, roles sorted, permissions sorted by key, a deleted role gone from its
/// users, `AuthEnable` refused while the root user or its role is missing, then enabled, and
/// disabled with root's token.
#[tokio::test]
async fn users_and_roles_are_managed_as_etcd_manages_them() {
    use api::authpb::{Permission, permission::Type as PermType};
    use api::etcdserverpb::auth_client::AuthClient;
    use api::etcdserverpb::*;
    let (t, _c) = start().await;
    let mut a = AuthClient::connect(t.endpoint().to_string()).await.unwrap();
    let failed = |m: &str| (Code::FailedPrecondition, m.to_string());
    let refused = |r: Result<tonic::Response<_>, tonic::Status>| -> (Code, String) {
        let s = r.map(|_: tonic::Response<()>| ()).unwrap_err();
        (s.code(), s.message().to_string())
    };
    // (tonic's responses differ per RPC: map each to () first.)
    macro_rules! no {
        ($call:expr) => {
            refused($call.await.map(|r| r.map(|_| ())))
        };
    }
    let user = |name: &str| AuthUserAddRequest {
        name: name.into(),
        password: "pw-of-".to_string() + name,
        ..Default::default()
    };
    a.user_add(user("alice")).await.unwrap();
    assert_eq!(
        no!(a.user_add(user("alice"))),
        failed("etcdserver: user name already exists")
    );
    assert_eq!(
        no!(a.user_add(user(""))),
        (
            Code::InvalidArgument,
            "etcdserver: user name is empty".into()
        )
    );
    let role = |name: &str| AuthRoleAddRequest { name: name.into() };
    a.role_add(role("writer")).await.unwrap();
    a.role_add(role("reader")).await.unwrap();
    assert_eq!(
        no!(a.role_add(role("reader"))),
        failed("etcdserver: role name already exists")
    );
    assert_eq!(
        no!(a.role_add(role(""))),
        (
            Code::InvalidArgument,
            "etcdserver: role name is empty".into()
        )
    );
    let perm = |t: PermType, key: &str, end: &str| Permission {
        perm_type: t as i32,
        key: key.into(),
        range_end: end.into(),
    };
    let grant = |p: Permission| AuthRoleGrantPermissionRequest {
        name: "reader".into(),
        perm: Some(p),
    };
    a.role_grant_permission(grant(perm(PermType::Read, "m", "")))
        .await
        .unwrap();
    a.role_grant_permission(grant(perm(PermType::Write, "/registry/", "/registry0")))
        .await
        .unwrap();
    // The same key and range end again: its type is updated in place.
    a.role_grant_permission(grant(perm(PermType::Readwrite, "/registry/", "/registry0")))
        .await
        .unwrap();
    let got = a
        .role_get(AuthRoleGetRequest {
            role: "reader".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        got.perm,
        [
            perm(PermType::Readwrite, "/registry/", "/registry0"),
            perm(PermType::Read, "m", "")
        ]
    );
    let grant_role = |role: &str| AuthUserGrantRoleRequest {
        user: "alice".into(),
        role: role.into(),
    };
    assert_eq!(
        no!(a.user_grant_role(grant_role("nope"))),
        failed("etcdserver: role name not found")
    );
    a.user_grant_role(grant_role("writer")).await.unwrap();
    a.user_grant_role(grant_role("reader")).await.unwrap();
    let roles_of = |name: &str| AuthUserGetRequest { name: name.into() };
    let got = a.user_get(roles_of("alice")).await.unwrap().into_inner();
    assert_eq!(got.roles, ["reader", "writer"], "sorted");
    let users = a.user_list(AuthUserListRequest {}).await.unwrap();
    assert_eq!(users.into_inner().users, ["alice"]);
    let roles = a.role_list(AuthRoleListRequest {}).await.unwrap();
    assert_eq!(roles.into_inner().roles, ["reader", "writer"]);
    let revoke = AuthUserRevokeRoleRequest {
        name: "alice".into(),
        role: "other".into(),
    };
    assert_eq!(
        no!(a.user_revoke_role(revoke)),
        failed("etcdserver: role is not granted to the user")
    );
    let revoke = AuthRoleRevokePermissionRequest {
        role: "reader".into(),
        key: "m".into(),
        range_end: "n".into(),
    };
    assert_eq!(
        no!(a.role_revoke_permission(revoke)),
        failed("etcdserver: permission is not granted to the role")
    );
    let revoke = AuthRoleRevokePermissionRequest {
        role: "reader".into(),
        key: "m".into(),
        range_end: "".into(),
    };
    a.role_revoke_permission(revoke).await.unwrap();
    // A deleted role leaves its users.
    let delete = AuthRoleDeleteRequest {
        role: "writer".into(),
    };
    a.role_delete(delete).await.unwrap();
    let got = a.user_get(roles_of("alice")).await.unwrap().into_inner();
    assert_eq!(got.roles, ["reader"]);
    let passwd = AuthUserChangePasswordRequest {
        name: "bob".into(),
        password: "x".into(),
        ..Default::default()
    };
    assert_eq!(
        no!(a.user_change_password(passwd)),
        failed("etcdserver: user name not found")
    );
    let delete = AuthUserDeleteRequest {
        name: "alice".into(),
    };
    a.user_delete(delete).await.unwrap();
    assert_eq!(
        no!(a.user_get(roles_of("alice"))),
        failed("etcdserver: user name not found")
    );

    // Enabling needs the root user holding the root role (which need not exist as a role).
    assert_eq!(
        no!(a.auth_enable(AuthEnableRequest {})),
        failed("etcdserver: root user does not exist")
    );
    a.user_add(user("root")).await.unwrap();
    assert_eq!(
        no!(a.auth_enable(AuthEnableRequest {})),
        failed("etcdserver: root user does not have root role")
    );
    let to_root = AuthUserGrantRoleRequest {
        user: "root".into(),
        role: "root".into(),
    };
    a.user_grant_role(to_root).await.unwrap();
    let roles = a.role_list(AuthRoleListRequest {}).await.unwrap();
    assert_eq!(
        roles.into_inner().roles,
        ["reader"],
        "granting root adds no role"
    );
    a.auth_enable(AuthEnableRequest {}).await.unwrap();
    // Enabled, a request needs a token; root's (Authenticate) may disable auth again.
    assert_eq!(
        no!(a.user_list(AuthUserListRequest {})),
        (
            Code::InvalidArgument,
            "etcdserver: user name is empty".into()
        )
    );
    let login = AuthenticateRequest {
        name: "root".into(),
        password: "pw-of-root".into(),
    };
    let token = a.authenticate(login).await.unwrap().into_inner().token;
    let mut disable = tonic::Request::new(AuthDisableRequest {});
    disable
        .metadata_mut()
        .insert("token", token.parse().unwrap());
    a.auth_disable(disable).await.unwrap();
    if t.kind() == TargetKind::Strata {
        let status = a.auth_status(AuthStatusRequest {}).await.unwrap();
        let status = status.into_inner();
        assert!(!status.enabled);
        // 1 + alice, 2 roles, 3 grants, 2 roles granted, a revoke, a role deleted, alice
        // deleted, root added, root granted, auth disabled (enabling is no revision).
        assert_eq!(status.auth_revision, 15);
    }
}

/// Raised alarms, as an etcd member answers them: each one listed in Status.errors as
/// `memberID:<id> alarm:<NAME>`; CORRUPT refuses writes, lease grants and compactions with
/// DataLoss "etcdserver: corrupt cluster" while reads go on; disarmed, writes work again.
#[tokio::test]
async fn raised_alarms_show_in_status_and_corrupt_refuses_writes() {
    let (_t, mut c) = start().await;
    c.put("al/k", "1", None).await.unwrap();
    let member = c.member_list().await.unwrap().header().unwrap().member_id();
    let opts = || {
        let mut o = AlarmOptions::new();
        o.with_member(member);
        Some(o)
    };
    c.alarm(AlarmAction::Activate, AlarmType::Corrupt, opts())
        .await
        .unwrap();
    let s = c.status().await.unwrap();
    assert_eq!(
        s.errors(),
        [format!("memberID:{member} alarm:CORRUPT ")],
        "Status lists the raised alarm"
    );
    let (code, msg) = status(c.put("al/k", "2", None).await);
    assert_eq!(
        (code, msg.as_str()),
        (Code::DataLoss, "etcdserver: corrupt cluster")
    );
    let (code, _) = status(c.lease_grant(60, None).await);
    assert_eq!(code, Code::DataLoss);
    let (code, _) = status(c.delete("al/k", None).await);
    assert_eq!(code, Code::DataLoss);
    let got = c.get("al/k", None).await.unwrap();
    assert_eq!(got.kvs()[0].value(), b"1", "reads go on, nothing changed");
    c.alarm(AlarmAction::Deactivate, AlarmType::Corrupt, opts())
        .await
        .unwrap();
    assert!(c.status().await.unwrap().errors().is_empty());
    c.put("al/k", "3", None).await.unwrap();
}

/// MoveLeader to the answering member succeeds (it leads already); to a member that does not
/// exist, etcd's "bad leader transferee". HashKV of a store never compacted reports compact
/// revision -1, as etcd's does.
#[tokio::test]
async fn move_leader_to_itself_and_to_a_stranger_and_hash_kv_before_any_compaction() {
    let (_t, mut c) = start().await;
    let own = c.status().await.unwrap().leader();
    c.move_leader(own).await.unwrap();
    let (code, msg) = status(c.move_leader(0x1234_5678).await);
    assert_eq!(
        (code, msg.as_str()),
        (
            Code::FailedPrecondition,
            "etcdserver: bad leader transferee"
        )
    );
    c.put("hk", "v", None).await.unwrap();
    assert_eq!(c.hash_kv(0).await.unwrap().compact_version(), -1);
}

/// A client that logged in (the `etcd-client` crate, which authenticates again only when told
/// "invalid auth token") goes on through auth changes that do not concern it, is denied at once
/// when its own permission goes, and is told "invalid auth token" when its password changes:
/// as against etcd's default tokens, which Strata's behave like.
#[tokio::test]
async fn a_logged_in_client_goes_on_through_auth_changes() {
    let (t, mut admin) = start().await;
    let app = etcd_client::Permission::read_write("ec/").with_prefix();
    common::enable_auth(&mut admin, ("alice", "alicepw"), "app", &[app]).await;
    let endpoint = t.endpoint().to_string();
    let mut alice = common::login(&endpoint, "alice", "alicepw").await;
    let mut root = common::login(&endpoint, "root", "rootpw").await;
    alice.put("ec/1", "v", None).await.unwrap();
    // Auth changes that are not alice's: she goes on with the token she has.
    root.role_add("other").await.unwrap();
    root.user_add("bob", "bobpw", None).await.unwrap();
    root.user_grant_role("bob", "other").await.unwrap();
    alice.put("ec/2", "v", None).await.unwrap();
    assert_eq!(alice.get("ec/1", None).await.unwrap().kvs().len(), 1);
    // Her own permission goes: denied at once.
    root.role_revoke_permission(
        "app",
        "ec/",
        Some(etcd_client::RoleRevokePermissionOptions::new().with_prefix()),
    )
    .await
    .unwrap();
    assert_status(
        alice.put("ec/3", "v", None).await,
        Code::PermissionDenied,
        "etcdserver: permission denied",
    );
    // Her password changes: her token is no longer valid.
    root.user_change_password("alice", "newpw").await.unwrap();
    assert_status(
        alice.get("ec/1", None).await,
        Code::Unauthenticated,
        "etcdserver: invalid auth token",
    );
    root.auth_disable().await.unwrap();
}
