//! The tenant catalogue's names and keys (docs/design/tenants.md, T1): the reserved tenant that
//! holds it, the key of each tenant's record, and the rule a tenant's name follows.

use crate::strata::admin::TenantRecord;

/// The reserved tenant whose keyspace is the catalogue, journalled on shard 0. Names starting
/// with `_` are reserved: no client can name one, and the catalogue refuses to create one.
pub const SYSTEM_TENANT: &str = "_system";
/// The shard `SYSTEM_TENANT` lives on.
pub const SYSTEM_SHARD: u32 = 0;
/// Each tenant's record is the value of `/tenants/<name>` in `SYSTEM_TENANT`'s keyspace.
pub const RECORD_PREFIX: &[u8] = b"/tenants/";
/// A DNS label's length limit.
pub const MAX_NAME_LEN: usize = 63;

/// The catalogue key of tenant `name`'s record.
pub fn record_key(name: &str) -> Vec<u8> {
    let mut k = RECORD_PREFIX.to_vec();
    k.extend_from_slice(name.as_bytes());
    k
}

/// The tenant a catalogue key names, if it is a record's key.
pub fn name_of_key(key: &[u8]) -> Option<&str> {
    std::str::from_utf8(key.strip_prefix(RECORD_PREFIX)?).ok()
}

/// Whether `name` may name a tenant in the catalogue: a DNS label (`[a-z0-9]([a-z0-9-]{0,61}
/// [a-z0-9])?`), so that it can be the first label of a TLS server name and an object path.
pub fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && b.len() <= MAX_NAME_LEN
        && b.first().is_some_and(alnum)
        && b.last().is_some_and(alnum)
        && b.iter().all(|c| alnum(c) || *c == b'-')
}

/// Bytes of a create's uid that name a tenant's generation in its journal key.
const GENERATION_BYTES: usize = 8;

/// The key a catalogue tenant's generation is journalled, replicated and checkpointed under:
/// `<name>.<generation>`, the generation being the first bytes of its record's uid in hex. A
/// tenant deleted and created again under the same name is another tenant: another key, so
/// none of the old generation's entries, checkpoints or tokens is ever the new one's.
pub fn journal_key(name: &str, uid: &[u8]) -> String {
    use std::fmt::Write;
    let mut key = format!("{name}.");
    for b in uid.iter().take(GENERATION_BYTES) {
        let _ = write!(key, "{b:02x}");
    }
    key
}

/// What record `r` says of its tenant that the tenant's own replicas enforce.
pub fn own_of(r: &TenantRecord) -> crate::strata::entry::TenantOwn {
    let (suspended, deleted) = refused_as(r);
    crate::strata::entry::TenantOwn {
        quotas: Some(r.quotas.unwrap_or_default()),
        suspended,
        deleted,
        revision: r.revision,
        name: r.name.clone(),
    }
}

/// The entry request that brings `r`'s own part to the replicas of its tenant journalled under
/// `key` (the record's generation, `journal_key`, or a name a frontend serves by flag): a
/// `TenantChange` of that key, appended to the tenant's shard (`r.shard`).
pub fn own_change(key: &str, r: &TenantRecord) -> crate::strata::entry::entry::Request {
    use crate::strata::entry::{TenantChange, entry::Request, tenant_change::Change};
    Request::TenantChange(TenantChange {
        name: key.to_string(),
        change: Some(Change::Own(own_of(r))),
        ..Default::default()
    })
}

/// Whether a tenant's replica whose own part is `have` already enforces everything record `r`
/// says (`own_of(r)`, the record revision aside).
pub fn own_agrees(have: &crate::strata::entry::TenantOwn, r: &TenantRecord) -> bool {
    have.quotas.unwrap_or_default() == r.quotas.unwrap_or_default()
        && (have.suspended, have.deleted) == refused_as(r)
}

/// Whether record `r` has its tenant suspended, and whether deleted.
fn refused_as(r: &TenantRecord) -> (bool, bool) {
    use crate::strata::admin::TenantState;
    (
        r.state == TenantState::Suspended as i32,
        r.state == TenantState::Deleted as i32,
    )
}

/// A record decoded from a catalogue value, its `revision` set to the key's mod revision.
pub fn decode_record(value: &[u8], mod_revision: i64) -> Result<TenantRecord, prost::DecodeError> {
    let mut r: TenantRecord = prost::Message::decode(value)?;
    r.revision = mod_revision;
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_dns_labels() {
        for ok in ["a", "a1", "prod-eu-1", "0", &"x".repeat(63)] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in [
            "",
            "-a",
            "a-",
            "A",
            "a_b",
            "a.b",
            SYSTEM_TENANT,
            "é",
            &"x".repeat(64),
        ] {
            assert!(!valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn generations_have_keys_of_their_own() {
        let long = "x".repeat(MAX_NAME_LEN);
        let key = journal_key(&long, &[0xab; 16]);
        assert_eq!(key.len(), crate::manifest::MAX_TENANT_NAME_LEN);
        assert!(crate::manifest::validate_tenant(&key).is_ok(), "{key}");
        assert_eq!(
            journal_key("a", &[1, 2, 3, 4, 5, 6, 7, 8, 9]),
            "a.0102030405060708"
        );
        assert_ne!(journal_key("a", &[1; 16]), journal_key("a", &[2; 16]));
    }

    #[test]
    fn keys_name_their_tenant() {
        assert_eq!(record_key("ab"), b"/tenants/ab");
        assert_eq!(name_of_key(&record_key("ab")), Some("ab"));
        assert_eq!(name_of_key(b"/other/ab"), None);
    }
}
