//! Round-trip times in bounded memory: an HDR histogram of nanoseconds up to
//! 60 s with 3 significant digits from 1 µs on (about 220 KiB, however long
//! the run), and the percentiles reported from it.

use std::time::Duration;

use hdrhistogram::Histogram;

use super::Percentiles;

/// Unit of the histogram, nanoseconds: the lowest value told apart. A
/// coarser unit would cost precision below `1024 * unit` (at 1 µs, 0.5 µs
/// steps at 42 µs are 1 %); with 1 ns every time from 1 µs on is kept to
/// 3 digits.
pub const LOWEST_NS: u64 = 1;
/// Longest time recorded, nanoseconds (60 s); longer ones count as 60 s.
pub const HIGHEST_NS: u64 = 60_000_000_000;
/// Significant decimal digits kept: a percentile is within 0.1 % of the
/// exact one.
pub const SIGNIFICANT_DIGITS: u8 = 3;

/// Round-trip times recorded so far.
#[derive(Clone, Debug)]
pub struct RttHistogram {
    hist: Histogram<u64>,
    /// Exact sum and largest, for the mean and the maximum.
    sum_ns: u128,
    max_ns: u64,
}

impl Default for RttHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl RttHistogram {
    /// An empty histogram.
    ///
    /// # Panics
    ///
    /// Never: the bounds are constants the crate accepts.
    pub fn new() -> Self {
        let hist = Histogram::new_with_bounds(LOWEST_NS, HIGHEST_NS, SIGNIFICANT_DIGITS)
            .expect("constant histogram bounds are valid");
        Self { hist, sum_ns: 0, max_ns: 0 }
    }

    /// Records one round trip.
    pub fn record(&mut self, d: Duration) {
        self.record_ns(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Records one round trip of `ns` nanoseconds.
    pub fn record_ns(&mut self, ns: u64) {
        self.hist.saturating_record(ns);
        self.sum_ns += u128::from(ns);
        self.max_ns = self.max_ns.max(ns);
    }

    /// Round trips recorded.
    pub fn len(&self) -> u64 {
        self.hist.len()
    }

    /// Whether none was recorded.
    pub fn is_empty(&self) -> bool {
        self.hist.is_empty()
    }

    /// Percentiles in microseconds: p50, p90 and p99 within the histogram's
    /// precision, the maximum and the mean exact.
    pub fn percentiles(&self) -> Percentiles {
        if self.is_empty() {
            return Percentiles::default();
        }
        let at = |q: f64| self.hist.median_equivalent(self.hist.value_at_quantile(q)).min(self.max_ns) as f64 / 1e3;
        Percentiles {
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
            max: self.max_ns as f64 / 1e3,
            mean: self.sum_ns as f64 / self.len() as f64 / 1e3,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_match_the_exact_ones_within_the_precision() {
        // A long tail from 20 µs to about 0.5 s, in scrambled order.
        let mut samples: Vec<u64> = (0..100_000u64)
            .map(|i| {
                let x = (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 11) as f64 / (1u64 << 53) as f64;
                (20_000.0 * (1.0 / (1.0 - x * 0.99995)).powf(1.1)) as u64
            })
            .collect();
        let mut h = RttHistogram::new();
        for &s in &samples {
            h.record_ns(s);
        }
        assert_eq!(h.len(), samples.len() as u64);
        let exact = Percentiles::of(&mut samples);
        let got = h.percentiles();
        for (name, e, g) in [("p50", exact.p50, got.p50), ("p90", exact.p90, got.p90), ("p99", exact.p99, got.p99)] {
            assert!((g - e).abs() <= e * 1e-3, "{name}: {g} us, exactly {e} us");
        }
        assert_eq!(got.max, exact.max);
        // Bounded: the counts, whatever was recorded.
        assert!(h.hist.distinct_values() * 8 <= 256 << 10, "{} counts", h.hist.distinct_values());
        assert!((got.mean - exact.mean).abs() <= exact.mean * 1e-9);
    }

    #[test]
    fn few_and_extreme_samples() {
        assert_eq!(RttHistogram::new().percentiles(), Percentiles::default());
        let mut h = RttHistogram::new();
        h.record(Duration::from_micros(250));
        let p = h.percentiles();
        assert!((p.p50 - 250.0).abs() <= 0.25 && (p.p99 - 250.0).abs() <= 0.25, "{p:?}");
        // Beyond the range: counted as 60 s in the percentiles, exact in the maximum.
        h.record(Duration::from_secs(120));
        h.record(Duration::from_nanos(10));
        let p = h.percentiles();
        assert_eq!(p.max, 120e6);
        assert!((p.p99 - 60e6).abs() <= 60e3, "{p:?}");
        assert_eq!(h.len(), 3);
    }
}
