//! The journal's openraft type configuration, the request carried in a Raft entry, and the
//! binary codec of an entry (segment frame body and Raft wire format alike) and its mapping to
//! the client-visible `Record`s: one Raft entry carries one or more records (a coalesced batch
//! of payloads), each with its own record index.

use std::io::Cursor;

use api::strata::journal::{LeaderChange, Record, Tick, record::Kind};
use openraft::{BasicNode, Entry, EntryPayload, LogId};
use serde::{Deserialize, Serialize};

use crate::segment::FrameHeader;

/// A node id, as in `--id`.
pub type NodeId = u64;

/// What the leader proposes. Every variant carries the leader's stamp.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum JournalRequest {
    /// Client payloads (of one or several coalesced Append calls), one record each.
    Data { time_ms: i64, payloads: Payloads },
    /// An idle tick.
    Tick { time_ms: i64 },
    /// Drop records below `below` on every node (a tick to readers).
    Trim { time_ms: i64, below: u64 },
}

impl JournalRequest {
    pub fn time_ms(&self) -> i64 {
        match self {
            JournalRequest::Data { time_ms, .. }
            | JournalRequest::Tick { time_ms }
            | JournalRequest::Trim { time_ms, .. } => *time_ms,
        }
    }
}

/// The payloads of a data entry, kept encoded as the segment frame and the Raft wire carry them
/// (`u32 len | bytes` each, concatenated), so that writing, reading back, replicating and
/// receiving an entry each cost one copy of one buffer instead of one allocation and copy per
/// payload (an entry carries up to `MAX_BATCH_RECORDS` of them).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payloads {
    count: u32,
    body: Vec<u8>,
}

impl Payloads {
    /// Payloads encoded from `ps`.
    pub fn from_vecs(ps: &[Vec<u8>]) -> Self {
        let mut out = Payloads::default();
        out.extend(ps);
        out
    }

    /// Appends `ps`, in order.
    pub fn extend(&mut self, ps: &[Vec<u8>]) {
        self.body
            .reserve(ps.iter().map(|p| p.len() + PAYLOAD_LEN_BYTES).sum());
        for p in ps {
            // Payloads are capped far below 4 GiB (node::MAX_ENTRY_BYTES).
            self.body.extend_from_slice(&(p.len() as u32).to_le_bytes());
            self.body.extend_from_slice(p);
        }
        self.count = self.count.saturating_add(ps.len() as u32);
    }

    /// Number of payloads.
    pub fn len(&self) -> usize {
        self.count as usize
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The encoded payloads (what follows the kind byte of a data entry's body).
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// The payloads of an encoded body, checked for truncation.
    pub fn decode(body: &[u8]) -> Result<Self, CodecError> {
        Ok(Payloads {
            count: count_payloads(body)?,
            body: body.to_vec(),
        })
    }

    /// Each payload, in order.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> {
        walk_payloads(&self.body)
    }
}

/// The number of payloads of an encoded body; an error if one is cut short.
fn count_payloads(mut tail: &[u8]) -> Result<u32, CodecError> {
    let mut n = 0u32;
    while !tail.is_empty() {
        let len: [u8; PAYLOAD_LEN_BYTES] = tail
            .get(..PAYLOAD_LEN_BYTES)
            .ok_or(CodecError::Truncated)?
            .try_into()
            .map_err(|_| CodecError::Truncated)?;
        let end = PAYLOAD_LEN_BYTES + u32::from_le_bytes(len) as usize;
        tail = tail.get(end..).ok_or(CodecError::Truncated)?;
        n = n.saturating_add(1);
    }
    Ok(n)
}

/// The payloads of a body that `count_payloads` accepted (a cut-short tail ends the walk).
fn walk_payloads(mut tail: &[u8]) -> impl Iterator<Item = &[u8]> {
    std::iter::from_fn(move || {
        let len: [u8; PAYLOAD_LEN_BYTES] = tail.get(..PAYLOAD_LEN_BYTES)?.try_into().ok()?;
        let end = PAYLOAD_LEN_BYTES + u32::from_le_bytes(len) as usize;
        let p = tail.get(PAYLOAD_LEN_BYTES..end)?;
        tail = &tail[end..];
        Some(p)
    })
}

openraft::declare_raft_types!(
    /// The journal's Raft types: one shard is one Raft group of these.
    pub TypeConfig:
        D = JournalRequest,
        // The record index of the entry's first record (for a trim: the first retained record).
        R = u64,
        NodeId = NodeId,
        Node = BasicNode,
        Entry = Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

pub type JEntry = Entry<TypeConfig>;
pub type JLogId = LogId<NodeId>;

const KIND_BLANK: u8 = 0;
const KIND_MEMBERSHIP: u8 = 1;
const KIND_DATA: u8 = 2;
const KIND_TICK: u8 = 3;
const KIND_TRIM: u8 = 4;

/// Why an entry body could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("entry body is empty")]
    Empty,
    #[error("entry body has unknown kind {0}")]
    UnknownKind(u8),
    #[error("entry body is truncated")]
    Truncated,
    #[error("membership entry: {0}")]
    Membership(#[from] serde_json::Error),
}

/// Bytes in front of each payload of a data entry (its length).
const PAYLOAD_LEN_BYTES: usize = 4;
/// Bytes of the wire header: index, term, leader node, time_ms.
pub const WIRE_HEADER_BYTES: usize = 32;

/// Records an entry carries: one per payload of a data entry (an empty batch still takes one
/// position, delivered as a tick), one for every other entry.
pub fn record_count(payload: &EntryPayload<TypeConfig>) -> u32 {
    match payload {
        EntryPayload::Normal(JournalRequest::Data { payloads, .. }) => {
            u32::try_from(payloads.len().max(1)).unwrap_or(u32::MAX)
        }
        _ => 1,
    }
}

/// The frame header of `entry`; `fallback_time_ms` stamps entries that carry no time of their
/// own (openraft's blank and membership entries): the time of the entry before them.
/// `first_record` is the record end of the entry before it in this log.
pub fn header_of(entry: &JEntry, fallback_time_ms: i64, first_record: u64) -> FrameHeader {
    let time_ms = match &entry.payload {
        EntryPayload::Normal(r) => r.time_ms(),
        _ => fallback_time_ms,
    };
    FrameHeader {
        index: entry.log_id.index,
        term: entry.log_id.leader_id.term,
        node: entry.log_id.leader_id.node_id,
        time_ms,
        first_record,
        count: record_count(&entry.payload),
    }
}

/// Encodes the variable part of an entry body (after the frame header fields).
pub fn encode_rest(entry: &JEntry, out: &mut Vec<u8>) {
    match &entry.payload {
        EntryPayload::Blank => out.push(KIND_BLANK),
        EntryPayload::Membership(m) => {
            out.push(KIND_MEMBERSHIP);
            // Membership serialisation cannot fail: plain maps and sets of integers and strings.
            out.extend_from_slice(&serde_json::to_vec(m).unwrap_or_default());
        }
        EntryPayload::Normal(JournalRequest::Data { payloads, .. }) => {
            out.push(KIND_DATA);
            out.extend_from_slice(payloads.body());
        }
        EntryPayload::Normal(JournalRequest::Tick { .. }) => out.push(KIND_TICK),
        EntryPayload::Normal(JournalRequest::Trim { below, .. }) => {
            out.push(KIND_TRIM);
            out.extend_from_slice(&below.to_le_bytes());
        }
    }
}

/// Rebuilds an openraft entry from its frame header and body rest.
pub fn decode_entry(h: &FrameHeader, rest: &[u8]) -> Result<JEntry, CodecError> {
    let (&kind, tail) = rest.split_first().ok_or(CodecError::Empty)?;
    let payload = match kind {
        KIND_BLANK => EntryPayload::Blank,
        KIND_MEMBERSHIP => EntryPayload::Membership(serde_json::from_slice(tail)?),
        KIND_DATA => EntryPayload::Normal(JournalRequest::Data {
            time_ms: h.time_ms,
            payloads: Payloads::decode(tail)?,
        }),
        KIND_TICK => EntryPayload::Normal(JournalRequest::Tick { time_ms: h.time_ms }),
        KIND_TRIM => {
            let b: [u8; 8] = tail
                .get(..8)
                .ok_or(CodecError::Truncated)?
                .try_into()
                .map_err(|_| CodecError::Truncated)?;
            EntryPayload::Normal(JournalRequest::Trim {
                time_ms: h.time_ms,
                below: u64::from_le_bytes(b),
            })
        }
        k => return Err(CodecError::UnknownKind(k)),
    };
    Ok(Entry {
        log_id: LogId::new(openraft::CommittedLeaderId::new(h.term, h.node), h.index),
        payload,
    })
}

/// The client-visible records of a stored frame with a record index at or after `from`,
/// appended to `out`.
pub fn records_of(
    h: &FrameHeader,
    rest: &[u8],
    from: u64,
    out: &mut Vec<Record>,
) -> Result<(), CodecError> {
    let (&kind, tail) = rest.split_first().ok_or(CodecError::Empty)?;
    let record = |index: u64, kind: Kind| Record {
        index,
        term: h.term,
        time_ms: h.time_ms,
        kind: Some(kind),
    };
    let single = match kind {
        KIND_BLANK => Kind::LeaderChange(LeaderChange { term: h.term }),
        KIND_DATA => {
            let n = count_payloads(tail)?;
            if n > 0 {
                let skip = from.saturating_sub(h.first_record);
                out.reserve(u64::from(n).saturating_sub(skip) as usize);
                for (index, p) in (h.first_record..).zip(walk_payloads(tail)) {
                    if index >= from {
                        out.push(record(index, Kind::Data(p.to_vec())));
                    }
                }
                return Ok(());
            }
            Kind::Tick(Tick {})
        }
        KIND_MEMBERSHIP | KIND_TICK | KIND_TRIM => Kind::Tick(Tick {}),
        k => return Err(CodecError::UnknownKind(k)),
    };
    if h.first_record >= from {
        out.push(record(h.first_record, single));
    }
    Ok(())
}

/// Encodes an entry for the Raft wire: frame header fields + rest, without length/CRC (the
/// transport has its own integrity).
pub fn encode_wire(entry: &JEntry) -> Vec<u8> {
    let h = header_of(entry, 0, 0);
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&h.index.to_le_bytes());
    out.extend_from_slice(&h.term.to_le_bytes());
    out.extend_from_slice(&h.node.to_le_bytes());
    out.extend_from_slice(&h.time_ms.to_le_bytes());
    encode_rest(entry, &mut out);
    out
}

/// Decodes `encode_wire`'s output.
pub fn decode_wire(bytes: &[u8]) -> Result<JEntry, CodecError> {
    if bytes.len() < WIRE_HEADER_BYTES {
        return Err(CodecError::Truncated);
    }
    let u = |at: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&bytes[at..at + 8]);
        u64::from_le_bytes(a)
    };
    let h = FrameHeader {
        index: u(0),
        term: u(8),
        node: u(16),
        time_ms: u(24) as i64,
        first_record: 0,
        count: 0,
    };
    decode_entry(&h, &bytes[WIRE_HEADER_BYTES..])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(payload: EntryPayload<TypeConfig>) -> JEntry {
        Entry {
            log_id: LogId::new(openraft::CommittedLeaderId::new(3, 2), 17),
            payload,
        }
    }

    #[test]
    fn every_kind_round_trips_on_the_wire() {
        let members = openraft::Membership::new(
            vec![[1u64, 2, 3].into_iter().collect()],
            [
                (1u64, BasicNode::new("a")),
                (2, BasicNode::new("b")),
                (3, BasicNode::new("c")),
            ]
            .into_iter()
            .collect::<std::collections::BTreeMap<_, _>>(),
        );
        for p in [
            EntryPayload::Blank,
            EntryPayload::Membership(members),
            EntryPayload::Normal(JournalRequest::Data {
                time_ms: 5,
                payloads: Payloads::from_vecs(&[b"xyz".to_vec()]),
            }),
            EntryPayload::Normal(JournalRequest::Data {
                time_ms: 5,
                payloads: Payloads::from_vecs(&[b"a".to_vec(), Vec::new(), vec![7; 300]]),
            }),
            EntryPayload::Normal(JournalRequest::Tick { time_ms: 6 }),
            EntryPayload::Normal(JournalRequest::Trim {
                time_ms: 7,
                below: 99,
            }),
        ] {
            let e = entry(p);
            let back = decode_wire(&encode_wire(&e)).unwrap();
            assert_eq!(back.log_id, e.log_id);
            assert_eq!(format!("{:?}", back.payload), format!("{:?}", e.payload));
        }
    }

    fn header(first_record: u64, count: u32) -> FrameHeader {
        FrameHeader {
            index: 4,
            term: 2,
            node: 1,
            time_ms: 77,
            first_record,
            count,
        }
    }

    fn rest_of(p: EntryPayload<TypeConfig>) -> Vec<u8> {
        let mut out = Vec::new();
        encode_rest(&entry(p), &mut out);
        out
    }

    #[test]
    fn records_map_kinds() {
        let mut out = Vec::new();
        records_of(&header(10, 1), &[KIND_BLANK], 0, &mut out).unwrap();
        assert_eq!(
            out[0].kind,
            Some(Kind::LeaderChange(LeaderChange { term: 2 }))
        );
        assert_eq!(out[0].index, 10);
        out.clear();
        records_of(
            &header(10, 1),
            &[KIND_TRIM, 0, 0, 0, 0, 0, 0, 0, 0],
            0,
            &mut out,
        )
        .unwrap();
        assert_eq!(out[0].kind, Some(Kind::Tick(Tick {})));
        assert!(records_of(&header(10, 1), &[42], 0, &mut out).is_err());
    }

    #[test]
    fn a_batch_is_one_record_per_payload_from_the_asked_index() {
        let rest = rest_of(EntryPayload::Normal(JournalRequest::Data {
            time_ms: 77,
            payloads: Payloads::from_vecs(&[vec![1], vec![2, 2], vec![3]]),
        }));
        let mut out = Vec::new();
        records_of(&header(20, 3), &rest, 0, &mut out).unwrap();
        let got: Vec<(u64, Option<Kind>)> = out.iter().map(|r| (r.index, r.kind.clone())).collect();
        assert_eq!(
            got,
            vec![
                (20, Some(Kind::Data(vec![1]))),
                (21, Some(Kind::Data(vec![2, 2]))),
                (22, Some(Kind::Data(vec![3]))),
            ]
        );
        assert!(out.iter().all(|r| r.time_ms == 77 && r.term == 2));
        out.clear();
        records_of(&header(20, 3), &rest, 22, &mut out).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].index, 22);
        // A truncated batch is an error, never a short read.
        assert!(records_of(&header(20, 3), &rest[..rest.len() - 1], 0, &mut out).is_err());
        // An empty batch still takes its one position, as a tick.
        let empty = rest_of(EntryPayload::Normal(JournalRequest::Data {
            time_ms: 1,
            payloads: Payloads::default(),
        }));
        out.clear();
        records_of(&header(5, 1), &empty, 0, &mut out).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].kind, Some(Kind::Tick(Tick {})));
        assert_eq!(
            record_count(&EntryPayload::Normal(JournalRequest::Data {
                time_ms: 1,
                payloads: Payloads::default()
            })),
            1
        );
    }

    #[test]
    fn payloads_keep_their_encoding_and_refuse_a_cut_body() {
        let ps = vec![b"a".to_vec(), Vec::new(), vec![7; 300], b"zz".to_vec()];
        let mut p = Payloads::from_vecs(&ps[..2]);
        p.extend(&ps[2..]);
        assert_eq!(p.len(), 4);
        assert_eq!(p.iter().map(<[u8]>::to_vec).collect::<Vec<_>>(), ps);
        let back = Payloads::decode(p.body()).unwrap();
        assert_eq!(back, p);
        for cut in 1..p.body().len() {
            // Every cut that does not fall between two payloads is refused.
            let ends: Vec<usize> = ps
                .iter()
                .scan(0, |at, x| {
                    *at += PAYLOAD_LEN_BYTES + x.len();
                    Some(*at)
                })
                .collect();
            let r = Payloads::decode(&p.body()[..cut]);
            if ends.contains(&cut) {
                assert!(r.is_ok(), "cut at {cut}");
            } else {
                assert!(r.is_err(), "cut at {cut} accepted");
            }
        }
        assert!(Payloads::decode(&[]).unwrap().is_empty());
    }
}
