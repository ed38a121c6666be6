//! The staged, all-or-nothing restore: `RestoreBegin` opens a stage in the store's state,
//! `RestoreChunk`s add changes to it, `RestoreCommit` applies all of them at one new revision
//! (sub-revisions in key order, like a txn) if every guard still holds, else drops the stage
//! and changes nothing. Pure like the rest of `apply`: every replica reaches the same outcome.

use std::collections::{BTreeMap, BTreeSet};

use api::etcdserverpb::PutRequest;
use api::mvccpb::Event;
use api::strata::entry::{RestoreBegin, RestoreChunk, RestoreCommit, RestoreKey, RestoreStage};
use prost::Message;

use crate::store::Writer;
use crate::{MemStore, Outcome};

/// Most bytes (keys and values) one stage may hold: a bound against a runaway writer. A restore
/// of a tenant at etcd's largest quota (8 GiB) fits.
pub const MAX_STAGE_BYTES: u64 = 8 * 1024 * 1024 * 1024;

/// What a restore entry did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestoreStep {
    /// A stage was opened (an older one, if any, dropped).
    Begun,
    /// A chunk was added; the stage holds `chunks` chunks.
    Staged { chunks: u32 },
    /// Every staged change was applied; the store is now at `revision`.
    Committed { revision: i64, keys: u64 },
    /// Nothing changed: a guard failed, or the entry did not fit the stage. A commit that
    /// aborts drops the stage.
    Aborted { reason: String },
}

/// A restore in progress.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Stage {
    pub begin: RestoreBegin,
    pub chunks: Vec<RestoreChunk>,
    pub bytes: u64,
}

// The staged messages hold only integers, booleans and bytes: equality is total.
impl Eq for Stage {}

impl Stage {
    /// As a checkpoint keeps it.
    pub fn encode(&self) -> Vec<u8> {
        RestoreStage {
            begin: Some(self.begin.clone()),
            chunks: self.chunks.clone(),
        }
        .encode_to_vec()
    }

    pub fn decode(bytes: &[u8]) -> Result<Stage, String> {
        let s = RestoreStage::decode(bytes).map_err(|e| format!("restore stage: {e}"))?;
        let bytes = s.chunks.iter().map(chunk_bytes).sum();
        Ok(Stage {
            begin: s.begin.unwrap_or_default(),
            chunks: s.chunks,
            bytes,
        })
    }
}

fn chunk_bytes(c: &RestoreChunk) -> u64 {
    c.keys
        .iter()
        .map(|k| (k.key.len() + k.value.len()) as u64)
        .sum()
}

/// `c` with every value left out (`MemStore::stage_restore_without_values`).
fn without_values(c: &RestoreChunk) -> RestoreChunk {
    RestoreChunk {
        restore_id: c.restore_id.clone(),
        seq: c.seq,
        keys: c
            .keys
            .iter()
            .map(|k| RestoreKey {
                key: k.key.clone(),
                delete: k.delete,
                value: Vec::new(),
                lease: k.lease,
                expect_mod_revision: k.expect_mod_revision,
            })
            .collect(),
        grants: c.grants.clone(),
        revokes: c.revokes.clone(),
    }
}

fn aborted(reason: impl Into<String>) -> Outcome {
    Outcome::Restore(RestoreStep::Aborted {
        reason: reason.into(),
    })
}

impl MemStore {
    /// The id and chunk count of the restore being staged, if any.
    pub fn staged_restore(&self) -> Option<(&[u8], usize)> {
        self.state
            .restore
            .as_ref()
            .map(|s| (s.begin.restore_id.as_slice(), s.chunks.len()))
    }

    pub(crate) fn apply_restore_begin(&mut self, b: &RestoreBegin) -> Outcome {
        self.state.restore = Some(Stage {
            begin: b.clone(),
            chunks: Vec::new(),
            bytes: 0,
        });
        Outcome::Restore(RestoreStep::Begun)
    }

    pub(crate) fn apply_restore_chunk(&mut self, c: &RestoreChunk) -> Outcome {
        let Some(stage) = self
            .state
            .restore
            .as_mut()
            .filter(|s| s.begin.restore_id == c.restore_id)
        else {
            return aborted("no restore with this id is being staged");
        };
        if c.seq as usize != stage.chunks.len() {
            return aborted(format!(
                "chunk {} out of sequence: the stage holds {}",
                c.seq,
                stage.chunks.len()
            ));
        }
        let bytes = chunk_bytes(c);
        if stage.bytes.saturating_add(bytes) > MAX_STAGE_BYTES {
            return aborted(format!("the stage would exceed {MAX_STAGE_BYTES} bytes"));
        }
        stage.bytes += bytes;
        let staged = if self.valueless_restore.as_ref() == Some(&c.restore_id) {
            without_values(c)
        } else {
            c.clone()
        };
        stage.chunks.push(staged);
        Outcome::Restore(RestoreStep::Staged {
            chunks: stage.chunks.len() as u32,
        })
    }

    pub(crate) fn apply_restore_commit(
        &mut self,
        c: &RestoreCommit,
        events: &mut Vec<Event>,
    ) -> Outcome {
        if self
            .state
            .restore
            .as_ref()
            .is_none_or(|s| s.begin.restore_id != c.restore_id)
        {
            return aborted("no restore with this id is being staged");
        }
        let Some(stage) = self.state.restore.take() else {
            return aborted("no restore with this id is being staged");
        };
        if stage.chunks.len() != c.chunks as usize {
            return aborted(format!(
                "the commit names {} chunks, the stage holds {}",
                c.chunks,
                stage.chunks.len()
            ));
        }
        // Every check first: nothing may change unless all of them pass.
        let mut keys: BTreeMap<&[u8], &RestoreKey> = BTreeMap::new();
        for k in stage.chunks.iter().flat_map(|c| &c.keys) {
            if k.key.is_empty() {
                return aborted("an empty key");
            }
            if keys.insert(&k.key, k).is_some() {
                return aborted("a key staged twice");
            }
        }
        let grants: BTreeMap<i64, i64> = stage
            .chunks
            .iter()
            .flat_map(|c| &c.grants)
            .map(|g| (g.id, g.ttl))
            .collect();
        let revokes: BTreeSet<i64> = stage
            .chunks
            .iter()
            .flat_map(|c| c.revokes.iter().copied())
            .collect();
        for &id in grants.keys() {
            if id <= 0 {
                return aborted(format!("lease id {id} is not positive"));
            }
            if self.state.leases.contains(id) {
                return aborted(format!("lease {id:x} exists already"));
            }
            if revokes.contains(&id) {
                return aborted(format!("lease {id:x} both granted and revoked"));
            }
        }
        for (key, k) in &keys {
            let now = self.state.keys.latest_live(key).map_or(0, |v| v.main);
            if now != k.expect_mod_revision {
                return aborted(format!(
                    "a key changed since the restore was planned (mod revision {now}, expected {})",
                    k.expect_mod_revision
                ));
            }
            if !k.delete && k.lease != 0 {
                if revokes.contains(&k.lease) {
                    return aborted(format!(
                        "a key is put with lease {:x}, which is revoked",
                        k.lease
                    ));
                }
                if !grants.contains_key(&k.lease) && !self.state.leases.contains(k.lease) {
                    return aborted(format!("lease {:x} not found", k.lease));
                }
            }
        }

        // A revoke deletes the keys attached to the lease at commit. Every key attached when the
        // restore was planned is staged (its lease differs from the target's), so a key that is
        // not was attached since: a racing write the revoke would delete.
        for &id in &revokes {
            if let Some(lease) = self.state.leases.get(id)
                && lease.keys.iter().any(|k| !keys.contains_key(&k[..]))
            {
                return aborted(format!(
                    "a key was attached to lease {id:x}, which the restore revokes, since the restore was planned"
                ));
            }
        }

        let auth = match &c.auth {
            None => None,
            Some(a) => {
                let now = self.state.auth.revision();
                if now != a.expect_auth_revision {
                    return aborted(format!(
                        "the auth state changed since the restore was planned (auth revision {now}, expected {})",
                        a.expect_auth_revision
                    ));
                }
                match self.state.auth.restored(a) {
                    Ok(next) => Some(next),
                    Err(e) => return aborted(e),
                }
            }
        };

        let now = self.state.time_ms;
        for (&id, &ttl) in &grants {
            let cfg = self.config();
            let ttl = ttl.clamp(cfg.min_lease_ttl_secs, cfg.max_lease_ttl_secs);
            self.state
                .leases
                .grant(id, ttl, now.saturating_add(ttl.saturating_mul(1000)));
        }
        let mut w = Writer::new(&mut self.state, events, self.emit_events);
        let mut written = 0u64;
        for (key, k) in keys {
            if k.delete {
                if let Some(lease) = w.state.keys.latest_live(key).map(|v| v.lease) {
                    w.delete_key(key, lease);
                    written += 1;
                }
            } else {
                w.put(&PutRequest {
                    key: key.to_vec(),
                    value: k.value.clone(),
                    lease: k.lease,
                    ..Default::default()
                });
                written += 1;
            }
        }
        for id in revokes {
            if let Some(lease) = w.state.leases.remove(id) {
                for key in &lease.keys {
                    if let Some(l) = w.state.keys.latest_live(key).map(|v| v.lease) {
                        w.delete_key(key, l);
                        written += 1;
                    }
                }
            }
        }
        let revision = w.finish();
        if let Some(next) = auth {
            self.state.auth = next;
            self.auth_changed();
        }
        Outcome::Restore(RestoreStep::Committed {
            revision,
            keys: written,
        })
    }
}
