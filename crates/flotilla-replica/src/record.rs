//! The resync record (issue 32): what a serving member applied while some member of its
//! chain was not serving, so that a returning member is copied only that.
//!
//! Every serving member keeps one [`MissedRecord`] per chain from the first version it sees
//! a member out of the write path until every member serves again. It holds, per key (a
//! fork, or a whole subfile for creates and removes), the byte ranges changed:
//! - a write of `[offset, offset + length)` records that range;
//! - a truncation to `size` records `[size, u64::MAX)`: bytes past the new end are zero
//!   or gone on the source, whatever the stale copy held there;
//! - anything else on a fork (extend, create, remove, a write of another shape) records the
//!   whole fork, and a subfile's create or remove records the whole subfile.
//!
//! Ranges are merged as they come and bounded per key (`ranges_max`, coarsened into a
//! superset: a few extra bytes copied, never one missed). The record as a whole is bounded
//! by `bytes_max` (its estimated size, [`MissedRecord::size_bytes`]): past it the record
//! *overflows*, forgets its ranges, and any member it covered gets the whole copy.
//!
//! A record *covers* a member only if it saw that member leave while recording (`covers`):
//! a member that left before the record started, or whose record was lost (the recorder
//! restarted: records live in the recorder's memory), is copied whole.
//!
//! Catching up: for each key, the source reads its own fork's current size, writes the
//! record's ranges clipped to that size ([`pieces_within`]) to the returning member, then
//! truncates the member's fork to that size. `tests/properties.rs` checks that this gives
//! the same bytes as a full copy for any sequence of writes and truncations.

use crate::ids::ChainVersion;
use crate::ranges::{ByteRange, RangeSet};
use flotilla_types::TargetId;
use std::collections::{BTreeMap, BTreeSet};

/// Estimated bytes one key costs in a record besides its ranges.
pub const RECORD_KEY_BYTES: u64 = 96;
/// Estimated bytes one range costs in a record.
pub const RECORD_RANGE_BYTES: u64 = 16;

/// Every byte of a key.
pub const WHOLE: ByteRange = ByteRange { offset: 0, length_bytes: u64::MAX };

/// What one serving member recorded of its chain since `since`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MissedRecord<K> {
    since: ChainVersion,
    covers: BTreeSet<TargetId>,
    keys: BTreeMap<K, RangeSet>,
    ranges_max: usize,
    bytes_max: u64,
    overflowed: bool,
    ranges: u64,
}

impl<K: Ord + Clone> MissedRecord<K> {
    /// An empty record started at `since`, covering `covers`, each key bounded to
    /// `ranges_max` ranges and the whole to `bytes_max` estimated bytes.
    pub fn new(since: ChainVersion, covers: BTreeSet<TargetId>, ranges_max: usize, bytes_max: u64) -> Self {
        MissedRecord {
            since,
            covers,
            keys: BTreeMap::new(),
            ranges_max: ranges_max.max(1),
            bytes_max,
            overflowed: false,
            ranges: 0,
        }
    }

    pub fn since(&self) -> ChainVersion {
        self.since
    }

    pub fn covers(&self) -> &BTreeSet<TargetId> {
        &self.covers
    }

    /// Whether `target` can be caught up from this record alone.
    pub fn covers_target(&self, target: TargetId) -> bool {
        !self.overflowed && self.covers.contains(&target)
    }

    /// Adds `target` to the members this record holds every change for.
    pub fn cover(&mut self, target: TargetId) {
        self.covers.insert(target);
    }

    /// Drops `target` (it serves again, left the chain, or was seen leaving unrecorded).
    pub fn uncover(&mut self, target: TargetId) {
        self.covers.remove(&target);
    }

    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// The record's estimated size.
    pub fn size_bytes(&self) -> u64 {
        self.keys.len() as u64 * RECORD_KEY_BYTES + self.ranges * RECORD_RANGE_BYTES
    }

    /// Records that `range` of `key` changed.
    pub fn record(&mut self, key: K, range: ByteRange) {
        if self.overflowed {
            return;
        }
        let ranges_max = self.ranges_max;
        let set = self.keys.entry(key).or_insert_with(|| RangeSet::new(ranges_max));
        let before = set.len() as u64;
        set.insert(range);
        self.ranges = self.ranges + set.len() as u64 - before;
        if self.size_bytes() > self.bytes_max {
            self.overflowed = true;
            self.keys.clear();
            self.ranges = 0;
        }
    }

    /// Adds every range of `other` (a record taken while a copy ran).
    pub fn absorb(&mut self, other: &MissedRecord<K>) {
        if other.overflowed {
            self.overflowed = true;
            self.keys.clear();
            self.ranges = 0;
            return;
        }
        for (key, set) in &other.keys {
            for range in set.iter() {
                self.record(key.clone(), range);
            }
        }
    }

    /// The changed ranges by key.
    pub fn keys(&self) -> &BTreeMap<K, RangeSet> {
        &self.keys
    }

    /// Bytes the ranges cover, with `u64::MAX`-ended ranges counted to `clip` (an estimate
    /// of what a catch-up copies).
    pub fn covered_bytes(&self, clip: u64) -> u64 {
        self.keys
            .values()
            .flat_map(|set| set.iter())
            .map(|r| r.end().min(clip).saturating_sub(r.offset.min(clip)))
            .fold(0u64, u64::saturating_add)
    }

    /// Takes the ranges out, leaving the record empty (same `since`, `covers` and bounds).
    pub fn take(&mut self) -> MissedRecord<K> {
        let mut taken = MissedRecord::new(self.since, self.covers.clone(), self.ranges_max, self.bytes_max);
        taken.overflowed = self.overflowed;
        taken.ranges = std::mem::take(&mut self.ranges);
        taken.keys = std::mem::take(&mut self.keys);
        self.overflowed = false;
        taken
    }
}

/// The pieces of `set` that lie within a fork of `size_bytes` (the source's size now),
/// each at most `piece_bytes_max` long, in offset order.
pub fn pieces_within(set: &RangeSet, size_bytes: u64, piece_bytes_max: u64) -> Vec<ByteRange> {
    let piece = piece_bytes_max.max(1);
    let mut out = Vec::new();
    for range in set.iter() {
        let end = range.end().min(size_bytes);
        let mut offset = range.offset;
        while offset < end {
            let length_bytes = (end - offset).min(piece);
            out.push(ByteRange { offset, length_bytes });
            offset += length_bytes;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(offset: u64, length_bytes: u64) -> ByteRange {
        ByteRange { offset, length_bytes }
    }

    #[test]
    fn a_record_merges_and_overflows_past_its_bound() {
        let mut record: MissedRecord<u32> = MissedRecord::new(
            ChainVersion(3),
            [TargetId(2)].into(),
            4,
            RECORD_KEY_BYTES + 2 * RECORD_RANGE_BYTES,
        );
        record.record(1, range(0, 10));
        record.record(1, range(5, 10));
        assert_eq!(record.keys()[&1].len(), 1);
        assert!(record.covers_target(TargetId(2)));
        record.record(1, range(100, 1));
        assert!(!record.overflowed());
        record.record(1, range(200, 1));
        assert!(record.overflowed(), "three ranges of one key exceed the bound");
        assert!(!record.covers_target(TargetId(2)), "an overflowed record covers nobody");
        assert!(record.keys().is_empty());
    }

    #[test]
    fn pieces_stop_at_the_source_size_and_respect_the_piece_bound() {
        let mut set = RangeSet::new(8);
        set.insert(range(10, 30));
        set.insert(range(100, u64::MAX - 100));
        let pieces = pieces_within(&set, 120, 16);
        assert_eq!(pieces, vec![range(10, 16), range(26, 14), range(100, 16), range(116, 4)]);
        assert!(pieces_within(&set, 5, 16).is_empty());
    }
}
