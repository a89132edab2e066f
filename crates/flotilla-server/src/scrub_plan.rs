//! Read repair and scrub (issue 32), the pure part: which bad blocks make which rewrites,
//! which members may supply the bytes, how members' checksum lists compare, and how a
//! background scrub paces itself. No sockets, no store.

use flotilla_proto::{ChainInfo, ChainMemberState, ScrubReport};
use flotilla_types::TargetId;
use std::time::Duration;

/// Runs of adjacent bad blocks, as fork byte ranges `start..end` clipped to `size_bytes`:
/// one fetch from a peer and one rewrite each. `bad` holds block offsets (multiples of
/// `block_bytes`), in any order; duplicates count once.
pub(crate) fn repair_runs(bad: &[u64], block_bytes: u64, size_bytes: u64) -> Vec<(u64, u64)> {
    let mut sorted: Vec<u64> = bad.iter().copied().filter(|offset| *offset < size_bytes).collect();
    sorted.sort_unstable();
    sorted.dedup();
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for offset in sorted {
        let end = offset.saturating_add(block_bytes).min(size_bytes);
        match runs.last_mut() {
            Some((_, last_end)) if *last_end == offset => *last_end = end,
            _ => runs.push((offset, end)),
        }
    }
    runs
}

/// The members a repair of `me`'s blocks may read from: every other `Serving` member, in
/// chain order (the head first: it is at or ahead of every other member's order).
pub(crate) fn repair_sources(chain: &ChainInfo, me: TargetId) -> Vec<TargetId> {
    chain
        .members
        .iter()
        .filter(|member| member.target != me && member.state == ChainMemberState::Serving)
        .map(|member| member.target)
        .collect()
}

/// Whether `me` is a `Serving` member of `chain` (only a serving member repairs or is
/// repaired: a syncing one is being copied whole anyway).
pub(crate) fn serving(chain: &ChainInfo, me: TargetId) -> bool {
    chain.members.iter().any(|member| member.target == me && member.state == ChainMemberState::Serving)
}

/// The checksum blocks a `BlockChecksums` request covers: `offset` rounded down to a block,
/// the length rounded out, refused over `blocks_max` blocks.
pub(crate) fn scrub_range(
    offset: u64,
    length: u64,
    block_bytes: u64,
    blocks_max: u64,
) -> Result<(u64, u64), String> {
    if block_bytes == 0 {
        return Err("the target's checksum block is 0 bytes".into());
    }
    let start = offset / block_bytes * block_bytes;
    let end = offset.checked_add(length).ok_or_else(|| format!("range {offset}+{length} overflows"))?;
    let blocks = end.div_ceil(block_bytes) - start / block_bytes;
    if blocks > blocks_max {
        return Err(format!(
            "{length} bytes from {offset} cover {blocks} checksum blocks of {block_bytes} bytes; at most {blocks_max} per request"
        ));
    }
    Ok((start, end - start))
}

/// How members' checksum lists of one range compare, beyond the blocks each found bad.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Comparison {
    /// Offsets of blocks whose entries differ between members while each verifies.
    pub differing: Vec<u64>,
    /// Why some member could not be compared.
    pub notes: Vec<String>,
}

/// Compares `mine` with the other members' reports of the same range: a block differs when
/// two members hold different entries and neither found it bad (each member verifies its
/// own blocks, so a bad one is repair's business, not divergence).
pub(crate) fn compare(mine: &ScrubReport, theirs: &[ScrubReport]) -> Comparison {
    let mut comparison = Comparison::default();
    let bad_on = |report: &ScrubReport, offset: u64| {
        report.bad.iter().any(|block| block.target == report.target && block.offset == offset)
            && !report.repaired.iter().any(|block| block.target == report.target && block.offset == offset)
    };
    for other in theirs {
        if other.block_bytes != mine.block_bytes || other.offset != mine.offset {
            comparison.notes.push(format!(
                "target {} has checksum blocks of {} bytes from {}, target {} of {} from {}: not compared",
                other.target, other.block_bytes, other.offset, mine.target, mine.block_bytes, mine.offset
            ));
            continue;
        }
        if other.size_bytes != mine.size_bytes {
            comparison.notes.push(format!(
                "target {} holds {} bytes, target {} holds {}",
                other.target, other.size_bytes, mine.target, mine.size_bytes
            ));
        }
        let blocks = mine.entries.len().max(other.entries.len());
        for index in 0..blocks {
            let offset = mine.offset + index as u64 * mine.block_bytes;
            let (a, b) = (mine.entries.get(index), other.entries.get(index));
            if a == b || bad_on(mine, offset) || bad_on(other, offset) {
                continue;
            }
            if !comparison.differing.contains(&offset) {
                comparison.differing.push(offset);
            }
        }
    }
    comparison.differing.sort_unstable();
    comparison
}

/// The background scrub's pace: after checking `bytes`, how long to rest so that the
/// average stays at `bytes_per_s` (`None`: scrubbing is off).
pub(crate) fn scrub_pause(bytes: u64, bytes_per_s: u64) -> Option<Duration> {
    if bytes_per_s == 0 {
        return None;
    }
    let nanos = u128::from(bytes) * 1_000_000_000 / u128::from(bytes_per_s);
    Some(Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_proto::{ChainMember, ScrubBlock};

    #[test]
    fn runs_merge_adjacent_blocks_and_clip_to_the_end() {
        assert_eq!(repair_runs(&[8192, 0, 4096, 20480], 4096, 22000), vec![(0, 12288), (20480, 22000)]);
        assert_eq!(repair_runs(&[4096, 4096], 4096, 1 << 20), vec![(4096, 8192)]);
        assert_eq!(repair_runs(&[40960], 4096, 8192), Vec::<(u64, u64)>::new());
        assert!(repair_runs(&[], 4096, 8192).is_empty());
    }

    fn chain(states: &[(u64, ChainMemberState)]) -> ChainInfo {
        let members = states
            .iter()
            .map(|(target, state)| ChainMember { target: TargetId(*target), state: *state })
            .collect();
        ChainInfo { chain: 1, version: 4, members }
    }

    #[test]
    fn sources_are_the_other_serving_members_in_chain_order() {
        let syncing = ChainMemberState::Syncing { missed_since: 2, full: false };
        let info = chain(&[
            (3, ChainMemberState::Serving),
            (1, syncing),
            (2, ChainMemberState::Serving),
            (5, ChainMemberState::Serving),
        ]);
        assert_eq!(repair_sources(&info, TargetId(2)), vec![TargetId(3), TargetId(5)]);
        assert!(serving(&info, TargetId(2)));
        assert!(!serving(&info, TargetId(1)));
        let alone = chain(&[(3, ChainMemberState::Serving), (1, ChainMemberState::Dead)]);
        assert!(repair_sources(&alone, TargetId(3)).is_empty());
    }

    #[test]
    fn scrub_ranges_round_out_and_are_bounded() {
        assert_eq!(scrub_range(5000, 100, 4096, 10), Ok((4096, 1004)));
        assert_eq!(scrub_range(0, 40960, 4096, 10), Ok((0, 40960)));
        assert!(scrub_range(1, 40960, 4096, 10).unwrap_err().contains("11 checksum blocks"));
        assert!(scrub_range(u64::MAX, 2, 4096, 10).is_err());
        assert!(scrub_range(0, 1, 0, 10).is_err());
    }

    fn report(target: u64, entries: &[u32], bad: &[u64], repaired: &[u64]) -> ScrubReport {
        let mut report = ScrubReport::new(TargetId(target), 0, 4096, entries.len() as u64 * 4096);
        report.entries = entries.to_vec();
        let block = |offset: &u64| ScrubBlock { target: TargetId(target), offset: *offset };
        report.bad = bad.iter().map(block).collect();
        report.repaired = repaired.iter().map(block).collect();
        report
    }

    #[test]
    fn comparison_finds_divergence_but_not_damage() {
        let mine = report(1, &[10, 11, 12, 13], &[], &[]);
        // Block 1 bad on the other member (its own repair's business), block 3 differs.
        let other = report(2, &[10, 99, 12, 77], &[4096], &[]);
        let found = compare(&mine, &[other]);
        assert_eq!(found.differing, vec![12288]);
        assert!(found.notes.is_empty());
        // A bad block that was repaired counts again: its entry must now agree.
        let repaired = report(2, &[10, 98, 12, 13], &[4096], &[4096]);
        assert_eq!(compare(&mine, &[repaired]).differing, vec![4096]);
        assert!(compare(&mine, &[report(2, &[10, 11, 12, 13], &[], &[])]).differing.is_empty());
    }

    #[test]
    fn comparison_notes_what_it_cannot_compare() {
        let mine = report(1, &[10, 11], &[], &[]);
        let mut other = report(2, &[10, 11, 12], &[], &[]);
        let found = compare(&mine, std::slice::from_ref(&other));
        assert_eq!(found.differing, vec![8192]);
        assert!(found.notes[0].contains("holds 12288 bytes"), "{:?}", found.notes);
        other.block_bytes = 8192;
        let found = compare(&mine, &[other]);
        assert!(found.differing.is_empty());
        assert!(found.notes[0].contains("not compared"), "{:?}", found.notes);
    }

    #[test]
    fn scrub_pace_follows_the_rate() {
        assert_eq!(scrub_pause(1 << 20, 0), None);
        assert_eq!(scrub_pause(1 << 20, 1 << 20), Some(Duration::from_secs(1)));
        assert_eq!(scrub_pause(1 << 19, 1 << 20), Some(Duration::from_millis(500)));
    }
}
