//! Missing-update ranges: the byte ranges of one fork that a member lacks, kept by every
//! serving member while that member is out of the write path (GPFS's "missing update" marks,
//! at byte-range rather than whole-file grain).
//!
//! Invariants kept here:
//! - ranges are sorted, non-empty, disjoint and not adjacent (each insert merges);
//! - a set never holds more than its `ranges_max` ranges: past it, the two neighbours with
//!   the smallest gap are merged (the gap is added). So a set is always a *superset* of what
//!   was inserted and not yet subtracted: coarsening copies a few extra bytes, never misses
//!   one. [`RangeSet::whole`] is the coarsest set;
//! - the encoding starts with a version byte ([`RANGES_ENCODING_VERSION`]), then a count
//!   (u32 LE) and that many `(offset u64 LE, length u64 LE)` pairs; decoding checks the
//!   version, the count against `ranges_max` *before* allocating, the exact length, and that
//!   the ranges are sorted, merged, non-empty and do not overflow. Garbage is an error, never
//!   a panic or a large allocation.

use crate::error::RangeError;
use serde::{Deserialize, Serialize};

/// Default bound on ranges kept per fork (`ranges_max`).
pub const RANGES_PER_FORK_MAX: usize = 1024;

/// Version byte of the range set encoding.
pub const RANGES_ENCODING_VERSION: u8 = 1;

const HEADER_BYTES: usize = 1 + 4;
const RANGE_BYTES: usize = 16;

/// A non-empty byte range `[offset, offset + length_bytes)` within 64-bit offsets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ByteRange {
    pub offset: u64,
    pub length_bytes: u64,
}

impl ByteRange {
    /// The range, if it is non-empty and its end fits in a u64.
    pub fn new(offset: u64, length_bytes: u64) -> Result<Option<ByteRange>, RangeError> {
        offset.checked_add(length_bytes).ok_or(RangeError::Overflow { offset, length: length_bytes })?;
        Ok((length_bytes > 0).then_some(ByteRange { offset, length_bytes }))
    }

    /// One past the last byte.
    pub fn end(self) -> u64 {
        self.offset + self.length_bytes
    }
}

/// A bounded set of byte ranges of one fork.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeSet {
    /// `(start, end)` pairs, sorted, `start < end`, and `end < next start`.
    ranges: Vec<(u64, u64)>,
    ranges_max: usize,
}

impl RangeSet {
    /// An empty set bounded to `ranges_max` ranges (at least 1).
    pub fn new(ranges_max: usize) -> RangeSet {
        RangeSet { ranges: Vec::new(), ranges_max: ranges_max.max(1) }
    }

    /// Every byte of the fork.
    pub fn whole(ranges_max: usize) -> RangeSet {
        let mut set = RangeSet::new(ranges_max);
        set.ranges.push((0, u64::MAX));
        set
    }

    pub fn ranges_max(&self) -> usize {
        self.ranges_max
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Number of ranges held.
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    /// Bytes covered.
    pub fn covered_bytes(&self) -> u64 {
        self.ranges.iter().map(|(s, e)| e - s).sum()
    }

    pub fn iter(&self) -> impl Iterator<Item = ByteRange> + '_ {
        self.ranges.iter().map(|&(s, e)| ByteRange { offset: s, length_bytes: e - s })
    }

    pub fn contains(&self, offset: u64) -> bool {
        let at = self.ranges.partition_point(|&(_, e)| e <= offset);
        self.ranges.get(at).is_some_and(|&(s, _)| s <= offset)
    }

    /// Adds `range`, merging with what it touches, then coarsens to `ranges_max`.
    pub fn insert(&mut self, range: ByteRange) {
        let (mut start, mut end) = (range.offset, range.end());
        let first = self.ranges.partition_point(|&(_, e)| e < start);
        let last = self.ranges.partition_point(|&(s, _)| s <= end);
        if first < last {
            start = start.min(self.ranges[first].0);
            end = end.max(self.ranges[last - 1].1);
        }
        self.ranges.splice(first..last, [(start, end)]);
        self.coarsen();
    }

    /// Adds every range of `other`.
    pub fn union(&mut self, other: &RangeSet) {
        for range in other.iter() {
            self.insert(range);
        }
    }

    /// Removes `range` (what was copied), then coarsens to `ranges_max` if a split went over.
    pub fn subtract(&mut self, range: ByteRange) {
        let (start, end) = (range.offset, range.end());
        let mut kept = Vec::with_capacity(self.ranges.len() + 1);
        for &(s, e) in &self.ranges {
            if e <= start || s >= end {
                kept.push((s, e));
                continue;
            }
            if s < start {
                kept.push((s, start));
            }
            if e > end {
                kept.push((end, e));
            }
        }
        self.ranges = kept;
        self.coarsen();
    }

    /// Merges the closest neighbours until at most `ranges_max` ranges remain.
    fn coarsen(&mut self) {
        while self.ranges.len() > self.ranges_max {
            let at = (1..self.ranges.len())
                .min_by_key(|&i| self.ranges[i].0 - self.ranges[i - 1].1)
                .expect("more than one range");
            self.ranges[at - 1].1 = self.ranges[at].1;
            self.ranges.remove(at);
        }
        debug_assert!(self.well_formed());
    }

    fn well_formed(&self) -> bool {
        self.ranges.iter().all(|&(s, e)| s < e) && self.ranges.windows(2).all(|w| w[0].1 < w[1].0)
    }

    /// The versioned encoding described in the module docs.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_BYTES + self.ranges.len() * RANGE_BYTES);
        out.push(RANGES_ENCODING_VERSION);
        let count = u32::try_from(self.ranges.len()).expect("ranges_max fits in u32");
        out.extend_from_slice(&count.to_le_bytes());
        for &(s, e) in &self.ranges {
            out.extend_from_slice(&s.to_le_bytes());
            out.extend_from_slice(&(e - s).to_le_bytes());
        }
        out
    }

    /// Decodes an [`encode`](Self::encode)d set, refusing anything malformed or over
    /// `ranges_max` ranges.
    pub fn decode(bytes: &[u8], ranges_max: usize) -> Result<RangeSet, RangeError> {
        let header = bytes
            .get(..HEADER_BYTES)
            .ok_or(RangeError::Truncated { needed: HEADER_BYTES, have: bytes.len() })?;
        if header[0] != RANGES_ENCODING_VERSION {
            return Err(RangeError::Version { found: header[0], expected: RANGES_ENCODING_VERSION });
        }
        let count = u32::from_le_bytes([header[1], header[2], header[3], header[4]]);
        let mut set = RangeSet::new(ranges_max);
        if count as usize > set.ranges_max {
            return Err(RangeError::TooMany { count: u64::from(count), max: set.ranges_max });
        }
        let body = &bytes[HEADER_BYTES..];
        let needed = count as usize * RANGE_BYTES;
        if body.len() < needed {
            return Err(RangeError::Truncated { needed, have: body.len() });
        }
        if body.len() > needed {
            return Err(RangeError::Trailing { extra: body.len() - needed });
        }
        for (index, chunk) in body.chunks_exact(RANGE_BYTES).enumerate() {
            let (offset, length) = (le_u64(&chunk[..8]), le_u64(&chunk[8..]));
            let range = ByteRange::new(offset, length)?.ok_or(RangeError::Unordered { index })?;
            if set.ranges.last().is_some_and(|&(_, e)| e >= offset) {
                return Err(RangeError::Unordered { index });
            }
            set.ranges.push((range.offset, range.end()));
        }
        Ok(set)
    }
}

fn le_u64(bytes: &[u8]) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(bytes);
    u64::from_le_bytes(word)
}
