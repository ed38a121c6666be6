//! Small durable files of a shard: the meta file (Raft vote, purge point) written with
//! write-temp + fsync + rename + dir fsync, checksummed and versioned; and the same helper
//! for the state machine's snapshot file.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::types::{JLogId, NodeId};

/// Magic in front of every small durable file of ours.
pub const META_MAGIC: &[u8; 8] = b"STRJMET\x01";

/// Why a small durable file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is corrupt: {reason}")]
    Corrupt { path: PathBuf, reason: String },
}

/// The shard's meta file.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Meta {
    pub vote: Option<openraft::Vote<NodeId>>,
    /// Every entry up to and including this one is purged.
    pub purged: Option<JLogId>,
    /// Time of the purged entry: the time floor of an empty log.
    pub floor_time_ms: i64,
    /// Record end of the purged entry: the record index an empty log continues from.
    #[serde(default)]
    pub floor_record: u64,
}

/// Writes `value` to `path` atomically and durably.
pub fn write_durable<T: Serialize>(path: &Path, value: &T) -> Result<(), MetaError> {
    let io = |source| MetaError::Io {
        path: path.to_path_buf(),
        source,
    };
    let json = serde_json::to_vec(value).map_err(|e| MetaError::Corrupt {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    let mut bytes = Vec::with_capacity(json.len() + 12);
    bytes.extend_from_slice(META_MAGIC);
    bytes.extend_from_slice(&crc32c::crc32c(&json).to_le_bytes());
    bytes.extend_from_slice(&json);
    write_bytes_durable(path, &bytes).map_err(io)
}

/// Replaces `path` with `bytes` atomically and durably: a temporary file written and synced,
/// renamed over it, the directory synced.
pub fn write_bytes_durable(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        sync_dir(dir)?;
    }
    Ok(())
}

/// Renames `from` to `to` (the `rename` failpoint makes it fail as a failing disk would).
pub fn rename(from: &Path, to: &Path) -> std::io::Result<()> {
    crate::failpoint::check(crate::failpoint::Failpoint::Rename)?;
    std::fs::rename(from, to)
}

/// Removes the file `path` (the `remove` failpoint makes it fail as a failing disk would).
pub fn remove_file(path: &Path) -> std::io::Result<()> {
    crate::failpoint::check(crate::failpoint::Failpoint::Remove)?;
    std::fs::remove_file(path)
}

/// fsyncs directory `dir`, so the entries created, renamed or removed in it survive a power
/// loss (the `dir-fsync` failpoint makes it fail as a failing disk would).
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    crate::failpoint::check(crate::failpoint::Failpoint::DirFsync)?;
    File::open(dir)?.sync_all()
}

/// Creates `dir` (and what is missing above it) durably: the directory and its parent are
/// synced, so a power loss right after cannot take the new entry away with what was then
/// written inside it.
pub fn create_dir_durable(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    sync_dir(dir)?;
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        sync_dir(parent)?;
    }
    Ok(())
}

/// Reads a file written by `write_durable`; Ok(None) if it does not exist.
pub fn read_durable<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, MetaError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(MetaError::Io {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let corrupt = |reason: String| MetaError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    if bytes.len() < 12 || &bytes[..8] != META_MAGIC {
        return Err(corrupt("bad magic or too short".into()));
    }
    let crc = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
    if crc32c::crc32c(&bytes[12..]) != crc {
        return Err(corrupt("checksum mismatch".into()));
    }
    serde_json::from_slice(&bytes[12..])
        .map(Some)
        .map_err(|e| corrupt(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durable_dirs_and_bytes() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("data").join("shard-0");
        create_dir_durable(&dir).unwrap();
        create_dir_durable(&dir).unwrap();
        let marker = dir.join("DATA_LOST");
        write_bytes_durable(&marker, b"first\n").unwrap();
        write_bytes_durable(&marker, b"second\n").unwrap();
        assert_eq!(std::fs::read(&marker).unwrap(), b"second\n");
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec!["DATA_LOST"], "no temporary file left");
    }

    #[test]
    fn round_trip_and_corruption_is_detected() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("meta");
        assert_eq!(read_durable::<Meta>(&p).unwrap(), None);
        let m = Meta {
            vote: Some(openraft::Vote::new(3, 1)),
            purged: None,
            floor_time_ms: 12,
            floor_record: 40,
        };
        write_durable(&p, &m).unwrap();
        assert_eq!(read_durable::<Meta>(&p).unwrap(), Some(m));
        let mut b = std::fs::read(&p).unwrap();
        let last = b.len() - 2;
        b[last] ^= 0x40;
        std::fs::write(&p, b).unwrap();
        assert!(matches!(
            read_durable::<Meta>(&p),
            Err(MetaError::Corrupt { .. })
        ));
    }
}
