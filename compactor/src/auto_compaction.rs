//! Auto-compaction policy, as etcd's `--auto-compaction-mode periodic|revision` with
//! `--auto-compaction-retention` (etcd's `server/etcdserver/api/v3compactor`): a pure tracker per
//! tenant that is told the time and the tenant's revision at each check and answers the revision
//! to compact at, if any. The shard loop turns an answer into an ordinary journalled Compact.

use std::collections::VecDeque;
use std::time::Duration;

/// etcd's periodic compactor samples the revision `RETRY_DIVISOR` times per window.
pub const RETRY_DIVISOR: u32 = 10;
/// etcd's periodic compactor compacts at most this often, whatever the retention.
pub const MAX_PERIODIC_INTERVAL: Duration = Duration::from_secs(3600);
/// etcd's revision compactor checks this often.
pub const REVISION_CHECK_INTERVAL: Duration = Duration::from_secs(5 * 60);
/// Shortest check interval accepted (a tighter loop only burns CPU).
pub const MIN_CHECK_INTERVAL: Duration = Duration::from_millis(10);

/// What to keep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Keep roughly this much wall-clock time of history.
    Periodic(Duration),
    /// Keep the last N revisions.
    Revision(i64),
}

/// A mode plus how often it is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    pub mode: Mode,
    /// Time between checks: etcd's defaults are `retention / 10` (at most 6 minutes) for
    /// periodic and 5 minutes for revision; configurable so that tests run in seconds.
    pub check_every: Duration,
}

/// A policy that cannot work.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    #[error("unknown auto-compaction mode {0:?} (expected periodic or revision)")]
    Mode(String),
    #[error("invalid auto-compaction retention {value:?} for mode {mode}: {reason}")]
    Retention {
        mode: &'static str,
        value: String,
        reason: String,
    },
    #[error("auto-compaction check interval must be at least {MIN_CHECK_INTERVAL:?}")]
    CheckInterval,
}

impl Policy {
    /// Parses etcd's flags: mode `periodic` takes a duration (`1h`, `30m`, `5s`) or a bare number
    /// of hours, mode `revision` a number of revisions. A retention of `0` turns the policy off
    /// (`Ok(None)`), as in etcd. `check_every` overrides the mode's default check interval.
    pub fn parse(
        mode: &str,
        retention: &str,
        check_every: Option<Duration>,
    ) -> Result<Option<Policy>, PolicyError> {
        let retention = retention.trim();
        let mode = match mode {
            "periodic" => {
                let period = match retention.parse::<u64>() {
                    Ok(hours) => Duration::from_secs(hours.saturating_mul(3600)),
                    Err(_) => humantime::parse_duration(retention).map_err(|e| {
                        PolicyError::Retention {
                            mode: "periodic",
                            value: retention.to_string(),
                            reason: e.to_string(),
                        }
                    })?,
                };
                if period.is_zero() {
                    return Ok(None);
                }
                Mode::Periodic(period)
            }
            "revision" => {
                let n = retention
                    .parse::<i64>()
                    .map_err(|e| PolicyError::Retention {
                        mode: "revision",
                        value: retention.to_string(),
                        reason: e.to_string(),
                    })?;
                if n < 0 {
                    return Err(PolicyError::Retention {
                        mode: "revision",
                        value: retention.to_string(),
                        reason: "must not be negative".into(),
                    });
                }
                if n == 0 {
                    return Ok(None);
                }
                Mode::Revision(n)
            }
            other => return Err(PolicyError::Mode(other.to_string())),
        };
        let check_every = check_every.unwrap_or_else(|| default_check_interval(mode));
        if check_every < MIN_CHECK_INTERVAL {
            return Err(PolicyError::CheckInterval);
        }
        Ok(Some(Policy { mode, check_every }))
    }
}

/// etcd's check interval for `mode`.
pub fn default_check_interval(mode: Mode) -> Duration {
    match mode {
        Mode::Periodic(p) => (p.min(MAX_PERIODIC_INTERVAL) / RETRY_DIVISOR).max(MIN_CHECK_INTERVAL),
        Mode::Revision(_) => REVISION_CHECK_INTERVAL,
    }
}

/// One tenant's auto-compaction state. Time is a `Duration` since any fixed origin (the shard
/// loop passes its monotonic clock), so the tracker is deterministic under test.
#[derive(Clone, Debug)]
pub struct Tracker {
    policy: Policy,
    /// Periodic: revisions sampled once per check, oldest first; `revs[0]` is the revision of
    /// about one retention period ago once the window is full.
    revs: VecDeque<i64>,
    /// Periodic: when the last compaction succeeded (or the tracker started).
    last_success: Duration,
    /// Periodic: wait this long after the last success (the whole period at first, then
    /// `min(period, 1h)`), as etcd does.
    wait: Duration,
    /// Revision: the last revision compacted at by this tracker.
    prev: i64,
    /// A compaction was asked for and its outcome is not known yet.
    in_flight: bool,
}

impl Tracker {
    /// A tracker starting at time `now` with the tenant at `revision`.
    pub fn new(policy: Policy, now: Duration, revision: i64) -> Self {
        let mut revs = VecDeque::with_capacity(Self::window(&policy));
        if matches!(policy.mode, Mode::Periodic(_)) {
            revs.push_back(revision);
        }
        let wait = match policy.mode {
            Mode::Periodic(p) => p,
            Mode::Revision(_) => Duration::ZERO,
        };
        Self {
            policy,
            revs,
            last_success: now,
            wait,
            prev: 0,
            in_flight: false,
        }
    }

    /// Samples kept by the periodic mode: period / check + 1 (etcd's `getRetentions`).
    fn window(policy: &Policy) -> usize {
        match policy.mode {
            Mode::Periodic(p) => {
                let per = policy.check_every.max(MIN_CHECK_INTERVAL);
                (p.as_nanos() / per.as_nanos()) as usize + 1
            }
            Mode::Revision(_) => 0,
        }
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// One check, at time `now` with the tenant at `revision` and compacted up to
    /// `compact_revision`: the revision to compact at, if one is due. The caller reports the
    /// outcome with [`Tracker::done`] (a revision at or below `compact_revision` is never
    /// returned: it counts as done at once, as etcd counts `ErrCompacted` as success).
    pub fn check(&mut self, now: Duration, revision: i64, compact_revision: i64) -> Option<i64> {
        let answer = if self.in_flight {
            None
        } else {
            match self.policy.mode {
                Mode::Periodic(period) => {
                    // etcd decides on the samples taken before this check, then samples.
                    if now.saturating_sub(self.last_success) < self.wait {
                        None
                    } else {
                        self.wait = period.min(MAX_PERIODIC_INTERVAL);
                        self.revs.front().copied()
                    }
                }
                Mode::Revision(keep) => {
                    let rev = revision - keep;
                    (rev > 0 && rev != self.prev).then_some(rev)
                }
            }
        };
        if matches!(self.policy.mode, Mode::Periodic(_)) {
            self.revs.push_back(revision);
            while self.revs.len() > Self::window(&self.policy) {
                self.revs.pop_front();
            }
        }
        match answer {
            Some(rev) if rev <= compact_revision || rev <= 0 => {
                self.record_success(now, rev);
                None
            }
            Some(rev) => {
                self.in_flight = true;
                Some(rev)
            }
            None => None,
        }
    }

    /// The outcome of the compaction last returned by [`Tracker::check`]: on failure the next
    /// check tries again (etcd retries after one check interval).
    pub fn done(&mut self, now: Duration, revision: i64, ok: bool) {
        self.in_flight = false;
        if ok {
            self.record_success(now, revision);
        }
    }

    fn record_success(&mut self, now: Duration, revision: i64) {
        self.last_success = now;
        self.prev = revision;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn flags_parse_as_etcd_reads_them() {
        let p = Policy::parse("periodic", "1", None).unwrap().unwrap();
        assert_eq!(p.mode, Mode::Periodic(secs(3600)), "a bare number is hours");
        assert_eq!(p.check_every, secs(360));
        let p = Policy::parse("periodic", "30m", None).unwrap().unwrap();
        assert_eq!(p.check_every, secs(180));
        let p = Policy::parse("periodic", "24h", None).unwrap().unwrap();
        assert_eq!(p.check_every, secs(360), "capped at 1h / 10");
        let p = Policy::parse("revision", "1000", None).unwrap().unwrap();
        assert_eq!(
            (p.mode, p.check_every),
            (Mode::Revision(1000), REVISION_CHECK_INTERVAL)
        );
        let p = Policy::parse("revision", "10", Some(Duration::from_millis(200)))
            .unwrap()
            .unwrap();
        assert_eq!(p.check_every, Duration::from_millis(200));
        assert_eq!(Policy::parse("periodic", "0", None), Ok(None));
        assert_eq!(Policy::parse("revision", "0", None), Ok(None));
        assert!(Policy::parse("hourly", "1", None).is_err());
        assert!(Policy::parse("revision", "1h", None).is_err());
        assert!(Policy::parse("revision", "-3", None).is_err());
        assert!(Policy::parse("periodic", "soon", None).is_err());
        assert!(Policy::parse("revision", "5", Some(Duration::from_millis(1))).is_err());
    }

    #[test]
    fn periodic_waits_one_period_then_compacts_to_the_revision_of_one_period_ago() {
        // 10 s retention, checked every second: 11 samples.
        let policy = Policy::parse("periodic", "10s", None).unwrap().unwrap();
        let mut t = Tracker::new(policy, Duration::ZERO, 100);
        let mut asked = Vec::new();
        // Revision 100 + 10 per second.
        for s in 1..=25u64 {
            let rev = 100 + 10 * s as i64;
            if let Some(r) = t.check(secs(s), rev, 0) {
                asked.push((s, r));
                t.done(secs(s), r, true);
            }
        }
        // First at 10 s, with the sample of t=0 (rev 100); then every 10 s with the oldest of
        // the 11 samples taken at the checks before (11 s old), exactly as etcd's loop does.
        assert_eq!(asked, vec![(10, 100), (20, 190)]);
    }

    #[test]
    fn periodic_retries_a_failed_compaction_at_the_next_check_and_skips_while_in_flight() {
        let policy = Policy {
            mode: Mode::Periodic(secs(10)),
            check_every: secs(1),
        };
        let mut t = Tracker::new(policy, Duration::ZERO, 5);
        for s in 1..10 {
            assert_eq!(t.check(secs(s), 5 + s as i64, 0), None);
        }
        assert_eq!(t.check(secs(10), 15, 0), Some(5));
        assert_eq!(t.check(secs(11), 16, 0), None, "in flight");
        t.done(secs(11), 5, false);
        assert!(
            t.check(secs(12), 17, 0).is_some(),
            "retried after a failure"
        );
    }

    #[test]
    fn revision_mode_keeps_the_last_n_and_never_repeats_or_goes_below_the_compact_revision() {
        let policy = Policy::parse("revision", "10", Some(secs(1)))
            .unwrap()
            .unwrap();
        let mut t = Tracker::new(policy, Duration::ZERO, 1);
        assert_eq!(t.check(secs(1), 5, 0), None, "5 - 10 <= 0");
        assert_eq!(t.check(secs(2), 25, 0), Some(15));
        t.done(secs(2), 15, true);
        assert_eq!(t.check(secs(3), 25, 15), None, "same revision as before");
        assert_eq!(
            t.check(secs(4), 30, 40),
            None,
            "a client compacted further already"
        );
        assert_eq!(t.check(secs(5), 60, 40), Some(50));
    }
}
