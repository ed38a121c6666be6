//! The journal leader's clock: the one place Strata reads the time of day (DESIGN invariant 4:
//! time flows through the journal).
//!
//! Entries are stamped in wall-clock milliseconds, but a stamp advances with the monotonic
//! clock from the previous one this process made, drawn towards the wall clock by at most
//! [`SLEW_PER_MILLE`] of the time elapsed (`StampClock`). A step of the leader's wall clock
//! (NTP correcting it, an operator setting it, a VM resumed) is absorbed slowly: etcd's leases
//! run on the monotonic clock for the same reason. Stamped with the wall clock itself, a step
//! back made the stamps stand still (they never go back) for as long as the step, and no lease
//! of the shard expired meanwhile; a step forward was only bounded by the replicas, which count
//! at most `lease_clock_max_step_ms` of any one gap between entries (memstore).
//!
//! A node that becomes leader goes on from the last stamp it appended from another leader
//! (`StampClock::saw`) as from a stamp of its own: a node that rebooted with its clock an hour
//! off and then took over does not move journal time by that hour (until session 24 its first
//! stamp was its wall clock). A stamp this process only found on disk is of unknown age (the
//! whole cluster may have been down for a day) and is not gone on from: the first stamp is then
//! a wall clock, the one clue to how long the outage was. Since session 28 not its own alone:
//! it asks the shard's other voters for theirs (the `Clock` call) and takes the earliest of
//! those that answer and its own ([`earliest`]), never below the log's last stamp. A node whose
//! clock came up an hour ahead after a reboot no longer moves journal time by the hour when it
//! is the first elected (auth tokens, checked against journal time, would all expire at once);
//! a clock behind costs at most the time the shard had no leader, which journal time then does
//! not count (leases are extended after an election anyway, as etcd extends them).

use std::time::Instant;

/// How far a stamp may move towards the wall clock, per thousand of the time elapsed since the
/// previous stamp: a lease of 15 s expires at worst 0.15 s early (or late) while a step is
/// absorbed, and a step of an hour takes about 100 hours to absorb.
pub const SLEW_PER_MILLE: i64 = 10;

/// Milliseconds since the Unix epoch, plus the offset of the `clock-offset` failpoint when it
/// is armed (tests that step the leader's clock).
pub fn now_ms() -> i64 {
    // The leader's stamp is wall-clock time by design; everything downstream reads it from
    // the journal instead of a clock.
    #[allow(clippy::disallowed_methods)]
    let now = std::time::SystemTime::now();
    let wall = now
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    wall.saturating_add(crate::failpoint::clock_offset_ms())
}

/// The stamps one proposer (one shard of one node) makes, in order.
#[derive(Debug, Default)]
pub struct StampClock {
    /// The previous stamp and when it was made.
    last: Option<(i64, Instant)>,
}

/// The wall clock a first stamp with nothing to go on from is taken from: the earliest of this
/// node's (`own`) and the other voters' that answered (`peers`). Not the median: with three
/// nodes, one down, two clocks are all there is, and only the earlier of them cannot move
/// journal time ahead of real time when the other is wrong.
pub fn earliest(own: i64, peers: &[i64]) -> i64 {
    peers.iter().copied().fold(own, i64::min)
}

impl StampClock {
    /// Whether this clock has nothing to go on from: no stamp of its own and none seen appended.
    /// Its next stamp is then a wall clock (see [`earliest`]).
    pub fn is_fresh(&self) -> bool {
        self.last.is_none()
    }

    /// The log's last entry, stamped `stamp` (by another leader, or by this node), was appended
    /// by this process at `at`: the next stamp goes on from it, as from a stamp of its own, if
    /// it is later than this node's own last one.
    pub fn saw(&mut self, stamp: i64, at: Instant) {
        if self.last.is_none_or(|(prev, _)| stamp > prev) {
            self.last = Some((stamp, at));
        }
    }

    /// The stamp for the next entry at monotonic instant `now`, with the wall clock reading
    /// `wall_ms`: the previous stamp plus the time elapsed, moved towards `wall_ms` by at most
    /// [`SLEW_PER_MILLE`] of it (the first stamp is `wall_ms`); never below `floor` (the log's
    /// last stamp, perhaps another leader's) nor the previous stamp.
    pub fn stamp(&mut self, wall_ms: i64, now: Instant, floor: i64) -> i64 {
        let t = match self.last {
            None => wall_ms,
            Some((prev, at)) => {
                let elapsed = i64::try_from(now.saturating_duration_since(at).as_millis())
                    .unwrap_or(i64::MAX);
                let steady = prev.saturating_add(elapsed);
                let slew = elapsed.saturating_mul(SLEW_PER_MILLE) / 1000;
                wall_ms
                    .clamp(steady.saturating_sub(slew), steady.saturating_add(slew))
                    .max(prev)
            }
        };
        let t = t.max(floor);
        self.last = Some((t, now));
        t
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn the_first_stamp_is_the_wall_clock_and_never_below_the_floor() {
        let t0 = Instant::now();
        assert_eq!(StampClock::default().stamp(1_000, t0, 0), 1_000);
        assert_eq!(StampClock::default().stamp(1_000, t0, 5_000), 5_000);
    }

    /// An hour's step forward moves the stamps by the time elapsed and 1 % more, not by an
    /// hour; a step back does not stop them.
    #[test]
    fn a_step_of_the_wall_clock_is_absorbed_slowly() {
        let t0 = Instant::now();
        let mut c = StampClock::default();
        assert_eq!(c.stamp(1_000_000, t0, 0), 1_000_000);
        let hour = 3_600_000;
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(c.stamp(1_001_000 + hour, t1, 0), 1_001_010);
        let t2 = t1 + Duration::from_secs(1);
        assert_eq!(c.stamp(1_002_000 + hour, t2, 0), 1_002_020);

        let mut c = StampClock::default();
        c.stamp(1_000_000, t0, 0);
        assert_eq!(c.stamp(1_001_000 - hour, t1, 0), 1_000_990, "time goes on");
        // In step with the wall clock, the stamps follow it exactly.
        let mut c = StampClock::default();
        c.stamp(1_000_000, t0, 0);
        assert_eq!(c.stamp(1_001_000, t1, 0), 1_001_000);
        // Another leader's later stamp is a floor.
        assert_eq!(c.stamp(1_002_000, t2, 9_000_000), 9_000_000);
        assert_eq!(
            c.stamp(1_003_000, t2 + Duration::from_secs(1), 0),
            9_000_990,
            "and the stamps go on from it, drawn towards this wall clock at 1 %"
        );
    }

    /// A node that appended another leader's stamps, elected with its clock an hour ahead,
    /// goes on from them; with none appended (only found on disk at start: the whole cluster
    /// down for who knows how long) it starts from its wall clock.
    #[test]
    fn a_new_leader_goes_on_from_the_stamps_it_appended() {
        let hour = 3_600_000;
        let t0 = Instant::now();
        let mut c = StampClock::default();
        c.saw(5_001_000, t0 + Duration::from_secs(1));
        let first = c.stamp(5_003_000 + hour, t0 + Duration::from_secs(3), 5_001_000);
        assert_eq!(first, 5_003_020, "2 s on, drawn 1 % towards the wall clock");

        assert_eq!(
            StampClock::default().stamp(5_000_000 + hour, t0, 5_000_000),
            5_000_000 + hour,
            "only a floor found on disk: the wall clock"
        );

        // What it saw never takes it below its own later stamps, nor back.
        let mut c = StampClock::default();
        assert_eq!(c.stamp(9_000_000, t0, 0), 9_000_000);
        c.saw(8_500_000, t0 + Duration::from_secs(2));
        assert_eq!(
            c.stamp(9_003_000, t0 + Duration::from_secs(3), 8_500_000),
            9_003_000
        );
    }

    /// A fresh clock (nothing stamped, nothing seen) takes the earliest clock of the voters
    /// that answered; one that saw a stamp, or made one, is not fresh.
    #[test]
    fn a_fresh_leader_starts_from_the_earliest_clock() {
        let hour = 3_600_000;
        let t0 = Instant::now();
        assert_eq!(
            earliest(5_000_000 + hour, &[5_000_100, 5_000_000 + hour]),
            5_000_100
        );
        assert_eq!(earliest(5_000_000, &[5_000_000 + hour]), 5_000_000);
        assert_eq!(earliest(5_000_000, &[]), 5_000_000, "no voter answered");
        let mut c = StampClock::default();
        assert!(c.is_fresh());
        let wall = earliest(5_000_000 + hour, &[5_000_100]);
        assert_eq!(c.stamp(wall, t0, 4_000_000), 5_000_100);
        assert!(!c.is_fresh());
        let mut c = StampClock::default();
        c.saw(4_000_000, t0);
        assert!(!c.is_fresh(), "it goes on from what it saw");
    }

    proptest! {
        /// Whatever the wall clock does, stamps never go back, never fall below the floor, and
        /// move at most 1 % faster or slower than the monotonic clock (floors aside).
        #[test]
        fn stamps_never_go_back_and_run_near_real_time(
            start in 0i64..1_000_000_000_000,
            steps in prop::collection::vec((0u64..10_000, -10_000_000i64..10_000_000), 1..50),
        ) {
            let t0 = Instant::now();
            let mut c = StampClock::default();
            let mut prev = c.stamp(start, t0, 0);
            let mut at = t0;
            let mut wall = start;
            for (gap_ms, jump) in steps {
                at += Duration::from_millis(gap_ms);
                wall = wall.saturating_add(i64::try_from(gap_ms).unwrap()).saturating_add(jump);
                let t = c.stamp(wall, at, 0);
                let gap = i64::try_from(gap_ms).unwrap();
                prop_assert!(t >= prev);
                prop_assert!(t - prev <= gap + gap * SLEW_PER_MILLE / 1000);
                prop_assert!(t - prev >= gap - gap * SLEW_PER_MILLE / 1000 - 1);
                prev = t;
            }
        }
    }
}
