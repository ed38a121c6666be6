//! The tenant catalogue's apply (docs/design/tenants.md, T1): a `TenantChange` entry of the
//! reserved tenant `_system` is validated against the catalogue as it stands and becomes one put
//! of the tenant's record under `/tenants/<name>`, so a catalogue change is a write like any
//! other: one revision, one event for the catalogue's watchers, in every checkpoint. Everything
//! it decides (placement included) comes from the entry and the store, so every replica decides
//! the same.

use api::strata::admin::{TenantRecord, TenantState};
use api::strata::entry::{TenantChange, TenantOwn, TenantQuotas, tenant_change::Change};
use api::tenant::{RECORD_PREFIX, SYSTEM_TENANT, decode_record, record_key, valid_name};

use crate::RangeRequest;
use crate::error::Error;
use crate::store::MemStore;
use api::mvccpb::Event;

/// Bytes of a create's `uid`.
pub const UID_LEN: usize = 16;

impl MemStore {
    /// Every record of the catalogue, in name order (deleted ones included). Empty on any
    /// store but `_system`'s.
    pub fn tenant_records(&self) -> Vec<TenantRecord> {
        let req = RangeRequest {
            key: RECORD_PREFIX.to_vec(),
            range_end: api::prefix_range_end(RECORD_PREFIX),
            ..Default::default()
        };
        let Ok(resp) = self.range(&req) else {
            return Vec::new();
        };
        resp.kvs
            .iter()
            .filter_map(|kv| decode_record(&kv.value, kv.mod_revision).ok())
            .collect()
    }

    /// Tenant `name`'s record, if the catalogue has one.
    pub fn tenant_record(&self, name: &str) -> Option<TenantRecord> {
        let req = RangeRequest {
            key: record_key(name),
            ..Default::default()
        };
        let resp = self.range(&req).ok()?;
        let kv = resp.kvs.first()?;
        decode_record(&kv.value, kv.mod_revision).ok()
    }

    /// The quotas the catalogue gave this tenant (`apply_own_change`), each 0 when none.
    pub fn tenant_quotas(&self) -> TenantQuotas {
        self.state.own.quotas.unwrap_or_default()
    }

    /// What the catalogue said of this tenant in the last own change applied (`TenantOwn`):
    /// quotas, suspended or deleted, and the record revision it came from (0: none yet, or
    /// quotas alone from an older build).
    pub fn tenant_own(&self) -> &TenantOwn {
        &self.state.own
    }

    /// Refuses a write of a tenant its own change says is suspended or deleted
    /// (FailedPrecondition, the message the frontends give for it).
    pub(crate) fn check_not_fenced(&self) -> Result<(), Error> {
        let own = &self.state.own;
        let state = match (own.deleted, own.suspended) {
            (false, false) => return Ok(()),
            (true, _) => "deleted",
            (false, true) => "suspended",
        };
        Err(Error::TenantState {
            name: own.name.clone(),
            state,
        })
    }

    /// Applies a tenant's own `TenantChange` (any tenant but `_system`): what its catalogue
    /// record says that every replica of the tenant enforces alike (the limits that change
    /// state: stored bytes, leases; and whether its writes are refused). Appended to the
    /// tenant's shard by the admin call that changed the record and by the frontends that
    /// find a replica behind its record (`frontend::catalogue`). A change from an older record
    /// revision than the one applied is refused (a frontend whose catalogue lags must not undo
    /// a newer one); the same revision again is applied (its quotas may be the newer word, see
    /// the sync). No key changes, so no revision.
    pub(crate) fn apply_own_change(
        &mut self,
        tenant: &str,
        change: &TenantChange,
    ) -> Result<(), Error> {
        let refused = || {
            Error::Unsupported(format!(
                "a tenant may only change its own part of its record; other tenant changes are the catalogue's ({SYSTEM_TENANT})"
            ))
        };
        if change.name != tenant {
            return Err(refused());
        }
        match &change.change {
            Some(Change::Own(own)) => {
                let quotas = own.quotas.unwrap_or_default();
                check_quotas(&quotas)?;
                if own.revision < self.state.own.revision {
                    return Err(Error::TenantChanged {
                        name: own.name.clone(),
                        since: own.revision,
                        now: self.state.own.revision,
                    });
                }
                self.state.own = TenantOwn {
                    quotas: Some(quotas),
                    ..own.clone()
                };
                Ok(())
            }
            // Older builds journalled the quotas alone: they leave the rest as it is.
            Some(Change::UpdateQuotas(q)) => {
                check_quotas(q)?;
                self.state.own.quotas = Some(*q);
                Ok(())
            }
            _ => Err(refused()),
        }
    }

    /// Applies a catalogue change (an entry of `_system`: `apply_request` sends every other
    /// tenant's to `apply_own_change`) at journal `index`: the record as it is after the change
    /// (its `revision` is the put's), or why it was refused.
    pub(crate) fn apply_tenant_change(
        &mut self,
        index: u64,
        change: &TenantChange,
        events: &mut Vec<Event>,
    ) -> Result<TenantRecord, Error> {
        let name = change.name.as_str();
        if !valid_name(name) {
            return Err(Error::TenantName(name.to_string()));
        }
        let current = self.tenant_record(name);
        let Some(what) = change.change.as_ref() else {
            return Err(Error::Unsupported("an empty tenant change".into()));
        };
        let now_at = current.as_ref().map_or(0, |r| r.revision);
        if let Some(since) = change.if_revision
            && since != now_at
        {
            return Err(Error::TenantChanged {
                name: name.to_string(),
                since,
                now: now_at,
            });
        }
        let now = self.time_ms();
        let record = match (what, current) {
            (Change::Create(quotas), None) => self.new_record(index, change, quotas, now)?,
            // A deleted name makes a new generation: another uid, so another journal key
            // (`api::tenant::journal_key`), an empty keyspace and none of the old data.
            (Change::Create(quotas), Some(r)) if r.state == TenantState::Deleted as i32 => {
                if r.uid == change.uid {
                    return Err(Error::Unsupported(
                        "a tenant's new generation needs a new uid".into(),
                    ));
                }
                self.new_record(index, change, quotas, now)?
            }
            (Change::Create(_), Some(_)) => return Err(Error::TenantExists(name.to_string())),
            (Change::Own(_), _) => {
                return Err(Error::Unsupported(
                    "a tenant's own change belongs on its own shard, not in the catalogue".into(),
                ));
            }
            (_, None) => return Err(Error::TenantNotFound(name.to_string())),
            (Change::Undelete(true), Some(mut r)) if r.state == TenantState::Deleted as i32 => {
                if purgeable(&r, now) {
                    return Err(Error::TenantState {
                        name: name.to_string(),
                        state: "purged (deleted longer ago than its retention)",
                    });
                }
                r.state = TenantState::Active as i32;
                r.deleted_ms = 0;
                r.retention_ms = 0;
                r
            }
            (Change::Undelete(_), Some(_)) => {
                return Err(Error::TenantState {
                    name: name.to_string(),
                    state: "not deleted",
                });
            }
            (_, Some(r)) if r.state == TenantState::Deleted as i32 => {
                return Err(Error::TenantState {
                    name: name.to_string(),
                    state: "deleted",
                });
            }
            (Change::UpdateQuotas(q), Some(mut r)) => {
                check_quotas(q)?;
                r.quotas = Some(*q);
                r
            }
            (Change::Suspended(s), Some(mut r)) => {
                r.state = if *s {
                    TenantState::Suspended
                } else {
                    TenantState::Active
                } as i32;
                r
            }
            (Change::Delete(true), Some(mut r)) => {
                if change.retention_ms < 0 {
                    return Err(Error::Unsupported("a negative retention".into()));
                }
                r.state = TenantState::Deleted as i32;
                r.deleted_ms = now;
                r.retention_ms = change.retention_ms;
                r
            }
            (Change::Delete(false), Some(_)) => {
                return Err(Error::Unsupported("an empty tenant change".into()));
            }
        };
        let mut stored = record.clone();
        stored.revision = 0; // the key's mod revision says it
        let put = self.put_internal(
            record_key(name),
            prost::Message::encode_to_vec(&stored),
            events,
        )?;
        Ok(TenantRecord {
            revision: put,
            ..record
        })
    }

    /// The record a create makes (of a new name, or of a deleted one's next generation):
    /// placed on the shard it asks for, or on the one of the
    /// deployment's `shards` with the fewest tenants that are not deleted (ties: the lowest).
    fn new_record(
        &self,
        index: u64,
        change: &TenantChange,
        quotas: &TenantQuotas,
        now: i64,
    ) -> Result<TenantRecord, Error> {
        check_quotas(quotas)?;
        if change.uid.len() != UID_LEN {
            return Err(Error::Unsupported(format!(
                "a tenant create needs a uid of {UID_LEN} bytes"
            )));
        }
        let shards = change.shards.max(1);
        let shard = match change.shard {
            Some(s) if s >= shards => return Err(Error::NoSuchShard { shard: s, shards }),
            Some(s) => s,
            None => {
                let mut counts = vec![0u64; shards as usize];
                for r in self.tenant_records() {
                    if r.state != TenantState::Deleted as i32
                        && let Some(c) = counts.get_mut(r.shard as usize)
                    {
                        *c += 1;
                    }
                }
                // `min_by_key` keeps the first of equals: the lowest shard.
                (0..shards).min_by_key(|s| counts[*s as usize]).unwrap_or(0)
            }
        };
        Ok(TenantRecord {
            name: change.name.clone(),
            uid: change.uid.clone(),
            shard,
            quotas: Some(*quotas),
            state: TenantState::Active as i32,
            created_index: index,
            created_ms: now,
            deleted_ms: 0,
            revision: 0,
            retention_ms: 0,
        })
    }
}

/// Whether a deleted tenant's retention is over at journal time `now_ms`: it cannot be
/// undeleted any more, and its compactor purges it (`compactor`'s purge uses the catalogue's
/// own journal time, never later than this check's, so nothing is purged that could still be
/// undeleted).
pub fn purgeable(r: &TenantRecord, now_ms: i64) -> bool {
    r.state == TenantState::Deleted as i32 && now_ms >= r.deleted_ms.saturating_add(r.retention_ms)
}

/// Quotas are counts: none may be negative (zero is "the deployment's default").
fn check_quotas(q: &TenantQuotas) -> Result<(), Error> {
    let fields = [
        q.stored_bytes,
        q.requests_per_second,
        q.watchers,
        q.leases,
        q.connections,
    ];
    if fields.iter().any(|v| *v < 0) {
        return Err(Error::Unsupported("a negative tenant quota".into()));
    }
    Ok(())
}
