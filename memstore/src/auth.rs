//! A tenant's auth state, as etcd's `auth/store.go` keeps it: users (name, bcrypt hash, roles,
//! options), roles (name, key permissions), the enabled flag and the auth revision. It changes
//! only through `AuthChange` entries, applied here with etcd's checks and errors, so every
//! replica holds the same state at the same journal index and checkpoints carry it.
//!
//! Users and roles are kept as encoded `authpb` messages, etcd's own storage form: the
//! checkpoint format did not change when the model landed, and a migration can copy an etcd
//! member's users, hashes included. Passwords never arrive here: the frontend hashes them and
//! sends etcd 3.5's `hashedPassword` (docs/design/auth.md, A2).

use std::collections::BTreeMap;

use api::authpb::{Permission, Role, User, UserAddOptions, permission::Type as PermType};
use api::strata::entry::{AuthChange, RestoreAuth, auth_change::Change};
use base64::Engine;
use prost::Message;

use crate::Error;

/// The user and the role etcd treats specially: the root role holds every permission, and
/// auth can be enabled only once the root user holds it.
pub const ROOT: &str = "root";

/// etcd's auth revision before any change (its store commits revision 1 when it is created).
pub const INITIAL_AUTH_REVISION: u64 = 1;

/// The tenant's auth state. `changes` counts the changes applied, so a store that never had one
/// equals the default (and `MemStore::is_pristine` holds); the auth revision clients see is
/// [`INITIAL_AUTH_REVISION`] plus it.
#[derive(
    Debug, Clone, Default, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
pub(crate) struct AuthState {
    pub enabled: bool,
    pub changes: u64,
    /// Encoded `authpb::User` by name.
    pub users: BTreeMap<String, Vec<u8>>,
    /// Encoded `authpb::Role` by name.
    pub roles: BTreeMap<String, Vec<u8>>,
}

/// The permission the root role answers for (etcd's `rootPerm`): read and write on every key.
pub fn root_permission() -> Permission {
    Permission {
        perm_type: PermType::Readwrite as i32,
        key: Vec::new(),
        range_end: vec![0],
    }
}

fn has_root_role(user: &User) -> bool {
    user.roles
        .binary_search_by(|r| r.as_str().cmp(ROOT))
        .is_ok()
}

impl AuthState {
    pub fn revision(&self) -> u64 {
        INITIAL_AUTH_REVISION + self.changes
    }

    pub fn user(&self, name: &str) -> Option<User> {
        // Only what `put_user` encoded is stored: a decode cannot fail.
        self.users
            .get(name)
            .and_then(|b| User::decode(b.as_slice()).ok())
    }

    pub fn role(&self, name: &str) -> Option<Role> {
        self.roles
            .get(name)
            .and_then(|b| Role::decode(b.as_slice()).ok())
    }

    fn put_user(&mut self, user: &User) {
        let name = String::from_utf8_lossy(&user.name).into_owned();
        self.users.insert(name, user.encode_to_vec());
    }

    fn put_role(&mut self, role: &Role) {
        let name = String::from_utf8_lossy(&role.name).into_owned();
        self.roles.insert(name, role.encode_to_vec());
    }

    fn commit(&mut self) {
        self.changes += 1;
    }

    /// Applies one change with etcd's checks, in etcd's order. A refused change changes nothing
    /// (and does not move the revision); a change that changes nothing in etcd (enabling what
    /// is enabled, disabling what is disabled, granting a role the user holds) succeeds without
    /// a new revision, as there.
    pub fn apply(&mut self, change: &AuthChange) -> Result<(), Error> {
        let Some(change) = &change.change else {
            return Err(Error::Unsupported("an empty auth change".into()));
        };
        match change {
            Change::Enable(_) => self.enable(),
            Change::Disable(_) => {
                if self.enabled {
                    self.enabled = false;
                    self.commit();
                }
                Ok(())
            }
            Change::UserAdd(r) => {
                if r.name.is_empty() {
                    return Err(Error::UserEmpty);
                }
                if self.users.contains_key(&r.name) {
                    return Err(Error::UserAlreadyExists);
                }
                let options = r.options.unwrap_or(UserAddOptions { no_password: false });
                let password = if options.no_password {
                    Vec::new()
                } else {
                    decode_hash(&r.hashed_password)?
                };
                self.put_user(&User {
                    name: r.name.clone().into_bytes(),
                    password,
                    roles: Vec::new(),
                    options: Some(options),
                });
                self.commit();
                Ok(())
            }
            Change::UserDelete(r) => {
                if self.enabled && r.name == ROOT {
                    return Err(Error::InvalidAuthManagement);
                }
                if self.users.remove(&r.name).is_none() {
                    return Err(Error::UserNotFound);
                }
                self.commit();
                Ok(())
            }
            Change::UserChangePassword(r) => {
                let mut user = self.user(&r.name).ok_or(Error::UserNotFound)?;
                let no_password = user.options.is_some_and(|o| o.no_password);
                user.password = if no_password {
                    Vec::new()
                } else {
                    decode_hash(&r.hashed_password)?
                };
                self.put_user(&user);
                self.commit();
                Ok(())
            }
            Change::UserGrantRole(r) => {
                let mut user = self.user(&r.user).ok_or(Error::UserNotFound)?;
                if r.role != ROOT && !self.roles.contains_key(&r.role) {
                    return Err(Error::RoleNotFound);
                }
                match user.roles.binary_search(&r.role) {
                    Ok(_) => Ok(()),
                    Err(at) => {
                        user.roles.insert(at, r.role.clone());
                        self.put_user(&user);
                        self.commit();
                        Ok(())
                    }
                }
            }
            Change::UserRevokeRole(r) => {
                if self.enabled && r.name == ROOT && r.role == ROOT {
                    return Err(Error::InvalidAuthManagement);
                }
                let mut user = self.user(&r.name).ok_or(Error::UserNotFound)?;
                let before = user.roles.len();
                user.roles.retain(|role| *role != r.role);
                if user.roles.len() == before {
                    return Err(Error::RoleNotGranted);
                }
                self.put_user(&user);
                self.commit();
                Ok(())
            }
            Change::RoleAdd(r) => {
                if r.name.is_empty() {
                    return Err(Error::RoleEmpty);
                }
                if self.roles.contains_key(&r.name) {
                    return Err(Error::RoleAlreadyExists);
                }
                self.put_role(&Role {
                    name: r.name.clone().into_bytes(),
                    key_permission: Vec::new(),
                });
                self.commit();
                Ok(())
            }
            Change::RoleDelete(r) => {
                if self.enabled && r.role == ROOT {
                    return Err(Error::InvalidAuthManagement);
                }
                if self.roles.remove(&r.role).is_none() {
                    return Err(Error::RoleNotFound);
                }
                // The role leaves every user that held it.
                let holders: Vec<User> = self
                    .users
                    .keys()
                    .filter_map(|name| self.user(name))
                    .filter(|u| u.roles.contains(&r.role))
                    .collect();
                for mut user in holders {
                    user.roles.retain(|role| *role != r.role);
                    self.put_user(&user);
                }
                self.commit();
                Ok(())
            }
            Change::RoleGrantPermission(r) => {
                let Some(perm) = &r.perm else {
                    return Err(Error::PermissionNotGiven);
                };
                let mut role = self.role(&r.name).ok_or(Error::RoleNotFound)?;
                // Kept sorted by key; a grant of the same key and range end updates its type.
                let at = role
                    .key_permission
                    .partition_point(|p| p.key.as_slice() < perm.key.as_slice());
                match role.key_permission.get_mut(at) {
                    Some(p) if p.key == perm.key && p.range_end == perm.range_end => {
                        p.perm_type = perm.perm_type;
                    }
                    _ => {
                        // etcd appends, then sorts stably by key alone.
                        let end = role
                            .key_permission
                            .partition_point(|p| p.key.as_slice() <= perm.key.as_slice());
                        role.key_permission.insert(end, perm.clone());
                    }
                }
                self.put_role(&role);
                self.commit();
                Ok(())
            }
            Change::RoleRevokePermission(r) => {
                let mut role = self.role(&r.role).ok_or(Error::RoleNotFound)?;
                let before = role.key_permission.len();
                role.key_permission
                    .retain(|p| p.key != r.key || p.range_end != r.range_end);
                if role.key_permission.len() == before {
                    return Err(Error::PermissionNotGranted);
                }
                self.put_role(&role);
                self.commit();
                Ok(())
            }
        }
    }

    /// etcd's AuthEnable: the root user must exist and hold the root role. Enabling is not a
    /// new auth revision in etcd (only disabling is).
    fn enable(&mut self) -> Result<(), Error> {
        if self.enabled {
            return Ok(());
        }
        self.check_enable()?;
        self.enabled = true;
        Ok(())
    }

    /// Why enabling auth would be refused now, if it would.
    pub fn check_enable(&self) -> Result<(), Error> {
        let root = self.user(ROOT).ok_or(Error::RootUserNotExist)?;
        if !has_root_role(&root) {
            return Err(Error::RootRoleNotExist);
        }
        Ok(())
    }

    /// The whole state as a restore carries it, `expect_auth_revision` the current revision.
    pub fn export(&self) -> RestoreAuth {
        RestoreAuth {
            enabled: self.enabled,
            users: self.users.keys().filter_map(|n| self.user(n)).collect(),
            roles: self.roles.keys().filter_map(|n| self.role(n)).collect(),
            expect_auth_revision: self.revision(),
        }
    }

    /// The state a restore puts in place, one change after this one: `r`'s users and roles
    /// (names present and unique, a user's roles sorted as a grant keeps them) and its enabled
    /// flag, which needs the root user holding the root role, as enabling does.
    pub fn restored(&self, r: &RestoreAuth) -> Result<AuthState, String> {
        let mut next = AuthState {
            enabled: false,
            changes: self.changes + 1,
            users: BTreeMap::new(),
            roles: BTreeMap::new(),
        };
        for u in &r.users {
            let name = String::from_utf8_lossy(&u.name);
            if name.is_empty() || next.users.contains_key(name.as_ref()) {
                return Err(format!("user {name:?} is empty or restored twice"));
            }
            let mut u = u.clone();
            u.roles.sort();
            u.roles.dedup();
            next.put_user(&u);
        }
        for role in &r.roles {
            let name = String::from_utf8_lossy(&role.name);
            if name.is_empty() || next.roles.contains_key(name.as_ref()) {
                return Err(format!("role {name:?} is empty or restored twice"));
            }
            next.put_role(role);
        }
        if r.enabled {
            next.check_enable()
                .map_err(|e| format!("auth cannot be enabled: {e}"))?;
            next.enabled = true;
        }
        Ok(next)
    }
}

/// The hash a change carries: etcd 3.5's `hashedPassword`, base64 of the bcrypt hash. etcd
/// answers an undecodable one with `ErrNoPasswordUser`.
fn decode_hash(hashed: &str) -> Result<Vec<u8>, Error> {
    base64::engine::general_purpose::STANDARD
        .decode(hashed)
        .map_err(|_| Error::NoPasswordUser)
}

/// Who sent a request, as its entry says (etcd's `AuthInfo`): the user the frontend's verified
/// token named and the auth revision it was minted at; `""` and 0 without a token.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Caller<'a> {
    pub user: &'a str,
    pub revision: u64,
}

/// What a request does to a range of keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

/// `[start, end)`; no end: every key from `start` on.
type Interval = (Vec<u8>, Option<Vec<u8>>);

/// One user's permissions: whether it holds the root role, and the union of its roles'
/// grants, merged into sorted disjoint intervals per access (etcd's `unifiedRangePermissions`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct UserPerms {
    /// The user's stored password hash (what a token's credential is checked against).
    password: Vec<u8>,
    root: bool,
    read: Vec<Interval>,
    write: Vec<Interval>,
}

/// Every user's permissions, derived from the auth state (not state itself: rebuilt after
/// each change and when a store is loaded), so a check is a lookup and a binary search.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Perms {
    users: std::collections::HashMap<String, UserPerms>,
}

/// The keys a permission or a request names, as etcd reads them: no range end is the key
/// alone, `"\0"` every key from it on.
fn interval(key: &[u8], range_end: &[u8]) -> Interval {
    match range_end {
        [] => {
            let mut end = key.to_vec();
            end.push(0);
            (key.to_vec(), Some(end))
        }
        [0] => (key.to_vec(), None),
        end => (key.to_vec(), Some(end.to_vec())),
    }
}

/// Sorts and merges intervals that overlap or touch; empty ones are dropped.
fn merge(mut all: Vec<Interval>) -> Vec<Interval> {
    all.retain(|(s, e)| e.as_ref().is_none_or(|e| e > s));
    all.sort();
    let mut out: Vec<Interval> = Vec::with_capacity(all.len());
    for (s, e) in all {
        if let Some((_, last)) = out.last_mut() {
            let touches = last.as_ref().is_none_or(|l| *l >= s);
            if touches {
                if last.is_some() && e.as_ref().is_none_or(|e| Some(e) > last.as_ref()) {
                    *last = e;
                }
                continue;
            }
        }
        out.push((s, e));
    }
    out
}

/// Whether the merged `granted` hold every key of `[key, range_end)` (etcd's request forms).
/// A request whose range end is not above its key names no key beyond it: it needs the key.
fn covers(granted: &[Interval], key: &[u8], range_end: &[u8]) -> bool {
    let (start, mut end) = interval(key, range_end);
    if end.as_ref().is_some_and(|e| *e <= start) {
        end = interval(key, b"").1;
    }
    // The last interval starting at or before the key is the only one that can hold it.
    let at = granted.partition_point(|(s, _)| *s <= start);
    let Some((_, held)) = at.checked_sub(1).map(|i| &granted[i]) else {
        return false;
    };
    match (held, end) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(h), Some(e)) => e <= *h,
    }
}

impl Perms {
    pub(crate) fn build(auth: &AuthState) -> Self {
        let mut users = std::collections::HashMap::new();
        for name in auth.users.keys() {
            let Some(user) = auth.user(name) else {
                continue;
            };
            let (mut read, mut write) = (Vec::new(), Vec::new());
            for role in user.roles.iter().filter_map(|r| auth.role(r)) {
                for p in &role.key_permission {
                    let ivl = interval(&p.key, &p.range_end);
                    match PermType::try_from(p.perm_type) {
                        Ok(PermType::Read) => read.push(ivl),
                        Ok(PermType::Write) => write.push(ivl),
                        Ok(PermType::Readwrite) => {
                            read.push(ivl.clone());
                            write.push(ivl);
                        }
                        Err(_) => {}
                    }
                }
            }
            let perms = UserPerms {
                root: has_root_role(&user),
                password: user.password,
                read: merge(read),
                write: merge(write),
            };
            users.insert(name.clone(), perms);
        }
        Perms { users }
    }

    /// etcd's `isOpPermitted`: with auth enabled, a request needs a token (else "user name is
    /// empty"), one not older than the auth state ("revision of auth store is old", on which
    /// clients authenticate again), a user that still exists, and the root role or a grant of
    /// `access` over every key of the range.
    pub(crate) fn check(
        &self,
        auth: &AuthState,
        caller: Caller<'_>,
        key: &[u8],
        range_end: &[u8],
        access: Access,
    ) -> Result<(), Error> {
        if !auth.enabled {
            return Ok(());
        }
        if caller.revision == 0 {
            return Err(Error::UserEmpty);
        }
        if caller.revision < auth.revision() {
            return Err(Error::AuthOldRevision);
        }
        let Some(user) = self.users.get(caller.user) else {
            return Err(Error::PermissionDenied);
        };
        let granted = match access {
            Access::Read => &user.read,
            Access::Write => &user.write,
        };
        if user.root || covers(granted, key, range_end) {
            Ok(())
        } else {
            Err(Error::PermissionDenied)
        }
    }

    /// etcd's `IsAdminPermitted`: with auth enabled, the caller must hold the root role.
    pub(crate) fn check_admin(&self, auth: &AuthState, user: &str) -> Result<(), Error> {
        if !auth.enabled {
            return Ok(());
        }
        if user.is_empty() {
            return Err(Error::UserEmpty);
        }
        match self.users.get(user) {
            None => Err(Error::UserNotFound),
            Some(u) if !u.root => Err(Error::PermissionDenied),
            Some(_) => Ok(()),
        }
    }

    /// The stored password hash of `user`, if it exists (no decode: a request's token is
    /// checked against it).
    pub(crate) fn password(&self, user: &str) -> Option<&[u8]> {
        self.users.get(user).map(|u| u.password.as_slice())
    }

    /// Whether `user` holds `role` (etcd's `HasRole`).
    pub(crate) fn has_role(auth: &AuthState, user: &str, role: &str) -> bool {
        auth.user(user)
            .is_some_and(|u| u.roles.iter().any(|r| r == role))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::etcdserverpb::{
        AuthDisableRequest, AuthEnableRequest, AuthRoleAddRequest, AuthRoleDeleteRequest,
        AuthRoleGrantPermissionRequest, AuthRoleRevokePermissionRequest, AuthUserAddRequest,
        AuthUserChangePasswordRequest, AuthUserDeleteRequest, AuthUserGrantRoleRequest,
        AuthUserRevokeRoleRequest,
    };

    fn change(c: Change) -> AuthChange {
        AuthChange { change: Some(c) }
    }

    fn hash_of(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    fn user_add(name: &str) -> AuthChange {
        change(Change::UserAdd(AuthUserAddRequest {
            name: name.into(),
            hashed_password: hash_of("$2a$10$hash"),
            ..Default::default()
        }))
    }

    fn role_add(name: &str) -> AuthChange {
        change(Change::RoleAdd(AuthRoleAddRequest { name: name.into() }))
    }

    fn grant_role(user: &str, role: &str) -> AuthChange {
        change(Change::UserGrantRole(AuthUserGrantRoleRequest {
            user: user.into(),
            role: role.into(),
        }))
    }

    fn revoke_role(user: &str, role: &str) -> AuthChange {
        change(Change::UserRevokeRole(AuthUserRevokeRoleRequest {
            name: user.into(),
            role: role.into(),
        }))
    }

    fn perm(key: &str, end: &str, t: PermType) -> Permission {
        Permission {
            perm_type: t as i32,
            key: key.into(),
            range_end: end.into(),
        }
    }

    fn grant_perm(role: &str, p: Permission) -> AuthChange {
        change(Change::RoleGrantPermission(
            AuthRoleGrantPermissionRequest {
                name: role.into(),
                perm: Some(p),
            },
        ))
    }

    fn enable() -> AuthChange {
        change(Change::Enable(AuthEnableRequest {}))
    }

    #[test]
    fn users_are_added_once_with_their_hash_and_each_change_is_a_revision() {
        let mut a = AuthState::default();
        assert_eq!(a.revision(), 1);
        a.apply(&user_add("alice")).unwrap();
        assert_eq!(a.revision(), 2);
        let u = a.user("alice").unwrap();
        assert_eq!(u.password, b"$2a$10$hash");
        assert!(u.roles.is_empty());
        assert_eq!(a.apply(&user_add("alice")), Err(Error::UserAlreadyExists));
        assert_eq!(a.apply(&user_add("")), Err(Error::UserEmpty));
        let bad = change(Change::UserAdd(AuthUserAddRequest {
            name: "bob".into(),
            hashed_password: "not base64!".into(),
            ..Default::default()
        }));
        assert_eq!(a.apply(&bad), Err(Error::NoPasswordUser));
        assert_eq!(a.revision(), 2, "refused changes are no revision");
        // A user without a password keeps no hash, whatever the request carried.
        let np = change(Change::UserAdd(AuthUserAddRequest {
            name: "np".into(),
            hashed_password: "not base64!".into(),
            options: Some(UserAddOptions { no_password: true }),
            ..Default::default()
        }));
        a.apply(&np).unwrap();
        assert!(a.user("np").unwrap().password.is_empty());
        let pw = change(Change::UserChangePassword(AuthUserChangePasswordRequest {
            name: "np".into(),
            hashed_password: hash_of("x"),
            ..Default::default()
        }));
        a.apply(&pw).unwrap();
        assert!(a.user("np").unwrap().password.is_empty());
        let pw = change(Change::UserChangePassword(AuthUserChangePasswordRequest {
            name: "alice".into(),
            hashed_password: hash_of("$2a$10$other"),
            ..Default::default()
        }));
        a.apply(&pw).unwrap();
        assert_eq!(a.user("alice").unwrap().password, b"$2a$10$other");
        let pw = change(Change::UserChangePassword(AuthUserChangePasswordRequest {
            name: "nobody".into(),
            ..Default::default()
        }));
        assert_eq!(a.apply(&pw), Err(Error::UserNotFound));
        let del = |n: &str| {
            change(Change::UserDelete(AuthUserDeleteRequest {
                name: n.to_string(),
            }))
        };
        a.apply(&del("alice")).unwrap();
        assert!(a.user("alice").is_none());
        assert_eq!(a.apply(&del("alice")), Err(Error::UserNotFound));
        assert_eq!(a.revision(), 6);
    }

    #[test]
    fn roles_are_granted_sorted_once_and_revoked_only_when_held() {
        let mut a = AuthState::default();
        a.apply(&user_add("u")).unwrap();
        assert_eq!(a.apply(&grant_role("u", "r1")), Err(Error::RoleNotFound));
        assert_eq!(a.apply(&grant_role("x", "r1")), Err(Error::UserNotFound));
        a.apply(&role_add("r2")).unwrap();
        a.apply(&role_add("r1")).unwrap();
        assert_eq!(a.apply(&role_add("r1")), Err(Error::RoleAlreadyExists));
        assert_eq!(a.apply(&role_add("")), Err(Error::RoleEmpty));
        a.apply(&grant_role("u", "r2")).unwrap();
        a.apply(&grant_role("u", "r1")).unwrap();
        // The root role need not exist to be granted.
        a.apply(&grant_role("u", ROOT)).unwrap();
        assert_eq!(a.user("u").unwrap().roles, ["r1", "r2", "root"]);
        let rev = a.revision();
        a.apply(&grant_role("u", "r1")).unwrap();
        assert_eq!(a.revision(), rev, "granting a held role changes nothing");
        assert_eq!(a.apply(&revoke_role("u", "r3")), Err(Error::RoleNotGranted));
        assert_eq!(a.apply(&revoke_role("x", "r1")), Err(Error::UserNotFound));
        a.apply(&revoke_role("u", "r2")).unwrap();
        assert_eq!(a.user("u").unwrap().roles, ["r1", "root"]);
        // Deleting a role takes it from every user.
        let del = change(Change::RoleDelete(AuthRoleDeleteRequest {
            role: "r1".into(),
        }));
        a.apply(&del).unwrap();
        assert_eq!(a.user("u").unwrap().roles, ["root"]);
        assert_eq!(a.apply(&del), Err(Error::RoleNotFound));
    }

    #[test]
    fn permissions_are_kept_sorted_updated_in_place_and_revoked_by_range() {
        let mut a = AuthState::default();
        assert_eq!(
            a.apply(&grant_perm("r", perm("a", "", PermType::Read))),
            Err(Error::RoleNotFound)
        );
        a.apply(&role_add("r")).unwrap();
        let none = change(Change::RoleGrantPermission(
            AuthRoleGrantPermissionRequest {
                name: "r".into(),
                perm: None,
            },
        ));
        assert_eq!(a.apply(&none), Err(Error::PermissionNotGiven));
        a.apply(&grant_perm("r", perm("m", "", PermType::Read)))
            .unwrap();
        a.apply(&grant_perm("r", perm("a", "b", PermType::Write)))
            .unwrap();
        a.apply(&grant_perm("r", perm("m", "n", PermType::Read)))
            .unwrap();
        a.apply(&grant_perm("r", perm("a", "b", PermType::Readwrite)))
            .unwrap();
        assert_eq!(
            a.role("r").unwrap().key_permission,
            [
                perm("a", "b", PermType::Readwrite),
                perm("m", "", PermType::Read),
                perm("m", "n", PermType::Read),
            ]
        );
        let revoke = |k: &str, e: &str| {
            change(Change::RoleRevokePermission(
                AuthRoleRevokePermissionRequest {
                    role: "r".into(),
                    key: k.into(),
                    range_end: e.into(),
                },
            ))
        };
        assert_eq!(a.apply(&revoke("m", "z")), Err(Error::PermissionNotGranted));
        a.apply(&revoke("m", "")).unwrap();
        assert_eq!(a.role("r").unwrap().key_permission.len(), 2);
        let other = change(Change::RoleRevokePermission(
            AuthRoleRevokePermissionRequest {
                role: "nope".into(),
                ..Default::default()
            },
        ));
        assert_eq!(a.apply(&other), Err(Error::RoleNotFound));
    }

    #[test]
    fn enabling_needs_root_with_the_root_role_and_then_guards_root() {
        let mut a = AuthState::default();
        assert_eq!(a.apply(&enable()), Err(Error::RootUserNotExist));
        a.apply(&user_add(ROOT)).unwrap();
        assert_eq!(a.apply(&enable()), Err(Error::RootRoleNotExist));
        a.apply(&grant_role(ROOT, ROOT)).unwrap();
        let rev = a.revision();
        a.apply(&enable()).unwrap();
        assert!(a.enabled);
        assert_eq!(a.revision(), rev, "enabling is no revision in etcd");
        a.apply(&enable()).unwrap();
        let del = change(Change::UserDelete(AuthUserDeleteRequest {
            name: ROOT.into(),
        }));
        assert_eq!(a.apply(&del), Err(Error::InvalidAuthManagement));
        assert_eq!(
            a.apply(&revoke_role(ROOT, ROOT)),
            Err(Error::InvalidAuthManagement)
        );
        let del_role = change(Change::RoleDelete(AuthRoleDeleteRequest {
            role: ROOT.into(),
        }));
        assert_eq!(a.apply(&del_role), Err(Error::InvalidAuthManagement));
        let disable = change(Change::Disable(AuthDisableRequest {}));
        a.apply(&disable).unwrap();
        assert!(!a.enabled);
        assert_eq!(a.revision(), rev + 1, "disabling is a revision");
        a.apply(&disable).unwrap();
        assert_eq!(a.revision(), rev + 1, "disabling what is disabled is none");
        // Disabled, root may lose its role and be deleted.
        a.apply(&revoke_role(ROOT, ROOT)).unwrap();
        a.apply(&del).unwrap();
    }
}
