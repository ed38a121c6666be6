//! The system an end-to-end suite runs against: Strata (`strata dev`, the default) or a real
//! etcd 3.4 when `STRATA_TEST_TARGET=etcd`, so every expectation can be checked against etcd.

use crate::deployment::DevDeployment;
use crate::etcd::EtcdServer;

/// Environment variable choosing the target: `strata` (default) or `etcd`.
pub const TARGET_ENV: &str = "STRATA_TEST_TARGET";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetKind {
    Strata,
    Etcd,
}

/// The target chosen by `$STRATA_TEST_TARGET`; panics on an unknown value so a typo never
/// silently tests the wrong system.
pub fn target_kind() -> TargetKind {
    match std::env::var(TARGET_ENV).as_deref() {
        Err(_) | Ok("") | Ok("strata") => TargetKind::Strata,
        Ok("etcd") => TargetKind::Etcd,
        Ok(other) => panic!("{TARGET_ENV}={other}: expected `strata` or `etcd`"),
    }
}

/// A running target, stopped when dropped.
pub enum Target {
    Strata(DevDeployment),
    Etcd(EtcdServer),
}

impl Target {
    /// Starts a fresh target of the configured kind and waits until it serves.
    pub async fn start() -> Self {
        match target_kind() {
            TargetKind::Strata => Self::Strata(DevDeployment::start().await),
            TargetKind::Etcd => Self::Etcd(EtcdServer::start().await),
        }
    }

    pub fn kind(&self) -> TargetKind {
        match self {
            Self::Strata(_) => TargetKind::Strata,
            Self::Etcd(_) => TargetKind::Etcd,
        }
    }

    /// Client URL, `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> &str {
        match self {
            Self::Strata(d) => d.endpoint(),
            Self::Etcd(e) => e.endpoint(),
        }
    }

    /// The target's log so far, for failure messages.
    pub fn log_tail(&self) -> String {
        match self {
            Self::Strata(d) => d.log_tail(),
            Self::Etcd(e) => e.log_tail(),
        }
    }
}
