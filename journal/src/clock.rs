//! The journal leader's wall clock: the one place Strata reads the time of day (DESIGN
//! invariant 4: time flows through the journal).

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    // The leader's stamp is wall-clock time by design; everything downstream reads it from
    // the journal instead of a clock.
    #[allow(clippy::disallowed_methods)]
    let now = std::time::SystemTime::now();
    now.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The stamp for the next entry: wall-clock time, never below `floor` (the previous entry's).
pub fn stamp(now_ms: i64, floor: i64) -> i64 {
    now_ms.max(floor)
}

#[cfg(test)]
mod tests {
    #[test]
    fn stamps_never_go_back() {
        assert_eq!(super::stamp(10, 20), 20);
        assert_eq!(super::stamp(30, 20), 30);
    }
}
