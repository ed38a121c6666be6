//! Purging tenants the catalogue is done with (docs/design/tenants.md, T7): a tenant deleted
//! longer ago than its retention, and an older generation of a name created again. The
//! compactor reads the catalogue from its newest checkpoint (the reserved tenant `_system`,
//! whatever shard this compactor owns) and judges retention by that checkpoint's journal time,
//! which is never later than the catalogue's own: so nothing is purged that an undelete could
//! still bring back (the catalogue refuses an undelete past the same point). A purged tenant
//! is dropped from its shard's loop (no more checkpoints, out of the trim floor, its entries
//! become ticks) and its objects are deleted.

use std::collections::BTreeSet;

use api::strata::admin::TenantRecord;
use api::tenant::{SYSTEM_TENANT, journal_key};

use crate::catalog::Catalog;
use crate::error::Result;

/// What the catalogue said, as of its newest checkpoint.
pub struct Catalogue {
    pub records: Vec<TenantRecord>,
    /// The catalogue's journal time at that checkpoint.
    pub time_ms: i64,
}

impl Catalogue {
    /// The newest checkpoint of the catalogue in `catalog`, if there is one.
    pub async fn read(catalog: &Catalog) -> Result<Option<Self>> {
        let Some(loaded) = crate::reader::latest_in(catalog, SYSTEM_TENANT).await? else {
            return Ok(None);
        };
        Ok(Some(Self {
            records: loaded.store.tenant_records(),
            time_ms: loaded.store.time_ms(),
        }))
    }

    /// Whether tenant `key` (a key this compactor holds or finds) is a catalogue tenant's
    /// generation the catalogue is done with: an older generation of its name, or one deleted
    /// longer ago than its retention. A key the catalogue does not know (a tenant given to
    /// frontends by flag, a name with no record) is never purged.
    pub fn is_done_with(&self, key: &str) -> bool {
        let Some((name, generation)) = key.rsplit_once('.') else {
            return false;
        };
        if generation.len() != 16 || !generation.bytes().all(|b| b.is_ascii_hexdigit()) {
            return false;
        }
        let Some(r) = self.records.iter().find(|r| r.name == name) else {
            return false;
        };
        journal_key(&r.name, &r.uid) != key || memstore::purgeable(r, self.time_ms)
    }

    /// Of `keys`, those the catalogue is done with.
    pub fn done_with<'a>(&self, keys: impl Iterator<Item = &'a String>) -> BTreeSet<String> {
        keys.filter(|k| self.is_done_with(k)).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::strata::admin::TenantState;

    fn record(name: &str, uid: u8, state: TenantState, deleted_ms: i64) -> TenantRecord {
        TenantRecord {
            name: name.into(),
            uid: vec![uid; 16],
            state: state as i32,
            deleted_ms,
            retention_ms: 1_000,
            ..Default::default()
        }
    }

    #[test]
    fn only_generations_the_catalogue_is_done_with_go() {
        let c = Catalogue {
            records: vec![
                record("live", 1, TenantState::Active, 0),
                record("again", 2, TenantState::Active, 0),
                record("recent", 3, TenantState::Deleted, 9_500),
                record("old", 4, TenantState::Deleted, 8_000),
                record("paused", 5, TenantState::Suspended, 0),
            ],
            time_ms: 10_000,
        };
        let key = |n: &str, u: u8| journal_key(n, &[u; 16]);
        assert!(!c.is_done_with(&key("live", 1)));
        assert!(!c.is_done_with(&key("paused", 5)));
        assert!(!c.is_done_with(&key("again", 2)), "the newest generation");
        assert!(c.is_done_with(&key("again", 1)), "an older generation");
        assert!(
            !c.is_done_with(&key("recent", 3)),
            "still within its retention"
        );
        assert!(c.is_done_with(&key("old", 4)), "past its retention");
        // Keys that are no catalogue generation are never purged.
        for k in [
            "default",
            "old",
            "old.nothex0000000000",
            "nobody.0101010101010101",
            "_system",
        ] {
            assert!(!c.is_done_with(k), "{k}");
        }
        let held = [key("live", 1), key("old", 4), "default".to_string()];
        assert_eq!(c.done_with(held.iter()), BTreeSet::from([key("old", 4)]));
    }
}
