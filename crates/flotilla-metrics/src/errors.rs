//! Error replies counted by code, lock-free.

use crate::write::Labels;
use flotilla_proto::ErrorCode;
use std::sync::atomic::{AtomicU64, Ordering};

/// Error codes counted by name; a code added later is counted as `other`.
const ERRORS: [(ErrorCode, &str); 16] = [
    (ErrorCode::BadRequest, "bad_request"),
    (ErrorCode::OverLimit, "over_limit"),
    (ErrorCode::NotFound, "not_found"),
    (ErrorCode::AlreadyExists, "already_exists"),
    (ErrorCode::NotADirectory, "not_a_directory"),
    (ErrorCode::IsADirectory, "is_a_directory"),
    (ErrorCode::NotEmpty, "not_empty"),
    (ErrorCode::InvalidArgument, "invalid_argument"),
    (ErrorCode::NoSpace, "no_space"),
    (ErrorCode::Unavailable, "unavailable"),
    (ErrorCode::Io, "io"),
    (ErrorCode::Protocol, "protocol"),
    (ErrorCode::PermissionDenied, "permission_denied"),
    (ErrorCode::NameTooLong, "name_too_long"),
    (ErrorCode::CrossDevice, "cross_device"),
    (ErrorCode::CapabilityExpired, "capability_expired"),
];

/// One counter per error code, plus `other`.
#[derive(Debug, Default)]
pub struct ErrorCounts {
    counts: [AtomicU64; ERRORS.len() + 1],
}

impl ErrorCounts {
    pub fn add(&self, code: ErrorCode) {
        let index = ERRORS.iter().position(|(known, _)| *known == code).unwrap_or(ERRORS.len());
        self.counts[index].fetch_add(1, Ordering::Relaxed);
    }

    /// `code="..."` samples, every code listed (zero or not), for a counter family.
    pub fn samples(&self) -> Vec<(Labels, u64)> {
        let names = ERRORS.iter().map(|(_, name)| *name).chain(["other"]);
        names
            .zip(&self.counts)
            .map(|(name, count)| (vec![("code", name.to_string())], count.load(Ordering::Relaxed)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_counted_under_their_names() {
        let errors = ErrorCounts::default();
        errors.add(ErrorCode::NotFound);
        errors.add(ErrorCode::NotFound);
        let samples = errors.samples();
        let found = samples.iter().find(|(labels, _)| labels[0].1 == "not_found").map(|s| s.1);
        assert_eq!(found, Some(2));
        assert_eq!(samples.iter().map(|s| s.1).sum::<u64>(), 2);
    }
}
