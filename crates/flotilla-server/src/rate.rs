//! A token bucket over bytes, for the resync copy's bounded rate (`[server]
//! resync_bytes_per_s`): every copy on this server takes its bytes from one bucket before
//! it reads them, so a rebuild leaves foreground programs most of the disk and network.

use parking_lot::Mutex;
use std::time::{Duration, Instant};

/// Bytes per second with a bounded burst; a rate of 0 is unlimited.
pub(crate) struct ByteRate {
    bytes_per_s: u64,
    burst_bytes: f64,
    bucket: Mutex<Bucket>,
}

struct Bucket {
    /// May go negative: a taker past the tokens owes them, and the next taker waits for the
    /// debt too, so concurrent copies share the rate in arrival order.
    tokens: f64,
    refilled: Instant,
}

impl ByteRate {
    /// `bytes_per_s` (0: unlimited) with a burst of `burst_bytes` (at least 1).
    pub(crate) fn new(bytes_per_s: u64, burst_bytes: u64) -> ByteRate {
        let burst_bytes = burst_bytes.max(1) as f64;
        ByteRate {
            bytes_per_s,
            burst_bytes,
            bucket: Mutex::new(Bucket { tokens: burst_bytes, refilled: Instant::now() }),
        }
    }

    /// How long a taker of `bytes` at `now` must wait (and takes them).
    fn reserve(&self, bytes: u64, now: Instant) -> Duration {
        if self.bytes_per_s == 0 {
            return Duration::ZERO;
        }
        let rate = self.bytes_per_s as f64;
        let mut bucket = self.bucket.lock();
        let elapsed = now.saturating_duration_since(bucket.refilled).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * rate).min(self.burst_bytes);
        bucket.refilled = now;
        bucket.tokens -= bytes as f64;
        if bucket.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-bucket.tokens / rate)
        }
    }

    /// Waits until `bytes` may be moved.
    pub(crate) async fn take(&self, bytes: u64) {
        let wait = self.reserve(bytes, Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unlimited_never_waits() {
        let rate = ByteRate::new(0, 1);
        assert_eq!(rate.reserve(u64::MAX, Instant::now()), Duration::ZERO);
    }

    #[test]
    fn takers_past_the_burst_wait_for_their_bytes_at_the_rate() {
        let rate = ByteRate::new(1000, 500);
        let now = Instant::now();
        assert_eq!(rate.reserve(500, now), Duration::ZERO, "the burst is free");
        let first = rate.reserve(1000, now);
        assert!((first.as_secs_f64() - 1.0).abs() < 1e-6, "{first:?}");
        let second = rate.reserve(500, now);
        assert!((second.as_secs_f64() - 1.5).abs() < 1e-6, "debts queue: {second:?}");
        // Two seconds later the debt is paid and 500 bytes are back (the burst caps it).
        let later = now + Duration::from_secs(4);
        assert_eq!(rate.reserve(500, later), Duration::ZERO);
        assert!(rate.reserve(1, later) > Duration::ZERO);
    }
}
