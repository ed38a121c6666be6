//! The auth model against a naive one: random sequences of auth changes (over a few names, so
//! collisions, missing users and roles and the root rules all come up) applied to the store as
//! journal entries and to plain vectors; every outcome, the revision and every user and role
//! must agree after each step, a checkpoint of the result must load equal, and a retried
//! request id must change nothing.
mod common;

use api::authpb::{Permission, UserAddOptions};
use api::etcdserverpb::{
    AuthDisableRequest, AuthEnableRequest, AuthRoleAddRequest, AuthRoleDeleteRequest,
    AuthRoleGrantPermissionRequest, AuthRoleRevokePermissionRequest, AuthUserAddRequest,
    AuthUserChangePasswordRequest, AuthUserDeleteRequest, AuthUserGrantRoleRequest,
    AuthUserRevokeRoleRequest,
};
use api::strata::entry::{AuthChange, auth_change::Change, entry::Request};
use common::*;
use memstore::{Error, MemStore, Outcome};
use proptest::prelude::*;

const NAMES: [&str; 4] = ["root", "a", "b", ""];
const KEYS: [&str; 3] = ["", "k", "m"];

#[derive(Debug, Clone)]
struct User {
    name: String,
    hash: Vec<u8>,
    roles: Vec<String>,
    no_password: bool,
}

/// etcd's rules, written as plainly as possible over vectors kept in insertion order.
#[derive(Debug, Default)]
struct Model {
    enabled: bool,
    revision: u64,
    users: Vec<User>,
    roles: Vec<(String, Vec<Permission>)>,
}

impl Model {
    fn new() -> Self {
        Model {
            revision: 1,
            ..Default::default()
        }
    }

    fn user(&mut self, name: &str) -> Option<&mut User> {
        self.users.iter_mut().find(|u| u.name == name)
    }

    fn has_role(&self, name: &str) -> bool {
        self.roles.iter().any(|(n, _)| n == name)
    }

    fn apply(&mut self, c: &Change) -> Result<(), Error> {
        let before = self.revision;
        let r = self.apply_inner(c);
        if r.is_err() {
            assert_eq!(self.revision, before);
        }
        r
    }

    fn apply_inner(&mut self, c: &Change) -> Result<(), Error> {
        match c {
            Change::Enable(_) => {
                if !self.enabled {
                    let root = self.user("root").ok_or(Error::RootUserNotExist)?;
                    if !root.roles.iter().any(|r| r == "root") {
                        return Err(Error::RootRoleNotExist);
                    }
                    self.enabled = true;
                }
            }
            Change::Disable(_) => {
                if self.enabled {
                    self.enabled = false;
                    self.revision += 1;
                }
            }
            Change::UserAdd(r) => {
                if r.name.is_empty() {
                    return Err(Error::UserEmpty);
                }
                if self.user(&r.name).is_some() {
                    return Err(Error::UserAlreadyExists);
                }
                let no_password = r.options.is_some_and(|o| o.no_password);
                let hash = if no_password {
                    Vec::new()
                } else {
                    unbase64(&r.hashed_password)?
                };
                self.users.push(User {
                    name: r.name.clone(),
                    hash,
                    roles: vec![],
                    no_password,
                });
                self.revision += 1;
            }
            Change::UserDelete(r) => {
                if self.enabled && r.name == "root" {
                    return Err(Error::InvalidAuthManagement);
                }
                let at = self.users.iter().position(|u| u.name == r.name);
                self.users.remove(at.ok_or(Error::UserNotFound)?);
                self.revision += 1;
            }
            Change::UserChangePassword(r) => {
                let u = self.user(&r.name).ok_or(Error::UserNotFound)?;
                if !u.no_password {
                    u.hash = unbase64(&r.hashed_password)?;
                }
                self.revision += 1;
            }
            Change::UserGrantRole(r) => {
                if self.user(&r.user).is_none() {
                    return Err(Error::UserNotFound);
                }
                if r.role != "root" && !self.has_role(&r.role) {
                    return Err(Error::RoleNotFound);
                }
                let u = self.user(&r.user).unwrap();
                if !u.roles.contains(&r.role) {
                    u.roles.push(r.role.clone());
                    self.revision += 1;
                }
            }
            Change::UserRevokeRole(r) => {
                if self.enabled && r.name == "root" && r.role == "root" {
                    return Err(Error::InvalidAuthManagement);
                }
                let u = self.user(&r.name).ok_or(Error::UserNotFound)?;
                let at = u.roles.iter().position(|x| *x == r.role);
                u.roles.remove(at.ok_or(Error::RoleNotGranted)?);
                self.revision += 1;
            }
            Change::RoleAdd(r) => {
                if r.name.is_empty() {
                    return Err(Error::RoleEmpty);
                }
                if self.has_role(&r.name) {
                    return Err(Error::RoleAlreadyExists);
                }
                self.roles.push((r.name.clone(), vec![]));
                self.revision += 1;
            }
            Change::RoleDelete(r) => {
                if self.enabled && r.role == "root" {
                    return Err(Error::InvalidAuthManagement);
                }
                let at = self.roles.iter().position(|(n, _)| *n == r.role);
                self.roles.remove(at.ok_or(Error::RoleNotFound)?);
                for u in &mut self.users {
                    u.roles.retain(|x| *x != r.role);
                }
                self.revision += 1;
            }
            Change::RoleGrantPermission(r) => {
                let p = r.perm.clone().ok_or(Error::PermissionNotGiven)?;
                let role = self.roles.iter_mut().find(|(n, _)| *n == r.name);
                let (_, perms) = role.ok_or(Error::RoleNotFound)?;
                match perms
                    .iter_mut()
                    .find(|q| q.key == p.key && q.range_end == p.range_end)
                {
                    Some(q) => q.perm_type = p.perm_type,
                    None => perms.push(p),
                }
                self.revision += 1;
            }
            Change::RoleRevokePermission(r) => {
                let role = self.roles.iter_mut().find(|(n, _)| *n == r.role);
                let (_, perms) = role.ok_or(Error::RoleNotFound)?;
                let at = perms
                    .iter()
                    .position(|q| q.key == r.key && q.range_end == r.range_end);
                perms.remove(at.ok_or(Error::PermissionNotGranted)?);
                self.revision += 1;
            }
        }
        Ok(())
    }

    /// Compares everything the store answers with the model.
    fn check(&self, store: &MemStore) {
        assert_eq!(store.auth_enabled(), self.enabled);
        assert_eq!(store.auth_revision(), self.revision);
        let mut users: Vec<String> = self.users.iter().map(|u| u.name.clone()).collect();
        users.sort();
        assert_eq!(store.auth_users(), users);
        for u in &self.users {
            let got = store.auth_user(&u.name).expect("user");
            let mut roles = u.roles.clone();
            roles.sort();
            assert_eq!(got.roles, roles, "roles of {}", u.name);
            assert_eq!(got.password, u.hash);
            assert_eq!(store.auth_password(&u.name), Some(u.hash.as_slice()));
            assert_eq!(got.options.is_some_and(|o| o.no_password), u.no_password);
        }
        let mut roles: Vec<String> = self.roles.iter().map(|(n, _)| n.clone()).collect();
        roles.sort();
        assert_eq!(store.auth_roles(), roles);
        for (name, perms) in &self.roles {
            let got = store.auth_role(name).expect("role");
            if name == "root" {
                assert_eq!(got, [memstore::root_permission()]);
                continue;
            }
            // Sorted by key; equal keys in the order they were first granted (etcd's append,
            // then sort of a short slice, which is stable).
            let mut want = perms.clone();
            want.sort_by(|a, b| a.key.cmp(&b.key));
            assert_eq!(got, want, "permissions of {name}");
        }
        for name in NAMES {
            if !self.users.iter().any(|u| u.name == name) {
                assert!(store.auth_user(name).is_none());
                assert!(store.auth_password(name).is_none());
            }
        }
    }
}

fn unbase64(s: &str) -> Result<Vec<u8>, Error> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .map_err(|_| Error::NoPasswordUser)
}

fn name() -> impl Strategy<Value = String> {
    prop::sample::select(&NAMES[..]).prop_map(str::to_string)
}

fn key() -> impl Strategy<Value = Vec<u8>> {
    prop::sample::select(&KEYS[..]).prop_map(|k| k.as_bytes().to_vec())
}

fn hash() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-z]{0,6}".prop_map(|h| {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.encode(format!("$2a$10${h}"))
        }),
        1 => Just("*not base64*".to_string()),
    ]
}

fn change() -> impl Strategy<Value = Change> {
    let perm = (key(), key(), 0..3i32).prop_map(|(key, range_end, t)| Permission {
        perm_type: t,
        key,
        range_end,
    });
    prop_oneof![
        1 => Just(Change::Enable(AuthEnableRequest {})),
        1 => Just(Change::Disable(AuthDisableRequest {})),
        3 => (name(), hash(), any::<bool>()).prop_map(|(name, hashed_password, np)| {
            Change::UserAdd(AuthUserAddRequest {
                name,
                hashed_password,
                options: np.then_some(UserAddOptions { no_password: true }),
                ..Default::default()
            })
        }),
        1 => name().prop_map(|name| Change::UserDelete(AuthUserDeleteRequest { name })),
        1 => (name(), hash()).prop_map(|(name, hashed_password)| {
            Change::UserChangePassword(AuthUserChangePasswordRequest {
                name,
                hashed_password,
                ..Default::default()
            })
        }),
        3 => (name(), name()).prop_map(|(user, role)| {
            Change::UserGrantRole(AuthUserGrantRoleRequest { user, role })
        }),
        2 => (name(), name()).prop_map(|(name, role)| {
            Change::UserRevokeRole(AuthUserRevokeRoleRequest { name, role })
        }),
        3 => name().prop_map(|name| Change::RoleAdd(AuthRoleAddRequest { name })),
        1 => name().prop_map(|role| Change::RoleDelete(AuthRoleDeleteRequest { role })),
        4 => (name(), prop::option::weighted(0.9, perm)).prop_map(|(name, perm)| {
            Change::RoleGrantPermission(AuthRoleGrantPermissionRequest { name, perm })
        }),
        2 => (name(), key(), key()).prop_map(|(role, key, range_end)| {
            Change::RoleRevokePermission(AuthRoleRevokePermissionRequest {
                role,
                key,
                range_end,
            })
        }),
    ]
}

/// Applies `request` as `user` with the store's current auth revision.
fn apply_as(
    h: &mut Harness,
    request: Request,
    request_id: Vec<u8>,
    user: &str,
) -> memstore::Applied {
    h.index += 1;
    let entry = api::strata::entry::Entry {
        format_version: api::ENTRY_FORMAT_VERSION,
        tenant: "t".into(),
        request_id,
        time_ms: h.now_ms,
        request: Some(request),
        user: user.into(),
        auth_revision: h.store.auth_revision(),
    };
    h.store.apply(h.index, &entry)
}

#[test]
fn auth_changes_follow_the_naive_model() {
    let (mut runner, seed) = seeded_runner("AUTH_MODEL", 0x5eed_a17e, 256);
    let result = runner.run(&prop::collection::vec(change(), 1..60), |changes| {
        let mut h = Harness::new();
        let mut model = Model::new();
        for (i, c) in changes.iter().enumerate() {
            let id = (i as u64).to_le_bytes().repeat(2);
            let request = Request::Auth(AuthChange {
                change: Some(c.clone()),
            });
            // As root: once auth is enabled every change needs the root role (root cannot
            // lose it then); before, the caller is not looked at.
            let applied = apply_as(&mut h, request.clone(), id.clone(), "root");
            let want = model.apply(c);
            let got = match applied.outcome {
                Outcome::Auth => Ok(()),
                Outcome::Failed(e) => Err(e),
                other => panic!("unexpected outcome {other:?}"),
            };
            prop_assert_eq!(&got, &want, "step {}: {:?}", i, c);
            assert_eq!(h.store.revision(), 1, "auth changes are no MVCC revision");
            model.check(&h.store);
            // A retried request id is a duplicate: nothing changes.
            let again = apply_as(&mut h, request, id, "root");
            let duplicate = matches!(again.outcome, Outcome::Duplicate { .. });
            prop_assert!(duplicate, "a retried id is a duplicate");
            model.check(&h.store);
        }
        let loaded = reload(&h.store);
        prop_assert!(loaded == h.store, "a checkpoint carries the auth state");
        model.check(&loaded);
        Ok(())
    });
    if let Err(e) = result {
        panic!("seed {seed}: {e}");
    }
}

// ---- permission checks against enumeration ----

/// Keys of the permission test: the alphabet {\0, a, b}, at most two bytes in grants and
/// requests. Every gap in a union of grants starts at a grant's end or a request's start (at
/// most three bytes: a key alone ends at key + "\0"), so checking these keys, plus one beyond
/// every finite end, decides coverage exactly.
fn candidates() -> Vec<Vec<u8>> {
    let alphabet = [0u8, b'a', b'b'];
    let mut all = vec![Vec::new()];
    let mut frontier = vec![Vec::new()];
    for _ in 0..3 {
        let mut next = Vec::new();
        for k in &frontier {
            for c in alphabet {
                let mut k = k.clone();
                k.push(c);
                next.push(k);
            }
        }
        all.extend(next.iter().cloned());
        frontier = next;
    }
    all.push(b"bbbb".to_vec());
    all
}

/// Whether `k` is one of the keys a request for `[key, end)` names, in etcd's forms (no end:
/// the key alone; "\0": every key from it on; an end not above the key: the key alone).
fn names(key: &[u8], end: &[u8], k: &[u8]) -> bool {
    match end {
        [] => k == key,
        [0] => k >= key,
        e if e <= key => k == key,
        e => k >= key && k < e,
    }
}

/// Whether a grant of `[key, end)` holds `k`: as a request names keys, but a grant whose end
/// is not above its key holds none.
fn grant_holds(key: &[u8], end: &[u8], k: &[u8]) -> bool {
    match end {
        [] | [0] => names(key, end, k),
        e => k >= key && k < e,
    }
}

fn short_key() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(prop::sample::select(vec![0u8, b'a', b'b']), 1..=2)
}

fn range_end() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        2 => Just(Vec::new()),
        1 => Just(vec![0u8]),
        3 => short_key(),
    ]
}

#[test]
fn permission_checks_agree_with_enumerating_keys() {
    let (mut runner, seed) = seeded_runner("AUTH_PERMS", 0x9e4d_c0de, 256);
    let grant = (short_key(), range_end(), 0..3i32);
    let request = (short_key(), range_end(), any::<bool>());
    let strategy = (
        prop::collection::vec((0..2usize, grant), 0..6),
        prop::collection::vec(request, 1..20),
    );
    let keys = candidates();
    let result = runner.run(&strategy, |(grants, requests)| {
        let mut h = Harness::new();
        let mut auth = |c: Change| {
            let a = h.apply(Request::Auth(AuthChange { change: Some(c) }));
            assert_eq!(a.outcome, Outcome::Auth);
        };
        auth(Change::UserAdd(AuthUserAddRequest {
            name: "root".into(),
            options: Some(UserAddOptions { no_password: true }),
            ..Default::default()
        }));
        auth(Change::UserGrantRole(AuthUserGrantRoleRequest {
            user: "root".into(),
            role: "root".into(),
        }));
        auth(Change::UserAdd(AuthUserAddRequest {
            name: "u".into(),
            options: Some(UserAddOptions { no_password: true }),
            ..Default::default()
        }));
        for r in ["r0", "r1"] {
            auth(Change::RoleAdd(AuthRoleAddRequest { name: r.into() }));
            auth(Change::UserGrantRole(AuthUserGrantRoleRequest {
                user: "u".into(),
                role: r.into(),
            }));
        }
        for (role, (key, end, t)) in &grants {
            auth(Change::RoleGrantPermission(
                AuthRoleGrantPermissionRequest {
                    name: format!("r{role}"),
                    perm: Some(Permission {
                        perm_type: *t,
                        key: key.clone(),
                        range_end: end.clone(),
                    }),
                },
            ));
        }
        auth(Change::Enable(AuthEnableRequest {}));
        // The role's grants as the store keeps them (a grant of the same range replaces).
        let mut held: Vec<Permission> = Vec::new();
        for r in ["r0", "r1"] {
            held.extend(h.store.auth_role(r).unwrap());
        }
        let store = &h.store;
        let caller = memstore::Caller {
            user: "u",
            revision: store.auth_revision(),
        };
        for (key, end, write) in &requests {
            // perm types: 0 READ, 1 WRITE, 2 READWRITE.
            let allows = |p: &Permission| {
                if *write {
                    p.perm_type != 0
                } else {
                    p.perm_type != 1
                }
            };
            let want = keys.iter().filter(|k| names(key, end, k)).all(|k| {
                held.iter()
                    .any(|p| allows(p) && grant_holds(&p.key, &p.range_end, k))
            });
            let got = if *write {
                let del = Request::DeleteRange(api::etcdserverpb::DeleteRangeRequest {
                    key: key.clone(),
                    range_end: end.clone(),
                    ..Default::default()
                });
                store.check_request(caller, &del)
            } else {
                store.check_read(caller, key, end)
            };
            prop_assert_eq!(
                got.is_ok(),
                want,
                "{} {:?}..{:?} with {:?}",
                if *write { "write" } else { "read" },
                key,
                end,
                held
            );
            if !want {
                prop_assert_eq!(got, Err(Error::PermissionDenied));
            }
            // The root role may do anything; without a token nothing; an older token is old.
            let root = memstore::Caller {
                user: "root",
                ..caller
            };
            prop_assert_eq!(store.check_read(root, key, end), Ok(()));
            let none = memstore::Caller::default();
            prop_assert_eq!(store.check_read(none, key, end), Err(Error::UserEmpty));
            let old = memstore::Caller {
                revision: caller.revision - 1,
                ..caller
            };
            prop_assert_eq!(store.check_read(old, key, end), Err(Error::AuthOldRevision));
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("seed {seed}: {e}");
    }
}

/// A store with auth enabled: `root` (root role) and `u`, whose role `w` may write `a`.
fn enforcing() -> Harness {
    let mut h = Harness::new();
    let changes = [
        Change::UserAdd(AuthUserAddRequest {
            name: "root".into(),
            options: Some(UserAddOptions { no_password: true }),
            ..Default::default()
        }),
        Change::UserGrantRole(AuthUserGrantRoleRequest {
            user: "root".into(),
            role: "root".into(),
        }),
        Change::UserAdd(AuthUserAddRequest {
            name: "u".into(),
            options: Some(UserAddOptions { no_password: true }),
            ..Default::default()
        }),
        Change::RoleAdd(AuthRoleAddRequest { name: "w".into() }),
        Change::RoleGrantPermission(AuthRoleGrantPermissionRequest {
            name: "w".into(),
            perm: Some(Permission {
                perm_type: 1,
                key: b"a".to_vec(),
                range_end: Vec::new(),
            }),
        }),
        Change::UserGrantRole(AuthUserGrantRoleRequest {
            user: "u".into(),
            role: "w".into(),
        }),
        Change::Enable(AuthEnableRequest {}),
    ];
    for c in changes {
        let a = h.apply(Request::Auth(AuthChange { change: Some(c) }));
        assert_eq!(a.outcome, Outcome::Auth);
    }
    assert!(h.store.auth_enabled());
    h
}

/// Writes are checked as they are applied, against the caller their entry names, whichever
/// path applies them (a decoded entry, a journal record read in place): a denied write
/// changes nothing; a token older than the latest auth change is "old".
#[test]
fn writes_are_checked_at_apply_against_their_entrys_caller() {
    let mut h = enforcing();
    let put = |k: &str| Request::Put(put(k, "v"));
    let failed_as = |h: &mut Harness, r: Request, user: &str| -> Option<Error> {
        failed(&apply_as(h, r, Vec::new(), user))
    };
    assert_eq!(failed_as(&mut h, put("a"), "u"), None);
    assert_eq!(
        failed_as(&mut h, put("b"), "u"),
        Some(Error::PermissionDenied)
    );
    assert_eq!(failed_as(&mut h, put("b"), "root"), None);
    assert_eq!(
        failed_as(&mut h, put("b"), "nobody"),
        Some(Error::PermissionDenied)
    );
    assert_eq!(
        failed(&h.apply(put("a"))),
        Some(Error::UserEmpty),
        "no token"
    );
    // prev_kv needs READ, which u lacks.
    let with_prev = Request::Put(api::etcdserverpb::PutRequest {
        prev_kv: true,
        ..put_req("a")
    });
    assert_eq!(
        failed_as(&mut h, with_prev, "u"),
        Some(Error::PermissionDenied)
    );
    assert_eq!(h.get("b").unwrap().version, 1);
    assert_eq!(h.get("a").unwrap().version, 1, "denied puts wrote nothing");
    // Auth changes need the root role.
    let role = Request::Auth(AuthChange {
        change: Some(Change::RoleAdd(AuthRoleAddRequest { name: "x".into() })),
    });
    assert_eq!(
        failed_as(&mut h, role.clone(), "u"),
        Some(Error::PermissionDenied)
    );
    assert_eq!(failed_as(&mut h, role, "root"), None);

    // A write appended before a change and applied after it: its token is old.
    let stale = h.store.auth_revision() - 1;
    h.index += 1;
    let entry = api::strata::entry::Entry {
        format_version: api::ENTRY_FORMAT_VERSION,
        tenant: "t".into(),
        time_ms: h.now_ms,
        request: Some(put("a")),
        user: "u".into(),
        auth_revision: stale,
        ..Default::default()
    };
    assert_eq!(
        failed(&h.store.apply(h.index, &entry)),
        Some(Error::AuthOldRevision)
    );

    // A journal record, which a replica applies without decoding a plain put: checked too.
    let record = |index: u64, user: &str, revision: u64| api::strata::journal::Record {
        index,
        term: 1,
        time_ms: h.now_ms,
        kind: Some(api::strata::journal::record::Kind::Data(
            api::record::encode_entry(&api::strata::entry::Entry {
                format_version: api::ENTRY_FORMAT_VERSION,
                tenant: "t".into(),
                request: Some(put("c")),
                user: user.into(),
                auth_revision: revision,
                ..Default::default()
            }),
        )),
    };
    let rev = h.store.auth_revision();
    let denied = h
        .store
        .apply_record(record(h.index + 1, "u", rev), "t")
        .unwrap();
    assert_eq!(failed(&denied.applied), Some(Error::PermissionDenied));
    let anonymous = h
        .store
        .apply_record(record(h.index + 2, "", 0), "t")
        .unwrap();
    assert_eq!(failed(&anonymous.applied), Some(Error::UserEmpty));
    let by_root = h
        .store
        .apply_record(record(h.index + 3, "root", rev), "t")
        .unwrap();
    assert!(matches!(by_root.applied.outcome, Outcome::Put(_)));
}

fn put_req(k: &str) -> api::etcdserverpb::PutRequest {
    put(k, "v")
}

/// A lease whose keys the caller may not write may be neither revoked nor attached to;
/// the root role revokes it.
#[test]
fn leases_guard_their_keys() {
    let mut h = enforcing();
    h.grant(7, 60);
    let leased = |k: &str| {
        Request::Put(api::etcdserverpb::PutRequest {
            lease: 7,
            ..put_req(k)
        })
    };
    assert_eq!(failed(&apply_as(&mut h, leased("a"), vec![], "u")), None);
    let revoke = Request::LeaseRevoke(api::etcdserverpb::LeaseRevokeRequest { id: 7 });
    assert_eq!(failed(&apply_as(&mut h, revoke.clone(), vec![], "u")), None);
    h.grant(8, 60);
    let on_8 = |k: &str| {
        Request::Put(api::etcdserverpb::PutRequest {
            lease: 8,
            ..put_req(k)
        })
    };
    assert_eq!(failed(&apply_as(&mut h, on_8("z"), vec![], "root")), None);
    assert_eq!(
        failed(&apply_as(&mut h, on_8("a"), vec![], "u")),
        Some(Error::PermissionDenied),
        "lease 8 holds z, which u may not write"
    );
    let revoke_8 = Request::LeaseRevoke(api::etcdserverpb::LeaseRevokeRequest { id: 8 });
    assert_eq!(
        failed(&apply_as(&mut h, revoke_8.clone(), vec![], "u")),
        Some(Error::PermissionDenied)
    );
    assert_eq!(failed(&apply_as(&mut h, revoke_8, vec![], "root")), None);
    assert!(h.get("z").is_none());
}

/// A store loaded from a checkpoint enforces what the original did (the merged permissions
/// are rebuilt from the auth state, which the checkpoint carries).
#[test]
fn a_loaded_store_enforces_the_same_permissions() {
    let h = enforcing();
    let loaded = reload(&h.store);
    let u = memstore::Caller {
        user: "u",
        revision: loaded.auth_revision(),
    };
    let write = |k: &str| Request::Put(put(k, "v"));
    assert_eq!(loaded.check_request(u, &write("a")), Ok(()));
    assert_eq!(
        loaded.check_request(u, &write("b")),
        Err(Error::PermissionDenied)
    );
    assert_eq!(loaded.check_admin("root"), Ok(()));
    assert_eq!(loaded.check_admin("u"), Err(Error::PermissionDenied));
}
