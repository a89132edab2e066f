//! Extents (byte ranges of a fork) and the checks a request's extent list must pass before
//! any block is touched: no extent may overflow a 64-bit offset or end past
//! `fork_bytes_max`, and the caller's buffer must hold exactly the bytes the extents cover.

use crate::error::StoreError;
use crate::fork_ref::ForkRef;

/// A byte range of a fork.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Extent {
    pub offset: u64,
    pub length: u64,
}

impl Extent {
    pub fn new(offset: u64, length: u64) -> Self {
        Self { offset, length }
    }

    /// One past the last byte, or `None` if that overflows.
    pub fn end(&self) -> Option<u64> {
        self.offset.checked_add(self.length)
    }
}

/// What a validated extent list covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ExtentSummary {
    /// Sum of the extents' lengths: the size of the packed data buffer.
    pub total_bytes: u64,
}

/// Checks every extent and the buffer length; returns what the list covers.
pub(crate) fn summarize(
    extents: &[Extent],
    fork: &ForkRef<'_>,
    fork_bytes_max: u64,
    buffer_bytes: usize,
) -> Result<ExtentSummary, StoreError> {
    let mut summary = ExtentSummary { total_bytes: 0 };
    for extent in extents {
        // Not `ok_or`: the error would be built and dropped (a call) for every extent.
        let Some(end) = extent.end() else {
            return Err(StoreError::ExtentOverflow { offset: extent.offset, length: extent.length });
        };
        if end > fork_bytes_max {
            return Err(too_large(fork, extent, fork_bytes_max));
        }
        // A saturated sum can never equal a real buffer's length, so it is refused below.
        summary.total_bytes = summary.total_bytes.saturating_add(extent.length);
    }
    if summary.total_bytes != buffer_bytes as u64 {
        return Err(StoreError::BufferLength {
            expected_bytes: summary.total_bytes,
            actual_bytes: buffer_bytes as u64,
        });
    }
    Ok(summary)
}

fn too_large(fork: &ForkRef<'_>, extent: &Extent, fork_bytes_max: u64) -> StoreError {
    StoreError::ForkTooLarge {
        file: fork.file,
        subfile: fork.subfile,
        fork: fork.fork.to_string(),
        target: fork.target,
        offset: extent.offset,
        length: extent.length,
        fork_bytes_max,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_types::{FileId, SubfileIndex, TargetId};

    fn fork() -> ForkRef<'static> {
        ForkRef::new(TargetId(1), FileId(2), SubfileIndex(3), "data")
    }

    #[test]
    fn summarizes_lengths_and_end() {
        let extents = [Extent::new(100, 10), Extent::new(0, 5), Extent::new(500, 0)];
        let summary = summarize(&extents, &fork(), 1 << 20, 15).unwrap();
        assert_eq!(summary.total_bytes, 15);
    }

    #[test]
    fn refuses_overflow_limit_and_wrong_buffer() {
        let overflow = [Extent::new(u64::MAX - 1, 2)];
        assert!(matches!(summarize(&overflow, &fork(), 1 << 20, 2), Err(StoreError::ExtentOverflow { .. })));
        let big = [Extent::new(1 << 20, 1)];
        assert!(matches!(summarize(&big, &fork(), 1 << 20, 1), Err(StoreError::ForkTooLarge { .. })));
        let short = [Extent::new(0, 10)];
        assert!(matches!(summarize(&short, &fork(), 1 << 20, 9), Err(StoreError::BufferLength { .. })));
    }
}
