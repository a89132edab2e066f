//! Limits on frames and requests. Every limit is a setting; a request over one is refused
//! with an error that names it, never executed partially and never by allocating.

use serde::{Deserialize, Serialize};

/// The limits a server enforces and a client respects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Largest frame (header, body and data) either side will accept.
    pub frame_bytes_max: u32,
    /// Largest number of data bytes one read or write request may move.
    pub request_bytes_max: u64,
    /// Largest number of pieces one request may expand to.
    pub pieces_per_request_max: u64,
    /// Credit: bytes one connection may have in flight to one server.
    pub in_flight_bytes_max: u64,
}

/// Bytes reserved in a frame for the header and the request description.
pub const FRAME_OVERHEAD_BYTES: u64 = 1 << 20;

impl Default for Limits {
    fn default() -> Self {
        Self {
            frame_bytes_max: 65 << 20,
            request_bytes_max: 64 << 20,
            pieces_per_request_max: 1 << 20,
            in_flight_bytes_max: 256 << 20,
        }
    }
}

/// A set of limits that cannot work together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LimitsError {
    #[error("request_bytes_max ({request}) plus {overhead} bytes of overhead must fit in frame_bytes_max ({frame})")]
    RequestOverFrame { request: u64, frame: u32, overhead: u64 },
    #[error("request_bytes_max ({request}) must not exceed in_flight_bytes_max ({in_flight})")]
    RequestOverCredit { request: u64, in_flight: u64 },
    #[error("{name} must be at least 1")]
    Zero { name: &'static str },
}

impl Limits {
    /// Checks that the limits are consistent with each other.
    pub fn validate(&self) -> Result<(), LimitsError> {
        if self.request_bytes_max == 0 {
            return Err(LimitsError::Zero { name: "request_bytes_max" });
        }
        if self.pieces_per_request_max == 0 {
            return Err(LimitsError::Zero { name: "pieces_per_request_max" });
        }
        if self.request_bytes_max + FRAME_OVERHEAD_BYTES > u64::from(self.frame_bytes_max) {
            return Err(LimitsError::RequestOverFrame {
                request: self.request_bytes_max,
                frame: self.frame_bytes_max,
                overhead: FRAME_OVERHEAD_BYTES,
            });
        }
        if self.request_bytes_max > self.in_flight_bytes_max {
            return Err(LimitsError::RequestOverCredit {
                request: self.request_bytes_max,
                in_flight: self.in_flight_bytes_max,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_limits_are_consistent() {
        assert_eq!(Limits::default().validate(), Ok(()));
    }

    #[test]
    fn request_larger_than_frame_is_refused() {
        let limits = Limits { request_bytes_max: 65 << 20, ..Limits::default() };
        assert!(matches!(limits.validate(), Err(LimitsError::RequestOverFrame { .. })));
    }
}
