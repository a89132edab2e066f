//! A hybrid logical clock (Kulkarni et al., 2014) for log-cache timestamps: the high 48
//! bits are wall-clock milliseconds, the low 16 a logical counter. A process's stamps
//! strictly increase; a stamp taken after seeing another (`observe`) is larger than it, so a
//! write that follows another through any message the members exchange (the job group's
//! clock travels with every `JobFlush`/`JobWait`) gets the larger stamp; writes not ordered
//! that way compare by wall clock, within the hosts' clock skew.

/// Bits of the logical counter.
pub const LOGICAL_BITS: u32 = 16;

#[derive(Debug, Default)]
pub struct HybridClock {
    last: u64,
}

impl HybridClock {
    /// The next stamp, at wall-clock time `physical_ms`.
    pub fn stamp(&mut self, physical_ms: u64) -> u64 {
        let physical = physical_ms << LOGICAL_BITS;
        self.last = physical.max(self.last + 1);
        self.last
    }

    /// Takes in a stamp seen elsewhere: every later stamp is larger.
    pub fn observe(&mut self, remote: u64) {
        self.last = self.last.max(remote);
    }

    pub fn last(&self) -> u64 {
        self.last
    }
}

/// Wall-clock milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn stamps_increase_and_follow_what_was_seen(
            events in prop::collection::vec((any::<bool>(), 0u64..1 << 40, any::<u64>()), 1..100)
        ) {
            let mut clock = HybridClock::default();
            let mut previous = 0u64;
            let mut seen = 0u64;
            for (observe, physical_ms, remote) in events {
                if observe {
                    clock.observe(remote >> 1);
                    seen = seen.max(remote >> 1);
                    continue;
                }
                let stamp = clock.stamp(physical_ms);
                prop_assert!(stamp > previous, "strictly increasing");
                prop_assert!(stamp > seen, "after every stamp observed");
                prop_assert!(stamp >= physical_ms << LOGICAL_BITS);
                previous = stamp;
            }
        }
    }
}
