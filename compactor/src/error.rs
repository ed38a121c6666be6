//! The compactor's errors, classified: retryable (the object store or the journal is away for a
//! while: back off and try again) or permanent (something a person must look at).

use api::manifest::ManifestError;

/// Everything that can go wrong in the compactor.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The object store failed (network, throttling, server error, ...).
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    /// The object-store URL could not be understood.
    #[error("object store URL {url:?}: {reason}")]
    BadUrl { url: String, reason: String },
    /// A manifest or an object name was refused.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// A checkpoint object failed verification (checksum, format, wrong tenant or index).
    #[error("checkpoint {path}: {reason}")]
    Corrupt { path: String, reason: String },
    /// A tenant has manifests, and none of them can be read (newest first: `seq`).
    #[error("tenant {tenant}: no manifest can be read (the newest, {seq}: {reason})")]
    NoUsableManifest {
        tenant: String,
        seq: u64,
        reason: String,
    },
    /// Someone else published manifest after manifest under the same numbers.
    #[error("tenant {tenant}: lost the race for manifest numbers {attempts} times in a row")]
    ManifestRace { tenant: String, attempts: u32 },
    /// The journal failed (unreachable, no leader, ...).
    #[error("journal shard {shard}: {reason}")]
    Journal { shard: u32, reason: String },
    /// The journal no longer holds the records the compactor needs.
    #[error("journal shard {shard}: index {wanted} was trimmed (first retained is {first_index})")]
    Trimmed {
        shard: u32,
        wanted: u64,
        first_index: u64,
    },
    /// A journal record could not be decoded: the replica stops rather than diverge.
    #[error(transparent)]
    Decode(#[from] api::record::DecodeError),
    /// A tenant's state cannot be rebuilt: no usable checkpoint covers the journal's first index.
    #[error(
        "tenant {tenant} on shard {shard}: newest usable checkpoint is at index {checkpoint}, but the journal starts at {first_index}"
    )]
    Unrecoverable {
        tenant: String,
        shard: u32,
        checkpoint: u64,
        first_index: u64,
    },
    /// A background task panicked or was cancelled.
    #[error("task failed: {0}")]
    Task(String),
}

impl Error {
    /// True when trying again later may succeed without anyone's help.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Store(e) => !matches!(
                e,
                object_store::Error::InvalidPath { .. }
                    | object_store::Error::NotSupported { .. }
                    | object_store::Error::NotImplemented { .. }
                    | object_store::Error::UnknownConfigurationKey { .. }
            ),
            Error::ManifestRace { .. } | Error::Journal { .. } | Error::Task(_) => true,
            Error::BadUrl { .. }
            | Error::Manifest(_)
            | Error::Corrupt { .. }
            | Error::NoUsableManifest { .. }
            | Error::Trimmed { .. }
            | Error::Decode(_)
            | Error::Unrecoverable { .. } => false,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
