//! The journal's openraft type configuration, the request carried in a Raft entry, and the
//! binary codec of an entry (segment frame body and Raft wire format alike) and its mapping to
//! the client-visible `Record`.

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
    /// A client payload.
    Data { time_ms: i64, payload: Vec<u8> },
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

openraft::declare_raft_types!(
    /// The journal's Raft types: one shard is one Raft group of these.
    pub TypeConfig:
        D = JournalRequest,
        R = (),
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

/// The frame header of `entry`; `fallback_time_ms` stamps entries that carry no time of their
/// own (openraft's blank and membership entries): the time of the entry before them.
pub fn header_of(entry: &JEntry, fallback_time_ms: i64) -> FrameHeader {
    let time_ms = match &entry.payload {
        EntryPayload::Normal(r) => r.time_ms(),
        _ => fallback_time_ms,
    };
    FrameHeader {
        index: entry.log_id.index,
        term: entry.log_id.leader_id.term,
        node: entry.log_id.leader_id.node_id,
        time_ms,
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
        EntryPayload::Normal(JournalRequest::Data { payload, .. }) => {
            out.push(KIND_DATA);
            out.extend_from_slice(payload);
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
            payload: tail.to_vec(),
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

/// The client-visible record of a stored frame.
pub fn record_of(h: &FrameHeader, rest: &[u8]) -> Result<Record, CodecError> {
    let (&kind, tail) = rest.split_first().ok_or(CodecError::Empty)?;
    let kind = match kind {
        KIND_BLANK => Kind::LeaderChange(LeaderChange { term: h.term }),
        KIND_DATA => Kind::Data(tail.to_vec()),
        KIND_MEMBERSHIP | KIND_TICK | KIND_TRIM => Kind::Tick(Tick {}),
        k => return Err(CodecError::UnknownKind(k)),
    };
    Ok(Record {
        index: h.index,
        term: h.term,
        time_ms: h.time_ms,
        kind: Some(kind),
    })
}

/// Encodes an entry for the Raft wire: frame header fields + rest, without length/CRC (the
/// transport has its own integrity).
pub fn encode_wire(entry: &JEntry) -> Vec<u8> {
    let h = header_of(entry, 0);
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
    if bytes.len() < crate::segment::BODY_HEADER_BYTES {
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
    };
    decode_entry(&h, &bytes[crate::segment::BODY_HEADER_BYTES..])
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
                payload: b"xyz".to_vec(),
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

    #[test]
    fn records_map_kinds() {
        let h = FrameHeader {
            index: 4,
            term: 2,
            node: 1,
            time_ms: 77,
        };
        let r = record_of(&h, &[KIND_BLANK]).unwrap();
        assert_eq!(r.kind, Some(Kind::LeaderChange(LeaderChange { term: 2 })));
        let r = record_of(&h, &[KIND_DATA, 9, 9]).unwrap();
        assert_eq!(r.kind, Some(Kind::Data(vec![9, 9])));
        assert_eq!(r.time_ms, 77);
        let r = record_of(&h, &[KIND_TRIM, 0, 0, 0, 0, 0, 0, 0, 0]).unwrap();
        assert_eq!(r.kind, Some(Kind::Tick(Tick {})));
        assert!(record_of(&h, &[42]).is_err());
    }
}
