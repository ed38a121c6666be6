//! Quotas a frontend enforces on its own, per tenant (docs/design/tenants.md, T5): the request
//! rate. Until the catalogue carries each tenant's `TenantQuotas`, one flag sets it for every
//! tenant the frontend serves (`--tenant-request-rate`, `--tenant-request-burst`).

use std::sync::Mutex;
use std::time::Instant;

/// A token bucket: `rate` requests a second on average, up to `burst` at once.
#[derive(Debug)]
pub struct RateLimit {
    rate: f64,
    burst: f64,
    /// Tokens left, and when they were counted.
    bucket: Mutex<(f64, Instant)>,
}

impl RateLimit {
    /// `rate` a second, `burst` at once (`rate` if 0); `None` for no limit (`rate` 0).
    pub fn new(rate: u32, burst: u32) -> Option<Self> {
        (rate > 0).then(|| {
            let burst = f64::from(if burst == 0 { rate } else { burst });
            Self {
                rate: f64::from(rate),
                burst,
                bucket: Mutex::new((burst, Instant::now())),
            }
        })
    }

    /// Takes one token if there is one.
    pub fn try_acquire(&self) -> bool {
        self.try_acquire_at(Instant::now())
    }

    fn try_acquire_at(&self, now: Instant) -> bool {
        let mut bucket = self.bucket.lock().unwrap_or_else(|e| e.into_inner());
        let (tokens, counted) = *bucket;
        // Time never runs backwards here; a clock read out of order counts as no time.
        let refilled = now.saturating_duration_since(counted).as_secs_f64() * self.rate;
        let tokens = (tokens + refilled).min(self.burst);
        let admitted = tokens >= 1.0;
        *bucket = (
            if admitted { tokens - 1.0 } else { tokens },
            now.max(counted),
        );
        admitted
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_burst_then_the_rate() {
        let limit = RateLimit::new(10, 5).unwrap();
        let start = Instant::now();
        let admitted = (0..20).filter(|_| limit.try_acquire_at(start)).count();
        assert_eq!(admitted, 5, "the burst, at one instant");
        // 10 a second: one more every 100 ms, never more than the burst saved up.
        assert!(!limit.try_acquire_at(start + Duration::from_millis(50)));
        assert!(limit.try_acquire_at(start + Duration::from_millis(110)));
        assert!(!limit.try_acquire_at(start + Duration::from_millis(120)));
        let later = start + Duration::from_secs(60);
        let admitted = (0..20).filter(|_| limit.try_acquire_at(later)).count();
        assert_eq!(admitted, 5, "an idle minute saves up the burst, no more");
        // A clock read out of order neither refills nor breaks the bucket.
        assert!(!limit.try_acquire_at(start));
    }

    #[test]
    fn zero_is_no_limit_and_burst_defaults_to_the_rate() {
        assert!(RateLimit::new(0, 100).is_none());
        let limit = RateLimit::new(3, 0).unwrap();
        let now = Instant::now();
        assert_eq!((0..10).filter(|_| limit.try_acquire_at(now)).count(), 3);
    }
}
