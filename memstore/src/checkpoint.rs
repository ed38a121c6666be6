//! The durable checkpoint object of one tenant: magic, format version, crc32c, a small meta
//! header and the rkyv archive of the whole store state, loaded back through checked access.
//!
//! Layout (all integers little-endian):
//! `magic[8] | format_version u32 | crc32c u32 | meta_len u32 | body_len u64 | meta | zero
//! padding up to a multiple of 16 | body`, the crc covering everything after itself. The body
//! starts 16-aligned within the object, so a buffer that is itself 16-aligned is validated in
//! place; any other buffer is first copied into an aligned one. `meta` is
//! `tenant_len u32 | tenant | shard u32 | index u64 | revision i64 | created_ms i64`.

use rkyv::rancor;
use rkyv::util::AlignedVec;

use crate::keyspace::KeySpace;
use crate::store::{ArchivedState, State};
use crate::{Config, Error, MemStore};

/// First bytes of every checkpoint object.
pub const MAGIC: [u8; 8] = *b"STRATACP";
/// The format this build writes; `decode` reads this version only (there is no older one yet).
pub const FORMAT_VERSION: u32 = 1;
/// Bytes before the meta section.
const HEADER_LEN: usize = 8 + 4 + 4 + 4 + 8;
/// Longest tenant name a checkpoint may carry (a bound against a corrupt length).
pub const MAX_TENANT_LEN: usize = 1024;
/// rkyv's archive alignment requirement for our types (copy target of the body).
const BODY_ALIGN: usize = 16;

/// What a checkpoint reflects: which tenant, which journal shard and index, which revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointMeta {
    pub tenant: String,
    pub shard: u32,
    /// The journal index of the last entry applied (the store's `applied_index()`).
    pub index: u64,
    /// The store revision at that index.
    pub revision: i64,
    /// Journal time (ms) the checkpoint was taken at, as the writer knows it.
    pub created_ms: i64,
}

fn encode_meta(meta: &CheckpointMeta) -> Vec<u8> {
    let t = meta.tenant.as_bytes();
    let mut out = Vec::with_capacity(4 + t.len() + 4 + 8 + 8 + 8);
    out.extend_from_slice(&(t.len() as u32).to_le_bytes());
    out.extend_from_slice(t);
    out.extend_from_slice(&meta.shard.to_le_bytes());
    out.extend_from_slice(&meta.index.to_le_bytes());
    out.extend_from_slice(&meta.revision.to_le_bytes());
    out.extend_from_slice(&meta.created_ms.to_le_bytes());
    out
}

/// A little cursor that turns every short read into `Error::Corrupt`.
struct Reader<'a> {
    buf: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Error> {
        if self.buf.len() < n {
            return Err(Error::Corrupt(format!("{} truncated", self.what)));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], Error> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u32(&mut self) -> Result<u32, Error> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, Error> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn i64(&mut self) -> Result<i64, Error> {
        Ok(i64::from_le_bytes(self.array()?))
    }
}

fn decode_meta(bytes: &[u8]) -> Result<CheckpointMeta, Error> {
    let mut r = Reader {
        buf: bytes,
        what: "checkpoint meta",
    };
    let tlen = r.u32()? as usize;
    if tlen > MAX_TENANT_LEN {
        return Err(Error::Corrupt(format!("tenant name of {tlen} bytes")));
    }
    let tenant = std::str::from_utf8(r.take(tlen)?)
        .map_err(|_| Error::Corrupt("tenant name is not UTF-8".into()))?
        .to_string();
    let meta = CheckpointMeta {
        tenant,
        shard: r.u32()?,
        index: r.u64()?,
        revision: r.i64()?,
        created_ms: r.i64()?,
    };
    if !r.buf.is_empty() {
        return Err(Error::Corrupt(
            "trailing bytes after checkpoint meta".into(),
        ));
    }
    Ok(meta)
}

/// Where the body starts: after the meta, rounded up to the body's alignment.
fn body_offset(meta_len: usize) -> usize {
    (HEADER_LEN + meta_len).div_ceil(BODY_ALIGN) * BODY_ALIGN
}

/// Writes the whole store as one checkpoint object.
pub fn encode(meta: &CheckpointMeta, store: &MemStore) -> Vec<u8> {
    let body = rkyv::to_bytes::<rancor::Error>(&store.state)
        .expect("invariant: archiving owned in-memory state into a growable buffer cannot fail");
    let meta_bytes = encode_meta(meta);
    let mut out = Vec::with_capacity(HEADER_LEN + meta_bytes.len() + body.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&[0u8; 4]); // crc, filled below
    out.extend_from_slice(&(meta_bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&meta_bytes);
    out.resize(body_offset(meta_bytes.len()), 0);
    out.extend_from_slice(&body);
    let crc = crc32c::crc32c(&out[16..]);
    out[12..16].copy_from_slice(&crc.to_le_bytes());
    out
}

/// Reads a checkpoint object back. Every defect (magic, version, checksum, lengths, archive
/// validation, meta disagreeing with the state) is `Error::Corrupt`, never a panic. The store
/// gets `Config::default()`; use `MemStore::set_config` to change it.
pub fn decode(bytes: &[u8]) -> Result<(CheckpointMeta, MemStore), Error> {
    let mut r = Reader {
        buf: bytes,
        what: "checkpoint header",
    };
    if r.array::<8>()? != MAGIC {
        return Err(Error::Corrupt("not a Strata checkpoint (bad magic)".into()));
    }
    let version = r.u32()?;
    if version != FORMAT_VERSION {
        return Err(Error::Corrupt(format!(
            "checkpoint format version {version}, this build reads {FORMAT_VERSION}"
        )));
    }
    let crc = r.u32()?;
    let actual = crc32c::crc32c(&bytes[16..]);
    if crc != actual {
        return Err(Error::Corrupt(format!(
            "checksum mismatch: stored {crc:#010x}, computed {actual:#010x}"
        )));
    }
    let meta_len = r.u32()? as usize;
    let body_len = usize::try_from(r.u64()?)
        .map_err(|_| Error::Corrupt("body length does not fit in memory".into()))?;
    let offset = body_offset(meta_len);
    if offset.checked_add(body_len) != Some(bytes.len()) {
        return Err(Error::Corrupt(format!(
            "lengths say {meta_len} + {body_len} bytes, object holds {}",
            bytes.len()
        )));
    }
    let meta = decode_meta(r.take(meta_len)?)?;
    if bytes[HEADER_LEN + meta_len..offset].iter().any(|&b| b != 0) {
        return Err(Error::Corrupt("non-zero padding".into()));
    }
    let body = &bytes[offset..];
    let copy;
    let body: &[u8] = if (body.as_ptr() as usize).is_multiple_of(BODY_ALIGN) {
        body
    } else {
        let mut aligned = AlignedVec::<BODY_ALIGN>::with_capacity(body.len());
        aligned.extend_from_slice(body);
        copy = aligned;
        &copy
    };
    let archived = rkyv::access::<ArchivedState, rancor::Error>(body)
        .map_err(|e| Error::Corrupt(format!("archive validation failed: {e}")))?;
    let state = state_from_archived(archived)?;
    if state.applied_index != meta.index || state.revision != meta.revision {
        return Err(Error::Corrupt(format!(
            "meta says index {} revision {}, state holds index {} revision {}",
            meta.index, meta.revision, state.applied_index, state.revision
        )));
    }
    Ok((meta, MemStore::from_state(Config::default(), state)))
}

fn state_from_archived(a: &ArchivedState) -> Result<State, Error> {
    let corrupt = |e: rancor::Error| Error::Corrupt(format!("archive could not be loaded: {e}"));
    Ok(State {
        applied_index: a.applied_index.to_native(),
        revision: a.revision.to_native(),
        compact_revision: a.compact_revision.to_native(),
        time_ms: a.time_ms.to_native(),
        keys: KeySpace::from_archived(&a.keys).map_err(Error::Corrupt)?,
        leases: rkyv::deserialize::<_, rancor::Error>(&a.leases).map_err(corrupt)?,
        dedup: rkyv::deserialize::<_, rancor::Error>(&a.dedup).map_err(corrupt)?,
        alarms: rkyv::deserialize::<_, rancor::Error>(&a.alarms).map_err(corrupt)?,
        auth: rkyv::deserialize::<_, rancor::Error>(&a.auth).map_err(corrupt)?,
    })
}
