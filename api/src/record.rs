//! Turning a journal record into the entry a tenant's replica applies: the one place where the
//! journal's stamp becomes the entry's time, and where shard-wide positions become ticks.

use prost::Message;

use crate::ENTRY_FORMAT_VERSION;
use crate::etcdserverpb::PutRequest;
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
        ..Entry::default()
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
    // Another tenant's entry is a tick whatever its format (the envelope's tenant field keeps its
    // meaning across formats), so one tenant's newer entries never stop another tenant's
    // replicas; a shard-wide one (no tenant) may mean something to every tenant.
    if !entry.tenant.is_empty() && entry.tenant != tenant {
        return Ok(shard_wide(time_ms, Request::Tick(Tick {})));
    }
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

/// A put carried by a data record, read in place from the record's payload (no `Entry`, no
/// copy): what `put_view` finds in the common case of an entry holding one `PutRequest`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PutView<'a> {
    pub request_id: &'a [u8],
    pub key: &'a [u8],
    pub value: &'a [u8],
    pub lease: i64,
    pub prev_kv: bool,
    pub ignore_value: bool,
    pub ignore_lease: bool,
}

impl PutView<'_> {
    /// The `PutRequest` this view reads (what `entry_for_tenant` would have put in the entry).
    pub fn to_request(&self) -> PutRequest {
        PutRequest {
            key: self.key.to_vec(),
            value: self.value.to_vec(),
            lease: self.lease,
            prev_kv: self.prev_kv,
            ignore_value: self.ignore_value,
            ignore_lease: self.ignore_lease,
        }
    }
}

/// What `put_view` made of a record it understood.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FastRecord<'a> {
    /// A put of `tenant`'s, to apply at the record's `time_ms`.
    Put(PutView<'a>),
    /// Another tenant's put: for `tenant` a tick at the record's `time_ms`.
    OtherTenant,
}

/// Wire-format keys (field number << 3 | wire type) `put_view` accepts.
mod wire_key {
    pub const ENTRY_FORMAT_VERSION: u64 = 1 << 3;
    pub const ENTRY_TENANT: u64 = (2 << 3) | 2;
    pub const ENTRY_REQUEST_ID: u64 = (3 << 3) | 2;
    pub const ENTRY_TIME_MS: u64 = 4 << 3;
    pub const ENTRY_PUT: u64 = (10 << 3) | 2;
    pub const PUT_KEY: u64 = (1 << 3) | 2;
    pub const PUT_VALUE: u64 = (2 << 3) | 2;
    pub const PUT_LEASE: u64 = 3 << 3;
    pub const PUT_PREV_KV: u64 = 4 << 3;
    pub const PUT_IGNORE_VALUE: u64 = 5 << 3;
    pub const PUT_IGNORE_LEASE: u64 = 6 << 3;
}

/// Most bytes of a protobuf varint.
const MAX_VARINT_BYTES: usize = 10;

/// A cursor over protobuf wire bytes that gives up (None) on anything malformed.
struct Wire<'a> {
    buf: &'a [u8],
}

impl<'a> Wire<'a> {
    /// A varint as prost reads one: at most 10 bytes, the 10th at most 1.
    fn varint(&mut self) -> Option<u64> {
        // Field keys, flags and short lengths: one byte.
        if let Some((&b, rest)) = self.buf.split_first()
            && b < 0x80
        {
            self.buf = rest;
            return Some(u64::from(b));
        }
        let mut x = 0u64;
        for i in 0..MAX_VARINT_BYTES {
            let (&b, rest) = self.buf.split_first()?;
            self.buf = rest;
            if i == MAX_VARINT_BYTES - 1 && b > 1 {
                return None;
            }
            x |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                return Some(x);
            }
        }
        None
    }

    /// A length-delimited field's bytes.
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = usize::try_from(self.varint()?).ok()?;
        if n > self.buf.len() {
            return None;
        }
        let (b, rest) = self.buf.split_at(n);
        self.buf = rest;
        Some(b)
    }
}

/// Reads the payload of a data record in place when it is an entry carrying a single put, for
/// `tenant` as `entry_for_tenant` would: `Some(Put)` for `tenant`'s own put, `Some(OtherTenant)`
/// for another tenant's. Accepts only what it reads exactly as prost does: the known fields of
/// `Entry` and `PutRequest`, each at most once, in any order, with their own wire types, and a
/// format version this build reads. Everything else (other requests, unknown or repeated fields,
/// malformed or newer entries) gives `None`, and the caller decodes the record with
/// `entry_for_tenant*`, which then gives the entry (or the error) prost gives.
pub fn put_view<'a>(record: &'a Record, tenant: &str) -> Option<FastRecord<'a>> {
    let Some(Kind::Data(payload)) = &record.kind else {
        return None;
    };
    let mut w = Wire { buf: payload };
    let (mut version, mut entry_tenant, mut request_id, mut time_ms, mut put) =
        (None, None, None, None, None);
    while !w.buf.is_empty() {
        let slot_was_empty = match w.varint()? {
            wire_key::ENTRY_FORMAT_VERSION => version.replace(w.varint()? as u32).is_none(),
            wire_key::ENTRY_TENANT => entry_tenant.replace(w.bytes()?).is_none(),
            wire_key::ENTRY_REQUEST_ID => request_id.replace(w.bytes()?).is_none(),
            wire_key::ENTRY_TIME_MS => time_ms.replace(w.varint()?).is_none(),
            wire_key::ENTRY_PUT => put.replace(w.bytes()?).is_none(),
            _ => false,
        };
        if !slot_was_empty {
            return None;
        }
    }
    if version.unwrap_or(0) > ENTRY_FORMAT_VERSION {
        return None;
    }
    let mut view = put_fields(put?)?;
    let entry_tenant = entry_tenant.unwrap_or_default();
    if entry_tenant != tenant.as_bytes() {
        // prost refuses a tenant that is not UTF-8; leave that error to it.
        std::str::from_utf8(entry_tenant).ok()?;
        return Some(FastRecord::OtherTenant);
    }
    view.request_id = request_id.unwrap_or_default();
    Some(FastRecord::Put(view))
}

/// The fields of an encoded `PutRequest` (see `put_view` for what is accepted).
fn put_fields(buf: &[u8]) -> Option<PutView<'_>> {
    let mut w = Wire { buf };
    let (mut key, mut value, mut lease, mut prev_kv, mut ignore_value, mut ignore_lease) =
        (None, None, None, None, None, None);
    while !w.buf.is_empty() {
        let slot_was_empty = match w.varint()? {
            wire_key::PUT_KEY => key.replace(w.bytes()?).is_none(),
            wire_key::PUT_VALUE => value.replace(w.bytes()?).is_none(),
            wire_key::PUT_LEASE => lease.replace(w.varint()? as i64).is_none(),
            wire_key::PUT_PREV_KV => prev_kv.replace(w.varint()? != 0).is_none(),
            wire_key::PUT_IGNORE_VALUE => ignore_value.replace(w.varint()? != 0).is_none(),
            wire_key::PUT_IGNORE_LEASE => ignore_lease.replace(w.varint()? != 0).is_none(),
            _ => false,
        };
        if !slot_was_empty {
            return None;
        }
    }
    Some(PutView {
        request_id: &[],
        key: key.unwrap_or_default(),
        value: value.unwrap_or_default(),
        lease: lease.unwrap_or_default(),
        prev_kv: prev_kv.unwrap_or_default(),
        ignore_value: ignore_value.unwrap_or_default(),
        ignore_lease: ignore_lease.unwrap_or_default(),
    })
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
            ..Entry::default()
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
    fn another_tenants_newer_entry_is_a_tick_a_shard_wide_one_is_refused() {
        let mut entry = put_entry("b");
        entry.format_version = ENTRY_FORMAT_VERSION + 1;
        let r = record(Kind::Data(entry.encode_to_vec()));
        assert!(matches!(
            both(&r, "a").unwrap().request,
            Some(Request::Tick(_))
        ));
        assert!(matches!(both(&r, "b"), Err(DecodeError::TooNew { .. })));
        entry.tenant = String::new();
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
