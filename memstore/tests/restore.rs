//! The staged restore: a commit reaches the same keys and leases as the diff it carries, at one
//! new revision with every event there; an abort (a guard that no longer holds) changes nothing
//! but drops the stage; a stage survives a checkpoint; a newer Begin replaces an abandoned one;
//! and against a model, a commit equals its diff applied as one txn (equal HashKV and events).
mod common;

use std::collections::BTreeMap;

use api::etcdserverpb::{LeaseGrantRequest, PutRequest, RangeRequest};
use api::strata::entry::entry::Request;
use api::strata::entry::{RestoreBegin, RestoreChunk, RestoreCommit, RestoreKey, RestoreLease};
use common::*;
use memstore::{MemStore, Outcome, RestoreStep};

/// key -> (value, lease) of every live key.
fn visible(s: &MemStore) -> BTreeMap<Vec<u8>, (Vec<u8>, i64)> {
    let all = RangeRequest {
        key: vec![0],
        range_end: vec![0],
        ..Default::default()
    };
    s.range(&all)
        .unwrap()
        .kvs
        .into_iter()
        .map(|kv| (kv.key, (kv.value, kv.lease)))
        .collect()
}

fn lease_ids(s: &MemStore) -> Vec<i64> {
    s.lease_leases().leases.iter().map(|l| l.id).collect()
}

/// The chunks that turn `current` into `target` (keys at most `per_chunk` per chunk).
fn diff(current: &MemStore, target: &MemStore, id: &[u8], per_chunk: usize) -> Vec<RestoreChunk> {
    let by_key = |store: &MemStore| -> BTreeMap<_, _> {
        let all = RangeRequest {
            key: vec![0],
            range_end: vec![0],
            ..Default::default()
        };
        store
            .range(&all)
            .unwrap()
            .kvs
            .into_iter()
            .map(|kv| (kv.key.clone(), kv))
            .collect()
    };
    let cur = by_key(current);
    let tgt = by_key(target);
    let mut keys = Vec::new();
    for key in cur
        .keys()
        .chain(tgt.keys())
        .collect::<std::collections::BTreeSet<_>>()
    {
        let c = cur.get(key);
        let expect_mod_revision = c.map_or(0, |kv| kv.mod_revision);
        match (c, tgt.get(key)) {
            (Some(c), Some(t)) if c.value == t.value && c.lease == t.lease => {}
            (_, Some(t)) => keys.push(RestoreKey {
                key: key.clone(),
                delete: false,
                value: t.value.clone(),
                lease: t.lease,
                expect_mod_revision,
            }),
            (Some(_), None) => keys.push(RestoreKey {
                key: key.clone(),
                delete: true,
                expect_mod_revision,
                ..Default::default()
            }),
            (None, None) => {}
        }
    }
    let (cl, tl) = (lease_ids(current), lease_ids(target));
    let grants: Vec<RestoreLease> = tl
        .iter()
        .filter(|id| !cl.contains(id))
        .map(|&id| RestoreLease {
            id,
            ttl: target.lease_time_to_live(id, false).unwrap().granted_ttl,
        })
        .collect();
    let revokes: Vec<i64> = cl.iter().copied().filter(|id| !tl.contains(id)).collect();
    let mut chunks: Vec<RestoreChunk> = keys
        .chunks(per_chunk.max(1))
        .map(|ks| RestoreChunk {
            restore_id: id.to_vec(),
            keys: ks.to_vec(),
            ..Default::default()
        })
        .collect();
    if chunks.is_empty() {
        chunks.push(RestoreChunk {
            restore_id: id.to_vec(),
            ..Default::default()
        });
    }
    chunks[0].grants = grants;
    chunks.last_mut().unwrap().revokes = revokes;
    for (i, c) in chunks.iter_mut().enumerate() {
        c.seq = i as u32;
    }
    chunks
}

fn begin(h: &mut Harness, id: &[u8]) -> Outcome {
    h.apply(Request::RestoreBegin(RestoreBegin {
        restore_id: id.to_vec(),
        checkpoint_index: 1,
    }))
    .outcome
}

fn stage(h: &mut Harness, chunks: &[RestoreChunk]) {
    for (i, c) in chunks.iter().enumerate() {
        assert_eq!(
            h.apply(Request::RestoreChunk(c.clone())).outcome,
            Outcome::Restore(RestoreStep::Staged {
                chunks: i as u32 + 1
            })
        );
    }
}

fn commit(h: &mut Harness, id: &[u8], chunks: usize) -> memstore::Applied {
    h.apply(Request::RestoreCommit(RestoreCommit {
        restore_id: id.to_vec(),
        chunks: chunks as u32,
        ..Default::default()
    }))
}

/// A history, a checkpoint-like copy of it (the target), then divergence.
fn diverged(seed: u64) -> (Harness, MemStore) {
    let mut rng = seed;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let mut h = Harness::new();
    h.grant(7, 600);
    h.grant(8, 600);
    let mut target = None;
    for round in 0..2 {
        for _ in 0..300 {
            let k = format!("k{:03}", next(200));
            match next(10) {
                0 => {
                    h.del(&k, "");
                }
                1 | 2 => {
                    h.apply(Request::Put(PutRequest {
                        key: k.into(),
                        value: format!("leased-{round}").into(),
                        lease: 7 + next(2) as i64,
                        ..Default::default()
                    }));
                }
                _ => {
                    h.put(&k, &format!("v{round}-{}", next(1000)));
                }
            }
        }
        if round == 0 {
            target = Some(h.store.clone());
            h.revoke(7);
            h.grant(9, 600);
            h.apply(Request::Put(PutRequest {
                key: "on-nine".into(),
                value: "x".into(),
                lease: 9,
                ..Default::default()
            }));
        }
    }
    (h, target.unwrap())
}

#[test]
fn a_commit_reaches_the_target_at_one_revision() {
    for seed in [1u64, 2, 3, 0x5eed, 0xdead_beef] {
        println!("replay with seed {seed}");
        let (mut h, target) = diverged(seed);
        let id = vec![1u8; 16];
        let chunks = diff(&h.store, &target, &id, 37);
        assert!(chunks.len() > 2, "{}", chunks.len());
        assert_eq!(begin(&mut h, &id), Outcome::Restore(RestoreStep::Begun));
        let before = h.store.revision();
        let visible_before = visible(&h.store);
        stage(&mut h, &chunks);
        // Staging changes nothing a reader sees.
        assert_eq!(h.store.revision(), before);
        assert_eq!(visible(&h.store), visible_before);
        assert_eq!(h.store.staged_restore(), Some((&id[..], chunks.len())));

        let applied = commit(&mut h, &id, chunks.len());
        let Outcome::Restore(RestoreStep::Committed { revision, keys }) = applied.outcome else {
            panic!("{:?}", applied.outcome);
        };
        assert_eq!(revision, before + 1, "one revision for the whole restore");
        assert_eq!(h.store.revision(), revision);
        assert_eq!(visible(&h.store), visible(&target));
        assert_eq!(lease_ids(&h.store), lease_ids(&target));
        assert_eq!(h.store.staged_restore(), None);
        // Every event at that revision, in key order (lease revokes' deletes last), and the
        // same events a watcher replays from history.
        assert_eq!(applied.events.len() as u64, keys);
        assert!(
            applied
                .events
                .iter()
                .all(|e| e.kv.as_ref().unwrap().mod_revision == revision)
        );
        let mut replayed = h.store.events(revision, b"\0", b"\0", usize::MAX).unwrap();
        let mut got = applied.events.clone();
        let key = |e: &api::mvccpb::Event| e.kv.as_ref().unwrap().key.clone();
        replayed.sort_by_key(key);
        got.sort_by_key(key);
        assert_eq!(replayed, got);
        // Nothing left to restore.
        let again = diff(&h.store, &target, &id, 37);
        assert!(
            again
                .iter()
                .all(|c| c.keys.is_empty() && c.grants.is_empty() && c.revokes.is_empty())
        );
    }
}

/// A store that applies a restore only to learn its outcome (the admin command's) stages that
/// restore without its values: the same outcomes as a replica's (committed at the same revision
/// with the same count, aborted for the same reason), its keys then without their values;
/// another restore's chunks keep theirs.
#[test]
fn a_restore_staged_without_values_has_a_replica_s_outcomes() {
    let id = vec![4u8; 16];
    let pair = |seed| {
        let (full, target) = diverged(seed);
        let (mut light, _) = diverged(seed);
        light.store.stage_restore_without_values(id.clone());
        (full, light, target)
    };
    for seed in [1u64, 0x5eed] {
        let (mut full, mut light, target) = pair(seed);
        let chunks = diff(&full.store, &target, &id, 37);
        for h in [&mut full, &mut light] {
            begin(h, &id);
            stage(h, &chunks);
        }
        let (a, b) = (
            commit(&mut full, &id, chunks.len()),
            commit(&mut light, &id, chunks.len()),
        );
        assert!(
            matches!(a.outcome, Outcome::Restore(RestoreStep::Committed { .. })),
            "{:?}",
            a.outcome
        );
        assert_eq!(a.outcome, b.outcome);
        assert_eq!(visible(&full.store), visible(&target));
        let (want, got) = (visible(&target), visible(&light.store));
        assert!(want.keys().eq(got.keys()), "the same keys");
        let put: Vec<&RestoreKey> = chunks.iter().flat_map(|c| &c.keys).collect();
        assert!(put.iter().any(|k| !k.delete && !k.value.is_empty()));
        for k in put.iter().filter(|k| !k.delete) {
            assert_eq!(
                got[&k.key],
                (Vec::new(), k.lease),
                "staged without its value"
            );
        }
    }
    // Aborted by a racing write: the same reason.
    let (mut full, mut light, target) = pair(11);
    let chunks = diff(&full.store, &target, &id, 50);
    let touched = String::from_utf8(chunks[1].keys[3].key.clone()).unwrap();
    let mut outcomes = Vec::new();
    for h in [&mut full, &mut light] {
        begin(h, &id);
        stage(h, &chunks);
        h.put(&touched, "racing");
        outcomes.push(commit(h, &id, chunks.len()).outcome);
    }
    assert!(
        matches!(outcomes[0], Outcome::Restore(RestoreStep::Aborted { .. })),
        "{outcomes:?}"
    );
    assert_eq!(outcomes[0], outcomes[1]);
    assert_eq!(visible(&light.store), visible(&full.store));
    // Another restore (someone else's, appended meanwhile) is staged whole.
    let (_, mut light, target) = pair(3);
    let other = vec![5u8; 16];
    let chunks = diff(&light.store, &target, &other, 37);
    begin(&mut light, &other);
    stage(&mut light, &chunks);
    commit(&mut light, &other, chunks.len());
    assert_eq!(visible(&light.store), visible(&target));
}

#[test]
fn a_moved_guard_aborts_and_changes_nothing() {
    let (mut h, target) = diverged(11);
    let id = vec![2u8; 16];
    let chunks = diff(&h.store, &target, &id, 50);
    begin(&mut h, &id);
    stage(&mut h, &chunks);
    // A write racing the restore, on a key the restore touches.
    let touched = String::from_utf8(chunks[1].keys[3].key.clone()).unwrap();
    h.put(&touched, "racing");
    let before = h.store.clone();
    let applied = commit(&mut h, &id, chunks.len());
    assert!(
        matches!(
            applied.outcome,
            Outcome::Restore(RestoreStep::Aborted { .. })
        ),
        "{:?}",
        applied.outcome
    );
    assert!(applied.events.is_empty());
    assert_eq!(h.store.revision(), before.revision());
    assert_eq!(h.store.hash_kv(0), before.hash_kv(0));
    assert_eq!(visible(&h.store), visible(&before));
    assert_eq!(lease_ids(&h.store), lease_ids(&before));
    assert_eq!(h.store.staged_restore(), None, "an abort drops the stage");
    // A second commit finds no stage.
    assert!(matches!(
        commit(&mut h, &id, chunks.len()).outcome,
        Outcome::Restore(RestoreStep::Aborted { .. })
    ));
}

#[test]
fn a_granted_lease_taken_meanwhile_or_a_missing_chunk_aborts() {
    let (mut h, target) = diverged(5);
    let id = vec![3u8; 16];
    let chunks = diff(&h.store, &target, &id, 40);
    assert!(chunks[0].grants.iter().any(|g| g.id == 7));
    begin(&mut h, &id);
    stage(&mut h, &chunks);
    h.apply(Request::LeaseGrant(LeaseGrantRequest { ttl: 60, id: 7 }));
    let before = visible(&h.store);
    assert!(matches!(
        commit(&mut h, &id, chunks.len()).outcome,
        Outcome::Restore(RestoreStep::Aborted { .. })
    ));
    assert_eq!(visible(&h.store), before);

    // A commit naming more chunks than were staged.
    h.revoke(7);
    let chunks = diff(&h.store, &target, &id, 40);
    begin(&mut h, &id);
    stage(&mut h, &chunks[..chunks.len() - 1]);
    let rev = h.store.revision();
    assert!(matches!(
        commit(&mut h, &id, chunks.len()).outcome,
        Outcome::Restore(RestoreStep::Aborted { .. })
    ));
    assert_eq!(h.store.revision(), rev);
}

#[test]
fn chunks_must_follow_their_begin_in_order_and_a_newer_begin_replaces_the_stage() {
    let (mut h, target) = diverged(9);
    let old = vec![4u8; 16];
    let new = vec![5u8; 16];
    let chunks = diff(&h.store, &target, &old, 60);
    // No stage yet.
    assert!(matches!(
        h.apply(Request::RestoreChunk(chunks[0].clone())).outcome,
        Outcome::Restore(RestoreStep::Aborted { .. })
    ));
    begin(&mut h, &old);
    // Out of sequence.
    assert!(matches!(
        h.apply(Request::RestoreChunk(chunks[1].clone())).outcome,
        Outcome::Restore(RestoreStep::Aborted { .. })
    ));
    stage(&mut h, &chunks[..1]);
    // An abandoned stage: a newer Begin drops it; the old id's chunks and commit are refused.
    begin(&mut h, &new);
    assert_eq!(h.store.staged_restore(), Some((&new[..], 0)));
    assert!(matches!(
        h.apply(Request::RestoreChunk(chunks[1].clone())).outcome,
        Outcome::Restore(RestoreStep::Aborted { .. })
    ));
    assert!(matches!(
        commit(&mut h, &old, 1).outcome,
        Outcome::Restore(RestoreStep::Aborted { .. })
    ));
    assert_eq!(
        h.store.staged_restore(),
        Some((&new[..], 0)),
        "kept for its own commit"
    );
    let fresh = diff(&h.store, &target, &new, 60);
    stage(&mut h, &fresh);
    assert!(matches!(
        commit(&mut h, &new, fresh.len()).outcome,
        Outcome::Restore(RestoreStep::Committed { .. })
    ));
    assert_eq!(visible(&h.store), visible(&target));
}

#[test]
fn a_stage_survives_a_checkpoint() {
    let (mut h, target) = diverged(21);
    let id = vec![6u8; 16];
    let chunks = diff(&h.store, &target, &id, 30);
    begin(&mut h, &id);
    let half = chunks.len() / 2;
    stage(&mut h, &chunks[..half]);
    let loaded = reload(&h.store);
    assert!(loaded == h.store);
    assert_eq!(loaded.staged_restore(), Some((&id[..], half)));
    let mut other = Harness {
        store: loaded,
        index: h.index,
        now_ms: h.now_ms,
    };
    stage_from(&mut h, &chunks, half);
    stage_from(&mut other, &chunks, half);
    let a = commit(&mut h, &id, chunks.len());
    let b = commit(&mut other, &id, chunks.len());
    assert!(matches!(
        a.outcome,
        Outcome::Restore(RestoreStep::Committed { .. })
    ));
    assert_eq!(a, b);
    assert!(h.store == other.store);
    assert_eq!(visible(&h.store), visible(&target));
}

fn stage_from(h: &mut Harness, chunks: &[RestoreChunk], from: usize) {
    for c in &chunks[from..] {
        assert!(matches!(
            h.apply(Request::RestoreChunk(c.clone())).outcome,
            Outcome::Restore(RestoreStep::Staged { .. })
        ));
    }
}

/// The model: a commit leaves exactly the state (every version, revision, sub-revision, create
/// revision and version: equal HashKV) that applying its diff as lease grants, ONE txn of all
/// its puts and deletes in key order, then lease revokes, leaves.
#[test]
fn a_commit_equals_its_diff_applied_as_one_txn() {
    use api::etcdserverpb::{
        DeleteRangeRequest, LeaseRevokeRequest, RequestOp, TxnRequest, request_op,
    };
    for seed in [4u64, 8, 15, 16, 23, 42] {
        println!("replay with seed {seed}");
        let (mut h, target) = diverged(seed);
        let id = vec![7u8; 16];
        let chunks = diff(&h.store, &target, &id, 45);
        let mut model = Harness {
            store: h.store.clone(),
            index: h.index,
            now_ms: h.now_ms,
        };
        model.store.set_config(memstore::Config {
            max_txn_ops: 1 << 20,
            ..Default::default()
        });

        begin(&mut h, &id);
        stage(&mut h, &chunks);
        let committed = commit(&mut h, &id, chunks.len());
        assert!(matches!(
            committed.outcome,
            Outcome::Restore(RestoreStep::Committed { .. })
        ));

        for g in chunks.iter().flat_map(|c| &c.grants) {
            model.apply(Request::LeaseGrant(LeaseGrantRequest {
                ttl: g.ttl,
                id: g.id,
            }));
        }
        let ops = chunks
            .iter()
            .flat_map(|c| &c.keys)
            .map(|k| RequestOp {
                request: Some(if k.delete {
                    request_op::Request::RequestDeleteRange(DeleteRangeRequest {
                        key: k.key.clone(),
                        ..Default::default()
                    })
                } else {
                    request_op::Request::RequestPut(PutRequest {
                        key: k.key.clone(),
                        value: k.value.clone(),
                        lease: k.lease,
                        ..Default::default()
                    })
                }),
            })
            .collect();
        let txn = model.txn(TxnRequest {
            success: ops,
            ..Default::default()
        });
        assert!(
            matches!(txn.outcome, Outcome::Txn(ref t) if t.succeeded),
            "{:?}",
            txn.outcome
        );
        for &l in chunks.iter().flat_map(|c| &c.revokes) {
            model.apply(Request::LeaseRevoke(LeaseRevokeRequest { id: l }));
        }
        assert_eq!(h.store.revision(), model.store.revision());
        assert_eq!(h.store.hash_kv(0), model.store.hash_kv(0));
        assert_eq!(visible(&h.store), visible(&model.store));
        assert_eq!(lease_ids(&h.store), lease_ids(&model.store));
        assert_eq!(committed.events, txn.events);
    }
}

/// A key attached, after the restore was planned, to a lease the restore revokes would be
/// deleted by the revoke: a racing write lost. The commit aborts instead.
#[test]
fn a_key_attached_meanwhile_to_a_revoked_lease_aborts() {
    let (mut h, target, chunks, revoked) = (1..50)
        .find_map(|seed| {
            let (h, target) = diverged(seed);
            let chunks = diff(&h.store, &target, &[4u8; 16], 40);
            let revoked = chunks
                .iter()
                .flat_map(|c| c.revokes.iter())
                .next()
                .copied()?;
            Some((h, target, chunks, revoked))
        })
        .expect("a diverged pair whose restore revokes a lease");
    let id = vec![4u8; 16];
    begin(&mut h, &id);
    stage(&mut h, &chunks);
    h.apply(Request::Put(PutRequest {
        key: b"racing/new".to_vec(),
        value: b"v".to_vec(),
        lease: revoked,
        ..Default::default()
    }));
    let before = visible(&h.store);
    let applied = commit(&mut h, &id, chunks.len());
    let Outcome::Restore(RestoreStep::Aborted { reason }) = &applied.outcome else {
        panic!("committed: {:?}", applied.outcome);
    };
    assert!(reason.contains("revokes"), "{reason}");
    assert_eq!(visible(&h.store), before);
    assert!(visible(&h.store).contains_key(&b"racing/new"[..]));

    // Planned again from the state as it is now, it commits and reaches the target.
    let chunks = diff(&h.store, &target, &id, 40);
    begin(&mut h, &id);
    stage(&mut h, &chunks);
    assert!(matches!(
        commit(&mut h, &id, chunks.len()).outcome,
        Outcome::Restore(RestoreStep::Committed { .. })
    ));
    assert_eq!(visible(&h.store), visible(&target));
}

/// A commit carrying an auth state: put in place as one auth change when it is one etcd could
/// reach (unique names; enabled only with the root user holding the root role), refused whole
/// otherwise, with the keys it stages left alone.
#[test]
fn a_staged_auth_state_is_checked_then_put_in_place_with_the_keys() {
    use api::authpb::{Permission, Role, User};
    use api::strata::entry::RestoreAuth;
    let user = |name: &str, roles: &[&str]| User {
        name: name.into(),
        password: format!("hash-of-{name}").into_bytes(),
        roles: roles.iter().map(|r| r.to_string()).collect(),
        options: None,
    };
    let role = |name: &str| Role {
        name: name.into(),
        key_permission: vec![Permission {
            perm_type: 0,
            key: b"a".to_vec(),
            range_end: b"b".to_vec(),
        }],
    };
    let chunk = |id: &[u8]| RestoreChunk {
        restore_id: id.to_vec(),
        seq: 0,
        keys: vec![RestoreKey {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let commit_with = |h: &mut Harness, id: &[u8], auth: RestoreAuth| {
        begin(h, id);
        stage(h, &[chunk(id)]);
        h.apply(Request::RestoreCommit(RestoreCommit {
            restore_id: id.to_vec(),
            chunks: 1,
            auth: Some(auth),
        }))
        .outcome
    };
    let mut h = Harness::new();
    let rev = h.store.auth_revision();
    let refused = [
        (
            "auth cannot be enabled",
            RestoreAuth {
                enabled: true,
                users: vec![user("root", &[])],
                roles: vec![role("root")],
                expect_auth_revision: rev,
            },
        ),
        (
            "restored twice",
            RestoreAuth {
                users: vec![user("alice", &[]), user("alice", &["r"])],
                expect_auth_revision: rev,
                ..Default::default()
            },
        ),
        (
            "auth state changed",
            RestoreAuth {
                users: vec![user("alice", &[])],
                expect_auth_revision: rev + 1,
                ..Default::default()
            },
        ),
    ];
    for (i, (why, auth)) in refused.into_iter().enumerate() {
        let outcome = commit_with(&mut h, &[i as u8; 16], auth);
        assert!(
            matches!(&outcome, Outcome::Restore(RestoreStep::Aborted { reason }) if reason.contains(why)),
            "{why}: {outcome:?}"
        );
        assert_eq!(
            h.store.revision(),
            1,
            "{why}: the staged key was not written"
        );
        assert_eq!(h.store.auth_revision(), rev, "{why}: auth unchanged");
    }

    let outcome = commit_with(
        &mut h,
        &[9; 16],
        RestoreAuth {
            enabled: true,
            users: vec![user("root", &["root"]), user("alice", &["reader", "a"])],
            roles: vec![role("root"), role("reader")],
            expect_auth_revision: rev,
        },
    );
    assert!(
        matches!(outcome, Outcome::Restore(RestoreStep::Committed { .. })),
        "{outcome:?}"
    );
    assert_eq!(
        h.store.revision(),
        2,
        "the key and the auth state in one commit"
    );
    assert!(h.store.auth_enabled());
    assert_eq!(h.store.auth_revision(), rev + 1);
    assert_eq!(h.store.auth_users(), vec!["alice", "root"]);
    assert_eq!(
        h.store.auth_user("alice").unwrap().roles,
        vec!["a", "reader"],
        "roles kept sorted, as grants keep them"
    );
    assert!(h.store.check_admin("root").is_ok());
    // Permissions derived from the restored roles are in force.
    let alice = memstore::Caller {
        user: "alice",
        revision: h.store.auth_revision(),
    };
    assert!(h.store.check_read(alice, b"a", b"").is_ok());
    assert!(h.store.check_read(alice, b"c", b"").is_err());
    // The state round-trips: what a plan exports is what was restored.
    let exported = h.store.auth_export();
    assert!(exported.enabled);
    assert_eq!(exported.users.len(), 2);
    assert_eq!(exported.expect_auth_revision, rev + 1);
}
