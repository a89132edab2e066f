//! ENWRICH flush planning, pure: from every member's directory entries for this server, the
//! newest-wins bytes of each fork, cut into blocks, in disk order, with the ranges to pull
//! from each member for each block. No I/O here; `flush.rs` runs the plan.
//!
//! Newest wins by `(timestamp, member, entry index)`: a later hybrid-logical-clock time
//! wins; equal times go to the higher member index, then to the entry logged later by that
//! member (a member's clock never repeats, so the last key only orders a member's own
//! entries should a client send equal stamps).

use flotilla_proto::{FlushEntry, PullRange};
use flotilla_types::{SubfileIndex, TargetId};
use std::collections::BTreeMap;

/// Bounds of one plan.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PlanBounds {
    /// Bytes of one step (a block of the fork: steps never cross a multiple of this).
    pub block_bytes: u64,
    /// Segments one step may hold (each is one pull range and one write extent).
    pub segments_per_step_max: usize,
}

/// A directory entry with who sent it and its place in that member's directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MemberEntry {
    pub member: u32,
    pub index: u32,
    pub entry: FlushEntry,
}

/// Bytes `offset..offset + length` of one fork, to be taken from `member`'s data section
/// at `cache_offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Segment {
    pub offset: u64,
    pub length: u64,
    pub member: u32,
    pub cache_offset: u64,
}

/// One block's worth of writes to one fork: pull, assemble, write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Step {
    pub target: TargetId,
    pub subfile: SubfileIndex,
    /// In fork-offset order, not overlapping.
    pub segments: Vec<Segment>,
}

impl Step {
    /// The ranges to pull from `member`, in the order its data must be packed.
    pub fn pulls(&self, member: u32) -> Vec<PullRange> {
        self.segments
            .iter()
            .filter(|s| s.member == member)
            .map(|s| PullRange { cache_offset: s.cache_offset, length: s.length })
            .collect()
    }

    /// Members this step pulls from, ascending.
    pub fn members(&self) -> Vec<u32> {
        let mut members: Vec<u32> = self.segments.iter().map(|s| s.member).collect();
        members.sort_unstable();
        members.dedup();
        members
    }

    pub fn bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.length).sum()
    }
}

/// Why a directory cannot be planned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    #[error("member {member}'s directory entry {index} is empty")]
    Empty { member: u32, index: u32 },
    #[error("member {member}'s directory entry {index} runs past the largest offset")]
    Overflow { member: u32, index: u32 },
}

/// Checks every entry: non-empty, no offset arithmetic overflow.
pub(crate) fn check(entries: &[MemberEntry]) -> Result<(), PlanError> {
    for e in entries {
        let (member, index) = (e.member, e.index);
        if e.entry.length == 0 {
            return Err(PlanError::Empty { member, index });
        }
        if e.entry.offset.checked_add(e.entry.length).is_none()
            || e.entry.cache_offset.checked_add(e.entry.length).is_none()
        {
            return Err(PlanError::Overflow { member, index });
        }
    }
    Ok(())
}

/// The plan: steps in disk order (by target, subfile, then offset). Entries must have
/// passed [`check`].
pub(crate) fn plan(entries: &[MemberEntry], bounds: PlanBounds) -> Vec<Step> {
    let mut by_fork: BTreeMap<(TargetId, SubfileIndex), Vec<MemberEntry>> = BTreeMap::new();
    for e in entries {
        by_fork.entry((e.entry.target, e.entry.subfile)).or_default().push(*e);
    }
    let mut steps = Vec::new();
    for ((target, subfile), fork_entries) in by_fork {
        let segments = newest_wins(fork_entries);
        cut_into_steps(target, subfile, &segments, bounds, &mut steps);
    }
    steps
}

/// The visible bytes of one fork's entries: painted oldest first, so newer bytes cover older.
fn newest_wins(mut entries: Vec<MemberEntry>) -> Vec<Segment> {
    entries.sort_by_key(|e| (e.entry.timestamp, e.member, e.index));
    // start -> (end, index into entries)
    let mut painted: BTreeMap<u64, (u64, usize)> = BTreeMap::new();
    for (who, e) in entries.iter().enumerate() {
        paint(&mut painted, e.entry.offset, e.entry.offset + e.entry.length, who);
    }
    painted
        .into_iter()
        .map(|(start, (end, who))| {
            let e = &entries[who];
            Segment {
                offset: start,
                length: end - start,
                member: e.member,
                cache_offset: e.entry.cache_offset + (start - e.entry.offset),
            }
        })
        .collect()
}

/// Paints `start..end` with `who` over whatever covered it.
fn paint(painted: &mut BTreeMap<u64, (u64, usize)>, start: u64, end: u64, who: usize) {
    let before = painted.range(..start).next_back().map(|(s, v)| (*s, *v));
    if let Some((s, (e, w))) = before {
        if e > start {
            painted.insert(s, (start, w));
            if e > end {
                painted.insert(end, (e, w));
            }
        }
    }
    let inside: Vec<u64> = painted.range(start..end).map(|(s, _)| *s).collect();
    for s in inside {
        if let Some((e, w)) = painted.remove(&s) {
            if e > end {
                painted.insert(end, (e, w));
            }
        }
    }
    painted.insert(start, (end, who));
}

/// Cuts a fork's segments at block boundaries and groups them into steps.
fn cut_into_steps(
    target: TargetId,
    subfile: SubfileIndex,
    segments: &[Segment],
    bounds: PlanBounds,
    steps: &mut Vec<Step>,
) {
    let block = bounds.block_bytes.max(1);
    let per_step = bounds.segments_per_step_max.max(1);
    let mut current: Option<(u64, Vec<Segment>)> = None;
    for segment in segments {
        let mut rest = *segment;
        while rest.length > 0 {
            let block_index = rest.offset / block;
            let room = (block_index + 1) * block - rest.offset;
            let length = rest.length.min(room);
            let piece = Segment { length, ..rest };
            let full = current.as_ref().is_some_and(|(b, s)| *b != block_index || s.len() >= per_step);
            if full {
                if let Some((_, done)) = current.take() {
                    steps.push(Step { target, subfile, segments: done });
                }
            }
            current.get_or_insert_with(|| (block_index, Vec::new())).1.push(piece);
            rest = Segment {
                offset: rest.offset + length,
                length: rest.length - length,
                cache_offset: rest.cache_offset + length,
                ..rest
            };
        }
    }
    if let Some((_, done)) = current {
        steps.push(Step { target, subfile, segments: done });
    }
}

/// Why pulled data does not fit its step.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AssembleError {
    #[error("member {member} sent {sent} bytes for ranges of {wanted} bytes")]
    Length { member: u32, sent: u64, wanted: u64 },
}

/// A block's write extents (fork offset, length) and its data packed in extent order.
pub(crate) type Assembled = (Vec<(u64, u64)>, Vec<u8>);

/// The step's write extents (fork offset, length) and its data packed in extent order, from
/// each member's packed answer (`data(member)`, bytes in the order of `Step::pulls`).
pub(crate) fn assemble<'a>(step: &Step, data: impl Fn(u32) -> &'a [u8]) -> Result<Assembled, AssembleError> {
    for member in step.members() {
        let wanted: u64 = step.segments.iter().filter(|s| s.member == member).map(|s| s.length).sum();
        let sent = data(member).len() as u64;
        if sent != wanted {
            return Err(AssembleError::Length { member, sent, wanted });
        }
    }
    let mut taken: BTreeMap<u32, usize> = BTreeMap::new();
    let mut packed = Vec::with_capacity(step.bytes() as usize);
    let mut extents = Vec::with_capacity(step.segments.len());
    for s in &step.segments {
        let at = taken.entry(s.member).or_insert(0);
        let length = s.length as usize;
        packed.extend_from_slice(&data(s.member)[*at..*at + length]);
        *at += length;
        extents.push((s.offset, s.length));
    }
    Ok((extents, packed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// One member's write: fork, offset, bytes, timestamp.
    #[derive(Clone, Debug)]
    struct Write {
        member: u32,
        subfile: u32,
        offset: u64,
        data: Vec<u8>,
        timestamp: u64,
    }

    fn writes() -> impl Strategy<Value = Vec<Write>> {
        prop::collection::vec(
            (0u32..4, 0u32..2, 0u64..300, 1usize..60, 0u64..20, any::<u8>()).prop_map(
                |(member, subfile, offset, length, timestamp, seed)| Write {
                    member,
                    subfile,
                    offset,
                    data: (0..length).map(|i| seed.wrapping_add(i as u8)).collect(),
                    timestamp,
                },
            ),
            0..40,
        )
    }

    /// Each member's log: its data section and its directory entries, in write order.
    fn logs(writes: &[Write]) -> (HashMap<u32, Vec<u8>>, Vec<MemberEntry>) {
        let mut caches: HashMap<u32, Vec<u8>> = HashMap::new();
        let mut counts: HashMap<u32, u32> = HashMap::new();
        let mut entries = Vec::new();
        for w in writes {
            let cache = caches.entry(w.member).or_default();
            let index = counts.entry(w.member).or_default();
            entries.push(MemberEntry {
                member: w.member,
                index: *index,
                entry: FlushEntry {
                    target: TargetId(1),
                    subfile: SubfileIndex(w.subfile),
                    offset: w.offset,
                    length: w.data.len() as u64,
                    timestamp: w.timestamp,
                    cache_offset: cache.len() as u64,
                },
            });
            cache.extend_from_slice(&w.data);
            *index += 1;
        }
        (caches, entries)
    }

    /// The model: writes applied one by one in newest-wins order, byte by byte.
    fn model(writes: &[Write]) -> HashMap<(u32, u64), u8> {
        let mut order: Vec<(usize, &Write)> = writes.iter().enumerate().collect();
        let mut per_member: HashMap<u32, u32> = HashMap::new();
        let mut keyed: Vec<((u64, u32, u32), &Write)> = Vec::new();
        for (_, w) in order.drain(..) {
            let index = per_member.entry(w.member).or_default();
            keyed.push(((w.timestamp, w.member, *index), w));
            *index += 1;
        }
        keyed.sort_by_key(|(key, _)| *key);
        let mut bytes = HashMap::new();
        for (_, w) in keyed {
            for (i, b) in w.data.iter().enumerate() {
                bytes.insert((w.subfile, w.offset + i as u64), *b);
            }
        }
        bytes
    }

    proptest! {
        #[test]
        fn the_plan_applied_equals_newest_wins(writes in writes(), block in 1u64..64, per_step in 1usize..5) {
            let (caches, entries) = logs(&writes);
            check(&entries).unwrap();
            let steps = plan(&entries, PlanBounds { block_bytes: block, segments_per_step_max: per_step });
            let mut applied: HashMap<(u32, u64), u8> = HashMap::new();
            let mut last: Option<(u32, u64)> = None;
            for step in &steps {
                prop_assert!(step.segments.len() <= per_step);
                let first = step.segments[0].offset / block;
                let mut packed: HashMap<u32, Vec<u8>> = HashMap::new();
                for member in step.members() {
                    let cache = &caches[&member];
                    let bytes = packed.entry(member).or_default();
                    for range in step.pulls(member) {
                        let at = range.cache_offset as usize;
                        bytes.extend_from_slice(&cache[at..at + range.length as usize]);
                    }
                }
                let (extents, data) = assemble(step, |m| packed[&m].as_slice()).unwrap();
                let mut at = 0usize;
                for (offset, length) in extents {
                    prop_assert_eq!(offset / block, first, "a step stays in one block");
                    let here = (step.subfile.0, offset);
                    prop_assert!(last.is_none_or(|l| l < here), "steps in disk order, no byte twice");
                    last = Some((step.subfile.0, offset + length - 1));
                    for i in 0..length {
                        applied.insert((step.subfile.0, offset + i), data[at]);
                        at += 1;
                    }
                }
            }
            prop_assert_eq!(applied, model(&writes));
        }
    }

    #[test]
    fn a_bad_entry_is_named() {
        let entry = FlushEntry {
            target: TargetId(1),
            subfile: SubfileIndex(0),
            offset: u64::MAX,
            length: 2,
            timestamp: 0,
            cache_offset: 0,
        };
        let bad = [MemberEntry { member: 3, index: 7, entry }];
        assert_eq!(check(&bad), Err(PlanError::Overflow { member: 3, index: 7 }));
        let empty =
            [MemberEntry { member: 1, index: 0, entry: FlushEntry { length: 0, offset: 0, ..entry } }];
        assert_eq!(check(&empty).unwrap_err().to_string(), "member 1's directory entry 0 is empty");
    }

    #[test]
    fn short_data_is_refused() {
        let step = Step {
            target: TargetId(1),
            subfile: SubfileIndex(0),
            segments: vec![Segment { offset: 0, length: 4, member: 2, cache_offset: 0 }],
        };
        let error = assemble(&step, |_| &[1u8, 2][..]).unwrap_err();
        assert_eq!(error, AssembleError::Length { member: 2, sent: 2, wanted: 4 });
    }
}
