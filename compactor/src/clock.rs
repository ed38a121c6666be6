//! The compactor's wall clock: only for informational stamps in manifests and object names
//! (never for anything a replica applies; time of the state comes from the journal).

/// Milliseconds since the Unix epoch.
pub fn wall_ms() -> i64 {
    // Allowed: these stamps are labels for operators (backup list) and name disambiguators;
    // no replica's state depends on them (DESIGN invariant 4 concerns apply-time).
    #[allow(clippy::disallowed_methods)]
    let now = std::time::SystemTime::now();
    now.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
