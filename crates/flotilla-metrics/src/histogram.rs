//! A latency histogram of atomics: observing is three relaxed additions, no lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the latency buckets, in seconds (then +Inf): 50 µs to 10 s.
pub const LATENCY_BUCKETS_SECONDS: [f64; 16] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    10.0,
];

/// Counts of observations per bucket, their sum and their number.
#[derive(Debug, Default)]
pub struct LatencyHistogram {
    /// One count per bound of [`LATENCY_BUCKETS_SECONDS`], plus +Inf.
    buckets: [AtomicU64; LATENCY_BUCKETS_SECONDS.len() + 1],
    sum_ns: AtomicU64,
    count: AtomicU64,
}

impl LatencyHistogram {
    pub fn observe(&self, elapsed: Duration) {
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.buckets[bucket_index(elapsed.as_secs_f64())].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Sum of the observed latencies, in nanoseconds.
    pub fn sum_ns(&self) -> u64 {
        self.sum_ns.load(Ordering::Relaxed)
    }

    /// `(upper bound, count in that bucket)` pairs, not cumulative, the last bound `f64::MAX`
    /// (+Inf), as `prometheus_client`'s encoder takes them.
    pub fn buckets(&self) -> Vec<(f64, u64)> {
        let bounds = LATENCY_BUCKETS_SECONDS.iter().copied().chain([f64::MAX]);
        bounds.zip(self.buckets.iter().map(|b| b.load(Ordering::Relaxed))).collect()
    }

    /// Writes the histogram as one sample set of the current metric family.
    pub fn encode(&self, encoder: &mut prometheus_client::encoding::MetricEncoder) -> std::fmt::Result {
        let sum_seconds = self.sum_ns() as f64 / 1e9;
        encoder.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
            sum_seconds,
            self.count(),
            &self.buckets(),
            None,
        )
    }
}

/// The bucket a latency of `seconds` falls in: the first bound at or above it, else +Inf.
fn bucket_index(seconds: f64) -> usize {
    LATENCY_BUCKETS_SECONDS
        .iter()
        .position(|bound| seconds <= *bound)
        .unwrap_or(LATENCY_BUCKETS_SECONDS.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn buckets_take_the_first_bound_at_or_above() {
        assert_eq!(bucket_index(0.0), 0);
        assert_eq!(bucket_index(0.000_05), 0);
        assert_eq!(bucket_index(0.000_051), 1);
        assert_eq!(bucket_index(11.0), LATENCY_BUCKETS_SECONDS.len(), "past the last bound is +Inf");
    }

    proptest! {
        #[test]
        fn every_observation_lands_in_one_bucket(micros in proptest::collection::vec(0u64..20_000_000, 0..50)) {
            let histogram = LatencyHistogram::default();
            for us in &micros {
                histogram.observe(Duration::from_micros(*us));
            }
            let counted: u64 = histogram.buckets().iter().map(|(_, n)| n).sum();
            prop_assert_eq!(counted, micros.len() as u64);
            prop_assert_eq!(histogram.count(), micros.len() as u64);
            prop_assert_eq!(histogram.sum_ns(), micros.iter().sum::<u64>() * 1000);
        }
    }
}
