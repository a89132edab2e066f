//! The timing rules of membership, in one place, and the check that they are safe.
//!
//! The safety rule (GPFS's disk lease): a server serves chain I/O only until
//! `heartbeat sent + lease_ms` by its own clock; the metadata service takes a member out of a
//! chain only after `fence_after_ms` without a heartbeat by its clock. With
//! `fence_after_ms > lease_ms + clock_margin_ms`, a server cut off from the metadata service
//! has stopped serving before anyone writes without it. Only bounded clock *rate* drift is
//! assumed (each side measures its own intervals), never synchronised clocks.

use crate::error::ConfigError;
use serde::{Deserialize, Serialize};

/// Membership timing, all in milliseconds of the metadata service's monotonic clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct MembershipConfig {
    /// How long a heartbeat reply lets a server serve, counted from when it sent the heartbeat.
    pub lease_ms: u64,
    /// Allowance for clock rate drift and scheduling between the two sides.
    pub clock_margin_ms: u64,
    /// Silence after which a member is taken out of its chains (the stall a writer sees).
    pub fence_after_ms: u64,
    /// Silence after which a target is declared dead and its chains rebuilt elsewhere.
    pub dead_after_ms: u64,
}

impl Default for MembershipConfig {
    fn default() -> Self {
        MembershipConfig {
            lease_ms: 3_000,
            clock_margin_ms: 1_000,
            fence_after_ms: 5_000,
            dead_after_ms: 600_000,
        }
    }
}

impl MembershipConfig {
    /// Checks the safety rule above.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.lease_ms == 0 {
            return Err(ConfigError::Zero { name: "lease_ms" });
        }
        let lease_end_ms = self.lease_ms.saturating_add(self.clock_margin_ms);
        if self.fence_after_ms <= lease_end_ms {
            return Err(ConfigError::FenceBeforeLease {
                fence: self.fence_after_ms,
                lease: self.lease_ms,
                margin: self.clock_margin_ms,
            });
        }
        if self.dead_after_ms < self.fence_after_ms {
            return Err(ConfigError::DeadBeforeFence {
                dead: self.dead_after_ms,
                fence: self.fence_after_ms,
            });
        }
        Ok(())
    }
}
