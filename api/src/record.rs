//! Turning a journal record into the entry a tenant's replica applies: the one place where the
//! journal's stamp becomes the entry's time, and where shard-wide positions become ticks.

use prost::Message;

use crate::ENTRY_FORMAT_VERSION;
use crate::strata::entry::{Entry, LeaderChange, Tick, entry::Request};
use crate::strata::journal::{Record, record::Kind};

/// Why a record could not be turned into an entry. Either means the journal holds something
/// this build must not apply: the replica stops rather than diverge.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("journal record {index}: payload is not an entry: {source}")]
    Malformed {
        index: u64,
        source: prost::DecodeError,
    },
    #[error(
        "journal record {index}: entry format version {version} is newer than this build's {ENTRY_FORMAT_VERSION}"
    )]
    TooNew { index: u64, version: u32 },
    #[error("journal record {index} has no kind")]
    Empty { index: u64 },
}

/// Decodes `record` as tenant `tenant` applies it: its own entries as written (with the journal's
/// time stamp), shard-wide ticks and leader changes as such, and other tenants' entries as
/// ticks (time moves on, nothing else changes).
pub fn entry_for_tenant(record: &Record, tenant: &str) -> Result<Entry, DecodeError> {
    let (index, time_ms) = (record.index, record.time_ms);
    match &record.kind {
        None => Err(DecodeError::Empty { index }),
        Some(Kind::Tick(_)) => Ok(shard_wide(time_ms, Request::Tick(Tick {}))),
        Some(Kind::LeaderChange(lc)) => Ok(shard_wide(
            time_ms,
            Request::LeaderChange(LeaderChange { term: lc.term }),
        )),
        Some(Kind::Data(bytes)) => own_entry(index, time_ms, bytes.as_slice(), tenant),
    }
}

/// `entry_for_tenant` of a record the caller gives away (a replica that applies it next). The
/// payload is decoded in place, so prost copies each key and value once: from a borrowed
/// slice, prost fills a `Vec<u8>` field by copying twice (into a temporary `Bytes`, then into
/// the field), with one allocation and one free more per field.
pub fn entry_for_tenant_owned(record: Record, tenant: &str) -> Result<Entry, DecodeError> {
    match record.kind {
        Some(Kind::Data(bytes)) => own_entry(
            record.index,
            record.time_ms,
            prost::bytes::Bytes::from(bytes),
            tenant,
        ),
        kind => entry_for_tenant(&Record { kind, ..record }, tenant),
    }
}

/// An entry that only moves time on (or extends leases): the same for every tenant.
fn shard_wide(time_ms: i64, request: Request) -> Entry {
    Entry {
        format_version: ENTRY_FORMAT_VERSION,
        tenant: String::new(),
        request_id: Vec::new(),
        time_ms,
        request: Some(request),
    }
}

/// Decodes the payload `buf` of data record `index` for `tenant` (see `entry_for_tenant`).
fn own_entry(
    index: u64,
    time_ms: i64,
    buf: impl prost::bytes::Buf,
    tenant: &str,
) -> Result<Entry, DecodeError> {
    let mut entry =
        Entry::decode(buf).map_err(|source| DecodeError::Malformed { index, source })?;
    if entry.format_version > ENTRY_FORMAT_VERSION {
        return Err(DecodeError::TooNew {
            index,
            version: entry.format_version,
        });
    }
    if entry.tenant != tenant {
        return Ok(shard_wide(time_ms, Request::Tick(Tick {})));
    }
    entry.time_ms = time_ms;
    Ok(entry)
}

/// Encodes an entry for `Append`; the time stamp is left to the journal.
pub fn encode_entry(entry: &Entry) -> Vec<u8> {
    let mut e = entry.clone();
    e.time_ms = 0;
    e.encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcdserverpb::PutRequest;

    fn put_entry(tenant: &str) -> Entry {
        Entry {
            format_version: ENTRY_FORMAT_VERSION,
            tenant: tenant.into(),
            request_id: vec![7; 16],
            time_ms: 0,
            request: Some(Request::Put(PutRequest {
                key: b"k".to_vec(),
                value: b"v".to_vec(),
                ..Default::default()
            })),
        }
    }

    fn record(kind: Kind) -> Record {
        Record {
            index: 9,
            term: 2,
            time_ms: 1234,
            kind: Some(kind),
        }
    }

    /// Both decoders on one record: they must agree.
    fn both(r: &Record, tenant: &str) -> Result<Entry, DecodeError> {
        let a = entry_for_tenant(r, tenant);
        let b = entry_for_tenant_owned(r.clone(), tenant);
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
        a
    }

    #[test]
    fn owned_decode_gives_the_same_entry_for_every_field() {
        let mut entry = put_entry("a");
        if let Some(Request::Put(p)) = &mut entry.request {
            p.value = vec![3; 100_000];
            p.lease = 7;
            p.prev_kv = true;
        }
        let r = record(Kind::Data(encode_entry(&entry)));
        let got = entry_for_tenant_owned(r.clone(), "a").unwrap();
        entry.time_ms = 1234;
        assert_eq!(got, entry);
        assert_eq!(both(&r, "a").unwrap(), entry);
        assert!(matches!(
            both(&r, "b").unwrap().request,
            Some(Request::Tick(_))
        ));
        assert!(matches!(
            both(&record(Kind::Tick(crate::strata::journal::Tick {})), "a")
                .unwrap()
                .request,
            Some(Request::Tick(_))
        ));
        let empty = Record {
            kind: None,
            ..record(Kind::Data(Vec::new()))
        };
        assert!(matches!(both(&empty, "a"), Err(DecodeError::Empty { .. })));
    }

    #[test]
    fn own_entry_gets_the_journal_stamp() {
        let r = record(Kind::Data(encode_entry(&put_entry("a"))));
        let e = both(&r, "a").unwrap();
        assert_eq!(e.time_ms, 1234);
        assert_eq!(e.tenant, "a");
        assert!(matches!(e.request, Some(Request::Put(_))));
    }

    #[test]
    fn other_tenants_entry_is_a_tick() {
        let r = record(Kind::Data(encode_entry(&put_entry("a"))));
        let e = both(&r, "b").unwrap();
        assert_eq!(e.time_ms, 1234);
        assert!(matches!(e.request, Some(Request::Tick(_))));
    }

    #[test]
    fn newer_format_is_refused() {
        let mut entry = put_entry("a");
        entry.format_version = ENTRY_FORMAT_VERSION + 1;
        let r = record(Kind::Data(entry.encode_to_vec()));
        assert!(matches!(both(&r, "a"), Err(DecodeError::TooNew { .. })));
    }

    #[test]
    fn garbage_is_refused() {
        let r = record(Kind::Data(vec![0xff, 0xff, 0xff]));
        assert!(matches!(both(&r, "a"), Err(DecodeError::Malformed { .. })));
    }

    #[test]
    fn leader_change_passes_through() {
        let r = record(Kind::LeaderChange(crate::strata::journal::LeaderChange {
            term: 5,
        }));
        let e = entry_for_tenant(&r, "a").unwrap();
        assert!(matches!(
            e.request,
            Some(Request::LeaderChange(LeaderChange { term: 5 }))
        ));
    }
}
