//! Errors a shard answers with, and their one mapping to gRPC statuses (metadata carries what
//! a client needs to act: the leader's address, the first retained index).

use tonic::{Code, Status};

/// Metadata key naming the leader's address on a FAILED_PRECONDITION (not the leader) answer.
pub const LEADER_METADATA: &str = "x-strata-leader";
/// Metadata key with the first retained index on an OUT_OF_RANGE (trimmed) answer.
pub const FIRST_INDEX_METADATA: &str = "x-strata-first-index";
/// Metadata key classifying an error: `unknown-shard`, `too-large`, `trimmed`, `not-leader`.
pub const ERROR_KIND_METADATA: &str = "x-strata-error";

/// Why a shard could not serve a request.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ShardError {
    #[error("not the leader of shard {shard}; leader: {}", leader_addr.as_deref().unwrap_or("unknown"))]
    NotLeader {
        shard: u32,
        leader_addr: Option<String>,
    },
    #[error("unknown shard {shard}: this journal has shards 0..{count}")]
    UnknownShard { shard: u32, count: u32 },
    #[error("entry of {size} bytes exceeds the journal's limit of {max} bytes")]
    TooLarge { size: usize, max: usize },
    #[error("append of {size} bytes exceeds the journal's request limit of {max} bytes")]
    RequestTooLarge { size: usize, max: usize },
    #[error(
        "shard {shard}: records below {first_index} were trimmed; the first retained index is {first_index}"
    )]
    Trimmed { shard: u32, first_index: u64 },
    #[error("shard {shard} is unavailable: {reason}")]
    Unavailable { shard: u32, reason: String },
    #[error("shard {shard} storage failed: {reason}")]
    Storage { shard: u32, reason: String },
    #[error("invalid request: {0}")]
    Invalid(String),
}

impl From<ShardError> for Status {
    fn from(e: ShardError) -> Status {
        let msg = e.to_string();
        let (code, kind) = match &e {
            ShardError::NotLeader { .. } => (Code::FailedPrecondition, "not-leader"),
            ShardError::UnknownShard { .. } => (Code::NotFound, "unknown-shard"),
            ShardError::TooLarge { .. } | ShardError::RequestTooLarge { .. } => {
                (Code::InvalidArgument, "too-large")
            }
            ShardError::Trimmed { .. } => (Code::OutOfRange, "trimmed"),
            ShardError::Unavailable { .. } => (Code::Unavailable, "unavailable"),
            ShardError::Storage { .. } => (Code::Internal, "storage"),
            ShardError::Invalid(_) => (Code::InvalidArgument, "invalid"),
        };
        let mut s = Status::new(code, msg);
        let md = s.metadata_mut();
        md.insert(
            ERROR_KIND_METADATA,
            kind.parse()
                .unwrap_or_else(|_| "error".parse().expect("ascii")),
        );
        match &e {
            ShardError::NotLeader {
                leader_addr: Some(a),
                ..
            } => {
                if let Ok(v) = a.parse() {
                    md.insert(LEADER_METADATA, v);
                }
            }
            ShardError::Trimmed { first_index, .. } => {
                if let Ok(v) = first_index.to_string().parse() {
                    md.insert(FIRST_INDEX_METADATA, v);
                }
            }
            _ => {}
        }
        s
    }
}
