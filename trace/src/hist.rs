//! A latency histogram: log-bucketed counts (`hdrhistogram`) plus the exact
//! maximum and sum.
//!
//! Values are nanoseconds. Two significant digits (each bucket within 1% of
//! its values) keep one histogram at 24 KiB for values up to 1 s; it grows
//! automatically (a few KiB per doubling) when a longer latency arrives, up
//! to [`HIGHEST_NS`], above which values are clamped into the top bucket
//! (the exact maximum is still kept beside it).

use hdrhistogram::Histogram;

use crate::clock::ns_to_us;
use crate::schema::LatencyStats;

/// Initial highest trackable value: 1 s.
const INITIAL_HIGHEST_NS: u64 = 1_000_000_000;
/// Largest value the histogram grows to hold: 1 hour.
pub const HIGHEST_NS: u64 = 3_600 * 1_000_000_000;
/// Significant decimal digits kept per value.
const SIGFIG: u8 = 2;

/// Upper bounds of the latency buckets a snapshot carries for Prometheus
/// histograms, in µs: 10 µs to 10 s in 1-2.5-5 steps (`+Inf` is implied).
/// A value within 1% of a bound (the histogram's precision) may be counted
/// on either side of it.
pub const LATENCY_BUCKET_BOUNDS_US: [f64; 19] = [
    10.0,
    25.0,
    50.0,
    100.0,
    250.0,
    500.0,
    1_000.0,
    2_500.0,
    5_000.0,
    10_000.0,
    25_000.0,
    50_000.0,
    100_000.0,
    250_000.0,
    500_000.0,
    1_000_000.0,
    2_500_000.0,
    5_000_000.0,
    10_000_000.0,
];

#[derive(Clone, Debug)]
pub(crate) struct LatencyHist {
    hist: Histogram<u64>,
    max_ns: u64,
    sum_ns: u128,
    /// Zero-length values, counted apart and added to `hist` only when it
    /// is read: phases that take no time (a read served in place has no
    /// dispatch or completion wait) cost an increment, not a record.
    zeros: u64,
}

impl LatencyHist {
    pub fn new() -> LatencyHist {
        let mut hist = Histogram::new_with_bounds(1, INITIAL_HIGHEST_NS, SIGFIG)
            .expect("constant histogram bounds are valid");
        hist.auto(true);
        LatencyHist { hist, max_ns: 0, sum_ns: 0, zeros: 0 }
    }

    #[inline]
    pub fn record(&mut self, ns: u64) {
        if ns == 0 {
            self.zeros += 1;
            return;
        }
        // 0 is below the lowest discernible value (1) and lands in bucket 0.
        // Auto-resize only fails if the counts array would overflow usize.
        if self.hist.record(ns.min(HIGHEST_NS)).is_err() {
            self.hist.saturating_record(ns);
        }
        self.max_ns = self.max_ns.max(ns);
        self.sum_ns += u128::from(ns);
    }

    #[cfg(test)]
    pub fn count(&self) -> u64 {
        self.hist.len() + self.zeros
    }

    /// The histogram with the zeros in it.
    fn with_zeros(&self) -> std::borrow::Cow<'_, Histogram<u64>> {
        if self.zeros == 0 {
            return std::borrow::Cow::Borrowed(&self.hist);
        }
        let mut h = self.hist.clone();
        h.saturating_record_n(0, self.zeros);
        std::borrow::Cow::Owned(h)
    }

    pub fn merge(&mut self, other: &LatencyHist) {
        // Both auto-resize, so adding cannot fail on range; a failure would
        // be a bug in the bounds above.
        self.hist.add(&other.hist).expect("histograms with equal precision add");
        self.max_ns = self.max_ns.max(other.max_ns);
        self.sum_ns += other.sum_ns;
        self.zeros += other.zeros;
    }

    /// Value at quantile `q` (0..=1) in ns: the highest value equivalent to
    /// the bucket, never above the exact maximum.
    #[cfg(test)]
    pub fn quantile_ns(&self, q: f64) -> u64 {
        self.quantile_in(&self.with_zeros(), q)
    }

    fn quantile_in(&self, hist: &Histogram<u64>, q: f64) -> u64 {
        if hist.is_empty() {
            return 0;
        }
        hist.value_at_quantile(q).min(self.max_ns)
    }

    /// Exact sum of the recorded values, in µs.
    pub fn sum_us(&self) -> f64 {
        self.sum_ns as f64 / 1_000.0
    }

    /// Cumulative counts: how many values are at most each bound of
    /// [`LATENCY_BUCKET_BOUNDS_US`] (a value counts by the highest value
    /// equivalent to its histogram bucket).
    pub fn cumulative_counts(&self) -> Vec<u64> {
        // Counts per bucket (values past the last bound fall in none), then
        // their running sum.
        let mut out = vec![0; LATENCY_BUCKET_BOUNDS_US.len()];
        out[0] = self.zeros;
        for v in self.hist.iter_recorded() {
            let us = v.value_iterated_to() as f64 / 1_000.0;
            let first = LATENCY_BUCKET_BOUNDS_US.partition_point(|&bound| bound < us);
            if let Some(count) = out.get_mut(first) {
                *count += v.count_at_value();
            }
        }
        let mut sum = 0;
        for count in &mut out {
            sum += *count;
            *count = sum;
        }
        out
    }

    pub fn stats(&self) -> LatencyStats {
        let hist = self.with_zeros();
        let count = hist.len();
        let mean_us = if count == 0 { 0.0 } else { self.sum_ns as f64 / count as f64 / 1_000.0 };
        LatencyStats {
            count,
            latency_us_mean: mean_us,
            latency_us_p50: ns_to_us(self.quantile_in(&hist, 0.50)),
            latency_us_p99: ns_to_us(self.quantile_in(&hist, 0.99)),
            latency_us_p999: ns_to_us(self.quantile_in(&hist, 0.999)),
            latency_us_max: ns_to_us(self.max_ns),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn within(actual: f64, expected: f64, rel: f64) -> bool {
        (actual - expected).abs() <= expected * rel
    }

    #[test]
    fn percentiles_of_a_uniform_range() {
        // 1..=100_000 us, one of each.
        let mut h = LatencyHist::new();
        for us in 1..=100_000u64 {
            h.record(us * 1_000);
        }
        let s = h.stats();
        assert_eq!(s.count, 100_000);
        assert!(within(s.latency_us_p50, 50_000.0, 0.01), "{s:?}");
        assert!(within(s.latency_us_p99, 99_000.0, 0.01), "{s:?}");
        assert!(within(s.latency_us_p999, 99_900.0, 0.01), "{s:?}");
        assert_eq!(s.latency_us_max, 100_000.0);
        assert!(within(s.latency_us_mean, 50_000.5, 1e-9), "{s:?}");
    }

    #[test]
    fn a_rare_outlier_shows_in_max_and_p999_only() {
        let mut h = LatencyHist::new();
        for _ in 0..9_999 {
            h.record(100_000); // 100 us
        }
        h.record(7_926_004_000); // 7.9 s: grows the histogram past 1 s
        let s = h.stats();
        assert!(within(s.latency_us_p50, 100.0, 0.01));
        assert!(within(s.latency_us_p99, 100.0, 0.01));
        assert!(within(s.latency_us_p999, 100.0, 0.01), "{s:?}");
        assert_eq!(s.latency_us_max, 7_926_004.0);
        assert!(within(h.quantile_ns(1.0) as f64, 7_926_004_000.0, 0.01));
    }

    #[test]
    fn values_past_the_highest_are_clamped_but_max_is_exact() {
        let mut h = LatencyHist::new();
        h.record(u64::MAX);
        h.record(0);
        assert_eq!(h.count(), 2);
        assert_eq!(h.stats().latency_us_max, ns_to_us(u64::MAX));
        assert!(h.quantile_ns(1.0) >= HIGHEST_NS);
    }

    #[test]
    fn zeros_count_like_recorded_values() {
        let (mut h, mut reference) =
            (LatencyHist::new(), Histogram::<u64>::new_with_bounds(1, 1_000_000_000, SIGFIG).unwrap());
        for i in 0..1_000u64 {
            let v = if i % 4 == 0 { 0 } else { i * 1_000 };
            h.record(v);
            reference.record(v).unwrap();
        }
        assert_eq!(h.count(), 1_000);
        for q in [0.1, 0.25, 0.26, 0.5, 0.99, 1.0] {
            assert_eq!(h.quantile_ns(q), reference.value_at_quantile(q).min(999_000), "q {q}");
        }
        let mut only_zeros = LatencyHist::new();
        only_zeros.record(0);
        let s = only_zeros.stats();
        assert_eq!((s.count, s.latency_us_p50, s.latency_us_max), (1, 0.0, 0.0));
        let mut merged = LatencyHist::new();
        merged.merge(&h);
        merged.merge(&only_zeros);
        assert_eq!(merged.count(), 1_001);
        assert_eq!(merged.quantile_ns(0.25), h.quantile_ns(0.25));
    }

    #[test]
    fn merge_equals_recording_into_one() {
        let (mut a, mut b, mut both) = (LatencyHist::new(), LatencyHist::new(), LatencyHist::new());
        for i in 0..5_000u64 {
            let v = (i * 7_919) % 2_000_000_000;
            if i % 3 == 0 { &mut a } else { &mut b }.record(v);
            both.record(v);
        }
        a.merge(&b);
        assert_eq!(a.stats(), both.stats());
    }

    #[test]
    fn memory_stays_within_the_documented_bound() {
        let mut h = LatencyHist::new();
        let initial_bytes = h.hist.distinct_values() * 8;
        h.record(u64::MAX);
        let grown_bytes = h.hist.distinct_values() * 8;
        eprintln!("histogram counts: {initial_bytes} bytes initially, {grown_bytes} at the cap");
        assert!(initial_bytes <= 24 << 10, "{initial_bytes}");
        assert!(grown_bytes <= 40 << 10, "{grown_bytes}");
    }

    #[test]
    fn cumulative_counts_match_a_count_by_hand() {
        let mut h = LatencyHist::new();
        let values_ns: Vec<u64> = (0..2_000u64).map(|i| (i * i * 7_919) % 3_000_000_000).collect();
        for &v in &values_ns {
            h.record(v);
        }
        h.record(0);
        let counts = h.cumulative_counts();
        assert_eq!(counts.len(), LATENCY_BUCKET_BOUNDS_US.len());
        assert!(counts.windows(2).all(|w| w[0] <= w[1]), "cumulative: {counts:?}");
        for (i, bound_us) in LATENCY_BUCKET_BOUNDS_US.iter().enumerate() {
            // Values within 1% of the bound may land on either side.
            let surely_below =
                values_ns.iter().filter(|&&v| (v as f64) < bound_us * 990.0).count() as u64 + 1;
            let maybe_below =
                values_ns.iter().filter(|&&v| (v as f64) <= bound_us * 1_010.0).count() as u64 + 1;
            assert!((surely_below..=maybe_below).contains(&counts[i]), "bound {bound_us}: {}", counts[i]);
        }
        assert_eq!(*counts.last().unwrap(), h.count(), "every value is under 10 s");
        let sum_us: f64 = values_ns.iter().map(|&v| v as f64 / 1_000.0).sum();
        assert!((h.sum_us() - sum_us).abs() < 1e-3 * sum_us);
    }

    #[test]
    fn empty_histogram_reports_zeros() {
        let s = LatencyHist::new().stats();
        assert_eq!(s, LatencyStats::default());
    }
}
