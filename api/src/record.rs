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
    let index = record.index;
    let shard_wide = |request| Entry {
        format_version: ENTRY_FORMAT_VERSION,
        tenant: String::new(),
        request_id: Vec::new(),
        time_ms: record.time_ms,
        request: Some(request),
    };
    match &record.kind {
        None => Err(DecodeError::Empty { index }),
        Some(Kind::Tick(_)) => Ok(shard_wide(Request::Tick(Tick {}))),
        Some(Kind::LeaderChange(lc)) => Ok(shard_wide(Request::LeaderChange(LeaderChange {
            term: lc.term,
        }))),
        Some(Kind::Data(bytes)) => {
            let mut entry = Entry::decode(bytes.as_slice())
                .map_err(|source| DecodeError::Malformed { index, source })?;
            if entry.format_version > ENTRY_FORMAT_VERSION {
                return Err(DecodeError::TooNew {
                    index,
                    version: entry.format_version,
                });
            }
            if entry.tenant != tenant {
                return Ok(shard_wide(Request::Tick(Tick {})));
            }
            entry.time_ms = record.time_ms;
            Ok(entry)
        }
    }
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

    #[test]
    fn own_entry_gets_the_journal_stamp() {
        let r = record(Kind::Data(encode_entry(&put_entry("a"))));
        let e = entry_for_tenant(&r, "a").unwrap();
        assert_eq!(e.time_ms, 1234);
        assert_eq!(e.tenant, "a");
        assert!(matches!(e.request, Some(Request::Put(_))));
    }

    #[test]
    fn other_tenants_entry_is_a_tick() {
        let r = record(Kind::Data(encode_entry(&put_entry("a"))));
        let e = entry_for_tenant(&r, "b").unwrap();
        assert_eq!(e.time_ms, 1234);
        assert!(matches!(e.request, Some(Request::Tick(_))));
    }

    #[test]
    fn newer_format_is_refused() {
        let mut entry = put_entry("a");
        entry.format_version = ENTRY_FORMAT_VERSION + 1;
        let r = record(Kind::Data(entry.encode_to_vec()));
        assert!(matches!(
            entry_for_tenant(&r, "a"),
            Err(DecodeError::TooNew { .. })
        ));
    }

    #[test]
    fn garbage_is_refused() {
        let r = record(Kind::Data(vec![0xff, 0xff, 0xff]));
        assert!(matches!(
            entry_for_tenant(&r, "a"),
            Err(DecodeError::Malformed { .. })
        ));
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
