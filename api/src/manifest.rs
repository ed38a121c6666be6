//! The object layout of checkpoints in object storage and the JSON manifest that names them:
//! shared by the compactor (writer) and the frontend (reader), which may not depend on each other.
//!
//! Layout, relative to the store's root (the path part of the object-store URL):
//!
//! ```text
//! tenants/<tenant>/checkpoints/<index:020>-<created_ms:013>.ckpt   memstore::checkpoint objects
//! tenants/<tenant>/manifests/<seq:020>.json                         Manifest, JSON
//! shards/<shard:010>/ticks-only/<below:020>.json                    TicksOnly, JSON
//! ```
//!
//! Rules (DESIGN invariant 7):
//! - A checkpoint object is written whole (single put, or a completed multipart upload) under a
//!   name never used before, with `PutMode::Create`. It is never modified afterwards.
//! - A manifest is written only after every checkpoint it names is fully written, also with
//!   `PutMode::Create` under the next sequence number. Manifests are never updated in place (a
//!   local directory has no conditional update). A writer that loses a race for a sequence
//!   number (`AlreadyExists`) re-lists and tries the next one.
//! - **Readers load the manifest [`chosen`] picks**: among the manifests that parse and name the
//!   shard of the highest-numbered one, the one whose newest checkpoint has the highest journal
//!   index (the highest number among equals). One compactor publishes rising indexes, so that is
//!   the newest; a second compactor of the shard (stalled, or on a node cut off) may publish an
//!   older state under a higher number after the first trimmed the journal past it, and such a
//!   late manifest is then passed over instead of leaving readers a checkpoint the journal
//!   cannot continue. Garbage collection never deletes the chosen manifest.
//! - A manifest lists the tenant's retained checkpoints, newest first. A reader tries them in
//!   order: a checkpoint that is missing, has the wrong size or CRC32C, or fails
//!   `memstore::checkpoint::decode` is skipped and the next (older) one is used.
//! - Objects are deleted only when no manifest newer than a few sequence numbers names them, so
//!   a reader that listed a moment ago still finds what its manifest names; a reader that gets
//!   `NotFound` on a manifest re-lists.
//! - A `TicksOnly` record is the compactor's word, written before it trims a shard that holds no
//!   tenant, that every record of the shard below `below` was a tick or a leader change: no
//!   tenant has history there, so a tenant without a manifest starts empty at the journal's
//!   first index up to `below`. Its name carries `below`; the highest one counts.

use serde::{Deserialize, Serialize};

/// The manifest format this build writes; readers accept every version up to this one.
pub const MANIFEST_FORMAT_VERSION: u32 = 1;

/// Top-level folder of every tenant's objects.
pub const TENANTS_DIR: &str = "tenants";
/// Folder (under a tenant) of its checkpoint objects.
pub const CHECKPOINTS_DIR: &str = "checkpoints";
/// Folder (under a tenant) of its manifests.
pub const MANIFESTS_DIR: &str = "manifests";
/// File name suffix of checkpoint objects.
pub const CHECKPOINT_SUFFIX: &str = ".ckpt";
/// File name suffix of manifests.
pub const MANIFEST_SUFFIX: &str = ".json";
/// Top-level folder of shard-level records.
pub const SHARDS_DIR: &str = "shards";
/// Folder (under a shard) of its `TicksOnly` records.
pub const TICKS_ONLY_DIR: &str = "ticks-only";
/// Digits of the zero-padded shard number in paths (`u32::MAX` has 10).
const SHARD_DIGITS: usize = 10;
/// Longest tenant name accepted in an object path (a DNS label is at most 63 bytes).
/// A catalogue tenant's journal key is its name (a DNS label, at most 63 bytes), a dot and its
/// generation (16 hex digits: `crate::tenant::journal_key`).
pub const MAX_TENANT_NAME_LEN: usize = 80;
/// Digits of the zero-padded sequence numbers and indexes in names (`u64::MAX` has 20).
const INDEX_DIGITS: usize = 20;
/// Digits of the zero-padded creation time in checkpoint names (milliseconds until year 2286).
const CREATED_MS_DIGITS: usize = 13;

/// Why a manifest or an object name was refused.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error(
        "tenant name {0:?} cannot be used in an object path (want [a-z0-9][a-z0-9._-]*, at most {MAX_TENANT_NAME_LEN} bytes)"
    )]
    BadTenant(String),
    #[error("manifest is not valid JSON: {0}")]
    Malformed(#[from] serde_json::Error),
    #[error("manifest format version {0} is newer than this build's {MANIFEST_FORMAT_VERSION}")]
    TooNew(u32),
    #[error("manifest of tenant {found:?} found under tenant {expected:?}")]
    WrongTenant { expected: String, found: String },
    #[error("manifest names no checkpoint")]
    Empty,
    #[error("checkpoint object {path}: {what}")]
    ObjectMismatch { path: String, what: String },
}

/// One checkpoint object as the manifest names it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointRef {
    /// Object path relative to the store root (`tenants/<t>/checkpoints/...`).
    pub path: String,
    /// Journal index the checkpoint reflects: every entry of the shard up to and including it is
    /// applied. A replica loading it tails the journal from `index + 1`.
    pub index: u64,
    /// The tenant's store revision at `index`.
    pub revision: i64,
    /// Exact object size in bytes.
    pub size: u64,
    /// CRC32C of the whole object (the object carries its own checksum as well; this one lets a
    /// reader reject a wrong object before decoding it).
    pub crc32c: u32,
    /// Journal time (ms) of the last applied entry, i.e. `MemStore::time_ms()` at `index`.
    pub time_ms: i64,
    /// Wall-clock ms when the compactor wrote it (informational: listing, backups).
    pub created_ms: i64,
}

impl CheckpointRef {
    /// Checks that `bytes` are the object this reference names (size and CRC32C).
    pub fn verify(&self, bytes: &[u8]) -> Result<(), ManifestError> {
        if bytes.len() as u64 != self.size {
            return Err(ManifestError::ObjectMismatch {
                path: self.path.clone(),
                what: format!("size {} but the manifest says {}", bytes.len(), self.size),
            });
        }
        let crc = crc32c::crc32c(bytes);
        if crc != self.crc32c {
            return Err(ManifestError::ObjectMismatch {
                path: self.path.clone(),
                what: format!(
                    "crc32c {crc:#010x} but the manifest says {:#010x}",
                    self.crc32c
                ),
            });
        }
        Ok(())
    }
}

/// The manifest of one tenant: its retained checkpoints, newest first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format_version: u32,
    pub tenant: String,
    /// Journal shard the tenant lives on (every checkpoint below reflects that shard).
    pub shard: u32,
    /// This manifest's sequence number (also its object name).
    pub seq: u64,
    /// Wall-clock ms when it was published (informational).
    pub published_ms: i64,
    /// Retained checkpoints, newest (highest index) first; never empty.
    pub checkpoints: Vec<CheckpointRef>,
}

impl Manifest {
    /// The newest checkpoint.
    pub fn newest(&self) -> Option<&CheckpointRef> {
        self.checkpoints.first()
    }

    /// Serialises for `put` (pretty, so that an operator can read it with `cat`).
    pub fn to_json(&self) -> Vec<u8> {
        // Serialising plain structs of strings and integers cannot fail.
        serde_json::to_vec_pretty(self).expect("a manifest always serialises")
    }

    /// Parses and validates a manifest read from `tenant`'s folder.
    pub fn from_json(tenant: &str, bytes: &[u8]) -> Result<Self, ManifestError> {
        let m: Manifest = serde_json::from_slice(bytes)?;
        if m.format_version > MANIFEST_FORMAT_VERSION {
            return Err(ManifestError::TooNew(m.format_version));
        }
        if m.tenant != tenant {
            return Err(ManifestError::WrongTenant {
                expected: tenant.to_string(),
                found: m.tenant,
            });
        }
        if m.checkpoints.is_empty() {
            return Err(ManifestError::Empty);
        }
        Ok(m)
    }
}

/// The compactor's word that shard `shard` held nothing but ticks and leader changes below
/// `below` when it trimmed it there (see the module's rules). JSON, for operators; readers take
/// `below` from the object's name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TicksOnly {
    pub format_version: u32,
    pub shard: u32,
    pub below: u64,
    /// Wall-clock ms when it was written (informational).
    pub written_ms: i64,
}

impl TicksOnly {
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).expect("a ticks-only record always serialises")
    }
}

/// `shards/<shard>/ticks-only`: list this to find how far a tenant-less shard was trimmed.
pub fn ticks_only_dir(shard: u32) -> String {
    format!(
        "{SHARDS_DIR}/{shard:0s$}/{TICKS_ONLY_DIR}",
        s = SHARD_DIGITS
    )
}

/// Path of the `TicksOnly` record for a trim below `below`.
pub fn ticks_only_path(shard: u32, below: u64) -> String {
    format!(
        "{}/{below:0w$}{MANIFEST_SUFFIX}",
        ticks_only_dir(shard),
        w = INDEX_DIGITS
    )
}

/// The `below` of a `TicksOnly` path (any prefix before the file name), if it is one.
pub fn parse_ticks_only_below(path: &str) -> Option<u64> {
    parse_numbered_json(path)
}

/// The shard a manifest names, read leniently (any format version, nothing else checked): enough
/// to tell whose tenant an unreadable manifest is.
pub fn shard_named(bytes: &[u8]) -> Option<u32> {
    #[derive(Deserialize)]
    struct ShardOnly {
        shard: u32,
    }
    serde_json::from_slice::<ShardOnly>(bytes)
        .ok()
        .map(|m| m.shard)
}

/// Checks that `tenant` can be used as one object path segment, unchanged on every store.
pub fn validate_tenant(tenant: &str) -> Result<(), ManifestError> {
    let ok_first = tenant
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    let ok_rest = tenant
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'_'));
    // The catalogue's reserved tenant is checkpointed like any other.
    if tenant == crate::tenant::SYSTEM_TENANT
        || (ok_first && ok_rest && tenant.len() <= MAX_TENANT_NAME_LEN)
    {
        Ok(())
    } else {
        Err(ManifestError::BadTenant(tenant.to_string()))
    }
}

/// `tenants/<tenant>`: everything of one tenant.
pub fn tenant_dir(tenant: &str) -> Result<String, ManifestError> {
    validate_tenant(tenant)?;
    Ok(format!("{TENANTS_DIR}/{tenant}"))
}

/// `tenants/<tenant>/manifests`: list this to find the newest manifest.
pub fn manifests_dir(tenant: &str) -> Result<String, ManifestError> {
    Ok(format!("{}/{MANIFESTS_DIR}", tenant_dir(tenant)?))
}

/// `tenants/<tenant>/checkpoints`.
pub fn checkpoints_dir(tenant: &str) -> Result<String, ManifestError> {
    Ok(format!("{}/{CHECKPOINTS_DIR}", tenant_dir(tenant)?))
}

/// Path of manifest number `seq`.
pub fn manifest_path(tenant: &str, seq: u64) -> Result<String, ManifestError> {
    Ok(format!(
        "{}/{seq:0w$}{MANIFEST_SUFFIX}",
        manifests_dir(tenant)?,
        w = INDEX_DIGITS
    ))
}

/// Path of a new checkpoint object at journal `index`, written at wall-clock `created_ms`.
pub fn checkpoint_path(tenant: &str, index: u64, created_ms: i64) -> Result<String, ManifestError> {
    Ok(format!(
        "{}/{index:0w$}-{:0c$}{CHECKPOINT_SUFFIX}",
        checkpoints_dir(tenant)?,
        created_ms.max(0),
        w = INDEX_DIGITS,
        c = CREATED_MS_DIGITS
    ))
}

/// The sequence number of a manifest path (any prefix before the file name), if it is one.
pub fn parse_manifest_seq(path: &str) -> Option<u64> {
    parse_numbered_json(path)
}

/// The number of a `<number:020>.json` file name (any prefix before it).
fn parse_numbered_json(path: &str) -> Option<u64> {
    let name = path.rsplit('/').next()?;
    let digits = name.strip_suffix(MANIFEST_SUFFIX)?;
    if digits.len() != INDEX_DIGITS || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The journal index of a checkpoint path (any prefix before the file name), if it is one.
pub fn parse_checkpoint_index(path: &str) -> Option<u64> {
    let name = path.rsplit('/').next()?;
    let stem = name.strip_suffix(CHECKPOINT_SUFFIX)?;
    let (index, created) = stem.split_once('-')?;
    if index.len() != INDEX_DIGITS
        || !index.bytes().all(|b| b.is_ascii_digit())
        || !created.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    index.parse().ok()
}

/// The tenant named by a path under `tenants/` (`tenants/<tenant>/...`).
pub fn parse_tenant(path: &str) -> Option<&str> {
    let mut parts = path.split('/');
    while let Some(p) = parts.next() {
        if p == TENANTS_DIR {
            let t = parts.next()?;
            return validate_tenant(t).is_ok().then_some(t);
        }
    }
    None
}

/// The manifest readers load of a tenant's manifests (any order): among those naming the shard
/// of the highest-numbered one (a tenant moved to another shard counts from there), the one
/// whose newest checkpoint has the highest index, the highest number among equals.
pub fn chosen<'a>(
    manifests: impl IntoIterator<Item = &'a Manifest> + Clone,
) -> Option<&'a Manifest> {
    let shard = manifests.clone().into_iter().max_by_key(|m| m.seq)?.shard;
    manifests
        .into_iter()
        .filter(|m| m.shard == shard)
        .max_by_key(|m| (m.newest().map(|c| c.index), m.seq))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        Manifest {
            format_version: MANIFEST_FORMAT_VERSION,
            tenant: "default".into(),
            shard: 0,
            seq: 7,
            published_ms: 1_700_000_000_000,
            checkpoints: vec![CheckpointRef {
                path: checkpoint_path("default", 42, 1_700_000_000_000).unwrap(),
                index: 42,
                revision: 17,
                size: 3,
                crc32c: crc32c::crc32c(b"abc"),
                time_ms: 1_699_999_999_000,
                created_ms: 1_700_000_000_000,
            }],
        }
    }

    #[test]
    fn json_round_trip() {
        let m = sample();
        assert_eq!(Manifest::from_json("default", &m.to_json()).unwrap(), m);
    }

    #[test]
    fn refuses_other_tenant_newer_format_and_empty() {
        let m = sample();
        assert!(matches!(
            Manifest::from_json("other", &m.to_json()),
            Err(ManifestError::WrongTenant { .. })
        ));
        let mut newer = sample();
        newer.format_version = MANIFEST_FORMAT_VERSION + 1;
        assert!(matches!(
            Manifest::from_json("default", &newer.to_json()),
            Err(ManifestError::TooNew(_))
        ));
        let mut empty = sample();
        empty.checkpoints.clear();
        assert!(matches!(
            Manifest::from_json("default", &empty.to_json()),
            Err(ManifestError::Empty)
        ));
        assert!(matches!(
            Manifest::from_json("default", b"{\"format_version\": 1"),
            Err(ManifestError::Malformed(_))
        ));
    }

    #[test]
    fn paths_sort_by_number_and_parse_back() {
        let a = manifest_path("default", 9).unwrap();
        let b = manifest_path("default", 10).unwrap();
        assert!(a < b, "zero padding keeps lexical order = numeric order");
        assert_eq!(a, "tenants/default/manifests/00000000000000000009.json");
        assert_eq!(parse_manifest_seq(&b), Some(10));
        assert_eq!(
            parse_manifest_seq("tenants/default/manifests/10.json"),
            None
        );
        assert_eq!(parse_manifest_seq("tenants/default/manifests/x.tmp"), None);
        let c = checkpoint_path("default", 42, 5).unwrap();
        assert_eq!(
            c,
            "tenants/default/checkpoints/00000000000000000042-0000000000005.ckpt"
        );
        assert_eq!(parse_checkpoint_index(&c), Some(42));
        assert_eq!(parse_tenant(&c), Some("default"));
        assert_eq!(parse_tenant(&format!("root/prefix/{c}")), Some("default"));
    }

    #[test]
    fn chosen_is_the_highest_index_on_the_newest_manifests_shard() {
        let m = |seq: u64, shard: u32, index: u64| {
            let mut m = sample();
            m.seq = seq;
            m.shard = shard;
            m.checkpoints[0].index = index;
            m
        };
        assert!(chosen(&Vec::<Manifest>::new()).is_none());
        // One compactor: rising numbers, rising indexes.
        let normal = [m(1, 0, 10), m(2, 0, 20), m(3, 0, 30)];
        assert_eq!(chosen(&normal).unwrap().seq, 3);
        // A late manifest of a stale compactor: a higher number, an older state.
        let late = [m(1, 0, 10), m(2, 0, 30), m(3, 0, 20)];
        assert_eq!(chosen(&late).unwrap().seq, 2);
        // Equal indexes: the higher number.
        let equal = [m(4, 0, 30), m(5, 0, 30)];
        assert_eq!(chosen(equal.iter().rev()).unwrap().seq, 5);
        // Moved to shard 1, whose journal has lower indexes: shard 0's are not compared.
        let moved = [m(1, 0, 500), m(2, 1, 10)];
        assert_eq!(chosen(&moved).unwrap().seq, 2);
    }

    #[test]
    fn ticks_only_paths_sort_by_index_and_parse_back() {
        let a = ticks_only_path(3, 9);
        let b = ticks_only_path(3, 10);
        assert_eq!(a, "shards/0000000003/ticks-only/00000000000000000009.json");
        assert!(a < b);
        assert!(a.starts_with(&ticks_only_dir(3)));
        assert_eq!(parse_ticks_only_below(&b), Some(10));
        assert_eq!(parse_ticks_only_below(&format!("root/{a}")), Some(9));
        assert_eq!(
            parse_ticks_only_below("shards/0000000003/ticks-only/9.json"),
            None
        );
        let r = TicksOnly {
            format_version: MANIFEST_FORMAT_VERSION,
            shard: 3,
            below: 10,
            written_ms: 1,
        };
        assert_eq!(
            serde_json::from_slice::<TicksOnly>(&r.to_json()).unwrap(),
            r
        );
    }

    #[test]
    fn tenant_names_are_path_safe() {
        for ok in ["default", "a", "team-1.prod_x", "0abc"] {
            validate_tenant(ok).unwrap();
        }
        for bad in [
            "",
            "Default",
            "-a",
            "a/b",
            "a b",
            "..",
            "ä",
            &"a".repeat(81),
        ] {
            assert!(validate_tenant(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn verify_checks_size_and_crc() {
        let r = &sample().checkpoints[0];
        r.verify(b"abc").unwrap();
        assert!(r.verify(b"abd").is_err());
        assert!(r.verify(b"abcd").is_err());
    }
}
