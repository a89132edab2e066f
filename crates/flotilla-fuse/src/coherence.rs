//! The contract between the mount's data cache (the pagepool) and what keeps caches of
//! several clients coherent (byte-range tokens).
//!
//! The cache asks [`Coherence::cover`] before it serves a cached byte, fetches bytes to keep,
//! or buffers a write; the answer is the range it may cache for that access (at least the
//! range asked). When another client needs a conflicting range, the coherence side calls the
//! cache's [`CacheControl::give_up`] first: dirty bytes in the range are written to the
//! servers and, for a conflicting write, cached bytes are dropped, before the range is
//! handed over.
//!
//! [`CloseToOpen`] is the contract without tokens: any range may be cached while the file is
//! open in this mount, and the cache revalidates at open (size and mtime) — NFS's
//! close-to-open consistency.

use fuser::Errno;
use std::ops::Range;

/// What a caller is about to do with a range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

/// Grants the right to cache ranges of files.
pub trait Coherence: Send + Sync {
    /// Blocks until this mount may cache `range` of file `ino` for `access`; returns the range
    /// covered (it contains `range`).
    fn cover(&self, ino: u64, range: Range<u64>, access: Access) -> Result<Range<u64>, Errno>;
    /// Every handle of this mount on `ino` is closed and its dirty bytes are on the servers.
    fn closed(&self, ino: u64);
}

/// What the coherence side asks of the cache when it must give a range up.
pub trait CacheControl: Send + Sync {
    /// Write every dirty byte of `range` of `ino` to the servers; then, unless
    /// `keep_clean`, drop the cached bytes of the range.
    fn give_up(&self, ino: u64, range: Range<u64>, keep_clean: bool) -> Result<(), Errno>;
}

/// Close-to-open consistency: no tokens, every range may be cached while open.
#[derive(Debug, Default, Clone, Copy)]
pub struct CloseToOpen;

impl Coherence for CloseToOpen {
    fn cover(&self, _ino: u64, _range: Range<u64>, _access: Access) -> Result<Range<u64>, Errno> {
        Ok(0..u64::MAX)
    }

    fn closed(&self, _ino: u64) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_to_open_covers_every_range() {
        let covered = CloseToOpen.cover(7, 10..20, Access::Write).expect("cover");
        assert!(covered.start <= 10 && covered.end >= 20);
    }
}
