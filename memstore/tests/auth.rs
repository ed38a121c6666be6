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
            let applied = h.apply_with_id(request.clone(), id.clone());
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
            let again = h.apply_with_id(request, id);
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
