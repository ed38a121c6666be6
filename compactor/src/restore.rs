//! Restoring a tenant to a checkpoint through the journal, all or nothing: the difference
//! between the tenant's current state and the checkpoint's as one staged restore
//! (`RestoreBegin`, `RestoreChunk`s that each fit in a journal entry, `RestoreCommit`; applied
//! by `memstore`). Every replica (frontends, the compactor) applies the commit at one new
//! revision, so a reader sees the tenant either before or after the restore, watchers get every
//! change at that revision, and revisions keep moving forward.
//!
//! Every staged key carries the mod revision (or absence) it had in the state the plan was
//! computed from; a write that raced the restore makes the commit abort (nothing changes) and
//! the caller plans again from the newer state.

use std::collections::{BTreeMap, BTreeSet};

use api::etcdserverpb::RangeRequest;
use api::mvccpb::KeyValue;
use api::strata::entry::entry::Request;
use api::strata::entry::{
    RestoreAuth, RestoreBegin, RestoreChunk, RestoreCommit, RestoreKey, RestoreLease,
};
use memstore::MemStore;

/// Key + value bytes per chunk: with the protobuf framing, well under the journal's 2 MiB entry
/// limit (`journal::node::MAX_ENTRY_BYTES`). A single larger key-value (etcd allows 1.5 MiB
/// requests) gets a chunk of its own.
pub const MAX_CHUNK_BYTES: usize = 1024 * 1024;
/// Keys per chunk, bounding the per-key framing of a chunk of tiny keys.
pub const MAX_CHUNK_KEYS: usize = 8192;

/// The staged restore that turns one state into another.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Plan {
    pub restore_id: Vec<u8>,
    pub checkpoint_index: u64,
    /// Never empty: a restore with no change to keys still carries its lease changes.
    pub chunks: Vec<RestoreChunk>,
    pub grants: usize,
    pub puts: usize,
    pub deletes: usize,
    pub revokes: usize,
    /// The target's auth state (users, roles, the enabled flag), when it differs from the
    /// current one; applied at the commit.
    pub auth: Option<RestoreAuth>,
}

impl Plan {
    /// Nothing to change.
    pub fn is_empty(&self) -> bool {
        self.grants + self.puts + self.deletes + self.revokes == 0 && self.auth.is_none()
    }

    /// The entries to append, in order: begin, every chunk, commit ([`Plan::request_count`] of
    /// them); made one at a time, so a large restore holds its chunks once (a 1M-key plan's are
    /// hundreds of MB), not also as a list of requests.
    pub fn requests(&self) -> impl Iterator<Item = Request> + '_ {
        let begin = Request::RestoreBegin(RestoreBegin {
            restore_id: self.restore_id.clone(),
            checkpoint_index: self.checkpoint_index,
        });
        let commit = Request::RestoreCommit(RestoreCommit {
            restore_id: self.restore_id.clone(),
            chunks: self.chunks.len() as u32,
            auth: self.auth.clone(),
        });
        std::iter::once(begin)
            .chain(self.chunks.iter().cloned().map(Request::RestoreChunk))
            .chain(std::iter::once(commit))
    }

    /// How many entries [`Plan::requests`] makes.
    pub fn request_count(&self) -> usize {
        self.chunks.len() + 2
    }
}

fn all_keys(s: &MemStore) -> BTreeMap<Vec<u8>, KeyValue> {
    let req = RangeRequest {
        key: vec![0],
        range_end: vec![0],
        ..Default::default()
    };
    s.range(&req)
        .map(|r| r.kvs.into_iter().map(|kv| (kv.key.clone(), kv)).collect())
        .unwrap_or_default()
}

fn leases(s: &MemStore) -> BTreeMap<i64, i64> {
    s.lease_leases()
        .leases
        .into_iter()
        .map(|l| {
            let ttl = s
                .lease_time_to_live(l.id, false)
                .map(|t| t.granted_ttl)
                .unwrap_or(0);
            (l.id, ttl)
        })
        .collect()
}

/// What a lease to grant, a lease to revoke and a key's framing cost in a chunk's encoding, at
/// most (ids and TTLs as 10-byte varints, tags and lengths): estimates that only have to stay
/// above the truth, with `MAX_CHUNK_BYTES` at half a journal entry.
const GRANT_BYTES: usize = 26;
const REVOKE_BYTES: usize = 11;
const KEY_OVERHEAD_BYTES: usize = 32;

/// Fills chunks up to `MAX_CHUNK_BYTES` (estimated) and `MAX_CHUNK_KEYS` items each.
#[derive(Default)]
struct Chunker {
    done: Vec<RestoreChunk>,
    chunk: RestoreChunk,
    bytes: usize,
    items: usize,
}

impl Chunker {
    /// Makes room for an item of `size` bytes: starts a new chunk when this one is full.
    fn room(&mut self, size: usize) {
        if self.items > 0 && (self.bytes + size > MAX_CHUNK_BYTES || self.items >= MAX_CHUNK_KEYS) {
            self.done.push(std::mem::take(&mut self.chunk));
            self.bytes = 0;
            self.items = 0;
        }
        self.bytes += size;
        self.items += 1;
    }

    /// Every chunk, at least one (a restore that changes nothing still begins and commits).
    fn finish(mut self) -> Vec<RestoreChunk> {
        if self.items > 0 || self.done.is_empty() {
            self.done.push(self.chunk);
        }
        self.done
    }
}

/// The staged restore (named `restore_id`) that makes `current` end with `target`'s keys,
/// values and key-to-lease attachments, `target`'s set of leases, and `target`'s auth state. Leases missing in
/// `current` are granted with their granted TTL (their countdown restarts); leases of both keep
/// `current`'s deadline.
pub fn plan(
    current: &MemStore,
    target: &MemStore,
    restore_id: Vec<u8>,
    checkpoint_index: u64,
) -> Plan {
    let mut p = Plan {
        restore_id,
        checkpoint_index,
        ..Default::default()
    };
    let cur_leases = leases(current);
    let tgt_leases = leases(target);
    let grants: Vec<RestoreLease> = tgt_leases
        .iter()
        .filter(|(id, _)| !cur_leases.contains_key(id))
        .map(|(&id, &ttl)| RestoreLease {
            id,
            ttl: ttl.max(1),
        })
        .collect();
    let revokes: Vec<i64> = cur_leases
        .keys()
        .copied()
        .filter(|id| !tgt_leases.contains_key(id))
        .collect();
    p.grants = grants.len();
    p.revokes = revokes.len();

    let cur = all_keys(current);
    let tgt = all_keys(target);
    let keys: BTreeSet<&Vec<u8>> = cur.keys().chain(tgt.keys()).collect();
    // Lease changes count toward a chunk's size as keys do (the commit gathers them from every
    // chunk): a tenant with a hundred thousand leases to grant or revoke must not make one
    // chunk larger than a journal entry.
    let mut chunks = Chunker::default();
    for g in grants {
        chunks.room(GRANT_BYTES);
        chunks.chunk.grants.push(g);
    }
    for key in keys {
        let c = cur.get(key);
        let expect_mod_revision = c.map_or(0, |kv| kv.mod_revision);
        let k = match (c, tgt.get(key)) {
            (Some(c), Some(t)) if c.value == t.value && c.lease == t.lease => continue,
            (_, Some(t)) => {
                p.puts += 1;
                RestoreKey {
                    key: key.clone(),
                    delete: false,
                    value: t.value.clone(),
                    lease: t.lease,
                    expect_mod_revision,
                }
            }
            (Some(_), None) => {
                p.deletes += 1;
                RestoreKey {
                    key: key.clone(),
                    delete: true,
                    expect_mod_revision,
                    ..Default::default()
                }
            }
            (None, None) => continue,
        };
        chunks.room(k.key.len() + k.value.len() + KEY_OVERHEAD_BYTES);
        chunks.chunk.keys.push(k);
    }
    for id in revokes {
        chunks.room(REVOKE_BYTES);
        chunks.chunk.revokes.push(id);
    }
    p.chunks = chunks.finish();
    // Auth goes back with the keys, as etcd's snapshot restore brings its auth store back: the
    // users, password hashes, roles and enabled flag of the checkpoint. Guarded by the current
    // auth revision, as each key is by its mod revision.
    let (have, want) = (current.auth_export(), target.auth_export());
    if (have.enabled, &have.users, &have.roles) != (want.enabled, &want.users, &want.roles) {
        p.auth = Some(RestoreAuth {
            expect_auth_revision: have.expect_auth_revision,
            ..want
        });
    }
    for (i, c) in p.chunks.iter_mut().enumerate() {
        c.restore_id = p.restore_id.clone();
        c.seq = i as u32;
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::etcdserverpb::{
        DeleteRangeRequest, LeaseGrantRequest, LeaseRevokeRequest, PutRequest,
    };
    use api::strata::entry::Entry;
    use memstore::{Outcome, RestoreStep};
    use prost::Message;

    fn entry(n: u64, request: Request) -> Entry {
        let mut request_id = n.to_le_bytes().to_vec();
        request_id.resize(16, 9);
        Entry {
            format_version: api::ENTRY_FORMAT_VERSION,
            tenant: "t".into(),
            request_id,
            time_ms: 1_000 + n as i64,
            request: Some(request),
            ..Default::default()
        }
    }

    fn put(key: &str, value: &str, lease: i64) -> Request {
        Request::Put(PutRequest {
            key: key.into(),
            value: value.into(),
            lease,
            ..Default::default()
        })
    }

    struct Replica {
        store: MemStore,
        n: u64,
    }

    impl Replica {
        /// Applies `r` as the root user at the current auth revision (what a frontend appends
        /// for root once auth is enabled; ignored while it is not).
        fn apply(&mut self, r: Request) -> memstore::Applied {
            self.n += 1;
            let entry = Entry {
                user: "root".into(),
                auth_revision: self.store.auth_revision(),
                ..entry(self.n, r)
            };
            self.store.apply(self.n, &entry)
        }

        /// Applies the whole plan; the commit's outcome.
        fn restore(&mut self, p: &Plan) -> memstore::Applied {
            let mut last = None;
            for req in p.requests() {
                last = Some(self.apply(req));
            }
            last.unwrap()
        }
    }

    fn auth(change: api::strata::entry::auth_change::Change) -> Request {
        Request::Auth(api::strata::entry::AuthChange {
            change: Some(change),
        })
    }

    fn user_add(name: &str, hash: &str) -> Request {
        use api::strata::entry::auth_change::Change;
        auth(Change::UserAdd(api::etcdserverpb::AuthUserAddRequest {
            name: name.into(),
            hashed_password: hash.into(),
            ..Default::default()
        }))
    }

    fn grant_role(user: &str, role: &str) -> Request {
        use api::strata::entry::auth_change::Change;
        auth(Change::UserGrantRole(
            api::etcdserverpb::AuthUserGrantRoleRequest {
                user: user.into(),
                role: role.into(),
            },
        ))
    }

    fn role_add(name: &str) -> Request {
        use api::strata::entry::auth_change::Change;
        auth(Change::RoleAdd(api::etcdserverpb::AuthRoleAddRequest {
            name: name.into(),
        }))
    }

    #[test]
    fn auth_goes_back_with_the_keys_and_a_racing_auth_change_aborts_the_restore() {
        use api::strata::entry::auth_change::Change;
        let mut r = Replica {
            store: MemStore::new(memstore::Config::default()),
            n: 0,
        };
        r.apply(user_add("root", "aGFzaC1yb290"));
        r.apply(role_add("root"));
        r.apply(grant_role("root", "root"));
        r.apply(user_add("alice", "aGFzaC0x"));
        r.apply(role_add("reader"));
        r.apply(grant_role("alice", "reader"));
        r.apply(auth(Change::Enable(Default::default())));
        r.apply(put("k", "v", 0));
        let target = r.store.clone();
        assert!(
            plan(&r.store, &target, vec![1; 16], 1).is_empty(),
            "same auth, same keys: nothing to do"
        );
        // Diverge in auth only: alice's password changes, bob arrives, auth goes off.
        r.apply(auth(Change::UserChangePassword(
            api::etcdserverpb::AuthUserChangePasswordRequest {
                name: "alice".into(),
                hashed_password: "aGFzaC0y".into(),
                ..Default::default()
            },
        )));
        r.apply(user_add("bob", "aGFzaC0z"));
        r.apply(auth(Change::Disable(Default::default())));
        let p = plan(&r.store, &target, vec![2; 16], 1);
        assert!(!p.is_empty());
        assert_eq!(p.puts + p.deletes, 0, "{p:?}");
        let staged = p.auth.as_ref().expect("auth staged");
        assert_eq!(staged.expect_auth_revision, r.store.auth_revision());

        // An auth change racing the restore aborts it.
        let mut raced = Replica {
            store: r.store.clone(),
            n: r.n,
        };
        raced.apply(user_add("carol", "aGFzaC00"));
        let aborted = raced.restore(&p);
        assert!(
            matches!(&aborted.outcome, Outcome::Restore(RestoreStep::Aborted { reason }) if reason.contains("auth state changed")),
            "{:?}",
            aborted.outcome
        );
        assert!(raced.store.auth_user("carol").is_some());

        let before = r.store.auth_revision();
        let done = r.restore(&p);
        assert!(
            matches!(
                done.outcome,
                Outcome::Restore(RestoreStep::Committed { .. })
            ),
            "{:?}",
            done.outcome
        );
        assert!(r.store.auth_enabled());
        assert_eq!(r.store.auth_users(), vec!["alice", "root"]);
        assert_eq!(
            r.store.auth_user("alice").unwrap(),
            target.auth_user("alice").unwrap(),
            "alice's old password hash and roles"
        );
        assert_eq!(r.store.auth_roles(), target.auth_roles());
        assert_eq!(
            r.store.auth_revision(),
            before + 1,
            "one auth change, so tokens minted before it are checked again"
        );
        assert!(r.store.check_admin("root").is_ok());
        assert!(r.store.check_admin("alice").is_err());
        assert!(plan(&r.store, &target, vec![3; 16], 1).is_empty());
    }

    /// (key, value, lease) of every key, and the lease ids.
    type Visible = (Vec<(Vec<u8>, Vec<u8>, i64)>, Vec<i64>);

    fn keys_and_leases(s: &MemStore) -> Visible {
        let kvs = all_keys(s)
            .into_values()
            .map(|kv| (kv.key, kv.value, kv.lease))
            .collect();
        (kvs, leases(s).into_keys().collect())
    }

    #[test]
    fn the_plan_reaches_the_target_at_one_revision_and_a_racing_write_aborts_it() {
        let mut r = Replica {
            store: MemStore::new(memstore::Config::default()),
            n: 0,
        };
        r.apply(Request::LeaseGrant(LeaseGrantRequest { ttl: 600, id: 7 }));
        for i in 0..200 {
            r.apply(put(
                &format!("k{i:03}"),
                &"old".repeat(2000),
                if i % 10 == 0 { 7 } else { 0 },
            ));
        }
        let target = r.store.clone();
        // Diverge: change, delete, add keys, a new lease, revoke lease 7 (deleting its keys).
        r.apply(put("k001", "new", 0));
        r.apply(Request::DeleteRange(DeleteRangeRequest {
            key: b"k002".to_vec(),
            ..Default::default()
        }));
        r.apply(Request::LeaseGrant(LeaseGrantRequest { ttl: 600, id: 8 }));
        for i in 200..300 {
            r.apply(put(&format!("k{i:03}"), "extra", 8));
        }
        r.apply(Request::LeaseRevoke(LeaseRevokeRequest { id: 7 }));
        let before = r.store.revision();

        let p = plan(&r.store, &target, vec![1; 16], 42);
        assert_eq!((p.grants, p.revokes), (1, 1), "{p:?}");
        assert_eq!(p.deletes, 100);
        assert_eq!(
            p.puts,
            2 + 20,
            "k001, k002 and the 20 keys revoked with lease 7"
        );
        // Every chunk fits in a journal entry.
        for c in &p.chunks {
            assert!(c.encoded_len() < 2 * 1024 * 1024);
        }

        // A write racing the restore aborts all of it.
        let mut raced = Replica {
            store: r.store.clone(),
            n: r.n,
        };
        raced.apply(put("k150", "racing", 0));
        let rev = raced.store.revision();
        let aborted = raced.restore(&p);
        assert!(
            matches!(
                aborted.outcome,
                Outcome::Restore(RestoreStep::Aborted { .. })
            ),
            "{:?}",
            aborted.outcome
        );
        assert_eq!(raced.store.revision(), rev, "nothing changed");

        let committed = r.restore(&p);
        assert!(
            matches!(
                committed.outcome,
                Outcome::Restore(RestoreStep::Committed { revision, .. }) if revision == before + 1
            ),
            "{:?}",
            committed.outcome
        );
        assert_eq!(keys_and_leases(&r.store), keys_and_leases(&target));
        assert!(plan(&r.store, &target, vec![2; 16], 42).is_empty());
    }

    #[test]
    fn large_diffs_are_split_into_chunks_that_fit_an_entry() {
        let mut r = Replica {
            store: MemStore::new(memstore::Config::default()),
            n: 0,
        };
        for i in 0..40 {
            r.apply(put(&format!("big{i:02}"), &"v".repeat(100_000), 0));
        }
        let target = r.store.clone();
        r.apply(Request::DeleteRange(DeleteRangeRequest {
            key: b"big".to_vec(),
            range_end: b"bih".to_vec(),
            ..Default::default()
        }));
        for i in 0..(MAX_CHUNK_KEYS + 10) {
            r.apply(put(&format!("tiny{i:05}"), "v", 0));
        }
        let p = plan(&r.store, &target, vec![3; 16], 1);
        assert_eq!((p.puts, p.deletes), (40, MAX_CHUNK_KEYS + 10));
        assert!(p.chunks.len() >= 3, "{}", p.chunks.len());
        for (i, c) in p.chunks.iter().enumerate() {
            assert_eq!(c.seq as usize, i);
            assert!(c.keys.len() <= MAX_CHUNK_KEYS);
            assert!(c.encoded_len() < 2 * 1024 * 1024);
        }
        assert!(matches!(
            r.restore(&p).outcome,
            Outcome::Restore(RestoreStep::Committed { .. })
        ));
        assert_eq!(keys_and_leases(&r.store), keys_and_leases(&target));
    }

    /// Lease changes are spread over chunks and counted in their size: a restore that grants
    /// and revokes a hundred thousand leases each (found by review: all of them went into one
    /// chunk, larger than a journal entry, so such a restore could never succeed) still fits,
    /// and reaches the target.
    #[test]
    fn many_lease_changes_are_split_into_chunks_that_fit_an_entry() {
        const LEASES: i64 = 100_000;
        let mut r = Replica {
            store: MemStore::new(memstore::Config::default()),
            n: 0,
        };
        r.apply(put("k", &"v".repeat(900_000), 0));
        for id in 1..=LEASES {
            r.apply(Request::LeaseGrant(LeaseGrantRequest { ttl: 3_600, id }));
        }
        let target = r.store.clone();
        for id in 1..=LEASES {
            r.apply(Request::LeaseRevoke(LeaseRevokeRequest { id }));
        }
        for id in LEASES + 1..=2 * LEASES {
            r.apply(Request::LeaseGrant(LeaseGrantRequest { ttl: 3_600, id }));
        }
        r.apply(put("k", "changed", 0));
        let p = plan(&r.store, &target, vec![4; 16], 1);
        assert_eq!((p.grants, p.revokes), (LEASES as usize, LEASES as usize));
        assert!(p.chunks.len() >= 3, "{}", p.chunks.len());
        for c in &p.chunks {
            assert!(
                c.encoded_len() <= MAX_CHUNK_BYTES + MAX_CHUNK_BYTES / 4,
                "a chunk of {} bytes",
                c.encoded_len()
            );
        }
        assert!(matches!(
            r.restore(&p).outcome,
            Outcome::Restore(RestoreStep::Committed { .. })
        ));
        assert_eq!(keys_and_leases(&r.store), keys_and_leases(&target));
    }
}
