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

/// What placement remembers between creates (in memory: after a restart every target
/// starts even). Stride scheduling: each target has a *pass*; a create takes the targets
/// with the lowest passes and advances each by its *stride*, the inverse of its share of
/// the free space (1 for the target with the most free bytes, 2 for one with half as many),
/// so targets receive new subfiles in proportion to their free bytes and in turn, whatever
/// the subfile counts of the files: a burst of one-subfile files goes round all of them.
#[derive(Clone, Debug, Default)]
pub struct Spread {
    pass: std::collections::BTreeMap<TargetId, f64>,
    /// The lowest pass a choice was made at; every live target's pass is at least this,
    /// and a target that comes (back) up starts here, not with the credit of its absence.
    floor: f64,
}

/// Largest stride: a target with room but almost no free bytes gets a subfile about once
/// every this many rounds.
const STRIDE_MAX: f64 = 1e6;

/// Passes are moved back to 0 when the floor passes this (f64 stays exact for steps of 1).
const PASS_RENORMALIZE: f64 = (1u64 << 40) as f64;

/// Chooses `count` distinct live targets for a new file.
///
/// Among the targets with room, the `count` with the lowest passes in `spread` (ties go
/// round robin from `cursor % live.len()`; the caller advances the cursor by one per file);
/// if too few have room, the rest are the full targets with the most free bytes. `spread`
/// is updated (it may be updated more than once for one file if the caller retries: the
/// spread stays even, only that file counts twice).
pub fn choose_targets(
    live: &[TargetUsage],
    count: usize,
    cursor: u64,
    spread: &mut Spread,
) -> Result<Vec<TargetId>, NamespaceError> {
    let sorted = sorted_distinct(live)?;
    check_count(count, sorted.len())?;
    spread.pass.retain(|target, _| sorted.iter().any(|usage| usage.target == *target));
    let start = (cursor % sorted.len() as u64) as usize;
    let roomy: Vec<usize> = (0..sorted.len()).filter(|index| sorted[*index].has_room()).collect();
    let free_max = roomy.iter().map(|index| sorted[*index].free_bytes).max().unwrap_or(0);
    let mut ranked: Vec<(f64, usize, usize)> = roomy
        .iter()
        .map(|&index| {
            let pass = spread.pass.get(&sorted[index].target).copied().unwrap_or(spread.floor);
            (pass.max(spread.floor), (index + sorted.len() - start) % sorted.len(), index)
        })
        .collect();
    ranked.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut taken = vec![false; sorted.len()];
    let mut chosen = Vec::with_capacity(count);
    for &(pass, _, index) in ranked.iter().take(count) {
        taken[index] = true;
        chosen.push(sorted[index].target);
        spread.pass.insert(sorted[index].target, pass + stride(sorted[index].free_bytes, free_max));
    }
    if let Some(&(lowest, _, _)) = ranked.first() {
        spread.floor = lowest;
    }
    renormalize(spread);
    fill_most_free(&sorted, &mut taken, &mut chosen, count);
    debug_assert_eq!(chosen.len(), count);
    debug_assert!(crate::record::all_distinct(&chosen));
    Ok(chosen)
}

/// The pass a target advances by per subfile: `free_max / free_bytes`, in `1..=STRIDE_MAX`.
fn stride(free_bytes: u64, free_max: u64) -> f64 {
    if free_bytes == 0 {
        return STRIDE_MAX;
    }
    (free_max as f64 / free_bytes as f64).clamp(1.0, STRIDE_MAX)
}

fn renormalize(spread: &mut Spread) {
    if spread.floor < PASS_RENORMALIZE {
        return;
    }
    let floor = spread.floor;
    spread.pass.values_mut().for_each(|pass| *pass = (*pass - floor).max(0.0));
    spread.floor = 0.0;
}

/// Every live target (at most `SUBFILE_COUNT_MAX`) in the order `choose_targets` would take
/// them for a file of that many subfiles, without changing `spread`: the first `k` of the
/// ranking are `choose_targets(live, k, cursor, spread)`. A replicated namespace's proposer
/// decides placement with it (its spread is memory the replicas do not share), and the
/// create takes the first `k` when it is applied ([`take_ranked`]).
pub fn rank_targets(
    live: &[TargetUsage],
    cursor: u64,
    spread: &Spread,
) -> Result<Vec<TargetId>, NamespaceError> {
    let count = live.len().min(crate::record::SUBFILE_COUNT_MAX as usize);
    choose_targets(live, count, cursor, &mut spread.clone())
}

/// The first `count` targets of a ranking ([`rank_targets`]): enough of them, none twice.
pub fn take_ranked(ranked: &[TargetId], count: usize) -> Result<Vec<TargetId>, NamespaceError> {
    check_count(count, ranked.len())?;
    let chosen = &ranked[..count];
    if let Some((_, target)) = chosen.iter().enumerate().find(|(i, t)| chosen[..*i].contains(t)) {
        return Err(NamespaceError::DuplicateTarget { target: *target });
    }
    Ok(chosen.to_vec())
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

    fn ids(chosen: Vec<TargetId>) -> Vec<u64> {
        chosen.into_iter().map(|t| t.0).collect()
    }

    /// The first k of a ranking are what `choose_targets` picks for k subfiles.
    #[test]
    fn a_ranking_starts_with_every_smaller_choice() {
        let live = [usage(30, 0, 100), usage(10, 0, 50), usage(20, 100, 0), usage(40, 10, 90)];
        let mut spread = Spread::default();
        choose_targets(&live, 1, 0, &mut spread).unwrap();
        for cursor in 0..4 {
            let ranked = rank_targets(&live, cursor, &spread).unwrap();
            for k in 1..=live.len() {
                let chosen = choose_targets(&live, k, cursor, &mut spread.clone()).unwrap();
                assert_eq!(take_ranked(&ranked, k).unwrap(), chosen, "cursor {cursor}, {k} subfiles");
            }
            assert!(take_ranked(&ranked, live.len() + 1).is_err());
        }
    }

    #[test]
    fn equal_targets_go_round_robin_from_the_cursor_and_full_ones_last() {
        let live = [usage(30, 0, 100), usage(10, 0, 100), usage(20, 100, 0)];
        assert_eq!(ids(choose_targets(&live, 1, 0, &mut Spread::default()).unwrap()), [10]);
        assert_eq!(ids(choose_targets(&live, 1, 1, &mut Spread::default()).unwrap()), [30]);
        assert_eq!(ids(choose_targets(&live, 3, 1, &mut Spread::default()).unwrap()), [30, 10, 20]);
        // With a memory, one-subfile files take turns whatever the cursor says.
        let mut spread = Spread::default();
        let firsts: Vec<u64> =
            (0..4).flat_map(|_| ids(choose_targets(&live, 1, 0, &mut spread).unwrap())).collect();
        assert_eq!(firsts, [10, 30, 10, 30]);
    }

    /// Issue 31: eight one-subfile files on four targets, whatever the cursor does between
    /// them (another create of many subfiles, a cursor stepping by two), land two on each.
    #[test]
    fn one_subfile_files_spread_over_every_target() {
        let live: Vec<TargetUsage> = (1..=4).map(|id| usage(id, 1000, 1_000_000 + id)).collect();
        let mut spread = Spread::default();
        let mut counts = std::collections::BTreeMap::new();
        for file in 0..8u64 {
            let chosen = choose_targets(&live, 1, file * 2, &mut spread).unwrap();
            *counts.entry(chosen[0].0).or_insert(0) += 1;
        }
        assert_eq!(counts.values().copied().collect::<Vec<_>>(), [2, 2, 2, 2], "{counts:?}");
    }

    #[test]
    fn a_target_coming_back_gets_no_burst() {
        let all: Vec<TargetUsage> = (1..=3).map(|id| usage(id, 0, 100)).collect();
        let mut spread = Spread::default();
        for file in 0..30 {
            choose_targets(&all[..2], 1, file, &mut spread).unwrap();
        }
        let next: Vec<u64> =
            (0..6).flat_map(|f| ids(choose_targets(&all, 1, f, &mut spread).unwrap())).collect();
        assert!(next.iter().filter(|id| **id == 3).count() <= 3, "{next:?}");
    }

    #[test]
    fn counts_outside_range_are_refused_with_both_numbers() {
        let live = [usage(1, 0, 1), usage(2, 0, 1)];
        let spread = &mut Spread::default();
        assert!(matches!(choose_targets(&live, 0, 0, spread), Err(NamespaceError::InvalidArgument { .. })));
        assert_eq!(
            choose_targets(&live, 3, 0, spread),
            Err(NamespaceError::NotEnoughTargets { wanted: 3, live: 2 })
        );
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

    fn spread_counts(live: &[TargetUsage], files: &[usize], cursor_step: u64) -> Vec<u64> {
        let mut spread = Spread::default();
        let mut counts = vec![0u64; live.len()];
        for (file, subfiles) in files.iter().enumerate() {
            let chosen = choose_targets(live, *subfiles, file as u64 * cursor_step, &mut spread).unwrap();
            assert!(crate::record::all_distinct(&chosen));
            for target in chosen {
                counts[live.iter().position(|u| u.target == target).unwrap()] += 1;
            }
        }
        counts
    }

    proptest::proptest! {
        /// A thousand creates of one to three subfiles over targets with similar free space
        /// spread within a small factor of even (here: every target within one file of its
        /// share, give or take the free-space weights of at most 10 %).
        #[test]
        fn a_thousand_creates_spread_evenly(targets in 2usize..12, seed in proptest::num::u64::ANY,
                cursor_step in 0u64..5, wobble in proptest::collection::vec(0u64..100, 12)) {
            let live: Vec<TargetUsage> =
                (0..targets).map(|i| usage(i as u64 + 1, 1 << 30, (1000 + wobble[i]) << 20)).collect();
            let mut rng = seed;
            let files: Vec<usize> = (0..1000).map(|_| {
                rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                1 + ((rng >> 33) as usize % 3).min(targets - 1)
            }).collect();
            let total: usize = files.iter().sum();
            let counts = spread_counts(&live, &files, cursor_step);
            let even = total as f64 / targets as f64;
            for count in &counts {
                proptest::prop_assert!((*count as f64) >= even * 0.85 && (*count as f64) <= even * 1.15,
                    "{counts:?}, even {even}");
            }
        }

        /// A nearly full target (under `FREE_PERCENT_MIN`) gets no subfile while others
        /// have room, and one with an eighth of the free space gets about an eighth as many.
        #[test]
        fn fuller_targets_get_fewer(targets in 3usize..10, full in 0usize..10, cursor_step in 0u64..5) {
            let full = full % targets;
            let mut live: Vec<TargetUsage> =
                (0..targets).map(|i| usage(i as u64 + 1, 1 << 30, 1 << 30)).collect();
            live[full] = usage(full as u64 + 1, 1000 << 20, 5 << 20);
            let counts = spread_counts(&live, &vec![1; 1000], cursor_step);
            proptest::prop_assert_eq!(counts[full], 0, "{:?}", counts);
            let eighth = (full + 1) % targets;
            live[full] = usage(full as u64 + 1, 1 << 30, 1 << 30);
            live[eighth] = usage(eighth as u64 + 1, 1 << 30, 1 << 27);
            let counts = spread_counts(&live, &vec![1; 1000], cursor_step);
            let share = 1000.0 / (targets as f64 - 1.0 + 0.125);
            proptest::prop_assert!((counts[eighth] as f64 - share * 0.125).abs() <= 2.0, "{:?}", counts);
        }
    }
}
