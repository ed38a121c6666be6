//! A journal node's settings as a file (`strata journal --config <file>`, TOML, or JSON for a
//! `.json` file): every field optional, named as the command-line flags; flags given on the
//! command line win over the file, the file over the defaults. Also owns those defaults and
//! the validation of the resulting `NodeConfig`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::node::{DEFAULT_IDLE_TICK, MAX_IDLE_TICK, NodeConfig};
use crate::segment::SEGMENT_TARGET_BYTES;
use crate::types::NodeId;

/// Default listen address (client API and Raft traffic).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7001";
/// Default data directory.
pub const DEFAULT_DATA_DIR: &str = "strata-journal-data";
/// Default number of shards.
pub const DEFAULT_SHARDS: u32 = 4;
/// Most shards a node hosts (each is a Raft group with its own flusher thread).
pub const MAX_SHARDS: u32 = 256;
/// Smallest segment size accepted (tests use small segments; production keeps the default).
pub const MIN_SEGMENT_BYTES: u64 = 4096;

/// Why a config file or the resulting settings are not usable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Parse { path: PathBuf, reason: String },
    #[error("peer id {0:?} is not a positive integer")]
    PeerId(String),
    #[error("the node id is required (--id or `id` in the config file)")]
    NoId,
    #[error("node ids start at 1")]
    ZeroId,
    #[error("shards must be between 1 and {MAX_SHARDS}, not {0}")]
    Shards(u32),
    #[error("idle-tick must be longer than zero and at most {MAX_IDLE_TICK:?}")]
    IdleTick,
    #[error("segment-bytes must be at least {MIN_SEGMENT_BYTES}, not {0}")]
    SegmentBytes(u64),
    #[error("the node's own id {0} is not in the peers")]
    NotInPeers(NodeId),
    #[error(
        "internal TLS needs internal-trusted-ca-file, internal-cert-file and internal-key-file together (internal-crl-file only with them)"
    )]
    PartialTls,
}

/// The settings of a node as a file or as flags: `None` means "not given here".
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileConfig {
    pub id: Option<NodeId>,
    pub listen: Option<String>,
    /// Every member of the initial cluster: node id (as a string key) -> `host:port`.
    pub peers: Option<BTreeMap<String, String>>,
    pub data_dir: Option<PathBuf>,
    pub shards: Option<u32>,
    /// Human-readable duration, e.g. `"500ms"`.
    #[serde(default, with = "humantime_serde")]
    pub idle_tick: Option<Duration>,
    pub join: Option<bool>,
    pub segment_bytes: Option<u64>,
    /// Where to serve Prometheus `/metrics` (`host:port`); none when absent.
    pub metrics_listen: Option<String>,
    /// Internal TLS (`crate::tls`): all three, or none for plaintext.
    pub internal_trusted_ca_file: Option<PathBuf>,
    pub internal_cert_file: Option<PathBuf>,
    pub internal_key_file: Option<PathBuf>,
    /// With them, optionally: the internal CA's revocation lists.
    pub internal_crl_file: Option<PathBuf>,
}

impl FileConfig {
    /// Reads `path`: JSON if its name ends in `.json`, TOML otherwise.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let json = path.extension().is_some_and(|e| e == "json");
        Self::parse(&text, json).map_err(|reason| ConfigError::Parse {
            path: path.to_path_buf(),
            reason,
        })
    }

    /// Parses a config text (JSON or TOML).
    pub fn parse(text: &str, json: bool) -> Result<Self, String> {
        if json {
            serde_json::from_str(text).map_err(|e| e.to_string())
        } else {
            toml::from_str(text).map_err(|e| e.to_string())
        }
    }

    /// `self` with every field it lacks taken from `lower` (flags over file).
    pub fn over(self, lower: FileConfig) -> FileConfig {
        FileConfig {
            id: self.id.or(lower.id),
            listen: self.listen.or(lower.listen),
            peers: self.peers.or(lower.peers),
            data_dir: self.data_dir.or(lower.data_dir),
            shards: self.shards.or(lower.shards),
            idle_tick: self.idle_tick.or(lower.idle_tick),
            join: self.join.or(lower.join),
            segment_bytes: self.segment_bytes.or(lower.segment_bytes),
            metrics_listen: self.metrics_listen.or(lower.metrics_listen),
            internal_trusted_ca_file: self
                .internal_trusted_ca_file
                .or(lower.internal_trusted_ca_file),
            internal_cert_file: self.internal_cert_file.or(lower.internal_cert_file),
            internal_key_file: self.internal_key_file.or(lower.internal_key_file),
            internal_crl_file: self.internal_crl_file.or(lower.internal_crl_file),
        }
    }

    /// The internal TLS files named (None: plaintext); some but not all is an error.
    pub fn tls_files(&self) -> Result<Option<crate::tls::TlsFiles>, ConfigError> {
        match (
            &self.internal_trusted_ca_file,
            &self.internal_cert_file,
            &self.internal_key_file,
        ) {
            (None, None, None) if self.internal_crl_file.is_none() => Ok(None),
            (Some(ca), Some(cert), Some(key)) => Ok(Some(crate::tls::TlsFiles {
                ca: ca.clone(),
                cert: cert.clone(),
                key: key.clone(),
                crl: self.internal_crl_file.clone(),
            })),
            _ => Err(ConfigError::PartialTls),
        }
    }

    /// The listen address, or the default.
    pub fn listen_or_default(&self) -> String {
        self.listen
            .clone()
            .unwrap_or_else(|| DEFAULT_LISTEN.to_string())
    }

    /// The node's settings, defaults filled in and validated. Without peers, the node is a
    /// cluster of one at its listen address.
    pub fn node_config(&self) -> Result<NodeConfig, ConfigError> {
        let id = self.id.ok_or(ConfigError::NoId)?;
        let peers = match &self.peers {
            Some(p) => p
                .iter()
                .map(|(k, v)| {
                    k.trim()
                        .parse::<NodeId>()
                        .map_err(|_| ConfigError::PeerId(k.clone()))
                        .map(|id| (id, v.trim().to_string()))
                })
                .collect::<Result<BTreeMap<_, _>, _>>()?,
            None => BTreeMap::from([(id, self.listen_or_default())]),
        };
        let config = NodeConfig {
            id,
            peers,
            data_dir: self
                .data_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR)),
            shards: self.shards.unwrap_or(DEFAULT_SHARDS),
            idle_tick: self.idle_tick.unwrap_or(DEFAULT_IDLE_TICK),
            join: self.join.unwrap_or(false),
            segment_bytes: self.segment_bytes.unwrap_or(SEGMENT_TARGET_BYTES),
            batching: Default::default(),
            overlap_leader_fsync: true,
            read_lease: crate::node::DEFAULT_READ_LEASE,
            handoff_settle: Some(crate::handoff::DEFAULT_HANDOFF_SETTLE),
            refuse_streams: false,
            tls: None,
        };
        validate(&config)?;
        Ok(config)
    }
}

/// Checks settings that cannot work.
pub fn validate(c: &NodeConfig) -> Result<(), ConfigError> {
    if c.id == 0 || c.peers.contains_key(&0) {
        return Err(ConfigError::ZeroId);
    }
    if !c.peers.contains_key(&c.id) {
        return Err(ConfigError::NotInPeers(c.id));
    }
    if c.shards == 0 || c.shards > MAX_SHARDS {
        return Err(ConfigError::Shards(c.shards));
    }
    if c.idle_tick.is_zero() || c.idle_tick > MAX_IDLE_TICK {
        return Err(ConfigError::IdleTick);
    }
    if c.segment_bytes < MIN_SEGMENT_BYTES {
        return Err(ConfigError::SegmentBytes(c.segment_bytes));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOML: &str = r#"
id = 2
listen = "127.0.0.1:7002"
data-dir = "/var/lib/strata/journal"
shards = 8
idle-tick = "250ms"
segment-bytes = 1048576
metrics-listen = "127.0.0.1:9102"

[peers]
1 = "127.0.0.1:7001"
2 = "127.0.0.1:7002"
3 = "127.0.0.1:7003"
"#;

    #[test]
    fn toml_gives_every_setting() {
        let f = FileConfig::parse(TOML, false).unwrap();
        let c = f.node_config().unwrap();
        assert_eq!(c.id, 2);
        assert_eq!(c.peers.len(), 3);
        assert_eq!(c.peers[&3], "127.0.0.1:7003");
        assert_eq!(c.data_dir, PathBuf::from("/var/lib/strata/journal"));
        assert_eq!(c.shards, 8);
        assert_eq!(c.idle_tick, Duration::from_millis(250));
        assert_eq!(c.segment_bytes, 1 << 20);
        assert!(!c.join);
        assert_eq!(f.listen_or_default(), "127.0.0.1:7002");
        assert_eq!(f.metrics_listen.as_deref(), Some("127.0.0.1:9102"));
    }

    #[test]
    fn json_works_too_and_defaults_fill_the_rest() {
        let f =
            FileConfig::parse(r#"{"id": 1, "idle-tick": "400ms", "join": true}"#, true).unwrap();
        let c = f.node_config().unwrap();
        assert_eq!(c.idle_tick, Duration::from_millis(400));
        assert!(c.join);
        assert_eq!(c.shards, DEFAULT_SHARDS);
        assert_eq!(c.data_dir, PathBuf::from(DEFAULT_DATA_DIR));
        assert_eq!(c.peers, BTreeMap::from([(1, DEFAULT_LISTEN.to_string())]));
        assert_eq!(c.segment_bytes, SEGMENT_TARGET_BYTES);
    }

    #[test]
    fn flags_override_the_file() {
        let file = FileConfig::parse(TOML, false).unwrap();
        let flags = FileConfig {
            shards: Some(2),
            listen: Some("0.0.0.0:9000".into()),
            ..Default::default()
        };
        let merged = flags.over(file);
        assert_eq!(merged.shards, Some(2));
        assert_eq!(merged.listen.as_deref(), Some("0.0.0.0:9000"));
        assert_eq!(
            merged.id,
            Some(2),
            "what the flags lack comes from the file"
        );
        assert_eq!(merged.idle_tick, Some(Duration::from_millis(250)));
    }

    #[test]
    fn internal_tls_files_come_together_from_file_or_flags() {
        let file = FileConfig::parse(
            "id = 1\ninternal-trusted-ca-file = \"/tls/ca.crt\"\ninternal-cert-file = \"/tls/tls.crt\"\ninternal-key-file = \"/tls/tls.key\"\n",
            false,
        )
        .unwrap();
        let files = file.tls_files().unwrap().expect("internal TLS on");
        assert_eq!(files.ca, PathBuf::from("/tls/ca.crt"));
        assert_eq!(files.key, PathBuf::from("/tls/tls.key"));
        assert_eq!(files.crl, None);
        let flags = FileConfig {
            internal_cert_file: Some("/other/tls.crt".into()),
            internal_crl_file: Some("/tls/crl.pem".into()),
            ..Default::default()
        };
        let merged = flags.over(file).tls_files().unwrap().unwrap();
        assert_eq!(merged.cert, PathBuf::from("/other/tls.crt"));
        assert_eq!(merged.crl, Some(PathBuf::from("/tls/crl.pem")));
        assert_eq!(FileConfig::default().tls_files().unwrap(), None);
        let partial = FileConfig::parse("internal-cert-file = \"/tls/tls.crt\"\n", false).unwrap();
        assert!(matches!(partial.tls_files(), Err(ConfigError::PartialTls)));
        let crl_alone = FileConfig::parse("internal-crl-file = \"/tls/crl.pem\"\n", false).unwrap();
        assert!(matches!(
            crl_alone.tls_files(),
            Err(ConfigError::PartialTls)
        ));
    }

    #[test]
    fn mistakes_are_named() {
        let e = FileConfig::parse("id = 1\nshard = 3\n", false).unwrap_err();
        assert!(e.contains("unknown field `shard`"), "{e}");
        let e = FileConfig::parse("id = 1\nidle-tick = \"soon\"\n", false).unwrap_err();
        assert!(
            e.contains("idle-tick") || e.contains("soon") || !e.is_empty(),
            "{e}"
        );
        let f = FileConfig::parse("shards = 2\n", false).unwrap();
        assert!(matches!(f.node_config(), Err(ConfigError::NoId)));
        let f = FileConfig::parse("id = 1\nshards = 0\n", false).unwrap();
        assert!(matches!(f.node_config(), Err(ConfigError::Shards(0))));
        let f = FileConfig::parse("id = 4\n[peers]\n1 = \"a:1\"\n", false).unwrap();
        assert!(matches!(f.node_config(), Err(ConfigError::NotInPeers(4))));
        let f = FileConfig::parse("id = 1\n[peers]\nx = \"a:1\"\n", false).unwrap();
        assert!(matches!(f.node_config(), Err(ConfigError::PeerId(_))));
        let f = FileConfig::parse("id = 1\nidle-tick = \"1s\"\n", false).unwrap();
        assert!(matches!(f.node_config(), Err(ConfigError::IdleTick)));
        let f = FileConfig::parse("id = 1\nsegment-bytes = 10\n", false).unwrap();
        assert!(matches!(
            f.node_config(),
            Err(ConfigError::SegmentBytes(10))
        ));
    }

    #[test]
    fn load_reads_a_file_by_extension() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("journal.toml");
        std::fs::write(&p, TOML).unwrap();
        assert_eq!(FileConfig::load(&p).unwrap().id, Some(2));
        let p = dir.path().join("journal.json");
        std::fs::write(&p, r#"{"id": 3}"#).unwrap();
        assert_eq!(FileConfig::load(&p).unwrap().id, Some(3));
        let e = FileConfig::load(&dir.path().join("missing.toml")).unwrap_err();
        assert!(e.to_string().contains("missing.toml"), "{e}");
    }
}
