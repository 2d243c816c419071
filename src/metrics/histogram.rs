//! A Prometheus histogram as a row of atomics: one observation is three relaxed adds.
//!
//! Buckets are stored per interval (not cumulative) so an observation touches
//! one bucket; the exposition sums them. The sum is kept in microseconds as
//! an integer, so no compare-and-swap loop on a float is needed.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds in seconds: 1 ms to 30 s, the range between a cached answer
/// and an upstream timeout.
pub const BOUNDS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// The same bounds in microseconds, for the comparison on the hot path.
const BOUNDS_US: [u64; 14] = [
    1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000,
    5_000_000, 10_000_000, 30_000_000,
];

#[derive(Debug, Default)]
pub struct Histogram {
    /// `buckets[i]` counts observations in `(BOUNDS[i-1], BOUNDS[i]]`; the
    /// last one those above every bound (`+Inf`).
    buckets: [AtomicU64; BOUNDS.len() + 1],
    count: AtomicU64,
    sum_us: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let i = BOUNDS_US.partition_point(|&b| b < us);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Sum of observations in seconds.
    pub fn sum(&self) -> f64 {
        self.sum_us.load(Ordering::Relaxed) as f64 / 1e6
    }

    /// Observations per bucket (not cumulative), `+Inf` last.
    fn bucket_counts(&self) -> [u64; BOUNDS.len() + 1] {
        std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed))
    }

    /// Appends the `_bucket`, `_sum` and `_count` lines; `labels` is `k="v",…` or empty.
    pub fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        // Read the buckets first: `_count` is then never below `+Inf`.
        for (i, bound) in BOUNDS.iter().enumerate() {
            cumulative += self.buckets[i].load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {cumulative}"
            );
        }
        cumulative += self.buckets[BOUNDS.len()].load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {cumulative}"
        );
        super::text::sample(out, &format!("{name}_sum"), labels, self.sum());
        let count = cumulative.max(self.count());
        super::text::sample(out, &format!("{name}_count"), labels, count);
    }
}

/// The `q` quantile (0..=1) of the observations of `histograms` together, in
/// seconds, interpolated linearly inside its bucket as Prometheus'
/// `histogram_quantile` does (above the last bound: that bound). `None`
/// without observations.
pub fn quantile(histograms: &[&Histogram], q: f64) -> Option<f64> {
    let mut buckets = [0u64; BOUNDS.len() + 1];
    for h in histograms {
        for (sum, n) in buckets.iter_mut().zip(h.bucket_counts()) {
            *sum += n;
        }
    }
    let total: u64 = buckets.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = q.clamp(0.0, 1.0) * total as f64;
    let mut below = 0u64;
    for (i, &n) in buckets.iter().enumerate() {
        if n > 0 && (below + n) as f64 >= rank {
            let Some(&upper) = BOUNDS.get(i) else { break };
            let lower = if i == 0 { 0.0 } else { BOUNDS[i - 1] };
            let into = ((rank - below as f64) / n as f64).clamp(0.0, 1.0);
            return Some(lower + (upper - lower) * into);
        }
        below += n;
    }
    Some(BOUNDS[BOUNDS.len() - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_observation_lands_in_the_first_bucket_whose_bound_it_does_not_exceed() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(1_000)); // exactly 1 ms: le="0.001"
        h.observe(Duration::from_millis(3)); // le="0.005"
        h.observe(Duration::from_secs(60)); // +Inf only
        let mut out = String::new();
        h.render(&mut out, "t", "route=\"r\"");
        assert!(
            out.contains("t_bucket{route=\"r\",le=\"0.001\"} 1\n"),
            "{out}"
        );
        assert!(
            out.contains("t_bucket{route=\"r\",le=\"0.0025\"} 1\n"),
            "{out}"
        );
        assert!(
            out.contains("t_bucket{route=\"r\",le=\"0.005\"} 2\n"),
            "{out}"
        );
        assert!(out.contains("t_bucket{route=\"r\",le=\"30\"} 2\n"), "{out}");
        assert!(
            out.contains("t_bucket{route=\"r\",le=\"+Inf\"} 3\n"),
            "{out}"
        );
        assert!(out.contains("t_count{route=\"r\"} 3\n"), "{out}");
        assert!(out.contains("t_sum{route=\"r\"} 60.004\n"), "{out}");
    }

    #[test]
    fn quantiles_interpolate_inside_the_bucket_they_fall_in() {
        let fast = Histogram::default();
        let slow = Histogram::default();
        for _ in 0..98 {
            fast.observe(Duration::from_micros(1_500)); // (1 ms, 2.5 ms]
        }
        for _ in 0..2 {
            slow.observe(Duration::from_secs(60)); // +Inf
        }
        let both = [&fast, &slow];
        let p50 = quantile(&both, 0.5).unwrap();
        assert!((p50 - (0.001 + 0.0015 * 50.0 / 98.0)).abs() < 1e-9, "{p50}");
        assert_eq!(quantile(&both, 0.99), Some(30.0), "above every bound");
        assert_eq!(quantile(&[&Histogram::default()], 0.5), None);
    }
}
