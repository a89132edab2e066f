//! Placement: which storage targets hold the subfiles of a new file.
//!
//! Pure functions, no storage. Invariants of every result: its length is the subfile count,
//! every target is live, and no target appears twice (two subfiles of one file on one target
//! would serialize the very I/O that striping is meant to spread).

use crate::error::NamespaceError;
use flotilla_types::TargetId;

/// A target is full when its free space is under this share of its total, in percent.
pub const FREE_PERCENT_MIN: u64 = 1;

/// A live target and its current usage, as reported by its I/O server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TargetUsage {
    pub target: TargetId,
    pub used_bytes: u64,
    pub free_bytes: u64,
}

impl TargetUsage {
    /// True when the target has at least `FREE_PERCENT_MIN` percent of its total free.
    pub fn has_room(&self) -> bool {
        let total = u128::from(self.used_bytes) + u128::from(self.free_bytes);
        let free = u128::from(self.free_bytes);
        free > 0 && free * 100 >= total * u128::from(FREE_PERCENT_MIN)
    }
}

/// Chooses `count` distinct live targets for a new file.
///
/// Round robin over the live targets sorted by id, starting at `cursor % live.len()` (the
/// caller advances the cursor by one per file), taking only targets with room; if too few
/// have room, the rest are the full targets with the most free bytes.
pub fn choose_targets(
    live: &[TargetUsage],
    count: usize,
    cursor: u64,
) -> Result<Vec<TargetId>, NamespaceError> {
    let sorted = sorted_distinct(live)?;
    check_count(count, sorted.len())?;
    let start = (cursor % sorted.len() as u64) as usize;
    let mut taken = vec![false; sorted.len()];
    let mut chosen = Vec::with_capacity(count);
    for offset in 0..sorted.len() {
        let index = (start + offset) % sorted.len();
        if chosen.len() < count && sorted[index].has_room() {
            taken[index] = true;
            chosen.push(sorted[index].target);
        }
    }
    fill_most_free(&sorted, &mut taken, &mut chosen, count);
    debug_assert_eq!(chosen.len(), count);
    debug_assert!(crate::record::all_distinct(&chosen));
    Ok(chosen)
}

/// Checks targets the program named: at least one, all live, none twice.
pub fn check_targets(live: &[TargetUsage], named: &[TargetId]) -> Result<(), NamespaceError> {
    check_count(named.len(), live.len())?;
    for (index, target) in named.iter().enumerate() {
        if !live.iter().any(|usage| usage.target == *target) {
            return Err(NamespaceError::TargetNotLive { target: *target });
        }
        if named[..index].contains(target) {
            return Err(NamespaceError::DuplicateTarget { target: *target });
        }
    }
    Ok(())
}

fn check_count(count: usize, live_count: usize) -> Result<(), NamespaceError> {
    let subfile_count_max = crate::record::SUBFILE_COUNT_MAX as usize;
    if count == 0 || count > subfile_count_max {
        return Err(NamespaceError::invalid(format!(
            "subfile count {count} is outside 1..={subfile_count_max}"
        )));
    }
    if count > live_count {
        return Err(NamespaceError::NotEnoughTargets { wanted: count, live: live_count });
    }
    Ok(())
}

fn sorted_distinct(live: &[TargetUsage]) -> Result<Vec<TargetUsage>, NamespaceError> {
    let mut sorted = live.to_vec();
    sorted.sort_unstable_by_key(|usage| usage.target);
    if let Some(pair) = sorted.windows(2).find(|pair| pair[0].target == pair[1].target) {
        return Err(NamespaceError::DuplicateTarget { target: pair[0].target });
    }
    Ok(sorted)
}

/// Tops `chosen` up to `count` with the untaken targets that have the most free bytes.
fn fill_most_free(sorted: &[TargetUsage], taken: &mut [bool], chosen: &mut Vec<TargetId>, count: usize) {
    if chosen.len() >= count {
        return;
    }
    let mut rest: Vec<usize> = (0..sorted.len()).filter(|index| !taken[*index]).collect();
    rest.sort_by_key(|index| (std::cmp::Reverse(sorted[*index].free_bytes), sorted[*index].target));
    for index in rest.into_iter().take(count - chosen.len()) {
        taken[index] = true;
        chosen.push(sorted[index].target);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(id: u64, used_bytes: u64, free_bytes: u64) -> TargetUsage {
        TargetUsage { target: TargetId(id), used_bytes, free_bytes }
    }

    #[test]
    fn round_robin_starts_at_cursor_and_skips_full_targets() {
        let live = [usage(30, 0, 100), usage(10, 0, 100), usage(20, 100, 0)];
        let ids = |v: Vec<TargetId>| v.into_iter().map(|t| t.0).collect::<Vec<_>>();
        assert_eq!(ids(choose_targets(&live, 1, 0).unwrap()), [10]);
        assert_eq!(ids(choose_targets(&live, 1, 1).unwrap()), [30]);
        assert_eq!(ids(choose_targets(&live, 2, 2).unwrap()), [30, 10]);
        assert_eq!(ids(choose_targets(&live, 3, 1).unwrap()), [30, 10, 20]);
    }

    #[test]
    fn counts_outside_range_are_refused_with_both_numbers() {
        let live = [usage(1, 0, 1), usage(2, 0, 1)];
        assert!(matches!(choose_targets(&live, 0, 0), Err(NamespaceError::InvalidArgument { .. })));
        assert_eq!(choose_targets(&live, 3, 0), Err(NamespaceError::NotEnoughTargets { wanted: 3, live: 2 }));
    }

    #[test]
    fn named_targets_must_be_live_and_distinct() {
        let live = [usage(1, 0, 1), usage(2, 0, 1)];
        assert_eq!(check_targets(&live, &[TargetId(2), TargetId(1)]), Ok(()));
        assert_eq!(
            check_targets(&live, &[TargetId(3)]),
            Err(NamespaceError::TargetNotLive { target: TargetId(3) })
        );
        assert_eq!(
            check_targets(&live, &[TargetId(1), TargetId(1)]),
            Err(NamespaceError::DuplicateTarget { target: TargetId(1) })
        );
    }

    #[test]
    fn one_percent_free_is_room_and_less_is_full() {
        assert!(usage(1, 99, 1).has_room());
        assert!(!usage(1, 100, 1).has_room());
        assert!(!usage(1, 0, 0).has_room());
        assert!(usage(1, u64::MAX, u64::MAX).has_room());
    }
}
