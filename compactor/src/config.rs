//! The compactor's settings, their defaults and their validation.

use std::time::Duration;

use api::manifest;

use crate::auto_compaction::Policy;

/// Default: a checkpoint round after this many journal records of a shard.
pub const DEFAULT_EVERY_ENTRIES: u64 = 10_000;
/// Default: a checkpoint round at least this often while records arrive.
pub const DEFAULT_EVERY: Duration = Duration::from_secs(30);
/// Default: checkpoints kept per tenant (the newest manifest names this many).
pub const DEFAULT_KEEP: usize = 5;
/// Default: the journal is trimmed below the checkpoint this many places behind the newest, so
/// that a newest checkpoint found corrupt can be replaced by the previous one plus the journal.
pub const DEFAULT_TRIM_LAG: usize = 1;
/// Default: first pause after a failed round; doubles up to `DEFAULT_RETRY_MAX`.
pub const DEFAULT_RETRY_MIN: Duration = Duration::from_millis(500);
pub const DEFAULT_RETRY_MAX: Duration = Duration::from_secs(30);
/// Default: how often the tenant catalogue is read for tenants to purge.
pub const DEFAULT_CATALOGUE_EVERY: Duration = Duration::from_secs(60);
/// Largest `keep` accepted (a manifest stays small).
pub const MAX_KEEP: usize = 1_000;

/// Settings of one compactor process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Journal shards this compactor owns (one compactor per shard at a time).
    pub shards: Vec<u32>,
    /// Tenants checkpointed even before they write anything, with their shard. Tenants found in
    /// the object store or in the journal are checkpointed too.
    pub tenants: Vec<(String, u32)>,
    pub every_entries: u64,
    pub every: Duration,
    pub keep: usize,
    pub trim_lag: usize,
    pub retry_min: Duration,
    pub retry_max: Duration,
    /// Auto-compaction of every tenant's MVCC history (etcd's `--auto-compaction-*`); `None`
    /// is etcd's default: off.
    pub auto_compaction: Option<Policy>,
    /// How often the tenant catalogue's newest checkpoint is read for tenants the catalogue is
    /// done with (deleted past their retention, older generations), which are purged.
    pub catalogue_every: Duration,
    /// Testing only: a pause after each checkpoint upload and after each manifest publish, so
    /// a fault test's `kill -9` reliably lands between the steps of a round. Zero otherwise.
    pub step_pause: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            shards: vec![0],
            tenants: vec![("default".to_string(), 0)],
            every_entries: DEFAULT_EVERY_ENTRIES,
            every: DEFAULT_EVERY,
            keep: DEFAULT_KEEP,
            trim_lag: DEFAULT_TRIM_LAG,
            retry_min: DEFAULT_RETRY_MIN,
            retry_max: DEFAULT_RETRY_MAX,
            auto_compaction: None,
            catalogue_every: DEFAULT_CATALOGUE_EVERY,
            step_pause: Duration::ZERO,
        }
    }
}

/// A setting that cannot work.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("no shards to compact")]
    NoShards,
    #[error("every-entries must be at least 1")]
    ZeroEntries,
    #[error("every and catalogue-every must be longer than zero")]
    ZeroEvery,
    #[error(
        "keep must be between {min} and {MAX_KEEP} (trim-lag {trim_lag} needs at least trim-lag + 1)"
    )]
    Keep { min: usize, trim_lag: usize },
    #[error("retry-min must be > 0 and <= retry-max")]
    Retry,
    #[error(transparent)]
    Tenant(#[from] manifest::ManifestError),
}

impl Config {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.shards.is_empty() {
            return Err(ConfigError::NoShards);
        }
        if self.every_entries == 0 {
            return Err(ConfigError::ZeroEntries);
        }
        if self.every.is_zero() || self.catalogue_every.is_zero() {
            return Err(ConfigError::ZeroEvery);
        }
        let min = self.trim_lag + 1;
        if self.keep < min || self.keep > MAX_KEEP {
            return Err(ConfigError::Keep {
                min,
                trim_lag: self.trim_lag,
            });
        }
        if self.retry_min.is_zero() || self.retry_min > self.retry_max {
            return Err(ConfigError::Retry);
        }
        for (t, _) in &self.tenants {
            manifest::validate_tenant(t)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_values_are_refused() {
        Config::default().validate().unwrap();
        let bad = [
            Config {
                shards: vec![],
                ..Config::default()
            },
            Config {
                every_entries: 0,
                ..Config::default()
            },
            Config {
                keep: 1,
                trim_lag: 1,
                ..Config::default()
            },
            Config {
                tenants: vec![("Bad/Name".into(), 0)],
                ..Config::default()
            },
            Config {
                retry_min: Duration::from_secs(60),
                ..Config::default()
            },
        ];
        for c in bad {
            assert!(c.validate().is_err(), "{c:?}");
        }
    }
}
