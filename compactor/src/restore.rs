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

use std::cell::OnceCell;
use std::collections::BTreeMap;
use std::iter::Peekable;

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
/// Keys read from each store at a time while the two are compared: the plan holds a page of
/// each and the chunk being filled, never a copy of either store (a 1M-key restore from an etcd
/// snapshot held every key three times over: ~4.9x the snapshot).
const PAGE_KEYS: i64 = 1024;

/// The staged restore that turns one state into another. Made by [`plan`], which walks both
/// stores once to count what changes; [`Plan::requests`] walks them again to make the chunks
/// one at a time, so neither walk holds more than a page of keys and one chunk.
pub struct Plan<'a> {
    current: &'a MemStore,
    target: &'a MemStore,
    pub restore_id: Vec<u8>,
    pub checkpoint_index: u64,
    /// Leases of the target that `current` lacks, with their granted TTLs.
    grant_list: Vec<RestoreLease>,
    /// Leases of `current` that the target lacks.
    revoke_list: Vec<i64>,
    /// Chunks the requests carry; never zero (a restore with no change to keys still carries
    /// its lease changes).
    pub chunks: usize,
    pub grants: usize,
    pub puts: usize,
    pub deletes: usize,
    pub revokes: usize,
    /// The target's auth state (users, roles, the enabled flag), when it differs from the
    /// current one; applied at the commit.
    pub auth: Option<RestoreAuth>,
    /// Why a walk over the stores stopped early, if one did.
    walk_failed: OnceCell<memstore::Error>,
}

impl std::fmt::Debug for Plan<'_> {
    /// What the plan changes, without the two stores it walks.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan")
            .field("checkpoint_index", &self.checkpoint_index)
            .field("chunks", &self.chunks)
            .field("grants", &self.grants)
            .field("puts", &self.puts)
            .field("deletes", &self.deletes)
            .field("revokes", &self.revokes)
            .field("auth", &self.auth.is_some())
            .finish()
    }
}

impl Plan<'_> {
    /// Nothing to change.
    pub fn is_empty(&self) -> bool {
        self.grants + self.puts + self.deletes + self.revokes == 0 && self.auth.is_none()
    }

    /// The entries to append, in order: begin, every chunk, commit ([`Plan::request_count`] of
    /// them), each made when it is asked for. The commit names the chunk count the plan
    /// counted, which the stage checks: a walk that made other chunks could not commit.
    pub fn requests(&self) -> impl Iterator<Item = Request> + '_ {
        let begin = Request::RestoreBegin(RestoreBegin {
            restore_id: self.restore_id.clone(),
            checkpoint_index: self.checkpoint_index,
        });
        let commit = Request::RestoreCommit(RestoreCommit {
            restore_id: self.restore_id.clone(),
            chunks: self.chunks as u32,
            auth: self.auth.clone(),
        });
        std::iter::once(begin)
            .chain(self.chunk_iter().map(Request::RestoreChunk))
            .chain(std::iter::once(commit))
    }

    /// How many entries [`Plan::requests`] makes.
    pub fn request_count(&self) -> usize {
        self.chunks + 2
    }

    /// The chunks, made one at a time from a walk over both stores.
    fn chunk_iter(&self) -> Chunks<'_, impl Iterator<Item = Item> + '_> {
        Chunks {
            items: self
                .grant_list
                .iter()
                .cloned()
                .map(Item::Grant)
                .chain(Diff::new(self.current, self.target, &self.walk_failed).map(Item::Key))
                .chain(self.revoke_list.iter().copied().map(Item::Revoke)),
            restore_id: &self.restore_id,
            chunk: RestoreChunk::default(),
            bytes: 0,
            items_in_chunk: 0,
            seq: 0,
            done: false,
        }
    }
}

/// Every live key of a store in key order, read a page at a time at the store's revision.
struct Keys<'a> {
    store: &'a MemStore,
    page: std::vec::IntoIter<KeyValue>,
    /// Where the next page starts; `None` once the last page is read.
    next: Option<Vec<u8>>,
    /// Where a failed read is told.
    failed: &'a OnceCell<memstore::Error>,
}

impl<'a> Keys<'a> {
    fn new(store: &'a MemStore, failed: &'a OnceCell<memstore::Error>) -> Self {
        Self {
            store,
            page: Vec::new().into_iter(),
            next: Some(vec![0]),
            failed,
        }
    }
}

impl Iterator for Keys<'_> {
    type Item = KeyValue;

    fn next(&mut self) -> Option<KeyValue> {
        loop {
            if let Some(kv) = self.page.next() {
                return Some(kv);
            }
            let key = self.next.take()?;
            let req = RangeRequest {
                key,
                range_end: vec![0],
                limit: PAGE_KEYS,
                ..Default::default()
            };
            // A range at the head of a store nobody writes to does not fail (no revision to be
            // compacted or in the future). Were it to, the walk ends and says so: `plan` fails;
            // in `Plan::requests` the chunks fall short of the count in the commit, and the
            // stage refuses it.
            let resp = match self.store.range(&req) {
                Ok(resp) => resp,
                Err(e) => {
                    let _ = self.failed.set(e);
                    return None;
                }
            };
            if resp.more
                && let Some(last) = resp.kvs.last()
            {
                let mut after = last.key.clone();
                after.push(0);
                self.next = Some(after);
            }
            self.page = resp.kvs.into_iter();
        }
    }
}

/// The keys to stage, in key order: each key whose value or lease differs in the target, or
/// that only one side has, guarded by the mod revision (or absence) it has in `current`.
struct Diff<'a> {
    current: Peekable<Keys<'a>>,
    target: Peekable<Keys<'a>>,
}

impl<'a> Diff<'a> {
    fn new(
        current: &'a MemStore,
        target: &'a MemStore,
        failed: &'a OnceCell<memstore::Error>,
    ) -> Self {
        Self {
            current: Keys::new(current, failed).peekable(),
            target: Keys::new(target, failed).peekable(),
        }
    }
}

impl Iterator for Diff<'_> {
    type Item = RestoreKey;

    fn next(&mut self) -> Option<RestoreKey> {
        use std::cmp::Ordering::{Equal, Greater, Less};
        loop {
            let order = match (self.current.peek(), self.target.peek()) {
                (None, None) => return None,
                (Some(_), None) => Less,
                (None, Some(_)) => Greater,
                (Some(c), Some(t)) => c.key.cmp(&t.key),
            };
            let (c, t) = match order {
                Less => (self.current.next(), None),
                Greater => (None, self.target.next()),
                Equal => (self.current.next(), self.target.next()),
            };
            let expect_mod_revision = c.as_ref().map_or(0, |kv| kv.mod_revision);
            match (c, t) {
                (Some(c), Some(t)) if c.value == t.value && c.lease == t.lease => continue,
                (_, Some(t)) => {
                    return Some(RestoreKey {
                        key: t.key,
                        delete: false,
                        value: t.value,
                        lease: t.lease,
                        expect_mod_revision,
                    });
                }
                (Some(c), None) => {
                    return Some(RestoreKey {
                        key: c.key,
                        delete: true,
                        expect_mod_revision,
                        ..Default::default()
                    });
                }
                (None, None) => return None,
            }
        }
    }
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

/// One change a chunk carries.
enum Item {
    Grant(RestoreLease),
    Key(RestoreKey),
    Revoke(i64),
}

impl Item {
    fn size(&self) -> usize {
        match self {
            Item::Grant(_) => GRANT_BYTES,
            Item::Key(k) => k.key.len() + k.value.len() + KEY_OVERHEAD_BYTES,
            Item::Revoke(_) => REVOKE_BYTES,
        }
    }
}

/// Fills chunks up to `MAX_CHUNK_BYTES` (estimated) and `MAX_CHUNK_KEYS` items each, in the
/// order of the items: lease grants first (the keys may name them), then keys, then revokes
/// (the commit gathers them from every chunk). Lease changes count toward a chunk's size as
/// keys do: a tenant with a hundred thousand leases to grant or revoke must not make one chunk
/// larger than a journal entry. At least one chunk, even with no items.
struct Chunks<'a, I> {
    items: I,
    restore_id: &'a [u8],
    chunk: RestoreChunk,
    bytes: usize,
    items_in_chunk: usize,
    seq: u32,
    done: bool,
}

impl<I> Chunks<'_, I> {
    /// The chunk filled so far, numbered; a new one begins.
    fn seal(&mut self) -> RestoreChunk {
        let mut c = std::mem::take(&mut self.chunk);
        c.restore_id = self.restore_id.to_vec();
        c.seq = self.seq;
        self.seq += 1;
        self.bytes = 0;
        self.items_in_chunk = 0;
        c
    }

    fn add(&mut self, item: Item, size: usize) {
        self.bytes += size;
        self.items_in_chunk += 1;
        match item {
            Item::Grant(g) => self.chunk.grants.push(g),
            Item::Key(k) => self.chunk.keys.push(k),
            Item::Revoke(id) => self.chunk.revokes.push(id),
        }
    }
}

impl<I: Iterator<Item = Item>> Iterator for Chunks<'_, I> {
    type Item = RestoreChunk;

    fn next(&mut self) -> Option<RestoreChunk> {
        if self.done {
            return None;
        }
        loop {
            let Some(item) = self.items.next() else {
                self.done = true;
                return (self.items_in_chunk > 0 || self.seq == 0).then(|| self.seal());
            };
            let size = item.size();
            let full = self.items_in_chunk > 0
                && (self.bytes + size > MAX_CHUNK_BYTES || self.items_in_chunk >= MAX_CHUNK_KEYS);
            if full {
                let sealed = self.seal();
                self.add(item, size);
                return Some(sealed);
            }
            self.add(item, size);
        }
    }
}

/// The staged restore (named `restore_id`) that makes `current` end with `target`'s keys,
/// values and key-to-lease attachments, `target`'s set of leases, and `target`'s auth state.
/// Leases missing in `current` are granted with their granted TTL (their countdown restarts);
/// leases of both keep `current`'s deadline. Walks both stores once to count the changes and
/// chunks, keeping none of them; fails only if a store cannot be read.
pub fn plan<'a>(
    current: &'a MemStore,
    target: &'a MemStore,
    restore_id: Vec<u8>,
    checkpoint_index: u64,
) -> Result<Plan<'a>, memstore::Error> {
    let cur_leases = leases(current);
    let tgt_leases = leases(target);
    let grant_list: Vec<RestoreLease> = tgt_leases
        .iter()
        .filter(|(id, _)| !cur_leases.contains_key(id))
        .map(|(&id, &ttl)| RestoreLease {
            id,
            ttl: ttl.max(1),
        })
        .collect();
    let revoke_list: Vec<i64> = cur_leases
        .keys()
        .copied()
        .filter(|id| !tgt_leases.contains_key(id))
        .collect();
    // Auth goes back with the keys, as etcd's snapshot restore brings its auth store back: the
    // users, password hashes, roles and enabled flag of the checkpoint. Guarded by the current
    // auth revision, as each key is by its mod revision.
    let (have, want) = (current.auth_export(), target.auth_export());
    let auth =
        if (have.enabled, &have.users, &have.roles) != (want.enabled, &want.users, &want.roles) {
            Some(RestoreAuth {
                expect_auth_revision: have.expect_auth_revision,
                ..want
            })
        } else {
            None
        };
    let mut p = Plan {
        current,
        target,
        restore_id,
        checkpoint_index,
        grants: grant_list.len(),
        revokes: revoke_list.len(),
        grant_list,
        revoke_list,
        chunks: 0,
        puts: 0,
        deletes: 0,
        auth,
        walk_failed: OnceCell::new(),
    };
    let (mut chunks, mut puts, mut deletes) = (0, 0, 0);
    for c in p.chunk_iter() {
        chunks += 1;
        let deleted = c.keys.iter().filter(|k| k.delete).count();
        deletes += deleted;
        puts += c.keys.len() - deleted;
    }
    if let Some(e) = p.walk_failed.take() {
        return Err(e);
    }
    (p.chunks, p.puts, p.deletes) = (chunks, puts, deletes);
    Ok(p)
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

        /// Applies a plan's requests (made before this replica changes: the plan reads the
        /// stores it was made from); the commit's outcome.
        fn restore(&mut self, requests: Vec<Request>) -> memstore::Applied {
            let mut last = None;
            for req in requests {
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
            plan(&r.store, &target, vec![1; 16], 1).unwrap().is_empty(),
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
        let p = plan(&r.store, &target, vec![2; 16], 1).unwrap();
        let requests: Vec<Request> = p.requests().collect();
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
        let aborted = raced.restore(requests.clone());
        assert!(
            matches!(&aborted.outcome, Outcome::Restore(RestoreStep::Aborted { reason }) if reason.contains("auth state changed")),
            "{:?}",
            aborted.outcome
        );
        assert!(raced.store.auth_user("carol").is_some());

        let before = r.store.auth_revision();
        let done = r.restore(requests.clone());
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
        assert!(plan(&r.store, &target, vec![3; 16], 1).unwrap().is_empty());
    }

    /// (key, value, lease) of every key, and the lease ids.
    type Visible = (Vec<(Vec<u8>, Vec<u8>, i64)>, Vec<i64>);

    fn keys_and_leases(s: &MemStore) -> Visible {
        let kvs = Keys::new(s, &OnceCell::new())
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

        let p = plan(&r.store, &target, vec![1; 16], 42).unwrap();

        let requests: Vec<Request> = p.requests().collect();
        assert_eq!((p.grants, p.revokes), (1, 1), "{p:?}");
        assert_eq!(p.deletes, 100);
        assert_eq!(
            p.puts,
            2 + 20,
            "k001, k002 and the 20 keys revoked with lease 7"
        );
        // Every chunk fits in a journal entry.
        for c in p.chunk_iter() {
            assert!(c.encoded_len() < 2 * 1024 * 1024);
        }

        // A write racing the restore aborts all of it.
        let mut raced = Replica {
            store: r.store.clone(),
            n: r.n,
        };
        raced.apply(put("k150", "racing", 0));
        let rev = raced.store.revision();
        let aborted = raced.restore(requests.clone());
        assert!(
            matches!(
                aborted.outcome,
                Outcome::Restore(RestoreStep::Aborted { .. })
            ),
            "{:?}",
            aborted.outcome
        );
        assert_eq!(raced.store.revision(), rev, "nothing changed");

        let committed = r.restore(requests.clone());
        assert!(
            matches!(
                committed.outcome,
                Outcome::Restore(RestoreStep::Committed { revision, .. }) if revision == before + 1
            ),
            "{:?}",
            committed.outcome
        );
        assert_eq!(keys_and_leases(&r.store), keys_and_leases(&target));
        assert!(plan(&r.store, &target, vec![2; 16], 42).unwrap().is_empty());
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
        let p = plan(&r.store, &target, vec![3; 16], 1).unwrap();
        let requests: Vec<Request> = p.requests().collect();
        assert_eq!((p.puts, p.deletes), (40, MAX_CHUNK_KEYS + 10));
        assert!(p.chunks >= 3, "{p:?}");
        for (i, c) in p.chunk_iter().enumerate() {
            assert_eq!(c.seq as usize, i);
            assert!(c.keys.len() <= MAX_CHUNK_KEYS);
            assert!(c.encoded_len() < 2 * 1024 * 1024);
        }
        assert!(matches!(
            r.restore(requests.clone()).outcome,
            Outcome::Restore(RestoreStep::Committed { .. })
        ));
        assert_eq!(keys_and_leases(&r.store), keys_and_leases(&target));
    }

    /// The two stores are compared a page at a time; pages that break at different keys on the
    /// two sides (keys only one side has, every third value changed) still pair every key with
    /// its counterpart: the plan changes exactly the keys that differ.
    #[test]
    fn stores_compared_page_by_page_pair_every_key() {
        let n = 3 * PAGE_KEYS as usize + 7;
        let mut r = Replica {
            store: MemStore::new(memstore::Config::default()),
            n: 0,
        };
        for i in 0..n {
            if i % 5 != 1 {
                r.apply(put(&format!("k{i:05}"), "same", 0));
            }
        }
        let mut t = Replica {
            store: MemStore::new(memstore::Config::default()),
            n: 0,
        };
        let (mut puts, mut deletes) = (0, 0);
        for i in 0..n {
            match i % 5 {
                // Only the target has it.
                1 => {
                    puts += 1;
                    t.apply(put(&format!("k{i:05}"), "new", 0));
                }
                // Only the current state has it.
                2 => deletes += 1,
                _ if i % 3 == 0 => {
                    puts += 1;
                    t.apply(put(&format!("k{i:05}"), "changed", 0));
                }
                _ => {
                    t.apply(put(&format!("k{i:05}"), "same", 0));
                }
            }
        }
        let p = plan(&r.store, &t.store, vec![5; 16], 1).unwrap();
        assert_eq!((p.puts, p.deletes), (puts, deletes), "{p:?}");
        assert_eq!(p.chunk_iter().count(), p.chunks);
        let requests: Vec<Request> = p.requests().collect();
        assert_eq!(requests.len(), p.request_count());
        assert!(matches!(
            r.restore(requests).outcome,
            Outcome::Restore(RestoreStep::Committed { .. })
        ));
        assert_eq!(keys_and_leases(&r.store), keys_and_leases(&t.store));
        assert!(plan(&r.store, &t.store, vec![6; 16], 1).unwrap().is_empty());
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
        let p = plan(&r.store, &target, vec![4; 16], 1).unwrap();
        let requests: Vec<Request> = p.requests().collect();
        assert_eq!((p.grants, p.revokes), (LEASES as usize, LEASES as usize));
        assert!(p.chunks >= 3, "{p:?}");
        for c in p.chunk_iter() {
            assert!(
                c.encoded_len() <= MAX_CHUNK_BYTES + MAX_CHUNK_BYTES / 4,
                "a chunk of {} bytes",
                c.encoded_len()
            );
        }
        assert!(matches!(
            r.restore(requests.clone()).outcome,
            Outcome::Restore(RestoreStep::Committed { .. })
        ));
        assert_eq!(keys_and_leases(&r.store), keys_and_leases(&target));
    }
}
