//! Latency samples and their summary: percentiles (nearest rank), the etcd-style histogram,
//! error tallies, and the text and JSON renderings `strata bench` prints.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

/// Percentiles every report prints (etcd's benchmark prints the same list).
pub const PERCENTILES: [f64; 8] = [10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.9];
/// Bins of the response-time histogram, spread evenly from the fastest to the slowest sample.
pub const HISTOGRAM_BINS: usize = 10;
/// Width in characters of the longest histogram bar.
const BAR_WIDTH: u64 = 40;
/// Slack under which a fractional rank counts as whole (guards against float rounding).
const RANK_EPSILON: f64 = 1e-9;
/// Distinct error messages kept per report; the rest are counted under one line.
pub const MAX_ERROR_KINDS: usize = 32;

/// Latencies in nanoseconds, plus errors by message, for one phase of a run.
#[derive(Debug, Default, Clone)]
pub struct Samples {
    latencies_ns: Vec<u64>,
    errors: BTreeMap<String, u64>,
    sorted: bool,
}

impl Samples {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn record(&mut self, latency: Duration) {
        self.latencies_ns
            .push(u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX));
        self.sorted = false;
    }

    pub fn record_error(&mut self, message: impl Into<String>) {
        let message = message.into();
        if self.errors.len() >= MAX_ERROR_KINDS && !self.errors.contains_key(&message) {
            *self.errors.entry("(other errors)".to_string()).or_default() += 1;
        } else {
            *self.errors.entry(message).or_default() += 1;
        }
    }

    pub fn merge(&mut self, other: Samples) {
        self.latencies_ns.extend(other.latencies_ns);
        for (message, n) in other.errors {
            *self.errors.entry(message).or_default() += n;
        }
        self.sorted = false;
    }

    #[cfg(test)]
    pub fn ok(&self) -> u64 {
        self.latencies_ns.len() as u64
    }

    pub fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }

    pub fn errors(&self) -> &BTreeMap<String, u64> {
        &self.errors
    }

    fn sort(&mut self) {
        if !self.sorted {
            self.latencies_ns.sort_unstable();
            self.sorted = true;
        }
    }

    /// Summary statistics of the samples; `elapsed` is the wall time of the phase.
    pub fn summary(&mut self, elapsed: Duration) -> Summary {
        self.sort();
        let lat = &self.latencies_ns;
        let n = lat.len();
        let secs = elapsed.as_secs_f64();
        let (mean, stddev) = mean_stddev(lat);
        Summary {
            ok: n as u64,
            errors: self.error_count(),
            elapsed,
            rps: if secs > 0.0 { n as f64 / secs } else { 0.0 },
            fastest_ns: lat.first().copied().unwrap_or(0),
            slowest_ns: lat.last().copied().unwrap_or(0),
            mean_ns: mean,
            stddev_ns: stddev,
            percentiles_ns: PERCENTILES
                .iter()
                .map(|&p| (p, percentile(lat, p).unwrap_or(0)))
                .collect(),
            histogram: histogram(lat, HISTOGRAM_BINS),
        }
    }
}

/// The nearest-rank percentile of ascending `sorted` samples: the smallest sample such that at
/// least `p` percent of all samples are less than or equal to it. `None` when empty.
pub fn percentile(sorted: &[u64], p: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let n = sorted.len();
    let p = p.clamp(0.0, 100.0);
    // rank in 1..=n: ceil(p * n / 100), with a hair of slack so that binary rounding of p
    // (99.9 is not exact) never pushes an exact rank up by one
    let rank = ((p * n as f64) / 100.0 - RANK_EPSILON).ceil() as usize;
    let index = rank.clamp(1, n) - 1;
    Some(sorted[index])
}

fn mean_stddev(samples: &[u64]) -> (f64, f64) {
    if samples.is_empty() {
        return (0.0, 0.0);
    }
    let n = samples.len() as f64;
    let mean = samples.iter().map(|&x| x as f64).sum::<f64>() / n;
    let var = samples
        .iter()
        .map(|&x| {
            let d = x as f64 - mean;
            d * d
        })
        .sum::<f64>()
        / n;
    (mean, var.sqrt())
}

/// `bins` buckets of equal width from the fastest to the slowest ascending sample, each as
/// (upper bound in ns, count). Every sample falls in exactly one bucket.
pub fn histogram(sorted: &[u64], bins: usize) -> Vec<(u64, u64)> {
    let (Some(&lo), Some(&hi)) = (sorted.first(), sorted.last()) else {
        return Vec::new();
    };
    let bins = bins.max(1);
    let width = (hi - lo) as f64 / bins as f64;
    let mut out: Vec<(u64, u64)> = (1..=bins)
        .map(|b| {
            let upper = if b == bins {
                hi
            } else {
                lo + (width * b as f64) as u64
            };
            (upper, 0)
        })
        .collect();
    let mut bin = 0;
    for &x in sorted {
        while bin + 1 < out.len() && x > out[bin].0 {
            bin += 1;
        }
        out[bin].1 += 1;
    }
    out
}

/// What a phase measured, ready to print.
#[derive(Debug, Clone)]
pub struct Summary {
    pub ok: u64,
    pub errors: u64,
    pub elapsed: Duration,
    pub rps: f64,
    pub fastest_ns: u64,
    pub slowest_ns: u64,
    pub mean_ns: f64,
    pub stddev_ns: f64,
    pub percentiles_ns: Vec<(f64, u64)>,
    pub histogram: Vec<(u64, u64)>,
}

fn ms(ns: f64) -> f64 {
    ns / 1e6
}

impl Summary {
    #[cfg(test)]
    pub fn percentile_ns(&self, p: f64) -> u64 {
        self.percentiles_ns
            .iter()
            .find(|(q, _)| (*q - p).abs() < f64::EPSILON)
            .map_or(0, |(_, v)| *v)
    }

    /// etcd-benchmark-like text: summary, histogram, latency distribution.
    pub fn render_text(&self, title: &str, errors: &BTreeMap<String, u64>) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "\n{title}:");
        let _ = writeln!(s, "Summary:");
        let _ = writeln!(s, "  Total:\t{:.4} secs.", self.elapsed.as_secs_f64());
        let _ = writeln!(s, "  Slowest:\t{:.4} ms.", ms(self.slowest_ns as f64));
        let _ = writeln!(s, "  Fastest:\t{:.4} ms.", ms(self.fastest_ns as f64));
        let _ = writeln!(s, "  Average:\t{:.4} ms.", ms(self.mean_ns));
        let _ = writeln!(s, "  Stddev:\t{:.4} ms.", ms(self.stddev_ns));
        let _ = writeln!(s, "  Requests/sec:\t{:.2}", self.rps);
        let _ = writeln!(s, "  Succeeded:\t{}", self.ok);
        let _ = writeln!(s, "  Errors:\t{}", self.errors);
        if !self.histogram.is_empty() {
            let _ = writeln!(s, "\nResponse time histogram (ms):");
            let max = self.histogram.iter().map(|b| b.1).max().unwrap_or(1).max(1);
            for (upper, count) in &self.histogram {
                let bar = "∎".repeat((count * BAR_WIDTH / max) as usize);
                let _ = writeln!(s, "  {:>10.4} [{count}]\t|{bar}", ms(*upper as f64));
            }
            let _ = writeln!(s, "\nLatency distribution:");
            for (p, v) in &self.percentiles_ns {
                let _ = writeln!(s, "  {p}% in {:.4} ms.", ms(*v as f64));
            }
        }
        if !errors.is_empty() {
            let _ = writeln!(s, "\nError distribution:");
            for (message, n) in errors {
                let _ = writeln!(s, "  [{n}]\t{message}");
            }
        }
        s
    }

    /// Machine-readable form (milliseconds), used by scripts/bench-vs-etcd.sh.
    pub fn to_json(&self) -> serde_json::Value {
        let mut latency = serde_json::Map::new();
        latency.insert("min".into(), ms(self.fastest_ns as f64).into());
        latency.insert("avg".into(), ms(self.mean_ns).into());
        latency.insert("stddev".into(), ms(self.stddev_ns).into());
        latency.insert("max".into(), ms(self.slowest_ns as f64).into());
        for (p, v) in &self.percentiles_ns {
            latency.insert(format!("p{p}"), ms(*v as f64).into());
        }
        serde_json::json!({
            "ok": self.ok,
            "errors": self.errors,
            "elapsed_s": self.elapsed.as_secs_f64(),
            "rps": self.rps,
            "latency_ms": latency,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), Some(50));
        assert_eq!(percentile(&v, 90.0), Some(90));
        assert_eq!(percentile(&v, 99.0), Some(99));
        assert_eq!(percentile(&v, 99.9), Some(100));
        assert_eq!(percentile(&v, 100.0), Some(100));
        assert_eq!(percentile(&v, 0.0), Some(1));
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&[7], 99.9), Some(7));
        // 10 samples: p99.9 is the maximum, p10 the first, p15 the second
        let v: Vec<u64> = (10..20).collect();
        assert_eq!(percentile(&v, 10.0), Some(10));
        assert_eq!(percentile(&v, 15.0), Some(11));
        assert_eq!(percentile(&v, 99.9), Some(19));
    }

    #[test]
    fn histogram_counts_every_sample_once() {
        let v: Vec<u64> = vec![0, 1, 1, 2, 5, 9, 10, 10, 10];
        let h = histogram(&v, 10);
        assert_eq!(h.len(), 10);
        assert_eq!(h.iter().map(|b| b.1).sum::<u64>(), v.len() as u64);
        assert_eq!(h.last().map(|b| b.0), Some(10));
        assert_eq!(h[0], (1, 3)); // 0, 1, 1
        assert_eq!(h[9].1, 3); // the three 10s
        // all equal: one value, every bin's upper bound equals it, all samples in the first
        let h = histogram(&[5, 5, 5], 4);
        assert_eq!(h.iter().map(|b| b.1).sum::<u64>(), 3);
        assert_eq!(h[0], (5, 3));
        assert!(histogram(&[], 10).is_empty());
    }

    #[test]
    fn summary_and_merge() {
        let mut a = Samples::new();
        for ms in [1u64, 2, 3] {
            a.record(Duration::from_millis(ms));
        }
        a.record_error("boom");
        let mut b = Samples::new();
        b.record(Duration::from_millis(4));
        b.record_error("boom");
        b.record_error("bang");
        a.merge(b);
        let s = a.summary(Duration::from_secs(2));
        assert_eq!(s.ok, 4);
        assert_eq!(s.errors, 3);
        assert!((s.rps - 2.0).abs() < 1e-9);
        assert_eq!(s.fastest_ns, 1_000_000);
        assert_eq!(s.slowest_ns, 4_000_000);
        assert!((s.mean_ns - 2_500_000.0).abs() < 1e-6);
        assert_eq!(s.percentile_ns(50.0), 2_000_000);
        assert_eq!(s.percentile_ns(99.0), 4_000_000);
        assert_eq!(a.errors().get("boom"), Some(&2));
        let text = s.render_text("t", a.errors());
        assert!(text.contains("Requests/sec:\t2.00"), "{text}");
        assert!(text.contains("99.9% in 4.0000 ms."), "{text}");
        let json = s.to_json();
        assert_eq!(json["ok"], 4);
        assert_eq!(json["latency_ms"]["p50"], 2.0);
    }

    #[test]
    fn error_kinds_are_bounded() {
        let mut s = Samples::new();
        for i in 0..(MAX_ERROR_KINDS + 10) {
            s.record_error(format!("e{i}"));
        }
        assert_eq!(s.error_count(), (MAX_ERROR_KINDS + 10) as u64);
        assert!(s.errors().len() <= MAX_ERROR_KINDS + 1);
    }
}
