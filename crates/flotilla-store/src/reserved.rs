//! Which byte ranges of a fork (or of its checksum file) are known to have space allocated,
//! and which ranges a write must still reserve: pure, no I/O.
//!
//! A write reserves the blocks it touches — never the span between its pieces: one request
//! may carry a byte at 0 and another at 1 TiB (the mount's write-behind packs both into one
//! `List`), and the hole between them must stay a hole (issue 31).
//!
//! Invariants:
//! - ranges are disjoint, non-empty and not adjacent (touching ranges are merged);
//! - at most `ranges_max` ranges are kept; past that the set forgets every range but the
//!   first (usually the dense prefix). Forgetting is safe: a range not in the set is only
//!   reserved again (an `fallocate` of space already allocated changes nothing), never
//!   taken as reserved when it is not.

use std::collections::BTreeMap;

/// Ranges kept by default before the set forgets all but its first.
pub(crate) const RESERVED_RANGES_MAX: usize = 4096;

/// A bounded set of byte ranges known to be allocated.
#[derive(Clone, Debug)]
pub(crate) struct Reserved {
    /// start → end of each range.
    ranges: BTreeMap<u64, u64>,
    ranges_max: usize,
}

impl Reserved {
    /// An empty set keeping at most `ranges_max` ranges (at least 1).
    pub(crate) fn new(ranges_max: usize) -> Reserved {
        Reserved { ranges: BTreeMap::new(), ranges_max: ranges_max.max(1) }
    }

    /// The parts of `start..end` not in the set, in order.
    pub(crate) fn missing(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut gaps = Vec::new();
        if start >= end {
            return gaps;
        }
        let mut at = start;
        let before = self.ranges.range(..=start).next_back().map(|(s, e)| (*s, *e));
        let after = self.ranges.range(start.saturating_add(1)..end).map(|(s, e)| (*s, *e));
        for (range_start, range_end) in before.into_iter().chain(after) {
            if at >= end {
                break;
            }
            if range_start > at {
                gaps.push((at, range_start.min(end)));
            }
            at = at.max(range_end);
        }
        if at < end {
            gaps.push((at, end));
        }
        gaps
    }

    /// Adds `start..end`, merging with the ranges it touches.
    pub(crate) fn insert(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let (mut new_start, mut new_end) = (start, end);
        if let Some((s, e)) = self.ranges.range(..=start).next_back().map(|(s, e)| (*s, *e)) {
            if e >= start {
                new_start = s;
                new_end = new_end.max(e);
            }
        }
        let touched: Vec<u64> = self.ranges.range(new_start..=new_end).map(|(s, _)| *s).collect();
        for s in touched {
            if let Some(e) = self.ranges.remove(&s) {
                new_end = new_end.max(e);
            }
        }
        self.ranges.insert(new_start, new_end);
        if self.ranges.len() > self.ranges_max {
            self.forget_all_but_first();
        }
    }

    fn forget_all_but_first(&mut self) {
        let first = self.ranges.pop_first();
        self.ranges.clear();
        if let Some((start, end)) = first {
            self.ranges.insert(start, end);
        }
    }

    /// Forgets everything at or past `end` (a truncation).
    pub(crate) fn cut(&mut self, end: u64) {
        let dropped: Vec<u64> = self.ranges.range(end..).map(|(s, _)| *s).collect();
        for s in dropped {
            self.ranges.remove(&s);
        }
        if let Some((_, e)) = self.ranges.range_mut(..end).next_back() {
            *e = (*e).min(end);
        }
    }

    /// Bytes in the set.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> u64 {
        self.ranges.iter().map(|(s, e)| e - s).sum()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.ranges.len()
    }
}

/// The runs of `granule_bytes`-aligned blocks a list of byte ranges touches, sorted and
/// merged where they touch; empty ranges touch nothing. Never more runs than ranges, and a
/// run never covers a block no range touches.
pub(crate) fn touched_runs(ranges: impl Iterator<Item = (u64, u64)>, granule_bytes: u64) -> Vec<(u64, u64)> {
    let granule = granule_bytes.max(1);
    let mut rounded: Vec<(u64, u64)> = ranges
        .filter(|(start, end)| start < end)
        .map(|(start, end)| {
            let end_rounded = end.checked_next_multiple_of(granule).unwrap_or(end);
            (start - start % granule, end_rounded)
        })
        .collect();
    rounded.sort_unstable();
    let mut runs: Vec<(u64, u64)> = Vec::with_capacity(rounded.len());
    for (start, end) in rounded {
        match runs.last_mut() {
            Some((_, last_end)) if *last_end >= start => *last_end = (*last_end).max(end),
            _ => runs.push((start, end)),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn two_bytes_far_apart_touch_two_blocks_not_the_span() {
        let runs = touched_runs([(0, 1), (1 << 40, (1 << 40) + 1)].into_iter(), 4096);
        assert_eq!(runs, vec![(0, 4096), (1 << 40, (1 << 40) + 4096)]);
        let bytes: u64 = runs.iter().map(|(s, e)| e - s).sum();
        assert_eq!(bytes, 8192);
    }

    #[test]
    fn missing_inserts_and_cuts() {
        let mut set = Reserved::new(16);
        set.insert(0, 100);
        set.insert(200, 300);
        assert_eq!(set.missing(50, 250), vec![(100, 200)]);
        assert_eq!(set.missing(300, 400), vec![(300, 400)]);
        assert!(set.missing(10, 90).is_empty());
        set.insert(100, 200);
        assert_eq!(set.len(), 1, "touching ranges merge");
        set.cut(150);
        assert_eq!(set.missing(0, 300), vec![(150, 300)]);
    }

    #[test]
    fn past_its_bound_the_set_keeps_only_its_first_range() {
        let mut set = Reserved::new(3);
        for index in 0..4u64 {
            set.insert(index * 100, index * 100 + 10);
        }
        assert_eq!(set.len(), 1);
        assert!(set.missing(0, 10).is_empty());
        assert_eq!(set.missing(100, 110), vec![(100, 110)], "forgotten ranges are reserved again");
    }

    proptest! {
        /// The set answers like a model of every inserted byte (minus forgotten ones: with
        /// a large bound nothing is forgotten), and `touched_runs` covers exactly the
        /// granules the ranges touch.
        #[test]
        fn set_matches_a_byte_model(
            inserts in prop::collection::vec((0u64..500, 0u64..60), 0..40),
            query in (0u64..600, 0u64..100),
            granule in 1u64..40,
        ) {
            let mut set = Reserved::new(1000);
            let mut model = vec![false; 700];
            for (start, length) in &inserts {
                set.insert(*start, start + length);
                for byte in *start..start + length {
                    model[byte as usize] = true;
                }
            }
            let (start, end) = (query.0, query.0 + query.1);
            let missing: u64 = set.missing(start, end).iter().map(|(s, e)| e - s).sum();
            let model_missing = (start..end).filter(|byte| !model[*byte as usize]).count() as u64;
            prop_assert_eq!(missing, model_missing);
            prop_assert_eq!(set.bytes(), model.iter().filter(|b| **b).count() as u64);
            let runs = touched_runs(inserts.iter().map(|(s, l)| (*s, s + l)), granule);
            let mut touched = std::collections::BTreeSet::new();
            for (start, length) in &inserts {
                if *length > 0 {
                    for byte in *start..start + length {
                        touched.insert(byte / granule);
                    }
                }
            }
            let run_granules: u64 = runs.iter().map(|(s, e)| (e - s) / granule).sum();
            prop_assert_eq!(run_granules, touched.len() as u64);
            prop_assert!(runs.windows(2).all(|pair| pair[0].1 < pair[1].0));
        }
    }
}
