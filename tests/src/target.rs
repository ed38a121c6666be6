//! The system an end-to-end suite runs against: Strata (`strata dev`, the default) or a real
//! etcd 3.4 when `STRATA_TEST_TARGET=etcd`, so every expectation can be checked against etcd.

use std::time::Duration;

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

/// Server settings a suite needs beyond the defaults.
#[derive(Clone, Debug, Default)]
pub struct TargetOptions {
    /// Period of progress notifications to watchers created with `progress_notify`
    /// (etcd: `--experimental-watch-progress-notify-interval`; Strata's frontend:
    /// `--watch-progress-notify-interval`, passed through `strata dev --frontend-arg`).
    pub progress_notify_interval: Option<Duration>,
}

impl Target {
    /// Starts a fresh target of the configured kind and waits until it serves.
    pub async fn start() -> Self {
        Self::start_with(&TargetOptions::default()).await
    }

    /// Starts a fresh target with `options`.
    pub async fn start_with(options: &TargetOptions) -> Self {
        let interval = options
            .progress_notify_interval
            .map(|d| format!("{}ms", d.as_millis()));
        match target_kind() {
            TargetKind::Strata => {
                let mut extra = Vec::new();
                if let Some(i) = &interval {
                    extra.push(format!(
                        "--frontend-arg=--watch-progress-notify-interval={i}"
                    ));
                }
                Self::Strata(DevDeployment::start_with(&extra).await)
            }
            TargetKind::Etcd => {
                let mut extra = Vec::new();
                if let Some(i) = &interval {
                    extra.push(format!("--experimental-watch-progress-notify-interval={i}"));
                }
                let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
                Self::Etcd(EtcdServer::start_with(&extra).await)
            }
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
